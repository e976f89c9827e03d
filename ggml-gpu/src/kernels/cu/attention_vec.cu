// Decode attention: k_flash_attn_vec (few queries over F16/BF16/F32 K and V whose rows are whole
// 16-byte chunks) and k_flash_attn_combine, which merges the per-split partials of it and of
// k_flash_attn (attention.cu).
//
// A k_flash_attn_vec block takes `heads_per_block` query heads of one GQA group (they share every
// K/V load), one query, one sequence, and the keys of its split. It first finds the keys of the
// split between the first and the last unmasked one (the padded tail of a KV cache and the keys
// before a sliding window cost nothing then), and takes them in tiles of FAV_TILE keys:
// - half-warp `half` handles keys half, half + FAV_HALVES, ... of a tile, 16 bytes of each row per
//   lane and pass of FAV_PASS_BYTES; the first pass of both K and V is loaded at the top of the
//   tile, all FAV_KEYS keys at once, so that V's loads are in flight while the scores are made;
// - a half-warp's dots are summed by halving exchanges (8 shuffles for 8 keys), the scores go
//   through shared memory (two buffers, so one barrier orders a tile's scores before its softmax
//   and one its weights before their use); a tile whose keys are all masked stops there;
// - one warp per head updates that head's online softmax;
// - every thread keeps its own weighted sums of V (its 16-byte chunk of each pass, its keys) in
//   registers across the tiles, rescaled by the softmax; the half-warps' sums meet once, at the
//   end of the split.
// Blocks over F16 K and V run a body with the element type fixed; others read it at run time (one
// kernel per body, see FAV_KERNEL).
// With several splits each block writes its partial for k_flash_attn_combine.
#define FAV_THREADS 128
#define FAV_TILE 64
#define FAV_MAX_HEADS 4
#define FAV_MAX_ROW_BYTES 1024
#define FAV_PASS_BYTES 256
#define FAV_HALVES (FAV_THREADS / 16)
#define FAV_KEYS (FAV_TILE / FAV_HALVES)
#define FAV_MAX_DIMS (FAV_MAX_ROW_BYTES / 2)
// Heads times V passes of a block's per-thread V sums (the host caps the heads per block).
#define FAV_SLOTS 4
// The element type parameter of the bodies that read K's and V's types at run time.
#define FAV_ANY_TYPE (-1)
static_assert(FAV_TILE == 64, "the softmax takes two keys of a tile per lane of a warp");
static_assert(FAV_KEYS == 8, "a half-warp's dots are summed by three halving exchanges of 8 keys");
static_assert(FAV_MAX_HEADS <= FAV_THREADS / 32, "the softmax takes one warp per head");
static_assert(FAV_SLOTS == FAV_MAX_HEADS, "one V pass per head in a block of the most heads");

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

// Attention's result value x, element `at` of the rows of d one after another, rounded to 8 bits
// into xq / xd for the quantized product after it when xq is set (no k_quantize_q8 launch there).
// The host asks for it only where d is contiguous and its rows are whole units of 32, so the 32
// lanes of a warp hold one unit: every lane of a warp that writes result values comes here.
__device__ __forceinline__ void attn_round_q8(float x, u64 at, u64 xq, u64 xd) {
    if (!xq) return;
    const float v[1] = {x};
    round_q8<1>(v, true, at, xq, xd);
}

// Element j of a mask row starting at `row` (elements `nb0` bytes apart, F32, F16 or BF16).
__device__ __forceinline__ float mask_at(const u8* row, i64 nb0, int type, int j) {
    const u8* e = row + j * nb0;
    if (type == T_F32) return *(const float*)e;
    return type == T_F16 ? h2f(ld16(e)) : bf2f(ld16(e));
}

