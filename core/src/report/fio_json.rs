//! fio JSON exporter: the structure and key names of `fio --output-format=json` (fio 3.x), so
//! tools written for fio's JSON (fio-plot, fio2gnuplot-style scripts, dashboards) read lockstep's
//! results unchanged.
//!
//! Checked key by key against fio 3.33's output (see `FIO_JOB_KEYS` and `FIO_DIR_KEYS` in the
//! tests); `job_start` is fio 3.36's addition. What lockstep adds uses keys fio does not have, which
//! fio tooling ignores: `lat_intended_ns` (open-loop latency from the intended issue time),
//! `error_message`, `error_ios`, and `stuck_count` with `stuck_ios` (IOs slower than the job's
//! `stuck_timeout`, or given up on when a device stopped answering; only when there are any).
//!
//! The document is built as an ordered tree and printed the way fio's `json.c` prints it (`"key" :
//! value`, two-space indent, floats with six decimals, keys in fio's order); `to_value` and friends
//! convert the same tree to `serde_json::Value` for callers that embed it.

use std::time::{Duration, SystemTime};

use hdrhistogram::Histogram;
use serde_json::Value;

use super::{
    JobGroup, LAT_LABELS, LAT_MS_LABELS, RunGroup, RunReport, agg_percent, bw_bytes, cpu_percent,
    depth_distribution, dir_runtime_ms, error_code, group_jobs, interval_rates, iops, lat_summary,
    latency_buckets, percentile_list, percentiles, run_groups, unix_millis, unix_secs,
};
use crate::job::{
    BlockSizes, DEFAULT_PERCENTILES, Direction, Distribution, Extent, JobSpec, Pattern, RateProcess,
};
use crate::stats::{DirStats, IntervalSummary};

/// The whole document as pretty JSON in fio's layout, ending with a newline like fio's.
pub fn to_string(report: &RunReport) -> String {
    let offset = super::local_utc_offset(end_time(report));
    let mut out = String::new();
    print(&Node::Obj(document(report, offset)), 0, &mut out);
    out.push('\n');
    out
}

/// The whole document (top level: "fio version", "timestamp", "timestamp_ms", "time", "jobs",
/// "disk_util").
pub fn to_value(report: &RunReport) -> Value {
    let offset = super::local_utc_offset(end_time(report));
    Node::Obj(document(report, offset)).into()
}

/// The `jobs[]` entries, after `group_reporting` merging.
pub fn job_values(report: &RunReport) -> Vec<Value> {
    jobs(report)
        .into_iter()
        .map(|o| Node::Obj(o).into())
        .collect()
}

/// One "read" or "write" object of a job. `runtime` is the wall time of the IO (the direction's
/// fio runtime is derived from it); `percentiles` is the job's `percentile_list`. Without the
/// job's intervals the bandwidth and IOPS sample statistics (`bw_min` .. `iops_samples`) are 0,
/// as fio reports a direction without samples; use `dir_value_with_intervals` when they exist.
pub fn dir_value(d: &DirStats, runtime: Duration, percentiles: &[f64]) -> Value {
    Node::Obj(dir_obj(d, runtime, percentiles, None)).into()
}

/// `dir_value` with the sample statistics computed from per-interval summaries: `bw_*` in KiB/s
/// and `iops_*` per interval, `bw_agg` against the aggregate bandwidth `group_agg_bw` (bytes/s)
/// of the entry's run group (pass the entry's own bandwidth when it stands alone).
pub fn dir_value_with_intervals(
    d: &DirStats,
    runtime: Duration,
    percentiles: &[f64],
    intervals: &[IntervalSummary],
    dir: Direction,
    group_agg_bw: u64,
) -> Value {
    Node::Obj(dir_obj(
        d,
        runtime,
        percentiles,
        Some((intervals, dir, group_agg_bw)),
    ))
    .into()
}

/// When the report was made: fio stamps its JSON with the time it writes it, the end of the run.
fn end_time(report: &RunReport) -> SystemTime {
    report.started + report.elapsed
}

fn document(report: &RunReport, utc_offset: i64) -> Obj {
    let end = end_time(report);
    let mut root = Obj::default();
    root.str("fio version", &super::version_string());
    root.int("timestamp", unix_secs(end));
    root.int("timestamp_ms", unix_millis(end));
    root.str("time", &super::ctime(end, utc_offset));
    // "global options" is left out, as fio leaves it out without a [global] section: a JobSpec
    // does not record which of its options came from [global]; each job lists them all.
    root.arr("jobs", jobs(report).into_iter().map(Node::Obj).collect());
    // lockstep does not sample the block devices' counters; fio tooling expects the array.
    root.arr("disk_util", Vec::new());
    root
}

fn jobs(report: &RunReport) -> Vec<Obj> {
    let groups = group_jobs(&report.jobs);
    let runs = run_groups(&groups);
    groups
        .iter()
        .map(|g| job_obj(g, &runs, report.elapsed))
        .collect()
}

