//! Labeled scenarios for the chokepoint finder: seeded, synthetic runs in exactly the format of
//! real ones ([`Timeline`]), each carrying the answer the finder should give.
//!
//! A scenario is N nodes x M volumes in one to three roles, running a closed-loop workload
//! (fixed depth: IOPS = depth / latency, capped by the device) or an open-loop one (a target
//! rate held until the device's ceiling, then the queue grows to the worker limit). On top of
//! realistic noise (per-volume spread, autocorrelated lognormal jitter of the interval means, a
//! role-wide common mode, harmless bursts, GC spikes with long p99 tails, rare cluster-wide
//! blips of a few intervals) each kind injects one effect with a known onset:
//!
//! | kind | effect | expected verdict |
//! |---|---|---|
//! | clean | noise only | none |
//! | throttle | one volume capped at 5-45% of its rate, non-burstable model | volume, throttled |
//! | credit cliff | one small gp2 volume drains its 5.4M credits, then runs at baseline | volume, credit exhaustion |
//! | fail-slow | one device 3-12x slower, erratic | volume, fail-slow |
//! | erroring | one volume fails 0.2-5% of its IOs | volume, erroring |
//! | node limit | every volume of one node capped at 10-45% (instance limit) | node |
//! | cluster-wide | every device 2.5-10x slower | cluster-wide |
//! | harmless bursts | frequent 1-6 interval bursts and GC spikes, none persistent | none |
//! | load-generator bound | closed-loop queues at 15-50% of the configured depth | load generator |
//!
//! The slowdowns slow the device (service latency up and service rate down by the same
//! factor), so a closed-loop volume pinned at a ceiling shows them too: the label is what the
//! measurements can show, not an effect hidden behind a ceiling.
//!
//! Randomness comes from [`ScenarioRng`], a xoshiro256** generator written out here so that a
//! seed names the same scenarios whatever version of a random-number crate is in the lock file.

use serde::{Deserialize, Serialize};

use crate::analysis::chokepoint::{
    AnalysisOptions, ChokepointKind, GP2_BUCKET, GP2_BURST_IOPS, VolumeTimeScale,
};
use crate::results::timeline::{FaultWindow, Timeline, VolumeModel, VolumePoint, VolumeSeries};

/// xoshiro256** (Blackman and Vigna), seeded through splitmix64. Small, fast, and its stream for
/// a seed never changes.
#[derive(Debug, Clone)]
pub struct ScenarioRng {
    s: [u64; 4],
    spare_normal: Option<f64>,
}

impl ScenarioRng {
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        ScenarioRng {
            s: [next(), next(), next(), next()],
            spare_normal: None,
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform integer in lo..=hi.
    pub fn int(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.int(0, xs.len() - 1)]
    }

    /// Standard normal (Box-Muller, both values used).
    pub fn normal(&mut self) -> f64 {
        if let Some(z) = self.spare_normal.take() {
            return z;
        }
        let u1 = 1.0 - self.unit();
        let u2 = self.unit();
        let r = (-2.0 * u1.ln()).sqrt();
        let (s, c) = (std::f64::consts::TAU * u2).sin_cos();
        self.spare_normal = Some(r * s);
        r * c
    }

    /// exp(N(0, sigma)): a multiplicative jitter with median 1.
    pub fn lognormal(&mut self, sigma: f64) -> f64 {
        (sigma * self.normal()).exp()
    }

