//! Work in flight per pod: what each pod has to do before a new request's first token.
//!
//! * `board.rs` — the work board every VM of one Envoy shares (key `kvroute.inflight`): one row per
//!   VM of its unfinished requests and queued prefill tokens per pod;
//! * `book.rs` — this VM's side of it: its requests in flight and its prefills not yet at their
//!   first byte (what its row carries), and the other VMs' rows as last read. Its hooks: a request
//!   routed (`inflight_start`, `prefill_start`), its first byte (`prefill_done`), its end
//!   (`inflight_end`), and the VM's tick (`expire_prefills`, `own_work`, `set_others_work`).

mod board;
mod book;

pub use board::*;
#[cfg(test)]
pub use book::MAX_PENDING;
pub use book::{FirstToken, WorkBook, DEFAULT_TYPICAL_TOKENS};
