// test_tp.cu: the tests. `make test` builds and runs them all; the last line is "N passed, N failed".
// `./test_tp GROUP ...` runs the named groups, `./test_tp --list` lists them.
//
// CPU tests always run: collectives, TP=P against TP=1, replicated parameters bit-identical on every
// rank, the backward against finite differences, the forward against an independent double-precision
// reference, the data loader, checkpoints, and the command line. The GPU tests (dev/test_gpu.cuh) run
// when a GPU is visible and are reported skipped otherwise. Each test asserts a number against a bound.
#define TESTING
#include "tp.cu"
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <sys/resource.h>
#include <sys/wait.h>

static int g_passed = 0, g_failed = 0, g_skipped = 0;
static std::vector<std::string> g_failures;  // repeated just before the closing line

static void report(bool ok, const std::string& line) {
    printf("%s %s\n", ok ? "  ok  " : "  FAIL", line.c_str());
    fflush(stdout);
    if (ok) g_passed++;
    else {
        g_failed++;
        g_failures.push_back(line);
    }
}

static std::string vformat(const char* fmt, va_list ap) {
    char buf[1024];
    vsnprintf(buf, sizeof(buf), fmt, ap);
    return buf;
}
static std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static std::string format(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string s = vformat(fmt, ap);
    va_end(ap);
    return s;
}

