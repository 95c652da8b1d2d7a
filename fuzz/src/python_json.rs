//! The `body_differential` target's oracle: the top-level keys of a body as Python's `json.loads`
//! reads bytes (vLLM's and SGLang's servers), written apart from kvroute's own readers. Encoding
//! as `json.detect_encoding` finds it; `NaN`, `Infinity`, `-Infinity`, numbers of any size, lone
//! surrogates and nesting to Python's recursion limit accepted; control characters in strings and
//! data after the value refused, as Python refuses them.

/// Python's default recursion limit, roughly what its decoder nests to.
const MAX_DEPTH: usize = 1000;

/// Every top-level key of `body` (repeats included), or `None` when Python would not read it as
/// an object.
pub fn top_level_keys(body: &[u8]) -> Option<Vec<String>> {
    let text = decode(body);
    let chars: Vec<char> = text.chars().collect();
    let mut p = Parser {
        s: &chars,
        i: 0,
        keys: None,
    };
    p.ws();
    if p.peek() != Some('{') {
        return None;
    }
    p.keys = Some(Vec::new());
    p.value(0)?;
    p.ws();
    (p.i == chars.len()).then_some(())?;
    p.keys
}

fn decode(b: &[u8]) -> String {
    let units16 = |b: &[u8], big: bool| -> String {
        let units = b.chunks(2).map(|c| {
            let pair = [c[0], *c.get(1).unwrap_or(&0)];
            if big {
                u16::from_be_bytes(pair)
            } else {
                u16::from_le_bytes(pair)
            }
        });
        char::decode_utf16(units)
            .map(|c| c.unwrap_or('\u{fffd}'))
            .collect()
    };
    let units32 = |b: &[u8], big: bool| -> String {
        b.chunks(4)
            .map(|c| {
                let mut w = [0u8; 4];
                w[..c.len()].copy_from_slice(c);
                let u = if big {
                    u32::from_be_bytes(w)
                } else {
                    u32::from_le_bytes(w)
                };
                char::from_u32(u).unwrap_or('\u{fffd}')
            })
            .collect()
    };
    if b.starts_with(&[0, 0, 0xfe, 0xff]) {
        return units32(&b[4..], true);
    }
    if b.starts_with(&[0xff, 0xfe, 0, 0]) {
        return units32(&b[4..], false);
    }
    if b.starts_with(&[0xfe, 0xff]) {
        return units16(&b[2..], true);
    }
    if b.starts_with(&[0xff, 0xfe]) {
        return units16(&b[2..], false);
    }
    if b.starts_with(&[0xef, 0xbb, 0xbf]) {
        return String::from_utf8_lossy(&b[3..]).into_owned();
    }
    if b.len() >= 4 {
        if b[0] == 0 {
            return if b[1] != 0 {
                units16(b, true)
            } else {
                units32(b, true)
            };
        }
        if b[1] == 0 {
            return if b[2] != 0 || b[3] != 0 {
                units16(b, false)
            } else {
                units32(b, false)
            };
        }
    } else if b.len() == 2 {
        if b[0] == 0 {
            return units16(b, true);
        }
        if b[1] == 0 {
            return units16(b, false);
        }
    }
    String::from_utf8_lossy(b).into_owned()
}

