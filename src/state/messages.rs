//! Binary messages: what workers send the leader through the shared queue, and the delta pages and
//! snapshots the leader publishes. Little-endian, length-prefixed; decoding never trusts a length
//! (a truncated or foreign message decodes to `None`, never to a panic or a huge allocation).
//!
//! ```text
//! message  = tag:u8 vm:u64 body
//!   tag 1  observation: addr:str n:u32 hash:u64 × n        ("pod addr now holds these blocks")
//!   (tag 2, in-flight reports, is retired: in-flight counts live on the board, `super::inflight`)
//!   tag 3  capacity hint: addr:str blocks:u32              ("pod addr evidently keeps only this
//!          many of our blocks": its response reported fewer cached tokens than the index expected)
//!   tag 4  eviction: addr:str n:u32 hash:u64 × n           ("pod addr no longer holds these")
//!   tag 5  verdicts: n:u16 (addr:str served:u32 failed:u32 trailing:u32) × n
//!          (how the requests this VM sent each pod ended since its last report, `crate::health`)
//! page     = format:u8(=2) seq:u64 n:u32 (addr:str n:u32 hash:u64 × n) × n  [m:u32 (addr:str n:u32 hash:u64 × n) × m]
//!            [origin:u8]
//!            the optional tail is the page's evictions, applied after its observations (a module
//!            without them reads the head and ignores the tail; a page without a tail has none);
//!            origin 1 marks a page of what another gateway replica observed (`crate::peers`:
//!            never served to replicas again), absent or 0 one of this Envoy's own
//! str      = len:u16 bytes
//! ```

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    pub addr: String,
    pub hashes: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Observation { vm: u64, observation: Observation },
    Eviction { vm: u64, eviction: Observation },
    Verdicts { vm: u64, pods: Vec<(String, Tally)> },
}

use crate::health::Tally;

