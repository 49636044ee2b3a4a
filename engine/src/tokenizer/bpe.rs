//! BPE by merge rank over Unicode code points (`byte_encode = false`).
//!
//! Symbols are interned strings: ids below the vocab size are token ids, ids
//! above it are strings that appear in merges without being tokens (a
//! well-formed vocab has none, but the merge semantics are defined on text, so
//! they are kept). Merges are keyed by the (left, right) symbol pair.
//!
//! A chunk is encoded with a doubly linked list of symbols and a min-heap of
//! candidate pairs ordered by (rank, position): the lowest-rank pair is merged
//! first, the leftmost among equal ranks, exactly as llama.cpp's
//! `llm_tokenizer_bpe_session`. Stale heap entries are detected on pop by
//! checking that both symbols are still adjacent and unchanged, so a chunk of
//! n code points costs O(n log n).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::strindex::StrIndex;
use super::{FastMap, TokenizerError};

/// Symbol id of a code point that is neither a token nor in any merge.
const NO_SYMBOL: u32 = u32::MAX;

/// Merge table and symbol interner.
pub struct Bpe {
    n_vocab: u32,
    /// Token text -> id (lowest id for duplicated texts), over the token
    /// table the methods are given.
    token_id: StrIndex,
    /// Merge strings that are not tokens: text -> symbol id (>= n_vocab).
    extra_id: FastMap<String, u32>,
    /// (left, right) -> (rank, result symbol).
    merges: FastMap<(u32, u32), (u32, u32)>,
}

#[derive(Clone, Copy)]
struct Sym {
    id: u32,
    start: u32,
    end: u32,
    prev: u32,
    next: u32,
    alive: bool,
}

const NIL: u32 = u32::MAX;

/// A heap entry: (rank, left index, right index, left id, right id). Ordered
/// by rank, then by position, so equal ranks merge leftmost first.
type Candidate = (u32, u32, u32, u32, u32);

impl Bpe {
    /// Builds the interner from the token texts and parses the merges
    /// ("LEFT RIGHT", split at the first space after the first byte).
    /// The methods that look up text must be given the same `tokens`.
    pub fn new(tokens: &[String], merges: &[String]) -> Result<Bpe, TokenizerError> {
        let n_vocab = u32::try_from(tokens.len()).map_err(|_| {
            TokenizerError::BadVocab(format!("{} tokens do not fit u32 ids", tokens.len()))
        })?;
        let mut token_id = StrIndex::with_capacity(tokens.len());
        for i in 0..n_vocab {
            token_id.insert(tokens, i);
        }
        let mut bpe = Bpe {
            n_vocab,
            token_id,
            extra_id: FastMap::default(),
            merges: FastMap::with_capacity_and_hasher(merges.len(), Default::default()),
        };
        let mut joined = String::new();
        for (rank, m) in merges.iter().enumerate() {
            let split = m
                .char_indices()
                .skip(1)
                .find(|&(_, c)| c == ' ')
                .map(|(i, _)| i)
                .ok_or_else(|| {
                    TokenizerError::BadVocab(format!("merge {rank} '{m}' has no space"))
                })?;
            let (left, right) = (&m[..split], &m[split + 1..]);
            if right.is_empty() {
                return Err(TokenizerError::BadVocab(format!(
                    "merge {rank} '{m}' has an empty right side"
                )));
            }
            let l = bpe.intern(tokens, left);
            let r = bpe.intern(tokens, right);
            joined.clear();
            joined.push_str(left);
            joined.push_str(right);
            let res = bpe.intern(tokens, &joined);
            let rank = u32::try_from(rank)
                .map_err(|_| TokenizerError::BadVocab("too many merges".into()))?;
            bpe.merges.entry((l, r)).or_insert((rank, res));
        }
        Ok(bpe)
    }

    fn intern(&mut self, tokens: &[String], text: &str) -> u32 {
        if let Some(id) = self.token_id.get(tokens, text) {
            return id;
        }
        if let Some(&id) = self.extra_id.get(text) {
            return id;
        }
        let id = self.n_vocab + self.extra_id.len() as u32;
        self.extra_id.insert(text.to_string(), id);
        id
    }

    /// Token id of an exact text.
    pub fn token_id(&self, tokens: &[String], text: &str) -> Option<u32> {
        self.token_id.get(tokens, text)
    }

    /// Number of merges with a distinct pair.
    pub fn n_merges(&self) -> usize {
        self.merges.len()
    }

    /// Rank and result of merging two symbols.
    pub fn merge_of(&self, left: u32, right: u32) -> Option<(u32, u32)> {
        self.merges.get(&(left, right)).copied()
    }

    fn symbol_of(&self, tokens: &[String], text: &str) -> u32 {
        self.token_id
            .get(tokens, text)
            .or_else(|| self.extra_id.get(text).copied())
            .unwrap_or(NO_SYMBOL)
    }

    /// Encodes one chunk (already "▁"-escaped, no special tokens). Final
    /// symbols that are tokens are emitted as such; the others go through
    /// `fallback` with their text (the caller emits byte tokens).
    pub fn encode_chunk(
        &self,
        tokens: &[String],
        chunk: &str,
        out: &mut Vec<u32>,
        mut fallback: impl FnMut(&str, &mut Vec<u32>),
    ) {
        let mut syms: Vec<Sym> = Vec::with_capacity(chunk.len());
        for (i, c) in chunk.char_indices() {
            let end = i + c.len_utf8();
            let n = syms.len() as u32;
            syms.push(Sym {
                id: self.symbol_of(tokens, &chunk[i..end]),
                start: i as u32,
                end: end as u32,
                prev: if n == 0 { NIL } else { n - 1 },
                next: n + 1,
                alive: true,
            });
        }
        let Some(last) = syms.last_mut() else { return };
        last.next = NIL;

        let mut heap: BinaryHeap<Reverse<Candidate>> = BinaryHeap::new();
        let push = |heap: &mut BinaryHeap<_>, syms: &[Sym], l: u32| {
            let ls = syms[l as usize];
            if ls.next == NIL || ls.id == NO_SYMBOL {
                return;
            }
            let rs = syms[ls.next as usize];
            if rs.id == NO_SYMBOL {
                return;
            }
            if let Some(&(rank, _)) = self.merges.get(&(ls.id, rs.id)) {
                heap.push(Reverse((rank, l, ls.next, ls.id, rs.id)));
            }
        };
        for i in 0..syms.len() as u32 {
            push(&mut heap, &syms, i);
        }
        while let Some(Reverse((_, l, r, lid, rid))) = heap.pop() {
            let (ls, rs) = (syms[l as usize], syms[r as usize]);
            if !ls.alive || !rs.alive || ls.next != r || ls.id != lid || rs.id != rid {
                continue;
            }
            let Some(&(_, res)) = self.merges.get(&(lid, rid)) else {
                continue;
            };
            syms[l as usize].id = res;
            syms[l as usize].end = rs.end;
            syms[l as usize].next = rs.next;
            syms[r as usize].alive = false;
            if rs.next != NIL {
                syms[rs.next as usize].prev = l;
            }
            if ls.prev != NIL {
                push(&mut heap, &syms, ls.prev);
            }
            push(&mut heap, &syms, l);
        }

        let mut i = 0u32;
        while i != NIL {
            let s = syms[i as usize];
            if s.id < self.n_vocab {
                out.push(s.id);
            } else {
                fallback(&chunk[s.start as usize..s.end as usize], out);
            }
            i = s.next;
        }
    }
}