    /// Poisson count with the given mean (Knuth below 30, normal approximation above).
    pub fn poisson(&mut self, mean: f64) -> u64 {
        if mean <= 0.0 {
            return 0;
        }
        if mean < 30.0 {
            let limit = (-mean).exp();
            let (mut k, mut p) = (0u64, 1.0);
            loop {
                p *= self.unit();
                if p <= limit {
                    return k;
                }
                k += 1;
            }
        }
        (mean + mean.sqrt() * self.normal()).round().max(0.0) as u64
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScenarioKind {
    Clean,
    Throttle,
    CreditCliff,
    FailSlow,
    Erroring,
    NodeLimit,
    ClusterWide,
    HarmlessBursts,
    LoadGeneratorBound,
}

impl ScenarioKind {
    pub const ALL: [ScenarioKind; 9] = [
        ScenarioKind::Clean,
        ScenarioKind::Throttle,
        ScenarioKind::CreditCliff,
        ScenarioKind::FailSlow,
        ScenarioKind::Erroring,
        ScenarioKind::NodeLimit,
        ScenarioKind::ClusterWide,
        ScenarioKind::HarmlessBursts,
        ScenarioKind::LoadGeneratorBound,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ScenarioKind::Clean => "clean",
            ScenarioKind::Throttle => "throttle",
            ScenarioKind::CreditCliff => "credit-cliff",
            ScenarioKind::FailSlow => "fail-slow",
            ScenarioKind::Erroring => "erroring",
            ScenarioKind::NodeLimit => "node-limit",
            ScenarioKind::ClusterWide => "cluster-wide",
            ScenarioKind::HarmlessBursts => "harmless-bursts",
            ScenarioKind::LoadGeneratorBound => "load-generator",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadMode {
    /// Fixed depth: IOPS = outstanding / latency.
    ClosedLoop,
    /// Target rate, held until the device's ceiling.
    OpenLoop,
}

/// The shape of a scenario; [`ScenarioSpec::random`] draws a realistic one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScenarioSpec {
    pub kind: ScenarioKind,
    pub mode: LoadMode,
    pub nodes: usize,
    pub volumes_per_node: usize,
    pub roles: usize,
    pub intervals: usize,
    pub interval_ms: u64,
}

impl ScenarioSpec {
    /// 3-16 nodes, 1-6 volumes each (2 or more for a node limit), 1-3 roles, 4-12 minutes of
    /// 1 s intervals. A load-generator-bound scenario is always closed-loop (an open-loop
    /// generator's shortfall is not visible as a queue below a configured depth).
    pub fn random(kind: ScenarioKind, mode: LoadMode, rng: &mut ScenarioRng) -> Self {
        let mode = if kind == ScenarioKind::LoadGeneratorBound {
            LoadMode::ClosedLoop
        } else {
            mode
        };
        let nodes = rng.int(3, 16);
        let min_vols = if kind == ScenarioKind::NodeLimit {
            2
        } else {
            1
        };
        let volumes_per_node = rng.int(min_vols, 6);
        let roles = rng.int(1, volumes_per_node.min(3));
        ScenarioSpec {
            kind,
            mode,
            nodes,
            volumes_per_node,
            roles,
            intervals: rng.int(240, 720),
            interval_ms: 1000,
        }
    }
}

/// The answer the finder should give.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "expected", rename_all = "snake_case")]
pub enum Expected {
    None,
    Volume {
        node: String,
        volume: String,
        kind: ChokepointKind,
    },
    Node {
        node: String,
    },
    ClusterWide,
    LoadGeneratorBound,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Label {
    pub expected: Expected,
    /// First interval showing the effect (for a credit cliff, the interval the bucket emptied
    /// in, or the next one when it emptied in its second half).
    pub onset_interval: Option<usize>,
    pub onset_ms: Option<u64>,
    /// How strong the effect is, in its own terms (cap fraction, slowdown factor, error rate).
    pub severity: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scenario {
    pub spec: ScenarioSpec,
    pub label: Label,
    pub timeline: Timeline,
    /// Emulation time scale of volumes with a credit model (a real run's plan knows these).
    pub time_scales: Vec<VolumeTimeScale>,
}

impl Scenario {
    /// `base` with this scenario's time scales, as a run would configure the finder.
    pub fn options(&self, base: &AnalysisOptions) -> AnalysisOptions {
        let mut o = base.clone();
        o.time_scales.extend(self.time_scales.iter().cloned());
        o
    }
}

/// The spec and seed of scenario `i` of a suite: kinds in turn, closed- and open-loop
/// alternating per round of kinds, each scenario from its own seed so any one can be
/// regenerated alone.
pub fn suite_spec(seed: u64, i: usize) -> (ScenarioSpec, u64) {
    let kinds = ScenarioKind::ALL.len();
    let kind = ScenarioKind::ALL[i % kinds];
    let mode = if (i / kinds).is_multiple_of(2) {
        LoadMode::ClosedLoop
    } else {
        LoadMode::OpenLoop
    };
    let s =
        seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
    let mut rng = ScenarioRng::new(s);
    (ScenarioSpec::random(kind, mode, &mut rng), rng.next_u64())
}

/// `count` scenarios of all kinds (see [`suite_spec`]).
pub fn suite(seed: u64, count: usize) -> impl Iterator<Item = Scenario> {
    (0..count).map(move |i| {
        let (spec, s) = suite_spec(seed, i);
        generate(&spec, &mut ScenarioRng::new(s))
    })
}

const ROLE_NAMES: [&str; 3] = ["data", "log", "scratch"];

#[derive(Debug, Clone)]
struct RoleSim {
    name: &'static str,
    closed: bool,
    /// Closed-loop depth (iodepth x numjobs).
    depth: f64,
    /// Service latency of a healthy device, microseconds.
    lat_us: f64,
    /// Device ceiling, IOPS.
    dev_iops: f64,
    /// Open-loop target rate and worker limit.
    target: f64,
    workers: f64,
    bs: u64,
    read_mix: f64,
    model: Option<VolumeModel>,
}

impl RoleSim {
    /// What a healthy volume of this role does, IOPS: a closed loop's depth / latency up to the
    /// device's ceiling; an open loop's target, unless the worker limit holds it below (the
    /// caps of the labeled effects are fractions of this, so a label says what is visible).
    fn nominal(&self, h: f64) -> f64 {
        if self.closed {
            (self.depth / (self.lat_us * h) * 1e6).min(self.dev_iops)
        } else {
            self.open_loop(self.lat_us * h, self.dev_iops, f64::INFINITY)
                .0
        }
    }

    /// Open loop on a device with service latency `lat_us` and ceiling `dev` IOPS behind an
    /// optional token bucket `cap`: (IOPS, latency, outstanding, at a hard limit).
    ///
    /// Below the worker limit the target rate is held and latency grows with utilization
    /// (M/M/1: lat / (1 - rate / ceiling)); at the limit W IOs are in flight and throughput is
    /// W / (lat + W / ceiling), which is where the first formula meets W (continuous), so a
    /// device k times slower (lat x k, ceiling / k) shows k times the latency either way.
    fn open_loop(&self, lat_us: f64, dev: f64, cap: f64) -> (f64, f64, f64, bool) {
        let rate = self.target;
        let limit = dev.min(cap);
        if rate < 0.95 * limit {
            let lat = lat_us / (1.0 - rate / dev);
            if rate * lat / 1e6 <= self.workers {
                return (rate, lat, rate * lat / 1e6, false);
            }
        }
        let free = self.workers / (lat_us + self.workers / dev * 1e6) * 1e6;
        let iops = free.min(cap);
        (
            iops,
            self.workers / iops * 1e6,
            self.workers,
            iops < free || rate >= 0.95 * limit,
        )
    }
}

fn role_sim(i: usize, closed: bool, ebs: bool, rng: &mut ScenarioRng) -> RoleSim {
    let (dev_iops, model) = if ebs {
        (
            3000.0,
            Some(VolumeModel {
                kind: "gp3".into(),
                size_gib: rng.range(100.0, 1000.0).round(),
                ..Default::default()
            }),
        )
    } else if rng.chance(0.7) {
        (
            rng.range(20_000.0, 80_000.0),
            Some(VolumeModel {
                kind: "local".into(),
                size_gib: 1788.0,
                ..Default::default()
            }),
        )
    } else {
        (rng.range(20_000.0, 80_000.0), None)
    };
    let lat_us = if ebs {
        rng.range(400.0, 2000.0)
    } else {
        rng.range(80.0, 600.0)
    };
    let depth = *rng.pick(&[1.0, 2.0, 4.0, 8.0, 16.0, 32.0]);
    let rho = rng.range(0.2, 0.75);
    RoleSim {
        name: ROLE_NAMES[i],
        closed,
        depth,
        lat_us,
        dev_iops,
        target: (dev_iops * rho).round(),
        workers: *rng.pick(&[32.0, 64.0, 128.0, 256.0]),
        bs: *rng.pick(&[4096, 8192, 16384, 65536, 131_072]),
        read_mix: rng.range(0.0, 1.0),
        model,
    }
}

/// What is done to one volume from `from` (inclusive) to `to` (exclusive).
#[derive(Debug, Clone, Copy)]
struct Effect {
    from: usize,
    to: usize,
    /// Device slowdown: service latency x slow, service rate / slow.
    slow: f64,
    /// Extra jitter (sigma of a lognormal) of the slowdown, per interval.
    sigma: f64,
    /// IOPS cap.
    cap: f64,
    err_p: f64,
    /// Fraction of the configured depth the generator keeps in flight.
    out_mult: f64,
    /// Intermittent effects: active `on` intervals out of every `on + off` from `from` (0 off:
    /// persistent).
    on: usize,
    off: usize,
}

impl Default for Effect {
    fn default() -> Self {
        Effect {
            from: usize::MAX,
            to: usize::MAX,
            slow: 1.0,
            sigma: 0.0,
            cap: f64::INFINITY,
            err_p: 0.0,
            out_mult: 1.0,
            on: 1,
            off: 0,
        }
    }
}

#[derive(Debug, Clone)]
struct CreditSim {
    balance: f64,
    baseline: f64,
    time_scale: f64,
    empty_at: Option<usize>,
}

impl VolSim {
    /// A volume of `role` with its persistent offset `h` and the start of its AR(1) noise `ar`,
    /// untouched by any effect yet.
    fn new(role: usize, h: f64, ar: f64) -> VolSim {
        VolSim {
            role,
            h,
            ar,
            burst_left: 0,
            burst_factor: 1.0,
            cooldown: 0,
            effect: Effect::default(),
            credit: None,
        }
    }
}

#[derive(Debug, Clone)]
struct VolSim {
    role: usize,
    h: f64,
    ar: f64,
    burst_left: u32,
    burst_factor: f64,
    cooldown: u32,
    effect: Effect,
    credit: Option<CreditSim>,
}

/// Generates the scenario `spec` describes.
pub fn generate(spec: &ScenarioSpec, rng: &mut ScenarioRng) -> Scenario {
    let kind = spec.kind;
    let n = spec.intervals.max(2);
    let closed = spec.mode == LoadMode::ClosedLoop;
    let roles_n = spec.roles.clamp(1, spec.volumes_per_node.clamp(1, 3));
    // A credit cliff needs EBS peers (gp3 at 3,000 IOPS: the same ceiling the gp2 volume bursts
    // to); otherwise EBS or local devices at random.
    let ebs = kind == ScenarioKind::CreditCliff || rng.chance(0.5);
    let roles: Vec<RoleSim> = (0..roles_n)
        .map(|i| role_sim(i, closed, ebs, rng))
        .collect();

    // Noise of this run.
    let sigma = rng.range(0.04, 0.15);
    let (p_burst, p_gc) = if kind == ScenarioKind::HarmlessBursts {
        (rng.range(0.003, 0.01), rng.range(0.02, 0.05))
    } else {
        (rng.range(0.0005, 0.003), rng.range(0.002, 0.01))
    };
    let noise = Noise {
        sigma,
        phi: 0.6,
        p_burst,
        p_gc,
        p_blip: 0.002,
    };

    let mut d = Draft::new(spec, n, closed, roles, sigma, rng);
    let mut label = d.inject(kind, rng);
    simulate(
        &d.roles,
        &mut d.vols,
        &mut d.series,
        n,
        spec.interval_ms,
        &noise,
        rng,
    );
    if let Some(c) = d.vols[d.culprit].credit.as_ref() {
        label.onset_interval = c.empty_at;
        if let Some(e) = c.empty_at {
            let f = d.fault(d.culprit, "gp2_credits_empty", e, n);
            d.faults.push(f);
        }
    }
    Scenario {
        spec: spec.clone(),
        label: Label {
            expected: label.expected,
            onset_interval: label.onset_interval,
            onset_ms: label.onset_interval.map(|i| i as u64 * spec.interval_ms),
            severity: label.severity,
        },
        timeline: Timeline {
            interval_ms: spec.interval_ms,
            volumes: d.series,
            faults: d.faults,
        },
        time_scales: d.time_scales,
    }
}

/// The volumes of a scenario being generated and the faults injected into them, with one
/// method per kind of effect. Each method draws from the generator in a fixed order, so a seed
/// gives the same scenario whatever else changes.
struct Draft<'a> {
    spec: &'a ScenarioSpec,
    n: usize,
    closed: bool,
    /// Volumes per node.
    m: usize,
    roles: Vec<RoleSim>,
    vols: Vec<VolSim>,
    series: Vec<VolumeSeries>,
    /// The volume (or, for a node limit, the node of the volume) the effect is injected into.
    culprit: usize,
    faults: Vec<FaultWindow>,
    time_scales: Vec<VolumeTimeScale>,
}

/// The label of an injected effect, before the simulation sets a credit cliff's onset.
struct Injected {
    expected: Expected,
    onset_interval: Option<usize>,
    severity: f64,
}

impl<'a> Draft<'a> {
    fn new(
        spec: &'a ScenarioSpec,
        n: usize,
        closed: bool,
        roles: Vec<RoleSim>,
        sigma: f64,
        rng: &mut ScenarioRng,
    ) -> Draft<'a> {
        let roles_n = roles.len();
        let nodes = spec.nodes.max(1);
        let m = spec.volumes_per_node.max(1);
        let mut vols: Vec<VolSim> = Vec::with_capacity(nodes * m);
        let mut series: Vec<VolumeSeries> = Vec::with_capacity(nodes * m);
        for node in 0..nodes {
            for j in 0..m {
                let r = j % roles_n;
                let role = &roles[r];
                vols.push(VolSim::new(
                    r,
                    rng.lognormal(0.08).clamp(0.8, 1.25),
                    sigma * rng.normal(),
                ));
                series.push(VolumeSeries {
                    node: format!("worker-{}", node + 1),
                    volume: format!("/{}{}", role.name, j / roles_n),
                    role: role.name.to_string(),
                    model: role.model.clone(),
                    configured_depth: if closed { role.depth as u32 } else { 0 },
                    target_iops: (!closed).then_some(role.target),
                    lost_at_ms: None,
                    points: Vec::with_capacity(n),
                });
            }
        }
        let culprit = rng.int(0, vols.len() - 1);
        Draft {
            spec,
            n,
            closed,
            m,
            roles,
            vols,
            series,
            culprit,
            faults: Vec::new(),
            time_scales: Vec::new(),
        }
    }

    fn inject(&mut self, kind: ScenarioKind, rng: &mut ScenarioRng) -> Injected {
        let none = Injected {
            expected: Expected::None,
            onset_interval: None,
            severity: 0.0,
        };
        match kind {
            ScenarioKind::Clean | ScenarioKind::HarmlessBursts => none,
            ScenarioKind::Throttle => self.throttle(rng),
            ScenarioKind::CreditCliff => self.credit_cliff(rng),
            ScenarioKind::FailSlow => self.fail_slow(rng),
            ScenarioKind::Erroring => self.erroring(rng),
            ScenarioKind::NodeLimit => self.node_limit(rng),
            ScenarioKind::ClusterWide => self.cluster_wide(rng),
            ScenarioKind::LoadGeneratorBound => self.load_generator_bound(rng),
        }
    }

    fn mid_onset(&self, rng: &mut ScenarioRng) -> usize {
        rng.int(self.n / 5, self.n * 7 / 10)
    }

    fn onset(&self, rng: &mut ScenarioRng) -> usize {
        if rng.chance(0.25) {
            0
        } else {
            self.mid_onset(rng)
        }
    }

    fn end_of(&self, rng: &mut ScenarioRng, from: usize) -> usize {
        if rng.chance(0.3) {
            (from + rng.int(60, 200)).min(self.n)
        } else {
            self.n
        }
    }

    fn fault(&self, v: usize, what: &str, from: usize, to: usize) -> FaultWindow {
        let s = &self.series[v];
        FaultWindow {
            node: s.node.clone(),
            volume: s.volume.clone(),
            fault: what.into(),
            start_ms: from as u64 * self.spec.interval_ms,
            end_ms: (to < self.n).then(|| to as u64 * self.spec.interval_ms),
            detail: None,
        }
    }

    /// Injects `effect` into the culprit with a fault window, labelled as a volume verdict.
    fn on_culprit(
        &mut self,
        effect: Effect,
        fault: &str,
        kind: ChokepointKind,
        severity: f64,
    ) -> Injected {
        let v = self.culprit;
        self.vols[v].effect = effect;
        let f = self.fault(v, fault, effect.from, effect.to);
        self.faults.push(f);
        Injected {
            expected: Expected::Volume {
                node: self.series[v].node.clone(),
                volume: self.series[v].volume.clone(),
                kind,
            },
            onset_interval: Some(effect.from),
            severity,
        }
    }

    fn throttle(&mut self, rng: &mut ScenarioRng) -> Injected {
        let v = self.culprit;
        let from = self.onset(rng);
        let to = self.end_of(rng, from);
        let u = rng.range(0.05, 0.45);
        let nominal = self.roles[self.vols[v].role].nominal(self.vols[v].h);
        // A throttle after a fine period on a volume that might have credits is
        // indistinguishable from credits running out; the label keeps it honest by giving
        // a mid-run throttle a known, credit-less model.
        let series = &mut self.series[v];
        if from > 0 && series.model.as_ref().is_none_or(|m| m.kind.is_empty()) {
            series.model = Some(VolumeModel {
                kind: "io2".into(),
                size_gib: 200.0,
                provisioned_iops: Some((u * nominal) as u64),
                ..Default::default()
            });
        }
        let effect = Effect {
            from,
            to,
            cap: u * nominal,
            ..Default::default()
        };
        self.on_culprit(effect, "iops_cap", ChokepointKind::Throttled, u)
    }

    fn credit_cliff(&mut self, rng: &mut ScenarioRng) -> Injected {
        let v = self.culprit;
        let r = self.vols[v].role;
        let closed = self.closed;
        let dt = self.spec.interval_ms as f64 / 1000.0;
        // Enough demand that a small gp2 volume's baseline is well below it.
        if self.roles[r].nominal(self.vols[v].h) < 1000.0 {
            let role = &mut self.roles[r];
            if closed {
                role.depth = 8.0;
                role.lat_us = role.lat_us.min(2000.0);
            } else {
                role.target = role.target.max(rng.range(1000.0, 2400.0)).round();
            }
            for s in self.series.iter_mut().filter(|s| s.role == role.name) {
                s.configured_depth = if closed { role.depth as u32 } else { 0 };
                s.target_iops = (!closed).then_some(role.target);
            }
        }
        let demand = self.roles[r].nominal(self.vols[v].h).min(GP2_BURST_IOPS);
        let size = rng.range(34.0, demand / 7.5).round().max(34.0);
        let baseline = (3.0 * size).max(100.0);
        let target = self.mid_onset(rng).max(20);
        let time_scale = GP2_BUCKET / ((demand - baseline) * target as f64 * dt);
        self.series[v].model = Some(VolumeModel {
            kind: "gp2".into(),
            size_gib: size,
            ..Default::default()
        });
        self.vols[v].credit = Some(CreditSim {
            balance: GP2_BUCKET,
            baseline,
            time_scale,
            empty_at: None,
        });
        self.time_scales.push(VolumeTimeScale {
            node: self.series[v].node.clone(),
            volume: self.series[v].volume.clone(),
            time_scale,
        });
        Injected {
            expected: Expected::Volume {
                node: self.series[v].node.clone(),
                volume: self.series[v].volume.clone(),
                kind: ChokepointKind::CreditExhaustion,
            },
            onset_interval: None,
            severity: baseline / demand,
        }
    }

    fn fail_slow(&mut self, rng: &mut ScenarioRng) -> Injected {
        let from = self.onset(rng);
        let to = self.end_of(rng, from);
        let k = rng.range(3.0, 12.0);
        let effect = Effect {
            from,
            to,
            slow: k,
            sigma: rng.range(0.2, 0.6),
            ..Default::default()
        };
        self.on_culprit(effect, "added_latency", ChokepointKind::FailSlow, k)
    }

    fn erroring(&mut self, rng: &mut ScenarioRng) -> Injected {
        let from = self.onset(rng);
        let to = self.end_of(rng, from);
        let p = rng.range(0.002, 0.05);
        let effect = Effect {
            from,
            to,
            err_p: p,
            ..Default::default()
        };
        self.on_culprit(effect, "io_errors", ChokepointKind::Erroring, p)
    }

    fn node_limit(&mut self, rng: &mut ScenarioRng) -> Injected {
        let m = self.m;
        let node = self.culprit / m;
        let from = self.onset(rng);
        let to = self.end_of(rng, from);
        let u = rng.range(0.1, 0.45);
        for v in node * m..(node + 1) * m {
            let nominal = self.roles[self.vols[v].role].nominal(self.vols[v].h);
            self.vols[v].effect = Effect {
                from,
                to,
                cap: u * nominal,
                ..Default::default()
            };
            let f = self.fault(v, "instance_limit", from, to);
            self.faults.push(f);
        }
        Injected {
            expected: Expected::Node {
                node: self.series[node * m].node.clone(),
            },
            onset_interval: Some(from),
            severity: u,
        }
    }

    fn cluster_wide(&mut self, rng: &mut ScenarioRng) -> Injected {
        let n = self.n;
        // Mid-run only: a slowdown of everything from the first interval has nothing to be
        // compared with.
        let from = rng.int(n / 4, n * 7 / 10);
        let k = rng.range(2.5, 10.0);
        let mut starts = Vec::with_capacity(self.vols.len());
        for vol in self.vols.iter_mut() {
            let start = from + rng.int(0, 3);
            vol.effect = Effect {
                from: start,
                to: n,
                slow: k * rng.lognormal(0.1),
                ..Default::default()
            };
            starts.push(start);
        }
        // It spreads over a few intervals: its onset is when most volumes had slowed.
        starts.sort_unstable();
        Injected {
            expected: Expected::ClusterWide,
            onset_interval: Some(starts[(starts.len() - 1) / 2]),
            severity: k,
        }
    }

    fn load_generator_bound(&mut self, rng: &mut ScenarioRng) -> Injected {
        let u = rng.range(0.15, 0.5);
        for v in self.vols.iter_mut() {
            v.effect = Effect {
                from: 0,
                to: self.n,
                out_mult: u,
                ..Default::default()
            };
        }
        Injected {
            expected: Expected::LoadGeneratorBound,
            onset_interval: None,
            severity: u,
        }
    }
}

/// What a sensitivity scenario injects (see [`SensitivitySpec`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StudyEffect {
    /// Noise only: no verdict.
    Clean,
    /// Frequent harmless bursts and GC spikes, none persistent: no verdict.
    BurstOnly,
    /// Every device slower by the spec's factor (each a little differently): cluster-wide, and
    /// never a single volume.
    ClusterWide,
    /// One volume's device slower by the factor for `duration` intervals.
    Volume,
    /// Every volume of one node slower by the factor for `duration` intervals.
    Node,
}

/// One scenario of the sensitivity study: a single role of identical volumes whose spread is
/// `cv` (the robust CV between peers in an interval: half of its variance a persistent
/// per-volume offset, half autocorrelated jitter), and one effect of a known size and length.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SensitivitySpec {
    pub effect: StudyEffect,
    pub mode: LoadMode,
    /// Device slowdown (service latency x factor, service rate / factor).
    pub factor: f64,
    pub cv: f64,
    /// Intervals from the first slow one to the last.
    pub duration: usize,
    /// Periodically slow: 4 intervals slow, 2 normal, over the duration.
    pub intermittent: bool,
    pub nodes: usize,
    pub volumes_per_node: usize,
    pub intervals: usize,
}

/// Generates a sensitivity scenario. Deterministic for a seed; bursts and GC spikes at the
/// rare rates of a quiet run (a burst-only scenario: the frequent ones of harmless bursts).
pub fn generate_sensitivity(spec: &SensitivitySpec, rng: &mut ScenarioRng) -> Scenario {
    let n = spec.intervals.max(2);
    let closed = spec.mode == LoadMode::ClosedLoop;
    let role = role_sim(0, closed, rng.chance(0.5), rng);
    let nodes = spec.nodes.max(1);
    let m = spec.volumes_per_node.max(1);
    let cv = spec.cv.max(0.0);
    let (offset_sigma, jitter_sigma) = (cv * 0.5f64.sqrt(), cv * 0.5f64.sqrt());
    let mut vols = Vec::with_capacity(nodes * m);
    let mut series = Vec::with_capacity(nodes * m);
    for node in 0..nodes {
        for j in 0..m {
            vols.push(VolSim::new(
                0,
                rng.lognormal(offset_sigma),
                jitter_sigma * rng.normal(),
            ));
            series.push(VolumeSeries {
                node: format!("worker-{}", node + 1),
                volume: format!("/{}{j}", role.name),
                role: role.name.to_string(),
                model: role.model.clone(),
                configured_depth: if closed { role.depth as u32 } else { 0 },
                target_iops: (!closed).then_some(role.target),
                lost_at_ms: None,
                points: Vec::with_capacity(n),
            });
        }
    }
    let duration = spec.duration.clamp(1, n / 2);
    let from = rng.int(n / 4, n - duration - n / 8);
    let slow = Effect {
        from,
        to: from + duration,
        slow: spec.factor,
        on: 4,
        off: if spec.intermittent { 2 } else { 0 },
        ..Default::default()
    };
    let culprit = rng.int(0, vols.len() - 1);
    let (expected, onset_interval) = match spec.effect {
        StudyEffect::Clean | StudyEffect::BurstOnly => (Expected::None, None),
        StudyEffect::ClusterWide => {
            for vol in vols.iter_mut() {
                vol.effect = Effect {
                    from: from + rng.int(0, 3),
                    to: n,
                    slow: spec.factor * rng.lognormal(cv.max(0.02)),
                    ..Default::default()
                };
            }
            (Expected::ClusterWide, Some(from))
        }
        StudyEffect::Volume => {
            vols[culprit].effect = slow;
            let e = Expected::Volume {
                node: series[culprit].node.clone(),
                volume: series[culprit].volume.clone(),
                kind: ChokepointKind::FailSlow,
            };
            (e, Some(from))
        }
        StudyEffect::Node => {
            let node = culprit / m;
            for vol in &mut vols[node * m..(node + 1) * m] {
                vol.effect = slow;
            }
            let e = Expected::Node {
                node: series[node * m].node.clone(),
            };
            (e, Some(from))
        }
    };
    let (p_burst, p_gc) = if spec.effect == StudyEffect::BurstOnly {
        (rng.range(0.003, 0.01), rng.range(0.02, 0.05))
    } else {
        (0.0005, 0.002)
    };
    let noise = Noise {
        sigma: jitter_sigma,
        phi: 0.6,
        p_burst,
        p_gc,
        p_blip: 0.002,
    };
    simulate(&[role], &mut vols, &mut series, n, 1000, &noise, rng);
    Scenario {
        spec: ScenarioSpec {
            kind: match spec.effect {
                StudyEffect::Clean => ScenarioKind::Clean,
                StudyEffect::BurstOnly => ScenarioKind::HarmlessBursts,
                StudyEffect::ClusterWide => ScenarioKind::ClusterWide,
                StudyEffect::Volume => ScenarioKind::FailSlow,
                StudyEffect::Node => ScenarioKind::NodeLimit,
            },
            mode: spec.mode,
            nodes,
            volumes_per_node: m,
            roles: 1,
            intervals: n,
            interval_ms: 1000,
        },
        label: Label {
            expected,
            onset_interval,
            onset_ms: onset_interval.map(|i| i as u64 * 1000),
            severity: spec.factor,
        },
        timeline: Timeline {
            interval_ms: 1000,
            volumes: series,
            faults: Vec::new(),
        },
        time_scales: Vec::new(),
    }
}

/// The noise of a run: per-interval jitter (sigma of the lognormal of an interval's mean, and
/// its autocorrelation), harmless bursts and GC spikes per volume and interval, and the chance
/// of a cluster-wide blip of 1-3 intervals per interval.
#[derive(Debug, Clone, Copy)]
struct Noise {
    sigma: f64,
    phi: f64,
    p_burst: f64,
    p_gc: f64,
    p_blip: f64,
}

/// Runs the volumes for `n` intervals, appending their points to `series`.
fn simulate(
    roles: &[RoleSim],
    vols: &mut [VolSim],
    series: &mut [VolumeSeries],
    n: usize,
    interval_ms: u64,
    noise: &Noise,
    rng: &mut ScenarioRng,
) {
    let dt = interval_ms as f64 / 1000.0;
    let mut common = vec![0.0f64; roles.len()];
    let mut blip_left = 0u32;
    let mut blip_factor = 1.0;
    for k in 0..n {
        for c in common.iter_mut() {
            *c = 0.5 * *c + 0.03 * rng.normal();
        }
        if blip_left == 0 && rng.chance(noise.p_blip) {
            blip_left = rng.int(1, 3) as u32;
            blip_factor = rng.range(1.5, 3.0);
        }
        let blip = if blip_left > 0 {
            blip_left -= 1;
            blip_factor
        } else {
            1.0
        };
        for (v, vol) in vols.iter_mut().enumerate() {
            let role = &roles[vol.role];
            let mut p = simulate_point(
                role,
                vol,
                k,
                dt,
                interval_ms,
                common[vol.role],
                blip,
                noise.sigma,
                noise.phi,
                noise.p_burst,
                noise.p_gc,
                rng,
            );
            // Measured lengths are a few ms off the interval (an agent closes one when it sees
            // the tick), while the point keeps its place on the clock (t_ms), as the merger
            // puts it. Deterministic, so the random draws of every scenario stay the same.
            let step = (interval_ms / 1000).max(1) as i64;
            let off = ((k * 31 + v * 17) % 9) as i64 - 4;
            p.len_ms = (interval_ms as i64 + off * step).max(1) as u64;
            series[v].points.push(p);
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn simulate_point(
    role: &RoleSim,
    vol: &mut VolSim,
    k: usize,
    dt: f64,
    interval_ms: u64,
    common: f64,
    blip: f64,
    sigma: f64,
    phi: f64,
    p_burst: f64,
    p_gc: f64,
    rng: &mut ScenarioRng,
) -> VolumePoint {
    // Autocorrelated jitter of the interval mean (stationary sigma).
    vol.ar = phi * vol.ar + (1.0 - phi * phi).sqrt() * sigma * rng.normal();
    // Harmless bursts: a few slow intervals, then at least 20 quiet ones.
    if vol.burst_left == 0 {
        if vol.cooldown > 0 {
            vol.cooldown -= 1;
        } else if rng.chance(p_burst) {
            vol.burst_left = rng.int(1, 6) as u32;
            vol.burst_factor = rng.range(3.0, 30.0);
            vol.cooldown = 20;
        }
    }
    let burst = if vol.burst_left > 0 {
        vol.burst_left -= 1;
        vol.burst_factor
    } else {
        1.0
    };
    let gc = rng.chance(p_gc);
    let e = vol.effect;
    let active = k >= e.from && k < e.to && (e.off == 0 || (k - e.from) % (e.on + e.off) < e.on);
    let mut slow = burst * blip * if gc { rng.range(1.3, 2.0) } else { 1.0 };
    let mut cap = f64::INFINITY;
    let mut out_mult = 1.0;
    let mut err_p = 0.0;
    if active {
        slow *= e.slow
            * if e.sigma > 0.0 {
                rng.lognormal(e.sigma)
            } else {
                1.0
            };
        cap = e.cap;
        out_mult = e.out_mult;
        err_p = e.err_p;
    }
    let noise = (vol.ar + common).exp();
    let lat_service = role.lat_us * vol.h * noise * slow;
    let dev = role.dev_iops / slow;

    let compute = |cap: f64, rng: &mut ScenarioRng| -> (f64, f64, f64, bool) {
        if role.closed {
            let ceiling = dev.min(cap * (1.0 + 0.005 * rng.normal()));
            let q = role.depth * out_mult * rng.range(0.97, 1.0);
            let free = q / lat_service * 1e6;
            if free > ceiling {
                (ceiling, q / ceiling * 1e6, q, true)
            } else {
                (free, lat_service, q, false)
            }
        } else {
            let (iops, lat, out, pinned) =
                role.open_loop(lat_service, dev, cap * (1.0 + 0.005 * rng.normal()));
            if out < role.workers {
                // Holding the target rate: arrivals are Poisson.
                let noisy = iops * (1.0 + rng.normal() / (iops * dt).max(1.0).sqrt());
                (noisy, lat, noisy * lat / 1e6, false)
            } else {
                (iops, lat, out, pinned)
            }
        }
    };
    // A gp2 volume bursts to 3,000 IOPS while its bucket lasts, then runs at its baseline.
    let mut result;
    if let Some(c) = vol.credit.as_mut() {
        if c.balance > 0.0 {
            result = compute(cap.min(GP2_BURST_IOPS), rng);
            let net = (result.0 - c.baseline) * c.time_scale * dt;
            if net > c.balance {
                let f = c.balance / net;
                let blended = f * result.0 + (1.0 - f) * c.baseline;
                result = compute(cap.min(blended), rng);
                c.balance = 0.0;
                c.empty_at = Some(if f < 0.5 { k } else { k + 1 });
            } else {
                c.balance -= net;
            }
        } else {
            result = compute(cap.min(c.baseline), rng);
        }
    } else {
        result = compute(cap, rng);
    }
    let (iops, lat, out, pinned) = result;

    let total = (iops * dt).round().max(0.0) as u64;
    let errors = rng.poisson(total as f64 * err_p).min(total);
    let ok = total - errors;
    let reads = (ok as f64 * role.read_mix).round() as u64;
    let ios = [reads, ok - reads];
    let lat = if ok > 0 { lat } else { 0.0 };
    // A queue at a token bucket has a short tail; a device's tail is long, and a GC pause
    // stretches it further.
    let tail = if pinned {
        rng.range(1.2, 1.8)
    } else {
        4.0 * rng.lognormal(0.25)
    };
    let p99 = lat * tail * if gc { rng.range(5.0, 20.0) } else { 1.0 };
    VolumePoint {
        t_ms: (k as u64 + 1) * interval_ms,
        len_ms: interval_ms,
        ios,
        bytes: [ios[0] * role.bs, ios[1] * role.bs],
        errors: [0, errors],
        outstanding: out * (1.0 + 0.01 * rng.normal()).max(0.0),
        lat_mean_us: lat,
        lat_p50_us: lat * rng.range(0.6, 0.85),
        lat_p99_us: p99,
        lat_max_us: p99 * 2.0 * rng.lognormal(0.3),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_deterministic_and_roughly_uniform() {
        let mut a = ScenarioRng::new(7);
        let mut b = ScenarioRng::new(7);
        let xs: Vec<u64> = (0..100).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..100).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(ScenarioRng::new(8).next_u64(), xs[0]);
        let mut r = ScenarioRng::new(1);
        let mean = (0..100_000).map(|_| r.unit()).sum::<f64>() / 100_000.0;
        assert!((mean - 0.5).abs() < 0.01, "{mean}");
        let z: Vec<f64> = (0..100_000).map(|_| r.normal()).collect();
        let m = z.iter().sum::<f64>() / z.len() as f64;
        let var = z.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / z.len() as f64;
        assert!(m.abs() < 0.02 && (var - 1.0).abs() < 0.03, "{m} {var}");
        let p = (0..20_000).map(|_| r.poisson(4.0)).sum::<u64>() as f64 / 20_000.0;
        assert!((p - 4.0).abs() < 0.1, "{p}");
    }

    #[test]
    fn scenarios_are_deterministic_and_well_formed() {
        for i in 0..ScenarioKind::ALL.len() * 2 {
            let (spec, seed) = suite_spec(3, i);
            let a = generate(&spec, &mut ScenarioRng::new(seed));
            let b = generate(&spec, &mut ScenarioRng::new(seed));
            assert_eq!(a, b);
            let t = &a.timeline;
            assert_eq!(t.volumes.len(), spec.nodes * spec.volumes_per_node);
            for s in &t.volumes {
                assert_eq!(s.points.len(), spec.intervals);
                for (k, p) in s.points.iter().enumerate() {
                    assert_eq!(p.t_ms, (k as u64 + 1) * spec.interval_ms);
                    assert!(p.len_ms.abs_diff(spec.interval_ms) * 200 <= spec.interval_ms);
                    assert!(p.lat_mean_us.is_finite() && p.outstanding >= 0.0);
                }
            }
            match &a.label.expected {
                Expected::Volume { node, volume, .. } => {
                    assert!(
                        t.volumes
                            .iter()
                            .any(|s| &s.node == node && &s.volume == volume)
                    );
                    assert!(a.label.onset_interval.is_some());
                }
                Expected::Node { node } => {
                    assert!(t.volumes.iter().filter(|s| &s.node == node).count() >= 2)
                }
                _ => {}
            }
        }
    }

    #[test]
    fn closed_loop_obeys_littles_law_and_a_throttle_pins_iops() {
        let spec = ScenarioSpec {
            kind: ScenarioKind::Throttle,
            mode: LoadMode::ClosedLoop,
            nodes: 4,
            volumes_per_node: 1,
            roles: 1,
            intervals: 300,
            interval_ms: 1000,
        };
        let sc = generate(&spec, &mut ScenarioRng::new(11));
        let Expected::Volume { node, .. } = &sc.label.expected else {
            panic!()
        };
        let onset = sc.label.onset_interval.unwrap();
        let s = sc
            .timeline
            .volumes
            .iter()
            .find(|s| &s.node == node)
            .unwrap();
        for p in &s.points[onset + 1..onset + 30] {
            // outstanding = IOPS x latency, within the noise of the figures.
            let little = p.iops() * p.lat_mean_us / 1e6;
            assert!(
                (little / p.outstanding - 1.0).abs() < 0.1,
                "{little} vs {}",
                p.outstanding
            );
        }
        let after: Vec<f64> = s.points[onset + 1..].iter().map(|p| p.iops()).collect();
        let (lo, hi) = after
            .iter()
            .fold((f64::MAX, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)));
        assert!(hi / lo < 1.1, "pinned IOPS vary {lo}..{hi}");
    }

    #[test]
    fn credit_cliff_onset_is_where_the_bucket_empties() {
        let spec = ScenarioSpec {
            kind: ScenarioKind::CreditCliff,
            mode: LoadMode::ClosedLoop,
            nodes: 6,
            volumes_per_node: 2,
            roles: 1,
            intervals: 400,
            interval_ms: 1000,
        };
        let sc = generate(&spec, &mut ScenarioRng::new(5));
        let Expected::Volume { node, volume, .. } = &sc.label.expected else {
            panic!()
        };
        let onset = sc
            .label
            .onset_interval
            .expect("the bucket empties within the run");
        let s = sc
            .timeline
            .volumes
            .iter()
            .find(|s| &s.node == node && &s.volume == volume)
            .unwrap();
        let m = s.model.as_ref().unwrap();
        let baseline = 3.0 * m.size_gib;
        assert!(s.points[onset - 2].iops() > 2.0 * baseline);
        assert!((s.points[onset + 2].iops() / baseline - 1.0).abs() < 0.05);
    }
}
