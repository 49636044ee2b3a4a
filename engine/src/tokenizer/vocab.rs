//! The tokenizer's vocabulary as GGUF stores it (`tokenizer.ggml.*` keys), and
//! the conversion to and from GGUF metadata.
//!
//! `VocabData` is plain data: it is what `gemtune synth` writes into a file and
//! what a loaded file yields. `Tokenizer::from_vocab` turns it into the lookup
//! structures encoding and decoding need.

use super::TokenizerError;
use crate::gguf::{GgufArray, GgufFile, GgufValue, GgufValueType};

/// GGUF `tokenizer.ggml.model` value this tokenizer implements.
pub const MODEL_NAME: &str = "gemma4";

/// GGUF token types (`tokenizer.ggml.token_type`, i32 per token), numbered as
/// llama.cpp's `llama_token_type` / gguf-py's `TokenType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum TokenType {
    /// 0 in the file; treated like `Normal`.
    Undefined = 0,
    Normal = 1,
    Unknown = 2,
    Control = 3,
    UserDefined = 4,
    Unused = 5,
    Byte = 6,
}

impl TokenType {
    /// Maps a file's i32 to a type; values outside 0..=6 are `Undefined`.
    pub fn from_i32(v: i32) -> TokenType {
        match v {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }

    pub fn as_i32(self) -> i32 {
        self as i32
    }
}

/// Score written for control tokens (as the published files do).
pub const CONTROL_SCORE: f32 = -1000.0;

/// The tokenizer part of a GGUF file, index = token id.
#[derive(Clone, Debug, PartialEq)]
pub struct VocabData {
    /// Token texts, "▁" standing for a space, `<0xXX>` for byte tokens.
    pub tokens: Vec<String>,
    /// One per token.
    pub scores: Vec<f32>,
    /// One per token, `TokenType` values.
    pub token_types: Vec<i32>,
    /// BPE merges "LEFT RIGHT", rank = index (lower merges first).
    pub merges: Vec<String>,
    pub bos: u32,
    pub eos: u32,
    /// End-of-turn token (`<turn|>`), when the file names one.
    pub eot: Option<u32>,
    pub pad: u32,
    pub unk: u32,
}

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_TYPES: &str = "tokenizer.ggml.token_type";
const KEY_MERGES: &str = "tokenizer.ggml.merges";
const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";
const KEY_EOS: &str = "tokenizer.ggml.eos_token_id";
const KEY_EOT: &str = "tokenizer.ggml.eot_token_id";
const KEY_UNK: &str = "tokenizer.ggml.unknown_token_id";
const KEY_PAD: &str = "tokenizer.ggml.padding_token_id";
const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const KEY_ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";

impl VocabData {
    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Type of token `id` (`Undefined` past the end).
    pub fn token_type(&self, id: u32) -> TokenType {
        self.token_types
            .get(id as usize)
            .map_or(TokenType::Undefined, |&t| TokenType::from_i32(t))
    }

