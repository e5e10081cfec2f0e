//! fio job files into `JobSpec`s.
//!
//! The format is fio's (checked against fio 3.33 and its HOWTO):
//! - INI: `[global]` and job sections, one `key=value` (or bare `key`) per line. A `[global]`
//!   section applies to the jobs *after* it; a later `[global]` adds to the earlier one for the
//!   jobs that follow it. Section headers may be indented.
//! - Comments: everything from the first `#` or `;` on a line, as fio does (so `bs=4k ; note`
//!   is `bs=4k`).
//! - `include FILE` inside a section pulls in that file's options (relative to the including
//!   file's directory). Included files may not have sections (fio's rule). Nesting is limited
//!   and cycles are refused.
//! - `${VAR}` in a value is the environment variable `VAR`. fio substitutes an empty string for
//!   an unset variable; we refuse it, because `directory=${DIR}` silently becoming the current
//!   directory is exactly the surprise a benchmark must not have. fio's reserved keywords
//!   `$pagesize`, `$mb_memory` and `$ncpus` are substituted too.
//! - Numbers follow `units` (fio's suffix rules, `kb_base`).
//!
//! Every option is either mapped onto `JobSpec`, accepted as advisory (documented in
//! docs/fio-compatibility.md: it does not change the IO issued or what is measured), or refused
//! with an error naming file, line and option. Nothing is silently ignored.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::job::{
    BlockSizes, Distribution, EngineKind, Extent, JobSpec, Origin, Pattern, RateProcess, VerifyKind,
};
use crate::limits::{self, MAX_TEXT_FILE, TextFileError};
use crate::units::{self, KbBase, TimeUnit};

/// How deep `include` may nest. fio has no limit; a chain this deep is a mistake or a cycle
/// through paths that do not canonicalize to the same file.
pub const MAX_INCLUDE_DEPTH: usize = 16;

/// fio's limit on `percentile_list` entries.
const MAX_PERCENTILES: usize = 20;

/// Where an option was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// A line of a job file (or of a file it includes).
    Line(Origin),
    /// `--set key=value` on the command line (applied to every job after its own options).
    Override { key: String, value: String },
}

/// A job file that cannot be run as written. Display always says where (file and line, or the
/// `--set` it came from) and, when there is one, which option.
#[derive(Debug, thiserror::Error)]
pub enum JobFileError {
    #[error("{}: cannot read job file: {source}", .file.display())]
    Read {
        file: PathBuf,
        #[source]
        source: TextFileError,
    },
    #[error("{}: no jobs: the file has no job section (add e.g. [job1])", .file.display())]
    NoJobs { file: PathBuf },
    #[error("{at}: {message}")]
    Syntax { at: Origin, message: String },
    #[error("{at}: include {target}: {message}")]
    Include {
        at: Origin,
        target: String,
        message: String,
    },
    #[error("{at}: {option}: environment variable ${{{var}}} is not set")]
    UnsetVariable {
        at: Origin,
        option: String,
        var: String,
    },
    /// An option lockstep does not know at all (a typo, or an option of an engine we lack).
    #[error("{}: option '{option}': unknown option{}", .at, suggestion_text(.suggestion))]
    UnknownOption {
        at: Place,
        option: String,
        suggestion: Option<&'static str>,
    },
    /// A fio option lockstep does not implement.
    #[error(
        "{}: option '{option}': not supported by lockstep{} (see docs/fio-compatibility.md)",
        .at, hint_text(.hint)
    )]
    Unsupported {
        at: Place,
        option: String,
        hint: Option<&'static str>,
    },
    /// A known option with a value it cannot take.
    #[error("{}: {message}", value_prefix(.at, .option, .value))]
    Value {
        at: Place,
        option: String,
        /// As written, before `${VAR}` expansion (an environment value may be a secret, and
        /// errors travel to the coordinator); `None` for a bare option.
        value: Option<String>,
        message: String,
    },
}

impl JobFileError {
    /// The file line the error is about, if it is about one.
    pub fn line(&self) -> Option<&Origin> {
        match self {
            JobFileError::Read { .. } | JobFileError::NoJobs { .. } => None,
            JobFileError::Syntax { at, .. }
            | JobFileError::Include { at, .. }
            | JobFileError::UnsetVariable { at, .. } => Some(at),
            JobFileError::UnknownOption { at, .. }
            | JobFileError::Unsupported { at, .. }
            | JobFileError::Value { at, .. } => match at {
                Place::Line(origin) => Some(origin),
                Place::Override { .. } => None,
            },
        }
    }
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Line(origin) => write!(f, "{origin}"),
            Place::Override { key, value } => write!(f, "--set {key}={value}"),
        }
    }
}

fn suggestion_text(suggestion: &Option<&'static str>) -> String {
    suggestion
        .map(|s| format!(" (did you mean '{s}'?)"))
        .unwrap_or_default()
}

fn hint_text(hint: &Option<&'static str>) -> String {
    hint.map(|h| format!(": {h}")).unwrap_or_default()
}

/// "file:line: key=value" for a job-file line; "--set key=value" for an override (which
/// already shows the option).
fn value_prefix(at: &Place, option: &str, value: &Option<String>) -> String {
    match (at, value) {
        (Place::Override { .. }, _) => at.to_string(),
        (Place::Line(origin), Some(v)) => format!("{origin}: {option}={v}"),
        (Place::Line(origin), None) => format!("{origin}: {option}"),
    }
}

/// Parses the job file at `path`; `include`s resolve relative to its directory. `overrides`
/// (`--set key=value`) are applied to every job after its own options.
pub fn parse_file(
    path: &Path,
    overrides: &[(String, String)],
) -> Result<Vec<JobSpec>, JobFileError> {
    let text = limits::read_text_file(path, MAX_TEXT_FILE, "job file").map_err(|source| {
        JobFileError::Read {
            file: path.to_path_buf(),
            source,
        }
    })?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    parse_str(&text, path, Some(dir), overrides)
}

/// Parses job-file text. `origin` names the text in messages; `include_base` is the directory
/// `include` resolves against, and `None` refuses `include` (job text received over the network
/// must not read the agent's files).
pub fn parse_str(
    text: &str,
    origin: &Path,
    include_base: Option<&Path>,
    overrides: &[(String, String)],
) -> Result<Vec<JobSpec>, JobFileError> {
    parse_with_env(text, origin, include_base, overrides, &|name| {
        std::env::var(name).ok()
    })
}

/// `parse_str` with the environment given, so tests need not mutate the process environment
/// (public for the agent's fuzz test, `agent/src/jobfile_fuzz.rs`).
pub fn parse_with_env(
    text: &str,
    origin: &Path,
    include_base: Option<&Path>,
    overrides: &[(String, String)],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<JobSpec>, JobFileError> {
    let mut reader = Reader {
        items: Vec::new(),
        chain: Vec::new(),
        in_section: false,
        env,
    };
    // The top file is part of the chain when it is a real file, so including itself is a cycle.
    let top = include_base.and_then(|_| std::fs::canonicalize(origin).ok());
    reader.chain.extend(top);
    reader.read(text, origin, include_base, false)?;
    let overrides: Vec<RawOption> = overrides
        .iter()
        .map(|(key, value)| RawOption {
            key: key.trim().to_string(),
            // `--set time_based=` means the bare option, as `time_based` alone on a line.
            value: Some(value.trim().to_string()).filter(|v| !v.is_empty()),
            shown: Some(value.clone()),
            env_values: Vec::new(),
            at: Place::Override {
                key: key.clone(),
                value: value.clone(),
            },
        })
        .collect();
    build_jobs(reader.items, &overrides, origin)
}

/// One `key[=value]` as read, after `${VAR}` expansion.
#[derive(Debug, Clone)]
struct RawOption {
    key: String,
    value: Option<String>,
    /// The value as it should appear in messages: as written, never expanded.
    shown: Option<String>,
    /// `(name, value)` of every `${VAR}` expanded in the value: messages about the value must
    /// not quote these (see `redact`).
    env_values: Vec<(String, String)>,
    at: Place,
}

#[derive(Debug)]
enum Item {
    Section { name: String, at: Origin },
    Option(RawOption),
}

/// Reads lines (and included files) into a flat list of sections and options.
struct Reader<'e> {
    items: Vec<Item>,
    /// Canonical paths of the files being read, outermost first: an include of one of them is
    /// a cycle.
    chain: Vec<PathBuf>,
    in_section: bool,
    env: &'e dyn Fn(&str) -> Option<String>,
}

impl Reader<'_> {
    fn read(
        &mut self,
        text: &str,
        file: &Path,
        include_dir: Option<&Path>,
        included: bool,
    ) -> Result<(), JobFileError> {
        for (index, line) in text.lines().enumerate() {
            let at = Origin {
                file: file.to_path_buf(),
                line: index + 1,
            };
            let content = strip_comment(line).trim();
            if content.is_empty() {
                continue;
            }
            if content.starts_with('[') {
                self.section(content, at, included)?;
            } else if let Some(target) = include_target(content) {
                self.include(target, at, include_dir)?;
            } else {
                self.option(content, at)?;
            }
        }
        Ok(())
    }

    fn section(&mut self, content: &str, at: Origin, included: bool) -> Result<(), JobFileError> {
        if included {
            return Err(JobFileError::Syntax {
                at,
                message: format!(
                    "{content}: an included file may not start sections (fio's rule); \
                     put the section header in the including file"
                ),
            });
        }
        let name = content
            .strip_prefix('[')
            .and_then(|c| c.strip_suffix(']'))
            .map(str::trim)
            .ok_or_else(|| JobFileError::Syntax {
                at: at.clone(),
                message: format!("'{content}' is not a section header (expected [name])"),
            })?;
        if name.is_empty() || name.contains(['[', ']']) {
            return Err(JobFileError::Syntax {
                at,
                message: format!("'{content}' is not a valid section name"),
            });
        }
        self.in_section = true;
        self.items.push(Item::Section {
            name: name.to_string(),
            at,
        });
        Ok(())
    }

    fn include(
        &mut self,
        target: &str,
        at: Origin,
        include_dir: Option<&Path>,
    ) -> Result<(), JobFileError> {
        if target.is_empty() {
            return Err(JobFileError::Syntax {
                at,
                message: "include needs a file name (include FILE)".to_string(),
            });
        }
        let fail = |message: String| JobFileError::Include {
            at: at.clone(),
            target: target.to_string(),
            message,
        };
        if !self.in_section {
            return Err(fail(
                "include outside of a section (fio's rule: an included file's options \
                 belong to the section that includes it)"
                    .to_string(),
            ));
        }
        let Some(dir) = include_dir else {
            return Err(fail(
                "include is not allowed in job text received without a base directory; \
                 inline the included options"
                    .to_string(),
            ));
        };
        let (expanded, vars) = expand(target, self.env).map_err(|e| match e {
            ExpandError::Unset(var) => JobFileError::UnsetVariable {
                at: at.clone(),
                option: "include".to_string(),
                var,
            },
            ExpandError::Malformed(message) => fail(message),
        })?;
        let path = dir.join(&expanded);
        if self.chain.len() > MAX_INCLUDE_DEPTH {
            return Err(fail(format!(
                "includes nested more than {MAX_INCLUDE_DEPTH} deep"
            )));
        }
        // The path is shown as written when the environment made it: values are not echoed.
        let shown = if vars.is_empty() {
            path.display().to_string()
        } else {
            format!("{target} (expanded path not shown)")
        };
        let canonical =
            std::fs::canonicalize(&path).map_err(|e| fail(format!("cannot read {shown}: {e}")))?;
        if let Some(start) = self.chain.iter().position(|p| *p == canonical) {
            let cycle: Vec<String> = self.chain[start..]
                .iter()
                .chain(std::iter::once(&canonical))
                .map(|p| p.display().to_string())
                .collect();
            return Err(fail(format!("include cycle: {}", cycle.join(" -> "))));
        }
        let text = limits::read_text_file(&path, MAX_TEXT_FILE, "job file")
            .map_err(|e| fail(format!("cannot read {shown}: {e}")))?;
        self.chain.push(canonical);
        let nested_dir = path.parent().map(Path::to_path_buf);
        let result = self.read(&text, &path, nested_dir.as_deref(), true);
        self.chain.pop();
        result
    }

    fn option(&mut self, content: &str, at: Origin) -> Result<(), JobFileError> {
        let (key, raw) = match content.split_once('=') {
            Some((k, v)) => (k.trim(), Some(v.trim())),
            None => (content, None),
        };
        if key.is_empty() {
            return Err(JobFileError::Syntax {
                at,
                message: format!("'{content}' has no option name"),
            });
        }
        if !self.in_section {
            return Err(JobFileError::Syntax {
                at,
                message: format!(
                    "{content}: option outside of a section (put [global] or [jobname] above it)"
                ),
            });
        }
        let (value, vars) = match raw {
            None => (None, Vec::new()),
            Some(raw) => expand(raw, self.env)
                .map(|(v, vars)| (Some(v), vars))
                .map_err(|e| match e {
                    ExpandError::Unset(var) => JobFileError::UnsetVariable {
                        at: at.clone(),
                        option: key.to_string(),
                        var,
                    },
                    ExpandError::Malformed(message) => JobFileError::Value {
                        at: Place::Line(at.clone()),
                        option: key.to_string(),
                        value: Some(raw.to_string()),
                        message,
                    },
                })?,
        };
        self.items.push(Item::Option(RawOption {
            key: key.to_string(),
            value,
            shown: raw.map(str::to_string),
            env_values: vars,
            at: Place::Line(at),
        }));
        Ok(())
    }
}

