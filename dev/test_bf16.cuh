// test_bf16.cuh: bf16 numbers on the CPU (common/bf16.h): conversions, stochastic rounding, and the bf16
// GEMM against a float64 reference, its vdpbf16ps path against its fp32-fma path, and its timing.
#pragma once
#include "../common/bf16.h"

static uint32_t bf16_test_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float bf16_test_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// the elements of two vectors that differ in bits, and 1 more if their lengths do
static long vectors_differ(const std::vector<float>& x, const std::vector<float>& y) {
    long n = x.size() == y.size() ? 0 : 1;
    for (size_t i = 0; i < x.size() && i < y.size(); i++) n += bf16_test_bits(x[i]) != bf16_test_bits(y[i]);
    return n;
}
// how many of h (bf16 storage) are not x (fp32) rounded to nearest (bf16_pack), element by element
static long packed_differ(const std::vector<bf16>& h, const std::vector<float>& x) {
    std::vector<bf16> packed(x.size());
    bf16_pack_cpu(packed.data(), x.data(), (long)x.size());
    long n = h.size() == x.size() ? 0 : 1;
    for (size_t i = 0; i < h.size() && i < x.size(); i++) n += h[i] != packed[i];
    return n;
}

// C (M x N) = A . B in float64 from the bf16 operands, and sum_k |a||b| per element (the error scale)
static void gemm_bf16_ref(int M, int N, int K, const bf16* A, long a_rs, long a_cs, const bf16* B, long b_rs, long b_cs,
                          std::vector<double>* C, std::vector<double>* scale) {
    C->assign((size_t)M * N, 0.0);
    scale->assign((size_t)M * N, 0.0);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0, a = 0;
            for (int k = 0; k < K; k++) {
                double p = (double)bf16_to_float(A[m * a_rs + k * a_cs]) * bf16_to_float(B[k * b_rs + n * b_cs]);
                s += p;
                a += fabs(p);
            }
            (*C)[(size_t)m * N + n] = s;
            (*scale)[(size_t)m * N + n] = a;
        }
}

// one GEMM case: A (M x K) and B (K x N), each as a matrix or a transpose, with bias and accumulate; the
// result against float64 within fp32 accumulation's bound (K+2 roundings of 2^-24 of sum |a||b|, plus the
// bias and the old C), and the vdpbf16ps path (where the CPU has it) bit for bit against the fma path
static void bf16_gemm_case(int M, int N, int K, bool a_t, bool b_t, bool accumulate, bool with_bias, uint64_t seed,
                           double* worst, bool* same, bool* mixed, long* compared) {
    std::vector<bf16> A((size_t)M * K), B((size_t)K * N);
    std::vector<float> bias(N), C0((size_t)M * N);
    uint64_t s = seed;
    auto rnd = [&]() { s = s * 6364136223846793005ull + 1442695040888963407ull; return (float)((s >> 40) / 16777216.0 - 0.5); };
    for (auto& x : A) x = bf16_round(rnd() * 4.0f);
    for (auto& x : B) x = bf16_round(rnd() * 4.0f);
    for (auto& x : bias) x = rnd();
    for (auto& x : C0) x = rnd();
    const long a_rs = a_t ? 1 : K, a_cs = a_t ? M : 1, b_rs = b_t ? 1 : N, b_cs = b_t ? K : 1;
    std::vector<double> ref, scale;
    gemm_bf16_ref(M, N, K, A.data(), a_rs, a_cs, B.data(), b_rs, b_cs, &ref, &scale);
    std::vector<float> Cdp = C0, Cfma = C0;
    const Bf16Path had = bf16_path;
    bf16_path = BF16_DP;
    gemm_bf16_cpu(M, N, K, A.data(), a_rs, a_cs, B.data(), b_rs, b_cs, Cdp.data(), N, accumulate, with_bias ? bias.data() : nullptr);
    bf16_path = BF16_FMA;
    gemm_bf16_cpu(M, N, K, A.data(), a_rs, a_cs, B.data(), b_rs, b_cs, Cfma.data(), N, accumulate, with_bias ? bias.data() : nullptr);
    // the same operands held in fp32 words (a --dtype bf16 run's matmuls), on vdpbf16ps
    std::vector<float> Aw(A.size()), Bw(B.size()), Cw = C0;
    for (size_t i = 0; i < A.size(); i++) Aw[i] = bf16_to_float(A[i]);
    for (size_t i = 0; i < B.size(); i++) Bw[i] = bf16_to_float(B[i]);
    bf16_path = BF16_DP;
    gemm_bf16_cpu(M, N, K, Aw.data(), a_rs, a_cs, Bw.data(), b_rs, b_cs, Cw.data(), N, accumulate, with_bias ? bias.data() : nullptr);
    // A in fp32 words and B in bf16 storage (an activation times a --dtype bf16 run's weight), on both paths
    std::vector<float> Cmix_dp = C0, Cmix_fma = C0;
    gemm_bf16_cpu(M, N, K, Aw.data(), a_rs, a_cs, B.data(), b_rs, b_cs, Cmix_dp.data(), N, accumulate, with_bias ? bias.data() : nullptr);
    bf16_path = BF16_FMA;
    gemm_bf16_cpu(M, N, K, Aw.data(), a_rs, a_cs, B.data(), b_rs, b_cs, Cmix_fma.data(), N, accumulate, with_bias ? bias.data() : nullptr);
    bf16_path = had;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            size_t i = (size_t)m * N + n;
            double want = ref[i] + (with_bias ? bias[n] : 0.0) + (accumulate ? C0[i] : 0.0);
            double bound = (K + 2) * ldexp(1.0, -24) * (scale[i] + fabs(want)) + ldexp(1.0, -24) * 2 * (fabs(C0[i]) + fabs(bias[n]));
            double err = fabs((double)Cfma[i] - want) / (bound > 0 ? bound : 1e-30);
            if (!(err <= *worst)) *worst = err;  // a NaN becomes the worst
            if (bf16_test_bits(Cdp[i]) != bf16_test_bits(Cfma[i]) || bf16_test_bits(Cw[i]) != bf16_test_bits(Cfma[i])) *same = false;
            if (bf16_test_bits(Cmix_dp[i]) != bf16_test_bits(Cfma[i]) || bf16_test_bits(Cmix_fma[i]) != bf16_test_bits(Cfma[i])) *mixed = false;
            (*compared)++;
        }
}

// The bf16 copies that P ranks round of their shards of full (each rank in a thread with `threads`
// workers, each shard in two slices cut at `cut`, as ZeRO-1 cuts one), put back where they came from and
// widened: the full model's bf16 weights as those ranks hold them. Each rank writes a full-size copy of
// its own (the replicated tensors are every rank's); *disagree counts the weights that two ranks hold and
// round differently, *missing those no rank holds.
static std::vector<float> bf16_masters_at(const GPTConfig* cfg, const std::vector<float>& full, int P, int threads, long cut,
                                          uint32_t step, uint32_t seed, long* disagree, long* missing) {
    std::vector<std::vector<float>> mine(P, std::vector<float>(full.size(), NAN));
    std::vector<std::thread> ranks;
    for (int r = 0; r < P; r++)
        ranks.emplace_back([&, r]() {
            cpu_pool_start(threads);
            ShardPlan sp;
            shard_plan_init(&sp, cfg, P, r);
            long off = 0;
            for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
                const TensorShard* ts = &sp.t[t];
                long n = shard_local_size(ts), a = std::min(n, cut);
                std::vector<float> local(n), back(n);
                std::vector<bf16> b(n);
                shard_copy(ts, r, (float*)full.data() + off, local.data(), true);
                FullIndex map = shard_full_index(ts, r, off);
                bf16_from_master_cpu(b.data(), local.data(), 0, a, map, step, seed);
                bf16_from_master_cpu(b.data() + a, local.data() + a, a, n - a, map, step, seed);
                for (long i = 0; i < n; i++) back[i] = bf16_to_float(b[i]);
                shard_copy(ts, r, mine[r].data() + off, back.data(), false);
                off += shard_full_size(ts);
            }
        });
    for (auto& t : ranks) t.join();
    std::vector<float> out(full.size(), NAN);
    *disagree = *missing = 0;
    for (size_t i = 0; i < full.size(); i++) {
        for (int r = 0; r < P; r++) {
            if (std::isnan(mine[r][i])) continue;
            if (std::isnan(out[i])) out[i] = mine[r][i];
            else *disagree += bf16_test_bits(out[i]) != bf16_test_bits(mine[r][i]);
        }
        *missing += std::isnan(out[i]);
    }
    return out;
}

// The bf16 copy of the master weights: at TP = 2 and 4, with other thread counts and slices, the same bits
// as at TP = 1, and those are bf16_round_stochastic of each element keyed on its full index
static void test_bf16_masters() {
    GPTConfig cfg = make_config(2, 4, 32, 256, 16);
    std::vector<float> full = init_weights(&cfg, 31);
    for (size_t i = 0; i < full.size(); i++) full[i] += 1e-3f * sinf((float)i);  // the biases and layernorms too, off bf16's grid
    const uint32_t step = 7, seed = 1337;
    long disagree, missing;
    std::vector<float> one = bf16_masters_at(&cfg, full, 1, 1, 1L << 40, step, seed, &disagree, &missing);
    long wrong = missing;
    for (size_t i = 0; i < full.size(); i++)
        wrong += bf16_test_bits(one[i]) != bf16_test_bits(bf16_to_float(bf16_round_stochastic(full[i], i, step, seed)));
    check(wrong == 0, "TP=1: every weight's bf16 is bf16_round_stochastic keyed on its index in the full model: %ld of %zu differ",
          wrong, full.size());
    struct { int P, threads; long cut; } grids[] = {{2, 1, 1L << 40}, {4, 1, 1L << 40}, {2, 3, 777}, {4, 2, 5}};
    for (auto& g : grids) {
        std::vector<float> got = bf16_masters_at(&cfg, full, g.P, g.threads, g.cut, step, seed, &disagree, &missing);
        long diff = missing;
        for (size_t i = 0; i < full.size(); i++) diff += bf16_test_bits(got[i]) != bf16_test_bits(one[i]);
        std::string how = g.cut > 1000000 ? "whole shards" : "each shard in slices cut at " + std::to_string(g.cut);
        check(diff == 0 && disagree == 0, "TP=%d, %d thread%s, %s: %ld of %zu bf16 weights differ from TP=1's, %ld replicated ones between ranks",
              g.P, g.threads, g.threads > 1 ? "s" : "", how.c_str(), diff, full.size(), disagree);
    }
    std::vector<float> next = bf16_masters_at(&cfg, full, 2, 1, 1L << 40, step + 1, seed, &disagree, &missing);
    long moved = 0;
    for (size_t i = 0; i < full.size(); i++) moved += next[i] != one[i];
    check(moved > (long)full.size() / 10, "the next step draws new noise: %ld of %zu bf16 weights round the other way", moved,
          full.size());
    // and another run's seed (--seed) other noise at the same step: two runs that differ only in their seed
    // do not share their roundings
    std::vector<float> other = bf16_masters_at(&cfg, full, 2, 1, 1L << 40, step, seed + 1, &disagree, &missing);
    moved = 0;
    for (size_t i = 0; i < full.size(); i++) moved += other[i] != one[i];
    check(moved > (long)full.size() / 10, "another seed draws other noise: %ld of %zu bf16 weights round the other way", moved,
          full.size());
}

// body on a rank's thread with a pool of 1, then of 3 threads (a rank's thread, so that its pool is its own)
template <typename F>
static void on_a_rank_with_1_and_3_threads(F body) {
    for (int threads : {1, 3}) {
        std::thread rank([&]() {
            cpu_pool_start(threads);
            body();
        });
        rank.join();
    }
}
// ... on each of the bf16 GEMM's paths this CPU has (vdpbf16ps where it has AVX512-BF16, and the fp32 one)
template <typename F>
static void on_each_path_with_1_and_3_threads(F body) {
    const Bf16Path had = bf16_path;
    for (Bf16Path path : {BF16_DP, BF16_FMA}) {
        if (path == BF16_DP && !bf16_dp_supported()) continue;
        bf16_path = path;
        on_a_rank_with_1_and_3_threads(body);
    }
    bf16_path = had;
}
// uniform in [-0.5, 0.5) from a 64-bit LCG state
static float bf16_test_uniform(uint64_t* z) {
    *z = *z * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*z >> 40) / 16777216.0 - 0.5);
}

// What the packs put past an operand's end must be zeros, not whatever the buffer held: a product of a
// pad with anything is then 0, whereas a pad of stale data gives 0 x NaN = NaN, and a pair's missing half
// beside an infinity (odd K) gives 0 x inf = NaN. So the thread's pack buffers are first filled with NaNs
// (a larger GEMM whose operands are all NaN), then GEMMs of odd and ragged K, A and B each in both layouts,
// with no zero in A or B, an infinity in B's last row at column 0 and one in A's last column at row 0:
// column 0 and row 0 must be infinite (the signs of A's last column and B's last row) and every other
// element within fp32 accumulation's bound of float64. Returns the elements that are not, on the path
// bf16_path names.
static long bf16_gemm_pads_wrong() {
    long wrong = 0;
    {
        const int M = 40, N = 72, K = 600;
        std::vector<bf16> A((size_t)M * K, 0x7fc0), B((size_t)K * N, 0x7fc0);
        std::vector<float> C((size_t)M * N);
        for (int layout = 0; layout < 4; layout++) {
            const bool a_t = layout & 1, b_t = layout & 2;
            gemm_bf16_cpu(M, N, K, A.data(), a_t ? 1 : K, a_t ? M : 1, B.data(), b_t ? 1 : N, b_t ? K : 1, C.data(), N, false, nullptr);
        }
    }
    uint64_t z = 4242;
    for (int K : {1, 3, 31, 33, 63, 97})
        for (int layout = 0; layout < 4; layout++) {
            const int M = 19, N = 35;
            const bool a_t = layout & 1, b_t = layout & 2;
            const long a_rs = a_t ? 1 : K, a_cs = a_t ? M : 1, b_rs = b_t ? 1 : N, b_cs = b_t ? K : 1;
            std::vector<bf16> A((size_t)M * K), B((size_t)K * N);
            for (auto& x : A) x = bf16_round(0.25f + bf16_test_uniform(&z) + 0.5f);  // in [0.25, 1.25): no zero
            for (int m = 0; m < M; m += 2) A[m * a_rs + (K - 1) * a_cs] ^= 0x8000;  // some of the last column negative
            for (auto& x : B) {
                x = bf16_round(bf16_test_uniform(&z) * 4.0f);
                if ((x & 0x7fff) == 0) x = 0x3f80;  // no zero
            }
            B[(K - 1) * b_rs] = 0x7f80;  // b(K-1, 0) = +inf
            A[(K - 1) * a_cs] = 0x7f80;  // a(0, K-1) = +inf
            std::vector<float> C((size_t)M * N);
            gemm_bf16_cpu(M, N, K, A.data(), a_rs, a_cs, B.data(), b_rs, b_cs, C.data(), N, false, nullptr);
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++) {
                    const float c = C[(size_t)m * N + n];
                    if (n == 0 || m == 0) {  // a(m, K-1) b(K-1, n) is infinite, the other products finite
                        const bool neg = ((A[m * a_rs + (K - 1) * a_cs] ^ B[(K - 1) * b_rs + n * b_cs]) & 0x8000) != 0;
                        wrong += !(std::isinf(c) && (c < 0) == neg);
                        continue;
                    }
                    double want = 0, scale = 0;
                    for (int k = 0; k < K; k++) {
                        const double p = (double)bf16_to_float(A[m * a_rs + k * a_cs]) * bf16_to_float(B[k * b_rs + n * b_cs]);
                        want += p;
                        scale += fabs(p);
                    }
                    wrong += !(fabs(c - want) <= (K + 2) * ldexp(1.0, -24) * scale);  // a NaN is wrong
                }
        }
    return wrong;
}

