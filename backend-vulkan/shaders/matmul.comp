// mul_mat and mul_mat_id, one invocation per destination element, dequantizing the weights row by
// row in the shader. Slot 1 = weights (any loadable type), slot 2 = activations, slot 3 = I32 expert
// ids (mul_mat_id, pu(0) = 1). mul_mat broadcasts the weights over activation dims 2 and 3.

#define BLOCKS
#include "common.glsl"
#include "blocks.glsl"

void main() {
    uint e = thread_id();
    if (e >= nelem(0u)) return;
    uvec4 i = unravel(e, 0u);
    uint k_len = ne(1u, 0u);
    uint wrow, brow;
    if (pu(0u) == 0u) {
        uint r2 = ne(2u, 2u) / ne(1u, 2u), r3 = ne(2u, 3u) / ne(1u, 3u);
        wrow = row_off(1u, i.x, i.z / r2, i.w / r3);
        brow = row_off(2u, i.y, i.z, i.w);
    } else {
        // dst [M, n_used, T]: expert ids[u, t]; activations b[:, u % B1, t].
        int ex = load_i32(3u, uvec4(i.y, i.z, 0u, 0u));
        if (ex < 0 || uint(ex) >= ne(1u, 2u)) return;
        wrow = row_off(1u, i.x, uint(ex), 0u);
        brow = row_off(2u, i.y % ne(2u, 1u), i.z, 0u);
    }
    float acc = 0.0;
    for (uint k = 0u; k < k_len; k++) acc += load_row_elem(1u, wrow, k) * load_scalar_elem(2u, brow, k);
    store(0u, i, acc);
}
