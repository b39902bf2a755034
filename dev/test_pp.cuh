// dev/test_pp.cuh: pipeline parallelism (--pp, train/pipeline.h): the schedules against a simulation of
// their order, the point-to-point messages, PP = 2 and 3 against PP = 1 on tp.cu's grid, a stalled stage,
// and the command line (resume across (D, S, P) grids, bad flags). Part of test_tp.cu.
#pragma once

// ----------------------------------------------------------------------------
// the schedules, run by a simulation of the stages

// Runs the S stages' schedules as the pipeline runs them: in rounds, each stage that can take its next
// micro-step takes it (a forward once the previous stage has sent that micro-batch, a backward once the
// next stage has sent its gradient; sends never wait). Returns false on a deadlock. Fills the rounds a
// stage was idle, and the most micro-batches a stage held between their forward and backward, and
// counts a micro-batch whose slot (mb % pp_slots) another one in flight still uses.
static bool pp_simulate(int kind, int S, int m, std::vector<int>* idle, std::vector<int>* most, int* rounds, long* clashes,
                        std::string* why) {
    std::vector<std::vector<PipeStep>> order(S);
    for (int s = 0; s < S; s++) order[s] = pp_schedule(kind, S, s, m);
    std::vector<std::vector<int>> fdone(S, std::vector<int>(m, 0)), bdone(S, std::vector<int>(m, 0));
    std::vector<size_t> next(S, 0);
    std::vector<std::set<int>> held(S);
    idle->assign(S, 0);
    most->assign(S, 0);
    *rounds = 0;
    *clashes = 0;
    for (int s = 0; s < S; s++) {  // each micro-batch once forward and once backward, forwards in order
        std::vector<int> nf(m, 0), nb(m, 0);
        int last_f = -1;
        for (const PipeStep& st : order[s]) {
            if (st.mb < 0 || st.mb >= m) { *why = "a micro-batch out of range"; return false; }
            if (st.forward) {
                nf[st.mb]++;
                if (st.mb != last_f + 1) { *why = "forwards out of order"; return false; }
                last_f = st.mb;
            } else {
                if (!nf[st.mb]) { *why = "a backward before its forward"; return false; }
                nb[st.mb]++;
            }
        }
        for (int k = 0; k < m; k++)
            if (nf[k] != 1 || nb[k] != 1) { *why = "a micro-batch not run exactly once each way"; return false; }
    }
    for (;;) {
        bool all = true, any = false;
        std::vector<std::pair<int, PipeStep>> run;  // what every stage can take this round (decided first)
        for (int s = 0; s < S; s++) {
            if (next[s] == order[s].size()) continue;
            all = false;
            PipeStep st = order[s][next[s]];
            bool ready = st.forward ? (s == 0 || fdone[s - 1][st.mb]) : (fdone[s][st.mb] && (s == S - 1 || bdone[s + 1][st.mb]));
            if (ready) run.push_back({s, st});
        }
        if (all) break;
        for (auto& x : run) {
            int s = x.first;
            PipeStep st = x.second;
            any = true;
            next[s]++;
            int slots = pp_slots(kind, S, s, m);
            if (st.forward) {
                for (int k : held[s]) *clashes += k % slots == st.mb % slots;
                held[s].insert(st.mb);
                (*most)[s] = std::max((*most)[s], (int)held[s].size());
                fdone[s][st.mb] = 1;
            } else {
                held[s].erase(st.mb);
                bdone[s][st.mb] = 1;
            }
        }
        (*rounds)++;
        if (!any) { *why = "deadlock: no stage can take its next micro-step"; return false; }
    }
    for (int s = 0; s < S; s++) (*idle)[s] = *rounds - (int)order[s].size();  // waiting, before its first or after its last too
    return true;
}

