//! lockstep: the coordinator and CLI.
//!
//! The crate is a one-way pipeline; each folder is a stage and imports only the stages listed
//! before it (docs/architecture.md has the diagram and the rules):
//! - `plan/`: plans in TOML, resolved against the run's agents; built-in workload profiles;
//! - `results/`: the one results structure of a run (`results.json`) and what builds it:
//!   `timeline` (per-volume, per-interval figures), `merge` (interval reports into volume, node
//!   and cluster results, from merged histograms), `hlog` (the raw interval histograms in
//!   HdrHistogram's log format), `clock` (clock offsets and the achieved start skew, from
//!   probes), and the drill, curve and sweep report types;
//! - `orchestrate/`: running a plan on agents: `client` (connections, plain or mutual TLS,
//!   versions checked, clock probes), `run` (prepare,
//!   synchronized start, interval streams, lost agents, abort), `local` (`--local N` agents as
//!   child processes), `registry` (live agents from etcd), `signals` (SIGINT/SIGTERM as stops);
//! - `analysis/`: pure analysis of results: `chokepoint` (the volume or node holding the cluster
//!   back, with evidence), `drill` (what each fault did), `curve` and `sweep` (figures and the
//!   knee);
//! - `export/`: one exporter per format, reading only results: `text`, `fio` (fio JSON with
//!   `client_stats`), `csv`, the results directory, and `metrics` (Prometheus);
//! - `app/`: the application layer behind `main.rs`: a run request, single runs, series of runs
//!   for curve and sweep (`series`, `curve`, `sweep`), the live view, objectives, exit codes,
//!   `lockstep certs`;
//! - `service/`: coordinators as a service (`leader`: etcd election, run state in etcd,
//!   takeover), which calls `app`;
//! - `scenario`: synthetic timelines for the chokepoint finder's tests and evaluation (test
//!   support: built for tests and with the `scenarios` feature only).
pub mod analysis;
pub mod app;
pub mod export;
pub mod orchestrate;
pub mod plan;
pub mod results;
/// Labeled synthetic runs for the chokepoint finder's tests and its evaluation example: test
/// support, not part of the shipped library (the `scenarios` feature, which the example
/// requires, builds it outside tests).
#[cfg(any(test, feature = "scenarios"))]
pub mod scenario;
pub mod service;
