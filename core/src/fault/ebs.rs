//! EBS volume models: the ceilings and credit buckets of AWS volume types, as a gate for the IO
//! path and as forecasts for the chokepoint finder and reports. This is the one model: the
//! agent's `ebs` fault throttles with it, and the coordinator's chokepoint finder
//! (`coordinator/src/analysis/chokepoint/credit.rs`) takes its buckets and its arithmetic
//! (units counted, seconds to empty) from here.
//!
//! Everything is counted in *units*: an SSD volume (gp2, gp3, io1, io2) counts an IO of up to
//! 256 KiB as one IO and a larger one as `ceil(len / 256 KiB)` IOs (EBS's 256 KiB capacity
//! units); an HDD volume (st1, sc1) counts throughput in 1 MiB units and charges an IO of up to
//! 1 MiB as a full MiB, which is why small random IO on st1 crawls (130 IOPS at 4 KiB in
//! docs/domain.md#st1-throughput-credits; the numbers and their sources: docs/domain.md).
//! A model is three token buckets an IO must all pass:
//! - the burst ceiling, in units per second (gp2: 3,000 IOPS; st1: 250 MiB/s per TiB up to 500);
//! - the credit bucket (gp2, st1, sc1 only): every unit spends one credit, credits refill at the
//!   baseline rate, so once the bucket is empty the volume runs at baseline, and it recovers at
//!   baseline while idle. This is AWS's own description (5.4M IO credits, 3 per GiB per second);
//! - a byte ceiling for SSD types (gp2 128/250 MiB/s, gp3 provisioned, io1/io2 from IOPS).
//!
//! `time_scale` s divides the credit bucket's capacity by s and keeps the rates real, so the
//! time to exhaustion (balance / (demand − baseline)) and to refill are divided by s while the
//! IOPS and throughput a test sees stay those of the real volume.

use serde::{Deserialize, Serialize};

use super::bucket::TokenBucket;
use super::spec::{EbsSpec, VolumeType};
use super::{Admission, IoGate};
use crate::job::Direction;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const MIB_F: f64 = MIB as f64;

/// The unit of SSD IOPS accounting: larger IOs count as several IOs.
pub const SSD_UNIT_BYTES: u64 = 256 * KIB;
/// The unit of HDD throughput accounting: smaller IOs cost a full MiB.
pub const HDD_UNIT_BYTES: u64 = MIB;
/// gp2's bucket: 5.4M IO credits, enough for 3,000 IOPS for 30 minutes from full.
pub const GP2_CREDITS: f64 = 5_400_000.0;
/// gp2's burst ceiling below 1,000 GiB (where its baseline reaches it).
pub const GP2_BURST_IOPS: f64 = 3_000.0;

/// What a model's credits count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CreditUnit {
    /// SSD types: IO credits; rates are IOPS (an IO above 256 KiB costs one per 256 KiB).
    Io,
    /// HDD types: MiB of throughput credits; rates are MiB/s (an IO of 1 MiB or less costs 1 MiB).
    Mib,
}

impl CreditUnit {
    /// The rate unit, for reports.
    pub fn rate_name(self) -> &'static str {
        match self {
            CreditUnit::Io => "IOPS",
            CreditUnit::Mib => "MiB/s",
        }
    }

    /// Bytes one unit covers.
    pub fn bytes(self) -> u64 {
        match self {
            CreditUnit::Io => SSD_UNIT_BYTES,
            CreditUnit::Mib => HDD_UNIT_BYTES,
        }
    }

    /// Units per second spent by `ios` IOs of `bytes` in total over `secs`, estimated as
    /// `max(ios, bytes / unit)`: exact when all IOs are on the same side of the unit size, a
    /// lower bound for a mix (docs/domain.md#io-accounting).
    pub fn demand(self, ios: f64, bytes: f64, secs: f64) -> f64 {
        if secs <= 0.0 {
            return 0.0;
        }
        ios.max(bytes / self.bytes() as f64) / secs
    }
}

/// Real seconds until `balance` credits run out at `demand` units per second, for a bucket
/// refilled at `baseline` and spent at most at `burst`, emulated `time_scale` times faster
/// than real time. `None` when the demand does not exceed the baseline: the bucket then never
/// empties.
pub fn seconds_to_empty(
    baseline: f64,
    burst: f64,
    balance: f64,
    demand: f64,
    time_scale: f64,
) -> Option<f64> {
    let drain = (demand.min(burst) - baseline) * time_scale.max(f64::MIN_POSITIVE);
    (drain > 0.0).then(|| balance.max(0.0) / drain)
}

