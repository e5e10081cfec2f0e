//! Sweep mode: latency against outstanding IOs (the "latency vs threads" relationship:
//! docs/domain.md#latency-vs-threads).
//!
//! A role with `depth_sweep = [1, 2, 4, 8, 16, 32]` makes `lockstep run` run the plan once per
//! value on the same agents, closed loop, with every job of the role's workload at that iodepth
//! (or, with `sweep_over = "numjobs"`, that many clones of each job: vdbench's threads). Each
//! step is a complete run in `sweep/<n>-depth<N>/`; the series loop is curve mode's
//! (`curve::run_steps`).
//!
//! With a fixed number of IOs in flight, IOPS = outstanding / mean latency (Little's law). So
//! IOPS measured at one depth is really a latency figure, and the sweep shows the device
//! behind it: one that saturates early keeps its IOPS flat while its latency grows with the
//! depth (the extra IOs only queue), one that scales grows its IOPS at flat latency. Per step,
//! per volume and for the role: IOPS, mean latency, p50/p99/p99.9 (the role's from the merge
//! of its volumes' measured interval histograms) and the IOPS Little's law expects; then a
//! verdict per role and per volume (`verdict`): the knee, or still scaling.
//!
//! Any sweep also gets an answer in words (`knee`): for the role, or per node for
//! `sweep = { over = "volumes" }`, where the datanode question is "at how many volumes does the
//! node stop scaling?" (docs/domain.md#datanode-volume-count). The verdict and the answer find
//! their knee with one rule (`knee_index`): for numjobs, iodepth and rate sweeps the marginal
//! gain of an added unit against linear scaling, for volumes sweeps the throughput per volume.

/// The report types live in the results model; this module produces them.
pub use crate::results::sweep::{
    Knee, KneeKind, LITTLE_SHORTFALL, NodeFigures, RoleSweep, SweepFigures, SweepReport, SweepStep,
    Verdict, VerdictKind,
};

use crate::analysis::curve::{self, StepFigures};
use crate::plan::{DepthSweep, Plan, SweepOver};
use crate::results::RunResults;
use crate::results::hlog::LogEntry;

/// A step past the knee adds units (jobs, IOs in flight, target rate) that buy less than this
/// share of what linear scaling would add to the total (numjobs, iodepth and rate sweeps).
pub const KNEE_MARGINAL_GAIN: f64 = 0.10;

/// ... provided mean latency rose by more than this from the knee to the deepest step: IOPS
/// that stay flat at flat latency mean the extra IOs were not in flight at all.
pub const KNEE_LATENCY_RISE: f64 = 0.10;

/// One step of a target as the verdict sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub depth: u32,
    pub iops: f64,
    pub mean_ns: f64,
}

/// Throughput per volume falling more than this below its best at an earlier step is the knee
/// of a volumes sweep: a shared limit binds. Above the run-to-run noise of a throttled
/// emulation (a few %), below the fall one more volume causes past a ceiling (1/N: 14% from 7
/// to 8 volumes).
pub const KNEE_PER_UNIT_DROP: f64 = 0.10;

/// One step of a node or role as the knee rule sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KneePoint {
    /// The step's value of what the sweep varies.
    pub value: u32,
    /// Throughput: MB/s for a volumes sweep's node, else the role's IOPS.
    pub total: f64,
    /// `total` per unit of `value` (per volume); only the volumes rule reads it.
    pub per_unit: f64,
}

/// The unit of a knee's `total`.
fn knee_unit(over: SweepOver) -> &'static str {
    match over {
        SweepOver::Volumes => "MB/s",
        _ => "IOPS",
    }
}

/// `6 volumes`, `numjobs 6`, `depth 6`, `6 IOPS`.
fn value_text(over: SweepOver, v: u32) -> String {
    match over {
        SweepOver::Volumes => format!("{v} volume{}", if v == 1 { "" } else { "s" }),
        SweepOver::RateIops => format!("{v} IOPS"),
        _ => format!("{} {v}", over.word()),
    }
}

/// `from 6 to 7 volumes`, `from numjobs 4 to 8`.
fn range_text(over: SweepOver, a: u32, b: u32) -> String {
    match over {
        SweepOver::Volumes | SweepOver::RateIops => {
            format!("from {a} to {}", value_text(over, b))
        }
        _ => format!("from {} to {b}", value_text(over, a)),
    }
}

