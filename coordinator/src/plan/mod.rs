//! Plans: which workload runs on which volumes of which agents, for how long, against which
//! objectives and with which faults injected. The format is documented in `docs/plan.md`.
//!
//! Two steps, both pure (the only IO is reading the plan and the job files it names):
//! - `load` / `parse`: TOML into a typed, validated `Plan`. Every workload is turned into fio job
//!   text here and checked with the agent's own job-file parser, so a misspelt option, profile or
//!   duration is refused before any agent is contacted;
//! - `resolve`: the plan bound to the agents of a run (from the plan's `[[agent]]` list, from
//!   `--local N`, or from etcd) into an `Assignment`: per agent, per volume, the role, job text,
//!   overrides and faults. Names that only mean something once the agents are known (agents,
//!   volumes, labels) are checked here, and overlapping roles are refused.
//!
//! Every error names the plan file, the line and the field, e.g.
//! `plans/x.toml:14: role 'worker': workload: unknown profile 'oltp-9k' (known: ...)`, because a
//! plan is written by hand and the user must be able to go straight to the mistake.

mod duration;
pub mod profiles;
mod raw;
mod resolve;
mod workload;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lockstep_core::fault::FaultSpec;
use lockstep_core::job::Direction;
use lockstep_core::limits::{self, MAX_TEXT_FILE, TextFileError};
use toml::Spanned;

pub use duration::{check_whole_millis, format_duration, parse_duration};
pub use resolve::{
    AgentAssignment, AgentInfo, AgentVolume, Assignment, FaultAssignment, ScheduledFault,
    VolumeAssignment, VolumeRef, resolve,
};
pub use workload::with_rate;

/// Reporting interval when the plan gives none.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// Shortest reporting interval: below this, per-interval histograms cost more than they tell.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// A plan that cannot be used, and where it went wrong.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The plan file could not be read at all.
    #[error("{}: cannot read the plan: {source}", file.display())]
    Read {
        file: PathBuf,
        #[source]
        source: TextFileError,
    },
    /// The plan is readable but wrong. `line` is 1-based, 0 when the problem is not on one line
    /// (for instance two agents of a run reporting the same name). `field` names the plan
    /// element and key (`role 'worker': workload`), empty for the document as a whole.
    #[error("{}", render(file, *line, field, message))]
    Invalid {
        file: PathBuf,
        line: usize,
        field: String,
        message: String,
    },
}

impl PlanError {
    /// The plan line the error points at (0 when none).
    pub fn line(&self) -> usize {
        match self {
            PlanError::Read { .. } => 0,
            PlanError::Invalid { line, .. } => *line,
        }
    }

    /// The element and key the error is about, e.g. `role 'worker': workload`.
    pub fn field(&self) -> &str {
        match self {
            PlanError::Read { .. } => "",
            PlanError::Invalid { field, .. } => field,
        }
    }
}

fn render(file: &Path, line: usize, field: &str, message: &str) -> String {
    let mut out = file.display().to_string();
    if line > 0 {
        out.push_str(&format!(":{line}"));
    }
    if !field.is_empty() {
        out.push_str(&format!(": {field}"));
    }
    out.push_str(&format!(": {message}"));
    out
}

/// A parsed, validated plan, not yet bound to agents.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// `name`, or the plan file's stem.
    pub name: String,
    /// The plan file, for messages (and the base of relative job file paths).
    pub origin: PathBuf,
    /// Reporting interval: the unit of every time series.
    pub interval: Duration,
    /// Significant digits of the interval histograms agents send, merge and the data files
    /// keep: 3 (default, as recorded) or 2 (coarsened exactly on the agent; about a third of
    /// the merge's CPU and of the data files' bytes, docs/scale.md). Final results (fio.json)
    /// stay at 3.
    pub histogram_digits: u8,
    /// In run order, each with its start offset. A top-level `ramp` is the first phase
    /// (named "ramp", not measured).
    pub phases: Vec<Phase>,
    /// Agents given by address (cluster mode without etcd). Empty when the plan has none, and
    /// ignored by `lockstep run --local N`, which makes its own.
    pub agents: Vec<PlanAgent>,
    pub roles: Vec<Role>,
    pub objectives: Vec<Objective>,
    pub faults: Vec<Fault>,
}

impl Plan {
    /// Reads and parses the plan file at `path`, and the job files it names.
    pub fn load(path: &Path) -> Result<Plan, PlanError> {
        load(path)
    }

    /// Parses plan text; `origin` is the file it came from (for messages and relative paths).
    pub fn parse(text: &str, origin: &Path) -> Result<Plan, PlanError> {
        parse(text, origin)
    }

    /// From the synchronized start to the end of the last phase.
    pub fn run_length(&self) -> Duration {
        self.phases.last().map_or(Duration::ZERO, Phase::end)
    }

    /// Time that counts for results and objectives (the measured phases).
    pub fn measured_length(&self) -> Duration {
        self.phases
            .iter()
            .filter(|p| p.measure)
            .map(|p| p.duration)
            .sum()
    }

    pub fn role(&self, name: &str) -> Option<&Role> {
        self.roles.iter().find(|r| r.name == name)
    }

    pub fn phase(&self, name: &str) -> Option<&Phase> {
        self.phases.iter().find(|p| p.name == name)
    }
}

/// Reads and parses the plan file at `path`, and the job files it names. The plan must be a
/// regular file of at most `MAX_TEXT_FILE` bytes (not `/dev/zero`, a FIFO or a directory).
pub fn load(path: &Path) -> Result<Plan, PlanError> {
    let text = read_plan_text(path)?;
    parse(&text, path)
}

/// A plan's name as it goes into a file or run id: letters, digits and `-` kept, anything else
/// `_`.
pub fn file_safe_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The text of the plan file at `path`, read as `load` reads it.
pub fn read_plan_text(path: &Path) -> Result<String, PlanError> {
    limits::read_text_file(path, MAX_TEXT_FILE, "plan").map_err(|source| PlanError::Read {
        file: path.to_path_buf(),
        source,
    })
}

/// Parses plan text; `origin` is the file it came from: messages name it, and job files are
/// found relative to its directory.
pub fn parse(text: &str, origin: &Path) -> Result<Plan, PlanError> {
    let src = Source { file: origin, text };
    let raw: raw::RawPlan = toml::from_str(text).map_err(|e| src.toml_error(&e))?;
    build(&src, raw)
}

/// A phase of the run. Phases run back to back with no gap (the workload keeps running); they
/// differ in whether their intervals count for results and objectives.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Phase {
    pub name: String,
    /// Offset from the run's synchronized start.
    pub start: Duration,
    pub duration: Duration,
    /// Whether the phase's intervals count for results and objectives.
    pub measure: bool,
    /// Plan line (0 for phases the plan implies: "ramp" and the default "measure").
    pub line: usize,
}

impl Phase {
    pub fn end(&self) -> Duration {
        self.start + self.duration
    }
}

/// An agent given by address in the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanAgent {
    pub name: String,
    /// `host:port` of its gRPC endpoint.
    pub address: String,
    /// Added to (and overriding) the labels the agent reports about itself.
    pub labels: BTreeMap<String, String>,
    pub line: usize,
}