/// What a model allows per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ceilings {
    /// IOs per second at the unit size or smaller (256 KiB for SSD, 1 MiB for HDD).
    pub iops: f64,
    /// Bytes per second at the best IO size.
    pub bytes_per_s: f64,
}

/// One EBS volume's performance rules, resolved from its type, size and provisioning.
#[derive(Debug, Clone, PartialEq)]
pub struct EbsModel {
    pub volume_type: VolumeType,
    /// Whole GiB for a plan's volume; a measured volume's size may have a fraction.
    pub size_gib: f64,
    /// Credit clock speed-up (see the module doc); 1 is real time.
    pub time_scale: f64,
    /// Credit balance at the start, 0..=1.
    pub initial_credit_fraction: f64,
    /// Bytes one accounting unit covers (`SSD_UNIT_BYTES` or `HDD_UNIT_BYTES`).
    pub unit_bytes: u64,
    /// Units per second while credits last (for types without credits, the only ceiling).
    pub burst_units_per_s: f64,
    /// Units per second once credits are gone; also the refill rate of the bucket.
    pub baseline_units_per_s: f64,
    /// Byte ceiling on top of the unit ceiling (SSD types).
    pub throughput_cap_bytes_per_s: Option<f64>,
    /// Full bucket in units as AWS states it (not time-scaled); `None` when the type has no
    /// credits or the baseline already reaches the burst ceiling (gp2 ≥ 1,000 GiB).
    pub credit_capacity_units: Option<f64>,
}

impl EbsModel {
    /// The rules for a volume, from the EBS user guide:
    /// - gp2: baseline 3 IOPS/GiB (min 100, max 16,000); burst 3,000 IOPS below 1,000 GiB (where
    ///   the baseline reaches it); throughput 128 MiB/s up to 170 GiB, else 250 MiB/s. AWS gives
    ///   171..333 GiB 250 MiB/s only while credits last: without credits those volumes run at
    ///   baseline IOPS × 256 KiB (153..250 MiB/s), which the unit ceiling already enforces.
    /// - gp3: 3,000 IOPS and 125 MiB/s, or the provisioned values; no credits.
    /// - io1: provisioned IOPS; 500 MiB/s up to 32,000 IOPS, above that 16 KiB per IOPS.
    /// - io2 (Block Express): provisioned IOPS; 4,000 MiB/s (0.256 MiB/s per IOPS, which the
    ///   256 KiB unit ceiling already gives below 16,000 IOPS).
    /// - st1: 40 MiB/s per TiB baseline, 250 MiB/s per TiB burst, both capped at 500; a bucket of
    ///   1 TiB of credits per TiB. sc1: 12 MiB/s per TiB baseline capped at 192 (its size at
    ///   most 16 TiB), 80 MiB/s per TiB burst capped at 250; same bucket.
    pub fn new(
        volume_type: VolumeType,
        size_gib: u64,
        provisioned_iops: Option<u64>,
        provisioned_mib_s: Option<u64>,
    ) -> Self {
        Self::sized(
            volume_type,
            size_gib as f64,
            provisioned_iops,
            provisioned_mib_s,
        )
    }

    /// The model of a volume by its `kind` as agents report it ("gp2", "ST1"), sized in GiB
    /// with any fraction; `None` for `local` and unknown kinds or a size that is not positive.
    pub fn for_kind(
        kind: &str,
        size_gib: f64,
        provisioned_iops: Option<u64>,
        provisioned_mib_s: Option<u64>,
    ) -> Option<Self> {
        let volume_type = VolumeType::parse(kind)?;
        (size_gib.is_finite() && size_gib > 0.0)
            .then(|| Self::sized(volume_type, size_gib, provisioned_iops, provisioned_mib_s))
    }

