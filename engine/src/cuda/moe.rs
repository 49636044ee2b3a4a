//! The mixture-of-experts FFN block of 26B-A4B on the GPU: the stages
//! (`CudaEngine::moe_route`, `CudaEngine::moe_experts`) that run the
//! launches a bucket planned for it (`forward_plan::MoePlan`) on its
//! buffers (`buffers::MoeBuffers`).
//!
//! On a MoE layer the attention residual's norm (the sandwich-norm
//! kernel with `OUTS=3`) writes, from one sum of squares of the residual
//! stream `h`, the shared MLP's input and the experts' two inputs;
//! `ffn_block` runs the dense shared MLP into `y` as on every model; this
//! block routes (after the shared MLP, or before it with `route_early`:
//! the router reads only the FFN block's input) and runs the experts into
//! `e`; and the launch that adds
//! the FFN's output to `h` (`layer_end`, `SUM_IN=1`) sums the two halves
//! with their post norms (`cpu::moe` is the reference):
//!
//! ```text
//! a1  = rmsnorm(h) * ffn_norm                              attn residual: the shared MLP's input
//! z   = rmsnorm(h) * (ffn_gate_inp.scale * d^-1/2)         the router input (OUTS=3)
//! a2  = rmsnorm(h) * pre_ffw_norm_2                        the experts' input (OUTS=3)
//! y   = shared_mlp(a1)                                     ffn_block
//! ids, w = moe_route(z)                                    top-k of the logits, renormalised, x expert scales
//! e   = experts(a2)                                        sum_j w_j down_j(gelu(gate_j a2) * up_j a2)
//! h  += rmsnorm(rmsnorm(y) * post_ffw_norm_1 + rmsnorm(e) * post_ffw_norm_2) * post_ffw_norm
//! ```
//!
//! The last line is `layer_end` (SUM_IN), which then writes the next
//! layer's input norm as on the dense models. Every launch reads the
//! expert ids `moe_route` wrote on the device, so a decode step replays in
//! a CUDA graph with no host round trip. A prefill chunk routes its rows in
//! one `moe_route` launch per group size (grid.y groups of 8 rows, then the
//! remainder) and runs the experts as grouped GEMMs (`moe_gemm`: sort,
//! gate|up, down, weighted sum) where the plan has them, otherwise as
//! `moe_gemv` groups of at most 8 rows.

use gemtune_kernels::bind::moe::{
    ExpertWeights, MoeCombineArgs, MoeDownArgs, MoeGateUpArgs, MoeGemmDownArgs, MoeGemmGateUpArgs,
    MoeGroupArgs, MoeRouteArgs,
};
use gemtune_kernels::bind::rows::RmsNormMoe;
use gemtune_kernels::bind::NULL;
use gemtune_kernels::gpu::DeviceBuffer;
use gemtune_kernels::runtime::Kernel;

use super::buffers::MoeBuffers;
use super::engine::{dev, CudaEngine};
use super::forward_plan::{
    LayerPlan, MoeExperts, MoeGemmPlan, MoeGroupPlan, MoePlan, MOE_GROUP_ROWS,
};
use super::slots::Phase;
use super::stages::Rows;
use super::weights::{GpuMatrix, Layouts, MoeLayerWeights};
use crate::config::MoeConfig;
use crate::engine::EngineError;

