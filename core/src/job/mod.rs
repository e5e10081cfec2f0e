//! A job as the engine runs it: fio's options, parsed and typed.
//!
//! This is the contract between the job-file parser (`jobfile`), the workload generator
//! (`workload`), the runner and the reports. Every field has fio's meaning and fio's default, so a
//! job file that works with fio means the same thing here. Sizes are bytes, times are durations.

pub mod errpolicy;

use std::path::PathBuf;
use std::time::Duration;

/// Where in the user's input something was said, for errors that point at the line.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Origin {
    pub file: PathBuf,
    pub line: usize,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file.display(), self.line)
    }
}

/// An IO direction. Index with `as usize` into per-direction arrays (`[T; 2]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Direction {
    Read = 0,
    Write = 1,
}

impl Direction {
    pub const ALL: [Direction; 2] = [Direction::Read, Direction::Write];
    pub fn name(self) -> &'static str {
        match self {
            Direction::Read => "read",
            Direction::Write => "write",
        }
    }
}

/// fio's `rw=` (`readwrite` is accepted as `rw`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    Read,
    Write,
    RandRead,
    RandWrite,
    /// `rw` / `readwrite`: sequential, mixed by `rwmixread`.
    ReadWrite,
    /// `randrw`: random, mixed by `rwmixread`.
    RandReadWrite,
}

impl Pattern {
    pub fn is_random(self) -> bool {
        matches!(
            self,
            Pattern::RandRead | Pattern::RandWrite | Pattern::RandReadWrite
        )
    }
    pub fn reads(self) -> bool {
        !matches!(self, Pattern::Write | Pattern::RandWrite)
    }
    pub fn writes(self) -> bool {
        !matches!(self, Pattern::Read | Pattern::RandRead)
    }
    pub fn fio_name(self) -> &'static str {
        match self {
            Pattern::Read => "read",
            Pattern::Write => "write",
            Pattern::RandRead => "randread",
            Pattern::RandWrite => "randwrite",
            Pattern::ReadWrite => "rw",
            Pattern::RandReadWrite => "randrw",
        }
    }
}

/// Block sizes for one direction: `(size, weight percent)`. `bs=4k` is `[(4096, 100)]`;
/// `bssplit=4k/10:64k/90` is `[(4096, 10), (65536, 90)]`. Weights sum to 100.
pub type BlockSizes = Vec<(u64, u32)>;

/// fio's `random_distribution=`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Distribution {
    /// `random`: every block equally likely.
    Uniform,
    /// `zipf:theta`.
    Zipf { theta: f64 },
    /// `pareto:h`.
    Pareto { h: f64 },
    /// `normal:dev` / `gauss:dev`: dev is a percentage of the file's size (fio's meaning).
    Normal { dev_pct: f64 },
}

/// fio's `ioengine=`. `libaio` and `io_uring` both run on the kernel-async engine (io_uring):
/// same iodepth semantics, one ring per job. `psync`/`sync`/`pvsync` run synchronously.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    IoUring,
    /// Asked for as `libaio`; run on io_uring with libaio's iodepth semantics.
    Libaio,
    Psync,
    Null,
}

impl EngineKind {
    pub fn fio_name(self) -> &'static str {
        match self {
            EngineKind::IoUring => "io_uring",
            EngineKind::Libaio => "libaio",
            EngineKind::Psync => "psync",
            EngineKind::Null => "null",
        }
    }
}

/// fio's `rate_process=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RateProcess {
    #[default]
    Linear,
    Poisson,
}

/// Open-loop targets from `rate=` (bytes/s) and `rate_iops=`, per direction. `None`: no limit.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Rate {
    pub iops: [Option<u64>; 2],
    pub bytes_per_sec: [Option<u64>; 2],
    pub process: RateProcess,
}

impl Rate {
    pub fn is_limited(&self) -> bool {
        self.iops
            .iter()
            .chain(self.bytes_per_sec.iter())
            .any(Option::is_some)
    }
}

