// dev/test_runs.cuh: runs of ./tp that a user lives with: checkpoints and resume, Ctrl-C and kill -9,
// hangs reported instead of hung, data/prepare.py, log.csv and the plots, and a new user's paths (own
// text, the memory check, the run directory). Part of test_tp.cu, which includes it after its harness.
#pragma once
// ----------------------------------------------------------------------------
// checkpoints, resume, interrupts, hangs

// the parameters of an llm.c checkpoint file (empty if it is missing)
static std::vector<float> model_params(const std::string& path) {
    std::vector<char> b = slurp_bytes(path);
    if (b.size() < 1024) return {};
    return std::vector<float>((float*)(b.data() + 1024), (float*)(b.data() + b.size()));
}

static void copy_step(const std::string& from, const std::string& to, int step) {
    mkdir(to.c_str(), 0755);
    for (const char* kind : {"model", "state"}) {
        std::string cmd = "cp " + ckpt_path(from.c_str(), kind, step) + " " + to + "/";
        if (system(cmd.c_str()) != 0) printf("(copy failed: %s)\n", cmd.c_str());
    }
}

static void test_resume() {
    printf("resume: bit-identical at the same P, within tolerance at another P\n");
    std::string d = tmpdir() + "/resume";
    mkdir(d.c_str(), 0755);
    std::string base = "-e L2C64H4 -b 4 -t 32 -x 20 -v 0 -g 0 --threads 1 ";
    int rc = run_cmd(base + "--tp 4 -n 10 -o " + d + "/a", nullptr, nullptr);
    std::vector<float> ref = model_params(ckpt_path((d + "/a").c_str(), "model", 20));
    check(rc == 0 && !ref.empty() && ckpt_steps((d + "/a").c_str()) == std::vector<int>({10, 20}),
          "--tp 4 run saves steps 10 and 20 (exit %d)", rc);
    for (int P : {4, 2, 1}) {
        std::string dir = d + "/tp" + std::to_string(P);
        copy_step(d + "/a", dir, 10);
        std::string out;
        rc = run_cmd(base + "--tp " + std::to_string(P) + " -y 1 -o " + dir, &out, nullptr);
        std::vector<float> got = model_params(ckpt_path(dir.c_str(), "model", 20));
        bool resumed = out.find("resuming from") != std::string::npos && out.find("step   11/20") != std::string::npos &&
                       out.find("step   10/20") == std::string::npos;
        if (P == 4) {
            check(rc == 0 && resumed && got == ref, "saved at --tp 4, resumed at --tp 4 from step 10: the step-20 weights are bit-identical");
        } else {
            double e = got.size() == ref.size() ? rel_err(got.data(), ref.data(), (long)ref.size()) : 1.0;
            check_le(rc == 0 && resumed ? e : INFINITY, 1e-5, "saved at --tp 4, resumed at --tp %d from step 10: step-20 weights rel err", P);
        }
    }
    // --keep: only the newest K stay
    rc = run_cmd(base + "--tp 2 -n 2 --keep 2 -o " + d + "/keep", nullptr, nullptr);
    check(rc == 0 && ckpt_steps((d + "/keep").c_str()) == std::vector<int>({18, 20}), "--keep 2 leaves steps 18 and 20");
    // resuming with a model that disagrees, or with another batch shape, is refused
    std::string err;
    rc = run_cmd(base + "-e d2 -y 1 -o " + d + "/a -x 30", nullptr, &err);
    check(rc == 1 && err.find("disagrees with the checkpoint") != std::string::npos, "resume with another -e: %s", strtok(&err[0], "\n"));
    rc = run_cmd(base + "-b 2 -y 1 -o " + d + "/a -x 30", nullptr, &err);
    check(rc == 1 && err.find("same batch shape") != std::string::npos, "resume with another global batch (-b): %s", strtok(&err[0], "\n"));
    rc = run_cmd(base + "-o /proc/tp_cannot_write", nullptr, &err);
    check(rc == 1 && err.find("output directory") != std::string::npos, "unwritable -o: %s", strtok(&err[0], "\n"));
    // a non-finite loss stops training before anything is saved
    GPTConfig cfg = make_config(2, 4, 64, 256, 1024);
    std::vector<float> w = init_weights(&cfg, 3);
    w[w.size() - 2 * 64] = 3e38f;  // lnfw[0]: finite, so the file loads, but the forward overflows
    model_write((d + "/nan.bin").c_str(), &cfg, w.data());
    rc = run_cmd("-e " + d + "/nan.bin --corpus bytes -b 4 -t 32 -x 5 -n 1 -v 0 -g 0 --threads 1 --tp 2 -o " + d + "/nan", nullptr, &err);
    check(rc == 1 && err.find("step 1: the loss") != std::string::npos && ckpt_steps((d + "/nan").c_str()).empty(),
          "NaN loss: exit %d, no checkpoint written: %s", rc, strtok(&err[0], "\n"));
    std::string file = d + "/a/model_00000020.bin";
    rc = run_cmd(base + "-o " + file, nullptr, &err);
    check(rc == 1 && err.find("not a directory") != std::string::npos, "-o naming a file: %s", strtok(&err[0], "\n"));
}



