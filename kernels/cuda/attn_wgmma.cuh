// attn_wgmma.cuh: the prefill flash-attention tile loop on Hopper's
// warpgroup MMA (wgmma, sm_90a), included by attn_prefill.cu for ALGO = 2.
// Same function, layouts, key range, masking and operand roundings as the
// mma.sync loop of attn_core.cuh; what differs is where the data lives.
//
// Warpgroups: the CTA's BQ rows (token x head pairs of one KV head's GQA
// group, packed as in attn_core.cuh) are split into BQ / 64 row warpgroups;
// each of those is WD warpgroups that share its 64 rows and split the head
// dim into WD slices of DS = HEAD_DIM / WD. Threads: 128 (BQ / 64) WD.
// Per KV tile of BKV keys:
//   1. S = Q K^T by wgmma m64nBKVk16 with both operands in shared memory:
//      Q (converted to the operand type once) and the K tile, K-major rows
//      of 64 elements (128 bytes) in the 128-byte swizzle (16-byte chunk c
//      of row r at chunk c ^ (r % 8)), one such block per 64 head dims. The
//      scores stay in the accumulator registers. With WD = 2 each
//      warpgroup reduces its own head-dim slice and the two partial score
//      tiles are added through shared memory (both warpgroups then hold the
//      same full S: the sum of two floats does not depend on their order).
//   2. Online softmax in registers: a row's BKV scores live in the 4 threads
//      of a quad (m64nN accumulator layout: thread (warp w, lane) holds rows
//      16 w + lane / 4 and + 8, columns 8 j + 2 (lane % 4) + {0, 1}). P =
//      2^((S - m) log2 e) on the SFU, summed in f32 and rounded to the
//      operand type for the MMA (attn_core.cuh sums the rounded values; the
//      difference is far below the operand rounding itself); the
//      accumulator layout of two adjacent 8-column blocks is the A-operand
//      layout of one k16 step, so P feeds the next MMA from registers with
//      no shared-memory round trip.
//   3. O = alpha O + P V by wgmma m64nDSk16 with A = P (registers) and B =
//      the V tile read transposed (MN-major): the V tile has the K tile's
//      shared layout, 64 head dims per 128-byte row, so the descriptor's
//      leading offset steps 64 dims (one block, BKV rows apart) and its
//      stride offset steps 8 keys (1024 bytes).
// Every thread issues cp.async copies of K/V rows into the swizzled tiles.
// The MMAs, descriptors and fences are wgmma.cuh's (wgmma_ss for S,
// wgmma_rs_tb for PV).
// STAGES = 1: one K and one V buffer; each tile is copied, waited for, and
// run through the three steps in turn. STAGES = 2: two K and two V buffers
// and PV one tile behind: step j issues S_j and P_{j-1} V_{j-1} together,
// runs the softmax of tile j on the CUDA cores while the tensor cores finish
// PV, and copies K_{j+1} and V_j meanwhile (one CTA barrier per step).
// Query tiles are launched last first (blockIdx.x counts down the
// sequence): under a causal bound the last tiles see the most keys.
// PERSIST = 1 or 2 (STAGES = 2): a grid of about one CTA per SM runs the
// work items (query tile, KV head) in turn, heaviest first, and hides what
// a CTA pays once per item behind the previous item's band. A windowed
// band is only a few KV tiles long, so without this the Q read and the
// pipeline's fill and drain are a large share of its time. In both, the
// next item's first K tile is copied during the band's last step into the
// K buffer that step frees. The next item's Q:
//   PERSIST = 1 (f32 Q): fetched during the band, one chunk per KV tile,
//     by cp.async into a small staging ring, and rounded into a second Q
//     tile one step later (the second tile leaves room for 32-key tiles
//     only);
//   PERSIST = 2 (Q16 = 1): one Q tile. Once every warpgroup has retired
//     the band's last S (the barrier before its last PV), Q is dead, and
//     the next item's Q is copied over it by cp.async while the last PV,
//     the O stores and the next band's first copies run. Q already in the
//     operand type needs no register pass, so the copy is fire-and-forget
//     and 64-key tiles keep their room.
// Q16 = 1: q holds Q already rounded to the operand type (the cache type),
// copied into the swizzled tile by cp.async; Q16 = 0: f32, rounded on the
// way in through registers.
// OUT: F32 writes O as f32 rows; DQ_F16 / DQ_BF16 write it in the
// activation format of the output projection's GEMM (16-bit values, the k
// order permuted inside every group of 16 as dq_convert.cuh lays it out:
// actual pair q stored at pair (q >> 1) + 4 (q & 1)), the f32 row rounded
// once, as the separate conversion pass would.
// Contract approx, like ALGO = 1: Q, K, V and P rounded to the cache type,
// f32 scores, softmax and accumulation.
//
// Dynamic shared memory: 1024 (alignment slack) + (1 + (PERSIST = 1)) BQ
// HD 2 (Q) + STAGES 4 BKV HD (K and V) + (WD = 2) 2 NTHREADS BKV (the score
// exchange) + (PERSIST = 1) 64 NTHREADS (the next item's Q chunks in
// flight).
//
// Defines: (none of its own; uses the includer's HEAD_DIM, BQ, BKV, WD,
// STAGES, WINDOWED, PERSIST, Q16, OUT, COUNT_TILES, KV_TYPE)

