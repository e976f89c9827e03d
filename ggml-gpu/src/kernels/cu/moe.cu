// mul_mat_id of prompts grouped by expert: the (slot, token) pairs routed to each expert are
// gathered (k_moe_group: counts, offsets, the pairs of each expert, and the work list of
// tiles), then one launch (k_moe_mm_<type>) multiplies every used expert with the
// activation columns of its pairs, each block one tile (expert, 64-row tile, 32-pair tile) of the
// work list, reading the quantized weights in place. Everything stays on the GPU (no count comes
// back to the host), so the step is capturable in a CUDA graph; the grid is sized for the most
// tiles any routing can give and the blocks past the real count exit at once.
//
// The grouping buffer (32-bit ints): [0] the tile count, [MG_OFF + e] the first grouped pair of
// expert e (n_exp + 1 offsets), [MG_MAP(n_exp) + j] grouped pair j as its (slot, token) index
// slot + n_used * token, then two ints per tile (expert, first grouped pair). Pairs whose expert id
// is out of range are left out of the groups and their result columns set to NaN.

#define MG_THREADS 256
#define MG_MAX_EXPERTS 1024
#define MG_OFF 1
#define MG_MAP(n_exp) (2 + (n_exp))
#define MM_BM 64
#define MM_BN 32
#define MM_KU 8
#define MM_THREADS 128

__device__ __forceinline__ int4 moe_int4(int x, int y, int z, int w) {
    int4 v;
    v.x = x;
    v.y = y;
    v.z = z;
    v.w = w;
    return v;
}

// The expert of (slot, token) pair p, or -1 when its id is out of range.
__device__ __forceinline__ int moe_expert(const GV& g, i64 p) {
    const i64 slot = p % g.n_used, tok = p / g.n_used;
    const int e = *(const int*)((const u8*)g.ids + slot * g.ids_nb0 + tok * g.ids_nb1);
    return e >= 0 && e < g.n_exp ? e : -1;
}

// One block of MG_THREADS: counts per expert (shared-memory atomics), their prefix sums (the
// offsets, and the first tile of each expert), then every pair's place in its expert's list. The
// order of pairs within an expert may change from run to run; each result column is computed the
// same wherever its pair is. g: ids (strides ids_nb0/ids_nb1), n_used, n_exp (at most
// MG_MAX_EXPERTS), nz = the pair count, d and m (the NaN columns of ids out of range).
extern "C" __global__ void k_moe_group(GV g, u64 group) { GRID_DEPENDENCY_SYNC();
    __shared__ int count[MG_MAX_EXPERTS], first_tile[MG_MAX_EXPERTS];
    int* buf = (int*)group;
    int* off = buf + MG_OFF;
    int* map = buf + MG_MAP(g.n_exp);
    int* tiles = map + g.nz;
    const int tid = threadIdx.x, n_exp = (int)g.n_exp;
    for (int e = tid; e < n_exp; e += MG_THREADS) count[e] = 0;
    __syncthreads();
    for (i64 p = tid; p < g.nz; p += MG_THREADS) {
        const int e = moe_expert(g, p);
        if (e >= 0) {
            atomicAdd(&count[e], 1);
        } else {
            float* col = (float*)g.d + p * g.m;
            for (i64 i = 0; i < g.m; i++) col[i] = __int_as_float(0x7fc00000);
        }
    }
    __syncthreads();
    if (tid == 0) {
        int at = 0, n_tiles = 0;
        for (int e = 0; e < n_exp; e++) {
            off[e] = at;
            first_tile[e] = n_tiles;
            at += count[e];
            n_tiles += (count[e] + MM_BN - 1) / MM_BN;
        }
        off[n_exp] = at;
        buf[0] = n_tiles;
    }
    __syncthreads();
    for (int e = tid; e < n_exp; e += MG_THREADS) {
        for (int c = 0, t = first_tile[e]; c < count[e]; c += MM_BN, t++) {
            tiles[2 * t] = e;
            tiles[2 * t + 1] = off[e] + c;
        }
        count[e] = 0;
    }
    __syncthreads();
    for (i64 p = tid; p < g.nz; p += MG_THREADS) {
        const int e = moe_expert(g, p);
        if (e >= 0) map[off[e] + atomicAdd(&count[e], 1)] = (int)p;
    }
}