static void test_interrupts() {
    printf("interrupts: SIGINT saves and exits 0; kill -9 mid-checkpoint leaves a loadable checkpoint\n");
    std::string d = tmpdir() + "/sig";
    mkdir(d.c_str(), 0755);
    // at --tp 1 and 2: the ranks agree to stop through a sum of their flags, which one rank alone must also obey
    pid_t pid;
    int status = 0;
    std::vector<int> steps;
    for (int P : {1, 2}) {
        std::string base = "-e L2C64H4 -b 4 -t 32 -v 0 -g 0 --threads 1 --tp " + std::to_string(P) + " ", run = d + "/run" + std::to_string(P);
        std::string path = d + "/out" + std::to_string(P) + ".txt";
        pid = spawn_tp(base + "-x 1000000 -o " + run, path);
        bool started = wait_for_text(path, "step    5/", 60);
        kill(pid, SIGINT);
        status = wait_exit(pid, 60);
        std::vector<char> o = slurp_bytes(path);
        std::string out(o.begin(), o.end());
        steps = ckpt_steps(run.c_str());
        check(started && WIFEXITED(status) && WEXITSTATUS(status) == 0 && out.find("interrupted after step") != std::string::npos &&
              steps.size() == 1, "SIGINT at --tp %d: exit status %d, message printed, %zu checkpoint saved (step %d)", P,
              WIFEXITED(status) ? WEXITSTATUS(status) : -1, steps.size(), steps.empty() ? -1 : steps[0]);
        if (!steps.empty()) {
            std::string out2;
            int rc = run_cmd(base + "-x " + std::to_string(steps[0] + 2) + " -y 1 -o " + run, &out2, nullptr);
            check(rc == 0 && out2.find("resuming from") != std::string::npos, "the interrupted run at --tp %d resumes (exit %d)", P, rc);
        }
    }
    // a second Ctrl-C quits at once, mid-step, without waiting for the step to end (steps of 0.2 s or more
    // here: 0.39 s; the second signal comes 20 ms after the first): the process ends by SIGINT itself. Under
    // TSan that model takes 13 s a step, so there a smaller one (L2 C128, B4 T128: 2 s a step) spares the
    // group half a minute of waiting for step 2
    {
        const char* model = under_tsan() ? "-e L2C128H4 -b 4 -t 128" : "-e L4C256H4 -b 8 -t 256";
        pid = spawn_tp(std::string(model) + " -v 0 -g 0 --threads 1 --tp 1 -x 1000000", d + "/twice.txt");
        bool running = wait_for_text(d + "/twice.txt", "step    2/", 120);
        kill(pid, SIGINT);
        usleep(20000);
        double t0 = comm_now();
        kill(pid, SIGINT);
        status = wait_exit(pid, 60);
        double took = comm_now() - t0;
        std::vector<char> t = slurp_bytes(d + "/twice.txt");
        std::string twice(t.begin(), t.end());
        check(running && WIFSIGNALED(status) && WTERMSIG(status) == SIGINT && took < 2.0 &&
              twice.find("Ctrl-C again quits at once") != std::string::npos && twice.find("interrupted after step") == std::string::npos,
              "a second SIGINT ends the run at once: %s %d after %.2f s, mid-step", WIFSIGNALED(status) ? "signal" : "exit status",
              WIFSIGNALED(status) ? WTERMSIG(status) : WIFEXITED(status) ? WEXITSTATUS(status) : -1, took);
    }
    // kill -9 at three moments while checkpoints are written every step: what is left always resumes
    std::string big = "-e L2C256H4 -b 1 -t 16 -v 0 -g 0 --threads 1 --tp 2 -n 1 --keep 2 ";
    for (int k = 0; k < 3; k++) {
        std::string dir = d + "/kill" + std::to_string(k);
        std::string out = d + "/kill" + std::to_string(k) + ".txt";
        pid = spawn_tp(big + "-x 1000000 -o " + dir, out);
        wait_for_text(out, "saved checkpoint", 60);
        usleep(50000 + 130000 * k);
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        steps = ckpt_steps(dir.c_str());
        int last = steps.empty() ? -1 : steps.back();
        std::string err;
        int rc = last < 0 ? -1 : run_cmd(big + "-x " + std::to_string(last + 1) + " -y 1 -o " + dir, nullptr, &err);
        check(rc == 0, "kill -9 #%d: the latest checkpoint (step %d) loads and training continues (exit %d)%s", k + 1, last, rc, err.c_str());
    }
}

// a child process runs ranks that disagree; the parent checks what it reports
static void expect_comm_abort(const char* what, const char* expect, std::function<void(Comm*)> body) {
    std::string errpath = tmpdir() + "/comm_err.txt";
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(errpath.c_str(), "w", stderr)) _exit(3);
        CommGroup* g = new CommGroup();
        comm_group_init(g, 2, 0.5);
        std::vector<std::thread> th;
        for (int r = 0; r < 2; r++)
            th.emplace_back([&, r]() {
                Comm c;
                comm_init(&c, g, r);
                body(&c);
            });
        for (auto& t : th) t.join();
        _exit(0);  // reaching here means nothing was reported
    }
    double t0 = comm_now();
    int status = wait_exit(pid, 60);
    std::vector<char> b = slurp_bytes(errpath);
    std::string err(b.begin(), b.end());
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 1 && err.find(expect) != std::string::npos;
    check(ok, "%s: exit %d after %.1f s, reported: %s", what, WIFEXITED(status) ? WEXITSTATUS(status) : -1, comm_now() - t0,
          err.substr(0, err.find('\n')).c_str());
}

static void test_hangs() {
    printf("hangs: a mismatched or missing collective is reported, not hung\n");
    expect_comm_abort("ranks at different places", "collective mismatch", [&](Comm* c) {
        float x[4] = {1, 2, 3, 4};
        comm_allreduce(c, x, 4, COMM_SUM, c->rank == 0 ? "attproj fwd" : "fcproj fwd", 0);
    });
    expect_comm_abort("ranks with different counts", "collective mismatch", [&](Comm* c) {
        float x[4] = {1, 2, 3, 4};
        comm_allreduce(c, x, c->rank == 0 ? 4 : 3, COMM_SUM, "attproj fwd", 0);
    });
    // the same place in another layer: the ranks are a layer apart, as when one of them skipped a layer's
    // collectives (the layer is part of what must match, not only the label and the count)
    expect_comm_abort("ranks at different layers", "collective mismatch", [&](Comm* c) {
        float x[4] = {1, 2, 3, 4};
        comm_allreduce(c, x, 4, COMM_SUM, "attproj fwd", c->rank == 0 ? 2 : 3);
    });
    expect_comm_abort("a sum against a max", "collective mismatch", [&](Comm* c) {
        float x[4] = {1, 2, 3, 4};
        comm_allreduce(c, x, 4, c->rank == 0 ? COMM_SUM : COMM_MAX, "loss max", -1);
    });
    expect_comm_abort("rank 1 skips a collective", "waited", [&](Comm* c) {
        float x[4] = {1, 2, 3, 4};
        if (c->rank == 0) comm_allreduce(c, x, 4, COMM_SUM, "qkv bwd", 3);
    });
}


static void test_prepare() {
    printf("data/prepare.py: a local text file to llm.c token files\n");
    std::string d = tmpdir() + "/prep";
    mkdir(d.c_str(), 0755);
    std::string text;
    grammar_generate(3, 5000, &text, nullptr);
    FILE* f = fopen((d + "/story.txt").c_str(), "wb");
    fwrite(text.data(), 1, text.size(), f);
    fclose(f);
    std::string cmd = "python3 data/prepare.py " + d + "/story.txt " + d + " --val-frac 0.2 >/dev/null";
    int rc = system(cmd.c_str());
    std::vector<char> tr = slurp_bytes(d + "/story_train.bin"), va = slurp_bytes(d + "/story_val.bin");
    bool ok = rc == 0 && tr.size() > 1024 && va.size() > 1024;
    if (ok) {
        const int* ht = (const int*)tr.data();
        const int* hv = (const int*)va.data();
        long nt = ht[2], nv = hv[2];
        ok = ht[0] == 20240520 && ht[1] == 1 && nt + nv == (long)text.size() && (long)tr.size() == 1024 + 2 * nt &&
             fabs(nv - 0.2 * text.size()) <= 1.0;  // --val-frac 0.2 of the bytes
        for (long i = 0; ok && i < nt; i++) ok = ((const uint16_t*)(tr.data() + 1024))[i] == (unsigned char)text[i];
        for (long i = 0; ok && i < nv; i++) ok = ((const uint16_t*)(va.data() + 1024))[i] == (unsigned char)text[nt + i];
    }
    check(ok, "%zu bytes of text -> train + val token files holding exactly those bytes, in order, the val file the last 20%% of them",
          text.size());
    std::string out;
    rc = run_cmd("-i " + d + "/story_train.bin -j " + d + "/story_val.bin -e L1C32H2 -b 2 -t 32 -x 3 -v 2 -m 1 -g 0 --threads 1", &out, nullptr);
    check(rc == 0 && out.find("step    3/3") != std::string::npos, "./tp trains on them (exit %d)", rc);
}

