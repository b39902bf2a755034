// common/cpu_pool.h: the worker threads of a CPU rank, and the floating-point mode of every thread that
// computes on the CPU.
//
// A rank thread owns a pool of threads - 1 workers (cpu_pool_start, from rank_init). cpu_for(n, body)
// splits [0, n) into chunks; the caller and the workers take chunks from a shared counter until none is
// left, so a thread that the OS has descheduled (another process on its core) holds up nobody: the
// others, the caller included, take its share. Every index is run by exactly one thread, and nothing an
// op computes depends on which thread runs an index, so results are bit-identical for any thread count.
// A cpu_for inside a chunk (a gemm inside attention's loop over heads) runs serially in that thread.
//
// Waiting never starves a busy neighbour: an idle worker, and a caller waiting for the last chunks,
// spin on a cache line for at most CPU_POOL_SPIN_US microseconds, then sleep on a condition variable
// until there is work. (OpenMP's default is to spin for hundreds of thousands of iterations at every
// barrier, which on a loaded machine takes the core from the very thread being waited for; its spin
// count is read from the environment when libgomp loads, before main could change it.)
//
// Denormals: every thread that computes sets flush-to-zero and denormals-are-zero (cpu_fp_mode_set), so
// a tiny gradient never takes the slow path of the FPU: the main thread before main, a rank thread in
// cpu_pool_start, a worker when it starts. New threads inherit the mode of the thread that creates
// them on Linux, but each sets it itself, so nothing depends on that.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#define CPU_POOL_SPIN_US 50    // how long a waiting thread spins before it sleeps
#define CPU_POOL_CHUNKS 8      // chunks per thread of a cpu_for, so a slowed thread's share is taken up

// ----------------------------------------------------------------------------
// flush-to-zero (MXCSR bit 15) and denormals-are-zero (bit 6) on x86; other CPUs keep their default

#define CPU_FTZ_DAZ 0x8040u
static inline void cpu_fp_mode_set() {
#if defined(__SSE__)
    _mm_setcsr(_mm_getcsr() | CPU_FTZ_DAZ);
#endif
}
// whether the calling thread computes with flush-to-zero and denormals-are-zero (true where not x86)
static inline bool cpu_fp_mode_on() {
#if defined(__SSE__)
    return (_mm_getcsr() & CPU_FTZ_DAZ) == CPU_FTZ_DAZ;
#else
    return true;
#endif
}
// the main thread, before main and before any thread exists
static const bool g_cpu_fp_mode_main = (cpu_fp_mode_set(), true);

static inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#else
    std::this_thread::yield();
#endif
}

// ----------------------------------------------------------------------------
// the pool

struct CpuPool {
    int nthreads = 1;                  // workers + the owning thread
    std::vector<std::thread> workers;
    // the current job: run(ctx, lo, hi) over [0, n) in chunks of `chunk`
    // (atomics, read relaxed: the acquire of `next` that hands a thread its chunk orders them; plain fields
    // would be written by the owner for the next job while a late worker may still look at them)
    std::atomic<void (*)(void*, long, long)> run{nullptr};
    std::atomic<void*> ctx{nullptr};
    std::atomic<long> n{0}, chunk{1};
    std::atomic<long> nchunks{0};      // atomic: a worker late for the last job reads it before it knows
    // next: (generation << 32) | the next chunk to take; a worker takes chunks of its generation only
    std::atomic<unsigned long> next{0};
    std::atomic<long> done{0};         // chunks finished in this generation
    std::atomic<int> sleepers{0};      // workers asleep (or about to be) on `work`
    std::atomic<bool> owner_sleeps{false};
    std::atomic<bool> stop{false};
    std::mutex mu;
    std::condition_variable work, finished;
};

static thread_local CpuPool* t_cpu_pool = nullptr;   // the pool of this rank thread (none: serial)
static thread_local bool t_cpu_in_chunk = false;     // inside a chunk: a nested cpu_for runs serially

static inline bool cpu_spin_until(std::chrono::steady_clock::time_point end, int i) {
    return (i & 63) != 0 || std::chrono::steady_clock::now() < end;
}

// takes and runs chunks of generation gen until none is left. Once a thread holds a chunk the job
// cannot end, so the job's fields stay put until it has run it and counted it done.
static void cpu_pool_take(CpuPool* p, unsigned long gen) {
    t_cpu_in_chunk = true;
    for (;;) {
        unsigned long cur = p->next.load(std::memory_order_acquire);
        if ((cur >> 32) != gen) break;
        long nchunks = p->nchunks.load(std::memory_order_relaxed);
        if ((long)(cur & 0xffffffffu) >= nchunks) break;
        if (!p->next.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel)) continue;
        long c = (long)(cur & 0xffffffffu);
        long chunk = p->chunk.load(std::memory_order_relaxed);
        long lo = c * chunk, hi = std::min(p->n.load(std::memory_order_relaxed), lo + chunk);
        p->run.load(std::memory_order_relaxed)(p->ctx.load(std::memory_order_relaxed), lo, hi);
        if (p->done.fetch_add(1) + 1 == nchunks && p->owner_sleeps.load()) {
            std::lock_guard<std::mutex> lock(p->mu);
            p->finished.notify_one();
        }
    }
    t_cpu_in_chunk = false;
}

