// moe_route.cu: the mixture-of-experts router of a decode step, 1..8 tokens
// (entries moe_route_n1 .. moe_route_n8, NT tokens each).
//
// For each token t < NT and expert e < E (n_experts):
//   logits[t][e] = sum_c W[e][c] * z[t][c]                       (c < d)
//   ids[t][0..K)  = the K = n_used experts of largest logit, in rank order
//   weights[t][j] = p_j / max(sum_j p_j, 2^-14) * scale[ids[t][j]]
// where p_j = softmax(logits[t])[ids[t][j]] over all E experts (f32: max
// subtracted, expf, one sum), 2^-14 the lower bound llama.cpp clamps the
// sum to, and scale the per-expert scale (NULL: 1).
//
// Selection rule (kernels/src/oracle/moe.rs states the same): experts rank
// by logit, larger first; among equal logits the lower expert index ranks
// first (IEEE comparisons: -0.0 ties +0.0). Ranking the logits is ranking
// the probabilities without depending on the exp implementation, whose
// rounding could merge two distinct logits into one probability.
//
// Contract: the logits are fp (reassociated f32 sums of exactly dequantized
// weights) against the f64 oracle; the selection is bit-exact given the
// kernel's own logits, which are an output: the check replays the rule on
// them (ids identical, ties included) and judges the weights fp against
// the f64 softmax of those logits. Each logit is computed by one fixed
// thread-to-chunk assignment and a fixed reduction tree whatever the
// expert's position, so experts with identical router rows get bit-identical
// logits and tie as the rule says; a rule on a CPU replay of the sums would
// have to reproduce the GPU's FMA order exactly, which this choice avoids.
//
// Inputs:
//   w       the router `ffn_gate_inp.weight` as GGUF stores it, E rows of d:
//           F32 (16-byte loads, d % 4 == 0), F16 / BF16 (16-byte loads of 8,
//           d % 8 == 0), Q8_0 / Q4_0 blocks of 34 / 18 bytes (2-byte loads,
//           d % 32 == 0).
//   z       f32 [NT][d], the router input the engine computes (the residual
//           RMS-normalized without weight, times the router scale and d^-1/2);
//           16-byte aligned rows.
//   scale   f32 [E] per-expert scale, or NULL.
// Outputs: logits f32 [NT][E], ids i32 [NT][K], weights f32 [NT][K], every
// element written once. counter: one u32, zero before the first launch; the
// kernel leaves it zero (the last block resets it), so it is never reset
// between launches or graph replays; one counter per concurrently running
// launch.
//
// Groups: grid.y = G runs G groups of NT tokens in one launch (a prefill
// chunk): group g reads z rows g*NT .. g*NT + NT - 1, writes its logits,
// ids and weights at those rows, and takes its tickets on counter[g] (G
// counters, zero before the first launch and left zero). grid.y = 1 is the
// decode step.
//
// Grid: grid.x = ceil(E / ROWS), block = WARPS*32 threads. A block owns
// ROWS experts; its WARPS warps split d (warp w takes chunks w*32+lane,
// stepping WARPS*32), shuffles reduce each warp and warp 0 adds the warps'
// sums in warp order. Every block writes its logits, fences, and takes a
// ticket; the block with the last ticket ranks every token (warp w takes
// tokens w, w+WARPS, ...; E <= 256, K <= 32) and resets the counter.
//
// Defines:
//   WTYPE   router weight type: F32 | F16 | BF16 | Q8_0 | Q4_0
//   ROWS    experts per block: 1, 2, 4
//   WARPS   warps per block, splitting d: 1, 2, 4, 8

#ifndef WTYPE
#error "moe_route.cu needs WTYPE"
#endif
#ifndef ROWS
#error "moe_route.cu needs ROWS"
#endif
#ifndef WARPS
#error "moe_route.cu needs WARPS"
#endif

#include "common.cuh"
#include "kquant.cuh"

