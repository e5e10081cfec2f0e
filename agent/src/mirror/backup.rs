//! The backup's side of a mirror: the `Mirror` call writes each of a primary's writes to a
//! mirror file inside the named volume and acknowledges it, in order.
//!
//! The files are opened as every job's file is (beneath the volume's root, no link followed,
//! `crate::confine`), one per file of the primary, named after the run, the primary and its
//! file, so the backup's copy is the primary's file block for block. A file outlives the stream
//! that opened it: a primary whose stream broke (a `cut_off`, a paused backup it gave up on)
//! comes back on a new stream and catches the same file up. It is removed when the primary says
//! it is done with it (unless the run keeps its files), or `ORPHAN_AFTER` after its last stream
//! ended if the primary never says so (it died). Writes are done one at a time on a blocking
//! thread, in the order they came, which is what a mirror applying a journal does.

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use lockstep_proto::v1::{MirrorAck, MirrorWrite};
use tokio::sync::mpsc;
use tonic::Status;

use crate::confine::Scope;

/// How long a mirror file no stream uses stays, waiting for its primary to come back.
const ORPHAN_AFTER: Duration = Duration::from_secs(60);

/// The mirror files open on this agent, by path, shared by the streams that write them. A
/// process-wide table (one agent per process) so the daemon's `Mirror` handler stays as it is.
static OPEN: LazyLock<Mutex<HashMap<PathBuf, Arc<MirrorFile>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The mirror file's name: the run, the primary and the primary's file, reduced to characters
/// safe in a file name (a run id may hold anything, even a NUL).
pub fn mirror_file_name(run_id: &str, primary: &str, file: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .take(64)
            .collect()
    };
    let file = if file.is_empty() {
        String::new()
    } else {
        format!(".{}", clean(file))
    };
    format!(
        "lockstep-mirror.{}.{}{file}.dat",
        clean(run_id),
        clean(&primary.replace('/', "."))
    )
}

/// A volume this agent may write mirror files into: its name as plans give it and its root.
/// Its own type, not the daemon's volume configuration, so the mirror does not depend on the
/// daemon that serves it.
#[derive(Debug, Clone)]
pub struct MirrorVolume {
    pub name: String,
    pub path: PathBuf,
}

/// An open mirror file, shared by the streams that write it.
struct MirrorFile {
    scope: Scope,
    path: PathBuf,
    /// The exact (run, primary, file) it mirrors. The name reduces these to safe characters and
    /// 64 of them per part, so two primaries can map to one name (`a1` writing file `x.data.f`
    /// and `a1.x` writing `data`'s `f`): only the owner may write, end or remove it.
    owner: String,
    file: std::fs::File,
    /// Streams using it now, and how many ever attached (an orphan's removal checks both).
    streams: AtomicUsize,
    attached: AtomicU64,
}

/// Where a stream's messages go: the volume's directory.
fn volume_of<'a>(volumes: &'a [MirrorVolume], w: &MirrorWrite) -> Result<&'a MirrorVolume, Status> {
    let vol = volumes.iter().find(|v| v.name == w.volume).ok_or_else(|| {
        Status::not_found(format!("mirror: this agent has no volume '{}'", w.volume))
    })?;
    if !vol.path.is_dir() {
        return Err(Status::failed_precondition(format!(
            "mirror: volume '{}' is a file or device ({}); a mirror file needs a directory volume",
            vol.name,
            vol.path.display()
        )));
    }
    Ok(vol)
}

/// Who a write says it mirrors, exactly (see `MirrorFile::owner`).
fn owner_of(w: &MirrorWrite) -> String {
    format!("{}\0{}\0{}", w.run_id, w.primary, w.file)
}

impl MirrorFile {
    /// The file of `w` for a stream: the one already open (another stream of the same primary
    /// wrote it before), or opened now.
    fn attach(vol: &MirrorVolume, w: &MirrorWrite) -> Result<Arc<MirrorFile>, Status> {
        let path = vol
            .path
            .join(mirror_file_name(&w.run_id, &w.primary, &w.file));
        let owner = owner_of(w);
        let mut open = OPEN.lock().unwrap();
        let f = match open.get(&path) {
            Some(f) if f.owner != owner => {
                return Err(Status::permission_denied(format!(
                    "mirror: {} is already the mirror file of another primary; primary '{}' \
                     file '{}' maps to the same name (names are reduced to safe characters)",
                    path.display(),
                    w.primary,
                    w.file
                )));
            }
            Some(f) => f.clone(),
            None => {
                let scope = Scope::Beneath(vol.path.clone());
                let file = scope
                    .open(&path, libc::O_RDWR | libc::O_CREAT, 0o600)
                    .map_err(|e| {
                        Status::failed_precondition(format!("mirror: {}: {e}", path.display()))
                    })?;
                let f = Arc::new(MirrorFile {
                    scope,
                    path: path.clone(),
                    owner,
                    file,
                    streams: AtomicUsize::new(0),
                    attached: AtomicU64::new(0),
                });
                open.insert(path, f.clone());
                f
            }
        };
        f.streams.fetch_add(1, Ordering::Relaxed);
        f.attached.fetch_add(1, Ordering::Relaxed);
        Ok(f)
    }

