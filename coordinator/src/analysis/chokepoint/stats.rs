//! Robust statistics the finder is built on: exact medians (and the median of a set with one
//! member left out), the median absolute deviation, nearest-rank quantiles, and the two-segment
//! mean split that places an onset.
//!
//! Everything here is O(n) (selection, not sorting) because the finder runs these over every
//! interval of every role: 3,600 intervals x 8,000 volumes in the sizing target.

use std::cmp::Ordering;

/// Scale from the MAD to the standard deviation of a normal distribution (1 / Phi^-1(3/4)), so a
/// MAD-based sigma can be read like a standard deviation.
pub const MAD_TO_SIGMA: f64 = 1.4826;

fn cmp(a: &f64, b: &f64) -> Ordering {
    a.total_cmp(b)
}

/// The order statistics around the middle of a set, enough to answer "median of the set" and
/// "median of the set without one of its members" (a volume's peers exclude the volume itself;
/// with 3 volumes in a role, including the culprit would pull its own reference towards it).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Center {
    /// Number of values.
    pub n: u32,
    /// With k = n / 2 over the sorted values a: a[k-1] (or a[0] when n == 1).
    pub below: f64,
    /// a[k].
    pub mid: f64,
    /// a[k+1] (or a[k] when there is none).
    pub above: f64,
}

impl Center {
    /// Computes the center of `xs` (reordering it); `None` when empty. NaNs must be filtered out
    /// by the caller (they would sort last and bias the median upwards).
    pub fn of(xs: &mut [f64]) -> Option<Center> {
        let n = xs.len();
        if n == 0 {
            return None;
        }
        let k = n / 2;
        let (left, mid, right) = xs.select_nth_unstable_by(k, cmp);
        let mid = *mid;
        let below = left.iter().copied().max_by(cmp).unwrap_or(mid);
        let above = right.iter().copied().min_by(cmp).unwrap_or(mid);
        Some(Center {
            n: n as u32,
            below,
            mid,
            above,
        })
    }

    /// The median: the middle value, or the mean of the two middle values for an even count.
    pub fn median(&self) -> f64 {
        if self.n % 2 == 1 {
            self.mid
        } else {
            (self.below + self.mid) / 2.0
        }
    }

    /// The median of the set with one member equal to `x` removed; `None` when nothing is left.
    /// Exact when `x` is a member (which the finder guarantees: it asks on behalf of a volume
    /// whose value is in the set).
    pub fn median_without(&self, x: f64) -> Option<f64> {
        match self.n {
            0 | 1 => None,
            n if n % 2 == 1 => Some(match x.total_cmp(&self.mid) {
                Ordering::Less => (self.mid + self.above) / 2.0,
                Ordering::Greater => (self.below + self.mid) / 2.0,
                Ordering::Equal => (self.below + self.above) / 2.0,
            }),
            _ => Some(if x <= self.below {
                self.mid
            } else if x >= self.mid {
                self.below
            } else {
                (self.below + self.mid) / 2.0
            }),
        }
    }
}

/// Median of `xs` (reordering it); `None` when empty.
pub fn median(xs: &mut [f64]) -> Option<f64> {
    Center::of(xs).map(|c| c.median())
}

/// Median and median absolute deviation (unscaled: multiply by [`MAD_TO_SIGMA`] for a sigma) of
/// `xs`, reordering it and then overwriting it with the deviations.
pub fn median_mad(xs: &mut [f64]) -> Option<(f64, f64)> {
    let m = median(xs)?;
    for x in xs.iter_mut() {
        *x = (*x - m).abs();
    }
    Some((m, median(xs)?))
}

/// Nearest-rank quantile (`q` in 0..=1) of `xs`, reordering it: the smallest value with at least
/// a fraction `q` of the values at or below it. `None` when empty.
pub fn quantile(xs: &mut [f64], q: f64) -> Option<f64> {
    let n = xs.len();
    if n == 0 {
        return None;
    }
    let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as usize).clamp(1, n);
    let (_, v, _) = xs.select_nth_unstable_by(rank - 1, cmp);
    Some(*v)
}

/// Robust coefficient of variation: MAD x 1.4826 / median, so a few outlying intervals (a burst
/// on a throttled volume) do not hide that it is pinned. `None` when empty or the median is 0.
pub fn robust_cv(xs: &mut [f64]) -> Option<f64> {
    let (m, mad) = median_mad(xs)?;
    (m > 0.0).then(|| mad * MAD_TO_SIGMA / m)
}

