//! Target files: which paths a job may touch, how big they are, and laying them out.
//!
//! Safety is the point of this module. A benchmark that writes to disks must never write outside
//! what it was told it may use:
//! - files are only ever created inside the job's `directory=` (which must already exist) or at
//!   the exact `filename=` paths, and a job name that would escape the directory is refused;
//! - a block device needs an explicit permission and is refused when mounted, used by another
//!   device (LVM, md, dm), or when it carries a filesystem or partition-table signature;
//! - files lockstep created are removed at the end unless asked to keep them, and a failed
//!   layout removes what it had created, so nothing half-written is left behind.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::confine::{self, Scope};
use crate::job::{Extent, JobSpec};
use crate::workload::FileRegion;

#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("job '{job}' ({origin}): {message}")]
    Job {
        job: String,
        origin: String,
        message: String,
    },
    #[error("{path}: {action} failed: {source}{hint}")]
    Io {
        path: PathBuf,
        action: &'static str,
        source: io::Error,
        hint: &'static str,
    },
    #[error(
        "{path} is a block device; lockstep only writes to raw devices when started with --allow-block-devices"
    )]
    BlockDeviceNotAllowed { path: PathBuf },
    #[error("{path}: refusing to use this device: {why}")]
    DeviceInUse { path: PathBuf, why: String },
    /// The layout was stopped (abort, SIGTERM, a lost coordinator) before it was done.
    #[error("{path}: layout stopped before it was done")]
    Stopped { path: PathBuf },
}

/// A hint for the errors people hit most, so the message says what to do.
pub fn io_hint(err: &io::Error) -> &'static str {
    match err.raw_os_error() {
        Some(libc::ENOSPC) => " (the volume is full: use a smaller size= or free space)",
        Some(libc::EACCES) | Some(libc::EPERM) => {
            " (permission denied: run as a user that may write there, or choose another directory=)"
        }
        Some(libc::ENOENT) => " (does the directory exist? lockstep does not create directories)",
        Some(libc::EINVAL) => {
            " (O_DIRECT needs block-aligned sizes and offsets, and a filesystem that supports it)"
        }
        Some(libc::EROFS) => " (read-only filesystem)",
        _ => "",
    }
}

fn io_err(path: &Path, action: &'static str, source: io::Error) -> LayoutError {
    let hint = io_hint(&source);
    LayoutError::Io {
        path: path.to_path_buf(),
        action,
        source,
        hint,
    }
}

/// One file a job clone will do IO on.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedFile {
    pub path: PathBuf,
    /// The part of the file the job uses.
    pub region: FileRegion,
    /// The file must be at least this long (region end).
    pub min_len: u64,
    pub is_block_device: bool,
    pub exists: bool,
    /// How the file is reached (beneath a volume, or as named).
    pub scope: Scope,
}

