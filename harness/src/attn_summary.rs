//! The attention part of a tune summary: the reference figures measured on
//! the H100 for the same shapes (`docs/anchors.md` §3.1: cuDNN,
//! FlashAttention-2 and FlexAttention through PyTorch), and the windowed
//! kernel's time against its ideal share of the same variant's full causal
//! time (the band's query-key pairs over the triangle's).
//!
//! Both come from `TuneRow`s alone: the problem string names the heads, head
//! dim, window and query range, and `ops_per_call` counts the visible pairs.

use crate::results::TuneRow;
use std::fmt::Write as _;

/// An attention problem as a tune row names it
/// (`attn heads=8/2 hd=256 window=512 q=0..4096 cap=4096 kv=F16`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub window: usize,
    pub q_pos0: usize,
    pub q_end: usize,
    pub capacity: usize,
}

impl AttnShape {
    pub fn parse(problem: &str) -> Option<AttnShape> {
        let mut it = problem.split_whitespace();
        if it.next()? != "attn" {
            return None;
        }
        let mut s = AttnShape {
            heads: 0,
            kv_heads: 0,
            head_dim: 0,
            window: 0,
            q_pos0: 0,
            q_end: 0,
            capacity: 0,
        };
        for kv in it {
            let (k, v) = kv.split_once('=')?;
            match k {
                "heads" => {
                    let (h, g) = v.split_once('/')?;
                    s.heads = h.parse().ok()?;
                    s.kv_heads = g.parse().ok()?;
                }
                "hd" => s.head_dim = v.parse().ok()?,
                "window" => s.window = v.parse().ok()?,
                "q" => {
                    let (a, b) = v.split_once("..")?;
                    s.q_pos0 = a.parse().ok()?;
                    s.q_end = b.parse().ok()?;
                }
                "cap" => s.capacity = v.parse().ok()?,
                _ => {}
            }
        }
        (s.heads > 0 && s.head_dim > 0 && s.q_end > s.q_pos0).then_some(s)
    }
    pub fn n_q(&self) -> usize {
        self.q_end - self.q_pos0
    }
}

/// A reference figure measured on the H100 for one prefill shape.
pub struct AttnAnchor {
    pub head_dim: usize,
    pub window: usize,
    pub n_q: usize,
    /// The fastest reference, as TFLOP/s of visible pairs or as a time.
    pub figure: AnchorFigure,
    pub text: &'static str,
}

pub enum AnchorFigure {
    TflopS(f64),
    Micros(f64),
}

/// `docs/anchors.md` §3.1 (torch 2.11 on the same H100; prefill from
/// position 0, f16).
pub const ATTN_ANCHORS: &[AttnAnchor] = &[
    AttnAnchor {
        head_dim: 256,
        window: 0,
        n_q: 4096,
        figure: AnchorFigure::TflopS(376.0),
        text: "cuDNN 376 TFLOP/s, FlashAttention-2 191, FlexAttention 192",
    },
    AttnAnchor {
        head_dim: 256,
        window: 512,
        n_q: 4096,
        figure: AnchorFigure::Micros(179.0),
        text: "FlexAttention 179 us",
    },
    AttnAnchor {
        head_dim: 512,
        window: 0,
        n_q: 4096,
        figure: AnchorFigure::TflopS(93.0),
        text: "cuDNN (memory-efficient SDPA) 93 TFLOP/s; FlashAttention-2 and FlexAttention cannot run it",
    },
];

fn prefill_rows(rows: &[TuneRow]) -> Vec<(&TuneRow, AttnShape)> {
    rows.iter()
        .filter(|r| r.family == "attn_prefill" && !r.is_reference() && r.is_timed())
        .filter_map(|r| AttnShape::parse(&r.problem).map(|s| (r, s)))
        .collect()
}

/// Appends the anchor and window tables when the run timed `attn_prefill`
/// at shapes they apply to, and the launch-floor table for `attn_decode`;
/// nothing otherwise.
pub fn section(s: &mut String, rows: &[TuneRow]) {
    let pre = prefill_rows(rows);
    if !pre.is_empty() {
        anchors_table(s, &pre);
        window_table(s, &pre);
    }
    decode_floor_table(s, rows);
}

/// Kernel launches of one decode call: the split kernel and its combine on
/// tensor cores (every ALGO but 0), the scalar kernel alone.
fn decode_launches(defines: &str) -> usize {
    let algo = defines
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("ALGO="))
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(1);
    if algo == 0 {
        1
    } else {
        2
    }
}

