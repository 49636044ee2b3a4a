//! Kernel choice: profile slot -> (family, defines) -> validated geometry.
//! The forward plan (`forward_plan`) asks this once per distinct launch at
//! load; nothing asks it afterwards (`lookups` counts, and a test holds the
//! engine to that).
//!
//! For a slot at a problem, in order:
//! 1. the profile's choice for the slot (or its group): family and defines,
//!    over the family's default defines, plus the defines bound to the call
//!    site (`WTYPE`, `KV_TYPE`, `OUT`);
//! 2. with `tuned = true` and a matmul problem, the device's tuned table
//!    entry for the family at (m bucket, n, k, weight type) replaces the
//!    defines, when it validates;
//! 3. `Family::validate` on the device's limits; if the device or the
//!    problem rules the choice out (a Hopper-only family on sm_80/sm_89, a
//!    GQA group larger than the tile), the slot's fallback chain in order;
//!    if none can run, an error naming the slot and every reason.
//!
//! Every decision is recorded with its reason (`run -v` prints them). The
//! engine never tunes: it reads the profile and the tuned table only.

use std::sync::atomic::{AtomicUsize, Ordering};

use gemtune_kernels::defines::{DefineValue, Defines};
use gemtune_kernels::family::{family, DeviceLimits, Family, LaunchGeometry, Problem};
use gemtune_kernels::gpu::GpuError;

use super::slots::Slot;
use crate::profile::{to_defines, Choice, Profile, BOUND_DEFINES};
use crate::tuned::TunedFile;

/// Rows per launch of a row-chunked GEMV slot.
pub const GEMV_BLOCK: usize = 8;

/// The profile family name of the vendor GEMM arm.
pub const VENDOR_BF16: &str = "cublas-bf16";

/// Where one decision came from, for `run -v`.
#[derive(Clone, Debug)]
pub struct Decision {
    pub slot: String,
    pub problem: String,
    pub family: String,
    pub defines: String,
    pub why: String,
}

/// A slot's choice at one problem: the family, its full defines, the
/// geometry `Family::validate` gave, and why it was chosen.
#[derive(Clone)]
pub struct Resolution {
    pub family: &'static dyn Family,
    pub defines: Defines,
    pub geo: LaunchGeometry,
    /// profile / tuned / fallback, with the detail.
    pub why: String,
}

/// Chooses the kernel variant of every slot from a profile, a tuned table
/// and the device's limits. It compiles nothing: `ForwardPlan::load` does.
pub struct Planner {
    pub profile: Profile,
    pub tuned: Option<TunedFile>,
    pub limits: DeviceLimits,
    lookups: AtomicUsize,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("slot {slot}: {msg}")]
    Slot { slot: String, msg: String },
    #[error("slot {slot}: {err}")]
    Gpu { slot: String, err: GpuError },
    /// A model feature the CUDA stages cannot run (the CPU engine can).
    #[error("{0} has no CUDA stages yet; the CPU engine runs it (--backend cpu)")]
    Unsupported(String),
}

impl PlanError {
    pub(super) fn slot(slot: Slot, msg: impl Into<String>) -> PlanError {
        PlanError::Slot {
            slot: slot.name().to_string(),
            msg: msg.into(),
        }
    }
}

impl Planner {
    pub fn new(profile: Profile, tuned: Option<TunedFile>, limits: DeviceLimits) -> Planner {
        Planner {
            profile,
            tuned,
            limits,
            lookups: AtomicUsize::new(0),
        }
    }

    /// How many times a slot was resolved so far (every `resolve` call).
    pub fn lookups(&self) -> usize {
        self.lookups.load(Ordering::Relaxed)
    }

    /// Whether `slot` is served by the vendor GEMM (cuBLAS bf16 on weights
    /// dequantized at load) rather than a kernel family.
    pub fn vendor(&self, slot: Slot) -> bool {
        self.profile
            .choice(slot.name())
            .map(|c| c.family == VENDOR_BF16)
            .unwrap_or(false)
    }

