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
pub mod text;

use std::path::Path;

use crate::results::RunResults;

/// Writes `bytes` to `path` via a temporary file in the same directory.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    lockstep_agent::standalone::write_atomically(path, bytes)
}

/// results.json, timeline.json, timeline.csv and report.txt (fio.json and intervals.hlog are
/// written by the run).
pub fn write_run_dir(dir: &Path, results: &RunResults) -> std::io::Result<()> {
    let json = serde_json::to_vec_pretty(results).map_err(std::io::Error::other)?;
    write_atomically(&dir.join("results.json"), &json)?;
    let timeline = serde_json::to_vec(&results.timeline).map_err(std::io::Error::other)?;
    write_atomically(&dir.join("timeline.json"), &timeline)?;
    write_atomically(&dir.join("timeline.csv"), csv::timeline(results).as_bytes())?;
    write_atomically(&dir.join("report.txt"), text::render(results).as_bytes())?;
    Ok(())
}

/// Reads a finished run's results.json.
pub fn read_run_dir(dir: &Path) -> Result<RunResults, String> {
    let path = dir.join("results.json");
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| format!("{}: not a lockstep results file: {e}", path.display()))
}
