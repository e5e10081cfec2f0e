//! The raw interval histograms of a run, in HdrHistogram's interval log format
//! (`intervals.hlog`), so anyone can re-analyze a run with standard HdrHistogram tools.
//!
//! Lines are written straight from the V2+deflate bytes the agents sent (the log format is their
//! base64), so the coordinator never re-encodes a histogram. One tagged line per volume,
//! direction and interval: `Tag=<node>/<volume>/<read|write>/<lat|lat_intended>,start,length,max,histogram`
//! with start and length in seconds since the run's synchronized start and max in milliseconds.

use std::io::{self, BufRead, Write};

use base64::Engine as _;
use lockstep_proto::histogram::SparseHistogram;

/// The run's hlog file: a full or failing results disk must not end the run (its report
/// still reaches stdout), so the first write error is kept for the end and later writes are
/// dropped.
pub type RunLog = HlogWriter<io::BufWriter<KeepGoing<std::fs::File>>>;

/// A writer that records its first error instead of returning it, so the caller carries on.
pub struct KeepGoing<W: Write> {
    inner: W,
    pub error: Option<io::Error>,
}

impl<W: Write> KeepGoing<W> {
    pub fn new(inner: W) -> Self {
        KeepGoing { inner, error: None }
    }
}

impl<W: Write> Write for KeepGoing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.error.is_none() {
            if let Err(e) = self.inner.write_all(buf) {
                self.error = Some(e);
            }
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        if self.error.is_none() {
            if let Err(e) = self.inner.flush() {
                self.error = Some(e);
            }
        }
        Ok(())
    }
}

pub struct HlogWriter<W: Write> {
    out: W,
}

impl<W: Write> HlogWriter<W> {
    pub fn new(mut out: W, start_unix_ms: i64) -> io::Result<Self> {
        writeln!(
            out,
            "#[lockstep raw interval histograms: latency in ns, one line per volume, direction, interval]"
        )?;
        writeln!(
            out,
            "#[StartTime: {:.3} (seconds since epoch)]",
            start_unix_ms as f64 / 1000.0
        )?;
        writeln!(
            out,
            "#[BaseTime: {:.3} (seconds since epoch)]",
            start_unix_ms as f64 / 1000.0
        )?;
        writeln!(
            out,
            "\"StartTimestamp\",\"Interval_Length\",\"Interval_Max\",\"Interval_Compressed_Histogram\""
        )?;
        Ok(HlogWriter { out })
    }

    /// One histogram as received (`bytes` is V2+deflate); `max_ns` for the max column.
    pub fn write(
        &mut self,
        tag: &str,
        start_s: f64,
        len_s: f64,
        max_ns: u64,
        bytes: &[u8],
    ) -> io::Result<()> {
        let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
        writeln!(
            self.out,
            "Tag={tag},{start_s:.3},{len_s:.3},{:.3},{b64}",
            max_ns as f64 / 1e6
        )
    }

    pub fn into_inner(self) -> W {
        self.out
    }
}

/// One histogram read back from a log.
pub struct LogEntry {
    pub tag: String,
    pub start_s: f64,
    pub len_s: f64,
    pub histogram: SparseHistogram,
}

#[derive(Debug, thiserror::Error)]
pub enum HlogError {
    #[error("{path}:{line}: {message}")]
    Parse {
        path: String,
        line: usize,
        message: String,
    },
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
}

/// Reads every tagged histogram of a log (used by `lockstep report --check` and the tests that
/// recompute results from the raw histograms).
pub fn read(path: &std::path::Path) -> Result<Vec<LogEntry>, HlogError> {
    let p = path.display().to_string();
    let f = std::fs::File::open(path).map_err(|source| HlogError::Io {
        path: p.clone(),
        source,
    })?;
    let mut out = Vec::new();
    for (i, line) in io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|source| HlogError::Io {
            path: p.clone(),
            source,
        })?;
        let err = |message: String| HlogError::Parse {
            path: p.clone(),
            line: i + 1,
            message,
        };
        let Some(rest) = line.strip_prefix("Tag=") else {
            continue;
        };
        let parts: Vec<&str> = rest.splitn(5, ',').collect();
        if parts.len() != 5 {
            return Err(err("expected Tag=...,start,length,max,histogram".into()));
        }
        let num = |s: &str| s.parse::<f64>().map_err(|e| err(format!("'{s}': {e}")));
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(parts[4])
            .map_err(|e| err(format!("base64: {e}")))?;
        let histogram = SparseHistogram::decode(&bytes).map_err(|e| err(e.to_string()))?;
        out.push(LogEntry {
            tag: parts[0].to_string(),
            start_s: num(parts[1])?,
            len_s: num(parts[2])?,
            histogram,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hdrhistogram::Histogram;

    #[test]
    fn round_trips_through_a_log_file() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).unwrap();
        for v in [1_000u64, 20_000, 300_000] {
            h.record(v).unwrap();
        }
        let bytes = lockstep_proto::histogram::encode(&h).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.hlog");
        let mut w =
            HlogWriter::new(std::fs::File::create(&path).unwrap(), 1_700_000_000_000).unwrap();
        w.write("a/data/read/lat", 0.0, 1.0, h.max(), &bytes)
            .unwrap();
        drop(w);
        let entries = read(&path).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].tag, "a/data/read/lat");
        assert_eq!(
            entries[0].histogram.value_at_quantile(0.5),
            h.value_at_quantile(0.5)
        );
        std::fs::write(&path, "Tag=x,1,2\n").unwrap();
        let e = read(&path).err().unwrap().to_string();
        assert!(e.contains("x.hlog:1"), "{e}");
    }
}
