// gather.cuh: dequantizing single elements of a GGUF row of type WTYPE, for
// the gathers of embedding-table rows (embed.cu, ple.cu).
//
// deq_at(row, c) returns element c of the row whose bytes start at `row`,
// with the same f32 operations as the CPU dequantization
// (kernels/src/quant/blocks.rs), so a gather is bit-exact:
//   Q8_0: q * d;  Q4_0: (nibble - 8) * d;  Q6_K: (d * scale) * q;
//   F16 / BF16: the exact f32 value;  F32: as stored.
// deq_at reads bytes only: GGUF blocks (34, 18, 210 bytes) are not word
// aligned. ld4_at(row, c) then deq4 return elements c .. c+3 (c % 4 == 0)
// with the same operations, through the widest aligned loads: 16-bit words for the
// quantized types (every GGUF block size is even, so with a 2-byte-aligned
// table every block and every even offset in it is 2-byte aligned), 8 bytes
// for F16/BF16 and 16 for F32 (row starts stay that aligned when the
// table is 16-byte aligned and the width a multiple of 4).
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

// A 2-byte-aligned little-endian u16, and two of them as one u32 (byte i
// of the result is p[i]).
DEVI u32 ld16(const u8* p) { return (u32)__ldg(reinterpret_cast<const u16*>(p)); }
DEVI u32 ld16x2(const u8* p) { return ld16(p) | (ld16(p + 2) << 16); }

// Byte i of w as an int: signed (Q8_0 quants) or unsigned.
DEVI int sbyte(u32 w, int i) { return (int)(i8)(w >> (8 * i)); }
DEVI int ubyte(u32 w, int i) { return (int)((w >> (8 * i)) & 0xffu); }

// The raw words of four values, loaded by ld4_at and dequantized by deq4
// with the element index c they were loaded at: split so that a thread can
// have many gathers in flight while holding only their raw bits.
//   Q8_0: w0 = quants, w1 = d;  Q4_0: w0 = the 4 bytes holding the nibbles,
//   w1 = d;  Q6_K: w0 = low-bit bytes, w1 = high-bit bytes, w2 = d | scale << 16;
//   F16 / BF16: the four halves;  F32: the four floats' bits.
#if WTYPE == Q6_K
#define RAW4_WORDS 3
#elif WTYPE == F32
#define RAW4_WORDS 4
#else
#define RAW4_WORDS 2
#endif
struct Raw4 {
    u32 w[RAW4_WORDS];
};

DEVI Raw4 ld4_at(const u8* row, int c) {
    Raw4 r;
#if WTYPE == Q8_0
    const u8* b = row + (u64)(c / 32) * 34;
    r.w[0] = ld16x2(b + 2 + c % 32);
    r.w[1] = ld16(b);
#elif WTYPE == Q4_0
    const u8* b = row + (u64)(c / 32) * 18;
    r.w[0] = ld16x2(b + 2 + (c % 16));
    r.w[1] = ld16(b);
#elif WTYPE == Q6_K
    const u8* b = row + (u64)(c / 256) * 210;
    const int e = c % 256;
    const int h = e / 128, l = e % 32, quarter = (e % 128) / 32;
    r.w[0] = ld16x2(b + 64 * h + l + (quarter & 1) * 32);
    r.w[1] = ld16x2(b + 128 + 32 * h + l);
    r.w[2] = ld16(b + 208) | ((u32)__ldg(b + 192 + e / 16) << 16);
#elif WTYPE == F16 || WTYPE == BF16
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(row + (u64)c * 2));
    r.w[0] = v.x;
    r.w[1] = v.y;
#else
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(row + (u64)c * 4));
    r.w[0] = v.x;
    r.w[1] = v.y;
    r.w[2] = v.z;
    r.w[3] = v.w;
#endif
    return r;
}

DEVI float4 deq4(const Raw4& r, int c) {
#if WTYPE == Q8_0
    const float d = h2f((u16)r.w[1]);
    const u32 q = r.w[0];
    return make_float4((float)sbyte(q, 0) * d, (float)sbyte(q, 1) * d, (float)sbyte(q, 2) * d,
                       (float)sbyte(q, 3) * d);
#elif WTYPE == Q4_0
    const float d = h2f((u16)r.w[1]);
    const u32 q = (c % 32 < 16 ? r.w[0] : r.w[0] >> 4) & 0x0f0f0f0fu;
    return make_float4((float)(ubyte(q, 0) - 8) * d, (float)(ubyte(q, 1) - 8) * d,
                       (float)(ubyte(q, 2) - 8) * d, (float)(ubyte(q, 3) - 8) * d);
#elif WTYPE == Q6_K
    const int quarter = (c % 128) / 32;
    const u32 q = ((quarter < 2 ? r.w[0] : r.w[0] >> 4) & 0x0f0f0f0fu) |
                  (((r.w[1] >> (2 * quarter)) & 0x03030303u) << 4);
    const float ds = h2f((u16)r.w[2]) * (float)(i8)(r.w[2] >> 16);
    return make_float4(ds * (float)(ubyte(q, 0) - 32), ds * (float)(ubyte(q, 1) - 32),
                       ds * (float)(ubyte(q, 2) - 32), ds * (float)(ubyte(q, 3) - 32));
#elif WTYPE == F16
    return make_float4(h2f((u16)r.w[0]), h2f((u16)(r.w[0] >> 16)), h2f((u16)r.w[1]),
                       h2f((u16)(r.w[1] >> 16)));
#elif WTYPE == BF16
    return make_float4(__uint_as_float(r.w[0] << 16), __uint_as_float(r.w[0] & 0xffff0000u),
                       __uint_as_float(r.w[1] << 16), __uint_as_float(r.w[1] & 0xffff0000u));
#else
    return make_float4(__uint_as_float(r.w[0]), __uint_as_float(r.w[1]), __uint_as_float(r.w[2]),
                       __uint_as_float(r.w[3]));
#endif
}
