//! An allocation-free string -> id index over a token table.
//!
//! Open addressing with linear probing; the table stores token ids only and
//! compares against the caller's token texts, so building it for a quarter
//! of a million tokens copies no strings.

use std::hash::Hasher;

use super::FastHasher;

const EMPTY: u32 = u32::MAX;

/// Index of a set of token ids by their text. The first id inserted for a
/// text wins.
#[derive(Clone, Debug, Default)]
pub struct StrIndex {
    slots: Vec<u32>,
    mask: usize,
    len: usize,
}

fn hash_str(s: &str) -> u64 {
    let mut h = FastHasher::default();
    h.write(s.as_bytes());
    h.finish()
}

impl StrIndex {
    /// An index sized for `n` entries (load factor at most 1/2).
    pub fn with_capacity(n: usize) -> StrIndex {
        let size = (n.max(4) * 2).next_power_of_two();
        StrIndex {
            slots: vec![EMPTY; size],
            mask: size - 1,
            len: 0,
        }
    }

    /// Number of ids indexed.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds `id` (whose text is `texts[id]`) unless its text is present.
    /// Returns false when the text was already indexed. Grows as needed.
    pub fn insert(&mut self, texts: &[String], id: u32) -> bool {
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow(texts);
        }
        let key = texts[id as usize].as_str();
        let mut i = hash_str(key) as usize & self.mask;
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                self.slots[i] = id;
                self.len += 1;
                return true;
            }
            if texts[s as usize] == key {
                return false;
            }
            i = (i + 1) & self.mask;
        }
    }

    fn grow(&mut self, texts: &[String]) {
        let old = std::mem::take(&mut self.slots);
        let size = (old.len() * 2).max(8);
        self.slots = vec![EMPTY; size];
        self.mask = size - 1;
        self.len = 0;
        for id in old.into_iter().filter(|&s| s != EMPTY) {
            self.insert(texts, id);
        }
    }

    /// The id whose text is `key`.
    pub fn get(&self, texts: &[String], key: &str) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let mut i = hash_str(key) as usize & self.mask;
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                return None;
            }
            if texts[s as usize] == key {
                return Some(s);
            }
            i = (i + 1) & self.mask;
        }
    }
}
