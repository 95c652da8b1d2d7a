//! This VM's rows on the shared boards: work in flight (read before a request is planned, written
//! back with it) and learned pod costs (fits), each rewritten when due.

use super::*;

/// The work board and its compare-and-swap token (empty when absent or another version's).
pub(super) fn read_board(host: &dyn Host) -> (Board, Option<u32>) {
    let (bytes, cas) = host.shared_get(INFLIGHT_KEY);
    (bytes.map(|b| Board::decode(&b)).unwrap_or_default(), cas)
}

/// Replaces row `row` of the work board by compare-and-swap, at most `INFLIGHT_CAS_ATTEMPTS`
/// times: the first attempt on `read` when given (the board as read earlier in the same callback),
/// the others on a fresh read, which `on_read` sees. Whether the write went through.
pub(super) fn put_board_row(
    host: &mut dyn Host,
    row: u64,
    now: u64,
    entries: &[(String, PodWork)],
    mut read: Option<(Board, Option<u32>)>,
    mut on_read: impl FnMut(&Board),
) -> bool {
    for _ in 0..INFLIGHT_CAS_ATTEMPTS {
        let (mut board, cas) = match read.take() {
            Some(read) => read,
            None => {
                let (board, cas) = read_board(host);
                on_read(&board);
                (board, cas)
            }
        };
        board.put_row(row, now, entries, INFLIGHT_ROW_TTL_MS);
        if host.shared_set(INFLIGHT_KEY, &board.encode(), cas).is_ok() {
            return true;
        }
    }
    false
}

impl Vm {
    /// Reads the board (one shared-data read) and adopts the other VMs' unfinished work; returns
    /// the board and its compare-and-swap token for a write.
    pub fn read_inflight_board(&mut self, host: &mut dyn Host, now: u64) -> (Board, Option<u32>) {
        let (board, cas) = read_board(host);
        if self
            .router
            .work
            .set_others_work(board.others(self.id, now, INFLIGHT_ROW_TTL_MS), now)
        {
            self.row_write_pending = true;
        }
        (board, cas)
    }

    /// Adopts the other VMs' cost fits when the key changed, and publishes this VM's own at most
    /// once per heartbeat.
    pub(super) fn sync_fits(&mut self, host: &mut dyn Host, now: u64) {
        let (bytes, cas) = host.shared_get(FITS_KEY);
        if cas != self.fits_cas {
            let board = bytes.as_deref().map(FitBoard::decode).unwrap_or_default();
            self.router
                .costs
                .set_others_fits(board.others(self.id, now, FITS_ROW_TTL_MS));
            self.fits_cas = cas;
        }
        if now.saturating_sub(self.last_fits_write_ms) < FITS_HEARTBEAT_MS {
            return;
        }
        let own = self.router.costs.own_fits();
        if own.is_empty() {
            return;
        }
        let mut board = bytes.as_deref().map(FitBoard::decode).unwrap_or_default();
        board.put_row(self.id, now, own, FITS_ROW_TTL_MS);
        // One attempt: a lost race is retried on the next tick.
        if host.shared_set(FITS_KEY, &board.encode(), cas).is_ok() {
            self.last_fits_write_ms = now;
        }
    }

    /// Rewrites this VM's row on the in-flight board (and re-reads the others on the way). The key's
    /// first insert is not guarded by compare-and-swap; two VMs racing on it lose one row until that
    /// VM's next write, at most a heartbeat later.
    pub fn write_inflight_row(&mut self, host: &mut dyn Host, now: u64) {
        self.write_inflight_row_over(host, now, None);
    }

    /// [`Self::write_inflight_row`], its first compare-and-swap on a board this VM read earlier in
    /// the same callback ([`Self::read_inflight_board`]): one shared-data read per routed request
    /// instead of two. Nothing runs on this VM's thread in between, so only another VM's write can
    /// make that attempt lose; the next ones read afresh.
    pub fn write_inflight_row_over(
        &mut self,
        host: &mut dyn Host,
        now: u64,
        read: Option<(Board, Option<u32>)>,
    ) {
        let own = self.router.work.own_work();
        let (id, router) = (self.id, &mut self.router);
        // A re-read that moves this VM's own prefills on leaves the row just written behind.
        let mut moved = false;
        let written = put_board_row(host, id, now, &own, read, |board| {
            moved |= router
                .work
                .set_others_work(board.others(id, now, INFLIGHT_ROW_TTL_MS), now);
        });
        if written {
            self.last_row_write_ms = now;
        }
        self.row_write_pending = !written || moved;
    }
}
