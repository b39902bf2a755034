// runtime.cpp: the emulated GPU's memory, memcheck and CUDA runtime API (streams, events, copies, devices).
//
// Compiled without instrumentation. The code under test is compiled with -fsanitize=thread code
// generation but linked without libtsan: its __tsan_read4(addr) etc. calls land here, and so every load
// and store of the program is checked against the arena (emu.h):
//   - by device code (a fiber, see exec.cpp): bounds, use after free, natural alignment (a float4 at an
//     address that is not 16-byte aligned), reads of never-written memory, access to another device's
//     memory without peer access, and any access to host memory other than the fiber's own stack and the
//     program's static data (a host pointer passed to a kernel);
//   - by host code: any access to device memory (a host dereference of a device pointer), and access to
//     pinned host memory that a queued async copy still reads or writes (a missing stream sync).
// Errors are reported once, in one block naming the kernel, block, thread and allocation offset, and the
// process exits with status 86, like compute-sanitizer --error-exitcode.
//
// Streams run lazily: queued work executes only when something waits for it, in the waiting thread, so a
// host read that forgot to wait sees stale data on the emulator as it might on a GPU.
#include "emu.h"
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdlib>
#include <map>
#include <memory>
#include <sys/mman.h>
#include <unistd.h>

extern "C" void* __real_memcpy(void* d, const void* s, size_t n);
extern "C" void* __real_memmove(void* d, const void* s, size_t n);
extern "C" void* __real_memset(void* d, int c, size_t n);
extern char __executable_start[], _end[];  // the program image: static data device code may read

namespace emu {

Config g_cfg;
uintptr_t g_lo, g_span, g_pin_lo, g_sh_lo, g_hi;
uint8_t* g_shadow;
bool g_peer[MAX_DEV][MAX_DEV];
thread_local Thread* t_fiber;
thread_local const OpCtx* t_op;
thread_local uintptr_t t_pc;
thread_local int t_exec_dev;
thread_local int t_rt;
thread_local uintptr_t t_stack_lo, t_stack_hi;
static thread_local int t_cur_dev;
static thread_local cudaError_t t_last_err = cudaSuccess;

void dcopy(void* dst, const void* src, size_t n) { if (n) __real_memmove(dst, src, n); }
void dset(void* dst, int v, size_t n) { if (n) __real_memset(dst, v, n); }

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

static double env_num(const char* name, double dflt) {
    const char* v = getenv(name);
    return v && *v ? atof(v) : dflt;
}

// ----------------------------------------------------------------------------
// the arena: one reservation (address space only; pages are backed when touched)

static std::once_flag g_once;

void init() {
    std::call_once(g_once, [] {
        g_cfg.ndev = (int)env_num("TP_EMU_DEVICES", 2);
        if (g_cfg.ndev < 0 || g_cfg.ndev > MAX_DEV) {
            fprintf(stderr, "tp-emu: TP_EMU_DEVICES=%d is out of range 0..%d\n", g_cfg.ndev, MAX_DEV);
            _exit(2);
        }
        g_cfg.seed = (uint64_t)env_num("TP_EMU_SEED", 1);
        g_cfg.lt_refuse = env_num("TP_EMU_LT_REFUSE", 0) != 0;
        g_cfg.hang_s = env_num("TP_EMU_HANG_S", 300);
        g_cfg.mem_limit = (size_t)(env_num("TP_EMU_MEM_GB", 8) * (1 << 30));
        size_t dev_span = (size_t)MAX_DEV << DEV_SHIFT;
        size_t total = dev_span + PIN_SPAN + SH_SLOT * SH_SLOTS;
        void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        size_t shadow_bytes = (dev_span + PIN_SPAN) / 8;
        void* sh = mmap(nullptr, shadow_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED || sh == MAP_FAILED) {
            fprintf(stderr, "tp-emu: cannot reserve %zu GB of address space for the emulated devices\n", total >> 30);
            _exit(2);
        }
        g_shadow = (uint8_t*)sh;
        g_pin_lo = (uintptr_t)p + dev_span;
        g_sh_lo = g_pin_lo + PIN_SPAN;
        g_hi = (uintptr_t)p + total;
        g_lo = (uintptr_t)p;
        __atomic_store_n(&g_span, total, __ATOMIC_RELEASE);  // from now on the hooks see the arena
    });
}

// ----------------------------------------------------------------------------
// allocations: bump allocation per device, never reused, so freed memory stays recognisable

static std::mutex g_alloc_mu;
static std::map<uintptr_t, Alloc*> g_allocs;  // by base
static uintptr_t g_next[MAX_DEV + 1];         // [MAX_DEV]: pinned
static size_t g_used[MAX_DEV];
static long g_nallocs;
constexpr size_t GAP = 512;  // unaddressable bytes between allocations

static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

Alloc* find_alloc(uintptr_t a) {
    std::lock_guard<std::mutex> lock(g_alloc_mu);
    auto it = g_allocs.upper_bound(a);
    if (it == g_allocs.begin()) return nullptr;
    --it;
    Alloc* al = it->second;
    return a < al->base + std::max<size_t>(al->size, 1) ? al : nullptr;
}

Alloc* nearest_alloc(uintptr_t a) {
    std::lock_guard<std::mutex> lock(g_alloc_mu);
    auto it = g_allocs.upper_bound(a);
    Alloc* after = it == g_allocs.end() ? nullptr : it->second;
    Alloc* before = it == g_allocs.begin() ? nullptr : std::prev(it)->second;
    if (!before) return after;
    if (!after) return before;
    return a - (before->base + before->size) <= after->base - a ? before : after;
}

// marks [base, base+size) addressable; `init` false marks it never written
static void shadow_mark(uintptr_t base, size_t size, bool init) {
    uint8_t* s = shadow_of(base);
    size_t full = size / 8;
    dset(s, init ? SH_FULL : (SH_FULL | SH_UNINIT), full);
    if (size % 8) s[full] = (uint8_t)((size % 8) | (init ? 0 : SH_UNINIT));
}

static void* alloc_in(int dev, size_t size, bool pinned) {
    uintptr_t region = pinned ? g_pin_lo : g_lo + ((uintptr_t)dev << DEV_SHIFT);
    size_t span = pinned ? PIN_SPAN : (size_t)1 << DEV_SHIFT;
    int slot = pinned ? MAX_DEV : dev;
    std::lock_guard<std::mutex> lock(g_alloc_mu);
    if (!g_next[slot]) g_next[slot] = region + 65536;
    uintptr_t base = round_up(g_next[slot], 256);
    size_t rounded = round_up(std::max<size_t>(size, 1), 256);
    if (base + rounded + GAP > region + span) return nullptr;
    g_next[slot] = base + rounded + GAP;
    Alloc* al = new Alloc{base, size, pinned ? -1 : dev, false, ++g_nallocs};
    g_allocs[base] = al;
    if (!pinned) g_used[dev] += rounded;
    shadow_mark(base, size, pinned);
    // never-written device memory holds NaNs (all bits set), so a read the checks let through
    // (e.g. a copy to the host) still shows up as NaN rather than as plausible zeros
    dset((void*)base, pinned ? 0 : 0xff, size);
    return (void*)base;
}

static void free_alloc(Alloc* al) {
    std::lock_guard<std::mutex> lock(g_alloc_mu);
    al->freed = true;
    dset(shadow_of(al->base), SH_FREED, round_up(std::max<size_t>(al->size, 1), 8) / 8);
    if (al->device >= 0) g_used[al->device] -= round_up(std::max<size_t>(al->size, 1), 256);
    // give the pages back; the address range stays reserved (and shadowed as freed)
    uintptr_t lo = round_up(al->base, 4096), hi = (al->base + al->size) & ~(uintptr_t)4095;
    if (hi > lo) madvise((void*)lo, hi - lo, MADV_DONTNEED);
}

// ----------------------------------------------------------------------------
// reports

std::string addr2line(uintptr_t pc) {
    if (!pc) return "";
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "addr2line -f -C -i -e /proc/%d/exe 0x%" PRIxPTR " 2>/dev/null", (int)getpid(), pc - 1);
    FILE* f = popen(cmd, "r");
    if (!f) return "";
    std::string out, fn;
    char line[1024];
    bool want_fn = true;
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = 0;
        if (want_fn) fn = line;
        else out += std::string(out.empty() ? "" : "\n=========     inlined into ") + fn + " at " + line;
        want_fn = !want_fn;
    }
    pclose(f);
    return out;
}