// This block's tile of the work list (blockIdx.x; false past the last one): its expert e, its
// n pairs (at most MM_BN), each pair's activation column (cols: (slot % b1) + b1 * token) and
// result column (dcols) in shared memory, visible to the block on return.
__device__ __forceinline__ bool moe_tile(const GV& g, const int* buf, int& e, int& n, int* cols, int* dcols) {
    const int tile = (int)blockIdx.x;
    if (tile >= buf[0]) return false;
    const int* off = buf + MG_OFF;
    const int* map = buf + MG_MAP(g.n_exp);
    const int* tiles = map + g.nz;
    e = tiles[2 * tile];
    const int j0 = tiles[2 * tile + 1];
    n = min(MM_BN, off[e + 1] - j0);
    if (threadIdx.x < MM_BN) {
        const int p = map[j0 + min((int)threadIdx.x, n - 1)];
        const i64 slot = p % g.n_used, tok = p / g.n_used;
        cols[threadIdx.x] = (int)(slot % g.b1 + g.b1 * tok);
        dcols[threadIdx.x] = p;
    }
    __syncthreads();
    return true;
}

// Tile blockIdx.x of the work list (rows blockIdx.y * MM_BM ..) of the grouped product: 8-bit
// activations (g.x, g.xd as k_quantize_q8 writes them, column (slot % b1) + b1 * token) times
// expert e's rows of quantized type T, decoded unit by unit (32 weights) into shared memory,
// MM_KU units per step; each thread sums 4 rows x 4 pairs with DOT4_I8 and writes them to the
// pairs' result columns (m F32 each, column slot + n_used * token).
template <int T>
__device__ __forceinline__ void moe_mm(const GV& g, const int* buf) {
    __shared__ int4 ws[MM_BM][MM_KU][2];
    __shared__ float wsc[MM_BM][MM_KU][3];
    // Activation rows padded by 16 and 8 bytes: the 8 pairs one load phase reads hit distinct banks.
    __shared__ int4 xs[MM_BN][2 * MM_KU + 1];
    __shared__ float2 xds[MM_BN][MM_KU + 1];
    __shared__ int cols[MM_BN], dcols[MM_BN];
    int e, n;
    if (!moe_tile(g, buf, e, n, cols, dcols)) return;
    const i64 row0 = (i64)blockIdx.y * MM_BM;
    const int tid = threadIdx.x, tc = tid % 8, tr = tid / 8;
    const u8* wb = (const u8*)g.w + e * g.wnb2;
    const signed char* xq = (const signed char*)g.x;
    const float2* xd = (const float2*)g.xd;
    const int nu = (int)(g.k / 32);
    float acc[4][4];
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
        for (int c = 0; c < 4; c++) acc[r][c] = 0.0f;
    for (int u0 = 0; u0 < nu; u0 += MM_KU) {
#pragma unroll
        for (int i = tid; i < MM_BM * MM_KU; i += MM_THREADS) {
            const int r = i / MM_KU, u = i % MM_KU, s = u0 + u;
            QUnit q = {};  // zeros past the row's units
            if (s < nu) decode_q<T>(wb + min(row0 + r, g.m - 1) * g.wnb1, s, q);
            ws[r][u][0] = moe_int4(q.w[0], q.w[1], q.w[2], q.w[3]);
            ws[r][u][1] = moe_int4(q.w[4], q.w[5], q.w[6], q.w[7]);
            wsc[r][u][0] = q.sa;
            wsc[r][u][1] = q.sb;
            wsc[r][u][2] = q.m;
        }
#pragma unroll
        for (int i = tid; i < MM_BN * MM_KU; i += MM_THREADS) {
            const int c = i / MM_KU, u = i % MM_KU, s = u0 + u;
            if (s < nu) {
                const int4* xp = (const int4*)(xq + (i64)cols[c] * g.k + 32 * (i64)s);
                xs[c][2 * u] = xp[0];
                xs[c][2 * u + 1] = xp[1];
                xds[c][u] = xd[(i64)cols[c] * nu + s];
            } else {
                xs[c][2 * u] = xs[c][2 * u + 1] = moe_int4(0, 0, 0, 0);
                xds[c][u] = make_float2(0.0f, 0.0f);
            }
        }
        __syncthreads();
#pragma unroll 2
        for (int u = 0; u < MM_KU; u++) {
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int4 x0 = xs[tc + 8 * c][2 * u], x1 = xs[tc + 8 * c][2 * u + 1];
                const float2 ds = xds[tc + 8 * c][u];
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    const int4 w0 = ws[tr + 16 * r][u][0], w1 = ws[tr + 16 * r][u][1];
                    int lo = DOT4_I8(w0.x, x0.x, 0);
                    lo = DOT4_I8(w0.y, x0.y, lo);
                    lo = DOT4_I8(w0.z, x0.z, lo);
                    lo = DOT4_I8(w0.w, x0.w, lo);
                    int hi = DOT4_I8(w1.x, x1.x, 0);
                    hi = DOT4_I8(w1.y, x1.y, hi);
                    hi = DOT4_I8(w1.z, x1.z, hi);
                    hi = DOT4_I8(w1.w, x1.w, hi);
                    const float* sc = wsc[tr + 16 * r][u];
                    acc[r][c] += (sc[0] * (float)lo + sc[1] * (float)hi) * ds.x + sc[2] * ds.y;
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int c = 0; c < 4; c++) {
        if (tc + 8 * c >= n) continue;
        float* dcol = (float*)g.d + (i64)dcols[tc + 8 * c] * g.m;
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const i64 row = row0 + tr + 16 * r;
            if (row < g.m) dcol[row] = acc[r][c];
        }
    }
}

