// kernels_cpu.h: the CPU backend. Every op the TP recipe in gpt.cu uses, as plain C++ loops.
//
// These are the reference the CUDA kernels are tested against, the backend CI runs, and what ./tp
// uses on a machine without a GPU. Each op is parallelised over the threads of one rank (a rank is a
// std::thread with its own workers, common/cpu_pool.h: cpu_for), and every output element is computed
// by exactly one thread in a fixed order, so results are bit-identical for any number of threads per
// rank. (`omp simd reduction` lets the compiler vectorise a sum; its order is fixed at compile time;
// the build uses OpenMP's simd pragmas only, -fopenmp-simd, not its threads.)
//
// Every op here has a CUDA twin in kernels.cuh, foo_cuda(CudaCtx*, ...), with literally the same argument
// list after the context (README: "Adding an op").
//
// Shapes use llm.c's letters: B batch, T time, C channels, N = B*T rows, OC/IC a linear layer's
// output/input features. Weights are (OC, IC): out = inp . W^T + b. Under TP the shapes passed in are
// the rank's local ones (local heads, local vocab rows); these ops know nothing about ranks.
#pragma once
#include <cmath>
#include <cstring>
#include <cfloat>
#include <vector>
#include <algorithm>
#include <utility>
#include <thread>
#include "common/cpu_pool.h"

// the cores this process may use: the threads of the ranks on the CPU split them
static int cpu_cores() { return (int)std::max(1u, std::thread::hardware_concurrency()); }

// ----------------------------------------------------------------------------
// exp that vectorises: glibc's expf is a scalar call, which keeps every loop with an exp in it (GELU,
// softmax, the loss) scalar. Range reduction x = n ln2 + r, |r| <= ln2/2, then a degree-7 Taylor
// polynomial (truncation error < 1e-8 relative) and 2^n put into the exponent bits.
static inline float exp_fast(float x_in) {
    // clamp to the normal range (fminf/fmaxf would be calls that block vectorising); NaN passes through
    bool nan = x_in != x_in;
    float x = nan ? 0.0f : (x_in < -87.0f ? -87.0f : (x_in > 88.0f ? 88.0f : x_in));
    float n = rintf(x * 1.44269504088896341f);
    float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;  // ln2 in two parts: exact n*ln2_hi
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union { int i; float f; } scale;
    scale.i = ((int)n + 127) << 23;
    return nan ? x_in : p * scale.f;
}

// ----------------------------------------------------------------------------
// GEMM: C (M x N) = or += A (M x K) . B (K x N), the engine behind every matmul.
// Both operands are addressed through two strides, so a matrix and its transpose are passed alike:
// a(m,k) = A[m*a_rs + k*a_cs], b(k,n) = B[k*b_rs + n*b_cs].
//
// Each C element is one fma chain over k in increasing order, starting from 0, then + bias, then (with
// accumulate) added to the old C: whatever the blocking, the tile shape or the threads, so results are
// bit-identical for any thread count and any block size (the blocks below only choose where the running
// sums wait between K blocks, never the order of the sums).
//
// The tile is MR rows by NR = 2 vectors of the widest registers the build targets: 8 x 32 with AVX-512
// (16 accumulators + 2 B vectors of its 32 registers), 6 x 16 with AVX2 (12 + 2 + a broadcast of 16), 4 x 8
// otherwise. A vector wider than the registers makes GCC keep the accumulators on the stack (a 10x loss).
#if defined(__AVX512F__)
#define GEMM_MR 8
#define GEMM_VL 16
#elif defined(__AVX__)
#define GEMM_MR 6
#define GEMM_VL 8
#else
#define GEMM_MR 4
#define GEMM_VL 4
#endif
#define GEMM_NR (2 * GEMM_VL)
// A GEMM's pack: n elements of a thread's buffer that only grows, from a 64-byte boundary, so that a panel
// row starts a cache line (a vector's allocation is 16-byte aligned, and rows that straddle two lines made
// the AMX tiles of common/bf16.h 1.7x slower)
template <typename T>
static T* pack_buffer(std::vector<T>& v, size_t n) {
    if (v.size() < n + 64 / sizeof(T)) v.resize(n + 64 / sizeof(T));
    return (T*)(((uintptr_t)v.data() + 63) & ~(uintptr_t)63);
}

// Blocking: a unit of work is GEMM_MT tiles of rows by GEMM_NT panels of columns (128 x 512 with
// AVX-512). Each tile runs over the whole of K with its sums in registers and is written to C once: its B
// panel (K x NR floats, 48-256 KB at the model's shapes) stays in L2 while the unit's row tiles go by it,
// and the A rows and the panel stream from L2 in order, which the prefetchers keep ahead of the FMAs
// (an FMA per 4 bytes loaded). Blocking K as well (a 16 KB panel block in L1, the tiles' sums parked in
// memory between blocks) measured 3-8% slower at the model's shapes on one core: the sums' round trips
// and the separate write of C cost more than L2's latency does.
#ifndef GEMM_MT
#define GEMM_MT 16
#define GEMM_NT 16
#endif
typedef float vecf __attribute__((vector_size(GEMM_VL * sizeof(float))));  // one register of floats
// The next B panel, fetched into L2 while this one is multiplied: gemm_cpu's unit goes through its panels
// one after the other, each shared by the unit's row tiles, and a panel (K x NR floats, 48-256 KB at the
// model's shapes) that comes from L3 when its first tile starts keeps that tile waiting on L3 for all of K
// (the micro-kernel's own prefetch, 8 rows ahead, is far too close for L3's latency). So each of the
// panel's T tiles fetches its 1/T of the next panel, a few lines every 8 k, spread through its work.
// Only where A is packed (the weight gradients) and the panels are GEMM_NEXT_MIN bytes and more (K >= 1024
// with AVX-512): this made d6's weight gradients 1-9% faster, alternating in one process; on smaller
// panels, which a unit's tiles find in L2 anyway, it cost 1-4% (K 128-384), and where A is read in place
// 6-10% (K 1152-1536). lines: where its share starts (null: none); n: how many 64-byte lines; every8:
// lines per 8 k.
#define GEMM_NEXT_MIN (128 * 1024)
struct GemmNext {
    const char* lines = nullptr;
    int n = 0, every8 = 0;
};
__attribute__((always_inline)) static inline void gemm_prefetch_next(const GemmNext& next, int k) {
    if (next.lines && (k & 7) == 0)
        for (int i = 0, l = (k >> 3) * next.every8; i < next.every8 && l < next.n; i++, l++)
            __builtin_prefetch(next.lines + (long)l * 64, 0, 2);  // prefetcht1: into L2, not L1
}

// The micro-kernel: acc (MR x NR) += a (MR rows, kc) . b (kc x NR). Row r of A is read in place at
// ar[r][k * a_cs] (no packing: a row of A, or a column when A is a transpose, is read where it lies, and
// the tile's MR broadcasts a k come from MR pointers); row k of B is b[k * b_rs + c], b_rs = NR for
// gemm_cpu's packed panels (fused attention passes its tiles' own strides).
// prefetch_b (a constant where it is inlined): ask for row k + 8 of B while multiplying row k. gemm_cpu
// takes it: its panels (K x NR floats, 48-256 KB at d6) stream from L2 with A's rows, and there the
// hardware's L1 prefetch falls behind (on an Intel core it made d6's weight gradients 8-10% faster and its
// qkv and attproj forwards 8%, and moved no other shape past the noise). Fused attention's tiles, in L1,
// do not.
__attribute__((always_inline)) static inline void gemm_tile_cpu(vecf acc[GEMM_MR][2], const float* const* ar, long a_cs,
                                                                const float* b, long b_rs, int kc, bool prefetch_b = false) {
    for (int k = 0; k < kc; k++) {
        vecf b0, b1;
        if (prefetch_b) {
            __builtin_prefetch(b + (k + 8) * b_rs);  // (a prefetch past the panel's end is harmless: it never faults)
            __builtin_prefetch(b + (k + 8) * b_rs + GEMM_VL);
        }
        memcpy(&b0, b + k * b_rs, sizeof(vecf));
        memcpy(&b1, b + k * b_rs + GEMM_VL, sizeof(vecf));
        long o = k * a_cs;
        for (int r = 0; r < GEMM_MR; r++) {
            float a = ar[r][o];
            acc[r][0] += a * b0;
            acc[r][1] += a * b1;
        }
    }
}

// The same micro-kernel where A is packed (gemm_cpu's transposed A: the weight gradients): row k of the
// tile's A is ap[k * MR .. k * MR + MR), so its MR broadcasts come from one pointer at fixed offsets (the
// general tile above advances MR pointers a k, MR integer adds that compete with the FMAs for ports:
// this one made the weight gradients 2-4% faster on an Intel core). B prefetched as above, and the next
// panel with it (next: GemmNext above; none by default).
__attribute__((always_inline)) static inline void gemm_tile_packed_cpu(vecf acc[GEMM_MR][2], const float* ap, const float* b, int kc,
                                                                       GemmNext next = GemmNext()) {
    for (int k = 0; k < kc; k++) {
        vecf b0, b1;
        gemm_prefetch_next(next, k);
        __builtin_prefetch(b + (k + 8) * GEMM_NR);
        __builtin_prefetch(b + (k + 8) * GEMM_NR + GEMM_VL);
        memcpy(&b0, b + k * GEMM_NR, sizeof(vecf));
        memcpy(&b1, b + k * GEMM_NR + GEMM_VL, sizeof(vecf));
        const float* a = ap + (size_t)k * GEMM_MR;
        for (int r = 0; r < GEMM_MR; r++) {
            acc[r][0] += a[r] * b0;
            acc[r][1] += a[r] * b1;
        }
    }
}

