//! The agent simulator against the real coordinator: `lockstep-agent simulate` as a process,
//! `lockstep run --agents-file` over real sockets, and what the run made of it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use lockstep::results::chokepoint::Verdict;
use lockstep_tests::{AgentState, Proc, RunStatus, bin, output_text, read_results, scratch};

/// 250 ms intervals: the slow volume turns slow at the run's middle (about 6.5 s) and has ~26
/// slow intervals after it, well past the finder's persistence of 10.
const PLAN: &str = r#"
name = "sim"
ramp = "1s"
duration = "12s"
interval = "250ms"

[[role]]
name = "datanode"
[role.workload.fio]
rw = "randrw"
rwmixread = 70
bs = "4k"
iodepth = 2
size = "1g"
ioengine = "null"
"#;

/// Starts the simulator and waits for its `ready` line (every agent listens and the addresses
/// file is written).
fn simulate(addresses: &Path, args: &[&str]) -> Proc {
    let mut child = Command::new(bin("lockstep-agent"))
        .arg("simulate")
        .arg("--addresses")
        .arg(addresses)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawning lockstep-agent simulate");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("reading the simulator");
    assert_eq!(line.trim(), "ready", "unexpected simulator output");
    Proc(child)
}

fn run(dir: &Path, addresses: &Path, extra: &[&str]) -> (std::process::Output, std::path::PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let plan = dir.join("plan.toml");
    std::fs::write(&plan, PLAN).unwrap();
    let out = dir.join("run");
    let o = Command::new(bin("lockstep"))
        .arg("run")
        .arg(&plan)
        .arg("--agents-file")
        .arg(addresses)
        .args(extra)
        .arg("--output")
        .arg(&out)
        .stdin(Stdio::null())
        .output()
        .expect("running lockstep");
    (o, out)
}

#[test]
fn twenty_simulated_agents_are_run_by_the_real_coordinator_and_the_slow_volume_is_named() {
    let dir = scratch();
    let addresses = dir.path().join("agents.txt");
    let _sim = simulate(
        &addresses,
        &[
            "--agents",
            "20",
            "--volumes",
            "4",
            "--slow",
            "1",
            "--lose",
            "1",
            "--grace",
            "1s",
            "--token",
            "s3cret",
            "--clock-offset-ms",
            "3",
        ],
    );
    assert_eq!(
        std::fs::read_to_string(&addresses).unwrap().lines().count(),
        20
    );

    // The token rule is the real agent's: a coordinator without it is refused before any work.
    let (o, _) = run(&dir.path().join("no-token"), &addresses, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", output_text(&o));
    assert!(
        output_text(&o).contains("refused the token"),
        "{}",
        output_text(&o)
    );

    let (o, out) = run(dir.path(), &addresses, &["--token", "s3cret"]);
    let text = output_text(&o);
    assert!(o.status.success(), "lockstep run failed: {text}");
    assert!(text.contains("interval lag: median"), "{text}");
    let r = read_results(&out);
    // agent-19 was lost mid-run: the run goes on without it.
    assert_eq!(r.status, RunStatus::Partial, "{}", r.status_reason);
    let lost: Vec<_> = r
        .agents
        .iter()
        .filter(|a| matches!(a.state, AgentState::Lost { .. }))
        .map(|a| a.name.as_str())
        .collect();
    assert_eq!(lost, ["agent-19"]);
    assert_eq!(r.volumes.len(), 80);
    // 1,000-3,000 IOs per 250 ms interval and direction: 4,000-12,000 IOPS, 8,000 on average
    // (the slow volume 1.5x fewer for half the run, the lost agent's until it was lost).
    for v in &r.volumes {
        let (read, write) = (v.summary.read.iops, v.summary.write.iops);
        if v.node == "agent-0" && v.volume == "data1" || v.node == "agent-19" {
            continue;
        }
        assert!(
            (6_000.0..10_000.0).contains(&read),
            "{}/{}: {read}",
            v.node,
            v.volume
        );
        assert!(
            (6_000.0..10_000.0).contains(&write),
            "{}/{}: {write}",
            v.node,
            v.volume
        );
        let p50 = v.summary.read.lat.percentiles["50.000000"] as f64;
        assert!(
            (400_000.0..600_000.0).contains(&p50),
            "{}/{}: {p50}",
            v.node,
            v.volume
        );
    }
    // Clocks 3 ms off are measured, and the agents still start together.
    let skew = r.start_skew_ns.expect("a measured start skew");
    assert!(skew < 50_000_000, "start skew {skew} ns");
    let c = r.chokepoint.as_ref().expect("a chokepoint section");
    let Verdict::Volume(v) = &c.verdict else {
        panic!("not a volume verdict: {:?}", c.verdict);
    };
    assert_eq!((v.node.as_str(), v.volume.as_str()), ("agent-0", "data1"));
}