fn job_obj(g: &JobGroup, runs: &[RunGroup], elapsed: Duration) -> Obj {
    let st = &g.stats;
    let run = runs.iter().find(|r| r.groupid == g.groupid);
    let plist = percentile_list(&g.spec.percentile_list);
    let mut o = Obj::default();
    o.str("jobname", &g.name);
    o.int("groupid", g.groupid as u64);
    // fio 3.36+: when the job started, in ms since the epoch.
    o.int("job_start", unix_millis(g.started));
    match &g.error {
        Some(msg) => {
            o.int("error", error_code(msg) as u64);
            o.str("error_message", msg);
        }
        // fio: a job that went on after errors reports the first as its error (and exits 0).
        None if g.spec.on_error.is_set() => o.int("error", st.errors.first as u64),
        None => o.int("error", 0),
    }
    if st.stuck_count > 0 {
        o.int("stuck_count", st.stuck_count);
        o.arr(
            "stuck_ios",
            st.stuck.iter().map(stuck_obj).map(Node::Obj).collect(),
        );
    }
    o.int("eta", 0);
    // fio: whole seconds since the run began, rounded up.
    o.int("elapsed", elapsed.as_millis().div_ceil(1000) as u64);
    o.obj("job options", job_options(&g.spec));
    for dir in Direction::ALL {
        let agg = run.map_or(0, |r| r.dirs[dir as usize].agg_bw);
        let d = &st.dirs[dir as usize];
        let body = dir_obj(d, st.runtime, &plist, Some((&st.intervals, dir, agg)));
        o.obj(dir.name(), body);
    }
    o.obj("trim", empty_dir());
    let mut sync = Obj::default();
    sync.int("total_ios", st.sync.ios);
    // fio adds percentiles to sync when clat or lat percentiles are on (clat is by default).
    sync.obj("lat_ns", lat_obj(&st.sync.lat, Some(&plist)));
    o.obj("sync", sync);
    o.int("job_runtime", g.total_runtime.as_millis() as u64);
    o.float("usr_cpu", cpu_percent(st.usr_cpu, g.total_runtime));
    o.float("sys_cpu", cpu_percent(st.sys_cpu, g.total_runtime));
    o.int("ctx", st.ctx);
    o.int("majf", st.majf);
    o.int("minf", st.minf);
    let depths = depth_distribution(&st.depth_hist);
    let mut level = Obj::default();
    for (i, pct) in depths.iter().enumerate() {
        let key = if i < 6 {
            format!("{}", 1 << i)
        } else {
            format!(">={}", 1 << i)
        };
        level.float(&key, *pct);
    }
    o.obj("iodepth_level", level);
    // Submit and complete batch sizes are not measured; fio prints zeros when it has none.
    for key in ["iodepth_submit", "iodepth_complete"] {
        let mut batch = Obj::default();
        for k in ["0", "4", "8", "16", "32", "64", ">=64"] {
            batch.float(k, 0.0);
        }
        o.obj(key, batch);
    }
    let lat = latency_buckets(st);
    for (key, labels, pcts) in [
        ("latency_ns", &LAT_LABELS[..], &lat.ns[..]),
        ("latency_us", &LAT_LABELS[..], &lat.us[..]),
        ("latency_ms", &LAT_MS_LABELS[..], &lat.ms[..]),
    ] {
        let mut b = Obj::default();
        for (label, pct) in labels.iter().zip(pcts) {
            b.float(label, *pct);
        }
        o.obj(key, b);
    }
    // fio adds these only when continue_on_error (or ignore_error) is set.
    if g.spec.on_error.is_set() {
        o.int("total_err", st.errors.total);
        o.int("first_error", st.errors.first as u64);
    }
    // fio's latency_target feature is not supported: its defaults, with the job's queue depth.
    o.int("latency_depth", g.spec.iodepth as u64);
    o.int("latency_target", 0);
    o.float("latency_percentile", 100.0);
    o.int("latency_window", 0);
    if let Some(desc) = &g.spec.description {
        o.str("desc", desc);
    }
    o
}

/// One stuck IO, with the keys of the cluster's results.json.
fn stuck_obj(s: &crate::stats::StuckIo) -> Obj {
    let mut o = Obj::default();
    o.str("file", &s.file);
    o.int("offset", s.offset);
    o.int("len", s.len as u64);
    o.str("direction", s.direction.name());
    o.int("start_ms", s.start_ms);
    o.int("latency_ms", s.latency_ms);
    o.bool("completed", s.completed);
    o
}

