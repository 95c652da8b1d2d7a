//! The picker ranks candidates by total score. Pods within `TIE_BAND` of the best count as equal and
//! are ordered by rendezvous (highest-random-weight) hashing of the request's first block hash with
//! the pod address. For a prefix that no candidate holds, the equal set is wider: every pod whose
//! load is within `rendezvous_load_slack` requests of the least-loaded one. Independent gateway
//! replicas, which share the pods' load (up to a poll's worth of noise) but not each other's prefix
//! knowledge, then send the same new prefix to the same pod; a pod joining or leaving moves only the
//! prefixes it wins. A request with a session goes first to its session's pod unless the affinity
//! cap calls that pod overloaded (see `super::session`); the ranking behind it stays as scored. The
//! result is the primary pod plus fallbacks for Envoy's retry policy to walk.

use super::scorers::Scores;
use super::{PodView, Rejection, RouteRequest};
use crate::config::Config;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Scores closer than this are a tie: metrics noise must not split replicas' choices.
pub const TIE_BAND: f64 = 0.02;

#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub addr: String,
    pub matched_blocks: usize,
    pub scores: Scores,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteReason {
    /// The primary pod holds part of the prompt.
    PrefixHit,
    /// No useful prefix (or it was capped): chosen by load.
    Load,
    /// The request's session is pinned to this pod (see `super::session`).
    Session,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Route {
        ranked: Vec<Choice>,
        reason: RouteReason,
    },
    NoEndpoint(Rejection),
}

pub fn rendezvous_rank(key: u64, addr: &str) -> u64 {
    xxh3_64_with_seed(addr.as_bytes(), key)
}

pub fn pick(
    config: &Config,
    pods: &[&PodView<'_>],
    scores: &[Scores],
    request: &RouteRequest<'_>,
) -> Decision {
    let mut order: Vec<(f64, u64, usize)> = pods
        .iter()
        .zip(scores)
        .enumerate()
        .map(|(i, (pod, s))| (s.total, rendezvous_rank(request.affinity_key, pod.addr), i))
        .collect();
    let best = order.iter().map(|o| o.0).fold(f64::NEG_INFINITY, f64::max);
    let new_prefix = scores.iter().all(|s| s.prefix <= 0.0);
    let min_load = pods.iter().map(|p| p.load()).fold(f64::INFINITY, f64::min);
    let tied = |&(total, _, i): &(f64, u64, usize)| {
        if new_prefix {
            pods.get(i)
                .is_some_and(|p| p.load() - min_load <= config.rendezvous_load_slack)
        } else {
            best - total <= TIE_BAND
        }
    };
    // Ties first, by rendezvous; then the rest by score, rendezvous breaking exact equality.
    order.sort_by(|a, b| {
        let a_tied = tied(a);
        let b_tied = tied(b);
        b_tied
            .cmp(&a_tied)
            .then_with(|| {
                if a_tied && b_tied {
                    std::cmp::Ordering::Equal
                } else {
                    b.0.total_cmp(&a.0)
                }
            })
            .then_with(|| b.1.cmp(&a.1))
    });
    let pinned = request.hints.session.and_then(|key| {
        let (i, pod) = pods
            .iter()
            .enumerate()
            .max_by_key(|(_, p)| rendezvous_rank(key, p.addr))?;
        (!super::scorers::overloaded(config, pod.load(), min_load)).then_some(i)
    });
    if let Some(i) = pinned {
        if let Some(at) = order.iter().position(|o| o.2 == i) {
            let entry = order.remove(at);
            order.insert(0, entry);
        }
    }
    let ranked: Vec<Choice> = order
        .iter()
        .take(config.max_endpoints_in_header)
        .filter_map(|&(_, _, i)| {
            let pod = pods.get(i)?;
            Some(Choice {
                addr: pod.addr.to_string(),
                matched_blocks: pod.matched_blocks,
                scores: scores.get(i).copied().unwrap_or_default(),
            })
        })
        .collect();
    let reason = match ranked.first() {
        _ if pinned.is_some() => RouteReason::Session,
        Some(c) if c.matched_blocks > 0 && c.scores.prefix > 0.0 => RouteReason::PrefixHit,
        _ => RouteReason::Load,
    };
    if ranked.is_empty() {
        return Decision::NoEndpoint(Rejection::NoPods);
    }
    Decision::Route { ranked, reason }
}