// a check whose outcome is yes or no; the message says what was observed
static void check(bool ok, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(bool ok, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string line = vformat(fmt, ap);
    va_end(ap);
    report(ok, line);
}

// the predicate of every bounded check: value <= bound, false when either is NaN
static bool within(double value, double bound) { return value <= bound; }

// the worse of two errors, for worst-of loops (std::max(w, NaN) is w; here a NaN sticks)
static double worse(double w, double e) {
    if (w != w) return w;
    return e > w || e != e ? e : w;
}

// a measured value against its bound: passes when value <= bound (a NaN fails); the line ends with
// ": value 3.1e-06 (bound 1e-05)"
static void check_le(double value, double bound, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static void check_le(double value, double bound, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string line = vformat(fmt, ap);
    va_end(ap);
    char tail[96];
    snprintf(tail, sizeof(tail), ": value %.3g (bound %.3g)", value, bound);
    report(within(value, bound), line + tail);
}

// ||a - b|| / ||b||, the norm-wise relative error (NaN if either holds a NaN)
static double rel_err(const float* a, const float* b, long n) {
    double num = 0, den = 0;
    for (long i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    if (num != num || den != den) return NAN;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

// The run's scratch folder, /tmp/tp_test_PID_XXXXXX, made on first use and removed when the process that
// made it exits, whether the tests passed or failed. TP_KEEP_TEST_DIRS=1 keeps it for debugging. A run
// that cannot clean up (fatal()'s _Exit, a crash, kill -9) leaves its folder, and the next run removes it:
// the folders of this user's processes that are gone, untouched for 2 minutes, are swept before a new one.
static std::string g_tmpdir;
static pid_t g_tmpdir_owner = 0;
static bool keep_test_dirs() {
    const char* keep = getenv("TP_KEEP_TEST_DIRS");
    return keep && *keep && strcmp(keep, "0") != 0;
}
static void tmpdir_remove() {
    if (g_tmpdir.empty() || getpid() != g_tmpdir_owner) return;  // a forked child leaves its parent's folder be
    if (keep_test_dirs()) {
        fprintf(stderr, "(test files kept in %s)\n", g_tmpdir.c_str());
        return;
    }
    std::string cmd = "rm -rf '" + g_tmpdir + "'";
    if (system(cmd.c_str()) != 0) fprintf(stderr, "(could not remove %s)\n", g_tmpdir.c_str());
    g_tmpdir.clear();
}
static void tmpdir_sweep() {
    glob_t g;
    if (keep_test_dirs() || glob("/tmp/tp_test_*_*", GLOB_ONLYDIR, nullptr, &g) != 0) return;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        int pid = 0;
        struct stat st;
        if (sscanf(g.gl_pathv[i], "/tmp/tp_test_%d_", &pid) == 1 && pid > 0 && kill(pid, 0) != 0 && errno == ESRCH &&
            stat(g.gl_pathv[i], &st) == 0 && st.st_uid == getuid() && time(nullptr) - st.st_mtime > 120) {
            std::string cmd = std::string("rm -rf '") + g.gl_pathv[i] + "'";
            if (system(cmd.c_str()) != 0) fprintf(stderr, "(could not remove %s)\n", g.gl_pathv[i]);
        }
    }
    globfree(&g);
}
static std::string tmpdir() {
    if (g_tmpdir.empty()) {
        tmpdir_sweep();
        char t[64];
        snprintf(t, sizeof(t), "/tmp/tp_test_%d_XXXXXX", (int)getpid());
        if (!mkdtemp(t)) { perror("mkdtemp"); exit(1); }
        g_tmpdir = t;
        g_tmpdir_owner = getpid();
        atexit(tmpdir_remove);
    }
    return g_tmpdir;
}

static void write_tokens(const std::string& path, const std::vector<int>& toks, int magic = 20240520, int version = 1, long claim = -1) {
    FILE* f = fopen(path.c_str(), "wb");
    int h[256] = {0};
    h[0] = magic; h[1] = version; h[2] = (int)(claim >= 0 ? claim : (long)toks.size());
    fwrite(h, sizeof(int), 256, f);
    std::vector<uint16_t> u(toks.begin(), toks.end());
    fwrite(u.data(), 2, u.size(), f);
    fclose(f);
}

// ----------------------------------------------------------------------------
// running P ranks in this process

struct RankOut {
    std::vector<float> grads0;  // local gradients after the first backward
    std::vector<float> params;  // local parameters after the last update
};

struct TpResult {
    std::vector<float> losses;      // per step, from rank 0
    std::vector<float> grads_full;  // gathered gradients of step 0
    std::vector<float> params_full; // gathered parameters after the last step
    // a bf16 run's last forward: the bf16 weights it computed from (widened, gathered), the masters they were
    // rounded from (gathered) and AdamW's step count then
    std::vector<float> wbf_last, masters_last;
    int t_last = 0;
    uint32_t bf16_seed = 0;  // the run's seed of the stochastic rounding
    std::vector<RankOut> ranks;
    double values_per_step;         // floats all-reduced per training step (rank 0)
    double moved[COMM_KINDS];       // the same by kind of collective
    size_t packed_bytes = 0;        // on a GPU: rank 0's scratch of bf16-packed matmul operands (pack_operands_bf16)
};

// trains `steps` AdamW steps at TP=P from full initial parameters; batch k is tokens [k*B*T, k*B*T + B*T]
// where run_tp runs its ranks: the CPU, or CUDA (GPU 0 for all ranks through the shared-memory backend,
// or one GPU per rank through NCCL when g_ngpu >= P), with TF32 matmuls or strict fp32
static int g_device = DEV_CPU, g_ngpu = 0;
static const char* g_argv0 = "./test_tp";  // this binary, for the tests that run it as a child
static bool g_tf32 = true;
static bool g_overlap = true;  // gpt.cu's backward overlap (GPT::overlap)

// One thread per rank r = 0..P-1 of a new group of P, each running body(group, r), then the group is
// gone: the scaffold of every in-process run of several ranks. nccl: the group has NCCL communicators,
// rank r on GPU r.
static void on_ranks(int P, bool nccl, const std::function<void(CommGroup*, int)>& body) {
    CommGroup* group = new CommGroup();
    comm_group_init(group, P, 60);
    if (nccl) {
        std::vector<int> gpus(P);
        for (int r = 0; r < P; r++) gpus[r] = r;
        comm_nccl_init_all(group, gpus.data());
    }
    std::vector<std::thread> th;
    for (int r = 0; r < P; r++) th.emplace_back(body, group, r);
    for (auto& t : th) t.join();
    delete group;
}

// (sp: --sp 1, recompute: -r, fused: --attention fused, else matmul, bf16: --dtype bf16 with seed bf16_seed)
static void run_tp(const GPTConfig* cfg, const std::vector<float>& init, int P, int steps, const std::vector<int>& data,
                   int B, int T, float lr, float clip, TpResult* out, bool sp = false, int recompute = 0, bool fused = true,
                   bool bf16 = false, uint32_t bf16_seed = 1234) {
    bool nccl = g_device == DEV_CUDA && P > 1 && g_ngpu >= P;
    long nfull = gpt_num_params(cfg);
    out->grads_full.assign(nfull, 0.0f);
    out->params_full.assign(nfull, 0.0f);
    out->wbf_last.assign(bf16 ? nfull : 0, 0.0f);
    out->masters_last.assign(bf16 ? nfull : 0, 0.0f);
    out->bf16_seed = bf16_seed;
    out->ranks.assign(P, RankOut());
    out->losses.clear();
    on_ranks(P, nccl, [&](CommGroup* group, int r) {
        Rank rk;
        rank_init(&rk, group, r, g_device, nccl ? r : 0, 1);
        if (g_device == DEV_CUDA) cuda_set_tf32(&rk.cuda, g_tf32);
        GPT m;
        gpt_build(&m, &rk, cfg, init.data(), 0);
        m.sp = sp;
        m.recompute = recompute;
        m.fused = fused;
        m.overlap = g_overlap;
        gpt_set_dtype(&m, &rk, bf16, bf16_seed);
        auto local = [&](const float* p) {
            std::vector<float> h(m.nparams);
            dev_download(&rk, h.data(), p, m.nparams * sizeof(float));
            return h;
        };
        for (int s = 0; s < steps; s++) {
            const int* x = data.data() + (long)s * B * T;
            double moved0[COMM_KINDS];
            for (int k = 0; k < COMM_KINDS; k++) moved0[k] = rk.tp.moved[k];
            gpt_forward(&m, &rk, x, x + 1, B, T, true);
            if (bf16 && s == steps - 1) {
                float* d = dev_alloc(&rk, m.nparams);
                OP(&rk, bf16_widen, d, m.wbf_mem, m.nparams);
                if (r == 0) out->t_last = m.t;
                gpt_gather(&m, &rk, d, out->wbf_last.data());
                gpt_gather(&m, &rk, m.params_mem, out->masters_last.data());
                dev_free(&rk, d);
            }
            gpt_zero_grad(&m, &rk);
            gpt_backward(&m, &rk);
            AdamW opt = {lr, 0.9f, 0.95f, 1e-8f, 0.1f, clip};
            gpt_update(&m, &rk, &rk.tp, &opt);
            if (s == 0) {  // the step's gradients: complete after the update's reductions (SP's), which leave them be
                float* g = gpt_grads_fp32(&m, &rk);  // (a bf16 run's widened)
                out->ranks[r].grads0 = local(g);
                gpt_gather(&m, &rk, g, out->grads_full.data());
                dev_free(&rk, g);
            }
            if (s == 0 && r == 0) {
                out->values_per_step = 0;
                for (int k = 0; k < COMM_KINDS; k++) {
                    out->moved[k] = rk.tp.moved[k] - moved0[k];
                    out->values_per_step += out->moved[k];
                }
            }
            float loss = gpt_read_loss(&m, &rk);
            if (r == 0) out->losses.push_back(loss);
        }
        out->ranks[r].params = local(m.params_mem);
        gpt_gather(&m, &rk, m.params_mem, out->params_full.data());
        if (r == 0 && rk.device == DEV_CUDA) out->packed_bytes = rk.cuda.packed_bytes;
        gpt_free(&m, &rk);
        rank_free(&rk);
    });
}

// the worst of err(i, off, n) over the 16 tensors of the full model (tensor i at offset off, n floats) and
// its name; a NaN is the worst
static double worst_tensor(const GPTConfig* cfg, const std::function<double(int, long, long)>& err, const char** name) {
    ShardPlan s;
    shard_plan_init(&s, cfg, 1, 0);
    double worst = 0;
    long off = 0;
    *name = "";
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        long n = shard_full_size(&s.t[i]);
        double e = err(i, off, n);
        if (e > worst || e != e) { worst = worse(worst, e); *name = s.t[i].name; }
        off += n;
    }
    return worst;
}

// per tensor of the full model: the worst relative error of a against b (gathered gradients or weights)
static double worst_tensor_err(const GPTConfig* cfg, const std::vector<float>& a, const std::vector<float>& b, const char** name) {
    return worst_tensor(cfg, [&](int, long off, long n) { return rel_err(a.data() + off, b.data() + off, n); }, name);
}

// the replicated tensors (layernorms, wpe, row-parallel biases) whose step-0 gradients (*grads) and final
// weights (*weights) differ in bits between rank 0 and another rank of a run at P
static void replicated_mismatch(const GPTConfig* cfg, int P, const TpResult& res, long* grads, long* weights) {
    ShardPlan s;
    shard_plan_init(&s, cfg, P, 0);
    *grads = *weights = 0;
    for (int r = 1; r < P; r++) {
        long loff = 0;
        for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
            long n = shard_local_size(&s.t[i]);
            if (s.t[i].split == SPLIT_NONE) {
                *grads += memcmp(res.ranks[r].grads0.data() + loff, res.ranks[0].grads0.data() + loff, n * 4) != 0;
                *weights += memcmp(res.ranks[r].params.data() + loff, res.ranks[0].params.data() + loff, n * 4) != 0;
            }
            loff += n;
        }
    }
}

static GPTConfig make_config(int L, int NH, int C, int V, int maxT) {
    GPTConfig c;
    c.L = L; c.NH = NH; c.C = C; c.V = V; c.Vp = round_up(V, 128); c.maxT = maxT;
    return c;
}

// the full initial weights of a config, as every run starts from them
static std::vector<float> init_weights(const GPTConfig* cfg, uint64_t seed) {
    std::vector<float> w(gpt_num_params(cfg));
    gpt_init_full(cfg, seed, w.data());
    return w;
}

static std::vector<int> random_tokens(long n, int V, uint64_t seed) {
    Rng r = {seed};
    std::vector<int> t(n);
    for (auto& x : t) x = (int)(rng_u64(&r) % V);
    return t;
}

// v rounded to nearest into bf16 storage, and bf16 storage widened back (the bf16 ops' tests)
static std::vector<bf16> bf16_vector_of(const std::vector<float>& v) {
    std::vector<bf16> h(v.size());
    for (size_t i = 0; i < v.size(); i++) h[i] = bf16_round(v[i]);
    return h;
}
static std::vector<float> fp32_vector_of(const std::vector<bf16>& h) {
    std::vector<float> v(h.size());
    for (size_t i = 0; i < h.size(); i++) v[i] = bf16_to_float(h[i]);
    return v;
}

// ----------------------------------------------------------------------------
// collectives

static void test_collectives() {
    printf("collectives: all-reduce sum/max, reduce-scatter, all-gather against serial loops\n");
    long sizes[] = {1, 7, 1001, 1 << 18};
    for (int P = 1; P <= 8; P++) {
        for (long n : sizes) {
            CommGroup* g = new CommGroup();
            comm_group_init(g, P, 30);
            std::vector<std::vector<float>> in(P), sum(P), mx(P), gat(P), rsin(P), rs(P), rsinplace(P);
            for (int r = 0; r < P; r++) {
                Rng rng = {(uint64_t)(r * 1000 + n)};
                in[r].resize(n);
                for (auto& x : in[r]) x = (float)rng_normal(&rng);
                sum[r] = in[r]; mx[r] = in[r];
                gat[r].assign(n * P, 0.0f);
                rsin[r].resize(n * P);  // reduce-scatter: P*n in, the rank's n out (and again in place)
                for (auto& x : rsin[r]) x = (float)rng_normal(&rng);
                rs[r].assign(n, 0.0f);
                rsinplace[r] = rsin[r];
            }
            std::vector<std::thread> th;
            for (int r = 0; r < P; r++)
                th.emplace_back([&, r]() {
                    Comm c;
                    comm_init(&c, g, r);
                    comm_allreduce(&c, sum[r].data(), n, COMM_SUM, "test", -1);
                    comm_allreduce(&c, mx[r].data(), n, COMM_MAX, "test", -1);
                    comm_allgather(&c, gat[r].data(), in[r].data(), n, "test", -1);
                    comm_reducescatter(&c, rs[r].data(), rsin[r].data(), n, "test", -1);
                    comm_reducescatter(&c, rsinplace[r].data() + r * n, rsinplace[r].data(), n, "test", -1);
                });
            for (auto& t : th) t.join();
            long bad = 0;
            for (long i = 0; i < n; i++) {
                float s = in[0][i], m = in[0][i];
                for (int r = 1; r < P; r++) { s += in[r][i]; m = std::max(m, in[r][i]); }
                for (int r = 0; r < P; r++) {
                    bad += sum[r][i] != s;  // bit-exact: rank-order sum
                    bad += mx[r][i] != m;
                    for (int q = 0; q < P; q++) bad += gat[r][q * n + i] != in[q][i];
                    float rsum = rsin[0][r * n + i];  // slice r of the rank-order sum
                    for (int q = 1; q < P; q++) rsum += rsin[q][r * n + i];
                    bad += rs[r][i] != rsum;
                    bad += rsinplace[r][r * n + i] != rsum;
                }
            }
            if (n == 1 || n == (1 << 18) || P == 8 || P == 3)
                check_le(bad, 0, "P=%d n=%ld: elements differing from the serial loops (all four collectives, bit-exact)", P, n);
            else if (bad) check_le(bad, 0, "P=%d n=%ld: elements differing", P, n);
            delete g;
        }
    }
}

// ----------------------------------------------------------------------------
// TP equivalence

// TP=P (with sp: and sequence parallelism) against TP=1 from the same weights and data
static void test_tp_equivalence(const GPTConfig* cfg, const std::vector<int>& Ps, bool sp = false, int B = 2, int T = 16) {
    int steps = 10;
    printf("%s equivalence: L%d NH%d C%d V%d (Vp %d), B%d T%d, %d AdamW steps (lr 1e-3, wd 0.1, clip 1)\n", sp ? "SP" : "TP",
           cfg->L, cfg->NH, cfg->C, cfg->V, cfg->Vp, B, T, steps);
    std::vector<float> init = init_weights(cfg, 7);
    std::vector<int> data = random_tokens((long)steps * B * T + 1, cfg->V, 99);
    TpResult ref;
    run_tp(cfg, init, 1, steps, data, B, T, 1e-3f, 1.0f, &ref);
    for (int P : Ps) {
        TpResult res;
        run_tp(cfg, init, P, steps, data, B, T, 1e-3f, 1.0f, &res, sp);
        double l0 = fabs(res.losses[0] - ref.losses[0]) / fabs(ref.losses[0]);
        check_le(l0, 1e-6, "P=%d step-0 loss %.7f vs %.7f: rel err", P, res.losses[0], ref.losses[0]);
        // every gathered gradient tensor
        const char* worst_name;
        double worst = worst_tensor_err(cfg, res.grads_full, ref.grads_full, &worst_name);
        check_le(worst, 1e-5, "P=%d gathered gradients: worst tensor %s, rel err", P, worst_name);
        double lw = 0;
        for (int k = 0; k < steps; k++) lw = worse(lw, (double)fabs(res.losses[k] - ref.losses[k]) / fabs(ref.losses[k]));
        check_le(lw, 1e-5, "P=%d losses over %d steps: worst rel err", P, steps);
        double pw = rel_err(res.params_full.data(), ref.params_full.data(), (long)ref.params_full.size());
        check_le(pw, 1e-5, "P=%d weights after %d steps: rel err", P, steps);
        // replicated tensors: bit-identical gradients and weights on every rank
        long mism_g, mism_p;
        replicated_mismatch(cfg, P, res, &mism_g, &mism_p);
        check_le(mism_g + mism_p, 0, "P=%d replicated tensors (layernorms, wpe, row-parallel biases) differing across ranks (%ld grads, %ld weights)",
                 P, mism_g, mism_p);
        // communication: the analytic count, by kind (gpt.cu's step_comm_floats)
        if (!sp) {
            double expect = (4.0 * cfg->L + 2) * B * T * cfg->C + 3.0 * B * T + 1;
            check_le(fabs(res.values_per_step - expect), 0, "P=%d floats all-reduced per step %.0f vs (4L+2)BTC + 3BT + 1 = %.0f: difference", P,
                     res.values_per_step, expect);
        } else {
            double f[COMM_KINDS], worst = 0;
            step_comm_floats(cfg, B, T, true, 1, false, f);
            for (int k = 0; k < COMM_KINDS; k++) worst = worse(worst, fabs(res.moved[k] - f[k]));
            check_le(worst, 0, "P=%d floats per step: reduce-scatter %.0f, all-gather %.0f, all-reduce %.0f vs (4L+2)BTC, (6L+2)BTC, "
                     "3BT + 1 + TC + 4LC + 2C: largest difference", P, res.moved[KIND_REDUCESCATTER], res.moved[KIND_ALLGATHER],
                     res.moved[KIND_ALLREDUCE]);
        }
    }
}

// ----------------------------------------------------------------------------
// recomputation: -r 1, 2, 3 change what is kept, never a bit of the result

static void test_recompute() {
    printf("recomputation: -r 1, 2 (fused attention) and 1, 2, 3 (matmul) bit-identical to -r 0, with and without --sp 1, fp32 and "
           "bf16 (5 AdamW steps)\n");
    GPTConfig cfg = make_config(2, 4, 32, 200, 32);
    int B = 2, T = 24, steps = 5;
    std::vector<float> init = init_weights(&cfg, 13);
    std::vector<int> data = random_tokens((long)steps * B * T + 1, cfg.V, 14);
    struct { int P; bool sp; } cases[] = {{1, false}, {2, false}, {2, true}, {4, true}};
    // bf16: -r 0 writes the layernorms' and the GELU's outputs straight into their bf16 copies, -r 1 and 2
    // recompute them in fp32 words and round them: the same values either way
    for (auto& k : cases)
      for (bool fused : {true, false})
      for (bool bf16 : {false, true}) {
        TpResult ref;
        run_tp(&cfg, init, k.P, steps, data, B, T, 1e-3f, 1.0f, &ref, k.sp, 0, fused, bf16);
        for (int r = 1; r <= (fused ? 2 : 3); r++) {  // -r 3 recomputes what only matmul attention keeps
            TpResult res;
            run_tp(&cfg, init, k.P, steps, data, B, T, 1e-3f, 1.0f, &res, k.sp, r, fused, bf16);
            long d = 0;
            for (int i = 0; i < steps; i++) d += memcmp(&res.losses[i], &ref.losses[i], sizeof(float)) != 0;
            for (size_t i = 0; i < ref.params_full.size(); i++) d += memcmp(&res.params_full[i], &ref.params_full[i], 4) != 0;
            for (size_t i = 0; i < ref.grads_full.size(); i++) d += memcmp(&res.grads_full[i], &ref.grads_full[i], 4) != 0;
            check_le(d, 0, "P=%d%s --attention %s%s -r %d against -r 0: losses, step-0 gradients and final weights differing (bit for bit)",
                     k.P, k.sp ? " --sp 1" : "", fused ? "fused" : "matmul", bf16 ? " bf16" : "", r);
        }
    }
}

// The activation memory: what acts_layout allocates against the closed-form formula the memory table
// prints, for every combination of P, --sp, -r and --attention on three shapes.
static void test_acts_table() {
    printf("activation memory: acts_layout against the closed-form formula\n");
    long worst = 0, cases = 0;
    for (int shape = 0; shape < 3; shape++) {  // (the third: an odd C, whose SP gathers move fp32 words)
        GPTConfig c = shape == 0 ? make_config(3, 4, 32, 200, 64) : shape == 1 ? make_config(2, 12, 96, 300, 64)
                                                                              : make_config(2, 3, 75, 200, 64);
        int B = shape == 1 ? 2 : 3, T = shape == 1 ? 36 : 16;
        for (int P : {1, 2, 3, 4, 6})
            for (int sp = 0; sp < 2; sp++)
                for (int r = 0; r <= 3; r++)
                  for (int fused = 0; fused < 2; fused++)
                  for (int bf16 = 0; bf16 < 2; bf16++) {
                    if (!tp_valid(&c, P) || (fused && r >= 3)) continue;
                    ShardPlan s;
                    shard_plan_init(&s, &c, P, 0);
                    bool split = sp_splits(sp, P, B, T);
                    long L = c.L, C = c.C, NH = c.NH, BT = (long)B * T, N = split ? BT / P : BT, HT = BT * C / P;
                    long att = B * (NH / P) * (long)T * T, rows = B * (NH / P) * (long)T;
                    // per layer: token-wise N*(aC + 4), head-wise B*T*bC/P, attention B*NH*T*T/P with matmul or
                    // the log-sum-exps B*NH*T/P with fused (as printed)
                    long per_layer = N * ((r >= 2 ? 2 : 4) * C + 4) + (r >= 1 ? 8 : 12) * HT + (fused ? rows : r >= 3 ? 0 : att);
                    // bf16: the residual stream (encoded, residual2, residual3), ln1, ln2 (unless -r 2), atty, fch,
                    // fch_gelu (unless -r 1) and fused attention's qkv kept in bf16, each
                    // layer's in whole 16-byte units, and one fp32 copy of each that the layers share, except
                    // the GELU's output (written as bf16 alone), fch (fc's sums go to dfch) without -r 1, and
                    // the layernorms' without SP or where SP's gathers move bf16 (written as bf16 alone, gathered
                    // as it is); SP's bf16 gather buffer; the logits
                    auto half = [](long n) { return (n + 7) / 8 * 4; };
                    long shared = 0;
                    if (bf16) {
                        long HTl = BT * (C / P);
                        per_layer += 2 * (half(N * C) - N * C), shared += half(N * C) - N * C;  // the stream
                        if (r < 2) per_layer += 2 * (half(N * C) - N * C), shared += split && C % 2 ? 2 * N * C : 0;
                        per_layer += half(HTl) - HTl, shared += HTl;
                        per_layer += half(4 * HTl) - 4 * HTl, shared += r < 1 ? 0 : 4 * HTl;
                        if (r < 1) per_layer += half(4 * HTl) - 4 * HTl;
                        if (fused) per_layer += half(3 * HTl) - 3 * HTl;  // q, k, v in bf16 alone (qkv_kept)
                        if (split && C % 2 == 0) shared += (BT * C + 1) / 2;
                        shared += half(BT * (c.Vp / P)) - BT * (c.Vp / P);  // the logits in bf16 storage
                    }
                    // outside the layers: encoded, lnf (every token) and its statistics, logits, the loss's
                    // 4 floats per token, partial, gathered (SP), dres, dln, datty, dqkv, dfch, and one copy
                    // of what -r recomputes; fused attention's D (B*NH*T/P)
                    long outside = N * C + BT * C + 2 * N + BT * (c.Vp / P) + 4 * BT + BT * C + (split ? BT * C : 0) + N * C +
                                   BT * C + HT + 3 * HT + 4 * HT + (r >= 1 ? 4 * HT : 0) + (r >= 2 ? 2 * N * C : 0) +
                                   (!fused && r >= 3 ? att : 0) + (fused ? rows : 0) + shared;
                    long table = acts_floats(&c, &s, B, T, split, r, fused != 0, bf16 != 0);
                    long table_layer = acts_floats_per_layer(&c, &s, B, T, split, r, fused != 0, bf16 != 0);
                    worst = std::max(worst, std::max(labs(table - (L * per_layer + outside)), labs(table_layer - per_layer)));
                    cases++;
                }
    }
    check_le(worst, 0, "%ld configurations: floats allocated (and per layer) against the formula, largest difference", cases);
    // and a model really allocates what the table says (the memory table's printed number), with either attention
    for (bool fused : {true, false}) {
    GPTConfig cfg = make_config(2, 4, 32, 200, 32);
    long want = 0, got = 0;
    CommGroup* g = new CommGroup();
    comm_group_init(g, 2, 30);
    std::vector<float> init = init_weights(&cfg, 1);
    std::vector<int> tok = random_tokens(2 * 24 + 1, cfg.V, 2);
    std::vector<std::thread> th;
    for (int r = 0; r < 2; r++)
        th.emplace_back([&, r]() {
            Rank rk;
            rank_init(&rk, g, r, DEV_CPU, 0, 1);
            GPT m;
            gpt_build(&m, &rk, &cfg, init.data(), 0);
            m.sp = true;
            m.recompute = 2;
            m.fused = fused;
            gpt_forward(&m, &rk, tok.data(), tok.data() + 1, 2, 24, true);
            if (r == 0) {
                for (int i = 0; i < NUM_ACTS; i++) got += m.layout.size[i] * act_copies(&m.layout, i, cfg.L);
                want = acts_floats(&m.cfg, &m.plan, 2, 24, true, 2, fused, false);
            }
            gpt_free(&m, &rk);
        });
    for (auto& t : th) t.join();
    delete g;
    check_le(labs(got - want), 0, "a P=2 --sp 1 -r 2 --attention %s model allocates %ld activation floats, the table %ld: difference",
             fused ? "fused" : "matmul", got, want);
    }
}

// ----------------------------------------------------------------------------
// an independent reference: GPT-2's forward in double precision, written as plainly as possible

static double reference_loss(const GPTConfig* c, const float* full, const int* tok, const int* tgt, int B, int T) {
    int C = c->C, L = c->L, NH = c->NH, hs = C / NH, V = c->V, Vp = c->Vp;
    const float* wte = full;
    const float* wpe = wte + (long)Vp * C;
    const float* ln1w = wpe + (long)c->maxT * C;
    const float* ln1b = ln1w + L * C;
    const float* qkvw = ln1b + L * C;
    const float* qkvb = qkvw + (long)L * 3 * C * C;
    const float* apw = qkvb + L * 3 * C;
    const float* apb = apw + (long)L * C * C;
    const float* ln2w = apb + L * C;
    const float* ln2b = ln2w + L * C;
    const float* fcw = ln2b + L * C;
    const float* fcb = fcw + (long)L * 4 * C * C;
    const float* fpw = fcb + L * 4 * C;
    const float* fpb = fpw + (long)L * C * 4 * C;
    const float* lnfw = fpb + L * C;
    const float* lnfb = lnfw + C;
    auto ln = [&](const std::vector<double>& x, const float* w, const float* b) {
        std::vector<double> y(C);
        double m = 0, v = 0;
        for (int i = 0; i < C; i++) m += x[i];
        m /= C;
        for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
        v /= C;
        for (int i = 0; i < C; i++) y[i] = (x[i] - m) / sqrt(v + 1e-5) * w[i] + b[i];
        return y;
    };
    double total = 0;
    for (int b = 0; b < B; b++) {
        std::vector<std::vector<double>> x(T, std::vector<double>(C));
        for (int t = 0; t < T; t++)
            for (int i = 0; i < C; i++) x[t][i] = (double)wte[(long)tok[b * T + t] * C + i] + wpe[(long)t * C + i];
        for (int l = 0; l < L; l++) {
            std::vector<std::vector<double>> q(T, std::vector<double>(3 * C));
            for (int t = 0; t < T; t++) {
                std::vector<double> h = ln(x[t], ln1w + l * C, ln1b + l * C);
                for (int o = 0; o < 3 * C; o++) {
                    double s = qkvb[l * 3 * C + o];
                    for (int i = 0; i < C; i++) s += h[i] * qkvw[((long)l * 3 * C + o) * C + i];
                    q[t][o] = s;
                }
            }
            for (int t = 0; t < T; t++) {
                std::vector<double> y(C, 0.0);
                for (int hh = 0; hh < NH; hh++) {
                    std::vector<double> sc(t + 1);
                    double mx = -1e300, z = 0;
                    for (int u = 0; u <= t; u++) {
                        double d = 0;
                        for (int i = 0; i < hs; i++) d += q[t][hh * hs + i] * q[u][C + hh * hs + i];
                        sc[u] = d / sqrt((double)hs);
                        mx = std::max(mx, sc[u]);
                    }
                    for (int u = 0; u <= t; u++) { sc[u] = exp(sc[u] - mx); z += sc[u]; }
                    for (int u = 0; u <= t; u++)
                        for (int i = 0; i < hs; i++) y[hh * hs + i] += sc[u] / z * q[u][2 * C + hh * hs + i];
                }
                for (int o = 0; o < C; o++) {
                    double s = apb[l * C + o];
                    for (int i = 0; i < C; i++) s += y[i] * apw[((long)l * C + o) * C + i];
                    x[t][o] += s;
                }
            }
            for (int t = 0; t < T; t++) {
                std::vector<double> h = ln(x[t], ln2w + l * C, ln2b + l * C), g(4 * C);
                for (int o = 0; o < 4 * C; o++) {
                    double s = fcb[l * 4 * C + o];
                    for (int i = 0; i < C; i++) s += h[i] * fcw[((long)l * 4 * C + o) * C + i];
                    g[o] = 0.5 * s * (1.0 + tanh(sqrt(2.0 / M_PI) * (s + 0.044715 * s * s * s)));
                }
                for (int o = 0; o < C; o++) {
                    double s = fpb[l * C + o];
                    for (int i = 0; i < 4 * C; i++) s += g[i] * fpw[((long)l * C + o) * 4 * C + i];
                    x[t][o] += s;
                }
            }
        }
        for (int t = 0; t < T; t++) {
            std::vector<double> h = ln(x[t], lnfw, lnfb), lg(V);
            double mx = -1e300, z = 0;
            for (int v = 0; v < V; v++) {
                double s = 0;
                for (int i = 0; i < C; i++) s += h[i] * wte[(long)v * C + i];
                lg[v] = s;
                mx = std::max(mx, s);
            }
            for (int v = 0; v < V; v++) z += exp(lg[v] - mx);
            total += log(z) - (lg[tgt[b * T + t]] - mx);
        }
    }
    return total / (B * T);
}

static void test_reference_forward() {
    printf("forward against an independent double-precision GPT-2\n");
    GPTConfig cfg = make_config(2, 4, 32, 200, 16);
    int B = 2, T = 12;
    std::vector<float> init = init_weights(&cfg, 11);
    for (long i = 0; i < (long)init.size(); i++) init[i] *= 5.0f;  // larger weights: a non-trivial forward
    std::vector<int> tok = random_tokens(B * T + 1, cfg.V, 5);
    double ref = reference_loss(&cfg, init.data(), tok.data(), tok.data() + 1, B, T);
    for (int P : {1, 2, 4}) {
        TpResult res;
        run_tp(&cfg, init, P, 1, tok, B, T, 0.0f, 0.0f, &res);
        double e = fabs(res.losses[0] - ref) / ref;
        check_le(e, 1e-5, "P=%d loss %.7f vs reference %.7f: rel err", P, res.losses[0], ref);
    }
}

// gpt_init_full against GPT-2's initialization (llm.c's): per tensor, the matrices and wpe N(0, 0.02), the
// two projections into the residual stream (attprojw, fcprojw) N(0, 0.02/sqrt(2L)), layernorm weights 1,
// biases 0, wte's padded rows 0. A tensor's sample std within 5 standard errors of its sigma (the std of a
// sample std of n normals is sigma / sqrt(2n)), its mean within 5 of 0.
static void test_reference_init() {
    printf("the initialization against GPT-2's, tensor by tensor\n");
    GPTConfig cfg = make_config(3, 4, 64, 300, 32);
    std::vector<float> w = init_weights(&cfg, 5);
    ShardPlan s;
    shard_plan_init(&s, &cfg, 1, 0);
    long off = 0, wrong_const = 0;
    double worst = 0;
    const char* worst_name = "";
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        const TensorShard* t = &s.t[i];
        long n = shard_full_size(t);
        std::string name = t->name;
        bool normal = t->cols > 1 || name == "wpe";
        if (normal) {
            double sigma = name == "attprojw" || name == "fcprojw" ? 0.02 / sqrt(2.0 * cfg.L) : 0.02;
            long m = name == "wte" ? (long)cfg.V * cfg.C : n;  // (the padded rows below)
            double sum = 0, sq = 0;
            for (long j = 0; j < m; j++) sum += w[off + j], sq += (double)w[off + j] * w[off + j];
            double mean = sum / m, sd = sqrt(sq / m - mean * mean);
            double z = std::max(fabs(sd - sigma) / (sigma / sqrt(2.0 * m)), fabs(mean) / (sigma / sqrt((double)m)));
            if (z > worst || z != z) { worst = worse(worst, z); worst_name = t->name; }
            for (long j = m; j < n; j++) wrong_const += w[off + j] != 0.0f;
        } else {
            float want = name == "ln1w" || name == "ln2w" || name == "lnfw" ? 1.0f : 0.0f;
            for (long j = 0; j < n; j++) wrong_const += w[off + j] != want;
        }
        off += n;
    }
    check_le(worst, 5.0, "each matrix's sample std against 0.02 (0.02/sqrt(2L) for attprojw and fcprojw) and mean against 0, "
             "in standard errors: worst %s", worst_name);
    check(wrong_const == 0, "layernorm weights 1, biases and wte's padded rows 0: %ld values otherwise", wrong_const);
    // the dN descriptors: GPT-2 124M, medium, large and xl (layers, channels, heads as published), d12's
    // parameter count as llm.c prints it (vocab 50257 padded to 50304, 1024 positions), dN below 12 N layers
    // of 64 channels a head
    struct { const char* d; int L, C, NH; long params; } sizes[] = {
        {"d12", 12, 768, 12, 124475904}, {"d24", 24, 1024, 16, 0}, {"d36", 36, 1280, 20, 0}, {"d48", 48, 1600, 25, 0}, {"d3", 3, 192, 3, 0}};
    int wrong = 0;
    std::string first;
    for (auto& z : sizes) {
        GPTConfig c = {};
        bool ok = gpt_descriptor(z.d, &c, 50257, 1024) && c.L == z.L && c.C == z.C && c.NH == z.NH && c.Vp == 50304 &&
                  (z.params == 0 || gpt_num_params(&c) == z.params);
        if (!ok && !wrong++) first = format("%s: L%d C%d H%d, %ld parameters", z.d, c.L, c.C, c.NH, gpt_num_params(&c));
    }
    check(wrong == 0, "d12, d24, d36, d48 are GPT-2 124M, medium, large, xl (d12: 124,475,904 parameters), d3 is L3C192H3: %d wrong%s%s",
          wrong, wrong ? "; first: " : "", first.c_str());
}

