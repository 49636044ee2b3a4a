// attn_decode.cu: attention of 1..8 query tokens over a long cache
// (flash-decoding), captured once in a CUDA graph and replayed.
//
// pos0 (the first query's position) is read from device memory (pos0_dev),
// so a replay sees the current length; the grid is fixed by the plan:
// ALGO = 1: (ceil(n_q / (BQ / G)), n_kv_heads, SPLITS) CTAs of the
// tensor-core tile loop (attn_core.cuh with SPLIT = 1), every CTA taking an
// equal share of the key tiles the current length and window make visible
// (a sliding layer reads only its window out of the ring) and writing
// unnormalized partials (O, m, l) to scratch; then attn_combine merges the
// SPLITS partials of each (token, head) row: O = sum_z e^(m_z - M) O_z /
// sum_z e^(m_z - M) l_z.
// ALGO = 2: the streaming kernel of attn_stream.cuh: (ceil(n_q / (BQ /
// G)), n_kv_heads, SPLITS) CTAs of KW x WD warps, each splitting its keys
// among KW warps and streaming K/V through STAGES cp.async buffers, the same
// partials and the same combine.
// ALGO = 0: the CUDA-core kernel of attn_scalar.cuh, one warp per row over
// every visible key (f32 caches; contract fp).
// Layouts as attn_prefill.cu; scratch holds SPLITS n_q n_heads (HEAD_DIM +
// 2) floats, SPLITS <= ATTN_MAX_SPLITS (bind::attention::MAX_SPLITS).
//
// Defines:
//   ALGO          0 scalar | 1 tensor cores with split-KV | 2 streaming split-KV
//   HEAD_DIM      head width: 256 | 512 (set from the shape)
//   KV_TYPE       F16 | BF16 | F32 (set from the shape; F32: ALGO 0 only)
//   SCALAR_WARPS  warps per block of the scalar kernel
//   BQ            rows (token x head pairs) per CTA: 16 | 32 | 64 (ALGO 2: 16 | 32)
//   BKV           keys per tile: 32 | 64 (ALGO 2: 16 | 32 | 64)
//   KW            ALGO 2: warps splitting each tile's 16-key sub-blocks: 1 | 2 | 4
//   WD            warps splitting S columns (ALGO 1) and O head dims: 1 | 2 | 4 (ALGO 2: | 8)
//   QSPLIT        ALGO 2: 0 every dim warp computes S over the whole head dim |
//                 1 over its own head dims, the partials summed in shared memory
//   STAGES        K/V tile buffers: 1 | 2 (ALGO 2: 2 | 3 | 4)
//   CP_ASYNC      0 | 1: stage K/V with cp.async
//   SPLITS        KV splits (grid.z); 0 = chosen from the planned length

#ifndef ALGO
#error "attn_decode.cu needs ALGO"
#endif
#ifndef HEAD_DIM
#error "attn_decode.cu needs HEAD_DIM"
#endif
#ifndef KV_TYPE
#error "attn_decode.cu needs KV_TYPE"
#endif
#ifndef SCALAR_WARPS
#error "attn_decode.cu needs SCALAR_WARPS"
#endif
#ifndef BQ
#error "attn_decode.cu needs BQ"
#endif
#ifndef BKV
#error "attn_decode.cu needs BKV"
#endif
#ifndef KW
#error "attn_decode.cu needs KW"
#endif
#ifndef WD
#error "attn_decode.cu needs WD"
#endif
#ifndef QSPLIT
#error "attn_decode.cu needs QSPLIT"
#endif
#ifndef STAGES
#error "attn_decode.cu needs STAGES"
#endif
#ifndef CP_ASYNC
#error "attn_decode.cu needs CP_ASYNC"
#endif
#ifndef SPLITS
#error "attn_decode.cu needs SPLITS"
#endif

#include "common.cuh"
#include "attn_operand.cuh"

// Most splits a launch may have (bind::attention::MAX_SPLITS).
#define ATTN_MAX_SPLITS 256

#if ALGO == 0
#define ATTN_SCALAR_ENTRY attn_decode
#include "attn_scalar.cuh"
#else
#if ALGO == 1
#define ATTN_ENTRY attn_decode
#define SPLIT 1
#define WINDOWED 1
#define COUNT_TILES 0
#include "attn_core.cuh"
#else
#include "attn_stream.cuh"
#endif

// Block (row, y) of 256 threads merges head dims 64 y .. 64 y + 63 of one
// (token, head) row over the `splits` partials: O = sum_z e^(m_z - M) O_z /
// sum_z e^(m_z - M) l_z (0 where no split saw a key). Splits are spread over
// 16 lanes of 16 float4 columns, so each thread issues only splits / 16
// independent loads.
extern "C" __global__ void __launch_bounds__(256)
attn_combine(const float* __restrict__ scratch, float* __restrict__ out, int n_q, int n_heads, int splits) {
    __shared__ float w_s[ATTN_MAX_SPLITS];
    __shared__ float red[8];
    __shared__ float4 acc_s[16][16];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u64 row = blockIdx.x;
    const u64 rows = (u64)n_q * n_heads;
    if (row >= rows) return;
    const float* ml = scratch + (u64)splits * rows * HEAD_DIM;

    float M = -INFINITY;
    for (int z = tid; z < splits; z += 256) M = fmaxf(M, ml[((u64)z * rows + row) * 2]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    if (lane == 0) red[warp] = M;
    __syncthreads();
    M = red[0];
#pragma unroll
    for (int i = 1; i < 8; ++i) M = fmaxf(M, red[i]);
    __syncthreads();
    float L = 0.0f;
    for (int z = tid; z < splits; z += 256) {
        const float mz = ml[((u64)z * rows + row) * 2];
        const float w = mz == -INFINITY ? 0.0f : expf(mz - M);
        w_s[z] = w;
        if (w != 0.0f) L += w * ml[((u64)z * rows + row) * 2 + 1];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
    if (lane == 0) red[warp] = L;
    __syncthreads();
    L = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) L += red[i];

    const int c = tid & 15, zl = tid >> 4;
    const int d = blockIdx.y * 64 + c * 4;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (d < HEAD_DIM) {
        for (int z = zl; z < splits; z += 16) {
            const float w = w_s[z];
            if (w == 0.0f) continue;
            const float4 v = *reinterpret_cast<const float4*>(scratch + ((u64)z * rows + row) * HEAD_DIM + d);
            acc.x += w * v.x;
            acc.y += w * v.y;
            acc.z += w * v.z;
            acc.w += w * v.w;
        }
    }
    acc_s[zl][c] = acc;
    __syncthreads();
    if (zl == 0 && d < HEAD_DIM) {
        float4 a = acc_s[0][c];
        for (int k = 1; k < 16; ++k) {
            const float4 b = acc_s[k][c];
            a.x += b.x;
            a.y += b.y;
            a.z += b.z;
            a.w += b.w;
        }
        const float inv = L > 0.0f ? 1.0f / L : 0.0f;
        *reinterpret_cast<float4*>(out + row * HEAD_DIM + d) = make_float4(a.x * inv, a.y * inv, a.z * inv, a.w * inv);
    }
}
#endif
