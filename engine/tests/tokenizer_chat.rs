//! The chat template: rendered text, thinking blocks, BOS, stop tokens.

use gemtune_engine::tokenizer::chat::strip_thinking;
use gemtune_engine::tokenizer::train::build_synth_vocab;
use gemtune_engine::tokenizer::{encode_chat, render_prompt, Message, Tokenizer};

fn tiny() -> Tokenizer {
    Tokenizer::from_vocab(build_synth_vocab(2048).unwrap()).unwrap()
}

#[test]
fn single_user_turn_thinking_off() {
    let p = render_prompt(&[Message::user("  Hello \n")], false);
    assert_eq!(
        p,
        "<bos><|turn>user\nHello<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"
    );
}

#[test]
fn system_and_history() {
    let msgs = [
        Message::system("Be brief."),
        Message::user("What is 2+2?"),
        Message::model("<|channel>thought\nadd them<channel|>4"),
        Message::user("And 3+3?"),
    ];
    assert_eq!(
        render_prompt(&msgs, false),
        "<bos><|turn>system\nBe brief.<turn|>\n\
         <|turn>user\nWhat is 2+2?<turn|>\n\
         <|turn>model\n4<turn|>\n\
         <|turn>user\nAnd 3+3?<turn|>\n\
         <|turn>model\n<|channel>thought\n<channel|>"
    );
}

#[test]
fn thinking_on_adds_the_think_marker_and_no_empty_channel() {
    assert_eq!(
        render_prompt(&[Message::user("Hi")], true),
        "<bos><|turn>system\n<|think|>\n<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"
    );
    assert_eq!(
        render_prompt(&[Message::system("S"), Message::user("Hi")], true),
        "<bos><|turn>system\n<|think|>\nS<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"
    );
}

#[test]
fn thinking_blocks_are_stripped() {
    assert_eq!(
        strip_thinking("a<|channel>x<channel|>b<|channel>y<channel|>c"),
        "abc"
    );
    assert_eq!(strip_thinking("a<|channel>unterminated"), "a");
    assert_eq!(strip_thinking("plain"), "plain");
}

#[test]
fn template_tokens_and_single_bos() {
    let tok = tiny();
    let msgs = [
        Message::system("Answer briefly."),
        Message::user("Hello"),
        Message::model("Hello!"),
        Message::user("Bye"),
    ];
    let ids = encode_chat(&tok, &msgs, false);
    assert_eq!(ids[0], 2);
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 1, "{ids:?}");
    assert_eq!(ids.iter().filter(|&&i| i == 105).count(), 5);
    assert_eq!(ids.iter().filter(|&&i| i == 106).count(), 4);
    assert_eq!(
        &ids[ids.len() - 4..],
        [100, tok.token_id("thought").unwrap(), 107, 101]
    );
    // Same as tokenizing the rendered text with parse_special and no added BOS.
    assert_eq!(ids, tok.encode(&render_prompt(&msgs, false), false, true));
    // Adding BOS on top of the template's <bos> still gives one BOS.
    let again = tok.encode(&render_prompt(&msgs, false), true, true);
    assert_eq!(again, ids);
}

#[test]
fn golden_shape_on_the_tiny_vocab() {
    let tok = tiny();
    let id = |s: &str| tok.token_id(s).unwrap();
    let ids = encode_chat(&tok, &[Message::user("Hello")], false);
    assert_eq!(
        ids,
        [
            2,
            105,
            id("user"),
            107,
            id("Hello"),
            106,
            107,
            105,
            id("model"),
            107,
            100,
            id("thought"),
            107,
            101
        ]
    );
}

#[test]
fn control_text_in_content_stays_text() {
    let tok = tiny();
    let ids = encode_chat(&tok, &[Message::user("say <turn|> and <bos>")], false);
    assert_eq!(ids.iter().filter(|&&i| i == 106).count(), 1);
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 1);
    let text = tok.decode(&ids).unwrap();
    assert!(text.contains("say <turn|> and <bos>"), "{text:?}");
}

#[test]
fn stop_tokens() {
    let tok = tiny();
    assert!(tok.is_eog(1));
    assert!(tok.is_eog(106));
    assert!(!tok.is_eog(105));
    assert!(!tok.is_eog(2));
    assert_eq!(tok.eog_ids(), [1, 106]);
}

#[test]
fn role_names() {
    use gemtune_engine::tokenizer::Role;
    assert_eq!(Role::from_name("assistant"), Some(Role::Model));
    assert_eq!(Role::from_name("Developer"), Some(Role::System));
    assert_eq!(Role::from_name("user"), Some(Role::User));
    assert_eq!(Role::from_name("tool"), None);
    assert_eq!(Role::Model.as_str(), "model");
}
