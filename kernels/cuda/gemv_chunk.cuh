// gemv_chunk.cuh: one lane's 16- or 32-byte piece ("chunk") of a weight row
// as the decode GEMVs read it: the chunk layouts of every weight type and
// LAYOUT (gemv.cu's header describes them), the chunk load, and the chunk
// dot products with f32 activations (ALGO 0: exactly dequantized weights,
// fp32 FMA), Q8_1 activations (ALGO 1: dp4a) or split Q8 activations (ALGO
// 2 and 3: two dp4a per word; ALGO 2 also makes the split itself). Shared by
// gemv.cu and moe_gemv.cu, which read the same bytes in the same way.
//
// Defines: (none of its own; uses the includer's WTYPE, LAYOUT and ALGO)

#pragma once

#include "common.cuh"
#include "kquant.cuh"
#include "q8_split.cuh"


// Where element e of one token's f32 activation row sits, and how four of
// them are read. By default the row is the caller's global array, read
// through the read-only cache. An includer that stages the row in shared
// memory (gemv.cu with XSMEM=1) defines GEMV_XPAD first: every 32-element
// group is then followed by 4 floats of padding, so the lanes of a warp,
// each on its own group, read 16-byte pieces 144 bytes apart, which fall
// in distinct banks (without the padding they would be 128 bytes apart,
// every lane in the same banks). A chunk reads only inside the 32-element
// group its first element e lies in, so XPOS(e) + off addresses element
// e + off for every offset a chunk uses.
#ifdef GEMV_XPAD
#define XPOS(e) ((((e) >> 5) * 36) + ((e) & 31))
#define XLD4(p) (*reinterpret_cast<const float4*>(p))
#else
#define XPOS(e) (e)
#define XLD4(p) __ldg(reinterpret_cast<const float4*>(p))
#endif

// Where ALGO 1's Q8_1 activations are read: global memory through the
// read-only cache by default; an includer that stages them in shared memory
// (moe_gemv.cu with ALGO=1) defines GEMV_Q8_SHARED first, and they are read
// with plain loads.
#ifdef GEMV_Q8_SHARED
#define Q8LD(T, p) (*reinterpret_cast<const T*>(p))
#else
#define Q8LD(T, p) __ldg(reinterpret_cast<const T*>(p))
#endif

// KQ: a k-quant read from its planes (nibbles + side records).
#define KQ (IS_KQUANT(WTYPE) && LAYOUT == 1)
#define W16 IS_W16(WTYPE)
#if WTYPE == Q5_K
#define HWORDS 1
#else
#define HWORDS 2
#endif

// Elements per chunk and 32-bit quant words per chunk.
#if W16
#define CHUNK 8
#define CWORDS 4
#elif KQ
#define CHUNK 32
#define CWORDS 4
#elif LAYOUT == 1 && WTYPE == Q8_0
#define CHUNK 16
#define CWORDS 4
#elif WTYPE == Q8_0 || WTYPE == Q6_K
#define CHUNK 32
#define CWORDS 8
#else
#define CHUNK 32
#define CWORDS 4
#endif

// Q6_K on GGUF blocks: w holds the 32 6-bit quants (0..63) one per byte, d
// and d2 the d * scale of the chunk's two 16-element groups. KQ: w holds
// the group's 16 nibble bytes and h its high-bit words; d and d2 are
// d * sc and dmin * m (Q4_K, Q5_K) or the two d * scale (Q6_K).
struct Chunk {
    u32 w[CWORDS];
    float d;
#if WTYPE == Q6_K || KQ
    float d2;
#endif
#if KQ && WTYPE != Q4_K
    u32 h[HWORDS];
#endif
};

#if WTYPE == Q6_K && LAYOUT == 0
// The 32 bytes at p (2-byte aligned) as 8 little-endian words: 9 aligned
// loads, then funnel shifts by the misalignment (0 or 16 bits).
DEVI void ld32_a2(const u8* p, u32 (&w)[8]) {
    const u32* a = reinterpret_cast<const u32*>((u64)p & ~(u64)3);
    const u32 sh = ((u32)(u64)p & 3u) * 8u;
    u32 v[9];
#pragma unroll
    for (int i = 0; i < 9; ++i) v[i] = __ldg(a + i);
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = __funnelshift_r(v[i], v[i + 1], sh);
}