    /// Writes one mirrored write; its duration is the "remote write" of the breakdown.
    fn write(&self, w: &MirrorWrite) -> MirrorAck {
        let t = Instant::now();
        let error = match self.file.write_all_at(&w.data, w.offset) {
            Ok(()) => String::new(),
            Err(e) => format!("{}: {e}", self.path.display()),
        };
        MirrorAck {
            seq: w.seq,
            remote_write_ns: t.elapsed().as_nanos() as u64,
            error,
        }
    }

    /// Closes the file and removes it (unless `keep`), if the table holds it for `owner`
    /// (`None`: whoever owns it).
    fn forget(path: &Path, owner: Option<&str>, keep: bool) {
        let f = {
            let mut open = OPEN.lock().unwrap();
            match open.get(path) {
                Some(f) if owner.is_none_or(|o| o == f.owner) => open.remove(path),
                _ => None,
            }
        };
        if let Some(f) = f.filter(|_| !keep) {
            let _ = f.scope.remove(&f.path);
        }
    }

    /// A stream using it ended: with no stream left and none attaching within
    /// `ORPHAN_AFTER`, the primary is not coming back and the file goes.
    fn detach(self: Arc<Self>, orphan_after: Duration) {
        if self.streams.fetch_sub(1, Ordering::Relaxed) != 1 {
            return;
        }
        let seen = self.attached.load(Ordering::Relaxed);
        tokio::spawn(async move {
            tokio::time::sleep(orphan_after).await;
            // Checked and taken out of the table under its lock: an attach in between would
            // otherwise get the file just before it is removed.
            let orphan = {
                let mut open = OPEN.lock().unwrap();
                let unused = self.streams.load(Ordering::Relaxed) == 0
                    && self.attached.load(Ordering::Relaxed) == seen;
                let current = open.get(&self.path).is_some_and(|f| Arc::ptr_eq(f, &self));
                (unused && current)
                    .then(|| open.remove(&self.path))
                    .flatten()
            };
            if let Some(f) = orphan {
                let _ = f.scope.remove(&f.path);
            }
        });
    }
}

/// Serves one `Mirror` stream: writes, in order, each acknowledged. `refused` is asked about
/// each message before it is written, so a `cut_off` fault breaks a mirror stream too, and
/// over TLS a write whose primary is not the caller's certificate is refused (the daemon's
/// `peer` rules).
pub async fn serve_stream(
    volumes: Arc<Vec<MirrorVolume>>,
    incoming: tonic::Streaming<MirrorWrite>,
    acks: mpsc::Sender<Result<MirrorAck, Status>>,
    refused: impl Fn(&MirrorWrite) -> Option<Status>,
) {
    let mut files: HashMap<String, Arc<MirrorFile>> = HashMap::new();
    serve_messages(&volumes, incoming, &acks, refused, &mut files).await;
    for (_, f) in files {
        f.detach(ORPHAN_AFTER);
    }
}

async fn serve_messages(
    volumes: &[MirrorVolume],
    mut incoming: tonic::Streaming<MirrorWrite>,
    acks: &mpsc::Sender<Result<MirrorAck, Status>>,
    refused: impl Fn(&MirrorWrite) -> Option<Status>,
    files: &mut HashMap<String, Arc<MirrorFile>>,
) {
    loop {
        let w = match incoming.message().await {
            Ok(Some(w)) => w,
            Ok(None) | Err(_) => return,
        };
        if let Some(status) = refused(&w) {
            let _ = acks.send(Err(status)).await;
            return;
        }
        if w.protocol_version != lockstep_proto::PROTOCOL_VERSION {
            let _ = acks
                .send(Err(Status::failed_precondition(
                    lockstep_proto::version_mismatch(
                        lockstep_proto::PROTOCOL_VERSION,
                        w.protocol_version,
                        "agent",
                    ),
                )))
                .await;
            return;
        }
        let vol = match volume_of(volumes, &w) {
            Ok(v) => v,
            Err(s) => {
                let _ = acks.send(Err(s)).await;
                return;
            }
        };
        let ack = if w.end {
            // The primary is done with this file.
            let path = vol
                .path
                .join(mirror_file_name(&w.run_id, &w.primary, &w.file));
            if let Some(f) = files.remove(&w.file) {
                f.streams.fetch_sub(1, Ordering::Relaxed);
            }
            MirrorFile::forget(&path, Some(&owner_of(&w)), w.keep);
            MirrorAck {
                seq: w.seq,
                ..MirrorAck::default()
            }
        } else if w.len == 0 {
            // A probe: the backup is there.
            MirrorAck {
                seq: w.seq,
                ..MirrorAck::default()
            }
        } else {
            let f = match files.get(&w.file) {
                Some(f) => f.clone(),
                None => match MirrorFile::attach(vol, &w) {
                    Ok(f) => {
                        files.insert(w.file.clone(), f.clone());
                        f
                    }
                    Err(s) => {
                        let _ = acks.send(Err(s)).await;
                        return;
                    }
                },
            };
            let seq = w.seq;
            match tokio::task::spawn_blocking(move || f.write(&w)).await {
                Ok(a) => a,
                Err(e) => MirrorAck {
                    seq,
                    remote_write_ns: 0,
                    error: e.to_string(),
                },
            }
        };
        if acks.send(Ok(ack)).await.is_err() {
            return;
        }
    }
}