// The shared memory of a k_flash_attn_vec block, laid out for FAV_MAX_HEADS heads: the queries,
// two buffers of scores (then weights) with their rescales and live flags (`live[b]` is the first
// key of the last tile scored into buffer b with an unmasked key), each head's running maximum and
// sum, the first and last unmasked key each group of 32 threads found, and the half-warps' V sums.
struct FavShared {
    float qs[FAV_MAX_HEADS][FAV_MAX_DIMS];
    float ws[2][FAV_MAX_HEADS][FAV_TILE];
    float alpha[2][FAV_MAX_HEADS];
    float mx[FAV_MAX_HEADS], sum[FAV_MAX_HEADS];
    int live[2];
    int first[FAV_THREADS / 32], last[FAV_THREADS / 32];
    float red[FAV_HALVES][FAV_SLOTS][FAV_PASS_BYTES / 2];
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

// The keys [lo, hi) of the block's split from its first to its last key that some head of the
// block sees unmasked (empty when there is none; the whole split without a mask or when it is a
// single tile). sh_first and
// sh_last: shared memory for each group of 32 threads' finds (FAV_THREADS / 32 each).
__device__ __forceinline__ void fav_live_keys(const TD& m, int has_mask, const FavPlace& p, int* sh_first,
                                              int* sh_last, int& lo, int& hi) {
    lo = p.kv0;
    hi = p.kv1;
    // A split of one tile gains nothing from the scan: the tile's scores find its masked keys.
    if (!has_mask || p.kv1 - p.kv0 <= FAV_TILE) return;
    const int tid = threadIdx.x;
    int first = p.kv1, last = p.kv0 - 1;
    for (int j = p.kv0 + tid; j < p.kv1; j += FAV_THREADS) {
        bool live = false;
        for (int hh = 0; hh < p.nh; hh++)
            if (hh == 0 || p.mrow[hh] != p.mrow[0]) live |= mask_at(p.mrow[hh], m.nb[0], m.type, j) != NEG_INF;
        if (live) {
            first = min(first, j);
            last = j;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        first = min(first, WARP_SHFL_XOR(first, o));
        last = max(last, WARP_SHFL_XOR(last, o));
    }
    if (tid % 32 == 0) {
        sh_first[tid / 32] = first;
        sh_last[tid / 32] = last;
    }
    __syncthreads();
    first = p.kv1;
    last = p.kv0 - 1;
    for (int g = 0; g < FAV_THREADS / 32; g++) {
        first = min(first, sh_first[g]);
        last = max(last, sh_last[g]);
    }
    if (last < first) {
        lo = hi = p.kv0;
    } else {
        lo = first;
        hi = last + 1;
    }
}

// The first pass of the keys of tile t0 (this thread's FAV_KEYS rows, 16 bytes each at `off`) of
// rows `bytes` long, `stride` apart from `row0`; zeros past hi or the row.
__device__ __forceinline__ void fav_load(const u8* row0, u32 stride, int bytes, int off, int t0, int hi,
                                         uint4 (&raw)[FAV_KEYS]) {
    const int half = threadIdx.x / 16;
#pragma unroll
    for (int u = 0; u < FAV_KEYS; u++) {
        const int j = t0 + half + FAV_HALVES * u;
        raw[u] = off < bytes && j < hi ? *(const uint4*)(row0 + (u64)(u32)j * stride + off) : make_uint4(0u, 0u, 0u, 0u);
    }
}

// The scores of the keys of tile t0 for the nh <= NH heads into ws (scaled, soft-capped, masked;
// NEG_INF from hi on); live = t0 when one of them is unmasked. kraw: the first pass of the K rows.
// KT: K's element type, or FAV_ANY_TYPE.
template <int NH, int KT>
__device__ __forceinline__ void fav_scores(const TD& q, const TD& k, const TD& m, float sc, float softcap,
                                           int has_mask, const FavPlace& p, int t0, int hi, uint4 (&kraw)[FAV_KEYS],
                                           float (&ws)[FAV_MAX_HEADS][FAV_TILE], int& live, FavShared& sh) {
    const int tid = threadIdx.x, half = tid / 16, l16 = tid % 16;
    const int kt = KT == FAV_ANY_TYPE ? k.type : KT;
    const int kes = kt == T_F32 ? 4 : 2, k_bytes = (int)q.ne[0] * kes;
    // Lane 2u of each half-warp scores key u of the half-warp's keys.
    const int kk = half + FAV_HALVES * (l16 >> 1), j = t0 + kk;
    const bool in = j < hi, scorer = (l16 & 1) == 0;
    const float mask0 = has_mask && in && scorer ? mask_at(p.mrow[0], m.nb[0], m.type, j) : 0.0f;
    float dot[NH][FAV_KEYS];
#pragma unroll
    for (int hh = 0; hh < NH; hh++)
#pragma unroll
        for (int u = 0; u < FAV_KEYS; u++) dot[hh][u] = 0.0f;
    for (int p0 = 0; p0 < k_bytes; p0 += FAV_PASS_BYTES) {
        const int off = p0 + 16 * l16;
        if (p0 > 0) fav_load(p.k0, (u32)k.nb[1], k_bytes, off, t0, hi, kraw);
        if (off >= k_bytes) continue;
        const int c0 = off / kes;
        float qv[NH][8];
#pragma unroll
        for (int hh = 0; hh < NH; hh++)
#pragma unroll
            for (int e = 0; e < 8; e++) qv[hh][e] = hh < p.nh && e < 16 / kes ? sh.qs[hh][c0 + e] : 0.0f;
#pragma unroll
        for (int u = 0; u < FAV_KEYS; u++) {
            float f[8];
            chunk_floats(kraw[u], kt, f);
#pragma unroll
            for (int hh = 0; hh < NH; hh++)
#pragma unroll
                for (int e = 0; e < 8; e++) dot[hh][u] += f[e] * qv[hh][e];
        }
    }
    float score[NH];
#pragma unroll
    for (int hh = 0; hh < NH; hh++) score[hh] = hh < p.nh ? half_warp_key_sums(dot[hh], l16) : 0.0f;
    if (!scorer) return;
    bool any = false;
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
        any |= x != NEG_INF;
        ws[hh][kk] = x;
    }
    if (any) live = t0;
}

// Warp hh < nh: head hh's tile maximum, its weights in ws and the running sum, and its rescale.
__device__ __forceinline__ void fav_softmax(int nh, float (&ws)[FAV_MAX_HEADS][FAV_TILE], float (&alpha)[FAV_MAX_HEADS],
                                            FavShared& sh) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (warp >= nh) return;
    const float x0 = ws[warp][lane], x1 = ws[warp][lane + 32];
    float tmax = fmaxf(x0, x1);
    for (int o = 16; o > 0; o >>= 1) tmax = fmaxf(tmax, WARP_SHFL_XOR(tmax, o));
    const float old = sh.mx[warp], nm = fmaxf(old, tmax);
    const float p0 = x0 == NEG_INF ? 0.0f : expf(x0 - nm), p1 = x1 == NEG_INF ? 0.0f : expf(x1 - nm);
    ws[warp][lane] = p0;
    ws[warp][lane + 32] = p1;
    float ts = p0 + p1;
    for (int o = 16; o > 0; o >>= 1) ts += WARP_SHFL_XOR(ts, o);
    if (lane == 0) {
        const float a = old == NEG_INF ? 0.0f : expf(old - nm);
        alpha[warp] = a;
        sh.sum[warp] = sh.sum[warp] * a + ts;
        sh.mx[warp] = nm;
    }
}

