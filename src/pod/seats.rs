//! The engine's cap on requests running at once, learned from its polls.
//!
//! vLLM (`--max-num-seqs`), SGLang (`--max-running-requests`) and llama.cpp (`--parallel`) cap
//! the requests they run at once, and none exports the figure. At the cap a request waits for a
//! decode to end, which no prefill term of the prediction shows; the overload guard (the
//! scheduler's picker) is for that wait, and without the cap it never fires. Unconfigured
//! (`overload_guard.max_running`), requests piled up on the pods holding a tenant's prompt,
//! waiting for seats, while another pod had seats free (docs/results.md, "Overload and flow
//! control": 60–90 requests waiting on each of two pods, a third with 0–2).
//!
//! **What a pod at its cap shows.** At every poll: requests waiting, the same number running as
//! at the poll before, and tokens generated since (it works, and each request that ends is
//! replaced from the queue). Other queues show otherwise: a prefill that stalls the decodes
//! beside it generates nothing while it runs (the tenants cells' whole-prompt engines); a queue
//! behind a token budget is admitted as the budget frees, and the decodes that end lower the
//! count. So a cap is learned after [`STREAK`] polls in a row that each show requests waiting,
//! tokens generated since the poll before and the same running count, the most the pod has run
//! since it started. It is dropped as soon as the pod runs more (a limit that was the KV cache's,
//! since freed, or a cap raised), and with everything else on a restart.
//!
//! A pod running into its KV cache's limit shows the same as one at its seat cap, and for the
//! guard it is the same thing: its queue waits for decodes to end.

use super::prom::PodMetrics;

/// Polls in a row that must show the cap (1 s at the default 200 ms poll interval).
pub const STREAK: u32 = 5;

/// One pod's learned seat cap (see the module header).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SeatCap {
    learned: Option<u32>,
    /// The most requests the pod has been seen running.
    most_running: u32,
    /// The running count of the current streak, and its length.
    streak_at: u32,
    streak: u32,
    /// Tokens generated as of the last poll that reported them.
    generated: Option<f64>,
}

impl SeatCap {
    /// The learned cap, if the polls have shown one.
    pub fn seats(&self) -> Option<u32> {
        self.learned
    }

    /// Reads one poll's page.
    pub fn observe(&mut self, page: &PodMetrics) {
        let running = if page.running.is_finite() {
            page.running.max(0.0).round() as u32
        } else {
            0
        };
        let progressed = matches!(
            (self.generated, page.generated_tokens),
            (Some(before), Some(now)) if now > before
        );
        self.generated = page.generated_tokens;
        if self.learned.is_some_and(|cap| running > cap) {
            self.learned = None;
        }
        self.most_running = self.most_running.max(running);
        let held_back =
            page.waiting >= 1.0 && running > 0 && running == self.most_running && progressed;
        if !held_back {
            self.streak = 0;
            return;
        }
        if running == self.streak_at && self.streak > 0 {
            self.streak += 1;
        } else {
            self.streak_at = running;
            self.streak = 1;
        }
        if self.streak >= STREAK {
            self.learned = Some(running);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poll(waiting: f64, running: f64, generated: f64) -> PodMetrics {
        PodMetrics {
            waiting,
            running,
            generated_tokens: Some(generated),
            ..PodMetrics::default()
        }
    }

    #[test]
    fn a_pod_that_keeps_requests_waiting_while_it_runs_the_same_number_and_generates_has_that_cap()
    {
        let mut cap = SeatCap::default();
        let mut generated = 0.0;
        // Below the cap: nothing waits.
        for running in [2.0, 5.0, 8.0, 6.0] {
            generated += 50.0;
            cap.observe(&poll(0.0, running, generated));
        }
        assert_eq!(cap.seats(), None);
        for n in 1..=STREAK {
            generated += 80.0;
            cap.observe(&poll(12.0, 8.0, generated));
            assert_eq!(cap.seats(), (n >= STREAK).then_some(8), "poll {n}");
        }
        // Running more drops it at once.
        cap.observe(&poll(3.0, 9.0, generated + 80.0));
        assert_eq!(cap.seats(), None);
    }

    #[test]
    fn queues_that_are_no_seat_cap_teach_none() {
        // A whole-prompt prefill stalling the decodes beside it: requests wait, the running count
        // holds, and nothing is generated while it runs.
        let mut stalled = SeatCap::default();
        for _ in 0..3 * STREAK {
            stalled.observe(&poll(4.0, 3.0, 1000.0));
        }
        assert_eq!(stalled.seats(), None);
        // Decodes end and prefills are admitted: the count moves.
        let mut moving = SeatCap::default();
        let mut generated = 0.0;
        for i in 0..3 * STREAK {
            generated += 40.0;
            moving.observe(&poll(2.0, f64::from(3 + i % 3), generated));
        }
        assert_eq!(moving.seats(), None);
        // Held at fewer than the pod has run before (a lull below its cap): no cap.
        let mut below = SeatCap::default();
        below.observe(&poll(0.0, 10.0, 0.0));
        let mut generated = 0.0;
        for _ in 0..3 * STREAK {
            generated += 40.0;
            below.observe(&poll(2.0, 6.0, generated));
        }
        assert_eq!(below.seats(), None);
        // An engine that exports no generated tokens: never learned.
        let mut silent = SeatCap::default();
        for _ in 0..3 * STREAK {
            silent.observe(&PodMetrics {
                waiting: 5.0,
                running: 4.0,
                ..PodMetrics::default()
            });
        }
        assert_eq!(silent.seats(), None);
    }
}
