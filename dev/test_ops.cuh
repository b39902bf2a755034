// dev/test_ops.cuh: every CPU op of kernels_cpu.h against a float64 reference of the op written here,
// independently of it; the harness's own checks failing on NaN; resume across shards and epochs; the
// build's record of its switches. Included by test_tp.cu (it uses its check, check_le, within, worse).
//
// The TP, SP and DP tests compare the code with itself at another grid, so an error inside one CPU op
// cancels there; these tests compare each op with the formula. Inputs span what a trained model reaches,
// attention scores and logits far past exp's range included. Bounds are in units of fp32's unit roundoff
// u = 2^-24 and follow the standard forward error bound of a sum of K terms, |fl(sum) - sum| <= K u sum|terms|:
// an error is measured against the sum of the absolute values of the terms it is made of (its "scale"),
// and the bound is (K + a few) u where K is the longest reduction the op performs.

#include <utime.h>

static const double OPS_U = 5.9604644775390625e-08;  // 2^-24

struct OpsRng {
    uint64_t s;
};
static uint64_t ops_next(OpsRng* r) {  // splitmix64
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double ops_uniform(OpsRng* r) { return ((ops_next(r) >> 11) + 0.5) / 9007199254740992.0; }  // (0, 1)
static float ops_normal(OpsRng* r, double mean, double std) {
    double u1 = ops_uniform(r), u2 = ops_uniform(r);
    return (float)(mean + std * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}
static int ops_int(OpsRng* r, int lo, int hi) { return lo + (int)(ops_next(r) % (uint64_t)(hi - lo + 1)); }
static std::vector<float> ops_normals(OpsRng* r, long n, double mean, double std) {
    std::vector<float> v(n);
    for (auto& x : v) x = ops_normal(r, mean, std);
    return v;
}

// max over i of |got - ref| / (scale + floor): the error in units of the terms it comes from. NaN if any
// got, ref or scale is NaN; a got that is infinite where ref is not gives infinity.
static double scaled_err(const float* got, const double* ref, const double* scale, long n, double floor = 0.0) {
    double w = 0.0;
    for (long i = 0; i < n; i++) w = worse(w, fabs((double)got[i] - ref[i]) / (scale[i] + floor));
    return w;
}
// how many of n floats differ in their bits from want (NaN-safe: memcmp)
static long bits_differ(const float* got, const float* want, long n) {
    long k = 0;
    for (long i = 0; i < n; i++) k += memcmp(&got[i], &want[i], sizeof(float)) != 0;
    return k;
}

// ----------------------------------------------------------------------------
// matmul

static void test_ops_matmul() {
    OpsRng r = {101};
    for (int OC : {70, 64}) {  // 70: a ragged last tile of the GEMM (NR 32); 64: full tiles only
        int N = 37, IC = 96;
        std::vector<float> inp = ops_normals(&r, (long)N * IC, 0, 1), w = ops_normals(&r, (long)OC * IC, 0, 0.5),
                           b = ops_normals(&r, OC, 0, 0.1), out((long)N * OC);
        matmul_forward_cpu(out.data(), inp.data(), w.data(), b.data(), N, IC, OC);
        std::vector<double> ref((long)N * OC), sc((long)N * OC);
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++) {
                double s = b[o], a = fabs(b[o]);
                for (int i = 0; i < IC; i++) {
                    s += (double)inp[n * IC + i] * w[o * IC + i];
                    a += fabs((double)inp[n * IC + i] * w[o * IC + i]);
                }
                ref[n * OC + o] = s;
                sc[n * OC + o] = a;
            }
        check_le(scaled_err(out.data(), ref.data(), sc.data(), (long)N * OC), (IC + 2) * OPS_U,
                 "matmul_forward N%d IC%d OC%d: max |out - ref| / sum|x w|+|b|, bound (IC+2) u", N, IC, OC);
        // backward: dinp written (it starts as NaN), dweight and dbias accumulated onto what they hold
        std::vector<float> dout = ops_normals(&r, (long)N * OC, 0, 1), dinp((long)N * IC, NAN);
        std::vector<float> dw0 = ops_normals(&r, (long)OC * IC, 0, 1), db0 = ops_normals(&r, OC, 0, 1);
        std::vector<float> dw = dw0, db = db0;
        matmul_backward_cpu(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, IC, OC);
        std::vector<double> rdi((long)N * IC), sdi((long)N * IC), rdw((long)OC * IC), sdw((long)OC * IC), rdb(OC), sdb(OC);
        for (int n = 0; n < N; n++)
            for (int i = 0; i < IC; i++) {
                double s = 0, a = 0;
                for (int o = 0; o < OC; o++) {
                    s += (double)dout[n * OC + o] * w[o * IC + i];
                    a += fabs((double)dout[n * OC + o] * w[o * IC + i]);
                }
                rdi[n * IC + i] = s;
                sdi[n * IC + i] = a;
            }
        for (int o = 0; o < OC; o++) {
            double s = db0[o], a = fabs(db0[o]);
            for (int n = 0; n < N; n++) { s += dout[n * OC + o]; a += fabs(dout[n * OC + o]); }
            rdb[o] = s;
            sdb[o] = a;
            for (int i = 0; i < IC; i++) {
                double s2 = dw0[o * IC + i], a2 = fabs(dw0[o * IC + i]);
                for (int n = 0; n < N; n++) {
                    s2 += (double)dout[n * OC + o] * inp[n * IC + i];
                    a2 += fabs((double)dout[n * OC + o] * inp[n * IC + i]);
                }
                rdw[o * IC + i] = s2;
                sdw[o * IC + i] = a2;
            }
        }
        check_le(scaled_err(dinp.data(), rdi.data(), sdi.data(), (long)N * IC), (OC + 2) * OPS_U,
                 "matmul_backward OC%d dinp = dout W: max error / sum|dout w|, bound (OC+2) u", OC);
        check_le(scaled_err(dw.data(), rdw.data(), sdw.data(), (long)OC * IC), (N + 2) * OPS_U,
                 "matmul_backward OC%d dweight += dout^T inp: max error / (|dw0| + sum|dout x|), bound (N+2) u", OC);
        check_le(scaled_err(db.data(), rdb.data(), sdb.data(), OC), (N + 2) * OPS_U,
                 "matmul_backward OC%d dbias += column sums: max error / (|db0| + sum|dout|), bound (N+2) u", OC);
    }
}

// gemm_cpu itself, C = [C +] op(A) op(B) [+ bias], against float64 at the model's shapes and at ragged
// ones: M, N and K that are not multiples of the tile (MR x NR), of a cache line or of the unit of
// tiles, K = 1, K = 0, 1 x 1; each operand as itself and as a transpose read through its strides; with
// bias and with accumulate. Each result is also computed at 2, 3 and 5 threads, which must give the same
// bits: every element is one fma chain over k in order, whatever thread computes it.
static void test_ops_gemm() {
    OpsRng r = {303};
    struct Case { int M, N, K; const char* what; };
    const Case cases[] = {
        {1024, 192, 128, "default model qkv (TP 2)"}, {192, 128, 1024, "default model qkv dweight"},
        {1024, 128, 256, "default model fcproj"}, {128, 128, 32, "attention scores T128 hs32"},
        {301, 1152, 384, "d6 qkv rows"}, {384, 200, 2048, "d6 dweight, K 2048"},
        {97, 257, 600, "unit edges + 1"}, {13, 17, 257, "K 257"}, {7, 33, 1, "K = 1"},
        {5, 9, 0, "K = 0"}, {1, 1, 1, "1 x 1 x 1"}, {1, 70, 96, "one row"}, {70, 1, 96, "one column"},
        {576, 96, 64, "units of 7 row tiles at 2 threads"},
    };
    long differ = 0, checked = 0;
    for (const Case& c : cases) {
        const int M = c.M, N = c.N, K = c.K;
        for (int variant = 0; variant < 4; variant++) {
            const bool ta = variant & 1, tb = variant & 2;  // A stored as (K, M), B as (N, K)
            const bool acc = variant == 3, bias = variant == 0 || variant == 3;
            std::vector<float> A = ops_normals(&r, (long)M * K + 1, 0, 1), B = ops_normals(&r, (long)K * N + 1, 0, 1);
            std::vector<float> bv = ops_normals(&r, N, 0, 1), C0 = ops_normals(&r, (long)M * N, 0, 1);
            long a_rs = ta ? 1 : K, a_cs = ta ? M : 1, b_rs = tb ? 1 : N, b_cs = tb ? K : 1;
            std::vector<float> C = acc ? C0 : std::vector<float>((size_t)M * N, NAN);
            gemm_cpu(M, N, K, A.data(), a_rs, a_cs, B.data(), b_rs, b_cs, C.data(), N, acc, bias ? bv.data() : nullptr);
            std::vector<double> ref((size_t)M * N), sc((size_t)M * N);
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++) {
                    double s = 0, a = 0;
                    for (int k = 0; k < K; k++) {
                        double p = (double)A[m * a_rs + k * a_cs] * B[k * b_rs + n * b_cs];
                        s += p;
                        a += fabs(p);
                    }
                    if (bias) { s += bv[n]; a += fabs(bv[n]); }
                    if (acc) { s += C0[(size_t)m * N + n]; a += fabs(C0[(size_t)m * N + n]); }
                    ref[(size_t)m * N + n] = s;
                    sc[(size_t)m * N + n] = a;
                }
            // K + 2 roundings at most: the fma chain, the bias, the old C
            double e = scaled_err(C.data(), ref.data(), sc.data(), (long)M * N, 1e-30), bound = (K + 2) * OPS_U;
            check_le(e, bound, "gemm M%d N%d K%d (%s)%s%s%s%s: max error / (sum|a b| + |bias| + |C|), bound (K+2) u", M, N, K,
                     c.what, ta ? " A^T" : "", tb ? " B^T" : "", bias ? " +bias" : "", acc ? " +=C" : "");
            for (int nt : {2, 3, 5}) {
                std::vector<float> Ct = acc ? C0 : std::vector<float>((size_t)M * N, NAN);
                std::thread rank([&]() {
                    cpu_pool_start(nt);
                    gemm_cpu(M, N, K, A.data(), a_rs, a_cs, B.data(), b_rs, b_cs, Ct.data(), N, acc, bias ? bv.data() : nullptr);
                });
                rank.join();
                differ += bits_differ(Ct.data(), C.data(), (long)M * N);
                checked += (long)M * N;
            }
        }
    }
    check_le(differ, 0, "gemm, all the shapes and variants above at 2, 3 and 5 threads (%ld floats): floats differing from 1 thread", checked);
}

