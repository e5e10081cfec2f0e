use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lockstep_core::fault::FaultKind;

use super::*;

const ORIGIN: &str = "plans/x.toml";

fn parse_ok(text: &str) -> Plan {
    parse(text, Path::new(ORIGIN)).unwrap_or_else(|e| panic!("{e}"))
}

/// Parses `text`, expects an error, and checks that it names the file, `line` and `field`
/// and says `says`.
fn parse_err(text: &str, line: usize, field: &str, says: &str) -> PlanError {
    let e = parse(text, Path::new(ORIGIN)).expect_err("the plan should be refused");
    check_err(&e, line, field, says);
    e
}

fn check_err(e: &PlanError, line: usize, field: &str, says: &str) {
    let shown = e.to_string();
    assert_eq!(e.line(), line, "line of: {shown}");
    assert_eq!(e.field(), field, "field of: {shown}");
    let at = if line == 0 {
        ORIGIN.to_string()
    } else {
        format!("{ORIGIN}:{line}")
    };
    let prefix = if field.is_empty() {
        format!("{at}: ")
    } else {
        format!("{at}: {field}: ")
    };
    assert!(
        shown.starts_with(&prefix),
        "'{shown}' should start with '{prefix}'"
    );
    assert!(shown.contains(says), "'{shown}' should say '{says}'");
}

fn volume(name: &str) -> AgentVolume {
    AgentVolume {
        name: name.to_string(),
        path: PathBuf::from(format!("/srv/{name}")),
        size_bytes: 60 << 30,
        kind: "gp2".to_string(),
        provisioned_iops: None,
        provisioned_mib_s: None,
    }
}

fn agent(name: &str, labels: &[(&str, &str)], volumes: &[&str]) -> AgentInfo {
    AgentInfo {
        name: name.to_string(),
        address: format!("{name}:7070"),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        volumes: volumes.iter().map(|v| volume(v)).collect(),
    }
}

/// What `--local N` makes: agent-1..agent-N, one volume "data", labels {node = "agent-i"}.
fn local(n: usize) -> Vec<AgentInfo> {
    (1..=n)
        .map(|i| {
            let name = format!("agent-{i}");
            agent(&name, &[("node", &name)], &["data"])
        })
        .collect()
}

const FULL: &str = r#"
name = "full"
duration = "30s"
interval = "500ms"
ramp = "5s"

[[agent]]
name = "db-1"
address = "10.0.0.5:7070"
labels = { role = "db", az = "a" }

[[agent]]
name = "db-2"
address = "10.0.0.6:7070"
labels = { role = "db", az = "b" }

[[agent]]
name = "stage-1"
address = "10.0.0.7:7070"

[[role]]
name = "db"
select = { labels = { role = "db" } }
volumes = ["data"]
workload = { profile = "oltp-8k", set = { iodepth = 32, size = "1g" } }
rate_iops = 500

[[role]]
name = "staging"
select = { agents = ["stage-1"] }
workload = { fio = { rw = "write", bs = "256k", iodepth = 4, direct = true, percentile_list = [99.0, 99.9] } }

[[phase]]
name = "warmup"
duration = "10s"
measure = false

[[phase]]
name = "measure"

[[objective]]
metric = "p99"
direction = "read"
below = "5ms"
role = "db"

[[objective]]
metric = "iops_min"
above = 400
scope = "cluster"

[[fault]]
name = "credits"
at = "2s"
phase = "measure"
duration = "15s"
target = { agents = ["db-2"], volumes = ["data"] }
kind = "ebs"
volume_type = "gp2"
size_gib = 60
time_scale = 60

[[fault]]
at = "20s"
target = { role = "staging" }
kind = "stall"
"#;

fn full_agents() -> Vec<AgentInfo> {
    vec![
        agent("db-1", &[], &["data", "logs"]),
        agent("db-2", &[("az", "reported")], &["data", "logs"]),
        agent("stage-1", &[], &["scratch", "spill"]),
        agent("idle", &[], &["data"]),
    ]
}

#[test]
fn a_full_plan_parses_into_typed_form() {
    let plan = parse_ok(FULL);
    assert_eq!(plan.name, "full");
    assert_eq!(plan.interval, Duration::from_millis(500));
    let phases: Vec<(&str, u64, u64, bool)> = plan
        .phases
        .iter()
        .map(|p| {
            (
                p.name.as_str(),
                p.start.as_secs(),
                p.duration.as_secs(),
                p.measure,
            )
        })
        .collect();
    assert_eq!(
        phases,
        [
            ("ramp", 0, 5, false),
            ("warmup", 5, 10, false),
            ("measure", 15, 30, true)
        ]
    );
    assert_eq!(plan.run_length(), Duration::from_secs(45));
    assert_eq!(plan.measured_length(), Duration::from_secs(30));

    let db = plan.role("db").unwrap();
    assert_eq!(
        db.select,
        Selector::Labels([("role".into(), "db".into())].into())
    );
    assert_eq!(
        db.workload.source,
        WorkloadSource::Profile("oltp-8k".into())
    );
    assert_eq!(
        db.workload.job_text,
        crate::plan::profiles::get("oltp-8k").unwrap().job
    );
    let o = &db.workload.overrides;
    assert_eq!(o["iodepth"], "32");
    assert_eq!(o["size"], "1g");
    // 500 IOPS for the volume, one job, 70% reads: fio's per-direction rate_iops.
    assert_eq!(o["rate_iops"], "350,150");
    assert_eq!(o["runtime"], "45s");
    assert_eq!(o["time_based"], "1");
    assert_eq!(o["ramp_time"], "0");

    let staging = plan.role("staging").unwrap();
    assert_eq!(staging.workload.source, WorkloadSource::Inline);
    assert!(staging.workload.job_text.contains("[staging]\n"));
    for line in [
        "bs=256k",
        "direct=1",
        "iodepth=4",
        "percentile_list=99:99.9",
        "rw=write",
    ] {
        assert!(
            staging.workload.job_text.contains(&format!("{line}\n")),
            "{line}"
        );
    }

    let p99 = &plan.objectives[0];
    assert_eq!(p99.metric, Metric::Percentile(99.0));
    assert_eq!(p99.direction, Some(Direction::Read));
    assert_eq!(p99.threshold, Threshold::LatencyBelowNs(5_000_000));
    assert_eq!(p99.scope, Scope::Volume);
    assert!(p99.holds(4_999_999.0) && !p99.holds(5_000_000.0));
    assert_eq!(p99.to_string(), "p99 read < 5ms on every db volume");
    let iops = &plan.objectives[1];
    assert_eq!(iops.threshold, Threshold::IopsAtLeast(400.0));
    assert!(iops.holds(400.0) && !iops.holds(399.0));
    assert_eq!(iops.to_string(), "iops_min >= 400 IOPS for the cluster");

    let credits = &plan.faults[0];
    assert_eq!(credits.label, "fault 'credits'");
    assert_eq!(
        credits.at,
        Duration::from_secs(17),
        "2s into the measure phase"
    );
    assert_eq!(credits.duration, Some(Duration::from_secs(15)));
    assert_eq!(credits.kind, "ebs");
    // The typed spec, built once with its window: what the agents receive.
    let expected: FaultSpec = serde_json::from_value(serde_json::json!(
        {"kind": "ebs", "at_ms": 17_000, "duration_ms": 15_000,
         "volume_type": "gp2", "size_gib": 60, "time_scale": 60}
    ))
    .unwrap();
    assert_eq!(credits.spec, expected);
    assert_eq!(plan.faults[1].label, "fault #2");
    assert_eq!(plan.faults[1].duration, None);
}

