//! Sweep mode: one closed-loop run per iodepth (or numjobs) step; the figures and the verdict
//! come from `crate::analysis::sweep`.

use std::path::Path;

use super::series::{Step, finish, run_steps};
use super::{RunOutcome, RunSettings};
use crate::analysis::sweep::{RoleSweep, SweepReport, SweepStep, judge, step_figures, sweep_roles};
use crate::plan::{AgentInfo, DepthSweep, Plan};

/// The plan of step `index`: every sweeping role's workload at its value for the step.
fn step(plan: &Plan, roles: &[(String, DepthSweep)], index: usize) -> Step<usize> {
    let mut p = plan.clone();
    let mut what = Vec::new();
    for r in &mut p.roles {
        if let Some((_, s)) = roles.iter().find(|(n, _)| n == &r.name) {
            let v = s.values[index];
            r.workload = crate::plan::with_depth(&r.workload, s.over, v);
            what.push(format!(
                "role {} at {} {v} (closed loop)",
                r.name,
                s.over.option()
            ));
        }
    }
    // `depth 4`, or `depth 4+depth 16` when the roles' sweeps differ.
    let mut values: Vec<(&str, u32)> = roles
        .iter()
        .map(|(_, s)| (s.over.word(), s.values[index]))
        .collect();
    values.dedup();
    let join = |sep: &str| {
        values
            .iter()
            .map(|(w, v)| format!("{w}{sep}{v}"))
            .collect::<Vec<_>>()
            .join("+")
    };
    Step {
        name: join(" "),
        slug: join(""),
        what: what.join(", "),
        plan: p,
        data: index,
    }
}

/// Runs the sweep: one complete run per value, each in `out_dir/sweep/`.
pub async fn run(
    settings: &RunSettings,
    plan: &Plan,
    infos: &[AgentInfo],
    out_dir: &Path,
) -> anyhow::Result<RunOutcome> {
    let roles = sweep_roles(plan);
    let count = roles.first().map_or(0, |(_, s)| s.values.len());
    let steps = (0..count).map(|i| step(plan, &roles, i)).collect();
    let mut report = SweepReport {
        roles: roles
            .iter()
            .map(|(r, s)| RoleSweep {
                role: r.clone(),
                over: s.over,
                ..Default::default()
            })
            .collect(),
    };
    let (results, failed) = run_steps(settings, infos, out_dir, "sweep", steps, |step, run| {
        for (rs, (_, sweep)) in report.roles.iter_mut().zip(&roles) {
            let (role, volumes) = step_figures(&run.results, &run.entries, &rs.role);
            rs.steps.push(SweepStep {
                depth: sweep.values[step.data],
                dir: run.dir.clone(),
                role,
                volumes,
            });
        }
        Ok(Vec::new())
    })
    .await?;
    report.roles.iter_mut().for_each(judge);
    let text = crate::export::text::sweep::render_text(&report);
    let series = crate::results::Series {
        sweep: Some(report),
        ..Default::default()
    };
    finish(settings, out_dir, "sweep", results, series, failed, &text)
}