fn amount(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

/// The share of what linear scaling would add to the total that going from `a` to `b`
/// bought: 1 when the total grew in proportion to the value (each added unit did as well as
/// the ones before it did on average), 0 when it stayed flat, negative when it fell.
pub fn linear_share(a: &KneePoint, b: &KneePoint) -> f64 {
    let linear = a.total * (f64::from(b.value) - f64::from(a.value)) / f64::from(a.value);
    if linear > 0.0 {
        (b.total - a.total) / linear
    } else {
        0.0
    }
}

/// The knee of a series of steps with IO (in increasing value): its index, or None while it
/// still scales. The one rule behind both the verdict and the answer, so that the two lines
/// cannot name different steps.
///
/// Numjobs, iodepth and rate sweeps: the knee is the last step whose added units still bought
/// at least `KNEE_MARGINAL_GAIN` of what linear scaling would add; from it on, no later step
/// does (measured from the knee, so one noisy step neither makes nor hides it). Why marginal:
/// in a closed loop IOPS = outstanding / latency (Little's law, docs/domain.md#latency-vs-threads).
/// Below the knee an added job or IO in flight is served in parallel at about the same latency
/// and adds its full share; once the device is busy, added outstanding IO only lengthens the
/// queue, latency grows in proportion and the gain per added unit collapses to zero. Throughput
/// per unit says nothing about that: it falls as soon as latency rises at all, while the added
/// unit may still buy most of its share (a second worker that adds 64% more IO is not past the
/// knee). An open-loop rate sweep reads the same way: achieved IOPS follow the target until the
/// device's limit, then stay flat.
///
/// Volumes sweeps: the knee is the last step before throughput per volume falls more than
/// `KNEE_PER_UNIT_DROP` below its best earlier step. Each volume there brings its own limit,
/// so per-volume throughput holds while the node scales and falls by 1/N once a limit the
/// volumes share (the instance's) binds.
pub fn knee_index(over: SweepOver, pts: &[KneePoint]) -> Option<usize> {
    if over == SweepOver::Volumes {
        let mut best = 0;
        for i in 1..pts.len() {
            if pts[i].per_unit < pts[best].per_unit * (1.0 - KNEE_PER_UNIT_DROP) {
                return Some(i - 1);
            }
            if pts[i].per_unit > pts[best].per_unit {
                best = i;
            }
        }
        return None;
    }
    (0..pts.len().saturating_sub(1)).find(|&k| {
        pts[k + 1..]
            .iter()
            .all(|b| linear_share(&pts[k], b) < KNEE_MARGINAL_GAIN)
    })
}

/// The steps the rules compare: those with IO (a lost agent's step has none).
fn with_io(points: &[KneePoint]) -> Vec<KneePoint> {
    points
        .iter()
        .filter(|p| p.value > 0 && p.total > 0.0 && p.per_unit > 0.0)
        .copied()
        .collect()
}

/// A target's steps as the knee rule sees them: IOPS, per unit of the value; steps without
/// IOs or without latency are left out, as `verdict` leaves them out.
pub fn knee_points(points: &[Point]) -> Vec<KneePoint> {
    points
        .iter()
        .filter(|p| p.depth > 0 && p.iops > 0.0 && p.mean_ns > 0.0)
        .map(|p| KneePoint {
            value: p.depth,
            total: p.iops,
            per_unit: p.iops / f64::from(p.depth),
        })
        .collect()
}

/// `98%`, never `-0%`.
fn share_text(share: f64) -> String {
    let p = (share * 100.0).round();
    format!("{}%", if p == 0.0 { 0.0 } else { p })
}

/// The answer for `target` (`node agent-1`, `role db`) from its steps in increasing value, by
/// `knee_index`'s rule; without a knee it is still scaling. Steps without throughput (a lost
/// agent) are left out.
pub fn knee(target: &str, subject: &str, over: SweepOver, points: &[KneePoint]) -> Knee {
    let unit = knee_unit(over);
    let pts = with_io(points);
    let make = |kind, at, total, text| Knee {
        target: target.to_string(),
        kind,
        at,
        total,
        unit: unit.to_string(),
        text,
    };
    let (Some(first), Some(last)) = (pts.first(), pts.last()) else {
        return make(
            KneeKind::Single,
            0,
            0.0,
            "no step with IO: nothing to compare".into(),
        );
    };
    if pts.len() < 2 {
        return make(
            KneeKind::Single,
            first.value,
            first.total,
            format!(
                "one step with IO ({}): nothing to compare",
                value_text(over, first.value)
            ),
        );
    }
    match (knee_index(over, &pts), over) {
        (Some(k), SweepOver::Volumes) => make(
            KneeKind::Knee,
            pts[k].value,
            pts[k].total,
            per_volume_knee_text(subject, &pts, k),
        ),
        (Some(k), _) => make(
            KneeKind::Knee,
            pts[k].value,
            pts[k].total,
            marginal_knee_text(subject, over, &pts, k),
        ),
        (None, SweepOver::Volumes) => make(
            KneeKind::Scaling,
            last.value,
            last.total,
            format!(
                "still scaling: per-volume throughput stays within {:.0}% of its best {}; \
                 {subject} reaches {} {unit} at {}",
                KNEE_PER_UNIT_DROP * 100.0,
                range_text(over, first.value, last.value),
                amount(last.total),
                value_text(over, last.value)
            ),
        ),
        (None, _) => {
            let prev = &pts[pts.len() - 2];
            make(
                KneeKind::Scaling,
                last.value,
                last.total,
                format!(
                    "still scaling: {}, {} {} ({} of linear scaling); {subject} reaches {} \
                     {unit} at {}",
                    range_text(over, prev.value, last.value),
                    iops_word(over),
                    pct(last.total / prev.total),
                    share_text(linear_share(prev, last)),
                    amount(last.total),
                    value_text(over, last.value)
                ),
            )
        }
    }
}

/// `IOPS`, or `achieved IOPS` where the value is a target rate.
fn iops_word(over: SweepOver) -> &'static str {
    match over {
        SweepOver::RateIops => "achieved IOPS",
        _ => "IOPS",
    }
}

/// A volumes sweep's knee at `k` (< the last step) in words: how far per-volume throughput fell.
fn per_volume_knee_text(subject: &str, pts: &[KneePoint], k: usize) -> String {
    let over = SweepOver::Volumes;
    let (prev, p) = (&pts[k], &pts[k + 1]);
    let best = pts[..=k]
        .iter()
        .fold(&pts[0], |b, q| if q.per_unit > b.per_unit { q } else { b });
    let fall = 1.0 - p.per_unit / prev.per_unit;
    let below = 1.0 - p.per_unit / best.per_unit;
    // Worth saying only when the fall from the best is not the fall from the step before.
    let below_best = if (below - fall) * 100.0 >= 2.0 {
        format!(
            " ({:.0}% below its best, at {})",
            below * 100.0,
            value_text(over, best.value)
        )
    } else {
        String::new()
    };
    format!(
        "per-volume throughput falls {:.0}% {}{below_best}: {subject} stops scaling at {}, where \
         it reaches {} MB/s",
        fall * 100.0,
        range_text(over, prev.value, p.value),
        value_text(over, prev.value),
        amount(prev.total)
    )
}

/// A marginal knee at `k` (< the last step) in words: what the step into the knee bought, what
/// the steps past it bought, as shares of linear scaling.
fn marginal_knee_text(subject: &str, over: SweepOver, pts: &[KneePoint], k: usize) -> String {
    let (knee, last) = (&pts[k], &pts[pts.len() - 1]);
    let what = iops_word(over);
    let before = match k.checked_sub(1).map(|i| &pts[i]) {
        Some(prev) => format!(
            "{}, {what} {} ({} of linear scaling); ",
            range_text(over, prev.value, knee.value),
            pct(knee.total / prev.total),
            share_text(linear_share(prev, knee))
        ),
        None => String::new(),
    };
    format!(
        "{before}{}, {what} {} ({} of linear scaling): {subject} stops scaling at {}, where it \
         reaches {} {}",
        range_text(over, knee.value, last.value),
        pct(last.total / knee.total),
        share_text(linear_share(knee, last)),
        value_text(over, knee.value),
        amount(knee.total),
        knee_unit(over)
    )
}

