//! The workload generator: which IO comes next (direction, file, offset, length).
//!
//! Pure: parameters and a seed in, a deterministic stream of requests out. No clock, no IO, so
//! the same seed gives the same offsets on every machine (fio's `randrepeat`), and the rules
//! below are tested directly:
//! - every offset is a multiple of `align` (fio's `blockalign`, the smallest block size) and the
//!   whole IO lies inside its file's region;
//! - mixed patterns pick a direction per IO with probability `rwmixread`;
//! - sequential IO walks each file from the start of its region, one cursor per direction as fio
//!   keeps one `last_pos` per direction, and covers every block before it ends or wraps;
//! - random IO with the random map on (fio's default) visits every block of a file once per pass
//!   before repeating any, without storing a map: offsets come from a keyed permutation of the
//!   block indices (a Feistel network with cycle walking), so memory stays constant however
//!   large the file is;
//! - files are used round robin (fio's default `file_service_type=roundrobin`).

use rand::{Rng, RngCore, SeedableRng};
use rand_distr::{Distribution as _, Normal, Zipf};
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::job::{BlockSizes, Direction, Distribution, Pattern};

/// The part of one file a job does IO on: `[offset, offset + len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileRegion {
    pub offset: u64,
    pub len: u64,
}

/// One IO to issue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoRequest {
    pub dir: Direction,
    /// Index into the job clone's files.
    pub file: usize,
    /// Absolute byte offset in the file.
    pub offset: u64,
    pub len: u64,
}

#[derive(Debug, Clone)]
pub struct WorkloadParams {
    pub pattern: Pattern,
    pub rwmixread: u32,
    pub bs: [BlockSizes; 2],
    pub files: Vec<FileRegion>,
    pub distribution: Distribution,
    pub norandommap: bool,
    /// Stop after issuing this many bytes (fio's `io_size`, default `size`); `None`: never.
    pub io_limit: Option<u64>,
    /// Start again from the beginning when a sequential file or a random pass is done
    /// (`time_based`); otherwise the file is finished.
    pub wrap: bool,
    /// Offsets are multiples of this (the smallest block size in use).
    pub align: u64,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum WorkloadError {
    #[error("no files to do IO on")]
    NoFiles,
    #[error(
        "block size {bs} is larger than the region of file {file} ({len} bytes): use a larger size= or a smaller bs="
    )]
    RegionTooSmall { file: usize, bs: u64, len: u64 },
    #[error("block size 0 is not allowed")]
    ZeroBlockSize,
    #[error("rwmixread={0} is not a percentage")]
    BadMix(u32),
    #[error("random_distribution: {0}")]
    BadDistribution(String),
}

/// Picks block indices for random IO in one file.
#[derive(Debug, Clone)]
enum Picker {
    /// Every block once per pass, in a pseudo-random order.
    Permutation(Permutation),
    /// Independent uniform draws (`norandommap`).
    Uniform,
    /// Skewed: the drawn rank is scattered over the file with a fixed hash, as fio does, so the
    /// hot blocks are not all at the start of the file.
    Zipf(Zipf<f64>),
    Pareto {
        pow: f64,
    },
    Normal(Normal<f64>),
}

/// Per-file state.
#[derive(Debug, Clone)]
struct FileState {
    region: FileRegion,
    /// Number of `align`-sized units an IO may start at (so that the IO still fits).
    units: u64,
    /// Next sequential position (bytes from the region start), per direction.
    cursor: [u64; 2],
    picker: Picker,
    /// Position in the current random pass (random map).
    pass_pos: u64,
    done: bool,
}

pub struct Generator {
    pattern: Pattern,
    read_threshold: u32,
    bs: [BlockSizes; 2],
    /// Cumulative weights for the per-direction block size choice (empty when one size).
    bs_cum: [Vec<u32>; 2],
    files: Vec<FileState>,
    next_file: usize,
    live_files: usize,
    io_limit: Option<u64>,
    issued: u64,
    wrap: bool,
    align: u64,
    rng: Xoshiro256PlusPlus,
}