/// fio drops everything from the first `#` or `;` on a line (verified with fio 3.33:
/// `filename=/tmp/a#b` is `/tmp/a`).
fn strip_comment(line: &str) -> &str {
    match line.find(['#', ';']) {
        Some(i) => &line[..i],
        None => line,
    }
}

/// `include FILE` (the word, whitespace, the file). `included=1` or `include_x` are options.
fn include_target(content: &str) -> Option<&str> {
    let rest = content.strip_prefix("include")?;
    if rest.is_empty() {
        return Some("");
    }
    rest.starts_with(char::is_whitespace).then(|| rest.trim())
}

#[derive(Debug, PartialEq)]
enum ExpandError {
    Unset(String),
    Malformed(String),
}

/// Expands `${VAR}` from `env`, then fio's reserved keywords `$pagesize`, `$mb_memory`,
/// `$ncpus`. Also returns `(name, value)` of the variables expanded, so that errors can leave
/// their values out.
fn expand(
    value: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(String, Vec<(String, String)>), ExpandError> {
    let mut vars = Vec::new();
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| ExpandError::Malformed("'${' without a closing '}'".to_string()))?;
        let name = &after[..end];
        if name.is_empty() {
            return Err(ExpandError::Malformed(
                "'${}' names no environment variable".to_string(),
            ));
        }
        match env(name) {
            Some(v) => {
                out.push_str(&v);
                vars.push((name.to_string(), v));
            }
            None => return Err(ExpandError::Unset(name.to_string())),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    if out.contains('$') {
        for (keyword, value) in reserved_keywords() {
            out = out.replace(keyword, &value.to_string());
        }
    }
    Ok((out, vars))
}

/// Takes environment values out of a message about a value: job text from the coordinator is
/// expanded with the agent's environment, and the error goes back over the network, so a
/// `${SECRET}` must not come back expanded. Each value is replaced by `${NAME}`; so are its
/// pieces between the separators option values are split at (`,` `:` `/` `;` and spaces), as
/// messages quote such pieces. Pieces shorter than 3 characters are left: replacing them would
/// garble the message and they reveal nothing a guess would not.
fn redact(message: &str, env_values: &[(String, String)]) -> String {
    let mut out = message.to_string();
    for (name, value) in env_values {
        let mut pieces: Vec<&str> = value
            .split([',', ':', '/', ';', ' ', '\t'])
            .filter(|p| p.len() >= 3)
            .collect();
        pieces.push(value);
        pieces.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for piece in pieces.into_iter().filter(|p| !p.is_empty()) {
            out = out.replace(piece, &format!("${{{name}}}"));
        }
    }
    out
}

/// fio's reserved keywords and their values on this machine.
fn reserved_keywords() -> [(&'static str, u64); 3] {
    // SAFETY: sysconf only reads system configuration; it has no memory-safety preconditions.
    let (pagesize, pages, cpus) = unsafe {
        (
            libc::sysconf(libc::_SC_PAGESIZE),
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_NPROCESSORS_ONLN),
        )
    };
    let pagesize = u64::try_from(pagesize).unwrap_or(4096);
    let pages = u64::try_from(pages).unwrap_or(0);
    let cpus = u64::try_from(cpus).unwrap_or(1).max(1);
    [
        ("$pagesize", pagesize),
        ("$mb_memory", pages.saturating_mul(pagesize) / (1024 * 1024)),
        ("$ncpus", cpus),
    ]
}

/// A job (or `[global]`) being built: the spec plus what fio keeps apart until the end.
#[derive(Debug, Clone)]
struct Builder {
    spec: JobSpec,
    /// `kb_base`: applies to the options after it, as in fio.
    kb: KbBase,
    /// `bs=` per direction.
    bs: [Option<u64>; 2],
    /// `bssplit=` per direction. fio uses bssplit over bs whichever came first, so they are
    /// kept apart and merged in `finish`.
    bssplit: [Option<BlockSizes>; 2],
    /// Where `iodepth` and `numjobs` were last set, for limits that are only known once the
    /// job is complete (the depth's bound depends on `ioengine`, which may come later).
    iodepth_at: Option<RawOption>,
    numjobs_at: Option<RawOption>,
}

impl Builder {
    fn new(spec: JobSpec) -> Self {
        Builder {
            spec,
            kb: KbBase::default(),
            bs: [None, None],
            bssplit: [None, None],
            iodepth_at: None,
            numjobs_at: None,
        }
    }

    /// An error about the option last given as `given` (or the job's section line).
    fn limit_error(
        &self,
        given: &Option<RawOption>,
        option: &str,
        message: String,
    ) -> JobFileError {
        match given {
            Some(o) => JobFileError::Value {
                at: o.at.clone(),
                option: o.key.clone(),
                value: o.shown.clone(),
                message,
            },
            None => JobFileError::Value {
                at: Place::Line(self.spec.origin.clone()),
                option: option.to_string(),
                value: None,
                message,
            },
        }
    }

    fn finish(mut self) -> JobSpec {
        for d in 0..2 {
            if let Some(split) = self.bssplit[d].take() {
                self.spec.bs[d] = split;
            } else if let Some(bs) = self.bs[d] {
                self.spec.bs[d] = vec![(bs, 100)];
            }
        }
        self.spec
    }
}

fn build_jobs(
    items: Vec<Item>,
    overrides: &[RawOption],
    file: &Path,
) -> Result<Vec<JobSpec>, JobFileError> {
    let mut global = Builder::new(JobSpec::with_defaults(
        "global",
        Origin {
            file: file.to_path_buf(),
            line: 0,
        },
    ));
    let mut jobs = Vec::new();
    let mut clones = 0u64;
    // `None` while in [global] (the reader refuses options before any section).
    let mut current: Option<Builder> = None;
    for item in items {
        match item {
            Item::Section { name, at } => {
                if let Some(job) = current.take() {
                    jobs.push(finish_job(job, overrides, &mut clones)?);
                }
                if name != "global" {
                    let mut job = global.clone();
                    job.spec.name = name;
                    job.spec.origin = at;
                    current = Some(job);
                }
            }
            Item::Option(option) => match current.as_mut() {
                Some(job) => apply_option(job, &option, false)?,
                None => apply_option(&mut global, &option, true)?,
            },
        }
    }
    if let Some(job) = current.take() {
        jobs.push(finish_job(job, overrides, &mut clones)?);
    }
    if jobs.is_empty() {
        return Err(JobFileError::NoJobs {
            file: file.to_path_buf(),
        });
    }
    Ok(jobs)
}

/// Applies the overrides, checks the limits that need the whole job (`clones`: the file's
/// clones so far, this job's added) and builds the spec.
fn finish_job(
    mut job: Builder,
    overrides: &[RawOption],
    clones: &mut u64,
) -> Result<JobSpec, JobFileError> {
    for option in overrides {
        apply_option(&mut job, option, false)?;
    }
    if let Some(message) = limits::numjobs_problem(job.spec.numjobs) {
        return Err(job.limit_error(&job.numjobs_at, "numjobs", message));
    }
    if let Some(message) = limits::iodepth_problem(job.spec.engine, job.spec.iodepth) {
        return Err(job.limit_error(&job.iodepth_at, "iodepth", message));
    }
    *clones += job.spec.numjobs as u64;
    if let Some(message) = limits::total_jobs_problem(*clones) {
        return Err(job.limit_error(&job.numjobs_at, "numjobs", message));
    }
    Ok(job.finish())
}

/// What is wrong with one option, before we know where it was given.
#[derive(Debug)]
enum Problem {
    Unknown(Option<&'static str>),
    Unsupported(Option<&'static str>),
    Invalid(String),
}

impl From<units::UnitError> for Problem {
    fn from(e: units::UnitError) -> Self {
        Problem::Invalid(e.to_string())
    }
}

fn apply_option(
    job: &mut Builder,
    option: &RawOption,
    in_global: bool,
) -> Result<(), JobFileError> {
    let applied = apply(job, &option.key, option.value.as_deref(), in_global);
    if applied.is_ok() {
        match canonical(&option.key) {
            "iodepth" => job.iodepth_at = Some(option.clone()),
            "numjobs" => job.numjobs_at = Some(option.clone()),
            _ => {}
        }
    }
    applied.map_err(|problem| match problem {
        Problem::Unknown(suggestion) => JobFileError::UnknownOption {
            at: option.at.clone(),
            option: option.key.clone(),
            suggestion,
        },
        Problem::Unsupported(hint) => JobFileError::Unsupported {
            at: option.at.clone(),
            option: option.key.clone(),
            hint,
        },
        Problem::Invalid(message) => JobFileError::Value {
            at: option.at.clone(),
            option: option.key.clone(),
            value: option.shown.clone(),
            message: redact(&message, &option.env_values),
        },
    })
}

/// Options lockstep implements, by fio name. Aliases are in `canonical`.
pub const SUPPORTED: &[&str] = &[
    "name",
    "description",
    "filename",
    "directory",
    "nrfiles",
    "filesize",
    "size",
    "io_size",
    "offset",
    "ioengine",
    "rw",
    "rwmixread",
    "rwmixwrite",
    "bs",
    "bssplit",
    "iodepth",
    "numjobs",
    "direct",
    "buffered",
    "runtime",
    "time_based",
    "ramp_time",
    "startdelay",
    "randseed",
    "randrepeat",
    "norandommap",
    "random_distribution",
    "rate",
    "rate_iops",
    "rate_process",
    "thinktime",
    "thinktime_blocks",
    "fsync",
    "fdatasync",
    "end_fsync",
    "verify",
    "continue_on_error",
    "ignore_error",
    "stonewall",
    "group_reporting",
    "percentile_list",
    "invalidate",
    "kb_base",
    "fixedbufs",
    "registerfiles",
    "iodepth_batch_complete_max",
    "overwrite",
    "allow_file_create",
];

/// lockstep's own options (not fio's): `stuck_timeout` lists IOs slower than it (fio issue
/// #2012 proposes the same name).
pub const LOCKSTEP_ONLY: &[&str] = &["stuck_timeout"];

/// Options accepted and ignored because they do not change the IO issued or what is measured
/// (each is justified in docs/fio-compatibility.md). Their values are still checked.
pub const ADVISORY: &[&str] = &[
    "clocksource",
    "thread",
    "fadvise_hint",
    "random_generator",
    "unique_filename",
    "disk_util",
];

/// fio's other spellings of supported options.
pub const ALIASES: &[(&str, &str)] = &[
    ("readwrite", "rw"),
    ("blocksize", "bs"),
    ("io_limit", "io_size"),
    ("nr_files", "nrfiles"),
    ("timeout", "runtime"),
    ("fileoffset", "offset"),
    ("wait_for_previous", "stonewall"),
];

/// Every option (and alias) of fio 3.33, including those of the io_uring and libaio engines
/// (`fio --cmdhelp=all`, `fio --enghelp=io_uring`): one of these that we do not implement is
/// "not supported", anything else is "unknown".
#[rustfmt::skip]
pub const FIO_OPTIONS: &[&str] = &[
    "allow_file_create", "allow_mounted_write", "allrandrepeat", "atomic", "ba",
    "block_error_percentiles", "blockalign", "blocksize", "blocksize_range", "blocksize_unaligned",
    "bs", "bs_unaligned", "bsrange", "bssplit", "buffer_compress_chunk",
    "buffer_compress_percentage", "buffer_pattern", "buffered", "bwavgtime", "cgroup",
    "cgroup_nodelete", "cgroup_weight", "clat_percentiles", "clocksource", "cmd_type", "cmdprio",
    "cmdprio_bssplit", "cmdprio_class", "cmdprio_percentage", "continue_on_error", "cpumask",
    "cpus_allowed", "cpus_allowed_policy", "create_fsync", "create_on_open", "create_only",
    "create_serialize", "dedupe_global", "dedupe_mode", "dedupe_percentage",
    "dedupe_working_set_percentage", "description", "direct", "directory", "disable_bw",
    "disable_bw_measurement", "disable_clat", "disable_lat", "disable_slat", "disk_util",
    "do_verify", "end_fsync", "error_dump", "exec_postrun", "exec_prerun", "exit_what", "exitall",
    "exitall_on_error", "experimental_verify", "fadvise_hint", "fallocate", "fdatasync",
    "file_append", "file_service_type", "filename", "filename_format", "fileoffset", "filesize",
    "fill_device", "fill_fs", "fixedbufs", "flow", "flow_id", "flow_sleep", "force_async", "fsync",
    "fsync_on_close", "gid", "group_reporting", "gtod_cpu", "gtod_reduce", "hipri",
    "hipri_percentage", "hugepage-size", "ignore_error", "ignore_zone_limits", "invalidate",
    "io_limit", "io_size", "io_submit_mode", "iodepth", "iodepth_batch", "iodepth_batch_complete",
    "iodepth_batch_complete_max", "iodepth_batch_complete_min", "iodepth_batch_submit",
    "iodepth_low", "ioengine", "iomem", "iopsavgtime", "ioscheduler", "job_max_open_zones",
    "kb_base", "lat_percentiles", "latency_percentile", "latency_run", "latency_target",
    "latency_window", "lockfile", "lockmem", "log_alternate_epoch", "log_alternate_epoch_clock_id",
    "log_avg_msec", "log_compression", "log_compression_cpus", "log_entries",
    "log_hist_coarseness", "log_hist_msec", "log_max_value", "log_offset", "log_prio",
    "log_store_compressed", "log_unix_epoch", "loops", "max_latency", "max_open_zones", "mem",
    "merge_blktrace_file", "merge_blktrace_iters", "merge_blktrace_scalars", "name", "new_group",
    "nice", "nonvectored", "norandommap", "nowait", "nr_files", "nrfiles", "numa_cpu_nodes",
    "numa_mem_policy", "number_ios", "numjobs", "offset", "offset_align", "offset_increment",
    "opendir", "openfiles", "overwrite", "per_job_logs", "percentage_random", "percentile_list",
    "pre_read", "prio", "prioclass", "profile", "ramp_time", "random_distribution",
    "random_generator", "randrepeat", "randseed", "rate", "rate_cycle", "rate_ignore_thinktime",
    "rate_iops", "rate_iops_min", "rate_min", "rate_process", "ratecycle", "ratemin",
    "read_beyond_wp", "read_iolog", "read_iolog_chunked", "readwrite", "refill_buffers",
    "registerfiles", "replay_align", "replay_no_stall", "replay_redirect", "replay_scale",
    "replay_skip", "replay_time_scale", "runtime", "rw", "rw_sequencer", "rwmixread", "rwmixwrite",
    "scramble_buffers", "serialize_overlap", "significant_figures", "size", "slat_percentiles",
    "sqthread_poll", "sqthread_poll_cpu", "ss", "ss_dur", "ss_ramp", "startdelay", "stats",
    "steadystate", "steadystate_duration", "steadystate_ramp_time", "stonewall", "sync",
    "sync_file_range", "thinktime", "thinktime_blocks", "thinktime_blocks_type",
    "thinktime_iotime", "thinktime_spin", "thread", "time_based", "timeout", "trim_backlog",
    "trim_backlog_batch", "trim_percentage", "trim_verify_zero", "uid", "uncached",
    "unified_rw_reporting", "unique_filename", "unit_base", "unlink", "unlink_each_loop",
    "userspace_reap", "verify", "verify_async", "verify_backlog", "verify_backlog_batch",
    "verify_dump", "verify_fatal", "verify_interval", "verify_offset", "verify_only",
    "verify_pattern", "verify_state_load", "verify_state_save", "wait_for", "wait_for_previous",
    "write_barrier", "write_bw_log", "write_hint", "write_hist_log", "write_iolog",
    "write_iops_log", "write_lat_log", "zero_buffers", "zone_reset_frequency",
    "zone_reset_threshold", "zonecapacity", "zonemode", "zonerange", "zonesize", "zoneskip",
];

const IOENGINES: &str = "io_uring, libaio, psync, sync, pvsync, null";
const PATTERNS: &str = "read, write, randread, randwrite, rw (readwrite), randrw";

fn canonical(key: &str) -> &str {
    ALIASES
        .iter()
        .find(|(alias, _)| *alias == key)
        .map_or(key, |(_, name)| name)
}

/// Why lockstep refuses a fio option, where a sentence helps more than the generic message.
fn refusal_hint(key: &str) -> Option<&'static str> {
    Some(match key {
        "gtod_reduce"
        | "disable_lat"
        | "disable_clat"
        | "disable_slat"
        | "disable_bw_measurement"
        | "disable_bw" => "it changes which latencies are measured; lockstep measures every IO",
        "iodepth_batch" | "iodepth_batch_submit" | "iodepth_low" => {
            "lockstep submits an IO as soon as a queue slot is free"
        }
        "iodepth_batch_complete" | "iodepth_batch_complete_min" => {
            "lockstep waits for one completion when the queue is full, fio's default; \
             iodepth_batch_complete_max sets how many are taken at once"
        }
        "bsrange" | "blocksize_range" => "use bssplit= to mix block sizes",
        "loops" => "use time_based with runtime=, or io_size=",
        "unlink" | "unlink_each_loop" => {
            "lockstep removes the files it laid out unless run with --keep-files"
        }
        "write_bw_log" | "write_lat_log" | "write_iops_log" | "write_hist_log" | "log_avg_msec"
        | "log_hist_msec" | "per_job_logs" => {
            "lockstep records per-interval histograms and throughput in every report"
        }
        "rate_min" | "ratemin" | "rate_iops_min" => {
            "lockstep never ends a job early for missing its rate"
        }
        _ => return None,
    })
}

/// The closest supported option name, for typos.
fn suggest(key: &str) -> Option<&'static str> {
    SUPPORTED
        .iter()
        .chain(ADVISORY)
        .chain(LOCKSTEP_ONLY)
        .chain(ALIASES.iter().map(|(alias, _)| alias))
        .map(|name| (edit_distance(key, name), *name))
        .filter(|&(d, name)| d <= 2 && d < name.len() / 2)
        .min_by_key(|&(d, _)| d)
        .map(|(_, name)| name)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(above + 1);
            diagonal = above;
        }
    }
    row[b.len()]
}