// Two AdamW steps of the whole model (gpt_update: the sharded update, the norm's sums over the ranks, the
// tensors' decay) at TP = 1, 2, 4 against llm.c's update worked out in double on the full tensors: decay
// on wte, wpe and the four matrices alone, bias-corrected moments, the global norm clipped. The gradients
// are set, not computed, so the update alone is tested. Adam's step does not change when a gradient is
// scaled, so only clipping that applies on one step and not the other shows in the weights: the first
// gradient's norm is 0.8 of the clip, the second's 2.5 times it, and half of each norm's square lies in the
// replicated tensors (counted once, not once per rank), so a norm wrong by 1.25x either way moves them.
static void test_reference_update() {
    printf("two AdamW steps of the model against llm.c's update in double, TP = 1, 2, 4\n");
    GPTConfig cfg = make_config(2, 4, 32, 100, 16);
    std::vector<float> init = init_weights(&cfg, 21);
    const long n = (long)init.size();
    const float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f, clip = 1.0f;
    ShardPlan whole;
    shard_plan_init(&whole, &cfg, 1, 0);
    std::vector<long> at(NUM_PARAM_TENSORS + 1, 0);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) at[i + 1] = at[i] + shard_full_size(&whole.t[i]);
    auto decays = [&](int i) {
        for (const char* d : {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"})
            if (strcmp(whole.t[i].name, d) == 0) return true;
        return false;
    };
    // gradients: normal, each element's scale 10^U(-2, 0) (so eps and the ratios of m to sqrt(v) vary), then
    // the replicated and the sharded parts each scaled to half the square of the wanted norm
    Rng rng = {77};
    std::vector<std::vector<float>> grads(2, std::vector<float>(n));
    for (int s = 0; s < 2; s++) {
        double want = s == 0 ? 0.8 * clip : 2.5 * clip, sq[2] = {0, 0};
        for (long k = 0; k < n; k++) grads[s][k] = (float)(rng_normal(&rng) * pow(10.0, -2.0 * rng_uniform(&rng)));
        for (int i = 0; i < NUM_PARAM_TENSORS; i++)
            for (long k = at[i]; k < at[i + 1]; k++) sq[whole.t[i].split == SPLIT_NONE] += (double)grads[s][k] * grads[s][k];
        for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
            float f = (float)sqrt(want * want / 2 / sq[whole.t[i].split == SPLIT_NONE]);
            for (long k = at[i]; k < at[i + 1]; k++) grads[s][k] *= f;
        }
    }
    // llm.c's update, in double
    std::vector<double> p(init.begin(), init.end()), mo(n, 0.0), ve(n, 0.0);
    for (int s = 0; s < 2; s++) {
        double sq = 0;
        for (long k = 0; k < n; k++) sq += (double)grads[s][k] * grads[s][k];
        double scale = sqrt(sq) > clip ? clip / sqrt(sq) : 1.0, bc1 = 1 - pow(beta1, s + 1), bc2 = 1 - pow(beta2, s + 1);
        for (int i = 0; i < NUM_PARAM_TENSORS; i++)
            for (long k = at[i]; k < at[i + 1]; k++) {
                double g = grads[s][k] * scale;
                mo[k] = beta1 * mo[k] + (1 - beta1) * g;
                ve[k] = beta2 * ve[k] + (1 - beta2) * g * g;
                p[k] -= lr * (mo[k] / bc1 / (sqrt(ve[k] / bc2) + eps) + (decays(i) ? wd : 0.0) * p[k]);
            }
    }
    std::vector<float> ref(p.begin(), p.end());
    for (int P : {1, 2, 4}) {
        std::vector<float> got(n, 0.0f);
        on_ranks(P, false, [&](CommGroup* group, int r) {
            Rank rk;
            rank_init(&rk, group, r, DEV_CPU, 0, 1);
            GPT m;
            gpt_build(&m, &rk, &cfg, init.data(), 0);
            AdamW opt = {lr, beta1, beta2, eps, wd, clip};
            for (int s = 0; s < 2; s++) {
                gpt_scatter(&m, &rk, grads[s].data(), m.grads_mem);  // this rank's shard of the full gradient
                gpt_update(&m, &rk, &rk.tp, &opt);
            }
            gpt_gather(&m, &rk, m.params_mem, got.data());
            gpt_free(&m, &rk);
            rank_free(&rk);
        });
        const char* name;
        double e = worst_tensor_err(&cfg, got, ref, &name);
        check_le(e, 2e-6, "P=%d weights after 2 steps against the double-precision update: worst tensor %s, rel err", P, name);
    }
}

