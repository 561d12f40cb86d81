//! Keeping rows whose count reaches a threshold: the filter most policies start with
//! (at least N cached blocks), written once for the built-in one and Rust plugins.

/// Sets `keep[row]` to whether `values[row] >= minimum`, for the rows both hold.
///
/// Compared in the column's own type: for a whole number v and a threshold m >= 0,
/// v >= m exactly when v >= ceil(m), and a 32-bit integer comparison vectorizes where a
/// conversion to `f64` per row does not. NaN keeps nothing, as `v as f64 >= NaN` would.
pub fn keep_at_least(values: &[u32], minimum: f64, keep: &mut [bool]) {
    let threshold = minimum.ceil();
    if threshold.is_nan() || threshold > f64::from(u32::MAX) {
        keep.iter_mut().for_each(|k| *k = false);
        return;
    }
    // In 0..=u32::MAX after the check (a negative threshold saturates to 0, which every
    // count reaches).
    let threshold = threshold as u32;
    for (k, &value) in keep.iter_mut().zip(values) {
        *k = value >= threshold;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same answer as the comparison in `f64`, at and around every edge.
    #[test]
    fn keeps_exactly_what_the_float_comparison_keeps() {
        let values = [0, 1, 2, 3, 4, 5, 63, 64, u32::MAX - 1, u32::MAX];
        let minimums = [
            0.0,
            -0.0,
            -3.5,
            0.5,
            1.0,
            3.999,
            4.0,
            4.001,
            64.0,
            f64::from(u32::MAX),
            f64::from(u32::MAX) + 0.5,
            1e300,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ];
        for minimum in minimums {
            let mut keep = [true; 10];
            keep_at_least(&values, minimum, &mut keep);
            let expected = values.map(|v| f64::from(v) >= minimum);
            assert_eq!(keep, expected, "minimum {minimum}");
        }
    }
}