/// Each node's volumes of `role` in a step's results, summed.
pub(crate) fn node_figures(results: &RunResults, role: &str) -> Vec<NodeFigures> {
    let mut out: Vec<NodeFigures> = Vec::new();
    for v in results.volumes.iter().filter(|v| v.role == role) {
        let i = match out.iter().position(|n| n.node == v.node) {
            Some(i) => i,
            None => {
                out.push(NodeFigures {
                    node: v.node.clone(),
                    ..Default::default()
                });
                out.len() - 1
            }
        };
        let n = &mut out[i];
        n.volumes += 1;
        n.mb_s += v.summary.total.bytes_per_sec / 1e6;
        n.iops += v.summary.total.iops;
    }
    out
}

/// The answers of a role's sweep: per node for a volumes sweep (MB/s), else for the role (IOPS).
pub(crate) fn answers(rs: &RoleSweep) -> Vec<Knee> {
    if rs.over == SweepOver::Volumes {
        let mut nodes: Vec<&str> = Vec::new();
        for n in rs.steps.iter().flat_map(|s| &s.nodes) {
            if !nodes.contains(&n.node.as_str()) {
                nodes.push(&n.node);
            }
        }
        return nodes
            .into_iter()
            .map(|node| {
                let pts: Vec<KneePoint> = rs
                    .steps
                    .iter()
                    .filter_map(|s| {
                        let n = s.nodes.iter().find(|n| n.node == node)?;
                        Some(KneePoint {
                            value: s.depth,
                            total: n.mb_s,
                            per_unit: n.mb_s / f64::from(n.volumes.max(1)),
                        })
                    })
                    .collect();
                knee(&format!("node {node}"), "the node", rs.over, &pts)
            })
            .collect();
    }
    // The role's own series, as its verdict reads it: the two name the same knee.
    vec![knee(
        &format!("role {}", rs.role),
        "the role",
        rs.over,
        &knee_points(&role_points(rs)),
    )]
}

/// The role's steps as the verdict and the answer see them: its volumes' IOPS summed, its
/// latency merged.
fn role_points(rs: &RoleSweep) -> Vec<Point> {
    rs.steps
        .iter()
        .map(|s| Point {
            depth: s.depth,
            iops: s.role.lat.iops,
            mean_ns: s.role.lat.mean_ns,
        })
        .collect()
}

/// The roles of a plan that sweep, with their sweeps.
pub fn sweep_roles(plan: &Plan) -> Vec<(String, DepthSweep)> {
    plan.roles
        .iter()
        .filter_map(|r| r.depth_sweep.clone().map(|s| (r.name.clone(), s)))
        .collect()
}

fn pct(ratio: f64) -> String {
    let p = ((ratio - 1.0) * 100.0).round();
    if p == 0.0 {
        "+0%".into()
    } else {
        format!("{p:+.0}%")
    }
}

/// The verdict on a target's steps (in increasing depth). The knee is `knee_index`'s, the
/// answer's rule, on the target's IOPS. Past it: saturated when mean latency rose by more than
/// `KNEE_LATENCY_RISE` from the knee to the deepest step (the added IOs only queued), else
/// limited (the added IOs were configured but not in flight). Without a knee: still scaling.
/// Steps without IOs (a lost volume) are left out.
pub fn verdict(target: &str, over: SweepOver, points: &[Point]) -> Verdict {
    let w = over.word();
    let pts: Vec<&Point> = points
        .iter()
        .filter(|p| p.depth > 0 && p.iops > 0.0 && p.mean_ns > 0.0)
        .collect();
    let make = |kind, depth, text| Verdict {
        target: target.to_string(),
        kind,
        depth,
        text,
    };
    let [.., prev, last] = pts.as_slice() else {
        return match pts.first() {
            Some(p) => make(
                VerdictKind::Single,
                p.depth,
                format!("one step with IOs ({w} {}): nothing to compare", p.depth),
            ),
            None => make(
                VerdictKind::Single,
                points.last().map_or(0, |p| p.depth),
                "no step with IOs: nothing to compare".into(),
            ),
        };
    };
    let Some(k) = knee_index(over, &knee_points(points)) else {
        return make(
            VerdictKind::Scaling,
            last.depth,
            format!(
                "still scaling at {w} {} (IOPS {} from {})",
                last.depth,
                pct(last.iops / prev.iops),
                prev.depth
            ),
        );
    };
    let knee = pts[k];
    let gain = pct(last.iops / knee.iops);
    let latency = last.mean_ns / knee.mean_ns;
    if latency > 1.0 + KNEE_LATENCY_RISE {
        make(
            VerdictKind::Saturated,
            knee.depth,
            format!(
                "saturated at {w} {}: from {} to {}, IOPS {gain} while mean latency \
                 x{latency:.1} (more outstanding IOs only queue)",
                knee.depth, knee.depth, last.depth
            ),
        )
    } else {
        make(
            VerdictKind::Limited,
            knee.depth,
            format!(
                "limited at {w} {}: from {} to {}, IOPS {gain} and mean latency x{latency:.2}: \
                 the added IOs were not in flight, so the load generator, not the volume, set \
                 the pace (compare with Little's law)",
                knee.depth, knee.depth, last.depth
            ),
        )
    }
}

