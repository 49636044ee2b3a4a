//! `gemtune info MODEL.gguf`: architecture, parameter count, tensor types
//! and the resolved per-layer geometry of a Gemma 4 GGUF. The config is
//! resolved and every tensor validated first, so a bad file is an error
//! (exit 4) rather than a half-printed table.

use crate::exit::Exit;
use gemtune_engine::config::Gemma4Config;
use gemtune_engine::gguf::{GgufFile, GgufValue};
use gemtune_engine::plan::{active_share, tensor_plan, TensorRole};
use gemtune_kernels::quant::{dequantize_row, GgmlType};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model file.
    pub model: PathBuf,
}

/// Parameter count as llama.cpp prints it ("7.52 B").
pub fn format_params(n: u64) -> String {
    let x = n as f64;
    if x >= 1e12 {
        format!("{:.2} T", x / 1e12)
    } else if x >= 1e9 {
        format!("{:.2} B", x / 1e9)
    } else if x >= 1e6 {
        format!("{:.2} M", x / 1e6)
    } else {
        format!("{:.2} K", x / 1e3)
    }
}

/// The value of a one-element tensor (a layer output scale).
fn scalar_value(f: &GgufFile, name: &str) -> anyhow::Result<Option<f32>> {
    let Some(t) = f.tensor(name) else {
        return Ok(None);
    };
    let mut v = [0f32; 1];
    dequantize_row(t.ty, f.tensor_data(t), &mut v)
        .map_err(|e| anyhow::anyhow!("{}: tensor '{name}': {e}", f.path().display()))?;
    Ok(Some(v[0]))
}

/// Parameters and bytes one token uses: every tensor of the file, each
/// expert stack counted at `n_experts_used / n_experts` of its elements and
/// bytes (every expert's slice of a stack has the same size).
fn active_per_token(f: &GgufFile, cfg: &Gemma4Config) -> (u64, u64) {
    let roles: HashMap<String, TensorRole> = tensor_plan(cfg)
        .into_iter()
        .map(|t| (t.name, t.role))
        .collect();
    f.tensors().iter().fold((0, 0), |(p, b), t| {
        let role = roles.get(&t.name).copied().unwrap_or(TensorRole::Matrix);
        let (num, den) = active_share(cfg, role);
        (p + t.n_elements() * num / den, b + t.n_bytes() * num / den)
    })
}

