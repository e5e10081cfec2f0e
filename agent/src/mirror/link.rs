//! The primary's side of a mirror: one link per job clone, with its own gRPC stream to the
//! backup agent.
//!
//! Three parties share a `Link`: the IO loop (hands writes over and, in sync mode, waits for
//! `released`), the sender thread (holds each write for the injected delay, then puts it on the
//! stream; fails over; probes a backup it failed over from) and the connection thread (a small
//! runtime of its own: connects, reads acks, reconnects). The delay is a std thread's sleep
//! because tokio's timer has millisecond granularity, coarser than the 1.1 ms it emulates.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use lockstep_proto::PROTOCOL_VERSION;
use lockstep_proto::v1::agent_client::AgentClient;
use lockstep_proto::v1::{MirrorAck, MirrorWrite};

use super::stats::{Acked, MirrorStats};
use crate::runner::MirrorHook;

/// How often a link that failed over asks the backup whether it answers again, and how long
/// it waits between connection attempts.
const PROBE_EVERY: Duration = Duration::from_millis(100);
const RECONNECT_EVERY: Duration = Duration::from_millis(200);
/// Writes queued for the stream at most; beyond it (a backup that stopped reading) a write is
/// not sent, and sync mode fails over as for any write without an ack.
const STREAM_QUEUE: usize = 4096;

/// What the coordinator said about one volume's mirror, and what the agent adds.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    pub run_id: String,
    /// The primary, as the backup names its mirror file: `agent/volume`.
    pub primary: String,
    pub backup_agent: String,
    pub backup_address: String,
    /// This agent's mutual-TLS files when it serves with them: the backup is then dialed over
    /// TLS only (never plaintext), with this agent's certificate, and must hold a certificate
    /// issued for `backup_agent`.
    pub tls: Option<lockstep_core::tls::TlsIdentity>,
    pub backup_volume: String,
    pub sync: bool,
    pub delay: Duration,
    /// Sync mode: fail over to async after this long without an ack.
    pub failover_after: Option<Duration>,
    pub token: Option<String>,
    /// The run's synchronized start: stall and fail-over times count from here.
    pub origin: Instant,
}

/// A write handed over and not yet acknowledged.
#[derive(Debug, Clone, Copy)]
struct Pending {
    seq: u64,
    local_ns: u64,
    done: Instant,
}

struct State {
    pending: VecDeque<Pending>,
    /// Highest sequence number the backup acknowledged as written.
    acked: u64,
    failed_over: bool,
    /// The stream of the current connection, if any.
    tx: Option<tokio::sync::mpsc::Sender<MirrorWrite>>,
    stats: MirrorStats,
}

impl State {
    /// Async mode: writes sent on a stream that broke (or was still open at the end) will
    /// never be acknowledged; they count as unmirrored. (Sync mode leaves them to the
    /// fail-over or the end of the run, which complete them for the job.)
    fn drop_unacked_async(&mut self, sync: bool) {
        if !sync {
            for _ in 0..self.pending.len() {
                self.stats.completed_unmirrored();
            }
            self.pending.clear();
        }
    }
}

struct Link {
    cfg: LinkConfig,
    state: Mutex<State>,
    released: AtomicU64,
    /// Notified when `released` moves (an ack, a fail-over), for `wait_released`.
    moved: Condvar,
    done: AtomicBool,
}

impl Link {
    fn since_start(&self, t: Instant) -> Duration {
        t.saturating_duration_since(self.cfg.origin)
    }

    fn message(&self, seq: u64, offset: u64, len: u32) -> MirrorWrite {
        MirrorWrite {
            protocol_version: PROTOCOL_VERSION,
            run_id: self.cfg.run_id.clone(),
            volume: self.cfg.backup_volume.clone(),
            seq,
            offset,
            len,
            data: vec![0u8; len as usize],
            primary: self.cfg.primary.clone(),
        }
    }

