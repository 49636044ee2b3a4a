// moe_gemm.cu: the expert half of a mixture-of-experts FFN for a prefill
// chunk of M tokens (1..4096), as grouped tensor-core GEMMs over the chosen
// experts only. Four stages, one per variant (STAGE), each its own entry:
//
//   GROUP (moe_gemm_group): from ids i32 [M][K] (K = n_used <= 32; an id
//     outside 0..E-1 marks a skipped pair), with E = n_experts <= 256:
//       counts i32 [E]       pairs per expert
//       offsets i32 [E + 1]  exclusive prefix of counts; offsets[E] = valid pairs
//       sorted i32 [M*K]     the valid pairs p = t*K + j grouped by expert:
//                            expert e's at sorted[offsets[e] .. offsets[e+1]),
//                            in no particular order inside the group (shared
//                            atomics); entries past offsets[E] are not written
//       tiles int2 [T]       T = ceil(M*K / bm) + E: tile i is (expert e,
//                            first sorted row s) of the i-th BM-row tile in
//                            expert order (each expert's rows cut into
//                            ceil(counts[e] / bm) tiles); tiles past the
//                            count are (-1, 0)
//     One block of 1024 threads, shared-memory counters only: nothing in
//     global memory carries state between launches, so it replays in a
//     CUDA graph with no reset. `bm` is the GEMM stages' BM.
//   GATE_UP (moe_gemm_gate_up): for every sorted row s of tile
//     blockIdx.y, pair p = sorted[s], token t = p / K, expert e of the tile:
//       h[p][r] = gelu_tanh(G_e[r] . x_t) * (U_e[r] . x_t),   r < ffn
//     G_e / U_e: rows e*2ffn + r and e*2ffn + ffn + r of the gate_up tensor
//     (E * 2*ffn rows of d). x f32 [M][d], h f32 [M*K][ffn] (pair rows;
//     rows of skipped pairs are not written).
//   DOWN (moe_gemm_down): yp[p][r] = D_e[r] . h[p], r < d, D_e rows e*d + r
//     of the down tensor (E * d rows of ffn); yp f32 [M*K][d], unweighted.
//   COMBINE (moe_gemm_combine): y[t][r] = sum_j weights[t][j] * yp[t*K+j][r]
//     over the valid j in slot order, one f32 fma per term from 0
//     (deterministic: a CPU replay with fused multiply-adds is bit-exact);
//     y f32 [M][d]; yp rows of skipped pairs are never read.
//
// Weights (GATE_UP, DOWN): moe_gemv's LAYOUT 1, the expert tensor as one
// matrix of E * rows rows of k (bind::moe::ExpertWeights): Q8_0 int8 quants
// [rows][k] and f16 scales [rows][k/32]; Q4_0 nibbles [rows][k/2] (GGUF
// order per 16-byte block) and f16 scales; Q4_K / Q5_K / Q6_K nibble plane
// [rows][k/2] and GEMV side records per 256-element super-block (kquant.cuh:
// 16, 48, 88 bytes); F16 / BF16 values [rows][k]. Every weight is
// dequantized to its exact ggml value and rounded once to DQ_TYPE.
//
// GEMM (GATE_UP, DOWN): mma.sync m16n8k16 on DQ_TYPE operands, f32
// accumulation. A block computes one BM x BN output tile of one expert:
// rows = the tile's sorted rows (past the expert's end: zero rows, never
// stored), columns = BN weight rows (GATE_UP: BN/2 gate rows and the same
// BN/2 up rows, warp wn taking gate and up rows r0 + wn*WN/2 .. + WN/2 as
// its first and second WN/2 columns, so the GELU product is formed in
// registers). Per BK step a STAGES-deep cp.async ring stages the gathered
// f32 activation rows (A: x rows t or h rows p, 16-byte copies, row pitch
// 4*BK + 64 bytes) and the raw weight quants and scales / side records
// (B); out-of-range rows and k are zero-filled. A fragments are read as
// f32 (one 16-byte load per row gives a thread's k 4t..4t+3) and rounded
// to DQ_TYPE in registers; B fragments are dequantized from the staged
// quants, four consecutive k per thread, the permutation gemm_dq uses: a
// thread's MMA k slots (2t, 2t+1, 2t+8, 2t+9) hold k 4t..4t+3 of each k16
// step in both operands, which changes only the summation order. Every
// row's result is independent of its position in the tile.
// SMEM_DQ >= 1: after each stage lands, a conversion pass over all threads
// dequantizes the stage's BN x BK weights once into a shared DQ_TYPE tile
// (SMEM_DQ 2: and rounds the BM x BK f32 activations into a second one),
// stored in the same slot order (per k16 step, word t holds k 4t, 4t+1 and
// word 4 + t k 4t+2, 4t+3), after a barrier the MMAs read fragments by
// ldmatrix; the operand values and per-thread k order are the register
// path's, so results match it up to nothing (same products, same sums).
// SMEM_DQ 3: both tiles, double-buffered: stage kt + 1 is converted right
// after the MMAs of stage kt in the same barrier interval (one barrier per
// k step, the conversion overlapping other warps' MMAs); a converted
// stage's ring slot is reloaded at once, so STAGES loads are in flight.
// Contract: GROUP and COMBINE bit-exact; GATE_UP and DOWN approx against
// the f64 oracle (operand rounding to DQ_TYPE), tight against the CPU
// replay on rounded operands (fp32 summation only).
//
// Grid: GROUP (1, 1), 1024 threads. GATE_UP (ceil(ffn / (BN/2)), T),
// DOWN (ceil(d / BN), T), T = ceil(M*K / BM) + E (blocks whose tile is
// (-1, 0) exit), WARPS_M * WARPS_N * 32 threads, dynamic shared memory
// STAGES * (BM * (4*BK + 64) + BN * PAD16(BKW) + PAD(BN * SCB)) + CONV with
// BKW the quant bytes of BK weights (BK, BK/2 or 2*BK), SCB the scale /
// side bytes of a row per stage (Q8_0 / Q4_0 4 * max(BK/64, 1), the
// k-quants one side record, F16 / BF16 0), PAD rounding up to 16, and CONV
// the converted tiles: 0 (SMEM_DQ 0), BN * PAD16(2*BK) (1),
// (BM + BN) * PAD16(2*BK) (2) or twice that (3). COMBINE
// (ceil(d / 1024), M), 256 threads, 4 outputs per thread.
// Sizes: K % 32 == 0 for every weight (k = d for GATE_UP, ffn for DOWN),
// % 64 for Q8_0 / Q4_0 (two f16 scales per 4-byte copy), % 256 for the
// k-quants; d and ffn multiples of 32.
//
// Defines:
//   STAGE     GROUP | GATE_UP | DOWN | COMBINE
//   WTYPE     expert weight type: Q8_0 | Q4_0 | Q4_K | Q5_K | Q6_K | F16 | BF16
//   LAYOUT    1 (moe_gemv's planes; the only layout this family reads)
//   DQ_TYPE   MMA operand type: F16 | BF16
//   BM        sorted rows per tile (multiple of 16*WARPS_M)
//   BN        weight rows per tile (multiple of 8*WARPS_N; GATE_UP 16*WARPS_N)
//   BK        k per pipeline stage: 32 | 64 | 128
//   WARPS_M   warps along rows
//   WARPS_N   warps along weight rows
//   STAGES    cp.async pipeline depth: 2..4
//   SMEM_DQ   where the GEMM operands become DQ_TYPE (GROUP, COMBINE: unused):
//             0 in registers by every warp that reads them; 1 the weight
//             tile once per stage into a shared tile read by ldmatrix;
//             2 the activation tile too; 3 as 2 with two sets of tiles
//             (conversion of the next stage overlapping the MMAs)

