//! Benchmark of the etcd registry at scale (not a test): N agents register in a real etcd the
//! way `lockstep-agent serve --etcd` does (`lockstep_core::registry::keep_registered_on`, one
//! lease each, renewed every TTL/3), and the coordinator's own functions read them
//! (`orchestrate::registry::list`, `agent_infos`, `Membership`). Prints one table.
//!
//! `scripts/registry-scale.sh` starts a scratch etcd and runs this; by hand:
//! `cargo run --release -p lockstep --example registry_scale -- --etcd URL --etcd-pid PID
//! [--agents 10000] [--volumes 8] [--expire 100] [--ttl-s 5] [--clients 1]`
//!
//! `--clients C` spreads the agents over C etcd clients (HTTP/2 connections); `--clients 0`
//! gives every agent its own, as N agent processes would have (etcd then holds N
//! connections; this process needs N file descriptors).

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use etcd_client::{Client, GetOptions};
use lockstep::orchestrate::registry::{self, Change, ListOptions, Membership};
use lockstep_core::registry::{
    RegisteredCapabilities, RegisteredVolume, Registration, RegistryOptions, agents_prefix,
    connect_options, keep_registered_on,
};
use tokio::sync::{mpsc, oneshot};

#[derive(Parser)]
struct Args {
    /// etcd's client URL.
    #[arg(long)]
    etcd: String,
    /// etcd's process id, for its RSS and CPU (left out without it).
    #[arg(long)]
    etcd_pid: Option<u32>,
    #[arg(long, default_value_t = 10_000)]
    agents: usize,
    /// Volumes per agent (their registrations grow with them).
    #[arg(long, default_value_t = 8)]
    volumes: usize,
    /// Agents whose keep-alive stops, to time their expiry.
    #[arg(long, default_value_t = 100)]
    expire: usize,
    /// The agents' lease TTL in seconds (`--etcd-ttl`; default 5 s as agents have).
    #[arg(long, default_value_t = 5)]
    ttl_s: u64,
    /// etcd clients the agents share; 0: one per agent.
    #[arg(long, default_value_t = 1)]
    clients: usize,
    #[arg(long, default_value = "/lockstep-scale")]
    prefix: String,
    /// Time `lockstep agents` with this binary too.
    #[arg(long)]
    lockstep_bin: Option<PathBuf>,
    /// Seconds of steady renewals over which etcd's CPU is measured.
    #[arg(long, default_value_t = 10)]
    steady_s: u64,
}

/// One simulated agent: its registration task and the signal that shuts it down cleanly.
struct SimAgent {
    name: String,
    task: tokio::task::JoinHandle<()>,
    stop: oneshot::Sender<()>,
}

/// The report: one row per figure, printed at the end.
#[derive(Default)]
struct Table(Vec<(String, String)>);

impl Table {
    fn row(&mut self, what: impl Into<String>, value: impl Into<String>) {
        let (what, value) = (what.into(), value.into());
        eprintln!("  {what}: {value}");
        self.0.push((what, value));
    }

    fn print(&self) {
        let w = self.0.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        for (k, v) in &self.0 {
            println!("{k:<w$}  {v}");
        }
    }
}

fn registration(i: usize, volumes: usize) -> Registration {
    let name = format!("agent-{i:05}");
    Registration {
        name: name.clone(),
        address: format!("10.{}.{}.{}:7070", i >> 16, (i >> 8) & 255, i & 255),
        labels: [
            ("role".to_string(), "datanode".to_string()),
            ("rack".to_string(), format!("r{:02}", i % 40)),
            (
                "az".to_string(),
                format!("us-east-1{}", ["a", "b", "c"][i % 3]),
            ),
        ]
        .into(),
        volumes: (0..volumes)
            .map(|v| RegisteredVolume {
                name: format!("data{v}"),
                path: format!("/mnt/data{v}/lockstep"),
                size_bytes: 2 << 40,
                kind: "st1".into(),
                provisioned_iops: 0,
                provisioned_mib_s: 0,
            })
            .collect(),
        version: env!("CARGO_PKG_VERSION").into(),
        protocol_version: lockstep_proto::PROTOCOL_VERSION,
        capabilities: RegisteredCapabilities {
            io_uring: true,
            engines: vec!["io_uring".into(), "psync".into(), "null".into()],
            exec_allowed: false,
            block_devices_allowed: false,
        },
        tls: false,
        hostname: format!("{name}.cluster.internal"),
        registered_unix_ms: 0,
    }
}

