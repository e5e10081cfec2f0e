//! Where a job may touch files, and opening them so that it cannot touch anything else.
//!
//! The agent daemon runs as root on production hosts and takes its jobs from the network, so a
//! check of a path followed later by an open of the same path is not enough: anyone who can
//! write into a volume can swap a file for a symbolic link (or a link to a device node, or a hard
//! link to a file elsewhere) between the check and the open. Confinement is therefore done by
//! the open itself:
//! - beneath a directory volume, every open starts from the volume's root directory and is
//!   resolved by the kernel with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`: no `..`, no
//!   absolute path, no symbolic link anywhere in the path, dangling or not. Kernels without
//!   `openat2` (before 5.6, or under a seccomp filter that refuses it) get the same rule from a
//!   walk of one `openat(O_NOFOLLOW)` per component;
//! - what was opened is checked on the open descriptor (`fstat`), never by path again: only
//!   regular files are used inside a directory volume, and a file with more than one hard link is
//!   refused for writing, because its data is also reachable from a path outside the volume.
//!
//! Paths that a local user's job file names (`lockstep-agent run`) are resolved as fio resolves
//! them, links included; there the protection is that lockstep never extends, truncates or
//! overwrites a file it did not create unless the job says so (`overwrite=1`), see `layout`.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// How a job reaches its files.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Scope {
    /// Paths a local user's job file names, resolved as fio resolves them (links followed).
    /// Files the run did not create are only read unless the job allows more (`overwrite=1`).
    #[default]
    Named,
    /// Everything beneath this directory volume's root and nothing else: no symbolic link is
    /// followed, only regular files are used.
    Beneath(PathBuf),
    /// Exactly this file or block device, which the agent's operator gave as a volume.
    Exact(PathBuf),
}

impl Scope {
    /// Whether files that exist before the run are the job's to write and extend: inside a
    /// volume the operator handed the whole volume over; a local job file must say so.
    pub fn owns_existing_files(&self) -> bool {
        !matches!(self, Scope::Named)
    }

