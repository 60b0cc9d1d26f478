//! Robust statistics of a series against its index: the Theil–Sen slope
//! and Kendall's τ.

/// +1 when `a > b`, −1 when `a < b`, 0 when equal.
pub(super) fn sign(a: u64, b: u64) -> i64 {
    match a.cmp(&b) {
        std::cmp::Ordering::Greater => 1,
        std::cmp::Ordering::Less => -1,
        std::cmp::Ordering::Equal => 0,
    }
}

/// Median of pairwise slopes `(y_j − y_i) / (j − i)`.
pub(crate) fn theil_sen(ys: &[f64]) -> f64 {
    let n = ys.len();
    if n < 2 {
        return 0.0;
    }
    let mut slopes = Vec::with_capacity(n * (n - 1) / 2);
    for i in 0..n {
        for j in i + 1..n {
            slopes.push((ys[j] - ys[i]) / (j - i) as f64);
        }
    }
    // The median by selection (linear), not by sorting.
    let m = slopes.len();
    let (lower, &mut upper, _) = slopes.select_nth_unstable_by(m / 2, f64::total_cmp);
    if m % 2 == 1 {
        upper
    } else {
        let below = lower
            .iter()
            .copied()
            .max_by(f64::total_cmp)
            .unwrap_or(upper);
        (below + upper) / 2.0
    }
}

/// Kendall's τ-a between index and value: +1 when every later value is higher.
pub(crate) fn kendall_tau(ys: &[f64]) -> f64 {
    let n = ys.len();
    if n < 2 {
        return 0.0;
    }
    let mut s = 0i64;
    for i in 0..n {
        for j in i + 1..n {
            s += match ys[j].total_cmp(&ys[i]) {
                std::cmp::Ordering::Greater => 1,
                std::cmp::Ordering::Less => -1,
                std::cmp::Ordering::Equal => 0,
            };
        }
    }
    s as f64 / (n * (n - 1) / 2) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn robust_statistics() {
        assert_eq!(theil_sen(&[1.0, 2.0, 3.0, 4.0]), 1.0);
        // One outlier does not move the slope.
        assert_eq!(theil_sen(&[0.0, 1.0, 100.0, 3.0, 4.0]), 1.0);
        assert_eq!(kendall_tau(&[1.0, 2.0, 3.0]), 1.0);
        assert_eq!(kendall_tau(&[3.0, 2.0, 1.0]), -1.0);
        assert_eq!(kendall_tau(&[1.0, 1.0, 1.0]), 0.0);
    }
}
