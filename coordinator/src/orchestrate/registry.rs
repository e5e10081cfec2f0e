//! Reading the etcd registry: which agents are alive, with their labels, volumes and versions.
//!
//! Agents keep `<prefix>/agents/<name>` under a lease (see `lockstep_core::registry`); a key
//! exists exactly while its agent renews the lease, so one prefix read is the live membership.
//! `lockstep agents` prints it; `lockstep run --etcd` resolves plans (select by label) against it.
//!
//! At 10,000 agents (docs/scale.md) the prefix is read in pages at one revision, lease TTLs are
//! asked only when shown and then many at a time, and [`Membership`] follows changes with a
//! watch from that revision instead of reading the prefix again on every event.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use etcd_client::{Client, EventType, WatchOptions, WatchStream};
use lockstep_core::registry::{
    LIST_PAGE, Registration, agents_prefix, connect_options, etcd_message, get_prefix_paged,
};

use crate::plan::{AgentInfo, AgentVolume};

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error(
        "etcd at {endpoints}: {message} (is etcd running there? give its client URL with --etcd)"
    )]
    Etcd { endpoints: String, message: String },
    #[error("etcd at {endpoints}: no answer within {secs}s (is etcd running there?)")]
    Timeout { endpoints: String, secs: u64 },
    #[error(
        "no agent is registered under {prefix} in etcd at {endpoints}: start agents with --etcd {endpoints}"
    )]
    Empty { endpoints: String, prefix: String },
    #[error(
        "agents {0} require mutual TLS (so says the registry): give --tls-cert, --tls-key and --tls-ca"
    )]
    NeedsTls(String),
}

/// One live agent as listed in the registry.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LiveAgent {
    #[serde(flatten)]
    pub registration: Registration,
    /// Seconds until its lease expires unless renewed (`None` when etcd did not say).
    pub lease_ttl_left_s: Option<i64>,
}

/// How a listing reads the registry.
#[derive(Debug, Clone, Copy)]
pub struct ListOptions {
    /// Keys per Range request (tests make it small to cross page boundaries).
    pub page: i64,
    /// Also ask each agent's lease for its time left, as `lockstep agents` shows: one request
    /// per agent, so resolving a run, which does not need it, leaves it out.
    pub lease_ttls: bool,
}

impl Default for ListOptions {
    fn default() -> Self {
        ListOptions {
            page: LIST_PAGE,
            lease_ttls: true,
        }
    }
}

/// Lease TTL requests in flight at once: 10,000 one after the other took seconds of round
/// trips; 64 at a time keep one connection busy without a burst etcd would queue.
const TTL_REQUESTS_IN_FLIGHT: usize = 64;

/// How long connecting may take before the listing says etcd is not answering. Each page
/// after that is bounded by the client's own request timeout (`connect_options`), so a large
/// registry is not cut off by a limit meant for a dead endpoint.
const CONNECT_LIMIT: Duration = Duration::from_secs(5);

async fn connect(endpoints: &[String]) -> Result<Client, RegistryError> {
    let joined = endpoints.join(",");
    tokio::time::timeout(
        CONNECT_LIMIT,
        Client::connect(endpoints, Some(connect_options())),
    )
    .await
    .map_err(|_| RegistryError::Timeout {
        endpoints: joined.clone(),
        secs: CONNECT_LIMIT.as_secs(),
    })?
    .map_err(|e| etcd_error(&joined, e))
}

fn etcd_error(endpoints: &str, e: etcd_client::Error) -> RegistryError {
    RegistryError::Etcd {
        endpoints: endpoints.to_string(),
        message: etcd_message(&e),
    }
}

/// The agent name of a registration key, `None` for a key outside `agents_prefix`.
fn name_of<'k>(agents_prefix: &str, key: &'k [u8]) -> Option<&'k str> {
    std::str::from_utf8(key).ok()?.strip_prefix(agents_prefix)
}