#define F32 0
#if WTYPE != F32 && !IS_W16(WTYPE) && WTYPE != Q8_0 && WTYPE != Q4_0
#error "moe_route.cu: WTYPE must be F32, F16, BF16, Q8_0 or Q4_0"
#endif
#if ROWS != 1 && ROWS != 2 && ROWS != 4
#error "moe_route.cu: ROWS must be 1, 2 or 4"
#endif
#if WARPS != 1 && WARPS != 2 && WARPS != 4 && WARPS != 8
#error "moe_route.cu: WARPS must be 1, 2, 4 or 8"
#endif

// The most experts and chosen experts the ranking holds (8 logits per lane;
// one chosen expert per lane).
#define MAX_EXPERTS 256
#define MAX_USED 32

// Elements per chunk: one 16-byte load (F32, F16, BF16) or one block.
#if WTYPE == F32
#define CHUNK 4
#elif IS_W16(WTYPE)
#define CHUNK 8
#else
#define CHUNK 32
#endif

// One lane's chunk of a router row: 16 bytes of values (F32, F16, BF16),
// or one block's quants and scale.
struct RouteChunk {
#if WTYPE == Q8_0
    u32 w[8];
#else
    u32 w[4];
#endif
    float d;
};

DEVI RouteChunk load_route_chunk(const u8* __restrict__ w, int row, int c, int d) {
    RouteChunk ch;
#if WTYPE == F32 || IS_W16(WTYPE)
    const uint4 v = ld_stream16(w + ((u64)row * d + (u64)c * CHUNK) * (WTYPE == F32 ? 4 : 2));
    ch.w[0] = v.x; ch.w[1] = v.y; ch.w[2] = v.z; ch.w[3] = v.w;
    ch.d = 1.0f;
#else
    // A block: f16 d, then 32 int8 quants (Q8_0) or 16 nibble bytes (Q4_0:
    // byte j holds element j low and j + 16 high, value q - 8); blocks are
    // 2-byte aligned.
    const int bsz = WTYPE == Q8_0 ? 34 : 18;
    const u16* bp = reinterpret_cast<const u16*>(w + ((u64)row * (d / 32) + c) * bsz);
    ch.d = h2f(__ldg(bp));
#pragma unroll
    for (int i = 0; i < (WTYPE == Q8_0 ? 8 : 4); ++i)
        ch.w[i] = (u32)__ldg(bp + 1 + 2 * i) | ((u32)__ldg(bp + 2 + 2 * i) << 16);
#endif
    return ch;
}

// sum_i w_i * z_i over the chunk (z one token's row, e the chunk's first
// element), the weights exactly dequantized. The block forms scale the
// quant sum once, with an explicit multiply so no FMA contraction can
// differ between rows.
DEVI float route_chunk_dot(const RouteChunk& ch, const float* __restrict__ z, int e) {
#if WTYPE == F32
    const float4 x = __ldg(reinterpret_cast<const float4*>(z + e));
    float s = __int_as_float((int)ch.w[0]) * x.x;
    s = fmaf(__int_as_float((int)ch.w[1]), x.y, s);
    s = fmaf(__int_as_float((int)ch.w[2]), x.z, s);
    return fmaf(__int_as_float((int)ch.w[3]), x.w, s);
#elif IS_W16(WTYPE)
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float4 x = __ldg(reinterpret_cast<const float4*>(z + e + 4 * i));
        const u32 a = ch.w[2 * i], b = ch.w[2 * i + 1];
#if WTYPE == F16
        s = fmaf(h2f((u16)(a & 0xffffu)), x.x, s);
        s = fmaf(h2f((u16)(a >> 16)), x.y, s);
        s = fmaf(h2f((u16)(b & 0xffffu)), x.z, s);
        s = fmaf(h2f((u16)(b >> 16)), x.w, s);
#else
        s = fmaf(__int_as_float((int)(a << 16)), x.x, s);
        s = fmaf(__int_as_float((int)(a & 0xffff0000u)), x.y, s);
        s = fmaf(__int_as_float((int)(b << 16)), x.z, s);
        s = fmaf(__int_as_float((int)(b & 0xffff0000u)), x.w, s);
#endif
    }
    return s;
