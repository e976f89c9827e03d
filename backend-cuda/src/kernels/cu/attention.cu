// flash_attn_ext: one block of FA_THREADS threads per (head, query, sequence). Keys are taken in
// tiles of FA_THREADS (one score per thread), with an online softmax; each thread accumulates up to
// FA_MAX_DV / FA_THREADS output dims. K/V of any loadable type (F32/F16/BF16/Q8_0/Q4_0...).

#define FA_THREADS 128
#define FA_MAX_D 512
#define FA_PER_THREAD (FA_MAX_D / FA_THREADS)

extern "C" __global__ void k_flash_attn(TD q, TD k, TD v, TD m, TD sk, TD d, float scale, float max_bias,
                                        float softcap, int has_mask, int has_sinks) {
    __shared__ float qs[FA_MAX_D];
    __shared__ float w[FA_THREADS];
    i64 r = blockIdx.x;
    i64 h = r % d.ne[1], iq = (r / d.ne[1]) % d.ne[2], s = r / (d.ne[1] * d.ne[2]);
    int D = (int)q.ne[0], DV = (int)v.ne[0], n_kv = (int)k.ne[1];
    i64 hk = h / (q.ne[2] / k.ne[2]);
    float slope = alibi_slope(max_bias, (int)h, (int)q.ne[2]);
    float sc = softcap != 0.0f ? scale / softcap : scale;
    for (int c = threadIdx.x; c < D; c += FA_THREADS) qs[c] = load(q, c, iq, h, s);
    float acc[FA_PER_THREAD];
    for (int c = 0; c < FA_PER_THREAD; c++) acc[c] = 0.0f;
    float mx = NEG_INF, sum = 0.0f;
    __syncthreads();
    for (int t0 = 0; t0 < n_kv; t0 += FA_THREADS) {
        int j = t0 + threadIdx.x;
        float x = NEG_INF;
        if (j < n_kv) {
            float mv = has_mask ? slope * load(m, j, iq, h % m.ne[2], s % m.ne[3]) : 0.0f;
            if (mv != NEG_INF) {
                float dot = 0.0f;
                for (int c = 0; c < D; c++) dot += qs[c] * load(k, c, j, hk, s);
                x = dot * sc;
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
        int tn = min(FA_THREADS, n_kv - t0);
        for (int jj = 0; jj < tn; jj++) tsum += w[jj];
        sum = sum * alpha + tsum;
        for (int c = 0; c < FA_PER_THREAD; c++) {
            int dv = threadIdx.x + c * FA_THREADS;
            if (dv >= DV) break;
            float a = acc[c] * alpha;
            for (int jj = 0; jj < tn; jj++)
                if (w[jj] != 0.0f) a += w[jj] * load(v, dv, t0 + jj, hk, s);
            acc[c] = a;
        }
        mx = nm;
    }
    if (has_sinks) {
        float sink = load(sk, h, 0, 0, 0);
        float nm = fmaxf(mx, sink);
        float alpha = mx == NEG_INF ? 0.0f : expf(mx - nm);
        for (int c = 0; c < FA_PER_THREAD; c++) acc[c] *= alpha;
        sum = sum * alpha + expf(sink - nm);
    }
    float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
    for (int c = 0; c < FA_PER_THREAD; c++) {
        int dv = threadIdx.x + c * FA_THREADS;
        if (dv >= DV) break;
        store(d, dv, h, iq, s, acc[c] * inv);
    }
}
