// Uses every name of the vendor prelude contract (ggml-gpu/src/kernels/cu/prelude_*.h), and the
// names the prelude relies on both vendors spelling the same, so that the syntax check compiles
// each of them for each vendor, including those no shared kernel uses yet.
extern "C" __global__ void k_prelude_probe(float* out, const unsigned short* half_in, unsigned short* half_out,
                                           const int4* bytes) {
    __shared__ float tile[WARP_SIZE];
    int lane = threadIdx.x % WARP_SIZE;
    float x = h2f(half_in[threadIdx.x]);
    tile[lane] = x;
    WARP_SYNC();
    x += tile[(lane + 1) % WARP_SIZE];
    double s = x;
    int c = lane;
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) {
        x += WARP_SHFL_XOR(x, o);
        s += WARP_SHFL_DOWN(s, o);
        c += WARP_SHFL_XOR(c, o);
    }
    const int4 q = bytes[threadIdx.x];
    const float2 pair = make_float2(x, (float)__float2int_rn(x));
    x = pair.x + pair.y;
    c = DOT4_I8(q.x, q.y, c);
    c = DOT4_I8(q.z, (unsigned)q.w, c);
    half_out[threadIdx.x] = f2h(x);
    if (lane == 0) out[threadIdx.x / WARP_SIZE] = (float)s + (float)c;
}

extern "C" __global__ void __launch_bounds__(256) k_common_probe(float* sum, unsigned* count) {
    extern __shared__ float dynamic_tile[];
    dynamic_tile[threadIdx.x] = __int_as_float(0x3f800000) * expf((float)blockIdx.x / gridDim.x);
    __syncthreads();
    atomicAdd(sum, dynamic_tile[blockDim.x - 1 - threadIdx.x]);
    atomicAdd(count, 1u);
}
