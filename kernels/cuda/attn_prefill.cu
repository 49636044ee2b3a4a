// attn_prefill.cu: attention of a prefill chunk (queries at positions
// pos0 .. pos0 + n_q over keys 0 .. pos0 + n_q of one layer's K/V cache,
// causal, optionally sliding-window), FlashAttention-2 style.
//
// ALGO = 0: the CUDA-core kernel of attn_scalar.cuh (f16, bf16 or f32
//           caches; contract fp).
// ALGO = 1: the tensor-core tile loop of attn_core.cuh with GQA packing,
//           cp.async staging and, with WINDOWED = 1, the KV tiles outside
//           every row's window skipped (contract approx: Q, K, V and P are
//           rounded to the cache type, f32 accumulation and softmax).
// ALGO = 2: the same tile loop on Hopper's wgmma (attn_wgmma.cuh, sm_90a):
//           scores and probabilities stay in registers; same contract.
// Layouts (docs/calling-convention.md): q [n_q][n_heads][HEAD_DIM], f32
// (or, ALGO 2 with Q16 = 1, the cache type); out [n_q][n_heads][HEAD_DIM],
// f32 (or, ALGO 2, the output projection's DQ_F16 / DQ_BF16 format);
// K, V [capacity][n_kv_heads][HEAD_DIM] of KV_TYPE, position p at slot
// p % capacity. pos0 is the scalar argument (pos0_dev = NULL).
// Grid: ALGO 0: ceil(n_q n_heads / SCALAR_WARPS); ALGO 1 and 2: (ceil(n_q /
// (BQ / G)), n_kv_heads) with (BQ / 16) WD warps (ALGO 1) or (BQ / 64) WD
// warpgroups (ALGO 2) and ATTN_SMEM_BYTES of dynamic shared memory.
//
// Defines:
//   ALGO          0 scalar | 1 tensor cores (mma.sync) | 2 wgmma (sm_90a)
//   HEAD_DIM      head width: 256 | 512 (set from the shape)
//   KV_TYPE       F16 | BF16 | F32 (set from the shape; F32: ALGO 0 only)
//   SCALAR_WARPS  warps per block of the scalar kernel
//   BQ            rows (token x head pairs) per CTA: 16 | 32 | 64 | 128 (ALGO 2: 64 | 128)
//   BKV           keys per tile: 32 | 64 (ALGO 2: 32 | 64 | 128)
//   WD            warps splitting S columns and O head dims: 1 | 2 | 4 (ALGO 2: warpgroups splitting the head dim: 1 | 2)
//   STAGES        K/V tile buffers: 1 | 2
//   CP_ASYNC      0 | 1: stage K/V with cp.async (ALGO 2: 1)
//   WINDOWED      0 | 1: skip the KV tiles outside the window
//   PERSIST       0 | 1 | 2: (ALGO 2, STAGES 2) one CTA per SM runs the work items
//                 in turn, fetching the next item's Q during the current band
//                 (1: f32 Q into a second Q tile; 2: Q16 Q over the one tile once
//                 the band's last S has read it); grid (min(items, SMs), 1) with
//                 items = ceil(n_q / (BQ / G)) n_kv_heads
//   Q16           0 | 1: (ALGO 2) q is stored in the cache type, not f32
//   OUT           F32 | DQ_F16 | DQ_BF16: (DQ: ALGO 2) the format of out
//   COUNT_TILES   0 | 1: count visited tiles into *scratch (debug)

#ifndef ALGO
#error "attn_prefill.cu needs ALGO"
#endif
#ifndef HEAD_DIM
#error "attn_prefill.cu needs HEAD_DIM"
#endif
#ifndef KV_TYPE
#error "attn_prefill.cu needs KV_TYPE"
#endif
#ifndef SCALAR_WARPS
#error "attn_prefill.cu needs SCALAR_WARPS"
#endif
#ifndef BQ
#error "attn_prefill.cu needs BQ"
#endif
#ifndef BKV
#error "attn_prefill.cu needs BKV"
#endif
#ifndef WD
#error "attn_prefill.cu needs WD"
#endif
#ifndef STAGES
#error "attn_prefill.cu needs STAGES"
#endif
#ifndef CP_ASYNC
#error "attn_prefill.cu needs CP_ASYNC"
#endif
#ifndef WINDOWED
#error "attn_prefill.cu needs WINDOWED"
#endif
#ifndef COUNT_TILES
#error "attn_prefill.cu needs COUNT_TILES"
#endif
#ifndef PERSIST
#error "attn_prefill.cu needs PERSIST"
#endif
#ifndef Q16
#error "attn_prefill.cu needs Q16"
#endif
#ifndef OUT
#error "attn_prefill.cu needs OUT"
#endif

#include "common.cuh"
#include "attn_operand.cuh"

// OUT's values besides F32 (attn_operand.cuh's 3).
#define DQ_F16 11
#define DQ_BF16 12
#if OUT != F32 && OUT != DQ_F16 && OUT != DQ_BF16
#error "OUT must be F32, DQ_F16 or DQ_BF16"
#endif
#if ALGO != 2 && (Q16 || OUT != F32)
#error "Q16 = 1 and the DQ outputs are the wgmma kernel's (ALGO 2)"
#endif

#if ALGO == 0
#define ATTN_SCALAR_ENTRY attn_prefill
#include "attn_scalar.cuh"
#elif ALGO == 1
#define ATTN_ENTRY attn_prefill
#define SPLIT 0
#include "attn_core.cuh"
#else
#define ATTN_ENTRY attn_prefill
#include "attn_wgmma.cuh"
#endif