// This thread's V sums acc[head][pass] rescaled by alpha and the tile's weighted V rows added
// (keys of weight 0 skipped: a cache's unwritten rows may hold anything). vraw: the first pass of
// the V rows. VT: V's element type, or FAV_ANY_TYPE.
template <int NH, int VT>
__device__ __forceinline__ void fav_values(const TD& v, const FavPlace& p, int t0, int hi, uint4 (&vraw)[FAV_KEYS],
                                           const float (&ws)[FAV_MAX_HEADS][FAV_TILE],
                                           const float (&alpha)[FAV_MAX_HEADS],
                                           float (&acc)[NH][FAV_SLOTS / NH][8]) {
    const int half = threadIdx.x / 16, l16 = threadIdx.x % 16;
    const int vt = VT == FAV_ANY_TYPE ? v.type : VT;
    const int v_bytes = (int)v.ne[0] * (vt == T_F32 ? 4 : 2);
    float w[NH][FAV_KEYS];
#pragma unroll
    for (int hh = 0; hh < NH; hh++) {
        const float a = hh < p.nh ? alpha[hh] : 0.0f;
#pragma unroll
        for (int u = 0; u < FAV_KEYS; u++) w[hh][u] = hh < p.nh ? ws[hh][half + FAV_HALVES * u] : 0.0f;
#pragma unroll
        for (int ps = 0; ps < FAV_SLOTS / NH; ps++)
#pragma unroll
            for (int e = 0; e < 8; e++) acc[hh][ps][e] *= a;
    }
#pragma unroll
    for (int ps = 0; ps < FAV_SLOTS / NH; ps++) {
        const int off = ps * FAV_PASS_BYTES + 16 * l16;
        if (ps * FAV_PASS_BYTES >= v_bytes) break;
        if (ps > 0) fav_load(p.v0, (u32)v.nb[1], v_bytes, off, t0, hi, vraw);
        if (off >= v_bytes) continue;
#pragma unroll
        for (int u = 0; u < FAV_KEYS; u++) {
            bool used = false;
#pragma unroll
            for (int hh = 0; hh < NH; hh++) used |= w[hh][u] != 0.0f;
            if (!used) continue;
            float f[8];
            chunk_floats(vraw[u], vt, f);
#pragma unroll
            for (int hh = 0; hh < NH; hh++)
                if (w[hh][u] != 0.0f)
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[hh][ps][e] += w[hh][u] * f[e];
        }
    }
}