// How gemm_cpu splits its tiles among a rank's threads (gemm_units_cpu), in its own cost model
// (gemm_units_span: tile-panels, cpu_pool_run's chunks, each to the thread free first). d6's qkv and fcproj
// weight gradients at TP 1 and 2 threads, and TP 2's qkv at 2 threads: 9 units of 16 row tiles kept one
// thread idle for the last (a span 11-17% over the even share); the units chosen must come within the
// search's step (3%) of the even share.
// Over a grid of shapes (M, N from 64 to 4096) and 2 to 16 threads: never a longer span than the halving
// alone gives, at least 4 units a thread, and each thread's share within 12% of even, with the tiles of
// AVX-512 (8 x 32), AVX2 (6 x 16) and 128-bit vectors (4 x 8) alike (worst: 0.889, 0.884, 0.889; the
// halving alone: 0.844, 0.815, 0.844). With AVX2's tiles a search for smaller units only left 0.825 (a
// 128 x 192 C on 16 threads), past the bound.
static void test_ops_gemm_units() {
    struct Shape { int M, N; const char* what; };
    const Shape exact[] = {{1152, 384, "d6 qkv dweight, TP 1"}, {384, 1536, "d6 fcproj dweight, TP 1"}, {576, 384, "d6 qkv dweight, TP 2"}};
    const int dims[] = {64, 128, 192, 256, 384, 576, 768, 1024, 1152, 1536, 2048, 2304, 3072, 4096};
    // the tiles of every build (kernels_cpu.h): the units see only tile counts, so every host checks them all
    struct Tiles { int mr, nr; const char* isa; };
    const Tiles tiles[] = {{8, 32, "AVX-512"}, {6, 16, "AVX2"}, {4, 8, "128-bit vectors"}};
    bool listed = false;
    for (const Tiles& tl : tiles) listed |= tl.mr == GEMM_MR && tl.nr == GEMM_NR;
    check(listed, "gemm units: this build's %dx%d tiles are among those checked", GEMM_MR, GEMM_NR);
    auto work = [](int MB, int NB, int mt, int nt) {  // every unit's cost summed: the span on one thread
        long busy;
        return gemm_units_span(MB, NB, mt, nt, 1, &busy);
    };
    for (int threads : {2, 3, 4, 8, 16}) {
        std::vector<std::string> lines;  // (checked on this thread, after the rank thread's work)
        std::vector<double> values, bounds;
        std::thread rank([&]() {
            cpu_pool_start(threads);
            std::vector<long> busy(threads);
            char line[256];
            if (threads == 2)
                for (const Shape& s : exact) {
                    const int MB = (s.M + GEMM_MR - 1) / GEMM_MR, NB = (s.N + GEMM_NR - 1) / GEMM_NR;
                    int mt = GEMM_MT, nt = GEMM_NT, m0 = GEMM_MT, n0 = GEMM_NT;
                    gemm_units_cpu(MB, NB, &mt, &nt);
                    gemm_units_halved(MB, NB, threads, &m0, &n0);  // the units before the search
                    const long span = gemm_units_span(MB, NB, mt, nt, threads, busy.data());
                    snprintf(line, sizeof(line), "gemm units, %s, 2 threads: %dx%d tiles (the halving alone: %dx%d, span %ld): span / the even share, bound 1.03 (the search's step)",
                             s.what, mt, nt, m0, n0, gemm_units_span(MB, NB, m0, n0, threads, busy.data()));
                    lines.push_back(line);
                    values.push_back((double)span / ((work(MB, NB, mt, nt) + 1) / 2));
                    bounds.push_back(1.03);
                }
            for (const Tiles& tl : tiles) {
                double worst = 1;
                long bad = 0, shapes = 0;
                for (int M : dims)
                    for (int N : dims) {
                        const int MB = (M + tl.mr - 1) / tl.mr, NB = (N + tl.nr - 1) / tl.nr;
                        if ((long)MB * NB < 16L * threads) continue;  // too few tiles to share evenly whatever the units
                        int mt = GEMM_MT, nt = GEMM_NT, m0 = GEMM_MT, n0 = GEMM_NT;
                        gemm_units_cpu(MB, NB, &mt, &nt);
                        gemm_units_halved(MB, NB, threads, &m0, &n0);  // the units before the search
                        const long span = gemm_units_span(MB, NB, mt, nt, threads, busy.data());
                        bad += span > gemm_units_span(MB, NB, m0, n0, threads, busy.data());
                        bad += (long)((MB + mt - 1) / mt) * ((NB + nt - 1) / nt) < 4L * threads;
                        worst = std::min(worst, (double)work(MB, NB, mt, nt) / threads / span);
                        shapes++;
                    }
                snprintf(line, sizeof(line), "gemm units, %dx%d tiles (%s), %d threads, %ld shapes: spans longer than the halving alone's, or fewer than 4 units a thread",
                         tl.mr, tl.nr, tl.isa, threads, shapes);
                lines.push_back(line);
                values.push_back((double)bad);
                bounds.push_back(0);
                snprintf(line, sizeof(line), "gemm units, %dx%d tiles (%s), %d threads, %ld shapes: the least even share, 1 - work / threads / span",
                         tl.mr, tl.nr, tl.isa, threads, shapes);
                lines.push_back(line);
                values.push_back(1 - worst);
                bounds.push_back(0.12);
            }
        });
        rank.join();
        for (size_t i = 0; i < lines.size(); i++) check_le(values[i], bounds[i], "%s", lines[i].c_str());
    }
}

// ----------------------------------------------------------------------------
// embeddings

static void test_ops_embeddings() {
    OpsRng r = {202};
    int Vl = 128, C = 48, N = 40, T = 16;
    std::vector<float> wte = ops_normals(&r, (long)Vl * C, 0, 1), wpe = ops_normals(&r, (long)T * C, 0, 1);
    std::vector<int> tok(N);
    for (auto& t : tok) t = ops_int(&r, 0, 2 * Vl - 1);  // half of them on this rank (v0 = Vl), half not
    long bad = 0;
    for (int v0 : {0, Vl}) {
        std::vector<float> out((long)N * C, NAN), want((long)N * C, 0.0f);
        encoder_forward_cpu(out.data(), tok.data(), wte.data(), v0, Vl, N, C);
        for (int n = 0; n < N; n++)
            if (tok[n] - v0 >= 0 && tok[n] - v0 < Vl)
                for (int c = 0; c < C; c++) want[n * C + c] = wte[(tok[n] - v0) * C + c];
        bad += bits_differ(out.data(), want.data(), (long)N * C);
    }
    check_le(bad, 0, "encoder_forward, v0 = 0 and %d of a 2x%d vocab: rows of wte, zeros for other ranks' tokens: floats differing", Vl, Vl);
    // position: one fp32 addition per element, correctly rounded, so exactly the rounded double sum
    bad = 0;
    for (int t0 : {0, 8, 24}) {  // SP: this rank's N rows start at token t0 of the flattened (B, T) batch
        std::vector<float> x = ops_normals(&r, (long)N * C, 0, 1), x0 = x, want((long)N * C);
        position_forward_cpu(x.data(), wpe.data(), N, t0, T, C);
        for (int n = 0; n < N; n++)
            for (int c = 0; c < C; c++) want[n * C + c] = (float)((double)x0[n * C + c] + wpe[((t0 + n) % T) * C + c]);
        bad += bits_differ(x.data(), want.data(), (long)N * C);
    }
    check_le(bad, 0, "position_forward, t0 = 0, 8, 24: x + wpe[(t0+n) %% T] against the correctly rounded sum: floats differing");
    // backward: sums over repeated tokens and positions, accumulated onto what the gradients hold
    std::vector<int> rep(N);
    for (auto& t : rep) t = ops_int(&r, 100, 170);  // v0 = 120: some rows owned, each several times
    std::vector<float> dout = ops_normals(&r, (long)N * C, 0, 1), dwte0 = ops_normals(&r, (long)Vl * C, 0, 1), dwte = dwte0;
    encoder_backward_cpu(dwte.data(), dout.data(), rep.data(), 120, Vl, N, C);
    std::vector<double> ref(dwte0.begin(), dwte0.end()), sc((long)Vl * C);
    for (long i = 0; i < (long)Vl * C; i++) sc[i] = fabs(dwte0[i]);
    for (int n = 0; n < N; n++)
        if (rep[n] - 120 >= 0 && rep[n] - 120 < Vl)
            for (int c = 0; c < C; c++) {
                ref[(rep[n] - 120) * C + c] += dout[n * C + c];
                sc[(rep[n] - 120) * C + c] += fabs(dout[n * C + c]);
            }
    check_le(scaled_err(dwte.data(), ref.data(), sc.data(), (long)Vl * C), (N + 1) * OPS_U,
             "encoder_backward, repeated tokens, v0 = 120: max error / (|dwte0| + sum|dout|), bound (N+1) u");
    double w = 0;
    for (int t0 : {0, 8}) {
        std::vector<float> dwpe0 = ops_normals(&r, (long)T * C, 0, 1), dwpe = dwpe0;
        position_backward_cpu(dwpe.data(), dout.data(), N, t0, T, C);
        std::vector<double> rp(dwpe0.begin(), dwpe0.end()), sp((long)T * C);
        for (long i = 0; i < (long)T * C; i++) sp[i] = fabs(dwpe0[i]);
        for (int n = 0; n < N; n++)
            for (int c = 0; c < C; c++) {
                rp[((t0 + n) % T) * C + c] += dout[n * C + c];
                sp[((t0 + n) % T) * C + c] += fabs(dout[n * C + c]);
            }
        w = worse(w, scaled_err(dwpe.data(), rp.data(), sp.data(), (long)T * C));
    }
    check_le(w, (N / T + 2) * OPS_U, "position_backward, N %d rows over T %d, t0 = 0, 8: max error / (|dwpe0| + sum|dout|), bound (N/T+2) u", N, T);
}

