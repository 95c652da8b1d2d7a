//! Test tools for kvroute: the model-server simulator (`sim`), the benchmark driver (`bench`) and the
//! harness that starts real Envoy with the built plugin in front of simulated pods (`harness`).
pub mod bench;
pub mod harness;
pub mod sim;
