//! The stages of Gemma 4's forward pass on the GPU, each executing its part
//! of a `BucketPlan`: `embed`, `per_layer_inputs`, then per layer
//! `input_norm`, `attention_block`, `attn_residual`, `ffn_block`,
//! `ple_injection` and `layer_end`, and last `head`. Nothing here chooses a
//! kernel, a format or a layout: the plan did, at load. A stage builds the
//! argument lists from the fixed-address buffers and the weights, and
//! launches the planned kernels (`k[id]`, the kernels at the chunk's grid).

use gemtune_kernels::bind::attention as battn;
use gemtune_kernels::bind::matmul::{Extra, MatmulBinding, Prepass, Side, Tail, TailMode, Weights};
use gemtune_kernels::bind::rows::{self as brows, ScaleExpandArgs};
use gemtune_kernels::bind::{Act, ActFormat, DevPtr, NULL};
use gemtune_kernels::families::scale_expand;
use gemtune_kernels::gpu::{DeviceBuffer, KArg};
use gemtune_kernels::reference::cublas::GemmType;
use gemtune_kernels::runtime::Kernel;

use super::engine::{dev, CudaEngine};
use super::forward_plan::{
    window, AttnPlan, BucketPlan, HeadPlan, LaunchId, LayerPlan, MatmulExec, MatmulPlan,
};
use super::planner::GEMV_BLOCK;
use super::slots::Phase;
use super::weights::{GpuMatrix, PLANES_F16};
use crate::engine::EngineError;

/// Where a chunk's rows stand in the layer loop.
#[derive(Clone, Copy, Debug)]
pub struct Rows {
    /// Rows carried.
    pub n: usize,
    /// Index into the device `pos` array of the first row's position.
    pub pos_slot: usize,
    /// Host copy of that position.
    pub pos0: usize,
}