    /// Puts a write on the stream, unless it was released by a fail-over meanwhile. A write
    /// that cannot go (no connection, the stream full) stays pending in sync mode (the
    /// fail-over timer decides) and is counted unmirrored in async mode.
    fn send(&self, seq: u64, offset: u64, len: u32) {
        let msg = self.message(seq, offset, len);
        let mut st = self.state.lock().unwrap();
        if !st.pending.iter().any(|p| p.seq == seq) {
            return;
        }
        let sent = st.tx.as_ref().is_some_and(|tx| tx.try_send(msg).is_ok());
        if !sent && !self.cfg.sync {
            st.pending.retain(|p| p.seq != seq);
            st.stats.completed_unmirrored();
        }
    }

    /// Sync mode: the oldest write waited longer than `failover_after`: every held write is
    /// released (completed unmirrored) and later writes complete locally until the backup
    /// answers a probe again.
    fn check_failover(&self, now: Instant) {
        let Some(after) = self.cfg.failover_after.filter(|_| self.cfg.sync) else {
            return;
        };
        let mut st = self.state.lock().unwrap();
        let overdue = st.pending.front().is_some_and(|p| now >= p.done + after);
        if st.failed_over || !overdue {
            return;
        }
        st.failed_over = true;
        let at = self.since_start(now);
        st.stats.failovers.push(at);
        if let Some(last) = st.pending.back() {
            self.released.fetch_max(last.seq, Ordering::Release);
        }
        st.pending.clear();
        self.moved.notify_all();
        tracing::warn!(
            "mirror to {}: no ack for {:.1}s: failed over to async at t={:.1}s",
            self.cfg.backup_agent,
            after.as_secs_f64(),
            at.as_secs_f64()
        );
    }

    fn probe_if_failed_over(&self) {
        let st = self.state.lock().unwrap();
        if st.failed_over {
            if let Some(tx) = &st.tx {
                let _ = tx.try_send(self.message(0, 0, 0));
            }
        }
    }

    /// An ack arrived: the write's breakdown; a probe's ack ends a fail-over.
    fn on_ack(&self, ack: MirrorAck, at: Instant) {
        let mut st = self.state.lock().unwrap();
        if ack.seq == 0 {
            if st.failed_over && ack.error.is_empty() {
                st.failed_over = false;
                let t = self.since_start(at);
                st.stats.recoveries.push(t);
                tracing::info!(
                    "mirror to {}: the backup answers again at t={:.1}s",
                    self.cfg.backup_agent,
                    t.as_secs_f64()
                );
            }
            return;
        }
        while st.pending.front().is_some_and(|p| p.seq < ack.seq) {
            st.pending.pop_front();
        }
        if st.pending.front().is_some_and(|p| p.seq == ack.seq) {
            let p = st.pending.pop_front().unwrap();
            if ack.error.is_empty() {
                st.acked = ack.seq;
                let a = Acked {
                    local_ns: p.local_ns,
                    local_done: p.done,
                    ack_at: at,
                    remote_ns: ack.remote_write_ns,
                };
                let t = self.since_start(at);
                st.stats.acked(&a, self.cfg.sync, t);
            } else {
                st.stats.link_error = format!("the backup's write failed: {}", ack.error);
                if !self.cfg.sync {
                    st.stats.completed_unmirrored();
                }
            }
        }
        self.released.fetch_max(ack.seq, Ordering::Release);
        self.moved.notify_all();
    }

    fn link_down(&self, why: String) {
        let mut st = self.state.lock().unwrap();
        st.tx = None;
        st.drop_unacked_async(self.cfg.sync);
        if !self.done.load(Ordering::Relaxed) {
            st.stats.link_error = why;
        }
    }
}

/// The IO loop's handle on its link; dropping it ends the link and hands its figures to
/// `sink` (the volume's).
pub struct MirrorLink {
    link: Arc<Link>,
    to_sender: Option<mpsc::Sender<(u64, u64, u32, Instant)>>,
    next_seq: u64,
    threads: Vec<std::thread::JoinHandle<()>>,
    sink: Arc<Mutex<MirrorStats>>,
}