#[test]
fn a_full_plan_resolves_into_an_assignment() {
    let plan = parse_ok(FULL);
    let a = resolve(&plan, &full_agents()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(a.plan, "full");
    assert_eq!(a.run_length(), Duration::from_secs(45));
    assert_eq!(a.objectives.len(), 2);

    // The idle agent runs nothing and is not part of the run.
    let names: Vec<&str> = a.agents.iter().map(|x| x.agent.as_str()).collect();
    assert_eq!(names, ["db-1", "db-2", "stage-1"]);
    let layout: Vec<(&str, &str, &str)> = a
        .volumes()
        .map(|(ag, v)| (ag.agent.as_str(), v.volume.name.as_str(), v.role.as_str()))
        .collect();
    assert_eq!(
        layout,
        [
            ("db-1", "data", "db"),
            ("db-2", "data", "db"),
            ("stage-1", "scratch", "staging"),
            ("stage-1", "spill", "staging"),
        ]
    );
    // Plan labels go on top of the agent's own.
    assert_eq!(a.agents[1].labels["az"], "b");
    assert_eq!(a.agents[1].labels["role"], "db");

    let db2 = &a.agents[1].volumes[0];
    assert_eq!(db2.rate_iops, Some(500));
    assert_eq!(db2.volume.path, PathBuf::from("/srv/data"));
    assert_eq!(db2.faults.len(), 1);
    let f = &db2.faults[0];
    assert_eq!(
        (f.index, f.at, f.kind.as_str()),
        (0, Duration::from_secs(17), "ebs")
    );
    let wire = f.wire();
    assert_eq!((wire.at_ms, wire.duration_ms), (17_000, Some(15_000)));
    let Some(lockstep_proto::v1::fault::Kind::Ebs(ebs)) = &wire.kind else {
        panic!("an ebs fault on the wire: {wire:?}")
    };
    assert_eq!(ebs.volume_type(), lockstep_proto::v1::EbsVolumeType::Gp2);
    assert_eq!(
        lockstep_core::fault::wire::from_wire(std::slice::from_ref(&wire)).unwrap(),
        [f.spec.clone()]
    );
    assert!(a.agents[0].volumes[0].faults.is_empty());
    assert_eq!(db2.overrides["runtime"], "45s");
    assert_eq!(db2.overrides_for(Duration::from_secs(30))["runtime"], "30s");

    // The stall hits every volume of the staging role, until the end of the run.
    let stall = &a.faults[1];
    assert_eq!(stall.targets.len(), 2);
    assert!(stall.targets.iter().all(|t| t.agent == "stage-1"));
    assert_eq!(stall.fault.wire().duration_ms, None);
    assert_eq!(a.agents[2].volumes[1].faults[0].kind, "stall");
    serde_json::to_string(&a).expect("an assignment can be saved with the results");
}

#[test]
fn a_minimal_plan_gets_defaults() {
    let plan = parse_ok(
        "duration = \"10s\"\n[[role]]\nname = \"w\"\nworkload = { profile = \"randread-4k\" }\n",
    );
    assert_eq!(plan.name, "x", "the file stem");
    assert_eq!(plan.interval, DEFAULT_INTERVAL);
    assert_eq!(plan.phases.len(), 1);
    assert_eq!(plan.phases[0].name, "measure");
    assert!(plan.phases[0].measure);
    assert_eq!(plan.roles[0].select, Selector::All);
    let a = resolve(&plan, &local(4)).unwrap();
    assert_eq!(a.volumes().count(), 4);
}

#[test]
fn toml_syntax_errors_name_the_line() {
    parse_err("duration = \"10s\"\n[[role]\n", 2, "", "expected `]`");
}

/// The TOML crate's recursion limit comes without a position (found by fuzz_plan): the
/// message must still name the line and the key.
#[test]
fn nesting_too_deep_names_the_line_and_key() {
    let deep = vec!["a"; 200].join(".");
    parse_err(
        &format!("duration = \"10s\"\n{deep} = 1\n"),
        2,
        "a",
        "nested too deeply",
    );
    let arrays = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    let e = parse(
        &format!("duration = \"10s\" # a.b.c.d.e.f\nx = \"a.b.c\"\ninterval = {arrays}\n"),
        Path::new(ORIGIN),
    )
    .expect_err("too deep");
    assert_eq!(e.line(), 3, "{e}");
}

#[test]
fn unknown_keys_are_refused_with_their_element() {
    parse_err(
        "durration = \"10s\"\n",
        1,
        "durration",
        "unknown field `durration`",
    );
    parse_err(
        "duration = \"1s\"\n[[role]]\nname = \"w\"\nworkload = { profile = \"oltp-8k\" }\niodepth = 3\n",
        5,
        "role 'w'",
        "unknown field `iodepth`",
    );
    parse_err(
        "duration = \"1s\"\n[[role]]\nname = \"w\"\nworkload = { profle = \"oltp-8k\" }\n",
        4,
        "role 'w': workload",
        "unknown field `profle`",
    );
    parse_err(
        "duration = \"1s\"\n[[role]]\nname = \"w\"\n[role.workload]\nprofile = \"oltp-8k\"\nbogus = 1\n",
        6,
        "role 'w': workload",
        "unknown field `bogus`",
    );
    parse_err(
        "duration = \"1s\"\n[[role]]\nname = \"w\"\nworkload = { profile = \"oltp-8k\" }\n\
         [[objective]]\nmetric = \"p99\"\nbelow = \"1ms\"\nscope = \"rack\"\n",
        8,
        "objective #1: scope",
        "unknown variant `rack`",
    );
}

#[test]
fn a_single_bracket_array_gets_a_hint() {
    parse_err(
        "duration = \"1s\"\n[role]\nname = \"w\"\n",
        2,
        "role",
        "write [[role]], with double brackets",
    );
}

#[test]
fn durations_need_units() {
    parse_err("duration = \"60x\"\n", 1, "duration", "unknown unit 'x'");
    parse_err(
        "duration = 60\n",
        1,
        "duration",
        "give the unit as a string, e.g. \"60s\"",
    );
    parse_err(
        "duration = \"1s\"\ninterval = \"10ms\"\n[[role]]\nname = \"w\"\nworkload = { profile = \"oltp-8k\" }\n",
        2,
        "interval",
        "too short",
    );
    parse_err(
        "[[role]]\nname = \"w\"\nworkload = { profile = \"oltp-8k\" }\n",
        0,
        "duration",
        "missing",
    );
}

#[test]
fn an_unknown_profile_is_refused_with_the_known_ones() {
    let e = parse_err(
        "duration = \"1s\"\n\n[[role]]\nname = \"worker\"\nworkload = { profile = \"oltp-9k\" }\n",
        5,
        "role 'worker': workload",
        "unknown profile 'oltp-9k' (known: oltp-8k, ",
    );
    assert!(
        e.to_string()
            .starts_with("plans/x.toml:5: role 'worker': workload: unknown profile")
    );
}

#[test]
fn a_workload_needs_exactly_one_source() {
    parse_err(
        "duration = \"1s\"\n[[role]]\nname = \"w\"\nworkload = { set = { bs = \"4k\" } }\n",
        4,
        "role 'w': workload",
        "says nothing to run",
    );
    parse_err(
        "duration = \"1s\"\n[[role]]\nname = \"w\"\nworkload = { profile = \"oltp-8k\", jobfile = \"a.fio\" }\n",
        4,
        "role 'w': workload",
        "more than one source",
    );
}

#[test]
fn inline_options_are_checked_for_shape() {
    let role = |opts: &str| {
        format!("duration = \"1s\"\n[[role]]\nname = \"w\"\nworkload = {{ fio = {{ {opts} }} }}\n")
    };
    parse_err(
        &role("directory = \"/x\""),
        4,
        "role 'w': workload.fio.directory",
        "set by the agent",
    );
    parse_err(
        &role("bs = { read = 4 }"),
        4,
        "role 'w': workload.fio.bs",
        "not a table",
    );
    parse_err(
        &role("\"rate-iops\" = 4"),
        4,
        "role 'w': workload.fio",
        "not a fio option name",
    );
    parse_err(&role(""), 4, "role 'w': workload.fio", "is empty");
    parse_err(
        "duration = \"1s\"\n[[role]]\nname = \"w\"\nworkload = { profile = \"oltp-8k\", set = { filename = \"/dev/sda\" } }\n",
        4,
        "role 'w': workload.set.filename",
        "set by the agent",
    );
}

#[test]
fn inline_options_become_a_job_section() {
    let plan = parse_ok(
        "duration = \"1m30s\"\n[[role]]\nname = \"oltp\"\n[role.workload.fio]\nrw = \"randrw\"\n\
         rwmixread = 70\nbs = \"8k\"\niodepth = 16\nnorandommap = true\n",
    );
    let text = &plan.roles[0].workload.job_text;
    let body: Vec<&str> = text.lines().filter(|l| !l.starts_with(';')).collect();
    assert_eq!(
        body,
        [
            "[oltp]",
            "bs=8k",
            "iodepth=16",
            "norandommap=1",
            "rw=randrw",
            "rwmixread=70"
        ]
    );
    assert_eq!(plan.roles[0].workload.overrides["runtime"], "90s");
}

#[test]
fn role_names_are_checked() {
    parse_err(
        "duration = \"1s\"\n[[role]]\nname = \"global\"\nworkload = { profile = \"oltp-8k\" }\n",
        3,
        "role 'global': name",
        "fio's section",
    );
    parse_err(
        "duration = \"1s\"\n[[role]]\nname = \"a b\"\nworkload = { profile = \"oltp-8k\" }\n",
        3,
        "role 'a b': name",
        "not a usable name",
    );
    parse_err(
        "duration = \"1s\"\n[[role]]\nname = \"w\"\nworkload = { profile = \"oltp-8k\" }\n\
         [[role]]\nname = \"w\"\nworkload = { profile = \"oltp-8k\" }\n",
        6,
        "role 'w': name",
        "already defined on line 2",
    );
    parse_err("duration = \"1s\"\n", 0, "role", "no [[role]]");
    parse_err(
        "duration = \"1s\"\n[[role]]\nname = \"w\"\nworkload = { profile = \"oltp-8k\" }\nrate_iops = 0\n",
        5,
        "role 'w': rate_iops",
        "at least 1",
    );
    parse_err(
        "duration = \"1s\"\n[[role]]\nname = \"w\"\nselect = { agents = [\"a\"], labels = { x = \"y\" } }\n\
         workload = { profile = \"oltp-8k\" }\n",
        4,
        "role 'w': select",
        "not both",
    );
}

#[test]
fn plan_agents_are_checked() {
    let agents = "duration = \"1s\"\n[[agent]]\nname = \"a\"\naddress = \"10.0.0.1:7070\"\n";
    let role = "[[role]]\nname = \"w\"\nworkload = { profile = \"oltp-8k\" }\n";
    parse_err(
        &format!("{agents}[[agent]]\nname = \"b\"\naddress = \"10.0.0.2\"\n{role}"),
        7,
        "agent 'b': address",
        "not host:port",
    );
    parse_err(
        &format!("{agents}[[agent]]\nname = \"a\"\naddress = \"10.0.0.2:7070\"\n{role}"),
        6,
        "agent 'a': name",
        "already given on line 2",
    );
    // With agents in the plan, a role naming another agent is refused at parse time.
    parse_err(
        &format!(
            "{agents}[[role]]\nname = \"w\"\nselect = {{ agents = [\"b\"] }}\nworkload = {{ profile = \"oltp-8k\" }}\n"
        ),
        7,
        "role 'w': select",
        "unknown agent 'b'",
    );
}

#[test]
fn phases_are_checked() {
    let role = "[[role]]\nname = \"w\"\nworkload = { profile = \"oltp-8k\" }\n";
    parse_err(
        &format!("{role}[[phase]]\nname = \"a\"\nduration = \"1s\"\n[[phase]]\nname = \"b\"\n"),
        7,
        "phase 'b': duration",
        "no top-level duration",
    );
    parse_err(
        &format!("{role}[[phase]]\nname = \"a\"\nduration = \"1s\"\nmeasure = false\n"),
        4,
        "phase",
        "no phase is measured",
    );
    parse_err(
        &format!("ramp = \"1s\"\nduration = \"2s\"\n{role}[[phase]]\nname = \"ramp\"\n"),
        7,
        "phase 'ramp': name",
        "comes earlier",
    );
}

#[test]
fn objectives_are_checked() {
    let base = "duration = \"1s\"\n[[role]]\nname = \"w\"\nworkload = { profile = \"oltp-8k\" }\n[[objective]]\n";
    parse_err(
        &format!("{base}metric = \"p999\"\nbelow = \"1ms\"\n"),
        6,
        "objective #1: metric",
        "",
    );
    parse_err(
        &format!("{base}metric = \"p101\"\nbelow = \"1ms\"\n"),
        6,
        "objective #1: metric",
        "unknown metric 'p101'",
    );
    parse_err(
        &format!("{base}metric = \"p99\"\nabove = 5\n"),
        7,
        "objective #1 (p99)",
        "upper bound: write below",
    );
    parse_err(
        &format!("{base}metric = \"iops_min\"\nbelow = \"1ms\"\n"),
        7,
        "objective #1 (iops_min)",
        "lower bound: write above",
    );
    parse_err(
        &format!("{base}metric = \"p99\"\n"),
        5,
        "objective #1 (p99)",
        "missing its bound",
    );
    parse_err(
        &format!("{base}metric = \"p99\"\nbelow = 5\n"),
        7,
        "objective #1 (p99): below",
        "with its unit",
    );
    parse_err(
        &format!("{base}metric = \"p99.9\"\nbelow = \"5ms\"\nrole = \"db\"\n"),
        8,
        "objective #1 (p99.9): role",
        "unknown role 'db' (roles: w)",
    );
    parse_err(
        &format!("{base}metric = \"p99\"\nbelow = \"5ms\"\ndirection = \"both\"\n"),
        8,
        "objective #1: direction",
        "unknown variant `both`",
    );
    let plan = parse_ok(&format!(
        "{base}metric = \"mbps_min\"\nabove = 100\nscope = \"node\"\n"
    ));
    assert_eq!(
        plan.objectives[0].threshold,
        Threshold::BytesPerSecAtLeast(100e6)
    );
    assert_eq!(plan.objectives[0].direction, None);
    assert_eq!(
        plan.objectives[0].to_string(),
        "mbps_min >= 100 MB/s on every node"
    );
}

#[test]
fn faults_are_checked() {
    let base = "duration = \"30s\"\n[[role]]\nname = \"w\"\nworkload = { profile = \"oltp-8k\" }\n[[fault]]\n";
    parse_err(
        &format!("{base}at = \"1s\"\ntarget = {{}}\n"),
        5,
        "fault #1",
        "missing kind",
    );
    parse_err(
        &format!("{base}kind = \"stall\"\ntarget = {{}}\n"),
        5,
        "fault #1",
        "missing at",
    );
    parse_err(
        &format!("{base}kind = \"stall\"\nat = \"40s\"\ntarget = {{}}\n"),
        7,
        "fault #1: at",
        "the run ends at 30s",
    );
    parse_err(
        &format!("{base}kind = \"stall\"\nat = \"soon\"\ntarget = {{}}\n"),
        7,
        "fault #1: at",
        "invalid duration 'soon'",
    );
    parse_err(
        &format!("{base}kind = \"stall\"\nat = \"1s\"\nphase = \"chaos\"\ntarget = {{}}\n"),
        8,
        "fault #1: phase",
        "unknown phase 'chaos' (phases: measure)",
    );
    parse_err(
        &format!("{base}kind = \"stall\"\nat = \"1s\"\n"),
        5,
        "fault #1",
        "missing target",
    );
    parse_err(
        &format!(
            "{base}name = \"cut\"\nkind = \"stall\"\nat = \"1s\"\ntarget = {{ agent = [\"a\"] }}\n"
        ),
        9,
        "fault 'cut': target",
        "unknown field `agent`",
    );
    parse_err(
        &format!("{base}kind = \"stall\"\nat = \"1s\"\ntarget = {{ role = \"db\" }}\n"),
        8,
        "fault #1: target",
        "unknown role 'db'",
    );
    parse_err(
        &format!("{base}kind = 3\nat = \"1s\"\ntarget = {{}}\n"),
        6,
        "fault #1: kind",
        "must be a string",
    );
}

#[test]
fn resolve_refuses_unknown_agents_and_volumes() {
    let plan = parse_ok(
        "duration = \"1s\"\n[[role]]\nname = \"w\"\nselect = { agents = [\"agent-9\"] }\n\
         workload = { profile = \"oltp-8k\" }\n",
    );
    let e = resolve(&plan, &local(2)).unwrap_err();
    check_err(
        &e,
        4,
        "role 'w': select",
        "unknown agent 'agent-9' (agents of this run: agent-1, agent-2)",
    );

    let plan = parse_ok(
        "duration = \"1s\"\n[[role]]\nname = \"w\"\nvolumes = [\"data\", \"logs\"]\n\
         workload = { profile = \"oltp-8k\" }\n",
    );
    let e = resolve(&plan, &local(2)).unwrap_err();
    check_err(
        &e,
        4,
        "role 'w': volumes",
        "agent 'agent-1' has no volume 'logs' (its volumes: data)",
    );

    let plan = parse_ok(
        "duration = \"1s\"\n[[role]]\nname = \"w\"\nselect = { labels = { az = \"c\" } }\n\
         workload = { profile = \"oltp-8k\" }\n",
    );
    let e = resolve(&plan, &local(2)).unwrap_err();
    check_err(
        &e,
        4,
        "role 'w': select",
        "labels { az = \"c\" } match no agent (agents of this run: agent-1 { node = \"agent-1\" }",
    );

    let e = resolve(&plan, &[]).unwrap_err();
    check_err(&e, 0, "agent", "no agents");
}

#[test]
fn resolve_refuses_overlapping_roles() {
    let plan = parse_ok(
        "duration = \"1s\"\n\
         [[role]]\nname = \"a\"\nselect = { agents = [\"agent-1\", \"agent-2\"] }\nworkload = { profile = \"oltp-8k\" }\n\
         [[role]]\nname = \"b\"\nworkload = { profile = \"journal\" }\n",
    );
    let e = resolve(&plan, &local(3)).unwrap_err();
    check_err(
        &e,
        6,
        "role 'b'",
        "volume 'data' of agent 'agent-1' is already selected by role 'a' (line 2)",
    );
    // Disjoint selections are fine.
    let plan = parse_ok(
        "duration = \"1s\"\n\
         [[role]]\nname = \"a\"\nselect = { agents = [\"agent-1\"] }\nworkload = { profile = \"oltp-8k\" }\n\
         [[role]]\nname = \"b\"\nselect = { labels = { node = \"agent-2\" } }\nworkload = { profile = \"journal\" }\n",
    );
    let a = resolve(&plan, &local(3)).unwrap();
    let roles: Vec<&str> = a.volumes().map(|(_, v)| v.role.as_str()).collect();
    assert_eq!(roles, ["a", "b"]);
}

#[test]
fn resolve_checks_fault_targets() {
    let base = "duration = \"30s\"\n[[role]]\nname = \"w\"\nselect = { agents = [\"agent-1\", \"agent-2\"] }\n\
                workload = { profile = \"oltp-8k\" }\n[[fault]]\nkind = \"stall\"\nat = \"1s\"\n";
    let cases = [
        (
            "target = { agents = [\"agent-7\"] }",
            "unknown agent 'agent-7'",
        ),
        (
            "target = { agents = [\"agent-3\"] }",
            "hits no volume that runs a workload",
        ),
        (
            "target = { agents = [\"agent-3\"], volumes = [\"data\"] }",
            "volume 'data' of agent 'agent-3' runs no workload",
        ),
        (
            "target = { volumes = [\"logs\"] }",
            "agent 'agent-1' has no volume 'logs'",
        ),
        (
            "target = { labels = { az = \"q\" } }",
            "labels { az = \"q\" } match no agent",
        ),
    ];
    for (target, says) in cases {
        let plan = parse_ok(&format!("{base}{target}\n"));
        let e = resolve(&plan, &local(3)).unwrap_err();
        check_err(&e, 9, "fault #1: target", says);
    }
    // target = {} is every volume with work.
    let plan = parse_ok(&format!("{base}target = {{}}\n"));
    let a = resolve(&plan, &local(3)).unwrap();
    assert_eq!(a.faults[0].targets.len(), 2);
}

#[test]
fn resolve_refuses_duplicate_agent_names() {
    let plan = parse_ok(
        "duration = \"1s\"\n[[role]]\nname = \"w\"\nworkload = { profile = \"oltp-8k\" }\n",
    );
    let mut agents = local(2);
    agents[1].name = "agent-1".into();
    let e = resolve(&plan, &agents).unwrap_err();
    check_err(&e, 0, "agent", "two agents of the run are named 'agent-1'");
}

#[test]
fn job_files_are_read_relative_to_the_plan_with_includes_expanded() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("jobs")).unwrap();
    std::fs::write(
        dir.path().join("jobs/common.fio"),
        "ioengine=io_uring\ndirect=1\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("jobs/hadoop.fio"),
        "[global]\ninclude common.fio\n\n[Read-Test-1]\nrw=randread\nbs=128M\niodepth=4\nsize=500G\n",
    )
    .unwrap();
    let plan_path = dir.path().join("plan.toml");
    std::fs::write(
        &plan_path,
        "duration = \"10s\"\n[[role]]\nname = \"datanode\"\nworkload = { jobfile = \"jobs/hadoop.fio\" }\n",
    )
    .unwrap();
    let plan = load(&plan_path).unwrap_or_else(|e| panic!("{e}"));
    let w = &plan.roles[0].workload;
    assert_eq!(
        w.source,
        WorkloadSource::JobFile(dir.path().join("jobs/hadoop.fio"))
    );
    assert!(w.job_text.contains("ioengine=io_uring\n"));
    assert!(!w.job_text.contains("\ninclude common.fio"));
    assert!(w.job_text.contains("[Read-Test-1]\nrw=randread\n"));
}

