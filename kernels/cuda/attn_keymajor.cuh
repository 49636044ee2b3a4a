// attn_keymajor.cuh: the key-major streaming split-KV decode kernel
// (attn_decode.cu, ALGO = 3). Same CTA grid, key-tile split, cp.async
// stages, partials and combine as attn_stream.cuh (ALGO 2); what differs
// is which side of the mma.sync the keys sit on.
//
// A decode CTA has few rows (G heads x 1..8 tokens: 4 at E4B, 16 at 12B),
// so ALGO 2's m16 row tiles are mostly padding, and its O accumulators
// (16 rows x the warp's head dims) force the head dim over 4-8 warps whose
// partial scores must then be exchanged per key block. Here the scores are
// computed transposed, S^T = K Q^T, with 16 keys on the mma's M and the
// rows on its N (BQ = 8, 16 or 32: NT tiles of 8), and the output as O^T =
// V^T P^T with 16 head dims on M. Half the accumulators (and half the PV
// mma) of the row-major form for up to 8 rows; one warp holds the whole
// head dim's O^T at BQ = 8 (128 f32 at head dim 512), so with WD = 1 a warp
// computes its scores alone, with no exchange and no barrier per key block.
//
// CTA (x, kvh, z) owns BQ rows and split z of the key tiles, as ALGO 2
// (attn_split.cuh). Warps are KW x WD:
// warp (kw, wd) takes the 16-key sub-blocks kw, kw + KW, .. of each tile;
// computes O^T for head dims wd HD / WD .. and S^T: with QSPLIT = 0 over
// the whole head dim (the WD warps of a kw compute the same S^T), with
// QSPLIT = 1 over its own head dims, the WD partials summed through shared
// memory (a named barrier of the kw group per sub-block, every warp adding
// them in the same order, so the group holds bit-identical S^T).
//
// Per sub-block: S^T from K (A operand, ldmatrix) and Q (B operand,
// ldmatrix of the Q rows), in SCH independent accumulator chains; the
// masked tiles as ALGO 2; row maxima over the 8 lanes of a column;
// P = e^(s - m) rounded to the operand type; P^T for PV's B operand by one
// movmatrix.trans per 8 keys; O^T += V^T P^T with V^T by ldmatrix.trans.
// The running max m of a row is raised only when a score exceeds it by
// more than 8 log2 units (then O and l are rescaled, warp-uniformly): P
// stays below 2^8, well inside the f16/bf16 range, and the rescale, one
// multiply per accumulator, runs on a handful of sub-blocks, not on every
// one.
// O, l and the m they are relative to are what the combine merges, so
// the stale m changes nothing in the result.
//
// Copies: with BULK = 0 every thread issues 16-byte cp.async chunks of
// each tile. With BULK = 1 (sm_90) the lanes of warp 0 issue one bulk copy
// (the TMA engine's cp.async.bulk) per key row of K and of V, each stage
// completing on its own mbarrier: one copy instruction per key row instead
// of one per 16 bytes. A key past kv_len is copied from the last key's slot
// instead (always cached, finite; masked, so its P is 0).
//
// The includer defines the entry attn_decode's parameters as attn_core.cuh
// does.
//
// Defines: (none of its own; uses the includer's HEAD_DIM, KV_TYPE, BQ,
// BKV, KW, WD, STAGES, QSPLIT, BULK)

#pragma once

#include "attn_operand.cuh"

#if KV_TYPE != F16 && KV_TYPE != BF16
#error "the key-major decode kernel reads F16 or BF16 caches"
#endif

#define HD HEAD_DIM
#define NT (BQ / 8)
#define NWARPS (KW * WD)
#define NTHREADS (NWARPS * 32)
// Row stride of Q, K and V in shared memory (u16): the 16-byte pad puts the
// 8 rows of an ldmatrix in distinct bank groups.
#define QSTRIDE (HD + 8)
// Head dims of O per warp, and their 16-dim m-tiles.
#define DW (HD / WD)
#define MT (DW / 16)
#define SUBS (BKV / 16)
#define CHUNKS (HD / 8)
#define ROWS_PER_PASS (NTHREADS / CHUNKS)
#define LOADS (BKV / ROWS_PER_PASS)
// Head dims of this warp's S^T, and the first of them.
#define SDIMS (QSPLIT ? HD / WD : HD)
// Independent accumulator chains of S^T (one mma per 16 head dims each).
#define SCH (NT == 1 ? 4 : 2)
// Row stride of the f32 merge buffer: 4 floats of pad spread the rows
// 2c, 2c + 1 of a fragment over distinct banks.
#define OSTRIDE (HD + 4)