#pragma once

#include "attn_operand.cuh"

#if KV_TYPE == F16
#define WG_T "f16"
#elif KV_TYPE == BF16
#define WG_T "bf16"
#else
#error "the wgmma attention kernel reads F16 or BF16 caches"
#endif
#include "wgmma.cuh"

#define HD HEAD_DIM
#define RWG (BQ / 64)
#define NTHREADS (128 * RWG * WD)
#define DS (HD / WD)
#define DB (DS / 64)
#define SACC (BKV / 2)
#define OACC (DS / 2)
#define Q_BYTES (BQ * HD * 2)
#define KV_BYTES (BKV * HD * 2)
#define X_BYTES (WD == 2 ? NTHREADS * SACC * 4 : 0)
#define Q_TILES (PERSIST == 1 ? 2 : 1)
// PERSIST = 1: the next item's Q chunks in flight, 32 bytes per thread, two deep.
#define QSTAGE_BYTES (PERSIST == 1 ? 2 * NTHREADS * 32 : 0)
#define ATTN_SMEM_BYTES (1024 + Q_TILES * Q_BYTES + STAGES * 2 * KV_BYTES + X_BYTES + QSTAGE_BYTES)

#if BQ != 64 && BQ != 128
#error "BQ must be 64 or 128 for the wgmma kernel"
#endif
#if BKV != 32 && BKV != 64 && BKV != 128
#error "BKV must be 32, 64 or 128 for the wgmma kernel"
#endif
#if WD != 1 && WD != 2
#error "WD must be 1 or 2 for the wgmma kernel"
#endif
#if DS != 128 && DS != 256
#error "HEAD_DIM / WD must be 128 or 256 for the wgmma kernel"
#endif
#if PERSIST && STAGES != 2
#error "PERSIST needs STAGES = 2"
#endif
#if PERSIST == 1 && Q16
#error "PERSIST = 1 stages f32 Q; Q16 = 1 runs PERSIST = 0 or 2"
#endif
#if PERSIST == 2 && !Q16
#error "PERSIST = 2 copies the next Q as it is stored (Q16 = 1)"
#endif
#if PERSIST == 2 && OUT != F32 && STAGES * KV_BYTES < Q_BYTES
#error "PERSIST = 2 stages a DQ O tile in the V buffers: they must hold Q_BYTES"
#endif

#if Q16
typedef u16 q_elem;
#else
typedef float q_elem;
#endif

// 2^x on the SFU (flush to zero; 2^-inf = +0).
DEVI float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

DEVI void pair_barrier(int id) { asm volatile("bar.sync %0, 256;" :: "r"(id) : "memory"); }

// What the tile loop's helpers read that is fixed for the CTA (buffers,
// bounds), for the thread (its rows and its share of the copies) or for the
// work item being run (its query tile and KV head).
struct AttnCta {
    u32 s_q, s_k, s_v;      // shared: the item's Q, K buffers, V buffers
    u32 s_qs;               // PERSIST = 1: this thread's two 32-byte Q staging slots
    float* xs;              // score exchange (WD = 2)
    int tid, lane, wr, wdd, r0;
    int G, tok_per, n_q, n_heads, n_kv_heads, capacity, kv_len, cache_lo, window, pos0;
    // The item: query tokens t0 .. t0 + rows / G of KV head kvh, at
    // positions p_lo .. p_hi; this thread's rows r0 and r0 + 8 at qp0 / qp1.
    int t0, kvh, rows, p_lo, p_hi;
    int qp0, qp1;
    bool live0, live1;
    const q_elem* q;
    const u16* kc;
    const u16* vc;
    // Copy assignment: one 16-byte chunk column and rows kr0 + it LSTEP,
    // at shared offsets so_even / so_odd (+ it LSTEP 128) of a buffer.
    int ch, kr0;
    u32 so_even, so_odd;
};

#define LCHUNKS (HD / 8)
#define LSTEP (NTHREADS / LCHUNKS)
#define LITERS (BKV / LSTEP)
#if NTHREADS % LCHUNKS != 0 || BKV % LSTEP != 0 || (BQ * LCHUNKS / NTHREADS) % 8 != 0
#error "the Q and K/V copies do not divide evenly over the threads"
#endif
#if (2 * LSTEP) % 8 != 0
#error "copy rows two steps apart must share their swizzle (LSTEP a multiple of 4)"
#endif

