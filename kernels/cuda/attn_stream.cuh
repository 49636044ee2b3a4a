// attn_stream.cuh: the streaming split-KV decode kernel (attn_decode.cu,
// ALGO = 2). Decode reads every visible K/V byte once and does little math
// per byte, so the kernel is built to keep HBM busy: many CTAs, several
// cp.async stages in flight per CTA, and one __syncthreads per stage.
//
// CTA (x, kvh, z) owns BQ rows of KV head kvh's GQA group and split z of
// the key tiles its rows can see (attn_split.cuh says which).
//
// Warps are KW x WD. Warp (kw, wd) takes the 16-key sub-blocks kw, kw +
// KW, .. of each tile: S = Q K^T (mma.sync m16n8k16, f32 accumulate), with
// QSPLIT = 0 over the whole head dim by every wd warp of a kw (the same S
// WD times over, Q re-read from shared memory), with QSPLIT = 1 over the
// warp's own head dims wd HD / WD .. (its Q fragments held in registers)
// and the WD partial S summed in shared memory (a named barrier per key
// group and sub-block; every warp sums the partials in the same order, so
// the WD warps of a group hold bit-identical S); then an online softmax on the S fragments in registers (running max
// m and sum l per row and warp; P rounded to the operand type and summed
// after rounding, so l matches what PV uses), and O += P V for its head
// dims wd HD / WD .. with P fed from registers as the A operand. At the end
// the KW warps' (m, l, O) are merged through shared memory and the CTA
// writes its unnormalized partial (write_split_partial of attn_split.cuh),
// which attn_combine (attn_decode.cu) merges.
//
// Stages: STAGES buffers of BKV keys of K and V; tile i + STAGES - 1 is
// requested while tile i is computed. Keys at or past kv_len are
// zero-filled, never read; keys a row cannot see are masked (-inf) only in
// sub-blocks a bound cuts, and sub-blocks no row can see are skipped.
//
// The includer defines the entry attn_decode's parameters as attn_core.cuh
// does.
//
// Defines: (none of its own; uses the includer's HEAD_DIM, KV_TYPE, BQ,
// BKV, KW, WD, STAGES, QSPLIT)

#pragma once

#include "attn_operand.cuh"

#if KV_TYPE != F16 && KV_TYPE != BF16
#error "the streaming decode kernel reads F16 or BF16 caches"
#endif

#define HD HEAD_DIM
#define RG (BQ / 16)
#define NWARPS (KW * WD)
#define NTHREADS (NWARPS * 32)
// Row stride of Q, K and V in shared memory (u16): the 16-byte pad puts the
// 8 rows of an ldmatrix in distinct bank groups.
#define QSTRIDE (HD + 8)
#define OCOLS (HD / WD)
#define ONT (OCOLS / 8)
#define SUBS (BKV / 16)
#define CHUNKS (HD / 8)
#define LOADS (BKV * CHUNKS / NTHREADS)

#if (BQ % 16) != 0 || (BKV % 16) != 0 || (SUBS % KW) != 0 || (OCOLS % 16) != 0 || \
    (BKV * CHUNKS) % NTHREADS != 0 || NTHREADS % CHUNKS != 0 || STAGES < 2
#error "bad streaming decode tile: BQ, BKV multiples of 16, KW | BKV/16, HD/WD a multiple of 16, HD/8 | threads"
#endif

#define STREAM_STAGE_BYTES (2 * STAGES * BKV * QSTRIDE * 2)
#define STREAM_MERGE_BYTES ((2 * KW * BQ + BQ * HD) * 4)
// Bytes of dynamic shared memory the kernel needs: Q, then the K/V stages,
// which the final merge reuses.
// Partial S of every warp, two buffers per key group (QSPLIT = 1, WD > 1).
#if QSPLIT && WD > 1
#define STREAM_SX_BYTES (KW * 2 * WD * BQ * 16 * 4)
#else
#define STREAM_SX_BYTES 0
#endif
#define STREAM_SMEM_BYTES                                                                    \
    (BQ * QSTRIDE * 2 +                                                                      \
     (STREAM_STAGE_BYTES > STREAM_MERGE_BYTES ? STREAM_STAGE_BYTES : STREAM_MERGE_BYTES) +   \
     STREAM_SX_BYTES)

