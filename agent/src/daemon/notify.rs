//! Telling a service manager (systemd `Type=notify`) that the agent is ready and still alive.
//!
//! Both are no-ops unless systemd (or anything speaking its protocol) set `NOTIFY_SOCKET`, so
//! the agent behaves the same by hand, in a container or under a unit. Readiness is sent once
//! the gRPC port is bound: a unit ordered `After=lockstep-agent.service` can connect at once.
//! The watchdog ping comes from a task on the same runtime that serves the coordinator, so a
//! runtime that stops making progress (a deadlock, a starved executor) stops the pings and
//! systemd restarts the agent after `WatchdogSec=`.

use std::time::Duration;

use sd_notify::NotifyState;

/// `READY=1` with a status line (shown by `systemctl status`). Errors are logged, not fatal:
/// a broken notify socket must not stop an agent that is otherwise serving.
pub fn ready(status: &str) {
    if let Err(e) = sd_notify::notify(&[NotifyState::Ready, NotifyState::Status(status)]) {
        tracing::warn!("cannot notify the service manager of readiness: {e}");
    }
}

/// `STOPPING=1`, when a shutdown signal arrived.
pub fn stopping() {
    let _ = sd_notify::notify(&[NotifyState::Stopping]);
}

/// How often to ping, when the service manager asked for a watchdog (`WATCHDOG_USEC` for this
/// process): half the timeout, as sd_watchdog_enabled(3) recommends.
pub fn watchdog_interval() -> Option<Duration> {
    sd_notify::watchdog_enabled()
        .filter(|d| !d.is_zero())
        .map(|d| d / 2)
}

/// Pings `WATCHDOG=1` every `every` until the runtime stops.
pub async fn watchdog(every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = sd_notify::notify(&[NotifyState::Watchdog]) {
            tracing::warn!("cannot ping the service manager's watchdog: {e}");
        }
    }
}
