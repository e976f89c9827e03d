// Matrix-vector products for few columns (decode): weights read once in their stored format, every
// column of the activations used against each decoded unit. Quantized weights take activations
// rounded to 8 bits (k_quantize_q8) and integer dot products (dp4a); float weights take F32
// activations. A block of GV_THREADS threads holds 4 / wpr row groups of wpr warps (wpr = 1, 2 or
// 4, chosen per launch: one warp per row when there are rows enough to fill the GPU); each group
// takes R rows and splits their length; partial sums meet through shuffles and shared memory.
// K-quant rows that start 16-byte aligned are read in chunks of GV_CHUNK units: the warp loads a
// chunk with 16-byte loads (every lane several in flight) into its shared-memory stage, then each
// lane decodes units from there; units past the last whole chunk, unaligned rows and the other
// quantized types are decoded from global memory directly. mul_mat_id uses the same kernels with
// one column per (expert slot, token). Kernels k_gemv_<type>_<NC> handle up to NC columns;
// k_gemv_group_<type> runs several single-column products of one activation vector in one
// launch; k_gemv_glu_<type> runs the gate and up products of one activation vector and writes the
// gated unit too.

#define GV_THREADS 128
#define GV_WARPS (GV_THREADS / 32)

// Mirrors the Rust `GemvArgs`: every field 8 bytes.
struct GV {
    u64 w;                     // weight rows of batch 0 (rows contiguous)
    i64 wnb1, wnb2, wnb3;      // byte strides of rows, and of batches (or experts on axis 2)
    u64 x;                     // activations: F32 or int8 [K, columns] contiguous
    u64 xd;                    // (scale, scale * sum) per 32 int8 activations
    u64 d;                     // F32 result, column stride m
    u64 ids;                   // mul_mat_id: I32 expert of (slot, token), else 0
    i64 ids_nb0, ids_nb1;      // byte strides of ids
    i64 m, k;                  // rows, row length
    i64 ncols;                 // columns per z, at most NC
    i64 b2, r2, r3;            // mul_mat: result batches on axis 2, broadcast ratios of axes 2, 3
    i64 n_used, b1, n_exp;     // mul_mat_id: experts per token, activation rows per token, experts
    i64 nz;                    // number of z indices (result column groups)
    i64 vec;                   // float weights: rows and activations 16-byte aligned, K % 8 == 0;
                               // K-quant weights: rows 16-byte aligned (staged chunks)
    i64 wpr;                   // warps per row group: 1, 2 or 4
};

// Units of 32 weights a warp stages per row at a time: 8 blocks of a K-quant.
#define GV_CHUNK 64

// Whether rows of type T are staged (when aligned): the K-quants, whose decoding from global
// memory gathers from three places of a 144..210-byte block (measured on H200: Q6_K 0.42 -> 0.51
// of the bandwidth; the legacy types were as fast or slower staged).
template <int T>
__device__ constexpr bool staged_type() {
    return T == T_Q4K || T == T_Q5K || T == T_Q6K;
}

// Bytes of a chunk of GV_CHUNK units of staged type T (a multiple of 16); 16 for other types.
template <int T>
__device__ constexpr int chunk_bytes() {
    return T == T_Q4K ? 1152 : T == T_Q5K ? 1408 : T == T_Q6K ? 1680 : 16;
}

// acc[r][c] += dot(unit u[r], 8-bit activations of unit s of column col).
template <int NC, int R>
__device__ __forceinline__ void dot_q8(const GV& g, const QUnit (&u)[R], i64 s, i64 col0, int ncols, float (&acc)[R][NC]) {
    const signed char* xq = (const signed char*)g.x;
    const float2* xd = (const float2*)g.xd;
    const i64 nu = g.k / 32;
#pragma unroll
    for (int c = 0; c < NC; c++) {
        if (c >= ncols) break;
        const i64 col = col0 + c;
        const int4* xp = (const int4*)(xq + col * g.k + 32 * s);
        const int4 x0 = xp[0], x1 = xp[1];
        const float2 ds = xd[col * nu + s];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int* w = u[r].w;
            int lo = DOT4_I8(w[0], x0.x, 0);
            lo = DOT4_I8(w[1], x0.y, lo);
            lo = DOT4_I8(w[2], x0.z, lo);
            lo = DOT4_I8(w[3], x0.w, lo);
            int hi = DOT4_I8(w[4], x1.x, 0);
            hi = DOT4_I8(w[5], x1.y, hi);
            hi = DOT4_I8(w[6], x1.z, hi);
            hi = DOT4_I8(w[7], x1.w, hi);
            // Rounded step by step: the compiler may not contract this differently per kernel
            // (results stay bit-equal between the one-row, row-pair and gated-unit kernels).
            const float t = __fmaf_rn(u[r].sb, (float)hi, __fmul_rn(u[r].sa, (float)lo));
            acc[r][c] = __fmaf_rn(u[r].m, ds.y, __fmaf_rn(t, ds.x, acc[r][c]));
        }
    }
}

