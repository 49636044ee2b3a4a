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
// Grid: 1-D, one thread per group; grid.x = ceil(groups / THREADS).
// src and dst are the starts of whole planes (16-byte aligned).
// Contract: bitexact against quant::repack (the GEMM side words and f32
// scales that `MatmulBinding::device_weights` builds on the CPU).
//
// Defines:
//   WTYPE    Q8_0 | Q4_0 | Q4_K | Q5_K | Q6_K
//   THREADS  threads per block, a multiple of 32, at most 1024

#ifndef WTYPE
#error "scale_expand.cu needs WTYPE"
#endif
#ifndef THREADS
#error "scale_expand.cu needs THREADS"
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

extern "C" __global__ void __launch_bounds__(THREADS)
scale_expand(const u8* __restrict__ src, u32* __restrict__ dst, u64 groups) {
    const u64 g = (u64)blockIdx.x * THREADS + threadIdx.x;
    if (g >= groups) return;
#if WTYPE == Q8_0 || WTYPE == Q4_0
    const u16 h = reinterpret_cast<const u16*>(src)[g];
    dst[g] = __float_as_uint(h2f(h));
#else
    const u8* rec = src + (g / 8) * REC;
    const int j = (int)(g % 8);
#if WTYPE == Q6_K
    const uint2 hw = reinterpret_cast<const uint2*>(rec)[j];
    const u32 sw = reinterpret_cast<const u32*>(rec + 64)[j / 2];
    const float d = h2f(*reinterpret_cast<const u16*>(rec + 80));
    const int s0 = (int)(signed char)((sw >> (16 * (j % 2))) & 0xffu);
    const int s1 = (int)(signed char)((sw >> (16 * (j % 2) + 8)) & 0xffu);
    uint4 o;
    o.x = __float_as_uint(__fmul_rn(d, (float)s0));
    o.y = __float_as_uint(__fmul_rn(d, (float)s1));
    o.z = hw.x;
    o.w = hw.y;
    reinterpret_cast<uint4*>(dst)[g] = o;
#else
    const uint4 hd = *reinterpret_cast<const uint4*>(rec);
    u32 sc, m;
    kq_scale_min(hd, j, sc, m);
    const float ds = __fmul_rn(h2f((u16)(hd.x & 0xffffu)), (float)sc);
    const float ms = __fmul_rn(h2f((u16)(hd.x >> 16)), (float)m);
#if WTYPE == Q4_K
    reinterpret_cast<uint2*>(dst)[g] = make_uint2(__float_as_uint(ds), __float_as_uint(ms));
#else
    const u32 hw = reinterpret_cast<const u32*>(rec + 16)[j];
    reinterpret_cast<uint4*>(dst)[g] = make_uint4(__float_as_uint(ds), __float_as_uint(ms), hw, 0u);
#endif
#endif
#endif
}
