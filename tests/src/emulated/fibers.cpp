// The host side of a kernel launch (tests only): every block of the grid runs in turn on the
// calling OS thread, each of its GPU threads as a fiber (ucontext) with its own stack. A fiber runs
// until it reaches a barrier (__syncthreads, a warp barrier, a warp shuffle) or returns; the
// scheduler then releases a warp whose lanes all wait at a warp barrier, and the block once every
// live thread waits at __syncthreads. With EMU_WAVES_SKIP_EXITED_LANES (AMD wavefronts run in
// lockstep: a shuffle involves only the lanes on its path) lanes that returned or wait at
// __syncthreads do not hold their warp back, but a shuffle reading from one is an error; without
// it (CUDA's full-mask shuffles and __syncwarp) every lane must arrive, and a warp barrier that
// some lane never reaches is a deadlock on a GPU and an error here, as is __syncthreads that a
// thread waiting at a warp barrier never reaches.
// The kernels are compiled with trapping alignment and array-bounds checks: a misaligned vector
// access (a fault on a GPU too) or an index outside a shared or local array traps, and a trap or a
// segmentation fault inside a kernel ends the launch with an error instead of the process.
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>

thread_local emu_dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace {

enum FiberState { RUNNABLE, AT_WARP_BARRIER, AT_BLOCK_BARRIER, DONE };

struct Fiber {
    ucontext_t context;
    FiberState state;
};

constexpr unsigned MAX_THREADS = 1024;
constexpr size_t STACK_BYTES = 256 * 1024;

// The state of the launch running on this OS thread.
struct Launch {
    void (*entry)(void**);
    void** args;
    ucontext_t scheduler;
    Fiber fibers[MAX_THREADS];
    char* stacks;  // MAX_THREADS stacks of STACK_BYTES, committed by the OS where touched
    unsigned current;
    unsigned long long lanes[MAX_THREADS];  // the values of a warp shuffle in flight
    unsigned char* dynamic_shared;
    char fault[256];  // the first misuse seen by a fiber (reported when the launch ends)
    sigjmp_buf trapped;  // where a trap or fault inside a kernel resumes
    bool in_kernel;
};

thread_local Launch* launch_state;

void block_until_released(FiberState why) {
    Launch* l = launch_state;
    Fiber& f = l->fibers[l->current];
    f.state = why;
    swapcontext(&f.context, &l->scheduler);
}

void fiber_main() {
    Launch* l = launch_state;
    l->entry(l->args);
    l->fibers[l->current].state = DONE;
    // returning resumes uc_link: the scheduler
}

// Runs every thread of the current block; returns false (with `error` filled) on a deadlock.
bool run_block(Launch* l, unsigned threads, char* error, size_t error_len) {
    for (unsigned t = 0; t < threads; t++) {
        Fiber& f = l->fibers[t];
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = l->stacks + (size_t)t * STACK_BYTES;
        f.context.uc_stack.ss_size = STACK_BYTES;
        f.context.uc_link = &l->scheduler;
        makecontext(&f.context, fiber_main, 0);
        f.state = RUNNABLE;
    }
    for (unsigned sweep = 0;; sweep++) {
        // Every other sweep runs the threads in reverse order, so that a read racing with another
        // thread's write (a missing barrier) sees the old value in one direction or the other.
        for (unsigned i = 0; i < threads; i++) {
            unsigned t = sweep % 2 ? threads - 1 - i : i;
            if (l->fibers[t].state != RUNNABLE) continue;
            l->current = t;
            threadIdx = {t, 0, 0};
            swapcontext(&l->scheduler, &l->fibers[t].context);
        }
        // Every fiber now waits or is done.
        bool released = false, all_done = true, all_at_block_barrier = true;
        for (unsigned w = 0; w < threads; w += WARP_SIZE) {
            unsigned end = w + WARP_SIZE < threads ? w + WARP_SIZE : threads;
            bool whole_warp_waits = true, any_waits = false;
            for (unsigned t = w; t < end; t++) {
                FiberState s = l->fibers[t].state;
                any_waits |= s == AT_WARP_BARRIER;
                whole_warp_waits &= s == AT_WARP_BARRIER || (EMU_WAVES_SKIP_EXITED_LANES && s != RUNNABLE);
                all_done &= s == DONE;
                all_at_block_barrier &= s == AT_BLOCK_BARRIER || s == DONE;
            }
            if (whole_warp_waits && any_waits) {
                for (unsigned t = w; t < end; t++)
                    if (l->fibers[t].state == AT_WARP_BARRIER) l->fibers[t].state = RUNNABLE;
                released = true;
            }
        }
        if (all_done) return true;
        if (released) continue;
        if (all_at_block_barrier) {
            for (unsigned t = 0; t < threads; t++)
                if (l->fibers[t].state == AT_BLOCK_BARRIER) l->fibers[t].state = RUNNABLE;
            continue;
        }
        unsigned warp_waiting = 0, block_waiting = 0, done = 0;
        for (unsigned t = 0; t < threads; t++) {
            FiberState s = l->fibers[t].state;
            warp_waiting += s == AT_WARP_BARRIER;
            block_waiting += s == AT_BLOCK_BARRIER;
            done += s == DONE;
        }
        snprintf(error, error_len,
                 "deadlock in block (%u,%u,%u): %u threads wait at a warp barrier or shuffle whose warp "
                 "has lanes that returned or wait at __syncthreads (%u wait at __syncthreads, %u returned)",
                 blockIdx.x, blockIdx.y, blockIdx.z, warp_waiting, block_waiting, done);
        return false;
    }
}

struct sigaction previous_ill, previous_segv;

// A trap or fault inside a kernel resumes the launch's scheduler with an error; any other goes to
// the handler that was there before (restored, the instruction faults again).
void on_fault(int sig, siginfo_t*, void*) {
    Launch* l = launch_state;
    if (l && l->in_kernel) siglongjmp(l->trapped, sig);
    sigaction(sig, sig == SIGILL ? &previous_ill : &previous_segv, nullptr);
}

bool install_fault_handlers() {
    struct sigaction a;
    memset(&a, 0, sizeof a);
    a.sa_sigaction = on_fault;
    a.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&a.sa_mask);
    return sigaction(SIGILL, &a, &previous_ill) == 0 && sigaction(SIGSEGV, &a, &previous_segv) == 0;
}