// ----------------------------------------------------------------------------
// layernorm

static void test_ops_layernorm() {
    OpsRng r = {303};
    int N = 40, C = 768;
    // rows as a trained model's residual stream has them: unit, offset, nearly constant (where eps shows:
    // a wrong eps moves rstd by about 0.5 d_eps / var, 0.045 for eps 1e-6 at std 0.01), wide, with outliers
    const double means[] = {0, 3, 0, -2, 0}, stds[] = {1, 0.5, 0.01, 30, 1};
    std::vector<float> x((long)N * C);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) x[n * C + c] = ops_normal(&r, means[n % 5], stds[n % 5]);
    for (int n = 4; n < N; n += 5) x[n * C + 7] = 60.0f, x[n * C + 300] = -45.0f;
    std::vector<float> w = ops_normals(&r, C, 1, 0.1), b = ops_normals(&r, C, 0, 0.1);
    std::vector<float> out((long)N * C), mean(N), rstd(N);
    layernorm_forward_cpu(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    std::vector<double> rm(N), rs(N), absmean(N), ro((long)N * C), so((long)N * C), rmean_err(N), rrstd_err(N);
    for (int n = 0; n < N; n++) {
        double m = 0, a = 0, v = 0;
        for (int c = 0; c < C; c++) { m += x[n * C + c]; a += fabs(x[n * C + c]); }
        m /= C;
        a /= C;
        for (int c = 0; c < C; c++) v += (x[n * C + c] - m) * (x[n * C + c] - m);
        v /= C;  // biased
        rm[n] = m;
        rs[n] = 1.0 / sqrt(v + 1e-5);
        absmean[n] = a;
        for (int c = 0; c < C; c++) {
            double xh = (x[n * C + c] - m) * rs[n];
            ro[n * C + c] = xh * w[c] + b[c];
            // the mean's rounding (<= C u mean|x|) shifts every x - mean: it enters as mean|x| rstd
            so[n * C + c] = fabs(w[c]) * (fabs(xh) + a * rs[n]) + fabs(b[c]);
        }
    }
    check_le(scaled_err(mean.data(), rm.data(), absmean.data(), N), (C + 1) * OPS_U,
             "layernorm_forward C%d mean: max error / mean|x|, bound (C+1) u", C);
    double e = 0;
    for (int n = 0; n < N; n++) e = worse(e, fabs(rstd[n] - rs[n]) / rs[n]);
    check_le(e, (C + 4) * OPS_U, "layernorm_forward C%d rstd = 1/sqrt(var + 1e-5), rows of std 0.01 to 30: max rel err, bound (C+4) u", C);
    check_le(scaled_err(out.data(), ro.data(), so.data(), (long)N * C), 2 * (C + 4) * OPS_U,
             "layernorm_forward C%d out: max error / (|w|(|xhat| + mean|x| rstd) + |b|), bound 2(C+4) u", C);
    // backward from the reference's mean and rstd (rounded to fp32, as the forward saves them)
    std::vector<float> fm(N), fr(N);
    for (int n = 0; n < N; n++) { fm[n] = (float)rm[n]; fr[n] = (float)rs[n]; }
    std::vector<float> dout = ops_normals(&r, (long)N * C, 0, 1), di0 = ops_normals(&r, (long)N * C, 0, 1), di = di0;
    std::vector<float> dw0 = ops_normals(&r, C, 0, 1), db0 = ops_normals(&r, C, 0, 1), dw = dw0, db = db0;
    layernorm_backward_cpu(di.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), fm.data(), fr.data(), N, C);
    std::vector<double> rdi((long)N * C), sdi((long)N * C), rdw(C), sdw(C), rdb(C), sdb(C);
    for (int c = 0; c < C; c++) { rdw[c] = dw0[c]; sdw[c] = fabs(dw0[c]); rdb[c] = db0[c]; sdb[c] = fabs(db0[c]); }
    for (int n = 0; n < N; n++) {
        double m = rm[n], s = rs[n], g1 = 0, g2 = 0, a1 = 0, a2 = 0, off = fabs(m) * s + 1;
        for (int c = 0; c < C; c++) {
            double xh = (x[n * C + c] - m) * s, dn = (double)w[c] * dout[n * C + c];
            g1 += dn;
            g2 += dn * xh;
            a1 += fabs(dn);
            a2 += fabs(dn) * (fabs(xh) + off);  // xhat from fp32 mean and rstd: off by up to (|m| rstd + 1) u
        }
        g1 /= C; g2 /= C; a1 /= C; a2 /= C;
        for (int c = 0; c < C; c++) {
            double xh = (x[n * C + c] - m) * s, dn = (double)w[c] * dout[n * C + c];
            rdi[n * C + c] = di0[n * C + c] + (dn - g1 - xh * g2) * s;
            sdi[n * C + c] = fabs(di0[n * C + c]) + (fabs(dn) + a1 + (fabs(xh) + off) * a2) * s;
            rdw[c] += dout[n * C + c] * xh;
            sdw[c] += fabs(dout[n * C + c]) * (fabs(xh) + off);
            rdb[c] += dout[n * C + c];
            sdb[c] += fabs(dout[n * C + c]);
        }
    }
    check_le(scaled_err(di.data(), rdi.data(), sdi.data(), (long)N * C), 2 * (C + 8) * OPS_U,
             "layernorm_backward C%d dinp +=: max error / its scale, bound 2(C+8) u", C);
    check_le(scaled_err(dw.data(), rdw.data(), sdw.data(), C), 2 * (N + 8) * OPS_U,
             "layernorm_backward N%d dw += sum dout xhat: max error / its scale, bound 2(N+8) u", N);
    check_le(scaled_err(db.data(), rdb.data(), sdb.data(), C), (N + 2) * OPS_U,
             "layernorm_backward N%d db += sum dout: max error / (|db0| + sum|dout|), bound (N+2) u", N);
}

// ----------------------------------------------------------------------------
// residual, GELU

// GPT-2's tanh GELU and its derivative in double, evaluated stably on the negative tail, where
// 1 + tanh(u) and 1 - tanh(u)^2 cancel: 0.5 (1 + tanh u) = 1 / (1 + e^-2u), sech^2 u = 4 e^-2|u| / (1 + e^-2|u|)^2
static void gelu_ref(double x, double* f, double* df, double* arg, double* t1, double* t2) {
    const double S = sqrt(2.0 / M_PI), c = 0.044715;
    double u = S * (x + c * x * x * x);
    double h = u > -3 ? 0.5 * (1.0 + tanh(u)) : 1.0 / (1.0 + exp(-2.0 * u));
    double e = exp(-2.0 * fabs(u)), sech2 = 4.0 * e / ((1.0 + e) * (1.0 + e));
    *f = x * h;
    *t1 = h;
    *t2 = x * 0.5 * sech2 * S * (1.0 + 3.0 * c * x * x);
    *df = *t1 + *t2;
    *arg = 2.0 * u;
}

