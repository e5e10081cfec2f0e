//! A rate curve's results (vdbench's `iorate=curve`): per role, the closed-loop maximum and
//! each open-loop step's figures. Produced by curve mode, rendered by the exporters.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CurveReport {
    pub roles: Vec<RoleCurve>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RoleCurve {
    pub role: String,
    /// The maximum: mean per-volume IOPS of the closed-loop step.
    pub max_iops_per_volume: f64,
    pub steps: Vec<CurveStep>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CurveStep {
    /// `max`, or the percentage (`50%`).
    pub name: String,
    /// `None` for the maximum step.
    pub percent: Option<f64>,
    /// Open-loop target per volume (`None`: closed loop).
    pub target_iops: Option<u64>,
    /// The step's results directory, relative to the run's.
    pub dir: String,
    /// The role's volumes merged.
    pub role: StepFigures,
    pub volumes: Vec<StepFigures>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepFigures {
    /// `node/volume`, or the role's name.
    pub target: String,
    pub iops: f64,
    /// Mean latency (ns); the role's is the volumes' weighted by their IO counts.
    #[serde(default)]
    pub mean_ns: f64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    /// Whether the latency is from the intended issue time (open loop).
    pub intended: bool,
}