fn dir_obj(
    d: &DirStats,
    runtime: Duration,
    plist: &[f64],
    intervals: Option<(&[IntervalSummary], Direction, u64)>,
) -> Obj {
    let plist = percentile_list(plist);
    let run = dir_runtime_ms(d, runtime);
    let bw = bw_bytes(d.bytes, run);
    let mut o = Obj::default();
    o.int("io_bytes", d.bytes);
    o.int("io_kbytes", d.bytes >> 10);
    o.int("bw_bytes", bw);
    o.int("bw", bw / 1024);
    o.float("iops", iops(d.ios, run));
    o.int("runtime", run);
    o.int("total_ios", d.ios);
    o.int("short_ios", d.short_ios);
    o.int("drop_ios", 0);
    // fio's defaults: percentiles of the completion latency only (clat_percentiles=1).
    o.obj("slat_ns", lat_obj(&d.slat, None));
    o.obj("clat_ns", lat_obj(&d.clat, Some(&plist)));
    o.obj("lat_ns", lat_obj(&d.lat, None));
    if let Some(h) = &d.lat_intended {
        // With percentiles: the tail is where coordinated omission hides.
        o.obj("lat_intended_ns", lat_obj(h, Some(&plist)));
    }
    if d.errors > 0 {
        o.int("error_ios", d.errors);
    }
    let (bw_s, iops_s, agg) = match intervals {
        Some((ivs, dir, group_agg)) => {
            let (b, i) = interval_rates(ivs, dir);
            let agg = if b.samples > 0 {
                agg_percent(b.mean, group_agg)
            } else {
                0.0
            };
            (b, i, agg)
        }
        None => Default::default(),
    };
    o.int("bw_min", bw_s.min);
    o.int("bw_max", bw_s.max);
    o.float("bw_agg", agg);
    o.float("bw_mean", bw_s.mean);
    o.float("bw_dev", bw_s.stddev);
    o.int("bw_samples", bw_s.samples);
    o.int("iops_min", iops_s.min);
    o.int("iops_max", iops_s.max);
    o.float("iops_mean", iops_s.mean);
    o.float("iops_stddev", iops_s.stddev);
    o.int("iops_samples", iops_s.samples);
    o
}

/// fio's "trim": lockstep never trims, and fio prints the direction with zeros.
fn empty_dir() -> Obj {
    dir_obj(&DirStats::new(false), Duration::ZERO, &[], None)
}

/// `{min, max, mean, stddev, N[, percentile]}` in ns, fio's `add_ddir_lat_json`: zeros without
/// samples, and the "percentile" object only when asked for and there are samples.
fn lat_obj(h: &Histogram<u64>, plist: Option<&[f64]>) -> Obj {
    let s = lat_summary(h);
    let mut o = Obj::default();
    o.int("min", s.min);
    o.int("max", s.max);
    o.float("mean", s.mean);
    o.float("stddev", s.stddev);
    o.int("N", s.n);
    if let Some(plist) = plist.filter(|_| s.n > 0) {
        let mut p = Obj::default();
        for (pct, v) in percentiles(h, plist) {
            p.int(&percentile_key(pct), v);
        }
        o.obj("percentile", p);
    }
    o
}

/// fio formats percentile keys with C's "%f": "99.000000".
pub fn percentile_key(p: f64) -> String {
    format!("{p:.6}")
}

/// The job's options as fio lists them under "job options", as strings in fio's syntax. fio
/// echoes what the job file said; a `JobSpec` holds the parsed values, so this lists the options
/// that differ from fio's defaults, plus the ones tools use to label results (name, rw, bs,
/// ioengine, iodepth, numjobs), which are always present.
fn job_options(s: &JobSpec) -> Obj {
    let mut o = Obj::default();
    target_options(&mut o, s);
    io_options(&mut o, s);
    integrity_and_report_options(&mut o, s);
    o
}

/// The job's name and where its IO goes (files, directories, sizes, offset).
fn target_options(o: &mut Obj, s: &JobSpec) {
    o.str("name", &s.name);
    if let Some(d) = &s.description {
        o.str("description", d);
    }
    let paths = |v: &[std::path::PathBuf]| {
        v.iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    };
    if !s.filenames.is_empty() {
        o.str("filename", &paths(&s.filenames));
    }
    if !s.directories.is_empty() {
        o.str("directory", &paths(&s.directories));
    }
    if s.nrfiles != 1 {
        o.str("nrfiles", &s.nrfiles.to_string());
    }
    if let Some(size) = s.size {
        o.str("size", &extent(size));
    }
    if let Some(v) = s.filesize {
        o.str("filesize", &size_str(v));
    }
    if let Some(v) = s.io_size {
        o.str("io_size", &size_str(v));
    }
    if s.offset != Extent::Bytes(0) {
        o.str("offset", &extent(s.offset));
    }
}