static void cpu_pool_worker(CpuPool* p) {
    cpu_fp_mode_set();
    unsigned long seen = 0;
    for (;;) {
        auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(CPU_POOL_SPIN_US);
        unsigned long gen = 0;
        for (int i = 0;; i++) {
            gen = p->next.load(std::memory_order_acquire) >> 32;
            if (gen != seen || p->stop.load(std::memory_order_relaxed)) break;
            if (!cpu_spin_until(end, i)) {
                std::unique_lock<std::mutex> lock(p->mu);
                p->sleepers.fetch_add(1);
                p->work.wait(lock, [&] { return (p->next.load() >> 32) != seen || p->stop.load(); });
                p->sleepers.fetch_sub(1);
                end = std::chrono::steady_clock::now() + std::chrono::microseconds(CPU_POOL_SPIN_US);
            }
            cpu_relax();
        }
        if (p->stop.load()) return;
        seen = gen;
        cpu_pool_take(p, gen);
    }
}

static void cpu_pool_stop_pool(CpuPool* p) {
    {
        std::lock_guard<std::mutex> lock(p->mu);
        p->stop.store(true);
        p->work.notify_all();
    }
    for (auto& t : p->workers) t.join();
    p->workers.clear();
}

// owns the calling thread's pool: its workers are joined when the thread ends
struct CpuPoolHolder {
    std::unique_ptr<CpuPool> pool;
    ~CpuPoolHolder() {
        if (pool) cpu_pool_stop_pool(pool.get());
    }
};
static thread_local CpuPoolHolder t_cpu_pool_holder;

// Gives the calling thread (a rank) `threads` threads in all: itself and threads - 1 workers (again with
// another count replaces them; 1: none, its ops run serially). Sets the floating-point mode of the caller.
static void cpu_pool_start(int threads) {
    cpu_fp_mode_set();
    threads = std::max(1, threads);
    CpuPool* cur = t_cpu_pool_holder.pool.get();
    if (cur && cur->nthreads == threads) return;
    if (cur) cpu_pool_stop_pool(cur);
    t_cpu_pool_holder.pool.reset();
    t_cpu_pool = nullptr;
    if (threads == 1) return;
    CpuPool* p = new CpuPool();
    p->nthreads = threads;
    for (int i = 1; i < threads; i++) p->workers.emplace_back(cpu_pool_worker, p);
    t_cpu_pool_holder.pool.reset(p);
    t_cpu_pool = p;
}

// the threads the calling thread's ops run on (1 without a pool, and inside a chunk)
static inline int cpu_pool_threads() { return t_cpu_pool && !t_cpu_in_chunk ? t_cpu_pool->nthreads : 1; }

// runs run(ctx, lo, hi) over [0, n) on the calling thread's pool and returns when all of it has run
static void cpu_pool_run(long n, void (*run)(void*, long, long), void* ctx) {
    CpuPool* p = t_cpu_pool;
    if (n <= 0) return;
    if (!p || t_cpu_in_chunk || n == 1) {
        bool nested = t_cpu_in_chunk;
        t_cpu_in_chunk = true;
        run(ctx, 0, n);
        t_cpu_in_chunk = nested;
        return;
    }
    // First close the last job's generation: a worker still in it (it has read a chunk count, not yet taken a
    // chunk) must not take a chunk of it once the fields below hold the next job's values; with the
    // generation moved on its compare-exchange fails. A closed generation has no chunk to take
    // (index 0xffffffff), and the job opens under the generation after it.
    unsigned long gen = (p->next.load(std::memory_order_relaxed) >> 32) + 1;
    p->next.store(gen << 32 | 0xffffffffu);
    gen++;
    long want = std::min(n, (long)p->nthreads * CPU_POOL_CHUNKS);
    long chunk = (n + want - 1) / want;
    long nchunks = (n + chunk - 1) / chunk;
    p->chunk.store(chunk, std::memory_order_relaxed);
    p->nchunks.store(nchunks, std::memory_order_relaxed);
    p->n.store(n, std::memory_order_relaxed);
    p->run.store(run, std::memory_order_relaxed);
    p->ctx.store(ctx, std::memory_order_relaxed);
    p->done.store(0, std::memory_order_relaxed);
    p->next.store(gen << 32);  // publishes the job (seq_cst: ordered before the read of sleepers)
    if (p->sleepers.load() > 0) {
        std::lock_guard<std::mutex> lock(p->mu);
        p->work.notify_all();
    }
    cpu_pool_take(p, gen);
    auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(CPU_POOL_SPIN_US);
    for (int i = 0; p->done.load(std::memory_order_acquire) < nchunks; i++) {
        if (!cpu_spin_until(end, i)) {
            std::unique_lock<std::mutex> lock(p->mu);
            p->owner_sleeps.store(true);
            p->finished.wait(lock, [&] { return p->done.load() >= nchunks; });
            p->owner_sleeps.store(false);
            break;
        }
        cpu_relax();
    }
}

// body(i) for every i in [0, n), each on one thread of the calling rank's pool
template <class F>
static void cpu_for(long n, F&& body) {
    auto run = [](void* ctx, long lo, long hi) {
        F& f = *(F*)ctx;
        for (long i = lo; i < hi; i++) f(i);
    };
    cpu_pool_run(n, run, (void*)&body);
}

// body(lo, hi) for a partition of [0, n) into ranges, each on one thread (for a loop body to vectorise)
template <class F>
static void cpu_for_range(long n, F&& body) {
    auto run = [](void* ctx, long lo, long hi) { (*(F*)ctx)(lo, hi); };
    cpu_pool_run(n, run, (void*)&body);
}
