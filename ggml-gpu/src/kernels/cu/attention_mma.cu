// Prompt attention on tensor cores: k_flash_attn_mma_d64 and k_flash_attn_mma_d128 (head sizes 64
// and 128; dispatch/attention.rs picks them for many queries with F16 or Q8_0 K/V rows), the
// flash-attention form: no score matrix in memory, so the cost grows with the keys a query sees,
// not with a materialised square of the context.
//
// A block of blockDim.x / 32 warps (at most FM_WARPS; the dispatch's setting) takes FM_ROWS query
// rows per warp of one head and sequence and walks the keys in tiles of FM_BK. Before it,
// k_fm_tile_classes reads the mask once (not once per head) and classes each tile of each block of
// rows: hidden from every row (skipped before anything is staged: a causal prompt skips about half
// its tiles), every mask value 0 (nothing of the mask read in the walk: the inside of a causal
// prompt), or neither (the warps read the tile's mask: the diagonal). The tiles' K rows and V rows
// are staged in shared memory as F16 rows (F16 rows by asynchronous copies where the GPU has them,
// Q8_0 rows dequantized there, zeros past the last key), in a pipeline: a tile's V is staged while
// the warps score the tile against its K, the next live tile's K while they weigh the values. Each
// warp multiplies its 16 query rows (F16 fragments kept in registers) with the keys
// (MMA_F16_16816, f32 sums), turns the scores into logits (scale, softcap, ALiBi-scaled mask),
// keeps the online softmax of its rows, and multiplies the weights, rounded to F16, with the
// values. The sink joins the sum at the end as in k_flash_attn. Blocks of the last queries (which
// see the most keys) are launched first.
//
// MMA_F16_16816(c, a, b) is c += a b for a 16x16 F16 tile a, a 16x8 F16 tile b and 16x8 f32 sums,
// held as PTX's mma.m16n8k16 lays them out; lane 4 g + t (g < 8, t < 4) holds
//   a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1], a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9],
//   b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g],
//   c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1]
// (two halves per register, the lower index in the low bits). The CUDA prelude maps it to the
// instruction on compute capability 8.0 and later; elsewhere (HIP, older CUDA, the host emulation)
// mma_f16_lanes computes the same through shared memory, much slower: the dispatch takes these
// kernels only where the runner has the instruction (and in the host emulation, which checks the
// portable form).

#define FM_WARPS 8
#define FM_ROWS 16
#define FM_BK 64
#define FM_PAD 8

// The two halves of x times those of y, summed.
__device__ __forceinline__ float dot2_h(u32 x, u32 y) {
    return h2f((u16)(x & 0xFFFFu)) * h2f((u16)(y & 0xFFFFu)) + h2f((u16)(x >> 16)) * h2f((u16)(y >> 16));
}

// MMA_F16_16816 without the instruction: the warp's fragments meet in shared memory (`frags`, 6
// words per lane of this warp), and lane (g, t) sums rows g and g + 8 of A (lanes 4 g + j) against
// columns 2 t and 2 t + 1 of B (lanes 8 t + j and 8 t + 4 + j).
__device__ __forceinline__ void mma_f16_lanes(float (&c)[4], const u32 (&a)[4], const u32 (&b)[2], u32* frags) {
    const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    u32* mine = frags + 6 * lane;
    mine[0] = a[0], mine[1] = a[1], mine[2] = a[2], mine[3] = a[3], mine[4] = b[0], mine[5] = b[1];
    WARP_SYNC();
    for (int j = 0; j < 4; j++) {
        const u32* r = frags + 6 * (4 * g + j);
        const u32* n0 = frags + 6 * (8 * t + j) + 4;
        const u32* n1 = frags + 6 * (8 * t + 4 + j) + 4;
        c[0] += dot2_h(r[0], n0[0]) + dot2_h(r[2], n0[1]);
        c[1] += dot2_h(r[0], n1[0]) + dot2_h(r[2], n1[1]);
        c[2] += dot2_h(r[1], n0[0]) + dot2_h(r[3], n0[1]);
        c[3] += dot2_h(r[1], n1[0]) + dot2_h(r[3], n1[1]);
    }
    WARP_SYNC();
}
#ifdef MMA_F16_16816
#define FM_MMA(c, a, b) MMA_F16_16816(c, a, b)
#define FM_FRAG_WORDS 1
#else
#define FM_MMA(c, a, b) mma_f16_lanes(c, a, b, frags)
#define FM_FRAG_WORDS (FM_WARPS * 32 * 6)
#endif
// The softmax's exponentials: the CUDA prelude's fast form (a scale and ex2.approx, a few ulp), else expf.
#ifndef FAST_EXPF
#define FAST_EXPF(x) expf(x)
#endif
// Without asynchronous copies (HIP, older CUDA, the host emulation) a staged chunk is copied at once.
#ifndef CP_ASYNC_16
#define CP_ASYNC_16(dst, src) (*(uint4*)(dst) = *(const uint4*)(src))
#define CP_ASYNC_WAIT_ALL() ((void)0)
#endif