/// The IO itself: pattern, block sizes, engine and depth, timing, randomness, rates, think time.
fn io_options(o: &mut Obj, s: &JobSpec) {
    o.str("rw", s.pattern.fio_name());
    if matches!(s.pattern, Pattern::ReadWrite | Pattern::RandReadWrite) {
        o.str("rwmixread", &s.rwmixread.to_string());
    }
    let single = |b: &BlockSizes| (b.len() == 1).then(|| size_str(b[0].0));
    match (single(&s.bs[0]), single(&s.bs[1])) {
        (Some(r), Some(w)) if r == w => o.str("bs", &r),
        (Some(r), Some(w)) => o.str("bs", &format!("{r},{w}")),
        _ => {
            let split = |b: &BlockSizes| {
                b.iter()
                    .map(|&(size, pct)| format!("{}/{pct}", size_str(size)))
                    .collect::<Vec<_>>()
                    .join(":")
            };
            let (r, w) = (split(&s.bs[0]), split(&s.bs[1]));
            o.str("bssplit", &if r == w { r } else { format!("{r},{w}") });
        }
    }
    o.str("ioengine", s.engine.fio_name());
    o.str("iodepth", &s.iodepth.to_string());
    o.str("numjobs", &s.numjobs.to_string());
    if s.direct {
        o.str("direct", "1");
    }
    if let Some(r) = s.runtime {
        o.str("runtime", &duration_str(r));
    }
    if s.time_based {
        o.str("time_based", "1");
    }
    if !s.ramp_time.is_zero() {
        o.str("ramp_time", &duration_str(s.ramp_time));
    }
    if !s.startdelay.is_zero() {
        o.str("startdelay", &duration_str(s.startdelay));
    }
    let defaults = JobSpec::with_defaults("", Default::default());
    if s.on_error.is_set() {
        o.str("continue_on_error", s.on_error.continue_name());
    }
    if s.randseed != defaults.randseed {
        o.str("randseed", &s.randseed.to_string());
    }
    if !s.randrepeat {
        o.str("randrepeat", "0");
    }
    if s.norandommap {
        o.str("norandommap", "1");
    }
    match s.distribution {
        Distribution::Uniform => {}
        Distribution::Zipf { theta } => o.str("random_distribution", &format!("zipf:{theta}")),
        Distribution::Pareto { h } => o.str("random_distribution", &format!("pareto:{h}")),
        Distribution::Normal { dev_pct } => {
            o.str("random_distribution", &format!("normal:{dev_pct}"))
        }
    }
    let per_dir = |v: [Option<u64>; 2], f: &dyn Fn(u64) -> String| {
        let part = |x: Option<u64>| x.map(f).unwrap_or_default();
        if v[0] == v[1] {
            part(v[0])
        } else {
            format!("{},{}", part(v[0]), part(v[1]))
        }
    };
    if s.rate.iops.iter().any(Option::is_some) {
        o.str("rate_iops", &per_dir(s.rate.iops, &|x| x.to_string()));
    }
    if s.rate.bytes_per_sec.iter().any(Option::is_some) {
        o.str("rate", &per_dir(s.rate.bytes_per_sec, &size_str));
    }
    if s.rate.process == RateProcess::Poisson {
        o.str("rate_process", "poisson");
    }
    if !s.thinktime.is_zero() {
        // fio's thinktime is in microseconds when given without a unit.
        o.str("thinktime", &s.thinktime.as_micros().to_string());
        if s.thinktime_blocks != 1 {
            o.str("thinktime_blocks", &s.thinktime_blocks.to_string());
        }
    }
}

/// Syncs, verification, stonewalls, reporting and the engine's buffer options.
fn integrity_and_report_options(o: &mut Obj, s: &JobSpec) {
    if s.fsync != 0 {
        o.str("fsync", &s.fsync.to_string());
    }
    if s.fdatasync != 0 {
        o.str("fdatasync", &s.fdatasync.to_string());
    }
    if s.end_fsync {
        o.str("end_fsync", "1");
    }
    if s.verify.is_some() {
        o.str("verify", "crc32c");
    }
    if s.stonewall {
        o.str("stonewall", "1");
    }
    if s.group_reporting {
        o.str("group_reporting", "1");
    }
    if s.percentile_list != DEFAULT_PERCENTILES {
        let list: Vec<String> = s.percentile_list.iter().map(|p| format!("{p}")).collect();
        o.str("percentile_list", &list.join(":"));
    }
    if !s.invalidate {
        o.str("invalidate", "0");
    }
    if s.complete_max != 1 {
        o.str("iodepth_batch_complete_max", &s.complete_max.to_string());
    }
    if !s.fixedbufs {
        o.str("fixedbufs", "0");
    }
    if !s.registerfiles {
        o.str("registerfiles", "0");
    }
}

/// A byte count in fio's input syntax, with the largest binary suffix that divides it ("4k",
/// "1m"; fio's default kb_base is 1024).
fn size_str(v: u64) -> String {
    for (shift, suffix) in [(40, "t"), (30, "g"), (20, "m"), (10, "k")] {
        if v != 0 && v.trailing_zeros() >= shift {
            return format!("{}{suffix}", v >> shift);
        }
    }
    v.to_string()
}

fn extent(e: Extent) -> String {
    match e {
        Extent::Bytes(b) => size_str(b),
        Extent::Percent(p) => format!("{p}%"),
    }
}

/// A duration in fio's input syntax: plain seconds when whole (fio's default unit), else ms.
fn duration_str(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        d.as_secs().to_string()
    } else {
        format!("{}ms", d.as_millis())
    }
}

// ---------------------------------------------------------------------------------------------
// The ordered tree and fio's printer. serde_json's map sorts keys, which would scatter fio's
// layout (and put "10.000000" before "5.000000"); the tree keeps fio's order for `to_string`.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Node {
    Obj(Obj),
    Arr(Vec<Node>),
    Str(String),
    Int(u64),
    Float(f64),
    Bool(bool),
}

