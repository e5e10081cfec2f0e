//! `kernel_throttle`: the kernel's block throttle on a volume's device, through a cgroup the
//! agent creates for the volume's IO threads.
//!
//! Unlike the IO-path faults, this one is real: the kernel delays the IOs in the block layer,
//! so it also catches what lockstep's own gates cannot (page-cache writeback on cgroup v2,
//! engine worker threads, io_uring's async workers). It needs privilege, so it is checked when
//! the run is prepared and refused with the reason (not root, no io controller, the volume is
//! not on a block device) before any IO.
//!
//! How: at prepare, the agent resolves the volume's device (a partition is throttled through
//! its whole disk, which is what the kernel accepts) and creates one cgroup per volume with no
//! limits. Each job clone moves its own thread into it before it builds its engine, so the
//! threads the engine starts (pread/pwrite workers, io_uring workers) are born in it. The
//! limits are written when a fault window opens and removed when it closes (the union of the
//! windows open at a time: the lowest limit per field wins); the cgroup is removed at the end.
//!
//! - cgroup v1 (`blkio`): threads move one by one (`tasks`); limits in
//!   `blkio.throttle.{read,write}_{iops,bps}_device` ("MAJ:MIN N", 0 removes);
//! - cgroup v2 (`io` controller): a thread cannot be moved alone (io is a domain controller), so
//!   the whole agent process moves into the cgroup for the run and back afterwards: every
//!   volume of this agent on the same device is throttled together. Limits in `io.max`
//!   ("MAJ:MIN riops=N wiops=max ..."). Buffered writes are throttled at writeback only on v2.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::spec::KernelThrottleSpec;

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error(
        "kernel_throttle needs root to create a cgroup and set block limits; this agent runs as uid {0} (run it as root, or use the iops_cap/bw_cap faults, which need no privilege)"
    )]
    NotRoot(u32),
    #[error(
        "kernel_throttle needs a cgroup io controller: neither cgroup v2 with the io controller nor a cgroup v1 blkio hierarchy is mounted here"
    )]
    NoController,
    #[error(
        "kernel_throttle: {path} is not on a block device (device {major}:{minor}: tmpfs, overlayfs or a network filesystem?); throttle a volume on a real or loop device"
    )]
    NotBlock {
        path: String,
        major: u32,
        minor: u32,
    },
    #[error("kernel_throttle: {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: String,
        source: std::io::Error,
    },
}