/// A step's figures of `role`: curve mode's, with the outstanding IOs and Little's law.
pub(crate) fn step_figures(
    results: &RunResults,
    entries: &[LogEntry],
    role: &str,
) -> (SweepFigures, Vec<SweepFigures>) {
    let (role_fig, volumes) = curve::figures(results, entries, role);
    let with_little = |lat: StepFigures, outstanding: u64, in_flight_mean: f64| SweepFigures {
        littles_iops: if lat.mean_ns > 0.0 {
            outstanding as f64 * 1e9 / lat.mean_ns
        } else {
            0.0
        },
        lat,
        outstanding,
        in_flight_mean,
    };
    let volumes: Vec<SweepFigures> = volumes
        .into_iter()
        .map(|f| {
            let v = results
                .volumes
                .iter()
                .find(|v| v.role == role && format!("{}/{}", v.node, v.volume) == f.target);
            with_little(
                f,
                v.map_or(0, |v| u64::from(v.configured_depth)),
                v.map_or(0.0, |v| v.outstanding_mean),
            )
        })
        .collect();
    let role_fig = with_little(
        role_fig,
        volumes.iter().map(|v| v.outstanding).sum(),
        volumes.iter().map(|v| v.in_flight_mean).sum(),
    );
    (role_fig, volumes)
}

