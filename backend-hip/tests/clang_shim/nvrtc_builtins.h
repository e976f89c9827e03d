// Stand-in for what NVRTC provides to every program without headers: clang's CUDA headers that
// need no CUDA installation (built-in variables, bit casts, math), plus warp shuffles, the warp
// barrier, atomics, launch bounds and dp4a written over clang's NVVM builtins and PTX, and vector
// types. Used only by the clang syntax check (tests/clang_syntax.rs).
#define __host__ __attribute__((host))
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __shared__ __attribute__((shared))
#define __constant__ __attribute__((constant))
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __launch_bounds__(...) __attribute__((launch_bounds(__VA_ARGS__)))
#define CUDA_VERSION 12000
typedef __SIZE_TYPE__ size_t;
#define INT_MAX __INT_MAX__
#define INT_MIN (-__INT_MAX__ - 1)
#define HUGE_VAL __builtin_huge_val()
#define HUGE_VALF __builtin_huge_valf()
#include <__clang_cuda_builtin_vars.h>
#include <__clang_cuda_libdevice_declares.h>
#include <__clang_cuda_device_functions.h>
#include <__clang_cuda_math.h>

#define __SHIM_SHFL_SYNC(name, builtin, clamp)                                                     \
    __device__ inline int name(unsigned m, int v, int o, int w = 32) {                             \
        return builtin##_i32(m, v, o, ((32 - w) << 8) | clamp);                                    \
    }                                                                                              \
    __device__ inline unsigned name(unsigned m, unsigned v, int o, int w = 32) {                   \
        return (unsigned)name(m, (int)v, o, w);                                                    \
    }                                                                                              \
    __device__ inline float name(unsigned m, float v, int o, int w = 32) {                         \
        return builtin##_f32(m, v, o, ((32 - w) << 8) | clamp);                                    \
    }                                                                                              \
    __device__ inline double name(unsigned m, double v, int o, int w = 32) {                       \
        long long b = __double_as_longlong(v);                                                     \
        int lo = name(m, (int)b, o, w), hi = name(m, (int)(b >> 32), o, w);                        \
        return __longlong_as_double(((long long)hi << 32) | (unsigned)lo);                         \
    }
__SHIM_SHFL_SYNC(__shfl_xor_sync, __nvvm_shfl_sync_bfly, 0x1f)
__SHIM_SHFL_SYNC(__shfl_down_sync, __nvvm_shfl_sync_down, 0x1f)
__device__ inline void __syncwarp(unsigned m = 0xffffffffu) { __nvvm_bar_warp_sync(m); }

__device__ inline int atomicAdd(int* p, int v) { return __nvvm_atom_add_gen_i(p, v); }
__device__ inline unsigned atomicAdd(unsigned* p, unsigned v) {
    return (unsigned)__nvvm_atom_add_gen_i((int*)p, (int)v);
}
__device__ inline float atomicAdd(float* p, float v) { return __nvvm_atom_add_gen_f(p, v); }

__device__ inline int __dp4a(int a, int b, int c) {
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

#include "vector_types.h"
