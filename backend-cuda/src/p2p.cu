// One-shot peer-to-peer AllReduce (sum) for small messages, and the F32 <-> BF16 conversions of the
// BF16 transport. Compiled by NVRTC on its own (no CUDA headers; sm_80 or newer for cvt.bf16).
//
// Every rank owns a staging area in its device memory, mapped into its peers through peer access:
//   [flags: AR_MAX_BLOCKS x AR_MAX_RANKS u32][data: 2 slots x nranks sources x cap bytes]
// Block b of rank q pushes its chunk (b of gridDim.x equal chunks) into slot (epoch & 1), source q,
// of every peer, then writes `epoch` into flag [b][q] of every peer (release, system scope). It waits
// until its own flags [b][r] reach `epoch` for every peer r, then sums the sources in rank order
// (identical results on every rank) and writes the sum in place. Two slots make back-to-back calls
// safe: a rank reuses a slot only after its previous call saw every peer's flag of the call in
// between, and a peer raises that flag only once its kernel of two calls ago has finished.
typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

#define AR_MAX_RANKS 8
#define AR_MAX_BLOCKS 64
#define AR_FLAGS_BYTES 4096
// A rank that waits this long for a peer traps instead of hanging the device.
#define AR_TIMEOUT_NS 10000000000ull

struct ArPeers {
    u64 stage[AR_MAX_RANKS];
};

__device__ __forceinline__ void st_release(u32* p, u32 v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ u32 ld_acquire(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ u64 now_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Loads that skip the (non-coherent) L1 cache, for data peers wrote.
__device__ __forceinline__ float ld_cg(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ u16 ld_cg(const u16* p) {
    u16 v;
    asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}

// Element types: float, or u16 holding a bfloat16.
__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(u16 v) { return __uint_as_float(((u32)v) << 16); }
__device__ __forceinline__ void narrow(float f, float* out) { *out = f; }
__device__ __forceinline__ void narrow(float f, u16* out) {
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    *out = h;
}

__device__ __forceinline__ u32* ar_flag(u64 stage, int block, int source) {
    return (u32*)stage + block * AR_MAX_RANKS + source;
}

template <typename D, typename W>
__device__ void oneshot(D* data, u64 n, int rank, int nranks, ArPeers peers, u64 cap, u32 epoch) {
    const u64 chunk = (n + gridDim.x - 1) / gridDim.x;
    const u64 lo = blockIdx.x * chunk;
    const u64 hi = lo + chunk < n ? lo + chunk : n;
    const u64 slot = epoch & 1u;
    // 1. Push this rank's chunk, in wire precision, to every peer.
    for (u64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        W w;
        narrow(widen(data[i]), &w);
        for (int r = 0; r < nranks; ++r) {
            if (r == rank) continue;
            W* dst = (W*)(peers.stage[r] + AR_FLAGS_BYTES + (slot * nranks + rank) * cap);
            dst[i] = w;
        }
    }
    // 2. Signal every peer, then wait for every peer's signal.
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence_system();
        for (int r = 0; r < nranks; ++r) {
            if (r != rank) st_release(ar_flag(peers.stage[r], blockIdx.x, rank), epoch);
        }
    }
    if (threadIdx.x < nranks && (int)threadIdx.x != rank) {
        const u32* f = ar_flag(peers.stage[rank], blockIdx.x, threadIdx.x);
        const u64 t0 = now_ns();
        while ((int)(ld_acquire(f) - epoch) < 0) {
            if (now_ns() - t0 > AR_TIMEOUT_NS) __trap();
        }
    }
    __syncthreads();
    // 3. Sum the sources in rank order and write the result in place.
    const u64 mine = peers.stage[rank] + AR_FLAGS_BYTES + slot * nranks * cap;
    for (u64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        W own;
        narrow(widen(data[i]), &own);
        float s = 0.0f;
        for (int r = 0; r < nranks; ++r) {
            s += r == rank ? widen(own) : widen(ld_cg((const W*)(mine + r * cap) + i));
        }
        narrow(s, &data[i]);
    }
}

extern "C" __global__ void k_ar_f32(float* data, u64 n, int rank, int nranks, ArPeers peers, u64 cap, u32 epoch) {
    oneshot<float, float>(data, n, rank, nranks, peers, cap, epoch);
}
extern "C" __global__ void k_ar_f32_bf16(float* data, u64 n, int rank, int nranks, ArPeers peers, u64 cap, u32 epoch) {
    oneshot<float, u16>(data, n, rank, nranks, peers, cap, epoch);
}
extern "C" __global__ void k_ar_bf16(u16* data, u64 n, int rank, int nranks, ArPeers peers, u64 cap, u32 epoch) {
    oneshot<u16, u16>(data, n, rank, nranks, peers, cap, epoch);
}

// The BF16 transport of the NCCL path: F32 -> BF16 before, BF16 -> F32 after.
extern "C" __global__ void k_f32_to_bf16(const float* src, u16* dst, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        narrow(src[i], &dst[i]);
    }
}
extern "C" __global__ void k_bf16_to_f32(const u16* src, float* dst, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        dst[i] = widen(src[i]);
    }
}
