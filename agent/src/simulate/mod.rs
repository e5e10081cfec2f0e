//! `lockstep-agent simulate`: many simulated agents in one process, each a real gRPC server of
//! the Agent service on its own port, so the real coordinator (`lockstep run`) is measured end
//! to end over real sockets at cluster sizes no test machine could run real agents for.
//!
//! - `pool`: pre-encoded interval histograms (pure; the real agent's codec);
//! - `service`: one simulated agent (Hello, clock probes, Prepare, Start, Abort, Attach);
//! - this module: options, the open-files limit, binding, the addresses file, serving.

pub mod pool;
pub mod service;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use lockstep_proto::v1::agent_server::AgentServer;
use tokio::sync::watch;

use pool::{LatencyModel, Pool};
use service::{Fate, Pools, SimAgent, SimAgentConfig};

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimOptions {
    pub agents: usize,
    pub volumes: usize,
    /// The first `slow` agents have their first volume 1.5x slower from mid-run.
    pub slow: usize,
    /// The last `lose` agents stop streaming and close their server mid-run.
    pub lose: usize,
    pub host: String,
    /// Ports `base_port..base_port+agents`; None: OS-assigned.
    pub base_port: Option<u16>,
    /// Write `name=host:port` lines here (for `lockstep run --agents-file`).
    pub addresses: Option<PathBuf>,
    pub token: Option<String>,
    pub grace: Duration,
    /// Agents are named `agent-{first_index}`.. (several processes can share one cluster).
    pub first_index: usize,
    /// Each agent's clock is off by a fixed amount drawn from +-this.
    pub clock_offset: Duration,
    /// Pre-encoded histograms per direction.
    pub pool_size: usize,
    pub seed: u64,
}

/// The healthy volume: 0.5 ms median, 1,000-3,000 IOs per interval and direction.
pub const HEALTHY: LatencyModel = LatencyModel {
    median_ns: 500_000.0,
    sigma: 0.35,
    ios: (1_000, 3_000),
};
/// Writes are a little slower than reads, as on most devices.
pub const HEALTHY_WRITE: LatencyModel = LatencyModel {
    median_ns: 650_000.0,
    sigma: 0.4,
    ios: (1_000, 3_000),
};
/// How much slower a `--slow` agent's volume gets.
pub const SLOW_FACTOR: f64 = 1.5;

/// Open files a process of `agents` simulated agents needs: each has a listener and the
/// coordinator's connection, plus a margin for the runtime and the coordinator's re-connects.
pub fn files_needed(agents: usize) -> u64 {
    agents as u64 * 2 + 256
}

/// Raises the soft RLIMIT_NOFILE to the hard limit; says what it did and whether `needed`
/// fits. Not an error when it does not: the bind that fails says which agent it was.
pub fn raise_nofile(needed: u64) -> String {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return "cannot read the open-files limit".into();
    }
    let before = lim.rlim_cur;
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            lim.rlim_cur = before;
        }
    }
    let mut msg = format!(
        "open files: limit {} (was {before}, hard limit {})",
        lim.rlim_cur, lim.rlim_max
    );
    if lim.rlim_cur < needed {
        msg.push_str(&format!(
            "; NOT ENOUGH: these agents need about {needed}: raise the hard limit (ulimit -Hn, \
             LimitNOFILE=) or split them over processes with --first-index"
        ));
    }
    msg
}

/// The pools of one process, drawn once from `seed`.
pub fn make_pools(size: usize, seed: u64) -> Pools {
    Pools {
        read: Pool::generate(HEALTHY, size, seed),
        write: Pool::generate(HEALTHY_WRITE, size, seed ^ 1),
        slow_read: Pool::generate(HEALTHY.slower(SLOW_FACTOR), size, seed ^ 2),
        slow_write: Pool::generate(HEALTHY_WRITE.slower(SLOW_FACTOR), size, seed ^ 3),
        finals: tokio::sync::Semaphore::new(1),
    }
}

fn fate(opts: &SimOptions, i: usize) -> Fate {
    if i < opts.slow {
        Fate::Slow
    } else if i + opts.lose >= opts.agents {
        Fate::Lost
    } else {
        Fate::Healthy
    }
}

/// A fixed offset in `-max..=max` for agent `i`, the same on every run.
fn clock_offset_ns(max: Duration, seed: u64, i: usize) -> i64 {
    let max = max.as_nanos() as i64;
    if max == 0 {
        return 0;
    }
    let h = pool::pick(seed ^ 0xC10C, i as u64, usize::MAX) as i64;
    h.rem_euclid(2 * max + 1) - max
}

/// Binds every agent's listener before any serves, so the addresses file lists only ports
/// that are open.
async fn bind_all(opts: &SimOptions) -> anyhow::Result<Vec<tokio::net::TcpListener>> {
    let mut out = Vec::with_capacity(opts.agents);
    for i in 0..opts.agents {
        let port = match opts.base_port {
            Some(p) => u16::try_from(u32::from(p) + i as u32)
                .ok()
                .context("--base-port + --agents goes past port 65535")?,
            None => 0,
        };
        let l = tokio::net::TcpListener::bind((opts.host.as_str(), port))
            .await
            .with_context(|| {
                format!(
                    "agent-{}: cannot listen on {}:{port}",
                    opts.first_index + i,
                    opts.host
                )
            })?;
        out.push(l);
    }
    Ok(out)
}

