//! What the VMs of one Envoy share, and its byte encodings.
//!
//! Envoy runs one Wasm VM per worker thread; they share nothing but Envoy's shared-data key/value
//! store and shared queues. The layout (every key fixed, so shared data stays bounded whatever the
//! traffic):
//!
//! | key / queue                   | writer  | content                                               |
//! |-------------------------------|---------|-------------------------------------------------------|
//! | `kvroute.lease`               | any VM  | [`lease::Lease`]: who polls, until when (CAS)          |
//! | `kvroute.load`                | leader  | `crate::pod::load::LoadTable` JSON: members, metrics, freshness |
//! | `kvroute.inflight`            | any VM  | `crate::work::Board`: each VM's row of requests and queued prefill tokens per pod (CAS) |
//! | `kvroute.fits`                | any VM  | `crate::cost::fit_board::FitBoard`: each VM's row of learned TTFT models per pod (CAS) |
//! | `kvroute.queue`               | leader  | id of the shared queue workers send [`messages`] to   |
//! | `kvroute.idx.head`            | leader  | sequence number of the newest delta page              |
//! | `kvroute.idx.page.<0..RING>`  | leader  | a delta page: observations "pod P holds blocks h…"    |
//! | `kvroute.idx.snapshot`        | leader  | every pod's blocks, for VMs that fell behind the ring |
//! | `kvroute.idx.epoch`           | leader  | this Envoy's page numbering, random: replicas tell a restart by it (`crate::peers`) |

pub mod lease;
pub mod messages;
pub mod rows;

pub const LEASE_KEY: &str = "kvroute.lease";
pub const LOAD_KEY: &str = "kvroute.load";
pub const INFLIGHT_KEY: &str = "kvroute.inflight";
pub const FITS_KEY: &str = "kvroute.fits";
pub const HELD_KEY: &str = "kvroute.held";
pub const QUEUE_ID_KEY: &str = "kvroute.queue";
pub const QUEUE_NAME: &str = "kvroute.observations";
pub const PAGE_HEAD_KEY: &str = "kvroute.idx.head";
pub const SNAPSHOT_KEY: &str = "kvroute.idx.snapshot";
pub const EPOCH_KEY: &str = "kvroute.idx.epoch";
/// Delta pages kept; a VM more than this many pages behind reloads the snapshot.
pub const PAGE_RING: u64 = 64;
/// The leader rewrites the snapshot at least every this many pages, so a VM that reloads it can
/// always continue from pages still in the ring.
pub const SNAPSHOT_EVERY_PAGES: u64 = PAGE_RING / 2;

pub fn page_key(seq: u64) -> String {
    format!("kvroute.idx.page.{}", seq % PAGE_RING)
}

/// A little-endian `u64` kept in shared data under `key` (a counter, a version, a time).
pub fn get_u64(host: &dyn crate::port::Host, key: &str) -> Option<u64> {
    let bytes = host.shared_get(key).0?;
    Some(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?))
}

pub fn set_u64(host: &mut dyn crate::port::Host, key: &str, value: u64) {
    let _ = host.shared_set(key, &value.to_le_bytes(), None);
}
