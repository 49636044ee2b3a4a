//! Encoding and decoding: round trips, newline runs, byte fallback, special
//! tokens, merge ranks, and agreement with a naive reference BPE.

use std::collections::HashMap;

use gemtune_engine::tokenizer::train::{build_synth_vocab, BYTE_TOKEN_BASE};
use gemtune_engine::tokenizer::{
    DecodeOptions, StreamDecoder, TokenType, Tokenizer, TokenizerError, VocabData,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn tiny() -> Tokenizer {
    Tokenizer::from_vocab(build_synth_vocab(2048).unwrap()).unwrap()
}

fn byte(b: u8) -> u32 {
    BYTE_TOKEN_BASE + u32::from(b)
}

/// A hand-built vocab: 0 <pad>, 1 <eos>, 2 <bos>, 3 <unk>, then `normal`.
fn hand_vocab(normal: &[&str], merges: &[&str]) -> VocabData {
    let mut tokens: Vec<String> = ["<pad>", "<eos>", "<bos>", "<unk>"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut types = vec![
        TokenType::Control.as_i32(),
        TokenType::Control.as_i32(),
        TokenType::Control.as_i32(),
        TokenType::Unknown.as_i32(),
    ];
    for t in normal {
        tokens.push(t.to_string());
        types.push(TokenType::Normal.as_i32());
    }
    VocabData {
        scores: vec![0.0; tokens.len()],
        tokens,
        token_types: types,
        merges: merges.iter().map(|s| s.to_string()).collect(),
        bos: 2,
        eos: 1,
        eot: None,
        pad: 0,
        unk: 3,
    }
}

const MULTILINGUAL: &[&str] = &[
    "The quick brown fox jumps over the lazy dog.",
    "  leading and trailing spaces  ",
    "multiple     spaces\tand\ttabs",
    "Grüße aus München: Straße, Äpfel, Öl, Übermut.",
    "Où est la bibliothèque ? C'est là-bas, près de l'église.",
    "¿Dónde está la estación? ¡Muchas gracias, señora!",
    "今日は雨が降っています。東京から大阪まで新幹線で行きます。",
    "今天天气很好，我们去公园散步吧。",
    "한국어 문장도 바이트로 돌아옵니다.",
    "ภาษาไทย",
    "Emoji: 😀🎉🚀 and 🦀🦀, flags 🇩🇪, family 👨‍👩‍👧, ❤️",
    "Numbers 3.14159, 1,024 and 2026-11-22; 0xFF; -1e-6",
    "fn main() {\n    println!(\"Hello, {name}!\");\n}\n",
    "# Title\n\n- item **bold** `code`\n\n| a | b |\n|---|---|\n",
    "windows line\r\nendings\r\n",
    "\n\n\n\nfour newlines first",
    "ends with newlines\n\n\n\n\n",
    "",
];

#[test]
fn multilingual_round_trip() {
    let tok = tiny();
    for text in MULTILINGUAL {
        let ids = tok.encode(text, false, false);
        assert_eq!(tok.decode(&ids).unwrap(), *text, "ids {ids:?}");
        let with_bos = tok.encode(text, true, false);
        assert_eq!(with_bos[0], 2);
        assert_eq!(&with_bos[1..], &ids[..]);
        assert_eq!(tok.decode(&with_bos).unwrap(), *text);
        assert!(ids.iter().all(|&id| (id as usize) < tok.vocab_size()));
    }
}

#[test]
fn spaces_become_the_space_symbol() {
    let tok = tiny();
    let space = tok.token_id("▁").unwrap();
    assert_eq!(tok.encode(" ", false, false), [space]);
    // No prefix space is added.
    let a = tok.encode("the", false, false);
    let b = tok.encode(" the", false, false);
    assert_ne!(a, b);
    assert_eq!(tok.decode(&b).unwrap(), " the");
    assert!(b
        .iter()
        .any(|&id| tok.token_text(id).unwrap().starts_with('▁')));
}

#[test]
fn newline_runs() {
    let tok = tiny();
    assert_eq!(tok.encode("\n", false, false), [107]);
    assert_eq!(tok.encode("\n\n", false, false), [108]);
    assert_eq!(tok.encode("\n\n\n", false, false), [109]);
    // Not a token: BPE over the run with the merges "\n \n" (rank 0) and
    // "\n\n \n" (rank 1).
    assert_eq!(tok.encode("\n\n\n\n", false, false), [108, 108]);
    assert_eq!(tok.encode("\n\n\n\n\n", false, false), [108, 109]);
    // Mixed: newline runs never merge with the text around them.
    let a = tok.encode("a", false, false);
    let b = tok.encode("b", false, false);
    let mut expect = a.clone();
    expect.push(108);
    expect.extend(&b);
    expect.push(107);
    expect.extend(&a);
    expect.extend([108, 108]);
    assert_eq!(tok.encode("a\n\nb\na\n\n\n\n", false, false), expect);
    assert_eq!(tok.decode(&expect).unwrap(), "a\n\nb\na\n\n\n\n");
}

#[test]
fn unlearned_characters_fall_back_to_bytes() {
    let tok = tiny();
    // Neither Hangul nor the crab is in the corpus.
    assert_eq!(
        tok.encode("한", false, false),
        [byte(0xED), byte(0x95), byte(0x9C)]
    );
    assert_eq!(
        tok.encode("🦀", false, false),
        [byte(0xF0), byte(0x9F), byte(0xA6), byte(0x80)]
    );
    let ids = tok.encode("a🦀b", false, false);
    assert!(ids
        .windows(4)
        .any(|w| w == [byte(0xF0), byte(0x9F), byte(0xA6), byte(0x80)]));
    assert_eq!(tok.decode(&ids).unwrap(), "a🦀b");
    // A learned CJK character is a single token, not bytes.
    let ids = tok.encode("の", false, false);
    assert_eq!(ids.len(), 1);
    assert_eq!(tok.token_type(ids[0]), Some(TokenType::Normal));
}

#[test]
fn invalid_byte_runs_decode_to_one_replacement_char_per_byte() {
    // Hugging Face's ByteFallback rule: a maximal run of byte tokens is its
    // text when the whole run is valid UTF-8, else U+FFFD for every byte.
    let tok = tiny();
    let ok = tok.encode("ok", false, false);
    assert_eq!(tok.decode(&[byte(0xFF)]).unwrap(), "\u{FFFD}");
    // A truncated sequence, then text.
    let ids = [vec![byte(0xED), byte(0x95)], ok.clone()].concat();
    assert_eq!(tok.decode(&ids).unwrap(), "\u{FFFD}\u{FFFD}ok");
    // A valid byte ('A') inside an invalid run is replaced too.
    assert_eq!(
        tok.decode(&[byte(0xF0), byte(b'A')]).unwrap(),
        "\u{FFFD}\u{FFFD}"
    );
    // Text ends a run: each side is judged on its own.
    let ids = [
        vec![byte(0xF0), byte(0x9F)],
        ok.clone(),
        vec![byte(0xA6), byte(0x80)],
    ]
    .concat();
    assert_eq!(
        tok.decode(&ids).unwrap(),
        "\u{FFFD}\u{FFFD}ok\u{FFFD}\u{FFFD}"
    );
}

#[test]
fn an_unrendered_control_token_does_not_split_a_byte_run() {
    let tok = tiny();
    let ids = [byte(0xF0), byte(0x9F), 2, byte(0xA6), byte(0x80)];
    assert_eq!(tok.decode(&ids).unwrap(), "🦀");
    assert_eq!(
        tok.decode_special(&ids).unwrap(),
        "\u{FFFD}\u{FFFD}<bos>\u{FFFD}\u{FFFD}"
    );
}

#[test]
fn stream_decoder_holds_byte_runs_until_text_ends_them() {
    let tok = tiny();
    let mut d = StreamDecoder::new(&tok, DecodeOptions::default());
    let mut got = Vec::new();
    for &id in &[byte(0xF0), byte(0x9F), byte(0xA6), byte(0x80)] {
        got.push(d.push(id).unwrap());
    }
    assert_eq!(got, ["", "", "", ""]);
    let a = tok.encode("Hello", false, false);
    assert_eq!(d.push(a[0]).unwrap(), "🦀Hello");
    d.push(byte(0xE4)).unwrap();
    assert_eq!(d.finish(), "\u{FFFD}");
    assert_eq!(d.finish(), "");
    assert!(matches!(
        d.push(5000),
        Err(TokenizerError::UnknownId { id: 5000, .. })
    ));
}

#[test]
fn streamed_text_equals_decode() {
    let tok = tiny();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let words = tok.encode("Grüße, 今日は the weather\n\n", false, false);
    for _ in 0..200 {
        let n = rng.random_range(0..24);
        let ids: Vec<u32> = (0..n)
            .map(|_| match rng.random_range(0..4) {
                0 => words[rng.random_range(0..words.len())],
                1 => rng.random_range(0..8), // control tokens and <unk>
                _ => byte(rng.random_range(0x80..=0xFF) as u8),
            })
            .collect();
        for special in [false, true] {
            let opts = DecodeOptions {
                render_control: special,
            };
            let mut d = StreamDecoder::new(&tok, opts);
            let mut streamed = String::new();
            for &id in &ids {
                streamed.push_str(&d.push(id).unwrap());
            }
            streamed.push_str(&d.finish());
            assert_eq!(streamed, tok.decode_with(&ids, opts).unwrap(), "{ids:?}");
        }
    }
}

#[test]
fn unknown_ids_are_errors() {
    let tok = tiny();
    let err = tok.decode(&[2, 2048]).unwrap_err();
    assert!(matches!(
        err,
        TokenizerError::UnknownId {
            id: 2048,
            vocab_size: 2048
        }
    ));
    assert!(tok.decode(&[u32::MAX]).is_err());
}

#[test]
fn special_tokens_inside_text() {
    let tok = tiny();
    let a = tok.encode("a", false, false);
    let b = tok.encode("b", false, false);
    let ids = tok.encode("a<turn|>b", false, true);
    assert_eq!(ids, [a.clone(), vec![106], b.clone()].concat());
    assert_eq!(tok.decode(&ids).unwrap(), "ab");
    assert_eq!(tok.decode_special(&ids).unwrap(), "a<turn|>b");

    // Without parse_special the control token is plain text.
    let ids = tok.encode("a<turn|>b", false, false);
    assert!(!ids.contains(&106));
    assert_eq!(tok.decode(&ids).unwrap(), "a<turn|>b");

    // User-defined markers match either way and always decode as text.
    for parse in [false, true] {
        let ids = tok.encode("x<|channel>thought\n<channel|>y", false, parse);
        assert!(ids.contains(&100) && ids.contains(&101), "{ids:?}");
        assert_eq!(tok.decode(&ids).unwrap(), "x<|channel>thought\n<channel|>y");
    }
    // Longest match: "<|tool_call>" is not "<|tool>" + text.
    assert_eq!(tok.encode("<|tool_call>", false, false), [48]);
    assert_eq!(tok.encode("<|tool>", false, true)[0], 46);
    assert_eq!(tok.encode("<|\"|>", false, false), [52]);
    // The unknown token only with parse_special.
    assert_eq!(tok.encode("<unk>", false, true), [3]);
    assert_ne!(tok.encode("<unk>", false, false), [3]);
    assert_eq!(tok.decode(&[3]).unwrap(), "\u{FFFD}");
}

#[test]
fn bos_is_never_doubled() {
    let tok = tiny();
    let ids = tok.encode("<bos>Hello", true, true);
    assert_eq!(ids[0], 2);
    assert_ne!(ids[1], 2);
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 1);
    let ids = tok.encode("<bos>Hello", false, true);
    assert_eq!(ids[0], 2);
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 1);
    assert_eq!(tok.encode("Hello", true, false)[0], 2);
}

