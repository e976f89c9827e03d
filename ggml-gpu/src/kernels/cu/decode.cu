// Whole-unit decoders of weight rows stored in their own format, shared by the GEMV kernels and the
// F16 dequantizer (plus the F32 to F16 conversion of GEMM activations): a quantized unit is 32 consecutive weights of a row as 8 packed signed int8x4
// (for dp4a against 8-bit activations) with a scale for the first and second 16 (Q6_K has two) and
// an offset per unit of activation sum; a float unit is 8 weights. Loads are as wide as the block's
// alignment allows (2 bytes for Q4_0/Q5_0/Q8_0/Q6_K, 4 for Q4_1/Q5_1, 16 for Q4_K/Q5_K, the
// regrouped Q4_0/Q8_0 and floats).

// 32 weights: value 4i+t is byte t of w[i] (signed, or unsigned below 128), times sa (values 0..15)
// or sb (16..31), plus m per unit of the activations' sum (the offset of Q4_1/Q5_1/K-quants, and
// the bias of Q4_0/Q5_0 times their scale).
struct QUnit {
    int w[8];
    float sa, sb, m;
};

__device__ __forceinline__ u32 ld32_a2(const u8* p) {
    const u16* h = (const u16*)p;
    return (u32)h[0] | ((u32)h[1] << 16);
}
__device__ __forceinline__ u32 ld32_a4(const u8* p) { return *(const u32*)p; }
__device__ __forceinline__ uint4 ld128(const u8* p) { return *(const uint4*)p; }

// Bits 0..3 of v moved to bit 4 of bytes 0..3.
__device__ __forceinline__ u32 spread_bit4(u32 v) {
    return ((v & 1u) << 4) | ((v & 2u) << 11) | ((v & 4u) << 18) | ((v & 8u) << 25);
}

// Per byte q - bias as signed int8, for bytes q < 128 and bias <= 64 (no borrow between bytes):
// Q6_K, whose two scales per unit leave no single offset to carry the bias.
__device__ __forceinline__ int minus_bias(u32 q, u32 bias4) { return (int)(((q | 0x80808080u) - bias4) ^ 0x80808080u); }

// The 32 weights of a legacy block of 16 nibble bytes at qs (low nibbles first), plus the fifth
// bits qh (bit j for weight j) when given.
__device__ __forceinline__ void nibbles(const u8* qs, bool aligned4, const u32* qh, QUnit& u) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        u32 q = aligned4 ? ld32_a4(qs + 4 * i) : ld32_a2(qs + 4 * i);
        u32 lo = q & 0x0F0F0F0Fu, hi = (q >> 4) & 0x0F0F0F0Fu;
        if (qh) {
            lo |= spread_bit4(*qh >> (4 * i));
            hi |= spread_bit4(*qh >> (16 + 4 * i));
        }
        u.w[i] = (int)lo;
        u.w[4 + i] = (int)hi;
    }
}

// Four MXFP4 codes (the low nibbles of the bytes of q) as doubled E2M1 values in signed bytes:
// byte permutes pick each code's magnitude (codes 0..7: 0 1 2 3 4 6 8 12) and its negation, and the
// code's sign bit (3) chooses between them.
__device__ __forceinline__ int mxfp4_word(u32 q) {
    const u32 c = q & 0x07070707u, t = c | (c >> 4);
    const u32 sel = (t & 0xFFu) | ((t >> 8) & 0xFF00u);
    const u32 pos = __byte_perm(0x03020100u, 0x0C080604u, sel);
    const u32 neg = __byte_perm(0xFDFEFF00u, 0xF4F8FAFCu, sel);
    const u32 sign = ((q >> 3) & 0x01010101u) * 0xFFu;
    return (int)((pos & ~sign) | (neg & sign));
}

