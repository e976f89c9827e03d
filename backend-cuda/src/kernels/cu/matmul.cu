// mul_mat_id: one warp per result element (row m of the chosen expert times one row of b), lanes
// striding over K; weights of any loadable type are decoded in place. (mul_mat itself converts its
// operands with k_cpy and calls cuBLAS.)

extern "C" __global__ void k_mul_mat_id(TD a, TD b, TD ids, TD d) {
    i64 n = nelem(d);
    i64 warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    i64 nwarps = ((i64)gridDim.x * blockDim.x) / 32;
    int lane = threadIdx.x % 32;
    for (i64 l = warp; l < n; l += nwarps) {
        i64 i[4];
        unravel(l, d.ne, i);
        int e = load_i32(ids, i[1], i[2], 0, 0);
        float s = 0.0f;
        if (e >= 0 && e < a.ne[2]) {
            i64 bi = i[1] % b.ne[1];
            for (i64 kk = lane; kk < a.ne[0]; kk += 32) s += load(a, kk, i[0], e, 0) * load(b, kk, bi, i[2], 0);
        } else {
            s = __int_as_float(0x7fc00000);
        }
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) store(d, i[0], i[1], i[2], i[3], s);
    }
}
