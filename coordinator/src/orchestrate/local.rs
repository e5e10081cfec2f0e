//! `--local N` (or `NxM`): N agents on this machine as child processes, each with its own
//! directory as volume "data" (or M directories, volumes "data1" .. "dataM", the way a Hadoop
//! datanode mounts its disks). The embedded default for trying lockstep with no
//! infrastructure.
//!
//! Children are started with a token only they and we know, listen on 127.0.0.1 port 0 and
//! print their address. They live exactly as long as the coordinator, however it ends:
//!
//! - each child's standard input is a pipe whose write end only this process holds (Rust opens
//!   it close-on-exec, so no other child inherits it), and the child runs with
//!   `--exit-with-stdin`: when this process exits, by SIGKILL or a crash included, the kernel
//!   closes the pipe, the agent reads its end, stops its layout or run, removes its files and
//!   exits. PR_SET_PDEATHSIG was the alternative, but it fires when the *thread* that forked
//!   exits (here a tokio worker, not the process) and needs a getppid() check against the race
//!   with our own death; a pipe has neither problem;
//! - each child is in a session of its own (setsid), so a Ctrl-C at the terminal reaches only
//!   the coordinator, which aborts the run in order (partial results) and then stops the
//!   agents; and where the kernel groups the scheduling by session (autogroup, the default of
//!   desktop and many server kernels) the coordinator keeps its share of the CPU against
//!   thousands of busy clone threads, instead of taking seconds to notice a signal;
//! - a clean end kills them (kill on drop too).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error(
        "cannot find the lockstep-agent binary next to {0} (build it with `cargo build --release`, or set LOCKSTEP_AGENT_BIN)"
    )]
    NoAgentBinary(PathBuf),
    #[error("creating {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("starting local agent {name}: {message}")]
    Spawn { name: String, message: String },
}

/// The shape of a local cluster: `--local 4` is 4 agents of one volume, `--local 4x8` 4 agents
/// of 8 volumes each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalShape {
    pub agents: usize,
    pub volumes_per_agent: usize,
}

impl std::str::FromStr for LocalShape {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (a, v) = s.split_once(['x', 'X']).unwrap_or((s, "1"));
        let count = |x: &str, what: &str| -> Result<usize, String> {
            match x.trim().parse::<usize>() {
                Ok(n) if n >= 1 => Ok(n),
                _ => Err(format!(
                    "expected N or NxM (agents x volumes per agent, each at least 1), got '{s}': bad {what}"
                )),
            }
        };
        Ok(LocalShape {
            agents: count(a, "agent count")?,
            volumes_per_agent: count(v, "volume count")?,
        })
    }
}

impl LocalShape {
    /// The volume names of each agent: "data" alone, else "data1" .. "dataM".
    pub fn volume_names(&self) -> Vec<String> {
        if self.volumes_per_agent == 1 {
            vec!["data".to_string()]
        } else {
            (1..=self.volumes_per_agent)
                .map(|i| format!("data{i}"))
                .collect()
        }
    }
}

pub struct LocalAgent {
    pub name: String,
    pub address: String,
    /// Its volumes: name and directory.
    pub volumes: Vec<(String, PathBuf)>,
    child: Child,
    /// The write end of the child's standard input, never written: it closes when we exit.
    _lifeline: Option<tokio::process::ChildStdin>,
}

pub struct LocalCluster {
    pub agents: Vec<LocalAgent>,
    pub token: String,
    root: PathBuf,
}

/// How long a shutdown waits for killed local agents to be gone.
const REAP_WAIT: Duration = Duration::from_secs(1);

