// gemm_wgmma.cu: prefill matmul on Hopper's warpgroup MMA (wgmma, sm_90a).
// The quantized weight tile is dequantized in registers straight into the
// wgmma A operand; the activation tile is read by the tensor cores from
// shared memory through a matrix descriptor (128-byte swizzle). The wgmma
// wrappers are wgmma.cuh's, the stage copies stage_copy.cuh's.
//
// Computes y[m][n] = sum_k h(x[m][k]) * h(w[n][k]), w the weight as ggml
// dequantizes it (d * q for Q8_0 / Q4_0; the k-quants and F16 / BF16 as in
// dq_ktypes.cuh), the same function and the same operand roundings h (to
// DQ_TYPE) as gemm_dq, with
// fp32 accumulation in wgmma.mma_async.m64nBMk16.f32.{f16,bf16}. The MMA is
// laid out transposed with respect to y: its M side is 64 output features per
// warpgroup (A = dequantized weights, in registers) and its N side is the BM
// tokens of the tile (B = activations, shared memory, K-major). Weight
// planes (wq, wd) and the activation pre-pass (gemm_dq_convert, whose k order
// inside every group of 16 is permuted) are gemm_dq's: the A fragment layout
// of wgmma is mma.sync's m16n8k16 A layout per warp, so the same permutation
// lets one 32-bit shared load of 4 consecutive quants fill a thread's 4 k
// slots (2t, 2t+1, 2t+8, 2t+9) of a row.
//
// CTA: WG warpgroups, each owning MW blocks of 64 features, so the tile is
// BN = 64 * MW * WG features x BM tokens; grid.x = ceil(m/BM) (token tiles,
// fastest), grid.y = ceil(n/BN), grid.z = KSPLIT contiguous ranges of the
// 64-k tiles. With KSPLIT = 2 the two partial sums are added into y with
// red.global.add.f32 onto the zeros the launch sequence writes first: two
// addends onto an exact zero give the same bits in either order, so the
// result stays deterministic (which is why KSPLIT stops at 2). Split-K
// exists for shapes with few output tiles (ffn_down: n = 2560), where one
// wave of 128 x 256 tiles leaves SMs idle. All threads issue the cp.async copies of a
// STAGES-deep ring of 64-k stages: activations (BM rows x 128 bytes, 16-byte
// chunk c of row r stored at chunk c ^ (r % 8): the 128-byte swizzle the
// descriptor names), weight quants (padded rows, conflict-free 4-byte reads)
// and f32 scales. Out-of-range rows and k are zero-filled.
// Per stage: wait for its copies, fence the generic->async proxy, barrier,
// issue the copy of stage kt + STAGES - 2, dequantize this stage's A
// fragments, then 4 x MW wgmma and commit; wgmma.wait_group 1 keeps one group
// in flight while the next stage is dequantized. The copy target is the stage
// read two groups ago (complete after the previous iteration's wait and this
// iteration's barrier), and the A fragments alternate between two register
// sets, so nothing an in-flight wgmma reads is overwritten.
// Contract: approx against the f64 oracle (operand rounding to DQ_TYPE);
// tight against the CPU replay with the same roundings (fp32 summation only).
// K must be a multiple of 32. Requires sm_90a (compiled with that target).
// Dynamic shared memory: 1024 (alignment slack) + STAGES * STAGE_BYTES, with
// STAGE_BYTES = round_up(BM*128 + BN*PAD16(BKW) + BN*8*SCW, 1024), BKW = 64
// (Q8_0), 32 (Q4_0, k-quants) or 128 (F16, BF16) and SCW the scale or side
// words per 32 elements: 1 (Q8_0, Q4_0), 2 (Q4_K), 4 (Q5_K, Q6_K), 0 (F16,
// BF16).
//
// Defines:
//   WTYPE     weight type: Q8_0 | Q4_0 | Q4_K | Q5_K | Q6_K | F16 | BF16
//   DQ_TYPE   MMA operand type: F16 | BF16
//   BM        tokens per CTA tile = the wgmma N: 64 | 128 | 192 | 256
//   WG        consumer warpgroups per CTA: 1 | 2 | 3
//   MW        64-feature blocks per warpgroup: 1 | 2
//   STAGES    shared-memory pipeline depth: 3..6
//   KSPLIT    k ranges per output tile (grid.z): 1 | 2

