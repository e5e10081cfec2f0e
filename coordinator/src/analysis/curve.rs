//! Curve mode (vdbench `iorate=curve`): the latency a volume gives at each load, up to the most
//! it can do.
//!
//! A role with `rate_curve = [10, 50, 70, 80, 90, 100]` makes `lockstep run` run the plan
//! several times on the same agents: first closed loop (the workload's iodepth, no rate) to find
//! the maximum, then open loop at each percentage of it. The rate of a step is the percentage
//! of the role's mean per-volume maximum, the same target for every volume of the role (peers
//! are asked the same, as in any open-loop run). Each step is a complete run with its own
//! results directory (`curve/<n>-<step>/`); the curve itself (per volume and for the role, per
//! step: target, achieved IOPS, p50/p99/p99.9) goes into `results.json` (`curve`, beside the
//! maximum step's results) and the report.
//!
//! Latency is from the intended issue time in the open-loop steps (no coordinated omission)
//! and from the actual issue in the closed-loop maximum step. A role's percentiles come from
//! the merge of its volumes' interval histograms (`intervals.hlog` of the step), never from
//! averaged percentiles.
//!
//! The series loop (`run_steps`: one complete run per step, each in its own directory, stopped
//! by an aborted step; `finish`: results.json, report.txt, the printed section, the exit code)
//! is shared with sweep mode (`sweep.rs`), as are the per-step figures (`figures`).

use lockstep_proto::histogram::SparseHistogram;

/// The report types live in the results model; this module produces them.
pub use crate::results::curve::{CurveReport, CurveStep, RoleCurve, StepFigures};

use crate::plan::Plan;
use crate::results::RunResults;

/// The roles of a plan that ask for a curve, with their points.
pub fn curve_roles(plan: &Plan) -> Vec<(String, Vec<f64>)> {
    plan.roles
        .iter()
        .filter_map(|r| r.rate_curve.clone().map(|c| (r.name.clone(), c)))
        .collect()
}

/// Whether a log entry's interval counts for results: its middle lies in a measured phase, as
/// the run decides (`run.rs`), so a ramp's intervals stay out of a role's percentiles as they
/// stay out of its volumes'.
fn measured(results: &RunResults, e: &crate::results::hlog::LogEntry) -> bool {
    let Some(t0) = results.phases.iter().map(|p| p.start_unix_ms).min() else {
        return true;
    };
    let mid_ms = (e.start_s + e.len_s / 2.0) * 1000.0;
    results.phases.iter().any(|p| {
        let start = (p.start_unix_ms - t0) as f64;
        p.measured && start <= mid_ms && mid_ms < start + p.duration_ms as f64
    })
}

