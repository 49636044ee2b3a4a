// wgmma.cuh: Hopper's warpgroup MMA (wgmma, sm_90a) as inline PTX, for
// every kernel that uses it (gemm_wgmma.cu, attn_wgmma.cuh): the
// shared-memory matrix descriptors, the fences and group waits, and one
// wrapper per operand form and tile width.
//
// Wrappers (D f32 [64 x N], k16 per instruction; the operand type is the
// includer's WG_T for both A and B):
//   wgmma_ss(d, desc_a, desc_b, scale_d)  A and B from shared memory, both
//       K-major; scale_d = 0 overwrites D, otherwise D += A B.
//   wgmma_rs(d, a, desc_b)     D += A B, A from registers (the m64k16
//       fragment, 4 words per thread), B K-major in shared memory.
//   wgmma_rs_tb(d, a, desc_b)  the same with B read transposed (MN-major).
// N is the accumulator array's length times 2 (overloads for N = 32, 64,
// 128, 192, 256: d is float[N / 2]). The accumulator layout is the m64nN
// one: thread (warp w, lane l) holds rows 16 w + l / 4 and + 8, columns
// 8 j + 2 (l % 4) + {0, 1}, as d[4 j + {0, 1}] and d[4 j + {2, 3}].
// The MMAs are asynchronous: wgmma_fence before the first one that reads
// registers written since the last, wgmma_commit to close a group, and
// wgmma_wait<N> (at most N groups still in flight) before D, or a register
// or shared operand a group reads, is touched again; fence_regs /
// fence_frags pin such registers to the wait.
//
// Defines: (none of its own; uses the includer's WG_T, the PTX name of the
// operand type: "f16" or "bf16")

#pragma once

