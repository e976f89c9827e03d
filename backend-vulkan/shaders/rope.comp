// Rotary embedding, one invocation per destination element: slot 1 = a [head_dim, n_head, n_tokens],
// slot 2 = I32 positions, slot 3 = optional F32 frequency factors. Parameters: mode (0 normal, 1
// NeoX), n_dims, freq_base, freq_scale, ext_factor, attn_factor, YaRN correction dims, has factors.

#include "common.glsl"

void main() {
    uint e = thread_id();
    if (e >= nelem(0u)) return;
    uvec4 i = unravel(e, 0u);
    uint nd = pu(1u);
    if (i.x >= nd) {
        store(0u, i, load(1u, i));
        return;
    }
    bool neox = pu(0u) == 1u;
    uint half_nd = nd / 2u;
    uint k = neox ? i.x % half_nd : i.x / 2u;
    uint i_lo = neox ? k : 2u * k;
    uint i_hi = neox ? k + half_nd : 2u * k + 1u;
    bool second = i.x == i_hi;

    float pos = float(load_i32(2u, uvec4(i.z, 0u, 0u, 0u)));
    float theta_extrap = pos * pow(pf(2u), -2.0 * float(k) / float(nd));
    if (pu(8u) != 0u) theta_extrap /= load(3u, uvec4(k, 0u, 0u, 0u));
    float freq_scale = pf(3u), ext_factor = pf(4u);
    float mscale = pf(5u);
    float theta = freq_scale * theta_extrap;
    if (ext_factor != 0.0) {
        float y = (float(k) - pf(6u)) / max(0.001, pf(7u) - pf(6u));
        float ramp_mix = (1.0 - clamp(y, 0.0, 1.0)) * ext_factor;
        theta = theta * (1.0 - ramp_mix) + theta_extrap * ramp_mix;
        mscale *= 1.0 + 0.1 * log(1.0 / freq_scale);
    }
    float c = cos(theta) * mscale, s = sin(theta) * mscale;
    float x0 = load(1u, uvec4(i_lo, i.yzw));
    float x1 = load(1u, uvec4(i_hi, i.yzw));
    store(0u, i, second ? x0 * s + x1 * c : x0 * c - x1 * s);
}
