//! `lockstep-agent run JOBFILE`: one machine, like `fio JOBFILE`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::jobfile;
use crate::progress::{self, LayoutBar};
use crate::report::{RunReport, fio_json, normal};
use crate::runner::{self, RunOptions};
pub use lockstep_core::atomic_file::write_atomically;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    Normal,
    Json,
}

impl std::str::FromStr for OutputFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "normal" => Ok(OutputFormat::Normal),
            "json" => Ok(OutputFormat::Json),
            other => Err(format!(
                "unknown output format '{other}': use normal or json"
            )),
        }
    }
}

pub struct StandaloneArgs {
    pub jobfile: PathBuf,
    pub format: OutputFormat,
    pub output: Option<PathBuf>,
    pub overrides: Vec<(String, String)>,
    pub allow_block_devices: bool,
    pub keep_files: bool,
}

/// Outcome of a standalone run: the rendered report was written; `failed` says whether any job
/// ended with an error (the binary then exits non-zero).
pub struct Outcome {
    pub failed: bool,
    pub interrupted: bool,
}

/// Parses, runs and reports. Errors before any IO are returned; errors during the run are in
/// the report, which is written in full either way.
pub fn run(args: &StandaloneArgs) -> anyhow::Result<Outcome> {
    let jobs = jobfile::parse_file(&args.jobfile, &args.overrides)?;
    if let Some(path) = &args.output {
        check_output_path(path).map_err(anyhow::Error::msg)?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let visible = progress::on_terminal();
    let opts = RunOptions {
        allow_block_devices: args.allow_block_devices,
        keep_files: args.keep_files,
        stop: stop.clone(),
        layout_progress: Box::new(progress::Stoppable {
            inner: LayoutBar::new(visible),
            stop: stop.clone(),
        }),
        ..RunOptions::default()
    };
    let done = Arc::new(AtomicBool::new(false));
    let expected = jobs
        .iter()
        .map(|j| j.runtime.unwrap_or_default() + j.ramp_time + j.startdelay)
        .max()
        .filter(|d| !d.is_zero());
    let live_line =
        visible.then(|| progress::spawn_live_line(opts.live.clone(), done.clone(), expected));
    let result = runner::run_jobs(&jobs, &opts);
    done.store(true, Ordering::Relaxed);
    if let Some(h) = live_line {
        let _ = h.join();
    }
    let report = match result {
        // Stopped while laying out: nothing ran, so there is no report; what was laid out is
        // already removed. Exits as an interrupted run.
        Err(runner::RunError::Layout(crate::layout::LayoutError::Stopped { .. })) => {
            eprintln!(
                "lockstep-agent: stopped during the layout: nothing ran, the files it laid out are removed"
            );
            return Ok(Outcome {
                failed: false,
                interrupted: true,
            });
        }
        r => r?,
    };
    let text = render(&report, args.format);
    let mut output_failed = None;
    match &args.output {
        Some(path) => {
            if let Err(e) = write_atomically(path, text.as_bytes()) {
                // The measurements must not be lost with the file: they go to stdout instead.
                std::io::stdout().write_all(text.as_bytes())?;
                output_failed = Some(format!(
                    "writing the report to {}: {e}{} (the report went to stdout instead)",
                    path.display(),
                    crate::layout::io_hint(&e)
                ));
            }
        }
        None => std::io::stdout().write_all(text.as_bytes())?,
    }
    let failed = report.jobs.iter().any(|j| j.error.is_some());
    for j in report
        .jobs
        .iter()
        .filter_map(|j| j.error.as_ref().map(|e| (j, e)))
    {
        eprintln!(
            "lockstep-agent: job '{}' (clone {}): {}",
            j.0.spec.name, j.0.clone, j.1
        );
    }
    if report.jobs.iter().any(|j| !j.abandoned.is_empty()) {
        // The kernel keeps a thread that has IOs in flight until they end, and a process until
        // its threads end: on a device that never answers (a hard NFS mount, a stopped FUSE
        // server, a frozen volume) not even SIGKILL finishes the exit.
        eprintln!(
            "lockstep-agent: the results are complete; the IOs given up on are still held by the \
             kernel, so this process may not exit until the device answers. It does no more work."
        );
    }
    if let Some(problem) = output_failed {
        anyhow::bail!(problem);
    }
    Ok(Outcome {
        failed,
        interrupted: stop.load(Ordering::Relaxed),
    })
}

/// Checks an output path before any IO, so a typo does not cost a whole run: the directory must
/// exist and be writable, and an existing path must be something a report can go to. A regular
/// file is replaced atomically; a character device or FIFO (`/dev/stdout`, a pipe) is written
/// into as fio does; anything else (a directory, a block device) is refused, never replaced.
pub fn check_output_path(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt;
    let named = |why: &str| format!("--output {}: {why}", path.display());
    match std::fs::metadata(path) {
        Ok(m) if m.file_type().is_char_device() || m.file_type().is_fifo() => return Ok(()),
        Ok(m) if m.is_dir() => return Err(named("is a directory; name a file")),
        Ok(m) if !m.is_file() => {
            return Err(named("is not a regular file; lockstep never replaces it"));
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(named(&e.to_string())),
    }
    let dir = parent_dir(path);
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(named(&format!("{} is not a directory", dir.display()))),
        Err(e) => {
            return Err(named(&format!(
                "directory {}: {e}; create it first",
                dir.display()
            )));
        }
    }
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| named("contains a NUL byte"))?;
    // SAFETY: access(2) with a NUL-terminated path.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(named(&format!(
            "cannot write in {}: {e}{}",
            dir.display(),
            crate::layout::io_hint(&e)
        )));
    }
    Ok(())
}

fn parent_dir(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

pub fn render(report: &RunReport, format: OutputFormat) -> String {
    match format {
        OutputFormat::Normal => normal::render(report),
        OutputFormat::Json => fio_json::to_string(report),
    }
}