/// The split `k` (1..len) that best cuts `xs` into two constant segments `xs[..k]` and `xs[k..]`
/// (least squares: maximizes k (n - k) / n * (mean_left - mean_right)^2), with the gain (the
/// drop in the sum of squared errors) it achieves. `None` for fewer than 2 values.
///
/// This is the single change point of a step: where a volume's behaviour changed. It uses the
/// whole window rather than the first threshold crossing, so one slow interval just before a
/// cliff does not move the onset.
pub fn split_point(xs: &[f64]) -> Option<(usize, f64)> {
    let n = xs.len();
    if n < 2 {
        return None;
    }
    let total: f64 = xs.iter().sum();
    let mut left = 0.0;
    let mut best: Option<(usize, f64)> = None;
    for k in 1..n {
        left += xs[k - 1];
        let (nl, nr) = (k as f64, (n - k) as f64);
        let d = left / nl - (total - left) / nr;
        let gain = nl * nr / n as f64 * d * d;
        if best.is_none_or(|(_, g)| gain > g) {
            best = Some((k, gain));
        }
    }
    best
}

/// The onset of an upward step in `xs`: the first index of the worse segment, or `None` when
/// there is no step of at least `min_step` between the segments' medians.
///
/// Least squares alone is pulled by magnitudes: a 5-interval burst at 30x just before a 3x
/// throttle can move the split onto the burst. So the least-squares split only estimates the
/// two levels; each value is then classified as nearer the lower or the upper level, values
/// more than a step above the upper level count for neither (bursts), and the onset is the
/// index that misclassifies the fewest values. Ties are real (a burst shortly before a step
/// ties with the step itself: the gap between them costs as much as the burst; an erratic
/// slowdown has dips after its onset): they go to the candidate nearest `hint`, the first
/// interval of the run that was flagged persistently.
pub fn step_onset(xs: &[f64], min_step: f64, hint: usize) -> Option<usize> {
    let (k0, _) = split_point(xs)?;
    let levels = |k: usize| {
        Some((
            median(&mut xs[..k].to_vec())?,
            median(&mut xs[k..].to_vec())?,
        ))
    };
    let (mut low, mut high) = levels(k0)?;
    // One tall spike early in a long quiet window (a GC pause at 20x, 130 intervals before a
    // 10-interval 1.3x slowdown) is a better least-squares split than the step itself, and
    // both of its segments' medians are quiet. The hint (where the persistent flags began) then
    // estimates the levels instead.
    if high - low < min_step && hint > 0 && hint < xs.len() {
        (low, high) = levels(hint)?;
    }
    if high - low < min_step {
        return None;
    }
    let mid = (low + high) / 2.0;
    let burst = high + (high - low);
    // cost(k) = upper-level values before k + lower-level values from k on.
    let mut cost = xs.iter().filter(|&&x| x <= mid).count();
    let mut best: (usize, usize) = (cost, 0);
    for (k, &x) in xs.iter().enumerate() {
        if x > burst {
            continue;
        }
        if x > mid {
            cost += 1
        } else {
            cost -= 1
        }
        if cost < best.0
            || (cost == best.0 && (k + 1).abs_diff(hint) < usize::abs_diff(best.1, hint))
        {
            best = (cost, k + 1);
        }
    }
    // A departure in two stages (an open-loop queue that builds: IOPS down at once, latency up
    // to its cap a few intervals later) has its first stage nearer the low level than the
    // high: clearly out of the baseline, but classified low. Those values just before the
    // split, from the hint on, belong to the episode: the onset is where they begin.
    let mut k = best.1;
    while k > hint && xs[k - 1] >= low + min_step && xs[k - 1] <= burst {
        k -= 1;
    }
    (k > 0 && k < xs.len()).then_some(k)
}

/// Small-sample consistency factor of the MAD-based sigma: with n values the MAD is biased low
/// (for 3 values it is the smaller of the two distances from the middle one), so
/// `1.4826 x MAD x factor(n)` estimates the standard deviation of normal data without bias.
/// The factors for 2 to 9 values are the tabulated ones; above, n / (n - 0.8). A unit test
/// checks them by simulation. Roles of a handful of volumes are common (3 nodes, 1-3 volumes),
/// and an unbiased spread is what keeps the peer model from flagging ordinary noise there.
pub fn mad_factor(n: usize) -> f64 {
    const SMALL: [f64; 8] = [1.196, 1.495, 1.363, 1.206, 1.200, 1.140, 1.129, 1.107];
    match n {
        0 | 1 => f64::NAN,
        2..=9 => SMALL[n - 2],
        _ => n as f64 / (n as f64 - 0.8),
    }
}