fn need(value: Option<&str>) -> Result<&str, Problem> {
    match value {
        Some(v) if !v.is_empty() => Ok(v),
        _ => Err(Problem::Invalid("needs a value".to_string())),
    }
}

/// fio's bool (`0`/`1`); the option alone means 1 (fio requires the value for some booleans,
/// e.g. `direct`; accepting it alone everywhere is a superset).
fn boolean(value: Option<&str>) -> Result<bool, Problem> {
    match value {
        None => Ok(true),
        Some("1") => Ok(true),
        Some("0") => Ok(false),
        Some(_) => Err(Problem::Invalid(
            "expected 0 or 1 (or the option alone for 1)".to_string(),
        )),
    }
}

/// A count that must be at least `min` and fit a `u32`.
fn count_u32(value: Option<&str>, kb: KbBase, min: u32) -> Result<u32, Problem> {
    let n = units::parse_count(need(value)?, kb)?;
    let n = u32::try_from(n)
        .map_err(|_| Problem::Invalid(format!("too large (at most {})", u32::MAX)))?;
    if n < min {
        return Err(Problem::Invalid(format!("must be at least {min}")));
    }
    Ok(n)
}

fn percent_u32(value: Option<&str>, kb: KbBase) -> Result<u32, Problem> {
    let n = count_u32(value, kb, 0)?;
    if n > 100 {
        return Err(Problem::Invalid("must be between 0 and 100".to_string()));
    }
    Ok(n)
}

fn one_of<T: Copy>(value: &str, allowed: &[(&str, T)], what: &str) -> Result<T, Problem> {
    allowed
        .iter()
        .find(|(name, _)| *name == value)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let names: Vec<&str> = allowed.iter().map(|(n, _)| *n).collect();
            Problem::Invalid(format!(
                "unknown {what}; expected one of {}",
                names.join(", ")
            ))
        })
}

/// fio's `int[,int][,int]` for reads, writes and trims. A value not followed by a comma also
/// applies to the directions after it (`bs=4k` is all three; `bs=4k,` reads only; `bs=,8k`
/// writes and trims). An empty element leaves that direction as it was (the global value or
/// fio's default). Returns what to set for [read, write]; the trim element is checked with
/// `parse` and dropped, because lockstep issues no trims (and `rw=` cannot ask for them).
fn per_direction<T>(
    value: &str,
    parse: impl Fn(&str) -> Result<T, Problem>,
) -> Result<[Option<T>; 2], Problem> {
    let parts: Vec<&str> = value.split(',').map(str::trim).collect();
    if parts.len() > 3 {
        return Err(Problem::Invalid(
            "at most three comma-separated values (read,write,trim)".to_string(),
        ));
    }
    let mut given: [Option<&str>; 3] = [None; 3];
    for (i, part) in parts.iter().enumerate() {
        given[i] = Some(*part).filter(|p| !p.is_empty());
    }
    let last = parts.len() - 1;
    for i in parts.len()..3 {
        given[i] = given[last];
    }
    if given.iter().all(Option::is_none) {
        return Err(Problem::Invalid("no value given".to_string()));
    }
    let read = given[0].map(&parse).transpose()?;
    let write = given[1].map(&parse).transpose()?;
    given[2].map(&parse).transpose()?;
    Ok([read, write])
}

