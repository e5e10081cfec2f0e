//! Reporting: one results structure (`RunReport`) and one exporter per format.
//!
//! The measuring code never prints; it fills a `RunReport`, and each format renders it:
//! - `normal`: the human summary, laid out like fio's so fio users can read it line by line;
//! - `fio_json`: fio's `--output-format=json` structure and key names, so fio tooling reads it.
//!
//! The figures both exporters print (group_reporting merging, run groups, runtimes and rates,
//! percentiles, interval statistics, latency and depth distributions) are computed once, below,
//! with fio's rules, so the two formats of one run always agree.

use std::time::{Duration, SystemTime};

use hdrhistogram::Histogram;

use crate::job::{Direction, JobSpec};
use crate::stats::{DirStats, IntervalSummary, JobStats};

pub mod fio_json;
pub mod normal;

/// One job clone (one of `numjobs`) and what it measured.
#[derive(Debug, Clone)]
pub struct JobReport {
    pub spec: JobSpec,
    /// Which of the job's `numjobs` clones this is (0-based).
    pub clone: u32,
    /// fio's group id: a new group begins at each job with `stonewall`.
    pub groupid: u32,
    pub stats: JobStats,
    /// Why the job stopped early, if it did (e.g. "No space left on device writing /x/y").
    pub error: Option<String>,
    /// When the timed part of the job began.
    pub started: SystemTime,
    /// What verification found (`verify=crc32c` jobs that wrote something).
    pub verify: Option<crate::verify::VerifyReport>,
    /// Files of this clone whose last IOs were given up on because the device stopped
    /// answering: left in place, since removing them would wait on the same device.
    pub abandoned: Vec<std::path::PathBuf>,
}

/// A whole standalone run: every job, in job-file order.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub jobs: Vec<JobReport>,
    pub started: SystemTime,
    pub elapsed: Duration,
}

/// The version string reported where fio reports "fio version".
pub fn version_string() -> String {
    format!("lockstep-{}", env!("CARGO_PKG_VERSION"))
}

// ---------------------------------------------------------------------------------------------
// Figures shared by the exporters. Each follows the fio rule named in its doc comment, so the
// normal and the JSON output of one run always agree with each other and with fio's arithmetic.
// ---------------------------------------------------------------------------------------------

/// One entry of fio's results after `group_reporting` merging (fio's `thread_stat`).
#[derive(Debug, Clone)]
pub struct JobGroup {
    /// The first member's name: fio names a merged entry after the first job of the group.
    pub name: String,
    pub groupid: u32,
    /// How many job clones were merged (fio's "jobs=N").
    pub members: u32,
    /// The first member's options: percentile_list, iodepth and description come from it, as in
    /// fio.
    pub spec: JobSpec,
    /// Members merged with `JobStats::merge`: histograms add exactly, never averaged.
    pub stats: JobStats,
    /// Sum of the members' runtimes: fio's `total_run_time`, the base of the usr/sys cpu
    /// percentages (so a group's cpu% is the average per member, as fio prints it).
    pub total_runtime: Duration,
    /// The first member's error, as fio keeps the first error of a group.
    pub error: Option<String>,
    /// When the first member's timed part began.
    pub started: SystemTime,
}

/// Merges jobs into report entries the way fio's `__show_run_stats` does: walking the jobs in
/// order, a job joins the previous entry when it has `group_reporting` set and the same groupid
/// as the job before it; otherwise it starts a new entry. So `numjobs` clones of a job with
/// `group_reporting` become one entry named after the first clone, and a `stonewall` (new
/// groupid) always starts a new entry.
pub fn group_jobs(jobs: &[JobReport]) -> Vec<JobGroup> {
    let mut out: Vec<JobGroup> = Vec::new();
    let mut last_groupid = None;
    for job in jobs {
        let joins = job.spec.group_reporting && last_groupid == Some(job.groupid);
        last_groupid = Some(job.groupid);
        match out.last_mut() {
            Some(group) if joins => {
                group.stats.merge(&job.stats);
                group.members += 1;
                group.total_runtime += job.stats.runtime;
                if group.error.is_none() {
                    group.error = job.error.clone();
                }
            }
            _ => out.push(JobGroup {
                name: job.spec.name.clone(),
                groupid: job.groupid,
                members: 1,
                spec: job.spec.clone(),
                stats: job.stats.clone(),
                total_runtime: job.stats.runtime,
                error: job.error.clone(),
                started: job.started,
            }),
        }
    }
    out
}

