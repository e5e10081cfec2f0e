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

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use lockstep_proto::histogram::SparseHistogram;
use serde::Serialize;

/// The report types live in the results model; this module produces them.
pub use crate::results::curve::{CurveReport, CurveStep, RoleCurve, StepFigures};

use crate::cli::RunArgs;
use crate::plan::{AgentInfo, Plan};
use crate::report;
use crate::results::{RunResults, RunStatus};

/// The roles of a plan that ask for a curve, with their points.
pub fn curve_roles(plan: &Plan) -> Vec<(String, Vec<f64>)> {
    plan.roles
        .iter()
        .filter_map(|r| r.rate_curve.clone().map(|c| (r.name.clone(), c)))
        .collect()
}

/// The plan with each curve role at `rate` (per role; `None`: closed loop).
fn plan_at(plan: &Plan, rates: &Rates) -> anyhow::Result<Plan> {
    let mut p = plan.clone();
    for r in &mut p.roles {
        if let Some(rate) = rates.get(&r.name) {
            r.workload = crate::plan::with_rate(&r.workload, *rate)
                .map_err(|m| anyhow::anyhow!("role '{}': {m}", r.name))?;
            r.rate_iops = *rate;
        }
    }
    Ok(p)
}

/// Whether a log entry's interval counts for results: its middle lies in a measured phase, as
/// the run decides (`run.rs`), so a ramp's intervals stay out of a role's percentiles as they
/// stay out of its volumes'.
fn measured(results: &RunResults, e: &crate::hlog::LogEntry) -> bool {
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
    entries: &[crate::hlog::LogEntry],
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

/// One complete run of a series (curve and sweep modes), with what its mode needs to know
/// about it afterwards.
pub(crate) struct Step<T> {
    /// For messages: `max`, `50%`, `depth 4`.
    pub name: String,
    /// The directory is `<mode>/<n>-<slug>`.
    pub slug: String,
    /// What the step runs, for the log line.
    pub what: String,
    pub plan: Plan,
    pub data: T,
}

/// What a step left: its directory (relative to the run's), results and raw histograms.
pub(crate) struct StepRun {
    pub dir: String,
    pub results: RunResults,
    pub entries: Vec<crate::hlog::LogEntry>,
}

/// Runs `steps` one after another on the same agents, each a complete run with its own
/// results directory (`out_dir/<mode>/<n>-<slug>/`). `done` sees each step's results and may
/// schedule more steps (curve mode learns its rates from the first). An aborted step ends the
/// series. Returns the first step's results, the base of the series' `results.json` (marked
/// aborted when a step was), and whether any step failed an objective or a verification or
/// was aborted.
pub(crate) async fn run_steps<T>(
    args: &RunArgs,
    infos: &[AgentInfo],
    token: Option<String>,
    out_dir: &Path,
    mode: &str,
    steps: Vec<Step<T>>,
    mut done: impl FnMut(&Step<T>, &StepRun) -> anyhow::Result<Vec<Step<T>>>,
) -> anyhow::Result<(RunResults, bool)> {
    let mut pending: VecDeque<Step<T>> = steps.into();
    let mut base: Option<RunResults> = None;
    let mut failed = false;
    let mut index = 0usize;
    while let Some(step) = pending.pop_front() {
        let dir_name = format!("{mode}/{index}-{}", step.slug);
        index += 1;
        let dir = out_dir.join(&dir_name);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        eprintln!("lockstep: {mode} step {}: {}", step.name, step.what);
        crate::cli::run_resolved(args, &step.plan, infos, token.clone(), &dir).await?;
        let results = report::read_run_dir(&dir).map_err(anyhow::Error::msg)?;
        let entries = crate::hlog::read(&dir.join("intervals.hlog"))
            .context("reading the step's intervals.hlog")?;
        failed |= results.objectives_failed() || results.verify_failed();
        let aborted = results.status == RunStatus::Aborted;
        let run = StepRun {
            dir: dir_name,
            results,
            entries,
        };
        pending.extend(done(&step, &run)?);
        if base.is_none() {
            base = Some(run.results);
        }
        if aborted {
            eprintln!("lockstep: {mode} stopped at step {}", step.name);
            pending.clear();
            failed = true;
            if let Some(b) = base.as_mut() {
                b.status = RunStatus::Aborted;
            }
        }
    }
    let base = base.with_context(|| format!("the {mode}'s first step produced no results"))?;
    Ok((base, failed))
}

/// Ends a series: writes its `results.json` (the base results with the series' section) and
/// `report.txt`, prints the section (its JSON with `--json`, else `text`), and gives the exit
/// code: interrupted when a step was aborted, objective when one failed.
pub(crate) fn finish(
    args: &RunArgs,
    out_dir: &Path,
    mode: &str,
    results: &RunResults,
    failed: bool,
    json: &impl Serialize,
    text: &str,
) -> anyhow::Result<ExitCode> {
    report::write_atomically(
        &out_dir.join("results.json"),
        &serde_json::to_vec_pretty(results)?,
    )?;
    report::write_atomically(
        &out_dir.join("report.txt"),
        report::text::render(results).as_bytes(),
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(json)?);
    } else {
        print!("\n{text}");
    }
    eprintln!(
        "lockstep: {mode} results in {} (each step in {mode}/)",
        out_dir.display()
    );
    Ok(if results.status == RunStatus::Aborted {
        ExitCode::from(crate::cli::interrupted_code())
    } else if failed {
        ExitCode::from(crate::cli::EXIT_OBJECTIVE)
    } else {
        ExitCode::SUCCESS
    })
}