/// Plans the files of one clone of a job (fio's naming: `directory/jobname.clone.filenum`;
/// `filename=` paths are shared by all clones, as in fio).
pub fn plan_files(spec: &JobSpec, clone: u32) -> Result<Vec<PlannedFile>, LayoutError> {
    let job_err = |message: String| LayoutError::Job {
        job: spec.name.clone(),
        origin: spec.origin.to_string(),
        message,
    };
    let paths: Vec<PathBuf> = if !spec.filenames.is_empty() {
        spec.filenames
            .iter()
            .map(|f| match (f.is_absolute(), spec.directories.first()) {
                (false, Some(dir)) => dir.join(f),
                _ => f.clone(),
            })
            .collect()
    } else {
        if spec.name.contains('/') || spec.name == ".." || spec.name == "." {
            return Err(job_err(format!(
                "the job name '{}' is used in file names and must not contain '/' or be '.'/'..'",
                spec.name
            )));
        }
        let dirs = if spec.directories.is_empty() {
            vec![PathBuf::from(".")]
        } else {
            spec.directories.clone()
        };
        for dir in &dirs {
            match spec
                .scope
                .metadata(dir)
                .and_then(|m| m.ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT)))
            {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(job_err(format!(
                        "directory={} is not a directory",
                        dir.display()
                    )));
                }
                Err(e) => {
                    return Err(job_err(format!(
                        "directory={}: {e}; lockstep does not create directories, create it first",
                        dir.display()
                    )));
                }
            }
        }
        (0..spec.nrfiles)
            .map(|i| dirs[i as usize % dirs.len()].join(format!("{}.{}.{}", spec.name, clone, i)))
            .collect()
    };
    let nfiles = paths.len() as u64;
    let mut planned = Vec::with_capacity(paths.len());
    for path in paths {
        let meta = spec
            .scope
            .metadata(&path)
            .map_err(|e| job_err(format!("{}: {e}", path.display())))?;
        if let Some(m) = &meta {
            check_target_type(spec, &path, m).map_err(job_err)?;
        }
        let is_block = meta
            .as_ref()
            .is_some_and(|m| m.file_type().is_block_device());
        let existing_len = match &meta {
            Some(_) if is_block => block_device_size(&path)?,
            Some(m) => m.len(),
            None => 0,
        };
        let per_file = match (spec.filesize, spec.size) {
            (Some(fs), _) => fs,
            (None, Some(Extent::Bytes(total))) => total / nfiles,
            (None, Some(Extent::Percent(p))) => (existing_len as f64 * p / 100.0) as u64,
            (None, None) if existing_len > 0 => existing_len,
            (None, None) => {
                return Err(job_err(format!(
                    "size= is needed: {} does not exist yet, so its size is unknown",
                    path.display()
                )));
            }
        };
        let offset = match spec.offset {
            Extent::Bytes(o) => o,
            Extent::Percent(p) => (existing_len.max(per_file) as f64 * p / 100.0) as u64,
        };
        let offset = offset - offset % spec.min_bs().max(1);
        let mut len = per_file;
        // Files end before 2^63 bytes (off_t is signed); beyond that the sum would wrap (or
        // panic) and the region would be nonsense.
        if offset
            .checked_add(len)
            .is_none_or(|end| end > i64::MAX as u64)
        {
            return Err(job_err(format!(
                "offset={offset} plus {len} bytes of {} is beyond the largest possible file \
                 (2^63 bytes): lower offset= or size=",
                path.display()
            )));
        }
        if is_block && offset + len > existing_len {
            if offset >= existing_len {
                return Err(job_err(format!(
                    "offset={offset} is beyond the end of {} ({existing_len} bytes)",
                    path.display()
                )));
            }
            len = existing_len - offset;
        }
        if len < spec.min_bs() {
            return Err(job_err(format!(
                "the IO region of {} is {len} bytes, smaller than one block ({} bytes): raise size=",
                path.display(),
                spec.min_bs()
            )));
        }
        let file = PlannedFile {
            path,
            region: FileRegion { offset, len },
            min_len: offset + len,
            is_block_device: is_block,
            exists: meta.is_some(),
            scope: spec.scope.clone(),
        };
        check_existing_file_use(spec, &file, existing_len).map_err(job_err)?;
        planned.push(file);
    }
    Ok(planned)
}

/// Only regular files and (with permission, checked at layout) block devices are targets; a
/// FIFO, character device, socket or directory would hang the job or do something else than
/// storage IO. Inside a volume only regular files are used, and a link is named as such.
fn check_target_type(spec: &JobSpec, path: &Path, m: &std::fs::Metadata) -> Result<(), String> {
    let t = m.file_type();
    if t.is_file() || t.is_block_device() && !matches!(spec.scope, Scope::Beneath(_)) {
        return Ok(());
    }
    let advice = if t.is_symlink() {
        "lockstep never follows links inside a volume: remove the link"
    } else if t.is_block_device() {
        "give the device itself as a volume"
    } else if t.is_dir() {
        "name a file, or use directory= for the files' directory"
    } else if t.is_char_device() || t.is_fifo() {
        "lockstep does IO on regular files and block devices only"
    } else {
        return Err(format!(
            "{} is not a regular file or block device; lockstep does IO on those only",
            path.display()
        ));
    };
    let kind = confine::file_kind(t);
    let place = if t.is_block_device() {
        " inside a directory volume"
    } else {
        ""
    };
    Err(format!("{} is {kind}{place}; {advice}", path.display()))
}

