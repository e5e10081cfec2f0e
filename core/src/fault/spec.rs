//! `FaultSpec`: what a plan's fault schedule says, as it travels (JSON in the protocol, TOML in
//! plans), and its validation.
//!
//! Shape: a flat object internally tagged by `kind`, with the common window fields `at_ms` and
//! `duration_ms` beside the kind's own fields, e.g.
//! `{"kind":"ebs","at_ms":0,"volume_type":"gp2","size_gib":60,"time_scale":60.0}`.
//! Unknown fields are refused (a typo such as `fration` must not silently become "no fault"),
//! the same rule lockstep applies to fio options.

use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::job::Direction;

const NS_PER_MS: u64 = 1_000_000;

/// One fault on a schedule: active in `[at_ms, at_ms + duration_ms)` of the run, or from `at_ms`
/// to the end when `duration_ms` is absent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultSpec {
    /// Start, in milliseconds from the start of the run (the clone's origin).
    #[serde(default)]
    pub at_ms: u64,
    /// Length of the window; `None` means until the end of the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    #[serde(flatten)]
    pub kind: FaultKind,
}

/// What the fault does. Gates (`iops_cap`, `bw_cap`, `ebs`) pace IOs; the others alter them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FaultKind {
    IopsCap(IopsCapSpec),
    BwCap(BwCapSpec),
    Ebs(EbsSpec),
    Instance(InstanceSpec),
    Latency(LatencySpec),
    Eio(EioSpec),
    Stall(StallSpec),
    DropWrites(DropWritesSpec),
    KernelThrottle(KernelThrottleSpec),
    Kill(KillSpec),
    Pause(PauseSpec),
    CutOff(CutOffSpec),
    Exec(ExecSpec),
}

/// The agent kills itself (SIGKILL) at `at`: a crashed host or process. Nothing is flushed,
/// no final result is sent; the coordinator sees the agent disappear. Agent-wide: every volume
/// of the agent stops. Never comes back by itself (a supervisor such as systemd may restart it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KillSpec {}

/// The whole agent process is stopped (SIGSTOP) for the window and continued (SIGCONT) at its
/// end, like `docker pause` or a VM freeze: no IO is issued or reaped, nothing is reported, the
/// open-loop schedule falls behind and catches up after. Agent-wide.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PauseSpec {}

/// The agent is cut off from its coordinators for the window: its event streams break and every
/// call is refused, while its IO goes on (a network partition between the coordinator and a
/// host whose storage is local). Events are kept and replayed when a coordinator re-attaches.
/// Agent-wide.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CutOffSpec {}

/// A command run on the agent's host (`sh -c`) when the window opens, and optionally another when
/// it closes (`mdadm --fail`, a cloud API call, `systemctl stop ...`). Only on an agent started
/// with `--allow-exec`; refused before the run otherwise. Agent-wide: once per agent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecSpec {
    pub start: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
    /// A command still running after this long is killed (default 60 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// IOs per second, like cgroup v2 `io.max` `riops`/`wiops` (every IO counts 1 whatever its size),
/// plus an optional cap on the sum of both directions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IopsCapSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<u64>,
}

/// Bytes per second, like cgroup v2 `io.max` `rbps`/`wbps`, plus an optional cap on the sum.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BwCapSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_bytes_per_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_bytes_per_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_bytes_per_s: Option<u64>,
}

/// An EBS volume type, as AWS names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VolumeType {
    Gp2,
    Gp3,
    Io1,
    Io2,
    St1,
    Sc1,
}

impl VolumeType {
    pub fn name(self) -> &'static str {
        match self {
            VolumeType::Gp2 => "gp2",
            VolumeType::Gp3 => "gp3",
            VolumeType::Io1 => "io1",
            VolumeType::Io2 => "io2",
            VolumeType::St1 => "st1",
            VolumeType::Sc1 => "sc1",
        }
    }

    /// The type a volume's `kind` names ("gp2", "GP2"), or `None` for `local` and unknown kinds.
    pub fn parse(kind: &str) -> Option<VolumeType> {
        let kind = kind.to_ascii_lowercase();
        [
            VolumeType::Gp2,
            VolumeType::Gp3,
            VolumeType::Io1,
            VolumeType::Io2,
            VolumeType::St1,
            VolumeType::Sc1,
        ]
        .into_iter()
        .find(|t| t.name() == kind)
    }
}

/// An emulated EBS volume (see `ebs::EbsModel` for the numbers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EbsSpec {
    pub volume_type: VolumeType,
    pub size_gib: u64,
    /// Required for io1/io2; optional for gp3 (default 3,000); refused for gp2/st1/sc1, whose
    /// performance follows from the size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioned_iops: Option<u64>,
    /// gp3 only (default 125 MiB/s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioned_mib_s: Option<u64>,
    /// Credit buckets drain and refill this many times faster than on AWS, so a 30-minute drain
    /// shows in 30 s at 60; IOPS and throughput ceilings stay real.
    #[serde(default = "one")]
    pub time_scale: f64,
    /// Credit balance at the window's start, 0..=1; `None` is a full bucket (as a new volume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_credit_fraction: Option<f64>,
}

fn one() -> f64 {
    1.0
}

