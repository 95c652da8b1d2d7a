//! The leader's step: drain observations, poll pods and the admin API, ask peers, publish the
//! load table and the gauges; and the answers of those calls.

use super::*;
use crate::pod::prom::PodMetrics;
use crate::work::put_board_row;

/// A GET through `cluster`; `credential` is the pool's `Authorization` value, for calls to pods
/// (`pod_api_key`), never for the admin API.
pub(super) fn dispatch(
    host: &mut dyn Host,
    cluster: &str,
    path: &str,
    authority: &str,
    destination: Option<&str>,
    credential: Option<&crate::common::Secret>,
    timeout_ms: u64,
) -> Option<u32> {
    let mut headers = Vec::new();
    if let Some(d) = destination {
        headers.push((crate::headers::DESTINATION.into(), d.to_string()));
    }
    if let Some(c) = credential {
        headers.push(("authorization".into(), c.expose().to_string()));
    }
    let call = HttpCall {
        cluster: cluster.to_string(),
        method: "GET",
        path: path.to_string(),
        authority: authority.to_string(),
        headers,
        body: None,
        timeout_ms,
    };
    let token = host.http_call(&call);
    if token.is_none() {
        log::warn!("kvroute: dispatch to cluster `{cluster}` failed (is the cluster configured?)");
    }
    token
}

impl Vm {
    pub(super) fn lead(&mut self, host: &mut dyn Host, now: u64) {
        let Some(mut st) = self.leader.take() else {
            return;
        };
        self.drain_queue(host, &mut st, now);
        if !self.still_leads(host) {
            // Paused between the election and here (a stopped worker thread) for longer than the
            // lease: another VM leads now, and this one's writes would overwrite its pages and table.
            log::info!(
                "kvroute: VM {:x} lost the lease mid-tick; not publishing",
                self.id
            );
            return;
        }
        let ejected = st.book.update_health(&self.config, now);
        host.count(Counter::Ejections, u64::from(ejected));
        st.pages.publish(&mut self.router.affinity, host);
        if st.book.discovery_due(&self.config, now) && st.admin_call.is_none() {
            if let Some(cluster) = &self.config.admin_cluster {
                st.admin_call = dispatch(
                    host,
                    cluster,
                    "/clusters?format=json",
                    "admin",
                    None,
                    None,
                    self.timeout(),
                );
            }
        }
        self.poll_pods(host, &mut st, now);
        self.ask_peers(host, &mut st, now);
        self.list_models(host, &mut st, now);
        let table = st.book.table(now);
        // Every VM re-reads the table when it changes; unchanged ticks (most of them, between polls)
        // cost no write and no parse.
        if st.published_pods.as_ref() != Some(&table.pods) {
            let _ = host.shared_set(LOAD_KEY, &table.encode(), None);
            st.published_pods = Some(table.pods.clone());
        }
        self.publish_gauges(host, &table, now);
        self.leader = Some(st);
    }

    /// What the workers sent through the shared queue (observations, evictions, request
    /// verdicts), at most `MAX_DRAIN_PER_TICK` messages, and this VM's own verdicts.
    fn drain_queue(&mut self, host: &mut dyn Host, st: &mut LeaderState, now: u64) {
        for _ in 0..MAX_DRAIN_PER_TICK {
            let Some(bytes) = host.queue_pop(st.queue) else {
                break;
            };
            match Message::decode(&bytes) {
                Some(Message::Observation { observation, .. }) => {
                    self.router.affinity.observe(&observation);
                    st.pages.push(Change::Observed(observation));
                }
                Some(Message::Eviction { eviction, .. }) => {
                    self.router.affinity.forget(&eviction);
                    st.pages.push(Change::Forgotten(eviction));
                }
                Some(Message::Verdicts { pods, .. }) => {
                    for (addr, tally) in pods {
                        st.book.on_outcomes(&self.config, &addr, tally, now);
                    }
                }
                None => log::debug!("kvroute: dropped an undecodable queue message"),
            }
        }
        for (addr, tally) in std::mem::take(&mut self.verdicts) {
            st.book.on_outcomes(&self.config, &addr, tally, now);
        }
    }

    /// Sends the `/metrics` polls that are due, each noting what this gateway had on the pod.
    fn poll_pods(&mut self, host: &mut dyn Host, st: &mut LeaderState, now: u64) {
        let polling: hashbrown::HashSet<String> =
            st.polls.values().map(|(a, _, _)| a.clone()).collect();
        let due = st.book.poll_due(&self.config, now);
        if !due.is_empty() {
            // Each poll is read against what this gateway had on the pod when it was sent (see
            // `GatewayShare`): the other VMs' rows as of now, one shared-data read per round.
            self.read_inflight_board(host, now);
        }
        for addr in due {
            if polling.contains(&addr) {
                // The previous poll of this pod has not answered yet: polls never pile up on a
                // slow pod; it is polled again once that one answers or times out.
                continue;
            }
            match dispatch(
                host,
                &self.config.poll_cluster,
                "/metrics",
                &addr,
                Some(&addr),
                self.config.pod_authorization.as_ref(),
                self.timeout(),
            ) {
                Some(token) => {
                    let work = self.router.work.of(&addr);
                    let ours = GatewayShare {
                        prefilling: f64::from(work.prefill_requests),
                        inflight: f64::from(work.inflight),
                    };
                    st.polls.insert(token, (addr, now, ours));
                }
                None => {
                    st.book
                        .on_poll(&addr, PollResult::Failed, GatewayShare::default(), now);
                    host.count(Counter::PollFailures, 1);
                }
            }
        }
    }

