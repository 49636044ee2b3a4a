// gemv.cu: decode matmul for 1..8 tokens with Q8_0 / Q4_0 / Q4_K / Q5_K /
// Q6_K / F16 / BF16 weights.
//
// Computes y[t][r] = sum_k x[t][k] * W[r][k] for t < NT (NT = 1..8, one entry
// per count: gemv_n1 .. gemv_n8), r < n, with W dequantized as ggml does:
// d * q (Q8_0, Q4_0 with q - 8), (d * sc) * q - dmin * m (Q4_K, Q5_K),
// (d * scale) * (q - 32) (Q6_K), the value itself (F16, BF16). With FUSE=1
// there are two matrices (gate G, up U) and y[t][r] = gelu_tanh(G x) * (U x)
// (the Gemma FFN input half).
//
// Weights, per LAYOUT:
//   0: GGUF blocks, row-major [n][k/32] blocks of 34 (Q8_0) / 18 (Q4_0) bytes,
//      read with 2-byte loads (the blocks are only 2-byte aligned); wd unused.
//      Q6_K (the tied LM head as Gemma 4 Q4_0 files store it): row-major
//      [n][k/256] super-blocks of 210 bytes (ql[128] low nibbles, qh[64]
//      2-bit high parts, scales[16] int8, d f16), read as they are in the
//      file; ALGO 0 and FUSE 0 only. A 32-element chunk j of a
//      super-block (half h = j/4, quarter u = j%4) is 32 contiguous ql bytes
//      at 64h + 32(u&1) (nibble u/2), 32 contiguous qh bytes at 128 + 32h
//      (bits 2u..2u+1) and the two scales at 192 + 2j: each 32-byte run is
//      9 aligned 4-byte loads and funnel shifts (super-blocks sit at 2 mod 4
//      every other one), so `wq` must be 4-byte aligned (device allocations
//      are). The words reach at most 2 bytes before a run (inside the
//      buffer) and 4 bytes past it (inside the super-block).
//   1: planes repacked on the host: quants wq[n][k] (Q8_0, int8) or
//      wq[n][k/2] (Q4_0, each 16-byte group = one block in GGUF nibble order:
//      byte j holds element j in the low and j+16 in the high nibble), and
//      f16 scales wd[n][k/32]; quants are read with 16-byte loads.
//      The k-quants (kquant.cuh, kernels/src/quant/repack.rs): wq is the
//      nibble plane [n][k/2] (Q4_0's order per 32-element group) and wd the
//      GEMV side records [n][k/256] (Q4_K 16, Q5_K 48, Q6_K 96 bytes: d,
//      dmin and the packed 6-bit scales and mins, or the i8 scales and d,
//      and the high-bit words); a lane's chunk is one group: a 16-byte
//      nibble load plus the record's header (the 8 lanes of a super-block
//      read the same bytes in one request) and its high-bit word(s).
//   F16 / BF16 (LAYOUT 0 or 1, the same bytes): wq[n][k] as stored, wd
//      unused, 16-byte loads of 8 values; k must be a multiple of 8.
// Activations, per ALGO:
//   0: f32 x[NT][k]; weights dequantized exactly (the f32 value ggml's
//      dequantization gives) and multiplied with fp32 FMA.
//   1: Q8_1 planes from quantize_q8_1: xq[NT][k] int8 and xds[NT][k/32] =
//      (d, sum of q); 4-way int8 dot products with dp4a, one scale multiply
//      per (half-)block; the k-quants' mins fold in through the Q8_1 sums
//      (d_x * (d*sc * dot - dmin*m * sum)). Not for F16 / BF16 or Q6_K on
//      GGUF blocks.
// Output y[NT][n] f32, every element written exactly once.
//
// Grid: 1-D, grid.x = ceil(n / ((WARPS/KSPLIT)*ROWS)), block = WARPS*32
// threads. The warps form WARPS/KSPLIT row groups of KSPLIT warps; a group
// owns ROWS consecutive rows and its warps split k: warp s of the group
// walks 16-byte chunks (LAYOUT 1, Q8_0: 16 elements; F16/BF16: 8 elements;
// otherwise one 32-element block or group, or 32 elements of a Q6_K
// super-block) s*32+lane, stepping 32*KSPLIT, UNROLL chunks' loads issued
// before their math.
// Shuffles reduce each warp; with KSPLIT > 1 the group's partial sums meet
// in shared memory.
// Contract: ALGO 0: fp (reassociated f32 sums of exactly dequantized
// weights; Q6_K's d * scale and (q - 32) are exact in f32, and on GGUF
// blocks the kernel sums x * (q - 32) per 16-element scale group before the
// d * scale multiply). ALGO 1: approx against the f64 oracle (Q8_1
// activation noise) and tight against the CPU replay of the Q8_1
// activations.
//
// Defines:
//   WTYPE   weight type: Q8_0 | Q4_0 | Q4_K | Q5_K | Q6_K | F16 | BF16
//   ALGO    0 = dequant + fp32 FMA on f32 activations, 1 = dp4a on Q8_1 activations
//   LAYOUT  0 = GGUF blocks (2-byte loads), 1 = aligned planes (16-byte loads)
//   ROWS    rows per warp (1..8)
//   WARPS   warps per block (1..32)
//   FUSE    0 = plain, 1 = gate+up with gelu_tanh(gate) * up
//   KSPLIT  warps sharing one row group (split over k): 1, 2, 4, 8; divides WARPS
//   UNROLL  chunks per lane whose loads are in flight together: 1, 2, 4

