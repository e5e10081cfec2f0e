//! Hard limits checked before anything runs, with fio's numbers where fio has one.
//!
//! A job file is input from someone else, and an agent runs on a production host: a typo such
//! as `numjobs=100000` or `iodepth=100000` must be refused with the option and the line, not
//! discovered by the kernel's OOM killer. Every limit here is a plain function of its inputs,
//! so it can be tested directly; the job-file parser calls them with the option's place, the
//! runner calls them again for jobs that did not come from a job file.
//!
//! The numbers, as checked against fio 3.33 (see docs/fio-compatibility.md, "Limits"):
//! - fio allocates at most 4096 jobs in all (`REAL_MAX_JOBS`; a larger `numjobs` fails with
//!   "maximum number of jobs reached");
//! - fio's option table gives `iodepth` no maximum, but its engines have one: io_uring fails
//!   above the kernel's 32768 ring entries (`IORING_MAX_ENTRIES`), libaio above
//!   `fs.aio-max-nr` (65536 by default). lockstep runs libaio on io_uring, so both take 32768.
//! - lockstep's psync runs one pread/pwrite thread per IO in flight (fio's psync has one IO in
//!   flight whatever the depth), so its depth is bounded by what a thread per IO can mean.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use crate::job::EngineKind;

/// Clones (`numjobs`, summed over every job of a run) fio will run: its `REAL_MAX_JOBS`.
pub const MAX_JOBS: u32 = 4096;

/// The deepest queue fio runs with any engine: libaio with the default `fs.aio-max-nr`.
pub const MAX_IODEPTH: u32 = 65536;

/// io_uring's ring size limit (the kernel's `IORING_MAX_ENTRIES`); fio's io_uring engine fails
/// above it, and lockstep's io_uring and libaio (run on io_uring) share it.
pub const MAX_URING_DEPTH: u32 = 32768;

/// Worker threads of the pread/pwrite engine per clone (one per IO in flight). More threads
/// than this measure the scheduler rather than the device; io_uring is the engine for deep
/// queues.
pub const MAX_SYNC_WORKERS: u32 = 256;

/// Largest job file, include or plan file read. Real ones are a few KiB; a file this big is a
/// mistake (or `/dev/zero` behind a symlink) and is refused before it is read into memory.
pub const MAX_TEXT_FILE: u64 = 1 << 20;

/// Checks one job's `numjobs` on its own. `None` when it is within fio's limit.
pub fn numjobs_problem(numjobs: u32) -> Option<String> {
    (numjobs > MAX_JOBS).then(|| {
        format!(
            "at most {MAX_JOBS} clones (fio refuses more jobs than its REAL_MAX_JOBS, \
             {MAX_JOBS}); lower numjobs"
        )
    })
}

/// Checks the clones of a whole job file (`total` so far, this job's included).
pub fn total_jobs_problem(total: u64) -> Option<String> {
    (total > MAX_JOBS as u64).then(|| {
        format!(
            "the job file asks for {total} clones in all; fio runs at most {MAX_JOBS} (its \
             REAL_MAX_JOBS); lower numjobs or split the job file"
        )
    })
}

/// The deepest queue `engine` can run, and why.
pub fn max_depth(engine: EngineKind) -> (u32, &'static str) {
    match engine {
        EngineKind::IoUring | EngineKind::Libaio => (
            MAX_URING_DEPTH,
            "the kernel's io_uring ring limit, IORING_MAX_ENTRIES; fio fails above it too",
        ),
        EngineKind::Psync => (
            MAX_SYNC_WORKERS,
            "lockstep's psync runs one pread/pwrite thread per IO in flight; use \
             ioengine=io_uring for deeper queues",
        ),
        EngineKind::Null => (
            MAX_IODEPTH,
            "the deepest queue fio runs, libaio with the default fs.aio-max-nr",
        ),
    }
}

