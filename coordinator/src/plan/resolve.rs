//! A plan bound to the agents of a run: who runs what, on which volume, with which faults.
//!
//! The agents come from wherever the run found them (the plan's `[[agent]]` list after each
//! answered its hello, `--local N`, or etcd), so names that only mean something against real
//! agents are checked here: agents, volumes, label selectors, and that no volume is claimed by
//! two roles (a volume runs one workload; two would make both roles' results meaningless).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use lockstep_core::fault::FaultSpec;

use super::{Fault, Objective, Phase, Plan, PlanError, Selector};

/// An agent of the run, as it described itself (plus the plan's labels for it).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct AgentInfo {
    pub name: String,
    /// `host:port` the coordinator reaches it at.
    pub address: String,
    pub labels: BTreeMap<String, String>,
    pub volumes: Vec<AgentVolume>,
}

/// A volume an agent may test, with what is known about it (for reports and forecasts).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct AgentVolume {
    /// The name plans use ("data"); unique per agent.
    pub name: String,
    /// Directory, file or block device on the agent's host.
    pub path: PathBuf,
    pub size_bytes: u64,
    /// gp2, gp3, io1, io2, st1, sc1, local, or empty when unknown.
    pub kind: String,
    pub provisioned_iops: Option<u64>,
    pub provisioned_mib_s: Option<u64>,
}

/// Everything the coordinator sends out and checks against, for one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Assignment {
    /// The plan's name.
    pub plan: String,
    pub interval: Duration,
    /// The plan's `histogram_digits`.
    pub histogram_digits: u8,
    pub phases: Vec<Phase>,
    pub objectives: Vec<Objective>,
    /// Agents with at least one volume of work, in the order they were given. Agents the plan
    /// gives nothing to do are left out: they are not part of the run.
    pub agents: Vec<AgentAssignment>,
    /// The fault schedule in plan order, each with the volumes it hits (for the timeline and
    /// for faults the coordinator injects itself, such as killing an agent).
    pub faults: Vec<ScheduledFault>,
}

impl Assignment {
    /// From the synchronized start to the end of the last phase.
    pub fn run_length(&self) -> Duration {
        self.phases.last().map_or(Duration::ZERO, Phase::end)
    }

    /// Every volume with work, with its agent.
    pub fn volumes(&self) -> impl Iterator<Item = (&AgentAssignment, &VolumeAssignment)> {
        self.agents
            .iter()
            .flat_map(|a| a.volumes.iter().map(move |v| (a, v)))
    }
}

/// One agent's part of the run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentAssignment {
    pub agent: String,
    pub address: String,
    /// The agent's labels with the plan's on top (what selectors matched against).
    pub labels: BTreeMap<String, String>,
    pub volumes: Vec<VolumeAssignment>,
}

/// One volume's work: what the agent's `Prepare` needs for it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VolumeAssignment {
    pub volume: AgentVolume,
    /// Volumes of one role are peers for the chokepoint finder.
    pub role: String,
    /// fio job text; the agent confines its jobs to `volume`.
    pub job_text: String,
    /// Applied on top of every job of `job_text` (see `Workload::overrides`).
    pub overrides: BTreeMap<String, String>,
    /// The role's open-loop target for this volume, if any (already in `overrides`; here for
    /// reports, which compare achieved with target).
    pub rate_iops: Option<u64>,
    pub faults: Vec<FaultAssignment>,
    /// Where this volume's writes are mirrored, when its role has a `mirror`.
    pub mirror: Option<MirrorAssignment>,
}

/// A primary volume's backup: the paired agent (by its address, which the primary dials) and
/// volume, and how the role mirrors.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MirrorAssignment {
    pub backup_agent: String,
    pub backup_address: String,
    pub backup_volume: String,
    pub sync: bool,
    pub delay_us: u64,
    pub failover_after: Option<Duration>,
    pub catch_up: bool,
}

