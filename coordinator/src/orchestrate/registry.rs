//! Reading the etcd registry: which agents are alive, with their labels, volumes and versions.
//!
//! Agents keep `<prefix>/agents/<name>` under a lease (see `lockstep_core::registry`); a key
//! exists exactly while its agent renews the lease, so one prefix read is the live membership.
//! `lockstep agents` prints it; `lockstep run --etcd` resolves plans (select by label) against it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use etcd_client::{Client, GetOptions};
use lockstep_core::registry::{Registration, agents_prefix, connect_options};

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

/// Entries whose value does not parse (another tool's keys, a newer agent's format) are
/// skipped with a warning rather than failing the listing.
pub async fn list(endpoints: &[String], prefix: &str) -> Result<Vec<LiveAgent>, RegistryError> {
    let joined = endpoints.join(",");
    let err = |e| RegistryError::Etcd {
        endpoints: joined.clone(),
        message: lockstep_core::registry::etcd_message(&e),
    };
    let limit = Duration::from_secs(5);
    let work = async {
        let mut client = Client::connect(endpoints, Some(connect_options()))
            .await
            .map_err(err)?;
        let resp = client
            .get(agents_prefix(prefix), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(err)?;
        let mut out = Vec::new();
        for kv in resp.kvs() {
            match serde_json::from_slice::<Registration>(kv.value()) {
                Ok(registration) => {
                    let lease_ttl_left_s = match kv.lease() {
                        0 => None,
                        id => client
                            .lease_time_to_live(id, None)
                            .await
                            .ok()
                            .map(|t| t.ttl()),
                    };
                    out.push(LiveAgent {
                        registration,
                        lease_ttl_left_s,
                    });
                }
                Err(e) => tracing::warn!(
                    "{}: not an agent registration: {e}",
                    String::from_utf8_lossy(kv.key())
                ),
            }
        }
        out.sort_by(|a, b| a.registration.name.cmp(&b.registration.name));
        Ok(out)
    };
    tokio::time::timeout(limit, work)
        .await
        .map_err(|_| RegistryError::Timeout {
            endpoints: joined.clone(),
            secs: limit.as_secs(),
        })?
}

/// The agents of a run from the registry, for `plan::resolve` (which selects by label).
pub async fn agent_infos(
    endpoints: &[String],
    prefix: &str,
) -> Result<Vec<AgentInfo>, RegistryError> {
    let live = list(endpoints, prefix).await?;
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

/// `lockstep agents --etcd URL [--json]`.
pub fn agents_command(etcd: &str, prefix: &str, json: bool) -> anyhow::Result<ExitCode> {
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
    fn a_registration_becomes_a_plan_agent() {
        let a = to_agent_info(reg("w"));
        assert_eq!(a.address, "10.0.0.5:7070");
        assert_eq!(a.labels["role"], "worker");
        assert_eq!(a.volumes[0].size_bytes, 60 << 30);
        assert_eq!(a.volumes[0].provisioned_iops, None);
    }
}
