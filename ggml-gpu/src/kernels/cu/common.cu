// Shared device code of every kernel: the strided tensor descriptor `TD` (mirrors the Rust `TDesc`),
// bf16 conversions (the f16 ones, h2f/f2h, are the vendor prelude's), element loads for every
// supported type (block formats decoded one element at a time), element stores for scalar types,
// block reductions, and the 8-bit rounding of activations for the quantized products.
typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

#define T_F32 0
#define T_F16 1
#define T_BF16 2
#define T_I32 3
#define T_Q4_0 4
#define T_Q4_1 5
#define T_Q5_0 6
#define T_Q5_1 7
#define T_Q8_0 8
#define T_Q4K 9
#define T_Q5K 10
#define T_Q6K 11
#define T_MXFP4 12
// Q4_0 / Q8_0 regrouped per 32 blocks (GPU weights; decode.cu): a group of 32 units is the type's
// block of 1024 elements.
#define T_Q4_0G 13
#define T_Q8_0G 14

#define NEG_INF __int_as_float(0xff800000)

struct TD {
    u64 ptr;
    i64 ne[4];
    i64 nb[4];
    int type;
    int pad;
};

__device__ __forceinline__ float bf2f(u16 b) { return __uint_as_float(((u32)b) << 16); }
__device__ __forceinline__ u16 f2bf(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}
__device__ __forceinline__ u16 ld16(const u8* p) { return *(const u16*)p; }

__device__ __forceinline__ int block_size(int t) {
    return t <= T_I32 ? 1 : (t >= T_Q4K && t <= T_Q6K ? 256 : (t >= T_Q4_0G ? 1024 : 32));
}

// Address of element (or block holding element) i.
__device__ __forceinline__ u8* addr(const TD& t, i64 i0, i64 i1, i64 i2, i64 i3) {
    return (u8*)t.ptr + (i0 / block_size(t.type)) * t.nb[0] + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
}

__device__ __forceinline__ int nib(const u8* qs, int j) { return j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4); }

