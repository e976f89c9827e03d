// One workgroup per row of slot 1: rms_norm (pu(0) = 0), norm (1), sum_rows (2) and soft_max (3,
// with an optional mask in slot 2 and sinks in slot 3). Result rows in slot 0 (F32).

#include "common.glsl"

void main() {
    uint op = pu(0u);
    uint r = group_id();
    if (r >= nrows(1u)) return;
    uvec3 ri = unravel_row(r, 1u);
    uint n = ne(1u, 0u);
    uint l = gl_LocalInvocationID.x;
    uint src = row_off(1u, ri.x, ri.y, ri.z);
    uint dst = row_off(0u, ri.x, ri.y, ri.z);
    uint dnb = nb(0u, 0u);
    if (op == 2u) {
        float s = 0.0;
        for (uint i = l; i < n; i += WG) s += load_row_elem(1u, src, i);
        s = wg_sum(s);
        if (l == 0u) store_at(0u, dst, s);
        return;
    }
    if (op == 0u || op == 1u) {
        float mean = 0.0;
        if (op == 1u) {
            float s = 0.0;
            for (uint i = l; i < n; i += WG) s += load_row_elem(1u, src, i);
            mean = wg_sum(s) / float(n);
        }
        float ss = 0.0;
        for (uint i = l; i < n; i += WG) {
            float x = load_row_elem(1u, src, i) - mean;
            ss += x * x;
        }
        float scale = 1.0 / sqrt(wg_sum(ss) / float(n) + pf(1u));
        for (uint i = l; i < n; i += WG) store_at(0u, dst + i * dnb, (load_row_elem(1u, src, i) - mean) * scale);
        return;
    }
    // soft_max
    float scale = pf(1u);
    float slope = alibi_slope(pf(2u), ri.y, ne(1u, 2u));
    bool has_mask = pu(3u) != 0u;
    uint mrow = has_mask ? row_off(2u, ri.x, ri.y % ne(2u, 2u), ri.z % ne(2u, 3u)) : 0u;
    float mx = -1.0 / 0.0;
    for (uint i = l; i < n; i += WG) {
        float v = load_row_elem(1u, src, i) * scale;
        if (has_mask) v += slope * load_row_elem(2u, mrow, i);
        store_at(0u, dst + i * dnb, v);
        mx = max(mx, v);
    }
    mx = wg_max(mx);
    float sink = 0.0;
    bool has_sink = pu(4u) != 0u;
    if (has_sink) {
        sink = load(3u, uvec4(ri.y, 0u, 0u, 0u));
        mx = max(mx, sink);
    }
    float s = 0.0;
    for (uint i = l; i < n; i += WG) {
        float v = uintBitsToFloat(rd32(0u, dst + i * dnb));
        float e = v == -1.0 / 0.0 ? 0.0 : exp(v - mx);
        store_at(0u, dst + i * dnb, e);
        s += e;
    }
    s = wg_sum(s);
    if (has_sink) s += exp(sink - mx);
    float inv = s > 0.0 ? 1.0 / s : 0.0;
    for (uint i = l; i < n; i += WG) {
        float v = uintBitsToFloat(rd32(0u, dst + i * dnb));
        store_at(0u, dst + i * dnb, v * inv);
    }
}