// The block's result from the threads' V sums: its partial (max, sum, accumulator per head) for
// k_flash_attn_combine when `part` is set, else the normalized rows of d (the sink added), with xq
// set also rounded to 8 bits (d contiguous, rows of whole units of 32: see attn_round_q8).
template <int NH>
__device__ __forceinline__ void fav_write(const TD& v, const TD& sk, const TD& d, int has_sinks, const FavPlace& p,
                                          u64 part, u64 xq, u64 xd, const float (&acc)[NH][FAV_SLOTS / NH][8],
                                          FavShared& sh) {
    const int tid = threadIdx.x, half = tid / 16, l16 = tid % 16;
    const int DV = (int)v.ne[0], ves = v.type == T_F32 ? 4 : 2, v_pass = FAV_PASS_BYTES / ves;
#pragma unroll
    for (int hh = 0; hh < NH; hh++)
#pragma unroll
        for (int ps = 0; ps < FAV_SLOTS / NH; ps++)
#pragma unroll
            for (int e = 0; e < 8; e++) sh.red[half][hh * (FAV_SLOTS / NH) + ps][8 * l16 + e] = acc[hh][ps][e];
    __syncthreads();
    const i64 rows = d.ne[1] * d.ne[2] * d.ne[3], row0 = p.h0 + d.ne[1] * (p.iq + d.ne[2] * p.s);
    for (int hh = 0; hh < p.nh; hh++) {
        const int h = p.h0 + hh;
        float inv = 1.0f;
        if (part) {
            if (tid == 0) {
                *part_max(part, rows, row0 + hh, blockIdx.y, gridDim.y, DV) = sh.mx[hh];
                *part_sum(part, rows, row0 + hh, blockIdx.y, gridDim.y, DV) = sh.sum[hh];
            }
        } else {
            inv = attn_out_scale(sk, has_sinks, h, sh.mx[hh], sh.sum[hh]);
        }
        float* out = part ? part_acc(part, row0 + hh, blockIdx.y, gridDim.y, DV) : 0;
        for (int dv = tid; dv < DV; dv += FAV_THREADS) {
            // Element c of a pass sits at 8 (c / chunk) + c % chunk of its sums (a chunk of 16
            // bytes holds 8 halves or 4 floats).
            const int ps = dv / v_pass, c = dv - ps * v_pass;
            const int at = ves == 4 ? ((c >> 2) << 3) + (c & 3) : c;
            float a = 0.0f;
#pragma unroll
            for (int hw = 0; hw < FAV_HALVES; hw++) a += sh.red[hw][hh * (FAV_SLOTS / NH) + ps][at];
            if (part) {
                out[dv] = a;
            } else {
                store(d, dv, h, p.iq, p.s, a * inv);
                attn_round_q8(a * inv, (u64)(row0 + hh) * DV + dv, xq, xd);
            }
        }
    }
}

