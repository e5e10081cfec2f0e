//! Membership in etcd: an agent started with `--etcd` keeps a key under a lease, so coordinators
//! find it by listing a prefix, and it disappears by itself when the agent dies.
//!
//! Layout: `<prefix>/agents/<name>` → a JSON [`Registration`] (default prefix `/lockstep`).
//! The key is attached to a lease of `ttl` seconds that the agent keeps alive every `ttl/3`;
//! a killed, paused or cut-off agent stops renewing and etcd deletes the key once the lease
//! expires, so a listing never shows an agent dead for longer than its TTL (etcd checks expiry
//! on its leader, typically within a few hundred milliseconds of the deadline). A clean shutdown
//! revokes the lease: the key goes at once.
//!
//! The registration is best effort and never stops the agent from serving: while etcd is
//! unreachable the agent retries with backoff (and, once back, registers under a new lease).
//!
//! At scale (docs/scale.md): one lease per agent, because a lease is the liveness of the one
//! process that renews it; shared leases would make agents expire together. Readers of the
//! prefix page through it ([`get_prefix_paged`]): 10,000 registrations of 8 volumes are about
//! 9 MB, more than a gRPC client accepts in one response (4 MiB by default).

use std::collections::BTreeMap;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions, KeyValue, LeaseGrantOptions, PutOptions};
use serde::{Deserialize, Serialize};

/// What an agent publishes about itself: everything `lockstep agents` lists and a plan
/// selects by, without a round trip to the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Registration {
    pub name: String,
    /// `host:port` coordinators dial (`--advertise`, default: the bound listen address).
    pub address: String,
    pub labels: BTreeMap<String, String>,
    pub volumes: Vec<RegisteredVolume>,
    /// The agent's release (`lockstep-agent --version`).
    pub version: String,
    /// The coordinator protocol version it speaks.
    pub protocol_version: u32,
    pub capabilities: RegisteredCapabilities,
    /// Whether the agent requires mutual TLS (dial it with `--tls-*`).
    #[serde(default)]
    pub tls: bool,
    pub hostname: String,
    /// When this registration was made (agent clock, Unix milliseconds).
    pub registered_unix_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegisteredVolume {
    pub name: String,
    pub path: String,
    #[serde(default)]
    pub size_bytes: u64,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub provisioned_iops: u64,
    #[serde(default)]
    pub provisioned_mib_s: u64,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RegisteredCapabilities {
    pub io_uring: bool,
    pub engines: Vec<String>,
    pub exec_allowed: bool,
    pub block_devices_allowed: bool,
}

/// Where and how to register.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    /// etcd client URLs (`http://host:2379`).
    pub endpoints: Vec<String>,
    /// Key prefix shared by agents and coordinators (default `/lockstep`).
    pub prefix: String,
    /// Lease TTL: how long a dead agent may stay listed. etcd rounds to whole seconds and
    /// refuses less than its minimum (about 2 s with default settings).
    pub ttl: Duration,
}

pub const DEFAULT_PREFIX: &str = "/lockstep";
pub const DEFAULT_TTL: Duration = Duration::from_secs(5);

/// The key an agent registers under.
pub fn agent_key(prefix: &str, name: &str) -> String {
    format!("{}/agents/{name}", prefix.trim_end_matches('/'))
}

/// The prefix every agent key starts with.
pub fn agents_prefix(prefix: &str) -> String {
    format!("{}/agents/", prefix.trim_end_matches('/'))
}

/// Splits `--etcd` values: comma-separated URLs; a bare `host:port` gets `http://`.
pub fn parse_endpoints(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| {
            if e.contains("://") {
                e.to_string()
            } else {
                format!("http://{e}")
            }
        })
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("etcd at {endpoints}: {message}")]
    Etcd { endpoints: String, message: String },
    #[error("etcd at {endpoints}: the lease expired (the agent could not renew it in time)")]
    LeaseLost { endpoints: String },
}

