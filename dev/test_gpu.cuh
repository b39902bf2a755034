// dev/test_gpu.cuh: the GPU tests of test_tp, included by test_tp.cu (they use its check helpers and
// run_tp). They run when a CUDA GPU is visible, natively or on the emulated GPU; without one they are
// reported skipped, never passed.
#pragma once

// ----------------------------------------------------------------------------
// GPU: every CUDA op against its CPU op, forward and backward, at awkward shapes; the GPU collectives;
// determinism; then whole training runs (below). Run only when a GPU is present, else reported skipped.
// Bounds: matmuls and attention run on TF32 tensor cores, so they compare at 1e-2 of the tensor's largest
// value, and again with TF32 off at 2e-5; other ops at 1e-5 (2e-5 for long sums); ops that reproduce the
// CPU's order exactly compare bit for bit.

// random inputs from gpt.cu's generator
typedef Rng Rnd;
static uint64_t rnd_u64(Rnd* r) { return rng_u64(r); }
static float rnd_uniform(Rnd* r) { return (float)rng_uniform(r); }  // (0, 1)
static std::vector<float> rnd_vec(Rnd* r, long n, float lo = -1.0f, float hi = 1.0f) {
    std::vector<float> v(n);
    for (auto& x : v) x = lo + (hi - lo) * rnd_uniform(r);
    return v;
}
static std::vector<int> rnd_ints(Rnd* r, long n, int mod) {
    std::vector<int> v(n);
    for (auto& x : v) x = (int)(rnd_u64(r) % (uint64_t)mod);
    return v;
}

// device copies. `pad` extra leading floats shift the pointer off 16-byte alignment (pad 1) to force the
// scalar paths; the returned pointer is the data, the allocation starts pad floats before it.
struct DevBuf {
    float* base;
    float* p;
};
static DevBuf dev_up(CudaCtx* cx, const std::vector<float>& h, int pad = 0) {
    DevBuf b;
    b.base = cuda_alloc(cx, (long)h.size() + pad);
    b.p = b.base + pad;
    cuda_upload(cx, b.p, h.data(), h.size() * sizeof(float));
    return b;
}
static int* dev_up_int(CudaCtx* cx, const std::vector<int>& h) {
    int* d = (int*)cuda_alloc(cx, (long)h.size());
    cuda_upload(cx, d, h.data(), h.size() * sizeof(int));
    return d;
}
static std::vector<float> dev_down(CudaCtx* cx, const float* d, long n) {
    std::vector<float> h(n);
    cuda_download(cx, h.data(), d, n * sizeof(float));
    return h;
}

// max |g - c| / max |c| (the error against the tensor's scale); infinite if g is not finite where c is, NaN if c holds a NaN
static double gpu_rel_err(const std::vector<float>& g, const std::vector<float>& c) {
    double scale = 0.0, err = 0.0;
    for (size_t i = 0; i < c.size(); i++) scale = worse(scale, (double)fabsf(c[i]));
    for (size_t i = 0; i < c.size(); i++) {
        if (std::isfinite(c[i]) && !std::isfinite(g[i])) return INFINITY;
        err = worse(err, (double)fabsf(g[i] - c[i]));
    }
    return scale > 0.0 ? err / scale : err;
}
static long count_diff(const std::vector<float>& a, const std::vector<float>& b) {
    long n = 0;
    for (size_t i = 0; i < a.size(); i++) n += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return n;
}

#define TF32_BOUND 1e-2
#define FP32_BOUND 1e-5
#define SUM_BOUND 2e-5
// fused attention on TF32 tensor cores: each product's inputs carry 2^-11 relative rounding, so a score or
// an output sum is off by up to ~1e-3 of its terms' magnitudes; measured 4.4e-5 to 2.3e-3 of each tensor's
// scale over the shapes below (the most: lse at T = 1, a single score), so twice that
#define ATT_TC_BOUND 5e-3

static void expect_close(const char* op, const char* what, const std::vector<float>& g, const std::vector<float>& c,
                         double bound) {
    check_le(gpu_rel_err(g, c), bound, "%-22s %-44s max rel err", op, what);
}
static void expect_exact(const char* op, const char* what, const std::vector<float>& g, const std::vector<float>& c) {
    check_le(count_diff(g, c), 0, "%-22s %-44s elements differing of %zu (bit-exact)", op, what, c.size());
}

// ----------------------------------------------------------------------------
// linear layers

// with tf32 off (cuda_set_tf32) the matmuls are full fp32 and compare at SUM_BOUND
static void test_matmul(CudaCtx* cx) {
    printf("matmul_forward / matmul_backward (%s)\n", cx->tf32 ? "TF32" : "fp32");
    const double MM_BOUND = cx->tf32 ? TF32_BOUND : SUM_BOUND;
    Rnd r = {1};
    struct { int N, IC, OC, pad; bool bias; } cases[] = {
        {1, 1, 1, 0, true},     {7, 13, 5, 0, true},    {33, 64, 130, 0, true}, {257, 96, 300, 0, true},
        {64, 768, 2304, 0, true}, {100, 72, 96, 1, true}, {37, 50, 31, 0, false}, {128, 256, 384, 0, false},
        {65, 129, 257, 1, false},
    };
    for (auto& k : cases) {
        char s[96];
        snprintf(s, sizeof(s), "N=%d IC=%d OC=%d%s%s", k.N, k.IC, k.OC, k.bias ? " bias" : "", k.pad ? " unaligned" : "");
        auto inp = rnd_vec(&r, (long)k.N * k.IC), w = rnd_vec(&r, (long)k.OC * k.IC), b = rnd_vec(&r, k.OC);
        auto dout = rnd_vec(&r, (long)k.N * k.OC);
        auto dw0 = rnd_vec(&r, (long)k.OC * k.IC), db0 = rnd_vec(&r, k.OC);
        // CPU
        std::vector<float> out_c((long)k.N * k.OC), dinp_c((long)k.N * k.IC, 0.0f), dw_c = dw0, db_c = db0;
        matmul_forward_cpu(out_c.data(), inp.data(), w.data(), k.bias ? b.data() : nullptr, k.N, k.IC, k.OC);
        matmul_backward_cpu(dinp_c.data(), dw_c.data(), k.bias ? db_c.data() : nullptr, dout.data(), inp.data(), w.data(), k.N, k.IC, k.OC);
        // GPU (outputs prefilled with garbage where the op writes, with the same values where it adds)
        DevBuf di = dev_up(cx, inp, k.pad), dwt = dev_up(cx, w, k.pad), dbias = dev_up(cx, b, k.pad), ddout = dev_up(cx, dout, k.pad);
        DevBuf dout_g = dev_up(cx, rnd_vec(&r, (long)k.N * k.OC, 5, 6), k.pad);
        DevBuf ddinp = dev_up(cx, rnd_vec(&r, (long)k.N * k.IC, 5, 6), k.pad);
        DevBuf ddw = dev_up(cx, dw0, k.pad), ddb = dev_up(cx, db0, k.pad);
        matmul_forward_cuda(cx, dout_g.p, di.p, dwt.p, k.bias ? dbias.p : nullptr, k.N, k.IC, k.OC);
        matmul_backward_cuda(cx, ddinp.p, ddw.p, k.bias ? ddb.p : nullptr, ddout.p, di.p, dwt.p, k.N, k.IC, k.OC);
        expect_close("matmul_forward", s, dev_down(cx, dout_g.p, (long)k.N * k.OC), out_c, MM_BOUND);
        expect_close("matmul_backward dinp", s, dev_down(cx, ddinp.p, (long)k.N * k.IC), dinp_c, MM_BOUND);
        expect_close("matmul_backward dw", s, dev_down(cx, ddw.p, (long)k.OC * k.IC), dw_c, MM_BOUND);
        if (k.bias) expect_close("matmul_backward dbias", s, dev_down(cx, ddb.p, k.OC), db_c, SUM_BOUND);
        // NULL dinp: only the parameter gradients
        if (k.bias) {
            std::vector<float> before = dev_down(cx, ddinp.p, (long)k.N * k.IC);
            matmul_backward_cuda(cx, nullptr, ddw.p, ddb.p, ddout.p, di.p, dwt.p, k.N, k.IC, k.OC);
            matmul_backward_cpu(nullptr, dw_c.data(), db_c.data(), dout.data(), inp.data(), w.data(), k.N, k.IC, k.OC);
            expect_close("matmul_backward 2nd", s, dev_down(cx, ddw.p, (long)k.OC * k.IC), dw_c, MM_BOUND);
            expect_close("matmul_backward 2nd db", s, dev_down(cx, ddb.p, k.OC), db_c, SUM_BOUND);
            expect_exact("matmul_backward NULL", "dinp untouched", dev_down(cx, ddinp.p, (long)k.N * k.IC), before);
        }
        for (DevBuf* d : {&di, &dwt, &dbias, &ddout, &dout_g, &ddinp, &ddw, &ddb}) cuda_free(cx, d->base);
    }
}

// ----------------------------------------------------------------------------
// embedding

static void test_encoder(CudaCtx* cx) {
    printf("encoder_forward / encoder_backward (vocab-parallel), position_forward / position_backward (token slices)\n");
    Rnd r = {2};
    struct { int B, T, C, Vp, P, vocab_used, pad; } cases[] = {
        {1, 1, 1, 128, 1, 128, 0},   {2, 5, 7, 128, 2, 128, 0},  {3, 17, 64, 256, 4, 256, 0},
        {4, 64, 96, 384, 3, 5, 0},   // 5 distinct tokens: long runs of repeats, all in shard 0
        {2, 65, 130, 256, 2, 256, 1}, {8, 128, 768, 1024, 4, 1000, 0},
    };
    for (auto& k : cases) {
        int N = k.B * k.T, Vl = k.Vp / k.P;
        auto tokens = rnd_ints(&r, N, k.vocab_used);
        auto wpe = rnd_vec(&r, (long)k.T * k.C);
        for (int rank = 0; rank < k.P; rank++) {
            int v0 = rank * Vl;
            // the position ops on every token (rank 0), or as sequence parallelism has them on rank r > 0:
            // the N/P tokens starting at t0 = r*N/P, which need not start at a sequence boundary
            int Nr = rank == 0 ? N : N / k.P, t0 = rank == 0 ? 0 : rank * (N / k.P);
            char s[96];
            snprintf(s, sizeof(s), "B=%d T=%d C=%d Vl=%d v0=%d t0=%d%s", k.B, k.T, k.C, Vl, v0, t0, k.pad ? " unaligned" : "");
            auto wte = rnd_vec(&r, (long)Vl * k.C), dout = rnd_vec(&r, (long)N * k.C);
            auto dwte0 = rnd_vec(&r, (long)Vl * k.C), dwpe0 = rnd_vec(&r, (long)k.T * k.C);
            std::vector<float> out_c((long)N * k.C), dwte_c = dwte0, dwpe_c = dwpe0;
            encoder_forward_cpu(out_c.data(), tokens.data(), wte.data(), v0, Vl, N, k.C);
            std::vector<float> enc_c = out_c;
            position_forward_cpu(out_c.data(), wpe.data(), Nr, t0, k.T, k.C);
            encoder_backward_cpu(dwte_c.data(), dout.data(), tokens.data(), v0, Vl, N, k.C);
            position_backward_cpu(dwpe_c.data(), dout.data(), Nr, t0, k.T, k.C);
            int* dtok = dev_up_int(cx, tokens);
            DevBuf dwte = dev_up(cx, wte, k.pad), dwpe = dev_up(cx, wpe, k.pad), ddout = dev_up(cx, dout, k.pad);
            DevBuf dout_g = dev_up(cx, rnd_vec(&r, (long)N * k.C, 5, 6), k.pad);
            DevBuf ddwte = dev_up(cx, dwte0, k.pad), ddwpe = dev_up(cx, dwpe0, k.pad);
            encoder_forward_cuda(cx, dout_g.p, dtok, dwte.p, v0, Vl, N, k.C);
            expect_exact("encoder_forward", s, dev_down(cx, dout_g.p, (long)N * k.C), enc_c);
            position_forward_cuda(cx, dout_g.p, dwpe.p, Nr, t0, k.T, k.C);
            expect_exact("position_forward", s, dev_down(cx, dout_g.p, (long)N * k.C), out_c);
            encoder_backward_cuda(cx, ddwte.p, ddout.p, dtok, nullptr, v0, Vl, N, k.C);
            expect_exact("encoder_backward dwte", s, dev_down(cx, ddwte.p, (long)Vl * k.C), dwte_c);
            position_backward_cuda(cx, ddwpe.p, ddout.p, Nr, t0, k.T, k.C);
            expect_exact("position_backward dwpe", s, dev_down(cx, ddwpe.p, (long)k.T * k.C), dwpe_c);
            cuda_free(cx, dtok);
            for (DevBuf* d : {&dwte, &dwpe, &ddout, &dout_g, &ddwte, &ddwpe}) cuda_free(cx, d->base);
        }
    }
}

// ----------------------------------------------------------------------------
// layernorm, residual, gelu

static void test_layernorm(CudaCtx* cx) {
    printf("layernorm_forward / layernorm_backward, residual_forward\n");
    Rnd r = {3};
    struct { int N, C, pad; } cases[] = {{1, 1, 0}, {3, 3, 0}, {5, 64, 0}, {33, 100, 0}, {257, 768, 0}, {130, 770, 0},
                                         {64, 96, 1}, {1000, 33, 0}, {4096, 768, 0}};
    for (auto& k : cases) {
        char s[64];
        snprintf(s, sizeof(s), "N=%d C=%d%s", k.N, k.C, k.pad ? " unaligned" : "");
        long NC = (long)k.N * k.C;
        auto inp = rnd_vec(&r, NC, -2, 3), w = rnd_vec(&r, k.C, 0.5f, 1.5f), b = rnd_vec(&r, k.C);
        auto dout = rnd_vec(&r, NC), dinp0 = rnd_vec(&r, NC), dw0 = rnd_vec(&r, k.C), db0 = rnd_vec(&r, k.C);
        std::vector<float> out_c(NC), mean_c(k.N), rstd_c(k.N), dinp_c = dinp0, dw_c = dw0, db_c = db0;
        layernorm_forward_cpu(out_c.data(), mean_c.data(), rstd_c.data(), inp.data(), w.data(), b.data(), k.N, k.C);
        layernorm_backward_cpu(dinp_c.data(), dw_c.data(), db_c.data(), dout.data(), inp.data(), w.data(), mean_c.data(),
                               rstd_c.data(), k.N, k.C);
        DevBuf di = dev_up(cx, inp, k.pad), dw = dev_up(cx, w, k.pad), db = dev_up(cx, b, k.pad), dd = dev_up(cx, dout, k.pad);
        DevBuf dout_g = dev_up(cx, std::vector<float>(NC, 7.0f), k.pad), dmean = dev_up(cx, std::vector<float>(k.N, 7.0f), k.pad);
        DevBuf drstd = dev_up(cx, std::vector<float>(k.N, 7.0f), k.pad);
        DevBuf ddinp = dev_up(cx, dinp0, k.pad), ddw = dev_up(cx, dw0, k.pad), ddb = dev_up(cx, db0, k.pad);
        layernorm_forward_cuda(cx, dout_g.p, dmean.p, drstd.p, di.p, dw.p, db.p, k.N, k.C);
        expect_close("layernorm_forward out", s, dev_down(cx, dout_g.p, NC), out_c, FP32_BOUND);
        expect_close("layernorm_forward mean", s, dev_down(cx, dmean.p, k.N), mean_c, FP32_BOUND);
        expect_close("layernorm_forward rstd", s, dev_down(cx, drstd.p, k.N), rstd_c, FP32_BOUND);
        // the backward from the CPU's mean/rstd, so it is compared alone
        DevBuf cm = dev_up(cx, mean_c, k.pad), cr = dev_up(cx, rstd_c, k.pad);
        layernorm_backward_cuda(cx, ddinp.p, ddw.p, ddb.p, dd.p, di.p, dw.p, cm.p, cr.p, k.N, k.C);
        expect_close("layernorm_backward dinp", s, dev_down(cx, ddinp.p, NC), dinp_c, FP32_BOUND);
        auto gw = dev_down(cx, ddw.p, k.C), gb = dev_down(cx, ddb.p, k.C);
        expect_close("layernorm_backward dw", s, gw, dw_c, SUM_BOUND);
        expect_close("layernorm_backward db", s, gb, db_c, SUM_BOUND);
        // deterministic: the same again from the same start gives the same bits
        cuda_upload(cx, ddw.p, dw0.data(), k.C * sizeof(float));
        cuda_upload(cx, ddb.p, db0.data(), k.C * sizeof(float));
        layernorm_backward_cuda(cx, ddinp.p, ddw.p, ddb.p, dd.p, di.p, dw.p, cm.p, cr.p, k.N, k.C);
        long nd = count_diff(dev_down(cx, ddw.p, k.C), gw) + count_diff(dev_down(cx, ddb.p, k.C), gb);
        check_le(nd, 0, "%-22s %-44s elements differing between two runs", "layernorm_backward", s);
        // residual: out = res + (x + bias)
        auto res = rnd_vec(&r, NC), x = rnd_vec(&r, NC);
        std::vector<float> rc(NC);
        residual_forward_cpu(rc.data(), res.data(), x.data(), b.data(), k.N, k.C);
        DevBuf dres = dev_up(cx, res, k.pad), dx = dev_up(cx, x, k.pad);
        residual_forward_cuda(cx, dout_g.p, dres.p, dx.p, db.p, k.N, k.C);
        expect_exact("residual_forward", s, dev_down(cx, dout_g.p, NC), rc);
        for (DevBuf* d : {&di, &dw, &db, &dd, &dout_g, &dmean, &drstd, &ddinp, &ddw, &ddb, &cm, &cr, &dres, &dx}) cuda_free(cx, d->base);
    }
}

