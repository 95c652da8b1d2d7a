//! A fake host for native tests: the shared store of one Envoy process (shared data with
//! compare-and-swap, queues) that several VMs' [`FakeHost`] handles share, with a clock the test
//! moves, recorded HTTP calls, counted metrics, and switches to lose compare-and-swap races.

use crate::metrics::{Counter, Gauge, Histogram, Labels};
use crate::port::{Host, HttpCall, WriteRefused};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::rc::Rc;

#[derive(Debug, Default)]
pub struct Store {
    /// key → (value, CAS token).
    pub data: HashMap<String, (Vec<u8>, u32)>,
    next_cas: u32,
    queues: HashMap<String, u32>,
    queue_items: HashMap<u32, VecDeque<Vec<u8>>>,
    /// Compare-and-swap writes refused on purpose before the next one goes through.
    pub lose_cas_races: usize,
}

/// One VM's view of the process: the shared store plus its own clock, calls and metrics.
#[derive(Debug, Clone)]
pub struct FakeHost {
    pub store: Rc<RefCell<Store>>,
    pub now_us: u64,
    pub calls: Vec<(u32, HttpCall)>,
    next_call: u32,
    pub counters: HashMap<Series, u64>,
    pub gauges: HashMap<Series, u64>,
    pub histograms: HashMap<Series, Vec<u64>>,
    /// The decision fields exported for the proxy's logs, by name: the last value written.
    pub decision: HashMap<String, String>,
    /// Every port call made through this handle, by kind (`clock`, `shared_get`, …): what the
    /// same calls would cost as Proxy-Wasm host calls (`examples/request_cost.rs census`).
    pub census: RefCell<BTreeMap<&'static str, u64>>,
}

/// One series: the metric's name and its labels, in order.
pub type Series = (&'static str, Vec<(&'static str, String)>);

fn series(name: &'static str, labels: &Labels<'_>) -> Series {
    (
        name,
        labels.iter().map(|(l, v)| (*l, (*v).to_string())).collect(),
    )
}