/// A local job file may name any path, so what existed before the run is only read, and only
/// within its length, unless the job allows more: fio would silently extend `/etc/passwd` to
/// `size=` with random data. Files that do not exist are only created when the job allows it.
fn check_existing_file_use(
    spec: &JobSpec,
    f: &PlannedFile,
    existing_len: u64,
) -> Result<(), String> {
    if !f.exists {
        if !spec.allow_file_create {
            return Err(format!(
                "{} does not exist and allow_file_create=0 forbids creating it",
                f.path.display()
            ));
        }
        return Ok(());
    }
    if f.is_block_device || spec.scope.owns_existing_files() || spec.overwrite {
        return Ok(());
    }
    if spec.pattern.writes() || spec.verify.is_some() {
        return Err(format!(
            "{} existed before this run and the job writes to it; lockstep only writes files it              created: add overwrite=1 to the job to allow writing into it, or name a new file",
            f.path.display()
        ));
    }
    if existing_len < f.min_len {
        return Err(format!(
            "{} is {existing_len} bytes and the job reads up to byte {}; lockstep does not extend              a file it did not create: use size={existing_len} or less, or overwrite=1 to let it              grow the file",
            f.path.display(),
            f.min_len
        ));
    }
    Ok(())
}

/// Size of a block device in bytes (BLKGETSIZE64).
fn block_device_size(path: &Path) -> Result<u64, LayoutError> {
    let f = File::open(path).map_err(|e| io_err(path, "open", e))?;
    let mut size: u64 = 0;
    // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    // SAFETY: the ioctl writes one u64 into `size`, which lives for the call.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) };
    if r < 0 {
        return Err(io_err(path, "BLKGETSIZE64", io::Error::last_os_error()));
    }
    Ok(size)
}

/// Refuses a block device that is mounted, held by another device, or carries a known
/// filesystem / partition-table / volume-manager signature.
pub fn check_block_device(path: &Path) -> Result<(), LayoutError> {
    let meta = std::fs::metadata(path).map_err(|e| io_err(path, "stat", e))?;
    let rdev = meta.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let refuse = |why: String| LayoutError::DeviceInUse {
        path: path.to_path_buf(),
        why,
    };
    let mut devs = vec![(major, minor)];
    // Partitions of this device count too: a mounted /dev/sda1 makes /dev/sda unsafe.
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    if let Ok(entries) = std::fs::read_dir(&sys) {
        for e in entries.flatten() {
            if let Ok(dev) = std::fs::read_to_string(e.path().join("dev")) {
                if let Some((a, b)) = dev.trim().split_once(':') {
                    if let (Ok(a), Ok(b)) = (a.parse(), b.parse()) {
                        devs.push((a, b));
                    }
                }
            }
        }
    }
    if let Ok(holders) = std::fs::read_dir(sys.join("holders")) {
        if let Some(h) = holders.flatten().next() {
            return Err(refuse(format!(
                "it is in use by {} (device-mapper, LVM or md)",
                h.file_name().to_string_lossy()
            )));
        }
    }
    if let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") {
        for line in mountinfo.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            if fields.len() > 4 {
                if let Some((a, b)) = fields[2].split_once(':') {
                    if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                        if devs.contains(&(a, b)) {
                            return Err(refuse(format!("it is mounted on {}", fields[4])));
                        }
                    }
                }
            }
        }
    }
    if let Ok(swaps) = std::fs::read_to_string("/proc/swaps") {
        let canon = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        if swaps
            .lines()
            .skip(1)
            .any(|l| l.split_whitespace().next() == canon.to_str())
        {
            return Err(refuse("it is in use as swap".into()));
        }
    }
    let mut head = vec![0u8; 70 * 1024];
    let mut f = File::open(path).map_err(|e| io_err(path, "open", e))?;
    let n = read_up_to(&mut f, &mut head).map_err(|e| io_err(path, "read", e))?;
    if let Some(sig) = detect_signature(&head[..n]) {
        return Err(refuse(format!(
            "it carries a {sig} signature; wipe it deliberately (e.g. wipefs) if it is really free"
        )));
    }
    Ok(())
}

