// bf16.h: bfloat16 on the CPU: conversions, stochastic rounding, and a GEMM with fp32 accumulation.
//
// bf16 is the top half of an fp32: the same sign and 8-bit exponent, 7 bits of mantissa. A product of two
// bf16 numbers is exact in fp32 (8 x 8 significant bits fit in 24), so a bf16 dot product accumulated
// in fp32 rounds once per term, exactly as an fp32 fma chain does.
//
// The GEMM runs on AVX512-BF16's vdpbf16ps where the CPU has it (checked at run time), and otherwise
// computes the same numbers with fp32 fmas: vdpbf16ps adds, per fp32 lane i, the product of the pair's
// odd elements (2i+1) and then that of its even ones (2i), each rounded to nearest even, denormals
// flushed (as tp's threads run anyway: common/cpu_pool.h sets FTZ|DAZ in every thread). That is two fmas
// in that order, so the two paths are bit-identical (the bf16 test checks it on the CPU that runs it);
// `bf16_dp_enabled = false` forces the fma path, so a CPU with vdpbf16ps tests both.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#include <immintrin.h>
#include "cpu_pool.h"

typedef uint16_t bf16;

static inline float bf16_to_float(bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

// round to nearest, ties to even (as every fp32 to bf16 conversion of llm.c's and PyTorch's); a NaN stays
// a (quiet) NaN rather than rounding into infinity
static inline bf16 bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}

// 32 random bits from a 64-bit key (splitmix64's finaliser: every input bit moves every output bit)
static inline uint32_t bf16_noise(uint64_t key) {
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
static inline bf16 bf16_round_stochastic(float f, uint64_t index, uint32_t step, uint32_t seed) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7f800000u) == 0x7f800000u) return bf16_round(f);  // inf and NaN: nothing to round
    uint32_t r = bf16_noise(index * 0x100000001b3ull ^ ((uint64_t)step << 32 | seed)) >> 16;
    return (bf16)((u + r) >> 16);  // adds below the kept bits: carries into them with the right odds
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
// The tile is MR rows by NR = 2 vectors of fp32 (8 x 32 with AVX-512: 16 accumulators, 2 B vectors, a
// broadcast; 6 x 16 with AVX2). A K block of KC pairs keeps a B panel (KC x NR words, 16 KB) in L1 while
// the row tiles of a unit stream past it; a unit of MT x NT tiles keeps its A rows in L2.
#if defined(__AVX512F__)
#define BF16_MR 8
#define BF16_VL 16
#elif defined(__FMA__)
#define BF16_MR 6
#define BF16_VL 8
#else
#define BF16_MR 4
#define BF16_VL 1
#endif
#define BF16_NR (2 * BF16_VL)
#define BF16_KC (16384 / (BF16_NR * 4))
#define BF16_MT 16
#define BF16_NT 8

// the CPU can run vdpbf16ps (the build's vector code is AVX-512), and the dp path is not switched off
static inline bool bf16_dp_supported() {
#if defined(__AVX512F__)
    static const bool has = __builtin_cpu_supports("avx512bf16");
    return has;
#else
    return false;
#endif
}
static bool bf16_dp_enabled = true;  // false: the fp32-fma path even where vdpbf16ps exists
static inline bool bf16_dp_used() { return bf16_dp_enabled && bf16_dp_supported(); }

