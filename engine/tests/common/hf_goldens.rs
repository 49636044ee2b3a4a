//! Hugging Face goldens for the Gemma tokenizer (written by
//! scripts/make-tokenizer-fixture.py) and the checks both tokenizer parity
//! tests run on them. Each test uses one vocabulary's half of it.
#![allow(dead_code)]

use std::path::Path;

use gemtune_engine::tokenizer::Tokenizer;

/// Directory of the small Hugging Face tokenizer fixture.
pub fn fixture_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf-tokenizer")
}

/// One text with Hugging Face's ids for it.
pub struct Golden {
    pub text: String,
    /// `encode(text, add_special_tokens=False)`: added tokens split out.
    pub special: Vec<u32>,
    /// The same with `encode_special_tokens = True`: special tokens in the
    /// text are not matched.
    pub plain: Vec<u32>,
    /// HF `decode(special, skip_special_tokens=False)`; present for the
    /// small vocabulary only.
    pub decoded_special: Option<String>,
}

/// Which vocabulary's ids to read.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Vocab {
    /// The small fixture vocabulary (`ids_*`).
    Small,
    /// The full vocabulary of the npm package (`full_ids_*`).
    Full,
}

fn ids(row: &serde_json::Value, key: &str) -> Vec<u32> {
    row[key]
        .as_array()
        .unwrap_or_else(|| panic!("goldens: '{key}' missing"))
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .expect("goldens: ids are u32")
        })
        .collect()
}

pub fn load(vocab: Vocab) -> Vec<Golden> {
    let path = fixture_dir().join("goldens.jsonl");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let prefix = match vocab {
        Vocab::Small => "ids",
        Vocab::Full => "full_ids",
    };
    let rows: Vec<Golden> = text
        .lines()
        .map(|line| {
            let row: serde_json::Value = serde_json::from_str(line).expect("goldens: JSON");
            Golden {
                text: row["text"].as_str().expect("goldens: text").to_string(),
                special: ids(&row, &format!("{prefix}_special")),
                plain: ids(&row, &format!("{prefix}_plain")),
                decoded_special: match vocab {
                    Vocab::Small => row["decoded_special"].as_str().map(str::to_string),
                    Vocab::Full => None,
                },
            }
        })
        .collect();
    assert!(rows.len() >= 40, "goldens: only {} rows", rows.len());
    rows
}

/// Checks encode (special parsing on and off, with and without BOS) and
/// decode against every golden; returns the number of texts checked.
pub fn check(tok: &Tokenizer, goldens: &[Golden]) -> usize {
    let bos = tok.bos();
    for g in goldens {
        let t = &g.text;
        assert_eq!(
            tok.encode(t, false, true),
            g.special,
            "parse_special ids of {t:?}"
        );
        assert_eq!(tok.encode(t, false, false), g.plain, "plain ids of {t:?}");
        // BOS first, never doubled (Hugging Face would double it).
        let mut with_bos = vec![bos];
        with_bos.extend(
            g.special
                .iter()
                .skip(usize::from(g.special.first() == Some(&bos))),
        );
        assert_eq!(tok.encode(t, true, true), with_bos, "ids with BOS of {t:?}");
        // U+2581 in the text is a space once encoded, in both implementations.
        let want = t.replace('\u{2581}', " ");
        let decoded = tok.decode_special(&g.special).expect("decode");
        assert_eq!(decoded, want, "round trip of {t:?}");
        if let Some(hf) = &g.decoded_special {
            assert_eq!(&decoded, hf, "HF decode of {t:?}");
        }
        assert_eq!(
            tok.decode(&g.plain).expect("decode"),
            want,
            "plain round trip of {t:?}"
        );
    }
    goldens.len()
}