/// One direction of fio's `group_run_stats`: the "Run status group N" line and the base of
/// `bw_agg` / `per=`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunGroupDir {
    pub io_bytes: u64,
    /// All the group's bytes over its longest runtime, in bytes/s (fio's `agg`).
    pub agg_bw: u64,
    /// Slowest and fastest entry, in bytes/s.
    pub min_bw: u64,
    pub max_bw: u64,
    pub min_run_ms: u64,
    pub max_run_ms: u64,
}

impl RunGroupDir {
    /// fio prints a direction's line only when some entry of the group did IO in it.
    pub fn active(&self) -> bool {
        self.max_run_ms > 0
    }
}

/// fio's "Run status group": the entries (after merging) of one groupid, summed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunGroup {
    pub groupid: u32,
    pub dirs: [RunGroupDir; 2],
}

/// Sums entries into run groups, ordered by groupid, with fio's arithmetic: bandwidths are
/// integer bytes/s over each entry's direction runtime, and the aggregate divides all bytes by
/// the longest runtime.
pub fn run_groups(groups: &[JobGroup]) -> Vec<RunGroup> {
    let mut by_id: std::collections::BTreeMap<u32, [RunGroupDir; 2]> = Default::default();
    for g in groups {
        let dirs = by_id.entry(g.groupid).or_default();
        for dir in Direction::ALL {
            let d = &g.stats.dirs[dir as usize];
            let run = dir_runtime_ms(d, g.stats.runtime);
            if run == 0 {
                continue;
            }
            let rd = &mut dirs[dir as usize];
            let bw = bw_bytes(d.bytes, run);
            if rd.max_run_ms == 0 {
                rd.min_run_ms = run;
                rd.min_bw = bw;
            }
            rd.min_run_ms = rd.min_run_ms.min(run);
            rd.max_run_ms = rd.max_run_ms.max(run);
            rd.min_bw = rd.min_bw.min(bw);
            rd.max_bw = rd.max_bw.max(bw);
            rd.io_bytes += d.bytes;
        }
    }
    by_id
        .into_iter()
        .map(|(groupid, mut dirs)| {
            for rd in &mut dirs {
                if rd.max_run_ms > 0 {
                    rd.agg_bw = bw_bytes(rd.io_bytes, rd.max_run_ms);
                }
            }
            RunGroup { groupid, dirs }
        })
        .collect()
}

/// A direction's runtime in whole milliseconds, as fio keeps `runtime[ddir]`: the timed part
/// rounded up from microseconds, and 0 when the direction moved no bytes (fio only updates the
/// runtime of a direction with `io_bytes`). At least 1 ms when bytes moved, so rates stay
/// finite for a job shorter than a microsecond.
pub fn dir_runtime_ms(d: &DirStats, runtime: Duration) -> u64 {
    if d.bytes == 0 {
        return 0;
    }
    (runtime.as_micros().div_ceil(1000) as u64).max(1)
}

/// fio's integer bandwidth: `1000 * bytes / runtime_ms` bytes/s (0 without runtime).
pub fn bw_bytes(bytes: u64, runtime_ms: u64) -> u64 {
    if runtime_ms == 0 {
        return 0;
    }
    (bytes as u128 * 1000 / runtime_ms as u128) as u64
}

/// fio's IOPS: `1000.0 * total_ios / runtime_ms` (0 without runtime).
pub fn iops(ios: u64, runtime_ms: u64) -> f64 {
    if runtime_ms == 0 {
        return 0.0;
    }
    1000.0 * ios as f64 / runtime_ms as f64
}

/// min/max/mean/stddev of a latency histogram, in ns, the figures fio prints for slat, clat
/// and lat. From the histogram, so each is within its 0.1% bucket error of the exact figure: min
/// is the lowest and max the highest value equivalent to the recorded extremes (so max is never
/// below a percentile), and the mean and stddev weigh each bucket at its midpoint. The stddev is
/// the sample one (n − 1), as fio's `calc_lat` computes it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LatStats {
    pub min: u64,
    pub max: u64,
    pub mean: f64,
    pub stddev: f64,
    pub n: u64,
}

pub fn lat_summary(h: &Histogram<u64>) -> LatStats {
    let n = h.len();
    if n == 0 {
        return LatStats::default();
    }
    let stddev = if n > 1 {
        h.stdev() * (n as f64 / (n - 1) as f64).sqrt()
    } else {
        0.0
    };
    LatStats {
        min: h.min(),
        max: h.max(),
        mean: h.mean(),
        stddev,
        n,
    }
}

