// Decode attention whose warps work alone: k_flash_attn_warps, for few queries over F16 or BF16 K
// and V (both of one type) with rows of D = DV = 64, 128 or 256 elements (dispatch/attention.rs
// sends other shapes to k_flash_attn_vec or k_flash_attn).
//
// A block takes the query heads of one GQA group (up to FAV_MAX_HEADS), one query, one sequence
// and the keys of its split, placed as k_flash_attn_vec's blocks are (fav_place), and finds the
// split's first and last unmasked key (fav_live_keys). It deals the keys between them out in
// batches of FAW_BATCH to its groups of 32 lanes in turn (two groups per wavefront on CDNA), and
// each group works alone from there to the end of the split, with no barrier in its key loop:
// - each lane keeps D / 32 elements of every head's query (scaled) and of every head's weighted V
//   sum in registers; a group reads a K or V row whole, D / 32 elements per lane (coalesced), and
//   loads the next batch's rows while it computes the current one;
// - the lanes' partial dots of every (head, key) of a batch are summed by halving exchanges, so
//   that each lane ends with one whole score (faw_sums); three more exchanges give the group's
//   running maximum and sum per head, and the weights and rescales reach every lane through the
//   group's slice of shared memory (two buffers, one warp barrier per batch);
// - keys of weight 0 for every head are not added (a cache's unwritten rows may hold anything).
// At the end the groups' maxima, sums and V sums meet in shared memory (one block barrier) and
// the block writes its heads' rows, or its partials for k_flash_attn_combine.
#define FAW_THREADS 128
#define FAW_GROUPS (FAW_THREADS / 32)
#define FAW_BATCH 8
#define FAW_MAX_D 256
static_assert(FAW_THREADS == FAV_THREADS, "fav_live_keys strides over FAV_THREADS threads");
static_assert(FAW_BATCH * FAV_MAX_HEADS == 32, "a batch's scores of the most heads are one per lane");

// The shared memory of a k_flash_attn_warps block: per group, two buffers of a batch's weights
// (head-major) and rescales; the groups' maxima, sums and V sums at the end; the groups' first
// and last unmasked keys.
struct FawShared {
    float w[2][FAW_GROUPS][32];
    float alpha[2][FAW_GROUPS][FAV_MAX_HEADS];
    float mx[FAW_GROUPS][FAV_MAX_HEADS], sum[FAW_GROUPS][FAV_MAX_HEADS];
    float acc[FAW_GROUPS][FAV_MAX_HEADS][FAW_MAX_D];
    int first[FAW_GROUPS], last[FAW_GROUPS];
};

// W 32-bit words (2 W halves) at p, aligned to 4 W bytes.
template <int W> __device__ __forceinline__ void faw_words(const u8* p, u32 (&w)[W]) {
    if constexpr (W == 4) {
        const uint4 t = *(const uint4*)p;
        w[0] = t.x; w[1] = t.y; w[2] = t.z; w[3] = t.w;
    } else if constexpr (W == 2) {
        const uint2 t = *(const uint2*)p;
        w[0] = t.x; w[1] = t.y;
    } else {
        w[0] = *(const u32*)p;
    }
}

// This lane's words (at byte `off`) of the FAW_BATCH rows j0.. (`stride` apart from row0); zeros
// from hi on.
template <int W>
__device__ __forceinline__ void faw_load(const u8* row0, u32 stride, int off, int j0, int hi,
                                         u32 (&raw)[FAW_BATCH][W]) {
#pragma unroll
    for (int u = 0; u < FAW_BATCH; u++) {
        const int j = j0 + u;
        if (j < hi) {
            faw_words<W>(row0 + (u64)(u32)j * stride + off, raw[u]);
        } else {
#pragma unroll
            for (int i = 0; i < W; i++) raw[u][i] = 0u;
        }
    }
}

// The 2 W halves (F16, or BF16 when BF) of w as floats.
template <int W, bool BF> __device__ __forceinline__ void faw_floats(const u32 (&w)[W], float (&f)[2 * W]) {
#pragma unroll
    for (int i = 0; i < W; i++) {
        const u16 lo = (u16)(w[i] & 0xFFFFu), hi = (u16)(w[i] >> 16);
        f[2 * i] = BF ? bf2f(lo) : h2f(lo);
        f[2 * i + 1] = BF ? bf2f(hi) : h2f(hi);
    }
}

