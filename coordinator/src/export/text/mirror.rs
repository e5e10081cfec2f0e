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
    if !p.link_error.is_empty() {
        let _ = writeln!(o, "    last link error: {}", p.link_error);
    }
}
