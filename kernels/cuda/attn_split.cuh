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
// Defines: (none of its own; uses the includer's HEAD_DIM, BQ, BKV, STAGES)

#pragma once

// Launch order (bind::attention::launch, sm_90): the split kernel is a
// programmatic dependent of the kernel before it, and attn_combine one of
// the split kernel (common.cuh: pdl_release_dependents / pdl_await_prior).
// - A split CTA calls pdl_release_dependents first, so the combine is
//   resident while the splits stream, and waits with pdl_await_prior for
//   the grid before it only where it must: before it reads Q, before it
//   copies a tile holding a key at or past pos0 (the keys that grid, the
//   K/V write of the same step, may still be writing), and before it writes
//   its partial (the previous call's combine may still read scratch). A tile
//   of older keys was written by an earlier step's K/V write, and every
//   launch since then either finished before the grid ahead began (plain
//   launches: only attention's are programmatic) or, being attention, only
//   reads the cache. So those copies go out before the wait: the cache's
//   first bytes stream while the grid ahead runs, instead of after the
//   launch gap. A ring slot that grid overwrites holds a key below the
//   oldest one a row can see: copied alongside a visible key it is masked,
//   and either value is finite.
// - attn_combine calls pdl_release_dependents too, then waits for the
//   splits before it reads their partials.
// In a plain launch, and below sm_90, both calls do nothing.

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

// Whether key tile `tile` (keys tile BKV ..) holds only keys below pos0, so
// its copy may go out before pdl_await_prior (see the launch order above).
DEVI bool tile_before_step(const DecodeSplit& s, int tile) { return (tile + 1) * BKV <= s.pos0; }

// The CTA's Q rows, in two steps so that their loads can go out ahead of
// tile copies issued after them: fetch_q_rows issues every load into
// registers (QRows, BQ HEAD_DIM / 2 / NTHREADS_ float2 per thread),
// store_q_rows rounds them to the operand type into shared memory (row
// stride `stride` u16); rows past the last token are 0. Loads issued behind
// a CTA's tile copies return only after those bytes (even an L2 hit), so the
// Q loads go out before every copy that pdl_await_prior does not hold back.
// No barrier: the caller publishes the rows.
template <int NTHREADS_>
struct QRows {
    static constexpr int N = BQ * HEAD_DIM / 2 / NTHREADS_;
    static_assert(BQ * HEAD_DIM / 2 % NTHREADS_ == 0, "Q row pairs must split evenly over the CTA");
    float2 v[N];
};

template <int NTHREADS_>
DEVI void fetch_q_rows(QRows<NTHREADS_>& f, const float* __restrict__ q, const DecodeSplit& s, int n_heads) {
#pragma unroll
    for (int j = 0; j < QRows<NTHREADS_>::N; ++j) {
        const int i = threadIdx.x + j * NTHREADS_;
        const int r = i / (HEAD_DIM / 2), c2 = i % (HEAD_DIM / 2);
        f.v[j] = make_float2(0.f, 0.f);
        if (r < s.rows) {
            const int t = s.t0 + r / s.G, h = s.kvh * s.G + r % s.G;
            f.v[j] = reinterpret_cast<const float2*>(q + ((u64)t * n_heads + h) * HEAD_DIM)[c2];
        }
    }
}

template <int NTHREADS_>
DEVI void store_q_rows(u16* Qs, int stride, const QRows<NTHREADS_>& f) {
#pragma unroll
    for (int j = 0; j < QRows<NTHREADS_>::N; ++j) {
        const int i = threadIdx.x + j * NTHREADS_;
        const int r = i / (HEAD_DIM / 2), c2 = i % (HEAD_DIM / 2);
        reinterpret_cast<u32*>(Qs + r * stride)[c2] = op_pack(f.v[j].x, f.v[j].y);
    }
}

// The prologue around the wait for the grid ahead (the launch order above):
// the copies of the first STAGES - 1 tiles that hold only keys below pos0,
// then pdl_await_prior, the Q loads (fetch_q_rows, ahead of every later
// copy), then the rest of the STAGES - 1 tiles. `copy(tile, buffer)` issues
// one tile's copies; with CP_GROUPS each tile is its own cp.async group, as
// the loops' cp_async_wait<STAGES - 2> counts them.
template <int NTHREADS_, bool CP_GROUPS, typename Copy>
DEVI void copy_prologue_and_fetch_q(const DecodeSplit& s, Copy copy, QRows<NTHREADS_>& qrows,
                                    const float* __restrict__ q, int n_heads) {
    int pre = 0;
#pragma unroll 1
    for (; pre < STAGES - 1; ++pre) {
        if (s.tile_lo + pre > s.tile_hi || !tile_before_step(s, s.tile_lo + pre)) break;
        copy(s.tile_lo + pre, pre);
        if (CP_GROUPS) cp_async_commit();
    }
    pdl_await_prior();
    fetch_q_rows<NTHREADS_>(qrows, q, s, n_heads);
#pragma unroll 1
    for (int b = pre; b < STAGES - 1; ++b) {
        if (s.tile_lo + b <= s.tile_hi) copy(s.tile_lo + b, b);
        if (CP_GROUPS) cp_async_commit();
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
