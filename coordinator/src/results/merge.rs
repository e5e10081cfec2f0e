//! Merging what agents measure into volume, node and cluster results.
//!
//! Pure: interval reports in, results out, no IO and no clock. Every percentile it produces
//! comes from a merged histogram: a volume's totals merge its intervals, a node's merge its
//! volumes, the cluster's merge every volume, and each cluster interval merges every volume's
//! same interval. Histograms stay sparse (`SparseHistogram`), so a 1,000-agent x 8-volume
//! cluster merges in memory proportional to the latency buckets actually used.

use std::collections::{BTreeMap, HashMap};

use lockstep_proto::histogram::{Geometry, HistogramCodecError, SparseHistogram};
use lockstep_proto::v1::{DirInterval, VolumeInterval};

use crate::results::keeper::{Keep, KeptPoints};
use crate::results::timeline::{Timeline, VolumeModel, VolumePoint, VolumeSeries};
use crate::results::{ClusterPoint, DirSummary, LatSummary, NodeResult, Summary, VolumeResult};

#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error(
        "agent '{agent}' sent interval {index} for volume '{volume}', which has no work in this run"
    )]
    UnknownVolume {
        agent: String,
        volume: String,
        index: u64,
    },
    #[error("agent '{agent}', volume '{volume}', interval {index}: {source}")]
    Histogram {
        agent: String,
        volume: String,
        index: u64,
        source: HistogramCodecError,
    },
}

/// What a volume is in this run (from the plan), registered before its intervals arrive.
#[derive(Debug, Clone)]
pub struct PlannedVolume {
    pub node: String,
    pub volume: String,
    pub role: String,
    pub model: Option<VolumeModel>,
    pub target_iops: Option<f64>,
}

#[derive(Debug, Clone, Default)]
struct DirAcc {
    ios: u64,
    bytes: u64,
    errors: u64,
    lat: Option<SparseHistogram>,
    lat_intended: Option<SparseHistogram>,
}

fn merge_into(
    slot: &mut Option<SparseHistogram>,
    h: &SparseHistogram,
) -> Result<(), HistogramCodecError> {
    match slot {
        Some(s) => s.merge(h),
        None => {
            *slot = Some(h.clone());
            Ok(())
        }
    }
}

impl DirAcc {
    fn add(&mut self, other: &DirAcc) -> Result<(), HistogramCodecError> {
        self.ios += other.ios;
        self.bytes += other.bytes;
        self.errors += other.errors;
        if let Some(h) = &other.lat {
            merge_into(&mut self.lat, h)?;
        }
        if let Some(h) = &other.lat_intended {
            merge_into(&mut self.lat_intended, h)?;
        }
        Ok(())
    }

    fn summary(&self, seconds: f64) -> DirSummary {
        let rate = |x: u64| {
            if seconds > 0.0 {
                x as f64 / seconds
            } else {
                0.0
            }
        };
        DirSummary {
            ios: self.ios,
            bytes: self.bytes,
            errors: self.errors,
            iops: rate(self.ios),
            bytes_per_sec: rate(self.bytes),
            lat: self.lat.as_ref().map(LatSummary::of).unwrap_or_default(),
            lat_intended: self.lat_intended.as_ref().map(LatSummary::of),
        }
    }
}

fn decode_dir(d: Option<&DirInterval>) -> Result<DirAcc, HistogramCodecError> {
    let Some(d) = d else {
        return Ok(DirAcc::default());
    };
    let h = |b: &[u8]| -> Result<Option<SparseHistogram>, HistogramCodecError> {
        if b.is_empty() {
            Ok(None)
        } else {
            SparseHistogram::decode(b).map(Some)
        }
    };
    Ok(DirAcc {
        ios: d.ios,
        bytes: d.bytes,
        errors: d.errors,
        lat: h(&d.lat_hist)?,
        lat_intended: h(&d.lat_intended_hist)?,
    })
}

/// [read, write] accumulators.
type Dirs = [DirAcc; 2];