static void test_gelu(CudaCtx* cx) {
    printf("gelu_forward / gelu_backward\n");
    Rnd r = {4};
    long sizes[] = {1, 3, 4, 255, 1000, 1025, 1 << 20};
    for (long n : sizes)
        for (int pad = 0; pad < 2; pad++) {
            char s[64];
            snprintf(s, sizeof(s), "N=%ld%s", n, pad ? " unaligned" : "");
            auto x = rnd_vec(&r, n, -6, 6), d = rnd_vec(&r, n);
            if (n > 3) { x[0] = -100.0f; x[1] = 100.0f; x[2] = 0.0f; }  // the clamped tails and zero
            std::vector<float> oc(n), dc(n);
            gelu_forward_cpu(oc.data(), x.data(), n);
            gelu_backward_cpu(dc.data(), x.data(), d.data(), n);
            DevBuf dx = dev_up(cx, x, pad), dd = dev_up(cx, d, pad), dout = dev_up(cx, std::vector<float>(n, 7.0f), pad);
            gelu_forward_cuda(cx, dout.p, dx.p, n);
            expect_close("gelu_forward", s, dev_down(cx, dout.p, n), oc, FP32_BOUND);
            gelu_backward_cuda(cx, dd.p, dx.p, dd.p, n);  // in place, as gpt.cu calls it
            expect_close("gelu_backward (in place)", s, dev_down(cx, dd.p, n), dc, FP32_BOUND);
            for (DevBuf* b : {&dx, &dd, &dout}) cuda_free(cx, b->base);
        }
}

// ----------------------------------------------------------------------------
// attention

static void test_attention(CudaCtx* cx) {
    printf("attention_forward / attention_probs / attention_backward (%s GEMMs)\n", cx->tf32 ? "TF32" : "fp32");
    const double MM_BOUND = cx->tf32 ? TF32_BOUND : SUM_BOUND;
    Rnd r = {5};
    struct { int B, T, NH, hs; } cases[] = {{1, 1, 1, 1}, {1, 2, 1, 8}, {2, 5, 2, 13}, {1, 17, 3, 16}, {2, 32, 2, 64},
                                            {1, 64, 3, 64}, {2, 65, 2, 24}, {3, 33, 1, 7}, {4, 256, 2, 64}};
    for (auto& k : cases) {
        char s[64];
        snprintf(s, sizeof(s), "B=%d T=%d NH=%d hs=%d", k.B, k.T, k.NH, k.hs);
        int C = k.NH * k.hs;
        long n_qkv = (long)k.B * k.T * 3 * C, n_out = (long)k.B * k.T * C, n_att = (long)k.B * k.NH * k.T * k.T;
        auto qkv = rnd_vec(&r, n_qkv, -2, 2), dout = rnd_vec(&r, n_out);
        std::vector<float> out_c(n_out), att_c(n_att), dqkv_c(n_qkv);
        attention_forward_cpu(out_c.data(), att_c.data(), qkv.data(), k.B, k.T, k.NH, k.hs);
        attention_backward_cpu(dqkv_c.data(), dout.data(), qkv.data(), att_c.data(), k.B, k.T, k.NH, k.hs);
        DevBuf dq = dev_up(cx, qkv), dd = dev_up(cx, dout);
        DevBuf dout_g = dev_up(cx, std::vector<float>(n_out, 7.0f)), datt = dev_up(cx, std::vector<float>(n_att, 7.0f));
        DevBuf ddqkv = dev_up(cx, std::vector<float>(n_qkv, 7.0f));
        attention_forward_cuda(cx, dout_g.p, datt.p, dq.p, k.B, k.T, k.NH, k.hs);
        auto att_g = dev_down(cx, datt.p, n_att);
        expect_close("attention_forward out", s, dev_down(cx, dout_g.p, n_out), out_c, MM_BOUND);
        expect_close("attention_forward att", s, att_g, att_c, MM_BOUND);
        long upper = 0;
        for (long row = 0; row < (long)k.B * k.NH * k.T; row++)
            for (int t2 = (int)(row % k.T) + 1; t2 < k.T; t2++) upper += att_g[row * k.T + t2] != 0.0f;
        check_le(upper, 0, "%-22s %-44s nonzeros above the diagonal", "attention_forward att", s);
        // -r 3 recomputes the probabilities alone: the same bits as the forward's
        DevBuf datt2 = dev_up(cx, std::vector<float>(n_att, 7.0f));
        attention_probs_cuda(cx, datt2.p, dq.p, k.B, k.T, k.NH, k.hs);
        expect_exact("attention_probs", s, dev_down(cx, datt2.p, n_att), att_g);
        cuda_free(cx, datt2.base);
        // the backward from the CPU's probabilities, so it is compared alone
        DevBuf catt = dev_up(cx, att_c);
        attention_backward_cuda(cx, ddqkv.p, dd.p, dq.p, catt.p, k.B, k.T, k.NH, k.hs);
        expect_close("attention_backward dqkv", s, dev_down(cx, ddqkv.p, n_qkv), dqkv_c, MM_BOUND);
        for (DevBuf* b : {&dq, &dd, &dout_g, &datt, &ddqkv, &catt}) cuda_free(cx, b->base);
    }
}

// Fused attention: the CUDA kernels against attention_fused_*_cpu (the same tiles and contract), and twice
// on the GPU bit for bit (no atomics). With TF32 off, the fp32 kernels on the CUDA cores: SUM_BOUND of each
// tensor's scale (the two differ in exp and in the order of the dot products' terms). With TF32 on (an
// sm_80+ GPU, as the emulated one), the tensor-core kernels: ATT_TC_BOUND (below). Shapes: every
// tile edge (T = 1, 2, 63, 64, 65, 127, 256) and T = 1024 with one head; head sizes 16, 24 (padded to the
// 32-wide accumulators), 64 and 128 (every DK template). Up to T = 256 only, plus the single T = 1024
// head, because the emulated GPU runs these at about a thousandth of a GPU's speed.
static void test_attention_fused(CudaCtx* cx) {
    printf("attention_fused_forward / attention_fused_backward against the CPU's fused ops (%s)\n",
           cx->tf32 ? "TF32 tensor cores" : "fp32 CUDA cores");
    const double bound = cx->tf32 ? ATT_TC_BOUND : SUM_BOUND;
    Rnd r = {55};
    struct { int B, T, NH, hs; } cases[] = {{1, 1, 1, 16}, {2, 2, 3, 64}, {1, 63, 2, 128}, {2, 64, 1, 16}, {1, 65, 3, 64},
                                            {1, 127, 2, 24}, {2, 256, 2, 64}, {1, 1024, 1, 64}};
    for (auto& k : cases) {
        char s[64];
        snprintf(s, sizeof(s), "B=%d T=%d NH=%d hs=%d", k.B, k.T, k.NH, k.hs);
        int C = k.NH * k.hs;
        long n_qkv = (long)k.B * k.T * 3 * C, n_out = (long)k.B * k.T * C, n_l = (long)k.B * k.NH * k.T;
        auto qkv = rnd_vec(&r, n_qkv, -2, 2), dout = rnd_vec(&r, n_out);
        std::vector<float> out_c(n_out), lse_c(n_l), dsum_c(n_l), dqkv_c(n_qkv);
        attention_fused_forward_cpu(out_c.data(), lse_c.data(), qkv.data(), k.B, k.T, k.NH, k.hs);
        attention_fused_backward_cpu(dqkv_c.data(), dsum_c.data(), dout.data(), qkv.data(), Input{out_c.data(), nullptr}, lse_c.data(), k.B, k.T,
                                     k.NH, k.hs);
        DevBuf dq = dev_up(cx, qkv), dd = dev_up(cx, dout), co = dev_up(cx, out_c), cl = dev_up(cx, lse_c);
        DevBuf go = dev_up(cx, std::vector<float>(n_out, 7.0f)), gl = dev_up(cx, std::vector<float>(n_l, 7.0f));
        DevBuf gs = dev_up(cx, std::vector<float>(n_l, 7.0f)), gg = dev_up(cx, std::vector<float>(n_qkv, 7.0f));
        attention_fused_forward_cuda(cx, go.p, gl.p, dq.p, k.B, k.T, k.NH, k.hs);
        auto out_g = dev_down(cx, go.p, n_out), lse_g = dev_down(cx, gl.p, n_l);
        expect_close("attention_fused out", s, out_g, out_c, bound);
        expect_close("attention_fused lse", s, lse_g, lse_c, bound);
        // the backward from the CPU's out and lse, so it is compared alone
        attention_fused_backward_cuda(cx, gg.p, gs.p, dd.p, dq.p, Input{co.p, nullptr}, cl.p, k.B, k.T, k.NH, k.hs);
        auto dqkv_g = dev_down(cx, gg.p, n_qkv);
        expect_close("attention_fused dqkv", s, dqkv_g, dqkv_c, bound);
        expect_close("attention_fused D", s, dev_down(cx, gs.p, n_l), dsum_c, SUM_BOUND);
        // deterministic: the same bits again
        attention_fused_forward_cuda(cx, go.p, gl.p, dq.p, k.B, k.T, k.NH, k.hs);
        attention_fused_backward_cuda(cx, gg.p, gs.p, dd.p, dq.p, Input{co.p, nullptr}, cl.p, k.B, k.T, k.NH, k.hs);
        long diff = count_diff(dev_down(cx, go.p, n_out), out_g) + count_diff(dev_down(cx, gl.p, n_l), lse_g) +
                    count_diff(dev_down(cx, gg.p, n_qkv), dqkv_g);
        check_le(diff, 0, "%-22s %-44s a second run: floats differing (out, lse, dqkv)", "attention_fused", s);
        if (k.T <= 256) {
            // x rounded to nearest: in bf16 storage on the device (h) and the same values in fp32 words (f)
            struct Twin { bf16* h; DevBuf f; };
            auto bf16_twin = [&](const std::vector<float>& x) {
                long n = (long)x.size();
                std::vector<bf16> x16(n);
                std::vector<float> xr(n);
                bf16_pack_cpu(x16.data(), x.data(), n);
                bf16_widen_cpu(xr.data(), x16.data(), n);
                float* h = cuda_alloc(cx, (n + 1) / 2);
                cuda_upload(cx, h, x16.data(), n * sizeof(bf16));
                return Twin{(bf16*)h, dev_up(cx, xr)};
            };
            // out in bf16 storage (a bf16 run's kept atty, for D): the bits of its values in fp32 words
            Twin o16 = bf16_twin(out_c);
            attention_fused_backward_cuda(cx, gg.p, gs.p, dd.p, dq.p, Input{nullptr, o16.h}, cl.p, k.B, k.T, k.NH, k.hs);
            auto dqkv_h = dev_down(cx, gg.p, n_qkv), dsum_h = dev_down(cx, gs.p, n_l);
            attention_fused_backward_cuda(cx, gg.p, gs.p, dd.p, dq.p, Input{o16.f.p, nullptr}, cl.p, k.B, k.T, k.NH, k.hs);
            check_le(count_diff(dev_down(cx, gg.p, n_qkv), dqkv_h) + count_diff(dev_down(cx, gs.p, n_l), dsum_h), 0,
                     "%-22s %-44s out in bf16 storage against its values in fp32 words: floats differing (dqkv, D)", "attention_fused", s);
            // q, k and v in bf16 storage (a bf16 run's qkv_kept), forward and backward: the bits of their values in fp32 words
            Twin q16 = bf16_twin(qkv);
            const bf16* qh = q16.h;
            DevBuf& qr = q16.f;
            attention_fused_forward_cuda(cx, go.p, gl.p, Input{nullptr, qh}, k.B, k.T, k.NH, k.hs);
            auto out_h = dev_down(cx, go.p, n_out), lse_h = dev_down(cx, gl.p, n_l);
            attention_fused_backward_cuda(cx, gg.p, gs.p, dd.p, Input{nullptr, qh}, Input{co.p, nullptr}, cl.p, k.B, k.T, k.NH, k.hs);
            auto dqkv_q = dev_down(cx, gg.p, n_qkv), dsum_q = dev_down(cx, gs.p, n_l);
            attention_fused_forward_cuda(cx, go.p, gl.p, Input{qr.p, nullptr}, k.B, k.T, k.NH, k.hs);
            attention_fused_backward_cuda(cx, gg.p, gs.p, dd.p, Input{qr.p, nullptr}, Input{co.p, nullptr}, cl.p, k.B, k.T, k.NH, k.hs);
            check_le(count_diff(dev_down(cx, go.p, n_out), out_h) + count_diff(dev_down(cx, gl.p, n_l), lse_h) +
                     count_diff(dev_down(cx, gg.p, n_qkv), dqkv_q) + count_diff(dev_down(cx, gs.p, n_l), dsum_q), 0,
                     "%-22s %-44s q, k, v in bf16 storage against their values in fp32 words: floats differing (out, lse, dqkv, D)",
                     "attention_fused", s);
            // dqkv written into bf16 storage (a bf16 run's, for qkv's matmuls): the fp32 dqkv rounded to nearest
            float* gh = cuda_alloc(cx, (n_qkv + 1) / 2);
            attention_fused_backward_cuda(cx, (bf16*)gh, gs.p, dd.p, Input{nullptr, qh}, Input{co.p, nullptr}, cl.p, k.B, k.T, k.NH,
                                          k.hs);
            std::vector<bf16> dh(n_qkv), want(n_qkv);
            cuda_download(cx, dh.data(), gh, n_qkv * sizeof(bf16));
            bf16_pack_cpu(want.data(), dqkv_q.data(), n_qkv);
            long dh_diff = 0;
            for (long i = 0; i < n_qkv; i++) dh_diff += dh[i] != want[i];
            check_le(dh_diff, 0, "%-22s %-44s dqkv into bf16 storage against the fp32 dqkv rounded: values differing", "attention_fused", s);
            for (void* p : {(void*)gh, (void*)o16.h, (void*)o16.f.base, (void*)q16.h, (void*)q16.f.base}) cuda_free(cx, p);
        }
        for (DevBuf* b : {&dq, &dd, &co, &cl, &go, &gl, &gs, &gg}) cuda_free(cx, b->base);
    }
}

