//! Top-level members of a body kvroute's strict parse refuses but Python's `json.loads` (what
//! vLLM's and SGLang's servers read bodies with) may accept: `NaN`, `Infinity`, `1e400`, a byte
//! order mark or UTF-16/32 (detected as `json.detect_encoding` does), nesting deeper than
//! serde_json's 128 levels, a lone surrogate. Used only where such a body is passed through
//! (`passthrough_unparseable_bodies`), to take a client's `kv_transfer_params` out of it.
//!
//! The scan reads less than JSON's grammar (a bare value is any run of bytes up to a delimiter;
//! brackets are counted, not matched), so it accepts every body Python accepts and more: a member
//! Python would see is never missed. Keys are compared decoded (`"kv_transfer_param\u0073"` is
//! the same key to Python).

use std::borrow::Cow;

/// `body` without any top-level member named `key`, as UTF-8; `None` when it has none or is not
/// an object this scan can read (then Python cannot read it either: the pod refuses it).
pub fn remove_member(body: &[u8], key: &str) -> Option<Vec<u8>> {
    let text = as_utf8(body);
    let members = members(&text)?;
    if !members.iter().any(|m| m.key == key.as_bytes()) {
        return None;
    }
    let open = members.first().map_or(0, |m| m.start);
    let mut out = Vec::with_capacity(text.len());
    out.extend_from_slice(text.get(..open)?);
    let mut first = true;
    for member in members.iter().filter(|m| m.key != key.as_bytes()) {
        let stretch = text.get(member.start..member.end)?;
        let lead = stretch
            .iter()
            .position(|b| !is_ws(*b))
            .unwrap_or(stretch.len());
        let stretch = match stretch.get(lead) {
            Some(b',') => stretch.get(lead + 1..)?,
            _ => stretch,
        };
        if !first {
            out.push(b',');
        }
        out.extend_from_slice(stretch);
        first = false;
    }
    let last = members.last().map_or(open, |m| m.end);
    out.extend_from_slice(text.get(last..)?);
    Some(out)
}

/// One top-level member: its stretch (from the end of the value before it, or the opening
/// brace, to the end of its own value) and its decoded key.
struct Member {
    start: usize,
    end: usize,
    key: Vec<u8>,
}

/// The body as Python reads bytes: UTF-32 or UTF-16 by their byte order mark or the pattern of
/// zero bytes an ASCII start makes, else UTF-8 (its mark dropped). Units that are no character
/// (a lone surrogate) become U+FFFD.
fn as_utf8(body: &[u8]) -> Cow<'_, [u8]> {
    let b = |i: usize| body.get(i).copied().unwrap_or(1);
    let zero = |i: usize| body.get(i) == Some(&0);
    if body.starts_with(&[0, 0, 0xfe, 0xff]) {
        return Cow::Owned(utf32(body.get(4..).unwrap_or_default(), true));
    }
    if body.starts_with(&[0xff, 0xfe, 0, 0]) {
        return Cow::Owned(utf32(body.get(4..).unwrap_or_default(), false));
    }
    if body.starts_with(&[0xfe, 0xff]) {
        return Cow::Owned(utf16(body.get(2..).unwrap_or_default(), true));
    }
    if body.starts_with(&[0xff, 0xfe]) {
        return Cow::Owned(utf16(body.get(2..).unwrap_or_default(), false));
    }
    if let Some(rest) = body.strip_prefix(&[0xef, 0xbb, 0xbf]) {
        return Cow::Borrowed(rest);
    }
    if body.len() >= 4 {
        if zero(0) {
            return Cow::Owned(if b(1) != 0 {
                utf16(body, true)
            } else {
                utf32(body, true)
            });
        }
        if zero(1) {
            return Cow::Owned(if b(2) != 0 || b(3) != 0 {
                utf16(body, false)
            } else {
                utf32(body, false)
            });
        }
    } else if body.len() == 2 {
        if zero(0) {
            return Cow::Owned(utf16(body, true));
        }
        if zero(1) {
            return Cow::Owned(utf16(body, false));
        }
    }
    Cow::Borrowed(body)
}

