//! What a verifying clone's state costs: memory per block and time per write, for the dense
//! table (`verify::VerifyState`) against the hash map it replaced (one entry per written
//! block, kept here as it was).
//!
//! ```sh
//! cargo run --release -p lockstep-agent --example verify_state -- \
//!     --model dense --size 1t --bs 4k --writes 4m --dir /mnt/vol
//! cargo run --release -p lockstep-agent --example verify_state -- --model map --size 1t --writes 4m
//! ```
//!
//! Writes go to uniformly random blocks of the layout (each issued, then acknowledged), as a
//! random-write job does. Prints the resident memory the state added (anonymous and
//! file-backed: the table's mapped pages are page cache), per written block, the peak, and
//! the time per write and for one pass over the written blocks (what the check and the save
//! do at the job's end).

use std::collections::HashMap;
use std::time::Instant;

use lockstep_agent::confine::Scope;
use lockstep_agent::verify::{self, Block, Layout, Spill, VerifyState};

fn status(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

fn bytes(s: &str) -> u64 {
    lockstep_agent::units::parse_size(s, Default::default()).unwrap_or_else(|e| panic!("{s}: {e}"))
}

struct Args {
    model: String,
    size: u64,
    bs: u32,
    writes: u64,
    dir: Option<String>,
    limit: u64,
}

fn args() -> Args {
    let mut a = Args {
        model: "dense".into(),
        size: 1 << 40,
        bs: 4096,
        writes: 4 << 20,
        dir: None,
        limit: verify::IN_MEMORY_LIMIT,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--model" => a.model = v,
            "--size" => a.size = bytes(&v),
            "--bs" => a.bs = bytes(&v) as u32,
            "--writes" => a.writes = bytes(&v),
            "--dir" => a.dir = Some(v),
            "--memory-limit" => a.limit = bytes(&v),
            _ => panic!("unknown option {k}"),
        }
    }
    a
}

/// The state as it was: one map entry per written block.
#[derive(Default)]
struct Map(HashMap<(u32, u64), Block>);

impl Map {
    fn write(&mut self, offset: u64, len: u32) {
        let b = self.0.entry((0, offset)).or_default();
        b.len = len;
        b.issued += 1;
        b.inflight = true;
        let g = b.issued;
        b.inflight = false;
        b.expect = g;
        b.lo = g;
    }
}

fn main() {
    let a = args();
    let blocks = a.size / u64::from(a.bs);
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % blocks
    };
    let (anon0, file0) = (status("RssAnon:"), status("RssFile:"));
    // Resident memory the state added, measured while it is alive (before the pass).
    let added = || {
        (
            status("RssAnon:").saturating_sub(anon0),
            status("RssFile:").saturating_sub(file0),
        )
    };
    let t0 = Instant::now();
    let (written, pass, place, (anon, file)) = if a.model == "map" {
        let mut m = Map::default();
        for _ in 0..a.writes {
            m.write(next() * u64::from(a.bs), a.bs);
        }
        let per = t0.elapsed();
        let rss = added();
        let t = Instant::now();
        let mut keys: Vec<_> = m.0.iter().collect();
        keys.sort_by_key(|(k, _)| **k);
        let n = keys.iter().filter(|(_, b)| b.expect > 0).count() as u64;
        assert_eq!(n, m.0.len() as u64);
        (
            m.0.len() as u64,
            (per, t.elapsed()),
            "memory".to_string(),
            rss,
        )
    } else {
        let spill = a.dir.as_ref().map(|d| Spill {
            scope: Scope::Beneath(d.into()),
            path: std::path::Path::new(d).join("bench.0.verify-table"),
        });
        let layout = Layout::new(a.bs, &[(0, a.size)]);
        let mut s = VerifyState::for_layout(1, layout, spill.as_ref(), a.limit).unwrap();
        for _ in 0..a.writes {
            let off = next() * u64::from(a.bs);
            let g = s.issue(0, off, a.bs);
            s.complete(0, off, g, true, false);
        }
        let per = t0.elapsed();
        let rss = added();
        let t = Instant::now();
        let n = s.blocks().filter(|(_, b)| b.expect > 0).count() as u64;
        assert_eq!(n, s.len());
        let place = match s.spilled_to() {
            Some(p) => format!("file {}", p.display()),
            None => "memory".into(),
        };
        (s.len(), (per, t.elapsed()), place, rss)
    };
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "model {} ({place}): layout {} blocks of {} B, {} writes, {written} blocks written",
        a.model, blocks, a.bs, a.writes
    );
    println!(
        "  RSS added: {:.1} MiB anonymous + {:.1} MiB file-backed = {:.1} B per written block; peak RSS {:.1} MiB",
        mib(anon),
        mib(file),
        (anon + file) as f64 / written.max(1) as f64,
        mib(status("VmHWM:"))
    );
    println!(
        "  {:.0} ns per write (issue + acknowledge); one pass over the written blocks {:.2} s",
        pass.0.as_nanos() as f64 / a.writes.max(1) as f64,
        pass.1.as_secs_f64()
    );
}
