// mul_mat in 32x32 output tiles, one workgroup per tile and destination batch: each K chunk of 32
// is dequantized once into shared memory (32 weight rows, 32 activation rows, eight values per
// `load8`) and each invocation accumulates a 4x4 sub-tile (rows lm + 8i, columns ln + 8j). Slots as
// in matvec.comp; used on GPUs when the activations have more columns than matvec.comp takes.
// @specialize WTYPE F32 F16 BF16 Q4_0 Q8_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K MXFP4

#define BLOCKS
#include "common.glsl"
#include "blocks.glsl"

#define T 32u
#define TK 32u
#define STRIDE 33u
shared float ta[T * STRIDE];
shared float tb[T * STRIDE];

// Loads rows row0.. of a T x TK chunk from k0 of slot s into `tile` (zeros past n_rows and k_len).
void load_chunk(uint s, uint row0, uint n_rows, uint k0, uint k_len, uint i2, uint i3, bool weights) {
    for (uint p = gl_LocalInvocationID.x; p < T * TK / 8u; p += WG) {
        uint r = p / (TK / 8u), kk = (p % (TK / 8u)) * 8u;
        float v[8];
        if (row0 + r >= n_rows) {
            [[unroll]] for (uint e = 0u; e < 8u; e++) v[e] = 0.0;
        } else {
            uint row = row_off(s, row0 + r, i2, i3);
            if (k0 + kk + 8u <= k_len) {
                load8(s, row, k0 + kk, v);
            } else {
                for (uint e = 0u; e < 8u; e++) {
                    v[e] = k0 + kk + e < k_len ? load_row_elem(s, row, k0 + kk + e) : 0.0;
                }
            }
        }
        [[unroll]] for (uint e = 0u; e < 8u; e++) {
            if (weights) ta[r * STRIDE + kk + e] = v[e];
            else tb[r * STRIDE + kk + e] = v[e];
        }
    }
}

void main() {
    uint m_len = ne(0u, 0u), n_len = ne(0u, 1u), k_len = ne(1u, 0u);
    uint tiles_m = (m_len + T - 1u) / T, tiles_n = (n_len + T - 1u) / T;
    uint g = group_id();
    if (g >= tiles_m * tiles_n * ne(0u, 2u) * ne(0u, 3u)) return;
    uint tm = g % tiles_m;
    g /= tiles_m;
    uint tn = g % tiles_n;
    g /= tiles_n;
    uint i2 = g % ne(0u, 2u), i3 = g / ne(0u, 2u);
    uint r2 = ne(2u, 2u) / ne(1u, 2u), r3 = ne(2u, 3u) / ne(1u, 3u);
    uint l = gl_LocalInvocationID.x;
    uint lm = l % 8u, ln = l / 8u;

    float acc[4][4];
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        [[unroll]] for (uint j = 0u; j < 4u; j++) acc[i][j] = 0.0;
    }
    for (uint k0 = 0u; k0 < k_len; k0 += TK) {
        load_chunk(1u, tm * T, m_len, k0, k_len, i2 / r2, i3 / r3, true);
        load_chunk(2u, tn * T, n_len, k0, k_len, i2, i3, false);
        barrier();
        for (uint c = 0u; c < TK; c++) {
            float a[4], b[4];
            [[unroll]] for (uint i = 0u; i < 4u; i++) a[i] = ta[(lm + 8u * i) * STRIDE + c];
            [[unroll]] for (uint j = 0u; j < 4u; j++) b[j] = tb[(ln + 8u * j) * STRIDE + c];
            [[unroll]] for (uint i = 0u; i < 4u; i++) {
                [[unroll]] for (uint j = 0u; j < 4u; j++) acc[i][j] += a[i] * b[j];
            }
        }
        barrier();
    }
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        [[unroll]] for (uint j = 0u; j < 4u; j++) {
            uint m = tm * T + lm + 8u * i, n = tn * T + ln + 8u * j;
            if (m < m_len && n < n_len) store(0u, uvec4(m, n, i2, i3), acc[i][j]);
        }
    }
}
