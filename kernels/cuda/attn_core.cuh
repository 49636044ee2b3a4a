// attn_core.cuh: the tensor-core flash-attention tile loop shared by the
// prefill and decode attention kernels (attn_prefill.cu, attn_decode.cu).
//
// One CTA owns BQ rows and one KV head: the rows are (query token, query
// head) pairs of that KV head's GQA group, G = n_heads / n_kv_heads heads
// per token packed together (row r = token t0 + r / G, head kvh G + r % G),
// so each K/V tile is read once for every head that uses it. Scale 1.0.
//
// Per KV tile of BKV key positions (keys at slot pos % capacity, so a tile
// may straddle the wrap of a ring buffer):
//   1. S = Q K^T on mma.sync m16n8k16 (f16/bf16 operands, f32 accumulate):
//      warp (rg, wd) computes rows 16 rg .. 16 rg + 15 and S columns
//      wd BKV/WD .. of them, the whole head dim reduced in registers; S goes
//      to shared memory, masked (-inf) only on tiles a bound cuts;
//   2. online softmax by row (f32; 2 WD threads per row): running max m,
//      sum l, the rescale factor alpha, P = exp(S - m) rounded to the
//      operand type and summed after rounding (so l matches what PV uses);
//   3. O = alpha O + P V: warp (rg, wd) owns rows 16 rg.. and head dims
//      wd HD/WD .. of O in registers; V fragments come from ldmatrix.trans.
// K/V tiles are staged by cp.async (CP_ASYNC = 1) into STAGES buffers, the
// next tile loading while this one is computed when STAGES = 2.
//
// Key range of a CTA (positions p_lo .. p_hi of its first and last query,
// kv_len = pos0 + n_q, the oldest key still cached cache_lo =
// max(0, kv_len - capacity)): the last tile is the one holding p_hi; the
// first is the one holding cache_lo, or with WINDOWED = 1 the one holding
// max(cache_lo, p_lo - window + 1): tiles wholly outside every row's window
// are never visited. Keys at or past kv_len are zero-filled, never read.
// With SPLIT = 1 the CTA's tiles are divided among gridDim.z CTAs
// (flash-decoding), each writing unnormalized partials (O, m, l) to scratch
// [z][t][h][HD] then [z][t][h][2] for the combine kernel.
// COUNT_TILES = 1 adds 1 to *scratch (a u32) per visited tile.
//
// The includer defines ATTN_ENTRY (the kernel name) and every define below.
//
// Defines: (none of its own; uses the includer's HEAD_DIM, BQ, BKV, WD,
// STAGES, CP_ASYNC, WINDOWED, COUNT_TILES, KV_TYPE, SPLIT)

#pragma once

#include "stage_copy.cuh"

#include "attn_operand.cuh"

#if KV_TYPE != F16 && KV_TYPE != BF16
#error "the tensor-core attention kernels read F16 or BF16 caches"
#endif

#define HD HEAD_DIM
#define RG (BQ / 16)
#define NWARPS (RG * WD)
#define NTHREADS (NWARPS * 32)
#define QSTRIDE (HD + 8)
#define SSTRIDE (BKV + 4)
#define PSTRIDE (BKV + 8)
#define SCOLS (BKV / WD)
#define SNT (SCOLS / 8)
#define OCOLS (HD / WD)
#define ONT (OCOLS / 8)
#define TPR (NTHREADS / BQ)

#if SNT < 1 || ONT % 2 != 0 || (BKV % 16) != 0 || (HD % 16) != 0
#error "bad attention tile: BKV/WD must be >= 8, HD/WD a multiple of 16"
#endif

// Bytes of dynamic shared memory the kernel needs.
#define ATTN_SMEM_BYTES                                                              \
    ((BQ * QSTRIDE + 2 * STAGES * BKV * QSTRIDE) * 2 + BQ * SSTRIDE * 4 + BQ * PSTRIDE * 2 + \
     3 * BQ * 4)

extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
ATTN_ENTRY(const float* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc,
           float* __restrict__ out, int q_pos0_arg, int n_q, int capacity, int n_heads, int n_kv_heads,
           int window, const int* __restrict__ pos0_dev, float* __restrict__ scratch) {
    // Launched as a programmatic dependent (decode, SPLIT = 1), it waits for
    // the grid ahead before it reads anything (attn_split.cuh's launch order).
    pdl_await_prior();
    extern __shared__ __align__(16) u8 smem[];
    u16* Qs = reinterpret_cast<u16*>(smem);
    u16* Ks = Qs + BQ * QSTRIDE;
    u16* Vs = Ks + STAGES * BKV * QSTRIDE;
    float* Ss = reinterpret_cast<float*>(Vs + STAGES * BKV * QSTRIDE);
    u16* Ps = reinterpret_cast<u16*>(Ss + BQ * SSTRIDE);
    float* m_s = reinterpret_cast<float*>(Ps + BQ * PSTRIDE);
    float* l_s = m_s + BQ;
    float* a_s = l_s + BQ;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int rg = warp / WD, wd = warp % WD;
    const int kvh = blockIdx.y;
    const int G = n_heads / n_kv_heads;
    const int tok_per = BQ / G;
    const int t0 = blockIdx.x * tok_per;
    const int n_tok = min(tok_per, n_q - t0);
    const int rows = n_tok * G;
    const int pos0 = pos0_dev ? *pos0_dev : q_pos0_arg;
    const int kv_len = pos0 + n_q;
    const int cache_lo = max(0, kv_len - capacity);
    const int p_lo = pos0 + t0, p_hi = pos0 + t0 + n_tok - 1;
#if WINDOWED
    const int k_lo = window > 0 ? max(cache_lo, p_lo - window + 1) : cache_lo;
#else
    const int k_lo = cache_lo;
#endif
    int tile_lo = k_lo / BKV, tile_hi = p_hi / BKV;
#if SPLIT
    {
        const int n_tiles = tile_hi - tile_lo + 1;
        const int per = (n_tiles + (int)gridDim.z - 1) / (int)gridDim.z;
        const int lo = tile_lo + (int)blockIdx.z * per;
        tile_hi = min(tile_hi, lo + per - 1);
        tile_lo = lo;
    }
#endif

    // Q rows, rounded to the operand type; rows past the last token are 0.
    for (int i = tid; i < BQ * HD / 2; i += NTHREADS) {
        const int r = i / (HD / 2), c2 = i % (HD / 2);
        float2 v = make_float2(0.f, 0.f);
        if (r < rows) {
            const int t = t0 + r / G, h = kvh * G + r % G;
            v = reinterpret_cast<const float2*>(q + ((u64)t * n_heads + h) * HD)[c2];
        }
        reinterpret_cast<u32*>(Qs + r * QSTRIDE)[c2] = op_pack(v.x, v.y);
    }
    if (tid < BQ) {
        m_s[tid] = -INFINITY;
        l_s[tid] = 0.0f;
    }
    __syncthreads();

    float o[ONT][4];
#pragma unroll
    for (int n = 0; n < ONT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    auto load_tile = [&](int tile, int b) {
        for (int i = tid; i < BKV * (HD / 8); i += NTHREADS) {
            const int kr = i / (HD / 8), ch = i % (HD / 8);
            const int kp = tile * BKV + kr;
            const bool ok = kp >= 0 && kp < kv_len;
            const u64 slot = ok ? (u64)(kp % capacity) : 0;
            const u64 src = (slot * n_kv_heads + kvh) * HD + ch * 8;
            u16* dk = Ks + (b * BKV + kr) * QSTRIDE + ch * 8;
            u16* dv = Vs + (b * BKV + kr) * QSTRIDE + ch * 8;
            copy16(smem_addr(dk), reinterpret_cast<u8*>(dk), kc + src, ok);
            copy16(smem_addr(dv), reinterpret_cast<u8*>(dv), vc + src, ok);
        }
        commit();
    };

    int buf = 0;
    if (tile_lo <= tile_hi) load_tile(tile_lo, 0);
    for (int tile = tile_lo; tile <= tile_hi; ++tile) {
#if STAGES == 2
        if (tile + 1 <= tile_hi) {
            load_tile(tile + 1, buf ^ 1);
        } else {
            commit();
        }
        wait_stages<1>();
#else
        if (tile != tile_lo) load_tile(tile, 0);
        wait_stages<0>();
#endif
        __syncthreads();
#if COUNT_TILES
        if (tid == 0) atomicAdd(reinterpret_cast<unsigned int*>(scratch), 1u);
#endif
        const u16* Kb = Ks + buf * BKV * QSTRIDE;
        const u16* Vb = Vs + buf * BKV * QSTRIDE;
        const int kt0 = tile * BKV, kt1 = kt0 + BKV - 1;
        const bool need_mask = kt0 < cache_lo || kt1 > p_lo || kt1 >= kv_len ||
                               (window > 0 && kt0 <= p_hi - window);

        // 1. S = Q K^T for this warp's rows and columns.
        if (rg * 16 < rows) {
            float s[SNT][4];
#pragma unroll
            for (int n = 0; n < SNT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll 4
            for (int kk = 0; kk < HD / 16; ++kk) {
                u32 a[4];
                ldmatrix_x4(smem_addr(Qs + (rg * 16 + (lane & 15)) * QSTRIDE + kk * 16 + (lane >> 4) * 8),
                            a[0], a[1], a[2], a[3]);
#pragma unroll
                for (int n = 0; n < SNT; ++n) {
                    u32 b0, b1;
                    ldmatrix_x2(smem_addr(Kb + (wd * SCOLS + n * 8 + (lane & 7)) * QSTRIDE + kk * 16 +
                                          ((lane >> 3) & 1) * 8),
                                b0, b1);
                    op_mma(s[n], a, b0, b1);
                }
            }
#pragma unroll
            for (int n = 0; n < SNT; ++n) {
#pragma unroll
                for (int hf = 0; hf < 2; ++hf) {
                    const int r = rg * 16 + (lane >> 2) + hf * 8;
                    const int c = wd * SCOLS + n * 8 + (lane & 3) * 2;
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        float v = s[n][hf * 2 + e];
                        if (need_mask) {
                            const int kp = kt0 + c + e;
                            const int qp = pos0 + t0 + r / G;
                            const bool vis = r < rows && kp >= cache_lo && kp <= qp && kp < kv_len &&
                                             (window == 0 || qp - kp < window);
                            if (!vis) v = -INFINITY;
                        }
                        Ss[r * SSTRIDE + c + e] = v;
                    }
                }
            }
        }
        __syncthreads();

        // 2. Online softmax, TPR threads per row.
        {
            const int r = tid / TPR, sub = tid % TPR;
            const bool live = r < rows;
            float mx = -INFINITY;
            if (live)
                for (int c = sub; c < BKV; c += TPR) mx = fmaxf(mx, Ss[r * SSTRIDE + c]);
#pragma unroll
            for (int o2 = 1; o2 < TPR; o2 <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o2));
            const float m_old = live ? m_s[r] : -INFINITY;
            const float m_new = fmaxf(m_old, mx);
            const float alpha = m_new == -INFINITY ? 1.0f : exp2f((m_old - m_new) * 1.4426950408889634f);
            float sum = 0.0f;
            for (int c = sub; c < BKV; c += TPR) {
                float p = 0.0f;
                if (live && m_new != -INFINITY) p = exp2f((Ss[r * SSTRIDE + c] - m_new) * 1.4426950408889634f);
                p = op_round(p);
                sum += p;
                Ps[r * PSTRIDE + c] = (u16)(op_pack(p, 0.0f) & 0xffffu);
            }
#pragma unroll
            for (int o2 = 1; o2 < TPR; o2 <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o2);
            if (sub == 0) {
                m_s[r] = live ? m_new : -INFINITY;
                l_s[r] = live ? l_s[r] * alpha + sum : 0.0f;
                a_s[r] = alpha;
            }
        }
        __syncthreads();

        // 3. O = alpha O + P V for this warp's rows and head dims.
        if (rg * 16 < rows) {
            const int r0 = rg * 16 + (lane >> 2);
            const float al0 = a_s[r0], al1 = a_s[r0 + 8];
#pragma unroll
            for (int n = 0; n < ONT; ++n) {
                o[n][0] *= al0;
                o[n][1] *= al0;
                o[n][2] *= al1;
                o[n][3] *= al1;
            }
#pragma unroll
            for (int kk = 0; kk < BKV / 16; ++kk) {
                u32 a[4];
                ldmatrix_x4(smem_addr(Ps + (rg * 16 + (lane & 15)) * PSTRIDE + kk * 16 + (lane >> 4) * 8),
                            a[0], a[1], a[2], a[3]);
#pragma unroll
                for (int n = 0; n < ONT; n += 2) {
                    u32 b0, b1, b2, b3;
                    ldmatrix_x4_trans(smem_addr(Vb + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * QSTRIDE +
                                                wd * OCOLS + n * 8 + (lane >> 4) * 8),
                                      b0, b1, b2, b3);
                    op_mma(o[n], a, b0, b1);
                    op_mma(o[n + 1], a, b2, b3);
                }
            }
        }
        __syncthreads();
#if STAGES == 2
        buf ^= 1;
#endif
    }

    // Output: normalized rows, or the split's partials.
    if (rg * 16 < rows) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const int r = rg * 16 + (lane >> 2) + hf * 8;
            if (r >= rows) continue;
            const int t = t0 + r / G, h = kvh * G + r % G;
#if SPLIT
            const u64 row = ((u64)blockIdx.z * n_q + t) * n_heads + h;
            float* dst = scratch + row * HD;
#pragma unroll
            for (int n = 0; n < ONT; ++n) {
                const int d = wd * OCOLS + n * 8 + (lane & 3) * 2;
                *reinterpret_cast<float2*>(dst + d) = make_float2(o[n][hf * 2], o[n][hf * 2 + 1]);
            }
            if (wd == 0 && (lane & 3) == 0) {
                float* ml = scratch + (u64)gridDim.z * n_q * n_heads * HD + row * 2;
                ml[0] = m_s[r];
                ml[1] = l_s[r];
            }
#else
            const float inv = l_s[r] > 0.0f ? 1.0f / l_s[r] : 0.0f;
            float* dst = out + ((u64)t * n_heads + h) * HD;
#pragma unroll
            for (int n = 0; n < ONT; ++n) {
                const int d = wd * OCOLS + n * 8 + (lane & 3) * 2;
                *reinterpret_cast<float2*>(dst + d) = make_float2(o[n][hf * 2] * inv, o[n][hf * 2 + 1] * inv);
            }
#endif
        }
    }
}