#define LOG2E 1.4426950408889634f

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
#if QSPLIT && WD > 1
    float* Sx = reinterpret_cast<float*>(
        smem + BQ * QSTRIDE * 2 +
        (STREAM_STAGE_BYTES > STREAM_MERGE_BYTES ? STREAM_STAGE_BYTES : STREAM_MERGE_BYTES));
    int sx_buf = 0;
#endif

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int kw = warp / WD, wd = warp % WD;
    const int g = lane >> 2, c = lane & 3;
    const DecodeSplit sp = decode_split(q_pos0_arg, n_q, capacity, n_heads, n_kv_heads, window, pos0_dev);
    const int kvh = sp.kvh, G = sp.G, t0 = sp.t0, rows = sp.rows, pos0 = sp.pos0, kv_len = sp.kv_len;
    const int cache_lo = sp.cache_lo, p_lo = sp.p_lo, p_hi = sp.p_hi, k_lo = sp.k_lo;
    const int tile_lo = sp.tile_lo, tile_hi = sp.tile_hi;

    // Every thread copies LOADS 16-byte chunks of K and of V per tile, all
    // at its column ch, rows kr0 + j NTHREADS / CHUNKS.
    const int ch = tid % CHUNKS, kr0 = tid / CHUNKS;
    auto load_tile = [&](int tile, int b) {
        const int kp0 = tile * BKV;
        const int s0 = kp0 % capacity;
#pragma unroll
        for (int j = 0; j < LOADS; ++j) {
            const int kr = kr0 + j * (NTHREADS / CHUNKS);
            const int kp = kp0 + kr;
            int slot = s0 + kr;
            if (slot >= capacity) slot %= capacity;
            const u64 src = ((u64)slot * n_kv_heads + kvh) * HD + ch * 8;
            const int bytes = kp < kv_len ? 16 : 0;
            const int so = (b * BKV + kr) * QSTRIDE + ch * 8;
            cp_async16(smem_addr(Ks + so), kc + src, bytes);
            cp_async16(smem_addr(Vs + so), vc + src, bytes);
        }
    };

    float o[RG][ONT][4];
    float m_run[RG][2], l_run[RG][2];
#pragma unroll
    for (int rg = 0; rg < RG; ++rg) {
#pragma unroll
        for (int n = 0; n < ONT; ++n) o[rg][n][0] = o[rg][n][1] = o[rg][n][2] = o[rg][n][3] = 0.0f;
        m_run[rg][0] = m_run[rg][1] = -INFINITY;
        l_run[rg][0] = l_run[rg][1] = 0.0f;
    }

    // The first tiles' copies around the wait for the grid ahead, and the
    // Q loads (attn_split.cuh).
    QRows<NTHREADS> qrows;
    copy_prologue_and_fetch_q<NTHREADS, true>(sp, load_tile, qrows, q, n_heads);

    // Q rows, rounded to the operand type; rows past the last token are 0.
    store_q_rows<NTHREADS>(Qs, QSTRIDE, qrows);

#if QSPLIT
    // This warp's Q fragments: rows rg 16.., head dims wd HD / WD ...
    __syncthreads();
    u32 qa[RG][OCOLS / 16][4];
#pragma unroll
    for (int rg = 0; rg < RG; ++rg)
#pragma unroll
        for (int kq = 0; kq < OCOLS / 16; ++kq)
            ldmatrix_x4(smem_addr(Qs + (rg * 16 + (lane & 15)) * QSTRIDE + wd * OCOLS + kq * 16 + (lane >> 4) * 8),
                        qa[rg][kq][0], qa[rg][kq][1], qa[rg][kq][2], qa[rg][kq][3]);
