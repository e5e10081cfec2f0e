//! The readable final report of a cluster run.

pub mod chokepoint;
pub mod curve;
pub mod drill;
pub mod mirror;
pub mod sweep;

use std::fmt::Write;

use crate::results::{AgentState, DirSummary, RunResults, RunStatus, Summary};

/// Milliseconds with three significant figures or so (curve and sweep tables use it too).
pub(crate) fn ms(ns: u64) -> String {
    let v = ns as f64 / 1e6;
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn mib(bps: f64) -> String {
    format!("{:.1}", bps / 1048576.0)
}

/// The latency a summary is judged by: from the intended issue in rate mode.
fn judged(d: &DirSummary) -> &crate::results::LatSummary {
    d.lat_intended.as_ref().unwrap_or(&d.lat)
}

fn summary_line(s: &Summary) -> String {
    let t = &s.total;
    let l = judged(t);
    format!(
        "{:>9.0} {:>9.0} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>6}",
        s.read.iops,
        s.write.iops,
        mib(s.read.bytes_per_sec + s.write.bytes_per_sec),
        ms(l.mean_ns as u64),
        ms(l.p(50.0)),
        ms(l.p(99.0)),
        ms(l.p(99.9)),
        ms(l.max_ns),
        t.errors
    )
}

const HEAD: &str =
    "read IOPS write IOPS    MiB/s  mean ms   p50 ms   p99 ms p99.9 ms   max ms errors";

/// The whole text report: one section after another, each from the results alone.
pub fn render(r: &RunResults) -> String {
    let mut o = String::new();
    header(&mut o, r);
    agents(&mut o, r);
    volumes_nodes_cluster(&mut o, r);
    faults(&mut o, r);
    if let Some(d) = r.drill.as_ref().filter(|d| !d.faults.is_empty()) {
        let _ = write!(o, "\ndrill: {}", drill::render_text(d));
    }
    if let Some(m) = &r.mirror {
        let _ = write!(o, "\nmirrored pairs:\n{}", mirror::render_text(m));
    }
    o.push_str(&drill::render_stuck_and_verify(r));
    if let Some(c) = r.series.as_ref().and_then(|s| s.curve.as_ref()) {
        o.push('\n');
        o.push_str(&curve::render_text(c));
    }
    if let Some(sw) = r.series.as_ref().and_then(|s| s.sweep.as_ref()) {
        o.push('\n');
        o.push_str(&sweep::render_text(sw));
    }
    if let Some(c) = &r.chokepoint {
        let _ = writeln!(o, "\nchokepoint: {}", chokepoint::render_text(c));
    }
    objectives_and_warnings(&mut o, r);
    o
}

fn header(o: &mut String, r: &RunResults) {
    let status = match r.status {
        RunStatus::Completed => "completed".to_string(),
        RunStatus::Aborted => format!("ABORTED ({})", r.status_reason),
        RunStatus::Partial => format!("PARTIAL ({})", r.status_reason),
    };
    let _ = writeln!(
        o,
        "lockstep run {} (plan {}): {status}, {:.1} s measured, {} agents, {} volumes, interval {} ms",
        r.run_id,
        r.plan,
        r.duration_ms as f64 / 1000.0,
        r.agents.len(),
        r.volumes.len(),
        r.interval_ms
    );
    let _ = writeln!(
        o,
        "start skew (measured): {}",
        r.start_skew_ns.map_or("n/a".into(), |s| format!(
            "{:.3} ms across agents",
            s as f64 / 1e6
        ))
    );
    if let Some(d) = &r.data {
        let _ = writeln!(
            o,
            "latency histograms: {} significant digits{}",
            d.histogram_digits,
            if d.histogram_digits == 2 {
                " (histogram_digits = 2: intervals, merge and data files in 1% buckets; fio.json at 3)"
            } else {
                ""
            }
        );
    }
}

fn agents(o: &mut String, r: &RunResults) {
    let _ = writeln!(o, "\nagents:");
    for a in &r.agents {
        let state = match &a.state {
            AgentState::Finished => "ok".to_string(),
            AgentState::Lost { at_ms, reason } => {
                format!("LOST at t={:.1}s ({reason})", *at_ms as f64 / 1000.0)
            }
            AgentState::Failed { reason } => format!("FAILED ({reason})"),
        };
        let _ = writeln!(
            o,
            "  {:<14} {:<22} clock offset {:+9.3} ms (rtt {:.3} ms), started {}, {state}",
            a.name,
            a.address,
            a.clock.offset_ns as f64 / 1e6,
            a.clock.rtt_ns as f64 / 1e6,
            a.start_lateness_ns
                .map_or("?".into(), |l| format!("{:+.3} ms", l as f64 / 1e6)),
        );
        for e in a.errors.iter().take(3) {
            let _ = writeln!(o, "      {e}");
        }
    }
}

fn volumes_nodes_cluster(o: &mut String, r: &RunResults) {
    let open_loop = r
        .volumes
        .iter()
        .any(|v| v.summary.total.lat_intended.is_some());
    let _ = writeln!(
        o,
        "\nvolumes (latency {}):",
        if open_loop {
            "from the intended issue time, coordinated omission corrected"
        } else {
            "from issue to completion"
        }
    );
    let _ = writeln!(o, "  {:<24} {:<10} {HEAD}  queue", "node/volume", "role");
    for v in &r.volumes {
        let lost = v.lost_at_ms.map_or(String::new(), |t| {
            format!("  lost at {:.1}s", t as f64 / 1000.0)
        });
        let _ = writeln!(
            o,
            "  {:<24} {:<10} {}  {:>5.1}{lost}",
            format!("{}/{}", v.node, v.volume),
            v.role,
            summary_line(&v.summary),
            v.outstanding_mean,
        );
    }
    if r.nodes.len() > 1 {
        let _ = writeln!(o, "\nnodes:");
        let _ = writeln!(o, "  {:<35} {HEAD}", "node");
        for n in &r.nodes {
            let _ = writeln!(o, "  {:<35} {}", n.node, summary_line(&n.summary));
        }
    }
    let _ = writeln!(o, "\ncluster (merged histograms of every volume):");
    let _ = writeln!(o, "  {:<35} {HEAD}", "");
    let _ = writeln!(o, "  {:<35} {}", "all volumes", summary_line(&r.cluster));
    if open_loop {
        let t = &r.cluster.total;
        if let Some(li) = &t.lat_intended {
            let _ = writeln!(
                o,
                "  p99.9 from intended issue {} ms vs from actual issue {} ms (the difference is time IOs waited to be issued)",
                ms(li.p(99.9)),
                ms(t.lat.p(99.9))
            );
        }
    }
}

fn faults(o: &mut String, r: &RunResults) {
    if !r.faults.is_empty() {
        let _ = writeln!(o, "\nfaults injected:");
        for f in &r.faults {
            let _ = writeln!(
                o,
                "  {}/{}: {} from t={:.1}s{}",
                f.node,
                f.volume,
                f.fault,
                f.start_ms as f64 / 1000.0,
                f.end_ms.map_or(" to the end".into(), |e| format!(
                    " to t={:.1}s",
                    e as f64 / 1000.0
                ))
            );
        }
    }
}

fn objectives_and_warnings(o: &mut String, r: &RunResults) {
    if !r.objectives.is_empty() {
        let _ = writeln!(o, "\nobjectives:");
        for ob in &r.objectives {
            let _ = writeln!(
                o,
                "  [{}] {}",
                if ob.passed { "pass" } else { "FAIL" },
                ob.objective
            );
            for f in ob.failures.iter().take(5) {
                let _ = writeln!(o, "         {f}");
            }
        }
    }
    if !r.warnings.is_empty() {
        let _ = writeln!(o, "\nwarnings:");
        for w in &r.warnings {
            let _ = writeln!(o, "  - {w}");
        }
    }
}
