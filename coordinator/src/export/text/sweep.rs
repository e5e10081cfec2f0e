//! The sweep section of the text report.

use super::ms;
use crate::results::sweep::SweepOver;
use crate::results::sweep::{LITTLE_SHORTFALL, SweepReport};

/// The sweep section of the text report: per role, one line per step with Little's law beside
/// the measured IOPS, the verdict, then per volume its steps and verdict.
pub fn render_text(r: &SweepReport) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    for rs in &r.roles {
        let w = rs.over.word();
        let what = match rs.over {
            SweepOver::Iodepth => "iodepth of every job",
            SweepOver::Numjobs => "numjobs of every job, each at its iodepth",
            SweepOver::Volumes => "volumes of each agent running the workload",
            SweepOver::RateIops => "open-loop rate per volume",
        };
        let _ = writeln!(
            o,
            "{w} sweep, role {} ({what}; closed loop, latency from the actual issue; \
             expected: IOPS by Little's law, outstanding / mean latency):",
            rs.role
        );
        let _ = writeln!(
            o,
            "  {w:>7} {:>11} {:>11} {:>8} {:>8} {:>8} {:>9} {:>16}",
            "outstanding", "role IOPS", "mean ms", "p50 ms", "p99 ms", "p99.9 ms", "expected"
        );
        let mut short = Vec::new();
        for s in &rs.steps {
            let f = &s.role;
            let share = if f.littles_iops > 0.0 {
                f.lat.iops / f.littles_iops
            } else {
                0.0
            };
            if f.littles_iops > 0.0 && share < LITTLE_SHORTFALL {
                short.push(format!("{w} {} ({:.0}%)", s.depth, share * 100.0));
            }
            let _ = writeln!(
                o,
                "  {:>7} {:>11} {:>11.0} {:>8} {:>8} {:>8} {:>9} {:>16}",
                s.depth,
                f.outstanding,
                f.lat.iops,
                ms(f.lat.mean_ns as u64),
                ms(f.lat.p50_ns),
                ms(f.lat.p99_ns),
                ms(f.lat.p999_ns),
                format!("{:.0} ({:.0}%)", f.littles_iops, share * 100.0)
            );
        }
        let _ = writeln!(o, "  verdict: {}", rs.verdict.text);
        render_throughput(&mut o, rs);
        if !short.is_empty() {
            let _ = writeln!(
                o,
                "  note: below {:.0}% of Little's law at {}: fewer IOs were in flight than \
                 configured, so the load generator, not the volume, limited those steps",
                LITTLE_SHORTFALL * 100.0,
                short.join(", ")
            );
        }
        for v in &rs.volume_verdicts {
            let steps: Vec<String> = rs
                .steps
                .iter()
                .filter_map(|s| {
                    let f = s.volumes.iter().find(|f| f.lat.target == v.target)?;
                    Some(format!(
                        "{} {:.0} IOPS {} ms",
                        s.depth,
                        f.lat.iops,
                        ms(f.lat.mean_ns as u64)
                    ))
                })
                .collect();
            let _ = writeln!(o, "  {} ({w}: IOPS, mean): {}", v.target, steps.join("; "));
            let _ = writeln!(o, "    {}", v.text);
        }
    }
    o
}

/// Per node and step: how many volumes ran, MB/s per volume and in all; then the answers.
fn render_throughput(o: &mut String, rs: &crate::results::sweep::RoleSweep) {
    use std::fmt::Write;
    let w = rs.over.word();
    let mut nodes: Vec<&str> = Vec::new();
    for n in rs.steps.iter().flat_map(|s| &s.nodes) {
        if !nodes.contains(&n.node.as_str()) {
            nodes.push(&n.node);
        }
    }
    if !nodes.is_empty() {
        let _ = writeln!(
            o,
            "  {:>7}  {:<12} {:>7} {:>15} {:>10} {:>10}",
            w, "node", "volumes", "MB/s per volume", "node MB/s", "node IOPS"
        );
    }
    for s in &rs.steps {
        for n in nodes
            .iter()
            .filter_map(|name| s.nodes.iter().find(|n| &n.node == name))
        {
            let per = n.mb_s / f64::from(n.volumes.max(1));
            let _ = writeln!(
                o,
                "  {:>7}  {:<12} {:>7} {:>15.1} {:>10.1} {:>10.0}",
                s.depth, n.node, n.volumes, per, n.mb_s, n.iops
            );
        }
    }
    for k in &rs.answers {
        let _ = writeln!(o, "  answer: {}: {}", k.target, k.text);
    }
}
