//! Prometheus metrics of a running coordinator (`lockstep run --metrics-listen ADDR`): the run's
//! state, cluster IOPS, throughput and p99 of the latest complete interval, and each volume's,
//! so a dashboard can follow a long run. Updated by the run loop once per interval.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::results::merge::Merger;
use crate::results::timeline::FaultWindow;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VolumeLabels {
    pub node: String,
    pub volume: String,
}

/// A fault on a volume, as the agent names it (`latency`, `ebs`, `pause`, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FaultLabels {
    pub node: String,
    pub volume: String,
    pub fault: String,
}

type FGauge = Gauge<f64, AtomicU64>;

pub struct CoordinatorMetrics {
    registry: Registry,
    /// 0 preparing, 1 running, 2 finished.
    pub state: Gauge,
    cluster_iops: FGauge,
    cluster_bytes: FGauge,
    cluster_p99: FGauge,
    volume_iops: Family<VolumeLabels, FGauge>,
    volume_p99: Family<VolumeLabels, FGauge>,
    lost_volumes: Gauge,
    /// 1 while a fault's window is open on a volume, 0 once it closed: a dashboard shades or
    /// annotates the window from it.
    fault_active: Family<FaultLabels, Gauge>,
}

impl Default for CoordinatorMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("lockstep");
        let m = CoordinatorMetrics {
            registry: Registry::default(),
            state: Gauge::default(),
            cluster_iops: FGauge::default(),
            cluster_bytes: FGauge::default(),
            cluster_p99: FGauge::default(),
            volume_iops: Family::default(),
            volume_p99: Family::default(),
            lost_volumes: Gauge::default(),
            fault_active: Family::default(),
        };
        registry.register(
            "run_state",
            "0 preparing, 1 running, 2 finished",
            m.state.clone(),
        );
        registry.register(
            "cluster_iops",
            "Cluster IOPS in the latest complete interval",
            m.cluster_iops.clone(),
        );
        registry.register(
            "cluster_bytes_per_second",
            "Cluster throughput in the latest complete interval",
            m.cluster_bytes.clone(),
        );
        registry.register(
            "cluster_latency_p99_seconds",
            "Cluster p99 latency (merged histograms) in the latest complete interval",
            m.cluster_p99.clone(),
        );
        registry.register(
            "volume_iops",
            "Volume IOPS in its latest interval",
            m.volume_iops.clone(),
        );
        registry.register(
            "volume_latency_p99_seconds",
            "Volume p99 latency in its latest interval",
            m.volume_p99.clone(),
        );
        registry.register(
            "lost_volumes",
            "Volumes whose agent was lost",
            m.lost_volumes.clone(),
        );
        registry.register(
            "fault_active",
            "1 while the fault's window is open on the volume, 0 after it closed",
            m.fault_active.clone(),
        );
        CoordinatorMetrics { registry, ..m }
    }
}

impl CoordinatorMetrics {
    pub fn update(&self, merger: &Merger) {
        self.state.set(1);
        if let Some(c) = merger
            .latest_index()
            .and_then(|i| merger.cluster_point(i.saturating_sub(1)))
        {
            self.cluster_iops.set(c.iops);
            self.cluster_bytes.set(c.bytes_per_sec);
            self.cluster_p99.set(c.lat_p99_us / 1e6);
        }
        let mut lost = 0;
        for (s, last) in merger.latest() {
            if s.lost_at_ms.is_some() {
                lost += 1;
            }
            if let Some(p) = last {
                let l = VolumeLabels {
                    node: s.node.clone(),
                    volume: s.volume.clone(),
                };
                self.volume_iops.get_or_create(&l).set(p.iops());
                self.volume_p99.get_or_create(&l).set(p.lat_p99_us / 1e6);
            }
        }
        self.lost_volumes.set(lost);
    }
}

impl CoordinatorMetrics {
    /// The fault windows at `now_ms` (since the synchronized start): 1 for the open ones, 0 for
    /// the others.
    pub fn set_faults_at(&self, faults: &[FaultWindow], now_ms: u64) {
        for f in faults {
            let l = FaultLabels {
                node: f.node.clone(),
                volume: f.volume.clone(),
                fault: f.fault.clone(),
            };
            self.fault_active.get_or_create(&l).set(i64::from(
                f.start_ms <= now_ms && f.end_ms.is_none_or(|e| now_ms < e),
            ));
        }
    }
}

impl lockstep_core::metrics::RenderMetrics for CoordinatorMetrics {
    fn render(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_core::metrics::RenderMetrics;

    #[test]
    fn renders_the_run_figures() {
        let m = CoordinatorMetrics::default();
        let merger = Merger::new(1000, &[]);
        m.update(&merger);
        let text = m.render();
        assert!(text.contains("lockstep_run_state 1"), "{text}");
        assert!(text.contains("lockstep_cluster_iops"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn a_fault_is_active_while_its_window_is_open() {
        let m = CoordinatorMetrics::default();
        let mut w = FaultWindow {
            node: "agent-2".into(),
            volume: "data".into(),
            fault: "latency".into(),
            start_ms: 3000,
            end_ms: None,
            detail: None,
        };
        let open = r#"lockstep_fault_active{node="agent-2",volume="data",fault="latency"} 1"#;
        let closed = open.replace("} 1", "} 0");
        m.set_faults_at(std::slice::from_ref(&w), 2999);
        assert!(m.render().contains(&closed), "{}", m.render());
        m.set_faults_at(std::slice::from_ref(&w), 3000);
        assert!(m.render().contains(open), "{}", m.render());
        w.end_ms = Some(9000);
        m.set_faults_at(std::slice::from_ref(&w), 8999);
        assert!(m.render().contains(open), "{}", m.render());
        m.set_faults_at(&[w], 9000);
        assert!(m.render().contains(&closed), "{}", m.render());
    }
}