// Byte b (a 6-bit quant) of w minus 32 as a float, without I2F: PRMT builds
// 0x4B0000qq = 2^23 + q and one FADD removes 2^23 + 32 (exact). I2F has a
// quarter of FADD's throughput, and a lane converts 32 values per 26 bytes.
DEVI float q6f(u32 w, int b) {
    return __int_as_float((int)__byte_perm(w, 0x4B000000u, 0x7440u | (u32)b)) - 8388640.0f;
}
#endif

// Asks for the 16 quant (or 16-bit value) bytes of chunk c of row `row` to
// be brought into L2: the planes and 16-bit rows (one 16-byte piece per
// chunk); GGUF blocks are not prefetched.
DEVI void prefetch_chunk(const u8* __restrict__ wq, int row, int c, int k) {
#if W16
    prefetch_l2(wq + ((u64)row * k + (u64)c * 8) * 2);
#elif LAYOUT == 1 && WTYPE == Q8_0
    prefetch_l2(wq + (u64)row * k + (u64)c * 16);
#elif LAYOUT == 1
    prefetch_l2(wq + (u64)row * (k / 2) + (u64)c * 16);
#else
    (void)wq, (void)row, (void)c, (void)k;
#endif
}

// Loads chunk c (elements c*CHUNK ..) of row `row`.
DEVI Chunk load_chunk(const u8* __restrict__ wq, const u16* __restrict__ wd, int row, int c, int k) {
    Chunk ch;
    const int nb = k / 32;
    const int b = (c * CHUNK) / 32;
#if W16
    (void)wd;
    (void)nb;
    (void)b;
    const uint4 v = ld_stream16(wq + ((u64)row * k + (u64)c * 8) * 2);
    ch.w[0] = v.x; ch.w[1] = v.y; ch.w[2] = v.z; ch.w[3] = v.w;
    ch.d = 1.0f;  // unused: the values carry their own scale
#elif KQ
    (void)nb;
    (void)b;
    const uint4 v = ld_stream16(wq + (u64)row * (k / 2) + (u64)c * 16);
    ch.w[0] = v.x; ch.w[1] = v.y; ch.w[2] = v.z; ch.w[3] = v.w;
    const int j = c % 8;
    const u64 sb = (u64)row * (k / 256) + c / 8;
    const u8* side = reinterpret_cast<const u8*>(wd);
#if WTYPE == Q6_K
    const u8* rec = side + sb * KQ6_REC;
    const uint2 hh = __ldg(reinterpret_cast<const uint2*>(rec + 8 * j));
    ch.h[0] = hh.x;
    ch.h[1] = hh.y;
    const u32 sc = __ldg(reinterpret_cast<const u16*>(rec + 64 + 2 * j));
    const float d = h2f(__ldg(reinterpret_cast<const u16*>(rec + 80)));
    ch.d = d * (float)(i8)(sc & 0xffu);
    ch.d2 = d * (float)(i8)(sc >> 8);
#else
    const u8* rec = side + sb * (WTYPE == Q5_K ? 48 : 16);
    const uint4 hd = __ldg(reinterpret_cast<const uint4*>(rec));
    u32 sc, m;
    kq_scale_min(hd, j, sc, m);
    ch.d = h2f((u16)(hd.x & 0xffffu)) * (float)sc;
    ch.d2 = h2f((u16)(hd.x >> 16)) * (float)m;
#if WTYPE == Q5_K
    ch.h[0] = __ldg(reinterpret_cast<const u32*>(rec + 16 + 4 * j));
#endif
#endif
#elif LAYOUT == 1
#if WTYPE == Q8_0
    const uint4 v = ld_stream16(wq + (u64)row * k + (u64)c * 16);
#else
    const uint4 v = ld_stream16(wq + (u64)row * (k / 2) + (u64)c * 16);
#endif
    ch.w[0] = v.x; ch.w[1] = v.y; ch.w[2] = v.z; ch.w[3] = v.w;
    ch.d = h2f(__ldg(wd + (u64)row * nb + b));
#elif WTYPE == Q6_K
    (void)wd;
    const int j = c % 8, h = j / 4, u = j % 4;
    const u8* blk = wq + ((u64)row * (k / 256) + c / 8) * 210;
    u32 lo[8], hi[8];
    ld32_a2(blk + 64 * h + 32 * (u & 1), lo);
    ld32_a2(blk + 128 + 32 * h, hi);
    const u32 sc = __ldg(reinterpret_cast<const u16*>(blk + 192 + 2 * j));
    const float d = h2f(__ldg(reinterpret_cast<const u16*>(blk + 208)));
    const int ls = 4 * (u >> 1), hs = 2 * u;
#pragma unroll
    for (int i = 0; i < 8; ++i) ch.w[i] = ((lo[i] >> ls) & 0x0F0F0F0Fu) | (((hi[i] >> hs) & 0x03030303u) << 4);
    ch.d = d * (float)(i8)(sc & 0xffu);
    ch.d2 = d * (float)(i8)(sc >> 8);
    (void)nb;
    (void)b;
#else
    const int bsz = WTYPE == Q8_0 ? 34 : 18;
    const u16* bp = reinterpret_cast<const u16*>(wq + ((u64)row * nb + b) * bsz);
    ch.d = h2f(__ldg(bp));
#pragma unroll
    for (int i = 0; i < CWORDS; ++i) ch.w[i] = (u32)__ldg(bp + 1 + 2 * i) | ((u32)__ldg(bp + 2 + 2 * i) << 16);
#endif
    return ch;
}