// The same tile on tensor cores (k_moe_mma_<type>, where the runner has the instruction): each of
// the 4 warps takes 16 of the 64 weight rows against all 32 pairs (4 tiles of 8), and per unit
// multiplies the first and the second 16 weights separately with MMA_I8_16816 (int32 sums), which
// then take the unit's scales exactly as in moe_mm; units of one scale take one MMA_I8_16832
// over all 32 weights. MMA_I8_16816(c, a, b) is c += a b for a 16x16
// tile a and a 16x8 tile b of signed bytes, held as PTX's mma.m16n8k16 lays them out for 8-bit
// types; lane 4 g + t (g < 8, t < 4) holds
//   a0 = A[g][4t .. 4t+3], a1 = A[g+8][4t .. 4t+3], b = B[4t .. 4t+3][g],
//   c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1]
// (four bytes per register, the lowest index in the low byte). Without the instruction (HIP,
// older CUDA, the host emulation) mma_i8_lanes computes the same through shared memory.
#define MQ_PITCH (8 * MM_KU + 4)

// MMA_I8_16816 without the instruction: the warp's fragments meet in shared memory (`frags`, 3
// words per lane of this warp); lane (g, t) sums rows g and g + 8 of A (lanes 4 g + j) against
// columns 2 t and 2 t + 1 of B (lanes 8 t + j and 8 t + 4 + j).
__device__ __forceinline__ void mma_i8_lanes(int (&c)[4], const int (&a)[2], int b, int* frags) {
    const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    int* mine = frags + 3 * lane;
    mine[0] = a[0], mine[1] = a[1], mine[2] = b;
    WARP_SYNC();
    for (int j = 0; j < 4; j++) {
        const int* r = frags + 3 * (4 * g + j);
        const int n0 = frags[3 * (8 * t + j) + 2], n1 = frags[3 * (8 * t + 4 + j) + 2];
        c[0] = DOT4_I8(r[0], n0, c[0]);
        c[1] = DOT4_I8(r[0], n1, c[1]);
        c[2] = DOT4_I8(r[1], n0, c[2]);
        c[3] = DOT4_I8(r[1], n1, c[3]);
    }
    WARP_SYNC();
}
#ifdef MMA_I8_16816
#define MQ_MMA(c, a, b) MMA_I8_16816(c, a, b)
#define MQ_MMA32(c, a, b) MMA_I8_16832(c, a, b)
#define MQ_FRAG_WORDS 1
#else
#define MQ_MMA(c, a, b) mma_i8_lanes(c, a, b, frags + 96 * (threadIdx.x / 32))
// MMA_I8_16832 without the instruction: its two 16-byte halves one after the other.
#define MQ_MMA32(c, a, b)                                                                             \
    do {                                                                                              \
        const int a_lo_[2] = {(a)[0], (a)[1]}, a_hi_[2] = {(a)[2], (a)[3]};                           \
        MQ_MMA(c, a_lo_, (b)[0]);                                                                     \
        MQ_MMA(c, a_hi_, (b)[1]);                                                                     \
    } while (0)