/// A delta page or a snapshot: a sequence number and observations in application order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Page {
    pub seq: u64,
    pub observations: Vec<Observation>,
    /// Blocks pods were found not to hold any more (applied after the observations).
    pub evictions: Vec<Observation>,
    /// Learned from another gateway replica, not observed by this Envoy's own workers.
    pub from_peer: bool,
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, tail) = (self.bytes.get(..n)?, self.bytes.get(n..)?);
        self.bytes = tail;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1)?.first().copied()
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn str(&mut self) -> Option<String> {
        let n = self.u16()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
    fn observation(&mut self) -> Option<Observation> {
        let addr = self.str()?;
        let n = self.u32()? as usize;
        if n > self.bytes.len() / 8 {
            return None;
        }
        let hashes = (0..n).map(|_| self.u64()).collect::<Option<Vec<u64>>>()?;
        Some(Observation { addr, hashes })
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    let n = bytes.len().min(u16::MAX as usize);
    out.extend_from_slice(&(n as u16).to_le_bytes());
    out.extend_from_slice(bytes.get(..n).unwrap_or_default());
}

fn put_observation(out: &mut Vec<u8>, o: &Observation) {
    put_str(out, &o.addr);
    out.extend_from_slice(&(o.hashes.len() as u32).to_le_bytes());
    for h in &o.hashes {
        out.extend_from_slice(&h.to_le_bytes());
    }
}

impl Message {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Message::Observation { vm, observation } => {
                out.push(1);
                out.extend_from_slice(&vm.to_le_bytes());
                put_observation(&mut out, observation);
            }
            Message::Eviction { vm, eviction } => {
                out.push(4);
                out.extend_from_slice(&vm.to_le_bytes());
                put_observation(&mut out, eviction);
            }
            Message::Verdicts { vm, pods } => {
                out.push(5);
                out.extend_from_slice(&vm.to_le_bytes());
                let n = pods.len().min(u16::MAX as usize);
                out.extend_from_slice(&(n as u16).to_le_bytes());
                for (addr, t) in pods.iter().take(n) {
                    put_str(&mut out, addr);
                    for v in [t.served, t.failed, t.trailing_failures] {
                        out.extend_from_slice(&v.to_le_bytes());
                    }
                }
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<Message> {
        let mut r = Reader { bytes };
        let tag = r.u8()?;
        let vm = r.u64()?;
        match tag {
            1 => Some(Message::Observation {
                vm,
                observation: r.observation()?,
            }),
            4 => Some(Message::Eviction {
                vm,
                eviction: r.observation()?,
            }),
            // 3 was a capacity hint, removed: an eviction report says what a pod lost, not what
            // it can hold (a pod whose cache was emptied was capped to one prompt for 30 s). An
            // older VM's hint during an update is ignored.
            5 => {
                let n = r.u16()? as usize;
                let mut pods = Vec::new();
                for _ in 0..n {
                    let addr = r.str()?;
                    let tally = Tally {
                        served: r.u32()?,
                        failed: r.u32()?,
                        trailing_failures: r.u32()?,
                    };
                    pods.push((addr, tally));
                }
                Some(Message::Verdicts { vm, pods })
            }
            _ => None,
        }
    }
}

/// The format byte of pages and snapshots: another module version's page decodes as `None` (a
/// reader then treats it as overwritten and falls back to the snapshot, or skips ahead).
const PAGE_FORMAT: u8 = 2;

impl Page {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![PAGE_FORMAT];
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&(self.observations.len() as u32).to_le_bytes());
        for o in &self.observations {
            put_observation(&mut out, o);
        }
        if !self.evictions.is_empty() || self.from_peer {
            out.extend_from_slice(&(self.evictions.len() as u32).to_le_bytes());
            for e in &self.evictions {
                put_observation(&mut out, e);
            }
        }
        if self.from_peer {
            out.push(1);
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<Page> {
        let mut r = Reader { bytes };
        if r.u8()? != PAGE_FORMAT {
            return None;
        }
        let seq = r.u64()?;
        let n = r.u32()? as usize;
        if n > r.bytes.len() {
            return None;
        }
        let observations = (0..n)
            .map(|_| r.observation())
            .collect::<Option<Vec<_>>>()?;
        let evictions = if r.bytes.is_empty() {
            Vec::new()
        } else {
            let m = r.u32()? as usize;
            if m > r.bytes.len() {
                return None;
            }
            (0..m)
                .map(|_| r.observation())
                .collect::<Option<Vec<_>>>()?
        };
        let from_peer = r.bytes.first() == Some(&1);
        Some(Page {
            seq,
            observations,
            evictions,
            from_peer,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(addr: &str, hashes: &[u64]) -> Observation {
        Observation {
            addr: addr.into(),
            hashes: hashes.to_vec(),
        }
    }

    #[test]
    fn messages_round_trip() {
        let m = Message::Observation {
            vm: 9,
            observation: obs("10.0.0.1:8000", &[1, u64::MAX]),
        };
        assert_eq!(Message::decode(&m.encode()), Some(m));
        let h = Message::Eviction {
            vm: 3,
            eviction: obs("10.0.0.2:8000", &[1234]),
        };
        assert_eq!(Message::decode(&h.encode()), Some(h.clone()));
        let bytes = h.encode();
        for cut in 0..bytes.len() {
            assert_eq!(Message::decode(&bytes[..cut]), None, "cut at {cut}");
        }
        let p = Page {
            seq: 12,
            observations: vec![obs("a:1", &[5]), obs("b:2", &[])],
            evictions: vec![],
            from_peer: false,
        };
        assert_eq!(Page::decode(&p.encode()), Some(p.clone()));
        let e = Message::Eviction {
            vm: 2,
            eviction: obs("a:1", &[7, 8]),
        };
        assert_eq!(Message::decode(&e.encode()), Some(e));
        let v = Message::Verdicts {
            vm: 4,
            pods: vec![
                (
                    "a:1".into(),
                    Tally {
                        served: 3,
                        failed: 2,
                        trailing_failures: 1,
                    },
                ),
                ("b:2".into(), Tally::default()),
            ],
        };
        let bytes = v.encode();
        assert_eq!(Message::decode(&bytes), Some(v));
        for cut in 0..bytes.len() {
            assert_eq!(Message::decode(&bytes[..cut]), None, "cut at {cut}");
        }
        let with_evictions = Page {
            evictions: vec![obs("a:1", &[5])],
            ..p.clone()
        };
        let bytes = with_evictions.encode();
        assert_eq!(Page::decode(&bytes), Some(with_evictions.clone()));
        // A page's head alone (what a module without evictions writes) still decodes.
        assert_eq!(Page::decode(&p.encode()).unwrap().evictions, vec![]);
        for cut in p.encode().len() + 1..bytes.len() {
            assert_eq!(Page::decode(&bytes[..cut]), None, "cut at {cut}");
        }
        // A replica's page keeps its mark, with or without evictions; a page of this Envoy's own
        // reads as its own.
        for page in [&p, &with_evictions] {
            let learned = Page {
                from_peer: true,
                ..page.clone()
            };
            assert_eq!(Page::decode(&learned.encode()), Some(learned));
            assert!(!Page::decode(&page.encode()).unwrap().from_peer);
        }
    }

    #[test]
    fn truncated_or_foreign_bytes_decode_to_none() {
        let m = Message::Observation {
            vm: 9,
            observation: obs("a:1", &[1, 2, 3]),
        }
        .encode();
        for cut in 0..m.len() {
            assert_eq!(Message::decode(&m[..cut]), None, "cut at {cut}");
        }
        assert_eq!(Message::decode(&[7, 0, 0, 0, 0, 0, 0, 0, 0]), None);
        // A length field claiming 4 billion hashes must not allocate them.
        let mut huge = vec![1u8];
        huge.extend_from_slice(&0u64.to_le_bytes());
        huge.extend_from_slice(&[1, 0, b'a']);
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Message::decode(&huge), None);
        assert_eq!(Page::decode(&[1, 2, 3]), None);
        let page = Page {
            seq: 4,
            ..Page::default()
        }
        .encode();
        assert_eq!(
            Page::decode(&page[1..]),
            None,
            "a page without the format byte"
        );
    }
}
