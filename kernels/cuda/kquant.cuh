// kquant.cuh: the k-quant plane repacks (Q4_K, Q5_K, Q6_K) and 16-bit
// weights (F16, BF16) as the matmul kernels read them: type ids, the
// nibble / high-bit recombination and the 6-bit scale decode, shared by the
// decode GEMV (gemv.cu) and the prefill GEMMs (dq_ktypes.cuh).
//
// Planes (kernels/src/quant/repack.rs, docs/calling-convention.md):
//   - nibble plane, 16 bytes per 32-element group g: byte j holds the low 4
//     bits of q(32g + j) (low nibble) and of q(32g + 16 + j) (high nibble);
//     nibble word t (bytes 4t..4t+3) covers elements 4t..4t+3 and
//     16+4t..16+4t+3.
//   - high bits in byte-lane order: Q5_K one word per group, bit 8b + t the
//     5th bit of element 4t + b and bit 8b + 4 + t of element 16 + 4t + b;
//     Q6_K two words, word h bits 8b + 2t.. 8b + 2t + 1 the top two bits of
//     element 16h + 4t + b. kq_lo / kq_hi below put them next to the
//     nibbles of word t, one unsigned quant per byte.
//   - GEMV side records per 256-element super-block: Q4_K 16 bytes (d, dmin,
//     the 12 packed scale/min bytes), Q5_K 48 (the same, then the 8 high
//     words), Q6_K KQ6_REC = 88 (16 high words, 16 i8 scales at 64, d f16
//     at 80, zeros to 88: 8-byte aligned high-word pairs).
//   - GEMM side words per group: Q4_K (d*sc, dmin*m), Q5_K (d*sc, dmin*m,
//     high word, zero), Q6_K (d*scale[2g], d*scale[2g+1], two high words).
// Values: Q4_K / Q5_K fma(q, d*sc, -dmin*m), Q6_K (d*scale) * (q - 32); with
// d*sc exact in f32 both equal ggml's dequantization bit for bit.
//
// Defines: (none of its own; uses the includer's WTYPE)

#pragma once

// ggml type ids (the WTYPE define is the bare macro name). F16 and BF16
// carry the values gather.cuh and dq_convert.cuh give them.
#define Q4_K 12
#define Q5_K 13
#define F16 1
#define BF16 30

// Bytes of a Q6_K GEMV side record (quant::repack::gemv_side_bytes).
#define KQ6_REC 88

#define IS_KQUANT(t) ((t) == Q4_K || (t) == Q5_K || (t) == Q6_K)
#define IS_W16(t) ((t) == F16 || (t) == BF16)

// Unsigned quants of nibble word w (t = 0..3 within its group) with the
// group's high-bit words h: kq_lo gives elements 4t..4t+3, kq_hi elements
// 16+4t..16+4t+3, one quant per byte.
DEVI u32 kq_lo(u32 w, const u32* h, int t) {
    u32 q = w & 0x0F0F0F0Fu;
#if WTYPE == Q5_K
    q |= ((h[0] >> t) & 0x01010101u) << 4;
#elif WTYPE == Q6_K
    q |= ((h[0] >> (2 * t)) & 0x03030303u) << 4;
#else
    (void)h;
    (void)t;
#endif
    return q;
}
DEVI u32 kq_hi(u32 w, const u32* h, int t) {
    u32 q = (w >> 4) & 0x0F0F0F0Fu;
#if WTYPE == Q5_K
    q |= ((h[0] >> (4 + t)) & 0x01010101u) << 4;
#elif WTYPE == Q6_K
    q |= ((h[1] >> (2 * t)) & 0x03030303u) << 4;
#else
    (void)h;
    (void)t;
#endif
    return q;
}

// Byte b (an unsigned quant, 0..63) of w as a float, without I2F: PRMT
// builds 0x4B0000qq = 2^23 + q and one FADD removes the bias (exact).
// kq_f gives q, kq_f6 gives q - 32 (Q6_K's value).
DEVI float kq_f(u32 w, int b) {
    return __int_as_float((int)__byte_perm(w, 0x4B000000u, 0x7440u | (u32)b)) - 8388608.0f;
}
DEVI float kq_f6(u32 w, int b) {
    return __int_as_float((int)__byte_perm(w, 0x4B000000u, 0x7440u | (u32)b)) - 8388640.0f;
}

// Q6_K's unsigned 6-bit quants (0..63 per byte) to signed q - 32 per byte
// (two's complement int8, for dp4a): flipping bit 5 gives q - 32 for
// q >= 32 and q + 32 for q < 32, where bits 6 and 7 must then be set.
DEVI u32 kq_s6(u32 q) {
    return (q ^ 0x20202020u) | ((~q & 0x20202020u) * 6u);
}

// Scale and min (6 bits each) of group j (0..7) from the 16-byte Q4_K /
// Q5_K header words hd (x: d | dmin << 16, y..w: the 12 packed bytes),
// the rule of ggml's get_scale_min_k4. j varies across the lanes of a
// warp, so both forms are computed and one is selected.
DEVI void kq_scale_min(uint4 hd, int j, u32& sc, u32& m) {
    const u32 s = 8u * (u32)(j & 3);
    const u32 a = (hd.y >> s) & 0xffu;  // scales byte j & 3
    const u32 b = (hd.z >> s) & 0xffu;  // scales byte 4 + (j & 3)
    const u32 c = (hd.w >> s) & 0xffu;  // scales byte 8 + (j & 3)
    const u32 sc_lo = a & 63u, m_lo = b & 63u;
    const u32 sc_hi = (c & 0x0fu) | ((a >> 6) << 4);
    const u32 m_hi = (c >> 4) | ((b >> 6) << 4);
    sc = j < 4 ? sc_lo : sc_hi;
    m = j < 4 ? m_lo : m_hi;
}
