//! The data behind report.html's charts, as plain functions of the results (no I/O, no
//! drawing): downsampled lines, a suspect's peers' band, and the modeled credit balance.

use crate::results::timeline::{VolumePoint, VolumeSeries};

/// A named line: (seconds since the start, value).
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

impl Line {
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Line {
        Line {
            name: name.into(),
            points,
        }
    }
}

/// At most `max` points, keeping each bucket's largest value: a one-interval latency spike in a
/// 3,600-interval run must still show on a 900-pixel chart, so the bucket's peak stands for it
/// (at the bucket's last time, so a cliff is never drawn early).
pub fn downsample_max(points: &[(f64, f64)], max: usize) -> Vec<(f64, f64)> {
    let max = max.max(1);
    if points.len() <= max {
        return points.to_vec();
    }
    let per = points.len().div_ceil(max);
    points
        .chunks(per)
        .map(|c| {
            let y = c.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
            (c[c.len() - 1].0, y)
        })
        .collect()
}

/// At most `max` points, each bucket's mean: for rates (IOPS, MB/s), where the mean over the
/// bucket is the rate over its time.
pub fn downsample_mean(points: &[(f64, f64)], max: usize) -> Vec<(f64, f64)> {
    let max = max.max(1);
    if points.len() <= max {
        return points.to_vec();
    }
    let per = points.len().div_ceil(max);
    points
        .chunks(per)
        .map(|c| {
            let y = c.iter().map(|p| p.1).sum::<f64>() / c.len() as f64;
            (c[c.len() - 1].0, y)
        })
        .collect()
}

/// Median (nearest rank, the upper one of an even count's two) of a slice, reordered in
/// place; `None` when empty.
pub fn median(xs: &mut [f64]) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    let i = ((xs.len() - 1) as f64 * 0.5).round() as usize;
    Some(*xs.select_nth_unstable_by(i, |a, b| a.total_cmp(b)).1)
}

/// The `q` quantile (nearest rank) of a slice, sorted in place; `None` when empty.
pub fn quantile(xs: &mut [f64], q: f64) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(|a, b| a.total_cmp(b));
    let i = ((xs.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
    Some(xs[i])
}

/// The interval index of a point: its end over the interval length, rounded.
pub fn interval_index(p: &VolumePoint, interval_ms: u64) -> usize {
    let iv = interval_ms.max(1);
    ((p.t_ms + iv / 2) / iv) as usize
}

/// A suspect's peers per interval: the low (10th percentile), median and high (90th
/// percentile) of `metric` over the other volumes of its role, at each interval any of them
/// reported. The suspect's line drawn over this band is the chokepoint panel's picture.
pub struct PeerBand {
    pub low: Vec<(f64, f64)>,
    pub median: Vec<(f64, f64)>,
    pub high: Vec<(f64, f64)>,
}

pub fn peer_band(
    peers: &[&VolumeSeries],
    interval_ms: u64,
    metric: impl Fn(&VolumePoint) -> f64,
) -> PeerBand {
    let mut by_interval: std::collections::BTreeMap<usize, (f64, Vec<f64>)> = Default::default();
    for s in peers {
        for p in &s.points {
            let e = by_interval
                .entry(interval_index(p, interval_ms))
                .or_insert((p.t_ms as f64 / 1000.0, Vec::new()));
            e.1.push(metric(p));
        }
    }
    let mut band = PeerBand {
        low: Vec::new(),
        median: Vec::new(),
        high: Vec::new(),
    };
    for (_, (t, mut xs)) in by_interval {
        // One sort per interval; the three quantiles read from it.
        xs.sort_by(|a, b| a.total_cmp(b));
        let at = |q: f64| xs[((xs.len() - 1) as f64 * q).round() as usize];
        band.low.push((t, at(0.1)));
        band.median.push((t, at(0.5)));
        band.high.push((t, at(0.9)));
    }
    band
}

/// A burst-credit bucket as the chokepoint result describes it (docs/domain.md#gp2): it refills
/// at `baseline`, is spent at up to `burst`, holds `bucket` and starts full.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    pub baseline: f64,
    pub burst: f64,
    pub bucket: f64,
    /// The emulation's speed-up: the quickstart drains 100x faster than a real gp2 volume.
    pub time_scale: f64,
}