static void test_ops_residual_gelu() {
    OpsRng r = {404};
    int N = 33, C = 100;
    std::vector<float> res = ops_normals(&r, (long)N * C, 0, 10), x = ops_normals(&r, (long)N * C, 0, 1), b = ops_normals(&r, C, 0, 0.1),
                       out((long)N * C);
    residual_forward_cpu(out.data(), res.data(), x.data(), b.data(), N, C);
    std::vector<double> ref((long)N * C), sc((long)N * C);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            long i = (long)n * C + c;
            ref[i] = (double)res[i] + x[i] + b[c];
            sc[i] = fabs(res[i]) + fabs(x[i]) + fabs(b[c]);
        }
    check_le(scaled_err(out.data(), ref.data(), sc.data(), (long)N * C), 2 * OPS_U,
             "residual_forward res + (x + bias): max error / (|res|+|x|+|b|), bound 2 u (two roundings)");
    // GELU: a fine grid over [-12, 12], pre-activations as a trained model has them, and extremes to
    // +-1e4 where exp leaves its range (beyond |x| ~ 1e11, x^3 e^-87 is no longer 0 and the backward errs)
    std::vector<float> g;
    for (int i = 0; i <= 4800; i++) g.push_back((float)(-12.0 + i * 0.005));
    for (int i = 0; i < 3000; i++) g.push_back(ops_normal(&r, 0, 3));
    for (float e : {30.f, -30.f, 100.f, -100.f, 1e4f, -1e4f, 0.0f, -0.0f}) g.push_back(e);
    long n = (long)g.size();
    std::vector<float> f(n), dout = ops_normals(&r, n, 0, 1), df(n), df_inplace = dout;
    gelu_forward_cpu(f.data(), g.data(), n);
    gelu_backward_cpu(df.data(), g.data(), dout.data(), n);
    gelu_backward_cpu(df_inplace.data(), g.data(), df_inplace.data(), n);
    std::vector<double> rf(n), sf(n), rd(n), sd(n);
    for (long i = 0; i < n; i++) {
        double fv, dv, arg, t1, t2;
        gelu_ref(g[i], &fv, &dv, &arg, &t1, &t2);
        // exp's argument is rounded to a few u of itself: the result moves by up to |arg| times that
        double k = 1.0 + std::min(fabs(arg), 100.0);
        rf[i] = fv;
        sf[i] = k * fabs(fv);
        rd[i] = dv * dout[i];
        sd[i] = k * (fabs(t1) + fabs(t2)) * fabs(dout[i]);
    }
    // floor 1e-18 (an absolute slack of 16 u 1e-18 ~ 1e-24): on the far negative tail exp_fast stops at
    // e^-87 while the true value keeps falling, so x e^-87 (x^3 e^-87 in the backward) stands for less still
    check_le(scaled_err(f.data(), rf.data(), sf.data(), n, 1e-18), 16 * OPS_U,
             "gelu_forward over [-12, 12] and extremes to 1e4: max error / ((1 + |2u|) |gelu|), bound 16 u");
    check_le(scaled_err(df.data(), rd.data(), sd.data(), n, 1e-18), 16 * OPS_U,
             "gelu_backward: max error / ((1 + |2u|) (|0.5(1+tanh)| + |x 0.5 sech^2 ...|) |dout|), bound 16 u");
    check_le(bits_differ(df_inplace.data(), df.data(), n), 0, "gelu_backward in place (dinp = dout): floats differing from out of place");
}

// ----------------------------------------------------------------------------
// attention

// Scores that reach +-300: q and k are small integers (scaled by 1/4 in the gentle head), so q.k is exact
// in fp32 and so is the scale 1/sqrt(64) = 1/8; what remains is the softmax's own error, which is then
// held to (T + 8) u. Softmax without its max subtraction clamps exp at e^88 and e^-87: probabilities off by O(1).
// qkv (B, T, 3*NH*hs) of integers (over 4 for the first of every 3 heads), so that the scores are exact:
// heads h with h % 3 = 0, 1, 2 have scores up to about 2, 30 and 300. low_row: head 2 of row 1 has every
// score near -256, a whole row below exp's range.
static std::vector<float> ops_attention_qkv(OpsRng* r, int B, int T, int NH, int hs, bool low_row) {
    int C = NH * hs, C3 = 3 * C;
    std::vector<float> qkv((long)B * T * C3);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++)
                for (int i = 0; i < hs; i++) {
                    float* row = qkv.data() + ((long)b * T + t) * C3;
                    int lim = h % 3 == 0 ? 2 : h % 3 == 1 ? 4 : 16;
                    float div = h % 3 == 0 ? 4.0f : 1.0f;
                    row[h * hs + i] = ops_int(r, -lim, lim) / div;
                    row[C + h * hs + i] = ops_int(r, -lim, lim) / div;
                    row[2 * C + h * hs + i] = ops_normal(r, 0, 1);
                    if (low_row && b == 1 && h == 2) {
                        row[h * hs + i] = -4.0f;
                        row[C + h * hs + i] = (float)(8 + ops_int(r, -2, 2));
                    }
                }
    return qkv;
}

static void test_ops_attention() {
    OpsRng r = {505};
    int B = 2, T = 48, NH = 3, hs = 64, C = NH * hs, C3 = 3 * C;
    std::vector<float> qkv = ops_attention_qkv(&r, B, T, NH, hs, true);
    std::vector<float> out((long)B * T * C), att((long)B * NH * T * T), probs((long)B * NH * T * T, NAN);
    attention_forward_cpu(out.data(), att.data(), qkv.data(), B, T, NH, hs);
    attention_probs_cpu(probs.data(), qkv.data(), B, T, NH, hs);
    std::vector<double> P((long)B * NH * T * T, 0.0), sP((long)B * NH * T * T), ro((long)B * T * C), so((long)B * T * C);
    double smax = 0, smin = 0;
    long masked = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            auto Q = [&](int t, int i) { return (double)qkv[((long)b * T + t) * C3 + h * hs + i]; };
            auto K = [&](int t, int i) { return (double)qkv[((long)b * T + t) * C3 + C + h * hs + i]; };
            auto Vv = [&](int t, int i) { return (double)qkv[((long)b * T + t) * C3 + 2 * C + h * hs + i]; };
            double* p = &P[((long)b * NH + h) * T * T];
            for (int t = 0; t < T; t++) {
                std::vector<double> s(t + 1);
                double mx = -1e300, z = 0;
                for (int u = 0; u <= t; u++) {
                    double d = 0;
                    for (int i = 0; i < hs; i++) d += Q(t, i) * K(u, i);
                    s[u] = d / sqrt((double)hs);
                    mx = std::max(mx, s[u]);
                    smax = std::max(smax, s[u]);
                    smin = std::min(smin, s[u]);
                }
                for (int u = 0; u <= t; u++) z += exp(s[u] - mx);
                for (int u = 0; u <= t; u++) p[t * T + u] = exp(s[u] - mx) / z;
                for (int u = t + 1; u < T; u++) masked += att[((long)b * NH + h) * T * T + t * T + u] != 0.0f;
                for (int i = 0; i < hs; i++) {
                    double y = 0, a = 0;
                    for (int u = 0; u <= t; u++) { y += p[t * T + u] * Vv(u, i); a += p[t * T + u] * fabs(Vv(u, i)); }
                    ro[((long)b * T + t) * C + h * hs + i] = y;
                    so[((long)b * T + t) * C + h * hs + i] = a;
                }
            }
        }
    for (long i = 0; i < (long)P.size(); i++) sP[i] = P[i];
    // floor 1e-30: a probability below e^-87 (the clamp of exp_fast) comes out as e^-87 / sum, not 0
    check_le(scaled_err(att.data(), P.data(), sP.data(), (long)P.size(), 1e-30), (T + 8) * OPS_U,
             "attention_forward probabilities, scores from %.0f to %.0f: max |p - ref| / ref, bound (T+8) u", smin, smax);
    check_le(masked, 0, "attention_forward: probabilities above the diagonal that are not 0");
    check_le(bits_differ(probs.data(), att.data(), (long)att.size()), 0, "attention_probs against attention_forward's att: floats differing");
    check_le(scaled_err(out.data(), ro.data(), so.data(), (long)out.size()), (2 * T + 8) * OPS_U,
             "attention_forward out = P v: max error / sum p|v|, bound (2T+8) u");
    // backward, from the op's own probabilities as the recipe saves them
    std::vector<float> dout = ops_normals(&r, (long)B * T * C, 0, 1), dqkv((long)B * T * C3, NAN);
    attention_backward_cpu(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, NH, hs);
    std::vector<double> rg((long)B * T * C3, 0.0), sg((long)B * T * C3, 0.0);
    double isq = 1.0 / sqrt((double)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const double* p = &P[((long)b * NH + h) * T * T];
            auto at = [&](int t, int which, int i) { return ((long)b * T + t) * C3 + which * C + h * hs + i; };
            auto D = [&](int t, int i) { return (double)dout[((long)b * T + t) * C + h * hs + i]; };
            std::vector<double> dS((long)T * T, 0.0), aS((long)T * T, 0.0);
            for (int t = 0; t < T; t++) {
                std::vector<double> dP(t + 1), aP(t + 1);
                double dot = 0, adot = 0;
                for (int u = 0; u <= t; u++) {
                    double s = 0, a = 0;
                    for (int i = 0; i < hs; i++) { s += D(t, i) * qkv[at(u, 2, i)]; a += fabs(D(t, i) * qkv[at(u, 2, i)]); }
                    dP[u] = s;
                    aP[u] = a;
                    dot += p[t * T + u] * s;
                    adot += p[t * T + u] * a;
                }
                for (int u = 0; u <= t; u++) {
                    dS[t * T + u] = p[t * T + u] * (dP[u] - dot) * isq;
                    aS[t * T + u] = p[t * T + u] * (aP[u] + adot) * isq;
                }
            }
            for (int t = 0; t < T; t++)
                for (int i = 0; i < hs; i++) {
                    double dq = 0, aq = 0, dk = 0, ak = 0, dv = 0, av = 0;
                    for (int u = 0; u < T; u++) {
                        dq += dS[t * T + u] * qkv[at(u, 1, i)];
                        aq += aS[t * T + u] * fabs(qkv[at(u, 1, i)]);
                        dk += dS[u * T + t] * qkv[at(u, 0, i)];
                        ak += aS[u * T + t] * fabs(qkv[at(u, 0, i)]);
                        dv += p[u * T + t] * D(u, i);
                        av += p[u * T + t] * fabs(D(u, i));
                    }
                    rg[at(t, 0, i)] = dq; sg[at(t, 0, i)] = aq;
                    rg[at(t, 1, i)] = dk; sg[at(t, 1, i)] = ak;
                    rg[at(t, 2, i)] = dv; sg[at(t, 2, i)] = av;
                }
        }
    const char* names[] = {"dq", "dk", "dv"};
    for (int which = 0; which < 3; which++) {
        double w = 0;
        for (long n = 0; n < (long)B * T; n++) {
            long o = n * C3 + which * C;
            w = worse(w, scaled_err(dqkv.data() + o, rg.data() + o, sg.data() + o, C, 1e-30));
        }
        check_le(w, (2 * T + hs + 16) * OPS_U, "attention_backward %s: max error / its scale (the same sums over |terms|), bound (2T+hs+16) u",
                 names[which]);
    }
}

