// bf16.h: bfloat16 on the CPU: conversions, stochastic rounding, and a GEMM with fp32 accumulation.
//
// bf16 is the top half of an fp32: the same sign and 8-bit exponent, 7 bits of mantissa. A product of two
// bf16 numbers is exact in fp32 (8 x 8 significant bits fit in 24), so a bf16 dot product accumulated
// in fp32 rounds once per term, exactly as an fp32 fma chain does.
//
// The GEMM runs on AVX512-BF16's vdpbf16ps where the CPU has it (checked at run time), and otherwise
// computes the same numbers with fp32 fmas: vdpbf16ps adds, per fp32 lane i, the product of the pair's
// odd elements (2i+1) and then that of its even ones (2i), each rounded to nearest even, denormals
// flushed (as tp's threads run anyway: common/cpu_pool.h sets FTZ|DAZ in every thread). That is an fma
// chain over k in the order 1, 0, 3, 2, 5, 4, ..., which is what the fp32 GEMM (gemm_cpu, one fma chain
// over k in increasing order) computes on the operands widened to fp32 with each pair of k swapped. So
// the two paths are bit-identical (the bf16 test checks it on the CPU that runs it), and the fp32 one is
// no slower per flop than the fp32 GEMM itself. bf16_path below chooses between them.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <vector>
#include <immintrin.h>
#include "../kernels_cpu.h"

typedef uint16_t bf16;

// The scalar functions and the index map below are the same code on the CPU and in CUDA kernels
// (kernels.cuh), so a GPU rounds every element to the CPU's bits.
#ifdef __CUDACC__
#define BF16_HD __host__ __device__
#else
#define BF16_HD
#endif

static inline BF16_HD float bf16_to_float(bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

// round to nearest, ties to even (as every fp32 to bf16 conversion of llm.c's and PyTorch's); a NaN stays
// a (quiet) NaN rather than rounding into infinity
static inline BF16_HD bf16 bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}

// 32 random bits from a 64-bit key (splitmix64's finaliser: every input bit moves every output bit)
static inline BF16_HD uint32_t bf16_noise(uint64_t key) {
    key += 0x9e3779b97f4a7c15ull;
    key = (key ^ (key >> 30)) * 0xbf58476d1ce4e5b9ull;
    key = (key ^ (key >> 27)) * 0x94d049bb133111ebull;
    return (uint32_t)((key ^ (key >> 31)) >> 32);
}

// Stochastic rounding: f rounds up to the next bf16 with probability (its distance from the bf16 below)
// / (the gap), so the rounding is unbiased: E[bf16_round_stochastic(f)] = f. The 16 random bits come from
// the element's index in the full (unsharded) tensor, the step and a seed, never from the rank, the
// thread or the launch geometry: TP=P rounds every element exactly as TP=1, replicas round alike, and a
// resume at the same step re-derives the same bf16 weights.
static inline BF16_HD bf16 bf16_round_stochastic(float f, uint64_t index, uint32_t step, uint32_t seed) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7f800000u) == 0x7f800000u) return bf16_round(f);  // inf and NaN: nothing to round
    uint32_t r = bf16_noise(index * 0x100000001b3ull ^ ((uint64_t)step << 32 | seed)) >> 16;
    return (bf16)((u + r) >> 16);  // adds below the kept bits: carries into them with the right odds
}

// ----------------------------------------------------------------------------
// The bf16 copy of a rank's fp32 master weights
//
// A TP rank holds a shard of each parameter tensor (gpt.cu's shard plan): some of its rows (the column-
// parallel tensors; the q, k and v thirds of qkvw each), some of its columns (the row-parallel ones), or
// all of it. The noise of an element's stochastic rounding is keyed on its index in the full parameter
// vector, so FullIndex says where local element i of a shard sits there:
//   local layer l, row r, column c (row-major over (layers, lrows, lcols)) is full layer layer0 + l,
//   full row (r / row_block) * row_stride + row0 + r % row_block, full column col0 + c,
//   of a tensor of (rows, cols) per layer that starts at base.
struct FullIndex {
    long lrows, lcols;                 // the shard's shape per layer
    long rows, cols;                   // the full tensor's shape per layer
    long row_block, row_stride, row0;  // the rows: blocks of row_block local rows, row_stride apart in the full tensor
    long col0;                         // the first full column
    long layer0;                       // the first full layer
    long base;                         // the full tensor's first element in the full parameter vector
};