// The ops a bf16 run calls with the weights' copy in bf16 storage (Weight's h): matmul_forward and
// matmul_backward, and the embedding's lookup, against the same values held in fp32 words, bit for bit,
// at a ragged shape and at one whose weight takes the vector packs; on both GEMM paths, with 1 and 3
// threads. And
// matmul_forward and matmul_backward with the input as a layer keeps it, in bf16 storage (Input's h), the
// same way, and matmul_backward with its output gradient in bf16 storage as well.
static void test_bf16_weight_ops() {
    long differ = 0, compared = 0;
    struct { int N, IC, OC; } shapes[] = {{67, 96, 64}, {37, 33, 70}};
    on_each_path_with_1_and_3_threads([&]() {
        for (auto& sh : shapes) {
            const int N = sh.N, IC = sh.IC, OC = sh.OC;
            uint64_t z = 77 + (uint64_t)N;
            auto rnd = [&]() { return bf16_test_uniform(&z); };
            std::vector<bf16> w((size_t)OC * IC);
            std::vector<float> ww(w.size()), inp((size_t)N * IC), dout((size_t)N * OC), bias(OC);
            for (size_t i = 0; i < w.size(); i++) ww[i] = bf16_to_float(w[i] = bf16_round(rnd()));
            for (auto& x : inp) x = bf16_to_float(bf16_round(rnd()));
            for (auto& x : dout) x = bf16_to_float(bf16_round(rnd()));
            for (auto& x : bias) x = rnd();
            std::vector<float> out16((size_t)N * OC), out32(out16.size()), di16(inp.size()), di32(inp.size());
            std::vector<float> dw16(ww.size(), 0.5f), dw32 = dw16, db16(OC, 0.25f), db32 = db16;
            matmul_forward_cpu(out16.data(), inp.data(), Weight{nullptr, w.data()}, bias.data(), N, IC, OC);
            matmul_forward_cpu(out32.data(), inp.data(), ww.data(), bias.data(), N, IC, OC, true);
            matmul_backward_cpu(di16.data(), dw16.data(), db16.data(), dout.data(), inp.data(), Weight{nullptr, w.data()}, N, IC, OC);
            matmul_backward_cpu(di32.data(), dw32.data(), db32.data(), dout.data(), inp.data(), ww.data(), N, IC, OC, true);
            std::vector<bf16> inp_kept(inp.size());
            for (size_t i = 0; i < inp.size(); i++) inp_kept[i] = bf16_round(inp[i]);
            std::vector<float> outk(out16.size()), dik(inp.size()), dwk(ww.size(), 0.5f), dbk(OC, 0.25f);
            matmul_forward_cpu(outk.data(), Input{nullptr, inp_kept.data()}, Weight{nullptr, w.data()}, bias.data(), N, IC, OC);
            matmul_backward_cpu(dik.data(), dwk.data(), dbk.data(), dout.data(), Input{nullptr, inp_kept.data()},
                                Weight{nullptr, w.data()}, N, IC, OC);
            // the output gradient in bf16 storage too (fc's and qkv's in a bf16 run: gpt.cu's grad_input), in
            // the recipe's two calls: the input gradient alone, then the weight's and the bias's
            std::vector<bf16> dout_h(dout.size());
            for (size_t i = 0; i < dout.size(); i++) dout_h[i] = bf16_round(dout[i]);
            std::vector<float> dig(inp.size()), dwg(ww.size(), 0.5f), dbg(OC, 0.25f);
            matmul_backward_cpu(dig.data(), nullptr, nullptr, Input{nullptr, dout_h.data()}, Input{nullptr, inp_kept.data()},
                                Weight{nullptr, w.data()}, N, IC, OC);
            matmul_backward_cpu(nullptr, dwg.data(), dbg.data(), Input{nullptr, dout_h.data()}, Input{nullptr, inp_kept.data()},
                                Weight{nullptr, w.data()}, N, IC, OC);
            // the embedding: rows [v0, v0 + OC) of a vocabulary, tokens inside and outside them
            std::vector<int> tokens(N);
            for (int n = 0; n < N; n++) tokens[n] = (n * 37) % (2 * OC);
            std::vector<float> enc16((size_t)N * IC), enc32(enc16.size());
            encoder_forward_cpu(enc16.data(), tokens.data(), Weight{nullptr, w.data()}, OC / 2, OC, N, IC);
            encoder_forward_cpu(enc32.data(), tokens.data(), Weight{ww.data(), nullptr}, OC / 2, OC, N, IC);
            for (auto* pr : {&out16, &di16, &dw16, &db16, &enc16, &outk, &dik, &dwk, &dbk, &dig, &dwg, &dbg}) {
                const std::vector<float>& b = pr == &out16 || pr == &outk ? out32 : pr == &di16 || pr == &dik || pr == &dig ? di32
                                            : pr == &dw16 || pr == &dwk || pr == &dwg ? dw32 : pr == &db16 || pr == &dbk || pr == &dbg ? db32 : enc32;
                for (size_t i = 0; i < b.size(); i++) differ += bf16_test_bits((*pr)[i]) != bf16_test_bits(b[i]);
                compared += (long)b.size();
            }
        }
    });
    check(differ == 0, "matmul_forward, matmul_backward and encoder_forward with the weights in bf16 storage, and the matmuls "
          "with their input (and the backward its output gradient) in bf16 storage too, give the bits of the same values in fp32 "
          "words: %ld of %ld differ (2 shapes, "
          "%s, 1 and 3 threads)", differ, compared, bf16_dp_supported() ? "vdpbf16ps and the fp32 path" : "the fp32 path");
}

// A bf16 run's gradients in bf16 storage (Grad's h): every op that adds to a parameter's gradient adds its
// fp32 sum once, rounded to nearest, so its result is the fp32 op's, run from the same gradient widened,
// rounded once: bit for bit, for matmul_backward's dweight (the GEMM's bf16 C with accumulate, whole tiles in
// vectors and ragged edges) and dbias, layernorm_backward's dw and db, encoder_backward with tokens repeated
// and interleaved (a rounding per repeat would show) and position_backward on a sequence-parallel slice; on
// both GEMM paths, with 1 and 3 threads.
static void test_bf16_grad_ops() {
    long differ = 0, compared = 0, moved = 0;
    // the bf16 result against the fp32 one rounded, and how many of them the op changed
    auto compare = [&](const std::vector<bf16>& g16, const std::vector<float>& g32, const std::vector<bf16>& g0) {
        for (size_t i = 0; i < g16.size(); i++) {
            differ += g16[i] != bf16_round(g32[i]);
            moved += g16[i] != g0[i];
        }
        compared += (long)g16.size();
    };
    struct { int N, IC, OC; } shapes[] = {{67, 96, 64}, {37, 33, 70}};
    on_each_path_with_1_and_3_threads([&]() {
        for (auto& sh : shapes) {
            const int N = sh.N, IC = sh.IC, OC = sh.OC;
            uint64_t z = 91 + (uint64_t)N;
            auto rnd = [&]() { return bf16_test_uniform(&z); };
            auto vec = [&](long n) {
                std::vector<float> v(n);
                for (auto& x : v) x = bf16_to_float(bf16_round(rnd()));
                return v;
            };
            std::vector<bf16> w = bf16_vector_of(vec((long)OC * IC));
            std::vector<float> inp = vec((long)N * IC), dout = vec((long)N * OC);
            std::vector<bf16> dw0 = bf16_vector_of(vec((long)OC * IC)), db0 = bf16_vector_of(vec(OC));
            std::vector<bf16> dw16 = dw0, db16 = db0;
            std::vector<float> dw32 = fp32_vector_of(dw0), db32 = fp32_vector_of(db0);
            matmul_backward_cpu(nullptr, Grad(dw16.data()), Grad(db16.data()), dout.data(), inp.data(), Weight{nullptr, w.data()}, N, IC, OC);
            matmul_backward_cpu(nullptr, Grad(dw32.data()), Grad(db32.data()), dout.data(), inp.data(), Weight{nullptr, w.data()}, N, IC, OC);
            compare(dw16, dw32, dw0);
            compare(db16, db32, db0);
            // layernorm over rows of IC channels
            std::vector<float> x = vec((long)N * IC), lw = vec(IC), lb = vec(IC), mean(N), rstd(N), ln((long)N * IC);
            layernorm_forward_cpu(ln.data(), mean.data(), rstd.data(), x.data(), lw.data(), lb.data(), N, IC);
            std::vector<float> dln = vec((long)N * IC), dx((long)N * IC);
            std::vector<bf16> lw0 = bf16_vector_of(vec(IC)), lb0 = bf16_vector_of(vec(IC)), lw16 = lw0, lb16 = lb0;
            std::vector<float> lw32 = fp32_vector_of(lw0), lb32 = fp32_vector_of(lb0);
            layernorm_backward_cpu(dx.data(), Grad(lw16.data()), Grad(lb16.data()), dln.data(), x.data(), lw.data(), mean.data(), rstd.data(), N, IC);
            layernorm_backward_cpu(dx.data(), Grad(lw32.data()), Grad(lb32.data()), dln.data(), x.data(), lw.data(), mean.data(), rstd.data(), N, IC);
            compare(lw16, lw32, lw0);
            compare(lb16, lb32, lb0);
            // the embedding: rows [v0, v0 + OC / 2) of a vocabulary of OC rows; 5 distinct tokens, so each row
            // owned repeats many times, interleaved with the others
            std::vector<int> tokens(N);
            for (int n = 0; n < N; n++) tokens[n] = (n * 7 + n / 3) % 5 * (OC / 5);
            const int v0 = OC / 5, Vl = OC / 2;
            std::vector<bf16> we0 = bf16_vector_of(vec((long)Vl * IC)), we16 = we0;
            std::vector<float> we32 = fp32_vector_of(we0);
            std::vector<int> groups(ENC_GROUP_INTS(N));  // grouped as gpt_forward groups them (and as the fp32 form does)
            encoder_groups(tokens.data(), v0, Vl, N, groups.data());
            encoder_backward_cpu(Grad(we16.data()), inp.data(), tokens.data(), groups.data(), v0, Vl, N, IC);
            encoder_backward_cpu(Grad(we32.data()), inp.data(), tokens.data(), nullptr, v0, Vl, N, IC);
            compare(we16, we32, we0);
            // the positions of an SP slice: N rows from token t0 of sequences of T, more rows than positions
            const int T = 16, t0 = 11;
            std::vector<bf16> wp0 = bf16_vector_of(vec((long)T * IC)), wp16 = wp0;
            std::vector<float> wp32 = fp32_vector_of(wp0);
            position_backward_cpu(Grad(wp16.data()), inp.data(), N, t0, T, IC);
            position_backward_cpu(Grad(wp32.data()), inp.data(), N, t0, T, IC);
            compare(wp16, wp32, wp0);
        }
    });
    check(differ == 0 && moved > compared / 2,
          "the backward's gradients in bf16 storage are the fp32 ops' results rounded once, bit for bit: %ld of %ld differ "
          "(matmul dweight and dbias, layernorm dw and db, wte with repeated tokens, wpe; %ld changed by the ops; %s, 1 and 3 threads)",
          differ, compared, moved, bf16_dp_supported() ? "vdpbf16ps and the fp32 path" : "the fp32 path");
}

// The LM head and the loss with the logits in bf16 storage (a --dtype bf16 run's, Logits) against the same
// values in fp32 words (what a bf16 run held before, and under the g_bf16_in_fp32 hook): the head's GEMM
// stores each fp32 sum rounded to nearest; the cross-entropy's maxes, sums and losses are the same bits and
// its dlogits the fp32 ones rounded; the backward matmuls give the same bits from either. On both GEMM
// paths (where the CPU has vdpbf16ps), 1 and 3 threads, a shape that takes the packs' vector paths for a
// bf16 A (dlogits along k and across it) and a ragged one with odd K, a vocab shard with padding columns.
static void test_bf16_logits_ops() {
    long differ = 0, compared = 0;
    struct { int N, C, Vl, v0, V; } shapes[] = {{67, 96, 64, 64, 120}, {37, 33, 70, 0, 51}};
    on_each_path_with_1_and_3_threads([&]() {
        for (auto& sh : shapes) {
            const int N = sh.N, C = sh.C, Vl = sh.Vl;
            uint64_t z = 91 + (uint64_t)N;
            auto rnd = [&]() { return bf16_test_uniform(&z); };
            std::vector<bf16> w((size_t)Vl * C);
            std::vector<float> lnf((size_t)N * C);
            std::vector<int> targets(N);
            for (auto& x : w) x = bf16_round(rnd() * 4.0f);
            for (auto& x : lnf) x = bf16_to_float(bf16_round(rnd() * 2.0f));
            for (int n = 0; n < N; n++) targets[n] = (n * 13) % sh.V;  // some in this shard, some not
            const Weight wt = {nullptr, w.data()};
            // the head: bf16 logits against the fp32 sums rounded
            std::vector<bf16> lg16((size_t)N * Vl);
            std::vector<float> lg32(lg16.size());
            matmul_forward_cpu(Logits{nullptr, lg16.data()}, lnf.data(), wt, nullptr, N, C, Vl);
            matmul_forward_cpu(lg32.data(), lnf.data(), wt, nullptr, N, C, Vl);
            for (size_t i = 0; i < lg32.size(); i++) {
                differ += lg16[i] != bf16_round(lg32[i]);
                lg32[i] = bf16_to_float(lg16[i]);  // from here on, the same values in fp32 words
            }
            compared += (long)lg32.size();
            // the loss (maxes and sums as the all-reduces of one rank leave them)
            std::vector<float> mx16(N), mx32(N), sm16(2 * N), sm32(2 * N), loss16(N), loss32(N);
            crossentropy_max_cpu(mx16.data(), Logits{nullptr, lg16.data()}, N, Vl, sh.v0, sh.V);
            crossentropy_max_cpu(mx32.data(), Logits{lg32.data(), nullptr}, N, Vl, sh.v0, sh.V);
            crossentropy_sums_cpu(sm16.data(), Logits{nullptr, lg16.data()}, mx16.data(), targets.data(), N, Vl, sh.v0, sh.V);
            crossentropy_sums_cpu(sm32.data(), Logits{lg32.data(), nullptr}, mx32.data(), targets.data(), N, Vl, sh.v0, sh.V);
            crossentropy_finish_cpu(loss16.data(), Logits{nullptr, lg16.data()}, mx16.data(), sm16.data(), targets.data(), N, Vl,
                                    sh.v0, sh.V, 1.0f / N);
            crossentropy_finish_cpu(loss32.data(), Logits{lg32.data(), nullptr}, mx32.data(), sm32.data(), targets.data(), N, Vl,
                                    sh.v0, sh.V, 1.0f / N);
            for (auto* pr : {&mx16, &sm16, &loss16}) {
                const std::vector<float>& b = pr == &mx16 ? mx32 : pr == &sm16 ? sm32 : loss32;
                for (size_t i = 0; i < b.size(); i++) differ += bf16_test_bits((*pr)[i]) != bf16_test_bits(b[i]);
                compared += (long)b.size();
            }
            for (size_t i = 0; i < lg32.size(); i++) {
                differ += lg16[i] != bf16_round(lg32[i]);
                lg32[i] = bf16_to_float(lg16[i]);  // dlogits: the bf16 run's values, in fp32 words
            }
            compared += (long)lg32.size();
            // the head's backward from either
            std::vector<float> di16((size_t)N * C), di32(di16.size()), dw16((size_t)Vl * C, 0.5f), dw32 = dw16;
            std::vector<float> db16(Vl, 0.25f), db32 = db16;
            matmul_backward_cpu(di16.data(), dw16.data(), db16.data(), Logits{nullptr, lg16.data()}, lnf.data(), wt, N, C, Vl);
            matmul_backward_cpu(di32.data(), dw32.data(), db32.data(), Logits{lg32.data(), nullptr}, lnf.data(), wt, N, C, Vl);
            for (auto* pr : {&di16, &dw16, &db16}) {
                const std::vector<float>& b = pr == &di16 ? di32 : pr == &dw16 ? dw32 : db32;
                for (size_t i = 0; i < b.size(); i++) differ += bf16_test_bits((*pr)[i]) != bf16_test_bits(b[i]);
                compared += (long)b.size();
            }
        }
    });
    check(differ == 0, "the LM head and the loss with the logits in bf16 storage: the head's outputs are its fp32 sums rounded, and "
          "the loss, dlogits (rounded) and the head's gradients the bits of the same values in fp32 words: %ld of %ld differ "
          "(2 shapes, %s, 1 and 3 threads)", differ, compared, bf16_dp_supported() ? "vdpbf16ps and the fp32 path" : "the fp32 path");
}