// Fused attention (attention_fused_forward/backward) against the materialised ops and a float64
// reference, at the tile edges (T = 1, 2, 63, 64, 65, 127, 256, 1024 against 64-wide tiles), 1 to 12
// heads, head sizes 16, 64, 128. q and k are small integers (quarters in one head of three) as above,
// so q.k is exact and only the 1/sqrt(hs) scale rounds (exactly representable for hs 16 and 64): scores
// reach about 2, 30 and 300. Bounds, with S = the largest |score| of the case and L the largest |lse|:
//   lse:  (T + 2 NT + 8 + 2 S + L) u absolute: a sum of T exps, NT = T/64 rescales, the rounded scale
//         and the last add m + log l;
//   out:  (2T + 8 + 4 S) u of sum p|v| (the materialised bound plus the scores' rounding through exp);
//   dq, dk, dv: (2T + hs + 16 + 4 S + 4 L) u of their sums over |terms|: P is exp(s - lse) again, so
//         lse's rounding enters every probability. Fused against materialised: the two bounds added.
static void test_ops_attention_fused() {
    OpsRng r = {515};
    struct { int B, T, NH, hs; } cases[] = {{1, 1, 1, 16}, {2, 2, 12, 64}, {1, 63, 3, 128}, {2, 64, 5, 16}, {1, 65, 7, 64},
                                            {1, 127, 2, 128}, {1, 63, 9, 16}, {1, 65, 10, 16}, {1, 127, 11, 16},
                                            {1, 64, 8, 64}, {2, 256, 4, 64}, {1, 256, 6, 16}, {1, 1024, 1, 128}, {1, 1024, 2, 16}};
    for (auto& k : cases) {
        int B = k.B, T = k.T, NH = k.NH, hs = k.hs, C = NH * hs, C3 = 3 * C, NT = (T + ATT_TILE - 1) / ATT_TILE;
        std::vector<float> qkv = ops_attention_qkv(&r, B, T, NH, hs, false);
        long nO = (long)B * T * C, nL = (long)B * NH * T;
        std::vector<float> dout = ops_normals(&r, nO, 0, 1);
        std::vector<float> out_f(nO, NAN), lse(nL, NAN), dsum(nL, NAN), dqkv_f(qkv.size(), NAN);
        std::vector<float> out_m(nO, NAN), att((long)B * NH * T * T), dqkv_m(qkv.size(), NAN);
        attention_fused_forward_cpu(out_f.data(), lse.data(), qkv.data(), B, T, NH, hs);
        attention_fused_backward_cpu(dqkv_f.data(), dsum.data(), dout.data(), qkv.data(), Input{out_f.data(), nullptr}, lse.data(), B, T, NH, hs);
        attention_forward_cpu(out_m.data(), att.data(), qkv.data(), B, T, NH, hs);
        attention_backward_cpu(dqkv_m.data(), dout.data(), qkv.data(), att.data(), B, T, NH, hs);
        // float64: lse, out and its scale, the gradients and their scales
        std::vector<double> rl(nL), ro(nO), so(nO), rg(qkv.size()), sg(qkv.size());
        double S = 0, L = 0, isq = 1.0 / sqrt((double)hs);
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++) {
                auto at = [&](int t, int which, int i) { return ((long)b * T + t) * C3 + which * C + h * hs + i; };
                auto D = [&](int t, int i) { return (double)dout[((long)b * T + t) * C + h * hs + i]; };
                std::vector<double> p((long)T * T, 0.0), dS((long)T * T, 0.0), aS((long)T * T, 0.0);
                for (int t = 0; t < T; t++) {
                    double mx = -1e300, z = 0;
                    for (int u = 0; u <= t; u++) {
                        double d = 0;
                        for (int i = 0; i < hs; i++) d += (double)qkv[at(t, 0, i)] * qkv[at(u, 1, i)];
                        p[(long)t * T + u] = d * isq;
                        mx = std::max(mx, d * isq);
                        S = std::max(S, fabs(d * isq));
                    }
                    for (int u = 0; u <= t; u++) z += exp(p[(long)t * T + u] - mx);
                    rl[((long)b * NH + h) * T + t] = mx + log(z);
                    L = std::max(L, fabs(mx + log(z)));
                    for (int u = 0; u <= t; u++) p[(long)t * T + u] = exp(p[(long)t * T + u] - mx) / z;
                    for (int i = 0; i < hs; i++) {
                        double y = 0, a = 0;
                        for (int u = 0; u <= t; u++) { y += p[(long)t * T + u] * qkv[at(u, 2, i)]; a += p[(long)t * T + u] * fabs(qkv[at(u, 2, i)]); }
                        ro[((long)b * T + t) * C + h * hs + i] = y;
                        so[((long)b * T + t) * C + h * hs + i] = a;
                    }
                    double dot = 0, adot = 0;
                    std::vector<double> dP(t + 1), aP(t + 1);
                    for (int u = 0; u <= t; u++) {
                        double s = 0, a = 0;
                        for (int i = 0; i < hs; i++) { s += D(t, i) * qkv[at(u, 2, i)]; a += fabs(D(t, i) * qkv[at(u, 2, i)]); }
                        dP[u] = s;
                        aP[u] = a;
                        dot += p[(long)t * T + u] * s;
                        adot += p[(long)t * T + u] * a;
                    }
                    for (int u = 0; u <= t; u++) {
                        dS[(long)t * T + u] = p[(long)t * T + u] * (dP[u] - dot) * isq;
                        aS[(long)t * T + u] = p[(long)t * T + u] * (aP[u] + adot) * isq;
                    }
                }
                for (int t = 0; t < T; t++) {
                    std::vector<double> g(3 * hs, 0.0), a(3 * hs, 0.0);
                    for (int u = 0; u <= t; u++)  // dq: keys u <= t
                        for (int i = 0; i < hs; i++) { g[i] += dS[(long)t * T + u] * qkv[at(u, 1, i)]; a[i] += aS[(long)t * T + u] * fabs(qkv[at(u, 1, i)]); }
                    for (int u = t; u < T; u++)  // dk, dv: queries u >= t
                        for (int i = 0; i < hs; i++) {
                            g[hs + i] += dS[(long)u * T + t] * qkv[at(u, 0, i)];
                            a[hs + i] += aS[(long)u * T + t] * fabs(qkv[at(u, 0, i)]);
                            g[2 * hs + i] += p[(long)u * T + t] * D(u, i);
                            a[2 * hs + i] += p[(long)u * T + t] * fabs(D(u, i));
                        }
                    for (int w = 0; w < 3; w++)
                        for (int i = 0; i < hs; i++) { rg[at(t, w, i)] = g[w * hs + i]; sg[at(t, w, i)] = a[w * hs + i]; }
                }
            }
        char s[64];
        snprintf(s, sizeof(s), "B=%d T=%d NH=%d hs=%d (S %.0f, L %.0f)", B, T, NH, hs, S, L);
        double b_lse = (T + 2 * NT + 8 + 2 * S + L) * OPS_U, b_out = (2 * T + 8 + 4 * S) * OPS_U;
        double b_grad = (2 * T + hs + 16 + 4 * S + 4 * L) * OPS_U, b_grad_m = (2 * T + hs + 16 + 4 * S) * OPS_U;
        double w = 0;
        for (long i = 0; i < nL; i++) w = worse(w, fabs((double)lse[i] - rl[i]));
        check_le(w, b_lse, "attention_fused %-38s lse: max |lse - ref|, bound (T + 2NT + 8 + 2S + L) u", s);
        check_le(scaled_err(out_f.data(), ro.data(), so.data(), nO), b_out, "attention_fused %-38s out: max error / sum p|v|, bound (2T+8+4S) u", s);
        std::vector<double> om(out_m.begin(), out_m.end());
        check_le(scaled_err(out_f.data(), om.data(), so.data(), nO), 2 * b_out, "attention_fused %-38s out against attention_forward's, bound 2 (2T+8+4S) u", s);
        const char* names[] = {"dq", "dk", "dv"};
        std::vector<double> gm(dqkv_m.begin(), dqkv_m.end());
        for (int which = 0; which < 3; which++) {
            double wr = 0, wm = 0;
            for (long n = 0; n < (long)B * T; n++) {
                long o = n * C3 + which * C;
                wr = worse(wr, scaled_err(dqkv_f.data() + o, rg.data() + o, sg.data() + o, C, 1e-30));
                wm = worse(wm, scaled_err(dqkv_f.data() + o, gm.data() + o, sg.data() + o, C, 1e-30));
            }
            check_le(wr, b_grad, "attention_fused %-38s %s: max error / its scale, bound (2T+hs+16+4S+4L) u", s, names[which]);
            check_le(wm, b_grad + b_grad_m, "attention_fused %-38s %s against attention_backward's, the two bounds added", s, names[which]);
        }
    }
    // bit-identical at any thread count: the forward and backward at 1, 2, 3 and 5 threads of a rank (6
    // heads: up to 3 threads the backward's one pass per head, at 5 its two passes by tiles)
    int B = 2, T = 200, NH = 3, hs = 64, C = NH * hs;
    std::vector<float> qkv = ops_normals(&r, (long)B * T * 3 * C, 0, 2), dout = ops_normals(&r, (long)B * T * C, 0, 1);
    auto run = [&](int nt) {
        std::vector<float> res((long)B * T * C + (long)B * NH * T + (long)B * T * 3 * C), dsum((long)B * NH * T);
        std::thread th([&]() {
            cpu_pool_start(nt);
            float *o = res.data(), *l = o + (long)B * T * C, *g = l + (long)B * NH * T;
            attention_fused_forward_cpu(o, l, qkv.data(), B, T, NH, hs);
            attention_fused_backward_cpu(g, dsum.data(), dout.data(), qkv.data(), Input{o, nullptr}, l, B, T, NH, hs);
        });
        th.join();
        return res;
    };
    std::vector<float> one = run(1);
    for (int nt : {2, 3, 5}) {
        std::vector<float> many = run(nt);
        check_le(bits_differ(many.data(), one.data(), (long)one.size()), 0,
                 "attention_fused out, lse, dqkv (B=%d T=%d NH=%d) at %d threads (backward %s) against 1: floats differing", B, T, NH,
                 nt, B * NH >= 2 * nt ? "per head" : "by tiles");
    }
}

