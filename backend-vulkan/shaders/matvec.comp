// mul_mat by dot products of weight rows, for few activation columns (and every mul_mat on CPU
// devices) and mul_mat_id: each weight row with up to MAX_COLS activation columns of its
// destination batch at once (mul_mat, pu(0) = 0: dot-product rows (m, column chunk, batch)), or with
// one activation row per used expert and token (mul_mat_id, pu(0) = 1: rows (m, expert slot,
// token)). A workgroup takes pu(1) consecutive dot-product rows. FAST: one subgroup per row, reduced
// with subgroupAdd (no barriers); base: the whole workgroup per row, reduced in shared memory. The
// lanes take eight-element pieces of the row in turn (`load8`: scales once per piece). Slot 1 =
// weights, slot 2 = activations, slot 3 = I32 expert ids. mul_mat broadcasts the weights over
// activation dims 2 and 3.
// @specialize WTYPE F32 F16 BF16 Q4_0 Q8_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K MXFP4

#define BLOCKS
#include "common.glsl"
#include "blocks.glsl"

#define MAX_COLS 8u

void main() {
    uint m_len = ne(0u, 0u), k_len = ne(1u, 0u);
    bool by_id = pu(0u) != 0u;
    uint chunks = by_id ? 1u : (ne(0u, 1u) + MAX_COLS - 1u) / MAX_COLS;
    uint rows = m_len * chunks * (by_id ? ne(0u, 1u) * ne(0u, 2u) : ne(0u, 2u) * ne(0u, 3u));
    uint per_group = pu(1u);
#ifdef FAST
    uint lane = gl_SubgroupInvocationID, lanes = min(gl_SubgroupSize, WG);
    uint first = gl_SubgroupID, step = gl_NumSubgroups;
#else
    uint lane = gl_LocalInvocationID.x, lanes = WG, first = 0u, step = 1u;
#endif
    for (uint r = first; r < per_group; r += step) {
        uint g = group_id() * per_group + r;
        if (g >= rows) break;
        uint m = g % m_len;
        g /= m_len;
        uint wrow, ncols;
        uint brow[MAX_COLS];
        uvec4 di;
        if (!by_id) {
            uint c0 = (g % chunks) * MAX_COLS;
            g /= chunks;
            uint i2 = g % ne(0u, 2u), i3 = g / ne(0u, 2u);
            uint r2 = ne(2u, 2u) / ne(1u, 2u), r3 = ne(2u, 3u) / ne(1u, 3u);
            wrow = row_off(1u, m, i2 / r2, i3 / r3);
            ncols = min(MAX_COLS, ne(0u, 1u) - c0);
            [[unroll]] for (uint c = 0u; c < MAX_COLS; c++) {
                brow[c] = row_off(2u, c0 + min(c, ncols - 1u), i2, i3);
            }
            di = uvec4(m, c0, i2, i3);
        } else {
            // dst [M, n_used, T]: expert ids[u, t]; activations b[:, u % B1, t].
            uint u = g % ne(0u, 1u), tk = g / ne(0u, 1u);
            int ex = load_i32(3u, uvec4(u, tk, 0u, 0u));
            if (ex < 0 || uint(ex) >= ne(1u, 2u)) continue;
            wrow = row_off(1u, m, uint(ex), 0u);
            ncols = 1u;
            brow[0] = row_off(2u, u % ne(2u, 1u), tk, 0u);
            di = uvec4(m, u, tk, 0u);
        }
        float acc[MAX_COLS];
        [[unroll]] for (uint c = 0u; c < MAX_COLS; c++) acc[c] = 0.0;
        uint k8 = k_len & ~7u;
        for (uint k = lane * 8u; k < k8; k += lanes * 8u) {
            float w[8], x[8];
            load8(1u, wrow, k, w);
            [[unroll]] for (uint c = 0u; c < MAX_COLS; c++) {
                if (c < ncols) {
                    load8(2u, brow[c], k, x);
                    [[unroll]] for (uint e = 0u; e < 8u; e++) acc[c] += w[e] * x[e];
                }
            }
        }
        // Rows of scalar types need not be whole pieces of eight.
        for (uint k = k8 + lane; k < k_len; k += lanes) {
            float w = load_row_elem(1u, wrow, k);
            [[unroll]] for (uint c = 0u; c < MAX_COLS; c++) {
                if (c < ncols) acc[c] += w * load_scalar_elem(2u, brow[c], k);
            }
        }
        [[unroll]] for (uint c = 0u; c < MAX_COLS; c++) {
            if (c < ncols) {
#ifdef FAST
                float s = subgroupAdd(acc[c]);
#else
                float s = wg_sum(acc[c]);
#endif
                if (lane == 0u) store(0u, uvec4(di.x, di.y + c, di.z, di.w), s);
            }
        }
    }
}
