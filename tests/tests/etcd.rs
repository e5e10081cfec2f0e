//! Membership in a real etcd with real agent processes: how soon an agent is listed, how soon
//! a dead or frozen one is not, and a run whose agents come from the registry by label.
//! etcd must be installed (scripts/setup.sh does it); these tests fail, not skip, without it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lockstep_agent::registry::Registration;
use lockstep_tests::{Etcd, Proc, RunStatus, bin, read_results, scratch, start_agent};

/// One entry of `lockstep agents --json`: the coordinator's `orchestrate::registry::LiveAgent`
/// (which is Serialize only), read back through the agent's own registration type.
#[derive(serde::Deserialize)]
struct ListedAgent {
    #[serde(flatten)]
    registration: Registration,
    lease_ttl_left_s: Option<i64>,
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Names of the agents currently listed in the registry.
fn listed(rt: &tokio::runtime::Runtime, etcd: &Etcd) -> Vec<String> {
    let eps = vec![etcd.url.clone()];
    rt.block_on(lockstep::orchestrate::registry::list(&eps, "/lockstep"))
        .expect("listing the registry")
        .into_iter()
        .map(|a| a.registration.name)
        .collect()
}

/// Polls every 10 ms until `f` holds; returns how long it took, or None after `limit`.
fn time_until(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if f() {
            return Some(t.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

fn volume(dir: &Path, name: &str) -> std::path::PathBuf {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn an_agent_is_listed_within_2s_of_starting_and_gone_within_its_ttl_after_a_kill() {
    let etcd = Etcd::start();
    let dir = scratch();
    let rt = rt();
    let t0 = Instant::now();
    let (agent, addr) = start_agent(
        "n1",
        &volume(dir.path(), "v1"),
        &[
            "--etcd",
            &etcd.url,
            "--label",
            "role=worker",
            "--label",
            "az=a",
        ],
    );
    let visible = time_until(Duration::from_secs(10), || {
        listed(&rt, &etcd).contains(&"n1".to_string())
    })
    .map(|_| t0.elapsed())
    .expect("the agent never appeared in the registry");
    eprintln!(
        "registration: agent spawned -> listed in etcd in {:.0} ms",
        visible.as_secs_f64() * 1e3
    );
    assert!(
        visible < Duration::from_secs(2),
        "registration took {visible:?}"
    );

    // `lockstep agents` shows it with labels, volume and version; --json for machines.
    let out = Command::new(bin("lockstep"))
        .args(["agents", "--etcd", &etcd.url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("n1") && text.contains(&addr) && text.contains("az=a,role=worker"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "0.1.0 (protocol {})",
            lockstep_proto::PROTOCOL_VERSION
        )),
        "{text}"
    );
    let out = Command::new(bin("lockstep"))
        .args(["agents", "--json", "--etcd", &etcd.url])
        .output()
        .unwrap();
    let v: Vec<ListedAgent> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0].registration.name, "n1");
    assert_eq!(v[0].registration.volumes[0].name, "data");
    assert_eq!(v[0].registration.labels["role"], "worker");
    assert!(v[0].lease_ttl_left_s.unwrap() <= 5);

    // SIGKILL: no revoke, the lease must run out. The default TTL is 5 s.
    agent.signal(libc::SIGKILL);
    let t_kill = Instant::now();
    let gone = time_until(Duration::from_secs(15), || listed(&rt, &etcd).is_empty())
        .expect("a killed agent stayed in the registry");
    eprintln!(
        "expiry: agent killed -> gone from etcd in {:.0} ms (lease TTL 5 s)",
        gone.as_secs_f64() * 1e3
    );
    // Within the TTL, plus etcd's expiry check (every 500 ms on its leader) and slack for a
    // loaded CI machine; the figure printed above is the measurement.
    assert!(
        t_kill.elapsed() <= Duration::from_millis(6_000),
        "took {gone:?}"
    );
    drop(agent);
}

#[test]
fn a_frozen_agent_leaves_the_registry_and_comes_back_when_it_thaws_and_sigterm_leaves_at_once() {
    let etcd = Etcd::start();
    let dir = scratch();
    let rt = rt();
    let (agent, _) = start_agent(
        "n1",
        &volume(dir.path(), "v1"),
        &["--etcd", &etcd.url, "--etcd-ttl", "2s"],
    );
    time_until(Duration::from_secs(5), || !listed(&rt, &etcd).is_empty()).expect("not registered");
    agent.signal(libc::SIGSTOP);
    let gone = time_until(Duration::from_secs(10), || listed(&rt, &etcd).is_empty())
        .expect("a frozen agent stayed listed");
    eprintln!(
        "expiry: agent frozen -> gone in {:.0} ms (lease TTL 2 s)",
        gone.as_secs_f64() * 1e3
    );
    agent.signal(libc::SIGCONT);
    // Its keep-alive finds the lease expired and registers under a new one.
    let back = time_until(Duration::from_secs(10), || !listed(&rt, &etcd).is_empty())
        .expect("a thawed agent did not come back");
    eprintln!(
        "re-registration after thaw: {:.0} ms",
        back.as_secs_f64() * 1e3
    );
    // A clean stop revokes the lease: gone at once, not after the TTL.
    agent.signal(libc::SIGTERM);
    let gone = time_until(Duration::from_secs(5), || listed(&rt, &etcd).is_empty())
        .expect("still listed after SIGTERM");
    eprintln!("SIGTERM -> gone in {:.0} ms", gone.as_secs_f64() * 1e3);
    assert!(gone < Duration::from_millis(1_500), "{gone:?}");
}

#[test]
fn a_plan_runs_on_the_agents_its_labels_select_from_the_registry() {
    let etcd = Etcd::start();
    let dir = scratch();
    let mut agents: Vec<Proc> = Vec::new();
    for (name, role) in [("w1", "worker"), ("w2", "worker"), ("db1", "db")] {
        let (p, _) = start_agent(
            name,
            &volume(dir.path(), name),
            &["--etcd", &etcd.url, "--label", &format!("role={role}")],
        );
        agents.push(p);
    }
    let rt = rt();
    time_until(Duration::from_secs(5), || listed(&rt, &etcd).len() == 3)
        .expect("agents not registered");
    let plan = dir.path().join("plan.toml");
    std::fs::write(
        &plan,
        r#"
name = "by-label"
duration = "3s"
interval = "1s"

[[role]]
name = "workers"
select = { labels = { role = "worker" } }
[role.workload.fio]
rw = "randread"
bs = "4k"
iodepth = 2
size = "8m"
"#,
    )
    .unwrap();
    let out = dir.path().join("run");
    let t = Instant::now();
    let o = Command::new(bin("lockstep"))
        .arg("run")
        .arg(&plan)
        .args(["--etcd", &etcd.url, "--output"])
        .arg(&out)
        .stdout(Stdio::null())
        .output()
        .unwrap();
    eprintln!("run via --etcd: {:.1} s", t.elapsed().as_secs_f64());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = read_results(&out);
    assert_eq!(r.status, RunStatus::Completed);
    let mut nodes: Vec<&str> = r.volumes.iter().map(|v| v.node.as_str()).collect();
    nodes.sort();
    assert_eq!(
        nodes,
        ["w1", "w2"],
        "only the agents labelled role=worker run"
    );
    for v in &r.volumes {
        assert!(v.summary.read.ios > 0, "{v:?}");
    }
    // No agent registered: a clear refusal, not an empty run.
    let o = Command::new(bin("lockstep"))
        .arg("run")
        .arg(&plan)
        .args([
            "--etcd",
            &etcd.url,
            "--etcd-prefix",
            "/elsewhere",
            "--output",
        ])
        .arg(dir.path().join("run2"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no agent is registered"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn lockstep_agents_says_when_etcd_is_not_there() {
    let port = lockstep_tests::free_port();
    let o = Command::new(bin("lockstep"))
        .args(["agents", "--etcd", &format!("127.0.0.1:{port}")])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("is etcd running there?"), "{err}");
}