fn spawn_agent(i: usize, args: &Args, client: Option<Client>) -> SimAgent {
    let opts = RegistryOptions {
        endpoints: vec![args.etcd.clone()],
        prefix: args.prefix.clone(),
        ttl: Duration::from_secs(args.ttl_s),
    };
    let reg = registration(i, args.volumes);
    let (stop, stopped) = oneshot::channel::<()>();
    let name = reg.name.clone();
    let task = tokio::spawn(keep_registered_on(client, opts, reg, async move {
        let _ = stopped.await;
    }));
    SimAgent { name, task, stop }
}

async fn count(client: &mut Client, prefix: &str) -> anyhow::Result<i64> {
    let opts = GetOptions::new().with_prefix().with_count_only();
    Ok(client.get(agents_prefix(prefix), Some(opts)).await?.count())
}

/// Polls the key count every 20 ms until `done(count)`; the time it took.
async fn until_count(
    client: &mut Client,
    prefix: &str,
    limit: Duration,
    done: impl Fn(i64) -> bool,
) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let mut shown = Duration::ZERO;
    loop {
        // A poll that times out while etcd works through a registration storm is a figure
        // (printed), not the end of the benchmark.
        let n = match count(client, prefix).await {
            Ok(n) => n,
            Err(e) => {
                eprintln!("  {:.1} s: count failed: {e}", t.elapsed().as_secs_f64());
                -1
            }
        };
        if n >= 0 && done(n) {
            return Ok(t.elapsed());
        }
        if t.elapsed() >= shown + Duration::from_secs(1) {
            shown = t.elapsed();
            eprintln!("  {:.1} s: {n} keys", shown.as_secs_f64());
        }
        anyhow::ensure!(t.elapsed() < limit, "gave up after {limit:?} at {n} keys");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}

/// `VmRSS` and `VmHWM` (peak) of a process, in MiB.
fn rss_mib(pid: &str) -> Option<(f64, f64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<f64> {
        let line = s.lines().find(|l| l.starts_with(name))?;
        let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb / 1024.0)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// User plus system CPU seconds a process has used.
fn cpu_s(pid: &str) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesized command name; utime and stime are the 14th and 15th.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(ticks / hz)
}

fn median_max(mut v: Vec<Duration>) -> String {
    v.sort();
    format!(
        "median {} / max {} ({} runs)",
        ms(v[v.len() / 2]),
        ms(*v.last().unwrap()),
        v.len()
    )
}

async fn register_all(
    args: &Args,
    etcd: &mut Client,
    table: &mut Table,
) -> anyhow::Result<Vec<SimAgent>> {
    let mut clients = Vec::new();
    for _ in 0..args.clients {
        clients.push(Client::connect([&args.etcd], Some(connect_options())).await?);
    }
    let t = Instant::now();
    let agents: Vec<SimAgent> = (0..args.agents)
        .map(|i| spawn_agent(i, args, clients.get(i % clients.len().max(1)).cloned()))
        .collect();
    let n = args.agents as i64;
    let all = until_count(etcd, &args.prefix, Duration::from_secs(300), |c| c >= n).await?;
    table.row(
        format!("register {} agents (all keys exist)", args.agents),
        format!(
            "{} ({:.0} registrations/s)",
            ms(all),
            n as f64 / all.as_secs_f64()
        ),
    );
    // Every attempt that timed out (and was retried) left a lease behind until its TTL.
    let leases = etcd.leases().await?.leases().len();
    table.row(
        "  ... leases in etcd then (> agents: retried grants)",
        leases.to_string(),
    );
    let eps = vec![args.etcd.clone()];
    let infos = registry::agent_infos(&eps, &args.prefix).await?;
    table.row(
        "  ... until the coordinator's listing has all",
        format!("{} ({} listed)", ms(t.elapsed()), infos.len()),
    );
    anyhow::ensure!(infos.len() == args.agents, "listed {}", infos.len());
    Ok(agents)
}

