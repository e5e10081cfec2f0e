//! The chokepoint finder's answer as it is stored in `results.json` and rendered by the
//! exporters: the verdict (volume, node, cluster-wide, load generator or none), the evidence and
//! confidence behind it, every volume's standing and the credit forecasts. The finder itself is
//! `analysis::chokepoint`; keeping its output here lets an exporter read a typed answer without
//! importing the analysis.

use serde::{Deserialize, Serialize};

use crate::results::timeline::VolumeModel;
pub use lockstep_core::fault::ebs::CreditUnit;

/// The emulation time scale of one volume's model (docs/domain.md#time-scale: a 30-minute
/// credit drain shown in 30 s is a time scale of 60).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolumeTimeScale {
    pub node: String,
    pub volume: String,
    pub time_scale: f64,
}

/// What kind of limit a chokepoint volume is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChokepointKind {
    /// IOPS flat at a ceiling below the peers, latency = outstanding / ceiling.
    Throttled,
    /// Throttled after a fine period, on a volume whose kind has burst credits (or is unknown).
    CreditExhaustion,
    /// Latency up without a ceiling: IOPS vary (closed-loop) or hold (open-loop).
    FailSlow,
    /// Sustained IO errors.
    Erroring,
}

impl ChokepointKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChokepointKind::Throttled => "throttled",
            ChokepointKind::CreditExhaustion => "credit exhaustion",
            ChokepointKind::FailSlow => "fail-slow",
            ChokepointKind::Erroring => "erroring",
        }
    }
}

/// Figures supporting a volume verdict, over the intervals from the onset to the end of the
/// episode ("after"), against the same intervals of its peers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    /// Other volumes of its role.
    pub peers: usize,
    /// Intervals after the onset that were analyzed, and how many of them were flagged.
    pub intervals: u32,
    pub flagged_intervals: u32,
    /// Mean IOPS before the onset (None when it was slow from the start).
    pub iops_before: Option<f64>,
    pub iops: f64,
    /// Median IOPS after the onset: the level a throttle pins the volume at. The mean above
    /// counts the onset interval, which a credit cliff splits between burst and baseline.
    #[serde(default)]
    pub iops_median: f64,
    /// Mean over the same intervals of the peers' median IOPS.
    pub peer_iops: f64,
    /// Robust coefficient of variation (MAD x 1.4826 / median) of its IOPS after the onset: low
    /// means pinned at a ceiling.
    pub iops_cv: f64,
    /// Median over the intervals of its mean latency, and the peers' median of the same.
    pub latency_mean_us: f64,
    pub peer_latency_mean_us: f64,
    /// How far its latency sits from its peers' in robust sigmas: over the same intervals, each
    /// peer's median latency; then (ln of its own - median of the peers' ln) / (1.4826 x MAD),
    /// the spread floored at `spread_floor` as the flags floor it. `None` with fewer than 3
    /// peers.
    pub latency_robust_z: Option<f64>,
    /// The peers' spread of latency (1.4826 x MAD of ln latency: 0.1 is about +-10%).
    pub peer_latency_spread: f64,
    /// Median over the intervals of each interval's p99 (a typical interval's p99; the merged
    /// p99 over the whole period comes from the interval histograms in the report).
    pub p99_us: f64,
    pub peer_p99_us: f64,
    /// Mean outstanding IOs measured, and what Little's law predicts from IOPS x latency: they
    /// agree when the queue is real and waiting on the device.
    pub outstanding: f64,
    pub littles_outstanding: f64,
    pub configured_depth: u32,
    pub target_iops: Option<f64>,
    /// Errors / (IOs + errors) after the onset.
    pub error_fraction: f64,
    /// Whether the volume was fine (at its peers' level) before the onset.
    pub fine_before: bool,
    pub credit: Option<CreditCheck>,
}

/// Credit-model evidence for a throttled volume with a burstable model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreditCheck {
    pub model: CreditModel,
    pub time_scale: f64,
    /// Mean credit demand (IOPS or MiB/s) before the onset.
    pub demand_before: f64,
    /// When a full bucket runs out at that demand (ms since the run's start).
    pub forecast_onset_ms: Option<u64>,
    /// Whether the measured onset is within the tolerance of the forecast.
    pub onset_matches_forecast: bool,
    /// Whether the rate after the onset sits at the model's baseline (within 15%).
    pub at_baseline: bool,
    /// The rate after the onset in the model's unit (median of the intervals after it).
    pub rate_after: f64,
}

