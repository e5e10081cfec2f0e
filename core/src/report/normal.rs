//! Normal (human) exporter: fio's default output, line by line, so a fio user reads a lockstep
//! report without learning a new layout.
//!
//! Every line follows fio 3.x's `stat.c` (`show_thread_status_normal`, `show_ddir_status`,
//! `display_lat`, `show_clat_percentiles`, `show_group_stats`) and its number formatting
//! (`num2str`: 4 significant figures, binary units first, SI units in parentheses). What lockstep
//! adds is on lines of its own, never inside a fio line, so scripts that parse fio's lines keep
//! working:
//! - open-loop jobs get "lat from intended issue" (latency from the intended issue time, without
//!   coordinated omission) beside fio's " lat", with its own percentiles;
//! - each job gets a "queue" line: the IOs in flight it measured against Little's law
//!   (IOPS × latency) and the configured depth, and a note when the load generator, not the
//!   target, kept the queue short.
//!
//! Not printed, because lockstep does not measure them: fio's "submit"/"complete" batch lines
//! and "Disk stats".

use std::time::SystemTime;

use hdrhistogram::Histogram;

use super::{
    JobGroup, LAT_LABELS, LAT_MS_LABELS, LatStats, RunGroup, RunGroupDir, RunReport, agg_percent,
    bw_bytes, cpu_percent, ctime, depth_distribution, dir_runtime_ms, error_code, group_jobs,
    interval_rates, lat_summary, latency_buckets, local_utc_offset, percentile_list,
    percentile_precision, percentiles, run_groups, version_string,
};
use crate::job::{BlockSizes, Direction, EngineKind, JobSpec};
use crate::stats::JobStats;

/// fio's default `sig_figs`: every size and rate shows at most 4 digits.
const SIG_FIGS: usize = 4;

/// The report as fio's normal output: one header line per job as fio prints it before the run,
/// the version line, then one block per entry (after `group_reporting` merging) and one "Run
/// status group" block per stonewall group.
pub fn render(report: &RunReport) -> String {
    let end = report.started + report.elapsed;
    let env = Env {
        pid: std::process::id(),
        utc_offset: local_utc_offset(end),
        now: end,
    };
    render_with(report, &env)
}

/// What fio prints that is not in the report: the process id and the local time of day. Kept
/// apart so tests render deterministically.
struct Env {
    pid: u32,
    utc_offset: i64,
    /// fio dates each job block with the time the report is printed.
    now: SystemTime,
}

fn render_with(report: &RunReport, env: &Env) -> String {
    let mut out = String::new();
    for job in report.jobs.iter().filter(|j| j.clone == 0) {
        out.push_str(&header_line(&job.spec, job.groupid));
        if job.spec.numjobs > 1 {
            out.push_str("...\n");
        }
    }
    out.push_str(&version_string());
    out.push('\n');
    let groups = group_jobs(&report.jobs);
    let runs = run_groups(&groups);
    out.push('\n');
    for g in &groups {
        let run = runs.iter().find(|r| r.groupid == g.groupid);
        job_block(g, run, env, &mut out);
    }
    for r in &runs {
        group_status(r, &mut out);
    }
    out
}

/// fio's line for a job before the run: "name: (g=0): rw=read, bs=(R) 4096B-4096B, ...".
fn header_line(spec: &JobSpec, groupid: u32) -> String {
    let range = |b: &BlockSizes| {
        let min = b.iter().map(|&(s, _)| s).min().unwrap_or(4096);
        let max = b.iter().map(|&(s, _)| s).max().unwrap_or(4096);
        format!(
            "{}-{}",
            num2str(min, SIG_FIGS, true, "B"),
            num2str(max, SIG_FIGS, true, "B")
        )
    };
    let (r, w) = (range(&spec.bs[0]), range(&spec.bs[1]));
    // Trim takes the last block size given, as fio fills missing per-direction values.
    format!(
        "{}: (g={groupid}): rw={}, bs=(R) {r}, (W) {w}, (T) {w}, ioengine={}, iodepth={}\n",
        spec.name,
        spec.pattern.fio_name(),
        spec.engine.fio_name(),
        spec.iodepth
    )
}

