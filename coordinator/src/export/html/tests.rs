use super::*;
use crate::results::timeline::{FaultWindow, VolumePoint, VolumeSeries};
use crate::results::{ClusterPoint, ObjectiveResult};

/// Four volumes of one role; agent-3's latency goes 10x at t=20s (a credit cliff), with the
/// chokepoint result as the run writes it.
fn quickstart_like() -> RunResults {
    let summary = serde_json::to_value(crate::results::Summary::default()).unwrap();
    let mut r: RunResults = serde_json::from_value(serde_json::json!({
        "lockstep_version": "0", "run_id": "r1", "plan": "quickstart <test>", "status": "completed",
        "start_unix_ms": 0, "duration_ms": 50000, "interval_ms": 1000, "phases": [],
        "agents": [], "start_skew_ns": 120000, "cluster": summary, "nodes": [],
        "volumes": [], "cluster_timeline": [], "objectives": [],
    }))
    .unwrap();
    r.timeline.interval_ms = 1000;
    for n in 1..=4 {
        let slow = n == 3;
        r.timeline.volumes.push(VolumeSeries {
            node: format!("agent-{n}"),
            volume: "data".into(),
            role: "worker".into(),
            configured_depth: 4,
            points: (1..=50)
                .map(|s| {
                    let after = slow && s > 20;
                    VolumePoint {
                        t_ms: s * 1000,
                        len_ms: 1000,
                        ios: [if after { 180 } else { 2850 }, 0],
                        bytes: [if after { 180 * 8192 } else { 2850 * 8192 }, 0],
                        lat_mean_us: if after { 22000.0 } else { 1400.0 + n as f64 },
                        lat_p99_us: if after { 60000.0 } else { 8000.0 },
                        ..Default::default()
                    }
                })
                .collect(),
            ..Default::default()
        });
    }
    r.cluster_timeline = (1..=50)
        .map(|s| ClusterPoint {
            t_ms: s * 1000,
            iops: if s > 20 { 8700.0 } else { 11400.0 },
            bytes_per_sec: 9e7,
            lat_p50_us: 1000.0,
            lat_p99_us: 8000.0,
            lat_p999_us: 30000.0,
            volumes: 4,
            ..Default::default()
        })
        .collect();
    r.faults.push(FaultWindow {
        node: "agent-1".into(),
        volume: "data".into(),
        fault: "latency".into(),
        start_ms: 30000,
        end_ms: Some(35000),
        detail: None,
    });
    r.objectives.push(ObjectiveResult {
        objective: "p99 read < 10ms on every volume".into(),
        passed: false,
        failures: vec!["agent-3/data: p99 read 61 ms".into()],
    });
    r.chokepoint = Some(credit_cliff_answer());
    r
}

#[test]
fn the_chokepoint_view_reads_the_volume_its_onset_and_credit_model() {
    let v = chokepoint_view(&quickstart_like()).unwrap();
    assert_eq!(v.volume, Some(("agent-3".into(), "data".into())));
    assert_eq!(v.onset_ms, Some(20000));
    let c = v.credit.unwrap();
    assert_eq!(c.bucket.bucket, 5_400_000.0);
    assert_eq!(c.bucket.time_scale, 100.0);
    assert_eq!(c.forecast_onset_ms, Some(20174));
    assert_eq!(c.before_cliff, Some((10000, 20044)));
}

#[test]
fn the_report_has_every_section_and_needs_no_network() {
    let html = render(&quickstart_like());
    for id in [
        "chart-cluster-iops",
        "chart-cluster-mbs",
        "chart-cluster-latency",
        "heatmap",
        "chart-suspect-latency",
        "chart-suspect-iops",
        "chart-credit-balance",
        "objectives-table",
        "agents-table",
        "volumes-table",
        "nodes-table",
    ] {
        assert!(html.contains(&format!("id=\"{id}\"")), "{id} missing");
    }
    assert!(html.contains("data:image/png;base64,"));
    assert!(html.contains("chokepoint onset: agent-3/data"));
    assert!(html.contains("fault latency (1 volume(s))"));
    assert!(html.contains("quickstart &lt;test&gt;"));
    // Self-contained: nothing is fetched.
    for remote in ["http://", "https://", "src=\"//"] {
        let outside_svg_ns = html.replace("http://www.w3.org/2000/svg", "");
        assert!(!outside_svg_ns.contains(remote), "{remote}");
    }
    // The suspect's row is first in the heatmap labels.
    let labels = html.split("class=\"labels\"").nth(1).unwrap();
    assert!(labels.find("agent-3/data").unwrap() < labels.find("agent-1/data").unwrap());
}

