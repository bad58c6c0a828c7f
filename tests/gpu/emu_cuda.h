/* What the CPU emulations of the CUDA kernels (tests/gpu/*_emu.cpp) share:
 * the CUDA keywords as no-ops, the thread/block coordinates, and the block
 * runner. A block's CUDA threads are fibers on one host thread,
 * switched only where a thread waits at a barrier (__syncthreads, a
 * warp-collective instruction), in a fixed order: the lanes of a warp take
 * turns until every one of them waits at a block-wide barrier, then the
 * next warp runs. One host thread keeps the emulation's speed independent
 * of how many cores the machine has free (a std::thread per CUDA thread
 * spent its time in the scheduler and slowed down by an order of magnitude
 * on a loaded machine), and the fixed order makes a run reproducible and
 * its races visible every time: a thread reading shared memory that a
 * later warp writes without a barrier in between reads the NaN poison, and
 * a warp that refills shared memory the later warps still read, with no
 * barrier in between, overwrites it before they read (the barrier before
 * a pipeline stage's refill in kernels/paged.cu, left out, fails a case). */
#ifndef CAI_TESTS_GPU_EMU_CUDA_H
#define CAI_TESTS_GPU_EMU_CUDA_H

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include <ucontext.h>

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
dim3 threadIdx, blockIdx, blockDim, gridDim; /* threadIdx: the running fiber's */
unsigned char *g_smem;                       /* the emulated block's dynamic shared memory */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(x)
#define CUK_INLINE static inline
/* The region markers of kernels/cuda_common.cuh, kept by the extraction */
#define CUK_EMU_BEGIN(name) enum { cuk_emu_begin_##name = 1 }
#define CUK_EMU_END(name) static_assert(cuk_emu_begin_##name == 1, "CUK_EMU_END(" #name ") after its BEGIN")

/* CUDA's vector types and bit casts that the kernels use */
struct uint2 {
    uint32_t x, y;
};
struct uint4 {
    uint32_t x, y, z, w;
};
static inline uint2 make_uint2(uint32_t a, uint32_t b) { return uint2{a, b}; }
struct float4 {
    float x, y, z, w;
};
static inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return uint4{a, b, c, d}; }
static inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
static inline float __uint_as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Programmatic dependent launch has no meaning for one emulated grid. */
static inline void cuk_pdl_trigger() {}
static inline void cuk_pdl_wait() {}

/* ---- the block runner */
namespace emu {
/* A fiber switch: on x86-64 the callee-saved registers and the FP control
 * words pushed on the old stack and popped from the new one (no system
 * call; swapcontext's signal-mask syscall on every switch, 32 a warp
 * collective, took half the emulations' time); elsewhere ucontext. */
#if defined(__x86_64__)
extern "C" void emu_switch(void **save_sp, void *to_sp);
asm(".text\n"
    ".globl emu_switch\n"
    ".type emu_switch,@function\n"
    "emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size emu_switch,.-emu_switch\n");
struct Context {
    void *sp;
};
#else
struct Context {
    ucontext_t uc;
};
#endif
struct Fiber {
    Context ctx;
    char *stack;
    unsigned tid;
    bool done;
    /* waiting at a block-wide barrier while *bar_gen == gen (its
     * generation counter has not moved on); bar_gen NULL: not waiting */
    const unsigned *bar_gen;
    unsigned gen;
};
inline bool at_block(const Fiber &f) { return f.bar_gen && *f.bar_gen == f.gen; }
struct Run {
    std::vector<Fiber> f;
    Context main;
    const std::function<void()> *body;
    unsigned cur;
    unsigned long progress; /* barrier arrivals and finished fibers */
};
inline Run *g_run;
/* Kernels keep fragments and tiles in registers (local arrays): room for
 * the largest with the emulated instructions' own arrays on top. */
constexpr size_t kStack = 256 * 1024;
/* Stacks outlive a block: a grid's blocks reuse them, where fresh ones
 * cost an mmap and their page faults each. */
inline std::vector<std::unique_ptr<char[]>> g_stacks;

inline void switch_to(Context &save, Context &to) {
#if defined(__x86_64__)
    emu_switch(&save.sp, to.sp);
#else
    swapcontext(&save.uc, &to.uc);
#endif
}

inline void entry() {
    (*g_run->body)();
    g_run->progress++;
    g_run->f[g_run->cur].done = true;
#if defined(__x86_64__)
    Context gone;
    switch_to(gone, g_run->main); /* never resumed */
#endif                            /* else uc_link returns to the runner */
}

/* A fiber that starts in entry() on its stack at the first switch to it. */
inline void start(Fiber &fb, Run &r) {
#if defined(__x86_64__)
    /* what emu_switch pops: the control words, r15..rbp, then entry as the
     * return address, with the stack 16-aligned at entry's call boundary */
    uintptr_t top = ((uintptr_t)fb.stack + kStack) & ~(uintptr_t)15;
    void **sp = (void **)(top - 16);
    sp[0] = (void *)&entry;
    for (int i = 1; i <= 6; i++) sp[-i] = nullptr;
    uint32_t cw[2];
    asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(cw[0]), "=m"(cw[1]));
    memcpy(&sp[-7], cw, sizeof cw);
    fb.ctx.sp = &sp[-7];
#else
    getcontext(&fb.ctx.uc);
    fb.ctx.uc.uc_stack.ss_sp = fb.stack;
    fb.ctx.uc.uc_stack.ss_size = kStack;
    fb.ctx.uc.uc_link = &r.main.uc;
    makecontext(&fb.ctx.uc, entry, 0);
#endif
    (void)r;
}

