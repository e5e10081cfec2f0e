//! Agent-wide faults: `kill`, `pause`, `cut_off` and `exec`.
//!
//! They act on the agent itself rather than on one volume's IOs, so a plan that aims one at two
//! volumes of an agent means one fault: they are collected once per agent (`collect`) and each
//! runs on a thread of its own, timed from the run's start instant. What actually happened
//! (start, end, an exec's exit status) is sent to the coordinator as it happens, because after
//! a kill there is no final result to carry it, and recorded for the final result otherwise.
//!
//! The agent does them to itself, so they need no privilege and work wherever the agent runs:
//! - kill: SIGKILL to its own process (`_exit` when it is PID 1 of a container, whose own
//!   SIGKILL the kernel ignores): nothing flushed, no final result;
//! - pause: a forked helper sleeps for the window and sends SIGCONT, then the agent sends
//!   itself SIGSTOP: every thread stops, as with `docker pause` or a frozen VM;
//! - cut_off: the event streams break and every call is refused (`CutOff`), IO goes on;
//! - exec: `sh -c` with the run's names in the environment, only with `--allow-exec`.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use lockstep_proto::v1::{FaultEvent, RunEvent, run_event};

use super::EventHub;
use super::aggregate::unix_ns;
use crate::fault::{ExecSpec, FaultKind, FaultSpec};

/// One agent-wide fault of the run and the volumes it is reported on (every volume of the run:
/// the whole agent is hit).
#[derive(Debug, Clone, PartialEq)]
pub struct AgentFault {
    pub spec: FaultSpec,
}

/// The agent-wide faults among the volumes' schedules, each once: the same fault aimed at
/// several volumes of this agent is one fault.
pub fn collect<'a>(schedules: impl IntoIterator<Item = &'a [FaultSpec]>) -> Vec<AgentFault> {
    let mut out: Vec<AgentFault> = Vec::new();
    for specs in schedules {
        for s in specs.iter().filter(|s| s.kind.is_agent_wide()) {
            if !out.iter().any(|f| &f.spec == s) {
                out.push(AgentFault { spec: s.clone() });
            }
        }
    }
    out
}

/// Why this agent cannot do an agent-wide fault, checked when the run is prepared so a plan
/// that cannot work is refused before any IO.
pub fn check(spec: &FaultSpec, allow_exec: bool) -> Result<(), String> {
    let pid1 = std::process::id() == 1;
    match &spec.kind {
        FaultKind::Exec(_) if !allow_exec => Err(
            "exec: this agent was not started with --allow-exec (commands run on an agent's host only when its operator allows it)".into(),
        ),
        FaultKind::Pause(_) if pid1 => Err(
            "pause: the agent is PID 1 of its container, which cannot stop itself (the kernel ignores its own SIGSTOP); run it under an init (docker run --init, tini) or pause the container from outside".into(),
        ),
        _ => Ok(()),
    }
}

/// The agent being cut off from its coordinators: while `until` is in the future every call is
/// refused with UNAVAILABLE (the service's interceptor asks `refusal`).
#[derive(Debug, Default)]
pub struct CutOff {
    until: Mutex<Option<Instant>>,
}

impl CutOff {
    pub fn refusal(&self) -> Option<String> {
        let until = (*self.until.lock().unwrap())?;
        let left = until.checked_duration_since(Instant::now())?;
        Some(format!(
            "agent cut off from its coordinators by a cut_off fault for {:.1}s more",
            left.as_secs_f64()
        ))
    }

    fn set(&self, until: Option<Instant>) {
        *self.until.lock().unwrap() = until;
    }
}

/// What the fault threads need from the run.
#[derive(Clone)]
pub struct Context {
    pub hub: Arc<EventHub>,
    pub cut_off: Arc<CutOff>,
    pub run_id: String,
    pub agent: String,
    /// The run's volumes: (name, path), for events and the exec environment.
    pub volumes: Vec<(String, String)>,
    /// Set when the run's IO is over: faults not yet begun are skipped, an open window closes.
    pub done: Arc<AtomicBool>,
}