fn job_block(g: &JobGroup, run: Option<&RunGroup>, env: &Env, out: &mut String) {
    let st = &g.stats;
    let did_io = st.dirs.iter().any(|d| d.bytes > 0 || d.ios > 0);
    // fio skips an entry without IO; a failed job is shown anyway so its error is visible.
    if !did_io && g.error.is_none() {
        return;
    }
    let when = ctime(env.now, env.utc_offset);
    match &g.error {
        // fio: a job that went on after errors shows the first as its err (as the JSON does).
        None => out.push_str(&format!(
            "{}: (groupid={}, jobs={}): err={:2}: pid={}: {when}\n",
            g.name,
            g.groupid,
            g.members,
            if g.spec.on_error.is_set() {
                st.errors.first
            } else {
                0
            },
            env.pid
        )),
        Some(msg) => out.push_str(&format!(
            "{}: (groupid={}, jobs={}): err={:2} ({msg}): pid={}: {when}\n",
            g.name,
            g.groupid,
            g.members,
            error_code(msg),
            env.pid
        )),
    }
    if let Some(desc) = &g.spec.description {
        out.push_str(&format!("  Description  : [{desc}]\n"));
    }
    let plist = percentile_list(&g.spec.percentile_list);
    let precision = percentile_precision(&plist);
    for dir in Direction::ALL {
        if st.dirs[dir as usize].bytes > 0 {
            let group_dir = run.map(|r| r.dirs[dir as usize]).unwrap_or_default();
            dir_status(st, dir, &group_dir, &plist, precision, out);
        }
    }
    latency_lines(st, out);
    if !st.sync.lat.is_empty() {
        out.push_str("  fsync/fdatasync/sync_file_range:\n");
        out.push_str(&lat_line("sync", &lat_summary(&st.sync.lat)));
        out.push_str(&percentile_block("sync", &st.sync.lat, &plist, precision));
    }
    out.push_str(&format!(
        "  cpu          : usr={:3.2}%, sys={:3.2}%, ctx={}, majf={}, minf={}\n",
        cpu_percent(st.usr_cpu, g.total_runtime),
        cpu_percent(st.sys_cpu, g.total_runtime),
        st.ctx,
        st.majf,
        st.minf
    ));
    let d = depth_distribution(&st.depth_hist);
    out.push_str(&format!(
        "  IO depths    : 1={:3.1}%, 2={:3.1}%, 4={:3.1}%, 8={:3.1}%, 16={:3.1}%, 32={:3.1}%, \
         >=64={:3.1}%\n",
        d[0], d[1], d[2], d[3], d[4], d[5], d[6]
    ));
    let [r, w] = &st.dirs;
    out.push_str(&format!(
        "     issued rwts: total={},{},0,{} short={},{},0,0 dropped=0,0,0,0\n",
        r.ios, w.ios, st.sync.ios, r.short_ios, w.short_ios
    ));
    if g.spec.on_error.is_set() {
        out.push_str(&error_count_line(&st.errors));
    }
    // fio 3.x's line for its (unsupported here) latency_target feature, with its defaults.
    out.push_str(&format!(
        "     latency   : target=0, window=0, percentile=100.00%, depth={}\n",
        g.spec.iodepth
    ));
    queue_lines(g, out);
    stuck_lines(g, out);
}

/// fio's line for a job with `continue_on_error`: the errors it counted and the first one.
fn error_count_line(c: &crate::job::errpolicy::ErrorCount) -> String {
    let reason = std::io::Error::from_raw_os_error(c.first).to_string();
    // Rust appends " (os error N)" to strerror's text; fio prints strerror alone.
    let reason = reason.split(" (os error").next().unwrap_or_default();
    format!(
        "     errors    : total={}, first_error={}/<{reason}>\n",
        c.total, c.first
    )
}

