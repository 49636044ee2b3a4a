// dq_ktypes.cuh: the k-quant (Q4_K, Q5_K, Q6_K) and 16-bit (F16, BF16)
// weights of the prefill GEMMs (gemm_dq.cu, gemm_wgmma.cu): the stage tile
// of the side words and the dequantization of a thread's four consecutive
// weights of one k16 step into two MMA operand words.
//
// Weights (kernels/src/quant/repack.rs, docs/calling-convention.md):
//   - k-quants: wq is the nibble plane [n][k/2] (Q4_0's order per 32-element
//     group, so the quant tile copy is Q4_0's) and wd the GEMM side words
//     [n][k/32][KQ_W] (Q4_K: d*sc, dmin*m; Q5_K: the same and the high-bit
//     word, padded to 4 words; Q6_K: d*scale[2j], d*scale[2j+1], two high
//     words), staged per row as [BK/32][KQ_W] words;
//   - F16 / BF16: wq is [n][k] 16-bit values as stored, wd unused.
// Values: fma(q, d*sc, -dmin*m) (Q4_K, Q5_K) or (d*scale) * (q - 32) (Q6_K),
// the exact f32 values of ggml's dequantization (d*sc*q is exact), rounded
// once to the operand type; 16-bit weights converted when the operand type
// differs (exact for F16 -> f32 -> F16, one rounding otherwise).
//
// The includer defines WTYPE and DQ_TYPE (both checked by it) and includes
// common.cuh, stage_copy.cuh, kquant.cuh and dq_convert.cuh first.
//
// Defines: (none of its own; uses the includer's WTYPE and DQ_TYPE)

#pragma once

// 32-bit side words per 32-element group (quant::repack::gemm_side_words:
// Q5_K's three are padded to four, so a group's words are one 16-byte unit).
#if WTYPE == Q4_K
#define KQ_W 2
#elif WTYPE == Q5_K || WTYPE == Q6_K
#define KQ_W 4
#else
#define KQ_W 0
#endif

// Registers the Q5_K / Q6_K dequantization needs beyond the Q8_0 / Q4_0
// path (high-bit words and the group's side words per fragment row), added
// to the accumulator count from which gemm_dq sizes __launch_bounds__'s
// blocks per SM (OCC_BLOCKS, common.cuh): under the two-block budget of a
// 128 x 128 tile (128 registers) they spill.
#if WTYPE == Q5_K || WTYPE == Q6_K
#define DQ_EXTRA_REGS 16
#else
#define DQ_EXTRA_REGS 0
#endif

// Bytes of a thread's four consecutive weights of one k16 step (the B / A
// fragment slots 2t, 2t+1, 2t+8, 2t+9): 4 quants, or 4 16-bit values.
#if IS_W16(WTYPE)
#define DQ_LANE_BYTES 8
#else
#define DQ_LANE_BYTES 4
#endif

// The side words' tile of one stage (stage_copy.cuh's StageTile): Rows
// rows of KTile / 32 groups of KQ_W words, packed ([Rows][KTile/32][KQ_W]
// in shared memory), one chunk per 32-element group: Q4_K's 8 bytes,
// Q5_K's and Q6_K's 16. Groups past the matrix (rows past N, k past K)
// are zero-filled; with K a multiple of 32 no chunk straddles K.
#if KQ_W > 0
template <int KTile, int Rows, int Threads>
using KqSideTile = StageTile<4 * KQ_W, 32, 1, 8 / KQ_W, KTile, Rows, Threads, KTile / 32 * 4 * KQ_W>;
#endif

// Two f32 values to one operand word (lo in the low half), rounded once.
DEVI u32 dq_pack(float lo, float hi) {
#if DQ_TYPE == F16
    return pack_f16x2(lo, hi);
#else
    return pack_bf16x2(lo, hi);
#endif
}

// The operand words (b0: weights 4t, 4t+1; b1: 4t+2, 4t+3 of k16 step `ks`
// of one row) of a k-quant or 16-bit weight. `q` points at this thread's
// bytes of the row's stage (row base + DQ_LANE_BYTES * t), `side` at the
// row's staged side words; t = lane % 4.
DEVI void dq_ktype_words(const u8* q, const float* side, int ks, u32& b0, u32& b1) {
#if IS_W16(WTYPE)
    (void)side;
    const uint2 v = *reinterpret_cast<const uint2*>(q + ks * 32);
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
    // k16 step ks is the low (even ks) or high (odd ks) nibbles of group ks / 2.
    const int t = (int)(threadIdx.x % 4), half = ks % 2;
    const u32 v = *reinterpret_cast<const u32*>(q + (ks / 2) * 16);
    const float* sd = side + (ks / 2) * KQ_W;
    u32 h[2];
#if WTYPE == Q5_K
    h[0] = __float_as_uint(sd[2]);
    h[1] = 0;
#elif WTYPE == Q6_K
    h[0] = __float_as_uint(sd[2]);
    h[1] = __float_as_uint(sd[3]);
#else
    h[0] = h[1] = 0;
#endif
    const u32 qb = half ? kq_hi(v, h, t) : kq_lo(v, h, t);
    float f[4];
#if WTYPE == Q6_K
    const float ds = sd[half];
#pragma unroll
    for (int b = 0; b < 4; ++b) f[b] = ds * kq_f6(qb, b);
#else
    const float ds = sd[0], ms = sd[1];
#pragma unroll
    for (int b = 0; b < 4; ++b) f[b] = fmaf(kq_f(qb, b), ds, -ms);
#endif
    b0 = dq_pack(f[0], f[1]);
    b1 = dq_pack(f[2], f[3]);
#endif
}
