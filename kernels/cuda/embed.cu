// embed.cu: the token embedding gather, out[r] = dequant(table[tokens[r]]) *
// scale, with the table on the device in its GGUF type (LAYOUT=0,
// gather.cuh) or, for Q6_K, as the lossless plane repack the k-quant GEMV
// reads (LAYOUT=1), so that a tied head and the gather can share one copy.
//
// LAYOUT=1 (Q6_K only): `table` is the nibble plane [vocab][width/2] and
//   `side` the GEMV side records [vocab][width/256] of KQ6_REC bytes
//   (kquant.cuh: 16 high-bit words, the 16 int8 scales at 64, d at 80).
//   Element e of 32-element group g: nibble byte 16g + (e & 15), low nibble
//   for e < 16, high for e >= 16; its top two bits at bits 8b + 2t of high
//   word 2(g & 7) + (e >> 4) of its super-block's record (t = (e & 15) / 4,
//   b = e & 3); scale byte 64 + 2(g & 7) + (e >> 4). Value (d * scale) *
//   (q - 32), the same f32 operations as ggml's dequantization.
//
// ALGO=0: grid (ceil(width / THREADS), rows); one element per thread.
// ALGO=1: grid (1, ceil(rows / ROWS)); a block writes ROWS whole rows in
//   float4 stores, thread t taking the groups of four values t, t + THREADS,
//   ... (a warp's store is 512 contiguous bytes). Each pass loads the raw
//   words of ROWS * UNROLL groups before dequantizing and storing any, so a
//   thread has that many independent gathers in flight. Needs width % 4 == 0
//   and `out` and `table` 16-byte aligned (ld4_at in gather.cuh).
// Contract: bitexact against the CPU dequantization times the f32 scale
// (every value is dequant(q) * scale, two roundings, in that order).
//
// Defines:
//   WTYPE    Q8_0 | Q4_0 | Q6_K | F16 | BF16 | F32: the table's type
//   LAYOUT   0: GGUF rows (`side` unused); 1: the Q6_K plane repack
//   THREADS  threads per block, a multiple of 32, at most 1024
//   ALGO     0: one element per thread; 1: rows per block, float4 groups
//   UNROLL   groups of four values a thread loads per row per pass (ALGO=1)
//   ROWS     rows per block (ALGO=1)

#ifndef WTYPE
#error "embed.cu needs WTYPE"
#endif
#ifndef THREADS
#error "embed.cu needs THREADS"
#endif
#ifndef ALGO
#error "embed.cu needs ALGO"
#endif
#ifndef UNROLL
#error "embed.cu needs UNROLL"
#endif
#ifndef ROWS
#error "embed.cu needs ROWS"
#endif
#ifndef LAYOUT
#error "embed.cu needs LAYOUT"
#endif

#include "common.cuh"
#include "gather.cuh"

#if LAYOUT == 1
#if WTYPE != Q6_K
#error "LAYOUT=1 (the plane repack) reads Q6_K tables"
#endif

// The plane layout and its decode are the k-quant GEMV's (kquant.cuh).
#include "kquant.cuh"

// The raw words of four values c .. c+3 (c % 4 == 0) of one row: its
// nibble word, high-bit word, scale byte and d.
struct RawQ6 {
    u32 nib, high, sc, d;
};

DEVI RawQ6 q6p_ld4(const u8* nib_row, const u8* rec_row, int c) {
    const int g = c >> 5, e = c & 31, j = g & 7, half = e >> 4;
    const u8* rec = rec_row + (u64)(c >> 8) * KQ6_REC;
    RawQ6 r;
    r.nib = __ldg(reinterpret_cast<const u32*>(nib_row + 16 * g + (e & 15)));
    r.high = __ldg(reinterpret_cast<const u32*>(rec + 8 * j + 4 * half));
    r.sc = rec[64 + 2 * j + half];
    r.d = __ldg(reinterpret_cast<const u16*>(rec + 80));
    return r;
}

