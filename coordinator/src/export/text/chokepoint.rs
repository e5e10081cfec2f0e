//! The chokepoint section of the text report: one sentence a person can act on
//! (docs/chokepoint.md, "Reading the verdict": "node agent-3, volume data (60 GiB gp2): IOPS
//! pinned at 180 from t=20s, ..."), then the evidence figures behind it and the credit
//! forecasts.

use std::fmt::Write;

use crate::results::chokepoint::{
    ChokepointKind, ChokepointReport, Confidence, CreditForecast, Verdict, VolumeVerdict,
    trim_float,
};
use crate::results::timeline::VolumeModel;

/// Renders a report as text: the verdict sentence first, then evidence, weaker findings and
/// credit forecasts, one per line.
pub fn render_text(r: &ChokepointReport) -> String {
    let mut s = String::new();
    verdict_text(&mut s, &r.verdict, true);
    for l in &r.lost {
        let _ = writeln!(
            s,
            "{} lost at t={}; the cluster ran without it (and its {} from then on",
            l.node,
            format_duration_ms(l.at_ms),
            match l.volumes {
                1 => "volume)".to_string(),
                n => format!("{n} volumes)"),
            }
        );
    }
    for v in &r.also {
        s.push_str("also: ");
        verdict_text(&mut s, v, false);
    }
    if let (Some(lg), false) = (
        &r.load_generator,
        matches!(r.verdict, Verdict::LoadGeneratorBound(_)),
    ) {
        let _ = writeln!(
            s,
            "note: {} of {} closed-loop volumes kept fewer IOs in flight than configured (median {:.0}% of the depth): part of the load generator is short of work",
            lg.volumes_below,
            lg.volumes_closed_loop,
            lg.outstanding_ratio * 100.0
        );
    }
    for v in &r.suspects {
        s.push_str(&suspect_text(v));
        s.push('\n');
    }
    for f in &r.forecasts {
        if let Some(line) = forecast_text(f) {
            s.push_str(&line);
            s.push('\n');
        }
    }
    for p in &r.phases {
        let _ = write!(
            s,
            "phase '{}' (t={} to {}): ",
            p.phase,
            format_duration_ms(p.start_ms),
            format_duration_ms(p.end_ms)
        );
        verdict_text(&mut s, &p.report.verdict, false);
    }
    if let Some(b) = &r.forecast_before_cliff {
        let _ = writeln!(
            s,
            "forecast made before the cliff, at t={:.0}s: credits run out at t={:.0}s; they did at t={:.0}s ({:+.1}%)",
            b.made_at_ms as f64 / 1000.0,
            b.predicted_ms as f64 / 1000.0,
            b.actual_onset_ms as f64 / 1000.0,
            b.error_pct
        );
    }
    s
}

/// "confidence: sure (30 of 30 intervals flagged, typically 8.2 robust sigmas and 1.5x
/// slower than its peers' center; peers' spread 2.1% latency, 0.4% IOPS)".
fn confidence_text(c: &Confidence) -> String {
    let spread = |x: Option<f64>| match x {
        Some(x) if x.is_finite() => percent(x),
        _ => "unmeasured".to_string(),
    };
    format!(
        "confidence: {} ({} of {} intervals flagged, typically {:.1} robust sigmas and {:.2}x slower than its peers' center; peers' spread {} latency, {} IOPS)",
        c.level.as_str(),
        c.flagged_intervals,
        c.intervals,
        c.median_distance,
        c.slowdown,
        spread(c.peer_cv),
        spread(c.peer_iops_cv),
    )
}

/// A volume that is persistent enough to be named but not clearly out: shown, not blamed.
fn suspect_text(v: &VolumeVerdict) -> String {
    format!(
        "suspect, not yet sure: node {}, volume {} from t={}: {}",
        v.node,
        v.volume,
        format_duration_ms(v.onset_ms),
        confidence_text(&v.confidence)
    )
}