// ----------------------------------------------------------------------------
// gradient check: backward against central finite differences

static void test_gradcheck() {
    printf("gradient check: backward vs central finite differences (tiny model)\n");
    GPTConfig cfg = make_config(1, 2, 16, 20, 8);
    int B = 2, T = 6;
    std::vector<float> init = init_weights(&cfg, 3);
    for (auto& x : init) x *= 4.0f;  // bigger weights, bigger gradients above float noise
    for (long i = 0; i < (long)(cfg.Vp - cfg.V) * cfg.C; i++) init[(long)cfg.V * cfg.C + i] = 0.0f;
    std::vector<int> tok = random_tokens(B * T + 1, cfg.V, 17);
    CommGroup* g = new CommGroup();
    comm_group_init(g, 1, 30);
    Rank rk;
    rank_init(&rk, g, 0, DEV_CPU, 0, 1);
    GPT m;
    gpt_build(&m, &rk, &cfg, init.data(), 0);
    gpt_forward(&m, &rk, tok.data(), tok.data() + 1, B, T, true);
    gpt_zero_grad(&m, &rk);
    gpt_backward(&m, &rk);
    std::vector<float> grad(m.grads_mem, m.grads_mem + m.nparams);
    auto loss_at = [&]() {
        gpt_forward(&m, &rk, tok.data(), tok.data() + 1, B, T, false);
        double s = 0;
        for (int i = 0; i < B * T; i++) s += m.acts.losses[i];
        return s / (B * T);
    };
    long off = 0;
    double worst = 0;
    for (int ti = 0; ti < NUM_PARAM_TENSORS; ti++) {
        long n = shard_local_size(&m.plan.t[ti]);
        // the 8 largest gradients of the tensor: finite differences resolve them well above float noise
        std::vector<long> idx(n);
        for (long i = 0; i < n; i++) idx[i] = i;
        std::partial_sort(idx.begin(), idx.begin() + std::min(8L, n), idx.end(),
                          [&](long a, long b) { return fabs(grad[off + a]) > fabs(grad[off + b]); });
        double num = 0, den = 0;
        for (long k = 0; k < std::min(8L, n); k++) {
            float* p = m.params_mem + off + idx[k];
            float keep = *p, h = 2e-3f;
            *p = keep + h;
            double lp = loss_at();
            *p = keep - h;
            double lm = loss_at();
            *p = keep;
            double fd = (lp - lm) / (2.0 * h);
            num += (fd - grad[off + idx[k]]) * (fd - grad[off + idx[k]]);
            den += (double)grad[off + idx[k]] * grad[off + idx[k]];
        }
        double e = den > 0 ? sqrt(num / den) : 0;
        worst = worse(worst, e);
        check_le(den > 0 ? e : INFINITY, 1e-2, "%-9s (|g| %.2e) rel err", m.plan.t[ti].name, sqrt(den));
        off += n;
    }
    gpt_free(&m, &rk);
    delete g;
}

// ----------------------------------------------------------------------------
// data loader

