// qk_norm_rope.cu: per-head Q/K RMS norms, NeoX RoPE and the K/V cache write
// of one attention call (AttnProblem), for T tokens at positions pos0 + t
// with pos0 read from device memory (graph replays change it in place).
//
// For token t at p = *pos0 + t and pairs (i, i + hd/2):
//   Q head h:  q = rmsnorm(q_in[t][h]) * q_norm;  q_out[t][h] = rope(q, p)
//   KV head g: k = rmsnorm(k_in[t][g]) * k_norm;  K[slot][g] = rope(k, p)
//              v = rmsnorm(v_in[t][g]) (weightless, never roped); V[slot][g] = v
// where slot = p % capacity and rope rotates pair i by the angle
// p * inv_freq[i], computed in f64 (cos/sin rounded to f32 once), so long
// positions keep their precision. k_in = NULL (a KV-shared layer) skips K/V;
// on k_eq_v layers v_in points at the raw K projection.
//
// ALGO = 0: grid (n_heads + n_kv_heads, T); block hd/2 threads, thread i
// owns the pair (i, i + hd/2) of its head (and, in a KV block, of V), the
// norm summed over the block through shared memory. Every block computes
// its own cos/sin, so a token's angles are computed once per head.
// ALGO = 1: grid (T, Y); block 32 WARPS threads. Block (t, y) computes
// token t's hd/2 cos/sin pairs once into shared memory, then warp w runs
// rows y WARPS + w, + Y WARPS, .. of the token's n_heads Q rows, n_kv_heads
// K rows and n_kv_heads V rows (Y = 1 for long calls: the angles are
// computed once per token; a few tokens spread their rows over Y blocks,
// a row per warp, so a decode step waits for one row, not for a warp's
// turn through several): lane l holds the hd/64 consecutive pairs from l hd/64,
// read and written in 16-byte pieces, the norm summed by warp shuffles (no
// barrier per row). Input rows are read in 16-byte pieces when q_in, k_in,
// v_in are 16-byte aligned and their strides multiples of 4 floats (as a
// fused projection output is), element by element otherwise; q_out and the
// caches must be 16-byte aligned (device allocations are).
// Inputs have row strides (elements), so Q, K and V can be read out of one
// fused projection output.
// q_out is f32, or with Q16 = 1 the cache type (f16 / bf16: the operand
// type of the tensor-core attention, which rounds f32 Q to it anyway; the
// wgmma prefill kernel with Q16 = 1 copies it as stored).
// Contract: fp against the f64 oracle (f32 norm reduction; K/V, and Q with
// Q16 = 1, rounded to KV_TYPE, compared after the same rounding).
//
// Defines:
//   KV_TYPE   F16 | BF16 | F32: the cache element type
//   HEAD_DIM  head width (set from the shape; ALGO = 1: a multiple of 256)
//   Q16       0 | 1: q_out in KV_TYPE (F16 or BF16 only) instead of f32
//   ALGO      0 a block per (head, token) | 1 a block per token, a warp per row
//   WARPS     ALGO = 1: warps per block: 4 | 8 | 16

#ifndef KV_TYPE
#error "qk_norm_rope.cu needs KV_TYPE"
#endif
#ifndef Q16
#error "qk_norm_rope.cu needs Q16"
#endif
#ifndef HEAD_DIM
#error "qk_norm_rope.cu needs HEAD_DIM"
#endif
#ifndef ALGO
#error "qk_norm_rope.cu needs ALGO"
#endif
#ifndef WARPS
#error "qk_norm_rope.cu needs WARPS"
#endif

#include "common.cuh"
#include "attn_operand.cuh"

#if KV_TYPE != F16 && KV_TYPE != BF16 && KV_TYPE != F32
#error "KV_TYPE must be F16, BF16 or F32"
#endif
#if Q16 && KV_TYPE == F32
#error "Q16 = 1 writes Q in a 16-bit cache type"
#endif

#if ALGO == 0
DEVI void kv_store(void* cache, u64 i, float v) {
#if KV_TYPE == F32
    reinterpret_cast<float*>(cache)[i] = v;
#elif KV_TYPE == F16
    u16 b;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(b) : "f"(v));
    reinterpret_cast<u16*>(cache)[i] = b;
#else
    const u32 u = __float_as_uint(v);
    const u32 r = u + 0x7fffu + ((u >> 16) & 1u);
    reinterpret_cast<u16*>(cache)[i] = (u16)(r >> 16);
#endif
}

// Sum over the block (hd/2 threads, a multiple of 32).
DEVI float head_sum(float v, float* red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = 0.0f;
    for (int i = 0; i < (int)(blockDim.x >> 5); ++i) t += red[i];
    return t;
}