#ifndef WTYPE
#error "gemm_wgmma.cu needs WTYPE"
#endif
#ifndef DQ_TYPE
#error "gemm_wgmma.cu needs DQ_TYPE"
#endif
#ifndef BM
#error "gemm_wgmma.cu needs BM"
#endif
#ifndef WG
#error "gemm_wgmma.cu needs WG"
#endif
#ifndef MW
#error "gemm_wgmma.cu needs MW"
#endif
#ifndef STAGES
#error "gemm_wgmma.cu needs STAGES"
#endif
#ifndef KSPLIT
#error "gemm_wgmma.cu needs KSPLIT"
#endif

#include "common.cuh"
#include "dq_convert.cuh"
// The copies are always cp.async: the MMA reads the tiles through the async
// proxy (stage_copy.cuh's synchronous engine is for gemm_dq and mmq).
#define CP_ASYNC 1
#include "stage_copy.cuh"
#include "kquant.cuh"
#include "dq_ktypes.cuh"

#if WTYPE != Q8_0 && WTYPE != Q4_0 && !IS_KQUANT(WTYPE) && !IS_W16(WTYPE)
#error "WTYPE must be Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, F16 or BF16"
#endif

#if DQ_TYPE == F16
#define WG_T "f16"
#else
#define WG_T "bf16"
#endif
#include "wgmma.cuh"
#if BM != 64 && BM != 128 && BM != 192 && BM != 256
#error "BM must be 64, 128, 192 or 256"
#endif
#if KSPLIT != 1 && KSPLIT != 2
#error "KSPLIT must be 1 or 2"
#endif
#if STAGES < 3
#error "STAGES must be at least 3 (one stage is read by the wgmma in flight)"
#endif

#define BK 64
#define THREADS (128 * WG)
#define BN (64 * MW * WG)
#define NACC (BM / 2)
#if WTYPE == Q8_0
#define BKW 64
#elif IS_W16(WTYPE)
#define BKW 128
#else
#define BKW 32
#endif
// Scale (Q8_0, Q4_0) or side (k-quants) words per 32 elements.
#if IS_KQUANT(WTYPE)
#define SCW KQ_W
#elif IS_W16(WTYPE)
#define SCW 0
#else
#define SCW 1
#endif
#define SW PAD16(BKW)
#define X_BYTES (BM * 128)
#define W_BYTES (BN * SW)
#define S_BYTES (BN * 8 * SCW)
#define STAGE_BYTES (((X_BYTES + W_BYTES + S_BYTES) + 1023) / 1024 * 1024)

DEVI void red_add_f32(float* p, float v) {
    asm volatile("red.global.add.f32 [%0], %1;" :: "l"(p), "f"(v) : "memory");
}

// The stage's tiles (stage_copy.cuh): activations (BM rows of 64 k, 128
// bytes, in the 128-byte swizzle the descriptor names), weights (padded
// rows, conflict-free 4- or 8-byte reads: int8 quants, nibbles or 16-bit
// values) and, beside quants, their scales (one f32 per 32 k) or side words
// (dq_ktypes.cuh).
typedef StageTile<16, 8, 2, 1, BK, BM, THREADS, 128, true> XTile;
#if WTYPE == Q8_0
typedef StageTile<16, 16, 1, 1, BK, BN, THREADS, SW> WTile;
#elif IS_W16(WTYPE)
typedef StageTile<16, 8, 2, 1, BK, BN, THREADS, SW> WTile;
#else
typedef StageTile<16, 32, 1, 2, BK, BN, THREADS, SW> WTile;
#endif
#if SCW == 1
typedef StageTile<4, 32, 1, 8, BK, BN, THREADS, 8> STile;
#elif SCW > 0
typedef KqSideTile<BK, BN, THREADS> STile;
#endif

// One thread's share of the stage copies, fixed for the whole k loop.
struct Loader {
    XTile x;
    WTile w;
#if SCW > 0
    STile s;
#endif
};

