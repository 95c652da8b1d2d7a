//! Stored Responses: the pod that stored a Responses API answer serves everything that names it.
//!
//! A model server keeps the responses it answered (`store`, true by default) in its own memory:
//! vLLM answers a `previous_response_id` it does not hold with 404, and so do `GET
//! /v1/responses/{id}` and its `cancel` on another pod. Prefix routing cannot find that pod — a
//! follow-up carries only its new input, the conversation lives on the server — so kvroute
//! remembers where each response was stored:
//!
//! 1. **Learn.** A 2xx answer to a storing `/v1/responses` request names its id first (the
//!    response object opens with `"id"`; a stream's first event, `response.created`, carries the
//!    response whose `"id"` is the first in the stream). [`first_id`] reads it from the first
//!    [`ID_SCAN_BYTES`] of the answer; [`record`] notes `id → pod`.
//! 2. **Pin.** A request naming `previous_response_id` gets the storing pod as a hard pin in the
//!    scheduler (`scheduler::Hints::stored_at`): first whatever its load, as no other pod can
//!    answer it. `GET`/`DELETE /v1/responses/{id}[/…]` (retrieve, cancel, input items) are sent
//!    there from their headers alone.
//! 3. **Fall back.** An id kvroute does not know (stored before this Envoy started, expired,
//!    forgotten) or whose pod is no longer a candidate is routed as if it named nothing (prefix
//!    routing, the cluster's balancer for a `GET`), and counted: the server answers as it does.
//!
//! **Where it lives.** Every worker VM must find what any other learned, so the table is Envoy's
//! shared data: [`BUCKETS`] fixed keys (shared data stays bounded whatever the traffic), each a
//! bucket of up to [`BUCKET_ENTRIES`] entries `(id hash, stored at, pod)` kept newest first and
//! written with compare-and-swap. An id is forgotten when `ttl_ms` passed or [`BUCKET_ENTRIES`]
//! newer ids landed in its bucket — with ids spread evenly, after about `BUCKETS × BUCKET_ENTRIES`
//! (8,192) newer stored responses. At most ~0.5 MB per Envoy. Gateway replicas do not share it: a
//! follow-up that reaches another replica falls back (3.).

use crate::port::Host;
use crate::protocol::usage::skip_spaces;
use xxhash_rust::xxh3::xxh3_64;

/// Fixed shared-data keys `kvroute.responses.<n>`.
pub const BUCKETS: u64 = 1024;
pub const BUCKET_ENTRIES: usize = 8;
/// How far into an answer its id is looked for.
pub const ID_SCAN_BYTES: usize = 4096;
/// Ids longer than this are not remembered (vLLM's are `resp_` and 32 hex digits).
const MAX_ID_BYTES: usize = 256;
/// Compare-and-swap attempts per write before the note is dropped.
const WRITE_ATTEMPTS: usize = 4;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    id_hash: u64,
    stored_ms: u64,
    addr: String,
}

fn key_of(id_hash: u64) -> String {
    format!("kvroute.responses.{}", id_hash % BUCKETS)
}

/// A bucket: `n:u8 (id_hash:u64 stored_ms:u64 len:u16 addr)×n`, little-endian. Anything that
/// does not decode reads as an empty bucket.
fn decode(bytes: &[u8]) -> Vec<Entry> {
    fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, tail) = (bytes.get(..n)?, bytes.get(n..)?);
        *bytes = tail;
        Some(head)
    }
    fn u64_of(bytes: &mut &[u8]) -> Option<u64> {
        Some(u64::from_le_bytes(take(bytes, 8)?.try_into().ok()?))
    }
    let mut rest = bytes;
    let mut entries = Vec::new();
    let Some(&[n]) = take(&mut rest, 1) else {
        return entries;
    };
    for _ in 0..n.min(BUCKET_ENTRIES as u8) {
        let entry = (|| {
            let id_hash = u64_of(&mut rest)?;
            let stored_ms = u64_of(&mut rest)?;
            let len = u16::from_le_bytes(take(&mut rest, 2)?.try_into().ok()?);
            let addr = std::str::from_utf8(take(&mut rest, usize::from(len))?).ok()?;
            Some(Entry {
                id_hash,
                stored_ms,
                addr: addr.to_string(),
            })
        })();
        match entry {
            Some(e) => entries.push(e),
            None => return Vec::new(),
        }
    }
    entries
}

fn encode(entries: &[Entry]) -> Vec<u8> {
    let mut out = vec![entries.len().min(BUCKET_ENTRIES) as u8];
    for e in entries.iter().take(BUCKET_ENTRIES) {
        out.extend_from_slice(&e.id_hash.to_le_bytes());
        out.extend_from_slice(&e.stored_ms.to_le_bytes());
        let addr = e.addr.as_bytes();
        let len = addr.len().min(usize::from(u16::MAX));
        out.extend_from_slice(&(len as u16).to_le_bytes());
        out.extend_from_slice(addr.get(..len).unwrap_or_default());
    }
    out
}

/// Notes that `addr` stored the response `id` (now). Returns whether the note was written.
pub fn record(host: &mut dyn Host, id: &str, addr: &str) -> bool {
    let id_hash = xxh3_64(id.as_bytes());
    let key = key_of(id_hash);
    let now = host.now_ms();
    for _ in 0..WRITE_ATTEMPTS {
        let (bytes, cas) = host.shared_get(&key);
        let mut entries = bytes.as_deref().map(decode).unwrap_or_default();
        entries.retain(|e| e.id_hash != id_hash);
        entries.insert(
            0,
            Entry {
                id_hash,
                stored_ms: now,
                addr: addr.to_string(),
            },
        );
        entries.truncate(BUCKET_ENTRIES);
        if host.shared_set(&key, &encode(&entries), cas).is_ok() {
            return true;
        }
    }
    false
}