impl MirrorAssignment {
    /// The message the protocol carries (`VolumeWork.mirror`).
    pub fn wire(&self) -> lockstep_proto::v1::MirrorTarget {
        lockstep_proto::v1::MirrorTarget {
            backup_agent: self.backup_agent.clone(),
            backup_address: self.backup_address.clone(),
            backup_volume: self.backup_volume.clone(),
            sync: self.sync,
            delay_us: self.delay_us,
            failover_after_ms: self.failover_after.map_or(0, millis),
            no_catch_up: !self.catch_up,
        }
    }
}

impl VolumeAssignment {
    /// `overrides` with `runtime` set to `runtime`, for a coordinator that starts each phase
    /// separately (behind a barrier) rather than the whole run at once.
    pub fn overrides_for(&self, runtime: Duration) -> BTreeMap<String, String> {
        let mut o = self.overrides.clone();
        o.insert("runtime".to_string(), super::workload::fio_time(runtime));
        o
    }
}

/// A fault as one volume's agent injects it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FaultAssignment {
    /// Index in the plan's fault schedule (and `Assignment::faults`).
    pub index: usize,
    /// `fault 'name'` or `fault #n`, for messages and the timeline.
    pub label: String,
    pub kind: String,
    /// Offset from the run's synchronized start.
    pub at: Duration,
    /// `None`: until the end of the run.
    pub duration: Option<Duration>,
    /// The typed spec the plan built.
    pub spec: FaultSpec,
}

impl FaultAssignment {
    /// The spec as the agent runs it: its window is this assignment's `at` and `duration`
    /// (absent: until the end of the run).
    pub fn scheduled_spec(&self) -> FaultSpec {
        self.spec
            .clone()
            .window_ms(millis(self.at), self.duration.map(millis))
    }