/// How much faster the cluster would be if the chokepoint performed like its peers' median,
/// over the intervals after the onset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Impact {
    /// Independent workloads: cluster IOPS with the chokepoint's IOPS replaced by its peers'
    /// median, divided by the cluster IOPS measured.
    pub independent_speedup: f64,
    /// Barrier-coupled workloads (a stage waits for the slowest, like a Hadoop stage): the
    /// completion time ratio, peers' median throughput / chokepoint throughput.
    pub barrier_speedup: f64,
    /// Chokepoint latency / peers' median latency.
    pub latency_ratio: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolumeVerdict {
    pub node: String,
    pub volume: String,
    pub role: String,
    pub model: Option<VolumeModel>,
    pub kind: ChokepointKind,
    /// Start of the onset interval, ms since the run's start.
    pub onset_ms: u64,
    pub onset_interval: usize,
    /// Peak score of its worst episode (net flagged intervals).
    pub score: u32,
    pub evidence: Evidence,
    /// How sure the finder is, and why.
    #[serde(default)]
    pub confidence: Confidence,
    pub impact: Impact,
}

/// How sure a verdict is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConfidenceLevel {
    /// The typical interval after the onset is clearly out (over `peer_z` robust sigmas and
    /// `min_slowdown`), and most of them were flagged.
    #[default]
    Sure,
    /// Persistent enough to be named, but the typical interval is near the limits (or fewer
    /// than half were flagged): a suspect, not yet sure. Look again with more data.
    Suspect,
}

impl ConfidenceLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            ConfidenceLevel::Sure => "sure",
            ConfidenceLevel::Suspect => "suspect, not yet sure",
        }
    }
}

/// The figures behind a verdict's confidence, over the intervals from the onset to the end of
/// the episode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Confidence {
    pub level: ConfidenceLevel,
    pub flagged_intervals: u32,
    pub intervals: u32,
    /// Median over the intervals of its distance from its peers' center in robust units (the
    /// larger of latency per load and IOPS deficit, each over the peers' spread with its floor).
    pub median_distance: f64,
    /// The peers' spread of latency and of IOPS as a robust CV (before the floor). `None` with
    /// fewer than 3 volumes in the role: one or two peers have no spread to measure (JSON has
    /// no NaN, so a NaN here made results.json unreadable).
    #[serde(default)]
    pub peer_cv: Option<f64>,
    #[serde(default)]
    pub peer_iops_cv: Option<f64>,
    /// Median slowdown factor against the peers' center (latency per load, or IOPS deficit).
    pub slowdown: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeVerdict {
    pub node: String,
    /// The node's volumes that degraded, of `volumes_total` on the node.
    pub volumes: Vec<String>,
    pub volumes_total: usize,
    pub onset_ms: u64,
    pub onset_interval: usize,
    pub score: u32,
    /// Mean total IOPS of the node after the onset, and the sum of its volumes' peer medians.
    pub iops: f64,
    pub peer_iops: f64,
    /// Robust coefficient of variation of the node's total IOPS after the onset: low means a
    /// shared ceiling (instance IOPS or bandwidth cap).
    pub iops_cv: f64,
    /// Mean total MB/s (10^6 bytes) of the node after the onset, and its robust CV.
    #[serde(default)]
    pub mb_s: f64,
    #[serde(default)]
    pub mb_s_cv: f64,
    /// The ceiling the node's volumes were pinned at together, when their summed throughput
    /// sat flat after the onset: the signature of a limit they share (an instance's EBS
    /// bandwidth or IOPS), found in the data, not read from the fault plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceiling: Option<NodeCeiling>,
    /// How sure, over all its degraded volumes (a node verdict is made whatever the level).
    #[serde(default)]
    pub confidence: Confidence,
    pub impact: Impact,
}

/// A node's summed throughput held flat: `value` in `unit` ("MB/s" or "IOPS").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeCeiling {
    pub value: f64,
    pub unit: String,
    /// How many of the node's volumes the flat sum is over: the slowed ones, or all of them
    /// when one took an uneven share of the limit and was not slowed itself. 0 in results
    /// written before it was kept: the slowed ones.
    #[serde(default)]
    pub volumes: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterVerdict {
    pub roles: Vec<String>,
    pub onset_ms: u64,
    pub onset_interval: usize,
    /// Role median latency during the slowdown / before it (the largest over the roles).
    pub latency_factor: f64,
    /// Role median IOPS during the slowdown / before it (for the same role).
    pub iops_factor: f64,
    /// Volumes whose mean latency rose by more than half, of the volumes of those roles.
    pub volumes_degraded: usize,
    pub volumes: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadGeneratorEvidence {
    /// Closed-loop volumes whose mean outstanding IOs stayed below the configured depth
    /// fraction, of all closed-loop volumes.
    pub volumes_below: usize,
    pub volumes_closed_loop: usize,
    /// Median over those volumes of mean outstanding / configured depth.
    pub outstanding_ratio: f64,
}

/// The finder's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
#[allow(clippy::large_enum_variant)] // one per report; boxing would only complicate matching
pub enum Verdict {
    /// No volume stayed slower than its peers, nothing degraded together.
    None,
    Volume(VolumeVerdict),
    Node(NodeVerdict),
    ClusterWide(ClusterVerdict),
    /// The load generator, not the storage, limits the run.
    LoadGeneratorBound(LoadGeneratorEvidence),
}

/// A volume's standing, for the live view and `results.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolumeScore {
    pub node: String,
    pub volume: String,
    pub role: String,
    /// Score at the end of the data (what the live view shows as the current suspect).
    pub score: u32,
    /// Highest score reached.
    pub peak_score: u32,
    pub flagged_intervals: u32,
    /// Whether its score reached the persistence threshold at some point.
    pub suspect: bool,
    /// First flagged interval of its worst episode (unrefined onset), ms since the start.
    pub episode_start_ms: Option<u64>,
}