fn summarize(d: &Dirs, seconds: f64) -> Result<Summary, HistogramCodecError> {
    let mut total = d[0].clone();
    total.add(&d[1])?;
    Ok(Summary {
        read: d[0].summary(seconds),
        write: d[1].summary(seconds),
        total: total.summary(seconds),
    })
}

struct VolumeAcc {
    /// What the volume is; its `points` stay empty (they are in `kept`).
    series: VolumeSeries,
    kept: KeptPoints,
    total: Dirs,
    outstanding_sum: f64,
    intervals: u64,
}

/// The cluster at one interval. While an interval is still arriving its latency counts are
/// kept dense (adding a volume is then a pass over that volume's buckets only); two intervals
/// later it is closed into the sparse form, and the rare late report merges into that.
#[derive(Default)]
struct ClusterInterval {
    t_ms: u64,
    len_ms: u64,
    ios: u64,
    bytes: u64,
    errors: u64,
    dense: Vec<u64>,
    geometry: Option<Geometry>,
    lat: Option<SparseHistogram>,
    volumes: u32,
}

impl ClusterInterval {
    fn add(&mut self, h: &SparseHistogram) -> Result<(), HistogramCodecError> {
        match &mut self.lat {
            Some(s) => s.merge(h),
            None => {
                self.geometry.get_or_insert(h.geometry);
                h.add_to_dense(&mut self.dense);
                Ok(())
            }
        }
    }

    fn close(&mut self) {
        if self.lat.is_none() {
            if let Some(g) = self.geometry {
                self.lat = Some(SparseHistogram::from_counts(g, &self.dense));
            }
            self.dense = Vec::new();
        }
    }

    fn histogram(&self) -> Option<SparseHistogram> {
        match (&self.lat, self.geometry) {
            (Some(s), _) => Some(s.clone()),
            (None, Some(g)) => Some(SparseHistogram::from_counts(g, &self.dense)),
            _ => None,
        }
    }
}

/// The latency a volume is judged by: from the intended issue time in open-loop mode (what a
/// client of a rate-limited service sees), otherwise from the actual issue.
fn judged(d: &DirAcc) -> Option<&SparseHistogram> {
    d.lat_intended.as_ref().or(d.lat.as_ref())
}

pub struct Merger {
    interval_ms: u64,
    keep: Keep,
    /// agent -> (volume, index into `volumes`): looked up without allocating per report.
    index: HashMap<String, Vec<(String, usize)>>,
    volumes: Vec<VolumeAcc>,
    cluster: BTreeMap<u64, ClusterInterval>,
    newest: Option<u64>,
    /// Cluster intervals below this index are closed (sparse).
    closed_below: u64,
}

impl Merger {
    pub fn new(interval_ms: u64, volumes: &[PlannedVolume]) -> Self {
        let mut index = HashMap::new();
        let mut accs = Vec::new();
        for v in volumes {
            index
                .entry(v.node.clone())
                .or_insert_with(Vec::new)
                .push((v.volume.clone(), accs.len()));
            accs.push(VolumeAcc {
                series: VolumeSeries {
                    node: v.node.clone(),
                    volume: v.volume.clone(),
                    role: v.role.clone(),
                    model: v.model.clone(),
                    configured_depth: 0,
                    target_iops: v.target_iops,
                    lost_at_ms: None,
                    points: Vec::new(),
                },
                kept: KeptPoints::default(),
                total: Default::default(),
                outstanding_sum: 0.0,
                intervals: 0,
            });
        }
        Merger {
            interval_ms,
            keep: Keep::for_run(interval_ms, 0, accs.len()),
            index,
            volumes: accs,
            cluster: BTreeMap::new(),
            newest: None,
            closed_below: 0,
        }
    }

    /// Sizes the points kept in memory for a run of `intervals` planned intervals
    /// (results/keeper.rs): without it every interval's point is kept.
    pub fn planned_intervals(mut self, intervals: u64) -> Self {
        self.keep = Keep::for_run(self.interval_ms, intervals, self.volumes.len());
        self
    }

    /// Keeps only the recent points in memory: the run writes every point to its data files
    /// and reads the timeline back from them at the end (results/keeper.rs).
    pub fn points_on_disk(mut self) -> Self {
        self.keep.in_memory = false;
        self
    }

