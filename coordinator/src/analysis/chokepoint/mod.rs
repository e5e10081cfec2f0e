//! The chokepoint finder: pure analysis of a run's [`Timeline`] that names the volume (or node)
//! holding the cluster back, when it began, what kind of limit it is and what it costs, or says
//! honestly that there is none, or that the slowdown is node- or cluster-wide.
//!
//! How (docs/chokepoint.md, "How it decides"; the sources and their thresholds, Perseus FAST '23,
//! the Tail at Store FAST '16 and Cruise Control's SlowBrokerFinder, are in
//! docs/domain.md#fail-slow):
//! 1. Peers are the volumes of the same role (same workload). Per interval and role the finder
//!    takes robust statistics of latency, IOPS and queue depth (median, median without the
//!    volume itself) and the peer model: the role's robust spread of latency and of IOPS (MAD
//!    as a CV, small-sample corrected, pooled over the run, floored at
//!    [`AnalysisOptions::spread_floor`]).
//! 2. A volume's interval is *flagged* when the median of its and its neighbours' distance from
//!    the peers' center (latency normalized by throughput, or IOPS deficit while it has IOs
//!    queued; measured from its own standing when that is within the spread) is both over
//!    [`AnalysisOptions::peer_z`] robust sigmas and over [`AnalysisOptions::min_slowdown`];
//!    or its latency is more than 3x the p90 of its own history; or it returns errors.
//! 3. Score +1 per flagged interval, -1 per clean one, floored at 0; a volume becomes a suspect
//!    only when its score reaches [`AnalysisOptions::persistence`] (hysteresis: it stays one
//!    until the score is back at 0). Bursts and garbage-collection spikes are shorter than that.
//!    A suspect is blamed only when its episode is clearly out ([`ConfidenceLevel::Sure`]);
//!    otherwise it is listed in [`ChokepointReport::suspects`], not yet sure.
//! 4. Guards: intervals where more than a third of a role is degraded together (half-way to
//!    flagged), or where the role's median latency is 1.5x its own history, are cluster-wide
//!    and do not count against a single volume, nor do the intervals around a persistent run
//!    of them; suspects that are most of the volumes of one node (with its other volumes
//!    degraded alongside) are a node-level limit.
//! 5. For the chokepoint: the onset (two-segment split of its deviation from its peers), the
//!    kind (throttled, credit exhaustion, fail-slow, erroring) with the evidence figures, the
//!    confidence, and the impact on the cluster. Volumes with a credit model get a forecast of
//!    when credits run out.
//!
//! Cost: one pass per interval block to build the peer statistics (selection, not sorting) and
//! two streaming passes over each volume's points; memory is O(intervals x roles + volumes)
//! plus one flag byte per volume and interval, never a copy of the points, so the live view can call it on the data so far every few
//! seconds.

mod credit;
pub mod stats;

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

pub use credit::{CreditForecast, CreditModel, CreditUnit, GP2_BUCKET, GP2_BURST_IOPS};

pub use crate::results::chokepoint::*;
use crate::results::timeline::{Timeline, VolumePoint, VolumeSeries};
use stats::{Center, MAD_TO_SIGMA};

/// Tuning of the finder. The defaults follow the research rules; each says why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AnalysisOptions {
    /// Practical effect: an interval is flagged only when the volume is at least this much
    /// slower than its peers' center (latency per load up, or IOPS down, by this factor). A
    /// statistically clear 3% difference between near-identical volumes is real but not worth
    /// a verdict; 1.2x is the smallest slowdown the study in docs/chokepoint.md is asked to see,
    /// and what a fleet's moderate, persistent fail-slow devices show (docs/domain.md#fail-slow).
    pub min_slowdown: f64,
    /// Statistical distance: an interval is flagged only when the volume sits more than this
    /// many robust sigmas (the peers' spread, see `spread_floor`) from its peers' center. 3: a
    /// normal value crosses it in 0.13% of intervals, and the flag rule takes the median of 3
    /// consecutive intervals (a one-interval spike is not a slowdown), two of which must cross.
    pub peer_z: f64,
    /// Floor of the peers' spread, as a fraction of their center (a CV). Peers within 0.1% of
    /// each other would make any wobble "significant"; the floor keeps the distance rule
    /// meaningful, and the factor rule (`min_slowdown`) is then the one that decides.
    /// 0.05: `peer_z` x 0.05 = 0.15 in ln units is below ln 1.2 = 0.18, so a 1.2x slowdown on
    /// identical peers is still 3.6 sigmas out and caught.
    pub spread_floor: f64,
    /// "Has IOs queued": outstanding IOs at least this fraction of the peers' median. Below it
    /// the volume is not being asked for IOs (the load generator is short), and low IOPS are
    /// not the storage's fault.
    pub busy_outstanding_fraction: f64,
    /// Flag an interval whose latency exceeds this multiple of the p90 of the volume's own
    /// history (SlowBrokerFinder's second rule). Catches a volume that slows down when its peers
    /// are too few or too spread to flag it, and is how an all-volume slowdown shows up.
    pub history_latency_factor: f64,
    /// Intervals at the start of a volume's data that are its "own history" (after the warm-up).
    /// A minute at 1 s intervals: long enough for a stable p90, short enough that a credit
    /// cliff later in the run is compared with the fast period before it.
    pub history_intervals: usize,
    /// Intervals skipped at the start before the history (caches filling, files being laid out).
    pub warmup_intervals: usize,
    /// Score a volume must reach to be a suspect: net flagged intervals in one run (+1 flagged,
    /// -1 clean). Harmless bursts and GC pauses last a few intervals; 10 intervals at 1 s is
    /// past them and still fast enough for a live view.
    pub persistence: u32,
    /// More than this fraction of a role degraded in the same interval (and at least 2 volumes;
    /// degraded is half-way, geometrically, to flagged) is a cluster-wide event, not one
    /// volume: a third, lockstep's own choice (docs/domain.md#fail-slow).
    pub cluster_fraction: f64,
    /// A role whose median latency exceeds this multiple of its own history median is slowed
    /// cluster-wide even when no single volume crosses its own 3x rule (a role median is far
    /// less noisy than one volume, so 1.5x is already well outside it). 1.5x rather than 2x
    /// since the peer model sees 1.2x: a whole role slowed 1.5x, each volume a little
    /// differently, otherwise leaves one volume 1.2x above the rest after the onset and blamed.
    pub cluster_latency_factor: f64,
    /// Suspects covering at least this fraction of one node's volumes (and at least 2) are a
    /// node-level limit (instance bandwidth, CPU), not a volume.
    pub node_fraction: f64,
    /// A chokepoint whose IOPS' coefficient of variation after the onset is at or below this is
    /// pinned at a ceiling (a token bucket is far steadier than a device: a healthy volume's
    /// IOPS vary 5-20% from interval to interval, a failing one's more).
    pub throttle_cv: f64,
    /// An interval with errors on more than this fraction of its IOs is flagged. 0: any error,
    /// since a storage benchmark's IOs should not fail at all; the persistence rule still
    /// requires them to be sustained.
    pub error_fraction: f64,
    /// The load generator is the limit when closed-loop volumes keep on average fewer than this
    /// fraction of their configured depth in flight (Little's law: docs/domain.md#littles-law).
    pub load_generator_fraction: f64,
    /// Intervals after the one that made a volume a suspect that the onset search still looks
    /// at (it looks back to the volume's previous episode), and for a cluster-wide episode,
    /// the intervals each side of its first mark.
    pub onset_window: usize,
    /// Intervals of "current demand" for credit forecasts.
    pub forecast_window: usize,
    /// A credit-exhaustion onset matches its forecast when within this fraction of it.
    pub forecast_tolerance: f64,
    /// Time scale of emulated volume models per volume (the timeline does not carry it).
    pub time_scales: Vec<VolumeTimeScale>,
    /// Time scale of volumes not listed in `time_scales` (1: real EBS).
    pub default_time_scale: f64,
}

impl Default for AnalysisOptions {
    fn default() -> Self {
        AnalysisOptions {
            min_slowdown: 1.2,
            peer_z: 3.0,
            spread_floor: 0.05,
            busy_outstanding_fraction: 0.5,
            history_latency_factor: 3.0,
            history_intervals: 60,
            warmup_intervals: 0,
            persistence: 10,
            cluster_fraction: 1.0 / 3.0,
            cluster_latency_factor: 1.5,
            node_fraction: 0.75,
            throttle_cv: 0.1,
            error_fraction: 0.0,
            load_generator_fraction: 0.7,
            onset_window: 30,
            forecast_window: 60,
            forecast_tolerance: 0.1,
            time_scales: Vec::new(),
            default_time_scale: 1.0,
        }
    }
}

impl Confidence {
    /// Sets the level from the figures. Errors are their own evidence: an erroring volume is
    /// sure when most intervals were flagged, whatever its latency.
    fn finish(mut self, kind: ChokepointKind, opts: &AnalysisOptions) -> Confidence {
        let mostly = self.flagged_intervals * 2 >= self.intervals.max(1);
        let clear = self.median_distance >= opts.peer_z && self.slowdown >= opts.min_slowdown
            || kind == ChokepointKind::Erroring;
        self.level = if mostly && clear {
            ConfidenceLevel::Sure
        } else {
            ConfidenceLevel::Suspect
        };
        self
    }
}

/// Sums over a verdict's intervals that the kind and the impact need.
struct EvidenceSums {
    /// Mean of IOPS / peers' median IOPS.
    r_iops_mean: f64,
    /// Mean cluster IOPS.
    cluster_iops: f64,
}

// ---------------------------------------------------------------------------------------------

const LAT_PEER: u8 = 1;
const IOPS_PEER: u8 = 2;
const LAT_HIST: u8 = 4;
const ERR: u8 = 8;
/// Flags that count towards a volume's score.
const FLAGGED: u8 = LAT_PEER | IOPS_PEER | LAT_HIST | ERR;
/// Degraded, without being flagged: past the geometric half-way point of a rule (half the
/// peer model's limit in ln units, or latency above 1.7x its own p90). The cluster-wide guard
/// counts these too: when a third or half of a role slows down together, the peers' median
/// moves into the slow group now and then and the flagged count flickers around the guard's
/// threshold, while the degraded count does not.
const DEGRADED: u8 = 16;