impl Generator {
    pub fn new(p: WorkloadParams, seed: u64) -> Result<Self, WorkloadError> {
        if p.files.is_empty() {
            return Err(WorkloadError::NoFiles);
        }
        if p.rwmixread > 100 {
            return Err(WorkloadError::BadMix(p.rwmixread));
        }
        if p.align == 0 || p.bs.iter().flatten().any(|&(s, _)| s == 0) {
            return Err(WorkloadError::ZeroBlockSize);
        }
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        let dirs_used: Vec<usize> = match (p.pattern.reads(), p.pattern.writes()) {
            (true, true) => vec![0, 1],
            (true, false) => vec![0],
            _ => vec![1],
        };
        let max_bs = dirs_used
            .iter()
            .flat_map(|&d| p.bs[d].iter().map(|&(s, _)| s))
            .max()
            .unwrap_or(p.align);
        let mut files = Vec::with_capacity(p.files.len());
        for (i, region) in p.files.iter().enumerate() {
            if region.len < max_bs {
                return Err(WorkloadError::RegionTooSmall {
                    file: i,
                    bs: max_bs,
                    len: region.len,
                });
            }
            let units = (region.len - p.align.min(region.len)) / p.align + 1;
            let picker = match p.distribution {
                Distribution::Uniform if p.norandommap => Picker::Uniform,
                Distribution::Uniform => {
                    Picker::Permutation(Permutation::new(units, rng.next_u64()))
                }
                Distribution::Zipf { theta } => {
                    Picker::Zipf(Zipf::new(units as f64, theta).map_err(|e| {
                        WorkloadError::BadDistribution(format!("zipf:{theta}: {e}"))
                    })?)
                }
                Distribution::Pareto { h } => {
                    if !(h > 0.0 && h < 1.0) {
                        return Err(WorkloadError::BadDistribution(format!(
                            "pareto:{h}: the parameter must be between 0 and 1"
                        )));
                    }
                    // fio: pow = log(h) / log(1 - h).
                    Picker::Pareto {
                        pow: h.ln() / (1.0 - h).ln(),
                    }
                }
                Distribution::Normal { dev_pct } => Picker::Normal(
                    Normal::new(
                        units as f64 / 2.0,
                        (dev_pct / 100.0 * units as f64).max(1.0),
                    )
                    .map_err(|e| {
                        WorkloadError::BadDistribution(format!("normal:{dev_pct}: {e}"))
                    })?,
                ),
            };
            files.push(FileState {
                region: *region,
                units,
                cursor: [0, 0],
                picker,
                pass_pos: 0,
                done: false,
            });
        }
        let cum = |b: &BlockSizes| -> Vec<u32> {
            if b.len() <= 1 {
                return Vec::new();
            }
            let mut acc = 0;
            b.iter()
                .map(|&(_, w)| {
                    acc += w;
                    acc
                })
                .collect()
        };
        let bs_cum = [cum(&p.bs[0]), cum(&p.bs[1])];
        let live_files = files.len();
        Ok(Generator {
            pattern: p.pattern,
            read_threshold: p.rwmixread,
            bs: p.bs,
            bs_cum,
            files,
            next_file: 0,
            live_files,
            io_limit: p.io_limit,
            issued: 0,
            wrap: p.wrap,
            align: p.align,
            rng,
        })
    }

    /// Bytes issued so far.
    pub fn issued_bytes(&self) -> u64 {
        self.issued
    }

    fn pick_dir(&mut self) -> Direction {
        match self.pattern {
            Pattern::Read | Pattern::RandRead => Direction::Read,
            Pattern::Write | Pattern::RandWrite => Direction::Write,
            Pattern::ReadWrite | Pattern::RandReadWrite => {
                if self.read_threshold == 100
                    || (self.read_threshold > 0
                        && self.rng.random_range(0..100) < self.read_threshold)
                {
                    Direction::Read
                } else {
                    Direction::Write
                }
            }
        }
    }

    fn pick_len(&mut self, dir: Direction) -> u64 {
        let d = dir as usize;
        if self.bs_cum[d].is_empty() {
            return self.bs[d].first().map_or(self.align, |&(s, _)| s);
        }
        let total = *self.bs_cum[d].last().unwrap_or(&100);
        let x = self.rng.random_range(0..total.max(1));
        let i = self.bs_cum[d].iter().position(|&c| x < c).unwrap_or(0);
        self.bs[d][i].0
    }

