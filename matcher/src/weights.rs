//! Predicted throughputs (floats) to the integer weights the solver is exact on.
//!
//! A weight is `round(w × SCALE)` with `SCALE = 10⁶`: normalized throughputs in
//! (0, 1] keep six decimals, far finer than any predictor's accuracy, and sums
//! over 10⁵ jobs stay far inside i64. Positive predictions that round to 0 are
//! kept as 1 so a feasible pair stays a candidate. Two pairs whose floats differ
//! by less than 5·10⁻⁷ may get equal integers; the solver is exact on the
//! integers, which is the documented meaning of "exact".

/// Integer units per 1.0 of normalized throughput.
pub const SCALE: f64 = 1_000_000.0;

/// The integer weight of a predicted throughput; `None` for anything that is
/// not a positive finite number (not a candidate).
pub fn quantize(w: f64) -> Option<i64> {
    if w.is_finite() && w > 0.0 && w * SCALE < i64::MAX as f64 / 4.0 {
        // w > 0, so adding ½ and truncating rounds half away from zero like
        // f64::round, without the libm call that baseline x86-64 makes of it
        // (this runs once per scored pair).
        Some(((w * SCALE + 0.5) as i64).max(1))
    } else {
        None
    }
}

/// Back to normalized throughput units, for display.
pub fn to_throughput(w: i64) -> f64 {
    w as f64 / SCALE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantize_rounds_and_keeps_tiny_positive() {
        assert_eq!(quantize(1.0), Some(1_000_000));
        assert_eq!(quantize(0.1234564), Some(123_456));
        assert_eq!(quantize(0.1234565001), Some(123_457));
        assert_eq!(quantize(1e-9), Some(1));
        assert_eq!(quantize(0.0), None);
        assert_eq!(quantize(-0.5), None);
        assert_eq!(quantize(f64::NAN), None);
        assert_eq!(quantize(f64::INFINITY), None);
    }
}