/// fio's `show_ddir_status` for read or write.
fn dir_status(
    st: &JobStats,
    dir: Direction,
    group: &RunGroupDir,
    plist: &[f64],
    precision: usize,
    out: &mut String,
) {
    let d = &st.dirs[dir as usize];
    let run = dir_runtime_ms(d, st.runtime);
    let bw = bw_bytes(d.bytes, run);
    // fio's headline IOPS is an integer: 1000 * ios / runtime_ms.
    let iops = if run == 0 {
        0
    } else {
        (d.ios as u128 * 1000 / run as u128) as u64
    };
    out.push_str(&format!(
        "  {}: IOPS={}, BW={} ({})({}/{run}msec)\n",
        dir.name(),
        num2str(iops, SIG_FIGS, false, ""),
        num2str(bw, SIG_FIGS, true, "B/s"),
        num2str(bw, SIG_FIGS, false, "B/s"),
        num2str(d.bytes, SIG_FIGS, true, "B"),
    ));
    for (name, h) in [("slat", &d.slat), ("clat", &d.clat), (" lat", &d.lat)] {
        if !h.is_empty() {
            out.push_str(&lat_line(name, &lat_summary(h)));
        }
    }
    let intended = d.lat_intended.as_ref().filter(|h| !h.is_empty());
    if let Some(h) = intended {
        out.push_str(&lat_line(" lat from intended issue", &lat_summary(h)));
    }
    out.push_str(&percentile_block("clat", &d.clat, plist, precision));
    if let Some(h) = intended {
        out.push_str(&percentile_block(
            "lat from intended issue",
            h,
            plist,
            precision,
        ));
    }
    let (bws, iopss) = interval_rates(&st.intervals, dir);
    if bws.samples > 0 {
        let per = agg_percent(bws.mean, group.agg_bw);
        // fio shows KiB/s, or MiB/s once the mean passes 1 GiB/s... in KiB: mean > 1024 * 1024.
        let (unit, div) = if bws.mean > 1024.0 * 1024.0 {
            ("MiB", 1024)
        } else {
            ("KiB", 1)
        };
        out.push_str(&format!(
            "   bw ({unit:>5}/s): min={:5}, max={:5}, per={per:3.2}%, avg={:5.2}, stdev={:5.2}, \
             samples={}\n",
            bws.min / div,
            bws.max / div,
            bws.mean / div as f64,
            bws.stddev / div as f64,
            bws.samples
        ));
    }
    if iopss.samples > 0 {
        out.push_str(&format!(
            "   iops        : min={:5}, max={:5}, avg={:5.2}, stdev={:5.2}, samples={}\n",
            iopss.min, iopss.max, iopss.mean, iopss.stddev, iopss.samples
        ));
    }
}

/// fio's `display_lat`: min/max/avg/stdev in nsec, switching to usec or msec when the figures
/// are large enough (fio's `nsec_to_usec` / `nsec_to_msec` thresholds).
fn lat_line(name: &str, s: &LatStats) -> String {
    let (mut min, mut max, mut mean, mut dev) = (s.min, s.max, s.mean, s.stddev);
    let unit = if min > 2_000_000 && max > 99_999_999 && dev > 1_000_000.0 {
        (min, max, mean, dev) = (min / 1_000_000, max / 1_000_000, mean / 1e6, dev / 1e6);
        "msec"
    } else if min > 2_000 && max > 99_999 && dev > 1_000.0 {
        (min, max, mean, dev) = (min / 1_000, max / 1_000, mean / 1e3, dev / 1e3);
        "usec"
    } else {
        "nsec"
    };
    format!(
        "    {name} ({unit}): min={}, max={}, avg={mean:5.2}, stdev={dev:5.2}\n",
        num2str(min, 6, false, ""),
        num2str(max, 6, false, "")
    )
}

/// fio's `show_clat_percentiles`: the unit is msec or usec when the smallest and largest
/// reported values are large enough, values are rounded up into it, columns are as wide as the
/// largest value (at least 5) and as many fit in 80 characters as fio fits.
fn percentile_block(pre: &str, h: &Histogram<u64>, plist: &[f64], precision: usize) -> String {
    let vals = percentiles(h, plist);
    let (Some(minv), Some(maxv)) = (
        vals.iter().map(|v| v.1).min(),
        vals.iter().map(|v| v.1).max(),
    ) else {
        return String::new();
    };
    let (unit, steps) = if minv > 2_000_000 && maxv > 99_999_999 {
        ("msec", 2)
    } else if minv > 2_000 && maxv > 99_999 {
        ("usec", 1)
    } else {
        ("nsec", 0)
    };
    let scaled_max = maxv / 1000u64.pow(steps);
    let width = if scaled_max == 0 {
        5
    } else {
        (scaled_max.ilog10() as usize + 1).max(5)
    };
    let per_line = (80 - 7) / (precision + 10 + width);
    let mut out = format!("    {pre} percentiles ({unit}):\n     |");
    for (j, &(p, v)) in vals.iter().enumerate() {
        if j != 0 && j % per_line == 0 {
            out.push_str("     |");
        }
        let v = (0..steps).fold(v, |v, _| v.div_ceil(1000));
        let last = j == vals.len() - 1;
        out.push_str(&format!(
            " {p:pw$.precision$}th=[{v:width$}]{}",
            if last { '\n' } else { ',' },
            pw = precision + 3,
        ));
        if !last && j % per_line == per_line - 1 {
            out.push('\n');
        }
    }
    out
}