// Shared offset of this thread's chunk in copy row `it` (rows kr0 + it
// LSTEP; 16-byte chunk ch % 8 of its 64-dim block stored at (ch % 8) ^
// (row % 8)): a per-thread base for even and odd `it` (equal when LSTEP is
// a multiple of 8) plus a constant the compiler folds into the copy.
DEVI u32 copy_offset(const AttnCta& c, int it) {
    return ((it & 1) ? c.so_odd : c.so_even) + (u32)(it * LSTEP * 128);
}

// Issues the cp.async copies of K (or V) rows of tile `tile` of KV head
// `kvh` into the buffer at `dst`: position p at slot p % capacity, zero
// past kv_len. A tile that lies inside the ring without wrapping and before
// kv_len (all but the last and the wrapping ones) takes the straight path:
// one pointer stepped by LSTEP rows.
DEVI void load_rows(const AttnCta& c, int kvh, const u16* src_base, u32 dst, int tile) {
    const int kp0 = tile * BKV;
    const int slot0 = kp0 % c.capacity;
    const u32 row_stride = (u32)c.n_kv_heads * HD;
    const u16* base = src_base + (u64)kvh * HD + c.ch * 8;
    if (slot0 + BKV <= c.capacity && kp0 + BKV <= c.kv_len) {
        const u16* p = base + (u64)(u32)(slot0 + c.kr0) * row_stride;
#pragma unroll
        for (int it = 0; it < LITERS; ++it) {
            cp_async16(dst + copy_offset(c, it), p, 16);
            p += LSTEP * row_stride;
        }
        return;
    }
    const int live = c.kv_len - kp0;
#pragma unroll
    for (int it = 0; it < LITERS; ++it) {
        const int kr = c.kr0 + it * LSTEP;
        const int slot = (slot0 + kr) % c.capacity;
        cp_async16(dst + copy_offset(c, it), kr < live ? base + (u64)(u32)slot * row_stride : src_base,
                   kr < live ? 16 : 0);
    }
}

// S = Q K^T over this warpgroup's head-dim slice (issued, not waited).
DEVI void issue_scores(const AttnCta& c, float (&s)[SACC], u32 k_buf) {
    const u64 dq = desc_kmajor(c.s_q + c.wr * 64 * 128 + c.wdd * DB * BQ * 128);
    const u64 dk = desc_kmajor(k_buf + c.wdd * DB * BKV * 128);
    wgmma_fence();
#pragma unroll
    for (int b = 0; b < DB; ++b)
#pragma unroll
        for (int k = 0; k < 4; ++k)
            wgmma_ss(s, dq + (u64)((b * BQ * 128 + k * 32) >> 4), dk + (u64)((b * BKV * 128 + k * 32) >> 4),
                  (b | k) != 0);
    wgmma_commit();
}

// O += P V over this warpgroup's head-dim slice (issued, not waited).
DEVI void issue_pv(const AttnCta& c, float (&o)[OACC], u32 (&pa)[BKV / 16][4], u32 v_buf) {
    const u64 dv = desc_mnmajor(v_buf + c.wdd * DB * BKV * 128, BKV * 128);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BKV / 16; ++kk) wgmma_rs_tb(o, pa[kk], dv + (u64)((kk * 2048) >> 4));
    wgmma_commit();
}

// With WD = 2: adds the partner warpgroup's partial scores (same rows, the
// other head-dim half) so both hold the full S.
DEVI void exchange_scores(const AttnCta& c, float (&s)[SACC]) {
#if WD == 2
    float* mine = c.xs + (c.wr * 2 + c.wdd) * SACC * 128 + (c.tid & 127);
    const float* other = c.xs + (c.wr * 2 + (c.wdd ^ 1)) * SACC * 128 + (c.tid & 127);
#pragma unroll
    for (int i = 0; i < SACC; ++i) mine[i * 128] = s[i];
    pair_barrier(1 + c.wr);
#pragma unroll
    for (int i = 0; i < SACC; ++i) s[i] += other[i * 128];
    // The next tile's writes come after the CTA barrier at its top.
#else
    (void)c;
    (void)s;
#endif
}

// Masks tile `tile`'s scores where a bound cuts it, updates the running max
// and sum, turns the scores into P in place (f32; rounded to the operand
// type only when packed for the MMA) and returns the rescale factors of the
// two rows' earlier O.
DEVI void softmax_tile(const AttnCta& c, float (&s)[SACC], int tile, float (&m_r)[2], float (&l_r)[2],
                       float (&alpha)[2]) {
    const float L2E = 1.4426950408889634f;
    const int kt0 = tile * BKV, kt1 = kt0 + BKV - 1;
    const bool need_mask = kt0 < c.cache_lo || kt1 > c.p_lo || kt1 >= c.kv_len ||
                           (c.window > 0 && kt0 <= c.p_hi - c.window);
    if (need_mask) {
#pragma unroll
        for (int j = 0; j < BKV / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int kp = kt0 + j * 8 + (c.lane & 3) * 2 + (e & 1);
                const int qp = e < 2 ? c.qp0 : c.qp1;
                const bool live = e < 2 ? c.live0 : c.live1;
                const bool vis = live && kp >= c.cache_lo && kp <= qp && kp < c.kv_len &&
                                 (c.window == 0 || qp - kp < c.window);
                if (!vis) s[j * 4 + e] = -INFINITY;
            }
        }
    }
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < BKV / 8; ++j) {
        mx0 = fmaxf(mx0, fmaxf(s[j * 4], s[j * 4 + 1]));
        mx1 = fmaxf(mx1, fmaxf(s[j * 4 + 2], s[j * 4 + 3]));
    }