// The elementwise ops that write a --dtype bf16 run's kept activations straight into bf16 storage, against
// the passes they replace, bit for bit: layernorm_forward into bf16 against its fp32 output packed
// (bf16_pack); gelu_forward_bf16 against rounding fc's sums in place (round_bf16), packing them, the fp32
// GELU and packing its output; gelu_backward_bf16 against the fp32 backward from the same values widened,
// rounded in place (round_bf16) and packed. And the ops on a bf16 run's residual stream, in bf16 storage,
// against fp32 words holding the same values: layernorm_forward and _backward reading it, residual_forward
// writing it. Inputs include ties between two bf16, NaN, infinities and values past bf16's range; with 1 and 3 threads
// (and both GEMM paths, which these ops do not use: the helper is shared).
static void test_bf16_elementwise_ops() {
    long differ = 0, compared = 0;
    struct { int N, C; } shapes[] = {{67, 96}, {37, 33}, {5, 770}};
    const float special[] = {NAN, INFINITY, -INFINITY, 3.4e38f, -3.4e38f, 1.00390625f /* a tie: 1 + 2^-8 */,
                             -1.01171875f /* a tie, odd below */, 0.0f, -0.0f, 1e-30f, 20.0f, -20.0f};
    on_each_path_with_1_and_3_threads([&]() {
        for (auto& sh : shapes) {
            const int N = sh.N, C = sh.C;
            const long n = (long)N * C;
            uint64_t z = 53 + (uint64_t)n;
            auto rnd = [&]() { return bf16_test_uniform(&z); };
            std::vector<float> inp(n), w(C), b(C), dout(n);
            for (auto& x : inp) x = rnd() * 6.0f;
            for (auto& x : w) x = 1.0f + rnd();
            for (auto& x : b) x = rnd();
            for (auto& x : dout) x = rnd();
            // the layernorm: bf16 out against fp32 out packed, and the same statistics
            std::vector<float> out32(n), mean32(N), rstd32(N), mean16(N), rstd16(N);
            std::vector<bf16> out16(n), packed(n);
            layernorm_forward_cpu(out32.data(), mean32.data(), rstd32.data(), inp.data(), w.data(), b.data(), N, C);
            layernorm_forward_cpu(out16.data(), mean16.data(), rstd16.data(), inp.data(), w.data(), b.data(), N, C);
            bf16_pack_cpu(packed.data(), out32.data(), n);
            for (long i = 0; i < n; i++) differ += out16[i] != packed[i];
            for (int r = 0; r < N; r++)
                differ += (bf16_test_bits(mean16[r]) != bf16_test_bits(mean32[r])) + (bf16_test_bits(rstd16[r]) != bf16_test_bits(rstd32[r]));
            compared += n + 2 * N;
            // the residual stream in bf16 storage against fp32 words of the same values: the layernorm
            // reading it (out in fp32 and in bf16, the statistics), its backward (dinp, dw, db), and the
            // residual add writing it (against the fp32 add packed)
            std::vector<bf16> res16(n);
            bf16_pack_cpu(res16.data(), inp.data(), n);
            std::vector<float> res32(n);
            bf16_widen_cpu(res32.data(), res16.data(), n);
            std::vector<float> o32(n), m32(N), r32(N), o32s(n), m32s(N), r32s(N);
            std::vector<bf16> o16(n), o16s(n);
            layernorm_forward_cpu(o32.data(), m32.data(), r32.data(), res32.data(), w.data(), b.data(), N, C);
            layernorm_forward_cpu(o32s.data(), m32s.data(), r32s.data(), Input{nullptr, res16.data()}, w.data(), b.data(), N, C);
            layernorm_forward_cpu(o16.data(), mean16.data(), rstd16.data(), res32.data(), w.data(), b.data(), N, C);
            layernorm_forward_cpu(o16s.data(), mean32.data(), rstd32.data(), res16.data(), w.data(), b.data(), N, C);
            differ += vectors_differ(o32, o32s) + vectors_differ(m32, m32s) + vectors_differ(r32, r32s);
            for (long i = 0; i < n; i++) differ += o16[i] != o16s[i];
            std::vector<float> dx32(n, 0.5f), dx16(n, 0.5f), dw32(C, 0.25f), db32(C, -0.25f), dw16 = dw32, db16 = db32;
            layernorm_backward_cpu(dx32.data(), Grad(dw32.data()), Grad(db32.data()), dout.data(), res32.data(), w.data(),
                                   m32.data(), r32.data(), N, C);
            layernorm_backward_cpu(dx16.data(), Grad(dw16.data()), Grad(db16.data()), dout.data(), Input{nullptr, res16.data()},
                                   w.data(), m32.data(), r32.data(), N, C);
            differ += vectors_differ(dx32, dx16) + vectors_differ(dw32, dw16) + vectors_differ(db32, db16);
            std::vector<float> add32(n);
            std::vector<bf16> add16(n);
            residual_forward_cpu(add32.data(), res32.data(), dout.data(), b.data(), N, C);
            residual_forward_cpu((float*)(void*)add16.data(), Input{nullptr, res16.data()}, dout.data(), b.data(), N, C);
            differ += packed_differ(add16, add32);
            compared += 3 * n + 2 * N + 2 * n + 2 * C + n;
            // the GELU: fc's fp32 sums, with the special values spread through them
            std::vector<float> fch(n);
            for (long i = 0; i < n; i++) fch[i] = rnd() * 12.0f;
            for (size_t k = 0; k < sizeof(special) / sizeof(special[0]); k++) fch[(k * 131) % n] = special[k];
            std::vector<bf16> kept(n), gelu16(n), fch_packed(n), gelu_packed(n);
            gelu_forward_bf16_cpu(gelu16.data(), kept.data(), fch.data(), n);
            std::vector<float> fch_old = fch, gelu32(n);
            round_bf16_cpu(fch_old.data(), n);
            bf16_pack_cpu(fch_packed.data(), fch_old.data(), n);
            gelu_forward_cpu(gelu32.data(), fch_old.data(), n);
            bf16_pack_cpu(gelu_packed.data(), gelu32.data(), n);
            for (long i = 0; i < n; i++) differ += (kept[i] != fch_packed[i]) + (gelu16[i] != gelu_packed[i]);
            compared += 2 * n;
            // its backward from the kept bf16 into bf16 storage against the fp32 backward from the widened
            // values, rounded in place and packed
            std::vector<float> d32 = dout, widened(n);
            std::vector<bf16> d16(n);
            bf16_widen_cpu(widened.data(), kept.data(), n);
            gelu_backward_bf16_cpu(d16.data(), kept.data(), dout.data(), n);
            gelu_backward_cpu(d32.data(), widened.data(), d32.data(), n);
            round_bf16_cpu(d32.data(), n);
            differ += packed_differ(d16, d32);
            compared += n;
        }
    });
    check(differ == 0, "layernorm_forward into bf16, gelu_forward_bf16 and gelu_backward_bf16 give the bits of the passes "
          "they replace (fp32 output packed; round, pack, GELU, pack; widened input, rounded, packed); the layernorm's forward "
          "and backward on a residual stream in bf16 storage and the residual add into it, the bits of fp32 words holding the "
          "same values: %ld of %ld values differ (3 shapes, NaN, infinities, ties, 1 and 3 threads)", differ, compared);
}

// Fused attention with a --dtype bf16 run's operands in bf16 storage against the same values in fp32 words:
// q, k and v (the layer's qkv_kept, read by the forward and the backward where it lies, widened tile by
// tile), and the backward's out (the kept atty, read for D = rowsum(dout * out)), each alone and together;
// and its dqkv written into bf16 storage (a bf16 run's: qkv's matmuls take it so) against the fp32 one packed.
// The same bits in out, lse, D and dqkv, at head sizes 16, 24, 64 and 128 (ATT_HS_MAX), T within a tile
// and across tiles (both backward passes: one task per head where the heads are many, else per tile),
// 1 and 3 threads.
static void test_bf16_attention_out() {
    long differ = 0, compared = 0;
    struct { int B, T, NH, hs; } shapes[] = {{1, 1, 1, 16}, {2, 65, 3, 24}, {1, 130, 2, 128}, {2, 33, 2, 64}, {2, 150, 4, 32}};
    on_each_path_with_1_and_3_threads([&]() {
        for (auto& k : shapes) {
            const long C = (long)k.NH * k.hs, n_qkv = (long)k.B * k.T * 3 * C, n_out = (long)k.B * k.T * C, n_l = (long)k.B * k.NH * k.T;
            uint64_t z = 71 + (uint64_t)n_out;
            std::vector<float> qkv(n_qkv), dout(n_out), out(n_out), lse(n_l), out_h(n_out), lse_h(n_l);
            for (auto& x : qkv) x = 2.0f * bf16_test_uniform(&z);
            for (auto& x : dout) x = bf16_test_uniform(&z);
            std::vector<bf16> qkv16(n_qkv), out16(n_out);
            bf16_pack_cpu(qkv16.data(), qkv.data(), n_qkv);
            round_bf16_cpu(qkv.data(), n_qkv);  // the same values in fp32 words
            attention_fused_forward_cpu(out.data(), lse.data(), Input{qkv.data(), nullptr}, k.B, k.T, k.NH, k.hs);
            attention_fused_forward_cpu(out_h.data(), lse_h.data(), Input{nullptr, qkv16.data()}, k.B, k.T, k.NH, k.hs);
            differ += vectors_differ(out, out_h) + vectors_differ(lse, lse_h);
            compared += n_out + n_l;
            bf16_pack_cpu(out16.data(), out.data(), n_out);
            round_bf16_cpu(out.data(), n_out);  // the same values in fp32 words
            std::vector<float> d32(n_l), g32(n_qkv);
            attention_fused_backward_cpu(g32.data(), d32.data(), dout.data(), Input{qkv.data(), nullptr}, Input{out.data(), nullptr},
                                         lse.data(), k.B, k.T, k.NH, k.hs);
            for (int which = 1; which < 4; which++) {  // 1: out in bf16, 2: qkv, 3: both
                std::vector<float> d16(n_l), g16(n_qkv);
                Input q_in = which & 2 ? Input{nullptr, qkv16.data()} : Input{qkv.data(), nullptr};
                Input o_in = which & 1 ? Input{nullptr, out16.data()} : Input{out.data(), nullptr};
                attention_fused_backward_cpu(g16.data(), d16.data(), dout.data(), q_in, o_in, lse.data(), k.B, k.T, k.NH, k.hs);
                differ += vectors_differ(d32, d16) + vectors_differ(g32, g16);
                compared += n_l + n_qkv;
                // dqkv written into bf16 storage: the fp32 dqkv rounded to nearest
                std::vector<bf16> gh(n_qkv);
                attention_fused_backward_cpu(gh.data(), d16.data(), dout.data(), q_in, o_in, lse.data(), k.B, k.T, k.NH, k.hs);
                differ += packed_differ(gh, g32);
                compared += n_qkv;
            }
        }
    });
    check(differ == 0, "fused attention with q, k, v and out in bf16 storage gives the bits of the same values in fp32 words, and dqkv "
          "written into bf16 storage the fp32 dqkv rounded: %ld of %ld values of out, lse, D and dqkv differ (5 shapes, head sizes 16 to "
          "128, both backward passes, 1 and 3 threads)", differ, compared);
}

// The bf16 GEMM of one ragged shape (333 x 130 x 301, B a transpose) on a rank thread with `threads`
// workers, on the path bf16_path names: what the checks of its bits across thread counts compare
static std::vector<float> bf16_gemm_on_threads(int threads) {
    const int M = 333, N = 130, K = 301;
    std::vector<bf16> A((size_t)M * K), B((size_t)K * N);
    for (size_t i = 0; i < A.size(); i++) A[i] = bf16_round(sinf((float)i));
    for (size_t i = 0; i < B.size(); i++) B[i] = bf16_round(cosf((float)i * 0.7f));
    std::vector<float> C((size_t)M * N, 0.0f);
    std::thread rank([&]() {
        cpu_pool_start(threads);
        gemm_bf16_cpu(M, N, K, A.data(), K, 1, B.data(), 1, K, C.data(), N, false, nullptr);
    });
    rank.join();
    return C;
}