#[test]
fn job_file_problems_name_both_the_plan_line_and_the_job_file_line() {
    let dir = tempfile::tempdir().unwrap();
    let plan_path = dir.path().join("plan.toml");
    let write_plan = |jobfile: &str| {
        std::fs::write(
            &plan_path,
            format!("duration = \"10s\"\n[[role]]\nname = \"w\"\nworkload = {{ jobfile = \"{jobfile}\" }}\n"),
        )
        .unwrap()
    };
    let shown = |e: PlanError| {
        assert_eq!(e.line(), 4, "{e}");
        assert_eq!(e.field(), "role 'w': workload.jobfile", "{e}");
        e.to_string()
    };

    write_plan("missing.fio");
    let e = shown(load(&plan_path).unwrap_err());
    assert!(
        e.contains("cannot read") && e.contains("missing.fio"),
        "{e}"
    );

    std::fs::write(
        dir.path().join("seed.fio"),
        "[global]\ndirect=1\n\n[t]\ndirectory=/ebs0\nrw=read\n",
    )
    .unwrap();
    write_plan("seed.fio");
    let e = shown(load(&plan_path).unwrap_err());
    assert!(
        e.contains("seed.fio:5: directory= is set by the agent"),
        "{e}"
    );

    std::fs::write(dir.path().join("a.fio"), "include b.fio\n[a]\n").unwrap();
    std::fs::write(dir.path().join("b.fio"), "; b\ninclude a.fio\n").unwrap();
    write_plan("a.fio");
    let e = shown(load(&plan_path).unwrap_err());
    assert!(e.contains("b.fio:2: include a.fio makes a cycle"), "{e}");

    std::fs::write(dir.path().join("g.fio"), "[global]\nrw=read\n").unwrap();
    write_plan("g.fio");
    let e = shown(load(&plan_path).unwrap_err());
    assert!(e.contains("has no job section"), "{e}");
}