/// What the live view shows: the verdict's first line, then the credit buckets that have not
/// run out yet, soonest first (at most `max_forecasts`). A cliff is worth seeing before it
/// happens, while there is still time to stop the run or resize the volume.
pub fn live_lines(r: &ChokepointReport, max_forecasts: usize) -> Vec<String> {
    let mut first = String::new();
    verdict_text(&mut first, &r.verdict, true);
    let mut lines: Vec<String> = first.lines().take(1).map(str::to_string).collect();
    if matches!(r.verdict, Verdict::None) {
        lines.extend(r.suspects.first().map(suspect_text));
    }
    let mut upcoming: Vec<&CreditForecast> = r
        .forecasts
        .iter()
        .filter(|f| f.runs_out_in_s.is_some())
        .collect();
    upcoming.sort_by(|a, b| {
        a.runs_out_in_s
            .unwrap()
            .total_cmp(&b.runs_out_in_s.unwrap())
    });
    lines.extend(
        upcoming
            .into_iter()
            .take(max_forecasts)
            .filter_map(forecast_text),
    );
    lines
}

/// `875 MB/s`, `87.5 MB/s`, `3,000 IOPS`.
fn ceiling_text(c: &crate::results::chokepoint::NodeCeiling) -> String {
    if c.unit == "IOPS" {
        format!("{} IOPS", count(c.value))
    } else if c.value >= 100.0 {
        format!("{:.0} {}", c.value, c.unit)
    } else {
        format!("{:.1} {}", c.value, c.unit)
    }
}

fn verdict_text(s: &mut String, v: &Verdict, detail: bool) {
    match v {
        Verdict::None => s.push_str(
            "no chokepoint: no volume stayed slower than its peers, and nothing degraded together\n",
        ),
        Verdict::Volume(v) => volume_text(s, v, detail),
        Verdict::Node(n) => {
            match &n.ceiling {
                Some(c) => {
                    let _ = writeln!(
                        s,
                        "node {}: {} together pinned at {} from t={}: an instance limit (a ceiling the node's volumes share, such as its EBS bandwidth or IOPS), not one volume; the cluster would do {} more with it fixed{}",
                        n.node,
                        if n.volumes.len() == n.volumes_total {
                            format!("its {} volumes", n.volumes_total)
                        } else if c.volumes == n.volumes_total {
                            format!(
                                "{} of its {} volumes slowed ({}), all {}",
                                n.volumes.len(),
                                n.volumes_total,
                                n.volumes.join(", "),
                                n.volumes_total
                            )
                        } else {
                            format!("{} of its {} volumes", n.volumes.len(), n.volumes_total)
                        },
                        ceiling_text(c),
                        format_duration_ms(n.onset_ms),
                        more(n.impact.independent_speedup),
                        small_gain_note(n.impact.independent_speedup, n.impact.barrier_speedup, "node"),
                    );
                }
                None => {
                    let _ = writeln!(
                        s,
                        "node {}: {} of its {} volumes degraded together from t={}, node IOPS {} {} vs {} at its volumes' peers' level; this looks like a node-level limit (instance IOPS or bandwidth cap, CPU), not one volume; the cluster would do {} more with it fixed{}",
                        n.node,
                        n.volumes.len(),
                        n.volumes_total,
                        format_duration_ms(n.onset_ms),
                        if n.iops_cv <= 0.1 { "flat at" } else { "at" },
                        count(n.iops),
                        count(n.peer_iops),
                        more(n.impact.independent_speedup),
                        small_gain_note(n.impact.independent_speedup, n.impact.barrier_speedup, "node"),
                    );
                }
            }
            if detail {
                let _ = writeln!(s, "  {}", confidence_text(&n.confidence));
            }
        }
        Verdict::ClusterWide(c) => {
            let _ = writeln!(
                s,
                "cluster-wide slowdown from t={}: median latency {} its earlier level (IOPS {}) with {} of {} volumes slower (role{} {}); not one volume: look at what they share (network, instance type, storage backend)",
                format_duration_ms(c.onset_ms),
                times(c.latency_factor),
                times(c.iops_factor),
                c.volumes_degraded,
                c.volumes,
                if c.roles.len() == 1 { "" } else { "s" },
                c.roles.join(", "),
            );
        }
        Verdict::LoadGeneratorBound(lg) => {
            let _ = writeln!(
                s,
                "the load generator is the limit, not the storage: {} of {} closed-loop volumes kept a median {:.0}% of their configured depth in flight while no volume was slow; add jobs, iodepth or agent CPU before reading these figures as the storage's",
                lg.volumes_below,
                lg.volumes_closed_loop,
                lg.outstanding_ratio * 100.0
            );
        }
    }
}