// ----------------------------------------------------------------------------
// cross-entropy, vocab-parallel

static void test_ops_crossentropy() {
    OpsRng r = {606};
    // V 250 split in 3 leaves the last rank only padding columns: its max is -FLT_MAX, its sum 0
    for (int V : {300, 250}) {
        int N = 25, Vp = 384;
        // rows: ordinary logits, logits near +5000 and -8000 (exp of them overflows in float and double alike),
        // one spread over [-1e4, 1e4], and rows whose target is far below the max
        std::vector<float> full((long)N * Vp);
        std::vector<int> tgt(N);
        for (int n = 0; n < N; n++) {
            for (int v = 0; v < Vp; v++) {
                float l;
                switch (n % 5) {
                    case 0: l = ops_normal(&r, 0, 3); break;
                    case 1: l = ops_normal(&r, 5000, 20); break;
                    case 2: l = ops_normal(&r, -8000, 20); break;
                    case 3: l = (float)(-1e4 + 2e4 * ops_uniform(&r)); break;
                    default: l = ops_normal(&r, 1000, 5); break;
                }
                full[(long)n * Vp + v] = v < V ? l : NAN;  // padded columns are never read
            }
            tgt[n] = ops_int(&r, 0, V - 1);
            if (n % 5 == 4) full[(long)n * Vp + tgt[n]] = 900.0f;  // loss about 100
        }
        std::vector<double> rloss(N), sloss(N), rd((long)N * Vp), sd((long)N * Vp), rmax(N);
        double dscale = 1.0 / N;
        for (int n = 0; n < N; n++) {
            const float* l = &full[(long)n * Vp];
            double mx = -1e300, z = 0;
            for (int v = 0; v < V; v++) mx = std::max(mx, (double)l[v]);
            for (int v = 0; v < V; v++) z += exp(l[v] - mx);
            rmax[n] = mx;
            rloss[n] = log(z) - (l[tgt[n]] - mx);
            sloss[n] = 1.0 + fabs(log(z)) + fabs(l[tgt[n]] - mx);
            for (int v = 0; v < Vp; v++) {
                double p = v < V ? exp(l[v] - mx) / z : 0.0, o = v == tgt[n] ? 1.0 : 0.0;
                rd[(long)n * Vp + v] = (p - o) * dscale;
                sd[(long)n * Vp + v] = (p + o) * dscale;
            }
        }
        for (int P : {1, 2, 3}) {  // the vocab split over P ranks of Vl columns, combined as the recipe's all-reduces do
            int Vl = Vp / P;
            std::vector<std::vector<float>> lg(P), mx(P, std::vector<float>(N)), sums(P, std::vector<float>(2 * N));
            std::vector<float> gmax(N, -FLT_MAX), gsum(2 * N, 0.0f), loss(N), dl((long)N * Vp);
            for (int q = 0; q < P; q++) {
                lg[q].resize((long)N * Vl);
                for (int n = 0; n < N; n++) memcpy(&lg[q][(long)n * Vl], &full[(long)n * Vp + q * Vl], Vl * sizeof(float));
                crossentropy_max_cpu(mx[q].data(), lg[q].data(), N, Vl, q * Vl, V);
                for (int n = 0; n < N; n++) gmax[n] = std::max(gmax[n], mx[q][n]);
            }
            for (int q = 0; q < P; q++) {
                crossentropy_sums_cpu(sums[q].data(), lg[q].data(), gmax.data(), tgt.data(), N, Vl, q * Vl, V);
                for (int i = 0; i < 2 * N; i++) gsum[i] += sums[q][i];
            }
            long bad = 0;
            double sum_err = 0;
            for (int n = 0; n < N; n++) {
                bad += (double)gmax[n] != rmax[n];
                bad += gsum[2 * n + 1] != full[(long)n * Vp + tgt[n]];
                for (int q = 0; q < P; q++) bad += q * Vl >= V && (mx[q][n] != -FLT_MAX || sums[q][2 * n] != 0.0f);
                double z = 0;
                for (int v = 0; v < V; v++) z += exp((double)full[(long)n * Vp + v] - rmax[n]);
                sum_err = worse(sum_err, fabs(gsum[2 * n] - z) / z);
            }
            for (int q = 0; q < P; q++) {
                crossentropy_finish_cpu(loss.data(), lg[q].data(), gmax.data(), gsum.data(), tgt.data(), N, Vl, q * Vl, V, (float)dscale);
                for (int n = 0; n < N; n++) memcpy(&dl[(long)n * Vp + q * Vl], &lg[q][(long)n * Vl], Vl * sizeof(float));
            }
            check_le(bad, 0, "crossentropy V%d P=%d of Vp %d (NaN in the padding): maxes, target logits, padding-only ranks not exact", V, P, Vp);
            check_le(sum_err, (Vp / P + P + 4) * OPS_U, "crossentropy_sums V%d P=%d, logits to +-1e4: sum of exp(l - max), max rel err, bound (Vl+P+4) u",
                     V, P);
            check_le(scaled_err(loss.data(), rloss.data(), sloss.data(), N), (Vp / P + P + 8) * OPS_U,
                     "crossentropy_finish V%d P=%d loss: max error / (1 + |log sum| + |l_t - max|), bound (Vl+P+8) u", V, P);
            check_le(scaled_err(dl.data(), rd.data(), sd.data(), (long)N * Vp, 1e-30), (Vp / P + P + 8) * OPS_U,
                     "crossentropy_finish V%d P=%d dlogits = (p - onehot)/N, 0 in the padding: max error / ((p + onehot)/N), bound (Vl+P+8) u", V, P);
        }
    }
}

// ----------------------------------------------------------------------------
// AdamW, sum of squares

static void test_ops_adamw() {
    OpsRng r = {707};
    long n = 5000;
    struct { int t; float beta2, clip; double norm2[2]; } cases[] = {
        {1, 0.95f, 1.0f, {0.25, 0.25}}, {2, 0.999f, 0.0f, {9, 7}}, {10, 0.95f, 1.0f, {3, 1}}, {10, 0.999f, 1.0f, {0.5, 0}}, {1000, 0.95f, 0.0f, {1, 1}}};
    for (auto& c : cases) {
        float lr = 1e-3f, beta1 = 0.9f, beta2 = c.beta2, eps = 1e-8f, wd = 0.1f;
        std::vector<float> p = ops_normals(&r, n, 0, 0.02), g = ops_normals(&r, n, 0, 0.01), m(n, 0.0f), v(n, 0.0f);
        for (long i = 0; i < n; i += 97) g[i] = 0.0f;
        if (c.t > 1)
            for (long i = 0; i < n; i++) {
                m[i] = ops_normal(&r, 0, 0.01);
                v[i] = (float)((double)m[i] * m[i] + 1e-4 * ops_uniform(&r));
            }
        std::vector<float> p0 = p, m0 = m, v0 = v, norm2 = {(float)c.norm2[0], (float)c.norm2[1]};
        adamw_cpu(p.data(), g.data(), m.data(), v.data(), n, lr, beta1, beta2, eps, wd, c.t, norm2.data(), c.clip);
        double norm = sqrt((double)norm2[0] + norm2[1]), gs = c.clip > 0 && norm > c.clip ? c.clip / norm : 1.0;
        double bc1 = 1.0 - pow((double)beta1, c.t), bc2 = 1.0 - pow((double)beta2, c.t);
        std::vector<double> rm(n), sm(n), rv(n), sv(n);
        double step_err = 0;
        for (long i = 0; i < n; i++) {
            double gi = g[i] * gs;
            rm[i] = beta1 * (double)m0[i] + (1.0 - beta1) * gi;
            sm[i] = beta1 * fabs((double)m0[i]) + (1.0 - beta1) * fabs(gi);
            rv[i] = beta2 * (double)v0[i] + (1.0 - beta2) * gi * gi;
            sv[i] = rv[i];
            double step = lr * ((rm[i] / bc1) / (sqrt(rv[i] / bc2) + eps) + wd * (double)p0[i]), pr = p0[i] - step;
            // the error beyond the rounding of p itself, in units of the step
            step_err = worse(step_err, std::max(0.0, fabs(p[i] - pr) - OPS_U * fabs(pr)) / fabs(step));
        }
        // the step's inputs: the moments (4 u), powf(beta, t) rounded to u and then 1 - beta^t, which
        // loses beta^t / (1 - beta^t) of it (for the square root, half), and a few roundings more
        double kb = pow((double)beta1, c.t) / bc1 + 0.5 * pow((double)beta2, c.t) / bc2, bound = (16 + 2 * kb) * OPS_U;
        check_le(scaled_err(m.data(), rm.data(), sm.data(), n, 1e-30), 4 * OPS_U,
                 "adamw t=%-4d beta2 %.3f clip %.0f (norm %.2f): m, max error / (b1|m| + (1-b1)|g|), bound 4 u", c.t, beta2, c.clip, norm);
        check_le(scaled_err(v.data(), rv.data(), sv.data(), n, 1e-30), 6 * OPS_U, "adamw t=%-4d beta2 %.3f clip %.0f: v, max rel err, bound 6 u", c.t,
                 beta2, c.clip);
        check_le(step_err, bound, "adamw t=%-4d beta2 %.3f clip %.0f: weights, max error beyond p's rounding / |step|, bound (16 + 2 kappa_bc) u",
                 c.t, beta2, c.clip);
    }
}

