//! `lockstep compare RUN_A RUN_B [...]`: what changed between runs (gp3 against io2, 2 workers
//! against 3), per role, node and volume, with the change and whether it is beyond the runs' own
//! interval-to-interval noise (analysis/compare.rs). The first run is the baseline; each other
//! run is compared with it. Text on stdout, `--html FILE` for the page, and
//! `--fail-on-regression PCT` exits 1 on a regression beyond the noise and PCT, for CI.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};

use crate::analysis::compare::{self, EntityComparison, RunFigures};
use crate::export;
use crate::export::html::chart::Chart;
use crate::export::html::page::{self, Cell};
use crate::export::html::series::{self, Line};
use crate::results::RunResults;

/// One run directory, read back.
pub struct Run {
    pub dir: PathBuf,
    pub results: RunResults,
    pub figures: RunFigures,
}

/// Reads results.json, timeline.json and the interval histograms (data/) of a run directory.
pub fn load(dir: &Path) -> anyhow::Result<Run> {
    let mut results = export::read_run_dir(dir).map_err(anyhow::Error::msg)?;
    export::read_timeline(dir, &mut results).map_err(anyhow::Error::msg)?;
    let entries = crate::results::store::read_entries(dir)
        .map_err(anyhow::Error::msg)
        .with_context(|| {
            format!(
                "{}: compare needs the raw interval histograms",
                dir.display()
            )
        })?;
    let figures = compare::run_figures(&results, &entries);
    Ok(Run {
        dir: dir.to_path_buf(),
        results,
        figures,
    })
}

