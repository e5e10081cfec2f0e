//! The backup's side of a mirror: the `Mirror` call writes each of a primary's writes to a
//! mirror file inside the named volume and acknowledges it, in order.
//!
//! The file is opened as every job's file is (beneath the volume's root, no link followed,
//! `crate::confine`), named after the run and the primary, and removed when the stream ends:
//! its content is the load, not data anyone reads back. Writes are done one at a time on a
//! blocking thread, in the order they came, which is what a mirror applying a journal does.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use lockstep_proto::v1::{MirrorAck, MirrorWrite};
use tokio::sync::mpsc;
use tonic::Status;

use crate::confine::Scope;

/// The mirror file's name: the run and the primary, reduced to characters safe in a file name
/// (a run id may hold anything, even a NUL).
pub fn mirror_file_name(run_id: &str, primary: &str) -> String {
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
    format!(
        "lockstep-mirror.{}.{}.dat",
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

/// The open mirror file of one stream.
struct MirrorFile {
    scope: Scope,
    path: PathBuf,
    file: std::fs::File,
}

impl MirrorFile {
    fn open(volumes: &[MirrorVolume], first: &MirrorWrite) -> Result<MirrorFile, Status> {
        let vol = volumes
            .iter()
            .find(|v| v.name == first.volume)
            .ok_or_else(|| {
                Status::not_found(format!(
                    "mirror: this agent has no volume '{}'",
                    first.volume
                ))
            })?;
        if !vol.path.is_dir() {
            return Err(Status::failed_precondition(format!(
                "mirror: volume '{}' is a file or device ({}); a mirror file needs a directory volume",
                vol.name,
                vol.path.display()
            )));
        }
        let scope = Scope::Beneath(vol.path.clone());
        let path = vol
            .path
            .join(mirror_file_name(&first.run_id, &first.primary));
        let file = scope
            .open(&path, libc::O_RDWR | libc::O_CREAT, 0o600)
            .map_err(|e| Status::failed_precondition(format!("mirror: {}: {e}", path.display())))?;
        Ok(MirrorFile { scope, path, file })
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
}

impl Drop for MirrorFile {
    fn drop(&mut self) {
        let _ = self.scope.remove(&self.path);
    }
}

/// Serves one `Mirror` stream: writes, in order, each acknowledged. `refused` is asked about
/// each message before it is written, so a `cut_off` fault breaks a mirror stream too, and
/// over TLS a write whose primary is not the caller's certificate is refused (the daemon's
/// `peer` rules).
pub async fn serve_stream(
    volumes: Arc<Vec<MirrorVolume>>,
    mut incoming: tonic::Streaming<MirrorWrite>,
    acks: mpsc::Sender<Result<MirrorAck, Status>>,
    refused: impl Fn(&MirrorWrite) -> Option<Status>,
) {
    let mut file: Option<Arc<MirrorFile>> = None;
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
        if file.is_none() {
            match MirrorFile::open(&volumes, &w) {
                Ok(f) => file = Some(Arc::new(f)),
                Err(s) => {
                    let _ = acks.send(Err(s)).await;
                    return;
                }
            }
        }
        let ack = if w.len == 0 {
            // A probe: the backup is there.
            MirrorAck {
                seq: w.seq,
                ..MirrorAck::default()
            }
        } else {
            let f = file.clone().expect("opened above");
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
pub fn mirror_file_path(volume: &Path, run_id: &str, primary: &str) -> PathBuf {
    volume.join(mirror_file_name(run_id, primary))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mirror_file_name_keeps_only_safe_characters() {
        assert_eq!(
            mirror_file_name("run-1", "agent-1/data"),
            "lockstep-mirror.run-1.agent-1.data.dat"
        );
        let n = mirror_file_name("../x\0y", "a/../../b");
        assert!(!n.contains('/') && !n.contains('\0'), "{n}");
    }
}
