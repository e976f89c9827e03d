// flash_attn_ext. Three paths (dispatch/attention.rs picks one):
// - k_flash_attn_vec (few queries: decode; any shape without batched BLAS; F16/BF16/F32 K and V in
//   rows of whole 16-byte chunks): the query heads of a GQA group share K/V loads, keys split over
//   blocks in tiles of 64, every load of a tile's rows in flight at once; described at the kernel.
// - k_flash_attn (the same shapes with any other K/V): one block of FA_THREADS threads per (head,
//   query, sequence) and KV split. Keys are taken in tiles of FA_THREADS (one score per thread),
//   with an online softmax. Each warp accumulates the values of its quarter of the tile, each lane
//   FA_DIMS dims per 128 (coalesced rows); the warps' accumulators meet in shared memory at the
//   end. K/V of any loadable type; F16 and F32 rows are read directly (vector loads for aligned
//   F16).
// With several splits (few query rows, long KV) each block of either kernel writes its partial
// (max, sum, accumulator) and k_flash_attn_combine merges them, adds the sink and normalizes.
// - the BLAS path (many queries): scores = K Q^T by strided batched GEMMs over the KV heads (the
//   query heads of a group are one operand), k_attn_softmax turns a chunk of score rows into
//   probabilities (scale, softcap, mask, ALiBi, sinks), and GEMMs multiply them with V.
// GQA maps query head h to KV head h / (heads / kv_heads); sliding windows and causality come in
// through the mask.

#define FA_THREADS 128
#define FA_WARPS (FA_THREADS / 32)
#define FA_MAX_D 512
#define FA_DIMS 4
#define FA_CHUNKS (FA_MAX_D / (32 * FA_DIMS))

// Row (key or value j) of a K/V tensor.
__device__ __forceinline__ const u8* kv_row(const TD& t, i64 j, i64 h, i64 s) {
    return (const u8*)t.ptr + j * t.nb[1] + h * t.nb[2] + s * t.nb[3];
}

// Element c of K/V row `row` (of tensor t, for the generic path: key j of head h, sequence s).
__device__ __forceinline__ float kv_at(const TD& t, const u8* row, int c, i64 j, i64 h, i64 s) {
    if (t.type == T_F16 && t.nb[0] == 2) return h2f(((const u16*)row)[c]);
    if (t.type == T_F32 && t.nb[0] == 4) return ((const float*)row)[c];
    return load(t, c, j, h, s);
}

// Dot product of the query (in shared memory) with key j.
__device__ float kq_dot(const TD& k, const float* qs, int D, i64 j, i64 h, i64 s) {
    const u8* row = kv_row(k, j, h, s);
    float dot = 0.0f;
    if (k.type == T_F16 && k.nb[0] == 2 && D % 8 == 0 && ((u64)row & 15) == 0) {
        const uint4* r = (const uint4*)row;
        for (int c = 0; c < D / 8; c++) {
            uint4 v = r[c];
            u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                dot += qs[8 * c + 2 * i] * h2f((u16)(w[i] & 0xFFFFu));
                dot += qs[8 * c + 2 * i + 1] * h2f((u16)(w[i] >> 16));
            }
        }
        return dot;
    }
    for (int c = 0; c < D; c++) dot += qs[c] * kv_at(k, row, c, j, h, s);
    return dot;
}

// Adds w times the FA_DIMS values of V row `row` at dims d0.. (d0 < DV) to a.
__device__ __forceinline__ void add_values(const TD& v, const u8* row, int d0, int DV, i64 j, i64 h, i64 s, float w,
                                           float (&a)[FA_DIMS]) {
    if (v.type == T_F16 && v.nb[0] == 2 && d0 + FA_DIMS <= DV && (((u64)row + 2 * d0) & 7) == 0) {
        uint2 p = *(const uint2*)(row + 2 * d0);
        a[0] += w * h2f((u16)(p.x & 0xFFFFu));
        a[1] += w * h2f((u16)(p.x >> 16));
        a[2] += w * h2f((u16)(p.y & 0xFFFFu));
        a[3] += w * h2f((u16)(p.y >> 16));
        return;
    }
#pragma unroll
    for (int e = 0; e < FA_DIMS; e++)
        if (d0 + e < DV) a[e] += w * kv_at(v, row, d0 + e, j, h, s);
}

