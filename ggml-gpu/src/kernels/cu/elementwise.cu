// Element-wise kernels: unary functions, scale and clamp (k_unary), broadcasting binary ops
// (k_binary), gated linear units (k_glu), per-expert bias (k_add_id) and chains of the unary and
// binary steps (k_eltwise_chain). One thread per result element; every operand is read through its
// strides, so non-contiguous views work. The `_rows` variants are the fast paths for row-contiguous
// float operands: one thread per chunk of 1 or 4 elements of a row (`vec`), 32-bit index
// arithmetic, vector loads and stores.

#define U_SILU 0
#define U_GELU 1
#define U_GELU_ERF 2
#define U_TANH 3
#define U_EXP 4
#define U_SIGMOID 5
#define U_NEG 6
#define U_RELU 7
#define U_SQR 8
#define U_SQRT 9
#define U_SCALE 10
#define U_CLAMP 11
#define U_SOFTPLUS 12

__device__ __forceinline__ float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * x * (1.0f + 0.044715f * x * x)));
}
__device__ __forceinline__ float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ float unary_fn(int op, float x, float p0, float p1) {
    switch (op) {
    case U_SILU: return x / (1.0f + expf(-x));
    case U_GELU: return gelu_tanh(x);
    case U_GELU_ERF: return gelu_erf(x);
    case U_TANH: return tanhf(x);
    case U_EXP: return expf(x);
    case U_SIGMOID: return sigmoid(x);
    case U_NEG: return -x;
    case U_RELU: return fmaxf(x, 0.0f);
    case U_SQR: return x * x;
    case U_SQRT: return sqrtf(x);
    case U_SCALE: return x * p0 + p1;
    case U_CLAMP: return fminf(fmaxf(x, p0), p1);
    case U_SOFTPLUS: return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x)));
    }
    return x;
}

extern "C" __global__ void k_unary(TD a, TD d, int op, float p0, float p1) { GRID_DEPENDENCY_SYNC();
    i64 n = nelem(d);
    GRID_LOOP(l, n) {
        i64 i[4];
        unravel(l, d.ne, i);
        store(d, i[0], i[1], i[2], i[3], unary_fn(op, load(a, i[0], i[1], i[2], i[3]), p0, p1));
    }
}

__device__ __forceinline__ float binary_fn(int op, float x, float y) {
    return op == 0 ? x + y : op == 1 ? x - y : op == 2 ? x * y : x / y;
}

extern "C" __global__ void k_binary(TD a, TD b, TD d, int op) { GRID_DEPENDENCY_SYNC();
    i64 n = nelem(d);
    GRID_LOOP(l, n) {
        i64 i[4];
        unravel(l, d.ne, i);
        float x = load(a, i[0], i[1], i[2], i[3]);
        float y = load(b, i[0] % b.ne[0], i[1] % b.ne[1], i[2] % b.ne[2], i[3] % b.ne[3]);
        store(d, i[0], i[1], i[2], i[3], binary_fn(op, x, y));
    }
}

#define G_SWIGLU 0
#define G_GEGLU 1
#define G_GEGLU_ERF 2
#define G_SWIGLU_OAI 3

__device__ __forceinline__ float glu_fn(int op, float g, float u, float alpha, float limit) {
    switch (op) {
    case G_SWIGLU: return g / (1.0f + expf(-g)) * u;
    case G_GEGLU: return gelu_tanh(g) * u;
    case G_GEGLU_ERF: return gelu_erf(g) * u;
    }
    float gg = fminf(g, limit);
    float uu = fminf(fmaxf(u, -limit), limit);
    return gg * sigmoid(alpha * gg) * (uu + 1.0f);
}

extern "C" __global__ void k_glu(TD a, TD b, TD d, int op, int fused, int swapped, float alpha, float limit) { GRID_DEPENDENCY_SYNC();
    i64 n = nelem(d);
    i64 n0 = d.ne[0];
    GRID_LOOP(l, n) {
        i64 i[4];
        unravel(l, d.ne, i);
        float g, u;
        if (fused) {
            i64 gi = swapped ? i[0] + n0 : i[0];
            i64 ui = swapped ? i[0] : i[0] + n0;
            g = load(a, gi, i[1], i[2], i[3]);
            u = load(a, ui, i[1], i[2], i[3]);
        } else {
            g = load(a, i[0], i[1], i[2], i[3]);
            u = load(b, i[0], i[1], i[2], i[3]);
        }
        store(d, i[0], i[1], i[2], i[3], glu_fn(op, g, u, alpha, limit));
    }
}

extern "C" __global__ void k_add_id(TD a, TD b, TD ids, TD d) { GRID_DEPENDENCY_SYNC();
    i64 n = nelem(d);
    GRID_LOOP(l, n) {
        i64 i[4];
        unravel(l, d.ne, i);
        int e = load_i32(ids, i[1], i[2], 0, 0);
        float y = (e >= 0 && e < b.ne[1]) ? load(b, i[0], e, 0, 0) : __int_as_float(0x7fc00000);
        store(d, i[0], i[1], i[2], i[3], load(a, i[0], i[1], i[2], i[3]) + y);
    }
}