/// An EC2 instance's EBS limits, shared by all the volumes of the agent it targets (see
/// `instance::InstanceModel`): a known `type`, or explicit baseline figures with an optional
/// maximum (a burst for 30 minutes, time-scaled).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceSpec {
    /// An instance type of `instance::INSTANCE_TYPES`, e.g. "r4.8xlarge".
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<String>,
    /// MB/s (10^6 bytes) the instance sustains across its volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline_mb_s: Option<f64>,
    /// IOPS the instance sustains across its volumes (one per started 256 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline_iops: Option<u64>,
    /// MB/s while the burst lasts (default: the baseline, no burst).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maximum_mb_s: Option<f64>,
    /// IOPS while the burst lasts (default: the baseline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maximum_iops: Option<u64>,
    /// The burst bucket drains and refills this many times faster than on AWS.
    #[serde(default = "one")]
    pub time_scale: f64,
}

impl Default for InstanceSpec {
    fn default() -> Self {
        InstanceSpec {
            instance_type: None,
            baseline_mb_s: None,
            baseline_iops: None,
            maximum_mb_s: None,
            maximum_iops: None,
            time_scale: 1.0,
        }
    }
}

/// Which IOs a fault may touch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Directions {
    #[default]
    Both,
    Read,
    Write,
}

impl Directions {
    pub fn matches(self, dir: Direction) -> bool {
        match self {
            Directions::Both => true,
            Directions::Read => dir == Direction::Read,
            Directions::Write => dir == Direction::Write,
        }
    }
}

/// Added latency: a fixed `add_us` or a `distribution` (exactly one), on a `fraction` of the IOs
/// of `direction`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LatencySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_us: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distribution: Option<LatencyDistribution>,
    /// Share of matching IOs delayed, 0..=1 (default 1: all of them).
    #[serde(default = "one")]
    pub fraction: f64,
    #[serde(default)]
    pub direction: Directions,
}

/// How an added delay is drawn, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum LatencyDistribution {
    Uniform { min_us: u64, max_us: u64 },
    Exponential { mean_us: u64 },
}

/// IO errors: a `fraction` of the IOs of `direction` complete at once with EIO.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EioSpec {
    pub fraction: f64,
    #[serde(default)]
    pub direction: Directions,
}

/// No completions are delivered during the window (they are held until it ends).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StallSpec {}

/// A `fraction` of writes are acknowledged but never written: the verifier must catch them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DropWritesSpec {
    pub fraction: f64,
}

/// The kernel's own throttle on the volume's block device (cgroup v2 `io.max`, or cgroup v1
/// `blkio.throttle.*_device`), applied to the agent's IO threads: needs root and a cgroup io
/// controller, refused before the run otherwise (see `kernel`). Limits as the kernel takes them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelThrottleSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub riops: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wiops: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rbps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wbps: Option<u64>,
}

/// A half-open interval `[start_ns, end_ns)` of ns since the origin; `end_ns == u64::MAX` is
/// "until the end of the run".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub start_ns: u64,
    pub end_ns: u64,
}

impl Window {
    pub const ALWAYS: Window = Window {
        start_ns: 0,
        end_ns: u64::MAX,
    };

    pub fn contains(&self, t_ns: u64) -> bool {
        self.start_ns <= t_ns && t_ns < self.end_ns
    }

    pub fn is_open_ended(&self) -> bool {
        self.end_ns == u64::MAX
    }
}

impl FaultKind {
    /// The `kind` tag, as written in plans and shown on the timeline.
    pub fn name(&self) -> &'static str {
        match self {
            FaultKind::IopsCap(_) => "iops_cap",
            FaultKind::BwCap(_) => "bw_cap",
            FaultKind::Ebs(_) => "ebs",
            FaultKind::Instance(_) => "instance",
            FaultKind::Latency(_) => "latency",
            FaultKind::Eio(_) => "eio",
            FaultKind::Stall(_) => "stall",
            FaultKind::KernelThrottle(_) => "kernel_throttle",
            FaultKind::DropWrites(_) => "drop_writes",
            FaultKind::Kill(_) => "kill",
            FaultKind::Pause(_) => "pause",
            FaultKind::CutOff(_) => "cut_off",
            FaultKind::Exec(_) => "exec",
        }
    }

    /// Faults that act on the whole agent (its process, its connection, its host) rather than
    /// on one volume's IOs: done once per agent whatever volumes they target.
    pub fn is_agent_wide(&self) -> bool {
        matches!(
            self,
            FaultKind::Kill(_) | FaultKind::Pause(_) | FaultKind::CutOff(_) | FaultKind::Exec(_)
        )
    }

    /// Gates decide *when* an IO goes (`IoGate`); the rest decide *what happens* (`IoFault`).
    pub fn is_gate(&self) -> bool {
        matches!(
            self,
            FaultKind::IopsCap(_)
                | FaultKind::BwCap(_)
                | FaultKind::Ebs(_)
                | FaultKind::Instance(_)
        )
    }
}

impl FaultSpec {
    pub fn new(kind: FaultKind) -> Self {
        FaultSpec {
            at_ms: 0,
            duration_ms: None,
            kind,
        }
    }

    /// Builder-style window: from `at_ms`, for `duration_ms` (`None`: to the end).
    pub fn window_ms(mut self, at_ms: u64, duration_ms: Option<u64>) -> Self {
        self.at_ms = at_ms;
        self.duration_ms = duration_ms;
        self
    }

