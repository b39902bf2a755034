// exec.cpp: how the emulated GPU runs a kernel. Blocks run one after another (in a seeded random order) on
// the OS thread that waits for the kernel; each GPU thread of a block is a fiber with its own stack,
// switched cooperatively by a small x86-64 context switch (callee-saved registers, stack pointer, MXCSR
// and the x87 control word: no system call, unlike swapcontext).
//
// A fiber runs until it exits or reaches a point where GPU threads meet:
//   - __syncthreads: it waits until every live thread of the block is there; threads waiting at different
//     __syncthreads (source lines) are reported as a divergent barrier, and a block whose live threads
//     can all never proceed (e.g. half at a barrier, half at a shuffle that needs the others) is reported
//     as a deadlock instead of hanging;
//   - a warp intrinsic (__shfl*_sync, __ballot_sync, __syncwarp, ...): the lanes named in the mask meet,
//     then all get their results at once, computed from the values they brought (lockstep). A lane not in
//     its own mask, lanes of one warp at different intrinsics or masks, a width that is not a power of two,
//     and a shuffle that reads a lane outside the mask or one that has exited are reported;
//   - atomics and fences, so that spin-waits make progress and interleavings vary.
// Which runnable fiber goes next is drawn from a generator seeded by TP_EMU_SEED and the launch, so an
// order-dependent bug shows up for some seed, and any schedule can be replayed.
//
// Shared memory: each OS thread has a slot of the arena; `__shared__` variables are laid out there per block
// with 16-byte redzones between them (out-of-bounds shared accesses are reported), and every 4-byte word
// has a record of its last writer and last two readers (thread, barrier epoch, warp-sync clock, and which
// bytes, so threads sharing a word, e.g. neighbouring bf16 values, are not mistaken for a race). Racecheck:
// two accesses by different threads, at least one a write, with no __syncthreads between them (and, within
// one warp, no warp intrinsic both took part in) are a hazard, reported with the kernel, the two threads
// and the address. A read of a word no thread of the block has written is reported too.
#include "emu.h"
#include <algorithm>
#include <cinttypes>
#include <chrono>
#include <cstdlib>
#include <sys/mman.h>
#if !defined(__x86_64__) || defined(EMU_UCONTEXT)
#include <ucontext.h>
#endif