static inline BF16_HD long full_index(const FullIndex& m, long i) {
    long per = m.lrows * m.lcols, l = i / per, rc = i - l * per, r = rc / m.lcols, c = rc - r * m.lcols;
    long fr = r / m.row_block * m.row_stride + m.row0 + r % m.row_block;
    return m.base + ((m.layer0 + l) * m.rows + fr) * m.cols + m.col0 + c;
}

// out (n) = master (n) rounded stochastically to bf16, where master and out start at local element i0 of a
// shard that map places: elements i0 .. i0 + n - 1 (the whole shard, or the slice ZeRO-1 gives a replica).
// The same bits for any P, rank, slice, thread count or (on a GPU) launch: each element's rounding depends
// on its value, its full index, the step and the seed alone.
// The copy is bf16 itself (bf16 storage), or fp32 holding bf16 values (widened exactly): what a --dtype
// bf16 run computes from today, with the same numbers bf16 storage will give.
static inline BF16_HD void bf16_put(bf16* out, bf16 h) { *out = h; }
static inline BF16_HD void bf16_put(float* out, bf16 h) { *out = bf16_to_float(h); }

template <typename W>
static void bf16_from_master_cpu(W* out, const float* master, long i0, long n, FullIndex map, uint32_t step, uint32_t seed) {
    cpu_for_range(n, [&](long lo, long hi) {
        for (long j = lo; j < hi; j++) bf16_put(out + j, bf16_round_stochastic(master[j], (uint64_t)full_index(map, i0 + j), step, seed));
    });
}

// x (n) = x rounded to the nearest bf16 (ties to even), in place: an activation a --dtype bf16 run keeps in
// bf16, held in fp32 (widened exactly), so the next op reads the bf16 value, as from bf16 storage
static void round_bf16_cpu(float* x, long n) {
    cpu_for_range(n, [&](long lo, long hi) {
        for (long j = lo; j < hi; j++) x[j] = bf16_to_float(bf16_round(x[j]));
    });
}

// ----------------------------------------------------------------------------
// GEMM: C (M x N) = [C +] A (M x K) . B (K x N) [+ bias (N)], A and B bf16 through two strides each (as
// gemm_cpu in kernels_cpu.h: a(m,k) = A[m*a_rs + k*a_cs], b(k,n) = B[k*b_rs + n*b_cs]), C and bias fp32.
//
// K is taken in pairs, as vdpbf16ps takes it: both operands are packed so that a 32-bit word holds
// elements 2j (low half) and 2j+1 (high half) of a row of A or a column of B (a zero pads an odd K).
// Each C element is then one chain over the pairs j in increasing order, starting from 0, then + bias,
// then added to the old C: for any blocking, tile or thread count the same bits.
//
// vdpbf16ps's tile is 8 rows by 32 columns (16 accumulators, 2 B vectors, a broadcast). A K block of KC
// pairs keeps a B panel (KC x 32 words, 16 KB) in L1 while the row tiles of a unit stream past it; a unit
// of MT x NT tiles keeps its A rows in L2.