fn read_up_to(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Known on-disk signatures at their offsets (the same places blkid looks).
pub fn detect_signature(head: &[u8]) -> Option<&'static str> {
    let at = |off: usize, magic: &[u8]| head.get(off..off + magic.len()) == Some(magic);
    if at(1080, &[0x53, 0xEF]) {
        return Some("ext2/3/4");
    }
    if at(0, b"XFSB") {
        return Some("XFS");
    }
    if at(65600, b"_BHRfS_M") {
        return Some("btrfs");
    }
    if at(4086, b"SWAPSPACE2") || at(4086, b"SWAP-SPACE") {
        return Some("swap");
    }
    if at(0, b"LUKS\xba\xbe") {
        return Some("LUKS");
    }
    if at(512, b"LABELONE") || at(24, b"LVM2 001") {
        return Some("LVM");
    }
    if at(512, b"EFI PART") {
        return Some("GPT partition table");
    }
    if at(3, b"NTFS    ") {
        return Some("NTFS");
    }
    if at(54, b"FAT") || at(82, b"FAT32") {
        return Some("FAT");
    }
    if at(510, &[0x55, 0xAA]) {
        return Some("MBR partition table");
    }
    if at(4096, &[0xfc, 0x4e, 0x2b, 0xa9]) {
        return Some("md RAID");
    }
    None
}

/// A file lockstep created, with how to reach it again for removal.
#[derive(Debug, Clone)]
pub struct CreatedFile {
    pub path: PathBuf,
    pub scope: Scope,
}

/// Files created by lockstep (to remove at the end unless kept), in creation order.
#[derive(Debug, Default)]
pub struct CreatedFiles {
    pub files: Vec<CreatedFile>,
}

impl CreatedFiles {
    /// Removes every file lockstep created; failures are reported, not fatal. Removal goes
    /// through the file's scope, so a file replaced by a link meanwhile removes only the link.
    pub fn remove_all(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        for f in self.files.drain(..) {
            if let Err(e) = f.scope.remove(&f.path) {
                if e.kind() != io::ErrorKind::NotFound {
                    problems.push(format!("{}: could not remove: {e}", f.path.display()));
                }
            }
        }
        problems
    }
}

/// Progress of a layout, reported in bytes written (the caller draws it).
pub trait LayoutProgress {
    fn start(&self, total_bytes: u64);
    fn advance(&self, bytes: u64);
    fn finish(&self);
    /// Whether to stop laying out (checked between chunks): an abort mid-layout must not wait
    /// for gigabytes still to write. The layout then removes what it created.
    fn stopped(&self) -> bool {
        false
    }
}

/// No progress display (not on a terminal, or in tests).
pub struct NoProgress;
impl LayoutProgress for NoProgress {
    fn start(&self, _: u64) {}
    fn advance(&self, _: u64) {}
    fn finish(&self) {}
}

