//! Hand-made cases for the scheduler and the block pool, driven step by step with synthetic
//! times (no sleeping): `plan` at a step boundary, `finish_step` at its end.
use super::*;
use crate::profile;

fn fitted(blocks: usize, budget: usize) -> SimConfig {
    let p = profile::find("llama-3.1-8b-h100").expect("profile");
    SimConfig {
        num_gpu_blocks: blocks,
        chunked_prefill_tokens: budget,
        ..SimConfig::default().with_profile(p)
    }
}

/// A prompt of `tokens` tokens whose block hashes are unique to `tag`.
fn spec(tag: u64, tokens: usize, max_tokens: usize) -> SeqSpec {
    SeqSpec {
        prompt_tokens: tokens,
        block_hashes: (0..(tokens / 16) as u64).map(|i| (tag << 32) | i).collect(),
        max_tokens,
        remote_tokens: 0,
        report_block_ids: false,
        pull_source: None,
        adapter: None,
    }
}

/// Submits at `now`, queued at once (tests of the α0/α1 delay use `Engine::submit`).
fn push(eng: &Engine, s: SeqSpec, now: Instant) -> mpsc::UnboundedReceiver<SeqEvent> {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut st = eng.lock();
    st.waiting
        .push_back(Seq::new(s, Sink::Direct(tx), now, now));
    rx
}

/// Plans a step at `now` and finishes it; returns its simulated duration (zero if idle) and the
/// (prefill, decode) tokens it held.
fn step(eng: &Engine, now: Instant) -> (Duration, usize, usize) {
    let cfg = &eng.cfg;
    let mut st = eng.lock();
    let plan = st.plan(cfg, now, Some(now));
    let prefill: usize = st.running.iter().map(|s| s.sched_prefill).sum();
    let decode = st.running.iter().filter(|s| s.sched_decode).count();
    match plan {
        Plan::Idle(_) => (Duration::ZERO, 0, 0),
        Plan::Step { sim, .. } => {
            st.finish_step(cfg, now + cfg.to_wall(sim));
            (sim, prefill, decode)
        }
    }
}

fn us(cfg: &SimConfig, prefill: usize, decode: usize) -> Duration {
    Duration::from_secs_f64(cfg.profile.step_us(prefill, decode).expect("fitted") / 1e6)
}

#[test]
fn one_budget_is_shared_by_decodes_and_prefill_chunks() {
    let cfg = SimConfig {
        max_num_seqs: 4,
        ..fitted(1000, 100)
    };
    let eng = Engine::new(cfg.clone());
    let t0 = Instant::now();
    let _rx: Vec<_> = (0..3).map(|i| push(&eng, spec(i, 17, 50), t0)).collect();
    // Three 17-token prompts fit the 100-token budget together: one step of 51 prefill tokens.
    assert_eq!(step(&eng, t0), (us(&cfg, 51, 0), 51, 0));
    let _long = push(&eng, spec(9, 500, 5), t0);
    let _fifth = push(&eng, spec(10, 20, 5), t0);
    // Three decodes take 3 tokens of the budget; the 500-token prompt gets the other 97.
    assert_eq!(step(&eng, t0), (us(&cfg, 97, 3), 97, 3));
    assert_eq!(step(&eng, t0), (us(&cfg, 97, 3), 97, 3));
    // max_num_seqs = 4: the fifth request waits.
    let st = eng.lock();
    assert_eq!((st.running.len(), st.waiting.len()), (4, 1));
    // 5752.705191348184 + 17.25086436834028·97 + 5.999143920128404·3 µs, by hand:
    let want = 5752.705191348184 + 17.25086436834028 * 97.0 + 5.999143920128404 * 3.0;
    assert!((us(&cfg, 97, 3).as_secs_f64() * 1e6 - want).abs() < 1e-3);
}