/// The volume has a measured point in the interval (set by [`volume_flags`]).
const PRESENT: u8 = 32;

/// Smallest step (in badness, i.e. log ratio to peers, or in error indicator) the onset split
/// accepts: ln 1.5, well above the segment means' noise over a 30-interval window.
const MIN_STEP: f64 = 0.4;

/// Badness (log deviation from peers) is capped at e^5 (about 150x) so one dead interval does
/// not outweigh a whole segment in the onset split.
const CAP_RATIO: f64 = 148.413_159_102_576_6;

struct Role {
    name: String,
    members: Vec<usize>,
}

struct Layout {
    interval_ms: u64,
    intervals: usize,
    roles: Vec<Role>,
    role_of: Vec<usize>,
    end_ms: u64,
}

impl Layout {
    fn new(t: &Timeline) -> Layout {
        let interval_ms = if t.interval_ms > 0 {
            t.interval_ms
        } else {
            t.volumes
                .iter()
                .flat_map(|v| v.points.first())
                .map(|p| p.len_ms)
                .max()
                .unwrap_or(1)
                .max(1)
        };
        let mut by_name: BTreeMap<&str, usize> = BTreeMap::new();
        let mut roles: Vec<Role> = Vec::new();
        let mut role_of = Vec::with_capacity(t.volumes.len());
        let (mut intervals, mut end_ms) = (0, 0);
        for (v, s) in t.volumes.iter().enumerate() {
            let r = *by_name.entry(s.role.as_str()).or_insert_with(|| {
                roles.push(Role {
                    name: s.role.clone(),
                    members: Vec::new(),
                });
                roles.len() - 1
            });
            roles[r].members.push(v);
            role_of.push(r);
            if let Some(p) = s.points.iter().rev().find(|p| measured(p, interval_ms)) {
                intervals = intervals.max(index(p, interval_ms) + 1);
                end_ms = end_ms.max(p.t_ms);
            }
        }
        Layout {
            interval_ms,
            intervals,
            roles,
            role_of,
            end_ms,
        }
    }
    fn start_ms(&self, idx: usize) -> u64 {
        idx as u64 * self.interval_ms
    }
}

/// Whether a point is a measured interval. A run's last point can be a tail of a few ms (the
/// IOs still in flight at the deadline) whose rates mean nothing: 4 IOs in 1 ms are not
/// 4,000 IOPS. Points shorter than a quarter of the interval are left out, as empty ones are.
pub(crate) fn measured(p: &VolumePoint, interval_ms: u64) -> bool {
    p.len_ms > 0 && p.len_ms.saturating_mul(4) >= interval_ms
}

/// Interval index of a point, from its middle. t_ms is its end on the interval clock and
/// len_ms what the agent measured, a few ms more or less than the interval (and less for the
/// last one): `t_ms - len_ms` put a 1,004 ms point into the interval before its own.
fn index(p: &VolumePoint, interval_ms: u64) -> usize {
    (p.t_ms.saturating_sub(p.len_ms / 2) / interval_ms) as usize
}

fn has_latency(p: &VolumePoint) -> bool {
    p.ios[0] + p.ios[1] > 0 && p.lat_mean_us > 0.0 && p.lat_mean_us.is_finite()
}

/// One role's peers in one interval.
#[derive(Debug, Clone, Copy, Default)]
struct PeerStats {
    /// Mean latency of the volumes that completed IOs.
    lat: Center,
    iops: Center,
    out_med: f64,
    p99_med: f64,
    /// Robust relative spread (CV) of the role's latency and IOPS in this interval (NaN with
    /// fewer than 3 volumes), see [`stats::relative_spread`].
    lat_spread: f64,
    iops_spread: f64,
}

/// The peer model of one role: how far apart healthy volumes of the role are, as a CV, pooled
/// over the run's intervals ([`stats::pooled_spread`]). `None` when no interval had 3 volumes.
#[derive(Debug, Clone, Copy, Default)]
struct RoleSpread {
    lat: Option<f64>,
    iops: Option<f64>,
}

impl RoleSpread {
    /// The sigmas (ln units) the distance rule uses: the pooled spread, at least the floor.
    /// Without a measured spread (a role of 2: one peer) the floor is doubled, since nothing
    /// says how far apart two healthy volumes are.
    fn sigmas(&self, opts: &AnalysisOptions) -> (f64, f64) {
        let f = opts.spread_floor.max(1e-6);
        let s = |x: Option<f64>| x.map_or(2.0 * f, |x| x.max(f));
        (s(self.lat), s(self.iops))
    }
}

/// Per role, per interval peer statistics and the role's spread, and per interval the
/// cluster's total IOPS.
struct Peers {
    roles: Vec<Vec<PeerStats>>,
    spread: Vec<RoleSpread>,
    cluster_iops: Vec<f64>,
}

const BLOCK: usize = 32;

fn peer_stats(t: &Timeline, lay: &Layout) -> Peers {
    let n = lay.intervals;
    let mut cluster_iops = vec![0.0; n];
    let mut roles = Vec::with_capacity(lay.roles.len());
    // Buffers per interval slot of a block; values of one metric for one interval are contiguous
    // so the selection runs on them in place, while each volume's points are read sequentially.
    let mut lat: Vec<Vec<f64>> = vec![Vec::new(); BLOCK];
    let mut iops: Vec<Vec<f64>> = vec![Vec::new(); BLOCK];
    let mut out: Vec<Vec<f64>> = vec![Vec::new(); BLOCK];
    let mut p99: Vec<Vec<f64>> = vec![Vec::new(); BLOCK];
    let mut scratch = Vec::new();
    let mut spread = Vec::with_capacity(lay.roles.len());
    let stride = n.div_ceil(512).max(1);
    for role in &lay.roles {
        let mut cursor = vec![0usize; role.members.len()];
        let mut stats = vec![PeerStats::default(); n];
        for block in (0..n).step_by(BLOCK) {
            let block_end = (block + BLOCK).min(n);
            for b in 0..BLOCK {
                lat[b].clear();
                iops[b].clear();
                out[b].clear();
                p99[b].clear();
            }
            for (m, &v) in role.members.iter().enumerate() {
                let pts = &t.volumes[v].points;
                let mut c = cursor[m];
                while c < pts.len() {
                    let p = &pts[c];
                    if !measured(p, lay.interval_ms) {
                        c += 1;
                        continue;
                    }
                    let i = index(p, lay.interval_ms);
                    if i >= block_end {
                        break;
                    }
                    c += 1;
                    if i < block {
                        continue;
                    }
                    let slot = i - block;
                    let x = p.iops();
                    iops[slot].push(x);
                    cluster_iops[i] += x;
                    out[slot].push(p.outstanding);
                    if has_latency(p) {
                        lat[slot].push(p.lat_mean_us);
                        p99[slot].push(p.lat_p99_us);
                    }
                }
                cursor[m] = c;
            }
            for (slot, s) in stats[block..block_end].iter_mut().enumerate() {
                *s = interval_stats(
                    &mut lat[slot],
                    &mut iops[slot],
                    &mut out[slot],
                    &mut p99[slot],
                );
                // The spread is pooled over the run: a sample of up to ~512 intervals
                // estimates it as well as all of them, at a fraction of the selections.
                if (block + slot) % stride != 0 {
                    continue;
                }
                s.lat_spread = stats::relative_spread(&lat[slot], s.lat.median(), &mut scratch)
                    .unwrap_or(f64::NAN);
                s.iops_spread = stats::relative_spread(&iops[slot], s.iops.median(), &mut scratch)
                    .unwrap_or(f64::NAN);
            }
        }
        let mut pool = |f: fn(&PeerStats) -> f64| {
            scratch.clear();
            scratch.extend(stats.iter().map(f));
            stats::pooled_spread(&mut scratch)
        };
        spread.push(RoleSpread {
            lat: pool(|s| s.lat_spread),
            iops: pool(|s| s.iops_spread),
        });
        roles.push(stats);
    }
    Peers {
        roles,
        spread,
        cluster_iops,
    }
}

fn interval_stats(
    lat: &mut [f64],
    iops: &mut [f64],
    out: &mut [f64],
    p99: &mut [f64],
) -> PeerStats {
    let lat_c = Center::of(lat).unwrap_or_default();
    let iops_c = Center::of(iops).unwrap_or_default();
    PeerStats {
        lat: lat_c,
        iops: iops_c,
        out_med: stats::median(out).unwrap_or(0.0),
        p99_med: stats::median(p99).unwrap_or(0.0),
        lat_spread: f64::NAN,
        iops_spread: f64::NAN,
    }
}

/// A volume's interval against its peers.
#[derive(Debug, Clone, Copy)]
struct Relative {
    /// Latency / peers' median latency (None without completions or peers' latency).
    r_lat: Option<f64>,
    /// IOPS / peers' median IOPS (None without peers).
    r_iops: Option<f64>,
    peer_lat: Option<f64>,
    peer_iops: Option<f64>,
    busy: bool,
}

fn relative(p: &VolumePoint, ps: &PeerStats, opts: &AnalysisOptions) -> Relative {
    let has_lat = has_latency(p);
    let iops = p.iops();
    let peer_iops = ps.iops.median_without(iops).filter(|&m| m > 0.0);
    let peer_lat = if has_lat {
        ps.lat.median_without(p.lat_mean_us)
    } else {
        Some(ps.lat.median())
    }
    .filter(|&m| m > 0.0 && ps.lat.n > 0);
    let r_lat = if has_lat {
        peer_lat.map(|m| p.lat_mean_us / m)
    } else {
        None
    };
    let r_iops = peer_iops.map(|m| iops / m);
    let busy = p.outstanding >= opts.busy_outstanding_fraction * ps.out_med
        || r_lat.is_some_and(|r| r > 1.5)
        || (!has_lat && p.outstanding > 0.0);
    Relative {
        r_lat,
        r_iops,
        peer_lat,
        peer_iops,
        busy,
    }
}

