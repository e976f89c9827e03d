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
// are used, and a half-warp's dots are summed by halving exchanges (8 shuffles for 8 keys). Scores
// go through shared memory; a tile whose keys are all masked (the padding of a KV cache) stops
// there. One warp per head updates that head's online softmax, then the half-warps accumulate the
// weighted V chunks, summed in a fixed order into the block's accumulator. Blocks over F16 K and V
// run a body with the element type fixed; others read it at run time. Splits write partials for
// k_flash_attn_combine.
#define FAV_THREADS 128
#define FAV_TILE 64
#define FAV_MAX_HEADS 4
#define FAV_MAX_ROW_BYTES 1024
#define FAV_PASS_BYTES 256
#define FAV_HALVES (FAV_THREADS / 16)
#define FAV_KEYS (FAV_TILE / FAV_HALVES)
#define FAV_MAX_DIMS (FAV_MAX_ROW_BYTES / 2)
// The element type parameter of the bodies that read K's and V's types at run time.
#define FAV_ANY_TYPE (-1)
static_assert(FAV_TILE == 64, "the softmax takes two keys of a tile per lane of a warp");
static_assert(FAV_KEYS == 8, "a half-warp's dots are summed by three halving exchanges of 8 keys");
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

// The sums over the 16 lanes of a half-warp of each lane's FAV_KEYS dots x[u], in three exchanges
// that each halve what a lane holds (partner lanes keep opposite halves) and a last one: lane l16
// ends with the whole dot of key l16 / 2.
__device__ __forceinline__ float half_warp_key_sums(const float (&x)[FAV_KEYS], int l16) {
    const bool b3 = (l16 & 8) != 0, b2 = (l16 & 4) != 0, b1 = (l16 & 2) != 0;
    float y[4], z[2];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float keep = b3 ? x[i + 4] : x[i], give = b3 ? x[i] : x[i + 4];
        y[i] = keep + WARP_SHFL_XOR(give, 8);
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const float keep = b2 ? y[i + 2] : y[i], give = b2 ? y[i] : y[i + 2];
        z[i] = keep + WARP_SHFL_XOR(give, 4);
    }
    const float keep = b1 ? z[1] : z[0], give = b1 ? z[0] : z[1];
    const float w = keep + WARP_SHFL_XOR(give, 2);
    return w + WARP_SHFL_XOR(w, 1);
}

// Element j of a mask row starting at `row` (elements `nb0` bytes apart, F32, F16 or BF16).
__device__ __forceinline__ float mask_at(const u8* row, i64 nb0, int type, int j) {
    const u8* e = row + j * nb0;
    if (type == T_F32) return *(const float*)e;
    return type == T_F16 ? h2f(ld16(e)) : bf2f(ld16(e));
}

// The shared memory of a k_flash_attn_vec block, laid out for FAV_MAX_HEADS heads. `live` is the
// first key of the last tile with an unmasked key.
struct FavShared {
    float qs[FAV_MAX_HEADS][FAV_MAX_DIMS];
    float out[FAV_MAX_HEADS][FAV_MAX_DIMS];
    float red[FAV_HALVES][FAV_MAX_HEADS][FAV_PASS_BYTES / 2];
    float ws[FAV_MAX_HEADS][FAV_TILE];
    float mx[FAV_MAX_HEADS], sum[FAV_MAX_HEADS], alpha[FAV_MAX_HEADS];
    int live;
};

// Where a k_flash_attn_vec block works: its first query head h0 and head count nh (of one GQA
// group), KV head hk, query iq, sequence s and keys kv0 .. kv1; key 0 of its K and V rows, each
// head's mask row (all one row when the mask has one head) and ALiBi slope.
struct FavPlace {
    int h0, nh, hk, iq, s, kv0, kv1;
    const u8* k0;
    const u8* v0;
    const u8* mrow[FAV_MAX_HEADS];
    float slope[FAV_MAX_HEADS];
};

