//! `gemtune tokenize` / `gemtune detokenize`: the model's tokenizer from the
//! command line. Without `-m` both use the built-in demo model; `-m` takes
//! any GGUF with `tokenizer.ggml.*` keys, a full model or a tokenizer-only
//! file such as `scripts/hf-tokenizer-to-gguf.py` writes.
//!
//! Batch use (`--file`, `--lines`) serves parity tools: one process loads the
//! vocab once and handles a whole corpus. Lines are split at "\n" only (a
//! "\r" stays part of its line), and a final "\n" does not start an extra
//! empty line.

use crate::exit::Exit;
use anyhow::Context;
use gemtune_engine::gguf::GgufFile;
use gemtune_engine::tokenizer::{DecodeOptions, Tokenizer};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model (or tokenizer-only GGUF) whose tokenizer to use
    /// (default: the built-in demo model).
    #[arg(short, long)]
    model: Option<PathBuf>,
    /// Text to tokenize.
    #[arg(required_unless_present = "file", conflicts_with = "file")]
    text: Option<String>,
    /// Read the text from this UTF-8 file ("-" for standard input).
    #[arg(long)]
    file: Option<PathBuf>,
    /// Tokenize each line of the text on its own and print one line of ids
    /// per input line (an empty line gives an empty line).
    #[arg(long)]
    lines: bool,
    /// Do not put <bos> first.
    #[arg(long)]
    no_bos: bool,
    /// Match control tokens written in the text (e.g. "<|turn>").
    /// User-defined markers such as "<|channel>" always match.
    #[arg(long)]
    parse_special: bool,
}

#[derive(clap::Args)]
pub struct DetokenizeArgs {
    /// GGUF model (or tokenizer-only GGUF) whose tokenizer to use
    /// (default: the built-in demo model).
    #[arg(short, long)]
    model: Option<PathBuf>,
    /// Token ids, separated by commas and/or spaces (one or more arguments).
    #[arg(required_unless_present = "file", conflicts_with = "file", num_args = 1..)]
    ids: Vec<String>,
    /// Read the ids from this file ("-" for standard input).
    #[arg(long)]
    file: Option<PathBuf>,
    /// Decode each line of ids on its own and print each text as a JSON
    /// string on its own line (so decoded newlines cannot break the lines).
    #[arg(long)]
    lines: bool,
    /// Render control tokens (<bos>, <|turn>, <turn|>, ...) as their text.
    #[arg(long)]
    special: bool,
}

fn load_tokenizer(model: Option<&PathBuf>) -> anyhow::Result<Tokenizer> {
    let file = match model {
        Some(path) => {
            GgufFile::open(path).with_context(|| format!("opening {}", path.display()))?
        }
        None => {
            gemtune_engine::synth::builtin_model().context("opening the built-in demo model")?
        }
    };
    Tokenizer::from_gguf(&file)
        .with_context(|| format!("loading the tokenizer of {}", file.path().display()))
}

/// Reads a whole UTF-8 file, "-" meaning standard input.
fn read_text(path: &Path) -> anyhow::Result<String> {
    let mut bytes = Vec::new();
    if path == Path::new("-") {
        std::io::stdin()
            .read_to_end(&mut bytes)
            .context("reading standard input")?;
    } else {
        bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    }
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{}: not UTF-8 (invalid byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

/// The lines of a text split at "\n" only; a final "\n" ends the last line
/// rather than starting an empty one.
fn split_lines(text: &str) -> impl Iterator<Item = &str> {
    text.strip_suffix('\n')
        .map_or((!text.is_empty()).then_some(text), Some)
        .into_iter()
        .flat_map(|t| t.split('\n'))
}

/// Parses "2,105, 3 4" style lists; any piece that is not a u32 is an error.
/// An empty list is allowed here; callers decide whether it is an error.
fn parse_id_list<'a>(pieces: impl IntoIterator<Item = &'a str>) -> anyhow::Result<Vec<u32>> {
    let mut ids = Vec::new();
    for arg in pieces {
        for piece in arg.split(|c: char| c == ',' || c.is_whitespace()) {
            if piece.is_empty() {
                continue;
            }
            let id: u32 = piece.parse().with_context(|| {
                format!("'{piece}' is not a token id (a number 0..=4294967295)")
            })?;
            ids.push(id);
        }
    }
    Ok(ids)
}

/// Parses the id arguments of `detokenize`; at least one id is required.
fn parse_ids(args: &[String]) -> anyhow::Result<Vec<u32>> {
    let ids = parse_id_list(args.iter().map(String::as_str))?;
    if ids.is_empty() {
        anyhow::bail!("no token ids given");
    }
    Ok(ids)
}

fn write_ids(out: &mut impl Write, ids: &[u32]) -> std::io::Result<()> {
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        write!(out, "{id}")?;
    }
    out.write_all(b"\n")
}