impl CudaEngine<'_> {
    pub(super) fn mark(&self, phase: Phase) -> Result<(), EngineError> {
        if let Some(p) = self.phases.borrow_mut().as_mut() {
            p.mark(&self.gpu, phase).map_err(dev)?;
        }
        Ok(())
    }

    fn launch(&self, k: &[Kernel], id: LaunchId, args: &[KArg]) -> Result<(), EngineError> {
        self.launch_kernel(&k[id], args)
    }

    /// One launch of `kernel`, chained to the launch before it when the
    /// decode step's chain says so (`launch_chain`).
    pub(super) fn launch_kernel(&self, kernel: &Kernel, args: &[KArg]) -> Result<(), EngineError> {
        if self.chain.next_launch() {
            kernel.launch_dependent(&self.gpu, args).map_err(dev)
        } else {
            kernel.launch(&self.gpu, args).map_err(dev)
        }
    }

    /// `launch_kernel` with `grid` in place of the planned grid.
    pub(super) fn launch_kernel_grid(
        &self,
        kernel: &Kernel,
        grid: (u32, u32, u32),
        args: &[KArg],
    ) -> Result<(), EngineError> {
        kernel
            .launch_grid_as(&self.gpu, grid, args, self.chain.next_launch())
            .map_err(dev)
    }

    /// The activation buffer in `format` (main plane and Q8_1 scales).
    fn act(&self, format: ActFormat) -> Act {
        Act {
            format,
            data: self.b.act.ptr(),
            scales: if format == ActFormat::Q8_1 {
                self.b.act_scales.ptr()
            } else {
                NULL
            },
        }
    }

    /// The input of projection `m` at `rows` rows whose producer wrote f32
    /// `src`: converted into the `act` buffer by the planned pre-pass, or
    /// `src` itself when the projection reads f32.
    fn input_from_f32(
        &self,
        k: &[Kernel],
        m: &MatmulPlan,
        src: DevPtr,
        rows: usize,
    ) -> Result<Act, EngineError> {
        let Some(pp) = m.prepass else {
            return Ok(Act::f32(src));
        };
        let act = self.act(m.input);
        let kk = m.dim.1;
        let args = match pp.kind {
            Prepass::None => return Ok(Act::f32(src)),
            Prepass::QuantizeQ8_1 => vec![
                KArg::Ptr(src),
                KArg::Ptr(act.data),
                KArg::Ptr(act.scales),
                KArg::U64((rows * kk) as u64),
            ],
            Prepass::DqConvert => vec![
                KArg::Ptr(src),
                KArg::Ptr(act.data),
                KArg::U64((rows * kk / 2) as u64),
            ],
        };
        self.mark(Phase::ActConvert)?;
        self.launch(k, pp.launch, &args)?;
        Ok(act)
    }

    /// The input of projection `m` that its producer wrote into the `act`
    /// buffer in the projection's format.
    fn input_in_act(&self, m: &MatmulPlan) -> Act {
        self.act(m.input)
    }

    /// `y = x W^T` for projection `m` at `rows` rows (`x` in `m.input`).
    fn matmul(
        &self,
        k: &[Kernel],
        m: &MatmulPlan,
        w: &GpuMatrix,
        x: &Act,
        y: &DeviceBuffer,
        rows: usize,
    ) -> Result<(), EngineError> {
        self.matmul_into(k, m, w, x, (y, 0), rows)
    }

    /// `matmul` writing `[rows][w.n]` at byte `y_off` of `y`.
    fn matmul_into(
        &self,
        k: &[Kernel],
        m: &MatmulPlan,
        w: &GpuMatrix,
        x: &Act,
        (y, y_off): (&DeviceBuffer, usize),
        rows: usize,
    ) -> Result<(), EngineError> {
        let phase = m.proj.phase();
        match &m.exec {
            MatmulExec::Vendor { convert } if y_off == 0 => {
                self.vendor_matmul(k, *convert, phase, w, x, y, rows)
            }
            MatmulExec::Vendor { convert } => {
                // cuBLAS writes whole buffers: the block goes through the
                // gate|up buffer (`[rows][2 * ffn]`, wider than any Q|K|V
                // run), free while Q|K|V is computed (the previous layer's
                // FFN is done with it; this layer's writes it later).
                let scratch = &self.b.gu;
                let bytes = 4 * rows * w.n;
                if bytes > scratch.bytes() {
                    return Err(EngineError::Device(format!(
                        "{} (cuBLAS): {bytes} bytes do not fit the scratch buffer",
                        w.name
                    )));
                }
                self.vendor_matmul(k, *convert, phase, w, x, scratch, rows)?;
                self.chain.other_op();
                self.gpu
                    .copy_range(y, y_off, scratch, 0, bytes)
                    .map_err(dev)
            }
            MatmulExec::Kernel { launch, binding } => {
                if let Some(id) = m.scales {
                    self.expand_scales(k, id, w)?;
                }
                self.mark(phase)?;
                self.matmul_launch(
                    k,
                    *launch,
                    binding,
                    w,
                    x,
                    (y, y_off),
                    rows,
                    m.scales.is_some(),
                    Extra::default(),
                )
            }
            MatmulExec::RowBlocks { blocks } => {
                self.mark(phase)?;
                let mut r0 = 0;
                while r0 < rows {
                    let mc = GEMV_BLOCK.min(rows - r0);
                    let (id, b) = &blocks[mc - 1];
                    let xs = Act {
                        format: x.format,
                        data: x.data + (x.format.bytes(r0, w.k)) as u64,
                        scales: if x.scales == NULL {
                            NULL
                        } else {
                            x.scales + (x.format.scale_bytes(r0, w.k)) as u64
                        },
                    };
                    let ys = (y, y_off + 4 * r0 * (w.n / b.matrices));
                    self.matmul_launch(k, *id, b, w, &xs, ys, mc, false, Extra::default())?;
                    r0 += mc;
                }
                Ok(())
            }
        }
    }

    /// Writes the prefill GEMMs' scale plane of `w` (every row) into the
    /// scale scratch buffer from its GEMV plane (`scale_expand`).
    fn expand_scales(&self, k: &[Kernel], id: LaunchId, w: &GpuMatrix) -> Result<(), EngineError> {
        let groups = w.n * (w.k / 32);
        let need = scale_expand::dst_bytes(w.wtype, groups);
        if need > self.b.scale_scratch.bytes() {
            return Err(EngineError::Device(format!(
                "{}: its expanded scales ({need} bytes) do not fit the scale scratch buffer ({} bytes)",
                w.name,
                self.b.scale_scratch.bytes()
            )));
        }
        let src = w.weights_from(PLANES_F16, 0).map_err(dev)?.d;
        let args = ScaleExpandArgs {
            src,
            dst: self.b.scale_scratch.ptr(),
            groups,
        };
        self.mark(Phase::ScaleExpand)?;
        self.launch(k, id, &args.kargs())
    }

    /// `matmul` of a GEMV bound to extra operands: `side` (gemv FUSE=2,
    /// the PLE gate times the layer's per-layer input) or `tail` (gemv
    /// TAIL=1, the sandwich norm after the projection). Without either, a
    /// plain `matmul`.
    #[allow(clippy::too_many_arguments)]
    fn matmul_with(
        &self,
        k: &[Kernel],
        m: &MatmulPlan,
        w: &GpuMatrix,
        x: &Act,
        y: &DeviceBuffer,
        rows: usize,
        extra: Extra,
    ) -> Result<(), EngineError> {
        if extra == Extra::default() {
            return self.matmul(k, m, w, x, y, rows);
        }
        let MatmulExec::Kernel { launch, binding } = &m.exec else {
            return Err(EngineError::Device(format!(
                "{}: a GEMV with a side operand or a tail is one kernel launch",
                w.name
            )));
        };
        self.mark(m.proj.phase())?;
        self.matmul_launch(k, *launch, binding, w, x, (y, 0), rows, false, extra)
    }

    /// The operands of projection `m`'s tail, where the plan bound one
    /// (gemv TAIL=1): `x = (x + rmsnorm(y) * w_add) * *scale` (`scale`
    /// NULL: 1), then, with `TailMode::Norm`, `act = rmsnorm(x) * w_out`
    /// in the format the tail writes.
    fn tail(&self, m: &MatmulPlan, w_add: DevPtr, scale: DevPtr, w_out: DevPtr) -> Extra {
        let out = match m.tail() {
            TailMode::None => return Extra::default(),
            TailMode::Residual => Act::f32(NULL),
            TailMode::Norm(f) => self.act(f),
        };
        let x = self.b.x.ptr();
        Extra {
            side: None,
            tail: Some(Tail {
                h_in: x,
                h_out: x,
                w_add,
                scale,
                w_out: if out.data == NULL { NULL } else { w_out },
                out,
                scratch: self.b.tail_scratch.ptr(),
                eps: self.model.config().rms_eps,
            }),
        }
    }

    /// The tail of layer `l`'s last projection `m` (the PLE's, else down):
    /// the layer's end, `x = (x + rmsnorm(y) * post) * layer scalar`, with
    /// the next layer's input norm where the plan bound it.
    fn end_tail(&self, m: &MatmulPlan, l: usize, post: DevPtr) -> Result<Extra, EngineError> {
        let w_out = match m.tail() {
            TailMode::Norm(_) => match self.w.layers.get(l + 1) {
                Some(next) => next.attn_norm.ptr(),
                None => {
                    return Err(EngineError::Device(format!(
                        "layer {l}: its end's tail writes the input norm of a layer the model does not have"
                    )))
                }
            },
            _ => NULL,
        };
        let scale = self.w.layer_scales.ptr() + 4 * l as u64;
        Ok(self.tail(m, post, scale, w_out))
    }

    /// One launch of a matmul kernel. `expanded`: its scale plane is the
    /// one `expand_scales` just wrote into the scale scratch buffer (the
    /// quant plane is the matrix's own). `extra`: the side operand of a
    /// gemv FUSE=2 binding, the tail operands of a gemv TAIL=1 binding.
    #[allow(clippy::too_many_arguments)]
    fn matmul_launch(
        &self,
        k: &[Kernel],
        id: LaunchId,
        b: &MatmulBinding,
        w: &GpuMatrix,
        x: &Act,
        (y, y_off): (&DeviceBuffer, usize),
        rows: usize,
        expanded: bool,
        extra: Extra,
    ) -> Result<(), EngineError> {
        let n = w.n / b.matrices;
        if b.zero_output {
            self.chain.other_op();
            self.gpu
                .fill_u32_range(y, y_off, rows * w.n, 0)
                .map_err(dev)?;
        }
        let mut ws = [Weights { q: NULL, d: NULL }; 2];
        let (_, d_stride) = b.row_strides(w.wtype, w.k);
        for (i, slot) in ws.iter_mut().enumerate().take(b.matrices) {
            *slot = if expanded {
                Weights {
                    q: w.weights_from(PLANES_F16, i * n).map_err(dev)?.q,
                    d: self.b.scale_scratch.ptr() + (i * n * d_stride) as u64,
                }
            } else {
                w.weights_from(b.layout, i * n).map_err(dev)?
            };
        }
        let args = b
            .kargs_with(
                &ws[..b.matrices],
                x,
                y.ptr() + y_off as u64,
                rows,
                n,
                w.k,
                extra,
            )
            .map_err(|e| EngineError::Device(format!("{}: {e}", w.name)))?;
        self.launch(k, id, &args)
    }

    /// The vendor arm: `x` (f32) converted to bf16 by `act_convert`, then
    /// cuBLAS's bf16 GEMM on the weights dequantized at load.
    #[allow(clippy::too_many_arguments)]
    fn vendor_matmul(
        &self,
        k: &[Kernel],
        convert: LaunchId,
        phase: Phase,
        w: &GpuMatrix,
        x: &Act,
        y: &DeviceBuffer,
        m: usize,
    ) -> Result<(), EngineError> {
        let err = |msg: String| EngineError::Device(format!("{} (cuBLAS): {msg}", w.name));
        let cublas = self
            .cublas
            .as_ref()
            .ok_or_else(|| err("cuBLAS was not loaded".into()))?;
        let wb = match w.bf16() {
            Some(wb) if x.format == ActFormat::F32 => wb,
            _ => return Err(err("no bf16 weights, or operands not in f32".into())),
        };
        self.mark(Phase::ActConvert)?;
        let args = [
            KArg::Ptr(x.data),
            KArg::Ptr(self.b.act16.ptr()),
            KArg::U64((m * w.k) as u64),
        ];
        self.launch(k, convert, &args)?;
        self.mark(phase)?;
        self.chain.other_op();
        cublas
            .gemm_tn(&self.gpu, GemmType::Bf16, m, w.n, w.k, wb, &self.b.act16, y)
            .map_err(|e| err(e.to_string()))
    }

    /// The sandwich-norm kernel: with `add`, `h += rmsnorm(y) * w_add`
    /// (times the layer scalar at `scale`); then, with `out`, the norm of
    /// `h` times `w_out` in `out`'s format. `moe` carries a MoE layer's
    /// extra operands (`RmsNormMoe`: the summed addend, the two extra
    /// outputs); default elsewhere. The launch `id` was planned for exactly
    /// these formats and modes.
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm(
        &self,
        k: &[Kernel],
        id: LaunchId,
        h: DevPtr,
        add: Option<(DevPtr, DevPtr)>,
        scale: DevPtr,
        out: Option<(DevPtr, Act)>,
        moe: brows::RmsNormMoe,
        rows: usize,
    ) -> Result<(), EngineError> {
        self.mark(Phase::Norm)?;
        let cfg = self.model.config();
        let a = brows::RmsNormArgs {
            h,
            y: add.map(|a| a.0).unwrap_or(NULL),
            w_add: add.map(|a| a.1).unwrap_or(NULL),
            scale,
            w_out: out.map(|o| o.0).unwrap_or(NULL),
            out: out.map(|o| o.1).unwrap_or(Act::f32(NULL)),
            moe,
            rows,
            width: cfg.d_model,
            eps: cfg.rms_eps,
        };
        self.launch(k, id, &a.kargs())
    }

    #[allow(clippy::too_many_arguments)]
    fn gelu_mul(
        &self,
        k: &[Kernel],
        id: LaunchId,
        g: (DevPtr, usize),
        u: (DevPtr, usize),
        out: Act,
        rows: usize,
        width: usize,
    ) -> Result<(), EngineError> {
        self.mark(Phase::Gelu)?;
        let a = brows::GeluMulArgs {
            g: g.0,
            g_stride: g.1,
            u: u.0,
            u_stride: u.1,
            out,
            rows,
            width,
        };
        self.launch(k, id, &a.kargs())
    }

    /// `x = dequant(E[token]) * sqrt(d)` for the chunk's `t` tokens.
    pub(super) fn embed(&self, k: &[Kernel], bp: &BucketPlan, t: usize) -> Result<(), EngineError> {
        let cfg = self.model.config();
        self.mark(Phase::Embed)?;
        // The table's GGUF rows (LAYOUT=0, no side plane), or the head's
        // Q6_K nibble plane and GEMV side records (LAYOUT=1).
        let (table, side) = match &self.w.embd {
            Some(t) => (t.buf.ptr(), NULL),
            None => {
                let w = self.w.head.weights_from(PLANES_F16, 0).map_err(dev)?;
                (w.q, w.d)
            }
        };
        let a = brows::EmbedArgs {
            tokens: self.b.tokens.ptr(),
            table,
            side,
            out: self.b.x.ptr(),
            rows: t,
            width: cfg.d_model,
            scale: cfg.embed_scale(),
        };
        self.launch(k, bp.embed, &a.kargs())
    }

    /// The per-layer inputs of E2B/E4B: the model projection of the scaled
    /// embedding, then the `ple` kernel (gather, chunk norm, sum, 1/sqrt 2).
    pub(super) fn per_layer_inputs(
        &self,
        k: &[Kernel],
        bp: &BucketPlan,
        t: usize,
    ) -> Result<(), EngineError> {
        let cfg = self.model.config();
        let (Some(pp), Some(mp), Some(table), Some(norm)) = (
            bp.per_layer_inputs.as_ref(),
            self.w.ple_model_proj.as_ref(),
            self.w.ple_table.as_ref(),
            self.w.ple_proj_norm.as_ref(),
        ) else {
            return Ok(());
        };
        let x = self.input_from_f32(k, &pp.model_proj, self.b.x.ptr(), t)?;
        self.matmul(k, &pp.model_proj, mp, &x, &self.b.ple_proj, t)?;
        self.mark(Phase::Ple)?;
        let a = brows::PleArgs {
            tokens: self.b.tokens.ptr(),
            table: table.buf.ptr(),
            proj: self.b.ple_proj.ptr(),
            proj_norm: norm.ptr(),
            out: self.b.ple.ptr(),
            rows: t,
            n_layers: cfg.n_layers,
            ple_dim: cfg.ple_dim,
            proj_scale: 1.0 / (cfg.d_model as f32).sqrt(),
            tok_scale: (cfg.ple_dim as f32).sqrt(),
            eps: cfg.rms_eps,
        };
        self.launch(k, pp.gather, &a.kargs())
    }

    /// `act = rmsnorm(x) * attn_norm` for layer `l`, in its QKV format.
    pub(super) fn input_norm(
        &self,
        k: &[Kernel],
        lp: &LayerPlan,
        l: usize,
        rows: Rows,
    ) -> Result<(), EngineError> {
        let lw = &self.w.layers[l];
        let out = self.act(lp.qkv_input());
        self.rmsnorm(
            k,
            lp.input_norm,
            self.b.x.ptr(),
            None,
            NULL,
            Some((lw.attn_norm.ptr(), out)),
            Default::default(),
            rows.n,
        )
    }

    /// Attention block: the QKV projection, Q/K norms with RoPE and the
    /// cache write, attention over the layer's (or its donor's) cache, and
    /// the output projection into `y`.
    pub(super) fn attention_block(
        &self,
        k: &[Kernel],
        lp: &LayerPlan,
        l: usize,
        rows: Rows,
    ) -> Result<(), EngineError> {
        let cfg = self.model.config();
        let lc = &cfg.layers[l];
        let r = rows.n;
        let lw = &self.w.layers[l];
        let x_in = self.act(lp.qkv_input());
        // Each Q|K|V run writes its `[r][n_run]` block of the buffer, one
        // after the other; a part is read at its column within its run,
        // with the run's width as the row stride.
        let base = self.b.qkv.ptr();
        let mut runs = Vec::with_capacity(lw.qkv.len());
        let mut off = 0usize;
        for (m, w) in lp.qkv.iter().zip(&lw.qkv) {
            self.matmul_into(k, m, w, &x_in, (&self.b.qkv, off), r)?;
            runs.push((base + off as u64, w.n));
            off += 4 * r * w.n;
        }
        let (qd, kvd) = (lc.q_dim(), lc.kv_dim());
        let cache = self
            .kv
            .for_layer(l)
            .ok_or_else(|| EngineError::Device(format!("layer {l}: no KV cache to read")))?;
        let owns = self.kv.owns(l);
        let mut widths = vec![qd];
        if owns {
            widths.push(kvd);
            if !lc.k_eq_v {
                widths.push(kvd);
            }
        }
        let parts = parts_in_runs(&runs, &widths).ok_or_else(|| {
            EngineError::Device(format!(
                "layer {l}: the Q|K|V runs ({:?} wide) do not hold parts {widths:?}",
                runs.iter().map(|r| r.1).collect::<Vec<_>>()
            ))
        })?;
        let (q_in, q_stride) = parts[0];
        let (k_in, k_stride) = if owns { parts[1] } else { (NULL, 0) };
        let (v_in, v_stride) = match (owns, lc.k_eq_v) {
            (false, _) => (NULL, 0),
            (true, true) => (k_in, k_stride),
            (true, false) => parts[2],
        };
        let pos0_dev = self.b.pos.ptr() + 4 * rows.pos_slot as u64;
        let a = brows::QkNormRopeArgs {
            q_in,
            q_stride,
            k_in,
            k_stride,
            v_in,
            v_stride,
            q_norm: lw.q_norm.ptr(),
            k_norm: lw.k_norm.as_ref().map(|b| b.ptr()).unwrap_or(NULL),
            inv_freq: self.w.rope(lc.kind).ptr(),
            pos0: pos0_dev,
            q_out: self.b.q.ptr(),
            k_cache: if owns { cache.k.ptr() } else { NULL },
            v_cache: if owns { cache.v.ptr() } else { NULL },
            capacity: cache.capacity,
            rows: r,
            n_heads: lc.n_heads,
            n_kv_heads: lc.n_kv_heads,
            eps: cfg.rms_eps,
        };
        self.mark(Phase::RopeKv)?;
        self.launch(k, lp.qk_norm_rope, &a.kargs())?;

        let ap: &AttnPlan = &lp.attention;
        let o_act = (ap.out != ActFormat::F32).then(|| self.act(ap.out));
        self.mark(Phase::attention(ap.kind))?;
        let args = battn::AttnArgs {
            q: self.b.q.ptr(),
            k_cache: cache.k.ptr(),
            v_cache: cache.v.ptr(),
            out: o_act.map_or(self.b.o.ptr(), |a| a.data),
            pos0_host: rows.pos0,
            pos0_dev,
            n_q: r,
            capacity: cache.capacity,
            n_heads: lc.n_heads,
            n_kv_heads: lc.n_kv_heads,
            window: window(cfg, l),
            scratch: self.b.attn_scratch.ptr(),
        };
        battn::launch_planned(
            &k[ap.launch],
            self.kernels.combine[ap.launch].as_ref(),
            &self.gpu,
            &args,
        )
        .map_err(dev)?;
        self.chain.kernel_launched();

        let o = match o_act {
            Some(a) => a,
            None => self.input_from_f32(k, &lp.o, self.b.o.ptr(), r)?,
        };
        // With a tail, the GEMV runs the attention residual and the FFN
        // input norm (`attn_residual` then has no launch).
        let tail = self.tail(&lp.o, lw.post_attn_norm.ptr(), NULL, lw.ffn_norm.ptr());
        self.matmul_with(k, &lp.o, &lw.o, &o, &self.b.y, r, tail)
    }

    /// The attention residual: `x += rmsnorm(y) * post_attention_norm`,
    /// then the FFN input norm `act = rmsnorm(x) * ffn_norm` (nothing where
    /// the output projection's tail ran it).
    pub(super) fn attn_residual(
        &self,
        k: &[Kernel],
        lp: &LayerPlan,
        l: usize,
        rows: Rows,
    ) -> Result<(), EngineError> {
        let Some(id) = lp.attn_residual else {
            return Ok(());
        };
        let lw = &self.w.layers[l];
        let out = self.input_in_act(&lp.gate_up);
        self.rmsnorm(
            k,
            id,
            self.b.x.ptr(),
            Some((self.b.y.ptr(), lw.post_attn_norm.ptr())),
            NULL,
            Some((lw.ffn_norm.ptr(), out)),
            self.moe_inputs(lp, l),
            rows.n,
        )
    }

    /// FFN block: gate/up (fused), GELU(gate) * up, down into `y`.
    pub(super) fn ffn_block(
        &self,
        k: &[Kernel],
        lp: &LayerPlan,
        l: usize,
        rows: Rows,
    ) -> Result<(), EngineError> {
        let r = rows.n;
        let lw = &self.w.layers[l];
        let ff = lw.gate_up.n / 2;
        let x = self.input_in_act(&lp.gate_up);
        let h_act = match lp.gelu {
            // The fused GEMV writes gelu(gate) * up itself into `h`: as
            // down's split Q8 records (OUT=Q8_SPLIT; 80 bytes per 32
            // values fit the f32 row), or f32 that a pre-pass converts
            // where down reads another format. Not into `act`, which
            // holds the GEMV's own input while it runs.
            None => {
                self.matmul(k, &lp.gate_up, &lw.gate_up, &x, &self.b.h, r)?;
                match lp.gate_up.output() {
                    ActFormat::F32 => self.input_from_f32(k, &lp.down, self.b.h.ptr(), r)?,
                    format => Act {
                        format,
                        data: self.b.h.ptr(),
                        scales: NULL,
                    },
                }
            }
            Some(gelu) => {
                let gu = &self.b.gu;
                self.matmul(k, &lp.gate_up, &lw.gate_up, &x, gu, r)?;
                let out = if lp.down.input == ActFormat::F32 {
                    Act::f32(self.b.h.ptr())
                } else {
                    self.act(lp.down.input)
                };
                let g = (gu.ptr(), 2 * ff);
                let u = (gu.ptr() + 4 * ff as u64, 2 * ff);
                self.gelu_mul(k, gelu, g, u, out, r, ff)?;
                out
            }
        };
        // With a tail, down runs the FFN residual (before the PLE) or the
        // layer's end.
        let tail = if lp.ple.is_some() {
            self.tail(&lp.down, lw.post_ffw_norm.ptr(), NULL, NULL)
        } else {
            self.end_tail(&lp.down, l, lw.post_ffw_norm.ptr())?
        };
        self.matmul_with(k, &lp.down, &lw.down, &h_act, &self.b.y, r, tail)
    }

    /// The PLE injection of E2B/E4B, after the FFN residual
    /// (`x += rmsnorm(y) * post_ffw_norm`): `y = proj(gelu(inp_gate(x)) *
    /// ple[l])`, whose residual `layer_end` adds. Without PLE it does
    /// nothing and `layer_end` adds the FFN's residual.
    pub(super) fn ple_injection(
        &self,
        k: &[Kernel],
        lp: &LayerPlan,
        l: usize,
        rows: Rows,
    ) -> Result<(), EngineError> {
        let (Some(pp), Some(gate), Some(proj)) = (
            lp.ple.as_ref(),
            self.w.layers[l].ple_gate.as_ref(),
            self.w.layers[l].ple_proj.as_ref(),
        ) else {
            return Ok(());
        };
        let cfg = self.model.config();
        let r = rows.n;
        let lw = &self.w.layers[l];
        let x = self.b.x.ptr();
        if let Some(id) = pp.ffn_residual {
            self.rmsnorm(
                k,
                id,
                x,
                Some((self.b.y.ptr(), lw.post_ffw_norm.ptr())),
                NULL,
                None,
                self.moe_sum(lp, l),
                r,
            )?;
        }
        let xa = self.input_from_f32(k, &pp.gate, x, r)?;
        let p = cfg.ple_dim;
        let per_layer = self.b.ple.ptr() + 4 * (l * p) as u64;
        let out = match pp.gelu {
            // The gate GEMV multiplies gelu(gate) by the per-layer input
            // itself (gemv FUSE=2), into the f32 rows the projection reads.
            None => {
                let side = Side {
                    ptr: per_layer,
                    stride: cfg.n_layers * p,
                };
                let side = Extra {
                    side: Some(side),
                    tail: None,
                };
                self.matmul_with(k, &pp.gate, gate, &xa, &self.b.h, r, side)?;
                Act::f32(self.b.h.ptr())
            }
            Some(gelu) => {
                self.matmul(k, &pp.gate, gate, &xa, &self.b.pg, r)?;
                let out = if pp.proj.input == ActFormat::F32 {
                    Act::f32(self.b.h.ptr())
                } else {
                    self.act(pp.proj.input)
                };
                self.gelu_mul(
                    k,
                    gelu,
                    (self.b.pg.ptr(), p),
                    (per_layer, cfg.n_layers * p),
                    out,
                    r,
                    p,
                )?;
                out
            }
        };
        // With a tail, the projection runs the layer's end.
        let post = lw
            .ple_post_norm
            .as_ref()
            .map_or(lw.post_ffw_norm.ptr(), |p| p.ptr());
        let tail = self.end_tail(&pp.proj, l, post)?;
        self.matmul_with(k, &pp.proj, proj, &out, &self.b.y, r, tail)
    }

    /// The layer's end: the last residual add (the PLE's, else the FFN's)
    /// with its post norm, times the layer scalar; with `next`, then the
    /// next layer's input norm in its QKV format (`next` is that layer's
    /// plan). Nothing where the layer's last projection ran it in its tail
    /// (which writes the next layer's input norm whenever there is a next
    /// layer: a compacted chunk's input norm then writes it again).
    pub(super) fn layer_end(
        &self,
        k: &[Kernel],
        lp: &LayerPlan,
        l: usize,
        rows: Rows,
        next: Option<&LayerPlan>,
    ) -> Result<(), EngineError> {
        let lw = &self.w.layers[l];
        let post = match &lw.ple_post_norm {
            Some(p) if lp.ple.is_some() => p.ptr(),
            _ => lw.post_ffw_norm.ptr(),
        };
        let scale = self.w.layer_scales.ptr() + 4 * l as u64;
        let (id, out) = match (next, lp.end_with_next_norm) {
            (Some(nl), Some(id)) => (
                id,
                Some((
                    self.w.layers[l + 1].attn_norm.ptr(),
                    self.act(nl.qkv_input()),
                )),
            ),
            _ => match lp.end {
                Some(id) => (id, None),
                None => return Ok(()),
            },
        };
        // The PLE injection added the FFN's output already and left its
        // own in `y`; otherwise `y` is the FFN's (a MoE layer's shared MLP,
        // summed with the experts' output in this launch).
        let moe = if lp.ple.is_some() {
            Default::default()
        } else {
            self.moe_sum(lp, l)
        };
        let y = self.b.y.ptr();
        self.rmsnorm(
            k,
            id,
            self.b.x.ptr(),
            Some((y, post)),
            scale,
            out,
            moe,
            rows.n,
        )
    }

    /// Final norm, tied head and softcap for rows `r0..r0+r` of `x` (at most
    /// `GEMV_MAX_ROWS`, the head plan of the `r`-row bucket) into logits
    /// rows `0..r`.
    pub(super) fn head(
        &self,
        k: &[Kernel],
        hp: &HeadPlan,
        r0: usize,
        r: usize,
    ) -> Result<(), EngineError> {
        let cfg = self.model.config();
        let d = cfg.d_model;
        self.mark(Phase::Head)?;
        let out = self.input_in_act(&hp.matmul);
        let x = self.b.x.ptr() + (4 * r0 * d) as u64;
        self.rmsnorm(
            k,
            hp.norm,
            x,
            None,
            NULL,
            Some((self.w.output_norm.ptr(), out)),
            Default::default(),
            r,
        )?;
        let logits = &self.b.logits;
        self.matmul(k, &hp.matmul, &self.w.head, &out, logits, r)?;
        if let (Some(id), Some(cap)) = (hp.softcap, cfg.final_logit_softcap) {
            let a = brows::SoftcapArgs {
                x: logits.ptr(),
                rows: r,
                width: self.model.vocab_size(),
                cap,
            };
            self.launch(k, id, &a.kargs())?;
        }
        Ok(())
    }

    /// Moves row `row` of the residual stream (and of the per-layer inputs)
    /// to row 0: the only row carried past the compaction point.
    pub(super) fn copy_row(&self, row: usize) -> Result<(), EngineError> {
        if row == 0 {
            return Ok(());
        }
        let cfg = self.model.config();
        let d = cfg.d_model;
        self.gpu
            .copy_range(&self.b.x, 0, &self.b.x, row * d * 4, d * 4)
            .map_err(dev)?;
        let lp = cfg.n_layers * cfg.ple_dim;
        if lp > 0 {
            self.gpu
                .copy_range(&self.b.ple, 0, &self.b.ple, row * lp * 4, lp * 4)
                .map_err(dev)?;
        }
        Ok(())
    }
}

