//! What a drill found: per fault, each affected volume's and the cluster's latency before,
//! during and after it, and when latency recovered. Produced by the drill analysis, rendered by
//! the exporters; part of the results model, so it imports no analysis.

use lockstep_proto::histogram::SparseHistogram;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrillOptions {
    /// Longest baseline window before a fault.
    pub baseline_ms: u64,
    /// Longest window after a fault.
    pub after_ms: u64,
    /// An interval is back to normal when its p99 is at most `tolerance` x the baseline p99 ...
    pub tolerance: f64,
    /// ... or at most `slack_us` above it (whichever is larger).
    pub slack_us: f64,
    /// Intervals in a row that must be back to normal.
    pub consecutive: u32,
}

impl Default for DrillOptions {
    fn default() -> Self {
        DrillOptions {
            baseline_ms: 10_000,
            after_ms: 10_000,
            tolerance: 1.5,
            slack_us: 100.0,
            consecutive: 3,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DrillReport {
    pub options: DrillOptions,
    pub interval_ms: u64,
    pub faults: Vec<FaultDrill>,
}

/// One fault (one kind, one window) and its effect.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FaultDrill {
    pub fault: String,
    /// ms since the run's synchronized start (the earliest of its volumes' recorded starts).
    pub start_ms: u64,
    /// `None`: until the end of the run.
    pub end_ms: Option<u64>,
    pub volumes: Vec<DrillTarget>,
    /// Every volume of the run merged (not only the affected ones): what the cluster felt.
    pub cluster: DrillTarget,
    /// What the agents said happened (`node: detail`, e.g. an exec command's exit status),
    /// once per node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DrillTarget {
    /// `node/volume`, or `cluster`.
    pub target: String,
    pub baseline: Option<WindowStats>,
    pub during: Option<WindowStats>,
    pub after: Option<WindowStats>,
    pub recovery: Recovery,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WindowStats {
    pub start_ms: u64,
    pub end_ms: u64,
    pub intervals: u32,
    /// IOs completed, with or without error.
    pub ios: u64,
    pub errors: u64,
    pub iops: f64,
    /// Latency from the actual issue.
    pub lat: Percentiles,
    /// Latency from the intended issue (open-loop workloads only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lat_intended: Option<Percentiles>,
}

impl WindowStats {
    /// The latency a drill is judged by: from the intended issue when there is one.
    pub fn judged(&self) -> &Percentiles {
        self.lat_intended.as_ref().unwrap_or(&self.lat)
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// IOs in the histogram (successful completions).
    pub n: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
}

impl Percentiles {
    pub fn of(h: &SparseHistogram) -> Self {
        Percentiles {
            n: h.len(),
            p50_ns: h.value_at_percentile(50.0),
            p99_ns: h.value_at_percentile(99.0),
            p999_ns: h.value_at_percentile(99.9),
            max_ns: h.max(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Recovery {
    /// The p99 an interval must stay at or below to count as back to normal.
    pub threshold_ns: Option<u64>,
    /// From when latency stayed within the tolerance (ms since the start).
    pub recovered_at_ms: Option<u64>,
    /// `recovered_at_ms` minus the fault's end.
    pub recovery_ms: Option<u64>,
    /// Why there is no figure, when there is none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
}
