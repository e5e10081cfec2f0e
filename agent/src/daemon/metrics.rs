//! Prometheus metrics of the agent (`GET /metrics`, text exposition format).
//!
//! Updated once per interval from the same merged interval histograms the coordinator receives,
//! so the hot IO path pays nothing for them. Latency buckets are exponential from 1 µs to about
//! 17 s (factor 2), the range storage latencies live in.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::volume::VolumeConfig;
use lockstep_proto::v1::VolumeInterval;

use crate::stats::DirStats;
pub use lockstep_core::metrics::{RenderMetrics, serve};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirLabels {
    pub volume: String,
    pub direction: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VolumeLabels {
    pub volume: String,
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-6, 2.0, 25))
}

pub struct Metrics {
    pub registry: Registry,
    ios: Family<DirLabels, Counter>,
    bytes: Family<DirLabels, Counter>,
    errors: Family<DirLabels, Counter>,
    latency: Family<DirLabels, Histogram, fn() -> Histogram>,
    outstanding: Family<VolumeLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// 0 idle, 1 prepared, 2 running.
    state: Gauge,
    /// The agent's volume names, to reset their gauges when a run ends.
    volumes: Vec<String>,
}

impl Metrics {
    pub fn new(volumes: &[VolumeConfig]) -> Self {
        let mut registry = Registry::with_prefix("lockstep_agent");
        let ios = Family::<DirLabels, Counter>::default();
        let bytes = Family::<DirLabels, Counter>::default();
        let errors = Family::<DirLabels, Counter>::default();
        let latency = Family::<DirLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let outstanding =
            Family::<VolumeLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        let state = Gauge::default();
        registry.register(
            "volume_ios",
            "IOs completed per volume and direction",
            ios.clone(),
        );
        registry.register(
            "volume_bytes",
            "Bytes transferred per volume and direction",
            bytes.clone(),
        );
        registry.register(
            "volume_errors",
            "IOs that failed per volume and direction",
            errors.clone(),
        );
        registry.register(
            "volume_latency_seconds",
            "IO latency per volume and direction (from the intended issue time in rate mode)",
            latency.clone(),
        );
        registry.register(
            "volume_outstanding_ios",
            "Time-averaged IOs in flight in the last interval",
            outstanding.clone(),
        );
        registry.register("run_state", "0 idle, 1 prepared, 2 running", state.clone());
        // Make every volume visible from the start, with zeros.
        for v in volumes {
            for d in ["read", "write"] {
                let l = DirLabels {
                    volume: v.name.clone(),
                    direction: d.into(),
                };
                let _ = ios.get_or_create(&l);
                let _ = bytes.get_or_create(&l);
                let _ = errors.get_or_create(&l);
            }
            let _ = outstanding.get_or_create(&VolumeLabels {
                volume: v.name.clone(),
            });
        }
        Metrics {
            registry,
            ios,
            bytes,
            errors,
            latency,
            outstanding,
            state,
            volumes: volumes.iter().map(|v| v.name.clone()).collect(),
        }
    }

    pub fn set_state(&self, s: i64) {
        self.state.set(s);
    }

    /// A run ended (finished, aborted or lost its coordinator): nothing is in flight any more.
    /// The gauge holds the last interval's figure otherwise, and a dashboard would show a busy
    /// volume on an idle agent.
    pub fn run_ended(&self) {
        self.set_state(0);
        for g in self.volumes.iter().map(|v| {
            self.outstanding
                .get_or_create(&VolumeLabels { volume: v.clone() })
        }) {
            g.set(0.0);
        }
    }

    pub fn observe_interval(&self, volume: &str, iv: &VolumeInterval, dirs: &[DirStats; 2]) {
        for (i, name) in ["read", "write"].iter().enumerate() {
            let d = &dirs[i];
            let l = DirLabels {
                volume: volume.into(),
                direction: (*name).into(),
            };
            self.ios.get_or_create(&l).inc_by(d.ios);
            self.bytes.get_or_create(&l).inc_by(d.bytes);
            self.errors.get_or_create(&l).inc_by(d.errors);
            let h = self.latency.get_or_create(&l);
            let src = d
                .lat_intended
                .as_ref()
                .filter(|h| !h.is_empty())
                .unwrap_or(&d.lat);
            for v in src.iter_recorded() {
                let secs = v.value_iterated_to() as f64 / 1e9;
                for _ in 0..v.count_at_value() {
                    h.observe(secs);
                }
            }
        }
        self.outstanding
            .get_or_create(&VolumeLabels {
                volume: volume.into(),
            })
            .set(iv.outstanding);
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl RenderMetrics for Metrics {
    fn render(&self) -> String {
        Metrics::render(self)
    }
}