/// The modeled credit balance after each interval, from the measured demand (credits per
/// second) of each interval: `(seconds since the start, balance)`, starting full at t=0.
pub fn credit_balance(b: &Bucket, demand: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut balance = b.bucket;
    let mut last_t = 0.0;
    let mut out = vec![(0.0, balance)];
    for &(t, d) in demand {
        let dt = (t - last_t).max(0.0);
        last_t = t;
        let net = (d.min(b.burst) - b.baseline) * b.time_scale.max(f64::MIN_POSITIVE);
        balance = (balance - net * dt).clamp(0.0, b.bucket);
        out.push((t, balance));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downsampling_keeps_a_one_interval_spike_and_the_mean_rate() {
        let mut pts: Vec<(f64, f64)> = (0..3600).map(|i| (i as f64, 1.0)).collect();
        pts[1234].1 = 500.0;
        let d = downsample_max(&pts, 900);
        assert_eq!(d.len(), 900);
        assert_eq!(d.iter().filter(|p| p.1 == 500.0).count(), 1);
        let m = downsample_mean(&pts, 900);
        assert_eq!(m.len(), 900);
        let spike = m.iter().find(|p| p.1 > 1.0).unwrap();
        assert!((spike.1 - (3.0 + 500.0) / 4.0).abs() < 1e-9, "{spike:?}");
        assert_eq!(downsample_max(&pts[..10], 900).len(), 10);
    }

    #[test]
    fn quantiles_by_nearest_rank() {
        let mut xs = vec![5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(median(&mut xs), Some(3.0));
        assert_eq!(quantile(&mut xs, 0.0), Some(1.0));
        assert_eq!(quantile(&mut xs, 1.0), Some(5.0));
        assert_eq!(median(&mut []), None);
    }

    #[test]
    fn the_quickstart_gp2_bucket_runs_dry_at_the_demand_it_measured() {
        // 60 GiB gp2 emulated 100x faster: 5.4M credits, 180 baseline, 3,000 burst. At 2,880
        // IOPS it drains 270,000 credits a second: empty after 20 s, then stays at zero.
        let b = Bucket {
            baseline: 180.0,
            burst: 3000.0,
            bucket: 5_400_000.0,
            time_scale: 100.0,
        };
        let demand: Vec<(f64, f64)> = (1..=30).map(|s| (s as f64, 2880.0)).collect();
        let bal = credit_balance(&b, &demand);
        assert_eq!(bal[0], (0.0, 5_400_000.0));
        assert!((bal[10].1 - 2_700_000.0).abs() < 1e-6, "{:?}", bal[10]);
        assert_eq!(bal[20].1, 0.0);
        assert_eq!(bal[30].1, 0.0);
        // Below the baseline it refills, never above the bucket.
        let idle: Vec<(f64, f64)> = (31..=40).map(|s| (s as f64, 0.0)).collect();
        let refill = credit_balance(&b, &idle);
        assert!(refill.iter().all(|p| p.1 <= b.bucket));
    }

    #[test]
    fn the_peer_band_spans_the_peers_not_the_suspect() {
        let series = |lat: f64| VolumeSeries {
            points: (1..=3)
                .map(|i| VolumePoint {
                    t_ms: i * 1000,
                    len_ms: 1000,
                    lat_mean_us: lat,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let peers: Vec<VolumeSeries> = [100.0, 110.0, 120.0, 130.0, 140.0]
            .iter()
            .map(|&l| series(l))
            .collect();
        let refs: Vec<&VolumeSeries> = peers.iter().collect();
        let band = peer_band(&refs, 1000, |p| p.lat_mean_us);
        assert_eq!(band.median.len(), 3);
        assert_eq!(band.median[0], (1.0, 120.0));
        assert_eq!(band.low[0].1, 100.0);
        assert_eq!(band.high[0].1, 140.0);
    }
}