/// Whether a series' labels have this value for this label.
fn has(labels: &[(&'static str, String)], label: &str, value: &str) -> bool {
    labels.iter().any(|(l, v)| *l == label && v == value)
}

impl FakeHost {
    pub fn new(store: &Rc<RefCell<Store>>) -> FakeHost {
        FakeHost {
            store: Rc::clone(store),
            now_us: 1_000_000_000,
            calls: Vec::new(),
            next_call: 0,
            counters: HashMap::new(),
            gauges: HashMap::new(),
            histograms: HashMap::new(),
            decision: HashMap::new(),
            census: RefCell::new(BTreeMap::new()),
        }
    }

    fn tally(&self, kind: &'static str) {
        *self.census.borrow_mut().entry(kind).or_default() += 1;
    }

    /// Takes the census of port calls so far.
    pub fn take_census(&self) -> BTreeMap<&'static str, u64> {
        std::mem::take(&mut *self.census.borrow_mut())
    }

    pub fn advance_ms(&mut self, ms: u64) {
        self.now_us += ms * 1000;
    }

    /// A counter summed over all its series.
    pub fn counter(&self, c: Counter) -> u64 {
        self.counters
            .iter()
            .filter(|((name, _), _)| *name == c.name())
            .map(|(_, v)| v)
            .sum()
    }

    /// A counter summed over its series with this label value.
    pub fn counter_where(&self, c: Counter, label: &str, value: &str) -> u64 {
        self.counters
            .iter()
            .filter(|((name, labels), _)| *name == c.name() && has(labels, label, value))
            .map(|(_, v)| v)
            .sum()
    }

    /// A gauge summed over its series (a per-pool gauge: the gateway's total).
    pub fn gauge_sum(&self, g: Gauge) -> u64 {
        self.gauges
            .iter()
            .filter(|((name, _), _)| *name == g.name())
            .map(|(_, v)| v)
            .sum()
    }

    /// A gauge's series with this label value.
    pub fn gauge_where(&self, g: Gauge, label: &str, value: &str) -> Option<u64> {
        self.gauges
            .iter()
            .find(|((name, labels), _)| *name == g.name() && has(labels, label, value))
            .map(|(_, v)| *v)
    }

    /// Every sample recorded into a histogram, over all its series.
    pub fn histogram_samples(&self, h: Histogram) -> Vec<u64> {
        self.histograms
            .iter()
            .filter(|((name, _), _)| *name == h.name())
            .flat_map(|(_, v)| v.iter().copied())
            .collect()
    }

    /// A decision field as last exported (`None`: never).
    pub fn decision_field(&self, name: &str) -> Option<&str> {
        self.decision.get(name).map(String::as_str)
    }

    /// Takes the recorded calls (token, call).
    pub fn take_calls(&mut self) -> Vec<(u32, HttpCall)> {
        std::mem::take(&mut self.calls)
    }
}

impl Host for FakeHost {
    fn now_ms(&self) -> u64 {
        self.tally("clock");
        self.now_us / 1000
    }

    fn now_us(&self) -> u64 {
        self.tally("clock");
        self.now_us
    }

    fn shared_get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        self.tally("shared_get");
        match self.store.borrow().data.get(key) {
            Some((v, cas)) => (Some(v.clone()), Some(*cas)),
            None => (None, None),
        }
    }

    fn shared_set(
        &mut self,
        key: &str,
        value: &[u8],
        cas: Option<u32>,
    ) -> Result<(), WriteRefused> {
        self.tally("shared_set");
        let mut store = self.store.borrow_mut();
        if let Some(expected) = cas {
            if store.lose_cas_races > 0 {
                store.lose_cas_races -= 1;
                return Err(WriteRefused);
            }
            // Envoy: a CAS on an existing key must match; the first insert is not guarded.
            if let Some((_, current)) = store.data.get(key) {
                if *current != expected {
                    return Err(WriteRefused);
                }
            }
        }
        store.next_cas += 1;
        let token = store.next_cas;
        store.data.insert(key.to_string(), (value.to_vec(), token));
        Ok(())
    }

    fn queue_register(&mut self, name: &str) -> Option<u32> {
        let mut store = self.store.borrow_mut();
        let next = store.queues.len() as u32 + 1;
        let id = *store.queues.entry(name.to_string()).or_insert(next);
        store.queue_items.entry(id).or_default();
        Some(id)
    }

    fn queue_push(&mut self, queue: u32, message: &[u8]) -> bool {
        self.tally("queue_push");
        match self.store.borrow_mut().queue_items.get_mut(&queue) {
            Some(q) => {
                q.push_back(message.to_vec());
                true
            }
            None => false,
        }
    }

    fn queue_pop(&mut self, queue: u32) -> Option<Vec<u8>> {
        self.tally("queue_pop");
        self.store
            .borrow_mut()
            .queue_items
            .get_mut(&queue)?
            .pop_front()
    }

    fn http_call(&mut self, call: &HttpCall) -> Option<u32> {
        self.tally("http_call");
        self.next_call += 1;
        self.calls.push((self.next_call, call.clone()));
        Some(self.next_call)
    }

    fn export_decision_field(&mut self, name: &str, value: &str) {
        self.tally("filter_state");
        self.decision.insert(name.to_string(), value.to_string());
    }

    fn count_in(&mut self, counter: Counter, labels: &Labels<'_>, n: u64) {
        self.tally("metric");
        check_labels(counter.name(), counter.labels(), labels);
        *self
            .counters
            .entry(series(counter.name(), labels))
            .or_default() += n;
    }

    fn gauge_in(&mut self, gauge: Gauge, labels: &Labels<'_>, value: u64) {
        self.tally("metric");
        check_labels(gauge.name(), gauge.labels(), labels);
        self.gauges.insert(series(gauge.name(), labels), value);
    }

    fn histogram_in(&mut self, histogram: Histogram, labels: &Labels<'_>, value: u64) {
        self.tally("metric");
        check_labels(histogram.name(), histogram.labels(), labels);
        self.histograms
            .entry(series(histogram.name(), labels))
            .or_default()
            .push(value);
    }
}

/// A series is recorded with exactly the labels its metric declares, in order (tests fail on a
/// call site that forgets one).
fn check_labels(name: &str, declared: &[&str], labels: &Labels<'_>) {
    let given: Vec<&str> = labels.iter().map(|(l, _)| *l).collect();
    assert_eq!(given, declared, "labels of {name}");
}
