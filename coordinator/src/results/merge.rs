//! Merging what agents measure into volume, node and cluster results.
//!
//! Pure: interval reports in, results out, no IO and no clock. Every percentile it produces
//! comes from a merged histogram: a volume's totals merge its intervals, a node's merge its
//! volumes, the cluster's merge every volume, and each cluster interval merges every volume's
//! same interval. Histograms stay sparse (`SparseHistogram`), so a 1,000-agent x 8-volume
//! cluster merges in memory proportional to the latency buckets actually used.

use std::collections::HashMap;

use lockstep_proto::histogram::{BucketDecoder, Geometry, HistogramCodecError, SparseHistogram};
use lockstep_proto::v1::{DirInterval, IntervalReport, VolumeInterval};

mod cluster;

use crate::results::counts::{DenseCounts, PagedCounts, Union2, UnionFigures};
use crate::results::keeper::{Keep, KeptPoints};
use crate::results::timeline::{Timeline, VolumeModel, VolumePoint, VolumeSeries};
use crate::results::{ClusterPoint, DirSummary, LatSummary, NodeResult, Summary, VolumeResult};
use cluster::ClusterIntervals;

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

/// One direction of a volume over the run.
#[derive(Debug, Clone, Default)]
struct DirAcc {
    ios: u64,
    bytes: u64,
    errors: u64,
    lat: PagedCounts,
    lat_intended: PagedCounts,
}

/// One direction's totals as sorted histograms, for summaries and node and cluster merges
/// (only in `finish`).
#[derive(Debug, Clone, Default)]
struct DirTotal {
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

impl DirTotal {
    fn of(d: &DirAcc) -> Self {
        DirTotal {
            ios: d.ios,
            bytes: d.bytes,
            errors: d.errors,
            lat: d.lat.to_sparse(),
            lat_intended: d.lat_intended.to_sparse(),
        }
    }

    fn add(&mut self, other: &DirTotal) -> Result<(), HistogramCodecError> {
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

/// [read, write] totals.
type Dirs = [DirTotal; 2];

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
    total: [DirAcc; 2],
    outstanding_sum: f64,
    intervals: u64,
}

/// One volume-interval's histograms decoded into reused buffers: [read, write] x [lat,
/// lat_intended], each with its geometry when the agent sent one.
#[derive(Default)]
struct Decoded {
    decoder: BucketDecoder,
    buckets: [[Vec<(u32, u64)>; 2]; 2],
    geometry: [[Option<Geometry>; 2]; 2],
    union: Union2,
}

impl Decoded {
    fn decode(&mut self, vi: &VolumeInterval) -> Result<(), HistogramCodecError> {
        for (d, dir) in [&vi.read, &vi.write].into_iter().enumerate() {
            for k in 0..2 {
                let bytes: &[u8] = match dir {
                    Some(x) if k == 0 => &x.lat_hist,
                    Some(x) => &x.lat_intended_hist,
                    None => &[],
                };
                self.geometry[d][k] = if bytes.is_empty() {
                    self.buckets[d][k].clear();
                    None
                } else {
                    Some(self.decoder.decode(bytes, &mut self.buckets[d][k])?.0)
                };
            }
        }
        Ok(())
    }

    /// The latency a volume is judged by: from the intended issue time in open-loop mode (what
    /// a client of a rate-limited service sees), otherwise from the actual issue.
    fn judged(&self, d: usize) -> Option<(Geometry, &[(u32, u64)])> {
        let k = if self.geometry[d][1].is_some() { 1 } else { 0 };
        Some((self.geometry[d][k]?, &self.buckets[d][k]))
    }