/// Flags a volume's interval earns on its own: latency over a multiple of its own history's
/// p90 (LAT_HIST, and DEGRADED half-way, geometrically), and errors (ERR).
fn own_flags(p: &VolumePoint, hist_p90: Option<f64>, opts: &AnalysisOptions) -> u8 {
    let mut f = 0;
    if let (Some(p90), true) = (hist_p90, has_latency(p)) {
        let ratio = p.lat_mean_us / p90;
        if ratio > opts.history_latency_factor {
            f |= LAT_HIST;
        }
        if ratio > opts.history_latency_factor.sqrt() {
            f |= DEGRADED;
        }
    }
    let errors = p.errors[0] + p.errors[1];
    if errors > 0 {
        let frac = errors as f64 / (errors + p.ios[0] + p.ios[1]) as f64;
        if frac > opts.error_fraction {
            f |= ERR;
        }
    }
    f
}

/// A volume's distance from its peers' center in one interval, in ln units, "more is worse"
/// (0 when at or better than them): `lat`, its latency normalized by its throughput (a volume
/// doing more IOs than its peers may be slower in proportion without being the problem), and
/// `iops`, its IOPS deficit while it has IOs queued (a closed-loop volume shows a slowdown as
/// lost IOPS as much as added latency). A busy volume that completed nothing is at the cap.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Distance {
    lat: f64,
    iops: f64,
}

impl Distance {
    fn of(p: &VolumePoint, ps: &PeerStats, opts: &AnalysisOptions) -> Distance {
        let r = Distance::ratios(p, ps, opts);
        Distance {
            lat: r.lat.ln(),
            iops: r.iops.ln(),
        }
    }

    /// The same as factors (exp of the distances, 1 when at or better than the peers), which
    /// is what the flag rule compares: no logarithm per point.
    fn ratios(p: &VolumePoint, ps: &PeerStats, opts: &AnalysisOptions) -> Distance {
        let rel = relative(p, ps, opts);
        if !has_latency(p) && rel.busy {
            return Distance {
                lat: CAP_RATIO,
                iops: CAP_RATIO,
            };
        }
        let lat = rel
            .r_lat
            .map_or(1.0, |r| r / rel.r_iops.unwrap_or(1.0).max(1.0));
        let iops = match (rel.busy, rel.r_iops) {
            (true, Some(r)) => 1.0 / r.max(1e-9),
            _ => 1.0,
        };
        Distance {
            lat: lat.clamp(1.0, CAP_RATIO),
            iops: iops.clamp(1.0, CAP_RATIO),
        }
    }

    /// In robust units: the larger of the two distances over its peers' sigma.
    fn robust(&self, sigmas: (f64, f64)) -> f64 {
        (self.lat / sigmas.0).max(self.iops / sigmas.1)
    }

    /// The slowdown factor against the peers' center.
    fn factor(&self) -> f64 {
        self.lat.max(self.iops).exp()
    }
}

/// The peer model's flag rule on a smoothed distance (the median of 3 intervals): LAT_PEER or
/// IOPS_PEER when it is both statistically clear (over `peer_z` sigmas) and large enough to
/// matter (over `min_slowdown`), and the interval itself is at least half-way there: the median
/// carries a slowdown over an interval that missed the limit by noise, not over a normal one
/// between a burst and a GC pause. DEGRADED half-way there (in ln units, i.e. geometrically),
/// which the cluster-wide guard counts.
fn peer_flags(smooth: Distance, raw: Distance, lim: &Limits) -> u8 {
    let mut f = 0;
    if smooth.lat > lim.lat_flag && raw.lat > lim.lat_degraded {
        f |= LAT_PEER;
    }
    if smooth.iops > lim.iops_flag && raw.iops > lim.iops_degraded {
        f |= IOPS_PEER;
    }
    if smooth.lat > lim.lat_degraded || smooth.iops > lim.iops_degraded {
        f |= DEGRADED;
    }
    f
}

/// The peer rule's limits as factors (see [`peer_flags`]), and the largest standing that is
/// within the spread (see [`own_standing`]).
struct Limits {
    lat_flag: f64,
    lat_degraded: f64,
    iops_flag: f64,
    iops_degraded: f64,
    lat_within: f64,
    iops_within: f64,
}

impl Limits {
    fn new(sigmas: (f64, f64), opts: &AnalysisOptions) -> Limits {
        let practical = opts.min_slowdown.max(1.0).ln();
        let limit = |sigma: f64| practical.max(opts.peer_z * sigma);
        let (l, i) = (limit(sigmas.0), limit(sigmas.1));
        Limits {
            lat_flag: l.exp(),
            lat_degraded: (l / 2.0).exp(),
            iops_flag: i.exp(),
            iops_degraded: (i / 2.0).exp(),
            lat_within: (opts.peer_z * sigmas.0).exp(),
            iops_within: (opts.peer_z * sigmas.1).exp(),
        }
    }
}

/// A volume's own standing among its peers: its median distance over its history window (the
/// first minute after the warm-up), for each figure whose standing is within the peers' spread
/// (under `peer_z` sigmas), else 0. Healthy volumes of one kind are not identical: one may sit
/// persistently 1.2x slower than the middle of its peers, and a wobble on top of that is not a
/// slowdown. Later distances are measured from that standing. A volume already clearly out in
/// its first minute (throttled from the start) keeps its distances from the peers' center.
/// Zero until half the window has data.
fn own_standing(
    buf: &[(usize, Distance, u8, f64)],
    lim: &Limits,
    opts: &AnalysisOptions,
) -> Distance {
    let from = opts.warmup_intervals;
    let to = from + opts.history_intervals.max(1);
    let in_window = || buf.iter().filter(|x| x.0 >= from && x.0 < to);
    let none = Distance {
        lat: 1.0,
        iops: 1.0,
    };
    if in_window().count() * 2 < opts.history_intervals.max(1) {
        return none;
    }
    let standing = |f: fn(&Distance) -> f64, within: f64| {
        let mut xs: Vec<f64> = in_window().map(|x| f(&x.1)).collect();
        let m = stats::median(&mut xs).unwrap_or(1.0);
        if m < within { m } else { 1.0 }
    };
    Distance {
        lat: standing(|d| d.lat, lim.lat_within),
        iops: standing(|d| d.iops, lim.iops_within),
    }
}

/// Every interval's flags of one volume (indexed by interval; 0 where it has no point).
///
/// The peer rule looks at the median of the distances of the interval and its two neighbours
/// (the interval itself at the edges of the data): a single slow interval (a GC pause) does not
/// count, a run of them counts from its first interval to its last, and an interval that
/// misses the limit by noise inside a slowdown does not reset the score. `buf` is reused; it
/// keeps each point's outstanding IOs too, so the caller needs no second pass over the points.
fn volume_flags(
    s: &VolumeSeries,
    hist: Option<(f64, usize)>,
    stats: &[PeerStats],
    sigmas: (f64, f64),
    lay: &Layout,
    opts: &AnalysisOptions,
    buf: &mut Vec<(usize, Distance, u8, f64)>,
) -> Vec<u8> {
    buf.clear();
    for p in s.points.iter().filter(|p| measured(p, lay.interval_ms)) {
        let i = index(p, lay.interval_ms);
        let hp = hist.filter(|&(_, from)| i >= from).map(|(p90, _)| p90);
        let d = Distance::ratios(p, &stats[i], opts);
        buf.push((i, d, own_flags(p, hp, opts), p.outstanding));
    }
    let lim = Limits::new(sigmas, opts);
    let base = own_standing(buf, &lim, opts);
    let shift = |x: Distance| Distance {
        lat: (x.lat / base.lat).max(1.0),
        iops: (x.iops / base.iops).max(1.0),
    };
    let mut out = vec![0u8; lay.intervals];
    for j in 0..buf.len() {
        let (i, d, own, _) = buf[j];
        let d = shift(d);
        let prev = (j > 0 && buf[j - 1].0 + 1 == i).then(|| shift(buf[j - 1].1));
        let next = buf.get(j + 1).filter(|x| x.0 == i + 1).map(|x| shift(x.1));
        let (a, c) = (prev.unwrap_or(d), next.unwrap_or(d));
        let smooth = Distance {
            lat: stats::median3(a.lat, d.lat, c.lat),
            iops: stats::median3(a.iops, d.iops, c.iops),
        };
        out[i] |= PRESENT | own | peer_flags(smooth, d, &lim);
    }
    out
}

/// Deviation from peers in one interval, for the onset split: the log of how much slower or
/// less productive than its peers the volume is (0 when at or better than them).
fn badness(p: &VolumePoint, ps: &PeerStats, opts: &AnalysisOptions) -> f64 {
    let d = Distance::of(p, ps, opts);
    d.lat.max(d.iops)
}

fn error_indicator(p: &VolumePoint) -> f64 {
    if p.errors[0] + p.errors[1] > 0 {
        1.0
    } else {
        0.0
    }
}

/// The p90 of a volume's mean latency over its history window, and the first interval the
/// history rule applies to. None until half the window has data (a live run's first minute).
fn own_history(
    s: &VolumeSeries,
    lay: &Layout,
    opts: &AnalysisOptions,
    buf: &mut Vec<f64>,
) -> Option<(f64, usize)> {
    let from = opts.warmup_intervals;
    let to = from + opts.history_intervals.max(1);
    buf.clear();
    for p in &s.points {
        if !measured(p, lay.interval_ms) {
            continue;
        }
        let i = index(p, lay.interval_ms);
        if i >= to {
            break;
        }
        if i >= from && has_latency(p) {
            buf.push(p.lat_mean_us);
        }
    }
    if buf.len() * 2 < opts.history_intervals.max(1) {
        return None;
    }
    stats::quantile(buf, 0.9).map(|p90| (p90, to))
}