/// Runs one agent-wide fault from `origin` (the run's start instant on the monotonic clock) and
/// returns its events, one per volume, as they happened.
pub fn run(fault: AgentFault, origin: Instant, ctx: Context) -> Vec<FaultEvent> {
    let spec = &fault.spec;
    let at = origin + Duration::from_millis(spec.at_ms);
    let end = spec.duration_ms.map(|d| at + Duration::from_millis(d));
    if !sleep_until(at, &ctx.done) {
        return Vec::new();
    }
    let name = spec.name();
    let started = SystemTime::now();
    let events = |start: SystemTime, end: Option<SystemTime>, detail: &str| {
        ctx.volumes
            .iter()
            .map(|(v, _)| FaultEvent {
                volume: v.clone(),
                fault: name.to_string(),
                start_agent_ns: unix_ns(start),
                end_agent_ns: end.map_or(0, unix_ns),
                detail: detail.to_string(),
            })
            .collect::<Vec<_>>()
    };
    let publish = |evs: &[FaultEvent]| {
        for e in evs {
            ctx.hub.publish(RunEvent {
                seq: 0,
                event: Some(run_event::Event::Fault(e.clone())),
            });
        }
    };
    match &spec.kind {
        FaultKind::Kill(_) => {
            tracing::warn!("kill fault: the agent kills itself now");
            publish(&events(started, None, "agent killed (SIGKILL)"));
            // Let the event reach the coordinator: it is the only record of the kill.
            std::thread::sleep(Duration::from_millis(200));
            kill_self();
            Vec::new()
        }
        FaultKind::Pause(_) => {
            let d = end.map_or(Duration::ZERO, |e| {
                e.saturating_duration_since(Instant::now())
            });
            tracing::warn!(
                "pause fault: stopping the agent for {:.1}s",
                d.as_secs_f64()
            );
            publish(&events(started, None, ""));
            // Give the start event a moment to leave before every thread stops.
            std::thread::sleep(Duration::from_millis(20));
            let detail = match pause_self(d.saturating_sub(Duration::from_millis(20))) {
                Ok(()) => String::new(),
                Err(e) => format!("could not pause: {e}"),
            };
            let evs = events(started, Some(SystemTime::now()), &detail);
            publish(&evs);
            evs
        }
        FaultKind::CutOff(_) => {
            tracing::info!("cut_off fault: refusing coordinators");
            publish(&events(started, None, ""));
            std::thread::sleep(Duration::from_millis(20));
            ctx.cut_off.set(end);
            ctx.hub
                .cut("the agent was cut off from its coordinators (cut_off fault)");
            if let Some(end) = end {
                sleep_until(end, &ctx.done);
            }
            ctx.cut_off.set(None);
            tracing::info!("cut_off fault over: coordinators may re-attach");
            let evs = events(started, Some(SystemTime::now()), "");
            // Kept for the coordinator's re-attach.
            publish(&evs);
            evs
        }
        FaultKind::Exec(e) => {
            publish(&events(started, None, &format!("running `{}`", e.start)));
            let first = exec(e, &e.start, "start", &ctx);
            let mut detail = format!("start `{}`: {first}", e.start);
            let mut ended = None;
            if let (Some(cmd), Some(end)) = (&e.end, end) {
                // Run the end command even when the run ended first: it usually undoes the
                // start (restarts what the start stopped).
                sleep_until(end, &ctx.done);
                ended = Some(SystemTime::now());
                let second = exec(e, cmd, "end", &ctx);
                detail.push_str(&format!("; end `{cmd}`: {second}"));
            } else if let Some(end) = end {
                sleep_until(end, &ctx.done);
                ended = Some(SystemTime::now());
            }
            tracing::info!("exec fault: {detail}");
            let evs = events(started, ended, &detail);
            publish(&evs);
            evs
        }
        _ => Vec::new(),
    }
}