// The body of k_flash_attn_vec for blocks of at most NH heads over K and V of element type T (or
// FAV_ANY_TYPE).
template <int NH, int T>
__device__ __forceinline__ void fav_block(const TD& q, const TD& k, const TD& v, const TD& m, const TD& sk, const TD& d,
                                          float scale, float softcap, int has_mask, int has_sinks, const FavPlace& p,
                                          u64 part, u64 xq, u64 xd, FavShared& sh) {
    const int tid = threadIdx.x, D = (int)q.ne[0], l16 = tid % 16;
    const int es = (T == FAV_ANY_TYPE ? k.type : T) == T_F32 ? 4 : 2;
    const int ves = (T == FAV_ANY_TYPE ? v.type : T) == T_F32 ? 4 : 2;
    const float sc = softcap != 0.0f ? scale / softcap : scale;
    for (int hh = 0; hh < p.nh; hh++)
        for (int c = tid; c < D; c += FAV_THREADS) sh.qs[hh][c] = load_float(q, c, p.iq, p.h0 + hh, p.s);
    if (tid < FAV_MAX_HEADS) {
        sh.mx[tid] = NEG_INF;
        sh.sum[tid] = 0.0f;
    }
    if (tid < 2) sh.live[tid] = -1;
    int lo, hi;
    fav_live_keys(m, has_mask, p, sh.first, sh.last, lo, hi);
    __syncthreads();
    float acc[NH][FAV_SLOTS / NH][8];
#pragma unroll
    for (int hh = 0; hh < NH; hh++)
#pragma unroll
        for (int ps = 0; ps < FAV_SLOTS / NH; ps++)
#pragma unroll
            for (int e = 0; e < 8; e++) acc[hh][ps][e] = 0.0f;
    int buf = 0;
    for (int t0 = p.kv0 + (lo - p.kv0) / FAV_TILE * FAV_TILE; t0 < hi; t0 += FAV_TILE, buf ^= 1) {
        uint4 kraw[FAV_KEYS], vraw[FAV_KEYS];
        fav_load(p.k0, (u32)k.nb[1], D * es, 16 * l16, t0, hi, kraw);
        fav_load(p.v0, (u32)v.nb[1], (int)v.ne[0] * ves, 16 * l16, t0, hi, vraw);
        fav_scores<NH, T>(q, k, m, sc, softcap, has_mask, p, t0, hi, kraw, sh.ws[buf], sh.live[buf], sh);
        __syncthreads();
        // Every key of the tile masked: nothing to add. No thread writes this buffer's flag again
        // before all have read it: that is two tiles on, behind the next tile's barrier.
        if (sh.live[buf] != t0) continue;
        fav_softmax(p.nh, sh.ws[buf], sh.alpha[buf], sh);
        __syncthreads();
        fav_values<NH, T>(v, p, t0, hi, vraw, sh.ws[buf], sh.alpha[buf], acc);
    }
    fav_write<NH>(v, sk, d, has_sinks, p, part, xq, xd, acc, sh);
}

