//! Exporters of a cluster run: one `RunResults`, one module per format.
//! - `text`: the readable final report (per volume, per node, cluster, objectives, chokepoint);
//! - `fio`: fio-compatible JSON (`client_stats[]` with a hostname per entry and "All clients");
//! - `csv`: the per-volume, per-interval timeline (`timeline.json` holds the same in the
//!   `Timeline` format the chokepoint finder reads).
//!
//! Each format is an [`Exporter`]; `write_run_dir` writes a list of them atomically (temporary
//! file, then rename), so an interrupted write never leaves half a results file.

pub mod csv;
pub mod fio;
pub mod html;
pub mod metrics;
pub mod text;

use std::path::Path;

use crate::results::RunResults;

/// Writes `bytes` to `path` via a temporary file in the same directory.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    lockstep_core::atomic_file::write_atomically(path, bytes)
}

/// One output format of a finished run: a file of the results directory, made from the
/// results alone. Every format is one implementation, so the run directory, `lockstep report`
/// and a series' summary all write the same files the same way.
pub trait Exporter {
    /// The file's name in the results directory.
    fn file_name(&self) -> &'static str;
    /// The file's bytes.
    fn render(&self, results: &RunResults) -> std::io::Result<Vec<u8>>;
    /// Whether this run gets the file at all.
    fn wanted(&self, _results: &RunResults) -> bool {
        true
    }
}

/// Past this many points the per-volume timeline is not written as JSON or CSV (hundreds of
/// megabytes a file, a minute to parse): `data/points.bin` has every point, and readers fold
/// it back (`read_timeline`).
pub const TIMELINE_FILE_POINTS: usize = 1_000_000;

fn timeline_points(r: &RunResults) -> usize {
    r.timeline.volumes.iter().map(|v| v.points.len()).sum()
}

/// `report.txt`: the readable report (the same text the run prints).
pub struct TextReport;
/// `results.json`: the one results structure, without the per-volume timeline.
pub struct ResultsJson;
/// `timeline.json`: every volume's interval points (what the chokepoint finder reads).
pub struct TimelineJson;
/// `timeline.csv`: the same timeline, one row per volume and interval.
pub struct TimelineCsv;
/// `fio.json`: fio's client/server JSON, from the agents' final reports.
pub struct FioJson;
/// `report.html`: the report people look at, one self-contained page (docs/report.md).
pub struct HtmlReport;

impl Exporter for TextReport {
    fn file_name(&self) -> &'static str {
        "report.txt"
    }
    fn render(&self, r: &RunResults) -> std::io::Result<Vec<u8>> {
        Ok(text::render(r).into_bytes())
    }
}

impl Exporter for ResultsJson {
    fn file_name(&self) -> &'static str {
        "results.json"
    }
    /// Read back before it is written: serde_json writes a NaN or an infinity as null, which a
    /// plain number field cannot read, and `lockstep report` and `compare` would then refuse the
    /// run. The file is still written (nothing is lost); the error names the field's place.
    fn render(&self, r: &RunResults) -> std::io::Result<Vec<u8>> {
        let bytes = serde_json::to_vec_pretty(r).map_err(std::io::Error::other)?;
        if let Err(e) = serde_json::from_slice::<RunResults>(&bytes) {
            tracing::error!(
                "results.json will not read back ({e}): a figure is not a finite number; \
                 please report this as a lockstep bug"
            );
        }
        Ok(bytes)
    }
}

impl Exporter for TimelineJson {
    fn file_name(&self) -> &'static str {
        "timeline.json"
    }
    fn render(&self, r: &RunResults) -> std::io::Result<Vec<u8>> {
        serde_json::to_vec(&r.timeline).map_err(std::io::Error::other)
    }
    fn wanted(&self, r: &RunResults) -> bool {
        timeline_points(r) <= TIMELINE_FILE_POINTS
    }
}

impl Exporter for TimelineCsv {
    fn file_name(&self) -> &'static str {
        "timeline.csv"
    }
    fn render(&self, r: &RunResults) -> std::io::Result<Vec<u8>> {
        Ok(csv::timeline(r).into_bytes())
    }
    fn wanted(&self, r: &RunResults) -> bool {
        timeline_points(r) <= TIMELINE_FILE_POINTS
    }
}

impl Exporter for HtmlReport {
    fn file_name(&self) -> &'static str {
        "report.html"
    }
    fn render(&self, r: &RunResults) -> std::io::Result<Vec<u8>> {
        Ok(html::render(r).into_bytes())
    }
}

impl Exporter for FioJson {
    fn file_name(&self) -> &'static str {
        "fio.json"
    }
    fn render(&self, r: &RunResults) -> std::io::Result<Vec<u8>> {
        serde_json::to_vec_pretty(&fio::document(r)).map_err(std::io::Error::other)
    }
}

/// The files of a single run's results directory (intervals.hlog is written by the run as the
/// intervals arrive).
pub const RUN_DIR: [&dyn Exporter; 6] = [
    &TextReport,
    &HtmlReport,
    &ResultsJson,
    &TimelineJson,
    &TimelineCsv,
    &FioJson,
];

