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
// ALGO = 0: the CUDA-core kernel of attn_scalar.cuh, one warp per row over
// every visible key (f32 caches; contract fp).
// Layouts as attn_prefill.cu; scratch holds SPLITS n_q n_heads (HEAD_DIM +
// 2) floats.
//
// Defines:
//   ALGO          0 scalar | 1 tensor cores with split-KV
//   HEAD_DIM      head width: 256 | 512 (set from the shape)
//   KV_TYPE       F16 | BF16 | F32 (set from the shape; F32: ALGO 0 only)
//   SCALAR_WARPS  warps per block of the scalar kernel
//   BQ            rows (token x head pairs) per CTA: 16 | 32 | 64
//   BKV           keys per tile: 32 | 64
//   WD            warps splitting S columns and O head dims: 1 | 2 | 4
//   STAGES        K/V tile buffers: 1 | 2
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
#ifndef WD
#error "attn_decode.cu needs WD"
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

#if ALGO == 0
#define ATTN_SCALAR_ENTRY attn_decode
#include "attn_scalar.cuh"
#else
#define ATTN_ENTRY attn_decode
#define SPLIT 1
#define WINDOWED 1
#define COUNT_TILES 0
#include "attn_core.cuh"

// One block per (token, head) row; HEAD_DIM / 2 threads, two dims each.
extern "C" __global__ void __launch_bounds__(256)
attn_combine(const float* __restrict__ scratch, float* __restrict__ out, int n_q, int n_heads, int splits) {
    const u64 row = blockIdx.x;
    const u64 rows = (u64)n_q * n_heads;
    if (row >= rows) return;
    const float* ml = scratch + (u64)splits * rows * HEAD_DIM;
    float M = -INFINITY;
    for (int z = 0; z < splits; ++z) M = fmaxf(M, ml[((u64)z * rows + row) * 2]);
    for (int d = threadIdx.x; d < HEAD_DIM; d += blockDim.x) {
        float L = 0.0f, acc = 0.0f;
        for (int z = 0; z < splits; ++z) {
            const float mz = ml[((u64)z * rows + row) * 2];
            if (mz == -INFINITY) continue;
            const float w = expf(mz - M);
            L += w * ml[((u64)z * rows + row) * 2 + 1];
            acc += w * scratch[((u64)z * rows + row) * HEAD_DIM + d];
        }
        out[row * HEAD_DIM + d] = L > 0.0f ? acc / L : 0.0f;
    }
}
#endif