/// The mirror file's path in a volume (for tests and clean-up checks).
pub fn mirror_file_path(volume: &Path, run_id: &str, primary: &str, file: &str) -> PathBuf {
    volume.join(mirror_file_name(run_id, primary, file))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backup volume `data` in a directory of its own (kept while the guard lives).
    fn data_volume() -> (tempfile::TempDir, MirrorVolume) {
        let dir = tempfile::tempdir().unwrap();
        let vol = MirrorVolume {
            name: "data".into(),
            path: dir.path().to_path_buf(),
        };
        (dir, vol)
    }

    /// A file no stream uses goes after the orphan delay, unless a stream came back for it.
    #[tokio::test]
    async fn an_orphaned_mirror_file_goes_unless_its_primary_comes_back() {
        let (_dir, vol) = data_volume();
        let w = |run: &str| MirrorWrite {
            run_id: run.into(),
            primary: "a/data".into(),
            file: "p.0.0".into(),
            ..MirrorWrite::default()
        };
        let short = Duration::from_millis(50);
        let gone = MirrorFile::attach(&vol, &w("orphan")).unwrap();
        let back = MirrorFile::attach(&vol, &w("back")).unwrap();
        let (p1, p2) = (gone.path.clone(), back.path.clone());
        gone.detach(short);
        back.clone().detach(short);
        // The primary of "back" returns on a new stream before the delay is over.
        let again = MirrorFile::attach(&vol, &w("back")).unwrap();
        assert!(Arc::ptr_eq(&again, &back), "the same open file");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!p1.exists(), "the orphan is removed");
        assert!(p2.exists(), "the file its primary came back for stays");
        MirrorFile::forget(&p2, None, false);
        assert!(!p2.exists());
    }

    /// Two primaries whose names reduce to one file name: the second can neither write into
    /// the first one's file nor end (remove) it.
    #[tokio::test]
    async fn a_primary_cannot_take_over_a_colliding_mirror_file() {
        let (_dir, vol) = data_volume();
        let w = |primary: &str, file: &str| MirrorWrite {
            run_id: "collide".into(),
            primary: primary.into(),
            file: file.into(),
            ..MirrorWrite::default()
        };
        let victim = w("a1.x/data", "f");
        let intruder = w("a1", "x.data.f");
        let f = MirrorFile::attach(&vol, &victim).unwrap();
        assert_eq!(
            mirror_file_name("collide", &intruder.primary, &intruder.file),
            f.path.file_name().unwrap().to_str().unwrap(),
            "the two names collide"
        );
        let refused = MirrorFile::attach(&vol, &intruder).err().expect("refused");
        assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
        MirrorFile::forget(&f.path, Some(&owner_of(&intruder)), false);
        assert!(f.path.exists(), "another primary's end does not remove it");
        assert!(OPEN.lock().unwrap().contains_key(&f.path));
        MirrorFile::forget(&f.path, Some(&owner_of(&victim)), false);
        assert!(!f.path.exists(), "its own primary's end does");
    }

    #[test]
    fn a_mirror_file_name_keeps_only_safe_characters() {
        assert_eq!(
            mirror_file_name("run-1", "agent-1/data", ""),
            "lockstep-mirror.run-1.agent-1.data.dat"
        );
        assert_eq!(
            mirror_file_name("run-1", "agent-1/data", "primary.0.0"),
            "lockstep-mirror.run-1.agent-1.data.primary.0.0.dat"
        );
        let n = mirror_file_name("../x\0y", "a/../../b", "../c");
        assert!(!n.contains('/') && !n.contains('\0'), "{n}");
    }
}