// The scores of the keys of tile t0 for the nh <= NH heads into sh.ws (scaled, soft-capped,
// masked; NEG_INF past kv1); sh.live = t0 when one of them is unmasked. KT: K's element type, or
// FAV_ANY_TYPE.
template <int NH, int KT>
__device__ __forceinline__ void fav_scores(const TD& q, const TD& k, const TD& m, float sc, float softcap,
                                           int has_mask, const FavPlace& p, int t0, FavShared& sh) {
    const int tid = threadIdx.x, half = tid / 16, l16 = tid % 16;
    const int kt = KT == FAV_ANY_TYPE ? k.type : KT;
    const int kes = kt == T_F32 ? 4 : 2, k_bytes = (int)q.ne[0] * kes;
    const u32 k_stride = (u32)k.nb[1];
    // Lane 2u of each half-warp scores key u of the half-warp's keys; its mask value (of the first
    // head) is loaded with the K rows.
    const int kk = half + FAV_HALVES * (l16 >> 1), j = t0 + kk;
    const bool in = j < p.kv1, scorer = (l16 & 1) == 0;
    const float mask0 = has_mask && in && scorer ? mask_at(p.mrow[0], m.nb[0], m.type, j) : 0.0f;
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
            const int ju = t0 + half + FAV_HALVES * u;
            raw[u] = on && ju < p.kv1 ? *(const uint4*)(p.k0 + (u64)(u32)ju * k_stride + off) : make_uint4(0u, 0u, 0u, 0u);
        }
        if (!on) continue;
        float f[FAV_KEYS][8];
#pragma unroll
        for (int u = 0; u < FAV_KEYS; u++) chunk_floats(raw[u], kt, f[u]);
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
    float score[NH];
#pragma unroll
    for (int hh = 0; hh < NH; hh++) score[hh] = hh < p.nh ? half_warp_key_sums(dot[hh], l16) : 0.0f;
    if (!scorer) return;
    bool live = false;