// The whole chunks of R quantized rows, staged through shared memory by the warp (every lane of
// the warp takes part; chunks c = first, first + step, ...).
template <int T, int NC, int R>
__device__ __forceinline__ void gemv_staged(const GV& g, const u8* const (&rows)[R], int first, int step, i64 col0, int ncols,
                                            float (&acc)[R][NC]) {
    constexpr int CB = chunk_bytes<T>() / 16;  // 16-byte words per chunk
    constexpr int PER_LANE = (CB + 31) / 32;
    __shared__ uint4 stage[GV_WARPS][R][CB];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int chunks = (int)(g.k / 32 / GV_CHUNK);
    for (int c = first; c < chunks; c += step) {
        uint4 v[R][PER_LANE];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint4* src = (const uint4*)(rows[r] + (i64)c * (CB * 16));
#pragma unroll
            for (int i = 0; i < PER_LANE; i++)
                if (lane + 32 * i < CB) v[r][i] = src[lane + 32 * i];
        }
        WARP_SYNC();
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int i = 0; i < PER_LANE; i++)
                if (lane + 32 * i < CB) stage[warp][r][lane + 32 * i] = v[r][i];
        WARP_SYNC();
#pragma unroll
        for (int j = 0; j < GV_CHUNK / 32; j++) {
            const int s = lane + 32 * j;
            QUnit u[R];
#pragma unroll
            for (int r = 0; r < R; r++) decode_q<T>((const u8*)stage[warp][r], s, u[r]);
            dot_q8<NC, R>(g, u, (i64)c * GV_CHUNK + s, col0, ncols, acc);
        }
    }
}

// Sums acc over each warp into part[warp][r * NC + c] (every thread of the block takes part), then
// waits for the block.
template <int NC, int R>
__device__ __forceinline__ void warp_partials(float (&acc)[R][NC], float (*part)[R * NC]) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int r = 0; r < R; r++) {
#pragma unroll
        for (int c = 0; c < NC; c++) {
            float v = acc[r][c];
            for (int o = 16; o > 0; o >>= 1) v += WARP_SHFL_XOR(v, o);
            if (lane == 0) part[warp][r * NC + c] = v;
        }
    }
    __syncthreads();
}

// Total of partial sum i over the wpr warps of row group grp.
template <int N>
__device__ __forceinline__ float group_total(const float (*part)[N], int grp, int wpr, int i) {
    float s = 0.0f;
    for (int w = grp * wpr; w < (grp + 1) * wpr; w++) s += part[w][i];
    return s;
}

template <int NC, int R>
__device__ __forceinline__ void gemv_store(const GV& g, float (&acc)[R][NC], i64 rb, i64 dcol0, int ncols, bool bad) {
    __shared__ float part[GV_WARPS][R * NC];
    warp_partials<NC, R>(acc, part);
    const int tid = threadIdx.x, wpr = (int)g.wpr;
    if (tid < (GV_WARPS / wpr) * R * NC) {
        int grp = tid / (R * NC), rc = tid % (R * NC);
        int r = rc / NC, c = rc % NC;
        i64 row = rb + grp * R + r;
        if (c < ncols && row < g.m) {
            float s = group_total<R * NC>(part, grp, wpr, rc);
            ((float*)g.d)[(dcol0 + c) * g.m + row] = bad ? __int_as_float(0x7fc00000) : s;
        }
    }
}