namespace emu {

// ----------------------------------------------------------------------------
// context switching

#if defined(__x86_64__) && !defined(EMU_UCONTEXT)
extern "C" void emu_switch(void** save_sp, void* load_sp);
extern "C" void emu_fiber_trampoline();
asm(R"(
    .text
    .globl emu_switch
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
    .globl emu_fiber_trampoline
    .type emu_fiber_trampoline, @function
emu_fiber_trampoline:
    movq %r12, %rdi
    call *%r13
    ud2
    .size emu_fiber_trampoline, .-emu_fiber_trampoline
)");
// a stack whose first switch "returns" into the trampoline, which calls fn(arg)
static void* ctx_make(uintptr_t top, void (*fn)(void*), void* arg) {
    uint64_t* sp = (uint64_t*)((top - 64) & ~(uintptr_t)15);
    uint32_t csr;
    uint16_t cw;
    asm volatile("stmxcsr %0" : "=m"(csr));
    asm volatile("fnstcw %0" : "=m"(cw));
    sp[0] = csr | ((uint64_t)cw << 32);
    sp[1] = 0;               // r15
    sp[2] = 0;               // r14
    sp[3] = (uint64_t)fn;    // r13
    sp[4] = (uint64_t)arg;   // r12
    sp[5] = 0;               // rbx
    sp[6] = 0;               // rbp
    sp[7] = (uint64_t)&emu_fiber_trampoline;
    return sp;
}
#else
// elsewhere (or with -DEMU_UCONTEXT, to test it): getcontext/makecontext/swapcontext, slower (swapcontext
// makes a system call to save the signal mask) but portable; see start_thread, yield and run_block
#endif

// ----------------------------------------------------------------------------
// the state of a block being run

enum State : uint8_t { T_NEW, T_READY, T_RUN, T_BAR, T_WARP, T_DONE };
constexpr size_t STACK_SIZE = 256 << 10;
constexpr uint16_t ATOMIC_TID = 0xffff;

struct Stack {
    uintptr_t lo, hi;  // the mapping: a guard page at lo, EmuThreadInfo at the top
};

struct Block;
struct Group {  // lanes of one warp meeting at a warp intrinsic
    bool used;
    int op;
    unsigned mask, arrived;
    int width;
    const char* file;
    int line;
};
struct Warp {
    unsigned exited;  // lanes that have returned (or do not exist in a partial last warp)
    Group groups[32];
};

struct Thread {
    int tid, lane, warp;
    State state;
    Block* B;
    Stack* stk;
    EmuThreadInfo* info;
    void* sp;
#if !defined(__x86_64__) || defined(EMU_UCONTEXT)
    ucontext_t uc;
#endif
    int bar_kind, bar_pred, bar_result, bar_line;
    const char* bar_file;
    Group* group;
    uint64_t wval, wres;
    int warg;
    const void* gsrc;  // emu_warp_gather: this lane's bytes (warg of them) and where all lanes' go
    void* gdst;
    uint32_t vc[32];  // racecheck: what this thread knows of each lane's clock (vc[lane] is its own)
};

struct ShVar {
    const void* key;
    size_t off, size;
    const char* name;
};
struct ShRec {  // one 4-byte word of shared memory
    uint32_t alloc;      // == the block's first epoch if the word belongs to a variable of the current block
    uint32_t w_epoch, w_clk;
    uint16_t w_tid;
    uint16_t r_tid[2];
    uint32_t r_epoch[2], r_clk[2];
    uint8_t w_mask, r_mask[2];  // which bytes of the word the access touched (threads may share a word, e.g. bf16)
    uintptr_t w_pc;
};

struct Exec;
struct Block {
    Exec* X;
    Launch* L;
    uint3 idx;
    int n;
    int live, at_bar;
    uint32_t first_epoch;
    bool tracking;  // vector clocks kept (once the block has shared memory)
    std::vector<ShVar> vars;
    size_t sh_next, static_bytes;
    uint64_t rng;
};

struct Exec {  // one per OS thread that runs kernels
    void* sched_sp;
#if !defined(__x86_64__) || defined(EMU_UCONTEXT)
    ucontext_t sched_uc;
#endif
    std::vector<Thread> th;
    std::vector<Warp> warps;
    std::vector<int> runnable;
    std::vector<Stack*> stacks;
    Block B;
    int slot;
    uintptr_t sh_base;
    ShRec* sh;
    uint32_t epoch;
};

static std::mutex g_pool_mu;
static std::vector<Stack*> g_stack_pool;
static std::vector<int> g_free_slots;
static int g_slots_used;

static Stack* stack_get(Exec* X) {
    if (!X->stacks.empty()) {
        Stack* s = X->stacks.back();
        X->stacks.pop_back();
        return s;
    }
    {
        std::lock_guard<std::mutex> lock(g_pool_mu);
        if (!g_stack_pool.empty()) {
            Stack* s = g_stack_pool.back();
            g_stack_pool.pop_back();
            return s;
        }
    }
    void* m = mmap(nullptr, STACK_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) fail("emulator out of memory", "cannot map a fiber stack");
    mprotect(m, 4096, PROT_NONE);  // a stack overflow faults instead of corrupting the neighbour
    Stack* s = new Stack{(uintptr_t)m, (uintptr_t)m + STACK_SIZE};
    return s;
}

static Exec* exec_new() {
    Exec* X = new Exec();
    X->th.resize(1024);
    X->warps.resize(32);
    X->runnable.reserve(1024);
    {
        std::lock_guard<std::mutex> lock(g_pool_mu);
        if (!g_free_slots.empty()) {
            X->slot = g_free_slots.back();
            g_free_slots.pop_back();
        } else {
            X->slot = g_slots_used++;
        }
    }
    if (X->slot >= SH_SLOTS) fail("emulator limit", "more than %d OS threads run kernels at once", SH_SLOTS);
    X->sh_base = g_sh_lo + (uintptr_t)X->slot * SH_SLOT;
    X->sh = (ShRec*)calloc(SH_SLOT / 4, sizeof(ShRec));
    X->epoch = 1;
    return X;
}

// an OS thread's Exec goes back to the pool when the thread ends (rank threads come and go)
struct ExecHolder {
    Exec* X = nullptr;
    ~ExecHolder() {
        if (!X) return;
        std::lock_guard<std::mutex> lock(g_pool_mu);
        for (Stack* s : X->stacks) g_stack_pool.push_back(s);
        g_free_slots.push_back(X->slot);
        free(X->sh);
        delete X;
    }
};
static thread_local ExecHolder t_exec;

static uint64_t rng_next(uint64_t* s) {
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static uint3 unflat(uint64_t i, dim3 d) {
    uint3 r;
    r.x = (unsigned)(i % d.x);
    r.y = (unsigned)(i / d.x % d.y);
    r.z = (unsigned)(i / ((uint64_t)d.x * d.y));
    return r;
}

static std::string fmt3(uint3 v) {
    char b[64];
    snprintf(b, sizeof(b), "(%u,%u,%u)", v.x, v.y, v.z);
    return b;
}

static std::string thread_name(Block* B, int tid) {
    char b[96];
    snprintf(b, sizeof(b), "thread %s (warp %d, lane %d)", fmt3(unflat(tid, B->L->cfg.block)).c_str(), tid / 32, tid % 32);
    return b;
}

std::string fiber_where() {
    Thread* T = t_fiber;
    Block* B = T->B;
    char b[512];
    snprintf(b, sizeof(b), "kernel %s (launched at %s:%d), device %d, block %s of grid %s, %s", B->L->name.c_str(), B->L->cfg.file,
             B->L->cfg.line, B->L->device, fmt3(B->idx).c_str(), fmt3({B->L->cfg.grid.x, B->L->cfg.grid.y, B->L->cfg.grid.z}).c_str(),
             thread_name(B, T->tid).c_str());
    return b;
}

static Thread* self(const char* what) {
    Thread* T = t_fiber;
    if (!T) fail("device function called from host code", "%s was used outside a kernel", what);
    return T;
}

static void yield(Thread* T) {
#if defined(__x86_64__) && !defined(EMU_UCONTEXT)
    emu_switch(&T->sp, T->B->X->sched_sp);
#else
    swapcontext(&T->uc, &T->B->X->sched_uc);
#endif
}

static void make_ready(Block* B, Thread* T) {
    T->state = T_READY;
    B->X->runnable.push_back(T->tid);
}

void yield_point() {
    Thread* T = t_fiber;
    if (!T) return;
    {
        RtGuard guard;
        make_ready(T->B, T);
    }
    yield(T);
}

// ----------------------------------------------------------------------------
// racecheck clocks: accesses in one barrier epoch by two lanes of a warp are ordered if a warp intrinsic
// both took part in lies between them (vector clocks over the 32 lanes)

static void start_tracking(Block* B) {
    B->tracking = true;
    for (int t = 0; t < B->n; t++) {
        Thread* T = &B->X->th[t];
        memset(T->vc, 0, sizeof(T->vc));
        T->vc[T->lane] = 1;
    }
}

static void warp_sync_clocks(Block* B, int warp, unsigned lanes) {
    uint32_t j[32] = {0};
    for (int l = 0; l < 32; l++)
        if (lanes >> l & 1) {
            Thread* T = &B->X->th[warp * 32 + l];
            for (int k = 0; k < 32; k++) j[k] = std::max(j[k], T->vc[k]);
        }
    for (int l = 0; l < 32; l++)
        if (lanes >> l & 1) {
            Thread* T = &B->X->th[warp * 32 + l];
            memcpy(T->vc, j, sizeof(j));
            T->vc[l] = j[l] + 1;
        }
}

// ----------------------------------------------------------------------------
// barriers

static void release_barrier(Block* B) {
    Exec* X = B->X;
    Thread* first = nullptr;
    int count = 0, all = 1, any = 0;
    for (int t = 0; t < B->n; t++) {
        Thread* T = &X->th[t];
        if (T->state != T_BAR) continue;
        if (!first) first = T;
        else if (T->bar_line != first->bar_line || strcmp(T->bar_file, first->bar_file) != 0 || T->bar_kind != first->bar_kind)
            fail("divergent __syncthreads", "%s waits at the barrier at %s:%d while %s waits at the one at %s:%d: threads of a block must "
                 "reach the same __syncthreads", thread_name(B, first->tid).c_str(), first->bar_file, first->bar_line,
                 thread_name(B, T->tid).c_str(), T->bar_file, T->bar_line);
        count += T->bar_pred != 0;
        all &= T->bar_pred != 0;
        any |= T->bar_pred != 0;
    }
    int result = first->bar_kind == EMU_BAR_COUNT ? count : (first->bar_kind == EMU_BAR_AND ? all : (first->bar_kind == EMU_BAR_OR ? any : 0));
    for (int t = 0; t < B->n; t++) {
        Thread* T = &X->th[t];
        if (T->state != T_BAR) continue;
        T->bar_result = result;
        make_ready(B, T);
    }
    B->at_bar = 0;
    X->epoch++;  // every access before the barrier happens before every access after it
}

}  // namespace emu

using namespace emu;

int emu_syncthreads(int kind, int pred, const char* file, int line) {
    Thread* T = self("__syncthreads");
    {
        RtGuard guard;  // (never held across a yield: the other fibers share this OS thread)
        Block* B = T->B;
        T->state = T_BAR;
        T->bar_kind = kind;
        T->bar_pred = pred;
        T->bar_file = file;
        T->bar_line = line;
        if (++B->at_bar == B->live) release_barrier(B);
    }
    yield(T);
    return T->bar_result;
}

void __threadfence(void) { yield_point(); }
void __threadfence_block(void) { yield_point(); }

void emu_trap(const char* file, int line) {
    fail("__trap", "device code called __trap() at %s:%d", file, line);
}

void emu_device_error(const char* kind, const char* what) {
    self(kind);
    t_pc = 0;
    fail(kind, "%s", what);
}

EmuThreadInfo* emu_thread_info(void) { return self("threadIdx/blockIdx/blockDim/gridDim")->info; }

// ----------------------------------------------------------------------------
// warp intrinsics

static void warp_arrive(Thread* T, int op, unsigned mask, uint64_t value, int arg, int width, const char* file, int line);

static const char* op_name(int op) {
    static const char* n[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync", "__ballot_sync",
                              "__any_sync", "__all_sync", "__syncwarp", "__reduce_add_sync", "__reduce_min_sync",
                              "__reduce_max_sync", "__reduce_and_sync", "__reduce_or_sync", "__reduce_xor_sync",
                              "a wmma operation"};
    return op >= 0 && op < 15 ? n[op] : "a warp intrinsic";
}

// the source lane of a shuffle, as PTX's shfl.sync defines it (segments of `width` lanes; out of range: own)
static int shfl_src(int op, int lane, int arg, int width) {
    int segmask = ~(width - 1) & 31, b = arg & 31;
    int min_lane = lane & segmask;
    int max_lane = op == EMU_SHFL_UP ? min_lane : (min_lane | (31 & ~segmask));
    int j;
    bool ok;
    switch (op) {
        case EMU_SHFL_UP: j = lane - b; ok = j >= max_lane; break;
        case EMU_SHFL_DOWN: j = lane + b; ok = j <= max_lane; break;
        case EMU_SHFL_XOR: j = lane ^ b; ok = j <= max_lane; break;
        default: j = min_lane | (b & ~segmask & 31); ok = j <= max_lane; break;
    }
    return ok ? j : lane;
}

static void complete_group(Block* B, int w, Group* g) {
    Exec* X = B->X;
    unsigned part = g->arrived;
    Thread* lanes[32] = {nullptr};
    for (int l = 0; l < 32; l++)
        if (part >> l & 1) lanes[l] = &X->th[w * 32 + l];
    uint64_t common = 0;
    bool sgn = false;
    switch (g->op) {
        case EMU_BALLOT:
        case EMU_ANY:
        case EMU_ALL: {
            unsigned b = 0;
            for (int l = 0; l < 32; l++)
                if (lanes[l] && lanes[l]->wval) b |= 1u << l;
            common = g->op == EMU_BALLOT ? b : (g->op == EMU_ANY ? b != 0 : b == part);
            break;
        }
        case EMU_REDUCE_ADD: case EMU_REDUCE_MIN: case EMU_REDUCE_MAX:
        case EMU_REDUCE_AND: case EMU_REDUCE_OR: case EMU_REDUCE_XOR: {
            bool first = true;
            uint32_t acc = 0;
            for (int l = 0; l < 32; l++) {
                if (!lanes[l]) continue;
                uint32_t v = (uint32_t)lanes[l]->wval;
                sgn = lanes[l]->warg != 0;
                if (first) { acc = v; first = false; continue; }
                switch (g->op) {
                    case EMU_REDUCE_ADD: acc += v; break;
                    case EMU_REDUCE_MIN: acc = sgn ? (uint32_t)std::min((int32_t)acc, (int32_t)v) : std::min(acc, v); break;
                    case EMU_REDUCE_MAX: acc = sgn ? (uint32_t)std::max((int32_t)acc, (int32_t)v) : std::max(acc, v); break;
                    case EMU_REDUCE_AND: acc &= v; break;
                    case EMU_REDUCE_OR: acc |= v; break;
                    default: acc ^= v; break;
                }
            }
            common = acc;
            break;
        }
        case EMU_GATHER:
            // the tensor cores take a warp's 32 lanes together: one that has returned leaves its part undefined
            for (int l = 0; l < 32; l++) {
                t_fiber = lanes[l] ? lanes[l] : t_fiber;
                if (!lanes[l])
                    fail("wmma operation without the whole warp", "a wmma operation at %s:%d: lane %d has already returned from "
                         "the kernel (every lane of the warp must take part)", g->file, g->line, l);
                if (lanes[l]->warg != lanes[0]->warg)
                    fail("lanes of a warp disagree at a wmma operation", "a wmma operation at %s:%d: lane %d brings %d bytes, lane 0 %d",
                         g->file, g->line, l, lanes[l]->warg, lanes[0]->warg);
            }
            for (int l = 0; l < 32; l++)
                for (int s = 0; s < 32; s++)
                    memcpy((char*)lanes[l]->gdst + (size_t)s * lanes[s]->warg, lanes[s]->gsrc, (size_t)lanes[s]->warg);
            break;
        default: break;
    }
    for (int l = 0; l < 32; l++) {
        Thread* T = lanes[l];
        if (!T) continue;
        if (g->op <= EMU_SHFL_XOR) {
            int j = shfl_src(g->op, l, T->warg, g->width);
            if (j != l && !(g->mask >> j & 1)) {
                t_fiber = T;
                t_pc = 0;
                fail("shuffle reads a lane outside its mask", "%s at %s:%d with mask 0x%08x: lane %d reads lane %d, which is not in the mask "
                     "(its value is undefined)", op_name(g->op), g->file, g->line, g->mask, l, j);
            }
            if (j != l && !lanes[j]) {
                t_fiber = T;
                t_pc = 0;
                fail("shuffle reads an exited lane", "%s at %s:%d with mask 0x%08x: lane %d reads lane %d, which has already returned "
                     "from the kernel (its value is undefined)", op_name(g->op), g->file, g->line, g->mask, l, j);
            }
            T->wres = lanes[j]->wval;
        } else {
            T->wres = common;
        }
    }
    if (B->tracking) warp_sync_clocks(B, w, part);
    for (int l = 0; l < 32; l++)
        if (lanes[l]) {
            lanes[l]->group = nullptr;
            make_ready(B, lanes[l]);
        }
    g->used = false;
}

// completes g if every lane of its mask that has not exited is there
static void try_complete(Block* B, int w, Group* g) {
    unsigned need = g->mask & ~B->X->warps[w].exited;
    if ((g->arrived & need) == need) complete_group(B, w, g);
}

uint64_t emu_warp_op(int op, unsigned mask, uint64_t value, int arg, int width, const char* file, int line) {
    Thread* T = self(op_name(op));
    warp_arrive(T, op, mask, value, arg, width, file, line);
    yield(T);
    return T->wres;
}

void emu_warp_gather(const void* mine, void* all, int bytes, const char* what, const char* file, int line) {
    Thread* T = self(what);
    T->gsrc = mine;
    T->gdst = all;
    warp_arrive(T, EMU_GATHER, 0xffffffffu, 0, bytes, 32, file, line);
    yield(T);
}

uint64_t emu_launch_seed(void) { return self("a wmma fragment")->B->L->seed; }

static void warp_arrive(Thread* T, int op, unsigned mask, uint64_t value, int arg, int width, const char* file, int line) {
    RtGuard guard;
    Block* B = T->B;
    Warp* W = &B->X->warps[T->warp];
    t_pc = 0;
    if (!(mask >> T->lane & 1))
        fail("warp intrinsic with a mask that leaves out the calling lane", "%s at %s:%d: lane %d calls it with mask 0x%08x, which does not "
             "include lane %d (a calling lane must be in the mask)", op_name(op), file, line, T->lane, mask, T->lane);
    if (width < 1 || width > 32 || (width & (width - 1)))
        fail("invalid shuffle width", "%s at %s:%d with width %d: the width must be a power of two from 1 to 32", op_name(op), file, line, width);
    Group* g = nullptr;
    for (Group& c : W->groups)
        if (c.used && (c.mask & mask)) {
            g = &c;
            break;
        }
    if (g && (g->mask != mask || g->op != op || g->width != width)) {
        unsigned other = g->arrived & ~(1u << T->lane);
        int l2 = other ? __builtin_ctz(other) : T->lane;
        fail("lanes of a warp disagree at a warp intrinsic", "lane %d calls %s with mask 0x%08x at %s:%d while lane %d waits in %s with mask "
             "0x%08x at %s:%d: every lane named in a mask must call the same intrinsic with the same mask", T->lane, op_name(op), mask,
             file, line, l2, op_name(g->op), g->mask, g->file, g->line);
    }
    if (!g) {
        for (Group& c : W->groups)
            if (!c.used) {
                g = &c;
                break;
            }
        *g = Group{true, op, mask, 0u, width, file, line};
    }
    g->arrived |= 1u << T->lane;
    T->group = g;
    T->wval = value;
    T->warg = arg;
    T->state = T_WARP;
    try_complete(B, T->warp, g);
}

// ----------------------------------------------------------------------------
// shared memory

static std::string shared_name(Block* B, size_t off) {
    char b[160];
    for (const ShVar& v : B->vars)
        if (off >= v.off && off < v.off + v.size) {
            snprintf(b, sizeof(b), "shared offset %zu = %s + %zu bytes", off, v.name, off - v.off);
            return b;
        }
    if (off < B->L->dyn_smem) {
        snprintf(b, sizeof(b), "shared offset %zu = dynamic shared memory + %zu bytes", off, off);
        return b;
    }
    const ShVar* near = nullptr;
    for (const ShVar& v : B->vars)
        if (v.off + v.size <= off && (!near || v.off > near->off)) near = &v;
    if (near) snprintf(b, sizeof(b), "shared offset %zu = %zu bytes past the end of %s (%zu bytes)", off, off - near->off - near->size, near->name, near->size);
    else if (B->L->dyn_smem) snprintf(b, sizeof(b), "shared offset %zu = %zu bytes past the end of the %zu bytes of dynamic shared memory", off, off - B->L->dyn_smem, B->L->dyn_smem);
    else snprintf(b, sizeof(b), "shared offset %zu, in no __shared__ variable (the launch asked for no dynamic shared memory)", off);
    return b;
}

static void mark_shared(Block* B, size_t off, size_t bytes) {
    ShRec* sh = B->X->sh;
    for (size_t w = off / 4; w < (off + bytes + 3) / 4; w++) sh[w].alloc = B->first_epoch;
}

void* emu_shared_static(const void* key, size_t bytes, size_t align, const char* name) {
    RtGuard guard;
    Thread* T = self("a __shared__ variable");
    Block* B = T->B;
    for (const ShVar& v : B->vars)
        if (v.key == key) return (void*)(B->X->sh_base + v.off);
    size_t off = (B->sh_next + align - 1) / align * align;
    B->static_bytes += bytes;
    if (B->static_bytes > SH_STATIC_MAX)
        fail("too much static shared memory", "kernel %s declares %zu bytes of static __shared__ memory (the last, %s, %zu bytes): nvcc "
             "refuses more than %zu", B->L->name.c_str(), B->static_bytes, name, bytes, SH_STATIC_MAX);
    size_t total_limit = B->L->dyn_limit > SH_DYN_DEFAULT ? SH_OPTIN_MAX : SH_DYN_DEFAULT;
    if (B->static_bytes + B->L->dyn_smem > total_limit)
        fail("too much shared memory", "kernel %s uses %zu bytes of static and %zu of dynamic shared memory, more than the %zu a block may "
             "have: a GPU refuses this launch (cudaErrorInvalidValue)", B->L->name.c_str(), B->static_bytes, B->L->dyn_smem, total_limit);
    if (off + bytes + 16 > SH_SLOT) fail("emulator limit", "the shared-memory slot of the emulator is full");
    mark_shared(B, off, bytes);
    B->vars.push_back(ShVar{key, off, bytes, name});
    B->sh_next = off + bytes + 16;  // a 16-byte redzone after every variable
    if (!B->tracking) start_tracking(B);
    return (void*)(B->X->sh_base + off);
}

void* emu_shared_dynamic(void) { return (void*)self("extern __shared__ memory")->B->X->sh_base; }

namespace emu {

static bool ordered(Thread* T, uint16_t other, uint32_t clk) {
    if (other == ATOMIC_TID || other / 32 != T->warp) return false;
    return T->B->tracking && T->vc[other % 32] >= clk;
}

[[noreturn]] static void race(Thread* T, const char* kind, const char* verb, uint16_t other, const char* other_verb, size_t off,
                              size_t n, uintptr_t other_pc) {
    Block* B = T->B;
    std::string them = other == ATOMIC_TID ? std::string("an atomic of another thread") : thread_name(B, other);
    std::string at = other_pc ? addr2line(other_pc) : "";
    fail(kind, "%s %s %zu bytes at %s, which %s %s in the same barrier interval, with no __syncthreads (or, within a warp, no "
         "__syncwarp or other warp intrinsic) between them%s%s", thread_name(B, T->tid).c_str(), verb, n, shared_name(B, off).c_str(),
         them.c_str(), other_verb, at.empty() ? "" : "\nthe earlier access: ", at.c_str());
}

void shared_access(uintptr_t a, size_t n, bool write, bool atomic, bool check_align) {
    Thread* T = t_fiber;
    Block* B = T->B;
    Exec* X = B->X;
    if (a < X->sh_base || a >= X->sh_base + SH_SLOT)
        fail("invalid shared memory access", "device code accessed shared memory at 0x%" PRIxPTR " that is not its own block's", a);
    size_t off = a - X->sh_base;
    if (check_align && n > 1 && (a & (n - 1)))
        fail("misaligned address", "a %zu-byte shared-memory %s needs a %zu-byte aligned address: %s", n, write ? "write" : "read", n,
             shared_name(B, off).c_str());
    for (size_t w = off / 4; w <= (off + n - 1) / 4; w++) {
        ShRec& r = X->sh[w];
        size_t lo = std::max(off, w * 4), hi = std::min(off + n, w * 4 + 4);
        uint8_t m = (uint8_t)(((1u << (hi - lo)) - 1u) << (lo - w * 4));  // the bytes of this word accessed
        if (r.alloc != B->first_epoch)
            fail("out-of-bounds shared memory access", "invalid %s of %zu bytes at %s", atomic ? "atomic" : (write ? "write" : "read"), n,
                 shared_name(B, w * 4 > off ? w * 4 : off).c_str());
        if (atomic || !write) {
            if (r.w_epoch < B->first_epoch)
                fail("read of uninitialised shared memory", "%s reads %zu bytes at %s, which no thread of the block has written yet "
                     "(a __syncthreads missing between the write and this read, or a part no thread writes)",
                     thread_name(B, T->tid).c_str(), n, shared_name(B, off).c_str());
        }
        // a conflict: another thread, the same barrier interval, overlapping bytes, not ordered within the warp
        bool w_conflict = r.w_epoch == X->epoch && r.w_tid != T->tid && (r.w_mask & m) && !ordered(T, r.w_tid, r.w_clk);
        uint32_t clk = T->vc[T->lane];
        if (atomic) {
            if (w_conflict && r.w_tid != ATOMIC_TID)
                race(T, "shared memory race (write-after-write hazard)", "atomically updates", r.w_tid, "wrote", off, n, r.w_pc);
            r.w_epoch = X->epoch;
            r.w_tid = ATOMIC_TID;
            r.w_mask = m;
            r.w_pc = t_pc;
            continue;
        }
        if (!write) {
            if (w_conflict) race(T, "shared memory race (read-after-write hazard)", "reads", r.w_tid, "wrote", off, n, r.w_pc);
            int slot = r.r_tid[0] == T->tid || r.r_epoch[0] != X->epoch ? 0 : 1;
            if (slot == 1) {  // keep the last two distinct readers
                r.r_tid[1] = r.r_tid[0];
                r.r_epoch[1] = r.r_epoch[0];
                r.r_clk[1] = r.r_clk[0];
                r.r_mask[1] = r.r_mask[0];
                slot = 0;
            }
            bool same = r.r_tid[0] == T->tid && r.r_epoch[0] == X->epoch;
            r.r_mask[0] = same ? (uint8_t)(r.r_mask[0] | m) : m;
            r.r_tid[0] = (uint16_t)T->tid;
            r.r_epoch[0] = X->epoch;
            r.r_clk[0] = clk;
        } else {
            if (w_conflict) race(T, "shared memory race (write-after-write hazard)", "writes", r.w_tid, "wrote", off, n, r.w_pc);
            for (int i = 0; i < 2; i++)
                if (r.r_epoch[i] == X->epoch && r.r_tid[i] != T->tid && (r.r_mask[i] & m) && !ordered(T, r.r_tid[i], r.r_clk[i]))
                    race(T, "shared memory race (write-after-read hazard)", "writes", r.r_tid[i], "read", off, n, 0);
            bool same = r.w_tid == T->tid && r.w_epoch == X->epoch && r.w_clk == clk;
            r.w_mask = same ? (uint8_t)(r.w_mask | m) : m;
            r.w_epoch = X->epoch;
            r.w_tid = (uint16_t)T->tid;
            r.w_clk = clk;
            r.w_pc = t_pc;
        }
    }
}

// ----------------------------------------------------------------------------
// running a kernel

static void fiber_main(void* arg) {
    Thread* T = (Thread*)arg;
    Block* B = T->B;
    Launch* L = B->L;
    // the arguments, copied onto this thread's own stack (a GPU thread sees its parameters as its own)
    size_t al = std::max<size_t>(L->args_align, 16);
    char* buf = (char*)alloca(L->args.size() + al);
    buf = (char*)(((uintptr_t)buf + al - 1) & ~(uintptr_t)(al - 1));
    dcopy(buf, L->args.data(), L->args.size());
    L->invoke(L->cfg.fn, buf);
    // the thread returned: it no longer holds up barriers or warp intrinsics
    t_rt++;  // (dropped by the scheduler when it frees the stack)
    T->state = T_DONE;
    B->live--;
    Warp* W = &B->X->warps[T->warp];
    W->exited |= 1u << T->lane;
    for (Group& g : W->groups)
        if (g.used && (g.mask >> T->lane & 1)) try_complete(B, T->warp, &g);
    if (B->at_bar > 0 && B->at_bar == B->live) release_barrier(B);
    yield(T);
    fail("emulator bug", "a finished GPU thread was resumed");
}

static void start_thread(Exec* X, Thread* T) {
    T->stk = stack_get(X);
    uintptr_t top = (T->stk->hi - sizeof(EmuThreadInfo)) & ~(uintptr_t)63;
    T->info = (EmuThreadInfo*)top;
    Launch* L = T->B->L;
    T->info->thread_idx = unflat(T->tid, L->cfg.block);
    T->info->block_idx = T->B->idx;
    T->info->block_dim = L->cfg.block;
    T->info->grid_dim = L->cfg.grid;
#if defined(__x86_64__) && !defined(EMU_UCONTEXT)
    T->sp = ctx_make(top, fiber_main, T);
#else
    getcontext(&T->uc);
    T->uc.uc_stack.ss_sp = (void*)(T->stk->lo + 4096);
    T->uc.uc_stack.ss_size = top - (T->stk->lo + 4096);
    T->uc.uc_link = nullptr;
    makecontext(&T->uc, (void (*)())fiber_main, 1, T);
    T->sp = &T->uc;
#endif
}

[[noreturn]] static void deadlock(Block* B) {
    Exec* X = B->X;
    std::string s;
    Thread* any = nullptr;
    int nbar = 0;
    const Thread* bar = nullptr;
    for (int t = 0; t < B->n; t++) {
        Thread* T = &X->th[t];
        if (T->state == T_BAR) {
            nbar++;
            if (!bar) bar = T;
        }
        if (T->state == T_BAR || T->state == T_WARP) any = T;
    }
    if (bar) s += std::to_string(nbar) + " threads wait at __syncthreads at " + bar->bar_file + ":" + std::to_string(bar->bar_line) + "\n";
    for (int w = 0; w < (B->n + 31) / 32; w++)
        for (Group& g : X->warps[w].groups) {
            if (!g.used) continue;
            char b[320];
            unsigned missing = g.mask & ~g.arrived & ~X->warps[w].exited;
            snprintf(b, sizeof(b), "warp %d: lanes 0x%08x wait in %s (mask 0x%08x) at %s:%d for lanes 0x%08x, which are blocked elsewhere\n", w,
                     g.arrived, op_name(g.op), g.mask, g.file, g.line, missing);
            s += b;
        }
    t_fiber = any;
    t_pc = 0;
    fail("deadlock", "no thread of the block can proceed (%d of %d threads still running):\n%s", B->live, B->n, s.c_str());
}

static void run_block(Exec* X, Launch* L, uint3 idx, uint64_t seed) {
    Block* B = &X->B;
    B->X = X;
    B->L = L;
    B->idx = idx;
    B->n = (int)(L->cfg.block.x * L->cfg.block.y * L->cfg.block.z);
    B->live = B->n;
    B->at_bar = 0;
    B->rng = seed | 1;
    B->first_epoch = ++X->epoch;
    B->vars.clear();
    B->static_bytes = 0;
    B->tracking = false;
    B->sh_next = 0;
    if (L->dyn_smem) {
        mark_shared(B, 0, L->dyn_smem);
        B->sh_next = L->dyn_smem + 16;
        start_tracking(B);
    }
    X->runnable.clear();
    for (int t = 0; t < B->n; t++) {
        Thread* T = &X->th[t];
        T->tid = t;
        T->lane = t % 32;
        T->warp = t / 32;
        T->state = T_NEW;
        T->B = B;
        T->stk = nullptr;
        T->group = nullptr;
        X->runnable.push_back(t);
    }
    for (int w = 0; w < (B->n + 31) / 32; w++) {
        int lanes = std::min(32, B->n - w * 32);
        X->warps[w].exited = lanes == 32 ? 0u : ~((1u << lanes) - 1u);  // lanes past the block's end never run
        for (Group& g : X->warps[w].groups) g.used = false;
    }
    while (B->live > 0) {
        if (X->runnable.empty()) deadlock(B);
        size_t i = rng_next(&B->rng) % X->runnable.size();
        Thread* T = &X->th[X->runnable[i]];
        X->runnable[i] = X->runnable.back();
        X->runnable.pop_back();
        if (T->state == T_NEW) start_thread(X, T);
        T->state = T_RUN;
        t_fiber = T;
        t_stack_lo = T->stk->lo;
        t_stack_hi = T->stk->hi;
#if defined(__x86_64__) && !defined(EMU_UCONTEXT)
        emu_switch(&X->sched_sp, T->sp);
#else
        swapcontext(&X->sched_uc, (ucontext_t*)T->sp);
#endif
        t_fiber = nullptr;
        if (T->state == T_DONE) {
            t_rt--;
            X->stacks.push_back(T->stk);
            T->stk = nullptr;
        }
    }
}

static uint64_t gcd(uint64_t a, uint64_t b) {
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

// kernels running now, for the watchdog: a kernel that never ends (a loop that does not terminate, a
// spin-wait on something no thread will do) is reported after TP_EMU_HANG_S seconds instead of hanging
struct Running {
    Exec* X;
    Launch* L;
    double since;
};
static std::mutex g_running_mu;
static std::vector<Running> g_running;

static void watchdog() {
    for (;;) {
        std::this_thread::sleep_for(std::chrono::seconds(1));
        std::lock_guard<std::mutex> lock(g_running_mu);
        for (const Running& r : g_running)
            if (now_s() - r.since > g_cfg.hang_s)
                fail("hang", "kernel %s (launched at %s:%d) has run for more than %.0f s (TP_EMU_HANG_S): a loop that never ends? Block %s "
                     "was running; %d of its %d threads had not returned", r.L->name.c_str(), r.L->cfg.file, r.L->cfg.line, g_cfg.hang_s,
                     fmt3(r.X->B.idx).c_str(), r.X->B.live, r.X->B.n);
    }
}

void run_launch(Launch* L) {
    static std::once_flag started;
    std::call_once(started, [] { std::thread(watchdog).detach(); });
    if (!t_exec.X) t_exec.X = exec_new();
    Exec* X = t_exec.X;
    {
        std::lock_guard<std::mutex> lock(g_running_mu);
        g_running.push_back(Running{X, L, now_s()});
    }
    int prev_dev = t_exec_dev;
    t_exec_dev = L->device;
    dim3 g = L->cfg.grid;
    uint64_t nb = (uint64_t)g.x * g.y * g.z;
    // blocks in a seeded order: i -> (a i + c) mod nb, a coprime with nb (GPUs promise no block order)
    uint64_t rng = L->seed | 1;
    uint64_t a = 1, c = 0;
    if (nb > 1) {
        a = rng_next(&rng) % nb;
        for (int tries = 0; tries < 64 && (a == 0 || gcd(a, nb) != 1); tries++) a = rng_next(&rng) % nb;
        if (a == 0 || gcd(a, nb) != 1) a = 1;
        c = rng_next(&rng) % nb;
    }
    for (uint64_t i = 0; i < nb; i++) {
        uint64_t b = (uint64_t)(((unsigned __int128)a * i + c) % nb);
        run_block(X, L, unflat(b, g), L->seed ^ (b * 0x9E3779B97F4A7C15ull));
    }
    t_exec_dev = prev_dev;
    std::lock_guard<std::mutex> lock(g_running_mu);
    for (size_t i = 0; i < g_running.size(); i++)
        if (g_running[i].X == X) {
            g_running.erase(g_running.begin() + i);
            break;
        }
}

}  // namespace emu