/// The old listing: one Range of the whole prefix, then each lease's TTL one after the other.
async fn old_listing(args: &Args, etcd: &mut Client, table: &mut Table) -> anyhow::Result<()> {
    let t = Instant::now();
    let one = etcd
        .get(
            agents_prefix(&args.prefix),
            Some(GetOptions::new().with_prefix()),
        )
        .await;
    let leases = match one {
        Ok(r) => {
            let bytes: usize = r.kvs().iter().map(|kv| kv.value().len()).sum();
            table.row(
                "before: one Range of the prefix",
                format!(
                    "{} ({} keys, {bytes} value bytes)",
                    ms(t.elapsed()),
                    r.kvs().len()
                ),
            );
            r.kvs().iter().map(|kv| kv.lease()).collect::<Vec<_>>()
        }
        Err(e) => {
            table.row("before: one Range of the prefix", format!("fails: {e}"));
            let opts = GetOptions::new().with_prefix().with_keys_only();
            let r = etcd.get(agents_prefix(&args.prefix), Some(opts)).await?;
            r.kvs().iter().map(|kv| kv.lease()).collect()
        }
    };
    let t = Instant::now();
    for id in &leases {
        etcd.lease_time_to_live(*id, None).await?;
    }
    table.row(
        "before: lease TTLs one by one",
        format!("{} ({} leases)", ms(t.elapsed()), leases.len()),
    );
    Ok(())
}

async fn listing(args: &Args, table: &mut Table) -> anyhow::Result<()> {
    let eps = vec![args.etcd.clone()];
    let (mut with_ttl, mut without) = (Vec::new(), Vec::new());
    let (mut listed, mut ttls, mut infos) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..5 {
        let t = Instant::now();
        let l = registry::list(&eps, &args.prefix).await?;
        with_ttl.push(t.elapsed());
        listed.push(l.len());
        ttls.push(l.iter().filter(|a| a.lease_ttl_left_s.is_some()).count());
        let t = Instant::now();
        infos.push(registry::agent_infos(&eps, &args.prefix).await?.len());
        without.push(t.elapsed());
    }
    table.row(
        "list (lockstep agents: paged + TTLs)",
        format!(
            "{}; agents listed {listed:?}, with a TTL {ttls:?}",
            median_max(with_ttl)
        ),
    );
    table.row(
        "agent_infos (lockstep run: paged)",
        format!("{}; agents {infos:?}", median_max(without)),
    );
    if let Some(bin) = &args.lockstep_bin {
        let (mut runs, mut lines) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let t = Instant::now();
            let out = std::process::Command::new(bin)
                .args([
                    "agents",
                    "--etcd",
                    &args.etcd,
                    "--etcd-prefix",
                    &args.prefix,
                ])
                .output()
                .with_context(|| bin.display().to_string())?;
            runs.push(t.elapsed());
            anyhow::ensure!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let last = String::from_utf8_lossy(&out.stdout)
                .lines()
                .last()
                .map(String::from);
            lines.push(last.unwrap_or_default());
        }
        table.row(
            "`lockstep agents` (the binary, table)",
            format!("{}; {lines:?}", median_max(runs)),
        );
    }
    Ok(())
}

