//! The Hadoop datanode question end to end (docs/scenarios.md): one local agent of eight disks
//! under an emulated instance limit, a sweep over how many of them run the workload, and the
//! knee the run finds, within one volume of what the model predicts from the plan's own figures
//! (the instance's MB/s over a disk's).
//!
//! `cargo test -p lockstep-tests --test hadoop_volume_count -- --nocapture` prints the answer.

use std::path::Path;

use lockstep::plan::{Plan, SweepOver};
use lockstep::results::sweep::KneeKind;
use lockstep_agent::fault::FaultKind;
use lockstep_tests::{output_text, read_results, run_plan, scratch};

const PLAN: &str = include_str!("../../examples/hadoop-volume-count.toml");

/// The knee the model predicts: as many disks as fit under the instance limit.
fn predicted_knee(plan: &Plan) -> u32 {
    let (mut disk, mut instance) = (None, None);
    for f in &plan.faults {
        match &f.spec.kind {
            FaultKind::BwCap(c) => disk = c.total_bytes_per_s.map(|b| b as f64 / 1e6),
            FaultKind::Instance(i) => instance = i.baseline_mb_s,
            _ => {}
        }
    }
    let (disk, instance) = (disk.expect("a disk cap"), instance.expect("an instance"));
    (instance / disk).floor() as u32
}

#[test]
fn the_datanode_stops_scaling_within_one_volume_of_the_instance_limits_prediction() {
    let plan = Plan::parse(PLAN, Path::new("examples/hadoop-volume-count.toml")).unwrap();
    let predicted = predicted_knee(&plan);
    assert_eq!(predicted, 6, "the example is built for a knee at 6");

    let dir = scratch();
    let (o, out) = run_plan(dir.path(), PLAN, None, &["--local", "1x8"]);
    let text = output_text(&o);
    assert!(o.status.success(), "{text}");
    let stdout = String::from_utf8_lossy(&o.stdout);
    println!("{stdout}");

    let r = read_results(&out);
    let sweep = r
        .series
        .as_ref()
        .and_then(|s| s.sweep.as_ref())
        .expect("a sweep");
    let role = &sweep.roles[0];
    assert_eq!(role.over, SweepOver::Volumes);
    // Each step ran on as many disks of the node as it said.
    for s in &role.steps {
        assert_eq!(s.nodes.len(), 1, "{s:?}");
        assert_eq!(s.nodes[0].volumes, s.depth, "{s:?}");
        assert!(s.nodes[0].mb_s > 0.0, "{s:?}");
    }
    let k = &role.answers[0];
    assert_eq!(k.target, "node agent-1");
    assert_eq!(k.kind, KneeKind::Knee, "{k:?}\n{stdout}");
    assert!(
        k.at.abs_diff(predicted) <= 1,
        "knee at {} volumes, the model predicts {predicted}\n{stdout}",
        k.at
    );
    // The node never went past the instance limit.
    for s in &role.steps {
        assert!(s.nodes[0].mb_s < 87.5 * 1.05, "{s:?}");
    }
    assert!(
        stdout.contains(&format!("  answer: node agent-1: {}", k.text)),
        "{stdout}"
    );
}