static void test_pp_schedule() {
    printf("pipeline schedules: every (S, m) up to 6 stages and 12 micro-batches, simulated round by round\n");
    long bad_1f1b = 0, bad_gpipe = 0, cases = 0;
    double worst_bubble = 0;
    for (int kind : {PP_1F1B, PP_GPIPE})
        for (int S = 1; S <= 6; S++)
            for (int m = 1; m <= 12; m++) {
                std::vector<int> idle, most;
                int rounds;
                long clashes;
                std::string why;
                bool ok = pp_simulate(kind, S, m, &idle, &most, &rounds, &clashes, &why);
                long* bad = kind == PP_1F1B ? &bad_1f1b : &bad_gpipe;
                cases++;
                if (!ok) {
                    if (!*bad) printf("    %s S=%d m=%d: %s\n", pp_schedule_name(kind), S, m, why.c_str());
                    (*bad)++;
                    continue;
                }
                for (int s = 0; s < S; s++) {
                    int want = kind == PP_1F1B ? std::min(S - s, m) : m;  // 1F1B: at most S - s in flight; GPipe: all
                    if (most[s] != want || most[s] > pp_slots(kind, S, s, m)) (*bad)++;
                }
                if (clashes) (*bad)++;
                // unit micro-steps: a step takes 2 (m + S - 1) rounds, each stage idle 2 (S - 1) of them
                if (rounds != 2 * (m + S - 1)) (*bad)++;
                for (int s = 0; s < S; s++)
                    worst_bubble = std::max(worst_bubble, fabs((double)idle[s] / rounds - pp_bubble(S, m)));
            }
    check(bad_1f1b == 0, "1F1B: every micro-batch forward then backward once, no deadlock, at most S - s in flight on stage s and in "
          "distinct slots, 2 (m + S - 1) rounds (%ld cases, %ld wrong)", cases / 2, bad_1f1b);
    check(bad_gpipe == 0, "GPipe: the same, with all m micro-batches in flight (%ld cases, %ld wrong)", cases / 2, bad_gpipe);
    check_le(worst_bubble, 1e-12, "each stage's idle rounds in the simulation against the bubble (S - 1) / (m + S - 1): largest difference");
    // the order itself, spelled out for one case a reader can check by hand
    std::string got;
    for (const PipeStep& st : pp_schedule(PP_1F1B, 3, 0, 5)) got += (st.forward ? "F" : "B") + std::to_string(st.mb) + " ";
    check(got == "F0 F1 F2 B0 F3 B1 F4 B2 B3 B4 ", "1F1B, stage 0 of 3, 5 micro-batches: %s", got.c_str());
}

// ----------------------------------------------------------------------------
// point to point

static void test_pp_p2p() {
    printf("point to point (host backend): 4 ranks pass buffers along a line both ways, sends ahead of receives\n");
    int P = 4, msgs = 7;
    long sizes[] = {1, 333, 1 << 16};
    CommGroup* g = new CommGroup();
    comm_group_init(g, P, 30);
    std::vector<long> bad(P, 0), sent(P, 0);
    std::vector<std::thread> th;
    auto value = [](int src, int k, long i) { return (float)(src * 1000003 + k * 7919 + i) * 0.37f + 1e-30f * (float)i; };
    for (int r = 0; r < P; r++)
        th.emplace_back([&, r]() {
            Comm c;
            comm_init(&c, g, r);
            for (long n : sizes) {
                std::vector<float> buf(n);
                // every message first: a send never waits for its receiver
                for (int k = 0; k < msgs; k++)
                    for (int dst : {r - 1, r + 1}) {
                        if (dst < 0 || dst >= P) continue;
                        for (long i = 0; i < n; i++) buf[i] = value(r, k, i);
                        comm_send(&c, dst, buf.data(), n, "test", k);
                    }
                for (int src : {r + 1, r - 1}) {
                    if (src < 0 || src >= P) continue;
                    for (int k = 0; k < msgs; k++) {  // in the order sent
                        comm_recv(&c, src, buf.data(), n, "test", k);
                        for (long i = 0; i < n; i++) {
                            float want = value(src, k, i);
                            bad[r] += memcmp(&buf[i], &want, 4) != 0;
                        }
                    }
                }
            }
            sent[r] = (long)c.p2p_sent;
        });
    for (auto& t : th) t.join();
    delete g;
    long total_bad = 0, total_sent = 0, want = 0;
    for (int r = 0; r < P; r++) {
        total_bad += bad[r];
        total_sent += sent[r];
    }
    for (long n : sizes) want += n * msgs * 2 * (P - 1);
    check_le(total_bad, 0, "floats received that differ from the ones sent (bit for bit, in order, %d messages per pair and size)", msgs);
    check(total_sent == want, "floats counted as sent: %ld (expected %ld)", total_sent, want);
}

// ----------------------------------------------------------------------------
// PP = S against PP = 1 on tp.cu's grid