    /// The next IO, or `None` when the job has done all its IO (never, with `wrap` and no limit).
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Option<IoRequest> {
        if let Some(limit) = self.io_limit {
            if self.issued >= limit {
                return None;
            }
        }
        let dir = self.pick_dir();
        let mut len = self.pick_len(dir);
        if let Some(limit) = self.io_limit {
            // The last IO is cut to the limit (kept aligned), as fio ends exactly at io_size.
            let left = limit - self.issued;
            if left < len {
                len = (left / self.align * self.align).max(self.align);
            }
        }
        let random = self.pattern.is_random();
        // Round robin over files that still have IO to do.
        for _ in 0..self.files.len() {
            let fi = self.next_file;
            self.next_file = (self.next_file + 1) % self.files.len();
            if self.files[fi].done {
                continue;
            }
            let pos = if random {
                self.random_pos(fi, len)
            } else {
                self.sequential_pos(fi, dir, len)
            };
            if let Some(pos) = pos {
                self.issued += len;
                let f = &self.files[fi];
                return Some(IoRequest {
                    dir,
                    file: fi,
                    offset: f.region.offset + pos,
                    len,
                });
            }
        }
        None
    }

    fn finish_file(&mut self, fi: usize) {
        if !self.files[fi].done {
            self.files[fi].done = true;
            self.live_files -= 1;
        }
    }

    fn sequential_pos(&mut self, fi: usize, dir: Direction, len: u64) -> Option<u64> {
        let d = dir as usize;
        let f = &mut self.files[fi];
        if f.cursor[d] + len > f.region.len {
            // Without time_based, a file ends at its region's end unless io_size asks for more
            // than one pass (then fio wraps, and the limit ends the job).
            if !self.wrap && self.io_limit.is_none_or(|l| l <= f.region.len) {
                self.finish_file(fi);
                return None;
            }
            f.cursor[d] = 0;
        }
        let pos = f.cursor[d];
        f.cursor[d] += len;
        Some(pos)
    }

    fn random_pos(&mut self, fi: usize, len: u64) -> Option<u64> {
        let align = self.align;
        let f = &mut self.files[fi];
        let unit = match &mut f.picker {
            Picker::Permutation(perm) => {
                if f.pass_pos >= f.units {
                    if !self.wrap && self.io_limit.is_none() {
                        self.finish_file(fi);
                        return None;
                    }
                    // A new pass, in a new order.
                    *perm = Permutation::new(f.units, self.rng.next_u64());
                    f.pass_pos = 0;
                }
                let u = perm.at(f.pass_pos);
                f.pass_pos += 1;
                u
            }
            Picker::Uniform => self.rng.random_range(0..f.units),
            Picker::Zipf(z) => scatter(z.sample(&mut self.rng) as u64 - 1, f.units),
            Picker::Pareto { pow } => {
                let x: f64 = self.rng.random();
                scatter(((f.units - 1) as f64 * x.powf(*pow)) as u64, f.units)
            }
            Picker::Normal(n) => {
                let v = n.sample(&mut self.rng).round();
                (v.max(0.0) as u64).min(f.units - 1)
            }
        };
        // Keep the whole IO inside the region; with mixed block sizes a large IO drawn near the
        // end is moved back to the last aligned start that fits.
        let last_start = (f.region.len - len) / align * align;
        Some((unit * align).min(last_start))
    }
}

/// fio scatters skewed ranks over the file with a hash so that popularity is not tied to the
/// position in the file; any fixed bijection-like mix does.
fn scatter(rank: u64, n: u64) -> u64 {
    let mut z = rank.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) % n
}

/// A keyed pseudo-random permutation of `0..n`: a 4-round Feistel network over the smallest even
/// number of bits that holds `n`, with cycle walking to stay below `n`. Bijective by
/// construction, so a pass visits every index exactly once; expected steps per index < 4.
#[derive(Debug, Clone)]
struct Permutation {
    n: u64,
    half_bits: u32,
    keys: [u64; 4],
}

