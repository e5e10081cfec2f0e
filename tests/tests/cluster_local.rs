//! Cluster runs with real agent processes on loopback: merging, the raw histograms, lost
//! agents, Ctrl-C, and an agent that loses its coordinator.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use lockstep_proto::histogram::SparseHistogram;
use lockstep_tests::{
    AgentState, Proc, RunStatus, agent, bin, output_text, read_json, read_results, read_timeline,
    run_plan, scratch, spawn_run, start_agent, wait_for,
};

fn write_plan(dir: &Path, body: &str) -> std::path::PathBuf {
    let p = dir.join("plan.toml");
    std::fs::write(&p, body).unwrap();
    p
}

const SMALL: &str = r#"
name = "e2e"
duration = "4s"
interval = "1s"

[[role]]
name = "w"
[role.workload.fio]
rw = "randrw"
rwmixread = 70
bs = "4k"
iodepth = 2
size = "8m"
"#;

#[test]
fn local_run_merges_volumes_and_results_match_the_raw_histograms() {
    let dir = scratch();
    let (o, out) = run_plan(dir.path(), SMALL, Some(3), &[]);
    assert!(
        o.status.success(),
        "lockstep run failed: {}",
        output_text(&o)
    );
    let r = read_results(&out);
    assert_eq!(r.status, RunStatus::Completed);
    let vols = &r.volumes;
    assert_eq!(vols.len(), 3);
    // Every volume's latency percentiles equal those recomputed from the stored histograms.
    let entries = lockstep::results::store::read_entries(&out).unwrap();
    assert!(!entries.is_empty());
    let mut per: BTreeMap<String, SparseHistogram> = BTreeMap::new();
    let mut cluster: Option<SparseHistogram> = None;
    for e in &entries {
        let parts: Vec<&str> = e.tag.split('/').collect();
        if parts[3] != "lat" || parts[2] != "read" {
            continue;
        }
        let key = format!("{}/{}", parts[0], parts[1]);
        match per.get_mut(&key) {
            Some(h) => h.merge(&e.histogram).unwrap(),
            None => {
                per.insert(key, e.histogram.clone());
            }
        }
        match cluster.as_mut() {
            Some(h) => h.merge(&e.histogram).unwrap(),
            None => cluster = Some(e.histogram.clone()),
        }
    }
    for v in vols {
        let key = format!("{}/{}", v.node, v.volume);
        let h = &per[&key];
        let lat = &v.summary.read.lat;
        assert_eq!(lat.n, h.len(), "{key}");
        for p in ["50.000000", "99.000000", "99.900000"] {
            let want = h.value_at_percentile(p.parse().unwrap());
            assert_eq!(lat.percentiles[p], want, "{key} p{p}");
        }
        assert!(v.summary.read.iops > 0.0);
    }
    let c = cluster.unwrap();
    assert_eq!(
        r.cluster.read.lat.percentiles["99.000000"],
        c.value_at_percentile(99.0)
    );
    // The same histograms as HdrHistogram's standard interval log, for its own tools.
    let o = Command::new(bin("lockstep"))
        .args(["export-hlog".as_ref(), out.as_os_str()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", output_text(&o));
    let log = lockstep::results::hlog::read(&out.join("intervals.hlog")).unwrap();
    assert_eq!(log.len(), entries.len());
    let tags = |v: &[lockstep::results::hlog::LogEntry]| {
        let mut t: Vec<String> = v
            .iter()
            .map(|e| format!("{} {} {}", e.tag, e.start_s, e.histogram.len()))
            .collect();
        t.sort();
        t
    };
    assert_eq!(tags(&log), tags(&entries));
    // The start skew is measured and reported, with each agent's clock offset.
    assert!(r.start_skew_ns.is_some());
    assert!(r.agents.iter().all(|a| a.clock.rtt_ns > 0));
    // fio-compatible export: one client_stats entry per agent job and "All clients". fio's
    // format, not the coordinator's model: read as JSON.
    let fio = read_json(&out.join("fio.json"));
    let cs = fio["client_stats"].as_array().unwrap();
    assert_eq!(cs.last().unwrap()["jobname"], "All clients");
    assert!(cs.iter().any(|j| j["hostname"] == "agent-2"));
    assert_eq!(
        cs.last().unwrap()["read"]["total_ios"].as_u64().unwrap(),
        r.cluster.read.ios
    );
    let csv = std::fs::read_to_string(out.join("timeline.csv")).unwrap();
    assert!(csv.lines().count() > 3 * 3, "{csv}");
    // The local volumes were removed with the agents.
    assert!(!out.join("volumes").exists());
    // `lockstep report` re-renders the run.
    let o = Command::new(bin("lockstep"))
        .arg("report")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("agent-3/data"));
}

/// Runs `plan` on `agents` local agents and expects it to succeed: the results directory.
fn run_ok(dir: &Path, plan: &str, agents: usize) -> std::path::PathBuf {
    let (o, out) = run_plan(dir, plan, Some(agents), &[]);
    assert!(
        o.status.success(),
        "lockstep run failed: {}",
        output_text(&o)
    );
    out
}

/// `histogram_digits = 2`: the agents send their interval histograms coarsened to 2
/// significant digits, the data files keep them so, the summaries are merged from them, and
/// results.json and the text report say so; fio.json (the agents' final results) keeps 3.
#[test]
fn a_two_digit_run_sends_stores_and_reports_two_digit_histograms() {
    let dir = scratch();
    let plan = SMALL.replace(
        "interval = \"1s\"",
        "interval = \"1s\"\nhistogram_digits = 2",
    );
    let out = run_ok(dir.path(), &plan, 2);
    let r = read_results(&out);
    assert_eq!(r.status, RunStatus::Completed);
    assert_eq!(r.data.as_ref().map(|d| d.histogram_digits), Some(2));
    let entries = lockstep::results::store::read_entries(&out).unwrap();
    assert!(
        entries.len() >= 2 * 4 * 2,
        "{} stored histograms",
        entries.len()
    );
    for e in &entries {
        assert_eq!(e.histogram.geometry.sigfig, 2, "{}", e.tag);
    }
    // Each volume's figures are the merge of its stored two-digit histograms.
    for v in &r.volumes {
        let mut merged: Option<SparseHistogram> = None;
        let prefix = format!("{}/{}/read/lat", v.node, v.volume);
        for e in entries.iter().filter(|e| e.tag == prefix) {
            match merged.as_mut() {
                Some(h) => h.merge(&e.histogram).unwrap(),
                None => merged = Some(e.histogram.clone()),
            }
        }
        let h = merged.expect("the volume's read histograms");
        assert_eq!(h.geometry.sigfig, 2);
        assert_eq!(v.summary.read.lat.n, h.len(), "{prefix}");
        assert_eq!(
            v.summary.read.lat.percentiles["99.000000"],
            h.value_at_percentile(99.0),
            "{prefix}"
        );
    }
    let fio = read_json(&out.join("fio.json"));
    let all = fio["client_stats"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        all["read"]["total_ios"].as_u64().unwrap(),
        r.cluster.read.ios
    );
    let said = "latency histograms: 2 significant digits";
    let text = std::fs::read_to_string(out.join("report.txt")).unwrap();
    assert!(text.contains(said), "{text}");
    let o = Command::new(bin("lockstep"))
        .arg("report")
        .arg(&out)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains(said));
}

