//! This VM's row on the work board: read before a request is planned (adopting the other VMs'
//! work), written back with it, and rewritten by the VM's tick when due — at least once per
//! heartbeat, so readers can tell a silent VM from an idle one, and after a lost race.

use super::{Board, PodWork, WorkBook};
use crate::port::Host;
use crate::state::INFLIGHT_KEY;

/// A VM rewrites its row at least this often, so readers can tell it is alive.
pub const HEARTBEAT_MS: u64 = 1000;
/// Rows not rewritten for this long belong to a VM that is gone; its requests stop counting.
pub const ROW_TTL_MS: u64 = 3 * HEARTBEAT_MS;
/// Compare-and-swap attempts per row write; a write that loses them all is retried on the next tick.
const CAS_ATTEMPTS: usize = 4;

/// The work board and its compare-and-swap token (empty when absent or another version's).
pub fn read_board(host: &dyn Host) -> (Board, Option<u32>) {
    let (bytes, cas) = host.shared_get(INFLIGHT_KEY);
    (bytes.map(|b| Board::decode(&b)).unwrap_or_default(), cas)
}

/// Replaces row `row` of the work board by compare-and-swap, at most `CAS_ATTEMPTS` times: the
/// first attempt on `read` when given (the board as read earlier in the same callback), the others
/// on a fresh read, which `on_read` sees. Whether the write went through.
pub fn put_board_row(
    host: &mut dyn Host,
    row: u64,
    now: u64,
    entries: &[(String, PodWork)],
    mut read: Option<(Board, Option<u32>)>,
    mut on_read: impl FnMut(&Board),
) -> bool {
    for _ in 0..CAS_ATTEMPTS {
        let (mut board, cas) = match read.take() {
            Some(read) => read,
            None => {
                let (board, cas) = read_board(host);
                on_read(&board);
                (board, cas)
            }
        };
        board.put_row(row, now, entries, ROW_TTL_MS);
        if host.shared_set(INFLIGHT_KEY, &board.encode(), cas).is_ok() {
            return true;
        }
    }
    false
}

/// When this VM's row was last written and whether it is due again.
#[derive(Debug, Default)]
pub struct WorkRow {
    last_write_ms: u64,
    /// The last write lost every compare-and-swap, or a re-read moved this VM's prefills on: the
    /// next tick writes again.
    pending: bool,
}

impl WorkRow {
    /// Reads the board (one shared-data read) and adopts the other VMs' unfinished work; returns
    /// the board and its compare-and-swap token for a write.
    pub fn read(
        &mut self,
        work: &mut WorkBook,
        host: &dyn Host,
        vm: u64,
        now: u64,
    ) -> (Board, Option<u32>) {
        let (board, cas) = read_board(host);
        if work.set_others_work(board.others(vm, now, ROW_TTL_MS), now) {
            self.pending = true;
        }
        (board, cas)
    }

    /// Rewrites this VM's row (and re-reads the others on the way), its first compare-and-swap on
    /// `read` when given: a board this VM read earlier in the same callback ([`Self::read`]), one
    /// shared-data read per routed request instead of two. Nothing runs on this VM's thread in
    /// between, so only another VM's write can make that attempt lose; the next ones read afresh.
    /// The key's first insert is not guarded by compare-and-swap; two VMs racing on it lose one row
    /// until that VM's next write, at most a heartbeat later.
    pub fn write(
        &mut self,
        work: &mut WorkBook,
        host: &mut dyn Host,
        vm: u64,
        now: u64,
        read: Option<(Board, Option<u32>)>,
    ) {
        let own = work.own_work();
        // A re-read that moves this VM's own prefills on leaves the row just written behind.
        let mut moved = false;
        let written = put_board_row(host, vm, now, &own, read, |board| {
            moved |= work.set_others_work(board.others(vm, now, ROW_TTL_MS), now);
        });
        if written {
            self.last_write_ms = now;
        }
        self.pending = !written || moved;
    }

    /// The tick's step: prefills that never reached their first byte expire, and the row is
    /// rewritten when that changed it, when the last write did not go through, or at the heartbeat.
    pub fn follow(&mut self, work: &mut WorkBook, host: &mut dyn Host, vm: u64, now: u64) {
        let expired = work.expire_prefills(now);
        if expired || self.pending || now.saturating_sub(self.last_write_ms) >= HEARTBEAT_MS {
            self.write(work, host, vm, now, None);
        }
    }
}
