//! One run reduced to what the scenarios' targets are about, beyond the standard report: the
//! requests completed within the sending window after the warm-up, TTFT and inter-token latency
//! over every request, and for the interference scenario the streaming decodes and the long prompts
//! apart, since the claim is about what the long prompts do to the streams.

use serde::Serialize;

use crate::report::{RunReport, Summary};
use crate::workload::{InterferenceParams, WorkloadKind, WorkloadSpec};

/// Figures of one run beyond [`RunReport`]'s: per request class, and what finished in the window.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Figures {
    /// Simulated seconds from the end of the warm-up to the end of the sending window.
    pub window_s: f64,
    /// Requests started after the warm-up that finished successfully within the window.
    pub completed_in_window: usize,
    /// The same per simulated second of the window.
    pub completed_per_s: f64,
    /// Output tokens of those requests per simulated second of the window.
    pub output_tokens_per_s: f64,
    /// TTFT of every successful request.
    pub ttft_ms: Summary,
    /// Inter-token latencies of every successful request, pooled.
    pub itl_ms: Summary,
    /// Interference only: the streaming decodes' inter-token latencies, pooled.
    pub stream_itl_ms: Option<Summary>,
    /// Interference only: the streaming decodes' TTFT.
    pub stream_ttft_ms: Option<Summary>,
    /// Interference only: the long prompts' TTFT.
    pub long_ttft_ms: Option<Summary>,
    /// Interference only: the long prompts' end-to-end latency.
    pub long_e2e_ms: Option<Summary>,
}

impl Figures {
    /// From a report built with `keep_records` (records in simulated seconds, after the warm-up).
    pub fn of(report: &RunReport, spec: &WorkloadSpec, warmup_s: f64) -> Self {
        let window_s = (spec.duration_s - warmup_s).max(0.0);
        let ok: Vec<_> = report.records.iter().filter(|r| r.sent && r.ok).collect();
        let in_window: Vec<_> = ok
            .iter()
            .filter(|r| r.e2e_s.is_some_and(|e| r.start_s + e <= window_s))
            .collect();
        let per_s = |n: f64| if window_s > 0.0 { n / window_s } else { 0.0 };
        let ms = |s: f64| s * 1000.0;
        let ttft = |f: &dyn Fn(&str) -> bool| {
            let v: Vec<f64> = ok
                .iter()
                .filter(|r| f(&r.session))
                .filter_map(|r| r.ttft_s)
                .map(ms)
                .collect();
            Summary::of(&v)
        };
        let itl = |f: &dyn Fn(&str) -> bool| {
            let v: Vec<f64> = ok
                .iter()
                .filter(|r| f(&r.session))
                .flat_map(|r| r.itl_s.iter().copied())
                .map(ms)
                .collect();
            Summary::of(&v)
        };
        let e2e = |f: &dyn Fn(&str) -> bool| {
            let v: Vec<f64> = ok
                .iter()
                .filter(|r| f(&r.session))
                .filter_map(|r| r.e2e_s)
                .map(ms)
                .collect();
            Summary::of(&v)
        };
        let all = |_: &str| true;
        let interference = matches!(spec.workload, WorkloadKind::Interference(_));
        let stream = |s: &str| InterferenceParams::is_stream_session(s);
        let long = |s: &str| InterferenceParams::is_long_session(s);
        Figures {
            window_s,
            completed_in_window: in_window.len(),
            completed_per_s: per_s(in_window.len() as f64),
            output_tokens_per_s: per_s(in_window.iter().map(|r| r.output_tokens as f64).sum()),
            ttft_ms: ttft(&all),
            itl_ms: itl(&all),
            stream_itl_ms: interference.then(|| itl(&stream)),
            stream_ttft_ms: interference.then(|| ttft(&stream)),
            long_ttft_ms: interference.then(|| ttft(&long)),
            long_e2e_ms: interference.then(|| e2e(&long)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::scenario::Setup;
    use super::super::test_support::{record, row};
    use super::super::topology::Topology;
    use crate::driver::RequestRecord;

    #[test]
    fn figures_split_streams_from_long_prompts_and_count_the_window() {
        let records = [
            record("stream-0", 0.0, 0.2, &[0.02, 0.9, 0.02], 1.0),
            record("stream-3", 70.0, 0.3, &[0.03], 20.0),
            record("long-1", 5.0, 4.0, &[0.02], 4.1),
            RequestRecord {
                ok: false,
                ..record("long-2", 1.0, 9.0, &[], 9.0)
            },
        ];
        let r = row(Setup::plain(Topology::Aggregated { pods: 4 }), &records);
        let f = &r.figures;
        assert_eq!(f.window_s, 80.0);
        // stream-3 ends at 90 s, after the 80 s window; the failed request never counts.
        assert_eq!(f.completed_in_window, 2);
        let s = f.stream_itl_ms.unwrap();
        assert_eq!(s.count, 4);
        assert_eq!(s.p50, Some(25.0));
        assert_eq!(f.long_ttft_ms.unwrap().count, 1);
        assert_eq!(f.long_ttft_ms.unwrap().p50, Some(4000.0));
        assert_eq!(f.stream_ttft_ms.unwrap().count, 2);
        assert_eq!(f.ttft_ms.count, 3);
    }
}
