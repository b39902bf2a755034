// dev/test_perf.cuh: the CPU ranks' worker threads (common/cpu_pool.h): every worker computes with
// flush-to-zero and denormals-are-zero, an idle pool sleeps instead of spinning, and the ops give the
// same bits at any number of threads. Included by test_tp.cu; group "pool".
#include <sys/resource.h>

static int run_sh(const std::string& cmd, std::string* out);  // test_tp.cu: runs cmd, stdout and stderr to out

// the process's CPU time (user + system) in seconds
static double perf_cpu_seconds() {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec * 1e-6;
}

// Runs one chunk on each of the pool's threads at once (each chunk waits until all have arrived, so no
// thread can take two) and, inside each, reads the MXCSR and multiplies two floats whose product is a
// denormal. Returns the distinct threads seen, and how many had the mode on and flushed the product.
struct PerfWorkerReport { int threads, mode_on, flushed; bool timed_out; };
static PerfWorkerReport perf_each_worker(int nt) {
    PerfWorkerReport rep = {0, 0, 0, false};
    std::thread rank([&]() {
        cpu_pool_start(nt);
        std::atomic<int> arrived{0}, on{0}, flushed{0};
        std::atomic<bool> late{false};
        std::mutex mu;
        std::set<std::thread::id> ids;
        cpu_for(nt, [&](long) {
            {
                std::lock_guard<std::mutex> lock(mu);
                ids.insert(std::this_thread::get_id());
            }
            if (cpu_fp_mode_on()) on++;
            volatile float a = 1e-30f, b = 1e-10f;  // 1e-40 is below FLT_MIN (1.2e-38): a denormal
            volatile float p = a * b;
            if (p == 0.0f) flushed++;
            arrived++;
            double t0 = comm_now();
            while (arrived.load() < nt)
                if (comm_now() - t0 > 10) {
                    late = true;
                    break;
                }
        });
        rep.threads = (int)ids.size();
        rep.mode_on = on.load();
        rep.flushed = flushed.load();
        rep.timed_out = late.load();
    });
    rank.join();
    return rep;
}

// the ops at a given number of threads in a fresh rank thread; returns their outputs, concatenated
static std::vector<float> perf_ops_at(int nt) {
    std::vector<float> out;
    std::thread rank([&]() {
        cpu_pool_start(nt);
        Rng rng = {7};
        auto fill = [&](std::vector<float>& v, float s) { for (auto& x : v) x = s * (float)rng_normal(&rng); };
        // odd shapes: partial tiles at both edges
        const int M = 45, N = 77, K = 33;
        std::vector<float> A(M * K), Bm(K * N), bias(N), C(M * N), C2(M * N);
        fill(A, 1); fill(Bm, 1); fill(bias, 1); fill(C2, 1);
        gemm_cpu(M, N, K, A.data(), K, 1, Bm.data(), N, 1, C.data(), N, false, bias.data());
        gemm_cpu(M, N, K, A.data(), 1, M, Bm.data(), 1, K, C2.data(), N, true, nullptr);
        // attention forward and backward, 3 x 2 heads
        const int B = 3, T = 19, NH = 2, hs = 8, Cc = NH * hs;
        std::vector<float> qkv(B * T * 3 * Cc), att(B * NH * T * T), ao(B * T * Cc), dao(B * T * Cc), dqkv(B * T * 3 * Cc);
        fill(qkv, 1); fill(dao, 1);
        attention_forward_cpu(ao.data(), att.data(), qkv.data(), B, T, NH, hs);
        attention_backward_cpu(dqkv.data(), dao.data(), qkv.data(), att.data(), B, T, NH, hs);
        // layernorm, GELU and the bias gradient
        const int Nl = 37, Cl = 70;
        std::vector<float> x(Nl * Cl), w(Cl), bb(Cl), y(Nl * Cl), mean(Nl), rstd(Nl), dy(Nl * Cl), dx(Nl * Cl), dw(Cl), db(Cl);
        std::vector<float> g(Nl * Cl), dg(Nl * Cl), dbias(Cl);
        fill(x, 1); fill(w, 1); fill(bb, 1); fill(dy, 1);
        layernorm_forward_cpu(y.data(), mean.data(), rstd.data(), x.data(), w.data(), bb.data(), Nl, Cl);
        layernorm_backward_cpu(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), Nl, Cl);
        gelu_forward_cpu(g.data(), x.data(), (long)Nl * Cl);
        gelu_backward_cpu(dg.data(), x.data(), dy.data(), (long)Nl * Cl);
        matmul_backward_cpu(nullptr, C2.data(), dbias.data(), dy.data(), x.data(), x.data(), Nl, 1, Cl);
        for (auto* v : {&C, &C2, &ao, &att, &dqkv, &y, &dx, &dw, &db, &g, &dg, &dbias}) out.insert(out.end(), v->begin(), v->end());
    });
    rank.join();
    return out;
}

