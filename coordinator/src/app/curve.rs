//! Curve mode (vdbench's `iorate=curve`): the closed-loop maximum, then open-loop steps at
//! percentages of it, each a complete run; the figures come from `crate::analysis::curve`.

use std::collections::BTreeMap;
use std::path::Path;

use super::series::{Step, finish, run_steps};
use super::{RunOutcome, RunSettings};
use crate::analysis::curve::{CurveReport, CurveStep, RoleCurve, curve_roles, figures};
use crate::plan::{AgentInfo, Plan};

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
    settings: &RunSettings,
    plan: &Plan,
    infos: &[AgentInfo],
    out_dir: &Path,
) -> anyhow::Result<RunOutcome> {
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
    let (results, failed) = run_steps(settings, infos, out_dir, "curve", vec![max], |step, run| {
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
    })
    .await?;
    let text = crate::export::text::curve::render_text(&report);
    let series = crate::results::Series {
        curve: Some(report),
        ..Default::default()
    };
    finish(settings, out_dir, "curve", results, series, failed, &text)
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