fn utf16(bytes: &[u8], big: bool) -> Vec<u8> {
    let units = bytes.chunks(2).map(|c| {
        let (x, y) = (
            c.first().copied().unwrap_or(0),
            c.get(1).copied().unwrap_or(0),
        );
        if big {
            u16::from_be_bytes([x, y])
        } else {
            u16::from_le_bytes([x, y])
        }
    });
    let text: String = char::decode_utf16(units)
        .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
        .collect();
    text.into_bytes()
}

fn utf32(bytes: &[u8], big: bool) -> Vec<u8> {
    let text: String = bytes
        .chunks(4)
        .map(|c| {
            let mut word = [0u8; 4];
            for (slot, byte) in word.iter_mut().zip(c) {
                *slot = *byte;
            }
            let unit = if big {
                u32::from_be_bytes(word)
            } else {
                u32::from_le_bytes(word)
            };
            char::from_u32(unit).unwrap_or(char::REPLACEMENT_CHARACTER)
        })
        .collect();
    text.into_bytes()
}

/// JSON's whitespace, which is all Python's decoder skips.
fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

fn skip_ws(t: &[u8], mut i: usize) -> usize {
    while t.get(i).copied().is_some_and(is_ws) {
        i += 1;
    }
    i
}

/// The top-level object's members, or `None` when `t` does not open one.
fn members(t: &[u8]) -> Option<Vec<Member>> {
    let mut i = skip_ws(t, 0);
    if t.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    let mut start = i;
    let mut out = Vec::new();
    loop {
        i = skip_ws(t, i);
        match t.get(i) {
            Some(b'}') => return Some(out),
            Some(b',') if !out.is_empty() => i = skip_ws(t, i + 1),
            _ if out.is_empty() => {}
            _ => return Some(out),
        }
        if t.get(i) != Some(&b'"') {
            return Some(out);
        }
        let (key, after) = string(t, i + 1)?;
        i = skip_ws(t, after);
        if t.get(i) != Some(&b':') {
            return Some(out);
        }
        let end = value(t, skip_ws(t, i + 1))?;
        out.push(Member { start, end, key });
        start = end;
        i = end;
    }
}

