// The gated delta rule (gated_delta_net): the whole batch in one launch. Every value column of a
// head's state S[key, value] evolves on its own given the keys and queries, so a group of `lanes`
// neighbouring threads (4 for key heads of up to 128, 8 up to 256: DN_KEYS_PER_LANE keys each, in
// registers) owns one column of one value head: grid (value heads, column tiles of blockDim /
// lanes), the token's key and query staged in shared memory, the column's two dot products per
// token summed over its lanes by exchanges. Lane l of a group holds keys l, l + lanes, ... (the
// group reads consecutive shared-memory words). gb holds per head and token the log decay g, then
// beta. Per token t: S = e^g S, u = beta (v - S^T k), S += k u^T, o = S^T q. The result (dense,
// the dispatch's condition) holds the outputs [Dv, H, T] and then the final state in the layout of
// the state operand [Dk, Dv, H]; with `sc` (a fused copy of that state, e.g. back into the state
// operand: each element is read and written by the same thread) the final state is written there
// too.

#define DN_MAX_DK 256
#define DN_KEYS_PER_LANE 32

// Element (i0, i1, i2) of the F32 operand t (the dispatch takes F32 operands only): no type switch
// and no block-size division in the per-token loop.
__device__ __forceinline__ float* dn_f32(const TD& t, i64 i0, i64 i1, i64 i2) {
    return (float*)((u8*)t.ptr + i0 * t.nb[0] + i1 * t.nb[1] + i2 * t.nb[2]);
}

// The sum of x over the `lanes` (a power of two, at most 32) neighbouring lanes of a group.
__device__ __forceinline__ float dn_group_sum(float x, int lanes) {
    for (int o = 1; o < lanes; o <<= 1) x += WARP_SHFL_XOR(x, o);
    return x;
}

// The rule for groups of L lanes per column (see the kernel).
template <int L>
__device__ __forceinline__ void dn_rule(const TD& q, const TD& k, const TD& v, const TD& gb, const TD& s0, const TD& d,
                                        const TD& sc, int tiled, float (&sk)[DN_MAX_DK], float (&sq)[DN_MAX_DK]) {
    float s[DN_KEYS_PER_LANE];
    const int dk = (int)k.ne[0];
    const i64 hk = k.ne[1], n_tok = k.ne[2];
    const i64 dv = v.ne[0], nh = v.ne[1];
    const i64 h = blockIdx.x;
    const int sub = (int)threadIdx.x % L;
    const i64 j = ((i64)blockIdx.y * blockDim.x + threadIdx.x) / L;
    const i64 kh = tiled ? h % hk : h / (nh / hk);
    const bool live = j < dv;
#pragma unroll
    for (int e = 0; e < DN_KEYS_PER_LANE; e++) {
        const int i = e * L + sub;
        s[e] = live && i < dk ? *dn_f32(s0, i, j, h) : 0.0f;
    }
    for (i64 t = 0; t < n_tok; t++) {
        __syncthreads();
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            sk[i] = *dn_f32(k, i, kh, t);
            sq[i] = *dn_f32(q, i, kh, t);
        }
        __syncthreads();
        // Every lane of a group takes part in its exchanges, live or not (a group is live or not
        // as a whole: its lanes share j).
        const float decay = expf(*dn_f32(gb, h, t, 0));
        float r = 0.0f;
#pragma unroll
        for (int e = 0; e < DN_KEYS_PER_LANE; e++) {
            const int i = e * L + sub;
            s[e] *= decay;
            if (i < dk) r += s[e] * sk[i];
        }
        r = dn_group_sum(r, L);
        const float u = live ? *dn_f32(gb, h, t, 1) * (*dn_f32(v, j, h, t) - r) : 0.0f;
        float o = 0.0f;
#pragma unroll
        for (int e = 0; e < DN_KEYS_PER_LANE; e++) {
            const int i = e * L + sub;
            if (i < dk) {
                s[e] += sk[i] * u;
                o += s[e] * sq[i];
            }
        }
        o = dn_group_sum(o, L);
        if (live && sub == 0) *dn_f32(d, j, h, t) = o;
    }
    if (!live) return;
    float* state_out = (float*)d.ptr + n_tok * dv * nh + (h * dv + j) * dk;
#pragma unroll
    for (int e = 0; e < DN_KEYS_PER_LANE; e++) {
        const int i = e * L + sub;
        if (i < dk) state_out[i] = s[e];
    }
    if (!sc.ptr) return;
#pragma unroll
    for (int e = 0; e < DN_KEYS_PER_LANE; e++) {
        const int i = e * L + sub;
        if (i < dk) *dn_f32(sc, i, j, h) = s[e];
    }
}

// lanes: 4 or 8 per value column; sc absent (ptr 0) or the F32 target of the final state's copy.
extern "C" __global__ void k_gated_delta_net(TD q, TD k, TD v, TD gb, TD s0, TD d, TD sc, int tiled, int lanes) {
    GRID_DEPENDENCY_SYNC();
    __shared__ float sk[DN_MAX_DK];
    __shared__ float sq[DN_MAX_DK];
    if (lanes == 8)
        dn_rule<8>(q, k, v, gb, s0, d, sc, tiled, sk, sq);
    else
        dn_rule<4>(q, k, v, gb, s0, d, sc, tiled, sk, sq);
}
