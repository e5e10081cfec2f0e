//! report.html at scale: a simulated 1,000 agents x 8 volumes x 3,600 one-second intervals
//! (one volume falls off a credit cliff half-way), rendered in memory, written to
//! target/report-scale/report.html with its size and the rendering time. docs/report.md has the
//! figures and how the open time in headless Chromium is measured.
//!
//!     cargo run -p lockstep --example report_html_scale [AGENTS VOLUMES INTERVALS]

use std::time::Instant;

use lockstep::results::timeline::{VolumePoint, VolumeSeries};
use lockstep::results::{ClusterPoint, RunResults, Summary};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("AGENTS VOLUMES INTERVALS as numbers"))
        .collect();
    let (agents, per_agent, intervals) = match args[..] {
        [a, v, i] => (a, v, i),
        _ => (1000, 8, 3600),
    };
    let t0 = Instant::now();
    let r = simulated(agents, per_agent, intervals);
    eprintln!(
        "simulated {agents} agents x {per_agent} volumes x {intervals} intervals in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let t1 = Instant::now();
    let html = lockstep::export::html::render(&r);
    let took = t1.elapsed().as_secs_f64();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/report-scale");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("report.html");
    std::fs::write(&path, &html).unwrap();
    println!(
        "{}: {:.1} MB, rendered in {took:.1} s",
        path.display(),
        html.len() as f64 / 1e6
    );
}

/// A small deterministic noise in [-1, 1) (no rand dependency in the library's examples).
fn noise(seed: u64) -> f64 {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    (x >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

fn simulated(agents: usize, per_agent: usize, intervals: usize) -> RunResults {
    let summary = serde_json::to_value(Summary::default()).unwrap();
    let mut r: RunResults = serde_json::from_value(serde_json::json!({
        "lockstep_version": "sim", "run_id": "simulated-scale", "plan": "simulated",
        "status": "completed", "start_unix_ms": 0, "duration_ms": intervals as u64 * 1000,
        "interval_ms": 1000, "phases": [], "agents": [], "start_skew_ns": 180000,
        "cluster": summary, "nodes": [], "volumes": [], "cluster_timeline": [], "objectives": [],
    }))
    .unwrap();
    r.timeline.interval_ms = 1000;
    let (cliff_node, cliff_vol) = (agents * 421 / 1000, per_agent.saturating_sub(1) / 2);
    let cliff_at = intervals / 2;
    let mut cluster = vec![ClusterPoint::default(); intervals];
    for a in 0..agents {
        let node = format!("node-{a:04}");
        for v in 0..per_agent {
            let slow = a == cliff_node && v == cliff_vol;
            let seed = (a * per_agent + v) as u64 * 1_000_003;
            let points: Vec<VolumePoint> = (0..intervals)
                .map(|i| {
                    let after = slow && i >= cliff_at;
                    let iops = if after {
                        180.0
                    } else {
                        3000.0 * (1.0 + 0.03 * noise(seed + i as u64))
                    };
                    let lat = 4.0 / iops * 1e6; // Little's law at depth 4, in us
                    let ios = iops as u64;
                    let c = &mut cluster[i];
                    c.iops += iops;
                    c.bytes_per_sec += iops * 16384.0;
                    VolumePoint {
                        t_ms: (i as u64 + 1) * 1000,
                        len_ms: 1000,
                        ios: [ios * 7 / 10, ios - ios * 7 / 10],
                        bytes: [ios * 7 / 10 * 16384, (ios - ios * 7 / 10) * 16384],
                        errors: [0, 0],
                        outstanding: 4.0,
                        lat_mean_us: lat,
                        lat_p50_us: lat * 0.9,
                        lat_p99_us: lat * 3.0,
                        lat_max_us: lat * 8.0,
                    }
                })
                .collect();
            r.timeline.volumes.push(VolumeSeries {
                node: node.clone(),
                volume: format!("vol-{v}"),
                role: "worker".into(),
                configured_depth: 4,
                points,
                ..Default::default()
            });
            let mut vr: lockstep::results::VolumeResult =
                serde_json::from_value(serde_json::json!({
                    "node": node, "volume": format!("vol-{v}"), "role": "worker",
                    "summary": summary, "outstanding_mean": 4.0, "configured_depth": 4,
                }))
                .unwrap();
            vr.summary.total.iops = if slow { 1590.0 } else { 3000.0 };
            r.volumes.push(vr);
        }
        r.nodes.push(
            serde_json::from_value(serde_json::json!({"node": node, "summary": summary})).unwrap(),
        );
    }
    for (i, c) in cluster.iter_mut().enumerate() {
        c.t_ms = (i as u64 + 1) * 1000;
        c.lat_p50_us = 1200.0;
        c.lat_p99_us = if i >= cliff_at { 22000.0 } else { 4000.0 };
        c.lat_p999_us = c.lat_p99_us * 2.0;
        c.volumes = (agents * per_agent) as u32;
    }
    r.cluster_timeline = cluster;
    // The finder's own answer on this timeline (about 2 s at this size).
    r.chokepoint = Some(lockstep::analysis::chokepoint::analyze(
        &r.timeline,
        &Default::default(),
    ));
    r
}