static void test_loader() {
    printf("data loader: sequential order, shard wrap-around, shuffled epochs\n");
    std::string d = tmpdir();
    int B = 2, T = 4, BT = B * T;
    // two shards with distinct tokens: shard 0 holds 0..40, shard 1 holds 1000..1032
    std::vector<int> s0(41), s1(33);
    for (int i = 0; i < 41; i++) s0[i] = i;
    for (int i = 0; i < 33; i++) s1[i] = 1000 + i;
    write_tokens(d + "/shard_000.bin", s0);
    write_tokens(d + "/shard_001.bin", s1);
    DataLoader dl;
    loader_init(&dl, "train", (d + "/shard_*.bin").c_str(), nullptr, B, T, 65536, false, 1, 0, 1);
    // shard 0: (41-1)/8 = 5 batches, shard 1: (33-1)/8 = 4 batches, then back to shard 0
    std::vector<int> firsts;
    bool shifted = true;
    for (int k = 0; k < 11; k++) {
        loader_next(&dl);
        firsts.push_back(dl.inputs[0]);
        for (int i = 0; i < BT; i++) shifted &= dl.targets[i] == dl.inputs[i] + 1;
    }
    std::vector<int> expect = {0, 8, 16, 24, 32, 1000, 1008, 1016, 1024, 0, 8};
    check(firsts == expect, "sequential: batch k starts at token k*B*T, shard 0 then shard 1, then wraps to shard 0");
    check(shifted, "targets are the inputs shifted by one (B*T+1 tokens read per batch)");
    loader_free(&dl);
    // a file of exactly 5*B*T tokens has 4 batches, not 5: the fifth would need a target past its end
    {
        std::vector<int> s40(40);
        for (int i = 0; i < 40; i++) s40[i] = 3000 + i;
        write_tokens(d + "/exact.bin", s40);
        loader_init(&dl, "train", (d + "/exact.bin").c_str(), nullptr, B, T, 65536, false, 1, 0, 1);
        long n = dl.nsamples;
        std::vector<int> got;
        for (int k = 0; k < 9 && n == 4; k++) {
            loader_next(&dl);
            got.push_back(dl.inputs[0] - 3000);
        }
        check(n == 4 && got == std::vector<int>({0, 8, 16, 24, 0, 8, 16, 24, 0}),
              "a file of exactly 5 x B*T tokens: %ld batches an epoch (4: each reads B*T+1), wrapping round after the fourth", n);
        loader_free(&dl);
    }
    // shuffled: an epoch visits every sample once, in an order that is not the sequential one
    loader_init(&dl, "train", (d + "/shard_000.bin").c_str(), nullptr, B, T, 65536, true, 1, 0, 1);
    std::vector<int> seen;
    for (int k = 0; k < 5; k++) { loader_next(&dl); seen.push_back(dl.inputs[0]); }
    std::vector<int> sorted = seen;
    std::sort(sorted.begin(), sorted.end());
    check(sorted == std::vector<int>({0, 8, 16, 24, 32}) && seen != sorted, "shuffled: one epoch is a permutation of the 5 samples (order %d %d %d %d %d)",
          seen[0], seen[1], seen[2], seen[3], seen[4]);
    loader_free(&dl);
    // llm.c's permutation: MT19937(42), Fisher-Yates from the top with rand32 % (i+1)
    std::mt19937 mt(42);
    std::vector<long> perm = {0, 1, 2, 3, 4};
    for (long i = 4; i > 0; i--) std::swap(perm[i], perm[mt() % (i + 1)]);
    bool same = true;
    for (int k = 0; k < 5; k++) same &= seen[k] == perm[k] * BT;
    check(same, "shuffled order is llm.c's MT19937(42) Fisher-Yates permutation");
    // several shards over several epochs, as llm.c's dataloader.h draws them from its one generator: at each
    // epoch the shard order (Fisher-Yates), then in each shard as it is opened its samples' order; so a
    // later epoch has new orders of both
    {
        std::vector<int> sizes = {41, 73, 25};
        std::vector<std::vector<int>> sh(3);
        for (int k = 0; k < 3; k++) {
            for (int i = 0; i < sizes[k]; i++) sh[k].push_back(2000 * k + i);
            write_tokens(d + "/multi_" + std::to_string(k) + ".bin", sh[k]);
        }
        std::mt19937 rng(42);
        std::vector<int> order = {0, 1, 2}, want, got;
        while (want.size() < 60) {
            for (int i = 2; i > 0; i--) std::swap(order[i], order[rng() % (i + 1)]);
            for (int k : order) {
                long ns = (sizes[k] - 1) / BT;
                std::vector<long> idx(ns);
                for (long i = 0; i < ns; i++) idx[i] = i;
                for (long i = ns - 1; i > 0; i--) std::swap(idx[i], idx[rng() % (i + 1)]);
                for (long i : idx) want.push_back(sh[k][i * BT]);
            }
        }
        want.resize(60);
        loader_init(&dl, "train", (d + "/multi_*.bin").c_str(), nullptr, B, T, 65536, true, 1, 0, 1);
        for (int k = 0; k < 60; k++) { loader_next(&dl); got.push_back(dl.inputs[0]); }
        loader_free(&dl);
        check(got == want, "shuffled, 3 shards of 5, 9 and 3 samples over 3 epochs: 60 batches in llm.c's order (a new shard order and new "
              "sample orders each epoch)");
    }
    // the startup scan reads a shard in chunks of 2M tokens: the largest id and its first place, past the first chunk
    std::vector<int> big(5000001, 7);
    big[3] = 200;
    big[4500000] = 40000;
    big[4900000] = 40000;
    write_tokens(d + "/big.bin", big);
    std::vector<TokenShard> shards = token_files((d + "/big.bin").c_str(), "train", 2);
    token_shard_scan(&shards[0], "train");
    check(shards[0].max_id == 40000 && shards[0].max_pos == 4500000, "scan of %zu tokens in 3 chunks: largest id %d first at token %ld",
          big.size(), shards[0].max_id, shards[0].max_pos);
    // data parallelism and accumulation: micro-batch k of replica g (of D, A micro-steps, -b B) is rows
    // (k*D + g)*B .. of the batch one loader with -b A*D*B reads; in order and shuffled, over both shards
    // and three epochs
    int D = 2, A = 2, Bp = 1;
    for (bool shuffle : {false, true}) {
        DataLoader big, part[2];
        loader_init(&big, "train", (d + "/shard_*.bin").c_str(), nullptr, A * D * Bp, T, 65536, shuffle, 1, 0, 1);
        for (int g = 0; g < D; g++) loader_init(&part[g], "train", (d + "/shard_*.bin").c_str(), nullptr, Bp, T, 65536, shuffle, D, g, A);
        long rows = 0, bad = 0;
        for (int step = 0; step < 12; step++) {
            loader_next(&big);
            for (int g = 0; g < D; g++)
                for (int k = 0; k < A; k++) {
                    loader_next(&part[g]);
                    long row0 = (long)(k * D + g) * Bp * T;
                    for (long i = 0; i < (long)Bp * T; i++) {
                        bad += part[g].inputs[i] != big.inputs[row0 + i];
                        bad += part[g].targets[i] != big.targets[row0 + i];
                    }
                    rows += Bp;
                }
        }
        check_le(bad, 0, "%s: %d replicas x %d micro-steps x -b %d read what -b %d reads (%ld rows over 12 steps, 3 epochs): tokens differing",
                 shuffle ? "shuffled" : "in order", D, A, Bp, A * D * Bp, rows);
        loader_free(&big);
        for (int g = 0; g < D; g++) loader_free(&part[g]);
    }
}

// ----------------------------------------------------------------------------
// checkpoints

static void test_checkpoint() {
    printf("checkpoint: write, load, shard and gather round-trip exactly\n");
    GPTConfig cfg = make_config(2, 4, 32, 300, 16);
    std::vector<float> init = init_weights(&cfg, 5);
    std::string path = tmpdir() + "/model.bin";
    int err = model_write(path.c_str(), &cfg, init.data());
    check(err == 0, "write %s: %s", path.c_str(), err ? strerror(err) : "done");
    GPTConfig c2;
    std::vector<float> loaded;
    model_read(path.c_str(), &c2, &loaded);
    check(memcmp(&c2, &cfg, sizeof(cfg)) == 0 && loaded == init, "load returns the same header and %zu parameters", loaded.size());
    struct stat st;
    st.st_size = stat(path.c_str(), &st) == 0 ? st.st_size : -1;
    check(st.st_size == 1024 + 4 * (long)init.size(), "file size %ld = header + 4 * %zu",
          (long)st.st_size, init.size());
    for (int P : {1, 2, 4}) {
        TpResult res;
        std::vector<int> tok = random_tokens(2 * 4 + 1, cfg.V, 1);
        run_tp(&cfg, loaded, P, 1, tok, 2, 4, 0.0f, 0.0f, &res);  // lr 0: the update leaves weights as they are
        check(res.params_full == init, "P=%d: shard then gather gives back every parameter bit for bit", P);
    }
}

// ----------------------------------------------------------------------------
// data parallelism in one process: tp.cu's grid (ranks_setup, rank_run_start, train_step) run directly

struct GridResult {
    std::vector<float> losses;       // per step: the mean loss over the global batch (world rank 0)
    std::vector<float> params_full;  // replica 0's parameters after the last step, gathered
    std::vector<float> grads_full;   // replica 0's gradients of the last step, gathered (-z 0: complete on every replica)
    std::vector<float> norms;        // per step: the gradient norm (world rank 0)
    long mismatches;                 // (step, rank) pairs whose weight checksum differs from replica 0's rank
    long compared;                   // (step, rank) pairs compared
    long distinct;                   // distinct checksums of replica 0's TP rank 0 over the steps
    double tp_moved[COMM_KINDS];     // floats world rank 0's TP collectives moved in the last step, by kind
    double dp_moved[COMM_KINDS];     // and its DP collectives
    double pp_sent;                  // floats world rank 0 (stage 0) sent to the next stage in the last step
    long moments;                    // floats of AdamW's m on world rank 0
    std::vector<int> detected;       // with perturb: what replicas_differ answers on each rank
};

// `steps` AdamW steps (lr 1e-3 constant, wd 0.1, clip 1, in-order batches) of P TP ranks x D replicas,
// ZeRO stage `zero`, `accum` micro-steps of -b B per replica, sequence parallelism `sp`, on `data` served
// as the embedded corpus, on g_device (as run_tp). perturb (CPU): afterwards the last replica's TP rank 0 moves one weight by an
// ulp and every rank asks replicas_differ.
// S: pipeline stages (sched: PP_1F1B or PP_GPIPE).
static double g_grid_timeout = 60;  // the grid's --timeout
static void run_grid(const GPTConfig* cfg, const std::vector<float>& init, int P, int D, int zero, int accum, int steps,
                     const std::vector<int>& data, int B, int T, GridResult* out, bool perturb = false, int sp = 0, int S = 1,
                     int sched = PP_1F1B, int dtype = DTYPE_FP32) {
    Run* run = new Run();
    Args* a = &run->args;
    a->B = B; a->T = T; a->lr = 1e-3f; a->warmup = 0; a->final_frac = 1.0f; a->wd = 0.1f; a->max_steps = steps;
    a->beta1 = 0.9f; a->beta2 = 0.95f; a->clip = 1.0f; a->shuffle = 0; a->zero = zero; a->timeout = g_grid_timeout; a->dp = D; a->threads = 1;
    a->sp = sp;
    a->dtype = dtype;
    a->seed = 1234;
    run->cfg = *cfg;
    run->P = P;
    run->D = run->Dg = D;
    run_set_stages(run, S);
    run->pp_schedule = sched;
    run->accum = accum;
    run->device = g_device;
    run->ngpu = g_device == DEV_CUDA ? g_ngpu : 0;
    run->init = init;
    run->corpus_train.assign(data.begin(), data.end());
    run->corpus_val = run->corpus_train;
    ranks_setup(run);
    int W = D * S * P;  // world rank (d S + stage) P + r
    std::vector<uint64_t> sums((size_t)steps * W);
    *out = GridResult();
    out->params_full.assign(init.size(), 0.0f);
    out->grads_full.assign(init.size(), 0.0f);
    out->detected.assign(W, -1);
    auto body = [&](int d, int stage, int r) {
        RankRun rr;
        rank_run_start(&rr, run, d, r, stage);
        int w = (d * S + stage) * P + r;
        if (g_device == DEV_CUDA) cuda_set_tf32(&rr.rk.cuda, g_tf32);
        for (int s = 0; s < steps; s++) {
            StepStats st = train_step(run, &rr, s);
            sums[(size_t)s * W + w] = gpt_checksum(&rr.m, &rr.rk);
            if (rr.world.rank == 0) {
                out->losses.push_back(st.loss);
                out->norms.push_back(st.norm);
                for (int k = 0; k < COMM_KINDS; k++) {
                    out->tp_moved[k] = st.comm_moved[k];
                    out->dp_moved[k] = st.dp_moved[k];
                }
                out->moments = rr.m.nslice;
                out->pp_sent = st.pp_bytes / sizeof(float);
            }
        }
        gpt_gather_masters(&rr.m, &rr.rk);  // (ZeRO-1 in bf16: every replica takes part)
        if (d == 0) gpt_gather(&rr.m, &rr.rk, rr.m.params_mem, out->params_full.data());
        if (d == 0) {
            float* g = gpt_grads_fp32(&rr.m, &rr.rk);
            gpt_gather(&rr.m, &rr.rk, g, out->grads_full.data());
            dev_free(&rr.rk, g);
        }
        if (perturb) {
            if (d == D - 1 && r == 0 && stage == 0) rr.m.params_mem[0] = nextafterf(rr.m.params_mem[0], INFINITY);
            uint64_t sum0;
            out->detected[w] = replicas_differ(run, &rr, &sum0);
        }
        rank_run_end(&rr);
    };
    std::vector<std::thread> th;
    for (int d = 0; d < D; d++)
        for (int stage = 0; stage < S; stage++)
            for (int r = 0; r < P; r++) th.emplace_back(body, d, stage, r);
    for (auto& t : th) t.join();
    ranks_teardown(run);
    delete run;
    std::set<uint64_t> seen;
    int R = S * P;  // the ranks of one replica
    for (int s = 0; s < steps; s++) {
        seen.insert(sums[(size_t)s * W]);
        for (int w = 0; w < W; w++) {
            out->mismatches += sums[(size_t)s * W + w] != sums[(size_t)s * W + w % R];
            out->compared++;
        }
    }
    out->distinct = (long)seen.size();
}

