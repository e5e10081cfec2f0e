//! Multi-host scenarios in Docker: etcd and 4 agent containers on a network of their own, each
//! agent registered in etcd with its container address, and the coordinator on the host taking
//! its agents from the registry. One agent is killed, frozen or cut off mid-run.
//!
//! Needs the Docker engine (scripts/setup.sh --docker starts it) and the built binaries (the
//! images are made from them by deploy/container/build.sh). The scenarios run one at a time:
//! the machine has 2 cores and each cluster is 5 containers.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lockstep_tests::docker::Cluster;
use lockstep_tests::{AgentState, RunResults, RunStatus, agent, read_results, serial, wait_for};

fn plan(dir: &Path, duration: &str) -> PathBuf {
    let p = dir.join("plan.toml");
    std::fs::write(
        &p,
        format!(
            r#"
name = "containers"
duration = "{duration}"
interval = "1s"

[[role]]
name = "workers"
select = {{ labels = {{ role = "worker" }} }}
[role.workload.fio]
rw = "randrw"
rwmixread = 70
bs = "4k"
iodepth = 2
size = "8m"
rate_iops = 300
"#
        ),
    )
    .unwrap();
    p
}

/// Waits until every agent of the cluster is running the plan (their metrics say so).
fn wait_running(c: &Cluster) {
    let all = wait_for(Duration::from_secs(30), || {
        c.agents.iter().all(|a| c.run_state(&a.name) == Some(2))
    });
    assert!(all, "the agents did not all start running");
}