#[test]
fn a_missing_plan_file_says_so() {
    let e = load(Path::new("/nonexistent/plan.toml")).unwrap_err();
    assert!(matches!(e, PlanError::Read { .. }));
    assert!(
        e.to_string()
            .starts_with("/nonexistent/plan.toml: cannot read the plan")
    );
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name)
}

#[test]
fn the_examples_parse_and_resolve_on_local_agents() {
    for (name, agents) in [
        ("quickstart.toml", 4),
        ("drill.toml", 4),
        ("mixed-roles.toml", 4),
    ] {
        let path = example(name);
        let plan = load(&path).unwrap_or_else(|e| panic!("{e}"));
        let a = resolve(&plan, &local(agents)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            a.volumes().count(),
            agents,
            "{name}: every local volume has work"
        );
        assert!(!a.faults.is_empty(), "{name} injects a fault");
        for (_, v) in a.volumes() {
            assert!(
                v.job_text.contains('['),
                "{name}: job text for {}",
                v.volume.name
            );
        }
    }
}

#[test]
fn the_quickstart_is_a_minute_with_a_throttle_on_agent_3() {
    let plan = load(&example("quickstart.toml")).unwrap();
    let total = plan.run_length();
    assert!(
        total >= Duration::from_secs(40) && total <= Duration::from_secs(60),
        "{total:?}"
    );
    let a = resolve(&plan, &local(4)).unwrap();
    // Every volume is an emulated gp2; only agent-3's is small enough to have credits to lose.
    assert_eq!(a.faults.len(), 2);
    let credits = a
        .faults
        .iter()
        .find(|f| matches!(&f.fault.spec.kind, FaultKind::Ebs(e) if e.size_gib == 60))
        .unwrap();
    assert_eq!(
        credits.targets,
        [VolumeRef {
            agent: "agent-3".into(),
            volume: "data".into()
        }]
    );
    let peers = a
        .faults
        .iter()
        .find(|f| matches!(&f.fault.spec.kind, FaultKind::Ebs(e) if e.size_gib == 1000))
        .unwrap();
    assert_eq!(peers.targets.len(), 3);
    let roles: BTreeMap<&str, usize> = a.volumes().fold(BTreeMap::new(), |mut m, (_, v)| {
        *m.entry(v.role.as_str()).or_default() += 1;
        m
    });
    assert_eq!(roles.len(), 1, "one role over all agents");
}