#pragma unroll
    for (int x = 1; x < 4; x <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
    }
    float mneg[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float m_new = fmaxf(m_r[h], h ? mx1 : mx0);
        alpha[h] = m_new == -INFINITY ? 1.0f : fast_exp2((m_r[h] - m_new) * L2E);
        mneg[h] = m_new == -INFINITY ? 0.0f : -m_new * L2E;
        m_r[h] = m_new;
    }
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int j = 0; j < BKV / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float p = fast_exp2(fmaf(s[j * 4 + e], L2E, mneg[e >> 1]));
            s[j * 4 + e] = p;
            if (e < 2) {
                sum0 += p;
            } else {
                sum1 += p;
            }
        }
    }
    l_r[0] = l_r[0] * alpha[0] + sum0;
    l_r[1] = l_r[1] * alpha[1] + sum1;
}

// P, rounded to the operand type, as the A fragments of the PV MMA: the
// accumulator layout of 8-key blocks 2 kk and 2 kk + 1 is the A layout of
// k16 step kk.
DEVI void pack_probs(const float (&s)[SACC], u32 (&pa)[BKV / 16][4]) {
#pragma unroll
    for (int j = 0; j < BKV / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) pa[j / 2][(j & 1) * 2 + h] = op_pack(s[j * 4 + 2 * h], s[j * 4 + 2 * h + 1]);
}

// O *= alpha by row; skipped by a warp whose rows' maxima all held.
DEVI void rescale(float (&o)[OACC], const float (&alpha)[2]) {
    if (!__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) return;
#pragma unroll
    for (int j = 0; j < DS / 8; ++j) {
        o[j * 4] *= alpha[0];
        o[j * 4 + 1] *= alpha[0];
        o[j * 4 + 2] *= alpha[1];
        o[j * 4 + 3] *= alpha[1];
    }
}

// A work item: the query tile of tokens t0 .. t0 + tok_per - 1 (fewer at
// the end) of KV head kvh, and the KV tiles lo .. hi its rows can see.
struct Item {
    int t0, kvh, rows, p_lo, p_hi, lo, hi;
};

DEVI Item item_of(const AttnCta& c, int t0, int kvh) {
    Item it;
    it.t0 = t0;
    it.kvh = kvh;
    const int n_tok = min(c.tok_per, c.n_q - t0);
    it.rows = n_tok * c.G;
    it.p_lo = c.pos0 + t0;
    it.p_hi = c.pos0 + t0 + n_tok - 1;
#if WINDOWED
    const int k_lo = c.window > 0 ? max(c.cache_lo, it.p_lo - c.window + 1) : c.cache_lo;
#else
    const int k_lo = c.cache_lo;
#endif
    it.lo = k_lo / BKV;
    it.hi = it.p_hi / BKV;
    return it;
}

// Makes `it` the item the tile loop's helpers run.
DEVI void enter_item(AttnCta& c, const Item& it) {
    c.t0 = it.t0;
    c.kvh = it.kvh;
    c.rows = it.rows;
    c.p_lo = it.p_lo;
    c.p_hi = it.p_hi;
    c.live0 = c.r0 < c.rows;
    c.live1 = c.r0 + 8 < c.rows;
    c.qp0 = it.p_lo + c.r0 / c.G;
    c.qp1 = it.p_lo + (c.r0 + 8) / c.G;
}

// Q of an item: rows kr0 + u LSTEP of this thread's chunk column for u <
// QITERS into the swizzled Q tile; rows past the item's last token are 0.
#define QITERS (BQ * LCHUNKS / NTHREADS)

// Row r of an item's Q tile: token t0 + r / G, head kvh G + r % G.
DEVI const q_elem* q_row(const AttnCta& c, const Item& it, int r) {
    const int t = it.t0 + r / c.G, h = it.kvh * c.G + r % c.G;
    return c.q + ((u64)t * c.n_heads + h) * HD;
}
DEVI u32 q_chunk_offset(const AttnCta& c, int r) {
    return (u32)(c.ch / 8) * BQ * 128 + (u32)r * 128 + ((u32)((c.ch % 8) ^ (r & 7)) << 4);
}