#[test]
fn admission_counts_shared_prefix_blocks_once_and_waits_for_room() {
    let cfg = fitted(10, 0);
    let eng = Engine::new(cfg.clone());
    let t0 = Instant::now();
    // A: 64 tokens = 4 full blocks.
    let _a = push(&eng, spec(1, 64, 100), t0);
    step(&eng, t0);
    assert_eq!(eng.lock().used_blocks(&cfg), 4);
    // B: A's 64 tokens + 16 more. Its first 4 blocks are A's (pinned, shared), 1 is new.
    let mut b = spec(1, 80, 100);
    b.block_hashes.push(99);
    let _b = push(&eng, b, t0);
    let (_, prefill, decode) = step(&eng, t0);
    assert_eq!(
        (prefill, decode),
        (16, 1),
        "B computes only its uncached block"
    );
    // A now holds 5 blocks (65 tokens), B 5 of which 4 are A's: 6 in use, not 10.
    assert_eq!(eng.lock().used_blocks(&cfg), 6);
    // C needs 5 blocks for 80 uncached tokens; 4 are free: it waits, nothing is preempted.
    let _c = push(&eng, spec(3, 80, 1), t0);
    step(&eng, t0);
    let st = eng.lock();
    assert_eq!((st.running.len(), st.waiting.len()), (2, 1));
    assert_eq!(st.counters.preemptions, 0);
    assert_eq!(st.counters.prefix_hits, 64);
}

#[test]
fn a_request_that_cannot_grow_preempts_the_last_admitted_which_is_recomputed() {
    let cfg = fitted(8, 0);
    let eng = Engine::new(cfg.clone());
    let t0 = Instant::now();
    let _a = push(&eng, spec(1, 48, 20), t0);
    let mut b_rx = push(&eng, spec(2, 48, 30), t0);
    // Both 3-block prompts fit (6 of 8); each decode step needs slots for prompt + generated.
    assert_eq!(step(&eng, t0).1, 96);
    for _ in 0..16 {
        step(&eng, t0);
    }
    // 48 + 16 = 64 tokens: 4 blocks each, the pool is full.
    {
        let st = eng.lock();
        assert_eq!(st.used_blocks(&cfg), 8);
        assert_eq!(st.counters.preemptions, 0);
    }
    // The next decode needs a 5th block for A: B (admitted last) is preempted, A runs alone.
    assert_eq!(step(&eng, t0), (us(&cfg, 0, 1), 0, 1));
    {
        let st = eng.lock();
        assert_eq!(st.counters.preemptions, 1);
        assert_eq!((st.running.len(), st.waiting.len()), (1, 1));
        assert_eq!(
            st.waiting[0].generated, 17,
            "B keeps the tokens it streamed"
        );
        assert_eq!(st.used_blocks(&cfg), 5, "B's blocks are free");
    }
    let mut b_tokens = Vec::new();
    while let Ok(SeqEvent::Token { index, .. }) = b_rx.try_recv() {
        b_tokens.push(index);
    }
    assert_eq!(b_tokens, (0..17).collect::<Vec<_>>());
    // B cannot come back while A holds 5 blocks: reviving its 3 cached prompt blocks and 2 more
    // for its 65 tokens needs 5, and 3 are free. A's last two tokens (19 and 20):
    for _ in 0..2 {
        assert_eq!(step(&eng, t0), (us(&cfg, 0, 1), 0, 1));
        assert_eq!(eng.lock().waiting.len(), 1);
    }
    // A is done; B resumes, hits its 3 cached prompt blocks and recomputes the 17 tokens it had
    // generated (one step of 17 prefill tokens), then streams token 17 on.
    assert!(eng.lock().running.is_empty());
    assert_eq!(step(&eng, t0), (us(&cfg, 17, 0), 17, 0));
    assert!(matches!(
        b_rx.try_recv(),
        Ok(SeqEvent::Token { index: 17, .. })
    ));
    assert_eq!(
        eng.lock().counters.prefix_hits,
        0,
        "hits counted once, at first admission"
    );
}

