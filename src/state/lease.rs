//! Leader election by lease: the holder renews `kvroute.lease` on every tick; when it stops (its VM
//! died or was reloaded), any VM takes the expired lease with a compare-and-swap. A configured
//! bootstrap singleton takes the lease even when it is held, so it is the leader wherever it exists.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub holder: u64,
    pub expires_ms: u64,
}

/// The lease's format byte: a value of another module version decodes as no lease (and is taken).
const FORMAT: u8 = 2;

impl Lease {
    pub fn encode(&self) -> [u8; 17] {
        let mut out = [0u8; 17];
        out[0] = FORMAT;
        out[1..9].copy_from_slice(&self.holder.to_le_bytes());
        out[9..].copy_from_slice(&self.expires_ms.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<Lease> {
        if bytes.len() != 17 || bytes.first() != Some(&FORMAT) {
            return None;
        }
        let holder = u64::from_le_bytes(bytes.get(1..9)?.try_into().ok()?);
        let expires_ms = u64::from_le_bytes(bytes.get(9..17)?.try_into().ok()?);
        Some(Lease { holder, expires_ms })
    }
}

/// The lease `me` should write now, if any: a renewal of its own, or a takeover of an expired (or
/// absent, or unreadable) one; `preferred` VMs (the singleton) take it regardless.
pub fn claim(
    current: Option<Lease>,
    me: u64,
    now_ms: u64,
    ttl_ms: u64,
    preferred: bool,
) -> Option<Lease> {
    let mine = Lease {
        holder: me,
        // Saturating: `leader_lease_ms` may be any u64 (found by fuzzing `lease`); a wrapped
        // expiry would look expired at once and let every VM take the lease on every tick.
        expires_ms: now_ms.saturating_add(ttl_ms),
    };
    match current {
        Some(l) if l.holder == me => Some(mine),
        Some(l) if l.expires_ms > now_ms && !preferred => None,
        _ => Some(mine),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let l = Lease {
            holder: 7,
            expires_ms: 99,
        };
        assert_eq!(Lease::decode(&l.encode()), Some(l));
        assert_eq!(Lease::decode(b"short"), None);
        // The previous module's 16-byte lease is not misread.
        assert_eq!(Lease::decode(&l.encode()[1..]), None);
    }

    #[test]
    fn election() {
        let held = Some(Lease {
            holder: 1,
            expires_ms: 1000,
        });
        assert_eq!(claim(None, 2, 0, 500, false).map(|l| l.holder), Some(2));
        assert_eq!(
            claim(held, 2, 999, 500, false),
            None,
            "a live lease is respected"
        );
        assert_eq!(
            claim(held, 1, 999, 500, false).map(|l| l.expires_ms),
            Some(1499),
            "renewal"
        );
        assert_eq!(
            claim(held, 2, 1000, 500, false).map(|l| l.holder),
            Some(2),
            "takeover when expired"
        );
        assert_eq!(
            claim(held, 3, 10, 500, true).map(|l| l.holder),
            Some(3),
            "the singleton preempts"
        );
        let forever = claim(None, 4, 10, u64::MAX, false).map(|l| l.expires_ms);
        assert_eq!(forever, Some(u64::MAX), "a huge lease time does not wrap");
        assert_eq!(
            claim(
                Some(Lease {
                    holder: 4,
                    expires_ms: u64::MAX
                }),
                5,
                11,
                500,
                false
            ),
            None,
            "and is respected"
        );
    }
}
