//! A gateway on the fake host, for the targets that go on to *use* what they decoded: VMs of one
//! Envoy sharing one store, whose leader has polled every pod (answered with a vLLM page) and read
//! the admin API (answered with every configured cluster's members), so requests are routed.

use kvroute::config::Config;
use kvroute::flow::{BodyOutcome, HeadersOutcome, RequestFlow};
use kvroute::port::Host;
use kvroute::testing::{FakeHost, Store};
use kvroute::vm::Vm;
use std::cell::RefCell;
use std::rc::Rc;

pub const PODS: [&str; 3] = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"];

/// The members the fake admin API lists for every cluster a pool names.
pub const CLUSTER_MEMBERS: [&str; 2] = ["10.0.1.1:8000", "10.0.1.2:8000"];

/// A vLLM page; with a model, every sample carries it (the pod serves only that model), without,
/// the pod serves any.
pub fn vllm_page(waiting: u32, model: Option<&str>) -> Vec<u8> {
    let labels = model.map_or("engine=\"0\"".to_string(), |m| {
        format!("model_name=\"{m}\"")
    });
    format!(
        "vllm:num_requests_waiting{{{labels}}} {waiting}\n\
         vllm:num_requests_running{{{labels}}} 1\n\
         vllm:kv_cache_usage_perc{{{labels}}} 0.25\n\
         vllm:cache_config_info{{block_size=\"16\",num_gpu_blocks=\"4096\"}} 1.0\n"
    )
    .into_bytes()
}

fn admin_answer(config: &Config) -> Vec<u8> {
    let hosts: Vec<serde_json::Value> = CLUSTER_MEMBERS
        .iter()
        .filter_map(|m| m.rsplit_once(':'))
        .map(|(ip, port)| {
            serde_json::json!({"address": {"socket_address": {"address": ip, "port_value": port.parse::<u16>().unwrap_or(1)}},
                               "health_status": {"eds_health_status": "HEALTHY"}})
        })
        .collect();
    let clusters: Vec<serde_json::Value> = config
        .pools
        .iter()
        .filter_map(|p| match &p.members {
            kvroute::config::Members::Cluster(c) => Some(c),
            kvroute::config::Members::Static(_) => None,
        })
        .map(|c| serde_json::json!({"name": c, "host_statuses": hosts}))
        .collect();
    serde_json::json!({ "cluster_statuses": clusters })
        .to_string()
        .into_bytes()
}

pub fn aggregated_config() -> Config {
    let json = format!(
        r#"{{"pools":[{{"name":"p","endpoints":["{}","{}","{}"]}}]}}"#,
        PODS[0], PODS[1], PODS[2]
    );
    Config::parse(json.as_bytes()).expect("the fuzz harness's configuration is valid")
}

/// [`aggregated_config`] that passes on bodies its strict parse refuses
/// (`passthrough_unparseable_bodies`).
pub fn passthrough_config() -> Config {
    let json = format!(
        r#"{{"pools":[{{"name":"p","endpoints":["{}","{}","{}"]}}],
            "passthrough_unparseable_bodies":true}}"#,
        PODS[0], PODS[1], PODS[2]
    );
    Config::parse(json.as_bytes()).expect("the fuzz harness's configuration is valid")
}

pub fn inline_pd_config() -> Config {
    let json = format!(
        r#"{{"pools":[{{"name":"p","role":"prefill","endpoints":["{}"]}},
                      {{"name":"d","role":"decode","endpoints":["{}","{}"]}}],
            "pd":{{"mode":"inline","split_overhead_ms":0}}}}"#,
        PODS[0], PODS[1], PODS[2]
    );
    Config::parse(json.as_bytes()).expect("the fuzz harness's configuration is valid")
}

pub struct Gateway {
    pub store: Rc<RefCell<Store>>,
    pub vms: Vec<(Vm, FakeHost)>,
}

impl Gateway {
    pub fn new(config: &Config, vms: usize) -> Gateway {
        let store = Rc::new(RefCell::new(Store::default()));
        let vms = (0..vms)
            .map(|i| {
                (
                    Vm::new(config.clone(), None, 0x1000 + i as u64),
                    FakeHost::new(&store),
                )
            })
            .collect();
        Gateway { store, vms }
    }

