//! Estimates before IO: memory, threads, open files and disk space a run needs, against what
//! the host has. A run that cannot fit is refused with both figures before anything is
//! written, rather than found out by the OOM killer or ENOSPC halfway through a layout.
//!
//! The estimates are pure functions of the jobs (and, for disk, of the planned files and the
//! free space already read); `host_figures` and `disk_needs` read the host at the edge.
//! They are deliberately estimates of what lockstep itself allocates, not of everything the
//! kernel does on its behalf: an estimate that is close and explained beats an exact one nobody
//! can check.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::job::{EngineKind, JobSpec};
use crate::layout::PlannedFile;

/// Memory a clone takes besides its IO buffers: latency histograms (per direction, per
/// interval and in total), the generator and the clone's thread. Measured: about 3.8 MB of
/// resident memory per clone with 4 KiB buffers at iodepth 1.
pub const CLONE_OVERHEAD: u64 = 4 << 20;

/// Memory per block of a verifying clone's layout (its state table, `verify::table`), up to
/// `verify::IN_MEMORY_LIMIT` per clone; a larger table goes to a file on the volume.
pub const VERIFY_BYTES_PER_BLOCK: u64 = crate::verify::BYTES_PER_BLOCK;

/// Memory per io_uring ring entry (submission and completion queue entries, two completion
/// entries per submission, and the index array).
const RING_BYTES_PER_ENTRY: u64 = 64 + 2 * 16 + 4;

/// File descriptors kept for what is not a target file: standard streams, the daemon's
/// sockets, log and state files.
pub const RESERVED_FDS: u64 = 64;

/// What the host offers; `None` where it could not be read (that check is skipped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HostFigures {
    /// `MemAvailable` from /proc/meminfo, bytes.
    pub mem_available: Option<u64>,
    /// Threads this process may have: the smallest of `kernel.threads-max`,
    /// `kernel.pid_max` and `RLIMIT_NPROC`.
    pub max_threads: Option<u64>,
    /// `RLIMIT_NOFILE` (soft), or `fs.nr_open` when that is smaller (or the limit unlimited).
    pub max_open_files: Option<u64>,
}

/// What the jobs need, summed over every clone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Needs {
    /// IO buffers: numjobs × iodepth × the largest block size (rounded up to 4 KiB).
    pub buffers: u64,
    /// Everything else: `CLONE_OVERHEAD` per clone, io_uring rings, verify state.
    pub overhead: u64,
    /// One thread per clone, plus one per IO in flight on the pread/pwrite engine.
    pub threads: u64,
    /// Target files open at once (every clone opens its files), and rings.
    pub open_files: u64,
}

impl Needs {
    pub fn memory(&self) -> u64 {
        self.buffers.saturating_add(self.overhead)
    }
}

/// A run the host cannot take. Each message gives what is needed and what the host has.
#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    #[error(
        "the jobs need {} of memory ({} of IO buffers: numjobs x iodepth x largest bs, plus {} \
         for {clones} clones), the host has {} available (MemAvailable); lower numjobs, iodepth \
         or bs{}",
        gib(.needs.memory()), gib(.needs.buffers), gib(.needs.overhead),
        gib(*.available), largest_text(.largest)
    )]
    Memory {
        needs: Needs,
        clones: u64,
        available: u64,
        largest: Option<String>,
    },
    #[error(
        "the jobs need {needed} threads (one per clone, and one per IO in flight with \
         ioengine=psync), the host allows {allowed}; lower numjobs or iodepth, or use \
         ioengine=io_uring"
    )]
    Threads { needed: u64, allowed: u64 },
    #[error(
        "the jobs need {needed} open files (every clone keeps its files open, plus {RESERVED_FDS} \
         for lockstep), the limit is {allowed} (ulimit -n); lower numjobs or nrfiles, or raise \
         the limit"
    )]
    OpenFiles { needed: u64, allowed: u64 },
    #[error(
        "the files to lay out need {} on the filesystem of {}, which has {} free; lower size \
         or numjobs, or free space",
        gib(*.needed), .dir.display(), gib(*.free)
    )]
    Disk {
        dir: PathBuf,
        needed: u64,
        free: u64,
    },
}

fn largest_text(largest: &Option<String>) -> String {
    largest
        .as_ref()
        .map(|l| format!(" (most of it {l})"))
        .unwrap_or_default()
}

/// Bytes as GiB with one decimal ("12.0 GiB"); MiB below 1 GiB so small figures still say
/// something.
pub fn gib(bytes: u64) -> String {
    const MIB: f64 = (1u64 << 20) as f64;
    const GIB: f64 = (1u64 << 30) as f64;
    let b = bytes as f64;
    if b >= GIB {
        format!("{:.1} GiB", b / GIB)
    } else {
        format!("{:.1} MiB", b / MIB)
    }
}

