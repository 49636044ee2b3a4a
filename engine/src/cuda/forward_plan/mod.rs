//! The forward plan: every launch of the CUDA forward pass, decided once at
//! load from the profile, the tuned table, the device's limits and the
//! model's shapes.
//!
//! A plan has one `BucketPlan` per row-count bucket: the decode buckets of
//! 1..=8 rows (each exact) and the prefill buckets, whose bounds are the
//! row counts the tuned table distinguishes (`prefill_bounds`), the last
//! one the chunk size (`ubatch`). A chunk of `t` rows runs the bucket with
//! the smallest bound at or above `t`; because the tuned table picks its
//! entry the same way, that is the variant a plan made at `t` itself would
//! choose. Within a prefill bucket only the grids follow `t`
//! (`ForwardPlan::kernels_at`): the family, defines, binding and formats
//! stay as planned.
//!
//! Per layer the bucket lists, in forward order, what `stages` launches:
//! the input norm, the attention block (QKV projection, Q/K norm with RoPE
//! and the cache write, attention, output projection), the residual add
//! with the FFN input norm, the FFN block, the PLE injection and the layer
//! end (the last residual add with the layer scalar and the next layer's
//! input norm). Each projection is a `MatmulPlan` with its binding, the
//! activation format it reads and the pre-pass that produces it.
//!
//! Resolving needs no GPU (`ForwardPlan::resolve`; the CPU tests resolve
//! every committed profile on sm_80/89/90 and compile the result); loading
//! compiles and loads each distinct launch once (`ForwardPlan::load`).
//! After load the engine asks the planner nothing.

use std::collections::{BTreeSet, HashMap};

use gemtune_kernels::bind::matmul::{MatmulBinding, Prepass};
use gemtune_kernels::bind::ActFormat;
use gemtune_kernels::defines::{canonical, DefineValue};
use gemtune_kernels::families::scale_expand;
use gemtune_kernels::family::{AttnProblem, KvType, LaunchGeometry, Problem, RowsProblem, WType};
use gemtune_kernels::gpu::{Gpu, GpuError};
use gemtune_kernels::quant::GgmlType;
use gemtune_kernels::runtime::{Kernel, KernelCache};

mod moe;

pub use moe::{MoeExperts, MoeGemmPlan, MoeGroupPlan, MoePlan, MOE_GROUP_ROWS};

use super::model_dims::{MatDim, ModelDims};
use super::planner::{Decision, PlanError, Planner, Resolution, GEMV_BLOCK};
use super::slots::{Proj, Slot, GEMV_MAX_ROWS};
use super::weights::{self, ProjLayouts, PLANES_F16, PLANES_F32};
use crate::config::{AttnKind, Gemma4Config};
use crate::work::RowWork;

/// The sizes an engine is built for; they travel together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizing {
    /// Most positions the cache holds.
    pub max_seq: usize,
    /// Most tokens per prefill chunk.
    pub ubatch: usize,
    pub kv_type: KvType,
}

impl Sizing {
    /// Slots of layer `l`'s cache (`Gemma4Config::cache_capacity`).
    pub fn capacity(&self, cfg: &Gemma4Config, l: usize) -> usize {
        cfg.cache_capacity(l, self.max_seq, self.ubatch)
    }
}

/// The prefill buckets' row bounds for chunks of at most `ubatch` rows:
/// every row count above `GEMV_MAX_ROWS` and below `ubatch` at which the
/// tuned table has an entry, then `ubatch`.
pub fn prefill_bounds(planner: &Planner, ubatch: usize) -> Vec<usize> {
    let mut b: BTreeSet<usize> = planner
        .tuned
        .iter()
        .flat_map(|t| t.entries.iter().map(|e| e.m))
        .filter(|&m| m > GEMV_MAX_ROWS && m < ubatch)
        .collect();
    if ubatch > GEMV_MAX_ROWS {
        b.insert(ubatch);
    }
    b.into_iter().collect()
}

/// Index of a launch in `ForwardPlan::launches`.
pub type LaunchId = usize;

/// Which function of a variant's module a launch calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Entry {
    /// The entry `Family::validate` names.
    Main,
    /// `gemm_dq_convert`, the f32 -> DQ pre-pass of a gemm_dq / gemm_wgmma
    /// module, over `[rows][k]`.
    DqConvert { k: usize },
}

/// How a launch's grid follows the rows of a prefill chunk smaller than its
/// bucket's bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GridRule {
    /// The grid never changes (decode launches; row-blocked GEMVs).
    Fixed,
    /// `Family::validate` at the problem with the chunk's rows.
    Rows,
    /// The same for an attention problem over a cache of `capacity` slots
    /// (`capacity` grows to the query count when a chunk exceeds it).
    AttnRows { capacity: usize },
}