std::string describe_addr(uintptr_t a) {
    char buf[512];
    if (a >= g_sh_lo && a < g_hi) {
        snprintf(buf, sizeof(buf), "0x%" PRIxPTR " (shared memory)", a);
        return buf;
    }
    if (!in_arena(a)) {
        snprintf(buf, sizeof(buf), "0x%" PRIxPTR " (host memory)", a);
        return buf;
    }
    Alloc* al = find_alloc(a);
    bool inside = al != nullptr;
    if (!al) al = nearest_alloc(a);
    if (!al) {
        snprintf(buf, sizeof(buf), "0x%" PRIxPTR ", in no allocation", a);
        return buf;
    }
    char owner[96];
    if (al->device >= 0) snprintf(owner, sizeof(owner), "device %d", al->device);
    else snprintf(owner, sizeof(owner), "pinned host memory");
    const char* state = al->freed ? "freed " : "";
    if (inside)
        snprintf(buf, sizeof(buf), "0x%" PRIxPTR " is at offset %" PRIuPTR " of a %s%zu-byte allocation (%s, allocation #%ld at 0x%" PRIxPTR ")",
                 a, a - al->base, state, al->size, owner, al->id, al->base);
    else if (a >= al->base + al->size)
        snprintf(buf, sizeof(buf), "0x%" PRIxPTR " is %" PRIuPTR " bytes past the end of a %s%zu-byte allocation (offset %" PRIuPTR "; %s, allocation #%ld at 0x%" PRIxPTR ")",
                 a, a - (al->base + al->size), state, al->size, a - al->base, owner, al->id, al->base);
    else
        snprintf(buf, sizeof(buf), "0x%" PRIxPTR " is %" PRIuPTR " bytes before a %s%zu-byte allocation (%s, allocation #%ld at 0x%" PRIxPTR ")",
                 a, al->base - a, state, al->size, owner, al->id, al->base);
    return buf;
}

void fail(const char* kind, const char* fmt, ...) {
    static thread_local bool failing = false;
    if (failing) {  // a check failed inside a report: say what the first one was, and stop
        static const char msg[] = "========= tp-emu ERROR (a second error while reporting the first)\n";
        if (write(2, msg, sizeof(msg) - 1) < 0) {}
        _exit(EXIT_CODE);
    }
    failing = true;
    t_rt++;
    static std::mutex once;
    once.lock();  // never released: the first report ends the process
    fflush(stdout);
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    std::string out = std::string("========= tp-emu ERROR: ") + kind + "\n";
    for (char* line = strtok(msg, "\n"); line; line = strtok(nullptr, "\n")) out += std::string("=========   ") + line + "\n";
    if (t_fiber) out += "=========   in " + fiber_where() + "\n";
    else if (t_op) out += std::string("=========   in ") + t_op->what + " on device " + std::to_string(t_op->device) + " (a queued stream operation)\n";
    else out += "=========   in host code\n";
    std::string at = addr2line(t_pc);
    if (!at.empty()) out += "=========   at " + at + "\n";
    out += "=========   schedule seed " + std::to_string(g_cfg.seed) + " (set TP_EMU_SEED to change it)\n";
    fputs(out.c_str(), stderr);
    fflush(stderr);
    _exit(EXIT_CODE);
}

// ----------------------------------------------------------------------------
// memcheck

// scans the shadow of [a, a+n): reports the first unaddressable, freed or (for reads) never-written byte;
// marks written bytes as written
static void scan(uintptr_t a, size_t n, bool write, bool need_init, const char* access) {
    uintptr_t end = a + n;
    for (uintptr_t g = a & ~(uintptr_t)7; g < end; g += 8) {
        uint8_t* s = shadow_of(g);
        if (*s == SH_FULL) continue;
        uintptr_t lo = std::max(g, a), hi = std::min(g + 8, end);
        if (*s == SH_NONE) fail("out-of-bounds access", "%s\n%s", access, describe_addr(lo).c_str());
        if (*s == SH_FREED) fail("use after free", "%s\n%s", access, describe_addr(lo).c_str());
        unsigned k = *s & 0xf;
        if (hi - g > k) fail("out-of-bounds access", "%s\n%s", access, describe_addr(g + k > lo ? g + k : lo).c_str());
        if (*s & SH_UNINIT) {
            if (need_init) fail("read of uninitialised device memory", "%s\n%s: never written since cudaMalloc", access, describe_addr(lo).c_str());
            if (write) *s = (uint8_t)k;
        }
    }
}

static const char* rw(bool write, bool atomic) { return atomic ? "atomic" : (write ? "write" : "read"); }

