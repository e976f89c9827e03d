// Copies and row gathers: cpy/cont between any layouts and types (k_cpy; k_cpy_q quantizes to
// Q8_0/Q4_0 with ggml's reference quantizers), get_rows, set_rows (k_set_rows, k_set_rows_q; and
// k_rope_set_rows, a rope whose result goes into a cache too, with q's rope and v's cache write at
// decode) and concat. Element order follows
// ggml: the i-th element of the source goes to the i-th of the result.
// The `_rows` kernels are the fast paths for row-contiguous float rows (see ld_row): one thread per
// chunk of 1 or 4 elements (`vec`), 32-bit index arithmetic.

// Quantizes 32 values into the block at b (Q8_0 or Q4_0), as quantize_row_*_ref.
__device__ void quantize_block(const float* x, u8* b, int type) {
    if (type == T_Q8_0) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        float dd = amax / 127.0f;
        float id = dd != 0.0f ? 1.0f / dd : 0.0f;
        *(u16*)b = f2h(dd);
        for (int j = 0; j < 32; j++) b[2 + j] = (u8)(signed char)roundf(x[j] * id);
    } else {
        float amax = 0.0f, mx = 0.0f;
        for (int j = 0; j < 32; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                mx = x[j];
            }
        }
        float dd = mx / -8.0f;
        float id = dd != 0.0f ? 1.0f / dd : 0.0f;
        *(u16*)b = f2h(dd);
        for (int j = 0; j < 16; j++) {
            int q0 = min(15, (int)(x[j] * id + 8.5f));
            int q1 = min(15, (int)(x[j + 16] * id + 8.5f));
            b[2 + j] = (u8)(q0 | (q1 << 4));
        }
    }
}

extern "C" __global__ void k_cpy(TD s, TD d) { GRID_DEPENDENCY_SYNC();
    i64 n = nelem(d);
    GRID_LOOP(l, n) {
        i64 i[4], j[4];
        unravel(l, d.ne, i);
        unravel(l, s.ne, j);
        xfer(s, j[0], j[1], j[2], j[3], d, i[0], i[1], i[2], i[3]);
    }
}

extern "C" __global__ void k_cpy_q(TD s, TD d) { GRID_DEPENDENCY_SYNC();
    i64 nb = nelem(d) / 32;
    GRID_LOOP(bi, nb) {
        i64 l0 = bi * 32;
        i64 i[4];
        unravel(l0, d.ne, i);
        float x[32];
        for (int k = 0; k < 32; k++) {
            i64 j[4];
            unravel(l0 + k, s.ne, j);
            x[k] = load(s, j[0], j[1], j[2], j[3]);
        }
        quantize_block(x, addr(d, i[0], i[1], i[2], i[3]), d.type);
    }
}

// Same-type copy of block-quantized rows (s.ne[0] == d.ne[0]): one thread per block, raw bytes.
extern "C" __global__ void k_cpy_blocks(TD s, TD d, int type_size) { GRID_DEPENDENCY_SYNC();
    i64 per_row = d.ne[0] / block_size(d.type);
    i64 nb = per_row * d.ne[1] * d.ne[2] * d.ne[3];
    GRID_LOOP(bi, nb) {
        i64 i0 = (bi % per_row) * block_size(d.type);
        i64 r = bi / per_row, q = r;
        i64 d1 = q % d.ne[1]; q /= d.ne[1];
        i64 d2 = q % d.ne[2], d3 = q / d.ne[2];
        i64 s1 = r % s.ne[1]; r /= s.ne[1];
        i64 s2 = r % s.ne[2], s3 = r / s.ne[2];
        const u8* from = addr(s, i0, s1, s2, s3);
        u8* to = addr(d, i0, d1, d2, d3);
        for (int k = 0; k < type_size; k++) to[k] = from[k];
    }
}

// Element i of get_rows (also the MoE router's, k_moe_router): NaN for a row id out of range.
__device__ __forceinline__ void get_rows_at(const TD& t, const TD& ids, const TD& d, const i64 (&i)[4]) {
    int row = load_i32(ids, i[1], i[2], i[3], 0);
    if (row < 0 || row >= t.ne[1]) {
        store(d, i[0], i[1], i[2], i[3], __int_as_float(0x7fc00000));
        return;
    }
    xfer(t, i[0], row, i[2], i[3], d, i[0], i[1], i[2], i[3]);
}