// An element of B as the GEMM multiplies it: an fp32 word, or a bf16 in bf16 storage (a --dtype bf16 run's
// weights and kept inputs, on the CPU's fp32 path for them) widened exactly, its 16 bits the high half: the
// bits of common/bf16.h's bf16_to_float, which is defined after this file and is also a CUDA device function,
// so a forward declaration of it here would clash with its __host__ __device__ definition under nvcc
static inline float gemm_widen(float x) { return x; }
static inline float gemm_widen(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

// Bp (NB panels of K x NR) = the columns [nb*NR, nb*NR + NR) of B, zero past N: Bp[nb][k][c] = b(k, nb*NR + c).
// Read in the order B lies in memory: row by row when its rows are contiguous (b_cs == 1), column by
// column when it is a transpose (b_rs == 1, a weight in the forward): either way one pass of loads.
// B in bf16 storage (TB = uint16_t) is widened here, as it is copied, so the bf16 GEMM's fp32 path
// needs no fp32 copy of it first.
template <typename TB>
static void gemm_pack_b_cpu(float* Bp, const TB* B, long b_rs, long b_cs, int K, int N) {
    const int NB = (N + GEMM_NR - 1) / GEMM_NR;
    cpu_for(NB, [&](long nb) {
        float* dst = Bp + (size_t)nb * GEMM_NR * K;
        int n0 = (int)nb * GEMM_NR, nc = N - n0 < GEMM_NR ? N - n0 : GEMM_NR;
        if (b_cs == 1) {
            for (int k = 0; k < K; k++) {
                float* d = dst + (size_t)k * GEMM_NR;
                const TB* s = B + k * b_rs + n0;
                if (nc == GEMM_NR) {
                    if (sizeof(TB) == sizeof(float)) memcpy(d, s, GEMM_NR * sizeof(float));  // two vector moves, no call
                    else for (int c = 0; c < GEMM_NR; c++) d[c] = gemm_widen(s[c]);
                    continue;
                }
                for (int c = 0; c < GEMM_NR; c++) d[c] = c < nc ? gemm_widen(s[c]) : 0.0f;
            }
            return;
        }
#if GEMM_VL >= 8
        // a transpose with full panels: 8 x 8 blocks turned in 256-bit registers (unpack, shuffle, swap of
        // the 128-bit halves: the AVX transpose), 8 contiguous loads and 8 contiguous stores per 64 floats
        // instead of 64 single stores a panel row apart (3-4x faster, with AVX-512 too, where a panel is
        // four such blocks wide)
        if (b_rs == 1 && nc == GEMM_NR) {
            typedef float v8f __attribute__((vector_size(32)));  // 8 floats, whatever the build's vector width
            typedef int veci __attribute__((vector_size(32)));
            auto load8 = [](const TB* s) {
                v8f v;
                if (sizeof(TB) == sizeof(float)) {
                    memcpy(&v, s, sizeof(v));
                } else {  // 8 bf16, each the high half of its float
                    typedef uint16_t v8h __attribute__((vector_size(16)));
                    typedef uint32_t v8u __attribute__((vector_size(32)));
                    v8h h;
                    memcpy(&h, s, sizeof(h));
                    v8u u = __builtin_convertvector(h, v8u) << 16;
                    memcpy(&v, &u, sizeof(v));
                }
                return v;
            };
            int k = 0;
            for (; k + 8 <= K; k += 8)
                for (int h = 0; h < GEMM_NR; h += 8) {
                    const TB* s = B + (long)(n0 + h) * b_cs + k;
                    v8f r0 = load8(s), r1 = load8(s + b_cs), r2 = load8(s + 2 * b_cs), r3 = load8(s + 3 * b_cs);
                    v8f r4 = load8(s + 4 * b_cs), r5 = load8(s + 5 * b_cs), r6 = load8(s + 6 * b_cs), r7 = load8(s + 7 * b_cs);
                    const veci lo = {0, 8, 1, 9, 4, 12, 5, 13}, hi = {2, 10, 3, 11, 6, 14, 7, 15};
                    const veci lo2 = {0, 1, 8, 9, 4, 5, 12, 13}, hi2 = {2, 3, 10, 11, 6, 7, 14, 15};
                    const veci lo4 = {0, 1, 2, 3, 8, 9, 10, 11}, hi4 = {4, 5, 6, 7, 12, 13, 14, 15};
                    v8f t0 = __builtin_shuffle(r0, r1, lo), t1 = __builtin_shuffle(r0, r1, hi);
                    v8f t2 = __builtin_shuffle(r2, r3, lo), t3 = __builtin_shuffle(r2, r3, hi);
                    v8f t4 = __builtin_shuffle(r4, r5, lo), t5 = __builtin_shuffle(r4, r5, hi);
                    v8f t6 = __builtin_shuffle(r6, r7, lo), t7 = __builtin_shuffle(r6, r7, hi);
                    v8f u0 = __builtin_shuffle(t0, t2, lo2), u1 = __builtin_shuffle(t0, t2, hi2);
                    v8f u2 = __builtin_shuffle(t1, t3, lo2), u3 = __builtin_shuffle(t1, t3, hi2);
                    v8f u4 = __builtin_shuffle(t4, t6, lo2), u5 = __builtin_shuffle(t4, t6, hi2);
                    v8f u6 = __builtin_shuffle(t5, t7, lo2), u7 = __builtin_shuffle(t5, t7, hi2);
                    v8f o[8] = {__builtin_shuffle(u0, u4, lo4), __builtin_shuffle(u1, u5, lo4),
                                __builtin_shuffle(u2, u6, lo4), __builtin_shuffle(u3, u7, lo4),
                                __builtin_shuffle(u0, u4, hi4), __builtin_shuffle(u1, u5, hi4),
                                __builtin_shuffle(u2, u6, hi4), __builtin_shuffle(u3, u7, hi4)};
                    for (int j = 0; j < 8; j++) memcpy(dst + (size_t)(k + j) * GEMM_NR + h, &o[j], sizeof(v8f));
                }
            for (; k < K; k++)
                for (int c = 0; c < GEMM_NR; c++) dst[(size_t)k * GEMM_NR + c] = gemm_widen(B[(long)(n0 + c) * b_cs + k]);
            return;
        }
#endif
        for (int c = 0; c < GEMM_NR; c++) {
            if (c >= nc) {
                for (int k = 0; k < K; k++) dst[(size_t)k * GEMM_NR + c] = 0.0f;
                continue;
            }
            const TB* s = B + (n0 + c) * b_cs;
            if (b_rs == 1)
                for (int k = 0; k < K; k++) dst[(size_t)k * GEMM_NR + c] = gemm_widen(s[k]);
            else
                for (int k = 0; k < K; k++) dst[(size_t)k * GEMM_NR + c] = gemm_widen(s[k * b_rs]);
        }
    });
}

// How long the rank's threads take over the units of mt x nt tiles out of MB x NB, in tile-panels, as
// cpu_for runs them: cpu_pool_run's chunks of consecutive units, each taken by the thread that is free
// first. A unit costs its tiles x (its panels + 1): each unit also reads (packs) its rows of A once, about
// one panel's work a tile (A's pack is ~8% of d6's weight gradients, which have 12 panels). busy: threads longs.
static long gemm_units_span(int MB, int NB, int mt, int nt, int threads, long* busy) {
    const int UM = (MB + mt - 1) / mt, UN = (NB + nt - 1) / nt;
    const long units = (long)UM * UN, chunks = std::min(units, (long)threads * CPU_POOL_CHUNKS);
    const long chunk = (units + chunks - 1) / chunks;
    std::fill(busy, busy + threads, 0L);
    long span = 0;
    for (long u0 = 0; u0 < units; u0 += chunk) {
        long cost = 0;
        for (long u = u0; u < u0 + chunk && u < units; u++) {
            const int mb = (int)(u % UM) * mt, nb = (int)(u / UM) * nt;
            cost += (long)std::min(mt, MB - mb) * (std::min(nt, NB - nb) + 1);
        }
        long* first_free = std::min_element(busy, busy + threads);
        *first_free += cost;
        span = std::max(span, *first_free);
    }
    return span;
}

// Units of *mt x *nt tiles halved, the larger of the two first, until there are 4 a thread (or single tiles), so
// that a thread slowed by another program has its share taken up by the others
static void gemm_units_halved(int MB, int NB, int threads, int* mt, int* nt) {
    while ((long)((MB + *mt - 1) / *mt) * ((NB + *nt - 1) / *nt) < 4L * threads && (*mt > 1 || *nt > 1)) {
        if (*mt >= *nt && *mt > 1) *mt /= 2; else *nt /= 2;
    }
}

// Units of *mt x *nt tiles out of MB x NB (the unit size moves no sum: it only decides which thread computes
// a tile). Smaller ones when there are too few to keep every thread of the rank busy (gemm_units_halved).
// Then units that divide among the threads: 9 equal units on 2 threads keep one thread idle for the last
// (d6's qkv and fcproj weight gradients at TP 1), where 12 of 3/4 the size do not. So, down to half of
// each side, the shape whose span (gemm_units_span) is shortest, each step taken only for 3% or more,
// wider units first (fewer passes over A). On 2 threads this made those two GEMMs 6-7% faster. Then
// larger units, up to twice a side (never past the unit asked for) where 4 remain a thread, again only
// for 3% or more: halving one side may overshoot where the other side should have given instead (22 x 12
// tiles on 16 threads: halved to 2 x 2 units, a span 21% over their even share; 1 x 3 units are 9% over
// theirs, a span 20% shorter). Searched once per shape and thread count (a rank thread's table), as the
// spans are O(threads^2) to work out.
static void gemm_units_cpu(int MB, int NB, int* mt, int* nt) {
    const int threads = cpu_pool_threads();
    if (threads == 1) return;
    struct Units { int MB, NB, mt, nt, threads, mt_out, nt_out; };
    static thread_local std::vector<Units> seen;
    for (const Units& s : seen)
        if (s.MB == MB && s.NB == NB && s.mt == *mt && s.nt == *nt && s.threads == threads) {
            *mt = s.mt_out;
            *nt = s.nt_out;
            return;
        }
    Units found = {MB, NB, *mt, *nt, threads, *mt, *nt};
    gemm_units_halved(MB, NB, threads, mt, nt);
    std::vector<long> busy(threads);
    long limit = gemm_units_span(MB, NB, *mt, *nt, threads, busy.data()) * 97 / 100;
    int best_mt = *mt, best_nt = *nt;
    auto consider = [&](int m, int n) {
        const long span = gemm_units_span(MB, NB, m, n, threads, busy.data());
        if (span <= limit) {
            limit = span * 97 / 100;
            best_mt = m;
            best_nt = n;
        }
    };
    for (int n = *nt; n >= (*nt + 1) / 2; n--)
        for (int m = *mt; m >= (*mt + 1) / 2; m--) consider(m, n);
    for (int n = std::min(2 * *nt, found.nt); n >= (*nt + 1) / 2; n--)
        for (int m = std::min(2 * *mt, found.mt); m >= (*mt + 1) / 2; m--)
            if ((m > *mt || n > *nt) && (long)((MB + m - 1) / m) * ((NB + n - 1) / n) >= 4L * threads) consider(m, n);
    *mt = found.mt_out = best_mt;
    *nt = found.nt_out = best_nt;
    if (seen.size() < 64) seen.push_back(found);
}

// C (M x N, row stride ldc) = [C +] A (M x K) . B (K x N) [+ bias (N)], A and B through their strides.
// Loops: units of tiles over the threads; in a unit, its B panels, then its row tiles, which share the B
// panel; in a tile, the whole of K. A and B may be bf16 storage (TA, TB = uint16_t: the bf16 GEMM's fp32
// path), widened as they are packed: B's panels, a transposed A's panels, and other A's rows a unit at
// a time (no fp32 copy of a whole operand first).
template <typename TA, typename TB>
static void gemm_cpu(int M, int N, int K, const TA* A, long a_rs, long a_cs, const TB* B, long b_rs,
                     long b_cs, float* Cm, long ldc, bool accumulate, const float* bias) {
    if (M <= 0 || N <= 0) return;
    const int MB = (M + GEMM_MR - 1) / GEMM_MR, NB = (N + GEMM_NR - 1) / GEMM_NR;
    // the packed B belongs to the calling (rank) thread and only grows, so a step allocates nothing
    static thread_local std::vector<float> packB;
    float* Bp = pack_buffer(packB, (size_t)NB * GEMM_NR * K);
    gemm_pack_b_cpu(Bp, B, b_rs, b_cs, K, N);
    // A as a transpose (a_rs == 1: a column of it is a tile's k) is copied into MR x K panels first, by each
    // unit for its rows: read in place, a tile's K columns are K cache lines a stride of a_cs apart, which
    // for a_cs a multiple of 512 bytes fall into a few L1 sets and evict the B panel. On one thread a unit
    // then spans all of N, so that A is packed once, not once for every 16 panels (d6's fcproj weight
    // gradient, 48 panels: 5% faster; on 2 threads the split among them decides, and this made no difference)
    const bool pack_a = a_rs == 1 && a_cs != 1;
    int mt = GEMM_MT, nt = pack_a && cpu_pool_threads() == 1 ? NB : GEMM_NT;
    gemm_units_cpu(MB, NB, &mt, &nt);
    const int UM = (MB + mt - 1) / mt, UN = (NB + nt - 1) / nt;
    // A C of 4 MB and more, which a core's L2 does not hold (1-2 MB on the AVX-512 hosts): each tile asks
    // for its 2 MR lines of C (to write) as its sums start. With K a few hundred a tile's work is about a
    // microsecond, and its stores, each to a line far from the last, would otherwise wait on L3 at its end:
    // d6's widest forwards (qkv and fc at TP 1, C 9.4-12.6 MB) went from 0.90-0.92x OpenBLAS's rate to
    // 0.98-0.99x, alternating in one process; on a C that fits in L2 the prefetches cost a few percent.
    const bool wide_c = (size_t)M * ldc * sizeof(float) >= (size_t)4 << 20;
    cpu_for((long)UM * UN, [&](long u) {
        const int mb0 = (int)(u % UM) * mt, nb0 = (int)(u / UM) * nt;
        const int mb1 = mb0 + mt < MB ? mb0 + mt : MB, nb1 = nb0 + nt < NB ? nb0 + nt : NB;
        static thread_local std::vector<float> packA;  // (the transposed A's panels: pack_a above)
        float* Ap = pack_a ? pack_buffer(packA, (size_t)mt * GEMM_MR * K) : nullptr;
        // A in bf16 storage, not a transpose: the unit's rows widened (row stride K, from its first row m0),
        // which its tiles read as they would an fp32 A, once for every panel of the unit
        static thread_local std::vector<float> wideA;
        const bool wide_rows = !pack_a && !std::is_same<TA, float>::value;
        const float* wa = nullptr;
        if (wide_rows) {
            const int m0 = mb0 * GEMM_MR, mc = (M < mb1 * GEMM_MR ? M : mb1 * GEMM_MR) - m0;
            float* w = pack_buffer(wideA, (size_t)mc * K);
            for (int i = 0; i < mc; i++) {
                const TA* s = A + (long)(m0 + i) * a_rs;
                float* d = w + (size_t)i * K;
                if (a_cs == 1) for (int k = 0; k < K; k++) d[k] = gemm_widen(s[k]);
                else for (int k = 0; k < K; k++) d[k] = gemm_widen(s[(long)k * a_cs]);
            }
            wa = w;
        }
        if (pack_a) {
            // packA[mb - mb0][k][r] = a(mb*MR + r, k), rows past M zero. Row k of the transpose is contiguous:
            // two tiles at a time take 2 MR floats of it (a 64-byte line with AVX-512) and write each tile's
            // panel in order. (k outermost, writing every tile's panel at once, stores 2 x 16 runs 4 KB apart
            // and costs the weight gradients a seventh of their time.) But 16 k at a time, every pair of tiles
            // in turn: a pass of one pair down the whole of K reads one line from each of K rows (dout's rows,
            // OC floats apart), and the next pair came back for the neighbouring lines only 2K loads later;
            // 16 rows at a time, the unit's lines of a row are read close together, where the hardware's
            // prefetchers follow a page (not the TLB: the pack was as slow with 2 MB pages, README, Speed).
            // d6's fc weight gradient 4-7% faster (one core, alternating in one process; 8 or 32 k: less).
            const int m0 = mb0 * GEMM_MR, mc = (M < mb1 * GEMM_MR ? M : mb1 * GEMM_MR) - m0, pairs = mc / (2 * GEMM_MR);
            const long acs = a_cs;  // (a local: the stores through d0 and d1 could alias the captured a_cs)
            for (int k0 = 0; k0 < K; k0 += 16)
                for (int p = 0; p < pairs; p++) {
                    float* d0 = Ap + (size_t)(2 * p) * K * GEMM_MR;
                    float* d1 = d0 + (size_t)K * GEMM_MR;
                    const TA* s = A + m0 + 2 * p * GEMM_MR + k0 * acs;
                    for (int k = k0; k < K && k < k0 + 16; k++, s += acs) {
                        if (std::is_same<TA, float>::value) {
                            memcpy(d0 + (size_t)k * GEMM_MR, s, GEMM_MR * sizeof(float));
                            memcpy(d1 + (size_t)k * GEMM_MR, s + GEMM_MR, GEMM_MR * sizeof(float));
                        } else {
                            for (int r = 0; r < GEMM_MR; r++) d0[(size_t)k * GEMM_MR + r] = gemm_widen(s[r]);
                            for (int r = 0; r < GEMM_MR; r++) d1[(size_t)k * GEMM_MR + r] = gemm_widen(s[GEMM_MR + r]);
                        }
                    }
                }
            int i = pairs * 2 * GEMM_MR;
            for (; i < mc; i += GEMM_MR) {  // a last odd tile, and the one past M
                float* d = Ap + (size_t)(i / GEMM_MR) * K * GEMM_MR;
                const TA* s = A + m0 + i;
                for (int k = 0; k < K; k++, s += a_cs)
                    for (int r = 0; r < GEMM_MR; r++) d[(size_t)k * GEMM_MR + r] = i + r < mc ? gemm_widen(s[r]) : 0.0f;
            }
        }
        // the panel after this unit's last: the next unit's first (u + 1 is most often this thread's next)
        const int after = u + 1 < (long)UM * UN ? (int)((u + 1) / UM) * nt : -1;
        for (int nb = nb0; nb < nb1; nb++) {
            const float* b = Bp + (size_t)nb * GEMM_NR * K;
            const int nxt = nb + 1 < nb1 ? nb + 1 : after;
            const int tiles = mb1 - mb0;
            const int lines = (int)((size_t)GEMM_NR * K * sizeof(float) / 64), share = (lines + tiles - 1) / tiles;
            for (int mb = mb0; mb < mb1; mb++) {
                const int m0 = mb * GEMM_MR, n0 = nb * GEMM_NR;
                GemmNext next;  // (K / 8 > 0 below: the panels are GEMM_NEXT_MIN bytes)
                if (pack_a && nxt >= 0 && (size_t)K * GEMM_NR * sizeof(float) >= GEMM_NEXT_MIN) {
                    const int l0 = (mb - mb0) * share;
                    next.lines = (const char*)(Bp + (size_t)nxt * GEMM_NR * K) + (long)l0 * 64;
                    next.n = std::max(0, std::min(share, lines - l0));
                    next.every8 = (share + K / 8 - 1) / (K / 8);
                }
                // rows past M read row M-1 (in bounds; their results are not stored)
                vecf acc[GEMM_MR][2];
                for (int r = 0; r < GEMM_MR; r++) { acc[r][0] = vecf{}; acc[r][1] = vecf{}; }
                if (wide_c)
                    for (int r = 0; r < GEMM_MR && m0 + r < M; r++) {
                        __builtin_prefetch(Cm + (size_t)(m0 + r) * ldc + n0, 1, 3);
                        __builtin_prefetch(Cm + (size_t)(m0 + r) * ldc + n0 + GEMM_NR - 1, 1, 3);
                    }
                if (pack_a) {
                    // (two copies of the tile: the one without the next panel's prefetches has no trace of them
                    // in its loop, which at small K cost up to 10%)
                    const float* ap = Ap + (size_t)(mb - mb0) * K * GEMM_MR;
                    if (next.lines) gemm_tile_packed_cpu(acc, ap, b, K, next);
                    else gemm_tile_packed_cpu(acc, ap, b, K);
                } else {
                    const float* ar[GEMM_MR];
                    for (int r = 0; r < GEMM_MR; r++) {
                        const long m = m0 + r < M ? m0 + r : M - 1;
                        if (wide_rows) ar[r] = wa + (m - mb0 * GEMM_MR) * K;
                        else ar[r] = (const float*)(const void*)(A + m * a_rs);  // (TA is float here)
                    }
                    gemm_tile_cpu(acc, ar, wide_rows ? 1 : a_cs, b, GEMM_NR, K, true);
                }
                // bias, then accumulate, into C
                if (n0 + GEMM_NR <= N) {
                    // a full-width tile: whole vectors (this path matters when K is small, e.g. attention's hs)
                    vecf b0 = {}, b1 = {};
                    if (bias) { memcpy(&b0, bias + n0, sizeof(vecf)); memcpy(&b1, bias + n0 + GEMM_VL, sizeof(vecf)); }
                    for (int r = 0; r < GEMM_MR && m0 + r < M; r++) {
                        float* c = Cm + (size_t)(m0 + r) * ldc + n0;
                        vecf v0 = acc[r][0] + b0, v1 = acc[r][1] + b1;
                        if (accumulate) {
                            vecf c0, c1;
                            memcpy(&c0, c, sizeof(vecf));
                            memcpy(&c1, c + GEMM_VL, sizeof(vecf));
                            v0 = c0 + v0;
                            v1 = c1 + v1;
                        }
                        memcpy(c, &v0, sizeof(vecf));
                        memcpy(c + GEMM_VL, &v1, sizeof(vecf));
                    }
                    continue;
                }
                for (int r = 0; r < GEMM_MR && m0 + r < M; r++) {
                    float row[GEMM_NR];
                    memcpy(row, &acc[r][0], sizeof(vecf));
                    memcpy(row + GEMM_VL, &acc[r][1], sizeof(vecf));
                    float* c = Cm + (size_t)(m0 + r) * ldc + n0;
                    for (int j = 0; j < GEMM_NR && n0 + j < N; j++) {
                        float v = row[j];
                        if (bias) v += bias[n0 + j];
                        c[j] = accumulate ? c[j] + v : v;
                    }
                }
            }
        }
    });
}

// bf16: the 16 bits of a bfloat16, the top half of an fp32 (common/bf16.h has its arithmetic)
typedef uint16_t bf16;

// The GEMM of a --dtype bf16 run: the same product of operands that hold bf16 values (TA, TB = float: fp32
// words, low halves zero; = bf16: bf16 storage), on AVX512-BF16's vdpbf16ps where that is faster, else
// gemm_cpu on them widened; the same bits either way (common/bf16.h, included at the end of this file).
// TC = bf16: C in bf16 storage, each element its fp32 sum rounded to nearest (not with accumulate).
template <typename TA, typename TB, typename TC>
static void gemm_bf16_cpu(int M, int N, int K, const TA* A, long a_rs, long a_cs, const TB* B, long b_rs, long b_cs,
                          TC* Cm, long ldc, bool accumulate, const float* bias);

// a linear layer's GEMM: gemm_cpu, or where its operands hold bf16 values (bf16) the bf16 GEMM; a weight
// in bf16 storage (B, the second form) is a --dtype bf16 run's, so always the bf16 GEMM
static void linear_gemm_cpu(bool bf16, int M, int N, int K, const float* A, long a_rs, long a_cs, const float* B, long b_rs,
                            long b_cs, float* Cm, long ldc, bool accumulate, const float* bias) {
    if (bf16) gemm_bf16_cpu(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, Cm, ldc, accumulate, bias);
    else gemm_cpu(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, Cm, ldc, accumulate, bias);
}
template <typename TA, typename TB>  // (an operand in bf16 storage: a bf16 run's)
static void linear_gemm_cpu(bool, int M, int N, int K, const TA* A, long a_rs, long a_cs, const TB* B, long b_rs,
                            long b_cs, float* Cm, long ldc, bool accumulate, const float* bias) {
    gemm_bf16_cpu(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, Cm, ldc, accumulate, bias);
}

// A linear layer's weight as the recipe hands it to matmul_forward and matmul_backward, in the run's
// dtype: the fp32 weights (f), or in a --dtype bf16 run the bf16 copy of them in bf16 storage (h), which
// also says that the activation operands hold bf16 values. One of the two is set, also where the op reads
// no weight (a weight's gradient alone).
struct Weight {
    const float* f;
    const bf16* h;
};

// A parameter's gradient as the recipe hands it to the backward ops, in the run's dtype: fp32 (f), or in a
// --dtype bf16 run bf16 storage (h). An op sums its contribution in fp32 and adds it to the gradient once,
// the sum rounded to nearest (grad_add): one rounding per op and element, however many terms it sums (a
// token repeated in the batch, every token of a bias). At most one of the two is set; neither skips it.
struct Grad {
    float* f;
    bf16* h;
    Grad() : f(nullptr), h(nullptr) {}
    Grad(std::nullptr_t) : f(nullptr), h(nullptr) {}
    Grad(float* p) : f(p), h(nullptr) {}
    Grad(bf16* p) : f(nullptr), h(p) {}
    bool set() const { return f || h; }
};

// The LM head's output, the logits (B*T, Vl), and after the loss its gradient: fp32 (f), or in a --dtype
// bf16 run bf16 storage (h), half the bytes of the largest activation of a GPT-2-vocabulary model. One of
// the two is set. The head's matmuls and the cross-entropy take it; every sum over it is fp32.
struct Logits {
    float* f;
    bf16* h;
};

// A linear layer's input as the layer keeps it: fp32 (f; a bf16 run's holds bf16 values), or in a --dtype
// bf16 run the bf16 copy of it that the layer keeps for its backward (h), which the forward's matmul and
// the weight gradient's read where it lies (no fp32 copy rounded first, none widened back). One of the
// two is set. The backward hands a matmul its output gradient the same way (a bf16 run's fc and qkv
// gradients are bf16 storage: gelu_backward_bf16, grad_input in gpt.cu).
struct Input {
    const float* f;
    const bf16* h;
};

// an element as fp32: itself, or a bf16 widened exactly (common/bf16.h)
static inline float as_fp32(float x) { return x; }
static inline float as_fp32(bf16 h);
// v stored as an element: itself, or into bf16 storage rounded to nearest (common/bf16.h)
static inline void store_as(float* p, float v) { *p = v; }
static inline void store_as(bf16* p, float v);
static inline float bf16_value(float v);  // v rounded to the nearest bf16, in an fp32 word (common/bf16.h)
// g += v: for fp32 just that, for bf16 storage the sum of the widened gradient and v rounded to nearest
template <typename G>
static inline void grad_add(G* g, float v) { store_as(g, as_fp32(*g) + v); }

// ----------------------------------------------------------------------------
// Linear layers

// out (N, OC) = inp (N, IC) . weight (OC, IC)^T + bias (OC); bias may be NULL. bf16: inp and weight hold
// bf16 values (a --dtype bf16 run), which the bf16 GEMM multiplies, to the same bits as gemm_cpu. W: the
// weight in fp32 words, or bf16 storage (then bf16 whatever the flag says); I: inp likewise.
template <typename W, typename I = float>
static void matmul_forward_cpu(float* out, const I* inp, const W* weight, const float* bias,
                               int N, int IC, int OC, bool bf16 = false) {
    // b(k=i, n=o) = weight[o*IC + i]: weight^T, read through its strides
    linear_gemm_cpu(bf16, N, OC, IC, inp, IC, 1, weight, 1, IC, out, OC, false, bias);
}
// the recipe's form: the weight in the run's dtype
static void matmul_forward_cpu(float* out, const float* inp, Weight w, const float* bias, int N, int IC, int OC) {
    if (w.h) matmul_forward_cpu(out, inp, w.h, bias, N, IC, OC, true);
    else matmul_forward_cpu(out, inp, w.f, bias, N, IC, OC, false);
}
// ... with the input as the layer keeps it (Input): a bf16 copy goes to the GEMM as it lies
static void matmul_forward_cpu(float* out, Input inp, Weight w, const float* bias, int N, int IC, int OC) {
    if (!inp.h) return matmul_forward_cpu(out, inp.f, w, bias, N, IC, OC);
    if (w.h) matmul_forward_cpu(out, inp.h, w.h, bias, N, IC, OC, true);
    else matmul_forward_cpu(out, inp.h, w.f, bias, N, IC, OC, true);
}
// the LM head's: logits in bf16 storage are a bf16 run's, each its fp32 sum rounded to nearest
static void matmul_forward_cpu(Logits out, const float* inp, Weight w, const float* bias, int N, int IC, int OC) {
    if (!out.h) return matmul_forward_cpu(out.f, inp, w, bias, N, IC, OC);
    if (w.h) gemm_bf16_cpu(N, OC, IC, inp, IC, 1, w.h, 1, IC, out.h, OC, false, bias);
    else gemm_bf16_cpu(N, OC, IC, inp, IC, 1, w.f, 1, IC, out.h, OC, false, bias);
}

// dinp (N, IC) = dout (N, OC) . weight (OC, IC)        (written, not accumulated; NULL skips)
// dweight (OC, IC) += dout^T . inp;  dbias (OC) += column sums of dout (an unset Grad skips each)
// (gpt.cu calls it twice per column-parallel matmul, dinp alone and then the rest, to overlap a sum)
// bf16: dout, inp and weight hold bf16 values, as in matmul_forward_cpu; W as there
// D: dout in fp32 words, or bf16 storage (the LM head's dlogits in a bf16 run); I: inp likewise (a kept copy)
// dweight and dbias in bf16 storage (a bf16 run's gradients): each element's fp32 sum over the N tokens is
// added to it and rounded once (the GEMM's store, grad_add)
template <typename W, typename D = float, typename I = float>
static void matmul_backward_cpu(float* dinp, Grad dweight, Grad dbias, const D* dout,
                                const I* inp, const W* weight, int N, int IC, int OC, bool bf16 = false) {
    if (dinp) linear_gemm_cpu(bf16, N, IC, OC, dout, OC, 1, weight, IC, 1, dinp, IC, false, nullptr);
    // a(m=o, k=n) = dout[n*OC + o]
    if (dweight.f) linear_gemm_cpu(bf16, OC, IC, N, dout, 1, OC, inp, IC, 1, dweight.f, IC, true, nullptr);
    if (dweight.h) gemm_bf16_cpu(OC, IC, N, dout, 1, OC, inp, IC, 1, dweight.h, IC, true, nullptr);
    if (dbias.set()) {
        // column sums in blocks of 64 columns: rows are read contiguously, each sum runs over n in order
        cpu_for((OC + 63) / 64, [&](long blk) {
            int o0 = (int)blk * 64, w = OC - o0 < 64 ? OC - o0 : 64;
            float s[64] = {0};
            for (int n = 0; n < N; n++) {
                const D* d = dout + (size_t)n * OC + o0;
                #pragma omp simd
                for (int j = 0; j < w; j++) s[j] += as_fp32(d[j]);
            }
            for (int j = 0; j < w; j++) {
                if (dbias.h) grad_add(dbias.h + o0 + j, s[j]);
                else grad_add(dbias.f + o0 + j, s[j]);
            }
        });
    }
}
// the recipe's form: the weight in the run's dtype; dout and inp as the layer holds them (Input): fp32
// words, or bf16 storage read by the GEMMs where it lies (a kept input; fc's and qkv's output gradients and
// the LM head's dlogits in a bf16 run). Any of the three in bf16 makes the products bf16's.
static void matmul_backward_cpu(float* dinp, Grad dweight, Grad dbias, Input dout, Input inp, Weight w,
                                int N, int IC, int OC) {
    const bool bf16 = w.h || dout.h || inp.h;
    auto with = [&](const auto* d, const auto* i) {
        if (w.h) matmul_backward_cpu(dinp, dweight, dbias, d, i, w.h, N, IC, OC, bf16);
        else matmul_backward_cpu(dinp, dweight, dbias, d, i, w.f, N, IC, OC, bf16);
    };
    if (dout.h) inp.h ? with(dout.h, inp.h) : with(dout.h, inp.f);
    else inp.h ? with(dout.f, inp.h) : with(dout.f, inp.f);
}
static void matmul_backward_cpu(float* dinp, Grad dweight, Grad dbias, const float* dout, Input inp, Weight w,
                                int N, int IC, int OC) {
    matmul_backward_cpu(dinp, dweight, dbias, Input{dout, nullptr}, inp, w, N, IC, OC);
}
static void matmul_backward_cpu(float* dinp, Grad dweight, Grad dbias, const float* dout, const float* inp, Weight w,
                                int N, int IC, int OC) {
    matmul_backward_cpu(dinp, dweight, dbias, Input{dout, nullptr}, Input{inp, nullptr}, w, N, IC, OC);
}
// the LM head's: dout is dlogits
static void matmul_backward_cpu(float* dinp, Grad dweight, Grad dbias, Logits dout, const float* inp, Weight w,
                                int N, int IC, int OC) {
    matmul_backward_cpu(dinp, dweight, dbias, Input{dout.f, dout.h}, Input{inp, nullptr}, w, N, IC, OC);
}

// ----------------------------------------------------------------------------
// Embedding (vocab-parallel: this rank holds wte rows [v0, v0+Vl))

// a row of C weights as fp32: copied, or from a --dtype bf16 run's copy widened exactly (common/bf16.h)
static inline void row_as_fp32(float* out, const float* row, int C) { memcpy(out, row, C * sizeof(float)); }
static inline void row_as_fp32(float* out, const bf16* row, int C);

// out (N, C) = wte[tok - v0] for tokens this rank owns, zeros for the others. The all-reduce that
// follows in the recipe fills in every row from the rank that owns it. W: wte in fp32, or bf16 storage.
template <typename W>
static void encoder_forward_cpu(float* out, const int* tokens, const W* wte, int v0, int Vl, int N, int C) {
    cpu_for(N, [&](long n_) {
        int n = (int)n_;
        int row = tokens[n] - v0;
        float* o = out + (size_t)n * C;
        if (row >= 0 && row < Vl) row_as_fp32(o, wte + (size_t)row * C, C);
        else memset(o, 0, C * sizeof(float));
    });
}
// the recipe's form: wte in the run's dtype
static void encoder_forward_cpu(float* out, const int* tokens, Weight wte, int v0, int Vl, int N, int C) {
    if (wte.h) encoder_forward_cpu(out, tokens, wte.h, v0, Vl, N, C);
    else encoder_forward_cpu(out, tokens, wte.f, v0, Vl, N, C);
}

// x (N, C) += the position embedding of each row: row n is token t0 + n of the flattened (B, T) batch,
// at position (t0 + n) % T. Without sequence parallelism t0 = 0 and N = B*T; with it a rank holds the
// N = B*T/P tokens starting at t0.
static void position_forward_cpu(float* x, const float* wpe, int N, int t0, int T, int C) {
    cpu_for(N, [&](long n_) {
        int n = (int)n_;
        const float* p = wpe + (size_t)((t0 + n) % T) * C;
        float* o = x + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] += p[c];
    });
}