void device_access(uintptr_t a, size_t n, bool write, bool atomic, bool check_align) {
    if (a >= g_sh_lo) {
        shared_access(a, n, write, atomic, check_align);
        return;
    }
    char access[256];
    snprintf(access, sizeof(access), "invalid %s of %zu bytes by device code", rw(write, atomic), n);
    if (check_align && n > 1 && (a & (n - 1)))
        fail("misaligned address", "%s: a %zu-byte access needs a %zu-byte aligned address\n%s", access, n, n, describe_addr(a).c_str());
    if (is_device_addr(a)) {
        int d = dev_of(a);
        if (d != t_exec_dev && !g_peer[t_exec_dev][d])
            fail("peer access not enabled", "%s on device %d to memory of device %d, without cudaDeviceEnablePeerAccess(%d) on device %d\n%s",
                 access, t_exec_dev, d, d, t_exec_dev, describe_addr(a).c_str());
    }
    scan(a, n, write || atomic, !write || atomic, access);
}

// pinned host memory that queued async copies will read (the host must not write it) or write (the host
// must not touch it) before the stream is synchronised
struct Pending {
    uintptr_t lo, hi;
    bool device_writes;
    std::string what;
};
static std::mutex g_pending_mu;
static std::vector<Pending*> g_pending;
static std::atomic<int> g_npending{0};

static void pending_add(Pending* p) {
    std::lock_guard<std::mutex> lock(g_pending_mu);
    g_pending.push_back(p);
    g_npending++;
}
static void pending_remove(Pending* p) {
    std::lock_guard<std::mutex> lock(g_pending_mu);
    g_pending.erase(std::find(g_pending.begin(), g_pending.end(), p));
    g_npending--;
    delete p;
}

static void host_access(uintptr_t a, size_t n, bool write) {
    if (is_device_addr(a))
        fail("host access to device memory", "host code %s %zu bytes of device memory: a device pointer was dereferenced on the host (copy the data with cudaMemcpy)\n%s",
             write ? "wrote" : "read", n, describe_addr(a).c_str());
    if (a >= g_sh_lo) fail("host access to shared memory", "host code %s shared memory at 0x%" PRIxPTR, write ? "wrote" : "read", a);
    char access[128];
    snprintf(access, sizeof(access), "invalid host %s of %zu bytes of pinned host memory", write ? "write" : "read", n);
    scan(a, n, false, false, access);
    if (g_npending.load() == 0) return;
    std::lock_guard<std::mutex> lock(g_pending_mu);
    for (Pending* p : g_pending)
        if (a < p->hi && a + n > p->lo && (p->device_writes || write))
            fail("host access to memory of a queued async copy",
                 "host code %s pinned memory that %s still %s: the stream was not synchronised before the host used the buffer\n%s",
                 write ? "wrote" : "read", p->what.c_str(), p->device_writes ? "writes" : "reads", describe_addr(a).c_str());
}

void check_range(const void* p, size_t n, bool write, bool need_init, Peer rule, const char* operand) {
    if (n == 0) return;
    uintptr_t a = (uintptr_t)p;
    const char* what = t_op ? t_op->what : "a runtime call";
    int dev = t_op ? t_op->device : cur_device();
    if (!in_arena(a) || a >= g_sh_lo)
        fail("invalid pointer", "%s: %s (%zu bytes at %p) is not memory of the emulated devices (a host pointer?)", what, operand, n, p);
    if (is_device_addr(a)) {
        int d = dev_of(a);
        if (rule == PEER_KERNEL && d != dev && !g_peer[dev][d])
            fail("peer access not enabled", "%s on device %d reads or writes %s on device %d without cudaDeviceEnablePeerAccess\n%s", what, dev,
                 operand, d, describe_addr(a).c_str());
    }
    char access[256];
    snprintf(access, sizeof(access), "%s: invalid %s of %s, %zu bytes from %p", what, write ? "write" : "read", operand, n, p);
    scan(a, n, write, need_init, access);
}

void copy_init(void* dst, const void* src, size_t n) {
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    if (!is_device_addr(d)) return;
    if (!is_device_addr(s) || (d & 7) != (s & 7)) {  // from the host, or not granule-aligned alike: all written
        scan(d, n, true, false, "copy");
        return;
    }
    for (size_t off = 0; off < n; off += 8 - ((d + off) & 7)) {
        uint8_t *sd = shadow_of(d + off), *ss = shadow_of(s + off);
        size_t cover = std::min<size_t>(8 - ((d + off) & 7), n - off);
        bool whole = ((d + off) & 7) == 0 && cover == 8;
        if (whole && (*ss & SH_UNINIT) && *ss != SH_FREED) *sd |= SH_UNINIT;
        else if (*sd != SH_FREED) *sd &= (uint8_t)~SH_UNINIT;
    }
}

}  // namespace emu

using namespace emu;

// ----------------------------------------------------------------------------
// the instrumentation hooks (the calls -fsanitize=thread code generation emits). The fast path is one
// compare: an address outside the arena, from host code, is none of our business.

static void offarena_device(uintptr_t a, size_t n, bool write, uintptr_t pc) {
    if (a - t_stack_lo < t_stack_hi - t_stack_lo) return;  // the fiber's own stack
    // the emulator's own code, which may run instrumented copies of inline library functions (the linker
    // keeps one copy of each, possibly the instrumented one)
    if (t_rt) return;
    if (a - (uintptr_t)__executable_start < (uintptr_t)_end - (uintptr_t)__executable_start) return;  // static data
    t_pc = pc;
    fail("device access to host memory", "invalid %s of %zu bytes at 0x%" PRIxPTR " by device code: this is host memory, which a GPU cannot "
         "access (a host pointer passed to a kernel?)", write ? "write" : "read", n, a);
}

static inline __attribute__((always_inline)) void hook(void* p, size_t n, bool write, bool aligned, uintptr_t pc) {
    uintptr_t a = (uintptr_t)p;
    if (__builtin_expect(a - g_lo >= g_span, 1)) {
        if (__builtin_expect(t_fiber != nullptr, 0)) offarena_device(a, n, write, pc);
        return;
    }
    if (t_rt) return;
    t_pc = pc;
    if (t_fiber) {
        // the common case of device code on its own device's memory: one shadow byte says all
        if (a < g_pin_lo && n <= 8 && (a & (n - 1)) == 0 && *shadow_of(a) == SH_FULL && dev_of(a) == t_exec_dev) return;
        RtGuard guard;  // the checks' own host allocations are not device accesses
        device_access(a, n, write, false, aligned);
    } else if (!t_op) {  // (while a stream operation runs, only the emulator's own code runs)
        host_access(a, n, write);
    }
}

