//! Fuzzing the job-file parser: arbitrary bytes, and job files generated from fio's grammar with
//! the parser's own option tables, hostile values, `${VAR}`s and `include`s of real files.
//!
//! Why: job text arrives over the network (the agent's Prepare) and from hand-written files, so
//! no input may panic, hang or give an error that does not say where. The property checked on
//! every case: the parse returns, in bounded time, either jobs or an error that names the file
//! and a line that exists (and the option, for an option's error). Jobs that parse are also
//! planned onto a scratch directory (`layout::plan_files`, which only looks at metadata), the
//! next thing the agent does with them, so arithmetic on hostile sizes is covered too.
//!
//! The committed case counts keep `cargo test` fast; for a long run set `PROPTEST_CASES`
//! (e.g. `PROPTEST_CASES=20000 cargo test -p lockstep-agent --lib jobfile_fuzz`).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::Config;

use std::path::Path;

use lockstep_core::job::JobSpec;
use lockstep_core::jobfile::*;

/// A parse (and the plan of its jobs) slower than this is a hang for our purposes: real job
/// files parse in microseconds.
const CASE_TIME_LIMIT: Duration = Duration::from_secs(5);

/// The most clones and files per job the harness plans: the count limits are a separate
/// change, and a harness that allocates 4 billion paths would only measure the machine.
const PLAN_LIMIT: u32 = 16;

fn config(default_cases: u32) -> Config {
    // `PROPTEST_CASES` overrides the default for long runs.
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

/// Every option name the parser knows, from its own tables.
fn option_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = SUPPORTED
        .iter()
        .chain(ADVISORY)
        .chain(LOCKSTEP_ONLY)
        .chain(FIO_OPTIONS)
        .copied()
        .chain(ALIASES.iter().map(|(alias, _)| *alias))
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// The options lockstep implements (and their aliases): the ones whose values it reads.
fn implemented_names() -> Vec<&'static str> {
    SUPPORTED
        .iter()
        .chain(ADVISORY)
        .chain(LOCKSTEP_ONLY)
        .copied()
        .chain(ALIASES.iter().map(|(alias, _)| *alias))
        .collect()
}

/// Values at the edges of what the numeric options hold: around 2^32, 2^63 and 2^64, with and
/// without unit suffixes, as sizes, counts, percentages and times.
fn extreme_value() -> impl Strategy<Value = String> {
    let edges = prop_oneof![
        Just(0u64),
        Just(1),
        Just(511),
        Just(512),
        Just(4095),
        Just(4096),
        Just(u64::from(u32::MAX)),
        Just(u64::from(u32::MAX) + 1),
        Just(1 << 53),
        Just(i64::MAX as u64),
        Just(u64::MAX / 2 + 1),
        Just(u64::MAX - 4095),
        Just(u64::MAX - 1),
        Just(u64::MAX),
        any::<u64>(),
    ];
    prop_oneof![
        6 => (edges, prop::sample::select(vec!["", "", "", "k", "m", "g", "t", "p", "%", "s", "ms", "us", "h", "d"]))
            .prop_map(|(n, s)| format!("{n}{s}")),
        1 => any::<u64>().prop_map(|n| format!("0x{n:x}")),
        1 => (1u64..=16).prop_map(|n| format!("{n}p")),
        1 => (1u64..=100).prop_map(|n| format!("{n}%")),
    ]
}

/// The options whose values are numbers (sizes, counts, times, rates).
const NUMERIC_OPTIONS: &[&str] = &[
    "size",
    "filesize",
    "io_size",
    "offset",
    "bs",
    "bssplit",
    "nrfiles",
    "numjobs",
    "iodepth",
    "rate",
    "rate_iops",
    "runtime",
    "ramp_time",
    "startdelay",
    "thinktime",
    "thinktime_blocks",
    "fsync",
    "fdatasync",
    "randseed",
    "rwmixread",
    "rwmixwrite",
    "iodepth_batch_complete_max",
    "stuck_timeout",
];

/// The environment the fuzzed parses see (the process environment is not touched).
fn fuzz_env(name: &str) -> Option<String> {
    Some(
        match name {
            "BS" => "4k",
            "DEPTH" => "32",
            "EMPTY" => "",
            "HUGE" => "99999999999999999999999",
            "UNI" => "ä🦀\u{202e}",
            "NESTED" => "${BS}",
            "DOLLAR" => "$pagesize",
            "INC" => "inc_ok.fio",
            _ => return None,
        }
        .to_string(),
    )
}

