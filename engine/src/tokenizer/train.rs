//! A synthetic Gemma 4 vocab: the real special-token layout plus BPE merges
//! learned from the small corpus in `engine/data/corpus/`.
//!
//! Layout of `build_synth_vocab(V)` (every fixed id only where it is `< V`):
//! - the special and control tokens of the published vocab at their real ids
//!   (`SPECIAL_TOKENS`), with the published token types;
//! - "\n", "\n\n", "\n\n\n" at 107, 108, 109; "▁" at 236743; the words the
//!   chat goldens use ("user" 2364, "model" 4368, "system" 9731, "Hello" 9259,
//!   "thought" 45518) at their real ids (`FIXED_WORDS`), so a vocab of
//!   262144 reproduces the published golden token ids of the chat template;
//! - byte tokens `<0x00>`..`<0xFF>` at 238..=493;
//! - every other id below 238 is an `<unusedN>` control token;
//! - from 494 up: the base characters (by corpus frequency), then the result
//!   of every learned merge in merge order (a fixed word that does not fit at
//!   its real id takes the next free id like any other token);
//! - the rest is padded with further `<unusedN>` control tokens.
//!
//! Training is standard BPE over code points: the corpus is split at
//! newlines, " " becomes "▁", and each line is cut into training words that
//! start at a run of "▁" (SentencePiece style: pieces may begin with "▁" but
//! never contain it after other characters), with every digit and every
//! character outside the base alphabet standing alone. The pair with the
//! highest count is merged next, ties going to the smaller (left, right)
//! symbol ids, which are assigned in a fixed order: the result is
//! deterministic. Before learning, a few merges are forced at the lowest
//! ranks: "\n"+"\n" and "\n\n"+"\n", and a left-to-right chain for each fixed
//! word ("u"+"s", "us"+"e", "use"+"r", ...), so those words always encode to a
//! single token. Because encoding applies merges by rank over the same kind of
//! symbols, `Tokenizer::encode` reproduces the training segmentation.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};

use super::vocab::{TokenType, VocabData, CONTROL_SCORE};
use super::{FastMap, TokenizerError};

/// The training corpus, compiled into the binary.
pub const CORPUS: &[&str] = &[
    include_str!("../../data/corpus/en_prose.txt"),
    include_str!("../../data/corpus/tech_prose.txt"),
    include_str!("../../data/corpus/code.txt"),
    include_str!("../../data/corpus/european.txt"),
    include_str!("../../data/corpus/cjk.txt"),
    include_str!("../../data/corpus/markdown_misc.txt"),
];

/// Smallest vocab `build_synth_vocab` accepts.
pub const MIN_SYNTH_VOCAB: usize = 1024;
/// Largest vocab `build_synth_vocab` accepts (ids stay far inside u32).
pub const MAX_SYNTH_VOCAB: usize = 1 << 24;
/// Learning stops after this many merges even if the corpus has more pairs.
pub const MAX_LEARNED_MERGES: usize = 20_000;
/// First byte token id (`<0x00>`); `<0xFF>` is `BYTE_TOKEN_BASE + 255`.
pub const BYTE_TOKEN_BASE: u32 = 238;
/// Fraction of character occurrences the base alphabet must cover; rarer
/// characters are left to the byte fallback, as SentencePiece does.
const CHAR_COVERAGE: f64 = 0.9995;
/// A pair seen fewer times than this is not merged.
const MIN_PAIR_COUNT: i64 = 2;

