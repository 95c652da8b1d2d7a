//! What each Envoy process spends, read from outside it: the `server.memory_*` figures of its
//! `/stats` and its RSS (`/proc/PID/status`), and the CPU time of each of its threads
//! (`/proc/PID/task/*/schedstat`), so that kvroute's work on any thread, the leader's included,
//! counts. Linux only for the `/proc` figures; elsewhere they are absent, not zero.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use serde::Serialize;

use harness::Envoy;

/// One Envoy's memory figures: `/stats` `server.memory_*` and the process's RSS, bytes.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct MemoryFigures {
    pub allocated: u64,
    pub heap_size: u64,
    pub physical_size: u64,
    /// `VmRSS` of the Envoy process (Linux only).
    pub rss: Option<u64>,
}

impl MemoryFigures {
    pub(super) async fn read(envoy: &Envoy) -> Result<Self> {
        let stats = envoy.stats().await.context("reading Envoy /stats")?;
        let get = |k: &str| stats.get(k).copied().unwrap_or(0);
        Ok(Self {
            allocated: get("server.memory_allocated"),
            heap_size: get("server.memory_heap_size"),
            physical_size: get("server.memory_physical_size"),
            rss: rss_bytes(envoy.proc.pid()),
        })
    }
}

/// kvroute − plain of each figure, bytes.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct MemoryDiff {
    pub allocated: i64,
    pub heap_size: i64,
    pub physical_size: i64,
    pub rss: Option<i64>,
}

fn signed_diff(a: u64, b: u64) -> i64 {
    i64::try_from(a).unwrap_or(i64::MAX) - i64::try_from(b).unwrap_or(i64::MAX)
}

impl MemoryDiff {
    pub(super) fn of(kv: &MemoryFigures, plain: &MemoryFigures) -> Self {
        Self {
            allocated: signed_diff(kv.allocated, plain.allocated),
            heap_size: signed_diff(kv.heap_size, plain.heap_size),
            physical_size: signed_diff(kv.physical_size, plain.physical_size),
            rss: kv.rss.zip(plain.rss).map(|(a, b)| signed_diff(a, b)),
        }
    }
}

/// `VmRSS` of a process, bytes.
fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// CPU time of every thread of a process so far, ns, by `name (tid)` (Linux: the first field of
/// `/proc/PID/task/TID/schedstat`).
pub(super) fn thread_cpu_ns(pid: u32) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let dir = task.path();
        let ns = std::fs::read_to_string(dir.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok());
        let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if let Some(ns) = ns {
            let tid = task.file_name().to_string_lossy().into_owned();
            out.insert(format!("{} ({tid})", name.trim()), ns);
        }
    }
    out
}

/// CPU per request between two [`thread_cpu_ns`] readings: (total, per thread), µs.
pub(super) fn cpu_per_request(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
    requests: usize,
) -> (Option<f64>, BTreeMap<String, f64>) {
    if after.is_empty() || requests == 0 {
        return (None, BTreeMap::new());
    }
    let per = |ns: u64| ns as f64 / 1e3 / requests as f64;
    let threads: BTreeMap<String, f64> = after
        .iter()
        .map(|(k, &ns)| (k, ns.saturating_sub(before.get(k).copied().unwrap_or(0))))
        .filter(|(_, ns)| *ns > 0)
        .map(|(k, ns)| (k.clone(), per(ns)))
        .collect();
    (Some(threads.values().sum()), threads)
}

/// CPU time of a whole process so far (every thread), ns; `None` off Linux or once it is gone.
pub(super) fn process_cpu_ns(pid: u32) -> Option<u64> {
    let threads = thread_cpu_ns(pid);
    (!threads.is_empty()).then(|| threads.values().sum())
}

/// The whole machine's busy and total CPU time so far, in clock ticks (`/proc/stat`'s `cpu`
/// line: busy = everything but idle and iowait), so a load can say how full the machine was.
pub(super) fn machine_cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}