/// The role's and each volume's verdict from its steps.
pub(crate) fn judge(rs: &mut RoleSweep) {
    let point = |depth: u32, f: &SweepFigures| Point {
        depth,
        iops: f.lat.iops,
        mean_ns: f.lat.mean_ns,
    };
    rs.verdict = verdict(&rs.role, rs.over, &role_points(rs));
    rs.answers = answers(rs);
    let names: Vec<String> = rs
        .steps
        .first()
        .map(|s| s.volumes.iter().map(|v| v.lat.target.clone()).collect())
        .unwrap_or_default();
    rs.volume_verdicts = names
        .iter()
        .map(|n| {
            let pts: Vec<Point> = rs
                .steps
                .iter()
                .filter_map(|s| {
                    let v = s.volumes.iter().find(|v| &v.lat.target == n)?;
                    Some(point(s.depth, v))
                })
                .collect();
            verdict(n, rs.over, &pts)
        })
        .collect();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Points at `depths` from IOPS and mean latency in ms.
    fn points(steps: &[(u32, f64, f64)]) -> Vec<Point> {
        steps
            .iter()
            .map(|&(depth, iops, ms)| Point {
                depth,
                iops,
                mean_ns: ms * 1e6,
            })
            .collect()
    }

    /// docs/domain.md#latency-vs-threads: the single SSD at vdbench threads 1, 2, 4, 16.
    fn seeds_ssd() -> Vec<Point> {
        points(&[
            (1, 3192.92, 0.310),
            (2, 3305.57, 0.602),
            (4, 3312.41, 1.204),
            (16, 3300.77, 4.844),
        ])
    }

    /// docs/scenarios.md: the Alteryx workers' run (release build, 2026-11-25), numjobs 1 to 4.
    fn alteryx_run() -> Vec<Point> {
        points(&[
            (1, 746.0, 1.34),
            (2, 1505.0, 1.33),
            (3, 1500.0, 2.00),
            (4, 1500.0, 2.67),
        ])
    }

    #[test]
    fn the_seeds_ssd_saturates_at_one_thread_and_the_array_scales() {
        // The single SSD, then the XtremIO array.
        let ssd = seeds_ssd();
        let v = verdict("ssd", SweepOver::Numjobs, &ssd);
        assert_eq!((v.kind, v.depth), (VerdictKind::Saturated, 1), "{v:?}");
        assert_eq!(
            v.text,
            "saturated at numjobs 1: from 1 to 16, IOPS +3% while mean latency x15.6 (more \
             outstanding IOs only queue)"
        );
        let array = points(&[
            (1, 1942.41, 0.509),
            (2, 4367.64, 0.454),
            (4, 8542.79, 0.465),
            (16, 30078.15, 0.529),
        ]);
        let v = verdict("xtremio", SweepOver::Numjobs, &array);
        assert_eq!((v.kind, v.depth), (VerdictKind::Scaling, 16), "{v:?}");
        assert_eq!(v.text, "still scaling at numjobs 16 (IOPS +252% from 4)");
    }

    #[test]
    fn the_knee_is_where_iops_stop_growing_for_good() {
        // Grows to depth 2, flat after: the knee is 2, not 1 and not a later flat step.
        let p = points(&[
            (1, 1000.0, 1.0),
            (2, 1900.0, 1.05),
            (4, 1950.0, 2.05),
            (8, 1960.0, 4.1),
            (16, 1957.0, 8.2),
        ]);
        let v = verdict("db", SweepOver::Iodepth, &p);
        assert_eq!((v.kind, v.depth), (VerdictKind::Saturated, 2), "{v:?}");
        assert_eq!(
            v.text,
            "saturated at depth 2: from 2 to 16, IOPS +3% while mean latency x7.8 (more \
             outstanding IOs only queue)"
        );
        // The answer names the same depth (docs/drills.md).
        let k = knee("role db", "the role", SweepOver::Iodepth, &knee_points(&p));
        assert_eq!(
            k.text,
            "from depth 1 to 2, IOPS +90% (90% of linear scaling); from depth 2 to 16, IOPS +3% \
             (0% of linear scaling): the role stops scaling at depth 2, where it reaches 1900 IOPS"
        );
        // A flat stretch followed by growth is not a knee: the step that grew again moves it.
        let p = points(&[
            (1, 1000.0, 1.0),
            (2, 1050.0, 1.9),
            (4, 2000.0, 2.0),
            (8, 2050.0, 3.9),
            (16, 2060.0, 7.8),
        ]);
        assert_eq!(verdict("db", SweepOver::Iodepth, &p).depth, 4);
        // One noisy step after the knee (+13%, then back) does not move it: gains count from
        // the knee.
        let p = points(&[
            (1, 1000.0, 1.0),
            (2, 1040.0, 1.9),
            (4, 1180.0, 3.4),
            (8, 1050.0, 7.6),
        ]);
        assert_eq!(verdict("db", SweepOver::Iodepth, &p).depth, 1);
        // Steps need not double: 1 to 4 is two doublings, so +15% is +7% per doubling.
        let p = points(&[(1, 1000.0, 1.0), (4, 1150.0, 3.5)]);
        assert_eq!(
            verdict("db", SweepOver::Iodepth, &p).kind,
            VerdictKind::Saturated
        );
        // Falling IOPS at rising latency is past the knee too.
        let p = points(&[(1, 1000.0, 1.0), (2, 800.0, 2.5)]);
        let v = verdict("db", SweepOver::Iodepth, &p);
        assert_eq!((v.kind, v.depth), (VerdictKind::Saturated, 1));
        assert!(
            v.text.contains("IOPS -20% while mean latency x2.5"),
            "{v:?}"
        );
    }

    #[test]
    fn without_a_knee_it_scales_or_the_generator_is_the_limit() {
        let p = points(&[(8, 10000.0, 0.8), (16, 14100.0, 1.1), (32, 19900.0, 1.6)]);
        let v = verdict("db", SweepOver::Iodepth, &p);
        assert_eq!((v.kind, v.depth), (VerdictKind::Scaling, 32));
        assert_eq!(v.text, "still scaling at depth 32 (IOPS +41% from 16)");
        // Flat IOPS at flat latency: the added IOs were never in flight.
        let p = points(&[(1, 5000.0, 0.2), (2, 9000.0, 0.22), (4, 9100.0, 0.21)]);
        let v = verdict("db", SweepOver::Iodepth, &p);
        assert_eq!((v.kind, v.depth), (VerdictKind::Limited, 2), "{v:?}");
        assert!(
            v.text
                .starts_with("limited at depth 2: from 2 to 4, IOPS +1% and mean latency x0.95"),
            "{v:?}"
        );
        // Too little to compare; steps without IOs do not count.
        let p = points(&[(1, 5000.0, 0.2), (2, 0.0, 0.0)]);
        let v = verdict("db", SweepOver::Iodepth, &p);
        assert_eq!((v.kind, v.depth), (VerdictKind::Single, 1));
        assert_eq!(v.text, "one step with IOs (depth 1): nothing to compare");
        assert_eq!(
            verdict("db", SweepOver::Iodepth, &[]).kind,
            VerdictKind::Single
        );
    }

    fn figures(target: &str, outstanding: u64, iops: f64, mean_ms: f64) -> SweepFigures {
        let mean_ns = mean_ms * 1e6;
        SweepFigures {
            lat: StepFigures {
                target: target.into(),
                iops,
                mean_ns,
                p50_ns: (mean_ns * 0.8) as u64,
                p99_ns: (mean_ns * 3.0) as u64,
                p999_ns: (mean_ns * 6.0) as u64,
                intended: false,
            },
            outstanding,
            in_flight_mean: outstanding as f64,
            littles_iops: outstanding as f64 * 1e9 / mean_ns,
        }
    }

    #[test]
    fn the_text_has_a_line_per_step_the_verdicts_and_little_shortfalls() {
        let step = |depth: u32, vol_iops: [f64; 2], mean_ms: f64| SweepStep {
            depth,
            dir: format!("sweep/x-depth{depth}"),
            role: figures(
                "db",
                u64::from(depth) * 2,
                vol_iops[0] + vol_iops[1],
                mean_ms,
            ),
            volumes: vec![
                figures("agent-1/data", u64::from(depth), vol_iops[0], mean_ms),
                figures("agent-2/data", u64::from(depth), vol_iops[1], mean_ms),
            ],
            nodes: Vec::new(),
        };
        let mut rs = RoleSweep {
            role: "db".into(),
            over: SweepOver::Iodepth,
            steps: vec![
                step(1, [2500.0, 2400.0], 0.4),
                step(4, [4000.0, 4100.0], 1.0),
                step(16, [4100.0, 4000.0], 2.0),
            ],
            ..Default::default()
        };
        judge(&mut rs);
        assert_eq!(rs.verdict.kind, VerdictKind::Saturated);
        assert_eq!(rs.volume_verdicts.len(), 2);
        let t = crate::export::text::sweep::render_text(&SweepReport { roles: vec![rs] });
        assert!(
            t.starts_with("depth sweep, role db (iodepth of every job; closed loop"),
            "{t}"
        );
        assert!(
            t.contains(
                "    depth outstanding   role IOPS  mean ms   p50 ms   p99 ms  p99.9 ms         expected\n"
            ),
            "{t}"
        );
        // 2 IOs at 0.4 ms: 5,000 expected, 4,900 achieved.
        assert!(
            t.contains(
                "        1           2        4900     0.40     0.32     1.20      2.40       5000 (98%)\n"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "  verdict: saturated at depth 4: from 4 to 16, IOPS +0% while mean latency x2.0"
            ),
            "{t}"
        );
        // 32 IOs at 2 ms would give 16,000: 8,100 is half of it.
        assert!(
            t.contains("  note: below 80% of Little's law at depth 16 (51%):"),
            "{t}"
        );
        assert!(
            t.contains(
                "  agent-2/data (depth: IOPS, mean): 1 2400 IOPS 0.40 ms; 4 4100 IOPS 1.00 ms; 16 4000 IOPS 2.00 ms\n    saturated at depth 4: from 4 to 16, IOPS -2% while mean latency x2.0"
            ),
            "{t}"
        );
    }

    #[test]
    fn the_sweep_is_a_top_level_section_of_results_json_and_of_the_report() {
        let summary = serde_json::to_value(crate::results::Summary::default()).unwrap();
        let single: RunResults = serde_json::from_value(serde_json::json!({
            "lockstep_version": "0", "run_id": "r", "plan": "p", "status": "completed",
            "start_unix_ms": 0, "duration_ms": 1000, "interval_ms": 1000, "phases": [],
            "agents": [], "start_skew_ns": null, "cluster": summary, "nodes": [], "volumes": [],
            "cluster_timeline": [], "objectives": [],
        }))
        .unwrap();
        // A single run has neither section, and reads back as it was written.
        assert_eq!(single.series, None);
        let json = serde_json::to_value(&single).unwrap();
        assert!(
            json.get("curve").is_none() && json.get("sweep").is_none(),
            "{json}"
        );
        assert_eq!(serde_json::from_value::<RunResults>(json).unwrap(), single);

        let mut rs = RoleSweep {
            role: "db".into(),
            steps: vec![SweepStep {
                depth: 4,
                dir: "sweep/0-depth4".into(),
                role: figures("db", 4, 1000.0, 4.0),
                volumes: vec![figures("agent-1/data", 4, 1000.0, 4.0)],
                nodes: Vec::new(),
            }],
            ..Default::default()
        };
        judge(&mut rs);
        let mut swept = single.clone();
        swept.series = Some(crate::results::Series {
            sweep: Some(SweepReport { roles: vec![rs] }),
            ..Default::default()
        });
        let json = serde_json::to_value(&swept).unwrap();
        assert!(json.get("curve").is_none(), "{json}");
        let step = &json["sweep"]["roles"][0]["steps"][0];
        assert_eq!(step["depth"], 4);
        assert_eq!(step["volumes"][0]["target"], "agent-1/data");
        assert_eq!(step["volumes"][0]["littles_iops"], 1000.0);
        assert_eq!(json["sweep"]["roles"][0]["verdict"]["kind"], "single");
        assert_eq!(serde_json::from_value::<RunResults>(json).unwrap(), swept);
        let text = crate::export::text::render(&swept);
        assert!(text.contains("\ndepth sweep, role db (iodepth"), "{text}");
        assert!(
            text.contains("  verdict: one step with IOs (depth 4): nothing to compare"),
            "{text}"
        );
    }

    /// A node's steps from its summed MB/s at each volume count.
    fn per_volume(steps: &[(u32, f64)]) -> Vec<KneePoint> {
        steps
            .iter()
            .map(|&(value, total)| KneePoint {
                value,
                total,
                per_unit: total / f64::from(value),
            })
            .collect()
    }

    #[test]
    fn the_datanode_stops_scaling_where_the_instance_limit_binds() {
        // docs/domain.md#datanode-volume-count: r4.8xlarge (875 MB/s) with volumes of about
        // 146 MB/s each: six fit, the seventh only shares.
        let p = per_volume(&[(4, 583.0), (5, 729.0), (6, 874.0), (7, 875.0), (8, 875.0)]);
        let k = knee("node agent-1", "the node", SweepOver::Volumes, &p);
        assert_eq!((k.kind, k.at), (KneeKind::Knee, 6), "{k:?}");
        assert_eq!(k.unit, "MB/s");
        assert_eq!(
            k.text,
            "per-volume throughput falls 14% from 6 to 7 volumes: the node stops scaling at 6 \
             volumes, where it reaches 874 MB/s"
        );
        // The scaled-down example (docs/scenarios.md): 14.5 MB/s volumes under 87.5 MB/s.
        let p = per_volume(&[(4, 58.0), (5, 72.4), (6, 86.9), (7, 87.4), (8, 87.5)]);
        let k = knee("node agent-1", "the node", SweepOver::Volumes, &p);
        assert_eq!((k.kind, k.at), (KneeKind::Knee, 6), "{k:?}");
        assert!(k.text.ends_with("where it reaches 86.9 MB/s"), "{k:?}");
    }

    #[test]
    fn a_slow_decline_is_measured_from_the_best_step_and_noise_is_not_a_knee() {
        // -4% per step: the third step is 12% below the best.
        let p = per_volume(&[(1, 100.0), (2, 192.0), (3, 276.0), (4, 352.0)]);
        let k = knee("node n", "the node", SweepOver::Volumes, &p);
        assert_eq!((k.kind, k.at), (KneeKind::Knee, 3), "{k:?}");
        assert!(
            k.text.starts_with(
                "per-volume throughput falls 4% from 3 to 4 volumes (12% below its best, at 1 \
                 volume): the node stops scaling at 3 volumes"
            ),
            "{k:?}"
        );
        // A few % of noise either way scales.
        let p = per_volume(&[(4, 58.0), (5, 70.0), (6, 88.0), (7, 99.0), (8, 116.0)]);
        let k = knee("node n", "the node", SweepOver::Volumes, &p);
        assert_eq!((k.kind, k.at), (KneeKind::Scaling, 8), "{k:?}");
        assert_eq!(
            k.text,
            "still scaling: per-volume throughput stays within 10% of its best from 4 to 8 \
             volumes; the node reaches 116 MB/s at 8 volumes"
        );
    }

    #[test]
    fn other_sweeps_read_in_their_own_words() {
        // +20% of IOPS for twice the jobs is 20% of what linear scaling would add: still paying.
        let p = knee_points(&points(&[(1, 50.0, 1.0), (2, 100.0, 1.0), (4, 120.0, 1.6)]));
        let k = knee("role db", "the role", SweepOver::Numjobs, &p);
        assert_eq!(
            (k.kind, k.at, k.unit.as_str()),
            (KneeKind::Scaling, 4, "IOPS")
        );
        assert_eq!(
            k.text,
            "still scaling: from numjobs 2 to 4, IOPS +20% (20% of linear scaling); the role \
             reaches 120 IOPS at numjobs 4"
        );
        // A rate sweep: achieved IOPS follow the target, then stay at the device's limit.
        let rate = knee_points(&points(&[
            (500, 500.0, 1.0),
            (1000, 998.0, 1.1),
            (2000, 1400.0, 40.0),
            (4000, 1405.0, 900.0),
        ]));
        let k = knee("role db", "the role", SweepOver::RateIops, &rate);
        assert_eq!((k.kind, k.at, k.total), (KneeKind::Knee, 2000, 1400.0));
        assert_eq!(
            k.text,
            "from 1000 to 2000 IOPS, achieved IOPS +40% (40% of linear scaling); from 2000 to \
             4000 IOPS, achieved IOPS +0% (0% of linear scaling): the role stops scaling at 2000 \
             IOPS, where it reaches 1400 IOPS"
        );
        let k = knee("role db", "the role", SweepOver::Iodepth, &p[..1]);
        assert_eq!(k.kind, KneeKind::Single);
        assert_eq!(k.text, "one step with IO (depth 1): nothing to compare");
        assert_eq!(
            knee("role db", "the role", SweepOver::Iodepth, &[]).text,
            "no step with IO: nothing to compare"
        );
    }

    #[test]
    fn the_alteryx_workers_answer_and_verdict_name_the_same_numjobs() {
        // Two workers take the volume's 1,500 IOPS; a third only waits.
        let p = alteryx_run();
        let v = verdict("worker", SweepOver::Numjobs, &p);
        assert_eq!((v.kind, v.depth), (VerdictKind::Saturated, 2), "{v:?}");
        assert_eq!(
            v.text,
            "saturated at numjobs 2: from 2 to 4, IOPS +0% while mean latency x2.0 (more \
             outstanding IOs only queue)"
        );
        let k = knee(
            "role worker",
            "the role",
            SweepOver::Numjobs,
            &knee_points(&p),
        );
        assert_eq!(
            (k.kind, k.at, k.total),
            (KneeKind::Knee, 2, 1505.0),
            "{k:?}"
        );
        // IOPS -0.3% past the knee reads +0%, and its share of linear scaling 0%, never -0%.
        assert_eq!(
            k.text,
            "from numjobs 1 to 2, IOPS +102% (102% of linear scaling); from numjobs 2 to 4, \
             IOPS +0% (0% of linear scaling): the role stops scaling at numjobs 2, where it \
             reaches 1505 IOPS"
        );
        // The known issue's run: IOPS per job fell 18% from 1 to 2 workers (latency rose), yet
        // the second worker still added 64% more IO, far above 10% of linear: not the knee.
        let p = points(&[
            (1, 900.0, 1.1),
            (2, 1476.0, 1.35),
            (3, 1500.0, 2.0),
            (4, 1502.0, 2.66),
        ]);
        let v = verdict("worker", SweepOver::Numjobs, &p);
        let k = knee(
            "role worker",
            "the role",
            SweepOver::Numjobs,
            &knee_points(&p),
        );
        assert_eq!((v.depth, k.at), (2, 2), "{v:?} {k:?}");
        assert!(
            k.text
                .starts_with("from numjobs 1 to 2, IOPS +64% (64% of linear"),
            "{k:?}"
        );
        // The seeds' single SSD knees at its first value: the knee starts the sentence.
        let ssd = seeds_ssd();
        let k = knee(
            "role ssd",
            "the role",
            SweepOver::Numjobs,
            &knee_points(&ssd),
        );
        assert_eq!(
            k.text,
            "from numjobs 1 to 16, IOPS +3% (0% of linear scaling): the role stops scaling at \
             numjobs 1, where it reaches 3193 IOPS"
        );
    }

    #[test]
    fn the_marginal_share_is_measured_against_linear_scaling_from_the_earlier_step() {
        let at = |value: u32, total: f64| KneePoint {
            value,
            total,
            per_unit: total / f64::from(value),
        };
        // From 2 to 4 linear scaling adds 100 to 100: +50 is half of it.
        assert_eq!(linear_share(&at(2, 100.0), &at(4, 150.0)), 0.5);
        assert_eq!(linear_share(&at(2, 100.0), &at(3, 150.0)), 1.0);
        assert_eq!(linear_share(&at(1, 100.0), &at(4, 100.0)), 0.0);
        assert_eq!(linear_share(&at(1, 100.0), &at(2, 80.0)), -0.2);
        // Just under 10% of linear past the knee is the knee; just at it is not.
        let p = [at(1, 100.0), at(2, 200.0), at(4, 219.0)];
        assert_eq!(knee_index(SweepOver::Iodepth, &p), Some(1));
        let p = [at(1, 100.0), at(2, 200.0), at(4, 220.0)];
        assert_eq!(knee_index(SweepOver::Iodepth, &p), None);
        // The volumes rule reads throughput per volume: the same series knees at 2 there.
        assert_eq!(knee_index(SweepOver::Volumes, &p), Some(1));
        let p = [at(4, 58.0), at(5, 72.5), at(6, 87.0), at(7, 87.5)];
        assert_eq!(knee_index(SweepOver::Volumes, &p), Some(2));
        assert_eq!(knee_index(SweepOver::Numjobs, &p), Some(2));
    }

    #[test]
    fn a_numjobs_sweeps_answer_line_says_the_verdicts_numjobs() {
        let step = |depth: u32, iops: f64, mean_ms: f64| SweepStep {
            depth,
            dir: format!("sweep/x-numjobs{depth}"),
            role: figures("worker", u64::from(depth), iops, mean_ms),
            volumes: vec![figures("agent-1/data", u64::from(depth), iops, mean_ms)],
            nodes: vec![NodeFigures {
                node: "agent-1".into(),
                volumes: 1,
                mb_s: iops * 8192.0 / 1e6,
                iops,
            }],
        };
        let mut rs = RoleSweep {
            role: "worker".into(),
            over: SweepOver::Numjobs,
            steps: alteryx_run()
                .iter()
                .map(|p| step(p.depth, p.iops, p.mean_ns / 1e6))
                .collect(),
            ..Default::default()
        };
        judge(&mut rs);
        assert_eq!((rs.verdict.depth, rs.answers[0].at), (2, 2));
        // The two lines as docs/scenarios.md quotes them from the run.
        let t = crate::export::text::sweep::render_text(&SweepReport { roles: vec![rs] });
        assert!(
            t.contains(
                "  verdict: saturated at numjobs 2: from 2 to 4, IOPS +0% while mean latency x2.0 \
                 (more outstanding IOs only queue)\n"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "  answer: role worker: from numjobs 1 to 2, IOPS +102% (102% of linear \
                 scaling); from numjobs 2 to 4, IOPS +0% (0% of linear scaling): the role stops \
                 scaling at numjobs 2, where it reaches 1505 IOPS\n"
            ),
            "{t}"
        );
    }

    /// Steps at increasing values from increments, IOPS and mean latency in ms.
    fn series(steps: &[(u32, f64, f64)]) -> Vec<Point> {
        let mut value = 0;
        steps
            .iter()
            .map(|&(inc, iops, ms)| {
                value += inc;
                Point {
                    depth: value,
                    iops,
                    mean_ns: ms * 1e6,
                }
            })
            .collect()
    }

    fn any_over() -> impl proptest::strategy::Strategy<Value = SweepOver> {
        proptest::sample::select(vec![
            SweepOver::Iodepth,
            SweepOver::Numjobs,
            SweepOver::RateIops,
            SweepOver::Volumes,
        ])
    }

    proptest::proptest! {
        /// Throughput in proportion to the value: every added unit pays in full.
        #[test]
        fn a_linear_series_has_no_knee(
            over in any_over(),
            per in 0.5f64..1e5,
            steps in proptest::collection::vec((1u32..300, 0.01f64..50.0), 2..10),
        ) {
            let p = series(&steps.iter().map(|&(inc, ms)| (inc, 0.0, ms)).collect::<Vec<_>>());
            let p: Vec<Point> = p
                .into_iter()
                .map(|q| Point { iops: per * f64::from(q.depth), ..q })
                .collect();
            let last = p[p.len() - 1].depth;
            let v = verdict("r", over, &p);
            proptest::prop_assert_eq!((v.kind, v.depth), (VerdictKind::Scaling, last), "{:?}", v);
            let k = knee("role r", "the role", over, &knee_points(&p));
            proptest::prop_assert_eq!((k.kind, k.at), (KneeKind::Scaling, last), "{:?}", k);
        }

        /// Flat IOPS at the latency Little's law gives them: the first value is the knee.
        #[test]
        fn a_flat_series_knees_at_its_first_value(
            over in proptest::sample::select(vec![
                SweepOver::Iodepth,
                SweepOver::Numjobs,
                SweepOver::RateIops,
            ]),
            iops in 1.0f64..1e6,
            incs in proptest::collection::vec(1u32..300, 2..10),
        ) {
            let p = series(&incs.iter().map(|&inc| (inc, 0.0, 0.0)).collect::<Vec<_>>());
            let p: Vec<Point> = p
                .into_iter()
                .map(|q| Point { iops, mean_ns: f64::from(q.depth) * 1e9 / iops, ..q })
                .collect();
            let (first, last) = (p[0].depth, p[p.len() - 1].depth);
            let v = verdict("r", over, &p);
            proptest::prop_assert_eq!(v.depth, first, "{:?}", v);
            // Saturated as soon as the queue grew measurably (from 10 to 11 jobs it barely did).
            let kinds = if f64::from(last) > 1.2 * f64::from(first) {
                vec![VerdictKind::Saturated]
            } else {
                vec![VerdictKind::Saturated, VerdictKind::Limited]
            };
            proptest::prop_assert!(kinds.contains(&v.kind), "{:?}", v);
            let k = knee("role r", "the role", over, &knee_points(&p));
            proptest::prop_assert_eq!((k.kind, k.at), (KneeKind::Knee, first), "{:?}", k);
        }

        /// For any series, the role's answer names the verdict's step: both come from one rule
        /// on one series, through `judge` as a run uses it.
        #[test]
        fn the_answers_knee_is_the_verdicts_knee(
            over in proptest::sample::select(vec![
                SweepOver::Iodepth,
                SweepOver::Numjobs,
                SweepOver::RateIops,
            ]),
            steps in proptest::collection::vec((1u32..64, 0.0f64..1e5, 0.0f64..20.0), 0..10),
        ) {
            let p = series(&steps);
            let mut rs = RoleSweep {
                role: "r".into(),
                over,
                steps: p
                    .iter()
                    .map(|q| SweepStep {
                        depth: q.depth,
                        role: figures("r", u64::from(q.depth), q.iops, q.mean_ns / 1e6),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            };
            judge(&mut rs);
            let (v, k) = (&rs.verdict, &rs.answers[0]);
            let expected = match v.kind {
                VerdictKind::Saturated | VerdictKind::Limited => KneeKind::Knee,
                VerdictKind::Scaling => KneeKind::Scaling,
                VerdictKind::Single => KneeKind::Single,
            };
            proptest::prop_assert_eq!(k.kind, expected, "{:?} / {:?}", v, k);
            if k.kind != KneeKind::Single {
                proptest::prop_assert_eq!(k.at, v.depth, "{:?} / {:?}", v, k);
                let said = format!("stops scaling at {} {},", over.word(), v.depth);
                if over != SweepOver::RateIops && k.kind == KneeKind::Knee {
                    proptest::prop_assert!(k.text.contains(&said), "{:?} / {:?}", v, k);
                }
            }
        }
    }

    #[test]
    fn a_volumes_sweep_answers_per_node_in_results_and_the_report() {
        // agent-1 is held at 87.5 MB/s, agent-2 runs free at 14.5 MB/s a volume.
        let node = |node: &str, volumes: u32, mb_s: f64| NodeFigures {
            node: node.into(),
            volumes,
            mb_s,
            iops: mb_s,
        };
        let steps = (4..=8)
            .map(|v: u32| SweepStep {
                depth: v,
                dir: format!("sweep/x-volumes{v}"),
                role: figures("dn", 8, 100.0, 1.0),
                volumes: Vec::new(),
                nodes: vec![
                    node("agent-1", v, (14.5 * f64::from(v)).min(87.5)),
                    node("agent-2", v, 14.5 * f64::from(v)),
                ],
            })
            .collect();
        let mut rs = RoleSweep {
            role: "dn".into(),
            over: SweepOver::Volumes,
            steps,
            ..Default::default()
        };
        judge(&mut rs);
        let kinds: Vec<_> = rs
            .answers
            .iter()
            .map(|k| (k.target.as_str(), k.kind, k.at))
            .collect();
        assert_eq!(
            kinds,
            [
                ("node agent-1", KneeKind::Knee, 6),
                ("node agent-2", KneeKind::Scaling, 8)
            ]
        );
        let json = serde_json::to_value(&rs).unwrap();
        assert_eq!(json["answers"][0]["at"], 6);
        assert_eq!(json["over"], "volumes");
        assert_eq!(json["steps"][0]["nodes"][0]["volumes"], 4);
        let t = crate::export::text::sweep::render_text(&SweepReport { roles: vec![rs] });
        assert!(
            t.starts_with("volumes sweep, role dn (volumes of each agent running the workload;"),
            "{t}"
        );
        assert!(
            t.contains("        6  agent-1            6            14.5       87.0         87\n"),
            "{t}"
        );
        assert!(
            t.contains(
                "  answer: node agent-1: per-volume throughput falls 14% from 6 to 7 volumes: \
                 the node stops scaling at 6 volumes, where it reaches 87.0 MB/s\n"
            ),
            "{t}"
        );
    }
}
