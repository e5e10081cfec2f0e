//! Reporting: one results structure (`RunReport`) and one exporter per format.
//!
//! The measuring code never prints; it fills a `RunReport`, and each format renders it:
//! - `normal`: the human summary, laid out like fio's so fio users can read it line by line;
//! - `fio_json`: fio's `--output-format=json` structure and key names, so fio tooling reads it.

use std::time::{Duration, SystemTime};

use crate::job::JobSpec;
use crate::stats::JobStats;

pub mod fio_json;
pub mod normal;

/// One job clone (one of `numjobs`) and what it measured.
#[derive(Debug, Clone)]
pub struct JobReport {
    pub spec: JobSpec,
    /// Which of the job's `numjobs` clones this is (0-based).
    pub clone: u32,
    /// fio's group id: a new group begins at each job with `stonewall`.
    pub groupid: u32,
    pub stats: JobStats,
    /// Why the job stopped early, if it did (e.g. "No space left on device writing /x/y").
    pub error: Option<String>,
    /// When the timed part of the job began.
    pub started: SystemTime,
}

/// A whole standalone run: every job, in job-file order.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub jobs: Vec<JobReport>,
    pub started: SystemTime,
    pub elapsed: Duration,
}

/// The version string reported where fio reports "fio version".
pub fn version_string() -> String {
    format!("lockstep-{}", env!("CARGO_PKG_VERSION"))
}
