//! The EBS limits of an EC2 instance: one ceiling on the summed traffic of all of its volumes,
//! which is why a node with more volumes stops scaling (docs/domain.md#instance-limits,
//! docs/domain.md#datanode-volume-count). The agent's `instance` fault builds ONE gate from
//! this model and shares it across every volume of the agent the fault targets; the volumes'
//! own limits (an `ebs` or `bw_cap` fault) stay per volume.
//!
//! Each dimension (MB/s and IOPS) has a baseline and a maximum. Types whose maximum is above
//! the baseline run at the maximum for 30 minutes, then at the baseline (AWS: "at least once
//! every 24 hours"). That is a credit bucket like gp2's: it holds (maximum − baseline) × 30 min
//! of traffic, every byte or IO spends from it, it refills at the baseline, so a saturated
//! instance empties it in exactly 30 minutes and an instance below its baseline never does.
//! AWS does not publish how its instance bucket refills; refilling at the baseline is this
//! model's assumption (it refills an idle m5.large in about 3 hours, well inside 24).
//! `time_scale` s divides the bucket by s, as the `ebs` fault does (docs/domain.md#time-scale).
//!
//! IOs are counted as the EBS volume model counts them: one per started 256 KiB
//! (`SSD_UNIT_BYTES`, docs/domain.md#io-accounting); MB are 10^6 bytes, as AWS's tables give
//! them (875 MB/s is 7,000 Mbps / 8).

use super::bucket::TokenBucket;
use super::ebs::SSD_UNIT_BYTES;
use super::spec::InstanceSpec;
use super::{Admission, IoGate};
use crate::job::Direction;

/// How long an instance with a burst runs at its maximum from a full bucket (AWS: 30 minutes).
pub const INSTANCE_BURST_S: f64 = 1_800.0;

const MB: f64 = 1e6;

/// An instance's EBS figures in one state (baseline or maximum).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InstanceLimits {
    /// MB/s (10^6 bytes) summed over the instance's volumes; `None`: not limited.
    pub mb_s: Option<f64>,
    /// IOPS summed over the instance's volumes, counted per started 256 KiB; `None`: not limited.
    pub iops: Option<f64>,
}

/// One row of the table of instance types lockstep knows (docs/domain.md#instance-limits, with
/// AWS's source).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InstanceType {
    pub name: &'static str,
    pub baseline_mb_s: f64,
    pub baseline_iops: f64,
    pub maximum_mb_s: f64,
    pub maximum_iops: f64,
}

/// The instance types of the field stories (docs/domain.md#field-scenarios): m5.large (Tableau
/// workers), r4.8xlarge (Hadoop datanodes), r5b.24xlarge (IRIS). Only types whose figures
/// docs/domain.md gives with AWS's source are here.
pub const INSTANCE_TYPES: &[InstanceType] = &[
    InstanceType {
        name: "m5.large",
        baseline_mb_s: 81.25,
        baseline_iops: 3_600.0,
        maximum_mb_s: 593.75,
        maximum_iops: 18_750.0,
    },
    InstanceType {
        name: "r4.8xlarge",
        baseline_mb_s: 875.0,
        baseline_iops: 37_500.0,
        maximum_mb_s: 875.0,
        maximum_iops: 37_500.0,
    },
    InstanceType {
        name: "r5b.24xlarge",
        baseline_mb_s: 7_500.0,
        baseline_iops: 260_000.0,
        maximum_mb_s: 7_500.0,
        maximum_iops: 260_000.0,
    },
];

/// The type named `name` (exact, lower case as AWS writes it).
pub fn instance_type(name: &str) -> Option<&'static InstanceType> {
    INSTANCE_TYPES.iter().find(|t| t.name == name)
}