#[test]
fn the_mixed_roles_example_runs_different_workloads_per_role() {
    let plan = load(&example("mixed-roles.toml")).unwrap();
    let a = resolve(&plan, &local(4)).unwrap();
    let mut texts: Vec<&str> = a.volumes().map(|(_, v)| v.job_text.as_str()).collect();
    texts.sort();
    texts.dedup();
    assert!(texts.len() >= 2, "different job text per role");
}

#[test]
fn the_agent_parser_refuses_bad_options_at_their_plan_line() {
    let role = |workload: &str| format!("duration = \"1s\"\n[[role]]\nname = \"w\"\n{workload}\n");
    // Inline: the error points at the option's own line.
    parse_err(
        &role("[role.workload.fio]\nrw = \"randrw\"\nbs = \"8k\"\niodepht = 16"),
        7,
        "role 'w': workload.fio.iodepht",
        "option 'iodepht': unknown option",
    );
    parse_err(
        &role("workload = { fio = { rw = \"randrw\", bs = \"8q\" } }"),
        4,
        "role 'w': workload.fio.bs",
        "bs=8q",
    );
    // set: the error points at the overriding key.
    parse_err(
        &role("[role.workload]\nprofile = \"oltp-8k\"\n[role.workload.set]\nrwmixread = \"lots\""),
        7,
        "role 'w': workload.set.rwmixread",
        "rwmixread=lots",
    );
    // A job file: the plan line of the jobfile key, and the job file's own line in the message.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.fio"),
        "[global]\ndirect=1\n\n[t]\nrw=randread\nioengin=psync\n",
    )
    .unwrap();
    let plan_path = dir.path().join("plan.toml");
    std::fs::write(&plan_path, role("workload = { jobfile = \"bad.fio\" }")).unwrap();
    let e = load(&plan_path).unwrap_err();
    assert_eq!(
        (e.line(), e.field()),
        (4, "role 'w': workload.jobfile"),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("bad.fio:6: option 'ioengin': unknown option"),
        "{e}"
    );
}