/// Special and control tokens of the published Gemma 4 vocab at their ids.
/// The names of the image/audio begin/end tokens follow the family's
/// `<|x>` / `<x|>` spelling; the published spec gives only their ids.
pub const SPECIAL_TOKENS: &[(u32, &str, TokenType)] = &[
    (0, "<pad>", TokenType::Control),
    (1, "<eos>", TokenType::Control),
    (2, "<bos>", TokenType::Control),
    (3, "<unk>", TokenType::Unknown),
    (4, "<mask>", TokenType::Control),
    (46, "<|tool>", TokenType::Control),
    (47, "<tool|>", TokenType::Control),
    (48, "<|tool_call>", TokenType::UserDefined),
    (49, "<tool_call|>", TokenType::UserDefined),
    (50, "<|tool_response>", TokenType::UserDefined),
    (51, "<tool_response|>", TokenType::UserDefined),
    (52, "<|\"|>", TokenType::UserDefined),
    (98, "<|think|>", TokenType::Control),
    (100, "<|channel>", TokenType::UserDefined),
    (101, "<channel|>", TokenType::UserDefined),
    (105, "<|turn>", TokenType::Control),
    (106, "<turn|>", TokenType::Control),
    (255_999, "<|image>", TokenType::Control),
    (256_000, "<|audio>", TokenType::Control),
    (258_880, "<|image|>", TokenType::Control),
    (258_881, "<|audio|>", TokenType::Control),
    (258_882, "<image|>", TokenType::Control),
    (258_883, "<audio|>", TokenType::Control),
    (258_884, "<|video|>", TokenType::Control),
];

/// Normal tokens placed at their published ids when the vocab is that large.
pub const FIXED_WORDS: &[(u32, &str)] = &[
    (107, "\n"),
    (108, "\n\n"),
    (109, "\n\n\n"),
    (2364, "user"),
    (4368, "model"),
    (9259, "Hello"),
    (9731, "system"),
    (45_518, "thought"),
    (236_743, "▁"),
];

/// Words that get a forced merge chain, so each encodes to one token.
const CHAIN_WORDS: &[&str] = &["user", "model", "system", "thought", "Hello"];

/// Symbol table and word statistics of one training run.
struct Trainer {
    /// Symbol id -> text. Ids are assigned in creation order.
    texts: Vec<String>,
    by_text: FastMap<String, u32>,
    /// Unique training words as symbol sequences, with their counts.
    words: Vec<Vec<u32>>,
    freqs: Vec<i64>,
    pair_count: FastMap<(u32, u32), i64>,
    /// Words that contained the pair when it was indexed (may be stale).
    pair_words: FastMap<(u32, u32), Vec<u32>>,
    heap: BinaryHeap<(i64, Reverse<u32>, Reverse<u32>)>,
    /// Merges in rank order.
    merges: Vec<(u32, u32)>,
    merge_set: HashSet<(u32, u32)>,
}

impl Trainer {
    fn new() -> Self {
        Trainer {
            texts: Vec::new(),
            by_text: FastMap::default(),
            words: Vec::new(),
            freqs: Vec::new(),
            pair_count: FastMap::default(),
            pair_words: FastMap::default(),
            heap: BinaryHeap::new(),
            merges: Vec::new(),
            merge_set: HashSet::new(),
        }
    }

    /// Id of `text`, creating the symbol if it is new. Returns (id, created).
    fn symbol(&mut self, text: &str) -> (u32, bool) {
        if let Some(&id) = self.by_text.get(text) {
            return (id, false);
        }
        let id = self.texts.len() as u32;
        self.texts.push(text.to_string());
        self.by_text.insert(text.to_string(), id);
        (id, true)
    }

    /// Rewrites one word, merging (a, b) -> c left to right without overlap.
    fn merge_word(word: &[u32], a: u32, b: u32, c: u32) -> Vec<u32> {
        let mut out = Vec::with_capacity(word.len());
        let mut i = 0;
        while i < word.len() {
            if i + 1 < word.len() && word[i] == a && word[i + 1] == b {
                out.push(c);
                i += 2;
            } else {
                out.push(word[i]);
                i += 1;
            }
        }
        out
    }

    /// Records a forced merge before statistics exist: rewrites every word.
    fn force_merge(&mut self, a: u32, b: u32) -> u32 {
        let text = format!("{}{}", self.texts[a as usize], self.texts[b as usize]);
        let (c, _) = self.symbol(&text);
        if self.merge_set.insert((a, b)) {
            self.merges.push((a, b));
            for w in &mut self.words {
                if w.windows(2).any(|p| p[0] == a && p[1] == b) {
                    *w = Self::merge_word(w, a, b, c);
                }
            }
        }
        c
    }