static void test_bf16() {
    printf("bf16: conversions, stochastic rounding, the bf16 GEMM (%s on this CPU; the GEMM takes the %s path)\n",
           bf16_dp_supported() ? "vdpbf16ps and the fp32 path" : "the fp32 path; no AVX512-BF16 here",
           bf16_dp_used() ? "vdpbf16ps" : "fp32");
    // round to nearest even: exact values stay, halfway cases go to the even neighbour, NaN stays NaN
    {
        bool ok = true;
        for (uint32_t h = 0; h < 65536; h++) {
            float f = bf16_to_float((bf16)h);
            if (f == f && bf16_round(f) != h) ok = false;  // every bf16 but NaN converts back to itself
        }
        check(ok, "every finite and infinite bf16 rounds back to itself");
        float one_half_ulp = bf16_test_float(0x3f808000u);  // 1 + 2^-8: halfway between 1 and 1 + 2^-7
        float three_half = bf16_test_float(0x3f818000u);    // halfway between 1 + 2^-7 and 1 + 2^-6
        check(bf16_round(one_half_ulp) == 0x3f80 && bf16_round(three_half) == 0x3f82 &&
                  bf16_round(bf16_test_float(0x3f808001u)) == 0x3f81,
              "ties go to even (0x%04x, 0x%04x), above a tie up (0x%04x)", bf16_round(one_half_ulp), bf16_round(three_half),
              bf16_round(bf16_test_float(0x3f808001u)));
        // a NaN stays a NaN, whatever its sign and payload: also one whose payload is all in the 16 bits that
        // bf16 drops (kept as they are, those would leave the bits of an infinity)
        const uint32_t nans[] = {0x7fffffffu, 0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7f80ffffu, 0xffffffffu, 0x7fbf0000u};
        int nan_kept = 0, nan_value_kept = 0;
        for (uint32_t u : nans) {
            bf16 n = bf16_round(bf16_test_float(u));
            float v = bf16_value(bf16_test_float(u));
            nan_kept += (n & 0x7f80) == 0x7f80 && (n & 0x7f) != 0;
            nan_value_kept += v != v && (bf16_test_bits(v) & 0xffffu) == 0;
        }
        check(nan_kept == 7 && nan_value_kept == 7, "a NaN stays a NaN, not infinity, for 7 signs and payloads (the low 16 bits "
              "alone among them): bf16_round %d, bf16_value %d (in the high half of its word)", nan_kept, nan_value_kept);
        // bf16's largest finite value is 0x7f7f; fp32's largest (0x7f7fffff) is past its halfway point
        check(bf16_round(bf16_test_float(0x7f7fffffu)) == 0x7f80 && bf16_round(bf16_test_float(0x7f7f7fffu)) == 0x7f7f,
              "past bf16's largest value plus half its last unit rounds to infinity, below it to the largest");
    }
    // stochastic rounding: unbiased, a function of (index, step, seed) alone, and exact values exact
    {
        const float vals[3] = {1.0f + 0.3f / 128, -2.7182818f, 3.1e-3f};
        double worst = 0;
        for (float v : vals) {
            const int n = 200000;
            double sum = 0;
            for (int step = 0; step < n; step++) sum += bf16_to_float(bf16_round_stochastic(v, 12345, step, 7));
            float lo = bf16_to_float((bf16)(bf16_test_bits(v) >> 16));
            float hi = bf16_to_float((bf16)((bf16_test_bits(v) >> 16) + 1));
            double p = ((double)v - lo) / ((double)hi - lo);
            double sigma = fabs((double)hi - lo) * sqrt(p * (1 - p) / n);
            double z = fabs(sum / n - v) / sigma;
            if (!(z <= worst)) worst = z;
        }
        check(worst < 5.0, "the mean of 200000 stochastic roundings of 3 values equals the value within %.2f sigma (bound 5)", worst);
        bool exact = true, repro = true, varies = false;
        for (uint32_t h = 0; h < 65536; h += 7) {
            float f = bf16_to_float((bf16)h);
            if (f == f && !std::isinf(f) && bf16_round_stochastic(f, h, 3, 1) != h) exact = false;
        }
        bf16 first = bf16_round_stochastic(vals[0], 99, 5, 1);
        for (int i = 0; i < 100; i++) {
            if (bf16_round_stochastic(vals[0], 99, 5, 1) != first) repro = false;
            if (bf16_round_stochastic(vals[0], 99 + i, 5, 1) != first) varies = true;
        }
        check(exact && repro && varies, "a bf16 value rounds to itself (%d), the same key gives the same rounding (%d), "
              "other indices others (%d)", exact, repro, varies);
        // nothing past the finite values moves: a NaN (any payload, the all-ones one too, where adding the noise
        // would carry into the sign) stays a NaN, an infinity that infinity; fp32's largest value goes to
        // bf16's largest or to infinity, nothing else
        bool specials = true;
        for (int step = 0; step < 64; step++) {
            for (uint32_t u : {0x7fffffffu, 0xffffffffu, 0x7f800001u, 0xff80ffffu}) {
                bf16 n = bf16_round_stochastic(bf16_test_float(u), 1000 + step, step, 1);
                if ((n & 0x7f80) != 0x7f80 || (n & 0x7f) == 0) specials = false;
            }
            if (bf16_round_stochastic(INFINITY, step, step, 1) != 0x7f80 || bf16_round_stochastic(-INFINITY, step, step, 1) != 0xff80)
                specials = false;
            bf16 top = bf16_round_stochastic(bf16_test_float(0x7f7fffffu), step, step, 1);
            if (top != 0x7f7f && top != 0x7f80) specials = false;
        }
        check(specials, "stochastic rounding leaves NaNs (4 payloads) NaN and infinities infinite, 64 keys each");
        // independent noise for neighbouring keys: a value halfway between two bf16 rounds up with odds 1/2,
        // so two roundings under different keys agree half the time, and a key bit left out of the noise
        // (an index halved, a step or seed dropped) shows as agreement near 1. Pairs of neighbours in the
        // index (i and i ^ 1, i and i + 2^20), the step and the seed, n pairs each: within 5 sigma of 1/2.
        {
            const float tie = bf16_test_float(0x3f808000u);
            const long n = 100000;
            long agree[4] = {0, 0, 0, 0};
            for (long i = 0; i < n; i++) {
                const bf16 a = bf16_round_stochastic(tie, (uint64_t)i, 9, 1);
                agree[0] += a == bf16_round_stochastic(tie, (uint64_t)i ^ 1, 9, 1);
                agree[1] += a == bf16_round_stochastic(tie, (uint64_t)i + (1u << 20), 9, 1);
                agree[2] += a == bf16_round_stochastic(tie, (uint64_t)i, 10, 1);
                agree[3] += a == bf16_round_stochastic(tie, (uint64_t)i, 9, 2);
            }
            double worst = 0;
            for (long k : agree) worst = std::max(worst, fabs((double)k / n - 0.5) / (0.5 / sqrt((double)n)));
            check(worst < 5.0, "stochastic rounding's noise is independent between neighbouring indices (i, i ^ 1: %.4f agree; "
                  "i, i + 2^20: %.4f), steps (%.4f) and seeds (%.4f) of %ld ties: within %.2f sigma of 1/2 (bound 5)",
                  (double)agree[0] / n, (double)agree[1] / n, (double)agree[2] / n, (double)agree[3] / n, n, worst);
        }
    }
    {
        long wrong = 0;
        on_each_path_with_1_and_3_threads([&]() { wrong += bf16_gemm_pads_wrong(); });
        check(wrong == 0, "the GEMM's packs pad with zeros whatever their buffers held: after a GEMM of NaNs, odd and ragged K "
              "(1 to 97) in every layout, an infinity in B's last row and in A's last column: %ld elements not inf where they are, or "
              "off float64's bound "
              "(both paths, 1 and 3 threads)", wrong);
    }
    // the GEMM against float64: the model's shapes (L2C128H4 at TP=2: N = 1024 rows, the qkv, fc and
    // fcproj forwards and their backwards) and ragged edges, every layout of A and B
    {
        double worst = 0;
        bool same = true, mixed = true;
        long compared = 0;
        struct Shape { int M, N, K; bool a_t, b_t; };
        const Shape shapes[] = {{1024, 192, 128, false, true},  {1024, 256, 128, false, true}, {1024, 128, 256, false, true},
                                {1024, 128, 192, false, false}, {192, 128, 1024, true, false}, {128, 256, 1024, true, false}};
        for (const Shape& sh : shapes) bf16_gemm_case(sh.M, sh.N, sh.K, sh.a_t, sh.b_t, true, true, 11 + sh.N, &worst, &same, &mixed, &compared);
        int cases = 0;
        for (int M : {1, 3, 8, 9, 15, 17, 31})
            for (int N : {1, 5, 31, 32, 33, 70})
                for (int K : {1, 2, 7, 64, 257, 1031}) {
                    bool a_t = cases & 1, b_t = cases & 2, acc = cases & 4, bias = (cases / 8) & 1;
                    bf16_gemm_case(M, N, K, a_t, b_t, acc, bias, 1000 + cases, &worst, &same, &mixed, &compared);
                    cases++;
                }
        check(worst <= 1.0, "the bf16 GEMM against float64 at 6 model shapes and %d ragged ones (%ld elements): worst error "
              "%.3f of fp32 accumulation's bound (K+2) 2^-24 sum |a b|", cases, compared, worst);
        if (bf16_dp_supported())
            check(same, "vdpbf16ps (on bf16, and on bf16 values in fp32 words) and the fp32 path give the same bits on every element (%ld)", compared);
        else {
            printf("  skip vdpbf16ps against the fp32 path: this CPU has no AVX512-BF16\n");
            g_skipped++;
        }
        check(mixed, "A in fp32 words times B in bf16 storage (a --dtype bf16 run's matmul) gives the bits of both in bf16, on %s "
              "(%ld elements)", bf16_dp_supported() ? "vdpbf16ps and the fp32 path" : "the fp32 path", compared);
    }
    // the same bits at any thread count (a rank thread with 1, 2 and 3 workers) on each path
    {
        const Bf16Path had = bf16_path;
        std::vector<float> first;
        bool same = true;
        int runs = 0;
        for (Bf16Path path : {BF16_FMA, BF16_DP}) {
            if (path == BF16_DP && !bf16_dp_supported()) continue;
            bf16_path = path;
            for (int t = 1; t <= 3; t++) {
                std::vector<float> C = bf16_gemm_on_threads(t);
                if (first.empty()) first = C;
                else if (memcmp(first.data(), C.data(), C.size() * 4)) same = false;
                runs++;
            }
        }
        bf16_path = had;
        check(same, "the bf16 GEMM gives the same bits with 1, 2 and 3 threads, on %s (%d runs)",
              bf16_dp_supported() ? "both paths" : "the fp32 path", runs);
    }
    test_bf16_masters();
    test_bf16_weight_ops();
    test_bf16_grad_ops();
    test_bf16_logits_ops();
    test_bf16_elementwise_ops();
    test_bf16_attention_out();
}

// TP_OPENBLAS=LIB ./test_tp bench-gemm: the fp32 GEMM against OpenBLAS's sgemm from the shared library LIB
// (an OpenBLAS build's libopenblas.so, or the scipy-openblas one NumPy's wheel ships), on one core, at every
// matmul shape of a training step of the default model and of d6 (B8 T256) at TP 1 and 2. Both are called
// in this process, a shape at a time and alternately, so the clock and the caches treat them alike; best
// of 11 thread-CPU times. OpenBLAS is not a dependency of tp: it is loaded only here, when asked for.
static void bench_gemm_openblas(const char* lib) {
    void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("TP_OPENBLAS: cannot load %s: %s\n", lib, dlerror()); return; }
    // the CBLAS entry with 32-bit integers (libopenblas) or with 64-bit ones (scipy-openblas64, NumPy's)
    typedef void (*Sgemm32)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
    typedef void (*Sgemm64)(int, int, int, long, long, long, float, const float*, long, const float*, long, float, float*, long);
    typedef void (*Threads)(int);
    Sgemm32 s32 = (Sgemm32)dlsym(h, "cblas_sgemm");
    Sgemm64 s64 = s32 ? nullptr : (Sgemm64)dlsym(h, "scipy_cblas_sgemm64_");
    Threads threads = (Threads)dlsym(h, s32 ? "openblas_set_num_threads" : "scipy_openblas_set_num_threads64_");
    if (!(s32 || s64) || !threads) { printf("TP_OPENBLAS: %s has no cblas_sgemm (nor scipy_cblas_sgemm64_)\n", lib); dlclose(h); return; }
    threads(1);
    printf("\nthe fp32 GEMM against OpenBLAS (%s), one core, GFLOP/s (best of 11, called alternately); OpenBLAS's time over tp's\n", lib);
    printf("%-27s %-18s %8s %9s %6s\n", "shape", "M x N x K", "tp", "OpenBLAS", "ratio");
    struct Model { const char* name; int C, BT; };
    const Model models[] = {{"L2C128", 128, 1024}, {"d6", 384, 2048}};
    for (const Model& md : models)
        for (int P = 1; P <= 2; P++) {
            const int C = md.C, BT = md.BT;
            // (what, M, N, K, A a transpose, B a transpose): a layer's matmuls, the forward, input and weight gradient
            struct Shape { const char* what; int M, N, K; bool a_t, b_t; };
            const Shape shapes[] = {
                {"qkv fwd", BT, 3 * C / P, C, false, true}, {"attproj fwd", BT, C, C / P, false, true},
                {"fc fwd", BT, 4 * C / P, C, false, true}, {"fcproj fwd", BT, C, 4 * C / P, false, true},
                {"qkv dinp", BT, C, 3 * C / P, false, false}, {"attproj dinp", BT, C / P, C, false, false},
                {"fc dinp", BT, C, 4 * C / P, false, false}, {"fcproj dinp", BT, 4 * C / P, C, false, false},
                {"qkv dweight", 3 * C / P, C, BT, true, false}, {"attproj dweight", C, C / P, BT, true, false},
                {"fc dweight", 4 * C / P, C, BT, true, false}, {"fcproj dweight", C, 4 * C / P, BT, true, false},
            };
            for (const Shape& sh : shapes) {
                const int M = sh.M, N = sh.N, K = sh.K;
                std::vector<float> A((size_t)M * K), B((size_t)K * N), C1((size_t)M * N), C2((size_t)M * N);
                for (size_t i = 0; i < A.size(); i++) A[i] = sinf((float)i);
                for (size_t i = 0; i < B.size(); i++) B[i] = cosf((float)i);
                // row-major: A is M x K (lda K), or stored as its K x M transpose (lda M); B likewise
                const long a_rs = sh.a_t ? 1 : K, a_cs = sh.a_t ? M : 1, b_rs = sh.b_t ? 1 : N, b_cs = sh.b_t ? K : 1;
                const int ta = sh.a_t ? 112 : 111, tb = sh.b_t ? 112 : 111, lda = sh.a_t ? M : K, ldb = sh.b_t ? K : N;
                double best_tp = 1e9, best_ob = 1e9;
                for (int rep = 0; rep < 11; rep++) {
                    double t0 = bf16_thread_seconds();
                    gemm_cpu(M, N, K, A.data(), a_rs, a_cs, B.data(), b_rs, b_cs, C1.data(), N, false, nullptr);
                    double t1 = bf16_thread_seconds();
                    if (s32) s32(101, ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C2.data(), N);
                    else s64(101, ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C2.data(), N);
                    double t2 = bf16_thread_seconds();
                    best_tp = std::min(best_tp, t1 - t0);
                    best_ob = std::min(best_ob, t2 - t1);
                }
                // the same product, or the comparison means nothing (the sums' order differs past OpenBLAS's K block)
                double worst = 0;
                for (size_t i = 0; i < C1.size(); i++) worst = std::max(worst, (double)fabsf(C1[i] - C2[i]) / (1.0 + fabsf(C2[i])));
                char name[64], dims[64];
                snprintf(name, sizeof(name), "%s TP%d %s", md.name, P, sh.what);
                snprintf(dims, sizeof(dims), "%d x %d x %d", M, N, K);
                const double flop = 2.0 * M * N * K;
                printf("%-27s %-18s %8.1f %9.1f %5.2fx%s\n", name, dims, flop / best_tp * 1e-9, flop / best_ob * 1e-9,
                       best_ob / best_tp, worst > 1e-4 ? "  (products differ!)" : "");
            }
        }
    dlclose(h);
}

// ./test_tp bench-gemm: GFLOP/s of one core at the shapes of the default model (L2C128H4, B8 T128) and of
// d6 (L6 C384, B8 T256) at TP=1, forward and backward: the fp32 GEMM, the bf16 one on vdpbf16ps and on
// fp32 fmas with bf16 operands, and on vdpbf16ps with fp32 words holding bf16 values (what a training
// run's matmuls pass it: their packs are other code), and those operands on AMX (--bf16-gemm amx, where the
// CPU has it); thread CPU time, best of 5; as a share of the core's peaks, measured first
static int bench_gemm_cpu() {
    const double peak_fma = bf16_peak_fma(20000000), peak_dp = bf16_peak_dp(20000000);
    struct Shape { const char* what; int M, N, K; bool a_t, b_t; };
    const Shape shapes[] = {
        {"L2C128 qkv fwd", 1024, 384, 128, false, true}, {"L2C128 fc fwd", 1024, 512, 128, false, true},
        {"L2C128 fcproj fwd", 1024, 128, 512, false, true}, {"L2C128 fc dinp", 1024, 128, 512, false, false},
        {"L2C128 fc dweight", 512, 128, 1024, true, false}, {"d6 qkv fwd", 2048, 1152, 384, false, true},
        {"d6 fcproj fwd", 2048, 384, 1536, false, true}, {"d6 fc dweight", 1536, 384, 2048, true, false},
    };
    printf("one core: fp32 fma peak %.1f GFLOP/s, vdpbf16ps peak %.1f GFLOP/s (register-only loops); GEMMs in GFLOP/s\n"
           "(%% of the fp32 peak for fp32 and the fp32 path, of the vdpbf16ps peak for vdpbf16ps; the last, training's operands\n"
           "on vdpbf16ps over the fp32 GEMM: activations in fp32 words, the weight in bf16 storage; then the same operands on\n"
           "AMX, --bf16-gemm amx, and over the fp32 GEMM); by itself the bf16 GEMM takes %s\n",
           peak_fma, peak_dp, bf16_dp_used() ? "vdpbf16ps" : "the fp32 path");
    printf("%-20s %16s %16s %16s %18s %14s\n", "shape", "fp32", "bf16 vdpbf16ps", "bf16 fp32 path", "training's operands", "AMX");
    for (const Shape& sh : shapes) {
        const int M = sh.M, N = sh.N, K = sh.K;
        std::vector<float> Af((size_t)M * K), Bf((size_t)K * N), C((size_t)M * N);
        std::vector<bf16> A((size_t)M * K), B((size_t)K * N);
        std::vector<float> Aw((size_t)M * K), Bw((size_t)K * N);  // the same bf16 values in fp32 words
        // (B is the weight in a forward and an input gradient, bf16 storage in training; in a weight gradient
        // it is the layer's input, fp32 words)
        for (size_t i = 0; i < Af.size(); i++) Aw[i] = bf16_to_float(A[i] = bf16_round(Af[i] = sinf((float)i)));
        for (size_t i = 0; i < Bf.size(); i++) Bw[i] = bf16_to_float(B[i] = bf16_round(Bf[i] = cosf((float)i)));
        const long a_rs = sh.a_t ? 1 : K, a_cs = sh.a_t ? M : 1, b_rs = sh.b_t ? 1 : N, b_cs = sh.b_t ? K : 1;
        double best[5] = {1e9, 1e9, 1e9, 1e9, 1e9};
        for (int rep = 0; rep < 5; rep++)
            for (int which = 0; which < 5; which++) {
                if ((which == 1 || which == 3) && !bf16_dp_supported()) continue;
                if (which == 4 && !bf16_amx_supported()) continue;
                bf16_path = which == 2 ? BF16_FMA : which == 4 ? BF16_AMX : BF16_DP;
                double t0 = bf16_thread_seconds();
                if (which == 0) gemm_cpu(M, N, K, Af.data(), a_rs, a_cs, Bf.data(), b_rs, b_cs, C.data(), N, false, nullptr);
                else if (which >= 3 && sh.a_t) gemm_bf16_cpu(M, N, K, Aw.data(), a_rs, a_cs, Bw.data(), b_rs, b_cs, C.data(), N, false, nullptr);
                else if (which >= 3) gemm_bf16_cpu(M, N, K, Aw.data(), a_rs, a_cs, B.data(), b_rs, b_cs, C.data(), N, false, nullptr);
                else gemm_bf16_cpu(M, N, K, A.data(), a_rs, a_cs, B.data(), b_rs, b_cs, C.data(), N, false, nullptr);
                double t = bf16_thread_seconds() - t0;
                if (t < best[which]) best[which] = t;
            }
        bf16_path = BF16_AUTO;
        double flop = 2.0 * M * N * K;
        double g[5];
        for (int i = 0; i < 5; i++) g[i] = best[i] < 1e9 ? flop / best[i] * 1e-9 : 0;
        printf("%-20s %7.1f (%3.0f%%) %7.1f (%3.0f%%) %7.1f (%3.0f%%) %7.1f (%3.0f%%) %4.2fx %7.1f %5.2fx\n", sh.what, g[0],
               g[0] / peak_fma * 100, g[1], peak_dp > 0 ? g[1] / peak_dp * 100 : 0.0, g[2], g[2] / peak_fma * 100, g[3],
               peak_dp > 0 ? g[3] / peak_dp * 100 : 0.0, g[0] > 0 ? g[3] / g[0] : 0.0, g[4], g[0] > 0 ? g[4] / g[0] : 0.0);
    }
    if (const char* lib = getenv("TP_OPENBLAS")) bench_gemm_openblas(lib);
    else printf("(TP_OPENBLAS=path/to/libopenblas.so adds the fp32 GEMM against OpenBLAS's sgemm at every shape of a step)\n");
    return 0;
}