extern "C" __global__ void __launch_bounds__(512)
qk_norm_rope(const float* __restrict__ q_in, int q_stride, const float* __restrict__ k_in, int k_stride,
             const float* __restrict__ v_in, int v_stride, const float* __restrict__ q_norm,
             const float* __restrict__ k_norm, const double* __restrict__ inv_freq,
             const int* __restrict__ pos0, void* __restrict__ q_out, void* __restrict__ k_cache,
             void* __restrict__ v_cache, int capacity, int rows, int n_heads, int n_kv_heads, float eps) {
    __shared__ float red[16];
    // The decode attention that follows is a programmatic dependent
    // (bind::attention::launch): released now, it streams the cache's older
    // keys while this grid writes Q and the step's K/V, and waits for this
    // grid before it reads them (attn_split.cuh). This grid itself waits
    // for the one ahead (a chained decode step launches it as a dependent)
    // before it reads anything or returns.
    pdl_release_dependents();
    pdl_await_prior();
    const int t = blockIdx.y;
    const int head = blockIdx.x;
    if (t >= rows) return;
    const bool is_q = head < n_heads;
    if (!is_q && k_in == nullptr) return;
    const int half = blockDim.x;
    const int hd = 2 * half;
    const int i = threadIdx.x;
    const int p = *pos0 + t;
    const double a = (double)p * inv_freq[i];
    const float c = (float)cos(a), s = (float)sin(a);
    const float* src = is_q ? q_in + (u64)t * q_stride + (u64)head * hd
                            : k_in + (u64)t * k_stride + (u64)(head - n_heads) * hd;
    const float x0 = src[i], x1 = src[i + half];
    const float rq = rsqrtf(head_sum(x0 * x0 + x1 * x1, red) / (float)hd + eps);
    const float* w = is_q ? q_norm : k_norm;
    const float n0 = x0 * rq * w[i], n1 = x1 * rq * w[i + half];
    const float o0 = n0 * c - n1 * s, o1 = n0 * s + n1 * c;
    if (is_q) {
        const u64 at = ((u64)t * n_heads + head) * hd;
#if Q16
        kv_store(q_out, at + i, o0);
        kv_store(q_out, at + i + half, o1);
#else
        reinterpret_cast<float*>(q_out)[at + i] = o0;
        reinterpret_cast<float*>(q_out)[at + i + half] = o1;
#endif
        return;
    }
    const int g = head - n_heads;
    const u64 slot = (u64)(p % capacity);
    const u64 at = (slot * n_kv_heads + g) * hd;
    kv_store(k_cache, at + i, o0);
    kv_store(k_cache, at + i + half, o1);
    const float* vs = v_in + (u64)t * v_stride + (u64)g * hd;
    const float v0 = vs[i], v1 = vs[i + half];
    __syncthreads();
    const float rv = rsqrtf(head_sum(v0 * v0 + v1 * v1, red) / (float)hd + eps);
    kv_store(v_cache, at + i, v0 * rv);
    kv_store(v_cache, at + i + half, v1 * rv);
}

#elif ALGO == 1

#define HALF (HEAD_DIM / 2)
// Pairs per lane: lane l owns pairs l PER .. l PER + PER - 1.
#define PER (HEAD_DIM / 64)
#if HEAD_DIM % 256 != 0
#error "ALGO = 1 needs HEAD_DIM a multiple of 256 (16-byte pieces per lane)"
#endif
#if WARPS != 4 && WARPS != 8 && WARPS != 16
#error "WARPS must be 4, 8 or 16"
#endif