// ----------------------------------------------------------------------------
// logs: log.csv, sweep.csv, the plots

static std::vector<std::vector<std::string>> read_csv(const std::string& path) {
    std::vector<char> b = slurp_bytes(path);
    std::string text(b.begin(), b.end());
    std::vector<std::vector<std::string>> rows;
    size_t pos = 0;
    while (pos < text.size()) {
        size_t nl = text.find('\n', pos);
        std::string line = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
        pos = nl == std::string::npos ? text.size() : nl + 1;
        std::vector<std::string> cells;
        size_t c = 0;
        while (true) {
            size_t comma = line.find(',', c);
            cells.push_back(line.substr(c, comma == std::string::npos ? std::string::npos : comma - c));
            if (comma == std::string::npos) break;
            c = comma + 1;
        }
        rows.push_back(cells);
    }
    return rows;
}

static void test_logs() {
    printf("logs: log.csv one row per step, bytes as counted by the formula, sweep.csv, plots\n");
    std::string d = tmpdir() + "/logs";
    GPTConfig cfg = make_config(2, 4, 64, (int)grammar_vocab().size(), 1024);  // -e L2C64H4 on the embedded corpus's words
    int B = 4, T = 32;
    struct { int P, sp; } runs[] = {{2, 0}, {4, 0}, {2, 1}};
    for (auto& k : runs) {
        std::string dir = d + std::to_string(k.P) + (k.sp ? "sp" : "");
        std::string out;
        int rc = run_cmd("-e L2C64H4 -b 4 -t 32 -x 7 -v 3 -g 0 -l 1e-3 -u 3 -q 0.1 --threads 1 --tp " + std::to_string(k.P) +
                         " --sp " + std::to_string(k.sp) + " -o " + dir, &out, nullptr);
        auto rows = read_csv(dir + "/log.csv");
        std::vector<std::string> header = {"step", "loss", "val_loss", "lr", "ms", "tok_per_s", "comm_ms", "comm_bytes",
                                           "allreduce_bytes", "reducescatter_bytes", "allgather_bytes", "dp_ms", "dp_bytes", "pp_ms",
                                           "pp_bytes"};
        bool ok = rc == 0 && rows.size() == 8 && rows[0] == header;
        // the bytes a ring sends for the formula's floats, by kind
        double f[COMM_KINDS], e[COMM_KINDS], total = 0, worst = 0, lr_off = 0;
        step_comm_floats(&cfg, B, T, k.sp, 1, false, f);
        for (int q = 0; q < COMM_KINDS; q++) total += e[q] = comm_ring_bytes(q, f[q], k.P);
        for (size_t i = 1; ok && i < rows.size(); i++) {
            ok = rows[i].size() == header.size() && atoi(rows[i][0].c_str()) == (int)i && atof(rows[i][6].c_str()) >= 0 &&
                 atof(rows[i][12].c_str()) == 0 && atof(rows[i][14].c_str()) == 0;  // one replica, one stage: no DP or PP bytes
            bool has_val = (i - 1) % 3 == 0 || i == 7;  // before steps 0, 3, 6 (0-based) = rows 1, 4, 7
            ok = ok && rows[i][2].empty() != has_val;
            if (!ok) break;
            // the learning rate of step i-1 (0-based), llm.c's schedule: (s+1)/3 of the peak over the 3 warmup
            // steps, then a cosine from the peak down to 0.1 of it over the 4 steps left
            int s0 = (int)i - 1;
            double lr = s0 < 3 ? 1e-3 * (s0 + 1) / 3 : 1e-4 + 0.5 * (1 + cos(M_PI * (s0 - 3) / 4.0)) * (1e-3 - 1e-4);
            lr_off = worse(lr_off, fabs(atof(rows[i][3].c_str()) - lr) / lr);
            worst = worse(worst, fabs(atof(rows[i][7].c_str()) - total));
            worst = worse(worst, fabs(atof(rows[i][8].c_str()) - e[KIND_ALLREDUCE]));
            worst = worse(worst, fabs(atof(rows[i][9].c_str()) - e[KIND_REDUCESCATTER]));
            worst = worse(worst, fabs(atof(rows[i][10].c_str()) - e[KIND_ALLGATHER]));
        }
        check_le(ok ? worst : INFINITY, 0.5, "--tp %d --sp %d: log.csv has the 15 documented columns and 7 rows; bytes sent per "
                 "step (%.0f) against the formula, by kind, and 0 over DP: largest difference", k.P, k.sp, total);
        check_le(ok ? lr_off : INFINITY, 1e-6, "--tp %d --sp %d: log.csv's lr column against llm.c's warmup and cosine schedule "
                 "(-l 1e-3 -u 3 -q 0.1 -x 7): largest relative difference", k.P, k.sp);
        if (k.sp) {  // the step line's bytes by kind, in MB to 2 places, are log.csv's columns
            float ar = -1, rs = -1, ag = -1;
            size_t at = out.find("MB (AR ");
            if (at != std::string::npos) sscanf(out.c_str() + at, "MB (AR %f, RS %f, AG %f)", &ar, &rs, &ag);
            double off = ok ? std::max({fabs(ar - atof(rows[1][8].c_str()) / 1e6), fabs(rs - atof(rows[1][9].c_str()) / 1e6),
                                        fabs(ag - atof(rows[1][10].c_str()) / 1e6)})
                            : INFINITY;
            check_le(off, 0.005, "--tp %d --sp 1: the step line's MB by kind (AR %.2f, RS %.2f, AG %.2f) against log.csv's "
                     "all-reduce, reduce-scatter and all-gather bytes: largest difference", k.P, ar, rs, ag);
        }
    }
    // The startup line "communication per step: ..." states each collective's floats by a formula and what a
    // rank sends: its numbers against the formulas written out here, and its MB against what the step lines
    // measured. Its three forms: all-reduce only (TP), SP in fp32, SP in bf16 (the gathers' bf16 values move
    // two to a 4-byte word); and with -d (A micro-steps), whose per-micro-step terms it counts A times.
    {
        long L = 2, C = 64, BTC = (long)B * T * C;
        struct { const char* args; int sp, bf16, A; } lines[] = {
            {"--tp 2 --dtype fp32", 0, 0, 1}, {"--tp 2 --sp 1 --dtype fp32", 1, 0, 1},
            {"--tp 2 --sp 1 --dtype bf16", 1, 1, 1}, {"--tp 2 --sp 1 --dtype bf16 -d 256", 1, 1, 2}, {"--tp 2 --dtype fp32 -d 256", 0, 0, 2}};
        for (auto& k : lines) {
            std::string out;
            int rc = run_cmd("-e L2C64H4 -b 4 -t 32 -x 2 -v 0 -g 0 --threads 1 " + std::string(k.args), &out, nullptr);
            std::vector<double> want;  // the line's numbers in its order
            // each micro-step all-reduces its 3*B*T loss terms (and without SP its partial sums); once a step the
            // norm (1) and, with SP, the replicated tensors' gradients (wpe's T*C, the layernorms', the biases')
            double ar = k.A * 3.0 * B * T + 1 + (k.sp ? T * C + 4 * L * C + 2 * C : 0);
            if (!k.sp) want = {k.A * (4 * L + 2.0) * BTC + ar};
            else if (!k.bf16) want = {k.A * (4 * L + 2.0) * BTC, k.A * (6 * L + 2.0) * BTC, ar};
            else want = {k.A * (4 * L + 2.0) * BTC, k.A * ((6 * L + 1) * BTC / 2.0 + BTC), ar};
            size_t at = out.find("communication per step");
            std::string para = at == std::string::npos ? "" : out.substr(at, out.find("\ndata: ", at) - at);
            std::vector<double> got;
            for (size_t e = para.find("= "); e != std::string::npos; e = para.find("= ", e + 2))
                if (e < 2 || para.compare(e - 2, 2, "A ") != 0) got.push_back(atof(para.c_str() + e + 2));  // not "(A = 2 micro-steps)"
            float said = -1, step1 = -2, step2 = -3;
            size_t s = para.find("sends ");
            if (s != std::string::npos) said = strtof(para.c_str() + s + 6, nullptr);
            std::vector<float> mb = grep_floats(out, " ms, ");  // "comm 1.1 ms, 5.26 MB" on each step line
            if (mb.size() == 2) step1 = mb[0], step2 = mb[1];
            bool a_said = (k.A > 1) == (para.find("(A = 2 micro-steps)") != std::string::npos);
            check(rc == 0 && got == want && said == step1 && said == step2 && a_said,
                  "%s: the line's %zu floats are the formulas' (%.0f ...), its %.2f MB a rank sends what the steps measured (%.2f, %.2f)",
                  k.args, got.size(), got.empty() ? 0.0 : got[0], said, step1, step2);
        }
    }
    // The DP group's startup line: the MB a rank sends over its replicas, as a ring of D sends them, against
    // what the step lines measured ("| dp 0.4 ms, 0.07 MB"), with D replicas of P ranks where P != D
    for (const char* args : {"--tp 1 --dp 2 -b 2", "--tp 1 --dp 2 -b 2 -z 1", "--tp 1 --dp 2 -b 2 -z 1 --dtype bf16", "--tp 2 --dp 1 -b 4"}) {
        std::string out;
        int rc = run_cmd(std::string("-e L2C64H4 -t 32 -x 2 -v 0 -g 0 --threads 1 ") + args, &out, nullptr);
        size_t at = out.find("communication over each DP group"), s = at == std::string::npos ? at : out.find("sends ", at);
        float said = s == std::string::npos ? 0 : strtof(out.c_str() + s + 6, nullptr);
        std::vector<float> dp;  // each step line's "dp X ms, Y MB": Y
        for (size_t e = out.find("| dp "); e != std::string::npos; e = out.find("| dp ", e + 1)) {
            float ms, mb;
            if (sscanf(out.c_str() + e, "| dp %f ms, %f MB", &ms, &mb) == 2) dp.push_back(mb);
        }
        bool one_replica = strstr(args, "--dp 1") != nullptr;  // no DP group: no line, no dp on the steps
        bool ok = one_replica ? at == std::string::npos && dp.empty() : dp.size() == 2 && said > 0 && said == dp[0] && said == dp[1];
        check(rc == 0 && ok, "%s: the DP line says a rank sends %.2f MB a step, the step lines measured %s", args, said,
              dp.size() == 2 ? format("%.2f and %.2f", dp[0], dp[1]).c_str() : format("%zu dp fields", dp.size()).c_str());
    }
    std::string out;
    int rc = run_cmd("-e L2C64H4 -b 4 -t 32 --sweep 1 --sweep-steps 3 --threads 1 -o " + d + "sweep", &out, nullptr);
    auto rows = read_csv(d + "sweep/sweep.csv");
    // every valid P alone, and every (P, D) with D >= 2 and P x D up to the cores
    int cores = (int)std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::pair<int, int>> want = {{1, 1}, {2, 1}, {4, 1}};
    for (int D = 2; D <= cores; D++)
        for (int P : {1, 2, 4})
            if (P * D <= cores) want.push_back({P, D});
    std::vector<std::pair<int, int>> got, got_pp;
    double bytes_off = 0;  // the TP, DP and PP megabytes sent per step against the formulas
    int rate_off = 0;      // rows whose tok/s is not B x T x D tokens over their ms per step (printed to 0.001 and 0.1)
    for (size_t i = 1; i < rows.size(); i++) {
        if (rows[i].size() < 19) break;  // (16 since sweep.csv ends with predicted_ms_per_step, 19 since S, pp_wait_share, pp_mb_per_step)
        int P = atoi(rows[i][0].c_str()), D = atoi(rows[i][1].c_str()), S = atoi(rows[i][16].c_str());
        rate_off += !printed_rate_agrees(atof(rows[i][4].c_str()), (double)B * T * D, atof(rows[i][3].c_str()), 0.001, 0.1);
        if (S > 1) {  // a pipeline: (P, D) with S stages; its bytes to the next stage: 1 micro-batch of B x T x C floats forward
            got_pp.push_back({P * D, S});
            bytes_off = worse(bytes_off, fabs(atof(rows[i][18].c_str()) - 4.0 * B * T * cfg.C / 1e6));
            continue;
        }
        got.push_back({P, D});
        double f[COMM_KINDS], sent[COMM_KINDS];
        step_comm_floats(&cfg, B, T, false, 1, false, f);
        bytes_off = worse(bytes_off, fabs(atof(rows[i][9].c_str()) - ring_bytes(f, P, sent) / 1e6));
        int kind_col[3][2] = {{12, KIND_ALLREDUCE}, {13, KIND_REDUCESCATTER}, {14, KIND_ALLGATHER}};  // the TP bytes by kind
        for (auto& kc : kind_col) bytes_off = worse(bytes_off, fabs(atof(rows[i][kc[0]].c_str()) - sent[kc[1]] / 1e6));
        dp_step_floats(&cfg, P, D, 0, false, f);
        bytes_off = worse(bytes_off, fabs(atof(rows[i][10].c_str()) - ring_bytes(f, D, sent) / 1e6));
    }
    check(rc == 0 && got == want && out.find("speedup") != std::string::npos,
          "--sweep 1: a table and sweep.csv with a row for each valid P and each (P, D) with P x D <= %d cores (%zu rows of %zu)", cores,
          got.size(), want.size());
    check(cores < 2 || (!got_pp.empty() && got_pp[0] == std::make_pair(1, 2)),
          "--sweep 1: then the pipelines, first (P 1, D 1, S 2) (%zu pipeline rows)", got_pp.size());
    check_le(got.empty() ? INFINITY : bytes_off, 1e-4, "--sweep 1: TP (in all and by kind) and DP MB sent per step against the formulas, "
             "largest difference");
    check(!got.empty() && rate_off == 0, "--sweep 1: each row's tok/s is -b x -t x its replicas over its ms per step: %d of %zu rows disagree",
          rate_off, got.size() + got_pp.size());
    // with --sp 1 a P that does not divide B*T gets a row saying so, and the sweep goes on to the grids after it
    {
        std::string o;
        int r = run_cmd("-e L1C16H2 -b 3 -t 5 --sp 1 --tp 1 --sweep 1 --sweep-steps 3 --threads 1", &o, nullptr);
        bool said = o.find("   2    1    1  skipped: --sp 1 needs P to divide B*T = 15") != std::string::npos;
        bool after = said && o.find("\n   1    2    1 ", o.find("skipped: --sp 1")) != std::string::npos;
        check(r == 0 && said && (after || cores < 2), "--sweep 1 --sp 1 with B*T = 15: P = 2 skipped in its row, (P 1, D 2) measured after it (exit %d): %s",
              r, first_line_with(o, "skipped").c_str());
    }
    if (system("python3 -c 'import matplotlib' 2>/dev/null") != 0) {
        printf("  skip plot: matplotlib is not installed (pip install matplotlib); CI installs it\n");
        return;
    }
    if (system(("cp " + d + "sweep/sweep.csv " + d + "2/ && python3 data/plot.py " + d + "2 --floor 0.65 >/dev/null").c_str()) != 0) {}
    std::vector<char> a = slurp_bytes(d + "2/loss.png"), b = slurp_bytes(d + "2/sweep.png");
    bool png = a.size() > 1000 && b.size() > 1000 && !memcmp(a.data(), "\x89PNG", 4) && !memcmp(b.data(), "\x89PNG", 4);
    check(png, "data/plot.py draws loss.png (%zu bytes) and sweep.png (%zu bytes)", a.size(), b.size());
}

