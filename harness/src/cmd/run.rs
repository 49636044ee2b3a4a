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
//! - Without `-m` it runs the built-in demo model (`synth::builtin_model`:
//!   the tiny preset with weights trained on a few pages of prose), so the
//!   command works on any machine and prints words.
//! - The first line on stderr says which engine runs which model (for the
//!   built-in model, what it is and what its weights are), before any work.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use gemtune_engine::engine::{generate, EngineError};
use gemtune_engine::model::Model;
use gemtune_engine::sampler::{Sampler, SamplerConfig};
use gemtune_engine::synth;
use gemtune_engine::tokenizer::chat::{self, Message};
use gemtune_engine::tokenizer::{DecodeOptions, StreamDecoder};

use crate::cli::{count, n_predict, non_negative_f32, positive_usize, seed, unit_f32};
use crate::engine_opts::{build_engine, print_phases, resolve_backend, Backend, CudaArgs};
use crate::exit::Exit;

/// Load `-m MODEL`, or the built-in demo model when absent.
pub fn load_model(path: Option<&Path>) -> anyhow::Result<Model> {
    match path {
        Some(p) if p.is_dir() => bail!("{} is a directory, not a GGUF file", p.display()),
        Some(p) => Model::load(p).with_context(|| format!("loading {}", p.display())),
        None => {
            let f = synth::builtin_model().context("opening the built-in demo model")?;
            Model::from_gguf(f).context("loading the built-in demo model")
        }
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model file (default: the built-in demo model, a tiny Gemma 4 trained on a few pages of prose).
    #[arg(short = 'm', long)]
    pub model: Option<PathBuf>,
    /// Prompt text.
    #[arg(short = 'p', long)]
    pub prompt: String,
    /// Most tokens to generate; -1: until the end of the context.
    #[arg(short = 'n', long = "n-predict", default_value = "128", value_parser = n_predict)]
    pub n_predict: crate::cli::NPredict,
    /// Sampling temperature, >= 0 (default: greedy).
    #[arg(long, value_parser = non_negative_f32)]
    pub temp: Option<f32>,
    /// Keep the K most likely tokens (0 = off); only with --temp.
    #[arg(long, value_parser = count)]
    pub top_k: Option<usize>,
    /// Nucleus sampling mass in [0, 1] (1.0 = off); only with --temp.
    #[arg(long, value_parser = unit_f32)]
    pub top_p: Option<f32>,
    /// Drop tokens below P times the top probability, P in [0, 1] (0 = off); only with --temp.
    #[arg(long, value_parser = unit_f32)]
    pub min_p: Option<f32>,
    /// Sampling seed (any u64).
    #[arg(short = 's', long, default_value_t = 0, value_parser = seed)]
    pub seed: u64,
    /// No chat template: `<bos>` + the prompt text.
    #[arg(long)]
    pub raw: bool,
    /// System turn text (chat template only).
    #[arg(long, visible_alias = "system-prompt")]
    pub system: Option<String>,
    /// Forward implementation (auto: CUDA when a GPU is present).
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    pub backend: Backend,
    /// Most tokens per CPU batch.
    #[arg(short = 'b', long, visible_alias = "batch-size", default_value = "128", value_parser = positive_usize)]
    pub batch: usize,
    /// Most tokens per CUDA prefill chunk.
    #[arg(long, visible_alias = "ubatch-size", default_value_t = gemtune_engine::cuda::DEFAULT_UBATCH, value_parser = positive_usize)]
    pub ubatch: usize,
    /// Context size (default: prompt + -n, capped at the model's).
    #[arg(short = 'c', long, visible_alias = "ctx-size", value_parser = positive_usize)]
    pub ctx: Option<usize>,
    /// Print which kernel serves each engine slot and why, and the memory used.
    #[arg(short = 'v', long)]
    pub verbose: bool,
    #[command(flatten)]
    pub cuda: CudaArgs,
}

/// The engine and model a run uses, in one line: `run: <engine> | model:
/// <model>`.
fn first_line(
    backend: Backend,
    fell_back: Option<&str>,
    cuda: &CudaArgs,
    path: Option<&Path>,
    model: &Model,
) -> String {
    let engine = match (backend, fell_back) {
        (Backend::Cuda, _) => format!(
            "the CUDA engine (device {}, profile {})",
            cuda.device(),
            cuda.profile
        ),
        (_, Some(why)) => format!("the CPU engine (--backend auto found no GPU: {why})"),
        _ => "the CPU engine".to_string(),
    };
    let what = match path {
        None => format!(
            "{} (-m MODEL.gguf runs a real one)",
            synth::builtin_model_description()
        ),
        Some(p) => {
            let cfg = model.config();
            format!(
                "{} ({}, {} layers, d_model {})",
                p.display(),
                cfg.name.as_deref().unwrap_or("unnamed"),
                cfg.n_layers,
                cfg.d_model
            )
        }
    };
    format!("run: {engine} | model: {what}")
}

pub fn run(args: Args) -> anyhow::Result<Exit> {
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
    let limit = args.ctx.unwrap_or(ctx).min(ctx);
    if prompt.len() >= limit {
        bail!(
            "the prompt has {} tokens but the context holds {limit} (room is needed for at least one generated token)",
            prompt.len()
        );
    }
    let max_seq = match (args.ctx, args.n_predict.0) {
        (Some(c), _) => c.min(ctx),
        (None, Some(n)) => (prompt.len() + n.max(1)).min(ctx),
        (None, None) => ctx,
    };
    let (backend, fell_back) = resolve_backend(args.backend, args.cuda.device());
    eprintln!(
        "{}",
        first_line(
            backend,
            fell_back.as_deref(),
            &args.cuda,
            args.model.as_deref(),
            &model
        )
    );
    let mut eng = build_engine(
        &model,
        backend,
        &args.cuda,
        max_seq,
        args.batch,
        args.ubatch,
    )?;
    if let Some(n) = eng.conversion_notice() {
        eprintln!("{n}");
    }
    if args.verbose {
        for l in eng.describe() {
            eprintln!("{l}");
        }
    }
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: args.temp.unwrap_or(0.0),
        top_k: args.top_k.unwrap_or(0),
        top_p: args.top_p.unwrap_or(1.0),
        min_p: args.min_p.unwrap_or(0.0),
        seed: args.seed,
    });

    let mut text = StreamDecoder::new(tok, DecodeOptions::default());
    let st = {
        let mut out = std::io::stdout().lock();
        let mut emit = |t: u32| -> Result<bool, EngineError> {
            let piece = text
                .push(t)
                .map_err(|e| EngineError::Device(format!("detokenizing: {e}")))?;
            out.write_all(piece.as_bytes())
                .and_then(|_| out.flush())
                .map_err(|e| EngineError::Device(format!("writing stdout: {e}")))?;
            Ok(true)
        };
        let is_stop = |t: u32| tok.is_eog(t);
        generate(
            eng.as_mut(),
            &prompt,
            &mut sampler,
            args.n_predict.0,
            &is_stop,
            &mut emit,
        )?
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", text.finish())?;
    out.flush()?;
    if st.hit_context {
        eprintln!("note: stopped at the end of the context ({max_seq} tokens)");
    }
    eprintln!(
        "prefill: {} tok, {:.2} tok/s | decode: {} tok, {:.2} tok/s",
        st.prompt_tokens,
        st.prefill_tps(),
        st.decode_steps,
        st.decode_tps()
    );
    if args.cuda.profile_phases {
        print_phases(eng.as_mut());
    }
    Ok(Exit::Pass)
}