/// Follows the membership in a task; every change comes out with the instant it arrived.
async fn follow(args: &Args) -> anyhow::Result<mpsc::UnboundedReceiver<(Change, Instant)>> {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut m = Membership::start(std::slice::from_ref(&args.etcd), &args.prefix).await?;
    anyhow::ensure!(m.agents().len() == args.agents, "{}", m.agents().len());
    tokio::spawn(async move {
        loop {
            let changes = match m.changes().await {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("the watch ended: {e}");
                    return;
                }
            };
            let at = Instant::now();
            for c in changes {
                if tx.send((c, at)).is_err() {
                    return;
                }
            }
        }
    });
    Ok(rx)
}

async fn next_change(
    rx: &mut mpsc::UnboundedReceiver<(Change, Instant)>,
) -> anyhow::Result<(Change, Instant)> {
    tokio::time::timeout(Duration::from_secs(60), rx.recv())
        .await
        .context("no watch event within 60 s")?
        .context("the watch ended")
}

async fn watch(
    args: &Args,
    rx: &mut mpsc::UnboundedReceiver<(Change, Instant)>,
    table: &mut Table,
) -> anyhow::Result<()> {
    let client = Client::connect([&args.etcd], Some(connect_options())).await?;
    let t = Instant::now();
    let new = spawn_agent(args.agents, args, Some(client));
    let (c, at) = next_change(rx).await?;
    anyhow::ensure!(
        matches!(&c, Change::Joined(r) if r.name == new.name),
        "{c:?}"
    );
    table.row("watch: a new agent registers -> Joined", ms(at - t));
    let t = Instant::now();
    let _ = new.stop.send(());
    let (c, at) = next_change(rx).await?;
    anyhow::ensure!(c == Change::Left(new.name.clone()), "{c:?}");
    table.row("watch: clean shutdown (revoke) -> Left", ms(at - t));
    new.task.await?;
    Ok(())
}

