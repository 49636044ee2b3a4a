// stream.cu: read-bandwidth probe. Every thread reads 16-byte words of `buf`
// in a grid-stride loop, `reps` times over, and folds them into an XOR that is
// stored only when it equals an impossible value (so the loads stay live).
//
// Grid: any 1-D grid of THREADS-thread blocks (4 per SM is plenty).
// Contract: none (a probe, not a kernel of the engine); the buffer is only read.
//
// Defines:
//   THREADS  threads per block (launch must match)

#ifndef THREADS
#error "stream.cu needs THREADS"
#endif

#include "common.cuh"

extern "C" __global__ void __launch_bounds__(THREADS) stream_read(const uint4* __restrict__ buf, u64 n16, int reps, u32* sink) {
    pdl_enter();
    u32 acc = 0;
    const u64 stride = (u64)gridDim.x * THREADS;
    for (int r = 0; r < reps; ++r) {
        u64 i = (u64)blockIdx.x * THREADS + threadIdx.x;
        // Four independent loads in flight per iteration.
        for (; i + 3 * stride < n16; i += 4 * stride) {
            uint4 a, b, c, d;
            asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(a.x), "=r"(a.y), "=r"(a.z), "=r"(a.w) : "l"(buf + i));
            asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(b.x), "=r"(b.y), "=r"(b.z), "=r"(b.w) : "l"(buf + i + stride));
            asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(c.x), "=r"(c.y), "=r"(c.z), "=r"(c.w) : "l"(buf + i + 2 * stride));
            asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(d.x), "=r"(d.y), "=r"(d.z), "=r"(d.w) : "l"(buf + i + 3 * stride));
            acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
        }
        for (; i < n16; i += stride) {
            uint4 a;
            asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(a.x), "=r"(a.y), "=r"(a.z), "=r"(a.w) : "l"(buf + i));
            acc ^= a.x ^ a.y ^ a.z ^ a.w;
        }
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;  // practically never true
}