#define PC ((uintptr_t)__builtin_return_address(0))
extern "C" {
void __tsan_init() { init(); }
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_read1(void* p) { hook(p, 1, false, true, PC); }
void __tsan_read2(void* p) { hook(p, 2, false, true, PC); }
void __tsan_read4(void* p) { hook(p, 4, false, true, PC); }
void __tsan_read8(void* p) { hook(p, 8, false, true, PC); }
void __tsan_read16(void* p) { hook(p, 16, false, true, PC); }
void __tsan_write1(void* p) { hook(p, 1, true, true, PC); }
void __tsan_write2(void* p) { hook(p, 2, true, true, PC); }
void __tsan_write4(void* p) { hook(p, 4, true, true, PC); }
void __tsan_write8(void* p) { hook(p, 8, true, true, PC); }
void __tsan_write16(void* p) { hook(p, 16, true, true, PC); }
// accesses the compiler could not prove aligned (packed data, memcpy-based punning): no alignment check
void __tsan_unaligned_read2(void* p) { hook(p, 2, false, false, PC); }
void __tsan_unaligned_read4(void* p) { hook(p, 4, false, false, PC); }
void __tsan_unaligned_read8(void* p) { hook(p, 8, false, false, PC); }
void __tsan_unaligned_read16(void* p) { hook(p, 16, false, false, PC); }
void __tsan_unaligned_write2(void* p) { hook(p, 2, true, false, PC); }
void __tsan_unaligned_write4(void* p) { hook(p, 4, true, false, PC); }
void __tsan_unaligned_write8(void* p) { hook(p, 8, true, false, PC); }
void __tsan_unaligned_write16(void* p) { hook(p, 16, true, false, PC); }
void __tsan_read_range(void* p, unsigned long n) { if (n) hook(p, n, false, false, PC); }
void __tsan_write_range(void* p, unsigned long n) { if (n) hook(p, n, true, false, PC); }
void __tsan_vptr_update(void** p, void*) { hook(p, 8, true, true, PC); }
void __tsan_vptr_read(void** p) { hook(p, 8, false, true, PC); }
void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
}

// atomics: checked as a read-modify-write of natural alignment (device code: also bounds and the
// never-written check; shared memory: no race records, atomics do not race with each other), then done
// with the real atomic builtin
static inline void atomic_hook(volatile void* p, size_t n, bool write, uintptr_t pc) {
    uintptr_t a = (uintptr_t)p;
    if (__builtin_expect(a - g_lo >= g_span, 1)) {
        if (__builtin_expect(t_fiber != nullptr, 0)) offarena_device(a, n, true, pc);
        return;
    }
    if (t_rt) return;
    t_pc = pc;
    RtGuard guard;
    if (t_fiber) device_access(a, n, write, write, true);
    else if (!t_op) host_access(a, n, write);
}
#define EMU_TSAN_ATOMIC(BITS, T)                                                                                      \
    extern "C" T __tsan_atomic##BITS##_load(const volatile T* a, int) { atomic_hook((volatile void*)a, sizeof(T), false, PC); return __atomic_load_n(a, __ATOMIC_SEQ_CST); } \
    extern "C" void __tsan_atomic##BITS##_store(volatile T* a, T v, int) { atomic_hook(a, sizeof(T), true, PC); __atomic_store_n(a, v, __ATOMIC_SEQ_CST); } \
    extern "C" T __tsan_atomic##BITS##_exchange(volatile T* a, T v, int) { atomic_hook(a, sizeof(T), true, PC); return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); } \
    extern "C" T __tsan_atomic##BITS##_fetch_add(volatile T* a, T v, int) { atomic_hook(a, sizeof(T), true, PC); return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); } \
    extern "C" T __tsan_atomic##BITS##_fetch_sub(volatile T* a, T v, int) { atomic_hook(a, sizeof(T), true, PC); return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); } \
    extern "C" T __tsan_atomic##BITS##_fetch_and(volatile T* a, T v, int) { atomic_hook(a, sizeof(T), true, PC); return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST); } \
    extern "C" T __tsan_atomic##BITS##_fetch_or(volatile T* a, T v, int) { atomic_hook(a, sizeof(T), true, PC); return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); } \
    extern "C" T __tsan_atomic##BITS##_fetch_xor(volatile T* a, T v, int) { atomic_hook(a, sizeof(T), true, PC); return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST); } \
    extern "C" T __tsan_atomic##BITS##_fetch_nand(volatile T* a, T v, int) { atomic_hook(a, sizeof(T), true, PC); return __atomic_fetch_nand(a, v, __ATOMIC_SEQ_CST); } \
    extern "C" int __tsan_atomic##BITS##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) {              \
        atomic_hook(a, sizeof(T), true, PC);                                                                          \
        return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                        \
    }                                                                                                                 \
    extern "C" int __tsan_atomic##BITS##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) {                \
        atomic_hook(a, sizeof(T), true, PC);                                                                          \
        return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                        \
    }                                                                                                                 \
    extern "C" T __tsan_atomic##BITS##_compare_exchange_val(volatile T* a, T c, T v, int, int) {                    \
        atomic_hook(a, sizeof(T), true, PC);                                                                          \
        __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                              \
        return c;                                                                                                     \
    }
EMU_TSAN_ATOMIC(8, uint8_t)
EMU_TSAN_ATOMIC(16, uint16_t)
EMU_TSAN_ATOMIC(32, uint32_t)
EMU_TSAN_ATOMIC(64, uint64_t)

// memcpy, memset and memmove of the code under test (linked with --wrap): checked as ranges, so that a
// host memcpy from a device pointer is reported as the host dereference it is
static inline void range_hook(const void* p, size_t n, bool write, uintptr_t pc) {
    uintptr_t a = (uintptr_t)p;
    if (n == 0 || t_rt) return;  // the emulator's own copies
    if (__builtin_expect(a - g_lo >= g_span, 1) && !t_fiber) return;
    if (!t_fiber && t_op) return;  // the runtime's own copies, while it runs a stream operation
    hook((void*)p, n, write, false, pc);
}
extern "C" void* __wrap_memcpy(void* d, const void* s, size_t n) {
    range_hook(s, n, false, PC);
    range_hook(d, n, true, PC);
    return __real_memcpy(d, s, n);
}
extern "C" void* __wrap_memmove(void* d, const void* s, size_t n) {
    range_hook(s, n, false, PC);
    range_hook(d, n, true, PC);
    return __real_memmove(d, s, n);
}
extern "C" void* __wrap_memset(void* d, int c, size_t n) {
    range_hook(d, n, true, PC);
    return __real_memset(d, c, n);
}

// ----------------------------------------------------------------------------
// errors, devices

namespace emu {
int cur_device() { return t_cur_dev; }
}

static cudaError_t ret(cudaError_t e) {
    if (e != cudaSuccess) t_last_err = e;  // as CUDA does: a failing call also sets the last error
    return e;
}

// every API entry: the arena exists, and the call is host code
static void api(const char* name) {
    init();
    if (t_fiber) fail("runtime API called from device code", "%s was called inside a kernel", name);
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = t_last_err;
    t_last_err = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return t_last_err; }