// The tokens (N, host memory) this rank owns, grouped by row for encoder_backward, into groups
// (ENC_GROUP_INTS(N) ints): [ng | row (N) | start (N + 1) | n (N)]: group g is wte row row[g], whose tokens
// are n[start[g]] .. n[start[g + 1] - 1] in increasing order; ng groups. The offsets do not depend on ng,
// so a GPU kernel can find them without reading it back. A bf16 run packs them where it uploads the
// tokens (gpt_forward), on the host that has them.
#define ENC_GROUP_INTS(N) (3L * (N) + 2)
static void encoder_groups(const int* tokens, int v0, int Vl, int N, int* groups) {
    std::vector<std::pair<int, int>> rows;  // (row, n), sorted
    for (int n = 0; n < N; n++) {
        int row = tokens[n] - v0;
        if (row >= 0 && row < Vl) rows.push_back({row, n});
    }
    std::sort(rows.begin(), rows.end());
    int *row = groups + 1, *start = row + N, *ns = start + N + 1, ng = 0;
    for (size_t i = 0; i < rows.size(); i++) {
        if (i == 0 || rows[i].first != rows[i - 1].first) {
            row[ng] = rows[i].first;
            start[ng++] = (int)i;
        }
        ns[i] = rows[i].second;
    }
    start[ng] = (int)rows.size();
    groups[0] = ng;
}