#if (BQ != 8 && BQ != 16 && BQ != 32) || (BKV % (16 * KW)) != 0 || (DW % 16) != 0 || \
    NTHREADS % CHUNKS != 0 || BKV % ROWS_PER_PASS != 0 || STAGES < 2 || (SDIMS % 32) != 0
#error "bad key-major decode tile: BQ 8|16|32, KW | BKV/16, HD/WD a multiple of 16, HD/8 | threads"
#endif

#if BULK && __CUDA_ARCH__ < 900
#error "BULK = 1 needs sm_90 (cp.async.bulk)"
#endif

#define KM_STAGE_BYTES (2 * STAGES * BKV * QSTRIDE * 2)
#define KM_MERGE_BYTES ((2 * KW * BQ + BQ * OSTRIDE) * 4)
#define KM_REGION_BYTES (KM_STAGE_BYTES > KM_MERGE_BYTES ? KM_STAGE_BYTES : KM_MERGE_BYTES)
// Partial S^T of every warp, two buffers per key group (QSPLIT, WD > 1).
#if QSPLIT && WD > 1
#define KM_SX_BYTES (KW * 2 * WD * NT * 128 * 4)
#else
#define KM_SX_BYTES 0
#endif
// Bytes of dynamic shared memory the kernel needs: Q, then the K/V stages,
// which the final merge reuses, the partial S^T, then (BULK) one mbarrier
// per stage.
#define KM_SMEM_BYTES (BQ * QSTRIDE * 2 + KM_REGION_BYTES + KM_SX_BYTES + (BULK ? 8 * STAGES : 0))

#define LOG2E 1.4426950408889634f
// 8 log2 units in the scores' natural units.
#define KM_RAISE (8.0f / LOG2E)

// The transpose of the 8x8 b16 matrix whose fragment the warp holds
// (thread (g, c): elements (g, 2c), (g, 2c + 1)).
DEVI u32 movmatrix_trans(u32 a) {
    u32 d;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(a));
    return d;
}