DEVI Loader make_loader(const u8* __restrict__ wq, const float* __restrict__ wd,
                        const u16* __restrict__ xh, int m0, int n0, int M, int N, int K) {
    Loader L;
    STAGE_TILE_INIT(XTile, L.x, xh, m0, M, K, 0);
    STAGE_TILE_INIT(WTile, L.w, wq, n0, N, K, X_BYTES);
#if SCW > 0
    STAGE_TILE_INIT(STile, L.s, wd, n0, N, K, X_BYTES + W_BYTES);
#else
    (void)wd;  // F16 / BF16: no scales
#endif
    return L;
}

// Issues the cp.async copies of k tile kt into the stage at shared address
// `st` (generic pointer `gst`).
DEVI void load_stage(const Loader& L, u32 st, u8* gst, const u8* base, int kt, int K) {
    L.x.copy(st, gst, base, kt, K);
    L.w.copy(st, gst, base, kt, K);
#if SCW > 0
    L.s.copy(st, gst, base, kt, K);
#endif
}

// Dequantizes this thread's A fragments of one stage: for each 64-feature
// block i and k16 step ks, rows g and g + 8 of the warp's 16 rows; a0/a2
// come from row g, a1/a3 from row g + 8 (the m16k16 A fragment layout).
// `w_row` / `s_row` point at the stage's quant row and scale row of row g of
// block 0.
DEVI void dequant_stage(const u8* w_row, const float* s_row, u32 (&a)[MW][4][4]) {
#pragma unroll
    for (int i = 0; i < MW; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const u8* wr = w_row + (i * 64 + 8 * h) * SW;
#if IS_KQUANT(WTYPE) || IS_W16(WTYPE)
            const float* sr = s_row + (i * 64 + 8 * h) * 2 * SCW;
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) dq_ktype_words(wr, sr, ks, a[i][ks][h], a[i][ks][2 + h]);
#else
            const float* sr = s_row + (i * 64 + 8 * h) * 2;
            const float d0 = sr[0], d1 = sr[1];
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
                const float d = ks < 2 ? d0 : d1;
#if WTYPE == Q8_0
                const u32 v = *reinterpret_cast<const u32*>(wr + ks * 16);
                // int8 q -> unsigned q + 128 by flipping the sign bits.
#if DQ_TYPE == F16
                dq4_f16(v ^ 0x80808080u, d, 0x64806480u, a[i][ks][h], a[i][ks][2 + h]);
#else
                dq4_bf16(v ^ 0x80808080u, d, 8388736.0f, a[i][ks][h], a[i][ks][2 + h]);
#endif
#else
                // k16 step ks: low (even ks) or high (odd ks) nibbles of block ks / 2.
                const u32 v = *reinterpret_cast<const u32*>(wr + (ks / 2) * 16);
                const u32 nib = (ks % 2) ? (v >> 4) & 0x0F0F0F0Fu : v & 0x0F0F0F0Fu;
#if DQ_TYPE == F16
                dq4_f16(nib, d, 0x64086408u, a[i][ks][h], a[i][ks][2 + h]);
#else
                dq4_bf16(nib, d, 8388616.0f, a[i][ks][h], a[i][ks][2 + h]);
#endif
#endif
            }
#endif
        }
    }
}

DEVI void mma_stage(u32 x_tile, const u32 (&a)[MW][4][4], float (&acc)[MW][NACC]) {
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
        // The mask changes no value (a shared address is below 2^18); it
        // tells the compiler the descriptor's range, and this kernel's
        // register allocation is measured to prefer that.
        const u64 desc = desc_kmajor((x_tile + ks * 32) & 0x3FFFF);
#pragma unroll
        for (int i = 0; i < MW; ++i) wgmma_rs(acc[i], a[i][ks], desc);
    }
    wgmma_commit();
}