// dwte (Vl, C) += dout (N, C) rows of the tokens this rank owns, grouped by row (groups, encoder_groups): a
// row's sums run over its group in increasing n in fp32 and are added to the row once, so a token the batch
// repeats costs a bf16 gradient one rounding, not one per repeat. Parallel over the rows (repeated tokens
// never race); each (row, channel) sum adds the same terms in the same order as a loop over n would.
// G: fp32, or a bf16 run's bf16 storage.
template <typename G>
static void encoder_backward_rows_cpu(G* dwte, const float* dout, const int* groups, int N, int C) {
    const int *row = groups + 1, *start = row + N, *ns = start + N + 1;
    cpu_for_range(groups[0], [&](long lo, long hi) {
        std::vector<float> acc(C);
        for (long g = lo; g < hi; g++) {
            G* w = dwte + (size_t)row[g] * C;
            for (int c = 0; c < C; c++) acc[c] = as_fp32(w[c]);
            for (int i = start[g]; i < start[g + 1]; i++) {
                const float* d = dout + (size_t)ns[i] * C;
                #pragma omp simd
                for (int c = 0; c < C; c++) acc[c] += d[c];
            }
            for (int c = 0; c < C; c++) store_as(w + c, acc[c]);
        }
    });
}
// ... from the tokens (N, host memory), grouped here
template <typename G>
static void encoder_backward_cpu(G* dwte, const float* dout, const int* tokens, int v0, int Vl, int N, int C) {
    std::vector<int> groups(ENC_GROUP_INTS(N));
    encoder_groups(tokens, v0, Vl, N, groups.data());
    encoder_backward_rows_cpu(dwte, dout, groups.data(), N, C);
}
// the recipe's form: the gradient in the run's dtype; groups: the tokens grouped already (a bf16 run's,
// which the GPU's op needs), or NULL
static void encoder_backward_cpu(Grad dwte, const float* dout, const int* tokens, const int* groups, int v0, int Vl, int N, int C) {
    if (groups && dwte.h) encoder_backward_rows_cpu(dwte.h, dout, groups, N, C);
    else if (groups) encoder_backward_rows_cpu(dwte.f, dout, groups, N, C);
    else if (dwte.h) encoder_backward_cpu(dwte.h, dout, tokens, v0, Vl, N, C);
    else encoder_backward_cpu(dwte.f, dout, tokens, v0, Vl, N, C);
}

// dwpe (T, C) += dout (N, C), row n at position (t0 + n) % T as in position_forward. Each (t, c) sum runs
// over n in increasing order in fp32 and is added once. Parallel over positions. G as encoder_backward.
template <typename G>
static void position_backward_cpu(G* dwpe, const float* dout, int N, int t0, int T, int C) {
    cpu_for_range(T, [&](long lo, long hi) {
        std::vector<float> acc(C);
        for (long t = lo; t < hi; t++) {
            long n0 = ((t - t0) % T + T) % T;  // the first row at position t
            if (n0 >= N) continue;
            G* w = dwpe + (size_t)t * C;
            for (int c = 0; c < C; c++) acc[c] = as_fp32(w[c]);
            for (long n = n0; n < N; n += T) {
                const float* d = dout + (size_t)n * C;
                #pragma omp simd
                for (int c = 0; c < C; c++) acc[c] += d[c];
            }
            for (int c = 0; c < C; c++) store_as(w + c, acc[c]);
        }
    });
}
static void position_backward_cpu(Grad dwpe, const float* dout, int N, int t0, int T, int C) {
    if (dwpe.h) position_backward_cpu(dwpe.h, dout, N, t0, T, C);
    else position_backward_cpu(dwpe.f, dout, N, t0, T, C);
}

// ----------------------------------------------------------------------------
// LayerNorm (eps 1e-5, biased variance, as llm.c)

// row n of x (C) in fp32 words: the row itself, or a bf16 row widened exactly into this thread's buffer. (An
// op on a bf16 row, the residual stream of a --dtype bf16 run, then sums the very words it sums on the same
// values in fp32, in the same vectors: the lanes GCC chose for the fp32 loop; a loop over bf16 loads would
// take 32-lane vectors, and another order of the sums.)
static inline const float* row_fp32(const float* x, long n, int C) { return x + (size_t)n * C; }
static inline const float* row_fp32(const bf16* x, long n, int C) {
    static thread_local std::vector<float> row;
    if ((int)row.size() < C) row.resize(C);
    row_as_fp32(row.data(), x + (size_t)n * C, C);
    return row.data();
}

