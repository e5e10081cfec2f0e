//! Helpers for lockstep's end-to-end tests (in `tests/`): the built binaries, scratch
//! directories on a real disk (O_DIRECT does not work on tmpfs), and child processes that are
//! killed when a test ends, pass or fail.

pub mod docker;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub use lockstep::results::timeline::Timeline;
pub use lockstep::results::{AgentResult, AgentState, RunResults, RunStatus, VolumeResult};

/// The workspace's target directory (where `cargo build` put the binaries).
pub fn target_dir() -> PathBuf {
    if let Ok(t) = std::env::var("CARGO_TARGET_DIR") {
        return PathBuf::from(t);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target")
}

/// A binary of the workspace: the same profile as the tests first, then the other one.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    if let Some(profile_dir) = exe.parent().and_then(Path::parent) {
        let p = profile_dir.join(name);
        if p.is_file() {
            return p;
        }
    }
    for profile in ["debug", "release"] {
        let p = target_dir().join(profile).join(name);
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "{name} is not built: run `cargo build --workspace --bins` first (the README's test command does)"
    );
}

/// A scratch directory on the disk the repository is on (never tmpfs).
pub fn scratch() -> tempfile::TempDir {
    let base = target_dir().join("e2e-scratch");
    std::fs::create_dir_all(&base).expect("creating the scratch base");
    tempfile::Builder::new()
        .prefix("t-")
        .tempdir_in(base)
        .expect("scratch dir")
}

/// Writes `plan` to `dir/plan.toml` and runs `lockstep run [--local N] [extra] PLAN --output
/// dir/run` to the end; returns the process output and the results directory.
pub fn run_plan(
    dir: &Path,
    plan: &str,
    local: Option<usize>,
    extra: &[&str],
) -> (std::process::Output, PathBuf) {
    let p = dir.join("plan.toml");
    std::fs::write(&p, plan).expect("writing the plan");
    let out = dir.join("run");
    let mut cmd = Command::new(bin("lockstep"));
    cmd.arg("run");
    if let Some(n) = local {
        cmd.args(["--local", &n.to_string()]);
    }
    let o = cmd
        .args(extra)
        .arg(&p)
        .arg("--output")
        .arg(&out)
        .env("LOCKSTEP_AGENT_BIN", bin("lockstep-agent"))
        .stdin(Stdio::null())
        .output()
        .expect("running lockstep");
    (o, out)
}

/// Starts `lockstep run PLAN --output OUT` against the agents the plan names, without waiting
/// for it (for tests that act on agents mid-run); killed if dropped before it ends.
pub fn spawn_run(plan: &Path, out: &Path) -> Proc {
    Proc(
        Command::new(bin("lockstep"))
            .arg("run")
            .arg(plan)
            .arg("--output")
            .arg(out)
            .stdout(Stdio::null())
            .spawn()
            .expect("running lockstep"),
    )
}

/// A process's stdout then stderr, for assertion messages.
pub fn output_text(o: &std::process::Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A child process killed on drop.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    pub fn pid(&self) -> i32 {
        self.0.id() as i32
    }
    pub fn signal(&self, sig: i32) {
        // SAFETY: sending a signal to our own child.
        unsafe {
            libc::kill(self.pid(), sig);
        }
    }
}

/// Starts `lockstep-agent serve` on 127.0.0.1:0 with one volume `data` at `dir`; returns the
/// process and its address.
pub fn start_agent(name: &str, dir: &Path, extra: &[&str]) -> (Proc, String) {
    let mut child = Command::new(bin("lockstep-agent"))
        .args(["serve", "--listen", "127.0.0.1:0", "--name", name])
        .arg("--volume")
        .arg(format!("data={}", dir.display()))
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawning lockstep-agent");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line)
        .expect("reading the agent's address");
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected agent output: {line}"))
        .to_string();
    std::thread::spawn(move || {
        let mut sink = String::new();
        while out.read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {
            sink.clear();
        }
    });
    (Proc(child), addr)
}