#pragma unroll
    for (int hh = 0; hh < NH; hh++) {
        if (hh >= p.nh) break;
        float x = NEG_INF;
        if (in) {
            x = score[hh] * sc;
            if (softcap != 0.0f) x = softcap * tanhf(x);
            if (has_mask) {
                const float mv = p.mrow[hh] == p.mrow[0] ? mask0 : mask_at(p.mrow[hh], m.nb[0], m.type, j);
                x = mv == NEG_INF ? NEG_INF : x + p.slope[hh] * mv;
            }
        }
        live |= x != NEG_INF;
        sh.ws[hh][kk] = x;
    }
    if (live) sh.live = t0;
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
// FAV_PASS_BYTES of the rows at a time. VT: V's element type, or FAV_ANY_TYPE.
template <int NH, int VT>
__device__ __forceinline__ void fav_values(const TD& v, const FavPlace& p, int t0, FavShared& sh) {
    const int tid = threadIdx.x, half = tid / 16, l16 = tid % 16;
    const int vt = VT == FAV_ANY_TYPE ? v.type : VT;
    const int DV = (int)v.ne[0], ves = vt == T_F32 ? 4 : 2, v_bytes = DV * ves, v_pass = FAV_PASS_BYTES / ves;
    const u32 v_stride = (u32)v.nb[1];
    for (int p0 = 0; p0 < v_bytes; p0 += FAV_PASS_BYTES) {
        const int off = p0 + 16 * l16;
        uint4 raw[FAV_KEYS];
#pragma unroll
        for (int u = 0; u < FAV_KEYS; u++) {
            const int kk = half + FAV_HALVES * u;
            bool used = false;
#pragma unroll
            for (int hh = 0; hh < NH; hh++) used |= hh < p.nh && sh.ws[hh][kk] != 0.0f;
            raw[u] = off < v_bytes && used ? *(const uint4*)(p.v0 + (u64)(u32)(t0 + kk) * v_stride + off)
                                           : make_uint4(0u, 0u, 0u, 0u);
        }
        float acc[NH][8];
#pragma unroll
        for (int hh = 0; hh < NH; hh++)
#pragma unroll
            for (int e = 0; e < 8; e++) acc[hh][e] = 0.0f;
#pragma unroll
        for (int u = 0; u < FAV_KEYS; u++) {
            float f[8];
            chunk_floats(raw[u], vt, f);
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

// The block's result: its partial (max, sum, accumulator per head) for k_flash_attn_combine when
// `part` is set, else the normalized rows of d (the sink added).
__device__ __forceinline__ void fav_write(const TD& sk, const TD& d, int DV, int has_sinks, const FavPlace& p,
                                          u64 part, FavShared& sh) {
    const int tid = threadIdx.x;
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

// The body of k_flash_attn_vec for blocks of at most NH heads over K and V of element type T (or
// FAV_ANY_TYPE).
template <int NH, int T>
__device__ __forceinline__ void fav_block(const TD& q, const TD& k, const TD& v, const TD& m, const TD& sk, const TD& d,
                                          float scale, float softcap, int has_mask, int has_sinks, const FavPlace& p,
                                          u64 part, FavShared& sh) {
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
    if (tid == 0) sh.live = -1;
    __syncthreads();
    for (int t0 = p.kv0; t0 < p.kv1; t0 += FAV_TILE) {
        fav_scores<NH, T>(q, k, m, sc, softcap, has_mask, p, t0, sh);
        __syncthreads();
        // Every key of the tile masked: nothing to add (no thread writes sh.live before all have
        // read it, since a live tile holds them at the next barrier).
        if (sh.live != t0) continue;
        fav_softmax(p.nh, sh);
        __syncthreads();
        fav_values<NH, T>(v, p, t0, sh);
    }
    fav_write(sk, d, DV, has_sinks, p, part, sh);
}

// fav_block for NH heads with the element type fixed when K and V are both F16.
template <int NH>
__device__ __forceinline__ void fav_typed(const TD& q, const TD& k, const TD& v, const TD& m, const TD& sk, const TD& d,
                                          float scale, float softcap, int has_mask, int has_sinks, const FavPlace& p,
                                          u64 part, FavShared& sh) {
    if (k.type == T_F16 && v.type == T_F16)
        fav_block<NH, T_F16>(q, k, v, m, sk, d, scale, softcap, has_mask, has_sinks, p, part, sh);
    else
        fav_block<NH, FAV_ANY_TYPE>(q, k, v, m, sk, d, scale, softcap, has_mask, has_sinks, p, part, sh);
}

// Where block (blockIdx.x, blockIdx.y) of k_flash_attn_vec works (see the kernel).
__device__ __forceinline__ FavPlace fav_place(const TD& q, const TD& k, const TD& v, const TD& m, float max_bias,
                                              int heads_per_block, int kv_per_split) {
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
    p.k0 = kv_row(k, 0, p.hk, p.s);
    p.v0 = kv_row(v, 0, p.hk, p.s);
    const int mask_heads = (int)m.ne[2] > 0 ? (int)m.ne[2] : 1, mask_seqs = (int)m.ne[3] > 0 ? (int)m.ne[3] : 1;
    for (int hh = 0; hh < FAV_MAX_HEADS; hh++) {
        const int h = p.h0 + min(hh, p.nh - 1);
        p.mrow[hh] = (const u8*)m.ptr + p.iq * m.nb[1] + (h % mask_heads) * m.nb[2] + (p.s % mask_seqs) * m.nb[3];
        p.slope[hh] = alibi_slope(max_bias, h, (int)q.ne[2]);
    }
    return p;
}

// part: 0 for a single split (the block writes the result), else (max, sum, DV accumulators) per
// (row, split) for k_flash_attn_combine. Block x: head block, KV head, query, sequence (fastest
// first); block y: the split. Blocks of one head run the one-head body, of two the two-head one
// (the code of a block of fewer heads is smaller and skips the others' checks).
extern "C" __global__ void __launch_bounds__(FAV_THREADS, 1) k_flash_attn_vec(TD q, TD k, TD v, TD m, TD sk, TD d, float scale, float max_bias,
                                            float softcap, int has_mask, int has_sinks, int heads_per_block,
                                            int kv_per_split, u64 part) { GRID_DEPENDENCY_SYNC();
    __shared__ FavShared sh;
    const FavPlace p = fav_place(q, k, v, m, max_bias, heads_per_block, kv_per_split);
    if (heads_per_block == 1)
        fav_typed<1>(q, k, v, m, sk, d, scale, softcap, has_mask, has_sinks, p, part, sh);
    else if (heads_per_block == 2)
        fav_typed<2>(q, k, v, m, sk, d, scale, softcap, has_mask, has_sinks, p, part, sh);
    else
        fav_typed<FAV_MAX_HEADS>(q, k, v, m, sk, d, scale, softcap, has_mask, has_sinks, p, part, sh);
}

// Threads per k_flash_attn_combine block (ROW_THREADS in dispatch/attention.rs).
#define FA_COMBINE_THREADS 256
// Most splits whose weights k_flash_attn_combine keeps in shared memory (more are recomputed).
#define FA_COMBINE_SPLITS 1024

// The weight of a split whose maximum is mi against the row's maximum mx (0 for an empty split).
__device__ __forceinline__ float split_weight(float mi, float mx) { return mi == NEG_INF ? 0.0f : expf(mi - mx); }

// Merges the `splits` partials of each row (one block per row), adds the sink, normalizes. The
// threads take the splits' maxima and sums in parallel (block reductions) and keep each split's
// weight in shared memory; then groups of DV threads (as many as fit the block) take every
// groups-th split, each thread one dimension, loads unconditional so that several are in flight,
// and the groups' sums meet in shared memory.
extern "C" __global__ void k_flash_attn_combine(TD sk, TD d, int has_sinks, int splits, u64 part) { GRID_DEPENDENCY_SYNC();
    __shared__ float weight[FA_COMBINE_SPLITS];
    __shared__ float red[FA_COMBINE_THREADS];
    const i64 r = blockIdx.x;
    const i64 h = r % d.ne[1], iq = (r / d.ne[1]) % d.ne[2], s = r / (d.ne[1] * d.ne[2]);
    const int DV = (int)d.ne[0], stride = DV + 2, tid = threadIdx.x;
    const float* p = (const float*)part + r * splits * stride;
    const float sink = has_sinks ? load(sk, h, 0, 0, 0) : NEG_INF;
    float mx = NEG_INF;
    for (int i = tid; i < splits; i += FA_COMBINE_THREADS) mx = fmaxf(mx, p[i * stride]);
    mx = fmaxf(block_max(mx), sink);
    double sum = 0.0;
    if (mx != NEG_INF) {
        for (int i = tid; i < splits; i += FA_COMBINE_THREADS) {
            const float w = split_weight(p[i * stride], mx);
            if (i < FA_COMBINE_SPLITS) weight[i] = w;
            sum += (double)(w * p[i * stride + 1]);
        }
    }
    float total = (float)block_sum(sum);
    if (has_sinks && mx != NEG_INF) total += expf(sink - mx);
    const float inv = total == 0.0f ? 0.0f : 1.0f / total;
    const int groups = DV < FA_COMBINE_THREADS ? FA_COMBINE_THREADS / DV : 1, g = tid / DV;
    for (int d0 = 0; d0 < DV; d0 += FA_COMBINE_THREADS) {
        const int dv = d0 + tid % DV;
        float a = 0.0f;
        if (mx != NEG_INF && g < groups && dv < DV) {
#pragma unroll 8
            for (int i = g; i < splits; i += groups) {
                const float w = i < FA_COMBINE_SPLITS ? weight[i] : split_weight(p[i * stride], mx);
                a += w * p[i * stride + 2 + dv];
            }
        }
        if (groups == 1) {
            if (dv < DV) store(d, dv, h, iq, s, a * inv);
            continue;
        }
        if (g < groups) red[tid] = a;
        __syncthreads();
        if (tid < DV) {
            float t = 0.0f;
            for (int k = 0; k < groups; k++) t += red[k * DV + tid];
            store(d, tid, h, iq, s, t * inv);
        }
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
