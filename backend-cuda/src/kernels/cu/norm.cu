// Row kernels, one block per row: rms_norm / norm (k_norm), sum_rows, and soft_max with mask
// (broadcast over heads and sequences), ALiBi slopes and attention sinks. Sums are taken in f64.

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