// out (N, C) = (inp - mean) * rstd * w + b; saves mean (N) and rstd (N) for the backward.
// TO: out fp32, or bf16 storage (a --dtype bf16 run's kept ln1 and ln2: each fp32 value rounded to nearest
// as it is stored, the bits bf16_pack would give the fp32 output, with no fp32 copy written first).
// TI: inp fp32, or bf16 storage (a --dtype bf16 run's residual stream), each row widened (row_fp32)
template <typename TO, typename TI = float>
static void layernorm_forward_cpu(TO* out, float* mean, float* rstd, const TI* inp,
                                  const float* w, const float* b, int N, int C) {
    cpu_for(N, [&](long n_) {
        int n = (int)n_;
        const float* x = row_fp32(inp, n, C);
        float m = 0.0f;
        #pragma omp simd reduction(+ : m)
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        float v = 0.0f;
        #pragma omp simd reduction(+ : v)
        for (int c = 0; c < C; c++) { float d = x[c] - m; v += d * d; }
        v /= C;
        float s = 1.0f / sqrtf(v + 1e-5f);
        TO* o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) store_as(o + c, (s * (x[c] - m)) * w[c] + b[c]);
        mean[n] = m;
        rstd[n] = s;
    });
}
// the recipe's form: inp the residual stream as it lies (Input: fp32, or a bf16 run's bf16 storage)
template <typename TO>
static void layernorm_forward_cpu(TO* out, float* mean, float* rstd, Input inp, const float* w, const float* b, int N, int C) {
    if (inp.h) layernorm_forward_cpu(out, mean, rstd, inp.h, w, b, N, C);
    else layernorm_forward_cpu(out, mean, rstd, inp.f, w, b, N, C);
}

