// flash_attn_ext, one workgroup per destination row (head h, query iq, sequence s): scores of all
// MAX_KV keys in shared memory, a workgroup max and sum, then the weighted sum of values. Slots:
// 1 = q F32 [D, Nq, H, S], 2 = k, 3 = v (any loadable type), 4 = optional mask, 5 = optional sinks.
// Parameters: scale, max_bias, softcap, has_mask, has_sinks.

#define BLOCKS
#include "common.glsl"
#include "blocks.glsl"

#define MAX_KV 2048u
shared float scores[MAX_KV];

void main() {
    uint r = group_id();
    if (r >= nrows(0u)) return;
    uvec3 ri = unravel_row(r, 0u);
    uint h = ri.x, iq = ri.y, s = ri.z;
    uint n_kv = ne(2u, 1u);
    uint d = ne(1u, 0u);
    uint hk = h / (ne(1u, 2u) / ne(2u, 2u));
    uint l = gl_LocalInvocationID.x;
    float softcap = pf(2u);
    float scale = softcap != 0.0 ? pf(0u) / softcap : pf(0u);
    float slope = alibi_slope(pf(1u), h, ne(1u, 2u));
    bool has_mask = pu(3u) != 0u;
    uint qrow = row_off(1u, iq, h, s);
    uint mrow = has_mask ? row_off(4u, iq, h % ne(4u, 2u), s % ne(4u, 3u)) : 0u;
    const float NEG_INF = -1.0 / 0.0;

    float mx = NEG_INF;
    for (uint j = l; j < n_kv; j += WG) {
        float mv = has_mask ? slope * load_scalar_elem(4u, mrow, j) : 0.0;
        float x = NEG_INF;
        if (mv != NEG_INF) {
            uint krow = row_off(2u, j, hk, s);
            float dot = 0.0;
            for (uint c = 0u; c < d; c++) dot += load_scalar_elem(1u, qrow, c) * load_row_elem(2u, krow, c);
            x = dot * scale;
            if (softcap != 0.0) x = softcap * tanh(clamp(x, -15.0, 15.0));
            x += mv;
        }
        scores[j] = x;
        mx = max(mx, x);
    }
    mx = wg_max(mx);
    float sink = NEG_INF;
    if (pu(4u) != 0u) {
        sink = load(5u, uvec4(h, 0u, 0u, 0u));
        mx = max(mx, sink);
    }
    float sum = 0.0;
    for (uint j = l; j < n_kv; j += WG) {
        float pj = scores[j] == NEG_INF ? 0.0 : exp(scores[j] - mx);
        scores[j] = pj;
        sum += pj;
    }
    sum = wg_sum(sum);
    if (sink != NEG_INF) sum += exp(sink - mx);
    float inv = sum == 0.0 ? 0.0 : 1.0 / sum;
    // wg_sum ends with a barrier, so every score is visible here.
    uint dst = row_off(0u, h, iq, s);
    for (uint c = l; c < ne(3u, 0u); c += WG) {
        float acc = 0.0;
        for (uint j = 0u; j < n_kv; j++) {
            if (scores[j] != 0.0) acc += scores[j] * load(3u, uvec4(c, j, hk, s));
        }
        store_at(0u, dst + c * nb(0u, 0u), acc * inv);
    }
}