/// A run of flagged intervals whose score reached the persistence threshold.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Episode {
    /// First flagged interval of the run.
    start: usize,
    /// Interval where the score reached the threshold.
    blamed_at: usize,
    /// First interval after it where the score was back at 0 (the end of the data if never).
    end: usize,
    /// Last flagged interval before `end`: the effect is over after it (the score then decays
    /// for as many intervals as it built up, which are not evidence).
    last: usize,
    /// End of the volume's previous episode (0 if none): the onset search reaches back to it,
    /// because a change that flags only some intervals (an erratic fail-slow) can take several
    /// short runs before one reaches the threshold.
    after: usize,
    peak: u32,
}

/// Score with hysteresis: +1 per flagged interval, -1 per clean one (floored at 0); an episode
/// opens when the score reaches the threshold and closes when it is back at 0.
#[derive(Debug, Clone, Default)]
struct Persistence {
    score: u32,
    peak: u32,
    flagged: u32,
    run_start: usize,
    open: Option<Episode>,
    best: Option<Episode>,
    all: Vec<Episode>,
    last_end: usize,
}

impl Persistence {
    /// `None`: a neutral interval (cluster-wide event), which neither raises nor lowers it.
    fn step(&mut self, idx: usize, flagged: Option<bool>, threshold: u32) {
        match flagged {
            None => {}
            Some(true) => {
                if self.score == 0 {
                    self.run_start = idx;
                }
                self.score += 1;
                self.flagged += 1;
                self.peak = self.peak.max(self.score);
                match &mut self.open {
                    Some(e) => {
                        e.peak = e.peak.max(self.score);
                        e.last = idx;
                    }
                    None if self.score >= threshold.max(1) => {
                        self.open = Some(Episode {
                            start: self.run_start,
                            blamed_at: idx,
                            end: usize::MAX,
                            last: idx,
                            after: self.last_end,
                            peak: self.score,
                        })
                    }
                    None => {}
                }
            }
            Some(false) => {
                self.score = self.score.saturating_sub(1);
                if self.score == 0
                    && let Some(mut e) = self.open.take()
                {
                    e.end = idx;
                    self.keep(e);
                }
            }
        }
    }
    fn keep(&mut self, e: Episode) {
        self.last_end = e.end;
        self.all.push(e);
        if self.best.is_none_or(|b| e.peak > b.peak) {
            self.best = Some(e);
        }
    }
    fn finish(&mut self, end: usize) {
        if let Some(mut e) = self.open.take() {
            e.end = end;
            self.keep(e);
        }
    }
}

/// What the first pass over the volumes finds: each volume's flags (own history, peers), how many
/// volumes of each role are degraded (or flagged) in each interval (the cluster-wide guard
/// needs these before any volume is scored), and closed-loop depth ratios.
struct FirstPass {
    flags: Vec<Vec<u8>>,
    degraded_count: Vec<Vec<u32>>,
    /// Per role and interval, the most degraded volumes on any one node of the role (0 when the
    /// role is on one node): a node-level limit degrades all of one node's volumes together,
    /// which is not the cluster.
    node_degraded: Vec<Vec<u32>>,
    depth_ratios: Vec<f64>,
}

fn first_pass(t: &Timeline, lay: &Layout, peers: &Peers, opts: &AnalysisOptions) -> FirstPass {
    let n = lay.intervals;
    let mut fp = FirstPass {
        flags: Vec::with_capacity(t.volumes.len()),
        degraded_count: vec![vec![0; n]; lay.roles.len()],
        node_degraded: vec![vec![0; n]; lay.roles.len()],
        depth_ratios: Vec::new(),
    };
    // Degraded volumes per (role, node) and interval, for roles on several nodes.
    let mut per_node: HashMap<(usize, &str), Vec<u32>> = HashMap::new();
    let mut nodes_of_role: Vec<std::collections::HashSet<&str>> =
        vec![Default::default(); lay.roles.len()];
    for (v, s) in t.volumes.iter().enumerate() {
        nodes_of_role[lay.role_of[v]].insert(s.node.as_str());
    }
    let (mut buf, mut dist_buf) = (Vec::new(), Vec::new());
    for (v, s) in t.volumes.iter().enumerate() {
        let h = own_history(s, lay, opts, &mut buf);
        let r = lay.role_of[v];
        let sigmas = peers.spread[r].sigmas(opts);
        let f = volume_flags(s, h, &peers.roles[r], sigmas, lay, opts, &mut dist_buf);
        let mut on_node = (nodes_of_role[r].len() >= 2).then(|| {
            per_node
                .entry((r, s.node.as_str()))
                .or_insert_with(|| vec![0; n])
        });
        for (i, (count, &x)) in fp.degraded_count[r].iter_mut().zip(&f).enumerate() {
            // Degraded or flagged.
            let bad = (x & !PRESENT != 0) as u32;
            *count += bad;
            if let Some(c) = on_node.as_mut() {
                c[i] += bad;
            }
        }
        if s.configured_depth > 0 && !dist_buf.is_empty() {
            // The same pass over the points summed the outstanding IOs (see `volume_flags`).
            let out_sum: f64 = dist_buf.iter().map(|x| x.3).sum();
            fp.depth_ratios
                .push(out_sum / dist_buf.len() as f64 / s.configured_depth as f64);
        }
        fp.flags.push(f);
    }
    for ((r, _), counts) in per_node {
        for (most, c) in fp.node_degraded[r].iter_mut().zip(counts) {
            *most = (*most).max(c);
        }
    }
    fp
}

/// Scores every volume's flagged intervals (cluster-wide intervals are neutral).
fn score_volumes(
    lay: &Layout,
    flags: &[Vec<u8>],
    neutral: &[Vec<bool>],
    threshold: u32,
) -> Vec<Persistence> {
    let mut tracks = Vec::with_capacity(flags.len());
    for (v, f) in flags.iter().enumerate() {
        let r = lay.role_of[v];
        let mut pers = Persistence::default();
        for (i, &x) in f.iter().enumerate().filter(|(_, x)| **x & PRESENT != 0) {
            let flagged = (!neutral[r][i]).then_some(x & FLAGGED != 0);
            pers.step(i, flagged, threshold);
        }
        pers.finish(lay.intervals);
        tracks.push(pers);
    }
    tracks
}

/// Analyzes a run's timeline (complete or the data so far) and names its chokepoint.
///
/// Pure and deterministic: the same timeline and options give the same report. Each volume's
/// points must be in time order (as the coordinator appends them); volumes may have different
/// lengths (a lost agent, a live run's stragglers) and points shorter than a quarter of the
/// interval (empty ones, a run's last few ms) are ignored.
pub fn analyze(t: &Timeline, opts: &AnalysisOptions) -> ChokepointReport {
    let lay = Layout::new(t);
    let n = lay.intervals;
    let peers = peer_stats(t, &lay);
    let threshold = opts.persistence.max(1);

    let FirstPass {
        flags,
        degraded_count,
        node_degraded,
        depth_ratios,
    } = first_pass(t, &lay, &peers, opts);

    let ClusterGuard {
        neutral,
        episodes: cluster_eps,
        all: cluster_all,
    } = cluster_guard(&lay, &peers, &degraded_count, &node_degraded, opts);

    let tracks = score_volumes(&lay, &flags, &neutral, threshold);

    let ctx = Ctx {
        t,
        lay: &lay,
        peers: &peers,
        opts,
        flags: &flags,
        neutral: &neutral,
    };
    let volumes = volume_scores(t, &lay, &tracks);

    // Suspects, less those whose episode began with a cluster-wide episode of their role.
    let suspects: Vec<(usize, Episode)> = tracks
        .iter()
        .enumerate()
        .filter_map(|(v, p)| p.best.map(|e| (v, e)))
        .filter(|&(v, e)| {
            !cluster_all.iter().any(|&(r, c)| {
                r == lay.role_of[v]
                    && e.start + 2 * threshold as usize >= c.start
                    && e.start <= c.start + 2 * threshold as usize
            })
        })
        .collect();

    // Volume findings the finder is not sure of are suspects, not verdicts.
    let (candidates, not_sure): (Vec<_>, Vec<_>) = node_and_volume_verdicts(&ctx, &suspects)
        .into_iter()
        .partition(|(c, _)| match c {
            Verdict::Volume(v) => v.confidence.level == ConfidenceLevel::Sure,
            _ => true,
        });
    let suspects: Vec<VolumeVerdict> = not_sure
        .into_iter()
        .filter_map(|(c, _)| match c {
            Verdict::Volume(v) => Some(v),
            _ => None,
        })
        .collect();
    let cluster = cluster_verdict(&ctx, &cluster_eps);
    let load_generator = load_generator_evidence(&depth_ratios, opts);

    let (verdict, also) = choose_verdict(t, opts, candidates, cluster, load_generator.clone());

    let forecasts = credit_forecasts(t, &lay, opts);

    let cluster_episodes = cluster_eps
        .iter()
        .map(|&(r, e)| ClusterEpisode {
            role: lay.roles[r].name.clone(),
            start_ms: lay.start_ms(e.start),
            end_ms: (e.end < n).then(|| lay.start_ms(e.end)),
            peak_score: e.peak,
        })
        .collect();

    ChokepointReport {
        verdict,
        also,
        interval_ms: lay.interval_ms,
        intervals: n,
        analyzed_through_ms: lay.end_ms,
        volumes,
        cluster_episodes,
        forecasts,
        load_generator: load_generator.filter(|lg| lg.volumes_below > 0),
        suspects,
        forecast_before_cliff: None,
        lost: lost_nodes(t),
        phases: Vec::new(),
    }
}