/* Switches to another fiber (back to the caller when it is the only one
 * left that has not finished): a lane of the caller's warp that is not
 * waiting at a block-wide barrier, else the next fiber in thread order.
 * A warp so runs ahead to its next block-wide barrier before the next warp
 * starts, as a GPU may run it: a warp that rewrites shared memory the
 * others still read from, with no barrier in between, overwrites it
 * before they read. */
inline void yield() {
    Run &r = *g_run;
    const unsigned n = (unsigned)r.f.size(), from = r.cur, w0 = from & ~31u;
    unsigned to = from;
    for (unsigned k = 1; k < 32; k++) {
        const unsigned t = w0 + (from - w0 + k) % 32;
        if (t < n && !r.f[t].done && !at_block(r.f[t])) {
            to = t;
            break;
        }
    }
    if (to == from) {
        do to = (to + 1) % n;
        while (r.f[to].done && to != from);
    }
    if (to == from) return;
    r.cur = to;
    threadIdx = dim3(r.f[to].tid, 0, 0);
    switch_to(r.f[from].ctx, r.f[to].ctx);
}

/* Runs body once per thread of a block of nthreads (blockIdx, blockDim,
 * gridDim and the block's shared state set by the caller), to completion. */
inline void run_block(unsigned nthreads, const std::function<void()> &body) {
    Run r;
    r.f.resize(nthreads);
    r.body = &body;
    r.progress = 0;
    if (g_run) { /* the stacks are the running block's */
        fprintf(stderr, "emu: run_block inside a running block\n");
        abort();
    }
    while (g_stacks.size() < nthreads) g_stacks.emplace_back(new char[kStack]);
    for (unsigned t = 0; t < nthreads; t++) {
        Fiber &fb = r.f[t];
        fb.tid = t;
        fb.done = false;
        fb.bar_gen = nullptr;
        fb.stack = g_stacks[t].get();
        start(fb, r);
    }
    g_run = &r;
    for (unsigned live = nthreads; live > 0;) {
        unsigned t = 0;
        while (r.f[t].done) t++;
        r.cur = t;
        threadIdx = dim3(t, 0, 0);
        switch_to(r.main, r.f[t].ctx);
        live = 0;
        for (const Fiber &fb : r.f) live += !fb.done;
    }
    g_run = nullptr;
}

/* A barrier of n fibers of the running block. Waiting fibers yield until
 * the last one arrives. A round of the other fibers in which none arrives
 * anywhere or finishes means none ever will (a barrier inside a branch
 * that not every thread takes): reported, not spun on. */
struct Barrier {
    int n, count = 0;
    unsigned gen = 0;
    bool warp; /* a warp's (its lanes stay preferred while they wait) */
    explicit Barrier(int n_, bool warp_ = false) : n(n_), warp(warp_) {}
    void arrive_and_wait() {
        g_run->progress++;
        if (++count == n) {
            count = 0;
            gen++;
            return;
        }
        const unsigned g = gen;
        Fiber &me = g_run->f[g_run->cur];
        me.bar_gen = warp ? nullptr : &gen;
        me.gen = g;
        while (gen == g) {
            const unsigned long before = g_run->progress;
            yield();
            if (gen == g && g_run->progress == before) {
                fprintf(stderr, "emu: deadlock: thread %u waits at a barrier of %d that %d threads reached\n",
                        threadIdx.x, n, count);
                abort();
            }
        }
    }
};
/* A warp's lanes exchanging one float each (__shfl_xor_sync): lane l gets
 * what lane l ^ m put, between two barriers of the warp. */
struct Warp {
    Barrier bar{32, true};
    float slot[32];
};
inline float shfl_xor(Warp &w, unsigned lane, float v, int m) {
    w.slot[lane] = v;
    w.bar.arrive_and_wait();
    const float r = w.slot[lane ^ (unsigned)m];
    w.bar.arrive_and_wait();
    return r;
}
} // namespace emu

#endif