// ----------------------------------------------------------------------------
// a new user's paths: own text, memory, the run directory, sampling, flags, the build




static void test_own_data() {
    printf("own data: the vocab follows the data, every token checked before the first step, the data line, tokenizer errors, --bpe\n");
    std::string d = tmpdir() + "/own";
    mkdir(d.c_str(), 0755);
    write_text(d + "/story.txt", 40000, 11);
    std::string out, err;
    int rc = run_sh("python3 data/prepare.py " + d + "/story.txt " + d + "/data --tokenizer " + d + "/bytes_tok.bin", &out);
    // the command prepare.py prints, run as printed (with a tiny model and a few steps added)
    std::string cmd = first_line_with(out, ("-i " + d).c_str());
    size_t at = cmd.find(" -i ");
    bool printed = rc == 0 && at != std::string::npos && cmd.find("-j " + d + "/data/story_val.bin") != std::string::npos;
    check(printed, "prepare.py ends with the tp command: %s", cmd.c_str());
    std::string small = " -e L1C32H2 -b 2 -t 32 -x 2 -v 1 -m 2 -g 0 --threads 1";
    rc = printed ? run_cmd(cmd.substr(at) + small, &out, &err) : -1;
    check(rc == 0 && out.find("vocab 256 (padded 256; byte-level data: every token id is below 256)") != std::string::npos,
          "own byte-level text trains at vocab 256 without --vocab (exit %d): %s", rc, first_line_with(out, "vocab").c_str());
    // GPT-2 ids: vocab 50257, and the line says why
    std::vector<int> ids = random_tokens(3000, 1000, 4);
    ids[17] = 50000;
    write_tokens(d + "/gpt2.bin", ids);
    rc = run_cmd("-i " + d + "/gpt2.bin -j " + d + "/gpt2.bin -e L1C16H2 -b 2 -t 16 -x 1 -v 0 -g 0 --threads 1", &out, &err);
    check(rc == 0 && out.find("vocab 50257 (padded 50304; GPT-2's: the data's largest token id is 50000)") != std::string::npos,
          "GPT-2 token ids: vocab 50257, said so (exit %d): %s", rc, first_line_with(out, "vocab").c_str());
    // a bad id in the last token of a shard stops the run before its first step, within seconds
    std::vector<int> tail = random_tokens(5000, 256, 5);
    tail.back() = 300;
    write_tokens(d + "/tail.bin", tail);
    double t0 = comm_now();
    rc = run_cmd("-i " + d + "/tail.bin -j " + d + "/data/story_val.bin --vocab 256 -e L1C16H2 -b 2 -t 16 -x 5 -v 0 -g 0 --threads 1", &out, &err);
    double sec = comm_now() - t0;
    check(rc == 1 && out.find("step") == std::string::npos && err.find("token id 300 at token 4999") != std::string::npos &&
          err.find("give --vocab 301 or more") != std::string::npos && sec < 10,
          "a bad id in the last token of a shard: exit %d after %.1f s, no step taken: %s", rc, sec, err.substr(0, err.find('\n')).c_str());
    // the data line: what a glob matched, tokens and samples; a warning when train and val share a file
    std::vector<long> sizes = {3001, 2049, 4097};
    long tokens = 0, samples = 0;
    for (size_t i = 0; i < sizes.size(); i++) {
        write_tokens(d + "/shard_" + std::to_string(i) + ".bin", random_tokens(sizes[i], 256, 10 + i));
        tokens += sizes[i];
        samples += (sizes[i] - 1) / (4 * 32);
    }
    rc = run_cmd("-i '" + d + "/shard_*.bin' -j " + d + "/shard_1.bin -e L1C16H2 -b 4 -t 32 -x 1 -v 0 -g 0 --threads 1", &out, &err);
    char expect[256];
    snprintf(expect, sizeof(expect), "data: train '%s/shard_*.bin' matched 3 files: %ld tokens, %ld samples of 4 x 32 per epoch", d.c_str(), tokens, samples);
    check(rc == 0 && out.find(expect) != std::string::npos && out.find(d + "/shard_2.bin: 4097 tokens") != std::string::npos &&
          out.find("data: val   " + d + "/shard_1.bin: 2049 tokens, 16 samples") != std::string::npos,
          "the data line lists the 3 files a glob matched, %ld tokens, %ld samples per epoch", tokens, samples);
    check(out.find("warning: train and val share " + d + "/shard_1.bin") != std::string::npos, "train and val sharing a file: %s",
          first_line_with(out, "warning").c_str());
    // a glob of 11 shards: the first 6 listed, then one line for the 5 others (a glob of 8 lists all 8)
    for (int n : {11, 8}) {
        std::string dir = d + "/many" + std::to_string(n);
        mkdir(dir.c_str(), 0755);
        for (int i = 0; i < n; i++) write_tokens(dir + "/s_" + std::to_string(10 + i) + ".bin", random_tokens(600 + i, 256, 30 + i));
        rc = run_cmd("-i '" + dir + "/s_*.bin' -j " + d + "/shard_1.bin -e L1C16H2 -b 4 -t 32 -x 1 -v 0 -g 0 --threads 1", &out, &err);
        int listed = 0;
        for (int i = 0; i < n; i++)
            listed += out.find(dir + "/s_" + std::to_string(10 + i) + ".bin: " + std::to_string(600 + i) + " tokens") != std::string::npos;
        bool more = out.find("... and 5 more\n") != std::string::npos, none = out.find("... and") == std::string::npos;
        check(rc == 0 && out.find("matched " + std::to_string(n) + " files") != std::string::npos &&
              (n == 11 ? listed == 6 && more : listed == 8 && none),
              "a glob of %d shards: %d listed by name and tokens%s (exit %d)", n, listed, more ? ", then '... and 5 more'" : "", rc);
    }
    // tokenizer and prompt: a byte tokenizer with a vocab-256 model and a prompt works; with a GPT-2-sized
    // model the error points at --vocab 256; a GPT-2-vocab model refuses a byte prompt and says why
    std::string tiny = " -e L1C16H2 -b 2 -t 16 -x 1 -v 0 -g 20 --threads 1 -i " + d + "/data/story_train.bin -j " + d + "/data/story_val.bin";
    rc = run_cmd("--vocab 256 --tokenizer " + d + "/bytes_tok.bin --prompt The" + tiny, &out, &err);
    check(rc == 0 && out.find("---\nThe") != std::string::npos, "--vocab 256 --tokenizer bytes.bin --prompt The: exit %d, the sample starts with the prompt%s",
          rc, err.c_str());
    rc = run_cmd("--vocab 50257 --tokenizer " + d + "/bytes_tok.bin" + tiny, &out, &err);
    check(rc == 1 && err.find("is byte-level (256 tokens) but the model has vocab 50257") != std::string::npos &&
          err.find("--vocab 256") != std::string::npos, "a byte tokenizer with a 50257 model: %s", err.substr(0, err.find('\n')).c_str());
    rc = run_cmd("--prompt The -e L1C16H2 -b 2 -t 16 -x 1 -v 0 -g 5 --threads 1 -i " + d + "/gpt2.bin -j " + d + "/gpt2.bin", &out, &err);
    check(rc == 1 && err.find("needs a byte-level model (vocab 256); this model has vocab 50257") != std::string::npos,
          "a byte prompt with a 50257 model: %s", err.substr(0, err.find('\n')).c_str());
    // --bpe when tiktoken cannot fetch its encoding: one line that says how to run it once online; the
    // Tiny Shakespeare script keeps its byte files and succeeds
    std::string fake = d + "/fake_tiktoken/tiktoken";
    run_sh("mkdir -p " + fake, nullptr);
    FILE* f = fopen((fake + "/__init__.py").c_str(), "w");
    fprintf(f, "def get_encoding(name):\n    raise ConnectionError('no network')\n");
    fclose(f);
    std::string env = "PYTHONPATH=" + d + "/fake_tiktoken ";
    rc = run_sh(env + "python3 data/prepare.py " + d + "/story.txt " + d + "/bpe --bpe", &out);
    check(rc == 1 && out.find("TIKTOKEN_CACHE_DIR") != std::string::npos && out.find("once") != std::string::npos &&
          std::count(out.begin(), out.end(), '\n') == 1, "prepare.py --bpe offline: exit %d, one line naming the fix: %.90s...", rc, out.c_str());
    run_sh("mkdir -p " + d + "/ts/data/tinyshakespeare && cp data/prepare.py data/tinyshakespeare.sh " + d + "/ts/data/ && cp " + d +
           "/story.txt " + d + "/ts/data/tinyshakespeare/input.txt", nullptr);
    rc = run_sh(env + "bash " + d + "/ts/data/tinyshakespeare.sh", &out);
    struct stat st;
    bool kept = stat((d + "/ts/data/tinyshakespeare/tiny_shakespeare_train.bin").c_str(), &st) == 0 && st.st_size > 1024;
    check(rc == 0 && kept && out.find("note: no GPT-2 BPE version") != std::string::npos,
          "tinyshakespeare.sh without the BPE encoding: exit %d, byte files kept, %s", rc, first_line_with(out, "note:").c_str());
}