// ----------------------------------------------------------------------------
// llm.c's bf16 model files (version 5): what its GPU trainer saves, read by -e

// Writes full as an llm.c version-5 file: the version-3 header with version 5, then every parameter rounded
// to bf16 (to nearest even, as llm.c's writers round). claim_extra: bytes appended past the tensors (< 0:
// that many cut from the end), to make a damaged copy.
static void write_model_bf16(const std::string& path, const GPTConfig* c, const std::vector<float>& full, long claim_extra = 0) {
    int h[256] = {0};
    h[0] = 20240326; h[1] = 5; h[2] = c->maxT; h[3] = c->V; h[4] = c->L; h[5] = c->NH; h[6] = c->C; h[7] = c->Vp;
    std::vector<bf16> b(full.size());
    for (size_t i = 0; i < full.size(); i++) b[i] = bf16_round(full[i]);
    FILE* f = fopen(path.c_str(), "wb");
    fwrite(h, sizeof(h), 1, f);
    fwrite(b.data(), sizeof(bf16), claim_extra < 0 ? b.size() + claim_extra / 2 : b.size(), f);
    for (long i = 0; i < claim_extra; i++) fputc(0, f);
    fclose(f);
}

static void test_bf16_checkpoint() {
    printf("bf16 model files: llm.c's version 5 read exactly, trained as the fp32 file of the same numbers, damaged ones refused\n");
    std::string d = tmpdir();
    GPTConfig cfg = make_config(2, 4, 32, 256, 64);
    std::vector<float> init = init_weights(&cfg, 23);
    write_model_bf16(d + "/v5.bin", &cfg, init);
    // the load: every weight is the fp32 of its bf16 (top 16 bits), and the header is the file's
    GPTConfig got = {};
    std::vector<float> loaded;
    int version = 0;
    model_read((d + "/v5.bin").c_str(), &got, &loaded, &version);
    long wrong = 0, moved = 0, low_bits = 0;
    for (size_t i = 0; i < init.size() && i < loaded.size(); i++) {
        wrong += bf16_test_bits(loaded[i]) != bf16_test_bits(bf16_to_float(bf16_round(init[i])));
        moved += loaded[i] != init[i];
        low_bits += (bf16_test_bits(loaded[i]) & 0xffffu) != 0;
    }
    check(version == 5 && memcmp(&got, &cfg, sizeof(cfg)) == 0 && loaded.size() == init.size() && wrong == 0 && low_bits == 0,
          "version %d, the header as written, %zu of %zu parameters: %ld differ from their bf16, %ld with low bits set", version,
          loaded.size(), init.size(), wrong, low_bits);
    check(moved > (long)init.size() / 2, "the file is bf16 indeed: %ld of %zu weights differ from the fp32 ones rounded into it", moved, init.size());
    struct stat st;
    long size = stat((d + "/v5.bin").c_str(), &st) == 0 ? (long)st.st_size : -1;
    check(size == 1024 + 2 * (long)init.size(), "file size %ld = header + 2 x %zu", size, init.size());

    // a run from it computes what a run from the version-3 file of the same (widened) numbers computes
    model_write((d + "/v3.bin").c_str(), &cfg, loaded.data());
    write_tokens(d + "/train.bin", random_tokens(4000, 256, 5));
    write_tokens(d + "/val.bin", random_tokens(2000, 256, 6));
    std::string run = " -i " + d + "/train.bin -j " + d + "/val.bin -b 2 -t 32 -x 4 -v 2 -m 2 -g 8 --threads 1 --tp 2";
    // (the v5 file trains in bf16 unless --dtype says otherwise; the v3 file in fp32 unless it does; --dtype
    // auto is the default, given as the test harness pins fp32 where a command does not say)
    for (const char* dtype : {"fp32", "bf16"}) {
        std::string out5, err5, out3, err3;
        bool bf = !strcmp(dtype, "bf16");
        int rc5 = run_cmd("-e " + d + "/v5.bin" + run + (bf ? " --dtype auto" : " --dtype fp32"), &out5, &err5);
        int rc3 = run_cmd("-e " + d + "/v3.bin" + run + (bf ? " --dtype bf16" : " --dtype auto"), &out3, &err3);
        std::vector<float> l5 = grep_floats(out5, "| loss "), l3 = grep_floats(out3, "| loss ");
        std::vector<float> v5 = grep_floats(out5, "val loss "), v3 = grep_floats(out3, "val loss ");
        check(rc5 == 0 && rc3 == 0 && l5.size() == 4 && l5 == l3 && v5.size() == 3 && v5 == v3,
              "-e v5.bin%s: exit %d, %zu step and %zu val losses, equal to those from the version-3 file%s (exit %d)%s%s",
              bf ? "" : " --dtype fp32", rc5, l5.size(), v5.size(), bf ? " with --dtype bf16" : "", rc3, err5.empty() ? "" : ": ",
              err5.c_str());
        std::string line = first_line_with(out5, "bf16 weights"), line3 = first_line_with(out3, "fp32 weights");
        const char* says = bf ? "computing in bf16 as the file is" : "--dtype fp32: computing in fp32";
        const char* says3 = bf ? "--dtype bf16: computing in bf16" : "computing in fp32 as the file is";
        check(line.find("llm.c version 5") != std::string::npos && line.find(says) != std::string::npos &&
                  line3.find("llm.c version 3") != std::string::npos && line3.find(says3) != std::string::npos &&
                  out3.find("bf16 weights") == std::string::npos && out5.find("fp32 weights") == std::string::npos,
              "each run says what it read and how it computes: %s | %s", line.c_str(), line3.c_str());
    }

    // damaged or foreign: one line, exit 1
    write_model_bf16(d + "/v5_short.bin", &cfg, init, -100);
    write_model_bf16(d + "/v5_long.bin", &cfg, init, 2);
    std::vector<char> v3bytes = slurp_bytes(d + "/v3.bin");
    v3bytes[4] = 5;  // an fp32 file labelled bf16: twice the bytes its header asks for
    FILE* f = fopen((d + "/v3_as_v5.bin").c_str(), "wb");
    fwrite(v3bytes.data(), 1, v3bytes.size(), f);
    fclose(f);
    v3bytes[4] = 4;
    f = fopen((d + "/v4.bin").c_str(), "wb");
    fwrite(v3bytes.data(), 1, v3bytes.size(), f);
    fclose(f);
    // a NaN in a bf16 file and an infinity in an fp32 one, each named where it is: qkvw's layer 1, row 5, column 7
    ShardPlan whole;
    shard_plan_init(&whole, &cfg, 1, 0);
    long at = 0;
    for (int i = 0; i < 4; i++) at += shard_full_size(&whole.t[i]);  // wte, wpe, ln1w, ln1b
    at += (long)3 * cfg.C * cfg.C + 5L * cfg.C + 7;
    std::vector<char> v5bytes = slurp_bytes(d + "/v5.bin");
    const uint16_t nan16 = 0x7fc1;
    memcpy(v5bytes.data() + 1024 + 2 * at, &nan16, 2);
    f = fopen((d + "/v5_nan.bin").c_str(), "wb");
    fwrite(v5bytes.data(), 1, v5bytes.size(), f);
    fclose(f);
    v3bytes[4] = 3;
    const float inf32 = -INFINITY;
    memcpy(v3bytes.data() + 1024 + 4 * at, &inf32, 4);
    f = fopen((d + "/v3_inf.bin").c_str(), "wb");
    fwrite(v3bytes.data(), 1, v3bytes.size(), f);
    fclose(f);
    std::string where = "at qkvw, layer 1, row 5, column 7 (parameter " + std::to_string(at) + ")";
    std::string cut = "is truncated: " + std::to_string(init.size() - 50) + " of " + std::to_string(init.size()) + " parameters present";
    struct { const char* what; const char* file; std::string expect; } bad[] = {
        {"a truncated bf16 file (100 bytes short)", "v5_short.bin", cut},
        {"a bf16 file with bytes past its tensors", "v5_long.bin", "longer than its header says"},
        {"an fp32 file labelled version 5", "v3_as_v5.bin", "longer than its header says"},
        {"version 4", "v4.bin", "has version 4; tp reads llm.c's fp32 version 3 and bf16 version 5"},
        {"a NaN among a bf16 file's weights", "v5_nan.bin", "holds a non-finite weight (nan) " + where},
        {"an infinity among an fp32 file's weights", "v3_inf.bin", "holds a non-finite weight (-inf) " + where},
    };
    for (auto& b : bad) {
        std::string out, err;
        int rc = run_cmd(std::string("-e ") + d + "/" + b.file + run, &out, &err);
        int lines = (int)std::count(err.begin(), err.end(), '\n');
        check(rc == 1 && lines == 1 && err.find(b.expect) != std::string::npos, "%s: exit %d, %d line: %s", b.what, rc, lines,
              err.substr(0, err.find('\n')).c_str());
    }
}

// ----------------------------------------------------------------------------
// --dtype bf16 training: bf16 weights (stochastically rounded from fp32 masters) and bf16 matmul operands

// the largest |difference| of two loss curves, NaN and a length mismatch count as infinite
static double loss_gap(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size() || a.empty()) return INFINITY;
    double w = 0;
    for (size_t i = 0; i < a.size(); i++) w = worse(w, fabs((double)a[i] - b[i]));
    return w;
}

// How far two runs from the same init ended apart, against how far they went: per tensor of the full model,
// ||a - b|| / ||b - init||; the worst tensor. The key bias (the middle third of qkvb) is left out: softmax
// does not change when every score of a row moves by q . bk, so its true gradient is zero and what AdamW
// applies to it is rounding noise normalised to the learning rate, which any other order of the sums
// draws anew. of: every tensor, or only the matrices (wte and the layers' weights) or only the vectors (wpe,
// the biases, the layernorms).
enum DriftOf { DRIFT_ALL, DRIFT_MATRICES, DRIFT_VECTORS };
static double worst_tensor_drift(const GPTConfig* cfg, const std::vector<float>& a, const std::vector<float>& b,
                                 const std::vector<float>& init, const char** name, DriftOf of = DRIFT_ALL) {
    ShardPlan s;
    shard_plan_init(&s, cfg, 1, 0);
    return worst_tensor(cfg, [&](int i, long off, long n) {
        if (of != DRIFT_ALL && param_is_matrix(i) != (of == DRIFT_MATRICES)) return 0.0;
        double diff = 0, moved = 0;
        long per_layer = s.t[i].rows * s.t[i].cols;
        for (long j = off; j < off + n; j++) {
            long row = (j - off) % per_layer / s.t[i].cols;
            if (i == 5 && row >= cfg->C && row < 2 * cfg->C) continue;  // qkvb's k third
            diff += ((double)a[j] - b[j]) * ((double)a[j] - b[j]);
            moved += ((double)b[j] - init[j]) * ((double)b[j] - init[j]);
        }
        return moved > 0 ? sqrt(diff / moved) : diff > 0 ? INFINITY : 0.0;
    }, name);
}

// In which precision the row-parallel partial sums travel (attproj and fcproj forward: each rank's product
// over its K slice, all-reduced). tp sums them in fp32; moving them as bf16 halves the bytes, but rounds
// each partial and each hop's sum to bf16, an error TP=1 never makes. Measured at d6's fcproj (B8 T256:
// 2048 x 1536 . 1536 x 384) on bf16 operands, each result against TP=1's (the product over the whole K),
// per element over sum_k |x w|: fp32 sums stay at fp32's few ulps, bf16 ones at bf16's 2^-9.
static void test_bf16_partial_sums() {
    const int N = 2048, K = 1536, OC = 384;
    std::vector<float> x((size_t)N * K), w((size_t)OC * K), one((size_t)N * OC), scale((size_t)N * OC, 0.0f);
    for (size_t i = 0; i < x.size(); i++) x[i] = bf16_to_float(bf16_round(sinf((float)i * 0.37f) * 0.5f));
    for (size_t i = 0; i < w.size(); i++) w[i] = bf16_to_float(bf16_round(cosf((float)i * 0.61f) * 0.02f));
    matmul_forward_cpu(one.data(), x.data(), w.data(), nullptr, N, K, OC, true);  // TP=1
    std::vector<float> ax(x.size()), aw(w.size());
    for (size_t i = 0; i < x.size(); i++) ax[i] = fabsf(x[i]);
    for (size_t i = 0; i < w.size(); i++) aw[i] = fabsf(w[i]);
    matmul_forward_cpu(scale.data(), ax.data(), aw.data(), nullptr, N, K, OC);  // sum_k |x w|
    for (int P : {2, 4}) {
        const int Kl = K / P;
        std::vector<float> part((size_t)N * OC), sum32((size_t)N * OC, 0.0f), sum16((size_t)N * OC, 0.0f);
        for (int r = 0; r < P; r++) {
            // rank r's partial: x[:, r Kl .. (r+1) Kl) . w[:, same]^T, through gemm_cpu's strides
            gemm_bf16_cpu(N, OC, Kl, x.data() + (long)r * Kl, (long)K, 1L, w.data() + (long)r * Kl, 1L, (long)K, part.data(), OC, false, nullptr);
            for (size_t i = 0; i < part.size(); i++) {
                sum32[i] += part[i];  // fp32: the sum tp's all-reduce makes, in rank order
                // bf16 on the wire: the partial rounded, and the running sum rounded at each hop
                float p16 = bf16_to_float(bf16_round(part[i]));
                sum16[i] = r == 0 ? p16 : bf16_to_float(bf16_round(sum16[i] + p16));
            }
        }
        // worst per element over sum_k |x w| (the scale an fp32 sum's error bound has), and rms over rms
        double e32 = 0, e16 = 0, q32 = 0, q16 = 0, q1 = 0;
        for (size_t i = 0; i < one.size(); i++) {
            double sc = scale[i] > 0 ? scale[i] : 1e-30, d32 = (double)sum32[i] - one[i], d16 = (double)sum16[i] - one[i];
            e32 = worse(e32, fabs(d32) / sc);
            e16 = worse(e16, fabs(d16) / sc);
            q32 += d32 * d32, q16 += d16 * d16, q1 += (double)one[i] * one[i];
        }
        q32 = sqrt(q32 / q1), q16 = sqrt(q16 / q1);
        const double ring = 2.0 * (P - 1) / P * N * OC;  // values each rank sends in a ring all-reduce
        printf("  TP=%d partial sums: fp32 %.2f MB sent per rank, error against TP=1 %.3g worst / sum|x w|, %.3g rms / rms;"
               " bf16 %.2f MB, %.3g worst, %.3g rms (%.0fx)\n", P, ring * 4 / 1e6, e32, q32, ring * 2 / 1e6, e16, q16, q32 > 0 ? q16 / q32 : 0.0);
        check_le(e32, 64 * ldexp(1.0, -24), "TP=%d fcproj partial sums in fp32: worst error against TP=1 / sum|x w|", P);
        check(q16 > 1000 * q32, "TP=%d the same moved as bf16: rms error %.3g, %.0fx fp32's %.3g", P, q16, q32 > 0 ? q16 / q32 : 0.0, q32);
    }
}