// acc[r][c] = dot(row r, column col0 + c) over the share of thread t of the nt threads (wpr warps)
// of its row group.
template <int T, int NC, int R>
__device__ __forceinline__ void gemv_rows(const GV& g, const u8* const (&rows)[R], int t, int nt, i64 col0, int ncols,
                                          float (&acc)[R][NC]) {
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int c = 0; c < NC; c++) acc[r][c] = 0.0f;
    if (T >= T_Q4_0) {
        const int nu = (int)(g.k / 32);
        int first_direct = 0;
        if (staged_type<T>() && g.vec) {
            gemv_staged<T, NC, R>(g, rows, t / 32, nt / 32, col0, ncols, acc);
            first_direct = nu / GV_CHUNK * GV_CHUNK;
        }
#pragma unroll 2
        for (int s = first_direct + t; s < nu; s += nt) {
            QUnit u[R];
#pragma unroll
            for (int r = 0; r < R; r++) decode_q<T>(rows[r], s, u[r]);
            dot_q8<NC, R>(g, u, s, col0, ncols, acc);
        }
    } else {
        const float* xf = (const float*)g.x;
        const int nu = g.vec ? (int)(g.k / 8) : 0;
#pragma unroll 2
        for (int s = t; s < nu; s += nt) {
            float w[R][8];
#pragma unroll
            for (int r = 0; r < R; r++) decode_f<T>(rows[r], s, w[r]);
#pragma unroll
            for (int c = 0; c < NC; c++) {
                if (c >= ncols) break;
                const float4* xp = (const float4*)(xf + (col0 + c) * g.k + 8 * s);
                const float4 a = xp[0], b = xp[1];
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float v = acc[r][c];
                    v += w[r][0] * a.x + w[r][1] * a.y + w[r][2] * a.z + w[r][3] * a.w;
                    v += w[r][4] * b.x + w[r][5] * b.y + w[r][6] * b.z + w[r][7] * b.w;
                    acc[r][c] = v;
                }
            }
        }
        for (i64 kk = 8 * nu + t; kk < g.k; kk += nt) {
            float w[R];
#pragma unroll
            for (int r = 0; r < R; r++) w[r] = float_at<T>(rows[r], kk);
#pragma unroll
            for (int c = 0; c < NC; c++) {
                if (c >= ncols) break;
                const float x = xf[(col0 + c) * g.k + kk];
#pragma unroll
                for (int r = 0; r < R; r++) acc[r][c] += w[r] * x;
            }
        }
    }
}

// Block bx of the row blocks of g (blockIdx.x for a single product). Inlined into each kernel (as
// every function holding shared memory): on AMD GPUs the shared memory of a function that is not
// gets reserved in every kernel of the program.
template <int T, int NC, int R>
__device__ __forceinline__ void gemv(const GV& g, i64 bx) {
    const i64 z = blockIdx.y + (i64)gridDim.y * blockIdx.z;
    if (z >= g.nz) return;
    const int tid = threadIdx.x;
    const u8* wb = (const u8*)g.w;
    i64 col0, dcol0;
    bool bad = false;
    if (g.ids) {
        i64 slot = z % g.n_used, tok = z / g.n_used;
        int e = *(const int*)((const u8*)g.ids + slot * g.ids_nb0 + tok * g.ids_nb1);
        bad = e < 0 || e >= g.n_exp;
        wb += (bad ? 0 : e) * g.wnb2;
        col0 = slot % g.b1 + g.b1 * tok;
        dcol0 = z;
    } else {
        i64 i2 = z % g.b2, i3 = z / g.b2;
        wb += (i2 / g.r2) * g.wnb2 + (i3 / g.r3) * g.wnb3;
        col0 = z * g.ncols;
        dcol0 = col0;
    }
    const int ncols = (int)g.ncols;
    // Row group of this thread, its first row, and the thread's place among the group's.
    const int wpr = (int)g.wpr, nt = 32 * wpr, t = tid % nt;
    const i64 rb = bx * (GV_WARPS / wpr) * R;
    const i64 r0 = rb + (tid / nt) * R;
    const u8* rows[R];
#pragma unroll
    for (int r = 0; r < R; r++) rows[r] = wb + min(r0 + r, g.m - 1) * g.wnb1;
    float acc[R][NC];
    gemv_rows<T, NC, R>(g, rows, t, nt, col0, ncols, acc);
    gemv_store<NC, R>(g, acc, rb, dcol0, ncols, bad);
}

// Rows per block: one for a single column, two (sharing each activation load) for more.
#define GEMV_KERNEL(name, T, NC) \
    extern "C" __global__ void __launch_bounds__(GV_THREADS) k_gemv_##name##_##NC(GV g) { GRID_DEPENDENCY_SYNC(); gemv<T, NC, (NC > 1 ? 2 : 1)>(g, blockIdx.x); }

// Up to GV_GROUP single-column products of one activation vector (q, k and v; gate and up) in one
// launch: product i takes the row blocks first[i] .. first[i + 1] of the grid. Mirrors the Rust
// `GemvGroupArgs`.
#define GV_GROUP 3
struct GVGroup {
    GV g[GV_GROUP];
    i64 first[GV_GROUP + 1];
    i64 n;
};