/// What one clone of `job` needs.
pub fn clone_needs(job: &JobSpec) -> Needs {
    let depth = job.iodepth.max(1) as u64;
    let slot = job.max_bs().next_multiple_of(4096);
    let ring = match job.engine {
        EngineKind::IoUring | EngineKind::Libaio => {
            depth.next_power_of_two() * RING_BYTES_PER_ENTRY
        }
        _ => 0,
    };
    // The verified region: every file's `filesize`, else `size`; a percentage of files not
    // yet known is left out (the files' sizes are only known once they are planned).
    let region = match (job.filesize, &job.size) {
        (Some(filesize), _) => filesize.saturating_mul(job.nrfiles.max(1) as u64),
        (None, Some(crate::job::Extent::Bytes(size))) => *size,
        _ => 0,
    };
    let verify = if job.verify.is_some() {
        // A volume that is one file or device has no room for the table: it stays in memory.
        let can_spill = !matches!(job.scope, crate::confine::Scope::Exact(_));
        crate::verify::memory_bytes(
            region / job.min_bs().max(1) * VERIFY_BYTES_PER_BLOCK,
            can_spill,
        )
    } else {
        0
    };
    let workers = if job.engine == EngineKind::Psync && depth > 1 {
        depth
    } else {
        0
    };
    let files = match job.engine {
        EngineKind::Null => 0,
        _ if !job.filenames.is_empty() => job.filenames.len() as u64,
        _ => job.nrfiles as u64,
    };
    let rings = u64::from(matches!(
        job.engine,
        EngineKind::IoUring | EngineKind::Libaio
    ));
    Needs {
        buffers: depth.saturating_mul(slot),
        overhead: CLONE_OVERHEAD + ring + verify,
        threads: 1 + workers,
        open_files: files + rings,
    }
}

/// What every clone of every job needs, and the job that needs the most memory.
pub fn needs(jobs: &[JobSpec]) -> (Needs, Option<&JobSpec>) {
    let mut total = Needs::default();
    let mut largest: Option<(&JobSpec, u64)> = None;
    for job in jobs {
        let one = clone_needs(job);
        let n = job.numjobs as u64;
        total.buffers = total.buffers.saturating_add(one.buffers.saturating_mul(n));
        total.overhead = total
            .overhead
            .saturating_add(one.overhead.saturating_mul(n));
        total.threads = total.threads.saturating_add(one.threads.saturating_mul(n));
        total.open_files = total
            .open_files
            .saturating_add(one.open_files.saturating_mul(n));
        let memory = one.memory().saturating_mul(n);
        if largest.is_none_or(|(_, m)| memory > m) {
            largest = Some((job, memory));
        }
    }
    (total, largest.map(|(j, _)| j))
}

/// Checks the jobs against the host's memory, threads and open files.
pub fn check_host(jobs: &[JobSpec], host: &HostFigures) -> Result<(), BudgetError> {
    let (needs, largest) = needs(jobs);
    if let Some(available) = host.mem_available
        && needs.memory() > available
    {
        let clones = jobs.iter().map(|j| j.numjobs as u64).sum();
        let largest = largest.map(|j| {
            format!(
                "job '{}' at {}, with numjobs={}, iodepth={}, bs={}",
                j.name,
                j.origin,
                j.numjobs,
                j.iodepth,
                j.max_bs()
            )
        });
        return Err(BudgetError::Memory {
            needs,
            clones,
            available,
            largest,
        });
    }
    if let Some(allowed) = host.max_threads
        && needs.threads > allowed
    {
        return Err(BudgetError::Threads {
            needed: needs.threads,
            allowed,
        });
    }
    if let Some(allowed) = host.max_open_files {
        let needed = needs.open_files.saturating_add(RESERVED_FDS);
        if needed > allowed {
            return Err(BudgetError::OpenFiles { needed, allowed });
        }
    }
    Ok(())
}

/// Space the layout will take on one filesystem, and what it has free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsNeed {
    /// A directory on the filesystem, for the message.
    pub dir: PathBuf,
    pub needed: u64,
    pub free: u64,
}

/// Checks every filesystem's need against its free space.
pub fn check_disk(needs: &[FsNeed]) -> Result<(), BudgetError> {
    match needs.iter().find(|n| n.needed > n.free) {
        Some(n) => Err(BudgetError::Disk {
            dir: n.dir.clone(),
            needed: n.needed,
            free: n.free,
        }),
        None => Ok(()),
    }
}

/// `MemAvailable` from the text of /proc/meminfo, in bytes.
pub fn parse_meminfo(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut words = line.split_whitespace().skip(1);
    let value: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => value.checked_mul(1024),
        None => Some(value),
        Some(_) => None,
    }
}

