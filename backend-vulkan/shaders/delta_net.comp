// gated_delta_net over the whole batch in one dispatch. Every value column of a head's state
// S[key, value] evolves on its own given the keys and queries, so each invocation owns one column
// (MAX_DK keys at most, in private memory) of one value head; workgroup g takes head g / tiles and
// columns (g % tiles) * WG .. of it, the token's key and query staged in shared memory.
// Slots: 0 = result [Dv, H, T + Dk] (outputs, then the final state in the state's layout),
// 1 = q, 2 = k [Dk, Hk, T], 3 = v [Dv, H, T], 4 = gates [H, T, 2] (log decay, then beta),
// 5 = state [Dk, Dv, H]. Parameters: tiled (key heads shared round-robin), column tiles.

#include "common.glsl"

#define MAX_DK 256u
shared float sk[MAX_DK];
shared float sq[MAX_DK];

void main() {
    uint tiles = pu(1u);
    uint g = group_id();
    uint h = g / tiles;
    if (h >= ne(3u, 1u)) return;
    uint l = gl_LocalInvocationID.x;
    uint j = (g % tiles) * WG + l;
    uint dk = ne(2u, 0u), hk = ne(2u, 1u), n_tok = ne(2u, 2u);
    uint dv = ne(3u, 0u), nh = ne(3u, 1u);
    uint kh = pu(0u) != 0u ? h % hk : h / (nh / hk);
    bool live = j < dv;
    float s[MAX_DK];
    if (live) {
        for (uint i = 0u; i < dk; i++) s[i] = load(5u, uvec4(i, j, h, 0u));
    }
    for (uint t = 0u; t < n_tok; t++) {
        barrier();
        for (uint i = l; i < dk; i += WG) {
            sk[i] = load(2u, uvec4(i, kh, t, 0u));
            sq[i] = load(1u, uvec4(i, kh, t, 0u));
        }
        barrier();
        if (live) {
            float decay = exp(load(4u, uvec4(h, t, 0u, 0u)));
            float r = 0.0;
            for (uint i = 0u; i < dk; i++) {
                s[i] *= decay;
                r += s[i] * sk[i];
            }
            float u = load(4u, uvec4(h, t, 1u, 0u)) * (load(3u, uvec4(j, h, t, 0u)) - r);
            float o = 0.0;
            for (uint i = 0u; i < dk; i++) {
                s[i] += sk[i] * u;
                o += s[i] * sq[i];
            }
            store(0u, uvec4(j, h, t, 0u), o);
        }
    }
    if (!live) return;
    for (uint i = 0u; i < dk; i++) {
        uint f = n_tok * dv * nh + (h * dv + j) * dk + i;
        store(0u, uvec4(f % dv, (f / dv) % nh, f / (dv * nh), 0u), s[i]);
    }
}