/// The registrations under `prefix` at one revision, by name, with their lease ids.
/// Entries whose value does not parse (another tool's keys, a newer agent's format) are
/// skipped with a warning rather than failing the listing.
async fn read_registrations(
    client: &mut Client,
    endpoints: &str,
    prefix: &str,
    page: i64,
) -> Result<(BTreeMap<String, (Registration, i64)>, i64), RegistryError> {
    let agents = agents_prefix(prefix);
    let (kvs, revision) = get_prefix_paged(client, &agents, page)
        .await
        .map_err(|e| etcd_error(endpoints, e))?;
    let mut out = BTreeMap::new();
    for kv in kvs {
        match serde_json::from_slice::<Registration>(kv.value()) {
            Ok(r) => {
                let name = name_of(&agents, kv.key()).unwrap_or(&r.name).to_string();
                out.insert(name, (r, kv.lease()));
            }
            Err(e) => tracing::warn!(
                "{}: not an agent registration: {e}",
                String::from_utf8_lossy(kv.key())
            ),
        }
    }
    Ok((out, revision))
}

/// Seconds left on each lease, asked [`TTL_REQUESTS_IN_FLIGHT`] at a time; a lease etcd does
/// not answer for is left out.
async fn lease_ttls(client: &Client, leases: impl Iterator<Item = i64>) -> HashMap<i64, i64> {
    let mut out = HashMap::new();
    let mut in_flight = tokio::task::JoinSet::new();
    let mut take = |r: Result<Option<(i64, i64)>, tokio::task::JoinError>| {
        if let Ok(Some((id, ttl))) = r {
            out.insert(id, ttl);
        }
    };
    for id in leases.filter(|&id| id != 0) {
        if in_flight.len() >= TTL_REQUESTS_IN_FLIGHT
            && let Some(r) = in_flight.join_next().await
        {
            take(r);
        }
        let mut c = client.clone();
        in_flight.spawn(async move {
            c.lease_time_to_live(id, None)
                .await
                .ok()
                .map(|t| (id, t.ttl()))
        });
    }
    while let Some(r) = in_flight.join_next().await {
        take(r);
    }
    out
}

/// The live agents, sorted by name (`lockstep agents`).
pub async fn list(endpoints: &[String], prefix: &str) -> Result<Vec<LiveAgent>, RegistryError> {
    list_with(endpoints, prefix, ListOptions::default()).await
}

/// [`list`] with the page size and whether to ask for lease TTLs.
pub async fn list_with(
    endpoints: &[String],
    prefix: &str,
    opts: ListOptions,
) -> Result<Vec<LiveAgent>, RegistryError> {
    let mut client = connect(endpoints).await?;
    let (regs, _) =
        read_registrations(&mut client, &endpoints.join(","), prefix, opts.page).await?;
    let ttls = if opts.lease_ttls {
        lease_ttls(&client, regs.values().map(|(_, lease)| *lease)).await
    } else {
        HashMap::new()
    };
    Ok(regs
        .into_values()
        .map(|(registration, lease)| LiveAgent {
            registration,
            lease_ttl_left_s: ttls.get(&lease).copied(),
        })
        .collect())
}

/// A change in the membership, as [`Membership::changes`] reports it.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    Joined(Registration),
    /// Registered again (a new lease after etcd was unreachable) or with new details.
    Updated(Registration),
    /// Its key is gone: a clean shutdown revoked the lease, or the lease expired.
    Left(String),
}

/// What one watch event does to the membership `agents` (by name): pure, so the watch's
/// bookkeeping is tested without etcd. A value that does not parse counts as the key's removal
/// (it is no agent a plan could use).
pub fn apply_event(
    agents: &mut BTreeMap<String, Registration>,
    name: &str,
    put: Option<&[u8]>,
) -> Option<Change> {
    match put.map(serde_json::from_slice::<Registration>) {
        Some(Ok(r)) => match agents.insert(name.to_string(), r.clone()) {
            None => Some(Change::Joined(r)),
            Some(old) if old != r => Some(Change::Updated(r)),
            Some(_) => None,
        },
        Some(Err(_)) | None => agents.remove(name).map(|_| Change::Left(name.to_string())),
    }
}

