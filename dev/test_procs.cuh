// dev/test_procs.cuh: data parallelism run as a user runs it: resume across grids and the DP flags from
// the command line, and ./tp under mpirun (Open MPI) on the CPU: processes against one, replicas
// bit-identical, resume at another process count, a killed or stopped process, bad input.
// Part of test_tp.cu, which includes it after its harness.
#pragma once

// resume at another grid from the CLI: the same global batch, another P, D, ZeRO stage or -d
static void test_dp_resume() {
    printf("resume across grids: bit-identical on the same grid, within 1e-5 on another with the same global batch\n");
    std::string d = tmpdir() + "/dpresume";
    mkdir(d.c_str(), 0755);
    std::string base = "-e L2C64H4 -t 32 -x 20 -v 0 -g 0 --threads 1 -c 0.1 ";
    std::string first = "--tp 2 --dp 2 -b 2 -z 1 ";
    int rc = run_cmd(base + first + "-n 10 -o " + d + "/a", nullptr, nullptr);
    std::vector<float> ref = model_params(ckpt_path((d + "/a").c_str(), "model", 20));
    check(rc == 0 && !ref.empty(), "--tp 2 --dp 2 -b 2 -z 1 saves steps 10 and 20 (exit %d)", rc);
    struct { const char* name; std::string grid; } again[] = {
        {"the same grid", first},
        {"--tp 1 --dp 1 -b 4 -z 0", "--tp 1 -b 4 "},
        {"--tp 4 --dp 1 -b 2 -d 128 (2 micro-steps)", "--tp 4 -b 2 -d 128 "},
        {"--tp 1 --dp 4 -b 1 -z 1", "--tp 1 --dp 4 -b 1 -z 1 "},
    };
    for (int i = 0; i < 4; i++) {
        std::string dir = d + "/r" + std::to_string(i);
        copy_step(d + "/a", dir, 10);
        std::string out, err;
        rc = run_cmd(base + again[i].grid + "-y 1 -o " + dir, &out, &err);
        std::vector<float> got = model_params(ckpt_path(dir.c_str(), "model", 20));
        bool resumed = rc == 0 && out.find("resuming from") != std::string::npos && got.size() == ref.size();
        if (i == 0) check(resumed && got == ref, "saved at --tp 2 --dp 2 -z 1, resumed on %s from step 10: the step-20 weights are bit-identical", again[i].name);
        else check_le(resumed ? rel_err(got.data(), ref.data(), (long)ref.size()) : INFINITY, 1e-5,
                      "saved at --tp 2 --dp 2 -z 1, resumed at %s from step 10: step-20 weights rel err%s%s", again[i].name,
                      err.empty() ? "" : ": ", err.c_str());
    }
    // in bf16 with -z 1 each replica updates only its slice of the fp32 masters and the replicas exchange the
    // bf16 copy; a checkpoint gathers the slices first, or the state file holds stale masters for the slices
    // of replicas other than the first, and the resume goes on from them
    rc = run_cmd(base + "--dtype bf16 " + first + "-n 10 -o " + d + "/b", nullptr, nullptr);
    copy_step(d + "/b", d + "/b0", 10);
    int rc2 = run_cmd(base + first + "-y 1 -o " + d + "/b0", nullptr, nullptr);  // (the saved --dtype: bf16)
    std::vector<char> m20 = slurp_bytes(ckpt_path((d + "/b").c_str(), "model", 20)), r20 = slurp_bytes(ckpt_path((d + "/b0").c_str(), "model", 20));
    std::vector<char> s20 = slurp_bytes(ckpt_path((d + "/b").c_str(), "state", 20)), t20 = slurp_bytes(ckpt_path((d + "/b0").c_str(), "state", 20));
    check(rc == 0 && rc2 == 0 && m20.size() > 1024 && m20 == r20 && s20.size() > 1024 && s20 == t20,
          "--dtype bf16 %ssaved at step 10 and resumed on the same grid: the step-20 model (bf16, %zu bytes) and state "
          "(the fp32 masters among them) files byte-identical", first.c_str(), m20.size());
    std::string err;
    rc = run_cmd(base + "--tp 2 --dp 2 -b 1 -y 1 -o " + d + "/a -x 30", nullptr, &err);
    check(rc == 1 && err.find("same batch shape") != std::string::npos, "resume with another global batch: %s", strtok(&err[0], "\n"));
}