#ifndef WTYPE
#error "gemv.cu needs WTYPE"
#endif
#ifndef ALGO
#error "gemv.cu needs ALGO"
#endif
#ifndef LAYOUT
#error "gemv.cu needs LAYOUT"
#endif
#ifndef ROWS
#error "gemv.cu needs ROWS"
#endif
#ifndef WARPS
#error "gemv.cu needs WARPS"
#endif
#ifndef FUSE
#error "gemv.cu needs FUSE"
#endif
#ifndef KSPLIT
#error "gemv.cu needs KSPLIT"
#endif
#ifndef UNROLL
#error "gemv.cu needs UNROLL"
#endif
#if WARPS % KSPLIT != 0
#error "KSPLIT must divide WARPS"
#endif

#include "common.cuh"
#include "kquant.cuh"

#if WTYPE != Q8_0 && WTYPE != Q4_0 && !IS_KQUANT(WTYPE) && !IS_W16(WTYPE)
#error "WTYPE must be Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, F16 or BF16"
#endif
#if WTYPE == Q6_K && LAYOUT == 0 && (ALGO != 0 || FUSE != 0)
#error "Q6_K GGUF super-blocks (LAYOUT=0) need ALGO=0 and FUSE=0"
#endif
#if (WTYPE == Q4_K || WTYPE == Q5_K) && LAYOUT != 1
#error "Q4_K / Q5_K weights are read as planes (LAYOUT=1)"
#endif
#if IS_W16(WTYPE) && ALGO != 0
#error "F16 / BF16 weights need ALGO=0"
#endif

// KQ: a k-quant read from its planes (nibbles + side records).
#define KQ (IS_KQUANT(WTYPE) && LAYOUT == 1)
#define W16 IS_W16(WTYPE)
#if WTYPE == Q5_K
#define HWORDS 1
#else
#define HWORDS 2
#endif

#define NMAT (FUSE ? 2 : 1)
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
    const u8* rec = side + sb * 96;
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
        const float4 xv = __ldg(reinterpret_cast<const float4*>(xr + e + 4 * i));
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
        const float4 xl = __ldg(reinterpret_cast<const float4*>(xr + e + 4 * t));
        const float4 xh = __ldg(reinterpret_cast<const float4*>(xr + e + 16 + 4 * t));
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

// The same weights four at a time for a segment chosen at run time: seg
// (0..7) is elements 4*seg .. 4*seg+3 of the low half (seg < 4) or
// 16 + 4*(seg-4) .. of the high half. The word is selected, not indexed,
// so the chunk stays in registers.
DEVI void kq_weights4(const Chunk& ch, int seg, float (&wv)[4]) {
#if WTYPE == Q4_K
    const u32* h = nullptr;
#else
    const u32* h = ch.h;
#endif
    const int t = seg & 3;
    const u32 w = t == 0 ? ch.w[0] : t == 1 ? ch.w[1] : t == 2 ? ch.w[2] : ch.w[3];
    const u32 q = seg < 4 ? kq_lo(w, h, t) : kq_hi(w, h, t);
#if WTYPE == Q6_K
    const float d = seg < 4 ? ch.d : ch.d2;
#endif
#pragma unroll
    for (int b = 0; b < 4; ++b) {
#if WTYPE == Q6_K
        wv[b] = d * kq_f6(q, b);
#else
        wv[b] = fmaf(kq_f(q, b), ch.d, -ch.d2);
#endif
    }
}

