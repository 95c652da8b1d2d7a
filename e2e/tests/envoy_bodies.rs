//! Bodies at the edge of what kvroute reads, through the real Envoy.
//!
//! * A body Python's `json` reads (vLLM's and SGLang's servers) but serde_json refuses — `NaN`,
//!   `Infinity`, `1e400`, a byte order mark, UTF-16, nesting past 127, a lone surrogate — used to
//!   pass through untouched, a client's `kv_transfer_params` in it: the pod would pull KV from
//!   the host the client named. So did an ordinary body on `/v1/chat/%63ompletions`, which
//!   uvicorn decodes to the chat path. Now the first are refused (400 `unparseable_body`) or, with
//!   `passthrough_unparseable_bodies`, passed on without that member, and the path is routed. The
//!   pods count every body that reaches them naming the member in its bytes
//!   (`bodies_naming_kv_transfer_params`, whatever its path or encoding): none may.
//! * A body past `max_body_bytes` (9 MiB, under Envoy's 16 MiB buffer; 17 MiB, over it), announced
//!   by `content-length` or chunked, used to end in a connection reset about a second after
//!   kvroute's 413 was sent while the client was still writing: now it is read to its end and
//!   dropped, and the 413 reaches the client.

mod common;

use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const KV: &str = r#""kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"evil","remote_host":"10.66.6.6","remote_port":5600,"remote_block_ids":[1,2,3]}"#;

fn body_with(extra: &str) -> String {
    format!(
        r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"hello there"}}],"max_tokens":2,{extra}{KV}}}"#
    )
}