/// The bytes `lay_out(files, true, ..)` will write: what the files lack of their planned
/// length (block devices and files long enough already need nothing). Known before the layout
/// starts, so progress has its total from the first byte, even over several volumes.
pub fn bytes_to_fill(files: &[PlannedFile]) -> u64 {
    let mut unique: BTreeMap<&Path, u64> = BTreeMap::new();
    for f in files.iter().filter(|f| !f.is_block_device) {
        let e = unique.entry(&f.path).or_insert(0);
        *e = (*e).max(f.min_len);
    }
    let scope_of = |p: &Path| files.iter().find(|f| f.path == p).map(|f| &f.scope);
    unique
        .into_iter()
        .map(|(path, min_len)| {
            let current = scope_of(path)
                .and_then(|s| s.metadata(path).ok().flatten())
                .map_or(0, |m| m.len());
            min_len.saturating_sub(current)
        })
        .sum()
}

/// Makes sure every planned file exists and is long enough. Files that a job reads get real
/// data (reading holes measures nothing); write-only files are allocated without writing.
/// Files shared by several clones are laid out once.
pub fn lay_out(
    files: &[PlannedFile],
    fill_with_data: bool,
    allow_block_devices: bool,
    created: &mut CreatedFiles,
    progress: &dyn LayoutProgress,
) -> Result<(), LayoutError> {
    let mut unique: BTreeMap<&Path, &PlannedFile> = BTreeMap::new();
    for f in files {
        let e = unique.entry(&f.path).or_insert(f);
        if f.min_len > e.min_len {
            *e = f;
        }
    }
    let mut todo = Vec::new();
    for f in unique.values() {
        if f.is_block_device {
            if !allow_block_devices {
                return Err(LayoutError::BlockDeviceNotAllowed {
                    path: f.path.clone(),
                });
            }
            check_block_device(&f.path)?;
            continue;
        }
        let current = f
            .scope
            .metadata(&f.path)
            .map_err(|e| io_err(&f.path, "stat", e))?
            .map_or(0, |m| m.len());
        if current < f.min_len {
            todo.push((*f, current));
        }
    }
    let total: u64 = if fill_with_data {
        todo.iter().map(|(f, cur)| f.min_len - cur).sum()
    } else {
        0
    };
    progress.start(total);
    for (f, current) in todo {
        let result = extend_file(f, current, fill_with_data, progress, created);
        if let Err(e) = result {
            progress.finish();
            // Leave nothing half-written: remove what this run created.
            created.remove_all();
            return Err(e);
        }
    }
    progress.finish();
    Ok(())
}

/// Creates (never through a link: `O_EXCL`) or extends one file; a file it creates is recorded
/// in `created` before anything is written, so a failure or abort removes it.
fn extend_file(
    f: &PlannedFile,
    current: u64,
    fill: bool,
    progress: &dyn LayoutProgress,
    created: &mut CreatedFiles,
) -> Result<(), LayoutError> {
    let mut file = if f.exists {
        let file = f
            .scope
            .open(&f.path, libc::O_WRONLY, 0)
            .map_err(|e| io_err(&f.path, "open", e))?;
        confine::check_private(&f.path, &file).map_err(|e| io_err(&f.path, "open", e))?;
        file
    } else {
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        let file = f
            .scope
            .open(&f.path, flags, 0o644)
            .map_err(|e| io_err(&f.path, "create", e))?;
        created.files.push(CreatedFile {
            path: f.path.clone(),
            scope: f.scope.clone(),
        });
        file
    };
    if !fill {
        // SAFETY: plain syscall on an fd we own.
        let r = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, f.min_len as i64) };
        if r != 0 && r != libc::EOPNOTSUPP {
            return Err(io_err(&f.path, "allocate", io::Error::from_raw_os_error(r)));
        }
        if r == libc::EOPNOTSUPP {
            file.set_len(f.min_len)
                .map_err(|e| io_err(&f.path, "extend", e))?;
        }
        return Ok(());
    }
    const CHUNK: usize = 1 << 20;
    const SYNC_EVERY: u64 = 64 << 20;
    let mut buf = vec![0u8; CHUNK];
    fill_pseudo_random(&mut buf, f.path.as_os_str().len() as u64 ^ 0x5eed);
    file.seek(SeekFrom::Start(current))
        .map_err(|e| io_err(&f.path, "seek", e))?;
    let mut pos = current;
    let mut unsynced = 0u64;
    while pos < f.min_len {
        if progress.stopped() {
            return Err(LayoutError::Stopped {
                path: f.path.clone(),
            });
        }
        let n = ((f.min_len - pos) as usize).min(CHUNK);
        // Vary each chunk a little so that dedup/compression cannot flatter the device.
        buf[..8].copy_from_slice(&pos.to_le_bytes());
        file.write_all(&buf[..n])
            .map_err(|e| io_err(&f.path, "write (layout)", e))?;
        pos += n as u64;
        unsynced += n as u64;
        // Flush as we go: otherwise the page cache takes gigabytes at memory speed, progress
        // reaches 100% and then stands still for the whole final fsync.
        if unsynced >= SYNC_EVERY {
            file.sync_data()
                .map_err(|e| io_err(&f.path, "fsync (layout)", e))?;
            unsynced = 0;
        }
        progress.advance(n as u64);
    }
    file.sync_all()
        .map_err(|e| io_err(&f.path, "fsync (layout)", e))?;
    Ok(())
}