// acc[m][r][t] += the group's dot with each of NT (5..8) tokens. With the
// token-major order of chunk_dot the compiler hoists all NT x 8 activation
// loads of a group (one group's activations per token) next to the k-quant
// chunk state (second scale, high-bit words) and spills under newer NVRTC
// releases. Here a loop unrolled twice walks the eight segments: per
// iteration eight weights per row and two 16-byte activation loads per
// token are live.
template <int NT>
DEVI void kq_group_fma(const Chunk (&ch)[NMAT][ROWS], const float* __restrict__ x, int k, int e,
                       float (&acc)[NMAT][ROWS][NT]) {
#pragma unroll 2
    for (int seg = 0; seg < 8; ++seg) {
        float wv[NMAT][ROWS][4];
#pragma unroll
        for (int m = 0; m < NMAT; ++m)
#pragma unroll
            for (int r = 0; r < ROWS; ++r) kq_weights4(ch[m][r], seg, wv[m][r]);
        const int off = e + (seg >> 2) * 16 + (seg & 3) * 4;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const float4 xv = __ldg(reinterpret_cast<const float4*>(x + (u64)t * k + off));
#pragma unroll
            for (int m = 0; m < NMAT; ++m)
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    float a = acc[m][r][t];
                    a = fmaf(wv[m][r][0], xv.x, a);
                    a = fmaf(wv[m][r][1], xv.y, a);
                    a = fmaf(wv[m][r][2], xv.z, a);
                    a = fmaf(wv[m][r][3], xv.w, a);
                    acc[m][r][t] = a;
                }
        }
    }
}
#elif WTYPE == Q6_K
// sum_i w_i * x_i over the chunk: the two 16-element scale groups summed
// apart, then scaled.
DEVI float chunk_dot(const Chunk& ch, const float* __restrict__ xr, int e) {
    float s[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < CWORDS; ++i) {
        const float4 xv = __ldg(reinterpret_cast<const float4*>(xr + e + 4 * i));
        const u32 w = ch.w[i];
        s[i / 4] = fmaf(q6f(w, 0), xv.x, s[i / 4]);
        s[i / 4] = fmaf(q6f(w, 1), xv.y, s[i / 4]);
        s[i / 4] = fmaf(q6f(w, 2), xv.z, s[i / 4]);
        s[i / 4] = fmaf(q6f(w, 3), xv.w, s[i / 4]);
    }
    return ch.d * s[0] + ch.d2 * s[1];
}
#else
// sum_i w_i * x_i over the chunk, x at element offset e of one token row.
DEVI float chunk_dot(const Chunk& ch, const float* __restrict__ xr, int e) {
    float s = 0.f;
#if WTYPE == Q8_0
#pragma unroll
    for (int i = 0; i < CWORDS; ++i) {
        const float4 xv = __ldg(reinterpret_cast<const float4*>(xr + e + 4 * i));
        const u32 w = ch.w[i];
        s = fmaf((float)(i8)(w & 0xff), xv.x, s);
        s = fmaf((float)(i8)((w >> 8) & 0xff), xv.y, s);
        s = fmaf((float)(i8)((w >> 16) & 0xff), xv.z, s);
        s = fmaf((float)(i8)(w >> 24), xv.w, s);
    }
#else
#pragma unroll
    for (int i = 0; i < CWORDS; ++i) {
        const float4 xl = __ldg(reinterpret_cast<const float4*>(xr + e + 4 * i));
        const float4 xh = __ldg(reinterpret_cast<const float4*>(xr + e + 16 + 4 * i));
        const u32 w = ch.w[i];
        s = fmaf((float)((int)(w & 0xf) - 8), xl.x, s);
        s = fmaf((float)((int)((w >> 8) & 0xf) - 8), xl.y, s);
        s = fmaf((float)((int)((w >> 16) & 0xf) - 8), xl.z, s);
        s = fmaf((float)((int)((w >> 24) & 0xf) - 8), xl.w, s);
        s = fmaf((float)((int)((w >> 4) & 0xf) - 8), xh.x, s);
        s = fmaf((float)((int)((w >> 12) & 0xf) - 8), xh.y, s);
        s = fmaf((float)((int)((w >> 20) & 0xf) - 8), xh.z, s);
        s = fmaf((float)((int)((w >> 28) & 0xf) - 8), xh.w, s);
    }
#endif
    return ch.d * s;
}
#endif
#else
// Integer dot of the chunk with the Q8_1 activations of one token, scaled.
DEVI float chunk_dot_q8(const Chunk& ch, const i8* __restrict__ xqr, const float2* __restrict__ xdsr, int e) {
    const float2 ds = __ldg(xdsr + e / 32);
#if KQ
    // The group is one Q8_1 block: elements 0..15 pair with the low
    // nibble words, 16..31 with the high ones.
#if WTYPE == Q4_K
    const u32* h = nullptr;
#else
    const u32* h = ch.h;
#endif
    const int4 al = __ldg(reinterpret_cast<const int4*>(xqr + e));
    const int4 ah = __ldg(reinterpret_cast<const int4*>(xqr + e + 16));
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
        const int4 a = __ldg(reinterpret_cast<const int4*>(xqr + e + 4 * i));
        dot = dp4a((int)ch.w[i + 0], a.x, dot);
        dot = dp4a((int)ch.w[i + 1], a.y, dot);
        dot = dp4a((int)ch.w[i + 2], a.z, dot);
        dot = dp4a((int)ch.w[i + 3], a.w, dot);
    }
