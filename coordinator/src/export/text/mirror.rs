//! The mirrored pairs' section of the text report: per mirroring role, the breakdown of a
//! mirrored write (at the median and in means, with how far the parts are from the whole), and
//! per pair what the primary saw of its backup.

use std::fmt::Write;

use super::ms;
use crate::results::mirror::{MirrorPair, MirrorReport, MirrorRole};

pub fn render_text(r: &MirrorReport) -> String {
    let mut o = String::new();
    for role in &r.roles {
        role_text(&mut o, role);
        for p in &role.pairs {
            pair_text(&mut o, p);
        }
    }
    o
}

fn role_text(o: &mut String, r: &MirrorRole) {
    let mode = if r.sync { "sync" } else { "async" };
    let _ = writeln!(
        o,
        "role {} ({mode}, +{} us delay): {} writes mirrored, {} unmirrored",
        r.role, r.delay_us, r.mirrored, r.unmirrored
    );
    if r.local.n == 0 {
        let _ = writeln!(o, "  no write was acknowledged by a backup");
        return;
    }
    let p50 = |s: &crate::results::LatSummary| ms(s.p(50.0));
    let mean = |s: &crate::results::LatSummary| ms(s.mean_ns as u64);
    if r.sync {
        let _ = writeln!(
            o,
            "  mirrored writes: p50 {} ms = local {} + network {} + remote {}",
            p50(&r.total),
            p50(&r.local),
            p50(&r.network),
            p50(&r.remote)
        );
        let _ = writeln!(
            o,
            "  means: {} ms measured; local {} + network {} + remote {} = {} ({:+.1}%)",
            mean(&r.total),
            mean(&r.local),
            mean(&r.network),
            mean(&r.remote),
            ms((r.local.mean_ns + r.network.mean_ns + r.remote.mean_ns) as u64),
            r.breakdown_gap_pct.unwrap_or(0.0)
        );
        let _ = writeln!(
            o,
            "  p99: measured {} ms; local {}, network {}, remote {}; role write mean {} ms over {} writes",
            ms(r.total.p(99.0)),
            ms(r.local.p(99.0)),
            ms(r.network.p(99.0)),
            ms(r.remote.p(99.0)),
            mean(&r.measured_write),
            r.measured_write.n
        );
    } else {
        let _ = writeln!(
            o,
            "  writes complete locally: local p50 {} ms; the backup lags by p50 {} ms, p99 {} ms, max {} ms (network {} + remote {} at p50)",
            p50(&r.local),
            p50(&r.lag),
            ms(r.lag.p(99.0)),
            ms(r.lag.max_ns),
            p50(&r.network),
            p50(&r.remote)
        );
    }
}

fn pair_text(o: &mut String, p: &MirrorPair) {
    let s = |t_ms: u64| format!("{:.1}s", t_ms as f64 / 1000.0);
    let _ = write!(
        o,
        "  {} -> {}: {} mirrored, {} unmirrored; longest stall {} ms at t={}",
        p.primary,
        p.backup,
        p.mirrored,
        p.unmirrored,
        p.longest_stall_ms,
        s(p.longest_stall_at_ms)
    );
    for f in &p.failover_at_ms {
        let _ = write!(o, "; failed over to async at t={}", s(*f));
    }
    for r in &p.recovered_at_ms {
        let _ = write!(o, "; backup returned at t={}", s(*r));
    }
    if p.did_not_return {
        let _ = write!(o, "; the backup did not return");
    }
    o.push('\n');
    catchup_text(o, p);
    if !p.link_error.is_empty() {
        let _ = writeln!(o, "    last link error: {}", p.link_error);
    }
}

/// What the backup missed and how it was caught up, or how far behind it ended.
fn catchup_text(o: &mut String, p: &MirrorPair) {
    if p.missed_writes == 0 && p.catchups.is_empty() && p.behind_bytes == 0 {
        return;
    }
    let s = |t_ms: u64| format!("{:.1}s", t_ms as f64 / 1000.0);
    let _ = write!(
        o,
        "    missed {} writes ({} MiB)",
        p.missed_writes,
        mib(p.missed_bytes)
    );
    for c in &p.catchups {
        match c.duration_ms {
            Some(d) => {
                let _ = write!(
                    o,
                    "; caught up {} MiB from t={} in {d} ms",
                    mib(c.bytes),
                    s(c.start_ms)
                );
            }
            None => {
                let _ = write!(
                    o,
                    "; catch-up from t={} ({} MiB sent)",
                    s(c.start_ms),
                    mib(c.bytes)
                );
            }
        }
    }
    match p.valid_again_at_ms {
        Some(t) if p.behind_bytes == 0 => {
            let _ = write!(o, "; a valid fail-over target again at t={}", s(t));
        }
        _ if p.behind_bytes > 0 => {
            let _ = write!(
                o,
                "; not caught up: {} MiB behind at the end",
                mib(p.behind_bytes)
            );
        }
        _ => {}
    }
    o.push('\n');
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1u64 << 20) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> MirrorPair {
        MirrorPair {
            primary: "agent-1/data".into(),
            backup: "agent-2".into(),
            missed_writes: 1_497,
            missed_bytes: 1_497 * 8192,
            ..MirrorPair::default()
        }
    }

    #[test]
    fn a_caught_up_pair_gives_its_catch_up_and_when_it_was_a_valid_target_again() {
        let mut p = pair();
        p.catchups = vec![crate::results::mirror::MirrorCatchUp {
            start_ms: 13_050,
            duration_ms: Some(310),
            bytes: 12 << 20,
        }];
        p.valid_again_at_ms = Some(13_360);
        let mut o = String::new();
        catchup_text(&mut o, &p);
        assert_eq!(
            o,
            "    missed 1497 writes (11.7 MiB); caught up 12.0 MiB from t=13.1s in 310 ms; \
             a valid fail-over target again at t=13.4s\n"
        );
    }

    #[test]
    fn a_backup_that_never_returned_is_not_caught_up() {
        let mut p = pair();
        p.behind_bytes = 5 << 20;
        let mut o = String::new();
        catchup_text(&mut o, &p);
        assert_eq!(
            o,
            "    missed 1497 writes (11.7 MiB); not caught up: 5.0 MiB behind at the end\n"
        );
        let mut quiet = String::new();
        catchup_text(&mut quiet, &MirrorPair::default());
        assert_eq!(quiet, "", "nothing missed: no line");
    }
}
