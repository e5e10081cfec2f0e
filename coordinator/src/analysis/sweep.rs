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

/// The report types live in the results model; this module produces them.
pub use crate::results::sweep::{
    LITTLE_SHORTFALL, RoleSweep, SweepFigures, SweepReport, SweepStep, Verdict, VerdictKind,
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
}