__device__ __forceinline__ u32 pack_h2(float lo, float hi) { return (u32)f2h(lo) | ((u32)f2h(hi) << 16); }

// Values 8 c .. 8 c + 7 of a Q8_0 K/V row as F16: the quants times their block's scale.
__device__ __forceinline__ uint4 fm_q8_chunk(const u8* row, int c) {
    const u8* b = row + (c / 4) * 34;
    const float d = h2f(ld16(b));
    const signed char* qv = (const signed char*)b + 2 + 8 * (c % 4);
    return make_uint4(pack_h2(d * qv[0], d * qv[1]), pack_h2(d * qv[2], d * qv[3]), pack_h2(d * qv[4], d * qv[5]),
                      pack_h2(d * qv[6], d * qv[7]));
}

// Starts staging keys j0 .. j0 + FM_BK - 1 of K or V (`rows`: its key 0 of the block's head and
// sequence) in shared memory as F16 rows (key x D, pitch D + FM_PAD), zeros past the last key: F16
// rows by asynchronous 16-byte copies (complete after CP_ASYNC_WAIT_ALL), Q8_0 rows dequantized
// here. Thread i copies chunk i % (D / 8) of every (blockDim.x / (D / 8))-th key from i / (D / 8).
template <int D>
__device__ __forceinline__ void fm_stage(const TD& t, const u8* rows, u16* dst, int j0, int n_kv) {
    const int c = threadIdx.x % (D / 8), step = blockDim.x / (D / 8);
    const i64 pitch = t.nb[1];
    const u8* row = rows + (j0 + threadIdx.x / (D / 8)) * pitch + (t.type == T_F16 ? 16 * c : 0);
    u16* to = dst + threadIdx.x / (D / 8) * (D + FM_PAD) + 8 * c;
    for (int key = j0 + threadIdx.x / (D / 8); key < j0 + FM_BK; key += step) {
        if (key >= n_kv) *(uint4*)to = make_uint4(0, 0, 0, 0);
        else if (t.type == T_F16) CP_ASYNC_16(to, row);
        else *(uint4*)to = fm_q8_chunk(row, c);
        row += step * pitch;
        to += step * (D + FM_PAD);
    }
}

// B fragments of keys 8 n .. 8 n + 7 against dims 16 kk .. 16 kk + 31 (b[0], b[1] for kk; b[2],
// b[3] for kk + 1): B[dim][key] = K[key][dim], a row of the staged K.
__device__ __forceinline__ void fm_k_frags(const u16* ks, int pitch, int n, int kk, u32 (&b)[4]) {
    const int lane = threadIdx.x % 32;
#ifdef LDSM_X4
    LDSM_X4(b, ks + (8 * n + lane % 8) * pitch + 16 * kk + 8 * (lane / 8));
#else
    const u16* kr = ks + (8 * n + lane / 4) * pitch + 16 * kk + 2 * (lane % 4);
#pragma unroll
    for (int i = 0; i < 4; i++) b[i] = *(const u32*)(kr + 8 * i);
#endif
}

// B fragments of keys 16 kk .. 16 kk + 15 against dims 8 n .. 8 n + 15 (b[0], b[1] for dims 8 n;
// b[2], b[3] for 8 n + 8): B[key][dim] = V[key][dim], a column of the staged V.
__device__ __forceinline__ void fm_v_frags(const u16* vs, int pitch, int kk, int n, u32 (&b)[4]) {
    const int lane = threadIdx.x % 32;
#ifdef LDSM_X4_TRANS
    const int i = lane / 8;
    LDSM_X4_TRANS(b, vs + (16 * kk + 8 * (i & 1) + lane % 8) * pitch + 8 * (n + (i >> 1)));
#else
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const u16* col = vs + (16 * kk + 8 * (i & 1) + 2 * t) * pitch + 8 * (n + (i >> 1)) + g;
        b[i] = (u32)col[0] | ((u32)col[pitch] << 16);
    }
