//! The `gemma4` BPE tokenizer and chat template.
//!
//! - `vocab`: `VocabData` (the `tokenizer.ggml.*` GGUF keys) and `TokenType`.
//! - `Tokenizer` (here): encode as llama.cpp's `gemma4` pre-type
//!   (docs/gemma4.md §5), which on Gemma's vocabulary gives the ids of
//!   Hugging Face `tokenizers`; decode as Hugging Face's decoder;
//!   `StreamDecoder` for streaming output.
//! - `special`: special-token splitting; `bpe`: merge-rank BPE over code
//!   points; `strindex`: the string -> id index both use.
//! - `chat`: the Gemma 4 chat template and `encode_chat`.
//! - `train`: the synthetic vocab `gemtune synth` writes (`build_synth_vocab`).

pub mod bpe;
pub mod chat;
pub mod special;
pub mod strindex;
pub mod train;
pub mod vocab;

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::gguf::GgufFile;

pub use chat::{encode_chat, render_prompt, Message, Role};
pub use vocab::{TokenType, VocabData};

/// Errors of loading a vocab, building one, and decoding.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("unknown token id {id} (the vocab has {vocab_size} tokens)")]
    UnknownId { id: u32, vocab_size: usize },
    #[error("{file}: tokenizer model '{model}' is not supported (expected \"gemma4\")")]
    UnsupportedModel { file: String, model: String },
    #[error("{file}: metadata key '{key}' is missing")]
    MissingKey { file: String, key: &'static str },
    #[error("{file}: metadata key '{key}': {reason}")]
    BadKey {
        file: String,
        key: &'static str,
        reason: String,
    },
    #[error("{file}: tokenizer vocab: {reason}")]
    BadVocabIn { file: String, reason: String },
    #[error("vocab: {0}")]
    BadVocab(String),
    #[error("synthetic vocab size {requested} is outside {min}..={max}")]
    BadVocabSize {
        requested: usize,
        min: usize,
        max: usize,
    },
}

/// A fast non-cryptographic hasher for the tokenizer's maps (hundreds of
/// thousands of short strings and id pairs from a local file, where the
/// flooding resistance of the default SipHash buys nothing): multiply-rotate
/// per 8-byte word, with a 64-bit avalanche finish.
#[derive(Clone, Copy, Default)]
pub struct FastHasher(u64);

impl FastHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h
    }
}

/// HashMap with `FastHasher`.
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// How `Tokenizer::decode_with` renders tokens that are not plain text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Render control tokens (`<bos>`, `<|turn>`, `<turn|>`, `<unusedN>`,
    /// ...) and the unknown token as their text. Off: control tokens produce
    /// nothing and the unknown token produces U+FFFD.
    pub render_control: bool,
}

/// The `gemma4` tokenizer (docs/gemma4.md §5), built once from a vocab.
///
/// Encoding: split out special tokens (longest match; control tokens only
/// with `parse_special`, user-defined tokens always), replace " " by "▁",
/// split each raw fragment into runs of "\n" and runs of anything else, emit
/// an all-newline run whole when it is a token, otherwise BPE by merge rank
/// over code points, and emit any final symbol that is not a token as
/// `<0xXX>` byte tokens (the unknown token for a byte without one).
///
/// Decoding, as Hugging Face's decoder for these vocabularies (Replace "▁"
/// by " ", ByteFallback, Fuse): "▁" becomes " "; each maximal run of byte
/// tokens becomes its text when the run is valid UTF-8 and one U+FFFD per
/// byte otherwise; user-defined tokens always render as their text; control
/// tokens render only with `DecodeOptions::render_control` (a control token
/// left out does not split a run of byte tokens). No space cleanup is done.
pub struct Tokenizer {
    vocab: VocabData,
    types: Vec<TokenType>,
    bpe: bpe::Bpe,
    specials: special::SpecialMatcher,
    /// Byte value -> `<0xXX>` token.
    byte_token: [Option<u32>; 256],
    /// Token id -> byte value, for byte tokens.
    token_byte: FastMap<u32, u8>,
    eog: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab.tokens.len())
            .field("merges", &self.vocab.merges.len())
            .field("specials", &self.specials.len())
            .finish()
    }
}

