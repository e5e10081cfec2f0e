//! A role's workload into fio job text: a built-in profile, a job file (includes expanded, so
//! the text can travel to an agent that has no copy of the plan's directory), or inline options.
//!
//! The text is then checked with the agent's own parser, with the same overrides the run will
//! apply, so an option the agent would refuse is refused here, before anything starts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lockstep_core::job::JobSpec;
use lockstep_core::jobfile::{self, JobFileError, Place};
use toml::Spanned;

use super::raw::{FioOptions, RawWorkload};
use super::{PlanError, Source, Workload, WorkloadSource};
use crate::plan::profiles;

/// How deep `include` may nest: deeper is almost certainly a cycle the path check missed
/// (for instance through symlinks).
const MAX_INCLUDE_DEPTH: usize = 16;

/// Options the agent sets itself: every job is confined to the volume the plan assigns it.
const CONFINED: [&str; 2] = ["directory", "filename"];

pub(super) fn build(
    src: &Source,
    what: &str,
    role: &str,
    raw: &Spanned<RawWorkload>,
    rate_iops: Option<&Spanned<u64>>,
    run_length: Duration,
) -> Result<Workload, PlanError> {
    let w = raw.get_ref();
    let field = format!("{what}: workload");
    let given = [w.profile.is_some(), w.jobfile.is_some(), w.fio.is_some()]
        .iter()
        .filter(|&&g| g)
        .count();
    if given != 1 {
        let problem = if given == 0 {
            "says nothing to run"
        } else {
            "gives more than one source"
        };
        return Err(src.at(
            raw,
            field,
            format!(
                "{problem}: give exactly one of profile = \"oltp-8k\", jobfile = \"jobs/x.fio\" \
                 or fio = {{ rw = \"randrw\", bs = \"8k\", ... }}"
            ),
        ));
    }

    let mut overrides = BTreeMap::new();
    if let Some(set) = &w.set {
        overrides = options(src, &format!("{field}.set"), set)?;
    }
    // lockstep's own overrides come last: the plan's phases decide time and measurement.
    overrides.insert("time_based".to_string(), "1".to_string());
    overrides.insert("runtime".to_string(), fio_time(run_length));
    overrides.insert("ramp_time".to_string(), "0".to_string());
    let override_list: Vec<(String, String)> = overrides.clone().into_iter().collect();
    let plan_dir = src.file.parent().unwrap_or(Path::new("")).to_path_buf();
    let mut check = Check {
        src,
        workload_field: &field,
        set: w.set.as_ref(),
        inline: None,
        field: field.clone(),
        line: src.line_of(raw),
    };

    let (source, job_text, jobs) = if let Some(name) = &w.profile {
        let Some(profile) = profiles::get(name.get_ref()) else {
            return Err(src.at(
                name,
                field,
                format!(
                    "unknown profile '{}' (known: {})",
                    name.get_ref(),
                    profiles::names().join(", ")
                ),
            ));
        };
        check.line = src.line_of(name);
        let origin = PathBuf::from(format!("<profile {}>", profile.name));
        let jobs = check.parse(profile.job, &origin, None, &override_list)?;
        (
            WorkloadSource::Profile(profile.name.to_string()),
            profile.job.to_string(),
            jobs,
        )
    } else if let Some(rel) = &w.jobfile {
        let path = plan_dir.join(rel.get_ref());
        check.field = format!("{field}.jobfile");
        check.line = src.line_of(rel);
        let text = read_job_file(&path).map_err(|e| {
            src.at(
                rel,
                &check.field,
                format!("cannot read {}: {e}", path.display()),
            )
        })?;
        let mut stack = vec![path.clone()];
        let expanded = expand(&path, &text, &mut stack)
            .map_err(|e| src.at(rel, &check.field, e.to_string()))?;
        if !has_job_section(&expanded) {
            return Err(src.at(
                rel,
                &check.field,
                format!(
                    "{} has no job section: add one, e.g. [{role}], after [global]",
                    path.display()
                ),
            ));
        }
        // First as written, so messages name the job file's own lines; then as it will
        // travel, includes expanded (the agent refuses include in text it receives).
        let include_base = path.parent().unwrap_or(Path::new("")).to_path_buf();
        check.parse(&text, &path, Some(&include_base), &override_list)?;
        let jobs = check.parse(&expanded, &path, None, &override_list)?;
        (WorkloadSource::JobFile(path), expanded, jobs)
    } else {
        let fio = w.fio.as_ref().expect("one source is given");
        check.field = format!("{field}.fio");
        check.line = src.line_of(fio);
        let opts = options(src, &check.field, fio)?;
        if opts.is_empty() {
            return Err(src.at(fio, &check.field, "is empty: give at least rw and bs"));
        }
        let mut text = format!(
            "; inline fio options of role '{role}' in {}\n[{role}]\n",
            src.file.display()
        );
        for (key, value) in &opts {
            text.push_str(&format!("{key}={value}\n"));
        }
        let origin = PathBuf::from(format!(
            "{} (role '{role}' workload.fio)",
            src.file.display()
        ));
        check.inline = Some((origin.clone(), fio));
        let jobs = check.parse(&text, &origin, None, &override_list)?;
        (WorkloadSource::Inline, text, jobs)
    };
    if let Some(target) = rate_iops {
        let value = rate_override(*target.get_ref(), &jobs)
            .map_err(|m| src.at(target, format!("{what}: rate_iops"), m))?;
        overrides.insert("rate_iops".to_string(), value);
    }
    Ok(Workload {
        source,
        job_text,
        overrides,
        line: check.line,
    })
}