#[test]
fn results_without_a_timeline_or_chokepoint_still_render() {
    let mut r = quickstart_like();
    r.timeline = Default::default();
    r.chokepoint = None;
    let html = render(&r);
    assert!(html.contains("No per-volume timeline"));
    assert!(html.contains("No chokepoint analysis"));
    assert!(html.ends_with("</html>\n"));
}

#[test]
fn with_many_volumes_the_suspect_gets_a_labelled_strip_above_the_map() {
    let mut r = quickstart_like();
    let peer = r.timeline.volumes[0].clone();
    for n in 5..=200 {
        r.timeline.volumes.push(VolumeSeries {
            node: format!("agent-{n}"),
            ..peer.clone()
        });
    }
    let html = render(&r);
    let strip = &html[html
        .find("id=\"heatmap-suspects\"")
        .expect("the suspects' strip")
        - 400..];
    assert!(strip.contains("class=\"labels\""));
    assert!(strip.contains("agent-3/data"));
    // The full map is one pixel row per volume, unlabelled.
    let map = &html[html.find("id=\"heatmap\"").unwrap()..];
    assert!(map.contains("style=\"height:200px\""), "{}", &map[..200]);
}

/// The finder's answer of the quickstart: agent-3's 60 GiB gp2 volume out of credits at 20 s.
fn credit_cliff_answer() -> crate::results::chokepoint::ChokepointReport {
    use crate::results::chokepoint::*;
    let model: CreditModel = serde_json::from_value(serde_json::json!({"baseline": 180.0,
        "bucket": 5400000.0, "burst": 3000.0, "kind": "gp2", "size_gib": 60.0, "unit": "io"}))
    .unwrap();
    let verdict = VolumeVerdict {
        node: "agent-3".into(),
        volume: "data".into(),
        role: "worker".into(),
        model: None,
        kind: ChokepointKind::CreditExhaustion,
        onset_ms: 20_000,
        onset_interval: 20,
        score: 25,
        evidence: Evidence {
            credit: Some(CreditCheck {
                model,
                time_scale: 100.0,
                demand_before: 2_900.0,
                forecast_onset_ms: Some(20_174),
                onset_matches_forecast: true,
                at_baseline: true,
                rate_after: 180.0,
            }),
            ..Default::default()
        },
        confidence: Confidence::default(),
        impact: Impact::default(),
    };
    ChokepointReport {
        verdict: Verdict::Volume(verdict),
        also: vec![],
        interval_ms: 1000,
        intervals: 45,
        analyzed_through_ms: 45_000,
        volumes: vec![],
        cluster_episodes: vec![],
        forecasts: vec![],
        load_generator: None,
        suspects: vec![],
        forecast_before_cliff: Some(ForecastBeforeCliff {
            node: "agent-3".into(),
            volume: "data".into(),
            made_at_ms: 10_000,
            predicted_ms: 20_044,
            actual_onset_ms: 20_000,
            error_pct: 0.2,
        }),
        lost: vec![],
        phases: vec![],
    }
}

#[test]
fn a_sweeps_answers_are_stated_below_its_chart_escaped() {
    use crate::results::sweep::{Knee, KneeKind, RoleSweep, SweepReport};
    let mut r = quickstart_like();
    r.series = Some(crate::results::Series {
        sweep: Some(SweepReport {
            roles: vec![RoleSweep {
                role: "dn".into(),
                answers: vec![Knee {
                    target: "node agent-1".into(),
                    kind: KneeKind::Knee,
                    at: 6,
                    total: 86.9,
                    unit: "MB/s".into(),
                    text: "the node stops scaling at 6 volumes <here>".into(),
                }],
                ..Default::default()
            }],
        }),
        ..Default::default()
    });
    let html = sections::sweep(&r);
    assert!(
        html.contains(
            "<p class=\"answer\">node agent-1: the node stops scaling at 6 volumes &lt;here&gt;</p>"
        ),
        "{html}"
    );
}