#[test]
fn a_preempted_request_goes_back_to_the_front_of_the_queue() {
    let cfg = fitted(8, 0);
    let eng = Engine::new(cfg.clone());
    let t0 = Instant::now();
    let _a = push(&eng, spec(1, 48, 40), t0);
    let _b = push(&eng, spec(2, 48, 40), t0);
    for _ in 0..17 {
        step(&eng, t0);
    }
    assert_eq!(eng.lock().used_blocks(&cfg), 8);
    // C (one block) arrives while the pool is full; B's preemption puts B ahead of it.
    let _c = push(&eng, spec(3, 15, 1), t0);
    assert_eq!(step(&eng, t0).2, 1);
    {
        let st = eng.lock();
        assert_eq!(st.counters.preemptions, 1);
        assert_eq!(st.waiting.len(), 2, "B at the front, C behind it");
        assert_eq!(
            st.waiting[0].spec.block_hashes,
            spec(2, 48, 40).block_hashes
        );
    }
    // Next step: B (front) does not fit, and FIFO holds C back behind it although C would fit.
    step(&eng, t0);
    assert_eq!(eng.lock().waiting.len(), 2);
}

#[test]
fn unused_cached_blocks_are_free_and_evicted_lru() {
    let cfg = fitted(10, 0);
    let eng = Engine::new(cfg.clone());
    let t0 = Instant::now();
    let _a = push(&eng, spec(1, 64, 1), t0);
    step(&eng, t0);
    {
        let st = eng.lock();
        assert!(st.running.is_empty());
        assert_eq!(
            st.used_blocks(&cfg),
            0,
            "finished: nothing referenced (usage 0)"
        );
        assert_eq!(st.cache.block_count(), 4, "but still cached");
    }
    // B needs 8 blocks: 6 are unused, 4 more come from A's cached blocks, tail first.
    let _b = push(&eng, spec(2, 128, 5), t0);
    step(&eng, t0);
    let st = eng.lock();
    assert_eq!(st.used_blocks(&cfg), 8);
    let a = spec(1, 64, 1).block_hashes;
    assert_eq!(
        st.cache.longest_prefix(&a),
        2,
        "A's head survives, its tail went first"
    );
    assert_eq!(st.cache.block_count(), 10);
}

#[test]
fn concurrent_pulls_share_the_link() {
    let cfg = SimConfig {
        role: super::super::config::Role::Decode,
        ..fitted(10_000, 0)
    };
    let one = cfg.to_wall(cfg.transfer_time(1000));
    let eng = Engine::new(cfg.clone());
    let t0 = Instant::now();
    let pull = |tag| SeqSpec {
        remote_tokens: 1000,
        ..spec(tag, 1001, 2)
    };
    let _a = push(&eng, pull(1), t0);
    let _b = push(&eng, pull(2), t0);
    let mut st = eng.lock();
    let Plan::Idle(Some(wake)) = st.plan(&cfg, t0, None) else {
        panic!("both requests wait for their KV");
    };
    // Two 1,000-token pulls at half the link each end together after twice one pull's time.
    let err = wake.saturating_duration_since(t0).abs_diff(one * 2);
    assert!(err < Duration::from_micros(1), "{wake:?} vs {:?}", one * 2);
    let plan = st.plan(&cfg, t0 + one, None);
    assert!(matches!(plan, Plan::Idle(_)), "not done at one pull's time");
    assert_eq!(st.transferring.len(), 2);
    let plan = st.plan(&cfg, t0 + one * 2 + Duration::from_micros(1), None);
    assert!(matches!(plan, Plan::Step { .. }));
    assert_eq!(st.running.len(), 2);
    assert_eq!(st.counters.transferred_tokens, 2000);
}

#[test]
fn a_prefill_pod_holds_pulled_blocks_until_told_or_timed_out() {
    let cfg = SimConfig {
        kv_hold_timeout_s: 10.0,
        ..fitted(100, 0)
    };
    let eng = Engine::new(cfg.clone());
    let t0 = Instant::now();
    let prefill = |tag| SeqSpec {
        report_block_ids: true,
        ..spec(tag, 64, 1)
    };
    let mut rx = push(&eng, prefill(1), t0);
    step(&eng, t0);
    let _ = rx.try_recv();
    let Ok(SeqEvent::Finished(o)) = rx.try_recv() else {
        panic!("finished");
    };
    assert_eq!(o.block_ids, vec![0, 1, 2, 3]);
    assert_eq!(eng.lock().used_blocks(&cfg), 4, "held for the decoder");
    assert!(eng.release_held(0));
    assert!(!eng.release_held(0));
    assert_eq!(eng.lock().used_blocks(&cfg), 0);
    // Nobody pulls the second one: freed at the timeout.
    let _rx = push(&eng, prefill(2), t0);
    step(&eng, t0);
    assert_eq!(eng.lock().used_blocks(&cfg), 4);
    let mut st = eng.lock();
    let _ = st.plan(&cfg, t0 + Duration::from_secs(9), None);
    assert_eq!(st.used_blocks(&cfg), 4);
    let _ = st.plan(&cfg, t0 + Duration::from_secs(11), None);
    assert_eq!(st.used_blocks(&cfg), 0);
}

