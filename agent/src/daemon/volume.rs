//! Volumes an agent may test, as given on its command line, and the confinement of jobs to them.
//!
//! A job that arrives over the network never chooses its own targets: the agent points it at the
//! volume (`directory=` for a directory volume, `filename=` for a file or device volume) and
//! refuses any `filename=`/`directory=` that would leave the volume.

use std::path::{Component, Path, PathBuf};

use crate::confine::Scope;
use crate::job::JobSpec;

#[derive(Debug, Clone, PartialEq)]
pub struct VolumeConfig {
    pub name: String,
    pub path: PathBuf,
    pub size_bytes: u64,
    /// gp2, gp3, io1, io2, st1, sc1, local, or empty.
    pub kind: String,
    pub provisioned_iops: u64,
    pub provisioned_mib_s: u64,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum VolumeError {
    #[error("--volume '{0}': expected NAME=PATH[,size=60g,kind=gp2,iops=3000,mibs=125]")]
    Syntax(String),
    #[error("--volume '{spec}': {why}")]
    Bad { spec: String, why: String },
    #[error(
        "volume '{volume}': job '{job}' names {what}={path}, which is outside the volume ({root}); remove it, the agent points jobs at their volume itself"
    )]
    Escapes {
        volume: String,
        job: String,
        what: &'static str,
        path: String,
        root: String,
    },
}

impl std::str::FromStr for VolumeConfig {
    type Err = VolumeError;
    fn from_str(spec: &str) -> Result<Self, VolumeError> {
        let (name, rest) = spec
            .split_once('=')
            .ok_or_else(|| VolumeError::Syntax(spec.into()))?;
        let mut parts = rest.split(',');
        let path = parts
            .next()
            .filter(|p| !p.is_empty())
            .ok_or_else(|| VolumeError::Syntax(spec.into()))?;
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(VolumeError::Bad {
                spec: spec.into(),
                why: "the name must be letters, digits, '-', '_' or '.'".into(),
            });
        }
        let mut v = VolumeConfig {
            name: name.into(),
            path: PathBuf::from(path),
            size_bytes: 0,
            kind: String::new(),
            provisioned_iops: 0,
            provisioned_mib_s: 0,
        };
        for kv in parts {
            let bad = |why: String| VolumeError::Bad {
                spec: spec.into(),
                why,
            };
            let (k, val) = kv
                .split_once('=')
                .ok_or_else(|| bad(format!("'{kv}' is not key=value")))?;
            let num = |val: &str| -> Result<u64, VolumeError> {
                crate::units::parse_size(val, crate::units::KbBase::K1024)
                    .map_err(|e| bad(format!("{k}={val}: {e}")))
            };
            match k {
                "size" => v.size_bytes = num(val)?,
                "kind" => {
                    const KINDS: [&str; 7] = ["gp2", "gp3", "io1", "io2", "st1", "sc1", "local"];
                    if !KINDS.contains(&val) {
                        return Err(bad(format!(
                            "kind={val}: expected one of {}",
                            KINDS.join(", ")
                        )));
                    }
                    v.kind = val.into();
                }
                "iops" => v.provisioned_iops = num(val)?,
                "mibs" => v.provisioned_mib_s = num(val)?,
                other => {
                    return Err(bad(format!(
                        "unknown key '{other}' (size, kind, iops, mibs)"
                    )));
                }
            }
        }
        Ok(v)
    }
}

impl VolumeConfig {
    /// Checks the volume exists now, so a typo fails at start-up rather than mid-run.
    pub fn check(&self) -> Result<(), VolumeError> {
        std::fs::metadata(&self.path)
            .map(|_| ())
            .map_err(|e| VolumeError::Bad {
                spec: format!("{}={}", self.name, self.path.display()),
                why: format!("{e}"),
            })
    }

