// One invocation per destination element (per source element for set_rows): binary ops with
// broadcast, scale, clamp, unary functions, gated linear units, scalar copies and conversions, concat,
// add_id and set_rows into scalar rows. Op code in pu(0).

#include "common.glsl"

#define OP_ADD 0u
#define OP_SUB 1u
#define OP_MUL 2u
#define OP_DIV 3u
#define OP_SCALE 4u
#define OP_CLAMP 5u
#define OP_UNARY 6u
#define OP_GLU 7u
#define OP_CPY 8u
#define OP_CONCAT 9u
#define OP_ADD_ID 10u
#define OP_SET_ROWS 12u

float erf_approx(float x) {
    float z = abs(x);
    float t = 1.0 / (1.0 + 0.5 * z);
    float poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418
        + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587
        + t * (-0.82215223 + t * 0.17087277))))))));
    float r = 1.0 - t * exp(poly);
    return x >= 0.0 ? r : -r;
}
float tanh_safe(float x) { return tanh(clamp(x, -15.0, 15.0)); }
float sigmoid(float x) { return 1.0 / (1.0 + exp(-x)); }
float gelu(float x) { return 0.5 * x * (1.0 + tanh_safe(0.7978846 * x * (1.0 + 0.044715 * x * x))); }
float gelu_erf(float x) { return 0.5 * x * (1.0 + erf_approx(x * 0.70710678)); }
float silu(float x) { return x / (1.0 + exp(-x)); }
// ln(1 + e^x) as max(x, 0) + ln(1 + u), u = e^-|x|; ln(1 + u) by its series where 1 + u rounds.
float softplus(float x) {
    float u = exp(-abs(x));
    return max(x, 0.0) + (u < 1e-4 ? u - 0.5 * u * u : log(1.0 + u));
}

float unary(uint u, float x) {
    switch (u) {
    case 0u: return silu(x);
    case 1u: return gelu(x);
    case 2u: return gelu_erf(x);
    case 3u: return tanh_safe(x);
    case 4u: return exp(x);
    case 5u: return sigmoid(x);
    case 6u: return -x;
    case 7u: return max(x, 0.0);
    case 8u: return x * x;
    case 9u: return sqrt(x);
    default: return softplus(x);
    }
}

float glu(uint g, float gate, float up) {
    switch (g) {
    case 0u: return silu(gate) * up;
    case 1u: return gelu(gate) * up;
    case 2u: return gelu_erf(gate) * up;
    default: {
        float alpha = pf(3u), limit = pf(4u);
        float gg = min(gate, limit);
        float uu = clamp(up, -limit, limit);
        return gg * sigmoid(alpha * gg) * (uu + 1.0);
    }
    }
}

void main() {
    uint op = pu(0u);
    uint e = thread_id();
    if (op == OP_SET_ROWS) {
        // slots: 0 = dst rows, 2 = F32 source, 3 = I32 ids broadcast over source dims 2 and 3.
        if (e >= nelem(2u)) return;
        uvec4 i = unravel(e, 2u);
        int row = load_i32(3u, uvec4(i.y, i.z % ne(3u, 1u), i.w % ne(3u, 2u), 0u));
        if (row < 0 || uint(row) >= ne(0u, 1u)) return;
        store(0u, uvec4(i.x, uint(row), i.z, i.w), load(2u, i));
        return;
    }
    if (e >= nelem(0u)) return;
    uvec4 i = unravel(e, 0u);
    float v;
    switch (op) {
    case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV: {
        float a = load(1u, i);
        float b = load(2u, i % uvec4(ne(2u, 0u), ne(2u, 1u), ne(2u, 2u), ne(2u, 3u)));
        v = op == OP_ADD ? a + b : (op == OP_SUB ? a - b : (op == OP_MUL ? a * b : a / b));
        break;
    }
    case OP_SCALE: v = load(1u, i) * pf(1u) + pf(2u); break;
    case OP_CLAMP: v = min(max(load(1u, i), pf(1u)), pf(2u)); break;
    case OP_UNARY: v = unary(pu(1u), load(1u, i)); break;
    case OP_GLU: {
        float gate, up;
        if (pu(5u) != 0u) {
            uint n = ne(0u, 0u);
            uint gi = pu(2u) != 0u ? i.x + n : i.x;
            uint ui = pu(2u) != 0u ? i.x : i.x + n;
            gate = load(1u, uvec4(gi, i.yzw));
            up = load(1u, uvec4(ui, i.yzw));
        } else {
            gate = load(1u, i);
            up = load(2u, i);
        }
        v = glu(pu(1u), gate, up);
        break;
    }
    case OP_CPY: {
        uvec4 si = unravel(e, 1u);
        if (ttype(1u) == ttype(0u)) {
            copy_raw(0u, elem_off(0u, i), 1u, elem_off(1u, si));
            return;
        }
        v = load(1u, si);
        break;
    }
    case OP_CONCAT: {
        uint dim = pu(1u);
        uint na = ne(1u, dim);
        uint src = i[dim] < na ? 1u : 2u;
        uvec4 si = i;
        if (src == 2u) si[dim] -= na;
        copy_raw(0u, elem_off(0u, i), src, elem_off(src, si));
        return;
    }
    case OP_ADD_ID: {
        int row = load_i32(3u, uvec4(i.y, i.z, 0u, 0u));
        if (row < 0 || uint(row) >= ne(2u, 1u)) return;
        v = load(1u, i) + load(2u, uvec4(i.x, uint(row), 0u, 0u));
        break;
    }
    default: return;
    }
    store(0u, i, v);
}
