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

/// An integer >= 1 (`--batch`, `--ubatch`, `--ctx-size`).
pub fn positive_usize(s: &str) -> Result<usize, String> {
    let v: i64 = s.parse().map_err(|_| format!("'{s}' is not an integer"))?;
    if v < 1 {
        return Err(format!(
            "{s} is outside the accepted range: an integer >= 1"
        ));
    }
    Ok(v as usize)
}

/// `-n`: tokens to generate, or `None` for "until the end of the context".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NPredict(pub Option<usize>);

/// `-n`: an integer >= 0, or -1 for "until the end of the context"
/// (llama.cpp's convention).
pub fn n_predict(s: &str) -> Result<NPredict, String> {
    let v: i64 = s.parse().map_err(|_| format!("'{s}' is not an integer"))?;
    match v {
        -1 => Ok(NPredict(None)),
        v if v >= 0 => Ok(NPredict(Some(v as usize))),
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