    fn sized(
        volume_type: VolumeType,
        size_gib: f64,
        provisioned_iops: Option<u64>,
        provisioned_mib_s: Option<u64>,
    ) -> Self {
        let size = size_gib;
        let tib = size / 1024.0;
        let ssd = |burst: f64, baseline: f64, tput_mib: f64, credits: Option<f64>| EbsModel {
            volume_type,
            size_gib,
            time_scale: 1.0,
            initial_credit_fraction: 1.0,
            unit_bytes: SSD_UNIT_BYTES,
            burst_units_per_s: burst,
            baseline_units_per_s: baseline,
            throughput_cap_bytes_per_s: Some(tput_mib * MIB_F),
            credit_capacity_units: credits,
        };
        let hdd = |base_per_tib: f64, base_cap: f64, burst_per_tib: f64, burst_cap: f64| {
            let baseline = (base_per_tib * tib).min(base_cap);
            let burst = (burst_per_tib * tib).min(burst_cap);
            EbsModel {
                volume_type,
                size_gib,
                time_scale: 1.0,
                initial_credit_fraction: 1.0,
                unit_bytes: HDD_UNIT_BYTES,
                burst_units_per_s: burst.max(baseline),
                baseline_units_per_s: baseline,
                throughput_cap_bytes_per_s: None,
                // 1 TiB of credits per TiB, in MiB units.
                credit_capacity_units: (baseline < burst).then_some(tib * 1024.0 * 1024.0),
            }
        };
        match volume_type {
            VolumeType::Gp2 => {
                let baseline = (3.0 * size).clamp(100.0, 16_000.0);
                let tput = if size <= 170.0 { 128.0 } else { 250.0 };
                if baseline < GP2_BURST_IOPS {
                    ssd(GP2_BURST_IOPS, baseline, tput, Some(GP2_CREDITS))
                } else {
                    ssd(baseline, baseline, tput, None)
                }
            }
            VolumeType::Gp3 => {
                let iops = provisioned_iops.unwrap_or(3_000) as f64;
                ssd(iops, iops, provisioned_mib_s.unwrap_or(125) as f64, None)
            }
            VolumeType::Io1 => {
                let iops = provisioned_iops.unwrap_or(100) as f64;
                let tput = if iops <= 32_000.0 {
                    500.0
                } else {
                    iops * 16.0 / 1024.0
                };
                ssd(iops, iops, tput, None)
            }
            VolumeType::Io2 => {
                let iops = provisioned_iops.unwrap_or(100) as f64;
                ssd(iops, iops, (iops * 0.256).min(4_000.0), None)
            }
            VolumeType::St1 => hdd(40.0, 500.0, 250.0, 500.0),
            VolumeType::Sc1 => hdd(12.0, 192.0, 80.0, 250.0),
        }
    }

    /// The model a plan asks for. Values outside the validated ranges are made harmless
    /// (scale ≤ 0 → 1, fraction clamped) rather than trusted.
    pub fn from_spec(spec: &EbsSpec) -> Self {
        EbsModel::new(
            spec.volume_type,
            spec.size_gib,
            spec.provisioned_iops,
            spec.provisioned_mib_s,
        )
        .with_time_scale(spec.time_scale)
        .with_initial_credit_fraction(spec.initial_credit_fraction.unwrap_or(1.0))
    }

    pub fn with_time_scale(mut self, s: f64) -> Self {
        self.time_scale = if s.is_finite() && s > 0.0 { s } else { 1.0 };
        self
    }

    pub fn with_initial_credit_fraction(mut self, f: f64) -> Self {
        self.initial_credit_fraction = if f.is_finite() {
            f.clamp(0.0, 1.0)
        } else {
            1.0
        };
        self
    }

    /// Units an IO of `len` bytes costs: at least one, and one per started unit.
    pub fn io_units(&self, len: u64) -> u64 {
        len.div_ceil(self.unit_bytes).max(1)
    }

    pub fn has_credits(&self) -> bool {
        self.credit_capacity_units.is_some()
    }

    /// What the model's units (and so its credits) count.
    pub fn credit_unit(&self) -> CreditUnit {
        if self.unit_bytes == HDD_UNIT_BYTES {
            CreditUnit::Mib
        } else {
            CreditUnit::Io
        }
    }

    fn ceilings(&self, units_per_s: f64) -> Ceilings {
        let bytes = units_per_s * self.unit_bytes as f64;
        Ceilings {
            iops: units_per_s,
            bytes_per_s: self
                .throughput_cap_bytes_per_s
                .map_or(bytes, |c| c.min(bytes)),
        }
    }

    /// What the volume sustains forever (with an empty bucket): gp2 60 GiB → 180 IOPS.
    pub fn baseline(&self) -> Ceilings {
        self.ceilings(self.baseline_units_per_s)
    }

    /// What the volume does while it has credits (equal to `baseline` without a bucket).
    pub fn burst(&self) -> Ceilings {
        self.ceilings(self.burst_units_per_s)
    }

    /// The bucket's capacity in units as the emulation runs it (divided by `time_scale`).
    pub fn scaled_credit_capacity(&self) -> Option<f64> {
        self.credit_capacity_units.map(|c| c / self.time_scale)
    }

    /// Seconds a full bucket lasts at the burst ceiling (AWS's "burst duration"), time-scaled:
    /// gp2 at any size below 1 TiB with s = 1: 5.4M / (3,000 − baseline).
    pub fn burst_duration_s(&self) -> Option<f64> {
        let drain = self.burst_units_per_s - self.baseline_units_per_s;
        self.scaled_credit_capacity()
            .filter(|_| drain > 0.0)
            .map(|cap| cap / drain)
    }

