//! Safe on a production host: whatever stops a coordinator (SIGKILL, SIGTERM, Ctrl-C), during
//! the layout or the run, its local agents go with it and leave no process, no listening port
//! and no file behind; SIGTERM keeps the partial results and says so in the exit code; a lost
//! agent fails the objectives that cover it; an abort is prompt at any clone count.
//!
//! Timing bounds are safety properties (generous, well above what a run measures); every
//! figure a test asserts is printed.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lockstep_tests::{
    Proc, RunStatus, bin, output_text, read_results, run_plan, scratch, serial, start_agent,
    wait_for,
};

/// The pids of live `lockstep-agent` processes whose command line mentions `dir` (local agents
/// get their volume directory under the run's output directory).
fn agent_pids_under(dir: &Path) -> Vec<i32> {
    let agent = bin("lockstep-agent");
    let needle = dir.to_string_lossy().into_owned();
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        // A zombie has an empty command line: it holds no port and does no IO.
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmd
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.first().is_some_and(|a| Path::new(a) == agent)
            && args.iter().any(|a| a.contains(&needle))
        {
            pids.push(pid);
        }
    }
    pids
}

/// TCP ports process `pid` listens on (its socket inodes matched against /proc/net/tcp).
fn listening_ports(pid: i32) -> Vec<u16> {
    let mut inodes = std::collections::HashSet::new();
    if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                let t = target.to_string_lossy();
                if let Some(n) = t.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
                    inodes.insert(n.to_string());
                }
            }
        }
    }
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // st 0A is LISTEN; field 9 is the inode.
            (f.len() > 9 && f[3] == "0A" && inodes.contains(f[9]))
                .then(|| f[1].rsplit(':').next())
                .flatten()
                .and_then(|p| u16::from_str_radix(p, 16).ok())
        })
        .collect()
}

fn refuses(port: u16) -> bool {
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err()
}

/// Regular files left under `dir`, with their sizes.
fn files_under(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                todo.push(e.path());
            } else {
                out.push((e.path(), m.len()));
            }
        }
    }
    out
}

/// Kills (SIGKILL) every agent still running under `dir` when a test ends, so that a failing
/// test does not leave laying-out orphans behind for the next one.
struct Reaper(PathBuf);

/// A test's set-up: alone (these runs lay out gigabytes and start thousands of threads), in a
/// scratch directory, every agent started under it killed when the test ends. Bind all three
/// (`let (_g, dir, _reaper) = isolated();`): they drop in reverse, agents first.
fn isolated() -> (
    std::sync::MutexGuard<'static, ()>,
    tempfile::TempDir,
    Reaper,
) {
    let guard = serial();
    let dir = scratch();
    let reaper = Reaper(dir.path().to_path_buf());
    (guard, dir, reaper)
}