#if BULK
// The mbarrier protocol of the bulk copies: one arrival (warp 0's lane 0,
// announcing the stage's bytes) and the copies' byte counts complete a
// phase.
DEVI void mbar_init(u32 bar) { asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory"); }
DEVI void mbar_expect_bytes(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
DEVI void mbar_wait(u32 bar, u32 parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "KM_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra.uni KM_WAIT;\n"
        "}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
// `bytes` from global src to shared dst (both 16-byte aligned), counted on bar.
DEVI void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
#endif

extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
attn_decode(const float* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc,
            float* __restrict__ out, int q_pos0_arg, int n_q, int capacity, int n_heads,
            int n_kv_heads, int window, const int* __restrict__ pos0_dev,
            float* __restrict__ scratch) {
    (void)out;
    extern __shared__ __align__(16) u8 smem[];
    u16* Qs = reinterpret_cast<u16*>(smem);
    u16* Ks = Qs + BQ * QSTRIDE;
    u16* Vs = Ks + STAGES * BKV * QSTRIDE;
    pdl_release_dependents();

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int kw = warp / WD, wd = warp % WD;
    const int g = lane >> 2, c = lane & 3;
    const DecodeSplit sp = decode_split(q_pos0_arg, n_q, capacity, n_heads, n_kv_heads, window, pos0_dev);
    const int kvh = sp.kvh, G = sp.G, t0 = sp.t0, rows = sp.rows, pos0 = sp.pos0, kv_len = sp.kv_len;
    const int cache_lo = sp.cache_lo, p_lo = sp.p_lo, p_hi = sp.p_hi, k_lo = sp.k_lo;
    const int tile_lo = sp.tile_lo, tile_hi = sp.tile_hi;

#if BULK
    // Lane r of warp 0 copies the rows r, r + 32, .. of a tile's K and V.
    const u32 bars = smem_addr(smem + BQ * QSTRIDE * 2 + KM_REGION_BYTES + KM_SX_BYTES);
    if (tid == 0) {
#pragma unroll
        for (int b = 0; b < STAGES; ++b) mbar_init(bars + 8 * b);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const u64 row_stride = (u64)n_kv_heads * HD;
    auto load_tile = [&](int tile, int b) {
        if (warp != 0) return;
        const u32 bar = bars + 8 * b;
        if (lane == 0) mbar_expect_bytes(bar, 2 * BKV * HD * 2);
        __syncwarp();
        for (int r = lane; r < BKV; r += 32) {
            const int kp = min(tile * BKV + r, kv_len - 1);
            const u64 src = (u64)(kp % capacity) * row_stride + (u64)kvh * HD;
            const int so = (b * BKV + r) * QSTRIDE;
            bulk_copy(smem_addr(Ks + so), kc + src, HD * 2, bar);
            bulk_copy(smem_addr(Vs + so), vc + src, HD * 2, bar);
        }
    };
#else
    // Every thread copies LOADS 16-byte chunks of K and of V per tile, all
    // at its column ch, rows kr0 + j ROWS_PER_PASS. A tile that neither
    // wraps the ring nor passes kv_len takes the straight path: one base
    // address per tile and a constant stride.
    const int ch = tid % CHUNKS, kr0 = tid / CHUNKS;
    const u64 row_stride = (u64)n_kv_heads * HD;
    const u16* kbase = kc + (u64)kvh * HD + ch * 8;
    const u16* vbase = vc + (u64)kvh * HD + ch * 8;
    auto load_tile = [&](int tile, int b) {
        const int kp0 = tile * BKV;
        const int s0 = kp0 % capacity;
        const u32 kd = smem_addr(Ks + (b * BKV + kr0) * QSTRIDE + ch * 8);
        const u32 vd = smem_addr(Vs + (b * BKV + kr0) * QSTRIDE + ch * 8);
        if (s0 + BKV <= capacity && kp0 + BKV <= kv_len) {
            const u16* ks = kbase + (u64)(s0 + kr0) * row_stride;
            const u16* vs = vbase + (u64)(s0 + kr0) * row_stride;
#pragma unroll
            for (int j = 0; j < LOADS; ++j) {
                cp_async16(kd + j * (ROWS_PER_PASS * QSTRIDE * 2), ks + j * ROWS_PER_PASS * row_stride, 16);
                cp_async16(vd + j * (ROWS_PER_PASS * QSTRIDE * 2), vs + j * ROWS_PER_PASS * row_stride, 16);
            }
        } else {
#pragma unroll 1
            for (int j = 0; j < LOADS; ++j) {
                const int kr = kr0 + j * ROWS_PER_PASS;
                const int slot = (s0 + kr) % capacity;
                const int bytes = kp0 + kr < kv_len ? 16 : 0;
                cp_async16(kd + j * (ROWS_PER_PASS * QSTRIDE * 2), kbase + (u64)slot * row_stride, bytes);
                cp_async16(vd + j * (ROWS_PER_PASS * QSTRIDE * 2), vbase + (u64)slot * row_stride, bytes);
            }
        }
    };
#endif

    // O^T fragments: o[mt][nt] = head dims wd DW + mt 16 + g (+ 8) x rows
    // nt 8 + 2c (+ 1). m_run / l_run: rows nt 8 + 2c + e of this lane's
    // column (l_run this lane's keys only, summed over the column at the end).
    float o[MT][NT][4];
    float m_run[NT][2], l_run[NT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) o[mt][nt][0] = o[mt][nt][1] = o[mt][nt][2] = o[mt][nt][3] = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        m_run[nt][0] = m_run[nt][1] = -INFINITY;
        l_run[nt][0] = l_run[nt][1] = 0.0f;
    }

    // The first tiles' copies around the wait for the grid ahead, and the
    // Q loads (attn_split.cuh).
    QRows<NTHREADS> qrows;
    copy_prologue_and_fetch_q<NTHREADS, !BULK>(sp, load_tile, qrows, q, n_heads);

    // Q rows, rounded to the operand type; rows past the last token are 0.
    // The loop's first barrier publishes them.
    store_q_rows<NTHREADS>(Qs, QSTRIDE, qrows);

    // This warp's S^T head dims start at s_dim0.
    const int s_dim0 = QSPLIT ? wd * SDIMS : 0;
    const u32 q_lane = smem_addr(Qs + (lane & 7) * QSTRIDE + (lane >> 3) * 8 + s_dim0);
#if QSPLIT && WD > 1
    float* Sx = reinterpret_cast<float*>(smem + BQ * QSTRIDE * 2 + KM_REGION_BYTES);
    int sx_buf = 0;
#endif
    int buf = 0;
#if BULK
    // Buffer buf's phase: flips each time the buffer comes round again.
    u32 phase = 0;
#endif
    for (int tile = tile_lo; tile <= tile_hi; ++tile) {
#if BULK
        mbar_wait(bars + 8 * buf, phase);
        if (buf == STAGES - 1) phase ^= 1;
#else
        cp_async_wait<STAGES - 2>();
#endif
        // Tile `tile` is visible to every thread, and every warp is done
        // with the buffer the next request overwrites (read last iteration).
        __syncthreads();
        {
            int nb = buf + STAGES - 1;
            if (nb >= STAGES) nb -= STAGES;
            if (tile + STAGES - 1 <= tile_hi) load_tile(tile + STAGES - 1, nb);
#if !BULK
            cp_async_commit();
#endif
        }
        const u16* Kb = Ks + buf * BKV * QSTRIDE;
        const u16* Vb = Vs + buf * BKV * QSTRIDE;
#pragma unroll 1
        for (int sb = kw; sb < SUBS; sb += KW) {
            const int kb = tile * BKV + sb * 16;
            if (kb > p_hi || kb + 15 < k_lo) continue;

            // S^T = K Q^T: keys kb + g (+ 8) x rows nt 8 + 2c (+ 1).
            float sc[SCH][NT][4];
#pragma unroll
            for (int h = 0; h < SCH; ++h)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) sc[h][nt][0] = sc[h][nt][1] = sc[h][nt][2] = sc[h][nt][3] = 0.0f;
            const u32 k_lane = smem_addr(Kb + (sb * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * QSTRIDE +
                                         (lane >> 4) * 8 + s_dim0);
#pragma unroll
            for (int kk = 0; kk < SDIMS / 32; ++kk) {
                u32 a0[4], a1[4];
                ldmatrix_x4(k_lane + kk * 64, a0[0], a0[1], a0[2], a0[3]);
                ldmatrix_x4(k_lane + kk * 64 + 32, a1[0], a1[1], a1[2], a1[3]);
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    u32 b[4];
                    ldmatrix_x4(q_lane + nt * (8 * QSTRIDE * 2) + kk * 64, b[0], b[1], b[2], b[3]);
                    op_mma(sc[(2 * kk) % SCH][nt], a0, b[0], b[1]);
                    op_mma(sc[(2 * kk + 1) % SCH][nt], a1, b[2], b[3]);
                }
            }
            float s[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    float v = sc[0][nt][e];
#pragma unroll
                    for (int h = 1; h < SCH; ++h) v += sc[h][nt][e];
                    s[nt][e] = v;
                }
#if QSPLIT && WD > 1
            {
                // Sum the WD partials: each lane's values at [buffer][wd][nt][e][lane]
                // (conflict-free), a barrier of the kw group, then every warp adds
                // them in wd order.
                float* mine = Sx + ((kw * 2 + sx_buf) * WD) * (NT * 128);
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) mine[wd * (NT * 128) + (nt * 4 + e) * 32 + lane] = s[nt][e];
                asm volatile("bar.sync %0, %1;" ::"r"(1 + kw), "n"(WD * 32) : "memory");
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        float v = mine[(nt * 4 + e) * 32 + lane];
#pragma unroll
                        for (int w = 1; w < WD; ++w) v += mine[w * (NT * 128) + (nt * 4 + e) * 32 + lane];
                        s[nt][e] = v;
                    }
                sx_buf ^= 1;
            }
#endif

            const bool need_mask = kb < cache_lo || kb + 15 > p_lo || (window > 0 && kb <= p_hi - window);
            if (need_mask) {
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int kp = kb + g + (e >> 1) * 8;
                        const int r = nt * 8 + 2 * c + (e & 1);
                        const int qp = pos0 + t0 + min(r, rows - 1) / G;
                        const bool vis = kp >= cache_lo && kp <= qp && (window == 0 || qp - kp < window);
                        if (!vis) s[nt][e] = -INFINITY;
                    }
            }

            // Row maxima: row nt 8 + 2c + e1's 16 scores sit in s[nt][e1]
            // and s[nt][2 + e1] of the 8 lanes of column c.
            float mx[NT][2];
            bool raise = false;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e1 = 0; e1 < 2; ++e1) {
                    float v = fmaxf(s[nt][e1], s[nt][2 + e1]);
                    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
                    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
                    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
                    mx[nt][e1] = v;
                    raise |= v > m_run[nt][e1] + KM_RAISE;
                }
            if (__any_sync(0xffffffffu, raise)) {
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e1 = 0; e1 < 2; ++e1) {
                        const float m_new = fmaxf(m_run[nt][e1], mx[nt][e1]);
                        const float alpha =
                            m_new == -INFINITY ? 1.0f : exp2f((m_run[nt][e1] - m_new) * LOG2E);
                        m_run[nt][e1] = m_new;
                        l_run[nt][e1] *= alpha;
#pragma unroll
                        for (int mt = 0; mt < MT; ++mt) {
                            o[mt][nt][e1] *= alpha;
                            o[mt][nt][2 + e1] *= alpha;
                        }
                    }
            }

            // P = e^(s - m) in the operand type; P^T's B fragments (keys
            // 2c, 2c + 1 (+ 8) x row g) by transposing each 8-key half.
            u32 pb[NT][2];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const float mb0 = m_run[nt][0] == -INFINITY ? 0.0f : m_run[nt][0] * LOG2E;
                const float mb1 = m_run[nt][1] == -INFINITY ? 0.0f : m_run[nt][1] * LOG2E;
                const u32 w_lo = op_pack(exp2f(fmaf(s[nt][0], LOG2E, -mb0)), exp2f(fmaf(s[nt][1], LOG2E, -mb1)));
                const u32 w_hi = op_pack(exp2f(fmaf(s[nt][2], LOG2E, -mb0)), exp2f(fmaf(s[nt][3], LOG2E, -mb1)));
                l_run[nt][0] += op_lo(w_lo) + op_lo(w_hi);
                l_run[nt][1] += op_hi(w_lo) + op_hi(w_hi);
                pb[nt][0] = movmatrix_trans(w_lo);
                pb[nt][1] = movmatrix_trans(w_hi);
            }

            // O^T += V^T P^T for this warp's head dims.
            const u32 v_lane = smem_addr(Vb + (sb * 16 + (lane & 7) + (lane >> 4) * 8) * QSTRIDE + wd * DW +
                                         ((lane >> 3) & 1) * 8);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                u32 a[4];
                ldmatrix_x4_trans(v_lane + mt * 32, a[0], a[1], a[2], a[3]);
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) op_mma(o[mt][nt], a, pb[nt][0], pb[nt][1]);
            }
        }
        buf = buf + 1 == STAGES ? 0 : buf + 1;
    }

    // Merge the KW warps' partials of each row: M = max m, L = sum l e^(m -
    // M), O = sum O e^(m - M); the stage buffers are free once every copy
    // has landed and every warp has left the loop (with BULK every copy
    // issued was waited for in the loop).
