//! The built-in demo model (`synth::builtin_model`): a file of the tiny
//! preset's exact layout that the engine's own loader, tokenizer and CPU
//! forward run, and whose greedy text comes from a model: no special
//! tokens, many distinct tokens, words.

use gemtune_engine::cpu::{CpuEngine, CpuOptions};
use gemtune_engine::engine::generate;
use gemtune_engine::model::Model;
use gemtune_engine::sampler::{Sampler, SamplerConfig};
use gemtune_engine::synth;
use gemtune_engine::tokenizer::chat::{encode_chat, Message};
use gemtune_engine::tokenizer::TokenType;

fn demo() -> Model {
    Model::from_gguf(synth::builtin_model().expect("open the demo model")).expect("load")
}

/// 32 greedy tokens after `prompt` on the CPU engine.
fn greedy(m: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut eng = CpuEngine::new(
        m,
        CpuOptions {
            max_seq: prompt.len() + n + 1,
            max_batch: 64,
            ..Default::default()
        },
    )
    .expect("engine");
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: 0,
    });
    let mut out = Vec::new();
    let mut push = |t: u32| {
        out.push(t);
        Ok(true)
    };
    // No stop token: a model that ends its turn early fails the count below.
    generate(
        &mut eng,
        prompt,
        &mut sampler,
        Some(n),
        &|_| false,
        &mut push,
    )
    .expect("generate");
    out
}

fn assert_model_text(m: &Model, what: &str, toks: &[u32]) {
    let tok = m.tokenizer();
    let text = tok.decode(toks).expect("decode");
    assert_eq!(toks.len(), 32, "{what}: {text:?}");
    for &t in toks {
        let ty = tok.token_type(t);
        assert!(
            matches!(ty, Some(TokenType::Normal) | Some(TokenType::Byte)),
            "{what}: token {t} ({:?}, {ty:?}) is not text: {text:?}",
            tok.token_text(t)
        );
    }
    let distinct: std::collections::BTreeSet<u32> = toks.iter().copied().collect();
    assert!(
        distinct.len() >= 8,
        "{what}: only {} distinct tokens: {text:?}",
        distinct.len()
    );
    // Words: mostly letters and spaces, at least five words of two letters or more.
    let letters = text
        .chars()
        .filter(|c| c.is_alphabetic() || *c == ' ')
        .count();
    assert!(
        letters * 10 >= text.chars().count() * 8,
        "{what}: not word-like: {text:?}"
    );
    let words = text
        .split_whitespace()
        .filter(|w| w.chars().filter(|c| c.is_alphabetic()).count() >= 2)
        .count();
    assert!(words >= 5, "{what}: {text:?}");
}

#[test]
fn greedy_chat_reply_is_text() {
    let m = demo();
    let prompt = encode_chat(m.tokenizer(), &[Message::user("Hello")], false);
    let toks = greedy(&m, &prompt, 32);
    assert_model_text(&m, "chat 'Hello'", &toks);
}

#[test]
fn greedy_raw_continuation_is_text() {
    let m = demo();
    let prompt = m.tokenizer().encode("The keeper", true, false);
    let toks = greedy(&m, &prompt, 32);
    assert_model_text(&m, "raw 'The keeper'", &toks);
}

#[test]
fn the_demo_model_has_the_tiny_layout() {
    let f = synth::builtin_model().expect("open");
    let m = Model::from_gguf(f).expect("load");
    let mut want = synth::preset(synth::SynthVariant::Tiny);
    want.name = Some("gemma4-tiny-demo".into());
    assert_eq!(m.config(), &want);
    // The same vocab as the random tiny model (the tokenizer the corpus was
    // tokenized with).
    let tiny = Model::from_gguf(synth::builtin_tiny().expect("tiny")).expect("load tiny");
    for text in ["Hello", "The keeper wound the clock.", "prefill and decode"] {
        assert_eq!(
            m.tokenizer().encode(text, true, false),
            tiny.tokenizer().encode(text, true, false)
        );
    }
    assert!(synth::builtin_model_description().contains("tiny"));
}