#[test]
fn merges_apply_by_rank() {
    let normal = ["a", "b", "c", "ab", "bc", "abc"];
    // ids: a 4, b 5, c 6, ab 7, bc 8, abc 9
    let ab_first = Tokenizer::from_vocab(hand_vocab(&normal, &["a b", "b c"])).unwrap();
    let bc_first = Tokenizer::from_vocab(hand_vocab(&normal, &["b c", "a b"])).unwrap();
    assert_eq!(ab_first.encode("abc", false, false), [7, 6]);
    assert_eq!(bc_first.encode("abc", false, false), [4, 8]);
    // A second-level merge only fires on the symbols the first produced.
    let chain = Tokenizer::from_vocab(hand_vocab(&normal, &["a b", "b c", "ab c"])).unwrap();
    assert_eq!(chain.encode("abc", false, false), [9]);
    assert_eq!(chain.encode("abcbc", false, false), [9, 8]);
    // Equal ranks: the leftmost pair merges first.
    let aa = Tokenizer::from_vocab(hand_vocab(&["a", "aa"], &["a a"])).unwrap();
    assert_eq!(aa.encode("aaa", false, false), [5, 4]);
    assert_eq!(aa.encode("aaaa", false, false), [5, 5]);
    // No byte tokens in this vocab: an unknown character becomes <unk> per byte.
    assert_eq!(aa.encode("é", false, false), [3, 3]);
    // A merge whose result is not a token falls back to bytes (here <unk>,
    // as this vocab has no byte tokens).
    let odd = Tokenizer::from_vocab(hand_vocab(&["x", "y"], &["x y"])).unwrap();
    assert_eq!(odd.encode("xy", false, false), [3, 3]);
}