// part: 0 for a single split (the block writes the result), else (max, sum, DV accumulators) per
// (row, split) for k_flash_attn_combine.
extern "C" __global__ void k_flash_attn(TD q, TD k, TD v, TD m, TD sk, TD d, float scale, float max_bias,
                                        float softcap, int has_mask, int has_sinks, int kv_per_split, u64 part) { GRID_DEPENDENCY_SYNC();
    __shared__ float qs[FA_MAX_D];
    __shared__ float w[FA_THREADS];
    __shared__ float red[FA_WARPS][FA_MAX_D];
    i64 r = blockIdx.x;
    i64 h = r % d.ne[1], iq = (r / d.ne[1]) % d.ne[2], s = r / (d.ne[1] * d.ne[2]);
    int D = (int)q.ne[0], DV = (int)v.ne[0], n_kv = (int)k.ne[1];
    int kv0 = blockIdx.y * kv_per_split, kv1 = min(n_kv, kv0 + kv_per_split);
    i64 hk = h / (q.ne[2] / k.ne[2]);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float slope = alibi_slope(max_bias, (int)h, (int)q.ne[2]);
    float sc = softcap != 0.0f ? scale / softcap : scale;
    for (int c = threadIdx.x; c < D; c += FA_THREADS) qs[c] = load(q, c, iq, h, s);
    float acc[FA_CHUNKS][FA_DIMS];
#pragma unroll
    for (int c = 0; c < FA_CHUNKS; c++)
#pragma unroll
        for (int e = 0; e < FA_DIMS; e++) acc[c][e] = 0.0f;
    float mx = NEG_INF, sum = 0.0f;
    __syncthreads();
    for (int t0 = kv0; t0 < kv1; t0 += FA_THREADS) {
        int j = t0 + threadIdx.x;
        float x = NEG_INF;
        if (j < kv1) {
            float mv = has_mask ? slope * load(m, j, iq, h % m.ne[2], s % m.ne[3]) : 0.0f;
            if (mv != NEG_INF) {
                x = kq_dot(k, qs, D, j, hk, s) * sc;
                if (softcap != 0.0f) x = softcap * tanhf(x);
                x += mv;
            }
        }
        float tmax = block_max(x);
        float nm = fmaxf(mx, tmax);
        if (nm == NEG_INF) continue;
        float alpha = mx == NEG_INF ? 0.0f : expf(mx - nm);
        float wj = x == NEG_INF ? 0.0f : expf(x - nm);
        __syncthreads();
        w[threadIdx.x] = wj;
        __syncthreads();
        float tsum = 0.0f;
        int tn = min(FA_THREADS, kv1 - t0);
        for (int jj = 0; jj < tn; jj++) tsum += w[jj];
        sum = sum * alpha + tsum;
#pragma unroll
        for (int c = 0; c < FA_CHUNKS; c++)
#pragma unroll
            for (int e = 0; e < FA_DIMS; e++) acc[c][e] *= alpha;
        for (int jj = warp * 32; jj < min(tn, (warp + 1) * 32); jj++) {
            float wv = w[jj];
            if (wv == 0.0f) continue;
            const u8* row = kv_row(v, t0 + jj, hk, s);
#pragma unroll
            for (int c = 0; c < FA_CHUNKS; c++) {
                int d0 = 128 * c + FA_DIMS * lane;
                if (d0 < DV) add_values(v, row, d0, DV, t0 + jj, hk, s, wv, acc[c]);
            }
        }
        mx = nm;
    }
#pragma unroll
    for (int c = 0; c < FA_CHUNKS; c++)
#pragma unroll
        for (int e = 0; e < FA_DIMS; e++) {
            int dv = 128 * c + FA_DIMS * lane + e;
            if (dv < DV) red[warp][dv] = acc[c][e];
        }
    __syncthreads();
    if (part) {
        float* p = (float*)part + (r * gridDim.y + blockIdx.y) * (DV + 2);
        if (threadIdx.x == 0) {
            p[0] = mx;
            p[1] = sum;
        }
        for (int dv = threadIdx.x; dv < DV; dv += FA_THREADS)
            p[2 + dv] = red[0][dv] + red[1][dv] + red[2][dv] + red[3][dv];
        return;
    }
    float scale_out = 1.0f;
    if (has_sinks) {
        float sink = load(sk, h, 0, 0, 0);
        float nm = fmaxf(mx, sink);
        float alpha = mx == NEG_INF ? 0.0f : expf(mx - nm);
        scale_out = alpha;
        sum = sum * alpha + expf(sink - nm);
    }
    float inv = sum == 0.0f ? 0.0f : scale_out / sum;
    for (int dv = threadIdx.x; dv < DV; dv += FA_THREADS)
        store(d, dv, h, iq, s, (red[0][dv] + red[1][dv] + red[2][dv] + red[3][dv]) * inv);
}