/// The bodies serde_json refuses and Python reads, each with a `kv_transfer_params`, by name.
fn unparseable_bodies() -> Vec<(&'static str, Vec<u8>)> {
    let utf16: Vec<u8> = [0xff, 0xfe]
        .into_iter()
        .chain(body_with("").encode_utf16().flat_map(u16::to_le_bytes))
        .collect();
    let deep = format!(r#""metadata":{}{},"#, "[".repeat(130), "]".repeat(130));
    vec![
        ("NaN", body_with(r#""temperature":NaN,"#).into_bytes()),
        ("-Infinity", body_with(r#""top_p":-Infinity,"#).into_bytes()),
        (
            "1e400",
            body_with(r#""presence_penalty":1e400,"#).into_bytes(),
        ),
        (
            "UTF-8 BOM",
            [&[0xef, 0xbb, 0xbf][..], body_with("").as_bytes()].concat(),
        ),
        ("UTF-16LE", utf16),
        ("130 deep", body_with(&deep).into_bytes()),
        (
            "lone surrogate",
            body_with(r#""user":"\ud800","#).into_bytes(),
        ),
    ]
}

async fn kv_bodies_seen(sim: &harness::Sim) -> u64 {
    let mut seen = 0;
    for pod in &sim.pods {
        seen += sim_stats(pod).await["bodies_naming_kv_transfer_params"]
            .as_u64()
            .expect("kvsim reports bodies_naming_kv_transfer_params");
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_kv_handle_never_reaches_a_pod_in_a_body_kvroute_cannot_parse() {
    let (sim, envoy) = stack(2, &[], json!({})).await;
    let client = fresh_client();
    let chat_url = envoy.url("/v1/chat/completions");
    for (name, body) in unparseable_bodies() {
        let r = post_raw(&client, &chat_url, body, &[]).await;
        assert_eq!(
            kv_bodies_seen(&sim).await,
            0,
            "{name} reached a pod with its KV handle"
        );
        assert_eq!(r.status, 400, "{name}: {}", r.body);
        assert_eq!(
            r.json()["error"]["code"],
            "unparseable_body",
            "{name}: {}",
            r.body
        );
        assert_eq!(r.pod, None, "{name}: answered by kvroute, not a pod");
    }
    assert_eq!(
        envoy
            .stat("wasmcustom.kvroute.unparseable_body_total")
            .await,
        7
    );
    // Unchanged: a body kvroute reads is routed without its handle, and one that is JSON but not
    // a request kvroute routes is the pod's to answer (still without its handle).
    let r = post_raw(&client, &chat_url, body_with("").into_bytes(), &[]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = post_raw(
        &client,
        &chat_url,
        format!(r#"{{"model":"{MODEL}","messages":7,{KV}}}"#).into_bytes(),
        &[],
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.pod.is_some(), "the pod's own answer: {}", r.body);
    assert_eq!(kv_bodies_seen(&sim).await, 0);
    drop(sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inference_path_is_recognised_as_the_engines_servers_read_it() {
    let (sim, envoy) = stack(2, &[], json!({"debug_header": true})).await;
    let client = fresh_client();
    // Paths uvicorn decodes or Envoy may normalise onto the chat path are routed: the handle is
    // taken out, the decision made (the debug header), the path sent on as the client wrote it.
    // (Dot segments are in the unit tests: the client's URL parser resolves them before sending.)
    for path in [
        "/v1/chat/%63ompletions",
        "/v1/chat%2Fcompletions",
        "//v1/chat//completions",
    ] {
        let r = post_raw(&client, &envoy.url(path), body_with("").into_bytes(), &[]).await;
        assert_eq!(
            kv_bodies_seen(&sim).await,
            0,
            "{path} reached a pod with its KV handle"
        );
        assert!(
            r.debug.is_some(),
            "{path} was not routed: {} {}",
            r.status,
            r.body
        );
        assert!(r.pod.is_some(), "{path}: {} {}", r.status, r.body);
    }
    drop(sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_passthrough_unparseable_bodies_reach_the_pod_without_the_kv_handle() {
    let (sim, envoy) = stack(2, &[], json!({"passthrough_unparseable_bodies": true})).await;
    let client = fresh_client();
    let chat_url = envoy.url("/v1/chat/completions");
    let bodies = unparseable_bodies();
    for (name, body) in &bodies {
        let r = post_raw(&client, &chat_url, body.clone(), &[]).await;
        assert!(
            r.pod.is_some(),
            "{name}: not passed on: {} {}",
            r.status,
            r.body
        );
        assert_eq!(
            kv_bodies_seen(&sim).await,
            0,
            "{name} reached a pod with its KV handle"
        );
    }
    assert_eq!(
        envoy
            .stat("wasmcustom.kvroute.spoofed_kv_transfer_params_removed_total")
            .await,
        bodies.len() as u64
    );
    assert_eq!(
        envoy
            .stat("wasmcustom.kvroute.unparseable_body_total")
            .await,
        0
    );
    drop(sim);
}

/// A client's upload speed, about 5 MiB/s (40 Mbit/s): a 9 MiB body takes longer than the second
/// Envoy waits before closing a connection it answered early (`delayed_close_timeout`). On
/// loopback at full speed the whole body is in before that second is up, and the early answer
/// reads fine: the reset users met needs a body that takes longer to send.
const PACE_BYTES: usize = 256 << 10;
const PACE_EVERY: Duration = Duration::from_millis(50);

/// POSTs `len` bytes of a chat body (padded with spaces) to Envoy's `listener` over HTTP/1.1,
/// with `content-length` or chunked, at [`PACE_BYTES`] per [`PACE_EVERY`], writing all of it
/// before reading the answer, as Python's `requests` and `httpx` (the OpenAI SDK) do; a write or
/// read that fails (a reset) is an `Err`.
async fn post_big(listener: &str, len: usize, announced: bool) -> Result<(u16, Value), String> {
    let mut body = serde_json::to_vec(&chat("system", "q", 1, false)).unwrap();
    body.resize(len, b' ');
    let mut stream = TcpStream::connect(listener)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let framing = if announced {
        format!("content-length: {len}")
    } else {
        "transfer-encoding: chunked".to_string()
    };
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: kvroute\r\ncontent-type: application/json\r\n{framing}\r\n\r\n"
    );
    let mut wire = head.into_bytes();
    if announced {
        wire.extend_from_slice(&body);
    } else {
        for chunk in body.chunks(64 << 10) {
            wire.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            wire.extend_from_slice(chunk);
            wire.extend_from_slice(b"\r\n");
        }
        wire.extend_from_slice(b"0\r\n\r\n");
    }
    let sent = Instant::now();
    for piece in wire.chunks(PACE_BYTES) {
        stream
            .write_all(piece)
            .await
            .map_err(|e| format!("writing the body: {e} after {:?}", sent.elapsed()))?;
        tokio::time::sleep(PACE_EVERY).await;
    }
    let mut answer = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = stream
            .read(&mut buf)
            .await
            .map_err(|e| format!("reading the answer: {e} after {:?}", sent.elapsed()))?;
        answer.extend_from_slice(&buf[..n]);
        if let Some((status, body)) = whole_answer(&answer) {
            return Ok((status, serde_json::from_slice(body).unwrap_or(Value::Null)));
        }
        if n == 0 {
            return Err(format!(
                "closed after {:?}: {}",
                sent.elapsed(),
                String::from_utf8_lossy(&answer)
            ));
        }
    }
}

/// The status and body of a whole `content-length` answer in `bytes`, once it is all there.
fn whole_answer(bytes: &[u8]) -> Option<(u16, &[u8])> {
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&bytes[..end]).ok()?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let length: usize = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse().ok())?
    })?;
    bytes
        .get(end + 4..end + 4 + length)
        .map(|body| (status, body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_past_max_body_bytes_gets_a_413_the_client_can_read() {
    let (sim, envoy) = stack(1, &[], json!({})).await;
    let url = envoy.url("/v1/chat/completions");
    let mut outcomes = Vec::new();
    for (mib, announced) in [(9, true), (17, true), (9, false), (17, false)] {
        let answer = tokio::time::timeout(
            Duration::from_secs(30),
            post_big(&envoy.listener, mib << 20, announced),
        )
        .await
        .unwrap_or_else(|_| Err("no answer in 30 s".to_string()));
        let how = if announced {
            "content-length"
        } else {
            "chunked"
        };
        outcomes.push((format!("{mib} MiB, {how}"), answer));
    }
    // Every case sent before any is judged, so a failure shows all four.
    for (case, answer) in &outcomes {
        let readable = answer.as_ref().is_ok_and(|(status, error)| {
            *status == 413 && error["error"]["code"] == "body_too_large"
        });
        assert!(readable, "{case}: {answer:?}; all: {outcomes:#?}");
    }
    assert_eq!(
        envoy.stat("wasmcustom.kvroute.body_too_large_total").await,
        outcomes.len() as u64
    );
    // Under the limit, still routed.
    let r = post(&fresh_client(), &url, &chat("system", "q", 1, false), &[]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    drop(sim);
}