/// The plan's `interval` reaches the agents: a 250 ms interval gives four points a second on
/// every volume, each about 250 ms long.
#[test]
fn the_plans_reporting_interval_is_the_agents_interval() {
    let dir = scratch();
    let plan = SMALL.replace("interval = \"1s\"", "interval = \"250ms\"");
    let out = run_ok(dir.path(), &plan, 2);
    let t = read_timeline(&out);
    assert_eq!(t.interval_ms, 250);
    for v in &t.volumes {
        let points = &v.points;
        // 4 s at 250 ms (the last one may be a sliver of IOs finishing after the runtime).
        assert!((16..=17).contains(&points.len()), "{} points", points.len());
        for p in &points[..16] {
            let len = p.len_ms;
            assert!((200..=300).contains(&len), "a {len} ms interval: {p:?}");
        }
    }
}

fn agents_plan(agents: &[(&str, &str)], duration: &str) -> String {
    let mut s = format!("name = \"kill\"\nduration = \"{duration}\"\ninterval = \"1s\"\n");
    for (n, a) in agents {
        s += &format!("\n[[agent]]\nname = \"{n}\"\naddress = \"{a}\"\n");
    }
    s += "\n[[role]]\nname = \"w\"\n[role.workload.fio]\nrw = \"randread\"\nbs = \"4k\"\niodepth = 2\nsize = \"8m\"\n";
    s
}

