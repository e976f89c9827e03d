// Shared by every compute shader of backend-vulkan (`#include "common.glsl"`, expanded by build.rs
// after `#version` and the variant defines). FAST: 16-bit stores through GL_EXT_shader_16bit_storage and subgroup reductions;
// otherwise 16-bit stores use word atomics and reductions use shared memory only.
//
// Bindings: 0 = parameter words (read-only), 1 = array of SLOTS data buffers (slot 0 = destination,
// slots 1.. = sources), bound whole; tensors are addressed by byte offsets from the parameters.
// Parameter words: slot t at 10*t: type, byte offset, ne[4], nb[4]; op parameters from word 60.

#extension GL_EXT_control_flow_attributes : enable
#ifdef FAST
#extension GL_EXT_shader_16bit_storage : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif

#define WG 64u
#define SLOTS 6

#define T_F32 0u
#define T_F16 1u
#define T_BF16 2u
#define T_I32 3u
#define T_Q4_0 4u
#define T_Q8_0 5u
#define T_Q4_1 6u
#define T_Q5_0 7u
#define T_Q5_1 8u
#define T_Q4_K 9u
#define T_Q5_K 10u
#define T_Q6_K 11u
#define T_MXFP4 12u

layout(local_size_x = 64, local_size_y = 1, local_size_z = 1) in;

layout(std430, set = 0, binding = 0) readonly buffer Params { uint p[]; };
layout(std430, set = 0, binding = 1) buffer BufW { uint w[]; } bw[SLOTS];
// The same buffers as 16-byte words, for aligned runs of scalar values.
layout(std430, set = 0, binding = 1) readonly buffer BufQ { uvec4 q[]; } bq[SLOTS];
#ifdef FAST
layout(std430, set = 0, binding = 1) buffer BufH { uint16_t h[]; } bh[SLOTS];
#endif

// The type of slot t: from the parameters, or fixed at compile time for the weights (slot 1,
// WTYPE) and activations (slot 2, F32) of the type-specialized matrix shaders.
uint ttype(uint t) {
#ifdef WTYPE
    if (t == 1u) return WTYPE;
    if (t == 2u) return T_F32;
#endif
    return p[t * 10u];
}
uint toff(uint t) { return p[t * 10u + 1u]; }
uint ne(uint t, uint d) { return p[t * 10u + 2u + d]; }
uint nb(uint t, uint d) { return p[t * 10u + 6u + d]; }
uint pu(uint i) { return p[60u + i]; }
float pf(uint i) { return uintBitsToFloat(p[60u + i]); }
uint nelem(uint t) { return ne(t, 0u) * ne(t, 1u) * ne(t, 2u) * ne(t, 3u); }
uint nrows(uint t) { return ne(t, 1u) * ne(t, 2u) * ne(t, 3u); }

// Linear index of this workgroup over a 3-D grid, and of this invocation.
uint group_id() {
    return gl_WorkGroupID.x + gl_NumWorkGroups.x * (gl_WorkGroupID.y + gl_NumWorkGroups.y * gl_WorkGroupID.z);
}
uint thread_id() { return group_id() * WG + gl_LocalInvocationID.x; }

// Element index (i0, i1, i2, i3) of flat index i in slot t's shape.
uvec4 unravel(uint i, uint t) {
    uvec4 r;
    r.x = i % ne(t, 0u); i /= ne(t, 0u);
    r.y = i % ne(t, 1u); i /= ne(t, 1u);
    r.z = i % ne(t, 2u);
    r.w = i / ne(t, 2u);
    return r;
}
// Row index (i1, i2, i3) of flat row r in slot t's shape.
uvec3 unravel_row(uint r, uint t) {
    return uvec3(r % ne(t, 1u), (r / ne(t, 1u)) % ne(t, 2u), r / (ne(t, 1u) * ne(t, 2u)));
}

uint row_off(uint t, uint i1, uint i2, uint i3) {
    return toff(t) + i1 * nb(t, 1u) + i2 * nb(t, 2u) + i3 * nb(t, 3u);
}
uint elem_off(uint t, uvec4 i) { return row_off(t, i.y, i.z, i.w) + i.x * nb(t, 0u); }

uint rd8(uint b, uint o) { return (bw[b].w[o >> 2] >> ((o & 3u) * 8u)) & 0xFFu; }
uint rd16(uint b, uint o) { return (bw[b].w[o >> 2] >> ((o & 2u) * 8u)) & 0xFFFFu; }
uint rd32(uint b, uint o) { return bw[b].w[o >> 2]; }
// A 32-bit value at a 2-byte aligned offset (the qh words of Q5 blocks).
uint rd32_2(uint b, uint o) { return rd16(b, o) | (rd16(b, o + 2u) << 16); }