/// `bs/percent:bs/percent...` for one direction. A blank (or 0, as fio reads it) percentage
/// shares what the others leave; the result always sums to 100 (fio rounds the shares down and
/// lets its last bucket absorb the rest; we give the leftover percent to the first blanks).
fn parse_bssplit(text: &str, kb: KbBase) -> Result<BlockSizes, Problem> {
    let mut entries: Vec<(u64, Option<u32>)> = Vec::new();
    for entry in text.split(':').map(str::trim) {
        if entry.is_empty() {
            continue;
        }
        let (size, percent) = match entry.split_once('/') {
            Some((s, p)) => (s.trim(), p.trim()),
            None => (entry, ""),
        };
        let size =
            units::parse_size(size, kb).map_err(|e| Problem::Invalid(format!("{entry}: {e}")))?;
        if size == 0 {
            return Err(Problem::Invalid(format!(
                "{entry}: a block size must be > 0"
            )));
        }
        let percent = if percent.is_empty() {
            None
        } else {
            let p: u32 = percent.parse().map_err(|_| {
                Problem::Invalid(format!("{entry}: '{percent}' is not a whole percentage"))
            })?;
            if p > 100 {
                return Err(Problem::Invalid(format!("{entry}: more than 100%")));
            }
            Some(p).filter(|&p| p > 0)
        };
        entries.push((size, percent));
    }
    if entries.is_empty() {
        return Err(Problem::Invalid("no block sizes given".to_string()));
    }
    let given: u32 = entries.iter().filter_map(|(_, p)| *p).sum();
    let blanks = entries.iter().filter(|(_, p)| p.is_none()).count() as u32;
    if given > 100 {
        return Err(Problem::Invalid(format!(
            "percentages add up to {given}, more than 100"
        )));
    }
    if blanks == 0 && given != 100 {
        return Err(Problem::Invalid(format!(
            "percentages add up to {given}, not 100"
        )));
    }
    let left = 100 - given;
    if blanks > left {
        return Err(Problem::Invalid(format!(
            "{blanks} sizes without a percentage share only {left}%"
        )));
    }
    let mut extra = if blanks > 0 { left % blanks } else { 0 };
    Ok(entries
        .into_iter()
        .map(|(size, percent)| {
            let weight = percent.unwrap_or_else(|| {
                let bonus = u32::from(extra > 0);
                extra = extra.saturating_sub(1);
                left / blanks + bonus
            });
            (size, weight)
        })
        .collect())
}

/// fio's ':'-separated path lists; `\:` is a colon inside a path.
fn split_paths(text: &str) -> Result<Vec<PathBuf>, Problem> {
    let mut paths = Vec::new();
    let mut current = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&':') => {
                current.push(':');
                chars.next();
            }
            ':' => paths.push(std::mem::take(&mut current)),
            _ => current.push(c),
        }
    }
    paths.push(current);
    let paths: Vec<PathBuf> = paths
        .into_iter()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .collect();
    if paths.is_empty() {
        return Err(Problem::Invalid("no path given".to_string()));
    }
    if paths.iter().any(|p| p.as_os_str() == "-") {
        return Err(Problem::Invalid(
            "'-' (stdin/stdout) is not supported by lockstep".to_string(),
        ));
    }
    Ok(paths)
}

fn parse_distribution(value: &str) -> Result<Distribution, Problem> {
    if value.contains(',') {
        return Err(Problem::Invalid(
            "per-direction distributions are not supported by lockstep".to_string(),
        ));
    }
    let mut parts = value.split(':');
    let kind = parts.next().unwrap_or_default().trim();
    let params: Vec<&str> = parts.map(str::trim).collect();
    if params.len() > 1 {
        return Err(Problem::Invalid(
            "a distribution center (the second number) is not supported by lockstep".to_string(),
        ));
    }
    let param = |default: Option<f64>| -> Result<f64, Problem> {
        match (params.first(), default) {
            (Some(p), _) => Ok(units::parse_float(p)?),
            (None, Some(d)) => Ok(d),
            (None, None) => Err(Problem::Invalid(format!(
                "{kind} needs a parameter, e.g. {kind}:5"
            ))),
        }
    };
    match kind {
        "random" if params.is_empty() => Ok(Distribution::Uniform),
        "random" => Err(Problem::Invalid("random takes no parameter".to_string())),
        "zipf" => {
            // fio's default theta is 1.1; theta 1.0 is a pole of the zeta function.
            let theta = param(Some(1.1))?;
            if theta <= 0.0 || theta == 1.0 {
                return Err(Problem::Invalid(
                    "zipf theta must be > 0 and not 1.0".to_string(),
                ));
            }
            Ok(Distribution::Zipf { theta })
        }
        "pareto" => {
            let h = param(Some(0.2))?;
            if h <= 0.0 || h >= 1.0 {
                return Err(Problem::Invalid(
                    "pareto h must be between 0 and 1 (exclusive)".to_string(),
                ));
            }
            Ok(Distribution::Pareto { h })
        }
        // fio's option value is `normal`; `gauss` is its internal name, accepted too.
        "normal" | "gauss" => {
            let dev_pct = param(None)?;
            if dev_pct <= 0.0 || dev_pct >= 100.0 {
                return Err(Problem::Invalid(
                    "normal deviation must be between 0 and 100 (exclusive)".to_string(),
                ));
            }
            Ok(Distribution::Normal { dev_pct })
        }
        "zoned" | "zoned_abs" => Err(Problem::Invalid(format!(
            "{kind} distributions are not supported by lockstep"
        ))),
        _ => Err(Problem::Invalid(
            "unknown distribution; expected random, zipf:THETA, pareto:H or normal:DEV".to_string(),
        )),
    }
}

fn parse_percentiles(value: &str) -> Result<Vec<f64>, Problem> {
    let mut list = Vec::new();
    for item in value.split(':') {
        let p = units::parse_float(item)
            .map_err(|e| Problem::Invalid(format!("'{}': {e}", item.trim())))?;
        if p <= 0.0 || p > 100.0 {
            return Err(Problem::Invalid(format!(
                "'{}': a percentile must be in (0, 100]",
                item.trim()
            )));
        }
        list.push(p);
    }
    if list.len() > MAX_PERCENTILES {
        return Err(Problem::Invalid(format!(
            "at most {MAX_PERCENTILES} percentiles (fio's limit)"
        )));
    }
    list.sort_by(f64::total_cmp);
    list.dedup();
    Ok(list)
}

fn seconds(value: Option<&str>) -> Result<Duration, Problem> {
    Ok(units::parse_time(need(value)?, TimeUnit::Seconds)?)
}

/// Applies one option to `job`. `in_global` is true inside `[global]`. The options are
/// grouped by what they say about a job, one function per group; each says whether the key
/// was one of its own.
fn apply(
    job: &mut Builder,
    key: &str,
    value: Option<&str>,
    in_global: bool,
) -> Result<(), Problem> {
    let key = canonical(key);
    let known = apply_target(job, key, value, in_global)?
        || apply_io_shape(job, key, value)?
        || apply_pacing(job, key, value)?
        || apply_checks_and_reports(job, key, value)?
        || check_advisory(key, value)?;
    if known {
        Ok(())
    } else if FIO_OPTIONS.contains(&key) {
        Err(Problem::Unsupported(refusal_hint(key)))
    } else {
        Err(Problem::Unknown(suggest(key)))
    }
}

