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

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use lockstep_proto::histogram::SparseHistogram;
use serde::{Deserialize, Serialize};

use crate::cli::RunArgs;
use crate::plan::{AgentInfo, Plan};
use crate::report;
use crate::results::{RunResults, RunStatus};

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
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    /// Whether the latency is from the intended issue time (open loop).
    pub intended: bool,
}

/// The roles of a plan that ask for a curve, with their points.
pub fn curve_roles(plan: &Plan) -> Vec<(String, Vec<f64>)> {
    plan.roles
        .iter()
        .filter_map(|r| r.rate_curve.clone().map(|c| (r.name.clone(), c)))
        .collect()
}

/// The plan with each curve role at `rate` (per role; `None`: closed loop).
fn plan_at(plan: &Plan, rates: &BTreeMap<String, Option<u64>>) -> anyhow::Result<Plan> {
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

/// Per-step figures of `role` from a step's results and raw histograms.
fn figures(
    results: &RunResults,
    entries: &[crate::hlog::LogEntry],
    role: &str,
) -> (StepFigures, Vec<StepFigures>) {
    let vols: Vec<_> = results.volumes.iter().filter(|v| v.role == role).collect();
    let per_volume: Vec<StepFigures> = vols
        .iter()
        .map(|v| {
            let t = &v.summary.total;
            let (l, intended) = match &t.lat_intended {
                Some(li) => (li, true),
                None => (&t.lat, false),
            };
            StepFigures {
                target: format!("{}/{}", v.node, v.volume),
                iops: t.iops,
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
        if kind != want || !names.iter().any(|n| n == volume) {
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
        p50_ns: p(50.0),
        p99_ns: p(99.0),
        p999_ns: p(99.9),
        intended,
    };
    (role_fig, per_volume)
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
    let mut steps: Vec<(String, Option<f64>, BTreeMap<String, Option<u64>>)> = Vec::new();
    steps.push((
        "max".into(),
        None,
        roles.iter().map(|(r, _)| (r.clone(), None)).collect(),
    ));
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
    let mut base: Option<RunResults> = None;
    let mut failed = false;
    let mut index = 0usize;
    let mut pending = steps.into_iter().collect::<std::collections::VecDeque<_>>();
    while let Some((name, percent, rates)) = pending.pop_front() {
        let dir_name = format!("{index}-{}", name.replace('%', "pct"));
        index += 1;
        let dir = out_dir.join("curve").join(&dir_name);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        eprintln!("lockstep: curve step {name}: {}", describe(&rates));
        let step_plan = plan_at(plan, &rates)?;
        crate::cli::run_resolved(args, &step_plan, infos, token.clone(), &dir).await?;
        let results = report::read_run_dir(&dir).map_err(anyhow::Error::msg)?;
        let entries = crate::hlog::read(&dir.join("intervals.hlog"))
            .context("reading the step's intervals.hlog")?;
        failed |= results.objectives_failed() || results.verify_failed();
        for rc in &mut report.roles {
            let (role_fig, volumes) = figures(&results, &entries, &rc.role);
            if percent.is_none() {
                rc.max_iops_per_volume = if volumes.is_empty() {
                    0.0
                } else {
                    role_fig.iops / volumes.len() as f64
                };
            }
            rc.steps.push(CurveStep {
                name: name.clone(),
                percent,
                target_iops: rates.get(&rc.role).copied().flatten(),
                dir: format!("curve/{dir_name}"),
                role: role_fig,
                volumes,
            });
        }
        let aborted = results.status == RunStatus::Aborted;
        if percent.is_none() {
            // The maximum is known: schedule the points.
            for &p in &points {
                let rates: BTreeMap<String, Option<u64>> = roles
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
                    pending.push_back((format!("{p}%"), Some(p), rates));
                }
            }
            base = Some(results);
        }
        if aborted {
            eprintln!("lockstep: curve stopped at step {name}");
            pending.clear();
            failed = true;
            if let Some(b) = base.as_mut() {
                b.status = RunStatus::Aborted;
            }
        }
    }
    let mut results = base.context("the curve's maximum step produced no results")?;
    results.curve = Some(report.clone());
    let json = serde_json::to_vec_pretty(&results)?;
    report::write_atomically(&out_dir.join("results.json"), &json)?;
    report::write_atomically(
        &out_dir.join("report.txt"),
        report::text::render(&results).as_bytes(),
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("\n{}", render_text(&report));
    }
    eprintln!(
        "lockstep: curve results in {} (each step in curve/)",
        out_dir.display()
    );
    Ok(if results.status == RunStatus::Aborted {
        ExitCode::from(crate::cli::EXIT_INTERRUPTED)
    } else if failed {
        ExitCode::from(crate::cli::EXIT_OBJECTIVE)
    } else {
        ExitCode::SUCCESS
    })
}

fn describe(rates: &BTreeMap<String, Option<u64>>) -> String {
    rates
        .iter()
        .map(|(r, v)| match v {
            Some(v) => format!("role {r} at {v} IOPS per volume (open loop)"),
            None => format!("role {r} closed loop (finding the maximum)"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn ms(ns: u64) -> String {
    let v = ns as f64 / 1e6;
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The curve section of the text report: per role, one line per step, then per volume.
pub fn render_text(c: &CurveReport) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    for rc in &c.roles {
        let _ = writeln!(
            o,
            "rate curve, role {} (maximum {:.0} IOPS per volume, closed loop; steps open loop, latency from the intended issue):",
            rc.role, rc.max_iops_per_volume
        );
        let _ = writeln!(
            o,
            "  {:<8} {:>12} {:>11} {:>8} {:>8} {:>9}",
            "step", "target/vol", "role IOPS", "p50 ms", "p99 ms", "p99.9 ms"
        );
        for s in &rc.steps {
            let _ = writeln!(
                o,
                "  {:<8} {:>12} {:>11.0} {:>8} {:>8} {:>9}",
                s.name,
                s.target_iops.map_or("-".into(), |t| t.to_string()),
                s.role.iops,
                ms(s.role.p50_ns),
                ms(s.role.p99_ns),
                ms(s.role.p999_ns)
            );
        }
        let names: Vec<String> = rc
            .steps
            .first()
            .map(|s| s.volumes.iter().map(|v| v.target.clone()).collect())
            .unwrap_or_default();
        for n in names {
            let points: Vec<String> = rc
                .steps
                .iter()
                .filter_map(|s| {
                    let v = s.volumes.iter().find(|v| v.target == n)?;
                    Some(format!(
                        "{} {:.0} IOPS p99 {} ms",
                        s.name,
                        v.iops,
                        ms(v.p99_ns)
                    ))
                })
                .collect();
            let _ = writeln!(o, "  {n}: {}", points.join("; "));
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_has_one_line_per_step_and_one_per_volume() {
        let fig = |t: &str, iops: f64, p99: u64| StepFigures {
            target: t.into(),
            iops,
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
        let t = render_text(&c);
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
}
