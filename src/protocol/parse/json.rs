//! The JSON pieces the request parser is built from, on `serde_json`'s deserializer: no value tree
//! is ever built.
//!
//! * [`Validate`] reads a value and keeps nothing, accepting exactly what `serde_json::Value`
//!   accepts (it asks for every value as `Value` does: strings checked for UTF-8 and lone
//!   surrogates, numbers for range) — so a body is refused for bad JSON exactly when the whole-tree
//!   parse refused it. `serde::de::IgnoredAny` would not do: serde_json skips ignored values
//!   without those checks and without its nesting limit.
//! * Values captured whole (`&RawValue`, a slice of the body) are read again in a sub-parse; every
//!   seed here carries the value's nesting `depth` and refuses what would pass [`MAX_NESTING`]
//!   counted from the body's top, as serde_json's own limit does for the whole body.
//! * [`Sink`] is the rendered prompt: a byte buffer that stops growing at the parse budget (then it
//!   only records that it went over, and parsing goes on to find out whether the body was valid).
//! * [`Canonical`] writes a value's JSON as `serde_json::Value` would print it (compact, object keys
//!   sorted, the last of duplicate keys kept, numbers as serde_json formats them), straight into
//!   the sink: members are written as they come and re-ordered in place when they came unsorted.

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;

/// Containers serde_json lets a document nest (its recursion limit of 128 counts the container
/// being entered, and refuses the 128th).
pub const MAX_NESTING: usize = 127;

/// The nesting of a container entered inside `depth` others, or the error serde_json gives.
pub fn enter<E: de::Error>(depth: usize) -> Result<usize, E> {
    if depth >= MAX_NESTING {
        Err(E::custom("recursion limit exceeded"))
    } else {
        Ok(depth + 1)
    }
}

/// An object key, borrowed from the body unless it had escapes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key<'de>(pub Cow<'de, str>);

impl<'de> de::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(StrVisitor).map(Key)
    }
}

/// A string, borrowed where it can be.
pub struct StrVisitor;

impl<'de> Visitor<'de> for StrVisitor {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(s))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(s.to_owned()))
    }
    fn visit_string<E: de::Error>(self, s: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(s))
    }
}

/// Reads a value the parser does not use, checking it as `serde_json::Value` would.
#[derive(Debug, Clone, Copy)]
pub struct Validate {
    /// Containers around the value.
    pub depth: usize,
}

impl<'de> DeserializeSeed<'de> for Validate {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Validate {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        skip_seq(seq, self.depth)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        skip_map(map, self.depth)
    }
}

/// The rest of a list the parser does not use (`depth`: containers around the list).
pub fn skip_seq<'de, A: SeqAccess<'de>>(mut seq: A, depth: usize) -> Result<(), A::Error> {
    let depth = enter(depth)?;
    while seq.next_element_seed(Validate { depth })?.is_some() {}
    Ok(())
}

/// The rest of an object the parser does not use.
pub fn skip_map<'de, A: MapAccess<'de>>(mut map: A, depth: usize) -> Result<(), A::Error> {
    let depth = enter(depth)?;
    while map.next_key_seed(Validate { depth })?.is_some() {
        map.next_value_seed(Validate { depth })?;
    }
    Ok(())
}

/// Parses a value captured whole with `seed` (its `depth` is where the value sat in the body).
pub fn sub_parse<'de, S: DeserializeSeed<'de>>(
    raw: &'de RawValue,
    seed: S,
) -> Result<S::Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(raw.get());
    let value = seed.deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// Checks a value captured whole, as if it had been read in place at `depth`.
pub fn validate_raw(raw: &RawValue, depth: usize) -> Result<(), serde_json::Error> {
    sub_parse(raw, Validate { depth })
}