#if ALGO == 0
#if W16
// sum_i w_i * x_i over the chunk's 8 values (exact f32 conversions).
DEVI float chunk_dot(const Chunk& ch, const float* __restrict__ xr, int e) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float4 xv = XLD4(xr + XPOS(e) + 4 * i);
        const u32 a = ch.w[2 * i], b = ch.w[2 * i + 1];
#if WTYPE == F16
        s = fmaf(h2f((u16)(a & 0xffffu)), xv.x, s);
        s = fmaf(h2f((u16)(a >> 16)), xv.y, s);
        s = fmaf(h2f((u16)(b & 0xffffu)), xv.z, s);
        s = fmaf(h2f((u16)(b >> 16)), xv.w, s);
#else
        s = fmaf(__int_as_float((int)(a << 16)), xv.x, s);
        s = fmaf(__int_as_float((int)(a & 0xffff0000u)), xv.y, s);
        s = fmaf(__int_as_float((int)(b << 16)), xv.z, s);
        s = fmaf(__int_as_float((int)(b & 0xffff0000u)), xv.w, s);
#endif
    }
    return s;
}
#elif KQ
// sum_i w_i * x_i over the group, each w_i the exact dequantized weight:
// fma(q, d*sc, -dmin*m) (Q4_K / Q5_K: d*sc*q is exact, so the fma rounds
// once, as ggml's multiply-subtract does) or (d*scale) * (q - 32) (Q6_K).
DEVI float chunk_dot(const Chunk& ch, const float* __restrict__ xr, int e) {
#if WTYPE == Q4_K
    const u32* h = nullptr;
#else
    const u32* h = ch.h;
#endif
    float s = 0.f;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        const float4 xl = XLD4(xr + XPOS(e) + 4 * t);
        const float4 xh = XLD4(xr + XPOS(e) + 16 + 4 * t);
        const u32 lo = kq_lo(ch.w[t], h, t), hi = kq_hi(ch.w[t], h, t);
        const float xls[4] = {xl.x, xl.y, xl.z, xl.w};
        const float xhs[4] = {xh.x, xh.y, xh.z, xh.w};
#pragma unroll
        for (int b = 0; b < 4; ++b) {
#if WTYPE == Q6_K
            s = fmaf(ch.d * kq_f6(lo, b), xls[b], s);
            s = fmaf(ch.d2 * kq_f6(hi, b), xhs[b], s);
#else
            s = fmaf(fmaf(kq_f(lo, b), ch.d, -ch.d2), xls[b], s);
            s = fmaf(fmaf(kq_f(hi, b), ch.d, -ch.d2), xhs[b], s);
#endif
        }
    }
    return s;
}

