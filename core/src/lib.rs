//! lockstep-core: what the agent and the coordinator share, so that neither reaches into the
//! other (`docs/architecture.md`, "The crates").
//!
//! Map of the crate:
//! - `job`: a job's options, typed, with fio's meanings and defaults (the contract between parts);
//!   `job::errpolicy`: which IO and verify errors a job counts and goes on after;
//! - `units`: fio's number syntax (`4k`, `1g`, `10%`, `30s`);
//! - `jobfile`: fio job files (INI, `[global]`, `include`, `${ENV}`) into `JobSpec`s, with errors
//!   that name file, line and option;
//! - `confine`: where a job may touch files (a job's `Scope`), and opens that cannot leave a volume;
//! - `limits`: hard limits checked before anything runs, and small regular text files;
//! - `fault/`: the typed fault spec and its validation, the gate contract, token buckets and the
//!   one EBS credit model (the agent throttles with it, the chokepoint finder forecasts with it);
//! - `stats`: latency histograms, counters and interval summaries;
//! - `report/`: the results structure of a job run and its exporters (fio JSON, fio's normal text);
//! - `verify`: the verification report (lost, stale, corrupt blocks);
//! - `atomic_file`: output files replaced atomically;
//! - `tls`: mutual TLS setup and which calls a peer certificate may make; `metrics`: the
//!   `/metrics` endpoint; `host`: this machine's name;
//! - `registry`: agents' membership in etcd (key layout, leases).

pub mod atomic_file;
pub mod confine;
pub mod fault;
pub mod host;
pub mod job;
pub mod jobfile;
pub mod limits;
pub mod metrics;
pub mod registry;
pub mod report;
pub mod stats;
pub mod tls;
pub mod units;
pub mod verify;