// The sums over the 32 lanes of a group of each lane's N partial dots x[i] (N = 8, 16 or 32):
// exchanges that each halve what a lane holds (partner lanes keep opposite halves), then plain
// sums; lane l ends with the whole dot of index l >> (5 - log2 N).
template <int N> __device__ __forceinline__ float faw_sums(float (&x)[N], int lane) {
#pragma unroll
    for (int step = 0; step < 5; step++) {
        const int o = 16 >> step, c = N >> step;
        if (c > 1) {
            const bool upper = (lane & o) != 0;
#pragma unroll
            for (int i = 0; i < c / 2; i++) {
                const float keep = upper ? x[i + c / 2] : x[i], give = upper ? x[i] : x[i + c / 2];
                x[i] = keep + WARP_SHFL_XOR(give, o);
            }
        } else {
            x[0] += WARP_SHFL_XOR(x[0], o);
        }
    }
    return x[0];
}

// The block's result from its groups' states (in shared memory): each head's rows of d (the
// sinks added, normalized), or its partials for k_flash_attn_combine when `part` is set.
template <int D>
__device__ __forceinline__ void faw_write(const TD& sk, const TD& d, int has_sinks, const FavPlace& p, u64 part,
                                          const FawShared& sh) {
    const int tid = threadIdx.x;
    const i64 rows = d.ne[1] * d.ne[2] * d.ne[3], row0 = p.h0 + d.ne[1] * (p.iq + d.ne[2] * p.s);
    for (int hh = 0; hh < p.nh; hh++) {
        float mx = NEG_INF;
#pragma unroll
        for (int g = 0; g < FAW_GROUPS; g++) mx = fmaxf(mx, sh.mx[g][hh]);
        float wg[FAW_GROUPS], sum = 0.0f;
#pragma unroll
        for (int g = 0; g < FAW_GROUPS; g++) {
            wg[g] = sh.mx[g][hh] == NEG_INF ? 0.0f : expf(sh.mx[g][hh] - mx);
            sum += wg[g] * sh.sum[g][hh];
        }
        const int h = p.h0 + hh;
        float inv = 1.0f;
        if (!part) {
            inv = attn_out_scale(sk, has_sinks, h, mx, sum);
        } else if (tid == 0) {
            *part_max(part, rows, row0 + hh, blockIdx.y, gridDim.y, D) = mx;
            *part_sum(part, rows, row0 + hh, blockIdx.y, gridDim.y, D) = sum;
        }
        float* out = part ? part_acc(part, row0 + hh, blockIdx.y, gridDim.y, D) : 0;
        for (int dv = tid; dv < D; dv += FAW_THREADS) {
            float a = 0.0f;
#pragma unroll
            for (int g = 0; g < FAW_GROUPS; g++) a += wg[g] * sh.acc[g][hh][dv];
            if (part)
                out[dv] = a;
            else
                store(d, dv, h, p.iq, p.s, a * inv);
        }
    }
}