/// One piece of a re-arranged stretch of the sink.
#[derive(Debug, Clone, Copy)]
pub enum Piece {
    /// Bytes already in the sink.
    Range(usize, usize),
    Bytes(&'static [u8]),
}

impl Piece {
    fn len(self) -> usize {
        match self {
            Piece::Range(start, end) => end.saturating_sub(start),
            Piece::Bytes(b) => b.len(),
        }
    }
}

/// The prompt being rendered, bounded by the parse budget: `limit` bytes of output and of the
/// temporary buffers held while re-arranging it. Past the budget it keeps nothing more and only
/// remembers that it went over.
#[derive(Debug)]
pub struct Sink {
    buf: Vec<u8>,
    limit: usize,
    /// Bytes of temporary buffers now held (re-arrangements, object member lists).
    held: usize,
    over: bool,
}

impl Sink {
    pub fn new(capacity: usize, limit: usize) -> Sink {
        Sink {
            buf: Vec::with_capacity(capacity.min(limit)),
            limit,
            held: 0,
            over: false,
        }
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn over(&self) -> bool {
        self.over
    }

    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    /// Whether `more` bytes still fit in the budget (if not, the sink is over it from now on).
    fn fits(&mut self, more: usize) -> bool {
        if !self.over
            && self
                .buf
                .len()
                .saturating_add(self.held)
                .saturating_add(more)
                > self.limit
        {
            self.over = true;
        }
        let needed = self.buf.len().saturating_add(more);
        if !self.over && needed > self.buf.capacity() {
            // Doubling, but never past the budget: the buffer never holds more than it allows.
            let grown = self
                .buf
                .capacity()
                .saturating_mul(2)
                .max(needed)
                .min(self.limit);
            self.buf.reserve_exact(grown.max(needed) - self.buf.len());
        }
        !self.over
    }

    pub fn push(&mut self, byte: u8) {
        if self.fits(1) {
            self.buf.push(byte);
        }
    }

    pub fn extend(&mut self, bytes: &[u8]) {
        if self.fits(bytes.len()) {
            self.buf.extend_from_slice(bytes);
        }
    }

    pub fn truncate(&mut self, len: usize) {
        self.buf.truncate(len);
    }

    /// Counts `bytes` of a temporary buffer against the budget; false (and over) if they do not
    /// fit.
    pub fn hold(&mut self, bytes: usize) -> bool {
        if self.fits(bytes) {
            self.held += bytes;
            true
        } else {
            false
        }
    }

    pub fn release(&mut self, bytes: usize) {
        self.held = self.held.saturating_sub(bytes);
    }

    /// A value's JSON as serde_json prints it.
    pub fn write_json<T: serde::Serialize + ?Sized>(&mut self, value: &T) {
        if !self.over {
            // Writing into the sink cannot fail: a write past the budget is dropped.
            let _ = serde_json::to_writer(&mut *self, value);
        }
    }

    /// Moves the last `len` bytes to `at`, before the bytes that followed `at`.
    pub fn move_tail_to(&mut self, at: usize, len: usize) {
        if let Some(tail) = self.buf.get_mut(at..) {
            if len <= tail.len() {
                tail.rotate_right(len);
            }
        }
    }

    /// Replaces everything from `base` on by `pieces` (ranges of what is there, and constant
    /// bytes), in order. The largest range is moved in place; only the others are copied aside
    /// (held against the budget).
    pub fn arrange(&mut self, base: usize, pieces: &[Piece]) {
        if self.over {
            return;
        }
        let total: usize = pieces.iter().map(|p| p.len()).sum();
        let largest = pieces
            .iter()
            .enumerate()
            .filter(|(_, p)| matches!(p, Piece::Range(..)))
            .max_by_key(|(_, p)| p.len())
            .map(|(i, _)| i);
        let aside: usize = pieces
            .iter()
            .enumerate()
            .filter(|(i, p)| matches!(p, Piece::Range(..)) && Some(*i) != largest)
            .map(|(_, p)| p.len())
            .sum();
        let end = base.saturating_add(total);
        let grows = end.saturating_sub(self.buf.len());
        if !self.hold(aside) {
            return;
        }
        if !self.fits(grows) {
            self.release(aside);
            return;
        }
        let mut copied = Vec::with_capacity(aside);
        for (i, piece) in pieces.iter().enumerate() {
            if let (Piece::Range(start, stop), false) = (*piece, Some(i) == largest) {
                copied.extend_from_slice(self.buf.get(start..stop).unwrap_or_default());
            }
        }
        if end > self.buf.len() {
            self.buf.resize(end, 0);
        }
        let mut at = base;
        for (i, piece) in pieces.iter().enumerate() {
            if let (Piece::Range(start, stop), true) = (*piece, Some(i) == largest) {
                if stop <= self.buf.len() && start <= stop {
                    self.buf.copy_within(start..stop, at);
                }
            }
            at += piece.len();
        }
        let mut at = base;
        let mut from = 0;
        for (i, piece) in pieces.iter().enumerate() {
            let len = piece.len();
            let source = match *piece {
                Piece::Range(..) if Some(i) == largest => None,
                Piece::Range(..) => {
                    from += len;
                    copied.get(from - len..from)
                }
                Piece::Bytes(b) => Some(b),
            };
            if let (Some(source), Some(target)) = (source, self.buf.get_mut(at..at + len)) {
                target.copy_from_slice(source);
            }
            at += len;
        }
        self.buf.truncate(end);
        self.release(aside);
    }
}

impl std::io::Write for Sink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.extend(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// How [`Canonical`] writes the value it is given (nested values are always JSON).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// The value's JSON.
    Json,
    /// A string as its text, null as nothing, anything else as its JSON (a field's value).
    Scalar,
    /// A string as its text, anything else as its JSON (a batch's prompt item).
    Text,
}

/// Writes a value as `serde_json::Value`'s `to_string` would print it. Its value is whether the
/// value was `null`.
pub struct Canonical<'s> {
    pub sink: &'s mut Sink,
    pub depth: usize,
    pub form: Form,
}

impl<'s> Canonical<'s> {
    pub fn json(sink: &'s mut Sink, depth: usize) -> Canonical<'s> {
        Canonical {
            sink,
            depth,
            form: Form::Json,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Canonical<'_> {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_any(self)
    }
}

/// Bytes a member list entry holds (charged to the budget while an object is written).
const MEMBER_BYTES: usize = std::mem::size_of::<(usize, usize)>();

/// The key of the member written at `start` (`"key":value`, as serde_json escapes it).
fn key_at(buf: &[u8], start: usize) -> Cow<'_, str> {
    let text = buf.get(start + 1..).unwrap_or_default();
    let mut escaped = false;
    let mut end = None;
    let mut i = 0;
    while let Some(&b) = text.get(i) {
        match b {
            b'\\' => {
                escaped = true;
                i += 1;
            }
            b'"' => {
                end = Some(i);
                break;
            }
            _ => {}
        }
        i += 1;
    }
    let Some(end) = end else {
        return Cow::Borrowed("");
    };
    if !escaped {
        return std::str::from_utf8(text.get(..end).unwrap_or_default())
            .map(Cow::Borrowed)
            .unwrap_or_default();
    }
    serde_json::from_slice::<String>(buf.get(start..start + end + 2).unwrap_or_default())
        .map(Cow::Owned)
        .unwrap_or_default()
}

impl<'de> Visitor<'de> for Canonical<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<bool, E> {
        self.sink.extend(if v { b"true" } else { b"false" });
        Ok(false)
    }
    fn visit_i64<E>(self, v: i64) -> Result<bool, E> {
        self.sink.write_json(&v);
        Ok(false)
    }
    fn visit_u64<E>(self, v: u64) -> Result<bool, E> {
        self.sink.write_json(&v);
        Ok(false)
    }
    fn visit_f64<E>(self, v: f64) -> Result<bool, E> {
        self.sink.write_json(&v);
        Ok(false)
    }
    fn visit_str<E>(self, v: &str) -> Result<bool, E> {
        match self.form {
            Form::Json => self.sink.write_json(v),
            Form::Scalar | Form::Text => self.sink.extend(v.as_bytes()),
        }
        Ok(false)
    }
    fn visit_unit<E>(self) -> Result<bool, E> {
        if self.form != Form::Scalar {
            self.sink.extend(b"null");
        }
        Ok(true)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        let depth = enter(self.depth)?;
        self.sink.push(b'[');
        let mut first = true;
        loop {
            let at = self.sink.len();
            if !first {
                self.sink.push(b',');
            }
            let seed = Canonical::json(&mut *self.sink, depth);
            if seq.next_element_seed(seed)?.is_none() {
                self.sink.truncate(at);
                break;
            }
            first = false;
        }
        self.sink.push(b']');
        Ok(false)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let depth = enter(self.depth)?;
        let sink = self.sink;
        let start = sink.len();
        sink.push(b'{');
        // Each member's bytes; its key is read back from them when they must be sorted.
        let mut members: Vec<(usize, usize)> = Vec::new();
        let mut last_key: Option<Key<'de>> = None;
        let mut sorted = true;
        while let Some(key) = map.next_key::<Key<'de>>()? {
            if !members.is_empty() {
                sink.push(b',');
            }
            let member_start = sink.len();
            sink.write_json(key.0.as_ref());
            sink.push(b':');
            map.next_value_seed(Canonical::json(&mut *sink, depth))?;
            if last_key.as_ref().is_some_and(|last| *last >= key) {
                sorted = false;
            }
            last_key = Some(key);
            if sink.hold(MEMBER_BYTES) {
                members.push((member_start, sink.len()));
            }
        }
        sink.push(b'}');
        if !sorted && !sink.over() {
            // As a BTreeMap holds them: sorted by key, the last of equal keys kept.
            let buf = sink.bytes();
            members.sort_by(|a, b| key_at(buf, a.0).cmp(&key_at(buf, b.0)));
            let region_len = sink.len() - start;
            if sink.hold(region_len) {
                let region = sink.bytes().get(start..).unwrap_or_default().to_vec();
                let key = |at: usize| key_at(&region, at - start);
                sink.truncate(start);
                sink.push(b'{');
                let mut first = true;
                for (i, (s, e)) in members.iter().enumerate() {
                    let superseded = members
                        .get(i + 1)
                        .is_some_and(|next| key(next.0) == key(*s));
                    if superseded {
                        continue;
                    }
                    if !first {
                        sink.push(b',');
                    }
                    first = false;
                    sink.extend(region.get(s - start..e - start).unwrap_or_default());
                }
                sink.push(b'}');
                sink.release(region_len);
            }
        }
        sink.release(MEMBER_BYTES * members.len());
        Ok(false)
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn canonical(json: &str) -> Result<String, serde_json::Error> {
        let mut sink = Sink::new(64, usize::MAX);
        let mut de = serde_json::Deserializer::from_str(json);
        Canonical::json(&mut sink, 0).deserialize(&mut de)?;
        de.end()?;
        Ok(String::from_utf8(sink.into_bytes()).unwrap())
    }