// ----------------------------------------------------------------------------
// vocab-parallel cross-entropy: every shard of a padded vocab, with the all-reduces done on the host

static void test_crossentropy(CudaCtx* cx) {
    printf("crossentropy_max / _sums / _finish (vocab shards, padded columns, empty shards)\n");
    Rnd r = {6};
    struct { int N, V, Vp, P, pad; } cases[] = {
        {1, 1, 128, 1, 0},   {5, 100, 128, 1, 0},  {7, 100, 256, 4, 0},  // shards 2, 3: padding only
        {33, 1000, 1024, 4, 0}, {17, 300, 384, 3, 1}, {64, 50257, 50304, 4, 0}, {9, 37, 37, 1, 0},  // Vl = 37: not % 4
        {3, 5000, 5000, 2, 1},
    };
    for (auto& k : cases) {
        int Vl = k.Vp / k.P;
        auto targets = rnd_ints(&r, k.N, k.V);
        std::vector<std::vector<float>> logits(k.P);
        for (auto& l : logits) l = rnd_vec(&r, (long)k.N * Vl, -4, 4);
        // global max and sums as the all-reduces would make them (rank order)
        std::vector<float> gmax(k.N, -FLT_MAX), gsums(2 * k.N, 0.0f);
        for (int q = 0; q < k.P; q++) {
            std::vector<float> m(k.N);
            crossentropy_max_cpu(m.data(), logits[q].data(), k.N, Vl, q * Vl, k.V);
            for (int n = 0; n < k.N; n++) gmax[n] = std::max(gmax[n], m[n]);
        }
        for (int q = 0; q < k.P; q++) {
            std::vector<float> s(2 * k.N);
            crossentropy_sums_cpu(s.data(), logits[q].data(), gmax.data(), targets.data(), k.N, Vl, q * Vl, k.V);
            for (int i = 0; i < 2 * k.N; i++) gsums[i] += s[i];
        }
        int* dt = dev_up_int(cx, targets);
        DevBuf dgmax = dev_up(cx, gmax), dgsums = dev_up(cx, gsums);
        for (int q = 0; q < k.P; q++) {
            int v0 = q * Vl;
            char s[80];
            snprintf(s, sizeof(s), "N=%d V=%d Vl=%d v0=%d%s", k.N, k.V, Vl, v0, k.pad ? " unaligned" : "");
            std::vector<float> m_c(k.N), s_c(2 * k.N), loss_c(k.N), loss0_c(k.N), dl_c = logits[q], keep = logits[q];
            crossentropy_max_cpu(m_c.data(), logits[q].data(), k.N, Vl, v0, k.V);
            crossentropy_sums_cpu(s_c.data(), logits[q].data(), gmax.data(), targets.data(), k.N, Vl, v0, k.V);
            crossentropy_finish_cpu(loss0_c.data(), keep.data(), gmax.data(), gsums.data(), targets.data(), k.N, Vl, v0, k.V, 0.0f);
            crossentropy_finish_cpu(loss_c.data(), dl_c.data(), gmax.data(), gsums.data(), targets.data(), k.N, Vl, v0, k.V, 1.0f / k.N);
            DevBuf dl = dev_up(cx, logits[q], k.pad), dm = dev_up(cx, std::vector<float>(k.N, 7.0f));
            DevBuf ds = dev_up(cx, std::vector<float>(2 * k.N, 7.0f)), dloss = dev_up(cx, std::vector<float>(k.N, 7.0f));
            crossentropy_max_cuda(cx, dm.p, dl.p, k.N, Vl, v0, k.V);
            expect_exact("crossentropy_max", s, dev_down(cx, dm.p, k.N), m_c);
            crossentropy_sums_cuda(cx, ds.p, dl.p, dgmax.p, dt, k.N, Vl, v0, k.V);
            expect_close("crossentropy_sums", s, dev_down(cx, ds.p, 2 * k.N), s_c, FP32_BOUND);
            crossentropy_finish_cuda(cx, dloss.p, dl.p, dgmax.p, dgsums.p, dt, k.N, Vl, v0, k.V, 0.0f);
            expect_close("crossentropy_finish loss", s, dev_down(cx, dloss.p, k.N), loss0_c, FP32_BOUND);
            expect_exact("crossentropy_finish ds=0", "logits untouched", dev_down(cx, dl.p, (long)k.N * Vl), logits[q]);
            crossentropy_finish_cuda(cx, dloss.p, dl.p, dgmax.p, dgsums.p, dt, k.N, Vl, v0, k.V, 1.0f / k.N);
            expect_close("crossentropy_finish loss", s, dev_down(cx, dloss.p, k.N), loss_c, FP32_BOUND);
            expect_close("crossentropy_finish dlogits", s, dev_down(cx, dl.p, (long)k.N * Vl), dl_c, FP32_BOUND);
            for (DevBuf* b : {&dl, &dm, &ds, &dloss}) cuda_free(cx, b->base);
        }
        cuda_free(cx, dt);
        cuda_free(cx, dgmax.base);
        cuda_free(cx, dgsums.base);
    }
}

// ----------------------------------------------------------------------------
// optimizer and gradient norm

static void test_adamw_sumsq(CudaCtx* cx) {
    printf("adamw (clipping scale on the device) / sumsq (deterministic)\n");
    Rnd r = {7};
    long sizes[] = {1, 5, 1027, 4099, 1 << 20};
    for (long n : sizes)
        for (int pad = 0; pad < 2; pad++)
            for (float clip : {0.0f, 1.0f}) {
                char s[64];
                snprintf(s, sizeof(s), "n=%ld clip=%.0f%s", n, clip, pad ? " unaligned" : "");
                auto p = rnd_vec(&r, n), g = rnd_vec(&r, n), m = rnd_vec(&r, n, -0.1f, 0.1f), v = rnd_vec(&r, n, 0.0f, 0.01f);
                std::vector<float> norm2 = {3.0f, 1.5f};  // norm 2.12: clipped at 1
                std::vector<float> pc = p, mc = m, vc = v;
                adamw_cpu(pc.data(), g.data(), mc.data(), vc.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, norm2.data(), clip);
                DevBuf dp = dev_up(cx, p, pad), dg = dev_up(cx, g, pad), dm = dev_up(cx, m, pad), dv = dev_up(cx, v, pad);
                DevBuf dn = dev_up(cx, norm2);
                adamw_cuda(cx, dp.p, dg.p, dm.p, dv.p, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, dn.p, clip);
                expect_close("adamw params", s, dev_down(cx, dp.p, n), pc, FP32_BOUND);
                expect_close("adamw m", s, dev_down(cx, dm.p, n), mc, FP32_BOUND);
                expect_close("adamw v", s, dev_down(cx, dv.p, n), vc, FP32_BOUND);
                if (clip == 0.0f) {
                    // norm2[0] += sum of squares, twice from the same start: equal bits, and the CPU's value
                    std::vector<float> start = {0.25f};
                    DevBuf d1 = dev_up(cx, start);
                    sumsq_cuda(cx, d1.p, dg.p, n);
                    auto a = dev_down(cx, d1.p, 1);
                    cuda_upload(cx, d1.p, start.data(), sizeof(float));
                    sumsq_cuda(cx, d1.p, dg.p, n);
                    auto b = dev_down(cx, d1.p, 1);
                    std::vector<float> c = start;
                    sumsq_cpu(c.data(), g.data(), n);
                    expect_close("sumsq", s, a, c, 1e-6);
                    check_le(count_diff(a, b), 0, "%-22s %-44s bits differing between two runs", "sumsq", s);
                    cuda_free(cx, d1.base);
                }
                for (DevBuf* b : {&dp, &dg, &dm, &dv, &dn}) cuda_free(cx, b->base);
            }
}

// the bf16 GEMM (cuBLAS, bf16 inputs, fp32 accumulation) against the CPU's gemm_bf16_cpu: every transpose,
// with and without accumulating into C, at the default model's shapes and ragged ones
static void test_gemm_bf16(CudaCtx* cx) {
    printf("gemm_bf16 (bf16 A and B, fp32 C and sums)\n");
    Rnd r = {23};
    struct { int M, N, K; } shapes[] = {{256, 384, 128}, {256, 128, 512}, {33, 17, 301}, {7, 130, 65}};
    for (auto& sh : shapes)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int acc = 0; acc < 2; acc++) {
                    int M = sh.M, N = sh.N, K = sh.K, lda = ta ? M : K, ldb = tb ? K : N;
                    std::vector<float> af = rnd_vec(&r, (long)M * K), bff = rnd_vec(&r, (long)K * N), c0 = rnd_vec(&r, (long)M * N);
                    std::vector<bf16> a(af.size()), b(bff.size());
                    for (size_t i = 0; i < a.size(); i++) a[i] = bf16_round(af[i]);
                    for (size_t i = 0; i < b.size(); i++) b[i] = bf16_round(bff[i]);
                    // the CPU twin: a(m,k) = A[m*a_rs + k*a_cs], b(k,n) = B[k*b_rs + n*b_cs]
                    std::vector<float> want = acc ? c0 : std::vector<float>(c0.size(), 0.0f);
                    gemm_bf16_cpu(M, N, K, a.data(), ta ? 1 : lda, ta ? lda : 1, b.data(), tb ? 1 : ldb, tb ? ldb : 1, want.data(), N,
                                  acc != 0, nullptr);
                    bf16* da = (bf16*)cuda_alloc(cx, ((long)a.size() + 1) / 2);
                    bf16* db = (bf16*)cuda_alloc(cx, ((long)b.size() + 1) / 2);
                    cuda_upload(cx, da, a.data(), a.size() * sizeof(bf16));
                    cuda_upload(cx, db, b.data(), b.size() * sizeof(bf16));
                    DevBuf dc = dev_up(cx, c0);
                    gemm_bf16_cuda(cx, ta, tb, M, N, K, 1.0f, da, lda, db, ldb, acc ? 1.0f : 0.0f, dc.p, N);
                    char s[80];
                    snprintf(s, sizeof(s), "M%d N%d K%d%s%s%s", M, N, K, ta ? " A^T" : "", tb ? " B^T" : "", acc ? " C +=" : "");
                    expect_close("gemm_bf16", s, dev_down(cx, dc.p, (long)M * N), want, FP32_BOUND);
                    cuda_free(cx, da);
                    cuda_free(cx, db);
                    cuda_free(cx, dc.base);
                }
}

// A --dtype bf16 run's weights in bf16 storage (Weight's h), as the recipe passes them: matmul_forward and
// matmul_backward against the CPU's (the activations bf16 values in fp32 words, the weight read where it
// lies, at a 16-byte boundary and 2 and 6 bytes past one), both again with the input in bf16 storage as a
// layer keeps it (Input's h), the backward once more with its output gradient in bf16 storage too, and the
// embedding's rows widened, bit for bit, on its 16-byte path and its element one
static void test_bf16_weights(CudaCtx* cx) {
    printf("matmul_forward / matmul_backward / encoder_forward with the weights in bf16 storage; the matmuls with their input too\n");
    Rnd r = {31};
    auto bf16_values = [](std::vector<float> v) { round_bf16_cpu(v.data(), (long)v.size()); return v; };
    struct { int N, IC, OC, off; bool bias; } cases[] = {{256, 128, 384, 0, true}, {256, 512, 128, 0, false}, {33, 65, 17, 1, true}, {7, 96, 130, 3, false}};
    for (auto& k : cases) {
        char s[96];
        snprintf(s, sizeof(s), "N=%d IC=%d OC=%d%s%s", k.N, k.IC, k.OC, k.bias ? " bias" : "", k.off ? " weight unaligned" : "");
        auto inp = bf16_values(rnd_vec(&r, (long)k.N * k.IC)), dout = bf16_values(rnd_vec(&r, (long)k.N * k.OC));
        auto b = rnd_vec(&r, k.OC), dw0 = rnd_vec(&r, (long)k.OC * k.IC), db0 = rnd_vec(&r, k.OC);
        std::vector<bf16> w((size_t)k.OC * k.IC);
        for (auto& x : w) x = bf16_round(rnd_uniform(&r) * 2.0f - 1.0f);
        std::vector<float> out_c((long)k.N * k.OC), dinp_c((long)k.N * k.IC), dw_c = dw0, db_c = db0;
        matmul_forward_cpu(out_c.data(), inp.data(), Weight{nullptr, w.data()}, k.bias ? b.data() : nullptr, k.N, k.IC, k.OC);
        matmul_backward_cpu(dinp_c.data(), dw_c.data(), k.bias ? db_c.data() : nullptr, dout.data(), inp.data(), Weight{nullptr, w.data()},
                            k.N, k.IC, k.OC);
        bf16* dw_base = (bf16*)cuda_alloc(cx, ((long)w.size() + k.off + 1) / 2);
        bf16* dwt = dw_base + k.off;
        cuda_upload(cx, dwt, w.data(), w.size() * sizeof(bf16));
        DevBuf di = dev_up(cx, inp), dbias = dev_up(cx, b), ddout = dev_up(cx, dout);
        DevBuf dout_g = dev_up(cx, rnd_vec(&r, (long)k.N * k.OC, 5, 6)), ddinp = dev_up(cx, rnd_vec(&r, (long)k.N * k.IC, 5, 6));
        DevBuf ddw = dev_up(cx, dw0), ddb = dev_up(cx, db0);
        matmul_forward_cuda(cx, dout_g.p, di.p, Weight{nullptr, dwt}, k.bias ? dbias.p : nullptr, k.N, k.IC, k.OC);
        matmul_backward_cuda(cx, ddinp.p, ddw.p, k.bias ? ddb.p : nullptr, ddout.p, di.p, Weight{nullptr, dwt}, k.N, k.IC, k.OC);
        expect_close("matmul_forward bf16 w", s, dev_down(cx, dout_g.p, (long)k.N * k.OC), out_c, FP32_BOUND);
        expect_close("matmul_backward bf16 w", (std::string(s) + " dinp").c_str(), dev_down(cx, ddinp.p, (long)k.N * k.IC), dinp_c, FP32_BOUND);
        expect_close("matmul_backward bf16 w", (std::string(s) + " dw").c_str(), dev_down(cx, ddw.p, (long)k.OC * k.IC), dw_c, FP32_BOUND);
        if (k.bias) expect_close("matmul_backward bf16 w", (std::string(s) + " dbias").c_str(), dev_down(cx, ddb.p, k.OC), db_c, SUM_BOUND);
        // the input as a layer keeps it (Input: bf16 storage, to cuBLAS unpacked), as far from the boundary
        std::vector<bf16> inp_kept(inp.size());
        for (size_t i = 0; i < inp.size(); i++) inp_kept[i] = bf16_round(inp[i]);
        bf16* di_base = (bf16*)cuda_alloc(cx, ((long)inp_kept.size() + k.off + 1) / 2);
        cuda_upload(cx, di_base + k.off, inp_kept.data(), inp_kept.size() * sizeof(bf16));
        DevBuf ddinp_k = dev_up(cx, rnd_vec(&r, (long)k.N * k.IC, 5, 6)), ddw_k = dev_up(cx, dw0), ddb_k = dev_up(cx, db0);
        DevBuf dout_k = dev_up(cx, rnd_vec(&r, (long)k.N * k.OC, 5, 6));
        matmul_forward_cuda(cx, dout_k.p, Input{nullptr, di_base + k.off}, Weight{nullptr, dwt}, k.bias ? dbias.p : nullptr, k.N, k.IC, k.OC);
        expect_close("matmul_forward bf16 inp", s, dev_down(cx, dout_k.p, (long)k.N * k.OC), out_c, FP32_BOUND);
        matmul_backward_cuda(cx, ddinp_k.p, ddw_k.p, k.bias ? ddb_k.p : nullptr, ddout.p, Input{nullptr, di_base + k.off},
                             Weight{nullptr, dwt}, k.N, k.IC, k.OC);
        expect_close("matmul_backward bf16 inp", (std::string(s) + " dinp").c_str(), dev_down(cx, ddinp_k.p, (long)k.N * k.IC), dinp_c, FP32_BOUND);
        expect_close("matmul_backward bf16 inp", (std::string(s) + " dw").c_str(), dev_down(cx, ddw_k.p, (long)k.OC * k.IC), dw_c, FP32_BOUND);
        if (k.bias) expect_close("matmul_backward bf16 inp", (std::string(s) + " dbias").c_str(), dev_down(cx, ddb_k.p, k.OC), db_c, SUM_BOUND);
        // and the output gradient in bf16 storage (fc's and qkv's in a bf16 run), in the recipe's two calls:
        // the input gradient alone, then the weight's and the bias's, both reading it where it lies
        std::vector<bf16> dout_h(dout.size());
        for (size_t i = 0; i < dout.size(); i++) dout_h[i] = bf16_round(dout[i]);
        bf16* dd_base = (bf16*)cuda_alloc(cx, ((long)dout_h.size() + k.off + 1) / 2);
        cuda_upload(cx, dd_base + k.off, dout_h.data(), dout_h.size() * sizeof(bf16));
        DevBuf ddinp_g = dev_up(cx, rnd_vec(&r, (long)k.N * k.IC, 5, 6)), ddw_g = dev_up(cx, dw0), ddb_g = dev_up(cx, db0);
        matmul_backward_cuda(cx, ddinp_g.p, nullptr, nullptr, Input{nullptr, dd_base + k.off}, Input{nullptr, di_base + k.off},
                             Weight{nullptr, dwt}, k.N, k.IC, k.OC);
        matmul_backward_cuda(cx, nullptr, ddw_g.p, k.bias ? ddb_g.p : nullptr, Input{nullptr, dd_base + k.off},
                             Input{nullptr, di_base + k.off}, Weight{nullptr, dwt}, k.N, k.IC, k.OC);
        expect_close("matmul_backward bf16 dout", (std::string(s) + " dinp").c_str(), dev_down(cx, ddinp_g.p, (long)k.N * k.IC), dinp_c, FP32_BOUND);
        expect_close("matmul_backward bf16 dout", (std::string(s) + " dw").c_str(), dev_down(cx, ddw_g.p, (long)k.OC * k.IC), dw_c, FP32_BOUND);
        if (k.bias) expect_close("matmul_backward bf16 dout", (std::string(s) + " dbias").c_str(), dev_down(cx, ddb_g.p, k.OC), db_c, SUM_BOUND);
        cuda_free(cx, dd_base);
        for (DevBuf* d : {&ddinp_g, &ddw_g, &ddb_g}) cuda_free(cx, d->base);
        cuda_free(cx, dw_base);
        cuda_free(cx, di_base);
        for (DevBuf* d : {&di, &dbias, &ddout, &dout_g, &ddinp, &ddw, &ddb, &ddinp_k, &ddw_k, &ddb_k, &dout_k}) cuda_free(cx, d->base);
    }
    struct { int N, C, Vl, v0, off; } enc[] = {{64, 128, 96, 0, 0}, {50, 130, 40, 40, 0}, {31, 64, 32, 16, 1}, {9, 7, 5, 3, 0}};
    for (auto& k : enc) {
        char s[96];
        snprintf(s, sizeof(s), "N=%d C=%d Vl=%d v0=%d%s", k.N, k.C, k.Vl, k.v0, k.off ? " wte unaligned" : "");
        auto tokens = rnd_ints(&r, k.N, k.v0 + k.Vl + 7);  // some past this rank's rows, some before
        std::vector<bf16> wte((size_t)k.Vl * k.C);
        for (auto& x : wte) x = bf16_round(rnd_uniform(&r) * 2.0f - 1.0f);
        std::vector<float> want((long)k.N * k.C);
        encoder_forward_cpu(want.data(), tokens.data(), Weight{nullptr, wte.data()}, k.v0, k.Vl, k.N, k.C);
        int* dtok = dev_up_int(cx, tokens);
        bf16* base = (bf16*)cuda_alloc(cx, ((long)wte.size() + k.off + 1) / 2);
        cuda_upload(cx, base + k.off, wte.data(), wte.size() * sizeof(bf16));
        DevBuf dout = dev_up(cx, rnd_vec(&r, (long)k.N * k.C, 5, 6));
        encoder_forward_cuda(cx, dout.p, dtok, Weight{nullptr, base + k.off}, k.v0, k.Vl, k.N, k.C);
        expect_exact("encoder_forward bf16", s, dev_down(cx, dout.p, (long)k.N * k.C), want);
        cuda_free(cx, dtok);
        cuda_free(cx, base);
        cuda_free(cx, dout.base);
    }
}