#endif
}

// Element of a float mask (F16, F32 or BF16) at p.
__device__ __forceinline__ float fm_mask_at(const TD& m, const u8* p) {
    return m.type == T_F16 ? h2f(ld16(p)) : m.type == T_F32 ? *(const float*)p : bf2f(ld16(p));
}

// How the kernel reads its mask, chosen once per launch (each kind its own copy of the kernel's
// body, so the tile loop holds only its own loads): F32 or F16 rows whose key pairs are aligned for
// one load (no mask at all reads as MK_F32 with no rows), or any other layout element by element.
#define MK_F32 0
#define MK_F16 1
#define MK_ANY 2

__device__ __forceinline__ int fm_mask_kind(const TD& m, int has_mask) {
    if (!has_mask) return MK_F32;
    const i64 pair = 2 * m.nb[0];
    const bool aligned = (u64)m.ptr % pair == 0 && m.nb[1] % pair == 0 && m.nb[2] % pair == 0 && m.nb[3] % pair == 0;
    if (m.type == T_F32 && m.nb[0] == 4 && aligned) return MK_F32;
    if (m.type == T_F16 && m.nb[0] == 2 && aligned) return MK_F16;
    return MK_ANY;
}

// Element `key` of mask row `mrow` as the kind MK reads it.
template <int MK>
__device__ __forceinline__ float fm_mask_one(const TD& m, const u8* mrow, int key) {
    if (MK == MK_F32) return ((const float*)mrow)[key];
    if (MK == MK_F16) return h2f(((const u16*)mrow)[key]);
    return fm_mask_at(m, mrow + key * m.nb[0]);
}

// The mask's part of the logits of keys `key` and `key + 1` (`key` even) for the query row whose
// mask row is `mrow` (null: no mask, 0): slope times the mask, -inf past the keys; one load for
// both in the aligned kinds.
template <int MK>
__device__ __forceinline__ float2 fm_mask_pair(const TD& m, const u8* mrow, int key, int n_kv, float slope) {
    float2 v = make_float2(key < n_kv ? 0.0f : NEG_INF, key + 1 < n_kv ? 0.0f : NEG_INF);
    if (!mrow) return v;
    if (MK == MK_F32 && key + 1 < n_kv) {
        v = ((const float2*)mrow)[key / 2];
    } else if (MK == MK_F16 && key + 1 < n_kv) {
        const u32 w = ((const u32*)mrow)[key / 2];
        v = make_float2(h2f((u16)(w & 0xFFFFu)), h2f((u16)(w >> 16)));
    } else {
        if (key < n_kv) v.x = fm_mask_one<MK>(m, mrow, key);
        if (key + 1 < n_kv) v.y = fm_mask_one<MK>(m, mrow, key + 1);
    }
    return make_float2(slope * v.x, slope * v.y);
}

// What a warp knows of its query rows: the rows' mask rows (null: no mask or past the queries),
// which rows exist, the liveness bits (as fm_live's) of every logit of the existing rows, the ALiBi
// slope.
struct FmRows {
    const u8* mrow[2];
    bool in[2];
    u32 all_live;
    float slope;
};

// Which logits of this lane's fragment of the tile at keys j0 the mask leaves finite: bit 4 n + c
// for key j0 + 8 n + 2 t + (c & 1) of query row g + 8 (c >> 1) (rows past the queries: none);
// `mixed` is set where one of them takes a mask value other than 0.
template <int MK>
__device__ __forceinline__ u32 fm_live(const TD& m, const FmRows& w, int j0, int n_kv, bool& mixed) {
    const int t = threadIdx.x % 4;
    u32 bits = 0;
    mixed = false;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (!w.in[r]) continue;
#pragma unroll
        for (int n = 0; n < FM_BK / 8; n++) {
            const float2 v = fm_mask_pair<MK>(m, w.mrow[r], j0 + 8 * n + 2 * t, n_kv, w.slope);
            bits |= (u32)(v.x != NEG_INF) << (4 * n + 2 * r);
            bits |= (u32)(v.y != NEG_INF) << (4 * n + 2 * r + 1);
            mixed |= (v.x != NEG_INF && v.x != 0.0f) || (v.y != NEG_INF && v.y != 0.0f);
        }
    }
    return bits;
}

