//! Flow control's host side (`crate::admission`, `crate::flow::next_release`): a held request's
//! filter stays reachable from the rest of its VM, and the tick's release loop resumes or answers
//! held requests.
//!
//! The SDK owns each HTTP context's box, so the filter lives behind an `Rc` ([`SharedFilter`], the
//! box the SDK gets) and this VM's [`PARKED`] map keeps a weak handle to each held one. To release
//! one, the loop points the host's calls at its stream (`proxy_set_effective_context`, which the
//! ABI provides for exactly this), plans it again with its buffered body and resumes it, then
//! points the calls back at the root context whose tick it runs in. A stream that ended is gone
//! from the SDK, so its weak handle is dead and its queue entry is dropped.
//!
//! Releases run on the tick only (every 20 ms or less with flow control on, `super::root`), never
//! inside another stream's callback: a local reply sent there for a held request (a timeout, or a
//! refusal its new plan gives) raises the VM's stop-next-iteration flag, and Envoy then turns the
//! *current* stream's `Continue` into a stop — that stream stalls for good (released from response
//! callbacks, `make bench-overload` saw 1–4 requests per seed never answered and streams cut before
//! `[DONE]`). The tick is a root callback with no stream to stop.

use super::filter::{send, Filter};
use super::node::Node;
use crate::flow::{next_release, Release};
use hashbrown::HashMap;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use std::cell::RefCell;
use std::rc::{Rc, Weak};

thread_local! {
    /// This VM's held filters, by context id (a VM is one thread).
    static PARKED: RefCell<HashMap<u32, Weak<RefCell<Filter>>>> = RefCell::new(HashMap::new());
}

fn park(context_id: u32, filter: &Rc<RefCell<Filter>>) {
    PARKED.with(|p| p.borrow_mut().insert(context_id, Rc::downgrade(filter)));
}

fn unpark(context_id: u32) -> Option<Rc<RefCell<Filter>>> {
    PARKED
        .with(|p| p.borrow_mut().remove(&context_id))?
        .upgrade()
}

fn parked(context_id: u32) -> Option<Rc<RefCell<Filter>>> {
    PARKED.with(|p| p.borrow().get(&context_id).and_then(Weak::upgrade))
}

/// Releases what flow control lets go now, in its order; then the host's calls act on `caller`
/// again (the root context whose tick this runs in).
pub fn release(node: &Rc<RefCell<Node>>, caller: u32) {
    let mut redirected = false;
    loop {
        let step = {
            let Ok(mut node) = node.try_borrow_mut() else {
                break;
            };
            let Node { vm, host } = &mut *node;
            if vm.held.is_empty() {
                break;
            }
            let now = crate::port::Host::now_ms(host);
            next_release(vm, host, now)
        };
        match step {
            None => break,
            Some(Release::Expire(id, reply)) => {
                unpark(id);
                redirected = true;
                if super::abi::set_effective_context(id) {
                    send(&reply);
                }
            }
            Some(Release::Plan(id)) => {
                let filter = parked(id);
                redirected = true;
                let Some(filter) = filter.filter(|_| super::abi::set_effective_context(id)) else {
                    // Its stream ended without this VM hearing of it: forget it.
                    unpark(id);
                    if let Ok(mut node) = node.try_borrow_mut() {
                        node.vm.held.remove(id);
                    }
                    continue;
                };
                let Ok(mut filter) = filter.try_borrow_mut() else {
                    break;
                };
                if !filter.release() {
                    break; // still full: it stays at the head
                }
                drop(filter);
                unpark(id);
            }
        }
    }
    if redirected && !super::abi::set_effective_context(caller) {
        log::warn!("kvroute: could not point host calls back at context {caller}");
    }
}

/// The box the SDK owns for each HTTP context: the filter, reachable from the rest of the VM while
/// flow control holds its request.
pub struct SharedFilter {
    id: u32,
    filter: Rc<RefCell<Filter>>,
}

impl SharedFilter {
    pub fn new(filter: Filter, id: u32) -> SharedFilter {
        SharedFilter {
            id,
            filter: Rc::new(RefCell::new(filter)),
        }
    }

    /// Runs `callback` on the filter; parks it if the callback left its request held.
    fn on<T: Default>(&self, callback: impl FnOnce(&mut Filter) -> T) -> T {
        let Ok(mut filter) = self.filter.try_borrow_mut() else {
            return T::default();
        };
        let out = callback(&mut filter);
        if filter.is_held() {
            park(self.id, &self.filter);
        }
        out
    }
}

impl Context for SharedFilter {
    fn on_http_call_response(&mut self, token: u32, headers: usize, body: usize, trailers: usize) {
        self.on(|f| {
            f.on_http_call_response(token, headers, body, trailers);
        });
    }
}

/// `Action::Continue` where the filter could not be reached (never: one thread, no re-entry).
#[derive(Default)]
struct Act(Option<Action>);

impl Act {
    fn action(self) -> Action {
        self.0.unwrap_or(Action::Continue)
    }
}

impl HttpContext for SharedFilter {
    fn on_http_request_headers(&mut self, n: usize, end_of_stream: bool) -> Action {
        self.on(|f| Act(Some(f.on_http_request_headers(n, end_of_stream))))
            .action()
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        self.on(|f| Act(Some(f.on_http_request_body(size, end_of_stream))))
            .action()
    }

    fn on_http_request_trailers(&mut self, n: usize) -> Action {
        self.on(|f| Act(Some(f.on_http_request_trailers(n))))
            .action()
    }

    fn on_http_response_headers(&mut self, n: usize, end_of_stream: bool) -> Action {
        self.on(|f| Act(Some(f.on_http_response_headers(n, end_of_stream))))
            .action()
    }

    fn on_http_response_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        self.on(|f| Act(Some(f.on_http_response_body(size, end_of_stream))))
            .action()
    }

    fn on_log(&mut self) {
        self.on(HttpContext::on_log);
        // Last: a request answered while held (timed out) still reads as held, and `on` parks it.
        unpark(self.id);
    }
}