#[tokio::test]
async fn fitted_ttft_is_queueing_plus_step_plus_output_processing() {
    let cfg = fitted(1000, 0);
    let eng = Engine::new(cfg.clone());
    let t0 = Instant::now();
    let mut rx = eng.submit(spec(1, 1000, 2));
    let queued = {
        let mut st = eng.lock();
        let Plan::Idle(Some(q)) = st.plan(&cfg, t0, None) else {
            panic!("queued after α0 + α1·1000");
        };
        q
    };
    let arrival = eng.lock().arriving[0].arrival;
    let alpha = cfg.queueing_time(1000);
    assert!(queued.saturating_duration_since(arrival).abs_diff(alpha) < Duration::from_micros(1));
    let step_end = {
        let mut st = eng.lock();
        let Plan::Step { sim, .. } = st.plan(&cfg, queued, None) else {
            panic!("a step once queued");
        };
        assert_eq!(sim, us(&cfg, 1000, 0));
        let end = queued + sim;
        st.finish_step(&cfg, end);
        end
    };
    // BLIS: TTFT = α0 + α1·in + β0 + β1·in + α2.
    let want = (232.46191091038054 + 1.752360364195244 * 1000.0)
        + (5752.705191348184 + 17.25086436834028 * 1000.0)
        + 3357.4400353290152;
    let ttft = eng.lock().latencies.ttft.sum() * 1e6;
    assert!((ttft - want).abs() < 2.0, "TTFT {ttft} us, want {want}");
    // The token reaches the client α2 after the step, not before.
    let first = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
    assert!(matches!(first, Ok(Some(SeqEvent::Token { index: 0, .. }))));
    assert!(Instant::now() >= step_end + cfg.output_token_time());
    // BLIS: each inter-token latency is the decode step plus α2.
    {
        let mut st = eng.lock();
        let Plan::Step { sim, .. } = st.plan(&cfg, step_end, Some(step_end)) else {
            panic!("the decode step");
        };
        assert_eq!(sim, us(&cfg, 0, 1));
        st.finish_step(&cfg, step_end + sim);
    }
    let itl = eng.lock().latencies.itl.sum() * 1e6;
    let want = 5752.705191348184 + 5.999143920128404 + 3357.4400353290152;
    assert!((itl - want).abs() < 2.0, "ITL {itl} us, want {want}");
}

/// vLLM V1 with `max_loras` 1: a second adapter's request is skipped (a base-model request behind
/// it passes) until the first adapter's requests are done; each load makes its step longer.
#[test]
fn adapters_beyond_max_loras_wait_and_each_load_lengthens_its_step() {
    let cfg = SimConfig {
        max_num_seqs: 8,
        max_loras: 1,
        lora_load_ms: 30.0,
        ..fitted(1000, 0)
    };
    let eng = Engine::new(cfg.clone());
    let t0 = Instant::now();
    let with = |tag, adapter: &str, max_tokens| SeqSpec {
        adapter: Some(adapter.to_string()),
        ..spec(tag, 32, max_tokens)
    };
    let _sql = push(&eng, with(1, "sql", 3), t0);
    let _chat = push(&eng, with(2, "chat", 2), t0);
    let _base = push(&eng, spec(3, 32, 2), t0);
    let load = Duration::from_millis(30);
    // sql and the base request start; chat is one adapter too many. The step loads sql.
    let (took, prefill, _) = step(&eng, t0);
    assert_eq!(prefill, 64);
    assert_eq!(took, us(&cfg, 64, 0) + load);
    {
        let st = eng.lock();
        assert_eq!(st.waiting.len(), 1);
        assert_eq!(st.waiting[0].spec.adapter.as_deref(), Some("chat"));
    }
    let snapshot = eng.snapshot();
    assert_eq!(
        snapshot.waiting_adapters.iter().collect::<Vec<_>>(),
        ["chat"]
    );
    assert_eq!(
        snapshot.running_adapters.iter().collect::<Vec<_>>(),
        ["sql"]
    );
    // sql decodes until done (3 tokens); chat waits, then loads over sql's slot.
    let (took, _, decode) = step(&eng, t0);
    assert_eq!(
        (took, decode),
        (us(&cfg, 0, 2), 2),
        "no load while nothing new runs"
    );
    step(&eng, t0);
    let (took, prefill, _) = step(&eng, t0);
    assert_eq!((took, prefill), (us(&cfg, 32, 0) + load, 32));
    assert_eq!(eng.lock().counters.adapter_loads, 2);
    // A second sql request now reloads it: one slot, and chat holds it.
    let _again = push(&eng, with(4, "sql", 1), t0);
    while eng
        .lock()
        .running
        .iter()
        .any(|s| s.spec.adapter.as_deref() == Some("chat"))
    {
        step(&eng, t0);
    }
    step(&eng, t0);
    assert_eq!(eng.lock().counters.adapter_loads, 3);
}