#ifndef STAGE
#error "moe_gemm.cu needs STAGE"
#endif
#ifndef WTYPE
#error "moe_gemm.cu needs WTYPE"
#endif
#ifndef LAYOUT
#error "moe_gemm.cu needs LAYOUT"
#endif
#ifndef DQ_TYPE
#error "moe_gemm.cu needs DQ_TYPE"
#endif
#ifndef BM
#error "moe_gemm.cu needs BM"
#endif
#ifndef BN
#error "moe_gemm.cu needs BN"
#endif
#ifndef BK
#error "moe_gemm.cu needs BK"
#endif
#ifndef WARPS_M
#error "moe_gemm.cu needs WARPS_M"
#endif
#ifndef WARPS_N
#error "moe_gemm.cu needs WARPS_N"
#endif
#ifndef STAGES
#error "moe_gemm.cu needs STAGES"
#endif
#ifndef SMEM_DQ
#error "moe_gemm.cu needs SMEM_DQ"
#endif

#define GROUP 1
#define GATE_UP 2
#define DOWN 3
#define COMBINE 4

#include "common.cuh"
#include "kquant.cuh"

#if DQ_TYPE != F16 && DQ_TYPE != BF16
#error "moe_gemm.cu: DQ_TYPE must be F16 or BF16"
#endif

#if STAGE != GROUP && STAGE != GATE_UP && STAGE != DOWN && STAGE != COMBINE
#error "moe_gemm.cu: STAGE must be GROUP, GATE_UP, DOWN or COMBINE"
#endif
#if WTYPE != Q8_0 && WTYPE != Q4_0 && !IS_KQUANT(WTYPE) && !IS_W16(WTYPE)
#error "moe_gemm.cu: WTYPE must be Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, F16 or BF16"
#endif
#if LAYOUT != 1
#error "moe_gemm.cu: LAYOUT must be 1 (moe_gemv's planes)"
#endif
#if BK != 32 && BK != 64 && BK != 128
#error "moe_gemm.cu: BK must be 32, 64 or 128"
#endif
#if STAGES < 2 || STAGES > 4
#error "moe_gemm.cu: STAGES must be 2, 3 or 4"
#endif
#if BM % (16 * WARPS_M) != 0 || BN % (8 * WARPS_N) != 0
#error "moe_gemm.cu: the tile does not divide the warp layout"
#endif
#if SMEM_DQ < 0 || SMEM_DQ > 3
#error "moe_gemm.cu: SMEM_DQ must be 0, 1, 2 or 3"
#endif
// Both converted tiles (SMEM_DQ 2 and 3).
#define A_SH (SMEM_DQ >= 2)
#if STAGE == GATE_UP && BN % (16 * WARPS_N) != 0
#error "moe_gemm.cu: GATE_UP needs BN a multiple of 16*WARPS_N (gate and up halves per warp)"
#endif

// Most experts and experts per token (moe_route's bounds).
#define MAX_EXPERTS 256
#define MAX_USED 32

#if STAGE == GROUP || STAGE == COMBINE
DEVI bool valid_expert(int e, int n_experts) { return e >= 0 && e < n_experts; }
#endif

#if STAGE == GROUP
#define GROUP_THREADS 1024

