// attn_operand.cuh: the operand type of the tensor-core attention kernels
// (attn_core.cuh, attn_stream.cuh, attn_wgmma.cuh). Q, K, V and P enter the
// MMAs in the cache type KV_TYPE (f16 or bf16; f32 caches are the scalar
// kernel's): packing two f32 into one operand word, rounding one f32 to the
// operand type, reading the two values of a word back, and mma.sync
// m16n8k16 with f32 accumulation in that type. The family sources include
// it ahead of their ALGO branches (the source table inlines a file once,
// whatever branch names it first); the kernels that use it refuse other
// cache types themselves.
//
// Defines: (none of its own; uses the includer's KV_TYPE)

#pragma once

#define F16 1
#define BF16 2
#define F32 3

// (lo, hi) as one operand word, lo in the low half, round to nearest even.
DEVI u32 op_pack(float lo, float hi) {
#if KV_TYPE == F16
    return pack_f16x2(lo, hi);
#else
    return pack_bf16x2(lo, hi);
#endif
}
// The low and high operand-type values of a packed word, as f32.
DEVI float op_lo(u32 w) {
#if KV_TYPE == F16
    return h2f((u16)(w & 0xffffu));
#else
    return __uint_as_float(w << 16);
#endif
}
DEVI float op_hi(u32 w) {
#if KV_TYPE == F16
    return h2f((u16)(w >> 16));
#else
    return __uint_as_float(w & 0xffff0000u);
#endif
}
// v rounded to the operand type, as f32.
DEVI float op_round(float v) { return op_lo(op_pack(v, 0.0f)); }
DEVI void op_mma(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
#if KV_TYPE == F16
    mma_f16_16816(d, a, b0, b1);
#else
    mma_bf16_16816(d, a, b0, b1);
#endif
}
