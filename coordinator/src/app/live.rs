//! The live view of a run: a progress bar with cluster IOPS, MB/s, p99, the worst volume so far
//! and the current chokepoint suspect on a terminal; plain log lines otherwise (CI logs).
//!
//! It only reads the merge state; measuring never waits for it.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::analysis::chokepoint::{self, AnalysisOptions};
use crate::orchestrate::layout::{self, LayoutProgress};
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
    /// When the live finder looks again (`analysis_pause` after its last look).
    next_suspect: Instant,
    /// The chokepoint verdict line and the credit cliffs ahead (`chokepoint::live_lines`).
    suspect: Vec<String>,
    /// The suspect last printed as log lines (printed again only when it changes).
    printed_suspect: Vec<String>,
    quiet: bool,
    /// When the last layout line was printed (no terminal): at most one every `LINE_EVERY`.
    last_layout_line: Option<Instant>,
    /// The bar is showing the layout (bytes) rather than the run (seconds).
    bar_on_layout: bool,
}

/// At most one progress line this often where there is no terminal (CI logs).
const LINE_EVERY: Duration = Duration::from_secs(5);

/// How often the live chokepoint finder looks at the recent window, at most.
const SUSPECT_EVERY: Duration = Duration::from_secs(5);

/// The pause after a live analysis that took `took`: `SUSPECT_EVERY`, or long enough that the
/// finder has at most 5% of the run loop's time. It runs on the loop that merges the
/// intervals, and at 80,000 volumes copying and analyzing the window takes 0.5 s of CPU
/// (`merge_bench --agents 10000 --digits 2`; docs/scale.md, "Keepalive"): every 5 s that
/// was a fifth of a 1 s interval's 0.5 s goal. The final analysis, over the whole run, is
/// unaffected.
fn analysis_pause(took: Duration) -> Duration {
    SUSPECT_EVERY.max(took * 20)
}

impl LiveView {
    /// `total`: the run's length; `quiet`: no output at all (e.g. `--json` to a pipe).
    pub fn new(total: Duration, quiet: bool) -> Self {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let b = ProgressBar::new(total.as_secs().max(1));
            b.set_style(run_style());
            b
        });
        LiveView {
            metrics: None,
            scheduled_faults: Vec::new(),
            analysis: AnalysisOptions::default(),
            bar,
            total,
            last_line: Instant::now(),
            next_suspect: Instant::now() + SUSPECT_EVERY,
            suspect: Vec::new(),
            printed_suspect: Vec::new(),
            quiet,
            last_layout_line: None,
            bar_on_layout: false,
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

fn run_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:25} {pos}/{len}s {msg}")
        .expect("static template")
}

/// The volume with the highest p99 in its newest interval. Named once found: naming every
/// volume on every tick was 80,000 strings a second at 10,000 agents.
fn worst_volume(merger: &Merger) -> Option<(String, f64)> {
    merger
        .latest()
        .filter_map(|(s, p)| p.map(|p| (s, p.lat_p99_us)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(s, p99)| (format!("{}/{}", s.node, s.volume), p99))
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
        if Instant::now() > self.next_suspect {
            let began = Instant::now();
            let report = chokepoint::analyze(&merger.recent_timeline(), &self.analysis);
            self.suspect = crate::export::text::chokepoint::live_lines(&report, 2);
            self.next_suspect = Instant::now() + analysis_pause(began.elapsed());
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
            None if !self.quiet && self.last_line.elapsed() >= LINE_EVERY => {
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

    fn layout_progress(&mut self, p: &LayoutProgress) {
        if self.quiet {
            return;
        }
        let Some(bar) = &self.bar else {
            let due = self
                .last_layout_line
                .is_none_or(|t| t.elapsed() >= LINE_EVERY);
            if due || p.finished {
                self.last_layout_line = Some(Instant::now());
                eprintln!("lockstep: {}", layout::line(p));
            }
            return;
        };
        if p.finished {
            // Back to the run's own bar: seconds of the run, from zero.
            // Not drawn while it changes over, so no frame mixes bytes and seconds.
            bar.set_draw_target(ProgressDrawTarget::hidden());
            bar.set_message("");
            bar.reset();
            bar.set_length(self.total.as_secs().max(1));
            bar.set_style(run_style());
            bar.set_draw_target(ProgressDrawTarget::stderr());
            self.bar_on_layout = false;
            bar.println(format!("lockstep: {}", layout::line(p)));
            return;
        }
        if !self.bar_on_layout {
            self.bar_on_layout = true;
            bar.set_style(
                ProgressStyle::with_template(
                    "{spinner} laying out files {bar:25} {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {msg}",
                )
                .expect("static template"),
            );
        }
        bar.set_length(p.total);
        bar.set_position(p.done);
        bar.set_message(match &p.slowest {
            Some((name, s)) if p.agents > 1 => format!(
                "| slowest {name} {:.0}%",
                100.0 * s.done as f64 / s.total.max(1) as f64
            ),
            _ => String::new(),
        });
    }

    fn phase_finished(&mut self, _name: &str) {
        if let Some(m) = &self.metrics {
            m.state.set(2);
        }
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_live_finder_takes_at_most_a_twentieth_of_the_loop() {
        assert_eq!(analysis_pause(Duration::from_millis(3)), SUSPECT_EVERY);
        assert_eq!(analysis_pause(Duration::from_millis(250)), SUSPECT_EVERY);
        let took = Duration::from_millis(600);
        let pause = analysis_pause(took);
        assert_eq!(pause, Duration::from_secs(12));
        assert!(took.as_secs_f64() / (took + pause).as_secs_f64() <= 0.05);
    }
}