DEVI float4 q6p_deq4(const RawQ6& r, int c) {
    const int e = c & 31, t = (e & 15) >> 2;
    const float ds = h2f((u16)r.d) * (float)(i8)r.sc;
    // Only the half's high word was loaded: kq_lo reads h[0], kq_hi h[1].
    const u32 h[2] = {r.high, r.high};
    const u32 q = (e >> 4) ? kq_hi(r.nib, h, t) : kq_lo(r.nib, h, t);
    return make_float4(ds * kq_f6(q, 0), ds * kq_f6(q, 1), ds * kq_f6(q, 2), ds * kq_f6(q, 3));
}

DEVI float q6p_at(const u8* nib_row, const u8* rec_row, int c) {
    const float4 v = q6p_deq4(q6p_ld4(nib_row, rec_row, c & ~3), c & ~3);
    const int b = c & 3;
    return b == 0 ? v.x : b == 1 ? v.y : b == 2 ? v.z : v.w;
}
#elif LAYOUT != 0
#error "LAYOUT must be 0 or 1"
#endif

#if ALGO == 0

extern "C" __global__ void __launch_bounds__(THREADS)
embed(const int* __restrict__ tokens, const u8* __restrict__ table, const u8* __restrict__ side,
      float* __restrict__ out, int rows, int width, float scale) {
    pdl_enter();
    const int r = blockIdx.y;
    const int c = blockIdx.x * THREADS + threadIdx.x;
    if (r >= rows || c >= width) return;
#if LAYOUT == 1
    const u64 tok = (u64)tokens[r];
    const float v = q6p_at(table + tok * (width / 2), side + tok * (width / 256) * KQ6_REC, c);
#else
    (void)side;
    const float v = deq_at(table + (u64)tokens[r] * row_bytes(width), c);
#endif
    out[(u64)r * width + c] = v * scale;
}

#elif ALGO == 1

extern "C" __global__ void __launch_bounds__(THREADS)
embed(const int* __restrict__ tokens, const u8* __restrict__ table, const u8* __restrict__ side,
      float* __restrict__ out, int rows, int width, float scale) {
    pdl_enter();
    const int groups = width / 4;
    const int r0 = blockIdx.y * ROWS;
    // Rows and groups past the end load the last one again (a valid
    // address, no branch among the loads) and store nothing.
    const u8* src[ROWS];
#if LAYOUT == 1
    const u8* rec[ROWS];
#pragma unroll
    for (int k = 0; k < ROWS; ++k) {
        const u64 tok = (u64)__ldg(tokens + min(r0 + k, rows - 1));
        src[k] = table + tok * (width / 2);
        rec[k] = side + tok * (width / 256) * KQ6_REC;
    }
#else
    (void)side;
    const u64 rb = row_bytes(width);
#pragma unroll
    for (int k = 0; k < ROWS; ++k) src[k] = table + (u64)__ldg(tokens + min(r0 + k, rows - 1)) * rb;
#endif
    for (int g0 = threadIdx.x; g0 < groups; g0 += THREADS * UNROLL) {
#if LAYOUT == 1
        RawQ6 raw[ROWS][UNROLL];
#else
        Raw4 raw[ROWS][UNROLL];
#endif
#pragma unroll
        for (int k = 0; k < ROWS; ++k) {
#pragma unroll
            for (int j = 0; j < UNROLL; ++j) {
                const int g = min(g0 + j * THREADS, groups - 1);
#if LAYOUT == 1
                raw[k][j] = q6p_ld4(src[k], rec[k], 4 * g);
#else
                raw[k][j] = ld4_at(src[k], 4 * g);
#endif
            }
        }
#pragma unroll
        for (int k = 0; k < ROWS; ++k) {
#pragma unroll
            for (int j = 0; j < UNROLL; ++j) {
                const int g = g0 + j * THREADS;
                if (g < groups && r0 + k < rows) {
#if LAYOUT == 1
                    const float4 a = q6p_deq4(raw[k][j], 4 * g);
#else
                    const float4 a = deq4(raw[k][j], 4 * g);
#endif
                    reinterpret_cast<float4*>(out + (u64)(r0 + k) * width)[g] =
                        make_float4(a.x * scale, a.y * scale, a.z * scale, a.w * scale);
                }
            }
        }
    }
}

#else
#error "ALGO must be 0 or 1"
#endif