/// Relative robust spread of `xs` around their median `m`: 1.4826 x MAD / m x [`mad_factor`],
/// i.e. a robust coefficient of variation, which is also the spread of ln x for spreads of a
/// few percent. `scratch` holds the deviations. `None` for fewer than 3 values (with two, the
/// spread cannot tell a slow volume from a noisy pair) or a median of 0.
pub fn relative_spread(xs: &[f64], m: f64, scratch: &mut Vec<f64>) -> Option<f64> {
    if xs.len() < 3 || m <= 0.0 || !m.is_finite() {
        return None;
    }
    scratch.clear();
    scratch.extend(xs.iter().map(|&x| (x - m).abs()));
    let mad = median(scratch)?;
    Some(mad * MAD_TO_SIGMA * mad_factor(xs.len()) / m)
}

/// One spread for a whole series of per-interval spreads: their mean after capping each at 3x
/// their median. The mean of unbiased estimates is unbiased (a median of them is not: one
/// interval's spread from a few volumes is skewed), and the cap keeps a few intervals of a
/// partial slowdown (half a role slower for a while) from inflating it. `None` when empty.
pub fn pooled_spread(xs: &mut Vec<f64>) -> Option<f64> {
    xs.retain(|x| x.is_finite());
    let cap = 3.0 * median(xs)?;
    Some(xs.iter().map(|&x| x.min(cap)).sum::<f64>() / xs.len() as f64)
}