    /// Builds pair counts, the pair -> words index and the heap.
    fn index_pairs(&mut self) {
        for (wi, w) in self.words.iter().enumerate() {
            let f = self.freqs[wi];
            for p in w.windows(2) {
                let key = (p[0], p[1]);
                *self.pair_count.entry(key).or_insert(0) += f;
                self.pair_words.entry(key).or_default().push(wi as u32);
            }
        }
        for (&(a, b), &n) in &self.pair_count {
            self.heap.push((n, Reverse(a), Reverse(b)));
        }
    }

    /// Pops the best live pair: highest count, then smallest (left, right).
    fn best_pair(&mut self) -> Option<(u32, u32, i64)> {
        while let Some((n, Reverse(a), Reverse(b))) = self.heap.pop() {
            if self.pair_count.get(&(a, b)).copied() == Some(n) && n > 0 {
                return Some((a, b, n));
            }
        }
        None
    }

    /// Applies a learned merge to every word holding the pair, keeping the
    /// statistics exact.
    fn apply_merge(&mut self, a: u32, b: u32, c: u32) {
        self.merges.push((a, b));
        self.merge_set.insert((a, b));
        let mut list = self.pair_words.remove(&(a, b)).unwrap_or_default();
        list.sort_unstable();
        list.dedup();
        let mut changed: Vec<(u32, u32)> = Vec::new();
        for wi in list {
            let w = &self.words[wi as usize];
            if !w.windows(2).any(|p| p[0] == a && p[1] == b) {
                continue;
            }
            let f = self.freqs[wi as usize];
            let new = Self::merge_word(w, a, b, c);
            for p in w.windows(2) {
                let key = (p[0], p[1]);
                if let Some(n) = self.pair_count.get_mut(&key) {
                    *n -= f;
                }
                changed.push(key);
            }
            for p in new.windows(2) {
                let key = (p[0], p[1]);
                *self.pair_count.entry(key).or_insert(0) += f;
                changed.push(key);
                if key.0 == c || key.1 == c {
                    self.pair_words.entry(key).or_default().push(wi);
                }
            }
            self.words[wi as usize] = new;
        }
        self.pair_count.remove(&(a, b));
        changed.sort_unstable();
        changed.dedup();
        for key in changed {
            match self.pair_count.get(&key).copied() {
                Some(n) if n > 0 => self.heap.push((n, Reverse(key.0), Reverse(key.1))),
                Some(_) => {
                    self.pair_count.remove(&key);
                }
                None => {}
            }
        }
    }
}

fn is_fixed_word(text: &str, vocab_size: usize) -> bool {
    FIXED_WORDS
        .iter()
        .any(|&(id, t)| t == text && (id as usize) < vocab_size)
}

