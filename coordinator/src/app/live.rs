//! The live view of a run: a progress bar with cluster IOPS, MB/s, p99, the worst volume so far
//! and the current chokepoint suspect on a terminal; plain log lines otherwise (CI logs).
//!
//! It only reads the merge state; measuring never waits for it.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::analysis::chokepoint::{self, AnalysisOptions};
use crate::orchestrate::run::RunObserver;
use crate::results::merge::Merger;

pub struct LiveView {
    /// Prometheus metrics to keep current, when the coordinator serves them.
    pub metrics: Option<std::sync::Arc<crate::export::metrics::CoordinatorMetrics>>,
    /// The plan's fault windows (ms since the synchronized start), for the metrics: the agents
    /// report a volume's IO-path faults only with their final result.
    pub scheduled_faults: Vec<crate::results::timeline::FaultWindow>,
    /// Options of the live chokepoint finder (time scales of emulated volumes).
    pub analysis: AnalysisOptions,
    bar: Option<ProgressBar>,
    total: Duration,
    last_line: Instant,
    last_suspect: Instant,
    /// The chokepoint verdict line and the credit cliffs ahead (`chokepoint::live_lines`).
    suspect: Vec<String>,
    /// The suspect last printed as log lines (printed again only when it changes).
    printed_suspect: Vec<String>,
    quiet: bool,
}

impl LiveView {
    /// `total`: the run's length; `quiet`: no output at all (e.g. `--json` to a pipe).
    pub fn new(total: Duration, quiet: bool) -> Self {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let b = ProgressBar::new(total.as_secs().max(1));
            b.set_style(
                ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {bar:25} {pos}/{len}s {msg}",
                )
                .expect("static template"),
            );
            b
        });
        LiveView {
            metrics: None,
            scheduled_faults: Vec::new(),
            analysis: AnalysisOptions::default(),
            bar,
            total,
            last_line: Instant::now(),
            last_suspect: Instant::now(),
            suspect: Vec::new(),
            printed_suspect: Vec::new(),
            quiet,
        }
    }

    fn say(&self, text: &str) {
        if self.quiet {
            return;
        }
        match &self.bar {
            Some(b) => b.println(text),
            None => eprintln!("{text}"),
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

fn worst_volume(merger: &Merger) -> Option<(String, f64)> {
    merger
        .latest()
        .filter_map(|(s, p)| p.map(|p| (format!("{}/{}", s.node, s.volume), p.lat_p99_us)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

impl RunObserver for LiveView {
    fn message(&mut self, text: &str) {
        self.say(&format!("lockstep: {text}"));
    }

    fn phase_started(&mut self, name: &str, duration: Duration, _measured: bool) {
        self.say(&format!(
            "lockstep: {name}: started, {:.0} s",
            duration.as_secs_f64()
        ));
    }

    fn tick(&mut self, merger: &Merger, elapsed: Duration) {
        if let Some(m) = &self.metrics {
            m.update(merger);
            m.set_faults_at(&self.scheduled_faults, elapsed.as_millis() as u64);
        }
        // The newest interval may still be arriving; show the one before it.
        let Some(latest) = merger.latest_index() else {
            return;
        };
        let Some(c) = merger.cluster_point(latest.saturating_sub(1)) else {
            return;
        };
        if self.last_suspect.elapsed() > Duration::from_secs(5) {
            self.last_suspect = Instant::now();
            let report = chokepoint::analyze(&merger.recent_timeline(), &self.analysis);
            self.suspect = crate::export::text::chokepoint::live_lines(&report, 2);
        }
        let worst = worst_volume(merger)
            .map(|(v, p99)| format!(" | worst {v} p99 {:.2} ms", p99 / 1000.0))
            .unwrap_or_default();
        let msg = format!(
            "{:.0} IOPS {:.1} MiB/s p99 {:.2} ms{worst}",
            c.iops,
            c.bytes_per_sec / 1048576.0,
            c.lat_p99_us / 1000.0
        );
        match &self.bar {
            Some(b) => {
                b.set_position(elapsed.as_secs().min(self.total.as_secs()));
                let suspect: String = self.suspect.iter().map(|l| format!("\n  {l}")).collect();
                b.set_message(format!("{msg}{suspect}"));
            }
            None if !self.quiet && self.last_line.elapsed() >= Duration::from_secs(5) => {
                self.last_line = Instant::now();
                eprintln!("lockstep: t={:.0}s {msg}", elapsed.as_secs_f64());
                if !self.suspect.is_empty() && self.suspect != self.printed_suspect {
                    for line in &self.suspect {
                        eprintln!("lockstep:   {line}");
                    }
                    self.printed_suspect = self.suspect.clone();
                }
            }
            None => {}
        }
    }

    fn phase_finished(&mut self, _name: &str) {
        if let Some(m) = &self.metrics {
            m.state.set(2);
        }
        self.finish();
    }
}