fn io_err<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> KernelError + 'a {
    move |source| KernelError::Io {
        what,
        path: path.display().to_string(),
        source,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hierarchy {
    V1,
    V2,
}

/// Where the io controller lives: cgroup v2 with `io` enabled, else v1 `blkio`.
fn find_hierarchy(
    mountinfo: &str,
    v2_controllers: impl Fn(&Path) -> Option<String>,
) -> Option<(Hierarchy, PathBuf)> {
    let mut v1 = None;
    for line in mountinfo.lines() {
        // "... MOUNTPOINT OPTS ... - FSTYPE SOURCE SUPEROPTS"
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mount = left.split(' ').nth(4).unwrap_or("");
        let mut r = right.split(' ');
        let fstype = r.next().unwrap_or("");
        let superopts = r.nth(1).unwrap_or("");
        match fstype {
            "cgroup2" => {
                let path = PathBuf::from(mount);
                if v2_controllers(&path).is_some_and(|c| c.split_whitespace().any(|x| x == "io")) {
                    return Some((Hierarchy::V2, path));
                }
            }
            "cgroup" if superopts.split(',').any(|o| o == "blkio") => {
                v1 = Some((Hierarchy::V1, PathBuf::from(mount)))
            }
            _ => {}
        }
    }
    v1
}

/// Whether this host lets the agent use the kernel throttle at all (root and an io
/// controller), and through which hierarchy; the reason when not (for tests and messages).
pub fn probe() -> Result<(Hierarchy, PathBuf), KernelError> {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if uid != 0 {
        return Err(KernelError::NotRoot(uid));
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(io_err("reading", Path::new("/proc/self/mountinfo")))?;
    find_hierarchy(&mountinfo, |p| {
        std::fs::read_to_string(p.join("cgroup.controllers")).ok()
    })
    .ok_or(KernelError::NoController)
}

/// The device to throttle for `path`: its filesystem's device (or the device itself), the
/// whole disk when that is a partition.
pub fn device_of(path: &Path) -> Result<(u32, u32), KernelError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(path).map_err(io_err("reading", path))?;
    let dev = if meta.file_type().is_block_device() {
        meta.rdev()
    } else {
        meta.dev()
    };
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    if major == 0 || !sys.exists() {
        return Err(KernelError::NotBlock {
            path: path.display().to_string(),
            major,
            minor,
        });
    }
    if sys.join("partition").exists() {
        // /sys/dev/block/M:m -> .../block/sda/sda1: the parent directory is the disk.
        let real = std::fs::canonicalize(&sys).map_err(io_err("resolving", &sys))?;
        let parent_dev = real.parent().map(|p| p.join("dev")).unwrap_or_default();
        let text = std::fs::read_to_string(&parent_dev).map_err(io_err("reading", &parent_dev))?;
        if let Some((a, b)) = text.trim().split_once(':') {
            if let (Ok(a), Ok(b)) = (a.parse(), b.parse()) {
                return Ok((a, b));
            }
        }
    }
    Ok((major, minor))
}

/// The limit lines to write for a spec (`None`: remove every limit).
pub fn limit_lines(
    h: Hierarchy,
    dev: (u32, u32),
    spec: Option<&KernelThrottleSpec>,
) -> Vec<(&'static str, String)> {
    let (ma, mi) = dev;
    let s = spec.cloned().unwrap_or_default();
    match h {
        Hierarchy::V1 => [
            ("blkio.throttle.read_iops_device", s.riops),
            ("blkio.throttle.write_iops_device", s.wiops),
            ("blkio.throttle.read_bps_device", s.rbps),
            ("blkio.throttle.write_bps_device", s.wbps),
        ]
        .into_iter()
        .map(|(file, v)| (file, format!("{ma}:{mi} {}", v.unwrap_or(0))))
        .collect(),
        Hierarchy::V2 => {
            let f = |v: Option<u64>| v.map_or("max".to_string(), |v| v.to_string());
            vec![(
                "io.max",
                format!(
                    "{ma}:{mi} riops={} wiops={} rbps={} wbps={}",
                    f(s.riops),
                    f(s.wiops),
                    f(s.rbps),
                    f(s.wbps)
                ),
            )]
        }
    }
}

/// The limits in force at `t_ms` given the windows `(at_ms, end_ms, spec)`: the lowest per
/// field among the open windows, `None` when none is open.
pub fn active_limits(
    faults: &[(u64, Option<u64>, KernelThrottleSpec)],
    t_ms: u64,
) -> Option<KernelThrottleSpec> {
    let min = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    };
    faults
        .iter()
        .filter(|(at, end, _)| *at <= t_ms && end.is_none_or(|e| t_ms < e))
        .map(|(_, _, s)| s.clone())
        .reduce(|a, b| KernelThrottleSpec {
            riops: min(a.riops, b.riops),
            wiops: min(a.wiops, b.wiops),
            rbps: min(a.rbps, b.rbps),
            wbps: min(a.wbps, b.wbps),
        })
}

/// One volume's throttle cgroup, created at prepare and removed on drop.
#[derive(Debug)]
pub struct ThrottleGroup {
    pub hierarchy: Hierarchy,
    pub dir: PathBuf,
    pub device: (u32, u32),
    /// v2: the cgroup the process came from, to go back to at the end.
    origin: Option<PathBuf>,
    entered: Mutex<bool>,
}

impl ThrottleGroup {
    /// Checks the privilege, finds the controller and the device, and creates the cgroup.
    pub fn create(volume: &str, volume_path: &Path) -> Result<Self, KernelError> {
        let (hierarchy, mount) = probe()?;
        let device = device_of(volume_path)?;
        let safe: String = volume
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let dir = mount.join(format!("lockstep-{}-{safe}", std::process::id()));
        let mut origin = None;
        if hierarchy == Hierarchy::V2 {
            // The root may always enable controllers for its children.
            let ctl = mount.join("cgroup.subtree_control");
            std::fs::write(&ctl, "+io").map_err(io_err("enabling the io controller in", &ctl))?;
            let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
            origin = own
                .lines()
                .find_map(|l| l.strip_prefix("0::"))
                .map(|p| mount.join(p.trim_start_matches('/')));
        }
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err("creating the cgroup", &dir)(e)),
        }
        let g = ThrottleGroup {
            hierarchy,
            dir,
            device,
            origin,
            entered: Mutex::new(false),
        };
        g.set(None)?;
        Ok(g)
    }

    /// Moves the calling thread (v1) or, once, the whole process (v2) into the cgroup.
    /// Threads it starts afterwards are born in it.
    pub fn enter_current_thread(&self) -> Result<(), KernelError> {
        match self.hierarchy {
            Hierarchy::V1 => {
                // SAFETY: gettid has no preconditions.
                let tid = unsafe { libc::gettid() };
                let tasks = self.dir.join("tasks");
                std::fs::write(&tasks, tid.to_string())
                    .map_err(io_err("moving the IO thread into", &tasks))
            }
            Hierarchy::V2 => {
                let mut entered = self.entered.lock().unwrap_or_else(|e| e.into_inner());
                if !*entered {
                    let procs = self.dir.join("cgroup.procs");
                    std::fs::write(&procs, std::process::id().to_string())
                        .map_err(io_err("moving the agent into", &procs))?;
                    *entered = true;
                }
                Ok(())
            }
        }
    }

    /// Writes the limits (`None`: no limit).
    pub fn set(&self, spec: Option<&KernelThrottleSpec>) -> Result<(), KernelError> {
        for (file, line) in limit_lines(self.hierarchy, self.device, spec) {
            let path = self.dir.join(file);
            std::fs::write(&path, &line).map_err(io_err("writing the limit", &path))?;
        }
        Ok(())
    }
}