    /// Points `job` at this volume and refuses targets outside it.
    pub fn confine(&self, job: &mut JobSpec) -> Result<(), VolumeError> {
        let escapes = |what: &'static str, p: &Path| VolumeError::Escapes {
            volume: self.name.clone(),
            job: job.name.clone(),
            what,
            path: p.display().to_string(),
            root: self.path.display().to_string(),
        };
        let is_dir = self.path.is_dir();
        for d in &job.directories {
            if !inside(&self.path, d) {
                return Err(escapes("directory", d));
            }
        }
        if is_dir {
            for f in &job.filenames {
                if f.is_absolute() && !inside(&self.path, f)
                    || !clean_relative(f) && !f.is_absolute()
                {
                    return Err(escapes("filename", f));
                }
            }
            // Every path is spelled from the volume's root as given, so the opens beneath it
            // (see `confine`) can take it apart again.
            job.filenames = job.filenames.iter().map(|f| self.respell(f)).collect();
            // A relative directory means the volume itself, also beside an absolute one
            // (`directory=/vol:.`): left as it was, it would resolve against the agent's
            // working directory.
            let mut dirs: Vec<PathBuf> = Vec::new();
            for d in &job.directories {
                let d = if d.is_absolute() {
                    self.respell(d)
                } else {
                    self.path.clone()
                };
                if !dirs.contains(&d) {
                    dirs.push(d);
                }
            }
            if dirs.is_empty() {
                dirs.push(self.path.clone());
            }
            job.directories = dirs;
            job.scope = Scope::Beneath(self.path.clone());
        } else {
            for f in &job.filenames {
                if f != &self.path {
                    return Err(escapes("filename", f));
                }
            }
            job.filenames = vec![self.path.clone()];
            job.directories.clear();
            job.nrfiles = 1;
            job.scope = Scope::Exact(self.path.clone());
        }
        Ok(())
    }

    /// `p` (already checked to be inside) as the volume's path joined with the rest.
    fn respell(&self, p: &Path) -> PathBuf {
        if !p.is_absolute() {
            return self.path.join(p);
        }
        if p.starts_with(&self.path) {
            return p.to_path_buf();
        }
        let canon = self
            .path
            .canonicalize()
            .unwrap_or_else(|_| self.path.clone());
        match p.strip_prefix(&canon) {
            Ok(rest) => self.path.join(rest),
            Err(_) => p.to_path_buf(),
        }
    }
}

