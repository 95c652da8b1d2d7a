//! A JSON value written as Python's `json.dumps` writes it with its defaults (`", "` and `": "`
//! between items, members in body order, every character outside printable ASCII escaped as
//! `\uXXXX`, floats as Python's `repr`). vLLM turns an Anthropic `tool_use` block's `input` into
//! the chat tool call's `arguments` with `json.dumps`, so the same call renders alike whether it
//! came through `/v1/messages` or as the string a chat client sent.

use super::json::{enter, Sink};
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// Writes the value it is given; its value: whether that was `null`.
pub struct PyJson<'s> {
    pub sink: &'s mut Sink,
    pub depth: usize,
}

impl<'de> DeserializeSeed<'de> for PyJson<'_> {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for PyJson<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<bool, E> {
        self.sink.extend(if v { b"true" } else { b"false" });
        Ok(false)
    }
    fn visit_i64<E>(self, v: i64) -> Result<bool, E> {
        self.sink.extend(v.to_string().as_bytes());
        Ok(false)
    }
    fn visit_u64<E>(self, v: u64) -> Result<bool, E> {
        self.sink.extend(v.to_string().as_bytes());
        Ok(false)
    }
    fn visit_f64<E>(self, v: f64) -> Result<bool, E> {
        self.sink.extend(float_repr(v).as_bytes());
        Ok(false)
    }
    fn visit_str<E>(self, v: &str) -> Result<bool, E> {
        write_string(self.sink, v);
        Ok(false)
    }
    fn visit_unit<E>(self) -> Result<bool, E> {
        self.sink.extend(b"null");
        Ok(true)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        let depth = enter(self.depth)?;
        self.sink.push(b'[');
        let mut first = true;
        loop {
            let at = self.sink.len();
            if !first {
                self.sink.extend(b", ");
            }
            let item = PyJson {
                sink: &mut *self.sink,
                depth,
            };
            if seq.next_element_seed(item)?.is_none() {
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
        self.sink.push(b'{');
        let mut first = true;
        while let Some(key) = map.next_key::<super::json::Key<'de>>()? {
            if !first {
                self.sink.extend(b", ");
            }
            first = false;
            write_string(self.sink, &key.0);
            self.sink.extend(b": ");
            map.next_value_seed(PyJson {
                sink: &mut *self.sink,
                depth,
            })?;
        }
        self.sink.push(b'}');
        Ok(false)
    }
}

/// A string as `json.dumps` quotes it (`ensure_ascii`: only `' '..='~'` is written as itself).
fn write_string(sink: &mut Sink, s: &str) {
    sink.push(b'"');
    let mut units = [0u16; 2];
    for c in s.chars() {
        match c {
            '"' => sink.extend(b"\\\""),
            '\\' => sink.extend(b"\\\\"),
            '\n' => sink.extend(b"\\n"),
            '\r' => sink.extend(b"\\r"),
            '\t' => sink.extend(b"\\t"),
            '\u{8}' => sink.extend(b"\\b"),
            '\u{c}' => sink.extend(b"\\f"),
            ' '..='~' => sink.push(c as u8),
            _ => {
                for unit in c.encode_utf16(&mut units) {
                    sink.extend(format!("\\u{unit:04x}").as_bytes());
                }
            }
        }
    }
    sink.push(b'"');
}

/// Python's `repr` of a float: the shortest digits that read back, positional for decimal
/// exponents in -4..16 (with `.0` when integral), else `d.ddde+XX`.
fn float_repr(v: f64) -> String {
    if v == 0.0 {
        return if v.is_sign_negative() { "-0.0" } else { "0.0" }.to_string();
    }
    let scientific = format!("{v:e}");
    let Some((mantissa, exponent)) = scientific.split_once('e') else {
        return scientific;
    };
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if (-4..16).contains(&exponent) {
        let positional = format!("{v}");
        if positional.contains('.') {
            positional
        } else {
            positional + ".0"
        }
    } else {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exponent.unsigned_abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumps(json: &str) -> String {
        let mut sink = Sink::new(64, usize::MAX);
        let raw: &serde_json::value::RawValue = serde_json::from_str(json).unwrap();
        super::super::json::sub_parse(
            raw,
            PyJson {
                sink: &mut sink,
                depth: 0,
            },
        )
        .unwrap();
        String::from_utf8(sink.into_bytes()).unwrap()
    }

    /// Each expected string is what CPython 3 prints for `json.dumps(json.loads(input))`.
    #[test]
    fn writes_what_python_json_dumps_writes() {
        for (input, python) in [
            (
                r#"{"city":"Paris","days":3}"#,
                r#"{"city": "Paris", "days": 3}"#,
            ),
            (
                r#"{"z":1,"a":[1,2,{}],"e":[]}"#,
                r#"{"z": 1, "a": [1, 2, {}], "e": []}"#,
            ),
            (
                r#"{"t":true,"f":false,"n":null}"#,
                r#"{"t": true, "f": false, "n": null}"#,
            ),
            (r#""café ☕ 😀""#, r#""caf\u00e9 \u2615 \ud83d\ude00""#),
            (
                r#""a\"b\\c\nd\te\u0001\u007f""#,
                r#""a\"b\\c\nd\te\u0001\u007f""#,
            ),
            (
                "[1.5,2.0,0.1,1e16,1e-5,0.0001,-3.25e100,123456789.125]",
                "[1.5, 2.0, 0.1, 1e+16, 1e-05, 0.0001, -3.25e+100, 123456789.125]",
            ),
            (
                "[-0.0,-7,18446744073709551615]",
                "[-0.0, -7, 18446744073709551615]",
            ),
        ] {
            assert_eq!(dumps(input), python, "{input}");
        }
    }
}