/// Builds the synthetic vocab described in the module docs. Deterministic:
/// the same `vocab_size` always gives the same `VocabData`.
pub fn build_synth_vocab(vocab_size: usize) -> Result<VocabData, TokenizerError> {
    if !(MIN_SYNTH_VOCAB..=MAX_SYNTH_VOCAB).contains(&vocab_size) {
        return Err(TokenizerError::BadVocabSize {
            requested: vocab_size,
            min: MIN_SYNTH_VOCAB,
            max: MAX_SYNTH_VOCAB,
        });
    }

    // Fixed part of the layout.
    let mut slots: Vec<Option<(String, TokenType, f32)>> = vec![None; vocab_size];
    for &(id, text, ty) in SPECIAL_TOKENS {
        if let Some(s) = slots.get_mut(id as usize) {
            let score = if ty == TokenType::Control {
                CONTROL_SCORE
            } else {
                0.0
            };
            *s = Some((text.to_string(), ty, score));
        }
    }
    for &(id, text) in FIXED_WORDS {
        if let Some(s) = slots.get_mut(id as usize) {
            *s = Some((text.to_string(), TokenType::Normal, 0.0));
        }
    }
    for b in 0..=255u32 {
        slots[(BYTE_TOKEN_BASE + b) as usize] =
            Some((format!("<0x{b:02X}>"), TokenType::Byte, 0.0));
    }
    let mut unused_n = 0usize;
    for s in slots.iter_mut().take(BYTE_TOKEN_BASE as usize) {
        if s.is_none() {
            *s = Some((
                format!("<unused{unused_n}>"),
                TokenType::Control,
                CONTROL_SCORE,
            ));
            unused_n += 1;
        }
    }
    // Texts a learned token must never take (they would duplicate a special
    // or byte token).
    let reserved: HashSet<String> = slots
        .iter()
        .flatten()
        .filter(|(_, ty, _)| *ty != TokenType::Normal)
        .map(|(t, _, _)| t.clone())
        .collect();
    let capacity = slots.iter().filter(|s| s.is_none()).count();

    // Character statistics over the corpus (newlines are split off).
    let mut char_count: FastMap<char, u64> = FastMap::default();
    let mut total_chars = 0u64;
    for doc in CORPUS {
        for c in doc.chars() {
            if c == '\n' || c == '\r' {
                continue;
            }
            let c = if c == ' ' { '▁' } else { c };
            *char_count.entry(c).or_insert(0) += 1;
            total_chars += 1;
        }
    }
    let mut by_freq: Vec<(char, u64)> = char_count.iter().map(|(&c, &n)| (c, n)).collect();
    by_freq.sort_unstable_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));
    let mut forced_chars: Vec<char> = vec!['▁'];
    for w in CHAIN_WORDS {
        for c in w.chars() {
            if !forced_chars.contains(&c) {
                forced_chars.push(c);
            }
        }
    }
    let alphabet_cap = (capacity / 3).max(forced_chars.len());
    let mut alphabet: Vec<char> = Vec::new();
    let mut covered = 0u64;
    for &(c, n) in &by_freq {
        let coverage = covered as f64 / total_chars.max(1) as f64;
        if coverage >= CHAR_COVERAGE || n < 2 || alphabet.len() + forced_chars.len() >= alphabet_cap
        {
            break;
        }
        alphabet.push(c);
        covered += n;
    }
    for &c in &forced_chars {
        if !alphabet.contains(&c) {
            alphabet.push(c);
        }
    }

    // Symbols: the alphabet first, in frequency order, then the newline
    // symbols, then whatever merges create.
    let mut tr = Trainer::new();
    let mut slots_used = 0usize;
    let mut char_sym: FastMap<char, u32> = FastMap::default();
    for &c in &alphabet {
        let (id, _) = tr.symbol(c.encode_utf8(&mut [0u8; 4]));
        char_sym.insert(c, id);
        if !is_fixed_word(&tr.texts[id as usize], vocab_size) {
            slots_used += 1;
        }
    }

    // Training words.
    let mut word_count: FastMap<Vec<u32>, i64> = FastMap::default();
    for doc in CORPUS {
        for line in doc.split('\n') {
            let mut cur: Vec<u32> = Vec::new();
            let mut cur_ends_space = false;
            let mut flush = |cur: &mut Vec<u32>| {
                if cur.len() > 1 {
                    *word_count.entry(std::mem::take(cur)).or_insert(0) += 1;
                } else {
                    cur.clear();
                }
            };
            for c in line.chars() {
                if c == '\r' {
                    continue;
                }
                let c = if c == ' ' { '▁' } else { c };
                let Some(&sym) = char_sym.get(&c) else {
                    flush(&mut cur);
                    cur_ends_space = false;
                    continue;
                };
                if c.is_ascii_digit() {
                    flush(&mut cur);
                    cur_ends_space = false;
                    continue;
                }
                let is_space = c == '▁';
                if is_space && !cur.is_empty() && !cur_ends_space {
                    flush(&mut cur);
                }
                cur.push(sym);
                cur_ends_space = is_space;
            }
            flush(&mut cur);
        }
    }
    let mut wc: Vec<(Vec<u32>, i64)> = word_count.into_iter().collect();
    wc.sort_unstable();
    for (w, n) in wc {
        tr.words.push(w);
        tr.freqs.push(n);
    }

    // Forced merges: newline runs, then one chain per fixed word.
    let (nl, _) = tr.symbol("\n");
    let nl2 = tr.force_merge(nl, nl);
    tr.force_merge(nl2, nl);
    for w in CHAIN_WORDS {
        let mut chars = w.chars();
        let Some(first) = chars.next() else { continue };
        let mut cur = char_sym[&first];
        for c in chars {
            let before = tr.texts.len();
            cur = tr.force_merge(cur, char_sym[&c]);
            if tr.texts.len() > before && !is_fixed_word(&tr.texts[cur as usize], vocab_size) {
                slots_used += 1;
            }
        }
    }
    if slots_used > capacity {
        return Err(TokenizerError::BadVocabSize {
            requested: vocab_size,
            min: MIN_SYNTH_VOCAB,
            max: MAX_SYNTH_VOCAB,
        });
    }

    // Learned merges.
    tr.index_pairs();
    let forced = tr.merges.len();
    while tr.merges.len() - forced < MAX_LEARNED_MERGES && slots_used < capacity {
        let Some((a, b, n)) = tr.best_pair() else {
            break;
        };
        if n < MIN_PAIR_COUNT {
            break;
        }
        let text = format!("{}{}", tr.texts[a as usize], tr.texts[b as usize]);
        if reserved.contains(&text) {
            tr.pair_count.remove(&(a, b));
            continue;
        }
        let (c, created) = tr.symbol(&text);
        if created && !is_fixed_word(&text, vocab_size) {
            slots_used += 1;
        }
        tr.apply_merge(a, b, c);
    }

    // Assign token ids: fixed words keep theirs, the rest take free ids in
    // symbol order.
    let fixed_id: FastMap<&str, u32> = FIXED_WORDS
        .iter()
        .filter(|&&(id, _)| (id as usize) < vocab_size)
        .map(|&(id, t)| (t, id))
        .collect();
    let mut free = (0..vocab_size)
        .filter(|&i| slots[i].is_none())
        .collect::<Vec<_>>()
        .into_iter();
    for (order, text) in tr.texts.iter().enumerate() {
        if fixed_id.contains_key(text.as_str()) {
            continue;
        }
        let id = free.next().ok_or_else(|| {
            TokenizerError::BadVocab(format!(
                "synthetic vocab of {vocab_size} ran out of ids at '{text}'"
            ))
        })?;
        slots[id] = Some((text.clone(), TokenType::Normal, -(order as f32)));
    }
    for id in free {
        slots[id] = Some((
            format!("<unused{unused_n}>"),
            TokenType::Control,
            CONTROL_SCORE,
        ));
        unused_n += 1;
    }

    let merges = tr
        .merges
        .iter()
        .map(|&(a, b)| format!("{} {}", tr.texts[a as usize], tr.texts[b as usize]))
        .collect();
    let mut tokens = Vec::with_capacity(vocab_size);
    let mut scores = Vec::with_capacity(vocab_size);
    let mut token_types = Vec::with_capacity(vocab_size);
    for (i, s) in slots.into_iter().enumerate() {
        let (t, ty, score) = s.ok_or_else(|| {
            TokenizerError::BadVocab(format!("synthetic vocab left id {i} empty"))
        })?;
        tokens.push(t);
        scores.push(score);
        token_types.push(ty.as_i32());
    }
    let vd = VocabData {
        tokens,
        scores,
        token_types,
        merges,
        bos: 2,
        eos: 1,
        eot: Some(106),
        pad: 0,
        unk: 3,
    };
    vd.validate()?;
    Ok(vd)
}
