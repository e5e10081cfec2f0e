//! A run's timeline: per volume, per interval, the figures the report plots and the chokepoint
//! finder reads.
//!
//! Each point is computed by the coordinator from that interval's merged histogram of the volume
//! (both directions, latency from the intended issue time in open-loop mode, otherwise total
//! latency), so a point's percentiles are exact to HdrHistogram's 0.1% and never averages of
//! percentiles. Cross-volume or cross-interval percentiles are computed from the raw interval
//! histograms (`intervals.hlog`), not from these points. Latencies are microseconds as `f64`
//! to keep a 1,000-agent x 8-volume x 3,600-interval run in memory (about 100 bytes a point).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// Reporting interval of the run.
    pub interval_ms: u64,
    pub volumes: Vec<VolumeSeries>,
    /// Faults injected during the run, as recorded by the agents (for the report; the finder
    /// does not look at them, it must find the effect from the measurements alone).
    #[serde(default)]
    pub faults: Vec<FaultWindow>,
}

/// What the plan or the agent says a volume is: the agent's `--volume NAME=PATH,size=..,kind=..`
/// metadata or a plan's `ebs` fault (docs/plan.md, "Agents" and "Faults").
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VolumeModel {
    /// gp2, gp3, io1, io2, st1, sc1, local, or empty when unknown.
    pub kind: String,
    pub size_gib: f64,
    #[serde(default)]
    pub provisioned_iops: Option<u64>,
    #[serde(default)]
    pub provisioned_mib_s: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VolumeSeries {
    /// Agent (node) name.
    pub node: String,
    /// Volume name on that node.
    pub volume: String,
    /// Workload role in the plan: volumes of one role run the same workload and are peers.
    pub role: String,
    #[serde(default)]
    pub model: Option<VolumeModel>,
    /// IOs the workload keeps in flight on this volume when nothing holds it back
    /// (sum of iodepth x numjobs); 0 for open-loop (rate) workloads, where depth is not fixed.
    pub configured_depth: u32,
    /// Target IOPS of an open-loop workload on this volume, if any.
    #[serde(default)]
    pub target_iops: Option<f64>,
    /// When the coordinator lost this volume's agent (ms since the run's start), if it did.
    #[serde(default)]
    pub lost_at_ms: Option<u64>,
    pub points: Vec<VolumePoint>,
}

/// One interval of one volume. Index 0 of the arrays is read, 1 is write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct VolumePoint {
    /// End of the interval, ms since the run's synchronized start.
    pub t_ms: u64,
    /// Length of the interval (the last one may be short).
    pub len_ms: u64,
    pub ios: [u64; 2],
    pub bytes: [u64; 2],
    pub errors: [u64; 2],
    /// Time-averaged IOs in flight.
    pub outstanding: f64,
    pub lat_mean_us: f64,
    pub lat_p50_us: f64,
    pub lat_p99_us: f64,
    pub lat_max_us: f64,
}

impl VolumePoint {
    pub fn iops(&self) -> f64 {
        if self.len_ms == 0 {
            return 0.0;
        }
        (self.ios[0] + self.ios[1]) as f64 * 1000.0 / self.len_ms as f64
    }
    pub fn bytes_per_sec(&self) -> f64 {
        if self.len_ms == 0 {
            return 0.0;
        }
        (self.bytes[0] + self.bytes[1]) as f64 * 1000.0 / self.len_ms as f64
    }
}

/// A fault as it actually happened on one volume (start and end in ms since the run's start).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FaultWindow {
    pub node: String,
    pub volume: String,
    pub fault: String,
    pub start_ms: u64,
    #[serde(default)]
    pub end_ms: Option<u64>,
    /// What happened, when there is more to say (an exec command's exit status and output).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}
