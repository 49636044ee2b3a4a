//! `gemtune logits`: little-endian f32 logits of a token sequence, the
//! interface parity tools read. With `--all` the file holds
//! `[n_tokens][vocab]`, else the last position's `[vocab]` only. Logits are
//! after the final softcap, exactly what sampling sees.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context};
use gemtune_engine::forward::LogitRows;

use super::run::load_model;
use crate::cli::positive_usize;
use crate::engine_opts::{build_engine, Backend, CudaArgs};
use crate::exit::Exit;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model file (default: the built-in demo model).
    #[arg(short = 'm', long)]
    pub model: Option<PathBuf>,
    /// Token ids, comma- or space-separated (e.g. "2,105,2364").
    #[arg(long)]
    pub tokens: String,
    /// Logits of every position instead of the last one only.
    #[arg(long)]
    pub all: bool,
    /// Output file.
    #[arg(long)]
    pub out: PathBuf,
    /// Forward implementation (auto: CUDA when a GPU is present).
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    pub backend: Backend,
    /// Most tokens per CPU batch.
    #[arg(short = 'b', long, visible_alias = "batch-size", default_value = "128", value_parser = positive_usize)]
    pub batch: usize,
    /// Most tokens per CUDA prefill chunk.
    #[arg(long, visible_alias = "ubatch-size", default_value_t = gemtune_engine::cuda::DEFAULT_UBATCH, value_parser = positive_usize)]
    pub ubatch: usize,
    #[command(flatten)]
    pub cuda: CudaArgs,
}

/// Parse "2,105, 2364" / "2 105 2364" into ids.
pub fn parse_tokens(s: &str) -> anyhow::Result<Vec<u32>> {
    let ids = s
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse::<u32>()
                .with_context(|| format!("'{p}' is not a token id"))
        })
        .collect::<anyhow::Result<Vec<u32>>>()?;
    if ids.is_empty() {
        bail!("no token ids given (--tokens is empty)");
    }
    Ok(ids)
}

pub fn run(args: Args) -> anyhow::Result<Exit> {
    let ids = parse_tokens(&args.tokens)?;
    let model = load_model(args.model.as_deref())?;
    let vocab = model.vocab_size();
    if let Some((i, &id)) = ids.iter().enumerate().find(|(_, &id)| id as usize >= vocab) {
        bail!("token id {id} (index {i}) is out of range: the vocabulary has {vocab} tokens");
    }
    let ctx = model.config().context_length;
    if ids.len() > ctx {
        bail!("{} tokens exceed the model's context of {ctx}", ids.len());
    }
    let mut eng = build_engine(
        &model,
        args.backend,
        &args.cuda,
        ids.len(),
        args.batch,
        args.ubatch,
    )?;
    let rows = if args.all {
        LogitRows::All
    } else {
        LogitRows::Last
    };
    let logits = eng.forward(&ids, rows)?;
    let mut bytes = Vec::with_capacity(logits.data.len() * 4);
    for v in &logits.data {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    let mut f = std::fs::File::create(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    f.write_all(&bytes)
        .with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!(
        "wrote {} x {} f32 logits to {}",
        logits.n_rows(),
        vocab,
        args.out.display()
    );
    Ok(Exit::Pass)
}
