//! lockstep: the coordinator and CLI.
//!
//! Map of the crate:
//! - `timeline`: per-volume, per-interval figures of a run (the report's time series and the
//!   chokepoint finder's input);
//! - `clock`: clock offsets (lowest round trip wins) and the achieved start skew;
//! - `merge`: interval reports into volume, node and cluster results, from merged histograms;
//! - `results`: the one results structure of a run (`results.json`);
//! - `client`: connecting to an agent (plain or mutual TLS; versions checked, clock probes);
//! - `certs`: `lockstep certs`, a test CA and certificates for mutual TLS;
//! - `run`: a run on agents: prepare, synchronized start, streams, lost agents, abort;
//! - `local`: `--local N`, agents as child processes on this machine;
//! - `signals`: SIGINT and SIGTERM as an orderly stop (partial results, 130 or 143);
//! - `live`: the live view (progress bar, or log lines when not on a terminal);
//! - `cli`: the `lockstep` commands behind `main.rs`;
//! - `metrics`: Prometheus metrics of a running coordinator;
//! - `hlog`: the raw interval histograms in HdrHistogram's log format;
//! - `report/`: exporters (text, fio JSON with client_stats, CSV timeline);
//! - `registry`: live agents from etcd (`lockstep agents`, `lockstep run --etcd`);
//! - `leader`: coordinators as a service: etcd election, run state in etcd, takeover;
//! - `plan`, `profiles`: plans in TOML, resolved against the run's agents; built-in workloads;
//! - `curve`: curve mode (vdbench `iorate=curve`): the maximum, then steps at percentages of it;
//!   its series loop (one complete run per step) serves sweep mode too;
//! - `sweep`: sweep mode: one closed-loop run per iodepth (or numjobs), latency against
//!   outstanding IOs, and where more of them stop buying IOPS (Little's law);
//! - `drill`: pure analysis of what each injected fault did (baseline, during, after, recovery);
//! - `chokepoint`: pure analysis of a run's per-volume timeline that names the volume (or node)
//!   holding the cluster back, with evidence.
pub mod certs;
pub mod chokepoint;
pub mod cli;
pub mod client;
pub mod clock;
pub mod curve;
pub mod drill;
pub mod hlog;
pub mod leader;
pub mod live;
pub mod local;
pub mod merge;
pub mod metrics;
pub mod plan;
pub mod profiles;
pub mod registry;
pub mod report;
pub mod results;
pub mod run;
/// Labeled synthetic runs for the chokepoint finder's tests and its evaluation example: test
/// support, not part of the shipped library (the `scenarios` feature, which the example
/// requires, builds it outside tests).
#[cfg(any(test, feature = "scenarios"))]
pub mod scenario;
pub mod signals;
pub mod sweep;
pub mod timeline;
