//! `lockstep export-hlog DIR`: a run's data files as HdrHistogram's interval log, the format
//! HdrHistogram's own tools read. The data files keep the histograms as the agents sent them
//! in a compact indexed form (results/store); this writes the standard text form on demand,
//! streaming block by block, so it works on runs of any length.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

use crate::results::hlog::{HlogWriter, KeepGoing};
use crate::results::store::StoreReader;

/// HdrHistogram's V2 compressed cookie with 8-byte counts, as the hdrhistogram crate writes it.
const COMPRESSED_COOKIE: u32 = 0x1c84_9304 | 0x10;

pub fn export_hlog(dir: &Path, output: Option<&Path>) -> anyhow::Result<ExitCode> {
    let reader = StoreReader::open(dir).map_err(anyhow::Error::msg)?;
    let to = output.map_or_else(|| dir.join("intervals.hlog"), Path::to_path_buf);
    // Written beside the target and renamed at the end: never half a log under its name.
    let tmp = to.with_extension(format!("hlog.tmp-{}", std::process::id()));
    let file =
        std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let start_ms = reader.manifest.start_unix_ms;
    let mut log = HlogWriter::new(std::io::BufWriter::new(KeepGoing::new(file)), start_ms)?;
    let volumes = reader.manifest.volumes.len();
    let started = std::time::Instant::now();
    let mut n = 0u64;
    let mut last_note = std::time::Instant::now();
    let interval_ms = reader.manifest.interval_ms;
    for h in reader
        .histograms(0..u64::MAX, |_| true)
        .map_err(anyhow::Error::msg)?
    {
        let h = h.map_err(anyhow::Error::msg)?;
        // HdrHistogram's log readers take the compressed V2 form only: what the agents sent is
        // copied as it is when it has that form, re-encoded otherwise.
        let bytes = if h.raw.get(0..4) == Some(&COMPRESSED_COOKIE.to_be_bytes()) {
            h.raw
        } else {
            lockstep_proto::histogram::encode(&h.histogram.to_dense())
                .map_err(|e| anyhow::anyhow!("{e}"))?
        };
        let v = &reader.manifest.volumes[h.volume as usize];
        let start_s = (h.interval * interval_ms) as f64 / 1000.0;
        let tag = format!("{}/{}/{}", v.node, v.volume, h.tag.name());
        log.write(
            &tag,
            start_s,
            h.len_ms as f64 / 1000.0,
            h.histogram.max(),
            &bytes,
        )?;
        n += 1;
        if last_note.elapsed().as_secs() >= 5 {
            last_note = std::time::Instant::now();
            eprintln!("lockstep: export-hlog: {n} histograms (t={start_s:.0} s) ...");
        }
    }
    let kept = log
        .into_inner()
        .into_inner()
        .map_err(|e| e.into_error())
        .with_context(|| format!("writing {}", tmp.display()))?;
    if let Some(e) = kept.error {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", tmp.display()));
    }
    std::fs::rename(&tmp, &to).with_context(|| format!("renaming to {}", to.display()))?;
    let _ = std::io::stderr().flush();
    eprintln!(
        "lockstep: {} histograms of {volumes} volumes written to {} in {:.1} s",
        n,
        to.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}