/// Where a job's IO goes: its name, files, directories and sizes.
fn apply_target(
    job: &mut Builder,
    key: &str,
    value: Option<&str>,
    in_global: bool,
) -> Result<bool, Problem> {
    let kb = job.kb;
    let spec = &mut job.spec;
    match key {
        "name" => {
            if in_global {
                return Err(Problem::Invalid(
                    "name= in [global] does not name any job (fio ignores it there); \
                     set it in a job section"
                        .to_string(),
                ));
            }
            spec.name = need(value)?.to_string();
        }
        "description" => spec.description = value.map(str::to_string),
        "filename" => spec.filenames = split_paths(need(value)?)?,
        "directory" => spec.directories = split_paths(need(value)?)?,
        "nrfiles" => spec.nrfiles = count_u32(value, kb, 1)?,
        "filesize" => {
            let size = units::parse_size(need(value)?, kb)?;
            if size == 0 {
                return Err(Problem::Invalid("must be > 0".to_string()));
            }
            spec.filesize = Some(size);
        }
        "size" => {
            // size=0 is fio's default: the size of the existing files.
            spec.size = match units::parse_extent(need(value)?, kb)? {
                Extent::Bytes(0) => None,
                Extent::Percent(p) if !(1.0..=100.0).contains(&p) => {
                    return Err(Problem::Invalid(
                        "a percentage must be between 1 and 100".to_string(),
                    ));
                }
                extent => Some(extent),
            };
        }
        "io_size" => {
            let v = need(value)?;
            if v.trim_end().ends_with('%') {
                return Err(Problem::Invalid(
                    "a percentage is not supported here by lockstep; give a size".to_string(),
                ));
            }
            spec.io_size = Some(units::parse_size(v, kb)?).filter(|&n| n > 0);
        }
        "offset" => {
            spec.offset = match units::parse_extent(need(value)?, kb)? {
                Extent::Percent(p) if p >= 100.0 => {
                    return Err(Problem::Invalid(
                        "a percentage must be below 100 (it leaves no room for IO)".to_string(),
                    ));
                }
                extent => extent,
            };
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// What the IO looks like: engine, pattern, mix, block sizes, queue depth, jobs, direct IO.
fn apply_io_shape(job: &mut Builder, key: &str, value: Option<&str>) -> Result<bool, Problem> {
    let kb = job.kb;
    let spec = &mut job.spec;
    match key {
        "ioengine" => {
            spec.engine = one_of(
                need(value)?,
                &[
                    ("io_uring", EngineKind::IoUring),
                    ("libaio", EngineKind::Libaio),
                    ("psync", EngineKind::Psync),
                    ("sync", EngineKind::Psync),
                    ("pvsync", EngineKind::Psync),
                    ("null", EngineKind::Null),
                ],
                "ioengine",
            )
            .map_err(|_| {
                Problem::Invalid(format!(
                    "ioengine not supported by lockstep; use one of {IOENGINES}"
                ))
            })?;
        }
        "rw" => {
            let v = need(value)?;
            let (name, modifier) = match v.split_once(':') {
                Some((n, m)) => (n.trim(), Some(m.trim())),
                None => (v, None),
            };
            if let Some(m) = modifier {
                return Err(Problem::Invalid(format!(
                    "the ':{m}' offset modifier is not supported by lockstep \
                     (see docs/fio-compatibility.md)"
                )));
            }
            spec.pattern = match name {
                "read" => Pattern::Read,
                "write" => Pattern::Write,
                "randread" => Pattern::RandRead,
                "randwrite" => Pattern::RandWrite,
                "rw" | "readwrite" => Pattern::ReadWrite,
                "randrw" => Pattern::RandReadWrite,
                "trim" | "randtrim" | "trimwrite" | "randtrimwrite" => {
                    return Err(Problem::Invalid(format!(
                        "trims are not supported by lockstep; use one of {PATTERNS}"
                    )));
                }
                _ => {
                    return Err(Problem::Invalid(format!(
                        "unknown pattern; expected one of {PATTERNS}"
                    )));
                }
            };
        }
        // fio: if both are given, the later one wins.
        "rwmixread" => spec.rwmixread = percent_u32(value, kb)?,
        "rwmixwrite" => spec.rwmixread = 100 - percent_u32(value, kb)?,
        "bs" => {
            let sizes = per_direction(need(value)?, |s| {
                let size = units::parse_size(s, kb)?;
                if size == 0 {
                    return Err(Problem::Invalid("a block size must be > 0".to_string()));
                }
                Ok(size)
            })?;
            for (d, size) in sizes.into_iter().enumerate() {
                if size.is_some() {
                    job.bs[d] = size;
                }
            }
        }
        "bssplit" => {
            let splits = per_direction(need(value)?, |s| parse_bssplit(s, kb))?;
            for (d, split) in splits.into_iter().enumerate() {
                if split.is_some() {
                    job.bssplit[d] = split;
                }
            }
        }
        "iodepth" => spec.iodepth = count_u32(value, kb, 1)?,
        "numjobs" => spec.numjobs = count_u32(value, kb, 1)?,
        "direct" => spec.direct = boolean(value)?,
        "buffered" => spec.direct = !boolean(value)?,
        _ => return Ok(false),
    }
    Ok(true)
}

/// When and how fast: runtime, ramp, delays, random seeds and distribution, rates, think time.
fn apply_pacing(job: &mut Builder, key: &str, value: Option<&str>) -> Result<bool, Problem> {
    let kb = job.kb;
    let spec = &mut job.spec;
    match key {
        // runtime=0 is fio's default: no time limit.
        "runtime" => spec.runtime = Some(seconds(value)?).filter(|d| !d.is_zero()),
        "time_based" => spec.time_based = boolean(value)?,
        "ramp_time" => spec.ramp_time = seconds(value)?,
        "startdelay" => spec.startdelay = seconds(value)?,
        "randseed" => spec.randseed = units::parse_count(need(value)?, kb)?,
        "randrepeat" => spec.randrepeat = boolean(value)?,
        "norandommap" => spec.norandommap = boolean(value)?,
        "random_distribution" => spec.distribution = parse_distribution(need(value)?)?,
        "rate" => {
            let rates = per_direction(need(value)?, |s| Ok(units::parse_size(s, kb)?))?;
            for (d, rate) in rates.into_iter().enumerate() {
                if let Some(r) = rate {
                    // 0 is fio's default: no limit.
                    spec.rate.bytes_per_sec[d] = Some(r).filter(|&r| r > 0);
                }
            }
        }
        "rate_iops" => {
            let rates = per_direction(need(value)?, |s| Ok(units::parse_count(s, kb)?))?;
            for (d, rate) in rates.into_iter().enumerate() {
                if let Some(r) = rate {
                    spec.rate.iops[d] = Some(r).filter(|&r| r > 0);
                }
            }
        }
        "rate_process" => {
            spec.rate.process = one_of(
                need(value)?,
                &[
                    ("linear", RateProcess::Linear),
                    ("poisson", RateProcess::Poisson),
                ],
                "rate_process",
            )?;
        }
        "thinktime" => {
            spec.thinktime = units::parse_time(need(value)?, TimeUnit::Microseconds)?;
        }
        "thinktime_blocks" => spec.thinktime_blocks = count_u32(value, kb, 1)?,
        _ => return Ok(false),
    }
    Ok(true)
}

/// Syncs, verification, error policy, stuck IOs, reporting, file handling and `kb_base`.
fn apply_checks_and_reports(
    job: &mut Builder,
    key: &str,
    value: Option<&str>,
) -> Result<bool, Problem> {
    let kb = job.kb;
    let spec = &mut job.spec;
    match key {
        "fsync" => spec.fsync = count_u32(value, kb, 0)?,
        "fdatasync" => spec.fdatasync = count_u32(value, kb, 0)?,
        "end_fsync" => spec.end_fsync = boolean(value)?,
        "verify" => {
            spec.verify = match need(value)? {
                "0" | "none" => None,
                // fio: crc32c-intel is a synonym (hardware acceleration is automatic).
                "crc32c" | "crc32c-intel" => Some(VerifyKind::Crc32c),
                _ => {
                    return Err(Problem::Invalid(
                        "lockstep verifies with crc32c only; use verify=crc32c (or 0 for none)"
                            .to_string(),
                    ));
                }
            };
        }
        "continue_on_error" => spec
            .on_error
            .set_continue(need(value)?)
            .map_err(Problem::Invalid)?,
        "ignore_error" => spec
            .on_error
            .set_ignore(need(value)?)
            .map_err(Problem::Invalid)?,
        // lockstep's own (fio issue #2012 proposes it): list IOs slower than this; 0 turns off.
        "stuck_timeout" => spec.stuck_timeout = units::parse_time(need(value)?, TimeUnit::Seconds)?,
        "stonewall" => spec.stonewall = boolean(value)?,
        "group_reporting" => spec.group_reporting = boolean(value)?,
        "percentile_list" => spec.percentile_list = parse_percentiles(need(value)?)?,
        "invalidate" => spec.invalidate = boolean(value)?,
        "fixedbufs" => spec.fixedbufs = boolean(value)?,
        "overwrite" => spec.overwrite = boolean(value)?,
        "allow_file_create" => spec.allow_file_create = boolean(value)?,
        // fio raises a maximum below the minimum (1) to it, so 0 means 1.
        "iodepth_batch_complete_max" => {
            spec.complete_max = count_u32(value, kb, 0)?.max(1);
        }
        "registerfiles" => spec.registerfiles = boolean(value)?,
        "kb_base" => {
            job.kb = one_of(
                need(value)?,
                &[("1024", KbBase::K1024), ("1000", KbBase::K1000)],
                "kb_base",
            )?;
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// Advisory options: checked, then ignored (see docs/fio-compatibility.md).
fn check_advisory(key: &str, value: Option<&str>) -> Result<bool, Problem> {
    match key {
        // Advisory: checked, then ignored (see docs/fio-compatibility.md).
        "clocksource" => {
            one_of(
                need(value)?,
                &[("gettimeofday", ()), ("clock_gettime", ()), ("cpu", ())],
                "clocksource",
            )?;
        }
        "thread" | "unique_filename" | "disk_util" => {
            boolean(value)?;
        }
        "fadvise_hint" => {
            one_of(
                need(value)?,
                &[("0", ()), ("1", ()), ("sequential", ()), ("random", ())],
                "fadvise_hint",
            )?;
        }
        "random_generator" => {
            one_of(
                need(value)?,
                &[("tausworthe", ()), ("lfsr", ()), ("tausworthe64", ())],
                "random_generator",
            )?;
        }
        _ => return Ok(false),
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    /// Parses `text` as "jobs/t.fio" with no environment and no includes.
    fn parse(text: &str) -> Result<Vec<JobSpec>, JobFileError> {
        parse_with_env(text, Path::new("jobs/t.fio"), None, &[], &no_env)
    }

    fn one(text: &str) -> JobSpec {
        let mut jobs = parse(text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(jobs.len(), 1, "{text}");
        jobs.remove(0)
    }

    /// A job section with `options` and nothing else.
    fn job(options: &str) -> JobSpec {
        one(&format!("[j]\n{options}\n"))
    }

    fn err(text: &str) -> String {
        match parse(text) {
            Ok(jobs) => panic!("expected an error, got {} jobs", jobs.len()),
            Err(e) => e.to_string(),
        }
    }

    /// The error for one option line (line 2 of jobs/t.fio).
    fn job_err(options: &str) -> String {
        err(&format!("[j]\n{options}\n"))
    }

    fn set(overrides: &[(&str, &str)], text: &str) -> Result<Vec<JobSpec>, JobFileError> {
        let overrides: Vec<(String, String)> = overrides
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        parse_with_env(text, Path::new("jobs/t.fio"), None, &overrides, &no_env)
    }

    // ---- INI structure ----

    #[test]
    fn defaults_are_fios() {
        let j = job("");
        let d = JobSpec::with_defaults("j", j.origin.clone());
        assert_eq!(j.name, "j");
        assert_eq!(j.origin.line, 1);
        assert_eq!(j.pattern, d.pattern);
        assert_eq!(j.bs, d.bs);
        assert_eq!(j.iodepth, 1);
        assert_eq!(j.engine, EngineKind::Psync);
        assert!(j.invalidate && j.randrepeat && !j.direct);
        assert_eq!(j.percentile_list, crate::job::DEFAULT_PERCENTILES.to_vec());
    }

    #[test]
    fn global_applies_to_the_jobs_after_it_and_later_globals_add_up() {
        let jobs =
            parse("[global]\nbs=8k\nrw=randread\n[a]\n[global]\nbs=16k\n[b]\nrw=write\n[c]\n")
                .unwrap();
        let names: Vec<&str> = jobs.iter().map(|j| j.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(jobs[0].bs[0], vec![(8192, 100)]);
        assert_eq!(jobs[1].bs[0], vec![(16384, 100)]);
        assert_eq!(jobs[1].pattern, Pattern::Write);
        // The second [global] kept rw=randread from the first.
        assert_eq!(jobs[2].pattern, Pattern::RandRead);
        assert_eq!(jobs[2].bs[1], vec![(16384, 100)]);
    }

    #[test]
    fn global_after_a_job_does_not_change_it() {
        let jobs = parse("[a]\n[global]\niodepth=8\n[b]\n").unwrap();
        assert_eq!(jobs[0].iodepth, 1);
        assert_eq!(jobs[1].iodepth, 8);
    }

    #[test]
    fn comments_blank_lines_indentation() {
        let j = one(
            "# a comment\n; another\n\n [Read-Test-1]  \n  # indented comment\n\
             iodepth = 4   ; trailing comment\nbs=8k # trailing\n",
        );
        assert_eq!(j.name, "Read-Test-1");
        assert_eq!(j.origin.line, 4);
        assert_eq!(j.iodepth, 4);
        assert_eq!(j.bs[0], vec![(8192, 100)]);
    }

    #[test]
    fn comment_character_cuts_values_as_in_fio() {
        let j = job("filename=/tmp/a#b");
        assert_eq!(j.filenames, vec![PathBuf::from("/tmp/a")]);
    }

    #[test]
    fn crlf_line_endings() {
        let j = one("[j]\r\niodepth=2\r\n");
        assert_eq!(j.iodepth, 2);
    }

    #[test]
    fn name_renames_and_description_is_kept() {
        let j = job("name=renamed\ndescription=a test job");
        assert_eq!(j.name, "renamed");
        assert_eq!(j.description.as_deref(), Some("a test job"));
    }

    #[test]
    fn name_in_global_is_refused() {
        let e = err("[global]\nname=x\n[j]\n");
        assert!(e.starts_with("jobs/t.fio:2: name=x: "), "{e}");
    }

    #[test]
    fn structure_errors_name_file_and_line() {
        assert_eq!(
            err("bs=4k\n[j]\n"),
            "jobs/t.fio:1: bs=4k: option outside of a section (put [global] or [jobname] above it)"
        );
        assert!(err("[j]\n[broken\n").starts_with("jobs/t.fio:2: '[broken' is not a section"));
        assert!(err("[j]\n[]\n").starts_with("jobs/t.fio:2: "));
        assert!(err("[j]\n=4k\n").starts_with("jobs/t.fio:2: '=4k' has no option name"));
        assert_eq!(
            err("# nothing\n[global]\nbs=4k\n"),
            "jobs/t.fio: no jobs: the file has no job section (add e.g. [job1])"
        );
        assert!(err("").contains("no jobs"));
    }

    // ---- errors for options ----

    #[test]
    fn unsupported_fio_option_names_file_line_and_option() {
        assert_eq!(
            job_err("iodepth_batch=8"),
            "jobs/t.fio:2: option 'iodepth_batch': not supported by lockstep: lockstep submits \
             an IO as soon as a queue slot is free (see docs/fio-compatibility.md)"
        );
        assert_eq!(
            job_err("exitall"),
            "jobs/t.fio:2: option 'exitall': not supported by lockstep \
             (see docs/fio-compatibility.md)"
        );
        let e = job_err("gtod_reduce=1");
        assert!(e.contains("option 'gtod_reduce': not supported"), "{e}");
        assert!(job_err("hipri").contains("option 'hipri': not supported"));
        assert!(job_err("offset_increment=100g").contains("'offset_increment'"));
    }

    #[test]
    fn unknown_option_suggests_the_closest() {
        assert_eq!(
            job_err("iodeth=4"),
            "jobs/t.fio:2: option 'iodeth': unknown option (did you mean 'iodepth'?)"
        );
        assert_eq!(
            job_err("frobnicate=1"),
            "jobs/t.fio:2: option 'frobnicate': unknown option"
        );
    }

    #[test]
    fn value_errors_show_option_and_value() {
        assert_eq!(
            job_err("bs=4q"),
            "jobs/t.fio:2: bs=4q: not a size (expected e.g. 4k, 1m)"
        );
        assert_eq!(job_err("iodepth"), "jobs/t.fio:2: iodepth: needs a value");
        assert_eq!(
            job_err("direct=yes"),
            "jobs/t.fio:2: direct=yes: expected 0 or 1 (or the option alone for 1)"
        );
    }

    #[test]
    fn error_line_accessor() {
        let e = parse("[j]\n\nbs=4q\n").unwrap_err();
        let at = e.line().expect("a line");
        assert_eq!((at.file.as_path(), at.line), (Path::new("jobs/t.fio"), 3));
        let e = set(&[("bs", "4q")], "[j]\n").unwrap_err();
        assert!(e.line().is_none());
    }

    // ---- option families ----

    #[test]
    fn files_and_directories() {
        let j = job("filename=/dev/sda:/dev/sdb\\:1:\ndirectory=/a:/b");
        assert_eq!(
            j.filenames,
            vec![PathBuf::from("/dev/sda"), PathBuf::from("/dev/sdb:1")]
        );
        assert_eq!(
            j.directories,
            vec![PathBuf::from("/a"), PathBuf::from("/b")]
        );
        assert!(job_err("filename=-").contains("stdin"));
        assert!(job_err("filename=:").contains("no path given"));
        let j = job("nrfiles=8\nnr_files=9");
        assert_eq!(j.nrfiles, 9);
        assert!(job_err("nrfiles=0").contains("must be at least 1"));
    }

    #[test]
    fn sizes_and_offsets() {
        let j = job("size=500G\nfilesize=1m\nio_size=2g\noffset=4k");
        assert_eq!(j.size, Some(Extent::Bytes(500 << 30)));
        assert_eq!(j.filesize, Some(1 << 20));
        assert_eq!(j.io_size, Some(2 << 30));
        assert_eq!(j.offset, Extent::Bytes(4096));
        let j = job("size=50%\noffset=10%\nio_limit=1m");
        assert_eq!(j.size, Some(Extent::Percent(50.0)));
        assert_eq!(j.offset, Extent::Percent(10.0));
        assert_eq!(j.io_size, Some(1 << 20));
        assert_eq!(job("size=0").size, None);
        assert_eq!(job("fileoffset=8k").offset, Extent::Bytes(8192));
        assert!(job_err("size=0%").contains("between 1 and 100"));
        assert!(job_err("size=101%").contains("between 1 and 100"));
        assert!(job_err("offset=100%").contains("below 100"));
        assert!(job_err("filesize=1m-4m").contains("range"));
        assert!(job_err("filesize=0").contains("> 0"));
        assert!(job_err("io_size=50%").contains("percentage"));
        assert!(job_err("size=1.5g").contains("fractions"));
        assert!(job_err("size=12.5%").contains("fractional"));
    }

    #[test]
    fn kb_base_changes_the_options_after_it() {
        let j = job("size=1k\nkb_base=1000\nbs=1k\nfilesize=1KiB");
        assert_eq!(j.size, Some(Extent::Bytes(1024)));
        assert_eq!(j.bs[0], vec![(1000, 100)]);
        assert_eq!(j.filesize, Some(1024));
        let jobs = parse("[global]\nkb_base=1000\n[a]\nsize=1m\n").unwrap();
        assert_eq!(jobs[0].size, Some(Extent::Bytes(1_000_000)));
        assert!(job_err("kb_base=512").contains("expected one of 1024, 1000"));
    }

    #[test]
    fn ioengines() {
        for (name, kind) in [
            ("io_uring", EngineKind::IoUring),
            ("libaio", EngineKind::Libaio),
            ("psync", EngineKind::Psync),
            ("sync", EngineKind::Psync),
            ("pvsync", EngineKind::Psync),
            ("null", EngineKind::Null),
        ] {
            assert_eq!(job(&format!("ioengine={name}")).engine, kind, "{name}");
        }
        assert_eq!(
            job_err("ioengine=windowsaio"),
            "jobs/t.fio:2: ioengine=windowsaio: ioengine not supported by lockstep; use one of \
             io_uring, libaio, psync, sync, pvsync, null"
        );
    }

    #[test]
    fn patterns_and_mix() {
        for (name, p) in [
            ("read", Pattern::Read),
            ("write", Pattern::Write),
            ("randread", Pattern::RandRead),
            ("randwrite", Pattern::RandWrite),
            ("rw", Pattern::ReadWrite),
            ("readwrite", Pattern::ReadWrite),
            ("randrw", Pattern::RandReadWrite),
        ] {
            assert_eq!(job(&format!("rw={name}")).pattern, p, "{name}");
        }
        assert_eq!(job("readwrite=randwrite").pattern, Pattern::RandWrite);
        let e = job_err("rw=randread:8");
        assert!(e.starts_with("jobs/t.fio:2: rw=randread:8: "), "{e}");
        assert!(e.contains("not supported"), "{e}");
        assert!(job_err("rw=trim").contains("trims are not supported"));
        assert!(job_err("rw=sideways").contains("expected one of read, write"));
        assert_eq!(job("rw=randrw\nrwmixread=70").rwmixread, 70);
        assert_eq!(job("rwmixwrite=30").rwmixread, 70);
        // The later of rwmixread/rwmixwrite wins, as in fio.
        assert_eq!(job("rwmixread=70\nrwmixwrite=50").rwmixread, 50);
        assert_eq!(job("rwmixwrite=50\nrwmixread=70").rwmixread, 70);
        assert!(job_err("rwmixread=150").contains("between 0 and 100"));
        assert!(job_err("rwmixwrite=101").contains("between 0 and 100"));
    }

    #[test]
    fn block_sizes_per_direction() {
        let j = job("bs=64k");
        assert_eq!(j.bs, [vec![(65536, 100)], vec![(65536, 100)]]);
        let j = job("blocksize=4k,64k");
        assert_eq!(j.bs, [vec![(4096, 100)], vec![(65536, 100)]]);
        let j = job("bs=,64k");
        assert_eq!(j.bs, [vec![(4096, 100)], vec![(65536, 100)]]);
        let j = job("bs=16k,");
        assert_eq!(j.bs, [vec![(16384, 100)], vec![(4096, 100)]]);
        // The trim value is checked, then dropped.
        let j = job("bs=4k,8k,16k");
        assert_eq!(j.bs, [vec![(4096, 100)], vec![(8192, 100)]]);
        assert!(job_err("bs=4k,8k,16q").contains("not a size"));
        assert!(job_err("bs=1,2,3,4").contains("at most three"));
        assert!(job_err("bs=0").contains("> 0"));
        assert!(job_err("bs=,").contains("no value"));
        // An empty element keeps the global value.
        let jobs = parse("[global]\nbs=8k\n[a]\nbs=,64k\n").unwrap();
        assert_eq!(jobs[0].bs, [vec![(8192, 100)], vec![(65536, 100)]]);
        assert_eq!(j.min_bs(), 4096);
    }

    #[test]
    fn bssplit() {
        let j = job("bssplit=4k/10:64k/90");
        assert_eq!(j.bs[0], vec![(4096, 10), (65536, 90)]);
        assert_eq!(j.bs[1], j.bs[0]);
        let j = job("bssplit=2k/50:4k/50,4k/90:8k/10");
        assert_eq!(j.bs[0], vec![(2048, 50), (4096, 50)]);
        assert_eq!(j.bs[1], vec![(4096, 90), (8192, 10)]);
        // Blank (or 0) percentages share the rest; the total stays 100.
        let j = job("bssplit=4k/50:1k/:32k/");
        assert_eq!(j.bs[0], vec![(4096, 50), (1024, 25), (32768, 25)]);
        let j = job("bssplit=4k:8k:16k");
        assert_eq!(j.bs[0], vec![(4096, 34), (8192, 33), (16384, 33)]);
        let j = job("bssplit=4k/0:8k/60");
        assert_eq!(j.bs[0], vec![(4096, 40), (8192, 60)]);
        assert!(job_err("bssplit=4k/60:64k/60").contains("add up to 120"));
        assert!(job_err("bssplit=4k/30:64k/30").contains("add up to 60, not 100"));
        assert!(job_err("bssplit=4k/100:8k/").contains("share only 0%"));
        assert!(job_err("bssplit=4q/100").contains("4q/100: not a size"));
        assert!(job_err("bssplit=4k/x").contains("not a whole percentage"));
        // bssplit wins over bs whichever comes first, as in fio.
        let j = job("bssplit=4k/50:8k/50\nbs=64k");
        assert_eq!(j.bs[0], vec![(4096, 50), (8192, 50)]);
        let j = job("bs=64k\nbssplit=,4k/50:8k/50");
        assert_eq!(j.bs[0], vec![(65536, 100)]);
        assert_eq!(j.bs[1], vec![(4096, 50), (8192, 50)]);
    }

    #[test]
    fn depth_and_clones() {
        let j = job("iodepth=32\nnumjobs=4");
        assert_eq!((j.iodepth, j.numjobs), (32, 4));
        assert!(job_err("iodepth=0").contains("must be at least 1"));
        assert!(job_err("numjobs=0").contains("must be at least 1"));
        assert!(job_err("iodepth=lots").contains("not a number"));
        assert!(job_err("iodepth=99999999999").contains("too large"));
    }

    #[test]
    fn booleans_bare_or_0_1() {
        let j = job("direct\ntime_based\nnorandommap\ngroup_reporting\nstonewall\nend_fsync");
        assert!(j.direct && j.time_based && j.norandommap && j.group_reporting);
        assert!(j.stonewall && j.end_fsync);
        // io_uring's registration and fio's reaping: defaults, off, and 0 meaning 1 as in fio.
        let j = job("rw=read");
        assert!(j.fixedbufs && j.registerfiles && j.complete_max == 1);
        let j = job("fixedbufs=0\nregisterfiles=0\niodepth_batch_complete_max=32");
        assert!(!j.fixedbufs && !j.registerfiles && j.complete_max == 32);
        assert_eq!(job("iodepth_batch_complete_max=0").complete_max, 1);
        assert!(
            job_err("iodepth_batch_complete_min=4")
                .contains("iodepth_batch_complete_max sets how many"),
            "{}",
            job_err("iodepth_batch_complete_min=4")
        );
        let j = job("direct=1\nrandrepeat=0\ninvalidate=0\nwait_for_previous=1");
        assert!(j.direct && !j.randrepeat && !j.invalidate && j.stonewall);
        assert!(!job("direct=1\nbuffered=1").direct);
        assert!(job("buffered=0").direct);
        assert!(job_err("time_based=2").contains("expected 0 or 1"));
    }

    #[test]
    fn times() {
        let j = job("runtime=30\nramp_time=5s\nstartdelay=500ms\nthinktime=100");
        assert_eq!(j.runtime, Some(Duration::from_secs(30)));
        assert_eq!(j.ramp_time, Duration::from_secs(5));
        assert_eq!(j.startdelay, Duration::from_millis(500));
        // thinktime's bare unit is microseconds.
        assert_eq!(j.thinktime, Duration::from_micros(100));
        assert_eq!(job("runtime=2m").runtime, Some(Duration::from_secs(120)));
        assert_eq!(job("timeout=1h").runtime, Some(Duration::from_secs(3600)));
        assert_eq!(job("runtime=0").runtime, None);
        assert_eq!(job("thinktime=2ms\nthinktime_blocks=8").thinktime_blocks, 8);
        assert!(job_err("runtime=10min").contains("not a time unit"));
        assert!(job_err("startdelay=1-5").contains("range"));
        assert!(job_err("thinktime_blocks=0").contains("at least 1"));
    }

    #[test]
    fn random_options() {
        let j = job("randseed=1234\nrandrepeat=0\nnorandommap");
        assert_eq!(j.randseed, 1234);
        assert_eq!(job("randseed=0x89").randseed, 0x89);
        let d = |v: &str| job(&format!("random_distribution={v}")).distribution;
        assert_eq!(d("random"), Distribution::Uniform);
        assert_eq!(d("zipf:1.2"), Distribution::Zipf { theta: 1.2 });
        assert_eq!(d("zipf"), Distribution::Zipf { theta: 1.1 });
        assert_eq!(d("pareto:0.5"), Distribution::Pareto { h: 0.5 });
        assert_eq!(d("pareto"), Distribution::Pareto { h: 0.2 });
        assert_eq!(d("normal:5"), Distribution::Normal { dev_pct: 5.0 });
        assert_eq!(d("gauss:2.5"), Distribution::Normal { dev_pct: 2.5 });
        let e = |v: &str| job_err(&format!("random_distribution={v}"));
        assert!(e("zipf:1").contains("not 1.0"));
        assert!(e("pareto:1").contains("between 0 and 1"));
        assert!(e("normal:150").contains("between 0 and 100"));
        assert!(e("normal").contains("needs a parameter"));
        assert!(e("zipf:1.2:0.25").contains("center"));
        assert!(e("zoned:60/10:40/90").contains("not supported"));
        assert!(e("zipf:x").contains("not a number"));
        assert!(e("hot").contains("expected random, zipf:THETA"));
    }

    #[test]
    fn continue_on_error_and_ignore_error_follow_fio_and_bad_values_name_their_line() {
        use crate::job::errpolicy::ErrorKind;
        assert!(!job("rw=read").on_error.is_set(), "fio's default is none");
        let j = job("continue_on_error=all");
        assert!(j.on_error.survives(ErrorKind::Read, libc::EIO));
        assert!(!job("continue_on_error=0").on_error.is_set());
        // In order, as fio applies them: the later continue_on_error sets the kinds again.
        let j = job("ignore_error=,ENOSPC\ncontinue_on_error=none");
        assert!(!j.on_error.survives(ErrorKind::Write, libc::ENOSPC));
        let j = one("[global]\ncontinue_on_error=write\n[j]\nignore_error=,ENOSPC:EDQUOT\n");
        assert!(j.on_error.survives(ErrorKind::Write, libc::EDQUOT));
        let e = job_err("continue_on_error=yes");
        assert!(
            e.contains("jobs/t.fio:2") && e.contains("continue_on_error"),
            "{e}"
        );
        assert!(
            e.contains("none, read, write, io, verify, all, 0, 1"),
            "{e}"
        );
        let e = job_err("ignore_error=EIO,ENOSPCX");
        assert!(
            e.contains("jobs/t.fio:2") && e.contains("ignore_error"),
            "{e}"
        );
        assert!(e.contains("'ENOSPCX' is not an error"), "{e}");
        assert!(job_err("ignore_error=EIO,EIO,EIO,EIO").contains("at most 3"));
    }

    #[test]
    fn rates() {
        let j = job("rate=10m,5m\nrate_iops=500,200\nrate_process=poisson");
        assert_eq!(j.rate.bytes_per_sec, [Some(10 << 20), Some(5 << 20)]);
        assert_eq!(j.rate.iops, [Some(500), Some(200)]);
        assert_eq!(j.rate.process, RateProcess::Poisson);
        let j = job("rate_iops=1000");
        assert_eq!(j.rate.iops, [Some(1000), Some(1000)]);
        assert!(j.rate.is_limited());
        let j = job("rate=,500k");
        assert_eq!(j.rate.bytes_per_sec, [None, Some(500 << 10)]);
        let j = job("rate=500k,");
        assert_eq!(j.rate.bytes_per_sec, [Some(500 << 10), None]);
        assert!(!job("rate=0").rate.is_limited());
        assert!(job_err("rate_process=bursty").contains("expected one of linear, poisson"));
        assert!(job_err("rate_iops=fast").contains("not a number"));
    }

    #[test]
    fn syncs_verify_reporting() {
        let j = job("fsync=32\nfdatasync=8\nend_fsync=1");
        assert_eq!((j.fsync, j.fdatasync, j.end_fsync), (32, 8, true));
        assert_eq!(job("verify=crc32c").verify, Some(VerifyKind::Crc32c));
        assert_eq!(job("verify=crc32c-intel").verify, Some(VerifyKind::Crc32c));
        assert_eq!(job("verify=crc32c\nverify=0").verify, None);
        assert_eq!(job("verify=none").verify, None);
        assert!(job_err("verify=md5").contains("crc32c only"));
        let j = job("percentile_list=99.9:50:99\ngroup_reporting");
        assert_eq!(j.percentile_list, vec![50.0, 99.0, 99.9]);
        assert!(j.group_reporting);
        assert!(job_err("percentile_list=0:50").contains("(0, 100]"));
        assert!(job_err("percentile_list=50:x").contains("'x'"));
        let many = vec!["1"; 21].join(":");
        assert!(job_err(&format!("percentile_list={many}")).contains("at most 20"));
    }

    #[test]
    fn advisory_options_are_accepted_and_checked() {
        let j = job(
            "clocksource=clock_gettime\nthread\nfadvise_hint=0\nrandom_generator=lfsr\n\
             unique_filename=0\ndisk_util=0",
        );
        assert_eq!(j.name, "j");
        assert!(job_err("clocksource=sundial").contains("expected one of gettimeofday"));
        assert!(job_err("fadvise_hint=maybe").contains("expected one of"));
        assert!(job_err("thread=2").contains("expected 0 or 1"));
    }

    // ---- ${ENV} and keywords ----

    #[test]
    fn environment_variables_expand() {
        let vars: HashMap<&str, &str> = [("DIR", "/mnt/x"), ("BS", "16k"), ("EMPTY", "")].into();
        let env = |name: &str| vars.get(name).map(|v| v.to_string());
        let jobs = parse_with_env(
            "[j]\ndirectory=${DIR}/sub\nbs=${BS}\ndescription=a${EMPTY}b\n",
            Path::new("t.fio"),
            None,
            &[],
            &env,
        )
        .unwrap();
        assert_eq!(jobs[0].directories, vec![PathBuf::from("/mnt/x/sub")]);
        assert_eq!(jobs[0].bs[0], vec![(16384, 100)]);
        assert_eq!(jobs[0].description.as_deref(), Some("ab"));

        let e = parse_with_env("[j]\n\nsize=${NOPE}\n", Path::new("t.fio"), None, &[], &env)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.fio:3: size: environment variable ${NOPE} is not set"
        );
        let vars2: HashMap<&str, &str> = [("SIZE", "4q")].into();
        let env2 = |name: &str| vars2.get(name).map(|v| v.to_string());
        let e = parse_with_env("[j]\nsize=${SIZE}\n", Path::new("t.fio"), None, &[], &env2)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.fio:2: size=${SIZE}: not a size (expected e.g. 4k, 1m)"
        );
        assert!(err("[j]\nsize=${OPEN\n").contains("without a closing"));
    }

    #[test]
    fn the_real_environment_is_used_by_parse_str() {
        let path = std::env::var("PATH").expect("PATH is set for tests");
        let jobs = parse_str("[j]\ndescription=${PATH}\n", Path::new("t"), None, &[]).unwrap();
        assert_eq!(jobs[0].description.as_deref(), Some(path.as_str()));
    }

    #[test]
    fn reserved_keywords_expand() {
        let j = job("numjobs=$ncpus\nbs=$pagesize");
        let [(_, pagesize), _, (_, ncpus)] = reserved_keywords();
        assert_eq!(j.numjobs as u64, ncpus);
        assert_eq!(j.bs[0], vec![(pagesize, 100)]);
        assert!(job_err("size=8*$mb_memory").contains("arithmetic"));
    }

    // ---- overrides ----

    #[test]
    fn overrides_apply_to_every_job_after_its_options() {
        let jobs = set(
            &[
                ("directory", "/mnt/test"),
                ("iodepth", "16"),
                ("time_based", ""),
            ],
            "[global]\niodepth=2\n[a]\niodepth=4\n[b]\n",
        )
        .unwrap();
        for j in &jobs {
            assert_eq!(j.directories, vec![PathBuf::from("/mnt/test")]);
            assert_eq!(j.iodepth, 16);
            assert!(j.time_based);
        }
    }

    #[test]
    fn override_errors_name_the_set() {
        let e = set(&[("bs", "4q")], "[j]\n").unwrap_err().to_string();
        assert_eq!(e, "--set bs=4q: not a size (expected e.g. 4k, 1m)");
        let e = set(&[("iodeth", "4")], "[j]\n").unwrap_err().to_string();
        assert_eq!(
            e,
            "--set iodeth=4: option 'iodeth': unknown option (did you mean 'iodepth'?)"
        );
        let e = set(&[("loops", "2")], "[j]\n").unwrap_err().to_string();
        assert!(
            e.starts_with("--set loops=2: option 'loops': not supported"),
            "{e}"
        );
    }

    // ---- include ----

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn include_pulls_options_into_the_section() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "glob.fio", "thread=1\ngroup_reporting=1\n");
        write(
            dir.path(),
            "sub/test.fio",
            "ioengine=libaio\ninclude deeper.fio\n",
        );
        write(dir.path(), "sub/deeper.fio", "iodepth=4\n");
        let main = write(
            dir.path(),
            "main.fio",
            "[global]\nfilesize=1m\ninclude glob.fio\n[test]\nrw=randread\ninclude sub/test.fio\n",
        );
        let jobs = parse_file(&main, &[]).unwrap();
        assert_eq!(jobs.len(), 1);
        assert!(jobs[0].group_reporting);
        assert_eq!(jobs[0].engine, EngineKind::Libaio);
        assert_eq!(jobs[0].iodepth, 4);
        assert_eq!(jobs[0].filesize, Some(1 << 20));
    }

    #[test]
    fn errors_in_included_files_name_that_file() {
        let dir = tempfile::tempdir().unwrap();
        let inc = write(dir.path(), "inc.fio", "# comment\nbs=4q\n");
        let main = write(dir.path(), "main.fio", "[j]\ninclude inc.fio\n");
        let e = parse_file(&main, &[]).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "{}:2: bs=4q: not a size (expected e.g. 4k, 1m)",
                inc.display()
            )
        );
    }

    #[test]
    fn include_cycles_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a.fio", "iodepth=2\ninclude b.fio\n");
        write(dir.path(), "b.fio", "include a.fio\n");
        let main = write(dir.path(), "main.fio", "[j]\ninclude a.fio\n");
        let e = parse_file(&main, &[]).unwrap_err().to_string();
        assert!(e.contains("b.fio:1: include a.fio: include cycle: "), "{e}");
        let main = write(dir.path(), "self.fio", "[j]\ninclude self.fio\n");
        let e = parse_file(&main, &[]).unwrap_err().to_string();
        assert!(
            e.contains("self.fio:2: include self.fio: include cycle"),
            "{e}"
        );
    }

    #[test]
    fn include_depth_is_limited() {
        let dir = tempfile::tempdir().unwrap();
        // A chain longer than the limit, without a cycle.
        for i in 0..(MAX_INCLUDE_DEPTH + 2) {
            write(
                dir.path(),
                &format!("d{i}.fio"),
                &format!("include d{}.fio\n", i + 1),
            );
        }
        write(
            dir.path(),
            &format!("d{}.fio", MAX_INCLUDE_DEPTH + 2),
            "iodepth=2\n",
        );
        let main = write(dir.path(), "main.fio", "[j]\ninclude d0.fio\n");
        let e = parse_file(&main, &[]).unwrap_err().to_string();
        assert!(e.contains("nested more than 16 deep"), "{e}");
    }

    #[test]
    fn include_rules() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "sections.fio", "[other]\nbs=4k\n");
        let main = write(dir.path(), "main.fio", "[j]\ninclude sections.fio\n");
        let e = parse_file(&main, &[]).unwrap_err().to_string();
        assert!(
            e.contains("sections.fio:1: [other]: an included file may not"),
            "{e}"
        );

        let main = write(dir.path(), "outside.fio", "include x.fio\n[j]\n");
        let e = parse_file(&main, &[]).unwrap_err().to_string();
        assert!(
            e.contains("outside.fio:1: include x.fio: include outside of a section"),
            "{e}"
        );

        let main = write(dir.path(), "missing.fio", "[j]\ninclude nope.fio\n");
        let e = parse_file(&main, &[]).unwrap_err().to_string();
        assert!(
            e.contains("missing.fio:2: include nope.fio: cannot read"),
            "{e}"
        );

        // Text from the network: no base directory, so no include.
        let e = parse_str("[j]\ninclude /etc/passwd\n", Path::new("net"), None, &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("net:2: include /etc/passwd: include is not allowed"),
            "{e}"
        );

        // `include` as the prefix of an option name is an option, not a directive.
        assert!(job_err("included=1").contains("option 'included': unknown option"));
    }

    #[test]
    fn parse_str_with_a_base_resolves_includes() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "inc.fio", "iodepth=7\n");
        let jobs = parse_str(
            "[j]\ninclude inc.fio\n",
            Path::new("net"),
            Some(dir.path()),
            &[],
        )
        .unwrap();
        assert_eq!(jobs[0].iodepth, 7);
    }

    #[test]
    fn unreadable_file() {
        let e = parse_file(Path::new("/nonexistent/x.fio"), &[]).unwrap_err();
        assert!(matches!(e, JobFileError::Read { .. }));
        assert!(
            e.to_string()
                .starts_with("/nonexistent/x.fio: cannot read job file")
        );
    }

    // ---- limits (issue 13: safe on a production host) ----

    #[test]
    fn numjobs_is_bounded_as_in_fio() {
        assert_eq!(
            job_err("numjobs=100000"),
            "jobs/t.fio:2: numjobs=100000: at most 4096 clones (fio refuses more jobs than its \
             REAL_MAX_JOBS, 4096); lower numjobs"
        );
        assert_eq!(job("numjobs=4096").numjobs, 4096);
        // fio counts every clone of every job against the one limit.
        let e = err("[a]\nnumjobs=4000\n[b]\nnumjobs=97\n");
        assert_eq!(
            e,
            "jobs/t.fio:4: numjobs=97: the job file asks for 4097 clones in all; fio runs at most \
             4096 (its REAL_MAX_JOBS); lower numjobs or split the job file"
        );
    }

    #[test]
    fn iodepth_is_bounded_per_engine() {
        assert_eq!(
            job_err("iodepth=100000"),
            "jobs/t.fio:2: iodepth=100000: at most 65536 (the deepest queue fio runs, libaio \
             with the default fs.aio-max-nr); lower iodepth"
        );
        let e = job_err("ioengine=io_uring\niodepth=32769");
        assert!(
            e.starts_with("jobs/t.fio:3: iodepth=32769: at most 32768 with ioengine=io_uring"),
            "{e}"
        );
        // The engine may come after the depth; the error still points at the depth's line.
        let e = job_err("iodepth=40000\nioengine=libaio");
        assert!(
            e.starts_with("jobs/t.fio:2: iodepth=40000: at most 32768 with ioengine=libaio"),
            "{e}"
        );
        let e = job_err("iodepth=257");
        assert!(
            e.starts_with("jobs/t.fio:2: iodepth=257: at most 256 with ioengine=psync"),
            "{e}"
        );
        assert_eq!(job("ioengine=io_uring\niodepth=32768").iodepth, 32768);
        assert_eq!(job("iodepth=256").iodepth, 256);
        assert_eq!(job("ioengine=null\niodepth=65536").iodepth, 65536);
        // From [global], the error points at the global's line.
        let e = err("[global]\niodepth=300\n[j]\n");
        assert!(
            e.starts_with("jobs/t.fio:2: iodepth=300: at most 256"),
            "{e}"
        );
    }

    #[test]
    fn job_files_must_be_small_regular_files() {
        let e = parse_file(Path::new("/dev/zero"), &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "/dev/zero: cannot read job file: a character device, not a regular file"
            ),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let e = parse_file(dir.path(), &[]).unwrap_err().to_string();
        assert!(e.contains("a directory, not a regular file"), "{e}");
        let big = write(dir.path(), "big.fio", &"; padding\n".repeat(200_000));
        let e = parse_file(&big, &[]).unwrap_err().to_string();
        assert!(
            e.contains("2000000 bytes, more than the 1048576 a job file may have"),
            "{e}"
        );
    }

    #[test]
    fn includes_must_be_small_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        let main = write(dir.path(), "main.fio", "[j]\ninclude /dev/zero\n");
        let e = parse_file(&main, &[]).unwrap_err().to_string();
        assert!(
            e.contains("main.fio:2: include /dev/zero: cannot read /dev/zero: a character device"),
            "{e}"
        );
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo reads a NUL-terminated path that lives for the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let main = write(dir.path(), "fifo.fio", "[j]\ninclude fifo\n");
        // A FIFO with no writer would block a plain open forever; it must be refused at once.
        let e = parse_file(&main, &[]).unwrap_err().to_string();
        assert!(e.contains("a FIFO, not a regular file"), "{e}");
        write(dir.path(), "sub/x", "");
        let main = write(dir.path(), "dir.fio", "[j]\ninclude sub\n");
        let e = parse_file(&main, &[]).unwrap_err().to_string();
        assert!(
            e.contains("include sub: cannot read") && e.contains("a directory"),
            "{e}"
        );
    }

    #[test]
    fn errors_do_not_echo_expanded_environment_values() {
        let vars: HashMap<&str, &str> =
            [("SECRET", "hunter2-token"), ("SIZE", "4q"), ("N", "0.5")].into();
        let env = |name: &str| vars.get(name).map(|v| v.to_string());
        let e = |text: &str| {
            parse_with_env(text, Path::new("t.fio"), None, &[], &env)
                .unwrap_err()
                .to_string()
        };
        let shown = e("[j]\nsize=${SECRET}\n");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            shown.starts_with("t.fio:2: size=${SECRET}: not a size"),
            "{shown}"
        );
        // Messages that quote part of the value quote it as written too.
        let shown = e("[j]\nbssplit=4k/${SECRET}\n");
        assert!(!shown.contains("hunter2"), "{shown}");
        let shown = e("[j]\nsize=1.${SECRET}g\n");
        assert!(!shown.contains("hunter2"), "{shown}");
        let shown = e("[j]\ndescription=x\nrw=${SECRET}\n");
        assert!(!shown.contains("hunter2"), "{shown}");
    }

    // ---- the job files in the repository ----

    fn repo(path: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
    }

    #[test]
    fn seed_job_files_parse() {
        let read = parse_file(&repo("../agent/tests/jobs/hadoop-randread.fio"), &[]).unwrap();
        assert_eq!(read.len(), 1);
        let j = &read[0];
        assert_eq!(j.name, "Read-Test-1");
        assert_eq!(j.pattern, Pattern::RandRead);
        assert_eq!(j.engine, EngineKind::Libaio);
        assert_eq!(j.iodepth, 4);
        assert_eq!(j.size, Some(Extent::Bytes(500 << 30)));
        assert_eq!(j.bs, [vec![(128 << 20, 100)], vec![(128 << 20, 100)]]);
        assert_eq!(j.directories, vec![PathBuf::from("/ebs0")]);
        assert!(j.direct && j.invalidate && !j.randrepeat);
        assert_eq!(j.runtime, None);

        let write = parse_file(&repo("../agent/tests/jobs/hadoop-randwrite.fio"), &[]).unwrap();
        assert_eq!(write[0].name, "Write-Test-1");
        assert_eq!(write[0].pattern, Pattern::RandWrite);
        assert_eq!(write[0].size, Some(Extent::Bytes(500 << 30)));
    }

    #[test]
    fn example_job_files_parse() {
        let vars: HashMap<&str, &str> = [("LOCKSTEP_DIR", "/mnt/lockstep")].into();
        let env = |name: &str| vars.get(name).map(|v| v.to_string());
        let example = |name: &str| -> Vec<JobSpec> {
            let path = repo(&format!("../examples/jobs/{name}"));
            let text = std::fs::read_to_string(&path).unwrap();
            parse_with_env(&text, &path, path.parent(), &[], &env).unwrap_or_else(|e| panic!("{e}"))
        };
        let dir = vec![PathBuf::from("/mnt/lockstep")];

        let j = &example("alteryx-randrw.fio")[0];
        assert_eq!(j.pattern, Pattern::RandReadWrite);
        assert_eq!((j.nrfiles, j.rwmixread), (8, 50));
        assert_eq!(j.bs[0], vec![(8192, 100)]);
        assert_eq!(j.directories, dir);

        let j = &example("alteryx-seqwrite.fio")[0];
        assert_eq!(j.pattern, Pattern::Write);
        assert_eq!(j.nrfiles, 8);
        assert_eq!(j.bs[1], vec![(256 << 10, 100)]);

        for (name, pattern) in [
            ("hadoop-randread.fio", Pattern::RandRead),
            ("hadoop-randwrite.fio", Pattern::RandWrite),
        ] {
            let j = &example(name)[0];
            assert_eq!(j.pattern, pattern);
            assert_eq!(j.size, Some(Extent::Bytes(256 << 20)));
            assert_eq!(j.bs[0], vec![(16 << 20, 100)]);
            assert_eq!(j.directories, dir);
            assert_eq!(j.runtime, Some(Duration::from_secs(10)));
            assert!(j.time_based);
        }

        let j = &example("randread-4k.fio")[0];
        assert_eq!(
            (j.engine, j.iodepth, j.direct),
            (EngineKind::IoUring, 32, true)
        );
        assert_eq!(j.size, Some(Extent::Bytes(1 << 30)));
        assert_eq!(j.runtime, Some(Duration::from_secs(30)));
        assert_eq!(j.directories, dir);

        let j = &example("null-4k.fio")[0];
        assert_eq!((j.engine, j.iodepth), (EngineKind::Null, 32));
        assert_eq!(j.bs[0], vec![(4096, 100)]);
        assert!(j.time_based);
    }

    #[test]
    fn every_example_in_the_directory_parses() {
        let dir = repo("../examples/jobs");
        let env = |_: &str| Some("/tmp".to_string());
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "fio") {
                let text = std::fs::read_to_string(&path).unwrap();
                parse_with_env(&text, &path, path.parent(), &[], &env)
                    .unwrap_or_else(|e| panic!("{e}"));
                seen += 1;
            }
        }
        assert!(seen >= 6);
    }

    #[test]
    fn option_tables_are_consistent() {
        for name in SUPPORTED.iter().chain(ADVISORY) {
            assert!(FIO_OPTIONS.contains(name), "{name} is not a fio option");
        }
        for (alias, name) in ALIASES {
            assert!(FIO_OPTIONS.contains(alias), "{alias}");
            assert!(SUPPORTED.contains(name), "{name}");
        }
        // Every supported and advisory option is handled by `apply`, not refused.
        for name in SUPPORTED.iter().chain(ADVISORY).chain(LOCKSTEP_ONLY) {
            let mut b = Builder::new(JobSpec::with_defaults("j", Origin::default()));
            let result = apply(&mut b, name, None, false);
            assert!(
                !matches!(result, Err(Problem::Unknown(_) | Problem::Unsupported(_))),
                "{name}"
            );
        }
    }

    #[test]
    fn edit_distance_works() {
        assert_eq!(edit_distance("iodeth", "iodepth"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(suggest("runtme"), Some("runtime"));
        assert_eq!(suggest("zzzzzzzz"), None);
    }
}