    /// Whether a prefill GEMM slot is served by the GEMV family, which the
    /// engine then launches on row blocks of at most 8 tokens (the `strict`
    /// profile's fp-contract prefill).
    pub fn row_chunked(&self, slot: Slot) -> bool {
        matches!(slot, Slot::Gemm(_))
            && self
                .profile
                .choice(slot.name())
                .map(|c| c.family == "gemv")
                .unwrap_or(false)
    }

    /// The family and defines serving `slot` at `p` (no GPU work: used by
    /// the CPU-side profile checks too).
    pub fn resolve(
        &self,
        slot: Slot,
        p: &Problem,
        bound: &[(&str, DefineValue)],
    ) -> Result<Resolution, PlanError> {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        let err = |msg: String| PlanError::slot(slot, msg);
        let slot = slot.name();
        // A weight-reading slot may have a `slot@WTYPE` entry: the matmuls'
        // weight type, the MoE kernels' (the router's for `moe_route`, the
        // expert stacks' for the expert kernels).
        let wt = match p {
            Problem::Matmul(mp) => Some(mp.wtype.name().to_ascii_uppercase()),
            Problem::Moe(e) => Some(e.wtype.name().to_ascii_uppercase()),
            _ => None,
        };
        let choice = self
            .profile
            .choice_for(slot, wt.as_deref())
            .map_err(|e| err(e.to_string()))?;
        let with_bound = |f: &dyn Family, d: &std::collections::BTreeMap<String, DefineValue>| {
            let wt = match p {
                Problem::Matmul(mp) => mp.wtype,
                Problem::Rows(r) => r.dtype,
                Problem::Attention(_) => gemtune_kernels::quant::GgmlType::F16,
                Problem::Moe(e) => e.wtype,
            };
            // A define the engine binds per call site is the site's: a
            // tuned entry's value (a sweep's winner over it, such as a
            // gemv TAIL) gives way to the family's default unless the site
            // binds it (profiles cannot set one).
            let mut out = f.default_defines(wt);
            out.extend(
                to_defines(d)
                    .into_iter()
                    .filter(|(k, _)| !BOUND_DEFINES.contains(&k.as_str())),
            );
            let declared = f.declared_defines();
            let mut all: Vec<(&str, DefineValue)> = bound.to_vec();
            if let Problem::Attention(a) = p {
                all.push(("KV_TYPE", DefineValue::Str(a.kv_type.name().into())));
                all.push(("HEAD_DIM", DefineValue::Int(a.head_dim as i64)));
            }
            for (k, v) in all {
                if declared.iter().any(|x| x == k) {
                    out.insert(k.to_string(), v);
                }
            }
            out
        };
        let fam = family(&choice.family).ok_or_else(|| {
            err(format!(
                "profile {} names family '{}', which is not registered",
                self.profile.name, choice.family
            ))
        })?;
        let mut defines = with_bound(fam, &choice.defines);
        let mut why = format!("profile {}", self.profile.name);
        if let Some(w) = &choice.why {
            why.push_str(&format!(" ({w})"));
        }
        if choice.tuned {
            if let (Some(t), Problem::Matmul(mp)) = (&self.tuned, p) {
                let wt = mp.wtype.name().to_ascii_uppercase();
                if let Some(e) = t.lookup(fam.name(), mp.m, mp.n, mp.k, &wt) {
                    // The entry's defines over the family's defaults (a
                    // define added after the table was written takes its
                    // default), then the ones bound at the call site.
                    let td = with_bound(fam, &e.defines);
                    if fam.validate(&td, p, &self.limits).is_ok() {
                        defines = td;
                        why = format!(
                            "tuned {} entry {} ({}, {})",
                            t.arch, e.shape, e.variant, e.provenance.measured
                        );
                    }
                }
            }
        }
        match fam.validate(&defines, p, &self.limits) {
            Ok(geo) => Ok(Resolution {
                family: fam,
                defines,
                geo,
                why,
            }),
            Err(reason) => {
                if choice.fallback.is_none() {
                    return Err(err(format!(
                        "{} cannot run here: {reason} (the profile names no fallback for this slot)",
                        fam.name()
                    )));
                }
                // The slot's fallback chain, in order; `Profile::load`
                // checked that every link exists and that the chain ends.
                let mut refused = vec![format!("{} ({reason})", fam.name())];
                let mut next = choice.fallback.as_deref();
                while let Some(fb) = next {
                    let Choice {
                        family: ffam,
                        defines: fdef,
                        fallback: after,
                    } = self.profile.fallbacks.get(fb).ok_or_else(|| {
                        err(format!("fallback '{fb}' is not defined in the profile"))
                    })?;
                    let f2 = family(ffam).ok_or_else(|| {
                        err(format!("fallback family '{ffam}' is not registered"))
                    })?;
                    let d2 = with_bound(f2, fdef);
                    match f2.validate(&d2, p, &self.limits) {
                        Ok(geo) => {
                            return Ok(Resolution {
                                family: f2,
                                defines: d2,
                                geo,
                                why: format!(
                                    "fallback {fb}: cannot run here: {}",
                                    refused.join("; ")
                                ),
                            })
                        }
                        Err(r2) => refused.push(format!("fallback {fb}: {} ({r2})", f2.name())),
                    }
                    next = after.as_deref();
                }
                Err(err(format!(
                    "neither the slot's choice nor any fallback can run here: {}",
                    refused.join("; ")
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tuned::TunedDefine;
    use gemtune_kernels::compile::Arch;
    use gemtune_kernels::quant::GgmlType;

    /// The built-in sm_90 table, each entry edited by `edit`.
    fn builtin_tuned(edit: impl Fn(&mut crate::tuned::TunedEntry)) -> TunedFile {
        let (arch, text) = crate::cuda::engine::BUILTIN_TUNED[0];
        let mut tuned = TunedFile::parse(arch, text).expect("tuned table");
        tuned.entries.iter_mut().for_each(edit);
        tuned
    }

    /// The dp4a profile's Q8_0 down projection at one token (e4b.ffn_down),
    /// which the table has an entry for, resolved over `tuned`.
    fn tuned_down(tuned: TunedFile) -> Resolution {
        let planner = Planner::new(
            Profile::load("dp4a").expect("dp4a"),
            Some(tuned),
            DeviceLimits::for_arch(Arch(90)),
        );
        let p = Problem::matmul(1, 2560, 10240, GgmlType::Q8_0);
        let r = planner
            .resolve(Slot::matmul(crate::cuda::slots::Proj::Down, 1), &p, &[])
            .expect("resolves");
        assert!(r.why.starts_with("tuned"), "{}", r.why);
        r
    }

    /// A tuned entry's defines land over the family's defaults, so a
    /// define the family gained after the table was written (gemv's OUT)
    /// still reaches the compiler, and the call site's bound defines win.
    #[test]
    fn tuned_entries_take_the_defaults_of_defines_they_predate() {
        let r = tuned_down(builtin_tuned(|_| {}));
        assert_eq!(r.defines.get("OUT"), Some(&DefineValue::Str("F32".into())));
        assert_eq!(
            r.defines.get("WTYPE"),
            Some(&DefineValue::Str("Q8_0".into()))
        );
        let xs = r.family.declared_defines();
        assert!(
            xs.iter().all(|d| r.defines.contains_key(d)),
            "every declared define is set: {:?}",
            r.defines
        );
    }

    /// A tuned entry that carries a define the engine binds per call site
    /// (a sweep's winner with a gemv tail or a records output) resolves
    /// with the family's default for it: only the call site binds one.
    #[test]
    fn tuned_entries_do_not_carry_call_site_defines() {
        let r = tuned_down(builtin_tuned(|e| {
            let d = &mut e.defines;
            d.insert("TAIL".into(), TunedDefine::Int(1));
            d.insert("TAIL_OUT".into(), TunedDefine::Str("Q8_SPLIT".into()));
            d.insert("OUT".into(), TunedDefine::Str("Q8_SPLIT".into()));
        }));
        assert_eq!(r.defines.get("TAIL"), Some(&DefineValue::Int(0)));
        assert_eq!(
            r.defines.get("TAIL_OUT"),
            Some(&DefineValue::Str("NONE".into()))
        );
        assert_eq!(r.defines.get("OUT"), Some(&DefineValue::Str("F32".into())));
    }
}