#[test]
fn a_volume_rate_is_split_over_jobs_and_directions() {
    let role = |fio: &str| {
        format!(
            "duration = \"1s\"\n[[role]]\nname = \"w\"\nrate_iops = 1000\nworkload = {{ fio = {{ {fio} }} }}\n"
        )
    };
    let rate = |fio: &str| parse_ok(&role(fio)).roles[0].workload.overrides["rate_iops"].clone();
    assert_eq!(rate("rw = \"randwrite\", bs = \"4k\""), ",1000");
    assert_eq!(rate("rw = \"randread\", bs = \"4k\", numjobs = 4"), "250,");
    assert_eq!(
        rate("rw = \"randrw\", rwmixread = 70, bs = \"4k\", numjobs = 2"),
        "350,150"
    );

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("two.fio"),
        "[r]\nrw=randread\n[w]\nrw=randwrite\n",
    )
    .unwrap();
    let plan_path = dir.path().join("plan.toml");
    std::fs::write(
        &plan_path,
        "duration = \"1s\"\n[[role]]\nname = \"w\"\nrate_iops = 1000\nworkload = { jobfile = \"two.fio\" }\n",
    )
    .unwrap();
    let e = load(&plan_path).unwrap_err();
    assert_eq!((e.line(), e.field()), (4, "role 'w': rate_iops"), "{e}");
    assert!(
        e.to_string().contains("mix reads and writes differently"),
        "{e}"
    );
}

#[test]
fn fault_payloads_are_checked_with_the_agents_fault_spec() {
    let base = "duration = \"30s\"\n[[role]]\nname = \"w\"\nworkload = { profile = \"oltp-8k\" }\n\
                [[fault]]\nat = \"1s\"\ntarget = {}\n";
    parse_err(
        &format!("{base}kind = \"ebz\"\n"),
        8,
        "fault #1: kind",
        "unknown variant `ebz`",
    );
    parse_err(
        &format!("{base}kind = \"eio\"\nfraction = 0.1\nfration = 0.2\n"),
        10,
        "fault #1: fration",
        "fration",
    );
    parse_err(
        &format!(
            "{base}kind = \"ebs\"\nvolume_type = \"gp2\"\nsize_gib = 60\nprovisioned_iops = 3000\n"
        ),
        11,
        "fault #1: provisioned_iops",
        "not allowed for gp2",
    );
    parse_err(
        &format!("{base}kind = \"eio\"\nfraction = 2.0\n"),
        9,
        "fault #1: fraction",
        "between 0 and 1",
    );
    parse_err(
        &format!("{base}kind = \"iops_cap\"\n"),
        8,
        "fault #1: kind",
        "at least one must be set",
    );
    let plan = parse_ok(&format!("{base}kind = \"iops_cap\"\ntotal = 200\n"));
    let FaultKind::IopsCap(cap) = &plan.faults[0].spec.kind else {
        panic!("{:?}", plan.faults[0].spec)
    };
    assert_eq!(cap.total, Some(200));
}

/// A role `w` on line 2 with `extra` from line 5 on.
fn sweep_role(extra: &str) -> String {
    format!(
        "duration = \"1s\"\n[[role]]\nname = \"w\"\nworkload = {{ fio = {{ rw = \"randread\", bs = \"4k\", iodepth = 8 }} }}\n{extra}\n"
    )
}

#[test]
fn a_depth_sweep_sets_iodepth_or_numjobs_on_every_job_of_a_step() {
    let plan = parse_ok(&sweep_role("depth_sweep = [1, 2, 4, 32]"));
    let sweep = plan.roles[0].depth_sweep.clone().expect("a sweep");
    assert_eq!(
        sweep,
        DepthSweep {
            over: SweepOver::Iodepth,
            values: vec![1, 2, 4, 32]
        }
    );
    assert_eq!(plan.roles[0].rate_iops, None);
    let step = with_depth(&plan.roles[0].workload, sweep.over, 32);
    assert_eq!(step.overrides["iodepth"], "32");
    let jobs = jobs_at(&plan.roles[0].workload, sweep.over, 32).unwrap();
    assert_eq!((jobs[0].iodepth, jobs[0].numjobs), (32, 1));
    // The step's value wins over the role's `set`, which wins over the job text.
    let set = parse_ok(
        "duration = \"1s\"\n[[role]]\nname = \"w\"\ndepth_sweep = [2]\n\
         workload = { profile = \"oltp-8k\", set = { iodepth = 64 } }\n",
    );
    let w = &set.roles[0].workload;
    assert_eq!(w.overrides["iodepth"], "64");
    assert_eq!(
        with_depth(w, SweepOver::Iodepth, 2).overrides["iodepth"],
        "2"
    );

    let threads = parse_ok(&sweep_role(
        "depth_sweep = [1, 16]\nsweep_over = \"numjobs\"",
    ));
    let sweep = threads.roles[0].depth_sweep.clone().unwrap();
    assert_eq!(sweep.over, SweepOver::Numjobs);
    let jobs = jobs_at(&threads.roles[0].workload, sweep.over, 16).unwrap();
    assert_eq!((jobs[0].iodepth, jobs[0].numjobs), (8, 16));
    // Without a sweep, nothing changes.
    assert_eq!(parse_ok(&sweep_role("")).roles[0].depth_sweep, None);
}

#[test]
fn a_depth_sweep_is_refused_with_a_rate_and_with_unusable_values() {
    let field = "role 'w': depth_sweep";
    parse_err(
        &sweep_role("depth_sweep = [1, 2]\nrate_iops = 100"),
        5,
        field,
        "give rate_iops or depth_sweep, not both",
    );
    parse_err(
        &sweep_role("depth_sweep = [1, 2]\nrate_curve = [50, 100]"),
        5,
        field,
        "give rate_curve or depth_sweep, not both",
    );
    parse_err(
        &sweep_role("depth_sweep = []"),
        5,
        field,
        "needs 1 to 20 values",
    );
    let many: Vec<String> = (1..=21).map(|i| i.to_string()).collect();
    parse_err(
        &sweep_role(&format!("depth_sweep = [{}]", many.join(", "))),
        5,
        field,
        "needs 1 to 20 values of iodepth",
    );
    parse_err(
        &sweep_role("depth_sweep = [0, 1]"),
        5,
        field,
        "0 is not a usable iodepth: every value must be at least 1",
    );
    parse_err(
        &sweep_role("depth_sweep = [-4]"),
        5,
        field,
        "-4 is not a usable iodepth",
    );
    parse_err(
        &sweep_role("depth_sweep = [1, 4, 4]"),
        5,
        field,
        "4 is listed twice",
    );
    parse_err(
        &sweep_role("depth_sweep = [1, 8192]"),
        5,
        field,
        "8192 is more than 4096",
    );
    parse_err(
        &sweep_role("depth_sweep = [1, 8, 4]"),
        5,
        field,
        "increasing order (4 comes after 8)",
    );
    parse_err(
        &sweep_role("depth_sweep = [1, 2]\nsweep_over = \"threads\""),
        6,
        "role 'w': sweep_over",
        "'threads' is neither \"iodepth\"",
    );
    parse_err(
        &sweep_role("sweep_over = \"numjobs\""),
        5,
        "role 'w': sweep_over",
        "give depth_sweep",
    );
    parse_err(
        "duration = \"1s\"\n[[role]]\nname = \"w\"\n\
         workload = { fio = { rw = \"randread\", bs = \"4k\", rate_iops = 100 } }\n\
         depth_sweep = [1, 2]\n",
        5,
        field,
        "the workload sets a rate",
    );
}