#elif WTYPE == Q8_0
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const u32 q = ch.w[i];
        const float4 x = __ldg(reinterpret_cast<const float4*>(z + e + 4 * i));
        s = fmaf((float)(i8)(q & 0xff), x.x, s);
        s = fmaf((float)(i8)((q >> 8) & 0xff), x.y, s);
        s = fmaf((float)(i8)((q >> 16) & 0xff), x.z, s);
        s = fmaf((float)(i8)(q >> 24), x.w, s);
    }
    return __fmul_rn(ch.d, s);
#else
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const u32 q = ch.w[i];
        const float4 xl = __ldg(reinterpret_cast<const float4*>(z + e + 4 * i));
        const float4 xh = __ldg(reinterpret_cast<const float4*>(z + e + 16 + 4 * i));
        s = fmaf((float)((int)(q & 0xf) - 8), xl.x, s);
        s = fmaf((float)((int)((q >> 8) & 0xf) - 8), xl.y, s);
        s = fmaf((float)((int)((q >> 16) & 0xf) - 8), xl.z, s);
        s = fmaf((float)((int)((q >> 24) & 0xf) - 8), xl.w, s);
        s = fmaf((float)((int)((q >> 4) & 0xf) - 8), xh.x, s);
        s = fmaf((float)((int)((q >> 12) & 0xf) - 8), xh.y, s);
        s = fmaf((float)((int)((q >> 20) & 0xf) - 8), xh.z, s);
        s = fmaf((float)((int)((q >> 28) & 0xf) - 8), xh.w, s);
    }
    return __fmul_rn(ch.d, s);
#endif
}

// acc[tt] += v for tt == t (a run-time token index into registers).
template <int NT>
DEVI void add_at(float (&acc)[NT], int t, float v) {
#pragma unroll
    for (int tt = 0; tt < NT; ++tt)
        if (tt == t) acc[tt] += v;
}

