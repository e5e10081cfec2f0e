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
//! Any sweep also gets an answer in words (`knee`): throughput per unit of what the sweep adds
//! (per volume for `sweep = { over = "volumes" }`, per job, per IO in flight, or the share of
//! the target rate achieved) holds while the node or role still scales, and falls once a shared
//! limit binds. For a volumes sweep that is the datanode question, "at how many volumes does
//! the node stop scaling?" (docs/domain.md#datanode-volume-count), answered per node.

/// The report types live in the results model; this module produces them.
pub use crate::results::sweep::{
    Knee, KneeKind, LITTLE_SHORTFALL, NodeFigures, RoleSweep, SweepFigures, SweepReport, SweepStep,
    Verdict, VerdictKind,
};

use crate::analysis::curve::{self, StepFigures};
use crate::plan::{DepthSweep, Plan, SweepOver};
use crate::results::RunResults;
use crate::results::hlog::LogEntry;

/// A doubling of the depth that buys less IOPS than this (per doubling, from the knee on) is
/// past the knee.
pub const KNEE_IOPS_GAIN: f64 = 0.10;

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

/// Throughput per unit falling more than this below its best at an earlier step is the knee:
/// a shared limit binds. Above the run-to-run noise of a throttled emulation (a few %), below
/// the fall one more volume causes past a ceiling (1/N: 14% from 7 to 8 volumes).
pub const KNEE_PER_UNIT_DROP: f64 = 0.10;

/// One step of a node or role as the knee detector sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KneePoint {
    /// The step's value of what the sweep varies.
    pub value: u32,
    /// Throughput in MB/s (IOPS for a rate sweep).
    pub total: f64,
    /// `total` per unit of `value` (per volume, per job, ...; for a rate sweep, the share of
    /// the target achieved).
    pub per_unit: f64,
}