    /// Adds this volume-interval to the volume's run totals and to the cluster interval (each
    /// when given) and computes the point's figures (both directions' judged latency together),
    /// in one pass over each histogram.
    fn absorb(
        &mut self,
        mut totals: Option<&mut [DirAcc; 2]>,
        mut cluster: Option<&mut DenseCounts>,
    ) -> Result<UnionFigures<2>, HistogramCodecError> {
        let geometry = match (self.judged(0), self.judged(1)) {
            (Some((g, _)), Some((h, _))) if g != h => {
                return Err(HistogramCodecError::Decode(format!(
                    "read and write histograms of different precision ({g:?} vs {h:?})"
                )));
            }
            (Some((g, _)), _) | (None, Some((g, _))) => Some(g),
            (None, None) => None,
        };
        for d in 0..2 {
            let judged = if self.geometry[d][1].is_some() { 1 } else { 0 };
            if self.geometry[d][judged].is_none() {
                self.union.clear(d);
            }
            for k in 0..2 {
                let Some(g) = self.geometry[d][k] else {
                    continue;
                };
                let list = &self.buckets[d][k];
                let total = totals.as_deref_mut().map(|t| match k {
                    0 => &mut t[d].lat,
                    _ => &mut t[d].lat_intended,
                });
                if k == judged {
                    self.union.take(d, g, list, total, cluster.as_deref_mut())?;
                } else if let Some(t) = total {
                    t.add(g, list)?;
                }
            }
        }
        let Some(g) = geometry else {
            return Ok(UnionFigures {
                quantiles: [0; 2],
                mean: 0.0,
                max: 0,
            });
        };
        let lists = [0, 1].map(|d| self.judged(d).map_or(&[][..], |(_, l)| l));
        Ok(self.union.figures(g, lists, [0.5, 0.99]))
    }
}

pub struct Merger {
    interval_ms: u64,
    keep: Keep,
    /// agent -> its volumes in plan order (the order it reports them in), as (volume, index
    /// into `volumes`).
    index: HashMap<String, Vec<(String, usize)>>,
    volumes: Vec<VolumeAcc>,
    /// The cluster's figures per interval (64 bytes each once closed).
    cluster: ClusterIntervals,
    decoded: Decoded,
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
            cluster: ClusterIntervals::new(interval_ms),
            decoded: Decoded::default(),
        }
    }

    /// Sizes the points kept in memory for a run of `intervals` planned intervals
    /// (results/keeper.rs), and the cluster's intervals alike: without it every interval's
    /// point is kept.
    pub fn planned_intervals(mut self, intervals: u64) -> Self {
        self.keep = Keep::for_run(self.interval_ms, intervals, self.volumes.len());
        self.cluster = ClusterIntervals::new(self.interval_ms).folded(self.keep.fold);
        self
    }

    /// Keeps only the recent points in memory: the run writes every point to its data files
    /// and reads the timeline back from them at the end (results/keeper.rs).
    pub fn points_on_disk(mut self) -> Self {
        self.keep.in_memory = false;
        for acc in &mut self.volumes {
            acc.kept.claim_recent(self.keep.recent);
        }
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
        let vix = self
            .lookup(agent, &vi.volume)
            .ok_or_else(|| unknown(agent, vi, index))?;
        self.ingest_volume(vix, agent, index, len_ms, vi, measured)
    }

    /// Takes a whole interval report of `agent` (every volume it has), as `ingest` would each
    /// volume, and gives each volume's id (its place in the run's volume table, as in the data
    /// files) and point, or its error, in the report's order. The agent is
    /// looked up once and its volumes by position (agents report them in plan order), by name
    /// only when the position does not match.
    pub fn ingest_report(
        &mut self,
        agent: &str,
        report: &IntervalReport,
        measured: bool,
    ) -> Vec<Result<(usize, VolumePoint), MergeError>> {
        let len_ms = report.len_ns / 1_000_000;
        let planned = self.index.get(agent).map(Vec::as_slice).unwrap_or(&[]);
        let at: Vec<Option<usize>> = report
            .volumes
            .iter()
            .enumerate()
            .map(|(k, vi)| {
                planned
                    .get(k)
                    .filter(|(name, _)| *name == vi.volume)
                    .or_else(|| planned.iter().find(|(name, _)| *name == vi.volume))
                    .map(|&(_, i)| i)
            })
            .collect();
        report
            .volumes
            .iter()
            .zip(at)
            .map(|(vi, vix)| {
                let vix = vix.ok_or_else(|| unknown(agent, vi, report.index))?;
                self.ingest_volume(vix, agent, report.index, len_ms, vi, measured)
                    .map(|p| (vix, p))
            })
            .collect()
    }