impl CudaEngine<'_> {
    /// The router of MoE layer `l` (its input `z` written by the attention
    /// residual): each row's chosen experts and their weights into
    /// `MoeBuffers::ids` / `weights`. Does nothing on a dense layer.
    pub(super) fn moe_route(
        &self,
        k: &[Kernel],
        lp: &LayerPlan,
        l: usize,
        rows: Rows,
    ) -> Result<(), EngineError> {
        let Some((mp, mw, mb, moe)) = self.moe_stage(lp, l) else {
            return Ok(());
        };
        let (d, kk, ne) = (
            self.model.config().d_model,
            moe.n_experts_used,
            moe.n_experts,
        );
        let r = rows.n;
        // The router: every full group of MOE_GROUP_ROWS rows in one launch
        // (grid.y groups, a counter each), then the remainder.
        self.mark(Phase::MoeRoute)?;
        let full = if r > MOE_GROUP_ROWS {
            r / MOE_GROUP_ROWS
        } else {
            0
        };
        let mut r0 = 0;
        for (n, groups) in [(MOE_GROUP_ROWS, full), (r - full * MOE_GROUP_ROWS, 1)] {
            if n == 0 || groups == 0 {
                continue;
            }
            let id = mp.route(n).ok_or_else(|| {
                EngineError::Device(format!(
                    "layer {l}: no router launch planned for a group of {n} rows"
                ))
            })?;
            let route = MoeRouteArgs {
                w: mw.router.ptr(),
                z: mb.z.ptr() + (4 * r0 * d) as u64,
                scale: mw.expert_scale.ptr(),
                logits: mb.logits.ptr() + (4 * r0 * ne) as u64,
                ids: mb.ids.ptr() + (4 * r0 * kk) as u64,
                weights: mb.weights.ptr() + (4 * r0 * kk) as u64,
                counter: mb.counter.ptr() + (4 * (r0 / MOE_GROUP_ROWS)) as u64,
                d,
                n_experts: ne,
                n_used: kk,
            };
            let kr = &k[id];
            let grid = (kr.geo.grid.0, groups as u32, 1);
            self.launch_kernel_grid(kr, grid, &route.kargs())?;
            r0 += n * groups;
        }
        Ok(())
    }

    /// The chosen experts of MoE layer `l` (their input `a2` written by the
    /// attention residual, the router's choices by `moe_route`): their
    /// weighted sum in `MoeBuffers::e`, which `layer_end` sums with the
    /// shared MLP's `y`. Does nothing on a dense layer.
    pub(super) fn moe_experts(
        &self,
        k: &[Kernel],
        lp: &LayerPlan,
        l: usize,
        rows: Rows,
    ) -> Result<(), EngineError> {
        let Some((mp, mw, mb, moe)) = self.moe_stage(lp, l) else {
            return Ok(());
        };
        let cfg = self.model.config();
        let (d, kk, fe, ne) = (
            cfg.d_model,
            moe.n_experts_used,
            moe.expert_ffn_dim,
            moe.n_experts,
        );
        let r = rows.n;
        let gu_w = |m: &GpuMatrix, lay: Layouts| -> Result<ExpertWeights, EngineError> {
            let layout = lay.only().ok_or_else(|| {
                EngineError::Device(format!("{}: not planned in one layout", m.name))
            })?;
            let w = m.weights_from(layout, 0).map_err(dev)?;
            Ok(ExpertWeights { q: w.q, d: w.d })
        };
        let w_gu = gu_w(&mw.gate_up, mp.gate_up_layout)?;
        let w_dn = gu_w(&mw.down, mp.down_layout)?;
        if let MoeExperts::Grouped(gp) = &mp.experts {
            self.moe_grouped(k, gp, (w_gu, w_dn), r)?;
        } else {
            // The experts, a group of at most MOE_GROUP_ROWS rows at a time.
            let mut r0 = 0;
            while r0 < r {
                let n = (r - r0).min(MOE_GROUP_ROWS);
                let g = self.moe_group(mp, l, n)?;
                let row = |buf: &DeviceBuffer, width: usize| buf.ptr() + (4 * r0 * width) as u64;
                self.mark(Phase::MoeGateUp)?;
                let gu = MoeGateUpArgs {
                    w: w_gu,
                    x: row(&mb.a2, d),
                    ids: row(&mb.ids, kk),
                    h: mb.h.ptr(),
                    count: NULL,
                    d,
                    ffn: fe,
                    n_experts: ne,
                    n_used: kk,
                };
                self.launch_kernel(&k[g.gate_up], &gu.kargs())?;
                self.mark(Phase::MoeDown)?;
                let dn = MoeDownArgs {
                    w: w_dn,
                    h: mb.h.ptr(),
                    ids: row(&mb.ids, kk),
                    weights: row(&mb.weights, kk),
                    y: row(&mb.e, d),
                    count: NULL,
                    d,
                    ffn: fe,
                    n_experts: ne,
                    n_used: kk,
                };
                self.launch_kernel(&k[g.down], &dn.kargs())?;
                r0 += n;
            }
        }
        Ok(())
    }

    /// The chosen experts of a prefill chunk of `r` rows as grouped GEMMs:
    /// the pairs sorted by expert into the tile table, gate|up with GELU
    /// into `h`, down into `yp`, and each row's weighted sum into `e`.
    fn moe_grouped(
        &self,
        k: &[Kernel],
        gp: &MoeGemmPlan,
        (w_gu, w_dn): (ExpertWeights, ExpertWeights),
        r: usize,
    ) -> Result<(), EngineError> {
        let (Some(mb), Some(moe)) = (self.moe_buffers.as_ref(), self.model.config().moe.as_ref())
        else {
            return Ok(());
        };
        let Some(s) = mb.grouped.as_ref() else {
            return Err(EngineError::Device(
                "the grouped expert GEMMs were planned without their buffers".into(),
            ));
        };
        let cfg = self.model.config();
        let (d, kk, fe, ne) = (
            cfg.d_model,
            moe.n_experts_used,
            moe.expert_ffn_dim,
            moe.n_experts,
        );
        self.mark(Phase::MoeGroup)?;
        let g = MoeGroupArgs {
            ids: mb.ids.ptr(),
            counts: s.counts.ptr(),
            offsets: s.offsets.ptr(),
            sorted: s.sorted.ptr(),
            tiles: s.tiles.ptr(),
            n_tokens: r,
            n_experts: ne,
            n_used: kk,
            bm: gp.bm,
        };
        self.launch_kernel(&k[gp.group], &g.kargs())?;
        self.mark(Phase::MoeGateUp)?;
        let gu = MoeGemmGateUpArgs {
            w: w_gu,
            x: mb.a2.ptr(),
            sorted: s.sorted.ptr(),
            tiles: s.tiles.ptr(),
            offsets: s.offsets.ptr(),
            h: mb.h.ptr(),
            d,
            ffn: fe,
            n_used: kk,
        };
        self.launch_kernel(&k[gp.gate_up], &gu.kargs())?;
        self.mark(Phase::MoeDown)?;
        let dn = MoeGemmDownArgs {
            w: w_dn,
            h: mb.h.ptr(),
            sorted: s.sorted.ptr(),
            tiles: s.tiles.ptr(),
            offsets: s.offsets.ptr(),
            yp: s.yp.ptr(),
            d,
            ffn: fe,
        };
        self.launch_kernel(&k[gp.down], &dn.kargs())?;
        let c = MoeCombineArgs {
            yp: s.yp.ptr(),
            ids: mb.ids.ptr(),
            weights: mb.weights.ptr(),
            y: mb.e.ptr(),
            n_tokens: r,
            d,
            n_experts: ne,
            n_used: kk,
        };
        self.launch_kernel(&k[gp.combine], &c.kargs())
    }

    /// The launches of a group of `n` rows of layer `l`'s plan.
    fn moe_group<'p>(
        &self,
        mp: &'p MoePlan,
        l: usize,
        n: usize,
    ) -> Result<&'p MoeGroupPlan, EngineError> {
        mp.group(n).ok_or_else(|| {
            EngineError::Device(format!(
                "layer {l}: no MoE launches planned for a group of {n} rows"
            ))
        })
    }

    /// What MoE layer `l`'s stages read: its plan, weights, the block's
    /// buffers and the model's MoE shapes (`None` on a dense layer).
    fn moe_stage<'s>(
        &'s self,
        lp: &'s LayerPlan,
        l: usize,
    ) -> Option<(
        &'s MoePlan,
        &'s MoeLayerWeights,
        &'s MoeBuffers,
        &'s MoeConfig,
    )> {
        let (mw, mb) = self.moe_parts(lp, l)?;
        Some((lp.moe.as_ref()?, mw, mb, self.model.config().moe.as_ref()?))
    }

    /// MoE layer `l`'s weights and the block's buffers, when the layer's
    /// plan has an expert block.
    fn moe_parts(&self, lp: &LayerPlan, l: usize) -> Option<(&MoeLayerWeights, &MoeBuffers)> {
        match (&lp.moe, self.w.layers[l].moe.as_ref(), &self.moe_buffers) {
            (Some(_), Some(mw), Some(mb)) => Some((mw, mb)),
            _ => None,
        }
    }

    /// The router input and the experts' input norm of MoE layer `l`,
    /// which its attention residual writes beside the shared MLP's input
    /// (`OUTS=3`); nothing on a dense layer.
    pub(super) fn moe_inputs(&self, lp: &LayerPlan, l: usize) -> RmsNormMoe {
        self.moe_parts(lp, l)
            .map_or_else(RmsNormMoe::default, |(mw, mb)| RmsNormMoe {
                out2: mb.z.ptr(),
                w_out2: mw.router_norm.ptr(),
                out3: mb.a2.ptr(),
                w_out3: mw.pre_norm_2.ptr(),
                ..Default::default()
            })
    }

    /// The FFN output's two halves on MoE layer `l`, which the launch that
    /// adds the FFN's output to the residual sums (`SUM_IN`):
    /// `rmsnorm(y) * post_ffw_norm_1 + rmsnorm(e) * post_ffw_norm_2`;
    /// nothing on a dense layer.
    pub(super) fn moe_sum(&self, lp: &LayerPlan, l: usize) -> RmsNormMoe {
        self.moe_parts(lp, l)
            .map_or_else(RmsNormMoe::default, |(mw, mb)| RmsNormMoe {
                y2: mb.e.ptr(),
                w_y: mw.post_norm_1.ptr(),
                w_y2: mw.post_norm_2.ptr(),
                ..Default::default()
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Gemma4Config;
    use crate::cuda::forward_plan::{ForwardPlan, LaunchId, Sizing};
    use crate::cuda::model_dims::{model_bytes, ModelDims};
    use crate::cuda::planner::Planner;
    use crate::profile::Profile;
    use crate::synth::{self, SynthVariant, WeightType};
    use gemtune_kernels::compile::Arch;
    use gemtune_kernels::defines::DefineValue;
    use gemtune_kernels::family::{DeviceLimits, KvType};
    use gemtune_kernels::quant::GgmlType;

    fn moe_plan(
        profile: &str,
        v: SynthVariant,
        w: WeightType,
        ubatch: usize,
    ) -> (ForwardPlan, ModelDims, Gemma4Config) {
        let planner = Planner::new(
            Profile::load(profile).expect("profile"),
            None,
            DeviceLimits::for_arch(Arch(90)),
        );
        let cfg = synth::preset(v);
        let dims = ModelDims::of_synth(&cfg, w, &planner);
        let sizing = Sizing {
            max_seq: 4096.min(cfg.context_length),
            ubatch,
            kv_type: KvType::F16,
        };
        let plan = ForwardPlan::resolve(&planner, &cfg, &dims, sizing)
            .unwrap_or_else(|e| panic!("{profile} {v:?} {w:?}: {e}"));
        (plan, dims, cfg)
    }

    /// The grouped GEMMs' DOWN stage has its own slot: main lays its warps
    /// out apart (one warp row) on the same row tile; a profile giving it
    /// another BM is refused at plan time, since the pairs are cut into
    /// tiles once.
    #[test]
    fn the_grouped_down_stage_keeps_the_row_tile() {
        let (plan, _, _) = moe_plan("main", SynthVariant::B26A4b, WeightType::Q8_0, 512);
        let b = plan.bucket(512).expect("a prefill bucket");
        let Some(MoeExperts::Grouped(g)) = b.layers[0].moe.as_ref().map(|m| &m.experts) else {
            panic!("26B-A4B at 512 rows runs the grouped GEMMs");
        };
        let d = |id: LaunchId, k: &str| plan.launches[id].res.defines.get(k).cloned();
        assert_eq!(d(g.down, "WARPS_M"), Some(DefineValue::Int(1)));
        assert_eq!(d(g.gate_up, "WARPS_M"), Some(DefineValue::Int(2)));
        assert_eq!(d(g.down, "BM"), d(g.gate_up, "BM"));
        let bad = Profile::parse(
            "test:bad-down",
            "name = \"bad-down\"\nbase = \"main\"\ndescription = \"x\"\n\n[slot.\"moe_gemm.down\"]\nfamily = \"moe_gemm\"\ndefines = { LAYOUT = 1, DQ_TYPE = \"F16\", BM = 128, BN = 128, BK = 64, WARPS_M = 2, WARPS_N = 4, STAGES = 3 }\n",
        )
        .expect("the profile parses");
        let planner = Planner::new(bad, None, DeviceLimits::for_arch(Arch(90)));
        let cfg = synth::preset(SynthVariant::B26A4b);
        let dims = ModelDims::of_synth(&cfg, WeightType::Q8_0, &planner);
        let sizing = Sizing {
            max_seq: 4096,
            ubatch: 512,
            kv_type: KvType::F16,
        };
        let Err(e) = ForwardPlan::resolve(&planner, &cfg, &dims, sizing) else {
            panic!("a down stage on BM 128 beside BM 64 was planned");
        };
        assert!(e.to_string().contains("row tile BM"), "{e}");
    }

    /// A MoE slot may name an entry per weight type (`slot@WTYPE`, the
    /// expert stacks' type): main serves Q8_0 and Q4_K gate|up stacks with
    /// entries of their own and Q4_0 ones with the group's entry (each
    /// entry's `why` names its stacks); all at 4 row pairs x 8 warps, whole
    /// 32-row records of h for the down stage.
    #[test]
    fn moe_slots_resolve_per_expert_weight_type() {
        for (w, rows, entry) in [
            (WeightType::Q8_0, 4, "on Q8_0 stacks"),
            (WeightType::Q4_0, 4, "(Q4_0 stacks;"),
            (WeightType::Q4KM, 4, "on Q4_K stacks"),
        ] {
            let (plan, _, _) = moe_plan("main", SynthVariant::B26A4b, w, 64);
            let b = plan.bucket(1).expect("the decode bucket");
            let mp = b.layers[0].moe.as_ref().expect("a MoE layer");
            let g = mp.group(1).expect("one row's expert GEMVs");
            let res = &plan.launches[g.gate_up].res;
            assert_eq!(
                res.defines.get("ROWS"),
                Some(&DefineValue::Int(rows)),
                "{w:?}"
            );
            assert!(res.why.contains(entry), "{w:?}: {}", res.why);
        }
    }

    /// Every bucket of a MoE model plans the expert block on every layer:
    /// the router per group size (a decode bucket: its own rows; a prefill
    /// bucket: 8 and every remainder); the experts as `moe_gemv` groups of
    /// the same sizes, or on a prefill bucket as `moe_gemm`'s four stages
    /// where the profile serves `moe_gemm` with it and the expert width is
    /// whole 64-element steps (26B-A4B's 704, not tiny-moe's 96; `strict`
    /// serves it with `moe_gemv`); each launch resolves to its family with
    /// the plan's STAGE, and the stacks are read in one layout each.
    #[test]
    fn moe_models_plan_the_expert_block_on_every_layer() {
        for (profile, v, w, grouped) in [
            ("main", SynthVariant::TinyMoe, WeightType::Q8_0, false),
            ("strict", SynthVariant::TinyMoe, WeightType::Q8_0, false),
            ("main", SynthVariant::TinyMoe, WeightType::Q4KM, false),
            ("main", SynthVariant::B26A4b, WeightType::Q8_0, true),
            ("strict", SynthVariant::B26A4b, WeightType::Q8_0, false),
            ("main", SynthVariant::B26A4b, WeightType::Q4_0, true),
            ("main", SynthVariant::B26A4b, WeightType::Q4KM, true),
        ] {
            let what = format!("{profile} {v:?} {w:?}");
            let (plan, dims, cfg) = moe_plan(profile, v, w, 64);
            let moe = cfg.moe.as_ref().expect("a MoE preset");
            let stage_is = |id: LaunchId, fam: &str, st: &str| {
                let res = &plan.launches[id].res;
                assert_eq!(res.family.name(), fam, "{what}");
                assert_eq!(
                    res.defines.get("STAGE"),
                    Some(&DefineValue::Str(st.into())),
                    "{what}"
                );
                res.geo.kernel.clone()
            };
            for b in &plan.buckets {
                assert_eq!(b.layers.len(), cfg.n_layers, "{what}");
                let sizes_want: Vec<usize> = if b.rows <= MOE_GROUP_ROWS {
                    vec![b.rows]
                } else {
                    (1..=MOE_GROUP_ROWS).collect()
                };
                for (l, lp) in b.layers.iter().enumerate() {
                    let mp = lp
                        .moe
                        .as_ref()
                        .unwrap_or_else(|| panic!("{what}: layer {l} of bucket {}", b.rows));
                    let sizes: Vec<usize> = mp.routes.iter().map(|r| r.0).collect();
                    assert_eq!(sizes, sizes_want, "{what}");
                    for &(n, id) in &mp.routes {
                        let res = &plan.launches[id].res;
                        assert_eq!(res.family.name(), "moe_route", "{what}");
                        assert!(res.geo.kernel.ends_with(&format!("_n{n}")), "{what}");
                    }
                    match &mp.experts {
                        MoeExperts::Groups(groups) => {
                            assert!(
                                !(grouped && b.rows > MOE_GROUP_ROWS),
                                "{what}: bucket {} runs groups",
                                b.rows
                            );
                            let sizes: Vec<usize> = groups.iter().map(|g| g.rows).collect();
                            assert_eq!(sizes, sizes_want, "{what}");
                            // main: gate|up on dp4a over split Q8 made per
                            // block, down on the records it writes (every
                            // type here has both); strict: the FMA form.
                            let (gu, dn) = if profile == "main" { (2, 3) } else { (0, 0) };
                            for g in groups {
                                for (id, st, algo) in
                                    [(g.gate_up, "GATE_UP", gu), (g.down, "DOWN", dn)]
                                {
                                    let kernel = stage_is(id, "moe_gemv", st);
                                    assert!(kernel.ends_with(&format!("_n{}", g.rows)), "{what}");
                                    assert_eq!(
                                        plan.launches[id].res.defines.get("ALGO"),
                                        Some(&DefineValue::Int(algo)),
                                        "{what} {st}"
                                    );
                                }
                            }
                        }
                        MoeExperts::Grouped(g) => {
                            assert!(grouped && b.rows > MOE_GROUP_ROWS, "{what}");
                            assert_eq!(stage_is(g.group, "moe_gemm", "GROUP"), "moe_gemm_group");
                            stage_is(g.gate_up, "moe_gemm", "GATE_UP");
                            stage_is(g.down, "moe_gemm", "DOWN");
                            stage_is(g.combine, "moe_gemm", "COMBINE");
                            for id in [g.group, g.gate_up, g.down, g.combine] {
                                let bm = plan.launches[id].res.defines.get("BM");
                                assert_eq!(bm, Some(&DefineValue::Int(g.bm as i64)), "{what}");
                            }
                        }
                    }
                    assert_eq!(mp.gate_up_layout.count(), 1, "{what}");
                    assert_eq!(mp.down_layout.count(), 1, "{what}");
                    // The norms ride on the dense launches: the attention
                    // residual writes the router and expert inputs, the
                    // layer's end sums the FFN's two halves.
                    let int = |id: LaunchId, key: &str| match plan.launches[id].res.defines.get(key)
                    {
                        Some(DefineValue::Int(v)) => *v,
                        other => panic!("{what}: {key} = {other:?}"),
                    };
                    let residual = lp
                        .attn_residual
                        .expect("a MoE layer's attention residual is a launch");
                    assert_eq!(int(residual, "OUTS"), 3, "{what}");
                    assert_eq!(int(residual, "SUM_IN"), 0, "{what}");
                    assert!(lp.end.is_some(), "{what}: a MoE layer's end is a launch");
                    let ends = [lp.end, lp.end_with_next_norm];
                    for id in ends.into_iter().flatten() {
                        assert_eq!(int(id, "SUM_IN"), 1, "{what}");
                        assert_eq!(int(id, "OUTS"), 1, "{what}");
                    }
                }
            }
            assert_eq!(plan.moe_gemm_bm().is_some(), grouped, "{what}");
            assert_eq!(plan.layouts.experts_gate_up.count(), 1, "{what}");
            let m = dims.layers[0].moe.expect("MoE dims");
            assert_eq!(
                m.gate_up.0,
                moe.n_experts * 2 * moe.expert_ffn_dim,
                "{what}"
            );
            assert_eq!(m.down.0, moe.n_experts * cfg.d_model, "{what}");
            assert_eq!(m.router.2, GgmlType::F32, "{what}: the router stays F32");
        }
    }

    /// tiny-moe at d_model 256 with experts of 128 (the GPU tests'
    /// `tiny_moe_wide`): main's prefill buckets run the grouped GEMMs on
    /// every type the GPU test covers, including the Q4_K_M mix whose
    /// 128-wide down stacks are not whole super-blocks (Q5_0 and Q8_0
    /// fallbacks; the Q5_0 ones read as Q8_0 widened exactly).
    #[test]
    fn a_tiny_moe_with_64_multiple_widths_plans_the_grouped_gemms() {
        let mut cfg = synth::preset(SynthVariant::TinyMoe);
        cfg.d_model = 256;
        if let Some(m) = cfg.moe.as_mut() {
            m.expert_ffn_dim = 128;
        }
        for w in [
            WeightType::Q8_0,
            WeightType::Q4_0,
            WeightType::Bf16,
            WeightType::Q4KM,
        ] {
            let planner = Planner::new(
                Profile::load("main").expect("profile"),
                None,
                DeviceLimits::for_arch(Arch(90)),
            );
            let dims = ModelDims::of_synth(&cfg, w, &planner);
            let sizing = Sizing {
                max_seq: 256,
                ubatch: 64,
                kv_type: KvType::F16,
            };
            let plan = ForwardPlan::resolve(&planner, &cfg, &dims, sizing)
                .unwrap_or_else(|e| panic!("{w:?}: {e}"));
            assert!(plan.moe_gemm_bm().is_some(), "{w:?}");
        }
    }

    /// The fit check counts every expert of every layer in the planned
    /// layout, and the router; Q8_0 and Q4_0 planes take the file's bytes.
    #[test]
    fn model_bytes_count_every_expert_stack_at_the_files_bytes() {
        for w in [WeightType::Q8_0, WeightType::Q4_0] {
            let (plan, dims, cfg) = moe_plan("main", SynthVariant::B26A4b, w, 512);
            let moe = cfg.moe.as_ref().expect("MoE");
            let mut dense = dims.clone();
            for l in &mut dense.layers {
                l.moe = None;
            }
            let extra = model_bytes(&dims, &plan.layouts) - model_bytes(&dense, &plan.layouts);
            let t = w.matrix_type();
            let (d, e, fe) = (cfg.d_model, moe.n_experts, moe.expert_ffn_dim);
            // Gate, up and down: 3 * fe * d weights per expert, in whole
            // blocks of 32 (d and fe are multiples of 32 on 26B-A4B).
            assert_eq!((d % 32, fe % 32), (0, 0));
            let per_layer = e * 3 * fe * d / 32 * t.type_size() + e * d * 4;
            assert_eq!(extra, (cfg.n_layers * per_layer) as u64, "{w:?}");
        }
    }

    /// A decode step reads the router and the chosen experts' rows of each
    /// stack, `n_experts_used` of `n_experts`, never the others.
    #[test]
    fn a_decode_step_reads_only_the_chosen_experts() {
        let (plan, dims, cfg) = moe_plan("main", SynthVariant::B26A4b, WeightType::Q8_0, 512);
        let moe = cfg.moe.as_ref().expect("MoE");
        let with = crate::cuda::step_reads::of_plan(&plan, &cfg, &dims).expect("reads");
        let mut dense_plan = plan;
        for b in &mut dense_plan.buckets {
            for l in &mut b.layers {
                l.moe = None;
            }
        }
        let without = crate::cuda::step_reads::of_plan(&dense_plan, &cfg, &dims).expect("reads");
        let (d, e, fe, k) = (
            cfg.d_model,
            moe.n_experts,
            moe.expert_ffn_dim,
            moe.n_experts_used,
        );
        // Q8_0: 34 bytes per 32 weights in the planes as in the file.
        let expert = (2 * fe * d + d * fe) / 32 * 34;
        let per_layer = (e * d * 4 + k * expert) as u64;
        assert_eq!(
            with.matrices - without.matrices,
            cfg.n_layers as u64 * per_layer
        );
        assert!(k * 4 <= e, "26B-A4B routes to a small share of its experts");
    }
}
