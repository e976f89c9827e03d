// argsort and top_k: one block per row, a bitonic sort of (value, index) pairs in shared memory
// padded to a power of two (pads sort last); ties keep index order. top_k is a descending sort
// that writes the first k indices.

// True when element a must come after element b.
__device__ __forceinline__ bool after(float va, int ia, float vb, int ib, int n, int desc) {
    bool pa = ia >= n, pb = ib >= n;
    if (pa != pb) return pa;
    if (va != vb) return desc ? va < vb : va > vb;
    return ia > ib;
}

// Row r of argsort / top_k (also the MoE router's, k_moe_router), in npad * 8 bytes of dynamic
// shared memory.
__device__ __forceinline__ void argsort_row(const TD& a, const TD& d, int desc, int npad, i64 r) {
    extern __shared__ unsigned char smem[];
    float* vals = (float*)smem;
    int* idx = (int*)(vals + npad);
    i64 i1 = r % a.ne[1], i2 = (r / a.ne[1]) % a.ne[2], i3 = r / (a.ne[1] * a.ne[2]);
    int n = (int)a.ne[0];
    for (int k = threadIdx.x; k < npad; k += blockDim.x) {
        vals[k] = k < n ? load(a, k, i1, i2, i3) : 0.0f;
        idx[k] = k;
    }
    __syncthreads();
    for (int size = 2; size <= npad; size <<= 1) {
        for (int stride = size / 2; stride > 0; stride >>= 1) {
            for (int t = threadIdx.x; t < npad; t += blockDim.x) {
                int p = t ^ stride;
                if (p > t) {
                    bool up = (t & size) == 0;
                    bool swap = after(vals[t], idx[t], vals[p], idx[p], n, desc) == up;
                    if (swap) {
                        float tv = vals[t]; vals[t] = vals[p]; vals[p] = tv;
                        int ti = idx[t]; idx[t] = idx[p]; idx[p] = ti;
                    }
                }
            }
            __syncthreads();
        }
    }
    for (int k = threadIdx.x; k < d.ne[0]; k += blockDim.x) *(int*)addr(d, k, i1, i2, i3) = idx[k];
}

extern "C" __global__ void k_argsort(TD a, TD d, int desc, int npad) { GRID_DEPENDENCY_SYNC();
    argsort_row(a, d, desc, npad, blockIdx.x);
}