fn volume_text(s: &mut String, v: &VolumeVerdict, detail: bool) {
    let e = &v.evidence;
    let model = v
        .model
        .as_ref()
        .and_then(describe_model)
        .map(|m| format!(" ({m})"))
        .unwrap_or_default();
    let what = match v.kind {
        ChokepointKind::Throttled | ChokepointKind::CreditExhaustion => {
            format!("IOPS pinned at {}", count(e.iops_median))
        }
        ChokepointKind::FailSlow => format!("latency {} its peers'", times(v.impact.latency_ratio)),
        ChokepointKind::Erroring => format!("errors on {} of IOs", percent(e.error_fraction)),
    };
    let looks = match v.kind {
        ChokepointKind::Throttled => "a throttle (IOPS flat at a ceiling)",
        ChokepointKind::CreditExhaustion => "burst credits running out",
        ChokepointKind::FailSlow => "a fail-slow device (latency up without a ceiling)",
        ChokepointKind::Erroring => "a failing volume (sustained IO errors)",
    };
    let _ = writeln!(
        s,
        "node {}, volume {}{}: {} from t={}, p99 {} vs {} on its {} peer{}; this looks like {}; the cluster would do {} more with it fixed{}",
        v.node,
        v.volume,
        model,
        what,
        format_duration_ms(v.onset_ms),
        latency(e.p99_us),
        latency(e.peer_p99_us),
        e.peers,
        if e.peers == 1 { "" } else { "s" },
        looks,
        more(v.impact.independent_speedup),
        small_gain_note(
            v.impact.independent_speedup,
            v.impact.barrier_speedup,
            "volume"
        ),
    );
    if !detail {
        return;
    }
    let _ = writeln!(
        s,
        "  evidence: IOPS {} vs {} on its peers (variation {}{}), mean latency {} vs {}{}, {} IOs outstanding vs {:.1} by Little's law (IOPS x latency){}; {} of {} intervals flagged, score {}",
        count(e.iops),
        count(e.peer_iops),
        percent(e.iops_cv),
        e.iops_before
            .map(|b| format!(", {} before the onset", count(b)))
            .unwrap_or_default(),
        latency(e.latency_mean_us),
        latency(e.peer_latency_mean_us),
        e.latency_robust_z
            .map(|z| format!(
                " ({z:.0} robust sigmas out; peers within +-{})",
                percent(e.peer_latency_spread)
            ))
            .unwrap_or_default(),
        format_args!("{:.1}", e.outstanding),
        e.littles_outstanding,
        if e.configured_depth > 0 {
            format!(", depth {} configured", e.configured_depth)
        } else {
            String::new()
        },
        e.flagged_intervals,
        e.intervals,
        v.score,
    );
    let _ = writeln!(s, "  {}", confidence_text(&v.confidence));
    if let Some(c) = &e.credit {
        let unit = c.model.unit.rate_name();
        let _ = write!(
            s,
            "  credits: {} baseline {} {unit}, {} {unit} after the onset{}",
            c.model.describe(),
            count(c.model.baseline),
            count(c.rate_after),
            if c.at_baseline {
                " (at the baseline)"
            } else {
                ""
            },
        );
        match c.forecast_onset_ms {
            Some(f) => {
                let _ = writeln!(
                    s,
                    "; at the {} {unit} it did before, a full bucket lasts until t={}: the onset {} the forecast",
                    count(c.demand_before),
                    format_duration_ms(f),
                    if c.onset_matches_forecast {
                        "matches"
                    } else {
                        "does not match"
                    },
                );
            }
            None => s.push('\n'),
        }
    }
    let _ = writeln!(
        s,
        "  impact: independent workloads {} the cluster's IOPS, a stage waiting for the slowest volume {} sooner",
        times(v.impact.independent_speedup),
        times(v.impact.barrier_speedup),
    );
}

