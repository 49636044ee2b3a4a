// gemm_wgmma.cu: prefill matmul on Hopper's warpgroup MMA (wgmma, sm_90a).
// The quantized weight tile is dequantized in registers straight into the
// wgmma A operand; the activation tile is read by the tensor cores from
// shared memory through a matrix descriptor (128-byte swizzle).
//
// Computes y[m][n] = sum_k h(x[m][k]) * h(d[n][k/32] * q[n][k]), the same
// function and the same operand roundings h (to DQ_TYPE) as gemm_dq, with
// fp32 accumulation in wgmma.mma_async.m64nBMk16.f32.{f16,bf16}. The MMA is
// laid out transposed with respect to y: its M side is 64 output features per
// warpgroup (A = dequantized weights, in registers) and its N side is the BM
// tokens of the tile (B = activations, shared memory, K-major). Weight
// planes (wq, wd) and the activation pre-pass (gemm_dq_convert, whose k order
// inside every group of 16 is permuted) are gemm_dq's: the A fragment layout
// of wgmma is mma.sync's m16n8k16 A layout per warp, so the same permutation
// lets one 32-bit shared load of 4 consecutive quants fill a thread's 4 k
// slots (2t, 2t+1, 2t+8, 2t+9) of a row.
//
// CTA: WG warpgroups, each owning MW blocks of 64 features, so the tile is
// BN = 64 * MW * WG features x BM tokens; grid.x = ceil(m/BM) (token tiles,
// fastest), grid.y = ceil(n/BN), grid.z = KSPLIT contiguous ranges of the
// 64-k tiles. With KSPLIT = 2 the two partial sums are added into y with
// red.global.add.f32 onto the zeros the launch sequence writes first: two
// addends onto an exact zero give the same bits in either order, so the
// result stays deterministic (which is why KSPLIT stops at 2). Split-K
// exists for shapes with few output tiles (ffn_down: n = 2560), where one
// wave of 128 x 256 tiles leaves SMs idle. All threads issue the cp.async copies of a
// STAGES-deep ring of 64-k stages: activations (BM rows x 128 bytes, 16-byte
// chunk c of row r stored at chunk c ^ (r % 8): the 128-byte swizzle the
// descriptor names), weight quants (padded rows, conflict-free 4-byte reads)
// and f32 scales. Out-of-range rows and k are zero-filled.
// Per stage: wait for its copies, fence the generic->async proxy, barrier,
// issue the copy of stage kt + STAGES - 2, dequantize this stage's A
// fragments, then 4 x MW wgmma and commit; wgmma.wait_group 1 keeps one group
// in flight while the next stage is dequantized. The copy target is the stage
// read two groups ago (complete after the previous iteration's wait and this
// iteration's barrier), and the A fragments alternate between two register
// sets, so nothing an in-flight wgmma reads is overwritten.
// Contract: approx against the f64 oracle (operand rounding to DQ_TYPE);
// tight against the CPU replay with the same roundings (fp32 summation only).
// K must be a multiple of 32. Requires sm_90a (compiled with that target).
// Dynamic shared memory: 1024 (alignment slack) + STAGES * STAGE_BYTES, with
// STAGE_BYTES = round_up(BM*128 + BN*PAD16(BKW) + BN*8, 1024) and BKW = 64
// (Q8_0) or 32 (Q4_0).
//
// Defines:
//   WTYPE     weight type: Q8_0 | Q4_0
//   DQ_TYPE   MMA operand type: F16 | BF16
//   BM        tokens per CTA tile = the wgmma N: 64 | 128 | 192 | 256
//   WG        consumer warpgroups per CTA: 1 | 2 | 3
//   MW        64-feature blocks per warpgroup: 1 | 2
//   STAGES    shared-memory pipeline depth: 3..6
//   KSPLIT    k ranges per output tile (grid.z): 1 | 2

#ifndef WTYPE
#error "gemm_wgmma.cu needs WTYPE"
#endif
#ifndef DQ_TYPE
#error "gemm_wgmma.cu needs DQ_TYPE"
#endif
#ifndef BM
#error "gemm_wgmma.cu needs BM"
#endif
#ifndef WG
#error "gemm_wgmma.cu needs WG"
#endif
#ifndef MW
#error "gemm_wgmma.cu needs MW"
#endif
#ifndef STAGES
#error "gemm_wgmma.cu needs STAGES"
#endif
#ifndef KSPLIT
#error "gemm_wgmma.cu needs KSPLIT"
#endif