pub fn run(args: Args) -> anyhow::Result<Exit> {
    let tok = load_tokenizer(args.model.as_ref())?;
    let text = match (&args.text, &args.file) {
        (_, Some(path)) => read_text(path)?,
        (Some(t), None) => t.clone(),
        (None, None) => anyhow::bail!("give a text or --file"),
    };
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    if args.lines {
        for line in split_lines(&text) {
            write_ids(
                &mut out,
                &tok.encode(line, !args.no_bos, args.parse_special),
            )?;
        }
    } else {
        write_ids(
            &mut out,
            &tok.encode(&text, !args.no_bos, args.parse_special),
        )?;
    }
    out.flush()?;
    Ok(Exit::Pass)
}

pub fn run_detokenize(args: DetokenizeArgs) -> anyhow::Result<Exit> {
    let opts = DecodeOptions {
        render_control: args.special,
    };
    let tok = load_tokenizer(args.model.as_ref())?;
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    match &args.file {
        Some(path) => {
            let text = read_text(path)?;
            if args.lines {
                for (n, line) in split_lines(&text).enumerate() {
                    let ids = parse_id_list([line])
                        .with_context(|| format!("{} line {}", path.display(), n + 1))?;
                    let decoded = tok.decode_with(&ids, opts)?;
                    writeln!(out, "{}", serde_json::to_string(&decoded)?)?;
                }
            } else {
                let ids = parse_id_list(text.lines())?;
                if ids.is_empty() {
                    anyhow::bail!("{}: no token ids", path.display());
                }
                writeln!(out, "{}", tok.decode_with(&ids, opts)?)?;
            }
        }
        None => {
            let ids = parse_ids(&args.ids)?;
            let decoded = tok.decode_with(&ids, opts)?;
            if args.lines {
                writeln!(out, "{}", serde_json::to_string(&decoded)?)?;
            } else {
                writeln!(out, "{decoded}")?;
            }
        }
    }
    out.flush()?;
    Ok(Exit::Pass)
}

#[cfg(test)]
mod tests {
    use super::{parse_ids, split_lines};

    #[test]
    fn ids_split_on_commas_and_spaces() {
        let got = parse_ids(&["2,105, 3".to_string(), "4 5".to_string()]).unwrap();
        assert_eq!(got, vec![2, 105, 3, 4, 5]);
    }

    #[test]
    fn bad_ids_are_errors() {
        assert!(parse_ids(&["2,x".to_string()]).is_err());
        assert!(parse_ids(&["-1".to_string()]).is_err());
        assert!(parse_ids(&["4294967296".to_string()]).is_err());
        assert!(parse_ids(&[",".to_string()]).is_err());
    }

    #[test]
    fn lines_split_at_newline_only() {
        let got: Vec<&str> = split_lines("a\r\n\nb\u{2028}c\n").collect();
        assert_eq!(got, ["a\r", "", "b\u{2028}c"]);
        let got: Vec<&str> = split_lines("x\n\n").collect();
        assert_eq!(got, ["x", ""]);
        assert_eq!(split_lines("").count(), 0);
        assert_eq!(split_lines("\n").collect::<Vec<_>>(), [""]);
        assert_eq!(
            split_lines("no newline").collect::<Vec<_>>(),
            ["no newline"]
        );
    }
}