// the command line: --dp against -b, shuffled (the permutation shared by the replicas), val included
static void test_dp_cli() {
    printf("command line: --dp D -b B prints the losses of -b D*B, shuffled batches and val included\n");
    std::string base = "-e L2C64H4 -t 32 -x 8 -v 4 -m 2 -g 0 --threads 1 -c 0.1 --shuffle 1 ";
    std::string out1, out2;
    int rc1 = run_cmd(base + "--tp 1 -b 4", &out1, nullptr), rc2 = run_cmd(base + "--tp 2 --dp 2 -b 2", &out2, nullptr);
    std::vector<float> a = grep_floats(out1, "| loss "), b = grep_floats(out2, "| loss ");
    std::vector<float> va = grep_floats(out1, "val loss "), vb = grep_floats(out2, "val loss ");
    a.insert(a.end(), va.begin(), va.end());
    b.insert(b.end(), vb.begin(), vb.end());
    check_le(rc1 == 0 && rc2 == 0 && a.size() == 11 ? max_abs_diff(a, b) : INFINITY, 1e-5,
             "--tp 2 --dp 2 -b 2 against --tp 1 -b 4 (shuffled): 8 step and 3 val losses, largest printed difference");
    check(out2.find("2 replicas bit-identical") != std::string::npos && out2.find("| dp ") != std::string::npos,
          "the val lines confirm the replicas' weights, the step lines show the DP collectives");
    // with sequence parallelism, recomputation, ZeRO-1 and accumulation all at once
    std::string out3;
    int rc3 = run_cmd(base + "--tp 2 --sp 1 -r 2 --dp 2 -z 1 -b 1 -d 128", &out3, nullptr);
    std::vector<float> c = grep_floats(out3, "| loss "), a8(a.begin(), a.begin() + std::min<size_t>(a.size(), 8));
    check_le(rc3 == 0 && c.size() == 8 ? max_abs_diff(a8, c) : INFINITY, 1e-5,
             "--tp 2 --sp 1 -r 2 --dp 2 -z 1 -b 1 -d 128 (2 micro-steps) against --tp 1 -b 4: 8 step losses (val batches are -b "
             "per replica, so not compared), largest printed difference");
    // the gradient norms too: Adam's step hardly changes when a gradient is scaled, so a step that summed its
    // micro-steps' or replicas' gradients without the 1/(global batch) of each would show in the losses only
    // where clipping differs; the printed norm shows it at once
    std::vector<float> n1 = grep_floats(out1, "| norm "), n2 = grep_floats(out2, "| norm "), n3 = grep_floats(out3, "| norm ");
    check_le(n1.size() == 8 && n2.size() == 8 && n3.size() == 8 ? std::max(max_abs_diff(n1, n2), max_abs_diff(n1, n3)) : INFINITY,
             2e-4, "the same runs' 8 gradient norms (printed to 4 places) against --tp 1 -b 4's: largest difference");
    // tok/s counts every replica's and micro-step's tokens: B x T x D x micro-steps = 128 a step in all three
    // runs; the printed ms (to 0.05 ms) and tok/s (to 0.5) must agree with 128 tokens a step
    int lines = 0, off = 0;
    for (const std::string* out : {&out1, &out2, &out3})
        for (size_t at = out->find("| norm "); at != std::string::npos; at = out->find("| norm ", at + 1)) {
            float norm, ms, toks;
            if (sscanf(out->c_str() + at, "| norm %f | %f ms | %f tok/s", &norm, &ms, &toks) != 3 || ms < 0.2f) continue;
            lines++;
            off += !printed_rate_agrees(toks, 128, ms, 0.1, 1);
        }
    check(lines == 24 && off == 0, "tok/s of the same runs' %d step lines is 128 tokens (B x T x replicas x micro-steps) over the "
          "printed ms: %d disagree", lines, off);
    // and the line after the last step: the mean over steps 2..8 (the first step is not timed), 128 tokens a step
    int averages = 0;
    off = 0;
    for (const std::string* out : {&out1, &out2, &out3}) {
        size_t at = out->find("average ");
        float ms, toks;
        int first, last;
        if (at == std::string::npos || sscanf(out->c_str() + at, "average %f ms per step, %f tok/s", &ms, &toks) != 2 || ms < 0.2f)
            continue;
        size_t steps = out->find("(steps ", at);
        averages++;
        off += !printed_rate_agrees(toks, 128, ms, 0.1, 1) || steps == std::string::npos ||
               sscanf(out->c_str() + steps, "(steps %d..%d)", &first, &last) != 2 || first != 2 || last != 8;
    }
    check(averages == 3 && off == 0, "the average lines of the same runs: 128 tokens a step over the mean ms, over steps 2..8: "
          "%d of %d disagree", off, averages);
    // Ctrl-C stops every replica after the same step, saves, exits 0; the run continues on another grid
    std::string d = tmpdir() + "/dpsig";
    bool started;
    int rc = interrupt_at_step5("-e L2C64H4 -t 32 -v 0 -g 0 --threads 1 --tp 1 --dp 2 -b 2 -z 1 -x 1000000", d, &started);
    std::vector<int> steps = ckpt_steps(d.c_str());
    std::string out4;
    int rc4 = steps.empty() ? -1 : run_cmd("--tp 2 -b 4 -x " + std::to_string(steps[0] + 2) + " -y 1 -o " + d, &out4, nullptr);
    check(started && rc == 0 && steps.size() == 1 && rc4 == 0 && out4.find("resuming from") != std::string::npos,
          "SIGINT to --dp 2 -z 1: exit %d, saved step %d; resumed at --tp 2 -b 4 (exit %d)", rc, steps.empty() ? -1 : steps[0], rc4);
}