// In which precision the gradient sums over the replicas travel (DP's all-reduce or ZeRO-1's reduce-scatter,
// the matrices' gradients in bf16 storage). tp widens them and sums fp32 words, rounding each sum once; moving
// them as bf16 would halve the bytes but round the running sum at every hop of the ring. Measured on real
// gradients: the step-0 gradients of D batches (one replica's each) of a small model in bf16, the matrices'
// elements, each sum against the exact one (double): rms error over rms, and the share of elements where
// the two ways give other bf16. (With 2 replicas there is one add, so bf16 on the wire rounds once too: the
// same bits for half the bytes; tp moves fp32 words anyway, one code path for every D.)
static void test_bf16_grad_sums() {
    GPTConfig cfg = make_config(2, 4, 64, 256, 32);
    std::vector<float> init = init_weights(&cfg, 11);
    const int B = 4, T = 32, D = 8;
    std::vector<std::vector<float>> g(D);
    for (int d = 0; d < D; d++) {
        TpResult r;
        run_tp(&cfg, init, 1, 1, random_tokens((long)B * T + 1, cfg.V, 500 + d), B, T, 1e-3f, 1.0f, &r, false, 0, true, true);
        g[d] = r.grads_full;
    }
    std::vector<char> matrix(g[0].size(), 0);  // the elements of wte and the layers' four matrices
    ShardPlan plan;
    shard_plan_init(&plan, &cfg, 1, 0);
    for (long i = 0, off = 0; i < NUM_PARAM_TENSORS; off += shard_full_size(&plan.t[i]), i++)
        if (param_is_matrix((int)i)) std::fill(matrix.begin() + off, matrix.begin() + off + shard_full_size(&plan.t[i]), 1);
    for (int Dn : {2, 4, 8}) {
        double q32 = 0, q16 = 0, q = 0;
        long n = 0, other = 0, not_bf16 = 0;
        for (size_t i = 0; i < g[0].size(); i++) {
            if (!matrix[i]) continue;
            double exact = 0;
            float sum32 = 0.0f, sum16 = 0.0f;
            for (int d = 0; d < Dn; d++) {
                not_bf16 += bf16_to_float(bf16_round(g[d][i])) != g[d][i];  // (each replica's is bf16 already)
                exact += g[d][i];
                sum32 += g[d][i];                                                             // tp: fp32 words
                sum16 = d == 0 ? g[d][i] : bf16_to_float(bf16_round(sum16 + g[d][i]));       // bf16 at each hop
            }
            float once = bf16_to_float(bf16_round(sum32));  // tp rounds the fp32 sum once
            q32 += (once - exact) * (once - exact), q16 += (sum16 - exact) * (sum16 - exact), q += exact * exact;
            other += once != sum16;
            n++;
        }
        q32 = sqrt(q32 / q), q16 = sqrt(q16 / q);
        printf("  DP=%d gradient sums (%ld matrix elements): fp32 words, rounded once: %.3g rms / rms, %.2f MB a replica sends per "
               "million weights; bf16 on the wire: %.3g (%.2fx), %.2f MB; %.1f%% of the sums differ\n", Dn, n, q32,
               2.0 * (Dn - 1) / Dn * 4, q16, q32 > 0 ? q16 / q32 : 0.0, 2.0 * (Dn - 1) / Dn * 2, 100.0 * other / n);
        // (two replicas: one add, so one rounding either way, the same bits; more: a rounding per hop)
        check(not_bf16 == 0 && q32 < ldexp(1.0, -8) && (Dn == 2 ? other == 0 : q16 > q32),
              "DP=%d bf16 gradients summed in fp32 and rounded once: rms error %.3g (one rounding: under 2^-8); bf16 at each hop %.3g, %s "
              "(%ld replica values not bf16)", Dn, q32, q16, Dn == 2 ? "the same bits at 2 replicas" : "more", not_bf16);
    }
}


// How many of the bf16 weights a run_tp bf16 run's last forward computed from are not
// bf16_round_stochastic of their masters keyed on the full index, AdamW's step count then and the run's seed:
// the step and the seed as gpt.cu passes them (all of them if nothing was captured)
static long bf16_weights_unlike_masters(const TpResult& res) {
    long wrong = res.masters_last.empty() ? 1 : 0;
    for (size_t i = 0; i < res.masters_last.size(); i++)
        wrong += bf16_test_bits(res.wbf_last[i]) !=
                 bf16_test_bits(bf16_to_float(bf16_round_stochastic(res.masters_last[i], i, (uint32_t)res.t_last, res.bf16_seed)));
    return wrong;
}

// --bf16-gemm amx (common/bf16.h): Intel's tile unit rounds its sums its own way, so it is tested against
// float64 within fp32 accumulation's bound, not against the other paths' bits; and for its own bits: the
// same with 1, 2 and 3 threads and on a rerun, the same from bf16 storage as from fp32 words, and a bf16 C
// the fp32 C's sums rounded as store_c rounds them
static void test_bf16_amx_gemm() {
    if (!bf16_amx_supported()) {
        printf("  skip the AMX GEMM (--bf16-gemm amx): this CPU has no AMX-BF16, or the kernel does not let tp use it\n");
        g_skipped++;
        return;
    }
    const Bf16Path had = bf16_path;
    bf16_path = BF16_AMX;
    {
        long wrong = 0;
        on_a_rank_with_1_and_3_threads([&]() { wrong += bf16_gemm_pads_wrong(); });
        check(wrong == 0, "AMX: the packs pad with zeros whatever their buffers held (a GEMM of NaNs first; odd and ragged K, "
              "every layout, an infinity in B's last row and in A's last column; 1 and 3 threads): %ld elements wrong", wrong);
    }
    double worst = 0;
    long compared = 0, unlike_words = 0, unlike_c16 = 0, unlike_chain = 0;
    int cases = 0;
    struct Shape { int M, N, K; bool a_t, b_t; };
    std::vector<Shape> shapes = {{1024, 192, 128, false, true},  {1024, 256, 128, false, true}, {1024, 128, 256, false, true},
                                 {1024, 128, 192, false, false}, {192, 128, 1024, true, false}, {128, 256, 1024, true, false},
                                 {2048, 1152, 384, false, true}, {1536, 384, 2048, true, false}};
    // ragged: a tile (16) and a block (32) and one either side, K around a tile's 32 and odd
    for (int M : {1, 15, 16, 17, 33, 50})
        for (int N : {1, 16, 31, 33, 70})
            for (int K : {0, 1, 2, 31, 32, 33, 65, 257}) shapes.push_back({M, N, K, (cases & 1) != 0, (cases++ & 2) != 0});
    int index = 0;
    for (const Shape& sh : shapes) {
        const int M = sh.M, N = sh.N, K = sh.K;
        const bool accumulate = index & 4, with_bias = index & 8;
        uint64_t z = 500 + index++;
        std::vector<bf16> A((size_t)M * K), B((size_t)K * N);
        std::vector<float> bias(N), C0((size_t)M * N);
        for (auto& x : A) x = bf16_round(bf16_test_uniform(&z) * 4.0f);
        for (auto& x : B) x = bf16_round(bf16_test_uniform(&z) * 4.0f);
        for (auto& x : bias) x = bf16_test_uniform(&z);
        for (auto& x : C0) x = bf16_test_uniform(&z);
        const long a_rs = sh.a_t ? 1 : K, a_cs = sh.a_t ? M : 1, b_rs = sh.b_t ? 1 : N, b_cs = sh.b_t ? K : 1;
        const float* bp = with_bias ? bias.data() : nullptr;
        std::vector<double> ref, scale;
        if ((long)M * N * K <= 40000000L) gemm_bf16_ref(M, N, K, A.data(), a_rs, a_cs, B.data(), b_rs, b_cs, &ref, &scale);
        std::vector<float> C = C0, Cw = C0, Cchain = C0, Cfresh((size_t)M * N);
        gemm_bf16_cpu(M, N, K, A.data(), a_rs, a_cs, B.data(), b_rs, b_cs, C.data(), N, accumulate, bp);
        // the same values in fp32 words (a training run's activations)
        std::vector<float> Aw(A.size()), Bw(B.size());
        for (size_t i = 0; i < A.size(); i++) Aw[i] = bf16_to_float(A[i]);
        for (size_t i = 0; i < B.size(); i++) Bw[i] = bf16_to_float(B[i]);
        gemm_bf16_cpu(M, N, K, Aw.data(), a_rs, a_cs, Bw.data(), b_rs, b_cs, Cw.data(), N, accumulate, bp);
        // C in bf16 storage: the fresh fp32 sums (plus bias) added to C widened, rounded once
        gemm_bf16_cpu(M, N, K, A.data(), a_rs, a_cs, B.data(), b_rs, b_cs, Cfresh.data(), N, false, bp);
        std::vector<bf16> C16(C0.size());
        for (size_t i = 0; i < C0.size(); i++) C16[i] = bf16_round(C0[i]);
        std::vector<bf16> C16in = C16;
        gemm_bf16_cpu(M, N, K, A.data(), a_rs, a_cs, B.data(), b_rs, b_cs, C16.data(), N, accumulate, bp);
        bf16_path = BF16_FMA;  // the fma chain, for the count of sums AMX rounds otherwise (said, not bounded)
        gemm_bf16_cpu(M, N, K, A.data(), a_rs, a_cs, B.data(), b_rs, b_cs, Cchain.data(), N, accumulate, bp);
        bf16_path = BF16_AMX;
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                const size_t i = (size_t)m * N + n;
                if (!ref.empty()) {
                    double want = ref[i] + (with_bias ? bias[n] : 0.0) + (accumulate ? C0[i] : 0.0);
                    double bound = (K + 2) * ldexp(1.0, -24) * (scale[i] + fabs(want)) + ldexp(1.0, -24) * 2 * (fabs(C0[i]) + fabs(bias[n]));
                    double err = fabs((double)C[i] - want) / (bound > 0 ? bound : 1e-30);
                    if (!(err <= worst)) worst = err;  // a NaN becomes the worst
                }
                unlike_words += bf16_test_bits(C[i]) != bf16_test_bits(Cw[i]);
                bf16 want16 = bf16_round(accumulate ? bf16_to_float(C16in[i]) + Cfresh[i] : Cfresh[i]);
                unlike_c16 += C16[i] != want16;
                unlike_chain += bf16_test_bits(C[i]) != bf16_test_bits(Cchain[i]);
                compared++;
            }
    }
    check(worst <= 1.0, "AMX: the bf16 GEMM against float64 at 8 model shapes and %d ragged ones (%ld elements): worst error %.3f of "
          "fp32 accumulation's bound (K+2) 2^-24 sum |a b|", cases, compared, worst);
    check(unlike_words == 0 && unlike_c16 == 0, "AMX: bf16 storage and fp32 words holding the same values give the same bits (%ld of "
          "%ld differ); C in bf16 storage is the fp32 sums rounded once (%ld differ)", unlike_words, compared, unlike_c16);
    printf("  (AMX rounds its sums otherwise than the fma chain of the other two paths: %ld of these %ld elements differ from it)\n",
           unlike_chain, compared);
    // the same bits with 1, 2 and 3 threads, and run again
    {
        std::vector<float> first;
        long differ = 0;
        for (int t : {1, 2, 3, 1}) {
            std::vector<float> C = bf16_gemm_on_threads(t);
            if (first.empty()) first = C;
            else differ += vectors_differ(first, C);
        }
        check(differ == 0, "AMX: the same bits with 1, 2 and 3 threads and on a rerun (%ld elements differ)", differ);
    }
    bf16_path = had;
}

// The model, weights and tokens of the bf16 training checks: L2 NH4 C64, V 256, B4 T32, 40 steps; data:
// random tokens; learn: something to learn, a random phrase of 23 tokens over and over, so that the loss
// falls (5.5 to ~0.1)
struct Bf16Train {
    GPTConfig cfg;
    int B, T, steps;
    std::vector<float> init;
    std::vector<int> data, learn;
};
static Bf16Train bf16_train_setup() {
    Bf16Train su;
    su.cfg = make_config(2, 4, 64, 256, 32);
    su.B = 4, su.T = 32, su.steps = 40;
    su.init = init_weights(&su.cfg, 7);
    su.data = random_tokens((long)su.steps * su.B * su.T + 1, su.cfg.V, 99);
    std::vector<int> phrase = random_tokens(23, su.cfg.V, 41);
    su.learn.resize(su.data.size());
    for (size_t i = 0; i < su.learn.size(); i++) su.learn[i] = phrase[i % 23];
    return su;
}

// One bf16 grid (P ranks, SP, -r) against TP=1 in bf16 from the same weights and data: the step-0 loss, the
// losses over the steps, the step-0 gradients and the weights after them, within the bounds test_bf16_train
// gives its reasons for, and the replicated tensors bit-identical across ranks. The grid's run is left in
// *res for the caller's own checks; what: its label.
static void bf16_grid_against_tp1(const GPTConfig* cfg, const std::vector<float>& init, const std::vector<int>& data, int B, int T,
                                  int steps, int P, bool sp, int recompute, const TpResult& one, const char* what, TpResult* res) {
    run_tp(cfg, init, P, steps, data, B, T, 1e-3f, 1.0f, res, sp, recompute, true, true);
    check_le(fabs(res->losses[0] - one.losses[0]) / fabs(one.losses[0]), 1e-4, "%-18s step-0 loss %.7f vs TP=1's %.7f: rel err", what,
             res->losses[0], one.losses[0]);
    double lw = 0;
    for (int k = 0; k < steps; k++) lw = worse(lw, fabs((double)res->losses[k] - one.losses[k]) / fabs(one.losses[k]));
    check_le(lw, 1e-3, "%-18s losses over %d steps against TP=1's: worst rel err", what, steps);
    // (each worst first: its name is set by the call)
    const char* name;
    double gerr = worst_tensor_err(cfg, res->grads_full, one.grads_full, &name);
    check_le(gerr, 1e-2, "%-18s step-0 gradients against TP=1's: worst tensor %s, rel err", what, name);
    // The weights: AdamW moves each weight by about the learning rate a step whatever its gradient's size, so
    // where a gradient's sum over the batch nearly cancels (a bias, a layernorm's vector), the flip of one
    // operand by a bf16 unit can turn the sign of its steps, and in a vector of 64 one such element moves
    // the whole tensor's ratio. Measured over 32 seeds of the weights and the data, these 4 grids and both
    // bits (the fma chain's and AMX's), 256 runs, with the residual stream, q, k and v in bf16, as now: the
    // worst matrix of a run at most 0.0249 (wte, in one seed's four grids on the fma bits; the next worst
    // 0.0112, median 0.0045), the worst vector at most 0.049 (attprojb, the same seed; median 0.0037). The
    // bounds are about twice those. (The residual stream in fp32, the same 256 runs: 0.0108 and 0.046, medians
    // 0.0046 and 0.0037, and 40 runs against 24 with a tensor past 0.01.)
    double drift = worst_tensor_drift(cfg, res->params_full, one.params_full, init, &name, DRIFT_MATRICES);
    check_le(drift, 5e-2, "%-18s matrices after %d steps against TP=1's, per tensor against how far they moved: worst %s", what,
             steps, name);
    drift = worst_tensor_drift(cfg, res->params_full, one.params_full, init, &name, DRIFT_VECTORS);
    check_le(drift, 1e-1, "%-18s vectors after %d steps against TP=1's, per tensor against how far they moved (key bias aside): "
             "worst %s", what, steps, name);
    long mism_g, mism_p;
    replicated_mismatch(cfg, P, *res, &mism_g, &mism_p);
    check_le(mism_g + mism_p, 0, "%-18s replicated tensors differing in bits across ranks (%ld grads, %ld weights)", what, mism_g, mism_p);
}

