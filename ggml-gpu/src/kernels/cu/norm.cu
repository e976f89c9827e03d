// Row kernels, one block per row: rms_norm / norm (k_norm), sum_rows, and soft_max with mask
// (broadcast over heads and sequences), ALiBi slopes and attention sinks. Sums are taken in f64.
// k_norm_rows is the fast path of rms_norm / norm on row-contiguous F32 rows, which also runs the
// fused chains of the dispatch: the residual add before the norm and the weight mul after it.

extern "C" __global__ void k_norm(TD a, TD d, float eps, int rms) {
    i64 r = blockIdx.x;
    i64 i1 = r % a.ne[1], i2 = (r / a.ne[1]) % a.ne[2], i3 = r / (a.ne[1] * a.ne[2]);
    i64 n = a.ne[0];
    double s = 0, s2 = 0;
    for (i64 k = threadIdx.x; k < n; k += blockDim.x) {
        float v = load(a, k, i1, i2, i3);
        s += v;
        s2 += (double)v * v;
    }
    float mean = 0.0f;
    if (!rms) mean = (float)(block_sum(s) / n);
    double var = 0;
    if (rms) {
        var = block_sum(s2) / n;
    } else {
        double acc = 0;
        for (i64 k = threadIdx.x; k < n; k += blockDim.x) {
            double c = (double)(load(a, k, i1, i2, i3) - mean);
            acc += c * c;
        }
        var = block_sum(acc) / n;
    }
    float scale = 1.0f / sqrtf((float)var + eps);
    for (i64 k = threadIdx.x; k < n; k += blockDim.x)
        store(d, k, i1, i2, i3, (load(a, k, i1, i2, i3) - mean) * scale);
}

extern "C" __global__ void k_sum_rows(TD a, TD d) {
    i64 r = blockIdx.x;
    i64 i1 = r % a.ne[1], i2 = (r / a.ne[1]) % a.ne[2], i3 = r / (a.ne[1] * a.ne[2]);
    double s = 0;
    for (i64 k = threadIdx.x; k < a.ne[0]; k += blockDim.x) s += load(a, k, i1, i2, i3);
    s = block_sum(s);
    if (threadIdx.x == 0) store(d, 0, i1, i2, i3, (float)s);
}

extern "C" __global__ void k_soft_max(TD a, TD m, TD sk, TD d, float scale, float max_bias, int has_mask, int has_sinks) {
    i64 r = blockIdx.x;
    i64 i1 = r % a.ne[1], i2 = (r / a.ne[1]) % a.ne[2], i3 = r / (a.ne[1] * a.ne[2]);
    i64 n = a.ne[0];
    float slope = alibi_slope(max_bias, (int)i2, (int)a.ne[2]);
    float mx = NEG_INF;
    for (i64 k = threadIdx.x; k < n; k += blockDim.x) {
        float v = load(a, k, i1, i2, i3) * scale;
        if (has_mask) v += slope * load(m, k, i1, i2 % m.ne[2], i3 % m.ne[3]);
        store(d, k, i1, i2, i3, v);
        mx = fmaxf(mx, v);
    }
    mx = block_max(mx);
    float sink = has_sinks ? load(sk, i2, 0, 0, 0) : NEG_INF;
    mx = fmaxf(mx, sink);
    double s = 0;
    for (i64 k = threadIdx.x; k < n; k += blockDim.x) {
        float e = expf(load(d, k, i1, i2, i3) - mx);
        store(d, k, i1, i2, i3, e);
        s += e;
    }
    s = block_sum(s);
    if (has_sinks) s += expf(sink - mx);
    float inv = s > 0 ? (float)(1.0 / s) : 0.0f;
    for (i64 k = threadIdx.x; k < n; k += blockDim.x) store(d, k, i1, i2, i3, load(d, k, i1, i2, i3) * inv);
}

#define NORM_ADD 1
#define NORM_MUL 2

// Rows of n = norm(x) with x = a, or with NORM_ADD x = a + b written to s first; with NORM_MUL also
// m = n * w (w's rows as long as n's, broadcast over them; w may be either operand of the mul, which
// commutes). `tpr` threads per row (a power of two, 32..1024), blockDim.x / tpr rows per block.
// Every thread handles the same elements in every pass, so any result may alias an operand.
template <int V>
__device__ void norm_rows(const TD& a, const TD& b, const TD& s, const TD& n, const TD& w, const TD& m, float eps,
                          int rms, int flags, int tpr) {
    const u32 n0 = (u32)n.ne[0], cpr = n0 / V;
    const u32 r = blockIdx.x * (blockDim.x / tpr) + threadIdx.x / tpr, lane = threadIdx.x % tpr;
    const bool active = r < nrows32(n);
    u32 i[3] = {0, 0, 0};
    if (active) row_index(r, (u32)n.ne[1], (u32)n.ne[2], i);
    const bool add = flags & NORM_ADD;
    double s1 = 0, s2 = 0;
    for (u32 c = lane; active && c < cpr; c += tpr) {
        float x[V];
        ld_row<V>(row_at(a, i), T_F32, c * V, x);
        if (add) {
            float y[V];
            ld_row<V>(row_bcast(b, i), T_F32, c * V, y);
            for (int j = 0; j < V; j++) x[j] += y[j];
            st_row<V>(row_at(s, i), T_F32, c * V, x);
        }
        for (int j = 0; j < V; j++) {
            s1 += x[j];
            s2 += (double)x[j] * x[j];
        }
    }
    const TD& src = add ? s : a;
    float mean = 0.0f;
    double var;
    if (rms) {
        var = row_sum(s2, tpr) / n0;
    } else {
        mean = (float)(row_sum(s1, tpr) / n0);
        double acc = 0;
        for (u32 c = lane; active && c < cpr; c += tpr) {
            float x[V];
            ld_row<V>(row_at(src, i), T_F32, c * V, x);
            for (int j = 0; j < V; j++) {
                double t = (double)(x[j] - mean);
                acc += t * t;
            }
        }
        var = row_sum(acc, tpr) / n0;
    }
    const float scale = 1.0f / sqrtf((float)var + eps);
    for (u32 c = lane; active && c < cpr; c += tpr) {
        float x[V];
        ld_row<V>(row_at(src, i), T_F32, c * V, x);
        for (int j = 0; j < V; j++) x[j] = (x[j] - mean) * scale;
        st_row<V>(row_at(n, i), T_F32, c * V, x);
        if (flags & NORM_MUL) {
            float y[V];
            ld_row<V>(row_bcast(w, i), T_F32, c * V, y);
            for (int j = 0; j < V; j++) x[j] *= y[j];
            st_row<V>(row_at(m, i), T_F32, c * V, x);
        }
    }
}

extern "C" __global__ void k_norm_rows(TD a, TD b, TD s, TD n, TD w, TD m, float eps, int rms, int flags, int tpr,
                                       int vec) {
    if (vec == 4) norm_rows<4>(a, b, s, n, w, m, eps, rms, flags, tpr);
    else norm_rows<1>(a, b, s, n, w, m, eps, rms, flags, tpr);
}