/// The names of the known types, for error messages: "m5.large, r4.8xlarge, r5b.24xlarge".
pub fn known_instance_types() -> String {
    INSTANCE_TYPES
        .iter()
        .map(|t| t.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// An instance's EBS limits, resolved from a type or explicit figures.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceModel {
    /// The type's name, or "custom" for explicit figures.
    pub name: String,
    pub baseline: InstanceLimits,
    /// At least the baseline in each dimension; equal to it for types without a burst.
    pub maximum: InstanceLimits,
    /// Credit clock speed-up (1: real time).
    pub time_scale: f64,
}

impl InstanceModel {
    pub fn from_type(t: &InstanceType) -> Self {
        InstanceModel {
            name: t.name.to_string(),
            baseline: InstanceLimits {
                mb_s: Some(t.baseline_mb_s),
                iops: Some(t.baseline_iops),
            },
            maximum: InstanceLimits {
                mb_s: Some(t.maximum_mb_s),
                iops: Some(t.maximum_iops),
            },
            time_scale: 1.0,
        }
    }

    /// The model a plan asks for: its `type`, else its figures (a maximum defaults to the
    /// baseline). `None` for an unknown type; `validate` refuses that before a run.
    pub fn from_spec(spec: &InstanceSpec) -> Option<Self> {
        let mut m = match &spec.instance_type {
            Some(name) => InstanceModel::from_type(instance_type(name)?),
            None => {
                let baseline = InstanceLimits {
                    mb_s: spec.baseline_mb_s,
                    iops: spec.baseline_iops.map(|i| i as f64),
                };
                InstanceModel {
                    name: "custom".into(),
                    baseline,
                    maximum: InstanceLimits {
                        mb_s: spec.maximum_mb_s.or(baseline.mb_s),
                        iops: spec.maximum_iops.map(|i| i as f64).or(baseline.iops),
                    },
                    time_scale: 1.0,
                }
            }
        };
        m.time_scale = if spec.time_scale.is_finite() && spec.time_scale > 0.0 {
            spec.time_scale
        } else {
            1.0
        };
        Some(m)
    }

    /// Whether the instance can run above its baseline for a while.
    pub fn has_burst(&self) -> bool {
        let above = |b: Option<f64>, m: Option<f64>| matches!((b, m), (Some(b), Some(m)) if m > b);
        above(self.baseline.mb_s, self.maximum.mb_s) || above(self.baseline.iops, self.maximum.iops)
    }

    /// Seconds at the maximum from a full bucket, time-scaled (`None` without a burst).
    pub fn burst_duration_s(&self) -> Option<f64> {
        self.has_burst().then(|| INSTANCE_BURST_S / self.time_scale)
    }

    /// A gate running this model from `start_ns`, to be shared by every volume of the instance.
    pub fn gate(&self, start_ns: u64) -> InstanceGate {
        let limit = |base: Option<f64>, max: Option<f64>, scale: f64, min_burst: f64| {
            let base = base? * scale;
            let max = max.map_or(base, |m| (m * scale).max(base));
            let credits = (max > base).then(|| {
                let cap = (max - base) * INSTANCE_BURST_S / self.time_scale;
                TokenBucket::new(base, cap, cap, start_ns)
            });
            Some(Limit {
                ceiling: TokenBucket::ceiling(max, min_burst, start_ns),
                credits,
            })
        };
        InstanceGate {
            bytes: limit(
                self.baseline.mb_s,
                self.maximum.mb_s,
                MB,
                SSD_UNIT_BYTES as f64,
            ),
            ios: limit(self.baseline.iops, self.maximum.iops, 1.0, 1.0),
        }
    }
}

/// One dimension of an instance: the maximum as a ceiling, and the burst bucket if any.
#[derive(Debug, Clone)]
struct Limit {
    ceiling: TokenBucket,
    credits: Option<TokenBucket>,
}

impl Limit {
    fn admit_at(&self, now_ns: u64, cost: f64) -> u64 {
        let t = self.ceiling.admit_at(now_ns, cost);
        self.credits
            .as_ref()
            .map_or(t, |c| t.max(c.admit_at(now_ns, cost)))
    }

    fn charge(&mut self, now_ns: u64, cost: f64) {
        self.ceiling.charge(now_ns, cost);
        if let Some(c) = &mut self.credits {
            c.charge(now_ns, cost);
        }
    }
}

/// An `instance` fault's gate: an IO passes the byte limit and the IO limit.
#[derive(Debug, Clone)]
pub struct InstanceGate {
    bytes: Option<Limit>,
    ios: Option<Limit>,
}

fn units(len: u64) -> f64 {
    len.div_ceil(SSD_UNIT_BYTES).max(1) as f64
}

impl IoGate for InstanceGate {
    fn admit(&mut self, now_ns: u64, _dir: Direction, len: u64) -> Admission {
        let mut t = now_ns;
        if let Some(b) = &self.bytes {
            t = t.max(b.admit_at(now_ns, len as f64));
        }
        if let Some(i) = &self.ios {
            t = t.max(i.admit_at(now_ns, units(len)));
        }
        if t <= now_ns {
            Admission::Now
        } else {
            Admission::At(t)
        }
    }

    fn charge(&mut self, now_ns: u64, _dir: Direction, len: u64) {
        if let Some(b) = &mut self.bytes {
            b.charge(now_ns, len as f64);
        }
        if let Some(i) = &mut self.ios {
            i.charge(now_ns, units(len));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::bucket::drive;
    use super::*;
    use proptest::prelude::*;

    const S: u64 = 1_000_000_000;

    /// `n` IOs of `len` bytes, all asked for at once (a saturating workload).
    fn flood(n: u64, len: u64) -> impl Iterator<Item = (u64, Direction, u64)> {
        (0..n).map(move |_| (0, Direction::Write, len))
    }

    fn bytes_in(times: &[u64], len: u64, from_s: f64, to_s: f64) -> f64 {
        let (a, b) = ((from_s * 1e9) as u64, (to_s * 1e9) as u64);
        times.iter().filter(|&&t| t >= a && t < b).count() as f64 * len as f64
    }

    fn spec(t: &str) -> InstanceSpec {
        InstanceSpec {
            instance_type: Some(t.into()),
            ..Default::default()
        }
    }

    #[test]
    fn the_table_has_the_field_stories_types_with_awss_figures() {
        // docs/domain.md#instance-limits.
        let r4 = InstanceModel::from_spec(&spec("r4.8xlarge")).unwrap();
        assert_eq!(r4.baseline.mb_s, Some(875.0));
        assert_eq!(r4.baseline.iops, Some(37_500.0));
        assert_eq!(r4.maximum, r4.baseline);
        assert!(!r4.has_burst());
        assert_eq!(r4.burst_duration_s(), None);
        let m5 = InstanceModel::from_spec(&spec("m5.large")).unwrap();
        assert_eq!(
            (m5.baseline.mb_s, m5.maximum.mb_s),
            (Some(81.25), Some(593.75))
        );
        assert_eq!(
            (m5.baseline.iops, m5.maximum.iops),
            (Some(3_600.0), Some(18_750.0))
        );
        assert_eq!(m5.burst_duration_s(), Some(1_800.0));
        let r5b = instance_type("r5b.24xlarge").unwrap();
        assert_eq!((r5b.baseline_mb_s, r5b.baseline_iops), (7_500.0, 260_000.0));
        assert_eq!(InstanceModel::from_spec(&spec("r4.9xlarge")), None);
        assert_eq!(known_instance_types(), "m5.large, r4.8xlarge, r5b.24xlarge");
    }

    #[test]
    fn r4_8xlarge_holds_many_volumes_together_at_875_mb_s() {
        // Eight volumes' worth of 1 MiB writes offered at once: the instance lets 875 MB/s through.
        let mut gate = InstanceModel::from_spec(&spec("r4.8xlarge"))
            .unwrap()
            .gate(0);
        let len = 1 << 20;
        let times = drive(&mut gate, flood(4_000, len));
        let mb_s = bytes_in(&times, len, 1.0, 4.0) / 3.0 / MB;
        assert!((mb_s - 875.0).abs() < 875.0 * 0.01, "{mb_s}");
    }

    #[test]
    fn small_ios_meet_the_iops_limit_first() {
        // 4 KiB IOs: 37,500 IOPS is 154 MB/s, far below 875 MB/s.
        let mut gate = InstanceModel::from_spec(&spec("r4.8xlarge"))
            .unwrap()
            .gate(0);
        let times = drive(&mut gate, flood(120_000, 4096));
        let iops = bytes_in(&times, 1, 1.0, 3.0) / 2.0;
        assert!((iops - 37_500.0).abs() < 37_500.0 * 0.01, "{iops}");
    }

    #[test]
    fn m5_large_bursts_for_30_minutes_scaled_then_holds_its_baseline() {
        // time_scale 60: 30 min of burst is 30 s, then 81.25 MB/s.
        let mut s = spec("m5.large");
        s.time_scale = 60.0;
        let m = InstanceModel::from_spec(&s).unwrap();
        assert_eq!(m.burst_duration_s(), Some(30.0));
        let mut gate = m.gate(0);
        let len = 1 << 20;
        let times = drive(&mut gate, flood(30_000, len));
        let burst = bytes_in(&times, len, 1.0, 28.0) / 27.0 / MB;
        assert!((burst - 593.75).abs() < 593.75 * 0.01, "{burst}");
        let after = bytes_in(&times, len, 32.0, 40.0) / 8.0 / MB;
        assert!((after - 81.25).abs() < 81.25 * 0.02, "{after}");
    }

    #[test]
    fn explicit_figures_need_no_table_and_a_maximum_defaults_to_the_baseline() {
        let s = InstanceSpec {
            baseline_mb_s: Some(87.5),
            ..Default::default()
        };
        let m = InstanceModel::from_spec(&s).unwrap();
        assert_eq!(m.name, "custom");
        assert_eq!(m.maximum.mb_s, Some(87.5));
        assert_eq!(m.baseline.iops, None);
        let mut gate = m.gate(0);
        let len = 1 << 20;
        let times = drive(&mut gate, flood(1_000, len));
        let mb_s = bytes_in(&times, len, 1.0, 5.0) / 4.0 / MB;
        assert!((mb_s - 87.5).abs() < 87.5 * 0.02, "{mb_s}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// However IOs of any size arrive, the bytes admitted in [0, T] never exceed what the
        /// maximum allows plus one IO and the burst bucket's content: the instance's promise.
        #[test]
        fn never_more_than_the_maximum(
            base in 1.0f64..500.0,
            extra in 0.0f64..500.0,
            lens in prop::collection::vec(1u64..(4 << 20), 1..300),
        ) {
            let s = InstanceSpec {
                baseline_mb_s: Some(base),
                maximum_mb_s: Some(base + extra),
                time_scale: 1e6,
                ..Default::default()
            };
            let mut gate = InstanceModel::from_spec(&s).unwrap().gate(0);
            let ios: Vec<_> = lens.iter().map(|&l| (0, Direction::Read, l)).collect();
            let times = drive(&mut gate, ios);
            let total: f64 = lens.iter().map(|&l| l as f64).sum();
            let end = *times.last().unwrap() as f64 / S as f64;
            let max_io = *lens.iter().max().unwrap() as f64;
            let burst = (base + extra) * MB * 0.010 + (extra * MB * INSTANCE_BURST_S / 1e6);
            let bound = (base + extra) * MB * end + burst + max_io + SSD_UNIT_BYTES as f64;
            prop_assert!(total <= bound * (1.0 + 1e-9), "{total} > {bound}");
        }
    }
}
