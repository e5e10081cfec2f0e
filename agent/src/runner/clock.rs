//! Waiting on clocks: the synchronized start (system clock) and the loop's own sleeps
//! (monotonic), all of them cut short by a stop request.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// Puts the thread back on its scheduling policy when dropped (after the first IOs went out).
pub struct RestorePolicy {
    policy: i32,
    param: libc::sched_param,
}

impl Drop for RestorePolicy {
    fn drop(&mut self) {
        // SAFETY: restoring this thread's own policy, read before it was changed.
        unsafe {
            libc::pthread_setschedparam(libc::pthread_self(), self.policy, &self.param);
        }
    }
}

/// Waits for an instant of the system clock (not the monotonic one: the coordinator's start
/// instant is expressed in wall-clock time).
///
/// Far from the instant it sleeps in 50 ms steps (to notice a stop). The last stretch is an
/// absolute `clock_nanosleep` on CLOCK_REALTIME with 1 ns timer slack, under SCHED_FIFO when the
/// agent may use it (root, CAP_SYS_NICE): a real-time thread that wakes preempts ordinary ones at
/// once, so many agents (or clones) on few cores all start within the kernel's wake-up latency
/// instead of waiting for a time slice. The policy is restored as soon as the thread wakes:
/// the IO itself runs as an ordinary thread. Without the privilege it sleeps to 300 µs before
/// the instant and spins the rest.
pub fn wait_until_realtime(at: SystemTime, stop: &AtomicBool) -> Option<RestorePolicy> {
    const SPIN: Duration = Duration::from_micros(300);
    // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0);
    }
    let sleep_until = |t: SystemTime| {
        let since = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let ts = libc::timespec {
            tv_sec: since.as_secs() as libc::time_t,
            tv_nsec: since.subsec_nanos() as libc::c_long,
        };
        // SAFETY: a valid timespec; a null remainder is allowed with TIMER_ABSTIME.
        unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_REALTIME,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        }
    };
    loop {
        let left = match at.duration_since(SystemTime::now()) {
            Ok(d) if !d.is_zero() => d,
            _ => return None,
        };
        if stop.load(Ordering::Relaxed) {
            return None;
        }
        if left > Duration::from_millis(60) {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        break;
    }
    // SAFETY: querying and setting this thread's own scheduling policy.
    let (policy, param) = unsafe {
        let mut param: libc::sched_param = std::mem::zeroed();
        let mut policy = 0;
        libc::pthread_getschedparam(libc::pthread_self(), &mut policy, &mut param);
        (policy, param)
    };
    let fifo = libc::sched_param { sched_priority: 1 };
    // SAFETY: as above; fails harmlessly without the privilege.
    let realtime =
        unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &fifo) } == 0;
    if realtime {
        while sleep_until(at) == libc::EINTR {}
        return Some(RestorePolicy { policy, param });
    }
    if let Some(wake) = at.checked_sub(SPIN) {
        while SystemTime::now() < wake && sleep_until(wake) == libc::EINTR {}
    }
    while SystemTime::now() < at && !stop.load(Ordering::Relaxed) {
        std::hint::spin_loop();
    }
    None
}

pub(super) fn sleep_unless_stopped(d: Duration, stop: &AtomicBool) {
    sleep_until_unless_stopped(Instant::now() + d, stop)
}

/// Sleeps until `t` in slices short enough to notice a stop request within 50 ms; the last
/// stretch spins briefly so that open-loop issue times are kept to microseconds.
pub(super) fn sleep_until_unless_stopped(t: Instant, stop: &AtomicBool) {
    loop {
        let now = Instant::now();
        if now >= t || stop.load(Ordering::Relaxed) {
            return;
        }
        let left = t - now;
        if left > Duration::from_micros(200) {
            std::thread::sleep((left - Duration::from_micros(100)).min(Duration::from_millis(50)));
        } else {
            std::hint::spin_loop();
        }
    }
}
