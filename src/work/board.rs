//! The work board (key `kvroute.inflight`): every VM's unfinished requests per pod, and the prefill
//! work among them, in one shared-data key.
//!
//! Why a board and not reports to the leader: the predictor and the overload guard must see the
//! requests other worker VMs sent a moment ago. A burst on one hot prefix arrives within
//! milliseconds, far inside one leader tick, and with per-VM counts alone each VM sent its share of
//! the burst to the prefix holder before anyone saw the pile-up. Each VM owns one row and rewrites it
//! (compare-and-swap on the whole key) whenever its counts change and at least every heartbeat.
//! Readers sum the other rows written within a time to live: a VM that crashed or was replaced stops
//! refreshing its row, and its requests stop counting.
//!
//! Work, not only counts: each entry also carries the uncached prompt tokens of the VM's requests to
//! that pod that have not yet produced their first response byte (their prefill is still queued or
//! running) and how many requests those are. That is the queue term of the TTFT prediction
//! (`crate::scheduler`): the gateway routed that work, so it knows it a poll interval before the
//! pod's metrics do, and in tokens rather than requests.
//!
//! The head of that queue: the oldest of those prefills (when it was routed, or when the one before
//! it on that pod ended, whichever is later) and its tokens. A pod has been working on its head
//! since then, so part of the head is already computed; the predictor discounts it
//! (`crate::scheduler::predict::head_progress`) instead of counting a prefill that is nearly done as
//! wholly ahead. Summing rows keeps the earliest head. "The one before it" may be another VM's: a
//! VM that sees another's prefill on a pod end moves its own there on (`super::WorkBook::set_others_work`),
//! so the earliest head is never one that has been waiting behind another VM's.
//!
//! Rows of another gateway replica: its leader's summary of its own work, written by this Envoy's
//! leader when it pulls the replica's placements (`crate::peers`), under an id with the top bit
//! set (a VM's id never has it). Every VM counts them like another VM's row, so the queue term
//! sees what the other replica queued a pull later instead of a pod poll later, in tokens.
//!
//! Encoding: a format line `kvroute-board/3`, then one row per line: `<vm id hex> <written ms>
//! <addr>=<inflight>/<prefill tokens>/<prefill requests>/<head since ms>/<head tokens> ...`. A value without the format line (a
//! module of another version writing the same key during a rolling update) decodes as empty;
//! decoding skips lines and entries it does not understand, so a foreign or truncated value costs
//! counts, never a panic. The key stays bounded: one row per live VM, one entry per pod with
//! requests in flight.
//!
//! Cost: each routed request reads the key once and rewrites it twice (start and end), decoding
//! every row each time, and all VMs' writes contend on the one key. At a handful of workers that is
//! a few host calls per request (`make bench-overhead` measured 15–70 µs); at dozens of workers with
//! hundreds of pods, per-VM keys would remove the contention.

use crate::state::rows::{Entry, RowBoard};
use hashbrown::HashMap;

/// The format line every board value starts with.
const FORMAT: &str = "kvroute-board/3";

/// One VM's unfinished work on one pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PodWork {
    /// Requests sent and not finished.
    pub inflight: u32,
    /// Uncached prompt tokens of those still waiting for their first byte.
    pub prefill_tokens: u64,
    /// How many requests those tokens belong to.
    pub prefill_requests: u32,
    /// The oldest of those prefills: since when the pod has been working on it (ms, the proxy's
    /// clock), and its uncached tokens. Zero when there is none.
    pub head_since_ms: u64,
    pub head_tokens: u64,
}

impl PodWork {
    fn is_empty(&self) -> bool {
        *self == PodWork::default()
    }

    fn add(&mut self, other: &PodWork) {
        self.inflight = self.inflight.saturating_add(other.inflight);
        self.prefill_tokens = self.prefill_tokens.saturating_add(other.prefill_tokens);
        self.prefill_requests = self.prefill_requests.saturating_add(other.prefill_requests);
        self.add_head(other.head_since_ms, other.head_tokens);
    }

    /// Counts a prefill of `tokens` in progress since `since_ms` as the head if it is the oldest.
    pub fn add_head(&mut self, since_ms: u64, tokens: u64) {
        if tokens > 0 && (self.head_tokens == 0 || since_ms < self.head_since_ms) {
            self.head_since_ms = since_ms;
            self.head_tokens = tokens;
        }
    }
}

/// One pod's entry in a VM's row.
pub type WorkEntry = (String, PodWork);

impl Entry for WorkEntry {
    const FORMAT: &'static str = FORMAT;

    fn write(&self, out: &mut String) {
        use std::fmt::Write as _;
        let (addr, w) = self;
        let _ = write!(
            out,
            "{addr}={}/{}/{}/{}/{}",
            w.inflight, w.prefill_tokens, w.prefill_requests, w.head_since_ms, w.head_tokens
        );
    }