impl Drop for Reaper {
    fn drop(&mut self) {
        for pid in agent_pids_under(&self.0) {
            // SAFETY: a plain kill(2) of a process this test started (through lockstep).
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// `spawn_local`, with the coordinator's standard error copied to ours and kept (for waiting
/// on a message).
fn spawn_local_watched(
    dir: &Path,
    plan: &str,
    n: usize,
) -> (Proc, PathBuf, std::sync::Arc<Mutex<String>>) {
    use std::io::BufRead;
    let p = dir.join("plan.toml");
    std::fs::write(&p, plan).unwrap();
    let out = dir.join("run");
    let mut child = Command::new(bin("lockstep"))
        .args(["run", "--local", &n.to_string()])
        .arg(&p)
        .arg("--output")
        .arg(&out)
        .env("LOCKSTEP_AGENT_BIN", bin("lockstep-agent"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running lockstep");
    let said = std::sync::Arc::new(Mutex::new(String::new()));
    let (err, keep) = (child.stderr.take().unwrap(), said.clone());
    let t0 = Instant::now();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("[{:7.3} s] {line}", t0.elapsed().as_secs_f64());
            let mut k = keep.lock().unwrap();
            k.push_str(&line);
            k.push('\n');
        }
    });
    (Proc(child), out, said)
}

/// `lockstep run --local N plan --output dir/run`, not waited for.
fn spawn_local(dir: &Path, plan: &str, n: usize) -> (Proc, PathBuf) {
    let p = dir.join("plan.toml");
    std::fs::write(&p, plan).unwrap();
    let out = dir.join("run");
    let child = Command::new(bin("lockstep"))
        .args(["run", "--local", &n.to_string()])
        .arg(&p)
        .arg("--output")
        .arg(&out)
        .env("LOCKSTEP_AGENT_BIN", bin("lockstep-agent"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("running lockstep");
    (Proc(child), out)
}

/// A read workload over one big file per agent: laying it out (filling it with data) takes
/// seconds, so a signal can arrive mid-layout.
fn big_layout_plan(size: &str, duration: &str) -> String {
    format!(
        r#"
name = "lifetime"
duration = "{duration}"
interval = "1s"

[[role]]
name = "w"
[role.workload.fio]
rw = "randread"
bs = "4k"
iodepth = 2
size = "{size}"
"#
    )
}

/// Waits until the local agents have started laying out (a file exists and is still short).
fn wait_mid_layout(out: &Path, full: u64) {
    let vols = out.join("volumes");
    assert!(
        wait_for(Duration::from_secs(20), || {
            let f = files_under(&vols);
            !f.is_empty() && f.iter().all(|(_, len)| *len > 0)
        }),
        "the agents never began laying out under {}",
        vols.display()
    );
    std::thread::sleep(Duration::from_millis(700));
    let f = files_under(&vols);
    assert!(
        f.iter().any(|(_, len)| *len < full),
        "layout finished before the signal; the test needs a bigger size: {f:?}"
    );
}

/// Waits until the local agents run IO: every volume has its file, then a few intervals pass.
fn wait_mid_run(out: &Path, agents: usize) {
    let vols = out.join("volumes");
    assert!(
        wait_for(Duration::from_secs(20), || files_under(&vols).len()
            >= agents),
        "the agents never started under {}",
        vols.display()
    );
    std::thread::sleep(Duration::from_secs(3));
}

/// The agents under `dir` and the ports they listen on, before the coordinator is stopped.
fn agents_and_ports(dir: &Path, want: usize) -> Vec<(i32, Vec<u16>)> {
    let pids = agent_pids_under(dir);
    assert_eq!(pids.len(), want, "local agents found: {pids:?}");
    let all: Vec<_> = pids.into_iter().map(|p| (p, listening_ports(p))).collect();
    assert!(
        all.iter().all(|(_, ports)| !ports.is_empty()),
        "every agent listens: {all:?}"
    );
    all
}

/// Within 5 s of the coordinator's end: no agent process under `dir`, every port it had
/// refuses connections, and (unless `files_may_stay`) no file left in the volumes.
fn assert_nothing_left(dir: &Path, before: &[(i32, Vec<u16>)], died: Instant, what: &str) {
    let gone = wait_for(Duration::from_secs(5), || agent_pids_under(dir).is_empty());
    let took = died.elapsed();
    let left = agent_pids_under(dir);
    println!(
        "{what}: agents left {left:?}, {:.1} s after the coordinator ended",
        took.as_secs_f64()
    );
    assert!(
        gone,
        "{what}: agents {left:?} outlived their coordinator by 5 s"
    );
    for (pid, ports) in before {
        for &port in ports {
            assert!(
                refuses(port),
                "{what}: port {port} of agent {pid} still accepts connections"
            );
        }
    }
    let files = files_under(&dir.join("run").join("volumes"));
    assert!(files.is_empty(), "{what}: files left behind: {files:?}");
}

fn sigkill_coordinator(mid_layout: bool) {
    let (_g, dir, _reaper) = isolated();
    let plan = big_layout_plan(if mid_layout { "6g" } else { "16m" }, "60s");
    let (mut run, out) = spawn_local(dir.path(), &plan, 2);
    if mid_layout {
        wait_mid_layout(&out, 6 << 30);
    } else {
        wait_mid_run(&out, 2);
    }
    let before = agents_and_ports(dir.path(), 2);
    run.signal(libc::SIGKILL);
    let _ = run.0.wait();
    let died = Instant::now();
    let what = if mid_layout {
        "SIGKILL mid-layout"
    } else {
        "SIGKILL mid-run"
    };
    assert_nothing_left(dir.path(), &before, died, what);
}

#[test]
fn sigkill_to_the_coordinator_mid_run_leaves_no_local_agent() {
    sigkill_coordinator(false);
}

#[test]
fn sigkill_to_the_coordinator_mid_layout_leaves_no_local_agent() {
    sigkill_coordinator(true);
}

/// SIGTERM is a stop like Ctrl-C: every agent aborts, results so far are written (status
/// aborted), and the exit code says SIGTERM (143), within 5 s, with nothing left behind.
fn sigterm_coordinator(mid_layout: bool) {
    let (_g, dir, _reaper) = isolated();
    let plan = big_layout_plan(if mid_layout { "6g" } else { "16m" }, "60s");
    let (mut run, out) = spawn_local(dir.path(), &plan, 2);
    if mid_layout {
        wait_mid_layout(&out, 6 << 30);
    } else {
        wait_mid_run(&out, 2);
    }
    let before = agents_and_ports(dir.path(), 2);
    let t = Instant::now();
    run.signal(libc::SIGTERM);
    let ended = wait_for(Duration::from_secs(10), || {
        run.0.try_wait().ok().flatten().is_some()
    });
    let took = t.elapsed();
    let what = if mid_layout {
        "SIGTERM mid-layout"
    } else {
        "SIGTERM mid-run"
    };
    println!(
        "{what}: the coordinator ended {:.1} s after SIGTERM",
        took.as_secs_f64()
    );
    assert!(
        ended,
        "{what}: the coordinator was still running 10 s after SIGTERM"
    );
    let status = run.0.wait().unwrap();
    assert_eq!(status.code(), Some(143), "{what}: {status}");
    assert!(took < Duration::from_secs(5), "{what}: took {took:?}");
    let r = read_results(&out);
    assert_eq!(r.status, RunStatus::Aborted, "{what}");
    assert!(
        r.status_reason.contains("SIGTERM"),
        "{what}: {}",
        r.status_reason
    );
    if !mid_layout {
        let ios: u64 = r.volumes.iter().map(|v| v.summary.read.ios).sum();
        assert!(ios > 0, "{what}: the partial results hold the IOs done");
    }
    assert_nothing_left(dir.path(), &before, Instant::now(), what);
}

#[test]
fn sigterm_to_the_coordinator_mid_run_keeps_partial_results_and_exits_143() {
    sigterm_coordinator(false);
}

#[test]
fn sigterm_to_the_coordinator_mid_layout_exits_143_and_leaves_nothing() {
    sigterm_coordinator(true);
}

/// A daemon agent (not a local child) honours SIGTERM mid-layout: it stops laying out, removes
/// what it created and exits, within 5 s.
#[test]
fn sigterm_to_a_daemon_agent_mid_layout_stops_it_and_removes_its_files() {
    let (_g, dir, _reaper) = isolated();
    let vol = dir.path().join("v1");
    std::fs::create_dir_all(&vol).unwrap();
    let (mut agent, addr) = start_agent("a1", &vol, &[]);
    let p = dir.path().join("plan.toml");
    let plan = big_layout_plan("6g", "60s")
        + &format!("\n[[agent]]\nname = \"a1\"\naddress = \"{addr}\"\n");
    std::fs::write(&p, plan).unwrap();
    let _run = lockstep_tests::spawn_run(&p, &dir.path().join("run"));
    assert!(wait_for(Duration::from_secs(20), || !files_under(&vol).is_empty()));
    std::thread::sleep(Duration::from_millis(700));
    let t = Instant::now();
    agent.signal(libc::SIGTERM);
    let ended = wait_for(Duration::from_secs(10), || {
        agent.0.try_wait().ok().flatten().is_some()
    });
    println!(
        "SIGTERM to an agent mid-layout: ended {ended} after {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert!(
        ended,
        "the agent ignored SIGTERM during the layout for 10 s"
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let files = files_under(&vol);
    assert!(files.is_empty(), "files left behind: {files:?}");
}

/// `lockstep-agent run JOBFILE` (standalone, like fio) honours SIGTERM during the layout: it
/// stops laying out, removes what it created and exits as interrupted (1), within 5 s.
#[test]
fn sigterm_to_a_standalone_run_mid_layout_stops_it_and_removes_its_files() {
    let _g = serial();
    let dir = scratch();
    let vol = dir.path().join("v1");
    std::fs::create_dir_all(&vol).unwrap();
    let job = dir.path().join("big.fio");
    std::fs::write(
        &job,
        format!(
            "[big]\nrw=randread\nbs=4k\nsize=6g\nruntime=30s\ntime_based=1\ndirectory={}\n",
            vol.display()
        ),
    )
    .unwrap();
    let mut run = Proc(
        Command::new(bin("lockstep-agent"))
            .arg("run")
            .arg(&job)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(Duration::from_secs(20), || !files_under(&vol).is_empty()));
    std::thread::sleep(Duration::from_millis(700));
    let f = files_under(&vol);
    assert!(
        f.iter().any(|(_, len)| *len < 6 << 30),
        "layout already done: {f:?}"
    );
    let t = Instant::now();
    run.signal(libc::SIGTERM);
    let ended = wait_for(Duration::from_secs(30), || {
        run.0.try_wait().ok().flatten().is_some()
    });
    let took = t.elapsed();
    println!(
        "SIGTERM to a standalone run mid-layout: ended {ended} after {:.1} s",
        took.as_secs_f64()
    );
    assert!(ended, "still laying out 30 s after SIGTERM");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(run.0.wait().unwrap().code(), Some(1));
    let files = files_under(&vol);
    assert!(files.is_empty(), "files left behind: {files:?}");
}

/// One agent of three killed mid-run under "p99 < 50ms on every volume": the objective must
/// fail on that agent's volume with the reason, and the run must exit non-zero (1).
#[test]
fn a_lost_agent_fails_the_objectives_that_cover_it() {
    let (_g, dir, _reaper) = isolated();
    let plan = r#"
name = "gate"
duration = "6s"
interval = "1s"

[[role]]
name = "w"
[role.workload.fio]
rw = "randread"
bs = "4k"
iodepth = 2
size = "8m"

[[objective]]
metric = "p99"
below = "50ms"
scope = "volume"

[[fault]]
at = "2500ms"
target = { agents = ["agent-3"] }
kind = "kill"
"#;
    let (o, out) = run_plan(dir.path(), plan, Some(3), &[]);
    let all = output_text(&o);
    let r = read_results(&out);
    assert_eq!(r.status, RunStatus::Partial, "{all}");
    let obj = &r.objectives[0];
    println!("objective: {obj:?}; exit {:?}", o.status.code());
    assert!(!obj.passed, "{all}");
    let failures: Vec<&str> = obj.failures.iter().map(String::as_str).collect();
    assert!(
        failures
            .iter()
            .any(|f| f.contains("agent-3") && f.contains("lost") && f.contains("no data after")),
        "{failures:?}"
    );
    // The volumes of the agents that finished are judged on their figures, not failed.
    assert!(
        failures.iter().all(|f| f.contains("agent-3")),
        "{failures:?}"
    );
    assert_eq!(o.status.code(), Some(1), "{all}");
    let text = std::fs::read_to_string(out.join("report.txt")).unwrap();
    assert!(text.contains("agent-3"), "{text}");
}

fn metric_value(text: &str, name: &str) -> Vec<f64> {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect()
}

fn get_metrics(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(addr).expect("connecting to the metrics port");
    write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

/// After a run ends, the agent's `/metrics` no longer shows IOs in flight.
#[test]
fn outstanding_ios_is_zero_after_a_run() {
    let _g = serial();
    let dir = scratch();
    let vol = dir.path().join("v1");
    std::fs::create_dir_all(&vol).unwrap();
    let metrics_port = lockstep_tests::free_port();
    let maddr = format!("127.0.0.1:{metrics_port}");
    let (_agent, addr) = start_agent("a1", &vol, &["--metrics-listen", &maddr]);
    let plan = r#"
name = "metrics"
duration = "3s"
interval = "1s"

[[role]]
name = "w"
[role.workload.fio]
rw = "randread"
bs = "4k"
iodepth = 8
size = "8m"
"#
    .to_string()
        + &format!("\n[[agent]]\nname = \"a1\"\naddress = \"{addr}\"\n");
    let (o, _out) = run_plan(dir.path(), &plan, None, &[]);
    assert!(o.status.success(), "{}", output_text(&o));
    let text = get_metrics(&maddr);
    let state = metric_value(&text, "lockstep_agent_run_state");
    let outstanding = metric_value(&text, "lockstep_agent_volume_outstanding_ios");
    println!("after the run: run_state {state:?}, outstanding_ios {outstanding:?}");
    assert_eq!(state, vec![0.0], "{text}");
    assert!(!outstanding.is_empty(), "the gauge is exported: {text}");
    assert!(outstanding.iter().all(|&v| v == 0.0), "{text}");
}

/// Aborting a run of 2 agents x 2,000 clones (numjobs=2000) ends within 5 s of the signal.
#[test]
fn aborting_a_many_clone_run_is_prompt() {
    let (_g, dir, _reaper) = isolated();
    let plan = r#"
name = "clones"
duration = "60s"
interval = "1s"

[[role]]
name = "w"
[role.workload.fio]
rw = "randread"
bs = "4k"
iodepth = 1
size = "64k"
numjobs = 2000
"#;
    let (mut run, out, said) = spawn_local_watched(dir.path(), plan, 2);
    // Laying out 4,000 files with an fsync each takes from seconds to minutes.
    assert!(
        wait_for(Duration::from_secs(300), || said
            .lock()
            .unwrap()
            .contains("run: started")),
        "the run never started"
    );
    std::thread::sleep(Duration::from_secs(4));
    let t = Instant::now();
    eprintln!("SIGINT sent");
    run.signal(libc::SIGINT);
    // The abort is done when the results are written and no agent is left doing IO. Removing
    // the 4,000 files after that goes at the disk's pace (on a disk busy with other work, 4,000
    // unlinks took 10 s), so the exit has a bound of its own.
    let aborted = wait_for(Duration::from_secs(60), || {
        out.join("results.json").exists() && agent_pids_under(dir.path()).is_empty()
    });
    let took = t.elapsed();
    let ended = wait_for(Duration::from_secs(120), || {
        run.0.try_wait().ok().flatten().is_some()
    });
    let exited = t.elapsed();
    println!(
        "abort of 2 x 2000 clones: results written and agents gone {:.1} s after SIGINT, the \
         coordinator exited after {:.1} s",
        took.as_secs_f64(),
        exited.as_secs_f64()
    );
    assert!(
        aborted,
        "no results or agents still running 60 s after SIGINT"
    );
    assert!(took < Duration::from_secs(5), "the abort took {took:?}");
    assert!(ended, "still running 120 s after SIGINT");
    assert_eq!(run.0.wait().unwrap().code(), Some(130));
    let r = read_results(&out);
    assert_eq!(r.status, RunStatus::Aborted);
}