// one row of layernorm_backward_cpu's dinp: di (C) += d(layernorm)/d(x) . d, x's mean m and rstd s.
// (A function of its own, not the loop body of the cpu_for's lambda: there w and C are loads through the
// lambda's captured references, which GCC did not hoist out of the reduction, so it ran one float at a
// time: 5% of the default run's step.)
static inline void layernorm_backward_row(float* di, const float* x, const float* d, const float* w, float m, float s, int C) {
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    #pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
    for (int c = 0; c < C; c++) {
        float xhat = (x[c] - m) * s;
        float dnorm = w[c] * d[c];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * xhat;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for (int c = 0; c < C; c++) {
        float xhat = (x[c] - m) * s;
        float dnorm = w[c] * d[c];
        di[c] += ((dnorm - dnorm_mean) - xhat * dnorm_norm_mean) * s;
    }
}

// dinp (N, C) += d(layernorm)/d(inp) . dout;  dw (C) += sum_n dout * xhat;  db (C) += sum_n dout
// (dw, db: fp32, or a bf16 run's bf16 storage, each sum added once, grad_add; TI: inp fp32, or bf16 storage
// as the forward's)
template <typename TI>
static void layernorm_backward_cpu(float* dinp, Grad dw, Grad db, const float* dout, const TI* inp,
                                   const float* w, const float* mean, const float* rstd, int N, int C) {
    cpu_for(N, [&](long n) {
        layernorm_backward_row(dinp + (size_t)n * C, row_fp32(inp, n, C), dout + (size_t)n * C, w, mean[n], rstd[n], C);
    });
    // parameter gradients: parallel over blocks of 64 channels so each sum runs over n in order, with the
    // rows read contiguously and the 64 sums side by side in vectors (channel by channel, the loads would
    // be a row stride apart and scalar)
    cpu_for((C + 63) / 64, [&](long blk) {
        int c0 = (int)blk * 64, w = C - c0 < 64 ? C - c0 : 64;
        float sw[64] = {0}, sb[64] = {0};
        for (int n = 0; n < N; n++) {
            const float* d = dout + (size_t)n * C + c0;
            const TI* x = inp + (size_t)n * C + c0;
            float m = mean[n], s = rstd[n];
            #pragma omp simd
            for (int j = 0; j < w; j++) {
                sw[j] += d[j] * (as_fp32(x[j]) - m) * s;
                sb[j] += d[j];
            }
        }
        for (int j = 0; j < w; j++) {
            if (dw.h) grad_add(dw.h + c0 + j, sw[j]);
            else grad_add(dw.f + c0 + j, sw[j]);
            if (db.h) grad_add(db.h + c0 + j, sb[j]);
            else grad_add(db.f + c0 + j, sb[j]);
        }
    });
}
static void layernorm_backward_cpu(float* dinp, Grad dw, Grad db, const float* dout, Input inp, const float* w,
                                   const float* mean, const float* rstd, int N, int C) {
    if (inp.h) layernorm_backward_cpu(dinp, dw, db, dout, inp.h, w, mean, rstd, N, C);
    else layernorm_backward_cpu(dinp, dw, db, dout, inp.f, w, mean, rstd, N, C);
}

// ----------------------------------------------------------------------------
// Residual + bias, GELU

// out (N, C) = res + (x + bias): the row-parallel layer's bias, added once after its all-reduce.
// TO, TR: out and res fp32, or bf16 storage (a --dtype bf16 run's residual stream: res widened exactly, the
// sum rounded to nearest as it is stored)
template <typename TO, typename TR>
static void residual_forward_cpu(TO* out, const TR* res, const float* x, const float* bias, int N, int C) {
    cpu_for(N, [&](long n) {
        for (int c = 0; c < C; c++) {
            size_t i = (size_t)n * C + c;
            store_as(out + i, as_fp32(res[i]) + (x[i] + bias[c]));
        }
    });
}
// the recipe's form: res and out are both the residual stream, in its storage (res.h: bf16, out too)
static void residual_forward_cpu(float* out, Input res, const float* x, const float* bias, int N, int C) {
    if (res.h) residual_forward_cpu((bf16*)(void*)out, res.h, x, bias, N, C);
    else residual_forward_cpu(out, res.f, x, bias, N, C);
}

#define GELU_SCALE 0.7978845608028654f  // sqrt(2/pi)

// out (N) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the tanh approximation GPT-2 uses.
// With e = e^2u (the vectorisable exp), 1 + tanh(u) = 2e / (e + 1): no cancellation for x << 0.
// (gelu_value is that one expression, shared by the two forward ops below: the same bits from each.)
static inline float gelu_value(float x) {
    float e = exp_fast(2.0f * GELU_SCALE * (x + 0.044715f * x * x * x));
    return x * (e / (e + 1.0f));
}

static void gelu_forward_cpu(float* out, const float* inp, long N) {
    cpu_for_range(N, [&](long lo, long hi) {
        #pragma omp simd
        for (long i = lo; i < hi; i++) out[i] = gelu_value(inp[i]);
    });
}

// A --dtype bf16 run's GELU in a training forward. inp (N): the MLP's pre-activation, fc's fp32 sums.
// inp_kept (N) = inp rounded to nearest: the value the GELU takes, which its backward reads again; out (N) =
// gelu(inp_kept) rounded to nearest: fcproj's input, kept for its weight gradient. One pass over inp, where
// rounding it in place, packing it, the GELU in fp32 and packing the GELU's output took four passes and an
// fp32 buffer for the output; the same bits as those.
static void gelu_forward_bf16_cpu(bf16* out, bf16* inp_kept, const float* inp, long N) {
    cpu_for_range(N, [&](long lo, long hi) {
        #pragma omp simd
        for (long i = lo; i < hi; i++) {
            bf16 x;
            store_as(&x, inp[i]);
            inp_kept[i] = x;
            store_as(out + i, gelu_value(as_fp32(x)));
        }
    });
}

// gelu'(x). With e = e^2u: 0.5 (1 + tanh(u)) = e / (e+1) and sech^2(u) = 4e / (e+1)^2. (The one expression
// of the two backward ops below: the same bits from each.)
static inline float gelu_grad(float x) {
    float e = exp_fast(2.0f * GELU_SCALE * (x + 0.044715f * x * x * x));
    float half_1p_tanh = e / (e + 1.0f);
    float sech2 = 4.0f * half_1p_tanh / (e + 1.0f);
    return half_1p_tanh + x * 0.5f * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
}

// dinp (N) = gelu'(inp) * dout   (written, not accumulated; dinp may be dout)
static void gelu_backward_cpu(float* dinp, const float* inp, const float* dout, long N) {
    cpu_for_range(N, [&](long lo, long hi) {
        #pragma omp simd
        for (long i = lo; i < hi; i++) dinp[i] = gelu_grad(inp[i]) * dout[i];
    });
}

// A --dtype bf16 run's GELU backward. inp_kept (N): the pre-activation as gelu_forward_bf16 kept it (bf16,
// widened exactly); dinp (N) = gelu'(inp_kept) * dout rounded to nearest into bf16 storage: fc's output
// gradient, which such a run's matmuls take in bf16 (both of fc's backward GEMMs and its bias gradient read
// it where it lies). One pass, where the fp32 backward, rounding it in place (round_bf16) and packing it
// (bf16_pack) took three; the same bits as those.
static void gelu_backward_bf16_cpu(bf16* dinp, const bf16* inp_kept, const float* dout, long N) {
    cpu_for_range(N, [&](long lo, long hi) {
        #pragma omp simd
        for (long i = lo; i < hi; i++) store_as(dinp + i, gelu_grad(as_fp32(inp_kept[i])) * dout[i]);
    });
}

// ----------------------------------------------------------------------------
// Causal self-attention on this rank's NH heads (NH is the local head count under TP)

// Causal self-attention as matrix products per (b, h) pair, each through gemm_cpu: the scores q k^T and
// the products with v over the full (T, T) square (the masked half is computed and zeroed, which costs
// less than giving up the tiled GEMM), the causal softmax row by row in between.
// Head h's q, k and v are (T, hs) matrices inside qkv with row stride 3C: q at column h*hs, k at C + h*hs,
// v at 2C + h*hs.

// att (T, T) of one (b, h) pair = softmax(q k^T / sqrt(hs), causal), zero above the diagonal.
// q and k are (T, hs) with row stride C3 = 3 * NH * hs.
static void attention_probs_head(float* a, const float* q, const float* k, int T, int hs, int C3) {
    const float scale = 1.0f / sqrtf((float)hs);
    gemm_cpu(T, T, hs, q, C3, 1, k, 1, C3, a, T, false, nullptr);  // a (T, T) = q k^T
    for (int t = 0; t < T; t++) {
        float* row = a + (size_t)t * T;
        float maxv = -FLT_MAX;
        #pragma omp simd reduction(max : maxv)  // (a max is exact: any order, the same bits)
        for (int t2 = 0; t2 <= t; t2++) { row[t2] *= scale; maxv = row[t2] > maxv ? row[t2] : maxv; }
        float sum = 0.0f;
        #pragma omp simd reduction(+ : sum)
        for (int t2 = 0; t2 <= t; t2++) { float e = exp_fast(row[t2] - maxv); row[t2] = e; sum += e; }
        float inv = 1.0f / sum;
        for (int t2 = 0; t2 < T; t2++) row[t2] = t2 <= t ? row[t2] * inv : 0.0f;
    }
}

// att (B, NH, T, T) = the attention probabilities of attention_forward alone, bit for bit: what the
// backward needs when -r 3 recomputes them from q and k instead of keeping them
static void attention_probs_cpu(float* att, const float* qkv, int B, int T, int NH, int hs) {
    const int C = NH * hs, C3 = 3 * C;
    cpu_for((long)B * NH, [&](long bh) {
        int b = (int)(bh / NH), h = (int)(bh % NH);
        const float* q = qkv + (size_t)b * T * C3 + h * hs;
        attention_probs_head(att + ((size_t)b * NH + h) * T * T, q, q + C, T, hs, C3);
    });
}

// qkv (B, T, 3*NH*hs): q, k, v blocks of NH*hs channels each, head h at [h*hs, (h+1)*hs) in each.
// out (B, T, NH*hs) = softmax(q k^T / sqrt(hs), causal) v;  att (B, NH, T, T) saves the probabilities.
static void attention_forward_cpu(float* out, float* att, const float* qkv, int B, int T, int NH, int hs) {
    const int C = NH * hs, C3 = 3 * C;
    cpu_for((long)B * NH, [&](long bh) {
        int b = (int)(bh / NH), h = (int)(bh % NH);
        const float* q = qkv + (size_t)b * T * C3 + h * hs;
        float* a = att + ((size_t)b * NH + h) * T * T;
        attention_probs_head(a, q, q + C, T, hs, C3);
        gemm_cpu(T, hs, T, a, T, 1, q + 2 * C, C3, 1, out + (size_t)b * T * C + h * hs, C, false, nullptr);  // a v
    });
}

// dqkv (B, T, 3*NH*hs) = gradient of attention_forward given dout (B, T, NH*hs)   (written)
// Parallel over (b, h): a pair owns its head's q, k and v channels, so nothing races.
static void attention_backward_cpu(float* dqkv, const float* dout, const float* qkv, const float* att,
                                   int B, int T, int NH, int hs) {
    const int C = NH * hs, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    cpu_for((long)B * NH, [&](long bh) {
        int b = (int)(bh / NH), h = (int)(bh % NH);
        const float* q = qkv + (size_t)b * T * C3 + h * hs;
        const float* k = q + C;
        const float* v = q + 2 * C;
        const float* a = att + ((size_t)b * NH + h) * T * T;
        const float* d = dout + (size_t)b * T * C + h * hs;
        float* dq = dqkv + (size_t)b * T * C3 + h * hs;
        std::vector<float> datt((size_t)T * T);
        gemm_cpu(T, T, hs, d, C, 1, v, 1, C3, datt.data(), T, false, nullptr);  // datt = dout v^T
        gemm_cpu(T, hs, T, a, 1, T, d, C, 1, dq + 2 * C, C3, false, nullptr);   // dv = att^T dout
        // through the softmax: dpre = att * (datt - sum_t2 att datt) * scale, in place over datt
        const float sc = scale;  // (a local: through the captured reference, which dr might alias, the loop ran scalar)
        for (int t = 0; t < T; t++) {
            const float* ar = a + (size_t)t * T;
            float* dr = datt.data() + (size_t)t * T;
            float dot = 0.0f;
            #pragma omp simd reduction(+ : dot)
            for (int t2 = 0; t2 <= t; t2++) dot += ar[t2] * dr[t2];
            for (int t2 = 0; t2 < T; t2++) dr[t2] = t2 <= t ? ar[t2] * (dr[t2] - dot) * sc : 0.0f;
        }
        gemm_cpu(T, hs, T, datt.data(), T, 1, k, C3, 1, dq, C3, false, nullptr);      // dq = dpre k
        gemm_cpu(T, hs, T, datt.data(), 1, T, q, C3, 1, dq + C, C3, false, nullptr);   // dk = dpre^T q
    });
}

// ----------------------------------------------------------------------------
// Fused causal attention (FlashAttention-2, Dao 2023): the same function as attention_forward/backward,
// without the (B, NH, T, T) probabilities. The forward walks tiles of ATT_TILE queries against tiles of
// ATT_TILE keys with an online softmax (a running max m and sum l per row, the output rescaled when m
// grows) and keeps the output and one log-sum-exp per row, lse = m + log(l). The backward recomputes
// each tile's probabilities from q, k and lse, P = exp(s - lse), and needs D = rowsum(dO * O), since
// sum_u P[t,u] dP[t,u] = dO[t] . O[t]. Key tiles past a query tile's diagonal are never visited.
//
// Work is split as kernels.cuh splits it, so the two backends run the same algorithm: the forward and
// dq per (b, h, query tile), dk and dv per (b, h, key tile) looping over the query tiles at or below it.
// Every output element belongs to one task and is summed in a fixed order: no result depends on the
// thread count. (Where a rank has at least twice as many heads as threads, the backward instead runs one
// task per head that visits each tile once and sums dq in the same order: the same bits, less work.) 64 x 64 tiles keep one task's tiles (scores, probabilities, dP: 16 KB each; a transposed
// k or v tile and the dk, dv or output accumulators: 32 KB each at hs = 128) in L2 next to the q, k, v
// rows they stream. Head sizes up to ATT_HS_MAX, the bound the CUDA kernels hold in registers (gpt_build
// refuses a larger one with fused attention).
#define ATT_TILE 64
#define ATT_HS_MAX 128

// A tile of keys (or values) as att_tile_dots reads it: rows 0..nc-1 of Bm (row stride ldb) transposed into
// panels of GEMM_NR keys, zero past nc. Made once per tile where a pass reuses the tile (the backward's key
// tiles meet every query tile below them).
struct AttPanels { float bt[ATT_TILE / GEMM_NR][ATT_HS_MAX][GEMM_NR]; };

// (Q: fp32 words, or a --dtype bf16 run's qkv in bf16 storage, widened exactly as it is read)
template <typename Q>
static void att_tile_panels(AttPanels* p, const Q* Bm, long ldb, int nc, int hs) {
    static_assert(ATT_TILE % GEMM_NR == 0, "a tile of keys is whole panels");
    for (int pnl = 0; pnl < ATT_TILE / GEMM_NR; pnl++)
        for (int c = 0; c < GEMM_NR; c++) {
            const int key = pnl * GEMM_NR + c;
            const Q* b = Bm + (long)key * ldb;
            for (int d = 0; d < hs; d++) p->bt[pnl][d][c] = key < nc ? as_fp32(b[d]) : 0.0f;
        }
}

// Rows 0..n-1 (hs values each, row stride ld) of q, k or v as the tile products read them: fp32 words where
// they lie (*ld_out = ld), or, from a --dtype bf16 run's qkv in bf16 storage, widened into buf (*ld_out =
// ATT_HS_MAX). The products do the same arithmetic at any row stride, so the two give the same bits.
struct AttRows { float r[ATT_TILE][ATT_HS_MAX]; };
static const float* att_rows(const float* src, long ld, int, int, AttRows*, long* ld_out) {
    *ld_out = ld;
    return src;
}
static const float* att_rows(const bf16* src, long ld, int n, int hs, AttRows* buf, long* ld_out) {
    for (int r = 0; r < n; r++)
        for (int d = 0; d < hs; d++) buf->r[r][d] = as_fp32(src[(long)r * ld + d]);
    *ld_out = ATT_HS_MAX;
    return buf->r[0];
}

// S (nr, ATT_TILE) = A rows 0..nr-1 (row stride lda) . the tile's rows^T over hs (p: att_tile_panels; its
// columns past nc are 0). gemm_cpu's micro-tile runs on the panels (MR query rows by NR keys in registers
// while d runs: 2 loads of B and MR broadcasts of A per 2 MR vector FMAs). Each S element is one chain over
// d in order, from 0. diag: the causal offset of the tile (its first query's position less its first
// key's); row r's keys past r + diag are masked, so a panel all past them is not multiplied (0 in S).
static void att_tile_dots(float* S, const float* A, long lda, int nr, const AttPanels* p, int hs, int diag) {
    for (int r0 = 0; r0 < nr; r0 += GEMM_MR) {
        const float* a[GEMM_MR];
        for (int i = 0; i < GEMM_MR; i++) a[i] = A + (long)(r0 + i < nr ? r0 + i : nr - 1) * lda;  // past nr: a row again, not stored
        for (int pnl = 0; pnl < ATT_TILE / GEMM_NR; pnl++) {
            vecf acc[GEMM_MR][2];
            for (int i = 0; i < GEMM_MR; i++) { acc[i][0] = vecf{}; acc[i][1] = vecf{}; }
            if (pnl * GEMM_NR <= r0 + GEMM_MR - 1 + diag) gemm_tile_cpu(acc, a, 1, &p->bt[pnl][0][0], GEMM_NR, hs);
            for (int i = 0; i < GEMM_MR && r0 + i < nr; i++) {
                float* srow = S + (long)(r0 + i) * ATT_TILE + pnl * GEMM_NR;
                memcpy(srow, &acc[i][0], sizeof(vecf));
                memcpy(srow + GEMM_VL, &acc[i][1], sizeof(vecf));
            }
        }
    }
}

// acc (m, hs; row stride lda) += P (m, n) . X (n, hs; row stride ldx), with p(i, j) = P[i * p_rs + j * p_cs]
// (so P^T is passed by swapping the strides): each element summed over j in order, after its old value.
// gemm_cpu's micro-tile, with X's rows read in place: MR rows by NR columns of acc stay in registers while
// j runs. P is a tile of probabilities or their gradients, masked (0) past the diagonal: diag is the tile's
// causal offset (att_tile_dots); P's rows are queries, or with keys_rows (P^T) keys. A row block's terms
// of masked P are left out (past the diagonal for query rows, before it for key rows): adding a 0 product
// leaves any sum that started at +0 as it was, so the bits are those of the whole tile.
static void att_tile_gemm(float* acc, long lda, int m, const float* P, long p_rs, long p_cs, int n, const float* X, long ldx,
                          int hs, int diag, bool keys_rows) {
    for (int i0 = 0; i0 < m; i0 += GEMM_MR) {
        const int mi = m - i0 < GEMM_MR ? m - i0 : GEMM_MR;
        // the terms j0 <= j < j1 of the block's rows that can be nonzero: query row i sees keys j <= i + diag,
        // key row c is seen by queries j >= c - diag
        const int j0 = keys_rows ? std::max(0, i0 - diag) : 0, j1 = keys_rows ? n : std::min(n, i0 + mi + diag);
        const float* p[GEMM_MR];
        for (int i = 0; i < GEMM_MR; i++) p[i] = P + (long)(i0 + (i < mi ? i : mi - 1)) * p_rs + (long)j0 * p_cs;  // past m: a row again, not stored
        int d0 = 0;
        for (; d0 + GEMM_NR <= hs; d0 += GEMM_NR) {  // gemm_cpu's micro-tile on NR columns of X, read in place
            vecf a[GEMM_MR][2];
            for (int i = 0; i < GEMM_MR; i++) {
                const float* row = acc + (long)(i0 + (i < mi ? i : 0)) * lda + d0;
                memcpy(&a[i][0], row, sizeof(vecf));
                memcpy(&a[i][1], row + GEMM_VL, sizeof(vecf));
            }
            if (j1 > j0) gemm_tile_cpu(a, p, p_cs, X + (long)j0 * ldx + d0, ldx, j1 - j0);
            for (int i = 0; i < mi; i++) {
                float* row = acc + (long)(i0 + i) * lda + d0;
                memcpy(row, &a[i][0], sizeof(vecf));
                memcpy(row + GEMM_VL, &a[i][1], sizeof(vecf));
            }
        }
        for (; d0 < hs; d0++)  // the last hs % NR columns
            for (int i = 0; i < mi; i++) {
                float a = acc[(long)(i0 + i) * lda + d0];
                for (int j = j0; j < j1; j++) a += p[i][(j - j0) * p_cs] * X[(long)j * ldx + d0];
                acc[(long)(i0 + i) * lda + d0] = a;
            }
    }
}

// P (nr, ATT_TILE) of the tile of queries i0.. (q: their rows, row stride ldq) and keys j0.. (kp: their
// panels): exp(scale * q.k - lse[row]), 0 where the key is past the query (causal) or past T (nc). lse is
// the forward's, so P is its probabilities again.
static void att_tile_probs(float* P, const float* q, long ldq, const AttPanels* kp, const float* lse, int i0, int nr, int j0,
                           int nc, int hs, float scale) {
    att_tile_dots(P, q, ldq, nr, kp, hs, i0 - j0);
    for (int r = 0; r < nr; r++) {
        float* p = P + (long)r * ATT_TILE;
        int ncv = i0 + r - j0 + 1 < nc ? i0 + r - j0 + 1 : nc;  // the keys row r sees in this tile
        float ls = lse[i0 + r];
        #pragma omp simd
        for (int c = 0; c < ATT_TILE; c++) p[c] = c < ncv ? exp_fast(p[c] * scale - ls) : 0.0f;
    }
}

// qkv (B, T, 3*NH*hs) as attention_forward reads it: fp32 words, or (Q bf16) a --dtype bf16 run's q, k and v
// in the bf16 storage the layer keeps them in (gpt.cu's qkv_input), widened tile by tile: the bits of the
// same values in fp32 words.
// out (B, T, NH*hs) = softmax(q k^T / sqrt(hs), causal) v;  lse (B, NH, T) = log sum_u exp(q.k_u / sqrt(hs))
// over the keys u <= t of each row: all the backward needs besides q, k, v and out.
template <typename Q>
static void attention_fused_forward_cpu(float* out, float* lse, const Q* qkv, int B, int T, int NH, int hs) {
    const int C = NH * hs, C3 = 3 * C, NT = (T + ATT_TILE - 1) / ATT_TILE;
    const float scale = 1.0f / sqrtf((float)hs);
    cpu_for((long)B * NH * NT, [&](long task) {
        int qt = (int)(task % NT), h = (int)(task / NT % NH), b = (int)(task / NT / NH);
        const float sc = scale;  // (a local: through the captured reference, which s[c] below might alias, the max's loop ran scalar)
        const Q* q = qkv + (size_t)b * T * C3 + h * hs;
        const Q* k = q + C;
        const Q* v = q + 2 * C;
        int i0 = qt * ATT_TILE, nr = T - i0 < ATT_TILE ? T - i0 : ATT_TILE;
        float S[ATT_TILE * ATT_TILE], acc[ATT_TILE][ATT_HS_MAX], m[ATT_TILE], l[ATT_TILE];
        AttPanels kp;
        AttRows qbuf, vbuf;
        long ldq, ldv;
        const float* qr = att_rows(q + (long)i0 * C3, C3, nr, hs, &qbuf, &ldq);
        for (int r = 0; r < nr; r++) {
            m[r] = -FLT_MAX;
            l[r] = 0.0f;
            for (int d = 0; d < hs; d++) acc[r][d] = 0.0f;
        }
        for (int j0 = 0; j0 < i0 + nr; j0 += ATT_TILE) {  // key tiles up to the diagonal one
            int nc = T - j0 < ATT_TILE ? T - j0 : ATT_TILE;
            att_tile_panels(&kp, k + (long)j0 * C3, C3, nc, hs);
            att_tile_dots(S, qr, ldq, nr, &kp, hs, i0 - j0);
            for (int r = 0; r < nr; r++) {
                float* s = S + (long)r * ATT_TILE;
                int ncv = i0 + r - j0 + 1 < nc ? i0 + r - j0 + 1 : nc;
                float mx = m[r];
                #pragma omp simd reduction(max : mx)  // (a max is exact: any order, the same bits)
                for (int c = 0; c < ncv; c++) { s[c] *= sc; mx = s[c] > mx ? s[c] : mx; }
                // the running sum and output were taken against m[r]: rescale them to the new max
                float corr = exp_fast(m[r] - mx), sum = 0.0f;
                #pragma omp simd reduction(+ : sum)
                for (int c = 0; c < ncv; c++) { float e = exp_fast(s[c] - mx); s[c] = e; sum += e; }
                l[r] = l[r] * corr + sum;
                m[r] = mx;
                float* a = acc[r];
                #pragma omp simd
                for (int d = 0; d < hs; d++) a[d] *= corr;
                for (int c = ncv; c < nc; c++) s[c] = 0.0f;  // masked: no weight
            }
            const float* vr = att_rows(v + (long)j0 * C3, C3, nc, hs, &vbuf, &ldv);
            att_tile_gemm(acc[0], ATT_HS_MAX, nr, S, ATT_TILE, 1, nc, vr, ldv, hs, i0 - j0, false);  // acc += P v
        }
        for (int r = 0; r < nr; r++) {
            float inv = 1.0f / l[r];
            float* o = out + ((size_t)b * T + i0 + r) * C + h * hs;
            for (int d = 0; d < hs; d++) o[d] = acc[r][d] * inv;
            lse[((size_t)b * NH + h) * T + i0 + r] = m[r] + logf(l[r]);
        }
    });
}
// the recipe's form: qkv as the layer keeps it (Input)
static void attention_fused_forward_cpu(float* out, float* lse, Input qkv, int B, int T, int NH, int hs) {
    if (qkv.h) attention_fused_forward_cpu(out, lse, qkv.h, B, T, NH, hs);
    else attention_fused_forward_cpu(out, lse, qkv.f, B, T, NH, hs);
}

// D of one row of one head: the dot product of its dout and out (hs <= ATT_HS_MAX), in vector lanes
static float att_dsum_row(const float* d, const float* o, int hs) {
    float s = 0.0f;
    #pragma omp simd reduction(+ : s)
    for (int i = 0; i < hs; i++) s += d[i] * o[i];
    return s;
}
// ... from out in bf16 storage: the row widened first, so that the sum runs in the lanes and the order
// of the fp32 words' (the same bits from the same values)
static float att_dsum_row(const float* d, const bf16* o, int hs) {
    float w[ATT_HS_MAX];
    for (int i = 0; i < hs; i++) w[i] = as_fp32(o[i]);
    return att_dsum_row(d, w, hs);
}

// hs fp32 sums stored as a row of dqkv: themselves, or into bf16 storage each rounded to nearest (store_as)
static void att_store_row(float* dst, const float* src, int hs) { memcpy(dst, src, hs * sizeof(float)); }
static void att_store_row(bf16* dst, const float* src, int hs) {
    for (int d = 0; d < hs; d++) store_as(dst + d, src[d]);
}

// where the backward's one pass per head sums dq: in the head's columns of an fp32 dqkv (row stride C3),
// or in rows of its own (own, T x hs) where dqkv is bf16 storage
static float* att_dq_sums(float* dq_out, std::vector<float>*, int, int, long C3, long* ld) {
    *ld = C3;
    return dq_out;
}
static float* att_dq_sums(bf16*, std::vector<float>* own, int T, int hs, long, long* ld) {
    own->resize((size_t)T * hs);
    *ld = hs;
    return own->data();
}

// dqkv (B, T, 3*NH*hs) = gradient of attention_fused_forward given dout (B, T, NH*hs)   (written), from
// qkv, the forward's out and lse. dsum (B, NH, T) is scratch: D = rowsum(dout * out) per head. out is
// fp32 words, or (a --dtype bf16 run's, the bf16 copy of atty the layer keeps) bf16 storage, read where
// it lies: D is all the backward takes from it. qkv: as attention_fused_forward_cpu reads it (Q). O: dqkv
// in fp32, or (a bf16 run's: qkv's output gradient, which its matmuls take in bf16) bf16 storage, each
// fp32 sum rounded to nearest as it is stored: the bits of the fp32 dqkv rounded afterwards.
// D first; then, with enough heads for the threads, one pass per head over its key tiles that makes dk,
// dv and dq together, else two: dk and dv per key tile (over the query tiles that see it), dq per query tile.
template <typename Q, typename O>
static void attention_fused_backward_cpu(O* dqkv, float* dsum, const float* dout, const Q* qkv, Input out,
                                         const float* lse, int B, int T, int NH, int hs) {
    const int C = NH * hs, C3 = 3 * C, NT = (T + ATT_TILE - 1) / ATT_TILE;
    const float scale = 1.0f / sqrtf((float)hs);
    cpu_for((long)B * T, [&](long bt) {
        int b = (int)(bt / T), t = (int)(bt % T);
        for (int h = 0; h < NH; h++) {
            size_t off = (size_t)bt * C + h * hs;
            dsum[((size_t)b * NH + h) * T + t] = out.h ? att_dsum_row(dout + off, out.h + off, hs) : att_dsum_row(dout + off, out.f + off, hs);
        }
    });
    // the operands of head h of batch row b: its q, k, v (rows C3 apart), dout rows, lse and D
    struct Head { const Q *q, *k, *v; const float *dO, *ls, *D; };
    auto head_of = [&](long b, int h) {
        const Q* q = qkv + (size_t)b * T * C3 + h * hs;
        return Head{q, q + C, q + 2 * C, dout + (size_t)b * T * C + h * hs, lse + ((size_t)b * NH + h) * T, dsum + ((size_t)b * NH + h) * T};
    };
    // dS (nr, ATT_TILE) = P * (dP - D) * scale in place over dP, the gradient of the scaled scores (q: the
    // query tile's rows, att_rows; kp, vp: the panels of key tile j0's k and v)
    auto tile_grad = [&](float* P, float* dP, const Head& hd, const float* q, long ldq, int i0, int nr, int j0, int nc,
                         const AttPanels* kp, const AttPanels* vp) {
        att_tile_probs(P, q, ldq, kp, hd.ls, i0, nr, j0, nc, hs, scale);
        att_tile_dots(dP, hd.dO + (long)i0 * C, C, nr, vp, hs, i0 - j0);  // dP = dO v^T
        for (int r = 0; r < nr; r++) {
            float* g = dP + (long)r * ATT_TILE;
            const float* p = P + (long)r * ATT_TILE;
            float dr = hd.D[i0 + r];
            #pragma omp simd
            for (int c = 0; c < ATT_TILE; c++) g[c] = p[c] * (g[c] - dr) * scale;
        }
    };
    // dk, dv of key tile kt: sums over the query tiles qt >= kt, in order, and rows in order. With dq_rows
    // (this head's dq, T rows dq_ld apart, zeroed), each tile's dS k is added to the dq of its query tile too.
    auto key_tile = [&](long b, int h, int kt, float* dq_rows, long dq_ld) {
        Head hd = head_of(b, h);
        int j0 = kt * ATT_TILE, nc = T - j0 < ATT_TILE ? T - j0 : ATT_TILE;
        float P[ATT_TILE * ATT_TILE], dS[ATT_TILE * ATT_TILE], dk[ATT_TILE][ATT_HS_MAX], dv[ATT_TILE][ATT_HS_MAX];
        AttPanels kp, vp;  // the tile's k and v, for every query tile below it
        AttRows qbuf, kbuf;
        long ldq, ldk;
        att_tile_panels(&kp, hd.k + (long)j0 * C3, C3, nc, hs);
        att_tile_panels(&vp, hd.v + (long)j0 * C3, C3, nc, hs);
        const float* kr = dq_rows ? att_rows(hd.k + (long)j0 * C3, C3, nc, hs, &kbuf, &ldk) : nullptr;
        for (int c = 0; c < nc; c++)
            for (int d = 0; d < hs; d++) dk[c][d] = dv[c][d] = 0.0f;
        for (int i0 = j0; i0 < T; i0 += ATT_TILE) {
            int nr = T - i0 < ATT_TILE ? T - i0 : ATT_TILE;
            const float* qr = att_rows(hd.q + (long)i0 * C3, C3, nr, hs, &qbuf, &ldq);
            tile_grad(P, dS, hd, qr, ldq, i0, nr, j0, nc, &kp, &vp);
            att_tile_gemm(dv[0], ATT_HS_MAX, nc, P, 1, ATT_TILE, nr, hd.dO + (long)i0 * C, C, hs, i0 - j0, true);  // dv += P^T dO
            att_tile_gemm(dk[0], ATT_HS_MAX, nc, dS, 1, ATT_TILE, nr, qr, ldq, hs, i0 - j0, true);                  // dk += dS^T q
            if (dq_rows)  // dq += dS k (dS 0 past the diagonal)
                att_tile_gemm(dq_rows + (long)i0 * dq_ld, dq_ld, nr, dS, ATT_TILE, 1, nc, kr, ldk, hs, i0 - j0, false);
        }
        for (int c = 0; c < nc; c++) {
            O* row = dqkv + ((size_t)b * T + j0 + c) * C3 + h * hs;
            att_store_row(row + C, dk[c], hs);
            att_store_row(row + 2 * C, dv[c], hs);
        }
    };
    // One pass per head when there are at least twice as many heads as threads: its key tiles in order, so
    // the dq of query tile qt gets the key tiles' dS k in the order kt = 0, 1, .., qt, as the dq pass below
    // sums them (the same bits either way), and each tile's P and dS are computed once instead of twice
    // (the two passes do 9 tile products a tile, this one 5: 1.3-1.4x faster). Fewer heads than that would
    // leave threads idle, and the two passes split finer, by tiles, as the CUDA kernels do.
    // dq is summed over the key tiles in place: in the head's columns of an fp32 dqkv, else in fp32 rows of
    // its own, stored rounded once it is whole.
    if ((long)B * NH >= 2L * cpu_pool_threads()) {
        cpu_for((long)B * NH, [&](long task) {
            int h = (int)(task % NH);
            long b = task / NH;
            O* dq_out = dqkv + (size_t)b * T * C3 + h * hs;
            std::vector<float> own;
            long dq_ld;
            float* dq_rows = att_dq_sums(dq_out, &own, T, hs, C3, &dq_ld);
            for (int t = 0; t < T; t++) memset(dq_rows + (long)t * dq_ld, 0, hs * sizeof(float));
            for (int kt = 0; kt < NT; kt++) key_tile(b, h, kt, dq_rows, dq_ld);
            if (!own.empty())
                for (int t = 0; t < T; t++) att_store_row(dq_out + (long)t * C3, dq_rows + (long)t * dq_ld, hs);
        });
        return;
    }
    cpu_for((long)B * NH * NT, [&](long task) { key_tile(task / NT / NH, (int)(task / NT % NH), (int)(task % NT), nullptr, 0); });
    // dq of query tile qt: sums over the key tiles up to the diagonal, in order
    cpu_for((long)B * NH * NT, [&](long task) {
        int qt = (int)(task % NT), h = (int)(task / NT % NH), b = (int)(task / NT / NH);
        Head hd = head_of(b, h);
        int i0 = qt * ATT_TILE, nr = T - i0 < ATT_TILE ? T - i0 : ATT_TILE;
        float P[ATT_TILE * ATT_TILE], dS[ATT_TILE * ATT_TILE], dq[ATT_TILE][ATT_HS_MAX];
        AttPanels kp, vp;
        AttRows qbuf, kbuf;
        long ldq, ldk;
        const float* qr = att_rows(hd.q + (long)i0 * C3, C3, nr, hs, &qbuf, &ldq);
        for (int r = 0; r < nr; r++)
            for (int d = 0; d < hs; d++) dq[r][d] = 0.0f;
        for (int j0 = 0; j0 < i0 + nr; j0 += ATT_TILE) {
            int nc = T - j0 < ATT_TILE ? T - j0 : ATT_TILE;
            att_tile_panels(&kp, hd.k + (long)j0 * C3, C3, nc, hs);
            att_tile_panels(&vp, hd.v + (long)j0 * C3, C3, nc, hs);
            tile_grad(P, dS, hd, qr, ldq, i0, nr, j0, nc, &kp, &vp);
            const float* kr = att_rows(hd.k + (long)j0 * C3, C3, nc, hs, &kbuf, &ldk);
            att_tile_gemm(dq[0], ATT_HS_MAX, nr, dS, ATT_TILE, 1, nc, kr, ldk, hs, i0 - j0, false);  // dq += dS k (dS 0 past the diagonal)
        }
        for (int r = 0; r < nr; r++) att_store_row(dqkv + ((size_t)b * T + i0 + r) * C3 + h * hs, dq[r], hs);
    });
}
// the recipe's form: qkv as the layer keeps it (Input); dqkv fp32, or bf16 storage (O)
template <typename O>
static void attention_fused_backward_cpu(O* dqkv, float* dsum, const float* dout, Input qkv, Input out, const float* lse,
                                         int B, int T, int NH, int hs) {
    if (qkv.h) attention_fused_backward_cpu(dqkv, dsum, dout, qkv.h, out, lse, B, T, NH, hs);
    else attention_fused_backward_cpu(dqkv, dsum, dout, qkv.f, out, lse, B, T, NH, hs);
}

// ----------------------------------------------------------------------------
// Vocab-parallel softmax cross-entropy, in three local steps around two all-reduces.
// logits (N, Vl) are this rank's columns [v0, v0+Vl) of the padded vocab; only columns < V are real.

// how many of a rank's Vl vocab columns, starting at global column v0, are real (< V) rather than padding
// (the argument order of the ops: Vl, v0, V; kernels.cuh uses it too)
static inline int real_columns(int Vl, int v0, int V) { return V - v0 < Vl ? (V - v0 > 0 ? V - v0 : 0) : Vl; }

// maxes (N) = the largest real logit of each row in this rank's columns (-FLT_MAX if it has none).
// L: the logits in fp32, or bf16 storage (a bf16 run's, read widened; the recipe passes Logits)
template <typename L>
static void crossentropy_max_cpu(float* maxes, const L* logits, int N, int Vl, int v0, int V) {
    int nv = real_columns(Vl, v0, V);
    cpu_for(N, [&](long n_) {
        int n = (int)n_;
        const L* l = logits + (size_t)n * Vl;
        float m = -FLT_MAX;
        for (int i = 0; i < nv; i++) m = as_fp32(l[i]) > m ? as_fp32(l[i]) : m;
        maxes[n] = m;
    });
}

// sums (N, 2): [0] = sum of exp(logit - max) over this rank's real columns,
//              [1] = the target's logit if this rank owns the target, else 0
template <typename L>
static void crossentropy_sums_cpu(float* sums, const L* logits, const float* maxes, const int* targets,
                                  int N, int Vl, int v0, int V) {
    int nv = real_columns(Vl, v0, V);
    cpu_for(N, [&](long n_) {
        int n = (int)n_;
        const L* l = logits + (size_t)n * Vl;
        // 16 running sums, lane k over the columns i with i % 16 == k, then added pairwise: a fixed order
        // (an omp simd reduction's would depend on the vector width the compiler picks for L), so logits
        // in bf16 storage and the same values in fp32 words give the same bits
        float m = maxes[n], acc[16] = {0};
        int i = 0;
        for (; i + 16 <= nv; i += 16) {
            #pragma omp simd
            for (int k = 0; k < 16; k++) acc[k] += exp_fast(as_fp32(l[i + k]) - m);
        }
        for (; i < nv; i++) acc[i % 16] += exp_fast(as_fp32(l[i]) - m);
        for (int w = 8; w > 0; w /= 2)
            for (int k = 0; k < w; k++) acc[k] += acc[k + w];
        float s = acc[0];
        int col = targets[n] - v0;
        sums[2 * n] = s;
        sums[2 * n + 1] = (col >= 0 && col < Vl) ? as_fp32(l[col]) : 0.0f;
    });
}

// dlogits in the logits' storage: fp32, or bf16 rounded to nearest (a bf16 run's, the head's output
// gradient, which its matmuls multiply as bf16; common/bf16.h)

// losses (N) = log(sum) - (target logit - max), the same on every rank once maxes and sums are global.
// If dscale != 0, logits are overwritten in place by dlogits = (softmax - onehot(target)) * dscale,
// zero in the padded columns: the forward and the backward of the loss fused, as llm.c does.
template <typename L>
static void crossentropy_finish_cpu(float* losses, L* logits, const float* maxes, const float* sums,
                                    const int* targets, int N, int Vl, int v0, int V, float dscale) {
    int nv = real_columns(Vl, v0, V);
    cpu_for(N, [&](long n_) {
        int n = (int)n_;
        float m = maxes[n], s = sums[2 * n];
        losses[n] = logf(s) - (sums[2 * n + 1] - m);
        if (dscale == 0.0f) return;
        L* l = logits + (size_t)n * Vl;
        float inv = 1.0f / s;
        int col = targets[n] - v0;
        for (int i = 0; i < Vl; i++) {
            float p = i < nv ? exp_fast(as_fp32(l[i]) - m) * inv : 0.0f;
            store_as(l + i, (p - (i == col ? 1.0f : 0.0f)) * dscale);
        }
    });
}

// the recipe's forms: the logits in the run's storage
static void crossentropy_max_cpu(float* maxes, Logits lg, int N, int Vl, int v0, int V) {
    if (lg.h) crossentropy_max_cpu(maxes, (const bf16*)lg.h, N, Vl, v0, V);
    else crossentropy_max_cpu(maxes, (const float*)lg.f, N, Vl, v0, V);
}
static void crossentropy_sums_cpu(float* sums, Logits lg, const float* maxes, const int* targets, int N, int Vl, int v0, int V) {
    if (lg.h) crossentropy_sums_cpu(sums, (const bf16*)lg.h, maxes, targets, N, Vl, v0, V);
    else crossentropy_sums_cpu(sums, (const float*)lg.f, maxes, targets, N, Vl, v0, V);
}
static void crossentropy_finish_cpu(float* losses, Logits lg, const float* maxes, const float* sums, const int* targets,
                                    int N, int Vl, int v0, int V, float dscale) {
    if (lg.h) crossentropy_finish_cpu(losses, lg.h, maxes, sums, targets, N, Vl, v0, V, dscale);
    else crossentropy_finish_cpu(losses, lg.f, maxes, sums, targets, N, Vl, v0, V, dscale);
}

// ----------------------------------------------------------------------------
// Optimizer

// AdamW as llm.c: bias-corrected moments, decoupled weight decay. t counts from 1. Global-norm clipping:
// norm2 (2) holds the squared gradient norm as [sharded part, replicated part]; when clip > 0 and the
// norm exceeds it, the gradients are scaled by clip / norm first (clip 0: off).
// G: the gradients in fp32, or a bf16 run's bf16 storage (widened exactly)
template <typename G>
static void adamw_cpu(float* params, const G* grads, float* m, float* v, long n, float lr, float beta1,
                      float beta2, float eps, float wd, int t, const float* norm2, float clip) {
    float norm = sqrtf(norm2[0] + norm2[1]);
    float grad_scale = clip > 0.0f && norm > clip ? clip / norm : 1.0f;
    float bc1 = 1.0f - powf(beta1, (float)t), bc2 = 1.0f - powf(beta2, (float)t);
    // ranges, so the loop vectorises (sqrt and division are correctly rounded in vectors as in scalars)
    cpu_for_range(n, [&](long lo, long hi) {
        #pragma omp simd
        for (long i = lo; i < hi; i++) {
            float g = as_fp32(grads[i]) * grad_scale;
            float mi = beta1 * m[i] + (1.0f - beta1) * g;
            float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
            m[i] = mi;
            v[i] = vi;
            float mhat = mi / bc1, vhat = vi / bc2;
            params[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * params[i]);
        }
    });
}

// norm2 (1) += the sum of squares of x (n), summed in double over fixed 4096-element blocks added in
// order: the result does not depend on the thread count. T: fp32, or bf16 storage (a bf16 run's gradients)
template <typename T>
static void sumsq_cpu(float* norm2, const T* x, long n) {
    const long BS = 4096;
    long nb = (n + BS - 1) / BS;
    std::vector<double> part(nb);
    cpu_for(nb, [&](long b_) {
        long b = (long)b_;
        double s = 0.0;
        for (long i = b * BS; i < n && i < (b + 1) * BS; i++) {
            double v = as_fp32(x[i]);
            s += v * v;
        }
        part[b] = s;
    });
    double s = 0.0;
    for (long b = 0; b < nb; b++) s += part[b];
    norm2[0] += (float)s;
}

// ----------------------------------------------------------------------------
// Serving: a KV cache of this rank's NH heads, (B, NH, Tmax, hs) for k and for v, and attention of one
// new position per row against it. pos (B) is where each row's new token sits in its cache.

// x (N, C) += wpe[pos[n]]: the position embedding of row n at its own position (decode: row b of the
// batch is at the end of its own sequence, and the sequences have different lengths)
static void position_rows_forward_cpu(float* x, const float* wpe, const int* pos, int N, int C) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* p = wpe + (size_t)pos[n] * C;
        float* o = x + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] += p[c];
    }
}

