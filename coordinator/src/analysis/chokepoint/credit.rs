//! Burst-credit models of the EBS volume kinds that can run out of credits (gp2, st1, sc1), and
//! the forecast of when a volume's credits run out at its measured demand. The numbers are the
//! one EBS model's (`core/src/fault/ebs.rs`, the agent's `ebs` fault runs the same), with their
//! sources in docs/domain.md (#gp2, #st1-sc1); here they are replayed over measured intervals.
//!
//! The forecast is what turns the gp2 field scenario (docs/domain.md#gp2-credit-exhaustion)
//! from a post-mortem into a warning: a 60 GiB gp2 volume doing 3,000 IOPS drains its 5.4M
//! credits at 3,000 - 180 per second and hits its 180 IOPS baseline after 5.4M / 2,820 =
//! 1,914.9 s, whatever its peers do.

use lockstep_core::fault::ebs::{self, EbsModel};

pub use crate::results::chokepoint::{CreditForecast, CreditModel};

use crate::results::timeline::{VolumeModel, VolumePoint};

pub use lockstep_core::fault::ebs::{CreditUnit, GP2_BURST_IOPS, GP2_CREDITS as GP2_BUCKET};

/// A balance below this fraction of the bucket counts as empty.
const EMPTY_FRACTION: f64 = 0.01;

impl CreditModel {
    /// The credit model of a volume, or `None` when its kind has no credits that can run out
    /// (gp3, io1/io2, local, unknown) or its baseline already reaches its burst ceiling (gp2 of
    /// 1 TiB and more: 3 IOPS/GiB x 1,000 GiB = 3,000, it never runs out).
    pub fn for_volume(m: &VolumeModel) -> Option<CreditModel> {
        let model =
            EbsModel::for_kind(&m.kind, m.size_gib, m.provisioned_iops, m.provisioned_mib_s)?;
        Some(CreditModel {
            kind: model.volume_type.name().to_string(),
            size_gib: model.size_gib,
            unit: model.credit_unit(),
            baseline: model.baseline_units_per_s,
            burst: model.burst_units_per_s,
            bucket: model.credit_capacity_units?,
        })
    }

    /// Credits per second the volume spent in this interval: gp2 counts IOs (large IOs in
    /// 256 KiB units), st1/sc1 count MiB with small IOs rounded up to 1 MiB.
    pub fn demand(&self, p: &VolumePoint) -> f64 {
        if p.len_ms == 0 {
            return 0.0;
        }
        let secs = p.len_ms as f64 / 1000.0;
        let ios = (p.ios[0] + p.ios[1]) as f64;
        let bytes = (p.bytes[0] + p.bytes[1]) as f64;
        self.unit.demand(ios, bytes, secs)
    }

    /// Real seconds until `balance` credits run out at `demand` credits/s, with the volume model
    /// emulated `time_scale` times faster than real time (the agent's EBS emulation drains and
    /// refills the bucket `time_scale` times per real second). `None` when the demand does not
    /// exceed the baseline: the bucket then never empties.
    pub fn seconds_to_empty(&self, balance: f64, demand: f64, time_scale: f64) -> Option<f64> {
        ebs::seconds_to_empty(self.baseline, self.burst, balance, demand, time_scale)
    }
}