/// The address and row stride (in elements) of each part of a fused matrix
/// whose runs `(address, width)` hold parts of `widths` columns in order;
/// `None` when a part would straddle two runs or the widths do not add up.
fn parts_in_runs(runs: &[(DevPtr, usize)], widths: &[usize]) -> Option<Vec<(DevPtr, usize)>> {
    let mut out = Vec::with_capacity(widths.len());
    let mut w = widths.iter();
    for &(ptr, n) in runs {
        let mut col = 0;
        while col < n {
            let &part = w.next()?;
            if col + part > n {
                return None;
            }
            out.push((ptr + 4 * col as u64, n));
            col += part;
        }
    }
    (w.next().is_none() && out.len() == widths.len()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::parts_in_runs;

    #[test]
    fn parts_are_read_from_their_runs() {
        // Q | K in one run of 1536 columns, V alone in the next.
        let runs = [(1000, 1536), (50_000, 512)];
        assert_eq!(
            parts_in_runs(&runs, &[1024, 512, 512]),
            Some(vec![(1000, 1536), (1000 + 4 * 1024, 1536), (50_000, 512)])
        );
        assert_eq!(
            parts_in_runs(&[(0, 2048)], &[1024, 512, 512]),
            Some(vec![(0, 2048), (4096, 2048), (6144, 2048)])
        );
        assert_eq!(parts_in_runs(&runs, &[1024, 1024]), None);
        assert_eq!(parts_in_runs(&runs, &[1024, 512]), None);
    }
}
