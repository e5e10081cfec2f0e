//! fio-compatible JSON of a cluster run, shaped like fio's client/server output: every agent's
//! jobs under `client_stats[]` with a `hostname`, then an "All clients" entry whose latency
//! figures come from the merged whole-run histograms of every volume (exact, not averaged).

use std::time::Duration;

use lockstep_core::report::fio_json;
use lockstep_core::stats::{DirStats, latency_histogram};
use lockstep_proto::histogram::SparseHistogram;
use lockstep_proto::v1::DirTotals;
use serde_json::{Value, json};

use crate::results::RunResults;

fn merge_bytes(into: &mut Option<SparseHistogram>, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    if let Ok(h) = SparseHistogram::decode(bytes) {
        match into {
            Some(s) => {
                let _ = s.merge(&h);
            }
            None => *into = Some(h),
        }
    }
}

#[derive(Default)]
struct Acc {
    slat: Option<SparseHistogram>,
    clat: Option<SparseHistogram>,
    lat: Option<SparseHistogram>,
    lat_intended: Option<SparseHistogram>,
}

impl Acc {
    fn add(&mut self, t: &DirTotals) {
        merge_bytes(&mut self.slat, &t.slat_hist);
        merge_bytes(&mut self.clat, &t.clat_hist);
        merge_bytes(&mut self.lat, &t.lat_hist);
        merge_bytes(&mut self.lat_intended, &t.lat_intended_hist);
    }
    fn dir_stats(&self, ios: u64, bytes: u64, errors: u64) -> DirStats {
        let dense = |h: &Option<SparseHistogram>| {
            h.as_ref()
                .map(|s| s.to_dense())
                .unwrap_or_else(latency_histogram)
        };
        DirStats {
            ios,
            bytes,
            errors,
            short_ios: 0,
            saturated: 0,
            slat: dense(&self.slat),
            clat: dense(&self.clat),
            lat: dense(&self.lat),
            lat_intended: self.lat_intended.as_ref().map(|s| s.to_dense()),
        }
    }
}

pub fn document(results: &RunResults) -> Value {
    let finals = &results.finals;
    let mut client_stats = Vec::new();
    let mut acc = [Acc::default(), Acc::default()];
    for (node, v) in finals {
        if let Ok(doc) = serde_json::from_str::<Value>(&v.fio_json) {
            if let Some(jobs) = doc.get("jobs").and_then(|j| j.as_array()) {
                for job in jobs {
                    let mut job = job.clone();
                    if let Some(o) = job.as_object_mut() {
                        o.insert("hostname".into(), json!(node));
                        o.insert("port".into(), json!(0));
                        o.insert("volume".into(), json!(v.volume));
                    }
                    client_stats.push(job);
                }
            }
        }
        if let Some(r) = &v.read {
            acc[0].add(r);
        }
        if let Some(w) = &v.write {
            acc[1].add(w);
        }
    }
    let runtime = Duration::from_millis(results.duration_ms);
    let pct: Vec<f64> = crate::results::PERCENTILES.to_vec();
    let c = &results.cluster;
    let read = acc[0].dir_stats(c.read.ios, c.read.bytes, c.read.errors);
    let write = acc[1].dir_stats(c.write.ios, c.write.bytes, c.write.errors);
    client_stats.push(json!({
        "jobname": "All clients",
        "groupid": 0,
        "error": 0,
        "job_runtime": results.duration_ms,
        "read": fio_json::dir_value(&read, runtime, &pct),
        "write": fio_json::dir_value(&write, runtime, &pct),
        "hostname": "All clients",
    }));
    json!({
        "fio version": format!("lockstep-{}", results.lockstep_version),
        "timestamp": results.start_unix_ms / 1000,
        "timestamp_ms": results.start_unix_ms,
        "time": "",
        "global options": {},
        "client_stats": client_stats,
    })
}
