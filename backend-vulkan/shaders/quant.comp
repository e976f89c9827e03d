// One invocation per destination block: quantizes F32/F16/BF16 values to Q8_0 or Q4_0 (32-value
// blocks) with ggml's reference quantizers. pu(0) = 0: cpy/cont (source slot 1 read in flat ggml order);
// 1: set_rows (source rows in slot 2, I32 ids in slot 3, broadcast over source dims 2 and 3);
// 2: cpy/cont between tensors of one block type, copying blocks bit for bit (pu(1) = block bytes,
// pu(2) = block elements; 16-bit words when the block size is even, else bytes).

#include "common.glsl"

void main() {
    uint mode = pu(0u);
    if (mode == 2u) {
        uint bytes = pu(1u), elems = pu(2u);
        uint b = thread_id();
        if (b >= nelem(0u) / elems) return;
        uvec4 di = unravel(b * elems, 0u);
        uvec4 si = unravel(b * elems, 1u);
        uint d = row_off(0u, di.y, di.z, di.w) + (di.x / elems) * nb(0u, 0u);
        uint s = row_off(1u, si.y, si.z, si.w) + (si.x / elems) * nb(1u, 0u);
        if ((bytes & 1u) == 0u) {
            for (uint k = 0u; k < bytes; k += 2u) st16(0u, d + k, rd16(1u, s + k));
        } else {
            for (uint k = 0u; k < bytes; k++) st8(0u, d + k, rd8(1u, s + k));
        }
        return;
    }
    uint src = mode == 0u ? 1u : 2u;
    uint blocks = (mode == 0u ? nelem(0u) : nelem(2u)) / 32u;
    uint b = thread_id();
    if (b >= blocks) return;
    uint e0 = b * 32u;
    uint dst_off;
    float x[32];
    if (mode == 0u) {
        uvec4 di = unravel(e0, 0u);
        dst_off = row_off(0u, di.y, di.z, di.w) + (di.x >> 5) * nb(0u, 0u);
        for (uint k = 0u; k < 32u; k++) x[k] = load(1u, unravel(e0 + k, 1u));
    } else {
        uvec4 si = unravel(e0, 2u);
        int row = load_i32(3u, uvec4(si.y, si.z % ne(3u, 1u), si.w % ne(3u, 2u), 0u));
        if (row < 0 || uint(row) >= ne(0u, 1u)) return;
        dst_off = row_off(0u, uint(row), si.z, si.w) + (si.x >> 5) * nb(0u, 0u);
        uint r = row_off(2u, si.y, si.z, si.w);
        for (uint k = 0u; k < 32u; k++) x[k] = load_row_elem(2u, r, si.x + k);
    }
    if (ttype(0u) == T_Q8_0) {
        float amax = 0.0;
        [[unroll]] for (uint k = 0u; k < 32u; k++) amax = max(amax, abs(x[k]));
        float d = amax / 127.0;
        float id = d != 0.0 ? 1.0 / d : 0.0;
        st16(0u, dst_off, f_to_f16(d));
        [[unroll]] for (uint k = 0u; k < 32u; k += 2u) {
            float a = x[k] * id, c = x[k + 1u] * id;
            int qa = int(clamp(sign(a) * floor(abs(a) + 0.5), -128.0, 127.0));
            int qc = int(clamp(sign(c) * floor(abs(c) + 0.5), -128.0, 127.0));
            st16(0u, dst_off + 2u + k, (uint(qa) & 0xFFu) | ((uint(qc) & 0xFFu) << 8));
        }
    } else {
        float amax = 0.0, mx = 0.0;
        [[unroll]] for (uint k = 0u; k < 32u; k++) {
            if (amax < abs(x[k])) { amax = abs(x[k]); mx = x[k]; }
        }
        float d = mx / -8.0;
        float id = d != 0.0 ? 1.0 / d : 0.0;
        st16(0u, dst_off, f_to_f16(d));
        [[unroll]] for (uint k = 0u; k < 16u; k += 2u) {
            uint q[4];
            [[unroll]] for (uint m = 0u; m < 2u; m++) {
                q[2u * m] = uint(clamp(trunc(x[k + m] * id + 8.5), 0.0, 15.0));
                q[2u * m + 1u] = uint(clamp(trunc(x[k + m + 16u] * id + 8.5), 0.0, 15.0));
            }
            uint lo = q[0] | (q[1] << 4);
            uint hi = q[2] | (q[3] << 4);
            st16(0u, dst_off + 2u + k, lo | (hi << 8));
        }
    }
}