    /// Sends the `/v1/models` calls that are due (one per pod at a time).
    fn list_models(&self, host: &mut dyn Host, st: &mut LeaderState, now: u64) {
        let listing: hashbrown::HashSet<String> = st.model_polls.values().cloned().collect();
        for addr in st.book.models_due(&self.config, now) {
            if listing.contains(&addr) {
                continue;
            }
            if let Some(token) = dispatch(
                host,
                &self.config.poll_cluster,
                "/v1/models",
                &addr,
                Some(&addr),
                self.config.pod_authorization.as_ref(),
                self.timeout(),
            ) {
                st.model_polls.insert(token, addr);
            }
        }
    }

    /// Asks the other gateway replicas that are due for the pages they published since the last
    /// answer (`peers`).
    pub(super) fn ask_peers(&self, host: &mut dyn Host, st: &mut LeaderState, now: u64) {
        let peers = &self.config.peers;
        for ask in st.pullers.due(peers, now, self.timeout()) {
            let mut headers = vec![(crate::headers::DESTINATION.into(), ask.addr.clone())];
            if let Some(token) = &peers.token {
                headers.push((peers::TOKEN_HEADER.into(), token.clone()));
            }
            let call = HttpCall {
                cluster: self.config.poll_cluster.clone(),
                method: "GET",
                path: ask.path,
                authority: ask.addr.clone(),
                headers,
                body: None,
                timeout_ms: self.timeout(),
            };
            let token = host.http_call(&call);
            if token.is_none() {
                host.count(Counter::PeerSyncFailures, 1);
            }
            st.pullers.sent(&ask.addr, token, now);
        }
    }

    /// The leader's gauges, per configured pool (every pool has its series, empty or not), and
    /// each pod's learned TTFT model.
    pub(super) fn publish_gauges(&self, host: &mut dyn Host, table: &LoadTable, now: u64) {
        let stale_after = self.config.stale_after_ms;
        for pool in &self.config.pools {
            let labels = [
                (metrics::POOL, pool.name.as_str()),
                (metrics::ROLE, metrics::role_label(pool.role)),
            ];
            let members = || table.pods.iter().filter(|p| p.pool == pool.name);
            let in_state = |wanted: Health| {
                members().filter(move |p| health_of(p, now, stale_after) == wanted)
            };
            let (fresh, stale) = (
                in_state(Health::Fresh).count(),
                in_state(Health::Stale).count(),
            );
            // Only fresh figures: a stale pod's queue is an old reading, a down pod's none.
            let fresh_sum = |figure: fn(&PodMetrics) -> f64| -> u64 {
                in_state(Health::Fresh)
                    .map(|p| figure(&p.metrics))
                    .sum::<f64>()
                    .round() as u64
            };
            host.gauge_in(Gauge::PodsKnown, &labels, members().count() as u64);
            host.gauge_in(Gauge::PodsHealthy, &labels, (fresh + stale) as u64);
            host.gauge_in(Gauge::PodsStale, &labels, stale as u64);
            host.gauge_in(
                Gauge::PodsEjected,
                &labels,
                members().filter(|p| p.ejected_until_ms > now).count() as u64,
            );
            host.gauge_in(
                Gauge::PoolRequestsWaiting,
                &labels,
                fresh_sum(|m| m.waiting),
            );
            host.gauge_in(
                Gauge::PoolRequestsRunning,
                &labels,
                fresh_sum(|m| m.running),
            );
            host.gauge_in(
                Gauge::PoolKvCacheUsagePermille,
                &labels,
                fresh_sum(|m| m.kv_usage * 1000.0),
            );
        }
        host.gauge(
            Gauge::IndexEntries,
            self.router.affinity.index_entries() as u64,
        );
        self.publish_pod_gauges(host, table);
    }

