// emu.h: the internals shared by the emulated GPU's runtime files (dev/emu/runtime.cpp, exec.cpp, blas.cpp,
// nccl.cpp). These files are compiled WITHOUT instrumentation; the code under test (test_tp.cu and what it
// includes, test_emu.cu) is compiled with g++'s -fsanitize=thread code generation, whose calls
// (__tsan_read4(addr) before every 4-byte load, ...) land in runtime.cpp instead of libtsan.
//
// One address range (the arena) holds all emulated device memory, pinned host memory and the shared
// memory of the blocks being run, so "is this an emulated address" is one compare on every access:
//
//   g_lo                g_pin_lo            g_sh_lo                 g_hi
//   | device 0 | device 1 | ... | pinned host | shared-memory slots |
//
// A shadow byte per 8 bytes of device and pinned memory says how many of the 8 are addressable and whether
// they have been written (memcheck). Shared memory has per-word records for racecheck (exec.cpp).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include "fake_cuda/cuda_runtime.h"

namespace emu {

// ----------------------------------------------------------------------------
// configuration, from the environment (read once)

struct Config {
    int ndev;             // TP_EMU_DEVICES (default 2): NCCL at P=2 and shared-GPU TP both run
    uint64_t seed;        // TP_EMU_SEED (default 1): the fiber schedule and block order
    bool lt_refuse;       // TP_EMU_LT_REFUSE=1: cuBLASLt finds no algorithm
    double hang_s;        // TP_EMU_HANG_S (default 300): a blocking wait that long is reported as a hang
    size_t mem_limit;     // TP_EMU_MEM_GB (default 8) per device: beyond it cudaMalloc fails
};
extern Config g_cfg;
void init();  // idempotent

// ----------------------------------------------------------------------------
// the arena

constexpr int MAX_DEV = 8;
constexpr int DEV_SHIFT = 35;                   // 32 GB of address space per device
constexpr size_t PIN_SPAN = (size_t)16 << 30;   // pinned host memory
constexpr size_t SH_SLOT = 320 << 10;           // shared memory of one block: 227 KB + redzones
constexpr int SH_SLOTS = 256;                   // OS threads that run kernels (rank threads, test threads)
constexpr size_t SH_STATIC_MAX = 48 << 10;      // static shared memory per block (nvcc's limit)
constexpr size_t SH_DYN_DEFAULT = 48 << 10;     // dynamic shared memory without cudaFuncSetAttribute
constexpr size_t SH_OPTIN_MAX = 227 << 10;      // with it (H100: 232448 bytes)

extern uintptr_t g_lo, g_span, g_pin_lo, g_sh_lo, g_hi;
extern uint8_t* g_shadow;  // one byte per 8 bytes of [g_lo, g_sh_lo)
inline bool in_arena(uintptr_t a) { return a - g_lo < g_span; }
inline bool is_device_addr(uintptr_t a) { return a - g_lo < g_pin_lo - g_lo; }
inline bool is_pinned_addr(uintptr_t a) { return a - g_pin_lo < g_sh_lo - g_pin_lo; }
inline int dev_of(uintptr_t a) { return (int)((a - g_lo) >> DEV_SHIFT); }
inline uint8_t* shadow_of(uintptr_t a) { return g_shadow + ((a - g_lo) >> 3); }

// shadow byte: 0 never allocated; 1..8 that many leading bytes addressable (8: all); | SH_UNINIT: not
// yet written; SH_FREED: freed (addresses are never reused, so a use after free is always seen)
enum : uint8_t { SH_NONE = 0, SH_FULL = 8, SH_UNINIT = 0x40, SH_FREED = 0xFD };

struct Alloc {
    uintptr_t base;
    size_t size;
    int device;   // -1: pinned host memory
    bool freed;
    long id;      // the n-th allocation of the process, for reports
};
Alloc* find_alloc(uintptr_t a);     // the allocation containing a (live or freed), else nullptr
Alloc* nearest_alloc(uintptr_t a);  // the allocation closest to a, for "N bytes past the end of ..."
extern bool g_peer[MAX_DEV][MAX_DEV];  // g_peer[d][e]: device d's kernels may access device e's memory

// copies for the runtime's own use: they bypass the checks that the wrapped memcpy/memset apply to the
// code under test (see __wrap_memcpy in runtime.cpp)
void dcopy(void* dst, const void* src, size_t n);
void dset(void* dst, int v, size_t n);

// ----------------------------------------------------------------------------
// what is running on this OS thread: device code (a fiber), a stream operation, or host code

struct Thread;  // a GPU thread (exec.cpp)
extern thread_local Thread* t_fiber;  // set while device code runs
struct OpCtx {
    const char* what;  // e.g. "cudaMemcpyAsync (device to device)", "cublasGemmEx"
    int device;        // the device the operation runs on
};
extern thread_local const OpCtx* t_op;  // set while a stream operation runs
extern thread_local uintptr_t t_pc;     // the instruction that made the access being checked, for reports
extern thread_local int t_exec_dev;
// > 0 while the emulator's own code runs on behalf of device code (a barrier, a shuffle, a report): its
// memcpy calls on host memory are not device accesses
extern thread_local int t_rt;
struct RtGuard {
    RtGuard() { t_rt++; }
    ~RtGuard() { t_rt--; }
};     // while device code runs: its device (for the peer-access check)
extern thread_local uintptr_t t_stack_lo, t_stack_hi;  // while device code runs: the fiber's own stack

int cur_device();  // cudaSetDevice of this host thread

// ----------------------------------------------------------------------------
// reports: one block on stderr naming what, where (kernel, block, thread or the operation) and the
// schedule seed; then the process ends with status 86, as compute-sanitizer's --error-exitcode would
constexpr int EXIT_CODE = 86;
[[noreturn]] void fail(const char* kind, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
std::string describe_addr(uintptr_t a);  // "0x... is 4 bytes past the end of a 128-byte allocation (...)"
std::string fiber_where();               // "kernel k, device d, block (..), thread (..)" (exec.cpp)
std::string addr2line(uintptr_t pc);     // "function at file:line" of an instruction, if addr2line can say

// memcheck of an operation's own accesses: [p, p+n) read or written on behalf of t_op
enum Peer { PEER_COPY, PEER_KERNEL };  // copies may cross devices; kernels (and GEMMs) need peer access
void check_range(const void* p, size_t n, bool write, bool need_init, Peer rule, const char* operand);
void copy_init(void* dst, const void* src, size_t n);  // a device-to-device copy carries the written bits along

// the slow path of one access by device code to [a, a+n) of the arena (runtime.cpp), and to shared memory (exec.cpp)
void device_access(uintptr_t a, size_t n, bool write, bool atomic, bool check_align);
void shared_access(uintptr_t a, size_t n, bool write, bool atomic, bool check_align);

// ----------------------------------------------------------------------------
// streams: queues of operations that run only when someone waits for them (a sync, a blocking copy, an
// event sync), in the waiting thread; a query runs what can run without blocking

struct Stream;
struct Op {
    uint64_t seq;
    std::string what;
    // runs the operation; with block false it may return false (only a collective whose peers have not
    // arrived does), and is called again later
    std::function<bool(bool block)> run;
    // run these first: the legacy default stream's ordering, and the record an event wait names
    std::vector<std::pair<Stream*, uint64_t>> deps;
};
struct Stream {
    uint32_t magic;
    int device;
    unsigned flags;
    bool legacy;     // the device's default (NULL) stream
    bool destroyed;
    int id;
    std::mutex mu;                 // guards q, next_seq, done_seq, runner
    std::condition_variable cv;    // a runner finished
    std::deque<Op*> q;
    uint64_t next_seq, done_seq;
    bool running;
    std::thread::id runner;
};
constexpr uint32_t STREAM_MAGIC = 0x57524d53u;
Stream* get_stream(cudaStream_t s, cudaError_t* err);  // NULL: the legacy stream of the current device
// queues fn on s, after the operations `after` of other streams (cudaStreamWaitEvent's dependency)
uint64_t enqueue(Stream* s, const std::string& what, std::function<bool(bool)> fn,
                 const std::vector<std::pair<Stream*, uint64_t>>& after = {});
// runs s up to and including operation `upto`; true when done. block false: never waits.
bool run_stream(Stream* s, uint64_t upto, bool block);
uint64_t last_seq(Stream* s);
std::string stream_name(Stream* s);

// kernels (exec.cpp)
struct Launch {
    EmuLaunchConfig cfg;
    std::string name;
    void (*invoke)(const void* fn, void* args);
    std::vector<char> args;  // the converted arguments, copied at launch
    size_t args_align;
    int device;
    size_t dyn_smem, dyn_limit;
    uint64_t seed;
};
void run_launch(Launch* L);  // all blocks, on the calling thread
void yield_point();          // in device code: lets the scheduler run another thread (atomics, fences)

// the emulated TF32 rounding: round to nearest even, keeping 10 explicit mantissa bits
inline float tf32_round(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return x;  // inf, nan
    u += 0xfffu + ((u >> 13) & 1u);
    u &= ~0x1fffu;
    float r;
    memcpy(&r, &u, 4);
    return r;
}

double now_s();

}  // namespace emu