/// Reads the host's figures (the edge of this module).
pub fn host_figures() -> HostFigures {
    let mem_available = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| parse_meminfo(&t));
    let sysctl =
        |name: &str| -> Option<u64> { std::fs::read_to_string(name).ok()?.trim().parse().ok() };
    let rlimit = |resource| -> Option<u64> {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one struct we own.
        let ok = unsafe { libc::getrlimit(resource, &mut r) } == 0;
        (ok && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
    };
    let max_threads = [
        sysctl("/proc/sys/kernel/threads-max"),
        sysctl("/proc/sys/kernel/pid_max"),
        rlimit(libc::RLIMIT_NPROC),
    ]
    .into_iter()
    .flatten()
    .min();
    // An unlimited RLIMIT_NOFILE is still bounded by fs.nr_open.
    let max_open_files = [rlimit(libc::RLIMIT_NOFILE), sysctl("/proc/sys/fs/nr_open")]
        .into_iter()
        .flatten()
        .min();
    HostFigures {
        mem_available,
        max_threads,
        max_open_files,
    }
}

/// What laying out `files` would take per filesystem: the bytes each file is still short of
/// its planned length (files shared by clones once, at their largest), grouped by the
/// filesystem of its directory, with that filesystem's free space (`statvfs`, blocks available
/// to unprivileged users). Block devices take no space; a filesystem that cannot be read is
/// left out (the layout reports it).
pub fn disk_needs(files: &[PlannedFile]) -> Vec<FsNeed> {
    let mut longest: BTreeMap<&Path, u64> = BTreeMap::new();
    for f in files.iter().filter(|f| !f.is_block_device) {
        let e = longest.entry(&f.path).or_default();
        *e = (*e).max(f.min_len);
    }
    let mut per_fs: BTreeMap<u64, FsNeed> = BTreeMap::new();
    for (path, len) in longest {
        let current = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        let short = len.saturating_sub(current);
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let Ok(meta) = std::fs::metadata(dir) else {
            continue;
        };
        let need = match per_fs.entry(meta.dev()) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => {
                let Some(free) = free_space(dir) else {
                    continue;
                };
                e.insert(FsNeed {
                    dir: dir.to_path_buf(),
                    needed: 0,
                    free,
                })
            }
        };
        need.needed = need.needed.saturating_add(short);
    }
    per_fs.into_values().collect()
}