fn forecast_text(f: &CreditForecast) -> Option<String> {
    let unit = f.model.unit.rate_name();
    let who = format!(
        "{}{}{}",
        f.node,
        if f.volume.starts_with('/') { "" } else { "/" },
        f.volume
    );
    if let Some(secs) = f.runs_out_in_s {
        return Some(format!(
            "{who}: {} credits run out in ~{} at current demand ({} {unit}, baseline {})",
            f.model.kind,
            format_duration_ms((secs * 1000.0).round() as u64),
            count(f.demand),
            count(f.model.baseline),
        ));
    }
    f.exhausted_at_ms.map(|t| {
        format!(
            "{who}: {} credits ran out at t={} ({} {unit} now, baseline {})",
            f.model.kind,
            format_duration_ms(t),
            count(f.demand),
            count(f.model.baseline),
        )
    })
}

fn describe_model(m: &VolumeModel) -> Option<String> {
    match (m.kind.is_empty(), m.size_gib > 0.0) {
        (true, false) => None,
        (true, true) => Some(format!("{} GiB", trim_float(m.size_gib))),
        (false, false) => Some(m.kind.clone()),
        (false, true) => Some(format!("{} GiB {}", trim_float(m.size_gib), m.kind)),
    }
}

/// "42s", "5m12s", "7h52m": short enough for a sentence, precise to the unit below the largest.
pub fn format_duration_ms(ms: u64) -> String {
    let secs = (ms + 500) / 1000;
    if secs < 60 {
        format!("{secs}s")
    } else if secs < 3600 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        let mins = (secs + 30) / 60;
        format!("{}h{:02}m", mins / 60, mins % 60)
    }
}

/// IOPS and similar: integers with thousands separators, one decimal below 10.
fn count(x: f64) -> String {
    if !x.is_finite() {
        return "?".into();
    }
    if x.abs() < 10.0 {
        return format!("{x:.1}");
    }
    let digits = format!("{:.0}", x.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if x < 0.0 { format!("-{out}") } else { out }
}

fn latency(us: f64) -> String {
    let ms = us / 1000.0;
    if ms >= 10.0 {
        format!("{ms:.0} ms")
    } else if ms >= 1.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.2} ms")
    }
}

/// "2.3x" for a real multiple, "0.4%" for a small gain (one volume of 8,000 barely moves the
/// total, which "1.00x" would hide).
fn more(speedup: f64) -> String {
    if speedup >= 1.1 {
        times(speedup)
    } else {
        percent((speedup - 1.0).max(0.0))
    }
}

/// When the independent gain is small, the barrier-coupled one is the figure that matters.
fn small_gain_note(independent: f64, barrier: f64, what: &str) -> String {
    if independent < 1.1 && barrier >= 1.1 {
        format!(
            ", {} where work waits for the slowest {what}",
            times(barrier)
        )
    } else {
        String::new()
    }
}

fn times(x: f64) -> String {
    if x >= 10.0 {
        format!("{x:.0}x")
    } else if x >= 1.1 {
        format!("{x:.1}x")
    } else {
        format!("{x:.2}x")
    }
}

fn percent(x: f64) -> String {
    let p = x * 100.0;
    if p >= 10.0 {
        format!("{p:.0}%")
    } else {
        format!("{p:.1}%")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_numbers() {
        assert_eq!(format_duration_ms(0), "0s");
        assert_eq!(format_duration_ms(42_400), "42s");
        assert_eq!(format_duration_ms(312_000), "5m12s");
        assert_eq!(format_duration_ms((7 * 3600 + 52 * 60) * 1000), "7h52m");
        assert_eq!(count(180.0), "180");
        assert_eq!(count(3000.4), "3,000");
        assert_eq!(count(1_234_567.0), "1,234,567");
        assert_eq!(count(4.25), "4.2");
        assert_eq!(latency(48_000.0), "48 ms");
        assert_eq!(latency(1_100.0), "1.1 ms");
        assert_eq!(latency(450.0), "0.45 ms");
        assert_eq!(times(2.31), "2.3x");
        assert_eq!(times(16.7), "17x");
        assert_eq!(times(1.08), "1.08x");
        assert_eq!(more(2.31), "2.3x");
        assert_eq!(more(1.0004), "0.0%");
        assert_eq!(more(1.085), "8.5%");
        assert_eq!(
            small_gain_note(1.01, 16.7, "volume"),
            ", 17x where work waits for the slowest volume"
        );
        assert_eq!(small_gain_note(2.3, 16.7, "volume"), "");
    }
}