// Unit s (weights 32s..32s+31) of the row at `row`, of quantized type T.
template <int T>
__device__ __forceinline__ void decode_q(const u8* row, int s, QUnit& u) {
    u.m = 0.0f;
    if (T == T_Q4_0) {
        // The bias (8) goes into the offset: dot(q - 8, x) = dot(q, x) - 8 sum(x).
        const u8* p = row + 18 * s;
        u.sa = u.sb = h2f(ld16(p));
        u.m = -8.0f * u.sa;
        nibbles(p + 2, false, 0, u);
    } else if (T == T_Q4_1) {
        const u8* p = row + 20 * s;
        u.sa = u.sb = h2f(ld16(p));
        u.m = h2f(ld16(p + 2));
        nibbles(p + 4, true, 0, u);
    } else if (T == T_Q5_0) {
        const u8* p = row + 22 * s;
        u.sa = u.sb = h2f(ld16(p));
        u.m = -16.0f * u.sa;
        u32 qh = ld32_a2(p + 2);
        nibbles(p + 6, false, &qh, u);
    } else if (T == T_Q5_1) {
        const u8* p = row + 24 * s;
        u.sa = u.sb = h2f(ld16(p));
        u.m = h2f(ld16(p + 2));
        u32 qh = ld32_a4(p + 4);
        nibbles(p + 8, true, &qh, u);
    } else if (T == T_Q8_0) {
        const u8* p = row + 34 * s;
        u.sa = u.sb = h2f(ld16(p));
#pragma unroll
        for (int i = 0; i < 8; i++) u.w[i] = (int)ld32_a2(p + 2 + 4 * i);
    } else if (T == T_Q4_0G || T == T_Q8_0G) {
        // Unit j of a group of 32: its 16-byte quant halves at 512 h + 16 j, its scale after the
        // group's quants (rows start 16-byte aligned: the host checks).
        const int j = s & 31, halves = T == T_Q4_0G ? 1 : 2;
        const u8* g = row + (T == T_Q4_0G ? 576 : 1088) * (s >> 5);
        u.sa = u.sb = h2f(ld16(g + 512 * halves + 2 * j));
        const uint4 a = ld128(g + 16 * j);
        if (T == T_Q4_0G) {
            u.m = -8.0f * u.sa;
            const u32 q[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                u.w[i] = (int)(q[i] & 0x0F0F0F0Fu);
                u.w[4 + i] = (int)((q[i] >> 4) & 0x0F0F0F0Fu);
            }
        } else {
            const uint4 b = ld128(g + 512 + 16 * j);
            const u32 q[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 8; i++) u.w[i] = (int)q[i];
        }
    } else if (T == T_MXFP4) {
        const u8* p = row + 17 * s;
        u32 e = p[0];
        u.sa = u.sb = __uint_as_float(e < 2 ? (0x00200000u << e) : ((e - 1) << 23));
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const u8* q = p + 1 + 4 * i;
            u32 v = (u32)q[0] | ((u32)q[1] << 8) | ((u32)q[2] << 16) | ((u32)q[3] << 24);
            u.w[i] = mxfp4_word(v & 0x0F0F0F0Fu);
            u.w[4 + i] = mxfp4_word((v >> 4) & 0x0F0F0F0Fu);
        }
    } else if (T == T_Q4K || T == T_Q5K) {
        const int j = s & 7;
        const u8* p = row + (T == T_Q4K ? 144 : 176) * (s >> 3);
        int sc, mn;
        scale_min_k4(j, p + 4, &sc, &mn);
        u.sa = u.sb = h2f(ld16(p)) * (float)sc;
        u.m = -h2f(ld16(p + 2)) * (float)mn;
        const u8* qs = p + (T == T_Q4K ? 16 : 48) + 32 * (j >> 1);
        uint4 a = ld128(qs), b = ld128(qs + 16);
        u32 q[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        const int shift = 4 * (j & 1);
        if (T == T_Q5K) {
            uint4 c = ld128(p + 16), d = ld128(p + 32);
            u32 h[8] = {c.x, c.y, c.z, c.w, d.x, d.y, d.z, d.w};
#pragma unroll
            for (int i = 0; i < 8; i++) u.w[i] = (int)(((q[i] >> shift) & 0x0F0F0F0Fu) | (((h[i] >> j) & 0x01010101u) << 4));
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) u.w[i] = (int)((q[i] >> shift) & 0x0F0F0F0Fu);
        }
    } else if (T == T_Q6K) {
        const int j = s & 7, h = j >> 2, k = j & 3;
        const u8* p = row + 210 * (s >> 3);
        const u8* ql = p + 64 * h + 32 * (k & 1);
        const u8* qh = p + 128 + 32 * h;
        const int sl = 4 * (k >> 1), sh = 2 * k;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            u32 v = ((ld32_a2(ql + 4 * i) >> sl) & 0x0F0F0F0Fu) | (((ld32_a2(qh + 4 * i) >> sh) & 0x03030303u) << 4);
            u.w[i] = minus_bias(v, 0x20202020u);
        }
        float d = h2f(ld16(p + 208));
        u.sa = d * (float)(signed char)p[192 + 2 * j];
        u.sb = d * (float)(signed char)p[193 + 2 * j];
    }
}