#elif WTYPE == Q6_K
// sum_i w_i * x_i over the chunk: the two 16-element scale groups summed
// apart, then scaled.
DEVI float chunk_dot(const Chunk& ch, const float* __restrict__ xr, int e) {
    float s[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < CWORDS; ++i) {
        const float4 xv = XLD4(xr + XPOS(e) + 4 * i);
        const u32 w = ch.w[i];
        s[i / 4] = fmaf(q6f(w, 0), xv.x, s[i / 4]);
        s[i / 4] = fmaf(q6f(w, 1), xv.y, s[i / 4]);
        s[i / 4] = fmaf(q6f(w, 2), xv.z, s[i / 4]);
        s[i / 4] = fmaf(q6f(w, 3), xv.w, s[i / 4]);
    }
    return ch.d * s[0] + ch.d2 * s[1];
}
#else
// Byte b of w as a float minus `off`, without I2F: PRMT builds 0x4B0000bb
// = 2^23 + byte and one FADD removes 2^23 + off, exactly. I2F runs at a
// quarter of FADD's rate, and at HBM speed a decode GEMV converts about a
// value per byte read, so the conversion, not the stream, bound the FMA
// path; the values (and so every sum) are the same as (float) casts give.
DEVI float byte_f(u32 w, int b, float off) {
    return __int_as_float((int)__byte_perm(w, 0x4B000000u, 0x7440u | (u32)b)) - (8388608.0f + off);
}

// sum_i w_i * x_i over the chunk, x at element offset e of one token row.
DEVI float chunk_dot(const Chunk& ch, const float* __restrict__ xr, int e) {
    float s = 0.f;
#if WTYPE == Q8_0
#pragma unroll
    for (int i = 0; i < CWORDS; ++i) {
        const float4 xv = XLD4(xr + XPOS(e) + 4 * i);
        // Each int8 q as the unsigned byte q + 128 (the sign bit flipped).
        const u32 w = ch.w[i] ^ 0x80808080u;
        s = fmaf(byte_f(w, 0, 128.0f), xv.x, s);
        s = fmaf(byte_f(w, 1, 128.0f), xv.y, s);
        s = fmaf(byte_f(w, 2, 128.0f), xv.z, s);
        s = fmaf(byte_f(w, 3, 128.0f), xv.w, s);
    }
#else
#pragma unroll
    for (int i = 0; i < CWORDS; ++i) {
        const float4 xl = XLD4(xr + XPOS(e) + 4 * i);
        const float4 xh = XLD4(xr + XPOS(e) + 16 + 4 * i);
        // Byte j of the word holds element j (low nibble) and j + 16 (high).
        const u32 lo = ch.w[i] & 0x0F0F0F0Fu, hi = (ch.w[i] >> 4) & 0x0F0F0F0Fu;
        s = fmaf(byte_f(lo, 0, 8.0f), xl.x, s);
        s = fmaf(byte_f(lo, 1, 8.0f), xl.y, s);
        s = fmaf(byte_f(lo, 2, 8.0f), xl.z, s);
        s = fmaf(byte_f(lo, 3, 8.0f), xl.w, s);
        s = fmaf(byte_f(hi, 0, 8.0f), xh.x, s);
        s = fmaf(byte_f(hi, 1, 8.0f), xh.y, s);
        s = fmaf(byte_f(hi, 2, 8.0f), xh.z, s);
        s = fmaf(byte_f(hi, 3, 8.0f), xh.w, s);
    }
#endif
    return ch.d * s;
}
#endif
#elif ALGO == 2 || ALGO == 3
// One 32-element group of one token's activations is an XSplit record
// (q8_split.cuh): x_i ~ d1 * q1_i + d2 * q2_i.