extern "C" __global__ void k_get_rows(TD t, TD ids, TD d) { GRID_DEPENDENCY_SYNC();
    i64 n = nelem(d);
    GRID_LOOP(l, n) {
        i64 i[4];
        unravel(l, d.ne, i);
        get_rows_at(t, ids, d, i);
    }
}

__device__ __forceinline__ int set_rows_target(const TD& ids, const TD& d, i64 i1, i64 i2, i64 i3) {
    int row = load_i32(ids, i1, i2 % ids.ne[1], i3 % ids.ne[2], 0);
    return (row < 0 || row >= d.ne[1]) ? -1 : row;
}

extern "C" __global__ void k_set_rows(TD d, TD s, TD ids) { GRID_DEPENDENCY_SYNC();
    i64 n = nelem(s);
    GRID_LOOP(l, n) {
        i64 i[4];
        unravel(l, s.ne, i);
        int row = set_rows_target(ids, d, i[1], i[2], i[3]);
        if (row >= 0) xfer(s, i[0], i[1], i[2], i[3], d, i[0], row, i[2], i[3]);
    }
}

extern "C" __global__ void k_set_rows_q(TD d, TD s, TD ids) { GRID_DEPENDENCY_SYNC();
    i64 per_row = s.ne[0] / 32;
    i64 nb = per_row * s.ne[1] * s.ne[2] * s.ne[3];
    GRID_LOOP(bi, nb) {
        i64 i0 = (bi % per_row) * 32, r = bi / per_row;
        i64 i1 = r % s.ne[1], i2 = (r / s.ne[1]) % s.ne[2], i3 = r / (s.ne[1] * s.ne[2]);
        int row = set_rows_target(ids, d, i1, i2, i3);
        if (row < 0) continue;
        float x[32];
        for (int k = 0; k < 32; k++) x[k] = load(s, i0 + k, i1, i2, i3);
        quantize_block(x, addr(d, i0, row, i2, i3), d.type);
    }
}

extern "C" __global__ void k_concat(TD a, TD b, TD d, int dim) { GRID_DEPENDENCY_SYNC();
    i64 n = nelem(d);
    GRID_LOOP(l, n) {
        i64 i[4];
        unravel(l, d.ne, i);
        if (i[dim] < a.ne[dim]) {
            xfer(a, i[0], i[1], i[2], i[3], d, i[0], i[1], i[2], i[3]);
        } else {
            i64 j[4] = {i[0], i[1], i[2], i[3]};
            j[dim] -= a.ne[dim];
            xfer(b, j[0], j[1], j[2], j[3], d, i[0], i[1], i[2], i[3]);
        }
    }
}

// Float copy between row-contiguous tensors of one shape.
template <int V> __device__ void cpy_rows(const TD& s, const TD& d) {
    const u32 cpr = (u32)d.ne[0] / V;
    CHUNK_LOOP(c, cpr * nrows32(d)) {
        u32 i[3];
        u32 k = chunk_row(c, cpr, d, i) * V;
        float v[V];
        ld_row<V>(row_at(s, i), s.type, k, v);
        st_row<V>(row_at(d, i), d.type, k, v);
    }
}

extern "C" __global__ void k_cpy_rows(TD s, TD d, int vec) { GRID_DEPENDENCY_SYNC();
    if (vec == 4) cpy_rows<4>(s, d);
    else cpy_rows<1>(s, d);
}

// Element (i0, i1, i2) of an I32 tensor, broadcast over its axes 1 and 2.
__device__ __forceinline__ int id_at(const TD& ids, u32 i0, u32 i1, u32 i2) {
    return *(const int*)(ids.ptr + (i64)i0 * ids.nb[0] + (i64)(i1 % (u32)ids.ne[1]) * ids.nb[1] +
                         (i64)(i2 % (u32)ids.ne[2]) * ids.nb[2]);
}