// Element of a float tensor (F32, F16 or BF16: queries, masks, sinks) without the block formats.
__device__ __forceinline__ float load_float(const TD& t, i64 i0, i64 i1, i64 i2, i64 i3) {
    const u8* p = (const u8*)t.ptr + i0 * t.nb[0] + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
    if (t.type == T_F32) return *(const float*)p;
    return t.type == T_F16 ? h2f(ld16(p)) : bf2f(ld16(p));
}

// k_flash_attn_vec: the decode path for F16/BF16/F32 K and V whose rows are whole 16-byte chunks
// (at most FAV_MAX_ROW_BYTES). A block takes `heads_per_block` query heads of one GQA group (they
// share every K/V load), one query, one sequence, and the keys of its split in tiles of FAV_TILE.
// Half-warp `half` handles keys half, half + FAV_HALVES, ... of a tile, 16 bytes of each row per
// lane and pass (256 bytes of a row per pass): all FAV_KEYS loads of a pass are issued before they
// are used. Scores go through shared memory, one warp per head updates that head's online softmax,
// then the half-warps accumulate the weighted V chunks, summed in a fixed order into the block's
// accumulator. Splits write partials for k_flash_attn_combine.
#define FAV_THREADS 128
#define FAV_TILE 64
#define FAV_MAX_HEADS 4
#define FAV_MAX_ROW_BYTES 1024
#define FAV_PASS_BYTES 256
#define FAV_HALVES (FAV_THREADS / 16)
#define FAV_KEYS (FAV_TILE / FAV_HALVES)
#define FAV_MAX_DIMS (FAV_MAX_ROW_BYTES / 2)
static_assert(FAV_TILE == 64, "the softmax takes two keys of a tile per lane of a warp");
static_assert(FAV_MAX_HEADS <= FAV_THREADS / 32, "the softmax takes one warp per head");

// The elements of a 16-byte chunk of an F16, BF16 (8) or F32 (4, the rest zeros) row as floats.
__device__ __forceinline__ void chunk_floats(uint4 c, int type, float (&f)[8]) {
    const u32 w[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (type == T_F32) {
            f[i] = __uint_as_float(w[i]);
            f[4 + i] = 0.0f;
        } else {
            const u16 lo = (u16)(w[i] & 0xFFFFu), hi = (u16)(w[i] >> 16);
            f[2 * i] = type == T_F16 ? h2f(lo) : bf2f(lo);
            f[2 * i + 1] = type == T_F16 ? h2f(hi) : bf2f(hi);
        }
    }
}

// The 16-byte chunk at byte `off` of row j of K/V tensor t (head hk, sequence s), zeros when `on`
// is false.
__device__ __forceinline__ uint4 row_chunk(const TD& t, bool on, i64 j, i64 hk, i64 s, int off) {
    return on ? *(const uint4*)(kv_row(t, j, hk, s) + off) : make_uint4(0u, 0u, 0u, 0u);
}

// The shared memory of a k_flash_attn_vec block, laid out for FAV_MAX_HEADS heads.
struct FavShared {
    float qs[FAV_MAX_HEADS][FAV_MAX_DIMS];
    float out[FAV_MAX_HEADS][FAV_MAX_DIMS];
    float red[FAV_HALVES][FAV_MAX_HEADS][FAV_PASS_BYTES / 2];
    float ws[FAV_MAX_HEADS][FAV_TILE];
    float mx[FAV_MAX_HEADS], sum[FAV_MAX_HEADS], alpha[FAV_MAX_HEADS];
};

// Where a k_flash_attn_vec block works: its first query head h0 and head count nh (of one GQA
// group), KV head hk, query iq, sequence s and keys kv0 .. kv1.
struct FavPlace {
    int h0, nh, hk, iq, s, kv0, kv1;
};