// PER consecutive floats from src (16-byte pieces when `vec`).
DEVI void load_per(float (&x)[PER], const float* __restrict__ src, bool vec) {
    if (vec) {
#pragma unroll
        for (int k = 0; k < PER; k += 4) {
            const float4 f = *reinterpret_cast<const float4*>(src + k);
            x[k] = f.x;
            x[k + 1] = f.y;
            x[k + 2] = f.z;
            x[k + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int k = 0; k < PER; ++k) x[k] = src[k];
    }
}

// PER consecutive values at element `at` of dst: f32, or (`narrow`) the
// cache type's 16 bits, rounded as the attention kernels round their
// operands (op_pack), in 16-byte (f32) or 8-byte (16-bit) pieces.
DEVI void store_per(void* __restrict__ dst, u64 at, const float (&v)[PER], bool narrow) {
    if (!narrow) {
#pragma unroll
        for (int k = 0; k < PER; k += 4)
            *reinterpret_cast<float4*>(reinterpret_cast<float*>(dst) + at + k) =
                make_float4(v[k], v[k + 1], v[k + 2], v[k + 3]);
        return;
    }
#pragma unroll
    for (int k = 0; k < PER; k += 4)
        *reinterpret_cast<uint2*>(reinterpret_cast<u16*>(dst) + at + k) =
            make_uint2(op_pack(v[k], v[k + 1]), op_pack(v[k + 2], v[k + 3]));
}

extern "C" __global__ void __launch_bounds__(32 * WARPS, 1)
qk_norm_rope(const float* __restrict__ q_in, int q_stride, const float* __restrict__ k_in, int k_stride,
             const float* __restrict__ v_in, int v_stride, const float* __restrict__ q_norm,
             const float* __restrict__ k_norm, const double* __restrict__ inv_freq,
             const int* __restrict__ pos0, void* __restrict__ q_out, void* __restrict__ k_cache,
             void* __restrict__ v_cache, int capacity, int rows, int n_heads, int n_kv_heads, float eps) {
    __shared__ float cs[2][HALF];
    // The decode attention that follows is a programmatic dependent (as
    // with ALGO = 0), and this grid waits for the one ahead.
    pdl_release_dependents();
    pdl_await_prior();
    const int t = blockIdx.x;
    if (t >= rows) return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int i0 = lane * PER;
    const bool kv = k_in != nullptr;
    const bool vec = (((u64)q_in | (u64)k_in | (u64)v_in) & 15) == 0 && ((q_stride | k_stride | v_stride) & 3) == 0;
    const int n_rows = n_heads + (kv ? 2 * n_kv_heads : 0);
    const int stride = gridDim.y * WARPS;
    // Row r of the token: Q head r, then K head r - n_heads, then V head
    // r - n_heads - n_kv_heads.
    auto kind_of = [&](int r) { return r < n_heads ? 0 : (r < n_heads + n_kv_heads ? 1 : 2); };
    auto head_of = [&](int r, int kind) {
        return kind == 0 ? r : (kind == 1 ? r - n_heads : r - n_heads - n_kv_heads);
    };
    auto load_row = [&](int r, float (&x0)[PER], float (&x1)[PER]) {
        const int kind = kind_of(r), h = head_of(r, kind);
        const float* src = kind == 0   ? q_in + (u64)t * q_stride + (u64)h * HEAD_DIM
                           : kind == 1 ? k_in + (u64)t * k_stride + (u64)h * HEAD_DIM
                                       : v_in + (u64)t * v_stride + (u64)h * HEAD_DIM;
        load_per(x0, src + i0, vec);
        load_per(x1, src + HALF + i0, vec);
    };
    // The warp's first row is requested before the angles, so its load
    // latency overlaps the f64 math (a decode step waits for one row).
    int r = blockIdx.y * WARPS + warp;
    float x0[PER], x1[PER];
    if (r < n_rows) load_row(r, x0, x1);
    const int p = *pos0 + t;
    // sincospi of the angle over pi: its argument reduction is exact and
    // inline (sincos calls a slow-path reduction that would keep registers
    // on the stack). The multiply by 1/pi adds f64 rounding error, some
    // 1e-16 relative, far below the f32 the results are rounded to.
    for (int i = threadIdx.x; i < HALF; i += blockDim.x) {
        double sn, cn;
        sincospi((double)p * inv_freq[i] * 0.31830988618379067, &sn, &cn);
        cs[0][i] = (float)cn;
        cs[1][i] = (float)sn;
    }
    __syncthreads();
    const u64 slot = (u64)(p % capacity);
    for (; r < n_rows; r += stride) {
        const int kind = kind_of(r), h = head_of(r, kind);
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < PER; ++k) ss += x0[k] * x0[k] + x1[k] * x1[k];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        const float rq = rsqrtf(ss / (float)HEAD_DIM + eps);
        // Normalized (and, for Q and K, weighted and rotated) in place.
        if (kind == 2) {
#pragma unroll
            for (int k = 0; k < PER; ++k) {
                x0[k] *= rq;
                x1[k] *= rq;
            }
        } else {
            const float* w = kind == 0 ? q_norm : k_norm;
#pragma unroll
            for (int k = 0; k < PER; ++k) {
                const float n0 = x0[k] * rq * w[i0 + k], n1 = x1[k] * rq * w[HALF + i0 + k];
                const float c = cs[0][i0 + k], s = cs[1][i0 + k];
                x0[k] = n0 * c - n1 * s;
                x1[k] = n0 * s + n1 * c;
            }
        }
        if (kind == 0) {
            const u64 at = ((u64)t * n_heads + h) * HEAD_DIM;
            store_per(q_out, at + i0, x0, Q16 != 0);
            store_per(q_out, at + HALF + i0, x1, Q16 != 0);
        } else {
            void* cache = kind == 1 ? k_cache : v_cache;
            const u64 at = (slot * n_kv_heads + h) * HEAD_DIM;
            store_per(cache, at + i0, x0, KV_TYPE != F32);
            store_per(cache, at + HALF + i0, x1, KV_TYPE != F32);
        }
        if (r + stride < n_rows) load_row(r + stride, x0, x1);
    }
}
#else
#error "ALGO must be 0 or 1"
#endif
