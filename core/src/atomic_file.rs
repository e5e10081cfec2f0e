//! Atomic replacement of output files (reports, results), shared by the agent's
//! `lockstep-agent run --output` and the coordinator's results directory.

use std::io::Write;
use std::path::Path;

/// Writes to a temporary file beside `path` and renames it into place, so a reader never sees
/// half a report and an existing report is not destroyed by a failed write. A character device
/// or FIFO at `path` is written into instead (renaming over `/dev/null` would break the host);
/// any other non-regular file is refused. The temporary file is created new (`O_EXCL`), never
/// through a link someone left in its place.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    if let Ok(m) = std::fs::metadata(path) {
        let t = m.file_type();
        if t.is_char_device() || t.is_fifo() {
            let mut f = std::fs::OpenOptions::new().write(true).open(path)?;
            return f.write_all(bytes);
        }
        if !t.is_file() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "{} is not a regular file; lockstep never replaces it",
                    path.display()
                ),
            ));
        }
    }
    let dir = parent_dir(path);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o644)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn parent_dir(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_a_file_and_leaves_no_temporary_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.json");
        std::fs::write(&path, "old").unwrap();
        write_atomically(&path, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn refuses_a_directory_in_the_way() {
        let dir = tempfile::tempdir().unwrap();
        let err = write_atomically(dir.path(), b"x").unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    }
}