/// Each decode shape's fastest variant against the launch-latency floor of
/// its launches (the device's measured empty-launch time per launch).
fn decode_floor_table(s: &mut String, rows: &[TuneRow]) {
    let mut keys: Vec<(String, String)> = rows
        .iter()
        .filter(|r| r.family == "attn_decode" && !r.is_reference() && r.is_timed())
        .map(|r| (r.shape.clone(), r.regime.clone()))
        .collect();
    keys.sort();
    keys.dedup();
    let mut lines = Vec::new();
    for (shape, regime) in &keys {
        let Some(b) = rows
            .iter()
            .filter(|r| {
                r.family == "attn_decode"
                    && !r.is_reference()
                    && r.is_timed()
                    && &r.shape == shape
                    && &r.regime == regime
            })
            .min_by(|a, b| a.median_us.total_cmp(&b.median_us))
        else {
            continue;
        };
        if b.launch_floor_us <= 0.0 {
            continue;
        }
        let n = decode_launches(&b.defines);
        let floor = n as f64 * b.launch_floor_us;
        lines.push(format!(
            "| {shape} | {regime} | `{}` | {:.2} | {n} | {:.2} | {:.2}x | {:.1} |",
            b.variant,
            b.median_us,
            floor,
            b.median_us / floor,
            100.0 * b.gbps / b.hbm_gbps.max(1e-9)
        ));
    }
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "## attn_decode against the launch floor and HBM

The fastest variant per shape; `floor` is its launches per call times the device's measured launch floor (an empty kernel enqueued back to back), `% HBM` its KV and activation bytes per second over the measured HBM read rate.

| shape | regime | best | median us | launches | floor us | over floor | % HBM |
|---|---|---|---:|---:|---:|---:|---:|"
    );
    for l in lines {
        let _ = writeln!(s, "{l}");
    }
    let _ = writeln!(s);
}

fn best_at<'a>(
    rows: &[(&'a TuneRow, AttnShape)],
    shape: &str,
    regime: &str,
) -> Option<&'a TuneRow> {
    rows.iter()
        .filter(|(r, _)| r.shape == shape && r.regime == regime)
        .map(|(r, _)| *r)
        .min_by(|a, b| a.median_us.total_cmp(&b.median_us))
}

fn anchors_table(s: &mut String, rows: &[(&TuneRow, AttnShape)]) {
    let mut keys: Vec<(String, String, AttnShape)> = rows
        .iter()
        .map(|(r, a)| (r.shape.clone(), r.regime.clone(), *a))
        .collect();
    keys.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    keys.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
    let mut lines = Vec::new();
    for (shape, regime, a) in &keys {
        let Some(anchor) = ATTN_ANCHORS.iter().find(|x| {
            x.head_dim == a.head_dim && x.window == a.window && x.n_q == a.n_q() && a.q_pos0 == 0
        }) else {
            continue;
        };
        let Some(b) = best_at(rows, shape, regime) else {
            continue;
        };
        let vs = match anchor.figure {
            AnchorFigure::TflopS(t) => format!("{:.2}x", b.tops / t),
            AnchorFigure::Micros(us) => format!("{:.2}x", us / b.median_us),
        };
        lines.push(format!(
            "| {shape} | {regime} | `{}` | {:.2} | {:.1} | {} | {vs} |",
            b.variant, b.median_us, b.tops, anchor.text
        ));
    }
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "## attn_prefill against the reference kernels\n\nReference figures measured on this H100 model with PyTorch 2.11 (docs/anchors.md §3.1), labelled, not re-run here; `speed` is our rate over the fastest reference's (time ratio for a time).\n\n| shape | regime | best | median us | TFLOP/s | reference (H100) | speed |\n|---|---|---|---:|---:|---|---:|"
    );
    for l in lines {
        let _ = writeln!(s, "{l}");
    }
    let _ = writeln!(s);
}