// The scores of the keys of tile t0 for the nh <= NH heads into sh.ws (scaled, soft-capped,
// masked; NEG_INF past kv1).
template <int NH>
__device__ __forceinline__ void fav_scores(const TD& q, const TD& k, const TD& m, float sc, float softcap,
                                           float max_bias, int has_mask, const FavPlace& p, int t0, FavShared& sh) {
    const int tid = threadIdx.x, half = tid / 16, l16 = tid % 16;
    const int kes = k.type == T_F32 ? 4 : 2, k_bytes = (int)q.ne[0] * kes;
    float dot[NH][FAV_KEYS];
#pragma unroll
    for (int hh = 0; hh < NH; hh++)
#pragma unroll
        for (int u = 0; u < FAV_KEYS; u++) dot[hh][u] = 0.0f;
    for (int off = 16 * l16; off - 16 * l16 < k_bytes; off += FAV_PASS_BYTES) {
        const bool on = off < k_bytes;
        uint4 raw[FAV_KEYS];
#pragma unroll
        for (int u = 0; u < FAV_KEYS; u++) {
            const int j = t0 + half + FAV_HALVES * u;
            raw[u] = row_chunk(k, on && j < p.kv1, j, p.hk, p.s, off);
        }
        if (!on) continue;
        float f[FAV_KEYS][8];
#pragma unroll
        for (int u = 0; u < FAV_KEYS; u++) chunk_floats(raw[u], k.type, f[u]);
        const int c0 = off / kes;
#pragma unroll
        for (int hh = 0; hh < NH; hh++) {
            if (hh >= p.nh) break;
            float qv[8];
#pragma unroll
            for (int e = 0; e < 8; e++) qv[e] = e < 16 / kes ? sh.qs[hh][c0 + e] : 0.0f;
#pragma unroll
            for (int u = 0; u < FAV_KEYS; u++)
#pragma unroll
                for (int e = 0; e < 8; e++) dot[hh][u] += f[u][e] * qv[e];
        }
    }
#pragma unroll
    for (int hh = 0; hh < NH; hh++)
#pragma unroll
        for (int u = 0; u < FAV_KEYS; u++)
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) dot[hh][u] += WARP_SHFL_XOR(dot[hh][u], o);
    // Lane u < FAV_KEYS of each half-warp turns the dots of its key u into logits.
    if (l16 >= FAV_KEYS) return;
    const int kk = half + FAV_HALVES * l16, j = t0 + kk;
#pragma unroll
    for (int hh = 0; hh < NH; hh++) {
        if (hh >= p.nh) break;
        float mine = 0.0f;
#pragma unroll
        for (int u = 0; u < FAV_KEYS; u++)
            if (l16 == u) mine = dot[hh][u];
        float x = NEG_INF;
        if (j < p.kv1) {
            x = mine * sc;
            if (softcap != 0.0f) x = softcap * tanhf(x);
            if (has_mask) {
                const int h = p.h0 + hh;
                const float mv = load_float(m, j, p.iq, h % m.ne[2], p.s % m.ne[3]);
                x = mv == NEG_INF ? NEG_INF : x + alibi_slope(max_bias, h, (int)q.ne[2]) * mv;
            }
        }
        sh.ws[hh][kk] = x;
    }
}

// Warp hh < nh: head hh's tile maximum, its weights in sh.ws and the running sum and rescale.
__device__ __forceinline__ void fav_softmax(int nh, FavShared& sh) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (warp >= nh) return;
    const float x0 = sh.ws[warp][lane], x1 = sh.ws[warp][lane + 32];
    float tmax = fmaxf(x0, x1);
    for (int o = 16; o > 0; o >>= 1) tmax = fmaxf(tmax, WARP_SHFL_XOR(tmax, o));
    const float old = sh.mx[warp], nm = fmaxf(old, tmax);
    const float p0 = x0 == NEG_INF ? 0.0f : expf(x0 - nm), p1 = x1 == NEG_INF ? 0.0f : expf(x1 - nm);
    sh.ws[warp][lane] = p0;
    sh.ws[warp][lane + 32] = p1;
    float ts = p0 + p1;
    for (int o = 16; o > 0; o >>= 1) ts += WARP_SHFL_XOR(ts, o);
    if (lane == 0) {
        const float a = old == NEG_INF ? 0.0f : expf(old - nm);
        sh.alpha[warp] = a;
        sh.sum[warp] = sh.sum[warp] * a + ts;
        sh.mx[warp] = nm;
    }
}