static void test_pp_grid() {
    GPTConfig cfg = make_config(3, 4, 32, 200, 32);  // NH 4, Vp 256: S up to 3, P up to 4
    int B = 2, T = 16, steps = 10;
    printf("pipeline parallelism in one process: L%d NH%d C%d, T%d, %d steps (lr 1e-3, wd 0.1, clip 1), in-order batches\n",
           cfg.L, cfg.NH, cfg.C, T, steps);
    std::vector<float> init = init_weights(&cfg, 11);
    std::vector<int> data = random_tokens((long)steps * 16 * B * T + 1, cfg.V, 5);
    std::map<std::pair<int, int>, GridResult> one;  // PP 1 with (P 1, D 1) and m micro-batches of -b b
    auto reference = [&](int b, int m) -> GridResult& {
        auto key = std::make_pair(b, m);
        if (!one.count(key)) run_grid(&cfg, init, 1, 1, 0, m, steps, data, b, T, &one[key]);
        return one[key];
    };
    struct { int S, P, D, zero, accum, sp, sched; } grids[] = {
        {2, 1, 1, 0, 4, 0, PP_1F1B}, {2, 1, 1, 0, 4, 0, PP_GPIPE}, {3, 1, 1, 0, 4, 0, PP_1F1B}, {3, 1, 1, 0, 5, 0, PP_GPIPE},
        {3, 1, 1, 0, 2, 0, PP_1F1B},  // fewer micro-batches than stages
        {2, 2, 1, 0, 4, 0, PP_1F1B}, {2, 2, 1, 0, 3, 1, PP_1F1B}, {3, 2, 1, 0, 4, 1, PP_GPIPE},
        {2, 1, 2, 0, 2, 0, PP_1F1B}, {2, 2, 2, 1, 2, 1, PP_1F1B}, {3, 1, 2, 1, 3, 0, PP_GPIPE}};
    for (auto& g : grids) {
        GridResult& ref = reference(B * g.D, g.accum);
        GridResult res;
        run_grid(&cfg, init, g.P, g.D, g.zero, g.accum, steps, data, B, T, &res, false, g.sp, g.S, g.sched);
        char name[112];
        snprintf(name, sizeof(name), "(S %d, P %d, D %d) %s, %d micro%s%s", g.S, g.P, g.D, g.sched == PP_GPIPE ? "GPipe" : "1F1B",
                 g.accum, g.zero ? ", -z 1" : "", g.sp ? ", SP" : "");
        double dl = max_abs_diff(res.losses, ref.losses);
        check_le(dl, 1e-5, "%-36s per-step losses against PP 1 (-b %d, %d micro), largest difference", name, B * g.D, g.accum);
        check_le(rel_err(res.params_full.data(), ref.params_full.data(), (long)ref.params_full.size()), 1e-5,
                 "%-36s weights after %d steps against PP 1, rel err", name, steps);
        if (!g.zero)
            check_le(rel_err(res.grads_full.data(), ref.grads_full.data(), (long)ref.grads_full.size()), 1e-5,
                     "%-36s gradients of step %d against PP 1, rel err", name, steps);
        check_le(max_abs_diff(res.norms, ref.norms), 1e-5, "%-36s gradient norms against PP 1, largest difference", name);
        check_le(res.mismatches, 0, "%-36s weight checksums differing from replica 0's same stage and rank (%ld compared)", name, res.compared);
        check(res.distinct == steps, "%-36s the weights change at every step (%ld distinct checksums)", name, res.distinct);
        double N = (double)B * T / (g.sp ? g.P : 1), want = g.accum * N * cfg.C;  // stage 0 sends forward only
        check(res.pp_sent == want, "%-36s floats stage 0 sent to stage 1 per step: %.0f (m x N x C = %.0f)", name, res.pp_sent, want);
    }
    // the first micro-batch's loss is computed by the same ops in the same order at any S: exact
    GridResult a, b;
    run_grid(&cfg, init, 1, 1, 0, 1, 1, data, B, T, &a);
    run_grid(&cfg, init, 1, 1, 0, 1, 1, data, B, T, &b, false, 0, 3);
    check(a.losses.size() == 1 && b.losses.size() == 1 && memcmp(&a.losses[0], &b.losses[0], 4) == 0,
          "one micro-batch, one step: the loss at PP 3 is bit-identical to PP 1 (%.9g, %.9g)", a.losses[0], b.losses[0]);
    // the check of replicas can fail under PP too: one weight of the last replica's stage 0 one ulp off
    GridResult res;
    run_grid(&cfg, init, 1, 2, 0, 2, 2, data, B, T, &res, true, 0, 2);
    bool all = true;
    for (int x : res.detected) all &= x == 1;
    check(all, "(S 2, D 2): one weight of replica 1's stage 0 moved by one ulp: replicas_differ reports 1 differing rank on all %zu ranks",
          res.detected.size());
}

