// flash_attn_ext. Two paths (dispatch/attention.rs picks one):
// - k_flash_attn_vec_d{128,256,512} (few queries per KV head: decode; any shape without batched
//   BLAS): one block of FAV_THREADS threads per (KV head, up to FAV_HEADS query heads of its GQA
//   group, query, sequence) and KV split, so one K/V load serves every head of the group. Each warp
//   takes FAV_KEYS(CH) keys at a time (all their K and V loads in flight together); a lane holds 4
//   dims per 128 of the query and of the accumulators (coalesced row loads), scores are warp
//   sums, the softmax is online per warp, and the warps meet in shared memory at the end. With
//   several splits each block writes its partial (max, sum, accumulator) per query head and
//   k_flash_attn_combine merges them, adds the sink and normalizes.
// - the BLAS path (many queries): scores = K Q^T by strided batched GEMMs over the KV heads (the
//   query heads of a group are one operand), k_attn_softmax turns a chunk of score rows into
//   probabilities (scale, softcap, mask, ALiBi, sinks), and GEMMs multiply them with V.
// K/V of any loadable type (the vector kernels read F16, F32 and Q8_0; others are copied to F32). GQA maps query head h
// to KV head h / (heads / kv_heads); sliding windows and causality come in through the mask.

#define FAV_WARPS 4
#define FAV_THREADS (FAV_WARPS * 32)
#define FAV_HEADS 4

// Row (key or value j) of a K/V tensor.
__device__ __forceinline__ const u8* kv_row(const TD& t, i64 j, i64 h, i64 s) {
    return (const u8*)t.ptr + j * t.nb[1] + h * t.nb[2] + s * t.nb[3];
}

// Elements d0..d0+3 of K/V row `row`, zero from n on. The dispatch hands the vector kernels K/V
// as F16 or F32 elements (nb[0] their size) or Q8_0 rows of whole blocks at even addresses,
// copying anything else to F32 first: no generic loads, which would bloat the unrolled kernels.
__device__ __forceinline__ void kv_load4(const TD& t, const u8* row, int d0, int n, float (&o)[4]) {
    if (t.type == T_Q8_0) {
        const u8* b = row + (d0 / 32) * t.nb[0];
        const float scale = d0 < n ? h2f(ld16(b)) : 0.0f;
#pragma unroll
        for (int e = 0; e < 4; e++) o[e] = d0 + e < n ? scale * (float)(signed char)b[2 + d0 % 32 + e] : 0.0f;
        return;
    }
    if (d0 + 4 <= n) {
        if (t.type == T_F16 && (((u64)row + 2 * d0) & 7) == 0) {
            uint2 p = *(const uint2*)(row + 2 * d0);
            o[0] = h2f((u16)(p.x & 0xFFFFu));
            o[1] = h2f((u16)(p.x >> 16));
            o[2] = h2f((u16)(p.y & 0xFFFFu));
            o[3] = h2f((u16)(p.y >> 16));
            return;
        }
        if (t.type == T_F32 && (((u64)row + 4 * d0) & 15) == 0) {
            float4 p = *(const float4*)(row + 4 * d0);
            o[0] = p.x;
            o[1] = p.y;
            o[2] = p.z;
            o[3] = p.w;
            return;
        }
    }
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const int c = d0 + e;
        o[e] = c >= n ? 0.0f : (t.type == T_F16 ? h2f(((const u16*)row)[c]) : ((const float*)row)[c]);
    }
}

// Element of a float tensor (F32, F16 or BF16: queries, masks, sinks) without the block formats.
__device__ __forceinline__ float load_float(const TD& t, i64 i0, i64 i1, i64 i2, i64 i3) {
    const u8* p = (const u8*)t.ptr + i0 * t.nb[0] + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
    if (t.type == T_F32) return *(const float*)p;
    return t.type == T_F16 ? h2f(ld16(p)) : bf2f(ld16(p));
}

// Keys a warp loads at once with CH chunks of 128 dims (fewer for wide heads: registers).
#define FAV_KEYS(CH) ((CH) == 1 ? 4 : ((CH) == 2 ? 2 : 1))

