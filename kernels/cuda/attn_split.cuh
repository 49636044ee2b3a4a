// attn_split.cuh: the bookkeeping of a split-KV decode CTA that the
// streaming kernels share (attn_stream.cuh, ALGO = 2; attn_keymajor.cuh,
// ALGO = 3): which rows and key tiles CTA (x, kvh, z) owns, its Q rows in
// shared memory, the unnormalized partial it leaves for attn_combine, and
// the programmatic-launch handshake with the combine.
// attn_decode.cu includes it ahead of its ALGO branches (the source table
// inlines a file once, whatever branch names it first).
//
// Rows: BQ (token x query head) pairs of KV head kvh's GQA group, row r =
// token t0 + r / G, head kvh G + r % G. Key tiles: BKV consecutive
// positions (tile i holds i BKV .. i BKV + BKV - 1, at slots pos % capacity,
// so a tile may straddle the ring's wrap); the tiles from the one holding
// the oldest visible key (the oldest cached key, or with a window the first
// row's oldest visible one) to the one holding the last query's position are
// cut into gridDim.z runs of equal length (+-1), run z going to CTA z. The
// length comes from pos0_dev when it is set, so a graph replay sees the
// current one.
//
// Defines: (none of its own; uses the includer's HEAD_DIM, BQ, BKV)

#pragma once

// The split kernel and attn_combine as a programmatic dependent launch
// (PDL, sm_90; bind::attention::launch): the split kernel lets the combine be
// scheduled once every split CTA has started, and the combine waits for the
// split grid's completion (its partials visible) before it reads them. Both
// are no-ops below sm_90, where the launches are plain and stream-ordered.
DEVI void release_combine() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
DEVI void await_splits() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

struct DecodeSplit {
    int kvh, G, t0, n_tok, rows;
    int pos0, kv_len, cache_lo;
    // Positions of the first and last query row, and the oldest key a row sees.
    int p_lo, p_hi, k_lo;
    // This CTA's key tiles, inclusive (empty when tile_lo > tile_hi).
    int tile_lo, tile_hi;
};

DEVI DecodeSplit decode_split(int q_pos0_arg, int n_q, int capacity, int n_heads, int n_kv_heads, int window,
                              const int* __restrict__ pos0_dev) {
    DecodeSplit s;
    s.kvh = blockIdx.y;
    s.G = n_heads / n_kv_heads;
    const int tok_per = BQ / s.G;
    s.t0 = blockIdx.x * tok_per;
    s.n_tok = min(tok_per, n_q - s.t0);
    s.rows = s.n_tok * s.G;
    s.pos0 = pos0_dev ? *pos0_dev : q_pos0_arg;
    s.kv_len = s.pos0 + n_q;
    s.cache_lo = max(0, s.kv_len - capacity);
    s.p_lo = s.pos0 + s.t0;
    s.p_hi = s.p_lo + s.n_tok - 1;
    s.k_lo = window > 0 ? max(s.cache_lo, s.p_lo - window + 1) : s.cache_lo;
    const int first = s.k_lo / BKV;
    const int n_tiles = s.p_hi / BKV - first + 1;
    const int Z = gridDim.z, z = blockIdx.z;
    s.tile_lo = first + (int)((long long)z * n_tiles / Z);
    s.tile_hi = first + (int)((long long)(z + 1) * n_tiles / Z) - 1;
    return s;
}

// The CTA's Q rows into shared memory (row stride `stride` u16), rounded to
// the operand type; rows past the last token are 0. No barrier: the caller
// publishes them.
template <int NTHREADS_>
DEVI void load_q_rows(u16* Qs, int stride, const float* __restrict__ q, const DecodeSplit& s, int n_heads) {
#pragma unroll 8
    for (int i = threadIdx.x; i < BQ * HEAD_DIM / 2; i += NTHREADS_) {
        const int r = i / (HEAD_DIM / 2), c2 = i % (HEAD_DIM / 2);
        float2 v = make_float2(0.f, 0.f);
        if (r < s.rows) {
            const int t = s.t0 + r / s.G, h = s.kvh * s.G + r % s.G;
            v = reinterpret_cast<const float2*>(q + ((u64)t * n_heads + h) * HEAD_DIM)[c2];
        }
        reinterpret_cast<u32*>(Qs + r * stride)[c2] = op_pack(v.x, v.y);
    }
}

// Writes the CTA's unnormalized partial: its O rows (Ob, row stride
// `ostride` floats, already merged over its NPARTS key warps) to scratch
// [z][t][h][HEAD_DIM], then per row M = max m and L = sum l e^(m - M) over
// the NPARTS (m, l) pairs at mS / lS [part][BQ] to scratch [Z][..][2].
template <int NTHREADS_, int NPARTS>
DEVI void write_split_partial(float* __restrict__ scratch, const float* Ob, int ostride, const float* mS,
                              const float* lS, const DecodeSplit& s, int n_q, int n_heads) {
    const float log2e = 1.4426950408889634f;
    const u64 rows_all = (u64)n_q * n_heads;
    const int z = blockIdx.z;
    for (int i = threadIdx.x; i < s.rows * (HEAD_DIM / 4); i += NTHREADS_) {
        const int r = i / (HEAD_DIM / 4), c4 = i % (HEAD_DIM / 4);
        const int t = s.t0 + r / s.G, h = s.kvh * s.G + r % s.G;
        const u64 row = (u64)z * rows_all + (u64)t * n_heads + h;
        reinterpret_cast<float4*>(scratch + row * HEAD_DIM)[c4] = reinterpret_cast<const float4*>(Ob + r * ostride)[c4];
    }
    for (int r = threadIdx.x; r < s.rows; r += NTHREADS_) {
        float M = -INFINITY;
#pragma unroll
        for (int k = 0; k < NPARTS; ++k) M = fmaxf(M, mS[k * BQ + r]);
        float L = 0.0f;
#pragma unroll
        for (int k = 0; k < NPARTS; ++k) {
            const float mk = mS[k * BQ + r];
            if (mk != -INFINITY) L += lS[k * BQ + r] * exp2f((mk - M) * log2e);
        }
        const int t = s.t0 + r / s.G, h = s.kvh * s.G + r % s.G;
        const u64 row = (u64)z * rows_all + (u64)t * n_heads + h;
        float* ml = scratch + (u64)gridDim.z * rows_all * HEAD_DIM + row * 2;
        ml[0] = M;
        ml[1] = L;
    }
}