/// Runs the simulated agents until SIGINT or SIGTERM. Prints one line per fact on stderr and
/// `ready` on stdout once every agent listens (and the addresses file is written).
pub fn simulate_blocking(opts: SimOptions) -> anyhow::Result<()> {
    anyhow::ensure!(opts.agents > 0, "--agents must be at least 1");
    anyhow::ensure!(opts.volumes > 0, "--volumes must be at least 1");
    anyhow::ensure!(
        opts.slow + opts.lose <= opts.agents,
        "--slow {} and --lose {} are more than the {} agents",
        opts.slow,
        opts.lose,
        opts.agents
    );
    eprintln!(
        "lockstep-agent simulate: {}",
        raise_nofile(files_needed(opts.agents))
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(simulate(opts))
}

async fn simulate(opts: SimOptions) -> anyhow::Result<()> {
    let pools = Arc::new(make_pools(opts.pool_size, opts.seed));
    let listeners = bind_all(&opts).await?;
    let addrs: Vec<SocketAddr> = listeners
        .iter()
        .map(|l| l.local_addr())
        .collect::<Result<_, _>>()?;
    let names: Vec<String> = (0..opts.agents)
        .map(|i| format!("agent-{}", opts.first_index + i))
        .collect();
    if let Some(path) = &opts.addresses {
        let text: String = names
            .iter()
            .zip(&addrs)
            .map(|(n, a)| format!("{n}={a}\n"))
            .collect();
        lockstep_core::atomic_file::write_atomically(path, text.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let volumes: Vec<String> = (1..=opts.volumes).map(|j| format!("data{j}")).collect();
    for (i, (listener, name)) in listeners.into_iter().zip(&names).enumerate() {
        let (lose_tx, lose_rx) = watch::channel(false);
        let cfg = SimAgentConfig {
            name: name.clone(),
            volumes: volumes.clone(),
            token: opts.token.clone(),
            grace: opts.grace,
            clock_offset_ns: clock_offset_ns(opts.clock_offset, opts.seed, opts.first_index + i),
            fate: fate(&opts, i),
            seed: opts.seed ^ ((opts.first_index + i) as u64).wrapping_mul(0x9E37_79B9),
        };
        tokio::spawn(serve_one(
            SimAgent::new(cfg, pools.clone(), lose_tx),
            opts.token.clone(),
            listener,
            lose_rx,
        ));
    }
    describe(&opts, &names, &addrs);
    println!("ready");
    wait_for_signal().await;
    Ok(())
}

/// What was started, on stderr (the slow and lost agents by name, for the reader of a run).
fn describe(opts: &SimOptions, names: &[String], addrs: &[SocketAddr]) {
    eprintln!(
        "lockstep-agent simulate: {} agents x {} volumes on {} .. {}{}",
        opts.agents,
        opts.volumes,
        addrs[0],
        addrs[addrs.len() - 1],
        opts.addresses.as_ref().map_or(String::new(), |p| format!(
            " (addresses in {})",
            p.display()
        ))
    );
    let slow: Vec<_> = names[..opts.slow]
        .iter()
        .map(|n| format!("{n}/data1"))
        .collect();
    if !slow.is_empty() {
        eprintln!(
            "lockstep-agent simulate: {SLOW_FACTOR}x slower from mid-run: {}",
            slow.join(", ")
        );
    }
    let lost = &names[opts.agents - opts.lose..];
    if !lost.is_empty() {
        eprintln!("lockstep-agent simulate: lost mid-run: {}", lost.join(", "));
    }
}

/// One agent's server: the token check the real agent makes, keepalive pings like the real
/// agent's, closed when the agent is lost.
async fn serve_one(
    agent: SimAgent,
    token: Option<String>,
    listener: tokio::net::TcpListener,
    mut lose: watch::Receiver<bool>,
) {
    let svc =
        AgentServer::with_interceptor(agent, move |req| crate::daemon::check_token(&token, req));
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let closed = async move {
        let _ = lose.wait_for(|l| *l).await;
    };
    let served = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(crate::daemon::KEEPALIVE))
        .http2_keepalive_timeout(Some(crate::daemon::KEEPALIVE_TIMEOUT))
        .add_service(svc)
        .serve_with_incoming_shutdown(incoming, closed)
        .await;
    if let Err(e) = served {
        tracing::warn!("a simulated agent's server failed: {e}");
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(agents: usize, slow: usize, lose: usize) -> SimOptions {
        SimOptions {
            agents,
            volumes: 2,
            slow,
            lose,
            host: "127.0.0.1".into(),
            base_port: None,
            addresses: None,
            token: None,
            grace: Duration::from_secs(10),
            first_index: 0,
            clock_offset: Duration::ZERO,
            pool_size: 4,
            seed: 1,
        }
    }

    #[test]
    fn slow_agents_come_first_and_lost_ones_last() {
        let o = opts(5, 2, 1);
        let fates: Vec<_> = (0..5).map(|i| fate(&o, i)).collect();
        assert_eq!(
            fates,
            [
                Fate::Slow,
                Fate::Slow,
                Fate::Healthy,
                Fate::Healthy,
                Fate::Lost
            ]
        );
    }

    #[test]
    fn clock_offsets_stay_within_the_bound_and_differ() {
        let max = Duration::from_millis(5);
        let offs: Vec<_> = (0..100).map(|i| clock_offset_ns(max, 3, i)).collect();
        assert!(offs.iter().all(|o| o.abs() <= 5_000_000), "{offs:?}");
        assert!(offs.iter().any(|&o| o != offs[0]));
        assert_eq!(clock_offset_ns(Duration::ZERO, 3, 7), 0);
    }
}