// part: 0 for a single split (the block writes the result, and its 8-bit copy into xq / xd when
// xq is set), else the partials of k_flash_attn_combine (see part_acc). Block x: head block, KV
// head, query, sequence (fastest first); block y: the split. One entry point per body:
// k_flash_attn_vec_h<NH> for blocks of at most NH heads over K and V of any type, with `_f16` for
// F16 K and V (the element type fixed). Each holds one body's code only: a block of a short decode
// runs once through its kernel, and with every body in one kernel its jumps across the others' code
// missed the instruction cache (Nsight Compute on H100: two thirds of the warps' cycles waiting for
// instruction fetch). The host gives a block at most FAV_SLOTS / (V's passes) heads.
// The K and V rows of the block's keys (see fav_place), asked into the L2 before the kernel waits
// for the launch before it (L2_THEN_SYNC).
template <int T>
__device__ __forceinline__ void fav_to_l2(const TD& q, const TD& k, const TD& v, const TD& m, int heads_per_block,
                                          int kv_per_split) {
    const FavPlace p = fav_place(q, k, v, m, 0.0f, heads_per_block, kv_per_split);
    const int es = (T == FAV_ANY_TYPE ? k.type : T) == T_F32 ? 4 : 2;
    const int ves = (T == FAV_ANY_TYPE ? v.type : T) == T_F32 ? 4 : 2;
    rows_to_l2((u64)p.k0, k.nb[1], p.kv0, p.kv1, (int)k.ne[0] * es);
    rows_to_l2((u64)p.v0, v.nb[1], p.kv0, p.kv1, (int)v.ne[0] * ves);
}

template <int NH, int T>
__device__ __forceinline__ void fav_kernel(const TD& q, const TD& k, const TD& v, const TD& m, const TD& sk,
                                           const TD& d, float scale, float max_bias, float softcap, int has_mask,
                                           int has_sinks, int heads_per_block, int kv_per_split, u64 part, u64 xq,
                                           u64 xd) {
    __shared__ FavShared sh;
    const FavPlace p = fav_place(q, k, v, m, max_bias, heads_per_block, kv_per_split);
    fav_block<NH, T>(q, k, v, m, sk, d, scale, softcap, has_mask, has_sinks, p, part, xq, xd, sh);
}

#define FAV_KERNEL(name, NH, T)                                                                                       \
    extern "C" __global__ void __launch_bounds__(FAV_THREADS) k_flash_attn_vec_##name(TD q, TD k, TD v, TD m, TD sk, TD d, float scale, float max_bias, float softcap, int has_mask, int has_sinks, int heads_per_block, int kv_per_split, u64 part, u64 xq, u64 xd) { L2_THEN_SYNC(fav_to_l2<T>(q, k, v, m, heads_per_block, kv_per_split)); \
        fav_kernel<NH, T>(q, k, v, m, sk, d, scale, max_bias, softcap, has_mask, has_sinks, heads_per_block,         \
                          kv_per_split, part, xq, xd);                                                                 \
    }
FAV_KERNEL(h1_f16, 1, T_F16)
FAV_KERNEL(h2_f16, 2, T_F16)
FAV_KERNEL(h4_f16, FAV_MAX_HEADS, T_F16)
FAV_KERNEL(h1, 1, FAV_ANY_TYPE)
FAV_KERNEL(h2, 2, FAV_ANY_TYPE)
FAV_KERNEL(h4, FAV_MAX_HEADS, FAV_ANY_TYPE)

// Threads per k_flash_attn_combine block (ROW_THREADS in dispatch/attention.rs).
#define FA_COMBINE_THREADS 256
// Most splits whose weights k_flash_attn_combine keeps in shared memory (more are recomputed).
#define FA_COMBINE_SPLITS 1024

