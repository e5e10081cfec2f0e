//! A multi-host test cluster in Docker: etcd and N agents, each a container with its own
//! address on a network of its own, built from our binaries (no registry, no base image).
//!
//! Containers are started, paused, read and removed through testcontainers; what it has no
//! API for (a network with a subnet of our own, connecting and disconnecting a container,
//! SIGKILL, copying a directory out, listing leftovers) goes through bollard, the Docker
//! client testcontainers itself uses. The images are built by `deploy/container/build.sh`, the
//! script users run (so the tests run the image users get; it calls `docker build`).
//!
//! Versions (docs/testing.md): testcontainers 0.28.0 with bollard 0.21.1, both pinned. bollard
//! names API 1.53 but its request paths carry no version (the `/v1.53` prefix is lost when the
//! path is joined onto it), so the engine answers at its own API version: Debian bookworm's
//! engine 20.10 (API 1.41) works. A bollard that starts sending the version would be refused
//! by that engine ("client version 1.53 is too new"), hence the exact pins.
//!
//! Every container and network carries the label `lockstep-test=<pid>`; a cluster removes its
//! own on drop (a panicking test included), and the next test process removes those of test
//! processes that are gone.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use bollard::Docker;
use bollard::models::{
    EndpointIpamConfig, EndpointSettings, Ipam, IpamConfig, NetworkConnectRequest,
    NetworkCreateRequest, NetworkDisconnectRequest,
};
use bollard::query_parameters::{
    DownloadFromContainerOptions, KillContainerOptions, ListContainersOptions, ListNetworksOptions,
    RemoveContainerOptions,
};
use testcontainers::core::Mount;
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};
use tokio_stream::StreamExt;

use crate::{bin, scratch, wait_for};

/// The one runtime the Docker clients of this test process live on (bollard's pooled
/// connections belong to the runtime that opened them).
fn rt() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime for the Docker client")
    })
}

/// Runs `f` on the Docker runtime.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    rt().block_on(f)
}

/// testcontainers' own bollard client (DOCKER_HOST or the local socket).
pub fn client() -> Docker {
    block_on(testcontainers::core::client::docker_client_instance())
        .unwrap_or_else(|e| panic!("no Docker client: {e} (run scripts/setup.sh --docker)"))
}

/// The Docker engine, or a clear failure: CI installs and starts it (scripts/setup.sh --docker).
pub fn require_docker() {
    let ping = block_on(async {
        let docker = testcontainers::core::client::docker_client_instance()
            .await
            .map_err(|e| e.to_string())?;
        docker.ping().await.map_err(|e| e.to_string())
    });
    if let Err(e) = ping {
        panic!(
            "the Docker engine is not running ({e}): run scripts/setup.sh --docker (the README's test command does)"
        );
    }
}

pub const AGENT_IMAGE: (&str, &str) = ("lockstep", "test");
pub const ETCD_IMAGE: (&str, &str) = ("lockstep-etcd", "test");

/// Builds the agent image (from the binaries the tests use) and the etcd image, once per test
/// process.
pub fn images() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        require_docker();
        let bin_dir = bin("lockstep-agent").parent().unwrap().to_path_buf();
        build_image(
            Some(&bin_dir),
            &format!("{}:{}", AGENT_IMAGE.0, AGENT_IMAGE.1),
        );
        build_image(None, &format!("{}:{}", ETCD_IMAGE.0, ETCD_IMAGE.1));
        remove_leftovers();
    });
}