Launch* state_of_this_thread() {
    static bool handlers = install_fault_handlers();
    thread_local Launch* l = nullptr;
    if (!l && handlers) {
        l = (Launch*)calloc(1, sizeof(Launch));
        void* stacks = mmap(nullptr, MAX_THREADS * STACK_BYTES, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        // The fault handler's own stack (a fiber's stack may be what overflowed).
        stack_t alt;
        alt.ss_sp = malloc(1 << 16);
        alt.ss_size = 1 << 16;
        alt.ss_flags = 0;
        if (!l || stacks == MAP_FAILED || !alt.ss_sp || sigaltstack(&alt, nullptr) != 0) return nullptr;
        l->stacks = (char*)stacks;
    }
    return l;
}

}  // namespace

void emu_sync_block() { block_until_released(AT_BLOCK_BARRIER); }
void emu_sync_warp() { block_until_released(AT_WARP_BARRIER); }

unsigned long long emu_exchange(unsigned long long bits, unsigned src_lane) {
    Launch* l = launch_state;
    unsigned t = threadIdx.x, base = t - t % WARP_SIZE;
    l->lanes[t] = bits;
    emu_sync_warp();
    unsigned src = base + src_lane;
    bool in_warp = src_lane < WARP_SIZE && src < blockDim.x;
    FiberState source_state = in_warp ? l->fibers[src].state : RUNNABLE;
    if ((source_state == DONE || source_state == AT_BLOCK_BARRIER) && !l->fault[0])
        snprintf(l->fault, sizeof l->fault,
                 "block (%u,%u,%u) thread %u: a shuffle reads lane %u, which is not on its path",
                 blockIdx.x, blockIdx.y, blockIdx.z, t, src_lane);
    unsigned long long got = in_warp ? l->lanes[src] : bits;
    emu_sync_warp();
    return got;
}