/// Median of three values.
pub fn median3(a: f64, b: f64, c: f64) -> f64 {
    a.max(b).min(a.min(b).max(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_and_empty() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&mut [7.0]), Some(7.0));
        assert_eq!(median(&mut []), None);
    }

    #[test]
    fn mad_exact_values() {
        // Values 1 2 3 4 100: median 3, deviations 2 1 0 1 97 -> MAD 1; the outlier does not
        // move it (a standard deviation would be about 39).
        let (m, mad) = median_mad(&mut [1.0, 2.0, 3.0, 4.0, 100.0]).unwrap();
        assert_eq!((m, mad), (3.0, 1.0));
        // Even count: median 2.5, deviations 1.5 0.5 0.5 1.5 -> MAD 1.
        let (m, mad) = median_mad(&mut [1.0, 2.0, 3.0, 4.0]).unwrap();
        assert_eq!((m, mad), (2.5, 1.0));
    }

    #[test]
    fn median_without_matches_brute_force() {
        let sets: [&[f64]; 5] = [
            &[5.0, 1.0],
            &[1.0, 9.0, 3.0],
            &[2.0, 2.0, 7.0, 1.0],
            &[10.0, 1.0, 3.0, 3.0, 8.0],
            &[4.0, 6.0, 1.0, 9.0, 2.0, 7.0],
        ];
        for set in sets {
            let c = Center::of(&mut set.to_vec()).unwrap();
            for (i, &x) in set.iter().enumerate() {
                let mut rest: Vec<f64> = set.to_vec();
                rest.remove(i);
                assert_eq!(
                    c.median_without(x),
                    median(&mut rest),
                    "set {set:?} without {x}"
                );
            }
        }
        assert_eq!(Center::of(&mut [3.0]).unwrap().median_without(3.0), None);
    }

    #[test]
    fn quantile_nearest_rank() {
        let xs: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(quantile(&mut xs.clone(), 0.9), Some(9.0));
        assert_eq!(quantile(&mut xs.clone(), 0.91), Some(10.0));
        assert_eq!(quantile(&mut xs.clone(), 0.0), Some(1.0));
        assert_eq!(quantile(&mut xs.clone(), 1.0), Some(10.0));
    }

    #[test]
    fn robust_cv_ignores_a_burst() {
        // 18 intervals pinned at 100 and two burst intervals: a plain CV (0.28 here) says
        // "varies", the robust one says "pinned".
        let mut xs = vec![100.0; 18];
        xs.extend([10.0, 20.0]);
        assert_eq!(robust_cv(&mut xs), Some(0.0));
        let cv = robust_cv(&mut [90.0, 100.0, 110.0]).unwrap();
        assert!((cv - 0.14826).abs() < 1e-9);
        assert_eq!(robust_cv(&mut []), None);
        assert_eq!(robust_cv(&mut [0.0, 0.0]), None);
    }

    #[test]
    fn split_point_finds_the_step_despite_a_spike() {
        let mut xs = vec![0.0; 20];
        xs[5] = 3.0; // a lone slow interval before the step
        xs.extend(std::iter::repeat_n(2.0, 20));
        assert_eq!(split_point(&xs).unwrap().0, 20);
        assert_eq!(split_point(&[1.0]), None);
    }

    #[test]
    fn step_onset_ignores_a_tall_burst_before_the_step() {
        // 20 quiet, a 5-interval burst at 3.0, 6 quiet, then a sustained step to 1.2.
        let mut xs = vec![0.0; 20];
        xs.extend([3.0; 5]);
        xs.extend([0.0; 6]);
        xs.extend([1.2; 30]);
        assert_eq!(step_onset(&xs, 0.4, 31), Some(31));
        // Least squares alone puts it on the burst.
        assert_eq!(split_point(&xs).unwrap().0, 20);
        // No step: bad throughout, or a step smaller than asked.
        assert_eq!(step_onset(&[1.0; 30], 0.4, 0), None);
        let mut small = vec![0.0; 15];
        small.extend([0.2; 15]);
        assert_eq!(step_onset(&small, 0.4, 15), None);
        // A tie (one dip after the step costs as much as one spike before it) goes to the hint.
        let mut tie = vec![0.0; 10];
        tie.extend([1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]);
        assert_eq!(step_onset(&tie, 0.4, 10), Some(10));
        assert_eq!(step_onset(&tie, 0.4, 12), Some(12));
    }

    /// The e2e node-limit run on a loaded host: four intervals of IOPS deficit alone (the
    /// peers' latency noisy too), then the queue's latency at the cap. The onset is where the
    /// deficit began, not where the latency reached its cap.
    #[test]
    fn step_onset_keeps_the_first_stage_of_a_two_stage_departure() {
        let mut xs = vec![0.05; 8];
        xs.extend([1.2, 1.9, 1.6, 2.3]);
        xs.extend([5.0; 14]);
        assert_eq!(step_onset(&xs, 0.4, 8), Some(8));
        // Not before the first flagged interval, however high the values before it.
        assert_eq!(step_onset(&xs, 0.4, 10), Some(10));
        // A dip back to the baseline between the first stage and the step ends the walk back.
        xs[10] = 0.05;
        assert_eq!(step_onset(&xs, 0.4, 8), Some(11));
    }

    #[test]
    fn step_onset_finds_a_short_late_step_after_an_early_spike() {
        // 130 quiet intervals with one 20x spike early on, then 10 at 1.3x: least squares
        // splits at the spike, the hint (first persistently flagged interval) finds the step.
        let mut xs = vec![0.01; 130];
        xs[3] = 20f64.ln();
        xs.extend([1.3f64.ln(); 10]);
        assert_eq!(split_point(&xs).unwrap().0, 4);
        assert_eq!(step_onset(&xs, 0.146, 130), Some(130));
        // Without a step at the hint either, still none.
        let mut flat = vec![0.01; 140];
        flat[3] = 20f64.ln();
        assert_eq!(step_onset(&flat, 0.146, 130), None);
    }
    #[test]
    fn mad_factor_makes_small_sample_sigmas_unbiased() {
        // Normal values from a fixed generator: the mean of the corrected sigma over many
        // small sets is within a few percent of the true sigma (1).
        let mut state = 0x1234_5678_9ABC_DEF0u64;
        let mut unit = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        for n in [3usize, 4, 5, 8, 12] {
            let trials = 40_000;
            let mut sum = 0.0;
            let mut scratch = Vec::new();
            for _ in 0..trials {
                // 100 + N(0, 1) (Box-Muller), spread relative to 100.
                let xs: Vec<f64> = (0..n)
                    .map(|_| {
                        let (u1, u2) = (unit(), unit());
                        100.0 + (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
                    })
                    .collect();
                let m = median(&mut xs.clone()).unwrap();
                sum += relative_spread(&xs, m, &mut scratch).unwrap() * m;
            }
            let mean = sum / trials as f64;
            assert!((mean - 1.0).abs() < 0.05, "n {n}: mean sigma {mean}");
        }
        assert_eq!(relative_spread(&[1.0, 2.0], 1.5, &mut Vec::new()), None);
    }

    #[test]
    fn pooled_spread_caps_outlying_intervals() {
        let mut xs = vec![0.05; 90];
        xs.extend([5.0; 10]);
        let p = pooled_spread(&mut xs).unwrap();
        assert!((p - 0.06).abs() < 1e-12, "{p}");
        assert_eq!(pooled_spread(&mut vec![f64::NAN]), None);
        assert_eq!(median3(3.0, 1.0, 2.0), 2.0);
        assert_eq!(median3(1.0, 1.0, 9.0), 1.0);
    }

    proptest::proptest! {
        #[test]
        fn median3_is_the_middle(a in -1e6f64..1e6, b in -1e6f64..1e6, c in -1e6f64..1e6) {
            let mut v = [a, b, c];
            v.sort_by(f64::total_cmp);
            proptest::prop_assert_eq!(median3(a, b, c), v[1]);
        }
    }
}