/// Nodes whose every volume stopped reporting (a lost agent), with the time of the first loss.
fn lost_nodes(t: &Timeline) -> Vec<LostNode> {
    let mut by_node: BTreeMap<&str, (Option<u64>, usize, bool)> = BTreeMap::new();
    for s in &t.volumes {
        let e = by_node.entry(s.node.as_str()).or_insert((None, 0, true));
        e.1 += 1;
        match s.lost_at_ms {
            Some(at) => e.0 = Some(e.0.map_or(at, |x: u64| x.min(at))),
            None => e.2 = false,
        }
    }
    by_node
        .into_iter()
        .filter_map(|(node, (at, volumes, all_lost))| {
            Some(LostNode {
                node: node.to_string(),
                at_ms: at.filter(|_| all_lost)?,
                volumes,
            })
        })
        .collect()
}

/// A phase of the run by name and window (ms since the run's start).
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseWindow {
    pub name: String,
    pub start_ms: u64,
    pub end_ms: u64,
}

/// Each phase analyzed on its own: the timeline cut to the phase's intervals (an interval
/// belongs to the phase its end falls in). A phase gets the options of the whole run, so its
/// first intervals are its warm-up and history, as a run's are.
pub fn analyze_phases(
    t: &Timeline,
    phases: &[PhaseWindow],
    opts: &AnalysisOptions,
) -> Vec<PhaseChokepoint> {
    phases
        .iter()
        .map(|p| {
            let mut cut = Timeline {
                interval_ms: t.interval_ms,
                volumes: Vec::with_capacity(t.volumes.len()),
                faults: t.faults.clone(),
            };
            for s in &t.volumes {
                cut.volumes.push(VolumeSeries {
                    node: s.node.clone(),
                    volume: s.volume.clone(),
                    role: s.role.clone(),
                    model: s.model.clone(),
                    configured_depth: s.configured_depth,
                    target_iops: s.target_iops,
                    lost_at_ms: s.lost_at_ms.filter(|&at| at <= p.end_ms),
                    points: s
                        .points
                        .iter()
                        .filter(|x| x.t_ms > p.start_ms && x.t_ms <= p.end_ms)
                        .copied()
                        .collect(),
                });
            }
            PhaseChokepoint {
                phase: p.name.clone(),
                start_ms: p.start_ms,
                end_ms: p.end_ms,
                report: analyze(&cut, opts),
            }
        })
        .collect()
}

/// The cluster-wide guard's output per role.
struct ClusterGuard {
    /// Per role and interval: neutral for single volumes (marked, or near a persistent
    /// cluster-wide episode).
    neutral: Vec<Vec<bool>>,
    /// Each role's worst persistent episode.
    episodes: Vec<(usize, Episode)>,
    /// Every persistent episode of every role.
    all: Vec<(usize, Episode)>,
}

/// Cluster-wide guard per role: many volumes degraded together, or the role's median latency
/// far above its own history.
fn cluster_guard(
    lay: &Layout,
    peers: &Peers,
    degraded_count: &[Vec<u32>],
    node_degraded: &[Vec<u32>],
    opts: &AnalysisOptions,
) -> ClusterGuard {
    let n = lay.intervals;
    let threshold = opts.persistence.max(1);
    let mut neutral: Vec<Vec<bool>> = Vec::with_capacity(lay.roles.len());
    let mut cluster_eps: Vec<(usize, Episode)> = Vec::new();
    let mut cluster_all: Vec<(usize, Episode)> = Vec::new();
    for (r, role_stats) in peers.roles.iter().enumerate() {
        let medians: Vec<f64> = role_stats
            .iter()
            .map(|s| if s.lat.n > 0 { s.lat.median() } else { 0.0 })
            .collect();
        let base = role_history(&medians, opts);
        let marks: Vec<bool> = (0..n)
            .map(|i| {
                // The one node with the most degraded volumes does not count: a node-level
                // limit is the node's (its verdict comes later), not the cluster's.
                let one_node = if node_degraded[r][i] >= 2 {
                    node_degraded[r][i]
                } else {
                    0
                };
                let c = degraded_count[r][i] - one_node;
                let active = (role_stats[i].iops.n as u32).saturating_sub(one_node);
                let many = c >= 2 && c as f64 > opts.cluster_fraction * active as f64;
                let slow = base.is_some_and(|(b, from)| {
                    i >= from && medians[i] > opts.cluster_latency_factor * b
                });
                many || slow
            })
            .collect();
        let mut pers = Persistence::default();
        for (i, &m) in marks.iter().enumerate() {
            if role_stats[i].iops.n > 0 {
                pers.step(i, Some(m), threshold);
            }
        }
        pers.finish(n);
        if let Some(e) = pers.best {
            cluster_eps.push((r, e));
        }
        // Marked intervals are neutral for single volumes, and so is the neighbourhood of a
        // persistent cluster-wide episode: a slowdown that spreads over a few intervals must
        // not blame the volumes it reached first. An isolated mark (a burst on a peer while a
        // culprit is flagged, in a small role) only neutralizes its own interval.
        let mut neutral_r = marks;
        let w = threshold as usize;
        for e in &pers.all {
            let to = (e.last + w + 1).min(n);
            neutral_r[e.start.saturating_sub(w)..to]
                .iter_mut()
                .for_each(|x| *x = true);
        }
        cluster_all.extend(pers.all.iter().map(|&e| (r, e)));
        neutral.push(neutral_r);
    }

    ClusterGuard {
        neutral,
        episodes: cluster_eps,
        all: cluster_all,
    }
}

fn volume_scores(t: &Timeline, lay: &Layout, tracks: &[Persistence]) -> Vec<VolumeScore> {
    t.volumes
        .iter()
        .zip(tracks)
        .map(|(s, p)| VolumeScore {
            node: s.node.clone(),
            volume: s.volume.clone(),
            role: s.role.clone(),
            score: p.score,
            peak_score: p.peak,
            flagged_intervals: p.flagged,
            suspect: p.best.is_some(),
            episode_start_ms: p.best.map(|e| lay.start_ms(e.start)),
        })
        .collect()
}

/// The main verdict and the weaker ones: many nodes limited at once is cluster-wide, then the
/// worst node or volume, then cluster-wide, then the load generator.
fn choose_verdict(
    t: &Timeline,
    opts: &AnalysisOptions,
    mut candidates: Vec<(Verdict, (u32, usize))>,
    cluster: Option<Verdict>,
    load_generator: Option<LoadGeneratorEvidence>,
) -> (Verdict, Vec<Verdict>) {
    let node_count = t
        .volumes
        .iter()
        .map(|s| s.node.as_str())
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    let limited_nodes = candidates
        .iter()
        .filter(|(c, _)| matches!(c, Verdict::Node(_)))
        .count();
    let verdict;
    let mut also = Vec::new();
    if let (true, Some(c)) = (
        limited_nodes >= 2 && limited_nodes as f64 > opts.cluster_fraction * node_count as f64,
        &cluster,
    ) {
        verdict = c.clone();
        also.extend(candidates.drain(..).map(|(c, _)| c));
    } else if !candidates.is_empty() {
        // The worst first: the longest net-flagged run, then the earliest onset.
        candidates.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(a.1.1.cmp(&b.1.1)));
        let mut it = candidates.into_iter().map(|(c, _)| c);
        verdict = it.next().unwrap_or(Verdict::None);
        also.extend(it);
        also.extend(cluster.clone());
    } else if let Some(c) = cluster {
        verdict = c;
    } else if let Some(lg) = load_generator.clone().filter(|lg| {
        lg.volumes_closed_loop > 0 && lg.volumes_below as f64 >= 0.9 * lg.volumes_closed_loop as f64
    }) {
        verdict = Verdict::LoadGeneratorBound(lg);
    } else {
        verdict = Verdict::None;
    }

    (verdict, also)
}

/// When each volume with a credit model runs out of credits at its measured demand.
fn credit_forecasts(t: &Timeline, lay: &Layout, opts: &AnalysisOptions) -> Vec<CreditForecast> {
    let scales = TimeScales::new(opts);
    t.volumes
        .iter()
        .filter_map(|s| {
            let m = CreditModel::for_volume(s.model.as_ref()?)?;
            Some(credit::forecast(
                &s.node,
                &s.volume,
                &m,
                &s.points,
                scales.of(s),
                opts.forecast_window,
                lay.interval_ms,
            ))
        })
        .collect()
}

/// Baseline of a role's median latency series: its median over the history window.
fn role_history(medians: &[f64], opts: &AnalysisOptions) -> Option<(f64, usize)> {
    let from = opts.warmup_intervals.min(medians.len());
    let to = (from + opts.history_intervals.max(1)).min(medians.len());
    let mut xs: Vec<f64> = medians[from..to]
        .iter()
        .copied()
        .filter(|&m| m > 0.0)
        .collect();
    if xs.len() * 2 < opts.history_intervals.max(1) {
        return None;
    }
    stats::median(&mut xs).map(|m| (m, to))
}

/// Time scales by (node, volume).
struct TimeScales<'a> {
    by_volume: HashMap<(&'a str, &'a str), f64>,
    default: f64,
}

impl<'a> TimeScales<'a> {
    fn new(opts: &'a AnalysisOptions) -> Self {
        let by_volume = opts
            .time_scales
            .iter()
            .map(|ts| ((ts.node.as_str(), ts.volume.as_str()), ts.time_scale))
            .collect();
        TimeScales {
            by_volume,
            default: opts.default_time_scale,
        }
    }
    fn of(&self, s: &VolumeSeries) -> f64 {
        self.by_volume
            .get(&(s.node.as_str(), s.volume.as_str()))
            .copied()
            .unwrap_or(self.default)
            .max(f64::MIN_POSITIVE)
    }
}

struct Ctx<'a> {
    t: &'a Timeline,
    lay: &'a Layout,
    peers: &'a Peers,
    opts: &'a AnalysisOptions,
    /// Per volume, each interval's flags ([`volume_flags`]).
    flags: &'a [Vec<u8>],
    /// Per role, intervals that are cluster-wide events (see the guard in `analyze`).
    neutral: &'a [Vec<bool>],
}

