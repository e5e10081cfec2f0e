//! The mirror report from the primaries' final results: histograms merged per role (never
//! averaged), the breakdown checked against the role's measured write latency, and per pair
//! what a backup failure did (stall, fail-over, return, what it missed, its catch-up).

use lockstep_proto::histogram::SparseHistogram;
use lockstep_proto::v1::MirrorTotals;

use crate::results::mirror::{MirrorCatchUp, MirrorPair, MirrorReport, MirrorRole};
use crate::results::{LatSummary, RunResults};

/// The report, or `None` when no volume mirrored its writes.
pub fn analyze(r: &RunResults) -> Option<MirrorReport> {
    let mut roles: Vec<(MirrorRole, [Option<SparseHistogram>; 5])> = Vec::new();
    for (node, v) in &r.finals {
        let Some(m) = &v.mirror else { continue };
        let role = r
            .volumes
            .iter()
            .find(|x| x.node == *node && x.volume == v.volume)
            .map(|x| x.role.clone())
            .unwrap_or_default();
        let i = match roles.iter().position(|(x, _)| x.role == role) {
            Some(i) => i,
            None => {
                let fresh = MirrorRole {
                    role: role.clone(),
                    sync: m.sync,
                    delay_us: m.delay_us,
                    ..MirrorRole::default()
                };
                roles.push((fresh, Default::default()));
                roles.len() - 1
            }
        };
        let (out, hists) = &mut roles[i];
        out.mirrored += m.mirrored;
        out.unmirrored += m.unmirrored;
        let wires = [
            &m.local_hist,
            &m.network_hist,
            &m.remote_hist,
            &m.total_hist,
            &m.lag_hist,
        ];
        for (acc, bytes) in hists.iter_mut().zip(wires) {
            add(acc, bytes);
        }
        out.pairs.push(pair(node, &v.volume, m));
    }
    if roles.is_empty() {
        return None;
    }
    let roles = roles
        .into_iter()
        .map(|(mut role, hists)| {
            let s =
                |h: &Option<SparseHistogram>| h.as_ref().map(LatSummary::of).unwrap_or_default();
            role.local = s(&hists[0]);
            role.network = s(&hists[1]);
            role.remote = s(&hists[2]);
            role.total = s(&hists[3]);
            role.lag = s(&hists[4]);
            role.measured_write = measured_write(r, &role.role);
            role.breakdown_gap_pct = breakdown_gap_pct(&role);
            role
        })
        .collect();
    Some(MirrorReport { roles })
}

fn add(acc: &mut Option<SparseHistogram>, bytes: &[u8]) {
    let Ok(Some(h)) = lockstep_proto::histogram::decode(bytes) else {
        return;
    };
    let h = SparseHistogram::from_dense(&h);
    match acc {
        Some(a) => {
            let _ = a.merge(&h);
        }
        None => *acc = Some(h),
    }
}

fn pair(node: &str, volume: &str, m: &MirrorTotals) -> MirrorPair {
    let last_failover = m.failover_at_ms.iter().max().copied();
    let last_return = m.recovered_at_ms.iter().max().copied();
    MirrorPair {
        primary: format!("{node}/{volume}"),
        backup: m.backup_agent.clone(),
        mirrored: m.mirrored,
        unmirrored: m.unmirrored,
        longest_stall_ms: m.longest_stall_ms,
        longest_stall_at_ms: m.longest_stall_at_ms,
        failover_at_ms: m.failover_at_ms.clone(),
        recovered_at_ms: m.recovered_at_ms.clone(),
        did_not_return: did_not_return(last_failover, last_return),
        link_error: m.link_error.clone(),
        missed_writes: m.missed_writes,
        missed_bytes: m.missed_bytes,
        catchups: m
            .catchups
            .iter()
            .map(|c| MirrorCatchUp {
                start_ms: c.start_ms,
                duration_ms: c.done.then(|| c.end_ms.saturating_sub(c.start_ms)),
                bytes: c.bytes,
            })
            .collect(),
        valid_again_at_ms: valid_again_at(m, last_failover),
        behind_bytes: m.behind_bytes,
    }
}