// Weight k of a float row of type T.
template <int T>
__device__ __forceinline__ float float_at(const u8* row, i64 k) {
    if (T == T_F32) return ((const float*)row)[k];
    if (T == T_F16) return h2f(((const u16*)row)[k]);
    return bf2f(((const u16*)row)[k]);
}

// Unit s (weights 8s..8s+7) of a 16-byte aligned float row of type T.
template <int T>
__device__ __forceinline__ void decode_f(const u8* row, int s, float* w) {
    if (T == T_F32) {
        uint4 a = ld128(row + 32 * s), b = ld128(row + 32 * s + 16);
        u32 v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int i = 0; i < 8; i++) w[i] = __uint_as_float(v[i]);
    } else {
        uint4 a = ld128(row + 16 * s);
        u32 v[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (T == T_F16) {
                w[2 * i] = h2f((u16)(v[i] & 0xFFFFu));
                w[2 * i + 1] = h2f((u16)(v[i] >> 16));
            } else {
                w[2 * i] = __uint_as_float(v[i] << 16);
                w[2 * i + 1] = __uint_as_float(v[i] & 0xFFFF0000u);
            }
        }
    }
}

// Activations rounded to 8 bits per 32 (as ggml's Q8_1): for each column of b (any float type and
// strides), int8 values at xq[col * K + k] and (scale d, d * sum of the 32 int8 values) at
// xd[col * K/32 + k/32]. The sum of the rounded values (not of the inputs) keeps a weight offset's
// term consistent with the rest of the dot product: its error is then that of the weights' values,
// not of their larger unsigned part. One warp per 32 values; 32-bit index arithmetic (activations
// of fewer than 2^32 units of 32, rows of F32 contiguous along the row read directly).
extern "C" __global__ void k_quantize_q8(TD b, u64 xq, u64 xd) { GRID_DEPENDENCY_SYNC();
    const u32 per_col = (u32)(b.ne[0] / 32), total = per_col * nrows32(b);
    const bool f32_rows = b.type == T_F32 && b.nb[0] == 4;
    const int lane = threadIdx.x % 32;
    for (u32 w = (blockIdx.x * blockDim.x + threadIdx.x) / 32; w < total; w += gridDim.x * blockDim.x / 32) {
        const u32 col = w / per_col, k = (w % per_col) * 32 + lane;
        u32 i[3];
        row_index(col, (u32)b.ne[1], (u32)b.ne[2], i);
        const float v[1] = {f32_rows ? ((const float*)row_at(b, i))[k] : load(b, k, i[0], i[1], i[2])};
        round_q8<1>(v, true, (u64)w * 32 + lane, xq, xd);
    }
}

// Contiguous F32 activations to contiguous F16 or BF16 (GEMM operands): four values per thread
// with 16-byte loads and 8-byte stores when both ends allow, else one.
template <bool BF16>
__device__ __forceinline__ u16 half_of(float v) {
    return BF16 ? f2bf(v) : f2h(v);
}
template <bool BF16>
__device__ __forceinline__ void halves_from_f32(u64 src, u64 dst, u64 count) {
    const i64 n = (i64)count;
    const float* x = (const float*)src;
    u16* y = (u16*)dst;
    if (((src | dst) & 15) == 0) {
        const i64 n4 = n / 4;
        GRID_LOOP(i, n4) {
            const float4 v = ((const float4*)x)[i];
            ((uint2*)y)[i] = make_uint2((u32)half_of<BF16>(v.x) | ((u32)half_of<BF16>(v.y) << 16),
                                        (u32)half_of<BF16>(v.z) | ((u32)half_of<BF16>(v.w) << 16));
        }
        GRID_LOOP(i, n - 4 * n4) y[4 * n4 + i] = half_of<BF16>(x[4 * n4 + i]);
    } else {
        GRID_LOOP(i, n) y[i] = half_of<BF16>(x[i]);
    }
}
extern "C" __global__ void k_f16_from_f32(u64 src, u64 dst, u64 count) { GRID_DEPENDENCY_SYNC();
    halves_from_f32<false>(src, dst, count);
}
extern "C" __global__ void k_bf16_from_f32(u64 src, u64 dst, u64 count) { GRID_DEPENDENCY_SYNC();
    halves_from_f32<true>(src, dst, count);
}

