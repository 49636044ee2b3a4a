//! The Gemma 4 chat template in text form (spec §5.3), without tools or media.
//!
//! ```text
//! <bos>[<|turn>system\n[<|think|>\n]SYSTEM<turn|>\n]
//! <|turn>user\nUSER<turn|>\n
//! <|turn>model\nMODEL<turn|>\n              (history, thinking blocks stripped)
//! <|turn>model\n[<|channel>thought\n<channel|>]   (generation prompt)
//! ```
//! - A system turn is written when the first message is a system message or
//!   thinking is on; `<|think|>` follows "system\n" when thinking is on, with
//!   a "\n" after it as in the Hugging Face golden of the 12B model.
//! - System messages after the first are written as system turns in place.
//! - Content is trimmed; model history loses everything from `<|channel>` to
//!   `<channel|>` (the thinking blocks) before trimming.
//! - Thinking off (the default) ends the prompt with an empty thought
//!   channel, as current templates do.
//! - Generation stops at `<eos>` (1) or `<turn|>` (106): `Tokenizer::is_eog`.

use super::Tokenizer;

pub const BOS: &str = "<bos>";
pub const TURN_START: &str = "<|turn>";
pub const TURN_END: &str = "<turn|>";
pub const THINK: &str = "<|think|>";
pub const CHANNEL_START: &str = "<|channel>";
pub const CHANNEL_END: &str = "<channel|>";
/// What the generation prompt ends with when thinking is off.
pub const EMPTY_THOUGHT: &str = "<|channel>thought\n<channel|>";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    /// The assistant ("assistant" in other templates maps here).
    Model,
}

impl Role {
    /// Parses a role name: "system" and "developer" are `System`, "user" is
    /// `User`, "model" and "assistant" are `Model` (case-insensitive).
    pub fn from_name(name: &str) -> Option<Role> {
        match name.to_ascii_lowercase().as_str() {
            "system" | "developer" => Some(Role::System),
            "user" => Some(Role::User),
            "model" | "assistant" => Some(Role::Model),
            _ => None,
        }
    }

    /// The role name the template writes.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Model => "model",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Message {
        Message {
            role,
            content: content.into(),
        }
    }

    pub fn system(content: impl Into<String>) -> Message {
        Message::new(Role::System, content)
    }

    pub fn user(content: impl Into<String>) -> Message {
        Message::new(Role::User, content)
    }

    pub fn model(content: impl Into<String>) -> Message {
        Message::new(Role::Model, content)
    }
}

/// Removes every `<|channel>…<channel|>` block (an unterminated block runs to
/// the end of the text).
pub fn strip_thinking(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(CHANNEL_START) {
        out.push_str(&rest[..i]);
        let after = &rest[i + CHANNEL_START.len()..];
        match after.find(CHANNEL_END) {
            Some(j) => rest = &after[j + CHANNEL_END.len()..],
            None => rest = "",
        }
    }
    out.push_str(rest);
    out
}

/// One piece of a rendered prompt: template markup or message content.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Piece<'a> {
    Markup(&'a str),
    Content(&'a str),
}

/// Walks the template, handing each piece to `f` (owned content is passed
/// through `scratch`).
fn render_pieces(messages: &[Message], thinking: bool, mut f: impl FnMut(Piece<'_>)) {
    f(Piece::Markup(BOS));
    let first_is_system = matches!(messages.first(), Some(m) if m.role == Role::System);
    let mut rest = messages;
    if first_is_system || thinking {
        f(Piece::Markup(TURN_START));
        f(Piece::Markup("system\n"));
        if thinking {
            f(Piece::Markup(THINK));
            f(Piece::Markup("\n"));
        }
        if first_is_system {
            f(Piece::Content(messages[0].content.trim()));
            rest = &messages[1..];
        }
        f(Piece::Markup(TURN_END));
        f(Piece::Markup("\n"));
    }
    for m in rest {
        f(Piece::Markup(TURN_START));
        f(Piece::Markup(m.role.as_str()));
        f(Piece::Markup("\n"));
        if m.role == Role::Model {
            let stripped = strip_thinking(&m.content);
            f(Piece::Content(stripped.trim()));
        } else {
            f(Piece::Content(m.content.trim()));
        }
        f(Piece::Markup(TURN_END));
        f(Piece::Markup("\n"));
    }
    f(Piece::Markup(TURN_START));
    f(Piece::Markup("model\n"));
    if !thinking {
        f(Piece::Markup(EMPTY_THOUGHT));
    }
}

/// The prompt text, starting with `<bos>` and ending with the generation
/// prompt.
pub fn render_prompt(messages: &[Message], thinking: bool) -> String {
    let mut s = String::new();
    render_pieces(messages, thinking, |p| match p {
        Piece::Markup(t) | Piece::Content(t) => s.push_str(t),
    });
    s
}

/// Token ids of the rendered prompt. The template supplies `<bos>`, so no
/// BOS is added (it is never doubled). Markup is tokenized with
/// `parse_special = true`; message content with `parse_special = false`, so
/// control-token text typed by a user (say "<turn|>") stays text, while the
/// user-defined markers (`<|channel>`, `<|tool_call>`, ...) still match. For
/// content without control-token text the result equals
/// `tok.encode(&render_prompt(..), false, true)`: every content piece is
/// bounded by a newline or a special token, where the encoder splits anyway.
pub fn encode_chat(tok: &Tokenizer, messages: &[Message], thinking: bool) -> Vec<u32> {
    let mut ids = Vec::new();
    let mut markup = String::new();
    let flush = |markup: &mut String, ids: &mut Vec<u32>| {
        if !markup.is_empty() {
            ids.extend(tok.encode(markup, false, true));
            markup.clear();
        }
    };
    render_pieces(messages, thinking, |p| match p {
        Piece::Markup(t) => markup.push_str(t),
        Piece::Content(t) => {
            flush(&mut markup, &mut ids);
            ids.extend(tok.encode(t, false, false));
        }
    });
    flush(&mut markup, &mut ids);
    ids
}