__device__ __forceinline__ void scale_min_k4(int j, const u8* s, int* sc, int* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Element j of the block at b.
__device__ float dequant(const u8* b, int type, int j) {
    switch (type) {
    case T_Q4_0: return h2f(ld16(b)) * (float)(nib(b + 2, j) - 8);
    case T_Q4_1: return h2f(ld16(b)) * (float)nib(b + 4, j) + h2f(ld16(b + 2));
    case T_Q5_0: {
        u32 qh = b[2] | (b[3] << 8) | (b[4] << 16) | ((u32)b[5] << 24);
        int q = nib(b + 6, j) | (((qh >> j) & 1) << 4);
        return h2f(ld16(b)) * (float)(q - 16);
    }
    case T_Q5_1: {
        u32 qh = b[4] | (b[5] << 8) | (b[6] << 16) | ((u32)b[7] << 24);
        int q = nib(b + 8, j) | (((qh >> j) & 1) << 4);
        return h2f(ld16(b)) * (float)q + h2f(ld16(b + 2));
    }
    case T_Q8_0: return h2f(ld16(b)) * (float)(signed char)b[2 + j];
    case T_Q4K:
    case T_Q5K: {
        float d = h2f(ld16(b)), dmin = h2f(ld16(b + 2));
        const u8* qs = b + (type == T_Q4K ? 16 : 48);
        int c = j / 64, l = j % 32;
        int byte = qs[32 * c + l];
        int q = (j % 64 < 32) ? (byte & 15) : (byte >> 4);
        if (type == T_Q5K) q |= ((b[16 + l] >> (j / 32)) & 1) << 4;
        int sc, m;
        scale_min_k4(j / 32, b + 4, &sc, &m);
        return (d * (float)sc) * (float)q - dmin * (float)m;
    }
    case T_Q6K: {
        int h = j / 128, r = j % 128, k = r / 32, l = r % 32;
        int lo = (b[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 15;
        int hi = (b[128 + 32 * h + l] >> (2 * k)) & 3;
        float d = h2f(ld16(b + 208));
        return (d * (float)(signed char)b[192 + j / 16]) * (float)((lo | (hi << 4)) - 32);
    }
    case T_MXFP4: {
        const int vals[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
        u32 e = b[0];
        float d = __uint_as_float(e < 2 ? (0x00200000u << e) : ((e - 1) << 23));
        return d * (float)vals[nib(b + 1, j)];
    }
    case T_Q4_0G: {
        const int u = j / 32, e = j % 32;
        return h2f(ld16(b + 512 + 2 * u)) * (float)(nib(b + 16 * u, e) - 8);
    }
    case T_Q8_0G: {
        const int u = j / 32, e = j % 32;
        return h2f(ld16(b + 1024 + 2 * u)) * (float)(signed char)b[512 * (e / 16) + 16 * u + e % 16];
    }
    }
    return __int_as_float(0x7fc00000);
}

__device__ float load(const TD& t, i64 i0, i64 i1, i64 i2, i64 i3) {
    const u8* p = addr(t, i0, i1, i2, i3);
    switch (t.type) {
    case T_F32: return *(const float*)p;
    case T_F16: return h2f(ld16(p));
    case T_BF16: return bf2f(ld16(p));
    case T_I32: return (float)*(const int*)p;
    default: return dequant(p, t.type, (int)(i0 % block_size(t.type)));
    }
}

__device__ __forceinline__ int load_i32(const TD& t, i64 i0, i64 i1, i64 i2, i64 i3) {
    return *(const int*)addr(t, i0, i1, i2, i3);
}

__device__ void store(const TD& t, i64 i0, i64 i1, i64 i2, i64 i3, float v) {
    u8* p = addr(t, i0, i1, i2, i3);
    switch (t.type) {
    case T_F32: *(float*)p = v; break;
    case T_F16: *(u16*)p = f2h(v); break;
    case T_BF16: *(u16*)p = f2bf(v); break;
    case T_I32: *(int*)p = (int)v; break;
    }
}

// Copies one element from s to d: raw bytes for equal scalar types, else through f32.
__device__ void xfer(const TD& s, i64 a0, i64 a1, i64 a2, i64 a3, const TD& d, i64 b0, i64 b1, i64 b2, i64 b3) {
    if (s.type == d.type && s.type == T_I32) {
        *(int*)addr(d, b0, b1, b2, b3) = *(const int*)addr(s, a0, a1, a2, a3);
    } else if (s.type == d.type && (s.type == T_F16 || s.type == T_BF16)) {
        *(u16*)addr(d, b0, b1, b2, b3) = ld16(addr(s, a0, a1, a2, a3));
    } else {
        store(d, b0, b1, b2, b3, load(s, a0, a1, a2, a3));
    }
}

__device__ __forceinline__ void unravel(i64 l, const i64* ne, i64* i) {
    i[0] = l % ne[0]; l /= ne[0];
    i[1] = l % ne[1]; l /= ne[1];
    i[2] = l % ne[2];
    i[3] = l / ne[2];
}

__device__ __forceinline__ i64 nelem(const TD& t) { return t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]; }

#define GRID_LOOP(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ double block_sum(double v) {
    __shared__ double part[32];
    for (int o = 16; o > 0; o >>= 1) v += WARP_SHFL_XOR(v, o);
    int w = threadIdx.x / 32, l = threadIdx.x % 32;
    __syncthreads();
    if (l == 0) part[w] = v;
    __syncthreads();
    double t = 0;
    for (int k = 0; k < (int)(blockDim.x / 32); k++) t += part[k];
    return t;
}

__device__ float block_max(float v) {
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, WARP_SHFL_XOR(v, o));
    int w = threadIdx.x / 32, l = threadIdx.x % 32;
    __syncthreads();
    if (l == 0) part[w] = v;
    __syncthreads();
    float t = NEG_INF;
    for (int k = 0; k < (int)(blockDim.x / 32); k++) t = fmaxf(t, part[k]);
    return t;
}

// ALiBi slope of head h (1 without bias), as ggml.
__device__ float alibi_slope(float max_bias, int h, int n_head) {
    if (max_bias <= 0.0f) return 1.0f;
    int n_log2 = 1 << (int)floorf(log2f((float)(n_head > 1 ? n_head : 1)));
    float m0 = powf(2.0f, -max_bias / n_log2);
    float m1 = powf(2.0f, -(max_bias / 2.0f) / n_log2);
    return h < n_log2 ? powf(m0, (float)(h + 1)) : powf(m1, (float)(2 * (h - n_log2) + 1));
}

// Keeps the stream busy for about `cycles` clock cycles (the profiler queues a call's launches
// behind it so that its events time the kernels, not the host).
extern "C" __global__ void k_hold(u64 cycles) { GRID_DEPENDENCY_SYNC();
    const long long t0 = clock64();
    while ((u64)(clock64() - t0) < cycles) {
    }
}

// Row-contiguous access for the fast paths (the host checks that every row is contiguous, that
// the element counts fit 32 bits, and for V = 4 that rows start 4-element aligned): V elements
// k..k+V-1 of a row of a float type, loaded or stored with one vector access.
template <int V> __device__ __forceinline__ void ld_row(const u8* row, int type, u32 k, float* v) {
    if (type == T_F32) {
        if constexpr (V == 4) {
            float4 t = *(const float4*)(row + 4 * (u64)k);
            v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
        } else {
            v[0] = *(const float*)(row + 4 * (u64)k);
        }
        return;
    }
    u16 h[V];
    if constexpr (V == 4) {
        uint2 t = *(const uint2*)(row + 2 * (u64)k);
        h[0] = (u16)t.x; h[1] = (u16)(t.x >> 16); h[2] = (u16)t.y; h[3] = (u16)(t.y >> 16);
    } else {
        h[0] = ld16(row + 2 * (u64)k);
    }
    for (int j = 0; j < V; j++) v[j] = type == T_F16 ? h2f(h[j]) : bf2f(h[j]);
}

template <int V> __device__ __forceinline__ void st_row(u8* row, int type, u32 k, const float* v) {
    if (type == T_F32) {
        if constexpr (V == 4) {
            *(float4*)(row + 4 * (u64)k) = make_float4(v[0], v[1], v[2], v[3]);
        } else {
            *(float*)(row + 4 * (u64)k) = v[0];
        }
        return;
    }
    u16 h[V];
    for (int j = 0; j < V; j++) h[j] = type == T_F16 ? f2h(v[j]) : f2bf(v[j]);
    if constexpr (V == 4) {
        *(uint2*)(row + 2 * (u64)k) = make_uint2(h[0] | ((u32)h[1] << 16), h[2] | ((u32)h[3] << 16));
    } else {
        *(u16*)(row + 2 * (u64)k) = h[0];
    }
}

// Start of row i = (i1, i2, i3) of t.
__device__ __forceinline__ u8* row_at(const TD& t, const u32* i) {
    return (u8*)t.ptr + (i64)i[0] * t.nb[1] + (i64)i[1] * t.nb[2] + (i64)i[2] * t.nb[3];
}

// Start of row i of t broadcast over the axes where t is shorter (ggml's repeat rule).
__device__ __forceinline__ u8* row_bcast(const TD& t, const u32* i) {
    return (u8*)t.ptr + (i64)(i[0] % (u32)t.ne[1]) * t.nb[1] + (i64)(i[1] % (u32)t.ne[2]) * t.nb[2] +
           (i64)(i[2] % (u32)t.ne[3]) * t.nb[3];
}

// Row r of the rows of shape (ne1, ne2, ...) as its three indices, in 32-bit arithmetic.
__device__ __forceinline__ void row_index(u32 r, u32 ne1, u32 ne2, u32* i) {
    i[0] = r % ne1;
    r /= ne1;
    i[1] = r % ne2;
    i[2] = r / ne2;
}

// Rows of t (fewer than 2^31 on the fast paths).
__device__ __forceinline__ u32 nrows32(const TD& t) { return (u32)(t.ne[1] * t.ne[2] * t.ne[3]); }

// The fast paths' grid-stride loop over chunks (fewer than 2^31; the grid has at most 2^28 threads).
#define CHUNK_LOOP(c, n) for (u32 c = blockIdx.x * blockDim.x + threadIdx.x; c < (n); c += gridDim.x * blockDim.x)

// Chunk c of the rows of d cut into `cpr` chunks each: sets its row i, returns its index in the row.
__device__ __forceinline__ u32 chunk_row(u32 c, u32 cpr, const TD& d, u32* i) {
    u32 r = c / cpr;
    row_index(r, (u32)d.ne[1], (u32)d.ne[2], i);
    return c - r * cpr;
}

// The first statement of a kernel that asks for some of its operands in the L2 before it waits
// for the launch before it (decode attention: its K and V rows): `prefetch` may only call
// PREFETCH_L2 (through rows_to_l2), which reads nothing into the kernel, so nothing half written
// can be seen. Launched as a programmatic dependent, the kernel's blocks that find room start
// while the kernel before still runs, and the lines stream in from memory meanwhile. (The GEMV
// kernels asking for their weights this way lost: H100, Q4_0 decode 359 -> 349 t/s, F16 164 -> 132.)
#define L2_THEN_SYNC(prefetch) \
    do { \
        prefetch; \
        GRID_DEPENDENCY_SYNC(); \
    } while (0)

// Rows j0 .. j1 (none when j1 <= j0) of `bytes` each, `stride` bytes apart from row 0 at w, asked
// into the L2 by the block's threads: a request per 128-byte line of each row.
__device__ __forceinline__ void rows_to_l2(u64 w, i64 stride, i64 j0, i64 j1, int bytes) {
    const int lines = (bytes + 127) / 128 + 1;  // a row may start inside a line
    for (i64 t = threadIdx.x; t < (j1 - j0) * lines; t += blockDim.x) {
        const u64 row = w + (u64)((j0 + t / lines) * stride), at = (row & ~(u64)127) + (u64)(t % lines) * 128;
        if (at < row + (u64)bytes) PREFETCH_L2((const void*)at);
    }
}

// Sum over the threads of one row: `tpr` consecutive threads of the block (a power of two, at
// least 32 and at most blockDim.x); every thread of the row gets the result, the same bits in
// each (the groups of 32 threads meet by exchanges twice: lane k of each group takes group k's
// sum the second time, not a loop over them, which a single-row decode norm waits for).
__device__ double row_sum(double v, int tpr) {
    __shared__ double part[32];
    for (int o = 16; o > 0; o >>= 1) v += WARP_SHFL_XOR(v, o);
    if (tpr == 32) return v;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, groups = tpr / 32;
    __syncthreads();
    if (lane == 0) part[w] = v;
    __syncthreads();
    double t = lane < groups ? part[(threadIdx.x / tpr) * groups + lane] : 0.0;
    for (int o = groups / 2; o > 0; o >>= 1) t += WARP_SHFL_XOR(t, o);
    // Lanes 0 .. groups - 1 hold the sum; every lane takes lane 0's.
    return WARP_SHFL_XOR(t, lane);
}

// Values x[0..V) of a unit of 32 activations, element `at` of the rounded array, rounded to 8 bits
// (scale = amax / 127, round to nearest) into xq, with (scale, scale * sum) of the unit into xd:
// the 32 / V consecutive lanes that hold the unit meet by exchanges. Every lane of the warp calls
// it (`valid` marks lanes with real values). k_quantize_q8 rounds this way, and k_norm_rows where
// its chain feeds products of quantized weights.
template <int V>
__device__ __forceinline__ void round_q8(const float (&x)[V], bool valid, u64 at, u64 xq, u64 xd) {
    float amax = 0.0f;
    float v[V];
    for (int j = 0; j < V; j++) {
        v[j] = valid ? x[j] : 0.0f;
        amax = fmaxf(amax, fabsf(v[j]));
    }
    for (int o = 1; o < 32 / V; o <<= 1) amax = fmaxf(amax, WARP_SHFL_XOR(amax, o));
    const float d = amax / 127.0f;
    int q[V], qsum = 0;
    for (int j = 0; j < V; j++) {
        q[j] = amax == 0.0f ? 0 : __float2int_rn(v[j] * (127.0f / amax));
        qsum += q[j];
    }
    for (int o = 1; o < 32 / V; o <<= 1) qsum += WARP_SHFL_XOR(qsum, o);
    if (!valid) return;
    for (int j = 0; j < V; j++) ((signed char*)xq)[at + j] = (signed char)q[j];
    if (at % 32 == 0) ((float2*)xd)[at / 32] = make_float2(d, d * (float)qsum);
}
