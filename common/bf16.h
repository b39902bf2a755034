// bf16.h: bfloat16 on the CPU: conversions, stochastic rounding, and a GEMM with fp32 accumulation.
//
// bf16 is the top half of an fp32: the same sign and 8-bit exponent, 7 bits of mantissa. A product of two
// bf16 numbers is exact in fp32 (8 x 8 significant bits fit in 24), so a bf16 dot product accumulated
// in fp32 rounds once per term, exactly as an fp32 fma chain does.
//
// The GEMM runs on AVX512-BF16's vdpbf16ps where the CPU has it and that is faster (checked at run time),
// and otherwise computes the same numbers with fp32 fmas: vdpbf16ps adds, per fp32 lane i, the product of
// the bf16 pair in the lane's high half and then that of the pair in its low half, each rounded to nearest
// even, denormals flushed (as tp's threads run anyway: common/cpu_pool.h sets FTZ|DAZ in every thread).
// Packing element 2j of K into the high half and 2j+1 into the low one makes that an fma chain over k in
// increasing order, which is exactly what the fp32 GEMM (gemm_cpu, one fma chain over k in increasing
// order) computes on the operands widened to fp32. So the two paths are bit-identical (the bf16 test checks
// it on the CPU that runs it), and on operands that already hold bf16 values in fp32 words (a --dtype bf16
// run's activations) the fp32 path is gemm_cpu on them as they lie. bf16_path below chooses between them.
// A third path, AMX's tile unit (further down), is several times faster where the CPU has it, but rounds its
// sums its own way, so it gives other bits and is taken only when asked for (--bf16-gemm amx).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <ctime>
#include <vector>
#include <immintrin.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include "../kernels_cpu.h"

// bf16 (kernels_cpu.h, whose ops take it): the 16 bits of a bfloat16, uint16_t

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
// Along a row of the shard the full index runs on by one (full columns col0 + c), so it is mapped once per
// run of a row (full_index's three divisions), not once per element.
static void bf16_from_master_cpu(bf16* out, const float* master, long i0, long n, FullIndex map, uint32_t step, uint32_t seed) {
    cpu_for_range(n, [&](long lo, long hi) {
        for (long j = lo; j < hi;) {
            const long run = std::min(hi - j, map.lcols - (i0 + j) % map.lcols), f = full_index(map, i0 + j);
            for (long q = 0; q < run; q++) out[j + q] = bf16_round_stochastic(master[j + q], (uint64_t)(f + q), step, seed);
            j += run;
        }
    });
}

// x (n) = x rounded to the nearest bf16 (ties to even), in place: an activation a --dtype bf16 run keeps in
// bf16, held in fp32 (widened exactly), so the next op reads the bf16 value, as from bf16 storage
static void round_bf16_cpu(float* x, long n) {
    cpu_for_range(n, [&](long lo, long hi) {
        for (long j = lo; j < hi; j++) x[j] = bf16_value(x[j]);
    });
}

// out (n) = x (n) as bf16 storage, each the nearest bf16 (ties to even): what a --dtype bf16 run's
// sequence-parallel all-gathers send. Their x holds bf16 values already (keep_bf16), so this keeps the
// high half of each word and is exact; the gathered values are widened back with bf16_widen_cpu.
static void bf16_pack_cpu(bf16* out, const float* x, long n) {
    cpu_for_range(n, [&](long lo, long hi) {
        for (long j = lo; j < hi; j++) out[j] = bf16_round(x[j]);
    });
}

// out (n) = x (n) widened to fp32 (exactly)
static void bf16_widen_cpu(float* out, const bf16* x, long n) {
    cpu_for_range(n, [&](long lo, long hi) {
        for (long j = lo; j < hi; j++) out[j] = bf16_to_float(x[j]);
    });
}

// (declared in kernels_cpu.h, for the ops that read or write bf16 storage: the logits, the kept layernorm
// and GELU values)
static inline float as_fp32(bf16 h) { return bf16_to_float(h); }
static inline void store_as(bf16* p, float v) { *p = bf16_round(v); }

// (declared in kernels_cpu.h) v rounded to the nearest bf16 (ties to even, a NaN kept quiet) in an fp32
// word: bf16_to_float(bf16_round(v)) in 32-bit lanes alone, which GCC vectorises without converting to 16
// bits and back (with it gelu_backward_bf16 measured 3-10% faster than the fp32 backward and round_bf16 after
// it, and through a bf16 3-6% slower; round_bf16 runs at the same speed either way)
static inline float bf16_value(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof(u));
    u = ((u & 0x7fffffffu) > 0x7f800000u ? u | 0x00400000u : u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&v, &u, sizeof(v));
    return v;
}

// (declared in kernels_cpu.h, for encoder_forward_cpu on a --dtype bf16 run's wte)
static inline void row_as_fp32(float* out, const bf16* row, int C) {
    for (int c = 0; c < C; c++) out[c] = bf16_to_float(row[c]);
}