extern "C" __global__ void __launch_bounds__(GROUP_THREADS, 1)
moe_gemm_group(const int* __restrict__ ids, int* __restrict__ counts, int* __restrict__ offsets,
               int* __restrict__ sorted, int2* __restrict__ tiles, int n_tokens, int n_experts, int n_used,
               int bm) {
    pdl_enter();
    __shared__ int s_cnt[MAX_EXPERTS];
    __shared__ int s_cur[MAX_EXPERTS];
    __shared__ int s_off[MAX_EXPERTS + 1];
    __shared__ int s_toff[MAX_EXPERTS + 1];
    const int tid = threadIdx.x;
    const int np = n_tokens * n_used;
    for (int e = tid; e < n_experts; e += GROUP_THREADS) {
        s_cnt[e] = 0;
        s_cur[e] = 0;
    }
    __syncthreads();
    for (int i = tid; i < np; i += GROUP_THREADS) {
        const int e = __ldg(ids + i);
        if (valid_expert(e, n_experts)) atomicAdd(&s_cnt[e], 1);
    }
    __syncthreads();
    // Warp 0: exclusive prefix sums of the counts and of the tiles per
    // expert (8 experts per lane, then a warp scan of the lane totals).
    if (tid < 32) {
        int c[MAX_EXPERTS / 32], tl[MAX_EXPERTS / 32];
        int sc = 0, st = 0;
#pragma unroll
        for (int i = 0; i < MAX_EXPERTS / 32; ++i) {
            const int e = tid * (MAX_EXPERTS / 32) + i;
            const int n = e < n_experts ? s_cnt[e] : 0;
            c[i] = n;
            tl[i] = (n + bm - 1) / bm;
            sc += c[i];
            st += tl[i];
        }
        int ic = sc, it = st;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int vc = __shfl_up_sync(0xffffffffu, ic, o);
            const int vt = __shfl_up_sync(0xffffffffu, it, o);
            if (tid >= o) {
                ic += vc;
                it += vt;
            }
        }
        int oc = ic - sc, ot = it - st;
#pragma unroll
        for (int i = 0; i < MAX_EXPERTS / 32; ++i) {
            const int e = tid * (MAX_EXPERTS / 32) + i;
            if (e < n_experts) {
                s_off[e] = oc;
                s_toff[e] = ot;
            }
            oc += c[i];
            ot += tl[i];
        }
        if (tid == 31) {
            s_off[n_experts] = ic;
            s_toff[n_experts] = it;
        }
    }
    __syncthreads();
    for (int e = tid; e <= n_experts; e += GROUP_THREADS) {
        if (e < n_experts) counts[e] = s_cnt[e];
        offsets[e] = s_off[e];
    }
    // Tile i: the expert whose tile range holds i (binary search over the
    // tile prefix; experts with no tiles have empty ranges).
    const int n_tiles = s_toff[n_experts];
    const int max_tiles = (np + bm - 1) / bm + n_experts;
    for (int i = tid; i < max_tiles; i += GROUP_THREADS) {
        int2 v = make_int2(-1, 0);
        if (i < n_tiles) {
            int lo = 0, hi = n_experts - 1;
            while (lo < hi) {
                const int mid = (lo + hi + 1) / 2;
                if (s_toff[mid] <= i)
                    lo = mid;
                else
                    hi = mid - 1;
            }
            v = make_int2(lo, s_off[lo] + (i - s_toff[lo]) * bm);
        }
        tiles[i] = v;
    }
    for (int i = tid; i < np; i += GROUP_THREADS) {
        const int e = __ldg(ids + i);
        if (valid_expert(e, n_experts)) sorted[s_off[e] + atomicAdd(&s_cur[e], 1)] = i;
    }
}

#elif STAGE == COMBINE

extern "C" __global__ void __launch_bounds__(256)
moe_gemm_combine(const float* __restrict__ yp, const int* __restrict__ ids, const float* __restrict__ weights,
                 float* __restrict__ y, int n_tokens, int d, int n_experts, int n_used) {
    pdl_enter();
    const int t = blockIdx.y;
    const int c = (blockIdx.x * 256 + threadIdx.x) * 4;
    if (t >= n_tokens || c >= d) return;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int j = 0; j < n_used; ++j) {
        const int p = t * n_used + j;
        if (!valid_expert(__ldg(ids + p), n_experts)) continue;
        const float w = __ldg(weights + p);
        const float4 v = __ldg(reinterpret_cast<const float4*>(yp + (u64)p * d + c));
        acc.x = fmaf(w, v.x, acc.x);
        acc.y = fmaf(w, v.y, acc.y);
        acc.z = fmaf(w, v.z, acc.z);
        acc.w = fmaf(w, v.w, acc.w);
    }
    *reinterpret_cast<float4*>(y + (u64)t * d + c) = acc;
}

#else  // GATE_UP, DOWN

#define THREADS (WARPS_M * WARPS_N * 32)
#define WM (BM / WARPS_M)
#define WN (BN / WARPS_N)
#define MI (WM / 16)
#define NJ (WN / 8)
#define KB (BK / 32)

// A: BM rows of BK f32, pitch 4*BK + 64 (= 64 mod 128: the two rows a
// quarter-warp reads with 16-byte loads fall in distinct banks).
#define SA (4 * BK + 64)
#define CA (BK / 4)  // 16-byte chunks per A row
#define A_BYTES (BM * SA)

// B: quant bytes of BK weights per row.
#if WTYPE == Q8_0
#define BKW BK
#elif IS_W16(WTYPE)
#define BKW (2 * BK)
#else
#define BKW (BK / 2)
#endif
#define SB PAD16(BKW)
#define CB (BKW / 16)  // 16-byte chunks per B row
#define B_BYTES (BN * SB)