#[test]
fn a_plan_runs_one_kind_of_series_and_its_sweeps_step_together() {
    let two = |a: &str, b: &str| {
        format!(
            "duration = \"1s\"\n\
             [[role]]\nname = \"a\"\nvolumes = [\"a\"]\nworkload = {{ profile = \"oltp-8k\" }}\n{a}\n\
             [[role]]\nname = \"b\"\nvolumes = [\"b\"]\nworkload = {{ profile = \"oltp-8k\" }}\n{b}\n"
        )
    };
    parse_err(
        &two("rate_curve = [50]", "depth_sweep = [1, 2]"),
        11,
        "role 'b': depth_sweep",
        "role 'a' on line 2 has a rate_curve",
    );
    parse_err(
        &two("depth_sweep = [1, 2]", "depth_sweep = [1, 2, 4]"),
        11,
        "role 'b': depth_sweep",
        "has 3 values and role 'a' on line 2 has 2",
    );
    let plan = parse_ok(&two("depth_sweep = [1, 2]", "depth_sweep = [4, 8]"));
    assert_eq!(plan.roles[1].depth_sweep.as_ref().unwrap().values, [4, 8]);
    // A role without a sweep runs its own workload beside the sweeping ones.
    let plan = parse_ok(&two("depth_sweep = [1, 2]", ""));
    assert_eq!(plan.roles[1].depth_sweep, None);
}

#[test]
fn a_sweep_table_varies_volumes_numjobs_iodepth_or_rate() {
    let plan = parse_ok(&sweep_role(
        "sweep = { over = \"volumes\", values = [4, 5, 6, 7, 8] }",
    ));
    let sweep = plan.roles[0].depth_sweep.clone().expect("a sweep");
    assert_eq!(sweep.over, SweepOver::Volumes);
    assert_eq!(sweep.values, [4, 5, 6, 7, 8]);
    // A volumes sweep sets no fio option.
    let w = &plan.roles[0].workload;
    assert_eq!(with_depth(w, SweepOver::Volumes, 6).overrides, w.overrides);
    let plan = parse_ok(&sweep_role(
        "sweep = { over = \"rate_iops\", values = [100, 200000] }",
    ));
    assert_eq!(
        plan.roles[0].depth_sweep.as_ref().unwrap().over,
        SweepOver::RateIops
    );
    let plan = parse_ok(&sweep_role(
        "sweep = { over = \"numjobs\", values = [1, 2] }",
    ));
    assert_eq!(
        plan.roles[0].depth_sweep.as_ref().unwrap().over,
        SweepOver::Numjobs
    );
    // A volumes sweep keeps the role's own rate: each volume's target does not change.
    parse_ok(&sweep_role(
        "sweep = { over = \"volumes\", values = [1, 2] }\nrate_iops = 100",
    ));
}

#[test]
fn a_sweep_table_is_refused_with_its_line_and_field() {
    let field = "role 'w': sweep.values";
    parse_err(
        &sweep_role("sweep = { over = \"disks\", values = [1] }"),
        5,
        "role 'w': sweep.over",
        "'disks' is not something a sweep varies: \"volumes\"",
    );
    parse_err(
        &sweep_role("sweep = { over = \"volumes\", values = [2, 1] }"),
        5,
        field,
        "increasing order (1 comes after 2)",
    );
    parse_err(
        &sweep_role("sweep = { over = \"volumes\", values = [1, 2] }\ndepth_sweep = [1, 2]"),
        5,
        "role 'w': sweep",
        "give sweep or depth_sweep, not both",
    );
    parse_err(
        &sweep_role("sweep = { over = \"iodepth\", values = [1, 2] }\nrate_iops = 10"),
        5,
        field,
        "give rate_iops or sweep, not both",
    );
    parse_err(
        &sweep_role("sweep = { over = \"rate_iops\", values = [1, 2] }\nrate_iops = 10"),
        5,
        field,
        "give rate_iops or a rate_iops sweep, not both",
    );
    parse_err(
        &sweep_role(
            "volumes = [\"data1\", \"data2\"]\nsweep = { over = \"volumes\", values = [1, 3] }",
        ),
        6,
        field,
        "asks for 3 volumes, but the role's volumes list has 2",
    );
}