/// fio's `show_latencies`: the share of IOs in each completion-latency range, five per line,
/// only the non-empty ranges.
fn latency_lines(st: &JobStats, out: &mut String) {
    let b = latency_buckets(st);
    for (unit, labels, pcts) in [
        ("nsec", &LAT_LABELS[..], &b.ns[..]),
        ("usec", &LAT_LABELS[..], &b.us[..]),
        ("msec", &LAT_MS_LABELS[..], &b.ms[..]),
    ] {
        let shown: Vec<String> = labels
            .iter()
            .zip(pcts)
            .filter(|(_, p)| **p > 0.0)
            .map(|(l, p)| format!("{l}={p:3.2}%"))
            .collect();
        for line in shown.chunks(5) {
            out.push_str(&format!("  lat ({unit})   : {}\n", line.join(", ")));
        }
    }
}

/// lockstep's Little's-law check (product rule: a queue shorter than the configured depth means
/// the load generator was the bottleneck, and the report says so). The measured figure is the
/// time-weighted mean of IOs in flight over the intervals; the expected one is IOPS × mean
/// latency. Rate-limited jobs and jobs with thinktime keep a short queue on purpose and get no
/// note; synchronous engines have one IO in flight per job whatever `iodepth` says (as in fio).
/// Without a measured queue (every interval's `outstanding` is 0) nothing is printed.
fn queue_lines(g: &JobGroup, out: &mut String) {
    let st = &g.stats;
    let total: f64 = st.intervals.iter().map(|iv| iv.len.as_secs_f64()).sum();
    if total <= 0.0 {
        return;
    }
    let weighted = |f: fn(&crate::stats::IntervalSummary) -> f64| {
        st.intervals
            .iter()
            .map(|iv| f(iv) * iv.len.as_secs_f64())
            .sum::<f64>()
            / total
    };
    let measured = weighted(|iv| iv.outstanding);
    // Finished IOs the job had not yet taken (fio's reaping, iodepth_batch_complete_max below
    // the depth): in flight for fio's accounting and in their clat, but not at the target.
    let waiting = weighted(|iv| iv.waiting);
    // IOs completed while none were in flight is impossible: a zero mean means the runner did
    // not measure the queue, and a note built on it would blame the load generator falsely.
    if measured <= 0.0 {
        return;
    }
    let runtime = st.runtime.as_secs_f64();
    let little: f64 = if runtime > 0.0 {
        st.dirs
            .iter()
            .map(|d| d.lat.len() as f64 / runtime * lat_summary(&d.lat).mean / 1e9)
            .sum()
    } else {
        0.0
    };
    let per_job = if g.spec.engine == EngineKind::Psync {
        1
    } else {
        g.spec.iodepth.max(1)
    };
    let depth = per_job * g.members;
    let of_which = if waiting >= 0.005 {
        format!(", of which finished, waiting to be reaped={waiting:.2}")
    } else {
        String::new()
    };
    out.push_str(&format!(
        "     queue     : in flight avg={measured:.2} (IOPS x lat={little:.2}){of_which}, depth={depth}\n"
    ));
    let paced = g.spec.rate.is_limited() || !g.spec.thinktime.is_zero();
    let at_target = measured - waiting;
    if !paced && at_target < 0.8 * depth as f64 {
        let note = if waiting >= 0.005 {
            format!(
                "{at_target:.2} of {depth} IOs at the target ({waiting:.2} more had finished and \
                 waited for the job to take them): the load generator, not the target, was the limit"
            )
        } else {
            format!(
                "{measured:.2} of {depth} IOs in flight: the load generator, not the target, \
                 was the limit"
            )
        };
        out.push_str(&format!("     note      : {note}\n"));
    }
}

/// lockstep's stuck IOs (slower than `stuck_timeout`, or given up on when the device stopped
/// answering): how many, then the first few with where and when, so the slow block is named.
fn stuck_lines(g: &JobGroup, out: &mut String) {
    let st = &g.stats;
    if st.stuck_count == 0 {
        return;
    }
    let never = st.stuck.iter().filter(|s| !s.completed).count();
    out.push_str(&format!(
        "     stuck     : {} IOs slower than stuck_timeout={}ms, {never} of the listed never completed\n",
        st.stuck_count,
        g.spec.stuck_timeout.as_millis()
    ));
    const SHOWN: usize = 5;
    for s in st.stuck.iter().take(SHOWN) {
        out.push_str(&format!(
            "       {} {} B at offset {} of {}: issued at {:.3} s, {} after {} ms\n",
            s.direction.name(),
            s.len,
            s.offset,
            s.file,
            s.start_ms as f64 / 1000.0,
            if s.completed {
                "completed"
            } else {
                "still in flight"
            },
            s.latency_ms
        ));
    }
    if st.stuck.len() > SHOWN {
        out.push_str(&format!(
            "       ... {} more in the JSON output (stuck_ios)\n",
            st.stuck.len() - SHOWN
        ));
    }
}