static double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size() || a.empty()) return INFINITY;
    double w = 0;
    for (size_t i = 0; i < a.size(); i++) w = worse(w, (double)fabs(a[i] - b[i]));
    return w;
}

static void test_dp() {
    GPTConfig cfg = make_config(2, 4, 32, 200, 32);  // NH 4, Vp 256
    int B = 2, T = 16, steps = 10;
    printf("data parallelism in one process: L%d NH%d C%d, T%d, %d steps (lr 1e-3, wd 0.1, clip 1), in-order batches\n",
           cfg.L, cfg.NH, cfg.C, T, steps);
    std::vector<float> init = init_weights(&cfg, 7);
    std::vector<int> data = random_tokens((long)steps * 8 * B * T + 1, cfg.V, 99);
    std::map<int, GridResult> one;  // one rank with -b n
    auto reference = [&](int b) -> GridResult& {
        if (!one.count(b)) run_grid(&cfg, init, 1, 1, 0, 1, steps, data, b, T, &one[b]);
        return one[b];
    };
    struct { int P, D, zero, accum, sp; } grids[] = {{1, 2, 0, 1, 0}, {2, 2, 0, 1, 0}, {1, 4, 0, 1, 0}, {1, 2, 0, 2, 0},
                                                      {2, 2, 1, 1, 0}, {1, 4, 1, 1, 0}, {2, 2, 1, 2, 1}};
    for (auto& g : grids) {
        int big = B * g.D * g.accum;
        GridResult& ref = reference(big);
        GridResult res;
        run_grid(&cfg, init, g.P, g.D, g.zero, g.accum, steps, data, B, T, &res, false, g.sp);
        char name[96];
        snprintf(name, sizeof(name), "(P %d, D %d%s%s%s) x -b %d", g.P, g.D, g.accum > 1 ? ", 2 micro" : "", g.zero ? ", -z 1" : "",
                 g.sp ? ", SP" : "", B);
        check_le(max_abs_diff(res.losses, ref.losses), 1e-5, "%-34s against one rank with -b %d: per-step losses, largest difference", name, big);
        check_le(rel_err(res.params_full.data(), ref.params_full.data(), (long)ref.params_full.size()), 1e-5,
                 "%-34s against one rank with -b %d: weights after %d steps, rel err", name, big, steps);
        check_le(res.mismatches, 0, "%-34s weight checksums differing from replica 0's after every step (%ld compared, %ld distinct over the steps)",
                 name, res.compared, res.distinct);
        check(res.distinct == steps, "%-34s the weights change at every step (%ld distinct checksums in %d steps)", name, res.distinct, steps);
        // the payload per step by kind against the formulas
        double dp_expect[COMM_KINDS], tp_expect[COMM_KINDS], off = 0, dp_total = 0, tp_total = 0;
        dp_step_floats(&cfg, g.P, g.D, g.zero, false, dp_expect);
        step_comm_floats(&cfg, B, T, g.sp, g.accum, false, tp_expect);
        for (int k = 0; k < COMM_KINDS; k++) {
            off += fabs(res.dp_moved[k] - dp_expect[k]) + fabs(res.tp_moved[k] - tp_expect[k]);
            dp_total += res.dp_moved[k];
            tp_total += res.tp_moved[k];
        }
        check_le(off, 0, "%-34s floats moved per step by kind against the formulas: DP %.0f, TP %.0f: difference", name, dp_total, tp_total);
        if (g.zero) {
            GridResult z0;
            run_grid(&cfg, init, g.P, g.D, 0, g.accum, steps, data, B, T, &z0, false, g.sp);
            check_le(max_abs_diff(res.losses, z0.losses), 1e-6, "%-34s against -z 0: per-step losses, largest difference", name);
            check_le(rel_err(res.params_full.data(), z0.params_full.data(), (long)z0.params_full.size()), 1e-6,
                     "%-34s against -z 0: weights after %d steps, rel err", name, steps);
            long shard = z0.moments;  // -z 0: m covers the rank's whole shard
            check(res.moments * g.D >= shard && res.moments * g.D < shard + 32L * g.D,
                  "%-34s AdamW's m holds %ld floats per rank, 1/%d of the shard's %ld (padded to 32 per replica)", name, res.moments, g.D, shard);
        }
    }
    // the check can fail: one weight of one replica one ulp off is seen by every rank
    GridResult res;
    run_grid(&cfg, init, 2, 2, 0, 1, 2, data, B, T, &res, true);
    bool all = true;
    for (int x : res.detected) all &= x == 1;
    check(all, "one weight of replica 1 moved by one ulp: replicas_differ reports 1 differing rank on all %zu ranks", res.detected.size());
}
// ----------------------------------------------------------------------------
// the embedded corpus, sampling, data preparation

static void test_corpus() {
    printf("embedded corpus: deterministic, exact entropy against an empirical estimate\n");
    std::string a, b, c;
    grammar_generate(7, 1 << 20, &a, nullptr);
    grammar_generate(7, 1 << 20, &b, nullptr);
    grammar_generate(8, 1 << 20, &c, nullptr);
    check(a == b && a != c, "same seed, same %zu bytes; another seed, other bytes", a.size());
    // the exact rate against -log p / bytes of a long sample (the same quantity, estimated)
    std::string text;
    double logprob = 0.0;
    grammar_generate(1234, 16 << 20, &text, &logprob);
    double exact = grammar_entropy_per_byte(), empirical = -logprob / text.size();
    check_le(fabs(empirical - exact) / exact, 2e-3, "entropy %.5f nats/byte exact, %.5f empirical over %zu bytes: rel diff",
             exact, empirical, text.size());
    bool ascii = true;
    for (unsigned char ch : text) ascii &= ch < 128;
    check(ascii, "byte-level: every byte < 128, so a vocab of 256 covers it");

    // as words: the tokens of seed s decode to the text of seed s, sentence for sentence
    const std::vector<std::string>& vocab = grammar_vocab();
    std::set<std::string> distinct(vocab.begin(), vocab.end());
    bool nonempty = true;
    for (const std::string& p : vocab) nonempty &= !p.empty() && p.size() < 256;
    check(distinct.size() == vocab.size() && nonempty, "word vocab: %zu tokens, all distinct, each 1 to 255 bytes", vocab.size());
    std::vector<uint16_t> tokens;
    double token_logprob = 0.0;
    grammar_generate_tokens(1234, 4 << 20, &tokens, &token_logprob);
    std::string decoded;
    for (uint16_t t : tokens) decoded += vocab[t];
    std::string same;
    grammar_generate(1234, decoded.size(), &same, nullptr);
    check(same == decoded,
          "the %zu word tokens of seed 1234 decode to the same %zu bytes as its byte stream", tokens.size(), decoded.size());
    double exact_t = grammar_entropy_per_token(), empirical_t = -token_logprob / tokens.size();
    check_le(fabs(empirical_t - exact_t) / exact_t, 2e-3, "entropy %.5f nats/token exact, %.5f empirical over %zu tokens: rel diff",
             exact_t, empirical_t, tokens.size());
    // the two floors describe the same text: per token = per byte x bytes per token
    double bytes_per_token = (double)decoded.size() / tokens.size();
    check_le(fabs(exact_t / exact - bytes_per_token) / bytes_per_token, 2e-3,
             "floor per token / floor per byte = %.4f, bytes per token %.4f in the sample: rel diff", exact_t / exact, bytes_per_token);
    // prompts: the text of 20000 tokens encodes back to them; words outside the grammar are refused, named
    std::vector<int> enc;
    std::string why, part;
    for (size_t i = 0; i < 20000; i++) part += vocab[tokens[i]];
    bool back = grammar_encode(part, &enc, &why) && enc.size() == 20000 && std::equal(enc.begin(), enc.end(), tokens.begin());
    check(back, "encode(decode(20000 word tokens)) gives them back (%s)", why.c_str());
    bool ok1 = grammar_encode("The dog sleeps.", &enc, &why) && enc.size() == 4 && vocab[enc[0]] == "The" && vocab[enc[3]] == ".";
    bool ok2 = !grammar_encode("The theme", &enc, &why) && why.find("\"theme\"") != std::string::npos;
    bool ok3 = !grammar_encode("the dog", &enc, &why) && why.find("\"the\"") != std::string::npos;
    check(ok1 && ok2 && ok3, "\"The dog sleeps.\" is 4 tokens; \" theme\" (which starts like \" them\") and a lowercase first "
          "word are refused by name: %s", why.c_str());
}

static void sample_token_draws();
static void test_sampling() {
    printf("sampling: the same tokens at TP=1, 2 and 4 for the same seed and weights\n");
    GPTConfig cfg = make_config(2, 4, 64, 256, 64);
    std::vector<float> init = init_weights(&cfg, 9);
    for (auto& x : init) x *= 10.0f;  // peaked distributions: samples that say something about the weights
    std::vector<int> prompt = {'T', 'h', 'e'};
    std::vector<std::vector<int>> got(5);
    for (int P : {1, 2, 4}) {
        CommGroup* g = new CommGroup();
        comm_group_init(g, P, 30);
        std::vector<std::thread> th;
        for (int r = 0; r < P; r++)
            th.emplace_back([&, r]() {
                Rank rk;
                rank_init(&rk, g, r, DEV_CPU, 0, 1);
                GPT m;
                gpt_build(&m, &rk, &cfg, init.data(), 0);
                std::vector<int> out = generate(&m, &rk, prompt, 40, 32, 1.0f, 0, 5, -1);
                std::vector<int> top = generate(&m, &rk, prompt, 20, 32, 1.0f, 8, 6, -1);
                out.insert(out.end(), top.begin(), top.end());
                if (r == P - 1) got[P] = out;  // the last rank: every rank must agree, not only rank 0
                gpt_free(&m, &rk);
            });
        for (auto& t : th) t.join();
        delete g;
    }
    std::set<int> distinct(got[1].begin(), got[1].end());
    check(got[2] == got[1] && got[4] == got[1], "60 sampled tokens (temperature 1, then top-8) agree at TP=1, 2, 4 (%zu distinct tokens)", distinct.size());
    // a vocab that is padded (200 to 256): the padded rows of wte are zero, so their logits are 0, as likely as
    // any real token's in an untrained model; the samplers (the whole-forward one and the KV cache's) draw
    // from the V real tokens only
    {
        GPTConfig pc = make_config(1, 2, 32, 200, 64);
        std::vector<float> pw = init_weights(&pc, 4);
        std::vector<int> drawn[2];
        on_ranks(2, false, [&](CommGroup* g, int r) {
            Rank rk;
            rank_init(&rk, g, r, DEV_CPU, 0, 1);
            GPT m;
            gpt_build(&m, &rk, &pc, pw.data(), 0);
            drawn[r] = generate(&m, &rk, {1}, 300, 32, 1.0f, 0, 7, -1);
            for (auto& row : generate_batch(&m, &rk, {{1}, {2, 3}}, 300, 32, 1.0f, 0, 8, -1)) drawn[r].insert(drawn[r].end(), row.begin(), row.end());
            gpt_free(&m, &rk);
        });
        long beyond = std::count_if(drawn[0].begin(), drawn[0].end(), [&](int t) { return t < 0 || t >= pc.V; });
        check(drawn[0].size() == 900 && drawn[0] == drawn[1] && beyond == 0,
              "vocab 200 padded to 256, TP 2: %zu tokens drawn by both samplers, %ld of them beyond the vocab", drawn[0].size(), beyond);
    }
    sample_token_draws();
}

