//! Fuzzing the plan parser: arbitrary bytes, and mutations of the valid plans the project ships
//! (examples/*.toml and the TOML of docs/plan.md): keys dropped, duplicated or added, values of
//! the wrong type, huge values, deep nesting, lines cut, doubled or swapped.
//!
//! Why: a plan is written by hand, so every mistake must come back as an error that names the
//! plan file and the line or the field (`role 'db': workload`), never a panic or a hang. The
//! property, for every case: `parse` returns in bounded time, with a plan or with such an error;
//! a plan that parses is also resolved against local agents (the step before any agent is
//! contacted), with the same property, and its faults, encoded as the protocol's typed `Fault`
//! messages, decode and validate on the agent's side into the specs the plan built.
//!
//! For a long run: `PROPTEST_CASES=20000 cargo test -p lockstep --test fuzz_plan`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use lockstep::plan::{self, AgentInfo, AgentVolume, PlanError};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::Config;
use toml::Value;

/// Parsing a plan takes milliseconds; this much is a hang.
const CASE_TIME_LIMIT: Duration = Duration::from_secs(10);

fn config(default_cases: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(default_cases);
    Config {
        cases,
        max_shrink_iters: 2_000,
        ..Config::default()
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// A valid plan to mutate, and the file it came from (so its job files resolve).
#[derive(Debug, Clone)]
struct Seed {
    origin: PathBuf,
    text: String,
}

/// The plans the project ships: every example, and every TOML block of docs/plan.md.
fn seeds() -> &'static [Seed] {
    static SEEDS: OnceLock<Vec<Seed>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let mut seeds = Vec::new();
        let examples = repo().join("examples");
        let mut entries: Vec<PathBuf> = std::fs::read_dir(&examples)
            .expect("examples/")
            .map(|e| e.expect("an entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "toml"))
            .collect();
        entries.sort();
        for path in entries {
            let text = std::fs::read_to_string(&path).expect("an example");
            seeds.push(Seed { origin: path, text });
        }
        let doc = repo().join("docs/plan.md");
        let md = std::fs::read_to_string(&doc).expect("docs/plan.md");
        let mut block: Option<String> = None;
        for line in md.lines() {
            let trimmed = line.trim();
            match &mut block {
                None if trimmed == "```toml" => block = Some(String::new()),
                Some(text) if trimmed == "```" => {
                    seeds.push(Seed {
                        origin: repo().join("examples/from-docs.toml"),
                        text: std::mem::take(text),
                    });
                    block = None;
                }
                Some(text) => {
                    text.push_str(line.trim_start());
                    text.push('\n');
                }
                None => {}
            }
        }
        assert!(seeds.len() >= 5, "found only {} seed plans", seeds.len());
        seeds
    })
}

/// The agents plans are resolved against: what `--local 4` makes, plus labels.
fn agents() -> Vec<AgentInfo> {
    (1..=4)
        .map(|i| AgentInfo {
            name: format!("agent-{i}"),
            address: format!("127.0.0.1:{}", 7000 + i),
            labels: [("node".to_string(), format!("agent-{i}"))].into(),
            volumes: vec![AgentVolume {
                name: "data".to_string(),
                path: PathBuf::from(format!("/tmp/lockstep-fuzz/agent-{i}")),
                size_bytes: 1 << 30,
                kind: "gp2".to_string(),
                provisioned_iops: None,
                provisioned_mib_s: None,
            }],
        })
        .collect()
}

/// Checks a plan error: it names the file, and a line or a field; a line exists.
fn check_error(e: &PlanError, text: &str, origin: &Path) {
    let shown = e.to_string();
    let file = origin.display().to_string();
    assert!(
        shown.starts_with(&file),
        "'{shown}' does not start with the plan file {file}"
    );
    match e {
        PlanError::Read { .. } => {}
        PlanError::Invalid {
            line,
            field,
            message,
            ..
        } => {
            assert!(
                *line > 0 || !field.is_empty(),
                "'{shown}' names neither a line nor a field"
            );
            assert!(!message.trim().is_empty(), "'{shown}' has no message");
            if *line > 0 {
                assert!(
                    shown.starts_with(&format!("{file}:{line}")),
                    "'{shown}' does not start with {file}:{line}"
                );
                // TOML's errors may point just past the last line (a missing closing bracket).
                let lines = text.lines().count().max(1);
                assert!(
                    *line <= lines + 1,
                    "'{shown}': line {line} of a {lines}-line plan"
                );
            }
        }
    }
}

/// The property for one plan text.
fn check(text: &str, origin: &Path) {
    let start = Instant::now();
    let parsed = plan::parse(text, origin);
    match &parsed {
        Err(e) => check_error(e, text, origin),
        Ok(p) => {
            let resolved = plan::resolve(p, &agents());
            match &resolved {
                // Resolve errors are about agents and volumes, which need not be on a line,
                // but they still name the file and what is wrong.
                Err(e) => check_error(e, text, &p.origin),
                Ok(a) => check_wire(a),
            }
        }
    }
    let took = start.elapsed();
    assert!(took < CASE_TIME_LIMIT, "parse and resolve took {took:?}");
}

/// Every fault of a plan that parsed and resolved goes on the wire as a typed message that the
/// agent's decoder (`lockstep_core::fault::wire::from_wire`) accepts and turns back into the
/// very spec the plan built: what the plan refuses nothing downstream has to.
fn check_wire(a: &plan::Assignment) {
    for (_, v) in a.volumes() {
        let wire: Vec<_> = v.faults.iter().map(|f| f.wire()).collect();
        let back = lockstep_core::fault::wire::from_wire(&wire)
            .unwrap_or_else(|e| panic!("a planned fault the agent refuses: {e}\n{wire:?}"));
        let sent: Vec<_> = v.faults.iter().map(|f| f.scheduled_spec()).collect();
        assert_eq!(back, sent, "a fault changed on the wire");
    }
}

/// One step of a path into a TOML document.
#[derive(Debug, Clone)]
enum Step {
    Key(String),
    Item(usize),
}

/// Every path to a value in `v`, parents before children.
fn paths(v: &Value, prefix: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    match v {
        Value::Table(t) => {
            for (k, child) in t {
                prefix.push(Step::Key(k.clone()));
                out.push(prefix.clone());
                paths(child, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                prefix.push(Step::Item(i));
                out.push(prefix.clone());
                paths(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

fn get_mut<'a>(v: &'a mut Value, path: &[Step]) -> Option<&'a mut Value> {
    let mut cur = v;
    for step in path {
        cur = match (step, cur) {
            (Step::Key(k), Value::Table(t)) => t.get_mut(k)?,
            (Step::Item(i), Value::Array(a)) => a.get_mut(*i)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// Values that are wrong for some key: other types, extremes, hostile strings.
fn hostile_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Integer(0)),
        Just(Value::Integer(-1)),
        Just(Value::Integer(1)),
        Just(Value::Integer(i64::MAX)),
        Just(Value::Integer(i64::MIN)),
        Just(Value::Integer(u32::MAX as i64 + 1)),
        any::<i64>().prop_map(Value::Integer),
        Just(Value::Float(0.0)),
        Just(Value::Float(-0.0)),
        Just(Value::Float(1e308)),
        Just(Value::Float(-1e308)),
        Just(Value::Float(f64::NAN)),
        Just(Value::Float(f64::INFINITY)),
        Just(Value::Float(f64::NEG_INFINITY)),
        Just(Value::Float(5e-324)),
        any::<f64>().prop_map(Value::Float),
        any::<bool>().prop_map(Value::Boolean),
        prop::sample::select(vec![
            "",
            "0",
            "-1",
            "1s",
            "0s",
            "-5s",
            "1.5.5s",
            "99999999999999999999999h",
            "18446744073709551615ns",
            "584y",
            "1e3s",
            "NaNs",
            "infs",
            "1m30",
            ".s",
            "5 s",
            "10ms",
            "1h",
            "99d",
            "p99",
            "p100",
            "p0",
            "p99.99999",
            "iops_min",
            "mbps_min",
            "read",
            "write",
            "any",
            "volume",
            "node",
            "cluster",
            "ebs",
            "stall",
            "latency",
            "kill",
            "pause",
            "cut_off",
            "exec",
            "kernel_throttle",
            "error",
            "gp2",
            "io2",
            "oltp-8k",
            "randread-4k",
            "agent-1",
            "agent-9",
            "data",
            "nope",
            "db",
            "staging",
            "worker",
            "measure",
            "ramp",
            "jobs/staging.fio",
            "jobs/missing.fio",
            "jobs",
            "../examples/jobs/staging.fio",
            "é",
            "🦀",
            "\u{202e}",
            "a\nb",
            "${UNSET}",
            "[role]",
            "iodepth",
            "\"",
        ])
        .prop_map(|s| Value::String(s.to_string())),
        "\\PC{0,16}".prop_map(Value::String),
        (1usize..5000).prop_map(|n| Value::String("9".repeat(n))),
        Just(Value::Array(Vec::new())),
        Just(Value::Table(toml::Table::new())),
    ];
    leaf.prop_recursive(4, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(known_key(), inner, 0..4)
                .prop_map(|m| Value::Table(m.into_iter().collect())),
        ]
    })
}

/// Keys the plan format knows (and a few near misses), so additions reach the checks.
fn known_key() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => prop::sample::select(vec![
            "name", "duration", "interval", "ramp", "agent", "role", "phase", "objective",
            "fault", "address", "labels", "select", "volumes", "workload", "rate_iops",
            "rate_curve", "depth_sweep", "sweep_over", "measure", "metric", "direction",
            "below", "above", "scope", "at", "target", "kind", "agents", "profile", "jobfile",
            "fio", "set", "volume_type", "size_gib", "time_scale", "add_us", "fraction",
            "iodepth", "numjobs", "rw", "bs", "size", "runtime", "time_based", "filename",
            "directory", "include", "percentile_list", "command", "signal", "iops", "mibs",
            "seconds", "durration", "iodepht",
        ])
        .prop_map(str::to_string),
        1 => "[a-z_]{1,10}",
        1 => "\\PC{0,6}",
    ]
}

/// A deeply nested value (arrays in arrays, or tables in tables).
fn nested(depth: usize, tables: bool) -> Value {
    let mut v = Value::Integer(1);
    for _ in 0..depth {
        v = if tables {
            Value::Table([("x".to_string(), v)].into_iter().collect())
        } else {
            Value::Array(vec![v])
        };
    }
    v
}

/// One structure-aware change to a parsed plan.
#[derive(Debug, Clone)]
enum Mutation {
    Drop(Index),
    Replace(Index, Value),
    Insert(Index, String, Value),
    /// Copies an element of an array (a second role or fault with the same name).
    DuplicateItem(Index),
    Nest(Index, usize, bool),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => any::<Index>().prop_map(Mutation::Drop),
        5 => (any::<Index>(), hostile_value()).prop_map(|(i, v)| Mutation::Replace(i, v)),
        3 => (any::<Index>(), known_key(), hostile_value())
            .prop_map(|(i, k, v)| Mutation::Insert(i, k, v)),
        2 => any::<Index>().prop_map(Mutation::DuplicateItem),
        1 => (any::<Index>(), 1usize..64, any::<bool>())
            .prop_map(|(i, d, t)| Mutation::Nest(i, d, t)),
    ]
}

