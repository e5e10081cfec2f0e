//! What a primary saw of its mirror: the breakdown of each mirrored write, the writes that
//! completed without the backup, the longest stall, fail-overs and returns, the writes the
//! backup missed and each catch-up. Pure bookkeeping,
//! fed with instants by the link and the IO loop, so its arithmetic is tested without a network.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use lockstep_proto::v1::{MirrorCatchUp, MirrorTotals};

use crate::stats::{latency_histogram, record};

/// The figures of one link (one job clone's mirror) over its run; links of a volume merge.
#[derive(Debug, Clone)]
pub struct MirrorStats {
    pub mirrored: u64,
    pub unmirrored: u64,
    pub local: Histogram<u64>,
    pub network: Histogram<u64>,
    pub remote: Histogram<u64>,
    pub total: Histogram<u64>,
    pub lag: Histogram<u64>,
    /// Offsets from the run's start.
    pub failovers: Vec<Duration>,
    pub recoveries: Vec<Duration>,
    pub longest_stall: Duration,
    pub longest_stall_at: Duration,
    pub link_error: String,
    /// Writes the backup did not acknowledge, and their bytes (`MirrorTotals`).
    pub missed_writes: u64,
    pub missed_bytes: u64,
    /// Each catch-up, in order of start.
    pub catchups: Vec<CatchUp>,
    /// Bytes still owed to the backup when the run ended.
    pub behind_bytes: u64,
    /// The last completed mirrored write (or the start), for stalls.
    last_mirrored: Duration,
}

/// One catch-up: from the first chunk sent again to the moment the backup had every byte it
/// missed (`end`), offsets from the run's start; `end` `None`: not caught up by the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatchUp {
    pub start: Duration,
    pub end: Option<Duration>,
    pub bytes: u64,
}

impl Default for MirrorStats {
    fn default() -> Self {
        MirrorStats {
            mirrored: 0,
            unmirrored: 0,
            local: latency_histogram(),
            network: latency_histogram(),
            remote: latency_histogram(),
            total: latency_histogram(),
            lag: latency_histogram(),
            failovers: Vec::new(),
            recoveries: Vec::new(),
            longest_stall: Duration::ZERO,
            longest_stall_at: Duration::ZERO,
            link_error: String::new(),
            missed_writes: 0,
            missed_bytes: 0,
            catchups: Vec::new(),
            behind_bytes: 0,
            last_mirrored: Duration::ZERO,
        }
    }
}

/// One acknowledged write: when it completed locally and how long that took, when the ack
/// arrived and how long the backup's own write took.
#[derive(Debug, Clone, Copy)]
pub struct Acked {
    pub local_ns: u64,
    pub local_done: Instant,
    pub ack_at: Instant,
    pub remote_ns: u64,
}

impl Acked {
    /// The round trip as the primary sees it (hand-off to ack, injected delay included) minus
    /// the backup's write: what the network and the two agents' plumbing cost.
    pub fn network_ns(&self) -> u64 {
        let rtt = self.ack_at.saturating_duration_since(self.local_done);
        (rtt.as_nanos() as u64).saturating_sub(self.remote_ns)
    }
}

impl MirrorStats {
    /// An ack arrived: the breakdown, and in async mode the lag and the mirror's progress.
    pub fn acked(&mut self, a: &Acked, sync: bool, since_start: Duration) {
        record(&mut self.local, a.local_ns);
        record(&mut self.network, a.network_ns());
        record(&mut self.remote, a.remote_ns);
        if !sync {
            let lag = a.ack_at.saturating_duration_since(a.local_done);
            record(&mut self.lag, lag.as_nanos() as u64);
            self.progress(since_start);
        }
    }

    /// A mirrored write completed for the job (sync: its ack came), `total_ns` as the job
    /// measured it.
    pub fn completed_mirrored(&mut self, total_ns: u64, since_start: Duration) {
        record(&mut self.total, total_ns);
        self.progress(since_start);
    }

    /// A write completed without its ack (async after a fail-over, link down, backup error).
    pub fn completed_unmirrored(&mut self) {
        self.unmirrored += 1;
    }

    /// A write the backup will not acknowledge: its bytes are owed (the catch-up's work).
    pub fn missed(&mut self, len: u64) {
        self.missed_writes += 1;
        self.missed_bytes += len;
    }

    /// A catch-up chunk of `bytes` was sent at `t`: the first one opens a catch-up.
    pub fn catching_up(&mut self, t: Duration, bytes: u64) {
        match self.catchups.last_mut() {
            Some(c) if c.end.is_none() => c.bytes += bytes,
            _ => self.catchups.push(CatchUp {
                start: t,
                end: None,
                bytes,
            }),
        }
    }

    /// The backup has every byte it missed, at `t`: the open catch-up ends.
    pub fn caught_up(&mut self, t: Duration) {
        if let Some(c) = self.catchups.last_mut().filter(|c| c.end.is_none()) {
            c.end = Some(t);
        }
    }

    /// A mirrored write completed at `t`: the gap since the last one may be the longest stall.
    pub fn progress(&mut self, t: Duration) {
        self.mirrored += 1;
        self.gap_to(t);
        self.last_mirrored = self.last_mirrored.max(t);
    }

    /// The run ended at `t`: a stall still going on (a backup that never returned) counts to
    /// here.
    pub fn end(&mut self, t: Duration) {
        if self.mirrored > 0 || self.unmirrored > 0 {
            self.gap_to(t);
        }
    }

