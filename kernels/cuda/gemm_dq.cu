// gemm_dq.cu: prefill matmul that dequantizes the quantized weight tile (staged
// raw in shared memory) to f16 or bf16 in registers and runs f16/bf16
// tensor-core MMA with fp32 accumulation.
//
// Computes y[m][n] = sum_k h(x[m][k]) * h(w[n][k]) where h rounds to DQ_TYPE
// (nearest even), w is the weight as ggml dequantizes it (d * q for Q8_0 /
// Q4_0), and the products are summed in fp32 by
// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}. Weights are host-repacked
// planes: quants wq[n][k] (Q8_0 int8) or wq[n][k/2] (Q4_0, GGUF nibble order
// per 16-byte block) and f32 scales wd[n][k/32]; the k-quants' nibble plane
// and GEMM side words, and F16/BF16 values as stored (dq_ktypes.cuh).
// Activations are converted
// f32 -> DQ_TYPE by a pre-pass (gemm_dq_convert, one thread per 2 values)
// into xh[m][k]; the conversion runs once per layer input, shared by every
// matmul that reads it, so it is not part of the GEMM's time. y is [m][n].
//
// Grid: grid.x = ceil(m/BM) (token tiles, fastest), grid.y = ceil(n/BN);
// WARPS_M x WARPS_N warps, each owning a (BM/WARPS_M) x (BN/WARPS_N) sub-tile.
// Per BK step: cp.async (or plain loads, CP_ASYNC=0) fills stage s of a
// STAGES-deep ring with the activation tile (DQ_TYPE) and the raw weight
// quants + scales; out-of-range rows/k are zero-filled. Each thread's copy
// addresses and row bounds are computed once before the k loop; per tile it
// only adds the k offset and tests k against K.
// Weights are dequantized in registers, straight into MMA B fragments: within
// each k16 step the MMA's k slots are permuted so that a thread's four B
// slots (2t, 2t+1, 2t+8, 2t+9) hold the four consecutive quants 4t..4t+3
// (one 32-bit shared load of int8 / nibbles). The activations are stored by
// the pre-pass with the same permutation inside every group of 16 k, so one
// ldmatrix.x4 per 16x16 A tile yields fragments whose slots read the same
// actual k: in each k16 group, stored pair p (2 values) holds actual pair
// [0,2,4,6,1,3,5,7][p]. The dot product is a sum over k, so the permutation
// changes nothing but the summation order. Dequant: byte-permute + packed
// f16 sub/mul (f16), or exact int->float + cvt.rn.bf16x2 (bf16).
// Contract: approx against the f64 oracle (operand rounding to DQ_TYPE);
// tight against the CPU replay with the same roundings (fp32 summation only).
// xh (the pre-pass output) is only meaningful to gemm_dq: its k order is the
// permuted one above, and K must be a multiple of 32.
// Dynamic shared memory: STAGES * (BM*PAD16(2*BK) + BN*PAD16(BKW) + 4*BN*BK/32*SW)
// bytes, BKW = BK (Q8_0), BK/2 (Q4_0, k-quants) or 2*BK (F16, BF16); SW the
// scale or side words per 32 elements: 1 (Q8_0, Q4_0), 2 (Q4_K), 4 (Q5_K,
// Q6_K), 0 (F16, BF16).
//
// Defines:
//   WTYPE     weight type: Q8_0 | Q4_0 | Q4_K | Q5_K | Q6_K | F16 | BF16
//   DQ_TYPE   MMA operand type: F16 | BF16
//   BM        tokens per CTA tile (multiple of 16*WARPS_M)
//   BN        features per CTA tile (multiple of 8*WARPS_N)
//   BK        k per pipeline stage: 32 | 64 | 128
//   WARPS_M   warps along tokens
//   WARPS_N   warps along features
//   STAGES    shared-memory pipeline depth (1..4)
//   CP_ASYNC  1 = cp.async global->shared copies, 0 = synchronous loads

#ifndef WTYPE
#error "gemm_dq.cu needs WTYPE"
#endif
#ifndef DQ_TYPE
#error "gemm_dq.cu needs DQ_TYPE"
#endif
#ifndef BM
#error "gemm_dq.cu needs BM"
#endif
#ifndef BN
#error "gemm_dq.cu needs BN"
#endif
#ifndef BK
#error "gemm_dq.cu needs BK"
#endif
#ifndef WARPS_M
#error "gemm_dq.cu needs WARPS_M"
#endif
#ifndef WARPS_N
#error "gemm_dq.cu needs WARPS_N"
#endif
#ifndef STAGES
#error "gemm_dq.cu needs STAGES"
#endif
#ifndef CP_ASYNC
#error "gemm_dq.cu needs CP_ASYNC"
#endif

