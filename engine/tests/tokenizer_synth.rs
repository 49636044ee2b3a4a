//! The synthetic vocab: layout, determinism, GGUF metadata round trip, and
//! the chat golden at the published ids.

use gemtune_engine::gguf::{GgufFile, GgufValue, GgufWriter};
use gemtune_engine::tokenizer::train::{
    build_synth_vocab, BYTE_TOKEN_BASE, MIN_SYNTH_VOCAB, SPECIAL_TOKENS,
};
use gemtune_engine::tokenizer::{
    encode_chat, Message, TokenType, Tokenizer, TokenizerError, VocabData,
};

fn gguf_with(meta: Vec<(String, GgufValue)>) -> GgufFile {
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.add_metadata(k, v);
    }
    let bytes = w
        .write_to_vec(|_, _, _| Ok::<(), std::convert::Infallible>(()))
        .expect("writing an in-memory GGUF");
    GgufFile::from_bytes(bytes, "vocab-test.gguf").expect("reading it back")
}

#[test]
fn tiny_layout_has_the_real_special_ids() {
    let v = build_synth_vocab(2048).unwrap();
    assert_eq!(v.tokens.len(), 2048);
    assert_eq!(v.scores.len(), 2048);
    assert_eq!(v.token_types.len(), 2048);
    let expect = [
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
        (107, "\n", TokenType::Normal),
        (108, "\n\n", TokenType::Normal),
        (109, "\n\n\n", TokenType::Normal),
        (238, "<0x00>", TokenType::Byte),
        (238 + 0x41, "<0x41>", TokenType::Byte),
        (493, "<0xFF>", TokenType::Byte),
    ];
    for (id, text, ty) in expect {
        assert_eq!(v.tokens[id], text, "token {id}");
        assert_eq!(v.token_type(id as u32), ty, "type of {id}");
    }
    assert_eq!(v.scores[1], -1000.0);
    assert_eq!(v.scores[106], -1000.0);
    // Low free ids are <unusedN> control tokens, numbered from 0.
    assert_eq!(v.tokens[5], "<unused0>");
    assert_eq!(v.token_type(5), TokenType::Control);
    assert_eq!((v.bos, v.eos, v.eot, v.pad, v.unk), (2, 1, Some(106), 0, 3));
    // 7 user-defined, 256 byte tokens, no duplicated texts.
    let count = |t: TokenType| v.token_types.iter().filter(|&&x| x == t.as_i32()).count();
    assert_eq!(count(TokenType::UserDefined), 7);
    assert_eq!(count(TokenType::Byte), 256);
    assert_eq!(count(TokenType::Unknown), 1);
    let mut seen = std::collections::HashSet::new();
    for t in &v.tokens {
        assert!(seen.insert(t.as_str()), "duplicated token text {t:?}");
    }
}

#[test]
fn tiny_vocab_learns_useful_merges() {
    let v = build_synth_vocab(2048).unwrap();
    // Nearly the whole free range is learned tokens, not padding.
    let normal = v
        .token_types
        .iter()
        .filter(|&&t| t == TokenType::Normal.as_i32())
        .count();
    assert!(normal > 1400, "only {normal} normal tokens");
    assert!(v.merges.len() > 1000, "only {} merges", v.merges.len());
    // Every merge's parts and result are tokens.
    let tok = Tokenizer::from_vocab(v.clone()).unwrap();
    for m in &v.merges {
        let (l, r) = m.split_once(' ').unwrap();
        assert!(tok.token_id(l).is_some(), "merge part {l:?}");
        assert!(tok.token_id(r).is_some(), "merge part {r:?}");
        assert!(
            tok.token_id(&format!("{l}{r}")).is_some(),
            "merge result of {m:?}"
        );
    }
    // Common English compresses well below one token per character.
    let text =
        "The weather in the old town was warm, and the user asked the model about the bread.";
    let ids = tok.encode(text, false, false);
    assert!(
        ids.len() * 3 < text.len(),
        "{} tokens for {} chars",
        ids.len(),
        text.len()
    );
    // The golden words are single tokens even where their real ids do not fit.
    for w in ["user", "model", "system", "thought", "Hello"] {
        let ids = tok.encode(w, false, false);
        assert_eq!(ids.len(), 1, "{w} -> {ids:?}");
        assert_eq!(tok.token_text(ids[0]), Some(w));
    }
    // Digits stay single (no merge contains a digit).
    assert!(v
        .merges
        .iter()
        .all(|m| !m.chars().any(|c| c.is_ascii_digit())));
}

#[test]
fn build_is_deterministic() {
    let a = build_synth_vocab(2048).unwrap();
    let b = build_synth_vocab(2048).unwrap();
    assert_eq!(a, b);
    let c = build_synth_vocab(4096).unwrap();
    // Same corpus, more room: the first learned tokens agree.
    assert_eq!(a.tokens[..700], c.tokens[..700]);
}

#[test]
fn bad_sizes_are_errors() {
    assert!(matches!(
        build_synth_vocab(MIN_SYNTH_VOCAB - 1),
        Err(TokenizerError::BadVocabSize { .. })
    ));
    assert!(matches!(
        build_synth_vocab(0),
        Err(TokenizerError::BadVocabSize { .. })
    ));
}

