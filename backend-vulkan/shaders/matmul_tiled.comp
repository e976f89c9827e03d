// mul_mat in 8x8 output tiles, one workgroup per tile and destination batch: each K chunk of 32 is
// dequantized once into shared memory (8 weight rows, 8 activation rows) and reused by the tile's 64
// invocations. Slots as in matmul.comp; used when the activations have several columns.

#define BLOCKS
#include "common.glsl"
#include "blocks.glsl"

#define TM 8u
#define TN 8u
#define TK 32u
shared float ta[TM * TK];
shared float tb[TN * TK];

void main() {
    uint m_len = ne(0u, 0u), n_len = ne(0u, 1u), k_len = ne(1u, 0u);
    uint tiles_m = (m_len + TM - 1u) / TM, tiles_n = (n_len + TN - 1u) / TN;
    uint g = group_id();
    if (g >= tiles_m * tiles_n * ne(0u, 2u) * ne(0u, 3u)) return;
    uint tm = g % tiles_m;
    g /= tiles_m;
    uint tn = g % tiles_n;
    g /= tiles_n;
    uint i2 = g % ne(0u, 2u), i3 = g / ne(0u, 2u);
    uint r2 = ne(2u, 2u) / ne(1u, 2u), r3 = ne(2u, 3u) / ne(1u, 3u);
    uint l = gl_LocalInvocationID.x;
    uint lm = l % TM, ln = l / TM;

    float acc = 0.0;
    for (uint k0 = 0u; k0 < k_len; k0 += TK) {
        for (uint q = l; q < TM * TK; q += WG) {
            uint r = q / TK, c = q % TK;
            uint m = tm * TM + r, k = k0 + c;
            ta[q] = (m < m_len && k < k_len)
                ? load_row_elem(1u, row_off(1u, m, i2 / r2, i3 / r3), k) : 0.0;
            uint n = tn * TN + r;
            tb[q] = (n < n_len && k < k_len)
                ? load_scalar_elem(2u, row_off(2u, n, i2, i3), k) : 0.0;
        }
        barrier();
        for (uint c = 0u; c < TK; c++) acc += ta[lm * TK + c] * tb[ln * TK + c];
        barrier();
    }
    uint m = tm * TM + lm, n = tn * TN + ln;
    if (m < m_len && n < n_len) store(0u, uvec4(m, n, i2, i3), acc);
}