/// The changes that turn `old` into `new` (after a watch had to start over), in name order.
pub fn diff(
    old: &BTreeMap<String, Registration>,
    new: &BTreeMap<String, Registration>,
) -> Vec<Change> {
    let mut out = Vec::new();
    for (name, r) in new {
        match old.get(name) {
            None => out.push(Change::Joined(r.clone())),
            Some(o) if o != r => out.push(Change::Updated(r.clone())),
            Some(_) => {}
        }
    }
    out.extend(
        old.keys()
            .filter(|n| !new.contains_key(*n))
            .map(|n| Change::Left(n.clone())),
    );
    out
}

/// The live membership kept current by a watch: one paged read, then only the changes from
/// the revision after it. A coordinator that read the whole prefix again on every event
/// would read 10,000 keys for each of the 10,000 events of a cluster starting.
pub struct Membership {
    client: Client,
    endpoints: String,
    prefix: String,
    page: i64,
    agents: BTreeMap<String, Registration>,
    stream: WatchStream,
}

impl Membership {
    pub async fn start(endpoints: &[String], prefix: &str) -> Result<Membership, RegistryError> {
        Membership::start_with(endpoints, prefix, LIST_PAGE).await
    }

    /// [`Membership::start`] reading `page` keys per request.
    pub async fn start_with(
        endpoints: &[String],
        prefix: &str,
        page: i64,
    ) -> Result<Membership, RegistryError> {
        let mut client = connect(endpoints).await?;
        let joined = endpoints.join(",");
        let (agents, stream) = Membership::snapshot(&mut client, &joined, prefix, page).await?;
        Ok(Membership {
            client,
            endpoints: joined,
            prefix: prefix.to_string(),
            page,
            agents,
            stream,
        })
    }

    async fn snapshot(
        client: &mut Client,
        endpoints: &str,
        prefix: &str,
        page: i64,
    ) -> Result<(BTreeMap<String, Registration>, WatchStream), RegistryError> {
        let (regs, revision) = read_registrations(client, endpoints, prefix, page).await?;
        let watch = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision + 1);
        let stream = client
            .watch(agents_prefix(prefix), Some(watch))
            .await
            .map_err(|e| etcd_error(endpoints, e))?;
        Ok((regs.into_iter().map(|(n, (r, _))| (n, r)).collect(), stream))
    }

    /// The agents now, by name.
    pub fn agents(&self) -> &BTreeMap<String, Registration> {
        &self.agents
    }

    /// Waits for the next watch answer and applies it. After a compaction, a cancelled watch
    /// or a broken stream it reads the prefix again and reports the difference, so no change
    /// is lost; an error means etcd could not be read at all.
    pub async fn changes(&mut self) -> Result<Vec<Change>, RegistryError> {
        loop {
            let resp = match self.stream.message().await {
                Ok(Some(r)) if !r.canceled() => r,
                Ok(_) | Err(_) => return self.restart().await,
            };
            let agents_prefix = agents_prefix(&self.prefix);
            let mut out = Vec::new();
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                let Some(name) = name_of(&agents_prefix, kv.key()) else {
                    continue;
                };
                let put = (ev.event_type() == EventType::Put).then(|| kv.value());
                out.extend(apply_event(&mut self.agents, name, put));
            }
            if !out.is_empty() {
                return Ok(out);
            }
        }
    }

    async fn restart(&mut self) -> Result<Vec<Change>, RegistryError> {
        let (agents, stream) =
            Membership::snapshot(&mut self.client, &self.endpoints, &self.prefix, self.page)
                .await?;
        let changes = diff(&self.agents, &agents);
        self.agents = agents;
        self.stream = stream;
        Ok(changes)
    }
}

/// The agents of a run from the registry, for `plan::resolve` (which selects by label).
pub async fn agent_infos(
    endpoints: &[String],
    prefix: &str,
) -> Result<Vec<AgentInfo>, RegistryError> {
    let opts = ListOptions {
        lease_ttls: false,
        ..ListOptions::default()
    };
    let live = list_with(endpoints, prefix, opts).await?;
    if live.is_empty() {
        return Err(RegistryError::Empty {
            endpoints: endpoints.join(","),
            prefix: agents_prefix(prefix),
        });
    }
    let tls: Vec<&str> = live
        .iter()
        .filter(|a| a.registration.tls)
        .map(|a| a.registration.name.as_str())
        .collect();
    if !tls.is_empty() && !crate::orchestrate::client::tls_enabled() {
        return Err(RegistryError::NeedsTls(tls.join(", ")));
    }
    Ok(live
        .into_iter()
        .map(|a| to_agent_info(a.registration))
        .collect())
}