/// A group of volumes that run the same workload. Volumes of one role are peers: the
/// chokepoint finder compares them with each other.
#[derive(Debug, Clone, PartialEq)]
pub struct Role {
    pub name: String,
    pub line: usize,
    pub select: Selector,
    /// Line of `select` (the role's line when absent).
    pub select_line: usize,
    /// Volume names on the selected agents; `None`: every volume of those agents.
    pub volumes: Option<Vec<String>>,
    /// Line of `volumes` (the role's line when absent).
    pub volumes_line: usize,
    pub workload: Workload,
    /// Open-loop target per volume (fio's `rate_iops`); `None`: closed loop (iodepth-bound).
    pub rate_iops: Option<u64>,
    /// Curve mode (vdbench `iorate=curve`): percentages of the maximum rate to run at, after a
    /// closed-loop run that finds the maximum (`curve`).
    pub rate_curve: Option<Vec<f64>>,
    /// Sweep mode: one closed-loop run per depth, for latency against outstanding IOs
    /// (`sweep`).
    pub depth_sweep: Option<DepthSweep>,
    /// Where this role's writes are mirrored (docs/plan.md, "Mirrored pairs").
    pub mirror: Option<Mirror>,
}

/// A role's `mirror`: each write on one of its volumes is written again by the paired volume
/// of role `to` (agent i with agent i, volume j with volume j), over an agent-to-agent stream.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Mirror {
    /// The backup role.
    pub to: String,
    /// Sync: a write completes once the backup acknowledged it; async: locally, the backup lags.
    pub sync: bool,
    /// Added to each write's round trip (1,100 us: two availability zones, docs/domain.md).
    pub delay_us: u64,
    /// Sync mode: fail over to async after this long without an ack.
    pub failover_after: Option<Duration>,
    /// Resend what a returned backup missed (default); `false` leaves it behind, to measure
    /// what that costs or to show that the backup's copy is stale without it.
    pub catch_up: bool,
    pub line: usize,
}

/// The largest injectable mirror delay: a second is already beyond any zone or region pair.
pub const MAX_MIRROR_DELAY_US: u64 = 1_000_000;

/// The most IOs in flight per job (or clones per job) a sweep step may ask for.
pub const MAX_SWEEP_DEPTH: u32 = 4096;

/// The most steps of a sweep: each step is a complete run.
pub const MAX_SWEEP_STEPS: usize = 20;

/// A role's `depth_sweep` (with `sweep_over`): the values to run the role's workload at, one
/// complete closed-loop run each. With a fixed number of IOs in flight, IOPS = outstanding /
/// latency (Little's law), so the sweep shows where more outstanding IOs stop buying IOPS and
/// only queue (docs/domain.md#latency-vs-threads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DepthSweep {
    pub over: SweepOver,
    /// Increasing, each from 1 to `MAX_SWEEP_DEPTH`.
    pub values: Vec<u32>,
}

/// What a sweep varies at each step: a fio option set on every job of the role's workload
/// (`iodepth`, `numjobs`), the role's per-volume open-loop target (`rate_iops`), or how many of
/// each agent's volumes run the workload (`volumes`: a datanode with 4, 5, ... disks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SweepOver {
    /// Each job's queue depth (`iodepth=N`).
    #[default]
    Iodepth,
    /// Clones of each job, each at the workload's iodepth (`numjobs=N`: vdbench's threads).
    Numjobs,
    /// The first N volumes of each selected agent run the workload, the others stay idle.
    Volumes,
    /// The role's open-loop target per volume, as `rate_iops = N` would set it.
    RateIops,
}

impl SweepOver {
    /// How a value of it reads in text: `depth 4`, `numjobs 4`, `volumes 4`, `rate 500`.
    pub fn word(self) -> &'static str {
        match self {
            SweepOver::Iodepth => "depth",
            SweepOver::Numjobs => "numjobs",
            SweepOver::Volumes => "volumes",
            SweepOver::RateIops => "rate",
        }
    }

    /// Its name in a plan (`sweep = { over = "..." }`).
    pub fn option(self) -> &'static str {
        match self {
            SweepOver::Iodepth => "iodepth",
            SweepOver::Numjobs => "numjobs",
            SweepOver::Volumes => "volumes",
            SweepOver::RateIops => "rate_iops",
        }
    }

    /// The fio option a step sets on every job, if it is one.
    pub fn fio_option(self) -> Option<&'static str> {
        match self {
            SweepOver::Iodepth | SweepOver::Numjobs => Some(self.option()),
            SweepOver::Volumes | SweepOver::RateIops => None,
        }
    }

    /// The largest value a step may ask for.
    pub fn max_value(self) -> u32 {
        match self {
            SweepOver::RateIops => MAX_SWEEP_RATE,
            _ => MAX_SWEEP_DEPTH,
        }
    }

    fn parse(name: &str) -> Option<SweepOver> {
        [
            SweepOver::Iodepth,
            SweepOver::Numjobs,
            SweepOver::Volumes,
            SweepOver::RateIops,
        ]
        .into_iter()
        .find(|o| o.option() == name)
    }
}

/// The highest per-volume rate a `rate_iops` sweep step may ask for.
pub const MAX_SWEEP_RATE: u32 = 10_000_000;

/// `workload` with every job at `value` of `over` (an `iodepth=` or `numjobs=` override, on
/// top of the job text and the role's `set`): one step of a depth sweep. Unchanged for a sweep
/// that sets no fio option.
pub fn with_depth(workload: &Workload, over: SweepOver, value: u32) -> Workload {
    let mut w = workload.clone();
    if let Some(option) = over.fio_option() {
        w.overrides.insert(option.to_string(), value.to_string());
    }
    w
}

/// The jobs of `workload` at one step of a sweep, as the agent will parse them.
fn jobs_at(
    workload: &Workload,
    over: SweepOver,
    value: u32,
) -> Result<Vec<lockstep_core::job::JobSpec>, String> {
    let w = with_depth(workload, over, value);
    let overrides: Vec<(String, String)> = w.overrides.into_iter().collect();
    lockstep_core::jobfile::parse_str(&w.job_text, Path::new("(sweep)"), None, &overrides)
        .map_err(|e| e.to_string())
}

/// Which agents a role (or fault) applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    All,
    /// By name.
    Agents(Vec<String>),
    /// Agents that carry every one of these labels.
    Labels(BTreeMap<String, String>),
}

impl Selector {
    /// Whether the agent named `name` with `labels` is selected.
    pub fn matches(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Selector::All => true,
            Selector::Agents(names) => names.iter().any(|n| n == name),
            Selector::Labels(want) => want.iter().all(|(k, v)| labels.get(k) == Some(v)),
        }
    }
}

/// A role's workload, resolved to fio job text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub source: WorkloadSource,
    /// fio job text, self-contained (job file includes are expanded), with no
    /// `directory=`/`filename=`: the agent points the jobs at the assigned volume.
    pub job_text: String,
    /// Options applied on top of every job of the text, as the agent's `overrides`: the role's
    /// `set` table, then lockstep's own: `time_based=1`, `runtime=` the run's length and
    /// `ramp_time=0` (the plan's phases decide time and what is measured), and `rate_iops` from
    /// the role.
    pub overrides: BTreeMap<String, String>,
    pub line: usize,
}