// The tile's weighted V rows added to sh.out (rescaled by sh.alpha first), one pass of
// FAV_PASS_BYTES of the rows at a time.
template <int NH>
__device__ __forceinline__ void fav_values(const TD& v, const FavPlace& p, int t0, FavShared& sh) {
    const int tid = threadIdx.x, half = tid / 16, l16 = tid % 16;
    const int DV = (int)v.ne[0], ves = v.type == T_F32 ? 4 : 2, v_bytes = DV * ves, v_pass = FAV_PASS_BYTES / ves;
    for (int p0 = 0; p0 < v_bytes; p0 += FAV_PASS_BYTES) {
        const int off = p0 + 16 * l16;
        uint4 raw[FAV_KEYS];
#pragma unroll
        for (int u = 0; u < FAV_KEYS; u++) {
            const int kk = half + FAV_HALVES * u;
            bool used = false;
#pragma unroll
            for (int hh = 0; hh < NH; hh++) used |= hh < p.nh && sh.ws[hh][kk] != 0.0f;
            raw[u] = row_chunk(v, off < v_bytes && used, t0 + kk, p.hk, p.s, off);
        }
        float acc[NH][8];
#pragma unroll
        for (int hh = 0; hh < NH; hh++)
#pragma unroll
            for (int e = 0; e < 8; e++) acc[hh][e] = 0.0f;
#pragma unroll
        for (int u = 0; u < FAV_KEYS; u++) {
            float f[8];
            chunk_floats(raw[u], v.type, f);
#pragma unroll
            for (int hh = 0; hh < NH; hh++) {
                const float wv = hh < p.nh ? sh.ws[hh][half + FAV_HALVES * u] : 0.0f;
                if (wv != 0.0f)
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[hh][e] += wv * f[e];
            }
        }
#pragma unroll
        for (int hh = 0; hh < NH; hh++)
            if (hh < p.nh)
#pragma unroll
                for (int e = 0; e < 8; e++) sh.red[half][hh][8 * l16 + e] = acc[hh][e];
        __syncthreads();
        // Element c of the pass sits at 8 (c / chunk) + c % chunk of the reduction rows (a chunk of
        // 16 bytes holds 8 halves or 4 floats).
        for (int hh = 0; hh < p.nh; hh++) {
            for (int c = tid; c < v_pass; c += FAV_THREADS) {
                const int dv = p0 / ves + c;
                if (dv >= DV) break;
                const int at = ves == 4 ? ((c >> 2) << 3) + (c & 3) : c;
                float a = 0.0f;
#pragma unroll
                for (int hw = 0; hw < FAV_HALVES; hw++) a += sh.red[hw][hh][at];
                sh.out[hh][dv] = sh.out[hh][dv] * sh.alpha[hh] + a;
            }
        }
        __syncthreads();
    }
}