#include "common.cuh"
#include "dq_convert.cuh"

#if DQ_TYPE == F16
#define WG_T "f16"
#else
#define WG_T "bf16"
#endif
#if BM != 64 && BM != 128 && BM != 192 && BM != 256
#error "BM must be 64, 128, 192 or 256"
#endif
#if KSPLIT != 1 && KSPLIT != 2
#error "KSPLIT must be 1 or 2"
#endif
#if STAGES < 3
#error "STAGES must be at least 3 (one stage is read by the wgmma in flight)"
#endif

#define BK 64
#define THREADS (128 * WG)
#define BN (64 * MW * WG)
#define NACC (BM / 2)
#if WTYPE == Q8_0
#define BKW 64
#else
#define BKW 32
#endif
#define SW PAD16(BKW)
#define X_BYTES (BM * 128)
#define W_BYTES (BN * SW)
#define S_BYTES (BN * 8)
#define STAGE_BYTES (((X_BYTES + W_BYTES + S_BYTES) + 1023) / 1024 * 1024)

// Copy work per stage: chunks per row, rows advanced per pass of all threads,
// passes. Each thread keeps one chunk column, and its rows stay congruent
// mod 8 (row steps are multiples of 8), so its swizzled column is fixed.
#define X_RSTEP (THREADS / 8)
#define X_ITERS (BM / X_RSTEP + (BM % X_RSTEP != 0))
#define W_CPR (BKW / 16)
#define W_RSTEP (THREADS / W_CPR)
#define W_ITERS (BN / W_RSTEP)
#define S_ITERS (2 * BN / THREADS)

// ---- wgmma wrappers ---------------------------------------------------------
DEVI void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
DEVI void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> DEVI void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}
DEVI void red_add_f32(float* p, float v) {
    asm volatile("red.global.add.f32 [%0], %1;" :: "l"(p), "f"(v) : "memory");
}
DEVI void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Shared-memory matrix descriptor: K-major tile whose rows are 128 bytes
// (64 f16/bf16 of k) in the 128-byte swizzle; 8-row groups 1024 bytes apart
// (stride byte offset), leading byte offset unused by this layout (1).
// `addr` is the shared address of the k16 slice's first row: the tile base
// (1024-aligned) plus 32 bytes per k16 step.
DEVI u64 desc_k128(u32 addr) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}

