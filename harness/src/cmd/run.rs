//! `gemtune run`: generate text from a prompt and report prefill/decode speed.
//!
//! - Prompt: the chat template by default (one user turn, optional system
//!   turn, thinking off); `--raw` feeds `<bos>` + the text as is.
//! - Sampling: greedy unless `--temp` is given (a benchmark tool should be
//!   deterministic by default); `--top-k/--top-p/--min-p` filter only when
//!   sampling; `--seed` makes sampled runs repeatable.
//! - Output: the generated text is streamed to stdout as it is produced; one
//!   stats line `prefill: N tok, X tok/s | decode: N tok, Y tok/s` ends the
//!   run on stderr. Decode counts single-token forward passes (the first
//!   generated token comes from the prefill's logits).
//! - Stops at an end-of-generation token (`<eos>` 1, `<turn|>` 106) or after
//!   `-n` tokens, or when the context is full.
//! - Without `-m` it runs the built-in tiny synthetic model, so the command
//!   works on any machine (its text is noise: the weights are random).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gemtune_engine::cpu::{CpuEngine, CpuOptions, LogitRows};
use gemtune_engine::model::Model;
use gemtune_engine::sampler::{Sampler, SamplerConfig};
use gemtune_engine::synth;
use gemtune_engine::tokenizer::chat::{self, Message};
use gemtune_engine::tokenizer::{DecodeOptions, StreamDecoder};

use crate::exit::Exit;

/// Which forward implementation runs the model.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Cpu,
    Cuda,
    /// The CUDA backend where one is built and a GPU is present, else the CPU.
    Auto,
}

/// Resolve `--backend` to a runnable backend (only the CPU one exists yet).
pub fn resolve_backend(b: Backend) -> anyhow::Result<Backend> {
    match b {
        Backend::Cpu | Backend::Auto => Ok(Backend::Cpu),
        Backend::Cuda => bail!("the CUDA backend is not built yet; use --backend cpu"),
    }
}

/// Load `-m MODEL`, or the built-in tiny synthetic model when absent.
pub fn load_model(path: Option<&Path>) -> anyhow::Result<Model> {
    match path {
        Some(p) => Model::load(p).with_context(|| format!("loading {}", p.display())),
        None => {
            let f = synth::builtin_tiny().context("building the built-in tiny model")?;
            Model::from_gguf(f).context("loading the built-in tiny model")
        }
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model file (default: the built-in tiny synthetic model).
    #[arg(short = 'm', long)]
    pub model: Option<PathBuf>,
    /// Prompt text.
    #[arg(short = 'p', long)]
    pub prompt: String,
    /// Most tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    pub n_predict: usize,
    /// Sampling temperature (default: greedy).
    #[arg(long)]
    pub temp: Option<f32>,
    /// Keep the K most likely tokens (0 = off); only with --temp.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Nucleus sampling mass (1.0 = off); only with --temp.
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Drop tokens below P times the top probability (0 = off); only with --temp.
    #[arg(long)]
    pub min_p: Option<f32>,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// No chat template: `<bos>` + the prompt text.
    #[arg(long)]
    pub raw: bool,
    /// System turn text (chat template only).
    #[arg(long)]
    pub system: Option<String>,
    /// Forward implementation.
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    pub backend: Backend,
    /// Most tokens per prefill batch.
    #[arg(long, default_value_t = 128)]
    pub batch: usize,
}

pub fn run(args: Args) -> anyhow::Result<Exit> {
    resolve_backend(args.backend)?;
    if args.prompt.trim().is_empty() {
        bail!("the prompt is empty");
    }
    if args.raw && args.system.is_some() {
        bail!("--system needs the chat template; drop --raw");
    }
    let model = load_model(args.model.as_deref())?;
    let tok = model.tokenizer();
    let ctx = model.config().context_length;

    let prompt = if args.raw {
        tok.encode(&args.prompt, true, false)
    } else {
        let mut msgs = Vec::new();
        if let Some(s) = &args.system {
            msgs.push(Message::system(s.clone()));
        }
        msgs.push(Message::user(args.prompt.clone()));
        // The template supplies `<bos>` (never doubled).
        chat::encode_chat(tok, &msgs, false)
    };
    if prompt.len() >= ctx {
        bail!(
            "the prompt has {} tokens but the model's context holds {ctx} (room is needed for at least one generated token)",
            prompt.len()
        );
    }
    let max_seq = (prompt.len() + args.n_predict.max(1)).min(ctx);
    let mut eng = CpuEngine::new(
        &model,
        CpuOptions {
            max_seq,
            max_batch: args.batch.max(1),
        },
    )?;
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: args.temp.unwrap_or(0.0),
        top_k: args.top_k.unwrap_or(0),
        top_p: args.top_p.unwrap_or(1.0),
        min_p: args.min_p.unwrap_or(0.0),
        seed: args.seed,
    });

    let t0 = Instant::now();
    let logits = eng.forward(&prompt, LogitRows::Last)?;
    let prefill = t0.elapsed();
    let mut next = sampler.sample(logits.last().context("prefill returned no logits")?);

    let mut out = std::io::stdout().lock();
    let mut text = StreamDecoder::new(tok, DecodeOptions::default());
    let mut generated: Vec<u32> = Vec::new();
    let mut decode_n = 0usize;
    let mut decode_t = Duration::ZERO;
    loop {
        if args.n_predict == 0 || tok.is_eog(next) || next == 1 || next == 106 {
            break;
        }
        generated.push(next);
        out.write_all(text.push(next)?.as_bytes())?;
        out.flush()?;
        if generated.len() >= args.n_predict || eng.position() >= eng.max_seq() {
            break;
        }
        let t = Instant::now();
        let l = eng.forward(&[next], LogitRows::Last)?;
        decode_t += t.elapsed();
        decode_n += 1;
        next = sampler.sample(l.last().context("decode returned no logits")?);
    }
    writeln!(out, "{}", text.finish())?;
    out.flush()?;
    if generated.len() < args.n_predict && eng.position() >= ctx {
        eprintln!("note: stopped at the end of the context ({ctx} tokens)");
    }
    eprintln!(
        "prefill: {} tok, {:.2} tok/s | decode: {} tok, {:.2} tok/s",
        prompt.len(),
        rate(prompt.len(), prefill),
        decode_n,
        rate(decode_n, decode_t)
    );
    Ok(Exit::Pass)
}

fn rate(n: usize, t: Duration) -> f64 {
    let s = t.as_secs_f64();
    if n == 0 || s <= 0.0 {
        0.0
    } else {
        n as f64 / s
    }
}