#include "common.cuh"
#include "stage_copy.cuh"
#include "dq_convert.cuh"
#include "kquant.cuh"
#include "dq_ktypes.cuh"

#if WTYPE != Q8_0 && WTYPE != Q4_0 && !IS_KQUANT(WTYPE) && !IS_W16(WTYPE)
#error "WTYPE must be Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, F16 or BF16"
#endif

#define THREADS (WARPS_M * WARPS_N * 32)
#define WM (BM / WARPS_M)
#define WN (BN / WARPS_N)
#define MI (WM / 16)
#define NJ (WN / 8)
#define KB (BK / 32)
#if WTYPE == Q8_0
#define BKW BK
#elif IS_W16(WTYPE)
#define BKW (2 * BK)
#else
#define BKW (BK / 2)
#endif
// Scale (Q8_0, Q4_0) or side (k-quants) words per 32 elements.
#if IS_KQUANT(WTYPE)
#define SW KQ_W
#elif IS_W16(WTYPE)
#define SW 0
#else
#define SW 1
#endif
#define SA PAD16(2 * BK)
#define SB PAD16(BKW)
#define A_BYTES (BM * SA)
#define B_BYTES (BN * SB)
#define SCB_BYTES (BN * KB * 4 * SW)
#define STAGE_BYTES (A_BYTES + B_BYTES + SCB_BYTES)

#if BM % (16 * WARPS_M) != 0 || BN % (8 * WARPS_N) != 0
#error "tile does not divide the warp layout"
#endif

// The stage's tiles (stage_copy.cuh): activations (8 DQ_TYPE values per
// 16-byte chunk), weights (int8 quants 16 k, nibbles 32 k or 16-bit values
// 8 k per chunk) and, beside quants, their scales (one f32 per 32 k) or
// side words (dq_ktypes.cuh), their row strides recomputed from K per tile.
typedef StageTile<16, 8, 2, 1, BK, BM, THREADS, SA> ATile;
#if WTYPE == Q8_0
typedef StageTile<16, 16, 1, 1, BK, BN, THREADS, SB> BTile;
#elif IS_W16(WTYPE)
typedef StageTile<16, 8, 2, 1, BK, BN, THREADS, SB> BTile;
#else
typedef StageTile<16, 32, 1, 2, BK, BN, THREADS, SB> BTile;
#endif
#if SW == 1
typedef StageTile<4, 32, 1, 8, BK, BN, THREADS, KB * 4> STile;
#elif SW > 0
typedef KqSideTile<BK, BN, THREADS> STile;
#endif

// One thread's share of the stage copies, fixed for the whole k loop.
struct Loader {
    ATile a;
    BTile b;
#if SW > 0
    STile s;
#endif
};

DEVI Loader make_loader(const u8* __restrict__ wq, const float* __restrict__ wd,
                        const u16* __restrict__ xh, int m0, int n0, int M, int N, int K) {
    Loader L;
    STAGE_TILE_INIT(ATile, L.a, xh, m0, M, K, 0);
    STAGE_TILE_INIT(BTile, L.b, wq, n0, N, K, A_BYTES);
#if SW > 0
    STAGE_TILE_INIT(STile, L.s, wd, n0, N, K, A_BYTES + B_BYTES);
#else
    (void)wd;  // F16 / BF16: no scales
#endif
    return L;
}

// Issues the copies of k tile kt into the stage at shared address `st`
// (generic pointer `gst` for the synchronous path).
DEVI void load_stage(const Loader& L, u32 st, u8* gst, const u8* base, int kt, int K) {
    L.a.copy(st, gst, base, kt, K);
    L.b.copy(st, gst, base, kt, K);
#if SW > 0
    L.s.copy(st, gst, base, kt, K);
#endif
}

// Dequantizes 4 biased bytes into the two MMA operand words (common.cuh).
DEVI void dq4(u32 u, float d, u32 bias_h2, float bias_f, u32& lo, u32& hi) {
#if DQ_TYPE == F16
    (void)bias_f;
    dq4_f16(u, d, bias_h2, lo, hi);
#else
    (void)bias_h2;
    dq4_bf16(u, d, bias_f, lo, hi);
#endif
}

DEVI void mma_tile(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
#if DQ_TYPE == F16
    mma_f16_16816(d, a, b0, b1);
#else
    mma_bf16_16816(d, a, b0, b1);
#endif
}