/// Sleeps until `t`; false if the run ended first.
fn sleep_until(t: Instant, done: &AtomicBool) -> bool {
    loop {
        if done.load(Ordering::Relaxed) {
            return false;
        }
        let left = t.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        std::thread::sleep(left.min(Duration::from_millis(20)));
    }
}

fn kill_self() {
    if std::process::id() == 1 {
        // PID 1 of a namespace cannot SIGKILL itself; exiting without any cleanup is the same
        // crash as far as anyone outside can tell.
        // SAFETY: _exit ends the process at once; nothing of ours runs after it.
        unsafe { libc::_exit(137) };
    }
    // SAFETY: sends a signal to our own process.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
}

/// Stops this whole process for `d`: a forked helper (which only sleeps and signals, both
/// async-signal-safe, as a child of a threaded process must) sends SIGCONT after `d`, a few
/// times so that one sent before our SIGSTOP landed cannot leave the agent stopped for good.
fn pause_self(d: Duration) -> std::io::Result<()> {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let sleep = |d: Duration| {
        let mut ts = libc::timespec {
            tv_sec: d.as_secs() as libc::time_t,
            tv_nsec: d.subsec_nanos() as libc::c_long,
        };
        let mut rem = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: both pointers are to live timespecs; nanosleep is async-signal-safe.
        while unsafe { libc::nanosleep(&ts, &mut rem) } == -1 {
            ts = rem;
        }
    };
    // SAFETY: the child only calls nanosleep, kill and _exit (async-signal-safe).
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if child == 0 {
        sleep(d);
        for _ in 0..5 {
            // SAFETY: signals the parent; async-signal-safe.
            unsafe { libc::kill(pid, libc::SIGCONT) };
            sleep(Duration::from_millis(100));
        }
        // SAFETY: ends the child without running the parent's atexit handlers or destructors.
        unsafe { libc::_exit(0) };
    }
    // SAFETY: signals our own process; every thread stops until SIGCONT.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    // Reap the helper once it has sent its last SIGCONT, without holding up the caller.
    std::thread::spawn(move || {
        let mut status = 0;
        // SAFETY: waits for our own child.
        unsafe { libc::waitpid(child, &mut status, 0) };
    });
    Ok(())
}

/// Longest output kept from a command, for the report.
const EXEC_OUTPUT_LIMIT: usize = 2048;

