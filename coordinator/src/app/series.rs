//! A series of complete runs (the steps of a rate curve or a depth sweep): each step is a run
//! of its own in `out_dir/<mode>/<step>/`, and the series ends with one results file.

use std::collections::VecDeque;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

use super::{RunOutcome, RunSettings};
use crate::export;
use crate::plan::{AgentInfo, Plan};
use crate::results::{RunResults, RunStatus};

/// One complete run of a series (curve and sweep modes), with what its mode needs to know
/// about it afterwards.
pub(crate) struct Step<T> {
    /// For messages: `max`, `50%`, `depth 4`.
    pub name: String,
    /// The directory is `<mode>/<n>-<slug>`.
    pub slug: String,
    /// What the step runs, for the log line.
    pub what: String,
    pub plan: Plan,
    pub data: T,
}

/// What a step left: its directory (relative to the run's), results and raw histograms.
pub(crate) struct StepRun {
    pub dir: String,
    pub results: RunResults,
    pub entries: Vec<crate::results::hlog::LogEntry>,
}

/// Runs `steps` one after another on the same agents, each a complete run with its own
/// results directory (`out_dir/<mode>/<n>-<slug>/`). `done` sees each step's results and may
/// schedule more steps (curve mode learns its rates from the first). An aborted step ends the
/// series. Returns the first step's results, the base of the series' `results.json` (marked
/// aborted when a step was), and whether any step failed an objective or a verification or
/// was aborted.
pub(crate) async fn run_steps<T>(
    settings: &RunSettings,
    infos: &[AgentInfo],
    out_dir: &Path,
    mode: &str,
    steps: Vec<Step<T>>,
    mut done: impl FnMut(&Step<T>, &StepRun) -> anyhow::Result<Vec<Step<T>>>,
) -> anyhow::Result<(RunResults, bool)> {
    let mut pending: VecDeque<Step<T>> = steps.into();
    let mut base: Option<RunResults> = None;
    let mut failed = false;
    let mut index = 0usize;
    while let Some(step) = pending.pop_front() {
        let dir_name = format!("{mode}/{index}-{}", step.slug);
        index += 1;
        let dir = out_dir.join(&dir_name);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        eprintln!("lockstep: {mode} step {}: {}", step.name, step.what);
        let assignment = crate::plan::resolve(&step.plan, infos)?;
        let results = super::run_resolved(settings, &step.plan, &assignment, &dir)
            .await?
            .results;
        let entries = crate::results::store::read_entries(&dir)
            .map_err(anyhow::Error::msg)
            .context("reading the step's interval histograms")?;
        failed |= results.objectives_failed() || results.verify_failed();
        let aborted = results.status == RunStatus::Aborted;
        let run = StepRun {
            dir: dir_name,
            results,
            entries,
        };
        pending.extend(done(&step, &run)?);
        if base.is_none() {
            base = Some(run.results);
        }
        if aborted {
            eprintln!("lockstep: {mode} stopped at step {}", step.name);
            pending.clear();
            failed = true;
            if let Some(b) = base.as_mut() {
                b.status = RunStatus::Aborted;
            }
        }
    }
    let base = base.with_context(|| format!("the {mode}'s first step produced no results"))?;
    Ok((base, failed))
}

/// Ends a series: writes its `results.json` (the base results with the series' section) and
/// `report.txt`, prints the section (its JSON with `--json`, else `text`), and gives the exit
/// code: interrupted when a step was aborted, objective when one failed.
pub(crate) fn finish(
    settings: &RunSettings,
    out_dir: &Path,
    mode: &str,
    mut results: RunResults,
    series: crate::results::Series,
    failed: bool,
    text: &str,
) -> anyhow::Result<RunOutcome> {
    // The series' own section, as `--json` prints it: the curve or the sweep report.
    let json = serde_json::to_value(&series)?;
    results.series = Some(series);
    export::write_run_dir(
        out_dir,
        &results,
        &[&export::ResultsJson, &export::TextReport],
    )?;
    if settings.json {
        println!("{}", serde_json::to_string_pretty(&json[mode])?);
    } else {
        print!("\n{text}");
    }
    eprintln!(
        "lockstep: {mode} results in {} (each step in {mode}/)",
        out_dir.display()
    );
    let code = if results.status == RunStatus::Aborted {
        ExitCode::from(super::interrupted_code())
    } else if failed {
        ExitCode::from(super::EXIT_OBJECTIVE)
    } else {
        ExitCode::SUCCESS
    };
    Ok(RunOutcome { results, code })
}