/// Parses "<0xXX>".
fn parse_byte_token(t: &str) -> Option<u8> {
    let hex = t.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

impl Tokenizer {
    /// Loads the vocab of a GGUF file (`tokenizer.ggml.model = "gemma4"`).
    pub fn from_gguf(f: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_vocab(VocabData::from_gguf(f)?)
    }

    /// Builds the lookup structures: token and merge hash maps, the special
    /// token matcher, byte tokens and the end-of-generation set.
    pub fn from_vocab(vocab: VocabData) -> Result<Tokenizer, TokenizerError> {
        vocab.validate()?;
        let types: Vec<TokenType> = vocab
            .token_types
            .iter()
            .map(|&t| TokenType::from_i32(t))
            .collect();
        let bpe = bpe::Bpe::new(&vocab.tokens, &vocab.merges)?;
        let specials = special::SpecialMatcher::new(&vocab.tokens, &types);
        let mut byte_token = [None; 256];
        let mut token_byte = FastMap::default();
        for (i, (t, ty)) in vocab.tokens.iter().zip(&types).enumerate() {
            if *ty != TokenType::Byte {
                continue;
            }
            if let Some(b) = parse_byte_token(t) {
                byte_token[b as usize].get_or_insert(i as u32);
                token_byte.insert(i as u32, b);
            }
        }
        let mut eog = vec![vocab.eos];
        eog.extend(vocab.eot);
        for name in ["<eos>", "<turn|>"] {
            if let Some(id) = bpe.token_id(&vocab.tokens, name) {
                if matches!(types[id as usize], TokenType::Control) {
                    eog.push(id);
                }
            }
        }
        eog.sort_unstable();
        eog.dedup();
        Ok(Tokenizer {
            vocab,
            types,
            bpe,
            specials,
            byte_token,
            token_byte,
            eog,
        })
    }

    /// Number of tokens.
    pub fn vocab_size(&self) -> usize {
        self.vocab.tokens.len()
    }

    /// The vocab this tokenizer was built from.
    pub fn vocab(&self) -> &VocabData {
        &self.vocab
    }

    pub fn bos(&self) -> u32 {
        self.vocab.bos
    }

    pub fn eos(&self) -> u32 {
        self.vocab.eos
    }

    /// End of generation: the eos and eot ids, plus `<eos>` and `<turn|>`
    /// when the vocab has them as control tokens (Gemma 4 stops on 1 and 106).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// The end-of-generation ids, ascending.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// Text of a token as stored ("▁" not replaced).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.tokens.get(id as usize).map(String::as_str)
    }

    /// Type of a token.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// Id of a token by its exact stored text.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.bpe.token_id(&self.vocab.tokens, text)
    }

    /// Encodes `text`. `add_bos` puts the BOS token first unless the
    /// encoding already starts with it (BOS is never doubled);
    /// `parse_special` lets control tokens written in the text match.
    pub fn encode(&self, text: &str, add_bos: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_bos {
            out.push(self.vocab.bos);
        }
        let mut escaped = String::new();
        for frag in self
            .specials
            .split(&self.vocab.tokens, &self.types, text, parse_special)
        {
            match frag {
                special::Fragment::Token(id) => {
                    if !(add_bos && id == self.vocab.bos && out.len() == 1) {
                        out.push(id);
                    }
                }
                special::Fragment::Text(t) => {
                    escaped.clear();
                    for c in t.chars() {
                        escaped.push(if c == ' ' { '▁' } else { c });
                    }
                    self.encode_escaped(&escaped, &mut out);
                }
            }
        }
        out
    }

    /// Newline-run split and BPE of one escaped raw fragment.
    fn encode_escaped(&self, text: &str, out: &mut Vec<u32>) {
        let bytes = text.as_bytes();
        let mut start = 0;
        while start < bytes.len() {
            let is_nl = bytes[start] == b'\n';
            let mut end = start + 1;
            while end < bytes.len() && (bytes[end] == b'\n') == is_nl {
                end += 1;
            }
            // '\n' is ASCII, so run edges are char boundaries.
            let chunk = &text[start..end];
            let whole = if is_nl {
                self.bpe.token_id(&self.vocab.tokens, chunk)
            } else {
                None
            };
            match whole {
                Some(id) => out.push(id),
                None => self
                    .bpe
                    .encode_chunk(&self.vocab.tokens, chunk, out, |s, out| {
                        self.byte_fallback(s, out)
                    }),
            }
            start = end;
        }
    }

    fn byte_fallback(&self, s: &str, out: &mut Vec<u32>) {
        for &b in s.as_bytes() {
            out.push(self.byte_token[b as usize].unwrap_or(self.vocab.unk));
        }
    }

    /// Decodes ids to text; control tokens produce nothing. Errors on an id
    /// outside the vocab.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.decode_with(ids, DecodeOptions::default())
    }

    /// Decodes ids to text, control tokens rendered as their text.
    pub fn decode_special(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.decode_with(
            ids,
            DecodeOptions {
                render_control: true,
            },
        )
    }

    /// Decodes with explicit options.
    pub fn decode_with(&self, ids: &[u32], opts: DecodeOptions) -> Result<String, TokenizerError> {
        let mut out = String::with_capacity(ids.len() * 4);
        let mut run = Vec::new();
        for &id in ids {
            match self.piece(id, opts)? {
                Piece::Byte(b) => run.push(b),
                Piece::Skip => {}
                Piece::Text(text) => {
                    flush_byte_run(&mut run, &mut out);
                    text.append_to(&mut out);
                }
            }
        }
        flush_byte_run(&mut run, &mut out);
        Ok(out)
    }

    /// What one token contributes to the decoded text.
    fn piece(&self, id: u32, opts: DecodeOptions) -> Result<Piece<'_>, TokenizerError> {
        let (Some(text), Some(&ty)) = (
            self.vocab.tokens.get(id as usize),
            self.types.get(id as usize),
        ) else {
            return Err(TokenizerError::UnknownId {
                id,
                vocab_size: self.vocab_size(),
            });
        };
        Ok(match ty {
            TokenType::Byte => match self.token_byte.get(&id) {
                Some(&b) => Piece::Byte(b),
                None => Piece::Text(PieceText::Escaped(text)),
            },
            TokenType::Control | TokenType::Unused => {
                if opts.render_control {
                    Piece::Text(PieceText::Verbatim(text))
                } else {
                    Piece::Skip
                }
            }
            TokenType::Unknown => {
                if opts.render_control {
                    Piece::Text(PieceText::Verbatim(text))
                } else {
                    Piece::Text(PieceText::Verbatim("\u{FFFD}"))
                }
            }
            TokenType::Normal | TokenType::UserDefined | TokenType::Undefined => {
                Piece::Text(PieceText::Escaped(text))
            }
        })
    }
}