/// Checks `iodepth` against fio's overall limit and then the engine's. `None` when it is fine.
pub fn iodepth_problem(engine: EngineKind, iodepth: u32) -> Option<String> {
    if iodepth > MAX_IODEPTH {
        return Some(format!(
            "at most {MAX_IODEPTH} (the deepest queue fio runs, libaio with the default \
             fs.aio-max-nr); lower iodepth"
        ));
    }
    let (max, why) = max_depth(engine);
    (iodepth > max).then(|| {
        format!(
            "at most {max} with ioengine={} ({why}); lower iodepth",
            engine.fio_name()
        )
    })
}

/// Why a small text file (job file, include, plan) cannot be used. Messages follow
/// "PATH: cannot read ...: " and say what would be accepted.
#[derive(Debug, thiserror::Error)]
pub enum TextFileError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}, not a regular file (give a regular file of at most {MAX_TEXT_FILE} bytes)")]
    NotRegular(&'static str),
    #[error("{size} bytes, more than the {max} a {what} may have")]
    TooLarge {
        size: u64,
        max: u64,
        what: &'static str,
    },
    #[error("not UTF-8 text")]
    NotText,
}

/// Reads a small regular file: `what` ("job file", "plan") names it in messages. Opened
/// non-blocking, so a FIFO with no writer is refused at once rather than waited on, and checked
/// on the open descriptor, so what is read is what was checked. Reads at most `max` bytes even
/// if the file grows meanwhile.
pub fn read_text_file(path: &Path, max: u64, what: &'static str) -> Result<String, TextFileError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let meta = file.metadata()?;
    let kind = meta.file_type();
    let not_regular = if kind.is_dir() {
        Some("a directory")
    } else if kind.is_char_device() {
        Some("a character device")
    } else if kind.is_block_device() {
        Some("a block device")
    } else if kind.is_fifo() {
        Some("a FIFO")
    } else if kind.is_socket() {
        Some("a socket")
    } else {
        None
    };
    if let Some(kind) = not_regular {
        return Err(TextFileError::NotRegular(kind));
    }
    let too_large = |size| TextFileError::TooLarge { size, max, what };
    if meta.len() > max {
        return Err(too_large(meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(too_large(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|_| TextFileError::NotText)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numjobs_limits() {
        assert_eq!(numjobs_problem(4096), None);
        assert!(numjobs_problem(4097).unwrap().contains("at most 4096"));
        assert_eq!(total_jobs_problem(4096), None);
        assert!(
            total_jobs_problem(4097)
                .unwrap()
                .contains("4097 clones in all")
        );
    }

    #[test]
    fn depth_limits_per_engine() {
        use EngineKind::*;
        for (engine, max) in [
            (IoUring, 32768),
            (Libaio, 32768),
            (Psync, 256),
            (Null, 65536),
        ] {
            assert_eq!(iodepth_problem(engine, max), None, "{engine:?}");
            let e = iodepth_problem(engine, max + 1).unwrap();
            assert!(e.starts_with("at most "), "{e}");
        }
        assert!(
            iodepth_problem(Null, 100_000)
                .unwrap()
                .starts_with("at most 65536 (")
        );
    }

    #[test]
    fn text_files() {
        let dir = tempfile::tempdir().unwrap();
        let ok = dir.path().join("ok.fio");
        std::fs::write(&ok, "[j]\n").unwrap();
        assert_eq!(read_text_file(&ok, 16, "job file").unwrap(), "[j]\n");
        let e = read_text_file(&ok, 3, "job file").unwrap_err().to_string();
        assert_eq!(e, "4 bytes, more than the 3 a job file may have");
        let e = read_text_file(Path::new("/dev/zero"), 16, "job file").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("a character device, not a regular file")
        );
        let e = read_text_file(dir.path(), 16, "job file").unwrap_err();
        assert!(e.to_string().starts_with("a directory"));
        let bin = dir.path().join("bin");
        std::fs::write(&bin, [0xff, 0xfe]).unwrap();
        assert_eq!(
            read_text_file(&bin, 16, "plan").unwrap_err().to_string(),
            "not UTF-8 text"
        );
        let e = read_text_file(&dir.path().join("none"), 16, "plan").unwrap_err();
        assert!(matches!(e, TextFileError::Io(_)));
    }
}