    /// Each pod's learned cost and the seat cap the overload guard uses for it.
    fn publish_pod_gauges(&self, host: &mut dyn Host, table: &LoadTable) {
        let pool_costs = self.router.costs.pool_costs();
        let settings = self.config.costs();
        for pod in &table.pods {
            let costs = &self.router.costs;
            let cost = costs.cost_in(&settings, &pod.addr, pod.role, &pool_costs);
            let labels = [
                (metrics::POOL, pod.pool.as_str()),
                (metrics::ROLE, metrics::role_label(pod.role)),
                (metrics::POD, pod.addr.as_str()),
            ];
            host.gauge_in(
                Gauge::PodTtftOverheadUs,
                &labels,
                (cost.overhead_ms * 1e3).max(0.0) as u64,
            );
            // The per-token cost is µs; its inverse, tokens per second, is an integer worth reading.
            let tokens_per_second = if cost.us_per_token > 0.0 {
                1e6 / cost.us_per_token
            } else {
                0.0
            };
            host.gauge_in(
                Gauge::PodPrefillTokensPerSecond,
                &labels,
                tokens_per_second.round() as u64,
            );
            host.gauge_in(
                Gauge::PodFitSamples,
                &labels,
                self.router.costs.fit_samples(&pod.addr).max(0.0).round() as u64,
            );
            let seats = self.config.overload_guard.seats(pod.seats);
            host.gauge_in(Gauge::PodSeats, &labels, u64::from(seats.unwrap_or(0)));
        }
    }

    pub fn on_call_response(
        &mut self,
        host: &mut dyn Host,
        token: u32,
        status: u32,
        body: &[u8],
        now: u64,
    ) {
        let Some(st) = self.leader.as_mut() else {
            return;
        };
        let pulled = st.pullers.on_answer(token, status, body, st.epoch);
        if !matches!(pulled, peers::Pulled::Unknown) {
            match pulled {
                peers::Pulled::Fresh(answer) => {
                    // Another replica's work, as its row; a write that loses every race waits for
                    // the next answer, a pull later.
                    let row = peers::replica_row(answer.epoch);
                    put_board_row(host, row, now, &answer.work, None, |_| {});
                    for mut page in answer.pages {
                        let blocks: usize = page.observations.iter().map(|o| o.hashes.len()).sum();
                        host.count(Counter::PeerBlocksLearned, blocks as u64);
                        self.router.affinity.apply_changes(&page);
                        page.from_peer = true;
                        st.pages.push(Change::FromPeer(page));
                    }
                }
                peers::Pulled::Itself => {
                    log::info!(
                        "kvroute: a configured replica is this Envoy itself; not asking it again"
                    )
                }
                peers::Pulled::Failed => {
                    host.count(Counter::PeerSyncFailures, 1);
                    log::debug!(
                        "kvroute: a gateway replica's pages were unreadable (status {status})"
                    );
                }
                peers::Pulled::Unknown => {}
            }
        } else if st.admin_call == Some(token) {
            st.admin_call = None;
            if status == 200 {
                st.book.on_admin_clusters(&self.config, body);
                if let Some(cluster) = &self.config.peers.cluster {
                    if let Some(members) = discovery::cluster_members(body, cluster) {
                        st.pullers.set_members(&members);
                    }
                }
            } else {
                log::warn!("kvroute: admin /clusters answered {status}");
            }
        } else if let Some(addr) = st.model_polls.remove(&token) {
            let result = if status == 200 {
                PollResult::Answered(status, body)
            } else {
                PollResult::Failed
            };
            if !st.book.on_models(&addr, result) {
                log::debug!("kvroute: {addr} /v1/models unreadable (status {status}); its metrics' model label alone names it");
            }
        } else if let Some((addr, sent_ms, ours)) = st.polls.remove(&token) {
            let timeout = self.config.poll_timeout_ms;
            // Envoy answers a call that timed out with its own 504 (and a refused or reset one
            // with a 503, at once): only the time it took tells a late pod from a failing one.
            let elapsed = now.saturating_sub(sent_ms);
            let result = match status {
                0 | 504 if crate::health::poll_timed_out(elapsed, timeout) => PollResult::TimedOut,
                0 => PollResult::Failed,
                _ => PollResult::Answered(status, body),
            };
            let late = matches!(result, PollResult::TimedOut);
            let fresh = st.book.on_poll(&addr, result, ours, now);
            count_poll_findings(host, &st.book, &addr);
            if late {
                host.count(Counter::PollsLate, 1);
                log::debug!("kvroute: poll of {addr} timed out: its figures are stale");
            } else if !fresh {
                host.count(Counter::PollFailures, 1);
                log::debug!("kvroute: poll of {addr} failed (status {status})");
            }
        }
    }
}

/// Counts what a pod's last poll showed beyond its load, per pod: a restart, samples that cannot
/// be true.
fn count_poll_findings(host: &mut dyn Host, book: &Leader, addr: &str) {
    let labels = |pool, role| {
        [
            (metrics::POOL, pool),
            (metrics::ROLE, metrics::role_label(role)),
            (metrics::POD, addr),
        ]
    };
    if let Some((pool, role)) = book.restarted(addr) {
        host.count_in(Counter::PodRestarts, &labels(pool, role), 1);
    }
    if let Some((pool, role, n)) = book.implausible(addr) {
        host.count_in(
            Counter::PodReportedImplausible,
            &labels(pool, role),
            u64::from(n),
        );
    }
}
