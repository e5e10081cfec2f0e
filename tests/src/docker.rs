//! A multi-host test cluster in Docker: etcd and N agents, each a container with its own
//! address on a network of its own, built from our binaries (no registry, no base image).
//!
//! Plain `docker` CLI calls rather than testcontainers: testcontainers 0.28 drives the engine
//! through bollard at API version 1.53 without negotiating, and the Debian engine here (20.10)
//! answers "client version 1.53 is too new. Maximum supported API version is 1.41" to every
//! call. The CLI negotiates by itself, covers kill/pause/network disconnect/cp, and adds no
//! dependency to build.
//!
//! Every container and network carries the label `lockstep-test=<pid>`; a cluster removes its
//! own on drop, and the next test run removes those of test processes that are gone.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::{bin, scratch, wait_for};

/// Runs `docker ARGS`, returning stdout; panics with docker's stderr on failure.
pub fn docker(args: &[&str]) -> String {
    try_docker(args).unwrap_or_else(|e| panic!("docker {}: {e}", args.join(" ")))
}

pub fn try_docker(args: &[&str]) -> Result<String, String> {
    let o = Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&o.stderr).trim().to_string())
    }
}

/// The Docker engine, or a clear failure: CI installs and starts it (scripts/setup.sh --docker).
pub fn require_docker() {
    let ok = Command::new("docker")
        .arg("info")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "the Docker engine is not running: run scripts/setup.sh --docker (the README's test command does)"
    );
}

pub const AGENT_IMAGE: &str = "lockstep:test";
pub const ETCD_IMAGE: &str = "lockstep-etcd:test";

/// Builds the agent image (from the binaries the tests use) and the etcd image, once per test
/// process.
pub fn images() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        require_docker();
        let build = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/container/build.sh");
        let bin_dir = bin("lockstep-agent").parent().unwrap().to_path_buf();
        for args in [
            vec![
                "lockstep".to_string(),
                "--bin-dir".into(),
                bin_dir.display().to_string(),
                "--tag".into(),
                AGENT_IMAGE.into(),
            ],
            vec!["etcd".to_string(), "--tag".into(), ETCD_IMAGE.into()],
        ] {
            let o = Command::new(&build)
                .args(&args)
                .output()
                .expect("running deploy/container/build.sh");
            assert!(
                o.status.success(),
                "build.sh {}: {}",
                args[0],
                String::from_utf8_lossy(&o.stderr)
            );
        }
        remove_leftovers();
    });
}

/// Containers and networks of earlier test processes that died without cleaning up.
fn remove_leftovers() {
    let alive = |pid: &str| {
        pid.parse::<i32>()
            .is_ok_and(|p| Path::new(&format!("/proc/{p}")).exists())
    };
    let list = try_docker(&[
        "ps",
        "-a",
        "--filter",
        "label=lockstep-test",
        "--format",
        "{{.ID}} {{.Label \"lockstep-test\"}}",
    ])
    .unwrap_or_default();
    for line in list.lines() {
        if let Some((id, pid)) = line.split_once(' ') {
            if !alive(pid) {
                let _ = try_docker(&["rm", "-f", id]);
            }
        }
    }
    let nets = try_docker(&[
        "network",
        "ls",
        "--filter",
        "label=lockstep-test",
        "--format",
        "{{.ID}} {{.Label \"lockstep-test\"}}",
    ])
    .unwrap_or_default();
    for line in nets.lines() {
        if let Some((id, pid)) = line.split_once(' ') {
            if !alive(pid) {
                let _ = try_docker(&["network", "rm", id]);
            }
        }
    }
}

pub struct AgentContainer {
    pub name: String,
    pub container: String,
    pub ip: String,
    /// The host directory mounted at /volumes/data.
    pub dir: PathBuf,
}

/// etcd and `n` agents on a network of their own; the test process (the coordinator) reaches
/// them at their container addresses, as it would real hosts.
pub struct Cluster {
    pub network: String,
    /// The network's first three octets ("172.30.x").
    pub subnet: String,
    label: String,
    prefix: String,
    pub etcd_url: String,
    pub agents: Vec<AgentContainer>,
    containers: Vec<String>,
    pub scratch: tempfile::TempDir,
}

