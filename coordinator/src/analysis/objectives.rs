//! The plan's objectives judged on a finished run: pass or fail per volume, node or cluster,
//! with the measured value and, for a failure, why.

use crate::plan::Assignment;
use crate::results::{ObjectiveResult, RunResults};

/// Evaluates the plan's objectives on the results (latency from merged histograms). An
/// objective fails on every volume, node or cluster it covers whose data is incomplete (see
/// `results::incomplete_volumes`), with the reason: what was not measured cannot pass.
/// Expects the stuck IOs and verification results already collected into `r`.
pub fn evaluate(a: &Assignment, r: &RunResults) -> Vec<ObjectiveResult> {
    use crate::plan::{Metric, Scope};
    let gaps = crate::results::incomplete_volumes(r);
    let gaps_of = |pick: &dyn Fn(&str, &str) -> bool| -> Vec<String> {
        gaps.iter()
            .filter(|((n, v), _)| pick(n, v))
            .flat_map(|((n, v), why)| why.iter().map(move |w| format!("{n}/{v}: {w}")))
            .collect()
    };
    let role_of = |node: &str, volume: &str| -> String {
        r.volumes
            .iter()
            .find(|v| v.node == node && v.volume == volume)
            .map(|v| v.role.clone())
            .unwrap_or_default()
    };
    let lat_value = |s: &crate::results::Summary,
                     dir: Option<lockstep_core::job::Direction>,
                     m: Metric|
     -> Option<f64> {
        let d = match dir {
            Some(lockstep_core::job::Direction::Read) => &s.read,
            Some(lockstep_core::job::Direction::Write) => &s.write,
            None => &s.total,
        };
        if d.ios == 0 {
            return None;
        }
        let l = d.lat_intended.as_ref().unwrap_or(&d.lat);
        Some(match m {
            Metric::Percentile(p) => l
                .percentiles
                .get(&crate::results::percentile_key(p))
                .copied()? as f64,
            Metric::Mean => l.mean_ns,
            Metric::Max => l.max_ns as f64,
            _ => return None,
        })
    };
    // Lowest per-interval throughput of a set of volumes (summed per interval).
    // Only intervals of measured phases count (the timeline also shows the warm-up).
    let measured = |t_ms: u64| {
        let mid = std::time::Duration::from_millis(t_ms.saturating_sub(r.interval_ms / 2));
        a.phases
            .iter()
            .any(|p| p.measure && p.start <= mid && mid < p.start + p.duration)
    };
    let min_rate = |vols: &[&crate::results::timeline::VolumeSeries],
                    bytes: bool,
                    dir: Option<lockstep_core::job::Direction>|
     -> Option<f64> {
        let mut per: std::collections::BTreeMap<u64, f64> = Default::default();
        for v in vols {
            for p in v.points.iter().filter(|p| measured(p.t_ms)) {
                let secs = p.len_ms.max(1) as f64 / 1000.0;
                let pick = |a: [u64; 2]| match dir {
                    Some(d) => a[d as usize],
                    None => a[0] + a[1],
                };
                let x = if bytes { pick(p.bytes) } else { pick(p.ios) } as f64 / secs;
                *per.entry(p.t_ms).or_default() += x;
            }
        }
        per.values().copied().reduce(f64::min)
    };
    let fmt_value = |m: Metric, v: f64| -> String {
        match m {
            Metric::IopsMin => format!("{v:.0} IOPS"),
            Metric::MbpsMin => format!("{:.1} MB/s", v / 1e6),
            _ => format!("{:.3} ms", v / 1e6),
        }
    };
    a.objectives
        .iter()
        .map(|o| {
            let in_role = |role: &str| o.role.as_deref().is_none_or(|r| r == role);
            // Incomplete data first, whatever the scope (a node or the cluster with a volume
            // missing is incomplete too): the figures below are judged on what is left.
            let mut failures = gaps_of(&|n, v| in_role(&role_of(n, v)));
            let mut check =
                |who: String,
                 summary: &crate::results::Summary,
                 series: Vec<&crate::results::timeline::VolumeSeries>| {
                    let value = match o.metric {
                        Metric::IopsMin => min_rate(&series, false, o.direction),
                        Metric::MbpsMin => min_rate(&series, true, o.direction),
                        m => lat_value(summary, o.direction, m),
                    };
                    match value {
                        Some(v) if !o.holds(v) => {
                            failures.push(format!("{who}: {} {}", o.metric, fmt_value(o.metric, v)))
                        }
                        Some(_) => {}
                        None => {}
                    }
                };
            match o.scope {
                Scope::Volume => {
                    for v in r.volumes.iter().filter(|v| in_role(&v.role)) {
                        let s: Vec<_> = r
                            .timeline
                            .volumes
                            .iter()
                            .filter(|s| s.node == v.node && s.volume == v.volume)
                            .collect();
                        check(format!("{}/{}", v.node, v.volume), &v.summary, s);
                    }
                }
                Scope::Node => {
                    for n in &r.nodes {
                        let s: Vec<_> = r
                            .timeline
                            .volumes
                            .iter()
                            .filter(|s| s.node == n.node && in_role(&s.role))
                            .collect();
                        check(n.node.clone(), &n.summary, s);
                    }
                }
                Scope::Cluster => {
                    let s: Vec<_> = r
                        .timeline
                        .volumes
                        .iter()
                        .filter(|s| in_role(&s.role))
                        .collect();
                    check("cluster".into(), &r.cluster, s);
                }
            }
            ObjectiveResult {
                objective: o.to_string(),
                passed: failures.is_empty(),
                failures,
            }
        })
        .collect()
}
