//! `gemtune synth VARIANT WTYPE OUT.gguf [--vocab N] [--seed S] [--weights FILE]`:
//! writes a random-weight GGUF with the exact layout of a published Gemma 4
//! file (engine::synth) and prints what it wrote. With `--weights` the values
//! come from FILE instead (trained weights of the same tensor names and
//! shapes, requantized to WTYPE; its `general.name` is kept).

use crate::exit::Exit;
use anyhow::Context;
use gemtune_engine::gguf::GgufFile;
use gemtune_engine::synth::{
    synth_config, synth_to_file, SynthModel, SynthOptions, SynthVariant, WeightType,
};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Variant {
    /// Every Gemma 4 feature at CPU-milliseconds size (d 128, 6 layers, vocab 2048).
    Tiny,
    /// Gemma 4 E2B (35 layers, PLE, 20 KV-shared layers, 4.65 B parameters).
    E2b,
    /// Gemma 4 E4B (42 layers, PLE, 18 KV-shared layers, 7.52 B parameters).
    E4b,
    /// Gemma 4 12B (48 layers, k_eq_v full layers, 11.9 B parameters).
    #[value(name = "12b")]
    B12,
    /// Gemma 4 31B (60 layers, k_eq_v full layers, 30.7 B parameters).
    #[value(name = "31b")]
    B31,
    /// Gemma 4 26B-A4B (30 layers, 128 experts, top-8, shared MLP 2112,
    /// 25.2 B parameters, 3.82 B active per token).
    #[value(name = "26b-a4b")]
    B26A4b,
    /// Every 26B-A4B feature at CPU-milliseconds size (d 128, 6 layers,
    /// 6 experts, top-2, vocab 2048).
    #[value(name = "tiny-moe")]
    TinyMoe,
}

impl From<Variant> for SynthVariant {
    fn from(v: Variant) -> SynthVariant {
        match v {
            Variant::Tiny => SynthVariant::Tiny,
            Variant::E2b => SynthVariant::E2b,
            Variant::E4b => SynthVariant::E4b,
            Variant::B12 => SynthVariant::B12,
            Variant::B31 => SynthVariant::B31,
            Variant::B26A4b => SynthVariant::B26A4b,
            Variant::TinyMoe => SynthVariant::TinyMoe,
        }
    }
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Wtype {
    F32,
    F16,
    /// Q8_0 matrices and embedding tables.
    #[value(name = "q8_0")]
    Q8_0,
    /// Q4_0 matrices, Q6_K embedding tables.
    #[value(name = "q4_0")]
    Q4_0,
    Bf16,
    /// llama.cpp's Q4_K_M mix: Q4_K, Q6_K on attn_v / ffn_down of the
    /// use_more_bits layers and on the embedding tables (docs/gemma4.md §4.3).
    #[value(name = "q4_k_m")]
    Q4KM,
    /// llama.cpp's Q5_K_M mix: Q5_K, Q6_K where Q4_K_M has it.
    #[value(name = "q5_k_m")]
    Q5KM,
    /// llama.cpp's Q6_K: Q6_K everywhere.
    #[value(name = "q6_k")]
    Q6K,
}

impl From<Wtype> for WeightType {
    fn from(w: Wtype) -> WeightType {
        match w {
            Wtype::F32 => WeightType::F32,
            Wtype::F16 => WeightType::F16,
            Wtype::Q8_0 => WeightType::Q8_0,
            Wtype::Q4_0 => WeightType::Q4_0,
            Wtype::Bf16 => WeightType::Bf16,
            Wtype::Q4KM => WeightType::Q4KM,
            Wtype::Q5KM => WeightType::Q5KM,
            Wtype::Q6K => WeightType::Q6K,
        }
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// Model variant.
    #[arg(value_enum)]
    pub variant: Variant,
    /// Storage type of the 2-D weight matrices (1-D tensors are always F32).
    #[arg(value_enum)]
    pub wtype: Wtype,
    /// Output GGUF path (created or overwritten).
    pub out: PathBuf,
    /// Vocab size instead of the variant's (must hold the special and byte tokens).
    #[arg(long, value_parser = crate::cli::positive_usize)]
    pub vocab: Option<usize>,
    /// Seed of the random weights (same seed, same bytes).
    #[arg(long, default_value_t = 0, value_parser = crate::cli::seed)]
    pub seed: u64,
    /// Take every tensor's values from this GGUF (same tensor names and
    /// shapes, any type) instead of random ones, e.g. trained weights.
    #[arg(long, value_name = "FILE")]
    pub weights: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<Exit> {
    let variant = SynthVariant::from(args.variant);
    let wtype = WeightType::from(args.wtype);
    let opts = SynthOptions {
        vocab: args.vocab,
        seed: args.seed,
    };
    let start = Instant::now();
    let written = match &args.weights {
        None => synth_to_file(variant, wtype, &args.out, opts),
        Some(path) => {
            let src =
                GgufFile::open(path).with_context(|| format!("opening {}", path.display()))?;
            let mut cfg = synth_config(variant, &opts);
            if let Some(name) = src.get_str("general.name") {
                cfg.name = Some(name.to_string());
            }
            SynthModel::from_config(cfg, wtype, args.seed)
                .and_then(|m| m.write_with_weights(&args.out, &src))
        }
    };
    let summary = written
        .with_context(|| format!("{}: cannot write the synthetic model", args.out.display()))?;
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "wrote {} ({} {}, seed {})",
        args.out.display(),
        variant.name(),
        wtype.name(),
        args.seed
    );
    println!("tensors     {}", summary.tensors);
    println!("bytes       {}", summary.bytes);
    println!("parameters  {}", summary.parameters);
    println!("seconds     {seconds:.3}");
    Ok(Exit::Pass)
}