/// The useful part of an etcd client error: the gRPC status message ("tcp connect error",
/// "etcdserver: requested lease not found") rather than the whole nested transport error.
pub fn etcd_message(e: &etcd_client::Error) -> String {
    match e {
        etcd_client::Error::GRpcStatus(s) if !s.message().is_empty() => s.message().to_string(),
        other => other.to_string(),
    }
}

/// Connection options for every etcd client in lockstep: fail fast when etcd is down, and
/// notice a dead connection within seconds.
pub fn connect_options() -> ConnectOptions {
    ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5))
        .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
        .with_keep_alive_while_idle(true)
}

/// Keys per Range request when reading a prefix: 500 registrations of 8 volumes are about
/// 450 KB, well under the client's 4 MiB limit on one response, and few enough round trips
/// (20 for 10,000 agents) that paging costs little.
pub const LIST_PAGE: i64 = 500;

/// etcd's `range_end` for "every key that starts with `prefix`": the prefix with its last
/// byte below 0xff incremented (what `etcdctl get --prefix` sends).
pub fn prefix_range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff (or empty): to the end of the keyspace.
    vec![0]
}

/// Every key under `prefix` in pages of `page` keys, all read at the revision of the first
/// page so the result is one consistent snapshot (a watch from `revision + 1` then misses
/// nothing). Returns the key-values in key order and that revision. A page larger than the
/// client accepts (registrations with unusually large labels) is asked again at half the
/// keys; a revision compacted between two pages (only with auto-compaction and a very slow
/// reader) restarts the read.
pub async fn get_prefix_paged(
    client: &mut Client,
    prefix: &str,
    mut page: i64,
) -> Result<(Vec<KeyValue>, i64), etcd_client::Error> {
    let end = prefix_range_end(prefix.as_bytes());
    let mut attempt = 0;
    'read: loop {
        attempt += 1;
        let mut out = Vec::new();
        let mut start = prefix.as_bytes().to_vec();
        let mut revision = 0;
        loop {
            let mut opts = GetOptions::new()
                .with_range(end.clone())
                .with_limit(page.max(1));
            if revision > 0 {
                opts = opts.with_revision(revision);
            }
            let mut resp = match client.get(start.clone(), Some(opts)).await {
                Err(e) if page > 1 && etcd_message(&e).contains("message length too large") => {
                    page /= 2;
                    continue;
                }
                Err(e) if attempt < 3 && etcd_message(&e).contains("compacted") => continue 'read,
                r => r?,
            };
            if revision == 0 {
                revision = resp.header().map(|h| h.revision()).unwrap_or(0);
            }
            let more = resp.more();
            let kvs = resp.take_kvs();
            let Some(last) = kvs.last() else {
                return Ok((out, revision));
            };
            // The next page starts right after the last key read.
            start = last.key().to_vec();
            start.push(0);
            out.extend(kvs);
            if !more {
                return Ok((out, revision));
            }
        }
    }
}