#else
    const int4 al = __ldg(reinterpret_cast<const int4*>(xqr + e));
    const int4 ah = __ldg(reinterpret_cast<const int4*>(xqr + e + 16));
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

template <int NT>
DEVI void gemv_body(const u8* __restrict__ wq, const u16* __restrict__ wd,
                    const u8* __restrict__ wq2, const u16* __restrict__ wd2,
                    const float* __restrict__ x, const i8* __restrict__ xq, const float2* __restrict__ xds,
                    float* __restrict__ y, int n, int k) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int group = warp / KSPLIT, slice = warp % KSPLIT;
    const int row0 = (blockIdx.x * (WARPS / KSPLIT) + group) * ROWS;
    // Groups past the end still reach the barrier below (KSPLIT > 1).
    const bool active = row0 < n;
    float acc[NMAT][ROWS][NT];
#pragma unroll
    for (int m = 0; m < NMAT; ++m)
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
            for (int t = 0; t < NT; ++t) acc[m][r][t] = 0.f;
    const int nchunks = active ? k / CHUNK : 0;
    const int step = 32 * KSPLIT;
    for (int c0 = slice * 32 + lane; c0 < nchunks; c0 += step * UNROLL) {
        Chunk ch[UNROLL][NMAT][ROWS];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            // Chunks past the end re-read chunk c0; their math is skipped.
            const int c = c0 + u * step < nchunks ? c0 + u * step : c0;
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                // Rows past the end re-read the last row; their sums are dropped.
                const int row = min(row0 + r, n - 1);
                ch[u][0][r] = load_chunk(wq, wd, row, c, k);
#if FUSE
                ch[u][1][r] = load_chunk(wq2, wd2, row, c, k);
#endif
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int c = c0 + u * step;
            if (c < nchunks) {
                const int e = c * CHUNK;
#if ALGO == 0 && KQ
                if constexpr (NT > 4) {
                    kq_group_fma<NT>(ch[u], x, k, e, acc);
                    continue;
                }
#endif
#pragma unroll
                for (int t = 0; t < NT; ++t) {
#pragma unroll
                    for (int m = 0; m < NMAT; ++m)
#pragma unroll
                        for (int r = 0; r < ROWS; ++r) {
#if ALGO == 0
                            acc[m][r][t] += chunk_dot(ch[u][m][r], x + (u64)t * k, e);
#else
                            acc[m][r][t] += chunk_dot_q8(ch[u][m][r], xq + (u64)t * k, xds + (u64)t * (k / 32), e);
#endif
                        }
                }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < NMAT; ++m)
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
            for (int t = 0; t < NT; ++t) acc[m][r][t] = warp_sum(acc[m][r][t]);
#if KSPLIT > 1
    __shared__ float red[WARPS][NMAT * ROWS * NT];
    if (lane == 0) {
#pragma unroll
        for (int m = 0; m < NMAT; ++m)
#pragma unroll
            for (int r = 0; r < ROWS; ++r)
#pragma unroll
                for (int t = 0; t < NT; ++t) red[warp][(m * ROWS + r) * NT + t] = acc[m][r][t];
    }
    __syncthreads();
    if (slice != 0) return;
    if (lane == 0) {
#pragma unroll
        for (int s = 1; s < KSPLIT; ++s)
#pragma unroll
            for (int m = 0; m < NMAT; ++m)
#pragma unroll
                for (int r = 0; r < ROWS; ++r)
#pragma unroll
                    for (int t = 0; t < NT; ++t) acc[m][r][t] += red[warp + s][(m * ROWS + r) * NT + t];
    }
#endif
    if (lane == 0 && active) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            if (row0 + r < n) {
#pragma unroll
                for (int t = 0; t < NT; ++t) {
#if FUSE
                    y[(u64)t * n + row0 + r] = gelu_tanh(acc[0][r][t]) * acc[1][r][t];
#else
                    y[(u64)t * n + row0 + r] = acc[0][r][t];
#endif
                }
            }
        }
    }
}

#define GEMV_ENTRY(NT)                                                                          \
    extern "C" __global__ void __launch_bounds__(WARPS * 32, 1) gemv_n##NT(                     \
        const u8* wq, const u16* wd, const u8* wq2, const u16* wd2, const float* x,            \
        const i8* xq, const float2* xds, float* y, int n, int k) {                              \
        gemv_body<NT>(wq, wd, wq2, wd2, x, xq, xds, y, n, k);                                   \
    }
GEMV_ENTRY(1)
GEMV_ENTRY(2)
GEMV_ENTRY(3)
GEMV_ENTRY(4)
GEMV_ENTRY(5)
GEMV_ENTRY(6)
GEMV_ENTRY(7)
GEMV_ENTRY(8)
