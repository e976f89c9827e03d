// Stand-in for what hiprtc provides to every program without headers, on top of clang's own
// hiprtc-mode wrapper (`-D__HIPCC_RTC__ -include __clang_hip_runtime_wrapper.h`, which brings the
// attributes and the math functions): built-in variables, barriers, shuffles, bit casts, the
// cycle counter, byte permutes, atomics, launch bounds and vector types. Used only by the clang syntax check
// (tests/clang_syntax.rs); ROCm's real definitions differ in detail, not in what they accept.
#define __forceinline__ inline __attribute__((always_inline))
static constexpr int warpSize = __AMDGCN_WAVEFRONT_SIZE;

struct __shim_uint3 {
    unsigned x, y, z;
};
#define threadIdx \
    (__shim_uint3{__builtin_amdgcn_workitem_id_x(), __builtin_amdgcn_workitem_id_y(), __builtin_amdgcn_workitem_id_z()})
#define blockIdx \
    (__shim_uint3{__builtin_amdgcn_workgroup_id_x(), __builtin_amdgcn_workgroup_id_y(), __builtin_amdgcn_workgroup_id_z()})
#define blockDim                                                                                    \
    (__shim_uint3{__builtin_amdgcn_workgroup_size_x(), __builtin_amdgcn_workgroup_size_y(),        \
                  __builtin_amdgcn_workgroup_size_z()})
#define gridDim                                                                                    \
    (__shim_uint3{__builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x(),            \
                  __builtin_amdgcn_grid_size_y() / __builtin_amdgcn_workgroup_size_y(),            \
                  __builtin_amdgcn_grid_size_z() / __builtin_amdgcn_workgroup_size_z()})

__device__ inline void __syncthreads() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

__device__ inline float __int_as_float(int x) { return __builtin_bit_cast(float, x); }
__device__ inline float __uint_as_float(unsigned x) { return __builtin_bit_cast(float, x); }
__device__ inline int __float_as_int(float x) { return __builtin_bit_cast(int, x); }
__device__ inline unsigned __float_as_uint(float x) { return __builtin_bit_cast(unsigned, x); }

__device__ inline int __float2int_rn(float x) { return (int)__builtin_rintf(x); }

__device__ inline long long clock64() { return (long long)__builtin_readcyclecounter(); }

// Byte i of the result is byte (s >> 4i) & 7 of the eight bytes of x (0..3) and y (4..7).
__device__ inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    return r;
}

__device__ inline int __lane_id() { return __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u)); }

__device__ inline int __shim_bpermute(int lane, int v) { return __builtin_amdgcn_ds_bpermute(lane << 2, v); }
__device__ inline int __shfl_xor(int v, int mask, int width = warpSize) {
    int self = __lane_id();
    int lane = self ^ mask;
    return __shim_bpermute(lane >= ((self + width) & ~(width - 1)) ? self : lane, v);
}
__device__ inline int __shfl_down(int v, unsigned delta, int width = warpSize) {
    int self = __lane_id();
    int lane = (self & (width - 1)) + (int)delta >= width ? self : self + (int)delta;
    return __shim_bpermute(lane, v);
}
#define __SHIM_SHUFFLE_WIDE(name, offset_type)                                                     \
    __device__ inline unsigned name(unsigned v, offset_type o, int w = warpSize) {                 \
        return (unsigned)name((int)v, o, w);                                                       \
    }                                                                                              \
    __device__ inline float name(float v, offset_type o, int w = warpSize) {                       \
        return __int_as_float(name(__float_as_int(v), o, w));                                      \
    }                                                                                              \
    __device__ inline double name(double v, offset_type o, int w = warpSize) {                     \
        long long b = __builtin_bit_cast(long long, v);                                            \
        int lo = name((int)b, o, w), hi = name((int)(b >> 32), o, w);                              \
        return __builtin_bit_cast(double, ((long long)hi << 32) | (unsigned)lo);                   \
    }
__SHIM_SHUFFLE_WIDE(__shfl_xor, int)
__SHIM_SHUFFLE_WIDE(__shfl_down, unsigned)

__device__ inline int atomicAdd(int* p, int v) {
    return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
__device__ inline unsigned atomicAdd(unsigned* p, unsigned v) {
    return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
__device__ inline float atomicAdd(float* p, float v) {
    return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}

#define __SHIM_LB1(threads) __attribute__((amdgpu_flat_work_group_size(1, threads)))
#define __SHIM_LB2(threads, waves) \
    __attribute__((amdgpu_flat_work_group_size(1, threads), amdgpu_waves_per_eu(waves)))
#define __SHIM_LB_PICK(_1, _2, name, ...) name
#define __launch_bounds__(...) __SHIM_LB_PICK(__VA_ARGS__, __SHIM_LB2, __SHIM_LB1)(__VA_ARGS__)

#include "vector_types.h"