/// Stops the keep-alive of `args.expire` agents without revoking (as a kill does) and times
/// their expiry: as the watch sees it and as the coordinator's listing does.
async fn expiry(
    args: &Args,
    agents: &mut Vec<SimAgent>,
    rx: &mut mpsc::UnboundedReceiver<(Change, Instant)>,
    table: &mut Table,
) -> anyhow::Result<()> {
    let k = args.expire.min(agents.len());
    let dead: Vec<SimAgent> = agents.drain(..k).collect();
    let names: HashSet<String> = dead.iter().map(|a| a.name.clone()).collect();
    let t = Instant::now();
    for a in &dead {
        a.task.abort();
    }
    let eps = vec![args.etcd.clone()];
    let opts = ListOptions {
        lease_ttls: false,
        ..ListOptions::default()
    };
    let (mut first, mut last, mut seen, mut flaps) = (None, None, 0, 0);
    let mut listed_gone = None;
    let limit = Duration::from_secs(args.ttl_s * 3 + 60);
    while (seen < k || listed_gone.is_none()) && t.elapsed() < limit {
        while let Ok((c, at)) = rx.try_recv() {
            if !matches!(&c, Change::Left(n) if names.contains(n)) {
                flaps += 1;
                continue;
            }
            first.get_or_insert(at - t);
            last = Some(at - t);
            seen += 1;
        }
        if listed_gone.is_none() {
            let l = registry::list_with(&eps, &args.prefix, opts).await?;
            if !l.iter().any(|a| names.contains(&a.registration.name)) {
                listed_gone = Some(t.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ttl = Duration::from_secs(args.ttl_s);
    let show = |d: Option<Duration>| d.map(ms).unwrap_or_else(|| "never".into());
    table.row(
        format!("expiry of {k} (TTL {}): watch, first Left", ms(ttl)),
        show(first),
    );
    table.row(
        "  ... watch, last Left",
        format!("{} ({seen} of {k})", show(last)),
    );
    table.row("  ... listing no longer shows any", show(listed_gone));
    table.row(
        "  ... other agents' changes meanwhile (flaps)",
        flaps.to_string(),
    );
    anyhow::ensure!(seen == k, "only {seen} of {k} expired");
    Ok(())
}

async fn resources(
    args: &Args,
    etcd: &mut Client,
    rx: &mut mpsc::UnboundedReceiver<(Change, Instant)>,
    table: &mut Table,
) -> anyhow::Result<()> {
    let me = std::process::id().to_string();
    let etcd_pid = args.etcd_pid.map(|p| p.to_string());
    let every = (Duration::from_secs(args.ttl_s) / 3).max(Duration::from_millis(300));
    let (me0, e0) = (cpu_s(&me), etcd_pid.as_deref().and_then(cpu_s));
    tokio::time::sleep(Duration::from_secs(args.steady_s)).await;
    let per_s = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => format!("{:.0}% of a core", (b - a) / args.steady_s as f64 * 100.0),
        _ => "-".into(),
    };
    table.row(
        format!(
            "steady renewals ({:.0}/s): etcd CPU",
            agents_alive(etcd, args).await? as f64 / every.as_secs_f64()
        ),
        per_s(e0, etcd_pid.as_deref().and_then(cpu_s)),
    );
    table.row("  ... this process's CPU", per_s(me0, cpu_s(&me)));
    let mut flaps = 0;
    while rx.try_recv().is_ok() {
        flaps += 1;
    }
    table.row(
        "  ... membership changes meanwhile (flaps)",
        flaps.to_string(),
    );
    let status = etcd.status().await?;
    table.row(
        "etcd DB size",
        format!("{:.1} MiB", status.db_size() as f64 / (1 << 20) as f64),
    );
    let show = |r: Option<(f64, f64)>| {
        r.map(|(now, peak)| format!("{now:.0} MiB (peak {peak:.0} MiB)"))
            .unwrap_or_else(|| "-".into())
    };
    table.row("etcd RSS", show(etcd_pid.as_deref().and_then(rss_mib)));
    table.row(
        "this process's RSS (agents + coordinator)",
        show(rss_mib(&me)),
    );
    Ok(())
}

async fn agents_alive(etcd: &mut Client, args: &Args) -> anyhow::Result<i64> {
    count(etcd, &args.prefix).await
}

async fn run(args: Args) -> anyhow::Result<Table> {
    let mut table = Table::default();
    let mut etcd = Client::connect([&args.etcd], Some(connect_options())).await?;
    anyhow::ensure!(
        count(&mut etcd, &args.prefix).await? == 0,
        "{} already has agents under {}: use a scratch etcd",
        args.etcd,
        args.prefix
    );
    table.row(
        "registration value",
        format!(
            "{} bytes ({} volumes)",
            serde_json::to_vec(&registration(0, args.volumes))?.len(),
            args.volumes
        ),
    );
    eprintln!("registering {} agents...", args.agents);
    let mut agents = register_all(&args, &mut etcd, &mut table).await?;
    old_listing(&args, &mut etcd, &mut table).await?;
    listing(&args, &mut table).await?;
    let t = Instant::now();
    let mut rx = follow(&args).await?;
    table.row("Membership::start (paged read + watch)", ms(t.elapsed()));
    watch(&args, &mut rx, &mut table).await?;
    resources(&args, &mut etcd, &mut rx, &mut table).await?;
    expiry(&args, &mut agents, &mut rx, &mut table).await?;
    let t = Instant::now();
    for a in agents {
        let _ = a.stop.send(());
    }
    until_count(&mut etcd, &args.prefix, Duration::from_secs(120), |c| {
        c == 0
    })
    .await?;
    table.row(
        "clean shutdown of the rest (revoke) -> 0 keys",
        ms(t.elapsed()),
    );
    Ok(table)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let table = rt.block_on(run(args))?;
    println!();
    table.print();
    Ok(())
}
