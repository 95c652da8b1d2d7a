//! Test fixtures shared by the figures and verdict tests: one successful request record, the
//! interference spec the rows are built from, and a row built from records as a run would build it.

use std::collections::BTreeMap;

use super::figures::Figures;
use super::run::PdRow;
use super::scenario::{scenario_spec, Setup};
use crate::driver::RequestRecord;
use crate::report::RunReport;
use crate::workload::{InterferenceParams, Load, WorkloadKind, WorkloadSpec};

pub(super) fn record(
    session: &str,
    start_s: f64,
    ttft_s: f64,
    itl_s: &[f64],
    e2e_s: f64,
) -> RequestRecord {
    RequestRecord {
        session: session.to_owned(),
        start_s,
        ttft_s: Some(ttft_s),
        itl_s: itl_s.to_vec(),
        e2e_s: Some(e2e_s),
        output_tokens: itl_s.len() as u64 + 1,
        status: Some(200),
        ok: true,
        sent: true,
        ..RequestRecord::default()
    }
}

pub(super) fn interference_spec() -> WorkloadSpec {
    let mut spec = scenario_spec(
        WorkloadKind::Interference(InterferenceParams::default()),
        Load::Open { rate: 1.0 },
        100.0,
        1,
    );
    spec.keep_records = true;
    spec
}

pub(super) fn row(setup: Setup, records: &[RequestRecord]) -> PdRow {
    let spec = interference_spec();
    let report = RunReport::build(&spec, 1.0, 100.0, records, Vec::new());
    PdRow {
        label: setup.label(),
        figures: Figures::of(&report, &spec, 20.0),
        setup,
        kvroute_stats: BTreeMap::new(),
        pod_counters: BTreeMap::new(),
        report,
    }
}
