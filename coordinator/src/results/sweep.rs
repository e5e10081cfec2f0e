//! A sweep's results: per role, each step's figures beside Little's law, the verdict on where
//! more IOs in flight stop buying IOPS, and the answer in words: where more of what the sweep
//! adds (a job, an IO in flight, target rate, a volume) stops paying (`Knee`), at the same step
//! as the verdict. Produced by sweep mode, rendered by the exporters.

use serde::{Deserialize, Serialize};

/// What the steps vary, as the plan said it.
pub use crate::plan::SweepOver;
use crate::results::curve::StepFigures;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SweepReport {
    pub roles: Vec<RoleSweep>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RoleSweep {
    pub role: String,
    /// What the steps vary: every job's `iodepth`, or `numjobs`.
    pub over: SweepOver,
    pub steps: Vec<SweepStep>,
    /// For the role (its volumes' IOPS summed, latency merged).
    pub verdict: Verdict,
    pub volume_verdicts: Vec<Verdict>,
    /// Where it stops scaling: per node for a `volumes` sweep, else for the role.
    #[serde(default)]
    pub answers: Vec<Knee>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SweepStep {
    /// The step's value of `over`.
    pub depth: u32,
    /// The step's results directory, relative to the run's.
    pub dir: String,
    pub role: SweepFigures,
    pub volumes: Vec<SweepFigures>,
    /// Each node's volumes of the role summed (how many ran, their throughput).
    #[serde(default)]
    pub nodes: Vec<NodeFigures>,
}

/// One node's share of a step: its volumes of the role, summed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeFigures {
    pub node: String,
    /// Volumes of the role on the node that ran in the step.
    pub volumes: u32,
    /// MB/s = 10^6 bytes/s, as objectives count it.
    pub mb_s: f64,
    pub iops: f64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KneeKind {
    /// More of what the sweep adds stopped paying (its marginal gain, or per volume).
    Knee,
    /// Still paying at the last step.
    Scaling,
    /// Fewer than two steps with data.
    #[default]
    Single,
}

/// The answer to "at what value does it stop scaling?" for a node or a role.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Knee {
    /// `node agent-1`, or `role dn`.
    pub target: String,
    pub kind: KneeKind,
    /// The last value that still scaled (the knee), else the last value.
    pub at: u32,
    /// The total at `at`, in `unit`.
    pub total: f64,
    /// `MB/s` for a volumes sweep's node, else `IOPS` (the role's, as its verdict reads them).
    pub unit: String,
    pub text: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SweepFigures {
    /// Target, IOPS, mean and percentiles, as curve mode has them (closed loop: latency from
    /// the actual issue).
    #[serde(flatten)]
    pub lat: StepFigures,
    /// IOs the jobs keep in flight: iodepth x numjobs summed over the jobs (and, for the role,
    /// over its volumes), as the agents configured them.
    pub outstanding: u64,
    /// Measured: mean of the per-interval time-averaged IOs in flight.
    pub in_flight_mean: f64,
    /// Little's law: outstanding / mean latency. The achieved IOPS fall short of it by the time
    /// a slot stays empty between a completion and the next issue.
    pub littles_iops: f64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    /// Past the knee: more outstanding IOs only queue.
    Saturated,
    /// IOPS still grew with the last step.
    Scaling,
    /// Neither IOPS nor latency grew with the last steps: the IOs were not in flight.
    Limited,
    /// Fewer than two steps with IOs: nothing to compare.
    #[default]
    Single,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// The role, or `node/volume`.
    pub target: String,
    pub kind: VerdictKind,
    /// The knee (saturated or limited: the answer's `at`), else the deepest step.
    pub depth: u32,
    pub text: String,
}

/// A step whose IOPS fall below this share of what Little's law expects kept fewer IOs in
/// flight than configured: the load generator, not the volume, limited it.
pub const LITTLE_SHORTFALL: f64 = 0.8;
