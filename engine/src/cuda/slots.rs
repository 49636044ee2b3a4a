//! The names the CUDA engine plans and measures by, as types: the slots a
//! profile fills (`Slot`), the projections (`Proj`), and the phases of
//! `--profile-phases` (`Phase`). A leaf module: it imports nothing of the
//! engine, and every other module takes its names from here.

use crate::config::AttnKind;

/// Token counts served by the decode GEMV slots (`gemv.*`); more go to the
/// prefill GEMM slots (`gemm.*`). Also the most rows the head runs at once.
pub const GEMV_MAX_ROWS: usize = 8;

/// A projection (matrix multiply) of the forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proj {
    /// Q | K | V, fused.
    Qkv,
    /// The attention output projection.
    O,
    /// FFN gate | up, fused.
    GateUp,
    /// FFN down.
    Down,
    /// The per-layer-embedding projections (model projection, gate, proj).
    Ple,
    /// The tied output head.
    Head,
}

impl Proj {
    pub const ALL: [Proj; 6] = [
        Proj::Qkv,
        Proj::O,
        Proj::GateUp,
        Proj::Down,
        Proj::Ple,
        Proj::Head,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Proj::Qkv => "qkv",
            Proj::O => "o",
            Proj::GateUp => "gate_up",
            Proj::Down => "down",
            Proj::Ple => "ple",
            Proj::Head => "head",
        }
    }
    /// The phase its GEMMs are charged to.
    pub fn phase(self) -> Phase {
        match self {
            Proj::Qkv => Phase::GemmQkv,
            Proj::O => Phase::GemmO,
            Proj::GateUp => Phase::GemmGateUp,
            Proj::Down => Phase::GemmDown,
            Proj::Ple => Phase::GemmPle,
            Proj::Head => Phase::Head,
        }
    }
}

/// An engine slot: one place in the forward pass that a profile fills with
/// a kernel family variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Slot {
    /// A prefill projection (more than `GEMV_MAX_ROWS` rows).
    Gemm(Proj),
    /// A decode projection (at most `GEMV_MAX_ROWS` rows); the head always.
    Gemv(Proj),
    AttnPrefill(AttnKind),
    AttnDecode(AttnKind),
    RmsNorm,
    QkNormRope,
    GeluMul,
    Embed,
    Ple,
    Softcap,
    QuantizeQ8_1,
    ActConvert,
    /// The prefill GEMMs' scale plane written from the GEMV's before each
    /// GEMM (profiles with `gemm_scales = "expand"`).
    ScaleExpand,
    /// The MoE router: logits, top-k and routing weights (26B-A4B).
    MoeRoute,
    /// The chosen experts' `gelu(gate x) * up x` (decode groups of rows).
    MoeGateUp,
    /// The chosen experts' down projections, weighted and summed per row.
    MoeDown,
    /// A prefill chunk's experts as grouped GEMMs (sort by expert,
    /// gate|up, down, weighted sum); a profile serving it with `moe_gemv`
    /// runs the chunk as groups of 8 rows on the two slots above.
    MoeGemm,
    /// The grouped GEMMs' DOWN stage, when its tile's warps are laid out
    /// apart from the other stages' (the row tile BM must match: GROUP's
    /// tile table is cut to it).
    MoeGemmDown,
}