/// A directory of files for `include` lines to name, shared by all cases (created once).
fn include_dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let files: [(&str, &str); 7] = [
            ("inc_ok.fio", "iodepth=4\nbs=8k ; comment\nthread\n"),
            ("inc_bad.fio", "# a comment\nbs=4q\n"),
            ("inc_section.fio", "iodepth=2\n[other]\n"),
            ("inc_self.fio", "include inc_self.fio\n"),
            ("inc_a.fio", "include inc_b.fio\n"),
            ("inc_b.fio", "rw=randread\ninclude inc_a.fio\n"),
            ("inc_env.fio", "bs=${BS}\niodepth=${UNSET_IN_INCLUDE}\n"),
        ];
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).expect("write include file");
        }
        std::fs::write(dir.path().join("inc_binary.fio"), b"bs=4k\n\xff\xfe\x00\n")
            .expect("write include file");
        std::fs::create_dir(dir.path().join("subdir")).expect("subdir");
        dir
    })
    .path()
}

/// A scratch directory jobs are planned onto (never written to: planning only reads
/// metadata).
fn scratch_dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("temp dir"))
        .path()
}

fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0".to_string()),
        Just("1".to_string()),
        Just("4".to_string()),
        Just("100".to_string()),
        Just("512".to_string()),
        Just("4096".to_string()),
        Just(u32::MAX.to_string()),
        Just((u64::from(u32::MAX) + 1).to_string()),
        Just(u64::MAX.to_string()),
        Just((u64::MAX / 2).to_string()),
        Just("18446744073709551616".to_string()),
        Just("9".repeat(40)),
        Just("-1".to_string()),
        Just("-0".to_string()),
        Just("+5".to_string()),
        Just("0x10".to_string()),
        Just("0xFFFFFFFFFFFFFFFF".to_string()),
        Just("0x1FFFFFFFFFFFFFFFF".to_string()),
        Just("0x".to_string()),
        Just("1.5".to_string()),
        Just("1e309".to_string()),
        Just("inf".to_string()),
        Just("NaN".to_string()),
        Just("٣".to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        (0u32..5000).prop_map(|n| n.to_string()),
    ]
}

fn suffix() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "", "", "", "k", "K", "kb", "KiB", "ki", "m", "M", "mib", "g", "gb", "t", "p", "pib", "e",
        "b", "%", " %", "s", "ms", "us", "usec", "msec", "h", "d", "min", "sec", "ns", "q", ".",
        ".5", "k5", " k", "é",
    ])
}

/// An option value: valid ones, numbers with suffixes, lists, variables and garbage.
fn value() -> impl Strategy<Value = String> {
    let scalar = prop_oneof![
        4 => (number(), suffix()).prop_map(|(n, s)| format!("{n}{s}")),
        2 => prop::sample::select(vec![
            "read", "write", "randread", "randwrite", "rw", "randrw", "readwrite", "trim",
            "randread:8", "io_uring", "libaio", "psync", "null", "sync", "posixaio", "crc32c",
            "md5", "none", "linear", "poisson", "random", "zipf", "zipf:1.2", "zipf:1",
            "zipf:0", "pareto:0.5", "pareto:1", "normal:5", "normal", "gauss:100", "zoned:50/50",
            "random:1", "zipf:1.2:0.5", "4k/50:8k/50", "4k/:8k/", "4k/101", "4k/0:8k/0",
            "4k/60:8k/60", "/", ":", "::", "4k-8k", "4k:8k", "1-", "(4k*2)", "2*$ncpus",
            "$pagesize", "$mb_memory", "$ncpus", "1000", "1024", "gettimeofday", "sequential",
            "tausworthe", "lfsr", "99:99.9:99.99", "0:50", "100.1", "50:50:50:50:50:50:50:50:50:50:50:50:50:50:50:50:50:50:50:50:50",
            "/tmp/x", "a\\:b:c", "-", "..", "../..", "/dev/null", "jobs/a:jobs/b",
        ])
        .prop_map(str::to_string),
        1 => Just(String::new()),
        1 => prop::sample::select(vec![
            "${BS}", "${DEPTH}", "${EMPTY}", "${HUGE}", "${UNI}", "${NESTED}", "${DOLLAR}",
            "${UNSET_VAR}", "${", "${}", "${BS", "$", "${BS}${DEPTH}", "x${BS}y", "${${BS}}",
            "$${BS}", "${ BS }",
        ])
        .prop_map(str::to_string),
        1 => "\\PC{0,12}",
        1 => "[\\x00-\\x7f]{0,8}",
        1 => "[0-9kKmMgG%.:,/ -]{0,10}",
    ];
    // Per-direction lists (`bs=4k,8k`) and colon lists of the scalars.
    prop_oneof![
        6 => scalar.clone(),
        1 => prop::collection::vec(scalar.clone(), 1..5).prop_map(|v| v.join(",")),
        1 => prop::collection::vec(scalar, 1..5).prop_map(|v| v.join(":")),
    ]
}