// Groups of split_rows in flight per warp: their loads are issued before
// any of their math, so a warp waits for L2 once per GEMV_SPLIT_BATCH
// groups (an includer may set its own before including this file).
#ifndef GEMV_SPLIT_BATCH
#define GEMV_SPLIT_BATCH 8
#endif

// Writes the split of x[nt][k] (k a multiple of 32) into out[nt * k/32]:
// a warp per group, a lane per element, the groups strided over the
// block's warps, by q8_split.cuh's rule (the same records split_write4
// writes four values per lane).
// __reduce_*_sync (sm_80+) take the max of |v| (non-negative floats order
// as their bits) and the integer sums in one instruction each.
DEVI void split_rows(const float* __restrict__ x, XSplit* out, int nt, int k) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    const int groups = nt * (k / 32);
    for (int g0 = warp; g0 < groups; g0 += nw * GEMV_SPLIT_BATCH) {
        float v[GEMV_SPLIT_BATCH];
#pragma unroll
        for (int b = 0; b < GEMV_SPLIT_BATCH; ++b) {
            const int g = g0 + b * nw;
            v[b] = g < groups ? __ldg(x + (u64)g * 32 + lane) : 0.0f;
        }
#pragma unroll
        for (int b = 0; b < GEMV_SPLIT_BATCH; ++b) {
            const int g = g0 + b * nw;  // the same on every lane of the warp
            if (g >= groups) break;
            const float a1 = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(fabsf(v[b]))));
            const float d1 = __fdiv_rn(a1, 127.0f);
            const int q1 = d1 != 0.0f ? __float2int_rn(v[b] * __frcp_rn(d1)) : 0;
            const float r = fmaf(-d1, (float)q1, v[b]);
            const float a2 = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(fabsf(r))));
            const float d2 = __fdiv_rn(a2, 127.0f);
            const int q2 = d2 != 0.0f ? __float2int_rn(r * __frcp_rn(d2)) : 0;
            const int s1 = __reduce_add_sync(0xffffffffu, q1);
            const int s2 = __reduce_add_sync(0xffffffffu, q2);
            XSplit& o = out[g];
            reinterpret_cast<i8*>(o.q1)[lane] = (i8)q1;
            reinterpret_cast<i8*>(o.q2)[lane] = (i8)q2;
            if (lane == 0) {
                o.d1 = d1;
                o.d2 = d2;
                o.s1 = s1;
                o.s2 = s2;
            }
        }
    }
}

#if KQ
// The chunk's (one k-quant group's) dot with one token's split group a:
// sum_i x_i w_i with x_i = d1 q1_i + d2 q2_i, two integer dots per word.
// Q4_K / Q5_K: d*sc * (d1 dot1 + d2 dot2) - dmin*m * (d1 s1 + d2 s2);
// Q6_K: per 16-element half, d*scale * (d1 dot1 + d2 dot2) over q - 32.
DEVI float chunk_dot_split(const Chunk& ch, const XSplit& a) {
#if WTYPE == Q4_K
    const u32* h = nullptr;
#else
    const u32* h = ch.h;
#endif
    const int4 a1l = a.q1[0], a1h = a.q1[1], a2l = a.q2[0], a2h = a.q2[1];
    const int x1l[4] = {a1l.x, a1l.y, a1l.z, a1l.w}, x1h[4] = {a1h.x, a1h.y, a1h.z, a1h.w};
    const int x2l[4] = {a2l.x, a2l.y, a2l.z, a2l.w}, x2h[4] = {a2h.x, a2h.y, a2h.z, a2h.w};
#if WTYPE == Q6_K
    int l1 = 0, l2 = 0, h1 = 0, h2 = 0;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        const int lo = (int)kq_s6(kq_lo(ch.w[t], h, t)), hi = (int)kq_s6(kq_hi(ch.w[t], h, t));
        l1 = dp4a(lo, x1l[t], l1);
        l2 = dp4a(lo, x2l[t], l2);
        h1 = dp4a(hi, x1h[t], h1);
        h2 = dp4a(hi, x2h[t], h2);
    }
    return fmaf(ch.d, fmaf(a.d1, (float)l1, a.d2 * (float)l2), ch.d2 * fmaf(a.d1, (float)h1, a.d2 * (float)h2));
