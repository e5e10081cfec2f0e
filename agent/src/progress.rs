//! Progress display: a bar on a terminal, nothing (or plain log lines) otherwise.
//!
//! The measuring code never prints; it updates counters, and this module draws them.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::layout::LayoutProgress;
use crate::runner::LiveCounters;

/// Whether progress goes to an interactive terminal.
pub fn on_terminal() -> bool {
    std::io::stderr().is_terminal()
}

/// Layout progress: a byte bar on a terminal, hidden otherwise.
pub struct LayoutBar {
    bar: ProgressBar,
}

impl LayoutBar {
    pub fn new(visible: bool) -> Self {
        let bar = if visible {
            ProgressBar::new(0)
        } else {
            ProgressBar::hidden()
        };
        bar.set_style(
            ProgressStyle::with_template(
                "laying out files {bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .expect("static template"),
        );
        LayoutBar { bar }
    }
}

impl LayoutProgress for LayoutBar {
    fn start(&self, total_bytes: u64) {
        self.bar.set_length(total_bytes);
    }
    fn advance(&self, bytes: u64) {
        self.bar.inc(bytes);
    }
    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// Bytes a layout has written and will write in all, for whoever asks from another thread (the
/// agent daemon's `LayoutStatus`, answered while Prepare is still laying out).
#[derive(Debug, Default)]
pub struct LayoutCount {
    pub done: AtomicU64,
    /// Set before the layout starts (`runner::layout_bytes`), so it does not grow as volume
    /// after volume starts its own layout.
    pub total: AtomicU64,
    pub finished: AtomicBool,
}

impl LayoutCount {
    /// (done, total, finished); the total is never below what was done.
    pub fn snapshot(&self) -> (u64, u64, bool) {
        let finished = self.finished.load(Ordering::Acquire);
        let done = self.done.load(Ordering::Relaxed);
        (done, self.total.load(Ordering::Relaxed).max(done), finished)
    }
}

impl LayoutProgress for Arc<LayoutCount> {
    fn start(&self, _total_bytes: u64) {}
    fn advance(&self, bytes: u64) {
        self.done.fetch_add(bytes, Ordering::Relaxed);
    }
    fn finish(&self) {}
}

/// Layout progress that also says when to stop: `stop` is the run's stop flag (Ctrl-C,
/// SIGTERM, an abort from the coordinator), so a layout of gigabytes ends within a chunk of
/// the request instead of after the last byte.
pub struct Stoppable<P> {
    pub inner: P,
    pub stop: Arc<AtomicBool>,
}

impl<P: LayoutProgress> LayoutProgress for Stoppable<P> {
    fn start(&self, total_bytes: u64) {
        self.inner.start(total_bytes)
    }
    fn advance(&self, bytes: u64) {
        self.inner.advance(bytes)
    }
    fn finish(&self) {
        self.inner.finish()
    }
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// Draws a fio-like status line once a second until `done` is set: running jobs, IOPS and
/// bandwidth per direction over the last second, elapsed time.
pub fn spawn_live_line(
    live: Arc<LiveCounters>,
    done: Arc<AtomicBool>,
    expected: Option<Duration>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let bar = ProgressBar::new_spinner();
        bar.set_style(ProgressStyle::with_template("{spinner} {msg}").expect("static template"));
        let start = Instant::now();
        let mut last = [0u64; 4];
        let mut last_t = Instant::now();
        while !done.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(250));
            let now = Instant::now();
            if now - last_t < Duration::from_secs(1) {
                bar.tick();
                continue;
            }
            let cur = [
                live.ios[0].load(Ordering::Relaxed),
                live.ios[1].load(Ordering::Relaxed),
                live.bytes[0].load(Ordering::Relaxed),
                live.bytes[1].load(Ordering::Relaxed),
            ];
            let dt = (now - last_t).as_secs_f64();
            let rate = |i: usize| (cur[i] - last[i]) as f64 / dt;
            let eta = expected
                .map(|e| {
                    format!(
                        " eta {:>4.0}s",
                        e.saturating_sub(start.elapsed()).as_secs_f64()
                    )
                })
                .unwrap_or_default();
            bar.set_message(format!(
                "Jobs: {} [r={:.1}MiB/s,w={:.1}MiB/s][r={:.0},w={:.0} IOPS] elapsed {:.0}s{eta}",
                live.running.load(Ordering::Relaxed),
                rate(2) / 1048576.0,
                rate(3) / 1048576.0,
                rate(0),
                rate(1),
                start.elapsed().as_secs_f64(),
            ));
            last = cur;
            last_t = now;
        }
        bar.finish_and_clear();
    })
}