impl Cluster {
    /// Starts the cluster and waits until every agent is registered in etcd. `agent_args` go
    /// to every `lockstep-agent serve`.
    pub fn start(n: usize, agent_args: &[&str]) -> Cluster {
        images();
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let pid = std::process::id();
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let prefix = format!("lockstep-test-{pid}-{seq}");
        let label = format!("lockstep-test={pid}");
        // A /24 of our own, so that every container can be given its address up front (the
        // agent advertises it in etcd; a FROM-scratch image has no shell to look it up).
        let mut subnet = None;
        for k in 0..64u32 {
            let third = (pid + seq * 7 + k) % 200 + 20;
            let net = format!("172.30.{third}");
            let r = try_docker(&[
                "network",
                "create",
                "--label",
                &label,
                "--subnet",
                &format!("{net}.0/24"),
                &format!("{prefix}-net"),
            ]);
            match r {
                Ok(_) => {
                    subnet = Some(net);
                    break;
                }
                Err(e) if e.contains("overlap") => continue,
                Err(e) => panic!("docker network create: {e}"),
            }
        }
        let net = subnet.expect("no free 172.30.x.0/24 for a test network");
        let mut cluster = Cluster {
            network: format!("{prefix}-net"),
            subnet: net.clone(),
            label: label.clone(),
            prefix: prefix.clone(),
            etcd_url: format!("http://{net}.2:2379"),
            agents: Vec::new(),
            containers: Vec::new(),
            scratch: scratch(),
        };
        let etcd = format!("{prefix}-etcd");
        docker(&[
            "run",
            "-d",
            "--name",
            &etcd,
            "--label",
            &label,
            "--network",
            &cluster.network,
            "--ip",
            &format!("{net}.2"),
            ETCD_IMAGE,
            "--name",
            "etcd",
            "--data-dir",
            "/var/lib/etcd",
            "--listen-client-urls",
            "http://0.0.0.0:2379",
            "--advertise-client-urls",
            &cluster.etcd_url,
        ]);
        cluster.containers.push(etcd);
        for i in 1..=n {
            let name = format!("agent-{i}");
            let container = format!("{prefix}-{name}");
            let ip = format!("{net}.{}", 10 + i);
            let dir = cluster.scratch.path().join(&name);
            std::fs::create_dir_all(&dir).unwrap();
            let mount = format!("{}:/volumes/data", dir.display());
            let advertise = format!("{ip}:7070");
            let mut args = vec![
                "run",
                "-d",
                "--name",
                &container,
                "--label",
                &label,
                "--network",
                &cluster.network,
                "--ip",
                &ip,
                "-v",
                &mount,
                AGENT_IMAGE,
                "serve",
                "--listen",
                "0.0.0.0:7070",
                "--metrics-listen",
                "0.0.0.0:9100",
                "--name",
                &name,
                "--volume",
                "data=/volumes/data",
                "--label",
                "role=worker",
                "--etcd",
                &cluster.etcd_url,
                "--advertise",
                &advertise,
            ];
            let node = format!("node={name}");
            args.extend(["--label", &node]);
            args.extend(agent_args);
            docker(&args);
            cluster.containers.push(container.clone());
            cluster.agents.push(AgentContainer {
                name,
                container,
                ip,
                dir,
            });
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let eps = vec![cluster.etcd_url.clone()];
        let all = wait_for(Duration::from_secs(30), || {
            rt.block_on(lockstep::orchestrate::registry::list(&eps, "/lockstep"))
                .is_ok_and(|l| l.len() == n)
        });
        assert!(
            all,
            "not every agent registered in etcd; logs:\n{}",
            cluster.all_logs()
        );
        cluster
    }

    /// Starts `lockstep coordinator` in a container of the image (at .3, .4, ... by `index`),
    /// with `runs` mounted at /runs as storage shared by every coordinator; returns the
    /// container's name.
    pub fn start_coordinator(&mut self, name: &str, index: u8, runs: &Path) -> String {
        let container = format!("{}-{name}", self.prefix);
        let ip = format!("{}.{}", self.subnet, 2 + index);
        let mount = format!("{}:/runs", runs.display());
        docker(&[
            "run",
            "-d",
            "--name",
            &container,
            "--label",
            &self.label,
            "--network",
            &self.network,
            "--ip",
            &ip,
            "-v",
            &mount,
            "--entrypoint",
            "/usr/local/bin/lockstep",
            AGENT_IMAGE,
            "coordinator",
            "--etcd",
            &self.etcd_url,
            "--name",
            name,
            "--runs-dir",
            "/runs",
            "--leader-ttl",
            "2s",
        ]);
        self.containers.push(container.clone());
        container
    }

    pub fn agent(&self, name: &str) -> &AgentContainer {
        self.agents
            .iter()
            .find(|a| a.name == name)
            .unwrap_or_else(|| panic!("no agent {name}"))
    }

    /// Names of the agents currently in the registry.
    pub fn registered(&self) -> Vec<String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(lockstep::orchestrate::registry::list(
            &[self.etcd_url.clone()],
            "/lockstep",
        ))
        .map(|l| l.into_iter().map(|a| a.registration.name).collect())
        .unwrap_or_default()
    }