#if !BULK
    cp_async_wait<0>();
#endif
    __syncthreads();
    float* mS = reinterpret_cast<float*>(Ks);
    float* lS = mS + KW * BQ;
    float* Ob = lS + KW * BQ;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e1 = 0; e1 < 2; ++e1) {
            float l = l_run[nt][e1];
            l += __shfl_xor_sync(0xffffffffu, l, 4);
            l += __shfl_xor_sync(0xffffffffu, l, 8);
            l += __shfl_xor_sync(0xffffffffu, l, 16);
            if (wd == 0 && g == 0) {
                const int r = nt * 8 + 2 * c + e1;
                mS[kw * BQ + r] = m_run[nt][e1];
                lS[kw * BQ + r] = l;
            }
        }
    __syncthreads();
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e1 = 0; e1 < 2; ++e1) {
            const int r = nt * 8 + 2 * c + e1;
            float M = -INFINITY;
#pragma unroll
            for (int k = 0; k < KW; ++k) M = fmaxf(M, mS[k * BQ + r]);
            const float f = m_run[nt][e1] == -INFINITY ? 0.0f : exp2f((m_run[nt][e1] - M) * LOG2E);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                o[mt][nt][e1] *= f;
                o[mt][nt][2 + e1] *= f;
            }
        }
#pragma unroll
    for (int k = 0; k < KW; ++k) {
        if (kw == k) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int r = nt * 8 + 2 * c + (e & 1);
                        const int d = wd * DW + mt * 16 + g + (e >> 1) * 8;
                        float* p = Ob + r * OSTRIDE + d;
                        *p = k > 0 ? *p + o[mt][nt][e] : o[mt][nt][e];
                    }
        }
        __syncthreads();
    }

    write_split_partial<NTHREADS, KW>(scratch, Ob, OSTRIDE, mS, lS, sp, n_q, n_heads);
}