// What a warp's part of a tile holds: some logit is finite (FM_ALIVE), some finite logit takes a
// mask value other than 0 (FM_MIXED: the softmax reads the mask again; otherwise the live logits'
// mask part is 0 and it reads nothing).
#define FM_ALIVE 1
#define FM_MIXED 2

// The classes of k_fm_tile_classes, one byte per tile of keys and block of query rows: every logit
// hidden (the mask's -inf; the block skips the tile), every key there and every row's mask value 0
// (no mask read at all), anything else (the warps read the tile's mask).
#define FM_DEAD 0
#define FM_ZERO 1
#define FM_OTHER 2

// The class of the tile at keys j0 (`cls`: the block's row of classes, null without a mask).
__device__ __forceinline__ int fm_class(const u8* cls, int j0, int n_kv) {
    return cls ? cls[j0 / FM_BK] : j0 + FM_BK <= n_kv ? FM_ZERO : FM_OTHER;
}

// The first tile from keys j0 on that is not FM_DEAD (n_kv or more: none).
__device__ __forceinline__ int fm_next_tile(const u8* cls, int j0, int n_kv) {
    while (cls && j0 < n_kv && cls[j0 / FM_BK] == FM_DEAD) j0 += FM_BK;
    return j0;
}

// This lane's liveness bits of the tile at keys j0 (as fm_live) and the warp's FM_ALIVE / FM_MIXED
// flags: from the tile's class where it is FM_ZERO (every existing row live, nothing read), else
// from the mask.
template <int MK>
__device__ __forceinline__ u32 fm_tile_bits(const TD& m, const FmRows& w, const u8* cls, int j0, int n_kv, int& flags) {
    u32 bits;
    bool mixed = false;
    if (fm_class(cls, j0, n_kv) == FM_ZERO) bits = w.all_live;
    else bits = fm_live<MK>(m, w, j0, n_kv, mixed);
    flags = (bits ? FM_ALIVE : 0) | (mixed ? FM_MIXED : 0);
    for (int off = 16; off > 0; off >>= 1) flags |= WARP_SHFL_XOR(flags, off);
    return bits;
}

// Scores `sv` of the tile at keys j0 as logits (scale, softcap, the mask's part where MIXED; -inf
// where `bits` says the mask hides them), with the largest of each row's part in this lane.
template <int MK, bool MIXED>
__device__ __forceinline__ void fm_logits(float (&sv)[FM_BK / 8][4], float (&top)[2], const TD& m, const FmRows& w,
                                          u32 bits, int j0, int n_kv, float sc, float softcap) {
    const int t = threadIdx.x % 4;
    if (softcap != 0.0f) {
#pragma unroll
        for (int n = 0; n < FM_BK / 8; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) sv[n][c] = softcap * tanhf(sv[n][c] * sc);
    } else {
#pragma unroll
        for (int n = 0; n < FM_BK / 8; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) sv[n][c] *= sc;
    }
#pragma unroll
    for (int n = 0; n < FM_BK / 8; n++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float2 mv = make_float2(0.0f, 0.0f);
            if (MIXED && ((bits >> (4 * n + 2 * r)) & 3u))
                mv = fm_mask_pair<MK>(m, w.mrow[r], j0 + 8 * n + 2 * t, n_kv, w.slope);
            sv[n][2 * r] = (bits >> (4 * n + 2 * r)) & 1u ? sv[n][2 * r] + mv.x : NEG_INF;
            sv[n][2 * r + 1] = (bits >> (4 * n + 2 * r + 1)) & 1u ? sv[n][2 * r + 1] + mv.y : NEG_INF;
            top[r] = fmaxf(top[r], fmaxf(sv[n][2 * r], sv[n][2 * r + 1]));
        }
}