// ---- fences and groups ------------------------------------------------------
DEVI void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
DEVI void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> DEVI void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}
// Orders this thread's generic-proxy shared-memory accesses (stores, and
// completed cp.async copies) before later async-proxy reads (wgmma operands).
DEVI void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Pins registers an async MMA wrote (or reads), so that no use is
// scheduled before, and no reuse of the registers after, the wait that
// completes it.
template <int N> DEVI void fence_regs(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N> DEVI void fence_frags(u32 (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(r[i][e])::"memory");
}

// ---- shared-memory matrix descriptors ---------------------------------------
// A tile in the 128-byte swizzle: rows of 128 bytes (64 16-bit elements),
// 16-byte chunk c of row r stored at chunk c ^ (r % 8), 8-row groups 1024
// bytes apart (the stride byte offset), the tile 1024-byte aligned.
// `lead_bytes` is the leading byte offset: unused by a K-major operand,
// the distance between 64-element blocks of an MN-major one. Fields are in
// 16-byte units; the 14-bit start address field holds addr >> 4 (a shared
// address is below 228 KB < 2^18, so no bits are lost).
DEVI u64 wgmma_desc_sw128(u32 addr, u32 lead_bytes) {
    return (u64)(addr >> 4) | ((u64)(lead_bytes >> 4) << 16) | ((u64)(1024 >> 4) << 32) |
           ((u64)1 << 62);
}
// K-major operand: `addr` is the first row's address plus 32 bytes per k16
// step (the leading offset is unused by this layout: 16 bytes, encoded 1).
DEVI u64 desc_kmajor(u32 addr) { return wgmma_desc_sw128(addr, 16); }
// MN-major operand (read transposed): 64 elements of N per 128-byte row,
// the next 64 `block_bytes` further, 8-row groups (8 k) 1024 bytes apart;
// `addr` is the block of the first 64 plus 2048 bytes per k16 step.
DEVI u64 desc_mnmajor(u32 addr, u32 block_bytes) { return wgmma_desc_sw128(addr, block_bytes); }

// ---- asm operand lists ------------------------------------------------------
// The N / 2 accumulators of an m64nN tile are the asm operands %0 ..
// %(N/2 - 1), the other operands follow them.
#define WG_REGS_0 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define WG_REGS_16 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_REGS_32 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define WG_REGS_48 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WG_REGS_64 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"
#define WG_REGS_80 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define WG_REGS_96 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111"
#define WG_REGS_112 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define WG_LIST_16 WG_REGS_0
#define WG_LIST_32 WG_LIST_16 ", " WG_REGS_16
#define WG_LIST_64 WG_LIST_32 ", " WG_REGS_32 ", " WG_REGS_48
#define WG_LIST_96 WG_LIST_64 ", " WG_REGS_64 ", " WG_REGS_80
#define WG_LIST_128 WG_LIST_96 ", " WG_REGS_96 ", " WG_REGS_112

#define WG_ACC8(d, i)                                                                                   \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),         \
        "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_ACC_16(d) WG_ACC8(d, 0), WG_ACC8(d, 8)
#define WG_ACC_32(d) WG_ACC_16(d), WG_ACC8(d, 16), WG_ACC8(d, 24)
#define WG_ACC_64(d) WG_ACC_32(d), WG_ACC8(d, 32), WG_ACC8(d, 40), WG_ACC8(d, 48), WG_ACC8(d, 56)
#define WG_ACC_96(d) WG_ACC_64(d), WG_ACC8(d, 64), WG_ACC8(d, 72), WG_ACC8(d, 80), WG_ACC8(d, 88)
#define WG_ACC_128(d) WG_ACC_96(d), WG_ACC8(d, 96), WG_ACC8(d, 104), WG_ACC8(d, 112), WG_ACC8(d, 120)

// ---- the wrappers -----------------------------------------------------------
// R accumulators (N = 2 R); I0.. are the operand numbers after them.
#define WG_DEFINE_SS(R, N, IA, IB, IS)                                                                  \
    DEVI void wgmma_ss(float (&d)[R], u64 desc_a, u64 desc_b, int scale_d) {                            \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IS ", 0;\n"                                 \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." WG_T "." WG_T " "                \
                     "{" WG_LIST_##R "}, %" #IA ", %" #IB ", p, 1, 1, 0, 0;\n}\n"                       \
                     : WG_ACC_##R(d)                                                                    \
                     : "l"(desc_a), "l"(desc_b), "r"(scale_d));                                        \
    }
#define WG_DEFINE_RS(NAME, TRANS_B, R, N, I0, I1, I2, I3, IB)                                           \
    DEVI void NAME(float (&d)[R], const u32 (&a)[4], u64 desc_b) {                                      \
        asm volatile("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." WG_T "." WG_T " "                \
                     "{" WG_LIST_##R "}, {%" #I0 ", %" #I1 ", %" #I2 ", %" #I3 "}, %" #IB             \
                     ", 1, 1, 1, " #TRANS_B ";\n"                                                       \
                     : WG_ACC_##R(d)                                                                    \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));                       \
    }

WG_DEFINE_SS(16, 32, 16, 17, 18)
WG_DEFINE_SS(32, 64, 32, 33, 34)
WG_DEFINE_SS(64, 128, 64, 65, 66)
WG_DEFINE_SS(96, 192, 96, 97, 98)
WG_DEFINE_SS(128, 256, 128, 129, 130)
WG_DEFINE_RS(wgmma_rs, 0, 16, 32, 16, 17, 18, 19, 20)
WG_DEFINE_RS(wgmma_rs, 0, 32, 64, 32, 33, 34, 35, 36)
WG_DEFINE_RS(wgmma_rs, 0, 64, 128, 64, 65, 66, 67, 68)
WG_DEFINE_RS(wgmma_rs, 0, 96, 192, 96, 97, 98, 99, 100)
WG_DEFINE_RS(wgmma_rs, 0, 128, 256, 128, 129, 130, 131, 132)
WG_DEFINE_RS(wgmma_rs_tb, 1, 16, 32, 16, 17, 18, 19, 20)
WG_DEFINE_RS(wgmma_rs_tb, 1, 32, 64, 32, 33, 34, 35, 36)
WG_DEFINE_RS(wgmma_rs_tb, 1, 64, 128, 64, 65, 66, 67, 68)
WG_DEFINE_RS(wgmma_rs_tb, 1, 96, 192, 96, 97, 98, 99, 100)
WG_DEFINE_RS(wgmma_rs_tb, 1, 128, 256, 128, 129, 130, 131, 132)