impl Permutation {
    fn new(n: u64, seed: u64) -> Self {
        let bits = 64 - (n.max(2) - 1).leading_zeros();
        let half_bits = bits.div_ceil(2).max(1);
        let mut s = Xoshiro256PlusPlus::seed_from_u64(seed);
        Permutation {
            n,
            half_bits,
            keys: [s.next_u64(), s.next_u64(), s.next_u64(), s.next_u64()],
        }
    }

    fn round(x: u64, key: u64, mask: u64) -> u64 {
        let mut z = x ^ key;
        z = z.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z ^= z >> 29;
        z = z.wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 32)) & mask
    }

    fn encrypt(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut l, mut r) = (x >> self.half_bits, x & mask);
        for &k in &self.keys {
            let t = l ^ Self::round(r, k, mask);
            l = r;
            r = t;
        }
        (l << self.half_bits) | r
    }

    fn at(&self, i: u64) -> u64 {
        if self.n <= 1 {
            return 0;
        }
        let mut x = self.encrypt(i);
        while x >= self.n {
            x = self.encrypt(x);
        }
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn params(pattern: Pattern, files: Vec<FileRegion>, bs: u64) -> WorkloadParams {
        WorkloadParams {
            pattern,
            rwmixread: 50,
            bs: [vec![(bs, 100)], vec![(bs, 100)]],
            files,
            distribution: Distribution::Uniform,
            norandommap: false,
            io_limit: None,
            wrap: false,
            align: bs,
        }
    }

    #[test]
    fn permutation_is_a_bijection() {
        for n in [1u64, 2, 3, 7, 64, 1000, 4097] {
            let p = Permutation::new(n, 42);
            let mut seen = vec![false; n as usize];
            for i in 0..n {
                let x = p.at(i);
                assert!(x < n);
                assert!(!seen[x as usize], "n={n}: {x} twice");
                seen[x as usize] = true;
            }
        }
    }

    #[test]
    fn sequential_covers_every_block_in_order_then_ends() {
        let files = vec![FileRegion {
            offset: 0,
            len: 64 << 10,
        }];
        let mut g = Generator::new(params(Pattern::Read, files, 4096), 1).unwrap();
        let offs: Vec<u64> = std::iter::from_fn(|| g.next()).map(|r| r.offset).collect();
        assert_eq!(offs, (0..16).map(|i| i * 4096).collect::<Vec<_>>());
    }

    #[test]
    fn random_map_covers_every_block_once_per_pass() {
        let files = vec![FileRegion {
            offset: 8192,
            len: 1 << 20,
        }];
        let mut p = params(Pattern::RandWrite, files, 4096);
        p.io_limit = Some(1 << 20);
        let mut g = Generator::new(p, 7).unwrap();
        let mut offs: Vec<u64> = std::iter::from_fn(|| g.next()).map(|r| r.offset).collect();
        assert_eq!(offs.len(), 256);
        offs.sort();
        offs.dedup();
        assert_eq!(offs.len(), 256);
        assert_eq!(offs[0], 8192);
    }

    #[test]
    fn same_seed_same_stream_other_seed_other_stream() {
        let files = vec![FileRegion {
            offset: 0,
            len: 1 << 30,
        }];
        let mut p = params(Pattern::RandReadWrite, files, 4096);
        p.wrap = true;
        let take = |seed| {
            let mut g = Generator::new(p.clone(), seed).unwrap();
            (0..1000).map(|_| g.next().unwrap()).collect::<Vec<_>>()
        };
        assert_eq!(take(5), take(5));
        assert_ne!(take(5), take(6));
    }

    #[test]
    fn io_limit_is_exact() {
        let files = vec![FileRegion {
            offset: 0,
            len: 1 << 20,
        }];
        let mut p = params(Pattern::Write, files, 65536);
        p.io_limit = Some(100 * 1024);
        p.align = 4096;
        let mut g = Generator::new(p, 1).unwrap();
        let total: u64 = std::iter::from_fn(|| g.next()).map(|r| r.len).sum();
        assert_eq!(total, 100 * 1024);
    }

    #[test]
    fn refuses_regions_smaller_than_a_block() {
        let files = vec![FileRegion {
            offset: 0,
            len: 1000,
        }];
        let err = Generator::new(params(Pattern::Read, files, 4096), 1)
            .err()
            .unwrap();
        assert_eq!(
            err,
            WorkloadError::RegionTooSmall {
                file: 0,
                bs: 4096,
                len: 1000
            }
        );
    }

    #[test]
    fn zipf_is_skewed() {
        let files = vec![FileRegion {
            offset: 0,
            len: 4096 * 10_000,
        }];
        let mut p = params(Pattern::RandRead, files, 4096);
        p.distribution = Distribution::Zipf { theta: 1.2 };
        p.wrap = true;
        let mut g = Generator::new(p, 3).unwrap();
        let mut counts = std::collections::HashMap::new();
        for _ in 0..20_000 {
            *counts.entry(g.next().unwrap().offset).or_insert(0u32) += 1;
        }
        let top = counts.values().copied().max().unwrap();
        // Uniform would give ~2 per block; zipf 1.2 puts a large share on the hottest block.
        assert!(top > 1000, "hottest block seen {top} times");
    }

    proptest! {
        #[test]
        fn offsets_aligned_and_in_range(
            seed in any::<u64>(),
            nfiles in 1usize..4,
            file_blocks in 1u64..200,
            pattern in prop::sample::select(vec![Pattern::Read, Pattern::Write, Pattern::RandRead,
                Pattern::RandWrite, Pattern::ReadWrite, Pattern::RandReadWrite]),
            split in prop::bool::ANY,
            norandommap in prop::bool::ANY,
            wrap in prop::bool::ANY,
        ) {
            let align = 4096u64;
            let files: Vec<FileRegion> = (0..nfiles)
                .map(|i| FileRegion { offset: i as u64 * 8192, len: (file_blocks + 4) * align })
                .collect();
            let bs: BlockSizes = if split { vec![(4096, 60), (16384, 40)] } else { vec![(8192, 100)] };
            let p = WorkloadParams {
                pattern, rwmixread: 30, bs: [bs.clone(), bs], files: files.clone(),
                distribution: Distribution::Uniform, norandommap, io_limit: Some(1 << 20), wrap, align,
            };
            let mut g = Generator::new(p, seed).unwrap();
            let mut n = 0;
            while let Some(r) = g.next() {
                let f = files[r.file];
                prop_assert_eq!(r.offset % align, 0);
                prop_assert!(r.offset >= f.offset && r.offset + r.len <= f.offset + f.len);
                n += 1;
                prop_assert!(n < 100_000);
            }
        }

        #[test]
        fn mix_ratio_is_honoured(seed in any::<u64>(), mix in 0u32..=100) {
            let files = vec![FileRegion { offset: 0, len: 1 << 30 }];
            let mut p = params(Pattern::RandReadWrite, files, 4096);
            p.rwmixread = mix;
            p.wrap = true;
            let mut g = Generator::new(p, seed).unwrap();
            let n = 20_000;
            let reads = (0..n).filter(|_| g.next().unwrap().dir == Direction::Read).count();
            let share = reads as f64 / n as f64 * 100.0;
            // Binomial: 5 standard deviations at most 1.77 points for n = 20,000.
            prop_assert!((share - mix as f64).abs() < 1.8, "mix {} got {}", mix, share);
        }

        #[test]
        fn sequential_coverage_is_complete(seed in any::<u64>(), blocks in 1u64..500, nfiles in 1usize..5) {
            let files: Vec<FileRegion> =
                (0..nfiles).map(|_| FileRegion { offset: 0, len: blocks * 4096 }).collect();
            let mut g = Generator::new(params(Pattern::Write, files, 4096), seed).unwrap();
            let mut per_file = vec![Vec::new(); nfiles];
            while let Some(r) = g.next() {
                per_file[r.file].push(r.offset);
            }
            for offs in per_file {
                prop_assert_eq!(offs, (0..blocks).map(|i| i * 4096).collect::<Vec<_>>());
            }
        }
    }
}