// This core's peak GFLOP/s, from loops of 12 independent accumulators in registers over n steps: fp32
// fmas (2 flops a lane), vdpbf16ps (4 flops a lane; 0 where the build or the CPU has none)
static inline double bf16_thread_seconds() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static double bf16_peak_fma(long n) {
#if defined(__AVX512F__) || defined(__FMA__)
#if defined(__AVX512F__)
    typedef __m512 V;
#define BF_FMA _mm512_fmadd_ps
#define BF_SET1 _mm512_set1_ps
#else
    typedef __m256 V;
#define BF_FMA _mm256_fmadd_ps
#define BF_SET1 _mm256_set1_ps
#endif
    V c[12], a = BF_SET1(0.999f), b = BF_SET1(1e-3f);
    for (int i = 0; i < 12; i++) c[i] = BF_SET1((float)i);
    double t = bf16_thread_seconds();
    for (long k = 0; k < n; k++)
        for (int i = 0; i < 12; i++) c[i] = BF_FMA(c[i], a, b);
    t = bf16_thread_seconds() - t;
    for (int i = 1; i < 12; i++) c[0] = c[0] + c[i];  // every chain is used, so none is left out
    volatile float sink;
    memcpy((void*)&sink, &c[0], sizeof(float));
    return t > 0 ? 12.0 * n * (sizeof(V) / 4) * 2 / t * 1e-9 : 0;
#undef BF_FMA
#undef BF_SET1
#else
    (void)n;
    return 0;
#endif
}
#if defined(__AVX512F__)
__attribute__((target("avx512bf16"), noinline)) static double bf16_peak_dp_avx512(long n) {
    __m512 c[12];
    __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f7f3f7f), b = (__m512bh)_mm512_set1_epi32(0x3a833a83);
    for (int i = 0; i < 12; i++) c[i] = _mm512_set1_ps((float)i);
    double t = bf16_thread_seconds();
    for (long k = 0; k < n; k++)
        for (int i = 0; i < 12; i++) c[i] = _mm512_dpbf16_ps(c[i], a, b);
    t = bf16_thread_seconds() - t;
    for (int i = 1; i < 12; i++) c[0] = _mm512_add_ps(c[0], c[i]);
    volatile float sink;
    memcpy((void*)&sink, &c[0], sizeof(float));
    return t > 0 ? 12.0 * n * 16 * 4 / t * 1e-9 : 0;
}
#endif

// the CPU can run vdpbf16ps (the build's vector code is AVX-512)
static inline bool bf16_dp_supported() {
#if defined(__AVX512F__)
    static const bool has = __builtin_cpu_supports("avx512bf16");
    return has;
#else
    return false;
#endif
}
static double bf16_peak_dp(long n) {
#if defined(__AVX512F__)
    if (bf16_dp_supported()) return bf16_peak_dp_avx512(n);
#endif
    (void)n;
    return 0;
}

// Which path the GEMM takes. Both give the same bits, so this is a matter of speed only: vdpbf16ps does
// twice an fma's flops per lane, but not every core issues it as often (on this project's Intel host it
// peaks at 86 GFLOP/s against 170 for fp32 fmas, so the fp32 path is faster there). BF16_AUTO measures
// both peaks once (a few ms) and takes vdpbf16ps where its peak is the higher.
enum Bf16Path { BF16_AUTO, BF16_DP, BF16_FMA };
static Bf16Path bf16_path = BF16_AUTO;
static inline bool bf16_dp_used() {
    if (!bf16_dp_supported() || bf16_path == BF16_FMA) return false;
    if (bf16_path == BF16_DP) return true;
    static const bool faster = bf16_peak_dp(300000) > bf16_peak_fma(300000);
    return faster;
}