// The memory table's formula line ("activations per layer (...): N*(aC + 4) + B*T*bC/P [+ attention's]
// floats, N = ... tokens per rank: X MB x L layers"), evaluated at the run's sizes, gives the X MB it prints
// (which comes from the allocation's own count), in either dtype, at every -r, both attentions, with and
// without --sp: the coefficients a reader is shown are the ones the run uses.
static void memory_formula_lines() {
    const int B = 8, T = 128, C = 128, NH = 4, P = 2;
    int lines = 0, wrong = 0;
    std::string first_wrong;
    for (const char* dtype : {"fp32", "bf16"})
        for (const char* att : {"fused", "matmul"})
            for (int r : {0, 1, 2, 3})
                for (int sp : {0, 1}) {
                    if (r == 3 && strcmp(att, "fused") == 0) continue;  // (-r 3 is the matmul attention's)
                    std::string args = format("-e L1C128H4 -b %d -t %d -x 1 -v 0 -g 0 --threads 1 --tp %d --dtype %s --attention %s -r %d --sp %d",
                                               B, T, P, dtype, att, r, sp), out, err;
                    run_cmd(args, &out, &err);
                    size_t at = out.find("activations per layer (");
                    double a = 0, b = 0, mb = 0;
                    size_t p1 = out.find("N*(", at), p2 = out.find("B*T*", at), p3 = out.find("tokens per rank: ", at);
                    bool parsed = at != std::string::npos && p1 != std::string::npos && p2 != std::string::npos && p3 != std::string::npos &&
                                  sscanf(out.c_str() + p1, "N*(%lfC", &a) == 1 && sscanf(out.c_str() + p2, "B*T*%lfC/P", &b) == 1 &&
                                  sscanf(out.c_str() + p3, "tokens per rank: %lf MB", &mb) == 1;
                    std::string line = parsed ? out.substr(at, out.find('\n', at) - at) : "(no formula line)";
                    double N = line.find("N = B*T/P") != std::string::npos ? B * T / P : B * T;
                    double att_floats = line.find("+ B*NH*T*T/P") != std::string::npos ? (double)B * NH * T * T / P
                                        : line.find("+ B*NH*T/P") != std::string::npos ? (double)B * NH * T / P : 0;
                    double want = 4.0 * (N * (a * C + 4) + (double)B * T * b * C / P + att_floats) / 1e6;
                    lines++;
                    if (!parsed || fabs(want - mb) > 0.0051) {
                        if (!wrong++) first_wrong = format("--dtype %s --attention %s -r %d --sp %d: %.2f MB from the formula, %s", dtype,
                                                            att, r, sp, want, line.c_str());
                    }
                }
    check(wrong == 0, "the memory table's per-layer formula gives the MB it prints: %d of %d runs differ%s%s", wrong, lines,
          wrong ? "; first: " : "", first_wrong.c_str());
}

