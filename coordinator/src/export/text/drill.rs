//! The drill, stuck-IO and verification sections of the text report.

use crate::results::RunResults;
use crate::results::drill::{DrillReport, Percentiles};

/// The stuck-IO and verification sections of the text report (empty when there is neither).
pub fn render_stuck_and_verify(r: &RunResults) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    if !r.stuck_ios.is_empty() {
        let _ = writeln!(
            o,
            "\nstuck IOs (slower than the stuck_timeout, default 5 s):"
        );
        for s in r.stuck_ios.iter().take(20) {
            let _ = writeln!(
                o,
                "  {}/{}: {} of {} bytes at offset {} of {}, issued at t={}s, {} {} ms",
                s.node,
                s.volume,
                s.direction,
                s.len,
                s.offset,
                s.file,
                secs(s.start_ms),
                if s.completed {
                    "took"
                } else {
                    "STILL IN FLIGHT after"
                },
                s.latency_ms
            );
        }
        if r.stuck_ios.len() > 20 {
            let _ = writeln!(o, "  ... {} more in results.json", r.stuck_ios.len() - 20);
        }
    }
    if !r.verify.is_empty() {
        let _ = writeln!(o, "\nverify (crc32c, every acknowledged write re-read):");
        for v in &r.verify {
            let rep = &v.report;
            let verdict = if rep.bad() == 0 && rep.errors.is_empty() {
                "ok"
            } else {
                "FAILED"
            };
            let _ = writeln!(o, "  {}/{}: {verdict}: {}", v.node, v.volume, rep.summary());
            if rep.dropped_writes > 0 {
                let _ = writeln!(
                    o,
                    "      drop_writes fault: {} writes dropped, {} blocks left without their last acknowledged write",
                    rep.dropped_writes,
                    rep.dropped_blocks.len()
                );
            }
            for f in rep.findings.iter().take(10) {
                let _ = writeln!(o, "      {f}");
            }
            if rep.findings.len() > 10 {
                let _ = writeln!(
                    o,
                    "      ... {} more in results.json",
                    rep.findings.len() - 10
                );
            }
            for e in &rep.errors {
                let _ = writeln!(o, "      {e}");
            }
        }
    }
    o
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

fn secs(ms: u64) -> String {
    format!("{:.1}", ms as f64 / 1000.0)
}

/// The drill section of the text report.
pub fn render_text(r: &DrillReport) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let opt = &r.options;
    let _ = writeln!(
        o,
        "baseline: up to {} s before each fault; after: up to {} s; recovered: p99 within {}x baseline (or +{:.1} ms) for {} intervals in a row",
        secs(opt.baseline_ms),
        secs(opt.after_ms),
        opt.tolerance,
        opt.slack_us / 1000.0,
        opt.consecutive
    );
    for f in &r.faults {
        let names: Vec<&str> = f.volumes.iter().map(|v| v.target.as_str()).collect();
        let _ = writeln!(
            o,
            "  {} on {}: t={}s to {}",
            f.fault,
            names.join(", "),
            secs(f.start_ms),
            f.end_ms
                .map_or("the end".into(), |e| format!("t={}s", secs(e)))
        );
        for d in &f.details {
            let _ = writeln!(o, "    {d}");
        }
        let _ = writeln!(
            o,
            "    {:<20} {:<8} {:>11} {:>9} {:>6} {:>8} {:>8} {:>8} | {:>8} {:>8} {:>8}",
            "target",
            "window",
            "t (s)",
            "IOPS",
            "errors",
            "p50 ms",
            "p99 ms",
            "p99.9 ms",
            "int p50",
            "int p99",
            "int p99.9"
        );
        for t in f.volumes.iter().chain(std::iter::once(&f.cluster)) {
            let mut first = true;
            for (label, w) in [
                ("baseline", &t.baseline),
                ("during", &t.during),
                ("after", &t.after),
            ] {
                let Some(w) = w else { continue };
                let name = if first { t.target.as_str() } else { "" };
                first = false;
                // "-" where nothing completed (a stall holds every completion).
                let three = |l: Option<&Percentiles>| match l.filter(|l| l.n > 0) {
                    Some(l) => format!(
                        "{:>8} {:>8} {:>8}",
                        ms(l.p50_ns),
                        ms(l.p99_ns),
                        ms(l.p999_ns)
                    ),
                    None => format!("{:>8} {:>8} {:>8}", "-", "-", "-"),
                };
                let _ = writeln!(
                    o,
                    "    {:<20} {:<8} {:>11} {:>9.1} {:>6} {} | {}",
                    name,
                    label,
                    format!("{}-{}", secs(w.start_ms), secs(w.end_ms)),
                    w.iops,
                    w.errors,
                    three(Some(&w.lat)),
                    three(w.lat_intended.as_ref()),
                );
            }
            let rec = &t.recovery;
            let line = match (rec.recovered_at_ms, rec.recovery_ms) {
                (Some(at), Some(d)) => format!(
                    "recovered: p99 at or below {} ms from t={}s, {} s after the fault ended",
                    ms(rec.threshold_ns.unwrap_or(0)),
                    secs(at),
                    secs(d)
                ),
                _ => format!("recovery: {}", rec.note),
            };
            let _ = writeln!(
                o,
                "    {:<20} {line}",
                if first { t.target.as_str() } else { "" }
            );
        }
    }
    o
}
