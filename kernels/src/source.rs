//! The embedded CUDA source table.
//!
//! Every `.cu`/`.cuh` under `kernels/cuda/` is compiled into the binary with
//! `include_str!`, so the engine runs exactly the bytes the harness measured
//! and nothing is read from disk at run time. `#include "x.cuh"` lines are
//! resolved from this table before NVRTC sees the text, so NVRTC needs no
//! include path and no CUDA headers at all.

use std::collections::BTreeSet;

/// (file name, contents) of every embedded source.
pub const SOURCES: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../cuda/common.cuh")),
    ("q8_split.cuh", include_str!("../cuda/q8_split.cuh")),
    ("quantize_q8_1.cu", include_str!("../cuda/quantize_q8_1.cu")),
    ("kquant.cuh", include_str!("../cuda/kquant.cuh")),
    ("gemv_chunk.cuh", include_str!("../cuda/gemv_chunk.cuh")),
    ("gemv.cu", include_str!("../cuda/gemv.cu")),
    ("moe_route.cu", include_str!("../cuda/moe_route.cu")),
    ("moe_gemv.cu", include_str!("../cuda/moe_gemv.cu")),
    ("moe_gemm.cu", include_str!("../cuda/moe_gemm.cu")),
    ("stage_copy.cuh", include_str!("../cuda/stage_copy.cuh")),
    ("mmq.cu", include_str!("../cuda/mmq.cu")),
    ("dq_convert.cuh", include_str!("../cuda/dq_convert.cuh")),
    ("wgmma.cuh", include_str!("../cuda/wgmma.cuh")),
    ("dq_ktypes.cuh", include_str!("../cuda/dq_ktypes.cuh")),
    ("gemm_dq.cu", include_str!("../cuda/gemm_dq.cu")),
    ("gemm_wgmma.cu", include_str!("../cuda/gemm_wgmma.cu")),
    ("stream.cu", include_str!("../cuda/stream.cu")),
    ("act_convert.cu", include_str!("../cuda/act_convert.cu")),
    ("scale_expand.cu", include_str!("../cuda/scale_expand.cu")),
    ("act_out.cuh", include_str!("../cuda/act_out.cuh")),
    (
        "sandwich_tail.cuh",
        include_str!("../cuda/sandwich_tail.cuh"),
    ),
    ("gather.cuh", include_str!("../cuda/gather.cuh")),
    ("rmsnorm.cu", include_str!("../cuda/rmsnorm.cu")),
    ("qk_norm_rope.cu", include_str!("../cuda/qk_norm_rope.cu")),
    ("gelu_mul.cu", include_str!("../cuda/gelu_mul.cu")),
    ("embed.cu", include_str!("../cuda/embed.cu")),
    ("ple.cu", include_str!("../cuda/ple.cu")),
    ("softcap.cu", include_str!("../cuda/softcap.cu")),
    ("attn_operand.cuh", include_str!("../cuda/attn_operand.cuh")),
    ("attn_core.cuh", include_str!("../cuda/attn_core.cuh")),
    ("attn_scalar.cuh", include_str!("../cuda/attn_scalar.cuh")),
    ("attn_wgmma.cuh", include_str!("../cuda/attn_wgmma.cuh")),
    ("attn_split.cuh", include_str!("../cuda/attn_split.cuh")),
    ("attn_stream.cuh", include_str!("../cuda/attn_stream.cuh")),
    (
        "attn_keymajor.cuh",
        include_str!("../cuda/attn_keymajor.cuh"),
    ),
    ("attn_prefill.cu", include_str!("../cuda/attn_prefill.cu")),
    ("attn_decode.cu", include_str!("../cuda/attn_decode.cu")),
];

/// The text of an embedded file, or `None` if no such file is embedded.
pub fn source(name: &str) -> Option<&'static str> {
    SOURCES.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// Inlines `#include "name"` lines from the embedded table (recursively, each
/// file once). Angle-bracket includes are refused: the sources are
/// header-free by contract.
pub fn resolve(name: &str) -> Result<String, String> {
    let mut seen = BTreeSet::new();
    let mut out = String::new();
    resolve_into(name, &mut seen, &mut out, 0)?;
    Ok(out)
}

fn resolve_into(
    name: &str,
    seen: &mut BTreeSet<String>,
    out: &mut String,
    depth: usize,
) -> Result<(), String> {
    if depth > 8 {
        return Err(format!("{name}: includes nested deeper than 8"));
    }
    if !seen.insert(name.to_string()) {
        return Ok(());
    }
    let text = source(name).ok_or_else(|| format!("{name}: no such embedded source"))?;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("#include") {
            let rest = rest.trim();
            if let Some(inc) = rest.strip_prefix('"').and_then(|r| r.split('"').next()) {
                out.push_str(&format!("// ---- begin {inc} (embedded) ----\n"));
                resolve_into(inc, seen, out, depth + 1)?;
                out.push_str(&format!(
                    "// ---- end {inc} ----\n#line {} \"{name}\"\n",
                    i + 2
                ));
                continue;
            }
            return Err(format!(
                "{name}:{}: only #include \"embedded.cuh\" is allowed (header-free sources)",
                i + 1
            ));
        }
        out.push_str(line);
        out.push('\n');
    }
    Ok(())
}

/// The names in the `Defines:` block of a source's header comment. The block
/// starts at a line whose text (after the comment leader) is `Defines:` and
/// holds one `NAME  description` item per line, each starting with an
/// upper-case identifier; it ends at the first blank comment line or at the
/// end of the comment.
pub fn header_defines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_block = false;
    for line in text.lines() {
        let t = line.trim();
        if !(t.starts_with("//") || t.starts_with('*') || t.starts_with("/*")) {
            if in_block {
                break;
            }
            continue;
        }
        let body = t
            .trim_start_matches("/*")
            .trim_start_matches("//")
            .trim_start_matches('*')
            .trim();
        if !in_block {
            if body == "Defines:" {
                in_block = true;
            }
            continue;
        }
        if body.is_empty() || body.starts_with("*/") {
            break;
        }
        let ident: String = body
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !ident.is_empty() && ident.chars().next().is_some_and(|c| c.is_ascii_uppercase()) {
            out.push(ident);
        }
        // Continuation lines (starting lower-case or with punctuation) describe
        // the previous item and are skipped.
    }
    out
}

/// The macros a source guards with `#ifndef X` immediately followed by an
/// `#error` line: the ones it requires from the caller.
pub fn required_macros(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let mut out = Vec::new();
    for w in lines.windows(2) {
        if let Some(name) = w[0].strip_prefix("#ifndef") {
            if w[1].starts_with("#error") {
                out.push(name.trim().to_string());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_block_parsing() {
        let text = "// gemv: y = W x\n//\n// Defines:\n//   BM   rows per block\n//        (continued)\n//   WTYPE  Q8_0 | Q4_0\n//\n// other\n";
        assert_eq!(header_defines(text), vec!["BM", "WTYPE"]);
        let src = "#ifndef BM\n#error \"BM\"\n#endif\n#ifndef HELPER\n#define HELPER 1\n#endif\n";
        assert_eq!(required_macros(src), vec!["BM"]);
    }

    #[test]
    fn includes_resolve_from_the_table() {
        let s = resolve("gemv.cu").unwrap();
        assert!(s.contains("begin common.cuh"));
        assert!(!s.contains("#include"));
    }
}