/// Registers once and keeps the lease alive until `shutdown` resolves (then revokes it) or the
/// lease is lost (an error: the caller registers again).
async fn register_once(
    opts: &RegistryOptions,
    reg: &Registration,
    lease: i64,
    shared: Option<&Client>,
    shutdown: &mut (impl std::future::Future<Output = ()> + Unpin),
    registered: &mut Option<std::time::Instant>,
) -> Result<(), RegistryError> {
    let endpoints = opts.endpoints.join(",");
    let err = |e| RegistryError::Etcd {
        endpoints: endpoints.clone(),
        message: etcd_message(&e),
    };
    let mut client = match shared {
        Some(c) => c.clone(),
        None => Client::connect(&opts.endpoints, Some(connect_options()))
            .await
            .map_err(err)?,
    };
    let ttl = opts.ttl.as_secs().max(1) as i64;
    let asked = tokio::time::Instant::now();
    // Always the same lease id for this agent: a grant that timed out here but went through
    // in etcd's queue is found again ("already exists") instead of leaving one more lease
    // behind on every retry (170,000 leases for 10,000 agents before, docs/scale.md).
    let grant = LeaseGrantOptions::new().with_id(lease);
    match client.lease_grant(ttl, Some(grant)).await {
        Ok(_) => {}
        Err(e) if etcd_message(&e).contains("lease already exists") => {}
        Err(e) => return Err(err(e)),
    }
    let value = serde_json::to_vec(reg).expect("a registration serializes");
    client
        .put(
            agent_key(&opts.prefix, &reg.name),
            value,
            Some(PutOptions::new().with_lease(lease)),
        )
        .await
        .map_err(err)?;
    *registered = Some(std::time::Instant::now());
    tracing::info!(lease, ttl, key = %agent_key(&opts.prefix, &reg.name), "registered in etcd");
    let (mut keeper, mut responses) = client.lease_keep_alive(lease).await.map_err(err)?;
    let every = (opts.ttl / 3).max(Duration::from_millis(300));
    // The first renewal one period after the grant, not at once: agents started together
    // would otherwise all renew in the same instant, and the renewal right after a grant
    // buys nothing. An agent that was paused renews once when it resumes, not in a burst.
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The lease is lost when etcd says so (TTL 0) or when no renewal has been answered within
    // its TTL, not when one answer is slow: an etcd busy with 10,000 agents answers late, and
    // agents that registered again on every late answer made it busier still (docs/scale.md).
    // The deadline counts from when the answered renewal was sent, the earliest moment etcd
    // can have renewed it, so the agent never believes in a lease etcd has already dropped.
    let lease_ttl = Duration::from_secs(ttl as u64);
    let mut deadline = asked + lease_ttl;
    let mut sent = std::collections::VecDeque::new();
    loop {
        tokio::select! {
            _ = &mut *shutdown => {
                // Gone at once rather than after the TTL.
                let _ = tokio::time::timeout(Duration::from_secs(2), client.lease_revoke(lease)).await;
                return Ok(());
            }
            _ = tick.tick() => {
                sent.push_back(tokio::time::Instant::now());
                keeper.keep_alive().await.map_err(err)?;
            }
            r = responses.message() => match r {
                Ok(Some(r)) if r.ttl() > 0 => {
                    let at = sent.pop_front().unwrap_or_else(tokio::time::Instant::now);
                    deadline = deadline.max(at + Duration::from_secs(r.ttl() as u64));
                }
                Ok(_) => return Err(RegistryError::LeaseLost { endpoints }),
                Err(e) => return Err(err(e)),
            },
            _ = tokio::time::sleep_until(deadline) => {
                return Err(RegistryError::LeaseLost { endpoints });
            }
        }
    }
}

/// A random lease id for one agent's life (positive and non-zero, as etcd requires of ids a
/// client picks).
fn lease_id() -> i64 {
    use std::hash::BuildHasher;
    let r = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
    ((r >> 1) as i64).max(1)
}

/// Between half and all of `d`, differently for every call. Agents that lost etcd together
/// (an etcd restart, or 10,000 agents whose first requests timed out in the same queue) would
/// otherwise retry together, each time as one burst.
fn jittered(d: Duration) -> Duration {
    use std::hash::BuildHasher;
    // A fresh RandomState has new keys each time: enough randomness for a retry delay.
    let r = std::collections::hash_map::RandomState::new().hash_one(0u8);
    d.mul_f64(0.5 + (r % 1000) as f64 / 2000.0)
}

/// Keeps `reg` registered until `shutdown` resolves, re-registering after any failure (etcd
/// down, lease expired while the agent was paused) with a backoff of up to `ttl`.
pub async fn keep_registered(
    opts: RegistryOptions,
    reg: Registration,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    keep_registered_on(None, opts, reg, shutdown).await
}