    /// A gateway whose leader (VM 0) has polled: requests get routed.
    pub fn ready(config: &Config, vms: usize) -> Gateway {
        let mut g = Gateway::new(config, vms);
        for _ in 0..4 {
            g.tick();
            // Configurations may ask for any interval: the clock moves by at most a second.
            let step = config.poll_interval_ms.clamp(1, 1000);
            g.advance_ms(step);
        }
        g
    }

    /// Every VM ticks; the leader's calls are answered at once.
    pub fn tick(&mut self) {
        for (vm, host) in &mut self.vms {
            let now = host.now_ms();
            vm.tick(host, now);
            for (token, call) in host.take_calls() {
                // The first pod serves only `m`, the others any model.
                let body = if call.path == "/metrics" {
                    let model = (call.authority == PODS[0]).then_some("m");
                    vllm_page(token % 3, model)
                } else {
                    admin_answer(&vm.config)
                };
                vm.on_call_response(host, token, 200, &body, now);
            }
        }
    }

    pub fn advance_ms(&mut self, ms: u64) {
        for (_, host) in &mut self.vms {
            host.advance_ms(ms);
        }
    }

    /// One request through VM `i`: headers, then `body`; a routed request gets `response` back as
    /// its pod's answer (and as the inline prefill pod's), then ends. After a `0xfe` in
    /// `response` come what the proxy says of the last upstream attempt at the end (the pod's
    /// address, a newline, the response details); without one, the primary pod and
    /// `via_upstream`. Returns the body outcome.
    pub fn request(&mut self, i: usize, path: &str, body: &[u8], response: &[u8]) -> BodyOutcome {
        let (response, end) = match response.iter().position(|b| *b == 0xfe) {
            Some(at) => {
                let meta = String::from_utf8_lossy(&response[at + 1..]).into_owned();
                let (upstream, details) = meta.split_once('\n').unwrap_or((&meta, ""));
                (
                    &response[..at],
                    Some((upstream.to_string(), details.to_string())),
                )
            }
            None => (response, None),
        };
        let Some((vm, host)) = self.vms.get_mut(i) else {
            return BodyOutcome::Continue;
        };
        let mut flow = RequestFlow::new();
        let length = body.len().to_string();
        let header = |name: &str| match name {
            ":method" => Some("POST".to_string()),
            ":path" => Some(path.to_string()),
            "content-length" => Some(length.clone()),
            _ => None,
        };
        if flow.on_request_headers(vm, host, &header, false) != HeadersOutcome::WaitForBody {
            return BodyOutcome::Continue;
        }
        let outcome = flow.on_request_body(vm, host, Some(body));
        let (mut upstream, mut details) = (None, None);
        if let BodyOutcome::Route(route) = &outcome {
            (upstream, details) = match end {
                Some((u, d)) => (Some(u), Some(d)),
                None => (
                    route.destinations.split(',').next().map(str::to_string),
                    Some("via_upstream".to_string()),
                ),
            };
            if route.prefill_call.is_some() {
                let _ = flow.on_prefill_answer(vm, host, 200, response);
            }
            let _ = flow.on_response_headers(vm, host, Some("200"), false);
            host.advance_ms(5);
            // The answer in two chunks, so `usage` split across them is read too.
            let (a, b) = response.split_at(response.len() / 2);
            for (chunk, last) in [(a, false), (b, true)] {
                let bytes = flow.wants_response_bytes().then_some(chunk);
                flow.on_response_body(vm, host, chunk.len(), bytes, last);
            }
        }
        let (upstream, details) = if flow.wants_end() {
            (upstream, details)
        } else {
            (None, None)
        };
        flow.on_done(vm, host, upstream, details);
        outcome
    }

    /// Every VM's own unfinished work once no request is open: must be none.
    pub fn leftover_work(&mut self) -> usize {
        self.vms
            .iter_mut()
            .map(|(vm, _)| vm.router.work.own_work().len())
            .sum()
    }

    pub fn now_ms(&self) -> u64 {
        self.vms.first().map_or(0, |(_, h)| h.now_ms())
    }
}