/// When the pair was a valid fail-over target again: the end of the finished catch-up that
/// ended last (a volume's job clones catch up one each, and the merged list is sorted by
/// start, so the last to start need not be the last to end), if no catch-up began after it
/// and did not finish, the backup was owed nothing at the end and no fail-over came after it. `None` when nothing was ever missed, or the
/// backup was still behind.
fn valid_again_at(m: &MirrorTotals, last_failover: Option<u64>) -> Option<u64> {
    let end = m
        .catchups
        .iter()
        .filter(|c| c.done)
        .map(|c| c.end_ms)
        .max()?;
    // A catch-up that began after that and never finished: the pair was not whole at the end.
    if m.catchups.iter().any(|c| !c.done && c.start_ms >= end) {
        return None;
    }
    let after_failover = last_failover.is_none_or(|f| end >= f);
    (m.behind_bytes == 0 && after_failover).then_some(end)
}

/// A fail-over with no return after it.
fn did_not_return(last_failover: Option<u64>, last_return: Option<u64>) -> bool {
    match (last_failover, last_return) {
        (Some(f), Some(r)) => r < f,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// The role's write latency over the measured phases: its volumes' write summaries merged by
/// weight of IOs (the means of the volumes' exact histograms).
fn measured_write(r: &RunResults, role: &str) -> LatSummary {
    let mut n = 0u64;
    let mut sum = 0.0;
    let mut out = LatSummary::default();
    for v in r.volumes.iter().filter(|v| v.role == role) {
        let w = &v.summary.write.lat;
        n += w.n;
        sum += w.mean_ns * w.n as f64;
        if out.n == 0 || w.n > out.n {
            out = w.clone();
        }
    }
    if n > 0 {
        out.n = n;
        out.mean_ns = sum / n as f64;
    }
    out
}

/// How far the sum of the breakdown's means is from the measured mean of the same writes, in
/// percent; sync mode only (an async write's latency does not include the mirror).
pub fn breakdown_gap_pct(role: &MirrorRole) -> Option<f64> {
    if !role.sync || role.total.n == 0 || role.total.mean_ns <= 0.0 {
        return None;
    }
    let sum = role.local.mean_ns + role.network.mean_ns + role.remote.mean_ns;
    Some((sum / role.total.mean_ns - 1.0) * 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mean(ns: f64) -> LatSummary {
        LatSummary {
            n: 10,
            mean_ns: ns,
            ..LatSummary::default()
        }
    }

    #[test]
    fn the_gap_compares_the_sum_of_the_parts_with_the_whole() {
        let role = MirrorRole {
            sync: true,
            local: mean(200_000.0),
            network: mean(1_100_000.0),
            remote: mean(100_000.0),
            total: mean(1_500_000.0),
            ..MirrorRole::default()
        };
        let gap = breakdown_gap_pct(&role).unwrap();
        assert!((gap - (-6.666_666)).abs() < 1e-3, "{gap}");
        let async_role = MirrorRole {
            sync: false,
            ..role
        };
        assert_eq!(breakdown_gap_pct(&async_role), None);
    }

    #[test]
    fn a_pair_is_a_valid_target_again_only_once_caught_up_after_the_last_fail_over() {
        let cu = |start_ms, end_ms, done| lockstep_proto::v1::MirrorCatchUp {
            start_ms,
            end_ms,
            done,
            bytes: 1 << 20,
        };
        let mut m = MirrorTotals {
            catchups: vec![cu(13_000, 13_400, true)],
            ..MirrorTotals::default()
        };
        assert_eq!(valid_again_at(&m, Some(11_000)), Some(13_400));
        let p = pair("agent-1", "data", &m);
        assert_eq!(p.catchups[0].duration_ms, Some(400));
        // A later fail-over: not valid again until a catch-up after it.
        assert_eq!(valid_again_at(&m, Some(15_000)), None);
        // Still behind at the end.
        m.behind_bytes = 4096;
        assert_eq!(valid_again_at(&m, None), None);
        m.behind_bytes = 0;
        m.catchups.push(cu(16_000, 0, false));
        assert_eq!(valid_again_at(&m, None), None);
        assert_eq!(pair("a", "d", &m).catchups[1].duration_ms, None);
        // Two clones' catch-ups: the one that started first ended last, and that is when the
        // pair was whole again.
        m.catchups = vec![cu(13_000, 20_000, true), cu(14_000, 15_000, true)];
        assert_eq!(valid_again_at(&m, Some(11_000)), Some(20_000));
        // Nothing missed, no catch-up: nothing to say.
        assert_eq!(valid_again_at(&MirrorTotals::default(), None), None);
    }

    #[test]
    fn a_backup_returned_only_if_it_answered_after_the_last_fail_over() {
        assert!(!did_not_return(None, None));
        assert!(did_not_return(Some(5_000), None));
        assert!(!did_not_return(Some(5_000), Some(7_000)));
        assert!(did_not_return(Some(9_000), Some(7_000)));
    }
}