// The body of k_flash_attn_warps for rows of D elements (F16, or BF16 when BF) and blocks of at
// most NH heads.
template <int D, int NH, bool BF>
__device__ __forceinline__ void faw_block(const TD& q, const TD& k, const TD& v, const TD& m, const TD& sk,
                                          const TD& d, float scale, float softcap, int has_mask, int has_sinks,
                                          const FavPlace& p, u64 part, FawShared& sh) {
    constexpr int W = D / 64, E = 2 * W;
    // Lanes per score: the scores of a batch are NH x FAW_BATCH, head-major (faw_sums).
    constexpr int SHIFT = NH == 4 ? 0 : NH == 2 ? 1 : 2;
    const int tid = threadIdx.x, g = tid / 32, lane = tid % 32;
    const float sc = softcap != 0.0f ? scale / softcap : scale;
    float qv[NH][E], acc[NH][E];
#pragma unroll
    for (int hh = 0; hh < NH; hh++)
#pragma unroll
        for (int e = 0; e < E; e++) {
            qv[hh][e] = hh < p.nh ? load_float(q, lane * E + e, p.iq, p.h0 + hh, p.s) * sc : 0.0f;
            acc[hh][e] = 0.0f;
        }
    // The score this lane ends with: head s_head, key s_key of each batch.
    const int si = lane >> SHIFT, s_head = si / FAW_BATCH, s_key = si % FAW_BATCH;
    const bool s_writes = (lane & ((1 << SHIFT) - 1)) == 0;
    const u8* s_mrow = p.mrow[0];
    float s_slope = p.slope[0];
#pragma unroll
    for (int hh = 1; hh < NH; hh++)
        if (s_head == hh) {
            s_mrow = p.mrow[hh];
            s_slope = p.slope[hh];
        }
    const bool s_real = s_head < p.nh;
    int lo, hi;
    fav_live_keys(m, has_mask, p, sh.first, sh.last, lo, hi);
    // The running maximum and sum of head s_head over this group's keys.
    float mx = NEG_INF, sum = 0.0f;
    const u32 kst = (u32)k.nb[1], vst = (u32)v.nb[1];
    const int off = lane * E * 2;
    u32 knext[FAW_BATCH][W], vnext[FAW_BATCH][W];
    int j0 = lo + g * FAW_BATCH, buf = 0;
    faw_load<W>(p.k0, kst, off, j0, hi, knext);
    faw_load<W>(p.v0, vst, off, j0, hi, vnext);
    for (; j0 < hi; j0 += FAW_GROUPS * FAW_BATCH, buf ^= 1) {
        u32 kraw[FAW_BATCH][W], vraw[FAW_BATCH][W];
#pragma unroll
        for (int u = 0; u < FAW_BATCH; u++)
#pragma unroll
            for (int i = 0; i < W; i++) {
                kraw[u][i] = knext[u][i];
                vraw[u][i] = vnext[u][i];
            }
        faw_load<W>(p.k0, kst, off, j0 + FAW_GROUPS * FAW_BATCH, hi, knext);
        faw_load<W>(p.v0, vst, off, j0 + FAW_GROUPS * FAW_BATCH, hi, vnext);
        float dot[NH * FAW_BATCH];
#pragma unroll
        for (int u = 0; u < FAW_BATCH; u++) {
            float f[E];
            faw_floats<W, BF>(kraw[u], f);
#pragma unroll
            for (int hh = 0; hh < NH; hh++) {
                float s = 0.0f;
#pragma unroll
                for (int e = 0; e < E; e++) s += f[e] * qv[hh][e];
                dot[hh * FAW_BATCH + u] = s;
            }
        }
        float x = faw_sums<NH * FAW_BATCH>(dot, lane);
        const int j = j0 + s_key;
        if (!s_real || j >= hi) {
            x = NEG_INF;
        } else {
            if (softcap != 0.0f) x = softcap * tanhf(x);
            if (has_mask) {
                const float mv = mask_at(s_mrow, m.nb[0], m.type, j);
                x = mv == NEG_INF ? NEG_INF : x + s_slope * mv;
            }
        }
        // The head's batch maximum and sum: its lanes differ in the key bits of the lane index.
        float bmax = x;
#pragma unroll
        for (int o = 1 << SHIFT; o < (FAW_BATCH << SHIFT); o <<= 1) bmax = fmaxf(bmax, WARP_SHFL_XOR(bmax, o));
        const float nm = fmaxf(mx, bmax);
        const float w = x == NEG_INF ? 0.0f : expf(x - nm);
        const float alpha = mx == NEG_INF ? 0.0f : expf(mx - nm);
        float bsum = w;
#pragma unroll
        for (int o = 1 << SHIFT; o < (FAW_BATCH << SHIFT); o <<= 1) bsum += WARP_SHFL_XOR(bsum, o);
        sum = sum * alpha + bsum;
        mx = nm;
        if (s_writes) {
            sh.w[buf][g][si] = w;
            if (s_key == 0) sh.alpha[buf][g][s_head] = alpha;
        }
        WARP_SYNC();
        float wt[NH][FAW_BATCH];
#pragma unroll
        for (int hh = 0; hh < NH; hh++) {
            const float a = sh.alpha[buf][g][hh];
#pragma unroll
            for (int u = 0; u < FAW_BATCH; u++) wt[hh][u] = sh.w[buf][g][hh * FAW_BATCH + u];
#pragma unroll
            for (int e = 0; e < E; e++) acc[hh][e] *= a;
        }
#pragma unroll
        for (int u = 0; u < FAW_BATCH; u++) {
            bool used = false;
#pragma unroll
            for (int hh = 0; hh < NH; hh++) used |= wt[hh][u] != 0.0f;
            if (!used) continue;
            float f[E];
            faw_floats<W, BF>(vraw[u], f);
#pragma unroll
            for (int hh = 0; hh < NH; hh++)
#pragma unroll
                for (int e = 0; e < E; e++) acc[hh][e] += wt[hh][u] * f[e];
        }
    }
    if (s_writes && s_key == 0) {
        sh.mx[g][s_head] = mx;
        sh.sum[g][s_head] = sum;
    }
#pragma unroll
    for (int hh = 0; hh < NH; hh++)
#pragma unroll
        for (int e = 0; e < E; e++) sh.acc[g][hh][lane * E + e] = acc[hh][e];
    __syncthreads();
    faw_write<D>(sk, d, has_sinks, p, part, sh);
}