template <int V> __device__ void unary_rows(const TD& a, const TD& d, int op, float p0, float p1) {
    const u32 cpr = (u32)d.ne[0] / V;
    CHUNK_LOOP(c, cpr * nrows32(d)) {
        u32 i[3];
        u32 k = chunk_row(c, cpr, d, i) * V;
        float v[V];
        ld_row<V>(row_at(a, i), a.type, k, v);
        for (int j = 0; j < V; j++) v[j] = unary_fn(op, v[j], p0, p1);
        st_row<V>(row_at(d, i), d.type, k, v);
    }
}

extern "C" __global__ void k_unary_rows(TD a, TD d, int op, float p0, float p1, int vec) { GRID_DEPENDENCY_SYNC();
    if (vec == 4) unary_rows<4>(a, d, op, p0, p1);
    else unary_rows<1>(a, d, op, p0, p1);
}

// b's rows are as long as d's and broadcast over d's rows.
template <int V> __device__ void binary_rows(const TD& a, const TD& b, const TD& d, int op) {
    const u32 cpr = (u32)d.ne[0] / V;
    CHUNK_LOOP(c, cpr * nrows32(d)) {
        u32 i[3];
        u32 k = chunk_row(c, cpr, d, i) * V;
        float x[V], y[V];
        ld_row<V>(row_at(a, i), a.type, k, x);
        ld_row<V>(row_bcast(b, i), b.type, k, y);
        for (int j = 0; j < V; j++) x[j] = binary_fn(op, x[j], y[j]);
        st_row<V>(row_at(d, i), d.type, k, x);
    }
}

extern "C" __global__ void k_binary_rows(TD a, TD b, TD d, int op, int vec) { GRID_DEPENDENCY_SYNC();
    if (vec == 4) binary_rows<4>(a, b, d, op);
    else binary_rows<1>(a, b, d, op);
}

template <int V>
__device__ void glu_rows(const TD& a, const TD& b, const TD& d, int op, int fused, int swapped, float alpha,
                         float limit) {
    const u32 n0 = (u32)d.ne[0], cpr = n0 / V;
    CHUNK_LOOP(c, cpr * nrows32(d)) {
        u32 i[3];
        u32 k = chunk_row(c, cpr, d, i) * V;
        float g[V], u[V];
        if (fused) {
            const u8* row = row_at(a, i);
            ld_row<V>(row, a.type, swapped ? k + n0 : k, g);
            ld_row<V>(row, a.type, swapped ? k : k + n0, u);
        } else {
            ld_row<V>(row_at(a, i), a.type, k, g);
            ld_row<V>(row_at(b, i), b.type, k, u);
        }
        for (int j = 0; j < V; j++) g[j] = glu_fn(op, g[j], u[j], alpha, limit);
        st_row<V>(row_at(d, i), d.type, k, g);
    }
}

extern "C" __global__ void k_glu_rows(TD a, TD b, TD d, int op, int fused, int swapped, float alpha, float limit,
                                      int vec) { GRID_DEPENDENCY_SYNC();
    if (vec == 4) glu_rows<4>(a, b, d, op, fused, swapped, alpha, limit);
    else glu_rows<1>(a, b, d, op, fused, swapped, alpha, limit);
}

// Step code of k_eltwise_chain: the kind (high byte) and the op (U_* of unary_fn, or binary_fn's).
#define STEP_UNARY 0
#define STEP_X_OP_OTHER 1
#define STEP_OTHER_OP_X 2

// x after one step of k_eltwise_chain at element i: unary_fn(x), x op other or other op x (other
// read as k_binary reads its operands: broadcast when it is the second one, whole when the first).
__device__ __forceinline__ float chain_step(int code, float p0, float p1, const TD& o, const i64* i, float x) {
    const int kind = code >> 8, op = code & 0xFF;
    if (kind == STEP_UNARY) return unary_fn(op, x, p0, p1);
    if (kind == STEP_X_OP_OTHER)
        return binary_fn(op, x, load(o, i[0] % o.ne[0], i[1] % o.ne[1], i[2] % o.ne[2], i[3] % o.ne[3]));
    return binary_fn(op, load(o, i[0], i[1], i[2], i[3]), x);
}

// A chain of 2 or 3 element-wise F32 nodes of one shape, each taking the one before it (the
// dispatch's fusion of adjacent unary / scale / clamp / binary nodes): x = a's element, then per step
// s x = chain_step(code_s, x) written to d_s. Each step is the function its own kernel applies, so
// every result is bit-equal to the unfused nodes'.
extern "C" __global__ void k_eltwise_chain(TD a, TD o0, TD d0, TD o1, TD d1, TD o2, TD d2, int steps, int code0,
                                           int code1, int code2, float p00, float p01, float p10, float p11,
                                           float p20, float p21) { GRID_DEPENDENCY_SYNC();
    GRID_LOOP(l, nelem(d0)) {
        i64 i[4];
        unravel(l, d0.ne, i);
        float x = chain_step(code0, p00, p01, o0, i, load(a, i[0], i[1], i[2], i[3]));
        store(d0, i[0], i[1], i[2], i[3], x);
        x = chain_step(code1, p10, p11, o1, i, x);
        store(d1, i[0], i[1], i[2], i[3], x);
        if (steps > 2) {
            x = chain_step(code2, p20, p21, o2, i, x);
            store(d2, i[0], i[1], i[2], i[3], x);
        }
    }
}