    #[test]
    fn canonical_json_is_what_value_prints() {
        for json in [
            r#"{"b":1,"a":[1,2.5,-3,1e300,1E2,-0,0.1,18446744073709551615,-9223372036854775808],"c":{"z":null,"y":true}}"#,
            r#"{"a":1,"a":2,"b":{"d":1,"c":2,"d":3}}"#,
            r#"{"\u00e9":"\"\\\n\u0001","e":"x","\ud83d\ude00":0}"#,
            r#"[{"type":"function","function":{"name":"a","parameters":{"type":"object","properties":{"z":{},"a":{}}}}}]"#,
            r#"[]"#,
            r#"{}"#,
            r#""s""#,
            r#"{"k":[],"j":{},"i":[{}]}"#,
        ] {
            let value: serde_json::Value = serde_json::from_str(json).unwrap();
            assert_eq!(canonical(json).unwrap(), value.to_string(), "{json}");
        }
    }

    #[test]
    fn validation_refuses_what_value_refuses() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        for json in [
            deep(MAX_NESTING),
            deep(MAX_NESTING + 1),
            r#"["\ud800"]"#.to_string(),
            "[1e400]".to_string(),
            "[01]".to_string(),
            r#"{"a":1,}"#.to_string(),
        ] {
            let value = serde_json::from_str::<serde_json::Value>(&json).is_ok();
            let mut de = serde_json::Deserializer::from_str(&json);
            let ours = Validate { depth: 0 }.deserialize(&mut de).is_ok() && de.end().is_ok();
            assert_eq!(ours, value, "{}", &json[..json.len().min(40)]);
        }
    }

    #[test]
    fn arrange_moves_the_largest_piece_in_place() {
        let mut sink = Sink::new(0, usize::MAX);
        sink.extend(b"xxAAAAAAbbC");
        sink.arrange(
            2,
            &[
                Piece::Range(8, 10),
                Piece::Bytes(b"-"),
                Piece::Range(2, 8),
                Piece::Range(10, 11),
            ],
        );
        assert_eq!(sink.bytes(), b"xxbb-AAAAAAC");
        let mut small = Sink::new(0, 4);
        small.extend(b"abcdef");
        assert!(small.over() && small.len() == 0);
    }
}