/// Where a workload's job text came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkloadSource {
    /// A built-in profile (`profiles.rs`).
    Profile(String),
    /// A fio job file, as found (relative to the plan file's directory).
    JobFile(PathBuf),
    /// Inline fio options in the plan.
    Inline,
}

impl fmt::Display for WorkloadSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkloadSource::Profile(name) => write!(f, "profile {name}"),
            WorkloadSource::JobFile(path) => write!(f, "job file {}", path.display()),
            WorkloadSource::Inline => write!(f, "inline fio options"),
        }
    }
}

/// What an objective measures.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub enum Metric {
    /// A latency percentile (`p99.9` is `Percentile(99.9)`), from merged histograms.
    Percentile(f64),
    /// Mean latency.
    Mean,
    /// Worst latency.
    Max,
    /// The lowest per-interval IOPS over the measured phases: catches a volume that was fine
    /// on average but fell off a cliff (a credit bucket running dry).
    IopsMin,
    /// The lowest per-interval throughput over the measured phases, MB/s (10^6 bytes/s).
    MbpsMin,
}

impl Metric {
    fn parse(s: &str) -> Option<Metric> {
        match s {
            "mean" => Some(Metric::Mean),
            "max" => Some(Metric::Max),
            "iops_min" => Some(Metric::IopsMin),
            "mbps_min" => Some(Metric::MbpsMin),
            _ => {
                let p: f64 = s.strip_prefix('p')?.parse().ok()?;
                (p > 0.0 && p <= 100.0).then_some(Metric::Percentile(p))
            }
        }
    }

    /// Latency metrics are upper bounds (`below`); throughput ones lower bounds (`above`).
    pub fn is_latency(self) -> bool {
        matches!(self, Metric::Percentile(_) | Metric::Mean | Metric::Max)
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Metric::Percentile(p) => write!(f, "p{p}"),
            Metric::Mean => f.write_str("mean"),
            Metric::Max => f.write_str("max"),
            Metric::IopsMin => f.write_str("iops_min"),
            Metric::MbpsMin => f.write_str("mbps_min"),
        }
    }
}

/// The bound an objective's metric must respect, in the unit the evaluator measures in.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub enum Threshold {
    /// Latency strictly below this many nanoseconds.
    LatencyBelowNs(u64),
    /// At least this many IOPS.
    IopsAtLeast(f64),
    /// At least this many bytes per second.
    BytesPerSecAtLeast(f64),
}

/// Over what an objective is evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Scope {
    /// Every volume on its own must meet it.
    Volume,
    /// Every node (its volumes merged) must meet it.
    Node,
    /// The whole cluster (everything merged) must meet it.
    Cluster,
}

impl Scope {
    pub fn name(self) -> &'static str {
        match self {
            Scope::Volume => "volume",
            Scope::Node => "node",
            Scope::Cluster => "cluster",
        }
    }
}

/// A pass/fail criterion; a failed objective makes `lockstep run` exit non-zero.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Objective {
    pub metric: Metric,
    /// `None`: both directions merged ("any").
    pub direction: Option<Direction>,
    pub threshold: Threshold,
    pub scope: Scope,
    /// Only the volumes of this role (default: every volume).
    pub role: Option<String>,
    pub line: usize,
}

impl Objective {
    /// Whether a measured `value` meets the objective. `value` is in the threshold's unit:
    /// nanoseconds for latency metrics, IOPS for `iops_min`, bytes/s for `mbps_min`.
    pub fn holds(&self, value: f64) -> bool {
        match self.threshold {
            Threshold::LatencyBelowNs(ns) => value < ns as f64,
            Threshold::IopsAtLeast(min) | Threshold::BytesPerSecAtLeast(min) => value >= min,
        }
    }
}

impl fmt::Display for Objective {
    /// `p99 read < 5ms on every volume`, for reports.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.metric)?;
        if let Some(dir) = self.direction {
            write!(f, " {}", dir.name())?;
        }
        match self.threshold {
            Threshold::LatencyBelowNs(ns) => {
                write!(f, " < {}", format_duration(Duration::from_nanos(ns)))?
            }
            Threshold::IopsAtLeast(v) => write!(f, " >= {v} IOPS")?,
            Threshold::BytesPerSecAtLeast(v) => write!(f, " >= {} MB/s", v / 1e6)?,
        }
        let whom = match &self.role {
            Some(role) => format!("{role} "),
            None => String::new(),
        };
        match self.scope {
            Scope::Volume => write!(f, " on every {whom}volume"),
            Scope::Node => write!(f, " on every {whom}node"),
            Scope::Cluster if whom.is_empty() => write!(f, " for the cluster"),
            Scope::Cluster => write!(f, " for all {whom}volumes together"),
        }
    }
}

/// A fault from the plan's schedule, with its payload for the agent.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// `fault 'name'` or `fault #n` in messages.
    pub label: String,
    pub line: usize,
    /// Offset from the run's synchronized start (a `phase` offset already added).
    pub at: Duration,
    /// `None`: until the end of the run.
    pub duration: Option<Duration>,
    /// The phase `at` was relative to, if any.
    pub phase: Option<String>,
    pub target: FaultTarget,
    /// Line of `target` (for errors found when resolving it against the run's agents).
    pub target_line: usize,
    /// The FaultSpec tag.
    pub kind: String,
    /// The typed spec, built once from `kind` and every key of the `[[fault]]` table that is
    /// not one of lockstep's own (`name`, `at`, `duration`, `phase`, `target`), with its window
    /// (`at`, `duration`), and validated (shape and values) when the plan was parsed.
    pub spec: FaultSpec,
}

/// The volumes a fault applies to: the volumes with work of the agents selected by `agents`,
/// `labels` or `role` (at most one of `agents`/`labels`; `role` narrows further), filtered by
/// `volumes`. No selector at all means every volume with work.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FaultTarget {
    pub agents: Option<Vec<String>>,
    pub labels: Option<BTreeMap<String, String>>,
    pub role: Option<String>,
    pub volumes: Option<Vec<String>>,
}

/// The plan text being parsed, for turning spans into lines and errors.
struct Source<'a> {
    file: &'a Path,
    text: &'a str,
}