/// Runs `cmd` with `sh -c` and says how it went: `exit 0`, `exit 3: <output>`, `killed after
/// its 60 s timeout`, `could not start: ...`.
fn exec(spec: &ExecSpec, cmd: &str, edge: &str, ctx: &Context) -> String {
    let timeout = Duration::from_millis(spec.timeout_ms.unwrap_or(60_000));
    let volumes = ctx
        .volumes
        .iter()
        .map(|(n, p)| format!("{n}={p}"))
        .collect::<Vec<_>>()
        .join(",");
    use std::os::unix::process::CommandExt;
    let child = Command::new("sh")
        // Its own process group, so a timeout kills what it started too (and their hold on
        // the output pipes).
        .process_group(0)
        .arg("-c")
        .arg(cmd)
        .env("LOCKSTEP_RUN_ID", &ctx.run_id)
        .env("LOCKSTEP_AGENT", &ctx.agent)
        .env("LOCKSTEP_FAULT_EDGE", edge)
        .env("LOCKSTEP_VOLUMES", volumes)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return format!("could not start: {e}"),
    };
    let readers: Vec<_> = [
        child
            .stdout
            .take()
            .map(|o| Box::new(o) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|e| Box::new(e) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    .map(|mut r| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    })
    .collect();
    let t0 = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if t0.elapsed() > timeout => {
                // SAFETY: signals the command's own process group (its pid, made a group above).
                unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return format!("lost track of it: {e}"),
        }
    };
    let mut output = Vec::new();
    for r in readers {
        output.extend(r.join().unwrap_or_default());
    }
    let text = String::from_utf8_lossy(&output);
    let text = text.trim();
    let text = if text.len() > EXEC_OUTPUT_LIMIT {
        let mut cut = text.len() - EXEC_OUTPUT_LIMIT;
        while !text.is_char_boundary(cut) {
            cut += 1;
        }
        format!("...{}", &text[cut..])
    } else {
        text.to_string()
    };
    let took = t0.elapsed().as_secs_f64();
    let head = match status {
        None => format!("killed after its {} s timeout", timeout.as_secs_f64()),
        Some(s) => match s.code() {
            Some(c) => format!("exit {c} after {took:.2} s"),
            None => format!("ended by a signal after {took:.2} s"),
        },
    };
    if text.is_empty() {
        head
    } else {
        format!("{head}: {text}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::{CutOffSpec, KillSpec, PauseSpec};

    #[test]
    fn a_fault_aimed_at_two_volumes_of_an_agent_is_one_fault() {
        let pause = FaultSpec::new(FaultKind::Pause(PauseSpec {})).window_ms(1_000, Some(500));
        let kill = FaultSpec::new(FaultKind::Kill(KillSpec {})).window_ms(5_000, None);
        let stall = FaultSpec::new(FaultKind::Stall(Default::default())).window_ms(0, Some(1));
        let a = vec![pause.clone(), stall.clone()];
        let b = vec![pause.clone(), kill.clone()];
        let got = collect([a.as_slice(), b.as_slice()]);
        assert_eq!(
            got.iter().map(|f| f.spec.clone()).collect::<Vec<_>>(),
            vec![pause, kill]
        );
    }

    #[test]
    fn exec_needs_the_operators_permission() {
        let e = FaultSpec::new(FaultKind::Exec(ExecSpec {
            start: "true".into(),
            ..Default::default()
        }));
        let err = check(&e, false).unwrap_err();
        assert!(err.contains("--allow-exec"), "{err}");
        assert!(check(&e, true).is_ok());
        let c = FaultSpec::new(FaultKind::CutOff(CutOffSpec {})).window_ms(0, Some(10));
        assert!(check(&c, false).is_ok());
    }

    #[test]
    fn exec_reports_exit_status_output_and_timeout() {
        let ctx = Context {
            hub: EventHub::new(Arc::new(super::super::metrics::Metrics::new(&[]))),
            cut_off: Arc::new(CutOff::default()),
            run_id: "r1".into(),
            agent: "a1".into(),
            volumes: vec![("data".into(), "/tmp/x".into())],
            done: Arc::new(AtomicBool::new(false)),
        };
        let spec = ExecSpec {
            start: String::new(),
            end: None,
            timeout_ms: Some(300),
        };
        let ok = exec(
            &spec,
            "echo $LOCKSTEP_RUN_ID $LOCKSTEP_AGENT $LOCKSTEP_FAULT_EDGE $LOCKSTEP_VOLUMES",
            "start",
            &ctx,
        );
        assert!(ok.starts_with("exit 0 after"), "{ok}");
        assert!(ok.ends_with(": r1 a1 start data=/tmp/x"), "{ok}");
        let failed = exec(&spec, "echo broken >&2; exit 3", "end", &ctx);
        assert!(failed.starts_with("exit 3 after"), "{failed}");
        assert!(failed.ends_with(": broken"), "{failed}");
        let slow = exec(&spec, "sleep 5", "start", &ctx);
        assert_eq!(slow, "killed after its 0.3 s timeout");
    }

    #[test]
    fn a_cut_off_refuses_until_its_end() {
        let c = CutOff::default();
        assert_eq!(c.refusal(), None);
        c.set(Some(Instant::now() + Duration::from_secs(5)));
        assert!(c.refusal().unwrap().contains("cut off"));
        c.set(Some(Instant::now() - Duration::from_millis(1)));
        assert_eq!(c.refusal(), None);
    }
}
