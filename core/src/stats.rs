//! What a job measured: per-direction latency histograms, counters, and per-interval figures.
//!
//! Latencies are recorded in nanoseconds into HdrHistograms with 3 significant digits: any
//! reported percentile is within 0.1% of the true value of the recorded samples (HdrHistogram's
//! guarantee), and histograms from many jobs, volumes or nodes merge exactly by adding counts.
//! No raw samples are kept, so memory does not grow with the run's length.

use std::time::Duration;

use hdrhistogram::Histogram;

/// Significant digits of every latency histogram: relative error at most 10^-3.
pub const LATENCY_SIGFIG: u8 = 3;
/// Highest trackable latency (1 hour). A slower IO is recorded as this value (saturated) and
/// counted in `DirStats::saturated` so that it is never silently lost.
pub const LATENCY_MAX_NS: u64 = 3_600_000_000_000;

/// A latency histogram in nanoseconds with lockstep's fixed precision and range.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_NS, LATENCY_SIGFIG)
        .expect("constant histogram bounds are valid")
}

/// Records `ns` and saturates at the top of the range instead of failing.
#[inline]
pub fn record(h: &mut Histogram<u64>, ns: u64) -> bool {
    let v = ns.clamp(1, LATENCY_MAX_NS);
    // Cannot fail: v is within the bounds the histogram was made with.
    let _ = h.record(v);
    ns > LATENCY_MAX_NS
}

/// One direction of one job (or of a merged group).
#[derive(Debug, Clone)]
pub struct DirStats {
    /// IOs that completed (with or without error).
    pub ios: u64,
    /// Bytes transferred by IOs that completed without error.
    pub bytes: u64,
    /// IOs that completed with an error.
    pub errors: u64,
    /// IOs that transferred fewer bytes than asked.
    pub short_ios: u64,
    /// Latencies beyond `LATENCY_MAX_NS`, recorded as the maximum.
    pub saturated: u64,
    /// Submission latency: from the moment the IO was ready to the moment the kernel took it.
    pub slat: Histogram<u64>,
    /// Completion latency: from submission to completion.
    pub clat: Histogram<u64>,
    /// Total latency from the actual issue: slat + clat.
    pub lat: Histogram<u64>,
    /// In open-loop (rate) mode: latency from the *intended* issue time, so time spent waiting
    /// behind a slow IO counts (no coordinated omission). `None` when no rate is set.
    pub lat_intended: Option<Histogram<u64>>,
}

impl DirStats {
    pub fn new(open_loop: bool) -> Self {
        DirStats {
            ios: 0,
            bytes: 0,
            errors: 0,
            short_ios: 0,
            saturated: 0,
            slat: latency_histogram(),
            clat: latency_histogram(),
            lat: latency_histogram(),
            lat_intended: open_loop.then(latency_histogram),
        }
    }

    /// Adds another direction's figures: counts add and histograms merge exactly.
    pub fn merge(&mut self, other: &DirStats) {
        self.ios += other.ios;
        self.bytes += other.bytes;
        self.errors += other.errors;
        self.short_ios += other.short_ios;
        self.saturated += other.saturated;
        // Same bounds on both sides, so `add` cannot fail.
        let _ = self.slat.add(&other.slat);
        let _ = self.clat.add(&other.clat);
        let _ = self.lat.add(&other.lat);
        match (&mut self.lat_intended, &other.lat_intended) {
            (Some(a), Some(b)) => {
                let _ = a.add(b);
            }
            (None, Some(b)) => self.lat_intended = Some(b.clone()),
            _ => {}
        }
    }

    pub fn reset(&mut self) {
        self.ios = 0;
        self.bytes = 0;
        self.errors = 0;
        self.short_ios = 0;
        self.saturated = 0;
        // Resetting clears the whole counts array (270 KiB each at these bounds), on the IO
        // thread at every interval: skip the histograms that recorded nothing (the direction a
        // job does not do, lat_intended in closed loop).
        for h in [&mut self.slat, &mut self.clat, &mut self.lat]
            .into_iter()
            .chain(self.lat_intended.as_mut())
        {
            if !h.is_empty() {
                h.reset();
            }
        }
    }
}