/// Fills a buffer with fast pseudo-random bytes (splitmix64), so written data does not compress.
pub fn fill_pseudo_random(buf: &mut [u8], seed: u64) {
    let mut s = seed;
    for chunk in buf.chunks_mut(8) {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let bytes = z.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

/// Opens a target for the job: O_DIRECT when asked, read-write only if the job writes; beneath
/// a volume without following links, and a file to write must have no other hard link.
pub fn open_target(
    scope: &Scope,
    path: &Path,
    direct: bool,
    write: bool,
) -> Result<File, LayoutError> {
    let mut flags = if write { libc::O_RDWR } else { libc::O_RDONLY };
    if direct {
        flags |= libc::O_DIRECT;
    }
    let file = scope
        .open(path, flags, 0)
        .map_err(|e| io_err(path, "open", e))?;
    if write && matches!(scope, Scope::Beneath(_)) {
        confine::check_private(path, &file).map_err(|e| io_err(path, "open", e))?;
    }
    Ok(file)
}

/// Drops the page cache of a file (fio's `invalidate=1`), so reads measure the device.
pub fn invalidate(file: &File) {
    // SAFETY: advisory syscall on an fd we own; failure only means the cache stays warm.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Origin, Pattern};

    fn job(dir: &Path) -> JobSpec {
        let mut j = JobSpec::with_defaults("t", Origin::default());
        j.directories = vec![dir.to_path_buf()];
        j.size = Some(Extent::Bytes(8 << 20));
        j.nrfiles = 2;
        j.pattern = Pattern::RandRead;
        j
    }

    #[test]
    fn plans_fio_names_inside_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let files = plan_files(&job(dir.path()), 3).unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(files[0].path, dir.path().join("t.3.0"));
        assert_eq!(files[1].path, dir.path().join("t.3.1"));
        assert_eq!(
            files[0].region,
            FileRegion {
                offset: 0,
                len: 4 << 20
            }
        );
    }

    #[test]
    fn refuses_names_that_escape_the_directory_and_missing_directories() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = job(dir.path());
        j.name = "../evil".into();
        assert!(
            plan_files(&j, 0)
                .unwrap_err()
                .to_string()
                .contains("must not contain '/'")
        );
        let mut j = job(&dir.path().join("missing"));
        j.name = "ok".into();
        let err = plan_files(&j, 0).unwrap_err().to_string();
        assert!(err.contains("does not create directories"), "{err}");
    }

    /// Found by the job-file fuzz test: `size=18446744073709547520` with `offset=1m` made
    /// offset + size overflow (a panic in debug builds, a wrapped region in release).
    #[test]
    fn refuses_regions_beyond_the_largest_file() {
        let dir = tempfile::tempdir().unwrap();
        for (offset, size) in [
            (1 << 20, u64::MAX - 4095),
            (u64::MAX - 4095, 4096),
            (1 << 62, 1 << 62),
        ] {
            let mut j = job(dir.path());
            j.nrfiles = 1;
            j.offset = Extent::Bytes(offset);
            j.size = Some(Extent::Bytes(size));
            let err = plan_files(&j, 0).unwrap_err().to_string();
            assert!(err.contains("beyond the largest possible file"), "{err}");
        }
        let mut j = job(dir.path());
        j.nrfiles = 1;
        j.offset = Extent::Bytes(1 << 62);
        j.size = Some(Extent::Bytes((1 << 62) - 1));
        assert_eq!(plan_files(&j, 0).unwrap()[0].min_len, i64::MAX as u64);
    }

    #[test]
    fn lays_out_and_removes_only_what_it_created() {
        let dir = tempfile::tempdir().unwrap();
        let keep = dir.path().join("t.0.1");
        std::fs::write(&keep, vec![1u8; 8 << 20]).unwrap();
        let files = plan_files(&job(dir.path()), 0).unwrap();
        let mut created = CreatedFiles::default();
        lay_out(&files, true, false, &mut created, &NoProgress).unwrap();
        let paths: Vec<_> = created.files.iter().map(|f| f.path.clone()).collect();
        assert_eq!(paths, vec![dir.path().join("t.0.0")]);
        assert_eq!(
            std::fs::metadata(dir.path().join("t.0.0")).unwrap().len(),
            4 << 20
        );
        assert!(created.remove_all().is_empty());
        assert!(!dir.path().join("t.0.0").exists());
        assert!(keep.exists(), "a pre-existing file must never be removed");
    }

    /// Counts what a layout reports, as the agent daemon does for `LayoutStatus`.
    #[derive(Default)]
    struct Count {
        total: std::sync::atomic::AtomicU64,
        done: std::sync::atomic::AtomicU64,
    }
    impl LayoutProgress for Count {
        fn start(&self, total: u64) {
            self.total
                .fetch_add(total, std::sync::atomic::Ordering::Relaxed);
        }
        fn advance(&self, bytes: u64) {
            self.done
                .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        }
        fn finish(&self) {}
    }

    /// The total known before a layout is what the layout then writes: a shared file counts
    /// once, at its longest, and what an existing file already has counts for nothing.
    #[test]
    fn bytes_to_fill_is_what_the_layout_writes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("t.0.1"), vec![1u8; 1 << 20]).unwrap();
        let mut j = job(dir.path());
        j.overwrite = true; // lets the layout grow the existing file
        let mut files = plan_files(&j, 0).unwrap();
        // Another clone's view of the first file, shorter: must not count twice.
        let mut shorter = files[0].clone();
        shorter.min_len = 1 << 20;
        files.push(shorter);
        let expected = bytes_to_fill(&files);
        assert_eq!(expected, (4 << 20) + (3 << 20));
        let count = Count::default();
        let mut created = CreatedFiles::default();
        lay_out(&files, true, false, &mut created, &count).unwrap();
        let done = count.done.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(done, expected);
        assert_eq!(
            count.total.load(std::sync::atomic::Ordering::Relaxed),
            expected
        );
        assert_eq!(bytes_to_fill(&files), 0, "laid out: nothing left to write");
        created.remove_all();
    }

    #[test]
    fn detects_signatures() {
        let mut head = vec![0u8; 70 * 1024];
        assert_eq!(detect_signature(&head), None);
        head[1080] = 0x53;
        head[1081] = 0xEF;
        assert_eq!(detect_signature(&head), Some("ext2/3/4"));
        let mut head = vec![0u8; 70 * 1024];
        head[..4].copy_from_slice(b"XFSB");
        assert_eq!(detect_signature(&head), Some("XFS"));
    }
}