/// fio's handling of `percentile_list`: sorted ascending (fio qsorts it), only values in
/// (0, 100], at most 20 (`FIO_IO_U_LIST_MAX_LEN`).
pub fn percentile_list(list: &[f64]) -> Vec<f64> {
    let mut out: Vec<f64> = list
        .iter()
        .copied()
        .filter(|p| *p > 0.0 && *p <= 100.0)
        .collect();
    out.sort_by(f64::total_cmp);
    out.truncate(20);
    out
}

/// The value at each percentile of `list` (already normalized by `percentile_list`), with fio's
/// rule: the first value whose cumulative count reaches `p / 100 * N`. Reported as the highest
/// value equivalent to that bucket, so it is at most 0.1% above the true sample. The threshold
/// is computed as `p * N / 100` and allowed a 1e-9 slack, so that 99.9% of 1000 samples is the
/// 999th sample and not the 1000th through a floating-point rounding of 0.999 * 1000.
pub fn percentiles(h: &Histogram<u64>, list: &[f64]) -> Vec<(f64, u64)> {
    let n = h.len();
    if n == 0 {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(list.len());
    let mut want = list.iter().copied().peekable();
    let mut seen = 0u64;
    for v in h.iter_recorded() {
        seen += v.count_at_value();
        while let Some(&p) = want.peek() {
            let threshold = (p * n as f64 / 100.0 - 1e-9).ceil().max(1.0);
            if (seen as f64) < threshold {
                break;
            }
            out.push((p, h.highest_equivalent(v.value_iterated_to())));
            want.next();
        }
    }
    // Percentiles at 100% of a histogram whose count is reached above are all pushed; any left
    // over (cannot happen for p <= 100) report the maximum.
    for p in want {
        out.push((p, h.max()));
    }
    out
}

/// The decimals fio shows for percentiles: as many as the most precise entry of the list has
/// (fio counts the digits after the period when parsing `percentile_list`), at most 6.
pub fn percentile_precision(list: &[f64]) -> usize {
    list.iter()
        .map(|p| {
            let s = format!("{p}");
            s.split_once('.').map_or(0, |(_, frac)| frac.len()).min(6)
        })
        .max()
        .unwrap_or(0)
}

/// One direction's per-interval rate figures (fio's `bw_stat` / `iops_stat`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RateStats {
    pub min: u64,
    pub max: u64,
    pub mean: f64,
    /// Sample standard deviation (n − 1), as fio's `calc_lat` computes it.
    pub stddev: f64,
    pub samples: u64,
}

impl RateStats {
    fn from_samples(samples: &[u64]) -> Self {
        if samples.is_empty() {
            return RateStats::default();
        }
        let n = samples.len() as f64;
        let mean = samples.iter().map(|&s| s as f64).sum::<f64>() / n;
        let stddev = if samples.len() > 1 {
            let ss: f64 = samples.iter().map(|&s| (s as f64 - mean).powi(2)).sum();
            (ss / (n - 1.0)).sqrt()
        } else {
            0.0
        };
        RateStats {
            min: *samples.iter().min().unwrap_or(&0),
            max: *samples.iter().max().unwrap_or(&0),
            mean,
            stddev,
            samples: samples.len() as u64,
        }
    }
}

/// Bandwidth (KiB/s) and IOPS statistics of one direction over the job's intervals, as fio's
/// `bw_min`..`bw_samples` and `iops_min`..`iops_samples`. Each sample is an integer rate over
/// one interval (fio truncates its samples the same way). A direction that did no IO has no
/// samples (fio reports 0 samples for it); one that did counts every interval, including ones
/// where it stalled at zero, because a stall is a measurement. A last interval shorter than half
/// the longest one is left out, as fio only samples whole `bw_avg_time` periods: a rate over a
/// few milliseconds of tail would be noise.
pub fn interval_rates(intervals: &[IntervalSummary], dir: Direction) -> (RateStats, RateStats) {
    let d = dir as usize;
    if intervals.iter().all(|iv| iv.ios[d] == 0) {
        return (RateStats::default(), RateStats::default());
    }
    let longest = intervals.iter().map(|iv| iv.len).max().unwrap_or_default();
    let mut bw = Vec::with_capacity(intervals.len());
    let mut io = Vec::with_capacity(intervals.len());
    for iv in intervals {
        let us = iv.len.as_micros();
        if us == 0 || iv.len * 2 < longest {
            continue;
        }
        bw.push((iv.bytes[d] as u128 * 1_000_000 / us / 1024) as u64);
        io.push((iv.ios[d] as u128 * 1_000_000 / us) as u64);
    }
    (RateStats::from_samples(&bw), RateStats::from_samples(&io))
}