// Scale / side bytes per row per stage and their copy unit.
#if WTYPE == Q8_0 || WTYPE == Q4_0
// The 4-byte words of f16 scales covering the stage's groups (k % 64 == 0,
// so a row's scales start 4-byte aligned): BK = 32 copies the word of the
// group pair its group lies in.
#define SCW (KB >= 2 ? KB / 2 : 1)
#define SCB (4 * SCW)
#define SC_CHUNK 4
#elif WTYPE == Q4_K
#define REC 16
#elif WTYPE == Q5_K
#define REC 48
#elif WTYPE == Q6_K
#define REC KQ6_REC
#endif
#ifdef REC
#define SCB REC
#define SC_CHUNK 8
#endif
#if IS_W16(WTYPE)
#define SCB 0
#define SC_CHUNK 4
#endif
#define S_BYTES (((BN * SCB) + 15) / 16 * 16)
#define STAGE_BYTES (A_BYTES + B_BYTES + S_BYTES)

// SMEM_DQ >= 1: the operand tiles of the current stage in DQ_TYPE, after
// the ring, pitch PAD16(2*BK) bytes (ldmatrix rows of one phase fall in
// distinct 16-byte bank groups), k in slot order: inside each k16 step,
// word t (t < 4) holds k 4t, 4t+1 and word 4 + t holds k 4t+2, 4t+3, so an
// ldmatrix fragment carries the same k as the register path's.
#define SH PAD16(2 * BK)
#if SMEM_DQ >= 1
#define BH_BYTES (BN * SH)
#else
#define BH_BYTES 0
#endif
#if A_SH
#define AH_BYTES (BM * SH)
#else
#define AH_BYTES 0
#endif
// SMEM_DQ 3 keeps two sets of converted tiles (stage kt's read by the
// MMAs while stage kt + 1's are written).
#define CONV_BYTES (AH_BYTES + BH_BYTES)
#define CONV_SETS (SMEM_DQ == 3 ? 2 : 1)
#define SMEM_BYTES (STAGES * STAGE_BYTES + CONV_SETS * CONV_BYTES)

#define PA ((BM * CA + THREADS - 1) / THREADS)
#define PB ((BN * CB + THREADS - 1) / THREADS)
#define SCN (SCB / SC_CHUNK)  // scale / side chunks per row
#define PS (SCN > 0 ? (BN * SCN + THREADS - 1) / THREADS : 0)

#if STAGE == GATE_UP
#define N_OUT_STEP (BN / 2)
#else
#define N_OUT_STEP BN
#endif

DEVI void mma_tile(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
#if DQ_TYPE == F16
    mma_f16_16816(d, a, b0, b1);
#else
    mma_bf16_16816(d, a, b0, b1);
#endif
}

DEVI u32 dq_pack(float lo, float hi) {
#if DQ_TYPE == F16
    return pack_f16x2(lo, hi);
#else
    return pack_bf16x2(lo, hi);
#endif
}

#if WTYPE == Q8_0 || WTYPE == Q4_0
// Dequantizes 4 biased bytes into two operand words (common.cuh).
DEVI void dq4(u32 u, float d, u32 bias_h2, float bias_f, u32& lo, u32& hi) {
#if DQ_TYPE == F16
    (void)bias_f;
    dq4_f16(u, d, bias_h2, lo, hi);
#else
    (void)bias_h2;
    dq4_bf16(u, d, bias_f, lo, hi);
#endif
}
#endif

// Tile-local weight row n (0..BN) -> weight row of expert e in the tensor,
// or -1 past the matrix. GATE_UP: warp wn's first WN/2 columns are gate
// rows, its last WN/2 the up rows of the same r.
DEVI int weight_row(int n, int e, int col0, int d, int ffn) {
#if STAGE == GATE_UP
    const int wn = n / WN, i = n % WN;
    const int r = col0 + wn * (WN / 2) + i % (WN / 2);
    return r < ffn ? e * 2 * ffn + (i >= WN / 2 ? ffn : 0) + r : -1;
#else
    (void)ffn;
    const int r = col0 + n;
    return r < d ? e * d + r : -1;
#endif
}

// One thread's share of a stage's copies, fixed for the whole k loop: its
// A rows' element offsets (0xffffffff: a row past the tile's end), its B
// rows (-1: past the matrix).
struct Loader {
    u32 a_off[PA];
    int b_row[PB];
#if PS > 0
    int s_row[PS];
#endif
};

#if IS_KQUANT(WTYPE)
// The k-quant group index (0..7) inside its super-block of k16 step ks of
// k tile kt.
DEVI int kq_group(int kt, int ks) { return (kt % (256 / BK)) * KB + ks / 2; }
#endif

