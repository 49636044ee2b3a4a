// common.cuh: helpers shared by every kernel family.
//
// Header-free by contract: NVRTC compiles these sources with no include path,
// so there is no cuda_fp16.h / cuda_bf16.h / <cstdint> here. Half-precision
// conversions, tensor-core MMA, ldmatrix and cp.async are inline PTX; integer
// types are our own aliases. Every helper is `static __device__ __forceinline__`.
//
// Defines: (none; this header requires no macros)

#pragma once

typedef signed char        i8;
typedef unsigned char      u8;
typedef unsigned short     u16;
typedef int                i32;
typedef unsigned int       u32;
typedef long long          i64;
typedef unsigned long long u64;

#define DEVI static __device__ __forceinline__

// +infinity as a float (no <cmath> / math_constants.h: header-free).
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

// Weight-type ids compared against the WTYPE define (passed as a bare token:
// -DWTYPE=Q8_0 makes `WTYPE == Q8_0` a constant expression).
#define Q8_0 8
#define Q4_0 2
#define Q6_K 14

// ---- half / bfloat16 conversions (bit patterns held in u16 / u32) ----------
DEVI float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
// Packs (lo, hi) into one f16x2 word, lo in the low half, round to nearest even.
DEVI u32 pack_f16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
DEVI u32 pack_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
DEVI u32 hsub2(u32 a, u32 b) {
    u32 r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
DEVI u32 hmul2(u32 a, u32 b) {
    u32 r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

// int -> float without I2F: exact for |c| < 2^22 (one IADD + one FADD).
DEVI float i2f_magic(int c) {
    return __int_as_float(c + 0x4B400000) - 12582912.0f;
}

// ---- integer dot products --------------------------------------------------
// Asks for the line holding p to be brought into L2 (no register, no wait).
DEVI void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

DEVI int dp4a(int a, int b, int c) {
    int d;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// Q4_0 nibbles (0..15 in each byte) -> signed int8 (q - 8) in each byte,
// without carries between bytes: (b + 0x78) ^ 0x80 == b - 8 for b in 0..15.
DEVI u32 q4_lo_s8(u32 v) { return ((v & 0x0F0F0F0Fu) + 0x78787878u) ^ 0x80808080u; }
DEVI u32 q4_hi_s8(u32 v) { return (((v >> 4) & 0x0F0F0F0Fu) + 0x78787878u) ^ 0x80808080u; }

// ---- programmatic dependent launch (PDL, sm_90) ------------------------------
// A kernel launched as a programmatic dependent (Gpu::launch_dependent) may
// start before the grid ahead of it on the stream has finished: it must call
// pdl_await_prior before it reads anything that grid wrote, or writes
// anything that grid reads. pdl_release_dependents lets the next programmatic
// dependent be scheduled while this grid still runs. Both are no-ops below
// sm_90 and in a kernel launched plainly, so every kernel may call them.
DEVI void pdl_release_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
DEVI void pdl_await_prior() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// The prologue of every kernel without a protocol of its own: the engine
// chains a decode step's launches (profile key `decode_launch`), each a
// programmatic dependent of the one before, so a kernel must wait before it
// touches memory; and since a grid's completion stands for its
// predecessors' only if it waited for them, the wait comes before any early
// return. Releasing right after the wait lets the next launch's CTAs become
// resident (and start what does not depend on this grid) while this grid
// runs. Work before the wait may touch only what no earlier grid of the
// step writes (the weights: the split-activation GEMV's first L2
// prefetches, the GEMV's first chunks under PRELOAD=1; the cache's older
// keys: the decode attention's copies).
DEVI void pdl_enter() {
    pdl_await_prior();
    pdl_release_dependents();
}

// ---- shared memory addressing, cp.async, ldmatrix, mma ---------------------
DEVI u32 smem_addr(const void* p) {
    u32 r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}
// 16-byte async copy; src_bytes = 0 zero-fills the destination (out-of-range tiles).
DEVI void cp_async16(u32 dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
DEVI void cp_async8(u32 dst, const void* src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
DEVI void cp_async4(u32 dst, const void* src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
DEVI void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> DEVI void cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }

DEVI void ldmatrix_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
// The transposed form: thread (g, t) of each 8x8 matrix gets the elements
// (2t, g) and (2t + 1, g), i.e. B fragments of mma.sync from a row-major
// [k][n] tile.
DEVI void ldmatrix_x4_trans(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
DEVI void ldmatrix_x2(u32 addr, u32& r0, u32& r1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];"
                 : "=r"(r0), "=r"(r1) : "r"(addr));
}

// D = A(16x32 s8, row) * B(32x8 s8, col) with a zero accumulator.
// The MMA wrappers are not volatile: they touch no memory, and leaving them
// free lets the compiler interleave fragment loads with tensor-core work.
DEVI void mma_s8_16832(int (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}
// D += A(16x16 f16, row) * B(16x8 f16, col), fp32 accumulators.
DEVI void mma_f16_16816(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
DEVI void mma_bf16_16816(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- loads -----------------------------------------------------------------
// 16-byte read-only load that does not allocate in L1 (streamed weights).
DEVI uint4 ld_stream16(const void* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// ---- reductions ------------------------------------------------------------
DEVI float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// gelu with the tanh approximation, as in the oracle: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
DEVI float gelu_tanh(float x) {
    const float c = 0.7978845608028654f;
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

// Byte permute: result byte i = byte sel_i of the 8-byte value {b:a}.
DEVI u32 prmt(u32 a, u32 b, u32 sel) {
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}

// ---- weight dequantization into MMA operand words --------------------------
// 4 unsigned bytes u = q + bias (q the signed quant) -> the 4 values q * d,
// packed as two f16x2 / bf16x2 words (bytes 0,1 -> lo; bytes 2,3 -> hi).
// f16: (0x6400 | u) is 1024 + u exactly; subtracting 1024 + bias (bias_h2,
// both halves) leaves q exactly, and one packed multiply rounds q*d once.
// bf16: (0x4B000000 | u) as f32 is 2^23 + u; subtracting 2^23 + bias
// (bias_f) is exact, q*d is exact in f32 (8 x 11 significant bits), and
// cvt.rn rounds it once.
DEVI void dq4_f16(u32 u, float d, u32 bias_h2, u32& lo, u32& hi) {
    const u32 d2 = pack_f16x2(d, d);
    lo = hmul2(hsub2(prmt(u, 0x64646464u, 0x4140u), bias_h2), d2);
    hi = hmul2(hsub2(prmt(u, 0x64646464u, 0x4342u), bias_h2), d2);
}
DEVI void dq4_bf16(u32 u, float d, float bias_f, u32& lo, u32& hi) {
    const float f0 = __int_as_float(prmt(u, 0x4B000000u, 0x7540u)) - bias_f;
    const float f1 = __int_as_float(prmt(u, 0x4B000000u, 0x7541u)) - bias_f;
    const float f2 = __int_as_float(prmt(u, 0x4B000000u, 0x7542u)) - bias_f;
    const float f3 = __int_as_float(prmt(u, 0x4B000000u, 0x7543u)) - bias_f;
    lo = pack_bf16x2(f0 * d, f1 * d);
    hi = pack_bf16x2(f2 * d, f3 * d);
}

// Row stride (bytes) for a shared-memory tile whose rows hold `b` bytes
// (a multiple of 16): an odd number of 16-byte units, so the 8 row addresses
// of one ldmatrix phase (or 8 rows of 4-byte reads) fall in distinct banks.
#define PAD16(b) ((((b) / 16) % 2 == 0) ? (b) + 16 : (b))

// Shared memory one SM offers to resident blocks, in bytes, for the arch being
// compiled (sm_90: 228 KB, sm_80/87: 164 KB, else 100 KB), less the 1 KB the
// runtime reserves per block (counted by OCC_BLOCKS).
#if __CUDA_ARCH__ >= 900
#define SMEM_PER_SM (228 * 1024)
#elif __CUDA_ARCH__ == 800 || __CUDA_ARCH__ == 870
#define SMEM_PER_SM (164 * 1024)
#else
#define SMEM_PER_SM (100 * 1024)
#endif
// Blocks per SM to ask the register allocator for (__launch_bounds__'s second
// argument): as many as shared memory allows, but never a register budget
// below `acc` accumulators + 64 per thread, so tiles with few accumulators
// are held to the budget that lets a second (third...) block co-reside
// instead of losing it to a few extra registers, while large tiles keep the
// registers they need.
#define OCC_BLOCKS(threads, smem, acc)                                           \
    ((SMEM_PER_SM / ((smem) + 1024)) < (65536 / ((threads) * ((acc) + 64)))      \
         ? ((SMEM_PER_SM / ((smem) + 1024)) > 1 ? (SMEM_PER_SM / ((smem) + 1024)) : 1) \
         : ((65536 / ((threads) * ((acc) + 64))) > 1 ? (65536 / ((threads) * ((acc) + 64))) : 1))