#[derive(Debug, Clone, Default)]
struct Obj(Vec<(String, Node)>);

impl Obj {
    fn int(&mut self, k: &str, v: u64) {
        self.0.push((k.to_string(), Node::Int(v)));
    }
    fn float(&mut self, k: &str, v: f64) {
        self.0.push((k.to_string(), Node::Float(v)));
    }
    fn bool(&mut self, k: &str, v: bool) {
        self.0.push((k.to_string(), Node::Bool(v)));
    }
    fn str(&mut self, k: &str, v: &str) {
        self.0.push((k.to_string(), Node::Str(v.to_string())));
    }
    fn obj(&mut self, k: &str, v: Obj) {
        self.0.push((k.to_string(), Node::Obj(v)));
    }
    fn arr(&mut self, k: &str, v: Vec<Node>) {
        self.0.push((k.to_string(), Node::Arr(v)));
    }
}

impl From<Node> for Value {
    fn from(n: Node) -> Value {
        match n {
            Node::Obj(o) => Value::Object(o.0.into_iter().map(|(k, v)| (k, v.into())).collect()),
            Node::Arr(a) => Value::Array(a.into_iter().map(Value::from).collect()),
            Node::Str(s) => Value::String(s),
            Node::Int(i) => Value::from(i),
            Node::Bool(b) => Value::Bool(b),
            // JSON has no NaN or infinity; a figure that is not finite has no meaning here.
            Node::Float(f) => Value::from(if f.is_finite() { f } else { 0.0 }),
        }
    }
}

