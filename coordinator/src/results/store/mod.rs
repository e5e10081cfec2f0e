//! A run's data files (`data/` in the results directory): every volume's interval histograms,
//! kept for the whole run and exactly re-mergeable, and every volume's interval points, written
//! as they arrive so the coordinator's memory does not grow with the run's length.
//!
//! Why our own small format and not Parquet or HdrHistogram's text log: the histograms are
//! opaque byte strings (HdrHistogram V2, as the agents encoded them) that only need to be found
//! by time and volume; Arrow/Parquet would add a large dependency to store one binary column,
//! and the hlog text format costs a base64 third more and has no index. The format is a few
//! fixed-size records (format.rs) over zstd, a well-kept compressor; `lockstep export-hlog`
//! still writes the standard HdrHistogram log for other tools (docs/scale.md, "Data files").

pub mod format;
pub mod reader;
pub mod writer;

use serde::{Deserialize, Serialize};

pub use reader::{StoreError, StoreReader};
pub use writer::{ReportBlock, StoreStats, StoreWriter, records_len};

/// The data directory's name in a results directory.
pub const DATA_DIR: &str = "data";
pub const MANIFEST: &str = "volumes.json";
pub const HISTOGRAMS: &str = "histograms.lsh";
pub const INDEX: &str = "histograms.idx";
pub const POINTS: &str = "points.bin";

/// What the data files describe: the run's volumes in the order of their ids.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub interval_ms: u64,
    /// Unix ms of the synchronized start, once known (0 before).
    pub start_unix_ms: i64,
    pub compression: String,
    pub volumes: Vec<StoredVolume>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredVolume {
    pub node: String,
    pub volume: String,
    pub role: String,
}

impl Manifest {
    pub fn new(interval_ms: u64, volumes: Vec<StoredVolume>) -> Self {
        Manifest {
            format: 2,
            interval_ms,
            start_unix_ms: 0,
            compression: "zstd".into(),
            volumes,
        }
    }
}

/// Every histogram of a results directory as hlog entries: from `data/`, or from the
/// `intervals.hlog` of a run made before the data files existed.
pub fn read_entries(
    run_dir: &std::path::Path,
) -> Result<Vec<crate::results::hlog::LogEntry>, String> {
    if StoreReader::exists(run_dir) {
        let r = StoreReader::open(run_dir).map_err(|e| e.to_string())?;
        r.entries(|_| true)
            .map_err(|e| e.to_string())?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())
    } else {
        crate::results::hlog::read(&run_dir.join("intervals.hlog")).map_err(|e| e.to_string())
    }
}