/// fio's `show_group_stats`: one line per direction with IO in the group.
fn group_status(r: &RunGroup, out: &mut String) {
    out.push_str(&format!("\nRun status group {} (all jobs):\n", r.groupid));
    for (dir, label) in [(Direction::Read, "   READ"), (Direction::Write, "  WRITE")] {
        let g = &r.dirs[dir as usize];
        if !g.active() {
            continue;
        }
        let b = |v: u64, pow2: bool| num2str(v, SIG_FIGS, pow2, "B/s");
        out.push_str(&format!(
            "{label}: bw={} ({}), {}-{} ({}-{}), io={} ({}), run={}-{}msec\n",
            b(g.agg_bw, true),
            b(g.agg_bw, false),
            b(g.min_bw, true),
            b(g.max_bw, true),
            b(g.min_bw, false),
            b(g.max_bw, false),
            num2str(g.io_bytes, SIG_FIGS, true, "B"),
            num2str(g.io_bytes, SIG_FIGS, false, "B"),
            g.min_run_ms,
            g.max_run_ms
        ));
    }
}

/// fio's `num2str` (lib/num2str.c), carry rounding and all: at most `maxlen` digits (the period
/// counts), dividing by 1024 (`pow2`, "Ki", "Mi", ...) or 1000 ("k", "M", ...) until it fits,
/// with as many decimals as the room left allows.
fn num2str(num: u64, maxlen: usize, pow2: bool, unit: &str) -> String {
    const IEC: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    const SI: [&str; 7] = ["", "k", "M", "G", "T", "P", "E"];
    let prefixes = if pow2 { IEC } else { SI };
    let thousand: u64 = if pow2 { 1024 } else { 1000 };
    let digits = |n: u64| n.to_string().len();
    let mut num = num;
    let mut post = 0;
    let mut modulo = None;
    let mut carry = false;
    while post < prefixes.len() {
        if digits(num) <= maxlen {
            break;
        }
        let m = num % thousand;
        modulo = Some(m);
        num /= thousand;
        carry = m >= thousand / 2;
        post += 1;
    }
    if post >= prefixes.len() {
        post = 0;
    }
    let Some(m) = modulo else {
        return format!("{num}{}{unit}", prefixes[post]);
    };
    if maxlen as i64 - digits(num) as i64 <= 1 {
        if carry {
            num += 1;
        }
        return format!("{num}{}{unit}", prefixes[post]);
    }
    let decimals = maxlen - digits(num) - 1;
    let frac = format!("{:.*}", decimals, m as f64 / thousand as f64);
    if frac.starts_with('1') {
        num += 1;
    }
    format!("{num}.{}{}{unit}", &frac[2..], prefixes[post])
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::job::{Origin, Pattern, Rate};
    use crate::report::JobReport;
    use crate::stats::{IntervalSummary, latency_histogram, record};

    const T0: u64 = 1_700_000_000;

    fn env() -> Env {
        Env {
            pid: 4242,
            utc_offset: 0,
            now: SystemTime::UNIX_EPOCH + Duration::from_secs(T0 + 2),
        }
    }

    /// A sequential-read job: 2000 reads of 4 KiB in 2 s; clat 50.1..250 us in steps of 0.1 us,
    /// slat 1 us, lat = clat + 1 us; two 1 s intervals of 900 and 1100 IOs.
    fn read_job(name: &str, clone: u32) -> JobReport {
        let mut spec = JobSpec::with_defaults(name, Origin::default());
        spec.pattern = Pattern::Read;
        spec.engine = EngineKind::IoUring;
        spec.iodepth = 2;
        let mut st = JobStats::new(false);
        st.runtime = Duration::from_millis(2000);
        let d = &mut st.dirs[0];
        d.ios = 2000;
        d.bytes = 2000 * 4096;
        for i in 1..=2000u64 {
            record(&mut d.clat, 50_000 + i * 100);
            record(&mut d.slat, 1_000);
            record(&mut d.lat, 51_000 + i * 100);
        }
        let iv = |end: u64, ios: u64| IntervalSummary {
            end: Duration::from_secs(end),
            len: Duration::from_secs(1),
            ios: [ios, 0],
            bytes: [ios * 4096, 0],
            errors: [0, 0],
            outstanding: 1.5,
            waiting: 0.0,
        };
        st.intervals = vec![iv(1, 900), iv(2, 1100)];
        st.depth_hist = [1, 1999, 0, 0, 0, 0, 0];
        st.usr_cpu = Duration::from_millis(100);
        st.sys_cpu = Duration::from_millis(500);
        st.ctx = 2001;
        st.minf = 12;
        JobReport {
            spec,
            clone,
            groupid: 0,
            stats: st,
            error: None,
            started: SystemTime::UNIX_EPOCH + Duration::from_secs(T0),
            verify: None,
            abandoned: Vec::new(),
        }
    }

    fn report(jobs: Vec<JobReport>) -> RunReport {
        RunReport {
            jobs,
            started: SystemTime::UNIX_EPOCH + Duration::from_secs(T0),
            elapsed: Duration::from_millis(2500),
        }
    }

    #[test]
    fn num2str_matches_fio() {
        // Each case is a figure fio 3.33 printed, with its input.
        assert_eq!(num2str(8_747_475, 4, false, ""), "8747k");
        assert_eq!(num2str(35_865_489_408, 4, true, "B"), "33.4GiB");
        assert_eq!(num2str(35_865_489_408, 4, false, "B"), "35.9GB");
        assert_eq!(num2str(4_096_000, 4, true, "B"), "4000KiB");
        assert_eq!(num2str(4_096_000, 4, false, "B"), "4096kB");
        assert_eq!(num2str(2_046_976, 4, true, "B/s"), "1999KiB/s");
        assert_eq!(num2str(2_046_976, 4, false, "B/s"), "2047kB/s");
        assert_eq!(num2str(4_059_321, 6, false, ""), "4059.3k");
        assert_eq!(num2str(4096, 4, true, "B"), "4096B");
        assert_eq!(num2str(65536, 4, true, "B"), "64.0KiB");
        assert_eq!(num2str(499, 4, false, ""), "499");
    }

    #[test]
    fn lat_line_picks_fios_unit() {
        let s = |min, max, mean, stddev| LatStats {
            min,
            max,
            mean,
            stddev,
            n: 10,
        };
        assert_eq!(
            lat_line("clat", &s(2_000, 142_000, 9_690.0, 5_900.0)),
            "    clat (nsec): min=2000, max=142000, avg=9690.00, stdev=5900.00\n"
        );
        assert_eq!(
            lat_line("clat", &s(2_001, 142_000, 9_690.0, 5_900.0)),
            "    clat (usec): min=2, max=142, avg= 9.69, stdev= 5.90\n"
        );
        assert_eq!(
            lat_line(" lat", &s(20, 4_059_400, 56.04, 1392.3)),
            "     lat (nsec): min=20, max=4059.4k, avg=56.04, stdev=1392.30\n"
        );
        assert_eq!(
            lat_line("clat", &s(3_000_000, 150_000_000, 20e6, 2e6)),
            "    clat (msec): min=3, max=150, avg=20.00, stdev= 2.00\n"
        );
    }

    #[test]
    fn percentile_block_matches_fios_layout() {
        let mut h = latency_histogram();
        for v in 1..=1000 {
            record(&mut h, v);
        }
        let list = percentile_list(&crate::job::DEFAULT_PERCENTILES);
        assert_eq!(
            percentile_block("clat", &h, &list, 2),
            "    clat percentiles (nsec):\n\
             \x20    |  1.00th=[   10],  5.00th=[   50], 10.00th=[  100], 20.00th=[  200],\n\
             \x20    | 30.00th=[  300], 40.00th=[  400], 50.00th=[  500], 60.00th=[  600],\n\
             \x20    | 70.00th=[  700], 80.00th=[  800], 90.00th=[  900], 95.00th=[  950],\n\
             \x20    | 99.00th=[  990], 99.50th=[  995], 99.90th=[  999], 99.95th=[ 1000],\n\
             \x20    | 99.99th=[ 1000]\n"
        );
        let list = [50.0, 99.0];
        assert_eq!(
            percentile_block("clat", &h, &list, 0),
            "    clat percentiles (nsec):\n     |  50th=[  500],  99th=[  990]\n"
        );
    }

    /// The whole output of one job, checked by hand against fio's rules: clat p1 is the 20th
    /// sample, 52000 ns, reported as the top of its 32 ns histogram bucket (52031 ns) and rounded
    /// up to 53 us as fio rounds; 250000 ns, the largest clat, falls in the bucket starting at
    /// 249984 ns and is therefore counted below 250 us (the documented 0.1% boundary error);
    /// bandwidth samples are 900 and 1100 IOs of 4 KiB over 1 s.
    #[test]
    fn a_job_renders_like_fio() {
        let text = render_with(&report(vec![read_job("seq", 0)]), &env());
        let expected = concat!(
            "seq: (g=0): rw=read, bs=(R) 4096B-4096B, (W) 4096B-4096B, (T) 4096B-4096B, ",
            "ioengine=io_uring, iodepth=2\n",
            "VERSION\n",
            "\n",
            "seq: (groupid=0, jobs=1): err= 0: pid=4242: Tue Nov 14 22:13:22 2023\n",
            "  read: IOPS=1000, BW=4000KiB/s (4096kB/s)(8000KiB/2000msec)\n",
            "    slat (nsec): min=1000, max=1000, avg=1000.00, stdev= 0.00\n",
            "    clat (usec): min=50, max=250, avg=150.05, stdev=57.75\n",
            "     lat (usec): min=51, max=251, avg=151.05, stdev=57.75\n",
            "    clat percentiles (usec):\n",
            "     |  1.00th=[   53],  5.00th=[   61], 10.00th=[   71], 20.00th=[   91],\n",
            "     | 30.00th=[  111], 40.00th=[  131], 50.00th=[  151], 60.00th=[  171],\n",
            "     | 70.00th=[  191], 80.00th=[  211], 90.00th=[  231], 95.00th=[  241],\n",
            "     | 99.00th=[  249], 99.50th=[  250], 99.90th=[  250], 99.95th=[  250],\n",
            "     | 99.99th=[  251]\n",
            "   bw (  KiB/s): min= 3600, max= 4400, per=100.00%, avg=4000.00, stdev=565.69, ",
            "samples=2\n",
            "   iops        : min=  900, max= 1100, avg=1000.00, stdev=141.42, samples=2\n",
            "  lat (usec)   : 100=25.00%, 250=75.00%\n",
            "  cpu          : usr=5.00%, sys=25.00%, ctx=2001, majf=0, minf=12\n",
            "  IO depths    : 1=0.1%, 2=100.0%, 4=0.0%, 8=0.0%, 16=0.0%, 32=0.0%, >=64=0.0%\n",
            "     issued rwts: total=2000,0,0,0 short=0,0,0,0 dropped=0,0,0,0\n",
            "     latency   : target=0, window=0, percentile=100.00%, depth=2\n",
            "     queue     : in flight avg=1.50 (IOPS x lat=0.15), depth=2\n",
            "     note      : 1.50 of 2 IOs in flight: the load generator, not the target, ",
            "was the limit\n",
            "\n",
            "Run status group 0 (all jobs):\n",
            "   READ: bw=4000KiB/s (4096kB/s), 4000KiB/s-4000KiB/s (4096kB/s-4096kB/s), ",
            "io=8000KiB (8192kB), run=2000-2000msec\n",
        )
        .replace("VERSION", &version_string());
        assert_eq!(text, expected, "\n{text}");
    }

    /// With fio's reaping, IOs that finished and wait for the job are in flight for fio's
    /// accounting (and Little's law holds with them) but not at the target: the note is about
    /// the IOs at the target, and says how many waited.
    #[test]
    fn finished_ios_waiting_to_be_reaped_are_not_counted_at_the_target() {
        let mut job = read_job("w", 0);
        for iv in &mut job.stats.intervals {
            iv.outstanding = 1.9;
            iv.waiting = 0.6;
        }
        let text = render_with(&report(vec![job]), &env());
        assert!(
            text.contains(
                "     queue     : in flight avg=1.90 (IOPS x lat=0.15), of which finished, \
                 waiting to be reaped=0.60, depth=2\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "     note      : 1.30 of 2 IOs at the target (0.60 more had finished and \
                 waited for the job to take them): the load generator, not the target, was \
                 the limit\n"
            ),
            "{text}"
        );
        // The same queue with nothing waiting: the target had 1.9 of 2, no note.
        let mut job = read_job("w", 0);
        for iv in &mut job.stats.intervals {
            iv.outstanding = 1.9;
        }
        let text = render_with(&report(vec![job]), &env());
        assert!(
            text.contains("in flight avg=1.90 (IOPS x lat=0.15), depth=2\n"),
            "{text}"
        );
        assert!(!text.contains("note      :"), "{text}");
    }

    #[test]
    fn stuck_ios_are_counted_and_the_first_named_with_where_and_when() {
        let mut job = read_job("s", 0);
        let io = |offset: u64, completed: bool| crate::stats::StuckIo {
            file: "/data/s.0.0".into(),
            offset,
            len: 4096,
            direction: Direction::Read,
            start_ms: 1500,
            latency_ms: 2500,
            completed,
        };
        job.stats.stuck = (0..7).map(|i| io(i * 4096, i == 0)).collect();
        job.stats.stuck_count = 9;
        let text = render_with(&report(vec![job]), &env());
        assert!(
            text.contains("     stuck     : 9 IOs slower than stuck_timeout=5000ms, 6 of the listed never completed\n"),
            "{text}"
        );
        assert!(
            text.contains("       read 4096 B at offset 0 of /data/s.0.0: issued at 1.500 s, completed after 2500 ms\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "at offset 4096 of /data/s.0.0: issued at 1.500 s, still in flight after 2500 ms"
            ),
            "{text}"
        );
        assert!(
            text.contains("       ... 2 more in the JSON output (stuck_ios)\n"),
            "{text}"
        );
        // Without stuck IOs, no line.
        assert!(!render_with(&report(vec![read_job("s", 0)]), &env()).contains("stuck"));
    }

    #[test]
    fn group_reporting_prints_one_block_with_merged_figures() {
        let mut jobs = vec![read_job("g", 0), read_job("g", 1)];
        for j in &mut jobs {
            j.spec.group_reporting = true;
            j.spec.numjobs = 2;
        }
        let text = render_with(&report(jobs), &env());
        assert!(text.starts_with("g: (g=0): rw=read"), "{text}");
        assert!(text.contains("iodepth=2\n...\nlockstep-"), "{text}");
        assert_eq!(text.matches("(groupid=0, jobs=2)").count(), 1, "{text}");
        assert!(text.contains("  read: IOPS=2000, BW=8000KiB/s (8192kB/s)(15.6MiB/2000msec)\n"));
        // Histograms merged: the same distribution twice has the same percentiles.
        assert!(text.contains(", 50.00th=[  151],"), "{text}");
        assert!(text.contains("samples=2\n"), "{text}");
        assert!(
            text.contains("   iops        : min= 1800, max= 2200, avg=2000.00"),
            "{text}"
        );
        assert!(
            text.contains("   READ: bw=8000KiB/s (8192kB/s), 8000KiB/s-8000KiB/s"),
            "{text}"
        );
        assert!(
            text.contains("  cpu          : usr=5.00%, sys=25.00%, ctx=4002"),
            "{text}"
        );
    }

    #[test]
    fn open_loop_jobs_show_latency_from_the_intended_issue_time() {
        let mut job = read_job("paced", 0);
        job.spec.rate = Rate {
            iops: [Some(1000), None],
            ..Default::default()
        };
        let mut intended = latency_histogram();
        for i in 1..=2000u64 {
            record(&mut intended, 100_000 + i * 1000);
        }
        job.stats.dirs[0].lat_intended = Some(intended);
        let text = render_with(&report(vec![job]), &env());
        let lat = text
            .find("     lat (usec): min=51")
            .expect("uncorrected line");
        let ilat = text
            .find("     lat from intended issue (usec): min=100, max=2101, avg=1100.51,")
            .expect(&text);
        assert!(ilat > lat);
        assert!(
            text.contains("    lat from intended issue percentiles (usec):\n"),
            "{text}"
        );
        // Paced on purpose: no bottleneck note.
        assert!(!text.contains("note"), "{text}");
    }

    #[test]
    fn no_queue_verdict_without_a_measured_queue() {
        let mut job = read_job("q", 0);
        for iv in &mut job.stats.intervals {
            iv.outstanding = 0.0;
        }
        let text = render_with(&report(vec![job]), &env());
        assert!(!text.contains("queue"), "{text}");
        assert!(!text.contains("note"), "{text}");
    }

    #[test]
    fn continue_on_error_shows_fios_errors_line() {
        let plain = render_with(&report(vec![read_job("plain", 0)]), &env());
        assert!(!plain.contains("errors    :"), "{plain}");
        let mut job = read_job("coe", 0);
        job.spec.on_error.set_continue("io").unwrap();
        job.stats.errors.add(5, 12);
        let text = render_with(&report(vec![job]), &env());
        assert!(
            text.contains("coe: (groupid=0, jobs=1): err= 5: pid=4242"),
            "{text}"
        );
        assert!(
            text.contains(
                "     issued rwts: total=2000,0,0,0 short=0,0,0,0 dropped=0,0,0,0\n     \
                 errors    : total=12, first_error=5/<Input/output error>\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn errors_show_in_fios_err_field() {
        let mut job = read_job("bad", 0);
        job.error = Some("No space left on device (os error 28) writing /x".into());
        let text = render_with(&report(vec![job]), &env());
        assert!(
            text.contains(
                "bad: (groupid=0, jobs=1): err=28 (No space left on device (os error 28) \
                 writing /x): pid=4242: "
            ),
            "{text}"
        );
    }
}