#define MQ_FRAG_WORDS (MM_THREADS * 3)
#endif

// True where a unit's 32 weights share one scale (sa == sb): every type but Q6_K, whose two
// 16-weight halves have their own. Such units take one MMA over all 32 weights and one scaling.
template <int T>
__device__ __forceinline__ constexpr bool unit_has_one_scale() {
    return T != T_Q6K;
}

template <int T>
__device__ __forceinline__ void moe_mma(const GV& g, const int* buf) {
    // Staged weights and activations: MM_KU units of 8 ints per row or pair, rows padded by 4 ints
    // so that the 8 rows (pairs) of a fragment load hit distinct banks.
    __shared__ int4 ws4[MM_BM * MQ_PITCH / 4], xs4[MM_BN * MQ_PITCH / 4];
    int* ws = (int*)ws4;
    int* xs = (int*)xs4;
    __shared__ float wsc[MM_BM][3 * MM_KU + 1];
    __shared__ float2 xds[MM_BN][MM_KU + 1];
    __shared__ int cols[MM_BN], dcols[MM_BN];
    __shared__ int frags[MQ_FRAG_WORDS];
    int e, n;
    if (!moe_tile(g, buf, e, n, cols, dcols)) return;
    const i64 row0 = (i64)blockIdx.y * MM_BM;
    const int tid = threadIdx.x, lane = tid % 32, gq = lane >> 2, tq = lane & 3;
    const int r0 = 16 * (tid / 32) + gq, r1 = r0 + 8;
    const u8* wb = (const u8*)g.w + e * g.wnb2;
    const signed char* xq = (const signed char*)g.x;
    const float2* xd = (const float2*)g.xd;
    const int nu = (int)(g.k / 32);
    float acc[4][4];
#pragma unroll
    for (int t = 0; t < 4; t++)
#pragma unroll
        for (int c = 0; c < 4; c++) acc[t][c] = 0.0f;
    for (int u0 = 0; u0 < nu; u0 += MM_KU) {
#pragma unroll
        for (int i = tid; i < MM_BM * MM_KU; i += MM_THREADS) {
            const int r = i / MM_KU, u = i % MM_KU, s = u0 + u;
            QUnit q = {};  // zeros past the row's units
            if (s < nu) decode_q<T>(wb + min(row0 + r, g.m - 1) * g.wnb1, s, q);
            int4* wr = (int4*)(ws + r * MQ_PITCH + 8 * u);
            wr[0] = moe_int4(q.w[0], q.w[1], q.w[2], q.w[3]);
            wr[1] = moe_int4(q.w[4], q.w[5], q.w[6], q.w[7]);
            wsc[r][3 * u] = q.sa;
            wsc[r][3 * u + 1] = q.sb;
            wsc[r][3 * u + 2] = q.m;
        }
#pragma unroll
        for (int i = tid; i < MM_BN * MM_KU; i += MM_THREADS) {
            const int c = i / MM_KU, u = i % MM_KU, s = u0 + u;
            int4* xr = (int4*)(xs + c * MQ_PITCH + 8 * u);
            if (s < nu) {
                const int4* xp = (const int4*)(xq + (i64)cols[c] * g.k + 32 * (i64)s);
                xr[0] = xp[0];
                xr[1] = xp[1];
                xds[c][u] = xd[(i64)cols[c] * nu + s];
            } else {
                xr[0] = xr[1] = moe_int4(0, 0, 0, 0);
                xds[c][u] = make_float2(0.0f, 0.0f);
            }
        }
        __syncthreads();
#pragma unroll 1
        for (int u = 0; u < MM_KU; u++) {
            const int a_lo[2] = {ws[r0 * MQ_PITCH + 8 * u + tq], ws[r1 * MQ_PITCH + 8 * u + tq]};
            const int a_hi[2] = {ws[r0 * MQ_PITCH + 8 * u + 4 + tq], ws[r1 * MQ_PITCH + 8 * u + 4 + tq]};
            const float* s0 = &wsc[r0][3 * u];
            const float* s1 = &wsc[r1][3 * u];
#pragma unroll
            for (int t = 0; t < 4; t++) {
                const int* xb = xs + (8 * t + gq) * MQ_PITCH + 8 * u;
                const float2 d0 = xds[8 * t + 2 * tq][u], d1 = xds[8 * t + 2 * tq + 1][u];
                if (unit_has_one_scale<T>()) {
                    const int a[4] = {a_lo[0], a_lo[1], a_hi[0], a_hi[1]}, b[2] = {xb[tq], xb[4 + tq]};
                    int q[4] = {0, 0, 0, 0};
                    MQ_MMA32(q, a, b);
                    acc[t][0] += s0[0] * (float)q[0] * d0.x + s0[2] * d0.y;
                    acc[t][1] += s0[0] * (float)q[1] * d1.x + s0[2] * d1.y;
                    acc[t][2] += s1[0] * (float)q[2] * d0.x + s1[2] * d0.y;
                    acc[t][3] += s1[0] * (float)q[3] * d1.x + s1[2] * d1.y;
                    continue;
                }
                int lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
                MQ_MMA(lo, a_lo, xb[tq]);
                MQ_MMA(hi, a_hi, xb[4 + tq]);
                acc[t][0] += (s0[0] * (float)lo[0] + s0[1] * (float)hi[0]) * d0.x + s0[2] * d0.y;
                acc[t][1] += (s0[0] * (float)lo[1] + s0[1] * (float)hi[1]) * d1.x + s0[2] * d1.y;
                acc[t][2] += (s1[0] * (float)lo[2] + s1[1] * (float)hi[2]) * d0.x + s1[2] * d0.y;
                acc[t][3] += (s1[0] * (float)lo[3] + s1[1] * (float)hi[3]) * d1.x + s1[2] * d1.y;
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int t = 0; t < 4; t++) {
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int p = 8 * t + 2 * tq + (c & 1);
            const i64 row = row0 + (c < 2 ? r0 : r1);
            if (p < n && row < g.m) ((float*)g.d + (i64)dcols[p] * g.m)[row] = acc[t][c];
        }
    }
}

// The tensor-core kernels are held to 6 blocks a multiprocessor's registers (80 each at 128
// threads), as many as their shared memory allows.
#define MOE_KERNEL(name, T)                                                                           \
    extern "C" __global__ void __launch_bounds__(MM_THREADS) k_moe_mm_##name(GV g, u64 group) { GRID_DEPENDENCY_SYNC(); \
        moe_mm<T>(g, (const int*)group);                                                              \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(MM_THREADS, 6) k_moe_mma_##name(GV g, u64 group) { GRID_DEPENDENCY_SYNC(); \
        moe_mma<T>(g, (const int*)group);                                                             \
    }