fn apply(doc: &mut Value, m: &Mutation) {
    let mut all = Vec::new();
    paths(doc, &mut Vec::new(), &mut all);
    if all.is_empty() {
        if let (Mutation::Insert(_, k, v), Value::Table(t)) = (m, &mut *doc) {
            t.insert(k.clone(), v.clone());
        }
        return;
    }
    let pick = |i: &Index| all[i.index(all.len())].clone();
    match m {
        Mutation::Drop(i) => {
            let path = pick(i);
            let (last, parent) = path.split_last().expect("non-empty");
            match (get_mut(doc, parent), last) {
                (Some(Value::Table(t)), Step::Key(k)) => {
                    t.remove(k);
                }
                (Some(Value::Array(a)), Step::Item(n)) if *n < a.len() => {
                    a.remove(*n);
                }
                _ => {}
            }
        }
        Mutation::Replace(i, v) => {
            if let Some(slot) = get_mut(doc, &pick(i)) {
                *slot = v.clone();
            }
        }
        Mutation::Insert(i, k, v) => {
            // Into the table at the path, or the one holding it.
            let path = pick(i);
            match get_mut(doc, &path) {
                Some(Value::Table(t)) => {
                    t.insert(k.clone(), v.clone());
                }
                _ => {
                    if let Some(Value::Table(t)) = get_mut(doc, &path[..path.len() - 1]) {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        Mutation::DuplicateItem(i) => {
            let path = pick(i);
            if let (Some(Step::Item(n)), parent) = (path.last(), &path[..path.len() - 1])
                && let Some(Value::Array(a)) = get_mut(doc, parent)
                && let Some(item) = a.get(*n).cloned()
            {
                a.insert(*n, item);
            }
        }
        Mutation::Nest(i, depth, tables) => {
            if let Some(slot) = get_mut(doc, &pick(i)) {
                *slot = nested(*depth, *tables);
            }
        }
    }
}

/// Line-level changes to the text, which keep TOML's own errors in play (a duplicated key
/// line is a TOML error, a cut line an unterminated string or table header).
#[derive(Debug, Clone)]
enum LineEdit {
    Delete(Index),
    Duplicate(Index),
    Swap(Index, Index),
    Truncate(Index, Index),
    Insert(Index, String),
}

fn line_edit() -> impl Strategy<Value = LineEdit> {
    prop_oneof![
        1 => any::<Index>().prop_map(LineEdit::Delete),
        2 => any::<Index>().prop_map(LineEdit::Duplicate),
        1 => any::<(Index, Index)>().prop_map(|(a, b)| LineEdit::Swap(a, b)),
        1 => any::<(Index, Index)>().prop_map(|(a, b)| LineEdit::Truncate(a, b)),
        1 => (
            any::<Index>(),
            prop_oneof![
                prop::sample::select(vec![
                    "[[role]]", "[[fault]]", "[[phase]]", "[[objective]]", "[[agent]]",
                    "[role]", "[role.workload]", "[role.workload.fio]", "[role.workload.set]",
                    "[fault.target]", "duration = \"10s\"", "duration = 10", "name = \"x\"",
                    "name = \"db\"", "kind = \"kill\"", "at = \"1s\"", "iodepth = 99999999999",
                    "numjobs = -1", "x = [[[[[[[[1]]]]]]]]", "workload = {}", "a.b.c.d = 1",
                    "\"\" = 1", "[[role.workload]]",
                ])
                .prop_map(str::to_string),
                "\\PC{0,20}",
            ],
        )
            .prop_map(|(i, l)| LineEdit::Insert(i, l)),
    ]
}

fn edit_lines(text: &str, edits: &[LineEdit]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for e in edits {
        if lines.is_empty() {
            break;
        }
        let n = lines.len();
        match e {
            LineEdit::Delete(i) => {
                lines.remove(i.index(n));
            }
            LineEdit::Duplicate(i) => {
                let l = lines[i.index(n)].clone();
                lines.insert(i.index(n), l);
            }
            LineEdit::Swap(a, b) => lines.swap(a.index(n), b.index(n)),
            LineEdit::Truncate(i, at) => {
                let l = &mut lines[i.index(n)];
                let cut = at.index(l.len() + 1);
                let cut = (0..=cut)
                    .rev()
                    .find(|c| l.is_char_boundary(*c))
                    .unwrap_or(0);
                l.truncate(cut);
            }
            LineEdit::Insert(i, new) => lines.insert(i.index(n + 1), new.clone()),
        }
    }
    lines.join("\n")
}

fn seed() -> impl Strategy<Value = Seed> {
    prop::sample::select(seeds().to_vec())
}

proptest! {
    #![proptest_config(config(256))]

    /// Arbitrary bytes, made UTF-8 (a plan file that is not UTF-8 is a read error).
    #[test]
    fn arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let text = String::from_utf8_lossy(&bytes);
        check(&text, &repo().join("examples/bytes.toml"));
    }

    /// A shipped plan with a few structure-aware mutations (TOML re-serialized).
    #[test]
    fn mutated_plans(s in seed(), mutations in prop::collection::vec(mutation(), 1..5)) {
        let Ok(mut doc) = s.text.parse::<toml::Table>().map(Value::Table) else {
            // A docs snippet that is not a whole document: mutate its text instead.
            check(&s.text, &s.origin);
            return Ok(());
        };
        for m in &mutations {
            apply(&mut doc, m);
        }
        // Some values (a table inside an array of scalars, ...) cannot be written back as
        // TOML; those cases say nothing about the parser.
        let Ok(text) = toml::to_string(&doc) else { return Ok(()); };
        check(&text, &s.origin);
    }

    /// A shipped plan with lines deleted, doubled, swapped, cut or inserted.
    #[test]
    fn plans_with_edited_lines(s in seed(), edits in prop::collection::vec(line_edit(), 1..4)) {
        let text = edit_lines(&s.text, &edits);
        check(&text, &s.origin);
    }

    /// Both at once: structure first, then lines of the re-serialized text.
    #[test]
    fn mutated_and_edited(
        s in seed(),
        mutations in prop::collection::vec(mutation(), 0..3),
        edits in prop::collection::vec(line_edit(), 0..3),
    ) {
        let Ok(mut doc) = s.text.parse::<toml::Table>().map(Value::Table) else {
            return Ok(());
        };
        for m in &mutations {
            apply(&mut doc, m);
        }
        let Ok(text) = toml::to_string(&doc) else { return Ok(()); };
        check(&edit_lines(&text, &edits), &s.origin);
    }
}

/// Every seed parses as it is (otherwise the mutations start from broken plans and the fuzz
/// tells little), except docs snippets that are fragments.
#[test]
fn the_example_seeds_are_valid_plans() {
    for s in seeds()
        .iter()
        .filter(|s| !s.origin.ends_with("from-docs.toml"))
    {
        if let Err(e) = plan::parse(&s.text, &s.origin) {
            panic!("{e}");
        }
    }
}

/// Deep nesting in the text itself: TOML parsers recurse, and a stack overflow is an abort
/// that no `catch_unwind` sees.
#[test]
fn deeply_nested_values_are_refused_or_parsed_without_overflow() {
    let origin = repo().join("examples/deep.toml");
    let role = "duration = \"10s\"\n[[role]]\nname = \"w\"\nworkload = { profile = \"oltp-8k\" }\n";
    for depth in [100usize, 1_000, 10_000, 100_000] {
        let arrays = format!("duration = {}1{}\n", "[".repeat(depth), "]".repeat(depth));
        let tables = format!("duration = {}1{}\n", "{a=".repeat(depth), "}".repeat(depth));
        let dotted = vec!["a"; depth].join(".");
        let texts = [
            arrays,
            tables,
            format!("{dotted} = 1\n"),
            format!("{role}[role.workload.fio]\n{dotted} = 1\n"),
            format!("{role}[role.workload.set]\nx.{dotted} = 1\n"),
            format!("{role}[[fault]]\nat = \"1s\"\nkind = \"stall\"\n{dotted} = 1\n"),
            format!(
                "{role}[[objective]]\nmetric = \"p99\"\nbelow = {}1{}\n",
                "[".repeat(depth),
                "]".repeat(depth)
            ),
            format!("[{dotted}]\nx = 1\n"),
        ];
        for text in &texts {
            check(text, &origin);
        }
    }
}