// ----------------------------------------------------------------------------
// a stalled stage

// In a child process: stage `stall`'s TP rank 0 stops before its second micro-batch; the run must end
// within the timeout, exit 1, and say which stage and rank it waited for.
static void test_pp_stall() {
    printf("a stalled pipeline stage is reported within --timeout, naming the stage and the rank\n");
    GPTConfig cfg = make_config(3, 4, 32, 200, 32);
    std::vector<float> init = init_weights(&cfg, 3);
    std::vector<int> data = random_tokens(4096, cfg.V, 1);
    for (int P : {1, 2}) {
        std::string err = tmpdir() + "/pp_stall.err";
        fflush(stdout);
        double t0 = comm_now();
        pid_t pid = fork();
        if (pid == 0) {
            if (!freopen(err.c_str(), "w", stderr)) _exit(99);
            g_pp_plant_stall = 1;
            g_grid_timeout = 2;
            GridResult res;
            run_grid(&cfg, init, P, 1, 0, 4, 2, data, 2, 16, &res, false, 0, 3);
            _exit(0);  // not reached: the timeout ends the process
        }
        int status = wait_exit(pid, 120);
        bool ended = status != -1;
        double took = comm_now() - t0;
        std::vector<char> b = slurp_bytes(err);
        std::string text(b.begin(), b.end());
        std::string line = first_line_with(text, "error:");
        bool named = text.find("stage 1") != std::string::npos;
        check(ended && WIFEXITED(status) && WEXITSTATUS(status) == 1 && named && took < 30,
              "P=%d: stage 1's TP rank 0 stalls (--timeout 2): exit status %d after %.1f s, and the error names stage 1: %s", P,
              WIFEXITED(status) ? WEXITSTATUS(status) : -1, took, line.c_str());
    }
}

// ----------------------------------------------------------------------------
// the command line