/// The fitted profile with a host-memory tier of `host` blocks (0 = none).
fn tiered(blocks: usize, host: usize) -> SimConfig {
    SimConfig {
        cpu_offload_blocks: host,
        max_num_seqs: 8,
        ..fitted(blocks, 0)
    }
}

fn finished(rx: &mut mpsc::UnboundedReceiver<SeqEvent>) -> Option<Outcome> {
    while let Ok(e) = rx.try_recv() {
        if let SeqEvent::Finished(o) = e {
            return Some(o);
        }
    }
    None
}

type Rx = mpsc::UnboundedReceiver<SeqEvent>;

/// A (4 blocks) is computed; a long-running decode D holds a seat; B (12 blocks) pushes A's last
/// two blocks out of a 16-block GPU. Then A is asked again (its receiver and D's returned): it hits
/// its first two blocks on the GPU and, with a host tier, finds the third in host memory (the
/// fourth holds its last token, always computed).
fn evict_a_then_ask_again(host: usize) -> (Arc<Engine>, SimConfig, Instant, Rx, Rx) {
    let cfg = tiered(16, host);
    let eng = Engine::new(cfg.clone());
    let t0 = Instant::now();
    let _a = push(&eng, spec(1, 64, 1), t0);
    assert_eq!(step(&eng, t0).1, 64);
    let d = push(&eng, spec(5, 20, 50), t0);
    step(&eng, t0);
    let _b = push(&eng, spec(2, 192, 1), t0);
    assert_eq!(step(&eng, t0), (us(&cfg, 192, 1), 192, 1));
    {
        let st = eng.lock();
        assert_eq!(st.cache.longest_prefix(&spec(1, 64, 1).block_hashes), 2);
        assert_eq!(st.running.len(), 1, "D decodes on");
    }
    let a = push(&eng, spec(1, 64, 1), t0);
    (eng, cfg, t0, a, d)
}