static void test_memory() {
    printf("memory: a run that cannot fit is refused at once with the numbers; the estimate tracks what a run uses\n");
    std::string out, err;
    for (const char* args : {"-b 65536 -x 1", "-e d48 -b 64 -t 1024 -x 1"}) {
        double t0 = comm_now();
        int rc = run_cmd(args, &out, &err);
        double sec = comm_now() - t0;
        bool line = err.rfind("error: this run needs about ", 0) == 0 && err.find("GB is free") != std::string::npos &&
                    err.find("lower -b or -t") != std::string::npos && std::count(err.begin(), err.end(), '\n') == 1;
        check_le(rc == 1 && line ? sec : INFINITY, 5.0, "./tp %s: refused with one line (%.60s...), seconds", args, err.c_str());
    }
    // the table's columns: the run's settings, TP alone (no SP, -r or ZeRO-1) and TP=1, each shown once
    struct Columns { const char* args; std::vector<std::string> want; };
    const Columns columns[] = {{"--tp 2", {"TP=2", "TP=1"}}, {"--tp 2 --sp 1 -r 1", {"TP=2 SP -r 1", "TP=2", "TP=1"}},
                               {"--tp 2 --dp 2 -z 1", {"TP=2 ZeRO-1", "TP=2", "TP=1"}}, {"--tp 1 --dp 2 -z 1", {"TP=1 ZeRO-1", "TP=1"}},
                               {"--tp 1 --dp 2", {"TP=1"}}};
    for (const Columns& c : columns) {
        int rc = run_cmd(std::string("-e L1C32H2 -b 2 -t 32 -x 1 -v 0 -g 0 --threads 1 ") + c.args, &out, &err);
        std::string head = first_line_with(out, "memory per rank (MB)");
        std::vector<std::string> got;  // names right-aligned in 12 characters, two spaces at least between them
        for (size_t at = head.find("(MB)") == std::string::npos ? head.size() : head.find("(MB)") + 4; at < head.size();) {
            size_t from = head.find_first_not_of(' ', at), to = from == std::string::npos ? from : head.find("  ", from);
            if (from == std::string::npos) break;
            got.push_back(head.substr(from, to == std::string::npos ? to : to - from));
            at = to == std::string::npos ? head.size() : to;
        }
        check(rc == 0 && got == c.want, "%s: the memory table's columns: %s", c.args, head.c_str());
    }
    if (getenv("TP_BIN")) {  // the sanitizers' shadow memory is not what the estimate is about
        printf("  skip the estimate against a measured run: a sanitizer build\n");
        g_skipped++;
        return;
    }
    // the estimate against the peak resident memory of the same run
    std::string d = tmpdir() + "/mem";
    mkdir(d.c_str(), 0755);
    write_tokens(d + "/tok.bin", random_tokens(40000, 256, 6));
    std::string args = "-i " + d + "/tok.bin -j " + d + "/tok.bin -b 32 -t 256 -x 2 -v 0 -g 0 --threads 1 --tp 2";
    std::vector<std::string> words = {"tp"};
    std::istringstream is(args);
    for (std::string w; is >> w;) words.push_back(w);
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(&w[0]);
    Run* run = new Run();
    parse_args((int)argv.size(), argv.data(), &run->args);
    run_setup(run);
    double need = memory_estimate(run, run->P, run->D).cpu;
    pid_t pid = spawn_tp(args, d + "/out.txt");
    int status = 0;
    struct rusage ru;
    wait4(pid, &status, 0, &ru);
    double rss = ru.ru_maxrss * 1024.0;
    check(WIFEXITED(status) && WEXITSTATUS(status) == 0 && rss <= need, "L3C128H4 B32 T256 at 2 ranks: peak %.0f MB, estimate %.0f MB, not below it",
          rss / 1e6, need / 1e6);
    check_le(need / rss, 1.25, "the estimate over the measured peak");
    memory_formula_lines();
}


