//! The in-flight board: every VM's unfinished requests per pod, in one shared-data key.
//!
//! Why a board and not reports to the leader: the affinity cap and the load scorers must see the
//! requests other worker VMs sent a moment ago. A burst on one hot prefix arrives within
//! milliseconds, far inside one leader tick, and with per-VM counts alone each VM sent its share of
//! the burst to the prefix holder before anyone saw the pile-up. Each VM owns one row and rewrites it
//! (compare-and-swap on the whole key) whenever its counts change and at least every heartbeat.
//! Readers sum the other rows written within a time to live: a VM that crashed or was replaced stops
//! refreshing its row, and its requests stop counting.
//!
//! Encoding, one row per line: `<vm id hex> <written ms> <addr>=<count> ...`. Decoding skips lines it
//! does not understand, so a foreign or truncated value costs counts, never a panic. The key stays
//! bounded: one row per live VM, one entry per pod with requests in flight.
//!
//! Cost: each routed request reads the key once and rewrites it twice (start and end), decoding
//! every row each time, and all VMs' writes contend on the one key. At a handful of workers that is
//! a few host calls per request (`make bench-overhead` measured 15–70 µs); at dozens of workers with
//! hundreds of pods, per-VM keys would remove the contention.

use hashbrown::HashMap;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    vm: u64,
    written_ms: u64,
    counts: Vec<(String, u32)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Board {
    rows: Vec<Row>,
}

impl Board {
    pub fn decode(bytes: &[u8]) -> Board {
        let text = String::from_utf8_lossy(bytes);
        let rows = text.lines().filter_map(parse_row).collect();
        Board { rows }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = String::new();
        for row in &self.rows {
            out.push_str(&format!("{:x} {}", row.vm, row.written_ms));
            for (addr, n) in &row.counts {
                out.push_str(&format!(" {addr}={n}"));
            }
            out.push('\n');
        }
        out.into_bytes()
    }

    /// Replaces `vm`'s row with `counts` (zero counts left out) and drops rows older than `ttl_ms`.
    pub fn put_row(&mut self, vm: u64, now_ms: u64, counts: &[(String, u32)], ttl_ms: u64) {
        self.rows
            .retain(|r| r.vm != vm && now_ms.saturating_sub(r.written_ms) <= ttl_ms);
        self.rows.push(Row {
            vm,
            written_ms: now_ms,
            counts: counts.iter().filter(|(_, n)| *n > 0).cloned().collect(),
        });
        self.rows.sort_by_key(|r| r.vm);
    }

    /// Requests in flight per pod from every VM but `vm`, counting rows younger than `ttl_ms`.
    pub fn others(&self, vm: u64, now_ms: u64, ttl_ms: u64) -> HashMap<String, u32> {
        let mut sums: HashMap<String, u32> = HashMap::new();
        for row in &self.rows {
            if row.vm == vm || now_ms.saturating_sub(row.written_ms) > ttl_ms {
                continue;
            }
            for (addr, n) in &row.counts {
                let sum = sums.entry_ref(addr.as_str()).or_insert(0);
                *sum = sum.saturating_add(*n);
            }
        }
        sums
    }
}

fn parse_row(line: &str) -> Option<Row> {
    let mut fields = line.split(' ');
    let vm = u64::from_str_radix(fields.next()?, 16).ok()?;
    let written_ms = fields.next()?.parse().ok()?;
    let counts = fields
        .filter_map(|f| {
            let (addr, n) = f.rsplit_once('=')?;
            Some((addr.to_string(), n.parse().ok()?))
        })
        .collect();
    Some(Row {
        vm,
        written_ms,
        counts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(pairs: &[(&str, u32)]) -> Vec<(String, u32)> {
        pairs.iter().map(|(a, n)| (a.to_string(), *n)).collect()
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
        assert_eq!(others.get("10.0.0.1:8000"), Some(&5));
        assert_eq!(others.get("10.0.0.2:8000"), Some(&1));
    }

    #[test]
    fn a_vm_replaces_its_row_and_silent_rows_expire() {
        let mut b = Board::default();
        b.put_row(1, 0, &counts(&[("a:1", 7)]), 3000);
        b.put_row(2, 0, &counts(&[("a:1", 1)]), 3000);
        b.put_row(2, 10, &counts(&[("a:1", 2)]), 3000);
        assert_eq!(b.others(9, 10, 3000).get("a:1"), Some(&9));
        assert_eq!(
            b.others(9, 3005, 3000).get("a:1"),
            Some(&2),
            "vm 1 went silent"
        );
        b.put_row(2, 3005, &counts(&[("a:1", 0)]), 3000);
        assert_eq!(b.rows.len(), 1, "expired row dropped on write");
        assert!(
            b.others(9, 3005, 3000).is_empty(),
            "zero counts are not stored"
        );
    }

    #[test]
    fn garbage_decodes_to_what_can_be_read() {
        let b = Board::decode(b"zz nope\n1 5 a:1=2 b:2=x\n\xff\xfe\n2 6 c:3=1");
        let others = b.others(0, 6, 100);
        assert_eq!(others.get("a:1"), Some(&2));
        assert_eq!(others.get("c:3"), Some(&1));
        assert_eq!(others.len(), 2);
    }
}