/// The agent binary: `LOCKSTEP_AGENT_BIN`, or `lockstep-agent` beside this executable (cargo
/// puts both in the same target directory; an install puts both in the same bin directory).
pub fn agent_binary() -> Result<PathBuf, LocalError> {
    if let Ok(p) = std::env::var("LOCKSTEP_AGENT_BIN") {
        return Ok(PathBuf::from(p));
    }
    let me = std::env::current_exe().unwrap_or_default();
    let dir = me.parent().map(Path::to_path_buf).unwrap_or_default();
    for candidate in [dir.join("lockstep-agent"), dir.join("../lockstep-agent")] {
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(LocalError::NoAgentBinary(me))
}

fn random_token() -> String {
    let mut b = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut b);
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl LocalCluster {
    /// Starts the agents with volume directories under `root` (created, and removed on drop).
    pub async fn start(
        shape: LocalShape,
        root: &Path,
        grace: Duration,
        allow_exec: bool,
    ) -> Result<Self, LocalError> {
        let bin = agent_binary()?;
        let token = random_token();
        let mut agents = Vec::with_capacity(shape.agents);
        for i in 1..=shape.agents {
            let name = format!("agent-{i}");
            let home = root.join(&name);
            let names = shape.volume_names();
            let volumes: Vec<(String, PathBuf)> = if names.len() == 1 {
                vec![(names[0].clone(), home.clone())]
            } else {
                names.iter().map(|v| (v.clone(), home.join(v))).collect()
            };
            for (_, dir) in &volumes {
                std::fs::create_dir_all(dir).map_err(|source| LocalError::Dir {
                    path: dir.clone(),
                    source,
                })?;
            }
            let mut cmd = Command::new(&bin);
            // SAFETY: setsid(2) is async-signal-safe and touches no memory of the parent.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::setsid() < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            let mut child = cmd
                .arg("serve")
                .args(["--listen", "127.0.0.1:0", "--name", &name])
                .args(volumes.iter().flat_map(|(v, dir)| {
                    ["--volume".to_string(), format!("{v}={}", dir.display())]
                }))
                .args(["--label", &format!("node={name}")])
                .args(["--grace", &format!("{}ms", grace.as_millis())])
                .args(allow_exec.then_some("--allow-exec"))
                .arg("--exit-with-stdin")
                .env("LOCKSTEP_TOKEN", &token)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| LocalError::Spawn {
                    name: name.clone(),
                    message: format!("{}: {e}", bin.display()),
                })?;
            let lifeline = child.stdin.take();
            let stdout = child.stdout.take().expect("piped stdout");
            let mut lines = BufReader::new(stdout).lines();
            let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
                .await
                .map_err(|_| LocalError::Spawn {
                    name: name.clone(),
                    message: "did not report its address within 10 s".into(),
                })?
                .map_err(|e| LocalError::Spawn {
                    name: name.clone(),
                    message: e.to_string(),
                })?
                .ok_or_else(|| LocalError::Spawn {
                    name: name.clone(),
                    message: "exited before listening".into(),
                })?;
            let address = line
                .strip_prefix("listening on ")
                .ok_or_else(|| LocalError::Spawn {
                    name: name.clone(),
                    message: format!("unexpected output '{line}'"),
                })?
                .trim()
                .to_string();
            // Keep draining stdout so the child never blocks on a full pipe.
            tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
            agents.push(LocalAgent {
                name,
                address,
                volumes,
                child,
                _lifeline: lifeline,
            });
        }
        Ok(LocalCluster {
            agents,
            token,
            root: root.to_path_buf(),
        })
    }

    /// Kills agent `name` (for tests and demos of a lost agent).
    pub async fn kill(&mut self, name: &str) {
        if let Some(a) = self.agents.iter_mut().find(|a| a.name == name) {
            let _ = a.child.kill().await;
        }
    }

    pub fn pid(&self, name: &str) -> Option<u32> {
        self.agents
            .iter()
            .find(|a| a.name == name)
            .and_then(|a| a.child.id())
    }

    /// Stops every agent and removes the volume directories (unless `keep`: `--keep-files`,
    /// e.g. to verify a killed agent's files from its checkpoint afterwards).
    pub async fn shutdown(mut self, keep: bool) {
        for a in &mut self.agents {
            let _ = a.child.start_kill();
        }
        // SIGKILL is sent; waiting only reaps them. An agent with thousands of clones and
        // gigabytes of histograms takes seconds to be torn down by the kernel, which it does
        // whether we wait or not: bounded, so a stopped run ends promptly.
        let reaped = tokio::time::timeout(REAP_WAIT, async {
            for a in &mut self.agents {
                let _ = a.child.wait().await;
            }
        })
        .await;
        match reaped {
            Ok(()) => tracing::debug!("local agents reaped"),
            Err(_) => {
                tracing::debug!("local agents still exiting after {REAP_WAIT:?}; not waiting")
            }
        }
        if !keep {
            let t = std::time::Instant::now();
            let _ = std::fs::remove_dir_all(&self.root);
            tracing::debug!("volumes removed in {:?}", t.elapsed());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_with_their_volume_names() {
        let one: LocalShape = "4".parse().unwrap();
        assert_eq!((one.agents, one.volumes_per_agent), (4, 1));
        assert_eq!(one.volume_names(), ["data"]);
        let dn: LocalShape = "4x8".parse().unwrap();
        assert_eq!((dn.agents, dn.volumes_per_agent), (4, 8));
        assert_eq!(dn.volume_names().len(), 8);
        assert_eq!(dn.volume_names()[7], "data8");
        for bad in ["0", "4x0", "x8", "4x", "four", "-1", "4x8x2"] {
            let e = bad.parse::<LocalShape>().unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
    }
}