static void test_run_dir() {
    printf("the run directory: -y 1 alone continues the run, a used -o is refused, log.csv survives kill -9, -o a/b/c\n");
    std::string d = tmpdir() + "/rundir";
    mkdir(d.c_str(), 0755);
    write_tokens(d + "/train.bin", random_tokens(20000, 256, 7));
    write_tokens(d + "/val.bin", random_tokens(4000, 256, 8));
    // a run with flags that are not the defaults, through to step 12; and the same run stopped at step 6
    // and continued with nothing but -y 1 -o, from another folder (the data's path was relative). The
    // optimizer's flags are among them (--clip 0.5 clips every step of this model: its norms are about 1 to 1.7),
    // so a saved flag the resume dropped would continue another run.
    std::string flags = "-i train.bin -j val.bin -e L2C64H4 -b 4 -t 32 -x 12 -n 6 -l 2e-3 -u 2 -q 0.1 -c 0.01 -v 6 -m 3 -g 0 --seed 7 --tp 2 --threads 1"
                        " --clip 0.5 --beta1 0.85 --beta2 0.99";
    char cwd[4096];
    std::string tp = tp_bin()[0] == '/' ? tp_bin() : std::string(getcwd(cwd, sizeof(cwd))) + "/" + tp_bin();
    int rc = run_sh("cd " + d + " && " + tp + " " + flags + " -o a", nullptr);
    copy_step(d + "/a", d + "/b", 6);
    std::string out, err;
    int rc2 = run_cmd("-y 1 -o " + d + "/b --threads 1", &out, &err);
    std::vector<float> ref = model_params(ckpt_path((d + "/a").c_str(), "model", 12)), got = model_params(ckpt_path((d + "/b").c_str(), "model", 12));
    check(rc == 0 && rc2 == 0 && !ref.empty() && got == ref && out.find("step   12/12") != std::string::npos,
          "-y 1 -o DIR alone continues a run from step 6 to its -x 12, bit-identical to the run that was not stopped (exit %d, %d)%s", rc, rc2, err.c_str());
    check(out.find(" (steps 8..12)\n") != std::string::npos, "its average line is over the steps it timed, 8..12 (its first, 7, is not): %s",
          first_line_with(out, "average ").c_str());
    // a checkpoint is a pair: a state file whose model file is gone is not one, so -y 1 goes on from the last
    // whole pair (step 6 of 6 and 12) and ends where the unstopped run did
    {
        copy_step(d + "/a", d + "/half", 6);
        copy_step(d + "/a", d + "/half", 12);
        remove(ckpt_path((d + "/half").c_str(), "model", 12).c_str());
        rc = run_cmd("-y 1 -o " + d + "/half --threads 1", &out, &err);
        got = model_params(ckpt_path((d + "/half").c_str(), "model", 12));
        check(rc == 0 && out.find("resuming from " + d + "/half/model_00000006.bin at step 6") != std::string::npos && got == ref,
              "a state file without its model file (step 12) is passed over: -y 1 resumes from step 6 and rewrites step 12 "
              "bit-identical (exit %d)%s", rc, err.c_str());
    }
    // the embedded corpus, too
    std::string emb = "-e L1C32H2 -b 2 -t 32 -x 8 -n 4 -v 4 -m 2 -g 0 --tp 2 --threads 1 -o ";
    rc = run_cmd(emb + d + "/c", nullptr, nullptr);
    copy_step(d + "/c", d + "/e", 4);
    rc2 = run_cmd("-y 1 -o " + d + "/e --threads 1", &out, &err);
    ref = model_params(ckpt_path((d + "/c").c_str(), "model", 8));
    got = model_params(ckpt_path((d + "/e").c_str(), "model", 8));
    check(rc == 0 && rc2 == 0 && !ref.empty() && got == ref, "the embedded corpus: -y 1 alone continues bit-identically (exit %d, %d)%s", rc, rc2, err.c_str());
    // which flags a state file saves, against the list of what makes a run what it is (its data, sizes,
    // schedule, optimizer, sampling, checkpointing and numerics): a flag in one and not the other would be
    // a resume that silently changes the run, or one that refuses to move a run to another machine
    const std::set<std::string> saved_by_design = {
        "-i", "-j", "-b", "-t", "-l", "-u", "-q", "-c", "-x", "-v", "-m", "-s", "-g", "-n", "-d", "--beta1", "--beta2",
        "--clip", "--shuffle", "--corpus", "--seed", "--temperature", "--topk", "--sample-seed", "--prompt", "--tokenizer",
        "--keep", "--sp", "-r", "--attention", "--dtype"};
    std::string saved_wrong;
    for (const FlagSpec& f : g_flags)
        if ((f.resume != NOT_SAVED) != (saved_by_design.count(f.name) > 0)) saved_wrong += std::string(" ") + f.name;
    check(saved_wrong.empty(), "the flags a state file saves are the %zu that make a run what it is, no more, no fewer (wrong:%s)",
          saved_by_design.size(), saved_wrong.empty() ? " none" : saved_wrong.c_str());
    // a flag that may change is taken and said; one that would make another run is refused, naming it
    rc = run_cmd("-y 1 -o " + d + "/b -x 14 -l 1e-3 --threads 1", &out, &err);
    check(rc == 0 && out.find("tp: continuing with changed flags: -l 0.001 (was 0.002), -x 14 (was 12)") != std::string::npos &&
          ckpt_steps((d + "/b").c_str()).back() == 14, "-y 1 -x 14 -l 1e-3: %s", first_line_with(out, "changed").c_str());
    for (const char* bad : {"-t 16", "--shuffle 0", "--seed 8"}) {
        rc = run_cmd(std::string("-y 1 --threads 1 -o ") + d + "/b -x 20 " + bad, &out, &err);
        check(rc == 1 && err.find(std::string(bad) + " differs from the run") != std::string::npos && ckpt_steps((d + "/b").c_str()).back() == 14,
              "-y 1 %s refused: %s", bad, err.substr(0, err.find('\n')).c_str());
    }
    // -o holding another run, without -y 1: refused, nothing touched; --fresh 1 starts over
    std::vector<char> log_before = slurp_bytes(d + "/a/log.csv");
    std::vector<int> steps_before = ckpt_steps((d + "/a").c_str());
    rc = run_cmd("-e L1C32H2 -b 2 -t 32 -x 3 -v 0 -g 0 --threads 1 -o " + d + "/a", &out, &err);
    check(rc == 1 && err.find("holds the checkpoints of another run (steps 6 to 12): continue it with -y 1") != std::string::npos &&
          ckpt_steps((d + "/a").c_str()) == steps_before && slurp_bytes(d + "/a/log.csv") == log_before,
          "a new run in a used -o: refused, its checkpoints and log.csv untouched: %s", err.substr(0, err.find('\n')).c_str());
    rc = run_cmd("-e L1C32H2 -b 2 -t 32 -x 3 -v 0 -g 0 --threads 1 --fresh 1 -o " + d + "/a", &out, &err);
    check(rc == 0 && ckpt_steps((d + "/a").c_str()) == std::vector<int>({3}) && read_csv(d + "/a/log.csv").size() == 4,
          "--fresh 1 starts over: only the new run's checkpoint and 3 log rows (exit %d)", rc);
    // -o a/b/c creates the parents
    rc = run_cmd("-e L1C32H2 -b 2 -t 32 -x 1 -v 0 -g 0 --threads 1 -o " + d + "/p/q/r", nullptr, &err);
    check(rc == 0 && ckpt_steps((d + "/p/q/r").c_str()) == std::vector<int>({1}), "-o p/q/r creates p and p/q (exit %d)%s", rc, err.c_str());
    // kill -9 three times at random moments of a run that saves every 5 steps, each time resumed with -y 1:
    // log.csv has every step once, in order, each row whole
    std::string dir = d + "/killed";
    std::string run = "-e L2C64H4 -b 2 -t 16 -v 7 -m 1 -g 0 --threads 1 --tp 2 -n 5 -x 1000000 -o " + dir;
    int kills = 0;
    for (int k = 0; k < 3; k++) {
        pid_t pid = spawn_tp(k == 0 ? run : "-y 1 --threads 1 -o " + dir, d + "/killed.txt");
        double t0 = comm_now();
        size_t rows = 0;
        while (comm_now() - t0 < 30 && rows < 30 + 15 * (size_t)k) {  // past a few checkpoints, then kill at once
            usleep(2000);
            rows = read_csv(dir + "/log.csv").size();
        }
        usleep(1000 * (k * 7 % 5));
        kill(pid, SIGKILL);
        int status;
        waitpid(pid, &status, 0);
        kills += WIFSIGNALED(status);
    }
    int last = ckpt_steps(dir.c_str()).back();
    rc = run_cmd("-y 1 --threads 1 -o " + dir + " -x " + std::to_string(last + 5), nullptr, &err);
    auto rows = read_csv(dir + "/log.csv");
    bool ordered = rows.size() >= 2 && rows[0][0] == "step";
    int gaps = 0;
    for (size_t i = 1; i < rows.size(); i++)
        if (rows[i].size() != rows[0].size() || atoi(rows[i][0].c_str()) != (int)i) gaps++;
    check(rc == 0 && kills == 3 && ordered && gaps == 0 && (int)rows.size() - 1 == last + 5,
          "%d x kill -9 and -y 1: log.csv holds steps 1..%d once each: %zu rows, %d out of place (exit %d)", kills, last + 5,
          rows.size() - 1, gaps, rc);
    // a log.csv cut inside a row (a disk that filled, a hand edit): the resume keeps the whole rows before the
    // cut and nothing from it on, so no new row is glued to the cut one
    std::vector<char> logb = slurp_bytes(dir + "/log.csv");
    std::string text(logb.begin(), logb.end());
    size_t row3 = text.find("\n3,");
    bool cut = row3 != std::string::npos && write_bytes(dir + "/log.csv", text.substr(0, row3 + 5));  // "...\n3,4" and no newline
    rc = run_cmd("-y 1 --threads 1 -o " + dir + " -x " + std::to_string(last + 7), nullptr, &err);
    rows = read_csv(dir + "/log.csv");
    std::string steps;
    bool whole = rows.size() == 5;
    for (size_t i = 1; i < rows.size(); i++) {
        steps += (i > 1 ? " " : "") + rows[i][0];
        whole = whole && rows[i].size() == rows[0].size();
    }
    check(cut && rc == 0 && whole && steps == "1 2 " + std::to_string(last + 6) + " " + std::to_string(last + 7),
          "log.csv cut inside row 3, then -y 1 to step %d: whole rows of steps %s (exit %d)", last + 7, steps.c_str(), rc);
}