/// The whole report as text (kept apart from printing for tests).
pub fn describe(f: &GgufFile, cfg: &Gemma4Config) -> anyhow::Result<String> {
    let mut s = String::new();
    let params: u64 = f.tensors().iter().map(|t| t.n_elements()).sum();
    let arch = f
        .get("general.architecture")
        .and_then(GgufValue::as_str)
        .unwrap_or("?");
    let n_swa = cfg
        .layers
        .iter()
        .filter(|l| l.kind == gemtune_engine::config::AttnKind::Sliding)
        .count();
    writeln!(s, "file          {}", f.path().display())?;
    writeln!(s, "architecture  {arch}")?;
    writeln!(s, "name          {}", cfg.name.as_deref().unwrap_or("-"))?;
    writeln!(s, "parameters    {} ({params})", format_params(params))?;
    if let Some(moe) = &cfg.moe {
        let (active, active_bytes) = active_per_token(f, cfg);
        writeln!(
            s,
            "active        {} ({active}) per token, {active_bytes} B: {} of {} experts, expert FFN {}",
            format_params(active),
            moe.n_experts_used,
            moe.n_experts,
            moe.expert_ffn_dim
        )?;
    }
    writeln!(s, "tensors       {}", f.tensors().len())?;
    writeln!(s, "file bytes    {}", f.file_len())?;
    writeln!(s, "context       {}", cfg.context_length)?;
    writeln!(s, "vocab         {}", cfg.vocab_size)?;
    writeln!(s, "d_model       {}", cfg.d_model)?;
    writeln!(
        s,
        "layers        {} ({n_swa} swa, {} full), window {}, KV-shared {}",
        cfg.n_layers,
        cfg.n_layers - n_swa,
        cfg.sliding_window,
        cfg.n_kv_shared_layers
    )?;
    writeln!(s, "ple width     {}", cfg.ple_dim)?;
    match cfg.final_logit_softcap {
        Some(c) => writeln!(s, "softcap       {c}")?,
        None => writeln!(s, "softcap       off")?,
    }
    writeln!(s, "rms eps       {:e}", cfg.rms_eps)?;
    writeln!(
        s,
        "rope          swa base {} dims {}; full base {} dims {}{}",
        cfg.rope_swa.freq_base,
        cfg.rope_swa.dims,
        cfg.rope_full.freq_base,
        cfg.rope_full.dims,
        if cfg.rope_full.freq_factors.is_some() {
            " (rope_freqs)"
        } else {
            ""
        }
    )?;

    // The CUDA engine's cache at its default sizes (SWA rings of window +
    // ubatch - 1 slots, donors own none).
    let seq = 4096.min(cfg.context_length);
    let ub = gemtune_engine::cuda::DEFAULT_UBATCH.min(seq);
    let kv = |t| gemtune_engine::cuda::cache_bytes(cfg, seq, ub, t);
    use gemtune_kernels::family::KvType;
    writeln!(
        s,
        "kv cache      {} positions, ubatch {ub}: f16 {} B, bf16 {} B, f32 {} B",
        seq,
        kv(KvType::F16),
        kv(KvType::Bf16),
        kv(KvType::F32)
    )?;

    // Tensor count, bytes and elements per type (bits per weight = bytes
    // * 8 / elements: a k-quant mix shows how much of it is which type).
    let mut by_type: BTreeMap<GgmlType, (usize, u64, u64)> = BTreeMap::new();
    for t in f.tensors() {
        let e = by_type.entry(t.ty).or_default();
        e.0 += 1;
        e.1 += t.n_bytes();
        e.2 += t.n_elements();
    }
    writeln!(s)?;
    writeln!(
        s,
        "{:<8} {:>8} {:>16} {:>6}",
        "type", "tensors", "bytes", "bpw"
    )?;
    for (ty, (n, bytes, elems)) in &by_type {
        let bpw = *bytes as f64 * 8.0 / (*elems).max(1) as f64;
        writeln!(s, "{:<8} {:>8} {:>16} {:>6.2}", ty.name(), n, bytes, bpw)?;
    }

    writeln!(s)?;
    writeln!(
        s,
        "{:>5} {:<4} {:>8} {:>7} {:>8} {:>7} {:>8} {:>6} {:>9}",
        "layer", "type", "head_dim", "q_heads", "kv_heads", "ffn", "kv_donor", "k_eq_v", "scale"
    )?;
    for l in &cfg.layers {
        let scale = scalar_value(f, &format!("blk.{}.layer_output_scale.weight", l.index))?;
        writeln!(
            s,
            "{:>5} {:<4} {:>8} {:>7} {:>8} {:>7} {:>8} {:>6} {:>9}",
            l.index,
            l.kind.short_name(),
            l.head_dim,
            l.n_heads,
            l.n_kv_heads,
            l.ffn_dim,
            l.kv_donor.map_or("-".to_string(), |d| d.to_string()),
            if l.k_eq_v { "yes" } else { "no" },
            scale.map_or("-".to_string(), |v| format!("{v:.6}")),
        )?;
    }
    Ok(s)
}

/// The CUDA engine's device bytes for the weights under `main` and
/// `strict` on sm_90 (planned, no GPU), next to the file's bytes of the
/// same tensors, and every lossy conversion at load.
pub fn device_weights(model: &gemtune_engine::model::Model) -> anyhow::Result<String> {
    let mut s = String::new();
    writeln!(s)?;
    for name in ["main", "strict"] {
        let profile = gemtune_engine::profile::Profile::load(name)?;
        let w = match gemtune_engine::cuda::weight_plan(
            model,
            profile,
            gemtune_kernels::compile::Arch(90),
        ) {
            Ok(w) => w,
            Err(e) => {
                writeln!(s, "cuda weights  {name:<6} (sm_90): cannot plan: {e}")?;
                continue;
            }
        };
        writeln!(
            s,
            "cuda weights  {name:<6} (sm_90): {} B on the device for {} B of file tensors ({:.3}x), {} lossy conversion(s), {} exact widening(s)",
            w.device_bytes,
            w.file_bytes,
            w.device_bytes as f64 / w.file_bytes.max(1) as f64,
            w.converted.len(),
            w.widened.len()
        )?;
        for c in &w.converted {
            writeln!(s, "              converted: {c}")?;
        }
        for c in &w.widened {
            writeln!(s, "              widened: {c}")?;
        }
    }
    Ok(s)
}

pub fn run(args: Args) -> anyhow::Result<Exit> {
    let f = GgufFile::open(&args.model)?;
    let cfg = Gemma4Config::from_gguf(&f)?;
    print!("{}", describe(&f, &cfg)?);
    let model = gemtune_engine::model::Model::from_gguf(f)?;
    print!("{}", device_weights(&model)?);
    Ok(Exit::Pass)
}
