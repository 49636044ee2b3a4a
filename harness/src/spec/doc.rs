//! A thin layer over `toml::de::DeTable`, which keeps the byte span of every
//! key and value, so every error in a spec file can name `file:line:col`.
//!
//! Specs are read by hand through `Tab` rather than through serde structs:
//! that way unknown keys, wrong types and semantic errors (an undeclared
//! define, a sweep base that names no variant) all point at the offending
//! key with the same machinery.

use kernels::defines::DefineValue;
use std::fmt;
use std::ops::Range;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use gemtune_kernels as kernels;

/// An error in a spec or shapes file, located at a line and column (1-based;
/// line 0 means the whole file, e.g. it could not be read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecError {
    pub file: String,
    pub line: usize,
    pub col: usize,
    pub msg: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file, self.msg)
        } else {
            write!(f, "{}:{}:{}: {}", self.file, self.line, self.col, self.msg)
        }
    }
}

impl std::error::Error for SpecError {}

impl SpecError {
    pub fn whole_file(file: &str, msg: impl Into<String>) -> SpecError {
        SpecError {
            file: file.to_string(),
            line: 0,
            col: 0,
            msg: msg.into(),
        }
    }
}

/// A file being read: its label (the path as given) and its text.
#[derive(Clone, Copy)]
pub struct Src<'a> {
    pub file: &'a str,
    pub text: &'a str,
}

impl<'a> Src<'a> {
    /// (line, column), both 1-based, of a byte offset.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let col = before.rfind('\n').map_or(offset, |p| offset - p - 1) + 1;
        (line, col)
    }

    pub fn err(&self, span: Range<usize>, msg: impl Into<String>) -> SpecError {
        let (line, col) = self.line_col(span.start);
        SpecError {
            file: self.file.to_string(),
            line,
            col,
            msg: msg.into(),
        }
    }

    pub fn line_of(&self, span: &Range<usize>) -> usize {
        self.line_col(span.start).0
    }

    /// Parses the document; a syntax error keeps toml's span.
    pub fn parse(&self) -> Result<Spanned<DeTable<'a>>, SpecError> {
        DeTable::parse(self.text).map_err(|e| {
            let span = e.span().unwrap_or(0..0);
            self.err(span, format!("TOML syntax: {}", e.message().trim()))
        })
    }
}

pub type SVal<'i> = Spanned<DeValue<'i>>;

/// Key/value access to one table that remembers which keys were read, so
/// that `finish` can report the first key nobody asked for.
pub struct Tab<'s, 'i> {
    pub src: Src<'s>,
    pub tab: &'s DeTable<'i>,
    /// Human name of the table in messages, e.g. "[kernel]".
    pub what: String,
    used: Vec<String>,
}

impl<'s, 'i> Tab<'s, 'i> {
    pub fn new(src: Src<'s>, tab: &'s DeTable<'i>, what: impl Into<String>) -> Self {
        Tab {
            src,
            tab,
            what: what.into(),
            used: Vec::new(),
        }
    }

    /// Wraps a value that must be a table.
    pub fn of(src: Src<'s>, v: &'s SVal<'i>, what: impl Into<String>) -> Result<Self, SpecError> {
        let what = what.into();
        match v.get_ref() {
            DeValue::Table(t) => Ok(Tab::new(src, t, what)),
            other => Err(src.err(
                v.span(),
                format!("{what} must be a table, found {}", other.type_str()),
            )),
        }
    }

    pub fn get(&mut self, key: &str) -> Option<&'s SVal<'i>> {
        self.used.push(key.to_string());
        self.tab.get(key)
    }

    /// The span of a key itself (for messages about the key).
    pub fn key_span(&self, key: &str) -> Option<Range<usize>> {
        self.tab.get_key_value(key).map(|(k, _)| k.span())
    }

    /// All entries in file order, marking them used.
    pub fn entries(&mut self) -> Vec<(&'s Spanned<std::borrow::Cow<'i, str>>, &'s SVal<'i>)> {
        let mut v: Vec<_> = self.tab.iter().collect();
        v.sort_by_key(|(k, _)| k.span().start);
        for (k, _) in &v {
            self.used.push(k.get_ref().to_string());
        }
        v
    }

    pub fn req(&mut self, key: &str) -> Result<&'s SVal<'i>, SpecError> {
        let span = self.whole_span();
        let what = self.what.clone();
        self.get(key).ok_or_else(|| {
            self.src
                .err(span, format!("{what}: missing required key `{key}`"))
        })
    }

