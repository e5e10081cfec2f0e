//! The rate-curve section of the text report.

use super::ms;
use crate::results::curve::CurveReport;

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