    pub fn kill(&self, name: &str) {
        docker(&["kill", &self.agent(name).container]);
    }
    pub fn pause(&self, name: &str) {
        docker(&["pause", &self.agent(name).container]);
    }
    pub fn unpause(&self, name: &str) {
        docker(&["unpause", &self.agent(name).container]);
    }
    /// Cuts the agent off: its only network interface goes away (loopback stays).
    pub fn disconnect(&self, name: &str) {
        docker(&[
            "network",
            "disconnect",
            &self.network,
            &self.agent(name).container,
        ]);
    }

    /// Puts a cut-off agent back on the network, at its old address.
    pub fn reconnect(&self, name: &str) {
        let a = self.agent(name);
        docker(&[
            "network",
            "connect",
            "--ip",
            &a.ip,
            &self.network,
            &a.container,
        ]);
    }

    pub fn logs(&self, name: &str) -> String {
        let o = Command::new("docker")
            .args(["logs", &self.agent(name).container])
            .output()
            .unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    }

    fn all_logs(&self) -> String {
        self.containers
            .iter()
            .map(|c| {
                let o = Command::new("docker")
                    .args(["logs", "--tail", "20", c])
                    .output();
                let text = o
                    .map(|o| {
                        format!(
                            "{}{}",
                            String::from_utf8_lossy(&o.stdout),
                            String::from_utf8_lossy(&o.stderr)
                        )
                    })
                    .unwrap_or_default();
                format!("--- {c}\n{text}")
            })
            .collect()
    }

    /// The files in the agent's volume as the container sees them (`docker cp` of the
    /// directory, listed from its tar stream): works whether or not the container is on a
    /// network.
    pub fn volume_files(&self, name: &str) -> Vec<String> {
        let c = &self.agent(name).container;
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("docker cp {c}:/volumes/data - | tar -t"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "docker cp: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.trim_start_matches("data/").to_string())
            .filter(|l| !l.is_empty())
            .collect()
    }

    /// The agent's `lockstep_agent_run_state` (0 idle, 1 prepared, 2 running), read from
    /// inside the container's network namespace (at 127.0.0.1:9100), so it works when the
    /// container is cut off from every network.
    pub fn run_state_inside(&self, name: &str) -> Option<u32> {
        let c = &self.agent(name).container;
        let pid = docker(&["inspect", "-f", "{{.State.Pid}}", c])
            .trim()
            .to_string();
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/net")).ok()?;
        // setns changes the calling thread's namespace only: do it on a thread of its own.
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            use std::os::fd::AsRawFd;
            // SAFETY: setns on this short-lived thread with a namespace fd we own.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return None;
            }
            let mut s = std::net::TcpStream::connect_timeout(
                &"127.0.0.1:9100".parse().unwrap(),
                Duration::from_secs(2),
            )
            .ok()?;
            s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
            s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
                .ok()?;
            let mut body = String::new();
            s.read_to_string(&mut body).ok()?;
            body.lines()
                .find_map(|l| l.strip_prefix("lockstep_agent_run_state "))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .map(|v| v as u32)
        })
        .join()
        .ok()
        .flatten()
    }

    /// The run state from the host over the network (None when unreachable).
    pub fn run_state(&self, name: &str) -> Option<u32> {
        use std::io::{Read, Write};
        let addr = format!("{}:9100", self.agent(name).ip).parse().unwrap();
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        body.lines()
            .find_map(|l| l.strip_prefix("lockstep_agent_run_state "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|v| v as u32)
    }

    /// `lockstep run PLAN --etcd` from the host, in the background.
    pub fn spawn_run(&self, plan: &Path, out: &Path) -> crate::Proc {
        let log = std::fs::File::create(out.with_extension("log")).unwrap();
        crate::Proc(
            Command::new(bin("lockstep"))
                .arg("run")
                .arg(plan)
                .args(["--etcd", &self.etcd_url, "--output"])
                .arg(out)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        )
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.containers.is_empty() {
            let mut args = vec!["rm", "-f", "-v"];
            args.extend(self.containers.iter().map(String::as_str));
            let _ = try_docker(&args);
        }
        let _ = try_docker(&["network", "rm", &self.network]);
        // The agents ran as root in their containers: their files are root's, like ours.
    }
}