// The warp's online softmax over one tile: scores `sv` become weights (logits from the scale,
// softcap and mask, `bits` the live ones, `mixed` whether the mask's values are read), the rows'
// maxima and sums move on, and the output rows `o` are rescaled to the new maxima.
template <int D, int MK>
__device__ __forceinline__ void fm_softmax(float (&sv)[FM_BK / 8][4], float (&o)[D / 8][4], float (&mx)[2],
                                           float (&sum)[2], const TD& m, const FmRows& w, u32 bits, bool mixed,
                                           int j0, int n_kv, float sc, float softcap) {
    float top[2] = {NEG_INF, NEG_INF};
    if (mixed) fm_logits<MK, true>(sv, top, m, w, bits, j0, n_kv, sc, softcap);
    else fm_logits<MK, false>(sv, top, m, w, bits, j0, n_kv, sc, softcap);
    float alpha[2], base[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        top[r] = fmaxf(top[r], WARP_SHFL_XOR(top[r], 1));
        top[r] = fmaxf(top[r], WARP_SHFL_XOR(top[r], 2));
        const float nm = fmaxf(mx[r], top[r]);
        base[r] = nm == NEG_INF ? 0.0f : nm;
        alpha[r] = FAST_EXPF(mx[r] - base[r]);
        mx[r] = nm;
        sum[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < FM_BK / 8; n++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            sv[n][c] = FAST_EXPF(sv[n][c] - base[c >> 1]);
            sum[c >> 1] += sv[n][c];
        }
#pragma unroll
    for (int n = 0; n < D / 8; n++)
#pragma unroll
        for (int c = 0; c < 4; c++) o[n][c] *= alpha[c >> 1];
}

// The tile's scores: sv = Q K^T for the warp's 16 query rows (fragments `qa`) and the staged keys.
template <int D>
__device__ __forceinline__ void fm_scores(float (&sv)[FM_BK / 8][4], const u32 (&qa)[D / 16][4], const u16* ks,
                                          u32* frags) {
#pragma unroll
    for (int n = 0; n < FM_BK / 8; n++) {
#pragma unroll
        for (int c = 0; c < 4; c++) sv[n][c] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk += 2) {
            u32 b[4];
            fm_k_frags(ks, D + FM_PAD, n, kk, b);
            const u32 b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
            FM_MMA(sv[n], qa[kk], b0);
            FM_MMA(sv[n], qa[kk + 1], b1);
        }
    }
}

// O += P V: the weights of keys 16 kk .. 16 kk + 15 are the A fragment of score tiles 2 kk and
// 2 kk + 1 (rounded to F16).
template <int D>
__device__ __forceinline__ void fm_weighted_values(float (&o)[D / 8][4], const float (&sv)[FM_BK / 8][4], const u16* vs,
                                                   u32* frags) {
#pragma unroll
    for (int kk = 0; kk < FM_BK / 16; kk++) {
        const u32 pa[4] = {pack_h2(sv[2 * kk][0], sv[2 * kk][1]), pack_h2(sv[2 * kk][2], sv[2 * kk][3]),
                           pack_h2(sv[2 * kk + 1][0], sv[2 * kk + 1][1]), pack_h2(sv[2 * kk + 1][2], sv[2 * kk + 1][3])};
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
            u32 b[4];
            fm_v_frags(vs, D + FM_PAD, kk, n, b);
            const u32 b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
            FM_MMA(o[n], pa, b0);
            FM_MMA(o[n + 1], pa, b1);
        }
    }
}

// This warp's query rows q0 .. q0 + 15 as A fragments, F16 (zeros past the last query).
template <int D>
__device__ __forceinline__ void fm_load_q(u32 (&qa)[D / 16][4], const TD& q, i64 q0, i64 h, i64 s) {
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const i64 row = q0 + g + 8 * (i & 1);
            const int c = 16 * kk + 2 * t + 8 * (i >> 1);
            const bool in = row < q.ne[1];
            qa[kk][i] = pack_h2(in ? load_float(q, c, row, h, s) : 0.0f, in ? load_float(q, c + 1, row, h, s) : 0.0f);
        }
}

// The block's shared memory: the staged K and V tiles, the fragments of the portable product.
template <int D>
struct FmShared {
    uint4 ks[FM_BK * (D + FM_PAD) / 8];
    uint4 vs[FM_BK * (D + FM_PAD) / 8];
    u32 frags[FM_FRAG_WORDS];
};