// ----------------------------------------------------------------------------
// data parallelism across processes: ./tp under mpirun (Open MPI), on the CPU

// the launcher of an n-process job on this machine (test_mpi sets the variables Open MPI needs here);
// oversubscription lets 2 cores run more processes; `timeout` stops a hung job
static std::string mpirun(int n) {
    return "timeout 120 mpirun -np " + std::to_string(n) + " --oversubscribe";
}

static int count_lines_with(const std::string& text, const char* what) {
    int n = 0;
    for (size_t pos = 0; (pos = text.find(what, pos)) != std::string::npos; pos++) n++;
    return n;
}

#ifdef TP_MPI
// the pid of process p from the grid line "process p (host, pid N)"
static int grid_pid(const std::string& out, int p) {
    std::string key = "process " + std::to_string(p) + " (";
    size_t at = out.find(key);
    if (at == std::string::npos) return -1;
    at = out.find("pid ", at);
    return at == std::string::npos ? -1 : atoi(out.c_str() + at + 4);
}

// A job of two processes where process 1 is killed (SIGKILL: it died) or stopped (SIGSTOP: it stopped
// issuing collectives, or sending its stage's messages) after a few steps: the job must end non-zero
// within the timeout, saying so. `what` says what process 1 holds; `args` are the job's extra flags.
static void expect_job_ends(int sig, std::vector<const char*> expect, const char* what = "", const std::string& args = "") {
    std::string d = tmpdir() + "/mpikill";
    mkdir(d.c_str(), 0755);
    std::string out = d + (sig == SIGKILL ? "/kill.txt" : "/stop.txt");
    unlink(out.c_str());  // (an earlier job's output would name its process 1)
    unlink((out + ".err").c_str());
    double timeout = 3;
    pid_t job = spawn_tp("-e L2C64H4 -b 2 -t 32 -x 1000000 -v 0 -g 0 --threads 1 --timeout 3 " + args, out, mpirun(2));
    bool started = wait_for_text(out, "step    5/", 60);
    std::vector<char> o = slurp_bytes(out);
    int victim = grid_pid(std::string(o.begin(), o.end()), 1);
    double t0 = comm_now();
    if (started && victim > 0) kill(victim, sig);
    int status = wait_exit(job, timeout + 20);  // still running: the test fails, and ends what it started
    double took = comm_now() - t0;
    if (victim > 0) kill(victim, SIGKILL);  // a stopped process that mpirun did not end
    std::vector<char> e = slurp_bytes(out + ".err");
    std::string err(e.begin(), e.end());
    size_t at = std::string::npos;
    for (const char* e : expect) at = std::min(at, err.find(e));
    std::string line = at == std::string::npos ? err.substr(0, err.find('\n')) : err.substr(err.rfind('\n', at) + 1);
    line = line.substr(0, line.find('\n'));
    bool ok = started && victim > 0 && status != -1 && WIFEXITED(status) && WEXITSTATUS(status) != 0 && at != std::string::npos;
    check(ok && took <= timeout + 10, "process 1%s %s after 5 steps: the job ends with exit status %d after %.1f s (--timeout %g): %s",
          what, sig == SIGKILL ? "killed (SIGKILL)" : "stopped (SIGSTOP)", status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1,
          took, timeout, line.c_str());
}
#endif

