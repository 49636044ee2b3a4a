//! The plan's builder: each slot of each row bucket resolved through the
//! planner once per distinct (slot, problem, bound defines, grid rule), in
//! forward order, into `PlannedLaunch`es and the bucket's per-layer plans.
//! The expert block's launches are in `moe.rs`.

use std::collections::{BTreeSet, HashMap};

use gemtune_kernels::bind::matmul::{gemv_out, gemv_tail, MatmulBinding, Prepass, TailMode};
use gemtune_kernels::bind::ActFormat;
use gemtune_kernels::defines::DefineValue;
use gemtune_kernels::families::scale_expand;
use gemtune_kernels::family::{Problem, RowsProblem, WType};
use gemtune_kernels::quant::GgmlType;

use super::bucket::{
    AttnPlan, BucketPlan, HeadPlan, LayerPlan, MatmulExec, MatmulPlan, PleInputsPlan, PleLayerPlan,
    PrepassPlan,
};
use super::launch::{Entry, GridRule, LaunchId, PlannedLaunch};
use super::problems::{attn_problem, norm_bound, out_bound, rows_problem, Sizing};
use crate::config::Gemma4Config;
use crate::cuda::model_dims::{MatDim, ModelDims};
use crate::cuda::planner::{PlanError, Planner, Resolution, GEMV_BLOCK};
use crate::cuda::slots::{Proj, Slot, GEMV_MAX_ROWS};
use crate::cuda::weights::PLANES_F32;

/// The fewest warps a GEMV block must have for the plan to bind a norm
/// tail on it. The tail is one block's serial work over whole rows: at
/// 8 warps (256 threads) a pass over a 2560- to 5376-wide row is one or
/// two batches of loads per thread, while a 2-warp block's first tail took
/// 16 us against the norm launch's few
/// (reports/h200-2026-11-28-norm-tail).
pub(super) const TAIL_MIN_WARPS: i64 = 8;

/// Builds a plan: resolves each distinct launch once.
pub(super) struct Builder<'a> {
    pub(super) planner: &'a Planner,
    pub(super) cfg: &'a Gemma4Config,
    sizing: Sizing,
    pub(super) launches: Vec<PlannedLaunch>,
    index: HashMap<String, LaunchId>,
    /// The launches of the bucket being built.
    current: BTreeSet<LaunchId>,
    /// Whether the bucket being built is a prefill bucket.
    pub(super) prefill: bool,
}

impl<'a> Builder<'a> {
    pub(super) fn new(planner: &'a Planner, cfg: &'a Gemma4Config, sizing: Sizing) -> Self {
        Builder {
            planner,
            cfg,
            sizing,
            launches: Vec::new(),
            index: HashMap::new(),
            current: BTreeSet::new(),
            prefill: false,
        }
    }
}

