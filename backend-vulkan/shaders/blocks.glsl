// Block formats for shaders that read quantized tensors: `#define BLOCKS` before
// `#include "common.glsl"`, then `#include "blocks.glsl"`. Legacy 32-element blocks (Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0), MXFP4 and the 256-element K-quants (Q4_K, Q5_K, Q6_K).

// Element j of the 256-element K-quant block at byte `blk` of slot t (Q4_K, Q5_K, Q6_K).
float load_k_elem(uint t, uint ty, uint blk, uint j) {
    if (ty == T_Q6_K) {
        // ql[128], qh[64], scales[16] (int8), d; element 128h + 32k + l.
        uint h = j >> 7, k = (j >> 5) & 3u, l = j & 31u;
        uint lo = (rd8(t, blk + 64u * h + 32u * (k & 1u) + l) >> (4u * (k >> 1))) & 15u;
        uint hi = (rd8(t, blk + 128u + 32u * h + l) >> (2u * k)) & 3u;
        float sc = float(int(rd8(t, blk + 192u + (j >> 4)) << 24) >> 24);
        return f16_to_f(rd16(t, blk + 208u)) * sc * float(int(lo | (hi << 4)) - 32);
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
    uint qb = rd8(t, blk + (ty == T_Q4_K ? 16u : 48u) + 32u * (j >> 6) + (j & 31u));
    uint q = (s & 1u) == 0u ? (qb & 15u) : (qb >> 4);
    if (ty == T_Q5_K) q |= ((rd8(t, blk + 16u + (j & 31u)) >> s) & 1u) << 4;
    return f16_to_f(rd16(t, blk)) * float(sc) * float(q) - f16_to_f(rd16(t, blk + 2u)) * float(m);
}

// Element i0 of the block-typed row of slot t that starts at byte `row`.
float load_block_elem(uint t, uint ty, uint row, uint i0) {
    uint nb0 = nb(t, 0u);
    if (ty >= T_Q4_K && ty <= T_Q6_K) return load_k_elem(t, ty, row + (i0 >> 8) * nb0, i0 & 255u);
    uint blk = row + (i0 >> 5) * nb0;
    uint j = i0 & 31u;
    if (ty == T_MXFP4) {
        const float values[16] = float[16](0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0,
                                           0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0);
        uint e = rd8(t, blk);
        float scale = uintBitsToFloat(e < 2u ? 0x00200000u << e : (e - 1u) << 23);
        uint n = rd8(t, blk + 1u + (j & 15u));
        return scale * values[j < 16u ? (n & 15u) : (n >> 4)];
    }
    float d = f16_to_f(rd16(t, blk));
    if (ty == T_Q8_0) return d * float(int(rd8(t, blk + 2u + j) << 24) >> 24);
    uint qo = ty == T_Q4_0 ? 2u : (ty == T_Q4_1 ? 4u : (ty == T_Q5_0 ? 6u : 8u));
    uint q = rd8(t, blk + qo + (j & 15u));
    q = j < 16u ? (q & 15u) : (q >> 4);
    if (ty == T_Q4_0) return d * (float(q) - 8.0);
    if (ty == T_Q4_1) return d * float(q) + f16_to_f(rd16(t, blk + 2u));
    uint qh = rd32_2(t, blk + (ty == T_Q5_0 ? 2u : 4u));
    q |= ((qh >> j) & 1u) << 4;
    if (ty == T_Q5_0) return d * (float(q) - 16.0);
    return d * float(q) + f16_to_f(rd16(t, blk + 2u));
}
