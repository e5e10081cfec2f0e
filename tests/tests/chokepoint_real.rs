//! The chokepoint finder on real local runs of the moderate cases real fleets have: a volume
//! 1.45x slower than its five peers, one that is 2x slow for 5 s of every 7, one that fails 2% of
//! its IOs under fio's `continue_on_error=all`, and a clean run beside a busy process (no blame). The plans are the examples in examples/chokepoint/;
//! `scripts/chokepoint-real.sh` runs each of them many times for the figures in
//! docs/chokepoint.md.

use std::process::Command;

use lockstep::export::read_run_dir;
use lockstep::results::RunResults;
use lockstep::results::chokepoint::{ChokepointKind, Verdict, VolumeVerdict};
use lockstep_tests::{Proc, output_text, run_plan, scratch};

/// One run at a time: six agents each are what the host is sized for, and the busy process of
/// the clean run must not land beside the others.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run(plan_text: &str, local: &str) -> (RunResults, String) {
    let dir = scratch();
    let (o, out) = run_plan(dir.path(), plan_text, None, &["--local", local]);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(0), "{}", output_text(&o));
    (read_run_dir(&out).unwrap(), text)
}

/// The volume verdict, or a panic that shows what the finder said instead.
fn volume_verdict<'a>(r: &'a RunResults, text: &str) -> &'a VolumeVerdict {
    match &r
        .chokepoint
        .as_ref()
        .expect("a chokepoint analysis")
        .verdict
    {
        Verdict::Volume(v) => v,
        other => panic!("expected a volume verdict, got {other:?}\n{text}"),
    }
}

/// A constant extra latency in a closed loop gives IOPS = depth / latency, as flat as a
/// throttle's ceiling, so the kind may read either way; what matters is the volume and when.
fn slow_kind(k: ChokepointKind) -> bool {
    matches!(k, ChokepointKind::FailSlow | ChokepointKind::Throttled)
}

#[test]
fn a_volume_moderately_slower_than_its_peers_is_named_with_its_onset() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (r, text) = run(
        include_str!("../../examples/chokepoint/moderate-fail-slow.toml"),
        "6",
    );
    let v = volume_verdict(&r, &text);
    assert_eq!((v.node.as_str(), v.volume.as_str()), ("agent-4", "data"));
    assert!(slow_kind(v.kind), "{:?}", v.kind);
    assert!((11_000..=14_000).contains(&v.onset_ms), "{}", v.onset_ms);
    // 3 ms + the device against 2 ms + the device: a moderate slowdown, not a cliff.
    let ratio = v.impact.latency_ratio;
    assert!((1.2..2.0).contains(&ratio), "latency ratio {ratio}");
    assert!(
        text.contains("chokepoint: node agent-4, volume data"),
        "{text}"
    );
}

#[test]
fn an_intermittently_slow_volume_is_held_across_its_good_spells() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (r, text) = run(
        include_str!("../../examples/chokepoint/intermittent-fail-slow.toml"),
        "6",
    );
    let v = volume_verdict(&r, &text);
    assert_eq!((v.node.as_str(), v.volume.as_str()), ("agent-4", "data"));
    assert!(slow_kind(v.kind), "{:?}", v.kind);
    assert!((8_000..=12_000).contains(&v.onset_ms), "{}", v.onset_ms);
}

/// fio's `continue_on_error=all` keeps the erroring volume's job running, so the finder sees
/// errors interval after interval on one volume and names it as erroring from the fault's start;
/// the run itself completes (an error drill, not a failed run).
#[test]
fn a_volume_that_keeps_failing_under_continue_on_error_is_named_as_erroring() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (r, text) = run(
        include_str!("../../examples/chokepoint/eio-continue.toml"),
        "6",
    );
    let v = volume_verdict(&r, &text);
    assert_eq!((v.node.as_str(), v.volume.as_str()), ("agent-4", "data"));
    assert_eq!(v.kind, ChokepointKind::Erroring, "{text}");
    assert!((9_000..=12_000).contains(&v.onset_ms), "{}", v.onset_ms);
    let c = r.chokepoint.as_ref().unwrap();
    assert!(
        c.also
            .iter()
            .all(|x| !matches!(x, Verdict::Volume(_) | Verdict::Node(_))),
        "only agent-4 is to blame: {:?}",
        c.also
    );
    let errors: u64 = r
        .volumes
        .iter()
        .filter(|x| x.node != "agent-4")
        .map(|x| x.summary.total.errors)
        .sum();
    assert_eq!(errors, 0, "no other volume had an error");
}

/// One busy loop per core beside the run, for as long as it lives.
fn busy_host() -> Vec<Proc> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (0..cores)
        .map(|_| {
            Proc(
                Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .spawn()
                    .unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_clean_run_beside_a_busy_process_blames_no_volume_or_node() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let busy = busy_host();
    let (r, text) = run(include_str!("../../examples/chokepoint/clean.toml"), "6");
    drop(busy);
    let c = r.chokepoint.as_ref().expect("a chokepoint analysis");
    let blames = |v: &Verdict| matches!(v, Verdict::Volume(_) | Verdict::Node(_));
    assert!(
        !blames(&c.verdict) && !c.also.iter().any(blames),
        "a clean run was blamed:\n{text}"
    );
    // The run did measure, on all six volumes.
    assert_eq!(r.volumes.len(), 6);
    for v in &r.volumes {
        assert!(
            v.summary.read.ios > 1000,
            "{}: {} IOs",
            v.node,
            v.summary.read.ios
        );
    }
}