    fn whole_span(&self) -> Range<usize> {
        self.tab
            .iter()
            .map(|(k, _)| k.span())
            .min_by_key(|s| s.start)
            .unwrap_or(0..0)
    }

    pub fn str_opt(&mut self, key: &str) -> Result<Option<(String, Range<usize>)>, SpecError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => Ok(Some((as_str(self.src, v, key)?, v.span()))),
        }
    }

    pub fn str_req(&mut self, key: &str) -> Result<(String, Range<usize>), SpecError> {
        let v = self.req(key)?;
        Ok((as_str(self.src, v, key)?, v.span()))
    }

    pub fn f64_opt(&mut self, key: &str) -> Result<Option<f64>, SpecError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => as_f64(self.src, v, key).map(Some),
        }
    }

    pub fn bool_opt(&mut self, key: &str) -> Result<Option<bool>, SpecError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.get_ref() {
                DeValue::Boolean(b) => Ok(Some(*b)),
                other => Err(self.src.err(
                    v.span(),
                    format!("`{key}` must be a boolean, found {}", other.type_str()),
                )),
            },
        }
    }

    /// Errors on the first key (in file order) that was never asked for.
    pub fn finish(self, allowed_hint: &str) -> Result<(), SpecError> {
        let mut keys: Vec<_> = self.tab.iter().map(|(k, _)| k).collect();
        keys.sort_by_key(|k| k.span().start);
        for k in keys {
            if !self.used.iter().any(|u| u == k.get_ref().as_ref()) {
                return Err(self.src.err(
                    k.span(),
                    format!(
                        "unknown key `{}` in {} (allowed: {allowed_hint})",
                        k.get_ref(),
                        self.what
                    ),
                ));
            }
        }
        Ok(())
    }
}

pub fn as_str(src: Src<'_>, v: &SVal<'_>, what: &str) -> Result<String, SpecError> {
    match v.get_ref() {
        DeValue::String(s) => Ok(s.to_string()),
        other => Err(src.err(
            v.span(),
            format!("`{what}` must be a string, found {}", other.type_str()),
        )),
    }
}

pub fn as_i64(src: Src<'_>, v: &SVal<'_>, what: &str) -> Result<i64, SpecError> {
    match v.get_ref() {
        DeValue::Integer(i) => i64::from_str_radix(&i.as_str().replace('_', ""), i.radix())
            .map_err(|_| src.err(v.span(), format!("`{what}`: integer out of range"))),
        other => Err(src.err(
            v.span(),
            format!("`{what}` must be an integer, found {}", other.type_str()),
        )),
    }
}

pub fn as_f64(src: Src<'_>, v: &SVal<'_>, what: &str) -> Result<f64, SpecError> {
    match v.get_ref() {
        DeValue::Float(f) => f
            .as_str()
            .replace('_', "")
            .parse::<f64>()
            .map_err(|_| src.err(v.span(), format!("`{what}`: not a number"))),
        DeValue::Integer(_) => as_i64(src, v, what).map(|i| i as f64),
        other => Err(src.err(
            v.span(),
            format!("`{what}` must be a number, found {}", other.type_str()),
        )),
    }
}

pub fn as_array<'s, 'i>(
    src: Src<'_>,
    v: &'s SVal<'i>,
    what: &str,
) -> Result<&'s [SVal<'i>], SpecError> {
    match v.get_ref() {
        DeValue::Array(a) => Ok(a),
        other => Err(src.err(
            v.span(),
            format!("`{what}` must be an array, found {}", other.type_str()),
        )),
    }
}

/// A define value: an integer, a string (an identifier such as `Q8_0`), or a
/// boolean (becomes 0/1).
pub fn as_define(src: Src<'_>, v: &SVal<'_>, name: &str) -> Result<DefineValue, SpecError> {
    let val = match v.get_ref() {
        DeValue::Integer(_) => DefineValue::Int(as_i64(src, v, name)?),
        DeValue::Boolean(b) => DefineValue::Int(i64::from(*b)),
        DeValue::String(s) => DefineValue::Str(s.to_string()),
        other => {
            return Err(src.err(
                v.span(),
                format!(
                    "define {name}: a define is an integer, a boolean or a string, found {}",
                    other.type_str()
                ),
            ))
        }
    };
    kernels::defines::check_define(name, &val).map_err(|m| src.err(v.span(), m))?;
    Ok(val)
}