unsigned char* emu_dynamic_shared() { return launch_state->dynamic_shared; }

// Runs `entry` (a kernel's argument unpacker) on a grid of `grid` blocks of `threads` threads with
// `shared_bytes` of dynamic shared memory. Returns 0, or -1 with `error` filled.
extern "C" int emu_run(void (*entry)(void**), void** args, const unsigned grid[3], unsigned threads,
                       unsigned shared_bytes, char* error, size_t error_len) {
    // The launch limits of CUDA (a launch beyond them fails there with an invalid configuration).
    if (threads == 0 || threads > MAX_THREADS) {
        snprintf(error, error_len, "%u threads per block (1..=%u)", threads, MAX_THREADS);
        return -1;
    }
    if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0 || grid[0] > 0x7fffffffu || grid[1] > 65535 ||
        grid[2] > 65535) {
        snprintf(error, error_len, "grid (%u, %u, %u) outside (1..2^31, 1..65535, 1..65535)", grid[0],
                 grid[1], grid[2]);
        return -1;
    }
    if (shared_bytes > 48 * 1024) {
        snprintf(error, error_len, "%u bytes of dynamic shared memory (48 KiB without an opt-in)",
                 shared_bytes);
        return -1;
    }
    Launch* l = state_of_this_thread();
    if (!l) {
        snprintf(error, error_len, "no memory for the fiber stacks or no fault handlers");
        return -1;
    }
    // Dynamic shared memory starts as garbage on a GPU: poisoned here (NaN floats).
    unsigned char* shared = (unsigned char*)malloc(shared_bytes ? shared_bytes : 1);
    if (!shared) {
        snprintf(error, error_len, "no memory for %u bytes of shared memory", shared_bytes);
        return -1;
    }
    memset(shared, 0xFF, shared_bytes);
    l->entry = entry;
    l->args = args;
    l->dynamic_shared = shared;
    l->fault[0] = 0;
    launch_state = l;
    blockDim = {threads, 1, 1};
    gridDim = {grid[0], grid[1], grid[2]};
    int rc = 0;
    l->in_kernel = true;
    if (int sig = sigsetjmp(l->trapped, 1)) {
        snprintf(error, error_len,
                 "%s in block (%u,%u,%u) thread %u: a misaligned access, an index outside a shared or "
                 "local array, or an address outside mapped memory",
                 sig == SIGILL ? "trap" : "segmentation fault", blockIdx.x, blockIdx.y, blockIdx.z,
                 threadIdx.x);
        rc = -1;
    } else {
        for (unsigned z = 0; z < grid[2] && rc == 0; z++)
            for (unsigned y = 0; y < grid[1] && rc == 0; y++)
                for (unsigned x = 0; x < grid[0] && rc == 0; x++) {
                    blockIdx = {x, y, z};
                    if (!run_block(l, threads, error, error_len)) rc = -1;
                }
    }
    l->in_kernel = false;
    launch_state = nullptr;
    free(shared);
    if (rc == 0 && l->fault[0]) {
        snprintf(error, error_len, "%s", l->fault);
        rc = -1;
    }
    return rc;
}

// A kernel's entry point with its arguments unpacked from an array of pointers to each value.
template <auto F> struct EmuEntry;
template <typename... A, void (*F)(A...)> struct EmuEntry<F> {
    static void call(void** args) { unpack(args, std::index_sequence_for<A...>{}); }
    template <size_t... I> static void unpack(void** args, std::index_sequence<I...>) {
        F(*static_cast<A*>(args[I])...);
    }
};

struct EmuKernel {
    const char* name;
    void (*entry)(void**);
};
