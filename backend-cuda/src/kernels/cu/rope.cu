// Rotary embedding (ggml's rope_ext): Normal (adjacent pairs) and NeoX (halves) layouts, partial
// rotation, frequency factors and YaRN (ramp mix and magnitude scaling). One thread per element;
// the YaRN correction dims are computed on the host.

extern "C" __global__ void k_rope(TD a, TD pos, TD ff, TD d, int n_dims, int neox, int has_ff,
                                  float freq_base, float freq_scale, float ext_factor, float attn_factor,
                                  float corr0, float corr1) {
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
        float p = (float)load_i32(pos, i[2], 0, 0, 0);
        float theta_scale = powf(freq_base, -2.0f / n_dims);
        float theta_extrap = p * powf(theta_scale, (float)k);
        if (has_ff) theta_extrap /= load(ff, k, 0, 0, 0);
        float theta_interp = freq_scale * theta_extrap;
        float theta = theta_interp;
        float mscale = attn_factor;
        if (ext_factor != 0.0f) {
            float y = ((float)k - corr0) / fmaxf(0.001f, corr1 - corr0);
            float ramp = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * ext_factor;
            theta = theta_interp * (1.0f - ramp) + theta_extrap * ramp;
            mscale *= 1.0f + 0.1f * logf(1.0f / freq_scale);
        }
        float c = cosf(theta) * mscale, s = sinf(theta) * mscale;
        float x0 = load(a, first, i[1], i[2], i[3]);
        float x1 = load(a, second, i[1], i[2], i[3]);
        store(d, i0, i[1], i[2], i[3], i0 == first ? x0 * c - x1 * s : x0 * s + x1 * c);
    }
}
