// scale_expand.cu: the prefill GEMMs' scale plane computed from the decode
// GEMV's, so that a matrix keeps one scale plane on the device.
//
// A quantized matrix in the plane layouts (kernels/src/quant/repack.rs,
// docs/calling-convention.md) has one quant plane that every matmul kernel
// reads and a scale plane per kernel kind: the GEMV's compact one (f16
// scales per 32 elements for Q8_0 / Q4_0; for the k-quants one side record
// per 256-element super-block holding the file's own scale bytes) and the
// prefill GEMMs' (f32 scales; for the k-quants the GEMM side words per
// 32-element group: d*sc and dmin*m, or Q6_K's d*scale pairs, beside the
// group's high-bit words). Keeping both resident costs 12-73 % of the
// file's bytes; this kernel writes the GEMMs' plane of one matrix into a
// scratch buffer from the GEMV's, just before the GEMM that reads it.
//
// Computes, for every 32-element group g < groups of the matrix (rows are
// whole super-blocks, so records and groups are numbered across rows):
//   Q8_0 / Q4_0: dst[g] = f32(src_f16[g]);
//   Q4_K: dst[2g..] = (d * sc_j, dmin * m_j) of record g / 8, j = g % 8;
//   Q5_K: dst[4g..] = (d * sc_j, dmin * m_j, high word j, 0);
//   Q6_K: dst[4g..] = (d * scale[2j], d * scale[2j + 1], high words 2j, 2j+1).
// Each product is one f32 multiply of an f16 value by a small integer, so
// it is exact and equals the CPU repack's word bit for bit.
//
// Grid: 1-D. ALGO 0: one thread per group, grid.x = ceil(groups /
// THREADS). ALGO 1: one thread per 8 consecutive groups (a k-quant
// super-block: its record is loaded once and the 8 groups' words leave in
// 16-byte stores; Q8_0 / Q4_0: one 16-byte load of 8 scales, a partial
// last unit group by group), grid.x = ceil(ceil(groups / 8) / THREADS).
// src and dst are the starts of whole planes (16-byte aligned).
// Contract: bitexact against quant::repack (the GEMM side words and f32
// scales that `MatmulBinding::device_weights` builds on the CPU).
//
// Defines:
//   WTYPE    Q8_0 | Q4_0 | Q4_K | Q5_K | Q6_K
//   ALGO     0 (a thread per group) | 1 (a thread per 8 groups)
//   THREADS  threads per block, a multiple of 32, at most 1024

#ifndef WTYPE
#error "scale_expand.cu needs WTYPE"
#endif
#ifndef THREADS
#error "scale_expand.cu needs THREADS"
#endif
#ifndef ALGO
#error "scale_expand.cu needs ALGO"
#endif
#if ALGO != 0 && ALGO != 1
#error "ALGO must be 0 or 1"
#endif

#include "common.cuh"
#include "kquant.cuh"

#if WTYPE != Q8_0 && WTYPE != Q4_0 && !IS_KQUANT(WTYPE)
#error "WTYPE must be Q8_0, Q4_0, Q4_K, Q5_K or Q6_K"
#endif

// Bytes of a GEMV side record (quant::repack::gemv_side_bytes).
#if WTYPE == Q4_K
#define REC 16
#elif WTYPE == Q5_K
#define REC 48
#elif WTYPE == Q6_K
#define REC KQ6_REC
#endif

// The GEMM words of group j (0..7) of the super-block whose GEMV record
// is `rec` (k-quants), as one 16-byte unit (Q5_K, Q6_K) or the first two
// words of it (Q4_K).
#if IS_KQUANT(WTYPE)
DEVI uint4 kq_group_words(const u8* rec, int j) {
#if WTYPE == Q6_K
    const uint2 hw = reinterpret_cast<const uint2*>(rec)[j];
    const u32 sw = reinterpret_cast<const u32*>(rec + 64)[j / 2];
    const float d = h2f(*reinterpret_cast<const u16*>(rec + 80));
    const int s0 = (int)(signed char)((sw >> (16 * (j % 2))) & 0xffu);
    const int s1 = (int)(signed char)((sw >> (16 * (j % 2) + 8)) & 0xffu);
    return make_uint4(__float_as_uint(__fmul_rn(d, (float)s0)),
                      __float_as_uint(__fmul_rn(d, (float)s1)), hw.x, hw.y);
#else
    const uint4 hd = *reinterpret_cast<const uint4*>(rec);
    u32 sc, m;
    kq_scale_min(hd, j, sc, m);
    const float ds = __fmul_rn(h2f((u16)(hd.x & 0xffffu)), (float)sc);
    const float ms = __fmul_rn(h2f((u16)(hd.x >> 16)), (float)m);
#if WTYPE == Q5_K
    const u32 hw = reinterpret_cast<const u32*>(rec + 16)[j];
#else
    const u32 hw = 0u;
#endif
    return make_uint4(__float_as_uint(ds), __float_as_uint(ms), hw, 0u);
#endif
}
#endif

extern "C" __global__ void __launch_bounds__(THREADS)
scale_expand(const u8* __restrict__ src, u32* __restrict__ dst, u64 groups) {
    pdl_enter();
    const u64 t = (u64)blockIdx.x * THREADS + threadIdx.x;
#if ALGO == 0
    const u64 g = t;
    if (g >= groups) return;
#if WTYPE == Q8_0 || WTYPE == Q4_0
    dst[g] = __float_as_uint(h2f(reinterpret_cast<const u16*>(src)[g]));
#else
    const uint4 w = kq_group_words(src + (g / 8) * REC, (int)(g % 8));
#if WTYPE == Q4_K
    reinterpret_cast<uint2*>(dst)[g] = make_uint2(w.x, w.y);
#else
    reinterpret_cast<uint4*>(dst)[g] = w;
#endif
#endif
#else
    const u64 g0 = t * 8;
    if (g0 >= groups) return;
#if WTYPE == Q8_0 || WTYPE == Q4_0
    if (g0 + 8 <= groups) {
        const uint4 h = reinterpret_cast<const uint4*>(src)[t];
        const u32 hw[4] = {h.x, h.y, h.z, h.w};
        u32 f[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            f[2 * i] = __float_as_uint(h2f((u16)(hw[i] & 0xffffu)));
            f[2 * i + 1] = __float_as_uint(h2f((u16)(hw[i] >> 16)));
        }
        uint4* o = reinterpret_cast<uint4*>(dst + g0);
        o[0] = make_uint4(f[0], f[1], f[2], f[3]);
        o[1] = make_uint4(f[4], f[5], f[6], f[7]);
    } else {
        for (u64 g = g0; g < groups; ++g)
            dst[g] = __float_as_uint(h2f(reinterpret_cast<const u16*>(src)[g]));
    }
#else
    // k-quant rows are whole super-blocks, so groups is a multiple of 8.
    const u8* rec = src + t * REC;
#if WTYPE == Q4_K
    uint4* o = reinterpret_cast<uint4*>(dst + g0 * 2);
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
        const uint4 a = kq_group_words(rec, j), b = kq_group_words(rec, j + 1);
        o[j / 2] = make_uint4(a.x, a.y, b.x, b.y);
    }
#else
    uint4* o = reinterpret_cast<uint4*>(dst + g0 * 4);
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = kq_group_words(rec, j);
#endif
#endif
#endif
}