#ifdef TP_MPI
// Run by test_mpi as `mpirun -np N test_tp child-mpi-collectives`: the five collectives of groups that span
// the N processes, with 1, 2 and 3 ranks in each, against serial loops. The sums are bit-exact in the
// order comm.cuh promises: each process's ranks in rank order, then the processes' partials in process
// order. Each process prints how many elements differ and exits non-zero if any.
static int child_mpi_collectives(int argc, char** argv) {
    comm_procs_start(&argc, &argv);
    auto in = [](int q, long i, int salt) {  // rank q's input element i: a float with all its bits in use
        uint64_t z = (uint64_t)q * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xBF58476D1CE4E5B9ull + (uint64_t)salt;
        z = (z ^ (z >> 29)) * 0x94D049BB133111EBull;
        return (float)((double)(z >> 11) / 9007199254740992.0 * 6.0 - 3.0);
    };
    std::atomic<long> bad{0}, total{0};
    for (int Pl : {1, 2, 3})
        for (long n : {1L, 7L, 1001L, 1L << 16}) {
            CommGroup* g = new CommGroup();
            comm_group_init(g, Pl, 30);
            comm_group_span(g);
            int N = g->nproc, P = N * Pl;
            // the sum of element i of inputs `salt` over every rank, in the promised order
            auto order_sum = [&](long i, int salt) {
                float total_sum = 0.0f;
                for (int p = 0; p < N; p++) {
                    float part = in(p * Pl, i, salt);
                    for (int l = 1; l < Pl; l++) part += in(p * Pl + l, i, salt);
                    total_sum = p == 0 ? part : total_sum + part;
                }
                return total_sum;
            };
            std::vector<std::thread> th;
            for (int l = 0; l < Pl; l++)
                th.emplace_back([&, l]() {
                    Comm c;
                    comm_init(&c, g, l);
                    int q = c.rank;
                    std::vector<float> sum(n), mx(n), gat((long)P * n), gin((long)P * n), rsin((long)P * n), rs(n), rsip((long)P * n);
                    for (long i = 0; i < n; i++) sum[i] = mx[i] = gin[(long)q * n + i] = in(q, i, 0);
                    for (long i = 0; i < (long)P * n; i++) rsin[i] = rsip[i] = in(q, i, 1);
                    comm_allreduce(&c, sum.data(), n, COMM_SUM, "test", -1);
                    comm_allreduce(&c, mx.data(), n, COMM_MAX, "test", 2);
                    comm_allgather(&c, gat.data(), sum.data(), n, "test", -1);          // every rank has the same sum
                    comm_allgather(&c, gin.data(), gin.data() + (long)q * n, n, "test", -1);  // in place
                    comm_reducescatter(&c, rs.data(), rsin.data(), n, "test", -1);
                    comm_reducescatter(&c, rsip.data() + (long)q * n, rsip.data(), n, "test", -1);  // in place
                    comm_barrier(&c, "test");
                    long b = 0;
                    for (long i = 0; i < n; i++) {
                        float s = order_sum(i, 0), m = in(0, i, 0);
                        for (int r = 1; r < P; r++) m = std::max(m, in(r, i, 0));
                        float rsum = order_sum((long)q * n + i, 1);
                        b += sum[i] != s;
                        b += mx[i] != m;
                        b += rs[i] != rsum;
                        b += rsip[(long)q * n + i] != rsum;
                        for (int r = 0; r < P; r++) b += gat[(long)r * n + i] != s || gin[(long)r * n + i] != in(r, i, 0);
                    }
                    bad += b;
                    total += n * (5 + 2L * P);
                });
            for (auto& t : th) t.join();
            comm_group_free(g);
            delete g;
        }
    printf("process %d of %d: %ld of %ld elements differ\n", g_procs.me, g_procs.n, bad.load(), total.load());
    fflush(stdout);
    comm_procs_finish();
    return bad.load() ? 1 : 0;
}
#endif

// The environment of the jobs under mpirun: as root Open MPI's mpirun wants the first two; the processes
// share this machine, so Open MPI's shared-memory transport is all they need (its TCP transport also
// takes its own locks in an order ThreadSanitizer reports, inside Open MPI).
static void mpi_jobs_env() {
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OMPI_MCA_btl", "self,vader", 1);
}

// whether mpirun can start the jobs of group `group` (with MPI built in); if not, says so and counts a skip
static bool mpi_jobs_ready(const char* group) {
    if (system("command -v mpirun >/dev/null 2>&1") == 0) return true;
    printf("%s: skipped, tp has MPI but no mpirun is on the PATH (apt-get install openmpi-bin)\n", group);
    g_skipped++;
    return false;
}