// sample_token's draws against the distribution it means: softmax(logits / temperature) over the top k.
// 200,000 draws from 12 logits at temperature 0.7 with k 5 and 0 (all), and temperature 0: every token's count
// within 5 sigma of its probability times the draws (binomial sigma), none outside the top k, the argmax alone.
static void sample_token_draws() {
    const float logits[12] = {1.3f, -0.4f, 2.1f, 0.2f, 1.9f, -2.5f, 0.9f, 1.6f, -1.0f, 0.0f, 2.0f, 0.5f};
    const int V = 12, draws = 200000;
    for (int topk : {5, 0}) {
        const float temperature = 0.7f;
        std::vector<float> sorted(logits, logits + V);
        std::sort(sorted.begin(), sorted.end(), std::greater<float>());
        const float cut = topk ? sorted[topk - 1] : -INFINITY;
        std::vector<double> p(V);
        double z = 0;
        for (int i = 0; i < V; i++) z += p[i] = logits[i] >= cut ? exp(logits[i] / (double)temperature) : 0.0;
        std::vector<long> count(V, 0);
        Rng rng = {42};
        for (int d = 0; d < draws; d++) count[sample_token(logits, V, temperature, topk, &rng)]++;
        double worst = 0;
        long outside = 0;
        for (int i = 0; i < V; i++) {
            double q = p[i] / z, sigma = sqrt(draws * q * (1 - q));
            if (q == 0) outside += count[i];
            else worst = std::max(worst, fabs(count[i] - draws * q) / sigma);
        }
        check_le(outside ? INFINITY : worst, 5.0, "sample_token at temperature 0.7, %s of 12: %d draws, tokens outside them drawn %ld "
                 "times; each token's count against softmax(logits / 0.7), in sigmas", topk ? "the top 5" : "all", draws, outside);
    }
    Rng rng = {43};
    long not_argmax = 0;
    for (int d = 0; d < 1000; d++) not_argmax += sample_token(logits, V, 0.0f, 0, &rng) != 2;
    check(not_argmax == 0, "sample_token at temperature 0: the argmax (token 2) in 1000 of 1000 draws (%ld others)", not_argmax);
}

// the runs of ./tp as a child process, the GPU tests
#include "dev/test_cli.cuh"
#include "dev/test_runs.cuh"
#include "dev/test_procs.cuh"
#include "dev/test_gpu.cuh"
#include "dev/test_perf.cuh"
#include "dev/test_files.cuh"
#include "dev/test_serve.cuh"
#include "dev/test_bpe.cuh"
#include "dev/test_ops.cuh"
#include "dev/test_plan.cuh"
#include "dev/test_pp.cuh"
#include "dev/test_bf16.cuh"

// ----------------------------------------------------------------------------

// whether a CUDA GPU is visible, said in a line; without one the line says what is skipped
static int g_ndev = 0;
static bool gpu_visible(const char* tests, const char* what) {
    if (g_ndev == 0) {
        printf("GPU %s: skipped, no CUDA GPU visible (%s)\n", tests, what);
        g_skipped++;
        return false;
    }
    printf("GPU %s on %d device%s\n", tests, g_ndev, g_ndev > 1 ? "s" : "");
    return true;
}

// the GPU tests, or a line saying why they are skipped
static void test_gpu() {
    if (!gpu_visible("tests", "the CUDA ops, GPU collectives and GPU training runs")) return;
    gpu_op_tests(g_argv0, g_ndev);
    gpu_training_tests(g_ndev);
    serve_gpu_tests(g_ndev);
}

// the gpu group's first part alone: every CUDA op against its CPU op and the GPU collectives, without the
// training runs (make emu's second pass, with cuBLASLt refusing: the GEMM fallback against the CPU's op)
static void test_gpu_ops() {
    if (gpu_visible("op tests", "the CUDA ops and GPU collectives")) gpu_op_tests(g_argv0, g_ndev);
}

// point to point on the GPU alone, on up to 4 GPUs (a rank with a neighbour on each side sends both ways
// at once); make emu runs it on 4 emulated GPUs, where the gpu group has 2
static void test_gpu_p2p() {
    if (g_ndev < 2) {
        printf("GPU point to point: skipped, %d CUDA GPU visible (it needs 2)\n", g_ndev);
        g_skipped++;
        return;
    }
    std::vector<int> gpus;
    for (int i = 0; i < std::min(g_ndev, 4); i++) gpus.push_back(i);
    test_p2p_gpu(gpus, true);
}

// Fused attention against matmul attention over 10 AdamW steps, at TP = 1, 2, 4 with and without --sp 1,
// at T = 96 (a full 64-wide tile and a partial one): the two compute the same function with different
// rounding (a few u per attention output, the ops test), which training carries along; held to the
// TP = P against TP = 1 bounds. And fused TP = P against fused TP = 1 at this T, which the tp and sp
// groups' T = 16 (one tile) do not reach.
static void test_fused_vs_matmul() {
    GPTConfig cfg = make_config(2, 4, 32, 200, 128);
    int B = 2, T = 96, steps = 10;
    printf("fused against matmul attention: L%d NH%d C%d, B%d T%d, %d AdamW steps, TP = 1, 2, 4, with and without --sp 1\n", cfg.L,
           cfg.NH, cfg.C, B, T, steps);
    std::vector<float> init = init_weights(&cfg, 17);
    std::vector<int> data = random_tokens((long)steps * B * T + 1, cfg.V, 18);
    TpResult f1;
    run_tp(&cfg, init, 1, steps, data, B, T, 1e-3f, 1.0f, &f1, false, 0, true);
    struct { int P; bool sp; } cases[] = {{1, false}, {2, false}, {4, false}, {2, true}, {4, true}};
    for (auto& k : cases) {
        TpResult fu, mm;
        if (k.P == 1) fu = f1;
        else run_tp(&cfg, init, k.P, steps, data, B, T, 1e-3f, 1.0f, &fu, k.sp, 0, true);
        run_tp(&cfg, init, k.P, steps, data, B, T, 1e-3f, 1.0f, &mm, k.sp, 0, false);
        double lw = 0, lp = 0;
        for (int i = 0; i < steps; i++) {
            lw = worse(lw, fabs((double)fu.losses[i] - mm.losses[i]) / fabs(mm.losses[i]));
            lp = worse(lp, fabs((double)fu.losses[i] - f1.losses[i]) / fabs(f1.losses[i]));
        }
        double gw = rel_err(fu.grads_full.data(), mm.grads_full.data(), (long)mm.grads_full.size());
        double pw = rel_err(fu.params_full.data(), mm.params_full.data(), (long)mm.params_full.size());
        const char* sp = k.sp ? " --sp 1" : "";
        check_le(lw, 1e-5, "P=%d%s fused against matmul: losses over %d steps, worst rel err", k.P, sp, steps);
        check_le(gw, 1e-5, "P=%d%s fused against matmul: step-0 gathered gradients, rel err", k.P, sp);
        check_le(pw, 1e-5, "P=%d%s fused against matmul: weights after %d steps, rel err", k.P, sp, steps);
        if (k.P > 1) {
            check_le(lp, 1e-5, "P=%d%s fused against fused TP=1: losses over %d steps, worst rel err", k.P, sp, steps);
            check_le(rel_err(fu.params_full.data(), f1.params_full.data(), (long)f1.params_full.size()), 1e-5,
                     "P=%d%s fused against fused TP=1: weights after %d steps, rel err", k.P, sp, steps);
        }
    }
}

// The vocab-parallel loss with logits far from 0: the token embedding (tied to the LM head) scaled by 1000
// puts them in the hundreds. Each rank shifts its exps by the row's maximum over the whole vocab (the
// all-reduce MAX of the local maxima), so no exp overflows and a row's sum never underflows to 0: TP=P's
// loss and gradients are TP=1's, and finite. (Any other shift, such as the sum of the ranks' maxima, is the
// same function in exact arithmetic; here its exps underflow, and it puts P=2's loss 36% off, P=4's 110%.)
static void test_tp_large_logits() {
    GPTConfig c = make_config(2, 4, 32, 200, 32);
    std::vector<float> init = init_weights(&c, 7);
    for (long i = 0; i < (long)c.Vp * c.C; i++) init[i] *= 1000.0f;  // wte, the first tensor
    std::vector<int> data = random_tokens(2 * 16 + 1, c.V, 5);
    TpResult ref;
    run_tp(&c, init, 1, 1, data, 2, 16, 1e-3f, 1.0f, &ref);
    for (int P : {2, 4}) {
        TpResult res;
        run_tp(&c, init, P, 1, data, 2, 16, 1e-3f, 1.0f, &res);
        const char* worst_name;
        double worst = worst_tensor_err(&c, res.grads_full, ref.grads_full, &worst_name);
        bool finite = std::isfinite(ref.losses[0]) && std::isfinite(res.losses[0]) && ref.losses[0] > 50;
        check_le(finite ? fabs(res.losses[0] - ref.losses[0]) / ref.losses[0] : INFINITY, 1e-6,
                 "P=%d logits in the hundreds (wte x 1000): step-0 loss %.4f vs TP=1's %.4f, rel err", P, res.losses[0], ref.losses[0]);
        check_le(worst, 1e-5, "P=%d logits in the hundreds: gathered gradients, worst tensor %s, rel err", P, worst_name);
    }
}

static void test_tp_all() {
    GPTConfig c4 = make_config(2, 4, 32, 200, 32);   // NH 4, Vp 256: P = 1, 2, 4
    test_tp_equivalence(&c4, {2, 4});
    GPTConfig c6 = make_config(2, 6, 48, 300, 32);   // NH 6, Vp 384: P = 3 (and 2, 6)
    test_tp_equivalence(&c6, {3, 6});
    test_tp_large_logits();
    test_fused_vs_matmul();
}

// sequence parallelism against TP=1; B*T = 48 tokens divide into 2, 3, 4 and 6 ranks
static void test_sp_all() {
    GPTConfig c4 = make_config(2, 4, 32, 200, 32);
    test_tp_equivalence(&c4, {2, 4}, true, 2, 24);
    GPTConfig c6 = make_config(2, 6, 48, 300, 32);
    test_tp_equivalence(&c6, {3}, true, 2, 24);
    test_acts_table();
}