#[test]
fn the_hadoop_example_sweeps_volumes_under_an_instance_limit() {
    let plan = load(&example("hadoop-volume-count.toml")).unwrap_or_else(|e| panic!("{e}"));
    let sweep = plan.roles[0].depth_sweep.as_ref().expect("a sweep");
    assert_eq!(sweep.over, SweepOver::Volumes);
    assert_eq!(sweep.values, [4, 5, 6, 7, 8]);
    assert!(
        plan.faults.iter().any(
            |f| matches!(&f.spec.kind, FaultKind::Instance(i) if i.baseline_mb_s == Some(87.5))
        )
    );
    let names: Vec<String> = (1..=8).map(|i| format!("data{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let agents = [agent("agent-1", &[("node", "agent-1")], &names)];
    let a = resolve(&plan, &agents).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(a.volumes().count(), 8);
}

#[test]
fn an_unknown_instance_type_is_refused_at_its_line_with_the_known_ones() {
    let plan = "duration = \"1s\"\n[[role]]\nname = \"w\"\nworkload = { profile = \"oltp-8k\" }\n\
                [[fault]]\nat = \"0s\"\ntarget = {}\nkind = \"instance\"\ntype = \"r4.9xlarge\"\n";
    parse_err(
        plan,
        9,
        "fault #1: type",
        "'r4.9xlarge' is not an instance type lockstep knows (known: m5.large, r4.8xlarge, \
         r5b.24xlarge)",
    );
}

#[test]
fn the_sweep_example_parses_and_resolves_on_local_agents() {
    let plan = load(&example("sweep.toml")).unwrap_or_else(|e| panic!("{e}"));
    let sweep = plan.roles[0].depth_sweep.as_ref().expect("a sweep");
    assert_eq!(sweep.over, SweepOver::Iodepth);
    assert!(sweep.values.len() >= 3, "{sweep:?}");
    let a = resolve(&plan, &local(2)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(a.volumes().count(), 2);
}

// ---- issue 13: plan and job files are small regular files; durations the agents can run ----

#[test]
fn plan_files_must_be_small_regular_files() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.toml");
    std::fs::write(&big, "# padding\n".repeat(200_000)).unwrap();
    let e = load(&big).unwrap_err().to_string();
    assert!(
        e.contains("big.toml: cannot read the plan: 2000000 bytes, more than the 1048576"),
        "{e}"
    );
    let e = load(Path::new("/dev/zero")).unwrap_err().to_string();
    assert!(
        e.starts_with("/dev/zero: cannot read the plan: a character device, not a regular file"),
        "{e}"
    );
    let e = load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("a directory, not a regular file"), "{e}");
}

#[test]
fn job_files_and_includes_a_plan_names_must_be_small_regular_files() {
    let dir = tempfile::tempdir().unwrap();
    let plan_path = dir.path().join("plan.toml");
    let write_plan = |jobfile: &str| {
        std::fs::write(
            &plan_path,
            format!("duration = \"10s\"\n[[role]]\nname = \"w\"\nworkload = {{ jobfile = \"{jobfile}\" }}\n"),
        )
        .unwrap()
    };
    let refused = || {
        let e = load(&plan_path).unwrap_err();
        assert_eq!(e.line(), 4, "{e}");
        assert_eq!(e.field(), "role 'w': workload.jobfile", "{e}");
        e.to_string()
    };
    std::fs::write(dir.path().join("big.fio"), "; padding\n".repeat(200_000)).unwrap();
    write_plan("big.fio");
    let e = refused();
    assert!(
        e.contains("big.fio: 2000000 bytes, more than the 1048576"),
        "{e}"
    );
    std::fs::write(
        dir.path().join("inc.fio"),
        "[j]\nrw=read\ninclude big.fio\n",
    )
    .unwrap();
    write_plan("inc.fio");
    let e = refused();
    assert!(
        e.contains("big.fio: 2000000 bytes, more than the 1048576"),
        "{e}"
    );
    write_plan("/dev/zero");
    let e = refused();
    assert!(
        e.contains("/dev/zero: a character device, not a regular file"),
        "{e}"
    );
    std::fs::write(
        dir.path().join("zero.fio"),
        "[j]\nrw=read\ninclude /dev/zero\n",
    )
    .unwrap();
    write_plan("zero.fio");
    let e = refused();
    assert!(
        e.contains("/dev/zero: a character device, not a regular file"),
        "{e}"
    );
}

/// The agents run whole milliseconds (the protocol carries them): "1ns" became runtime=0ms,
/// which every agent refused at prepare, far from the plan line that said it.
#[test]
fn durations_the_agents_cannot_run_are_refused_at_their_plan_line() {
    let role = "[[role]]\nname = \"w\"\nworkload = { profile = \"oltp-8k\" }\n";
    parse_err(
        &format!("duration = \"1ns\"\n{role}"),
        1,
        "duration",
        "1ns is not a whole number of milliseconds",
    );
    parse_err(
        &format!("duration = \"10s\"\nramp = \"1500us\"\n{role}"),
        2,
        "ramp",
        "1500us is not a whole number of milliseconds",
    );
    parse_err(
        &format!(
            "duration = \"10s\"\n{role}[[phase]]\nname = \"a\"\nduration = \"2ms\"\n[[phase]]\nname = \"b\"\nduration = \"999us\"\n"
        ),
        10,
        "phase 'b': duration",
        "999us is not a whole number of milliseconds",
    );
    parse_err(
        &format!(
            "duration = \"10s\"\n{role}[[fault]]\nkind = \"stall\"\nat = \"1s\"\nduration = \"10us\"\n"
        ),
        8,
        "fault #1: duration",
        "10us is not a whole number of milliseconds",
    );
    let plan = parse_ok(&format!("duration = \"1ms\"\nramp = \"2ms\"\n{role}"));
    assert_eq!(plan.run_length(), Duration::from_millis(3));
}

/// Numbers the agents would refuse in a job (here an override past io_uring's ring limit)
/// are refused at the plan line that gives them, with the agent's own message.
#[test]
fn job_options_past_fios_limits_are_refused_at_their_plan_line() {
    let e = parse(
        "duration = \"10s\"\n[[role]]\nname = \"w\"\nworkload = { profile = \"oltp-8k\", set = { iodepth = 40000 } }\n",
        Path::new(ORIGIN),
    )
    .unwrap_err();
    let shown = e.to_string();
    assert_eq!(e.line(), 4, "{shown}");
    assert!(
        shown.contains("at most 32768 with ioengine=io_uring"),
        "{shown}"
    );
}

const MIRRORED: &str = r#"
duration = "10s"

[[role]]
name = "primary"
select = { agents = ["agent-1"] }
mirror = { to = "backup", delay_us = 1100, failover_after = "2s" }
workload = { fio = { rw = "randwrite", bs = "8k" } }

[[role]]
name = "backup"
select = { agents = ["agent-2"] }
workload = { fio = { rw = "randread", bs = "8k" } }
"#;

#[test]
fn a_mirrored_role_pairs_its_volumes_with_the_backup_roles() {
    let plan = parse_ok(MIRRORED);
    let m = plan.role("primary").unwrap().mirror.clone().unwrap();
    assert_eq!(
        (m.to.as_str(), m.sync, m.delay_us, m.failover_after, m.line),
        ("backup", true, 1100, Some(Duration::from_secs(2)), 7)
    );
    let a = resolve(&plan, &local(2)).unwrap();
    let (_, v) = a.volumes().find(|(ag, _)| ag.agent == "agent-1").unwrap();
    let target = v.mirror.clone().expect("the primary's volume is mirrored");
    assert_eq!(target.backup_agent, "agent-2");
    assert_eq!(target.backup_address, "agent-2:7070");
    assert_eq!(target.backup_volume, "data");
    let wire = target.wire();
    assert_eq!(
        (
            wire.sync,
            wire.delay_us,
            wire.failover_after_ms,
            wire.no_catch_up
        ),
        (true, 1100, 2000, false)
    );
    let (_, b) = a.volumes().find(|(ag, _)| ag.agent == "agent-2").unwrap();
    assert!(b.mirror.is_none(), "the backup mirrors nothing");
    // The catch-up is on unless the plan turns it off.
    let off = parse_ok(&MIRRORED.replace(
        "failover_after = \"2s\"",
        "failover_after = \"2s\", catch_up = false",
    ));
    let m = off.role("primary").unwrap().mirror.clone().unwrap();
    assert!(!m.catch_up);
    let a = resolve(&off, &local(2)).unwrap();
    let (_, v) = a.volumes().find(|(ag, _)| ag.agent == "agent-1").unwrap();
    assert!(v.mirror.as_ref().unwrap().wire().no_catch_up);
}

#[test]
fn a_mirror_is_refused_with_its_line_when_it_cannot_be_a_pair() {
    let with = |from: &str, to: &str| MIRRORED.replace(from, to);
    parse_err(
        &with("to = \"backup\"", "to = \"nobody\""),
        7,
        "role 'primary': mirror.to",
        "no role 'nobody' in the plan (roles: backup)",
    );
    parse_err(
        &with("delay_us = 1100,", "mode = \"semi\","),
        7,
        "role 'primary': mirror.mode",
        "'semi' is neither",
    );
    parse_err(
        &with("delay_us = 1100,", "mode = \"async\","),
        7,
        "role 'primary': mirror.failover_after",
        "only applies to mode = \"sync\"",
    );
    parse_err(
        &with("delay_us = 1100", "delay_us = 2000000"),
        7,
        "role 'primary': mirror.delay_us",
        "more than 1000000",
    );
    parse_err(
        &with("to = \"backup\"", "to = \"primary\""),
        7,
        "role 'primary': mirror.to",
        "names the role itself",
    );
    // Two primaries and one backup: agent 2 of the primary role would have none.
    let plan = parse_ok(&with(
        "select = { agents = [\"agent-1\"] }",
        "select = { agents = [\"agent-1\", \"agent-3\"] }",
    ));
    let e = resolve(&plan, &local(3)).unwrap_err();
    check_err(
        &e,
        7,
        "role 'primary': mirror",
        "role 'primary' runs on 2 agent(s) and its backup role 'backup' on 1",
    );
}

#[test]
fn histogram_digits_are_2_or_3_and_default_to_3() {
    let role = "[[role]]\nname = \"w\"\nworkload = { profile = \"oltp-8k\" }\n";
    assert_eq!(
        parse_ok(&format!("duration = \"1s\"\n{role}")).histogram_digits,
        3
    );
    for d in [2, 3] {
        let plan = parse_ok(&format!(
            "duration = \"1s\"\nhistogram_digits = {d}\n{role}"
        ));
        assert_eq!(plan.histogram_digits, d);
    }
    for bad in ["1", "4", "7", "-2", "300"] {
        parse_err(
            &format!("duration = \"1s\"\nhistogram_digits = {bad}\n{role}"),
            2,
            "histogram_digits",
            &format!("{bad} is not supported: 3 (the default, as recorded) or 2"),
        );
    }
}
