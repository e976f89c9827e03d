// Block formats for shaders that read quantized tensors: `#define BLOCKS` before
// `#include "common.glsl"`, then `#include "blocks.glsl"`. Legacy 32-element blocks (Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0), MXFP4 and the 256-element K-quants (Q4_K, Q5_K, Q6_K), read eight elements at
// a time (`load8`): each block's scales once per eight values, the quants as two 32-bit words.

// The 8 bytes at byte offset o of slot b (any alignment; words past the last byte are not read).
uvec2 rd8x8(uint b, uint o) {
    uint i = o >> 2, s = (o & 3u) * 8u;
    uint w0 = bw[b].w[i], w1 = bw[b].w[i + 1u];
    if (s == 0u) return uvec2(w0, w1);
    uint w2 = bw[b].w[i + 2u];
    return uvec2((w0 >> s) | (w1 << (32u - s)), (w1 >> s) | (w2 << (32u - s)));
}
// Byte k (0..7) of 8 bytes from rd8x8, shifted right by `shift` bits.
uint byte_at(uvec2 v, uint k, uint shift) { return (v[k >> 2] >> ((k & 3u) * 8u + shift)) & 0xFFu; }

// Elements j..j+7 (j a multiple of 8) of the 256-element K-quant block at byte `blk` of slot t.
void load8_k(uint t, uint ty, uint blk, uint j, out float w[8]) {
    if (ty == T_Q6_K) {
        // ql[128], qh[64], scales[16] (int8), d; element 128h + 32k + l.
        uint h = j >> 7, k = (j >> 5) & 3u, l = j & 31u;
        uvec2 lo = rd8x8(t, blk + 64u * h + 32u * (k & 1u) + l);
        uvec2 hi = rd8x8(t, blk + 128u + 32u * h + l);
        float sc = float(int(rd8(t, blk + 192u + (j >> 4)) << 24) >> 24);
        float d = f16_to_f(rd16(t, blk + 208u)) * sc;
        [[unroll]] for (uint e = 0u; e < 8u; e++) {
            uint q = (byte_at(lo, e, 4u * (k >> 1)) & 15u) | ((byte_at(hi, e, 2u * k) & 3u) << 4);
            w[e] = d * float(int(q) - 32);
        }
        return;
    }
    // d, dmin, scales[12] (six-bit scale and min per 32 elements), Q5_K: qh[32], qs[128].
    uint s = j >> 5;
    uint sc, m;
    if (s < 4u) {
        sc = rd8(t, blk + 4u + s) & 63u;
        m = rd8(t, blk + 8u + s) & 63u;
    } else {
        uint b = rd8(t, blk + 8u + s);
        sc = (b & 15u) | ((rd8(t, blk + s) >> 6) << 4);
        m = (b >> 4) | ((rd8(t, blk + 4u + s) >> 6) << 4);
    }
    float d = f16_to_f(rd16(t, blk)) * float(sc);
    float dm = f16_to_f(rd16(t, blk + 2u)) * float(m);
    uvec2 qs = rd8x8(t, blk + (ty == T_Q4_K ? 16u : 48u) + 32u * (j >> 6) + (j & 31u));
    uint shift = (s & 1u) * 4u;
    uvec2 qh = ty == T_Q5_K ? rd8x8(t, blk + 16u + (j & 31u)) : uvec2(0u);
    [[unroll]] for (uint e = 0u; e < 8u; e++) {
        uint q = (byte_at(qs, e, shift) & 15u) | (((byte_at(qh, e, 0u) >> s) & 1u) << 4);
        w[e] = d * float(q) - dm;
    }
}

// Elements i0..i0+7 (i0 a multiple of 8, inside the row) of the row of slot t that starts at byte
// `row`, any loadable type.
void load8(uint t, uint row, uint i0, out float w[8]) {
    uint ty = ttype(t);
    if (ty < T_Q4_0) {
        // Dense rows whose piece starts 16-byte aligned: one or two 16-byte loads.
        uint bytes = type_bytes(ty), o = row + i0 * bytes;
        if (ty != T_I32 && nb(t, 0u) == bytes && (o & 15u) == 0u) {
            uvec4 a = bq[t].q[o >> 4];
            if (ty == T_F32) {
                uvec4 b = bq[t].q[(o >> 4) + 1u];
                w = float[8](uintBitsToFloat(a.x), uintBitsToFloat(a.y), uintBitsToFloat(a.z),
                             uintBitsToFloat(a.w), uintBitsToFloat(b.x), uintBitsToFloat(b.y),
                             uintBitsToFloat(b.z), uintBitsToFloat(b.w));
            } else {
                [[unroll]] for (uint e = 0u; e < 8u; e++) {
                    uint h = (a[e >> 1] >> (16u * (e & 1u))) & 0xFFFFu;
                    w[e] = ty == T_F16 ? f16_to_f(h) : bf16_to_f(h);
                }
            }
            return;
        }
        [[unroll]] for (uint e = 0u; e < 8u; e++) w[e] = load_scalar_elem(t, row, i0 + e);
        return;
    }
    uint nb0 = nb(t, 0u);
    if (ty >= T_Q4_K && ty <= T_Q6_K) {
        load8_k(t, ty, row + (i0 >> 8) * nb0, i0 & 255u, w);
        return;
    }
    uint blk = row + (i0 >> 5) * nb0;
    uint j = i0 & 31u;
    if (ty == T_Q8_0) {
        float d = f16_to_f(rd16(t, blk));
        uvec2 q = rd8x8(t, blk + 2u + j);
        [[unroll]] for (uint e = 0u; e < 8u; e++) w[e] = d * float(int(byte_at(q, e, 0u) << 24) >> 24);
        return;
    }
    // 4-bit quants: element j < 16 in the low nibble of byte j, j >= 16 in the high nibble of j - 16.
    uint shift = j < 16u ? 0u : 4u;
    if (ty == T_MXFP4) {
        const float values[16] = float[16](0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0,
                                           0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0);
        uint x = rd8(t, blk);
        float scale = uintBitsToFloat(x < 2u ? 0x00200000u << x : (x - 1u) << 23);
        uvec2 q = rd8x8(t, blk + 1u + (j & 15u));
        [[unroll]] for (uint e = 0u; e < 8u; e++) w[e] = scale * values[byte_at(q, e, shift) & 15u];
        return;
    }
    float d = f16_to_f(rd16(t, blk));
    uint qo = ty == T_Q4_0 ? 2u : (ty == T_Q4_1 ? 4u : (ty == T_Q5_0 ? 6u : 8u));
    uvec2 q = rd8x8(t, blk + qo + (j & 15u));
    // Q5: the fifth bits of the block's 32 elements in one 32-bit word.
    uint qh = (ty == T_Q5_0 || ty == T_Q5_1) ? rd32_2(t, blk + (ty == T_Q5_0 ? 2u : 4u)) >> j : 0u;
    float offset = ty == T_Q4_0 ? -8.0 * d : (ty == T_Q5_0 ? -16.0 * d : 0.0);
    if (ty == T_Q4_1 || ty == T_Q5_1) offset = f16_to_f(rd16(t, blk + 2u));
    [[unroll]] for (uint e = 0u; e < 8u; e++) {
        uint v = (byte_at(q, e, shift) & 15u) | (((qh >> e) & 1u) << 4);
        w[e] = d * float(v) + offset;
    }
}

// Element i0 of the block-typed row of slot t that starts at byte `row` (one value of `load8`).
float load_block_elem(uint t, uint ty, uint row, uint i0) {
    float w[8];
    load8(t, row, i0 & ~7u, w);
    return w[i0 & 7u];
}
