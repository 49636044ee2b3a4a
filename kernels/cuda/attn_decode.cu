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
// ALGO = 3: the key-major streaming kernel of attn_keymajor.cuh: ALGO 2's
// grid, stages, partials and combine, with the keys on the mma's M (S^T =
// K Q^T, O^T = V^T P^T), so a CTA of a few rows carries no padding rows.
// ALGO = 0: the CUDA-core kernel of attn_scalar.cuh, one warp per row over
// every visible key (f32 caches; contract fp).
// Layouts as attn_prefill.cu; scratch holds SPLITS n_q n_heads (HEAD_DIM +
// 2) floats, SPLITS <= ATTN_MAX_SPLITS (bind::attention::MAX_SPLITS).
//
// Defines:
//   ALGO          0 scalar | 1 tensor cores with split-KV | 2 streaming split-KV |
//                 3 key-major streaming split-KV
//   HEAD_DIM      head width: 256 | 512 (set from the shape)
//   KV_TYPE       F16 | BF16 | F32 (set from the shape; F32: ALGO 0 only)
//   SCALAR_WARPS  warps per block of the scalar kernel
//   BQ            rows (token x head pairs) per CTA: 16 | 32 | 64 (ALGO 2: 16 | 32,
//                 and with ALGO 3: 8 | 16 | 32)
//   BKV           keys per tile: 32 | 64 (ALGO 2, 3: 16 | 32 | 64)
//   KW            ALGO 2, 3: warps splitting each tile's 16-key sub-blocks: 1 | 2 | 4
//   WD            warps splitting S columns (ALGO 1) and O head dims: 1 | 2 | 4 (ALGO 2, 3: | 8)
//   QSPLIT        ALGO 2: 0 every dim warp computes S over the whole head dim |
//                 1 over its own head dims, the partials summed in shared memory
//   STAGES        K/V tile buffers: 1 | 2 (ALGO 2, 3: 2 | 3 | 4)
//   CP_ASYNC      0 | 1: stage K/V with cp.async
//   BULK          ALGO 3: 0 cp.async chunks | 1 a bulk copy (TMA, sm_90) per key row
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
#ifndef BULK
#error "attn_decode.cu needs BULK"
#endif
#ifndef SPLITS
#error "attn_decode.cu needs SPLITS"
#endif

#include "common.cuh"
#include "attn_operand.cuh"
#include "attn_split.cuh"

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
#elif ALGO == 2
#include "attn_stream.cuh"
#else
#include "attn_keymajor.cuh"
#endif

// The combine is launched as a programmatic dependent of the split kernel
// (attn_split.cuh: the launch order), so its launch overlaps the streaming
// kernels' work; it lets the next programmatic dependent start early too.
//
// Block (row, y) of 256 threads merges head dims 64 y .. 64 y + 63 of one
// (token, head) row over the `splits` partials: O = sum_z e^(m_z - M) O_z /
// sum_z e^(m_z - M) l_z (0 where no split saw a key). Thread (zl, c) takes
// the splits zl, zl + 16, .. (at most ATTN_MAX_SPLITS / 16) at the float4
// column c: it issues every load of them (m, l and its O columns) before
// it uses any, so the block waits one memory latency, not one per split,
// then merges them over its own running max; the 16 lanes of splits are
// merged through shared memory.
#define COMBINE_PER (ATTN_MAX_SPLITS / 16)
extern "C" __global__ void __launch_bounds__(256)
attn_combine(const float* __restrict__ scratch, float* __restrict__ out, int n_q, int n_heads, int splits) {
    __shared__ float4 acc_s[16][16];
    __shared__ float m_s[16], l_s[16];
    pdl_release_dependents();
    pdl_await_prior();
    const int tid = threadIdx.x;
    const u64 row = blockIdx.x;
    const u64 rows = (u64)n_q * n_heads;
    if (row >= rows) return;
    const float* ml = scratch + (u64)splits * rows * HEAD_DIM;
    const int c = tid & 15, zl = tid >> 4;
    const int d = blockIdx.y * 64 + c * 4;
    const bool in = d < HEAD_DIM;

    float2 mlz[COMBINE_PER];
    float4 v[COMBINE_PER];
#pragma unroll
    for (int i = 0; i < COMBINE_PER; ++i) {
        const int z = zl + 16 * i;
        mlz[i] = make_float2(-INFINITY, 0.0f);
        v[i] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (z < splits) {
            mlz[i] = *reinterpret_cast<const float2*>(ml + ((u64)z * rows + row) * 2);
            if (in) v[i] = *reinterpret_cast<const float4*>(scratch + ((u64)z * rows + row) * HEAD_DIM + d);
        }
    }
    float M = -INFINITY;
#pragma unroll
    for (int i = 0; i < COMBINE_PER; ++i) M = fmaxf(M, mlz[i].x);
    float L = 0.0f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int i = 0; i < COMBINE_PER; ++i) {
        if (mlz[i].x == -INFINITY) continue;
        const float w = expf(mlz[i].x - M);
        acc.x += w * v[i].x;
        acc.y += w * v[i].y;
        acc.z += w * v[i].z;
        acc.w += w * v[i].w;
        L += w * mlz[i].y;
    }
    acc_s[zl][c] = acc;
    if (c == 0) {
        m_s[zl] = M;
        l_s[zl] = L;
    }
    __syncthreads();
    if (zl == 0 && in) {
        float Mx = -INFINITY;
#pragma unroll
        for (int k = 0; k < 16; ++k) Mx = fmaxf(Mx, m_s[k]);
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
        float Lx = 0.0f;
#pragma unroll
        for (int k = 0; k < 16; ++k) {
            if (m_s[k] == -INFINITY) continue;
            const float f = expf(m_s[k] - Mx);
            const float4 b = acc_s[k][c];
            a.x += f * b.x;
            a.y += f * b.y;
            a.z += f * b.z;
            a.w += f * b.w;
            Lx += f * l_s[k];
        }
        const float inv = Lx > 0.0f ? 1.0f / Lx : 0.0f;
        *reinterpret_cast<float4*>(out + row * HEAD_DIM + d) = make_float4(a.x * inv, a.y * inv, a.z * inv, a.w * inv);
    }
}
#endif