impl Slot {
    /// Every slot, in the order `run -v` and the profile docs list them.
    pub const ALL: [Slot; 26] = [
        Slot::Gemm(Proj::Qkv),
        Slot::Gemm(Proj::O),
        Slot::Gemm(Proj::GateUp),
        Slot::Gemm(Proj::Down),
        Slot::Gemm(Proj::Ple),
        Slot::Gemv(Proj::Qkv),
        Slot::Gemv(Proj::O),
        Slot::Gemv(Proj::GateUp),
        Slot::Gemv(Proj::Down),
        Slot::Gemv(Proj::Ple),
        Slot::Gemv(Proj::Head),
        Slot::AttnPrefill(AttnKind::Sliding),
        Slot::AttnPrefill(AttnKind::Full),
        Slot::AttnDecode(AttnKind::Sliding),
        Slot::AttnDecode(AttnKind::Full),
        Slot::RmsNorm,
        Slot::QkNormRope,
        Slot::GeluMul,
        Slot::Embed,
        Slot::Ple,
        Slot::Softcap,
        Slot::MoeRoute,
        Slot::MoeGateUp,
        Slot::MoeDown,
        Slot::MoeGemm,
        Slot::MoeGemmDown,
    ];
    /// Slots not in `ALL` order above but served too: the pre-passes.
    pub const PREPASSES: [Slot; 3] = [Slot::QuantizeQ8_1, Slot::ActConvert, Slot::ScaleExpand];

    /// The slot serving projection `p` at `rows` rows (the head is a GEMV
    /// slot at every row count: it runs at most `GEMV_MAX_ROWS` at once).
    pub fn matmul(p: Proj, rows: usize) -> Slot {
        if p == Proj::Head || rows <= GEMV_MAX_ROWS {
            Slot::Gemv(p)
        } else {
            Slot::Gemm(p)
        }
    }

    /// The attention slot of a layer kind at `rows` query rows.
    pub fn attention(kind: AttnKind, rows: usize) -> Slot {
        if rows <= GEMV_MAX_ROWS {
            Slot::AttnDecode(kind)
        } else {
            Slot::AttnPrefill(kind)
        }
    }