/// Runs the tests of one test binary one at a time: hold the guard for the whole test. The
/// machine has 2 cores; tests that assert timing (rates, when a model runs out of credits,
/// how fast an abort is) or lay out gigabytes would time each other out in parallel. A test
/// that panicked while holding it does not stop the others.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Waits for `f` to hold, polling, up to `limit`.
pub fn wait_for(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t = std::time::Instant::now();
    while t.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    f()
}

pub fn read_json(path: &Path) -> serde_json::Value {
    read_typed(path)
}

/// A JSON file read into the type that wrote it; a file that does not fit the type fails the
/// test, so a field renamed on one side is caught.
pub fn read_typed<T: serde::de::DeserializeOwned>(path: &Path) -> T {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A run directory's `results.json`, in the coordinator's typed model.
pub fn read_results(run_dir: &Path) -> RunResults {
    read_typed(&run_dir.join("results.json"))
}

/// A run directory's `timeline.json` (per volume and interval).
pub fn read_timeline(run_dir: &Path) -> Timeline {
    read_typed(&run_dir.join("timeline.json"))
}

/// The result of agent `name` in `r`.
pub fn agent<'a>(r: &'a RunResults, name: &str) -> &'a AgentResult {
    r.agents
        .iter()
        .find(|a| a.name == name)
        .unwrap_or_else(|| panic!("no agent {name} in {:?}", r.agents))
}

/// The result of volume `volume` of agent `node` in `r`.
pub fn volume<'a>(r: &'a RunResults, node: &str, volume: &str) -> &'a VolumeResult {
    r.volumes
        .iter()
        .find(|v| v.node == node && v.volume == volume)
        .unwrap_or_else(|| panic!("no volume {node}/{volume} in {:?}", r.volumes))
}

/// A free TCP port on 127.0.0.1 (bound, then released: for servers such as etcd that need a
/// fixed port on their command line).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("binding 127.0.0.1:0")
        .local_addr()
        .unwrap()
        .port()
}

/// A real etcd server (Debian's etcd-server) on free loopback ports, in a scratch data
/// directory; killed on drop. Panics with what to install when etcd is missing: CI installs
/// it (scripts/setup.sh), so a missing etcd is a failure, never a silent pass.
pub struct Etcd {
    pub url: String,
    _proc: Proc,
    _dir: tempfile::TempDir,
}

impl Etcd {
    pub fn start() -> Etcd {
        let found = Command::new("etcd")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        assert!(
            found.is_ok_and(|s| s.success()),
            "etcd is not installed: run scripts/setup.sh (apt-get install etcd-server etcd-client)"
        );
        let dir = scratch();
        // Two free ports picked up front can still be taken by someone else before etcd binds
        // them: try a few times.
        for _ in 0..5 {
            let (client, peer) = (free_port(), free_port());
            let url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let data = dir.path().join(format!("data-{client}"));
            let log = std::fs::File::create(dir.path().join(format!("etcd-{client}.log"))).unwrap();
            let child = Command::new("etcd")
                .arg("--data-dir")
                .arg(&data)
                .args([
                    "--name",
                    "test",
                    "--listen-client-urls",
                    &url,
                    "--advertise-client-urls",
                    &url,
                ])
                .args([
                    "--listen-peer-urls",
                    &peer_url,
                    "--initial-advertise-peer-urls",
                    &peer_url,
                ])
                .args(["--initial-cluster", &format!("test={peer_url}")])
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("spawning etcd");
            let mut p = Proc(child);
            let up = wait_for(Duration::from_secs(15), || {
                if p.0.try_wait().ok().flatten().is_some() {
                    return true;
                }
                Command::new("etcdctl")
                    .args(["--endpoints", &url, "endpoint", "health"])
                    .env("ETCDCTL_API", "3")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            });
            if up && p.0.try_wait().ok().flatten().is_none() {
                return Etcd {
                    url,
                    _proc: p,
                    _dir: dir,
                };
            }
            let _ = p.0.kill();
        }
        panic!(
            "etcd did not start: see the etcd-*.log files under {}",
            dir.path().display()
        );
    }
}