    pub fn name(&self) -> &'static str {
        self.kind.name()
    }

    /// The window in ns since the origin (saturating, so absurd values mean "never ends").
    pub fn window(&self) -> Window {
        let start_ns = self.at_ms.saturating_mul(NS_PER_MS);
        let end_ns = match self.duration_ms {
            Some(d) => start_ns.saturating_add(d.saturating_mul(NS_PER_MS)),
            None => u64::MAX,
        };
        Window { start_ns, end_ns }
    }

    pub fn is_active(&self, now_ns: u64) -> bool {
        self.window().contains(now_ns)
    }

    /// Checks the values a plan or a peer sent; the error names the field and the rule so the
    /// user can fix the plan. Limits are the current AWS ones (EBS user guide) so a model never
    /// emulates a volume AWS would refuse to create.
    pub fn validate(&self) -> Result<(), SpecError> {
        let kind = self.kind.name();
        let err = |field: &'static str, problem: String| SpecError {
            kind,
            field,
            problem,
        };
        if self.duration_ms == Some(0) {
            return Err(err(
                "duration_ms",
                "must be > 0 (omit it to mean until the end)".into(),
            ));
        }
        match &self.kind {
            FaultKind::IopsCap(c) => {
                if c.read.is_none() && c.write.is_none() && c.total.is_none() {
                    return Err(err("read/write/total", "at least one must be set".into()));
                }
                for (field, v) in [("read", c.read), ("write", c.write), ("total", c.total)] {
                    if v == Some(0) {
                        return Err(err(
                            field,
                            "must be > 0 IOPS (use a stall to stop IO)".into(),
                        ));
                    }
                }
            }
            FaultKind::BwCap(c) => {
                let fields = [
                    ("read_bytes_per_s", c.read_bytes_per_s),
                    ("write_bytes_per_s", c.write_bytes_per_s),
                    ("total_bytes_per_s", c.total_bytes_per_s),
                ];
                if fields.iter().all(|(_, v)| v.is_none()) {
                    return Err(err(
                        "read_bytes_per_s/write_bytes_per_s/total_bytes_per_s",
                        "at least one must be set".into(),
                    ));
                }
                for (field, v) in fields {
                    if v == Some(0) {
                        return Err(err(field, "must be > 0 (use a stall to stop IO)".into()));
                    }
                }
            }
            FaultKind::Ebs(e) => validate_ebs(e).map_err(|(field, problem)| err(field, problem))?,
            FaultKind::Instance(i) => validate_instance(i).map_err(|(f, p)| err(f, p))?,
            FaultKind::Latency(l) => {
                check_fraction(l.fraction).map_err(|p| err("fraction", p))?;
                match (l.add_us, l.distribution) {
                    (None, None) => {
                        return Err(err("add_us/distribution", "one of them must be set".into()));
                    }
                    (Some(_), Some(_)) => {
                        return Err(err(
                            "add_us/distribution",
                            "set only one: a fixed delay or a distribution".into(),
                        ));
                    }
                    (Some(0), None) => return Err(err("add_us", "must be > 0".into())),
                    (None, Some(LatencyDistribution::Uniform { min_us, max_us })) => {
                        if max_us < min_us {
                            return Err(err(
                                "distribution.max_us",
                                format!("must be >= min_us ({min_us})"),
                            ));
                        }
                    }
                    (None, Some(LatencyDistribution::Exponential { mean_us })) => {
                        if mean_us == 0 {
                            return Err(err("distribution.mean_us", "must be > 0".into()));
                        }
                    }
                    (Some(_), None) => {}
                }
            }
            FaultKind::Eio(e) => check_fraction(e.fraction).map_err(|p| err("fraction", p))?,
            FaultKind::Stall(_) => {}
            FaultKind::DropWrites(d) => {
                check_fraction(d.fraction).map_err(|p| err("fraction", p))?
            }
            FaultKind::KernelThrottle(k) => {
                let fields = [
                    ("riops", k.riops),
                    ("wiops", k.wiops),
                    ("rbps", k.rbps),
                    ("wbps", k.wbps),
                ];
                if fields.iter().all(|(_, v)| v.is_none()) {
                    return Err(err(
                        "riops/wiops/rbps/wbps",
                        "at least one must be set".into(),
                    ));
                }
                for (field, v) in fields {
                    if v == Some(0) {
                        return Err(err(field, "must be > 0 (use a stall to stop IO)".into()));
                    }
                }
            }
            FaultKind::Kill(_) => {
                if self.duration_ms.is_some() {
                    return Err(err(
                        "duration",
                        "is not allowed: a killed agent does not come back by itself (its supervisor may restart it)".into(),
                    ));
                }
            }
            FaultKind::Pause(_) | FaultKind::CutOff(_) => match self.duration_ms {
                None => {
                    return Err(err(
                        "duration",
                        "is required: the agent must come back (an open-ended pause or cut-off would leave it stopped or unreachable)".into(),
                    ));
                }
                Some(d) if d > MAX_AGENT_FAULT_MS => {
                    return Err(err("duration", format!("must be at most 1 h, got {d} ms")));
                }
                Some(_) => {}
            },
            FaultKind::Exec(e) => {
                if e.start.trim().is_empty() {
                    return Err(err("start", "must be a command".into()));
                }
                if e.end.as_ref().is_some_and(|c| c.trim().is_empty()) {
                    return Err(err("end", "must be a command (or omitted)".into()));
                }
                if e.end.is_some() && self.duration_ms.is_none() {
                    return Err(err(
                        "end",
                        "needs a duration: it runs when the window closes".into(),
                    ));
                }
                if e.timeout_ms == Some(0) {
                    return Err(err("timeout_ms", "must be > 0".into()));
                }
            }
        }
        Ok(())
    }
}