/// `size=` and `offset=` may be absolute or a percentage of the file/device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Extent {
    Bytes(u64),
    Percent(f64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerifyKind {
    Crc32c,
}

/// One job section after `[global]` and the job's own options are merged. `numjobs` clones are
/// made by the runner, not here.
#[derive(Debug, Clone)]
pub struct JobSpec {
    pub name: String,
    /// Where the job's section starts, for messages about the job as a whole.
    pub origin: Origin,
    /// `stonewall` / `wait_for_previous`: start only after every earlier job has finished.
    pub stonewall: bool,
    pub pattern: Pattern,
    /// Percent of IOs that are reads in mixed patterns (`rwmixread`, or 100 - `rwmixwrite`).
    pub rwmixread: u32,
    pub bs: [BlockSizes; 2],
    pub iodepth: u32,
    pub numjobs: u32,
    /// Explicit targets from `filename=` (':' separated). Empty: files are made in `directory`.
    pub filenames: Vec<PathBuf>,
    /// `directory=` (':' separated); files cycle over them. Empty: the current directory.
    pub directories: Vec<PathBuf>,
    pub nrfiles: u32,
    /// Total size of IO region across all files (`size=`); `None` means the file's size.
    pub size: Option<Extent>,
    /// Size of each file (`filesize=`); default `size / nrfiles`.
    pub filesize: Option<u64>,
    /// Bytes to transfer before stopping (`io_size=`/`io_limit=`); default `size`.
    pub io_size: Option<u64>,
    pub offset: Extent,
    pub engine: EngineKind,
    pub direct: bool,
    pub runtime: Option<Duration>,
    pub time_based: bool,
    pub ramp_time: Duration,
    pub startdelay: Duration,
    pub randseed: u64,
    /// `randrepeat=1` (fio's default): the same seed on every run. With 0, a fresh seed.
    pub randrepeat: bool,
    pub norandommap: bool,
    pub distribution: Distribution,
    pub rate: Rate,
    pub thinktime: Duration,
    /// Issue this many IOs between thinktimes (`thinktime_blocks`, default 1).
    pub thinktime_blocks: u32,
    /// fsync every N writes (0: never).
    pub fsync: u32,
    /// fdatasync every N writes (0: never).
    pub fdatasync: u32,
    pub end_fsync: bool,
    pub verify: Option<VerifyKind>,
    /// `continue_on_error` and `ignore_error`: the errors the job counts and goes on after
    /// instead of stopping (none by default, as in fio).
    pub on_error: crate::job::errpolicy::ErrorPolicy,
    /// An IO that takes longer than this is listed as stuck (`stuck_timeout`, a lockstep
    /// extension named as proposed in fio issue #2012); zero turns the list off.
    pub stuck_timeout: Duration,
    pub group_reporting: bool,
    /// Percentiles to report (`percentile_list`), fio's default list when not given.
    pub percentile_list: Vec<f64>,
    /// Drop the page cache of the files before starting (`invalidate`, default 1).
    pub invalidate: bool,
    /// io_uring: register the job's buffers / files with the ring (fio's `fixedbufs` and
    /// `registerfiles`). On by default, unlike fio: they only take per-IO kernel work off the
    /// job thread; `=0` gives fio's default path for like-for-like comparisons.
    pub fixedbufs: bool,
    pub registerfiles: bool,
    /// At most this many completions are handled per pass of the IO loop
    /// (`iodepth_batch_complete_max`; fio's default 1); the rest wait, finished, until a later
    /// pass, and that wait is in their clat, as in fio. `>= iodepth` handles every completion
    /// as soon as it is visible, so clat ends when the device's completion is seen.
    pub complete_max: u32,
    /// `description=` as given.
    pub description: Option<String>,
    /// `overwrite=1`: the job may write into, and extend, files that existed before the run.
    /// Without it a local job only reads files it did not create (fio writes them silently).
    pub overwrite: bool,
    /// `allow_file_create` (fio's, default 1): `0` refuses to create any file.
    pub allow_file_create: bool,
    /// Where the job may touch files; set by the agent daemon to the job's volume, never by a
    /// job file.
    pub scope: crate::confine::Scope,
}

/// Default `stuck_timeout`.
pub const DEFAULT_STUCK_TIMEOUT: Duration = Duration::from_secs(5);

/// fio's default `percentile_list`.
pub const DEFAULT_PERCENTILES: [f64; 17] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95,
    99.99,
];

impl JobSpec {
    /// A job with fio's defaults, as `[name]` with no options would be.
    pub fn with_defaults(name: &str, origin: Origin) -> Self {
        JobSpec {
            name: name.to_string(),
            origin,
            stonewall: false,
            pattern: Pattern::Read,
            rwmixread: 50,
            bs: [vec![(4096, 100)], vec![(4096, 100)]],
            iodepth: 1,
            numjobs: 1,
            filenames: Vec::new(),
            directories: Vec::new(),
            nrfiles: 1,
            size: None,
            filesize: None,
            io_size: None,
            offset: Extent::Bytes(0),
            engine: EngineKind::Psync,
            direct: false,
            runtime: None,
            time_based: false,
            ramp_time: Duration::ZERO,
            startdelay: Duration::ZERO,
            randseed: 0x89,
            randrepeat: true,
            norandommap: false,
            distribution: Distribution::Uniform,
            rate: Rate::default(),
            thinktime: Duration::ZERO,
            thinktime_blocks: 1,
            fsync: 0,
            fdatasync: 0,
            end_fsync: false,
            verify: None,
            on_error: Default::default(),
            stuck_timeout: DEFAULT_STUCK_TIMEOUT,
            group_reporting: false,
            percentile_list: DEFAULT_PERCENTILES.to_vec(),
            invalidate: true,
            fixedbufs: true,
            registerfiles: true,
            complete_max: 1,
            description: None,
            overwrite: false,
            allow_file_create: true,
            scope: crate::confine::Scope::Named,
        }
    }

    /// The smallest block size in use: offsets are aligned to it (fio's `blockalign` default).
    pub fn min_bs(&self) -> u64 {
        self.bs
            .iter()
            .flatten()
            .map(|&(size, _)| size)
            .min()
            .unwrap_or(4096)
    }

    /// The largest block size in use: IO buffers are this big.
    pub fn max_bs(&self) -> u64 {
        self.bs
            .iter()
            .flatten()
            .map(|&(size, _)| size)
            .max()
            .unwrap_or(4096)
    }
}
