// Vendor prelude: HIP (hiprtc). The HIP backend defines WARP_SIZE (the wavefront size) in front.
#define GGML_TP_HIP 1
// Kernels start in stream order on AMD GPUs: nothing to wait for.
#define GRID_DEPENDENCY_SYNC() ((void)0)
#define PREFETCH_L2(p) ((void)(p))
#define WARP_SHFL_XOR(v, o) __shfl_xor((v), (o))
#define WARP_SHFL_DOWN(v, o) __shfl_down((v), (o))
#define WARP_SYNC() do { __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront"); \
    __builtin_amdgcn_wave_barrier(); __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront"); } while (0)
#if defined(__GFX11__) || defined(__GFX12__)
#define DOT4_I8(a, b, c) __builtin_amdgcn_sudot4(true, (int)(a), true, (int)(b), (int)(c), false)
#elif defined(__gfx906__) || defined(__gfx908__) || defined(__gfx90a__) || defined(__gfx940__) || \
    defined(__gfx941__) || defined(__gfx942__) || defined(__gfx950__) || defined(__gfx1011__) || \
    defined(__gfx1012__) || defined(__gfx1030__) || defined(__gfx1031__) || defined(__gfx1032__) || \
    defined(__gfx1033__) || defined(__gfx1034__) || defined(__gfx1035__) || defined(__gfx1036__)
#define DOT4_I8(a, b, c) __builtin_amdgcn_sdot4((int)(a), (int)(b), (int)(c), false)
#else
__device__ __forceinline__ int vendor_dot4_i8(int a, int b, int c) {
    for (int i = 0; i < 32; i += 8) c += (int)(signed char)(a >> i) * (int)(signed char)(b >> i);
    return c;
}
#define DOT4_I8(a, b, c) vendor_dot4_i8((int)(a), (int)(b), (int)(c))
#endif
__device__ __forceinline__ float h2f(unsigned short h) { return (float)__builtin_bit_cast(_Float16, h); }
__device__ __forceinline__ unsigned short f2h(float f) {
    return __builtin_bit_cast(unsigned short, (_Float16)f);
}