// acc (MR x NR, row-major) += a (kc pairs x MR words) . b (kc pairs x NR words), with fp32 fmas: per pair,
// the odd elements' product, then the even ones'
static inline void gemm_bf16_tile_fma(float* acc, const uint32_t* a, const uint32_t* b, int kc) {
#if defined(__AVX512F__) || defined(__FMA__)
#if defined(__AVX512F__)
    typedef __m512 V;
    typedef __m512i VI;
#define BF_LOADI(p) _mm512_loadu_si512((const void*)(p))
#define BF_HI(x) _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xffff0000u)))
#define BF_LO(x) _mm512_castsi512_ps((__m512i)((__v16su)(x) << 16))  // (GCC 12 warns on _mm512_slli_epi32's undefined)
#define BF_FMA _mm512_fmadd_ps
#define BF_SET1 _mm512_set1_ps
#define BF_LOAD _mm512_loadu_ps
#define BF_STORE _mm512_storeu_ps
#else
    typedef __m256 V;
    typedef __m256i VI;
#define BF_LOADI(p) _mm256_loadu_si256((const __m256i*)(p))
#define BF_HI(x) _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32((int)0xffff0000u)))
#define BF_LO(x) _mm256_castsi256_ps((__m256i)((__v8su)(x) << 16))
#define BF_FMA _mm256_fmadd_ps
#define BF_SET1 _mm256_set1_ps
#define BF_LOAD _mm256_loadu_ps
#define BF_STORE _mm256_storeu_ps
#endif
    V c[BF16_MR][2];
    for (int r = 0; r < BF16_MR; r++) {
        c[r][0] = BF_LOAD(acc + r * BF16_NR);
        c[r][1] = BF_LOAD(acc + r * BF16_NR + BF16_VL);
    }
    for (int j = 0; j < kc; j++) {
        VI w0 = BF_LOADI(b + (size_t)j * BF16_NR), w1 = BF_LOADI(b + (size_t)j * BF16_NR + BF16_VL);
        V b0h = BF_HI(w0), b0l = BF_LO(w0), b1h = BF_HI(w1), b1l = BF_LO(w1);
        for (int r = 0; r < BF16_MR; r++) {
            uint32_t u = a[(size_t)j * BF16_MR + r], uh = u & 0xffff0000u, ul = u << 16;
            float fh, fl;
            memcpy(&fh, &uh, 4);
            memcpy(&fl, &ul, 4);
            V ah = BF_SET1(fh), al = BF_SET1(fl);
            c[r][0] = BF_FMA(al, b0l, BF_FMA(ah, b0h, c[r][0]));
            c[r][1] = BF_FMA(al, b1l, BF_FMA(ah, b1h, c[r][1]));
        }
    }
    for (int r = 0; r < BF16_MR; r++) {
        BF_STORE(acc + r * BF16_NR, c[r][0]);
        BF_STORE(acc + r * BF16_NR + BF16_VL, c[r][1]);
    }
#undef BF_LOADI
#undef BF_HI
#undef BF_LO
#undef BF_FMA
#undef BF_SET1
#undef BF_LOAD
#undef BF_STORE
#else
    for (int j = 0; j < kc; j++)
        for (int r = 0; r < BF16_MR; r++)
            for (int n = 0; n < BF16_NR; n++) {
                uint32_t u = a[(size_t)j * BF16_MR + r], w = b[(size_t)j * BF16_NR + n];
                float& s = acc[r * BF16_NR + n];
                s = fmaf(bf16_to_float((bf16)(u >> 16)), bf16_to_float((bf16)(w >> 16)), s);
                s = fmaf(bf16_to_float((bf16)u), bf16_to_float((bf16)w), s);
            }
#endif
}

#if defined(__AVX512F__)
// the same with vdpbf16ps: one instruction does both fmas of 16 lanes (only called where the CPU has it)
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
#endif

static inline uint32_t bf16_pair(bf16 even, bf16 odd) { return (uint32_t)even | (uint32_t)odd << 16; }

static void gemm_bf16_cpu(int M, int N, int K, const bf16* A, long a_rs, long a_cs, const bf16* B, long b_rs,
                          long b_cs, float* Cm, long ldc, bool accumulate, const float* bias) {
    if (M <= 0 || N <= 0) return;
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
    const int threads = cpu_pool_threads();
    const long want = threads > 1 ? 4L * threads : 1;
    while ((long)((MB + mt - 1) / mt) * ((NB + nt - 1) / nt) < want && (mt > 1 || nt > 1)) {
        if (mt >= nt && mt > 1) mt /= 2; else nt /= 2;
    }
    const int UM = (MB + mt - 1) / mt, UN = (NB + nt - 1) / nt;
    const bool dp = bf16_dp_used();
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
#if defined(__AVX512F__)
                    if (dp) gemm_bf16_tile_dp(acc, a, b, kc);
                    else
#endif
                        gemm_bf16_tile_fma(acc, a, b, kc);
                    (void)dp;
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