// Training with --bf16-gemm amx: against fp32 and TP=P against TP=1 within the bounds the other two paths
// meet (test_bf16_train, which says why each bound is what it is), replicated tensors and replicas
// bit-identical, a rerun the same bits; from the command line a resume bit-exact, 1 and 2 threads the same.
static void test_bf16_amx_train() {
    if (!bf16_amx_supported() || g_device != DEV_CPU) {
        printf("  skip training on AMX: %s\n", g_device != DEV_CPU ? "a CPU path" : "this CPU has no AMX-BF16 (or may not use it)");
        g_skipped++;
        return;
    }
    const Bf16Path had = bf16_path;
    Bf16Train su = bf16_train_setup();
    const GPTConfig cfg = su.cfg;
    const int B = su.B, T = su.T, steps = su.steps;
    const std::vector<float>& init = su.init;
    const std::vector<int>&data = su.data, &learn = su.learn;
    const char* name;
    // bf16 against fp32 over 40 steps: three single-rank runs whose checks are numbers, not threads, so under
    // TSan (16 of the group's 35 s there) they are left to make test; the TP grids below put the same GEMM on
    // the ranks' and the pool's threads
    if (under_tsan()) {
        printf("  skip AMX against fp32 over %d steps under TSan: it checks numbers, not threads (make test runs it)\n", steps);
        g_skipped++;
    } else {
        TpResult f32, amx, chain;
        run_tp(&cfg, init, 1, steps, learn, B, T, 3e-3f, 1.0f, &f32);
        bf16_path = BF16_FMA;
        run_tp(&cfg, init, 1, steps, learn, B, T, 3e-3f, 1.0f, &chain, false, 0, true, true);
        bf16_path = BF16_AMX;
        run_tp(&cfg, init, 1, steps, learn, B, T, 3e-3f, 1.0f, &amx, false, 0, true, true);
        check_le(loss_gap(amx.losses, f32.losses), 0.05, "AMX: L2 NH4 C64, B%d T%d, %d steps: bf16 losses against fp32's (%.4f to "
                 "%.4f), largest difference", B, T, steps, f32.losses.front(), f32.losses.back());
        check(vectors_differ(amx.losses, chain.losses) > 0, "AMX computes other bits than the fma chain (%ld of %zu losses differ; "
              "largest difference %.3g)", vectors_differ(amx.losses, chain.losses), chain.losses.size(), loss_gap(amx.losses, chain.losses));
        double ge = worst_tensor_err(&cfg, amx.grads_full, f32.grads_full, &name);
        check_le(ge, 5e-2, "AMX: step-0 gradients, bf16 against fp32: worst tensor %s, rel err", name);
        double we = worst_tensor_drift(&cfg, amx.params_full, f32.params_full, init, &name);
        check_le(we, 0.25, "AMX: weights after %d steps, bf16 against fp32, per tensor against how far they moved: worst %s", steps, name);
    }

    int steps_tp = 10;
    TpResult one, again;
    run_tp(&cfg, init, 1, steps_tp, data, B, T, 1e-3f, 1.0f, &one, false, 0, true, true);
    run_tp(&cfg, init, 1, steps_tp, data, B, T, 1e-3f, 1.0f, &again, false, 0, true, true);
    long rerun = vectors_differ(one.losses, again.losses) + vectors_differ(one.grads_full, again.grads_full) +
                 vectors_differ(one.params_full, again.params_full);
    check(rerun == 0, "AMX: TP=1 run again: %ld losses, gradients and weights differ in bits", rerun);
    struct { int P; bool sp; int recompute; } grids[] = {{2, false, 0}, {4, false, 0}, {2, true, 0}, {4, true, 2}};
    for (auto& g : grids) {
        TpResult res;
        char what[48];
        snprintf(what, sizeof(what), "AMX TP=%d%s%s", g.P, g.sp ? " SP" : "", g.recompute ? " -r 2" : "");
        bf16_grid_against_tp1(&cfg, init, data, B, T, steps_tp, g.P, g.sp, g.recompute, one, what, &res);
    }
    GPTConfig small = make_config(2, 4, 32, 200, 32);
    std::vector<float> sinit = init_weights(&small, 7);
    std::vector<int> sdata = random_tokens(10L * 8 * 2 * 16 + 1, small.V, 99);
    GridResult rep;
    run_grid(&small, sinit, 2, 2, 1, 1, 10, sdata, 2, 16, &rep, false, 0, 1, PP_1F1B, DTYPE_BF16);
    check(rep.mismatches == 0 && rep.distinct == 10, "AMX (P 2, D 2, -z 1): %ld of %ld weight checksums differ from replica 0's, "
          "%ld distinct in 10 steps", rep.mismatches, rep.compared, rep.distinct);
    bf16_path = had;

    // the command line: said at the start; 1 and 2 threads the same; stopped and resumed with it, bit-exact
    std::string d = tmpdir() + "/amx";  // (amx_full, amx_half: the scratch folder is the process's, other groups use it too)
    std::string base = "-e L2C64H4 -b 4 -t 32 -v 0 -g 0 --tp 2 --dtype bf16 --bf16-gemm amx ";
    std::string out1, out2, out_half, out_res;
    int r1 = run_cmd(base + "--threads 1 -x 6 -o " + d + "_full", &out1, nullptr);
    int r2 = run_cmd(base + "--threads 2 -x 6", &out2, nullptr);
    int r3 = run_cmd(base + "--threads 1 -x 3 -o " + d + "_half", &out_half, nullptr);
    int r4 = run_cmd(base + "--threads 1 -x 6 -y 1 -o " + d + "_half", &out_res, nullptr);
    std::vector<float> l1 = grep_floats(out1, "| loss "), l2 = grep_floats(out2, "| loss "), lr = grep_floats(out_res, "| loss ");
    std::vector<float> tail(l1.size() == 6 ? l1.begin() + 3 : l1.end(), l1.end());
    check(r1 == 0 && r2 == 0 && out1.find("on AMX tiles (--bf16-gemm amx") != std::string::npos && l1.size() == 6 && l1 == l2,
          "--bf16-gemm amx from the command line: said, and the same 6 losses with 1 and 2 threads (exits %d %d)", r1, r2);
    check(r3 == 0 && r4 == 0 && tail.size() == 3 && lr == tail &&
              model_params(ckpt_path((d + "_full").c_str(), "model", 6)) == model_params(ckpt_path((d + "_half").c_str(), "model", 6)),
          "--bf16-gemm amx stopped at step 3 and resumed with it: steps 4-6 and the step-6 weights bit-identical (exits %d %d)", r3, r4);
}

static void test_bf16_amx() {
    printf("--bf16-gemm amx: Intel's tile unit (tdpbf16ps)\n");
    if (!bf16_amx_supported()) {  // then asking for it is refused, in one line
        std::string err;
        int rc = run_cmd("-e L2C64H4 -b 4 -t 32 -v 0 -g 0 --dtype bf16 --bf16-gemm amx -x 2", nullptr, &err);
        check(rc == 1 && err.find("--bf16-gemm amx: this CPU") != std::string::npos && std::count(err.begin(), err.end(), '\n') <= 2,
              "on a CPU without AMX-BF16, --bf16-gemm amx is refused: exit %d: %s", rc, err.substr(0, err.find('\n')).c_str());
    }
    test_bf16_amx_gemm();
    test_bf16_amx_train();
}