/// Replays a volume's measured demand through its bucket. `window` is how many of the last
/// intervals make up "current demand" (a minute at 1 s intervals smooths noise yet follows a
/// phase change).
pub fn forecast(
    node: &str,
    volume: &str,
    model: &CreditModel,
    points: &[VolumePoint],
    time_scale: f64,
    window: usize,
    interval_ms: u64,
) -> CreditForecast {
    let mut balance = model.bucket;
    let mut exhausted_at_ms = None;
    let mut end_ms = 0;
    for p in points.iter().filter(|p| super::measured(p, interval_ms)) {
        let secs = p.len_ms as f64 / 1000.0;
        let d = model.demand(p);
        let net = (d.min(model.burst) - model.baseline) * time_scale;
        if net > 0.0 && exhausted_at_ms.is_none() && balance - net * secs <= 0.0 {
            let start = p.t_ms.saturating_sub(p.len_ms) as f64;
            exhausted_at_ms = Some((start + balance / net * 1000.0).round() as u64);
        }
        balance = (balance - net * secs).clamp(0.0, model.bucket);
        end_ms = p.t_ms;
    }
    let recent: Vec<&VolumePoint> = points
        .iter()
        .rev()
        .filter(|p| super::measured(p, interval_ms))
        .take(window.max(1))
        .collect();
    let demand = if recent.is_empty() {
        0.0
    } else {
        recent.iter().map(|p| model.demand(p)).sum::<f64>() / recent.len() as f64
    };
    // Once empty, a volume at its baseline keeps its balance near 0 (noise around the baseline
    // spends and refills a few credits): that is "ran out", not "runs out in a minute".
    let runs_out_in_s = if balance > EMPTY_FRACTION * model.bucket {
        model.seconds_to_empty(balance, demand, time_scale)
    } else {
        None
    };
    CreditForecast {
        node: node.to_string(),
        volume: volume.to_string(),
        model: model.clone(),
        time_scale,
        demand,
        balance,
        exhausted_at_ms,
        runs_out_in_s,
        runs_out_at_ms: runs_out_in_s.map(|s| end_ms + (s * 1000.0).round() as u64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gp2(size: f64) -> CreditModel {
        CreditModel::for_volume(&VolumeModel {
            kind: "gp2".into(),
            size_gib: size,
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn gp2_60_gib_at_3000_iops_runs_out_after_1914_9_s() {
        let m = gp2(60.0);
        assert_eq!(
            (m.baseline, m.burst, m.bucket),
            (180.0, 3000.0, 5_400_000.0)
        );
        let s = m.seconds_to_empty(m.bucket, 3000.0, 1.0).unwrap();
        assert!((s - 1_914.893_617).abs() < 1e-3, "{s}");
        // 60x emulation shows the same drain in 31.9 s.
        let s = m.seconds_to_empty(m.bucket, 3000.0, 60.0).unwrap();
        assert!((s - 31.914_893).abs() < 1e-3, "{s}");
        // At or below the baseline the bucket never empties.
        assert_eq!(m.seconds_to_empty(m.bucket, 150.0, 1.0), None);
    }

    #[test]
    fn models_that_cannot_run_out() {
        let none = |kind: &str, size: f64| {
            CreditModel::for_volume(&VolumeModel {
                kind: kind.into(),
                size_gib: size,
                ..Default::default()
            })
        };
        assert_eq!(none("gp3", 60.0), None);
        assert_eq!(none("io2", 60.0), None);
        assert_eq!(none("gp2", 1000.0), None); // baseline 3,000 = burst
        assert_eq!(gp2(10.0).baseline, 100.0); // the 100 IOPS floor
        let st1 = none("st1", 2048.0).unwrap();
        assert_eq!(
            (st1.baseline, st1.burst, st1.bucket),
            (80.0, 500.0, 2.0 * 1024.0 * 1024.0)
        );
        let sc1 = none("SC1", 1024.0).unwrap();
        assert_eq!((sc1.baseline, sc1.burst), (12.0, 80.0));
    }

    #[test]
    fn st1_counts_small_ios_as_a_full_mib() {
        let st1 = CreditModel::for_volume(&VolumeModel {
            kind: "st1".into(),
            size_gib: 1024.0,
            ..Default::default()
        })
        .unwrap();
        let p = VolumePoint {
            t_ms: 1000,
            len_ms: 1000,
            ios: [100, 0],
            bytes: [100 * 8192, 0],
            ..Default::default()
        };
        assert_eq!(st1.demand(&p), 100.0);
    }

    #[test]
    fn forecast_before_the_cliff_and_after() {
        let m = gp2(60.0);
        let pt = |k: u64, iops: u64| VolumePoint {
            t_ms: (k + 1) * 1000,
            len_ms: 1000,
            ios: [iops, 0],
            bytes: [iops * 8192, 0],
            ..Default::default()
        };
        // 10 s at 3,000 IOPS with a 60x time scale: 10 x 2,820 x 60 = 1,692,000 credits spent.
        let pts: Vec<VolumePoint> = (0..10).map(|k| pt(k, 3000)).collect();
        let f = forecast("worker-3", "/data", &m, &pts, 60.0, 60, 1000);
        assert!((f.balance - 3_708_000.0).abs() < 1e-6);
        assert!((f.runs_out_in_s.unwrap() - 3_708_000.0 / (2820.0 * 60.0)).abs() < 1e-9);
        assert_eq!(f.runs_out_at_ms, Some(10_000 + 21_915));
        assert_eq!(f.exhausted_at_ms, None);
        // Keep going past the cliff: it empties at 31.9 s, then the demand falls to baseline.
        let pts: Vec<VolumePoint> = (0..60)
            .map(|k| pt(k, if k < 32 { 3000 } else { 180 }))
            .collect();
        let f = forecast("worker-3", "/data", &m, &pts, 60.0, 10, 1000);
        assert_eq!(f.exhausted_at_ms, Some(31_915));
        assert_eq!((f.balance, f.runs_out_in_s), (0.0, None));
    }
}
