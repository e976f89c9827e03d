// Vendor prelude: the host (tests only). Defines the names the shared kernel sources use, in
// terms of plain C++ and the fiber scheduler of `fibers.cpp` (one fiber per GPU thread): the
// thread and block indices, __syncthreads, warp shuffles and warp barriers, __shared__ memory
// (one copy per OS thread: the blocks of a launch run one after another on it), atomic adds,
// vector types and bit casts. WARP_SIZE is defined in front (32 as on NVIDIA GPUs, 64 as on AMD wavefronts).
#include <math.h>
#include <string.h>
#include <time.h>
#include <type_traits>
#include <utility>

#define GGML_TP_HOST 1
#define __device__
#define __global__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __shared__ static thread_local

struct emu_dim3 {
    unsigned x, y, z;
};
extern thread_local emu_dim3 threadIdx, blockIdx, blockDim, gridDim;

void emu_sync_block();
void emu_sync_warp();
unsigned long long emu_exchange(unsigned long long bits, unsigned src_lane);

#define __syncthreads() emu_sync_block()
// Launches run one after another on the host: nothing to wait for.
#define GRID_DEPENDENCY_SYNC() ((void)0)
#define PREFETCH_L2(p) ((void)(p))
#define WARP_SYNC() emu_sync_warp()

template <typename T> inline T emu_shuffle(T v, unsigned src_lane) {
    static_assert(sizeof(T) <= 8, "warp shuffles move at most 8 bytes");
    unsigned long long bits = 0;
    memcpy(&bits, &v, sizeof(T));
    bits = emu_exchange(bits, src_lane);
    T r;
    memcpy(&r, &bits, sizeof(T));
    return r;
}
#define WARP_SHFL_XOR(v, o) emu_shuffle((v), (threadIdx.x % WARP_SIZE) ^ (unsigned)(o))
#define WARP_SHFL_DOWN(v, o) emu_shuffle((v), (threadIdx.x % WARP_SIZE) + (unsigned)(o))

// Atomic adds of ints (shared or global memory: the blocks of a launch may run on several OS threads).
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }

inline int emu_dot4_i8(int a, int b, int c) {
    for (int i = 0; i < 32; i += 8) c += (int)(signed char)(a >> i) * (int)(signed char)(b >> i);
    return c;
}
#define DOT4_I8(a, b, c) emu_dot4_i8((int)(a), (int)(b), (int)(c))

// The bit casts of CUDA's intrinsics, through one copy of the bits.
template <typename To, typename From> inline To emu_bits(From v) {
    static_assert(sizeof(To) == sizeof(From), "a bit cast keeps the size");
    To r;
    memcpy(&r, &v, sizeof r);
    return r;
}
inline float __uint_as_float(unsigned u) { return emu_bits<float>(u); }
inline float __int_as_float(int i) { return emu_bits<float>(i); }
inline unsigned __float_as_uint(float f) { return emu_bits<unsigned>(f); }
inline float h2f(unsigned short h) { return (float)emu_bits<_Float16>(h); }
inline unsigned short f2h(float f) { return emu_bits<unsigned short>((_Float16)f); }

// The profiler's hold kernel spins on the clock: nanoseconds here.
inline long long clock64() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}
inline int __float2int_rn(float f) { return (int)nearbyintf(f); }
// Rounded float arithmetic that is never contracted (no FMA without -march).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int n = 0; n < 4; n++) r |= (unsigned)((v >> (8 * ((s >> (4 * n)) & 7))) & 0xFF) << (8 * n);
    return r;
}

// CUDA's integer and float overloads of min and max, as one template (by value, the common type).
template <typename A, typename B> inline std::common_type_t<A, B> min(A a, B b) { return a < b ? a : b; }
template <typename A, typename B> inline std::common_type_t<A, B> max(A a, B b) { return a < b ? b : a; }

struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(16) int4 { int x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
