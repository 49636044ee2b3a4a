//! Splitting text at special tokens before BPE.
//!
//! Control and unknown-type tokens are matched only when the caller asks for
//! `parse_special`; user-defined tokens (`<|channel>`, `<|tool_call>`, ...)
//! are matched always, as llama.cpp does for `gemma4`. Matching scans left to
//! right and takes the longest special token starting at each position.
//! Lookups are by hash on the exact text, trying only the lengths that occur
//! among special tokens with the same first byte, so a vocab with a quarter
//! of a million `<unusedN>` control tokens costs a handful of lookups per '<'.

use super::strindex::StrIndex;
use super::vocab::TokenType;

/// A piece of input after special-token splitting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fragment<'a> {
    /// Raw text, to be escaped, newline-split and BPE-encoded.
    Text(&'a str),
    /// A special token matched in the text.
    Token(u32),
}

/// Longest-match lookup of special token texts.
pub struct SpecialMatcher {
    /// Special token ids by text (over the token table `split` is given).
    index: StrIndex,
    /// For each first byte: distinct lengths of all specials, longest first.
    lens_all: Vec<Vec<usize>>,
    /// Same, over user-defined tokens only.
    lens_user: Vec<Vec<usize>>,
}

impl SpecialMatcher {
    /// Collects the control, unknown and user-defined tokens. For duplicated
    /// texts the lowest id wins; empty texts are never matched.
    pub fn new(tokens: &[String], types: &[TokenType]) -> SpecialMatcher {
        let mut index = StrIndex::default();
        let mut lens_all = vec![Vec::new(); 256];
        let mut lens_user = vec![Vec::new(); 256];
        for (i, (t, ty)) in tokens.iter().zip(types).enumerate() {
            let always = match ty {
                TokenType::UserDefined => true,
                TokenType::Control | TokenType::Unknown => false,
                _ => continue,
            };
            let Some(&first) = t.as_bytes().first() else {
                continue;
            };
            if !index.insert(tokens, i as u32) {
                continue;
            }
            lens_all[first as usize].push(t.len());
            if always {
                lens_user[first as usize].push(t.len());
            }
        }
        for l in lens_all.iter_mut().chain(lens_user.iter_mut()) {
            l.sort_unstable_by(|a, b| b.cmp(a));
            l.dedup();
        }
        SpecialMatcher {
            index,
            lens_all,
            lens_user,
        }
    }

    /// Number of special tokens known.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The longest special token at byte `pos` of `text`: (id, byte length).
    fn match_at(
        &self,
        tokens: &[String],
        types: &[TokenType],
        text: &str,
        pos: usize,
        parse_special: bool,
    ) -> Option<(u32, usize)> {
        let first = *text.as_bytes().get(pos)?;
        let lens = if parse_special {
            &self.lens_all[first as usize]
        } else {
            &self.lens_user[first as usize]
        };
        for &len in lens {
            let Some(cand) = text.get(pos..pos + len) else {
                continue;
            };
            if let Some(id) = self.index.get(tokens, cand) {
                if parse_special || types[id as usize] == TokenType::UserDefined {
                    return Some((id, len));
                }
            }
        }
        None
    }

    /// Splits `text` into raw text and special tokens, in order. Empty text
    /// fragments are not produced. `tokens` and `types` are the tables the
    /// matcher was built from.
    pub fn split<'a>(
        &self,
        tokens: &[String],
        types: &[TokenType],
        text: &'a str,
        parse_special: bool,
    ) -> Vec<Fragment<'a>> {
        let mut out = Vec::new();
        let bytes = text.as_bytes();
        let lens = if parse_special {
            &self.lens_all
        } else {
            &self.lens_user
        };
        let mut start = 0;
        let mut pos = 0;
        while pos < bytes.len() {
            if !lens[bytes[pos] as usize].is_empty() {
                if let Some((id, len)) = self.match_at(tokens, types, text, pos, parse_special) {
                    if pos > start {
                        out.push(Fragment::Text(&text[start..pos]));
                    }
                    out.push(Fragment::Token(id));
                    pos += len;
                    start = pos;
                    continue;
                }
            }
            pos += 1;
        }
        if start < bytes.len() {
            out.push(Fragment::Text(&text[start..]));
        }
        out
    }
}