// The fp32 path: the operands widened to fp32 with each pair of k swapped (row k2 of B' is row k2 ^ 1 of
// B, a k past an odd K zero), then the fp32 GEMM over K' = 2 ceil(K/2). Each operand keeps its
// orientation, so it is read and written along its contiguous side.
static void gemm_bf16_fma_cpu(int M, int N, int K, const bf16* A, long a_rs, long a_cs, const bf16* B, long b_rs,
                              long b_cs, float* Cm, long ldc, bool accumulate, const float* bias) {
    const int K2 = 2 * ((K + 1) / 2);
    static thread_local std::vector<float> wideA, wideB;
    if (wideA.size() < (size_t)M * K2) wideA.resize((size_t)M * K2);
    if (wideB.size() < (size_t)K2 * N) wideB.resize((size_t)K2 * N);
    float* wa = wideA.data();  // (a thread_local named inside a cpu_for chunk would be the worker's own)
    float* wb = wideB.data();
    // a row of M x K2 (A by rows) or of K2 x M (A by columns: a transpose, a_rs == 1) from a row or a column of A
    const bool a_cols = a_rs == 1 && a_cs != 1, b_cols = b_rs == 1 && b_cs != 1;
    cpu_for(a_cols ? K2 : M, [&](long i) {
        float* d = wa + (size_t)i * (a_cols ? M : K2);
        if (a_cols) {
            const long k = i ^ 1;
            for (int m = 0; m < M; m++) d[m] = k < K ? bf16_to_float(A[k * a_cs + m]) : 0.0f;
        } else
            for (int k2 = 0; k2 < K2; k2++) d[k2] = (k2 ^ 1) < K ? bf16_to_float(A[i * a_rs + (long)(k2 ^ 1) * a_cs]) : 0.0f;
    });
    cpu_for(b_cols ? N : K2, [&](long i) {
        float* d = wb + (size_t)i * (b_cols ? K2 : N);
        if (b_cols)
            for (int k2 = 0; k2 < K2; k2++) d[k2] = (k2 ^ 1) < K ? bf16_to_float(B[(long)(k2 ^ 1) * b_rs + i * b_cs]) : 0.0f;
        else {
            const long k = i ^ 1;
            for (int n = 0; n < N; n++) d[n] = k < K ? bf16_to_float(B[k * b_rs + n * b_cs]) : 0.0f;
        }
    });
    gemm_cpu(M, N, K2, wa, a_cols ? 1 : K2, a_cols ? M : 1, wb, b_cols ? 1 : N, b_cols ? K2 : 1, Cm,
             ldc, accumulate, bias);
}

#if defined(__AVX512F__)
#define BF16_MR 8
#define BF16_VL 16
#define BF16_NR (2 * BF16_VL)
#define BF16_KC (16384 / (BF16_NR * 4))
#define BF16_MT 16
#define BF16_NT 8

// acc (MR x NR, row-major) += a (kc pairs x MR words) . b (kc pairs x NR words) with vdpbf16ps: one
// instruction does both fmas of 16 lanes (only called where the CPU has it)
__attribute__((target("avx512bf16"), noinline)) static void gemm_bf16_tile_dp(float* acc, const uint32_t* a,
                                                                              const uint32_t* b, int kc) {
    __m512 c[BF16_MR][2];
    for (int r = 0; r < BF16_MR; r++) {
        c[r][0] = _mm512_loadu_ps(acc + r * BF16_NR);
        c[r][1] = _mm512_loadu_ps(acc + r * BF16_NR + BF16_VL);
    }
    for (int j = 0; j < kc; j++) {
        __m512bh w0 = (__m512bh)_mm512_loadu_si512((const void*)(b + (size_t)j * BF16_NR));
        __m512bh w1 = (__m512bh)_mm512_loadu_si512((const void*)(b + (size_t)j * BF16_NR + BF16_VL));
        for (int r = 0; r < BF16_MR; r++) {
            __m512bh x = (__m512bh)_mm512_set1_epi32((int)a[(size_t)j * BF16_MR + r]);
            c[r][0] = _mm512_dpbf16_ps(c[r][0], x, w0);
            c[r][1] = _mm512_dpbf16_ps(c[r][1], x, w1);
        }
    }
    for (int r = 0; r < BF16_MR; r++) {
        _mm512_storeu_ps(acc + r * BF16_NR, c[r][0]);
        _mm512_storeu_ps(acc + r * BF16_NR + BF16_VL, c[r][1]);
    }
}

static inline uint32_t bf16_pair(bf16 even, bf16 odd) { return (uint32_t)even | (uint32_t)odd << 16; }