void st32(uint b, uint o, uint v) { bw[b].w[o >> 2] = v; }
void st16(uint b, uint o, uint v) {
#ifdef FAST
    bh[b].h[o >> 1] = uint16_t(v & 0xFFFFu);
#else
    uint s = (o & 2u) * 8u;
    atomicAnd(bw[b].w[o >> 2], ~(0xFFFFu << s));
    atomicOr(bw[b].w[o >> 2], (v & 0xFFFFu) << s);
#endif
}

// Stores one byte with word atomics (neighbouring bytes may belong to other invocations).
void st8(uint b, uint o, uint v) {
    uint s = (o & 3u) * 8u;
    atomicAnd(bw[b].w[o >> 2], ~(0xFFu << s));
    atomicOr(bw[b].w[o >> 2], (v & 0xFFu) << s);
}

float f16_to_f(uint h) { return unpackHalf2x16(h).x; }
uint f_to_f16(float v) { return packHalf2x16(vec2(v, 0.0)) & 0xFFFFu; }
float bf16_to_f(uint h) { return uintBitsToFloat(h << 16); }
uint f_to_bf16(float v) {
    uint u = floatBitsToUint(v);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u >> 16) | 0x40u;
    return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

// Element i0 of the scalar-typed (F32, F16, BF16, I32) row of slot t that starts at byte `row`.
float load_scalar_elem(uint t, uint row, uint i0) {
    uint ty = ttype(t);
    uint o = row + i0 * nb(t, 0u);
    if (ty == T_F32) return uintBitsToFloat(rd32(t, o));
    if (ty == T_F16) return f16_to_f(rd16(t, o));
    if (ty == T_BF16) return bf16_to_f(rd16(t, o));
    return float(int(rd32(t, o)));
}

#ifdef BLOCKS
float load_block_elem(uint t, uint ty, uint row, uint i0);
#endif

// Element i0 of the row of slot t that starts at byte `row`: scalar types, and block types in
// shaders compiled with BLOCKS (blocks.glsl).
float load_row_elem(uint t, uint row, uint i0) {
#ifdef BLOCKS
    uint ty = ttype(t);
    if (ty >= T_Q4_0) return load_block_elem(t, ty, row, i0);
#endif
    return load_scalar_elem(t, row, i0);
}
float load(uint t, uvec4 i) { return load_row_elem(t, row_off(t, i.y, i.z, i.w), i.x); }
int load_i32(uint t, uvec4 i) { return int(rd32(t, elem_off(t, i))); }

// Stores v at byte offset o of slot t (scalar types).
void store_at(uint t, uint o, float v) {
    uint ty = ttype(t);
    if (ty == T_F32) st32(t, o, floatBitsToUint(v));
    else if (ty == T_F16) st16(t, o, f_to_f16(v));
    else if (ty == T_BF16) st16(t, o, f_to_bf16(v));
    else st32(t, o, uint(int(v)));
}
void store(uint t, uvec4 i, float v) { store_at(t, elem_off(t, i), v); }

uint type_bytes(uint ty) { return (ty == T_F32 || ty == T_I32) ? 4u : 2u; }
// Copies one scalar element between slots of the same type, bit for bit.
void copy_raw(uint dt, uint dof, uint st, uint sof) {
    if (type_bytes(ttype(dt)) == 4u) st32(dt, dof, rd32(st, sof));
    else st16(dt, dof, rd16(st, sof));
}

shared float red_s[WG];

float wg_sum(float v) {
#ifdef FAST
    v = subgroupAdd(v);
    if (subgroupElect()) red_s[gl_SubgroupID] = v;
    barrier();
    float r = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; i++) r += red_s[i];
    barrier();
    return r;
#else
    uint l = gl_LocalInvocationID.x;
    red_s[l] = v;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (l < s) red_s[l] += red_s[l + s];
        barrier();
    }
    float r = red_s[0];
    barrier();
    return r;
#endif
}

float wg_max(float v) {
#ifdef FAST
    v = subgroupMax(v);
    if (subgroupElect()) red_s[gl_SubgroupID] = v;
    barrier();
    float r = red_s[0];
    for (uint i = 1u; i < gl_NumSubgroups; i++) r = max(r, red_s[i]);
    barrier();
    return r;
#else
    uint l = gl_LocalInvocationID.x;
    red_s[l] = v;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (l < s) red_s[l] = max(red_s[l], red_s[l + s]);
        barrier();
    }
    float r = red_s[0];
    barrier();
    return r;
#endif
}

// ALiBi slope of head h out of n_head (1 when max_bias <= 0), as in ggml.
float alibi_slope(float max_bias, uint h, uint n_head) {
    if (max_bias <= 0.0) return 1.0;
    uint l2 = 1u << uint(floor(log2(float(max(n_head, 1u)))));
    float m0 = exp2(-max_bias / float(l2));
    float m1 = exp2(-(max_bias / 2.0) / float(l2));
    return h < l2 ? pow(m0, float(h + 1u)) : pow(m1, float(2u * (h - l2) + 1u));
}
