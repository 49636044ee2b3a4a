//! The `gemma4` BPE tokenizer and chat template.
//!
//! - `vocab`: `VocabData` (the `tokenizer.ggml.*` GGUF keys) and `TokenType`.
//! - `Tokenizer` (here): encode / decode exactly as llama.cpp's `gemma4`
//!   pre-type (spec §5.2); `StreamDecoder` for streaming output.
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

/// The `gemma4` tokenizer (spec §5.2), built once from a vocab.
///
/// Encoding: split out special tokens (longest match; control tokens only
/// with `parse_special`, user-defined tokens always), replace " " by "▁",
/// split each raw fragment into runs of "\n" and runs of anything else, emit
/// an all-newline run whole when it is a token, otherwise BPE by merge rank
/// over code points, and emit any final symbol that is not a token as
/// `<0xXX>` byte tokens (the unknown token for a byte without one).
///
/// Decoding: byte tokens become raw bytes and the UTF-8 of the whole
/// sequence is assembled across tokens (invalid sequences become U+FFFD);
/// "▁" becomes " "; user-defined tokens always render as their text;
/// control tokens render only with `DecodeOptions::render_control`. No
/// space cleanup is done (as Hugging Face's decoder).
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
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            self.append_piece(id, opts, &mut bytes)?;
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Appends the bytes one token contributes to the decoded text.
    pub fn append_piece(
        &self,
        id: u32,
        opts: DecodeOptions,
        out: &mut Vec<u8>,
    ) -> Result<(), TokenizerError> {
        let (Some(text), Some(&ty)) = (
            self.vocab.tokens.get(id as usize),
            self.types.get(id as usize),
        ) else {
            return Err(TokenizerError::UnknownId {
                id,
                vocab_size: self.vocab_size(),
            });
        };
        match ty {
            TokenType::Byte => match self.token_byte.get(&id) {
                Some(&b) => out.push(b),
                None => unescape_into(text, out),
            },
            TokenType::Control | TokenType::Unused => {
                if opts.render_control {
                    out.extend_from_slice(text.as_bytes());
                }
            }
            TokenType::Unknown => {
                if opts.render_control {
                    out.extend_from_slice(text.as_bytes());
                } else {
                    out.extend_from_slice("\u{FFFD}".as_bytes());
                }
            }
            TokenType::Normal | TokenType::UserDefined | TokenType::Undefined => {
                unescape_into(text, out)
            }
        }
        Ok(())
    }
}

/// Appends `text` with every "▁" turned into " ".
fn unescape_into(text: &str, out: &mut Vec<u8>) {
    let mut rest = text;
    while let Some(i) = rest.find('▁') {
        out.extend_from_slice(&rest.as_bytes()[..i]);
        out.push(b' ');
        rest = &rest[i + '▁'.len_utf8()..];
    }
    out.extend_from_slice(rest.as_bytes());
}

/// Incremental decoding for streaming output: feeds token ids and returns
/// the text that is complete so far, holding back a trailing incomplete UTF-8
/// sequence until the bytes that finish it arrive.
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    opts: DecodeOptions,
    pending: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    pub fn new(tok: &'a Tokenizer, opts: DecodeOptions) -> Self {
        StreamDecoder {
            tok,
            opts,
            pending: Vec::new(),
        }
    }

    /// Adds one token; returns the newly completed text (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        self.tok.append_piece(id, self.opts, &mut self.pending)?;
        let keep = incomplete_tail(&self.pending);
        let done = self.pending.len() - keep;
        let text = String::from_utf8_lossy(&self.pending[..done]).into_owned();
        self.pending.drain(..done);
        Ok(text)
    }

    /// Flushes whatever is left (an incomplete sequence becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

/// Length of a trailing prefix of a UTF-8 sequence that more bytes could
/// still complete (0 when the buffer ends on a boundary or on garbage).
fn incomplete_tail(b: &[u8]) -> usize {
    let n = b.len();
    for back in 1..=3.min(n) {
        let c = b[n - back];
        if c & 0xC0 == 0x80 {
            continue; // continuation byte: look further back
        }
        let need = match c {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => return 0,
        };
        return if need > back { back } else { 0 };
    }
    0
}