// How far bf16 results from the GPU lie from the CPU's fp32 values beyond what the two fp32 sums may differ
// (FP32_BOUND of the tensor's scale, as expect_close allows), in units of the bf16 spacing at each value:
// at most 1/2 where the GPU rounds its sum to nearest
static double bf16_ulps_from(const std::vector<bf16>& g, const std::vector<float>& c) {
    double scale = 0.0, worst = 0.0;
    for (float x : c) scale = worse(scale, (double)fabsf(x));
    for (size_t i = 0; i < c.size(); i++) {
        if (!std::isfinite(c[i])) return INFINITY;
        int e;
        frexpf(c[i], &e);
        double ulp = c[i] == 0.0f ? ldexp(1.0, -133) : ldexp(1.0, e - 8);  // bf16 has 8 significant bits
        worst = worse(worst, std::max(0.0, fabs((double)bf16_to_float(g[i]) - c[i]) - FP32_BOUND * scale) / ulp);
    }
    return worst;
}

// The LM head and the loss with a bf16 run's bf16 logits (Logits): matmul_forward writing bf16 (cuBLAS with
// a bf16 C) against the CPU's fp32 sums, each within half a bf16 unit of them plus the sums' difference; the
// cross-entropy on bf16 logits (16-byte loads, and one by one where Vl % 8 or the address says so) against
// the CPU's on the same bf16, dlogits the same way; the head's backward from bf16 dlogits against the CPU's
static void test_bf16_logits(CudaCtx* cx) {
    printf("the LM head and the loss with bf16 logits (matmul_forward, crossentropy_*, matmul_backward)\n");
    Rnd r = {43};
    const double ULP_BOUND = 0.51;
    struct { int N, C, Vl, v0, V, off; } cases[] = {{64, 128, 256, 0, 500, 0}, {33, 96, 100, 100, 150, 0}, {17, 64, 40, 40, 60, 1},
                                                   {9, 33, 37, 0, 37, 0}, {5, 64, 64, 128, 150, 0}};  // the last: mostly padding
    for (auto& k : cases) {
        char s[96];
        snprintf(s, sizeof(s), "N=%d C=%d Vl=%d v0=%d V=%d%s", k.N, k.C, k.Vl, k.v0, k.V, k.off ? " unaligned" : "");
        std::vector<bf16> w((size_t)k.Vl * k.C);
        for (auto& x : w) x = bf16_round(rnd_uniform(&r) * 2.0f - 1.0f);
        auto lnf = rnd_vec(&r, (long)k.N * k.C);
        round_bf16_cpu(lnf.data(), (long)lnf.size());
        auto targets = rnd_ints(&r, k.N, k.V);
        const long nl = (long)k.N * k.Vl;
        // CPU: the fp32 sums, and the logits the CPU's bf16 head stores
        std::vector<float> lg32(nl);
        std::vector<bf16> lg16(nl);
        matmul_forward_cpu(lg32.data(), lnf.data(), Weight{nullptr, w.data()}, nullptr, k.N, k.C, k.Vl);
        matmul_forward_cpu(Logits{nullptr, lg16.data()}, lnf.data(), Weight{nullptr, w.data()}, nullptr, k.N, k.C, k.Vl);
        // GPU head
        bf16* wb = (bf16*)cuda_alloc(cx, ((long)w.size() + 1) / 2);
        cuda_upload(cx, wb, w.data(), w.size() * sizeof(bf16));
        DevBuf dlnf = dev_up(cx, lnf);
        bf16* lbase = (bf16*)cuda_alloc(cx, (nl + k.off + 1) / 2);
        bf16* dlg = lbase + k.off;
        matmul_forward_cuda(cx, Logits{nullptr, dlg}, dlnf.p, Weight{nullptr, wb}, nullptr, k.N, k.C, k.Vl);
        std::vector<bf16> g16(nl);
        cuda_download(cx, g16.data(), dlg, nl * sizeof(bf16));
        check_le(bf16_ulps_from(g16, lg32), ULP_BOUND, "%-22s %-44s bf16 units from the CPU's fp32 sums", "matmul_forward bf16 out", s);
        // the loss from the CPU's bf16 logits on both (one rank: its maxes and sums are the global ones)
        cuda_upload(cx, dlg, lg16.data(), nl * sizeof(bf16));
        std::vector<float> mx(k.N), sm(2 * k.N), loss(k.N), dl32(nl);
        std::vector<bf16> dl16 = lg16;
        crossentropy_max_cpu(mx.data(), lg16.data(), k.N, k.Vl, k.v0, k.V);
        crossentropy_sums_cpu(sm.data(), lg16.data(), mx.data(), targets.data(), k.N, k.Vl, k.v0, k.V);
        for (long i = 0; i < nl; i++) dl32[i] = bf16_to_float(lg16[i]);
        crossentropy_finish_cpu(loss.data(), dl32.data(), mx.data(), sm.data(), targets.data(), k.N, k.Vl, k.v0, k.V, 1.0f / k.N);
        crossentropy_finish_cpu(loss.data(), dl16.data(), mx.data(), sm.data(), targets.data(), k.N, k.Vl, k.v0, k.V, 1.0f / k.N);
        int* dt = dev_up_int(cx, targets);
        DevBuf dmx = dev_up(cx, std::vector<float>(k.N, 7.0f)), dsm = dev_up(cx, std::vector<float>(2 * k.N, 7.0f));
        DevBuf dloss = dev_up(cx, std::vector<float>(k.N, 7.0f)), dgmx = dev_up(cx, mx), dgsm = dev_up(cx, sm);
        crossentropy_max_cuda(cx, dmx.p, Logits{nullptr, dlg}, k.N, k.Vl, k.v0, k.V);
        expect_exact("crossentropy_max bf16", s, dev_down(cx, dmx.p, k.N), mx);
        crossentropy_sums_cuda(cx, dsm.p, Logits{nullptr, dlg}, dgmx.p, dt, k.N, k.Vl, k.v0, k.V);
        expect_close("crossentropy_sums bf16", s, dev_down(cx, dsm.p, 2 * k.N), sm, FP32_BOUND);
        crossentropy_finish_cuda(cx, dloss.p, Logits{nullptr, dlg}, dgmx.p, dgsm.p, dt, k.N, k.Vl, k.v0, k.V, 1.0f / k.N);
        expect_close("crossentropy_finish bf16", (std::string(s) + " loss").c_str(), dev_down(cx, dloss.p, k.N), loss, FP32_BOUND);
        cuda_download(cx, g16.data(), dlg, nl * sizeof(bf16));
        check_le(bf16_ulps_from(g16, dl32), ULP_BOUND, "%-22s %-44s bf16 units from the CPU's fp32 dlogits", "crossentropy_finish bf16", s);
        // the head's backward from the CPU's bf16 dlogits
        cuda_upload(cx, dlg, dl16.data(), nl * sizeof(bf16));
        auto dw0 = rnd_vec(&r, (long)k.Vl * k.C), db0 = rnd_vec(&r, k.Vl);
        std::vector<float> di_c((long)k.N * k.C), dw_c = dw0, db_c = db0;
        matmul_backward_cpu(di_c.data(), dw_c.data(), db_c.data(), Logits{nullptr, dl16.data()}, lnf.data(), Weight{nullptr, w.data()},
                            k.N, k.C, k.Vl);
        DevBuf ddi = dev_up(cx, rnd_vec(&r, (long)k.N * k.C, 5, 6)), ddw = dev_up(cx, dw0), ddb = dev_up(cx, db0);
        matmul_backward_cuda(cx, ddi.p, ddw.p, ddb.p, Logits{nullptr, dlg}, dlnf.p, Weight{nullptr, wb}, k.N, k.C, k.Vl);
        expect_close("matmul_backward bf16 dout", (std::string(s) + " dinp").c_str(), dev_down(cx, ddi.p, (long)k.N * k.C), di_c, FP32_BOUND);
        expect_close("matmul_backward bf16 dout", (std::string(s) + " dw").c_str(), dev_down(cx, ddw.p, (long)k.Vl * k.C), dw_c, FP32_BOUND);
        expect_close("matmul_backward bf16 dout", (std::string(s) + " dbias").c_str(), dev_down(cx, ddb.p, k.Vl), db_c, SUM_BOUND);
        cuda_free(cx, dt);
        cuda_free(cx, wb);
        cuda_free(cx, lbase);
        for (DevBuf* d : {&dlnf, &dmx, &dsm, &dloss, &dgmx, &dgsm, &ddi, &ddw, &ddb}) cuda_free(cx, d->base);
    }
}