static void test_pp_cli() {
    printf("command line: --pp against --pp 1, resume across (D, S, P) grids, Ctrl-C, bad input\n");
    if (skip_under_tsan("pp_cli")) return;  // (the pp and pp_stall groups put the stages' threads under TSan)
    std::string base = "-e L2C64H4 -t 32 -x 8 -v 4 -m 2 -g 0 --threads 1 -c 0.1 -b 2 -d 256 ";  // 4 micro-batches per step
    std::string out1, out2, out3;
    int rc1 = run_cmd(base + "--tp 1", &out1, nullptr);
    int rc2 = run_cmd(base + "--tp 2 --pp 2", &out2, nullptr);
    int rc3 = run_cmd(base + "--tp 2 --sp 1 --pp 2 --pp-schedule gpipe", &out3, nullptr);
    auto losses = [](const std::string& out) {
        std::vector<float> v = grep_floats(out, "| loss "), val = grep_floats(out, "val loss ");
        v.insert(v.end(), val.begin(), val.end());
        return v;
    };
    std::vector<float> a = losses(out1), b = losses(out2), c = losses(out3);
    check_le(rc1 == 0 && rc2 == 0 && a.size() == 11 ? max_abs_diff(a, b) : INFINITY, 1e-5,
             "--tp 2 --pp 2 (1F1B) against --tp 1 --pp 1, 4 micro-batches: 8 step and 3 val losses, largest printed difference");
    check_le(rc3 == 0 && a.size() == 11 ? max_abs_diff(a, c) : INFINITY, 1e-5,
             "--tp 2 --sp 1 --pp 2 --pp-schedule gpipe against --tp 1 --pp 1: the same, largest printed difference");
    check(out2.find("pipeline: 2 stages x 2 TP ranks, 1F1B") != std::string::npos && out2.find("| pp wait ") != std::string::npos &&
              out2.find("stage 1 (layers 1-1, LM head): waited for its neighbours") != std::string::npos,
          "the run prints the stage table, the pipeline wait per step and each stage's measured wait");
    // what stage 0 sends stage 1 in a step: each micro-batch's activations, the residual stream's B x T x C
    // values (B x T / P with SP), 4 bytes each in fp32 and 2 in bf16, whose stream is bf16 storage (the
    // gradients stage 1 sends back are fp32 in either); on the step line (in MB, to 2 places) and in
    // log.csv's pp_bytes column
    for (const char* dtype : {"fp32", "bf16"}) {
        std::string pd = tmpdir() + "/ppbytes_" + dtype, out7;
        int rc7 = run_cmd(std::string("-e L2C128H4 -t 64 -x 3 -v 0 -g 0 --threads 1 -b 4 -d 1024 --tp 2 --sp 1 --pp 2 --dtype ") +
                              dtype + " -o " + pd, &out7, nullptr);
        const double pp_bytes = (strcmp(dtype, "bf16") == 0 ? 2.0 : 4.0) * 4 * (4 * 64 / 2) * 128;  // 4 micro-batches of (B T / P) x C
        int pp_lines = 0, pp_off = 0;
        for (size_t at = out7.find("| pp wait "); at != std::string::npos; at = out7.find("| pp wait ", at + 1)) {
            float ms, mbytes;
            if (sscanf(out7.c_str() + at, "| pp wait %f ms, %f MB", &ms, &mbytes) != 2) continue;
            pp_lines++;
            pp_off += fabs(mbytes - pp_bytes / 1e6) > 0.005;
        }
        auto pp_rows = read_csv(pd + "/log.csv");
        // (and its time: pp_ms, stage 0's wait for stage 1, which 4 micro-batches make more than 0; dp_ms 0, one replica)
        for (size_t i = 1; i < pp_rows.size(); i++)
            pp_off += pp_rows[i].size() != 15 || atof(pp_rows[i][14].c_str()) != pp_bytes || atof(pp_rows[i][13].c_str()) <= 0 ||
                      atof(pp_rows[i][11].c_str()) != 0;
        // the stage table's "sent MB/step", its last column: stage 0 those bytes forward, stage 1 the gradient
        // of the same values back, fp32 in either dtype
        const double back_bytes = 4.0 * 4 * (4 * 64 / 2) * 128;
        size_t table = out7.find("sent MB/step");
        for (int st = 0; st < 2; st++) {
            size_t row = table == std::string::npos ? table : out7.find("\n  " + std::to_string(st) + " ", table);
            std::string line = row == std::string::npos ? "" : out7.substr(row + 1, out7.find('\n', row + 1) - row - 1);
            size_t last = line.find_last_of(' ');
            double sent = last == std::string::npos ? -1 : atof(line.c_str() + last + 1);
            pp_off += fabs(sent - (st == 0 ? pp_bytes : back_bytes) / 1e6) > 0.005;
        }
        check(rc7 == 0 && pp_lines == 3 && pp_rows.size() == 4 && pp_off == 0,
              "--tp 2 --sp 1 --pp 2 --dtype %s, 4 micro-batches of 4 x 64 at C 128: stage 0 sends %.0f bytes a step, on %d step "
              "lines and %zu rows of log.csv, and the stage table says so (stage 1 sends back %.0f): %d disagree", dtype, pp_bytes,
              pp_lines, pp_rows.size() ? pp_rows.size() - 1 : 0, back_bytes, pp_off);
    }
    // the sample after a --pp run comes from the gathered weights: the same text as -x 0 on its checkpoint
    std::string sd = tmpdir() + "/ppsample", out4, out5, out6;
    int rc4 = run_cmd("-e L2C64H4 -t 32 -x 3 -v 0 --threads 1 -b 2 --tp 2 --pp 2 -s 2 -g 24 -o " + sd, &out4, nullptr);
    int rc5 = run_cmd("-x 0 -y 1 -o " + sd + " -g 24 --tp 1", &out5, nullptr);
    int rc6 = run_cmd("-x 0 -y 1 -o " + sd + " -g 24 --pp 2", &out6, nullptr);
    auto sample_text = [](const std::string& out, const char* head) {
        size_t at = out.find(head), a = at == std::string::npos ? at : out.find("---\n", at);
        size_t b = a == std::string::npos ? a : out.find("\n---", a + 4);
        return b == std::string::npos ? std::string() : out.substr(a + 4, b - a - 4);
    };
    std::string s3 = sample_text(out4, "sample after 3 steps"), s0 = sample_text(out5, "sample after 3 steps");
    check(rc4 == 0 && rc5 == 0 && !s3.empty() && s3 == s0 && !sample_text(out4, "sample after 2 steps").empty(),
          "--tp 2 --pp 2 -s 2: samples after steps 2 and 3, the last the text that -x 0 at --tp 1 draws from the saved step 3 "
          "(%zu bytes; exit %d, %d)", s3.size(), rc4, rc5);
    check(rc6 == 0 && out6.find("sampling runs without pipeline stages") != std::string::npos && sample_text(out6, "sample after 3 steps") == s0,
          "-x 0 --pp 2 samples as --pp 1, and says so (exit %d)", rc6);

    // resume across grids, (D, S, P) = (1, 2, 2) to (2, 1, 1) and back, with the global batch kept
    std::string d = tmpdir() + "/ppresume";
    mkdir(d.c_str(), 0755);
    std::string run20 = "-e L2C64H4 -t 32 -x 20 -v 0 -g 0 --threads 1 -c 0.1 -b 2 -d 256 ";
    struct { const char* name; std::string grid; } g[2] = {{"(D 1, S 2, P 2)", "--tp 2 --pp 2 "}, {"(D 2, S 1, P 1)", "--tp 1 --dp 2 "}};
    std::vector<float> ref[2];
    for (int i = 0; i < 2; i++) {
        std::string dir = d + "/full" + std::to_string(i);
        int rc = run_cmd(run20 + g[i].grid + "-n 10 -o " + dir, nullptr, nullptr);
        ref[i] = model_params(ckpt_path(dir.c_str(), "model", 20));
        check(rc == 0 && !ref[i].empty(), "%s saves steps 10 and 20 (exit %d)", g[i].name, rc);
    }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            std::string dir = d + "/r" + std::to_string(i) + std::to_string(j);
            copy_step(d + "/full" + std::to_string(i), dir, 10);
            std::string out, err;
            int rc = run_cmd(run20 + g[j].grid + "-y 1 -o " + dir, &out, &err);
            std::vector<float> got = model_params(ckpt_path(dir.c_str(), "model", 20));
            bool resumed = rc == 0 && out.find("resuming from") != std::string::npos && got.size() == ref[i].size();
            if (i == j) check(resumed && got == ref[i], "saved at %s, resumed on the same grid from step 10: the step-20 weights are bit-identical", g[i].name);
            else check_le(resumed ? rel_err(got.data(), ref[i].data(), (long)ref[i].size()) : INFINITY, 1e-5,
                          "saved at %s, resumed at %s from step 10: step-20 weights rel err against the run that did not stop%s%s",
                          g[i].name, g[j].name, err.empty() ? "" : ": ", err.c_str());
        }

    // Ctrl-C: every stage stops after the same step, the run saves and exits 0, and continues
    std::string sig = tmpdir() + "/ppsig";
    bool started;
    int rc = interrupt_at_step5("-e L2C64H4 -t 32 -v 0 -g 0 --threads 1 --tp 1 --pp 2 -b 2 -d 256 -x 1000000", sig, &started);
    std::vector<int> steps = ckpt_steps(sig.c_str());
    check(started && rc == 0 && steps.size() == 1 && steps[0] >= 5,
          "--pp 2: Ctrl-C after step 5 exits 0 and saves the step it stopped after (exit %d, step %d)", rc, steps.empty() ? -1 : steps[0]);

    // bad input: one line, exit 1
    struct { std::string args; const char* says; } bad[] = {
        {"-e L2C64H4 --pp 3 -x 2", "a stage needs at least one layer, and the model has 2"},
        {"-e L2C64H4 --pp 2 --pp-schedule zigzag -x 2", "the schedules are 1f1b and gpipe"},
        {"-e L2C64H4 --pp 2 --sweep 1", "drop --pp"},
        {"-e L2C64H4 --pp 0 -x 2", "--pp"},
    };
    for (auto& x : bad) {
        std::string err;
        int rc = run_cmd(x.args, nullptr, &err);
        check(rc == 1 && err.rfind("error: ", 0) == 0 && err.find(x.says) != std::string::npos,
              "%s: exit %d, %s", x.args.c_str(), rc, first_line_with(err, "error").c_str());
    }
}