static const struct { cudaError_t e; const char* name; const char* text; } g_errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
    {cudaErrorPeerAccessAlreadyEnabled, "cudaErrorPeerAccessAlreadyEnabled", "peer access is already enabled"},
    {cudaErrorPeerAccessNotEnabled, "cudaErrorPeerAccessNotEnabled", "peer access has not been enabled"},
    {cudaErrorMisalignedAddress, "cudaErrorMisalignedAddress", "misaligned address"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};
const char* cudaGetErrorString(cudaError_t e) {
    for (auto& x : g_errors)
        if (x.e == e) return x.text;
    return "unrecognized error code";
}
const char* cudaGetErrorName(cudaError_t e) {
    for (auto& x : g_errors)
        if (x.e == e) return x.name;
    return "cudaErrorUnknown";
}

cudaError_t cudaGetDeviceCount(int* count) {
    api("cudaGetDeviceCount");
    if (!count) return ret(cudaErrorInvalidValue);
    *count = g_cfg.ndev;
    return g_cfg.ndev > 0 ? cudaSuccess : ret(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int d) {
    api("cudaSetDevice");
    if (d < 0 || d >= g_cfg.ndev) return ret(g_cfg.ndev ? cudaErrorInvalidDevice : cudaErrorNoDevice);
    t_cur_dev = d;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int* d) {
    api("cudaGetDevice");
    if (!d) return ret(cudaErrorInvalidValue);
    if (g_cfg.ndev == 0) return ret(cudaErrorNoDevice);
    *d = t_cur_dev;
    return cudaSuccess;
}

static const size_t TOTAL_MEM = (size_t)80 << 30;

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
    api("cudaGetDeviceProperties");
    if (!p) return ret(cudaErrorInvalidValue);
    if (d < 0 || d >= g_cfg.ndev) return ret(cudaErrorInvalidDevice);
    memset(p, 0, sizeof(*p));
    // the limits of an H100 (compute capability 9.0), which the launch checks enforce
    snprintf(p->name, sizeof(p->name), "tp emulated GPU %d (sm_90 limits, running on the CPU)", d);
    p->totalGlobalMem = TOTAL_MEM;
    p->sharedMemPerBlock = SH_STATIC_MAX;
    p->sharedMemPerBlockOptin = SH_OPTIN_MAX;
    p->sharedMemPerMultiprocessor = 228 << 10;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024;
    p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = 65535;
    p->maxGridSize[2] = 65535;
    p->multiProcessorCount = 132;
    p->maxThreadsPerMultiProcessor = 2048;
    p->major = 9;
    p->minor = 0;
    p->l2CacheSize = 50 << 20;
    p->unifiedAddressing = 1;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_b, size_t* total_b) {
    api("cudaMemGetInfo");
    if (!free_b || !total_b) return ret(cudaErrorInvalidValue);
    if (g_cfg.ndev == 0) return ret(cudaErrorNoDevice);
    std::lock_guard<std::mutex> lock(g_alloc_mu);
    *total_b = TOTAL_MEM;
    *free_b = TOTAL_MEM - g_used[t_cur_dev];
    return cudaSuccess;
}

// device d sits on PCI bus d of the one emulated machine: every process of an mpirun job on this machine
// sees the same devices under the same ids, as on a real machine, so tp's check that no two ranks of a
// communicator share a GPU compares ids across processes as it would on GPUs
cudaError_t cudaDeviceGetPCIBusId(char* id, int len, int d) {
    api("cudaDeviceGetPCIBusId");
    if (!id || len <= 0) return ret(cudaErrorInvalidValue);
    if (d < 0 || d >= g_cfg.ndev) return ret(g_cfg.ndev ? cudaErrorInvalidDevice : cudaErrorNoDevice);
    snprintf(id, (size_t)len, "00000000:%02X:00.0", 0x10 + d);
    return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int* can, int d, int e) {
    api("cudaDeviceCanAccessPeer");
    if (!can) return ret(cudaErrorInvalidValue);
    if (d < 0 || d >= g_cfg.ndev || e < 0 || e >= g_cfg.ndev) return ret(cudaErrorInvalidDevice);
    *can = d != e;  // as CUDA: a device is not its own peer
    return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int e, unsigned flags) {
    api("cudaDeviceEnablePeerAccess");
    int d = t_cur_dev;
    if (flags != 0) return ret(cudaErrorInvalidValue);
    if (e < 0 || e >= g_cfg.ndev || e == d) return ret(cudaErrorInvalidDevice);
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    if (g_peer[d][e]) return ret(cudaErrorPeerAccessAlreadyEnabled);
    g_peer[d][e] = true;
    return cudaSuccess;
}

