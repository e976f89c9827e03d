// flash_attn_ext. Three paths (dispatch/attention.rs picks one):
// - k_flash_attn_vec (few queries: decode; any shape without batched BLAS; F16/BF16/F32 K and V in
//   rows of whole 16-byte chunks): in attention_vec.cu, described there.
// - k_flash_attn (the same shapes with any other K/V): one block of FA_THREADS threads per (head,
//   query, sequence) and KV split. Keys are taken in tiles of FA_THREADS (one score per thread),
//   with an online softmax. Each warp accumulates the values of its quarter of the tile, each lane
//   FA_DIMS dims per 128 (coalesced rows); the warps' accumulators meet in shared memory at the
//   end. K/V of any loadable type; F16 and F32 rows are read directly (vector loads for aligned
//   F16).
// With several splits (few query rows, long KV) each block of either kernel writes its partial
// (max, sum, accumulator) and k_flash_attn_combine (attention_vec.cu) merges them, adds the sink
// and normalizes.
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

// The partials of k_flash_attn_combine for `rows` rows of DV values, each in `splits` splits:
// the accumulators of row r, split i at (r * splits + i) * DV, then every (row, split)'s maximum,
// then every sum.
__device__ __forceinline__ float* part_acc(u64 part, i64 r, int i, int splits, int DV) {
    return (float*)part + (r * splits + i) * DV;
}
__device__ __forceinline__ float* part_max(u64 part, i64 rows, i64 r, int i, int splits, int DV) {
    return (float*)part + rows * splits * DV + r * splits + i;
}
__device__ __forceinline__ float* part_sum(u64 part, i64 rows, i64 r, int i, int splits, int DV) {
    return part_max(part, rows, r, i, splits, DV) + rows * splits;
}

// The output scale of one head of a single-split block (maximum mx, sum of weights sum): the
// inverse of the sum, the sink counted when the node has sinks; 0 when nothing was seen.
__device__ __forceinline__ float attn_out_scale(const TD& sk, int has_sinks, i64 h, float mx, float sum) {
    float total = sum, scale_out = 1.0f;
    if (has_sinks) {
        const float sink = load(sk, h, 0, 0, 0);
        const float nm = fmaxf(mx, sink);
        scale_out = mx == NEG_INF ? 0.0f : expf(mx - nm);
        total = total * scale_out + expf(sink - nm);
    }
    return total == 0.0f ? 0.0f : scale_out / total;
}

// part: 0 for a single split (the block writes the result), else the partials of
// k_flash_attn_combine (see part_acc).
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
        const i64 rows = d.ne[1] * d.ne[2] * d.ne[3];
        if (threadIdx.x == 0) {
            *part_max(part, rows, r, blockIdx.y, gridDim.y, DV) = mx;
            *part_sum(part, rows, r, blockIdx.y, gridDim.y, DV) = sum;
        }
        float* p = part_acc(part, r, blockIdx.y, gridDim.y, DV);
        for (int dv = threadIdx.x; dv < DV; dv += FA_THREADS)
            p[dv] = red[0][dv] + red[1][dv] + red[2][dv] + red[3][dv];
        return;
    }
    const float inv = attn_out_scale(sk, has_sinks, h, mx, sum);
    for (int dv = threadIdx.x; dv < DV; dv += FA_THREADS)
        store(d, dv, h, iq, s, (red[0][dv] + red[1][dv] + red[2][dv] + red[3][dv]) * inv);
}

// Element of a float tensor (F32, F16 or BF16: queries, masks, sinks) without the block formats.
__device__ __forceinline__ float load_float(const TD& t, i64 i0, i64 i1, i64 i2, i64 i3) {
    const u8* p = (const u8*)t.ptr + i0 * t.nb[0] + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
    if (t.type == T_F32) return *(const float*)p;
    return t.type == T_F16 ? h2f(ld16(p)) : bf2f(ld16(p));
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
