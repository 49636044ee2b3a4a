//! Value parsers shared by the subcommands: each rejects an impossible
//! value at parse time with a message naming the accepted range (clap puts
//! the flag in front), so a typo never runs and never exits 2.

/// A finite float >= 0 (`--temp`).
pub fn non_negative_f32(s: &str) -> Result<f32, String> {
    let v: f32 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!(
            "{s} is outside the accepted range: a finite number >= 0"
        ));
    }
    Ok(v)
}

/// A float in [0, 1] (`--top-p`, `--min-p`).
pub fn unit_f32(s: &str) -> Result<f32, String> {
    let v: f32 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("{s} is outside the accepted range [0, 1]"));
    }
    Ok(v)
}

/// The integer in `s`, read wide enough that a negative or oversized value
/// reaches the range check instead of failing as "invalid digit".
fn integer(s: &str) -> Result<i128, String> {
    s.trim()
        .parse::<i128>()
        .map_err(|_| format!("'{s}' is not an integer"))
}

/// An integer in `lo..=hi`, or the message naming that range as `what`.
fn int_in<T: TryFrom<i128>>(s: &str, lo: i128, hi: i128, what: &str) -> Result<T, String> {
    let v = integer(s)?;
    if !(lo..=hi).contains(&v) {
        return Err(format!("{s} is outside the accepted range: {what}"));
    }
    T::try_from(v).map_err(|_| format!("{s} is outside the accepted range: {what}"))
}

/// An integer >= 1 (`--batch`, `--ubatch`, `--ctx-size`, `--reps`).
pub fn positive_usize(s: &str) -> Result<usize, String> {
    int_in(s, 1, usize::MAX as i128, "an integer >= 1")
}

/// An integer >= 0 (`--top-k`, `-n`/`--n-gen`, `--depth`, `--device`).
pub fn count(s: &str) -> Result<usize, String> {
    int_in(s, 0, usize::MAX as i128, "an integer >= 0")
}

/// An integer >= 1, as u64 (`--repetitions`, `--timeout-s`).
pub fn positive_u64(s: &str) -> Result<u64, String> {
    int_in(s, 1, u64::MAX as i128, "an integer >= 1")
}

/// Any u64 (`--seed`).
pub fn seed(s: &str) -> Result<u64, String> {
    int_in(
        s,
        0,
        u64::MAX as i128,
        "an integer from 0 to 18446744073709551615",
    )
}

/// A finite float > 0 (`--budget-ms`).
pub fn positive_f64(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    if !v.is_finite() || v <= 0.0 {
        return Err(format!(
            "{s} is outside the accepted range: a finite number > 0"
        ));
    }
    Ok(v)
}

/// `-n`: tokens to generate, or `None` for "until the end of the context".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NPredict(pub Option<usize>);

/// `-n`: an integer >= 0, or -1 for "until the end of the context"
/// (llama.cpp's convention).
pub fn n_predict(s: &str) -> Result<NPredict, String> {
    match integer(s)? {
        -1 => Ok(NPredict(None)),
        v if v >= 0 => usize::try_from(v).map(|n| NPredict(Some(n))).map_err(|_| {
            format!(
                "{s} is outside the accepted range: an integer >= 0, or -1 for the whole context"
            )
        }),
        _ => Err(format!(
            "{s} is outside the accepted range: an integer >= 0, or -1 for the whole context"
        )),
    }
}

/// llama.cpp's multi-letter short flags, rewritten to their long forms
/// before clap sees them (clap's short flags are single characters):
/// `-ub` -> `--ubatch-size`, `-sys` -> `--system-prompt`. A value that
/// merely looks like one (after a flag that takes a value) is left alone.
pub fn normalize_args(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    let mut out = Vec::new();
    let mut prev_takes_value = false;
    for a in args {
        let s = a.to_str().map(str::to_string);
        let replaced = match (prev_takes_value, s.as_deref()) {
            (false, Some("-ub")) => Some("--ubatch-size"),
            (false, Some("-sys")) => Some("--system-prompt"),
            _ => None,
        };
        prev_takes_value = matches!(
            s.as_deref(),
            Some("-p" | "--prompt" | "-sys" | "--system-prompt" | "--system" | "-m" | "--model")
        );
        out.push(match replaced {
            Some(r) => r.into(),
            None => a,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_outside_their_range_are_refused() {
        assert!(non_negative_f32("-1").is_err());
        assert!(non_negative_f32("nan").is_err());
        assert_eq!(non_negative_f32("0.7"), Ok(0.7));
        assert!(unit_f32("1.5").is_err());
        assert!(positive_usize("0").is_err());
        assert_eq!(n_predict("-1"), Ok(NPredict(None)));
        assert_eq!(n_predict("5"), Ok(NPredict(Some(5))));
        assert!(n_predict("-2").is_err());
    }

    #[test]
    fn llama_cpp_short_flags_become_long_ones() {
        let v: Vec<String> = normalize_args(
            [
                "gemtune", "run", "-ub", "64", "-sys", "be brief", "-p", "-ub",
            ]
            .iter()
            .map(std::ffi::OsString::from),
        )
        .into_iter()
        .map(|s| s.into_string().unwrap_or_default())
        .collect();
        assert_eq!(
            v,
            [
                "gemtune",
                "run",
                "--ubatch-size",
                "64",
                "--system-prompt",
                "be brief",
                "-p",
                "-ub"
            ]
        );
    }
}
