//! Stored Responses API answers through real Envoy: a `previous_response_id` follow-up, a
//! retrieval and a cancel reach the pod that stored the response among four (kvsim, like vLLM,
//! answers 404 for a response it does not hold).

mod common;

use common::*;
use serde_json::{json, Value};

fn response_id(body: &str) -> String {
    if let Ok(v) = serde_json::from_str::<Value>(body) {
        return v["id"].as_str().unwrap().to_string();
    }
    // A stream: the id of the response in its first event.
    let data = body
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .expect("an event");
    let event: Value = serde_json::from_str(data).unwrap();
    event["response"]["id"].as_str().unwrap().to_string()
}

fn cached_tokens(body: &str) -> u64 {
    let completed = if body.starts_with('{') {
        serde_json::from_str::<Value>(body).unwrap()
    } else {
        let data = body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .find(|d| d.contains("\"response.completed\""))
            .expect("a completed event");
        serde_json::from_str::<Value>(data).unwrap()["response"].clone()
    };
    completed["usage"]["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_of_stored_responses_stays_on_the_pod_that_stores_it() {
    let (_sim, envoy) = stack(4, &[], json!({})).await;
    let client = fresh_client();
    let url = envoy.url("/v1/responses");
    // Instructions do not carry over to a continuation (vLLM and OpenAI): each turn sends them.
    let instructions = system_prompt("stored-", 300);
    let first = post(
        &client,
        &url,
        &json!({"model": MODEL, "instructions": instructions,
                "input": "first question", "max_output_tokens": 4}),
        &[],
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.body);
    let holder = first.pod.clone().unwrap();
    let mut previous = response_id(&first.body);
    // Each turn continues the last: only the holder can answer it (elsewhere: 404).
    for turn in 0..8 {
        let r = post(
            &client,
            &url,
            &json!({"model": MODEL, "previous_response_id": previous,
                    "instructions": instructions,
                    "input": format!("turn {turn}: another question of its own"),
                    "max_output_tokens": 4, "stream": turn % 2 == 1}),
            &[],
        )
        .await;
        assert_eq!(r.status, 200, "turn {turn}: {}", r.body);
        assert_eq!(r.pod.as_deref(), Some(holder.as_str()), "turn {turn}");
        assert_eq!(
            r.debug_field("reason").as_deref(),
            Some("stored_response"),
            "{:?}",
            r.debug
        );
        // The conversation so far is in the holder's KV cache.
        assert!(cached_tokens(&r.body) > 300, "turn {turn}: {}", r.body);
        previous = response_id(&r.body);
    }
    // Retrieval and cancel go by the id in the path alone.
    for _ in 0..4 {
        let got = client
            .get(envoy.url(&format!("/v1/responses/{previous}")))
            .send()
            .await
            .unwrap();
        assert_eq!(got.status(), 200);
        assert_eq!(
            got.headers()["x-kvsim-pod"].to_str().unwrap(),
            holder.as_str()
        );
        let object: Value = got.json().await.unwrap();
        assert_eq!(object["id"], previous.as_str());
        assert_eq!(object["status"], "completed");
    }
    let cancelled = client
        .post(envoy.url(&format!("/v1/responses/{previous}/cancel")))
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status(), 200);
    assert_eq!(
        cancelled.headers()["x-kvsim-pod"].to_str().unwrap(),
        holder.as_str()
    );
    assert_eq!(
        envoy
            .stat("wasmcustom.kvroute.stored_response_pinned_total")
            .await,
        13
    );
    // A response kvroute never saw stored: routed as if it named none (the pod says 404).
    let unknown = post(
        &client,
        &url,
        &json!({"model": MODEL, "previous_response_id": "resp_unknown", "input": "hi"}),
        &[],
    )
    .await;
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    assert_eq!(
        envoy
            .stat("wasmcustom.kvroute.stored_response_unplaced_total")
            .await,
        1
    );
}
