// The gated delta rule (gated_delta_net): the whole batch in one launch. Every value column of a
// head's state S[key, value] evolves on its own given the keys and queries, so each thread owns
// one column (DN_MAX_DK keys at most, in its registers / local memory) of one value head: grid
// (value heads, column tiles of blockDim), the token's key and query staged in shared memory.
// gb holds per head and token the log decay g, then beta. Per token t: S = e^g S, u = beta (v - S^T k), S += k u^T, o = S^T q. The result holds the outputs
// [Dv, H, T] and then the final state in the layout of the state operand [Dk, Dv, H].

#define DN_MAX_DK 256

extern "C" __global__ void k_gated_delta_net(TD q, TD k, TD v, TD gb, TD s0, TD d, int tiled) { GRID_DEPENDENCY_SYNC();
    __shared__ float sk[DN_MAX_DK];
    __shared__ float sq[DN_MAX_DK];
    float s[DN_MAX_DK];
    const i64 dk = k.ne[0], hk = k.ne[1], n_tok = k.ne[2];
    const i64 dv = v.ne[0], nh = v.ne[1];
    const i64 h = blockIdx.x;
    const i64 j = (i64)blockIdx.y * blockDim.x + threadIdx.x;
    const i64 kh = tiled ? h % hk : h / (nh / hk);
    const bool live = j < dv;
    if (live) {
        for (i64 i = 0; i < dk; i++) s[i] = load(s0, i, j, h, 0);
    }
    for (i64 t = 0; t < n_tok; t++) {
        __syncthreads();
        for (i64 i = threadIdx.x; i < dk; i += blockDim.x) {
            sk[i] = load(k, i, kh, t, 0);
            sq[i] = load(q, i, kh, t, 0);
        }
        __syncthreads();
        if (!live) continue;
        const float decay = expf(load(gb, h, t, 0, 0));
        float r = 0.0f;
        for (i64 i = 0; i < dk; i++) {
            s[i] *= decay;
            r += s[i] * sk[i];
        }
        const float u = load(gb, h, t, 1, 0) * (load(v, j, h, t, 0) - r);
        float o = 0.0f;
        for (i64 i = 0; i < dk; i++) {
            s[i] += sk[i] * u;
            o += s[i] * sq[i];
        }
        store(d, j, h, t, 0, o);
    }
    if (!live) return;
    for (i64 i = 0; i < dk; i++) {
        const i64 f = n_tok * dv * nh + (h * dv + j) * dk + i;
        store(d, f % dv, (f / dv) % nh, f / (dv * nh), 0, s[i]);
    }
}