    /// The name profiles use (`gemm.qkv`, `attn_decode.swa`, `rmsnorm`).
    pub fn name(self) -> &'static str {
        use AttnKind::{Full, Sliding};
        match self {
            Slot::Gemm(Proj::Qkv) => "gemm.qkv",
            Slot::Gemm(Proj::O) => "gemm.o",
            Slot::Gemm(Proj::GateUp) => "gemm.gate_up",
            Slot::Gemm(Proj::Down) => "gemm.down",
            Slot::Gemm(Proj::Ple) => "gemm.ple",
            Slot::Gemm(Proj::Head) => "gemm.head",
            Slot::Gemv(Proj::Qkv) => "gemv.qkv",
            Slot::Gemv(Proj::O) => "gemv.o",
            Slot::Gemv(Proj::GateUp) => "gemv.gate_up",
            Slot::Gemv(Proj::Down) => "gemv.down",
            Slot::Gemv(Proj::Ple) => "gemv.ple",
            Slot::Gemv(Proj::Head) => "gemv.head",
            Slot::AttnPrefill(Sliding) => "attn_prefill.swa",
            Slot::AttnPrefill(Full) => "attn_prefill.full",
            Slot::AttnDecode(Sliding) => "attn_decode.swa",
            Slot::AttnDecode(Full) => "attn_decode.full",
            Slot::RmsNorm => "rmsnorm",
            Slot::QkNormRope => "qk_norm_rope",
            Slot::GeluMul => "gelu_mul",
            Slot::Embed => "embed",
            Slot::Ple => "ple",
            Slot::Softcap => "softcap",
            Slot::QuantizeQ8_1 => "quantize_q8_1",
            Slot::ActConvert => "act_convert",
            Slot::ScaleExpand => "scale_expand",
            Slot::MoeRoute => "moe_route",
            Slot::MoeGateUp => "moe_gemv.gate_up",
            Slot::MoeDown => "moe_gemv.down",
            Slot::MoeGemm => "moe_gemm",
            Slot::MoeGemmDown => "moe_gemm.down",
        }
    }

    /// What the slot computes (the profile docs and error messages).
    pub fn description(self) -> &'static str {
        use AttnKind::{Full, Sliding};
        match self {
            Slot::Gemm(Proj::Qkv) => "prefill Q/K/V projection (fused when the types agree)",
            Slot::Gemm(Proj::O) => "prefill attention output projection",
            Slot::Gemm(Proj::GateUp) => "prefill FFN gate and up projections (fused)",
            Slot::Gemm(Proj::Down) => "prefill FFN down projection",
            Slot::Gemm(Proj::Ple) => {
                "prefill per-layer-embedding projections (model_proj, inp_gate, proj)"
            }
            Slot::Gemm(Proj::Head) => "the head runs as a GEMV slot (gemv.head)",
            Slot::Gemv(Proj::Qkv) => "decode Q/K/V projection",
            Slot::Gemv(Proj::O) => "decode attention output projection",
            Slot::Gemv(Proj::GateUp) => "decode FFN gate and up projections",
            Slot::Gemv(Proj::Down) => "decode FFN down projection",
            Slot::Gemv(Proj::Ple) => "decode per-layer-embedding projections",
            Slot::Gemv(Proj::Head) => {
                "tied output head (vocab x d) for the rows whose logits are wanted"
            }
            Slot::AttnPrefill(Sliding) => "prefill attention on sliding-window layers",
            Slot::AttnPrefill(Full) => "prefill attention on full layers",
            Slot::AttnDecode(Sliding) => "decode attention on sliding-window layers",
            Slot::AttnDecode(Full) => "decode attention on full layers",
            Slot::RmsNorm => "sandwich norms, residual adds and layer scalars",
            Slot::QkNormRope => "per-head Q/K norms, RoPE, weightless V norm, cache write",
            Slot::GeluMul => "gelu_tanh(gate) * up (FFN and PLE gate)",
            Slot::Embed => "token embedding gather and scale",
            Slot::Ple => "per-layer inputs (E2B/E4B)",
            Slot::Softcap => "final logit softcap",
            Slot::QuantizeQ8_1 => "f32 -> Q8_1 planes or split Q8 records: the activation pre-pass of dp4a/mmq consumers",
            Slot::ActConvert => "f32 -> bf16 operands of the vendor (cuBLAS) GEMM arm",
            Slot::ScaleExpand => {
                "a quantized matrix's prefill GEMM scales from its decode GEMV scales (gemm_scales = \"expand\")"
            }
            Slot::MoeRoute => "MoE router: logits, top-k experts and their weights per row",
            Slot::MoeGateUp => "MoE: gelu(gate x) * up x of each row's chosen experts",
            Slot::MoeDown => "MoE: the chosen experts' down projections, weighted and summed",
            Slot::MoeGemm => {
                "MoE prefill: the chunk's experts as grouped GEMMs (moe_gemv: groups of 8 rows)"
            }
            Slot::MoeGemmDown => "MoE prefill: the grouped GEMMs' down stage (the row tile of moe_gemm)",
        }
    }

    /// Every slot a profile must serve: `ALL` and the pre-passes.
    pub fn served() -> impl Iterator<Item = Slot> {
        Slot::ALL.into_iter().chain(Slot::PREPASSES)
    }

    /// The slot named `name`, if it is one a profile serves.
    pub fn from_name(name: &str) -> Option<Slot> {
        Slot::served().find(|s| s.name() == name)
    }

    /// The group a profile may fill for several slots at once (`gemm` for
    /// `gemm.down`; a slot without a dot is its own group).
    pub fn group(self) -> &'static str {
        let n = self.name();
        n.split('.').next().unwrap_or(n)
    }
}

impl std::fmt::Display for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A phase of `--profile-phases`: the GPU time between one mark and the
/// next is charged to the phase the first mark named.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    Embed,
    Ple,
    Norm,
    RopeKv,
    AttnSwa,
    AttnFull,
    GemmQkv,
    GemmO,
    GemmGateUp,
    GemmDown,
    GemmPle,
    ActConvert,
    ScaleExpand,
    Gelu,
    Head,
    /// Charged by callers that sample on the device (bench's tg rows).
    Sampling,
    /// MoE: the router (its input norm, logits, top-k, weights).
    MoeRoute,
    /// MoE: the chosen experts' gate and up projections with GELU.
    MoeGateUp,
    /// MoE: the chosen experts' down projections and their weighted sum.
    MoeDown,
    /// MoE prefill: the (row, expert) pairs sorted by expert.
    MoeGroup,
}

