//! kvroute's cost per request as a statistic: the difference of the two arms' medians over paired
//! samples, with a seeded bootstrap 95% interval (the pairs resampled with replacement). Medians,
//! not means, because a loopback latency has a long right tail that one stall would dominate.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::percentile;

/// The median of `v` (reordered), the mean of the two middle values for an even count.
fn median_in_place(v: &mut [f64]) -> Option<f64> {
    let n = v.len();
    if n == 0 {
        return None;
    }
    let mid = n / 2;
    let upper = *v.select_nth_unstable_by(mid, f64::total_cmp).1;
    if n % 2 == 1 {
        return Some(upper);
    }
    // The values before `mid` are the lower half; the lower middle is the largest of them.
    let lower = v.get(..mid)?.iter().copied().max_by(f64::total_cmp)?;
    Some((lower + upper) / 2.0)
}

/// The median of the finite values, `None` for none.
pub(super) fn median_of(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
    median_in_place(&mut v)
}

/// p50(a) − p50(b) over paired samples, and its bootstrap 95% interval (pairs resampled with
/// replacement, `resamples` times, seeded).
pub fn median_difference(
    pairs: &[(f64, f64)],
    resamples: usize,
    seed: u64,
) -> (Option<f64>, Option<(f64, f64)>) {
    let mut a: Vec<f64> = pairs.iter().map(|p| p.0).collect();
    let mut b: Vec<f64> = pairs.iter().map(|p| p.1).collect();
    let diff = median_in_place(&mut a).zip(median_in_place(&mut b));
    let Some((ma, mb)) = diff else {
        return (None, None);
    };
    if resamples == 0 || pairs.len() < 2 {
        return (Some(ma - mb), None);
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let n = pairs.len();
    let mut diffs = Vec::with_capacity(resamples);
    for _ in 0..resamples {
        a.clear();
        b.clear();
        for _ in 0..n {
            if let Some(&(x, y)) = pairs.get(rng.gen_range(0..n)) {
                a.push(x);
                b.push(y);
            }
        }
        if let (Some(x), Some(y)) = (median_in_place(&mut a), median_in_place(&mut b)) {
            diffs.push(x - y);
        }
    }
    let lo = percentile(&diffs, 2.5);
    let hi = percentile(&diffs, 97.5);
    (Some(ma - mb), lo.zip(hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_in_place_matches_percentile() {
        for n in 1..40 {
            let v: Vec<f64> = (0..n).map(|i| ((i * 7919) % 101) as f64).collect();
            let mut w = v.clone();
            assert_eq!(median_in_place(&mut w), percentile(&v, 50.0));
        }
    }

    #[test]
    fn a_constant_shift_is_found_with_a_tight_interval() {
        let pairs: Vec<(f64, f64)> = (0..500)
            .map(|i| {
                let base = 300.0 + ((i * 37) % 50) as f64;
                (base + 20.0, base)
            })
            .collect();
        let (d, ci) = median_difference(&pairs, 500, 1);
        assert_eq!(d, Some(20.0));
        let (lo, hi) = ci.expect("interval");
        assert!(lo <= 20.0 && 20.0 <= hi, "{lo} {hi}");
    }
}