#[test]
fn malformed_merges_are_errors() {
    let err = Tokenizer::from_vocab(hand_vocab(&["a"], &["ab"])).unwrap_err();
    assert!(matches!(err, TokenizerError::BadVocab(_)), "{err}");
    let mut v = hand_vocab(&["a"], &[]);
    v.scores.pop();
    assert!(matches!(
        Tokenizer::from_vocab(v),
        Err(TokenizerError::BadVocab(_))
    ));
}

/// Plain BPE by strings: merge the lowest-rank adjacent pair, leftmost
/// first, until none applies.
fn naive_bpe(chunk: &str, ranks: &HashMap<(String, String), usize>) -> Vec<String> {
    let mut syms: Vec<String> = chunk.chars().map(String::from).collect();
    loop {
        let mut best: Option<(usize, usize)> = None;
        for i in 0..syms.len().saturating_sub(1) {
            if let Some(&r) = ranks.get(&(syms[i].clone(), syms[i + 1].clone())) {
                if best.is_none_or(|(br, _)| r < br) {
                    best = Some((r, i));
                }
            }
        }
        let Some((_, i)) = best else { return syms };
        let right = syms.remove(i + 1);
        syms[i].push_str(&right);
    }
}

#[test]
fn heap_bpe_matches_naive_bpe() {
    let v = build_synth_vocab(2048).unwrap();
    let mut ranks = HashMap::new();
    for (r, m) in v.merges.iter().enumerate() {
        let (a, b) = m.split_once(' ').unwrap();
        ranks.entry((a.to_string(), b.to_string())).or_insert(r);
    }
    let tok = Tokenizer::from_vocab(v).unwrap();
    let source: String = MULTILINGUAL.join(" ").replace(['\n', '\r'], " ");
    let chars: Vec<char> = source.chars().collect();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for _ in 0..300 {
        let start = rng.random_range(0..chars.len());
        let len = rng.random_range(1..60usize).min(chars.len() - start);
        let text: String = chars[start..start + len].iter().collect();
        let escaped = text.replace(' ', "▁");
        let mut expect = Vec::new();
        for s in naive_bpe(&escaped, &ranks) {
            match tok.token_id(&s) {
                Some(id) => expect.push(id),
                None => expect.extend(s.bytes().map(byte)),
            }
        }
        assert_eq!(tok.encode(&text, false, false), expect, "text {text:?}");
    }
}