// the vdpbf16ps path
static void gemm_bf16_dp_cpu(int M, int N, int K, const bf16* A, long a_rs, long a_cs, const bf16* B, long b_rs,
                             long b_cs, float* Cm, long ldc, bool accumulate, const float* bias) {
    const int MB = (M + BF16_MR - 1) / BF16_MR, NB = (N + BF16_NR - 1) / BF16_NR, KP = (K + 1) / 2;
    // the packed operands belong to the calling (rank) thread and only grow
    static thread_local std::vector<uint32_t> packA, packB;
    if (packA.size() < (size_t)MB * BF16_MR * KP) packA.resize((size_t)MB * BF16_MR * KP);
    if (packB.size() < (size_t)NB * BF16_NR * KP) packB.resize((size_t)NB * BF16_NR * KP);
    uint32_t* Ap = packA.data();
    uint32_t* Bp = packB.data();
    // Ap[mb][j][r] = (a(m, 2j), a(m, 2j+1)), m = mb*MR + r; rows past M and the k past K are zero. A row
    // of A that lies contiguous with an even K is already a row of pairs (one 32-bit load per pair).
    cpu_for(MB, [&](long mb) {
        uint32_t* d = Ap + (size_t)mb * BF16_MR * KP;
        for (int r = 0; r < BF16_MR; r++) {
            const long m = mb * BF16_MR + r;
            const bf16* s = A + m * a_rs;
            if (m >= M) {
                for (int j = 0; j < KP; j++) d[(size_t)j * BF16_MR + r] = 0;
            } else if (a_cs == 1 && K % 2 == 0) {
                for (int j = 0; j < KP; j++) memcpy(d + (size_t)j * BF16_MR + r, s + 2 * j, 4);
            } else {
                for (int j = 0; j < KP; j++) {
                    bf16 o = 2 * j + 1 < K ? s[(long)(2 * j + 1) * a_cs] : 0;
                    d[(size_t)j * BF16_MR + r] = bf16_pair(s[(long)(2 * j) * a_cs], o);
                }
            }
        }
    });
    // Bp[nb][j][c] = (b(2j, n), b(2j+1, n)), n = nb*NR + c; columns past N zero. A column of B that lies
    // contiguous (a weight in the forward) with an even K is a column of pairs; contiguous rows (b_cs 1)
    // interleave two rows into a panel row of pairs.
    cpu_for(NB, [&](long nb) {
        uint32_t* d = Bp + (size_t)nb * BF16_NR * KP;
        const int n0 = (int)nb * BF16_NR, nc = N - n0 < BF16_NR ? N - n0 : BF16_NR;
        if (b_cs == 1 && nc == BF16_NR) {
            for (int j = 0; j < KP; j++) {
                const bf16* e = B + (long)(2 * j) * b_rs + n0;
                const bf16* o = B + (long)(2 * j + 1) * b_rs + n0;
                uint32_t* w = d + (size_t)j * BF16_NR;
                if (2 * j + 1 < K)
                    for (int c = 0; c < BF16_NR; c++) w[c] = bf16_pair(e[c], o[c]);
                else
                    for (int c = 0; c < BF16_NR; c++) w[c] = bf16_pair(e[c], 0);
            }
            return;
        }
        for (int c = 0; c < BF16_NR; c++) {
            const long n = n0 + c;
            const bf16* s = B + n * b_cs;
            if (c >= nc) {
                for (int j = 0; j < KP; j++) d[(size_t)j * BF16_NR + c] = 0;
            } else if (b_rs == 1 && K % 2 == 0) {
                for (int j = 0; j < KP; j++) memcpy(d + (size_t)j * BF16_NR + c, s + 2 * j, 4);
            } else {
                for (int j = 0; j < KP; j++) {
                    bf16 o = 2 * j + 1 < K ? s[(long)(2 * j + 1) * b_rs] : 0;
                    d[(size_t)j * BF16_NR + c] = bf16_pair(s[(long)(2 * j) * b_rs], o);
                }
            }
        }
    });
    const int nk = KP > BF16_KC ? (KP + BF16_KC - 1) / BF16_KC : 1;
    const int kcb = KP > 0 ? (KP + nk - 1) / nk : 0;
    int mt = BF16_MT, nt = BF16_NT;
    gemm_units_cpu(MB, NB, &mt, &nt);
    const int UM = (MB + mt - 1) / mt, UN = (NB + nt - 1) / nt;
    cpu_for((long)UM * UN, [&](long u) {
        const int mb0 = (int)(u % UM) * mt, nb0 = (int)(u / UM) * nt;
        const int mb1 = mb0 + mt < MB ? mb0 + mt : MB, nb1 = nb0 + nt < NB ? nb0 + nt : NB;
        const size_t tile = (size_t)BF16_MR * BF16_NR;
        // the running sums of the unit's tiles, kept between K blocks
        static thread_local std::vector<float> sums;
        if (sums.size() < (size_t)mt * nt * tile) sums.resize((size_t)mt * nt * tile);
        for (int kb = 0; kb < nk; kb++) {
            const int j0 = kb * kcb, kc = KP - j0 < kcb ? KP - j0 : kcb;
            for (int nb = nb0; nb < nb1; nb++)
                for (int mb = mb0; mb < mb1; mb++) {
                    float* acc = sums.data() + ((size_t)(nb - nb0) * mt + (mb - mb0)) * tile;
                    if (kb == 0) memset(acc, 0, tile * sizeof(float));
                    const uint32_t* a = Ap + (size_t)mb * BF16_MR * KP + (size_t)j0 * BF16_MR;
                    const uint32_t* b = Bp + (size_t)nb * BF16_NR * KP + (size_t)j0 * BF16_NR;
                    gemm_bf16_tile_dp(acc, a, b, kc);
                    if (kb < nk - 1) continue;
                    // the last K block: bias, then accumulate, into C
                    const int m0 = mb * BF16_MR, n0 = nb * BF16_NR;
                    if (n0 + BF16_NR <= N) {  // a full-width tile: loops of a constant length, in vectors
                        for (int r = 0; r < BF16_MR && m0 + r < M; r++) {
                            float* c = Cm + (size_t)(m0 + r) * ldc + n0;
                            const float* s = acc + r * BF16_NR;
                            const float* bs = bias ? bias + n0 : nullptr;
                            if (bs && accumulate) for (int j = 0; j < BF16_NR; j++) c[j] = c[j] + (s[j] + bs[j]);
                            else if (bs) for (int j = 0; j < BF16_NR; j++) c[j] = s[j] + bs[j];
                            else if (accumulate) for (int j = 0; j < BF16_NR; j++) c[j] = c[j] + s[j];
                            else for (int j = 0; j < BF16_NR; j++) c[j] = s[j];
                        }
                        continue;
                    }
                    for (int r = 0; r < BF16_MR && m0 + r < M; r++) {
                        float* c = Cm + (size_t)(m0 + r) * ldc + n0;
                        const float* s = acc + r * BF16_NR;
                        for (int j = 0; j < BF16_NR && n0 + j < N; j++) {
                            float v = s[j];
                            if (bias) v += bias[n0 + j];
                            c[j] = accumulate ? c[j] + v : v;
                        }
                    }
                }
        }
    });
}
#endif

static void gemm_bf16_cpu(int M, int N, int K, const bf16* A, long a_rs, long a_cs, const bf16* B, long b_rs,
                          long b_cs, float* Cm, long ldc, bool accumulate, const float* bias) {
    if (M <= 0 || N <= 0) return;
#if defined(__AVX512F__)
    if (bf16_dp_used()) {
        gemm_bf16_dp_cpu(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, Cm, ldc, accumulate, bias);
        return;
    }
#endif
    gemm_bf16_fma_cpu(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, Cm, ldc, accumulate, bias);
}
