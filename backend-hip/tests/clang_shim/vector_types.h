// Vector types and their make_ functions for the clang syntax check's shims (CUDA's vector_types.h;
// HIP's HIP_vector_type has the same members), included by hiprtc_builtins.h and nvrtc_builtins.h.
#pragma once
#define __SHIM_VECTOR2(name, type, align)                                                     \
    struct __attribute__((aligned(align))) name {                                            \
        type x, y;                                                                           \
    };                                                                                       \
    __device__ inline name make_##name(type x, type y) { return name{x, y}; }
#define __SHIM_VECTOR4(name, type, align)                                                     \
    struct __attribute__((aligned(align))) name {                                            \
        type x, y, z, w;                                                                     \
    };                                                                                       \
    __device__ inline name make_##name(type x, type y, type z, type w) { return name{x, y, z, w}; }
__SHIM_VECTOR2(int2, int, 8)
__SHIM_VECTOR2(uint2, unsigned, 8)
__SHIM_VECTOR2(float2, float, 8)
__SHIM_VECTOR4(int4, int, 16)
__SHIM_VECTOR4(uint4, unsigned, 16)
__SHIM_VECTOR4(float4, float, 16)
