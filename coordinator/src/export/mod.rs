//! Exporters of a cluster run: one `RunResults`, one module per format.
//! - `text`: the readable final report (per volume, per node, cluster, objectives, chokepoint);
//! - `fio`: fio-compatible JSON (`client_stats[]` with a hostname per entry and "All clients");
//! - `csv`: the per-volume, per-interval timeline (`timeline.json` holds the same in the
//!   `Timeline` format the chokepoint finder reads).
//!
//! `write_run_dir` writes every file of a run directory atomically (temporary file, then
//! rename), so an interrupted write never leaves half a results file.

pub mod csv;
pub mod fio;
pub mod metrics;
pub mod text;

use std::path::Path;

use crate::results::RunResults;

/// Writes `bytes` to `path` via a temporary file in the same directory.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    lockstep_core::atomic_file::write_atomically(path, bytes)
}

/// results.json, timeline.json, timeline.csv and report.txt (fio.json and intervals.hlog are
/// written by the run). Every file is tried even when one fails (a full or read-only disk), so
/// what could be written stays; the error names each file that could not be.
pub fn write_run_dir(dir: &Path, results: &RunResults) -> std::io::Result<()> {
    let json = serde_json::to_vec_pretty(results).map_err(std::io::Error::other)?;
    let timeline = serde_json::to_vec(&results.timeline).map_err(std::io::Error::other)?;
    let files: [(&str, Vec<u8>); 4] = [
        ("report.txt", text::render(results).into_bytes()),
        ("results.json", json),
        ("timeline.json", timeline),
        ("timeline.csv", csv::timeline(results).into_bytes()),
    ];
    write_all_or_name_failures(dir, &files)
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