cudaError_t cudaDeviceDisablePeerAccess(int e) {
    api("cudaDeviceDisablePeerAccess");
    int d = t_cur_dev;
    if (e < 0 || e >= g_cfg.ndev || e == d) return ret(cudaErrorInvalidDevice);
    if (!g_peer[d][e]) return ret(cudaErrorPeerAccessNotEnabled);
    g_peer[d][e] = false;
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// streams

static std::mutex g_streams_mu;
static std::vector<Stream*> g_streams;  // every stream ever made (handles stay valid to be recognised as destroyed)
static Stream* g_legacy[MAX_DEV];

static Stream* new_stream(int dev, unsigned flags, bool legacy) {
    Stream* s = new Stream();
    s->magic = STREAM_MAGIC;
    s->device = dev;
    s->flags = flags;
    s->legacy = legacy;
    s->destroyed = false;
    s->next_seq = 1;
    s->done_seq = 0;
    s->running = false;
    std::lock_guard<std::mutex> lock(g_streams_mu);
    s->id = (int)g_streams.size();
    g_streams.push_back(s);
    return s;
}

namespace emu {

Stream* get_stream(cudaStream_t h, cudaError_t* err) {
    if (h == nullptr || h == cudaStreamLegacy) {
        static std::mutex legacy_mu;
        int d = t_cur_dev;
        std::lock_guard<std::mutex> lock(legacy_mu);
        if (!g_legacy[d]) g_legacy[d] = new_stream(d, cudaStreamDefault, true);
        return g_legacy[d];
    }
    Stream* s = (Stream*)h;
    if (s->magic != STREAM_MAGIC || s->destroyed) {
        *err = cudaErrorInvalidResourceHandle;
        return nullptr;
    }
    return s;
}

std::string stream_name(Stream* s) {
    if (s->legacy) return "the default stream of device " + std::to_string(s->device);
    return "stream #" + std::to_string(s->id) + " of device " + std::to_string(s->device);
}

uint64_t last_seq(Stream* s) {
    std::lock_guard<std::mutex> lock(s->mu);
    return s->next_seq - 1;
}

// Work on the legacy default stream waits for all blocking streams of its device, and work on a blocking
// stream waits for the legacy stream; non-blocking streams (cudaStreamNonBlocking) wait for neither.
static std::vector<std::pair<Stream*, uint64_t>> legacy_deps(Stream* s) {
    std::vector<std::pair<Stream*, uint64_t>> deps;
    if (s->flags & cudaStreamNonBlocking) return deps;
    std::vector<Stream*> all;
    {
        std::lock_guard<std::mutex> lock(g_streams_mu);
        all = g_streams;
    }
    for (Stream* o : all) {
        if (o == s || o->device != s->device || o->destroyed || (o->flags & cudaStreamNonBlocking)) continue;
        if (s->legacy == o->legacy) continue;
        uint64_t last = last_seq(o);
        if (last > 0) deps.push_back({o, last});
    }
    return deps;
}

uint64_t enqueue(Stream* s, const std::string& what, std::function<bool(bool)> fn,
                 const std::vector<std::pair<Stream*, uint64_t>>& after) {
    Op* op = new Op();
    op->what = what;
    op->run = std::move(fn);
    op->deps = legacy_deps(s);
    op->deps.insert(op->deps.end(), after.begin(), after.end());
    std::lock_guard<std::mutex> lock(s->mu);
    op->seq = s->next_seq++;
    s->q.push_back(op);
    return op->seq;
}

bool run_stream(Stream* s, uint64_t upto, bool block) {
    {
        std::unique_lock<std::mutex> lock(s->mu);
        double t0 = now_s();
        while (s->running && s->done_seq < upto) {
            if (s->runner == std::this_thread::get_id() || !block) return false;  // re-entered, or a query
            s->cv.wait_for(lock, std::chrono::milliseconds(100));
            if (now_s() - t0 > g_cfg.hang_s)
                fail("hang", "waited %.0f s for %s, which another thread is running (TP_EMU_HANG_S)", g_cfg.hang_s, stream_name(s).c_str());
        }
        if (s->done_seq >= upto) return true;
        s->running = true;
        s->runner = std::this_thread::get_id();
    }
    for (;;) {
        Op* op;
        {
            std::lock_guard<std::mutex> lock(s->mu);
            if (s->done_seq >= upto || s->q.empty()) break;
            op = s->q.front();
        }
        bool ok = true;
        for (auto& d : op->deps) ok = ok && run_stream(d.first, d.second, block);
        if (ok) {
            OpCtx ctx = {op->what.c_str(), s->device};
            const OpCtx* prev = t_op;
            t_op = &ctx;
            ok = op->run(block);
            t_op = prev;
        }
        if (!ok) break;
        std::lock_guard<std::mutex> lock(s->mu);
        s->q.pop_front();
        s->done_seq = op->seq;
        delete op;
    }
    std::lock_guard<std::mutex> lock(s->mu);
    s->running = false;
    s->cv.notify_all();
    return s->done_seq >= upto;
}

}  // namespace emu

// runs every stream of device d (-1: all devices) to its end
static void drain_device(int d) {
    std::vector<Stream*> all;
    {
        std::lock_guard<std::mutex> lock(g_streams_mu);
        all = g_streams;
    }
    for (Stream* s : all)
        if (!s->destroyed && (d < 0 || s->device == d)) run_stream(s, last_seq(s), true);
}

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
    api("cudaStreamCreateWithFlags");
    if (!s || (flags & ~1u)) return ret(cudaErrorInvalidValue);
    if (g_cfg.ndev == 0) return ret(cudaErrorNoDevice);
    *s = (cudaStream_t)new_stream(t_cur_dev, flags, false);
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t h) {
    api("cudaStreamDestroy");
    cudaError_t e = cudaSuccess;
    Stream* s = h ? get_stream(h, &e) : nullptr;
    if (!s || s->legacy) return ret(cudaErrorInvalidResourceHandle);
    run_stream(s, last_seq(s), true);  // queued work still runs, as on a GPU
    s->destroyed = true;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t h) {
    api("cudaStreamSynchronize");
    cudaError_t e = cudaSuccess;
    Stream* s = get_stream(h, &e);
    if (!s) return ret(e);
    run_stream(s, last_seq(s), true);
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t h) {
    api("cudaStreamQuery");
    cudaError_t e = cudaSuccess;
    Stream* s = get_stream(h, &e);
    if (!s) return ret(e);
    return run_stream(s, last_seq(s), false) ? cudaSuccess : ret(cudaErrorNotReady);
}