// A bf16 run's gradients in bf16 storage (Grad's h), each op's fp32 sum added once and rounded to nearest:
// matmul_backward's dweight (cuBLAS with a bf16 C and beta 1) and dbias, and layernorm_backward's dw and db,
// within half a bf16 unit of the CPU's fp32 results from the same start widened (plus what two fp32 sums may
// differ); encoder_backward (tokens repeated and interleaved, grouped by row on the host) and
// position_backward (an SP slice) the CPU's bf16 bits exactly; adamw and sumsq reading bf16 gradients
// against the CPU's (at a 16-byte boundary and 2 bytes past one).
static void test_bf16_grads(CudaCtx* cx) {
    printf("the backward's gradients in bf16 storage (matmul, layernorm, embeddings), adamw and sumsq from them\n");
    Rnd r = {53};
    const double ULP_BOUND = 0.51;
    std::vector<float*> bases;  // freed at the end
    auto up16 = [&](const std::vector<bf16>& h, int off = 0) {
        float* base = cuda_alloc(cx, ((long)h.size() + off + 1) / 2 + 1);
        bases.push_back(base);
        bf16* p = (bf16*)base + off;
        cuda_upload(cx, p, h.data(), h.size() * sizeof(bf16));
        return p;
    };
    auto down16 = [&](const bf16* p, size_t n) {
        std::vector<bf16> h(n);
        cuda_download(cx, h.data(), p, n * sizeof(bf16));
        return h;
    };
    auto bf16_values = [](std::vector<float> v) { round_bf16_cpu(v.data(), (long)v.size()); return v; };
    struct { int N, IC, OC, off; } mcases[] = {{64, 128, 96, 0}, {33, 70, 37, 0}, {17, 33, 40, 1}};
    for (auto& k : mcases) {
        char s[64];
        snprintf(s, sizeof(s), "N=%d IC=%d OC=%d%s", k.N, k.IC, k.OC, k.off ? " grads 2 bytes past" : "");
        auto inp = bf16_values(rnd_vec(&r, (long)k.N * k.IC)), dout = bf16_values(rnd_vec(&r, (long)k.N * k.OC));
        std::vector<bf16> w = bf16_vector_of(rnd_vec(&r, (long)k.OC * k.IC)), dw0 = bf16_vector_of(rnd_vec(&r, (long)k.OC * k.IC)), db0 = bf16_vector_of(rnd_vec(&r, k.OC));
        std::vector<float> dw_c = fp32_vector_of(dw0), db_c = fp32_vector_of(db0);
        matmul_backward_cpu(nullptr, Grad(dw_c.data()), Grad(db_c.data()), dout.data(), inp.data(), Weight{nullptr, w.data()}, k.N, k.IC, k.OC);
        DevBuf di = dev_up(cx, inp), dd = dev_up(cx, dout);
        bf16 *wb = up16(w), *dwb = up16(dw0, k.off), *dbb = up16(db0, k.off);
        matmul_backward_cuda(cx, nullptr, Grad(dwb), Grad(dbb), dd.p, di.p, Weight{nullptr, wb}, k.N, k.IC, k.OC);
        check_le(bf16_ulps_from(down16(dwb, dw0.size()), dw_c), ULP_BOUND, "%-22s %-44s bf16 units from the CPU's fp32 sums", "matmul_backward dw16", s);
        check_le(bf16_ulps_from(down16(dbb, db0.size()), db_c), ULP_BOUND, "%-22s %-44s bf16 units from the CPU's fp32 sums", "matmul_backward db16", s);
        for (DevBuf* d : {&di, &dd}) cuda_free(cx, d->base);
    }
    struct { int N, C, off; } lcases[] = {{5, 64, 0}, {33, 100, 1}, {257, 768, 0}};
    for (auto& k : lcases) {
        char s[64];
        snprintf(s, sizeof(s), "N=%d C=%d%s", k.N, k.C, k.off ? " grads 2 bytes past" : "");
        long NC = (long)k.N * k.C;
        auto inp = rnd_vec(&r, NC, -2, 3), w = rnd_vec(&r, k.C, 0.5f, 1.5f), b = rnd_vec(&r, k.C), dout = rnd_vec(&r, NC);
        std::vector<float> out(NC), mean(k.N), rstd(k.N), dinp(NC);
        layernorm_forward_cpu(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), k.N, k.C);
        std::vector<bf16> dw0 = bf16_vector_of(rnd_vec(&r, k.C)), db0 = bf16_vector_of(rnd_vec(&r, k.C));
        std::vector<float> dw_c = fp32_vector_of(dw0), db_c = fp32_vector_of(db0);
        layernorm_backward_cpu(dinp.data(), Grad(dw_c.data()), Grad(db_c.data()), dout.data(), inp.data(), w.data(), mean.data(), rstd.data(), k.N, k.C);
        DevBuf di = dev_up(cx, inp), dwt = dev_up(cx, w), dd = dev_up(cx, dout), cm = dev_up(cx, mean), cr = dev_up(cx, rstd);
        DevBuf ddinp = dev_up(cx, std::vector<float>(NC, 0.0f));
        bf16 *dwb = up16(dw0, k.off), *dbb = up16(db0, k.off);
        layernorm_backward_cuda(cx, ddinp.p, Grad(dwb), Grad(dbb), dd.p, di.p, dwt.p, cm.p, cr.p, k.N, k.C);
        check_le(bf16_ulps_from(down16(dwb, k.C), dw_c), ULP_BOUND, "%-22s %-44s bf16 units from the CPU's fp32 sums", "layernorm_backward dw16", s);
        check_le(bf16_ulps_from(down16(dbb, k.C), db_c), ULP_BOUND, "%-22s %-44s bf16 units from the CPU's fp32 sums", "layernorm_backward db16", s);
        for (DevBuf* d : {&di, &dwt, &dd, &cm, &cr, &ddinp}) cuda_free(cx, d->base);
    }
    struct { int B, T, C, Vl, v0, distinct, P; } ecases[] = {{2, 32, 96, 8, 0, 5, 1}, {4, 17, 33, 40, 40, 100, 2}, {2, 64, 64, 3, 1, 4, 4}};
    for (auto& k : ecases) {
        char s[64];
        int N = k.B * k.T, Nr = N / k.P, t0 = k.P > 1 ? Nr : 0;
        snprintf(s, sizeof(s), "N=%d C=%d Vl=%d v0=%d t0=%d", N, k.C, k.Vl, k.v0, t0);
        auto tokens = rnd_ints(&r, N, k.distinct);
        auto dout = rnd_vec(&r, (long)N * k.C);
        std::vector<bf16> we0 = bf16_vector_of(rnd_vec(&r, (long)k.Vl * k.C)), wp0 = bf16_vector_of(rnd_vec(&r, (long)k.T * k.C));
        std::vector<bf16> we_c = we0, wp_c = wp0;
        encoder_backward_cpu(Grad(we_c.data()), dout.data(), tokens.data(), nullptr, k.v0, k.Vl, N, k.C);
        position_backward_cpu(Grad(wp_c.data()), dout.data(), Nr, t0, k.T, k.C);
        std::vector<int> groups(ENC_GROUP_INTS(N));  // grouped by row on the host, as gpt_forward does
        encoder_groups(tokens.data(), k.v0, k.Vl, N, groups.data());
        int *dtok = dev_up_int(cx, tokens), *dgroups = dev_up_int(cx, groups);
        DevBuf dd = dev_up(cx, dout);
        bf16 *web = up16(we0), *wpb = up16(wp0);
        encoder_backward_cuda(cx, Grad(web), dd.p, dtok, dgroups, k.v0, k.Vl, N, k.C);
        position_backward_cuda(cx, Grad(wpb), dd.p, Nr, t0, k.T, k.C);
        check_le((double)(down16(web, we0.size()) != we_c), 0, "%-22s %-44s the CPU's bf16 bits (0: all equal)", "encoder_backward dwte16", s);
        check_le((double)(down16(wpb, wp0.size()) != wp_c), 0, "%-22s %-44s the CPU's bf16 bits (0: all equal)", "position_backward dwpe16", s);
        cuda_free(cx, dtok);
        cuda_free(cx, dgroups);
        cuda_free(cx, dd.base);
    }
    for (long n : {5L, 1027L, 4099L})
        for (int off = 0; off < 2; off++) {
            char s[64];
            snprintf(s, sizeof(s), "n=%ld%s", n, off ? " grads 2 bytes past" : "");
            auto p = rnd_vec(&r, n), m = rnd_vec(&r, n, -0.1f, 0.1f), v = rnd_vec(&r, n, 0.0f, 0.01f);
            std::vector<bf16> g = bf16_vector_of(rnd_vec(&r, n));
            std::vector<float> norm2 = {3.0f, 1.5f}, pc = p, mc = m, vc = v, sq = {0.25f};
            adamw_cpu(pc.data(), g.data(), mc.data(), vc.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, norm2.data(), 1.0f);
            sumsq_cpu(sq.data(), g.data(), n);
            DevBuf dp = dev_up(cx, p), dm = dev_up(cx, m), dv = dev_up(cx, v), dn = dev_up(cx, norm2), dsq = dev_up(cx, {0.25f});
            const bf16* gb = up16(g, off);
            adamw_cuda(cx, dp.p, gb, dm.p, dv.p, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, dn.p, 1.0f);
            sumsq_cuda(cx, dsq.p, gb, n);
            expect_close("adamw bf16 grads", (std::string(s) + " params").c_str(), dev_down(cx, dp.p, n), pc, FP32_BOUND);
            expect_close("adamw bf16 grads", (std::string(s) + " m").c_str(), dev_down(cx, dm.p, n), mc, FP32_BOUND);
            expect_close("adamw bf16 grads", (std::string(s) + " v").c_str(), dev_down(cx, dv.p, n), vc, FP32_BOUND);
            expect_close("sumsq bf16", s, dev_down(cx, dsq.p, 1), sq, 1e-6);
            for (DevBuf* d : {&dp, &dm, &dv, &dn, &dsq}) cuda_free(cx, d->base);
        }
    for (float* b : bases) cuda_free(cx, b);
}

// The ops that write a bf16 run's kept activations straight into bf16 storage: layernorm_forward into bf16
// (8-byte stores of 4, and one by one where C % 4 or the address says so) within half a bf16 unit of the CPU's
// fp32 output plus the fp32 ops' difference, and the same statistics; gelu_forward_bf16 (16-byte loads and
// stores, and one by one): the kept pre-activation the CPU's bits exactly (a rounding of the same fp32
// values), the GELU's output within half a bf16 unit of the CPU's fp32 GELU of it; gelu_backward from the
// kept bf16 into bf16 storage (gelu_backward_bf16) within half a bf16 unit of the CPU's fp32 gradient. And
// the residual stream in bf16 storage: layernorm_forward and _backward reading it (8-byte loads of 4, and
// one by one), the bits they give on fp32 words of the same values; residual_forward writing it, the CPU's.
static void test_bf16_elementwise(CudaCtx* cx) {
    printf("layernorm_forward into bf16, gelu_forward_bf16, gelu_backward_bf16; the residual stream in bf16\n");
    Rnd r = {47};
    const double ULP_BOUND = 0.51;
    struct { int N, C, off; } lcases[] = {{5, 64, 0}, {33, 100, 0}, {257, 768, 0}, {130, 770, 0}, {64, 96, 2}, {64, 96, 4}};
    for (auto& k : lcases) {
        char s[64];
        snprintf(s, sizeof(s), "N=%d C=%d%s", k.N, k.C, k.off ? (k.off == 4 ? " out 8 bytes past" : " out 4 bytes past") : "");
        long NC = (long)k.N * k.C;
        auto inp = rnd_vec(&r, NC, -2, 3), w = rnd_vec(&r, k.C, 0.5f, 1.5f), b = rnd_vec(&r, k.C);
        std::vector<float> out_c(NC), mean_c(k.N), rstd_c(k.N);
        layernorm_forward_cpu(out_c.data(), mean_c.data(), rstd_c.data(), inp.data(), w.data(), b.data(), k.N, k.C);
        DevBuf di = dev_up(cx, inp), dw = dev_up(cx, w), db = dev_up(cx, b);
        DevBuf dmean = dev_up(cx, std::vector<float>(k.N, 7.0f)), drstd = dev_up(cx, std::vector<float>(k.N, 7.0f));
        bf16* obase = (bf16*)cuda_alloc(cx, (NC + k.off + 1) / 2);
        layernorm_forward_cuda(cx, obase + k.off, dmean.p, drstd.p, di.p, dw.p, db.p, k.N, k.C);
        std::vector<bf16> g16(NC);
        cuda_download(cx, g16.data(), obase + k.off, NC * sizeof(bf16));
        check_le(bf16_ulps_from(g16, out_c), ULP_BOUND, "%-22s %-44s bf16 units from the CPU's fp32 output", "layernorm_forward bf16", s);
        expect_close("layernorm_forward bf16 mean", s, dev_down(cx, dmean.p, k.N), mean_c, FP32_BOUND);
        expect_close("layernorm_forward bf16 rstd", s, dev_down(cx, drstd.p, k.N), rstd_c, FP32_BOUND);
        // the residual stream in bf16 storage (off as out's): the layernorm's forward and backward reading it,
        // the bits of the same kernels on fp32 words of the same values (as aligned: 4 bytes past, neither is
        // read 4 at a time, and a warp's sums run in the order of its loads); the residual add writing it, the
        // CPU op's bits
        std::vector<bf16> res_h(NC);
        bf16_pack_cpu(res_h.data(), inp.data(), NC);
        std::vector<float> res_w(NC);
        bf16_widen_cpu(res_w.data(), res_h.data(), NC);
        bf16* rbase = (bf16*)cuda_alloc(cx, (NC + k.off + 1) / 2);
        cuda_upload(cx, rbase + k.off, res_h.data(), NC * sizeof(bf16));
        const Input res16 = {nullptr, rbase + k.off};
        auto sevens = [&](long n) { return dev_up(cx, std::vector<float>(n, 7.0f)); };
        auto dout = rnd_vec(&r, NC), x = rnd_vec(&r, NC);
        DevBuf rw = dev_up(cx, res_w, k.off == 2), o1 = sevens(NC), o2 = sevens(NC), m1 = sevens(k.N), m2 = sevens(k.N), s1 = sevens(k.N),
               s2 = sevens(k.N), dd = dev_up(cx, dout), dx1 = sevens(NC), dx2 = sevens(NC), gw1 = sevens(k.C), gw2 = sevens(k.C),
               gb1 = sevens(k.C), gb2 = sevens(k.C), dx = dev_up(cx, x);
        layernorm_forward_cuda(cx, o1.p, m1.p, s1.p, rw.p, dw.p, db.p, k.N, k.C);
        layernorm_forward_cuda(cx, o2.p, m2.p, s2.p, res16, dw.p, db.p, k.N, k.C);
        layernorm_backward_cuda(cx, dx1.p, gw1.p, gb1.p, dd.p, rw.p, dw.p, m1.p, s1.p, k.N, k.C);
        layernorm_backward_cuda(cx, dx2.p, gw2.p, gb2.p, dd.p, res16, dw.p, m1.p, s1.p, k.N, k.C);
        auto differ = [&](const DevBuf& a, const DevBuf& b, long n) { return count_diff(dev_down(cx, a.p, n), dev_down(cx, b.p, n)); };
        long sd = differ(o1, o2, NC) + differ(m1, m2, k.N) + differ(s1, s2, k.N) + differ(dx1, dx2, NC) + differ(gw1, gw2, k.C) +
                  differ(gb1, gb2, k.C);
        check_le(sd, 0, "%-22s %-44s floats differing from fp32 words of the same values", "layernorm, bf16 stream", s);
        std::vector<bf16> add_c(NC), add_g(NC);
        residual_forward_cpu((float*)(void*)add_c.data(), Input{nullptr, res_h.data()}, x.data(), b.data(), k.N, k.C);
        bf16* abase = (bf16*)cuda_alloc(cx, (NC + k.off + 1) / 2);
        residual_forward_cuda(cx, (float*)(void*)(abase + k.off), res16, dx.p, db.p, k.N, k.C);
        cuda_download(cx, add_g.data(), abase + k.off, NC * sizeof(bf16));
        long ad = 0;
        for (long i = 0; i < NC; i++) ad += add_g[i] != add_c[i];
        check_le(ad, 0, "%-22s %-44s bf16 differing from the CPU's", "residual_forward bf16", s);
        cuda_free(cx, obase);
        cuda_free(cx, rbase);
        cuda_free(cx, abase);
        for (DevBuf* d : {&di, &dw, &db, &dmean, &drstd, &rw, &o1, &o2, &m1, &m2, &s1, &s2, &dd, &dx1, &dx2, &gw1, &gw2, &gb1, &gb2, &dx})
            cuda_free(cx, d->base);
    }
    long sizes[] = {1, 3, 8, 1000, 1025, 1 << 16};
    for (long n : sizes)
        for (int pad = 0; pad < 3; pad++) {  // 1: the fp32 input off 16 bytes; 2: the bf16 outputs 2 bytes off
            char s[64];
            snprintf(s, sizeof(s), "N=%ld%s", n, pad == 1 ? " inp unaligned" : pad == 2 ? " out unaligned" : "");
            auto x = rnd_vec(&r, n, -6, 6), d = rnd_vec(&r, n);
            if (n > 3) { x[0] = -100.0f; x[1] = 100.0f; x[2] = 0.0f; }
            std::vector<bf16> kept_c(n), out16_c(n);
            gelu_forward_bf16_cpu(out16_c.data(), kept_c.data(), x.data(), n);
            std::vector<float> kept_f(n), gelu_c(n), dc = d;
            for (long i = 0; i < n; i++) kept_f[i] = bf16_to_float(kept_c[i]);
            gelu_forward_cpu(gelu_c.data(), kept_f.data(), n);  // the CPU's GELU of the kept values, unrounded
            gelu_backward_cpu(dc.data(), kept_f.data(), dc.data(), n);  // the CPU's gradient, unrounded
            DevBuf dx = dev_up(cx, x, pad == 1), dd = dev_up(cx, d);
            int o = pad == 2;
            bf16* kbase = (bf16*)cuda_alloc(cx, (n + o + 1) / 2);
            bf16* gbase = (bf16*)cuda_alloc(cx, (n + o + 1) / 2);
            gelu_forward_bf16_cuda(cx, gbase + o, kbase + o, dx.p, n);
            std::vector<bf16> kept_g(n), out16_g(n);
            cuda_download(cx, kept_g.data(), kbase + o, n * sizeof(bf16));
            cuda_download(cx, out16_g.data(), gbase + o, n * sizeof(bf16));
            long kd = 0;
            for (long i = 0; i < n; i++) kd += kept_g[i] != kept_c[i];
            check_le(kd, 0, "%-22s %-44s kept pre-activations differing from the CPU's", "gelu_forward_bf16", s);
            check_le(bf16_ulps_from(out16_g, gelu_c), ULP_BOUND, "%-22s %-44s bf16 units from the CPU's fp32 GELU", "gelu_forward_bf16", s);
            // the gradient into bf16 storage (over the GELU's output, as gpt.cu's into a buffer free by then)
            gelu_backward_bf16_cuda(cx, gbase + o, kbase + o, dd.p, n);
            std::vector<bf16> dg16(n);
            cuda_download(cx, dg16.data(), gbase + o, n * sizeof(bf16));
            check_le(bf16_ulps_from(dg16, dc), ULP_BOUND, "%-22s %-44s bf16 units from the CPU's fp32 gradient", "gelu_backward_bf16", s);
            cuda_free(cx, kbase);
            cuda_free(cx, gbase);
            for (DevBuf* b : {&dx, &dd}) cuda_free(cx, b->base);
        }
}