/// `workload` with an open-loop target of `target` IOPS per volume (`None`: closed loop), as
/// the plan would have built it with `rate_iops = target`: for curve mode, whose rates are
/// known only after the maximum has been measured.
pub fn with_rate(workload: &Workload, target: Option<u64>) -> Result<Workload, String> {
    let mut w = workload.clone();
    match target {
        Some(t) => {
            let value = rate_for(workload, t)?;
            w.overrides.insert("rate_iops".to_string(), value);
        }
        None => {
            w.overrides.remove("rate_iops");
        }
    }
    Ok(w)
}

/// fio's `rate_iops=` value for a per-volume target on this workload.
pub(super) fn rate_for(workload: &Workload, target: u64) -> Result<String, String> {
    let mut overrides: Vec<(String, String)> = workload
        .overrides
        .iter()
        .filter(|(k, _)| k.as_str() != "rate_iops")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    overrides.retain(|(k, _)| !CONFINED.contains(&k.as_str()));
    let jobs = jobfile::parse_str(&workload.job_text, Path::new("(curve)"), None, &overrides)
        .map_err(|e| e.to_string())?;
    rate_override(target, &jobs)
}

/// The role's `rate_iops`, a target for the whole volume, as fio's per-job, per-direction
/// `rate_iops=READ,WRITE`: split evenly over the job clones (`numjobs` summed over the jobs,
/// which run side by side for the whole run) and by the read/write mix.
fn rate_override(target: u64, jobs: &[JobSpec]) -> Result<String, String> {
    let clones: u64 = jobs.iter().map(|j| u64::from(j.numjobs.max(1))).sum();
    let mix = |j: &JobSpec| match (j.pattern.reads(), j.pattern.writes()) {
        (true, true) => j.rwmixread,
        (true, false) => 100,
        _ => 0,
    };
    let first = jobs.first().ok_or("the workload has no jobs")?;
    let read_pct = mix(first);
    if jobs.iter().any(|j| mix(j) != read_pct) {
        return Err(
            "the volume's jobs mix reads and writes differently, so one per-volume rate cannot \
             be split over them: set rate_iops in each job instead (workload.set or the job file)"
                .to_string(),
        );
    }
    let per_job = target as f64 / clones as f64;
    // A direction in use gets at least 1 IOPS: fio reads 0 as "no limit".
    let share = |pct: u32| -> String {
        if pct == 0 {
            String::new()
        } else {
            ((per_job * f64::from(pct) / 100.0).round() as u64)
                .max(1)
                .to_string()
        }
    };
    Ok(format!("{},{}", share(read_pct), share(100 - read_pct)))
}