    fn ingest_volume(
        &mut self,
        vix: usize,
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
        let dec = &mut self.decoded;
        dec.decode(vi).map_err(err)?;
        let acc = &mut self.volumes[vix];
        let t_ms = (index + 1) * self.interval_ms;
        let dir =
            |d: &Option<DirInterval>| d.as_ref().map_or([0; 3], |d| [d.ios, d.bytes, d.errors]);
        let (r, w) = (dir(&vi.read), dir(&vi.write));
        // What the agent says it kept in flight, taken only when it is a number: a NaN from an
        // agent would reach the volume's mean and the finder's evidence, and results.json has
        // no way to write it.
        let outstanding = Some(vi.outstanding)
            .filter(|o| o.is_finite() && *o >= 0.0)
            .unwrap_or(0.0);
        let u = if measured {
            for (d, t) in acc.total.iter_mut().enumerate() {
                let x = [r, w][d];
                t.ios += x[0];
                t.bytes += x[1];
                t.errors += x[2];
            }
            acc.outstanding_sum += outstanding;
            acc.intervals += 1;
            let counters = [r[0] + w[0], r[1] + w[1], r[2] + w[2]];
            self.cluster
                .add(index, len_ms, counters, |lat| {
                    dec.absorb(Some(&mut acc.total), lat)
                })
                .map_err(err)?
        } else {
            dec.absorb(None, None).map_err(err)?
        };
        let us = |ns: u64| ns as f64 / 1000.0;
        let point = VolumePoint {
            t_ms,
            len_ms,
            ios: [r[0], w[0]],
            bytes: [r[1], w[1]],
            errors: [r[2], w[2]],
            outstanding,
            lat_mean_us: u.mean / 1000.0,
            lat_p50_us: us(u.quantiles[0]),
            lat_p99_us: us(u.quantiles[1]),
            lat_max_us: us(u.max),
        };
        acc.series.configured_depth = vi.configured_depth;
        acc.kept.push(index, point, &self.keep);
        if !measured {
            return Ok(point);
        }
        self.cluster.close_behind(index).map_err(err)?;
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
        self.cluster.point(index)
    }

    pub fn latest_index(&self) -> Option<u64> {
        self.cluster.latest_index()
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
        let mut volumes: Vec<Option<VolumeResult>> = vec![None; self.volumes.len()];
        let mut cluster = ClusterTotals::default();
        // Node by node, so only one node's merged histograms exist at a time (10,000 nodes'
        // at once were gigabytes).
        let mut names: Vec<&String> = self.index.keys().collect();
        names.sort();
        let mut nodes = Vec::with_capacity(names.len());
        for node in names {
            let mut n: Dirs = Default::default();
            for &(_, vix) in &self.index[node] {
                let v = &self.volumes[vix];
                let total = [DirTotal::of(&v.total[0]), DirTotal::of(&v.total[1])];
                volumes[vix] = Some(Self::volume_result(v, &total, seconds)?);
                for d in 0..2 {
                    n[d].add(&total[d])?;
                    cluster.add(d, &total[d])?;
                }
            }
            nodes.push(NodeResult {
                node: node.clone(),
                summary: summarize(&n, seconds)?,
            });
        }
        let cluster_timeline = self.cluster.points()?;
        Ok(Finished {
            cluster: summarize(&cluster.finish(), seconds)?,
            nodes,
            volumes: volumes.into_iter().flatten().collect(),
            cluster_timeline,
        })
    }

    fn volume_result(
        v: &VolumeAcc,
        total: &Dirs,
        seconds: f64,
    ) -> Result<VolumeResult, HistogramCodecError> {
        // A lost volume's rates are over the time it ran.
        let secs = match v.series.lost_at_ms {
            Some(ms) => (ms as f64 / 1000.0).min(seconds).max(1e-3),
            None => seconds,
        };
        Ok(VolumeResult {
            node: v.series.node.clone(),
            volume: v.series.volume.clone(),
            role: v.series.role.clone(),
            model: v.series.model.clone(),
            summary: summarize(total, secs)?,
            outstanding_mean: if v.intervals > 0 {
                v.outstanding_sum / v.intervals as f64
            } else {
                0.0
            },
            configured_depth: v.series.configured_depth,
            lost_at_ms: v.series.lost_at_ms,
        })
    }