// the groups, in the order `./test_tp` runs them
struct TestGroup {
    const char* name;
    void (*run)();
    const char* what;
};
static const TestGroup g_groups[] = {
    {"gpu", test_gpu, "every CUDA op against its CPU op, the GPU collectives, GPU training (needs a GPU)"},
    {"gpu_ops", test_gpu_ops, "the gpu group's CUDA ops and GPU collectives alone, no training (needs a GPU; by name only)"},
    {"gpu_p2p", test_gpu_p2p, "point to point on up to 4 GPUs: NCCL send/recv both ways, bit for bit (needs 2 GPUs)"},
    {"collectives", test_collectives, "all-reduce, reduce-scatter, all-gather against serial loops"},
    {"harness", test_harness, "a NaN fails check_le and every worst-of; the scratch folders are removed"},
    {"tp", test_tp_all, "TP = 2, 3, 4, 6 against TP = 1: losses, gradients, weights, replicated tensors, bytes; fused vs matmul attention"},
    {"sp", test_sp_all, "--sp 1 at P = 2, 3, 4 against TP = 1; the activation memory table"},
    {"recompute", test_recompute, "-r 1, 2 (and 3 with --attention matmul) bit-identical to -r 0, with and without --sp 1"},
    {"reference", [] { test_reference_forward(); test_reference_init(); test_reference_update(); },
     "the forward against an independent double-precision GPT-2; the initialization and the dN shapes against GPT-2's; two AdamW steps against llm.c's update in double"},
    {"gradcheck", test_gradcheck, "the backward against central finite differences"},
    {"ops", test_ops, "every CPU op, forward and backward, against a float64 reference, scores and logits past exp's range"},
    {"loader", test_loader, "token files: order, shards, llm.c's shuffle"},
    {"checkpoint", test_checkpoint, "model files: write, load, shard and gather round trip"},
    {"cli", test_cli_parity_run, "the llm.c-parity command line at --tp 1, 2, 4"},
    {"bad_input", test_bad_input, "bad input: one line on stderr, exit status 1"},
    {"resume", test_resume, "resume at the same and another P, --keep, refusals, NaN stop"},
    {"resume_epoch", test_resume_epoch, "resume, shuffled, across shards and an epoch wrap: bit-identical to one run"},
    {"interrupts", test_interrupts, "Ctrl-C saves and exits 0, a second Ctrl-C quits mid-step; kill -9 leaves a checkpoint that resumes"},
    {"hangs", test_hangs, "a mismatched or skipped collective is reported, not hung"},
    {"dp", test_dp, "data parallelism in one process: (P, D), -d, -z 1 against one rank; replicas bit-identical"},
    {"pp_schedule", test_pp_schedule, "1F1B and GPipe against a simulation of the stages: order, in flight, slots, bubble"},
    {"pp_p2p", test_pp_p2p, "point-to-point messages: bit for bit, in order, sends ahead of receives"},
    {"pp", test_pp_grid, "--pp 2 and 3 against --pp 1: losses, gradients, norms, weights; with TP, SP, DP, -z 1; both schedules"},
    {"pp_stall", test_pp_stall, "a stalled stage is reported within the timeout, naming the stage"},
    {"pp_cli", test_pp_cli, "--pp from the command line: against --pp 1, resume across grids both ways, Ctrl-C, bad input"},
    {"dp_resume", test_dp_resume, "resume on the same grid (bit-identical) and at another P, D, -d or -z"},
    {"dp_cli", test_dp_cli, "--dp D -b B against -b D*B from the command line, shuffled"},
    {"mpi", test_mpi, "2 processes under mpirun against 1: losses, replicas, resume, kill, stop, mismatch, bad input"},
    {"mpi_pp", test_mpi_pp, "pipeline stages in different processes under mpirun against one process, resume both ways, a stopped stage"},
    {"corpus", test_corpus, "the embedded corpus: deterministic, exact entropy per byte and per word token, words = bytes"},
    {"words", test_words, "the embedded corpus as words: startup lines, the folder's tokenizer.bin, prompts, --corpus bytes"},
    {"sampling", test_sampling, "the same samples at TP = 1, 2, 4; never a padded vocab id; the sampler's draws against softmax(logits / temperature) over the top k"},
    {"serve", test_serve, "the KV cache: logits against the full forward at TP = 1, 2, 4 (SP too), greedy, batches, sliding"},
    {"servecli", test_serve_runs, "--prompts, the decode sweep, --chat 1 through a pipe with Ctrl-C and end of input"},
    {"prepare", test_prepare, "data/prepare.py and training on its output"},
    {"logs", test_logs, "log.csv (bytes, the lr schedule), sweep.csv and the plots"},
    {"owndata", test_own_data, "own text: the vocab from the data, tokens checked at startup, the data line, --bpe offline"},
    {"memory", test_memory, "a run that cannot fit is refused at once; the estimate against a measured run; the table's formula"},
    {"rundir", test_run_dir, "-y 1 alone continues a run (the flags it saves), a used -o is refused, log.csv after kill -9, -o a/b/c"},
    {"samplecli", test_sample_cli, "-x 0 samples at any --tp, control bytes escaped, whole UTF-8 characters streamed, Ctrl-C in evaluations and samples"},
    {"checksums", test_checksums, "checkpoint checksums: each kind of damage found, the fallback to the newest that verifies, refusal"},
    {"folders", test_run_folders, "orphan files, -y 1 on a missing folder, one run per folder (lock), stale .tmp files"},
    {"messages", test_honest_messages, "a failed save, a peer's death under mpirun, --version, -i alone, a default -t that adapts"},
    {"flags", test_flags_ux, "--flag=value, the wording at --tp 1, the CUDA fallback line, saved float flags read back to the bit"},
    {"build", test_build, "make builds tp alone, WERROR=1, GPU code per model plus PTX, NCCL from the toolkit, NCCL_DIR or pip"},
    {"buildconfig", test_build_config, "build/config records MPI, WERROR, the GPU models, NCCL_DIR; changing one rebuilds tp and test_tp"},
    {"bpe", test_bpe, "prepare.py --vocab N: C++ encoder = Hugging Face ids and words, \\p{L} and \\p{N} at every code point, decoding, the split, pieces, bad inputs, tokenizer mismatches"},
    {"bperun", test_bpe_run, "a tiny BPE run trains and samples words; the run folder samples on its own"},
    {"export", test_export, "export.py at TP 1 and 2 identical, numpy logits = tp's, import then export bit for bit, import of shards and pytorch_model.bin, bf16, non-GPT-2"},
    {"bf16", test_bf16, "bf16: rounding to nearest even and stochastic, the GEMM against float64, vdpbf16ps = fp32 fmas, master copies at any P"},
    {"bf16_amx", test_bf16_amx, "--bf16-gemm amx (Intel AMX): the GEMM against float64, its bits across threads, training within bf16's bounds"},
    {"bf16_train", test_bf16_train, "--dtype bf16: against fp32 over 40 steps, TP=2, 4 and SP against TP=1, replicas, the ops, resume"},
    {"bf16_ckpt", test_bf16_checkpoint, "llm.c bf16 model files (version 5): read exactly, a run from one = one from its fp32, bad ones refused"},
    {"pool", test_pool, "the CPU ranks' worker threads: FTZ|DAZ in each, asleep when idle, bit-identical at any count"},
    {"cpuarch", test_cpu_arch, "the host code's -march: x86-64-v4 on AVX-512, v3 on AVX2, else native"},
    {"plan", test_plan_all, "--plan's cost model: FLOPs and collectives against the recipe's, memory against the allocation, the boxes, the recommendation; MFU"},
    {"plan_sweep", test_plan_sweep, "--plan's prediction against the measured --sweep 1 on this machine, every grid"},
    {"readme", test_readme, "the README's first val loss of the default run is what ./tp prints"},
};

int main(int argc, char** argv) {
    g_argv0 = argv[0];
    if (cudaGetDeviceCount(&g_ndev) != cudaSuccess) {
        g_ndev = 0;
        cudaGetLastError();
    }
    if (argc > 1 && !strcmp(argv[1], "child-skip-cuda")) return child_skip(false);
#ifdef TP_MPI
    if (argc > 1 && !strcmp(argv[1], "child-mpi-collectives")) return child_mpi_collectives(argc, argv);
#endif
    if (argc > 1 && !strcmp(argv[1], "child-skip-nccl")) return child_skip(true);
    if (argc > 1 && !strcmp(argv[1], "child-pp-stall")) return child_pp_stall();
    if (argc > 2 && !strcmp(argv[1], "child-tmpdir")) return child_tmpdir(argv[2]);
    if (argc > 1 && !strcmp(argv[1], "bench")) {
        if (g_ndev == 0) { printf("bench: no CUDA GPU\n"); return 1; }
        CudaCtx cx;
        cuda_ctx_init(&cx, 0, 0);
        bench(&cx);
        cuda_ctx_free(&cx);
        bench_overlap(g_ndev);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "bench-attention")) return bench_attention_cpu();
    if (argc > 1 && !strcmp(argv[1], "bench-gemm")) return bench_gemm_cpu();
    if (argc > 1 && (!strcmp(argv[1], "--list") || !strcmp(argv[1], "--help"))) {
        printf("usage: ./test_tp [GROUP ...]   (no GROUP: all of them, in this order; ./test_tp bench: GPU timings;\n"
               "       ./test_tp bench-attention: the CPU's fused and matmul attention timed side by side;\n"
               "       ./test_tp bench-gemm: the CPU's fp32 and bf16 GEMMs timed side by side; with TP_OPENBLAS=LIB,\n"
               "       the fp32 GEMM against OpenBLAS's sgemm from the shared library LIB as well)\n");
        for (const TestGroup& g : g_groups) printf("  %-12s %s\n", g.name, g.what);
        return 0;
    }
    std::vector<const TestGroup*> run;
    for (int i = 1; i < argc; i++) {
        const TestGroup* found = nullptr;
        for (const TestGroup& g : g_groups)
            if (!strcmp(argv[i], g.name)) found = &g;
        if (!found) {
            fprintf(stderr, "error: no test group '%s' (./test_tp --list lists them)\n", argv[i]);
            return 2;
        }
        run.push_back(found);
    }
    if (run.empty())  // all of them, less gpu_ops: the gpu group runs it first
        for (const TestGroup& g : g_groups)
            if (strcmp(g.name, "gpu_ops")) run.push_back(&g);
    double t0 = comm_now();
    std::string took;  // each group's seconds, for whoever trims the suite's time (CI runs it five times)
    std::string unrun;  // the groups asked for by name that skipped and passed nothing: they could not run
    for (const TestGroup* g : run) {
        double tg = comm_now();
        int passed = g_passed, skipped = g_skipped;
        g->run();
        char buf[64];
        snprintf(buf, sizeof(buf), " %s %.1f", g->name, comm_now() - tg);
        took += buf;
        if (argc > 1 && g_skipped > skipped && g_passed == passed) unrun += std::string(" ") + g->name;
    }
    if (run.size() > 1) printf("seconds per group:%s\n", took.c_str());
    printf("(%.1f s)\n", comm_now() - t0);
    if (!g_failures.empty()) {
        printf("failures:\n");
        for (const std::string& f : g_failures) printf("  FAIL %s\n", f.c_str());
    }
    if (!unrun.empty()) printf("could not run, asked for by name:%s\n", unrun.c_str());
    if (g_skipped) printf("%d passed, %d failed, %d skipped\n", g_passed, g_failed, g_skipped);
    else printf("%d passed, %d failed\n", g_passed, g_failed);
    // a group asked for by name that could not run is a failure: `./test_tp gpu` must never look passed. One
    // that ran and skipped a part (a timing a sanitizer build does not give, a Python package that is not
    // there, the refusal only a build without MPI can show) ran: make asan and make tsan name their groups
    return g_failed || !unrun.empty() ? 1 : 0;
}