/// fio's `per=` / `bw_agg`: the entry's mean bandwidth as a percentage of its group's aggregate,
/// capped at 100, and 100 when the aggregate is at most 1 KiB/s (`convert_agg_kbytes_percent`,
/// which also truncates the mean to an integer first).
pub fn agg_percent(mean_kib: f64, group_agg_bw: u64) -> f64 {
    if group_agg_bw <= 1024 {
        return 100.0;
    }
    let mean = mean_kib.trunc();
    (mean * 100.0 / (group_agg_bw as f64 / 1024.0)).min(100.0)
}

/// fio's completion-latency distribution (`latency_ns`, `latency_us`, `latency_ms` in JSON and
/// the "lat (nsec)/(usec)/(msec)" lines), as percentages of the IOs whose completion latency was
/// measured, both directions together. Bucket `i` of each unit holds values from the previous
/// label up to (excluding) label `i`; a non-empty bucket below 0.01% shows 0.01% (fio's
/// `stat_calc_lat`). A value is placed by the lowest value of its histogram bucket, so a value
/// within 0.1% above a label may be counted below it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LatencyBuckets {
    pub ns: [f64; 10],
    pub us: [f64; 10],
    pub ms: [f64; 12],
}

/// Labels of the ns and us buckets (fio's ranges).
pub const LAT_LABELS: [&str; 10] = [
    "2", "4", "10", "20", "50", "100", "250", "500", "750", "1000",
];
/// Labels of the ms buckets; the last is everything from 2 s.
pub const LAT_MS_LABELS: [&str; 12] = [
    "2", "4", "10", "20", "50", "100", "250", "500", "750", "1000", "2000", ">=2000",
];

pub fn latency_buckets(stats: &JobStats) -> LatencyBuckets {
    const BOUNDS: [u64; 11] = [2, 4, 10, 20, 50, 100, 250, 500, 750, 1000, 2000];
    let bucket = |v: u64, n: usize| BOUNDS[..n].iter().position(|&b| v < b).unwrap_or(n);
    let mut counts = ([0u64; 10], [0u64; 10], [0u64; 12]);
    let mut total = 0u64;
    for d in &stats.dirs {
        for v in d.clat.iter_recorded() {
            let ns = d.clat.lowest_equivalent(v.value_iterated_to());
            let c = v.count_at_value();
            total += c;
            if ns < 1_000 {
                counts.0[bucket(ns, 10).min(9)] += c;
            } else if ns < 1_000_000 {
                counts.1[bucket(ns / 1_000, 10).min(9)] += c;
            } else {
                counts.2[bucket(ns / 1_000_000, 11)] += c;
            }
        }
    }
    let pct = |c: u64| {
        if total == 0 {
            return 0.0;
        }
        let p = c as f64 * 100.0 / total as f64;
        if p < 0.01 && c > 0 { 0.01 } else { p }
    };
    LatencyBuckets {
        ns: counts.0.map(pct),
        us: counts.1.map(pct),
        ms: counts.2.map(pct),
    }
}

/// fio's "IO depths" distribution (`iodepth_level`): each bucket of `JobStats::depth_hist` as a
/// percentage of all submissions counted there, a non-empty bucket below 0.1% showing 0.1%
/// (fio's `stat_calc_dist`).
pub fn depth_distribution(hist: &[u64; 7]) -> [f64; 7] {
    let total: u64 = hist.iter().sum();
    hist.map(|c| {
        if total == 0 {
            return 0.0;
        }
        let p = c as f64 * 100.0 / total as f64;
        if p < 0.1 && c > 0 { 0.1 } else { p }
    })
}

/// CPU time as a percentage of the entry's summed runtime (fio: `usr_time * 100 /
/// total_run_time`, both in ms), so 100% is one core busy for the whole run of each member.
pub fn cpu_percent(cpu: Duration, total_runtime: Duration) -> f64 {
    let run = total_runtime.as_millis();
    if run == 0 {
        return 0.0;
    }
    cpu.as_millis() as f64 * 100.0 / run as f64
}