// One k tile: wait for its copies, publish them to the async proxy, refill
// the stage read two tiles ago, dequantize, issue the MMAs, and retire the
// previous tile's group.
// `kt` counts this CTA's tiles from 0; its k tile is kt0 + kt, and NT tiles
// are its share.
DEVI void k_step(const Loader& L, u32 s_base, u8* smem, const u8* base, int kt, int kt0, int NT, int K,
                 const u8* w_lane, const float* s_lane, u32 (&a)[MW][4][4], float (&acc)[MW][NACC]) {
    cp_async_wait<STAGES - 3>();
    fence_proxy_async();
    __syncthreads();
    const int nk = kt + STAGES - 2;
    if (nk < NT) {
        const u32 ws = (nk % STAGES) * STAGE_BYTES;
        load_stage(L, s_base + ws, smem + ws, base, kt0 + nk, K);
    }
    cp_async_commit();
    const u32 so = (kt % STAGES) * STAGE_BYTES;
    dequant_stage(w_lane + so, reinterpret_cast<const float*>(reinterpret_cast<const u8*>(s_lane) + so), a);
    mma_stage(s_base + so, a, acc);
    wgmma_wait<1>();
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
gemm_wgmma(const u8* __restrict__ wq, const float* __restrict__ wd, const u16* __restrict__ xh,
           float* __restrict__ y, int M, int N, int K) {
    pdl_enter();
    extern __shared__ __align__(1024) u8 smem_raw[];
    // Swizzled tiles need 1024-byte alignment; the launch adds 1024 bytes of slack.
    const u32 raw = smem_addr(smem_raw);
    const u32 pad = ((raw + 1023u) & ~1023u) - raw;
    u8* smem = smem_raw + pad;
    const u32 s0 = raw + pad;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int g = lane / 4, tig = lane % 4;
    float acc[MW][NACC];
#pragma unroll
    for (int i = 0; i < MW; ++i)
#pragma unroll
        for (int e = 0; e < NACC; ++e) acc[i][e] = 0.f;
    const Loader L = make_loader(wq, wd, xh, m0, n0, M, N, K);
    const u8* base = wq;
    // Row g of this warp's 16 rows in 64-feature block 0 of this warpgroup.
    const int fl = wg * 64 * MW + warp * 16 + g;
    const u8* w_lane = smem + X_BYTES + fl * SW + tig * DQ_LANE_BYTES;
    const float* s_lane = reinterpret_cast<const float*>(smem + X_BYTES + W_BYTES) + fl * 2 * SCW;
    const int KT = (K + BK - 1) / BK;
    const int kt0 = (int)(((long long)KT * blockIdx.z) / KSPLIT);
    const int NT = (int)(((long long)KT * (blockIdx.z + 1)) / KSPLIT) - kt0;
#pragma unroll
    for (int s = 0; s < STAGES - 2; ++s) {
        if (s < NT) load_stage(L, s0 + s * STAGE_BYTES, smem + s * STAGE_BYTES, base, kt0 + s, K);
        cp_async_commit();
    }
    u32 a0[MW][4][4], a1[MW][4][4];
    int kt = 0;
    for (; kt + 1 < NT; kt += 2) {
        k_step(L, s0, smem, base, kt, kt0, NT, K, w_lane, s_lane, a0, acc);
        k_step(L, s0, smem, base, kt + 1, kt0, NT, K, w_lane, s_lane, a1, acc);
    }
    if (kt < NT) k_step(L, s0, smem, base, kt, kt0, NT, K, w_lane, s_lane, a0, acc);
    wgmma_wait<0>();
    // acc[i][4j + e]: feature row g (e < 2) or g + 8 (e >= 2) of the warp's
    // 16 rows in block i; token column 8j + 2*tig + (e & 1).
#pragma unroll
    for (int i = 0; i < MW; ++i) {
        const int f = n0 + wg * 64 * MW + i * 64 + warp * 16 + g;
#pragma unroll
        for (int j = 0; j < BM / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = m0 + 8 * j + 2 * tig + (e & 1);
                const int col = f + 8 * (e >> 1);
                if (row < M && col < N) {
#if KSPLIT == 1
                    y[(u64)row * N + col] = acc[i][4 * j + e];
#else
                    red_add_f32(y + (u64)row * N + col, acc[i][4 * j + e]);
#endif
                }
            }
        }
    }
}