/// fio's `json_print_object`: `"key" : value`, two spaces per level, floats as C's "%f". Empty
/// objects and arrays print as `{}` and `[]` (fio would print an empty line inside them).
fn print(n: &Node, level: usize, out: &mut String) {
    let indent = |l: usize, out: &mut String| out.extend(std::iter::repeat_n("  ", l));
    match n {
        Node::Obj(o) if o.0.is_empty() => out.push_str("{}"),
        Node::Arr(a) if a.is_empty() => out.push_str("[]"),
        Node::Obj(o) => {
            out.push_str("{\n");
            for (i, (k, v)) in o.0.iter().enumerate() {
                if i > 0 {
                    out.push_str(",\n");
                }
                indent(level + 1, out);
                out.push_str(&Value::String(k.clone()).to_string());
                out.push_str(" : ");
                print(v, level + 1, out);
            }
            out.push('\n');
            indent(level, out);
            out.push('}');
        }
        Node::Arr(a) => {
            out.push_str("[\n");
            for (i, v) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(",\n");
                }
                indent(level + 1, out);
                print(v, level + 1, out);
            }
            out.push('\n');
            indent(level, out);
            out.push(']');
        }
        Node::Str(s) => out.push_str(&Value::String(s.clone()).to_string()),
        Node::Int(i) => out.push_str(&i.to_string()),
        Node::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Node::Float(f) => out.push_str(&format!("{:.6}", if f.is_finite() { *f } else { 0.0 })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Origin, Rate};
    use crate::report::JobReport;
    use crate::stats::{JobStats, record};

    /// Keys of a `jobs[]` entry in fio 3.33's output (`fio --output-format=json`, null engine
    /// and a psync file job), in fio's order.
    const FIO_JOB_KEYS: [&str; 26] = [
        "jobname",
        "groupid",
        "error",
        "eta",
        "elapsed",
        "job options",
        "read",
        "write",
        "trim",
        "sync",
        "job_runtime",
        "usr_cpu",
        "sys_cpu",
        "ctx",
        "majf",
        "minf",
        "iodepth_level",
        "iodepth_submit",
        "iodepth_complete",
        "latency_ns",
        "latency_us",
        "latency_ms",
        "latency_depth",
        "latency_target",
        "latency_percentile",
        "latency_window",
    ];
    /// Keys of a "read"/"write"/"trim" object in fio 3.33's output, in fio's order.
    const FIO_DIR_KEYS: [&str; 23] = [
        "io_bytes",
        "io_kbytes",
        "bw_bytes",
        "bw",
        "iops",
        "runtime",
        "total_ios",
        "short_ios",
        "drop_ios",
        "slat_ns",
        "clat_ns",
        "lat_ns",
        "bw_min",
        "bw_max",
        "bw_agg",
        "bw_mean",
        "bw_dev",
        "bw_samples",
        "iops_min",
        "iops_max",
        "iops_mean",
        "iops_stddev",
        "iops_samples",
    ];
    const T0: u64 = 1_700_000_000;

    /// A random-read job: 3000 reads of 4 KiB in 3 s; clat 1..=1000 ns three times over (exact
    /// in the histogram, which is exact below 2048), slat 10 ns, lat = clat + 10; intervals of
    /// 1000, 1200 and 800 IOs and a short tail.
    fn read_job(name: &str, clone: u32, group_reporting: bool) -> JobReport {
        let mut spec = JobSpec::with_defaults(name, Origin::default());
        spec.pattern = Pattern::RandRead;
        spec.iodepth = 4;
        spec.group_reporting = group_reporting;
        spec.percentile_list = vec![50.0, 99.0, 99.9];
        let mut st = JobStats::new(false);
        st.runtime = Duration::from_millis(3000);
        let d = &mut st.dirs[0];
        d.ios = 3000;
        d.bytes = 3000 * 4096;
        for _ in 0..3 {
            for v in 1..=1000 {
                record(&mut d.clat, v);
                record(&mut d.slat, 10);
                record(&mut d.lat, v + 10);
            }
        }
        let iv = |end_ms: u64, len_ms: u64, ios: u64| IntervalSummary {
            end: Duration::from_millis(end_ms),
            len: Duration::from_millis(len_ms),
            ios: [ios, 0],
            bytes: [ios * 4096, 0],
            errors: [0, 0],
            outstanding: 4.0,
            waiting: 0.0,
        };
        st.intervals = vec![
            iv(1000, 1000, 1000),
            iv(2000, 1000, 1200),
            iv(3000, 1000, 800),
        ];
        st.intervals.push(iv(3000, 10, 0));
        st.depth_hist = [0, 0, 3000, 0, 0, 0, 0];
        st.usr_cpu = Duration::from_millis(300);
        st.sys_cpu = Duration::from_millis(1500);
        st.ctx = 42;
        st.minf = 7;
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
            elapsed: Duration::from_millis(3500),
        }
    }

    fn keys(v: &Value) -> Vec<String> {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    }

    #[test]
    fn stuck_ios_are_listed_only_when_there_are_any_and_print_as_json() {
        let plain = to_value(&report(vec![read_job("r", 0, false)]));
        assert!(plain["jobs"][0].get("stuck_ios").is_none());
        let mut job = read_job("r", 0, false);
        job.stats.stuck = vec![crate::stats::StuckIo {
            file: "/d/r.0.0".into(),
            offset: 8192,
            len: 4096,
            direction: Direction::Write,
            start_ms: 250,
            latency_ms: 6000,
            completed: false,
        }];
        job.stats.stuck_count = 3;
        let r = report(vec![job]);
        // The printed text (fio's printer) and the value agree, booleans included.
        let printed: Value = serde_json::from_str(&to_string(&r)).expect("valid JSON");
        let j = &printed["jobs"][0];
        assert_eq!(j["stuck_ios"], to_value(&r)["jobs"][0]["stuck_ios"]);
        assert_eq!(j["stuck_count"], 3);
        assert_eq!(
            j["stuck_ios"][0],
            serde_json::json!({"file": "/d/r.0.0", "offset": 8192, "len": 4096,
                "direction": "write", "start_ms": 250, "latency_ms": 6000, "completed": false})
        );
    }

    #[test]
    fn every_fio_key_is_present() {
        let r = report(vec![read_job("r", 0, false)]);
        let doc = to_value(&r);
        for k in [
            "fio version",
            "timestamp",
            "timestamp_ms",
            "time",
            "jobs",
            "disk_util",
        ] {
            assert!(doc.get(k).is_some(), "top-level key {k} missing");
        }
        let job = &doc["jobs"][0];
        for k in FIO_JOB_KEYS {
            assert!(job.get(k).is_some(), "job key {k} missing");
        }
        for dir in ["read", "write", "trim"] {
            let mut want: Vec<String> = FIO_DIR_KEYS.iter().map(|s| s.to_string()).collect();
            want.sort();
            assert_eq!(keys(&job[dir]), want, "{dir}");
        }
        assert_eq!(keys(&job["sync"]), ["lat_ns", "total_ios"]);
        for lat in ["slat_ns", "lat_ns"] {
            assert_eq!(
                keys(&job["read"][lat]),
                ["N", "max", "mean", "min", "stddev"]
            );
        }
        assert_eq!(
            keys(&job["read"]["clat_ns"]),
            ["N", "max", "mean", "min", "percentile", "stddev"]
        );
        // No samples, no percentile object (fio's rule).
        assert!(job["write"]["clat_ns"].get("percentile").is_none());
        assert_eq!(job["latency_ms"].as_object().unwrap().len(), 12);
        assert_eq!(job["latency_us"].as_object().unwrap().len(), 10);
        assert!(job["iodepth_level"].get(">=64").is_some());
    }

    #[test]
    fn read_direction_figures_follow_fios_arithmetic() {
        let r = report(vec![read_job("r", 0, false)]);
        let job = &job_values(&r)[0];
        let rd = &job["read"];
        assert_eq!(rd["io_bytes"], 12_288_000);
        assert_eq!(rd["io_kbytes"], 12_000);
        assert_eq!(rd["runtime"], 3000);
        // 1000 * 12288000 / 3000 bytes/s, and that / 1024 KiB/s.
        assert_eq!(rd["bw_bytes"], 4_096_000);
        assert_eq!(rd["bw"], 4000);
        assert_eq!(rd["iops"], 1000.0);
        assert_eq!(rd["total_ios"], 3000);
        let clat = &rd["clat_ns"];
        assert_eq!(clat["N"], 3000);
        assert_eq!(clat["min"], 1);
        assert_eq!(clat["max"], 1000);
        assert_eq!(clat["mean"], 500.5);
        // 50% of 3000 is the 1500th sample: value 500; 99% the 2970th: 990; 99.9% the 2997th: 999.
        assert_eq!(clat["percentile"]["50.000000"], 500);
        assert_eq!(clat["percentile"]["99.000000"], 990);
        assert_eq!(clat["percentile"]["99.900000"], 999);
        assert_eq!(rd["slat_ns"]["mean"], 10.0);
        assert_eq!(rd["slat_ns"]["stddev"], 0.0);
        assert_eq!(rd["lat_ns"]["max"], 1010);
        assert!(rd.get("lat_intended_ns").is_none());
        // Intervals: 1000, 1200, 800 IOPS (the 10 ms tail is not a sample).
        assert_eq!(rd["iops_samples"], 3);
        assert_eq!(rd["iops_min"], 800);
        assert_eq!(rd["iops_max"], 1200);
        assert_eq!(rd["iops_mean"], 1000.0);
        assert_eq!(rd["iops_stddev"], 200.0);
        assert_eq!(rd["bw_min"], 3200);
        assert_eq!(rd["bw_max"], 4800);
        assert_eq!(rd["bw_mean"], 4000.0);
        assert_eq!(rd["bw_dev"], 800.0);
        assert_eq!(rd["bw_agg"], 100.0);
        // The unused direction: all zero, runtime 0, no samples.
        assert_eq!(job["write"]["runtime"], 0);
        assert_eq!(job["write"]["iops"], 0.0);
        assert_eq!(job["write"]["bw_samples"], 0);

        assert_eq!(job["error"], 0);
        assert!(job.get("error_message").is_none());
        assert_eq!(job["job_runtime"], 3000);
        assert_eq!(job["usr_cpu"], 10.0);
        assert_eq!(job["sys_cpu"], 50.0);
        assert_eq!(job["ctx"], 42);
        assert_eq!(job["minf"], 7);
        assert_eq!(job["iodepth_level"]["4"], 100.0);
        assert_eq!(job["iodepth_level"]["1"], 0.0);
        assert_eq!(job["latency_depth"], 4);
        assert_eq!(job["elapsed"], 4);
        assert_eq!(job["job_start"], T0 * 1000);
        // clat 1..=1000 ns: 1 below 2 ns, 2..3 below 4, 4..9 below 10, 990..999 below 1000 ns,
        // and 1000 ns is the first microsecond bucket.
        assert_eq!(job["latency_ns"]["2"], 0.1);
        assert_eq!(job["latency_ns"]["4"], 0.2);
        assert_eq!(job["latency_ns"]["10"], 0.6);
        assert_eq!(job["latency_ns"]["1000"], 25.0);
        assert_eq!(job["latency_us"]["2"], 0.1);
        assert_eq!(job["job options"]["rw"], "randread");
        assert_eq!(job["job options"]["iodepth"], "4");
        assert_eq!(job["job options"]["percentile_list"], "50:99:99.9");
    }

    #[test]
    fn group_reporting_merges_histograms_and_names_the_entry_after_the_first_job() {
        let mut second = read_job("r", 1, true);
        // The second clone saw slower IOs: 2000 ns each.
        let d = &mut second.stats.dirs[0];
        d.clat.reset();
        for _ in 0..3000 {
            record(&mut d.clat, 2000);
        }
        let r = report(vec![
            read_job("r", 0, true),
            second,
            read_job("other", 0, false),
        ]);
        let jobs = job_values(&r);
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0]["jobname"], "r");
        assert_eq!(jobs[1]["jobname"], "other");
        let rd = &jobs[0]["read"];
        assert_eq!(rd["total_ios"], 6000);
        assert_eq!(rd["io_bytes"], 24_576_000);
        assert_eq!(rd["iops"], 2000.0);
        assert_eq!(rd["clat_ns"]["N"], 6000);
        // Merged, not averaged: the median is the 3000th of 6000 samples, the slowest of the
        // first clone (1000 ns); everything above it is the second clone's 2000 ns.
        assert_eq!(rd["clat_ns"]["percentile"]["50.000000"], 1000);
        assert_eq!(rd["clat_ns"]["percentile"]["99.000000"], 2000);
        assert_eq!(rd["clat_ns"]["max"], 2000);
        // Intervals add: 2000, 2400, 1600 IOPS.
        assert_eq!(rd["iops_max"], 2400);
        assert_eq!(rd["iops_mean"], 2000.0);
        // Group aggregate: 36864000 bytes over 3000 ms = 12288000 B/s = 12000 KiB/s; the merged
        // entry's mean is 8000 KiB/s, two thirds of it.
        let agg = rd["bw_agg"].as_f64().unwrap();
        assert!((agg - 200.0 / 3.0).abs() < 1e-9, "{agg}");
        // CPU percentages are per member: summed cpu over summed runtime.
        assert_eq!(jobs[0]["usr_cpu"], 10.0);
        assert_eq!(jobs[0]["job_runtime"], 6000);
    }

    #[test]
    fn open_loop_latency_and_errors_get_their_own_keys() {
        let mut job = read_job("rate", 0, false);
        job.spec.rate = Rate {
            iops: [Some(1000), None],
            ..Default::default()
        };
        let mut intended = crate::stats::latency_histogram();
        for v in 1..=100 {
            record(&mut intended, v * 10);
        }
        job.stats.dirs[0].lat_intended = Some(intended);
        job.stats.dirs[0].errors = 3;
        job.error = Some("Input/output error (os error 5) reading /tmp/x".into());
        let r = report(vec![job]);
        let job = &job_values(&r)[0];
        let li = &job["read"]["lat_intended_ns"];
        assert_eq!(li["N"], 100);
        assert_eq!(li["max"], 1000);
        assert_eq!(li["percentile"]["99.000000"], 990);
        assert_eq!(job["read"]["error_ios"], 3);
        assert_eq!(job["error"], 5);
        assert_eq!(
            job["error_message"],
            "Input/output error (os error 5) reading /tmp/x"
        );
        assert_eq!(job["job options"]["rate_iops"], "1000,");
    }

    #[test]
    fn continue_on_error_adds_fios_total_err_and_first_error() {
        let plain = report(vec![read_job("plain", 0, false)]);
        let plain = &job_values(&plain)[0];
        assert!(
            plain.get("total_err").is_none(),
            "fio adds them only with the option"
        );
        let mut job = read_job("coe", 0, false);
        job.spec.on_error.set_continue("all").unwrap();
        job.stats.dirs[0].errors = 7;
        job.stats.errors.add(5, 7);
        let r = report(vec![job]);
        let job = &job_values(&r)[0];
        assert_eq!(job["total_err"], 7);
        assert_eq!(job["first_error"], 5);
        // As fio: the first error is the job's error, without a message (it did not stop).
        assert_eq!(job["error"], 5);
        assert!(job.get("error_message").is_none());
        assert_eq!(job["job options"]["continue_on_error"], "all");
        // In fio's order: after latency_ms, before latency_depth.
        let text = to_string(&r);
        let at = |k: &str| text.find(&format!("\"{k}\" :")).unwrap();
        assert!(at("latency_ms") < at("total_err") && at("first_error") < at("latency_depth"));
    }

    #[test]
    fn dir_value_stands_alone_for_the_coordinator() {
        let job = read_job("r", 0, false);
        let v = dir_value(&job.stats.dirs[0], Duration::from_secs(3), &[99.0]);
        assert_eq!(v["iops"], 1000.0);
        assert_eq!(v["clat_ns"]["percentile"]["99.000000"], 990);
        assert_eq!(v["bw_samples"], 0);
        let v = dir_value_with_intervals(
            &job.stats.dirs[0],
            Duration::from_secs(3),
            &[99.0],
            &job.stats.intervals,
            Direction::Read,
            4 << 20,
        );
        assert_eq!(v["iops_samples"], 3);
        assert_eq!(v["bw_agg"], 97.65625); // a mean of 4000 KiB/s of 4096 KiB/s
    }

    #[test]
    fn pretty_output_is_fios_layout_and_parses_back() {
        let r = report(vec![read_job("r", 0, false)]);
        let text = to_string(&r);
        assert!(
            text.starts_with("{\n  \"fio version\" : \"lockstep-"),
            "{text}"
        );
        assert!(text.contains("\n  \"timestamp\" : 1700000003,\n"));
        assert!(text.contains("\n  \"timestamp_ms\" : 1700000003500,\n"));
        assert!(text.contains("\n  \"jobs\" : [\n    {\n      \"jobname\" : \"r\",\n"));
        assert!(text.contains("\n        \"iops\" : 1000.000000,\n"));
        // Percentiles in fio's (ascending) order, not sorted as strings.
        assert!(text.contains(
            "\"percentile\" : {\n            \"50.000000\" : 500,\n            \"99.000000\" : 990,\n            \"99.900000\" : 999\n          }"
        ), "{text}");
        assert!(text.ends_with("\"disk_util\" : []\n}\n"));
        let parsed: Value = serde_json::from_str(&text).expect("valid JSON");
        assert_eq!(
            parsed["jobs"][0]["read"]["clat_ns"]["percentile"]["99.900000"],
            999
        );
        assert_eq!(keys(&parsed), keys(&to_value(&r)));
    }

    #[test]
    fn time_is_ctime_of_the_end_of_the_run() {
        let r = report(vec![]);
        let doc = Value::from(Node::Obj(document(&r, 0)));
        assert_eq!(doc["time"], "Tue Nov 14 22:13:23 2023");
        assert_eq!(doc["jobs"], Value::Array(vec![]));
    }
}