impl Builder<'_> {
    pub(super) fn push(
        &mut self,
        slot: Slot,
        problem: Problem,
        bound: Vec<(&'static str, DefineValue)>,
        grid: GridRule,
    ) -> Result<LaunchId, PlanError> {
        let grid = if self.prefill { grid } else { GridRule::Fixed };
        let key = format!(
            "{slot}|{}|{}|{grid:?}",
            problem.describe(),
            bound
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        );
        if let Some(&id) = self.index.get(&key) {
            self.current.insert(id);
            return Ok(id);
        }
        let res = self.planner.resolve(slot, &problem, &bound)?;
        let id = self.launches.len();
        self.launches.push(PlannedLaunch {
            slot,
            problem,
            bound,
            entry: Entry::Main,
            grid,
            res,
        });
        self.index.insert(key, id);
        self.current.insert(id);
        Ok(id)
    }

    /// The `gemm_dq_convert` entry of launch `main`'s module over `[m][k]`.
    fn dq_convert(&mut self, main: LaunchId, m: usize, k: usize) -> LaunchId {
        let key = format!("dq_convert|{main}|{m}|{k}|{}", self.prefill);
        if let Some(&id) = self.index.get(&key) {
            self.current.insert(id);
            return id;
        }
        let base = &self.launches[main];
        let mut res = base.res.clone();
        res.geo = MatmulBinding::dq_convert_geometry(m, k);
        let l = PlannedLaunch {
            slot: base.slot,
            problem: base.problem,
            bound: base.bound.clone(),
            entry: Entry::DqConvert { k },
            grid: if self.prefill {
                GridRule::Rows
            } else {
                GridRule::Fixed
            },
            res,
        };
        let id = self.launches.len();
        self.launches.push(l);
        self.index.insert(key, id);
        self.current.insert(id);
        id
    }

    fn binding(&self, id: LaunchId) -> Result<MatmulBinding, PlanError> {
        let l = &self.launches[id];
        MatmulBinding::of(l.res.family.name(), &l.res.defines)
            .map_err(|msg| PlanError::slot(l.slot, msg))
    }

    /// Projection `proj` of a `dim` matrix at `m` rows. `from_f32`: its
    /// input comes from an f32 buffer (a pre-pass converts it when the
    /// variant reads another format); otherwise the producer writes the
    /// input format itself.
    fn matmul(
        &mut self,
        proj: Proj,
        dim: MatDim,
        m: usize,
        from_f32: bool,
    ) -> Result<MatmulPlan, PlanError> {
        self.matmul_bound(proj, dim, m, from_f32, vec![])
    }

    /// `matmul` with defines bound at the call site (a GEMV's `OUT`) on a
    /// single launch; row-block plans take none.
    fn matmul_bound(
        &mut self,
        proj: Proj,
        dim: MatDim,
        m: usize,
        from_f32: bool,
        bound: Vec<(&'static str, DefineValue)>,
    ) -> Result<MatmulPlan, PlanError> {
        let slot = Slot::matmul(proj, m);
        let (n, k, t) = dim;
        if self.planner.vendor(slot) {
            let convert =
                self.push(Slot::ActConvert, rows_problem(m, k), vec![], GridRule::Rows)?;
            return Ok(MatmulPlan {
                proj,
                slot,
                dim,
                input: ActFormat::F32,
                prepass: None,
                scales: None,
                exec: MatmulExec::Vendor { convert },
            });
        }
        let (exec, binding, main) = if self.planner.row_chunked(slot) && m > GEMV_BLOCK {
            let mut blocks = Vec::with_capacity(GEMV_BLOCK);
            for mc in 1..=GEMV_BLOCK {
                let id = self.push(slot, Problem::matmul(mc, n, k, t), vec![], GridRule::Fixed)?;
                blocks.push((id, self.binding(id)?));
            }
            let (main, binding) = blocks[GEMV_BLOCK - 1];
            if blocks.iter().any(|b| b.1.act != binding.act) {
                return Err(PlanError::slot(
                    slot,
                    "the row-block GEMV variants read different activation formats",
                ));
            }
            (MatmulExec::RowBlocks { blocks }, binding, main)
        } else {
            let id = self.push(slot, Problem::matmul(m, n, k, t), bound, GridRule::Rows)?;
            let binding = self.binding(id)?;
            if binding.matrices > 1 {
                self.size_fused_grid(id, n, binding.matrices)?;
            }
            (
                MatmulExec::Kernel {
                    launch: id,
                    binding,
                },
                binding,
                id,
            )
        };
        // A kernel reading the GEMMs' scale plane (f32 scales or k-quant
        // side words) gets it from the GEMV's plane just before it runs
        // when the profile keeps one scale plane per matrix.
        let scales = match (&exec, WType::of(t)) {
            (MatmulExec::Kernel { .. }, Some(wt))
                if self.planner.profile.expand_gemm_scales
                    && binding.layout == PLANES_F32
                    && scale_expand::expands(wt) =>
            {
                Some(self.push(
                    Slot::ScaleExpand,
                    Problem::matmul(1, n, k, t),
                    vec![],
                    GridRule::Fixed,
                )?)
            }
            _ => None,
        };
        let prepass = match (from_f32, binding.prepass) {
            (false, _) | (true, Prepass::None) => None,
            (true, Prepass::QuantizeQ8_1) => Some(PrepassPlan {
                kind: Prepass::QuantizeQ8_1,
                launch: self.push(
                    Slot::QuantizeQ8_1,
                    Problem::matmul(m, 1, k, GgmlType::Q8_0),
                    out_bound(binding.act),
                    GridRule::Rows,
                )?,
            }),
            (true, Prepass::DqConvert) => Some(PrepassPlan {
                kind: Prepass::DqConvert,
                launch: self.dq_convert(main, m, k),
            }),
        };
        Ok(MatmulPlan {
            proj,
            slot,
            dim,
            input: binding.act,
            prepass,
            scales,
            exec,
        })
    }

    /// The format projection `proj` reads at `m` rows, without planning it.
    fn input_format(&self, proj: Proj, dim: MatDim, m: usize) -> Result<ActFormat, PlanError> {
        let slot = Slot::matmul(proj, m);
        if self.planner.vendor(slot) {
            return Ok(ActFormat::F32);
        }
        let rows = if self.planner.row_chunked(slot) {
            m.min(GEMV_BLOCK)
        } else {
            m
        };
        let r = self
            .planner
            .resolve(slot, &Problem::matmul(rows, dim.0, dim.1, dim.2), &[])?;
        MatmulBinding::of(r.family.name(), &r.defines)
            .map(|b| b.act)
            .map_err(|msg| PlanError::slot(slot, msg))
    }

    /// A fused GEMV is planned on the whole gate|up matrix (`n` = both
    /// halves), but it computes `n / matrices` outputs, each from a row of
    /// every matrix: its launch's problem and grid become those (with `n`
    /// blocks, half of them would start only to find no rows, a tail of
    /// empty waves on every call).
    /// A launch shared by several layers is sized once: its problem then
    /// no longer spans the whole `n`.
    fn size_fused_grid(
        &mut self,
        id: LaunchId,
        n: usize,
        matrices: usize,
    ) -> Result<(), PlanError> {
        let l = &self.launches[id];
        let Problem::Matmul(mp) = &l.problem else {
            return Ok(());
        };
        if mp.n != n {
            return Ok(());
        }
        let outputs = Problem::matmul(mp.m, mp.n / matrices, mp.k, mp.wtype);
        let geo = l
            .res
            .family
            .validate(&l.res.defines, &outputs, &self.planner.limits)
            .map_err(|msg| PlanError::slot(l.slot, msg))?;
        self.launches[id].res.geo = geo;
        self.launches[id].problem = outputs;
        Ok(())
    }

    /// The FFN's gate|up at `r` rows. A fused gate+up GEMV (FUSE=1, which
    /// writes gelu(gate) * up itself) whose variant can also write the
    /// down projection's split Q8 records (OUT=Q8_SPLIT) is bound to: then
    /// no producer pass stands between the two GEMVs.
    fn gate_up(&mut self, dim: MatDim, down: MatDim, r: usize) -> Result<MatmulPlan, PlanError> {
        let slot = Slot::matmul(Proj::GateUp, r);
        let mut bound = vec![];
        if self.single_launch(slot, r)
            && self.input_format(Proj::Down, down, r)? == ActFormat::Q8Split
        {
            let p = Problem::matmul(r, dim.0, dim.1, dim.2);
            let first = self.planner.resolve(slot, &p, &[])?;
            let fused = first.defines.get("FUSE") == Some(&DefineValue::Int(1));
            // The fused kernel's outputs: one per row pair (gate, up).
            let outputs = Problem::matmul(r, dim.0 / 2, dim.1, dim.2);
            let records = DefineValue::Str(ActFormat::Q8Split.define().into());
            if fused && self.takes(&first, &[("OUT", records)], &outputs) {
                bound = out_bound(ActFormat::Q8Split);
            }
        }
        self.matmul_bound(Proj::GateUp, dim, r, false, bound)
    }

    /// Whether projection slot `slot` runs as one kernel launch at `r` rows
    /// (not cuBLAS, not per row block): only then can a call site bind a
    /// define on it.
    fn single_launch(&self, slot: Slot, r: usize) -> bool {
        !(self.planner.vendor(slot) || (self.planner.row_chunked(slot) && r > GEMV_BLOCK))
    }

    /// Whether the variant `res` declares every define of `bound` and
    /// validates at `p` with them laid over its defines: what a call site
    /// checks before it binds defines the slot's entry does not state.
    fn takes(&self, res: &Resolution, bound: &[(&str, DefineValue)], p: &Problem) -> bool {
        let declared = res.family.declared_defines();
        let mut d = res.defines.clone();
        for (name, value) in bound {
            if !declared.iter().any(|x| x == name) {
                return false;
            }
            d.insert((*name).into(), value.clone());
        }
        res.family.validate(&d, p, &self.planner.limits).is_ok()
    }

    /// The PLE gate at `r` rows. In a decode bucket of a profile that fuses
    /// the PLE GELU (`ple_gelu = "fused"`), where the projection after the
    /// gate reads f32 rows and the gate's variant is a plain GEMV writing
    /// f32 that also takes FUSE=2, the gate is bound to FUSE=2: it writes
    /// gelu(gate) * per-layer input itself and no gelu_mul launch follows.
    fn ple_gate(
        &mut self,
        dim: MatDim,
        proj_input: ActFormat,
        r: usize,
    ) -> Result<MatmulPlan, PlanError> {
        let slot = Slot::matmul(Proj::Ple, r);
        if self.prefill
            || !self.planner.profile.fuse_ple_gelu
            || !self.single_launch(slot, r)
            || proj_input != ActFormat::F32
        {
            return self.matmul(Proj::Ple, dim, r, true);
        }
        let p = Problem::matmul(r, dim.0, dim.1, dim.2);
        let first = self.planner.resolve(slot, &p, &[])?;
        let fusable = first.family.name() == "gemv"
            && first.defines.get("FUSE") == Some(&DefineValue::Int(0))
            && gemv_out(&first.defines) == Ok(ActFormat::F32)
            && self.takes(&first, &[("FUSE", DefineValue::Int(2))], &p);
        let bound = if fusable {
            vec![("FUSE", DefineValue::Int(2))]
        } else {
            vec![]
        };
        self.matmul_bound(Proj::Ple, dim, r, true, bound)
    }

    /// The defines that bind projection `proj`'s GEMV to run the sandwich
    /// norm after it in its last block (`mode`: gemv TAIL=1 with TAIL_OUT),
    /// or none. A decode bucket of a profile that fuses norm tails
    /// (`norm_tail = "fused"`) binds them where the slot is one gemv launch
    /// writing f32 rows of the plain product (FUSE=0, OUT=F32, no tail of
    /// its own) on blocks of at least `TAIL_MIN_WARPS` warps, and the
    /// variant validates with them at this problem; otherwise the norm
    /// stays a launch of its own.
    fn tail_bound(
        &self,
        proj: Proj,
        dim: MatDim,
        r: usize,
        mode: TailMode,
    ) -> Result<Vec<(&'static str, DefineValue)>, PlanError> {
        let slot = Slot::matmul(proj, r);
        if self.prefill || !self.planner.profile.fuse_norm_tail || !self.single_launch(slot, r) {
            return Ok(vec![]);
        }
        let p = Problem::matmul(r, dim.0, dim.1, dim.2);
        let first = self.planner.resolve(slot, &p, &[])?;
        let plain = first.family.name() == "gemv"
            && matches!(first.defines.get("WARPS"), Some(DefineValue::Int(w)) if *w >= TAIL_MIN_WARPS)
            && first.defines.get("FUSE") == Some(&DefineValue::Int(0))
            && gemv_out(&first.defines) == Ok(ActFormat::F32)
            && gemv_tail(&first.defines) == Ok(TailMode::None);
        let out = match mode {
            TailMode::None => return Ok(vec![]),
            TailMode::Residual => "NONE",
            TailMode::Norm(f) => f.define(),
        };
        let bound = vec![
            ("TAIL", DefineValue::Int(1)),
            ("TAIL_OUT", DefineValue::Str(out.into())),
        ];
        Ok(if plain && self.takes(&first, &bound, &p) {
            bound
        } else {
            vec![]
        })
    }

    /// Layer `l`'s attention call at `r` rows, its O written in `o_fmt`
    /// where the resolved variant can write it.
    fn attention(&mut self, l: usize, r: usize, o_fmt: ActFormat) -> Result<AttnPlan, PlanError> {
        let kind = self.cfg.layers[l].kind;
        let slot = Slot::attention(kind, r);
        let a = attn_problem(self.cfg, l, r, &self.sizing);
        let p = Problem::Attention(a);
        let first = self.planner.resolve(slot, &p, &[])?;
        let q16 = first.defines.get("Q16") == Some(&DefineValue::Int(1));
        let writes = o_fmt != ActFormat::F32 && self.takes(&first, &out_bound(o_fmt), &p);
        let out = if writes { o_fmt } else { ActFormat::F32 };
        let capacity = self.sizing.capacity(self.cfg, l);
        let launch = self.push(slot, p, out_bound(out), GridRule::AttnRows { capacity })?;
        Ok(AttnPlan {
            launch,
            kind,
            q16,
            out,
        })
    }

    pub(super) fn bucket(&mut self, dims: &ModelDims, r: usize) -> Result<BucketPlan, PlanError> {
        self.prefill = r > GEMV_MAX_ROWS;
        self.current.clear();
        let cfg = self.cfg;
        let d = cfg.d_model;
        // The gather reads the head's Q6_K planes when they are the table's
        // one copy (`model_dims::embed_on_head_planes`).
        let embed_layout = if dims.embd_on_head {
            vec![("LAYOUT", DefineValue::Int(1))]
        } else {
            vec![]
        };
        let embed = self.push(
            Slot::Embed,
            Problem::Rows(RowsProblem {
                rows: r,
                width: d,
                dtype: dims.embd_type,
                aux: 0,
            }),
            embed_layout,
            GridRule::Rows,
        )?;
        let per_layer_inputs = match (dims.ple_model_proj, dims.ple_type) {
            (Some(mp), Some(t)) => Some(PleInputsPlan {
                model_proj: self.matmul(Proj::Ple, mp, r, true)?,
                gather: self.push(
                    Slot::Ple,
                    Problem::Rows(RowsProblem {
                        rows: r,
                        width: cfg.n_layers * cfg.ple_dim,
                        dtype: t,
                        aux: cfg.ple_dim,
                    }),
                    vec![],
                    GridRule::Rows,
                )?,
            }),
            _ => None,
        };
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for (l, ld) in dims.layers.iter().enumerate() {
            let qkv = ld
                .qkv
                .iter()
                .map(|&m| self.matmul(Proj::Qkv, m, r, false))
                .collect::<Result<Vec<_>, _>>()?;
            let qkv_input = match qkv.split_first() {
                Some((first, rest)) if rest.iter().all(|m| m.input == first.input) => first.input,
                Some((first, _)) => {
                    return Err(PlanError::slot(
                        first.slot,
                        "the Q|K|V runs of different weight types read different activation formats (one input norm writes them)",
                    ))
                }
                None => {
                    return Err(PlanError::slot(
                        Slot::matmul(Proj::Qkv, r),
                        format!("layer {l} has no Q projection"),
                    ))
                }
            };
            let input_norm = self.push(
                Slot::RmsNorm,
                rows_problem(r, d),
                norm_bound(qkv_input, false, true),
                GridRule::Rows,
            )?;
            let o_fmt = self.input_format(Proj::O, ld.o, r)?;
            let attention = self.attention(l, r, o_fmt)?;
            let a = attn_problem(cfg, l, r, &self.sizing);
            let qk_norm_rope = self.push(
                Slot::QkNormRope,
                Problem::Attention(a),
                vec![("Q16", DefineValue::Int(attention.q16 as i64))],
                GridRule::AttnRows {
                    capacity: self.sizing.capacity(cfg, l),
                },
            )?;
            // Dense decode layers run their sandwich norms in the tails of
            // the projections before them where the profile and variants
            // allow (`tail_bound`); a MoE layer's norms also sum and fan
            // out the expert block's operands, so they stay launches.
            let is_moe = ld.moe.is_some();
            let dense = |m: TailMode| if is_moe { TailMode::None } else { m };
            let o_tail = dense(TailMode::Norm(self.input_format(
                Proj::GateUp,
                ld.gate_up,
                r,
            )?));
            let o_bound = self.tail_bound(Proj::O, ld.o, r, o_tail)?;
            let o =
                self.matmul_bound(Proj::O, ld.o, r, attention.out == ActFormat::F32, o_bound)?;
            let gate_up = self.gate_up(ld.gate_up, ld.down, r)?;
            // A MoE layer's attention residual also writes the router input
            // and the experts' input norm (OUTS=3), and the launch that adds
            // the FFN's output sums the shared MLP's and the experts' halves
            // with their post norms (SUM_IN): the PLE's FFN residual where
            // the layer has one, else the layer's end.
            let mut residual_bound = norm_bound(gate_up.input, true, true);
            if is_moe {
                residual_bound.push(("OUTS", DefineValue::Int(3)));
            }
            let attn_residual = match o.tail() {
                TailMode::None => Some(self.push(
                    Slot::RmsNorm,
                    rows_problem(r, d),
                    residual_bound,
                    GridRule::Rows,
                )?),
                _ => None,
            };
            // The layer's end writes the next layer's input norm in its
            // QKV format.
            let next_qkv = match dims.layers.get(l + 1).map(|n| n.qkv.first()) {
                Some(Some(&m)) => Some(self.input_format(Proj::Qkv, m, r)?),
                Some(None) => Some(ActFormat::F32),
                None => None,
            };
            let end_tail = dense(match next_qkv {
                Some(f) => TailMode::Norm(f),
                None => TailMode::Residual,
            });
            let fused = gate_up.fuses_gelu();
            // A fused gate|up writes f32 (a pre-pass converts it where
            // down reads another format) or down's records itself.
            // Down runs the FFN residual (before the PLE) or the layer's
            // end in its tail.
            let down_tail = if ld.ple.is_some() {
                dense(TailMode::Residual)
            } else {
                end_tail
            };
            let down_bound = self.tail_bound(Proj::Down, ld.down, r, down_tail)?;
            let down = self.matmul_bound(
                Proj::Down,
                ld.down,
                r,
                fused && gate_up.output() == ActFormat::F32,
                down_bound,
            )?;
            let gelu = if fused {
                None
            } else {
                Some(self.push(
                    Slot::GeluMul,
                    rows_problem(r, ld.gate_up.0 / 2),
                    out_bound(down.input),
                    GridRule::Rows,
                )?)
            };
            let moe = ld.moe.as_ref().map(|m| self.moe(m, r)).transpose()?;
            let sum_in = |mut b: Vec<(&'static str, DefineValue)>, on: bool| {
                if on {
                    b.push(("SUM_IN", DefineValue::Int(1)));
                }
                b
            };
            let end_sums = is_moe && ld.ple.is_none();
            let end_bound = norm_bound(ActFormat::F32, true, false);
            let ple = match ld.ple {
                Some((g, p)) => {
                    let ffn_residual = match down.tail() {
                        TailMode::None => Some(self.push(
                            Slot::RmsNorm,
                            rows_problem(r, d),
                            sum_in(end_bound.clone(), is_moe),
                            GridRule::Rows,
                        )?),
                        _ => None,
                    };
                    let proj_bound = self.tail_bound(Proj::Ple, p, r, end_tail)?;
                    let proj = self.matmul_bound(Proj::Ple, p, r, false, proj_bound)?;
                    let gate = self.ple_gate(g, proj.input, r)?;
                    let gelu = if gate.bindings().iter().any(|b| b.side) {
                        None
                    } else {
                        Some(self.push(
                            Slot::GeluMul,
                            rows_problem(r, cfg.ple_dim),
                            out_bound(proj.input),
                            GridRule::Rows,
                        )?)
                    };
                    Some(PleLayerPlan {
                        ffn_residual,
                        gate,
                        gelu,
                        proj,
                    })
                }
                None => None,
            };
            let last = match &ple {
                Some(pp) => &pp.proj,
                None => &down,
            };
            let (end_with_next_norm, end) = if last.tail() != TailMode::None {
                (None, None)
            } else {
                let with_next = match next_qkv {
                    Some(f) => Some(self.push(
                        Slot::RmsNorm,
                        rows_problem(r, d),
                        sum_in(norm_bound(f, true, true), end_sums),
                        GridRule::Rows,
                    )?),
                    None => None,
                };
                let end = self.push(
                    Slot::RmsNorm,
                    rows_problem(r, d),
                    sum_in(end_bound, end_sums),
                    GridRule::Rows,
                )?;
                (with_next, Some(end))
            };
            layers.push(LayerPlan {
                input_norm,
                qkv,
                qk_norm_rope,
                attention,
                o,
                attn_residual,
                gate_up,
                gelu,
                down,
                ple,
                moe,
                end_with_next_norm,
                end,
            });
        }
        let head = if r <= GEMV_MAX_ROWS {
            let matmul = self.matmul(Proj::Head, dims.head, r, false)?;
            let norm = self.push(
                Slot::RmsNorm,
                rows_problem(r, d),
                norm_bound(matmul.input, false, true),
                GridRule::Fixed,
            )?;
            let softcap = match cfg.final_logit_softcap {
                Some(_) => Some(self.push(
                    Slot::Softcap,
                    rows_problem(r, dims.vocab),
                    vec![],
                    GridRule::Fixed,
                )?),
                None => None,
            };
            Some(HeadPlan {
                norm,
                matmul,
                softcap,
            })
        } else {
            None
        };
        Ok(BucketPlan {
            rows: r,
            embed,
            per_layer_inputs,
            layers,
            head,
            launches: self.current.iter().copied().collect(),
        })
    }
}