/// `deploy/container/build.sh`: the lockstep image from the binaries in `bin_dir`, or the etcd
/// image when `bin_dir` is None, tagged `tag`.
pub fn build_image(bin_dir: Option<&Path>, tag: &str) {
    let build = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/container/build.sh");
    let mut cmd = Command::new(&build);
    match bin_dir {
        Some(dir) => cmd.arg("lockstep").arg("--bin-dir").arg(dir),
        None => cmd.arg("etcd"),
    };
    let o = cmd
        .args(["--tag", tag])
        .stdin(Stdio::null())
        .output()
        .expect("running deploy/container/build.sh");
    assert!(
        o.status.success(),
        "build.sh {tag}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn label_filter() -> HashMap<String, Vec<String>> {
    HashMap::from([("label".to_string(), vec!["lockstep-test".to_string()])])
}

/// Containers and networks of earlier test processes that died without cleaning up.
fn remove_leftovers() {
    let alive = |pid: Option<&String>| {
        pid.and_then(|p| p.parse::<i32>().ok())
            .is_some_and(|p| Path::new(&format!("/proc/{p}")).exists())
    };
    let docker = client();
    block_on(async {
        let opts = ListContainersOptions {
            all: true,
            filters: Some(label_filter()),
            ..Default::default()
        };
        for c in docker.list_containers(Some(opts)).await.unwrap_or_default() {
            let pid = c.labels.as_ref().and_then(|l| l.get("lockstep-test"));
            if let (false, Some(id)) = (alive(pid), c.id.as_deref()) {
                let _ = docker.remove_container(id, Some(force_remove())).await;
            }
        }
        let opts = ListNetworksOptions {
            filters: Some(label_filter()),
        };
        for n in docker.list_networks(Some(opts)).await.unwrap_or_default() {
            let pid = n.labels.as_ref().and_then(|l| l.get("lockstep-test"));
            if let (false, Some(id)) = (alive(pid), n.id.as_deref()) {
                let _ = docker.remove_network(id).await;
            }
        }
    });
}

fn force_remove() -> RemoveContainerOptions {
    RemoveContainerOptions {
        force: true,
        v: true,
        ..Default::default()
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
    pid_label: String,
    prefix: String,
    pub etcd_url: String,
    pub agents: Vec<AgentContainer>,
    /// Every container of the cluster by name; removed when the cluster drops.
    containers: Vec<(String, ContainerAsync<GenericImage>)>,
    docker: Docker,
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
        let docker = client();
        let network = format!("{prefix}-net");
        let net = create_network(&docker, &network, pid, seq);
        let mut cluster = Cluster {
            network,
            subnet: net.clone(),
            pid_label: pid.to_string(),
            prefix: prefix.clone(),
            etcd_url: format!("http://{net}.2:2379"),
            agents: Vec::new(),
            containers: Vec::new(),
            docker,
            scratch: scratch(),
        };
        let etcd_url = cluster.etcd_url.clone();
        let etcd = GenericImage::new(ETCD_IMAGE.0, ETCD_IMAGE.1).with_cmd([
            "--name",
            "etcd",
            "--data-dir",
            "/var/lib/etcd",
            "--listen-client-urls",
            "http://0.0.0.0:2379",
            "--advertise-client-urls",
            &etcd_url,
        ]);
        cluster.run("etcd", etcd, &format!("{net}.2"));
        for i in 1..=n {
            cluster.start_agent(i, agent_args);
        }
        let eps = vec![cluster.etcd_url.clone()];
        let all = wait_for(Duration::from_secs(30), || {
            block_on(lockstep::orchestrate::registry::list(&eps, "/lockstep"))
                .is_ok_and(|l| l.len() == n)
        });
        assert!(
            all,
            "not every agent registered in etcd; logs:\n{}",
            cluster.all_logs()
        );
        cluster
    }

    /// Starts agent-`i` at .(10 + i)... as Docker numbers it: see [`Cluster::run`].
    fn start_agent(&mut self, i: usize, agent_args: &[&str]) {
        let name = format!("agent-{i}");
        let container = format!("{}-{name}", self.prefix);
        // etcd is .2 and the agents follow in order: Docker gives each new container the
        // lowest free address of the network (checked in `run`).
        let ip = format!("{}.{}", self.subnet, 2 + i);
        let dir = self.scratch.path().join(&name);
        std::fs::create_dir_all(&dir).unwrap();
        let advertise = format!("{ip}:7070");
        let node = format!("node={name}");
        let mut cmd = vec![
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
            &self.etcd_url,
            "--advertise",
            &advertise,
            "--label",
            &node,
        ];
        cmd.extend(agent_args);
        let cmd: Vec<String> = cmd.into_iter().map(String::from).collect();
        let image = GenericImage::new(AGENT_IMAGE.0, AGENT_IMAGE.1)
            .with_mount(Mount::bind_mount(
                dir.display().to_string(),
                "/volumes/data",
            ))
            .with_cmd(cmd);
        self.run(&name, image, &ip);
        self.agents.push(AgentContainer {
            name,
            container,
            ip,
            dir,
        });
    }

    /// Starts `image` as container `<prefix>-<name>` on the cluster's network and checks that
    /// Docker gave it `ip`: testcontainers has no way to ask for an address, and the agents
    /// advertise theirs on their command line (a FROM-scratch image has no shell to look it up).
    fn run(
        &mut self,
        name: &str,
        image: impl Into<testcontainers::ContainerRequest<GenericImage>>,
        ip: &str,
    ) {
        let container = format!("{}-{name}", self.prefix);
        let request = image
            .into()
            .with_container_name(&container)
            .with_network(&self.network)
            .with_label("lockstep-test", &self.pid_label)
            // Reached at their network addresses, as real hosts: no host port for what the
            // images EXPOSE.
            .with_host_config_modifier(|h| {
                h.publish_all_ports = Some(false);
                h.port_bindings = None;
            });
        let started = block_on(request.start())
            .unwrap_or_else(|e| panic!("starting container {container}: {e}"));
        let got = self.address(&container);
        self.containers.push((container.clone(), started));
        assert_eq!(
            got.as_deref(),
            Some(ip),
            "{container} was given another address than the one it advertises"
        );
    }

    /// The container's address on the cluster's network.
    fn address(&self, container: &str) -> Option<String> {
        let info = block_on(self.docker.inspect_container(container, None)).ok()?;
        info.network_settings?
            .networks?
            .get(&self.network)?
            .ip_address
            .clone()
            .filter(|ip| !ip.is_empty())
    }

    /// Starts `lockstep coordinator` in a container of the image, with `runs` mounted at /runs
    /// as storage shared by every coordinator; returns the container's name.
    pub fn start_coordinator(&mut self, name: &str, runs: &Path) -> String {
        let container = format!("{}-{name}", self.prefix);
        let ip = format!("{}.{}", self.subnet, 2 + self.containers.len());
        let image = GenericImage::new(AGENT_IMAGE.0, AGENT_IMAGE.1)
            .with_entrypoint("/usr/local/bin/lockstep")
            .with_mount(Mount::bind_mount(runs.display().to_string(), "/runs"))
            .with_cmd([
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
        self.run(name, image, &ip);
        container
    }

    pub fn agent(&self, name: &str) -> &AgentContainer {
        self.agents
            .iter()
            .find(|a| a.name == name)
            .unwrap_or_else(|| panic!("no agent {name}"))
    }

    fn container(&self, name: &str) -> &ContainerAsync<GenericImage> {
        self.containers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, c)| c)
            .unwrap_or_else(|| panic!("no container {name}"))
    }

    /// Names of the agents currently in the registry.
    pub fn registered(&self) -> Vec<String> {
        block_on(lockstep::orchestrate::registry::list(
            &[self.etcd_url.clone()],
            "/lockstep",
        ))
        .map(|l| l.into_iter().map(|a| a.registration.name).collect())
        .unwrap_or_default()
    }

    /// SIGKILL to the agent's container (`stop` would send SIGTERM first and let it say
    /// goodbye).
    pub fn kill(&self, name: &str) {
        self.kill_container(&self.agent(name).container);
    }

    /// SIGKILL to any container of the cluster, by its container name.
    pub fn kill_container(&self, container: &str) {
        let opts = KillContainerOptions {
            signal: "SIGKILL".into(),
        };
        block_on(self.docker.kill_container(container, Some(opts)))
            .unwrap_or_else(|e| panic!("killing {container}: {e}"));
    }

    pub fn pause(&self, name: &str) {
        let c = self.container(&self.agent(name).container);
        block_on(c.pause()).unwrap_or_else(|e| panic!("pausing {name}: {e}"));
    }
    pub fn unpause(&self, name: &str) {
        let c = self.container(&self.agent(name).container);
        block_on(c.unpause()).unwrap_or_else(|e| panic!("unpausing {name}: {e}"));
    }

    /// Cuts the agent off: its only network interface goes away (loopback stays).
    pub fn disconnect(&self, name: &str) {
        let req = NetworkDisconnectRequest {
            container: self.agent(name).container.clone(),
            force: Some(false),
        };
        block_on(self.docker.disconnect_network(&self.network, req))
            .unwrap_or_else(|e| panic!("disconnecting {name}: {e}"));
    }

    /// Puts a cut-off agent back on the network, at its old address.
    pub fn reconnect(&self, name: &str) {
        let a = self.agent(name);
        let req = NetworkConnectRequest {
            container: a.container.clone(),
            endpoint_config: Some(EndpointSettings {
                ipam_config: Some(EndpointIpamConfig {
                    ipv4_address: Some(a.ip.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        };
        block_on(self.docker.connect_network(&self.network, req))
            .unwrap_or_else(|e| panic!("reconnecting {name}: {e}"));
    }

    /// The agent's stdout then stderr.
    pub fn logs(&self, name: &str) -> String {
        container_logs(self.container(&self.agent(name).container))
    }

    fn all_logs(&self) -> String {
        self.containers
            .iter()
            .map(|(name, c)| {
                let text = container_logs(c);
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(20)..].join("\n");
                format!("--- {name}\n{tail}\n")
            })
            .collect()
    }

    /// The files in the agent's volume as the container sees them (the directory copied out
    /// of the container as a tar stream, its entries listed): works whether or not the
    /// container is on a network.
    pub fn volume_files(&self, name: &str) -> Vec<String> {
        let c = &self.agent(name).container;
        let opts = DownloadFromContainerOptions {
            path: "/volumes/data".into(),
        };
        let tar = block_on(async {
            let mut stream = self.docker.download_from_container(c, Some(opts));
            let mut tar = Vec::new();
            while let Some(chunk) = stream.next().await {
                tar.extend_from_slice(&chunk.unwrap_or_else(|e| panic!("copying from {c}: {e}")));
            }
            tar
        });
        tar_entries(&tar)
            .into_iter()
            .map(|l| l.trim_start_matches("data/").to_string())
            .filter(|l| !l.is_empty())
            .collect()
    }

    /// The agent's `lockstep_agent_run_state` (0 idle, 1 prepared, 2 running), read from
    /// inside the container's network namespace (at 127.0.0.1:9100), so it works when the
    /// container is cut off from every network.
    pub fn run_state_inside(&self, name: &str) -> Option<u32> {
        let c = &self.agent(name).container;
        let info = block_on(self.docker.inspect_container(c, None)).ok()?;
        let pid = info.state?.pid?;
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/net")).ok()?;
        // setns changes the calling thread's namespace only: do it on a thread of its own.
        std::thread::spawn(move || {
            use std::os::fd::AsRawFd;
            // SAFETY: setns on this short-lived thread with a namespace fd we own.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return None;
            }
            metrics_run_state(&"127.0.0.1:9100".parse().unwrap(), Duration::from_secs(2))
        })
        .join()
        .ok()
        .flatten()
    }

    /// The run state from the host over the network (None when unreachable).
    pub fn run_state(&self, name: &str) -> Option<u32> {
        let addr = format!("{}:9100", self.agent(name).ip).parse().unwrap();
        metrics_run_state(&addr, Duration::from_secs(1))
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
        // testcontainers removes a container when its handle drops, from inside a runtime.
        let containers = std::mem::take(&mut self.containers);
        block_on(async move { drop(containers) });
        let _ = block_on(self.docker.remove_network(&self.network));
        // The agents ran as root in their containers: their files are root's, like ours.
    }
}

/// A /24 of our own, so that every container's address is known up front; returns its first
/// three octets.
fn create_network(docker: &Docker, name: &str, pid: u32, seq: u32) -> String {
    for k in 0..64u32 {
        let third = (pid + seq * 7 + k) % 200 + 20;
        let net = format!("172.30.{third}");
        let req = NetworkCreateRequest {
            name: name.to_string(),
            ipam: Some(Ipam {
                config: Some(vec![IpamConfig {
                    subnet: Some(format!("{net}.0/24")),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            labels: Some(HashMap::from([(
                "lockstep-test".to_string(),
                pid.to_string(),
            )])),
            ..Default::default()
        };
        match block_on(docker.create_network(req)) {
            Ok(_) => return net,
            Err(e) if e.to_string().contains("overlap") => continue,
            Err(e) => panic!("creating network {name}: {e}"),
        }
    }
    panic!("no free 172.30.x.0/24 for a test network");
}

/// A container's stdout then stderr, as far as Docker kept them.
fn container_logs(c: &ContainerAsync<GenericImage>) -> String {
    let (out, err) = block_on(async { (c.stdout_to_vec().await, c.stderr_to_vec().await) });
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.unwrap_or_default()),
        String::from_utf8_lossy(&err.unwrap_or_default())
    )
}

/// `lockstep_agent_run_state` from an agent's /metrics at `addr`.
fn metrics_run_state(addr: &std::net::SocketAddr, timeout: Duration) -> Option<u32> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(addr, timeout).ok()?;
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

/// The entry names of a tar archive (ustar headers: the name in the first 100 bytes, the size
/// in octal at 124..136, the contents padded to 512-byte blocks).
pub fn tar_entries(tar: &[u8]) -> Vec<String> {
    let mut names = Vec::new();
    let mut at = 0;
    while at + 512 <= tar.len() {
        let header = &tar[at..at + 512];
        if header.iter().all(|&b| b == 0) {
            break;
        }
        let field = |r: std::ops::Range<usize>| {
            let f = &header[r];
            let end = f.iter().position(|&b| b == 0).unwrap_or(f.len());
            String::from_utf8_lossy(&f[..end]).trim().to_string()
        };
        let prefix = field(345..500);
        let name = field(0..100);
        let size = u64::from_str_radix(&field(124..136), 8).unwrap_or(0) as usize;
        // PAX and GNU long-name records describe the next entry, not a file of their own.
        if !matches!(header[156], b'x' | b'g' | b'L') {
            names.push(if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            });
        }
        at += 512 + size.div_ceil(512) * 512;
    }
    names
}

#[cfg(test)]
mod tests {
    use super::tar_entries;

    fn header(name: &str, size: usize, kind: u8) -> Vec<u8> {
        let mut h = vec![0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        let size = format!("{size:011o}");
        h[124..135].copy_from_slice(size.as_bytes());
        h[156] = kind;
        h
    }

    #[test]
    fn tar_entries_lists_each_entry_and_skips_contents() {
        let mut tar = header("data/", 0, b'5');
        tar.extend(header("data/job.0.0", 700, b'0'));
        tar.extend(vec![7u8; 1024]);
        tar.extend(header("data/other", 0, b'0'));
        tar.extend(vec![0u8; 1024]);
        assert_eq!(tar_entries(&tar), ["data/", "data/job.0.0", "data/other"]);
    }
}