// the bf16 copy of the master weights: the CUDA op against the CPU op, bit for bit, on every tensor's
// shard of every rank at TP = 2 and 4, in two slices (as ZeRO-1 cuts a shard), for three launches
static void test_bf16_from_master(CudaCtx* cx) {
    printf("bf16_from_master (stochastic rounding keyed on the full index)\n");
    GPTConfig cfg;
    cfg.L = 2; cfg.NH = 4; cfg.C = 64; cfg.V = 300; cfg.Vp = 384; cfg.maxT = 32;
    std::vector<float> full(gpt_num_params(&cfg));
    Rnd rd = {17};
    for (float& x : full) x = 0.1f * (rnd_uniform(&rd) - 0.5f);
    struct { int threads; unsigned blocks; const char* what; } launches[] = {{256, 0, "256 x n/256"}, {64, 3, "64 x 3, grid-stride"},
                                                                             {1024, 1, "1024 x 1"}};
    for (int P : {2, 4}) {
        long diff = 0, total = 0;
        for (int r = 0; r < P; r++) {
            ShardPlan sp;
            shard_plan_init(&sp, &cfg, P, r);
            long off = 0;
            for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
                const TensorShard* ts = &sp.t[t];
                long n = shard_local_size(ts), a = n / 3;
                std::vector<float> local(n);
                shard_copy(ts, r, full.data() + off, local.data(), true);
                FullIndex map = shard_full_index(ts, r, off);
                std::vector<bf16> want(n), got(n);
                bf16_from_master_cpu(want.data(), local.data(), 0, n, map, 11, 1337);
                DevBuf dm = dev_up(cx, local);
                bf16* dout = (bf16*)cuda_alloc(cx, (n + 1) / 2);
                for (auto& l : launches) {
                    cuda_zero(cx, (float*)dout, (n + 1) / 2);
                    bf16_from_master_cuda(cx, dout, dm.p, 0, a, map, 11, 1337, l.threads, l.blocks);
                    bf16_from_master_cuda(cx, dout + a, dm.p + a, a, n - a, map, 11, 1337, l.threads, l.blocks);
                    cuda_download(cx, got.data(), dout, n * sizeof(bf16));
                    for (long i = 0; i < n; i++) diff += got[i] != want[i];
                    total += n;
                }
                cuda_free(cx, dm.base);
                cuda_free(cx, dout);
                off += shard_full_size(ts);
            }
        }
        check_le(diff, 0, "%-22s TP=%d, every rank's shard of the 16 tensors, 3 launches: bf16 weights differing of %ld", "bf16_from_master", P,
                 total);
    }
}

// 40,000 floats of random bits (every other one cut to a bf16 value with bf16_half), then zeros,
// infinities, a NaN, a denormal and two ties of bf16 rounding
static std::vector<float> random_bit_floats(uint64_t seed, bool bf16_half) {
    std::vector<float> x;
    Rnd rd = {seed};
    for (int i = 0; i < 40000; i++) {
        uint32_t u = (uint32_t)(rnd_uniform(&rd) * 4294967295.0);
        if (bf16_half && i % 2) u &= 0xffff0000u;
        float f;
        memcpy(&f, &u, 4);
        x.push_back(f);
    }
    for (float f : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, 1.00390625f, 1.01171875f}) x.push_back(f);
    return x;
}

// round_bf16: in place to the nearest bf16, the vector path (aligned, n a multiple of 4) and the scalar one
static void test_round_bf16(CudaCtx* cx) {
    printf("round_bf16 (activations kept in bf16)\n");
    std::vector<float> x = random_bit_floats(23, false);
    for (long n : {(long)x.size(), (long)x.size() - 3}) {  // a multiple of 4, and not
        for (int pad : {0, 1}) {                            // 16-byte aligned, and not
            std::vector<float> want(x.begin(), x.begin() + n), got(n);
            round_bf16_cpu(want.data(), n);
            DevBuf d = dev_up(cx, std::vector<float>(x.begin(), x.begin() + n), pad);
            round_bf16_cuda(cx, d.p, n);
            cuda_download(cx, got.data(), d.p, n * sizeof(float));
            cuda_free(cx, d.base);
            check_le(memcmp(got.data(), want.data(), n * sizeof(float)) != 0, 0,
                     "%-22s %ld floats%s: differing from the CPU's (bits, NaN included)", "round_bf16", n,
                     n % 4 == 0 && pad == 0 ? " (128-bit loads and stores)" : pad ? " (misaligned: one at a time)" : " (one at a time)");
        }
    }
}

// bf16_pack and bf16_widen (SP's gathers of bf16 values): against the CPU's, bit for bit, on the vector
// path (16-byte aligned, n a multiple of 8) and the scalar one (n not, or either side misaligned)
static void test_bf16_wire(CudaCtx* cx) {
    printf("bf16_pack, bf16_widen (SP's all-gathers of bf16 values)\n");
    std::vector<float> x = random_bit_floats(29, true);  // half of them bf16 values already, as the gathers' are
    for (long n : {(long)x.size(), (long)x.size() - 3}) {  // a multiple of 8, and not
        for (int pad : {0, 1}) {                            // 16-byte aligned, and not (both sides)
            const char* how = n % 8 == 0 && pad == 0 ? " (128-bit loads and stores)" : pad ? " (misaligned: one at a time)" : " (one at a time)";
            std::vector<bf16> want(n), got(n);
            bf16_pack_cpu(want.data(), x.data(), n);
            DevBuf d = dev_up(cx, std::vector<float>(x.begin(), x.begin() + n), pad);
            float* wire = cuda_alloc(cx, n / 2 + 2);
            bf16* h = (bf16*)(void*)wire + pad;
            bf16_pack_cuda(cx, h, d.p, n);
            cuda_download(cx, got.data(), h, n * sizeof(bf16));
            check_le(memcmp(got.data(), want.data(), n * sizeof(bf16)) != 0, 0, "%-22s %ld floats%s: differing from the CPU's (bits)",
                     "bf16_pack", n, how);
            // and back: the CPU's bf16 widened on the GPU, against the CPU's widening
            std::vector<float> back(n), gback(n);
            bf16_widen_cpu(back.data(), want.data(), n);
            bf16_widen_cuda(cx, d.p, h, n);
            cuda_download(cx, gback.data(), d.p, n * sizeof(float));
            check_le(memcmp(gback.data(), back.data(), n * sizeof(float)) != 0, 0, "%-22s %ld bf16%s: differing from the CPU's (bits)",
                     "bf16_widen", n, how);
            cuda_free(cx, d.base);
            cuda_free(cx, wire);
        }
    }
}

// ----------------------------------------------------------------------------
// collectives on the GPU

// rank q of group g on device gpu, in the calling thread: its CUDA context and its communicator bound to
// the context's stream (NCCL when the group has NCCL communicators, else shared GPU memory)
static void gpu_comm_rank(CudaCtx* cx, Comm* c, CommGroup* g, int q, int gpu) {
    cuda_ctx_init(cx, q, gpu);
    comm_init(c, g, q);
    comm_bind_cuda(c, gpu, cx->stream);
}

// P rank threads, each with its own context on gpus[r]; with nccl, the NCCL backend, else COMM_CUDA
static void test_comm(const std::vector<int>& gpus, bool nccl) {
    int P = (int)gpus.size();
    printf("collectives on the GPU: %s, P=%d\n", nccl ? "NCCL" : "shared-memory CUDA path", P);
    long sizes[] = {1, 7, 1001, 1 << 18};
    for (long n : sizes) {
        CommGroup* g = new CommGroup();
        comm_group_init(g, P, 60);
        if (nccl) comm_nccl_init_all(g, gpus.data());
        std::vector<std::vector<float>> in(P), sum(P), mx(P), gat(P), rsin(P), rs(P);
        for (int q = 0; q < P; q++) {
            Rnd rr = {(uint64_t)(q * 1000 + n)};
            in[q] = rnd_vec(&rr, n, -3, 3);
            rsin[q] = rnd_vec(&rr, n * P, -3, 3);
        }
        std::vector<std::thread> th;
        for (int q = 0; q < P; q++)
            th.emplace_back([&, q]() {
                CudaCtx cx;
                Comm c;
                gpu_comm_rank(&cx, &c, g, q, gpus[q]);
                float* ds = cuda_alloc(&cx, n);
                float* dm = cuda_alloc(&cx, n);
                float* dg = cuda_alloc(&cx, n * P);
                float* drs = cuda_alloc(&cx, n * P);
                cuda_upload(&cx, drs, rsin[q].data(), n * P * sizeof(float));
                cuda_upload(&cx, ds, in[q].data(), n * sizeof(float));
                cuda_upload(&cx, dm, in[q].data(), n * sizeof(float));
                comm_allreduce(&c, ds, n, COMM_SUM, "test", -1);
                comm_allreduce(&c, dm, n, COMM_MAX, "test", 3);
                comm_allgather(&c, dg, dm, n, "test", 3);  // gathers the maxima
                comm_reducescatter(&c, drs + q * n, drs, n, "test", 3);  // in place: slice q of the sum
                comm_sync(&c);
                sum[q] = dev_down(&cx, ds, n);
                mx[q] = dev_down(&cx, dm, n);
                gat[q] = dev_down(&cx, dg, n * P);
                rs[q] = dev_down(&cx, drs + q * n, n);
                comm_barrier(&c, "end");
                for (float* p : {ds, dm, dg, drs}) cuda_free(&cx, p);
                comm_free(&c);
                cuda_ctx_free(&cx);
            });
        for (auto& t : th) t.join();
        long bad_sum = 0, bad_other = 0, differ = 0;
        double err = 0.0;
        for (int q = 0; q < P; q++)
            for (long i = 0; i < n; i++) {
                float s = rsin[0][q * n + i];
                for (int p2 = 1; p2 < P; p2++) s += rsin[p2][q * n + i];
                bad_sum += rs[q][i] != s;
                err = worse(err, (double)fabsf(rs[q][i] - s));
            }
        for (long i = 0; i < n; i++) {
            float s = in[0][i], m = in[0][i];
            for (int q = 1; q < P; q++) { s += in[q][i]; m = std::max(m, in[q][i]); }
            for (int q = 0; q < P; q++) {
                bad_sum += sum[q][i] != s;
                err = worse(err, (double)fabsf(sum[q][i] - s));
                differ += memcmp(&sum[q][i], &sum[0][i], sizeof(float)) != 0;
                bad_other += mx[q][i] != m;
                for (int p2 = 0; p2 < P; p2++) bad_other += gat[q][p2 * n + i] != m;
            }
        }
        if (nccl) {
            check_le(err, 1e-5, "NCCL P=%d n=%ld: all-reduce and reduce-scatter sums against the rank-order sums, largest difference", P, n);
            check_le(differ, 0, "NCCL P=%d n=%ld: all-reduce sums differing across ranks", P, n);
            check_le(bad_other, 0, "NCCL P=%d n=%ld: mismatches in max, all-gather (exact)", P, n);
        } else {
            check_le(bad_sum + bad_other, 0, "CUDA shm P=%d n=%ld: mismatches (sum, max, reduce-scatter, all-gather; bit-exact)", P, n);
        }
        delete g;
    }
}

// Point to point on the GPU: P ranks on a line pass device buffers both ways, every send before any
// receive (a send never waits), received in order; bit for bit. With nccl the neighbours have NCCL's
// point-to-point communicators (comm_nccl_init_p2p): GPU to GPU over ncclSend and ncclRecv; else the
// messages go through host memory. Counts the floats sent, and the receive time on the GPU.
static void test_p2p_gpu(const std::vector<int>& gpus, bool nccl) {
    int P = (int)gpus.size(), msgs = 5;
    printf("point to point on the GPU: %s, %d ranks on a line, both ways, sends ahead of receives\n",
           nccl ? "NCCL send/recv" : "through host memory", P);
    long sizes[] = {1, 1001, 1 << 16};
    CommGroup* g = new CommGroup();
    comm_group_init(g, P, 60);
    if (nccl) {
        comm_nccl_init_all(g, gpus.data());
        comm_nccl_init_p2p(g, gpus.data());
    }
    std::vector<long> bad(P, 0), sent(P, 0), on_nccl(P, 0);
    std::vector<double> waited(P, 0.0);
    auto value = [](int src, int k, long i) { return (float)(src * 1000003 + k * 7919 + i) * 0.37f + 1e-30f * (float)i; };
    std::vector<std::thread> th;
    for (int r = 0; r < P; r++)
        th.emplace_back([&, r]() {
            CudaCtx cx;
            Comm c;
            gpu_comm_rank(&cx, &c, g, r, gpus[r]);
            on_nccl[r] = comm_nccl_p2p_to(&c, r == 0 ? 1 : r - 1);
            for (long n : sizes) {
                std::vector<float> host(n);
                float* d = cuda_alloc(&cx, n);
                for (int k = 0; k < msgs; k++)
                    for (int dst : {r - 1, r + 1}) {
                        if (dst < 0 || dst >= P) continue;
                        for (long i = 0; i < n; i++) host[i] = value(r, k, i);
                        cuda_upload(&cx, d, host.data(), n * sizeof(float));
                        comm_send(&c, dst, d, n, "test", k);  // the buffer is overwritten at once: the send has its copy
                    }
                for (int src : {r + 1, r - 1}) {
                    if (src < 0 || src >= P) continue;
                    for (int k = 0; k < msgs; k++) {
                        comm_recv(&c, src, d, n, "test", k);
                        comm_sync(&c);
                        std::vector<float> got = dev_down(&cx, d, n);
                        for (long i = 0; i < n; i++) {
                            float want = value(src, k, i);
                            bad[r] += memcmp(&got[i], &want, 4) != 0;
                        }
                    }
                }
                cuda_free(&cx, d);
            }
            sent[r] = (long)c.p2p_sent;
            waited[r] = c.p2p_seconds;
            comm_p2p_finish(&c);
            comm_free(&c);
            cuda_ctx_free(&cx);
        });
    for (auto& t : th) t.join();
    delete g;
    long total_bad = 0, total_sent = 0, want = 0, nccl_ranks = 0;
    for (int r = 0; r < P; r++) {
        total_bad += bad[r];
        total_sent += sent[r];
        nccl_ranks += on_nccl[r];
    }
    for (long n : sizes) want += n * msgs * 2 * (P - 1);
    const char* how = nccl ? "NCCL" : "host memory";
    check(nccl_ranks == (nccl ? P : 0), "%s: ranks whose neighbour messages go GPU to GPU: %ld of %d", how, nccl_ranks, P);
    check_le(total_bad, 0, "%s P=%d: floats received that differ from the ones sent (bit for bit, in order, %d messages per pair and size)",
             how, P, msgs);
    check(total_sent == want, "%s P=%d: floats counted as sent: %ld (expected %ld)", how, P, total_sent, want);
    double least = *std::min_element(waited.begin(), waited.end());
    check(least > 0.0 && std::isfinite(least), "%s P=%d: every rank's receive time is counted (least %.3g s)", how, P, least);
}

