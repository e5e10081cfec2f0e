//! Talking to one agent: connect (plain, or mutual TLS), handshake (versions checked), clock
//! probes.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockstep_proto::v1::agent_client::AgentClient;
use lockstep_proto::v1::{ClockProbeRequest, HelloReply, HelloRequest};
use lockstep_proto::{PROTOCOL_VERSION, version_mismatch};
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::transport::{Channel, Endpoint};

use crate::results::clock::{self, ClockEstimate, Probe};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("agent '{agent}' at {address}: cannot connect: {detail}")]
    Connect {
        agent: String,
        address: String,
        detail: String,
    },
    #[error("agent '{agent}' at {address}: {message}")]
    Call {
        agent: String,
        address: String,
        message: String,
    },
    #[error("agent '{agent}' at {address}: {0}", .message)]
    Version {
        agent: String,
        address: String,
        message: String,
    },
}

/// Adds the shared token to every call.
#[derive(Clone)]
pub struct Token(pub Option<MetadataValue<tonic::metadata::Ascii>>);

impl Interceptor for Token {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(t) = &self.0 {
            req.metadata_mut().insert("authorization", t.clone());
        }
        Ok(req)
    }
}

/// Mutual TLS for every agent connection this process makes, set once from the command line
/// (`--tls-cert/--tls-key/--tls-ca`) before any connection. Process-wide, like the identity it
/// stands for: every run and every re-attach of this coordinator dials with the same
/// certificate, without threading credentials through the run loop.
static TLS: OnceLock<lockstep_core::tls::TlsIdentity> = OnceLock::new();

/// Dial every agent over mutual TLS with these files: the coordinator's certificate and key,
/// and the CA the agents' certificates must chain to. The agent's certificate must be issued
/// for its *name* (as `lockstep certs` does), whatever address it is reached at.
pub fn use_tls(files: &lockstep_core::tls::TlsFiles) -> Result<(), lockstep_core::tls::TlsError> {
    let _ = TLS.set(files.load()?);
    Ok(())
}

/// Whether `use_tls` was called: this process dials agents over mutual TLS.
pub fn tls_enabled() -> bool {
    TLS.get().is_some()
}

pub type Client = AgentClient<tonic::service::interceptor::InterceptedService<Channel, Token>>;

pub fn unix_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// A connected, version-checked agent.
pub struct Connected {
    pub name: String,
    pub address: String,
    pub client: Client,
    pub hello: HelloReply,
}

fn call_err(agent: &str, address: &str, s: tonic::Status) -> ClientError {
    let message = match s.code() {
        tonic::Code::Unauthenticated => {
            "refused the token (give the agent's token with --token or LOCKSTEP_TOKEN)".to_string()
        }
        tonic::Code::Unavailable => {
            format!(
                "unreachable ({})",
                explain(
                    s.message().to_string(),
                    std::error::Error::source(&s),
                    agent,
                    TLS.get().is_some()
                )
            )
        }
        tonic::Code::Unknown | tonic::Code::Cancelled => explain(
            s.message().to_string(),
            std::error::Error::source(&s),
            agent,
            TLS.get().is_some(),
        ),
        _ => s.message().to_string(),
    };
    ClientError::Call {
        agent: agent.into(),
        address: address.into(),
        message,
    }
}

/// Why a connection failed, from the innermost errors (tonic's own says only "transport
/// error"), with what to do about a failed TLS handshake.
fn connect_detail(e: &tonic::transport::Error, name: &str, tls: bool) -> String {
    explain(e.to_string(), std::error::Error::source(e), name, tls)
}