static void test_pool() {
    // flush-to-zero and denormals-are-zero in the test's own (main) thread, set before main
    check(cpu_fp_mode_on(), "the main thread computes with flush-to-zero and denormals-are-zero (MXCSR 0x%x)",
#if defined(__SSE__)
          _mm_getcsr()
#else
          0u
#endif
    );
    for (int nt : {1, 2, 3, 4}) {
        PerfWorkerReport r = perf_each_worker(nt);
        check(!r.timed_out && r.threads == nt && r.mode_on == nt && r.flushed == nt,
              "a rank with %d thread%s: %d distinct threads ran a chunk, %d had FTZ|DAZ set in their MXCSR, "
              "%d flushed a denormal product to zero", nt, nt > 1 ? "s" : "", r.threads, r.mode_on, r.flushed);
    }
    // an idle pool sleeps: after a job, its workers spin CPU_POOL_SPIN_US (50 us) at most, then take no CPU.
    // The 50 ms after a job (the least of 3 jobs, so that a stray interruption does not count) hold the
    // spins of the 3 workers, 0.15 ms of CPU; a spin 20 times as long would take 3 ms. (Under ThreadSanitizer,
    // whose locks and wake-ups cost more, the same measured 1.2 ms: a sanitizer build is held to 10 ms.)
    {
        double used = 0, after_job = INFINITY;
        std::thread rank([&]() {
            cpu_pool_start(4);
            std::vector<float> v(1 << 16);
            for (int job = 0; job < 3; job++) {
                cpu_for((long)v.size(), [&](long i) { v[i] = (float)i; });
                double c0 = perf_cpu_seconds();
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
                after_job = std::min(after_job, perf_cpu_seconds() - c0);
            }
            double c0 = perf_cpu_seconds();
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
            used = perf_cpu_seconds() - c0;
        });
        rank.join();
        check_le(after_job, getenv("TP_BIN") ? 0.01 : 0.002,
                 "CPU seconds taken by a rank of 4 threads in the 50 ms after a job (its 3 workers' spins, then sleep)");
        check_le(used, 0.02, "CPU seconds taken by a rank of 4 threads in 0.2 s of idleness (its 3 workers asleep)");
    }
    // A thread held up in its chunk (descheduled: another program on its core) holds up nobody else: a job is
    // CPU_POOL_CHUNKS chunks a thread, and the others take the rest. A rank of 2 threads, 1600 indices: the
    // worker's first chunk sleeps 100 ms, the rank thread runs every other chunk meanwhile, 1500 indices (with
    // a chunk a thread, half of them would wait for the sleeper). The rank thread waits in its first index
    // until the worker holds a chunk, so the worker surely takes one.
    {
        const long n = 1600;
        long owner_ran = 0;
        double waited = 0;
        std::thread rank([&]() {
            cpu_pool_start(2);
            const std::thread::id owner = std::this_thread::get_id();
            std::atomic<bool> worker_in{false};
            bool first = true;
            cpu_for(n, [&](long) {
                if (std::this_thread::get_id() != owner) {
                    if (!worker_in.exchange(true)) std::this_thread::sleep_for(std::chrono::milliseconds(100));
                    return;
                }
                owner_ran++;
                if (first) {
                    first = false;
                    auto t0 = std::chrono::steady_clock::now();
                    while (!worker_in.load() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10))
                        std::this_thread::sleep_for(std::chrono::microseconds(100));
                    waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                }
            });
        });
        rank.join();
        check(owner_ran == n - n / (2 * CPU_POOL_CHUNKS), "a worker held up 100 ms in its chunk: the rank thread ran %ld of %ld indices "
              "meanwhile, all but that chunk's %ld (it waited %.3f s for the worker to take one)", owner_ran, n, n / (2 * CPU_POOL_CHUNKS), waited);
    }
    // the ops: bit-identical at 1, 2, 3 and 5 threads
    std::vector<float> one = perf_ops_at(1);
    for (int nt : {2, 3, 5}) {
        std::vector<float> many = perf_ops_at(nt);
        bool same = many.size() == one.size() && memcmp(many.data(), one.data(), one.size() * sizeof(float)) == 0;
        check(same, "gemm, attention, layernorm, GELU and bias-gradient outputs (%zu floats) at %d threads bit-identical to 1 thread",
              one.size(), nt);
    }
}

// The build's CPU code: x86-64-v4 on any AVX-512 CPU, x86-64-v3 on any AVX2 one, with generic tuning, so
// an Intel and an AMD host compile the same vector code; -march=native for anything else.
static void test_cpu_arch() {
    struct Case { const char* what; const char* flags; const char* want; };
    const Case cases[] = {
        {"an AVX-512 CPU (Zen 4 or Xeon)", "fpu sse2 avx avx2 fma bmi1 bmi2 f16c abm movbe xsave avx512f avx512bw avx512cd avx512dq avx512vl",
         "-march=x86-64-v4,-mtune=generic,-mprefer-vector-width=512"},
        {"an AVX2 CPU", "fpu sse2 avx avx2 fma bmi1 bmi2 f16c abm movbe xsave", "-march=x86-64-v3,-mtune=generic"},
        {"a CPU without AVX2", "fpu sse2 avx", "-march=native"},
    };
    std::string dir = tmpdir();
    for (const Case& c : cases) {
        std::string f = dir + "/cpuinfo";
        FILE* fp = fopen(f.c_str(), "w");
        if (fp) {
            fprintf(fp, "processor\t: 0\nflags\t\t: %s\n", c.flags);
            fclose(fp);
        }
        std::string out;
        int rc = run_sh("make -n -B tp CPUINFO=" + f, &out);
        check(rc == 0 && out.find(c.want) != std::string::npos, "make on %s: the host code is built with %s (exit %d)", c.what, c.want, rc);
    }
}
