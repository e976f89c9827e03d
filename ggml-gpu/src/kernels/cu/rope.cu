// Rotary embedding (ggml's rope_ext): Normal (adjacent pairs) and NeoX (halves) layouts, partial
// rotation, frequency factors and YaRN (ramp mix and magnitude scaling). k_rope: one thread per
// element through the strides; k_rope_rows, the fast path for row-contiguous float rows: one thread
// per rotated pair (or per element past n_dims), 32-bit index arithmetic; k_rope_set_rows of
// rows.cu does the same and writes the result into a cache's rows too. The YaRN correction dims
// are computed on the host.

struct RopeArgs {
    int n_dims, neox, has_ff;
    float freq_base, freq_scale, ext_factor, attn_factor, corr0, corr1;
};

// Cosine and sine (scaled) of the rotation of pair k at position p.
__device__ __forceinline__ void rope_cs(const RopeArgs& ra, const TD& ff, i64 k, float p, float* c, float* s) {
    float theta_scale = powf(ra.freq_base, -2.0f / ra.n_dims);
    float theta_extrap = p * powf(theta_scale, (float)k);
    if (ra.has_ff) theta_extrap /= *(const float*)(ff.ptr + k * ff.nb[0]);
    float theta_interp = ra.freq_scale * theta_extrap;
    float theta = theta_interp;
    float mscale = ra.attn_factor;
    if (ra.ext_factor != 0.0f) {
        float y = ((float)k - ra.corr0) / fmaxf(0.001f, ra.corr1 - ra.corr0);
        float ramp = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * ra.ext_factor;
        theta = theta_interp * (1.0f - ramp) + theta_extrap * ramp;
        mscale *= 1.0f + 0.1f * logf(1.0f / ra.freq_scale);
    }
    *c = cosf(theta) * mscale;
    *s = sinf(theta) * mscale;
}

extern "C" __global__ void k_rope(TD a, TD pos, TD ff, TD d, int n_dims, int neox, int has_ff,
                                  float freq_base, float freq_scale, float ext_factor, float attn_factor,
                                  float corr0, float corr1) { GRID_DEPENDENCY_SYNC();
    const RopeArgs ra = {n_dims, neox, has_ff, freq_base, freq_scale, ext_factor, attn_factor, corr0, corr1};
    i64 n = nelem(d);
    GRID_LOOP(l, n) {
        i64 i[4];
        unravel(l, d.ne, i);
        i64 i0 = i[0];
        if (i0 >= n_dims) {
            store(d, i0, i[1], i[2], i[3], load(a, i0, i[1], i[2], i[3]));
            continue;
        }
        int h = n_dims / 2;
        i64 k, first, second;
        if (neox) {
            k = i0 % h;
            first = k;
            second = k + h;
        } else {
            k = i0 / 2;
            first = 2 * k;
            second = 2 * k + 1;
        }
        float c, s;
        rope_cs(ra, ff, k, (float)load_i32(pos, i[2], 0, 0, 0), &c, &s);
        float x0 = load(a, first, i[1], i[2], i[3]);
        float x1 = load(a, second, i[1], i[2], i[3]);
        store(d, i0, i[1], i[2], i[3], i0 == first ? x0 * c - x1 * s : x0 * s + x1 * c);
    }
}

// Chunk c of k_rope_rows: the rotated pair k of row i of a written to d (or, past n_dims, one
// element copied). Sets the row i, the n (2 or 1) element indices `at` and their values y; returns n.
__device__ __forceinline__ int rope_chunk(const RopeArgs& ra, const TD& a, const TD& pos, const TD& ff, const TD& d,
                                          u32 c, u32* i, u32* at, float* y) {
    const u32 h = (u32)ra.n_dims / 2, per_row = (u32)d.ne[0] - h;
    const u32 k = chunk_row(c, per_row, d, i);
    const u8* src = row_at(a, i);
    u8* dst = row_at(d, i);
    if (k >= h) {
        at[0] = k + h;
        ld_row<1>(src, a.type, at[0], y);
        st_row<1>(dst, d.type, at[0], y);
        return 1;
    }
    at[0] = ra.neox ? k : 2 * k;
    at[1] = ra.neox ? k + h : 2 * k + 1;
    float cs, sn, x[2];
    rope_cs(ra, ff, k, (float)*(const int*)(pos.ptr + (i64)i[1] * pos.nb[0]), &cs, &sn);
    ld_row<1>(src, a.type, at[0], x);
    ld_row<1>(src, a.type, at[1], x + 1);
    y[0] = x[0] * cs - x[1] * sn;
    y[1] = x[0] * sn + x[1] * cs;
    st_row<1>(dst, d.type, at[0], y);
    st_row<1>(dst, d.type, at[1], y + 1);
    return 2;
}

extern "C" __global__ void k_rope_rows(TD a, TD pos, TD ff, TD d, int n_dims, int neox, int has_ff,
                                       float freq_base, float freq_scale, float ext_factor, float attn_factor,
                                       float corr0, float corr1) { GRID_DEPENDENCY_SYNC();
    const RopeArgs ra = {n_dims, neox, has_ff, freq_base, freq_scale, ext_factor, attn_factor, corr0, corr1};
    CHUNK_LOOP(c, ((u32)d.ne[0] - (u32)n_dims / 2) * nrows32(d)) {
        u32 i[3], at[2];
        float y[2];
        rope_chunk(ra, a, pos, ff, d, c, i, at, y);
    }
}