/// Longest pause or cut-off a plan may ask for.
const MAX_AGENT_FAULT_MS: u64 = 3_600_000;

fn check_fraction(f: f64) -> Result<(), String> {
    if f.is_finite() && (0.0..=1.0).contains(&f) {
        Ok(())
    } else {
        Err(format!("must be between 0 and 1, got {f}"))
    }
}

/// AWS limits for volume creation (EBS user guide, checked 2025/2026): gp3 up to 80,000 IOPS
/// (500 per GiB) and 2,000 MiB/s (0.25 MiB/s per IOPS); io1 100..=64,000 IOPS at most 50 per
/// GiB; io2 Block Express 100..=256,000 IOPS at most 1,000 per GiB.
fn validate_ebs(e: &EbsSpec) -> Result<(), (&'static str, String)> {
    if e.size_gib == 0 {
        return Err(("size_gib", "must be > 0".into()));
    }
    if e.size_gib > 65_536 {
        return Err((
            "size_gib",
            format!("must be <= 65536 (64 TiB), got {}", e.size_gib),
        ));
    }
    if !(e.time_scale.is_finite() && e.time_scale > 0.0) {
        return Err((
            "time_scale",
            format!("must be a number > 0, got {}", e.time_scale),
        ));
    }
    if let Some(f) = e.initial_credit_fraction {
        check_fraction(f).map_err(|p| ("initial_credit_fraction", p))?;
    }
    let t = e.volume_type.name();
    match e.volume_type {
        VolumeType::Gp2 | VolumeType::St1 | VolumeType::Sc1 => {
            if e.provisioned_iops.is_some() {
                return Err((
                    "provisioned_iops",
                    format!("is not allowed for {t}: its performance follows from size_gib"),
                ));
            }
            if e.provisioned_mib_s.is_some() {
                return Err((
                    "provisioned_mib_s",
                    format!("is not allowed for {t}: its throughput follows from size_gib"),
                ));
            }
        }
        VolumeType::Gp3 => {
            let iops = e.provisioned_iops.unwrap_or(3_000);
            if !(3_000..=80_000).contains(&iops) {
                return Err((
                    "provisioned_iops",
                    format!("must be 3000..=80000 for gp3, got {iops}"),
                ));
            }
            if iops > 3_000 && iops > 500 * e.size_gib {
                return Err((
                    "provisioned_iops",
                    format!(
                        "gp3 allows at most 500 IOPS per GiB: {iops} needs size_gib >= {}",
                        iops.div_ceil(500)
                    ),
                ));
            }
            let mib = e.provisioned_mib_s.unwrap_or(125);
            if !(125..=2_000).contains(&mib) {
                return Err((
                    "provisioned_mib_s",
                    format!("must be 125..=2000 for gp3, got {mib}"),
                ));
            }
            if mib > 125 && mib * 4 > iops {
                return Err((
                    "provisioned_mib_s",
                    format!(
                        "gp3 allows at most 0.25 MiB/s per provisioned IOPS ({iops} IOPS: {} MiB/s)",
                        iops / 4
                    ),
                ));
            }
        }
        VolumeType::Io1 | VolumeType::Io2 => {
            let (max, per_gib) = if e.volume_type == VolumeType::Io1 {
                (64_000, 50)
            } else {
                (256_000, 1_000)
            };
            let Some(iops) = e.provisioned_iops else {
                return Err(("provisioned_iops", format!("is required for {t}")));
            };
            if !(100..=max).contains(&iops) {
                return Err((
                    "provisioned_iops",
                    format!("must be 100..={max} for {t}, got {iops}"),
                ));
            }
            if iops > per_gib * e.size_gib {
                return Err((
                    "provisioned_iops",
                    format!(
                        "{t} allows at most {per_gib} IOPS per GiB: {iops} needs size_gib >= {}",
                        iops.div_ceil(per_gib)
                    ),
                ));
            }
            if e.provisioned_mib_s.is_some() {
                return Err((
                    "provisioned_mib_s",
                    format!("is not allowed for {t}: its throughput follows from provisioned_iops"),
                ));
            }
        }
    }
    Ok(())
}