DEVI void load_stage(const Loader& L, u32 st, const float* __restrict__ act, const u8* __restrict__ wq,
                     const u8* __restrict__ wd, int kt, int K) {
    const int tid = threadIdx.x;
    const int k0 = kt * BK;
    // A: gathered f32 rows.
#pragma unroll
    for (int it = 0; it < PA; ++it) {
        const int c = tid + it * THREADS;
        if ((BM * CA) % THREADS == 0 || c < BM * CA) {
            const int r = c / CA, col = c % CA;
            const int k = k0 + col * 4;
            const bool ok = L.a_off[it] != 0xffffffffu && k < K;
            cp_async16(st + r * SA + col * 16, ok ? act + L.a_off[it] + k : act, ok ? 16 : 0);
        }
    }
    // B: quants (or 16-bit values), BKW bytes per row.
#pragma unroll
    for (int it = 0; it < PB; ++it) {
        const int c = tid + it * THREADS;
        if ((BN * CB) % THREADS == 0 || c < BN * CB) {
            const int r = c / CB, col = c % CB;
            const int row = L.b_row[it];
            const bool ok = row >= 0 && k0 + col * (16 * BK / BKW) < K;
            const u8* src = wq + (u64)(row < 0 ? 0 : row) * (u64)((u64)K * BKW / BK) + (u64)k0 * BKW / BK + col * 16;
            cp_async16(st + A_BYTES + r * SB + col * 16, ok ? src : wq, ok ? 16 : 0);
        }
    }
#if PS > 0
    // Scales (4-byte words of f16 pairs) or side records (8-byte pieces).
#pragma unroll
    for (int it = 0; it < PS; ++it) {
        const int c = tid + it * THREADS;
        if ((BN * SCN) % THREADS == 0 || c < BN * SCN) {
            const int r = c / SCN, col = c % SCN;
            const int row = L.s_row[it];
#if SC_CHUNK == 4
            // A word holds the scales of groups g, g + 1 (g even); words
            // past the row's K/32 groups (the k tail) are zero-filled.
            const bool ok = row >= 0 && ((kt * KB) & ~1) + 2 * col < K / 32;
#else
            const bool ok = row >= 0 && k0 < K;
#endif
            const u32 dst = st + A_BYTES + B_BYTES + r * SCB + col * SC_CHUNK;
#if SC_CHUNK == 4
            // f16 scales: [rows][K/32]; the words from group (kt*KB) & ~1.
            const u8* src = wd + ((u64)(row < 0 ? 0 : row) * (K / 32) + ((kt * KB) & ~1)) * 2 + col * 4;
            cp_async4(dst, ok ? src : wd, ok ? 4 : 0);
#else
            const u8* src = wd + ((u64)(row < 0 ? 0 : row) * (K / 256) + k0 / 256) * REC + col * 8;
            cp_async8(dst, ok ? src : wd, ok ? 8 : 0);
#endif
        }
    }
#endif
}

// The operand words b0 (k 4t, 4t+1) and b1 (4t+2, 4t+3) of k16 step ks of
// the staged weight row at `q` (row base), its scales / side record at `sc`.
DEVI void dq_b(const u8* q, const u8* sc, int kt, int ks, int t, u32& b0, u32& b1) {
#if WTYPE == Q8_0 || WTYPE == Q4_0
    // Group G = kt*KB + ks/2; its scale is half G & 1 of word (ks/2)/2
    // (BK >= 64) or of the stage's one word (BK = 32).
    const int gi = ks / 2;
    const u32 w = reinterpret_cast<const u32*>(sc)[KB >= 2 ? gi / 2 : 0];
    const int half = KB >= 2 ? (gi & 1) : (kt & 1);
    const float d = h2f((u16)(half ? w >> 16 : w & 0xffffu));
#if WTYPE == Q8_0
    const u32 v = *reinterpret_cast<const u32*>(q + ks * 16 + t * 4);
    // int8 q -> unsigned q + 128 by flipping the sign bits.
    dq4(v ^ 0x80808080u, d, 0x64806480u, 8388736.0f, b0, b1);
#else
    const u32 v = *reinterpret_cast<const u32*>(q + gi * 16 + t * 4);
    const u32 nib = (ks & 1) ? (v >> 4) & 0x0F0F0F0Fu : v & 0x0F0F0F0Fu;
    dq4(nib, d, 0x64086408u, 8388616.0f, b0, b1);
#endif
#elif IS_W16(WTYPE)
    (void)sc;
    (void)kt;
    const uint2 v = *reinterpret_cast<const uint2*>(q + ks * 32 + t * 8);
#if WTYPE == DQ_TYPE
    b0 = v.x;
    b1 = v.y;
#elif WTYPE == F16
    b0 = dq_pack(h2f((u16)(v.x & 0xffffu)), h2f((u16)(v.x >> 16)));
    b1 = dq_pack(h2f((u16)(v.y & 0xffffu)), h2f((u16)(v.y >> 16)));
#else
    b0 = dq_pack(__int_as_float((int)(v.x << 16)), __int_as_float((int)(v.x & 0xffff0000u)));
    b1 = dq_pack(__int_as_float((int)(v.y << 16)), __int_as_float((int)(v.y & 0xffff0000u)));
#endif
#else
    // k-quants: nibble word t of group ks/2; low nibbles for even ks
    // (elements 4t..), high for odd (16 + 4t..); the group's scale / min
    // (or Q6_K's two scales) and high words from the side record.
    const int half = ks & 1;
    const int j = kq_group(kt, ks);
    const u32 v = *reinterpret_cast<const u32*>(q + (ks / 2) * 16 + t * 4);
    u32 h[2];
    float f[4];
#if WTYPE == Q6_K
    const uint2 hh = *reinterpret_cast<const uint2*>(sc + 8 * j);
    h[0] = hh.x;
    h[1] = hh.y;
    const u32 s2 = *reinterpret_cast<const u16*>(sc + 64 + 2 * j);
    const float dd = h2f(*reinterpret_cast<const u16*>(sc + 80));
    const float ds = dd * (float)(i8)(half ? (s2 >> 8) : (s2 & 0xffu));
    const u32 qb = half ? kq_hi(v, h, t) : kq_lo(v, h, t);
#pragma unroll
    for (int b = 0; b < 4; ++b) f[b] = ds * kq_f6(qb, b);
#else
    const uint4 hd = *reinterpret_cast<const uint4*>(sc);
    u32 s6, m6;
    kq_scale_min(hd, j, s6, m6);
    const float ds = h2f((u16)(hd.x & 0xffffu)) * (float)s6;
    const float ms = h2f((u16)(hd.x >> 16)) * (float)m6;
#if WTYPE == Q5_K
    h[0] = *reinterpret_cast<const u32*>(sc + 16 + 4 * j);
#else
    h[0] = 0;
#endif
    h[1] = 0;
    const u32 qb = half ? kq_hi(v, h, t) : kq_lo(v, h, t);
#pragma unroll
    for (int b = 0; b < 4; ++b) f[b] = fmaf(kq_f(qb, b), ds, -ms);
#endif
    b0 = dq_pack(f[0], f[1]);
    b1 = dq_pack(f[2], f[3]);
#endif
}