#[test]
fn long_input_without_newlines_is_fast_enough() {
    let tok = tiny();
    let text = "the weather is warm and the bread is ready ".repeat(5000);
    let ids = tok.encode(&text, false, false);
    assert!(ids.len() > 10_000);
    assert_eq!(tok.decode(&ids).unwrap(), text);
}

/// `hand_vocab` with the tokens `specials` appended, each with its type.
fn with_specials(normal: &[&str], specials: &[(&str, TokenType)]) -> VocabData {
    let mut v = hand_vocab(normal, &[]);
    for &(t, ty) in specials {
        v.tokens.push(t.to_string());
        v.token_types.push(ty.as_i32());
        v.scores.push(0.0);
    }
    v
}

#[test]
fn added_tokens_split_leftmost_longest() {
    // Hugging Face's added-token split takes the leftmost match, then the
    // longest there; taking the longest token anywhere first ("xyz") would
    // give w + [xyz] instead.
    let normal = ["w", "x", "y", "z"]; // ids 4..=7
    let tok = Tokenizer::from_vocab(with_specials(
        &normal,
        &[
            ("wx", TokenType::UserDefined),
            ("xyz", TokenType::UserDefined),
        ],
    ))
    .unwrap();
    assert_eq!(tok.encode("wxyz", false, false), [8, 6, 7]);
    assert_eq!(tok.encode("xyzwx", false, false), [9, 8]);
}

#[test]
fn an_unparsed_control_token_stays_text_span_and_all() {
    // With special parsing off, a control token found by the leftmost-longest
    // split stays text, and no user-defined token is looked for inside its
    // span (Hugging Face's `encode_special_tokens`).
    let normal = ["<", "a", "b", ">", "c"]; // ids 4..=8
    let tok = Tokenizer::from_vocab(with_specials(
        &normal,
        &[
            ("<ab>", TokenType::Control),
            ("b>c", TokenType::UserDefined),
        ],
    ))
    .unwrap();
    assert_eq!(tok.encode("<ab>c", false, true), [9, 8]);
    assert_eq!(tok.encode("<ab>c", false, false), [4, 5, 6, 7, 8]);
    // Outside a control token's span the user-defined token still matches.
    assert_eq!(tok.encode("ab>c", false, false), [5, 10]);
    assert_eq!(tok.decode(&[4, 5, 6, 7, 8]).unwrap(), "<ab>c");
}
