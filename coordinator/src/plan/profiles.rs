//! Built-in workload profiles: the workloads of the field scenarios
//! (docs/domain.md#field-scenarios), as fio job text.
//!
//! A plan's role says `workload = { profile = "oltp-8k" }` instead of carrying a job file. Each
//! profile is ordinary fio job text, so `lockstep profiles` output (or this file) can be copied
//! into a job file and run by fio itself. Two rules hold for every profile:
//! - no `directory=` or `filename=`: the agent points every job at the volume the plan assigns;
//! - a modest `size=` (at most 512 MiB per volume), so `lockstep run --local 4` fits on a laptop.
//!   Size them up for a real cluster with the role's `set = { size = "100g" }`.
//!
//! Run time is not part of a profile: the plan's phases decide it (lockstep sets `time_based=1`
//! and `runtime=` on every job).

/// One built-in workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Profile {
    /// The name a plan uses (`profile = "..."`); also the job's section name.
    pub name: &'static str,
    /// One line for listings and reports.
    pub summary: &'static str,
    /// fio job text: a `[global]` section and one job section named after the profile.
    pub job: &'static str,
}

/// All built-in profiles, in the order listings show them.
pub const PROFILES: &[Profile] = &[
    Profile {
        name: "oltp-8k",
        summary: "OLTP database pages: random 70/30 read/write, 8 KiB, queue depth 16",
        job: "\
; OLTP database: most transactional applications read and write pages at random, 70:30.
[global]
ioengine=io_uring
direct=1
size=256m
time_based=1

[oltp-8k]
rw=randrw
rwmixread=70
bs=8k
iodepth=16
",
    },
    Profile {
        name: "seq-write-256k",
        summary: "sequential 256 KiB writes, queue depth 8 (Alteryx staging, st1 throughput)",
        job: "\
; Sequential large writes, like an Alteryx worker staging data: on st1/sc1 volumes this is
; the load that drains throughput credits.
[global]
ioengine=io_uring
direct=1
size=256m
time_based=1

[seq-write-256k]
rw=write
bs=256k
iodepth=8
",
    },
    Profile {
        name: "seq-read-1m",
        summary: "sequential 1 MiB reads, queue depth 8 (scans, backups, throughput ceilings)",
        job: "\
; Sequential 1 MiB reads: finds a volume's (or an instance's) throughput ceiling.
[global]
ioengine=io_uring
direct=1
size=256m
time_based=1

[seq-read-1m]
rw=read
bs=1m
iodepth=8
",
    },
    Profile {
        name: "randread-4k",
        summary: "random 4 KiB reads, queue depth 32 (the classic IOPS test)",
        job: "\
; Random 4 KiB reads at queue depth 32: the IOPS figure cloud volumes are sold by.
[global]
ioengine=io_uring
direct=1
size=256m
time_based=1

[randread-4k]
rw=randread
bs=4k
iodepth=32
",
    },
    Profile {
        name: "hadoop-128m",
        summary: "HDFS datanode blocks: random 16 MiB reads, queue depth 4 (128 MiB scaled down)",
        job: "\
; A Hadoop datanode reading HDFS blocks with dfs.datanode.handler.count=4. The original test
; used bs=128M over 500G per volume; this is scaled down to 16 MiB blocks over 512 MiB so it
; runs anywhere. For the real thing: set = { bs = \"128m\", size = \"500g\" }.
[global]
ioengine=io_uring
direct=1
size=512m
time_based=1

[hadoop-128m]
rw=randread
bs=16m
iodepth=4
",
    },
    Profile {
        name: "tableau-worker",
        summary: "Tableau worker: random 50/50 read/write, 8 KiB, 2 jobs x queue depth 4",
        job: "\
; A Tableau Server worker: repository (PostgreSQL), extracts and temp files on one volume,
; random 8 KiB reads and writes from several services at once. On a small gp2 volume this
; is the load that runs out of burst credits after hours.
[global]
ioengine=io_uring
direct=1
size=256m
time_based=1

[tableau-worker]
rw=randrw
rwmixread=50
bs=8k
iodepth=4
numjobs=2
",
    },
    Profile {
        name: "iris-db-write",
        summary: "IRIS database writes: random 8 KiB writes, 16 in flight (the write daemon)",
        job: "\
; InterSystems IRIS database blocks are 8 KiB. The write daemon writes the cycle's updated
; blocks to the database at random places, many at once; part of the IRIS profile set with
; iris-db-read, journal and wij-burst (docs/domain.md#mirrored-pair).
[global]
ioengine=io_uring
direct=1
size=256m
time_based=1

[iris-db-write]
rw=randwrite
bs=8k
iodepth=16
",
    },
    Profile {
        name: "iris-db-read",
        summary: "IRIS database reads: random 8 KiB reads, 4 processes, one read each in flight",
        job: "\
; IRIS user processes read 8 KiB database blocks that are not in the global buffers, each
; waiting for its own read: several jobs at queue depth 1, not one deep queue. These are the
; reads the mirrored-pair study saw delayed by WIJ bursts on the same volume.
[global]
ioengine=io_uring
direct=1
size=256m
time_based=1

[iris-db-read]
rw=randread
bs=8k
iodepth=1
numjobs=4
",
    },
    Profile {
        name: "wij-burst",
        summary: "IRIS write-image journal: bursts of 256 KiB sequential writes, 16 in flight",
        job: "\
; The IRIS write-image journal (WIJ): every write-daemon cycle writes a burst of large
; sequential blocks, 16 in flight (Asyncwij=16), syncs, then idles until the next cycle.
; Here a burst is 256 x 256 KiB (64 MiB), followed by 2 s of think time.
; Burst size = thinktime_blocks x bs; cycle period = thinktime + the burst's own write time.
; Change them together, one sync per burst: set = { thinktime = \"8s\",
; thinktime_blocks = 512, fdatasync = 512 } is a 128 MiB burst about every 8 s.
[global]
ioengine=io_uring
direct=1
size=256m
time_based=1

[wij-burst]
rw=write
bs=256k
iodepth=16
thinktime=2s
thinktime_blocks=256
fdatasync=256
",
    },
    Profile {
        name: "journal",
        summary: "database journal: small sequential writes, each followed by fdatasync",
        job: "\
; A database journal (IRIS journal, PostgreSQL WAL): small sequential writes, each made
; durable with fdatasync before the next. Latency, not bandwidth, is what matters here.
[global]
ioengine=psync
size=256m
time_based=1

[journal]
rw=write
bs=4k
iodepth=1
fdatasync=1
",
    },
];

/// The profile called `name`, if there is one.
pub fn get(name: &str) -> Option<&'static Profile> {
    PROFILES.iter().find(|p| p.name == name)
}

/// Every profile name, for "unknown profile" messages.
pub fn names() -> Vec<&'static str> {
    PROFILES.iter().map(|p| p.name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_are_unique_and_confined() {
        let mut names = names();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), PROFILES.len());
        for p in PROFILES {
            let lowered = p.job.to_ascii_lowercase();
            for forbidden in ["directory=", "filename="] {
                assert!(!lowered.contains(forbidden), "{} sets {forbidden}", p.name);
            }
            assert!(
                p.job.contains(&format!("[{}]", p.name)),
                "{} section",
                p.name
            );
            assert!(p.job.contains("size="), "{} has no size", p.name);
        }
    }

    #[test]
    fn every_profile_parses_with_the_agents_parser() {
        for p in PROFILES {
            let origin = std::path::PathBuf::from(format!("<profile {}>", p.name));
            let jobs = lockstep_core::jobfile::parse_str(p.job, &origin, None, &[])
                .unwrap_or_else(|e| panic!("{}: {e}", p.name));
            assert_eq!(jobs.len(), 1, "{}", p.name);
            assert_eq!(jobs[0].name, p.name);
            // A modest size, so a local run fits on a laptop.
            match jobs[0].size {
                Some(lockstep_core::job::Extent::Bytes(b)) => {
                    assert!(b <= 512 << 20, "{}", p.name)
                }
                other => panic!("{}: size {other:?}", p.name),
            }
        }
        let oltp = &lockstep_core::jobfile::parse_str(
            get("oltp-8k").unwrap().job,
            "x".as_ref(),
            None,
            &[],
        )
        .unwrap()[0];
        assert_eq!(
            (oltp.rwmixread, oltp.iodepth, oltp.bs[0][0].0),
            (70, 16, 8192)
        );
    }

    fn parsed(name: &str, set: &[(&str, &str)]) -> lockstep_core::job::JobSpec {
        let set: Vec<(String, String)> = set
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut jobs =
            lockstep_core::jobfile::parse_str(get(name).unwrap().job, "x".as_ref(), None, &set)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(jobs.len(), 1);
        jobs.remove(0)
    }

    /// The IRIS profile set (docs/domain.md#mirrored-pair): 8 KiB database blocks, reads one
    /// per process, journal writes each made durable, WIJ bursts of 16 in flight.
    #[test]
    fn the_iris_set_is_what_the_study_describes() {
        use lockstep_core::job::Pattern;
        let w = parsed("iris-db-write", &[]);
        assert_eq!(
            (w.pattern, w.bs[1][0].0, w.iodepth),
            (Pattern::RandWrite, 8192, 16)
        );
        let r = parsed("iris-db-read", &[]);
        assert_eq!(
            (r.pattern, r.bs[0][0].0, r.iodepth, r.numjobs),
            (Pattern::RandRead, 8192, 1, 4)
        );
        let j = parsed("journal", &[]);
        assert_eq!((j.pattern, j.iodepth, j.fdatasync), (Pattern::Write, 1, 1));
        let wij = parsed("wij-burst", &[]);
        assert_eq!(wij.iodepth, 16);
        // A burst of 256 x 256 KiB = 64 MiB, one sync per burst, 2 s of think time.
        assert_eq!(wij.thinktime_blocks as u64 * wij.bs[1][0].0, 64 << 20);
        assert_eq!(wij.fdatasync, wij.thinktime_blocks);
        assert_eq!(wij.thinktime, std::time::Duration::from_secs(2));
    }

    /// The WIJ cycle's period and burst size are options, as docs/plan.md shows: the role's
    /// `set` replaces them.
    #[test]
    fn the_wij_cycle_is_set_by_the_role() {
        let wij = parsed(
            "wij-burst",
            &[
                ("thinktime", "8s"),
                ("thinktime_blocks", "512"),
                ("fdatasync", "512"),
            ],
        );
        assert_eq!(wij.thinktime, std::time::Duration::from_secs(8));
        assert_eq!(wij.thinktime_blocks as u64 * wij.bs[1][0].0, 128 << 20);
        assert_eq!(wij.fdatasync, 512);
    }

    #[test]
    fn the_required_profiles_exist() {
        for name in [
            "oltp-8k",
            "seq-write-256k",
            "seq-read-1m",
            "randread-4k",
            "hadoop-128m",
            "tableau-worker",
            "wij-burst",
            "journal",
            "iris-db-write",
            "iris-db-read",
        ] {
            assert!(get(name).is_some(), "{name}");
        }
        assert!(get("oltp-9k").is_none());
    }
}
