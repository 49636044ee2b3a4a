//! The type each matrix, table and router is read in on the device: the
//! file's own where a kernel reads it, Q8_0 widened exactly (`widening`) or
//! requantized (`conversion`) where none does, and the Q|K|V runs of one
//! type each.

use gemtune_kernels::family::WType;
use gemtune_kernels::quant::{widens_exactly_to_q8_0, GgmlType};

use super::ProjLayouts;

/// The type the matmul kernels read for matrices of file types `parts`
/// fused into one: the file's own type when every part has it and it is a
/// matmul weight type (`WType`), else Q8_0 (fused parts share one device
/// type, so mixed parts and types without a matmul kernel, F32 among them,
/// are requantized at load).
pub fn device_type(parts: &[GgmlType]) -> WType {
    match parts.split_first() {
        Some((&t, rest)) if rest.iter().all(|&r| r == t) => WType::of(t).unwrap_or(WType::Q8_0),
        _ => WType::Q8_0,
    }
}

/// The runs a fused Q|K|V of file types `parts` is uploaded and launched
/// as: consecutive parts whose device types (`device_type` of each alone)
/// agree share a run, so a V stored as Q6_K beside Q4_K Q and K (Q4_K_M
/// files) is a second matrix read in its own type, not requantized. Each
/// run's launch writes its own `[rows][n_run]` block of the Q|K|V buffer
/// (`stages::attention_block`), and Q, K and V are read from there with
/// their run's row stride.
pub fn fused_runs(parts: &[GgmlType]) -> Vec<std::ops::Range<usize>> {
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    for (i, &t) in parts.iter().enumerate() {
        match runs.last_mut() {
            Some(r) if device_type(&[parts[r.start]]) == device_type(&[t]) => r.end = i + 1,
            _ => runs.push(i..i + 1),
        }
    }
    runs
}

/// The name of run `j` of `runs` of layer `l`'s Q|K|V.
pub fn qkv_run_name(l: usize, j: usize, runs: usize) -> String {
    if runs == 1 {
        format!("blk.{l}.attn_qkv")
    } else {
        format!("blk.{l}.attn_qkv.{j}")
    }
}

/// Why matrices of file types `parts` fused into one are converted lossily
/// to `wt` (`device_type`), or `None` when they are read as they are or
/// widened exactly (`widening`).
pub fn conversion(parts: &[GgmlType], wt: WType) -> Option<String> {
    let to = wt.ggml();
    if parts.iter().all(|&t| exact_as(t, to)) {
        return None;
    }
    Some(format!(
        "{} -> {} planes, lossy: {}",
        type_list(parts),
        to.name(),
        why_not_native(parts)
    ))
}

/// Whether rows of file type `from` uploaded as `to` keep every value:
/// the same type, or a widening to Q8_0 (`quant::widen_to_q8_0`).
pub fn exact_as(from: GgmlType, to: GgmlType) -> bool {
    from == to || (to == GgmlType::Q8_0 && widens_exactly_to_q8_0(from))
}

/// The line naming an exact widening of matrices of file types `parts` to
/// `to` (Q8_0 from Q4_0 / Q5_0 parts, alone or beside Q8_0 ones), or `None`
/// when they are read as they are or converted lossily (`conversion`).
pub fn widening(parts: &[GgmlType], to: GgmlType) -> Option<String> {
    if parts.iter().all(|&t| t == to) || !parts.iter().all(|&t| exact_as(t, to)) {
        return None;
    }
    Some(format!(
        "{} -> {} planes, exact (block scales kept, quants re-centred into int8; {} B per 32 weights): {}",
        type_list(parts),
        to.name(),
        to.type_size(),
        why_not_native(parts)
    ))
}

/// `(t1, t2, ...)`: the file types of a fused matrix's parts.
fn type_list(parts: &[GgmlType]) -> String {
    let names: Vec<&str> = parts.iter().map(|t| t.name()).collect();
    format!("({})", names.join(", "))
}

/// Why parts of file types `parts` are not read in their own type.
fn why_not_native(parts: &[GgmlType]) -> String {
    match parts.iter().find(|&&t| WType::of(t).is_none()) {
        Some(t) => format!("no matmul kernel reads {} weights", t.name()),
        None => "the fused parts' types differ and one kernel reads them".to_string(),
    }
}

/// Embedding-table types the `embed` and `ple` kernels read as they are;
/// other types are requantized to Q8_0 at load.
pub const EMBED_TYPES: &[GgmlType] = &[
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q6K,
    GgmlType::F16,
    GgmlType::Bf16,
    GgmlType::F32,
];

/// The type an embedding table of file type `t` is gathered from.
pub fn table_type(t: GgmlType) -> GgmlType {
    if EMBED_TYPES.contains(&t) {
        t
    } else {
        GgmlType::Q8_0
    }
}

/// The router types `moe_route` reads as GGUF stores them; any other is
/// converted to Q8_0 at load.
pub const ROUTER_TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Bf16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
];

/// The device type of a router stored as `t`.
pub fn router_type(t: GgmlType) -> GgmlType {
    if ROUTER_TYPES.contains(&t) {
        t
    } else {
        GgmlType::Q8_0
    }
}

/// The type the tied head's own copy is uploaded in: the planned head type
/// (`ProjLayouts::head_type`), else `device_type` of the table's file type
/// `file`. The head's launches were planned for this type, so the upload
/// must not decide another.
pub fn head_copy_type(lay: &ProjLayouts, file: GgmlType) -> WType {
    lay.head_type.unwrap_or_else(|| device_type(&[file]))
}

/// Bytes of `n` rows of `k` elements of type `t` as GGUF stores them.
pub fn gguf_bytes(t: GgmlType, n: usize, k: usize) -> u64 {
    (n * (k / t.block_size()) * t.type_size()) as u64
}