// ----------------------------------------------------------------------------
// GEMM: C (M x N) = [C +] A (M x K) . B (K x N) [+ bias (N)], A and B through two strides each (as
// gemm_cpu in kernels_cpu.h: a(m,k) = A[m*a_rs + k*a_cs], b(k,n) = B[k*b_rs + n*b_cs]), C and bias fp32.
// A and B are bf16, or fp32 words that hold bf16 values (their low 16 bits zero: what a --dtype bf16 run
// multiplies: its activations rounded by round_bf16; its weights, rounded by bf16_from_master, are bf16).
//
// K is taken in pairs, as vdpbf16ps takes it: both operands are packed so that a 32-bit word holds
// elements 2j (high half) and 2j+1 (low half) of a row of A or a column of B (a zero pads an odd K).
// Each C element is then one chain over k in increasing order, starting from 0, then + bias, then added
// to the old C: gemm_cpu's order, so for any blocking, tile, thread count or path the same bits.
//
// vdpbf16ps's tile is 8 rows by 32 columns (16 accumulators, 2 B vectors, a broadcast), run over the
// whole of K with its sums in registers, as gemm_cpu's: a unit of MT x NT tiles keeps its A panels and
// the B panel the row tiles share in L2.

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
// tdpbf16ps can be used: the CPU has AMX-BF16 and Linux lets this process keep tile data (a process must
// ask: arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA, feature 18; a kernel older than 5.16 refuses)
static inline bool bf16_amx_supported() {
#if defined(__AVX512F__) && defined(__linux__) && defined(__x86_64__)
    static const bool ok = __builtin_cpu_supports("amx-bf16") && syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    return ok;
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

// Which path the GEMM takes. The first two give the same bits, so this is a matter of speed only: vdpbf16ps does
// twice an fma's flops per lane, but not every core issues it as often (on this project's Intel hosts it
// peaks at 86 GFLOP/s against 170 for fp32 fmas, so the fp32 path is faster there). BF16_AUTO measures
// both peaks once (a few ms) and takes vdpbf16ps where its peak is the higher. ./tp --bf16-gemm and the
// tests force either, or BF16_AMX: the tile unit's path (gemm_bf16_amx_cpu, other bits), never auto's.
enum Bf16Path { BF16_AUTO, BF16_DP, BF16_FMA, BF16_AMX };
static Bf16Path bf16_path = BF16_AUTO;
static inline bool bf16_dp_used() {
    if (!bf16_dp_supported() || bf16_path == BF16_FMA) return false;
    if (bf16_path == BF16_DP) return true;
    static const bool faster = bf16_peak_dp(300000) > bf16_peak_fma(300000);
    return faster;
}

// the 16 bits of a bf16 operand: the bf16 itself, or the high half of an fp32 word that holds a bf16 value
static inline uint32_t bf16_bits(bf16 h) { return h; }
static inline uint32_t bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u >> 16;
}
// the word vdpbf16ps takes for elements 2j (first) and 2j+1 (second) of K
static inline uint32_t bf16_pair(uint32_t first, uint32_t second) { return first << 16 | second; }

// A GEMM's C is fp32, or bf16 storage where the result is kept in bf16 (the LM head's logits of a --dtype
// bf16 run, and with accumulate the weight gradients): each element rounded to nearest once, from its fp32
// sum (with accumulate, plus C widened), as the fp32 result and bf16_round would give
static inline void store_c(float* c, float v, bool accumulate) { *c = accumulate ? *c + v : v; }
static inline void store_c(bf16* c, float v, bool accumulate) { *c = bf16_round(accumulate ? bf16_to_float(*c) + v : v); }

#if defined(__AVX512F__)
#define BF16_MR 8
#define BF16_VL 16
#define BF16_NR (2 * BF16_VL)
#define BF16_MT 16
#define BF16_NT 8


// 16 fp32 rounded to the nearest bf16 (ties to even, a NaN kept quiet), as bf16_round does each
// (the masked forms with every lane set, as in transpose16_epi32 below, for GCC 12)
static inline __m256i bf16_round16(__m512 x) {
    const __mmask16 all = 0xffff;
    const __m512i u = _mm512_castps_si512(x), high = _mm512_maskz_srli_epi32(all, u, 16);
    const __m512i one = _mm512_set1_epi32(1), abs_mask = _mm512_set1_epi32(0x7fffffff);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(high, one)));
    r = _mm512_maskz_srli_epi32(all, r, 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, high, _mm512_set1_epi32(0x40));
    return _mm512_maskz_cvtepi32_epi16(all, r);
}