/// How the answer reads for one kind of sweep.
fn knee_words(over: SweepOver) -> (&'static str, &'static str) {
    match over {
        SweepOver::Volumes => ("per-volume throughput", "MB/s"),
        SweepOver::Numjobs => ("per-job throughput", "MB/s"),
        SweepOver::Iodepth => ("throughput per IO in flight", "MB/s"),
        SweepOver::RateIops => ("the share of the target rate achieved", "IOPS"),
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

/// The answer for `target` (`node agent-1`, `role db`) from its steps in increasing value: the
/// knee is the last step before the first one whose throughput per unit falls more than
/// `KNEE_PER_UNIT_DROP` below the best of the steps before it; without one it is still scaling.
/// Steps without throughput (a lost agent) are left out.
pub fn knee(target: &str, subject: &str, over: SweepOver, points: &[KneePoint]) -> Knee {
    let (per, unit) = knee_words(over);
    let pts: Vec<&KneePoint> = points
        .iter()
        .filter(|p| p.value > 0 && p.total > 0.0 && p.per_unit > 0.0)
        .collect();
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
    let mut best = pts[0];
    for w in pts.windows(2) {
        let (prev, p) = (w[0], w[1]);
        if p.per_unit < best.per_unit * (1.0 - KNEE_PER_UNIT_DROP) {
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
            return make(
                KneeKind::Knee,
                prev.value,
                prev.total,
                format!(
                    "{per} falls {:.0}% {}{below_best}: {subject} stops scaling at {}, where it reaches {} {unit}",
                    fall * 100.0,
                    range_text(over, prev.value, p.value),
                    value_text(over, prev.value),
                    amount(prev.total)
                ),
            );
        }
        if p.per_unit > best.per_unit {
            best = p;
        }
    }
    make(
        KneeKind::Scaling,
        last.value,
        last.total,
        format!(
            "still scaling: {per} stays within {:.0}% of its best {}; {subject} reaches {} {unit} at {}",
            KNEE_PER_UNIT_DROP * 100.0,
            range_text(over, first.value, last.value),
            amount(last.total),
            value_text(over, last.value)
        ),
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

/// The answers of a role's sweep: per node for a volumes sweep, else for the role.
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
    let pts: Vec<KneePoint> = rs
        .steps
        .iter()
        .map(|s| {
            let mb_s: f64 = s.nodes.iter().map(|n| n.mb_s).sum();
            let iops: f64 = s.nodes.iter().map(|n| n.iops).sum();
            let volumes = f64::from(s.nodes.iter().map(|n| n.volumes).sum::<u32>().max(1));
            let (total, per_unit) = match rs.over {
                SweepOver::RateIops => (iops, iops / volumes / f64::from(s.depth.max(1))),
                _ => (mb_s, mb_s / f64::from(s.depth.max(1))),
            };
            KneePoint {
                value: s.depth,
                total,
                per_unit,
            }
        })
        .collect();
    vec![knee(
        &format!("role {}", rs.role),
        "the role",
        rs.over,
        &pts,
    )]
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

/// IOPS gained per doubling of the depth from `a` to `b` (0.1: +10% per doubling).
fn gain_per_doubling(a: &Point, b: &Point) -> f64 {
    let doublings = (f64::from(b.depth) / f64::from(a.depth)).log2();
    (b.iops / a.iops).powf(1.0 / doublings) - 1.0
}

/// The verdict on a target's steps (in increasing depth). The knee is the first step from
/// which IOPS never again gains `KNEE_IOPS_GAIN` per doubling of the depth (measured from the
/// knee, so one noisy step neither makes nor hides it) while mean latency rises by more than
/// `KNEE_LATENCY_RISE` up to the deepest step. Without a knee: still scaling when the last step
/// gained, else limited (more IOs configured than were in flight). Steps without IOs (a lost
/// volume) are left out.
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
    for (k, knee) in pts.iter().enumerate().take(pts.len() - 1) {
        let flat = pts[k + 1..]
            .iter()
            .all(|b| gain_per_doubling(knee, b) < KNEE_IOPS_GAIN);
        let latency = last.mean_ns / knee.mean_ns;
        if flat && latency > 1.0 + KNEE_LATENCY_RISE {
            return make(
                VerdictKind::Saturated,
                knee.depth,
                format!(
                    "saturated at {w} {}: from {} to {}, IOPS {} while mean latency x{latency:.1} \
                     (more outstanding IOs only queue)",
                    knee.depth,
                    knee.depth,
                    last.depth,
                    pct(last.iops / knee.iops)
                ),
            );
        }
    }
    let gain = pct(last.iops / prev.iops);
    if gain_per_doubling(prev, last) >= KNEE_IOPS_GAIN {
        make(
            VerdictKind::Scaling,
            last.depth,
            format!(
                "still scaling at {w} {} (IOPS {gain} from {})",
                last.depth, prev.depth
            ),
        )
    } else {
        make(
            VerdictKind::Limited,
            last.depth,
            format!(
                "limited at {w} {}: from {} to {}, IOPS {gain} and mean latency x{:.2}: the added \
                 IOs were not in flight, so the load generator, not the volume, set the pace \
                 (compare with Little's law)",
                prev.depth,
                prev.depth,
                last.depth,
                last.mean_ns / prev.mean_ns
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
    let role: Vec<Point> = rs.steps.iter().map(|s| point(s.depth, &s.role)).collect();
    rs.verdict = verdict(&rs.role, rs.over, &role);
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

    #[test]
    fn the_seeds_ssd_saturates_at_one_thread_and_the_array_scales() {
        // docs/domain.md#latency-vs-threads, vdbench threads 1, 2, 4, 16: the single SSD, then
        // the XtremIO array.
        let ssd = points(&[
            (1, 3192.92, 0.310),
            (2, 3305.57, 0.602),
            (4, 3312.41, 1.204),
            (16, 3300.77, 4.844),
        ]);
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
        assert_eq!((v.kind, v.depth), (VerdictKind::Limited, 4), "{v:?}");
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
        let p = per_volume(&[(1, 50.0), (2, 100.0), (4, 120.0)]);
        let k = knee("role db", "the role", SweepOver::Numjobs, &p);
        assert_eq!(
            k.text,
            "per-job throughput falls 40% from numjobs 2 to 4: the role stops scaling at \
             numjobs 2, where it reaches 100 MB/s"
        );
        // A rate sweep: the share of the target achieved, in IOPS.
        let rate =
            [(500, 500.0), (1000, 998.0), (2000, 1400.0)].map(|(value, total): (u32, f64)| {
                KneePoint {
                    value,
                    total,
                    per_unit: total / f64::from(value),
                }
            });
        let k = knee("role db", "the role", SweepOver::RateIops, &rate);
        assert_eq!(
            (k.kind, k.at, k.unit.as_str()),
            (KneeKind::Knee, 1000, "IOPS")
        );
        assert!(
            k.text.starts_with(
                "the share of the target rate achieved falls 30% from 1000 to 2000 IOPS"
            ),
            "{k:?}"
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