fn section_name() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => Just("global".to_string()),
        3 => prop::sample::select(vec!["j", "job1", "Read-Test", "a b", "..", ".", "x/y", "é"])
            .prop_map(str::to_string),
        1 => "\\PC{0,10}",
    ]
}

/// One line of a job file, from the grammar (and its near misses).
fn line(names: Vec<&'static str>) -> impl Strategy<Value = String> {
    let key = prop_oneof![
        6 => prop::sample::select(implemented_names()).prop_map(str::to_string),
        3 => prop::sample::select(names).prop_map(str::to_string),
        1 => "[a-z_]{1,12}",
        1 => "\\PC{0,8}",
        1 => Just("include".to_string()),
    ];
    let include_target = prop_oneof![
        prop::sample::select(vec![
            "inc_ok.fio",
            "inc_bad.fio",
            "inc_section.fio",
            "inc_self.fio",
            "inc_a.fio",
            "inc_env.fio",
            "inc_binary.fio",
            "missing.fio",
            "subdir",
            "",
            "${INC}",
            "${UNSET_X}",
            "${",
            "/dev/null",
            "../",
            "./inc_ok.fio",
            "subdir/../inc_ok.fio",
        ])
        .prop_map(str::to_string),
        "\\PC{0,10}",
    ];
    let spaces = prop::sample::select(vec!["", "", " ", "\t", "  "]);
    prop_oneof![
        2 => section_name().prop_map(|n| format!("[{n}]")),
        1 => prop::sample::select(vec!["[", "]", "[]", "[ ]", "[a", "a]", "[[a]]", "[a]x", "[a]]"])
            .prop_map(str::to_string),
        10 => (key.clone(), spaces.clone(), value(), spaces.clone()).prop_map(|(k, s1, v, s2)| {
            format!("{s1}{k}{s1}={s2}{v}{s2}")
        }),
        2 => key,
        1 => value().prop_map(|v| format!("={v}")),
        2 => include_target.prop_map(|t| format!("include {t}")),
        1 => prop::sample::select(vec!["# comment", "; comment", "", "   ", "include", "includex"])
            .prop_map(str::to_string),
        1 => "\\PC{0,30}",
    ]
}

/// A job file from the grammar: usually starts with a section, so options are reached.
fn job_text() -> impl Strategy<Value = String> {
    let names = option_names();
    (
        prop::sample::select(vec!["[global]\n", "[j]\n", ""]),
        prop::collection::vec(line(names), 0..24),
        prop::sample::select(vec!["\n", "\n", "\r\n", "\r"]),
        any::<bool>(),
    )
        .prop_map(|(head, lines, eol, trailing)| {
            let mut text = head.to_string();
            text.push_str(&lines.join(eol));
            if trailing {
                text.push_str(eol);
            }
            text
        })
}

fn overrides() -> impl Strategy<Value = Vec<(String, String)>> {
    let names = option_names();
    prop::collection::vec(
        (
            prop_oneof![
                4 => prop::sample::select(names).prop_map(str::to_string),
                1 => "\\PC{0,8}",
            ],
            value(),
        ),
        0..3,
    )
}

/// Checks one parse result against the property, then plans the jobs it gave.
fn check(text: &str, origin: &Path, result: Result<Vec<JobSpec>, JobFileError>) {
    match result {
        Ok(jobs) => {
            assert!(!jobs.is_empty(), "Ok with no jobs");
            for job in &jobs {
                if job.origin.file == origin {
                    assert!(
                        job.origin.line >= 1 && job.origin.line <= text.lines().count(),
                        "job '{}' at line {} of a {}-line file",
                        job.name,
                        job.origin.line,
                        text.lines().count()
                    );
                }
            }
            plan(&jobs);
        }
        Err(e) => {
            let shown = e.to_string();
            assert!(!shown.trim().is_empty(), "empty message for {e:?}");
            match &e {
                JobFileError::Read { file, .. } | JobFileError::NoJobs { file } => {
                    assert!(
                        shown.starts_with(&file.display().to_string()),
                        "'{shown}' does not name {}",
                        file.display()
                    );
                }
                _ => {}
            }
            match e.line() {
                Some(at) => {
                    let prefix = format!("{}:{}", at.file.display(), at.line);
                    assert!(
                        shown.starts_with(&prefix),
                        "'{shown}' does not start with {prefix}"
                    );
                    assert!(at.line >= 1, "line 0 in '{shown}'");
                    if at.file == origin {
                        assert!(
                            at.line <= text.lines().count(),
                            "'{shown}': line {} of a {}-line file",
                            at.line,
                            text.lines().count()
                        );
                    }
                }
                None => assert!(
                    matches!(e, JobFileError::Read { .. } | JobFileError::NoJobs { .. })
                        || shown.starts_with("--set "),
                    "'{shown}' names no line and no --set"
                ),
            }
            match &e {
                JobFileError::UnknownOption { option, .. }
                | JobFileError::Unsupported { option, .. }
                | JobFileError::Value { option, .. }
                | JobFileError::UnsetVariable { option, .. } => {
                    assert!(
                        shown.contains(option.as_str()),
                        "'{shown}' does not name {option}"
                    );
                }
                _ => {}
            }
        }
    }
}