// The body of k_flash_attn_vec for blocks of at most NH heads.
template <int NH>
__device__ __forceinline__ void fav_block(const TD& q, const TD& k, const TD& v, const TD& m, const TD& sk, const TD& d,
                                          float scale, float max_bias, float softcap, int has_mask, int has_sinks,
                                          const FavPlace& p, u64 part, FavShared& sh) {
    const int tid = threadIdx.x, D = (int)q.ne[0], DV = (int)v.ne[0];
    const float sc = softcap != 0.0f ? scale / softcap : scale;
    for (int hh = 0; hh < p.nh; hh++) {
        for (int c = tid; c < D; c += FAV_THREADS) sh.qs[hh][c] = load_float(q, c, p.iq, p.h0 + hh, p.s);
        for (int c = tid; c < DV; c += FAV_THREADS) sh.out[hh][c] = 0.0f;
    }
    if (tid < FAV_MAX_HEADS) {
        sh.mx[tid] = NEG_INF;
        sh.sum[tid] = 0.0f;
    }
    __syncthreads();
    for (int t0 = p.kv0; t0 < p.kv1; t0 += FAV_TILE) {
        fav_scores<NH>(q, k, m, sc, softcap, max_bias, has_mask, p, t0, sh);
        __syncthreads();
        fav_softmax(p.nh, sh);
        __syncthreads();
        fav_values<NH>(v, p, t0, sh);
    }
    if (part) {
        const i64 row0 = p.h0 + d.ne[1] * (p.iq + d.ne[2] * p.s);
        for (int hh = 0; hh < p.nh; hh++) {
            float* out = (float*)part + ((row0 + hh) * gridDim.y + blockIdx.y) * (DV + 2);
            for (int c = tid; c < DV + 2; c += FAV_THREADS) out[c] = c == 0 ? sh.mx[hh] : (c == 1 ? sh.sum[hh] : sh.out[hh][c - 2]);
        }
        return;
    }
    for (int hh = 0; hh < p.nh; hh++) {
        const int h = p.h0 + hh;
        float total = sh.sum[hh], scale_out = 1.0f;
        if (has_sinks) {
            const float sink = load_float(sk, h, 0, 0, 0);
            const float nm = fmaxf(sh.mx[hh], sink);
            scale_out = sh.mx[hh] == NEG_INF ? 0.0f : expf(sh.mx[hh] - nm);
            total = total * scale_out + expf(sink - nm);
        }
        const float inv = total == 0.0f ? 0.0f : scale_out / total;
        for (int dv = tid; dv < DV; dv += FAV_THREADS) store(d, dv, h, p.iq, p.s, sh.out[hh][dv] * inv);
    }
}

// part: 0 for a single split (the block writes the result), else (max, sum, DV accumulators) per
// (row, split) for k_flash_attn_combine. Block x: head block, KV head, query, sequence (fastest
// first); block y: the split. Blocks of one head run the one-head body, of two the two-head one
// (the code of a block of fewer heads is smaller and skips the others' checks).
extern "C" __global__ void k_flash_attn_vec(TD q, TD k, TD v, TD m, TD sk, TD d, float scale, float max_bias,
                                            float softcap, int has_mask, int has_sinks, int heads_per_block,
                                            int kv_per_split, u64 part) { GRID_DEPENDENCY_SYNC();
    __shared__ FavShared sh;
    const u32 kv_heads = (u32)k.ne[2], group = (u32)(q.ne[2] / k.ne[2]);
    const u32 head_blocks = (group + heads_per_block - 1) / heads_per_block;
    u32 b = blockIdx.x;
    const u32 hblk = b % head_blocks;
    b /= head_blocks;
    FavPlace p;
    p.hk = (int)(b % kv_heads);
    b /= kv_heads;
    p.iq = (int)(b % (u32)q.ne[1]);
    p.s = (int)(b / (u32)q.ne[1]);
    p.h0 = p.hk * (int)group + (int)hblk * heads_per_block;
    p.nh = min(heads_per_block, (int)group - (int)hblk * heads_per_block);
    p.kv0 = blockIdx.y * kv_per_split;
    p.kv1 = min((int)k.ne[1], p.kv0 + kv_per_split);
    if (heads_per_block == 1)
        fav_block<1>(q, k, v, m, sk, d, scale, max_bias, softcap, has_mask, has_sinks, p, part, sh);
    else if (heads_per_block == 2)
        fav_block<2>(q, k, v, m, sk, d, scale, max_bias, softcap, has_mask, has_sinks, p, part, sh);
    else
        fav_block<FAV_MAX_HEADS>(q, k, v, m, sk, d, scale, max_bias, softcap, has_mask, has_sinks, p, part, sh);
}

// Most splits whose weights k_flash_attn_combine keeps in shared memory (more are recomputed).
#define FA_COMBINE_SPLITS 1024