// k16 steps [KS0, KS1) of the stage at generic address `sm`.
template <int KS0, int KS1>
DEVI void compute_steps(const u8* sm, int wm, int wn, int kt, float (&acc)[MI][NJ][4]) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int ks = KS0; ks < KS1; ++ks) {
        u32 a[MI][4];
#pragma unroll
        for (int i = 0; i < MI; ++i) {
            const u8* ar = sm + (wm * WM + i * 16 + g) * SA + ks * 64 + t * 16;
            const float4 lo = *reinterpret_cast<const float4*>(ar);
            const float4 hi = *reinterpret_cast<const float4*>(ar + 8 * SA);
            a[i][0] = dq_pack(lo.x, lo.y);
            a[i][1] = dq_pack(hi.x, hi.y);
            a[i][2] = dq_pack(lo.z, lo.w);
            a[i][3] = dq_pack(hi.z, hi.w);
        }
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            const int n = wn * WN + j * 8 + g;
            u32 b0, b1;
            dq_b(sm + A_BYTES + n * SB, sm + A_BYTES + B_BYTES + n * SCB, kt, ks, t, b0, b1);
#pragma unroll
            for (int i = 0; i < MI; ++i) mma_tile(acc[i][j], a[i], b0, b1);
        }
    }
}

#if SMEM_DQ >= 1
// The conversion pass of stage kt (ring slot at `sm`): every staged weight
// row's k16 steps dequantized once into the B tile at `bh` (one unit = one
// row's k16 step, eight words in slot order); SMEM_DQ >= 2 also rounds the f32
// activation rows into the A tile at `ah` (one unit = 4 consecutive k of a
// row: a 16-byte read, two 4-byte writes; a quarter-warp's reads and a
// warp's writes touch distinct banks).
DEVI void convert_stage(const u8* sm, u8* ah, u8* bh, int kt) {
    const int tid = threadIdx.x;
#define BUNITS (BN * (BK / 16))
#pragma unroll
    for (int it = 0; it < (BUNITS + THREADS - 1) / THREADS; ++it) {
        const int u = tid + it * THREADS;
        if (BUNITS % THREADS == 0 || u < BUNITS) {
            const int n = u / (BK / 16), ks = u % (BK / 16);
            const u8* q = sm + A_BYTES + n * SB;
            const u8* sc = sm + A_BYTES + B_BYTES + n * SCB;
            u32 w[8];
#if WTYPE == Q8_0
            const int gi = ks / 2;
            const u32 sw = reinterpret_cast<const u32*>(sc)[KB >= 2 ? gi / 2 : 0];
            const int half = KB >= 2 ? (gi & 1) : (kt & 1);
            const float dsc = h2f((u16)(half ? sw >> 16 : sw & 0xffffu));
            const uint4 v = *reinterpret_cast<const uint4*>(q + ks * 16);
            dq4(v.x ^ 0x80808080u, dsc, 0x64806480u, 8388736.0f, w[0], w[4]);
            dq4(v.y ^ 0x80808080u, dsc, 0x64806480u, 8388736.0f, w[1], w[5]);
            dq4(v.z ^ 0x80808080u, dsc, 0x64806480u, 8388736.0f, w[2], w[6]);
            dq4(v.w ^ 0x80808080u, dsc, 0x64806480u, 8388736.0f, w[3], w[7]);
#else
#pragma unroll
            for (int t = 0; t < 4; ++t) dq_b(q, sc, kt, ks, t, w[t], w[4 + t]);
#endif
            uint4* dst = reinterpret_cast<uint4*>(bh + n * SH + ks * 32);
            dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
            dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
        }
    }
#undef BUNITS
#if A_SH
#define AUNITS (BM * CA)
#pragma unroll
    for (int it = 0; it < (AUNITS + THREADS - 1) / THREADS; ++it) {
        const int u = tid + it * THREADS;
        if (AUNITS % THREADS == 0 || u < AUNITS) {
            const int r = u / CA, c = u % CA;
            const float4 v = *reinterpret_cast<const float4*>(sm + r * SA + c * 16);
            u8* row = ah + r * SH + (c / 4) * 32 + (c % 4) * 4;
            *reinterpret_cast<u32*>(row) = dq_pack(v.x, v.y);
            *reinterpret_cast<u32*>(row + 16) = dq_pack(v.z, v.w);
        }
    }
#undef AUNITS
#else
    (void)ah;
#endif
}