// A load that bypasses L1 (the logits other blocks wrote).
DEVI float ld_cg(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

// Whether (v, i) ranks before (bv, bi): larger logit, then lower index.
DEVI bool ranks_before(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

// Ranks one token's logits (warp-wide) and writes its ids and weights.
DEVI void route_select(const float* __restrict__ lrow, const float* __restrict__ scale,
                       int* __restrict__ ids, float* __restrict__ weights, int n_experts, int n_used) {
    const int lane = threadIdx.x % 32;
    float lv[MAX_EXPERTS / 32];
#pragma unroll
    for (int i = 0; i < MAX_EXPERTS / 32; ++i) {
        const int e = lane + 32 * i;
        lv[i] = e < n_experts ? ld_cg(lrow + e) : -INFINITY;
    }
    u32 taken = 0;
    int my_id = 0;
    float my_v = 0.f, top = 0.f;
    for (int j = 0; j < n_used; ++j) {
        // The lane's best untaken expert (its experts ascend with i, so a
        // strict > keeps the lower index of a tie), then the warp's.
        float bv = -INFINITY;
        int bi = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < MAX_EXPERTS / 32; ++i) {
            const int e = lane + 32 * i;
            if (e < n_experts && !((taken >> i) & 1u) && ranks_before(lv[i], e, bv, bi)) {
                bv = lv[i];
                bi = e;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ranks_before(ov, oi, bv, bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
        if (j == 0) top = bv;
        if (lane == j) {
            my_id = bi;
            my_v = bv;
        }
    }
    // The softmax denominator over every expert, the top logit its maximum.
    float den = 0.f;
#pragma unroll
    for (int i = 0; i < MAX_EXPERTS / 32; ++i) {
        if (lane + 32 * i < n_experts) den += expf(lv[i] - top);
    }
    den = warp_sum(den);
    const float p = lane < n_used ? expf(my_v - top) / den : 0.f;
    const float sum = fmaxf(warp_sum(p), 6.103515625e-5f);
    if (lane < n_used) {
        const float s = scale != nullptr ? __ldg(scale + my_id) : 1.0f;
        ids[lane] = my_id;
        weights[lane] = p / sum * s;
    }
}

template <int NT>
DEVI void moe_route_body(const u8* __restrict__ w, const float* __restrict__ z, const float* __restrict__ scale,
                         float* __restrict__ logits, int* __restrict__ ids, float* __restrict__ weights,
                         u32* __restrict__ counter, int d, int n_experts, int n_used) {
    pdl_enter();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = blockIdx.x * ROWS;
    // This block's group of NT tokens (grid.y groups per launch); the
    // output pointers move after the dot products, so they are not live
    // across them.
    z += (u64)blockIdx.y * NT * d;
    float acc[ROWS][NT];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] = 0.f;
    const int nchunks = d / CHUNK;
    for (int c = warp * 32 + lane; c < nchunks; c += WARPS * 32) {
        RouteChunk ch[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            // Rows past the end re-read the last row; their sums are dropped.
            ch[r] = load_route_chunk(w, min(row0 + r, n_experts - 1), c, d);
        }
        // Tokens at run time, one token's z in registers at a time:
        // unrolled, every token's z loads are hoisted next to the chunks.
#pragma unroll 1
        for (int t = 0; t < NT; ++t) {
#pragma unroll
            for (int r = 0; r < ROWS; ++r) add_at<NT>(acc[r], t, route_chunk_dot(ch[r], z + (u64)t * d, c * CHUNK));
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] = warp_sum(acc[r][t]);
#if WARPS > 1
    __shared__ float red[WARPS][ROWS * NT];
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
            for (int t = 0; t < NT; ++t) red[warp][r * NT + t] = acc[r][t];
    }
    __syncthreads();
    if (warp == 0 && lane == 0) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                float s = red[0][r * NT + t];
#pragma unroll
                for (int v = 1; v < WARPS; ++v) s += red[v][r * NT + t];
                acc[r][t] = s;
            }
    }
#endif
    {
        const u64 g = blockIdx.y;
        logits += g * NT * n_experts;
        ids += g * NT * n_used;
        weights += g * NT * n_used;
        counter += g;
    }
    if (warp == 0 && lane == 0) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
            if (row0 + r < n_experts) {
#pragma unroll
                for (int t = 0; t < NT; ++t) logits[(u64)t * n_experts + row0 + r] = acc[r][t];
            }
        // Publish the logits before the ticket.
        __threadfence();
    }
    __shared__ u32 last;
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int t = warp; t < NT; t += WARPS)
        route_select(logits + (u64)t * n_experts, scale, ids + (u64)t * n_used, weights + (u64)t * n_used,
                     n_experts, n_used);
    if (threadIdx.x == 0) *counter = 0u;
}

#define MOE_ROUTE_ENTRY(NT)                                                                               \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) moe_route_n##NT(                            \
        const u8* w, const float* z, const float* scale, float* logits, int* ids, float* weights,         \
        u32* counter, int d, int n_experts, int n_used) {                                                 \
        moe_route_body<NT>(w, z, scale, logits, ids, weights, counter, d, n_experts, n_used);             \
    }
MOE_ROUTE_ENTRY(1)
MOE_ROUTE_ENTRY(2)
MOE_ROUTE_ENTRY(3)
MOE_ROUTE_ENTRY(4)
MOE_ROUTE_ENTRY(5)
MOE_ROUTE_ENTRY(6)
MOE_ROUTE_ENTRY(7)
MOE_ROUTE_ENTRY(8)