/// Runs the agent's job-file parser and turns its errors into plan errors at the most precise
/// place known: the inline option or `set` key in the plan when the error is about one,
/// otherwise the workload's line (the message then names the job file and its line).
struct Check<'a> {
    src: &'a Source<'a>,
    /// `role 'x': workload`.
    workload_field: &'a str,
    set: Option<&'a Spanned<FioOptions>>,
    /// For inline options: the origin given to the parser and the plan's option table.
    inline: Option<(PathBuf, &'a Spanned<FioOptions>)>,
    /// Field and line for errors that map to nothing narrower.
    field: String,
    line: usize,
}

impl Check<'_> {
    fn parse(
        &self,
        text: &str,
        origin: &Path,
        include_base: Option<&Path>,
        overrides: &[(String, String)],
    ) -> Result<Vec<JobSpec>, PlanError> {
        jobfile::parse_str(text, origin, include_base, overrides).map_err(|e| self.error(&e))
    }

    fn error(&self, e: &JobFileError) -> PlanError {
        let shown = e.to_string();
        let place = match e {
            JobFileError::UnknownOption { at, .. }
            | JobFileError::Unsupported { at, .. }
            | JobFileError::Value { at, .. } => Some(at),
            _ => None,
        };
        let set_key = match (place, self.set) {
            (Some(Place::Override { key, .. }), Some(set)) => set.get_ref().get_key_value(key),
            _ => None,
        };
        if let Some((key, value)) = set_key {
            let message = shown.strip_prefix("--set ").unwrap_or(&shown);
            return self
                .src
                .at(value, format!("{}.set.{key}", self.workload_field), message);
        }
        let inline_key = match (&self.inline, e.line()) {
            // Line 1 is a comment, line 2 the section, then one option a line in key order.
            (Some((origin, table)), Some(at)) if &at.file == origin => at
                .line
                .checked_sub(3)
                .and_then(|i| table.get_ref().iter().nth(i))
                .map(|kv| (at, kv)),
            _ => None,
        };
        if let Some((at, (key, value))) = inline_key {
            let prefix = format!("{at}: ");
            let message = shown.strip_prefix(&prefix).unwrap_or(&shown);
            return self
                .src
                .at(value, format!("{}.fio.{key}", self.workload_field), message);
        }
        self.src.error(self.line, &self.field, shown)
    }
}

/// fio's time syntax has no compound units ("1m30s"): seconds when whole, else milliseconds.
pub(super) fn fio_time(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis().max(1))
    }
}

/// TOML fio options into `key=value` strings, as a job file would have them.
fn options(
    src: &Source,
    field: &str,
    table: &Spanned<FioOptions>,
) -> Result<BTreeMap<String, String>, PlanError> {
    let mut out = BTreeMap::new();
    for (key, value) in table.get_ref() {
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(src.at(
                value,
                field,
                format!("'{key}' is not a fio option name (letters, digits and '_')"),
            ));
        }
        let lower = key.to_ascii_lowercase();
        if CONFINED.contains(&lower.as_str()) {
            return Err(src.at(
                value,
                format!("{field}.{key}"),
                "is set by the agent to the volume the plan assigns; select volumes with the \
                 role's `volumes` instead",
            ));
        }
        if lower == "include" {
            return Err(src.at(
                value,
                format!("{field}.{key}"),
                "include belongs in job files: use workload = { jobfile = \"...\" }",
            ));
        }
        let text = option_value(value.get_ref())
            .map_err(|m| src.at(value, format!("{field}.{key}"), m))?;
        out.insert(key.clone(), text);
    }
    Ok(out)
}

/// One TOML value in fio's syntax: booleans as 1/0, lists joined with ':' (fio's list
/// separator, as in `percentile_list=99:99.9`).
fn option_value(v: &toml::Value) -> Result<String, String> {
    match v {
        toml::Value::String(s) => {
            if s.contains(['\n', '\r']) {
                Err("a fio option value cannot span lines".to_string())
            } else {
                Ok(s.clone())
            }
        }
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Boolean(b) => Ok(if *b { "1" } else { "0" }.to_string()),
        toml::Value::Array(items) => {
            let parts = items
                .iter()
                .map(|i| match i {
                    toml::Value::Array(_) | toml::Value::Table(_) => {
                        Err("a list of fio values cannot nest".to_string())
                    }
                    other => option_value(other),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(parts.join(":"))
        }
        toml::Value::Table(_) => Err("a fio option takes a value, not a table".to_string()),
        toml::Value::Datetime(_) => Err("a fio option takes a number or a string".to_string()),
    }
}

/// A problem inside a job file (or a file it includes), with that file's line.
#[derive(Debug)]
struct JobFileProblem {
    file: PathBuf,
    line: usize,
    message: String,
}

impl std::fmt::Display for JobFileProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.file.display(), self.line, self.message)
    }
}