/// Per-step figures of `role` from a step's results and raw histograms: its volumes as the
/// results give them, and the role from the merge of their measured interval histograms.
pub(crate) fn figures(
    results: &RunResults,
    entries: &[crate::results::hlog::LogEntry],
    role: &str,
) -> (StepFigures, Vec<StepFigures>) {
    let vols: Vec<_> = results.volumes.iter().filter(|v| v.role == role).collect();
    let mut ios = 0u64;
    let mut lat_sum = 0.0;
    let per_volume: Vec<StepFigures> = vols
        .iter()
        .map(|v| {
            let t = &v.summary.total;
            let (l, intended) = match &t.lat_intended {
                Some(li) => (li, true),
                None => (&t.lat, false),
            };
            ios += l.n;
            lat_sum += l.mean_ns * l.n as f64;
            StepFigures {
                target: format!("{}/{}", v.node, v.volume),
                iops: t.iops,
                mean_ns: l.mean_ns,
                p50_ns: l.p(50.0),
                p99_ns: l.p(99.0),
                p999_ns: l.p(99.9),
                intended,
            }
        })
        .collect();
    let names: Vec<String> = per_volume.iter().map(|f| f.target.clone()).collect();
    let intended = per_volume.iter().any(|f| f.intended);
    let want = if intended { "lat_intended" } else { "lat" };
    let mut merged: Option<SparseHistogram> = None;
    for e in entries {
        let mut parts = e.tag.rsplitn(3, '/');
        let (Some(kind), Some(_dir), Some(volume)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if kind != want || !names.iter().any(|n| n == volume) || !measured(results, e) {
            continue;
        }
        match merged.as_mut() {
            Some(m) => {
                let _ = m.merge(&e.histogram);
            }
            None => merged = Some(e.histogram.clone()),
        }
    }
    let p = |q: f64| merged.as_ref().map_or(0, |h| h.value_at_percentile(q));
    let role_fig = StepFigures {
        target: role.to_string(),
        iops: per_volume.iter().map(|f| f.iops).sum(),
        // Exact: the volumes' means weighted by their IO counts.
        mean_ns: if ios == 0 { 0.0 } else { lat_sum / ios as f64 },
        p50_ns: p(50.0),
        p99_ns: p(99.0),
        p999_ns: p(99.9),
        intended,
    };
    (role_fig, per_volume)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_has_one_line_per_step_and_one_per_volume() {
        let fig = |t: &str, iops: f64, p99: u64| StepFigures {
            target: t.into(),
            iops,
            mean_ns: 0.0,
            p50_ns: p99 / 4,
            p99_ns: p99,
            p999_ns: p99 * 2,
            intended: true,
        };
        let step =
            |name: &str, pct: Option<f64>, target: Option<u64>, iops: f64, p99: u64| CurveStep {
                name: name.into(),
                percent: pct,
                target_iops: target,
                dir: format!("curve/{name}"),
                role: fig("db", iops * 2.0, p99),
                volumes: vec![
                    fig("a/data", iops, p99),
                    fig("b/data", iops, p99 + 1_000_000),
                ],
            };
        let c = CurveReport {
            roles: vec![RoleCurve {
                role: "db".into(),
                max_iops_per_volume: 4000.0,
                steps: vec![
                    step("max", None, None, 4000.0, 8_000_000),
                    step("50%", Some(50.0), Some(2000), 2000.0, 400_000),
                ],
            }],
        };
        let t = crate::export::text::curve::render_text(&c);
        assert!(
            t.contains("rate curve, role db (maximum 4000 IOPS per volume"),
            "{t}"
        );
        assert!(
            t.contains("  50%              2000        4000     0.10     0.40      0.80"),
            "{t}"
        );
        assert!(
            t.contains("  b/data: max 4000 IOPS p99 9.00 ms; 50% 2000 IOPS p99 1.40 ms"),
            "{t}"
        );
    }

    #[test]
    fn only_intervals_of_measured_phases_count() {
        let summary = serde_json::to_value(crate::results::Summary::default()).unwrap();
        let phase = |name: &str, start: i64, len: u64, measured: bool| {
            serde_json::json!({"name": name, "measured": measured,
                "start_unix_ms": 1_000_000 + start, "duration_ms": len, "start_skew_ns": null})
        };
        let results: RunResults = serde_json::from_value(serde_json::json!({
            "lockstep_version": "0", "run_id": "r", "plan": "p", "status": "completed",
            "start_unix_ms": 1_002_000, "duration_ms": 3000, "interval_ms": 1000,
            "phases": [phase("ramp", 0, 2000, false), phase("measure", 2000, 3000, true)],
            "agents": [], "start_skew_ns": null, "cluster": summary, "nodes": [], "volumes": [],
            "cluster_timeline": [], "objectives": [],
        }))
        .unwrap();
        let entry = |start_s: f64| crate::results::hlog::LogEntry {
            tag: "agent-1/data/read/lat".into(),
            start_s,
            len_s: 1.0,
            histogram: SparseHistogram::empty(
                lockstep_proto::histogram::Geometry::new(1, 1 << 40, 3).unwrap(),
            ),
        };
        let counted: Vec<bool> = [0.0, 1.0, 2.0, 4.0, 5.0]
            .iter()
            .map(|&s| measured(&results, &entry(s)))
            .collect();
        assert_eq!(counted, [false, false, true, true, false]);
    }
}
