// Row kernels, one block per row: rms_norm / norm (k_norm), sum_rows, and soft_max with mask
// (broadcast over heads and sequences), ALiBi slopes and attention sinks. Sums are taken in f64.
// k_norm_rows is the fast path of rms_norm / norm on row-contiguous F32 rows, which also runs the
// fused chains of the dispatch: the residual add before the norm and the weight mul (or a scale)
// after it; a thread keeps its chunks in registers from the first pass to the last. Where the chain
// feeds products of quantized weights, it also writes its last result rounded to 8 bits for them.
// k_norm_row1 is the same body for one row in one block of 4-wide chunks (a decode step): its
// row indices are constants, so none of the broadcast and address arithmetic is left.

extern "C" __global__ void k_norm(TD a, TD d, float eps, int rms) { GRID_DEPENDENCY_SYNC();
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

// Row r of sum_rows (also the MoE router's renormalisation, k_moe_router).
__device__ __forceinline__ void sum_row(const TD& a, const TD& d, i64 r) {
    i64 i1 = r % a.ne[1], i2 = (r / a.ne[1]) % a.ne[2], i3 = r / (a.ne[1] * a.ne[2]);
    double s = 0;
    for (i64 k = threadIdx.x; k < a.ne[0]; k += blockDim.x) s += load(a, k, i1, i2, i3);
    s = block_sum(s);
    if (threadIdx.x == 0) store(d, 0, i1, i2, i3, (float)s);
}

extern "C" __global__ void k_sum_rows(TD a, TD d) { GRID_DEPENDENCY_SYNC();
    sum_row(a, d, blockIdx.x);
}

// sum_rows of short rows (a delta-net decode step's convolution taps): one thread per row, in
// order, over a grid-stride loop.
extern "C" __global__ void k_sum_rows_short(TD a, TD d) { GRID_DEPENDENCY_SYNC();
    i64 rows = a.ne[1] * a.ne[2] * a.ne[3];
    for (i64 r = (i64)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += (i64)gridDim.x * blockDim.x) {
        i64 i1 = r % a.ne[1], i2 = (r / a.ne[1]) % a.ne[2], i3 = r / (a.ne[1] * a.ne[2]);
        double s = 0;
        for (i64 k = 0; k < a.ne[0]; k++) s += load(a, k, i1, i2, i3);
        store(d, 0, i1, i2, i3, (float)s);
    }
}

// Row r of soft_max (also the MoE router's, k_moe_router).
__device__ __forceinline__ void soft_max_row(const TD& a, const TD& m, const TD& sk, const TD& d, float scale,
                                             float max_bias, int has_mask, int has_sinks, i64 r) {
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

extern "C" __global__ void k_soft_max(TD a, TD m, TD sk, TD d, float scale, float max_bias, int has_mask, int has_sinks) { GRID_DEPENDENCY_SYNC();
    soft_max_row(a, m, sk, d, scale, max_bias, has_mask, has_sinks, blockIdx.x);
}

#define NORM_ADD 1
#define NORM_MUL 2
#define NORM_SCALE 4
// Chunks a thread keeps in registers from the first pass to the last (the host gives each thread
// about that many): their loads are all in flight at once, and they are not read twice.
#define NORM_KEEP 2

// Chunk c of row i: x from a and, with `add`, y from b (broadcast).
template <int V>
__device__ __forceinline__ void norm_load(const TD& a, const TD& b, const u32* i, u32 c, bool add, float (&x)[V],
                                          float (&y)[V]) {
    ld_row<V>(row_at(a, i), T_F32, c * V, x);
    if (add) ld_row<V>(row_bcast(b, i), T_F32, c * V, y);
}

// With `add`, x += y written to s; then x into the sums s1, s2.
template <int V>
__device__ __forceinline__ void norm_sum(const TD& s, const u32* i, u32 c, bool add, float (&x)[V], const float (&y)[V],
                                         double& s1, double& s2) {
    if (add) {
        for (int j = 0; j < V; j++) x[j] += y[j];
        st_row<V>(row_at(s, i), T_F32, c * V, x);
    }
    for (int j = 0; j < V; j++) {
        s1 += x[j];
        s2 += (double)x[j] * x[j];
    }
}

// The squared deviations of x from the mean into acc.
template <int V> __device__ __forceinline__ void norm_dev(const float (&x)[V], float mean, double& acc) {
    for (int j = 0; j < V; j++) {
        double t = (double)(x[j] - mean);
        acc += t * t;
    }
}

// x normalized, written to n; with NORM_MUL times the weights g (loaded here unless `have_g`)
// written to m; with NORM_SCALE x * post.x + post.y written to m (as k_unary's scale computes it).
template <int V>
__device__ __forceinline__ void norm_store(const TD& n, const TD& w, const TD& m, const u32* i, u32 c, int flags,
                                           float mean, float scale, float2 post, float (&x)[V], float (&g)[V],
                                           bool have_g) {
    for (int j = 0; j < V; j++) x[j] = (x[j] - mean) * scale;
    st_row<V>(row_at(n, i), T_F32, c * V, x);
    if (flags & NORM_MUL) {
        if (!have_g) ld_row<V>(row_bcast(w, i), T_F32, c * V, g);
        for (int j = 0; j < V; j++) x[j] *= g[j];
        st_row<V>(row_at(m, i), T_F32, c * V, x);
    } else if (flags & NORM_SCALE) {
        for (int j = 0; j < V; j++) x[j] = x[j] * post.x + post.y;
        st_row<V>(row_at(m, i), T_F32, c * V, x);
    }
}

// Rows of n = norm(x) with x = a, or with NORM_ADD x = a + b written to s first; with NORM_MUL also
// m = n * w (w's rows as long as n's, broadcast over them; w may be either operand of the mul, which
// commutes), or with NORM_SCALE m = n * post_scale + post_bias. `tpr` threads per row (a power of
// two, 32..1024), blockDim.x / tpr rows per block.
// Every thread handles the same elements in every pass, in order, so any result may alias an
// operand exactly (the host allows no other overlap); w is loaded with the first pass unless it is
// s or n. A thread's first NORM_KEEP chunks stay in registers; longer rows read s (or a) again.
// With xq set (the host checks that every chunk stays in registers and that rows are whole units of
// 32), the last result of the chain is also rounded to 8 bits into xq / xd (rows one after another).
// With ONE_ROW, the launch is one block of `tpr` threads over a single row.
template <int V, bool ONE_ROW>
__device__ void norm_rows(const TD& a, const TD& b, const TD& s, const TD& n, const TD& w, const TD& m, float eps,
                          int rms, int flags, float2 post, int tpr, u64 xq, u64 xd) {
    const u32 n0 = (u32)n.ne[0], cpr = n0 / V;
    const u32 r = ONE_ROW ? 0 : blockIdx.x * (blockDim.x / tpr) + threadIdx.x / tpr;
    const u32 lane = ONE_ROW ? threadIdx.x : threadIdx.x % tpr;
    const u32 rest = lane + NORM_KEEP * tpr;
    const bool active = ONE_ROW || r < nrows32(n);
    u32 i[3] = {0, 0, 0};
    if (!ONE_ROW && active) row_index(r, (u32)n.ne[1], (u32)n.ne[2], i);
    const bool add = flags & NORM_ADD;
    const bool g_early = (flags & NORM_MUL) && w.ptr != s.ptr && w.ptr != n.ptr;
    float x[NORM_KEEP][V], y[NORM_KEEP][V], g[NORM_KEEP][V];
#pragma unroll
    for (int k = 0; k < NORM_KEEP; k++) {
        const u32 c = lane + k * tpr;
        if (!active || c >= cpr) continue;
        norm_load<V>(a, b, i, c, add, x[k], y[k]);
        if (g_early) ld_row<V>(row_bcast(w, i), T_F32, c * V, g[k]);
    }
    double s1 = 0, s2 = 0;
#pragma unroll
    for (int k = 0; k < NORM_KEEP; k++)
        if (active && lane + k * tpr < cpr) norm_sum<V>(s, i, lane + k * tpr, add, x[k], y[k], s1, s2);
    for (u32 c = rest; active && c < cpr; c += tpr) {
        float xc[V], yc[V];
        norm_load<V>(a, b, i, c, add, xc, yc);
        norm_sum<V>(s, i, c, add, xc, yc, s1, s2);
    }
    // The sums' source rows (a pointer: a reference chosen at run time between two parameters
    // would copy both to the stack).
    const u8* src = active ? (add ? row_at(s, i) : row_at(a, i)) : nullptr;
    float mean = 0.0f;
    double var;
    if (rms) {
        var = row_sum(s2, tpr) / n0;
    } else {
        mean = (float)(row_sum(s1, tpr) / n0);
        double acc = 0;
#pragma unroll
        for (int k = 0; k < NORM_KEEP; k++)
            if (active && lane + k * tpr < cpr) norm_dev<V>(x[k], mean, acc);
        for (u32 c = rest; active && c < cpr; c += tpr) {
            float xc[V];
            ld_row<V>(src, T_F32, c * V, xc);
            norm_dev<V>(xc, mean, acc);
        }
        var = row_sum(acc, tpr) / n0;
    }
    const float scale = 1.0f / sqrtf((float)var + eps);
#pragma unroll
    for (int k = 0; k < NORM_KEEP; k++)
        if (active && lane + k * tpr < cpr)
            norm_store<V>(n, w, m, i, lane + k * tpr, flags, mean, scale, post, x[k], g[k], g_early);
    for (u32 c = rest; active && c < cpr; c += tpr) {
        float xc[V], gc[V];
        ld_row<V>(src, T_F32, c * V, xc);
        norm_store<V>(n, w, m, i, c, flags, mean, scale, post, xc, gc, false);
    }
    if (xq) {
#pragma unroll
        for (int k = 0; k < NORM_KEEP; k++) {
            const u32 c = lane + k * tpr;
            round_q8<V>(x[k], active && c < cpr, (u64)r * n0 + c * V, xq, xd);
        }
    }
}

extern "C" __global__ void __launch_bounds__(1024) k_norm_rows(TD a, TD b, TD s, TD n, TD w, TD m, float eps, int rms, int flags, float post_scale, float post_bias, u64 xq, u64 xd, int tpr, int vec) { GRID_DEPENDENCY_SYNC();
    const float2 post = make_float2(post_scale, post_bias);
    if (vec == 4) norm_rows<4, false>(a, b, s, n, w, m, eps, rms, flags, post, tpr, xq, xd);
    else norm_rows<1, false>(a, b, s, n, w, m, eps, rms, flags, post, tpr, xq, xd);
}

// k_norm_rows' arguments; the host launches it only with vec == 4, one block of tpr threads.
extern "C" __global__ void __launch_bounds__(1024) k_norm_row1(TD a, TD b, TD s, TD n, TD w, TD m, float eps, int rms, int flags, float post_scale, float post_bias, u64 xq, u64 xd, int tpr, int vec) { GRID_DEPENDENCY_SYNC();
    norm_rows<4, true>(a, b, s, n, w, m, eps, rms, flags, make_float2(post_scale, post_bias), tpr, xq, xd);
}