    /// How the points are kept (intervals per kept point, recent points per volume).
    pub fn keep(&self) -> Keep {
        self.keep
    }

    /// A volume's position in the run's volume table (its id in the data files).
    pub fn volume_index(&self, agent: &str, volume: &str) -> Option<usize> {
        self.lookup(agent, volume)
    }

    /// How many volumes the run has.
    pub fn volume_count(&self) -> usize {
        self.volumes.len()
    }

    /// Takes one volume's interval `index` from `agent` (it ends at (index + 1) x interval
    /// since the synchronized start). An interval outside the measured phases (a warm-up) only
    /// goes on the timeline: the volume was loaded then, and credit forecasts must see it, but
    /// it does not count in results.
    pub fn ingest(
        &mut self,
        agent: &str,
        index: u64,
        len_ms: u64,
        vi: &VolumeInterval,
        measured: bool,
    ) -> Result<VolumePoint, MergeError> {
        let err = |source| MergeError::Histogram {
            agent: agent.into(),
            volume: vi.volume.clone(),
            index,
            source,
        };
        let vix = self
            .lookup(agent, &vi.volume)
            .ok_or_else(|| MergeError::UnknownVolume {
                agent: agent.into(),
                volume: vi.volume.clone(),
                index,
            })?;
        let dirs: Dirs = [
            decode_dir(vi.read.as_ref()).map_err(err)?,
            decode_dir(vi.write.as_ref()).map_err(err)?,
        ];
        // Both directions together, for the point (walked together, never built).
        let parts: Vec<&SparseHistogram> = dirs.iter().filter_map(judged).collect();
        let u = SparseHistogram::union_stats(&parts, &[0.5, 0.99]);
        let t_ms = (index + 1) * self.interval_ms;
        let us = |ns: u64| ns as f64 / 1000.0;
        let point = VolumePoint {
            t_ms,
            len_ms,
            ios: [dirs[0].ios, dirs[1].ios],
            bytes: [dirs[0].bytes, dirs[1].bytes],
            errors: [dirs[0].errors, dirs[1].errors],
            outstanding: vi.outstanding,
            lat_mean_us: u.mean / 1000.0,
            lat_p50_us: us(u.quantiles[0]),
            lat_p99_us: us(u.quantiles[1]),
            lat_max_us: us(u.max),
        };
        let acc = &mut self.volumes[vix];
        acc.series.configured_depth = vi.configured_depth;
        acc.kept.push(index, point, &self.keep);
        if !measured {
            return Ok(point);
        }
        acc.total[0].add(&dirs[0]).map_err(err)?;
        acc.total[1].add(&dirs[1]).map_err(err)?;
        acc.outstanding_sum += vi.outstanding;
        acc.intervals += 1;
        let c = self.cluster.entry(index).or_default();
        c.t_ms = t_ms;
        c.len_ms = c.len_ms.max(len_ms);
        c.ios += point.ios[0] + point.ios[1];
        c.bytes += point.bytes[0] + point.bytes[1];
        c.errors += point.errors[0] + point.errors[1];
        c.volumes += 1;
        for h in &parts {
            c.add(h).map_err(err)?;
        }
        // Intervals two behind the newest are complete: close them into the sparse form.
        if self.newest.is_none_or(|n| index > n) {
            self.newest = Some(index);
            for (_, c) in self
                .cluster
                .range_mut(self.closed_below..index.saturating_sub(1))
            {
                c.close();
            }
            self.closed_below = self.closed_below.max(index.saturating_sub(1));
        }
        Ok(point)
    }

    fn lookup(&self, agent: &str, volume: &str) -> Option<usize> {
        self.index
            .get(agent)?
            .iter()
            .find(|(v, _)| v == volume)
            .map(|&(_, i)| i)
    }

    /// Marks every volume of `agent` lost at `at_ms` (its later intervals are missing).
    pub fn mark_lost(&mut self, agent: &str, at_ms: u64) {
        for v in self.volumes.iter_mut().filter(|v| v.series.node == agent) {
            v.series.lost_at_ms.get_or_insert(at_ms);
        }
    }

