// One-shot peer-to-peer AllReduce (sum) for small messages, and the F32 <-> BF16 conversions of the
// BF16 transport. Compiled by NVRTC on its own (no CUDA headers; sm_80 or newer for cvt.bf16).
//
// The one-shot kernel moves data in 8-byte words of 32 payload bits and a 32-bit flag, written and
// read as one access (the low-latency protocol of NCCL's LL): a word is valid once its flag equals the
// call's flag, so neither fences nor separate signals are needed. Every rank owns a staging area in
// its device memory, mapped into its peers through peer access: 2 slots x nranks sources x cap words.
// Each thread pushes its words of this rank's data into slot `slot`, source `rank`, of every peer,
// then waits for the same words from every peer in its own staging, clears them (so a stale word
// never carries a live flag), sums in rank order (identical results on every rank) and writes the
// sum in place. Two slots make back-to-back calls safe: a rank writes a slot again two calls later,
// only after its call in between received a word from every peer, which each peer sends only once
// its kernel of two calls ago, the last reader of that slot, has finished.
typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

#define AR_MAX_RANKS 8
// A rank that waits this long for a peer traps instead of hanging the device.
#define AR_TIMEOUT_NS 10000000000ull

struct ArPeers {
    u64 stage[AR_MAX_RANKS];
};

__device__ __forceinline__ void st_word(u64 addr, u32 payload, u32 flag) {
    asm volatile("st.volatile.global.v2.u32 [%0], {%1, %2};" ::"l"(addr), "r"(payload), "r"(flag) : "memory");
}
__device__ __forceinline__ void ld_word(u64 addr, u32& payload, u32& flag) {
    asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];" : "=r"(payload), "=r"(flag) : "l"(addr) : "memory");
}
__device__ __forceinline__ u64 now_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ u32 bf16_bits(float f) {
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float bf16_value(u32 bits) { return __uint_as_float(bits << 16); }

// Elements of the data: float, or u16 holding a bfloat16.
__device__ __forceinline__ float load(const float* p, u64 i) { return p[i]; }
__device__ __forceinline__ float load(const u16* p, u64 i) { return bf16_value(p[i]); }
__device__ __forceinline__ void store(float* p, u64 i, float v) { p[i] = v; }
__device__ __forceinline__ void store(u16* p, u64 i, float v) { p[i] = (u16)bf16_bits(v); }

// Wire formats: one F32 per word, or two BF16 (the second 0 past the end).
struct WireF32 {
    static const int PER = 1;
    template <typename D>
    __device__ static u32 pack(const D* d, u64, u64 w) { return __float_as_uint(load(d, w)); }
    __device__ static float unpack(u32 p, int) { return __uint_as_float(p); }
};
struct WireBf16 {
    static const int PER = 2;
    template <typename D>
    __device__ static u32 pack(const D* d, u64 n, u64 w) {
        const u32 lo = bf16_bits(load(d, 2 * w));
        const u32 hi = 2 * w + 1 < n ? bf16_bits(load(d, 2 * w + 1)) : 0u;
        return lo | (hi << 16);
    }
    __device__ static float unpack(u32 p, int k) { return bf16_value(k == 0 ? (p & 0xffffu) : (p >> 16)); }
};

__device__ __forceinline__ u64 word_addr(u64 stage, u32 slot, int nranks, int source, u64 cap, u64 w) {
    return stage + (((u64)slot * nranks + source) * cap + w) * 8;
}

template <typename D, typename W>
__device__ void oneshot(D* data, u64 n, int rank, int nranks, ArPeers peers, u64 cap, u32 flag, u32 slot) {
    const u64 words = (n + W::PER - 1) / W::PER;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 first = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    for (u64 w = first; w < words; w += stride) {
        const u32 p = W::template pack<D>(data, n, w);
        for (int r = 0; r < nranks; ++r) {
            if (r != rank) st_word(word_addr(peers.stage[r], slot, nranks, rank, cap, w), p, flag);
        }
    }
    for (u64 w = first; w < words; w += stride) {
        float acc[W::PER];
        for (int k = 0; k < W::PER; ++k) acc[k] = 0.0f;
        for (int r = 0; r < nranks; ++r) {
            u32 p;
            if (r == rank) {
                p = W::template pack<D>(data, n, w);
            } else {
                const u64 a = word_addr(peers.stage[rank], slot, nranks, r, cap, w);
                u32 f;
                ld_word(a, p, f);
                if (f != flag) {
                    const u64 t0 = now_ns();
                    do {
                        if (now_ns() - t0 > AR_TIMEOUT_NS) __trap();
                        ld_word(a, p, f);
                    } while (f != flag);
                }
                st_word(a, 0u, 0u);
            }
            for (int k = 0; k < W::PER; ++k) acc[k] += W::unpack(p, k);
        }
        for (int k = 0; k < W::PER; ++k) {
            if (w * W::PER + k < n) store(data, w * W::PER + k, acc[k]);
        }
    }
}

extern "C" __global__ void k_ar_f32(float* data, u64 n, int rank, int nranks, ArPeers peers, u64 cap, u32 flag, u32 slot) {
    oneshot<float, WireF32>(data, n, rank, nranks, peers, cap, flag, slot);
}
extern "C" __global__ void k_ar_f32_bf16(float* data, u64 n, int rank, int nranks, ArPeers peers, u64 cap, u32 flag, u32 slot) {
    oneshot<float, WireBf16>(data, n, rank, nranks, peers, cap, flag, slot);
}
extern "C" __global__ void k_ar_bf16(u16* data, u64 n, int rank, int nranks, ArPeers peers, u64 cap, u32 flag, u32 slot) {
    oneshot<u16, WireBf16>(data, n, rank, nranks, peers, cap, flag, slot);
}

// The BF16 transport of the NCCL path: F32 -> BF16 before, BF16 -> F32 after.
extern "C" __global__ void k_f32_to_bf16(const float* src, u16* dst, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        dst[i] = (u16)bf16_bits(src[i]);
    }
}
extern "C" __global__ void k_bf16_to_f32(const u16* src, float* dst, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        dst[i] = bf16_value(src[i]);
    }
}