impl MirrorLink {
    /// Starts the link's sender and connection threads.
    pub fn start(cfg: LinkConfig, sink: Arc<Mutex<MirrorStats>>) -> std::io::Result<MirrorLink> {
        let link = Arc::new(Link {
            cfg,
            state: Mutex::new(State {
                pending: VecDeque::new(),
                acked: 0,
                failed_over: false,
                tx: None,
                stats: MirrorStats::default(),
            }),
            released: AtomicU64::new(0),
            moved: Condvar::new(),
            done: AtomicBool::new(false),
        });
        let (to_sender, from_loop) = mpsc::channel();
        let l = link.clone();
        let sender = std::thread::Builder::new()
            .name("mirror-send".into())
            .spawn(move || sender(&l, from_loop))?;
        let l = link.clone();
        let conn = std::thread::Builder::new()
            .name("mirror-conn".into())
            .spawn(move || connection(l))?;
        Ok(MirrorLink {
            link,
            to_sender: Some(to_sender),
            next_seq: 0,
            threads: vec![sender, conn],
            sink,
        })
    }
}

impl MirrorHook for MirrorLink {
    fn written(&mut self, offset: u64, len: u32, local_ns: u64, done: Instant) -> Option<u64> {
        let mut st = self.link.state.lock().unwrap();
        if st.failed_over {
            st.stats.completed_unmirrored();
            return None;
        }
        self.next_seq += 1;
        let seq = self.next_seq;
        st.pending.push_back(Pending {
            seq,
            local_ns,
            done,
        });
        drop(st);
        if let Some(tx) = &self.to_sender {
            let _ = tx.send((seq, offset, len, done));
        }
        self.link.cfg.sync.then_some(seq)
    }

    #[inline]
    fn released(&self) -> u64 {
        self.link.released.load(Ordering::Acquire)
    }

    fn wait_released(&self, seq: u64, until: Instant) {
        let link = &self.link;
        let mut st = link.state.lock().unwrap();
        loop {
            let now = Instant::now();
            if link.released.load(Ordering::Acquire) >= seq || now >= until {
                return;
            }
            st = link.moved.wait_timeout(st, until - now).unwrap().0;
        }
    }

    fn finished(&mut self, seq: u64, total_ns: u64, at: Instant) {
        let mut st = self.link.state.lock().unwrap();
        if seq <= st.acked {
            let t = self.link.since_start(at);
            st.stats.completed_mirrored(total_ns, t);
        } else {
            st.stats.completed_unmirrored();
        }
    }
}

impl Drop for MirrorLink {
    fn drop(&mut self) {
        self.link.done.store(true, Ordering::Relaxed);
        self.to_sender = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let mut st = self.link.state.lock().unwrap();
        st.tx = None;
        st.drop_unacked_async(self.link.cfg.sync);
        let end = self.link.since_start(Instant::now());
        st.stats.end(end);
        self.sink.lock().unwrap().merge(&st.stats);
    }
}