impl Ctx<'_> {
    /// A volume's points in the intervals from..to, with their interval index (points are in
    /// time order, so the window is found by bisection).
    fn points(
        &self,
        v: usize,
        from: usize,
        to: usize,
    ) -> impl Iterator<Item = (usize, &VolumePoint)> {
        let iv = self.lay.interval_ms;
        let pts = &self.t.volumes[v].points;
        let start = pts.partition_point(|p| index(p, iv) < from);
        pts[start..]
            .iter()
            .filter(move |p| measured(p, iv))
            .map(move |p| (index(p, iv), p))
            .take_while(move |&(i, _)| i < to)
    }
    fn stats(&self, v: usize, i: usize) -> &PeerStats {
        &self.peers.roles[self.lay.role_of[v]][i]
    }
    fn first_index(&self, v: usize) -> usize {
        self.t.volumes[v]
            .points
            .iter()
            .find(|p| measured(p, self.lay.interval_ms))
            .map_or(0, |p| index(p, self.lay.interval_ms))
    }

    /// Refines an episode's start into the onset: the best two-segment split of the volume's
    /// deviation from its peers around the first flagged interval.
    fn onset(&self, v: usize, e: &Episode, errors: bool) -> usize {
        let first = self.first_index(v);
        if e.start <= first {
            // Slow from its first interval: nothing before to split from.
            return first;
        }
        let w = self.opts.onset_window.max(2);
        let lo = e.after.max(first);
        let hi = (e.last + 1).min(e.blamed_at + w).max(e.blamed_at + 1);
        // Cluster-wide intervals say nothing about the volume against its peers (all slowed
        // together, it looks normal there): they are left out, as they are from its score.
        let neutral = &self.neutral[self.lay.role_of[v]];
        let xs: Vec<(usize, f64)> = self
            .points(v, lo, hi)
            .filter(|&(i, _)| !neutral[i])
            .map(|(i, p)| {
                let x = if errors {
                    error_indicator(p)
                } else {
                    badness(p, self.stats(v, i), self.opts)
                };
                (i, x)
            })
            .collect();
        let vals: Vec<f64> = xs.iter().map(|&(_, x)| x).collect();
        let hint = xs.iter().position(|&(i, _)| i >= e.start).unwrap_or(0);
        // A step as small as the smallest slowdown flagged is a step (0.8 of it: the segment
        // medians carry some noise); the fixed minimum alone would miss a 1.3x onset.
        let min_step = MIN_STEP.min(0.8 * self.opts.min_slowdown.max(1.0).ln());
        match stats::step_onset(&vals, min_step, hint) {
            Some(k) => xs[k].0,
            // A window that is bad throughout has no step to find: bad since the volume's first
            // interval (its first intervals merely missed a threshold), or since its last
            // episode, or we keep the first flagged interval.
            None if lo == first => first,
            None => e.start,
        }
    }

    fn volume_verdict(&self, v: usize, e: &Episode) -> (VolumeVerdict, usize) {
        let s = &self.t.volumes[v];
        let opts = self.opts;
        let first = self.first_index(v);
        // Errors dominate the episode's flags: the onset is when errors began.
        let (mut err_flags, mut all_flags) = (0u32, 0u32);
        for (i, _) in self.points(v, e.start, e.last + 1) {
            let f = self.flags[v][i];
            all_flags += (f & FLAGGED != 0) as u32;
            err_flags += (f & ERR != 0) as u32;
        }
        let erroring = err_flags * 2 >= all_flags.max(1);
        let onset = self.onset(v, e, erroring);
        let end = (e.last + 1).max(onset + 1);

        let (mut ev, sums, mut confidence) = self.evidence(v, first, onset, end);
        // How sure: over the whole episode, from its first flagged interval (or the onset, if
        // earlier) to its last. A volume that drifted to the threshold on marginal intervals
        // and then had a burst is not sure, however bad the burst.
        let sigmas = self.peers.spread[self.lay.role_of[v]].sigmas(opts);
        let (mut dist, mut factor) = (Vec::new(), Vec::new());
        for (i, p) in self.points(v, e.start.min(onset), end) {
            let d = Distance::of(p, self.stats(v, i), opts);
            dist.push(d.robust(sigmas));
            factor.push(d.factor());
        }
        confidence.median_distance = stats::median(&mut dist).unwrap_or(0.0);
        confidence.slowdown = stats::median(&mut factor).unwrap_or(1.0);
        let credit_model = s.model.as_ref().and_then(CreditModel::for_volume);
        let pinned = ev.iops_cv <= opts.throttle_cv && sums.r_iops_mean <= 0.8;
        let kind = if erroring {
            ChokepointKind::Erroring
        } else if pinned {
            let burstable =
                credit_model.is_some() || s.model.as_ref().is_none_or(|m| m.kind.is_empty());
            if ev.fine_before && burstable {
                ChokepointKind::CreditExhaustion
            } else {
                ChokepointKind::Throttled
            }
        } else {
            ChokepointKind::FailSlow
        };
        ev.credit = credit_model.map(|m| self.credit_check(v, m, first, onset, end));

        // With a known credit model, a cliff to exactly the baseline at the moment the model
        // predicts from the demand before it is credit exhaustion even when the history before
        // it is too short to call "fine" on its own (a bucket drained in a few intervals).
        let kind = match &ev.credit {
            Some(c)
                if kind == ChokepointKind::Throttled
                    && c.onset_matches_forecast
                    && c.at_baseline =>
            {
                ChokepointKind::CreditExhaustion
            }
            _ => kind,
        };
        let impact = impact(
            sums.cluster_iops,
            ev.iops,
            ev.peer_iops,
            ev.latency_mean_us,
            ev.peer_latency_mean_us,
        );
        let confidence = confidence.finish(kind, opts);
        let verdict = VolumeVerdict {
            node: s.node.clone(),
            volume: s.volume.clone(),
            role: s.role.clone(),
            model: s.model.clone(),
            kind,
            onset_ms: self.lay.start_ms(onset),
            onset_interval: onset,
            score: e.peak,
            evidence: ev,
            confidence,
            impact,
        };
        (verdict, onset)
    }

    /// The evidence figures of a volume verdict over onset..end (and before the onset), the
    /// sums the kind and impact need, and the confidence figures.
    fn evidence(
        &self,
        v: usize,
        first: usize,
        onset: usize,
        end: usize,
    ) -> (Evidence, EvidenceSums, Confidence) {
        let s = &self.t.volumes[v];
        let opts = self.opts;
        let mut ev = Evidence {
            peers: self.lay.roles[self.lay.role_of[v]]
                .members
                .len()
                .saturating_sub(1),
            configured_depth: s.configured_depth,
            target_iops: s.target_iops,
            ..Default::default()
        };
        let (mut iops, mut peer_iops, mut lat, mut peer_lat, mut p99, mut peer_p99) = (
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
        );
        let (mut out, mut little, mut errors, mut ios, mut cluster, mut r_iops_sum) =
            (0.0, 0.0, 0u64, 0u64, 0.0, 0.0);
        for (i, p) in self.points(v, onset, end) {
            let ps = self.stats(v, i);
            let rel = relative(p, ps, opts);
            ev.intervals += 1;
            ev.flagged_intervals += (self.flags[v][i] & FLAGGED != 0) as u32;
            iops.push(p.iops());
            peer_iops.push(rel.peer_iops.unwrap_or(0.0));
            r_iops_sum += rel.r_iops.unwrap_or(1.0);
            if has_latency(p) {
                lat.push(p.lat_mean_us);
                p99.push(p.lat_p99_us);
                little += p.iops() * p.lat_mean_us / 1e6;
            }
            if let Some(pl) = rel.peer_lat {
                peer_lat.push(pl);
            }
            peer_p99.push(ps.p99_med);
            out += p.outstanding;
            errors += p.errors[0] + p.errors[1];
            ios += p.ios[0] + p.ios[1];
            cluster += self.peers.cluster_iops[i];
        }
        let k = ev.intervals.max(1) as f64;
        ev.iops = mean(&iops);
        ev.iops_median = stats::median(&mut iops).unwrap_or(0.0);
        ev.iops_cv = stats::robust_cv(&mut iops).unwrap_or(0.0);
        ev.peer_iops = mean(&peer_iops);
        ev.latency_mean_us = stats::median(&mut lat).unwrap_or(0.0);
        ev.peer_latency_mean_us = stats::median(&mut peer_lat).unwrap_or(0.0);
        ev.p99_us = stats::median(&mut p99).unwrap_or(0.0);
        ev.peer_p99_us = stats::median(&mut peer_p99).unwrap_or(0.0);
        ev.outstanding = out / k;
        (ev.latency_robust_z, ev.peer_latency_spread) =
            self.robust_z(v, onset, end, ev.latency_mean_us);
        ev.littles_outstanding = little / k;
        ev.error_fraction = if errors + ios > 0 {
            errors as f64 / (errors + ios) as f64
        } else {
            0.0
        };

        // Before the onset: the volume's own level and whether it was at its peers'.
        let (mut before, mut bad_before) = (Vec::new(), Vec::new());
        for (i, p) in self.points(v, first, onset) {
            before.push(p.iops());
            bad_before.push(badness(p, self.stats(v, i), opts));
        }
        ev.iops_before = (!before.is_empty()).then(|| mean(&before));
        ev.fine_before = before.len() >= opts.persistence as usize
            && stats::median(&mut bad_before).is_some_and(|b| b < 0.3);
        let spread = self.peers.spread[self.lay.role_of[v]];
        let confidence = Confidence {
            level: ConfidenceLevel::Sure,
            flagged_intervals: ev.flagged_intervals,
            intervals: ev.intervals,
            median_distance: 0.0,
            peer_cv: spread.lat,
            peer_iops_cv: spread.iops,
            slowdown: 1.0,
        };
        let sums = EvidenceSums {
            r_iops_mean: r_iops_sum / k,
            cluster_iops: cluster / k,
        };
        (ev, sums, confidence)
    }

    /// Credit-model evidence: the demand before the onset, the forecast onset from a full
    /// bucket, whether the measured onset matches it, and the rate after.
    fn credit_check(
        &self,
        v: usize,
        m: CreditModel,
        first: usize,
        onset: usize,
        end: usize,
    ) -> CreditCheck {
        let s = &self.t.volumes[v];
        let opts = self.opts;
        let ts = TimeScales::new(opts).of(s);
        let pre: Vec<f64> = self
            .points(v, first, onset)
            .map(|(_, p)| m.demand(p))
            .collect();
        let mut post: Vec<f64> = self
            .points(v, onset, end)
            .map(|(_, p)| m.demand(p))
            .collect();
        let demand_before = mean(&pre);
        // The level after the cliff is the median: the bucket empties inside the onset
        // interval, which is mostly burst, and its mean would lift a baseline of 180 to 250
        // over 18 intervals.
        let rate_after = stats::median(&mut post).unwrap_or(0.0);
        let forecast_onset_ms = (!pre.is_empty())
            .then(|| m.seconds_to_empty(m.bucket, demand_before, ts))
            .flatten()
            .map(|s| self.lay.start_ms(first) + (s * 1000.0).round() as u64);
        let onset_ms = self.lay.start_ms(onset);
        let matches = forecast_onset_ms.is_some_and(|f| {
            (f as f64 - onset_ms as f64).abs()
                <= opts.forecast_tolerance * f as f64 + 2.0 * self.lay.interval_ms as f64
        });
        CreditCheck {
            time_scale: ts,
            demand_before,
            forecast_onset_ms,
            onset_matches_forecast: matches,
            at_baseline: (rate_after - m.baseline).abs() <= 0.15 * m.baseline,
            rate_after,
            model: m,
        }
    }

    /// See [`Evidence::latency_robust_z`].
    fn robust_z(&self, v: usize, from: usize, to: usize, lat: f64) -> (Option<f64>, f64) {
        let mut peer_logs = Vec::new();
        let mut buf = Vec::new();
        for &u in &self.lay.roles[self.lay.role_of[v]].members {
            if u == v {
                continue;
            }
            buf.clear();
            buf.extend(
                self.points(u, from, to)
                    .filter(|(_, p)| has_latency(p))
                    .map(|(_, p)| p.lat_mean_us),
            );
            if let Some(m) = stats::median(&mut buf) {
                peer_logs.push(m.ln());
            }
        }
        if peer_logs.len() < 3 || lat.is_nan() || lat <= 0.0 {
            return (None, 0.0);
        }
        let (m, mad) = stats::median_mad(&mut peer_logs).unwrap_or((0.0, 0.0));
        let sigma = mad * MAD_TO_SIGMA;
        // Measured against the spread the flags use (never below `spread_floor`), so the
        // evidence and the confidence line speak of the same sigmas.
        let used = sigma.max(self.opts.spread_floor.max(1e-6));
        (Some((lat.ln() - m) / used), sigma)
    }
}

fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

fn impact(cluster_iops: f64, iops: f64, peer_iops: f64, lat: f64, peer_lat: f64) -> Impact {
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 1.0 };
    Impact {
        independent_speedup: ratio(cluster_iops - iops + peer_iops, cluster_iops),
        barrier_speedup: ratio(peer_iops, iops),
        latency_ratio: ratio(lat, peer_lat),
    }
}

/// Groups the suspects: all (or most) volumes of one node together are a node-level limit;
/// the rest are volume verdicts. Each comes with its (peak score, onset) for ranking.
fn node_and_volume_verdicts(
    ctx: &Ctx,
    suspects: &[(usize, Episode)],
) -> Vec<(Verdict, (u32, usize))> {
    let t = ctx.t;
    let mut by_node: BTreeMap<&str, Vec<(usize, Episode)>> = BTreeMap::new();
    for &(v, e) in suspects {
        by_node
            .entry(t.volumes[v].node.as_str())
            .or_default()
            .push((v, e));
    }
    let mut node_sizes: HashMap<&str, usize> = HashMap::new();
    for s in &t.volumes {
        *node_sizes.entry(s.node.as_str()).or_default() += 1;
    }
    let mut out = Vec::new();
    for (node, mut group) in by_node {
        let total = node_sizes[node];
        let together =
            group.iter().map(|(_, e)| e.start).max() <= group.iter().map(|(_, e)| e.last).min();
        let needed = ((ctx.opts.node_fraction * total as f64).ceil() as usize).max(2);
        if together && total >= 2 && group.len() < needed {
            add_companions(ctx, node, &mut group);
        }
        if total >= 2 && group.len() >= needed && together {
            out.push(node_verdict(ctx, node, total, &group));
        } else {
            for (v, e) in group {
                let (vv, onset) = ctx.volume_verdict(v, &e);
                let score = vv.score;
                out.push((Verdict::Volume(vv), (score, onset)));
            }
        }
    }
    out
}

/// Adds to a node's suspects the other volumes of the node that were degraded (at least
/// half-way to flagged) in most of the suspects' common window without reaching the score
/// themselves. A slowdown of a whole node
/// near the limits brings some of its volumes to the threshold and leaves others just short;
/// blaming those that made it one by one would name volumes for what is the node.
fn add_companions(ctx: &Ctx, node: &str, group: &mut Vec<(usize, Episode)>) {
    let from = group.iter().map(|(_, e)| e.start).max().unwrap_or(0);
    let to = group.iter().map(|(_, e)| e.last).min().unwrap_or(0) + 1;
    let Some(&(_, like)) = group.first() else {
        return;
    };
    for (v, s) in ctx.t.volumes.iter().enumerate() {
        if s.node != node || group.iter().any(|&(u, _)| u == v) {
            continue;
        }
        let (mut flagged, mut seen) = (0usize, 0usize);
        for (i, _) in ctx.points(v, from, to) {
            seen += 1;
            flagged += (ctx.flags[v][i] & (FLAGGED | DEGRADED) != 0) as usize;
        }
        if seen > 0 && flagged * 2 >= seen {
            let e = Episode {
                start: from,
                blamed_at: from,
                last: to - 1,
                peak: 0,
                ..like
            };
            group.push((v, e));
        }
    }
}

fn node_verdict(
    ctx: &Ctx,
    node: &str,
    total: usize,
    group: &[(usize, Episode)],
) -> (Verdict, (u32, usize)) {
    let mut onsets: Vec<f64> = group
        .iter()
        .map(|(v, e)| ctx.onset(*v, e, false) as f64)
        .collect();
    let onset = stats::median(&mut onsets).unwrap_or(0.0).round() as usize;
    let end = group
        .iter()
        .map(|(_, e)| e.last + 1)
        .max()
        .unwrap_or(onset + 1)
        .max(onset + 1);
    let score = group.iter().map(|(_, e)| e.peak).max().unwrap_or(0);
    // The peers' IOPS per interval; the node's own sums are `NodeSums`.
    let (mut node_peer, mut lat, mut peer_lat) = (BTreeMap::<usize, f64>::new(), 0.0, 0.0);
    for &(v, _) in group {
        for (i, p) in ctx.points(v, onset, end) {
            let rel = relative(p, ctx.stats(v, i), ctx.opts);
            *node_peer.entry(i).or_default() += rel.peer_iops.unwrap_or(0.0);
            if let (true, Some(pl)) = (has_latency(p), rel.peer_lat) {
                lat += p.lat_mean_us;
                peer_lat += pl;
            }
        }
    }
    let slowed = NodeSums::of(ctx, group.iter().map(|&(v, _)| v), onset, end);
    let (iops, iops_cv, mb_s, mb_s_cv) = (slowed.iops, slowed.iops_cv, slowed.mb_s, slowed.mb_s_cv);
    let mut ceiling = slowed.ceiling(ctx.opts, group.len());
    if ceiling.is_none() && group.len() < total {
        // An instance's ceiling holds the sum of ALL its volumes, and it need not be shared
        // evenly: a volume that takes more than its peers' rate is not slowed, yet its share
        // is part of the flat sum that shows the limit. Only if it takes what the slowed ones
        // lose: a steady volume beside slowed ones that move makes their sum look flatter
        // relative to its size without holding it anywhere.
        let all = (0..ctx.t.volumes.len()).filter(|&v| ctx.t.volumes[v].node == node);
        let all = NodeSums::of(ctx, all, onset, end);
        ceiling = all
            .ceiling(ctx.opts, total)
            .filter(|c| all.takes_up(&slowed, &c.unit));
    }
    let peer_iops = mean(&node_peer.values().copied().collect::<Vec<_>>());
    let cluster = mean(
        &node_peer
            .keys()
            .map(|&i| ctx.peers.cluster_iops[i])
            .collect::<Vec<_>>(),
    );
    let mut volumes: Vec<String> = group
        .iter()
        .map(|(v, _)| ctx.t.volumes[*v].volume.clone())
        .collect();
    volumes.sort();
    let v = NodeVerdict {
        node: node.to_string(),
        volumes,
        volumes_total: total,
        onset_ms: ctx.lay.start_ms(onset),
        onset_interval: onset,
        score,
        iops,
        peer_iops,
        iops_cv,
        mb_s,
        mb_s_cv,
        ceiling,
        confidence: node_confidence(ctx, group, onset, end),
        impact: impact(cluster, iops, peer_iops, lat, peer_lat),
    };
    (Verdict::Node(v), (score, onset))
}

/// MB/s (10^6 bytes) of one interval, both directions.
fn interval_mb_s(p: &VolumePoint) -> f64 {
    if p.len_ms == 0 {
        return 0.0;
    }
    (p.bytes[0] + p.bytes[1]) as f64 / 1e3 / p.len_ms as f64
}

/// A set of a node's volumes summed interval by interval over a slowdown: the mean and robust
/// spread of the sums.
struct NodeSums {
    iops: f64,
    iops_cv: f64,
    mb_s: f64,
    mb_s_cv: f64,
    intervals: usize,
}