template <int T>
__device__ __forceinline__ void gemv_group(const GVGroup& gg) {
    int i = 0;
    while (i + 1 < gg.n && (i64)blockIdx.x >= gg.first[i + 1]) i++;
    gemv<T, 1, 1>(gg.g[i], (i64)blockIdx.x - gg.first[i]);
}

// The gate and up products of one activation vector and the gated unit glu(gate, up) (op: G_SWIGLU,
// G_GEGLU or G_GEGLU_ERF of elementwise.cu) in one launch: row group i of the grid takes row i of
// both weights (two rows sharing each activation load, as the kernels of several columns do) and
// writes gate[i], up[i], then out[i] (in that order: out may be gate's or up's memory). gate and
// up share the activations, k, vec, wpr and (mul_mat_id) the ids: then blockIdx.y is the
// (slot, token) pair z, whose expert's rows and activation column the block takes, writing column
// z of the results (NaN for an expert id out of range).
template <int T>
__device__ __forceinline__ void gemv_glu(const GV& gate, const GV& up, u64 out, int op) {
    __shared__ float part[GV_WARPS][2];
    const int tid = threadIdx.x, wpr = (int)gate.wpr, nt = 32 * wpr, grp = tid / nt;
    const i64 z = blockIdx.y;
    const u8 *gw = (const u8*)gate.w, *uw = (const u8*)up.w;
    i64 col0 = 0;
    bool bad = false;
    if (gate.ids) {
        const i64 slot = z % gate.n_used, tok = z / gate.n_used;
        const int e = *(const int*)((const u8*)gate.ids + slot * gate.ids_nb0 + tok * gate.ids_nb1);
        bad = e < 0 || e >= gate.n_exp;
        gw += (bad ? 0 : e) * gate.wnb2;
        uw += (bad ? 0 : e) * up.wnb2;
        col0 = slot % gate.b1 + gate.b1 * tok;
    }
    const i64 row0 = (i64)blockIdx.x * (GV_WARPS / wpr), at = min(row0 + grp, gate.m - 1);
    const u8* const rows[2] = {gw + at * gate.wnb1, uw + at * up.wnb1};
    float acc[2][1];
    gemv_rows<T, 1, 2>(gate, rows, tid % nt, nt, col0, 1, acc);
    warp_partials<1, 2>(acc, part);
    const i64 row = row0 + tid, at_z = z * gate.m + row;
    if (tid < GV_WARPS / wpr && row < gate.m) {
        const float nan = __int_as_float(0x7fc00000);
        const float g = bad ? nan : group_total<2>(part, tid, wpr, 0), u = bad ? nan : group_total<2>(part, tid, wpr, 1);
        ((float*)gate.d)[at_z] = g;
        ((float*)up.d)[at_z] = u;
        ((float*)out)[at_z] = glu_fn(op, g, u, 0.0f, 0.0f);
    }
}

#define GEMV_KERNELS(name, T) \
    GEMV_KERNEL(name, T, 1) GEMV_KERNEL(name, T, 2) GEMV_KERNEL(name, T, 4) GEMV_KERNEL(name, T, 8) \
    extern "C" __global__ void __launch_bounds__(GV_THREADS) k_gemv_group_##name(GVGroup gg) { GRID_DEPENDENCY_SYNC(); gemv_group<T>(gg); } \
    extern "C" __global__ void __launch_bounds__(GV_THREADS) k_gemv_glu_##name(GV gate, GV up, u64 out, int op) { GRID_DEPENDENCY_SYNC(); \
        gemv_glu<T>(gate, up, out, op); \
    }

GEMV_KERNELS(f32, T_F32)
GEMV_KERNELS(f16, T_F16)
GEMV_KERNELS(bf16, T_BF16)
GEMV_KERNELS(q4_0, T_Q4_0)
GEMV_KERNELS(q4_1, T_Q4_1)
GEMV_KERNELS(q5_0, T_Q5_0)
GEMV_KERNELS(q5_1, T_Q5_1)
GEMV_KERNELS(q8_0, T_Q8_0)
GEMV_KERNELS(q4_k, T_Q4K)
GEMV_KERNELS(q5_k, T_Q5K)
GEMV_KERNELS(q6_k, T_Q6K)
GEMV_KERNELS(mxfp4, T_MXFP4)
GEMV_KERNELS(q4_0g, T_Q4_0G)
GEMV_KERNELS(q8_0g, T_Q8_0G)
