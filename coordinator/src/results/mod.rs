//! One results structure for a cluster run (`results.json`); every exporter renders it.
//!
//! Latency figures here all come from merged histograms (per volume, per node, for the cluster);
//! none is an average of percentiles. `lat` is the latency from the actual issue (fio's `lat`);
//! `lat_intended`, present for open-loop (rate) workloads, is measured from the intended issue
//! time and so includes time an IO waited behind a slow one (no coordinated omission). Both are
//! kept so the difference is visible.

pub mod chokepoint;
pub mod clock;
pub mod counts;
pub mod curve;
pub mod drill;
pub mod hlog;
pub mod keeper;
pub mod merge;
pub mod mirror;
pub mod store;
pub mod sweep;
pub mod timeline;

use std::collections::BTreeMap;

use lockstep_proto::histogram::SparseHistogram;
use serde::{Deserialize, Serialize};

use crate::results::clock::ClockEstimate;
use crate::results::timeline::{FaultWindow, Timeline, VolumeModel};

/// Percentiles every summary carries (fio's default list).
pub const PERCENTILES: [f64; 17] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95,
    99.99,
];

/// fio's percentile key format ("99.900000").
pub fn percentile_key(p: f64) -> String {
    format!("{p:.6}")
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LatSummary {
    pub n: u64,
    pub min_ns: u64,
    pub max_ns: u64,
    pub mean_ns: f64,
    pub stdev_ns: f64,
    /// Keyed like fio ("99.000000"), values in ns.
    pub percentiles: BTreeMap<String, u64>,
}

impl LatSummary {
    pub fn of(h: &SparseHistogram) -> Self {
        let values = h.values_at_percentiles(&PERCENTILES);
        LatSummary {
            n: h.len(),
            min_ns: h.min(),
            max_ns: h.max(),
            mean_ns: h.mean(),
            stdev_ns: h.stdev(),
            percentiles: PERCENTILES
                .iter()
                .zip(values)
                .map(|(&p, v)| (percentile_key(p), v))
                .collect(),
        }
    }
    pub fn p(&self, p: f64) -> u64 {
        self.percentiles
            .get(&percentile_key(p))
            .copied()
            .unwrap_or(0)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DirSummary {
    pub ios: u64,
    pub bytes: u64,
    pub errors: u64,
    pub iops: f64,
    pub bytes_per_sec: f64,
    pub lat: LatSummary,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lat_intended: Option<LatSummary>,
}

/// Read, write and both together (the `total` latency is the merge of both directions).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub read: DirSummary,
    pub write: DirSummary,
    pub total: DirSummary,
}

impl Summary {
    pub fn dir(&self, name: &str) -> &DirSummary {
        match name {
            "read" => &self.read,
            "write" => &self.write,
            _ => &self.total,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum AgentState {
    /// Finished the run and sent its final result.
    Finished,
    /// Stopped answering or died mid-run: results after `at_ms` are missing.
    Lost { at_ms: u64, reason: String },
    /// Never started (refused, unreachable at prepare time).
    Failed { reason: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentResult {
    pub name: String,
    pub address: String,
    pub hostname: String,
    pub version: String,
    pub clock: ClockEstimate,
    /// Actual start minus the planned start instant, in the coordinator's clock (ns).
    #[serde(default)]
    pub start_lateness_ns: Option<i64>,
    pub state: AgentState,
    /// Errors the agent reported (job errors, aborted, coordinator lost).
    #[serde(default)]
    pub errors: Vec<String>,
    /// When its event stream broke mid-run, and whether the coordinator re-attached.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disconnections: Vec<Disconnection>,
}

/// The coordinator lost an agent's event stream (network cut, paused or dead agent) and tried to
/// re-attach; events the agent kept meanwhile are replayed after a re-attach.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Disconnection {
    /// ms since the synchronized start.
    pub at_ms: u64,
    #[serde(default)]
    pub reattached_ms: Option<u64>,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolumeResult {
    pub node: String,
    pub volume: String,
    pub role: String,
    #[serde(default)]
    pub model: Option<VolumeModel>,
    pub summary: Summary,
    /// Mean of the per-interval time-averaged IOs in flight.
    pub outstanding_mean: f64,
    pub configured_depth: u32,
    #[serde(default)]
    pub lost_at_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeResult {
    pub node: String,
    pub summary: Summary,
}

/// The cluster as a whole at one interval (from the merged interval histogram of all volumes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterPoint {
    pub t_ms: u64,
    pub iops: f64,
    pub bytes_per_sec: f64,
    pub errors: u64,
    pub lat_p50_us: f64,
    pub lat_p99_us: f64,
    pub lat_p999_us: f64,
    /// Volumes that reported this interval.
    pub volumes: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ObjectiveResult {
    /// The objective as written ("p99 read < 5ms on every volume").
    pub objective: String,
    pub passed: bool,
    /// Where it failed, with the measured figure ("agent-3/data: p99 read 48.1 ms").
    pub failures: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Completed,
    /// Stopped early (Ctrl-C, abort); results cover what ran.
    Aborted,
    /// Finished, but some agents were lost or failed.
    Partial,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseResult {
    pub name: String,
    pub measured: bool,
    /// Planned start, unix ms (coordinator clock).
    pub start_unix_ms: i64,
    pub duration_ms: u64,
    /// Spread of the agents' actual starts (coordinator clock).
    pub start_skew_ns: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResults {
    pub lockstep_version: String,
    pub run_id: String,
    pub plan: String,
    pub status: RunStatus,
    #[serde(default)]
    pub status_reason: String,
    pub start_unix_ms: i64,
    pub duration_ms: u64,
    pub interval_ms: u64,
    pub phases: Vec<PhaseResult>,
    pub agents: Vec<AgentResult>,
    /// Start skew of the measured phase (the figure the run measured, not assumed).
    pub start_skew_ns: Option<i64>,
    pub cluster: Summary,
    pub nodes: Vec<NodeResult>,
    pub volumes: Vec<VolumeResult>,
    pub cluster_timeline: Vec<ClusterPoint>,
    /// Per volume and interval. Written to `timeline.json`, not `results.json`: at 1,000
    /// agents x 8 volumes x 1 h it is gigabytes, and re-rendering a report must not read it.
    #[serde(skip)]
    pub timeline: Timeline,
    /// Each agent's final report of each volume, as received (node, report): the per-job fio
    /// figures of `fio.json` come from it. Kept in memory for the exporters, not in
    /// `results.json` (its histograms are in the report's summaries already).
    #[serde(skip)]
    pub finals: Vec<(String, lockstep_proto::v1::VolumeResult)>,
    pub objectives: Vec<ObjectiveResult>,
    #[serde(default)]
    pub chokepoint: Option<chokepoint::ChokepointReport>,
    #[serde(default)]
    pub faults: Vec<FaultWindow>,
    /// Things the reader must know to trust the figures (Little's law, lost agents, ...).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// What each injected fault did (baseline, during, after, recovery), from the raw
    /// interval histograms; `None` when the run had no faults.
    #[serde(default)]
    pub drill: Option<drill::DrillReport>,
    /// Mirrored pairs: the breakdown of each mirrored write and what backup failures did;
    /// `None` when no role mirrors its writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<mirror::MirrorReport>,
    /// IOs slower than their job's `stuck_timeout` (default 5 s), by volume and time.
    #[serde(default)]
    pub stuck_ios: Vec<StuckIoResult>,
    /// Data verification per volume (jobs with `verify=crc32c`).
    #[serde(default)]
    pub verify: Vec<VolumeVerify>,
    /// Curve or sweep mode: figures of each step, per role and volume (`None` for a single
    /// run). Flattened: `results.json` has a top-level `curve` (latency against IOPS) or `sweep`
    /// (latency against outstanding IOs) section.
    #[serde(flatten, deserialize_with = "series")]
    pub series: Option<Series>,
    /// The run's data files: every volume's interval histograms and points (results/store).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<DataFiles>,
}

/// Where a run's interval data is and how much there is: results.json keeps the summaries and
/// points here, so it stays small whatever the run's length.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataFiles {
    /// The directory, relative to the results directory (`data`).
    pub dir: String,
    /// Intervals per point of `timeline.json` and of the final chokepoint analysis (1 unless
    /// the run was long and wide: results/keeper.rs).
    pub timeline_fold: u64,
    /// Significant digits of the interval histograms the agents sent, the merge used and the
    /// data files keep (the plan's `histogram_digits`): 3 as recorded, or 2 (1% buckets). The
    /// volume, node and cluster percentiles come from them; fio.json's from the agents' final
    /// results, always 3. Runs from before the option: 3.
    #[serde(default = "recorded_digits")]
    pub histogram_digits: u8,
    /// Agent reports stored (one block each).
    pub blocks: u64,
    /// Histogram bytes as received, and as stored after compression.
    pub histogram_bytes: u64,
    pub stored_bytes: u64,
    /// Why some data could not be written (the results and report are still complete).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

fn recorded_digits() -> u8 {
    lockstep_proto::histogram::RECORDED_DIGITS
}

impl Default for DataFiles {
    fn default() -> Self {
        DataFiles {
            dir: String::new(),
            timeline_fold: 0,
            histogram_digits: recorded_digits(),
            blocks: 0,
            histogram_bytes: 0,
            stored_bytes: 0,
            error: None,
        }
    }
}

/// The figures of a run made of several complete runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Series {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub curve: Option<curve::CurveReport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<sweep::SweepReport>,
}

/// A flattened `Series` reads as present even when the file has neither section: keep `None`
/// for a single run, so results read back compare equal to the ones written.
fn series<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Series>, D::Error> {
    let s = Option::<Series>::deserialize(d)?;
    Ok(s.filter(|s| s.curve.is_some() || s.sweep.is_some()))
}

/// An IO that took longer than the stuck-IO timeout, or was still in flight after it (fio
/// issue #2012 asks for this list).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StuckIoResult {
    pub node: String,
    pub volume: String,
    pub file: String,
    pub offset: u64,
    pub len: u32,
    pub direction: String,
    /// Issued at, ms since the synchronized start.
    pub start_ms: u64,
    pub latency_ms: u64,
    pub completed: bool,
}

/// What one volume's verification found: lost, stale and corrupted blocks by offset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolumeVerify {
    pub node: String,
    pub volume: String,
    #[serde(flatten)]
    pub report: lockstep_core::verify::VerifyReport,
}

impl RunResults {
    pub fn objectives_failed(&self) -> bool {
        self.objectives.iter().any(|o| !o.passed)
    }

    /// Verification found a lost, stale or corrupted block (an acknowledged write is gone).
    pub fn verify_failed(&self) -> bool {
        self.verify.iter().any(|v| v.report.bad() > 0)
    }
}

/// Why a volume's figures are incomplete, keyed by (node, volume): its agent was lost or never
/// started, intervals other volumes reported are missing from it, IOs got stuck, or its
/// verification could not run in full. An objective cannot pass on data that is not there, so
/// every objective that covers such a volume fails with these reasons.
pub fn incomplete_volumes(r: &RunResults) -> BTreeMap<(String, String), Vec<String>> {
    let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let secs = |ms: u64| format!("{:.1} s", ms as f64 / 1000.0);
    for v in &r.volumes {
        let key = (v.node.clone(), v.volume.clone());
        match r.agents.iter().find(|a| a.name == v.node).map(|a| &a.state) {
            Some(AgentState::Lost { at_ms, .. }) => out
                .entry(key.clone())
                .or_default()
                .push(format!("{} lost: no data after t={}", v.node, secs(*at_ms))),
            Some(AgentState::Failed { reason }) => out
                .entry(key.clone())
                .or_default()
                .push(format!("{} failed: {reason}", v.node)),
            _ => {
                if let Some(at) = v.lost_at_ms {
                    out.entry(key.clone()).or_default().push(format!(
                        "{} lost: no data after t={}",
                        v.node,
                        secs(at)
                    ));
                }
            }
        }
    }
    for (key, why) in missing_intervals(&r.timeline) {
        out.entry(key).or_default().push(why);
    }
    for s in &r.stuck_ios {
        let key = (s.node.clone(), s.volume.clone());
        let n = r
            .stuck_ios
            .iter()
            .filter(|o| o.node == s.node && o.volume == s.volume)
            .count();
        let reasons = out.entry(key).or_default();
        if !reasons.iter().any(|w| w.contains("stuck")) {
            let in_flight = r
                .stuck_ios
                .iter()
                .filter(|o| o.node == s.node && o.volume == s.volume && !o.completed)
                .count();
            reasons.push(format!(
                "{n} stuck IO(s) (slower than the stuck timeout), {in_flight} never completed, the first issued at t={}",
                secs(s.start_ms)
            ));
        }
    }
    for v in r.verify.iter().filter(|v| !v.report.errors.is_empty()) {
        out.entry((v.node.clone(), v.volume.clone()))
            .or_default()
            .push(format!(
                "verification could not run in full: {}",
                v.report.errors.join("; ")
            ));
    }
    out
}

/// Intervals a volume did not report while others did. A volume whose agent was lost is only
/// checked up to the loss (the loss itself is its reason). An interval that every volume
/// reported short (the run's last, cut at the end) is not expected of all.
fn missing_intervals(t: &Timeline) -> Vec<((String, String), String)> {
    let iv = t.interval_ms.max(1);
    let index = |t_ms: u64| (t_ms + iv / 2) / iv;
    let mut full: std::collections::BTreeSet<u64> = Default::default();
    for s in &t.volumes {
        for p in s.points.iter().filter(|p| p.len_ms * 10 >= iv * 9) {
            full.insert(index(p.t_ms));
        }
    }
    let mut out = Vec::new();
    for s in &t.volumes {
        let have: std::collections::BTreeSet<u64> =
            s.points.iter().map(|p| index(p.t_ms)).collect();
        // Up to the interval before the loss: the one in flight at the loss may be gone.
        let until = s.lost_at_ms.map_or(u64::MAX, |ms| ms / iv);
        let missing: Vec<u64> = full
            .iter()
            .copied()
            .filter(|i| *i < until && !have.contains(i))
            .collect();
        if let Some(first) = missing.first() {
            out.push((
                (s.node.clone(), s.volume.clone()),
                format!(
                    "{} of {} intervals missing, the first ending at t={:.1} s",
                    missing.len(),
                    full.len(),
                    (first * iv) as f64 / 1000.0
                ),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::timeline::{VolumePoint, VolumeSeries};

    fn results(nodes: &[&str]) -> RunResults {
        let summary = serde_json::to_value(Summary::default()).unwrap();
        let volumes: Vec<_> = nodes
            .iter()
            .map(|n| {
                serde_json::json!({"node": n, "volume": "data", "role": "w", "summary": summary,
                    "outstanding_mean": 1.0, "configured_depth": 1})
            })
            .collect();
        let mut r: RunResults = serde_json::from_value(serde_json::json!({
            "lockstep_version": "0", "run_id": "r", "plan": "p", "status": "completed",
            "start_unix_ms": 0, "duration_ms": 4000, "interval_ms": 1000, "phases": [],
            "agents": [], "start_skew_ns": null, "cluster": summary, "nodes": [],
            "volumes": volumes, "cluster_timeline": [], "objectives": [],
        }))
        .unwrap();
        r.timeline.interval_ms = 1000;
        for n in nodes {
            r.timeline.volumes.push(VolumeSeries {
                node: n.to_string(),
                volume: "data".into(),
                role: "w".into(),
                model: None,
                configured_depth: 1,
                target_iops: None,
                lost_at_ms: None,
                // Four full intervals and the short one at the end.
                points: [1000, 2000, 3000, 4000, 4030]
                    .iter()
                    .map(|&t| VolumePoint {
                        t_ms: t,
                        len_ms: if t == 4030 { 30 } else { 1000 },
                        ..Default::default()
                    })
                    .collect(),
            });
        }
        r
    }

    #[test]
    fn a_complete_run_has_no_gaps_even_when_only_some_volumes_report_the_short_last_interval() {
        let mut r = results(&["a", "b"]);
        r.timeline.volumes[1].points.pop();
        assert!(incomplete_volumes(&r).is_empty());
    }

    #[test]
    fn missing_intervals_stuck_ios_and_an_unfinished_verification_are_gaps() {
        let mut r = results(&["a", "b", "c"]);
        r.timeline.volumes[0].points.remove(1);
        r.stuck_ios.push(StuckIoResult {
            node: "b".into(),
            volume: "data".into(),
            file: "f".into(),
            offset: 0,
            len: 4096,
            direction: "write".into(),
            start_ms: 1500,
            latency_ms: 6000,
            completed: false,
        });
        r.verify.push(VolumeVerify {
            node: "c".into(),
            volume: "data".into(),
            report: lockstep_core::verify::VerifyReport {
                errors: vec!["stopped before verification".into()],
                ..Default::default()
            },
        });
        let gaps = incomplete_volumes(&r);
        let of = |n: &str| gaps[&(n.to_string(), "data".to_string())].join(" | ");
        assert!(
            of("a").contains("1 of 4 intervals missing, the first ending at t=2.0 s"),
            "{gaps:?}"
        );
        assert!(of("b").contains("1 stuck IO(s)"), "{gaps:?}");
        assert!(of("b").contains("1 never completed"), "{gaps:?}");
        assert!(of("c").contains("verification could not run"), "{gaps:?}");
    }

    #[test]
    fn a_lost_agent_is_a_gap_from_the_loss_not_a_list_of_missing_intervals() {
        let mut r = results(&["a", "b"]);
        r.timeline.volumes[1].points.truncate(2);
        r.timeline.volumes[1].lost_at_ms = Some(2700);
        r.agents = serde_json::from_value(serde_json::json!([{
            "name": "b", "address": "x", "hostname": "h", "version": "0",
            "clock": {"offset_ns": 0, "rtt_ns": 1, "probes": 1},
            "state": {"state": "lost", "at_ms": 2700, "reason": "killed"}
        }]))
        .unwrap();
        let gaps = incomplete_volumes(&r);
        assert_eq!(
            gaps[&("b".to_string(), "data".to_string())],
            vec!["b lost: no data after t=2.7 s".to_string()]
        );
        assert!(!gaps.contains_key(&("a".to_string(), "data".to_string())));
    }
}