// C (mr x nc of an MR x NR tile, row stride ldc) = [C +] (a (kp pairs x MR words) . b (kp pairs x NR words)
// [+ bias (nc)]) with vdpbf16ps: one instruction does both fmas of 16 lanes, and the MR x NR sums stay in
// registers over the whole of K (the panels stream from L2), so C is written once, straight from them: the
// bias, then C, added in gemm_cpu's order (only called where the CPU has the instruction)
template <typename TC>
__attribute__((target("avx512bf16"), noinline)) static void gemm_bf16_tile_dp(TC* Cm, long ldc, int mr, int nc,
                                                                              const uint32_t* a, const uint32_t* b, int kp,
                                                                              const float* bias, bool accumulate) {
    __m512 c[BF16_MR][2];
    for (int r = 0; r < BF16_MR; r++) c[r][0] = c[r][1] = _mm512_setzero_ps();
    for (int j = 0; j < kp; j++) {
        __m512bh w0 = (__m512bh)_mm512_loadu_si512((const void*)(b + (size_t)j * BF16_NR));
        __m512bh w1 = (__m512bh)_mm512_loadu_si512((const void*)(b + (size_t)j * BF16_NR + BF16_VL));
        for (int r = 0; r < BF16_MR; r++) {
            __m512bh x = (__m512bh)_mm512_set1_epi32((int)a[(size_t)j * BF16_MR + r]);
            c[r][0] = _mm512_dpbf16_ps(c[r][0], x, w0);
            c[r][1] = _mm512_dpbf16_ps(c[r][1], x, w1);
        }
    }
    if (mr == BF16_MR && nc == BF16_NR) {  // a whole tile, in vectors
        if (bias) {
            const __m512 b0 = _mm512_loadu_ps(bias), b1 = _mm512_loadu_ps(bias + BF16_VL);
            for (int r = 0; r < BF16_MR; r++) { c[r][0] = _mm512_add_ps(c[r][0], b0); c[r][1] = _mm512_add_ps(c[r][1], b1); }
        }
        for (int r = 0; r < BF16_MR; r++) {
            TC* row = Cm + (size_t)r * ldc;
            if (std::is_same<TC, bf16>::value) {
                if (accumulate) {  // C widened (its bits the high half of a word) plus the sums, then rounded
                    const __mmask16 all = 0xffff;
                    for (int h = 0; h < 2; h++) {
                        __m512i w = _mm512_maskz_cvtepu16_epi32(all, _mm256_loadu_si256((const __m256i*)(const void*)(row + h * BF16_VL)));
                        c[r][h] = _mm512_add_ps(_mm512_castsi512_ps(_mm512_maskz_slli_epi32(all, w, 16)), c[r][h]);
                    }
                }
                _mm256_storeu_si256((__m256i*)(void*)row, bf16_round16(c[r][0]));
                _mm256_storeu_si256((__m256i*)(void*)(row + BF16_VL), bf16_round16(c[r][1]));
                continue;
            }
            if (accumulate) {
                c[r][0] = _mm512_add_ps(_mm512_loadu_ps((const float*)(const void*)row), c[r][0]);
                c[r][1] = _mm512_add_ps(_mm512_loadu_ps((const float*)(const void*)(row + BF16_VL)), c[r][1]);
            }
            _mm512_storeu_ps((float*)(void*)row, c[r][0]);
            _mm512_storeu_ps((float*)(void*)(row + BF16_VL), c[r][1]);
        }
        return;
    }
    float s[BF16_MR][BF16_NR];  // an edge tile: its rows < mr and columns < nc, one by one
    for (int r = 0; r < BF16_MR; r++) { _mm512_storeu_ps(s[r], c[r][0]); _mm512_storeu_ps(s[r] + BF16_VL, c[r][1]); }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nc; j++) {
            float v = s[r][j];
            if (bias) v += bias[j];
            store_c(Cm + (size_t)r * ldc + j, v, accumulate);
        }
}

