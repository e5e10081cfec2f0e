//! Sweep mode: one run per step of what the role sweeps (iodepth, numjobs, volumes per agent or
//! rate); the figures, the verdict and the answer come from `crate::analysis::sweep`.

use std::path::Path;

use super::series::{Step, finish, run_steps};
use super::{RunOutcome, RunSettings};
use crate::analysis::sweep::{
    RoleSweep, SweepReport, SweepStep, judge, node_figures, step_figures, sweep_roles,
};
use crate::plan::{AgentInfo, DepthSweep, Plan, Role, SweepOver};

/// A role's sweep with, for a volumes sweep, the volume names its steps take a prefix of.
struct Swept {
    role: String,
    sweep: DepthSweep,
    names: Vec<String>,
}

/// The plan of step `index`: every sweeping role at its value for the step.
fn step(plan: &Plan, roles: &[Swept], index: usize) -> anyhow::Result<Step<usize>> {
    let mut p = plan.clone();
    let mut what = Vec::new();
    for r in &mut p.roles {
        let Some(s) = roles.iter().find(|s| s.role == r.name) else {
            continue;
        };
        let v = s.sweep.values[index];
        let over = s.sweep.over;
        match over {
            SweepOver::Iodepth | SweepOver::Numjobs => {
                r.workload = crate::plan::with_depth(&r.workload, over, v);
                what.push(format!(
                    "role {} at {} {v} (closed loop)",
                    r.name,
                    over.option()
                ));
            }
            SweepOver::Volumes => {
                let names = s.names[..v as usize].to_vec();
                what.push(format!(
                    "role {} on {v} volumes per agent ({})",
                    r.name,
                    names.join(", ")
                ));
                r.volumes = Some(names);
            }
            SweepOver::RateIops => {
                r.workload = crate::plan::with_rate(&r.workload, Some(u64::from(v)))
                    .map_err(|m| anyhow::anyhow!("role '{}': {m}", r.name))?;
                r.rate_iops = Some(u64::from(v));
                what.push(format!(
                    "role {} at {v} IOPS per volume (open loop)",
                    r.name
                ));
            }
        }
    }
    // `depth 4`, or `depth 4+volumes 6` when the roles' sweeps differ.
    let mut values: Vec<(&str, u32)> = roles
        .iter()
        .map(|s| (s.sweep.over.word(), s.sweep.values[index]))
        .collect();
    values.dedup();
    let join = |sep: &str| {
        values
            .iter()
            .map(|(w, v)| format!("{w}{sep}{v}"))
            .collect::<Vec<_>>()
            .join("+")
    };
    Ok(Step {
        name: join(" "),
        slug: join(""),
        what: what.join(", "),
        plan: p,
        data: index,
    })
}

/// The volume names a volumes sweep takes its steps from: the role's `volumes` as listed, else
/// the names every selected agent has, in natural order (data2 before data10).
fn volume_names(role: &Role, infos: &[AgentInfo], most: u32) -> anyhow::Result<Vec<String>> {
    let agents: Vec<&AgentInfo> = infos
        .iter()
        .filter(|a| role.select.matches(&a.name, &a.labels))
        .collect();
    let names = match &role.volumes {
        Some(v) => v.clone(),
        None => {
            let mut common: Vec<String> = agents
                .first()
                .map(|a| a.volumes.iter().map(|v| v.name.clone()).collect())
                .unwrap_or_default();
            common.retain(|n| {
                agents
                    .iter()
                    .all(|a| a.volumes.iter().any(|v| &v.name == n))
            });
            common.sort_by(|a, b| natural_key(a).cmp(&natural_key(b)));
            common
        }
    };
    if names.len() < most as usize {
        anyhow::bail!(
            "role '{}' (line {}): the sweep over volumes goes up to {most}, but its agents have \
             {} volume(s) in common ({}); start more (--local 1x{most}) or lower the values",
            role.name,
            role.line,
            names.len(),
            names.join(", ")
        );
    }
    Ok(names)
}

/// Sorts `data2` before `data10`: the name without its trailing digits, then their number.
fn natural_key(name: &str) -> (&str, u64, &str) {
    let stem = name.trim_end_matches(|c: char| c.is_ascii_digit());
    let n = name[stem.len()..].parse().unwrap_or(0);
    (stem, n, name)
}

/// Runs the sweep: one complete run per value, each in `out_dir/sweep/`.
pub async fn run(
    settings: &RunSettings,
    plan: &Plan,
    infos: &[AgentInfo],
    out_dir: &Path,
) -> anyhow::Result<RunOutcome> {
    let mut roles = Vec::new();
    for (role, sweep) in sweep_roles(plan) {
        let names = match (sweep.over, plan.roles.iter().find(|r| r.name == role)) {
            (SweepOver::Volumes, Some(r)) => {
                volume_names(r, infos, sweep.values.last().copied().unwrap_or(0))?
            }
            _ => Vec::new(),
        };
        roles.push(Swept { role, sweep, names });
    }
    let count = roles.first().map_or(0, |s| s.sweep.values.len());
    let steps = (0..count)
        .map(|i| step(plan, &roles, i))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut report = SweepReport {
        roles: roles
            .iter()
            .map(|s| RoleSweep {
                role: s.role.clone(),
                over: s.sweep.over,
                ..Default::default()
            })
            .collect(),
    };
    let (results, failed) = run_steps(settings, infos, out_dir, "sweep", steps, |step, run| {
        for (rs, s) in report.roles.iter_mut().zip(&roles) {
            let (role, volumes) = step_figures(&run.results, &run.entries, &rs.role);
            rs.steps.push(SweepStep {
                depth: s.sweep.values[step.data],
                dir: run.dir.clone(),
                role,
                volumes,
                nodes: node_figures(&run.results, &rs.role),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_names_sort_as_a_datanode_counts_its_disks() {
        let mut v = vec!["data10", "data2", "data1", "logs", "data9"];
        v.sort_by(|a, b| natural_key(a).cmp(&natural_key(b)));
        assert_eq!(v, ["data1", "data2", "data9", "data10", "logs"]);
    }
}