impl Source<'_> {
    /// 1-based line of a byte offset.
    fn line(&self, offset: usize) -> usize {
        let end = offset.min(self.text.len());
        self.text.as_bytes()[..end]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    }

    fn line_of<T>(&self, s: &Spanned<T>) -> usize {
        self.line(s.span().start)
    }

    fn error(
        &self,
        line: usize,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> PlanError {
        PlanError::Invalid {
            file: self.file.to_path_buf(),
            line,
            field: field.into(),
            message: message.into(),
        }
    }

    fn at<T>(
        &self,
        s: &Spanned<T>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> PlanError {
        self.error(self.line_of(s), field, message)
    }

    /// A TOML syntax or type error, with the field found from its span.
    fn toml_error(&self, e: &toml::de::Error) -> PlanError {
        let Some(span) = e.span() else {
            // The TOML crate's recursion limit has no position: point at the most nested line.
            return match raw::most_nested_line(self.text) {
                Some((offset, field)) => self.error(
                    self.line(offset),
                    field,
                    format!("{}: the keys or values are nested too deeply", e.message()),
                ),
                None => self.error(0, "", e.message()),
            };
        };
        let field = raw::field_at(self.text, span.start);
        let mut message = e.message().to_string();
        let arrays = ["agent", "role", "phase", "objective", "fault"];
        if message.contains("expected a sequence") && arrays.contains(&field.as_str()) {
            message.push_str(&format!(" (write [[{field}]], with double brackets)"));
        }
        self.error(self.line(span.start), field, message)
    }
}

/// `role 'name'`-style labels used in every message about an element of an array.
fn label(kind: &str, name: Option<&str>, index: usize) -> String {
    match name {
        Some(name) => format!("{kind} '{name}'"),
        None => format!("{kind} #{}", index + 1),
    }
}

/// Names of roles, phases and agents become job section names, results keys and file names,
/// so they are kept to a safe alphabet.
fn check_name(src: &Source, name: &Spanned<String>, what: &str) -> Result<(), PlanError> {
    let n = name.get_ref();
    let ok = !n.is_empty()
        && n.len() <= 64
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !ok {
        return Err(src.at(
            name,
            format!("{what}: name"),
            format!("'{n}' is not a usable name: use 1 to 64 letters, digits, '-', '_' or '.'"),
        ));
    }
    Ok(())
}

fn build(src: &Source, raw: raw::RawPlan) -> Result<Plan, PlanError> {
    let name = match &raw.name {
        Some(n) => {
            check_name(src, n, "plan")?;
            n.get_ref().clone()
        }
        None => src
            .file
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "plan".to_string()),
    };

    let interval = match &raw.interval {
        Some(i) => {
            let d = i.get_ref().0;
            if d < MIN_INTERVAL {
                return Err(src.at(
                    i,
                    "interval",
                    format!(
                        "{} is too short: the shortest reporting interval is {}",
                        format_duration(d),
                        format_duration(MIN_INTERVAL)
                    ),
                ));
            }
            d
        }
        None => DEFAULT_INTERVAL,
    };

    let histogram_digits = match &raw.histogram_digits {
        Some(d) => u8::try_from(*d.get_ref())
            .ok()
            .filter(|d| lockstep_proto::histogram::INTERVAL_DIGITS.contains(d))
            .ok_or_else(|| {
                src.at(
                    d,
                    "histogram_digits",
                    format!(
                        "{} is not supported: 3 (the default, as recorded) or 2 (1% buckets, \
                         a third of the merge's CPU and of the data files)",
                        d.get_ref()
                    ),
                )
            })?,
        None => lockstep_proto::histogram::RECORDED_DIGITS,
    };

    let phases = build_phases(src, &raw)?;
    let run_end = phases.last().map_or(Duration::ZERO, Phase::end);
    let agents = build_agents(src, &raw.agent)?;
    let roles = build_roles(src, &raw.role, &agents, run_end)?;
    let objectives = raw
        .objective
        .iter()
        .enumerate()
        .map(|(i, o)| build_objective(src, i, o, &roles))
        .collect::<Result<Vec<_>, _>>()?;
    let faults = raw
        .fault
        .iter()
        .enumerate()
        .map(|(i, f)| build_fault(src, i, f, &phases, &roles, &agents, run_end))
        .collect::<Result<Vec<_>, _>>()?;

    Ok(Plan {
        name,
        origin: src.file.to_path_buf(),
        interval,
        histogram_digits,
        phases,
        agents,
        roles,
        objectives,
        faults,
    })
}

fn build_phases(src: &Source, raw: &raw::RawPlan) -> Result<Vec<Phase>, PlanError> {
    let default = raw.duration.as_ref().map(|d| d.get_ref().0);
    if let Some(d) = raw.duration.as_ref().filter(|d| d.get_ref().0.is_zero()) {
        return Err(src.at(d, "duration", "must be longer than 0s"));
    }
    for (given, field) in [(&raw.duration, "duration"), (&raw.ramp, "ramp")] {
        if let Some(d) = given {
            check_whole_millis(d.get_ref().0).map_err(|m| src.at(d, field, m))?;
        }
    }
    let mut phases = Vec::new();
    let mut start = Duration::ZERO;
    if let Some(ramp) = &raw.ramp {
        let d = ramp.get_ref().0;
        if !d.is_zero() {
            phases.push(Phase {
                name: "ramp".to_string(),
                start,
                duration: d,
                measure: false,
                line: src.line_of(ramp),
            });
            start += d;
        }
    }
    if raw.phase.is_empty() {
        let Some(duration) = default else {
            return Err(src.error(
                0,
                "duration",
                "missing: give the measured time (e.g. duration = \"60s\") or [[phase]] tables",
            ));
        };
        phases.push(Phase {
            name: "measure".to_string(),
            start,
            duration,
            measure: true,
            line: raw.duration.as_ref().map_or(0, |d| src.line_of(d)),
        });
        return Ok(phases);
    }
    let mut seen = BTreeSet::new();
    if !phases.is_empty() {
        seen.insert("ramp".to_string());
    }
    for (i, p) in raw.phase.iter().enumerate() {
        let r = p.get_ref();
        let what = label("phase", Some(r.name.get_ref()), i);
        check_name(src, &r.name, &what)?;
        if !seen.insert(r.name.get_ref().clone()) {
            return Err(src.at(
                &r.name,
                format!("{what}: name"),
                "a phase of this name comes earlier (phase names must be unique; \"ramp\" is \
                 taken when the plan has a top-level ramp)",
            ));
        }
        let duration = match (&r.duration, default) {
            (Some(d), _) => {
                if d.get_ref().0.is_zero() {
                    return Err(src.at(d, format!("{what}: duration"), "must be longer than 0s"));
                }
                check_whole_millis(d.get_ref().0)
                    .map_err(|m| src.at(d, format!("{what}: duration"), m))?;
                d.get_ref().0
            }
            (None, Some(d)) => d,
            (None, None) => {
                return Err(src.at(
                    p,
                    format!("{what}: duration"),
                    "missing, and the plan has no top-level duration to default to",
                ));
            }
        };
        phases.push(Phase {
            name: r.name.get_ref().clone(),
            start,
            duration,
            measure: r.measure.unwrap_or(true),
            line: src.line_of(p),
        });
        start += duration;
    }
    if !phases.iter().any(|p| p.measure) {
        return Err(src.at(
            &raw.phase[0],
            "phase",
            "no phase is measured: results and objectives need at least one phase with \
             measure = true",
        ));
    }
    Ok(phases)
}

fn build_agents(src: &Source, raw: &[Spanned<raw::RawAgent>]) -> Result<Vec<PlanAgent>, PlanError> {
    let mut out: Vec<PlanAgent> = Vec::new();
    for (i, a) in raw.iter().enumerate() {
        let r = a.get_ref();
        let what = label("agent", Some(r.name.get_ref()), i);
        check_name(src, &r.name, &what)?;
        if let Some(prev) = out.iter().find(|p| &p.name == r.name.get_ref()) {
            return Err(src.at(
                &r.name,
                format!("{what}: name"),
                format!(
                    "an agent of this name is already given on line {}",
                    prev.line
                ),
            ));
        }
        let addr = r.address.get_ref();
        let port_ok = addr.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
        });
        if !port_ok {
            return Err(src.at(
                &r.address,
                format!("{what}: address"),
                format!("'{addr}' is not host:port (e.g. \"10.0.0.5:7070\")"),
            ));
        }
        if let Some(prev) = out.iter().find(|p| &p.address == addr) {
            return Err(src.at(
                &r.address,
                format!("{what}: address"),
                format!(
                    "agent '{}' on line {} has the same address",
                    prev.name, prev.line
                ),
            ));
        }
        out.push(PlanAgent {
            name: r.name.get_ref().clone(),
            address: addr.clone(),
            labels: r.labels.clone(),
            line: src.line_of(a),
        });
    }
    Ok(out)
}