impl NodeSums {
    fn of(ctx: &Ctx, volumes: impl Iterator<Item = usize>, onset: usize, end: usize) -> Self {
        let (mut iops, mut mb) = (BTreeMap::<usize, f64>::new(), BTreeMap::<usize, f64>::new());
        for v in volumes {
            for (i, p) in ctx.points(v, onset, end) {
                *iops.entry(i).or_default() += p.iops();
                *mb.entry(i).or_default() += interval_mb_s(p);
            }
        }
        let mut iops: Vec<f64> = iops.into_values().collect();
        let mut mb: Vec<f64> = mb.into_values().collect();
        NodeSums {
            iops: mean(&iops),
            mb_s: mean(&mb),
            intervals: iops.len(),
            iops_cv: stats::robust_cv(&mut iops).unwrap_or(0.0),
            mb_s_cv: stats::robust_cv(&mut mb).unwrap_or(0.0),
        }
    }

    /// Whether this sum (of all a node's volumes) moves by at most half as much as `part`'s
    /// (its slowed volumes'), in `unit`: the rest of the node took up what they lost, as
    /// volumes that share one ceiling do.
    fn takes_up(&self, part: &NodeSums, unit: &str) -> bool {
        let spread = |s: &NodeSums| {
            if unit == "IOPS" {
                s.iops * s.iops_cv
            } else {
                s.mb_s * s.mb_s_cv
            }
        };
        spread(self) <= 0.5 * spread(part)
    }

    /// The ceiling these `volumes` sat at together, if their sum was flat.
    fn ceiling(&self, opts: &AnalysisOptions, volumes: usize) -> Option<NodeCeiling> {
        let mut c = node_ceiling(
            opts,
            (self.mb_s, self.mb_s_cv),
            (self.iops, self.iops_cv),
            self.intervals,
        )?;
        c.volumes = volumes;
        Some(c)
    }
}

/// Intervals of a node's sum it takes to call it flat: fewer could be flat by chance.
const CEILING_MIN_INTERVALS: usize = 3;

/// The ceiling a node's volumes were pinned at together: its summed MB/s (else IOPS) held within
/// `throttle_cv` over the slowdown, as a volume's throttle is recognised. Volumes that are slow
/// on their own vary with their own troubles; volumes that share a ceiling trade throughput
/// among themselves while their sum stays put.
fn node_ceiling(
    opts: &AnalysisOptions,
    (mb_s, mb_s_cv): (f64, f64),
    (iops, iops_cv): (f64, f64),
    intervals: usize,
) -> Option<NodeCeiling> {
    if intervals < CEILING_MIN_INTERVALS {
        return None;
    }
    // The flatter of the two names the ceiling; with one IO size they are equally flat, and
    // large IOs meet a bandwidth limit first, small ones an IOPS limit (AWS quotes instance
    // throughput at 128 KiB IOs: docs/domain.md#instance-limits).
    let large_ios = iops > 0.0 && mb_s * 1e6 / iops >= 128.0 * 1024.0;
    let bandwidth = if (mb_s_cv - iops_cv).abs() <= 0.01 {
        large_ios
    } else {
        mb_s_cv < iops_cv
    };
    if bandwidth && mb_s > 0.0 && mb_s_cv <= opts.throttle_cv {
        Some(NodeCeiling {
            value: mb_s,
            unit: "MB/s".into(),
            volumes: 0,
        })
    } else if iops > 0.0 && iops_cv <= opts.throttle_cv {
        Some(NodeCeiling {
            value: iops,
            unit: "IOPS".into(),
            volumes: 0,
        })
    } else {
        None
    }
}

/// A node verdict's confidence: the same figures as a volume's, over all its degraded volumes
/// from the onset to the end of their episodes.
fn node_confidence(ctx: &Ctx, group: &[(usize, Episode)], onset: usize, end: usize) -> Confidence {
    let (mut dist, mut factor, mut flagged, mut intervals) = (Vec::new(), Vec::new(), 0, 0);
    let mut peer_cv = (None, None);
    for &(v, _) in group {
        let spread = ctx.peers.spread[ctx.lay.role_of[v]];
        peer_cv = (spread.lat, spread.iops);
        let sigmas = spread.sigmas(ctx.opts);
        for (i, p) in ctx.points(v, onset, end) {
            let d = Distance::of(p, ctx.stats(v, i), ctx.opts);
            dist.push(d.robust(sigmas));
            factor.push(d.factor());
            intervals += 1;
            flagged += (ctx.flags[v][i] & FLAGGED != 0) as u32;
        }
    }
    Confidence {
        level: ConfidenceLevel::Sure,
        flagged_intervals: flagged,
        intervals,
        median_distance: stats::median(&mut dist).unwrap_or(0.0),
        peer_cv: peer_cv.0,
        peer_iops_cv: peer_cv.1,
        slowdown: stats::median(&mut factor).unwrap_or(1.0),
    }
    .finish(ChokepointKind::Throttled, ctx.opts)
}

fn cluster_verdict(ctx: &Ctx, eps: &[(usize, Episode)]) -> Option<Verdict> {
    let first = eps.iter().min_by_key(|(_, e)| e.start)?;
    let lay = ctx.lay;
    let mut roles = Vec::new();
    let (mut latency_factor, mut iops_factor, mut degraded, mut volumes) = (0.0f64, 1.0, 0, 0);
    let mut onsets = Vec::new();
    for &(r, e) in eps {
        let stats = &ctx.peers.roles[r];
        // Onset: split of the role median latency (log ratio to its history) around the start.
        let w = ctx.opts.onset_window.max(2);
        let lo = e.start.saturating_sub(w);
        let hi = (e.last + 1)
            .min(e.start + w)
            .max(e.blamed_at + 1)
            .min(stats.len());
        let lat_med = |i: usize| {
            if stats[i].lat.n > 0 {
                stats[i].lat.median()
            } else {
                0.0
            }
        };
        let base: Vec<f64> = (lo..e.start).map(lat_med).filter(|&x| x > 0.0).collect();
        let b = if base.is_empty() {
            lat_med(lo).max(1e-9)
        } else {
            mean(&base)
        };
        let xs: Vec<f64> = (lo..hi)
            .map(|i| (lat_med(i).max(1e-9) / b).ln().max(0.0))
            .collect();
        let onset = stats::step_onset(&xs, MIN_STEP, e.start - lo).map_or(e.start, |k| lo + k);
        onsets.push(onset);
        let before = onset.saturating_sub(ctx.opts.history_intervals.max(1))..onset;
        let during = onset..(e.last + 1).min(stats.len()).max(onset + 1);
        let avg = |range: std::ops::Range<usize>, f: &dyn Fn(&PeerStats) -> f64| {
            let xs: Vec<f64> = range
                .filter(|&i| stats[i].iops.n > 0)
                .map(|i| f(&stats[i]))
                .collect();
            mean(&xs)
        };
        let lat_b = avg(before.clone(), &|s| s.lat.median());
        let lat_d = avg(during.clone(), &|s| s.lat.median());
        let iops_b = avg(before.clone(), &|s| s.iops.median());
        let iops_d = avg(during.clone(), &|s| s.iops.median());
        if lat_b > 0.0 && lat_d / lat_b > latency_factor {
            latency_factor = lat_d / lat_b;
            iops_factor = if iops_b > 0.0 { iops_d / iops_b } else { 1.0 };
        }
        for &v in &lay.roles[r].members {
            volumes += 1;
            let lat_of = |from: usize, to: usize| {
                let xs: Vec<f64> = ctx
                    .points(v, from, to)
                    .filter(|(_, p)| has_latency(p))
                    .map(|(_, p)| p.lat_mean_us)
                    .collect();
                mean(&xs)
            };
            let (b, d) = (
                lat_of(before.start, before.end),
                lat_of(during.start, during.end),
            );
            if b > 0.0 && d > 1.5 * b {
                degraded += 1;
            }
        }
        roles.push(lay.roles[r].name.clone());
    }
    let onset = onsets.iter().copied().min().unwrap_or(first.1.start);
    Some(Verdict::ClusterWide(ClusterVerdict {
        roles,
        onset_ms: lay.start_ms(onset),
        onset_interval: onset,
        latency_factor,
        iops_factor,
        volumes_degraded: degraded,
        volumes,
    }))
}

fn load_generator_evidence(
    ratios: &[f64],
    opts: &AnalysisOptions,
) -> Option<LoadGeneratorEvidence> {
    if ratios.is_empty() {
        return None;
    }
    let below = ratios
        .iter()
        .filter(|&&r| r < opts.load_generator_fraction)
        .count();
    let mut rs = ratios.to_vec();
    Some(LoadGeneratorEvidence {
        volumes_below: below,
        volumes_closed_loop: ratios.len(),
        outstanding_ratio: stats::median(&mut rs).unwrap_or(0.0),
    })
}

/// For a credit-exhaustion chokepoint: the forecast the finder makes from the timeline cut
/// half-way to the onset (what the live view showed then), compared with the actual onset.
pub fn forecast_before_cliff(
    t: &Timeline,
    opts: &AnalysisOptions,
    final_report: &ChokepointReport,
) -> Option<ForecastBeforeCliff> {
    let Verdict::Volume(v) = &final_report.verdict else {
        return None;
    };
    if v.kind != ChokepointKind::CreditExhaustion || v.onset_ms == 0 {
        return None;
    }
    let cut = v.onset_ms / 2;
    let mut early = t.clone();
    for s in &mut early.volumes {
        s.points.retain(|p| p.t_ms <= cut);
    }
    let r = analyze(&early, opts);
    let f = r
        .forecasts
        .iter()
        .find(|f| f.node == v.node && f.volume == v.volume)?;
    let predicted = f.runs_out_at_ms?;
    Some(ForecastBeforeCliff {
        node: v.node.clone(),
        volume: v.volume.clone(),
        made_at_ms: cut,
        predicted_ms: predicted,
        actual_onset_ms: v.onset_ms,
        error_pct: (predicted as f64 - v.onset_ms as f64) / v.onset_ms as f64 * 100.0,
    })
}

#[cfg(test)]
mod tests;