/// An errno-like code for a job's error message, for fio's integer "error" field: the code of
/// the OS error when the message carries one ("... (os error 28) ..."), EILSEQ for a verify
/// failure (the code fio's verify reports), EIO otherwise. Never 0, which would mean success.
pub fn error_code(message: &str) -> i32 {
    const EIO: i32 = 5;
    const EILSEQ: i32 = 84;
    const ETIMEDOUT: i32 = 110;
    let os_code = message.split_once("(os error ").and_then(|(_, rest)| {
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<i32>().ok().filter(|&c| c != 0)
    });
    if let Some(code) = os_code {
        return code;
    }
    if message.to_ascii_lowercase().contains("verif") {
        return EILSEQ;
    }
    if message.contains("stopped answering") {
        return ETIMEDOUT;
    }
    EIO
}

/// Seconds since the Unix epoch (0 for a time before it).
pub fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Milliseconds since the Unix epoch (0 for a time before it).
pub fn unix_millis(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The local time zone's offset from UTC at `t`, in seconds (0 if the C library cannot tell).
/// fio prints local times (`ctime_r`); the exporters take the offset as a parameter so that
/// tests are independent of the machine's time zone.
pub fn local_utc_offset(t: SystemTime) -> i64 {
    let secs = unix_secs(t) as libc::time_t;
    // SAFETY: localtime_r only writes the `tm` we own; a zeroed tm is a valid initial value.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let ok = unsafe { !libc::localtime_r(&secs, &mut tm).is_null() };
    if ok { tm.tm_gmtoff as i64 } else { 0 }
}

/// `t` as C's `ctime` shows it, without the trailing newline: "Tue Nov 14 22:13:20 2023", the
/// form of fio's "time" field and of the date on each job's first line.
pub fn ctime(t: SystemTime, utc_offset_secs: i64) -> String {
    const DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs = unix_secs(t) as i64 + utc_offset_secs;
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's days_from_civil, inverted).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    // 1970-01-01 was a Thursday.
    let weekday = (days + 4).rem_euclid(7);
    format!(
        "{} {} {:2} {:02}:{:02}:{:02} {}",
        DAYS[weekday as usize],
        MONTHS[(month - 1) as usize],
        day,
        sod / 3600,
        sod % 3600 / 60,
        sod % 60,
        year
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::Origin;
    use crate::stats::{latency_histogram, record};

    fn job(name: &str, groupid: u32, group_reporting: bool, ios: u64) -> JobReport {
        let mut spec = JobSpec::with_defaults(name, Origin::default());
        spec.group_reporting = group_reporting;
        let mut stats = JobStats::new(false);
        stats.runtime = Duration::from_secs(1);
        stats.dirs[0].ios = ios;
        stats.dirs[0].bytes = ios * 4096;
        for v in 0..ios {
            record(&mut stats.dirs[0].clat, 100 + v);
        }
        JobReport {
            spec,
            clone: 0,
            groupid,
            stats,
            error: None,
            started: SystemTime::UNIX_EPOCH,
            verify: None,
            abandoned: Vec::new(),
        }
    }

    #[test]
    fn group_reporting_merges_consecutive_jobs_of_a_group_like_fio() {
        let jobs = vec![
            job("a", 0, true, 10),
            job("a", 0, true, 20),
            job("b", 1, true, 5),
            job("c", 1, false, 7),
            job("d", 1, true, 1),
        ];
        let groups = group_jobs(&jobs);
        let names: Vec<_> = groups
            .iter()
            .map(|g| (g.name.as_str(), g.members))
            .collect();
        // "d" joins the entry of "c": fio merges on the job's own flag and the previous groupid.
        assert_eq!(names, [("a", 2), ("b", 1), ("c", 2)]);
        assert_eq!(groups[0].stats.dirs[0].ios, 30);
        assert_eq!(groups[0].stats.dirs[0].clat.len(), 30);
        assert_eq!(groups[0].total_runtime, Duration::from_secs(2));

        let runs = run_groups(&groups);
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[1].dirs[0].io_bytes, 13 * 4096);
        assert_eq!(runs[1].dirs[0].min_bw, 5 * 4096);
        assert_eq!(runs[1].dirs[0].max_bw, 8 * 4096);
        assert_eq!(runs[1].dirs[0].agg_bw, 13 * 4096);
        assert!(!runs[1].dirs[1].active());
    }

    #[test]
    fn percentiles_follow_fios_rank_rule_exactly_below_2048ns() {
        let mut h = latency_histogram();
        for v in 1..=1000 {
            record(&mut h, v);
        }
        let list = percentile_list(&[99.9, 50.0, 0.0, 99.0, 1.0, 100.0]);
        assert_eq!(list, [1.0, 50.0, 99.0, 99.9, 100.0]);
        let got = percentiles(&h, &list);
        assert_eq!(
            got,
            [
                (1.0, 10),
                (50.0, 500),
                (99.0, 990),
                (99.9, 999),
                (100.0, 1000)
            ]
        );
        let s = lat_summary(&h);
        assert_eq!((s.min, s.max, s.n), (1, 1000, 1000));
        assert!((s.mean - 500.5).abs() < 1e-9);
        // Sample standard deviation of 1..=1000: sqrt(1000 * 1001 / 12).
        assert!((s.stddev - (1000.0f64 * 1001.0 / 12.0).sqrt()).abs() < 1e-6);
    }

    #[test]
    fn percentile_rank_is_immune_to_float_rounding() {
        // 99.9 * 41000 / 100 is 40959.00000000001 in f64: without care the rank becomes 40960.
        let mut h = latency_histogram();
        for v in 1..=1000 {
            for _ in 0..41 {
                record(&mut h, v);
            }
        }
        // The 40959th sample is the last of the 41 copies of 999.
        assert_eq!(percentiles(&h, &[99.9]), [(99.9, 999)]);
    }

    #[test]
    fn percentile_precision_counts_decimals_like_fio() {
        assert_eq!(percentile_precision(&crate::job::DEFAULT_PERCENTILES), 2);
        assert_eq!(percentile_precision(&[50.0, 99.0]), 0);
        assert_eq!(percentile_precision(&[50.0, 99.999]), 3);
    }

    #[test]
    fn interval_rates_skip_a_short_tail_and_keep_stalls() {
        let iv = |ms: u64, ios: u64| IntervalSummary {
            len: Duration::from_millis(ms),
            ios: [ios, 0],
            bytes: [ios * 4096, 0],
            ..Default::default()
        };
        let ivs = [iv(1000, 1000), iv(1000, 0), iv(1000, 500), iv(200, 999)];
        let (bw, io) = interval_rates(&ivs, Direction::Read);
        assert_eq!((io.min, io.max, io.samples), (0, 1000, 3));
        assert!((io.mean - 500.0).abs() < 1e-9);
        assert!((io.stddev - 500.0).abs() < 1e-9);
        assert_eq!((bw.min, bw.max), (0, 4000));
        let (bw, io) = interval_rates(&ivs, Direction::Write);
        assert_eq!((bw.samples, io.samples), (0, 0));
    }

    #[test]
    fn latency_buckets_use_fios_ranges() {
        let mut stats = JobStats::new(false);
        for ns in [1, 3, 999, 1_000, 1_999, 5_000_000, 3_000_000_000] {
            record(&mut stats.dirs[0].clat, ns);
        }
        record(&mut stats.dirs[1].clat, 600);
        let b = latency_buckets(&stats);
        let eighth = 100.0 / 8.0;
        assert_eq!(b.ns[0], eighth); // 1 ns: below 2
        assert_eq!(b.ns[1], eighth); // 3 ns: 2..4
        assert_eq!(b.ns[8], eighth); // 600 ns: 500..750
        assert_eq!(b.ns[9], eighth); // 999 ns
        assert_eq!(b.us[0], 2.0 * eighth); // 1.000 and 1.999 us: below 2
        assert_eq!(b.ms[2], eighth); // 5 ms: 4..10
        assert_eq!(b.ms[11], eighth); // 3 s: >= 2000
    }

    #[test]
    fn error_codes_are_errno_like_and_never_zero() {
        assert_eq!(
            error_code("No space left on device (os error 28) writing /x"),
            28
        );
        assert_eq!(
            error_code("verify failed at offset 4096: crc32c mismatch"),
            84
        );
        assert_eq!(error_code("something odd"), 5);
    }

    #[test]
    fn ctime_matches_c() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(ctime(t, 0), "Tue Nov 14 22:13:20 2023");
        assert_eq!(ctime(t, 3600), "Tue Nov 14 23:13:20 2023");
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(ctime(t, 0), "Tue Feb 29 00:00:00 2000");
        assert_eq!(ctime(SystemTime::UNIX_EPOCH, 0), "Thu Jan  1 00:00:00 1970");
    }

    #[test]
    fn depth_distribution_rounds_up_tiny_buckets() {
        let d = depth_distribution(&[0, 1, 0, 0, 0, 0, 9999]);
        assert_eq!(d[1], 0.1);
        assert!((d[6] - 99.99).abs() < 1e-9);
    }
}
