//! The family registry, and the public paths of the family types (which
//! live in `kernel_family`, `problem`, `device` and `verdict`, modules that
//! do not depend on the families themselves).

pub use crate::device::{DeviceLimits, LaunchGeometry, LaunchSequence};
pub use crate::kernel_family::Family;
pub use crate::problem::{
    attn_of, moe_of, rows_of, wtype_define, AttnProblem, KvType, MatmulProblem, MoeProblem,
    Problem, ProblemKind, RowsProblem, WType,
};
pub use crate::verdict::Contract;

/// Every registered family.
pub fn families() -> Vec<&'static dyn Family> {
    vec![
        &crate::families::quantize_q8_1::QuantizeQ81,
        &crate::families::gemv::Gemv,
        &crate::families::mmq::Mmq,
        &crate::families::gemm_dq::GemmDq,
        &crate::families::gemm_wgmma::GemmWgmma,
        &crate::families::act_convert::ActConvert,
        &crate::families::scale_expand::ScaleExpand,
        &crate::families::rmsnorm::RmsNorm,
        &crate::families::qk_norm_rope::QkNormRope,
        &crate::families::gelu_mul::GeluMul,
        &crate::families::embed::Embed,
        &crate::families::ple::Ple,
        &crate::families::softcap::Softcap,
        &crate::families::attn_prefill::AttnPrefill,
        &crate::families::attn_decode::AttnDecode,
        &crate::families::moe_route::MoeRoute,
        &crate::families::moe_gemv::MoeGemv,
        &crate::families::moe_gemm::MoeGemm,
    ]
}

/// A family by name.
pub fn family(name: &str) -> Option<&'static dyn Family> {
    families().into_iter().find(|f| f.name() == name)
}