cudaError_t cudaDeviceSynchronize(void) {
    api("cudaDeviceSynchronize");
    if (g_cfg.ndev == 0) return ret(cudaErrorNoDevice);
    drain_device(t_cur_dev);
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// events: a marker operation on the stream; timestamps are emulated time (when the marker ran)

struct CUevent_st {
    uint32_t magic;
    unsigned flags;
    int device;
    Stream* s;
    uint64_t seq, gen;
    bool recorded, done, destroyed;
    double t;
};
constexpr uint32_t EVENT_MAGIC = 0x45564e54u;
static std::mutex g_event_mu;

static CUevent_st* get_event(cudaEvent_t e) {
    return e && e->magic == EVENT_MAGIC && !e->destroyed ? e : nullptr;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
    api("cudaEventCreateWithFlags");
    if (!e || (flags & ~3u)) return ret(cudaErrorInvalidValue);
    if (g_cfg.ndev == 0) return ret(cudaErrorNoDevice);
    CUevent_st* ev = new CUevent_st();
    ev->magic = EVENT_MAGIC;
    ev->flags = flags;
    ev->device = t_cur_dev;
    *e = ev;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t h, cudaStream_t sh) {
    api("cudaEventRecord");
    CUevent_st* e = get_event(h);
    cudaError_t err = cudaSuccess;
    Stream* s = get_stream(sh, &err);
    if (!e || !s) return ret(cudaErrorInvalidResourceHandle);
    if (s->device != e->device) return ret(cudaErrorInvalidResourceHandle);  // event and stream on different devices
    uint64_t gen;
    {
        std::lock_guard<std::mutex> lock(g_event_mu);
        gen = ++e->gen;
        e->recorded = true;
        e->done = false;
        e->s = s;
    }
    uint64_t seq = enqueue(s, "cudaEventRecord", [e, gen](bool) {
        std::lock_guard<std::mutex> lock(g_event_mu);
        if (e->gen == gen) {
            e->done = true;
            e->t = now_s();
        }
        return true;
    });
    std::lock_guard<std::mutex> lock(g_event_mu);
    if (e->gen == gen) e->seq = seq;
    return cudaSuccess;
}

// the stream and marker of e's latest record, or false if it is done (or never recorded)
static bool event_pending(CUevent_st* e, Stream** s, uint64_t* seq) {
    std::lock_guard<std::mutex> lock(g_event_mu);
    if (!e->recorded || e->done) return false;
    *s = e->s;
    *seq = e->seq;
    return true;
}

cudaError_t cudaEventQuery(cudaEvent_t h) {
    api("cudaEventQuery");
    CUevent_st* e = get_event(h);
    if (!e) return ret(cudaErrorInvalidResourceHandle);
    Stream* s;
    uint64_t seq;
    if (!event_pending(e, &s, &seq)) return cudaSuccess;
    run_stream(s, seq, false);
    return event_pending(e, &s, &seq) ? ret(cudaErrorNotReady) : cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t h) {
    api("cudaEventSynchronize");
    CUevent_st* e = get_event(h);
    if (!e) return ret(cudaErrorInvalidResourceHandle);
    Stream* s;
    uint64_t seq;
    if (event_pending(e, &s, &seq)) run_stream(s, seq, true);
    return cudaSuccess;
}

// Work queued on `sh` after this call waits for the event's latest record (as it stands now; a later
// record does not move it), on any device. A never-recorded event or a finished one adds no wait. Lazy
// streams make a missing wait visible: the waiting stream runs the other stream's work first only
// because of this dependency, so without it a reader sees what the other stream has not yet written.
cudaError_t cudaStreamWaitEvent(cudaStream_t sh, cudaEvent_t h, unsigned flags) {
    api("cudaStreamWaitEvent");
    CUevent_st* e = get_event(h);
    cudaError_t err = cudaSuccess;
    Stream* s = get_stream(sh, &err);
    if (!e || !s) return ret(cudaErrorInvalidResourceHandle);
    if (flags != 0) return ret(cudaErrorInvalidValue);
    std::vector<std::pair<Stream*, uint64_t>> after;
    Stream* es;
    uint64_t seq;
    if (event_pending(e, &es, &seq) && es != s) after.push_back({es, seq});
    enqueue(s, "cudaStreamWaitEvent", [](bool) { return true; }, after);
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
    api("cudaEventElapsedTime");
    CUevent_st *e0 = get_event(a), *e1 = get_event(b);
    if (!ms) return ret(cudaErrorInvalidValue);
    if (!e0 || !e1) return ret(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::mutex> lock(g_event_mu);
    if ((e0->flags | e1->flags) & cudaEventDisableTiming || e0->device != e1->device) return ret(cudaErrorInvalidResourceHandle);
    if (!e0->recorded || !e1->recorded) return ret(cudaErrorInvalidResourceHandle);
    if (!e0->done || !e1->done) return ret(cudaErrorNotReady);
    *ms = (float)((e1->t - e0->t) * 1e3);
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t h) {
    api("cudaEventDestroy");
    CUevent_st* e = get_event(h);
    if (!e) return ret(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::mutex> lock(g_event_mu);
    e->destroyed = true;  // kept: a queued marker may still point at it
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// memory

cudaError_t cudaMalloc(void** p, size_t size) {
    api("cudaMalloc");
    if (!p) return ret(cudaErrorInvalidValue);
    if (g_cfg.ndev == 0) return ret(cudaErrorNoDevice);
    *p = nullptr;
    if (size == 0) return cudaSuccess;
    int d = t_cur_dev;
    {
        std::lock_guard<std::mutex> lock(g_alloc_mu);
        if (g_used[d] + round_up(size, 256) > std::min(g_cfg.mem_limit, TOTAL_MEM)) {
            fprintf(stderr, "tp-emu: cudaMalloc of %.1f MiB on device %d refused: the emulator keeps each device under TP_EMU_MEM_GB=%.0f\n",
                    size / 1048576.0, d, g_cfg.mem_limit / 1073741824.0);
            return ret(cudaErrorMemoryAllocation);
        }
    }
    *p = alloc_in(d, size, false);
    return *p ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}

// the live allocation starting at p, of the kind asked for
static Alloc* alloc_at(void* p, bool pinned) {
    Alloc* al = find_alloc((uintptr_t)p);
    if (!al || al->freed || al->base != (uintptr_t)p || (al->device < 0) != pinned) return nullptr;
    return al;
}

cudaError_t cudaFree(void* p) {
    api("cudaFree");
    if (!p) return cudaSuccess;
    Alloc* al = alloc_at(p, false);
    if (!al) return ret(cudaErrorInvalidValue);  // not from cudaMalloc, or freed already
    drain_device(al->device);  // cudaFree synchronises the device: queued work may still use the memory
    free_alloc(al);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, size_t size) {
    api("cudaMallocHost");
    if (!p) return ret(cudaErrorInvalidValue);
    *p = alloc_in(0, std::max<size_t>(size, 1), true);
    return *p ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeHost(void* p) {
    api("cudaFreeHost");
    if (!p) return cudaSuccess;
    Alloc* al = alloc_at(p, true);
    if (!al) return ret(cudaErrorInvalidValue);
    drain_device(-1);
    free_alloc(al);
    return cudaSuccess;
}

enum MemKind { M_HOST, M_PINNED, M_DEV };
static MemKind classify(const void* p) {
    uintptr_t a = (uintptr_t)p;
    if (is_device_addr(a)) return M_DEV;
    if (is_pinned_addr(a)) return M_PINNED;
    if (in_arena(a)) fail("invalid pointer", "a copy or memset was given a shared-memory address (0x%" PRIxPTR ")", a);
    return M_HOST;
}
static const char* kind_name(int k) {
    static const char* n[] = {"cudaMemcpyHostToHost", "cudaMemcpyHostToDevice", "cudaMemcpyDeviceToHost", "cudaMemcpyDeviceToDevice", "cudaMemcpyDefault"};
    return k >= 0 && k <= 4 ? n[k] : "an invalid cudaMemcpyKind";
}
static const char* mem_name(MemKind k) { return k == M_DEV ? "device memory" : (k == M_PINNED ? "pinned host memory" : "pageable host memory"); }

// cudaMemcpy(Async) with the real synchronisation rules. sync: cudaMemcpy (legacy stream, returns when done).
static cudaError_t memcpy_impl(const char* api_name, void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t sh, bool sync) {
    api(api_name);
    if ((int)kind < 0 || (int)kind > 4) return ret(cudaErrorInvalidMemcpyDirection);
    cudaError_t err = cudaSuccess;
    Stream* s = get_stream(sync ? nullptr : sh, &err);
    if (!s) return ret(err);
    if (n == 0) return cudaSuccess;
    if (!dst || !src) return ret(cudaErrorInvalidValue);
    MemKind md = classify(dst), ms = classify(src);
    bool dev_src = ms == M_DEV, dev_dst = md == M_DEV;
    bool ok = kind == cudaMemcpyDefault || (kind == cudaMemcpyHostToHost && !dev_src && !dev_dst) ||
              (kind == cudaMemcpyHostToDevice && !dev_src && dev_dst) || (kind == cudaMemcpyDeviceToHost && dev_src && !dev_dst) ||
              (kind == cudaMemcpyDeviceToDevice && dev_src && dev_dst);
    if (!ok)
        fail("copy in the wrong direction", "%s with %s, but the source is %s and the destination is %s", api_name, kind_name(kind),
             mem_name(ms), mem_name(md));
    char what[160];
    snprintf(what, sizeof(what), "%s (%s to %s, %zu bytes)", api_name, mem_name(ms), mem_name(md), n);
    if (!dev_src && !dev_dst) {  // host to host: synchronous
        if (ms == M_PINNED) check_range(src, n, false, false, PEER_COPY, "the source");
        if (md == M_PINNED) check_range(dst, n, true, false, PEER_COPY, "the destination");
        dcopy(dst, src, n);
        return cudaSuccess;
    }
    uint64_t seq;
    if (ms == M_HOST) {
        // from pageable memory the source is staged at the call, so the caller may reuse it at once
        std::shared_ptr<std::vector<char>> stage = std::make_shared<std::vector<char>>(n);
        dcopy(stage->data(), src, n);
        seq = enqueue(s, what, [dst, stage, n](bool) {
            check_range(dst, n, true, false, PEER_COPY, "the destination");
            dcopy(dst, stage->data(), n);
            return true;
        });
    } else {
        // pinned or device memory is read (and pinned memory written) when the copy runs
        Pending* pend = nullptr;
        if (ms == M_PINNED || md == M_PINNED) {
            pend = new Pending();
            uintptr_t h = (uintptr_t)(ms == M_PINNED ? src : dst);
            pend->lo = h;
            pend->hi = h + n;
            pend->device_writes = md == M_PINNED;
            pend->what = std::string(what) + " queued on " + stream_name(s);
            pending_add(pend);
        }
        seq = enqueue(s, what, [dst, src, n, pend, md](bool) {
            check_range(src, n, false, false, PEER_COPY, "the source");
            if (md != M_HOST) check_range(dst, n, true, false, PEER_COPY, "the destination");
            dcopy(dst, src, n);
            if (md == M_DEV) copy_init(dst, src, n);
            if (pend) pending_remove(pend);
            return true;
        });
    }
    // to pageable host memory the call returns only once the copy is done; cudaMemcpy always waits
    if (sync || md == M_HOST) run_stream(s, seq, true);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
    return memcpy_impl("cudaMemcpy", dst, src, n, kind, nullptr, true);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t s) {
    return memcpy_impl("cudaMemcpyAsync", dst, src, n, kind, s, false);
}

static cudaError_t memset_impl(const char* name, void* p, int v, size_t n, cudaStream_t sh) {
    api(name);
    cudaError_t err = cudaSuccess;
    Stream* s = get_stream(sh, &err);
    if (!s) return ret(err);
    if (n == 0) return cudaSuccess;
    if (classify(p) != M_DEV) fail("invalid pointer", "%s on %p, which is not device memory", name, p);
    char what[96];
    snprintf(what, sizeof(what), "%s (%zu bytes)", name, n);
    enqueue(s, what, [p, v, n](bool) {
        check_range(p, n, true, false, PEER_COPY, "the destination");
        dset(p, v, n);
        return true;
    });
    return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int v, size_t n) { return memset_impl("cudaMemset", p, v, n, nullptr); }
cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t s) { return memset_impl("cudaMemsetAsync", p, v, n, s); }

void emu_set_seed(unsigned long long s) {
    init();
    g_cfg.seed = s;
}

// ----------------------------------------------------------------------------
// kernel launches: the configuration is checked now, as a GPU's launch does, and the kernel is queued

static std::mutex g_func_mu;
static std::map<const void*, int> g_func_dyn;  // cudaFuncAttributeMaxDynamicSharedMemorySize per kernel

cudaError_t emu_func_set_attribute(const void* fn, cudaFuncAttribute attr, int value) {
    api("cudaFuncSetAttribute");
    if (!fn) return ret(cudaErrorInvalidDeviceFunction);
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return ret(cudaErrorInvalidValue);
    if (value < 0 || (size_t)value > SH_OPTIN_MAX) return ret(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lock(g_func_mu);
    g_func_dyn[fn] = value;
    return cudaSuccess;
}

void emu_launch_enqueue(const EmuLaunchConfig* cfg, void (*invoke)(const void*, void*), const void* args, size_t bytes, size_t align) {
    init();
    if (t_fiber) fail("kernel launch from device code", "%s was launched inside a kernel (dynamic parallelism is outside the emulated subset)", cfg->name);
    cudaError_t err = cudaSuccess;
    Stream* s = get_stream(cfg->stream, &err);
    if (!s) {
        ret(err);
        return;
    }
    if (s->device != t_cur_dev) {  // a stream of another device than the current one
        ret(cudaErrorInvalidResourceHandle);
        return;
    }
    dim3 b = cfg->block, g = cfg->grid;
    if (b.x == 0 || b.y == 0 || b.z == 0 || b.x > 1024 || b.y > 1024 || b.z > 64 || (uint64_t)b.x * b.y * b.z > 1024 ||
        g.x == 0 || g.y == 0 || g.z == 0 || g.x > 2147483647u || g.y > 65535 || g.z > 65535) {
        ret(cudaErrorInvalidConfiguration);
        return;
    }
    size_t limit = SH_DYN_DEFAULT;
    {
        std::lock_guard<std::mutex> lock(g_func_mu);
        auto it = g_func_dyn.find(cfg->fn);
        if (it != g_func_dyn.end()) limit = std::max(limit, (size_t)it->second);
    }
    if (cfg->smem > limit) {
        ret(cudaErrorInvalidValue);
        return;
    }
    Launch* L = new Launch();
    L->cfg = *cfg;
    L->name = cfg->name;
    L->invoke = invoke;
    L->args.assign((const char*)args, (const char*)args + bytes);
    L->args_align = align;
    L->device = s->device;
    L->dyn_smem = cfg->smem;
    L->dyn_limit = limit;
    uint64_t h = g_cfg.seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)s->id << 32) ^ last_seq(s);
    for (const char* c = cfg->name; *c; c++) h = (h ^ (uint8_t)*c) * 0x100000001B3ull;
    L->seed = h;
    enqueue(s, std::string("kernel ") + cfg->name, [L](bool) {
        run_launch(L);
        delete L;
        return true;
    });
}