/// fsync/fdatasync calls: fio reports them under "sync".
#[derive(Debug, Clone)]
pub struct SyncStats {
    pub ios: u64,
    pub lat: Histogram<u64>,
}

impl Default for SyncStats {
    fn default() -> Self {
        SyncStats {
            ios: 0,
            lat: latency_histogram(),
        }
    }
}

/// Figures for one reporting interval (default 1 s) of one job. Kept for the whole run (a few
/// dozen bytes each) so that fio's bw/iops min/max/mean/stddev can be computed at the end.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct IntervalSummary {
    /// End of the interval, measured from the start of the timed part of the job.
    pub end: Duration,
    /// Length of the interval (the last one may be short).
    pub len: Duration,
    pub ios: [u64; 2],
    pub bytes: [u64; 2],
    pub errors: [u64; 2],
    /// Time-averaged number of IOs in flight during the interval, as fio counts them: from
    /// issue until the job handles the completion.
    pub outstanding: f64,
    /// Of those, the time-averaged number already finished and waiting for the job to handle
    /// them (`iodepth_batch_complete_max` below the depth): `outstanding - waiting` is what
    /// the device had to work on.
    #[serde(default)]
    pub waiting: f64,
}

/// An IO that took longer than the job's `stuck_timeout` (or was still in flight after it).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StuckIo {
    pub file: String,
    pub offset: u64,
    pub len: u32,
    pub direction: crate::job::Direction,
    /// When it was issued, ms since the job's start (the run's synchronized start in a cluster).
    pub start_ms: u64,
    /// From issue to completion; for an IO still in flight, up to when it was last seen.
    pub latency_ms: u64,
    pub completed: bool,
}

/// Stuck IOs listed per job clone; beyond it they are only counted (`JobStats::stuck_count`).
pub const STUCK_LIMIT: usize = 100;

/// fio's "IO depths" buckets: 1, 2, 4, 8, 16, 32, >=64.
pub const DEPTH_BUCKETS: [u32; 7] = [1, 2, 4, 8, 16, 32, 64];

/// Everything one job measured in its timed part (after `ramp_time`).
#[derive(Debug, Clone)]
pub struct JobStats {
    pub dirs: [DirStats; 2],
    pub sync: SyncStats,
    /// Wall time of the timed part.
    pub runtime: Duration,
    /// Outstanding IOs seen at each submission, bucketed as `DEPTH_BUCKETS`.
    pub depth_hist: [u64; 7],
    /// CPU time of the job's thread, user and system.
    pub usr_cpu: Duration,
    pub sys_cpu: Duration,
    /// Context switches (voluntary + involuntary), minor and major faults of the job's thread.
    pub ctx: u64,
    pub minf: u64,
    pub majf: u64,
    pub intervals: Vec<IntervalSummary>,
    /// The first `STUCK_LIMIT` stuck IOs, and how many there were in all.
    pub stuck: Vec<StuckIo>,
    pub stuck_count: u64,
    /// Errors counted under `continue_on_error` (fio's `total_err` and `first_error`); the
    /// per-direction `errors` count every failed IO whatever the policy.
    pub errors: crate::job::errpolicy::ErrorCount,
}

impl JobStats {
    pub fn new(open_loop: bool) -> Self {
        JobStats {
            dirs: [DirStats::new(open_loop), DirStats::new(open_loop)],
            sync: SyncStats::default(),
            runtime: Duration::ZERO,
            depth_hist: [0; 7],
            usr_cpu: Duration::ZERO,
            sys_cpu: Duration::ZERO,
            ctx: 0,
            minf: 0,
            majf: 0,
            intervals: Vec::new(),
            stuck: Vec::new(),
            stuck_count: 0,
            errors: Default::default(),
        }
    }

