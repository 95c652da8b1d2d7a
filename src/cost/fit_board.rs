//! The fits board: each VM's learned TTFT model per pod (`crate::cost`), in one shared-data key.
//!
//! Every VM learns from the requests it routed itself; with several workers each sees only its
//! share. Publishing the fits lets every VM predict with everyone's samples: a reader combines the
//! rows by sample weight (`crate::cost::merge`). Unlike the in-flight board this changes slowly, so
//! it is written once per heartbeat and read on the tick, never on the request path.
//!
//! Encoding: the format line `kvroute-fits/1`, then one row per VM: `<vm id hex> <written ms>
//! <addr>=<overhead ms>/<µs per token>/<µs per decoding>/<samples>/<inter-token ms or -> ...`. Values
//! of another format decode as empty; unreadable entries are skipped. Bounded: one row per live VM,
//! one entry per pod.

use crate::cost::{Coefficients, Costs};
use crate::port::Host;
use crate::state::rows::{Entry, RowBoard};
use crate::state::FITS_KEY;
use hashbrown::HashMap;

const FORMAT: &str = "kvroute-fits/1";
/// A VM publishes its cost fits this often (they change slowly; read on every tick).
pub const HEARTBEAT_MS: u64 = 1000;
const ROW_TTL_MS: u64 = 10 * HEARTBEAT_MS;

/// One VM's knowledge of one pod.
#[derive(Debug, Clone, PartialEq)]
pub struct PodFit {
    pub addr: String,
    pub cost: Coefficients,
    pub samples: f64,
    /// Mean inter-token latency of the pod's streams this VM timed, ms.
    pub itl_ms: Option<f64>,
}

impl Entry for PodFit {
    const FORMAT: &'static str = FORMAT;

    fn write(&self, out: &mut String) {
        use std::fmt::Write as _;
        let c = &self.cost;
        let _ = write!(
            out,
            "{}={:.3}/{:.4}/{:.3}/{:.2}/",
            self.addr, c.overhead_ms, c.us_per_token, c.us_per_decoding, self.samples
        );
        match self.itl_ms {
            Some(itl) => {
                let _ = write!(out, "{itl:.3}");
            }
            None => out.push('-'),
        }
    }

    fn parse(field: &str) -> Option<PodFit> {
        let (addr, value) = field.rsplit_once('=')?;
        let parts: Vec<&str> = value.split('/').collect();
        let [o, t, d, n, itl] = parts.as_slice() else {
            return None;
        };
        let number = |text: &str| {
            text.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
        };
        let itl_ms = match *itl {
            "-" => None,
            text => Some(number(text)?),
        };
        Some(PodFit {
            addr: addr.to_string(),
            cost: Coefficients {
                overhead_ms: number(o)?,
                us_per_token: number(t)?,
                us_per_decoding: number(d)?,
            },
            samples: number(n)?,
            itl_ms,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct FitBoard(RowBoard<PodFit>);

impl FitBoard {
    pub fn decode(bytes: &[u8]) -> FitBoard {
        FitBoard(RowBoard::decode(bytes))
    }

    pub fn encode(&self) -> Vec<u8> {
        self.0.encode()
    }

    /// Replaces `vm`'s row and drops rows older than `ttl_ms`.
    pub fn put_row(&mut self, vm: u64, now_ms: u64, fits: Vec<PodFit>, ttl_ms: u64) {
        self.0.put_row(vm, now_ms, fits, ttl_ms);
    }

    /// Every other live VM's fits, per pod.
    pub fn others(&self, vm: u64, now_ms: u64, ttl_ms: u64) -> HashMap<String, Vec<PodFit>> {
        let mut out: HashMap<String, Vec<PodFit>> = HashMap::new();
        for f in self.0.others(vm, now_ms, ttl_ms) {
            out.entry_ref(f.addr.as_str()).or_default().push(f.clone());
        }
        out
    }
}

/// This VM's side of the fits board: the key's version last adopted and when its row was written.
#[derive(Debug, Default)]
pub struct FitsRow {
    last_write_ms: u64,
    cas: Option<u32>,
}

impl FitsRow {
    /// The tick's step: adopts the other VMs' fits when the key changed, and publishes this VM's
    /// own at most once per heartbeat.
    pub fn follow(&mut self, costs: &mut Costs, host: &mut dyn Host, vm: u64, now: u64) {
        let (bytes, cas) = host.shared_get(FITS_KEY);
        if cas != self.cas {
            let board = bytes.as_deref().map(FitBoard::decode).unwrap_or_default();
            costs.set_others_fits(board.others(vm, now, ROW_TTL_MS));
            self.cas = cas;
        }
        if now.saturating_sub(self.last_write_ms) < HEARTBEAT_MS {
            return;
        }
        let own = costs.own_fits();
        if own.is_empty() {
            return;
        }
        let mut board = bytes.as_deref().map(FitBoard::decode).unwrap_or_default();
        board.put_row(vm, now, own, ROW_TTL_MS);
        // One attempt: a lost race is retried on the next tick.
        if host.shared_set(FITS_KEY, &board.encode(), cas).is_ok() {
            self.last_write_ms = now;
        }
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn fit(addr: &str, t: f64, n: f64, itl: Option<f64>) -> PodFit {
        PodFit {
            addr: addr.into(),
            cost: Coefficients {
                overhead_ms: 2.0,
                us_per_token: t,
                us_per_decoding: 0.5,
            },
            samples: n,
            itl_ms: itl,
        }
    }

    #[test]
    fn rows_round_trip_and_own_row_is_left_out() {
        let mut b = FitBoard::default();
        b.put_row(1, 10, vec![fit("a:1", 20.0, 5.0, Some(1.5))], 3000);
        b.put_row(2, 11, vec![fit("a:1", 40.0, 1.0, None)], 3000);
        let b = FitBoard::decode(&b.encode());
        let others = b.others(2, 20, 3000);
        assert_eq!(others["a:1"], vec![fit("a:1", 20.0, 5.0, Some(1.5))]);
        assert_eq!(b.others(1, 20, 3000)["a:1"][0].itl_ms, None);
        assert!(b.others(9, 5000, 3000).is_empty(), "silent rows expire");
    }

    #[test]
    fn lies_and_foreign_formats_are_not_trusted() {
        let b = FitBoard::decode(
            b"kvroute-fits/1\n1 5 a:1=NaN/1/1/1/- b:1=1/-4/0/1/- c:1=1/2/3/4/- d:1=1/2 e:1=1/2/3/4/-1 f:1=1/2/3/4/x g:1=1/2/3/4\nzz\n",
        );
        let o = b.others(0, 5, 100);
        assert_eq!(o.len(), 1, "{o:?}");
        assert!(o.contains_key("c:1"));
        assert!(FitBoard::decode(b"1 5 c:1=1/2/3/4/-")
            .others(0, 5, 100)
            .is_empty());
    }
}