/// Replaces fio `include FILE` lines with the file's text (relative to the including file), and
/// refuses the options the agent sets itself.
fn expand(path: &Path, text: &str, stack: &mut Vec<PathBuf>) -> Result<String, JobFileProblem> {
    let dir = path.parent().unwrap_or(Path::new("")).to_path_buf();
    let mut out = String::with_capacity(text.len());
    for (index, line) in text.lines().enumerate() {
        let problem = |message: String| JobFileProblem {
            file: path.to_path_buf(),
            line: index + 1,
            message,
        };
        // Comments run from the first ';' or '#' to the end of the line, as in fio.
        let code = line.split([';', '#']).next().unwrap_or("").trim();
        let include = code
            .strip_prefix("include")
            .filter(|rest| rest.starts_with([' ', '\t']))
            .map(str::trim);
        if let Some(rest) = include {
            let inc = dir.join(rest);
            if stack.contains(&inc) || stack.len() > MAX_INCLUDE_DEPTH {
                return Err(problem(format!(
                    "include {rest} makes a cycle ({})",
                    stack
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(" -> ")
                )));
            }
            let inc_text = read_job_file(&inc)
                .map_err(|e| problem(format!("cannot read {}: {e}", inc.display())))?;
            stack.push(inc.clone());
            out.push_str(&format!("; begin include {rest}\n"));
            out.push_str(&expand(&inc, &inc_text, stack)?);
            out.push_str(&format!("; end include {rest}\n"));
            stack.pop();
            continue;
        }
        let key = match code.split_once('=') {
            Some((key, _)) => key.trim(),
            None => code,
        };
        if !code.starts_with('[') && CONFINED.contains(&key.to_ascii_lowercase().as_str()) {
            return Err(problem(format!(
                "{}= is set by the agent to the volume the plan assigns; remove it (the \
                 plan's role selects the volumes)",
                key
            )));
        }
        out.push_str(line);
        out.push('\n');
    }
    Ok(out)
}

/// Whether job text has a section other than `[global]`: without one fio runs nothing.
fn has_job_section(text: &str) -> bool {
    text.lines().any(|l| {
        let t = l.trim();
        t.starts_with('[')
            && t.ends_with(']')
            && !t[1..t.len() - 1].trim().eq_ignore_ascii_case("global")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn option_values_use_fio_syntax() {
        assert_eq!(option_value(&toml::Value::Boolean(true)).unwrap(), "1");
        assert_eq!(option_value(&toml::Value::Integer(16)).unwrap(), "16");
        assert_eq!(option_value(&toml::Value::Float(99.9)).unwrap(), "99.9");
        let list = toml::Value::Array(vec![toml::Value::Float(99.0), toml::Value::Float(99.9)]);
        assert_eq!(option_value(&list).unwrap(), "99:99.9");
        assert!(option_value(&toml::Value::String("a\nb".into())).is_err());
    }

    #[test]
    fn fio_time_has_no_compound_units() {
        assert_eq!(fio_time(Duration::from_secs(90)), "90s");
        assert_eq!(fio_time(Duration::from_millis(1500)), "1500ms");
    }

    #[test]
    fn job_sections_other_than_global_count() {
        assert!(has_job_section("[global]\nbs=4k\n[a]\nrw=read\n"));
        assert!(!has_job_section("[global]\nbs=4k\n"));
    }
}

/// A job file or include a plan names: a regular file of bounded size, as the agent reads
/// its own (so `/dev/zero` or a FIFO is refused, not read until memory runs out or forever).
fn read_job_file(path: &Path) -> Result<String, lockstep_core::limits::TextFileError> {
    use lockstep_core::limits::{MAX_TEXT_FILE, read_text_file};
    read_text_file(path, MAX_TEXT_FILE, "job file")
}