#endif

    int buf = 0;
    for (int tile = tile_lo; tile <= tile_hi; ++tile) {
        cp_async_wait<STAGES - 2>();
        // Tile `tile` is visible to every thread, and every warp is done
        // with the buffer the next request overwrites (read last iteration).
        __syncthreads();
        {
            int nb = buf + STAGES - 1;
            if (nb >= STAGES) nb -= STAGES;
            if (tile + STAGES - 1 <= tile_hi) load_tile(tile + STAGES - 1, nb);
            cp_async_commit();
        }
        const u16* Kb = Ks + buf * BKV * QSTRIDE;
        const u16* Vb = Vs + buf * BKV * QSTRIDE;
#pragma unroll 1
        for (int sb = kw; sb < SUBS; sb += KW) {
            const int kb = tile * BKV + sb * 16;
            if (kb > p_hi || kb + 15 < k_lo) continue;

            // S = Q K^T: 16 keys (two n-tiles of 8) per row group.
            float s[RG][2][4];
#pragma unroll
            for (int rg = 0; rg < RG; ++rg)
#pragma unroll
                for (int n = 0; n < 2; ++n) s[rg][n][0] = s[rg][n][1] = s[rg][n][2] = s[rg][n][3] = 0.0f;
            const u16* krow = Kb + (sb * 16 + (lane & 7) + ((lane >> 4) << 3)) * QSTRIDE + ((lane >> 3) & 1) * 8;
#if QSPLIT
#pragma unroll
            for (int kq = 0; kq < OCOLS / 16; ++kq) {
                u32 b[4];
                ldmatrix_x4(smem_addr(krow + wd * OCOLS + kq * 16), b[0], b[1], b[2], b[3]);
#pragma unroll
                for (int rg = 0; rg < RG; ++rg) {
                    op_mma(s[rg][0], qa[rg][kq], b[0], b[1]);
                    op_mma(s[rg][1], qa[rg][kq], b[2], b[3]);
                }
            }
#if WD > 1
            {
                // Sum the WD partials: each thread's fragment values at
                // [buffer][wd][rg][n][e][lane] (conflict-free), then a
                // barrier of the key group's WD warps.
                float* mine = Sx + ((kw * 2 + sx_buf) * WD) * (BQ * 16);
#pragma unroll
                for (int rg = 0; rg < RG; ++rg)
#pragma unroll
                    for (int n = 0; n < 2; ++n)
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            mine[wd * (BQ * 16) + ((rg * 2 + n) * 4 + e) * 32 + lane] = s[rg][n][e];
                asm volatile("bar.sync %0, %1;" ::"r"(1 + kw), "n"(WD * 32) : "memory");
#pragma unroll
                for (int rg = 0; rg < RG; ++rg)
#pragma unroll
                    for (int n = 0; n < 2; ++n)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            float v = mine[((rg * 2 + n) * 4 + e) * 32 + lane];
#pragma unroll
                            for (int w = 1; w < WD; ++w) v += mine[w * (BQ * 16) + ((rg * 2 + n) * 4 + e) * 32 + lane];
                            s[rg][n][e] = v;
                        }
                sx_buf ^= 1;
            }
#endif
#else
#pragma unroll 8
            for (int kk = 0; kk < HD / 16; ++kk) {
                u32 b[4];
                ldmatrix_x4(smem_addr(krow + kk * 16), b[0], b[1], b[2], b[3]);
#pragma unroll
                for (int rg = 0; rg < RG; ++rg) {
                    u32 a[4];
                    ldmatrix_x4(smem_addr(Qs + (rg * 16 + (lane & 15)) * QSTRIDE + kk * 16 + (lane >> 4) * 8),
                                a[0], a[1], a[2], a[3]);
                    op_mma(s[rg][0], a, b[0], b[1]);
                    op_mma(s[rg][1], a, b[2], b[3]);
                }
            }
#endif

            const bool need_mask = kb < cache_lo || kb + 15 > p_lo || (window > 0 && kb <= p_hi - window);
            u32 pa[RG][4];
#pragma unroll
            for (int rg = 0; rg < RG; ++rg) {
#pragma unroll
                for (int hf = 0; hf < 2; ++hf) {
                    if (need_mask) {
                        const int r = rg * 16 + g + hf * 8;
                        const int qp = pos0 + t0 + min(r, rows - 1) / G;
#pragma unroll
                        for (int n = 0; n < 2; ++n)
#pragma unroll
                            for (int e = 0; e < 2; ++e) {
                                const int kp = kb + n * 8 + c * 2 + e;
                                const bool vis = kp >= cache_lo && kp <= qp && (window == 0 || qp - kp < window);
                                if (!vis) s[rg][n][hf * 2 + e] = -INFINITY;
                            }
                    }
                    // Online softmax of row rg 16 + g + 8 hf: its 16 values
                    // sit in the 4 lanes of the quad.
                    float mx = fmaxf(fmaxf(s[rg][0][hf * 2], s[rg][0][hf * 2 + 1]),
                                     fmaxf(s[rg][1][hf * 2], s[rg][1][hf * 2 + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    const float m_new = fmaxf(m_run[rg][hf], mx);
                    const float alpha =
                        m_new == -INFINITY ? 1.0f : exp2f((m_run[rg][hf] - m_new) * LOG2E);
                    const float mb = m_new == -INFINITY ? 0.0f : m_new * LOG2E;
                    const u32 w0 = op_pack(exp2f(fmaf(s[rg][0][hf * 2], LOG2E, -mb)),
                                           exp2f(fmaf(s[rg][0][hf * 2 + 1], LOG2E, -mb)));
                    const u32 w1 = op_pack(exp2f(fmaf(s[rg][1][hf * 2], LOG2E, -mb)),
                                           exp2f(fmaf(s[rg][1][hf * 2 + 1], LOG2E, -mb)));
                    l_run[rg][hf] = l_run[rg][hf] * alpha + ((op_lo(w0) + op_hi(w0)) + (op_lo(w1) + op_hi(w1)));
                    m_run[rg][hf] = m_new;
                    // A fragment of P: a0/a1 rows g/g+8 keys 2c.., a2/a3 keys 8+2c..
                    pa[rg][hf] = w0;
                    pa[rg][2 + hf] = w1;
#pragma unroll
                    for (int n = 0; n < ONT; ++n) {
                        o[rg][n][hf * 2] *= alpha;
                        o[rg][n][hf * 2 + 1] *= alpha;
                    }
                }
            }

            // O += P V for this warp's head dims.
            const u16* vrow = Vb + (sb * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * QSTRIDE + wd * OCOLS +
                              (lane >> 4) * 8;
#pragma unroll
            for (int n = 0; n < ONT; n += 2) {
                u32 b0, b1, b2, b3;
                ldmatrix_x4_trans(smem_addr(vrow + n * 8), b0, b1, b2, b3);
#pragma unroll
                for (int rg = 0; rg < RG; ++rg) {
                    op_mma(o[rg][n], pa[rg], b0, b1);
                    op_mma(o[rg][n + 1], pa[rg], b2, b3);
                }
            }
        }
        buf = buf + 1 == STAGES ? 0 : buf + 1;
    }

    // Merge the KW warps' partials of each row: M = max m, L = sum l e^(m -
    // M), O = sum O e^(m - M); the stage buffers are free once every copy
    // has landed and every warp has left the loop.
    cp_async_wait<0>();
    __syncthreads();
    float* mS = reinterpret_cast<float*>(Ks);
    float* lS = mS + KW * BQ;
    float* Ob = lS + KW * BQ;
#pragma unroll
    for (int rg = 0; rg < RG; ++rg)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            float l = l_run[rg][hf];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            if (wd == 0 && c == 0) {
                const int r = rg * 16 + g + hf * 8;
                mS[kw * BQ + r] = m_run[rg][hf];
                lS[kw * BQ + r] = l;
            }
        }
    __syncthreads();
#pragma unroll
    for (int rg = 0; rg < RG; ++rg)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const int r = rg * 16 + g + hf * 8;
            float M = -INFINITY;
#pragma unroll
            for (int k = 0; k < KW; ++k) M = fmaxf(M, mS[k * BQ + r]);
            const float f = m_run[rg][hf] == -INFINITY ? 0.0f : exp2f((m_run[rg][hf] - M) * LOG2E);
#pragma unroll
            for (int n = 0; n < ONT; ++n) {
                o[rg][n][hf * 2] *= f;
                o[rg][n][hf * 2 + 1] *= f;
            }
        }
#pragma unroll
    for (int k = 0; k < KW; ++k) {
        if (kw == k) {
#pragma unroll
            for (int rg = 0; rg < RG; ++rg)
#pragma unroll
                for (int hf = 0; hf < 2; ++hf) {
                    const int r = rg * 16 + g + hf * 8;
#pragma unroll
                    for (int n = 0; n < ONT; ++n) {
                        float2* p = reinterpret_cast<float2*>(Ob + r * HD + wd * OCOLS + n * 8 + c * 2);
                        float2 v = make_float2(o[rg][n][hf * 2], o[rg][n][hf * 2 + 1]);
                        if (k > 0) {
                            const float2 u = *p;
                            v.x += u.x;
                            v.y += u.y;
                        }
                        *p = v;
                    }
                }
        }
        __syncthreads();
    }

    write_split_partial<NTHREADS, KW>(scratch, Ob, HD, mS, lS, sp, n_q, n_heads);
}