/// An instance is a known `type` or explicit figures, never both: a type with a changed figure
/// would be neither what AWS sells nor what the plan's reader expects.
fn validate_instance(i: &InstanceSpec) -> Result<(), (&'static str, String)> {
    if !(i.time_scale.is_finite() && i.time_scale > 0.0) {
        return Err((
            "time_scale",
            format!("must be a number > 0, got {}", i.time_scale),
        ));
    }
    let known = super::instance::known_instance_types;
    let figures = [
        ("baseline_mb_s", i.baseline_mb_s.is_some()),
        ("baseline_iops", i.baseline_iops.is_some()),
        ("maximum_mb_s", i.maximum_mb_s.is_some()),
        ("maximum_iops", i.maximum_iops.is_some()),
    ];
    if let Some(t) = &i.instance_type {
        if super::instance::instance_type(t).is_none() {
            return Err((
                "type",
                format!(
                    "'{t}' is not an instance type lockstep knows (known: {}); for another type \
                     give its baseline_mb_s and baseline_iops from AWS's table instead",
                    known()
                ),
            ));
        }
        if let Some(&(f, _)) = figures.iter().find(|(_, set)| *set) {
            return Err((
                f,
                format!("is not allowed with type = \"{t}\": give a type or figures, not both"),
            ));
        }
        return Ok(());
    }
    if i.baseline_mb_s.is_none() && i.baseline_iops.is_none() {
        return Err((
            "type/baseline_mb_s/baseline_iops",
            format!(
                "one must be set: a known type ({}) or the instance's baseline figures",
                known()
            ),
        ));
    }
    let mb = |f: &'static str, v: Option<f64>| match v {
        Some(v) if !(v.is_finite() && v > 0.0) => Err((f, format!("must be > 0 MB/s, got {v}"))),
        _ => Ok(()),
    };
    mb("baseline_mb_s", i.baseline_mb_s)?;
    mb("maximum_mb_s", i.maximum_mb_s)?;
    if i.baseline_iops == Some(0) {
        return Err(("baseline_iops", "must be > 0".into()));
    }
    let below =
        |max: Option<f64>, base: Option<f64>| matches!((max, base), (Some(m), Some(b)) if m < b);
    if i.maximum_mb_s.is_some() && i.baseline_mb_s.is_none() {
        return Err(("maximum_mb_s", "needs baseline_mb_s".into()));
    }
    if below(i.maximum_mb_s, i.baseline_mb_s) {
        return Err(("maximum_mb_s", "must be at least baseline_mb_s".into()));
    }
    if i.maximum_iops.is_some() && i.baseline_iops.is_none() {
        return Err(("maximum_iops", "needs baseline_iops".into()));
    }
    if below(
        i.maximum_iops.map(|v| v as f64),
        i.baseline_iops.map(|v| v as f64),
    ) {
        return Err(("maximum_iops", "must be at least baseline_iops".into()));
    }
    Ok(())
}

/// A field of one `FaultSpec` breaks a rule.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{field} {problem}")]
pub struct SpecError {
    pub kind: &'static str,
    pub field: &'static str,
    pub problem: String,
}

/// An invalid fault in a schedule, located for the user.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FaultError {
    /// `index` counts from 1, as a person counts the `[[fault]]` tables of a plan.
    #[error("fault {index} ({kind}): {source}", kind = .source.kind)]
    Invalid {
        index: usize,
        #[source]
        source: SpecError,
    },
}

/// Validates a whole schedule; the first invalid fault is reported with its position.
pub fn validate_all(specs: &[FaultSpec]) -> Result<(), FaultError> {
    for (i, spec) in specs.iter().enumerate() {
        spec.validate().map_err(|source| FaultError::Invalid {
            index: i + 1,
            source,
        })?;
    }
    Ok(())
}

/// Names (the `kind`s) of the faults active at `now_ns`, in schedule order, for the timeline.
pub fn active_faults(specs: &[FaultSpec], now_ns: u64) -> Vec<&'static str> {
    specs
        .iter()
        .filter(|s| s.is_active(now_ns))
        .map(FaultSpec::name)
        .collect()
}

