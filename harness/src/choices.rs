//! The kernel choices of a profile (and tuned table) for one model, checked
//! without a GPU: every launch the CUDA forward would make for the model is
//! resolved through the same planner the CUDA engine uses, on the nominal
//! limits of sm_90, sm_89 and sm_80. The CPU backend runs this so that a
//! profile the CUDA engine would refuse (a define value no variant has, a
//! choice with no runnable fallback) is refused on every backend, not only
//! where a GPU reads it.
//!
//! A profile passes when it resolves on at least one of those devices: a
//! Hopper-only choice without a fallback is a profile for Hopper, not an
//! error. The tuned table is given to the planner of its own architecture.
//! A model that the committed `main` profile cannot serve either is outside
//! what the CUDA kernels run at all; the CPU engine runs it anyway, so the
//! check then refuses nothing.

use gemtune_engine::cuda::forward_plan::{ForwardPlan, Sizing};

use gemtune_engine::cuda::model_dims::ModelDims;
use gemtune_engine::cuda::{PlanError, Planner};
use gemtune_engine::model::Model;
use gemtune_engine::profile::Profile;
use gemtune_engine::tuned::TunedFile;
use gemtune_kernels::compile::Arch;
use gemtune_kernels::family::{DeviceLimits, KvType};

/// The devices a profile is checked for, most capable first.
const ARCHS: [u32; 3] = [90, 89, 80];

/// Refuses `profile` (with `tuned`) for `model` at `max_seq` positions and
/// prefill chunks of `ubatch` tokens when no checked device can serve
/// every slot; the message names the entry's `FILE:LINE`.
pub fn check(
    model: &Model,
    profile: &Profile,
    tuned: Option<&TunedFile>,
    max_seq: usize,
    ubatch: usize,
) -> anyhow::Result<()> {
    let cfg = model.config();
    let kv = match &profile.kv_type {
        None => KvType::F16,
        Some(s) => KvType::from_name(s).ok_or_else(|| {
            anyhow::anyhow!("{}: kv_type '{s}' is not F16, BF16 or F32", profile.source)
        })?,
    };
    let max_seq = max_seq.clamp(1, cfg.context_length.max(1));
    let ubatch = ubatch.clamp(1, max_seq);
    let refusals = match serve(model, profile, tuned, kv, max_seq, ubatch) {
        Ok(()) => return Ok(()),
        Err(r) => r,
    };
    let reference = Profile::load("main")?;
    if serve(model, &reference, None, KvType::F16, max_seq, ubatch).is_err() {
        return Ok(());
    }
    anyhow::bail!(
        "profile {} cannot serve this model on any of sm_90, sm_89, sm_80:\n  {}",
        profile.name,
        refusals.join("\n  ")
    )
}

/// `Ok` when some checked device serves every launch of `profile`, else
/// each device's first refusal.
fn serve(
    model: &Model,
    profile: &Profile,
    tuned: Option<&TunedFile>,
    kv: KvType,
    max_seq: usize,
    ubatch: usize,
) -> Result<(), Vec<String>> {
    let Some(first) = model.weights().layers.first() else {
        return Ok(());
    };
    let matrix = first.ffn_up.ty.name().to_ascii_uppercase();
    let sizing = Sizing {
        max_seq,
        ubatch,
        kv_type: kv,
    };
    let mut refusals = Vec::new();
    for arch in ARCHS.map(Arch) {
        let table = tuned.filter(|t| t.arch == arch.to_string()).cloned();
        let planner = Planner::new(profile.clone(), table, DeviceLimits::for_arch(arch));
        let dims = ModelDims::of_model(model, &planner);
        // The same resolution the CUDA engine does at load: every launch of
        // every row bucket.
        match ForwardPlan::resolve(&planner, model.config(), &dims, sizing) {
            Ok(_) => return Ok(()),
            Err(e) => {
                let origin = match &e {
                    PlanError::Slot { slot, .. } | PlanError::Gpu { slot, .. } => {
                        planner.profile.origin_of(slot, Some(&matrix))
                    }
                    PlanError::Unsupported(_) => "the model",
                };
                refusals.push(format!("{arch}: {origin}: {e}"));
            }
        }
    }
    Err(refusals)
}