// A child process where rank 1 skips the first all-reduce; it must end non-zero naming the mismatch.
static int child_skip(bool nccl) {
    int P = 2;
    std::vector<int> gpus = {0, nccl ? 1 : 0};
    CommGroup* g = new CommGroup();
    comm_group_init(g, P, 20);
    if (nccl) comm_nccl_init_all(g, gpus.data());
    std::vector<std::thread> th;
    for (int q = 0; q < P; q++)
        th.emplace_back([&, q]() {
            CudaCtx cx;
            Comm c;
            gpu_comm_rank(&cx, &c, g, q, gpus[q]);
            float* d = cuda_alloc(&cx, 1000);
            if (q == 0) comm_allreduce(&c, d, 1000, COMM_SUM, "fc bwd", 3);
            comm_allreduce(&c, d, 1000, COMM_SUM, "qkv bwd", 3);
            comm_sync(&c);
            comm_barrier(&c, "end");
        });
    for (auto& t : th) t.join();
    return 0;  // not reached when the check works
}

// A child process: 2 pipeline stages on GPUs 0 and 1 (the boundary over NCCL send/recv), 4 micro-batches;
// stage 1's TP rank 0 stops for good before its second micro-batch. Stage 0 must end the run (exit 1)
// within --timeout 3, naming the stage it waited for.
static int child_pp_stall() {
    GPTConfig cfg = make_config(2, 4, 32, 200, 32);
    std::vector<float> init = init_weights(&cfg, 3);
    std::vector<int> data = random_tokens(4096, cfg.V, 1);
    g_device = DEV_CUDA;
    g_ngpu = 2;
    g_pp_plant_stall = 1;
    g_grid_timeout = 3;
    GridResult res;
    run_grid(&cfg, init, 1, 1, 0, 4, 2, data, 2, 16, &res, false, 0, 2);
    return 0;  // not reached when the timeout works
}

// runs cmd in a shell, its output into *out; returns its wait status
static int run_child(const std::string& cmd, std::string* out) {
    FILE* f = popen(cmd.c_str(), "r");
    char buf[512];
    while (f && fgets(buf, sizeof(buf), f)) *out += buf;
    return f ? pclose(f) : -1;
}

static void test_pp_stall_gpu(const char* argv0) {
    double t0 = comm_now();
    std::string out;
    int st = run_child(std::string(argv0) + " child-pp-stall 2>&1", &out);
    double took = comm_now() - t0;
    std::string line = first_line_with(out, "error:");
    bool named = line.find("stage 1 stalled or stopped") != std::string::npos;
    check(WIFEXITED(st) && WEXITSTATUS(st) == 1 && named && took < 60,
          "GPU pipeline, stage 1 stalls (--timeout 3, the boundary over NCCL send/recv): exit status %d after %.1f s, the error names "
          "stage 1: %s", WIFEXITED(st) ? WEXITSTATUS(st) : -1, took, line.c_str());
}

static void test_skip_detected(const char* argv0, bool nccl) {
    std::string out;
    int st = run_child(std::string(argv0) + (nccl ? " child-skip-nccl" : " child-skip-cuda") + " 2>&1", &out);
    bool named = out.find("collective mismatch") != std::string::npos || out.find("has not completed") != std::string::npos;
    check(st != 0 && named, "%s: a rank that skips a collective is reported (exit status %d): %s", nccl ? "NCCL" : "CUDA shm", st,
          out.substr(0, out.find('\n')).c_str());
}

// ----------------------------------------------------------------------------
// timing at GPT-2 124M shapes, one layer's ops, forward and backward

static void bench(CudaCtx* cx) {
    int B = 8, T = 1024, C = 768, NH = 12, hs = 64, V = 50257, Vp = 50304;
    long N = (long)B * T;
    Rnd r = {8};
    auto fill = [&](long n) { DevBuf b = dev_up(cx, rnd_vec(&r, n, -0.5f, 0.5f)); return b.p; };
    float *x = fill(N * C), *y = fill(N * C), *w = fill(4L * C * C), *bias = fill(4L * C), *qkv = fill(N * 3 * C);
    float *h = fill(N * 4 * C), *h2 = fill(N * 4 * C), *att = fill((long)B * NH * T * T), *mean = fill(N), *rstd = fill(N);
    float *dw = fill(4L * C * C), *db = fill(4L * C), *dqkv = fill(N * 3 * C), *wte = fill((long)Vp * C);
    float *logits = fill(N * Vp), *ce = fill(3 * N), *lse = fill((long)B * NH * T), *dsum = fill((long)B * NH * T);
    std::vector<int> tok(N);
    for (auto& t : tok) t = (int)(rnd_u64(&r) % V);
    int* dtok = dev_up_int(cx, tok);
    cudaEvent_t e0, e1;
    CUDA_CHECK(0, cudaEventCreate(&e0));
    CUDA_CHECK(0, cudaEventCreate(&e1));
    auto time = [&](const char* name, auto fn, double flops) {
        fn();
        CUDA_CHECK(0, cudaEventRecord(e0, cx->stream));
        const int reps = 10;
        for (int i = 0; i < reps; i++) fn();
        CUDA_CHECK(0, cudaEventRecord(e1, cx->stream));
        CUDA_CHECK(0, cudaEventSynchronize(e1));
        float ms = 0;
        CUDA_CHECK(0, cudaEventElapsedTime(&ms, e0, e1));
        ms /= reps;
        if (flops > 0) printf("  %-38s %8.3f ms  %6.1f TFLOP/s\n", name, ms, flops / (ms * 1e-3) / 1e12);
        else printf("  %-38s %8.3f ms\n", name, ms);
    };
    printf("bench: B=%d T=%d C=%d NH=%d (GPT-2 124M shapes), per call\n", B, T, C, NH);
    time("encoder_forward", [&] { encoder_forward_cuda(cx, x, dtok, wte, 0, Vp, (int)N, C); }, 0);
    time("layernorm_forward", [&] { layernorm_forward_cuda(cx, y, mean, rstd, x, w, bias, (int)N, C); }, 0);
    time("matmul_forward qkv (bias)", [&] { matmul_forward_cuda(cx, qkv, y, w, bias, (int)N, C, 3 * C); }, 2.0 * N * C * 3 * C);
    // per layer, attention both ways (TFLOP/s counted on the full T x T products for both, so the two rates
    // compare; fused skips the tiles above the diagonal, about half of them)
    time("attention_forward (matmul)", [&] { attention_forward_cuda(cx, y, att, qkv, B, T, NH, hs); }, 4.0 * B * NH * T * T * hs);
    time("attention_fused_forward", [&] { attention_fused_forward_cuda(cx, y, lse, qkv, B, T, NH, hs); }, 4.0 * B * NH * T * T * hs);
    cuda_set_tf32(cx, false);  // the fp32 kernels on the CUDA cores, which the tensor-core ones replace with TF32 on
    time("attention_fused_forward (fp32 cores)", [&] { attention_fused_forward_cuda(cx, y, lse, qkv, B, T, NH, hs); }, 4.0 * B * NH * T * T * hs);
    cuda_set_tf32(cx, true);
    time("matmul_forward fc (bias)", [&] { matmul_forward_cuda(cx, h, y, w, bias, (int)N, C, 4 * C); }, 2.0 * N * C * 4 * C);
    time("gelu_forward", [&] { gelu_forward_cuda(cx, h2, h, N * 4 * C); }, 0);
    time("matmul_forward fcproj", [&] { matmul_forward_cuda(cx, x, h2, w, nullptr, (int)N, 4 * C, C); }, 2.0 * N * C * 4 * C);
    time("residual_forward", [&] { residual_forward_cuda(cx, y, x, y, bias, (int)N, C); }, 0);
    time("matmul_forward lm head", [&] { matmul_forward_cuda(cx, logits, y, wte, nullptr, (int)N, C, Vp); }, 2.0 * N * C * Vp);
    time("crossentropy_max", [&] { crossentropy_max_cuda(cx, ce, logits, (int)N, Vp, 0, V); }, 0);
    time("crossentropy_sums", [&] { crossentropy_sums_cuda(cx, ce + N, logits, ce, dtok, (int)N, Vp, 0, V); }, 0);
    time("crossentropy_finish (dlogits)", [&] { crossentropy_finish_cuda(cx, ce, logits, ce, ce + N, dtok, (int)N, Vp, 0, V, 1e-30f); }, 0);
    time("matmul_backward lm head", [&] { matmul_backward_cuda(cx, y, wte, nullptr, logits, x, wte, (int)N, C, Vp); }, 4.0 * N * C * Vp);
    time("matmul_backward fc (dbias)", [&] { matmul_backward_cuda(cx, x, dw, db, h, y, w, (int)N, C, 4 * C); }, 4.0 * N * C * 4 * C);
    time("gelu_backward", [&] { gelu_backward_cuda(cx, h2, h, h2, N * 4 * C); }, 0);
    time("layernorm_backward", [&] { layernorm_backward_cuda(cx, x, dw, db, y, x, w, mean, rstd, (int)N, C); }, 0);
    time("attention_backward (matmul)", [&] { attention_backward_cuda(cx, dqkv, y, qkv, att, B, T, NH, hs); }, 8.0 * B * NH * T * T * hs);
    time("attention_fused_backward", [&] { attention_fused_backward_cuda(cx, dqkv, dsum, y, qkv, Input{x, nullptr}, lse, B, T, NH, hs); },
         8.0 * B * NH * T * T * hs);
    cuda_set_tf32(cx, false);
    time("attention_fused_backward (fp32 cores)", [&] { attention_fused_backward_cuda(cx, dqkv, dsum, y, qkv, Input{x, nullptr}, lse, B, T, NH, hs); },
         8.0 * B * NH * T * T * hs);
    cuda_set_tf32(cx, true);
    time("encoder_backward", [&] { encoder_backward_cuda(cx, wte, y, dtok, nullptr, 0, Vp, (int)N, C); }, 0);
    time("position_backward", [&] { position_backward_cuda(cx, x, y, (int)N, 0, T, C); }, 0);
    time("sumsq (124M floats)", [&] { sumsq_cuda(cx, ce, logits, 124000000L); }, 0);
    time("adamw (38.6M)", [&] { adamw_cuda(cx, wte, wte, logits, logits + (long)Vp * C, (long)Vp * C, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.0f, 1, ce, 0.0f); }, 0);
}

// Timing of the backward's overlap: gpt_backward of a GPT-2 124M-shaped model (4 of its 12 layers,
// B=4 T=1024) at TP=2, NCCL with two GPUs, else shared GPU memory on GPU 0, with the f sums started
// beside the weight gradients against done in line. Wall time of the whole backward on rank 0 (both ranks
// run the same schedule), each repetition alternating the two, so a drift in clocks hits both alike.
// small: a tiny model instead, so that the gpu group runs this code on the emulated GPU too.
static void bench_overlap(int ndev, bool small = false) {
    GPTConfig cfg = small ? make_config(2, 4, 64, 200, 64) : make_config(4, 12, 768, 50257, 1024);
    int P = 2, B = small ? 2 : 4, T = small ? 32 : 1024, reps = small ? 2 : 6;
    std::vector<float> init = init_weights(&cfg, 5);
    std::vector<int> data = random_tokens((long)B * T + 1, cfg.V, 3);
    bool nccl = ndev >= P;
    double ms[2] = {0, 0};  // [without, with]
    on_ranks(P, nccl, [&](CommGroup* group, int r) {
        Rank rk;
        rank_init(&rk, group, r, DEV_CUDA, nccl ? r : 0, 1);
        GPT m;
        gpt_build(&m, &rk, &cfg, init.data(), 0);
        gpt_forward(&m, &rk, data.data(), data.data() + 1, B, T, true);
        for (int i = 0; i < 2 * reps + 2; i++) {
            m.overlap = i % 2;
            comm_sync(&rk.tp);
            comm_barrier(&rk.tp, "bench");
            double t0 = comm_now();
            gpt_backward(&m, &rk);
            comm_sync(&rk.tp);
            if (r == 0 && i >= 2) ms[i % 2] += (comm_now() - t0) * 1e3 / reps;  // the first pair warms up
        }
        gpt_free(&m, &rk);
        rank_free(&rk);
    });
    printf("%s: backward of %d %s layers + LM head, B=%d T=%d, TP=2 (%s): %.3f ms without overlap, %.3f ms with (%.1f%% less)\n",
           small ? "  overlap timing (no bound: an emulated GPU)" : "bench", cfg.L, small ? "tiny" : "GPT-2 124M", B, T,
           nccl ? "NCCL" : "shared GPU memory", ms[0], ms[1], 100 * (1 - ms[1] / ms[0]));
}

#ifdef TP_EMU
// The bug the overlap invites, planted at the level of the calls: rank 0 of 2 (NCCL) starts the sum of
// its 1s with rank 1's 2s on the communication stream, then reads the buffer on its own stream. With
// plant, comm_finish leaves out its event wait and rank 1 starts only after rank 0 has read, as a slow
// peer would. On the emulator, whose streams run only when something waits for them, rank 0 then reads
// its own partial (1), every time; with the wait it reads the sum (3). Returns what rank 0 read.
static float missing_wait_read(bool plant) {
    CommGroup* g = new CommGroup();
    comm_group_init(g, 2, 60);
    std::vector<int> gpus = {0, 1};
    comm_nccl_init_all(g, gpus.data());
    std::atomic<bool> read(false);
    float seen = -1.0f;
    g_comm_plant_missing_wait = plant;
    std::vector<std::thread> th;
    for (int q = 0; q < 2; q++)
        th.emplace_back([&, q]() {
            CudaCtx cx;
            Comm c;
            gpu_comm_rank(&cx, &c, g, q, gpus[q]);
            std::vector<float> mine(64, (float)(q + 1));
            float* d = cuda_alloc(&cx, 64);
            cuda_upload(&cx, d, mine.data(), 64 * sizeof(float));
            while (plant && q == 1 && !read) std::this_thread::sleep_for(std::chrono::milliseconds(1));
            comm_allreduce_start(&c, d, 64, COMM_SUM, "plant", 0);
            comm_finish(&c);
            if (q == 0) {
                CUDA_CHECK(0, cudaMemcpyAsync(&seen, d, sizeof(float), cudaMemcpyDeviceToHost, cx.stream));
                CUDA_CHECK(0, cudaStreamSynchronize(cx.stream));
                read = true;
            }
            CUDA_CHECK(q, cudaStreamSynchronize(c.side));
            comm_free(&c);
            cuda_free(&cx, d);
            cuda_ctx_free(&cx);
        });
    for (auto& t : th) t.join();
    g_comm_plant_missing_wait = false;
    delete g;
    return seen;
}
#endif