/// One launch, resolved.
#[derive(Clone)]
pub struct PlannedLaunch {
    pub slot: Slot,
    pub problem: Problem,
    pub bound: Vec<(&'static str, DefineValue)>,
    pub entry: Entry,
    pub grid: GridRule,
    pub res: Resolution,
}

impl PlannedLaunch {
    /// The geometry of this launch for a prefill chunk of `t` rows.
    fn geometry_at(&self, t: usize, plan: &ForwardPlan) -> Result<LaunchGeometry, PlanError> {
        let err = |msg: String| {
            PlanError::slot(
                self.slot,
                format!("{} rows: {msg} ({})", t, self.problem.describe()),
            )
        };
        if let Entry::DqConvert { k } = self.entry {
            return Ok(MatmulBinding::dq_convert_geometry(t, k));
        }
        let p = match (self.grid, self.problem) {
            (GridRule::Fixed, _) => return Ok(self.res.geo.clone()),
            (GridRule::Rows, Problem::Matmul(mut m)) => {
                m.m = t;
                Problem::Matmul(m)
            }
            (GridRule::Rows, Problem::Rows(mut r)) => {
                r.rows = t;
                Problem::Rows(r)
            }
            (GridRule::Rows, Problem::Moe(mut m)) => {
                m.tokens = t;
                Problem::Moe(m)
            }
            (GridRule::AttnRows { capacity }, Problem::Attention(mut a)) => {
                a.n_q = t;
                a.capacity = capacity.max(t);
                Problem::Attention(a)
            }
            (rule, p) => return Err(err(format!("grid rule {rule:?} on {}", p.describe()))),
        };
        self.res
            .family
            .validate(&self.res.defines, &p, &plan.limits)
            .map_err(err)
    }
}

/// The pre-pass producing a projection's input from an f32 buffer.
#[derive(Clone, Copy, Debug)]
pub struct PrepassPlan {
    pub kind: Prepass,
    pub launch: LaunchId,
}

/// How a projection runs.
#[derive(Clone, Debug)]
pub enum MatmulExec {
    /// One launch of a matmul family.
    Kernel {
        launch: LaunchId,
        binding: MatmulBinding,
    },
    /// A GEMV variant serving a prefill slot: launches on row blocks of at
    /// most `GEMV_BLOCK` rows; `blocks[i]` serves a block of `i + 1` rows.
    RowBlocks {
        blocks: Vec<(LaunchId, MatmulBinding)>,
    },
    /// cuBLAS's bf16 GEMM on weights dequantized at load, after
    /// `act_convert` turned the f32 input into bf16.
    Vendor { convert: LaunchId },
}

/// One projection at a bucket's rows.
#[derive(Clone, Debug)]
pub struct MatmulPlan {
    pub proj: Proj,
    pub slot: Slot,
    /// (n, k, type) of the matrix as planned.
    pub dim: MatDim,
    /// The format the projection reads its input in.
    pub input: ActFormat,
    /// When the input comes from an f32 buffer and the variant reads
    /// another format: the pre-pass that writes it into the `act` buffer.
    pub prepass: Option<PrepassPlan>,
    /// The `scale_expand` launch that writes the kernel's scale plane
    /// (`PLANES_F32`) from the GEMV's into the scale scratch buffer before
    /// it runs (`Profile::expand_gemm_scales`); `None`: the kernel reads
    /// the matrix's own planes.
    pub scales: Option<LaunchId>,
    pub exec: MatmulExec,
}

impl MatmulPlan {
    /// The bindings of this projection's launches (one, or per row block).
    pub fn bindings(&self) -> Vec<MatmulBinding> {
        match &self.exec {
            MatmulExec::Kernel { binding, .. } => vec![*binding],
            MatmulExec::RowBlocks { blocks } => blocks.iter().map(|b| b.1).collect(),
            MatmulExec::Vendor { .. } => Vec::new(),
        }
    }
    /// The fused gate+up GEMV: writes `gelu(gate) * up` in f32 itself.
    pub fn fuses_gelu(&self) -> bool {
        self.bindings().iter().any(|b| b.matrices == 2)
    }
}

/// One attention call: the kernel and how Q and O travel.
#[derive(Clone, Copy, Debug)]
pub struct AttnPlan {
    pub launch: LaunchId,
    pub kind: AttnKind,
    /// The attention reads Q in the cache type, so `qk_norm_rope` writes
    /// it so (`Q16 = 1`).
    pub q16: bool,
    /// The format O is written in: the output projection's input format
    /// when the variant can write it (no conversion pass between them),
    /// otherwise f32.
    pub out: ActFormat,
}

/// The per-layer-embedding injection of one layer (E2B/E4B).
#[derive(Clone, Debug)]
pub struct PleLayerPlan {
    /// `x += rmsnorm(y) * post_ffw_norm` (the FFN residual, nothing else).
    pub ffn_residual: LaunchId,
    /// `inp_gate` projection of the residual stream.
    pub gate: MatmulPlan,
    /// `gelu(gate) * ple[l]`, written in `proj`'s input format.
    pub gelu: LaunchId,
    pub proj: MatmulPlan,
}

/// One decoder layer at a bucket's rows.
#[derive(Clone, Debug)]
pub struct LayerPlan {
    /// `act = rmsnorm(x) * attn_norm`, in `qkv`'s format: the first layer,
    /// and the first after the rows were compacted (otherwise the previous
    /// layer's end writes it).
    pub input_norm: LaunchId,
    /// One projection per Q|K|V run (`LayerDims::qkv`), all reading the
    /// input norm's one format.
    pub qkv: Vec<MatmulPlan>,
    pub qk_norm_rope: LaunchId,
    pub attention: AttnPlan,
    pub o: MatmulPlan,
    /// `x += rmsnorm(y) * post_attention_norm`, then `act = rmsnorm(x) *
    /// ffn_norm` in `gate_up`'s format.
    pub attn_residual: LaunchId,
    pub gate_up: MatmulPlan,
    /// `gelu(gate) * up` in `down`'s format; `None` when the gate/up GEMV
    /// fuses it.
    pub gelu: Option<LaunchId>,
    pub down: MatmulPlan,
    pub ple: Option<PleLayerPlan>,
    /// The expert block of a MoE layer (after the dense FFN above, which
    /// is its shared MLP).
    pub moe: Option<MoePlan>,
    /// The layer's last residual add (the FFN's, or the PLE's) times the
    /// layer scalar, then the next layer's input norm in its `qkv` format.
    pub end_with_next_norm: Option<LaunchId>,
    /// The same without the next norm (the last layer, or before the rows
    /// are compacted).
    pub end: LaunchId,
}

impl LayerPlan {
    /// The format every Q|K|V run reads (the input norm writes it).
    pub fn qkv_input(&self) -> ActFormat {
        self.qkv.first().map_or(ActFormat::F32, |m| m.input)
    }
}

/// The per-layer inputs of E2B/E4B.
#[derive(Clone, Debug)]
pub struct PleInputsPlan {
    /// The model projection of the scaled embedding.
    pub model_proj: MatmulPlan,
    /// Gather, chunk norm, sum and 1/sqrt 2 (`ple` kernel).
    pub gather: LaunchId,
}

/// Final norm, tied head and softcap.
#[derive(Clone, Debug)]
pub struct HeadPlan {
    pub norm: LaunchId,
    pub matmul: MatmulPlan,
    pub softcap: Option<LaunchId>,
}

/// Every launch of a chunk of at most `rows` rows.
#[derive(Clone, Debug)]
pub struct BucketPlan {
    pub rows: usize,
    pub embed: LaunchId,
    pub per_layer_inputs: Option<PleInputsPlan>,
    pub layers: Vec<LayerPlan>,
    /// Decode buckets only: the head runs at most `GEMV_MAX_ROWS` rows.
    pub head: Option<HeadPlan>,
    /// Every launch of the bucket, ascending.
    pub launches: Vec<LaunchId>,
}

/// Adds the layouts projection `m`'s launches read. A kernel whose scale
/// plane is expanded per launch reads the GEMV layout's quant and scale
/// planes (the expansion's input), not a resident f32 plane. F16/BF16
/// values are the same bytes in every planes layout (they have no scale
/// plane), so they count as the GEMV's: a 16-bit matrix must not make the
/// quantized matrices of its projection group upload a second scale plane.
fn add_layouts(lay: &mut ProjLayouts, m: &MatmulPlan) {
    let l = lay.get_mut(m.proj);
    if matches!(m.exec, MatmulExec::Vendor { .. }) {
        l.bf16 = true;
    }
    let w16 = WType::of(m.dim.2).is_some_and(|t| t.is_16bit());
    for b in m.bindings() {
        if (m.scales.is_some() || w16) && b.layout == PLANES_F32 {
            l.add(PLANES_F16);
        } else {
            l.add(b.layout);
        }
    }
}

/// Bytes of the scale scratch buffer: the largest GEMM scale plane any
/// `scale_expand` launch of the plan writes (0 when none does).
pub fn scale_scratch_bytes(plan: &ForwardPlan) -> usize {
    plan.launches
        .iter()
        .filter(|l| l.slot == Slot::ScaleExpand)
        .filter_map(|l| match l.problem {
            Problem::Matmul(m) => {
                WType::of(m.wtype).map(|wt| scale_expand::dst_bytes(wt, m.n * (m.k / 32)))
            }
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

/// Whether the tied head can read the embedding table's device copy (its
/// GGUF bytes) instead of a copy of its own: the head reads the table's
/// type in the file's bytes, which is GGUF blocks in any type, and any
/// kernel layout of F16/BF16 (their values are read as stored).
fn head_shares_table(dims: &ModelDims, head: weights::Layouts) -> bool {
    let Some(wt) = WType::of(dims.head.2) else {
        return false;
    };
    let as_stored = weights::Layouts {
        blocks: true,
        ..Default::default()
    };
    dims.head.2 == dims.embd_type
        && !head.bf16
        && (head == as_stored || (wt.is_16bit() && head != weights::Layouts::default()))
}

/// The whole forward pass, resolved.
pub struct ForwardPlan {
    pub sizing: Sizing,
    pub limits: gemtune_kernels::family::DeviceLimits,
    /// Every distinct launch.
    pub launches: Vec<PlannedLaunch>,
    /// Decode buckets (1..=8 rows) first, then the prefill buckets by bound.
    pub buckets: Vec<BucketPlan>,
    pub layouts: ProjLayouts,
    /// Some slot is served by cuBLAS.
    pub uses_vendor: bool,
    /// The first layer that carries only the rows whose logits are
    /// wanted: `Gemma4Config::compact_from`, or `n_layers` after
    /// `set_row_work(RowWork::Full)`.
    pub compact_from: usize,
    pub profile: String,
    /// Slot resolutions the planner made while building this plan.
    pub lookups: usize,
}

/// The problem of a rows-family launch.
pub fn rows_problem(rows: usize, width: usize) -> Problem {
    Problem::Rows(RowsProblem {
        rows,
        width,
        dtype: GgmlType::F32,
        aux: 0,
    })
}

/// The bound defines of an `rmsnorm` launch.
fn norm_bound(out: ActFormat, add: bool, norm_out: bool) -> Vec<(&'static str, DefineValue)> {
    vec![
        ("OUT", DefineValue::Str(out.define().into())),
        ("ADD", DefineValue::Int(add as i64)),
        ("NORM_OUT", DefineValue::Int(norm_out as i64)),
    ]
}

fn out_bound(out: ActFormat) -> Vec<(&'static str, DefineValue)> {
    vec![("OUT", DefineValue::Str(out.define().into()))]
}

/// The attention problem a launch of `n_q` queries on layer `l` is planned
/// for: only launch-shaping dimensions. Decode (at most 8 queries) is
/// planned at the largest length the cache reaches, so its fixed grid
/// covers every later call (the kernel reads the true length on device);
/// prefill at position 0, its grid depending on the query count only.
pub fn attn_problem(cfg: &Gemma4Config, l: usize, n_q: usize, s: &Sizing) -> AttnProblem {
    let lc = &cfg.layers[l];
    let cap = s.capacity(cfg, l);
    let decode = n_q <= GEMV_MAX_ROWS;
    AttnProblem {
        n_heads: lc.n_heads,
        n_kv_heads: lc.n_kv_heads,
        head_dim: lc.head_dim,
        window: window(cfg, l),
        q_pos0: if decode {
            s.max_seq.saturating_sub(n_q)
        } else {
            0
        },
        n_q,
        capacity: if decode { cap } else { cap.max(n_q) },
        kv_type: s.kv_type,
    }
}

/// The sliding window of layer `l` (0 on full layers).
pub fn window(cfg: &Gemma4Config, l: usize) -> usize {
    match cfg.layers[l].kind {
        AttnKind::Sliding => cfg.sliding_window,
        AttnKind::Full => 0,
    }
}

/// Bytes of the split-KV partials the decode attention needs at most.
pub fn attn_scratch_bytes(cfg: &Gemma4Config, s: &Sizing) -> usize {
    let s32 = Sizing {
        kv_type: KvType::F32,
        ..*s
    };
    (0..cfg.n_layers)
        .map(|l| {
            gemtune_kernels::bind::attention::decode_scratch_bytes(&attn_problem(
                cfg,
                l,
                GEMV_MAX_ROWS,
                &s32,
            ))
        })
        .max()
        .unwrap_or(0)
}

/// Builds a plan: resolves each distinct launch once.
struct Builder<'a> {
    planner: &'a Planner,
    cfg: &'a Gemma4Config,
    sizing: Sizing,
    launches: Vec<PlannedLaunch>,
    index: HashMap<String, LaunchId>,
    /// The launches of the bucket being built.
    current: BTreeSet<LaunchId>,
    /// Whether the bucket being built is a prefill bucket.
    prefill: bool,
}

impl Builder<'_> {
    fn push(
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
            let id = self.push(slot, Problem::matmul(m, n, k, t), vec![], GridRule::Rows)?;
            let binding = self.binding(id)?;
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

    /// Layer `l`'s attention call at `r` rows, its O written in `o_fmt`
    /// where the resolved variant can write it.
    fn attention(&mut self, l: usize, r: usize, o_fmt: ActFormat) -> Result<AttnPlan, PlanError> {
        let kind = self.cfg.layers[l].kind;
        let slot = Slot::attention(kind, r);
        let a = attn_problem(self.cfg, l, r, &self.sizing);
        let p = Problem::Attention(a);
        let first = self.planner.resolve(slot, &p, &[])?;
        let q16 = first.defines.get("Q16") == Some(&DefineValue::Int(1));
        let mut d = first.defines.clone();
        d.insert("OUT".into(), DefineValue::Str(o_fmt.define().into()));
        let writes = o_fmt != ActFormat::F32
            && first.family.declared_defines().iter().any(|x| x == "OUT")
            && first.family.validate(&d, &p, &self.planner.limits).is_ok();
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

    fn bucket(&mut self, dims: &ModelDims, r: usize) -> Result<BucketPlan, PlanError> {
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
            let o = self.matmul(Proj::O, ld.o, r, attention.out == ActFormat::F32)?;
            let gate_up = self.matmul(Proj::GateUp, ld.gate_up, r, false)?;
            // A MoE layer's attention residual also writes the router input
            // and the experts' input norm (OUTS=3), and the launch that adds
            // the FFN's output sums the shared MLP's and the experts' halves
            // with their post norms (SUM_IN): the PLE's FFN residual where
            // the layer has one, else the layer's end.
            let is_moe = ld.moe.is_some();
            let mut residual_bound = norm_bound(gate_up.input, true, true);
            if is_moe {
                residual_bound.push(("OUTS", DefineValue::Int(3)));
            }
            let attn_residual = self.push(
                Slot::RmsNorm,
                rows_problem(r, d),
                residual_bound,
                GridRule::Rows,
            )?;
            let fused = gate_up.fuses_gelu();
            let down = self.matmul(Proj::Down, ld.down, r, fused)?;
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
                    let ffn_residual = self.push(
                        Slot::RmsNorm,
                        rows_problem(r, d),
                        sum_in(end_bound.clone(), is_moe),
                        GridRule::Rows,
                    )?;
                    let gate = self.matmul(Proj::Ple, g, r, true)?;
                    let proj = self.matmul(Proj::Ple, p, r, false)?;
                    let gelu = self.push(
                        Slot::GeluMul,
                        rows_problem(r, cfg.ple_dim),
                        out_bound(proj.input),
                        GridRule::Rows,
                    )?;
                    Some(PleLayerPlan {
                        ffn_residual,
                        gate,
                        gelu,
                        proj,
                    })
                }
                None => None,
            };
            let end_with_next_norm = match dims.layers.get(l + 1) {
                Some(next) => {
                    let f = match next.qkv.first() {
                        Some(&m) => self.input_format(Proj::Qkv, m, r)?,
                        None => ActFormat::F32,
                    };
                    Some(self.push(
                        Slot::RmsNorm,
                        rows_problem(r, d),
                        sum_in(norm_bound(f, true, true), end_sums),
                        GridRule::Rows,
                    )?)
                }
                None => None,
            };
            let end = self.push(
                Slot::RmsNorm,
                rows_problem(r, d),
                sum_in(end_bound, end_sums),
                GridRule::Rows,
            )?;
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

/// Refuses a model with a feature the CUDA stages do not implement. Every
/// Gemma 4 feature has its stages (the 26B-A4B expert block: `cuda::moe`),
/// so only a MoE shape the router and expert kernels cannot hold is
/// refused here.
pub fn refuse_unsupported(cfg: &Gemma4Config) -> Result<(), PlanError> {
    match &cfg.moe {
        Some(moe) if moe.n_experts_used > gemtune_kernels::families::moe_gemv::MAX_USED => {
            Err(PlanError::Unsupported(format!(
                "top-{} routing (the expert kernels hold at most {} experts per token)",
                moe.n_experts_used,
                gemtune_kernels::families::moe_gemv::MAX_USED
            )))
        }
        _ => Ok(()),
    }
}

impl ForwardPlan {
    /// Resolves every launch of every bucket (no GPU work).
    pub fn resolve(
        planner: &Planner,
        cfg: &Gemma4Config,
        dims: &ModelDims,
        sizing: Sizing,
    ) -> Result<ForwardPlan, PlanError> {
        refuse_unsupported(cfg)?;
        let before = planner.lookups();
        let mut b = Builder {
            planner,
            cfg,
            sizing,
            launches: Vec::new(),
            index: HashMap::new(),
            current: BTreeSet::new(),
            prefill: false,
        };
        let mut rows: Vec<usize> = (1..=GEMV_MAX_ROWS.min(sizing.ubatch)).collect();
        rows.extend(prefill_bounds(planner, sizing.ubatch));
        let mut buckets = Vec::with_capacity(rows.len());
        for r in rows {
            buckets.push(b.bucket(dims, r)?);
        }
        let mut layouts = ProjLayouts::default();
        let mut moe_layouts = (weights::Layouts::default(), weights::Layouts::default());
        let union = |a: weights::Layouts, b: weights::Layouts| weights::Layouts {
            planes_f16: a.planes_f16 || b.planes_f16,
            planes_f32: a.planes_f32 || b.planes_f32,
            blocks: a.blocks || b.blocks,
            bf16: a.bf16 || b.bf16,
        };
        let mut uses_vendor = false;
        for bk in &buckets {
            let mut each = |m: &MatmulPlan| {
                uses_vendor |= matches!(m.exec, MatmulExec::Vendor { .. });
                add_layouts(&mut layouts, m);
            };
            if let Some(p) = &bk.per_layer_inputs {
                each(&p.model_proj);
            }
            for l in &bk.layers {
                for m in &l.qkv {
                    each(m);
                }
                each(&l.o);
                each(&l.gate_up);
                each(&l.down);
                if let Some(p) = &l.ple {
                    each(&p.gate);
                    each(&p.proj);
                }
                if let Some(m) = &l.moe {
                    moe_layouts.0 = union(moe_layouts.0, m.gate_up_layout);
                    moe_layouts.1 = union(moe_layouts.1, m.down_layout);
                }
            }
            if let Some(h) = &bk.head {
                each(&h.matmul);
            }
        }
        layouts.experts_gate_up = moe_layouts.0;
        layouts.experts_down = moe_layouts.1;
        layouts.head_native = head_shares_table(dims, layouts.get(Proj::Head));
        layouts.embd_on_head = dims.embd_on_head;
        layouts.head_type = WType::of(dims.head.2);
        Ok(ForwardPlan {
            sizing,
            limits: planner.limits.clone(),
            launches: b.launches,
            buckets,
            layouts,
            uses_vendor,
            compact_from: cfg.compact_from(),
            profile: planner.profile.name.clone(),
            lookups: planner.lookups() - before,
        })
    }

    /// Sets the first layer that carries only the wanted rows: the
    /// model's (`Gemma4Config::compact_from`, what `resolve` plans) or
    /// none under `RowWork::Full`. Both run on the planned buckets: the
    /// trimmed layers on the one-row bucket, or on the chunk's.
    pub fn set_row_work(&mut self, cfg: &Gemma4Config, row_work: RowWork) {
        self.compact_from = row_work.compact_from(cfg);
    }

    /// The tile rows of the grouped expert GEMMs when some bucket runs
    /// them (every bucket's come from the one `moe_gemm` slot).
    pub fn moe_gemm_bm(&self) -> Option<usize> {
        self.buckets
            .iter()
            .flat_map(|b| &b.layers)
            .filter_map(|l| match l.moe.as_ref().map(|m| &m.experts) {
                Some(MoeExperts::Grouped(g)) => Some(g.bm),
                _ => None,
            })
            .max()
    }

    /// The bucket a chunk of `rows` rows runs (`rows` >= 1 and at most
    /// the chunk size).
    pub fn bucket(&self, rows: usize) -> Option<&BucketPlan> {
        if rows <= GEMV_MAX_ROWS {
            return self.buckets.get(rows.checked_sub(1)?);
        }
        self.buckets[GEMV_MAX_ROWS.min(self.buckets.len())..]
            .iter()
            .find(|b| b.rows >= rows)
    }

    /// Compiles and loads every launch, each distinct (family, defines)
    /// module once.
    pub fn load(&self, gpu: &Gpu, cache: &KernelCache) -> Result<LoadedKernels, PlanError> {
        let mut kernels = Vec::with_capacity(self.launches.len());
        let mut combine = Vec::with_capacity(self.launches.len());
        for l in &self.launches {
            let gpu_err = |err: GpuError| PlanError::Gpu {
                slot: l.slot.name().to_string(),
                err,
            };
            let k = cache
                .kernel(gpu, l.res.family, &l.res.defines, l.res.geo.clone())
                .map_err(gpu_err)?;
            let c = match l.problem {
                Problem::Attention(a) => {
                    gemtune_kernels::bind::attention::combine_kernel(&k, &a).map_err(gpu_err)?
                }
                _ => None,
            };
            kernels.push(k);
            combine.push(c);
        }
        Ok(LoadedKernels { kernels, combine })
    }

    /// The kernels of bucket `b` with their grids for a chunk of `t` rows
    /// (`t` below the bucket's bound; launches outside the bucket keep
    /// their planned geometry).
    pub fn kernels_at(
        &self,
        loaded: &LoadedKernels,
        b: &BucketPlan,
        t: usize,
    ) -> Result<Vec<Kernel>, PlanError> {
        let mut out = loaded.kernels.clone();
        for &id in &b.launches {
            let l = &self.launches[id];
            if l.grid == GridRule::Fixed {
                continue;
            }
            let geo = l.geometry_at(t, self)?;
            out[id] = if geo.kernel == out[id].geo.kernel {
                out[id].with_geometry(geo)
            } else {
                out[id].sibling(geo).map_err(|err| PlanError::Gpu {
                    slot: l.slot.name().to_string(),
                    err,
                })?
            };
        }
        Ok(out)
    }

    /// Every decision, for `run -v`: one per launch.
    pub fn decisions(&self) -> Vec<Decision> {
        self.launches
            .iter()
            .filter(|l| l.entry == Entry::Main)
            .map(|l| Decision {
                slot: l.slot.name().to_string(),
                problem: l.problem.describe(),
                family: l.res.family.name().to_string(),
                defines: canonical(&l.res.defines),
                why: l.res.why.clone(),
            })
            .collect()
    }

    /// The plan as `run -v` prints it: the buckets, then each distinct
    /// (slot, variant) with the bucket rows it serves and why it was
    /// chosen.
    pub fn describe(&self) -> Vec<String> {
        let bounds: Vec<String> = self.buckets.iter().map(|b| b.rows.to_string()).collect();
        let mut v = vec![format!(
            "plan: {} launches over {} row buckets ({}), profile {}; layers from {} carry only the rows whose logits are wanted",
            self.launches.len(),
            self.buckets.len(),
            bounds.join(", "),
            self.profile,
            self.compact_from
        )];
        let mut rows_of: Vec<(String, BTreeSet<usize>)> = Vec::new();
        for b in &self.buckets {
            for &id in &b.launches {
                let l = &self.launches[id];
                if l.entry != Entry::Main {
                    continue;
                }
                let line = format!(
                    "{}: {} {} <- {}",
                    l.slot,
                    l.res.family.name(),
                    canonical(&l.res.defines),
                    l.res.why
                );
                match rows_of.iter_mut().find(|(s, _)| *s == line) {
                    Some((_, r)) => {
                        r.insert(b.rows);
                    }
                    None => rows_of.push((line, BTreeSet::from([b.rows]))),
                }
            }
        }
        rows_of.sort_by_key(|(s, _)| Slot::from_name(s.split(':').next().unwrap_or("")));
        for (line, rows) in rows_of {
            let r: Vec<String> = rows.iter().map(|r| r.to_string()).collect();
            v.push(format!("{line} [rows {}]", r.join(",")));
        }
        v
    }
}

/// The loaded kernel of every launch (`ForwardPlan::launches` order), and
/// the combine that follows a decode attention launch with splits.
pub struct LoadedKernels {
    pub kernels: Vec<Kernel>,
    pub combine: Vec<Option<Kernel>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::model_dims::model_bytes;
    use crate::profile::Profile;
    use crate::synth::{self, SynthVariant, WeightType};
    use gemtune_kernels::compile::Arch;
    use gemtune_kernels::family::DeviceLimits;

    fn plan(profile: &str, v: SynthVariant, ubatch: usize) -> (ForwardPlan, Planner) {
        let planner = Planner::new(
            Profile::load(profile).expect("profile"),
            None,
            DeviceLimits::for_arch(Arch(90)),
        );
        let cfg = synth::preset(v);
        let wt = WeightType::Q8_0;
        let dims = ModelDims::from_config(
            &cfg,
            wt.matrix_type(),
            wt.embedding_type(cfg.d_model as u64),
            &planner,
        );
        let sizing = Sizing {
            max_seq: 4096.min(cfg.context_length),
            ubatch,
            kv_type: KvType::F16,
        };
        let p = ForwardPlan::resolve(&planner, &cfg, &dims, sizing).expect("plan");
        (p, planner)
    }

    /// The sm_90 plan of `profile` for a synthetic model of `cfg` in `w`
    /// (4096 positions, 512-token chunks), with its shapes.
    fn synth_plan(
        profile: &str,
        cfg: &Gemma4Config,
        w: WeightType,
        what: &str,
    ) -> (ForwardPlan, ModelDims) {
        let planner = Planner::new(
            Profile::load(profile).expect("profile"),
            None,
            DeviceLimits::for_arch(Arch(90)),
        );
        let dims = ModelDims::of_synth(cfg, w, &planner);
        let sizing = Sizing {
            max_seq: 4096,
            ubatch: 512,
            kv_type: KvType::F16,
        };
        let plan = ForwardPlan::resolve(&planner, cfg, &dims, sizing)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        (plan, dims)
    }

    #[test]
    fn buckets_cover_every_chunk_length() {
        let (p, _) = plan("main", SynthVariant::E4b, 512);
        for t in 1..=512 {
            let b = p.bucket(t).expect("a bucket");
            assert!(b.rows >= t, "{t} rows in a bucket of {}", b.rows);
            if t <= GEMV_MAX_ROWS {
                assert_eq!(b.rows, t);
                assert!(b.head.is_some());
            } else {
                assert!(b.head.is_none());
            }
        }
        assert!(p.bucket(0).is_none() && p.bucket(513).is_none());
    }

    #[test]
    fn every_bucket_plans_every_layer_and_each_launch_is_resolved_once() {
        let (p, planner) = plan("main", SynthVariant::E2b, 2048);
        let cfg = synth::preset(SynthVariant::E2b);
        assert_eq!(p.lookups, planner.lookups());
        for b in &p.buckets {
            assert_eq!(b.layers.len(), cfg.n_layers);
            assert!(b.per_layer_inputs.is_some(), "E2B has per-layer inputs");
            for (l, lp) in b.layers.iter().enumerate() {
                assert_eq!(lp.ple.is_some(), cfg.ple_dim > 0);
                assert_eq!(lp.end_with_next_norm.is_some(), l + 1 < cfg.n_layers);
                // The MoE modes of the norm stay off on a dense model.
                assert!(lp.moe.is_none());
                for id in [Some(lp.attn_residual), Some(lp.end), lp.end_with_next_norm]
                    .into_iter()
                    .flatten()
                {
                    let d = &p.launches[id].res.defines;
                    assert_eq!(d.get("SUM_IN"), Some(&DefineValue::Int(0)));
                    assert_eq!(d.get("OUTS"), Some(&DefineValue::Int(1)));
                }
            }
        }
        let mut keys = BTreeSet::new();
        for l in &p.launches {
            assert!(keys.insert((
                l.slot,
                l.problem.describe(),
                format!("{:?}", l.bound),
                format!("{:?}", l.entry),
                format!("{:?}", l.grid)
            )));
        }
    }

    #[test]
    fn prefill_geometry_follows_the_chunk_rows() {
        let (p, _) = plan("main", SynthVariant::E4b, 2048);
        let b = p.bucket(2048).expect("bucket");
        for &id in &b.launches {
            let l = &p.launches[id];
            let full = l.geometry_at(2048, &p).expect("geometry at the bound");
            assert_eq!(full.grid, l.res.geo.grid, "{}", l.slot);
            let small = l.geometry_at(100, &p).expect("geometry at 100 rows");
            if l.grid != GridRule::Fixed {
                let (a, z) = (full.grid, small.grid);
                assert!(
                    a.0 as u64 * a.1 as u64 * a.2 as u64 >= z.0 as u64 * z.1 as u64 * z.2 as u64,
                    "{}: {a:?} at 2048 rows, {z:?} at 100",
                    l.slot
                );
            }
        }
    }

    /// Synthetic E4B and 12B files in the k-quant mixes and the 16-bit
    /// types plan under `main` and `strict` with every projection read in
    /// its file type and nothing converted: a Q|K|V whose parts' types
    /// differ (the mixes' Q6_K `attn_v` beside Q4_K/Q5_K Q and K) is planned
    /// as one launch per run of one type. The device bytes follow the
    /// layouts each profile reads.
    #[test]
    fn kquant_and_16bit_files_plan_their_own_types() {
        use crate::synth::mix;
        for v in [SynthVariant::E4b, SynthVariant::B12] {
            let cfg = synth::preset(v);
            let specs = crate::plan::tensor_plan(&cfg);
            for w in [
                WeightType::Q4KM,
                WeightType::Q5KM,
                WeightType::Q6K,
                WeightType::F16,
                WeightType::Bf16,
            ] {
                let types = mix::tensor_types(&specs, cfg.n_layers, w);
                let ty: HashMap<&str, GgmlType> = specs
                    .iter()
                    .map(|s| s.name.as_str())
                    .zip(types.iter().copied())
                    .collect();
                for profile in ["main", "strict"] {
                    let what = format!("{} {} {profile}", v.name(), w.name());
                    let (plan, dims) = synth_plan(profile, &cfg, w, &what);
                    let name = |l: usize, s: &str| crate::plan::layer_tensor_name(l, s);
                    let mut mixed = 0;
                    for (l, ld) in dims.layers.iter().enumerate() {
                        for (dim, part) in [
                            (ld.o, "attn_output"),
                            (ld.gate_up, "ffn_gate"),
                            (ld.gate_up, "ffn_up"),
                            (ld.down, "ffn_down"),
                        ] {
                            assert_eq!(dim.2, ty[name(l, part).as_str()], "{what} {l} {part}");
                        }
                        let qkv: Vec<GgmlType> = ["attn_q", "attn_k", "attn_v"]
                            .iter()
                            .filter(|p| cfg.layers[l].owns_kv() || **p == "attn_q")
                            .filter_map(|p| ty.get(name(l, p).as_str()).copied())
                            .collect();
                        // One run per change of type along Q, K, V, each
                        // in its parts' own type.
                        let mut want: Vec<GgmlType> = qkv.clone();
                        want.dedup();
                        let got: Vec<GgmlType> = ld.qkv.iter().map(|m| m.2).collect();
                        assert_eq!(got, want, "{what} {l} qkv runs");
                        mixed += (want.len() > 1) as usize;
                        let n: usize = ld.qkv.iter().map(|m| m.0).sum();
                        let b = &plan.buckets[0].layers[l];
                        assert_eq!(b.qkv.len(), ld.qkv.len(), "{what} {l}");
                        assert!(b.qkv.iter().all(|m| m.input == b.qkv_input()));
                        let lc = &cfg.layers[l];
                        let kv = match (lc.owns_kv(), lc.k_eq_v) {
                            (false, _) => 0,
                            (true, true) => lc.kv_dim(),
                            (true, false) => 2 * lc.kv_dim(),
                        };
                        assert_eq!(n, lc.q_dim() + kv, "{what} {l} qkv width");
                    }
                    // Nothing is converted: every matrix and the Q6_K tied
                    // head are read in their own types.
                    assert!(dims.converted.is_empty(), "{what}: {:?}", dims.converted);
                    let mixes = matches!(w, WeightType::Q4KM | WeightType::Q5KM);
                    assert_eq!(mixed > 0, mixes, "{what}: {mixed} mixed Q|K|V groups");
                    if let Some(mp) = dims.ple_model_proj {
                        assert_eq!(mp.2, ty["per_layer_model_proj.weight"], "{what}");
                    }
                    // The bytes: exactly the sum of each matrix in the
                    // layouts the plan reads, and for the uniform files
                    // under strict (one layout, the GEMV's, and the head
                    // on the table) the file's bytes, Q6_K's record
                    // padding apart.
                    let bytes = model_bytes(&dims, &plan.layouts);
                    let ratio = bytes as f64 / dims.file_bytes as f64;
                    eprintln!(
                        "{what}: weights {bytes} B on the device, {} B in the file ({ratio:.4}x), {} converted",
                        dims.file_bytes,
                        dims.converted.len()
                    );
                    if profile == "strict" && !mixes {
                        assert!(
                            plan.layouts.head_native,
                            "{what}: the head has its own copy"
                        );
                        let bound = if w == WeightType::Q6K {
                            216.0 / 210.0
                        } else {
                            1.0
                        };
                        assert!(ratio <= bound + 1e-9, "{what}: {ratio:.4}x the file");
                    }
                    assert!(ratio < 2.0, "{what}: {ratio:.4}x the file");
                }
            }
        }
    }

    /// `main` expands each quantized prefill GEMM's scale plane from the
    /// GEMV's before it runs (`gemm_scales = "expand"`): prefill buckets
    /// plan one `scale_expand` per such GEMM, decode buckets none, and the
    /// weights but the head's own copy take the file's bytes (Q6_K: its
    /// records' padding apart), so no quantized matrix uploads the GEMMs'
    /// plane (16-bit ones have none).
    /// `resident-scales` uploads both planes, so more bytes for every
    /// quantized file and the same for BF16.
    #[test]
    fn expanded_gemm_scales_keep_the_weights_at_the_files_bytes() {
        use crate::synth::mix;
        for v in [SynthVariant::E4b, SynthVariant::B12] {
            let cfg = synth::preset(v);
            for w in [
                WeightType::Q8_0,
                WeightType::Q4_0,
                WeightType::Q4KM,
                WeightType::Q5KM,
                WeightType::Q6K,
                WeightType::Bf16,
            ] {
                let mut bytes = Vec::new();
                for profile in ["main", "resident-scales"] {
                    let what = format!("{} {} {profile}", v.name(), w.name());
                    let (plan, dims) = synth_plan(profile, &cfg, w, &what);
                    let expand = profile == "main";
                    let mut expanded = 0;
                    for b in &plan.buckets {
                        let prefill = b.rows > GEMV_MAX_ROWS;
                        for l in &b.layers {
                            let mut ms: Vec<&MatmulPlan> = l.qkv.iter().collect();
                            ms.extend([&l.o, &l.gate_up, &l.down]);
                            for m in ms {
                                let quantized = WType::of(m.dim.2).is_some_and(|t| !t.is_16bit());
                                let f32_planes =
                                    m.bindings().iter().any(|b| b.layout == PLANES_F32);
                                assert_eq!(
                                    m.scales.is_some(),
                                    expand && prefill && quantized && f32_planes,
                                    "{what} bucket {} {:?}",
                                    b.rows,
                                    m.proj
                                );
                                if let Some(id) = m.scales {
                                    assert_eq!(plan.launches[id].slot, Slot::ScaleExpand);
                                    assert_eq!(
                                        plan.launches[id].problem,
                                        Problem::matmul(1, m.dim.0, m.dim.1, m.dim.2)
                                    );
                                    expanded += 1;
                                }
                            }
                        }
                    }
                    let quantized = w != WeightType::Bf16;
                    assert_eq!(expanded > 0, expand && quantized, "{what}: {expanded}");
                    assert_eq!(
                        scale_scratch_bytes(&plan) > 0,
                        expand && quantized,
                        "{what}"
                    );
                    if expand {
                        // The head's own copy apart, unless it is the
                        // table's one copy (the gather reads its planes).
                        let mut no_head = plan.layouts;
                        no_head.head_native = !dims.embd_on_head;
                        let b = model_bytes(&dims, &no_head) as f64;
                        let ratio = b / dims.file_bytes as f64;
                        let types =
                            mix::tensor_types(&crate::plan::tensor_plan(&cfg), cfg.n_layers, w);
                        let bound = if types.contains(&GgmlType::Q6K) {
                            216.0 / 210.0
                        } else {
                            1.0
                        };
                        eprintln!("{what}: weights but the head {ratio:.4}x the file");
                        assert!(ratio <= bound + 1e-9, "{what}: {ratio:.4}x the file");
                        assert!(ratio > 0.95, "{what}: {ratio:.4}x the file");
                    }
                    bytes.push(model_bytes(&dims, &plan.layouts));
                }
                if w == WeightType::Bf16 {
                    assert_eq!(bytes[0], bytes[1], "{} bf16", v.name());
                } else {
                    assert!(bytes[0] < bytes[1], "{} {}: {bytes:?}", v.name(), w.name());
                }
            }
        }
    }

    /// `main` decodes the k-quant projections of a Q4_K_M file on split Q8
    /// records that their inputs' producers write once per step: the
    /// norms and gelu_mul with OUT=Q8_SPLIT, the quantize pre-pass with
    /// OUT=Q8_SPLIT where attention writes f32. `kq-split` reads the f32
    /// rows (each GEMV block splits them itself), with no pre-pass.
    #[test]
    fn kquant_decode_reads_split_records_written_once() {
        let cfg = synth::preset(SynthVariant::E4b);
        let out_of = |plan: &ForwardPlan, id: LaunchId| -> String {
            plan.launches[id]
                .bound
                .iter()
                .find(|(k, _)| *k == "OUT")
                .map(|(_, v)| v.to_string())
                .unwrap_or_default()
        };
        for (profile, want) in [("main", ActFormat::Q8Split), ("kq-split", ActFormat::F32)] {
            let what = format!("e4b q4_k_m {profile}");
            let (plan, _) = synth_plan(profile, &cfg, WeightType::Q4KM, &what);
            let mut prepasses = 0;
            for b in plan.buckets.iter().filter(|b| b.rows <= GEMV_MAX_ROWS) {
                for (l, lp) in b.layers.iter().enumerate() {
                    let mut ms: Vec<&MatmulPlan> = lp.qkv.iter().collect();
                    ms.extend([&lp.o, &lp.gate_up, &lp.down]);
                    for m in ms {
                        if WType::of(m.dim.2).is_some_and(|t| t.is_kquant()) {
                            assert_eq!(
                                m.input, want,
                                "{what} bucket {} layer {l} {:?}",
                                b.rows, m.proj
                            );
                        }
                    }
                    assert_eq!(
                        out_of(&plan, lp.input_norm),
                        lp.qkv[0].input.define(),
                        "{what} layer {l}"
                    );
                    if let Some(g) = lp.gelu {
                        assert_eq!(out_of(&plan, g), lp.down.input.define(), "{what} layer {l}");
                    }
                    match lp.o.prepass {
                        Some(pp) => {
                            assert_eq!(plan.launches[pp.launch].slot, Slot::QuantizeQ8_1);
                            assert_eq!(out_of(&plan, pp.launch), lp.o.input.define());
                            prepasses += 1;
                        }
                        None => assert!(
                            lp.o.input == ActFormat::F32 || lp.attention.out == lp.o.input,
                            "{what} layer {l}: O reads {:?} with no pre-pass",
                            lp.o.input
                        ),
                    }
                }
            }
            assert_eq!(prepasses > 0, profile == "main", "{what}: {prepasses}");
        }
    }

    /// The tied head's own copy is uploaded in the type its launches were
    /// planned for (`weights::head_copy_type`), whatever the profile
    /// decides: main keeps a Q6_K head in its plane repack and the gather
    /// reads those planes (no table copy), q8-head converts it to Q8_0
    /// (`head_convert`), strict and q6k-head read the table.
    #[test]
    fn the_head_copy_is_uploaded_in_the_planned_type() {
        let mut cfg = synth::preset(SynthVariant::Tiny);
        cfg.d_model = 256;
        for w in [WeightType::Q4_0, WeightType::Q4KM, WeightType::Q8_0] {
            for profile in ["main", "strict", "q6k-head", "q8-head", "cublas", "dp4a"] {
                let planner = Planner::new(
                    Profile::load(profile).expect("profile"),
                    None,
                    DeviceLimits::for_arch(Arch(90)),
                );
                let dims = ModelDims::of_synth(&cfg, w, &planner);
                let kv_type = if profile == "strict" {
                    KvType::F32
                } else {
                    KvType::F16
                };
                let sizing = Sizing {
                    max_seq: 256,
                    ubatch: 64,
                    kv_type,
                };
                let plan = ForwardPlan::resolve(&planner, &cfg, &dims, sizing)
                    .unwrap_or_else(|e| panic!("{profile} {}: {e}", w.name()));
                let file = w.embedding_type(cfg.d_model as u64);
                let what = format!("{profile} {} (table {})", w.name(), file.name());
                if plan.layouts.head_native {
                    assert_eq!(dims.head.2, file, "{what}");
                    continue;
                }
                let copy = weights::head_copy_type(&plan.layouts, file);
                assert_eq!(copy.ggml(), dims.head.2, "{what}");
                // main reads the Q6_K head from its plane repack, which the
                // gather shares; q8-head converts it beside the table.
                let q6k = file == GgmlType::Q6K;
                if profile == "main" && q6k {
                    assert_eq!(copy, WType::Q6K, "{what}: main keeps Q6_K");
                }
                if profile == "q8-head" && q6k {
                    assert_eq!(copy, WType::Q8_0, "{what}: q8-head asks for Q8_0");
                }
                let own_head = ["strict", "q6k-head", "q8-head"].contains(&profile);
                assert_eq!(
                    dims.embd_on_head,
                    q6k && !own_head,
                    "{what}: the gather reads the head's planes"
                );
            }
        }
    }

    /// `strict` refuses what it would convert lossily (F32 projections:
    /// no matmul kernel reads them; the mixes' mixed Q|K|V groups), naming
    /// the matrices and why; `main` loads them and lists the conversions;
    /// the uniform native files pass both.
    #[test]
    fn lossless_profiles_refuse_lossy_conversions() {
        use crate::cuda::engine::refuse_lossy;
        let cfg = synth::preset(SynthVariant::Tiny);
        for (w, refused) in [
            (WeightType::F32, "no matmul kernel reads f32"),
            (WeightType::Q8_0, ""),
            (WeightType::F16, ""),
            (WeightType::Bf16, ""),
        ] {
            for profile in ["main", "strict"] {
                let p = Profile::load(profile).expect("profile");
                let planner = Planner::new(p.clone(), None, DeviceLimits::for_arch(Arch(90)));
                let dims = ModelDims::of_synth(&cfg, w, &planner);
                let r = refuse_lossy(&p, &dims);
                match (refused, profile) {
                    ("", _) | (_, "main") => {
                        assert!(r.is_ok(), "{} {profile}: {r:?}", w.name());
                        assert_eq!(
                            dims.converted.is_empty(),
                            refused.is_empty(),
                            "{}",
                            w.name()
                        );
                    }
                    (why, _) => {
                        let e = r.expect_err("refused").to_string();
                        assert!(e.contains(why) && e.contains("attn_qkv"), "{e}");
                    }
                }
            }
        }
    }
}