/// A curve step: its percentage (`None`: the maximum) and per-role rates.
type Rates = BTreeMap<String, Option<u64>>;

fn curve_step(
    plan: &Plan,
    name: String,
    percent: Option<f64>,
    rates: Rates,
) -> anyhow::Result<Step<(Option<f64>, Rates)>> {
    Ok(Step {
        slug: name.replace('%', "pct"),
        name,
        what: describe(&rates),
        plan: plan_at(plan, &rates)?,
        data: (percent, rates),
    })
}

/// Runs the curve: the maximum, then each point, each a complete run in `out_dir/curve/`.
pub async fn run(
    args: &RunArgs,
    plan: &Plan,
    infos: &[AgentInfo],
    token: Option<String>,
    out_dir: &Path,
) -> anyhow::Result<ExitCode> {
    let roles = curve_roles(plan);
    let max = curve_step(
        plan,
        "max".into(),
        None,
        roles.iter().map(|(r, _)| (r.clone(), None)).collect(),
    )?;
    let mut points: Vec<f64> = roles.iter().flat_map(|(_, p)| p.iter().copied()).collect();
    points.sort_by(f64::total_cmp);
    points.dedup();
    let mut report = CurveReport {
        roles: roles
            .iter()
            .map(|(r, _)| RoleCurve {
                role: r.clone(),
                ..Default::default()
            })
            .collect(),
    };
    let (mut results, failed) = run_steps(
        args,
        infos,
        token,
        out_dir,
        "curve",
        vec![max],
        |step, run| {
            let (percent, rates) = &step.data;
            for rc in &mut report.roles {
                let (role_fig, volumes) = figures(&run.results, &run.entries, &rc.role);
                if percent.is_none() {
                    rc.max_iops_per_volume = if volumes.is_empty() {
                        0.0
                    } else {
                        role_fig.iops / volumes.len() as f64
                    };
                }
                rc.steps.push(CurveStep {
                    name: step.name.clone(),
                    percent: *percent,
                    target_iops: rates.get(&rc.role).copied().flatten(),
                    dir: run.dir.clone(),
                    role: role_fig,
                    volumes,
                });
            }
            if percent.is_some() {
                return Ok(Vec::new());
            }
            // The maximum is known: schedule the points.
            let mut next = Vec::new();
            for &p in &points {
                let rates: Rates = roles
                    .iter()
                    .filter(|(_, ps)| ps.contains(&p))
                    .filter_map(|(r, _)| {
                        let max = report
                            .roles
                            .iter()
                            .find(|c| &c.role == r)?
                            .max_iops_per_volume;
                        Some((r.clone(), Some(((max * p / 100.0).round() as u64).max(1))))
                    })
                    .collect();
                if !rates.is_empty() {
                    next.push(curve_step(plan, format!("{p}%"), Some(p), rates)?);
                }
            }
            Ok(next)
        },
    )
    .await?;
    results.series = Some(crate::results::Series {
        curve: Some(report.clone()),
        ..Default::default()
    });
    finish(
        args,
        out_dir,
        "curve",
        &results,
        failed,
        &report,
        &report::text::curve::render_text(&report),
    )
}

fn describe(rates: &Rates) -> String {
    rates
        .iter()
        .map(|(r, v)| match v {
            Some(v) => format!("role {r} at {v} IOPS per volume (open loop)"),
            None => format!("role {r} closed loop (finding the maximum)"),
        })
        .collect::<Vec<_>>()
        .join(", ")
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
        let t = crate::report::text::curve::render_text(&c);
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
        let entry = |start_s: f64| crate::hlog::LogEntry {
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