struct Parser<'a> {
    s: &'a [char],
    i: usize,
    /// The top-level object's keys, filled while at depth 1.
    keys: Option<Vec<String>>,
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.s.get(self.i).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(' ' | '\t' | '\n' | '\r')) {
            self.i += 1;
        }
    }

    fn eat(&mut self, word: &str) -> Option<()> {
        for c in word.chars() {
            (self.peek() == Some(c)).then_some(())?;
            self.i += 1;
        }
        Some(())
    }

    fn value(&mut self, depth: usize) -> Option<()> {
        (depth < MAX_DEPTH).then_some(())?;
        match self.peek()? {
            '{' => self.object(depth + 1),
            '[' => self.array(depth + 1),
            '"' => self.string().map(drop),
            'N' => self.eat("NaN"),
            'I' => self.eat("Infinity"),
            't' => self.eat("true"),
            'f' => self.eat("false"),
            'n' => self.eat("null"),
            '-' if self.s.get(self.i + 1) == Some(&'I') => self.eat("-Infinity"),
            _ => self.number(),
        }
    }

    fn object(&mut self, depth: usize) -> Option<()> {
        self.i += 1;
        self.ws();
        if self.peek() == Some('}') {
            self.i += 1;
            return Some(());
        }
        loop {
            self.ws();
            (self.peek() == Some('"')).then_some(())?;
            let key = self.string()?;
            if depth == 1 {
                self.keys.as_mut()?.push(key);
            }
            self.ws();
            self.eat(":")?;
            self.ws();
            self.value(depth)?;
            self.ws();
            match self.peek()? {
                ',' => self.i += 1,
                '}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    fn array(&mut self, depth: usize) -> Option<()> {
        self.i += 1;
        self.ws();
        if self.peek() == Some(']') {
            self.i += 1;
            return Some(());
        }
        loop {
            self.ws();
            self.value(depth)?;
            self.ws();
            match self.peek()? {
                ',' => self.i += 1,
                ']' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    fn string(&mut self) -> Option<String> {
        self.i += 1;
        let mut out = String::new();
        loop {
            let c = self.peek()?;
            self.i += 1;
            match c {
                '"' => return Some(out),
                '\\' => {
                    let e = self.peek()?;
                    self.i += 1;
                    match e {
                        '"' | '\\' | '/' => out.push(e),
                        'b' => out.push('\u{8}'),
                        'f' => out.push('\u{c}'),
                        'n' => out.push('\n'),
                        'r' => out.push('\r'),
                        't' => out.push('\t'),
                        'u' => out.push(self.escape()?),
                        _ => return None,
                    }
                }
                c if (c as u32) < 0x20 => return None,
                c => out.push(c),
            }
        }
    }

    /// `XXXX` after `\u`, and a low surrogate's escape after a high one.
    fn escape(&mut self) -> Option<char> {
        let hex = |p: &Self, at: usize| -> Option<u32> {
            let digits: String = p.s.get(at..at + 4)?.iter().collect();
            // Python's decoder takes exactly four hex digits (no sign).
            digits
                .chars()
                .all(|c| c.is_ascii_hexdigit())
                .then(|| u32::from_str_radix(&digits, 16).ok())?
        };
        let unit = hex(self, self.i)?;
        self.i += 4;
        if (0xd800..0xdc00).contains(&unit)
            && self.s.get(self.i) == Some(&'\\')
            && self.s.get(self.i + 1) == Some(&'u')
        {
            if let Some(low) = hex(self, self.i + 2).filter(|l| (0xdc00..0xe000).contains(l)) {
                self.i += 6;
                return char::from_u32(0x10000 + ((unit - 0xd800) << 10) + (low - 0xdc00));
            }
        }
        Some(char::from_u32(unit).unwrap_or('\u{fffd}'))
    }

    /// `-?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?`
    fn number(&mut self) -> Option<()> {
        let digits = |p: &mut Self| {
            let start = p.i;
            while p.peek().is_some_and(|c| c.is_ascii_digit()) {
                p.i += 1;
            }
            p.i > start
        };
        if self.peek() == Some('-') {
            self.i += 1;
        }
        if self.peek() == Some('0') {
            self.i += 1;
        } else {
            digits(self).then_some(())?;
        }
        if self.peek() == Some('.') && self.s.get(self.i + 1).is_some_and(char::is_ascii_digit) {
            self.i += 1;
            digits(self);
        }
        if matches!(self.peek(), Some('e' | 'E')) {
            let back = self.i;
            self.i += 1;
            if matches!(self.peek(), Some('+' | '-')) {
                self.i += 1;
            }
            if !digits(self) {
                self.i = back;
            }
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::top_level_keys;

    #[test]
    fn reads_what_python_reads() {
        let keys = |b: &[u8]| top_level_keys(b);
        assert_eq!(
            keys(br#"{"a":NaN,"b":[-Infinity,1e400,{"c":"\ud800"}],"a":1}"#),
            Some(vec!["a".into(), "b".into(), "a".into()])
        );
        assert_eq!(
            keys(br#" {"kv_transfer_param\u0073":0} "#),
            Some(vec!["kv_transfer_params".into()])
        );
        let utf16: Vec<u8> = r#"{"x":1}"#.encode_utf16().flat_map(u16::to_le_bytes).collect();
        assert_eq!(keys(&utf16), Some(vec!["x".into()]));
        assert_eq!(keys(b"[1]"), None);
        assert_eq!(keys(br#"{"a":1}x"#), None);
        assert_eq!(keys(b"{\"a\":\"\x01\"}"), None);
        assert_eq!(keys(br#"{"a":01}"#), None);
        assert_eq!(keys(br#"{"a":1,}"#), None);
    }
}