#if Q16
// Q16: the copies of an item's Q (already in the operand type) into the
// tile at shared address `qt`, issued, not committed.
DEVI void copy_q16(const AttnCta& c, const Item& it, u32 qt) {
#pragma unroll
    for (int u = 0; u < QITERS; ++u) {
        const int r = c.kr0 + u * LSTEP;
        const bool live = r < it.rows;
        cp_async16(qt + q_chunk_offset(c, r), live ? q_row(c, it, r) + c.ch * 8 : c.q, live ? 16 : 0);
    }
}
#else
// f32 Q: loaded into registers, rounded to the operand type and stored.
#define QBATCH (QITERS < 16 ? QITERS : 16)
// The chunks a short band did not fetch, loaded between two items.
#define QBATCH_TAIL (QITERS < 4 ? QITERS : 4)

DEVI void fetch_q(const AttnCta& c, const Item& it, int u, float4& a, float4& b) {
    const int r = c.kr0 + u * LSTEP;
    a = b = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r < it.rows) {
        const float4* src = reinterpret_cast<const float4*>(q_row(c, it, r) + c.ch * 8);
        a = src[0];
        b = src[1];
    }
}

DEVI void store_q(const AttnCta& c, u8* qt, int u, const float4& a, const float4& b) {
    const int r = c.kr0 + u * LSTEP;
    const uint4 w = make_uint4(op_pack(a.x, a.y), op_pack(a.z, a.w), op_pack(b.x, b.y), op_pack(b.z, b.w));
    *reinterpret_cast<uint4*>(qt + q_chunk_offset(c, r)) = w;
}

// Chunks from .. QITERS - 1 of an item's Q, NB loads in flight at once.
template <int NB> DEVI void load_q(const AttnCta& c, const Item& it, u8* qt, int from) {
#pragma unroll
    for (int g = 0; g < QITERS; g += NB) {
        float4 qa[NB], qb[NB];
#pragma unroll
        for (int u = 0; u < NB; ++u)
            if (g + u >= from) fetch_q(c, it, g + u, qa[u], qb[u]);
#pragma unroll
        for (int u = 0; u < NB; ++u)
            if (g + u >= from) store_q(c, qt, g + u, qa[u], qb[u]);
    }
}
#endif

#if STAGES == 2
// The KV tiles lo .. hi of the entered item, its Q at c.s_q and the copies
// of K tile lo issued into K buffer `kpar`. Two K and two V buffers, PV one
// tile behind: while the softmax of tile j runs on the CUDA cores, the
// tensor cores run P_{j-1} V_{j-1}; P_j is packed into the fragments once
// that MMA has retired. At the top of step j, K_j and V_{j-1} have landed
// and every warpgroup is past step j - 1, so K_{j+1} and V_j are copied
// over K_{j-1} and V_{j-2}.
// With PERSIST and a next item `nx` (has_next): the last step copies the
// next item's first K tile into the K buffer it frees (the return value
// says which). PERSIST = 1: step s copies chunk s of the next item's Q
// (f32) into staging slot s % 2 along with its K/V copies; step s + 1, once
// they have landed, rounds it into the next Q tile `qn`. No load waits
// inside a step. The caller loads the chunks a band shorter than QITERS
// steps did not reach. PERSIST = 2: the barrier before the last PV (every
// warpgroup past its last S) is where the next item's Q copies are issued
// over the current Q tile; the next band's first wait covers them.
DEVI int run_band(const AttnCta& c, float (&o)[OACC], float (&m_r)[2], float (&l_r)[2], int lo, int hi, int kpar,
                  bool has_next, const Item& nx, u8* qn, unsigned int* tile_count) {
    float s[SACC], alpha[2];
#pragma unroll
    for (int i = 0; i < SACC; ++i) s[i] = 0.0f;
    u32 pa[BKV / 16][4];
    auto k_buf = [&](int j) { return c.s_k + (u32)((kpar + j - lo) & 1) * KV_BYTES; };
#if PERSIST == 1
    // Chunk u of the next Q: issued into its slot / rounded out of it.
    auto stage_q = [&](int u) {
        if (has_next && u < QITERS) {
            const int r = c.kr0 + u * LSTEP;
            const float* src = q_row(c, nx, r) + c.ch * 8;
            const bool live = r < nx.rows;
            const u32 slot = c.s_qs + (u32)(u & 1) * 32;
            cp_async16(slot, live ? src : c.q, live ? 16 : 0);
            cp_async16(slot + 16, live ? src + 4 : c.q, live ? 16 : 0);
        }
    };
    auto unstage_q = [&](int u) {
        if (has_next && u >= 0 && u < QITERS) {
            const u32 slot = c.s_qs + (u32)(u & 1) * 32;
            float4 a, b;
            asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                         : "=f"(a.x), "=f"(a.y), "=f"(a.z), "=f"(a.w) : "r"(slot));
            asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                         : "=f"(b.x), "=f"(b.y), "=f"(b.z), "=f"(b.w) : "r"(slot + 16));
            store_q(c, qn, u, a, b);
        }
    };