MOE_KERNEL(q4_0, T_Q4_0)
MOE_KERNEL(q4_1, T_Q4_1)
MOE_KERNEL(q5_0, T_Q5_0)
MOE_KERNEL(q5_1, T_Q5_1)
MOE_KERNEL(q8_0, T_Q8_0)
MOE_KERNEL(q4_k, T_Q4K)
MOE_KERNEL(q5_k, T_Q5K)
MOE_KERNEL(q6_k, T_Q6K)
MOE_KERNEL(mxfp4, T_MXFP4)
MOE_KERNEL(q4_0g, T_Q4_0G)
MOE_KERNEL(q8_0g, T_Q8_0G)

// The expert mix of a decode step's MoE layer in one launch: m = o * w (o [d, k, t] the experts'
// outputs, w [1, k, t] their router weights) and the running sums s_e = m_0 + ... + m_e for
// e = 1 .. k - 1 (contiguous F32 [d, t], at sums0..sums15), each element by one thread in the
// order of the unfused mul and adds, rounded as they are (no contraction into fused multiply-adds).
#define MOE_SUM_MAX 16
extern "C" __global__ void k_moe_weighted_sum(TD o, TD w, TD m, int k, u64 s0, u64 s1, u64 s2, u64 s3, u64 s4,
                                              u64 s5, u64 s6, u64 s7, u64 s8, u64 s9, u64 s10, u64 s11, u64 s12,
                                              u64 s13, u64 s14, u64 s15) { GRID_DEPENDENCY_SYNC();
    const u64 sums[MOE_SUM_MAX] = {s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15};
    const i64 d = o.ne[0], n = d * o.ne[2];
    GRID_LOOP(i, n) {
        const i64 i0 = i % d, it = i / d;
        float acc = 0.0f;
        for (int e = 0; e < k; e++) {
            const float x = __fmul_rn(load(o, i0, e, it, 0), load(w, 0, e, it, 0));
            store(m, i0, e, it, 0, x);
            if (e == 0) {
                acc = x;
            } else {
                acc = __fadd_rn(acc, x);
                ((float*)sums[e - 1])[i] = acc;
            }
        }
    }
}