pub fn to_agent_info(r: Registration) -> AgentInfo {
    AgentInfo {
        name: r.name,
        address: r.address,
        labels: r.labels,
        volumes: r
            .volumes
            .into_iter()
            .map(|v| AgentVolume {
                name: v.name,
                path: PathBuf::from(v.path),
                size_bytes: v.size_bytes,
                kind: v.kind,
                provisioned_iops: (v.provisioned_iops > 0).then_some(v.provisioned_iops),
                provisioned_mib_s: (v.provisioned_mib_s > 0).then_some(v.provisioned_mib_s),
            })
            .collect(),
    }
}

fn human_size(b: u64) -> String {
    const G: u64 = 1 << 30;
    const T: u64 = 1 << 40;
    if b >= T && b % T == 0 {
        format!("{}T", b / T)
    } else if b >= G {
        format!("{}G", b / G)
    } else if b > 0 {
        format!("{}M", b >> 20)
    } else {
        String::new()
    }
}

/// The text table of `lockstep agents`.
pub fn render_table(agents: &[LiveAgent]) -> String {
    let rows: Vec<[String; 6]> = agents
        .iter()
        .map(|a| {
            let r = &a.registration;
            let labels = r
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",");
            let volumes = r
                .volumes
                .iter()
                .map(|v| {
                    let meta: Vec<String> = [v.kind.clone(), human_size(v.size_bytes)]
                        .into_iter()
                        .filter(|s| !s.is_empty())
                        .collect();
                    if meta.is_empty() {
                        format!("{}={}", v.name, v.path)
                    } else {
                        format!("{}={} ({})", v.name, v.path, meta.join(" "))
                    }
                })
                .collect::<Vec<_>>()
                .join(", ");
            let version = format!(
                "{} (protocol {}){}",
                r.version,
                r.protocol_version,
                if r.tls { ", mTLS" } else { "" }
            );
            let ttl = a
                .lease_ttl_left_s
                .map(|t| format!("{t}s"))
                .unwrap_or_else(|| "-".into());
            [
                r.name.clone(),
                r.address.clone(),
                version,
                labels,
                volumes,
                ttl,
            ]
        })
        .collect();
    let head = ["NAME", "ADDRESS", "VERSION", "LABELS", "VOLUMES", "LEASE"];
    let mut w = head.map(str::len);
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: [&str; 6]| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s += c;
            } else {
                s += &format!("{c:<width$}  ", width = w[i]);
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(head);
    for r in &rows {
        out += &line([&r[0], &r[1], &r[2], &r[3], &r[4], &r[5]]);
    }
    out += &format!(
        "{} live agent{}\n",
        rows.len(),
        if rows.len() == 1 { "" } else { "s" }
    );
    out
}

/// One line of `lockstep agents --watch`.
pub fn render_change(c: &Change) -> String {
    match c {
        Change::Joined(r) => format!("+ {} {}", r.name, r.address),
        Change::Updated(r) => format!("~ {} {}", r.name, r.address),
        Change::Left(name) => format!("- {name}"),
    }
}