#[test]
fn full_size_vocab_reproduces_the_published_chat_golden() {
    let v = build_synth_vocab(262_144).unwrap();
    assert_eq!(v.tokens.len(), 262_144);
    for (id, text) in [
        (2364, "user"),
        (4368, "model"),
        (9731, "system"),
        (45_518, "thought"),
        (9259, "Hello"),
        (236_743, "▁"),
    ] {
        assert_eq!(v.tokens[id], text);
    }
    for &(id, text, ty) in SPECIAL_TOKENS {
        assert_eq!(v.tokens[id as usize], text);
        assert_eq!(v.token_type(id), ty);
    }
    // 16 control tokens are the published ones; the rest of the control
    // tokens are <unusedN> padding.
    let control_named = v
        .tokens
        .iter()
        .zip(&v.token_types)
        .filter(|(t, &ty)| ty == TokenType::Control.as_i32() && !t.starts_with("<unused"))
        .count();
    assert_eq!(control_named, 16);
    assert_eq!(
        v.tokens[262_143],
        format!(
            "<unused{}>",
            v.tokens.iter().filter(|t| t.starts_with("<unused")).count() - 1
        )
    );

    let tok = Tokenizer::from_vocab(v).unwrap();
    let ids = encode_chat(&tok, &[Message::user("Hello")], false);
    assert_eq!(
        ids,
        [2, 105, 2364, 107, 9259, 106, 107, 105, 4368, 107, 100, 45518, 107, 101]
    );
    assert_eq!(tok.encode(" ", false, false), [236_743]);
    assert_eq!(tok.encode("\n\n", false, false), [108]);
    assert!(tok.is_eog(1) && tok.is_eog(106) && !tok.is_eog(2) && !tok.is_eog(50));
}

#[test]
fn gguf_metadata_round_trip() {
    let v = build_synth_vocab(2048).unwrap();
    let meta = v.to_gguf_metadata();
    let keys: Vec<&str> = meta.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "tokenizer.ggml.model",
            "tokenizer.ggml.tokens",
            "tokenizer.ggml.scores",
            "tokenizer.ggml.token_type",
            "tokenizer.ggml.merges",
            "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.unknown_token_id",
            "tokenizer.ggml.padding_token_id",
            "tokenizer.ggml.add_bos_token",
            "tokenizer.ggml.add_space_prefix",
        ]
    );
    let f = gguf_with(meta);
    assert_eq!(
        f.get("tokenizer.ggml.model").and_then(GgufValue::as_str),
        Some("gemma4")
    );
    assert_eq!(
        f.get("tokenizer.ggml.add_bos_token")
            .and_then(GgufValue::as_bool),
        Some(true)
    );
    assert_eq!(
        f.get("tokenizer.ggml.add_space_prefix")
            .and_then(GgufValue::as_bool),
        Some(false)
    );
    assert!(f.get("tokenizer.ggml.pre").is_none());
    let back = VocabData::from_gguf(&f).unwrap();
    assert_eq!(back, v);
}

#[test]
fn gguf_errors_name_the_file_and_key() {
    let v = build_synth_vocab(2048).unwrap();
    let mut meta = v.to_gguf_metadata();
    meta[0].1 = GgufValue::String("llama".into());
    let err = VocabData::from_gguf(&gguf_with(meta)).unwrap_err();
    assert!(matches!(err, TokenizerError::UnsupportedModel { ref model, .. } if model == "llama"));
    assert!(err.to_string().contains("vocab-test.gguf"), "{err}");

    let meta: Vec<_> = v
        .to_gguf_metadata()
        .into_iter()
        .filter(|(k, _)| k != "tokenizer.ggml.tokens")
        .collect();
    let err = VocabData::from_gguf(&gguf_with(meta)).unwrap_err();
    assert!(matches!(
        err,
        TokenizerError::MissingKey {
            key: "tokenizer.ggml.tokens",
            ..
        }
    ));

    let mut meta = v.to_gguf_metadata();
    for (k, val) in &mut meta {
        if k == "tokenizer.ggml.bos_token_id" {
            *val = GgufValue::U32(5000);
        }
    }
    let err = VocabData::from_gguf(&gguf_with(meta)).unwrap_err();
    assert!(
        matches!(
            err,
            TokenizerError::BadKey {
                key: "tokenizer.ggml.bos_token_id",
                ..
            }
        ),
        "{err}"
    );

    let mut meta = v.to_gguf_metadata();
    meta[2].1 = GgufValue::F32(0.0); // scores: not an array
    let err = VocabData::from_gguf(&gguf_with(meta)).unwrap_err();
    assert!(
        matches!(
            err,
            TokenizerError::BadKey {
                key: "tokenizer.ggml.scores",
                ..
            }
        ),
        "{err}"
    );

    let err = VocabData::from_gguf(&gguf_with(vec![])).unwrap_err();
    assert!(matches!(
        err,
        TokenizerError::MissingKey {
            key: "tokenizer.ggml.model",
            ..
        }
    ));
}

#[test]
fn byte_tokens_cover_every_byte() {
    let v = build_synth_vocab(2048).unwrap();
    for b in 0..=255u32 {
        assert_eq!(
            v.tokens[(BYTE_TOKEN_BASE + b) as usize],
            format!("<0x{b:02X}>")
        );
    }
}

#[test]
fn every_learned_token_encodes_to_itself() {
    // The merges are real: encoding the text of any merge result gives that
    // one token back, so encode() reproduces what training built.
    for size in [2048, 262_144] {
        let v = build_synth_vocab(size).unwrap();
        let tok = Tokenizer::from_vocab(v.clone()).unwrap();
        for m in &v.merges {
            let joined = m.replacen(' ', "", 1);
            let ids = tok.encode(&joined.replace('▁', " "), false, false);
            assert_eq!(ids.len(), 1, "vocab {size}: merge {m:?} -> {ids:?}");
            assert_eq!(tok.token_text(ids[0]), Some(joined.as_str()));
        }
    }
}