impl fmt::Display for FaultSpec {
    /// One line for timelines and reports, e.g. `ebs gp2 60 GiB (credits x60) from 0 s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dir = |d: Directions| match d {
            Directions::Both => String::new(),
            Directions::Read => " reads".to_string(),
            Directions::Write => " writes".to_string(),
        };
        match &self.kind {
            FaultKind::IopsCap(c) => {
                write!(f, "iops_cap")?;
                for (n, v) in [("read", c.read), ("write", c.write), ("total", c.total)] {
                    if let Some(v) = v {
                        write!(f, " {n}={v}")?;
                    }
                }
            }
            FaultKind::BwCap(c) => {
                write!(f, "bw_cap")?;
                for (n, v) in [
                    ("read", c.read_bytes_per_s),
                    ("write", c.write_bytes_per_s),
                    ("total", c.total_bytes_per_s),
                ] {
                    if let Some(v) = v {
                        write!(f, " {n}={v}B/s")?;
                    }
                }
            }
            FaultKind::Ebs(e) => {
                write!(f, "ebs {} {} GiB", e.volume_type.name(), e.size_gib)?;
                if let Some(i) = e.provisioned_iops {
                    write!(f, " {i} IOPS")?;
                }
                if let Some(m) = e.provisioned_mib_s {
                    write!(f, " {m} MiB/s")?;
                }
                if e.time_scale != 1.0 {
                    write!(f, " (credits x{})", e.time_scale)?;
                }
            }
            FaultKind::Instance(i) => {
                write!(f, "instance")?;
                match &i.instance_type {
                    Some(t) => write!(f, " {t}")?,
                    None => {
                        if let Some(m) = i.baseline_mb_s {
                            write!(f, " {m} MB/s")?;
                        }
                        if let Some(n) = i.baseline_iops {
                            write!(f, " {n} IOPS")?;
                        }
                    }
                }
                if i.time_scale != 1.0 {
                    write!(f, " (burst x{})", i.time_scale)?;
                }
            }
            FaultKind::Latency(l) => {
                match (l.add_us, l.distribution) {
                    (Some(us), _) => write!(f, "latency +{us}us")?,
                    (None, Some(LatencyDistribution::Uniform { min_us, max_us })) => {
                        write!(f, "latency +uniform({min_us}..{max_us})us")?
                    }
                    (None, Some(LatencyDistribution::Exponential { mean_us })) => {
                        write!(f, "latency +exp(mean {mean_us})us")?
                    }
                    (None, None) => write!(f, "latency")?,
                }
                if l.fraction < 1.0 {
                    write!(f, " on {}%", l.fraction * 100.0)?;
                }
                write!(f, "{}", dir(l.direction))?;
            }
            FaultKind::Eio(e) => write!(f, "eio on {}%{}", e.fraction * 100.0, dir(e.direction))?,
            FaultKind::Stall(_) => write!(f, "stall")?,
            FaultKind::DropWrites(d) => write!(f, "drop_writes on {}%", d.fraction * 100.0)?,
            FaultKind::KernelThrottle(k) => {
                write!(f, "kernel_throttle")?;
                for (n, v) in [
                    ("riops", k.riops),
                    ("wiops", k.wiops),
                    ("rbps", k.rbps),
                    ("wbps", k.wbps),
                ] {
                    if let Some(v) = v {
                        write!(f, " {n}={v}")?;
                    }
                }
            }
            FaultKind::Kill(_) => write!(f, "kill the agent")?,
            FaultKind::Pause(_) => write!(f, "pause the agent")?,
            FaultKind::CutOff(_) => write!(f, "cut the agent off")?,
            FaultKind::Exec(e) => {
                write!(f, "exec `{}`", e.start)?;
                if let Some(end) = &e.end {
                    write!(f, " then `{end}`")?;
                }
            }
        }
        let secs = |ms: u64| ms as f64 / 1000.0;
        match self.duration_ms {
            Some(d) => write!(f, " from {} s for {} s", secs(self.at_ms), secs(d)),
            None => write!(f, " from {} s", secs(self.at_ms)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ebs(t: VolumeType, size: u64) -> EbsSpec {
        EbsSpec {
            volume_type: t,
            size_gib: size,
            provisioned_iops: None,
            provisioned_mib_s: None,
            time_scale: 1.0,
            initial_credit_fraction: None,
        }
    }

    #[test]
    fn json_shape_is_flat_and_tagged_by_kind() {
        let spec = FaultSpec::new(FaultKind::Ebs(EbsSpec {
            time_scale: 60.0,
            ..ebs(VolumeType::Gp2, 60)
        }))
        .window_ms(0, None);
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(
            json,
            r#"{"at_ms":0,"kind":"ebs","volume_type":"gp2","size_gib":60,"time_scale":60.0}"#
        );
        let back: FaultSpec = serde_json::from_str(&json).unwrap();
        assert_eq!(back, spec);
    }

    #[test]
    fn an_instance_is_a_known_type_or_figures() {
        let parse = |j: &str| serde_json::from_str::<FaultSpec>(j).unwrap();
        let check = |j: &str| parse(j).validate();
        check(r#"{"kind":"instance","type":"r4.8xlarge"}"#).unwrap();
        check(r#"{"kind":"instance","baseline_mb_s":87.5}"#).unwrap();
        check(r#"{"kind":"instance","baseline_iops":500,"maximum_iops":900,"time_scale":60}"#)
            .unwrap();
        let e = check(r#"{"kind":"instance","type":"r4.9xlarge"}"#).unwrap_err();
        assert_eq!((e.kind, e.field), ("instance", "type"));
        assert!(
            e.problem.starts_with(
                "'r4.9xlarge' is not an instance type lockstep knows (known: m5.large, \
                 r4.8xlarge, r5b.24xlarge)"
            ),
            "{e}"
        );
        let field = |j: &str| check(j).unwrap_err().field;
        assert_eq!(
            field(r#"{"kind":"instance","type":"m5.large","baseline_mb_s":1}"#),
            "baseline_mb_s"
        );
        assert_eq!(
            field(r#"{"kind":"instance"}"#),
            "type/baseline_mb_s/baseline_iops"
        );
        assert_eq!(
            field(r#"{"kind":"instance","baseline_mb_s":0}"#),
            "baseline_mb_s"
        );
        assert_eq!(
            field(r#"{"kind":"instance","baseline_mb_s":10,"maximum_mb_s":5}"#),
            "maximum_mb_s"
        );
        assert_eq!(
            field(r#"{"kind":"instance","baseline_mb_s":10,"maximum_iops":5}"#),
            "maximum_iops"
        );
        assert_eq!(
            field(r#"{"kind":"instance","type":"m5.large","time_scale":0}"#),
            "time_scale"
        );
        assert!(serde_json::from_str::<FaultSpec>(r#"{"kind":"instance","typo":1}"#).is_err());
        assert_eq!(
            parse(r#"{"kind":"instance","type":"m5.large","time_scale":60}"#).to_string(),
            "instance m5.large (burst x60) from 0 s"
        );
        assert!(
            parse(r#"{"kind":"instance","baseline_mb_s":87.5}"#)
                .kind
                .is_gate()
        );
    }

    #[test]
    fn every_kind_round_trips() {
        let specs = vec![
            FaultSpec::new(FaultKind::IopsCap(IopsCapSpec {
                read: Some(100),
                write: None,
                total: Some(150),
            })),
            FaultSpec::new(FaultKind::BwCap(BwCapSpec {
                total_bytes_per_s: Some(1 << 20),
                ..Default::default()
            })),
            FaultSpec::new(FaultKind::Latency(LatencySpec {
                add_us: None,
                distribution: Some(LatencyDistribution::Uniform {
                    min_us: 100,
                    max_us: 900,
                }),
                fraction: 0.5,
                direction: Directions::Write,
            }))
            .window_ms(1000, Some(2000)),
            FaultSpec::new(FaultKind::Eio(EioSpec {
                fraction: 0.01,
                direction: Directions::Read,
            })),
            FaultSpec::new(FaultKind::Stall(StallSpec {})).window_ms(5000, Some(100)),
            FaultSpec::new(FaultKind::DropWrites(DropWritesSpec { fraction: 0.001 })),
            FaultSpec::new(FaultKind::Kill(KillSpec {})).window_ms(9000, None),
            FaultSpec::new(FaultKind::Pause(PauseSpec {})).window_ms(1000, Some(3000)),
            FaultSpec::new(FaultKind::CutOff(CutOffSpec {})).window_ms(1000, Some(3000)),
            FaultSpec::new(FaultKind::Exec(ExecSpec {
                start: "systemctl stop mysqld".into(),
                end: Some("systemctl start mysqld".into()),
                timeout_ms: Some(30_000),
            }))
            .window_ms(1000, Some(3000)),
        ];
        let json = serde_json::to_string(&specs).unwrap();
        let back: Vec<FaultSpec> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, specs);
    }

    #[test]
    fn agent_wide_faults_need_the_right_window() {
        let problem = |json: &str| {
            let s: FaultSpec = serde_json::from_str(json).unwrap();
            s.validate().map(|_| ()).map_err(|e| e.to_string())
        };
        assert!(
            problem(r#"{"kind":"kill","at_ms":5000,"duration_ms":1000}"#)
                .unwrap_err()
                .starts_with("duration is not allowed")
        );
        assert!(problem(r#"{"kind":"kill","at_ms":5000}"#).is_ok());
        for kind in ["pause", "cut_off"] {
            let e = problem(&format!(r#"{{"kind":"{kind}","at_ms":5000}}"#)).unwrap_err();
            assert!(e.starts_with("duration is required"), "{e}");
            assert!(problem(&format!(r#"{{"kind":"{kind}","duration_ms":2000}}"#)).is_ok());
            let e = problem(&format!(r#"{{"kind":"{kind}","duration_ms":3600001}}"#)).unwrap_err();
            assert!(e.contains("at most 1 h"), "{e}");
        }
        let e = problem(r#"{"kind":"exec","start":"  "}"#).unwrap_err();
        assert_eq!(e, "start must be a command");
        let e = problem(r#"{"kind":"exec","start":"true","end":"false"}"#).unwrap_err();
        assert!(e.starts_with("end needs a duration"), "{e}");
        assert!(
            problem(r#"{"kind":"exec","start":"true","end":"false","duration_ms":10}"#).is_ok()
        );
        let e = serde_json::from_str::<FaultSpec>(r#"{"kind":"exec","command":"x"}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `command`"), "{e}");
        for kind in ["kill", "pause", "cut_off", "exec"] {
            let s: FaultSpec = serde_json::from_str(&format!(r#"{{"kind":"{kind}","start":"x"}}"#))
                .or_else(|_| serde_json::from_str(&format!(r#"{{"kind":"{kind}"}}"#)))
                .unwrap();
            assert!(s.kind.is_agent_wide(), "{kind}");
        }
        let stall: FaultSpec = serde_json::from_str(r#"{"kind":"stall"}"#).unwrap();
        assert!(!stall.kind.is_agent_wide());
    }

    #[test]
    fn defaults_apply_when_fields_are_omitted() {
        let s: FaultSpec = serde_json::from_str(r#"{"kind":"latency","add_us":500}"#).unwrap();
        let FaultKind::Latency(l) = &s.kind else {
            panic!()
        };
        assert_eq!((s.at_ms, s.duration_ms), (0, None));
        assert_eq!((l.fraction, l.direction), (1.0, Directions::Both));
        let s: FaultSpec = serde_json::from_str(
            r#"{"kind":"latency","distribution":{"type":"exponential","mean_us":2000}}"#,
        )
        .unwrap();
        s.validate().unwrap();
        let s: FaultSpec =
            serde_json::from_str(r#"{"kind":"ebs","volume_type":"st1","size_gib":500}"#).unwrap();
        let FaultKind::Ebs(e) = &s.kind else { panic!() };
        assert_eq!(e.time_scale, 1.0);
    }

    #[test]
    fn unknown_fields_and_kinds_are_refused() {
        let e = serde_json::from_str::<FaultSpec>(r#"{"kind":"eio","fration":0.5}"#).unwrap_err();
        assert!(e.to_string().contains("fration"), "{e}");
        let e = serde_json::from_str::<FaultSpec>(r#"{"kind":"slow"}"#).unwrap_err();
        assert!(e.to_string().contains("slow"), "{e}");
        let e =
            serde_json::from_str::<FaultSpec>(r#"{"kind":"ebs","volume_type":"gp9","size_gib":1}"#)
                .unwrap_err();
        assert!(e.to_string().contains("gp9"), "{e}");
    }

    #[test]
    fn window_is_half_open_and_open_ended_without_duration() {
        let s = FaultSpec::new(FaultKind::Stall(StallSpec {})).window_ms(2, Some(3));
        let w = s.window();
        assert_eq!(
            w,
            Window {
                start_ns: 2_000_000,
                end_ns: 5_000_000
            }
        );
        assert!(!w.contains(1_999_999) && w.contains(2_000_000) && w.contains(4_999_999));
        assert!(!w.contains(5_000_000));
        let s = s.window_ms(2, None);
        assert!(s.window().is_open_ended() && s.is_active(u64::MAX - 1));
    }

    #[test]
    fn active_faults_names_what_is_on() {
        let specs = vec![
            FaultSpec::new(FaultKind::Ebs(ebs(VolumeType::Gp2, 60))),
            FaultSpec::new(FaultKind::Stall(StallSpec {})).window_ms(10, Some(5)),
            FaultSpec::new(FaultKind::Eio(EioSpec {
                fraction: 0.1,
                direction: Directions::Both,
            }))
            .window_ms(12, Some(100)),
        ];
        assert_eq!(active_faults(&specs, 0), vec!["ebs"]);
        assert_eq!(
            active_faults(&specs, 12_000_000),
            vec!["ebs", "stall", "eio"]
        );
        assert_eq!(active_faults(&specs, 15_000_000), vec!["ebs", "eio"]);
    }

    #[test]
    fn validation_names_the_fault_and_the_field() {
        let specs = vec![
            FaultSpec::new(FaultKind::Stall(StallSpec {})),
            FaultSpec::new(FaultKind::Ebs(ebs(VolumeType::Gp2, 0))),
        ];
        let e = validate_all(&specs).unwrap_err();
        assert_eq!(e.to_string(), "fault 2 (ebs): size_gib must be > 0");

        let check = |kind: FaultKind, field: &str| {
            let e = FaultSpec::new(kind).validate().unwrap_err();
            assert_eq!(e.field, field, "{e}");
        };
        check(
            FaultKind::Eio(EioSpec {
                fraction: 1.5,
                direction: Directions::Both,
            }),
            "fraction",
        );
        check(
            FaultKind::DropWrites(DropWritesSpec { fraction: f64::NAN }),
            "fraction",
        );
        check(
            FaultKind::IopsCap(IopsCapSpec::default()),
            "read/write/total",
        );
        check(
            FaultKind::IopsCap(IopsCapSpec {
                write: Some(0),
                ..Default::default()
            }),
            "write",
        );
        check(
            FaultKind::BwCap(BwCapSpec {
                read_bytes_per_s: Some(0),
                ..Default::default()
            }),
            "read_bytes_per_s",
        );
        check(
            FaultKind::Latency(LatencySpec {
                add_us: Some(5),
                distribution: Some(LatencyDistribution::Exponential { mean_us: 5 }),
                fraction: 1.0,
                direction: Directions::Both,
            }),
            "add_us/distribution",
        );
        check(
            FaultKind::Latency(LatencySpec {
                add_us: None,
                distribution: Some(LatencyDistribution::Uniform {
                    min_us: 5,
                    max_us: 4,
                }),
                fraction: 1.0,
                direction: Directions::Both,
            }),
            "distribution.max_us",
        );
        check(
            FaultKind::Ebs(EbsSpec {
                time_scale: 0.0,
                ..ebs(VolumeType::Gp2, 60)
            }),
            "time_scale",
        );
        check(
            FaultKind::Ebs(EbsSpec {
                initial_credit_fraction: Some(-0.1),
                ..ebs(VolumeType::Gp2, 60)
            }),
            "initial_credit_fraction",
        );
        check(
            FaultKind::Ebs(EbsSpec {
                provisioned_iops: Some(500),
                ..ebs(VolumeType::Gp2, 60)
            }),
            "provisioned_iops",
        );
        check(
            FaultKind::Ebs(ebs(VolumeType::Io2, 100)),
            "provisioned_iops",
        );
        check(
            FaultKind::Ebs(EbsSpec {
                provisioned_iops: Some(6_000),
                ..ebs(VolumeType::Io1, 100)
            }),
            "provisioned_iops",
        );
        check(
            FaultKind::Ebs(EbsSpec {
                provisioned_iops: Some(10_000),
                ..ebs(VolumeType::Gp3, 10)
            }),
            "provisioned_iops",
        );
        check(
            FaultKind::Ebs(EbsSpec {
                provisioned_mib_s: Some(1_000),
                ..ebs(VolumeType::Gp3, 100)
            }),
            "provisioned_mib_s",
        );
        let e = FaultSpec::new(FaultKind::Stall(StallSpec {}))
            .window_ms(0, Some(0))
            .validate();
        assert_eq!(e.unwrap_err().field, "duration_ms");

        // Valid ones pass.
        for k in [
            FaultKind::Ebs(ebs(VolumeType::Gp3, 1)),
            FaultKind::Ebs(EbsSpec {
                provisioned_iops: Some(64_000),
                ..ebs(VolumeType::Io2, 64)
            }),
            FaultKind::Ebs(EbsSpec {
                provisioned_iops: Some(16_000),
                provisioned_mib_s: Some(1_000),
                ..ebs(VolumeType::Gp3, 100)
            }),
            FaultKind::Ebs(ebs(VolumeType::Sc1, 1_024)),
        ] {
            FaultSpec::new(k).validate().unwrap();
        }
    }

    #[test]
    fn display_is_one_readable_line() {
        let s = FaultSpec::new(FaultKind::Ebs(EbsSpec {
            time_scale: 60.0,
            ..ebs(VolumeType::Gp2, 60)
        }));
        assert_eq!(s.to_string(), "ebs gp2 60 GiB (credits x60) from 0 s");
        let s = FaultSpec::new(FaultKind::Eio(EioSpec {
            fraction: 0.5,
            direction: Directions::Write,
        }))
        .window_ms(1500, Some(2000));
        assert_eq!(s.to_string(), "eio on 50% writes from 1.5 s for 2 s");
    }
}