fn finish(run: &mut lockstep_tests::Proc, out: &Path, limit: Duration) -> RunResults {
    let t = Instant::now();
    loop {
        if let Some(status) = run.0.try_wait().unwrap() {
            let log = std::fs::read_to_string(out.with_extension("log")).unwrap_or_default();
            assert!(status.success(), "lockstep run: {status}\n{log}");
            return read_results(out);
        }
        assert!(
            t.elapsed() < limit,
            "lockstep run did not finish in {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_plan_across_four_agent_containers_completes_with_per_node_results() {
    let _one = serial();
    let t0 = Instant::now();
    let c = Cluster::start(4, &[]);
    let setup = t0.elapsed();
    let out = c.scratch.path().join("run");
    let mut run = c.spawn_run(&plan(c.scratch.path(), "5s"), &out);
    let r = finish(&mut run, &out, Duration::from_secs(60));
    assert_eq!(r.status, RunStatus::Completed, "{}", r.status_reason);
    assert_eq!(r.nodes.len(), 4, "{:?}", r.nodes);
    for a in &c.agents {
        let res = agent(&r, &a.name);
        assert_eq!(res.state, AgentState::Finished, "{res:?}");
        assert_eq!(
            res.address,
            format!("{}:7070", a.ip),
            "the coordinator dialed the advertised container address"
        );
        let v = r.volumes.iter().find(|v| v.node == a.name).unwrap();
        assert!(v.summary.total.ios > 500, "{v:?}");
    }
    eprintln!(
        "all agents: cluster up in {:.1} s, whole scenario {:.1} s",
        setup.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
}

#[test]
fn an_agent_container_killed_mid_run_is_reported_lost_and_the_others_finish() {
    let _one = serial();
    let t0 = Instant::now();
    let c = Cluster::start(4, &[]);
    let out = c.scratch.path().join("run");
    let mut run = c.spawn_run(&plan(c.scratch.path(), "10s"), &out);
    wait_running(&c);
    std::thread::sleep(Duration::from_secs(2));
    c.kill("agent-2");
    let r = finish(&mut run, &out, Duration::from_secs(60));
    assert_eq!(r.status, RunStatus::Partial);
    let lost = agent(&r, "agent-2");
    let AgentState::Lost { at_ms: at, .. } = lost.state else {
        panic!("agent-2 not lost: {lost:?}");
    };
    assert!((1..10_000).contains(&at), "lost at {at} ms");
    for n in ["agent-1", "agent-3", "agent-4"] {
        assert_eq!(agent(&r, n).state, AgentState::Finished, "{n}");
    }
    // And etcd forgets it within its TTL (5 s).
    assert!(wait_for(Duration::from_secs(8), || !c
        .registered()
        .contains(&"agent-2".to_string())));
    eprintln!(
        "kill: lost at {at} ms into the run; scenario {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}

#[test]
fn a_paused_agent_container_is_reported_and_stops_its_own_io_after_the_grace_period_once_thawed() {
    let _one = serial();
    let t0 = Instant::now();
    let c = Cluster::start(4, &["--grace", "2s"]);
    let out = c.scratch.path().join("run");
    let mut run = c.spawn_run(&plan(c.scratch.path(), "12s"), &out);
    wait_running(&c);
    std::thread::sleep(Duration::from_secs(2));
    c.pause("agent-3");
    let paused_at = Instant::now();
    // Frozen longer than the coordinator's keepalive tolerates (a ping after 2 s without a
    // report at 1 s intervals, 3 s for its answer: client::keepalive_for).
    std::thread::sleep(Duration::from_secs(6));
    c.unpause("agent-3");
    let r = finish(&mut run, &out, Duration::from_secs(60));
    let log = std::fs::read_to_string(out.with_extension("log")).unwrap();
    let frozen = agent(&r, "agent-3");
    let state = match frozen.state {
        AgentState::Finished => "finished",
        AgentState::Lost { .. } => "lost",
        AgentState::Failed { .. } => "failed",
    };
    // The coordinator reports it, never silently: its stream broke (keepalive) and either it
    // re-attached once the agent thawed (the agent keeps its events for a re-attach), or the
    // agent had stopped on its own and is lost; a pause the keepalive missed shows as a stall.
    let seen = log.contains("agent agent-3 stalled") || log.contains("agent agent-3 disconnected");
    assert!(
        seen && (state == "lost" || state == "finished"),
        "agent-3 ended {state}:\n{log}"
    );
    if state == "finished" && log.contains("agent agent-3 disconnected") {
        assert!(log.contains("agent agent-3 re-attached"), "{log}");
        assert!(
            frozen
                .disconnections
                .first()
                .is_some_and(|d| d.reattached_ms.is_some()),
            "{frozen:?}"
        );
    }
    for n in ["agent-1", "agent-2", "agent-4"] {
        assert_eq!(agent(&r, n).state, AgentState::Finished, "{n}");
    }
    if state == "lost" {
        assert_eq!(r.status, RunStatus::Partial);
        // Thawed, it finds nobody listening and stops its IO after --grace 2s: idle again,
        // its files gone, back in the registry.
        let idle = wait_for(Duration::from_secs(15), || {
            c.run_state("agent-3") == Some(0)
        });
        assert!(
            idle,
            "the thawed agent kept running without a coordinator:\n{}",
            c.logs("agent-3")
        );
        assert!(wait_for(Duration::from_secs(5), || c
            .volume_files("agent-3")
            .is_empty()));
        assert!(wait_for(Duration::from_secs(10), || c
            .registered()
            .contains(&"agent-3".to_string())));
    }
    eprintln!(
        "pause: agent-3 {state} (at {:?} ms; stalled reported: {}; disconnections {:?}), frozen 6 s; scenario {:.1} s (pause->end {:.1} s)",
        match frozen.state {
            AgentState::Lost { at_ms, .. } => Some(at_ms),
            _ => None,
        },
        log.contains("agent agent-3 stalled"),
        frozen.disconnections,
        t0.elapsed().as_secs_f64(),
        paused_at.elapsed().as_secs_f64()
    );
}

#[test]
fn an_agent_cut_off_from_the_network_stops_its_own_io_after_the_grace_period() {
    let _one = serial();
    let t0 = Instant::now();
    let c = Cluster::start(4, &["--grace", "2s"]);
    let out = c.scratch.path().join("run");
    // Long enough that the cut-off agent would still be running at the end without the rule.
    let mut run = c.spawn_run(&plan(c.scratch.path(), "20s"), &out);
    wait_running(&c);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(c.run_state_inside("agent-4"), Some(2));
    assert!(
        !c.volume_files("agent-4").is_empty(),
        "the running agent has no work file"
    );
    c.disconnect("agent-4");
    let cut = Instant::now();
    // Seen from inside the container: the run state goes back to idle and the work files go,
    // while the rest of the cluster is still running (the agent's keepalive notices the cut
    // within 8 s, then grace 2 s: well within the 20 s run).
    let stopped = wait_for(Duration::from_secs(14), || {
        c.run_state_inside("agent-4") == Some(0)
    });
    let stopped_after = cut.elapsed();
    assert!(
        stopped,
        "the cut-off agent kept running:\n{}",
        c.logs("agent-4")
    );
    assert!(
        wait_for(Duration::from_secs(5), || c
            .volume_files("agent-4")
            .is_empty()),
        "{:?}",
        c.volume_files("agent-4")
    );
    let logs = c.logs("agent-4");
    assert!(logs.contains("stopping IO"), "{logs}");
    assert!(
        run.0.try_wait().unwrap().is_none(),
        "the run should still be going on the other agents"
    );
    let r = finish(&mut run, &out, Duration::from_secs(60));
    assert_eq!(r.status, RunStatus::Partial);
    assert!(
        matches!(agent(&r, "agent-4").state, AgentState::Lost { .. }),
        "{:?}",
        agent(&r, "agent-4")
    );
    for n in ["agent-1", "agent-2", "agent-3"] {
        assert_eq!(agent(&r, n).state, AgentState::Finished, "{n}");
    }
    // Cut off from etcd too: its lease ran out.
    assert!(!c.registered().contains(&"agent-4".to_string()));
    eprintln!(
        "disconnect: agent-4 stopped its IO {:.1} s after the cut (grace 2 s); scenario {:.1} s",
        stopped_after.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
}

/// A real partition that heals within the agent's grace period: the coordinator's stream
/// breaks (keepalive), it keeps trying to re-attach, and once the network is back the agent
/// replays the intervals it kept: the run completes with every agent finished and no interval
/// missing, and the break is recorded.
#[test]
fn an_agent_cut_off_briefly_is_reattached_and_nothing_is_missing() {
    let _one = serial();
    let t0 = Instant::now();
    let c = Cluster::start(2, &["--grace", "20s"]);
    let out = c.scratch.path().join("run");
    let mut run = c.spawn_run(&plan(c.scratch.path(), "16s"), &out);
    wait_running(&c);
    std::thread::sleep(Duration::from_secs(2));
    c.disconnect("agent-2");
    let cut = Instant::now();
    // Longer than the coordinator's keepalive (5 s at 1 s intervals), shorter than the grace.
    std::thread::sleep(Duration::from_secs(6));
    c.reconnect("agent-2");
    let healed = cut.elapsed();
    let r = finish(&mut run, &out, Duration::from_secs(60));
    let log = std::fs::read_to_string(out.with_extension("log")).unwrap();
    assert_eq!(r.status, RunStatus::Completed, "{log}");
    let a2 = agent(&r, "agent-2");
    assert_eq!(a2.state, AgentState::Finished, "{a2:?}\n{log}");
    let d = &a2.disconnections;
    assert_eq!(d.len(), 1, "{a2:?}\n{log}");
    let (at, back) = (d[0].at_ms, d[0].reattached_ms);
    assert!(back.is_some(), "never re-attached: {a2:?}\n{log}");
    assert!(log.contains("agent agent-2 re-attached"), "{log}");
    // Every interval of the run is there for agent-2, the cut ones included.
    let t = lockstep_tests::read_timeline(&out);
    let points = t
        .volumes
        .iter()
        .find(|v| v.node == "agent-2")
        .unwrap()
        .points
        .len();
    assert!(points >= 16, "agent-2 has {points} intervals of a 16 s run");
    eprintln!(
        "partition: agent-2 cut for {:.1} s; stream broke at {at} ms, re-attached at {} ms; {points} intervals; scenario {:.1} s",
        healed.as_secs_f64(),
        back.unwrap(),
        t0.elapsed().as_secs_f64()
    );
}

#[test]
fn the_leader_coordinator_killed_mid_run_is_replaced_by_a_standby_that_aborts_the_run_and_says_so()
{
    use lockstep::service::leader::RunLifecycle;
    let _one = serial();
    let t0 = Instant::now();
    let mut c = Cluster::start(4, &[]);
    let runs = c.scratch.path().join("runs");
    std::fs::create_dir_all(&runs).unwrap();
    let eps = vec![c.etcd_url.clone()];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let leader = |rt: &tokio::runtime::Runtime| {
        rt.block_on(lockstep::service::leader::current_leader(&eps, "/lockstep"))
            .ok()
            .flatten()
            .map(|l| l.name)
    };
    let c1 = c.start_coordinator("c1", &runs);
    assert!(
        wait_for(Duration::from_secs(15), || leader(&rt).as_deref()
            == Some("c1")),
        "c1 did not lead"
    );
    c.start_coordinator("c2", &runs);
    std::thread::sleep(Duration::from_millis(500));
    let o = std::process::Command::new(lockstep_tests::bin("lockstep"))
        .arg("submit")
        .arg(plan(c.scratch.path(), "30s"))
        .args(["--etcd", &c.etcd_url])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let id = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let state = |rt: &tokio::runtime::Runtime| {
        rt.block_on(lockstep::service::leader::run_state(&eps, "/lockstep", &id))
            .unwrap()
            .unwrap()
    };
    wait_running(&c);
    assert_eq!(state(&rt).leader, "c1");
    std::thread::sleep(Duration::from_secs(2));
    c.kill_container(&c1);
    let killed = Instant::now();
    let taken = wait_for(Duration::from_secs(15), || {
        let s = state(&rt);
        s.leader == "c2" && s.status == RunLifecycle::Aborted
    });
    let takeover = killed.elapsed();
    assert!(taken, "the standby did not take over: {:?}", state(&rt));
    let idle = wait_for(Duration::from_secs(5), || {
        c.agents.iter().all(|a| c.run_state(&a.name) == Some(0))
    });
    assert!(idle, "agents still running the orphaned run");
    let r = read_results(&runs.join(&id));
    assert_eq!(r.status, RunStatus::Aborted);
    assert!(
        r.status_reason.contains("standby c2 took over"),
        "{}",
        r.status_reason
    );
    assert_eq!(r.agents.len(), 4);
    eprintln!(
        "leader loss: c1 killed -> c2 took the run over in {:.1} s (TTL 2 s), agents idle {:.1} s after the kill; scenario {:.1} s",
        takeover.as_secs_f64(),
        killed.elapsed().as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
}