/// `first`, then every distinct message of the `source` chain, and a hint when it looks like
/// a failed TLS handshake (a broken pipe or a cancelled call right after connecting).
fn explain(
    first: String,
    source: Option<&(dyn std::error::Error + 'static)>,
    name: &str,
    tls: bool,
) -> String {
    let text = lockstep_core::tls::error_chain(first, source);
    let handshake = lockstep_core::tls::looks_like_handshake(&text);
    if tls && handshake {
        format!(
            "{text} (mutual TLS failed: the agent's certificate must be issued for the name '{name}' by the CA of --tls-ca, \
             and this coordinator's by the CA the agent trusts)"
        )
    } else if !tls && handshake {
        format!(
            "{text} (if the agent requires mutual TLS, give --tls-cert, --tls-key and --tls-ca)"
        )
    } else {
        text
    }
}

/// How long a connection to an agent may go without reading anything before it pings, when no
/// run's interval says otherwise ([`keepalive_for`]).
pub const KEEPALIVE: Duration = Duration::from_secs(2);
/// How long a ping may go unanswered before the connection is given up.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(3);

/// The keepalive of a run's connections: one interval and a second. A running agent's interval
/// reports are what proves it alive, and HTTP/2 pings only once nothing was read for the
/// keepalive, so a healthy run sends none; a silent agent is pinged within a second of its
/// missed report and given up 3 s later (5 s at 1 s intervals, as before). Pinging every
/// second regardless had been more than half of the coordinator's CPU at 2,000 agents and 5 s
/// intervals (docs/scale.md, "Keepalive").
pub fn keepalive_for(interval: Duration) -> Duration {
    interval.max(Duration::from_secs(1)) + Duration::from_secs(1)
}

/// Connects with keepalive pings after `keepalive` without a read (a paused or dead agent is
/// noticed within seconds even when no interval is due) and says hello; a version mismatch is
/// a refusal naming both versions.
pub async fn connect(
    name: &str,
    address: &str,
    token: Option<&str>,
    keepalive: Duration,
) -> Result<Connected, ClientError> {
    let tls = TLS.get();
    let url = match (address.contains("://"), tls) {
        (true, _) => address.to_string(),
        (false, Some(_)) => format!("https://{address}"),
        (false, None) => format!("http://{address}"),
    };
    let connect_err = |e: tonic::transport::Error| ClientError::Connect {
        agent: name.into(),
        address: address.into(),
        detail: connect_detail(&e, name, tls.is_some()),
    };
    let mut endpoint = Endpoint::from_shared(url).map_err(connect_err)?;
    if let Some(t) = tls {
        // The agent must prove it is `name`, not merely someone the CA signed for.
        endpoint = endpoint
            .tls_config(t.client_config(name))
            .map_err(connect_err)?;
    }
    let channel = endpoint
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(keepalive)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(connect_err)?;
    let token = Token(token.and_then(|t| MetadataValue::try_from(format!("Bearer {t}")).ok()));
    let mut client =
        AgentClient::with_interceptor(channel, token).max_decoding_message_size(256 << 20);
    let hello = client
        .hello(HelloRequest {
            protocol_version: PROTOCOL_VERSION,
            coordinator_version: env!("CARGO_PKG_VERSION").into(),
        })
        .await
        .map_err(|s| {
            if s.code() == tonic::Code::FailedPrecondition
                && s.message().contains("protocol version")
            {
                ClientError::Version {
                    agent: name.into(),
                    address: address.into(),
                    message: s.message().into(),
                }
            } else {
                call_err(name, address, s)
            }
        })?
        .into_inner();
    if hello.protocol_version != PROTOCOL_VERSION {
        return Err(ClientError::Version {
            agent: name.into(),
            address: address.into(),
            message: version_mismatch(PROTOCOL_VERSION, hello.protocol_version, "coordinator"),
        });
    }
    Ok(Connected {
        name: name.into(),
        address: address.into(),
        client,
        hello,
    })
}

impl Connected {
    /// `n` clock probes, back to back; the lowest round trip wins.
    pub async fn probe_clock(&mut self, n: usize) -> Result<ClockEstimate, ClientError> {
        let mut probes = Vec::with_capacity(n);
        for _ in 0..n {
            let t0 = unix_ns();
            let r = self
                .client
                .clock_probe(ClockProbeRequest {
                    protocol_version: PROTOCOL_VERSION,
                })
                .await
                .map_err(|s| call_err(&self.name, &self.address, s))?
                .into_inner();
            let t1 = unix_ns();
            probes.push(Probe {
                t0,
                agent_ns: r.agent_unix_ns,
                t1,
            });
        }
        Ok(clock::estimate(&probes).expect("at least one probe"))
    }

    pub fn err(&self, s: tonic::Status) -> ClientError {
        call_err(&self.name, &self.address, s)
    }
}