#else
    (void)nx;
    (void)qn;
    auto stage_q = [](int) {};
    auto unstage_q = [](int) {};
#endif
    auto sync_and_load = [&](int j) {
        cp_async_wait<0>();
        unstage_q(j - 1 - lo);
        fence_proxy_async();
        __syncthreads();
#if COUNT_TILES
        if (c.tid == 0) atomicAdd(tile_count, 1u);
#else
        (void)tile_count;
#endif
        if (j + 1 <= hi) {
            load_rows(c, c.kvh, c.kc, k_buf(j + 1), j + 1);
            load_rows(c, c.kvh, c.vc, c.s_v + ((j - lo) & 1) * KV_BYTES, j);
            stage_q(j - lo);
            cp_async_commit();
        } else {
            // The last step: V_hi (and a Q chunk) in one group, which the
            // last PV waits for; the next item's first K tile in a second
            // (possibly empty) one, which only the next band's first step
            // waits for: it may come from DRAM.
            load_rows(c, c.kvh, c.vc, c.s_v + ((j - lo) & 1) * KV_BYTES, j);
            stage_q(j - lo);
            cp_async_commit();
            if (has_next) load_rows(c, nx.kvh, c.kc, k_buf(j + 1), nx.lo);
            cp_async_commit();
        }
    };
    // Tile lo: its scores and P; no O yet.
    sync_and_load(lo);
    issue_scores(c, s, k_buf(lo));
    wgmma_wait<0>();
    fence_regs(s);
    exchange_scores(c, s);
    softmax_tile(c, s, lo, m_r, l_r, alpha);
    pack_probs(s, pa);
    for (int j = lo + 1; j <= hi; ++j) {
        sync_and_load(j);
        issue_scores(c, s, k_buf(j));
        issue_pv(c, o, pa, c.s_v + ((j - 1 - lo) & 1) * KV_BYTES);
        wgmma_wait<1>();
        fence_regs(s);
        exchange_scores(c, s);
        softmax_tile(c, s, j, m_r, l_r, alpha);
        wgmma_wait<0>();
        fence_regs(o);
        fence_frags(pa);
        pack_probs(s, pa);
        rescale(o, alpha);
    }
    // The last tile's PV: its V was copied at the top of its step.
    cp_async_wait<1>();
    unstage_q(hi - lo);
    fence_proxy_async();
    __syncthreads();
    issue_pv(c, o, pa, c.s_v + ((hi - lo) & 1) * KV_BYTES);
#if PERSIST == 2
    // Issued behind the PV, which the tensor cores run meanwhile.
    if (has_next) {
        copy_q16(c, nx, c.s_q);
        cp_async_commit();
    }
#endif
    wgmma_wait<0>();
    fence_regs(o);
    fence_frags(pa);
    return (kpar + hi + 1 - lo) & 1;
}
#endif

// Output: each row's O over the quad's summed l, in the OUT format.
// F32: straight from the accumulator registers (each warp store covers
// 32 bytes of 8 rows). DQ_F16 / DQ_BF16: through shared memory, so that
// global stores are whole rows: the CTA's O tile (BQ rows of HD 16-bit
// values in the DQ order, 16-byte chunk c of row r at chunk c ^ (r % 8))
// is written at `stage` (Q_BYTES, free once every warpgroup is past its
// last MMA), then read back a row per warp and stored 16 bytes a thread:
// a warp's store is one whole row instead of 4 bytes in each of 8 rows.
#define O_CHUNKS (HD / 8)
DEVI void store_out(const AttnCta& c, const float (&o)[OACC], const float (&l_r)[2], void* __restrict__ out,
                    u32 stage) {
#if OUT != F32
    // Every warpgroup's last PV has retired before the tile is reused.
    __syncthreads();
#else
    (void)stage;
#endif
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float l = l_r[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int r = c.r0 + 8 * h;
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#if OUT == F32
        if (r >= c.rows) continue;
        const int t = c.t0 + r / c.G, head = c.kvh * c.G + r % c.G;
        float* dst = reinterpret_cast<float*>(out) + ((u64)t * c.n_heads + head) * HD + c.wdd * DS + (c.lane & 3) * 2;
#pragma unroll
        for (int jj = 0; jj < DS / 8; ++jj)
            *reinterpret_cast<float2*>(dst + jj * 8) =
                make_float2(o[jj * 4 + 2 * h] * inv, o[jj * 4 + 2 * h + 1] * inv);
#else
        // In each group of 16 columns (8-column blocks jj = 2 g, 2 g + 1)
        // this thread holds pairs q = lane % 4 and 4 + lane % 4, stored at
        // words sp and sp + 2 (pair q at (q >> 1) + 4 (q & 1)). Lanes two
        // apart in the quad swap one word each, so that every lane holds
        // two adjacent words: lanes 0, 1 words sp, sp + 1; lanes 2, 3 words
        // sp + 1, sp + 2 (one 8-byte store instead of two 4-byte ones).
        const int q0 = c.lane & 3;
        const int sp = (q0 >> 1) + 4 * (q0 & 1);
        const bool upper = (q0 & 2) != 0;
        const u32 row = stage + (u32)r * (HD * 2);
#pragma unroll
        for (int g = 0; g < DS / 16; ++g) {
            const float* a = &o[(2 * g) * 4 + 2 * h];
            const float* b = &o[(2 * g + 1) * 4 + 2 * h];
#if OUT == DQ_F16
            const u32 ev = pack_f16x2(a[0] * inv, a[1] * inv), od = pack_f16x2(b[0] * inv, b[1] * inv);
#else
            const u32 ev = pack_bf16x2(a[0] * inv, a[1] * inv), od = pack_bf16x2(b[0] * inv, b[1] * inv);
#endif
            const u32 got = __shfl_xor_sync(0xffffffffu, upper ? ev : od, 2);
            const u32 w0 = upper ? got : ev, w1 = upper ? od : got;
            const int w = c.wdd * DS / 2 + g * 8 + sp + (q0 >> 1);
            const u32 addr = row + (u32)(((w >> 2) ^ (r & 7)) << 4) + (u32)(w & 3) * 4;
            asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(addr), "r"(w0), "r"(w1) : "memory");
        }
#endif
    }