#[test]
fn a_prompt_the_gpu_lost_loads_from_the_host_tier_without_delaying_the_batch() {
    let (eng, cfg, t0, mut a, _d) = evict_a_then_ask_again(100);
    let ttft_before = eng.lock().latencies.ttft.sum();
    let load = cfg.to_wall(cfg.host_load_time(16));
    // A waits for its load (counted as waiting); D's decode step does not wait for it.
    assert_eq!(step(&eng, t0), (us(&cfg, 0, 1), 0, 1));
    {
        let st = eng.lock();
        assert_eq!(st.transferring.len(), 1);
        assert_eq!(st.transferring[0].loading, 16);
        let wake = st.transfer_wake(&cfg).expect("a load in progress");
        assert!(wake.saturating_duration_since(t0).abs_diff(load) < Duration::from_micros(1));
    }
    assert_eq!(eng.snapshot().waiting, 1);
    // Not done at half the load time; at its end A joins and computes only its last block.
    assert_eq!(step(&eng, t0 + load / 2), (us(&cfg, 0, 1), 0, 1));
    let done = t0 + load + Duration::from_micros(1);
    assert_eq!(step(&eng, done), (us(&cfg, 16, 1), 16, 1));
    // TTFT: the load, then one step of 16 tokens, then output processing (α2).
    let ttft = eng.lock().latencies.ttft.sum() - ttft_before;
    let want = (load + us(&cfg, 16, 1) + cfg.output_token_time()).as_secs_f64();
    assert!((ttft - want).abs() < 2e-6, "TTFT {ttft} s, want {want} s");
    let computing = (us(&cfg, 32, 1) + cfg.output_token_time()).as_secs_f64();
    assert!(ttft < computing, "loading beats computing the block");
    let o = finished(&mut a).expect("A finished");
    assert_eq!(o.cached_tokens, 48, "2 GPU blocks + 1 host block");
    let st = eng.lock();
    let c = &st.counters;
    assert_eq!(c.prefix_hits, 32, "the GPU's counter stays GPU-only");
    assert_eq!(c.external_hits, 16);
    // Queried: every prompt less its GPU hit, at first admission (A, D, B, then A again).
    assert_eq!(c.external_queries, 64 + 20 + 192 + 32);
    assert_eq!(c.offload_loaded_bytes, 16 * 131_072);
    // Written through once each: A's 4 blocks, D's 1, B's 12; A's again were already there.
    assert_eq!(c.offload_stored_bytes, 17 * 16 * 131_072);
    assert_eq!(
        st.cache.longest_prefix(&spec(1, 64, 1).block_hashes),
        4,
        "loaded blocks are GPU cache blocks again"
    );
}

#[test]
fn without_a_host_tier_the_lost_blocks_are_computed_as_before() {
    let (eng, cfg, t0, mut a, _d) = evict_a_then_ask_again(0);
    // A is admitted at once and computes its last two blocks alongside D's decode.
    assert_eq!(step(&eng, t0), (us(&cfg, 32, 1), 32, 1));
    assert_eq!(finished(&mut a).expect("A finished").cached_tokens, 32);
    {
        let st = eng.lock();
        let c = &st.counters;
        assert_eq!(c.prefix_hits, 32);
        let offload = (
            c.external_queries,
            c.external_hits,
            c.offload_loaded_bytes,
            c.offload_stored_bytes,
        );
        assert_eq!(offload, (0, 0, 0, 0));
        assert_eq!(st.host.block_count(), 0);
    }
    let page = crate::metrics::render(&cfg, &eng.snapshot());
    assert!(!page.contains("external_prefix") && !page.contains("kv_offload"));
}

#[test]
fn concurrent_host_loads_share_the_host_link_and_reset_empties_the_tier() {
    let cfg = tiered(8, 100);
    let eng = Engine::new(cfg.clone());
    let t0 = Instant::now();
    let _x = push(&eng, spec(1, 64, 1), t0);
    let _y = push(&eng, spec(2, 64, 1), t0);
    step(&eng, t0);
    // Z fills the 8-block GPU: X's and Y's blocks are evicted, host memory keeps them.
    let _z = push(&eng, spec(3, 128, 1), t0);
    step(&eng, t0);
    assert_eq!(
        eng.lock()
            .cache
            .longest_prefix(&spec(1, 64, 1).block_hashes),
        0
    );
    let _x = push(&eng, spec(1, 64, 1), t0);
    let _y = push(&eng, spec(2, 64, 1), t0);
    let one = cfg.to_wall(cfg.host_load_time(48));
    {
        let mut st = eng.lock();
        let Plan::Idle(Some(wake)) = st.plan(&cfg, t0, Some(t0)) else {
            panic!("both wait for their loads");
        };
        // Two 48-token loads at half the host link each end together after twice one load's time.
        let err = wake.saturating_duration_since(t0).abs_diff(one * 2);
        assert!(err < Duration::from_micros(1), "{wake:?} vs {:?}", one * 2);
        assert!(matches!(st.plan(&cfg, t0 + one, None), Plan::Idle(_)));
        let plan = st.plan(&cfg, t0 + one * 2 + Duration::from_micros(1), None);
        assert!(matches!(plan, Plan::Step { .. }));
        assert_eq!(st.running.len(), 2);
        assert_eq!(st.counters.external_hits, 96);
    }
    assert!(eng.host_cached_blocks() > 0);
    eng.reset_cache();
    assert_eq!(
        eng.host_cached_blocks(),
        0,
        "a reset empties host memory too"
    );
}

