// Vendor prelude: CUDA (NVRTC). The shared kernel sources spell everything vendor-specific with
// these names; prelude_hip.h defines the same names for AMD GPUs.
#define GGML_TP_CUDA 1
#define WARP_SIZE 32
#define WARP_SHFL_XOR(v, o) __shfl_xor_sync(0xffffffffu, (v), (o))
#define WARP_SHFL_DOWN(v, o) __shfl_down_sync(0xffffffffu, (v), (o))
#define WARP_SYNC() __syncwarp()
#define DOT4_I8(a, b, c) __dp4a((int)(a), (int)(b), (int)(c))
// The first statement of every kernel. Launched as a programmatic dependent (compute capability
// 9.0 and later, GGML_TP_CUDA_PDL), a kernel's blocks may start while the kernel before it still
// runs: this waits until that kernel has finished and its writes are visible, then lets the next
// launch's blocks start as this one's finish.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GRID_DEPENDENCY_SYNC() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define GRID_DEPENDENCY_SYNC() ((void)0)
#endif
// Asks for the 128-byte line at p to be brought into the L2 (a hint: nothing is read into the
// kernel, so it may come before GRID_DEPENDENCY_SYNC, see L2_THEN_SYNC in common.cu).
#define PREFETCH_L2(p) asm volatile("prefetch.global.L2 [%0];" ::"l"(p))
__device__ __forceinline__ float h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ unsigned short f2h(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
// FAST_EXPF(x): e^x by a scale and ex2.approx (a few ulp; attention_mma.cu's softmax), where the
// shared sources otherwise take expf.
#define FAST_EXPF(x) __expf(x)
// A warp's tensor-core product c += a b (16x16 and 16x8 F16 tiles, f32 sums; fragments as
// attention_mma.cu describes them) on compute capability 8.0 and later; elsewhere that file's
// form through shared memory.
// MMA_I8_16816(c, a, b): c += a b for a 16x16 tile a and a 16x8 tile b of signed bytes, int32
// sums (fragments as moe.cu describes them); MMA_I8_16832(c, a, b) the same over 32 bytes of k
// (a 16x32 tile a in 4 registers, a 32x8 tile b in 2: the two 16-byte halves' fragments of
// MMA_I8_16816 side by side, a = {a_lo, a_hi}, b = {b_lo, b_hi}).
// CP_ASYNC_16(dst, src) starts copying 16 bytes from global memory at src to shared memory at dst
// (both 16-byte aligned), CP_ASYNC_WAIT_ALL() waits until this thread's copies have landed;
// LDSM_X4(r, p) and LDSM_X4_TRANS(r, p) load four 8x8 tiles of halves from shared memory as
// attention_mma.cu's fragments (lane l gives the address of row l % 8 of tile l / 8; the tiles
// as they are, or transposed).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// The shared-memory address of a generic pointer to shared memory, as the instructions take it.
__device__ __forceinline__ unsigned smem_u32(const void* p) {
    unsigned a;
    asm("{ .reg .u64 s; cvta.to.shared.u64 s, %1; cvt.u32.u64 %0, s; }" : "=r"(a) : "l"(p));
    return a;
}
#define CP_ASYNC_16(dst, src)                                                                         \
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(dst)), "l"(src) : "memory")
#define CP_ASYNC_WAIT_ALL() asm volatile("cp.async.wait_all;" ::: "memory")
#define LDSM_X4(r, p)                                                                                 \
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"                    \
                 : "=r"((r)[0]), "=r"((r)[1]), "=r"((r)[2]), "=r"((r)[3])                              \
                 : "r"(smem_u32(p)))
#define LDSM_X4_TRANS(r, p)                                                                           \
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"              \
                 : "=r"((r)[0]), "=r"((r)[1]), "=r"((r)[2]), "=r"((r)[3])                              \
                 : "r"(smem_u32(p)))
#define MMA_F16_16816(c, a, b)                                                                        \
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "           \
        "{%8,%9}, {%0,%1,%2,%3};"                                                                      \
        : "+f"((c)[0]), "+f"((c)[1]), "+f"((c)[2]), "+f"((c)[3])                                       \
        : "r"((a)[0]), "r"((a)[1]), "r"((a)[2]), "r"((a)[3]), "r"((b)[0]), "r"((b)[1]))
#define MMA_I8_16816(c, a, b)                                                                         \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "    \
                 "{%0,%1,%2,%3};"                                                                      \
                 : "+r"((c)[0]), "+r"((c)[1]), "+r"((c)[2]), "+r"((c)[3])                              \
                 : "r"((a)[0]), "r"((a)[1]), "r"(b))
#define MMA_I8_16832(c, a, b)                                                                         \
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "    \
                 "{%8,%9}, {%0,%1,%2,%3};"                                                             \
                 : "+r"((c)[0]), "+r"((c)[1]), "+r"((c)[2]), "+r"((c)[3])                              \
                 : "r"((a)[0]), "r"((a)[1]), "r"((a)[2]), "r"((a)[3]), "r"((b)[0]), "r"((b)[1]))
#endif