#else
    int dot1 = 0, dot2 = 0;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        const int lo = (int)kq_lo(ch.w[t], h, t), hi = (int)kq_hi(ch.w[t], h, t);
        dot1 = dp4a(lo, x1l[t], dot1);
        dot1 = dp4a(hi, x1h[t], dot1);
        dot2 = dp4a(lo, x2l[t], dot2);
        dot2 = dp4a(hi, x2h[t], dot2);
    }
    const float sx = fmaf(a.d1, (float)a.s1, a.d2 * (float)a.s2);
    return fmaf(ch.d, fmaf(a.d1, (float)dot1, a.d2 * (float)dot2), -ch.d2 * sx);
#endif
}
#elif WTYPE == Q8_0 || WTYPE == Q4_0
// A Q8_0 or Q4_0 chunk's dot with one token's split group a, `at` the
// chunk's first element inside the group (16 for the second 16-element
// chunk of a Q8_0 plane row, else 0): d * (d1 dot1 + d2 dot2). Q4_0's
// nibbles pair elements j (low) and j + 16 (high); its offset 8 comes off
// through the exact sums, dot - 8 s, as in the Q8_1 form.
DEVI float chunk_dot_split(const Chunk& ch, const XSplit& a, int at) {
    int dot1 = 0, dot2 = 0;
#if WTYPE == Q8_0
#pragma unroll
    for (int i = 0; i < CWORDS; i += 4) {
        const int4 x1 = a.q1[at / 16 + i / 4], x2 = a.q2[at / 16 + i / 4];
        const int v1[4] = {x1.x, x1.y, x1.z, x1.w}, v2[4] = {x2.x, x2.y, x2.z, x2.w};
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            dot1 = dp4a((int)ch.w[i + t], v1[t], dot1);
            dot2 = dp4a((int)ch.w[i + t], v2[t], dot2);
        }
    }
#else
    (void)at;
    const int4 a1l = a.q1[0], a1h = a.q1[1], a2l = a.q2[0], a2h = a.q2[1];
    const int x1l[4] = {a1l.x, a1l.y, a1l.z, a1l.w}, x1h[4] = {a1h.x, a1h.y, a1h.z, a1h.w};
    const int x2l[4] = {a2l.x, a2l.y, a2l.z, a2l.w}, x2h[4] = {a2h.x, a2h.y, a2h.z, a2h.w};
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        const int lo = (int)(ch.w[t] & 0x0F0F0F0Fu), hi = (int)((ch.w[t] >> 4) & 0x0F0F0F0Fu);
        dot1 = dp4a(lo, x1l[t], dot1);
        dot1 = dp4a(hi, x1h[t], dot1);
        dot2 = dp4a(lo, x2l[t], dot2);
        dot2 = dp4a(hi, x2h[t], dot2);
    }
    dot1 -= 8 * a.s1;
    dot2 -= 8 * a.s2;
#endif
    return ch.d * fmaf(a.d1, (float)dot1, a.d2 * (float)dot2);
}