    /// Opens `path` with `flags` (`O_*`, `O_CLOEXEC` added) and `mode` for creation.
    pub fn open(&self, path: &Path, flags: i32, mode: u32) -> io::Result<File> {
        let root = match self {
            Scope::Beneath(root) => root,
            // A file or device volume is that one path: nothing beside it is the agent's to
            // create or write (a state file next to /dev/sdb would land in /dev).
            Scope::Exact(volume) if path != volume.as_path() => {
                return Err(not_the_volume(path, volume));
            }
            _ => return open_plain(path, flags, mode).map(File::from),
        };
        // O_NONBLOCK so that a FIFO planted in the volume cannot hold the open; it is cleared
        // again once the descriptor is known to be a regular file (io_uring treats it as "never
        // wait" and would fail buffered IO with EAGAIN).
        let fd = open_beneath(root, &relative(root, path)?, flags | libc::O_NONBLOCK, mode)?;
        let file = File::from(fd);
        if flags & libc::O_PATH != 0 {
            return Ok(file);
        }
        let meta = file.metadata()?;
        if !meta.file_type().is_file() {
            return Err(not_regular(path, &meta));
        }
        if flags & libc::O_NONBLOCK == 0 {
            // SAFETY: fcntl on a descriptor we own.
            let r = unsafe {
                let now = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
                libc::fcntl(file.as_raw_fd(), libc::F_SETFL, now & !libc::O_NONBLOCK)
            };
            if r < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(file)
    }

    /// The file's metadata, or `None` when it does not exist. Beneath a volume the last
    /// component is not followed, so a symbolic link shows up as one (and is refused later).
    pub fn metadata(&self, path: &Path) -> io::Result<Option<std::fs::Metadata>> {
        let result = match self {
            Scope::Beneath(root) => open_beneath(
                root,
                &relative(root, path)?,
                libc::O_PATH | libc::O_NOFOLLOW,
                0,
            )
            .and_then(|fd| File::from(fd).metadata()),
            Scope::Named | Scope::Exact(_) => std::fs::metadata(path),
        };
        match result {
            Ok(m) => Ok(Some(m)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Removes a file (never a directory); beneath a volume, from its parent opened beneath it.
    pub fn remove(&self, path: &Path) -> io::Result<()> {
        match self {
            Scope::Beneath(root) => {
                let (parent, name) = self.parent_of(root, path)?;
                // SAFETY: plain syscall on a descriptor we own and a NUL-terminated name.
                let r = unsafe { libc::unlinkat(parent.as_raw_fd(), name.as_ptr(), 0) };
                if r < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            }
            // Only a volume file lockstep created itself is ever removed (CreatedFiles).
            Scope::Exact(volume) if path != volume.as_path() => Err(not_the_volume(path, volume)),
            Scope::Named | Scope::Exact(_) => std::fs::remove_file(path),
        }
    }

    /// Renames `from` over `to` (both in one directory beneath a volume), for atomic updates.
    pub fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        match self {
            Scope::Beneath(root) => {
                let (dir_a, a) = self.parent_of(root, from)?;
                let (dir_b, b) = self.parent_of(root, to)?;
                // SAFETY: plain syscall on descriptors we own and NUL-terminated names.
                let r = unsafe {
                    libc::renameat(dir_a.as_raw_fd(), a.as_ptr(), dir_b.as_raw_fd(), b.as_ptr())
                };
                if r < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            }
            Scope::Exact(volume) => Err(not_the_volume(from, volume)),
            Scope::Named => std::fs::rename(from, to),
        }
    }

    fn parent_of(&self, root: &Path, path: &Path) -> io::Result<(OwnedFd, CString)> {
        let rel = relative(root, path)?;
        let name = rel
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
        let parent = rel.parent().unwrap_or(Path::new(""));
        let dir = open_beneath(root, parent, libc::O_PATH | libc::O_DIRECTORY, 0)?;
        Ok((dir, cstring(Path::new(name))?))
    }
}

/// Refuses a file that is about to be written when its data can also be reached from another
/// path (a hard link), which may lie outside the volume.
pub fn check_private(path: &Path, file: &File) -> io::Result<()> {
    let meta = file.metadata()?;
    if meta.file_type().is_file() && meta.nlink() > 1 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} has {} hard links: its data is also reachable from another path, so lockstep \
                 will not write it; remove the extra links or the file",
                path.display(),
                meta.nlink()
            ),
        ));
    }
    Ok(())
}

/// What kind of file this is, for error messages ("a FIFO").
pub fn file_kind(t: std::fs::FileType) -> &'static str {
    if t.is_symlink() {
        "a symbolic link"
    } else if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Says what a target that is not a regular file is, for the error message.
fn not_regular(path: &Path, meta: &std::fs::Metadata) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "{} is {}; inside a volume lockstep only uses regular files: remove it",
            path.display(),
            file_kind(meta.file_type())
        ),
    )
}

/// `path` relative to `root`, refused when it is not lexically beneath it. Paths in a volume
/// are always spelled from the root as the agent was given it (absolute, or relative to the
/// agent's working directory for `--local` agents).
fn relative(root: &Path, path: &Path) -> io::Result<PathBuf> {
    let rel = path.strip_prefix(root).map_err(|_| outside(path))?;
    let mut clean = PathBuf::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => clean.push(n),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(outside(path));
            }
        }
    }
    Ok(clean)
}

fn outside(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("{} is outside the volume", path.display()),
    )
}

fn cstring(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// A file or device volume is that one path: nothing beside it is the agent's to create, write,
/// rename or remove (a state file next to /dev/sdb would land in /dev).
fn not_the_volume(path: &Path, volume: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "{}: not the agent's to change: the volume {} is a file or device, only itself",
            path.display(),
            volume.display()
        ),
    )
}

fn open_plain(path: &Path, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let c = cstring(path)?;
    // SAFETY: plain syscall with a NUL-terminated path; the result is checked.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) };
    owned(fd)
}

