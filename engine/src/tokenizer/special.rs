//! Splitting text at special tokens before BPE.
//!
//! Control and unknown-type tokens are split out only when the caller asks
//! for `parse_special`; user-defined tokens (`<|channel>`, `<|tool_call>`,
//! ...) always, as llama.cpp does for `gemma4`. Matching is Hugging Face's
//! added-token split: scan left to right and take the longest special token
//! starting at each position (leftmost-longest). Without `parse_special` a
//! control token found that way stays text, and its span is not searched
//! again for a user-defined token (Hugging Face's `encode_special_tokens`);
//! no Gemma vocabulary has a user-defined token overlapping a control token,
//! so there this equals llama.cpp's rule of never looking for control tokens.
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
    lens: Vec<Vec<usize>>,
}

impl SpecialMatcher {
    /// Collects the control, unknown and user-defined tokens. For duplicated
    /// texts the lowest id wins; empty texts are never matched.
    pub fn new(tokens: &[String], types: &[TokenType]) -> SpecialMatcher {
        let mut index = StrIndex::default();
        let mut lens = vec![Vec::new(); 256];
        for (i, (t, ty)) in tokens.iter().zip(types).enumerate() {
            if !matches!(
                ty,
                TokenType::UserDefined | TokenType::Control | TokenType::Unknown
            ) {
                continue;
            }
            let Some(&first) = t.as_bytes().first() else {
                continue;
            };
            if !index.insert(tokens, i as u32) {
                continue;
            }
            lens[first as usize].push(t.len());
        }
        for l in lens.iter_mut() {
            l.sort_unstable_by(|a, b| b.cmp(a));
            l.dedup();
        }
        SpecialMatcher { index, lens }
    }

    /// Number of special tokens known.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The longest special token at byte `pos` of `text`: (id, byte length).
    fn match_at(&self, tokens: &[String], text: &str, pos: usize) -> Option<(u32, usize)> {
        let first = *text.as_bytes().get(pos)?;
        for &len in &self.lens[first as usize] {
            let Some(cand) = text.get(pos..pos + len) else {
                continue;
            };
            if let Some(id) = self.index.get(tokens, cand) {
                return Some((id, len));
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
        let mut start = 0;
        let mut pos = 0;
        while pos < bytes.len() {
            if !self.lens[bytes[pos] as usize].is_empty() {
                if let Some((id, len)) = self.match_at(tokens, text, pos) {
                    if !parse_special && types[id as usize] != TokenType::UserDefined {
                        // Stays text, span and all.
                        pos += len;
                        continue;
                    }
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