fn build_roles(
    src: &Source,
    raw: &[Spanned<raw::RawRole>],
    agents: &[PlanAgent],
    run_length: Duration,
) -> Result<Vec<Role>, PlanError> {
    if raw.is_empty() {
        return Err(src.error(
            0,
            "role",
            "the plan has no [[role]]: a role says which workload runs on which volumes",
        ));
    }
    let mut roles: Vec<Role> = Vec::new();
    for (i, r) in raw.iter().enumerate() {
        let rr = r.get_ref();
        let what = label("role", Some(rr.name.get_ref()), i);
        check_name(src, &rr.name, &what)?;
        if rr.name.get_ref().eq_ignore_ascii_case("global") {
            return Err(src.at(
                &rr.name,
                format!("{what}: name"),
                "'global' is fio's section for shared options; pick another role name",
            ));
        }
        if let Some(prev) = roles.iter().find(|p| &p.name == rr.name.get_ref()) {
            return Err(src.at(
                &rr.name,
                format!("{what}: name"),
                format!(
                    "a role of this name is already defined on line {}",
                    prev.line
                ),
            ));
        }
        let line = src.line_of(r);
        let (select, select_line) = match &rr.select {
            None => (Selector::All, line),
            Some(s) => (
                build_selector(src, s, &format!("{what}: select"), agents)?,
                src.line_of(s),
            ),
        };
        let (volumes, volumes_line) = match &rr.volumes {
            None => (None, line),
            Some(v) => {
                let names = v.get_ref().clone();
                if names.is_empty() {
                    return Err(src.at(
                        v,
                        format!("{what}: volumes"),
                        "is empty: leave it out to use every volume of the selected agents",
                    ));
                }
                if let Some(dup) = first_duplicate(&names) {
                    return Err(src.at(
                        v,
                        format!("{what}: volumes"),
                        format!("'{dup}' is listed twice"),
                    ));
                }
                (Some(names), src.line_of(v))
            }
        };
        let rate_iops = match &rr.rate_iops {
            Some(rate) if *rate.get_ref() == 0 => {
                return Err(src.at(
                    rate,
                    format!("{what}: rate_iops"),
                    "must be at least 1 (leave it out for a closed-loop run)",
                ));
            }
            Some(rate) => Some(*rate.get_ref()),
            None => None,
        };
        let workload = workload::build(
            src,
            &what,
            rr.name.get_ref(),
            &rr.workload,
            rr.rate_iops.as_ref(),
            run_length,
        )?;
        let rate_curve = match &rr.rate_curve {
            None => None,
            Some(c) => {
                let field = format!("{what}: rate_curve");
                if rr.rate_iops.is_some() {
                    return Err(src.at(c, field, "give rate_iops or rate_curve, not both: the curve sets the rate of each step"));
                }
                let points = c.get_ref();
                if points.is_empty() || points.len() > 20 {
                    return Err(src.at(c, field, "needs 1 to 20 percentages of the maximum rate, e.g. [10, 50, 70, 80, 90, 100]"));
                }
                if let Some(p) = points
                    .iter()
                    .find(|p| !(p.is_finite() && **p > 0.0 && **p <= 100.0))
                {
                    return Err(src.at(c, field, format!("{p} is not a percentage in (0, 100]")));
                }
                // The per-volume rate of each step must split over the jobs as rate_iops would.
                workload::rate_for(&workload, 1).map_err(|m| src.at(c, field, m))?;
                Some(points.clone())
            }
        };
        let depth_sweep = build_sweep(src, &what, rr, &workload, volumes.as_deref())?;
        let mirror = build_mirror(src, &what, rr)?;
        roles.push(Role {
            name: rr.name.get_ref().clone(),
            line,
            select,
            select_line,
            volumes,
            volumes_line,
            workload,
            rate_iops,
            rate_curve,
            depth_sweep,
            mirror,
        });
    }
    check_sweeps(src, raw, &roles)?;
    check_mirrors(src, raw, &roles)?;
    Ok(roles)
}

/// A role's `mirror`, checked on its own (the target role is checked in `check_mirrors`).
fn build_mirror(src: &Source, what: &str, rr: &raw::RawRole) -> Result<Option<Mirror>, PlanError> {
    let Some(m) = &rr.mirror else {
        return Ok(None);
    };
    let raw = m.get_ref();
    let field = format!("{what}: mirror");
    let sync = match raw.mode.as_deref() {
        None | Some("sync") => true,
        Some("async") => false,
        Some(other) => {
            return Err(src.at(
                m,
                format!("{field}.mode"),
                format!("'{other}' is neither \"sync\" (the default) nor \"async\""),
            ));
        }
    };
    let delay_us = raw.delay_us.unwrap_or(0);
    if delay_us > MAX_MIRROR_DELAY_US {
        return Err(src.at(
            m,
            format!("{field}.delay_us"),
            format!("{delay_us} is more than {MAX_MIRROR_DELAY_US} (1 s)"),
        ));
    }
    let failover_after = raw.failover_after.as_ref().map(|d| d.0);
    if let Some(d) = failover_after {
        if !sync {
            return Err(src.at(
                m,
                format!("{field}.failover_after"),
                "only applies to mode = \"sync\": an async mirror never holds a write",
            ));
        }
        if d < Duration::from_millis(1) {
            return Err(src.at(
                m,
                format!("{field}.failover_after"),
                "must be at least 1ms (leave it out to never fail over)",
            ));
        }
    }
    if raw.to == *rr.name.get_ref() {
        return Err(src.at(
            m,
            format!("{field}.to"),
            "names the role itself: a role mirrors to another role's volumes",
        ));
    }
    Ok(Some(Mirror {
        to: raw.to.clone(),
        sync,
        delay_us,
        failover_after,
        catch_up: raw.catch_up.unwrap_or(true),
        line: src.line_of(m),
    }))
}