#[test]
fn an_agent_killed_mid_run_is_reported_lost_and_the_others_finish() {
    let dir = scratch();
    let mut procs = Vec::new();
    let mut addrs = Vec::new();
    for i in 1..=3 {
        let d = dir.path().join(format!("v{i}"));
        std::fs::create_dir_all(&d).unwrap();
        let (p, a) = start_agent(&format!("a{i}"), &d, &[]);
        procs.push(p);
        addrs.push(a);
    }
    let names = ["a1", "a2", "a3"];
    let list: Vec<(&str, &str)> = names
        .iter()
        .copied()
        .zip(addrs.iter().map(String::as_str))
        .collect();
    let plan = write_plan(dir.path(), &agents_plan(&list, "8s"));
    let out = dir.path().join("run");
    let run = spawn_run(&plan, &out);
    std::thread::sleep(Duration::from_secs(4));
    procs[1].signal(libc::SIGKILL);
    let mut run = run;
    let status = run.0.wait().unwrap();
    assert!(status.success(), "{status}");
    let r = read_results(&out);
    assert_eq!(r.status, RunStatus::Partial);
    let a2 = agent(&r, "a2");
    let AgentState::Lost { at_ms: at, .. } = a2.state else {
        panic!("a2 not lost: {a2:?}");
    };
    assert!((2000..8000).contains(&at), "lost at {at} ms");
    for n in ["a1", "a3"] {
        let a = agent(&r, n);
        assert_eq!(a.state, AgentState::Finished, "{a:?}");
    }
    let v2 = r.volumes.iter().find(|v| v.node == "a2").unwrap();
    assert_eq!(v2.lost_at_ms, Some(at));
    let text = std::fs::read_to_string(out.join("report.txt")).unwrap();
    assert!(text.contains("LOST"), "{text}");
}

#[test]
fn ctrl_c_aborts_every_agent_and_keeps_partial_results() {
    let dir = scratch();
    let d = dir.path().join("v1");
    std::fs::create_dir_all(&d).unwrap();
    let (_agent, addr) = start_agent("a1", &d, &[]);
    let plan = write_plan(dir.path(), &agents_plan(&[("a1", &addr)], "60s"));
    let out = dir.path().join("run");
    let mut run = spawn_run(&plan, &out);
    std::thread::sleep(Duration::from_secs(4));
    run.signal(libc::SIGINT);
    let status = run.0.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{status}");
    let r = read_results(&out);
    assert_eq!(r.status, RunStatus::Aborted);
    assert!(r.volumes[0].summary.read.ios > 0);
    assert!(r.duration_ms < 20_000);
    // The agent stopped its IO and removed its files.
    assert!(wait_for(Duration::from_secs(5), || std::fs::read_dir(&d)
        .unwrap()
        .next()
        .is_none()));
}