pub fn compare_command(
    dirs: &[PathBuf],
    html: Option<&Path>,
    fail_on_regression: Option<f64>,
) -> anyhow::Result<ExitCode> {
    if dirs.len() < 2 {
        bail!("compare needs at least two run directories (the first is the baseline)");
    }
    let mut runs = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        eprintln!(
            "lockstep: compare: reading run {}/{}: {}",
            i + 1,
            dirs.len(),
            d.display()
        );
        runs.push(load(d)?);
    }
    let base = &runs[0];
    let comparisons: Vec<Vec<EntityComparison>> = runs[1..]
        .iter()
        .map(|r| compare::compare(&base.figures, &r.figures))
        .collect();
    for (r, c) in runs[1..].iter().zip(&comparisons) {
        print!("{}", text(base, r, c));
    }
    if let Some(file) = html {
        let page = html_page(&runs, &comparisons);
        export::write_atomically(file, page.as_bytes())
            .with_context(|| format!("writing {}", file.display()))?;
        eprintln!("lockstep: compare: wrote {}", file.display());
    }
    if let Some(pct) = fail_on_regression {
        let found: Vec<String> = comparisons
            .iter()
            .flat_map(|c| compare::regressions(c, pct))
            .collect();
        if !found.is_empty() {
            println!("regressions beyond the noise and {pct}%:");
            for f in &found {
                println!("  {f}");
            }
            return Ok(ExitCode::from(super::EXIT_OBJECTIVE));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A, B, C, ...: the baseline is A.
fn run_letter(i: usize) -> char {
    (b'A' + (i % 26) as u8) as char
}

fn label(r: &Run) -> String {
    format!("{} ({})", r.results.run_id, r.dir.display())
}

fn fmt(metric: compare::Metric, v: f64) -> String {
    match metric {
        compare::Metric::Iops => format!("{v:.0}"),
        compare::Metric::MBps => format!("{v:.1}"),
        _ => page::lat_us(v),
    }
}

fn verdict(ch: &compare::Change) -> &'static str {
    if ch.regression {
        "REGRESSION"
    } else if ch.beyond_noise {
        "better"
    } else {
        "within noise"
    }
}

/// The text comparison of run B with the baseline A.
pub fn text(a: &Run, b: &Run, c: &[EntityComparison]) -> String {
    let mut s = format!(
        "compare A = {}\n     with B = {}\n(noise: {} standard errors of the per-interval figures)\n\n{:<8} {:<24} {:<6} {:>12} {:>12} {:>9} {:>9}  verdict\n",
        label(a),
        label(b),
        compare::NOISE_SIGMAS,
        "scope",
        "name",
        "metric",
        "A",
        "B",
        "change",
        "noise"
    );
    for e in c {
        if let Some(side) = e.only_in {
            s.push_str(&format!(
                "{:<8} {:<24} only in run {side}\n",
                e.scope.as_str(),
                e.name
            ));
            continue;
        }
        for ch in &e.changes {
            s.push_str(&format!(
                "{:<8} {:<24} {:<6} {:>12} {:>12} {:>+8.1}% {:>8.1}%  {}\n",
                e.scope.as_str(),
                e.name,
                ch.metric.as_str(),
                fmt(ch.metric, ch.a),
                fmt(ch.metric, ch.b),
                ch.change_pct,
                ch.noise_pct,
                verdict(ch)
            ));
        }
    }
    s.push('\n');
    s
}

/// The compare page: the runs' cluster timelines over each other, then one sortable table per
/// compared run.
pub fn html_page(runs: &[Run], comparisons: &[Vec<EntityComparison>]) -> String {
    let mut body = String::from("<h1>lockstep compare</h1>\n<ul>");
    for (i, r) in runs.iter().enumerate() {
        body.push_str(&format!(
            "<li>{}{} {}: {}</li>",
            run_letter(i),
            if i == 0 { " (baseline)" } else { "" },
            page::esc_str(&r.results.run_id),
            page::esc_str(&r.dir.display().to_string())
        ));
    }
    body.push_str("</ul>\n");
    // "A quickstart-1", "B quickstart-2": runs written with --output may share a directory name.
    let names: Vec<String> = runs
        .iter()
        .enumerate()
        .map(|(i, r)| format!("{} {}", run_letter(i), r.results.run_id))
        .collect();
    let line = |i: usize, f: fn(&crate::results::ClusterPoint) -> f64| {
        let pts: Vec<(f64, f64)> = runs[i]
            .results
            .cluster_timeline
            .iter()
            .map(|p| (p.t_ms as f64 / 1000.0, f(p)))
            .collect();
        Line::new(names[i].clone(), series::downsample_max(&pts, 900))
    };
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let iops = Chart::new(
        "seconds since the start",
        "cluster IOPS",
        (0..runs.len()).map(|i| line(i, |p| p.iops)).collect(),
    );
    body.push_str(&page::figure(
        "chart-compare-iops",
        &names,
        &iops.svg(),
        "Cluster IOPS of each run.",
    ));
    let p99 = Chart {
        log_y: true,
        ..Chart::new(
            "seconds since the start",
            "cluster p99 (ms, log)",
            (0..runs.len())
                .map(|i| line(i, |p| p.lat_p99_us / 1000.0))
                .collect(),
        )
    };
    body.push_str(&page::figure(
        "chart-compare-p99",
        &names,
        &p99.svg(),
        "Cluster p99 of each run, from its merged interval histograms.",
    ));
    for (i, (r, c)) in runs[1..].iter().zip(comparisons).enumerate() {
        body.push_str(&format!(
            "<h2>{} {} against A {}</h2>\n",
            run_letter(i + 1),
            page::esc_str(&r.results.run_id),
            page::esc_str(&runs[0].results.run_id)
        ));
        let rows = c
            .iter()
            .flat_map(|e| {
                if let Some(side) = e.only_in {
                    return vec![vec![
                        Cell::text(e.scope.as_str()),
                        Cell::text(&e.name),
                        Cell::text(format!("only in run {side}")),
                    ]];
                }
                e.changes
                    .iter()
                    .map(|ch| {
                        let class = if ch.regression {
                            "fail"
                        } else if ch.beyond_noise {
                            "ok"
                        } else {
                            ""
                        };
                        vec![
                            Cell::text(e.scope.as_str()),
                            Cell::text(&e.name),
                            Cell::text(ch.metric.as_str()),
                            Cell::num(fmt(ch.metric, ch.a), ch.a),
                            Cell::num(fmt(ch.metric, ch.b), ch.b),
                            Cell::num(format!("{:+.1}%", ch.change_pct), ch.change_pct),
                            Cell::num(format!("±{:.1}%", ch.noise_pct), ch.noise_pct),
                            Cell::html(format!("<span class=\"{class}\">{}</span>", verdict(ch))),
                        ]
                    })
                    .collect()
            })
            .collect();
        body.push_str(&page::table(
            &format!("compare-table-{}", i + 1),
            &[
                "scope", "name", "metric", "A", "B", "change", "noise", "verdict",
            ],
            rows,
        ));
    }
    page::document("lockstep compare", &body)
}