// faw_block for rows of D elements: the body of 1, 2 or 4 heads (heads_per_block 3 takes the
// 4-head one), F16 or BF16.
template <int D>
__device__ __forceinline__ void faw_rows(const TD& q, const TD& k, const TD& v, const TD& m, const TD& sk, const TD& d,
                                         float scale, float softcap, int has_mask, int has_sinks, int heads_per_block,
                                         const FavPlace& p, u64 part, FawShared& sh) {
    const bool bf = k.type == T_BF16;
    if (heads_per_block == 1) {
        if (bf) faw_block<D, 1, true>(q, k, v, m, sk, d, scale, softcap, has_mask, has_sinks, p, part, sh);
        else faw_block<D, 1, false>(q, k, v, m, sk, d, scale, softcap, has_mask, has_sinks, p, part, sh);
    } else if (heads_per_block == 2) {
        if (bf) faw_block<D, 2, true>(q, k, v, m, sk, d, scale, softcap, has_mask, has_sinks, p, part, sh);
        else faw_block<D, 2, false>(q, k, v, m, sk, d, scale, softcap, has_mask, has_sinks, p, part, sh);
    } else {
        if (bf) faw_block<D, 4, true>(q, k, v, m, sk, d, scale, softcap, has_mask, has_sinks, p, part, sh);
        else faw_block<D, 4, false>(q, k, v, m, sk, d, scale, softcap, has_mask, has_sinks, p, part, sh);
    }
}

// The kernel of rows of D elements: part is 0 for a single split (the block writes the result),
// else the partials of k_flash_attn_combine (see part_acc). Blocks as k_flash_attn_vec's: block
// x the head block, KV head, query and sequence (fastest first), block y the split.
template <int D>
__device__ __forceinline__ void faw_kernel(const TD& q, const TD& k, const TD& v, const TD& m, const TD& sk,
                                           const TD& d, float scale, float max_bias, float softcap, int has_mask,
                                           int has_sinks, int heads_per_block, int kv_per_split, u64 part) {
    __shared__ FawShared sh;
    const FavPlace p = fav_place(q, k, v, m, max_bias, heads_per_block, kv_per_split);
    faw_rows<D>(q, k, v, m, sk, d, scale, softcap, has_mask, has_sinks, heads_per_block, p, part, sh);
}

// One kernel per head size, so that each gets its own register budget (a block's registers are
// those of its largest body): 127 at D 64 (four blocks per SM), 168 at D 128 (three), 255 at D 256
// (two), compiled for sm_90.
extern "C" __global__ void __launch_bounds__(FAW_THREADS, 4) k_flash_attn_warps_64(
    TD q, TD k, TD v, TD m, TD sk, TD d, float scale, float max_bias, float softcap, int has_mask, int has_sinks,
    int heads_per_block, int kv_per_split, u64 part) {
    GRID_DEPENDENCY_SYNC();
    faw_kernel<64>(q, k, v, m, sk, d, scale, max_bias, softcap, has_mask, has_sinks, heads_per_block, kv_per_split,
                   part);
}

extern "C" __global__ void __launch_bounds__(FAW_THREADS, 3) k_flash_attn_warps_128(
    TD q, TD k, TD v, TD m, TD sk, TD d, float scale, float max_bias, float softcap, int has_mask, int has_sinks,
    int heads_per_block, int kv_per_split, u64 part) {
    GRID_DEPENDENCY_SYNC();
    faw_kernel<128>(q, k, v, m, sk, d, scale, max_bias, softcap, has_mask, has_sinks, heads_per_block, kv_per_split,
                    part);
}

extern "C" __global__ void __launch_bounds__(FAW_THREADS, 2) k_flash_attn_warps_256(
    TD q, TD k, TD v, TD m, TD sk, TD d, float scale, float max_bias, float softcap, int has_mask, int has_sinks,
    int heads_per_block, int kv_per_split, u64 part) {
    GRID_DEPENDENCY_SYNC();
    faw_kernel<256>(q, k, v, m, sk, d, scale, max_bias, softcap, has_mask, has_sinks, heads_per_block, kv_per_split,
                    part);
}