/// A relative path without `..` or root components.
fn clean_relative(p: &Path) -> bool {
    p.components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

/// Whether `p` lies inside `root` (lexically, after resolving `root` itself).
fn inside(root: &Path, p: &Path) -> bool {
    if !p.is_absolute() {
        return clean_relative(p);
    }
    let root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    let p = p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    p.starts_with(&root) && p.components().all(|c| !matches!(c, Component::ParentDir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::Origin;
    use proptest::prelude::*;

    /// Path pieces a job's `directory=`/`filename=` may be made of, against the volume `vol`.
    fn path_piece(vol: String) -> impl Strategy<Value = PathBuf> {
        prop_oneof![
            prop::sample::select(vec![
                ".",
                "..",
                "sub",
                "./sub",
                "sub/..",
                "../x",
                "/",
                "/tmp",
                "/etc/passwd",
                "a/b",
                "",
                "f.dat",
            ])
            .prop_map(PathBuf::from),
            prop::sample::select(vec!["", "/sub", "/..", "/../x", "/./f", "/sub/../.."])
                .prop_map(move |tail| PathBuf::from(format!("{vol}{tail}"))),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Whatever a job names, once confined every directory and file it will use is an
        /// absolute path inside the volume (the fuzz property for confinement: a relative
        /// path left in place would resolve against the agent's working directory).
        #[test]
        fn confined_jobs_only_name_paths_inside_the_volume(
            dirs in prop::collection::vec(path_piece("VOL".into()), 0..3),
            files in prop::collection::vec(path_piece("VOL".into()), 0..3),
        ) {
            let root = tempfile::tempdir().unwrap();
            let vol_path = root.path().join("vol");
            std::fs::create_dir_all(vol_path.join("sub")).unwrap();
            let real = |p: &PathBuf| {
                PathBuf::from(p.display().to_string().replacen("VOL", &vol_path.display().to_string(), 1))
            };
            let v = VolumeConfig {
                name: "data".into(),
                path: vol_path.clone(),
                size_bytes: 0,
                kind: String::new(),
                provisioned_iops: 0,
                provisioned_mib_s: 0,
            };
            let mut job = JobSpec::with_defaults("j", Origin::default());
            job.directories = dirs.iter().map(real).collect();
            job.filenames = files.iter().map(real).collect();
            if v.confine(&mut job).is_ok() {
                let canon_root = vol_path.canonicalize().unwrap();
                let inside_root = |p: &Path| {
                    p.is_absolute()
                        && p.components().all(|c| !matches!(c, Component::ParentDir))
                        && p.canonicalize().map_or(p.starts_with(&vol_path), |c| c.starts_with(&canon_root))
                };
                for d in &job.directories {
                    prop_assert!(inside_root(d), "directory {} escapes {}", d.display(), vol_path.display());
                }
                for f in &job.filenames {
                    prop_assert!(inside_root(f), "filename {} escapes {}", f.display(), vol_path.display());
                }
            }
        }
    }

    #[test]
    fn parses_volume_specs() {
        let v: VolumeConfig = "data=/mnt/d,size=60g,kind=gp2,iops=180".parse().unwrap();
        assert_eq!(v.name, "data");
        assert_eq!(v.path, PathBuf::from("/mnt/d"));
        assert_eq!(v.size_bytes, 60 << 30);
        assert_eq!(v.kind, "gp2");
        assert_eq!(v.provisioned_iops, 180);
        assert!(matches!(
            "data".parse::<VolumeConfig>(),
            Err(VolumeError::Syntax(_))
        ));
        let e = "d=/x,kind=gp9"
            .parse::<VolumeConfig>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("kind=gp9") && e.contains("gp3"), "{e}");
        assert!("d=/x,colour=red".parse::<VolumeConfig>().is_err());
    }

    /// `--local` agents are given volumes relative to their working directory.
    #[test]
    fn a_relative_volume_path_is_used_as_given() {
        let dir = tempfile::tempdir_in(".").unwrap();
        let rel = PathBuf::from(dir.path().file_name().unwrap());
        let v = VolumeConfig {
            name: "data".into(),
            path: rel.clone(),
            size_bytes: 0,
            kind: String::new(),
            provisioned_iops: 0,
            provisioned_mib_s: 0,
        };
        let mut job = JobSpec::with_defaults("j", Origin::default());
        v.confine(&mut job).unwrap();
        assert_eq!(job.directories, vec![rel.clone()]);
        assert_eq!(job.scope, Scope::Beneath(rel));
    }

    #[test]
    fn confines_jobs_to_the_volume() {
        let dir = tempfile::tempdir().unwrap();
        let v = VolumeConfig {
            name: "data".into(),
            path: dir.path().to_path_buf(),
            size_bytes: 0,
            kind: String::new(),
            provisioned_iops: 0,
            provisioned_mib_s: 0,
        };
        let mut job = JobSpec::with_defaults("j", Origin::default());
        v.confine(&mut job).unwrap();
        assert_eq!(job.directories, vec![dir.path().to_path_buf()]);

        let mut job = JobSpec::with_defaults("j", Origin::default());
        job.filenames = vec![PathBuf::from("/etc/passwd")];
        let e = v.confine(&mut job).unwrap_err().to_string();
        assert!(
            e.contains("/etc/passwd") && e.contains("outside the volume"),
            "{e}"
        );

        let mut job = JobSpec::with_defaults("j", Origin::default());
        job.filenames = vec![PathBuf::from("../escape")];
        assert!(v.confine(&mut job).is_err());

        let mut job = JobSpec::with_defaults("j", Origin::default());
        job.directories = vec![PathBuf::from("/tmp/elsewhere-lockstep")];
        assert!(v.confine(&mut job).is_err());

        // Found by the confinement property: a relative directory beside an absolute one
        // was kept, so `directory=VOL:.` laid files out in the agent's working directory.
        let mut job = JobSpec::with_defaults("j", Origin::default());
        job.directories = vec![dir.path().to_path_buf(), PathBuf::from(".")];
        v.confine(&mut job).unwrap();
        assert_eq!(job.directories, vec![dir.path().to_path_buf()]);

        let mut job = JobSpec::with_defaults("j", Origin::default());
        job.filenames = vec![PathBuf::from("sub.dat")];
        v.confine(&mut job).unwrap();
        assert_eq!(job.filenames, vec![dir.path().join("sub.dat")]);
    }
}