// The weight of a split whose maximum is mi against the row's maximum mx (0 for an empty split).
__device__ __forceinline__ float split_weight(float mi, float mx) { return mi == NEG_INF ? 0.0f : expf(mi - mx); }

// Merges the `splits` partials of each row (one block per row), adds the sink, normalizes. The
// threads take the splits' maxima and sums in parallel (block reductions) and keep each split's
// weight in shared memory; then groups of threads take every groups-th split, each thread four
// consecutive dimensions (one vector load; one where DV is not a multiple of 4 or the partials
// are not 16-byte aligned), and the groups'
// sums meet in shared memory. With xq set, the result is also rounded to 8 bits (see
// attn_round_q8).
extern "C" __global__ void k_flash_attn_combine(TD sk, TD d, int has_sinks, int splits, u64 part, u64 xq, u64 xd) {
    GRID_DEPENDENCY_SYNC();
    __shared__ float weight[FA_COMBINE_SPLITS];
    __shared__ float red[4 * FA_COMBINE_THREADS];
    const i64 r = blockIdx.x, rows = gridDim.x;
    const i64 h = r % d.ne[1], iq = (r / d.ne[1]) % d.ne[2], s = r / (d.ne[1] * d.ne[2]);
    const int DV = (int)d.ne[0], tid = threadIdx.x;
    const float* maxima = part_max(part, rows, r, 0, splits, DV);
    const float* sums = part_sum(part, rows, r, 0, splits, DV);
    const float* acc = part_acc(part, r, 0, splits, DV);
    const float sink = has_sinks ? load(sk, h, 0, 0, 0) : NEG_INF;
    float mx = NEG_INF;
    for (int i = tid; i < splits; i += FA_COMBINE_THREADS) mx = fmaxf(mx, maxima[i]);
    mx = fmaxf(block_max(mx), sink);
    double sum = 0.0;
    if (mx != NEG_INF) {
        for (int i = tid; i < splits; i += FA_COMBINE_THREADS) {
            const float w = split_weight(maxima[i], mx);
            if (i < FA_COMBINE_SPLITS) weight[i] = w;
            sum += (double)(w * sums[i]);
        }
    }
    float total = (float)block_sum(sum);
    if (has_sinks && mx != NEG_INF) total += expf(sink - mx);
    const float inv = total == 0.0f ? 0.0f : 1.0f / total;
    const int per = DV % 4 == 0 && ((u64)acc & 15) == 0 ? 4 : 1, lanes_all = DV / per;
    for (int c0 = 0; c0 < lanes_all; c0 += FA_COMBINE_THREADS) {
        const int lanes = min(lanes_all - c0, FA_COMBINE_THREADS), groups = FA_COMBINE_THREADS / lanes;
        const int g = tid / lanes, lane = tid % lanes, dv = (c0 + lane) * per;
        float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (mx != NEG_INF && g < groups) {
#pragma unroll 4
            for (int i = g; i < splits; i += groups) {
                const float w = i < FA_COMBINE_SPLITS ? weight[i] : split_weight(maxima[i], mx);
                const float* src = acc + (i64)i * DV + dv;
                if (per == 4) {
                    const float4 x = *(const float4*)src;
                    a[0] += w * x.x;
                    a[1] += w * x.y;
                    a[2] += w * x.z;
                    a[3] += w * x.w;
                } else {
                    a[0] += w * src[0];
                }
            }
        }
        __syncthreads();
        if (g < groups)
            for (int e = 0; e < per; e++) red[(g * lanes + lane) * per + e] = a[e];
        __syncthreads();
        for (int x = tid; x < lanes * per; x += FA_COMBINE_THREADS) {
            float t = 0.0f;
            for (int gg = 0; gg < groups; gg++) t += red[gg * lanes * per + x];
            store(d, c0 * per + x, h, iq, s, t * inv);
            attn_round_q8(t * inv, (u64)r * DV + c0 * per + x, xq, xd);
        }
    }
}