static void test_bf16_train() {
    printf("--dtype bf16: fp32 masters, a stochastically rounded bf16 copy, bf16 matmul operands, fp32 sums\n");
    test_bf16_partial_sums();
    test_bf16_grad_sums();
    // the ops: round to nearest even in place, and the master copy held in fp32
    {
        std::vector<float> x;
        for (uint32_t u = 0; u < (1u << 24); u += 97) x.push_back(bf16_test_float(u << 8 | (u & 0xff)));  // every exponent, both signs
        for (float f : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, 3.4e38f}) x.push_back(f);
        std::vector<float> y = x;
        round_bf16_cpu(y.data(), (long)y.size());
        long wrong = 0;
        for (size_t i = 0; i < x.size(); i++) {
            bool nan = x[i] != x[i];
            wrong += nan ? y[i] == y[i] : bf16_test_bits(y[i]) != (uint32_t)bf16_round(x[i]) << 16;
        }
        check(wrong == 0, "round_bf16_cpu: %ld of %zu values (every exponent, zeros, infinities, NaN, denormals) not their bf16", wrong,
              x.size());
    }

    // bf16 against fp32 from the same weights: llm.c's bf16 test accepts 0.05 on the loss
    Bf16Train su = bf16_train_setup();
    const GPTConfig cfg = su.cfg;
    const int B = su.B, T = su.T, steps = su.steps;
    const std::vector<float>& init = su.init;
    const std::vector<int>&data = su.data, &learn = su.learn;
    TpResult f32, b16;
    run_tp(&cfg, init, 1, steps, learn, B, T, 3e-3f, 1.0f, &f32);
    run_tp(&cfg, init, 1, steps, learn, B, T, 3e-3f, 1.0f, &b16, false, 0, true, true);
    double gap = loss_gap(b16.losses, f32.losses);
    check_le(gap, 0.05, "L2 NH4 C64, B%d T%d, %d steps: bf16 losses against fp32's (%.4f to %.4f), largest difference", B, T, steps,
             f32.losses.front(), f32.losses.back());
    check(gap > 0, "bf16 computes other numbers than fp32 (largest loss difference %.3g)", gap);
    const char* name;
    double ge = worst_tensor_err(&cfg, b16.grads_full, f32.grads_full, &name);
    check_le(ge, 5e-2, "step-0 gradients, bf16 against fp32: worst tensor %s, rel err", name);
    double we = worst_tensor_drift(&cfg, b16.params_full, f32.params_full, init, &name);
    check_le(we, 0.25, "weights after %d steps, bf16 against fp32, per tensor against how far they moved (key bias aside): worst %s",
             steps, name);

    // TP=P and SP against TP=1, all in bf16. fp32 sums in another order differ in their last bits, and an
    // operand that lands near a rounding boundary of bf16 then rounds the other way: one bf16 unit (2^-8 of
    // it) in a few elements. The step-0 gradients' bound is 100x fp32's (1e-5); over 16 seeds of the weights
    // and the data these grids measured at most 0.0024 on either path's bits (about 1e-3 where an operand
    // flipped, 1e-6 in the seeds where none did). The weights: bf16_grid_against_tp1. (Each rounding that
    // follows such a flip rounds what it changed. The residual-stream gradient is not rounded, only the
    // matmuls' copy of it; the stream itself, and q, k and v, are, and over 32 seeds that moved TP=P no
    // further from TP=1: the step-0 gradients' median 8e-4 with the stream in fp32, 4e-4 in bf16, at most
    // 0.0024 and 0.0020; README, bf16.)
    int steps_tp = 10;
    TpResult one;
    run_tp(&cfg, init, 1, steps_tp, data, B, T, 1e-3f, 1.0f, &one, false, 0, true, true);
    check(one.t_last == steps_tp - 1 && bf16_weights_unlike_masters(one) == 0,
          "bf16 TP=1: the last forward's bf16 weights are the stochastic rounding of its masters keyed on the step (%d) "
          "and the seed: %ld of %zu differ", one.t_last, bf16_weights_unlike_masters(one), one.masters_last.size());
    {  // and with another seed (run_tp's is 1234), the run's own
        TpResult other;
        run_tp(&cfg, init, 2, 3, data, B, T, 1e-3f, 1.0f, &other, false, 0, true, true, 4321);
        check(other.t_last == 2 && bf16_weights_unlike_masters(other) == 0,
              "bf16 TP=2 with seed 4321: the last forward's bf16 weights are its masters rounded at its step (%d) and seed: "
              "%ld of %zu differ", other.t_last, bf16_weights_unlike_masters(other), other.masters_last.size());
    }
    struct { int P; bool sp; int recompute; } grids[] = {{2, false, 0}, {4, false, 0}, {2, true, 0}, {4, true, 2}};
    for (auto& g : grids) {
        TpResult res;
        char what[48];
        snprintf(what, sizeof(what), "bf16 TP=%d%s%s", g.P, g.sp ? " SP" : "", g.recompute ? " -r 2" : "");
        bf16_grid_against_tp1(&cfg, init, data, B, T, steps_tp, g.P, g.sp, g.recompute, one, what, &res);
        check_le(bf16_weights_unlike_masters(res), 0, "%-18s the last forward's bf16 weights not the rounding of its masters at "
                 "step %d, keyed on the full index, the step and the seed", what, res.t_last);
        // the activations each layer keeps in bf16 storage (and with SP the all-gathers of bf16 values, which
        // move as bf16): against the same run holding and moving them in fp32 words, every bit the same, and
        // SP's gathers (6L+1)/2 + 1 of (6L+2) of the words, to the word
        TpResult wide;
        g_bf16_in_fp32 = true;
        run_tp(&cfg, init, g.P, steps_tp, data, B, T, 1e-3f, 1.0f, &wide, g.sp, g.recompute, true, true);
        g_bf16_in_fp32 = false;
        auto differ = [](const std::vector<float>& a, const std::vector<float>& b) {
            long n = 0;
            for (size_t i = 0; i < a.size() && i < b.size(); i++) n += memcmp(&a[i], &b[i], sizeof(float)) != 0;
            return n + (long)(a.size() != b.size());
        };
        long dl = differ(res.losses, wide.losses), dg = differ(res.grads_full, wide.grads_full), dw = differ(res.params_full, wide.params_full);
        check(dl + dg + dw == 0, "%-18s kept activations%s in bf16 against fp32 words: %ld losses, %ld step-0 gradients, %ld weights "
              "after %d steps differ in bits", what, g.sp ? " and SP's gathers" : "", dl, dg, dw, steps_tp);
        if (!g.sp) continue;
        double want[COMM_KINDS], want32[COMM_KINDS], off = 0;
        step_comm_floats(&cfg, B, T, true, 1, true, want);
        step_comm_floats(&cfg, B, T, true, 1, false, want32);
        for (int k = 0; k < COMM_KINDS; k++) off += fabs(res.moved[k] - want[k]) + fabs(wide.moved[k] - want32[k]);
        check_le(off, 0, "%-18s words of 4 bytes per step against the formulas: all-gather %.0f in bf16, %.0f in fp32 words "
                 "(%.4f = ((6L+1)/2 + 1)/(6L+2)); reduce-scatter %.0f and all-reduce %.0f both: difference", what,
                 res.moved[KIND_ALLGATHER], wide.moved[KIND_ALLGATHER], res.moved[KIND_ALLGATHER] / wide.moved[KIND_ALLGATHER],
                 res.moved[KIND_REDUCESCATTER], res.moved[KIND_ALLREDUCE]);
        // (the formulas above follow sp_wire_bf16, as the run does; the ratio is written out here, so a run that
        // stops sending bf16 is caught even where the formula follows it)
        const double L = cfg.L, ratio = ((6 * L + 1) / 2 + 1) / (6 * L + 2);
        check_le(fabs(res.moved[KIND_ALLGATHER] / wide.moved[KIND_ALLGATHER] - ratio), 1e-12, "%-18s SP's all-gathers in bf16 "
                 "move %.4f of the fp32 words: difference", what, ratio);
        check(res.moved[KIND_REDUCESCATTER] == wide.moved[KIND_REDUCESCATTER] && res.moved[KIND_ALLREDUCE] == wide.moved[KIND_ALLREDUCE],
              "%-18s the partial sums' reduce-scatters and the all-reduces move fp32 in both", what);
    }

    // the matmuls of a bf16 run on the CPU's two paths (--bf16-gemm): vdpbf16ps and fp32 fmas, the same bits
    // in every loss, step-0 gradient and final weight, at TP=1 and at TP=2 with SP
    if (!bf16_dp_supported()) {
        printf("  skip bf16 training on vdpbf16ps against fp32 fmas: this CPU has no AVX512-BF16\n");
        g_skipped++;
    } else if (g_device == DEV_CPU) {
        for (int P : {1, 2}) {
            TpResult on[2];
            for (int which = 0; which < 2; which++) {
                bf16_path = which ? BF16_DP : BF16_FMA;
                run_tp(&cfg, init, P, steps_tp, data, B, T, 1e-3f, 1.0f, &on[which], P > 1, 0, true, true);
            }
            bf16_path = BF16_AUTO;
            long dl = vectors_differ(on[0].losses, on[1].losses), dg = vectors_differ(on[0].grads_full, on[1].grads_full),
                 dw = vectors_differ(on[0].params_full, on[1].params_full);
            check(dl + dg + dw == 0, "bf16 TP=%d%s, %d steps, matmuls on vdpbf16ps against fp32 fmas: %ld losses, %ld gradients, %ld weights differ in bits",
                  P, P > 1 ? " SP" : "", steps_tp, dl, dg, dw);
        }
    }

    // replicas stay bit-identical in bf16, with and without ZeRO-1 (each rounds its whole shard from the same masters)
    GPTConfig small = make_config(2, 4, 32, 200, 32);
    std::vector<float> sinit = init_weights(&small, 7);
    std::vector<int> sdata = random_tokens(10L * 8 * 2 * 16 + 1, small.V, 99);
    GridResult big;
    run_grid(&small, sinit, 1, 1, 0, 1, 10, sdata, 4, 16, &big, false, 0, 1, PP_1F1B, DTYPE_BF16);
    GridResult z[2];
    for (int zero : {0, 1}) {
        GridResult& res = z[zero];
        run_grid(&small, sinit, 2, 2, zero, 1, 10, sdata, 2, 16, &res, false, 0, 1, PP_1F1B, DTYPE_BF16);
        check(res.mismatches == 0 && res.distinct == 10, "bf16 (P 2, D 2%s): %ld of %ld weight checksums differ from replica 0's, %ld distinct in 10 steps",
              zero ? ", -z 1" : "", res.mismatches, res.compared, res.distinct);
        check_le(loss_gap(res.losses, big.losses), 1e-3, "bf16 (P 2, D 2%s) against one rank with -b 4: per-step losses, largest difference",
                 zero ? ", -z 1" : "");
        double want[COMM_KINDS], off = 0;
        dp_step_floats(&small, 2, 2, zero, true, want);
        for (int k = 0; k < COMM_KINDS; k++) off += fabs(res.dp_moved[k] - want[k]);
        check_le(off, 0, "bf16 (P 2, D 2%s) DP words per step against the formula: reduce-scatter %.0f, all-gather %.0f (the bf16 weights), "
                 "all-reduce %.0f: difference", zero ? ", -z 1" : "", res.dp_moved[KIND_REDUCESCATTER], res.dp_moved[KIND_ALLGATHER],
                 res.dp_moved[KIND_ALLREDUCE]);
    }
    // the gradient sums go through an fp32 stage in pieces where it is smaller than the sum (g_grad_stage_max):
    // elementwise sums, so a stage of 37 floats (pieces of 37, and of 18 per replica for ZeRO's reduce-scatter,
    // cutting through tensors) gives the bits of one piece; for DP, SP's replicated tensors and the tied wte
    // between pipeline stages
    {
        struct { int P, D, zero, sp, S; const char* what; } grids[] = {
            {2, 2, 0, 0, 1, "P 2, D 2"}, {2, 2, 1, 0, 1, "P 2, D 2, -z 1"}, {2, 1, 0, 1, 1, "P 2, SP"}, {1, 1, 0, 0, 2, "PP 2"}};
        long differ = 0;
        std::string which;
        for (auto& gr : grids) {
            GridResult whole, pieces;
            run_grid(&small, sinit, gr.P, gr.D, gr.zero, 1, 6, sdata, 2, 16, &whole, false, gr.sp, gr.S, PP_1F1B, DTYPE_BF16);
            const long had = g_grad_stage_max;
            g_grad_stage_max = 37;
            run_grid(&small, sinit, gr.P, gr.D, gr.zero, 1, 6, sdata, 2, 16, &pieces, false, gr.sp, gr.S, PP_1F1B, DTYPE_BF16);
            g_grad_stage_max = had;
            long d = vectors_differ(whole.losses, pieces.losses) + vectors_differ(whole.grads_full, pieces.grads_full) +
                     vectors_differ(whole.params_full, pieces.params_full) + (whole.losses.size() != 6);
            if (d) which += std::string(" ") + gr.what;
            differ += d;
        }
        check(differ == 0, "bf16 gradient sums through a stage of 37 floats, in pieces, against one piece (DP, -z 1, SP, PP): "
              "%ld losses, gradients and weights differ in bits after 6 steps%s", differ, which.c_str());
    }
    // ZeRO-1 in bf16 gathers the bf16 copy each replica rounds of its slice, where -z 0 rounds all of it:
    // the same bits where the masters are the same (the sums' order differs only in the gradient norm)
    check(z[1].dp_moved[KIND_ALLGATHER] * 2 == z[1].dp_moved[KIND_REDUCESCATTER],
          "bf16 (P 2, D 2, -z 1): the weights' all-gather moves half the gradient's reduce-scatter's bytes (%.0f and %.0f words)",
          z[1].dp_moved[KIND_ALLGATHER], z[1].dp_moved[KIND_REDUCESCATTER]);
    GridResult wide;  // -z 1 gathering the fp32 masters and rounding all of them, as before
    g_bf16_in_fp32 = true;
    run_grid(&small, sinit, 2, 2, 1, 1, 10, sdata, 2, 16, &wide, false, 0, 1, PP_1F1B, DTYPE_BF16);
    g_bf16_in_fp32 = false;
    bool same = wide.losses == z[1].losses && wide.norms == z[1].norms && memcmp(wide.params_full.data(), z[1].params_full.data(),
                                                                                  wide.params_full.size() * sizeof(float)) == 0;
    check(same, "bf16 (P 2, D 2, -z 1): gathering the bf16 copy (%.0f words a step) against gathering the fp32 masters (%.0f): the "
          "same losses, norms and masters after 10 steps, to the bit", z[1].dp_moved[KIND_ALLGATHER], wide.dp_moved[KIND_ALLGATHER]);

    // the command line: saved with the run, a bit-exact resume, a resume that switches, a bad value
    std::string d = tmpdir();
    std::string base = "-e L2C64H4 -b 4 -t 32 -v 0 -g 0 --threads 1 --tp 2 ";
    std::string out_full, out_b, err;
    int rc1 = run_cmd(base + "--dtype bf16 -x 8 -o " + d + "/full", &out_full, &err);
    int rc2 = run_cmd(base + "--dtype bf16 -x 4 -o " + d + "/half", nullptr, nullptr);
    int rc3 = run_cmd(base + "-x 8 -y 1 -o " + d + "/half", &out_b, &err);  // --dtype from the saved flags
    std::vector<float> full = grep_floats(out_full, "| loss "), resumed = grep_floats(out_b, "| loss ");
    std::vector<float> tail(full.size() == 8 ? full.begin() + 4 : full.end(), full.end());
    check(rc1 == 0 && rc2 == 0 && rc3 == 0 && tail.size() == 4 && resumed == tail &&
              model_params(ckpt_path((d + "/full").c_str(), "model", 8)) == model_params(ckpt_path((d + "/half").c_str(), "model", 8)),
          "bf16 resumed at step 4 without --dtype: steps 5-8 and the step-8 weights bit-identical to the run straight through (exits %d %d %d)",
          rc1, rc2, rc3);
    // the files of a bf16 run: the model file is llm.c's version 5, each weight the nearest bf16 of its fp32
    // master, which the state file keeps (version 5, masters = 1), the same in both runs
    {
        std::string mp = ckpt_path((d + "/full").c_str(), "model", 8);
        std::vector<char> b = slurp_bytes(mp);
        TrainState sf, sh;
        GPTConfig cf = {};
        std::vector<float> widened;
        int version = 0;
        model_read(mp.c_str(), &cf, &widened, &version);
        state_read((d + "/full").c_str(), 8, gpt_num_params(&cf), true, &sf);
        state_read((d + "/half").c_str(), 8, gpt_num_params(&cf), true, &sh);
        long n = gpt_num_params(&cf), wrong = 0, fine = 0;
        for (long i = 0; i < n && sf.masters.size() == (size_t)n; i++) {
            wrong += bf16_to_float(bf16_round(sf.masters[i])) != widened[i];
            fine += sf.masters[i] != widened[i];  // the masters carry bits below bf16's
        }
        check(version == 5 && (long)b.size() == 1024 + 2 * n && sf.h.version == 5 && sf.h.masters == 1 && (long)sf.masters.size() == n &&
                  wrong == 0 && fine > n / 2 && sf.masters == sh.masters,
              "a bf16 run's model file: version %d, %zu bytes = header + 2 x %ld; its state file: version %lld, masters %lld; "
              "%ld weights not the nearest bf16 of their master, %ld masters finer than bf16; the resumed run's masters %s",
              version, b.size(), n, (long long)sf.h.version, (long long)sf.h.masters, wrong, fine,
              sf.masters == sh.masters ? "bit-identical" : "differ");
        // the masters are under the state file's checksum, and a model file must be of its state's kind
        std::string bad = d + "/bad";
        copy_step(d + "/full", bad, 8);
        std::string sp = ckpt_path(bad.c_str(), "state", 8);
        std::vector<char> st = slurp_bytes(sp);
        bool zeroed = st.size() > (size_t)(4 * n) + 4096;
        if (zeroed) {
            memset(st.data() + st.size() - 4 * n + (4 * n) / 2, 0, 4096);  // a page in the middle of the masters
            FILE* f = fopen(sp.c_str(), "wb");
            fwrite(st.data(), 1, st.size(), f);
            fclose(f);
        }
        CkptCheck v = ckpt_verify(bad.c_str(), 8);
        check(zeroed && v.model_ok && !v.state_ok && v.why.find("does not match its checksum") != std::string::npos,
              "4 KB zeroed in the masters of a bf16 state file: %s", v.why.c_str());
        copy_step(d + "/full", bad + "2", 8);
        model_write(ckpt_path((bad + "2").c_str(), "model", 8).c_str(), &cf, widened.data());  // fp32, beside a bf16 state
        CkptCheck v2 = ckpt_verify((bad + "2").c_str(), 8);
        check(!v2.model_ok && v2.why.find("is fp32 but its state file is a bf16 run's") != std::string::npos,
              "an fp32 model file beside a bf16 run's state file: %s", v2.why.c_str());
    }
    std::string out_f, out_back;
    int rc4 = run_cmd(base + "--dtype fp32 -x 12 -y 1 -o " + d + "/half", &out_f, &err);
    std::vector<float> l4 = grep_floats(out_f, "| loss ");
    check(rc4 == 0 && l4.size() == 4 && out_f.find("--dtype fp32") != std::string::npos && std::isfinite(l4.back()),
          "a bf16 run resumed in fp32: exit %d, %zu steps, the change said (%s)", rc4, l4.size(), first_line_with(out_f, "changed").c_str());
    int rc5 = run_cmd(base + "--dtype bf16 -x 16 -y 1 -o " + d + "/half", &out_back, &err);
    std::vector<float> l5 = grep_floats(out_back, "| loss ");
    check(rc5 == 0 && l5.size() == 4 && out_back.find("--dtype bf16") != std::string::npos && std::isfinite(l5.back()),
          "and back to bf16: exit %d, %zu steps, the change said", rc5, l5.size());
    {
        int v12 = 0, v16 = 0;
        GPTConfig c12 = {}, c16 = {};
        model_read(ckpt_path((d + "/half").c_str(), "model", 12).c_str(), &c12, nullptr, &v12);
        model_read(ckpt_path((d + "/half").c_str(), "model", 16).c_str(), &c16, nullptr, &v16);
        TrainState s12, s16;
        state_read((d + "/half").c_str(), 12, gpt_num_params(&c12), false, &s12);
        state_read((d + "/half").c_str(), 16, gpt_num_params(&c16), false, &s16);
        check(v12 == 3 && s12.h.masters == 0 && v16 == 5 && s16.h.masters == 1,
              "each checkpoint in its run's dtype: step 12 (fp32) model version %d, masters in the state %lld; step 16 (bf16) %d, %lld",
              v12, (long long)s12.h.masters, v16, (long long)s16.h.masters);
    }
    int rc6 = run_cmd(base + "--dtype fp16 -x 2", nullptr, &err);
    int lines = (int)std::count(err.begin(), err.end(), '\n');
    check(rc6 == 1 && err.find("takes bf16, fp32 or auto, not 'fp16'") != std::string::npos && lines == 2, "--dtype fp16: exit %d: %s", rc6,
          err.substr(0, err.find('\n')).c_str());
    int rc7 = run_cmd(base + "--dtype bf16 --bf16-gemm avx -x 2", nullptr, &err);
    check(rc7 == 1 && err.find("takes auto, vdpbf16ps, fma or amx, not 'avx'") != std::string::npos, "--bf16-gemm avx: exit %d: %s", rc7,
          err.substr(0, err.find('\n')).c_str());

    // --dtype's default (auto, given here as the harness pins fp32 otherwise): bf16 on a CPU with AVX512-BF16,
    // saved with the run as bf16, so a resume stays bf16; fp32 on one without. An llm.c model file decides
    // for itself: version 3 (fp32) runs fp32 on any CPU. (./tp says what it found; this binary, built for
    // the emulator without AVX-512, may not see the CPU's AVX512-BF16, but where it does ./tp must too.)
    {
        std::string out_auto, out_given, out_res, out_v3, out_v3f;
        int ra = run_cmd(base + "--dtype auto -x 4", &out_auto, &err);
        std::string line = first_line_with(out_auto, "the default here");
        bool hw = line.find("this CPU has AVX512-BF16") != std::string::npos;
        const char* want = hw ? "bf16" : "fp32";
        int rg = run_cmd(base + "--dtype " + want + " -x 4", &out_given, nullptr);
        bool said = line.find(std::string("--dtype ") + want + ", the default here") != std::string::npos &&
                    (hw || line.find("this CPU has no AVX512-BF16") != std::string::npos) && (hw || !bf16_dp_supported());
        std::vector<float> la = grep_floats(out_auto, "| loss "), lg = grep_floats(out_given, "| loss ");
        check(ra == 0 && rg == 0 && said && la.size() == 4 && la == lg && out_given.find("the default here") == std::string::npos,
              "--dtype unset on this CPU (%s AVX512-BF16): %s, said ('%s'), the same 4 losses as --dtype %s given", hw ? "with" : "without",
              want, line.c_str(), want);
        // stopped at step 2 and resumed without --dtype: the saved dtype, not a new default
        int rs = run_cmd(base + "--dtype auto -x 2 -o " + d + "/auto", nullptr, nullptr), v2 = 0;
        GPTConfig c2 = {};
        model_read(ckpt_path((d + "/auto").c_str(), "model", 2).c_str(), &c2, nullptr, &v2);
        int rr = run_cmd(base + "-x 4 -y 1 -o " + d + "/auto", &out_res, &err);
        std::vector<float> lr = grep_floats(out_res, "| loss ");
        check(rs == 0 && rr == 0 && v2 == (hw ? 5 : 3) && lr.size() == 2 && la.size() == 4 && lr[0] == la[2] && lr[1] == la[3],
              "the default's run saved as %s (model file version %d) and resumed from step 2 the same, bit for bit (exit %d: %s)", want, v2,
              rr, err.substr(0, err.find('\n')).c_str());
        // an llm.c fp32 model file (version 3) with --dtype unset: fp32, as llm.c computes it
        std::string v3 = ckpt_path((d + "/half").c_str(), "model", 12);
        int r3 = run_cmd("-e " + v3 + " -b 4 -t 32 -v 0 -g 0 --threads 1 --tp 2 --dtype auto -x 2", &out_v3, &err);
        int r3f = run_cmd("-e " + v3 + " -b 4 -t 32 -v 0 -g 0 --threads 1 --tp 2 --dtype fp32 -x 2", &out_v3f, nullptr);
        std::vector<float> l3 = grep_floats(out_v3, "| loss "), l3f = grep_floats(out_v3f, "| loss ");
        check(r3 == 0 && r3f == 0 && l3.size() == 2 && l3 == l3f && out_v3.find("the default here") == std::string::npos,
              "an llm.c version 3 (fp32) model file with --dtype unset: fp32's losses, bit for bit (exits %d %d)", r3, r3f);
    }
    // a state file whose saved flags have no --dtype (a tp from before bf16 wrote it) resumes in fp32, what
    // it was trained in, on any hardware; a new run with --dtype unset takes the hardware's default
    {
        Run* resumed = new Run();
        Run* fresh = new Run();
        for (Run* r : {resumed, fresh}) {
            r->args.dtype = DTYPE_AUTO;
            r->args.timeout = 10;
            r->device = DEV_CPU;
        }
        resumed->resuming = true;
        dtype_setup(resumed);
        dtype_setup(fresh);
        const int want = bf16_dp_supported() ? DTYPE_BF16 : DTYPE_FP32;
        check(resumed->args.dtype == DTYPE_FP32 && !resumed->dtype_default && fresh->args.dtype == want && fresh->dtype_default,
              "--dtype unset: a resume whose state file saved no --dtype is fp32 (%s), a new run %s (%s)",
              resumed->args.dtype == DTYPE_FP32 ? "fp32" : "bf16", want == DTYPE_BF16 ? "bf16" : "fp32",
              fresh->args.dtype == DTYPE_FP32 ? "fp32" : "bf16");
        delete resumed;
        delete fresh;
    }
}