#[test]
fn an_agent_that_loses_its_coordinator_stops_its_io_after_the_grace_period() {
    let dir = scratch();
    let d = dir.path().join("v1");
    std::fs::create_dir_all(&d).unwrap();
    let (_agent, addr) = start_agent("a1", &d, &["--grace", "1s"]);
    let plan = write_plan(dir.path(), &agents_plan(&[("a1", &addr)], "120s"));
    let out = dir.path().join("run");
    let mut run = spawn_run(&plan, &out);
    // Running: the agent's work file exists.
    assert!(wait_for(Duration::from_secs(10), || std::fs::read_dir(&d)
        .unwrap()
        .next()
        .is_some()));
    std::thread::sleep(Duration::from_secs(2));
    run.signal(libc::SIGKILL);
    let _ = run.0.wait();
    // Keepalive notices within ~4 s, then 1 s of grace: the run stops and its files go.
    assert!(
        wait_for(Duration::from_secs(15), || std::fs::read_dir(&d)
            .unwrap()
            .next()
            .is_none()),
        "the agent kept running without a coordinator"
    );
    // And it is idle again: a new coordinator may use it.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let idle = wait_for(Duration::from_secs(5), || {
        rt.block_on(async {
            lockstep::orchestrate::client::connect(
                "a1",
                &addr,
                None,
                lockstep::orchestrate::client::KEEPALIVE,
            )
            .await
            .unwrap()
            .hello
            .busy_with_run
            .is_empty()
        })
    });
    assert!(idle, "the agent still claims a run after stopping it");
}

#[test]
fn wrong_token_and_bad_plans_are_refused_before_any_io() {
    let dir = scratch();
    let d = dir.path().join("v1");
    std::fs::create_dir_all(&d).unwrap();
    let (_agent, addr) = start_agent("a1", &d, &["--token", "s3cret"]);
    let plan = write_plan(dir.path(), &agents_plan(&[("a1", &addr)], "5s"));
    let o = Command::new(bin("lockstep"))
        .arg("run")
        .arg(&plan)
        .arg("--output")
        .arg(dir.path().join("r1"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("token"), "{err}");
    // An unknown volume in the plan names the plan line.
    let bad = agents_plan(&[("a1", &addr)], "5s").replace(
        "[[role]]\nname = \"w\"\n",
        "[[role]]\nname = \"w\"\nvolumes = [\"nope\"]\n",
    );
    let plan = write_plan(dir.path(), &bad);
    let o = Command::new(bin("lockstep"))
        .arg("run")
        .arg(&plan)
        .args(["--token", "s3cret", "--output"])
        .arg(dir.path().join("r2"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("plan.toml:") && err.contains("nope"), "{err}");
    assert!(
        std::fs::read_dir(&d).unwrap().next().is_none(),
        "files were created despite the refusal"
    );
}

fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn free_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

#[test]
fn agent_and_coordinator_serve_prometheus_metrics() {
    let dir = scratch();
    let d = dir.path().join("v1");
    std::fs::create_dir_all(&d).unwrap();
    let agent_metrics = free_port();
    let (_agent, addr) = start_agent("a1", &d, &["--metrics-listen", &agent_metrics]);
    let plan = write_plan(dir.path(), &agents_plan(&[("a1", &addr)], "6s"));
    let coord_metrics = free_port();
    let mut run = Proc(
        Command::new(bin("lockstep"))
            .arg("run")
            .arg(&plan)
            .arg("--output")
            .arg(dir.path().join("run"))
            .args(["--metrics-listen", &coord_metrics])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut agent_text = String::new();
    let mut coord_text = String::new();
    let seen = wait_for(Duration::from_secs(10), || {
        agent_text = http_get(&agent_metrics, "/metrics");
        coord_text = std::net::TcpStream::connect(&coord_metrics)
            .map(|_| http_get(&coord_metrics, "/metrics"))
            .unwrap_or_default();
        agent_text.contains("lockstep_agent_run_state 2")
            && coord_text.contains("lockstep_run_state 1")
    });
    assert!(seen, "agent:\n{agent_text}\ncoordinator:\n{coord_text}");
    assert!(run.0.wait().unwrap().success());
    // Counters moved: the read IOs of volume data are above zero.
    let text = http_get(&agent_metrics, "/metrics");
    let ios = text
        .lines()
        .find(|l| {
            l.starts_with("lockstep_agent_volume_ios_total{") && l.contains("direction=\"read\"")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(ios > 0.0, "{text}");
    assert!(
        text.contains("lockstep_agent_volume_latency_seconds_bucket"),
        "{text}"
    );
}