static void test_ops_sumsq() {
    OpsRng r = {808};
    double w = 0;
    for (long n : {1L, 4095L, 4096L, 10001L}) {  // one block, a full one, several with a ragged end
        std::vector<float> x(n);
        for (long i = 0; i < n; i++) x[i] = ops_normal(&r, 0, pow(10.0, ops_int(&r, -3, 3)));
        float norm2[2] = {0.5f, 7.0f};
        sumsq_cpu(norm2, x.data(), n);
        double ref = 0.5;
        for (float xi : x) ref += (double)xi * xi;
        w = worse(w, fabs(norm2[0] - ref) / ref);
        w = worse(w, norm2[1] == 7.0f ? 0.0 : INFINITY);
    }
    check_le(w, 2 * OPS_U * (1 + 1e-6), "sumsq n = 1, 4095, 4096, 10001, |x| from 1e-3 to 1e3: (0.5 + sum x^2) rel err, bound 2 u (the "
             "double sum rounded to fp32, then added)");
}

static void test_ops() {
    printf("CPU ops against float64 references (u = 2^-24; bounds (K + a few) u for a reduction of K terms)\n");
    test_ops_matmul();
    test_ops_gemm();
    test_ops_gemm_units();
    test_ops_embeddings();
    test_ops_layernorm();
    test_ops_residual_gelu();
    test_ops_attention();
    test_ops_attention_fused();
    test_ops_crossentropy();
    test_ops_adamw();
    test_ops_sumsq();
}

// ----------------------------------------------------------------------------
// the harness itself: a NaN anywhere fails a bounded check. The predicates are called directly, so a
// NaN that is rightly refused counts as this test passing, not as a failure in the closing line.

// ./test_tp child-tmpdir HOW: makes the scratch folder, prints it, and ends: "fail" returns 1 from main
// as a failed run does, "fatal" ends as fatal() does (_Exit, no clean-up)
static int child_tmpdir(const char* how) {
    printf("%s\n", tmpdir().c_str());
    fflush(stdout);
    if (!strcmp(how, "fatal")) _Exit(1);
    return 1;
}

