//! Edits of a request body's top-level members, by byte range: every other member goes on exactly
//! as the client wrote it (no JSON tree, no re-encoding of what kvroute does not change).
//!
//! One pass captures each top-level value as a slice of the body (`&RawValue`): member `i`'s bytes
//! run from the end of member `i - 1`'s value (or the opening brace) to the end of its own value,
//! so a member is dropped by leaving its stretch out (with the comma in front of it, or the one
//! behind it for the first member kept), and new members are written before the closing brace.
//! Only bodies the request parser accepted as JSON objects are edited.

use crate::protocol::parse::json::Key;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use std::fmt;

/// What becomes of a top-level member (every occurrence of its key is removed first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change<'a> {
    Remove,
    /// Written once, with this JSON value.
    Set(&'a str),
    /// Written once with this value if the body had the key.
    SetIfPresent(&'a str),
}

/// `body` with `edits` (key, change) made, or `None` if it is not a JSON object.
pub fn edit(body: &[u8], edits: &[(&str, Change)]) -> Option<Vec<u8>> {
    let open = body.iter().position(|b| *b == b'{')?;
    let close = body.iter().rposition(|b| *b == b'}')?;
    let mut out = Vec::with_capacity(body.len() + 256);
    out.extend_from_slice(body.get(..=open)?);
    let mut members = Members {
        body,
        edits,
        out: &mut out,
        start: open + 1,
        first: true,
        present: vec![false; edits.len()],
    };
    let mut de = serde_json::Deserializer::from_slice(body);
    (&mut members).deserialize(&mut de).ok()?;
    de.end().ok()?;
    let (mut first, present) = (members.first, members.present);
    for ((key, change), present) in edits.iter().zip(present) {
        let value = match change {
            Change::Remove => continue,
            Change::Set(v) => v,
            Change::SetIfPresent(v) if present => v,
            Change::SetIfPresent(_) => continue,
        };
        if !first {
            out.push(b',');
        }
        first = false;
        out.extend_from_slice(serde_json::to_string(key).ok()?.as_bytes());
        out.push(b':');
        out.extend_from_slice(value.as_bytes());
    }
    out.extend_from_slice(body.get(close..)?);
    Some(out)
}

/// Copies the top-level members no edit names, as they come.
struct Members<'a> {
    body: &'a [u8],
    edits: &'a [(&'a str, Change<'a>)],
    out: &'a mut Vec<u8>,
    /// Where the next member's stretch starts: the end of the previous value.
    start: usize,
    /// No member written yet.
    first: bool,
    /// Per edit: whether its key was there.
    present: Vec<bool>,
}

impl Members<'_> {
    /// Member `[start, end)` (`[ws] [, ] [ws] "key" : value`), its comma rewritten.
    fn keep(&mut self, end: usize) -> Option<()> {
        let stretch = self.body.get(self.start..end)?;
        let text = match stretch.iter().position(|b| !b.is_ascii_whitespace()) {
            Some(i) if stretch.get(i) == Some(&b',') => stretch.get(i + 1..)?,
            _ => stretch,
        };
        if !self.first {
            self.out.push(b',');
        }
        self.out.extend_from_slice(text);
        self.first = false;
        Some(())
    }
}

impl<'de> DeserializeSeed<'de> for &mut Members<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for &mut Members<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let base = self.body.as_ptr() as usize;
        while let Some(key) = map.next_key::<Key<'de>>()? {
            let text = map.next_value::<&'de RawValue>()?.get();
            let end = (text.as_ptr() as usize)
                .checked_sub(base)
                .map(|offset| offset + text.len())
                .ok_or_else(|| de::Error::custom("a value outside the body"))?;
            match self.edits.iter().position(|(k, _)| *k == key.0) {
                Some(i) => {
                    if let Some(slot) = self.present.get_mut(i) {
                        *slot = true;
                    }
                }
                None => self
                    .keep(end)
                    .ok_or_else(|| de::Error::custom("a member outside the body"))?,
            }
            self.start = end;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn edited(body: &str, edits: &[(&str, Change)]) -> Value {
        let out = edit(body.as_bytes(), edits).expect("an object");
        serde_json::from_slice(&out).expect("still JSON")
    }

    #[test]
    fn members_are_removed_and_set_and_the_rest_kept_as_written() {
        let remove = [("kv_transfer_params", Change::Remove)];
        assert_eq!(
            edited(r#"{"kv_transfer_params":{"a":1},"model":"m"}"#, &remove),
            json!({"model": "m"})
        );
        assert_eq!(
            edited(r#"{"model":"m", "kv_transfer_params" : null }"#, &remove),
            json!({"model": "m"})
        );
        assert_eq!(
            edited(
                r#" { "kv_transfer_params":1 , "kv_transfer_params":2 } "#,
                &remove
            ),
            json!({})
        );
        let out = edit(
            br#"{"model":"m",  "messages":[{"role":"user","content":"hi \u00e9"}],"kv_transfer_params":{}}"#,
            &remove,
        )
        .unwrap();
        assert_eq!(
            out, br#"{"model":"m",  "messages":[{"role":"user","content":"hi \u00e9"}]}"#,
            "the client's own bytes"
        );
        let prefill = [
            ("max_tokens", Change::Set("1")),
            ("max_completion_tokens", Change::SetIfPresent("1")),
            ("stream", Change::Set("false")),
            ("stream_options", Change::Remove),
        ];
        assert_eq!(
            edited(
                r#"{"stream":true,"max_tokens":9,"stream_options":{},"prompt":"p"}"#,
                &prefill
            ),
            json!({"prompt": "p", "max_tokens": 1, "stream": false})
        );
        assert_eq!(
            edited(r#"{"max_completion_tokens":9}"#, &prefill),
            json!({"max_tokens": 1, "max_completion_tokens": 1, "stream": false})
        );
        assert_eq!(
            edited("{}", &prefill),
            json!({"max_tokens": 1, "stream": false})
        );
        assert_eq!(edit(b"[1]", &prefill), None);
        assert_eq!(edit(b"{", &prefill), None);
    }
}