    /// Per-volume total histograms of the judged latency (read and write merged), for checks.
    pub fn volume_histogram(&self, node: &str, volume: &str) -> Option<SparseHistogram> {
        let i = self.lookup(node, volume)?;
        let mut both = None;
        for d in &self.volumes[i].total {
            let judged = if d.lat_intended.is_set() {
                &d.lat_intended
            } else {
                &d.lat
            };
            if let Some(h) = judged.to_sparse() {
                merge_into(&mut both, &h).ok()?;
            }
        }
        both
    }
}

fn unknown(agent: &str, vi: &VolumeInterval, index: u64) -> MergeError {
    MergeError::UnknownVolume {
        agent: agent.into(),
        volume: vi.volume.clone(),
        index,
    }
}

type DenseTotal = (Geometry, Vec<u64>);

/// The whole cluster's run totals, summed dense: merging 80,000 volumes' sorted lists one
/// into the next would walk the growing list each time.
#[derive(Default)]
struct ClusterTotals {
    counters: [[u64; 3]; 2],
    /// [direction][lat, lat_intended]
    lat: [[Option<DenseTotal>; 2]; 2],
}

impl ClusterTotals {
    fn add(&mut self, d: usize, t: &DirTotal) -> Result<(), HistogramCodecError> {
        self.counters[d][0] += t.ios;
        self.counters[d][1] += t.bytes;
        self.counters[d][2] += t.errors;
        for (k, h) in [&t.lat, &t.lat_intended].into_iter().enumerate() {
            let Some(h) = h else { continue };
            let (g, dense) = self.lat[d][k].get_or_insert_with(|| (h.geometry, Vec::new()));
            if *g != h.geometry && !h.is_empty() {
                return Err(HistogramCodecError::Decode(format!(
                    "cannot merge histograms of different precision ({g:?} vs {:?})",
                    h.geometry
                )));
            }
            h.add_to_dense(dense);
        }
        Ok(())
    }

