// attn_scalar.cuh: the CUDA-core attention kernel, the baseline of both
// attention families and the only one that reads f32 caches (the strict
// profile's parity path).
//
// One warp per (query token t, query head h): lane l holds head dims
// l, l + 32, ... of q; for every visible key (position order, cache slot
// pos % capacity) the score is a warp-reduced f32 dot, then the online
// softmax (f32 expf) updates the running max, sum and the lane's part of o.
// Visible keys of query position qp: max(kv_len - capacity, 0) <= k <= qp
// and, with a window, qp - k < window. Scale 1.0.
// grid.x = ceil(n_q * n_heads / SCALAR_WARPS), block SCALAR_WARPS * 32.
//
// Defines: (none of its own; uses the includer's HEAD_DIM, KV_TYPE and
// SCALAR_WARPS, and ATTN_SCALAR_ENTRY for the kernel name)

#pragma once

#define F16 1
#define BF16 2
#define F32 3

DEVI float kv_at(const void* c, u64 i) {
#if KV_TYPE == F32
    return reinterpret_cast<const float*>(c)[i];
#elif KV_TYPE == F16
    return h2f(reinterpret_cast<const u16*>(c)[i]);
#else
    return __uint_as_float((u32)reinterpret_cast<const u16*>(c)[i] << 16);
#endif
}

extern "C" __global__ void __launch_bounds__(SCALAR_WARPS * 32)
ATTN_SCALAR_ENTRY(const float* __restrict__ q, const void* __restrict__ kc, const void* __restrict__ vc,
                  float* __restrict__ out, int q_pos0_arg, int n_q, int capacity, int n_heads,
                  int n_kv_heads, int window, const int* __restrict__ pos0_dev, float* __restrict__ scratch) {
    (void)scratch;
    // Launched as a programmatic dependent (decode), it waits for the grid
    // ahead before it reads anything (attn_split.cuh's launch order).
    pdl_await_prior();
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * SCALAR_WARPS + (threadIdx.x >> 5);
    if (row >= n_q * n_heads) return;
    const int t = row / n_heads, h = row % n_heads;
    const int g = h / (n_heads / n_kv_heads);
    const int pos0 = pos0_dev ? *pos0_dev : q_pos0_arg;
    const int qp = pos0 + t;
    const int kv_len = pos0 + n_q;
    int lo = max(kv_len - capacity, 0);
    if (window > 0) lo = max(lo, qp - window + 1);
    float qv[HEAD_DIM / 32], o[HEAD_DIM / 32];
    const float* qr = q + (u64)row * HEAD_DIM;
#pragma unroll
    for (int j = 0; j < HEAD_DIM / 32; ++j) {
        qv[j] = qr[j * 32 + lane];
        o[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int k = lo; k <= qp; ++k) {
        const u64 base = ((u64)(k % capacity) * n_kv_heads + g) * HEAD_DIM;
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < HEAD_DIM / 32; ++j) s += qv[j] * kv_at(kc, base + j * 32 + lane);
        s = warp_sum(s);
        const float m_new = fmaxf(m, s);
        const float a = expf(m - m_new), p = expf(s - m_new);
        l = l * a + p;
#pragma unroll
        for (int j = 0; j < HEAD_DIM / 32; ++j) o[j] = o[j] * a + p * kv_at(vc, base + j * 32 + lane);
        m = m_new;
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    float* dst = out + (u64)row * HEAD_DIM;
#pragma unroll
    for (int j = 0; j < HEAD_DIM / 32; ++j) dst[j * 32 + lane] = o[j] * inv;
}