    /// Merges another job's stats into this one (fio's `group_reporting`). Runtimes take the
    /// longest; intervals are summed by index, since the jobs of a group start together.
    pub fn merge(&mut self, other: &JobStats) {
        for d in 0..2 {
            self.dirs[d].merge(&other.dirs[d]);
        }
        self.sync.ios += other.sync.ios;
        let _ = self.sync.lat.add(&other.sync.lat);
        self.runtime = self.runtime.max(other.runtime);
        for (a, b) in self.depth_hist.iter_mut().zip(other.depth_hist) {
            *a += b;
        }
        self.usr_cpu += other.usr_cpu;
        self.sys_cpu += other.sys_cpu;
        self.ctx += other.ctx;
        self.minf += other.minf;
        self.majf += other.majf;
        let room = STUCK_LIMIT.saturating_sub(self.stuck.len());
        self.stuck.extend(other.stuck.iter().take(room).cloned());
        self.stuck_count += other.stuck_count;
        self.errors.merge(&other.errors);
        for (i, iv) in other.intervals.iter().enumerate() {
            if let Some(mine) = self.intervals.get_mut(i) {
                for d in 0..2 {
                    mine.ios[d] += iv.ios[d];
                    mine.bytes[d] += iv.bytes[d];
                    mine.errors[d] += iv.errors[d];
                }
                mine.outstanding += iv.outstanding;
                mine.waiting += iv.waiting;
            } else {
                self.intervals.push(iv.clone());
            }
        }
    }
}

/// Bucket index in `DEPTH_BUCKETS` for `depth` outstanding IOs, as fio counts them.
pub fn depth_bucket(depth: u32) -> usize {
    DEPTH_BUCKETS.iter().rposition(|&b| depth >= b).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merging_adds_counts_and_keeps_exact_percentiles() {
        let mut a = DirStats::new(false);
        let mut b = DirStats::new(false);
        for v in 1..=1000u64 {
            record(&mut a.clat, v * 1000);
        }
        for v in 1001..=2000u64 {
            record(&mut b.clat, v * 1000);
        }
        a.ios = 1000;
        b.ios = 1000;
        a.merge(&b);
        assert_eq!(a.ios, 2000);
        assert_eq!(a.clat.len(), 2000);
        let p50 = a.clat.value_at_quantile(0.5) as f64;
        assert!((p50 - 1_000_000.0).abs() / 1_000_000.0 < 1e-3, "p50 {p50}");
    }

    #[test]
    fn reset_empties_recorded_histograms_and_skips_empty_ones() {
        let mut a = DirStats::new(true);
        record(&mut a.clat, 5_000);
        record(a.lat_intended.as_mut().unwrap(), 7_000);
        a.ios = 1;
        a.reset();
        assert_eq!(a.ios, 0);
        assert!(a.clat.is_empty() && a.slat.is_empty() && a.lat.is_empty());
        assert!(a.lat_intended.as_ref().unwrap().is_empty());
        record(&mut a.clat, 9_000);
        assert_eq!(a.clat.max(), a.clat.highest_equivalent(9_000));
        assert_eq!(a.clat.min(), a.clat.lowest_equivalent(9_000));
    }

    #[test]
    fn saturates_instead_of_failing() {
        let mut h = latency_histogram();
        assert!(record(&mut h, LATENCY_MAX_NS * 2));
        assert!(!record(&mut h, 0));
        assert_eq!(h.len(), 2);
    }

    #[test]
    fn depth_buckets_match_fio() {
        assert_eq!(depth_bucket(0), 0);
        assert_eq!(depth_bucket(1), 0);
        assert_eq!(depth_bucket(3), 1);
        assert_eq!(depth_bucket(32), 5);
        assert_eq!(depth_bucket(63), 5);
        assert_eq!(depth_bucket(200), 6);
    }
}