    fn finish(&self) -> Dirs {
        let mut out: Dirs = Default::default();
        for (d, o) in out.iter_mut().enumerate() {
            [o.ios, o.bytes, o.errors] = self.counters[d];
            let sparse = |k: usize| {
                self.lat[d][k]
                    .as_ref()
                    .map(|(g, dense)| SparseHistogram::from_counts(*g, dense))
            };
            o.lat = sparse(0);
            o.lat_intended = sparse(1);
        }
        out
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
    use super::cluster::OPEN_INTERVALS;
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

    /// An agent's outstanding IOs that are not a number are taken as none: results.json could
    /// not hold them.
    #[test]
    fn an_outstanding_figure_that_is_not_a_number_is_not_taken() {
        let mut m = Merger::new(1000, &[info("a")]);
        for (i, o) in [f64::NAN, f64::INFINITY, -1.0, 4.0].into_iter().enumerate() {
            let mut v = vi("data", &[1000]);
            v.outstanding = o;
            m.ingest("a", i as u64, 1000, &v, true).unwrap();
        }
        let f = m.finish(4.0).unwrap();
        assert_eq!(f.volumes[0].outstanding_mean, 1.0);
        let t = m.timeline();
        let o: Vec<f64> = t.volumes[0].points.iter().map(|p| p.outstanding).collect();
        assert_eq!(o, [0.0, 0.0, 0.0, 4.0]);
    }

    fn planned(nodes: usize, vols: usize) -> Vec<PlannedVolume> {
        (0..nodes)
            .flat_map(|n| {
                (0..vols).map(move |v| PlannedVolume {
                    node: format!("n{n}"),
                    volume: format!("v{v}"),
                    role: "r".into(),
                    model: None,
                    target_iops: None,
                })
            })
            .collect()
    }

    fn dir(lat: &[u64], intended: Option<&[u64]>) -> DirInterval {
        DirInterval {
            ios: lat.len() as u64,
            bytes: lat.len() as u64 * 4096,
            errors: 1,
            clat_hist: Vec::new(),
            lat_hist: if lat.is_empty() {
                Vec::new()
            } else {
                encode(&hist(lat)).unwrap()
            },
            lat_intended_hist: intended.map_or(Vec::new(), |i| encode(&hist(i)).unwrap()),
        }
    }

    /// One agent's report of interval `index`: [volume][read, write] latencies.
    fn report(index: u64, vols: &[[Vec<u64>; 2]], open_loop: bool) -> IntervalReport {
        IntervalReport {
            index,
            end_agent_ns: 0,
            len_ns: 1_000_000_000,
            volumes: vols
                .iter()
                .enumerate()
                .map(|(v, [r, w])| {
                    // Open loop: the intended-issue latency is the actual one plus a wait.
                    let late = |x: &Vec<u64>| x.iter().map(|l| l + 5_000).collect::<Vec<_>>();
                    let (ri, wi) = (late(r), late(w));
                    VolumeInterval {
                        volume: format!("v{v}"),
                        read: Some(dir(r, open_loop.then_some(&ri))),
                        write: Some(dir(w, open_loop.then_some(&wi))),
                        outstanding: 1.0,
                        configured_depth: 1,
                        active_faults: vec![],
                    }
                })
                .collect(),
        }
    }

    fn assert_exact(got: &LatSummary, want: &Histogram<u64>) {
        assert_eq!(got.n, want.len());
        if want.is_empty() {
            return;
        }
        for p in crate::results::PERCENTILES {
            assert_eq!(got.p(p), want.value_at_percentile(p), "p{p}");
        }
        assert_eq!(got.max_ns, want.highest_equivalent(want.max()));
        assert_eq!(got.min_ns, want.lowest_equivalent(want.min()));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
        /// Volume, node, cluster and per-interval cluster percentiles equal HdrHistogram's on
        /// the same IOs, for closed and open loops, however the reports interleave.
        #[test]
        fn merged_results_equal_hdrhistogram_on_the_same_data(
            lat in proptest::collection::vec(
                proptest::collection::vec(1u64..2_000_000_000u64, 0..40), 2 * 2 * 2 * 3),
            open_loop in proptest::bool::ANY,
        ) {
            // 2 nodes x 2 volumes x [read, write] x 3 intervals.
            let (nodes, vols, intervals) = (2, 2, 3u64);
            let at = |n: usize, v: usize, d: usize, i: u64| {
                &lat[((n * vols + v) * 2 + d) * 3 + i as usize]
            };
            let mut m = Merger::new(1000, &planned(nodes, vols));
            for i in 0..intervals {
                for n in 0..nodes {
                    let vs: Vec<[Vec<u64>; 2]> = (0..vols)
                        .map(|v| [at(n, v, 0, i).clone(), at(n, v, 1, i).clone()])
                        .collect();
                    for r in m.ingest_report(&format!("n{n}"), &report(i, &vs, open_loop), true) {
                        r.unwrap();
                    }
                }
            }
            let f = m.finish(3.0).unwrap();
            let judged = |x: u64| if open_loop { x + 5_000 } else { x };
            let mut cluster = [hist(&[]), hist(&[])];
            for n in 0..nodes {
                let mut node = [hist(&[]), hist(&[])];
                for v in 0..vols {
                    let r = &f.volumes[n * vols + v];
                    let mut both = hist(&[]);
                    for d in 0..2 {
                        let all: Vec<u64> =
                            (0..intervals).flat_map(|i| at(n, v, d, i).clone()).collect();
                        let h = hist(&all);
                        assert_exact(&[&r.summary.read, &r.summary.write][d].lat, &h);
                        node[d].add(&h).unwrap();
                        cluster[d].add(&h).unwrap();
                        both.add(&h).unwrap();
                    }
                    assert_exact(&r.summary.total.lat, &both);
                }
                assert_exact(&f.nodes[n].summary.read.lat, &node[0]);
                assert_exact(&f.nodes[n].summary.write.lat, &node[1]);
            }
            assert_exact(&f.cluster.read.lat, &cluster[0]);
            assert_exact(&f.cluster.write.lat, &cluster[1]);
            for i in 0..intervals {
                let mut h = hist(&[]);
                for n in 0..nodes {
                    for v in 0..vols {
                        for d in 0..2 {
                            for &x in at(n, v, d, i) {
                                h.record(judged(x)).unwrap();
                            }
                        }
                    }
                }
                let p = m.cluster_point(i).unwrap();
                let us = |ns: u64| ns as f64 / 1000.0;
                let want = |q: f64| if h.is_empty() { 0.0 } else { us(h.value_at_quantile(q)) };
                proptest::prop_assert_eq!(p.lat_p99_us, want(0.99));
                proptest::prop_assert_eq!(p.lat_p999_us, want(0.999));
                proptest::prop_assert_eq!(p.volumes as usize, nodes * vols);
            }
        }
    }

    #[test]
    fn a_report_finds_its_volumes_by_position_then_by_name() {
        let mut m = Merger::new(1000, &planned(1, 3));
        let mut r = report(
            0,
            &[
                [vec![100], vec![]],
                [vec![200], vec![]],
                [vec![300], vec![]],
            ],
            false,
        );
        r.volumes.swap(0, 2); // v2, v1, v0: only v1 is where the plan has it
        r.volumes.push(VolumeInterval {
            volume: "logs".into(),
            ..r.volumes[0].clone()
        });
        let out = m.ingest_report("n0", &r, true);
        assert_eq!(out.len(), 4);
        let p99: Vec<f64> = out[..3]
            .iter()
            .map(|p| p.as_ref().unwrap().1.lat_p99_us)
            .collect();
        assert_eq!(p99, vec![0.3, 0.2, 0.1]);
        let e = out[3].as_ref().unwrap_err().to_string();
        assert!(e.contains("'logs'") && e.contains("'n0'"), "{e}");
        let f = m.finish(1.0).unwrap();
        let read_max: Vec<u64> = f
            .volumes
            .iter()
            .map(|v| v.summary.read.lat.max_ns)
            .collect();
        assert_eq!(read_max, vec![100, 200, 300]);
        assert!(
            m.ingest_report("nobody", &r, true)
                .iter()
                .all(Result::is_err)
        );
    }

    #[test]
    fn closed_intervals_keep_their_figures_not_their_histograms() {
        let mut m = Merger::new(1000, &[info("a"), info("b")]);
        for i in 0..30 {
            m.ingest("a", i, 1000, &vi("data", &[1_000_000 + i]), true)
                .unwrap();
        }
        // Only the newest OPEN_INTERVALS keep latency counts.
        let (closed, open) = m.cluster.counts();
        assert_eq!(
            (closed as u64, open as u64),
            (30 - OPEN_INTERVALS, OPEN_INTERVALS)
        );
        let before = m.cluster_point(3).unwrap();
        assert_eq!(before.lat_p99_us, 1000.447);
        // b reports interval 3 late, with one slow IO: counted, but not in the closed percentiles.
        m.ingest("b", 3, 1000, &vi("data", &[500_000_000]), true)
            .unwrap();
        let after = m.cluster_point(3).unwrap();
        assert_eq!(after.iops, 2.0);
        assert_eq!(after.volumes, 2);
        assert_eq!(after.lat_p99_us, before.lat_p99_us);
        // The volume's own totals have it, exactly.
        let f = m.finish(30.0).unwrap();
        assert_eq!(f.volumes[1].summary.read.lat.max_ns, 500_170_751);
        // An open interval still takes a late report's latencies.
        m.ingest("b", 25, 1000, &vi("data", &[500_000_000]), true)
            .unwrap();
        assert_eq!(m.cluster_point(25).unwrap().lat_p99_us, 500_170.751);
    }
}