// The backward's overlap (gpt.cu's my_tokens_summed_start): the f sums of the LM head, fc and qkv on the
// communication stream beside the weight gradients. The same ops on the same data, only on two streams,
// so the results must be the same bits as without it: at P = 2 (NCCL with two GPUs) and P = 4 (shared GPU
// memory), with and without SP, over a few steps. Then the bug the overlap invites, planted
// (missing_wait_read), on the emulator only: on a real GPU the race may go either way.
static void gpu_overlap_tests(const GPTConfig* cfg, const std::vector<float>& init, const std::vector<int>& data, int B, int T, int ndev) {
    int steps = 3;
    for (int P : {2, 4})
        for (bool sp : {false, true}) {
            TpResult on, off;
            g_overlap = true;
            run_tp(cfg, init, P, steps, data, B, T, 1e-3f, 1.0f, &on, sp);
            g_overlap = false;
            run_tp(cfg, init, P, steps, data, B, T, 1e-3f, 1.0f, &off, sp);
            g_overlap = true;
            long dl = count_diff(on.losses, off.losses), dg = count_diff(on.grads_full, off.grads_full);
            long dp = count_diff(on.params_full, off.params_full);
            check_le(dl + dg + dp, 0, "GPU TP=%d%s (%s): overlap on against off, differing losses (%d steps), step-0 gradients and "
                     "weights: %ld, %ld, %ld", P, sp ? " SP" : "", P <= ndev ? "NCCL" : "shared GPU memory", steps, dl, dg, dp);
        }
    bench_overlap(ndev, true);
#ifdef TP_EMU
    if (ndev >= 2) {
        float with = missing_wait_read(false), without = missing_wait_read(true);
        check(with == 3.0f && without == 1.0f, "a missing wait for a started sum is caught: rank 0 reads %g after comm_finish's wait (the "
              "sum of 1 and 2), %g with the wait planted away and the peer late (its own partial)", with, without);
    } else {
        printf("  skip the planted missing wait: it needs NCCL, 2 GPUs\n");
        g_skipped++;
    }
#endif
}


// Whole training runs on the GPU: GPU TP=1 against CPU TP=1 from the same checkpoint over 10 steps, then
// GPU TP=2 and 4 against GPU TP=1 with the CPU's bounds (TF32 off: with it on, AdamW turns TF32 noise in
// near-zero gradients into visible weight differences, which says nothing about the recipe).
static void gpu_training_tests(int ndev) {
    GPTConfig cfg = make_config(2, 4, 64, 200, 64);
    int B = 4, T = 32, steps = 10;
    std::vector<float> init = init_weights(&cfg, 7);
    std::vector<int> data = random_tokens((long)steps * B * T + 1, cfg.V, 99);
    TpResult cpu, gpu1;
    g_device = DEV_CPU;
    run_tp(&cfg, init, 1, steps, data, B, T, 1e-3f, 1.0f, &cpu);
    g_device = DEV_CUDA;
    g_ngpu = ndev;
    for (bool tf32 : {true, false}) {
        g_tf32 = tf32;
        run_tp(&cfg, init, 1, steps, data, B, T, 1e-3f, 1.0f, &gpu1);
        double lw = 0;
        for (int k = 0; k < steps; k++) lw = worse(lw, (double)fabs(gpu1.losses[k] - cpu.losses[k]) / cpu.losses[k]);
        double ge = rel_err(gpu1.grads_full.data(), cpu.grads_full.data(), (long)cpu.grads_full.size());
        check_le(lw, tf32 ? 2e-3 : 1e-5, "GPU TP=1 vs CPU TP=1 (%s): losses over %d steps, worst rel err", tf32 ? "TF32" : "fp32", steps);
        check_le(ge, tf32 ? 1e-2 : 1e-5, "GPU TP=1 vs CPU TP=1 (%s): step-0 gradients rel err", tf32 ? "TF32" : "fp32");
    }
    g_tf32 = false;
    for (int P : {2, 4}) {
        TpResult res;
        run_tp(&cfg, init, P, steps, data, B, T, 1e-3f, 1.0f, &res);
        double lw = 0;
        for (int k = 0; k < steps; k++) lw = worse(lw, (double)fabs(res.losses[k] - gpu1.losses[k]) / gpu1.losses[k]);
        double ge = rel_err(res.grads_full.data(), gpu1.grads_full.data(), (long)gpu1.grads_full.size());
        double pe = rel_err(res.params_full.data(), gpu1.params_full.data(), (long)gpu1.params_full.size());
        ShardPlan sp;
        shard_plan_init(&sp, &cfg, P, 0);
        long mism = 0;
        for (int r = 1; r < P; r++) {
            long loff = 0;
            for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
                long n = shard_local_size(&sp.t[i]);
                if (sp.t[i].split == SPLIT_NONE)
                    mism += memcmp(res.ranks[r].params.data() + loff, res.ranks[0].params.data() + loff, n * 4) != 0;
                loff += n;
            }
        }
        const char* how = P <= ndev ? "NCCL" : "shared GPU memory";
        check_le(lw, 1e-5, "GPU TP=%d (%s) vs GPU TP=1: losses over %d steps, worst rel err", P, how, steps);
        check_le(ge, 1e-5, "GPU TP=%d (%s) vs GPU TP=1: step-0 gradients rel err", P, how);
        check_le(pe, 1e-5, "GPU TP=%d (%s) vs GPU TP=1: weights after %d steps rel err", P, how, steps);
        check_le(mism, 0, "GPU TP=%d (%s): replicated tensors differing across ranks", P, how);
    }
    gpu_overlap_tests(&cfg, init, data, B, T, ndev);
    // --dtype bf16 on the GPU: against the CPU's bf16, TF32 against fp32 (bf16 operands are exact in TF32,
    // so both multiply the same numbers), TP=2 against TP=1, replicas bit-identical
    {
        TpResult cpu16, gpu16, gpu16_tf32, tp16;
        g_device = DEV_CPU;
        run_tp(&cfg, init, 1, steps, data, B, T, 1e-3f, 1.0f, &cpu16, false, 0, true, true);
        g_device = DEV_CUDA;
        run_tp(&cfg, init, 1, steps, data, B, T, 1e-3f, 1.0f, &gpu16, false, 0, true, true);
        g_tf32 = true;
        run_tp(&cfg, init, 1, steps, data, B, T, 1e-3f, 1.0f, &gpu16_tf32, false, 0, true, true);
        g_tf32 = false;
        run_tp(&cfg, init, 2, steps, data, B, T, 1e-3f, 1.0f, &tp16, false, 0, true, true);
        auto worst_loss = [&](const TpResult& a, const TpResult& b) {
            double w = 0;
            for (int k = 0; k < steps; k++) w = worse(w, (double)fabs(a.losses[k] - b.losses[k]) / b.losses[k]);
            return w;
        };
        check_le(worst_loss(gpu16, cpu16), 1e-3, "GPU bf16 TP=1 vs CPU bf16 TP=1: losses over %d steps, worst rel err", steps);
        check_le(rel_err(gpu16.grads_full.data(), cpu16.grads_full.data(), (long)cpu16.grads_full.size()), 1e-2,
                 "GPU bf16 TP=1 vs CPU bf16 TP=1: step-0 gradients rel err");
        check_le(worst_loss(gpu16_tf32, gpu16), 1e-3, "GPU bf16 TP=1, TF32 matmuls vs fp32 ones: losses over %d steps, worst rel err", steps);
        check_le(worst_loss(tp16, gpu16), 1e-3, "GPU bf16 TP=2 vs GPU bf16 TP=1: losses over %d steps, worst rel err", steps);
        check_le(rel_err(tp16.grads_full.data(), gpu16.grads_full.data(), (long)gpu16.grads_full.size()), 1e-2,
                 "GPU bf16 TP=2 vs GPU bf16 TP=1: step-0 gradients rel err");
        // SP in bf16: its gathers move bf16 (bf16_pack, the bf16 all-gather, bf16_widen on the GPU), the same
        // bits as in fp32 words
        TpResult sp16, sp16_wide;
        run_tp(&cfg, init, 2, steps, data, B, T, 1e-3f, 1.0f, &sp16, true, 0, true, true);
        g_bf16_in_fp32 = true;
        run_tp(&cfg, init, 2, steps, data, B, T, 1e-3f, 1.0f, &sp16_wide, true, 0, true, true);
        g_bf16_in_fp32 = false;
        check_le(worst_loss(sp16, gpu16), 1e-3, "GPU bf16 TP=2 SP vs GPU bf16 TP=1: losses over %d steps, worst rel err", steps);
        // the scratch the matmuls pack their fp32-word operands into, against what the memory check counts for
        // it (gpu_bf16_pack_bytes): the same to its padding (each operand from a 16-byte boundary, the
        // allocation in 256-byte units), at TP 1 and 2, with SP (ln1 and ln2 gathered as bf16, read where they
        // lie; lnf packed) and with -r 1 (the GELU's output recomputed, packed)
        TpResult r16;
        run_tp(&cfg, init, 2, 2, data, B, T, 1e-3f, 1.0f, &r16, false, 1, true, true);
        struct { const TpResult* res; int P; int r; const char* what; } packs[] = {
            {&gpu16, 1, 0, "TP=1"}, {&tp16, 2, 0, "TP=2"}, {&sp16, 2, 0, "TP=2 SP"}, {&r16, 2, 1, "TP=2 -r 1"}};
        for (auto& k : packs) {
            double want = gpu_bf16_pack_bytes(&cfg, k.P, B, T, k.r);
            check_le(fabs((double)k.res->packed_bytes - want), 512, "GPU bf16 %s: the packed operands' scratch, %zu bytes, against "
                     "the memory check's %.0f: difference", k.what, k.res->packed_bytes, want);
        }
        bool same = sp16.losses == sp16_wide.losses && sp16.params_full == sp16_wide.params_full && sp16.grads_full == sp16_wide.grads_full;
        check(same, "GPU bf16 TP=2 SP: the gathers in bf16 (%.0f words a step) and in fp32 words (%.0f): the same losses, step-0 "
              "gradients and weights after %d steps", sp16.moved[KIND_ALLGATHER], sp16_wide.moved[KIND_ALLGATHER], steps);
        GridResult dp16;
        run_grid(&cfg, init, 1, 2, 1, 1, steps, data, B, T, &dp16, false, 0, 1, PP_1F1B, DTYPE_BF16);
        check_le(dp16.mismatches, 0, "GPU bf16 (P 1, D 2, -z 1): weight checksums differing from replica 0's (%ld compared)", dp16.compared);
        GridResult dp16_wide;  // ZeRO-1 gathering the fp32 masters, as before the bf16 copy was gathered
        g_bf16_in_fp32 = true;
        run_grid(&cfg, init, 1, 2, 1, 1, steps, data, B, T, &dp16_wide, false, 0, 1, PP_1F1B, DTYPE_BF16);
        g_bf16_in_fp32 = false;
        check(dp16.losses == dp16_wide.losses && dp16.params_full == dp16_wide.params_full,
              "GPU bf16 (P 1, D 2, -z 1): gathering the bf16 copy (%.0f words a step) and the fp32 masters (%.0f): the same losses "
              "and masters after %d steps", dp16.dp_moved[KIND_ALLGATHER], dp16_wide.dp_moved[KIND_ALLGATHER], steps);
    }
    // data parallelism on the GPU: replicas through shared GPU memory (one GPU) or NCCL (one GPU per rank)
    for (int P : {1, 2}) {
        int D = 2;
        GridResult one, grid;
        run_grid(&cfg, init, 1, 1, 0, 1, steps, data, 2 * B, T, &one);
        run_grid(&cfg, init, P, D, P - 1, 1, steps, data, B, T, &grid);
        const char* how = P * D <= ndev ? "NCCL" : "shared GPU memory";
        check_le(max_abs_diff(grid.losses, one.losses), 1e-5, "GPU (P %d, D %d, -z %d, %s) vs GPU -b %d: losses over %d steps, largest difference",
                 P, D, P - 1, how, 2 * B, steps);
        check_le(rel_err(grid.params_full.data(), one.params_full.data(), (long)one.params_full.size()), 1e-5,
                 "GPU (P %d, D %d, -z %d, %s) vs GPU -b %d: weights after %d steps rel err", P, D, P - 1, how, 2 * B, steps);
        check_le(grid.mismatches, 0, "GPU (P %d, D %d, -z %d, %s): weight checksums differing from replica 0's (%ld compared)", P, D, P - 1,
                 how, grid.compared);
    }
    // pipeline parallelism on the GPU: 2 stages, 3 micro-batches. At P = 1 on two GPUs the stages are on
    // distinct GPUs: the boundary tensors go over NCCL send/recv and the stages' sums (the norm, wte's
    // gradient) over NCCL; at P = 2 the two stages' TP rank r share a GPU, so through host memory and
    // shared GPU memory. Each against PP 1 at the same P, so that the bounds measure the pipeline alone: TP = 2
    // against TP = 1 reorders the row-parallel sums, which in this model's gradients after 10 steps is 1.0e-5
    // by itself on the CPU (and is bounded where TP is tested, above)
    for (int P : {1, 2}) {
        GridResult one, pp;
        run_grid(&cfg, init, P, 1, 0, 3, steps, data, B, T, &one);
        run_grid(&cfg, init, P, 1, 0, 3, steps, data, B, T, &pp, false, 0, 2, P == 1 ? PP_1F1B : PP_GPIPE);
        const char* how = ndev < 2 ? "stages on 1 GPU" : P == 1 ? "stages on 2 GPUs, NCCL send/recv" : "stages on 2 GPUs";
        check_le(max_abs_diff(pp.losses, one.losses), 1e-5, "GPU (S 2, P %d, %s, %s) vs GPU P %d PP 1, 3 micro-batches: losses over %d "
                 "steps, largest difference", P, P == 1 ? "1F1B" : "GPipe", how, P, steps);
        check_le(rel_err(pp.params_full.data(), one.params_full.data(), (long)one.params_full.size()), 1e-5,
                 "GPU (S 2, P %d, %s) vs GPU P %d PP 1: weights after %d steps rel err", P, how, P, steps);
        check_le(rel_err(pp.grads_full.data(), one.grads_full.data(), (long)one.grads_full.size()), 1e-5,
                 "GPU (S 2, P %d, %s) vs GPU P %d PP 1: gradients of the last step rel err", P, how, P);
    }
    g_device = DEV_CPU;
    g_tf32 = true;
}

// the serving ops' test (kv_write, attention_decode, position_rows_forward) lives with the serving tests
static void test_kv_ops(CudaCtx* cx);

static void gpu_op_tests(const char* argv0, int ndev) {
    CudaCtx cx;
    cuda_ctx_init(&cx, 0, 0);
    cpu_pool_start((int)std::max(1u, std::thread::hardware_concurrency()));  // the CPU references on every core
    test_matmul(&cx);
    test_attention(&cx);
    test_attention_fused(&cx);
    cuda_set_tf32(&cx, false);  // full fp32: the same comparisons, tight
    test_matmul(&cx);
    test_attention(&cx);
    test_attention_fused(&cx);
    cuda_set_tf32(&cx, true);
    test_encoder(&cx);
    test_layernorm(&cx);
    test_gelu(&cx);
    test_crossentropy(&cx);
    test_adamw_sumsq(&cx);
    test_bf16_from_master(&cx);
    test_round_bf16(&cx);
    test_bf16_wire(&cx);
    test_gemm_bf16(&cx);
    test_bf16_weights(&cx);
    test_bf16_logits(&cx);
    test_bf16_elementwise(&cx);
    test_bf16_grads(&cx);
    test_kv_ops(&cx);
    cuda_ctx_free(&cx);
    for (int P = 1; P <= 4; P++) test_comm(std::vector<int>(P, 0), false);
    test_skip_detected(argv0, false);
    test_p2p_gpu(std::vector<int>(3, 0), false);
    if (ndev >= 2) {
        std::vector<int> gpus;
        for (int i = 0; i < std::min(ndev, 4); i++) gpus.push_back(i);
        test_comm(gpus, true);
        test_p2p_gpu(gpus, true);
        test_pp_stall_gpu(argv0);
        test_skip_detected(argv0, true);
    } else {
        printf("NCCL collectives skipped: %d GPU (they need 2)\n", ndev);
    }
}

