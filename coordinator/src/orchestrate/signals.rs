//! Stopping a run from outside: SIGINT (Ctrl-C) and SIGTERM (systemd, `kill`, a CI runner's
//! timeout) are the same request, an orderly stop with partial results; only the exit code
//! says which one came (130 or 143, the shell's 128 + signal number).
//!
//! The handlers are installed once, as early as the command starts, so that a signal during
//! the start of the local agents or their layout is a stop like any other instead of the
//! default action (which would end the coordinator without results).

use std::sync::OnceLock;

use tokio::sync::watch;

/// Exit code of a run stopped by SIGINT (the shell's 128 + 2).
pub const EXIT_INTERRUPTED: u8 = 130;
/// Exit code of a run stopped by SIGTERM (128 + 15).
pub const EXIT_TERMINATED: u8 = 143;

/// Which signal asked for the stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    Interrupt,
    Terminate,
}

impl Stop {
    /// The exit code of a run stopped this way.
    pub fn exit_code(self) -> u8 {
        match self {
            Stop::Interrupt => EXIT_INTERRUPTED,
            Stop::Terminate => EXIT_TERMINATED,
        }
    }

    /// For the status reason in results and messages.
    pub fn describe(self) -> &'static str {
        match self {
            Stop::Interrupt => "Ctrl-C (SIGINT)",
            Stop::Terminate => "SIGTERM",
        }
    }
}

static STOP: OnceLock<watch::Sender<Option<Stop>>> = OnceLock::new();

/// Installs the SIGINT and SIGTERM handlers (once; later calls do nothing). Must be called
/// inside the tokio runtime. The first signal asks for an orderly stop; a second one exits at
/// once (an operator who insists is not kept waiting on agents that do not answer).
pub fn install() {
    let mut first = false;
    let tx = STOP.get_or_init(|| {
        first = true;
        watch::channel(None).0
    });
    if !first {
        return;
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| eprintln!("lockstep: cannot handle SIGTERM: {e}"))
        .ok();
    let tx = tx.clone();
    tokio::spawn(async move {
        loop {
            let term_recv = async {
                match term.as_mut() {
                    Some(t) => {
                        t.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            let stop = tokio::select! {
                r = tokio::signal::ctrl_c() => match r {
                    Ok(()) => Stop::Interrupt,
                    Err(_) => std::future::pending().await,
                },
                _ = term_recv => Stop::Terminate,
            };
            if tx.borrow().is_none() {
                tx.send_replace(Some(stop));
                continue;
            }
            // A second signal while the first stop is under way: leave now. Local agents still
            // stop (their lifeline pipe closes with this process); remote ones stop after their
            // grace period.
            eprintln!(
                "lockstep: {} again: exiting without waiting for the agents",
                stop.describe()
            );
            std::process::exit(stop.exit_code().into());
        }
    });
}

/// The stop request, to wait on: `None` until a signal came. Installs the handlers if that was
/// not done yet.
pub fn watch() -> watch::Receiver<Option<Stop>> {
    install();
    STOP.get().expect("installed above").subscribe()
}

/// The signal that stopped the run, if one did.
pub fn received() -> Option<Stop> {
    STOP.get().and_then(|tx| *tx.borrow())
}