#[test]
fn the_probe_counts_host_hits_as_a_load_not_a_prefill() {
    for host in [0, 100] {
        let cfg = SimConfig {
            num_gpu_blocks: 8,
            cpu_offload_blocks: host,
            ..SimConfig::default()
        };
        let eng = Engine::new(cfg.clone());
        let t0 = Instant::now();
        let _a = push(&eng, spec(1, 64, 1), t0);
        step(&eng, t0);
        let _b = push(&eng, spec(2, 128, 1), t0);
        step(&eng, t0);
        let a = spec(1, 64, 1).block_hashes;
        let est = eng.probe(64, &a, 1);
        assert_eq!(est.cached_tokens, 0);
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        if host == 0 {
            assert_eq!(est.host_cached_tokens, None);
            let want = ms(cfg.step_time(64, 0));
            assert!((est.estimated_ttft_ms - want).abs() < 1e-9);
        } else {
            // 3 blocks loaded (the last token's block is computed): load, then a 16-token prefill.
            assert_eq!(est.host_cached_tokens, Some(48));
            let want = ms(cfg.host_load_time(48)) + ms(cfg.step_time(16, 0));
            assert!(
                (est.estimated_ttft_ms - want).abs() < 1e-9,
                "{} vs {want}",
                est.estimated_ttft_ms
            );
        }
    }
}

/// vLLM V1 caches a request's blocks when it schedules them, so requests for the same prompt
/// admitted in one step compute it once: the first the whole prompt, the others only what no
/// full block covers (a restart's queue of one tenant's requests is one recompute, not four).
#[test]
fn requests_for_a_prompt_admitted_together_compute_it_once() {
    let cfg = SimConfig::default();
    assert_eq!(cfg.chunked_prefill_tokens, 0, "whole prompts, one step");
    let eng = Engine::new(cfg.clone());
    let t0 = Instant::now();
    let mut rx: Vec<_> = (0..3).map(|_| push(&eng, spec(1, 160, 1), t0)).collect();
    // 160 tokens for the first; 9 of the others' 10 blocks hit (the last token is always
    // computed, so its block cannot), 16 tokens each.
    let (_, prefill, _) = step(&eng, t0);
    assert_eq!(prefill, 160 + 16 + 16);
    let cached: Vec<usize> = rx
        .iter_mut()
        .map(|r| finished(r).expect("finished").cached_tokens)
        .collect();
    assert_eq!(cached, vec![0, 144, 144]);
    assert_eq!(eng.lock().counters.prefix_hits, 288);
}

/// A restart ends the process: the request mid-prefill ends with no outcome (its client sees the
/// engine stop), its blocks in use go with the rest of the cache, and the engine takes new work at
/// once rather than after the dead step would have ended.
#[tokio::test]
async fn a_restart_ends_the_requests_in_flight_and_empties_the_whole_cache() {
    let cfg = SimConfig {
        // A 1,600-token prefill takes 20 wall seconds.
        prefill_us_per_token: 12_500.0,
        ..SimConfig::default()
    };
    let eng = Engine::new(cfg);
    let loop_task = tokio::spawn(eng.clone().run());
    let mut long = eng.submit(spec(1, 1600, 4));
    let started = Instant::now();
    while eng.lock().cache.pinned_len() == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "never scheduled"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eng.restart();
    assert_eq!(eng.cached_blocks(), 0, "blocks in use go too");
    let ended = tokio::time::timeout(Duration::from_secs(2), long.recv()).await;
    assert!(
        matches!(ended, Ok(None)),
        "ends without an outcome: {ended:?}"
    );
    let mut short = eng.submit(spec(2, 16, 1));
    let first = tokio::time::timeout(Duration::from_secs(2), short.recv()).await;
    assert!(
        matches!(first, Ok(Some(SeqEvent::Token { index: 0, .. }))),
        "served at once after the restart: {first:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    loop_task.abort();
}