    fn gap_to(&mut self, t: Duration) {
        let gap = t.saturating_sub(self.last_mirrored);
        if gap > self.longest_stall {
            self.longest_stall = gap;
            self.longest_stall_at = self.last_mirrored;
        }
    }

    /// Adds another link's figures (the clones of one volume).
    pub fn merge(&mut self, o: &MirrorStats) {
        self.mirrored += o.mirrored;
        self.unmirrored += o.unmirrored;
        for (a, b) in [
            (&mut self.local, &o.local),
            (&mut self.network, &o.network),
            (&mut self.remote, &o.remote),
            (&mut self.total, &o.total),
            (&mut self.lag, &o.lag),
        ] {
            // Same bounds on both sides: cannot fail.
            let _ = a.add(b);
        }
        self.failovers.extend(&o.failovers);
        self.recoveries.extend(&o.recoveries);
        self.failovers.sort();
        self.recoveries.sort();
        if o.longest_stall > self.longest_stall {
            self.longest_stall = o.longest_stall;
            self.longest_stall_at = o.longest_stall_at;
        }
        if self.link_error.is_empty() {
            self.link_error = o.link_error.clone();
        }
        self.missed_writes += o.missed_writes;
        self.missed_bytes += o.missed_bytes;
        self.behind_bytes += o.behind_bytes;
        self.catchups.extend(&o.catchups);
        self.catchups.sort_by_key(|c| c.start);
    }

    /// The wire form sent in the volume's final result.
    pub fn to_wire(&self, backup_agent: &str, sync: bool, delay_us: u64) -> MirrorTotals {
        let enc = |h: &Histogram<u64>| lockstep_proto::histogram::encode(h).unwrap_or_default();
        let ms = |d: &Duration| d.as_millis() as u64;
        MirrorTotals {
            backup_agent: backup_agent.to_string(),
            sync,
            delay_us,
            mirrored: self.mirrored,
            unmirrored: self.unmirrored,
            local_hist: enc(&self.local),
            network_hist: enc(&self.network),
            remote_hist: enc(&self.remote),
            total_hist: enc(&self.total),
            lag_hist: enc(&self.lag),
            longest_stall_ms: ms(&self.longest_stall),
            longest_stall_at_ms: ms(&self.longest_stall_at),
            failover_at_ms: self.failovers.iter().map(ms).collect(),
            recovered_at_ms: self.recoveries.iter().map(ms).collect(),
            link_error: self.link_error.clone(),
            missed_writes: self.missed_writes,
            missed_bytes: self.missed_bytes,
            catchups: self
                .catchups
                .iter()
                .map(|c| MirrorCatchUp {
                    start_ms: ms(&c.start),
                    end_ms: c.end.as_ref().map_or(0, ms),
                    done: c.end.is_some(),
                    bytes: c.bytes,
                })
                .collect(),
            behind_bytes: self.behind_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_is_the_round_trip_minus_the_remote_write() {
        let t = Instant::now();
        let a = Acked {
            local_ns: 200_000,
            local_done: t,
            ack_at: t + Duration::from_micros(1_300),
            remote_ns: 100_000,
        };
        assert_eq!(a.network_ns(), 1_200_000);
        // A remote write longer than the round trip (clocks of two hosts are never compared,
        // but a bogus ack must not wrap around).
        let b = Acked {
            remote_ns: 5_000_000,
            ..a
        };
        assert_eq!(b.network_ns(), 0);
    }

    #[test]
    fn the_longest_stall_is_the_widest_gap_between_mirrored_writes_or_to_the_end() {
        let s = Duration::from_secs;
        let mut m = MirrorStats::default();
        m.progress(s(1));
        m.progress(s(2));
        m.progress(s(7));
        m.progress(s(8));
        assert_eq!((m.longest_stall, m.longest_stall_at), (s(5), s(2)));
        m.end(s(20));
        assert_eq!((m.longest_stall, m.longest_stall_at), (s(12), s(8)));
        assert_eq!(m.mirrored, 4);
    }

    #[test]
    fn a_catch_up_runs_from_its_first_chunk_to_the_last_byte_owed() {
        let s = Duration::from_secs;
        let mut m = MirrorStats::default();
        m.missed(8192);
        m.missed(8192);
        m.catching_up(s(13), 131_072);
        m.catching_up(s(14), 4096);
        m.caught_up(s(15));
        m.caught_up(s(16)); // nothing open: no change
        m.catching_up(s(18), 8192);
        assert_eq!((m.missed_writes, m.missed_bytes), (2, 16_384));
        assert_eq!(
            m.catchups,
            vec![
                CatchUp {
                    start: s(13),
                    end: Some(s(15)),
                    bytes: 135_168
                },
                CatchUp {
                    start: s(18),
                    end: None,
                    bytes: 8192
                },
            ]
        );
        let w = m.to_wire("b", true, 0);
        assert_eq!((w.catchups[0].end_ms, w.catchups[0].done), (15_000, true));
        assert!(!w.catchups[1].done);
    }

    #[test]
    fn merging_two_links_adds_counts_and_keeps_the_worse_stall() {
        let s = Duration::from_secs;
        let mut a = MirrorStats::default();
        a.progress(s(3));
        a.completed_unmirrored();
        let mut b = MirrorStats::default();
        b.progress(s(1));
        b.progress(s(9));
        b.failovers.push(s(4));
        a.merge(&b);
        assert_eq!((a.mirrored, a.unmirrored), (3, 1));
        assert_eq!(a.longest_stall, s(8));
        assert_eq!(a.failovers, vec![s(4)]);
    }
}