    /// The message the protocol carries (`VolumeWork.faults`).
    pub fn wire(&self) -> lockstep_proto::v1::Fault {
        lockstep_proto::v1::Fault::from(&self.scheduled_spec())
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A fault of the schedule with every volume it hits.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScheduledFault {
    pub fault: FaultAssignment,
    /// Plan line of the `[[fault]]`.
    pub line: usize,
    pub targets: Vec<VolumeRef>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct VolumeRef {
    pub agent: String,
    pub volume: String,
}

/// At most this many agents are listed in a message; a 1,000-agent list helps nobody.
const LIST_LIMIT: usize = 8;

/// An error at a plan line (0: the plan as a whole).
fn invalid(plan: &Plan, line: usize, field: &str, message: String) -> PlanError {
    PlanError::Invalid {
        file: plan.origin.clone(),
        line,
        field: field.to_string(),
        message,
    }
}

/// (agent index, volume index) -> role index.
type Owners = BTreeMap<(usize, usize), usize>;

/// (agent index, volume index) -> the faults scheduled on that volume.
type FaultsOf = BTreeMap<(usize, usize), Vec<FaultAssignment>>;

/// Binds `plan` to the agents of a run. Errors name the plan line of the role or fault whose
/// selection fails.
pub fn resolve(plan: &Plan, agents: &[AgentInfo]) -> Result<Assignment, PlanError> {
    check_agents(plan, agents)?;
    let labels: Vec<BTreeMap<String, String>> = agents
        .iter()
        .map(|a| {
            let mut l = a.labels.clone();
            if let Some(p) = plan.agents.iter().find(|p| p.name == a.name) {
                l.extend(p.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            l
        })
        .collect();
    let owner = assign_roles(plan, agents, &labels)?;
    let (mut faults_of, schedule) = assign_faults(plan, agents, &labels, &owner)?;
    let mut out_agents = Vec::new();
    for (ai, agent) in agents.iter().enumerate() {
        let volumes: Vec<VolumeAssignment> = agent
            .volumes
            .iter()
            .enumerate()
            .filter_map(|(vi, v)| {
                let role = &plan.roles[*owner.get(&(ai, vi))?];
                Some(VolumeAssignment {
                    volume: v.clone(),
                    role: role.name.clone(),
                    job_text: role.workload.job_text.clone(),
                    overrides: role.workload.overrides.clone(),
                    rate_iops: role.rate_iops,
                    faults: faults_of.remove(&(ai, vi)).unwrap_or_default(),
                    mirror: None,
                })
            })
            .collect();
        if !volumes.is_empty() {
            out_agents.push(AgentAssignment {
                agent: agent.name.clone(),
                address: agent.address.clone(),
                labels: labels[ai].clone(),
                volumes,
            });
        }
    }
    assign_mirrors(plan, &mut out_agents)?;
    Ok(Assignment {
        plan: plan.name.clone(),
        interval: plan.interval,
        histogram_digits: plan.histogram_digits,
        phases: plan.phases.clone(),
        objectives: plan.objectives.clone(),
        agents: out_agents,
        faults: schedule,
    })
}

/// Pairs each mirroring role's volumes with its backup role's: the i-th agent of the one with
/// the i-th agent of the other (in the order the run lists them), and on each pair the j-th
/// volume with the j-th. Mismatched counts are refused: a volume without a backup, or a backup
/// taking two primaries, is not the pair the plan describes.
fn assign_mirrors(plan: &Plan, agents: &mut [AgentAssignment]) -> Result<(), PlanError> {
    for role in plan.roles.iter() {
        let Some(m) = &role.mirror else { continue };
        let field = format!("role '{}': mirror", role.name);
        // Per agent of each role: (agent index, volume indices).
        let of_role = |name: &str| -> Vec<(usize, Vec<usize>)> {
            agents
                .iter()
                .enumerate()
                .filter_map(|(ai, a)| {
                    let vs: Vec<usize> = (0..a.volumes.len())
                        .filter(|&vi| a.volumes[vi].role == name)
                        .collect();
                    (!vs.is_empty()).then_some((ai, vs))
                })
                .collect()
        };
        let primaries = of_role(&role.name);
        let backups = of_role(&m.to);
        if primaries.len() != backups.len() {
            return Err(invalid(
                plan,
                m.line,
                &field,
                format!(
                    "role '{}' runs on {} agent(s) and its backup role '{}' on {}: a mirror \
                     pairs agent i of one with agent i of the other, so they need as many",
                    role.name,
                    primaries.len(),
                    m.to,
                    backups.len()
                ),
            ));
        }
        for ((pa, pvs), (ba, bvs)) in primaries.iter().zip(&backups) {
            let (pa, ba) = (*pa, *ba);
            if pvs.len() != bvs.len() {
                return Err(invalid(
                    plan,
                    m.line,
                    &field,
                    format!(
                        "agent '{}' has {} volume(s) of role '{}' and its backup '{}' has {} of \
                         role '{}': each volume needs one backup volume",
                        agents[pa].agent,
                        pvs.len(),
                        role.name,
                        agents[ba].agent,
                        bvs.len(),
                        m.to
                    ),
                ));
            }
            for (&pv, &bv) in pvs.iter().zip(bvs) {
                let target = MirrorAssignment {
                    backup_agent: agents[ba].agent.clone(),
                    backup_address: agents[ba].address.clone(),
                    backup_volume: agents[ba].volumes[bv].volume.name.clone(),
                    sync: m.sync,
                    delay_us: m.delay_us,
                    failover_after: m.failover_after,
                    catch_up: m.catch_up,
                };
                agents[pa].volumes[pv].mirror = Some(target);
            }
        }
    }
    Ok(())
}

/// A run needs agents, with unique names and unique volume names per agent.
fn check_agents(plan: &Plan, agents: &[AgentInfo]) -> Result<(), PlanError> {
    if agents.is_empty() {
        return Err(invalid(
            plan,
            0,
            "agent",
            "the run has no agents: list them with [[agent]], or use --local N".to_string(),
        ));
    }
    for (i, a) in agents.iter().enumerate() {
        if agents[..i].iter().any(|b| b.name == a.name) {
            return Err(invalid(
                plan,
                0,
                "agent",
                format!(
                    "two agents of the run are named '{}'; agent names must be unique",
                    a.name
                ),
            ));
        }
        for (j, v) in a.volumes.iter().enumerate() {
            if a.volumes[..j].iter().any(|w| w.name == v.name) {
                return Err(invalid(
                    plan,
                    0,
                    "agent",
                    format!("agent '{}' reports volume '{}' twice", a.name, v.name),
                ));
            }
        }
    }
    Ok(())
}

/// Which role runs on each volume: every role selects at least one volume, and no volume is
/// selected by two roles.
fn assign_roles(
    plan: &Plan,
    agents: &[AgentInfo],
    labels: &[BTreeMap<String, String>],
) -> Result<Owners, PlanError> {
    let mut owner = Owners::new();
    for (ri, role) in plan.roles.iter().enumerate() {
        let what = format!("role '{}'", role.name);
        let selected = select(&role.select, agents, labels)
            .map_err(|m| invalid(plan, role.select_line, &format!("{what}: select"), m))?;
        let before = owner.len();
        for ai in selected {
            for vi in role_volumes(plan, role, &agents[ai])? {
                if let Some(&other) = owner.get(&(ai, vi)) {
                    let prev = &plan.roles[other];
                    return Err(invalid(
                        plan,
                        role.line,
                        &what,
                        format!(
                            "volume '{}' of agent '{}' is already selected by role '{}' (line \
                             {}): a volume runs one role's workload; narrow select or volumes",
                            agents[ai].volumes[vi].name, agents[ai].name, prev.name, prev.line
                        ),
                    ));
                }
                owner.insert((ai, vi), ri);
            }
        }
        if owner.len() == before {
            return Err(invalid(
                plan,
                role.line,
                &what,
                "selects no volume: the selected agents report none".to_string(),
            ));
        }
    }
    Ok(owner)
}

/// The indices of the volumes of `agent` a role runs on: all, or the ones it names.
fn role_volumes(
    plan: &Plan,
    role: &super::Role,
    agent: &AgentInfo,
) -> Result<Vec<usize>, PlanError> {
    let Some(names) = &role.volumes else {
        return Ok((0..agent.volumes.len()).collect());
    };
    names
        .iter()
        .map(|n| {
            agent
                .volumes
                .iter()
                .position(|v| &v.name == n)
                .ok_or_else(|| {
                    invalid(
                        plan,
                        role.volumes_line,
                        &format!("role '{}': volumes", role.name),
                        format!(
                            "agent '{}' has no volume '{n}' (its volumes: {})",
                            agent.name,
                            volume_names(agent)
                        ),
                    )
                })
        })
        .collect()
}

/// Each fault's targets: the faults per volume, and the schedule with every target named.
fn assign_faults(
    plan: &Plan,
    agents: &[AgentInfo],
    labels: &[BTreeMap<String, String>],
    owner: &Owners,
) -> Result<(FaultsOf, Vec<ScheduledFault>), PlanError> {
    let mut faults_of = FaultsOf::new();
    let mut schedule = Vec::with_capacity(plan.faults.len());
    for (fi, fault) in plan.faults.iter().enumerate() {
        let targets = fault_targets(plan, fault, agents, labels, owner).map_err(|m| {
            invalid(
                plan,
                fault.target_line,
                &format!("{}: target", fault.label),
                m,
            )
        })?;
        let assignment = FaultAssignment {
            index: fi,
            label: fault.label.clone(),
            kind: fault.kind.clone(),
            at: fault.at,
            duration: fault.duration,
            spec: fault.spec.clone(),
        };
        for &t in &targets {
            faults_of.entry(t).or_default().push(assignment.clone());
        }
        schedule.push(ScheduledFault {
            fault: assignment,
            line: fault.line,
            targets: targets
                .iter()
                .map(|&(ai, vi)| VolumeRef {
                    agent: agents[ai].name.clone(),
                    volume: agents[ai].volumes[vi].name.clone(),
                })
                .collect(),
        });
    }
    Ok((faults_of, schedule))
}

/// Indices of the agents a selector picks; an error message when it picks a name that does
/// not exist or nothing at all.
fn select(
    selector: &Selector,
    agents: &[AgentInfo],
    labels: &[BTreeMap<String, String>],
) -> Result<Vec<usize>, String> {
    let unknown = match selector {
        Selector::Agents(names) => names.iter().find(|n| !agents.iter().any(|a| &a.name == *n)),
        _ => None,
    };
    if let Some(unknown) = unknown {
        return Err(format!(
            "unknown agent '{unknown}' (agents of this run: {})",
            agent_list(agents, None)
        ));
    }
    let picked: Vec<usize> = (0..agents.len())
        .filter(|&i| selector.matches(&agents[i].name, &labels[i]))
        .collect();
    if let (true, Selector::Labels(want)) = (picked.is_empty(), selector) {
        return Err(format!(
            "labels {} match no agent (agents of this run: {})",
            format_labels(want),
            agent_list(agents, Some(labels))
        ));
    }
    Ok(picked)
}

fn fault_targets(
    plan: &Plan,
    fault: &Fault,
    agents: &[AgentInfo],
    labels: &[BTreeMap<String, String>],
    owner: &BTreeMap<(usize, usize), usize>,
) -> Result<Vec<(usize, usize)>, String> {
    let t = &fault.target;
    let selector = match (&t.agents, &t.labels) {
        (Some(names), _) => Selector::Agents(names.clone()),
        (None, Some(want)) => Selector::Labels(want.clone()),
        (None, None) => Selector::All,
    };
    let selected = select(&selector, agents, labels)?;
    let role = match &t.role {
        None => None,
        Some(name) => Some(
            plan.roles
                .iter()
                .position(|r| &r.name == name)
                .ok_or_else(|| format!("unknown role '{name}'"))?,
        ),
    };
    let mut out = Vec::new();
    for ai in selected {
        let agent = &agents[ai];
        let candidates: Vec<usize> = match &t.volumes {
            None => (0..agent.volumes.len()).collect(),
            Some(names) => {
                let mut v = Vec::new();
                for n in names {
                    let Some(vi) = agent.volumes.iter().position(|x| &x.name == n) else {
                        return Err(format!(
                            "agent '{}' has no volume '{n}' (its volumes: {})",
                            agent.name,
                            volume_names(agent)
                        ));
                    };
                    // A named volume that runs nothing is a mistake; with no names given,
                    // idle volumes are simply not targets.
                    if !owner.contains_key(&(ai, vi)) && role.is_none() {
                        return Err(format!(
                            "volume '{n}' of agent '{}' runs no workload: no role selects it",
                            agent.name
                        ));
                    }
                    v.push(vi);
                }
                v
            }
        };
        for vi in candidates {
            let Some(&r) = owner.get(&(ai, vi)) else {
                continue;
            };
            if role.is_none_or(|want| want == r) {
                out.push((ai, vi));
            }
        }
    }
    if out.is_empty() {
        return Err("hits no volume that runs a workload".to_string());
    }
    Ok(out)
}

fn volume_names(agent: &AgentInfo) -> String {
    if agent.volumes.is_empty() {
        return "none".to_string();
    }
    agent
        .volumes
        .iter()
        .map(|v| v.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn format_labels(labels: &BTreeMap<String, String>) -> String {
    let inner: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k} = \"{v}\""))
        .collect();
    format!("{{ {} }}", inner.join(", "))
}

fn agent_list(agents: &[AgentInfo], labels: Option<&[BTreeMap<String, String>]>) -> String {
    let mut parts: Vec<String> = agents
        .iter()
        .enumerate()
        .take(LIST_LIMIT)
        .map(|(i, a)| match labels {
            Some(l) => format!("{} {}", a.name, format_labels(&l[i])),
            None => a.name.clone(),
        })
        .collect();
    if agents.len() > LIST_LIMIT {
        parts.push(format!("and {} more", agents.len() - LIST_LIMIT));
    }
    parts.join(", ")
}
