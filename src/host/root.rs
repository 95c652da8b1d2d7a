//! The root context of each VM: configuration, and the tick and call answers that drive the VM's
//! state machine (`crate::vm`).

use super::filter::Filter;
use super::node::Node;
use super::ProxyHost;
use crate::affinity::Tokenizer;
use crate::common::BlockScheme;
use crate::config::Config;
use crate::metrics::{self, Gauge};
use crate::port::Host;
use crate::vm::Vm;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType};
use std::cell::RefCell;
use std::hash::{BuildHasher, Hasher};
use std::rc::Rc;
use std::time::Duration;

/// A VM identity unlikely to collide: the standard library seeds its hasher from WASI random_get.
fn random_u64(now_ms: u64) -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(now_ms);
    h.finish()
}

pub struct Root {
    id: u32,
    node: Option<Rc<RefCell<Node>>>,
}

impl Root {
    pub fn new(id: u32) -> Root {
        Root { id, node: None }
    }
}

impl Context for Root {
    fn on_http_call_response(
        &mut self,
        token_id: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        let (status, body) = super::call_response(body_size);
        if let Some(Ok(mut node)) = self.node.as_ref().map(|n| n.try_borrow_mut()) {
            let Node { vm, host } = &mut *node;
            let now = host.now_ms();
            vm.on_call_response(host, token_id, status, &body, now);
        }
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes =
            super::abi::buffer(BufferType::PluginConfiguration, 0, usize::MAX).unwrap_or_default();
        let config = match Config::parse(&bytes) {
            Ok(c) => c,
            Err(e) => {
                log::error!("{e}");
                return false;
            }
        };
        let tokenizer = match build_tokenizer(&config) {
            Ok(t) => t,
            Err(e) => {
                log::error!("kvroute: {e}");
                return false;
            }
        };
        // Held requests are released on the tick (`super::held`): with flow control on it comes
        // at least every 20 ms, so a freed slot waits at most that long for the next request.
        let max_tick_ms = if config.flow_control.is_some() {
            20
        } else {
            100
        };
        let tick = Duration::from_millis((config.poll_interval_ms / 2).clamp(10, max_tick_ms));
        if hostcalls::set_tick_period(tick).is_err() {
            log::warn!("kvroute: the host refused a tick period");
        }
        log::info!(
            "kvroute: configured with {} pool(s), poll every {} ms",
            config.pools.len(),
            config.poll_interval_ms
        );
        let mut host = ProxyHost::new();
        host.gauge_in(
            Gauge::BuildInfo,
            &[(metrics::VERSION, env!("CARGO_PKG_VERSION"))],
            1,
        );
        let id = random_u64(host.now_ms());
        self.node = Some(Rc::new(RefCell::new(Node {
            vm: Vm::new(config, tokenizer, id),
            host,
        })));
        true
    }

    fn on_tick(&mut self) {
        let Some(node) = self.node.as_ref() else {
            return;
        };
        if let Ok(mut node) = node.try_borrow_mut() {
            let Node { vm, host } = &mut *node;
            if !vm.config.pools.is_empty() {
                let now = host.now_ms();
                vm.tick(host, now);
            }
        }
        // Other workers' completions show on the board this tick read.
        super::held::release(node, self.id);
    }

    fn on_queue_ready(&mut self, _queue_id: u32) {
        // Drained on the next tick; draining here too would only split the same work.
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        // Never None (the SDK would panic): without a valid configuration the filter still strips
        // spoofed routing headers and passes everything through.
        let filter = Filter::new(self.node.clone(), context_id);
        Some(Box::new(super::held::SharedFilter::new(filter, context_id)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// The tokenizer `block.mode` asks for (none in chars mode; a build without tiktoken has no such
/// scheme, its configuration refused it).
fn build_tokenizer(config: &Config) -> Result<Option<Box<dyn Tokenizer>>, String> {
    match config.block.scheme {
        BlockScheme::Chars => Ok(None),
        #[cfg(feature = "tiktoken")]
        BlockScheme::Tiktoken(encoding) => {
            crate::affinity::tokenize::Tiktoken::new(encoding.name())
                .map(|t| Some(Box::new(t) as Box<dyn Tokenizer>))
        }
    }
}
