//! lockstep-agent: runs fio-equivalent workloads on the volumes of one node.
//!
//! Map of the crate, one module per concept. The job model, job files, limits, stats, reports,
//! `confine` and `registry` are shared with the coordinator and live in `lockstep-core`
//! (`core/src/`); they are re-exported here at their old paths.
//! - `job`: a job's options, typed, with fio's meanings and defaults (the contract between parts);
//! - `units`: fio's number syntax (`4k`, `1g`, `10%`, `30s`);
//! - `jobfile`: fio job files (INI, `[global]`, `include`, `${ENV}`) into `JobSpec`s, with errors
//!   that name file, line and option;
//! - `workload`: the pure generator of the next IO (direction, file, offset, length);
//! - `rate`: the pure open-loop scheduler (intended issue times for `rate_iops`/`rate`);
//! - `engine/`: the small engine contract (queue, commit, reap) and its implementations:
//!   io_uring, pread/pwrite worker threads, null;
//! - `job::errpolicy`: fio's `continue_on_error`/`ignore_error`: which IO and verify errors a job
//!   counts and goes on after;
//! - `stats`: latency histograms (HdrHistogram, 3 significant digits) and counters;
//! - `confine`: where a job may touch files, and opens that cannot leave a volume;
//! - `layout`: target files: safety checks, creation and pre-fill with progress, clean-up;
//! - `limits`: hard limits checked before anything runs (fio's `numjobs`/`iodepth` bounds,
//!   small regular job files);
//! - `budget`: estimates before IO (memory, threads, open files, disk) against the host's;
//! - `runner`: runs jobs on threads, with ramp, runtime, stonewall groups and intervals;
//! - `report/`: the results structure and one exporter per format;
//! - `standalone`: `lockstep-agent run JOBFILE`, like `fio JOBFILE`; `progress`: bars and live lines;
//! - `verify`: exact data verification (block headers, generations of acknowledged writes,
//!   saved state, lost/stale/corrupt blocks by offset);
//! - `fault/`: faults in the agent's own IO path (caps, EBS credit models, ...);
//! - `mirror/`: mirrored pairs: a primary's writes written again by a backup agent;
//! - `daemon/`: `lockstep-agent serve`, the gRPC service the coordinator drives;
//! - `registry`: membership in etcd (a key under a lease that disappears when the agent dies);
//! - `simulate/`: `lockstep-agent simulate`, many simulated agents speaking the real protocol in
//!   one process, to measure the coordinator at cluster scale.

// Shared with the coordinator, in `lockstep-core` (`core/src/`); re-exported at their old paths.
pub use lockstep_core::{confine, job, jobfile, limits, registry, report, stats, units};

pub mod budget;
pub mod daemon;
pub mod engine;
pub mod fault;
pub mod layout;
pub mod mirror;
pub mod progress;
pub mod rate;
pub mod runner;
pub mod simulate;
pub mod standalone;
pub mod verify;
pub mod workload;

#[cfg(test)]
mod jobfile_fuzz;