/// What one token contributes to decoded text.
enum Piece<'a> {
    /// A byte token: one byte of a character the encoder spelled out in
    /// `<0xXX>` tokens.
    Byte(u8),
    /// Text, which also ends a run of byte tokens.
    Text(PieceText<'a>),
    /// A control token that is not rendered: nothing, and a run of byte
    /// tokens on both sides of it stays one run (as Hugging Face drops
    /// skipped special tokens before its decoder sees the sequence).
    Skip,
}

enum PieceText<'a> {
    /// Token text with "▁" standing for a space.
    Escaped(&'a str),
    /// Text appended as it is.
    Verbatim(&'a str),
}

impl PieceText<'_> {
    fn append_to(&self, out: &mut String) {
        match *self {
            PieceText::Escaped(t) => {
                for c in t.chars() {
                    out.push(if c == '▁' { ' ' } else { c });
                }
            }
            PieceText::Verbatim(t) => out.push_str(t),
        }
    }
}

/// Appends a finished run of byte-token bytes and empties it: the run's
/// text when the whole run is valid UTF-8, otherwise one U+FFFD per byte.
/// This is Hugging Face's `ByteFallback` decoder rule, so `decode` gives
/// exactly what `tokenizers` gives for any id sequence, not only for the
/// sequences the encoder produces (which are always valid).
fn flush_byte_run(run: &mut Vec<u8>, out: &mut String) {
    if run.is_empty() {
        return;
    }
    match std::str::from_utf8(run) {
        Ok(s) => out.push_str(s),
        Err(_) => out.extend(std::iter::repeat_n('\u{FFFD}', run.len())),
    }
    run.clear();
}

/// Incremental decoding for streaming output: feeds token ids and returns
/// the text that is final so far. A run of byte tokens is held back until a
/// token that renders text ends it (or `finish`), because whether the run
/// decodes to its characters or to U+FFFD per byte depends on the whole run;
/// so the concatenated output always equals `Tokenizer::decode_with` of the
/// same ids.
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    opts: DecodeOptions,
    run: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    pub fn new(tok: &'a Tokenizer, opts: DecodeOptions) -> Self {
        StreamDecoder {
            tok,
            opts,
            run: Vec::new(),
        }
    }

    /// Adds one token; returns the newly final text (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        let mut out = String::new();
        match self.tok.piece(id, self.opts)? {
            Piece::Byte(b) => self.run.push(b),
            Piece::Skip => {}
            Piece::Text(text) => {
                flush_byte_run(&mut self.run, &mut out);
                text.append_to(&mut out);
            }
        }
        Ok(out)
    }

    /// Flushes a held-back run of byte tokens.
    pub fn finish(&mut self) -> String {
        let mut out = String::new();
        flush_byte_run(&mut self.run, &mut out);
        out
    }
}