/// The sender thread: each write leaves `delay` after it finished locally (one delay for all,
/// so the order holds), and between writes the fail-over timer and the probes run.
fn sender(link: &Link, from_loop: mpsc::Receiver<(u64, u64, u32, Instant)>) {
    let mut last_probe = Instant::now();
    loop {
        match from_loop.recv_timeout(Duration::from_millis(2)) {
            Ok((seq, offset, len, done)) => {
                let due = done + link.cfg.delay;
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                link.send(seq, offset, len);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
        let now = Instant::now();
        link.check_failover(now);
        if now >= last_probe + PROBE_EVERY {
            last_probe = now;
            link.probe_if_failed_over();
        }
    }
}

/// The connection thread: connect, read acks until the stream breaks, reconnect, until the
/// link is done.
fn connection(link: Arc<Link>) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            link.link_down(format!("no runtime for the mirror: {e}"));
            return;
        }
    };
    rt.block_on(async {
        while !link.done.load(Ordering::Relaxed) {
            if let Err(why) = stream_once(&link).await {
                link.link_down(why);
            }
            let until = Instant::now() + RECONNECT_EVERY;
            while Instant::now() < until && !link.done.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
}

/// One connection's life: the stream opens with a probe (so a fail-over ends as soon as the
/// backup answers), then acks are read until it breaks or the link is done.
async fn stream_once(link: &Link) -> Result<(), String> {
    let cfg = &link.cfg;
    let who = format!("backup {} ({})", cfg.backup_agent, cfg.backup_address);
    let scheme = if cfg.tls.is_some() { "https" } else { "http" };
    let mut endpoint =
        tonic::transport::Endpoint::from_shared(format!("{scheme}://{}", cfg.backup_address))
            .map_err(|e| format!("{who}: {e}"))?
            .connect_timeout(Duration::from_secs(1))
            .tcp_nodelay(true);
    if let Some(tls) = &cfg.tls {
        endpoint = endpoint
            .tls_config(tls.client_config(&cfg.backup_agent))
            .map_err(|e| format!("{who}: {e}"))?;
    }
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| connect_failed(cfg, &who, &e))?;
    let mut client = AgentClient::new(channel);
    let (tx, rx) = tokio::sync::mpsc::channel(STREAM_QUEUE);
    tx.try_send(link.message(0, 0, 0))
        .map_err(|e| format!("{who}: {e}"))?;
    let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    if let Some(t) = &cfg.token {
        let v = format!("Bearer {t}")
            .parse()
            .map_err(|_| format!("{who}: the token is not a valid header value"))?;
        req.metadata_mut().insert("authorization", v);
    }
    let mut acks = client
        .mirror(req)
        .await
        .map_err(|s| call_failed(cfg, &who, &s))?
        .into_inner();
    link.state.lock().unwrap().tx = Some(tx);
    loop {
        if link.done.load(Ordering::Relaxed) {
            return Ok(());
        }
        match tokio::time::timeout(Duration::from_millis(50), acks.message()).await {
            Err(_) => continue,
            Ok(Ok(Some(ack))) => link.on_ack(ack, Instant::now()),
            Ok(Ok(None)) => return Err(format!("{who}: the stream ended")),
            Ok(Err(s)) => return Err(format!("{who}: {}", s.message())),
        }
    }
}

/// Why the backup could not be reached, with the whole error chain (tonic's first message says
/// only "transport error").
fn connect_failed(cfg: &LinkConfig, who: &str, e: &tonic::transport::Error) -> String {
    let text = lockstep_core::tls::error_chain(e.to_string(), std::error::Error::source(e));
    with_tls_hint(cfg, format!("{who}: cannot connect: {text}"))
}

/// The `Mirror` call failed: the backup's refusal (its message says why), or, over TLS 1.3, the
/// backup refusing this agent's certificate, which the client sees only now.
fn call_failed(cfg: &LinkConfig, who: &str, s: &tonic::Status) -> String {
    let text = match s.code() {
        tonic::Code::Unknown | tonic::Code::Cancelled | tonic::Code::Unavailable => {
            lockstep_core::tls::error_chain(s.message().to_string(), std::error::Error::source(s))
        }
        _ => return format!("{who}: {}", s.message()),
    };
    with_tls_hint(cfg, format!("{who}: {text}"))
}

/// Over TLS, what a failed handshake needs: the certificates each side must hold.
fn with_tls_hint(cfg: &LinkConfig, text: String) -> String {
    if cfg.tls.is_some() && lockstep_core::tls::looks_like_handshake(&text) {
        format!(
            "{text} (mutual TLS failed: the backup's certificate must be issued for the name \
             '{}' by the CA of this agent's --tls-ca, and this agent's certificate, with the \
             clientAuth usage, by the CA the backup trusts)",
            cfg.backup_agent
        )
    } else {
        text
    }
}