impl Drop for ThrottleGroup {
    fn drop(&mut self) {
        let _ = self.set(None);
        if let Some(origin) = &self.origin {
            if *self.entered.lock().unwrap_or_else(|e| e.into_inner()) {
                let _ = std::fs::write(origin.join("cgroup.procs"), std::process::id().to_string());
            }
        }
        // Exiting threads leave the cgroup a moment after they are joined.
        for _ in 0..50 {
            match std::fs::remove_dir(&self.dir) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        }
        tracing::warn!(
            "could not remove the throttle cgroup {} (threads still in it?)",
            self.dir.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: &str = "\
30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime shared:10 - cgroup cgroup rw,cpu
31 25 0:27 / /sys/fs/cgroup/blkio rw,relatime shared:11 - cgroup cgroup rw,blkio
35 25 0:31 / /sys/fs/cgroup/unified rw,relatime shared:15 - cgroup2 cgroup2 rw
";

    #[test]
    fn finds_the_io_controller_preferring_v2() {
        let none = |_: &Path| Some("cpu memory pids".to_string());
        assert_eq!(
            find_hierarchy(V1, none),
            Some((Hierarchy::V1, PathBuf::from("/sys/fs/cgroup/blkio")))
        );
        let io = |_: &Path| Some("cpu io memory".to_string());
        assert_eq!(
            find_hierarchy(V1, io),
            Some((Hierarchy::V2, PathBuf::from("/sys/fs/cgroup/unified")))
        );
        let v2_only = "35 25 0:31 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(find_hierarchy(v2_only, none), None);
    }

    #[test]
    fn limit_lines_follow_each_hierarchy() {
        let s = KernelThrottleSpec {
            riops: Some(100),
            wbps: Some(1 << 20),
            ..Default::default()
        };
        let v1 = limit_lines(Hierarchy::V1, (7, 0), Some(&s));
        assert_eq!(
            v1[0],
            ("blkio.throttle.read_iops_device", "7:0 100".to_string())
        );
        assert_eq!(
            v1[1],
            ("blkio.throttle.write_iops_device", "7:0 0".to_string())
        );
        assert_eq!(
            v1[3],
            ("blkio.throttle.write_bps_device", "7:0 1048576".to_string())
        );
        let v2 = limit_lines(Hierarchy::V2, (259, 0), Some(&s));
        assert_eq!(
            v2,
            [(
                "io.max",
                "259:0 riops=100 wiops=max rbps=max wbps=1048576".to_string()
            )]
        );
        let off = limit_lines(Hierarchy::V2, (259, 0), None);
        assert_eq!(off[0].1, "259:0 riops=max wiops=max rbps=max wbps=max");
    }

    #[test]
    fn overlapping_windows_take_the_lowest_limit() {
        let a = KernelThrottleSpec {
            riops: Some(100),
            ..Default::default()
        };
        let b = KernelThrottleSpec {
            riops: Some(50),
            wiops: Some(10),
            ..Default::default()
        };
        let f = [(1_000, Some(5_000), a), (3_000, None, b)];
        assert_eq!(active_limits(&f, 500), None);
        assert_eq!(active_limits(&f, 1_000).unwrap().riops, Some(100));
        let both = active_limits(&f, 4_000).unwrap();
        assert_eq!((both.riops, both.wiops), (Some(50), Some(10)));
        assert_eq!(active_limits(&f, 9_000).unwrap().riops, Some(50));
    }

    #[test]
    fn tmpfs_is_not_a_block_device() {
        if let Ok(m) = std::fs::metadata("/dev/shm") {
            use std::os::unix::fs::MetadataExt;
            if libc::major(m.dev()) == 0 {
                assert!(matches!(
                    device_of(Path::new("/dev/shm")),
                    Err(KernelError::NotBlock { .. })
                ));
            }
        }
    }
}
