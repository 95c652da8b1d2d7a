//! The bytes the proxy hands the plugin for headers, read without trusting them: a header map in
//! the Proxy-Wasm ABI's serialised form, a header value that is not UTF-8, a call answer's
//! `:status`. Native code (no proxy-wasm import) so unit tests and the fuzz targets reach it;
//! `crate::host` uses it for every header it reads.
//!
//! HTTP allows any byte from 0x80 to 0xFF in a header value (obs-text), and Envoy passes them on.
//! proxy-wasm 0.2's getters turn values into `String` with `unwrap`: one such byte from a client,
//! a pod or Envoy itself aborted the VM. Here a value is bytes until kvroute reads it as text, and
//! [`text`] decides what a value that is not UTF-8 means: absent. kvroute never routes on bytes
//! it cannot read as the text its headers are (a session id, a priority, an SLO, a peer token);
//! the request itself passes on untouched, its bytes included.

/// One header as the host gave it: name and value, bytes.
pub type Header<'a> = (&'a [u8], &'a [u8]);

/// Decodes a serialised header map: a little-endian u32 count, then a (name length, value length)
/// u32 pair per header, then each name and value followed by a NUL. `None` when the bytes do not
/// hold what their sizes say (never from a well-behaved host; an empty input is an empty map).
pub fn decode(bytes: &[u8]) -> Option<Vec<Header<'_>>> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let u32_at = |at: usize| -> Option<usize> {
        let word: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
        usize::try_from(u32::from_le_bytes(word)).ok()
    };
    let count = u32_at(0)?;
    // Each header takes at least 10 bytes (its sizes and two NULs): a count beyond what the input
    // can hold is refused before anything is reserved for it.
    if count > bytes.len() / 10 {
        return None;
    }
    let mut data = count.checked_mul(8)?.checked_add(4)?;
    // The field of `len` bytes at `data`, which its NUL must follow; the next one's start.
    let field = |data: usize, len: usize| -> Option<(&[u8], usize)> {
        let end = data.checked_add(len)?;
        (bytes.get(end) == Some(&0)).then_some((bytes.get(data..end)?, end + 1))
    };
    let mut headers = Vec::with_capacity(count);
    for n in 0..count {
        let sizes = 4 + n * 8;
        let (name, next) = field(data, u32_at(sizes)?)?;
        let (value, next) = field(next, u32_at(sizes + 4)?)?;
        data = next;
        headers.push((name, value));
    }
    Some(headers)
}

/// The serialised form [`decode`] reads (for the headers of a local reply).
pub fn encode(headers: &[(&str, &str)]) -> Vec<u8> {
    let size = 4 + headers
        .iter()
        .map(|(n, v)| 10 + n.len() + v.len())
        .sum::<usize>();
    let mut bytes = Vec::with_capacity(size);
    let len32 = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes();
    bytes.extend_from_slice(&len32(headers.len()));
    for (name, value) in headers {
        bytes.extend_from_slice(&len32(name.len()));
        bytes.extend_from_slice(&len32(value.len()));
    }
    for (name, value) in headers {
        bytes.extend_from_slice(name.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(value.as_bytes());
        bytes.push(0);
    }
    bytes
}

/// A header value as kvroute reads it: its text, or `None` (as if absent) when it is not UTF-8.
pub fn text(value: &[u8]) -> Option<&str> {
    std::str::from_utf8(value).ok()
}

/// The value of header `name` (ASCII case-insensitive) as text; the first one when it repeats.
pub fn find<'a>(headers: &[Header<'a>], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
        .and_then(|(_, v)| text(v))
}

/// Whether header `name` is present at all, readable or not (a spoofed routing header with bytes
/// that are not UTF-8 is still removed).
pub fn has(headers: &[Header<'_>], name: &str) -> bool {
    headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
}

/// An HTTP call answer's status from its `:status` value: 0 when there is none or it is not a
/// status (Envoy gives none when it ended the call itself: reset, overflow, timeout).
pub fn status(value: Option<&[u8]>) -> u32 {
    value
        .and_then(text)
        .and_then(|s| s.trim().parse::<u32>().ok())
        .filter(|s| (100..1000).contains(s))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_with_bytes_that_are_not_utf8() {
        let map = encode(&[(":path", "/v1/chat/completions"), ("x-session-id", "abc")]);
        let headers = decode(&map).unwrap();
        assert_eq!(headers.len(), 2);
        assert_eq!(find(&headers, "X-Session-Id"), Some("abc"));
        assert_eq!(find(&headers, ":path"), Some("/v1/chat/completions"));
        assert_eq!(find(&headers, "user-agent"), None);

        // The same layout with a value of 0xE9 (Latin-1 "é"): present, unreadable as text.
        let mut raw = Vec::new();
        raw.extend_from_slice(&1u32.to_le_bytes());
        raw.extend_from_slice(&12u32.to_le_bytes());
        raw.extend_from_slice(&4u32.to_le_bytes());
        raw.extend_from_slice(b"x-session-id\0caf\xe9\0");
        let headers = decode(&raw).unwrap();
        assert_eq!(headers, vec![(&b"x-session-id"[..], &b"caf\xe9"[..])]);
        assert!(has(&headers, "x-session-id"));
        assert_eq!(find(&headers, "x-session-id"), None);
    }

    #[test]
    fn sizes_that_lie_are_refused() {
        assert_eq!(decode(b""), Some(vec![]));
        assert_eq!(decode(b"\x01\x00"), None);
        // A value without the NUL that ends it.
        let mut raw = 1u32.to_le_bytes().to_vec();
        raw.extend_from_slice(&1u32.to_le_bytes());
        raw.extend_from_slice(&1u32.to_le_bytes());
        raw.extend_from_slice(b"a\0b");
        assert_eq!(decode(&raw), None);
        raw.push(0);
        assert_eq!(decode(&raw), Some(vec![(&b"a"[..], &b"b"[..])]));
        // One header of a 4 GiB name.
        let mut raw = 1u32.to_le_bytes().to_vec();
        raw.extend_from_slice(&u32::MAX.to_le_bytes());
        raw.extend_from_slice(&0u32.to_le_bytes());
        raw.extend_from_slice(b"a\0\0");
        assert_eq!(decode(&raw), None);
        // A count of 2^32 - 1 headers in 12 bytes.
        let mut raw = u32::MAX.to_le_bytes().to_vec();
        raw.extend_from_slice(&[0; 8]);
        assert_eq!(decode(&raw), None);
    }

    #[test]
    fn a_call_status_is_a_status_or_0() {
        assert_eq!(status(Some(b"200")), 200);
        assert_eq!(status(Some(b"503")), 503);
        assert_eq!(status(None), 0);
        assert_eq!(status(Some(b"")), 0);
        assert_eq!(status(Some(b"2\xff0")), 0);
        assert_eq!(status(Some(b"99999999999")), 0);
        assert_eq!(status(Some(b"42")), 0);
    }
}