    /// A gate running this model from `start_ns` (the fault window's start).
    pub fn gate(&self, start_ns: u64) -> EbsGate {
        let ceiling = TokenBucket::ceiling(self.burst_units_per_s, 1.0, start_ns);
        let credits = self.scaled_credit_capacity().map(|cap| {
            TokenBucket::new(
                self.baseline_units_per_s,
                cap,
                cap * self.initial_credit_fraction,
                start_ns,
            )
        });
        let throughput = self
            .throughput_cap_bytes_per_s
            .map(|c| TokenBucket::ceiling(c, SSD_UNIT_BYTES as f64, start_ns));
        EbsGate {
            model: self.clone(),
            ceiling,
            credits,
            throughput,
        }
    }
}

/// Seconds from `elapsed_s` until the model's credit bucket is empty, if a workload has asked
/// for `demand_iops` and `demand_bytes_per_s` steadily since the start (when the bucket held
/// `initial_credit_fraction`). `Some(0.0)` if it is already empty; `None` if it never empties
/// (the demand is within the baseline) or the model has no bucket.
///
/// The volume spends at most its burst ceiling: demand above it is throttled, not spent. Units
/// per second are estimated as `max(iops, bytes/s ÷ unit)`, exact when all IOs are on the same
/// side of the unit size, a lower bound for a mix (then the bucket empties a little sooner).
pub fn credit_forecast(
    model: &EbsModel,
    demand_iops: f64,
    demand_bytes_per_s: f64,
    elapsed_s: f64,
) -> Option<f64> {
    let capacity = model.scaled_credit_capacity()?;
    let iops = if demand_iops.is_nan() {
        0.0
    } else {
        demand_iops.max(0.0)
    };
    let bytes = if demand_bytes_per_s.is_nan() {
        0.0
    } else {
        demand_bytes_per_s.max(0.0)
    };
    let units = iops.max(bytes / model.unit_bytes as f64);
    if units <= 0.0 {
        return None;
    }
    let mut share = (model.burst_units_per_s / units).min(1.0);
    if let Some(cap) = model.throughput_cap_bytes_per_s
        && bytes > 0.0
    {
        share = share.min(cap / bytes);
    }
    let spend = units * share;
    let drain = spend - model.baseline_units_per_s;
    // Also catches NaN from degenerate inputs.
    if drain.is_nan() || drain <= 0.0 {
        return None;
    }
    let elapsed = if elapsed_s.is_finite() {
        elapsed_s.max(0.0)
    } else {
        0.0
    };
    let left = capacity * model.initial_credit_fraction - drain * elapsed;
    Some(left.max(0.0) / drain)
}

/// An `ebs` fault: an IO passes the burst ceiling, the credit bucket and the byte ceiling.
#[derive(Debug, Clone)]
pub struct EbsGate {
    model: EbsModel,
    ceiling: TokenBucket,
    credits: Option<TokenBucket>,
    throughput: Option<TokenBucket>,
}

impl EbsGate {
    pub fn model(&self) -> &EbsModel {
        &self.model
    }

    /// Credits left at `now_ns` as a fraction of the bucket, like CloudWatch's `BurstBalance`
    /// (`None` for a model without credits).
    pub fn burst_balance(&self, now_ns: u64) -> Option<f64> {
        self.credits
            .as_ref()
            .map(|b| (b.level_at(now_ns) / b.capacity()).clamp(0.0, 1.0))
    }
}

impl IoGate for EbsGate {
    fn admit(&mut self, now_ns: u64, _dir: Direction, len: u64) -> Admission {
        let units = self.model.io_units(len) as f64;
        let mut t = self.ceiling.admit_at(now_ns, units);
        if let Some(c) = &self.credits {
            t = t.max(c.admit_at(now_ns, units));
        }
        if let Some(b) = &self.throughput {
            t = t.max(b.admit_at(now_ns, len as f64));
        }
        if t <= now_ns {
            Admission::Now
        } else {
            Admission::At(t)
        }
    }