fn window_table(s: &mut String, rows: &[(&TuneRow, AttnShape)]) {
    let mut lines = Vec::new();
    let mut windowed: Vec<(String, String)> = rows
        .iter()
        .filter(|(_, a)| a.window > 0)
        .map(|(r, _)| (r.shape.clone(), r.regime.clone()))
        .collect();
    windowed.sort();
    windowed.dedup();
    for (shape, regime) in &windowed {
        let Some(w) = best_at(rows, shape, regime) else {
            continue;
        };
        let Some(wa) = AttnShape::parse(&w.problem) else {
            continue;
        };
        // The same variant on the causal problem of the same heads and queries.
        let causal = rows.iter().find(|(r, a)| {
            r.variant == w.variant
                && r.regime == *regime
                && a.window == 0
                && AttnShape {
                    window: wa.window,
                    ..*a
                } == wa
        });
        let Some((c, _)) = causal else {
            continue;
        };
        if c.ops_per_call == 0 {
            continue;
        }
        let share = w.ops_per_call as f64 / c.ops_per_call as f64;
        let ideal = c.median_us * share;
        lines.push(format!(
            "| {shape} | {} | {regime} | `{}` | {:.2} | {:.2} | {:.4} | {:.2} | {:.2}x |",
            c.shape,
            w.variant,
            w.median_us,
            c.median_us,
            share,
            ideal,
            w.median_us / ideal
        ));
    }
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "## Sliding window against its ideal share\n\nThe fastest windowed variant's time over the same variant's full causal time scaled by the band's share of the triangle's query-key pairs (1.00x: the window costs exactly its pairs; tile granularity, masked boundary tiles and per-CTA costs that do not shrink with the band push it up).\n\n| windowed shape | causal shape | regime | variant | windowed us | causal us | pair share | ideal us | ratio |\n|---|---|---|---|---:|---:|---:|---:|---:|"
    );
    for l in lines {
        let _ = writeln!(s, "{l}");
    }
    let _ = writeln!(s);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(shape: &str, variant: &str, problem: &str, us: f64, ops: u64) -> TuneRow {
        TuneRow {
            kind: "variant".into(),
            family: "attn_prefill".into(),
            variant: variant.into(),
            shape: shape.into(),
            problem: problem.into(),
            regime: "l2".into(),
            verdict: "timed".into(),
            median_us: us,
            ops_per_call: ops,
            tops: ops as f64 / us / 1e6,
            ..TuneRow::default()
        }
    }

    #[test]
    fn parses_the_problem_string() {
        let a = AttnShape::parse("attn heads=8/2 hd=256 window=512 q=0..4096 cap=4096 kv=F16")
            .expect("parse");
        assert_eq!((a.heads, a.kv_heads, a.head_dim), (8, 2, 256));
        assert_eq!(
            (a.window, a.q_pos0, a.n_q(), a.capacity),
            (512, 0, 4096, 4096)
        );
        assert!(AttnShape::parse("matmul m=1 n=2 k=3").is_none());
        assert!(AttnShape::parse("attn heads=8 hd=256").is_none());
    }

    #[test]
    fn window_ratio_uses_the_same_variant_and_the_pair_share() {
        let causal = "attn heads=8/2 hd=256 window=0 q=0..4096 cap=4096 kv=F16";
        let band = "attn heads=8/2 hd=256 window=512 q=0..4096 cap=4096 kv=F16";
        let rows = vec![
            row("c", "a", causal, 100.0, 8_000),
            row("w", "a", band, 60.0, 2_000),
            row("c", "b", causal, 50.0, 8_000),
            row("w", "b", band, 70.0, 2_000),
        ];
        let mut s = String::new();
        section(&mut s, &rows);
        // The fastest windowed variant is `a`: 60 / (100 * 0.25) = 2.40.
        assert!(
            s.contains("| w | c | l2 | `a` | 60.00 | 100.00 | 0.2500 | 25.00 | 2.40x |"),
            "{s}"
        );
        // Both shapes match an anchor: the causal one by TFLOP/s (0.16 / 376),
        // the window by time (179 / 60).
        assert!(s.contains("FlexAttention 179 us | 2.98x |"), "{s}");
        assert!(s.contains("cuDNN 376 TFLOP/s"), "{s}");
    }

    #[test]
    fn decode_rows_are_set_against_their_launches() {
        let mut r = row(
            "e4b.dec_w512@m=1",
            "stream",
            "attn heads=8/2 hd=256 window=512 q=16376..16377 cap=2559 kv=F16",
            10.0,
            1,
        );
        r.family = "attn_decode".into();
        r.defines = "ALGO=2 BKV=32".into();
        r.launch_floor_us = 2.5;
        r.gbps = 100.0;
        r.hbm_gbps = 3000.0;
        let mut scalar = r.clone();
        scalar.variant = "baseline".into();
        scalar.defines = "ALGO=0".into();
        scalar.median_us = 400.0;
        let mut s = String::new();
        section(&mut s, &[r, scalar]);
        // Two launches (split kernel + combine): floor 5 us, 2.00x.
        assert!(
            s.contains("| `stream` | 10.00 | 2 | 5.00 | 2.00x | 3.3 |"),
            "{s}"
        );
        assert_eq!(decode_launches("ALGO=0 X=1"), 1);
        assert_eq!(decode_launches("ALGO=1"), 2);
    }

    #[test]
    fn nothing_without_attention_rows() {
        let mut r = row("x", "a", "matmul", 1.0, 1);
        r.family = "gemv".into();
        let mut s = String::new();
        section(&mut s, &[r]);
        assert!(s.is_empty());
    }
}