/// A cluster-wide episode of one role.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterEpisode {
    pub role: String,
    pub start_ms: u64,
    pub end_ms: Option<u64>,
    pub peak_score: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChokepointReport {
    pub verdict: Verdict,
    /// Other node or volume verdicts, weaker than the main one (independent problems).
    pub also: Vec<Verdict>,
    pub interval_ms: u64,
    pub intervals: usize,
    /// End of the last interval analyzed (a live run analyzes the data so far).
    pub analyzed_through_ms: u64,
    pub volumes: Vec<VolumeScore>,
    pub cluster_episodes: Vec<ClusterEpisode>,
    pub forecasts: Vec<CreditForecast>,
    /// Queue-depth evidence when the closed-loop volumes keep fewer IOs in flight than
    /// configured (also when it is not the verdict).
    pub load_generator: Option<LoadGeneratorEvidence>,
    /// Volumes persistent enough to be named whose typical interval is near the limits
    /// ([`ConfidenceLevel::Suspect`]): suspects, not yet sure, and not blamed.
    #[serde(default)]
    pub suspects: Vec<VolumeVerdict>,
    /// For a credit-exhaustion verdict, the forecast made before the cliff (set by the
    /// application once the run is over; `None` in the live view).
    #[serde(default)]
    pub forecast_before_cliff: Option<ForecastBeforeCliff>,
    /// Agents lost during the run: the verdict is about the cluster that ran without them
    /// from then on.
    #[serde(default)]
    pub lost: Vec<LostNode>,
    /// For plans of several measured phases, each phase's own analysis (a slowdown confined to
    /// one phase is named there even when the whole run dilutes it).
    #[serde(default)]
    pub phases: Vec<PhaseChokepoint>,
}

/// A node whose agent was lost mid-run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LostNode {
    pub node: String,
    /// When its first volume stopped reporting, ms since the run's start.
    pub at_ms: u64,
    /// Its volumes, all of which were lost with it.
    pub volumes: usize,
}

/// The finder's answer for one phase of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseChokepoint {
    pub phase: String,
    /// The phase's window, ms since the run's start.
    pub start_ms: u64,
    pub end_ms: u64,
    pub report: ChokepointReport,
}

/// What the credit forecast said before a credit cliff, against when the cliff came: the
/// forecast the finder makes from the timeline cut half-way to the onset (what the live view
/// showed then).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForecastBeforeCliff {
    pub node: String,
    pub volume: String,
    /// The forecast used the data up to here (half-way to the onset, as a live view would).
    pub made_at_ms: u64,
    pub predicted_ms: u64,
    pub actual_onset_ms: u64,
    /// (predicted - actual) / actual onset, percent.
    pub error_pct: f64,
}

/// A size for a sentence: "60" for 60.0, "7.5" for 7.5 (as in "60 GiB gp2").
pub(crate) fn trim_float(x: f64) -> String {
    if (x - x.round()).abs() < 1e-9 {
        format!("{}", x.round() as i64)
    } else {
        format!("{x:.1}")
    }
}

/// A volume's credit bucket: it refills at `baseline`, can be spent at up to `burst`, holds
/// `bucket` and starts full (EBS volumes start with a full bucket; the forecast assumes the run
/// began with one, which is the pessimistic case for a volume that was busy before the run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreditModel {
    pub kind: String,
    pub size_gib: f64,
    pub unit: CreditUnit,
    pub baseline: f64,
    pub burst: f64,
    pub bucket: f64,
}

impl CreditModel {
    /// "60 GiB gp2", for reports.
    pub fn describe(&self) -> String {
        format!("{} GiB {}", trim_float(self.size_gib), self.kind)
    }
}

/// When a volume's credits run out, from its measured demand. Shown for every volume with a
/// credit model, before the cliff as well as after it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreditForecast {
    pub node: String,
    pub volume: String,
    pub model: CreditModel,
    pub time_scale: f64,
    /// Mean demand (credits/s, i.e. IOPS or MiB/s) over the last intervals analyzed.
    pub demand: f64,
    /// Estimated balance at the end of the data: a full bucket at the run's start, minus what
    /// the measured demand spent above the baseline.
    pub balance: f64,
    /// When the estimated balance first reached empty (ms since the run's start), if it did.
    pub exhausted_at_ms: Option<u64>,
    /// Real seconds from the end of the data until the credits run out at the current demand;
    /// `None` when already empty or when the demand does not exceed the baseline.
    pub runs_out_in_s: Option<f64>,
    /// The same as a time since the run's start.
    pub runs_out_at_ms: Option<u64>,
}