// The same-GPU AllReduce of logical devices (one context: every rank's data is addressable here),
// launched once, on one stream, after the other ranks' streams reached the call: element i of every
// rank is summed in rank order (F32 accumulation) and the sum written back to every rank.
__device__ __forceinline__ float f16_value(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ u16 f16_bits(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
struct ElemF32 {
    typedef float T;
    __device__ static float get(float v) { return v; }
    __device__ static float put(float v) { return v; }
};
struct ElemBf16 {
    typedef u16 T;
    __device__ static float get(u16 v) { return bf16_value(v); }
    __device__ static u16 put(float v) { return (u16)bf16_bits(v); }
};
struct ElemF16 {
    typedef u16 T;
    __device__ static float get(u16 v) { return f16_value(v); }
    __device__ static u16 put(float v) { return f16_bits(v); }
};

template <typename E>
__device__ void sum_local(ArPeers data, int nranks, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        float acc = 0.0f;
        for (int r = 0; r < nranks; ++r) acc += E::get(((const typename E::T*)data.stage[r])[i]);
        const typename E::T v = E::put(acc);
        for (int r = 0; r < nranks; ++r) ((typename E::T*)data.stage[r])[i] = v;
    }
}

extern "C" __global__ void k_sum_f32(ArPeers data, int nranks, u64 n) { sum_local<ElemF32>(data, nranks, n); }
extern "C" __global__ void k_sum_bf16(ArPeers data, int nranks, u64 n) { sum_local<ElemBf16>(data, nranks, n); }
extern "C" __global__ void k_sum_f16(ArPeers data, int nranks, u64 n) { sum_local<ElemF16>(data, nranks, n); }