    fn charge(&mut self, now_ns: u64, _dir: Direction, len: u64) {
        let units = self.model.io_units(len) as f64;
        self.ceiling.charge(now_ns, units);
        if let Some(c) = &mut self.credits {
            c.charge(now_ns, units);
        }
        if let Some(b) = &mut self.throughput {
            b.charge(now_ns, len as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::bucket::drive;
    use super::*;
    use proptest::prelude::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_volume_kind_names_its_model_and_its_credit_unit() {
        let gp2 = EbsModel::for_kind("GP2", 60.0, None, None).unwrap();
        assert_eq!(gp2, EbsModel::new(VolumeType::Gp2, 60, None, None));
        assert_eq!(gp2.credit_unit(), CreditUnit::Io);
        let st1 = EbsModel::for_kind("st1", 1536.0, None, None).unwrap();
        assert_eq!(st1.credit_unit(), CreditUnit::Mib);
        assert_eq!(st1.credit_capacity_units, Some(1.5 * 1024.0 * 1024.0));
        assert_eq!(EbsModel::for_kind("local", 60.0, None, None), None);
        assert_eq!(EbsModel::for_kind("gp2", 0.0, None, None), None);
        assert_eq!(EbsModel::for_kind("gp2", f64::NAN, None, None), None);
    }

    #[test]
    fn sc1_baseline_stops_at_192_mib_s_and_keeps_a_bucket_past_16_tib() {
        // docs/domain.md#st1-sc1: 12 MiB/s per TiB, 192 at the 16 TiB maximum size.
        let m = EbsModel::new(VolumeType::Sc1, 32 * 1024, None, None);
        assert_eq!(
            (m.baseline_units_per_s, m.burst_units_per_s),
            (192.0, 250.0)
        );
        assert!(m.has_credits());
    }

    #[test]
    fn demand_counts_units_and_the_bucket_drains_above_baseline_only() {
        // 100 IOs of 8 KiB in 1 s: 100 IO credits on gp2, 100 MiB of credits on st1.
        assert_eq!(CreditUnit::Io.demand(100.0, 100.0 * 8192.0, 1.0), 100.0);
        assert_eq!(CreditUnit::Mib.demand(100.0, 100.0 * 8192.0, 1.0), 100.0);
        // 10 IOs of 1 MiB in 2 s on gp2: 4 units each.
        assert_eq!(CreditUnit::Io.demand(10.0, 10.0 * 1048576.0, 2.0), 20.0);
        assert_eq!(CreditUnit::Io.demand(10.0, 1.0, 0.0), 0.0);
        // gp2 60 GiB at 3,000 IOPS: 5.4M / 2,820 s; demand above burst spends only the burst.
        let s = seconds_to_empty(180.0, 3000.0, GP2_CREDITS, 5000.0, 1.0).unwrap();
        assert!((s - 1_914.893_617).abs() < 1e-3, "{s}");
        assert_eq!(
            seconds_to_empty(180.0, 3000.0, GP2_CREDITS, 180.0, 60.0),
            None
        );
    }

    /// Open-loop IOs of `len` bytes at `iops` from `from_s` for `secs`.
    fn paced(
        iops: f64,
        from_s: f64,
        secs: f64,
        len: u64,
    ) -> impl Iterator<Item = (u64, Direction, u64)> {
        let n = (iops * secs).round() as u64;
        let start = (from_s * S as f64) as u64;
        (0..n).map(move |i| (start + (i as f64 * 1e9 / iops) as u64, Direction::Read, len))
    }

    fn count_in(times: &[u64], from_s: f64, to_s: f64) -> usize {
        let (a, b) = ((from_s * 1e9) as u64, (to_s * 1e9) as u64);
        times.iter().filter(|&&t| t >= a && t < b).count()
    }

    fn gp2(size: u64) -> EbsModel {
        EbsModel::new(VolumeType::Gp2, size, None, None)
    }

    #[test]
    fn gp2_numbers_follow_size() {
        let m = gp2(60);
        assert_eq!(m.baseline().iops, 180.0);
        assert_eq!(m.burst().iops, 3_000.0);
        assert_eq!(m.burst().bytes_per_s, 128.0 * MIB_F);
        assert_eq!(m.baseline().bytes_per_s, 180.0 * 256.0 * 1024.0);
        assert_eq!(m.credit_capacity_units, Some(GP2_CREDITS));
        assert_eq!(gp2(10).baseline().iops, 100.0);
        assert_eq!(gp2(200).burst().bytes_per_s, 250.0 * MIB_F);
        assert_eq!(gp2(500).baseline().iops, 1_500.0);
        // 1,000 GiB and up: the baseline reaches the burst ceiling, credits are never spent.
        let big = gp2(2_000);
        assert_eq!(
            (big.baseline().iops, big.burst().iops, big.has_credits()),
            (6_000.0, 6_000.0, false)
        );
        assert_eq!(gp2(16_384).baseline().iops, 16_000.0);
        // AWS: a full bucket lasts 30 minutes at 3,000 IOPS on a tiny volume... minus the refill.
        let d = gp2(100).burst_duration_s().unwrap();
        assert!((d - GP2_CREDITS / 2_700.0).abs() < 1e-6, "{d}");
        assert_eq!(big.burst_duration_s(), None);
    }

    /// The gp2 field scenario (docs/domain.md#gp2-credit-exhaustion), 60x faster: 60 GiB gp2
    /// driven at 3,000 IOPS empties its bucket after
    /// 5.4M / (3,000 − 180) / 60 ≈ 31.9 s, then holds 180 IOPS.
    #[test]
    fn gp2_60gib_at_3000_iops_scaled_60x_empties_on_time_then_holds_baseline() {
        let model = gp2(60).with_time_scale(60.0);
        let mut gate = model.gate(0);
        let times = drive(&mut gate, paced(3_000.0, 0.0, 60.0, 4096));
        let expected = GP2_CREDITS / (3_000.0 - 180.0) / 60.0;
        assert!((expected - 31.9149).abs() < 1e-3);
        // Onset: the first IO held back past its intended time.
        let onset = paced(3_000.0, 0.0, 60.0, 4096)
            .zip(&times)
            .find(|((intended, _, _), t)| **t > *intended)
            .map(|((intended, _, _), _)| intended as f64 / 1e9)
            .expect("the bucket must empty");
        assert!(
            (onset - expected).abs() <= 1.0 / 2_820.0 + 1e-6,
            "onset {onset} vs {expected}"
        );
        assert!(
            (credit_forecast(&model, 3_000.0, 3_000.0 * 4096.0, 0.0).unwrap() - expected).abs()
                < 1e-9
        );
        // Then the baseline, to the IO.
        for s in 35..45 {
            let n = count_in(&times, s as f64, s as f64 + 1.0);
            assert!((179..=181).contains(&n), "second {s}: {n} IOs");
        }
        assert!(gate.burst_balance(40 * S).unwrap() < 1e-3);
    }

    #[test]
    fn gp2_refills_at_baseline_while_idle() {
        let model = gp2(60).with_time_scale(60.0);
        let mut gate = model.gate(0);
        // Drain it, then idle for 10 s: 10 × 180 = 1,800 scaled credits (108,000 real ones).
        let drained = drive(&mut gate, paced(3_000.0, 0.0, 40.0, 4096));
        let busy_until = *drained.last().unwrap();
        assert!(busy_until >= 40 * S - S / 100, "{busy_until}");
        let idle_from = busy_until as f64 / 1e9;
        let balance = gate.burst_balance(busy_until + 10 * S).unwrap();
        assert!((balance - 1_800.0 / 90_000.0).abs() < 1e-3, "{balance}");
        // Burst again: 1,800 / (3,000 − 180) ≈ 0.64 s at 3,000 IOPS, then baseline.
        let again_s = idle_from + 10.0;
        let ios: Vec<_> = paced(3_000.0, again_s, 3.0, 4096).collect();
        let times = drive(&mut gate, ios.iter().copied());
        let onset = ios
            .iter()
            .zip(&times)
            .find(|((i, _, _), t)| **t > *i)
            .map(|((i, _, _), _)| *i as f64 / 1e9 - again_s)
            .unwrap();
        assert!((onset - 1_800.0 / 2_820.0).abs() < 0.01, "{onset}");
        // And a gate never earns more than a full bucket.
        assert_eq!(gate.burst_balance(u64::MAX / 2), Some(1.0));
    }

    #[test]
    fn gp2_large_ios_count_per_256k() {
        let m = gp2(60);
        assert_eq!(
            (
                m.io_units(4096),
                m.io_units(256 * 1024),
                m.io_units(256 * 1024 + 1)
            ),
            (1, 1, 2)
        );
        assert_eq!(m.io_units(128 * MIB), 512);
        // Empty bucket, 1 MiB IOs: 180 units/s = 45 IOs/s.
        let mut gate = m.with_initial_credit_fraction(0.0).gate(0);
        let times = drive(&mut gate, paced(1_000.0, 0.0, 10.0, MIB));
        let n = count_in(&times, 1.0, 2.0);
        assert!((44..=46).contains(&n), "{n}");
    }

    #[test]
    fn gp2_throughput_ceiling_binds_for_large_ios_with_credits() {
        // 100 GiB: 128 MiB/s even with credits; 256 KiB IOs at 3,000 IOPS would be 750 MiB/s.
        let mut gate = gp2(100).gate(0);
        let times = drive(&mut gate, paced(3_000.0, 0.0, 5.0, 256 * 1024));
        let n = count_in(&times, 1.0, 2.0);
        assert!((511..=513).contains(&n), "{n} IOs of 256 KiB = 128 MiB/s");
    }

    #[test]
    fn st1_small_ios_cost_a_full_mib() {
        // 500 GiB st1 (docs/domain.md#st1-throughput-credits): burst 250 × 500/1024 ≈ 122 MiB/s,
        // so ≈ 122 IOs/s at 4 KiB.
        let m = EbsModel::new(VolumeType::St1, 500, None, None);
        assert_eq!(m.io_units(4096), 1);
        assert_eq!(m.io_units(MIB), 1);
        assert_eq!(m.io_units(MIB + 1), 2);
        let burst = 250.0 * 500.0 / 1024.0;
        assert!((m.burst().iops - burst).abs() < 1e-9);
        assert!((m.baseline().bytes_per_s - 40.0 * 500.0 / 1024.0 * MIB_F).abs() < 1e-3);
        let mut gate = m.gate(0);
        let times = drive(&mut gate, paced(2_000.0, 0.0, 3.0, 4096));
        let n = count_in(&times, 1.0, 2.0) as f64;
        assert!((n - burst).abs() <= 1.5, "{n} 4 KiB IOs/s");
        // The same number of MiB/s with 1 MiB IOs: 250× the bytes for the same credits.
        let mut gate = m.gate(0);
        let times = drive(&mut gate, paced(2_000.0, 0.0, 3.0, MIB));
        let n = count_in(&times, 1.0, 2.0) as f64;
        assert!((n - burst).abs() <= 1.5, "{n} 1 MiB IOs/s");
    }

    #[test]
    fn st1_and_sc1_ceilings_and_buckets() {
        let st1 = EbsModel::new(VolumeType::St1, 16_384, None, None);
        assert_eq!(
            (
                st1.baseline().bytes_per_s / MIB_F,
                st1.burst().bytes_per_s / MIB_F
            ),
            (500.0, 500.0)
        );
        assert!(!st1.has_credits());
        let st1 = EbsModel::new(VolumeType::St1, 2_048, None, None);
        assert_eq!(
            (
                st1.baseline().bytes_per_s / MIB_F,
                st1.burst().bytes_per_s / MIB_F
            ),
            (80.0, 500.0)
        );
        assert_eq!(st1.credit_capacity_units, Some(2.0 * 1024.0 * 1024.0));
        let sc1 = EbsModel::new(VolumeType::Sc1, 1_024, None, None);
        assert_eq!(
            (
                sc1.baseline().bytes_per_s / MIB_F,
                sc1.burst().bytes_per_s / MIB_F
            ),
            (12.0, 80.0)
        );
        let sc1 = EbsModel::new(VolumeType::Sc1, 16_384, None, None);
        assert_eq!(
            (
                sc1.baseline().bytes_per_s / MIB_F,
                sc1.burst().bytes_per_s / MIB_F
            ),
            (192.0, 250.0)
        );
        // 1 TiB sc1 at full burst: 1 TiB / (80 − 12) MiB/s ≈ 4.3 h; at 3600x, ≈ 4.3 s.
        let d = sc1_1t()
            .with_time_scale(3_600.0)
            .burst_duration_s()
            .unwrap();
        assert!((d - 1_048_576.0 / 68.0 / 3_600.0).abs() < 1e-9, "{d}");
    }

    fn sc1_1t() -> EbsModel {
        EbsModel::new(VolumeType::Sc1, 1_024, None, None)
    }

    #[test]
    fn st1_bucket_empties_then_holds_baseline() {
        // 1 TiB st1 at 3600x: 1,048,576 MiB / (250 − 40) / 3600 ≈ 1.387 s, then 40 MiB/s.
        let m = EbsModel::new(VolumeType::St1, 1_024, None, None).with_time_scale(3_600.0);
        let mut gate = m.gate(0);
        let times = drive(&mut gate, paced(250.0, 0.0, 10.0, MIB));
        let expected = credit_forecast(&m, 250.0, 250.0 * MIB_F, 0.0).unwrap();
        assert!((expected - 1_048_576.0 / 210.0 / 3_600.0).abs() < 1e-9);
        let n = count_in(&times, 3.0, 4.0);
        assert!((39..=41).contains(&n), "{n} MiB/s after the bucket");
        let n = count_in(&times, 0.0, 1.0);
        assert!(n >= 248, "{n} MiB/s while bursting");
    }

    #[test]
    fn gp3_is_a_flat_ceiling() {
        let m = EbsModel::new(VolumeType::Gp3, 60, None, None);
        assert!(!m.has_credits());
        assert_eq!(m.baseline(), m.burst());
        assert_eq!(m.burst().iops, 3_000.0);
        assert_eq!(m.burst().bytes_per_s, 125.0 * MIB_F);
        assert_eq!(credit_forecast(&m, 1e6, 1e12, 0.0), None);
        let mut gate = m.gate(0);
        let times = drive(&mut gate, paced(10_000.0, 0.0, 30.0, 4096));
        for s in [1, 10, 25] {
            let n = count_in(&times, s as f64, s as f64 + 1.0);
            assert!((2_999..=3_001).contains(&n), "second {s}: {n}");
        }
        // 125 MiB/s binds for 1 MiB IOs.
        let mut gate = m.gate(0);
        let times = drive(&mut gate, paced(1_000.0, 0.0, 5.0, MIB));
        let n = count_in(&times, 2.0, 3.0);
        assert!((124..=126).contains(&n), "{n}");
        let p = EbsModel::new(VolumeType::Gp3, 100, Some(16_000), Some(1_000));
        assert_eq!(
            (p.burst().iops, p.burst().bytes_per_s / MIB_F),
            (16_000.0, 1_000.0)
        );
    }

    #[test]
    fn io2_delivers_what_is_provisioned() {
        let m = EbsModel::new(VolumeType::Io2, 100, Some(20_000), None);
        assert_eq!(m.baseline(), m.burst());
        assert_eq!(m.burst().iops, 20_000.0);
        assert_eq!(m.burst().bytes_per_s, 4_000.0 * MIB_F);
        let mut gate = m.gate(0);
        let times = drive(&mut gate, paced(50_000.0, 0.0, 3.0, 16 * 1024));
        let n = count_in(&times, 1.0, 2.0);
        assert!((19_999..=20_001).contains(&n), "{n}");
        // Small io2: the 256 KiB unit gives 0.25 MiB/s per IOPS.
        let small = EbsModel::new(VolumeType::Io2, 10, Some(1_000), None);
        assert_eq!(small.burst().bytes_per_s, 250.0 * MIB_F);
        let io1 = EbsModel::new(VolumeType::Io1, 1_280, Some(48_000), None);
        assert_eq!(io1.burst().bytes_per_s, 750.0 * MIB_F);
        assert_eq!(
            EbsModel::new(VolumeType::Io1, 200, Some(10_000), None)
                .burst()
                .bytes_per_s,
            500.0 * MIB_F
        );
    }

    #[test]
    fn forecast_cases() {
        let m = gp2(60);
        // Within the baseline: never.
        assert_eq!(credit_forecast(&m, 150.0, 150.0 * 4096.0, 0.0), None);
        // Above the burst ceiling the volume spends only 3,000/s.
        let at_ceiling = credit_forecast(&m, 3_000.0, 0.0, 0.0).unwrap();
        assert_eq!(credit_forecast(&m, 9_000.0, 0.0, 0.0).unwrap(), at_ceiling);
        // Elapsed time counts down; past exhaustion it says 0.
        let later = credit_forecast(&m, 3_000.0, 0.0, 600.0).unwrap();
        assert!((at_ceiling - later - 600.0).abs() < 1e-6);
        assert_eq!(credit_forecast(&m, 3_000.0, 0.0, 1e9), Some(0.0));
        // Large IOs spend per 256 KiB: 100 IOPS of 1 MiB = 400 units/s.
        let big = credit_forecast(&m, 100.0, 100.0 * MIB_F, 0.0).unwrap();
        assert!((big - GP2_CREDITS / 220.0).abs() < 1e-6, "{big}");
        // Half a bucket lasts half as long.
        let half = credit_forecast(
            &m.clone().with_initial_credit_fraction(0.5),
            3_000.0,
            0.0,
            0.0,
        )
        .unwrap();
        assert!((half * 2.0 - at_ceiling).abs() < 1e-6);
        // Nothing asked: None.
        assert_eq!(credit_forecast(&m, 0.0, 0.0, 0.0), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// A gp2 gate never gives more than its burst ceiling, and over a long run never more
        /// than bucket + baseline × time.
        #[test]
        fn gp2_never_beats_credits_plus_baseline(size in 1u64..999, scale in 1.0f64..10_000.0, iops in 100.0f64..5_000.0) {
            let m = gp2(size).with_time_scale(scale);
            let mut gate = m.gate(0);
            let secs = 5.0;
            let times = drive(&mut gate, paced(iops, 0.0, secs, 4096));
            let end = *times.last().unwrap() as f64 / 1e9;
            let n = times.len() as f64;
            let credit_bound = m.scaled_credit_capacity().unwrap() + m.baseline_units_per_s * end + 1.0;
            let ceiling_bound = 3_000.0 * end + 3_000.0 * 0.01 + 1.0;
            prop_assert!(n <= credit_bound + 1e-6, "{n} > {credit_bound}");
            prop_assert!(n <= ceiling_bound + 1e-6, "{n} > {ceiling_bound}");
        }
    }
}