/// Plans the first clones of each parsed job onto the scratch directory, as the agent would
/// once it has confined the job to a volume.
fn plan(jobs: &[JobSpec]) {
    for job in jobs {
        let mut job = job.clone();
        job.filenames.clear();
        job.directories = vec![scratch_dir().to_path_buf()];
        job.nrfiles = job.nrfiles.min(PLAN_LIMIT);
        for clone in 0..job.numjobs.min(PLAN_LIMIT) {
            // An error is a fine answer; the point is that planning returns.
            let _ = crate::layout::plan_files(&job, clone);
        }
    }
}

fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = f();
    let took = start.elapsed();
    assert!(took < CASE_TIME_LIMIT, "{what} took {took:?}");
    out
}

proptest! {
    #![proptest_config(config(256))]

    /// Arbitrary bytes (made UTF-8 as the agent's gRPC strings are) never panic.
    #[test]
    fn arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let text = String::from_utf8_lossy(&bytes);
        let origin = Path::new("net/bytes.fio");
        let result = timed("parse", || parse_with_env(&text, origin, None, &[], &fuzz_env));
        check(&text, origin, result);
    }

    /// Arbitrary bytes in a file (possibly not UTF-8) read with `parse_file`.
    #[test]
    fn arbitrary_bytes_in_a_file(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bytes.fio");
        std::fs::write(&path, &bytes).unwrap();
        let result = timed("parse_file", || parse_file(&path, &[]));
        check(&String::from_utf8_lossy(&bytes), &path, result);
    }

    /// Job files from the grammar, as received over the network (no includes allowed).
    #[test]
    fn grammar_without_includes(text in job_text(), set in overrides()) {
        let origin = Path::new("run-1/data.fio");
        let result = timed("parse", || parse_with_env(&text, origin, None, &set, &fuzz_env));
        check(&text, origin, result);
    }

    /// Job files from the grammar read from a directory of include files (cycles, sections
    /// in includes, unset variables, binary files, directories).
    #[test]
    fn grammar_with_includes(text in job_text(), set in overrides()) {
        let dir = include_dir();
        let origin = dir.join("main.fio");
        let result = timed("parse", || parse_with_env(&text, &origin, Some(dir), &set, &fuzz_env));
        check(&text, &origin, result);
    }

    /// One job section with one option: reaches every option's value parser far more often
    /// than whole files do.
    #[test]
    fn every_option_with_hostile_values(
        name in prop::sample::select(option_names()),
        v in value(),
        in_global in any::<bool>(),
    ) {
        let text = if in_global {
            format!("[global]\n{name}={v}\n[j]\n")
        } else {
            format!("[j]\n{name}={v}\n")
        };
        let origin = Path::new("one.fio");
        let result = timed("parse", || parse_with_env(&text, origin, None, &[], &fuzz_env));
        check(&text, origin, result);
    }

    /// Numeric options together with values at the edges of 32 and 64 bits: the arithmetic
    /// on them (offset + size, size / nrfiles, bs against size) happens when jobs are planned.
    #[test]
    fn numeric_options_at_their_edges(
        options in prop::collection::vec(
            (prop::sample::select(NUMERIC_OPTIONS), extreme_value()),
            1..6,
        ),
        rw in prop::sample::select(vec!["read", "write", "randrw", "rw"]),
    ) {
        let mut text = format!("[j]\nrw={rw}\n");
        for (name, v) in &options {
            text.push_str(&format!("{name}={v}\n"));
        }
        let origin = Path::new("edges.fio");
        let result = timed("parse", || parse_with_env(&text, origin, None, &[], &fuzz_env));
        check(&text, origin, result);
    }

    /// Several options lockstep implements, together: their combinations (a huge offset with
    /// a huge size, bs against size, kb_base before sizes) reach the planning arithmetic.
    #[test]
    fn supported_options_together(
        options in prop::collection::vec(
            (prop::sample::select(implemented_names()), value()),
            1..8,
        ),
    ) {
        let mut text = "[j]\n".to_string();
        for (name, v) in &options {
            text.push_str(&format!("{name}={v}\n"));
        }
        let origin = Path::new("together.fio");
        let result = timed("parse", || parse_with_env(&text, origin, None, &[], &fuzz_env));
        check(&text, origin, result);
    }
}