#if OUT != F32
    __syncthreads();
#pragma unroll 4
    for (int i = c.tid; i < c.rows * O_CHUNKS; i += NTHREADS) {
        const int r = i / O_CHUNKS, ch = i % O_CHUNKS;
        uint4 v;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "r"(stage + (u32)r * (HD * 2) + (u32)((ch ^ (r & 7)) << 4)));
        const int t = c.t0 + r / c.G, head = c.kvh * c.G + r % c.G;
        reinterpret_cast<uint4*>(out)[((u64)t * c.n_heads + head) * O_CHUNKS + ch] = v;
    }
#endif
}

DEVI void clear_acc(float (&o)[OACC], float (&m_r)[2], float (&l_r)[2]) {
#pragma unroll
    for (int i = 0; i < OACC; ++i) o[i] = 0.0f;
    m_r[0] = m_r[1] = -INFINITY;
    l_r[0] = l_r[1] = 0.0f;
}

#if PERSIST
// Persistent schedule: work item i is query tile n_qt - 1 - i / n_kv_heads
// of KV head i % n_kv_heads (the last tiles, which see the most keys under
// a causal bound, first), and CTA b of a grid of P runs items b, 2 P - 1 -
// b, 2 P + b, 4 P - 1 - b, ... : heaviest first, snaking so that each
// CTA's total evens out when the work falls off linearly.
DEVI int persist_item(int k, int b, int P) { return k * P + ((k & 1) ? P - 1 - b : b); }
DEVI Item item_at(const AttnCta& c, int i) {
    const int n_qt = (c.n_q + c.tok_per - 1) / c.tok_per;
    return item_of(c, (n_qt - 1 - i / c.n_kv_heads) * c.tok_per, i % c.n_kv_heads);
}
#endif

extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
ATTN_ENTRY(const q_elem* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc,
           void* __restrict__ out, int q_pos0_arg, int n_q, int capacity, int n_heads, int n_kv_heads,
           int window, const int* __restrict__ pos0_dev, float* __restrict__ scratch) {
    pdl_enter();
    extern __shared__ __align__(1024) u8 smem_raw[];
    // Swizzled tiles need 1024-byte alignment; the launch adds 1024 bytes of slack.
    const u32 raw = smem_addr(smem_raw);
    const u32 pad = ((raw + 1023u) & ~1023u) - raw;
    u8* smem = smem_raw + pad;
    // Q: HD / 64 blocks of [BQ rows][128 bytes] (two such tiles with
    // PERSIST: the item's and the next one's); then STAGES K buffers and
    // STAGES V buffers, each HD / 64 blocks of [BKV rows][128 bytes]; then
    // the score exchange; then (PERSIST) 64 bytes of Q staging per thread.
    AttnCta c;
    c.s_q = raw + pad;
    c.s_k = c.s_q + Q_TILES * Q_BYTES;
    c.s_v = c.s_k + STAGES * KV_BYTES;
    c.xs = reinterpret_cast<float*>(smem + Q_TILES * Q_BYTES + STAGES * 2 * KV_BYTES);
    c.tid = threadIdx.x;
    c.s_qs = c.s_q + Q_TILES * Q_BYTES + STAGES * 2 * KV_BYTES + X_BYTES + (u32)c.tid * 64;
    c.lane = c.tid & 31;
    const int warp = (c.tid >> 5) & 3, wg = c.tid >> 7;
    c.wr = wg / WD;
    c.wdd = wg % WD;
    // This thread's rows: r0 and r0 + 8 of the CTA's BQ.
    c.r0 = c.wr * 64 + warp * 16 + (c.lane >> 2);
    c.n_q = n_q;
    c.n_heads = n_heads;
    c.n_kv_heads = n_kv_heads;
    c.capacity = capacity;
    c.window = window;
    c.q = q;
    c.kc = kc;
    c.vc = vc;
    c.ch = c.tid % LCHUNKS;
    c.kr0 = c.tid / LCHUNKS;
    {
        const u32 blk = (u32)(c.ch / 8) * BKV * 128, cc = (u32)c.ch % 8;
        c.so_even = blk + (u32)c.kr0 * 128 + ((cc ^ ((u32)c.kr0 & 7)) << 4);
        c.so_odd = blk + (u32)c.kr0 * 128 + ((cc ^ ((u32)(c.kr0 + LSTEP) & 7)) << 4);
    }
    c.G = n_heads / n_kv_heads;
    c.tok_per = BQ / c.G;
    c.pos0 = pos0_dev ? *pos0_dev : q_pos0_arg;
    c.kv_len = c.pos0 + n_q;
    c.cache_lo = max(0, c.kv_len - capacity);
    unsigned int* tile_count = reinterpret_cast<unsigned int*>(scratch);

    float o[OACC], m_r[2], l_r[2];
#if PERSIST
    const int P = gridDim.x, n_items = ((n_q + c.tok_per - 1) / c.tok_per) * n_kv_heads;
    Item it = item_at(c, blockIdx.x);
    load_rows(c, it.kvh, kc, c.s_k, it.lo);
#if Q16
    copy_q16(c, it, c.s_q);
    cp_async_commit();
#else
    cp_async_commit();
    load_q<QBATCH>(c, it, smem, 0);
#endif
    int kpar = 0, qcur = 0;
    for (int k = 1;; ++k) {
        enter_item(c, it);
        c.s_q = raw + pad + (u32)qcur * Q_BYTES;
        const int ni = persist_item(k, blockIdx.x, P);
        const bool has_next = ni < n_items;
        const Item nx = has_next ? item_at(c, ni) : it;
        u8* qn = smem + (qcur ^ 1) * Q_BYTES;
        clear_acc(o, m_r, l_r);
        kpar = run_band(c, o, m_r, l_r, it.lo, it.hi, kpar, has_next, nx, qn, tile_count);
        // The O tile's staging: PERSIST = 1, the Q tile just run (the next
        // item's is the other); PERSIST = 2, the two V buffers (the Q tile
        // is taking the next item's Q, a K buffer its first K tile).
        store_out(c, o, l_r, out, PERSIST == 1 ? c.s_q : c.s_v);
        if (!has_next) break;
#if PERSIST == 1
        load_q<QBATCH_TAIL>(c, nx, qn, min(it.hi - it.lo + 1, QITERS));
        qcur ^= 1;
#else
        (void)qn;
#endif
        it = nx;
    }
#else
    // The last query tiles see the most keys: they are launched first.
    const Item it = item_of(c, (gridDim.x - 1 - blockIdx.x) * c.tok_per, blockIdx.y);
    enter_item(c, it);
    load_rows(c, c.kvh, kc, c.s_k, it.lo);
#if STAGES == 1
    load_rows(c, c.kvh, vc, c.s_v, it.lo);
#endif
#if Q16
    copy_q16(c, it, c.s_q);
    cp_async_commit();
#else
    cp_async_commit();
    load_q<QBATCH>(c, it, smem, 0);
#endif
    clear_acc(o, m_r, l_r);
#if STAGES == 1
    // One K/V buffer: copy, wait, then scores, softmax and PV in turn.
    float s[SACC], alpha[2];
#pragma unroll
    for (int i = 0; i < SACC; ++i) s[i] = 0.0f;
    u32 pa[BKV / 16][4];
    for (int tile = it.lo; tile <= it.hi; ++tile) {
        if (tile != it.lo) {
            load_rows(c, c.kvh, kc, c.s_k, tile);
            load_rows(c, c.kvh, vc, c.s_v, tile);
            cp_async_commit();
        }
        cp_async_wait<0>();
        // Publish the copies (and Q's stores) to the tensor cores' async proxy.
        fence_proxy_async();
        __syncthreads();
#if COUNT_TILES
        if (c.tid == 0) atomicAdd(tile_count, 1u);
#endif
        issue_scores(c, s, c.s_k);
        wgmma_wait<0>();
        fence_regs(s);
        exchange_scores(c, s);
        softmax_tile(c, s, tile, m_r, l_r, alpha);
        pack_probs(s, pa);
        rescale(o, alpha);
        issue_pv(c, o, pa, c.s_v);
        wgmma_wait<0>();
        fence_regs(o);
        fence_frags(pa);
        __syncthreads();
    }
#else
    run_band(c, o, m_r, l_r, it.lo, it.hi, 0, false, it, smem, tile_count);
#endif
    store_out(c, o, l_r, out, c.s_q);
#endif
}