    fn parse(field: &str) -> Option<Self> {
        let (addr, value) = field.rsplit_once('=')?;
        let mut parts = value.split('/');
        let work = PodWork {
            inflight: parts.next()?.parse().ok()?,
            prefill_tokens: parts.next()?.parse().ok()?,
            prefill_requests: parts.next()?.parse().ok()?,
            head_since_ms: parts.next()?.parse().ok()?,
            head_tokens: parts.next()?.parse().ok()?,
        };
        parts.next().is_none().then(|| (addr.to_string(), work))
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Board(RowBoard<WorkEntry>);

impl Board {
    pub fn decode(bytes: &[u8]) -> Board {
        Board(RowBoard::decode(bytes))
    }

    pub fn encode(&self) -> Vec<u8> {
        self.0.encode()
    }

    /// Replaces `vm`'s row with `counts` (empty entries left out) and drops rows older than
    /// `ttl_ms`.
    pub fn put_row(&mut self, vm: u64, now_ms: u64, counts: &[WorkEntry], ttl_ms: u64) {
        let entries = counts.iter().filter(|(_, w)| !w.is_empty()).cloned();
        self.0.put_row(vm, now_ms, entries.collect(), ttl_ms);
    }

    /// Work per pod from every VM but `vm`, counting rows younger than `ttl_ms`.
    pub fn others(&self, vm: u64, now_ms: u64, ttl_ms: u64) -> HashMap<String, PodWork> {
        self.sum_where(now_ms, ttl_ms, |id| id != vm)
    }

    /// Work per pod from the rows younger than `ttl_ms` whose id `keep` accepts.
    pub fn sum_where(
        &self,
        now_ms: u64,
        ttl_ms: u64,
        keep: impl Fn(u64) -> bool,
    ) -> HashMap<String, PodWork> {
        let mut sums: HashMap<String, PodWork> = HashMap::new();
        for (addr, w) in self.0.entries_where(now_ms, ttl_ms, keep) {
            sums.entry_ref(addr.as_str()).or_default().add(w);
        }
        sums
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(pairs: &[(&str, u32)]) -> Vec<(String, PodWork)> {
        pairs
            .iter()
            .map(|(a, n)| {
                (
                    a.to_string(),
                    PodWork {
                        inflight: *n,
                        prefill_tokens: u64::from(*n) * 100,
                        prefill_requests: *n,
                        head_since_ms: if *n > 0 { 50 + u64::from(*n) } else { 0 },
                        head_tokens: if *n > 0 { 100 } else { 0 },
                    },
                )
            })
            .collect()
    }

    #[test]
    fn other_vms_rows_are_summed_and_own_row_is_left_out() {
        let mut b = Board::default();
        b.put_row(
            1,
            100,
            &counts(&[("10.0.0.1:8000", 3), ("10.0.0.2:8000", 1)]),
            3000,
        );
        b.put_row(2, 110, &counts(&[("10.0.0.1:8000", 2)]), 3000);
        b.put_row(3, 120, &counts(&[("10.0.0.1:8000", 4)]), 3000);
        let b = Board::decode(&b.encode());
        let others = b.others(3, 200, 3000);
        let a = others.get("10.0.0.1:8000").unwrap();
        assert_eq!(
            (a.inflight, a.prefill_tokens, a.prefill_requests),
            (5, 500, 5)
        );
        assert_eq!(
            (a.head_since_ms, a.head_tokens),
            (52, 100),
            "the oldest head"
        );
        assert_eq!(others.get("10.0.0.2:8000").unwrap().inflight, 1);
    }

    #[test]
    fn a_vm_replaces_its_row_and_silent_rows_expire() {
        let mut b = Board::default();
        b.put_row(1, 0, &counts(&[("a:1", 7)]), 3000);
        b.put_row(2, 0, &counts(&[("a:1", 1)]), 3000);
        b.put_row(2, 10, &counts(&[("a:1", 2)]), 3000);
        assert_eq!(b.others(9, 10, 3000).get("a:1").unwrap().inflight, 9);
        assert_eq!(
            b.others(9, 3005, 3000).get("a:1").unwrap().inflight,
            2,
            "vm 1 went silent"
        );
        b.put_row(2, 3005, &counts(&[("a:1", 0)]), 3000);
        assert_eq!(b.0.rows(), 1, "expired row dropped on write");
        assert!(
            b.others(9, 3005, 3000).is_empty(),
            "empty entries are not stored"
        );
    }

    #[test]
    fn garbage_and_other_formats_decode_to_what_can_be_read() {
        let b = Board::decode(
            b"kvroute-board/3\nzz nope\n1 5 a:1=2/10/1/3/10 b:2=x\n\xff\xfe\n2 6 c:3=1/0/0/0/0 d:4=1/2/3/4",
        );
        let others = b.others(0, 6, 100);
        assert_eq!(others.get("a:1").unwrap().prefill_tokens, 10);
        assert_eq!(others.get("c:3").unwrap().inflight, 1);
        assert_eq!(others.len(), 2);
        // Previous module versions' rows (no format line, or board/2) are not misread as work.
        assert!(Board::decode(b"1 5 a:1=2\n").others(0, 6, 100).is_empty());
        assert!(Board::decode(b"kvroute-board/2\n1 5 a:1=2/10/1\n")
            .others(0, 6, 100)
            .is_empty());
    }
}