// k16 steps [KS0, KS1) of one BK step of the warp's tile. `a_lane` is this
// lane's ldmatrix row address (shared) for the stage; `sB`/`sSB` point at
// this lane's weight row and scale row in the stage.
template <int KS0, int KS1>
DEVI void compute_steps(u32 a_lane, const u8* sB, const float* sSB, float (&acc)[MI][NJ][4]) {
#pragma unroll
    for (int ks = KS0; ks < KS1; ++ks) {
        u32 a[MI][4];
#pragma unroll
        for (int i = 0; i < MI; ++i)
            ldmatrix_x4(a_lane + i * 16 * SA + ks * 32, a[i][0], a[i][1], a[i][2], a[i][3]);
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            u32 b0, b1;
#if IS_KQUANT(WTYPE) || IS_W16(WTYPE)
            dq_ktype_words(sB + j * 8 * SB, sSB + j * 8 * KB * SW, ks, b0, b1);
#elif WTYPE == Q8_0
            const float d = sSB[j * 8 * KB + ks / 2];
            const u32 v = *reinterpret_cast<const u32*>(sB + j * 8 * SB + ks * 16);
            // int8 q -> unsigned q + 128 by flipping the sign bits.
            dq4(v ^ 0x80808080u, d, 0x64806480u, 8388736.0f, b0, b1);
#else
            const float d = sSB[j * 8 * KB + ks / 2];
            // k16 step ks is the low (even ks) or high (odd ks) nibbles of block ks/2.
            const u32 v = *reinterpret_cast<const u32*>(sB + j * 8 * SB + (ks / 2) * 16);
            const u32 nib = (ks % 2) ? (v >> 4) & 0x0F0F0F0Fu : v & 0x0F0F0F0Fu;
            dq4(nib, d, 0x64086408u, 8388616.0f, b0, b1);
#endif
#pragma unroll
            for (int i = 0; i < MI; ++i) mma_tile(acc[i][j], a[i], b0, b1);
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, OCC_BLOCKS(THREADS, STAGES * STAGE_BYTES, MI * NJ * 4 + DQ_EXTRA_REGS))
gemm_dq(const u8* __restrict__ wq, const float* __restrict__ wd, const u16* __restrict__ xh,
        float* __restrict__ y, int M, int N, int K) {
    pdl_enter();
    extern __shared__ __align__(128) u8 smem[];
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int g = lane / 4, tig = lane % 4;
    float acc[MI][NJ][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
    const Loader L = make_loader(wq, wd, xh, m0, n0, M, N, K);
    const u8* base = wq;
    const u32 s0 = smem_addr(smem);
    // Per-lane fragment addresses inside a stage.
    const u32 a_lane = s0 + (wm * WM + (lane & 15)) * SA + (lane >> 4) * 16;
    const int nl = wn * WN + g;
    const u8* b_lane = smem + A_BYTES + nl * SB + tig * DQ_LANE_BYTES;
    const float* s_lane = reinterpret_cast<const float*>(smem + A_BYTES + B_BYTES) + nl * KB * SW;
    const int KT = (K + BK - 1) / BK;
#if STAGES == 1
    for (int kt = 0; kt < KT; ++kt) {
        __syncthreads();
        load_stage(L, s0, smem, base, kt, K);
        commit();
        wait_stages<0>();
        __syncthreads();
        compute_steps<0, BK / 16>(a_lane, b_lane, s_lane, acc);
    }
#else
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) load_stage(L, s0 + s * STAGE_BYTES, smem + s * STAGE_BYTES, base, s, K);
        commit();
    }
    int rs = 0, ws = STAGES - 1;
    for (int kt = 0; kt < KT; ++kt) {
        wait_stages<STAGES - 2>();
        __syncthreads();
        // The first k16 step's fragment loads go out before this tile's
        // copies, so the tensor cores start while the copies are issued.
        const u32 so = rs * STAGE_BYTES;
        const float* sl = reinterpret_cast<const float*>(reinterpret_cast<const u8*>(s_lane) + so);
        compute_steps<0, 1>(a_lane + so, b_lane + so, sl, acc);
        const int nk = kt + STAGES - 1;
        if (nk < KT) load_stage(L, s0 + ws * STAGE_BYTES, smem + ws * STAGE_BYTES, base, nk, K);
        commit();
        compute_steps<1, BK / 16>(a_lane + so, b_lane + so, sl, acc);
        rs = rs == STAGES - 1 ? 0 : rs + 1;
        ws = ws == STAGES - 1 ? 0 : ws + 1;
    }
#endif
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = m0 + wm * WM + i * 16 + g + 8 * h;
                const int col = n0 + wn * WN + j * 8 + 2 * tig;
                if (row < M) {
                    if (col < N) y[(u64)row * N + col] = acc[i][j][2 * h];
                    if (col + 1 < N) y[(u64)row * N + col + 1] = acc[i][j][2 * h + 1];
                }
            }
}
