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

/// CPU µs per request between two readings of a process's CPU time (ns): `None` without both
/// readings or without requests.
pub(super) fn cpu_us_per_request(
    before: Option<u64>,
    after: Option<u64>,
    requests: usize,
) -> Option<f64> {
    let (before, after) = before.zip(after)?;
    (requests > 0).then(|| after.saturating_sub(before) as f64 / 1e3 / requests as f64)
}

/// CPU time of a whole process so far (every thread), ns; `None` off Linux or once it is gone.
pub(super) fn process_cpu_ns(pid: u32) -> Option<u64> {
    let threads = thread_cpu_ns(pid);
    (!threads.is_empty()).then(|| threads.values().sum())
}

/// The parent of a process from its `/proc/PID/stat` line: the fourth field, counted after the
/// command name's closing parenthesis (a name may hold spaces and parentheses itself).
fn parent_in_stat(stat: &str) -> Option<u32> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// `root` and every process below it, from (pid, parent) pairs, `root` first.
fn tree_of(root: u32, parents: &[(u32, u32)]) -> Vec<u32> {
    let mut tree = vec![root];
    let mut i = 0;
    while let Some(&pid) = tree.get(i) {
        for &(child, parent) in parents {
            if parent == pid && !tree.contains(&child) {
                tree.push(child);
            }
        }
        i += 1;
    }
    tree
}

/// CPU time so far of a process and every process below it (every thread of each), ns: a router
/// started through a Python launcher may run its work in a child. `None` off Linux or once the
/// process is gone. Children that have exited are not counted.
pub(super) fn tree_cpu_ns(root: u32) -> Option<u64> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter_map(|pid| {
                    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                    Some((pid, parent_in_stat(&stat)?))
                })
                .collect()
        })
        .unwrap_or_default();
    let own = process_cpu_ns(root)?;
    let children: u64 = tree_of(root, &parents)
        .into_iter()
        .skip(1)
        .filter_map(process_cpu_ns)
        .sum();
    Some(own + children)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_per_request_needs_both_readings_and_a_request() {
        assert_eq!(cpu_us_per_request(Some(1_000), Some(41_000), 4), Some(10.0));
        assert_eq!(cpu_us_per_request(None, Some(41_000), 4), None);
        assert_eq!(cpu_us_per_request(Some(1_000), None, 4), None);
        assert_eq!(cpu_us_per_request(Some(1_000), Some(41_000), 0), None);
        // A reading that went backwards (a child exited) counts as none, not as negative.
        assert_eq!(cpu_us_per_request(Some(5_000), Some(1_000), 2), Some(0.0));
    }

    #[test]
    fn the_parent_is_read_after_the_command_name() {
        assert_eq!(parent_in_stat("42 (envoy) S 7 42 42 0 -1"), Some(7));
        assert_eq!(
            parent_in_stat("43 (odd) name (x)) R 9 43 43 0 -1"),
            Some(9),
            "a name with spaces and parentheses"
        );
        assert_eq!(parent_in_stat("garbage"), None);
    }

    #[test]
    fn a_tree_holds_the_root_and_every_descendant_once() {
        // 1 ─ 2 ─ 4, 1 ─ 3, and 5 under another root; a loop (6 ↔ 7) does not hang it.
        let parents = [(2, 1), (3, 1), (4, 2), (5, 9), (6, 7), (7, 6)];
        let mut t = tree_of(1, &parents);
        assert_eq!(t.first(), Some(&1));
        t.sort_unstable();
        assert_eq!(t, [1, 2, 3, 4]);
        assert_eq!(tree_of(8, &parents), [8]);
        let mut looped = tree_of(6, &parents);
        looped.sort_unstable();
        assert_eq!(looped, [6, 7]);
    }

    #[test]
    fn this_process_has_cpu_time_and_its_tree_at_least_as_much() {
        let me = std::process::id();
        let Some(own) = process_cpu_ns(me) else {
            return; // not Linux
        };
        let tree = tree_cpu_ns(me).expect("this process's tree");
        assert!(tree >= own, "{tree} < {own}");
    }
}