// The tiles' pipeline: K of a tile is staged while the warps weigh the values of the tile before,
// its V while they score it; the tiles' classes (`classes`, k_fm_tile_classes's, with a mask) say
// which tiles are skipped and which need their mask read, as MK says.
template <int D, int MK>
__device__ __noinline__ void flash_attn_mma(const TD& q, const TD& k, const TD& v, const TD& m, const TD& sk,
                                            const TD& d, float scale, float max_bias, float softcap, int has_mask,
                                            int has_sinks, u64 classes, FmShared<D>& sm) {
    u16* ks = (u16*)sm.ks;
    u16* vs = (u16*)sm.vs;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    u32* frags = sm.frags + (FM_FRAG_WORDS > 1 ? warp * 32 * 6 : 0);
    const int rows = blockDim.x / 32 * FM_ROWS;
    const i64 n_q = q.ne[1], n_head = q.ne[2], n_qt = (n_q + rows - 1) / rows;
    const i64 qt = n_qt - 1 - blockIdx.x % n_qt;
    const i64 h = (blockIdx.x / n_qt) % n_head, s = blockIdx.x / (n_qt * n_head);
    const i64 hk = h / (n_head / k.ne[2]);
    const int n_kv = (int)k.ne[1];
    const i64 q0 = qt * rows + warp * FM_ROWS;
    const u8* k_rows = kv_row(k, 0, hk, s);
    const u8* v_rows = kv_row(v, 0, hk, s);
    const i64 n_tiles = (n_kv + FM_BK - 1) / FM_BK;
    const u8* cls = has_mask ? (const u8*)classes + (((s % m.ne[3]) * m.ne[2] + h % m.ne[2]) * n_qt + qt) * n_tiles
                             : nullptr;
    const float sc = softcap != 0.0f ? scale / softcap : scale;
    FmRows w;
    w.slope = alibi_slope(max_bias, (int)h, (int)n_head);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        w.in[r] = q0 + g + 8 * r < n_q;
        w.mrow[r] = has_mask && w.in[r] ? (const u8*)m.ptr + (q0 + g + 8 * r) * m.nb[1] + (h % m.ne[2]) * m.nb[2] +
                                               (s % m.ne[3]) * m.nb[3]
                                         : nullptr;
    }
    w.all_live = (w.in[0] ? 0x33333333u : 0u) | (w.in[1] ? 0xCCCCCCCCu : 0u);
    u32 qa[D / 16][4];
    fm_load_q<D>(qa, q, q0, h, s);
    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++)
#pragma unroll
        for (int c = 0; c < 4; c++) o[n][c] = 0.0f;
    float mx[2] = {NEG_INF, NEG_INF}, sum[2] = {0.0f, 0.0f};
    int j0 = fm_next_tile(cls, 0, n_kv);
    if (j0 < n_kv) fm_stage<D>(k, k_rows, ks, j0, n_kv);
    while (j0 < n_kv) {
        int flags;
        const u32 bits = fm_tile_bits<MK>(m, w, cls, j0, n_kv, flags);
        CP_ASYNC_WAIT_ALL();
        __syncthreads();  // K staged; every warp done with the last tile's V
        fm_stage<D>(v, v_rows, vs, j0, n_kv);
        float sv[FM_BK / 8][4];
        if (flags & FM_ALIVE) {
            fm_scores<D>(sv, qa, ks, frags);
            fm_softmax<D, MK>(sv, o, mx, sum, m, w, bits, (flags & FM_MIXED) != 0, j0, n_kv, sc, softcap);
        }
        const int jn = fm_next_tile(cls, j0 + FM_BK, n_kv);
        CP_ASYNC_WAIT_ALL();
        __syncthreads();  // V staged; every warp done with K
        if (jn < n_kv) fm_stage<D>(k, k_rows, ks, jn, n_kv);
        if (flags & FM_ALIVE) fm_weighted_values<D>(o, sv, vs, frags);
        j0 = jn;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        sum[r] += WARP_SHFL_XOR(sum[r], 1);
        sum[r] += WARP_SHFL_XOR(sum[r], 2);
        const i64 row = q0 + g + 8 * r;
        if (row >= n_q) continue;
        const float inv = attn_out_scale(sk, has_sinks, h, mx[r], sum[r]);
        float* out = (float*)(d.ptr + h * d.nb[1] + row * d.nb[2] + s * d.nb[3]);
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            out[8 * n + 2 * t] = o[n][2 * r] * inv;
            out[8 * n + 2 * t + 1] = o[n][2 * r + 1] * inv;
        }
    }
}