#if defined(__AVX512BW__)
// 16 x 16 words transposed in registers: r[i] holds row i, and afterwards column i (pairs of rows
// interleaved, then pairs of pairs, then the 128-bit quarters twice). The masked forms with every lane
// set compute the same as the plain ones, whose undefined pass-through GCC 12 warns about.
static inline void transpose16_epi32(__m512i r[16]) {
    const __mmask16 all16 = 0xffff;
    const __mmask8 all8 = 0xff;
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_mask_unpacklo_epi32(r[i], all16, r[i], r[i + 1]);
        t[i + 1] = _mm512_mask_unpackhi_epi32(r[i], all16, r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        u[i] = _mm512_mask_unpacklo_epi64(t[i], all8, t[i], t[i + 2]);
        u[i + 1] = _mm512_mask_unpackhi_epi64(t[i], all8, t[i], t[i + 2]);
        u[i + 2] = _mm512_mask_unpacklo_epi64(t[i + 1], all8, t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_mask_unpackhi_epi64(t[i + 1], all8, t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_mask_shuffle_i32x4(u[i], all16, u[i], u[i + 4], 0x88);
        t[i + 4] = _mm512_mask_shuffle_i32x4(u[i], all16, u[i], u[i + 4], 0xdd);
        t[i + 8] = _mm512_mask_shuffle_i32x4(u[i + 8], all16, u[i + 8], u[i + 12], 0x88);
        t[i + 12] = _mm512_mask_shuffle_i32x4(u[i + 8], all16, u[i + 8], u[i + 12], 0xdd);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_mask_shuffle_i32x4(t[i], all16, t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_mask_shuffle_i32x4(t[i], all16, t[i], t[i + 8], 0xdd);
    }
}

// 32 consecutive fp32 words holding bf16 values (lo: the first 16, hi: the next) -> the 16 pair words of
// vdpbf16ps (bf16_pair: element 2j's bits high, 2j+1's low), by one permute of their 16-bit halves
static inline __m512i bf16_pairs_from_words(__m512i lo, __m512i hi) {
    // output half 2j (low) is element 2j+1's high half, source half 4j+3; half 2j+1 is element 2j's, 4j+1
    static const uint16_t idx[32] = {3,  1,  7,  5,  11, 9,  15, 13, 19, 17, 23, 21, 27, 25, 31, 29,
                                     35, 33, 39, 37, 43, 41, 47, 45, 51, 49, 55, 53, 59, 57, 63, 61};
    return _mm512_permutex2var_epi16(lo, _mm512_loadu_si512((const void*)idx), hi);
}

// the 16 pair words of 32 consecutive elements of K (a row of A or a column of B along k): fp32 words
// holding bf16 values by one permute of their high halves; bf16 storage, where elements 2j and 2j+1 are
// the low and high halves of word j (little-endian), by swapping each word's halves
static inline __m512i bf16_pairs_of_run(const float* p) {
    return bf16_pairs_from_words(_mm512_loadu_si512((const void*)p), _mm512_loadu_si512((const void*)(p + 16)));
}
static inline __m512i bf16_pairs_of_run(const bf16* p) {
    return _mm512_maskz_rol_epi32((__mmask16)0xffff, _mm512_loadu_si512((const void*)p), 16);
}

// pair j of 16 neighbouring rows (the lanes set in `rows`; 0 in the others) from the lines e (k = 2j) and
// o (k = 2j + 1): element 2j's bits high in each word, 2j+1's low
static inline __m512i bf16_pairs_of_lines(const float* e, const float* o, __mmask16 rows) {
    const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
    return _mm512_or_si512(_mm512_and_si512(_mm512_maskz_loadu_epi32(rows, (const void*)e), high),
                           _mm512_maskz_srli_epi32((__mmask16)0xffff, _mm512_maskz_loadu_epi32(rows, (const void*)o), 16));
}
static inline __m512i bf16_pairs_of_lines(const bf16* e, const bf16* o, __mmask16 rows) {
    const __m512i we = _mm512_maskz_cvtepu16_epi32((__mmask16)0xffff, _mm256_maskz_loadu_epi16(rows, (const void*)e));
    const __m512i wo = _mm512_maskz_cvtepu16_epi32((__mmask16)0xffff, _mm256_maskz_loadu_epi16(rows, (const void*)o));
    return _mm512_or_si512(_mm512_maskz_slli_epi32((__mmask16)0xffff, we, 16), wo);
}
#endif

// the pair j of a row of A or a column of B that starts at s, elements a stride apart (0 past K)
template <typename T>
static inline uint32_t bf16_pair_at(const T* s, long stride, int j, int K) {
    return bf16_pair(bf16_bits(s[(long)(2 * j) * stride]), 2 * j + 1 < K ? bf16_bits(s[(long)(2 * j + 1) * stride]) : 0u);
}

// Bp[nb][j][c] = pair j of column n = nb*NR + c of B, for the pairs j < KP of K and zero for KP <= j < KS
// (the panels' rows: KP for vdpbf16ps, whole blocks of 16 pairs for AMX); columns past N zero. Contiguous
// rows of B (b_cs 1, a weight's gradient's operand) interleave two rows into a panel row of pairs, in vectors.
template <typename TB>
static void gemm_bf16_pack_b(uint32_t* Bp, const TB* B, long b_rs, long b_cs, int K, int N, int KS) {
    const int NB = (N + BF16_NR - 1) / BF16_NR, KP = (K + 1) / 2;
    auto pair_at = [K](const TB* s, long stride, int j) { return bf16_pair_at(s, stride, j, K); };
    cpu_for(NB, [&](long nb) {
        uint32_t* d = Bp + (size_t)nb * BF16_NR * KS;
        for (int j = KP; j < KS; j++)
            for (int c = 0; c < BF16_NR; c++) d[(size_t)j * BF16_NR + c] = 0;
        const int n0 = (int)nb * BF16_NR, nc = N - n0 < BF16_NR ? N - n0 : BF16_NR;
#if defined(__AVX512BW__)
        // columns contiguous along k (the weight of a forward, out = inp . W^T): 16 columns by 16 pairs at a
        // time, each column's 32 k made into 16 pair words, then transposed into panel rows. From fp32 words
        // that is one permute of their high halves; bf16 storage has elements 2j and 2j+1 in the low and
        // high halves of word j (little-endian), so a pair word is that word with its halves swapped.
        if (b_rs == 1 && nc == BF16_NR) {
            const int JV = K / 32 * 16;  // the pairs of whole blocks of 32 k
            for (int c0 = 0; c0 < BF16_NR; c0 += 16)
                for (int j0 = 0; j0 < JV; j0 += 16) {
                    __m512i r[16];
                    for (int c = 0; c < 16; c++) {
                        r[c] = bf16_pairs_of_run(B + (long)(n0 + c0 + c) * b_cs + 2 * j0);
                    }
                    transpose16_epi32(r);
                    for (int j = 0; j < 16; j++) _mm512_storeu_si512((void*)(d + (size_t)(j0 + j) * BF16_NR + c0), r[j]);
                }
            for (int c = 0; c < BF16_NR; c++)  // the pairs past the last whole block
                for (int j = JV; j < KP; j++) d[(size_t)j * BF16_NR + c] = pair_at(B + (n0 + c) * b_cs, b_rs, j);
            return;
        }
#endif
        if (b_cs == 1 && nc == BF16_NR) {
            for (int j = 0; j < KP; j++) {
                const TB* e = B + (long)(2 * j) * b_rs + n0;
                const TB* o = B + (long)(2 * j + 1) * b_rs + n0;
                uint32_t* w = d + (size_t)j * BF16_NR;
                if (2 * j + 1 < K)
                    for (int c = 0; c < BF16_NR; c++) w[c] = bf16_pair(bf16_bits(e[c]), bf16_bits(o[c]));
                else
                    for (int c = 0; c < BF16_NR; c++) w[c] = bf16_pair(bf16_bits(e[c]), 0u);
            }
            return;
        }
        for (int c = 0; c < BF16_NR; c++) {
            if (c >= nc)
                for (int j = 0; j < KP; j++) d[(size_t)j * BF16_NR + c] = 0;
            else
                for (int j = 0; j < KP; j++) d[(size_t)j * BF16_NR + c] = pair_at(B + (n0 + c) * b_cs, b_rs, j);
        }
    });
}

// the vdpbf16ps path, for operands in bf16 storage (TA, TB = bf16) or fp32 words holding bf16 values (= float);
// C fp32 or bf16 storage (TC, store_c)
template <typename TA, typename TB, typename TC>
static void gemm_bf16_dp_cpu(int M, int N, int K, const TA* A, long a_rs, long a_cs, const TB* B, long b_rs,
                             long b_cs, TC* Cm, long ldc, bool accumulate, const float* bias) {
    const int MB = (M + BF16_MR - 1) / BF16_MR, NB = (N + BF16_NR - 1) / BF16_NR, KP = (K + 1) / 2;
    // the packed operands belong to the calling (rank) thread and only grow
    static thread_local std::vector<uint32_t> packA, packB;
    uint32_t* Ap = pack_buffer(packA, (size_t)MB * BF16_MR * KP);
    uint32_t* Bp = pack_buffer(packB, (size_t)NB * BF16_NR * KP);
    auto pair_at = [K](const auto* s, long stride, int j) { return bf16_pair_at(s, stride, j, K); };
    // Ap[mb][j][r] = pair j of row m = mb*MR + r of A; rows past M zero. Row tiles in twos, so that the
    // vector paths read whole 64-byte lines (16 rows of a transpose, or 16 rows into one transpose); a last
    // whole tile alone takes them with half the lanes masked. Up to 4 twos a task (see the weight
    // gradient's pack below), fewer where that would leave the rank's threads under 2 tasks each.
    const long twos = (MB + 1) / 2, per = std::max(1L, std::min(4L, twos / (2L * cpu_pool_threads())));
    auto whole_tiles = [&](long tp) { return (2 * tp + 2) * BF16_MR <= M ? 2 : (2 * tp + 1) * BF16_MR <= M ? 1 : 0; };
    cpu_for((twos + per - 1) / per, [&](long g) {
        const long tp0 = g * per, tp1 = std::min(twos, tp0 + per);
#if defined(__AVX512BW__)
        // rows next to each other (a weight gradient's A, dout transposed): the rows at k = 2j and 2j+1 are
        // two lines, and pair j of each row is their high halves, split between the two tiles' panels
        // (in bf16 storage, the LM head's dlogits: 16 halves of each line widened to words, the even line's
        // shifted up). The task's twos in turn at each 16 j: they read neighbouring lines of the same rows of
        // dout close together (a two at a time down the whole of K came back to each row for the next line
        // only K loads later), as gemm_cpu's pack of a transposed A does: d6's weight gradients on vdpbf16ps
        // level to 9% faster (one core, 3 runs; on the host measured, vdpbf16ps is half the fma rate and its
        // sums hide most of the pack)
        static_assert(BF16_MR == 8, "two tiles are one 16-word vector");
        if (a_rs == 1)
            for (int j0 = 0; j0 < K / 2; j0 += 16)
                for (long tp = tp0; tp < tp1; tp++) {
                    const int tiles = whole_tiles(tp);
                    if (tiles == 0) continue;
                    const __mmask16 rows = tiles == 2 ? 0xffff : 0x00ff;
                    const TA* a0 = A + 2 * tp * BF16_MR;
                    uint32_t* d0 = Ap + (size_t)2 * tp * BF16_MR * KP;
                    uint32_t* d1 = d0 + (size_t)BF16_MR * KP;
                    for (int j = j0; j < K / 2 && j < j0 + 16; j++) {
                        const __m512i w = bf16_pairs_of_lines(a0 + (long)(2 * j) * a_cs, a0 + (long)(2 * j + 1) * a_cs, rows);
                        _mm256_storeu_si256((__m256i*)(d0 + (size_t)j * BF16_MR), _mm512_maskz_extracti64x4_epi64((__mmask8)0xf, w, 0));
                        if (tiles == 2) _mm256_storeu_si256((__m256i*)(d1 + (size_t)j * BF16_MR), _mm512_maskz_extracti64x4_epi64((__mmask8)0xf, w, 1));
                    }
                }
#endif
        for (long tp = tp0; tp < tp1; tp++) {
            const long mb2 = 2 * tp;
            int packed = 0;  // the tiles a vector path packed
#if defined(__AVX512BW__)
            const int tiles = whole_tiles(tp);
            uint32_t* d0 = Ap + (size_t)mb2 * BF16_MR * KP;
            uint32_t* d1 = d0 + (size_t)BF16_MR * KP;
            // pairs j0.. of the whole tiles' rows i < 16 one by one, where a vector path stops short of KP
            auto pairs_from = [&](int j0) {
                for (int j = j0; j < KP; j++)
                    for (int i = 0; i < tiles * BF16_MR; i++)
                        (i < BF16_MR ? d0 + i : d1 + (i - BF16_MR))[(size_t)j * BF16_MR] = pair_at(A + (mb2 * BF16_MR + i) * a_rs, a_cs, j);
            };
            if (tiles > 0 && a_rs == 1) {  // (the pairs of whole lines above)
                pairs_from(K / 2);  // an odd K's last pair
                packed = tiles;
            }
            // rows contiguous along k (activations, a forward's or an input gradient's A): each row's 32 k made
            // into 16 pair words by one permute, the 16 rows (zero past the whole tiles) transposed, each
            // column's halves stored to the two tiles' panels
            // (bf16 storage, the LM head's dlogits: each row's 32 k are one line, its words with their halves
            // swapped, as the B pack's below)
            else if (tiles > 0 && a_cs == 1) {
                const int JV = K / 32 * 16;  // the pairs of whole blocks of 32 k
                for (int j0 = 0; j0 < JV; j0 += 16) {
                    __m512i r[16];
                    for (int i = 0; i < 16; i++) {
                        r[i] = i < tiles * BF16_MR ? bf16_pairs_of_run(A + (mb2 * BF16_MR + i) * a_rs + 2 * j0) : _mm512_setzero_si512();
                    }
                    transpose16_epi32(r);
                    for (int j = 0; j < 16; j++) {
                        _mm256_storeu_si256((__m256i*)(d0 + (size_t)(j0 + j) * BF16_MR), _mm512_maskz_extracti64x4_epi64((__mmask8)0xf, r[j], 0));
                        if (tiles == 2) _mm256_storeu_si256((__m256i*)(d1 + (size_t)(j0 + j) * BF16_MR), _mm512_maskz_extracti64x4_epi64((__mmask8)0xf, r[j], 1));
                    }
                }
                pairs_from(JV);  // the pairs past the last whole block
                packed = tiles;
            }
#endif
            // pair by pair the rest: other strides, the tile past M
            for (long mb = mb2 + packed; mb < mb2 + 2 && mb < MB; mb++) {
                uint32_t* d = Ap + (size_t)mb * BF16_MR * KP;
                for (int r = 0; r < BF16_MR; r++) {
                    const long m = mb * BF16_MR + r;
                    if (m >= M)
                        for (int j = 0; j < KP; j++) d[(size_t)j * BF16_MR + r] = 0;
                    else
                        for (int j = 0; j < KP; j++) d[(size_t)j * BF16_MR + r] = pair_at(A + m * a_rs, a_cs, j);
                }
            }
        }
    });
    gemm_bf16_pack_b(Bp, B, b_rs, b_cs, K, N, KP);
    int mt = BF16_MT, nt = BF16_NT;
    gemm_units_cpu(MB, NB, &mt, &nt);
    const int UM = (MB + mt - 1) / mt, UN = (NB + nt - 1) / nt;
    cpu_for((long)UM * UN, [&](long u) {
        const int mb0 = (int)(u % UM) * mt, nb0 = (int)(u / UM) * nt;
        const int mb1 = mb0 + mt < MB ? mb0 + mt : MB, nb1 = nb0 + nt < NB ? nb0 + nt : NB;
        for (int nb = nb0; nb < nb1; nb++)  // a B panel (L2) against the unit's row tiles (A panels, L2)
            for (int mb = mb0; mb < mb1; mb++) {
                const int m0 = mb * BF16_MR, n0 = nb * BF16_NR;
                gemm_bf16_tile_dp(Cm + (size_t)m0 * ldc + n0, ldc, M - m0 < BF16_MR ? M - m0 : BF16_MR, N - n0 < BF16_NR ? N - n0 : BF16_NR,
                                  Ap + (size_t)mb * BF16_MR * KP, Bp + (size_t)nb * BF16_NR * KP, KP, bias ? bias + n0 : nullptr, accumulate);
            }
    });
}

// ----------------------------------------------------------------------------
// AMX, Intel's tile unit (Sapphire Rapids and newer): --bf16-gemm amx. One tdpbf16ps multiplies a tile of
// A (16 rows by 32 k, as 16 pair words a row) by one of B (16 pair rows by 16 columns) into 16 x 16 fp32
// sums: 16384 flops an instruction, several times what the fp32 GEMM does on a core.
//
// It does not round as the two paths above do, so it is never auto's choice and gives other bits.
// Measured on an Intel host with AMX (README, AMX): a product added alone rounds as an fma does; two
// products are summed and rounded first, then added (not two fmas in turn); with more products in one
// instruction no order of fp32 roundings we tried reproduces it, and at 32 products 45% of the sums differ
// from the fma chain's in the last bit or more. The fp32 path cannot compute its bits, so a CPU without AMX cannot
// continue an AMX run bit for bit. What does hold (the bf16 tests check it): the same bits for any number
// of threads and on every rerun (each sum is the same instructions in the same order), and a run's losses
// within the bounds the other paths meet against fp32 and against TP=1.
//
// The blocks: a C block of 32 x 32 is 4 sum tiles (tmm0-3), over K in steps of 32: two A tiles (tmm4-5, the
// block's two 16-row halves) and two B tiles (tmm6-7, the panel's two 16-column halves), 4 tdpbf16ps.
// B is gemm_bf16_pack_b's panels (pair words with 2j high, 32 columns a row: a B tile is 16 rows of them
// at a 128-byte stride); A is packed here, each tile 1 KB in a row, with its pair words the same way round.

#if defined(__AVX512F__) && defined(__linux__) && defined(__x86_64__)
#define BF16_AMX_MB 32  // rows of a C block
// the tile configuration: palette 1, the 8 tiles all 16 rows of 64 bytes
struct Bf16AmxConfig {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

// C (mr x nc of a 32 x 32 block, row stride ldc) = [C +] (a (JB blocks of two A tiles) . b (a panel, JB x 16
// pair rows of NR words) [+ bias (nc)]): the 4 sum tiles stored to s, then the bias and C added in
// gemm_cpu's order, C written through masks where the block is cut by M or N
template <typename TC>
__attribute__((target("amx-tile,amx-bf16"), noinline)) static void gemm_bf16_block_amx(TC* Cm, long ldc, int mr, int nc,
                                                                                      const uint32_t* a, const uint32_t* b,
                                                                                      int JB, const float* bias, bool accumulate) {
    static_assert(BF16_NR == 32, "a panel is two B tiles wide");
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int r = 0; r < mr; r++) {  // C's lines, fetched while the sums run (a C of megabytes is not in L2)
        _mm_prefetch((const char*)(Cm + (size_t)r * ldc), _MM_HINT_T0);
        if (sizeof(TC) * BF16_NR > 64) _mm_prefetch((const char*)(Cm + (size_t)r * ldc) + 64, _MM_HINT_T0);
    }
    for (int jb = 0; jb < JB; jb++) {
        const uint32_t* at = a + (size_t)jb * 512;
        const uint32_t* bt = b + (size_t)jb * 16 * BF16_NR;
        _tile_loadd(4, at, 64);
        _tile_loadd(5, at + 256, 64);
        _tile_loadd(6, bt, BF16_NR * 4);
        _tile_loadd(7, bt + 16, BF16_NR * 4);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    alignas(64) float s[BF16_AMX_MB][BF16_NR];
    _tile_stored(0, &s[0][0], BF16_NR * 4);
    _tile_stored(1, &s[0][16], BF16_NR * 4);
    _tile_stored(2, &s[16][0], BF16_NR * 4);
    _tile_stored(3, &s[16][16], BF16_NR * 4);
    for (int h = 0; h < 2; h++) {
        const int lanes = std::min(16, std::max(0, nc - 16 * h));
        if (lanes == 0) break;
        const __mmask16 cols = (__mmask16)((1u << lanes) - 1);
        const __m512 bv = bias ? _mm512_maskz_loadu_ps(cols, bias + 16 * h) : _mm512_setzero_ps();
        for (int r = 0; r < mr; r++) {
            __m512 v = _mm512_load_ps(&s[r][16 * h]);
            if (bias) v = _mm512_add_ps(v, bv);
            TC* row = Cm + (size_t)r * ldc + 16 * h;
            if (std::is_same<TC, bf16>::value) {
                if (accumulate) {  // C widened (its bits the high half of a word) plus the sums, then rounded
                    __m512i w = _mm512_maskz_cvtepu16_epi32((__mmask16)0xffff, _mm256_maskz_loadu_epi16(cols, (const void*)row));
                    v = _mm512_add_ps(_mm512_castsi512_ps(_mm512_maskz_slli_epi32((__mmask16)0xffff, w, 16)), v);
                }
                _mm256_mask_storeu_epi16((void*)row, cols, bf16_round16(v));
            } else {
                if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(cols, (const void*)row), v);
                _mm512_mask_storeu_ps((void*)row, cols, v);
            }
        }
    }
}

__attribute__((target("amx-tile"))) static void bf16_amx_tiles_on() {
    static const Bf16AmxConfig config = [] {
        Bf16AmxConfig c = {};
        c.palette = 1;
        for (int t = 0; t < 8; t++) {
            c.colsb[t] = 64;
            c.rows[t] = 16;
        }
        return c;
    }();
    _tile_loadconfig(&config);
}
__attribute__((target("amx-tile"))) static void bf16_amx_tiles_off() { _tile_release(); }

// the AMX path (only called where bf16_amx_supported()): operands and C as gemm_bf16_dp_cpu's
template <typename TA, typename TB, typename TC>
static void gemm_bf16_amx_cpu(int M, int N, int K, const TA* A, long a_rs, long a_cs, const TB* B, long b_rs,
                              long b_cs, TC* Cm, long ldc, bool accumulate, const float* bias) {
    const int KP = (K + 1) / 2, JB = (KP + 15) / 16, KS = JB * 16;
    const int MB = (M + BF16_AMX_MB - 1) / BF16_AMX_MB, NB = (N + BF16_NR - 1) / BF16_NR;
    static thread_local std::vector<uint32_t> packA, packB;  // the calling (rank) thread's; they only grow
    uint32_t* Ap = pack_buffer(packA, (size_t)MB * BF16_AMX_MB * KS);
    uint32_t* Bp = pack_buffer(packB, (size_t)NB * BF16_NR * KS);
    // Ap[mb][jb][h][r][w] = pair 16 jb + w of row m = 32 mb + 16 h + r of A, zero past M and past K: half
    // blocks of 16 rows, up to 4 of them a task (see the weight gradient's pack below), fewer where that
    // would leave the rank's threads under 2 tasks each
    const long halves = (long)MB * 2, per = std::max(1L, std::min(4L, halves / (2L * cpu_pool_threads())));
    cpu_for((halves + per - 1) / per, [&](long g) {
        const long h0 = per * g, h1 = std::min(halves, h0 + per);
        auto at = [&](long half, int r, int j) -> uint32_t& {
            return Ap[((size_t)(half / 2) * JB * 2 + (size_t)(j / 16) * 2 + half % 2) * 256 + r * 16 + j % 16];
        };
        long full = h0;  // the half blocks of 16 rows in M: [h0, full)
        while (full < h1 && full * 16 + 16 <= M) full++;
        int jdone = 0;  // the pairs a vector path packed, for all 16 rows of those
#if defined(__AVX512BW__)
        if (a_cs == 1) {
            // rows contiguous along k (a forward's or an input gradient's A): each row's 32 k are one tile row
            // of 16 pair words, one permute of fp32 words' high halves, or bf16 storage's words halves swapped
            for (long half = h0; half < full; half++)
                for (int j = 0; j + 16 <= K / 2; j += 16)
                    for (int r = 0; r < 16; r++)
                        _mm512_storeu_si512((void*)&at(half, r, j), bf16_pairs_of_run(A + (half * 16 + r) * a_rs + 2 * j));
            jdone = K / 2 / 16 * 16;
        } else if (a_rs == 1) {
            // rows next to each other (a weight gradient's A, dout transposed): pair j of a half block's 16 rows
            // from the lines at k = 2j and 2j + 1, a tile column; 16 of them transposed into the tile's rows.
            // The task's half blocks in turn at each 32 k: they read neighbouring lines of the same rows of dout
            // close together (a half block at a time down the whole of K came back to each row for the next
            // line only K loads later), as gemm_cpu's pack of a transposed A does. d6's weight gradients on
            // AMX 5-35% faster, one core (the most where N is smallest: 192, TP 2's attproj)
            for (int j = 0; j + 16 <= K / 2; j += 16)
                for (long half = h0; half < full; half++) {
                    __m512i c[16];
                    for (int w = 0; w < 16; w++) {
                        const TA* e = A + half * 16 + (long)(2 * (j + w)) * a_cs;
                        c[w] = bf16_pairs_of_lines(e, e + a_cs, (__mmask16)0xffff);
                    }
                    transpose16_epi32(c);
                    for (int r = 0; r < 16; r++) _mm512_storeu_si512((void*)&at(half, r, j), c[r]);
                }
            jdone = K / 2 / 16 * 16;
        }
#endif
        for (long half = h0; half < h1; half++) {  // the rest pair by pair: the pairs past the vectors', rows past M
            const long m0 = half * 16;
            for (int r = 0; r < 16; r++)
                for (int j = half < full ? jdone : 0; j < KS; j++)
                    at(half, r, j) = m0 + r < M && j < KP ? bf16_pair_at(A + (m0 + r) * a_rs, a_cs, j, K) : 0u;
        }
    });
    gemm_bf16_pack_b(Bp, B, b_rs, b_cs, K, N, KS);
    int mt = 8, nt = 4;  // units of C blocks: 256 rows x 128 columns
    gemm_units_cpu(MB, NB, &mt, &nt);
    const int UM = (MB + mt - 1) / mt, UN = (NB + nt - 1) / nt;
    cpu_for((long)UM * UN, [&](long u) {
        const int mb0 = (int)(u % UM) * mt, nb0 = (int)(u / UM) * nt;
        const int mb1 = mb0 + mt < MB ? mb0 + mt : MB, nb1 = nb0 + nt < NB ? nb0 + nt : NB;
        bf16_amx_tiles_on();  // (the tile configuration is the thread's own)
        for (int nb = nb0; nb < nb1; nb++)  // a B panel against the unit's row blocks
            for (int mb = mb0; mb < mb1; mb++) {
                const int m0 = mb * BF16_AMX_MB, n0 = nb * BF16_NR;
                gemm_bf16_block_amx(Cm + (size_t)m0 * ldc + n0, ldc, std::min(M - m0, BF16_AMX_MB), std::min(N - n0, BF16_NR),
                                    Ap + (size_t)mb * BF16_AMX_MB * KS, Bp + (size_t)nb * BF16_NR * KS, JB, bias ? bias + n0 : nullptr,
                                    accumulate);
            }
        bf16_amx_tiles_off();
    });
}
#endif
#endif

// The fp32 path: gemm_cpu on both operands as fp32 (bf16 storage widened as gemm_cpu packs it), the same
// bits as vdpbf16ps's; a bf16 C is computed in fp32 and rounded, as store_c rounds
template <typename TA, typename TB>
static void gemm_bf16_fma_cpu(int M, int N, int K, const TA* A, long a_rs, long a_cs, const TB* B, long b_rs,
                              long b_cs, float* Cm, long ldc, bool accumulate, const float* bias) {
    gemm_cpu(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, Cm, ldc, accumulate, bias);
}
template <typename TA, typename TB>
static void gemm_bf16_fma_cpu(int M, int N, int K, const TA* A, long a_rs, long a_cs, const TB* B, long b_rs,
                              long b_cs, bf16* Cm, long ldc, bool accumulate, const float* bias) {
    static thread_local std::vector<float> wideC;
    if (wideC.size() < (size_t)M * N) wideC.resize((size_t)M * N);
    float* c = wideC.data();
    gemm_bf16_fma_cpu(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, c, N, false, bias);
    cpu_for(M, [&](long m) {
        for (int n = 0; n < N; n++) store_c(Cm + m * ldc + n, c[m * N + n], accumulate);
    });
}

// (declared in kernels_cpu.h, whose matmuls call it in a --dtype bf16 run: A fp32 words holding bf16
// values, the activations; B the same, or the weights' bf16 copy in bf16 storage)
template <typename TA, typename TB, typename TC>
static void gemm_bf16_cpu(int M, int N, int K, const TA* A, long a_rs, long a_cs, const TB* B, long b_rs, long b_cs,
                          TC* Cm, long ldc, bool accumulate, const float* bias) {
    if (M <= 0 || N <= 0) return;
#if defined(__AVX512F__) && defined(__linux__) && defined(__x86_64__)
    if (bf16_path == BF16_AMX && bf16_amx_supported()) {
        gemm_bf16_amx_cpu(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, Cm, ldc, accumulate, bias);
        return;
    }
#endif
#if defined(__AVX512F__)
    if (bf16_dp_used()) {
        gemm_bf16_dp_cpu(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, Cm, ldc, accumulate, bias);
        return;
    }
#endif
    gemm_bf16_fma_cpu(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, Cm, ldc, accumulate, bias);
}