/// Writes `exporters`' files into `dir`. Every file is tried even when one fails (a full or
/// read-only disk), so what could be written stays; the error names each file that could not
/// be.
pub fn write_run_dir(
    dir: &Path,
    results: &RunResults,
    exporters: &[&dyn Exporter],
) -> std::io::Result<()> {
    let mut files = Vec::with_capacity(exporters.len());
    let mut failed = Vec::new();
    for e in exporters.iter().filter(|e| e.wanted(results)) {
        match e.render(results) {
            Ok(bytes) => files.push((e.file_name(), bytes)),
            Err(err) => failed.push(format!("{}: {err}", dir.join(e.file_name()).display())),
        }
    }
    let written = write_all_or_name_failures(dir, &files);
    match (written, failed.is_empty()) {
        (r, true) => r,
        (Ok(()), false) => Err(std::io::Error::other(failed.join("; "))),
        (Err(e), false) => Err(std::io::Error::new(
            e.kind(),
            format!("{e}; {}", failed.join("; ")),
        )),
    }
}

/// Writes each file of a run directory atomically; the error lists every one that failed.
pub fn write_all_or_name_failures(dir: &Path, files: &[(&str, Vec<u8>)]) -> std::io::Result<()> {
    let mut failed = Vec::new();
    let mut kind = std::io::ErrorKind::Other;
    for (name, bytes) in files {
        let path = dir.join(name);
        if let Err(e) = write_atomically(&path, bytes) {
            kind = e.kind();
            failed.push(format!("{}: {e}", path.display()));
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(std::io::Error::new(kind, failed.join("; ")))
    }
}

/// Checks before any IO that a results directory can be written: creates and removes a probe
/// file, which catches read-only filesystems and permissions that `access` would not for root.
pub fn check_writable(dir: &Path) -> std::io::Result<()> {
    let probe = dir.join(format!(".lockstep-probe-{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)?;
    std::fs::remove_file(&probe)
}

/// Reads a run directory's timeline back into `results.timeline` (the per-volume series
/// report.html's heatmap and chokepoint panel draw): timeline.json, or, for a run too large
/// for one, its `data/points.bin` folded to [`TIMELINE_FILE_POINTS`]; a directory with
/// neither keeps it empty.
pub fn read_timeline(dir: &Path, results: &mut RunResults) -> Result<(), String> {
    let path = dir.join("timeline.json");
    match std::fs::read(&path) {
        Ok(bytes) => {
            results.timeline = serde_json::from_slice(&bytes)
                .map_err(|e| format!("{}: not a lockstep timeline: {e}", path.display()))?;
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => timeline_from_points(dir, results),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

fn timeline_from_points(dir: &Path, results: &mut RunResults) -> Result<(), String> {
    use crate::results::keeper::{Keep, fold_for};
    use crate::results::timeline::{Timeline, VolumeSeries};
    if !crate::results::store::StoreReader::exists(dir) {
        return Ok(());
    }
    let reader = crate::results::store::StoreReader::open(dir).map_err(|e| e.to_string())?;
    let interval_ms = reader.manifest.interval_ms.max(1);
    let intervals = results.duration_ms.div_ceil(interval_ms) + 1;
    let volumes = reader.manifest.volumes.len();
    let keep = Keep {
        interval_ms,
        fold: fold_for(intervals, volumes)
            .max((intervals * volumes as u64).div_ceil(TIMELINE_FILE_POINTS as u64)),
        recent: 0,
        in_memory: true,
    };
    eprintln!(
        "lockstep: reading the timeline from {} ({volumes} volumes, one point per {} intervals)",
        reader.dir.display(),
        keep.fold
    );
    let meta = Timeline {
        interval_ms,
        volumes: reader
            .manifest
            .volumes
            .iter()
            .map(|v| {
                let r = results
                    .volumes
                    .iter()
                    .find(|r| r.node == v.node && r.volume == v.volume);
                VolumeSeries {
                    node: v.node.clone(),
                    volume: v.volume.clone(),
                    role: v.role.clone(),
                    model: r.and_then(|r| r.model.clone()),
                    configured_depth: r.map_or(0, |r| r.configured_depth),
                    lost_at_ms: r.and_then(|r| r.lost_at_ms),
                    ..Default::default()
                }
            })
            .collect(),
        faults: results.faults.clone(),
    };
    results.timeline = reader.timeline(&keep, meta).map_err(|e| e.to_string())?;
    Ok(())
}

/// Reads a finished run's results.json.
pub fn read_run_dir(dir: &Path) -> Result<RunResults, String> {
    let path = dir.join("results.json");
    match std::fs::metadata(&path) {
        Ok(m) if !m.is_file() => {
            return Err(format!("{}: not a regular file", path.display()));
        }
        Err(e) => return Err(format!("{}: {e}", path.display())),
        Ok(_) => {}
    }
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| format!("{}: not a lockstep results file: {e}", path.display()))
}