/// Free bytes for unprivileged users on the filesystem of `dir`.
fn free_space(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs reads a NUL-terminated path and writes one struct we own.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Origin, VerifyKind};

    fn job(name: &str, numjobs: u32, iodepth: u32, bs: u64) -> JobSpec {
        let mut j = JobSpec::with_defaults(
            name,
            Origin {
                file: "t.fio".into(),
                line: 1,
            },
        );
        j.numjobs = numjobs;
        j.iodepth = iodepth;
        j.bs = [vec![(bs, 100)], vec![(bs, 100)]];
        j
    }

    const GIB: u64 = 1 << 30;

    #[test]
    fn buffers_are_numjobs_times_iodepth_times_the_largest_bs() {
        let mut j = job("j", 4, 32, 1 << 20);
        j.engine = EngineKind::IoUring;
        j.bs[1] = vec![(4096, 50), (2 << 20, 50)];
        let (n, _) = needs(std::slice::from_ref(&j));
        assert_eq!(n.buffers, 4 * 32 * (2 << 20));
        assert_eq!(n.overhead, 4 * (CLONE_OVERHEAD + 32 * RING_BYTES_PER_ENTRY));
        assert_eq!(n.threads, 4);
        assert_eq!(n.open_files, 4 * 2);
        // A block size that is not a multiple of 4 KiB takes a whole 4 KiB slot.
        let (n, _) = needs(&[job("j", 1, 2, 512)]);
        assert_eq!(n.buffers, 2 * 4096);
    }

    #[test]
    fn psync_needs_a_thread_per_io_in_flight_and_verify_needs_state() {
        let (n, _) = needs(&[job("j", 3, 8, 4096)]);
        assert_eq!(n.threads, 3 * 9);
        let (n, _) = needs(&[job("j", 3, 1, 4096)]);
        assert_eq!(n.threads, 3);
        let mut j = job("j", 1, 1, 4096);
        j.verify = Some(VerifyKind::Crc32c);
        j.size = Some(crate::job::Extent::Bytes(GIB));
        let (n, _) = needs(std::slice::from_ref(&j));
        assert_eq!(
            n.overhead,
            CLONE_OVERHEAD + GIB / 4096 * VERIFY_BYTES_PER_BLOCK
        );
        j.filesize = Some(GIB);
        j.nrfiles = 2;
        let (n, _) = needs(std::slice::from_ref(&j));
        assert_eq!(
            n.overhead,
            CLONE_OVERHEAD + 2 * GIB / 4096 * VERIFY_BYTES_PER_BLOCK
        );
        // 1 TiB: the table (2 GiB) goes to a file on the volume, unless the volume is one
        // file or device, where it must stay in memory.
        j.filesize = Some(1024 * GIB);
        j.nrfiles = 1;
        let (n, _) = needs(std::slice::from_ref(&j));
        assert_eq!(n.overhead, CLONE_OVERHEAD);
        j.scope = crate::confine::Scope::Exact("/dev/sdx".into());
        let (n, _) = needs(&[j]);
        assert_eq!(n.overhead, CLONE_OVERHEAD + 1024 * GIB / 4096 * 8);
    }

    #[test]
    fn memory_over_what_is_available_is_refused_with_both_figures() {
        let host = HostFigures {
            mem_available: Some(3 * GIB + GIB / 10),
            ..Default::default()
        };
        // 12 GiB of buffers: 96 clones x 32 deep x 4 MiB.
        let jobs = [job("big", 96, 32, 4 << 20)];
        let e = check_host(&jobs, &host).unwrap_err().to_string();
        assert!(
            e.starts_with("the jobs need 12.4 GiB of memory (12.0 GiB of IO buffers"),
            "{e}"
        );
        assert!(e.contains("the host has 3.1 GiB available"), "{e}");
        assert!(check_host(&[job("small", 1, 1, 4096)], &host).is_ok());
        // With several jobs the message names the one that needs the most.
        let jobs = [job("small", 1, 1, 4096), job("big", 96, 32, 4 << 20)];
        let e = check_host(&jobs, &host).unwrap_err().to_string();
        assert!(
            e.contains("most of it job 'big' at t.fio:1, with numjobs=96"),
            "{e}"
        );
        // Unknown figures are not checked.
        assert!(check_host(&jobs, &HostFigures::default()).is_ok());
    }

    #[test]
    fn threads_and_open_files_over_the_limits_are_refused() {
        let host = HostFigures {
            max_threads: Some(1000),
            max_open_files: Some(1024),
            ..Default::default()
        };
        let e = check_host(&[job("j", 4, 256, 4096)], &host)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("the jobs need 1028 threads"), "{e}");
        assert!(e.contains("the host allows 1000"), "{e}");
        let mut j = job("j", 100, 1, 4096);
        j.nrfiles = 10;
        let e = check_host(&[j], &host).unwrap_err().to_string();
        assert!(e.starts_with("the jobs need 1064 open files"), "{e}");
        assert!(e.contains("the limit is 1024"), "{e}");
    }

    #[test]
    fn disk_over_free_space_is_refused_with_both_figures() {
        let ok = FsNeed {
            dir: "/a".into(),
            needed: GIB,
            free: 2 * GIB,
        };
        let full = FsNeed {
            dir: "/b".into(),
            needed: 20 * GIB,
            free: 3 * GIB + GIB / 10,
        };
        assert!(check_disk(std::slice::from_ref(&ok)).is_ok());
        let e = check_disk(&[ok, full]).unwrap_err().to_string();
        assert!(
            e.starts_with(
                "the files to lay out need 20.0 GiB on the filesystem of /b, which has 3.1 GiB free"
            ),
            "{e}"
        );
    }

    #[test]
    fn meminfo() {
        let text = "MemTotal:       24683520 kB\nMemFree:        12100000 kB\nMemAvailable:   3250000 kB\n";
        assert_eq!(parse_meminfo(text), Some(3_250_000 * 1024));
        assert_eq!(parse_meminfo("MemTotal: 1 kB\n"), None);
        assert_eq!(parse_meminfo("MemAvailable: lots kB\n"), None);
        assert!(host_figures().mem_available.is_some());
    }

    /// The edge on a real directory: existing bytes are not needed again, shared files count
    /// once, and the free space is the filesystem's.
    #[test]
    fn disk_needs_of_real_files() {
        let dir = tempfile::tempdir().unwrap();
        let existing = dir.path().join("a");
        std::fs::write(&existing, vec![0u8; 4096]).unwrap();
        let planned = |path: &Path, len: u64| PlannedFile {
            path: path.to_path_buf(),
            region: crate::workload::FileRegion { offset: 0, len },
            min_len: len,
            is_block_device: false,
            exists: path.exists(),
            scope: crate::confine::Scope::Named,
        };
        let new = dir.path().join("b");
        let files = [
            planned(&existing, 8192),
            planned(&new, 1 << 20),
            planned(&new, 1 << 20),
        ];
        let needs = disk_needs(&files);
        assert_eq!(needs.len(), 1);
        assert_eq!(needs[0].needed, 4096 + (1 << 20));
        assert!(needs[0].free > 0);
        assert_eq!(needs[0].dir, dir.path());
    }
}