// k16 steps [0, BK/16) from the converted tiles: B fragments (and A's,
// SMEM_DQ >= 2) by ldmatrix; SMEM_DQ 1 reads A as f32 from the ring slot
// `sm` and rounds it in registers.
DEVI void compute_steps_sh(const u8* sm, u32 ah, u32 bh, int wm, int wn, float (&acc)[MI][NJ][4]) {
    const int lane = threadIdx.x % 32;
#if A_SH
    (void)sm;
    // ldmatrix x4: lanes 0-15 address rows 0-15 at slot 0, lanes 16-31
    // rows 0-15 at slot 8 -> a0..a3.
    const u32 a_base = ah + (wm * WM + lane % 16) * SH + (lane / 16) * 16;
#else
    (void)ah;
    const int g = lane / 4, t = lane % 4;
#endif
    // ldmatrix x4 over two 8-row column blocks: lanes 0-7 rows 0-7 slot 0,
    // 8-15 rows 0-7 slot 8, 16-23 rows 8-15 slot 0, 24-31 rows 8-15 slot 8.
    const u32 b_base = bh + (wn * WN + (lane / 16) * 8 + lane % 8) * SH + ((lane / 8) % 2) * 16;
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
        u32 a[MI][4];
#pragma unroll
        for (int i = 0; i < MI; ++i) {
#if A_SH
            ldmatrix_x4(a_base + i * 16 * SH + ks * 32, a[i][0], a[i][1], a[i][2], a[i][3]);
#else
            const u8* ar = sm + (wm * WM + i * 16 + g) * SA + ks * 64 + t * 16;
            const float4 lo = *reinterpret_cast<const float4*>(ar);
            const float4 hi = *reinterpret_cast<const float4*>(ar + 8 * SA);
            a[i][0] = dq_pack(lo.x, lo.y);
            a[i][1] = dq_pack(hi.x, hi.y);
            a[i][2] = dq_pack(lo.z, lo.w);
            a[i][3] = dq_pack(hi.z, hi.w);
#endif
        }
        u32 b[NJ][2];
#pragma unroll
        for (int j = 0; j + 1 < NJ; j += 2)
            ldmatrix_x4(b_base + j * 8 * SH + ks * 32, b[j][0], b[j][1], b[j + 1][0], b[j + 1][1]);
        if (NJ % 2 == 1) {
            // The last block alone: lanes 0-15's addresses (rows 0-7, both
            // slot halves) are the x4 form's.
            const u32 addr = bh + (wn * WN + (NJ - 1) * 8 + lane % 8) * SH + ((lane / 8) % 2) * 16 + ks * 32;
            ldmatrix_x2(addr, b[NJ - 1][0], b[NJ - 1][1]);
        }
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int i = 0; i < MI; ++i) mma_tile(acc[i][j], a[i], b[j][0], b[j][1]);
    }
}
#endif

// The GEMM of one tile: act is x [M][d] (GATE_UP) or h [M*K][ffn] (DOWN),
// K its row length; out is h (GATE_UP) or yp (DOWN).
DEVI void gemm_body(const u8* __restrict__ wq, const u8* __restrict__ wd, const float* __restrict__ act,
                    const int* __restrict__ sorted, const int2* __restrict__ tiles,
                    const int* __restrict__ offsets, float* __restrict__ out, int d, int ffn, int n_used) {
    extern __shared__ __align__(128) u8 smem[];
    __shared__ int s_pair[BM];
    const int2 tile = tiles[blockIdx.y];
    const int e = tile.x;
    if (e < 0) return;
    const int row0 = tile.y;
    const int rows = min(BM, __ldg(offsets + e + 1) - row0);
#if STAGE == GATE_UP
    const int K = d;
    const int n_out = ffn;
#else
    const int K = ffn;
    const int n_out = d;
    (void)n_used;
#endif
    const int col0 = blockIdx.x * N_OUT_STEP;
    const int tid = threadIdx.x;
    for (int r = tid; r < BM; r += THREADS) s_pair[r] = r < rows ? __ldg(sorted + row0 + r) : -1;
    __syncthreads();
    Loader L;
#pragma unroll
    for (int it = 0; it < PA; ++it) {
        const int r = min((tid + it * THREADS) / CA, BM - 1);
        const int p = s_pair[r];
#if STAGE == GATE_UP
        L.a_off[it] = p < 0 ? 0xffffffffu : (u32)(p / n_used) * (u32)K;
#else
        L.a_off[it] = p < 0 ? 0xffffffffu : (u32)p * (u32)K;
#endif
    }
#pragma unroll
    for (int it = 0; it < PB; ++it) L.b_row[it] = weight_row(min((tid + it * THREADS) / CB, BN - 1), e, col0, d, ffn);
#if PS > 0
#pragma unroll
    for (int it = 0; it < PS; ++it) L.s_row[it] = weight_row(min((tid + it * THREADS) / SCN, BN - 1), e, col0, d, ffn);
#endif
    const int warp = tid / 32, lane = tid % 32;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int g = lane / 4, t = lane % 4;
    float acc[MI][NJ][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.f;
    const u32 s0 = smem_addr(smem);
    const int KT = (K + BK - 1) / BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) load_stage(L, s0 + s * STAGE_BYTES, act, wq, wd, s, K);
        cp_async_commit();
    }
