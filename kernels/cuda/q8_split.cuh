// q8_split.cuh: split Q8 activations, one 80-byte record per 32-element
// group of an activation row: x_i ~ d1 * q1_i + d2 * q2_i, q1 the Q8_1-style
// quantization of x and q2 that of its residual x - d1 * q1, each with its
// own scale over 127 and exact integer sum. The residual's scale is under
// 1/254 of the first, so a record carries about 15 bits per value while the
// GEMV keeps dp4a's integer path (two dot products per word).
//
// Rule, per group of 32 values v (every step one IEEE f32 rounding):
//   d1 = amax|v| / 127,  q1 = rint(v * rcp_rn(d1))  (0 when d1 = 0),
//   r  = fma(-d1, q1, v),
//   d2 = amax|r| / 127,  q2 = rint(r * rcp_rn(d2))  (0 when d2 = 0),
//   s1 = sum q1, s2 = sum q2.
// `families::q8_split_records` replays it on the CPU bit for bit.
//
// Writers: gemv ALGO 2 (a warp per group, into shared memory, gemv_chunk.cuh),
// act_out.cuh with OUT=Q8_SPLIT (rmsnorm, gelu_mul) and quantize_q8_1.cu with
// OUT=Q8_SPLIT (the pre-pass), both through split_write4 below. Reader: gemv
// ALGO 2 (shared memory) and ALGO 3 (the producer's records in global memory).

#pragma once

// 80 bytes: the lanes of a warp, one group each, read 16-byte pieces that
// fall in distinct shared-memory banks, and a record is 16-byte aligned in
// a device buffer.
struct XSplit {
    int4 q1[2];
    int4 q2[2];
    float d1, d2;
    int s1, s2;
};

DEVI u32 split_pack4(int a, int b, int c, int d) {
    return (u32)(a & 0xff) | ((u32)(b & 0xff) << 8) | ((u32)(c & 0xff) << 16) | ((u32)(d & 0xff) << 24);
}

// Four consecutive values v of one group, starting at element `at` of it
// (0, 4, .., 28): the 8 lanes of an aligned group of 8 in one warp hold one
// group and call this together (all 32 lanes of the warp uniformly;
// `valid` = false lanes pass zeros and store nothing). Writes the lane's
// quants of both planes; the lane at element 0 writes the scales and sums.
// The max over non-negative floats equals gemv's max over their bits.
DEVI void split_write4(XSplit* rec, int at, float4 v, bool valid) {
    float a1 = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) a1 = fmaxf(a1, __shfl_xor_sync(0xffffffffu, a1, o));
    const float d1 = __fdiv_rn(a1, 127.0f);
    const float i1 = d1 != 0.0f ? __frcp_rn(d1) : 0.0f;
    const float vv[4] = {v.x, v.y, v.z, v.w};
    int q1[4], q2[4];
    float r[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        q1[i] = d1 != 0.0f ? __float2int_rn(vv[i] * i1) : 0;
        r[i] = fmaf(-d1, (float)q1[i], vv[i]);
    }
    float a2 = fmaxf(fmaxf(fabsf(r[0]), fabsf(r[1])), fmaxf(fabsf(r[2]), fabsf(r[3])));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) a2 = fmaxf(a2, __shfl_xor_sync(0xffffffffu, a2, o));
    const float d2 = __fdiv_rn(a2, 127.0f);
    const float i2 = d2 != 0.0f ? __frcp_rn(d2) : 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) q2[i] = d2 != 0.0f ? __float2int_rn(r[i] * i2) : 0;
    int s1 = q1[0] + q1[1] + q1[2] + q1[3], s2 = q2[0] + q2[1] + q2[2] + q2[3];
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) {
        s1 += __shfl_xor_sync(0xffffffffu, s1, o);
        s2 += __shfl_xor_sync(0xffffffffu, s2, o);
    }
    if (!valid) return;
    reinterpret_cast<u32*>(rec->q1)[at / 4] = split_pack4(q1[0], q1[1], q1[2], q1[3]);
    reinterpret_cast<u32*>(rec->q2)[at / 4] = split_pack4(q2[0], q2[1], q2[2], q2[3]);
    if (at == 0) {
        float4 tail;
        tail.x = d1;
        tail.y = d2;
        tail.z = __int_as_float(s1);
        tail.w = __int_as_float(s2);
        *reinterpret_cast<float4*>(&rec->d1) = tail;
    }
}

// A block's values as records: row r's values (v + r * vstride, in shared
// memory, ngroups * 32 of them) go to records dst(r) + g0 .. dst(r) + g0 +
// ngroups - 1, records at or past `limit` skipped. Every thread of the block
// calls it (the loop bound is the same on every lane of a warp): eight lanes
// per record, four records per warp pass.
template <typename Dst>
DEVI void split_store_rows(const float* v, int vstride, int rows, int ngroups, int g0, int limit, Dst dst) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    const int records = rows * ngroups;
    for (int i0 = warp * 4; i0 < records; i0 += warps * 4) {
        const int i = i0 + lane / 8, at = (lane % 8) * 4;
        const int r = i / ngroups, g = i - r * ngroups;
        const bool valid = i < records && g0 + g < limit;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (valid) {
            const float* p = v + r * vstride + g * 32 + at;
            x = make_float4(p[0], p[1], p[2], p[3]);
        }
        split_write4(valid ? dst(r) + g0 + g : nullptr, at, x, valid);
    }
}

// One record read from global memory through the read-only path: five
// 16-byte loads (ALGO 3 reads a producer's records this way).
DEVI XSplit split_load(const XSplit* __restrict__ p) {
    const int4* w = reinterpret_cast<const int4*>(p);
    XSplit s;
    s.q1[0] = __ldg(w);
    s.q1[1] = __ldg(w + 1);
    s.q2[0] = __ldg(w + 2);
    s.q2[1] = __ldg(w + 3);
    const float4 t = __ldg(reinterpret_cast<const float4*>(w + 4));
    s.d1 = t.x;
    s.d2 = t.y;
    s.s1 = __float_as_int(t.z);
    s.s2 = __float_as_int(t.w);
    return s;
}