/// Every `mirror.to` names a role of the plan.
fn check_mirrors(
    src: &Source,
    raw: &[Spanned<raw::RawRole>],
    roles: &[Role],
) -> Result<(), PlanError> {
    for (r, rr) in roles.iter().zip(raw) {
        let (Some(m), Some(span)) = (&r.mirror, &rr.get_ref().mirror) else {
            continue;
        };
        if !roles.iter().any(|o| o.name == m.to) {
            let known: Vec<&str> = roles
                .iter()
                .filter(|o| o.name != r.name)
                .map(|o| o.name.as_str())
                .collect();
            return Err(src.at(
                span,
                format!("{}: mirror.to", label("role", Some(&r.name), 0)),
                format!(
                    "no role '{}' in the plan (roles: {})",
                    m.to,
                    known.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// A role's sweep: `sweep = { over, values }`, or the older `depth_sweep` (with `sweep_over`).
fn build_sweep(
    src: &Source,
    what: &str,
    rr: &raw::RawRole,
    workload: &Workload,
    volumes: Option<&[String]>,
) -> Result<Option<DepthSweep>, PlanError> {
    let (line, field, over, given) = match (&rr.sweep, &rr.depth_sweep) {
        (Some(sw), Some(_)) => {
            return Err(src.at(
                sw,
                format!("{what}: sweep"),
                "give sweep or depth_sweep, not both (depth_sweep = [...] is sweep = { over = \
                 \"iodepth\", values = [...] })",
            ));
        }
        (Some(sw), None) => {
            if let Some(o) = &rr.sweep_over {
                return Err(src.at(
                    o,
                    format!("{what}: sweep_over"),
                    "goes with depth_sweep; with sweep, say over = \"...\" inside it",
                ));
            }
            let raw = sw.get_ref();
            let over = SweepOver::parse(&raw.over).ok_or_else(|| {
                src.at(
                    sw,
                    format!("{what}: sweep.over"),
                    format!(
                        "'{}' is not something a sweep varies: \"volumes\" (how many of each \
                         agent's volumes run the workload), \"numjobs\", \"iodepth\" or \
                         \"rate_iops\"",
                        raw.over
                    ),
                )
            })?;
            (
                src.line_of(sw),
                format!("{what}: sweep.values"),
                over,
                &raw.values,
            )
        }
        (None, Some(list)) => {
            let over = match &rr.sweep_over {
                None => SweepOver::default(),
                Some(o) => match o.get_ref().as_str() {
                    "iodepth" => SweepOver::Iodepth,
                    "numjobs" => SweepOver::Numjobs,
                    other => {
                        return Err(src.at(
                            o,
                            format!("{what}: sweep_over"),
                            format!(
                                "'{other}' is neither \"iodepth\" (each job's queue depth, the \
                                 default) nor \"numjobs\" (clones of each job at its iodepth: \
                                 vdbench's threads); for volumes or rate_iops write sweep = {{ \
                                 over = \"volumes\", values = [...] }}"
                            ),
                        ));
                    }
                },
            };
            (
                src.line_of(list),
                format!("{what}: depth_sweep"),
                over,
                list.get_ref(),
            )
        }
        (None, None) => {
            return match &rr.sweep_over {
                Some(o) => Err(src.at(
                    o,
                    format!("{what}: sweep_over"),
                    "says what depth_sweep varies: give depth_sweep = [1, 2, 4, ...] too",
                )),
                None => Ok(None),
            };
        }
    };
    let err = |message: String| src.error(line, &field, message);
    let key = if rr.sweep.is_some() {
        "sweep"
    } else {
        "depth_sweep"
    };
    check_sweep_mode(rr, key, over).map_err(err)?;
    let values = sweep_values(over, given).map_err(err)?;
    if let (SweepOver::Volumes, Some(names)) = (over, volumes)
        && let Some(&v) = values.iter().find(|&&v| v as usize > names.len())
    {
        return Err(err(format!(
            "asks for {v} volumes, but the role's volumes list has {}: list more or leave \
             volumes out to use every volume of the selected agents",
            names.len()
        )));
    }
    check_sweep_steps(workload, over, &values).map_err(err)?;
    Ok(Some(DepthSweep { over, values }))
}

/// What a sweep (`key`: `sweep` or `depth_sweep`) cannot be combined with.
fn check_sweep_mode(rr: &raw::RawRole, key: &str, over: SweepOver) -> Result<(), String> {
    if rr.rate_curve.is_some() {
        return Err(format!(
            "give rate_curve or {key}, not both: each is a series of runs of its own"
        ));
    }
    match over {
        SweepOver::Iodepth | SweepOver::Numjobs if rr.rate_iops.is_some() => Err(format!(
            "give rate_iops or {key}, not both: a depth sweep runs closed loop, each step with \
             as many IOs in flight as it allows (IOPS = outstanding / latency), and a rate would \
             cap it"
        )),
        SweepOver::RateIops if rr.rate_iops.is_some() => Err(
            "give rate_iops or a rate_iops sweep, not both: the sweep sets each step's rate".into(),
        ),
        _ => Ok(()),
    }
}

/// The values of a sweep: at least 1, at most `over.max_value()`, increasing, no duplicates.
fn sweep_values(over: SweepOver, given: &[i64]) -> Result<Vec<u32>, String> {
    let name = over.option();
    let max = over.max_value();
    if given.is_empty() || given.len() > MAX_SWEEP_STEPS {
        return Err(format!(
            "needs 1 to {MAX_SWEEP_STEPS} values of {name}, e.g. [1, 2, 4, 8, 16, 32] (each is a \
             complete run)"
        ));
    }
    let mut values: Vec<u32> = Vec::with_capacity(given.len());
    for &v in given {
        if v < 1 {
            return Err(format!(
                "{v} is not a usable {name}: every value must be at least 1"
            ));
        }
        if v > i64::from(max) {
            return Err(format!(
                "{v} is more than {max}, the largest {name} a step may ask for"
            ));
        }
        let v = v as u32;
        if values.contains(&v) {
            return Err(format!("{v} is listed twice"));
        }
        if let Some(&prev) = values.last().filter(|&&p| p > v) {
            return Err(format!(
                "list the values in increasing order ({v} comes after {prev}): each step is \
                 compared with the one before"
            ));
        }
        values.push(v);
    }
    Ok(values)
}

/// Every step as the agent will parse it: a value the agent refuses is refused here.
fn check_sweep_steps(workload: &Workload, over: SweepOver, values: &[u32]) -> Result<(), String> {
    let name = over.option();
    for &v in values {
        match over {
            SweepOver::Iodepth | SweepOver::Numjobs => {
                let jobs = jobs_at(workload, over, v).map_err(|m| format!("at {name} {v}: {m}"))?;
                if jobs.iter().any(|j| j.rate.is_limited()) {
                    return Err(
                        "the workload sets a rate (rate or rate_iops in its jobs): a \
                                depth sweep runs closed loop, so remove the rate"
                            .into(),
                    );
                }
            }
            SweepOver::RateIops => {
                workload::rate_for(workload, u64::from(v))
                    .map_err(|m| format!("at rate_iops {v}: {m}"))?;
            }
            SweepOver::Volumes => {}
        }
    }
    Ok(())
}

/// Checks across roles: one multi-run mode per plan, and sweeps that step together.
fn check_sweeps(
    src: &Source,
    raw: &[Spanned<raw::RawRole>],
    roles: &[Role],
) -> Result<(), PlanError> {
    let curve = roles.iter().find(|r| r.rate_curve.is_some());
    let mut first: Option<(&Role, usize)> = None;
    for (r, rr) in roles.iter().zip(raw) {
        let Some(sweep) = &r.depth_sweep else {
            continue;
        };
        let rr = rr.get_ref();
        let (line, key) = match (&rr.sweep, &rr.depth_sweep) {
            (Some(sw), _) => (src.line_of(sw), "sweep"),
            (None, Some(list)) => (src.line_of(list), "depth_sweep"),
            (None, None) => (r.line, "sweep"),
        };
        let field = format!("{}: {key}", label("role", Some(&r.name), 0));
        if let Some(c) = curve {
            return Err(src.error(
                line,
                field,
                format!(
                    "role '{}' on line {} has a rate_curve: a plan runs a rate curve or a depth \
                     sweep, not both",
                    c.name, c.line
                ),
            ));
        }
        match first {
            None => first = Some((r, sweep.values.len())),
            Some((f, n)) if n != sweep.values.len() => {
                return Err(src.error(
                    line,
                    field,
                    format!(
                        "has {} values and role '{}' on line {} has {n}: the roles' sweeps run \
                         side by side, one step per value, so give them as many values",
                        sweep.values.len(),
                        f.name,
                        f.line
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

fn build_selector(
    src: &Source,
    s: &Spanned<raw::RawSelect>,
    what: &str,
    agents: &[PlanAgent],
) -> Result<Selector, PlanError> {
    match (&s.get_ref().agents, &s.get_ref().labels) {
        (Some(_), Some(_)) => Err(src.at(
            s,
            what,
            "give agents or labels, not both (an agent list already says exactly which agents)",
        )),
        (Some(names), None) => {
            if names.is_empty() {
                return Err(src.at(
                    s,
                    what,
                    "agents is empty: leave select out to use every agent",
                ));
            }
            let names: Vec<String> = names.clone();
            if let Some(dup) = first_duplicate(&names) {
                return Err(src.at(s, what, format!("agent '{dup}' is listed twice")));
            }
            check_plan_agents(src, s, what, &names, agents)?;
            Ok(Selector::Agents(names))
        }
        (None, Some(labels)) => {
            if labels.is_empty() {
                return Err(src.at(
                    s,
                    what,
                    "labels is empty: leave select out to use every agent",
                ));
            }
            Ok(Selector::Labels(labels.clone()))
        }
        (None, None) => Err(src.at(
            s,
            what,
            "give agents = [...] or labels = { ... } (leave select out to use every agent)",
        )),
    }
}

fn first_duplicate(names: &[String]) -> Option<&str> {
    let mut seen = BTreeSet::new();
    names
        .iter()
        .find(|n| !seen.insert(n.as_str()))
        .map(String::as_str)
}

fn build_objective(
    src: &Source,
    index: usize,
    o: &Spanned<raw::RawObjective>,
    roles: &[Role],
) -> Result<Objective, PlanError> {
    let r = o.get_ref();
    let what = format!("objective #{}", index + 1);
    let metric = Metric::parse(r.metric.get_ref()).ok_or_else(|| {
        src.at(
            &r.metric,
            format!("{what}: metric"),
            format!(
                "unknown metric '{}' (known: p50, p90, p99, p99.9 or any pN, mean, max, \
                 iops_min, mbps_min)",
                r.metric.get_ref()
            ),
        )
    })?;
    let what = format!("objective #{} ({metric})", index + 1);
    let threshold = match (metric.is_latency(), &r.below, &r.above) {
        (_, Some(_), Some(b)) => {
            return Err(src.at(b, &what, "give below or above, not both"));
        }
        (true, Some(below), None) => {
            let text = below.get_ref().as_str().ok_or_else(|| {
                src.at(
                    below,
                    format!("{what}: below"),
                    "give a latency with its unit, e.g. below = \"5ms\"",
                )
            })?;
            let d = parse_duration(text).map_err(|m| src.at(below, format!("{what}: below"), m))?;
            if d.is_zero() {
                return Err(src.at(below, format!("{what}: below"), "no latency is below 0s"));
            }
            Threshold::LatencyBelowNs(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        }
        (false, None, Some(above)) => {
            let v = match above.get_ref() {
                toml::Value::Integer(i) => *i as f64,
                toml::Value::Float(f) => *f,
                _ => {
                    return Err(src.at(
                        above,
                        format!("{what}: above"),
                        "give a number, e.g. above = 1000",
                    ));
                }
            };
            if !(v.is_finite() && v > 0.0) {
                return Err(src.at(above, format!("{what}: above"), "must be a positive number"));
            }
            match metric {
                Metric::IopsMin => Threshold::IopsAtLeast(v),
                _ => Threshold::BytesPerSecAtLeast(v * 1e6),
            }
        }
        (true, None, Some(above)) => {
            return Err(src.at(
                above,
                &what,
                "a latency objective is an upper bound: write below = \"5ms\"",
            ));
        }
        (false, Some(below), None) => {
            return Err(src.at(
                below,
                &what,
                "a throughput objective is a lower bound: write above = 1000",
            ));
        }
        (latency, None, None) => {
            let hint = if latency {
                "below = \"5ms\""
            } else {
                "above = 1000"
            };
            return Err(src.at(o, &what, format!("missing its bound: add {hint}")));
        }
    };
    let direction = match r.direction {
        None | Some(raw::RawDirection::Any) => None,
        Some(raw::RawDirection::Read) => Some(Direction::Read),
        Some(raw::RawDirection::Write) => Some(Direction::Write),
    };
    let scope = match r.scope {
        None | Some(raw::RawScope::Volume) => Scope::Volume,
        Some(raw::RawScope::Node) => Scope::Node,
        Some(raw::RawScope::Cluster) => Scope::Cluster,
    };
    let role = match &r.role {
        None => None,
        Some(name) => {
            if !roles.iter().any(|x| &x.name == name.get_ref()) {
                return Err(src.at(
                    name,
                    format!("{what}: role"),
                    format!(
                        "unknown role '{}' (roles: {})",
                        name.get_ref(),
                        role_names(roles)
                    ),
                ));
            }
            Some(name.get_ref().clone())
        }
    };
    Ok(Objective {
        metric,
        direction,
        threshold,
        scope,
        role,
        line: src.line_of(o),
    })
}

fn role_names(roles: &[Role]) -> String {
    roles
        .iter()
        .map(|r| r.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Keys of a `[[fault]]` table that lockstep reads itself; every other key is the FaultSpec's.
const FAULT_KEYS: [&str; 5] = ["name", "at", "duration", "phase", "target"];

fn build_fault(
    src: &Source,
    index: usize,
    f: &Spanned<raw::RawFault>,
    phases: &[Phase],
    roles: &[Role],
    agents: &[PlanAgent],
    run_end: Duration,
) -> Result<Fault, PlanError> {
    let table = f.get_ref();
    let name = match table.get("name") {
        None => None,
        Some(v) => match v.get_ref() {
            toml::Value::String(s) => Some(s.clone()),
            _ => {
                return Err(src.at(v, format!("fault #{}: name", index + 1), "must be a string"));
            }
        },
    };
    let what = label("fault", name.as_deref(), index);
    let string_of = |key: &str| -> Result<Option<(&Spanned<toml::Value>, &str)>, PlanError> {
        match table.get(key) {
            None => Ok(None),
            Some(v) => match v.get_ref() {
                toml::Value::String(s) => Ok(Some((v, s.as_str()))),
                other => Err(src.at(
                    v,
                    format!("{what}: {key}"),
                    format!("must be a string, not {}", other.type_str()),
                )),
            },
        }
    };
    let duration_of = |key: &str| -> Result<Option<(usize, Duration)>, PlanError> {
        match string_of(key)? {
            None => Ok(None),
            Some((v, s)) => parse_duration(s)
                .and_then(|d| check_whole_millis(d).map(|()| d))
                .map(|d| Some((src.line_of(v), d)))
                .map_err(|m| src.at(v, format!("{what}: {key}"), m)),
        }
    };

    let Some((kind_span, kind)) = string_of("kind")? else {
        return Err(src.at(
            f,
            &what,
            "missing kind: say which fault to inject (e.g. kind = \"iops_cap\", \"ebs\", \"stall\")",
        ));
    };
    if kind.is_empty() {
        return Err(src.at(kind_span, format!("{what}: kind"), "is empty"));
    }
    let Some((at_line, offset)) = duration_of("at")? else {
        return Err(src.at(
            f,
            &what,
            "missing at: when the fault starts, e.g. at = \"20s\"",
        ));
    };
    let duration = match duration_of("duration")? {
        Some((line, d)) if d.is_zero() => {
            return Err(src.error(
                line,
                format!("{what}: duration"),
                "must be longer than 0s (leave it out for the rest of the run)",
            ));
        }
        Some((_, d)) => Some(d),
        None => None,
    };
    let (phase, base) = match string_of("phase")? {
        None => (None, Duration::ZERO),
        Some((v, p)) => match phases.iter().find(|x| x.name == p) {
            Some(x) => (Some(p.to_string()), x.start),
            None => {
                let known: Vec<&str> = phases.iter().map(|x| x.name.as_str()).collect();
                return Err(src.at(
                    v,
                    format!("{what}: phase"),
                    format!("unknown phase '{p}' (phases: {})", known.join(", ")),
                ));
            }
        },
    };
    let at = base + offset;
    if at >= run_end {
        return Err(src.error(
            at_line,
            format!("{what}: at"),
            format!(
                "starts at {} from the run's start, but the run ends at {}",
                format_duration(at),
                format_duration(run_end)
            ),
        ));
    }
    let target_line = table
        .get("target")
        .map_or(src.line_of(f), |t| src.line_of(t));
    let target = match table.get("target") {
        None => {
            return Err(src.at(
                f,
                &what,
                "missing target: say where to inject it, e.g. target = { agents = [\"agent-3\"] } \
                 (target = {} means every volume)",
            ));
        }
        Some(v) => build_fault_target(src, &format!("{what}: target"), v, roles, agents)?,
    };
    let mut spec = serde_json::Map::new();
    for (key, value) in table {
        if FAULT_KEYS.contains(&key.as_str()) {
            continue;
        }
        let json = serde_json::to_value(value.get_ref()).map_err(|e| {
            src.at(
                value,
                format!("{what}: {key}"),
                format!("cannot be sent to the agent: {e}"),
            )
        })?;
        spec.insert(key.clone(), json);
    }
    let spec = fault_spec(src, &what, f, spec, at, duration)?;
    Ok(Fault {
        label: what,
        line: src.line_of(f),
        at,
        duration,
        phase,
        target,
        target_line,
        kind: kind.to_string(),
        spec,
    })
}

fn build_fault_target(
    src: &Source,
    what: &str,
    v: &Spanned<toml::Value>,
    roles: &[Role],
    agents: &[PlanAgent],
) -> Result<FaultTarget, PlanError> {
    let raw: raw::RawTarget = v
        .get_ref()
        .clone()
        .try_into()
        .map_err(|e: toml::de::Error| src.at(v, what, e.message().to_string()))?;
    if raw.agents.is_some() && raw.labels.is_some() {
        return Err(src.at(v, what, "give agents or labels, not both"));
    }
    for (key, list) in [("agents", &raw.agents), ("volumes", &raw.volumes)] {
        if let Some(list) = list {
            if list.is_empty() {
                return Err(src.at(v, what, format!("{key} is empty: leave it out to mean all")));
            }
            if let Some(dup) = first_duplicate(list) {
                return Err(src.at(v, what, format!("{key}: '{dup}' is listed twice")));
            }
        }
    }
    if let Some(role) = raw
        .role
        .as_ref()
        .filter(|&r| !roles.iter().any(|x| &x.name == r))
    {
        return Err(src.at(
            v,
            what,
            format!("unknown role '{role}' (roles: {})", role_names(roles)),
        ));
    }
    if let Some(names) = &raw.agents {
        check_plan_agents(src, v, what, names, agents)?;
    }
    Ok(FaultTarget {
        agents: raw.agents,
        labels: raw.labels,
        role: raw.role,
        volumes: raw.volumes,
    })
}

/// Agent names can be checked at parse time when the plan lists its agents; otherwise (--local,
/// etcd) `resolve` checks them against the agents of the run.
fn check_plan_agents<T>(
    src: &Source,
    at: &Spanned<T>,
    what: &str,
    names: &[String],
    agents: &[PlanAgent],
) -> Result<(), PlanError> {
    if agents.is_empty() {
        return Ok(());
    }
    match names.iter().find(|n| !agents.iter().any(|a| &a.name == *n)) {
        None => Ok(()),
        Some(unknown) => {
            let known: Vec<&str> = agents.iter().map(|a| a.name.as_str()).collect();
            Err(src.at(
                at,
                what,
                format!(
                    "unknown agent '{unknown}' (the plan's agents: {})",
                    known.join(", ")
                ),
            ))
        }
    }
}

/// Builds a fault's typed `FaultSpec` from its payload and checks it (shape, then values), so
/// a misspelt field or an impossible volume is refused with the plan line of the key at fault.
fn fault_spec(
    src: &Source,
    what: &str,
    f: &Spanned<raw::RawFault>,
    spec: serde_json::Map<String, serde_json::Value>,
    at: Duration,
    duration: Option<Duration>,
) -> Result<FaultSpec, PlanError> {
    let mut wire = spec;
    wire.insert("at_ms".to_string(), (at.as_millis() as u64).into());
    if let Some(d) = duration {
        wire.insert("duration_ms".to_string(), (d.as_millis() as u64).into());
    }
    // The key a message is about: its line when the table has it, else the fault's.
    let located = |key: &str, message: String| match f.get_ref().get(key) {
        Some(v) => src.at(v, format!("{what}: {key}"), message),
        None => src.at(f, what, message),
    };
    let parsed: FaultSpec =
        serde_json::from_value(serde_json::Value::Object(wire)).map_err(|e| {
            let message = e.to_string();
            let key = if message.starts_with("unknown variant") {
                Some("kind".to_string())
            } else {
                // serde names the field in backquotes: "unknown field `fration`".
                message
                    .split('`')
                    .nth(1)
                    .filter(|k| f.get_ref().contains_key(*k))
                    .map(str::to_string)
            };
            match key {
                Some(key) => located(&key, message),
                None => src.at(f, what, message),
            }
        })?;
    parsed.validate().map_err(|e| {
        // A rule about several fields ("read/write/total") points at the first one given.
        let key = e
            .field
            .split(['/', '.'])
            .find(|k| f.get_ref().contains_key(*k))
            .unwrap_or("kind");
        located(key, e.to_string())
    })?;
    Ok(parsed)
}