fn owned(fd: RawFd) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just gave us this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Set once `openat2` has been refused as unknown (ENOSYS) or forbidden (a seccomp EPERM), so
/// later opens go straight to the walk.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// Opens `rel` (already free of `..` and root components) beneath the directory `root`,
/// following no symbolic link. An `O_PATH | O_NOFOLLOW` open returns a link itself, so callers
/// can see and name it; every other open of a link fails with ELOOP, which is reported as such.
pub fn open_beneath(root: &Path, rel: &Path, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let root_fd = open_plain(root, libc::O_PATH | libc::O_DIRECTORY, 0)?;
    let result = if NO_OPENAT2.load(Ordering::Relaxed) {
        walk_beneath(&root_fd, rel, flags, mode)
    } else {
        match openat2_beneath(&root_fd, rel, flags, mode) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS) | Some(libc::EPERM)) => {
                NO_OPENAT2.store(true, Ordering::Relaxed);
                walk_beneath(&root_fd, rel, flags, mode)
            }
            other => other,
        }
    };
    result.map_err(|e| explain(root, rel, e))
}

/// Names the link when the kernel refused one, so the operator knows what to remove.
fn explain(root: &Path, rel: &Path, e: io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(libc::ELOOP) => io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is, or passes through, a symbolic link; lockstep never follows links inside \
                 a volume: remove the link",
                root.join(rel).display()
            ),
        ),
        Some(libc::EXDEV) => outside(&root.join(rel)),
        _ => e,
    }
}

fn openat2_beneath(root: &OwnedFd, rel: &Path, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let c = cstring(if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    })?;
    let mode = if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 {
        mode
    } else {
        0
    };
    // SAFETY: open_how is plain data; zero is "no flags" for every field.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.mode = mode as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2 reads `how` (of the size passed) and the NUL-terminated path.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    owned(fd as RawFd)
}

/// The same rule as `openat2_beneath`, one `openat(O_NOFOLLOW)` per component.
fn walk_beneath(root: &OwnedFd, rel: &Path, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let parts: Vec<_> = rel.components().collect();
    // SAFETY: dup of a descriptor we own.
    let mut dir = owned(unsafe { libc::dup(root.as_raw_fd()) })?;
    let Some((last, dirs)) = parts.split_last() else {
        let c = cstring(Path::new("."))?;
        // SAFETY: plain syscall on a descriptor we own and a NUL-terminated name.
        return owned(unsafe {
            libc::openat(
                dir.as_raw_fd(),
                c.as_ptr(),
                flags | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        });
    };
    for part in dirs {
        let c = cstring(Path::new(part.as_os_str()))?;
        let dir_flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: as above.
        let next = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), dir_flags) };
        if next < 0 {
            let e = io::Error::last_os_error();
            // O_DIRECTORY on a link says ENOTDIR; report a link as one.
            return Err(if is_link_at(&dir, &c) {
                io::Error::from_raw_os_error(libc::ELOOP)
            } else {
                e
            });
        }
        dir = owned(next)?;
    }
    let c = cstring(Path::new(last.as_os_str()))?;
    // SAFETY: as above.
    owned(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    })
}