#if SMEM_DQ == 3
    // Stage j is converted in k step j - 1 (stage 0 here) into set j % 2;
    // its ring slot is free once the next barrier is passed, so the ring
    // holds STAGES loads in flight. Per k step kt, one barrier: stage kt's
    // tiles (written before it) are complete and every warp is done with
    // set (kt + 1) % 2 and with ring slot kt % STAGES; then the load of
    // stage kt + STAGES into that slot, the MMAs of stage kt and the
    // conversion of stage kt + 1 (cp.async groups: one per stage).
    u8* const conv = smem + STAGES * STAGE_BYTES;
    const u32 conv_s = s0 + STAGES * STAGE_BYTES;
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    convert_stage(smem, conv, conv + AH_BYTES, 0);
    if (STAGES - 1 < KT) load_stage(L, s0 + (STAGES - 1) * STAGE_BYTES, act, wq, wd, STAGES - 1, K);
    cp_async_commit();
    int cs = 1 % STAGES;  // ring slot of stage kt + 1
    int ws = 0;           // ring slot of stage kt (reloaded with kt + STAGES)
    for (int kt = 0; kt < KT; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        if (kt + STAGES < KT) load_stage(L, s0 + ws * STAGE_BYTES, act, wq, wd, kt + STAGES, K);
        cp_async_commit();
        const int set = kt & 1;
        compute_steps_sh(smem, conv_s + set * CONV_BYTES, conv_s + set * CONV_BYTES + AH_BYTES, wm, wn, acc);
        if (kt + 1 < KT) {
            u8* const nxt = conv + (set ^ 1) * CONV_BYTES;
            convert_stage(smem + cs * STAGE_BYTES, nxt, nxt + AH_BYTES, kt + 1);
        }
        cs = cs == STAGES - 1 ? 0 : cs + 1;
        ws = ws == STAGES - 1 ? 0 : ws + 1;
    }
#else
    int rs = 0, ws = STAGES - 1;
    for (int kt = 0; kt < KT; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const u8* sm = smem + rs * STAGE_BYTES;
        const int nk = kt + STAGES - 1;
#if SMEM_DQ >= 1
        // The converted tiles are rewritten only after every warp passed
        // the barrier above (done with stage kt - 1), read after the next.
        convert_stage(sm, smem + STAGES * STAGE_BYTES, smem + STAGES * STAGE_BYTES + AH_BYTES, kt);
        if (nk < KT) load_stage(L, s0 + ws * STAGE_BYTES, act, wq, wd, nk, K);
        cp_async_commit();
        __syncthreads();
        compute_steps_sh(sm, s0 + STAGES * STAGE_BYTES, s0 + STAGES * STAGE_BYTES + AH_BYTES, wm, wn, acc);
#else
        compute_steps<0, 1>(sm, wm, wn, kt, acc);
        if (nk < KT) load_stage(L, s0 + ws * STAGE_BYTES, act, wq, wd, nk, K);
        cp_async_commit();
        compute_steps<1, BK / 16>(sm, wm, wn, kt, acc);
#endif
        rs = rs == STAGES - 1 ? 0 : rs + 1;
        ws = ws == STAGES - 1 ? 0 : ws + 1;
    }
#endif
    cp_async_wait<0>();
    // Epilogue: a thread holds rows g, g + 8 of each 16-row block and
    // columns 2t, 2t + 1 of each 8-column block.
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int r = wm * WM + i * 16 + g + 8 * hh;
            const int p = s_pair[r];
            if (p < 0) continue;
            float* orow = out + (u64)p * n_out;
#if STAGE == GATE_UP
#pragma unroll
            for (int j = 0; j < NJ / 2; ++j) {
                const int c = col0 + wn * (WN / 2) + j * 8 + 2 * t;
                if (c < n_out) {
                    float2 v;
                    v.x = gelu_tanh(acc[i][j][2 * hh]) * acc[i][j + NJ / 2][2 * hh];
                    v.y = gelu_tanh(acc[i][j][2 * hh + 1]) * acc[i][j + NJ / 2][2 * hh + 1];
                    *reinterpret_cast<float2*>(orow + c) = v;
                }
            }
#else
#pragma unroll
            for (int j = 0; j < NJ; ++j) {
                const int c = col0 + wn * WN + j * 8 + 2 * t;
                if (c < n_out) *reinterpret_cast<float2*>(orow + c) = make_float2(acc[i][j][2 * hh], acc[i][j][2 * hh + 1]);
            }
#endif
        }
}

// Accumulators, plus the registers the operand conversion needs (the f32
// A rows rounded in registers: 32) and each weight type's decode beyond
// the Q8_0 path (Q4_0's nibble select, the k-quants' side-record fields and
// high words; 16-bit weights' conversions), from which OCC_BLOCKS (common.cuh) sizes __launch_bounds__'s
// blocks per SM: the 32 x 32 warp tiles keep two 256-thread blocks (128
// registers), larger tiles and the k-quants get one (255).
#if WTYPE == Q5_K || WTYPE == Q6_K
#define DQ_EXTRA_REGS 80
#elif IS_W16(WTYPE)
#define DQ_EXTRA_REGS 48
#else
#define DQ_EXTRA_REGS 32
#endif
#define ACC_REGS (MI * NJ * 4 + DQ_EXTRA_REGS)

#if STAGE == GATE_UP
extern "C" __global__ void __launch_bounds__(THREADS, OCC_BLOCKS(THREADS, SMEM_BYTES, ACC_REGS))
moe_gemm_gate_up(const u8* wq, const u8* wd, const float* x, const int* sorted, const int2* tiles,
                 const int* offsets, float* h, int d, int ffn, int n_used) {
    pdl_enter();
    gemm_body(wq, wd, x, sorted, tiles, offsets, h, d, ffn, n_used);
}
#else
extern "C" __global__ void __launch_bounds__(THREADS, OCC_BLOCKS(THREADS, SMEM_BYTES, ACC_REGS))
moe_gemm_down(const u8* wq, const u8* wd, const float* h, const int* sorted, const int2* tiles,
              const int* offsets, float* yp, int d, int ffn) {
    pdl_enter();
    gemm_body(wq, wd, h, sorted, tiles, offsets, yp, d, ffn, 1);
}
#endif
#endif