// Threads of a dequantizer block (one unit of 32 weights each).
#define DQ_THREADS 128

// Quantized weights [K, M, A2, A3] (rows contiguous, any row and batch strides) to contiguous F16:
// one thread per unit of 32, whose 64 bytes of output go through shared memory so that the block
// writes its units' contiguous output with coalesced 16-byte stores.
template <int T>
__device__ __forceinline__ void dequant_f16(const TD& a, u64 out) {
    __shared__ uint4 tile[DQ_THREADS * 4];
    const i64 per_row = a.ne[0] / 32;
    const i64 total = per_row * a.ne[1] * a.ne[2] * a.ne[3];
    const int tid = threadIdx.x;
    for (i64 base = (i64)blockIdx.x * DQ_THREADS; base < total; base += (i64)gridDim.x * DQ_THREADS) {
        const i64 l = base + tid;
        if (l < total) {
            const i64 r = l / per_row;
            const int s = (int)(l % per_row);
            const u8* row = (const u8*)a.ptr + (r % a.ne[1]) * a.nb[1] + ((r / a.ne[1]) % a.ne[2]) * a.nb[2] +
                            (r / (a.ne[1] * a.ne[2])) * a.nb[3];
            QUnit u;
            decode_q<T>(row, s, u);
            u32 h[16];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const float sc = i < 4 ? u.sa : u.sb;
                const int w = u.w[i];
                const float v0 = sc * (float)(signed char)(w) + u.m, v1 = sc * (float)(signed char)(w >> 8) + u.m;
                const float v2 = sc * (float)(signed char)(w >> 16) + u.m, v3 = sc * (float)(signed char)(w >> 24) + u.m;
                h[2 * i] = (u32)f2h(v0) | ((u32)f2h(v1) << 16);
                h[2 * i + 1] = (u32)f2h(v2) | ((u32)f2h(v3) << 16);
            }
            // Word i of the unit at tile[4 * tid + (i + tid) % 4]: rotated against bank conflicts.
#pragma unroll
            for (int i = 0; i < 4; i++) tile[4 * tid + ((i + tid) & 3)] = make_uint4(h[4 * i], h[4 * i + 1], h[4 * i + 2], h[4 * i + 3]);
        }
        __syncthreads();
        const i64 words = min((i64)DQ_THREADS, total - base) * 4;
        uint4* o = (uint4*)((u16*)out + base * 32);
        for (int q = tid; q < words; q += DQ_THREADS) {
            const int unit = q / 4, i = q % 4;
            o[q] = tile[4 * unit + ((i + unit) & 3)];
        }
        __syncthreads();
    }
}

#define DEQUANT_KERNEL(name, T) \
    extern "C" __global__ void __launch_bounds__(DQ_THREADS) k_dequant_f16_##name(TD a, u64 out) { GRID_DEPENDENCY_SYNC(); dequant_f16<T>(a, out); }
DEQUANT_KERNEL(q4_0, T_Q4_0)
DEQUANT_KERNEL(q4_1, T_Q4_1)
DEQUANT_KERNEL(q5_0, T_Q5_0)
DEQUANT_KERNEL(q5_1, T_Q5_1)
DEQUANT_KERNEL(q8_0, T_Q8_0)
DEQUANT_KERNEL(q4_k, T_Q4K)
DEQUANT_KERNEL(q5_k, T_Q5K)
DEQUANT_KERNEL(q6_k, T_Q6K)
DEQUANT_KERNEL(mxfp4, T_MXFP4)
DEQUANT_KERNEL(q4_0g, T_Q4_0G)
DEQUANT_KERNEL(q8_0g, T_Q8_0G)
