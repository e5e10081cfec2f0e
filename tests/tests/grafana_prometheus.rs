//! The Grafana dashboard (deploy/grafana/lockstep.json) against a real Prometheus: Debian's
//! `prometheus` (installed by scripts/setup.sh) scrapes a real run, the coordinator's
//! `--metrics-listen` endpoint and three agent daemons' `--metrics-listen`, every second; while
//! the run goes on, every panel's PromQL is run through Prometheus' HTTP API and must return
//! series with finite values. Each query is printed with its series count.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lockstep_tests::{Proc, bin, free_port, scratch, start_agent, wait_for};

fn prometheus() -> PathBuf {
    for p in ["/usr/bin/prometheus", "/usr/local/bin/prometheus"] {
        if Path::new(p).is_file() {
            return PathBuf::from(p);
        }
    }
    panic!("prometheus is not installed: run scripts/setup.sh (apt-get install prometheus)");
}

/// GET `path` from `addr` (HTTP/1.0, the body to the end of the stream).
fn http_get(addr: &str, path: &str) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).map_err(|e| e.to_string())?;
    let code = buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = buf.split_once("\r\n\r\n").map_or("", |b| b.1).to_string();
    Ok((code, body))
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An instant query; the `result` array.
fn query(prom: &str, q: &str) -> Vec<serde_json::Value> {
    let (code, body) = http_get(prom, &format!("/api/v1/query?query={}", url_encode(q)))
        .unwrap_or_else(|e| panic!("querying prometheus: {e}"));
    let v: serde_json::Value =
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{q}: {e}: {body}"));
    assert_eq!(code, 200, "{q}: {body}");
    assert_eq!(v["status"], "success", "{q}: {body}");
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// Grafana's variables as the dashboard's defaults resolve them: every agent, and a rate window
/// of a few scrapes.
fn resolve(expr: &str) -> String {
    expr.replace("$__rate_interval", "10s")
        .replace("$instance", ".*")
}

fn finite(series: &serde_json::Value) -> bool {
    series["value"][1]
        .as_str()
        .and_then(|v| v.parse::<f64>().ok())
        .is_some_and(f64::is_finite)
}

#[test]
fn every_dashboard_panel_query_returns_data_from_a_real_prometheus_scraping_a_real_run() {
    let prom_bin = prometheus();
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/lockstep.json"),
        )
        .unwrap(),
    )
    .expect("the dashboard is JSON");
    let dir = scratch();
    let mut agents = Vec::new();
    let mut targets = Vec::new();
    let mut plan = String::from(
        "name = \"dashboard\"\nramp = \"2s\"\nduration = \"30s\"\ninterval = \"1s\"\n",
    );
    for n in 1..=3 {
        let vol = dir.path().join(format!("vol-{n}"));
        std::fs::create_dir_all(&vol).unwrap();
        let metrics = format!("127.0.0.1:{}", free_port());
        let (p, addr) = start_agent(&format!("agent-{n}"), &vol, &["--metrics-listen", &metrics]);
        plan += &format!("\n[[agent]]\nname = \"agent-{n}\"\naddress = \"{addr}\"\n");
        targets.push(metrics);
        agents.push(p);
    }
    plan += "\n[[role]]\nname = \"w\"\n[role.workload.fio]\nrw = \"randrw\"\nbs = \"4k\"\niodepth = 4\nsize = \"16m\"\nioengine = \"io_uring\"\ndirect = 1\n";
    // A fault open from t=3 s to the end: the fault annotation's query must find it.
    plan += "\n[[fault]]\nat = \"3s\"\ntarget = { agents = [\"agent-2\"] }\nkind = \"latency\"\nadd_us = 500\nfraction = 0.5\n";
    let coordinator = format!("127.0.0.1:{}", free_port());
    targets.push(coordinator.clone());

    let prom = format!("127.0.0.1:{}", free_port());
    let config = dir.path().join("prometheus.yml");
    let quoted: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: lockstep\n    static_configs:\n      - targets: [{}]\n",
            quoted.join(", ")
        ),
    )
    .unwrap();
    let _prometheus = Proc(
        Command::new(prom_bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={prom}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting prometheus"),
    );
    assert!(
        wait_for(Duration::from_secs(30), || http_get(&prom, "/-/ready")
            .is_ok_and(|(c, _)| c == 200)),
        "prometheus did not become ready on {prom}"
    );

    // Scraped idle first, so the agents' start shows as a change (the annotation).
    assert!(
        wait_for(Duration::from_secs(30), || {
            query(&prom, "lockstep_agent_run_state == 0").len() == 3
        }),
        "prometheus never scraped the three idle agents"
    );
    let plan_path = dir.path().join("plan.toml");
    std::fs::write(&plan_path, plan).unwrap();
    let _run = Proc(
        Command::new(bin("lockstep"))
            .arg("run")
            .arg(&plan_path)
            .arg("--output")
            .arg(dir.path().join("run"))
            .args(["--metrics-listen", &coordinator])
            .stdout(Stdio::null())
            .spawn()
            .expect("running lockstep"),
    );
    // Running, and long enough for the rate windows and the coordinator's first intervals.
    let start = Instant::now();
    assert!(
        wait_for(Duration::from_secs(60), || {
            query(&prom, "lockstep_run_state == 1").len() == 1
        }),
        "the coordinator's run never showed as running in prometheus"
    );
    std::thread::sleep(Duration::from_secs(12));
    println!("run running for {:.0} s", start.elapsed().as_secs_f64());

    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "{} panels", panels.len());
    let mut empty = Vec::new();
    for p in panels {
        let title = p["title"].as_str().unwrap_or("?");
        for t in p["targets"].as_array().expect("targets") {
            let expr = resolve(t["expr"].as_str().expect("expr"));
            let result = query(&prom, &expr);
            let with_data = result.iter().filter(|s| finite(s)).count();
            println!(
                "[{title}] {expr}\n    -> {} series, {with_data} with a finite value",
                result.len()
            );
            if with_data == 0 {
                empty.push(format!("{title}: {expr}"));
            }
        }
    }
    for a in dashboard["annotations"]["list"]
        .as_array()
        .expect("annotations")
    {
        let expr = resolve(a["expr"].as_str().expect("expr"));
        let n = query(&prom, &expr).len();
        println!(
            "[annotation {}] {expr}\n    -> {n} series",
            a["name"].as_str().unwrap_or("?")
        );
    }
    assert!(empty.is_empty(), "queries without data: {empty:#?}");
    // The agents went from idle to running during the scrape: the annotation shows it.
    let agent_changes = query(&prom, "changes(lockstep_agent_run_state[1m]) > 0");
    assert_eq!(agent_changes.len(), 3, "{agent_changes:?}");
    // The fault on agent-2's volume is open: its annotation's series is there.
    let faults = query(&prom, "lockstep_fault_active == 1");
    assert_eq!(faults.len(), 1, "{faults:?}");
}