template <int V> __device__ void get_rows_rows(const TD& t, const TD& ids, const TD& d) {
    const u32 cpr = (u32)d.ne[0] / V;
    CHUNK_LOOP(c, cpr * nrows32(d)) {
        u32 i[3];
        u32 k = chunk_row(c, cpr, d, i) * V;
        int row = id_at(ids, i[0], i[1], i[2]);
        float v[V];
        if (row < 0 || row >= t.ne[1]) {
            for (int j = 0; j < V; j++) v[j] = __int_as_float(0x7fc00000);
        } else {
            u32 at[3] = {(u32)row, i[1], i[2]};
            ld_row<V>(row_at(t, at), t.type, k, v);
        }
        st_row<V>(row_at(d, i), d.type, k, v);
    }
}

extern "C" __global__ void k_get_rows_rows(TD t, TD ids, TD d, int vec) { GRID_DEPENDENCY_SYNC();
    if (vec == 4) get_rows_rows<4>(t, ids, d);
    else get_rows_rows<1>(t, ids, d);
}

// Chunk c (of cpr per row) of set_rows_rows: V elements of a row of s into the row of d that ids
// give (nothing for ids out of d's rows).
template <int V> __device__ __forceinline__ void set_rows_chunk(const TD& d, const TD& s, const TD& ids, u32 c, u32 cpr) {
    u32 i[3];
    u32 k = chunk_row(c, cpr, s, i) * V;
    int row = id_at(ids, i[0], i[1], i[2]);
    if (row < 0 || row >= d.ne[1]) return;
    float v[V];
    ld_row<V>(row_at(s, i), s.type, k, v);
    u32 at[3] = {(u32)row, i[1], i[2]};
    st_row<V>(row_at(d, at), d.type, k, v);
}

template <int V> __device__ void set_rows_rows(const TD& d, const TD& s, const TD& ids) {
    const u32 cpr = (u32)s.ne[0] / V;
    CHUNK_LOOP(c, cpr * nrows32(s)) set_rows_chunk<V>(d, s, ids, c, cpr);
}

extern "C" __global__ void k_set_rows_rows(TD d, TD s, TD ids, int vec) { GRID_DEPENDENCY_SYNC();
    if (vec == 4) set_rows_rows<4>(d, s, ids);
    else set_rows_rows<1>(d, s, ids);
}

// k_rope_rows (rope.cu) that also writes its result into the rows `ids` of a cache: set_rows of the
// result, or of its view with axes 1 and 2 swapped when swap12 ([d, heads, tokens] -> [d, tokens,
// heads]); ids out of the cache's rows write nothing there, as in k_set_rows_rows. At decode the
// same launch may also take the rope of q (qa -> qd, the same rope and positions: its first
// q_chunks chunks) and the set_rows of v (vs into vcache at vids, one element per chunk: its last
// v_chunks chunks); 0 chunks leave a part out.
extern "C" __global__ void k_rope_set_rows(TD a, TD pos, TD ff, TD d, TD cache, TD ids, int swap12, TD qa, TD qd,
                                           int q_chunks, TD vs, TD vcache, TD vids, int v_chunks, int n_dims,
                                           int neox, int has_ff, float freq_base, float freq_scale,
                                           float ext_factor, float attn_factor, float corr0, float corr1) { GRID_DEPENDENCY_SYNC();
    const RopeArgs ra = {n_dims, neox, has_ff, freq_base, freq_scale, ext_factor, attn_factor, corr0, corr1};
    const u32 nq = (u32)q_chunks, nk = ((u32)d.ne[0] - (u32)n_dims / 2) * nrows32(d);
    CHUNK_LOOP(c, nq + nk + (u32)v_chunks) {
        u32 i[3], at[2];
        float y[2];
        if (c < nq) {
            rope_chunk(ra, qa, pos, ff, qd, c, i, at, y);
            continue;
        }
        if (c >= nq + nk) {
            set_rows_chunk<1>(vcache, vs, vids, c - nq - nk, (u32)vs.ne[0]);
            continue;
        }
        const int n = rope_chunk(ra, a, pos, ff, d, c - nq, i, at, y);
        // The row of the set_rows source: its axes 1, 2, 3.
        const u32 j[3] = {swap12 ? i[1] : i[0], swap12 ? i[0] : i[1], i[2]};
        const int row = id_at(ids, j[0], j[1], j[2]);
        if (row < 0 || row >= cache.ne[1]) continue;
        const u32 to[3] = {(u32)row, j[1], j[2]};
        u8* crow = row_at(cache, to);
        for (int e = 0; e < n; e++) st_row<1>(crow, cache.type, at[e], y + e);
    }
}