    /// Checks the parallel arrays and the special ids against the token count.
    pub fn validate(&self) -> Result<(), TokenizerError> {
        let n = self.tokens.len();
        if n == 0 {
            return Err(TokenizerError::BadVocab("the vocab has no tokens".into()));
        }
        if u32::try_from(n).is_err() {
            return Err(TokenizerError::BadVocab(format!(
                "{n} tokens do not fit u32 ids"
            )));
        }
        if self.scores.len() != n {
            return Err(TokenizerError::BadVocab(format!(
                "{} scores for {n} tokens",
                self.scores.len()
            )));
        }
        if self.token_types.len() != n {
            return Err(TokenizerError::BadVocab(format!(
                "{} token types for {n} tokens",
                self.token_types.len()
            )));
        }
        let ids = [
            ("bos", Some(self.bos)),
            ("eos", Some(self.eos)),
            ("eot", self.eot),
            ("pad", Some(self.pad)),
            ("unk", Some(self.unk)),
        ];
        for (name, id) in ids {
            if let Some(id) = id {
                if id as usize >= n {
                    return Err(TokenizerError::BadVocab(format!(
                        "{name} token id {id} is outside the vocab ({n} tokens)"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The `tokenizer.ggml.*` metadata entries for this vocab, in the order
    /// llama.cpp's converter writes them.
    pub fn to_gguf_metadata(&self) -> Vec<(String, GgufValue)> {
        let strings = |v: &[String]| {
            GgufValue::Array(GgufArray {
                elem_type: GgufValueType::String,
                values: v.iter().map(|s| GgufValue::String(s.clone())).collect(),
            })
        };
        let mut out = vec![
            (
                KEY_MODEL.to_string(),
                GgufValue::String(MODEL_NAME.to_string()),
            ),
            (KEY_TOKENS.to_string(), strings(&self.tokens)),
            (
                KEY_SCORES.to_string(),
                GgufValue::Array(GgufArray {
                    elem_type: GgufValueType::F32,
                    values: self.scores.iter().map(|&s| GgufValue::F32(s)).collect(),
                }),
            ),
            (
                KEY_TYPES.to_string(),
                GgufValue::Array(GgufArray {
                    elem_type: GgufValueType::I32,
                    values: self
                        .token_types
                        .iter()
                        .map(|&t| GgufValue::I32(t))
                        .collect(),
                }),
            ),
            (KEY_MERGES.to_string(), strings(&self.merges)),
            (KEY_BOS.to_string(), GgufValue::U32(self.bos)),
            (KEY_EOS.to_string(), GgufValue::U32(self.eos)),
        ];
        if let Some(eot) = self.eot {
            out.push((KEY_EOT.to_string(), GgufValue::U32(eot)));
        }
        out.push((KEY_UNK.to_string(), GgufValue::U32(self.unk)));
        out.push((KEY_PAD.to_string(), GgufValue::U32(self.pad)));
        out.push((KEY_ADD_BOS.to_string(), GgufValue::Bool(true)));
        out.push((KEY_ADD_SPACE_PREFIX.to_string(), GgufValue::Bool(false)));
        out
    }

    /// Reads the vocab of a GGUF file. `tokenizer.ggml.model` must be
    /// "gemma4"; tokens are required; scores default to 0, types to normal,
    /// merges to none; special ids default to the Gemma 4 ones (bos 2, eos 1,
    /// unk 3, pad 0) when absent.
    pub fn from_gguf(f: &GgufFile) -> Result<VocabData, TokenizerError> {
        let file = f.path().display().to_string();
        let missing = |key: &'static str| TokenizerError::MissingKey {
            file: file.clone(),
            key,
        };
        let bad = |key: &'static str, reason: String| TokenizerError::BadKey {
            file: file.clone(),
            key,
            reason,
        };

        let model = f.get(KEY_MODEL).ok_or_else(|| missing(KEY_MODEL))?;
        let model = model.as_str().ok_or_else(|| {
            bad(
                KEY_MODEL,
                format!("expected a string, found {}", model.type_name()),
            )
        })?;
        if model != MODEL_NAME {
            return Err(TokenizerError::UnsupportedModel {
                file: file.clone(),
                model: model.to_string(),
            });
        }

        let string_array =
            |key: &'static str, v: &GgufValue| -> Result<Vec<String>, TokenizerError> {
                let arr = v.as_array().ok_or_else(|| {
                    bad(key, format!("expected an array, found {}", v.type_name()))
                })?;
                arr.values
                    .iter()
                    .enumerate()
                    .map(|(i, e)| {
                        e.as_str().map(str::to_string).ok_or_else(|| {
                            bad(
                                key,
                                format!("element {i} is {}, expected string", e.type_name()),
                            )
                        })
                    })
                    .collect()
            };

        let tokens_v = f.get(KEY_TOKENS).ok_or_else(|| missing(KEY_TOKENS))?;
        let tokens = string_array(KEY_TOKENS, tokens_v)?;
        let n = tokens.len();
        if n == 0 {
            return Err(bad(KEY_TOKENS, "the array is empty".into()));
        }

        let scores = match f.get(KEY_SCORES) {
            None => vec![0.0; n],
            Some(v) => {
                let arr = v.as_array().ok_or_else(|| {
                    bad(
                        KEY_SCORES,
                        format!("expected an array, found {}", v.type_name()),
                    )
                })?;
                let s: Option<Vec<f32>> = arr.values.iter().map(GgufValue::as_f32).collect();
                let s = s.ok_or_else(|| bad(KEY_SCORES, "elements must be f32".into()))?;
                if s.len() != n {
                    return Err(bad(
                        KEY_SCORES,
                        format!("{} scores for {n} tokens", s.len()),
                    ));
                }
                s
            }
        };

        let token_types = match f.get(KEY_TYPES) {
            None => vec![TokenType::Normal.as_i32(); n],
            Some(v) => {
                let arr = v.as_array().ok_or_else(|| {
                    bad(
                        KEY_TYPES,
                        format!("expected an array, found {}", v.type_name()),
                    )
                })?;
                let t: Option<Vec<i32>> = arr
                    .values
                    .iter()
                    .map(|e| e.as_i64().and_then(|x| i32::try_from(x).ok()))
                    .collect();
                let t = t.ok_or_else(|| bad(KEY_TYPES, "elements must be integers".into()))?;
                if t.len() != n {
                    return Err(bad(KEY_TYPES, format!("{} types for {n} tokens", t.len())));
                }
                t
            }
        };

        let merges = match f.get(KEY_MERGES) {
            None => Vec::new(),
            Some(v) => string_array(KEY_MERGES, v)?,
        };

        let id = |key: &'static str, default: Option<u32>| -> Result<Option<u32>, TokenizerError> {
            match f.get(key) {
                None => Ok(default),
                Some(v) => {
                    let x = v.as_u64().ok_or_else(|| {
                        bad(
                            key,
                            format!("expected an unsigned integer, found {}", v.type_name()),
                        )
                    })?;
                    if x >= n as u64 {
                        return Err(bad(
                            key,
                            format!("id {x} is outside the vocab ({n} tokens)"),
                        ));
                    }
                    // In range of a vocab whose size fits u32 (checked by validate).
                    Ok(u32::try_from(x).ok())
                }
            }
        };
        let vd = VocabData {
            bos: id(KEY_BOS, Some(2))?.unwrap_or(2),
            eos: id(KEY_EOS, Some(1))?.unwrap_or(1),
            eot: id(KEY_EOT, None)?,
            unk: id(KEY_UNK, Some(3))?.unwrap_or(3),
            pad: id(KEY_PAD, Some(0))?.unwrap_or(0),
            tokens,
            scores,
            token_types,
            merges,
        };
        vd.validate().map_err(|e| TokenizerError::BadVocabIn {
            file: file.clone(),
            reason: e.to_string(),
        })?;
        Ok(vd)
    }
}