/// [`keep_registered`] over `shared`, a client (one HTTP/2 connection) that many
/// registrations in one process use together, as the agent simulator's do; `None` connects
/// for each attempt, as a real agent does. Each registration still has its own lease.
pub async fn keep_registered_on(
    shared: Option<Client>,
    opts: RegistryOptions,
    reg: Registration,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut backoff = Duration::from_millis(200);
    let lease = lease_id();
    loop {
        let mut registered = None;
        match register_once(
            &opts,
            &reg,
            lease,
            shared.as_ref(),
            &mut shutdown,
            &mut registered,
        )
        .await
        {
            Ok(()) => return,
            Err(e) => {
                if registered.is_some() {
                    backoff = Duration::from_millis(200);
                }
                tracing::warn!(
                    "etcd registration: {e}; retrying in up to {:.1}s",
                    backoff.as_secs_f64()
                );
            }
        }
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tokio::time::sleep(jittered(backoff)) => {}
        }
        backoff = (backoff * 2).min(opts.ttl.max(Duration::from_secs(1)));
    }
}

/// A registration's volumes and capabilities are the agent's Hello reply, the same words.
impl From<RegisteredVolume> for lockstep_proto::v1::Volume {
    fn from(v: RegisteredVolume) -> Self {
        lockstep_proto::v1::Volume {
            name: v.name,
            path: v.path,
            size_bytes: v.size_bytes,
            kind: v.kind,
            provisioned_iops: v.provisioned_iops,
            provisioned_mib_s: v.provisioned_mib_s,
        }
    }
}

impl From<RegisteredCapabilities> for lockstep_proto::v1::Capabilities {
    fn from(c: RegisteredCapabilities) -> Self {
        lockstep_proto::v1::Capabilities {
            io_uring: c.io_uring,
            engines: c.engines,
            exec_allowed: c.exec_allowed,
            block_devices_allowed: c.block_devices_allowed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_endpoints() {
        assert_eq!(agent_key("/lockstep", "n1"), "/lockstep/agents/n1");
        assert_eq!(agent_key("/lockstep/", "n1"), "/lockstep/agents/n1");
        assert_eq!(agents_prefix("/x"), "/x/agents/");
        assert_eq!(
            parse_endpoints("127.0.0.1:2379, https://e2:2379,"),
            vec![
                "http://127.0.0.1:2379".to_string(),
                "https://e2:2379".to_string()
            ]
        );
    }

    #[test]
    fn retry_delays_are_spread_over_the_upper_half_of_the_backoff() {
        let d = Duration::from_secs(1);
        let all: Vec<Duration> = (0..200).map(|_| jittered(d)).collect();
        assert!(all.iter().all(|j| *j >= d / 2 && *j < d), "{all:?}");
        let distinct: std::collections::HashSet<_> = all.iter().collect();
        assert!(distinct.len() > 100, "{} distinct delays", distinct.len());
    }

    #[test]
    fn a_prefix_range_ends_after_its_last_key() {
        assert_eq!(prefix_range_end(b"/x/agents/"), b"/x/agents0".to_vec());
        assert_eq!(prefix_range_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_range_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_range_end(b""), vec![0]);
    }

    #[test]
    fn a_registration_round_trips_and_tolerates_missing_optional_fields() {
        let json = r#"{"name":"n1","address":"10.0.0.5:7070","labels":{"role":"worker"},
            "volumes":[{"name":"data","path":"/mnt/data"}],"version":"0.1.0","protocol_version":1,
            "capabilities":{"io_uring":true,"engines":["psync"],"exec_allowed":false,"block_devices_allowed":false},
            "hostname":"h","registered_unix_ms":1}"#;
        let r: Registration = serde_json::from_str(json).unwrap();
        assert_eq!(r.volumes[0].kind, "");
        assert!(!r.tls);
        let back: Registration = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }
}