fn is_link_at(dir: &OwnedFd, name: &CString) -> bool {
    // SAFETY: fstatat writes one stat struct we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let r = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    r == 0 && st.st_mode & libc::S_IFMT == libc::S_IFLNK
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_file_volume_is_only_itself() {
        let dir = tempfile::tempdir().unwrap();
        let vol = dir.path().join("vol.img");
        std::fs::write(&vol, b"x").unwrap();
        let scope = Scope::Exact(vol.clone());
        assert!(scope.open(&vol, libc::O_RDWR, 0).is_ok());
        let beside = dir.path().join("j.0.verify-state");
        let e = scope
            .open(&beside, libc::O_WRONLY | libc::O_CREAT, 0o644)
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("vol.img"), "{e}");
        assert!(!beside.exists());
        std::fs::write(&beside, b"not the agent's").unwrap();
        assert!(scope.remove(&beside).is_err() && beside.exists());
        assert!(scope.rename(&vol, &beside).is_err() && vol.exists());
    }

    use super::*;
    use std::os::unix::fs::symlink;

    fn both<T>(f: impl Fn() -> T) -> (T, T) {
        NO_OPENAT2.store(false, Ordering::Relaxed);
        let a = f();
        NO_OPENAT2.store(true, Ordering::Relaxed);
        let b = f();
        NO_OPENAT2.store(false, Ordering::Relaxed);
        (a, b)
    }

    #[test]
    fn refuses_links_dangling_or_not_and_leaves_their_targets_alone() {
        let vol = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        symlink(&victim, vol.path().join("w.0.0")).unwrap();
        symlink(outside.path().join("nothing"), vol.path().join("w.0.1")).unwrap();
        std::fs::create_dir(vol.path().join("sub")).unwrap();
        symlink(outside.path(), vol.path().join("sub/escape")).unwrap();
        let scope = Scope::Beneath(vol.path().to_path_buf());
        let flags = libc::O_RDWR | libc::O_CREAT;
        for name in ["w.0.0", "w.0.1", "sub/escape/victim"] {
            let (a, b) = both(|| scope.open(&vol.path().join(name), flags, 0o644));
            for r in [a, b] {
                let e = r.unwrap_err().to_string();
                assert!(
                    e.contains("symbolic link") && e.contains(name),
                    "{name}: {e}"
                );
            }
        }
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert!(!outside.path().join("nothing").exists());
        // The link itself is visible to metadata, so layout can name it.
        let m = scope.metadata(&vol.path().join("w.0.1")).unwrap().unwrap();
        assert!(m.file_type().is_symlink());
    }

    #[test]
    fn refuses_paths_that_leave_the_root_and_non_regular_files() {
        let vol = tempfile::tempdir().unwrap();
        let scope = Scope::Beneath(vol.path().to_path_buf());
        for p in ["/etc/passwd", "../x"] {
            let e = scope.open(Path::new(p), libc::O_RDONLY, 0).unwrap_err();
            assert!(e.to_string().contains("outside the volume"), "{p}: {e}");
        }
        std::fs::create_dir(vol.path().join("d")).unwrap();
        let e = scope
            .open(&vol.path().join("d"), libc::O_RDONLY, 0)
            .unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e}");
        let fifo = cstring(&vol.path().join("fifo")).unwrap();
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let e = scope
            .open(
                &vol.path().join("fifo"),
                libc::O_RDONLY | libc::O_NONBLOCK,
                0,
            )
            .unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
    }

    #[test]
    fn opens_creates_renames_and_removes_regular_files_beneath_the_root() {
        let vol = tempfile::tempdir().unwrap();
        std::fs::create_dir(vol.path().join("sub")).unwrap();
        let scope = Scope::Beneath(vol.path().to_path_buf());
        let (a, b) = both(|| {
            let p = vol.path().join("sub/f");
            let f = scope.open(&p, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o600);
            let ok = f.is_ok() && scope.metadata(&p).unwrap().is_some();
            scope.rename(&p, &vol.path().join("sub/g")).unwrap();
            scope.remove(&vol.path().join("sub/g")).unwrap();
            ok && scope.metadata(&p).unwrap().is_none()
        });
        assert!(a && b);
    }

    #[test]
    fn a_root_relative_to_the_working_directory_works() {
        let vol = tempfile::tempdir_in(".").unwrap();
        let root = PathBuf::from(vol.path().file_name().unwrap());
        let scope = Scope::Beneath(root.clone());
        let m = scope.metadata(&root).unwrap().unwrap();
        assert!(m.is_dir());
        let f = root.join("f");
        scope
            .open(&f, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o600)
            .unwrap();
        assert!(vol.path().join("f").exists());
        scope.remove(&f).unwrap();
    }

    #[test]
    fn a_hard_linked_file_is_not_private() {
        let vol = tempfile::tempdir().unwrap();
        let p = vol.path().join("f");
        std::fs::write(&p, b"x").unwrap();
        let f = File::open(&p).unwrap();
        check_private(&p, &f).unwrap();
        std::fs::hard_link(&p, vol.path().join("g")).unwrap();
        let e = check_private(&p, &f).unwrap_err().to_string();
        assert!(e.contains("2 hard links"), "{e}");
    }
}
