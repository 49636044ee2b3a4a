// qk_norm_rope.cu: per-head Q/K RMS norms, NeoX RoPE and the K/V cache write
// of one attention call (AttnProblem), for T tokens at positions pos0 + t
// with pos0 read from device memory (graph replays change it in place).
//
// For token t at p = *pos0 + t, with hd = 2 * blockDim.x and pairs (i, i + hd/2):
//   Q head h:  q = rmsnorm(q_in[t][h]) * q_norm;  q_out[t][h] = rope(q, p)
//   KV head g: k = rmsnorm(k_in[t][g]) * k_norm;  K[slot][g] = rope(k, p)
//              v = rmsnorm(v_in[t][g]) (weightless, never roped); V[slot][g] = v
// where slot = p % capacity and rope rotates pair i by the angle
// p * inv_freq[i], computed in f64 (cos/sin rounded to f32 once), so long
// positions keep their precision. k_in = NULL (a KV-shared layer) skips K/V;
// on k_eq_v layers v_in points at the raw K projection.
//
// Grid: (n_heads + n_kv_heads, T); block: hd/2 threads, thread i owns the
// pair (i, i + hd/2) of its head. Inputs have row strides (elements), so Q,
// K and V can be read out of one fused projection output.
// q_out is f32, or with Q16 = 1 the cache type (f16 / bf16: the operand
// type of the tensor-core attention, which rounds f32 Q to it anyway; the
// wgmma prefill kernel with Q16 = 1 copies it as stored).
// Contract: fp against the f64 oracle (f32 norm reduction; K/V, and Q with
// Q16 = 1, rounded to KV_TYPE, compared after the same rounding).
//
// Defines:
//   KV_TYPE  F16 | BF16 | F32: the cache element type
//   Q16      0 | 1: q_out in KV_TYPE (F16 or BF16 only) instead of f32

#ifndef KV_TYPE
#error "qk_norm_rope.cu needs KV_TYPE"
#endif
#ifndef Q16
#error "qk_norm_rope.cu needs Q16"
#endif

#include "common.cuh"

#define F16 1
#define BF16 2
#define F32 3
#if KV_TYPE != F16 && KV_TYPE != BF16 && KV_TYPE != F32
#error "KV_TYPE must be F16, BF16 or F32"
#endif
#if Q16 && KV_TYPE == F32
#error "Q16 = 1 writes Q in a 16-bit cache type"
#endif

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
    // grid before it reads them (attn_split.cuh).
    pdl_release_dependents();
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