/// A string's decoded bytes from just after its opening quote, and where it ends (after the
/// closing quote).
fn string(t: &[u8], mut i: usize) -> Option<(Vec<u8>, usize)> {
    let mut out = Vec::new();
    loop {
        match *t.get(i)? {
            b'"' => return Some((out, i + 1)),
            b'\\' => {
                let escaped = *t.get(i + 1)?;
                i += 2;
                let plain = match escaped {
                    b'"' => '"',
                    b'\\' => '\\',
                    b'/' => '/',
                    b'b' => '\u{8}',
                    b'f' => '\u{c}',
                    b'n' => '\n',
                    b'r' => '\r',
                    b't' => '\t',
                    b'u' => {
                        let (c, next) = unicode_escape(t, i)?;
                        i = next;
                        c
                    }
                    _ => return None,
                };
                let mut buf = [0u8; 4];
                out.extend_from_slice(plain.encode_utf8(&mut buf).as_bytes());
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
}

/// `\uXXXX` (after the `u`), a surrogate pair taken together; a lone surrogate is U+FFFD.
fn unicode_escape(t: &[u8], i: usize) -> Option<(char, usize)> {
    let hex4 = |at: usize| -> Option<u32> {
        let digits = std::str::from_utf8(t.get(at..at + 4)?).ok()?;
        u32::from_str_radix(digits, 16).ok()
    };
    let unit = hex4(i)?;
    if (0xd800..0xdc00).contains(&unit) && t.get(i + 4..i + 6) == Some(b"\\u") {
        if let Some(low) = hex4(i + 6).filter(|l| (0xdc00..0xe000).contains(l)) {
            let c = char::from_u32(0x10000 + ((unit - 0xd800) << 10) + (low - 0xdc00));
            return Some((c.unwrap_or(char::REPLACEMENT_CHARACTER), i + 10));
        }
    }
    Some((
        char::from_u32(unit).unwrap_or(char::REPLACEMENT_CHARACTER),
        i + 4,
    ))
}

/// Where the value starting at `i` ends: a string, brackets counted to their balance (strings in
/// them skipped), or a bare run of bytes (`NaN`, `-Infinity`, `1e400`, `true`) up to a delimiter.
fn value(t: &[u8], mut i: usize) -> Option<usize> {
    let mut depth = 0usize;
    loop {
        match *t.get(i)? {
            b'"' => i = string(t, i + 1)?.1,
            b'{' | b'[' => {
                depth += 1;
                i += 1;
            }
            b'}' | b']' if depth > 0 => {
                depth -= 1;
                i += 1;
            }
            b'}' | b']' | b',' if depth == 0 => return Some(i),
            b if is_ws(b) && depth == 0 => return Some(i),
            _ => i += 1,
        }
        if depth == 0 && matches!(t.get(i.wrapping_sub(1)), Some(b'"' | b'}' | b']')) {
            return Some(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::remove_member;

    const KEY: &str = "kv_transfer_params";

    fn removed(body: &[u8]) -> Option<String> {
        remove_member(body, KEY).map(|b| String::from_utf8_lossy(&b).into_owned())
    }

    #[test]
    fn the_member_goes_from_bodies_serde_json_refuses() {
        let kv = r#""kv_transfer_params":{"remote_host":"10.0.0.9","x":[1,{"y":"}"}]}"#;
        for (body, left) in [
            (format!(r#"{{{kv},"t":NaN}}"#), r#"{"t":NaN}"#.to_string()),
            (
                format!(r#"{{"t":-Infinity , {kv} }}"#),
                r#"{"t":-Infinity }"#.to_string(),
            ),
            (
                format!(r#"{{"n":1e400,{kv},"m":"a"}}"#),
                r#"{"n":1e400,"m":"a"}"#.to_string(),
            ),
            (
                format!(r#"{{"s":"\ud800",{kv}}}"#),
                r#"{"s":"\ud800"}"#.to_string(),
            ),
            (
                format!(r#"{{"d":{}{},{kv}}}"#, "[".repeat(200), "]".repeat(200)),
                format!(r#"{{"d":{}{}}}"#, "[".repeat(200), "]".repeat(200)),
            ),
            (
                r#"{"kv_transfer_param\u0073":1,"kv_transfer_params":2,"a":true}"#.to_string(),
                r#"{"a":true}"#.to_string(),
            ),
        ] {
            assert_eq!(
                removed(body.as_bytes()).as_deref(),
                Some(left.as_str()),
                "{body}"
            );
        }
        let bom = [
            &[0xef, 0xbb, 0xbf][..],
            br#"{"kv_transfer_params":1,"a":NaN}"#,
        ]
        .concat();
        assert_eq!(removed(&bom).as_deref(), Some(r#"{"a":NaN}"#));
        for big in [true, false] {
            let text = r#"{"a":1,"kv_transfer_params":{"b":2}}"#;
            let mut bytes = if big {
                vec![0xfe, 0xff]
            } else {
                vec![0xff, 0xfe]
            };
            for unit in text.encode_utf16() {
                let pair = if big {
                    unit.to_be_bytes()
                } else {
                    unit.to_le_bytes()
                };
                bytes.extend_from_slice(&pair);
            }
            assert_eq!(removed(&bytes).as_deref(), Some(r#"{"a":1}"#));
            assert_eq!(
                removed(bytes.get(2..).unwrap()).as_deref(),
                Some(r#"{"a":1}"#)
            );
        }
    }

    #[test]
    fn bodies_without_it_or_unreadable_are_left_alone() {
        for body in [
            &br#"{"a":NaN}"#[..],
            br#"{"x":{"kv_transfer_params":1}}"#,
            br#"["kv_transfer_params"]"#,
            b"",
            b"{",
            br#"{"kv_transfer_params"#,
            br#"{"kv_transfer_params":"#,
        ] {
            assert_eq!(removed(body), None, "{}", String::from_utf8_lossy(body));
        }
    }
}