    /// The cluster at interval `index`, from whatever volumes reported it so far.
    pub fn cluster_point(&self, index: u64) -> Option<ClusterPoint> {
        self.cluster.get(&index).map(|c| {
            let secs = (c.len_ms.max(1)) as f64 / 1000.0;
            let h = c.histogram();
            let q = |q: f64| {
                h.as_ref()
                    .map_or(0.0, |h| h.value_at_quantile(q) as f64 / 1000.0)
            };
            ClusterPoint {
                t_ms: c.t_ms,
                iops: c.ios as f64 / secs,
                bytes_per_sec: c.bytes as f64 / secs,
                errors: c.errors,
                lat_p50_us: q(0.5),
                lat_p99_us: q(0.99),
                lat_p999_us: q(0.999),
                volumes: c.volumes,
            }
        })
    }

    pub fn latest_index(&self) -> Option<u64> {
        self.cluster.keys().next_back().copied()
    }

    /// The kept timeline so far, one point per `keep().fold` intervals (for the final
    /// analysis and the report).
    pub fn timeline(&self) -> Timeline {
        self.timeline_of(self.keep.interval_ms * self.keep.fold, |k| {
            k.all(&self.keep)
        })
    }

    /// The last few minutes at full resolution (for the live view and the live finder).
    pub fn recent_timeline(&self) -> Timeline {
        self.timeline_of(self.interval_ms, |k| k.recent.iter().copied().collect())
    }

    fn timeline_of(
        &self,
        interval_ms: u64,
        points: impl Fn(&KeptPoints) -> Vec<VolumePoint>,
    ) -> Timeline {
        Timeline {
            interval_ms,
            volumes: self
                .volumes
                .iter()
                .map(|v| VolumeSeries {
                    points: points(&v.kept),
                    ..v.series.clone()
                })
                .collect(),
            faults: Vec::new(),
        }
    }

    /// Each volume (its `points` empty) with its newest point, without copying (for the live
    /// view and the metrics).
    pub fn latest(&self) -> impl Iterator<Item = (&VolumeSeries, Option<&VolumePoint>)> {
        self.volumes
            .iter()
            .map(|v| (&v.series, v.kept.recent.back()))
    }

    /// Volume, node and cluster results and the cluster timeline. `seconds` is the measured
    /// duration used for rates.
    pub fn finish(&self, seconds: f64) -> Result<Finished, HistogramCodecError> {
        let mut volumes = Vec::with_capacity(self.volumes.len());
        let mut nodes: BTreeMap<&str, Dirs> = BTreeMap::new();
        let mut cluster: Dirs = Default::default();
        for v in &self.volumes {
            // A lost volume's rates are over the time it ran.
            let secs = match v.series.lost_at_ms {
                Some(ms) => (ms as f64 / 1000.0).min(seconds).max(1e-3),
                None => seconds,
            };
            volumes.push(VolumeResult {
                node: v.series.node.clone(),
                volume: v.series.volume.clone(),
                role: v.series.role.clone(),
                model: v.series.model.clone(),
                summary: summarize(&v.total, secs)?,
                outstanding_mean: if v.intervals > 0 {
                    v.outstanding_sum / v.intervals as f64
                } else {
                    0.0
                },
                configured_depth: v.series.configured_depth,
                lost_at_ms: v.series.lost_at_ms,
            });
            let n = nodes.entry(&v.series.node).or_default();
            for d in 0..2 {
                n[d].add(&v.total[d])?;
                cluster[d].add(&v.total[d])?;
            }
        }
        let nodes = nodes
            .into_iter()
            .map(|(node, d)| {
                Ok(NodeResult {
                    node: node.to_string(),
                    summary: summarize(&d, seconds)?,
                })
            })
            .collect::<Result<Vec<_>, HistogramCodecError>>()?;
        let cluster_timeline = self
            .cluster
            .keys()
            .filter_map(|&k| self.cluster_point(k))
            .collect();
        Ok(Finished {
            cluster: summarize(&cluster, seconds)?,
            nodes,
            volumes,
            cluster_timeline,
        })
    }