// The kernel's body for the mask's kind (one copy per kind, one shared memory).
template <int D>
__device__ __forceinline__ void flash_attn_mma_kinds(const TD& q, const TD& k, const TD& v, const TD& m, const TD& sk,
                                                     const TD& d, float scale, float max_bias, float softcap,
                                                     int has_mask, int has_sinks, u64 classes) {
    __shared__ FmShared<D> sm;
    const int kind = fm_mask_kind(m, has_mask);
    if (kind == MK_F32)
        flash_attn_mma<D, MK_F32>(q, k, v, m, sk, d, scale, max_bias, softcap, has_mask, has_sinks, classes, sm);
    else if (kind == MK_F16)
        flash_attn_mma<D, MK_F16>(q, k, v, m, sk, d, scale, max_bias, softcap, has_mask, has_sinks, classes, sm);
    else flash_attn_mma<D, MK_ANY>(q, k, v, m, sk, d, scale, max_bias, softcap, has_mask, has_sinks, classes, sm);
}

// One block per 16 queries per warp of a head and sequence (the last queries' blocks first); the
// operands and options as k_flash_attn's, then the mask's tile classes (k_fm_tile_classes's for
// blocks of these rows; unread without a mask); the result F32 and contiguous.
extern "C" __global__ void __launch_bounds__(FM_WARPS * 32) k_flash_attn_mma_d64(TD q, TD k, TD v, TD m, TD sk,
    TD d, float scale, float max_bias, float softcap, int has_mask, int has_sinks, u64 classes) {
    GRID_DEPENDENCY_SYNC();
    flash_attn_mma_kinds<64>(q, k, v, m, sk, d, scale, max_bias, softcap, has_mask, has_sinks, classes);
}
extern "C" __global__ void __launch_bounds__(FM_WARPS * 32) k_flash_attn_mma_d128(TD q, TD k, TD v, TD m, TD sk,
    TD d, float scale, float max_bias, float softcap, int has_mask, int has_sinks, u64 classes) {
    GRID_DEPENDENCY_SYNC();
    flash_attn_mma_kinds<128>(q, k, v, m, sk, d, scale, max_bias, softcap, has_mask, has_sinks, classes);
}

// The class (FM_DEAD, FM_ZERO, FM_OTHER) of each tile of FM_BK keys for each block of `rows` query
// rows of k_flash_attn_mma_*, one block per tile, block of rows and mask head and sequence (tile
// fastest, then the block of rows: classes[((s ne2 + h) n_qt + qt) n_tiles + tile]), from the
// mask `m` of n_q queries and n_kv keys: rows past the queries count for nothing, keys past n_kv as
// hidden.
extern "C" __global__ void __launch_bounds__(FM_WARPS * 32) k_fm_tile_classes(TD m, u64 classes, int n_q, int n_kv,
                                                                              int rows) {
    GRID_DEPENDENCY_SYNC();
    __shared__ int warp_seen[FM_WARPS];
    const int n_tiles = (n_kv + FM_BK - 1) / FM_BK, n_qt = (n_q + rows - 1) / rows;
    const int tile = blockIdx.x % n_tiles, qt = blockIdx.x / n_tiles % n_qt;
    const i64 mh = blockIdx.x / ((i64)n_tiles * n_qt);
    const u8* base = (const u8*)m.ptr + (mh % m.ne[2]) * m.nb[2] + (mh / m.ne[2]) * m.nb[3];
    int seen = 0;  // bit 0: a finite logit; bit 1: a mask value other than 0, or a key past n_kv
    for (int i = threadIdx.x; i < rows * FM_BK; i += blockDim.x) {
        const i64 row = (i64)qt * rows + i / FM_BK;
        const int key = tile * FM_BK + i % FM_BK;
        if (row >= n_q) continue;
        if (key >= n_kv) {
            seen |= 2;
            continue;
        }
        const float x = fm_mask_at(m, base + row * m.nb[1] + key * m.nb[0]);
        seen |= (x != NEG_INF ? 1 : 0) | (x != 0.0f ? 2 : 0);
    }
    for (int off = 16; off > 0; off >>= 1) seen |= WARP_SHFL_XOR(seen, off);
    if (threadIdx.x % 32 == 0) warp_seen[threadIdx.x / 32] = seen;
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int i = 0; i < (int)blockDim.x / 32; i++) seen |= warp_seen[i];
    ((u8*)classes)[blockIdx.x] = !(seen & 1) ? FM_DEAD : (seen & 2) ? FM_OTHER : FM_ZERO;
}