// D[64 x BM] += A[64 x 16] (4 registers per thread) * B[16 x BM] (descriptor).
#if BM == 64
DEVI void wgmma_rs(float (&d)[32], const u32 (&a)[4], u64 desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." WG_T "." WG_T " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}
#endif
#if BM == 128
DEVI void wgmma_rs(float (&d)[64], const u32 (&a)[4], u64 desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." WG_T "." WG_T " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}
#endif
#if BM == 192
DEVI void wgmma_rs(float (&d)[96], const u32 (&a)[4], u64 desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %101, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n192k16.f32." WG_T "." WG_T " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, "
        "{%96, %97, %98, %99}, %100, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}
#endif
#if BM == 256
DEVI void wgmma_rs(float (&d)[128], const u32 (&a)[4], u64 desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32." WG_T "." WG_T " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "{%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}
#endif

struct Loader {
    const u8* x_src;  // row 0 of this thread's activation chunk (k = its column)
    const u8* w_src;
    const u8* s_src;
    int x_rows, w_rows, s_rows;  // rows from this thread's first inside the matrix
    int x_col, w_col, s_col;     // first k of this thread's chunk
    u32 x_off, w_off, s_off;     // stage-relative shared offsets
};

DEVI Loader make_loader(const u8* __restrict__ wq, const float* __restrict__ wd,
                        const u16* __restrict__ xh, int m0, int n0, int M, int N, int K) {
    Loader L;
    const int t = threadIdx.x;
    {
        const int r = t / 8, c = t % 8;
        L.x_rows = M - m0 - r;
        L.x_col = c * 8;
        L.x_src = reinterpret_cast<const u8*>(xh) + ((u64)(m0 + r) * K + c * 8) * 2;
        L.x_off = r * 128 + ((c ^ (r % 8)) * 16);
    }
    {
        const int r = t / W_CPR, c = t % W_CPR;
        L.w_rows = N - n0 - r;
#if WTYPE == Q8_0
        L.w_col = c * 16;
        L.w_src = wq + (u64)(n0 + r) * K + c * 16;
#else
        L.w_col = c * 32;
        L.w_src = wq + (u64)(n0 + r) * (K / 2) + c * 16;
#endif
        L.w_off = X_BYTES + r * SW + c * 16;
    }
    {
        const int r = t / 2, j = t % 2;
        L.s_rows = N - n0 - r;
        L.s_col = j * 32;
        L.s_src = reinterpret_cast<const u8*>(wd + (u64)(n0 + r) * (K / 32) + j);
        L.s_off = X_BYTES + W_BYTES + (r * 2 + j) * 4;
    }
    return L;
}

// Issues the copies of k tile kt into the stage at shared address `st`.
DEVI void load_stage(const Loader& L, u32 st, const u8* base, int kt, int K) {
    const int k0 = kt * BK;
    {
        const bool kok = k0 + L.x_col < K;
        const u8* p = L.x_src + (u64)k0 * 2;
        const u64 step = (u64)(X_RSTEP * 2) * (u32)K;
#pragma unroll
        for (int it = 0; it < X_ITERS; ++it) {
            if (BM % X_RSTEP == 0 || it * X_RSTEP + (int)(threadIdx.x / 8) < BM) {
                const bool ok = kok && it * X_RSTEP < L.x_rows;
                cp_async16(st + L.x_off + it * X_RSTEP * 128, ok ? p : base, ok ? 16 : 0);
            }
            p += step;
        }
    }
    {
        const bool kok = k0 + L.w_col < K;
        const u8* p = L.w_src + k0 * BKW / 64;
        const u64 step = (u64)(W_RSTEP * BKW / 64) * (u32)K;
#pragma unroll
        for (int it = 0; it < W_ITERS; ++it) {
            const bool ok = kok && it * W_RSTEP < L.w_rows;
            cp_async16(st + L.w_off + it * W_RSTEP * SW, ok ? p : base, ok ? 16 : 0);
            p += step;
        }
    }
    {
        const bool kok = k0 + L.s_col < K;
        const u8* p = L.s_src + (k0 / 32) * 4;
        const u64 step = (u64)(THREADS / 2 / 8) * (u32)K;
#pragma unroll
        for (int it = 0; it < S_ITERS; ++it) {
            const bool ok = kok && it * (THREADS / 2) < L.s_rows;
            cp_async4(st + L.s_off + it * THREADS * 4, ok ? p : base, ok ? 4 : 0);
            p += step;
        }
    }
}

// Dequantizes this thread's A fragments of one stage: for each 64-feature
// block i and k16 step ks, rows g and g + 8 of the warp's 16 rows; a0/a2
// come from row g, a1/a3 from row g + 8 (the m16k16 A fragment layout).
// `w_row` / `s_row` point at the stage's quant row and scale row of row g of
// block 0.
DEVI void dequant_stage(const u8* w_row, const float* s_row, u32 (&a)[MW][4][4]) {
#pragma unroll
    for (int i = 0; i < MW; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const u8* wr = w_row + (i * 64 + 8 * h) * SW;
            const float* sr = s_row + (i * 64 + 8 * h) * 2;
            const float d0 = sr[0], d1 = sr[1];
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
                const float d = ks < 2 ? d0 : d1;
#if WTYPE == Q8_0
                const u32 v = *reinterpret_cast<const u32*>(wr + ks * 16);
                // int8 q -> unsigned q + 128 by flipping the sign bits.
#if DQ_TYPE == F16
                dq4_f16(v ^ 0x80808080u, d, 0x64806480u, a[i][ks][h], a[i][ks][2 + h]);
#else
                dq4_bf16(v ^ 0x80808080u, d, 8388736.0f, a[i][ks][h], a[i][ks][2 + h]);
#endif
#else
                // k16 step ks: low (even ks) or high (odd ks) nibbles of block ks / 2.
                const u32 v = *reinterpret_cast<const u32*>(wr + (ks / 2) * 16);
                const u32 nib = (ks % 2) ? (v >> 4) & 0x0F0F0F0Fu : v & 0x0F0F0F0Fu;
#if DQ_TYPE == F16
                dq4_f16(nib, d, 0x64086408u, a[i][ks][h], a[i][ks][2 + h]);
#else
                dq4_bf16(nib, d, 8388616.0f, a[i][ks][h], a[i][ks][2 + h]);
#endif
#endif
            }
        }
    }
}