#if ALGO == 3 && LAYOUT == 1 && WTYPE == Q8_0
// The half of a producer's record that a Q8_0 plane chunk (16 elements,
// half a group) reads: the quants of elements 16h .. 16h + 15 of both
// planes, moved to the front (q1[0], q2[0]), with the scales and sums.
// Three 16-byte loads where split_load takes five; chunk_dot_split then
// reads it at offset 0.
DEVI XSplit split_load_half(const XSplit* __restrict__ p, int h) {
    const int4* w = reinterpret_cast<const int4*>(p);
    XSplit s;
    s.q1[0] = __ldg(w + h);
    s.q2[0] = __ldg(w + 2 + h);
    s.q1[1] = make_int4(0, 0, 0, 0);
    s.q2[1] = make_int4(0, 0, 0, 0);
    const float4 t = __ldg(reinterpret_cast<const float4*>(w + 4));
    s.d1 = t.x;
    s.d2 = t.y;
    s.s1 = __float_as_int(t.z);
    s.s2 = __float_as_int(t.w);
    return s;
}
#endif
#endif
#else
// Integer dot of the chunk with the Q8_1 activations of one token, scaled.
DEVI float chunk_dot_q8(const Chunk& ch, const i8* __restrict__ xqr, const float2* __restrict__ xdsr, int e) {
    const float2 ds = Q8LD(float2, xdsr + e / 32);
#if KQ
    // The group is one Q8_1 block: elements 0..15 pair with the low
    // nibble words, 16..31 with the high ones.
#if WTYPE == Q4_K
    const u32* h = nullptr;
#else
    const u32* h = ch.h;
#endif
    const int4 al = Q8LD(int4, xqr + e);
    const int4 ah = Q8LD(int4, xqr + e + 16);
    const int as_lo[4] = {al.x, al.y, al.z, al.w};
    const int as_hi[4] = {ah.x, ah.y, ah.z, ah.w};
#if WTYPE == Q6_K
    // Two 16-element scale groups: dot (q - 32) * a per group.
    int d0 = 0, d1 = 0;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        d0 = dp4a((int)kq_s6(kq_lo(ch.w[t], h, t)), as_lo[t], d0);
        d1 = dp4a((int)kq_s6(kq_hi(ch.w[t], h, t)), as_hi[t], d1);
    }
    return ds.x * fmaf(ch.d, (float)d0, ch.d2 * (float)d1);
#else
    // sum_i a_i (d*sc q_i - dmin*m) = d*sc * dot - dmin*m * sum_i a_i, the
    // sum exact in ds.y.
    int dot = 0;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        dot = dp4a((int)kq_lo(ch.w[t], h, t), as_lo[t], dot);
        dot = dp4a((int)kq_hi(ch.w[t], h, t), as_hi[t], dot);
    }
    return ds.x * fmaf(ch.d, (float)dot, -ch.d2 * ds.y);
#endif
#else
    int dot = 0;
#if WTYPE == Q8_0
#pragma unroll
    for (int i = 0; i < CWORDS; i += 4) {
        const int4 a = Q8LD(int4, xqr + e + 4 * i);
        dot = dp4a((int)ch.w[i + 0], a.x, dot);
        dot = dp4a((int)ch.w[i + 1], a.y, dot);
        dot = dp4a((int)ch.w[i + 2], a.z, dot);
        dot = dp4a((int)ch.w[i + 3], a.w, dot);
    }
#else
    const int4 al = Q8LD(int4, xqr + e);
    const int4 ah = Q8LD(int4, xqr + e + 16);
    dot = dp4a((int)(ch.w[0] & 0x0F0F0F0Fu), al.x, dot);
    dot = dp4a((int)(ch.w[1] & 0x0F0F0F0Fu), al.y, dot);
    dot = dp4a((int)(ch.w[2] & 0x0F0F0F0Fu), al.z, dot);
    dot = dp4a((int)(ch.w[3] & 0x0F0F0F0Fu), al.w, dot);
    dot = dp4a((int)((ch.w[0] >> 4) & 0x0F0F0F0Fu), ah.x, dot);
    dot = dp4a((int)((ch.w[1] >> 4) & 0x0F0F0F0Fu), ah.y, dot);
    dot = dp4a((int)((ch.w[2] >> 4) & 0x0F0F0F0Fu), ah.z, dot);
    dot = dp4a((int)((ch.w[3] >> 4) & 0x0F0F0F0Fu), ah.w, dot);
    // sum_j (q_j - 8) a_j = sum_j q_j a_j - 8 sum_j a_j; ds.y is the exact sum.
    dot -= 8 * (int)ds.y;
#endif
    return (float)dot * (ch.d * ds.x);
#endif
}
#endif