/// The pod that stored `id`, if kvroute saw it stored less than `ttl_ms` ago.
pub fn lookup(host: &dyn Host, id: &str, ttl_ms: u64) -> Option<String> {
    let id_hash = xxh3_64(id.as_bytes());
    let (bytes, _) = host.shared_get(&key_of(id_hash));
    let now = host.now_ms();
    decode(&bytes?)
        .into_iter()
        .find(|e| e.id_hash == id_hash && now.saturating_sub(e.stored_ms) < ttl_ms)
        .map(|e| e.addr)
}

/// The response id a path names: `/v1/responses/{id}` and anything under it (`/cancel`,
/// `/input_items`), without a query string.
pub fn id_in_path(path: &str) -> Option<&str> {
    let path = path.split('?').next().unwrap_or(path);
    let rest = path.strip_prefix("/v1/responses/")?;
    let id = rest.split('/').next()?;
    (!id.is_empty() && id.len() <= MAX_ID_BYTES).then_some(id)
}

/// The first `"id"` member's string value in the opening bytes of an answer (see the module
/// header), if it is a plain string of at most [`MAX_ID_BYTES`] (no escapes).
pub fn first_id(bytes: &[u8]) -> Option<&str> {
    const KEY: &[u8] = b"\"id\"";
    let head = bytes.get(..bytes.len().min(ID_SCAN_BYTES))?;
    let at = head.windows(KEY.len()).position(|w| w == KEY)?;
    let rest = skip_spaces(head.get(at + KEY.len()..)?);
    let rest = skip_spaces(rest.strip_prefix(b":")?);
    let rest = rest.strip_prefix(b"\"")?;
    let len = rest.iter().position(|&b| b == b'"')?;
    let id = rest.get(..len)?;
    if id.is_empty() || id.len() > MAX_ID_BYTES || id.contains(&b'\\') {
        return None;
    }
    std::str::from_utf8(id).ok()
}

/// A pod address's key in `scheduler::Hints::stored_at` (a hash keeps the hints `Copy`).
pub fn addr_key(addr: &str) -> u64 {
    xxh3_64(addr.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{FakeHost, Store};
    use std::cell::RefCell;
    use std::rc::Rc;

    #[test]
    fn a_stored_id_is_found_from_any_vm_until_it_expires() {
        let store = Rc::new(RefCell::new(Store::default()));
        let mut one = FakeHost::new(&store);
        let other = FakeHost::new(&store);
        assert!(record(&mut one, "resp_abc", "10.0.0.2:8000"));
        assert_eq!(
            lookup(&other, "resp_abc", 60_000).as_deref(),
            Some("10.0.0.2:8000")
        );
        assert_eq!(lookup(&other, "resp_abd", 60_000), None);
        one.advance_ms(61_000);
        assert_eq!(lookup(&one, "resp_abc", 60_000), None, "expired");
    }

    #[test]
    fn a_bucket_keeps_its_newest_ids() {
        let store = Rc::new(RefCell::new(Store::default()));
        let mut host = FakeHost::new(&store);
        // Ids that share one bucket: the oldest falls out once the bucket is full.
        let ids: Vec<String> = (0..100_000u32)
            .map(|i| format!("resp_{i}"))
            .filter(|id| xxh3_64(id.as_bytes()) % BUCKETS == 7)
            .take(BUCKET_ENTRIES + 1)
            .collect();
        for (i, id) in ids.iter().enumerate() {
            assert!(record(&mut host, id, &format!("pod{i}:1")));
        }
        assert_eq!(lookup(&host, &ids[0], u64::MAX), None);
        for (i, id) in ids.iter().enumerate().skip(1) {
            assert_eq!(lookup(&host, id, u64::MAX), Some(format!("pod{i}:1")));
        }
        // A response stored again moves to its new pod.
        assert!(record(&mut host, &ids[3], "elsewhere:1"));
        assert_eq!(
            lookup(&host, &ids[3], u64::MAX).as_deref(),
            Some("elsewhere:1")
        );
    }

    #[test]
    fn a_foreign_or_truncated_bucket_reads_as_empty() {
        let entries = vec![Entry {
            id_hash: 1,
            stored_ms: 2,
            addr: "a:1".into(),
        }];
        let bytes = encode(&entries);
        assert_eq!(decode(&bytes), entries);
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_empty() || cut == bytes.len());
        }
        assert!(decode(&[200, 1, 2, 3]).is_empty());
    }

    #[test]
    fn ids_are_read_from_answers_and_paths() {
        let body =
            br#"{"id":"resp_0f1e","created_at":1,"object":"response","output":[{"id":"msg_1"}]}"#;
        assert_eq!(first_id(body), Some("resp_0f1e"));
        let stream = b"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\": \"resp_9\",\"object\":\"response\"}}\n\n";
        assert_eq!(first_id(stream), Some("resp_9"));
        assert_eq!(first_id(br#"{"id":"a\"b"}"#), None, "escapes: not ours");
        assert_eq!(first_id(br#"{"object":"response"}"#), None);
        let far = [vec![b' '; ID_SCAN_BYTES], br#"{"id":"x"}"#.to_vec()].concat();
        assert_eq!(first_id(&far), None, "only the opening bytes");
        assert_eq!(id_in_path("/v1/responses/resp_1"), Some("resp_1"));
        assert_eq!(id_in_path("/v1/responses/resp_1/cancel"), Some("resp_1"));
        assert_eq!(id_in_path("/v1/responses/resp_1?x=1"), Some("resp_1"));
        assert_eq!(id_in_path("/v1/responses"), None);
        assert_eq!(id_in_path("/v1/responses/"), None);
    }
}
