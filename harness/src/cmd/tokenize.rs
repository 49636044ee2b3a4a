//! `gemtune tokenize` / `gemtune detokenize`: the model's tokenizer from the
//! command line. Without `-m` both use the built-in demo model.

use crate::exit::Exit;
use anyhow::Context;
use gemtune_engine::gguf::GgufFile;
use gemtune_engine::tokenizer::{DecodeOptions, Tokenizer};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model whose tokenizer to use (default: the built-in demo model).
    #[arg(short, long)]
    model: Option<PathBuf>,
    /// Text to tokenize.
    text: String,
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
    /// GGUF model whose tokenizer to use (default: the built-in demo model).
    #[arg(short, long)]
    model: Option<PathBuf>,
    /// Token ids, separated by commas and/or spaces (one or more arguments).
    #[arg(required = true, num_args = 1..)]
    ids: Vec<String>,
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

/// Parses "2,105, 3 4" style lists; any piece that is not a u32 is an error.
fn parse_ids(args: &[String]) -> anyhow::Result<Vec<u32>> {
    let mut ids = Vec::new();
    for arg in args {
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
    if ids.is_empty() {
        anyhow::bail!("no token ids given");
    }
    Ok(ids)
}

pub fn run(args: Args) -> anyhow::Result<Exit> {
    let tok = load_tokenizer(args.model.as_ref())?;
    let ids = tok.encode(&args.text, !args.no_bos, args.parse_special);
    let line: Vec<String> = ids.iter().map(u32::to_string).collect();
    println!("{}", line.join(","));
    Ok(Exit::Pass)
}

pub fn run_detokenize(args: DetokenizeArgs) -> anyhow::Result<Exit> {
    let ids = parse_ids(&args.ids)?;
    let tok = load_tokenizer(args.model.as_ref())?;
    let text = tok.decode_with(
        &ids,
        DecodeOptions {
            render_control: args.special,
        },
    )?;
    println!("{text}");
    Ok(Exit::Pass)
}

#[cfg(test)]
mod tests {
    use super::parse_ids;

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
}