static void test_mpi() {
    mpi_jobs_env();
#ifndef TP_MPI
    printf("mpirun: this build has no MPI (make MPI=0, or no mpicxx): a job of several processes stops with one line\n");
    // the variables Open MPI's launcher gives its processes, without the launcher
    std::string err;
    int rc = run_in("OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0", "-x 1", nullptr, &err);
    check(rc == 1 && count_lines_with(err, "error: ") == 1 && err.find("built without MPI") != std::string::npos,
          "process 0 of 2: exit %d, %d error line: %s", rc, count_lines_with(err, "error: "), err.substr(0, err.find('\n')).c_str());
    rc = run_in("OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=1", "-x 1", nullptr, &err);
    check(rc == 1 && err.empty(), "process 1 of 2: exit %d, silent (process 0 says why)", rc);
    if (system("command -v mpirun >/dev/null 2>&1") == 0) {
        rc = run_in(mpirun(2), "-x 1", nullptr, &err);
        check(rc != 0 && count_lines_with(err, "error: ") == 1 && err.find("built without MPI") != std::string::npos,
              "mpirun -np 2 ./tp: exit %d, %d error line", rc, count_lines_with(err, "error: "));
    }
    printf("  skip the tests of jobs of several processes: this build has no MPI\n");
    g_skipped++;
#else
    if (!mpi_jobs_ready("mpirun")) return;
    printf("mpirun: 2 processes on the CPU (MPI between them) against one process\n");
    printf("  skip the refusal of a build without MPI: the make MPI=0 build tests it\n");
    g_skipped++;
    {
        // the collectives across 3 processes (uneven slices), with 1 to 3 ranks in each
        std::string cmd = mpirun(3) + " " + g_argv0 + " child-mpi-collectives 2>&1";
        FILE* f = popen(cmd.c_str(), "r");
        std::string out;
        char buf[512];
        while (f && fgets(buf, sizeof(buf), f)) out += buf;
        int st = f ? pclose(f) : -1;
        long bad = 0, total = 0;
        for (size_t at = 0; (at = out.find(": ", at)) != std::string::npos; at += 2) {
            long b = 0, t = 0;
            if (sscanf(out.c_str() + at, ": %ld of %ld elements differ", &b, &t) == 2) { bad += b; total += t; }
        }
        check_le(st == 0 && count_lines_with(out, "elements differ") == 3 ? bad : INFINITY, 0,
                 "all-reduce sum/max, all-gather (and in place), reduce-scatter (and in place) across 3 processes x 1, 2, 3 "
                 "ranks against serial loops, bit-exact: elements differing of %ld", total);
    }
    std::string base = "-e L2C64H4 -t 32 -x 10 -v 1 -m 1 -g 0 --threads 1 -c 0.1 --shuffle 0 ";
    std::string ref_out;
    int rc = run_cmd(base + "--tp 1 -b 4", &ref_out, nullptr);
    std::vector<float> ref = grep_floats(ref_out, "| loss ");
    check(rc == 0 && ref.size() == 10, "one process, -b 4: exit %d, %zu step losses", rc, ref.size());
    // the same global batch of 4 sequences on 2 processes: with and without --tp 2, with local replicas,
    // with -d accumulation, with ZeRO-1
    struct { const char* what; std::string args; } jobs[] = {
        {"2 processes x -b 2", "--tp 1 -b 2"},
        {"2 processes x --tp 2 x -b 2", "--tp 2 -b 2"},
        {"2 processes x --dp 2 x -b 1", "--tp 1 --dp 2 -b 1"},
        {"2 processes x -b 1 -d 128 (2 micro-steps)", "--tp 1 -b 1 -d 128"},
        {"2 processes x --tp 2 x -b 2 -z 1", "--tp 2 -b 2 -z 1"},
    };
    std::string out_dp;
    for (auto& j : jobs) {
        std::string out, err;
        rc = run_in(mpirun(2), base + j.args, &out, &err);
        std::vector<float> got = grep_floats(out, "| loss ");
        int checked = count_lines_with(out, "2 replicas bit-identical") + count_lines_with(out, "4 replicas bit-identical");
        check_le(rc == 0 ? max_abs_diff(got, ref) : INFINITY, 1e-5, "%-42s against one process -b 4: per-step losses over 10 steps "
                 "(clip 1, wd 0.1), largest difference%s%s", j.what, err.empty() ? "" : ": ", err.substr(0, err.find('\n')).c_str());
        check(checked == 11, "%-42s replicas' weight checksums agreed before every step and after the last (%d of 11 checks)", j.what, checked);
        if (j.args == "--tp 1 -b 2") out_dp = out;
    }
    // one replica per process sums the gradients in the order of one process with 2 local replicas
    std::string local;
    rc = run_cmd(base + "--tp 1 --dp 2 -b 2", &local, nullptr);
    auto last_sum = [](const std::string& o) {
        size_t at = o.rfind("(checksum ");
        return at == std::string::npos ? std::string("none") : o.substr(at + 1, 25);
    };
    check(rc == 0 && last_sum(local) == last_sum(out_dp) && grep_floats(local, "| loss ") == grep_floats(out_dp, "| loss "),
          "2 processes x 1 replica and 1 process x --dp 2: the same losses and weights bit for bit (%s)", last_sum(local).c_str());
    // resume across process counts
    std::string d = tmpdir() + "/mpiresume";
    mkdir(d.c_str(), 0755);
    std::string rbase = "-e L2C64H4 -t 32 -x 10 -v 0 -g 0 --threads 1 -c 0.1 -b 2 ";
    rc = run_in(mpirun(2), rbase + "--tp 2 -n 5 -o " + d + "/a", nullptr, nullptr);
    std::vector<float> want = model_params(ckpt_path((d + "/a").c_str(), "model", 10));
    check(rc == 0 && !want.empty(), "2 processes x --tp 2 save steps 5 and 10 (exit %d)", rc);
    struct { const char* what; std::string launcher, grid; bool exact; } resumes[] = {
        {"2 processes x --tp 2 (the same grid)", mpirun(2), "--tp 2", true},
        {"1 process x --dp 2 --tp 2", "", "--tp 2 --dp 2", true},
        {"1 process x --tp 1 -b 4", "", "--tp 1 -b 4", false},
        {"2 processes x --dp 2 -b 1 -z 1", mpirun(2), "--tp 1 --dp 2 -b 1 -z 1", false},
    };
    for (int i = 0; i < 4; i++) {
        std::string dir = d + "/r" + std::to_string(i), err;
        copy_step(d + "/a", dir, 5);
        rc = run_in(resumes[i].launcher, rbase + resumes[i].grid + " -y 1 -o " + dir, nullptr, &err);
        std::vector<float> got = model_params(ckpt_path(dir.c_str(), "model", 10));
        if (resumes[i].exact) check(rc == 0 && got == want, "saved by 2 processes at step 5, resumed on %s: step-10 weights bit-identical", resumes[i].what);
        else check_le(rc == 0 && got.size() == want.size() ? rel_err(got.data(), want.data(), (long)want.size()) : INFINITY, 1e-5,
                      "saved by 2 processes at step 5, resumed on %s: step-10 weights rel err%s%s", resumes[i].what, err.empty() ? "" : ": ",
                      err.substr(0, err.find('\n')).c_str());
    }
    // a process that dies or stops issuing collectives
    expect_job_ends(SIGKILL, {"for the other processes", "exited on signal 9"});  // tp's timeout, or mpirun saw it first
    expect_job_ends(SIGSTOP, {"for the other processes"});
    // SIGTERM sent to the processes by someone else than mpirun (a batch system, kill in a shell) asks for a
    // stop as Ctrl-C does: every process stops after the same step, saves, and the job exits 0. (From mpirun,
    // their parent, it means the job is being ended: the peer's-death test in `messages` has that.)
    {
        std::string sd = d + "/term", so = d + "/term.txt";
        pid_t job = spawn_tp(rbase + "-x 1000000 -o " + sd, so, mpirun(2));
        bool started = wait_for_text(so, "step    5/", 60);
        std::vector<char> o = slurp_bytes(so);
        int p0 = grid_pid(std::string(o.begin(), o.end()), 0), p1 = grid_pid(std::string(o.begin(), o.end()), 1);
        if (started && p0 > 0 && p1 > 0) {
            kill(p0, SIGTERM);
            kill(p1, SIGTERM);
        }
        int status = wait_exit(job, 60);
        o = slurp_bytes(so);
        std::string out(o.begin(), o.end());
        check(started && p0 > 0 && p1 > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 && !ckpt_steps(sd.c_str()).empty() &&
                  out.find("stopping after this step, then saving") != std::string::npos,
              "SIGTERM to both processes of a job (not from mpirun): exit %d, saved step %d: %s", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
              ckpt_steps(sd.c_str()).empty() ? -1 : ckpt_steps(sd.c_str()).back(), first_line_with(out, "stopping").c_str());
    }
    // processes that disagree on their collectives: -z 0 in one, -z 1 in the other (an MPMD job)
    std::string err;
    std::string cmd = mpirun(1) + " " + tp_bin() + " " + rbase + "-z 0 : -np 1 " + tp_bin() + " " + rbase + "-z 1 --timeout 20 >/dev/null 2>" + d + "/mm.txt";
    rc = system(cmd.c_str());
    std::vector<char> e = slurp_bytes(d + "/mm.txt");
    err.assign(e.begin(), e.end());
    check(rc != 0 && count_lines_with(err, "error: ") == 1 && err.find("collective mismatch between processes") != std::string::npos,
          "-z 0 in process 0, -z 1 in process 1: %d error line: %s", count_lines_with(err, "error: "),
          err.substr(err.find("error: ") == std::string::npos ? 0 : err.find("error: "), 150).c_str());
    // bad input under mpirun: one error line, not one per process
    struct { const char* what; std::string args; const char* expect; } bad[] = {
        {"-d not a multiple of B x T x replicas", rbase + "-d 100", "is not a multiple"},
        {"--tp that does not divide the heads", rbase + "--tp 3", "valid --tp values are 1, 2, 4"},
        {"--sweep under mpirun", rbase + "--sweep 1", "start it without mpirun"},
    };
    for (auto& b : bad) {
        rc = run_in(mpirun(2), b.args, nullptr, &err);
        size_t at = err.find("error: ");
        check(rc != 0 && count_lines_with(err, "error: ") == 1 && err.find(b.expect) != std::string::npos,
              "%-38s exit %d, %d error line: %s", b.what, rc, count_lines_with(err, "error: "),
              at == std::string::npos ? "" : err.substr(at, err.find('\n', at) - at).c_str());
    }
#endif
}