/// After the table, one line per change until interrupted: the listing's names against the
/// watch's first snapshot first, so nothing between the two is missed.
async fn watch_changes(
    endpoints: &[String],
    prefix: &str,
    listed: &[LiveAgent],
) -> anyhow::Result<()> {
    let mut membership = Membership::start(endpoints, prefix).await?;
    let listed: BTreeMap<String, Registration> = listed
        .iter()
        .map(|a| (a.registration.name.clone(), a.registration.clone()))
        .collect();
    for c in diff(&listed, membership.agents()) {
        println!("{}", render_change(&c));
    }
    loop {
        tokio::select! {
            changes = membership.changes() => {
                for c in changes? {
                    println!("{}", render_change(&c));
                }
            }
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

/// `lockstep agents --etcd URL [--json] [--watch]`.
pub fn agents_command(
    etcd: &str,
    prefix: &str,
    json: bool,
    watch: bool,
) -> anyhow::Result<ExitCode> {
    let endpoints = lockstep_core::registry::parse_endpoints(etcd);
    anyhow::ensure!(
        !endpoints.is_empty(),
        "--etcd: give etcd's client URL, e.g. http://127.0.0.1:2379"
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let agents = rt.block_on(list(&endpoints, prefix))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&agents)?);
    } else {
        print!("{}", render_table(&agents));
    }
    if watch {
        rt.block_on(watch_changes(&endpoints, prefix, &agents))?;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_core::registry::{RegisteredCapabilities, RegisteredVolume};

    fn reg(name: &str) -> Registration {
        Registration {
            name: name.into(),
            address: "10.0.0.5:7070".into(),
            labels: [("role".to_string(), "worker".to_string())]
                .into_iter()
                .collect(),
            volumes: vec![RegisteredVolume {
                name: "data".into(),
                path: "/mnt/data".into(),
                size_bytes: 60 << 30,
                kind: "gp2".into(),
                provisioned_iops: 0,
                provisioned_mib_s: 0,
            }],
            version: "0.1.0".into(),
            protocol_version: 1,
            capabilities: RegisteredCapabilities::default(),
            tls: false,
            hostname: "h".into(),
            registered_unix_ms: 0,
        }
    }

    #[test]
    fn the_table_lists_labels_volumes_and_versions() {
        let t = render_table(&[LiveAgent {
            registration: reg("worker-1"),
            lease_ttl_left_s: Some(4),
        }]);
        assert_eq!(
            t,
            "NAME      ADDRESS        VERSION             LABELS       VOLUMES                   LEASE\n\
             worker-1  10.0.0.5:7070  0.1.0 (protocol 1)  role=worker  data=/mnt/data (gp2 60G)  4s\n\
             1 live agent\n"
        );
    }

    #[test]
    fn watch_events_change_the_membership_once() {
        let mut m = BTreeMap::new();
        let v = serde_json::to_vec(&reg("a")).unwrap();
        assert_eq!(
            apply_event(&mut m, "a", Some(&v)),
            Some(Change::Joined(reg("a")))
        );
        // A renewal that rewrites the same value is no change.
        assert_eq!(apply_event(&mut m, "a", Some(&v)), None);
        let mut moved = reg("a");
        moved.address = "10.0.0.6:7070".into();
        let v2 = serde_json::to_vec(&moved).unwrap();
        assert_eq!(
            apply_event(&mut m, "a", Some(&v2)),
            Some(Change::Updated(moved))
        );
        assert_eq!(
            apply_event(&mut m, "a", None),
            Some(Change::Left("a".into()))
        );
        assert_eq!(apply_event(&mut m, "a", None), None);
        assert!(m.is_empty());
        // Another tool's value under the prefix is not an agent.
        assert_eq!(apply_event(&mut m, "x", Some(b"not json")), None);
    }

    #[test]
    fn a_restarted_watch_reports_the_difference() {
        let old: BTreeMap<_, _> = ["a", "b"].map(|n| (n.to_string(), reg(n))).into();
        let mut c2 = reg("c");
        c2.address = "x:1".into();
        let new: BTreeMap<_, _> =
            [("b".to_string(), reg("b")), ("c".to_string(), c2.clone())].into();
        assert_eq!(
            diff(&old, &new),
            vec![Change::Joined(c2), Change::Left("a".into())]
        );
        assert_eq!(render_change(&Change::Left("a".into())), "- a");
    }

    #[test]
    fn a_registration_becomes_a_plan_agent() {
        let a = to_agent_info(reg("w"));
        assert_eq!(a.address, "10.0.0.5:7070");
        assert_eq!(a.labels["role"], "worker");
        assert_eq!(a.volumes[0].size_bytes, 60 << 30);
        assert_eq!(a.volumes[0].provisioned_iops, None);
    }
}