// The router of a MoE layer for token r = blockIdx.x in one launch (blocks of 256 threads, the
// block size of the unfused row kernels, and npad * 8 bytes of dynamic shared memory for the
// sort). topk_first = 0: probs = soft_max(scores) (sm_a -> sm_d), ids = top_k(probs) (tk_a -> tk_d),
// w = get_rows(probs, ids) (gr_t, gr_ids -> gr_d) and, with renorm, sum = sum_rows(w) (sr_a -> sr_d)
// and w / sum (dv_a, dv_b -> dv_d); topk_first = 1: ids = top_k(scores), w = get_rows(scores, ids),
// then soft_max(w). Every stage is its unfused kernel's row function on that node's operands and
// result, so each result is the one the separate launches write.
extern "C" __global__ void k_moe_router(TD sm_a, TD sm_d, TD tk_a, TD tk_d, TD gr_t, TD gr_ids, TD gr_d, TD sr_a,
                                        TD sr_d, TD dv_a, TD dv_b, TD dv_d, float scale, int topk_first,
                                        int renorm, int npad) { GRID_DEPENDENCY_SYNC();
    const i64 r = blockIdx.x;
    if (!topk_first) {
        soft_max_row(sm_a, sm_a, sm_a, sm_d, scale, 0.0f, 0, 0, r);
        __syncthreads();
    }
    argsort_row(tk_a, tk_d, 1, npad, r);
    __syncthreads();
    // The selected rows of token r: get_rows' result is [ne0, k, tokens].
    for (i64 l = threadIdx.x; l < gr_d.ne[0] * gr_d.ne[1]; l += blockDim.x) {
        const i64 i[4] = {l % gr_d.ne[0], l / gr_d.ne[0], r, 0};
        get_rows_at(gr_t, gr_ids, gr_d, i);
    }
    __syncthreads();
    if (topk_first) {
        soft_max_row(sm_a, sm_a, sm_a, sm_d, scale, 0.0f, 0, 0, r);
        return;
    }
    if (!renorm) return;
    sum_row(sr_a, sr_d, r);
    __syncthreads();
    for (i64 i0 = threadIdx.x; i0 < dv_d.ne[0]; i0 += blockDim.x) {
        const float x = load(dv_a, i0, r, 0, 0), y = load(dv_b, i0 % dv_b.ne[0], r % dv_b.ne[1], 0, 0);
        store(dv_d, i0, r, 0, 0, binary_fn(3, x, y));
    }
}