DEVI void mma_stage(u32 x_tile, const u32 (&a)[MW][4][4], float (&acc)[MW][NACC]) {
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
        const u64 desc = desc_k128(x_tile + ks * 32);
#pragma unroll
        for (int i = 0; i < MW; ++i) wgmma_rs(acc[i], a[i][ks], desc);
    }
    wgmma_commit();
}

// One k tile: wait for its copies, publish them to the async proxy, refill
// the stage read two tiles ago, dequantize, issue the MMAs, and retire the
// previous tile's group.
// `kt` counts this CTA's tiles from 0; its k tile is kt0 + kt, and NT tiles
// are its share.
DEVI void k_step(const Loader& L, u32 s_base, const u8* base, int kt, int kt0, int NT, int K,
                 const u8* w_lane, const float* s_lane, u32 (&a)[MW][4][4], float (&acc)[MW][NACC]) {
    cp_async_wait<STAGES - 3>();
    fence_proxy_async();
    __syncthreads();
    const int nk = kt + STAGES - 2;
    if (nk < NT) load_stage(L, s_base + (nk % STAGES) * STAGE_BYTES, base, kt0 + nk, K);
    cp_async_commit();
    const u32 so = (kt % STAGES) * STAGE_BYTES;
    dequant_stage(w_lane + so, reinterpret_cast<const float*>(reinterpret_cast<const u8*>(s_lane) + so), a);
    mma_stage(s_base + so, a, acc);
    wgmma_wait<1>();
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
gemm_wgmma(const u8* __restrict__ wq, const float* __restrict__ wd, const u16* __restrict__ xh,
           float* __restrict__ y, int M, int N, int K) {
    extern __shared__ __align__(1024) u8 smem_raw[];
    // Swizzled tiles need 1024-byte alignment; the launch adds 1024 bytes of slack.
    const u32 raw = smem_addr(smem_raw);
    const u32 pad = ((raw + 1023u) & ~1023u) - raw;
    u8* smem = smem_raw + pad;
    const u32 s0 = raw + pad;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int g = lane / 4, tig = lane % 4;
    float acc[MW][NACC];
#pragma unroll
    for (int i = 0; i < MW; ++i)
#pragma unroll
        for (int e = 0; e < NACC; ++e) acc[i][e] = 0.f;
    const Loader L = make_loader(wq, wd, xh, m0, n0, M, N, K);
    const u8* base = wq;
    // Row g of this warp's 16 rows in 64-feature block 0 of this warpgroup.
    const int fl = wg * 64 * MW + warp * 16 + g;
    const u8* w_lane = smem + X_BYTES + fl * SW + tig * 4;
    const float* s_lane = reinterpret_cast<const float*>(smem + X_BYTES + W_BYTES) + fl * 2;
    const int KT = (K + BK - 1) / BK;
    const int kt0 = (int)(((long long)KT * blockIdx.z) / KSPLIT);
    const int NT = (int)(((long long)KT * (blockIdx.z + 1)) / KSPLIT) - kt0;
#pragma unroll
    for (int s = 0; s < STAGES - 2; ++s) {
        if (s < NT) load_stage(L, s0 + s * STAGE_BYTES, base, kt0 + s, K);
        cp_async_commit();
    }
    u32 a0[MW][4][4], a1[MW][4][4];
    int kt = 0;
    for (; kt + 1 < NT; kt += 2) {
        k_step(L, s0, base, kt, kt0, NT, K, w_lane, s_lane, a0, acc);
        k_step(L, s0, base, kt + 1, kt0, NT, K, w_lane, s_lane, a1, acc);
    }
    if (kt < NT) k_step(L, s0, base, kt, kt0, NT, K, w_lane, s_lane, a0, acc);
    wgmma_wait<0>();
    // acc[i][4j + e]: feature row g (e < 2) or g + 8 (e >= 2) of the warp's
    // 16 rows in block i; token column 8j + 2*tig + (e & 1).
#pragma unroll
    for (int i = 0; i < MW; ++i) {
        const int f = n0 + wg * 64 * MW + i * 64 + warp * 16 + g;
#pragma unroll
        for (int j = 0; j < BM / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = m0 + 8 * j + 2 * tig + (e & 1);
                const int col = f + 8 * (e >> 1);
                if (row < M && col < N) {
#if KSPLIT == 1
                    y[(u64)row * N + col] = acc[i][4 * j + e];
#else
                    red_add_f32(y + (u64)row * N + col, acc[i][4 * j + e]);
#endif
                }
            }
        }
    }
}
