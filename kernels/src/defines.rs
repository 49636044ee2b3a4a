//! Preprocessor defines that select a kernel variant, and their conversion
//! to NVRTC `-D` options.
//!
//! A variant is fully described by (family, defines, arch): the same map
//! always produces the same options in the same (sorted) order, which is what
//! makes the compile cache key stable.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// The value of one `-D NAME=VALUE` define.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DefineValue {
    Int(i64),
    /// Emitted verbatim: `Str("Q8_0")` becomes `-DWTYPE=Q8_0`, so kernels can
    /// compare it against a macro of that name.
    Str(String),
}

impl fmt::Display for DefineValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DefineValue::Int(v) => write!(f, "{v}"),
            DefineValue::Str(s) => f.write_str(s),
        }
    }
}

impl From<i64> for DefineValue {
    fn from(v: i64) -> Self {
        DefineValue::Int(v)
    }
}

impl From<&str> for DefineValue {
    fn from(v: &str) -> Self {
        DefineValue::Str(v.to_string())
    }
}

/// Sorted by name, so iteration order (and therefore option order) is stable.
pub type Defines = BTreeMap<String, DefineValue>;

/// Builds a `Defines` map from (name, value) pairs; handy in tests and code.
pub fn defines<I, K, V>(pairs: I) -> Defines
where
    I: IntoIterator<Item = (K, V)>,
    K: Into<String>,
    V: Into<DefineValue>,
{
    pairs
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect()
}

/// A define name is a C identifier; a string value may only hold identifier
/// characters, digits, '.', '-' (so nothing can inject another option).
pub fn check_define(name: &str, value: &DefineValue) -> Result<(), String> {
    let ident = |s: &str| {
        !s.is_empty()
            && s.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    if !ident(name) {
        return Err(format!("define name '{name}' is not a C identifier"));
    }
    if let DefineValue::Str(s) = value {
        let ok = !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-');
        if !ok {
            return Err(format!(
                "define {name}: value '{s}' may only contain letters, digits, '_', '.', '-'"
            ));
        }
    }
    Ok(())
}

/// `-DNAME=VALUE` options in name order.
pub fn to_options(d: &Defines) -> Result<Vec<String>, String> {
    d.iter()
        .map(|(k, v)| {
            check_define(k, v)?;
            Ok(format!("-D{k}={v}"))
        })
        .collect()
}

/// Canonical one-line text of a define map ("BM=128 BN=64 WTYPE=Q8_0"): used
/// in error messages, reports and the cache key.
pub fn canonical(d: &Defines) -> String {
    d.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Integer value of a define, with a message naming the define when it is
/// missing or not an integer.
pub fn get_int(d: &Defines, name: &str) -> Result<i64, String> {
    match d.get(name) {
        Some(DefineValue::Int(v)) => Ok(*v),
        Some(DefineValue::Str(s)) => Err(format!("define {name}={s} must be an integer")),
        None => Err(format!("define {name} is required")),
    }
}

/// String value of a define (an integer is rendered as its digits).
pub fn get_str(d: &Defines, name: &str) -> Result<String, String> {
    match d.get(name) {
        Some(v) => Ok(v.to_string()),
        None => Err(format!("define {name} is required")),
    }
}

/// The integer define `name`, which must be one of `allowed`.
pub(crate) fn int_in(d: &Defines, name: &str, allowed: &[i64]) -> Result<i64, String> {
    let v = get_int(d, name)?;
    if !allowed.contains(&v) {
        return Err(format!("{name}={v} is not one of {allowed:?}"));
    }
    Ok(v)
}

/// The integer define `name`, which must lie in `lo..=hi`.
pub(crate) fn int_range(d: &Defines, name: &str, lo: i64, hi: i64) -> Result<i64, String> {
    let v = get_int(d, name)?;
    if v < lo || v > hi {
        return Err(format!("{name}={v} is outside {lo}..={hi}"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_sorted_and_rendered() {
        let d = defines([("BN", DefineValue::Int(64)), ("BM", DefineValue::Int(128))]);
        let mut d2 = d.clone();
        d2.insert("WTYPE".into(), "Q8_0".into());
        assert_eq!(
            to_options(&d2).unwrap(),
            vec!["-DBM=128", "-DBN=64", "-DWTYPE=Q8_0"]
        );
        assert_eq!(canonical(&d2), "BM=128 BN=64 WTYPE=Q8_0");
    }

    #[test]
    fn rejects_option_injection() {
        let d = defines([("X", DefineValue::Str("1 -G".into()))]);
        assert!(to_options(&d).unwrap_err().contains("may only contain"));
        let d = defines([("1X", DefineValue::Int(1))]);
        assert!(to_options(&d).unwrap_err().contains("not a C identifier"));
    }

    #[test]
    fn typed_getters_name_the_define() {
        let d = defines([("BM", DefineValue::Str("big".into()))]);
        assert_eq!(
            get_int(&d, "BM").unwrap_err(),
            "define BM=big must be an integer"
        );
        assert_eq!(get_int(&d, "BN").unwrap_err(), "define BN is required");
    }
}