// Pipeline stages in different processes: under mpirun a replica's stages spread over gcd(processes, S)
// processes, and the activations and their gradients cross between them over MPI. Against the same run
// in one process: the same losses, the same saved weights and AdamW state, the same sample; resume from
// one to the other both ways; a stage's process that stops is named; the refusals.
static void test_mpi_pp() {
    mpi_jobs_env();
#ifndef TP_MPI
    printf("mpi_pp: skipped, this build has no MPI (make MPI=0, or no mpicxx)\n");
    g_skipped++;
#else
    if (!mpi_jobs_ready("mpi_pp")) return;
    printf("mpi_pp: pipeline stages in different processes (MPI between them) against one process\n");
    std::string d = tmpdir() + "/mpipp";
    mkdir(d.c_str(), 0755);
    std::string base = "-e L4C64H4 -t 32 -x 10 -v 1 -m 1 -g 16 --threads 1 -c 0.1 --shuffle 0 -d 256 -n 5 ";
    std::string ref_out, err;
    int rc = run_cmd(base + "-b 2 --tp 2 --pp 2 -o " + d + "/ref", &ref_out, &err);
    std::vector<float> ref = grep_floats(ref_out, "| loss ");
    std::string ref_dir = d + "/ref";
    std::vector<float> ref_w = model_params(ckpt_path(ref_dir.c_str(), "model", 10));
    std::vector<char> ref_state = slurp_bytes(ckpt_path(ref_dir.c_str(), "state", 10));
    auto sample_of = [](const std::string& o) {
        std::vector<std::string> s = sample_texts(o);
        return s.empty() ? std::string() : s[0];
    };
    check(rc == 0 && ref.size() == 10 && !ref_w.empty() && !sample_of(ref_out).empty(),
          "one process, --tp 2 --pp 2 -b 2 -d 256 (4 micro-batches): exit %d, %zu step losses, a sample", rc, ref.size());
    // the state files differ in the process count they record, and in nothing else
    auto state_body = [](std::vector<char> b) {
        if (b.size() > sizeof(StateHeader)) memset(b.data(), 0, sizeof(StateHeader));
        return b;
    };
    struct { const char* what; int np; std::string args; bool exact; const char* layout; } jobs[] = {
        {"2 processes x 1 stage x --tp 2", 2, "-b 2 --tp 2 --pp 2", true, "stage 1 of replica 0"},
        {"2 processes x 1 stage, gpipe", 2, "-b 2 --tp 2 --pp 2 --pp-schedule gpipe", true, "stage 1 of replica 0"},
        {"2 processes x 2 stages (--pp 4), --tp 1", 2, "-b 2 --tp 1 --pp 4", false, "stages 2-3 of replica 0"},
        {"4 processes: 2 replicas x 2 stages, -z 1", 4, "-b 1 --tp 2 --pp 2 -z 1", false, "stage 1 of replica 1"},
        {"3 processes, --pp 2: 3 replicas of 2 stages", 3, "-b 2 --tp 1 --pp 2 -d 384", false, "replica 2, all 2 stages"},
    };
    // under a sanitizer (make asan, make tsan: every thread of every process is watched, and a job takes
    // 10-40 s) the first job, the first resume and the stop: the threads' and MPI's calls of the others are the same
    bool sanitizer = getenv("TP_BIN") != nullptr;
    if (sanitizer) {
        printf("  skip 4 of the 5 layouts and 1 of the 2 resumes under a sanitizer (the same calls as the ones it runs)\n");
        g_skipped++;
    }
    for (auto& j : jobs) {
        if (sanitizer && &j != jobs) break;
        std::string out, dir = d + "/j" + std::to_string(&j - jobs);
        rc = run_in(mpirun(j.np), base + j.args + " -o " + dir, &out, &err);
        std::vector<float> got = grep_floats(out, "| loss ");
        std::vector<float> w = model_params(ckpt_path(dir.c_str(), "model", 10));
        std::string first_err = err.substr(0, err.find('\n'));
        bool laid_out = out.find(j.layout) != std::string::npos;
        if (j.np == 3) {  // another global batch: only that it trains and lays out as said
            check(rc == 0 && got.size() == 10 && laid_out && w.size() == ref_w.size(), "%-46s exit %d, %zu steps, \"%s\" in the grid%s%s",
                  j.what, rc, got.size(), j.layout, err.empty() ? "" : ": ", first_err.c_str());
            continue;
        }
        if (j.exact) {
            check(rc == 0 && laid_out && got == ref && w == ref_w && state_body(slurp_bytes(ckpt_path(dir.c_str(), "state", 10))) ==
                  state_body(ref_state) && sample_of(out) == sample_of(ref_out),
                  "%-46s against one process: losses, saved weights, AdamW state and sample bit-identical%s%s", j.what,
                  err.empty() ? "" : ": ", first_err.c_str());
        } else {
            double e = rc == 0 && w.size() == ref_w.size() ? rel_err(w.data(), ref_w.data(), (long)w.size()) : INFINITY;
            check_le(rc == 0 && laid_out ? std::max(max_abs_diff(got, ref), e) : INFINITY, 1e-5,
                     "%-46s against one process --tp 2 --pp 2: losses and step-10 weights (rel err %.1e)%s%s", j.what, e,
                     err.empty() ? "" : ": ", first_err.c_str());
        }
        if (&j == jobs)
            check(out.find("the stages span 2 processes") != std::string::npos && count_lines_with(out, "waited for its neighbours") == 2,
                  "%-46s the grid says where the stages run, and each stage's wait is printed", j.what);
    }
    // resume across process counts, both ways: saved at step 5 in one layout, steps 6-10 in the other
    struct { const char* what; std::string from, launcher; } resumes[] = {
        {"saved by 2 processes, resumed in 1", d + "/j0", ""},
        {"saved by 1 process, resumed by 2", d + "/ref", mpirun(2)},
    };
    for (auto& r : resumes) {
        if (sanitizer && &r != resumes) break;
        std::string dir = d + "/r" + std::to_string(&r - resumes);
        copy_step(r.from, dir, 5);
        rc = run_in(r.launcher, base + "-b 2 --tp 2 --pp 2 -g 0 -v 0 -y 1 -o " + dir, nullptr, &err);
        std::vector<float> w = model_params(ckpt_path(dir.c_str(), "model", 10));
        check(rc == 0 && w == ref_w, "%-46s: step-10 weights bit-identical to the run in one process%s%s", r.what,
              err.empty() ? "" : ": ", err.substr(0, err.find('\n')).c_str());
    }
    // a stage's process that stops: the other stage waits for its messages, or in a collective between the
    // stages (the step's loss, the gradient norm's or the tied wte's sum, wherever the stop caught it), then
    // says what it waited for
    expect_job_ends(SIGSTOP, {"from stage 1", "between stages 0 and 1, TP rank 0", "at step loss", "between the stages' TP rank 0"},
                    " (stage 1 of --pp 2)", "--pp 2 -d 256 --tp 1");
    // refused: local replicas when the stages span processes
    rc = run_in(mpirun(2), base + "-b 2 --tp 1 --pp 2 --dp 2 -d 512", nullptr, &err);
    size_t at = err.find("error: ");
    check(rc != 0 && count_lines_with(err, "error: ") == 1 && err.find("each process holds one replica's stages") != std::string::npos,
          "--dp 2 with the stages in 2 processes: exit %d, %d error line: %s", rc, count_lines_with(err, "error: "),
          at == std::string::npos ? "" : err.substr(at, err.find('\n', at) - at).c_str());
#endif
}