// part: 0 for a single split (the block writes the result), else (max, sum, DV accumulators) per
// (output row, split) for k_flash_attn_combine. D and DV are at most 128 * CH.
template <int CH>
__device__ __forceinline__ void flash_attn_vec(const TD& q, const TD& k, const TD& v, const TD& m, const TD& sk,
                                               const TD& d, float scale, float max_bias, float softcap,
                                               int has_mask, int has_sinks, int kv_per_split, u64 part) {
    constexpr int KEYS = FAV_KEYS(CH);
    __shared__ float s_mx[FAV_WARPS][FAV_HEADS];
    __shared__ float s_sum[FAV_WARPS][FAV_HEADS];
    __shared__ float s_acc[FAV_WARPS][FAV_HEADS][128 * CH];
    const int H = (int)q.ne[2], HK = (int)k.ne[2], G = H / HK;
    const int groups = (G + FAV_HEADS - 1) / FAV_HEADS;
    i64 b = blockIdx.x;
    const int hg = (int)(b % groups);
    b /= groups;
    const i64 hk = b % HK;
    b /= HK;
    const i64 iq = b % q.ne[1], s = b / q.ne[1];
    const int h0 = (int)hk * G + hg * FAV_HEADS, nh = min(FAV_HEADS, G - hg * FAV_HEADS);
    const int D = (int)q.ne[0], DV = (int)v.ne[0], n_kv = (int)k.ne[1];
    const int kv0 = blockIdx.y * kv_per_split, kv1 = min(n_kv, kv0 + kv_per_split);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float sc = softcap != 0.0f ? scale / softcap : scale;
    float qv[FAV_HEADS][CH][4], acc[FAV_HEADS][CH][4], mx[FAV_HEADS], sum[FAV_HEADS], slope[FAV_HEADS];
#pragma unroll
    for (int g = 0; g < FAV_HEADS; g++) {
        slope[g] = alibi_slope(max_bias, h0 + g, H);
        mx[g] = NEG_INF;
        sum[g] = 0.0f;
#pragma unroll
        for (int c = 0; c < CH; c++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int dd = 128 * c + 4 * lane + e;
                qv[g][c][e] = g < nh && dd < D ? sc * load_float(q, dd, iq, h0 + g, s) : 0.0f;
                acc[g][c][e] = 0.0f;
            }
    }
    for (int j0 = kv0 + warp * KEYS; j0 < kv1; j0 += FAV_WARPS * KEYS) {
        float kk[KEYS][CH][4], vv[KEYS][CH][4];
#pragma unroll
        for (int u = 0; u < KEYS; u++) {
            const int j = min(j0 + u, kv1 - 1);
            const u8* kr = kv_row(k, j, hk, s);
            const u8* vr = kv_row(v, j, hk, s);
#pragma unroll
            for (int c = 0; c < CH; c++) {
                kv_load4(k, kr, 128 * c + 4 * lane, D, kk[u][c]);
                kv_load4(v, vr, 128 * c + 4 * lane, DV, vv[u][c]);
            }
        }
        float x[FAV_HEADS][KEYS];
#pragma unroll
        for (int g = 0; g < FAV_HEADS; g++)
#pragma unroll
            for (int u = 0; u < KEYS; u++) {
                float dot = 0.0f;
#pragma unroll
                for (int c = 0; c < CH; c++)
#pragma unroll
                    for (int e = 0; e < 4; e++) dot += qv[g][c][e] * kk[u][c][e];
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) dot += WARP_SHFL_XOR(dot, o);
                float xv = NEG_INF;
                if (j0 + u < kv1 && g < nh) {
                    float mv = has_mask ? slope[g] * load_float(m, j0 + u, iq, (h0 + g) % m.ne[2], s % m.ne[3]) : 0.0f;
                    if (mv != NEG_INF) xv = (softcap != 0.0f ? softcap * tanhf(dot) : dot) + mv;
                }
                x[g][u] = xv;
            }
#pragma unroll
        for (int g = 0; g < FAV_HEADS; g++) {
            float nm = mx[g];
#pragma unroll
            for (int u = 0; u < KEYS; u++) nm = fmaxf(nm, x[g][u]);
            if (nm == NEG_INF) continue;
            const float alpha = expf(mx[g] - nm);
            sum[g] *= alpha;
#pragma unroll
            for (int c = 0; c < CH; c++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[g][c][e] *= alpha;
#pragma unroll
            for (int u = 0; u < KEYS; u++) {
                // Masked keys are skipped, not weighted by 0: their values may be anything.
                if (x[g][u] == NEG_INF) continue;
                const float p = expf(x[g][u] - nm);
                sum[g] += p;
#pragma unroll
                for (int c = 0; c < CH; c++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[g][c][e] += p * vv[u][c][e];
            }
            mx[g] = nm;
        }
    }
#pragma unroll
    for (int g = 0; g < FAV_HEADS; g++) {
        if (lane == 0) {
            s_mx[warp][g] = mx[g];
            s_sum[warp][g] = sum[g];
        }
#pragma unroll
        for (int c = 0; c < CH; c++)
#pragma unroll
            for (int e = 0; e < 4; e++) s_acc[warp][g][128 * c + 4 * lane + e] = acc[g][c][e];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nh * DV; i += FAV_THREADS) {
        const int g = i / DV, dv = i % DV;
        float top = NEG_INF;
#pragma unroll
        for (int w = 0; w < FAV_WARPS; w++) top = fmaxf(top, s_mx[w][g]);
        float a = 0.0f, total = 0.0f;
        if (top != NEG_INF) {
#pragma unroll
            for (int w = 0; w < FAV_WARPS; w++) {
                if (s_mx[w][g] == NEG_INF) continue;
                const float f = expf(s_mx[w][g] - top);
                a += f * s_acc[w][g][dv];
                total += f * s_sum[w][g];
            }
        }
        const int h = h0 + g;
        if (part) {
            const i64 r = h + H * (iq + q.ne[1] * s);
            float* p = (float*)part + (r * gridDim.y + blockIdx.y) * (DV + 2);
            if (dv == 0) {
                p[0] = top;
                p[1] = total;
            }
            p[2 + dv] = a;
            continue;
        }
        float scale_out = 1.0f;
        if (has_sinks) {
            const float sink = load_float(sk, h, 0, 0, 0);
            const float nm = fmaxf(top, sink);
            scale_out = expf(top - nm);
            total = total * scale_out + expf(sink - nm);
        }
        store(d, dv, h, iq, s, total == 0.0f ? 0.0f : a * (scale_out / total));
    }
}

extern "C" __global__ void k_flash_attn_vec_d128(TD q, TD k, TD v, TD m, TD sk, TD d, float scale, float max_bias,
                                                 float softcap, int has_mask, int has_sinks, int kv_per_split, u64 part) {
    flash_attn_vec<1>(q, k, v, m, sk, d, scale, max_bias, softcap, has_mask, has_sinks, kv_per_split, part);
}

extern "C" __global__ void k_flash_attn_vec_d256(TD q, TD k, TD v, TD m, TD sk, TD d, float scale, float max_bias,
                                                 float softcap, int has_mask, int has_sinks, int kv_per_split, u64 part) {
    flash_attn_vec<2>(q, k, v, m, sk, d, scale, max_bias, softcap, has_mask, has_sinks, kv_per_split, part);
}

extern "C" __global__ void k_flash_attn_vec_d512(TD q, TD k, TD v, TD m, TD sk, TD d, float scale, float max_bias,
                                                 float softcap, int has_mask, int has_sinks, int kv_per_split, u64 part) {
    flash_attn_vec<4>(q, k, v, m, sk, d, scale, max_bias, softcap, has_mask, has_sinks, kv_per_split, part);
}

// Merges the `splits` partials of each row (one block per row), adds the sink, normalizes.
extern "C" __global__ void k_flash_attn_combine(TD sk, TD d, int has_sinks, int splits, u64 part) {
    i64 r = blockIdx.x;
    i64 h = r % d.ne[1], iq = (r / d.ne[1]) % d.ne[2], s = r / (d.ne[1] * d.ne[2]);
    int DV = (int)d.ne[0];
    const float* p = (const float*)part + r * splits * (DV + 2);
    float mx = has_sinks ? load(sk, h, 0, 0, 0) : NEG_INF;
    for (int i = 0; i < splits; i++) mx = fmaxf(mx, p[i * (DV + 2)]);
    float sum = 0.0f;
    if (mx != NEG_INF) {
        for (int i = 0; i < splits; i++) {
            float mi = p[i * (DV + 2)];
            if (mi != NEG_INF) sum += expf(mi - mx) * p[i * (DV + 2) + 1];
        }
        if (has_sinks) sum += expf(load(sk, h, 0, 0, 0) - mx);
    }
    float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
    for (int dv = threadIdx.x; dv < DV; dv += blockDim.x) {
        float a = 0.0f;
        for (int i = 0; i < splits; i++) {
            float mi = p[i * (DV + 2)];
            if (mi != NEG_INF) a += expf(mi - mx) * p[i * (DV + 2) + 2 + dv];
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
                                          int q0, int s) {
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
