//! Several coordinators on a real etcd: one leads and runs submitted plans; when it is killed
//! mid-run, the standby takes the run over, aborts it on every agent (well before the agents'
//! own grace period would have stopped them) and `results.json` says so.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lockstep_tests::{
    AgentState, Etcd, Proc, RunStatus, bin, read_results, scratch, start_agent, wait_for,
};

fn coordinator(etcd: &Etcd, name: &str, runs: &Path, log: &Path) -> Proc {
    Proc(
        Command::new(bin("lockstep"))
            .args([
                "coordinator",
                "--etcd",
                &etcd.url,
                "--name",
                name,
                "--leader-ttl",
                "2s",
                "--runs-dir",
            ])
            .arg(runs)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap(),
    )
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn leader(rt: &tokio::runtime::Runtime, etcd: &Etcd) -> Option<String> {
    rt.block_on(lockstep::service::leader::current_leader(
        &[etcd.url.clone()],
        "/lockstep",
    ))
    .ok()
    .flatten()
    .map(|l| l.name)
}

fn state(
    rt: &tokio::runtime::Runtime,
    etcd: &Etcd,
    id: &str,
) -> lockstep::service::leader::RunState {
    rt.block_on(lockstep::service::leader::run_state(
        &[etcd.url.clone()],
        "/lockstep",
        id,
    ))
    .unwrap()
    .expect("no run state")
}

fn submit(etcd: &Etcd, plan: &Path) -> String {
    let o = Command::new(bin("lockstep"))
        .arg("submit")
        .arg(plan)
        .args(["--etcd", &etcd.url])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn plan(dir: &Path, name: &str, duration: &str) -> std::path::PathBuf {
    let p = dir.join(format!("{name}.toml"));
    let text = format!(
        "name = \"{name}\"\nduration = \"{duration}\"\ninterval = \"1s\"\n\n[[role]]\nname = \"w\"\n\
         [role.workload.fio]\nrw = \"randread\"\nbs = \"4k\"\niodepth = 2\nsize = \"4m\"\nrate_iops = 200\n"
    );
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn a_standby_takes_over_when_the_leader_dies_mid_run_and_results_json_says_so() {
    use lockstep::service::leader::RunLifecycle;
    let etcd = Etcd::start();
    let dir = scratch();
    let rt = rt();
    let mut agents = Vec::new();
    let mut addrs = Vec::new();
    for name in ["a1", "a2"] {
        let v = dir.path().join(name);
        std::fs::create_dir_all(&v).unwrap();
        // The default grace (10 s): agents left alone would stop 10 s after losing the leader.
        let (p, a) = start_agent(name, &v, &["--etcd", &etcd.url]);
        agents.push(p);
        addrs.push(a);
    }
    let runs = dir.path().join("runs");
    let c1 = coordinator(&etcd, "c1", &runs, &dir.path().join("c1.log"));
    assert!(
        wait_for(Duration::from_secs(10), || leader(&rt, &etcd).as_deref()
            == Some("c1")),
        "c1 did not lead"
    );
    let _c2 = coordinator(&etcd, "c2", &runs, &dir.path().join("c2.log"));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        leader(&rt, &etcd).as_deref(),
        Some("c1"),
        "the standby must not lead while c1 lives"
    );

    let id = submit(&etcd, &plan(dir.path(), "long", "30s"));
    assert!(
        wait_for(Duration::from_secs(15), || state(&rt, &etcd, &id).status
            == RunLifecycle::Running),
        "the leader did not start the run"
    );
    let s = state(&rt, &etcd, &id);
    assert_eq!(s.leader, "c1");
    assert_eq!(s.agents.len(), 2);
    // Running on both agents.
    let busy = |addr: &str, name: &str| {
        rt.block_on(lockstep::orchestrate::client::connect(
            name,
            addr,
            None,
            lockstep::orchestrate::client::KEEPALIVE,
        ))
        .map(|c| c.hello.busy_with_run)
        .unwrap_or_default()
    };
    assert!(wait_for(Duration::from_secs(10), || busy(&addrs[0], "a1")
        == id
        && busy(&addrs[1], "a2") == id));
    std::thread::sleep(Duration::from_secs(2));

    c1.signal(libc::SIGKILL);
    let killed = Instant::now();
    let took_over = wait_for(Duration::from_secs(15), || {
        let s = state(&rt, &etcd, &id);
        s.leader == "c2" && s.status == RunLifecycle::Aborted
    });
    let takeover = killed.elapsed();
    let c2_log = std::fs::read_to_string(dir.path().join("c2.log")).unwrap_or_default();
    assert!(
        took_over,
        "the standby did not take the run over:\n{c2_log}"
    );
    eprintln!(
        "leader killed -> standby took the run over in {:.0} ms (leader lease TTL 2 s)",
        takeover.as_secs_f64() * 1e3
    );
    assert!(takeover < Duration::from_secs(6), "{takeover:?}");
    // The agents were told to stop, not left to their 10 s grace.
    let idle = wait_for(Duration::from_secs(5), || {
        busy(&addrs[0], "a1").is_empty() && busy(&addrs[1], "a2").is_empty()
    });
    assert!(idle, "the agents still run the orphaned run");
    let stopped = killed.elapsed();
    eprintln!(
        "leader killed -> both agents idle in {:.0} ms (their grace: 10 s)",
        stopped.as_secs_f64() * 1e3
    );
    assert!(stopped < Duration::from_secs(9));

    let s = state(&rt, &etcd, &id);
    assert!(
        s.reason.contains("c1 was lost")
            && s.reason.contains("standby c2")
            && s.reason.contains("(phase 'measure')"),
        "{}",
        s.reason
    );
    assert_eq!(s.phases.len(), 1);
    assert!(
        s.history.iter().any(|h| h.contains("took over from c1")),
        "{:?}",
        s.history
    );
    let r = read_results(Path::new(&s.output_dir));
    assert_eq!(r.status, RunStatus::Aborted);
    let why = &r.status_reason;
    assert!(
        why.contains("standby c2 took over") && why.contains("aborted"),
        "{why}"
    );
    for a in &r.agents {
        assert!(matches!(a.state, AgentState::Lost { .. }), "{a:?}");
    }
    // `lockstep report` reads what the standby wrote.
    let o = Command::new(bin("lockstep"))
        .arg("report")
        .arg(&s.output_dir)
        .output()
        .unwrap();
    assert!(
        o.status.success() || o.status.code() == Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // The new leader runs the next plan to completion.
    let id2 = submit(&etcd, &plan(dir.path(), "short", "2s"));
    assert!(wait_for(Duration::from_secs(30), || state(
        &rt, &etcd, &id2
    )
    .status
    .is_terminal()));
    let s2 = state(&rt, &etcd, &id2);
    assert_eq!(
        (s2.status, s2.leader.as_str()),
        (RunLifecycle::Completed, "c2"),
        "{}",
        s2.reason
    );
    let r2 = read_results(Path::new(&s2.output_dir));
    assert_eq!(r2.status, RunStatus::Completed);
    // `lockstep runs` shows both.
    let o = Command::new(bin("lockstep"))
        .args(["runs", "--etcd", &etcd.url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("leader: c2") && text.contains(&id) && text.contains(&id2),
        "{text}"
    );
}