// qkv (B, T, 3*NH*hs) as attention_forward reads it. Writes the k and v of row (b, t) into the caches
// kc, vc (B, NH, Tmax, hs) at position pos[b] + t; positions at or past Tmax are not written. Prefill:
// pos 0 and T the prompt's tokens; decode: T = 1 and pos the row's length.
static void kv_write_cpu(float* kc, float* vc, const float* qkv, const int* pos, int B, int T, int NH, int Tmax, int hs) {
    const int C = NH * hs;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            int p = pos[b] + t;
            if (p < 0 || p >= Tmax) continue;
            const float* row = qkv + ((size_t)b * T + t) * 3 * C;
            for (int h = 0; h < NH; h++) {
                size_t dst = (((size_t)b * NH + h) * Tmax + p) * hs;
                memcpy(kc + dst, row + C + h * hs, hs * sizeof(float));
                memcpy(vc + dst, row + 2 * C + h * hs, hs * sizeof(float));
            }
        }
}

// out (B, NH*hs): the attention of one query per row against its cache. q of row b is qkv (B, 1, 3*NH*hs)
// at b; it attends to cache positions 0..pos[b] (its own k and v already written there by kv_write):
// out = softmax(q k^T / sqrt(hs)) v, the last row of attention_forward's causal square, computed as that
// row is: the scores and the product with v through gemm_cpu (the same sums in the same order), and the
// softmax steps of attention_probs_head. On the CPU the cached logits are then the full forward's with
// --attention matmul; fused attention's prefill and full forward round differently (the serve tests' bounds).
static void attention_decode_cpu(float* out, const float* qkv, const float* kc, const float* vc, const int* pos,
                                 int B, int NH, int Tmax, int hs) {
    const int C = NH * hs;
    const float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            int n = pos[b] + 1 < Tmax ? pos[b] + 1 : Tmax;
            const float* q = qkv + (size_t)b * 3 * C + h * hs;
            const float* k = kc + ((size_t)b * NH + h) * Tmax * hs;
            const float* v = vc + ((size_t)b * NH + h) * Tmax * hs;
            std::vector<float> a(n);
            gemm_cpu(1, n, hs, q, hs, 1, k, 1, hs, a.data(), n, false, nullptr);  // a (1, n) = q k^T
            float maxv = -FLT_MAX;
            for (int t = 0; t < n; t++) { a[t] *= scale; maxv = a[t] > maxv ? a[t] : maxv; }
            float sum = 0.0f;
            #pragma omp simd reduction(+ : sum)
            for (int t = 0; t < n; t++) { float e = exp_fast(a[t] - maxv); a[t] = e; sum += e; }
            float inv = 1.0f / sum;
            for (int t = 0; t < n; t++) a[t] *= inv;
            gemm_cpu(1, hs, n, a.data(), n, 1, v, hs, 1, out + (size_t)b * C + h * hs, C, false, nullptr);  // a v
        }
}

#include "common/bf16.h"  // the bf16 GEMM declared above (it needs gemm_cpu, so it comes after)
