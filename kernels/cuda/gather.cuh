// gather.cuh: dequantizing single elements of a GGUF row of type WTYPE, for
// the gathers of embedding-table rows (embed.cu, ple.cu).
//
// deq_at(row, c) returns element c of the row whose bytes start at `row`,
// with the same f32 operations as the CPU dequantization
// (kernels/src/quant/blocks.rs), so a gather is bit-exact:
//   Q8_0: q * d;  Q4_0: (nibble - 8) * d;  Q6_K: (d * scale) * q;
//   F16 / BF16: the exact f32 value;  F32: as stored.
// Byte reads only: GGUF blocks (34, 18, 210 bytes) are not word aligned.
//
// Defines: (none of its own; uses the includer's WTYPE)

#pragma once

#define F32 0
#define F16 1
#define BF16 30
#if WTYPE != Q8_0 && WTYPE != Q4_0 && WTYPE != Q6_K && WTYPE != F16 && WTYPE != BF16 && WTYPE != F32
#error "WTYPE must be Q8_0, Q4_0, Q6_K, F16, BF16 or F32"
#endif

DEVI u16 rd16(const u8* p) { return (u16)p[0] | ((u16)p[1] << 8); }

// Bytes of one row of n elements.
DEVI u64 row_bytes(int n) {
#if WTYPE == Q8_0
    return (u64)(n / 32) * 34;
#elif WTYPE == Q4_0
    return (u64)(n / 32) * 18;
#elif WTYPE == Q6_K
    return (u64)(n / 256) * 210;
#elif WTYPE == F32
    return (u64)n * 4;
#else
    return (u64)n * 2;
#endif
}

DEVI float deq_at(const u8* row, int c) {
#if WTYPE == Q8_0
    const u8* b = row + (u64)(c / 32) * 34;
    return (float)(i8)b[2 + c % 32] * h2f(rd16(b));
#elif WTYPE == Q4_0
    const u8* b = row + (u64)(c / 32) * 18;
    const int j = c % 32;
    const int q = j < 16 ? (b[2 + j] & 0x0f) : (b[2 + j - 16] >> 4);
    return (float)(q - 8) * h2f(rd16(b));
#elif WTYPE == Q6_K
    const u8* b = row + (u64)(c / 256) * 210;
    const int e = c % 256;
    const int h = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
    const u8 lo = b[64 * h + l + (quarter & 1) * 32];
    const u8 hi = b[128 + 32 * h + l];
    const int q = ((quarter < 2 ? (lo & 0x0f) : (lo >> 4)) | (((hi >> (2 * quarter)) & 3) << 4)) - 32;
    const float ds = h2f(rd16(b + 208)) * (float)(i8)b[192 + e / 16];
    return ds * (float)q;
#elif WTYPE == F16
    return h2f(rd16(row + (u64)c * 2));
#elif WTYPE == BF16
    return __uint_as_float((u32)rd16(row + (u64)c * 2) << 16);
#else
    return reinterpret_cast<const float*>(row)[c];
#endif
}