// Merges the `splits` partials of each row (one block per row), adds the sink, normalizes. The
// threads take the splits' maxima and sums in parallel (block reductions), keep each split's
// weight in shared memory, then sum the accumulators of every split per dimension with several
// loads in flight.
extern "C" __global__ void k_flash_attn_combine(TD sk, TD d, int has_sinks, int splits, u64 part) { GRID_DEPENDENCY_SYNC();
    __shared__ float weight[FA_COMBINE_SPLITS];
    const i64 r = blockIdx.x;
    const i64 h = r % d.ne[1], iq = (r / d.ne[1]) % d.ne[2], s = r / (d.ne[1] * d.ne[2]);
    const int DV = (int)d.ne[0], stride = DV + 2;
    const float* p = (const float*)part + r * splits * stride;
    const float sink = has_sinks ? load(sk, h, 0, 0, 0) : NEG_INF;
    float mx = NEG_INF;
    for (int i = threadIdx.x; i < splits; i += blockDim.x) mx = fmaxf(mx, p[i * stride]);
    mx = fmaxf(block_max(mx), sink);
    double sum = 0.0;
    if (mx != NEG_INF) {
        for (int i = threadIdx.x; i < splits; i += blockDim.x) {
            const float mi = p[i * stride], w = mi == NEG_INF ? 0.0f : expf(mi - mx);
            if (i < FA_COMBINE_SPLITS) weight[i] = w;
            sum += (double)(w * p[i * stride + 1]);
        }
    }
    float total = (float)block_sum(sum);
    if (has_sinks && mx != NEG_INF) total += expf(sink - mx);
    const float inv = total == 0.0f ? 0.0f : 1.0f / total;
    for (int dv = threadIdx.x; dv < DV; dv += blockDim.x) {
        float a = 0.0f;
        if (mx != NEG_INF) {
#pragma unroll 8
            for (int i = 0; i < splits; i++) {
                float w;
                if (i < FA_COMBINE_SPLITS) {
                    w = weight[i];
                } else {
                    const float mi = p[i * stride];
                    w = mi == NEG_INF ? 0.0f : expf(mi - mx);
                }
                if (w != 0.0f) a += w * p[i * stride + 2 + dv];
            }
        }
        store(d, dv, h, iq, s, a * inv);
    }
}

// Logit of key j for query iq of head h (of n_head), sequence s, from its raw score q.k.
__device__ __forceinline__ float attn_logit(float score, const TD& m, int has_mask, float sc, float softcap,
                                            float slope, i64 j, i64 iq, i64 h, i64 s) {
    float x = score * sc;
    if (softcap != 0.0f) x = softcap * tanhf(x);
    if (!has_mask) return x;
    const float mv = load_float(m, j, iq, h % m.ne[2], s % m.ne[3]);
    return mv == NEG_INF ? NEG_INF : x + slope * mv;
}

// Softmax of the BLAS path: one block per row of a chunk of `chunk_queries` queries (from q0) of
// sequence s. Row r = h * chunk_queries + (iq - q0) of the F32 scores (row stride p.ne[0], n_kv
// used) becomes row r of the probabilities p (F16 or F32), the sink counted in the sum; rows
// without an unmasked key (nor a sink) become zeros.
extern "C" __global__ void k_attn_softmax(u64 scores, TD p, TD m, TD sk, float scale, float max_bias,
                                          float softcap, int has_mask, int has_sinks, int n_kv, int chunk_queries,
                                          int q0, int s) { GRID_DEPENDENCY_SYNC();
    const i64 r = blockIdx.x;
    const int n_head = gridDim.x / chunk_queries, h = (int)(r / chunk_queries);
    const i64 iq = q0 + r % chunk_queries;
    const float* row = (const float*)scores + r * p.ne[0];
    const float slope = alibi_slope(max_bias, h, n_head);
    const float sc = softcap != 0.0f ? scale / softcap : scale;
    float mx = NEG_INF, sum = 0.0f;
    for (int j = threadIdx.x; j < n_kv; j += blockDim.x) {
        const float x = attn_logit(row[j], m, has_mask, sc, softcap, slope, j, iq, h, s);
        if (x > mx) {
            sum = sum * expf(mx - x) + 1.0f;
            mx = x;
        } else if (x != NEG_INF) {
            sum += expf(x - mx);
        }
    }
    float top = block_max(mx);
    float total = (float)block_sum(mx == NEG_INF ? 0.0 : (double)(sum * expf(mx - top)));
    if (has_sinks) {
        const float sink = load(sk, h, 0, 0, 0);
        const float nm = fmaxf(top, sink);
        total = total * expf(top - nm) + expf(sink - nm);
        top = nm;
    }
    const float inv = total == 0.0f ? 0.0f : 1.0f / total;
    for (int j = threadIdx.x; j < n_kv; j += blockDim.x) {
        const float x = attn_logit(row[j], m, has_mask, sc, softcap, slope, j, iq, h, s);
        store(p, j, r, 0, 0, x == NEG_INF ? 0.0f : expf(x - top) * inv);
    }
}
