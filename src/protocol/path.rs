//! A request path as the engines' HTTP servers see it, for deciding whether it is an inference
//! request. uvicorn percent-decodes the whole path before starlette (vLLM, SGLang) matches its
//! routes, so `/v1/chat/%63ompletions` reaches the chat handler; Envoy, configured to, merges
//! slashes and resolves dot segments. A path kvroute did not recognise would reach the pod with a
//! body kvroute never read (a client's `kv_transfer_params` in it), so the classification takes
//! the union of those readings: a path any of them maps onto an inference path is one. The path
//! sent on is the client's, unchanged.

/// `path` without its query or fragment, percent-decoded (every `%XX`, as uvicorn decodes), with
/// empty and `.` segments dropped and `..` taking the segment before it off; always starts with
/// `/`, never ends with one.
pub fn normalize(path: &str) -> String {
    let end = path.find(['?', '#']).unwrap_or(path.len());
    let raw = path.as_bytes().get(..end).unwrap_or_default();
    let decoded = percent_decode(raw);
    let text = String::from_utf8_lossy(&decoded);
    let mut segments: Vec<&str> = Vec::new();
    for segment in text.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(text.len() + 1);
    for segment in &segments {
        out.push('/');
        out.push_str(segment);
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

fn percent_decode(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while let Some(&b) = raw.get(i) {
        let hex = |at: usize| raw.get(at).and_then(|c| (*c as char).to_digit(16));
        match (b, hex(i + 1), hex(i + 2)) {
            (b'%', Some(hi), Some(lo)) => {
                // Two hex digits make a byte below 256.
                out.push(u8::try_from(hi * 16 + lo).unwrap_or(b'%'));
                i += 3;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::normalize;

    #[test]
    fn paths_read_as_uvicorn_and_envoy_may_read_them() {
        for (given, seen) in [
            ("/v1/chat/completions", "/v1/chat/completions"),
            ("/v1/chat/%63ompletions", "/v1/chat/completions"),
            ("/v1/chat%2Fcompletions", "/v1/chat/completions"),
            ("/v1/chat/%2563ompletions", "/v1/chat/%63ompletions"),
            ("//v1//chat///completions/", "/v1/chat/completions"),
            ("/v1/./chat/x/../completions?a=/b", "/v1/chat/completions"),
            ("/v1/%2e%2e/v1/completions#f", "/v1/completions"),
            ("/../../v1/completions", "/v1/completions"),
            ("/v1/completions%", "/v1/completions%"),
            ("/v1/completions%4", "/v1/completions%4"),
            ("/v1/%zzcompletions", "/v1/%zzcompletions"),
            ("", "/"),
            ("?x", "/"),
            ("/%ff", "/\u{fffd}"),
        ] {
            assert_eq!(normalize(given), seen, "{given}");
        }
    }
}
