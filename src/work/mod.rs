//! Work in flight per pod: what each pod has to do before a new request's first token.
//!
//! * `board.rs` — the work board every VM of one Envoy shares (key `kvroute.inflight`): one row per
//!   VM of its unfinished requests and queued prefill tokens per pod;
//! * `book.rs` — this VM's side of it: its requests in flight and its prefills not yet at their
//!   first byte (what its row carries), and the other VMs' rows as last read. Its hooks: a request
//!   routed (`inflight_start`, `prefill_start`), its first byte (`prefill_done`), its end
//!   (`inflight_end`), and the VM's tick (`expire_prefills`, `own_work`, `set_others_work`);
//! * `row.rs` — this VM's row on the board in shared data ([`WorkRow`]): read before a request is
//!   planned, written back with it, and rewritten by the VM's tick when due.

mod board;
mod book;
mod row;

pub use board::*;
#[cfg(test)]
pub use book::MAX_PENDING;
pub use book::{FirstToken, WorkBook, DEFAULT_TYPICAL_TOKENS};
pub use row::{put_board_row, read_board, WorkRow, ROW_TTL_MS};