static bool dir_exists(const std::string& p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// runs a shell command line, returns its exit status and its output (stdout and stderr)
static int shell_out(const std::string& cmd, std::string* out) {
    std::string path = tmpdir() + "/shell_out.txt";
    int rc = system(("(" + cmd + ") >" + path + " 2>&1 </dev/null").c_str());
    std::vector<char> b = slurp_bytes(path);
    if (out) *out = std::string(b.begin(), b.end());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void test_harness() {
    printf("harness: a NaN fails every bounded check and every worst-of; the scratch folder is removed\n");
    const double nan = NAN;
    check(!within(nan, 1e-5) && !within(1e-6, nan) && !within(nan, INFINITY) && within(0, 0) && within(1e-6, 1e-5) && !within(2e-5, 1e-5),
          "within (check_le's predicate): NaN <= 1e-5, 1e-6 <= NaN and NaN <= inf are false; 0 <= 0 and 1e-6 <= 1e-5 true");
    double a = worse(worse(worse(0, 1), nan), 2), b = worse(worse(nan, 0), 5);
    check(a != a && b != b && worse(1, 3) == 3 && worse(3, 1) == 3, "worse(): a NaN at the start or in the middle of a worst-of stays NaN");
    float x[4] = {1, 2, 3, 4}, y[4] = {1, 2, NAN, 4}, z[4] = {1, 2, 3, 4};
    double e1 = rel_err(y, x, 4), e2 = rel_err(x, y, 4), e3 = rel_err(x, z, 4);
    check(e1 != e1 && e2 != e2 && e3 == 0, "rel_err: a NaN in either argument gives NaN (%g, %g), equal tensors 0", e1, e2);
    std::vector<float> vx(x, x + 4), vy(y, y + 4);
    double m1 = max_abs_diff(vy, vx), m2 = max_abs_diff(vx, vy);
    check(m1 != m1 && m2 != m2, "max_abs_diff: a NaN in either argument gives NaN (%g, %g)", m1, m2);
    double ref[4] = {1, 2, 3, 4}, sc[4] = {1, 1, 1, 1};
    double s1 = scaled_err(y, ref, sc, 4), s2 = scaled_err(x, ref, sc, 4);
    check(s1 != s1 && s2 == 0, "scaled_err: a NaN output gives NaN (%g), an exact one 0", s1);
    std::vector<float> gg = {1, NAN}, cc = {1, NAN};
    double g1 = gpu_rel_err(gg, cc);
    check(g1 != g1, "gpu_rel_err: NaN where both hold NaN gives NaN (%g), not a pass", g1);
    // the scratch folder: removed when a failing run ends, kept with TP_KEEP_TEST_DIRS=1, and a folder left
    // by a run that could not clean up (fatal()'s _Exit) is removed by the next run
    std::string self = std::string(g_argv0);
    std::string out;
    shell_out("env -u TP_KEEP_TEST_DIRS " + self + " child-tmpdir fail", &out);
    std::string d1 = out.substr(0, out.find('\n'));
    check(d1.find("/tmp/tp_test_") == 0 && !dir_exists(d1), "a failing run removes its folder %s", d1.c_str());
    shell_out("TP_KEEP_TEST_DIRS=1 " + self + " child-tmpdir fail", &out);
    std::string d2 = out.substr(0, out.find('\n'));
    bool kept = d2.find("/tmp/tp_test_") == 0 && dir_exists(d2) && out.find("test files kept in " + d2) != std::string::npos;
    check(kept, "TP_KEEP_TEST_DIRS=1 keeps it and says so: %s", d2.c_str());
    if (kept) shell_out("rm -rf '" + d2 + "'", nullptr);
    shell_out("env -u TP_KEEP_TEST_DIRS " + self + " child-tmpdir fatal", &out);
    std::string d3 = out.substr(0, out.find('\n'));
    bool left = d3.find("/tmp/tp_test_") == 0 && dir_exists(d3);
    struct utimbuf old = {time(nullptr) - 3600, time(nullptr) - 3600};  // the sweep spares folders younger than 2 minutes
    if (left) utime(d3.c_str(), &old);
    shell_out("env -u TP_KEEP_TEST_DIRS " + self + " child-tmpdir fail", &out);
    check(left && !dir_exists(d3), "a folder left by _Exit (%s) is swept by the next run", d3.c_str());
}

// ----------------------------------------------------------------------------
// resume across shard boundaries and epochs, shuffled

static void test_resume_epoch() {
    printf("resume with shuffling across shards and epochs: bit-identical to the run that was not interrupted\n");
    std::string d = tmpdir() + "/repoch";
    mkdir(d.c_str(), 0755);
    // -b 2 -t 16: a sample is 32 tokens; shards of 5, 3 and 4 samples, so an epoch is 12 steps, and the
    // shard sizes differ so a loader that forgets its random state draws a different count of numbers
    int samples[3] = {5, 3, 4};
    for (int s = 0; s < 3; s++) write_tokens(d + "/shard_00" + std::to_string(s) + ".bin", random_tokens(samples[s] * 32 + 1, 256, 40 + s));
    std::string base = "-e L1C32H2 --vocab 256 -i '" + d + "/shard_*.bin' -j " + d + "/shard_000.bin -b 2 -t 16 -x 30 -v 0 -g 0 --threads 1 "
                       "--shuffle 1 --tp 2 --keep 100 ";
    std::string out;
    int rc = run_cmd(base + "-n 1 -o " + d + "/a", &out, nullptr);
    std::vector<float> ref = model_params(ckpt_path((d + "/a").c_str(), "model", 30));
    std::vector<float> ref_loss = grep_floats(out, "| loss ");
    check(rc == 0 && !ref.empty() && ref_loss.size() == 30, "the uninterrupted run: 30 steps, 2.5 epochs of 12 steps (exit %d, %zu losses)", rc,
          ref_loss.size());
    if (ref_loss.size() != 30) return;
    // resume points: at the end of shard 0, inside shard 1, just after the epoch wrap, inside epoch 2
    struct { int step; const char* where; } at[] = {{5, "the end of the first shard"}, {7, "inside the second shard"},
                                                     {13, "just after the first epoch wrapped"}, {20, "inside the second epoch"}};
    for (auto& p : at) {
        std::string dir = d + "/r" + std::to_string(p.step);
        copy_step(d + "/a", dir, p.step);
        rc = run_cmd(base + "-n 100 -y 1 -o " + dir, &out, nullptr);
        std::vector<float> got = model_params(ckpt_path(dir.c_str(), "model", 30)), loss = grep_floats(out, "| loss ");
        long differ = 0;
        for (int k = p.step; k < 30; k++) differ += loss.size() != (size_t)(30 - p.step) || loss[k - p.step] != ref_loss[k];
        bool same = rc == 0 && got.size() == ref.size() && bits_differ(got.data(), ref.data(), (long)ref.size()) == 0;
        check(same && differ == 0, "resumed at step %2d (%s): %zu printed losses, %ld differing; step-30 weights %s", p.step, p.where,
              loss.size(), differ, same ? "bit-identical" : "DIFFER");
    }
    // The saved place in the data (shard order, sample order, position) means nothing in data of another
    // shape: a resume given another count of shards, or (shuffled) a current shard of another size, is
    // refused, naming both counts, and leaves the run as it was. (-i may name the same data moved elsewhere.)
    write_tokens(d + "/other_000.bin", random_tokens(7 * 32 + 1, 256, 50));
    write_tokens(d + "/other_001.bin", random_tokens(5 * 32 + 1, 256, 51));
    struct { std::string train; const char* why; const char* what; } others[] = {
        {d + "/other_*.bin", "the train data has 2 shards, but the run was saved with 3", "2 shards for 3"},
        {d + "/other_000.bin", "the train data has 1 shard, but the run was saved with 3", "1 shard for 3"},
    };
    for (auto& o : others) {
        std::string dir = d + "/other";
        f_sh("rm -rf " + dir);
        copy_step(d + "/a", dir, 7);
        std::string err;
        rc = run_cmd("-i '" + o.train + "' -x 30 -n 100 -y 1 -o " + dir, &out, &err);
        check(rc == 1 && f_lines(err) == 1 && err.find(o.why) != std::string::npos && err.find("resume it with its own data (-i)") != std::string::npos &&
              ckpt_steps(dir.c_str()) == std::vector<int>({7}), "resume on other train data (%s): exit %d, refused: %s", o.what, rc,
              f_first_line(err).c_str());
    }
    // three shards, the current one (shard 1 of the saved order at step 7) of another size
    std::string dir = d + "/resized", err;
    copy_step(d + "/a", dir, 7);
    for (int s = 0; s < 3; s++) write_tokens(d + "/resized_00" + std::to_string(s) + ".bin", random_tokens(6 * 32 + 1, 256, 60 + s));
    rc = run_cmd("-i '" + d + "/resized_*.bin' -x 30 -n 100 -y 1 -o " + dir, &out, &err);
    check(rc == 1 && f_lines(err) == 1 && err.find("samples in its current shard, but the run was saved with") != std::string::npos &&
          ckpt_steps(dir.c_str()) == std::vector<int>({7}), "resume on three shards of other sizes: exit %d, refused: %s", rc,
          f_first_line(err).c_str());
}

// ----------------------------------------------------------------------------
// the build records its switches: changing MPI, WERROR, the GPU models or NCCL rebuilds ./tp and ./test_tp both

static void test_build_config() {
    printf("build/config: the build's switches, rewritten only when they change; tp and test_tp depend on it\n");
    std::string d = tmpdir() + "/stamp", out;
    // a copy of the tree's files (git's view: tracked and new, not ignored, so not the binaries or build/;
    // without git, the sources and make files)
    int rc = shell_out("mkdir -p " + d + " && { git ls-files -co --exclude-standard 2>/dev/null || find . \\( -path ./build -o -path ./.git \\) "
                       "-prune -o -type f \\( -name Makefile -o -name '*.mk' -o -name '*.cu' -o -name '*.cuh' -o -name '*.h' -o -name '*.py' "
                       "-o -name '*.cpp' -o -name '*.sh' \\) -print; } | xargs cp --parents -t " + d, &out);
    std::string mk = "cd " + d + " && env -u WERROR -u MPI -u GPU_CCS -u NCCL_DIR make --no-print-directory ";
    rc = rc == 0 ? shell_out(mk + "build/config", &out) : rc;
    std::vector<char> b = slurp_bytes(d + "/build/config");
    std::string stamp(b.begin(), b.end());
    bool has_mpi = stamp.find("MPI=1 ") == 0;
    check(rc == 0 && stamp.find("MPI=") == 0 && stamp.find(" WERROR= GPU_CCS=") != std::string::npos, "make build/config writes the switches: %s",
          stamp.substr(0, stamp.find('\n')).c_str());
    // binaries built after everything else: up to date with the switches they were built with
    shell_out("cd " + d + " && find . -type f -exec touch -d '2020-01-01 00:00' {} + && touch tp test_tp", nullptr);
    const char* tp_line = "-o tp tp.cu";
    const char* test_line = "-o test_tp test_tp.cu";
    rc = shell_out(mk + "-n tp test_tp", &out);
    check(rc == 0 && out.find(tp_line) == std::string::npos && out.find(test_line) == std::string::npos,
          "the same switches: make -n tp test_tp rebuilds nothing (exit %d)", rc);
    std::string other = has_mpi ? "MPI=0" : "MPI=1";
    struct { std::string flags; const char* what; } cases[] = {
        {other, has_mpi ? "MPI=0 (the build had MPI)" : "MPI=1 (as after installing OpenMPI)"}, {"WERROR=1", "WERROR=1"}, {"GPU_CCS=75", "GPU_CCS=75"},
        {"NCCL_DIR=" + d + "/nccl", "NCCL_DIR (another NCCL)"}};
    for (auto& c : cases) {
        rc = shell_out(mk + "-n tp test_tp " + c.flags, &out);
        std::vector<char> b2 = slurp_bytes(d + "/build/config");
        check(rc == 0 && out.find(tp_line) != std::string::npos && out.find(test_line) != std::string::npos &&
              std::string(b2.begin(), b2.end()) == stamp, "make -n tp test_tp %s: both rebuilt, build/config left as it was", c.what);
    }
    // the record changes for real: then the default switches rebuild both again
    rc = shell_out(mk + "build/config " + other + " && " + mk + "-n tp test_tp", &out);
    b = slurp_bytes(d + "/build/config");
    std::string now(b.begin(), b.end());
    check(rc == 0 && now.find(other + " ") == 0 && out.find(tp_line) != std::string::npos && out.find(test_line) != std::string::npos,
          "after make build/config %s, plain make -n rebuilds both (the record was %s)", other.c_str(), now.substr(0, now.find('\n')).c_str());
}

// ./test_tp bench-attention: the CPU's attention, forward + backward of one layer, fused against the
// materialised ops at -e d6 shapes (6 heads of 64, one sequence, TP=1) and T = 256 and 1024, on every
// core of one rank. The two run interleaved, 5 rounds of each, so a neighbour's load hits both alike;
// the minimum and the median of each are printed, and their ratio. A measurement, not a test.
static int bench_attention_cpu() {
    int B = 1, NH = 6, hs = 64, C = NH * hs, nt = cpu_cores();
    printf("CPU attention, forward + backward of one layer at d6 shapes (B=%d NH=%d hs=%d), %d threads, ms\n", B, NH, hs, nt);
    std::thread th([&]() {
        cpu_pool_start(nt);
        for (int T : {256, 1024}) {
            OpsRng r = {77};
            std::vector<float> qkv = ops_normals(&r, (long)B * T * 3 * C, 0, 1), dout = ops_normals(&r, (long)B * T * C, 0, 1);
            std::vector<float> out((long)B * T * C), att((long)B * NH * T * T), lse((long)B * NH * T), dsum((long)B * NH * T);
            std::vector<float> dqkv(qkv.size());
            std::vector<double> tm, tf;
            for (int round = 0; round < 6; round++) {  // round 0 warms up both
                double t0 = comm_now();
                attention_forward_cpu(out.data(), att.data(), qkv.data(), B, T, NH, hs);
                attention_backward_cpu(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, NH, hs);
                double t1 = comm_now();
                attention_fused_forward_cpu(out.data(), lse.data(), qkv.data(), B, T, NH, hs);
                attention_fused_backward_cpu(dqkv.data(), dsum.data(), dout.data(), qkv.data(), Input{out.data(), nullptr}, lse.data(), B, T, NH, hs);
                double t2 = comm_now();
                if (round) { tm.push_back(1e3 * (t1 - t0)); tf.push_back(1e3 * (t2 - t1)); }
            }
            std::sort(tm.begin(), tm.end());
            std::sort(tf.begin(), tf.end());
            printf("  T=%-5d matmul min %8.2f median %8.2f | fused min %8.2f median %8.2f | fused / matmul (medians) %.2f\n", T,
                   tm[0], tm[tm.size() / 2], tf[0], tf[tf.size() / 2], tf[tf.size() / 2] / tm[tm.size() / 2]);
        }
    });
    th.join();
    return 0;
}