impl Phase {
    pub const ALL: [Phase; 20] = [
        Phase::Embed,
        Phase::Ple,
        Phase::Norm,
        Phase::RopeKv,
        Phase::AttnSwa,
        Phase::AttnFull,
        Phase::GemmQkv,
        Phase::GemmO,
        Phase::GemmGateUp,
        Phase::GemmDown,
        Phase::GemmPle,
        Phase::ActConvert,
        Phase::ScaleExpand,
        Phase::Gelu,
        Phase::Head,
        Phase::Sampling,
        Phase::MoeRoute,
        Phase::MoeGateUp,
        Phase::MoeDown,
        Phase::MoeGroup,
    ];
    /// The name tables and `ab` attribute time to.
    pub const fn name(self) -> &'static str {
        match self {
            Phase::Embed => "embed",
            Phase::Ple => "ple",
            Phase::Norm => "norm",
            Phase::RopeKv => "rope_kv",
            Phase::AttnSwa => "attn_swa",
            Phase::AttnFull => "attn_full",
            Phase::GemmQkv => "gemm_qkv",
            Phase::GemmO => "gemm_o",
            Phase::GemmGateUp => "gemm_gate_up",
            Phase::GemmDown => "gemm_down",
            Phase::GemmPle => "gemm_ple",
            Phase::ActConvert => "act_convert",
            Phase::ScaleExpand => "scale_expand",
            Phase::Gelu => "gelu",
            Phase::Head => "head",
            Phase::Sampling => "sampling",
            Phase::MoeRoute => "moe_route",
            Phase::MoeGateUp => "moe_gate_up",
            Phase::MoeDown => "moe_down",
            Phase::MoeGroup => "moe_group",
        }
    }
    /// The attention phase of a layer kind.
    pub fn attention(kind: AttnKind) -> Phase {
        match kind {
            AttnKind::Sliding => Phase::AttnSwa,
            AttnKind::Full => Phase::AttnFull,
        }
    }
}

/// The phase names, as tables and `ab` attribute them.
pub const PHASES: [&str; Phase::ALL.len()] = {
    let mut out = [""; Phase::ALL.len()];
    let mut i = 0;
    while i < Phase::ALL.len() {
        out[i] = Phase::ALL[i].name();
        i += 1;
    }
    out
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_names_round_trip_and_are_unique() {
        let mut seen = std::collections::BTreeSet::new();
        for s in Slot::served() {
            assert_eq!(Slot::from_name(s.name()), Some(s), "{s}");
            assert!(seen.insert(s.name()), "{s} twice");
        }
        assert_eq!(
            Slot::from_name("gemm.head"),
            None,
            "the head is a GEMV slot"
        );
        assert_eq!(Slot::from_name("gemmm"), None);
        assert_eq!(Slot::Gemm(Proj::Down).group(), "gemm");
        assert_eq!(Slot::RmsNorm.group(), "rmsnorm");
    }

    #[test]
    fn row_counts_pick_decode_or_prefill_slots() {
        assert_eq!(Slot::matmul(Proj::Qkv, 8), Slot::Gemv(Proj::Qkv));
        assert_eq!(Slot::matmul(Proj::Qkv, 9), Slot::Gemm(Proj::Qkv));
        assert_eq!(Slot::matmul(Proj::Head, 2048), Slot::Gemv(Proj::Head));
        assert_eq!(
            Slot::attention(AttnKind::Full, 1),
            Slot::AttnDecode(AttnKind::Full)
        );
        assert_eq!(
            Slot::attention(AttnKind::Sliding, 9),
            Slot::AttnPrefill(AttnKind::Sliding)
        );
        assert_eq!(PHASES[3], "rope_kv");
        assert_eq!(PHASES.len(), Phase::ALL.len());
    }
}