    /// Per-volume total histograms of the judged latency (read and write merged), for checks.
    pub fn volume_histogram(&self, node: &str, volume: &str) -> Option<SparseHistogram> {
        let i = self.lookup(node, volume)?;
        let mut both = None;
        for d in &self.volumes[i].total {
            if let Some(h) = judged(d) {
                merge_into(&mut both, h).ok()?;
            }
        }
        both
    }
}

pub struct Finished {
    pub cluster: Summary,
    pub nodes: Vec<NodeResult>,
    pub volumes: Vec<VolumeResult>,
    pub cluster_timeline: Vec<ClusterPoint>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use hdrhistogram::Histogram;
    use lockstep_proto::histogram::encode;

    fn hist(values: &[u64]) -> Histogram<u64> {
        let mut h = Histogram::new_with_bounds(1, 3_600_000_000_000, 3).unwrap();
        for &v in values {
            h.record(v).unwrap();
        }
        h
    }

    fn vi(volume: &str, read_lat: &[u64]) -> VolumeInterval {
        VolumeInterval {
            volume: volume.into(),
            read: Some(DirInterval {
                ios: read_lat.len() as u64,
                bytes: read_lat.len() as u64 * 4096,
                errors: 0,
                clat_hist: Vec::new(),
                lat_hist: encode(&hist(read_lat)).unwrap(),
                lat_intended_hist: Vec::new(),
            }),
            write: None,
            outstanding: 2.0,
            configured_depth: 4,
            active_faults: vec![],
        }
    }

    fn info(node: &str) -> PlannedVolume {
        PlannedVolume {
            node: node.into(),
            volume: "data".into(),
            role: "r".into(),
            model: None,
            target_iops: None,
        }
    }

    #[test]
    fn cluster_percentiles_come_from_merged_histograms_not_averages() {
        let mut m = Merger::new(1000, &[info("a"), info("b")]);
        // a: 99 fast IOs; b: 1 slow IO. Averaging the two volumes' p99s would give ~50 ms.
        let fast: Vec<u64> = vec![100_000; 99];
        m.ingest("a", 0, 1000, &vi("data", &fast), true).unwrap();
        m.ingest("b", 0, 1000, &vi("data", &[100_000_000]), true)
            .unwrap();
        let f = m.finish(1.0).unwrap();
        let mut all = fast.clone();
        all.push(100_000_000);
        let exact = hist(&all);
        assert_eq!(f.cluster.read.lat.p(99.0), exact.value_at_percentile(99.0));
        assert_eq!(f.cluster.read.lat.p(99.0), 100_031);
        assert_eq!(f.cluster.read.ios, 100);
        assert_eq!(f.cluster_timeline[0].volumes, 2);
        assert!((f.cluster_timeline[0].iops - 100.0).abs() < 1e-9);
        assert_eq!(f.nodes.len(), 2);
    }

    #[test]
    fn unknown_volumes_are_refused_by_name() {
        let mut m = Merger::new(1000, &[info("a")]);
        let e = m
            .ingest("a", 3, 1000, &vi("logs", &[1]), true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("'logs'") && e.contains("'a'"), "{e}");
    }

    #[test]
    fn lost_volumes_keep_their_data_and_the_time() {
        let mut m = Merger::new(1000, &[info("a")]);
        m.ingest("a", 0, 1000, &vi("data", &[1000, 2000]), true)
            .unwrap();
        // A warm-up interval is on the timeline but not in the results.
        m.ingest("a", 1, 1000, &vi("data", &[5000]), false).unwrap();
        m.mark_lost("a", 1500);
        let f = m.finish(10.0).unwrap();
        assert_eq!(f.volumes[0].lost_at_ms, Some(1500));
        assert_eq!(f.volumes[0].summary.read.ios, 2);
        assert_eq!(m.timeline().volumes[0].points.len(), 2);
        assert!((f.volumes[0].summary.read.iops - 2.0 / 1.5).abs() < 1e-9);
    }
}
