// dev/test_cli.cuh: the command line, run as a user runs it: ./tp as a child process with the llm.c-parity
// flags, bad input (one line on stderr, exit 1, never a crash), sampling from the command line, the
// flag wording and the build. Part of test_tp.cu, which includes it after its harness.
#pragma once
// ----------------------------------------------------------------------------
// the command line, run as a user runs it

// the tp binary under test: ./tp, or $TP_BIN (the sanitizer builds test their own)
static std::string tp_bin() {
    const char* b = getenv("TP_BIN");
    return b ? b : "./tp";
}

// Under ThreadSanitizer (make tsan) a group that only checks what a long run computes (a loss, a
// sample's words) skips itself: TSan makes that run 15-20x slower (minutes each: CI runs the suite five
// times), and the threads of the same runs are what the smaller runs of the tp, dp, resume, interrupts
// and mpi groups put under TSan. Returns whether it skipped. (under_tsan: whether this is make tsan's run,
// for a group that shrinks or leaves out part of its work there.)
static bool under_tsan() {
    const char* b = getenv("TP_BIN");
    return b && strstr(b, "tsan");
}
static bool skip_under_tsan(const char* group) {
    if (!under_tsan()) return false;
    printf("  skip %s under TSan: it checks numbers, not threads (make test runs it)\n", group);
    g_skipped++;
    return true;
}

// runs `launcher tp args` (launcher: empty, or e.g. "mpirun -np 2"), returns its exit status. The groups
// that run ./tp check fp32's numbers (TP=P against TP=1 at fp32's bounds, llm.c's, the README's), so a
// command that does not choose --dtype, and is not a resume (-y 1: the run's saved --dtype), gets --dtype
// fp32 first; the bf16 groups, and the test of --dtype's default itself, say what they want.
static int run_in(const std::string& launcher, const std::string& args, std::string* out, std::string* err) {
    std::string d = tmpdir();
    bool pin = args.find("--dtype") == std::string::npos && args.find("-y 1") == std::string::npos;
    std::string cmd = launcher + (launcher.empty() ? "" : " ") + tp_bin() + (pin ? " --dtype fp32 " : " ") + args + " >" + d +
                      "/out.txt 2>" + d + "/err.txt </dev/null";
    int rc = system(cmd.c_str());
    auto slurp = [](const std::string& p) {
        std::string s;
        FILE* f = fopen(p.c_str(), "r");
        if (!f) return s;
        char buf[4096];
        size_t n;
        while ((n = fread(buf, 1, sizeof(buf), f)) > 0) s.append(buf, n);
        fclose(f);
        return s;
    };
    if (out) *out = slurp(d + "/out.txt");
    if (err) *err = slurp(d + "/err.txt");
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static int run_cmd(const std::string& args, std::string* out, std::string* err) { return run_in("", args, out, err); }

static std::vector<float> grep_floats(const std::string& text, const char* key) {
    std::vector<float> v;
    size_t pos = 0, kl = strlen(key);
    while ((pos = text.find(key, pos)) != std::string::npos) {
        v.push_back(strtof(text.c_str() + pos + kl, nullptr));
        pos += kl;
    }
    return v;
}

static std::vector<char> slurp_bytes(const std::string& path) {
    std::vector<char> b;
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) return b;
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) b.insert(b.end(), buf, buf + n);
    fclose(f);
    return b;
}

// writes bytes to path whole (created or truncated); whether it did
static bool write_bytes(const std::string& path, const std::string& bytes) {
    FILE* f = fopen(path.c_str(), "wb");
    bool ok = f && fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    return f && fclose(f) == 0 && ok;
}

// whether a printed rate (tok/s, printed to tps_step) is `tokens` over a printed time (ms, printed to ms_step),
// as far as the printing's rounding lets one tell
static bool printed_rate_agrees(double tps, double tokens, double ms, double ms_step, double tps_step) {
    return ms > ms_step && tps >= 1e3 * tokens / (ms + ms_step / 2) - tps_step / 2 && tps <= 1e3 * tokens / (ms - ms_step / 2) + tps_step / 2;
}

// starts ./tp in the background with stdout and stderr in files; returns its pid
static pid_t spawn_tp(const std::string& args, const std::string& out, const std::string& launcher = "") {
    pid_t pid = fork();
    if (pid == 0) {
        std::string cmd = "exec " + (launcher.empty() ? "" : launcher + " ") + tp_bin() + " " + args + " >" + out + " 2>" + out + ".err </dev/null";
        execl("/bin/sh", "sh", "-c", cmd.c_str(), (char*)nullptr);
        _exit(127);
    }
    return pid;
}

// Waits up to `seconds` for child pid to end; returns its wait status, or -1 when it had not ended: it is
// then killed and reaped, so a check whose process never ends (a stop that is not obeyed, a hang) fails
// instead of hanging the tests too. -1 reads as neither exited nor signalled.
static int wait_exit(pid_t pid, double seconds) {
    double t0 = comm_now();
    int status = 0;
    while (comm_now() - t0 < seconds) {
        if (waitpid(pid, &status, WNOHANG) == pid) return status;
        usleep(20000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

static bool wait_for_text(const std::string& path, const char* text, double seconds) {
    double t0 = comm_now();
    while (comm_now() - t0 < seconds) {
        std::vector<char> b = slurp_bytes(path);
        if (std::string(b.begin(), b.end()).find(text) != std::string::npos) return true;
        usleep(20000);
    }
    return false;
}

// Starts `./tp args -o dir` in the background, sends it SIGINT once it has printed step 5, and waits for
// it. Returns its exit status (-1: it did not exit normally); *started: step 5 came within 60 s.
static int interrupt_at_step5(const std::string& args, const std::string& dir, bool* started) {
    pid_t pid = spawn_tp(args + " -o " + dir, dir + ".txt");
    *started = wait_for_text(dir + ".txt", "step    5/", 60);
    kill(pid, SIGINT);
    int status = wait_exit(pid, 60);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// a text file of n bytes of the corpus's sentences
static std::string write_text(const std::string& path, size_t n, uint64_t seed) {
    std::string text;
    grammar_generate(seed, n, &text, nullptr);
    FILE* f = fopen(path.c_str(), "wb");
    fwrite(text.data(), 1, text.size(), f);
    fclose(f);
    return text;
}

// runs a shell command; its stdout and stderr together in *out
static int run_sh(const std::string& cmd, std::string* out) {
    std::string path = tmpdir() + "/sh_out.txt";
    int rc = system((cmd + " >" + path + " 2>&1 </dev/null").c_str());
    std::vector<char> b = slurp_bytes(path);
    if (out) out->assign(b.begin(), b.end());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static std::string first_line_with(const std::string& text, const char* key) {
    size_t p = text.find(key);
    if (p == std::string::npos) return "(none)";
    size_t b = text.rfind('\n', p), e = text.find('\n', p);
    b = b == std::string::npos ? 0 : b + 1;
    return text.substr(b, e == std::string::npos ? std::string::npos : e - b);
}

// the texts between consecutive --- rule lines of a run's output, in order: its samples where they are
// printed together (a batch shares the rules between its rows: ---, row 0, ---, row 1, ---), and first
// always the first sample
static std::vector<std::string> sample_texts(const std::string& out) {
    std::vector<std::string> texts;
    for (size_t a = out.find("---\n"); a != std::string::npos;) {
        size_t b = out.find("\n---", a + 4);
        if (b == std::string::npos) break;
        texts.push_back(out.substr(a + 4, b - a - 4));
        a = b + 1;
    }
    return texts;
}

static void test_cli_parity_run() {
    printf("command line: the llm.c-parity command gives the same losses at --tp 1, 2, 4\n");
    std::string d = tmpdir();
    GPTConfig cfg = make_config(2, 4, 32, 256, 64);
    std::vector<float> init = init_weights(&cfg, 21);
    model_write((d + "/ckpt.bin").c_str(), &cfg, init.data());
    write_tokens(d + "/train.bin", random_tokens(4000, 256, 1));
    write_tokens(d + "/val.bin", random_tokens(2000, 256, 2));
    std::string base = "-e " + d + "/ckpt.bin -i " + d + "/train.bin -j " + d + "/val.bin -b 4 -t 64 -x 12 -l 1e-4 -u 0 -q 1 -c 0 "
                       "--beta2 0.999 --clip 0 -v 10 -m 5 -s 0 --device cpu --threads 1 --tp ";
    std::vector<float> ref_train, ref_val;
    for (int P : {1, 2, 4}) {
        std::string out, err;
        int rc = run_cmd(base + std::to_string(P), &out, &err);
        std::vector<float> tr = grep_floats(out, "| loss "), va = grep_floats(out, "val loss ");
        bool shape = rc == 0 && tr.size() == 12 && va.size() == 3;  // val before steps 0, 10 and at the last step (11)
        if (P == 1) {
            ref_train = tr; ref_val = va;
            check(shape, "--tp 1: exit %d, %zu step losses, %zu val losses%s%s", rc, tr.size(), va.size(), err.empty() ? "" : ": ", err.c_str());
            continue;
        }
        // the shard plan it printed: each tensor's full and per-rank shape as Megatron's recipe splits it (the
        // vocab rows of wte, q, k, v's rows by head, fc's rows and fcproj's and attproj's input columns), the
        // rest replicated; written out here for this model (L 2, C 32, 4 heads, vocab 256, max T 64)
        {
            struct { const char* name; const char* full; std::string local; } plan[] = {
                {"wte", "(256, 32)", format("(%d, 32)", 256 / P)}, {"wpe", "(64, 32)", "(64, 32)"},
                {"ln1w", "(2, 32)", "(2, 32)"}, {"ln1b", "(2, 32)", "(2, 32)"},
                {"qkvw", "(2, 96, 32)", format("(2, %d, 32)", 96 / P)}, {"qkvb", "(2, 96)", format("(2, %d)", 96 / P)},
                {"attprojw", "(2, 32, 32)", format("(2, 32, %d)", 32 / P)}, {"attprojb", "(2, 32)", "(2, 32)"},
                {"ln2w", "(2, 32)", "(2, 32)"}, {"ln2b", "(2, 32)", "(2, 32)"},
                {"fcw", "(2, 128, 32)", format("(2, %d, 32)", 128 / P)}, {"fcb", "(2, 128)", format("(2, %d)", 128 / P)},
                {"fcprojw", "(2, 32, 128)", format("(2, 32, %d)", 128 / P)}, {"fcprojb", "(2, 32)", "(2, 32)"},
                {"lnfw", "(32)", "(32)"}, {"lnfb", "(32)", "(32)"}};
            int right = 0;
            std::string wrong;
            size_t at = out.find(format("shard plan (rank r of %d):\n", P));
            for (auto& t : plan) {
                std::string line = at == std::string::npos ? "" : first_line_with(out.substr(at), format("  %-9s ", t.name).c_str());
                std::vector<std::string> shapes;
                for (size_t o = line.find('('); o != std::string::npos; o = line.find('(', o + 1)) shapes.push_back(line.substr(o, line.find(')', o) - o + 1));
                bool replicated = t.local == t.full;
                bool ok = shapes.size() >= 2 && shapes[0] == t.full && shapes[1] == t.local &&
                          (line.find("replicated") != std::string::npos) == replicated;
                right += ok;
                if (!ok && wrong.empty()) wrong = std::string(", first wrong: ") + t.name + ": '" + line + "'";
            }
            check(right == 16, "--tp %d: the shard plan's 16 tensors, full and per-rank shapes as the recipe splits them, "
                  "'replicated' where they are whole: %d right%s", P, right, wrong.c_str());
        }
        double w = 0;
        for (size_t k = 0; k < tr.size() && k < ref_train.size(); k++) w = worse(w, (double)fabs(tr[k] - ref_train[k]));
        for (size_t k = 0; k < va.size() && k < ref_val.size(); k++) w = worse(w, (double)fabs(va[k] - ref_val[k]));
        check_le(shape ? w : INFINITY, 2e-6, "--tp %d: exit %d, printed losses against --tp 1: largest difference", P, rc);
    }
    // every evaluation is of the first -m batches of the val file (llm.c resets its val loader each time; the
    // file holds 7): with -l 0 the weights never move, so the three evaluations print the same loss
    std::string still = base, out, err;
    still.replace(still.find("-l 1e-4"), 7, "-l 0");
    int rc = run_cmd(still + "2", &out, &err);
    std::vector<float> va = grep_floats(out, "val loss ");
    check(rc == 0 && va.size() == 3 && va[0] == va[1] && va[1] == va[2], "-l 0: exit %d, the 3 val losses the same: %s", rc,
          va.size() == 3 ? format("%.6f %.6f %.6f", va[0], va[1], va[2]).c_str() : "(not 3 of them)");
    // -m asks for at most what the val file holds: -m 50 evaluates its 7 batches, not 50 with the first ones
    // again (llm.c's loader would wrap round to them)
    std::string all7 = still, ask50 = still, out7, out50;
    all7.replace(all7.find("-m 5"), 4, "-m 7");
    ask50.replace(ask50.find("-m 5"), 4, "-m 50");
    int rc7 = run_cmd(all7 + "2", &out7, nullptr), rc50 = run_cmd(ask50 + "2", &out50, nullptr);
    std::vector<float> v7 = grep_floats(out7, "val loss "), v50 = grep_floats(out50, "val loss ");
    check(rc7 == 0 && rc50 == 0 && v7.size() == 3 && v7 == v50 && v7[0] != va[0], "-m 50 on a val file of 7 batches: the val loss of -m 7 "
          "(%s), not of 50 batches that repeat (-m 5: %s)", v50.empty() ? "none" : format("%.6f", v50[0]).c_str(),
          va.empty() ? "none" : format("%.6f", va[0]).c_str());
}

// ----------------------------------------------------------------------------
// bad input: one line on stderr naming the problem, exit status 1, never a crash or a hang

static void test_bad_input() {
    printf("bad input: one clear line on stderr and exit status 1 (a bad flag: and a hint line)\n");
    std::string d = tmpdir() + "/bad";
    mkdir(d.c_str(), 0755);
    std::vector<int> ok_tokens = random_tokens(3000, 256, 3);
    write_tokens(d + "/ok.bin", ok_tokens);
    write_tokens(d + "/magic.bin", ok_tokens, 12345);
    write_tokens(d + "/version.bin", ok_tokens, 20240520, 2);
    write_tokens(d + "/version0.bin", ok_tokens, 20240520, 0);
    write_tokens(d + "/trunc.bin", ok_tokens, 20240520, 1, 5000);  // header claims more than the file has
    write_tokens(d + "/longer.bin", ok_tokens, 20240520, 1, 2999);  // bytes past the tokens the header promises
    write_tokens(d + "/short.bin", std::vector<int>(100, 1));
    write_tokens(d + "/short32.bin", std::vector<int>(32, 1));  // -b 2 -t 16 reads 33: one short
    std::vector<int> big = ok_tokens;
    big[1234] = 300;
    write_tokens(d + "/bigid.bin", big);
    big[1234] = 256;  // the first id past a vocab of 256: refused at startup as 300 is, not at the batch that reads it
    write_tokens(d + "/eqid.bin", big);
    FILE* f = fopen((d + "/empty.bin").c_str(), "wb");
    fclose(f);
    mkdir((d + "/dir.bin").c_str(), 0755);
    // checkpoints: a good one, and broken copies of it
    GPTConfig cfg = make_config(1, 2, 16, 256, 32);
    std::vector<float> init = init_weights(&cfg, 1);
    model_write((d + "/model.bin").c_str(), &cfg, init.data());
    std::string m = d + "/model.bin";
    auto patch = [&](const std::string& name, long offset, int value, long truncate_to) {
        std::string cmd = "cp " + m + " " + d + "/" + name;
        if (system(cmd.c_str()) != 0) return;
        FILE* g = fopen((d + "/" + name).c_str(), "r+b");
        if (offset >= 0) { fseek(g, offset, SEEK_SET); fwrite(&value, 4, 1, g); }
        fclose(g);
        if (truncate_to >= 0 && truncate((d + "/" + name).c_str(), truncate_to) != 0) perror("truncate");
    };
    patch("ck_magic.bin", 0, 7, -1);
    patch("ck_version.bin", 4, 7, -1);
    patch("ck_trunc.bin", -1, 0, 1024 + 100);
    patch("ck_short.bin", -1, 0, 10);
    patch("ck_header.bin", 24, 0, -1);  // C = 0
    patch("ck_huge.bin", 1024, 0x7f61b1e6, -1);  // wte[0][0] = 3e38: finite, so the loader takes it, but its logit overflows
    // tokenizer.json files tp cannot encode with: another model type, BPE that is not GPT-2's byte-level kind
    write_bytes(d + "/wp.json", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}");
    write_bytes(d + "/ws.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
                                "\"pre_tokenizer\": {\"type\": \"Whitespace\"}}");
    // and byte-level BPE ones whose merges are broken: one not "left right", one naming a token not in the vocab
    auto bpe_json = [&](const std::string& name, const char* merges) {
        std::string vocab;
        char e[32];
        for (int b = 0; b < 256; b++) {
            snprintf(e, sizeof(e), "\"\\u%04x\": %d", byte_to_unicode(b), b);
            vocab += (b ? ", " : "") + std::string(e);
        }
        write_bytes(d + "/" + name, "{\"model\": {\"type\": \"BPE\", \"vocab\": {" + vocab + ", \"ab\": 256}, \"merges\": [" + merges +
                                    "]}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}");
    };
    bpe_json("merge_ok.json", "\"a b\"");
    bpe_json("merge_form.json", "\"a b\", \"ab\"");
    bpe_json("merge_unknown.json", "\"a b\", \"b a\"");
    std::string data = " -i " + d + "/ok.bin -j " + d + "/ok.bin";
    std::string run = " -b 2 -t 16 -x 1 -v 0 -g 0 --threads 1";
    // flag: a bad command line, answered by the error line and a hint line (./tp --help), nothing on stdout
    struct { const char* what; std::string args; std::string expect; bool flag = false; } cases[] = {
        {"missing train file", "-i " + d + "/nope.bin -j " + d + "/ok.bin -e " + m + run, "no train data matches"},
        {"empty token file", "-i " + d + "/empty.bin -j " + d + "/ok.bin -e " + m + run, "shorter than the 1024-byte header"},
        {"truncated token file", "-i " + d + "/trunc.bin -j " + d + "/ok.bin -e " + m + run, "truncated or corrupt"},
        {"wrong-magic token file", "-i " + d + "/magic.bin -j " + d + "/ok.bin -e " + m + run, "not an llm.c token file"},
        {"wrong-version token file", "-i " + d + "/ok.bin -j " + d + "/version.bin -e " + m + run, "version 2"},
        {"version-0 token file", "-i " + d + "/version0.bin -j " + d + "/ok.bin -e " + m + run, "has version 0; tp reads version 1"},
        {"directory as token file", "-i " + d + "/dir.bin -j " + d + "/ok.bin -e " + m + run, "is a directory"},
        {"token id >= vocab", "-i " + d + "/bigid.bin -j " + d + "/ok.bin -e " + m + " -b 4 -t 32 --shuffle 0 -x 20 -v 0 -g 0", "token id 300"},
        {"token id == vocab", "-i " + d + "/eqid.bin -j " + d + "/ok.bin -e " + m + " -b 4 -t 32 --shuffle 0 -x 20 -v 0 -g 0",
         "holds token id 256 at token 1234, but the model's vocab has 256"},
        {"fewer tokens than one batch", "-i " + d + "/short.bin -j " + d + "/ok.bin -e " + m + run + " -b 8", "fewer than one batch"},
        {"one token fewer than one batch", "-i " + d + "/short32.bin -j " + d + "/ok.bin -e " + m + run, "has 32 tokens, fewer than one batch needs"},
        {"bytes past the promised tokens", "-i " + d + "/longer.bin -j " + d + "/ok.bin -e " + m + run, "but its header promises 2999 tokens"},
        {"missing checkpoint", "-e " + d + "/nope.bin" + data + run, "neither a readable checkpoint file nor a descriptor"},
        {"empty checkpoint", "-e " + d + "/empty.bin" + data + run, "shorter than its 1024-byte header"},
        {"short checkpoint", "-e " + d + "/ck_short.bin" + data + run, "shorter than its 1024-byte header"},
        {"truncated checkpoint", "-e " + d + "/ck_trunc.bin" + data + run, "truncated"},
        {"wrong-magic checkpoint", "-e " + d + "/ck_magic.bin" + data + run, "not an llm.c model file"},
        {"wrong-version checkpoint", "-e " + d + "/ck_version.bin" + data + run, "version 7"},
        {"checkpoint with an invalid header", "-e " + d + "/ck_header.bin" + data + run, "invalid header"},
        {"directory as checkpoint", "-e " + d + "/dir.bin" + data + run, "is a directory"},
        // a NaN loss at a run's first step comes from the weights, not from -l: the hint names the file instead
        {"checkpoint whose weights overflow", "-e " + d + "/ck_huge.bin" + data + run, "not finite before any update: the weights of " + d + "/ck_huge.bin"},
        // what a message quotes from the user stays on its line: control bytes as \xNN
        {"control bytes in a file name", "-e '" + d + "/no\nsuch\r.bin'" + data + run, "no\\x0asuch\\x0d.bin is neither"},
        {"T > maxT", "-e " + m + data + run + " -t 64", "exceeds the model's maximum 32"},
        {"B zero", "-b 0" + data + run, "out of range", true},
        {"T negative", "-t -5" + data + run, "out of range", true},
        {"P does not divide the heads", "-e " + m + data + " --tp 3" + run, "valid --tp values are 1, 2"},
        {"--sp 1 with P not dividing B*T", "-e " + m + data + " --tp 2 --sp 1 -b 3 -t 5 -x 1 -v 0 -g 0 --threads 1", "2 ranks do not divide them"},
        {"-r out of range", "-r 4", "out of range", true},
        {"-r 3 with fused attention", "-r 3" + data + run, "which fused attention (the default) never keeps: use -r 2, or --attention matmul -r 3"},
        {"bad --attention", "--attention flash", "takes fused or matmul, not 'flash'", true},
        {"head size over 128, fused", "-e L1C512H2" + data + run, "fused attention takes head sizes up to 128, and this model's is 256"},
        {"unknown flag", "--frobnicate 1", "unknown flag --frobnicate", true},
        {"flag missing its value", "-b", "needs a value", true},
        {"non-numeric value", "-b eight", "takes an integer, not 'eight'", true},
        {"non-numeric value, --flag=value", "--tp=two", "takes an integer, not 'two'", true},
        {"non-numeric float", "-l fast", "takes a number, not 'fast'", true},
        // strtod reads these as numbers; NaN passes every range check (each comparison with it is false)
        {"NaN as a float", "-l nan", "takes a number, not 'nan'", true},
        {"infinity as a float", "--clip inf", "takes a number, not 'inf'", true},
        {"float trailing junk", "-l 1e-3x", "takes a number, not '1e-3x'", true},
        {"integer trailing junk", "-x 12abc", "takes an integer, not '12abc'", true},
        {"out-of-range value", "-q 2", "out of range", true},
        {"bad device", "--device tpu", "takes auto, cpu or cuda", true},
        {"-i without -j", "-i " + d + "/ok.bin", "give both -i and -j", true},
        {"-y 1 with --fresh 1", "-y 1 --fresh 1 -o " + d + "/out", "give one of them", true},
        {"checkpoint disagrees with --vocab", "-e " + m + " --vocab 300" + data + run, "disagrees with checkpoint"},
        {"stray argument", "train.bin", "unexpected argument", true},
        {"bad descriptor", "-e d13", "not a GPT-2 size: the dN descriptors are d1..d12, d24, d36 and d48"},
        {"channels not a multiple of heads", "-e L3C130H4", "130 channels do not split into 4 heads of equal size"},
        {"heads that do not divide channels", "-e L3C128H3", "128 channels do not split into 3 heads of equal size"},
        {"-x 0 with -g 0", "-x 0 -g 0", "-g 0 asks for no tokens"},
        {"--dp 0", "--dp 0" + data + run, "out of range", true},
        {"-z 2", "-z 2" + data + run, "out of range", true},
        {"-d not a multiple of B x T x D", "-e " + m + data + run + " --dp 2 -d 100", "is not a multiple"},
        {"--tp 3 --dp 2 (heads)", "-e " + m + data + " --tp 3 --dp 2" + run, "valid --tp values are 1, 2"},
        {"--tp 2 --dp 40 (ranks)", "-e " + m + data + " --tp 2 --dp 40" + run, "more than the 64"},
        {"--plan custom without its figures", "--plan custom --plan-flops 100", "--plan custom needs --plan-flops"},
        {"--plan of an unknown box", "--plan h500", "--plan h500: not a box tp knows"},
        {"--plan with a missing -e", "--plan h100 -e " + d + "/nope.bin", "neither a readable checkpoint file nor a descriptor"},
        {"a WordPiece tokenizer.json", "-x 0 -g 4 --tokenizer " + d + "/wp.json", "is not a BPE tokenizer.json (model.type \"WordPiece\")"},
        {"BPE without the byte-level kind", "-x 0 -g 4 --tokenizer " + d + "/ws.json", "not GPT-2's byte-level kind (pre-tokenizer \"Whitespace\")"},
        {"a merge not \"left right\"", "-x 0 -g 4 --tokenizer " + d + "/merge_form.json", "merge 1 is neither \"left right\" nor [left, right]"},
        {"training the embedded corpus with a BPE tokenizer", "-x 1 -v 0 -b 2 -t 16 -g 0 --tokenizer " + d + "/merge_ok.json",
         "is a BPE tokenizer, but with no -i the run trains on the embedded corpus, tp's own words"},
        {"--vocab against a tokenizer.json's", "-x 0 -g 4 --vocab 300 --tokenizer " + d + "/merge_ok.json",
         "--vocab 300 disagrees with tokenizer " + d + "/merge_ok.json (--tokenizer, vocab 257): drop --vocab"},
        {"a merge of a token not in the vocab", "-x 0 -g 4 --tokenizer " + d + "/merge_unknown.json", "merge 1 (\"b\" \"a\") names a token that is not in the vocab"},
    };
    {
        std::string out, err;
        int rc = run_cmd("-x 0 -g 4 --vocab 257 --tokenizer " + d + "/merge_ok.json", &out, &err);
        check(rc == 0 && err.empty(), "the same tokenizer.json with its merges whole samples (exit %d)%s", rc, err.c_str());
        // -x 0 of a new model reads no data: without --vocab it takes the tokenizer's, and its prompt encodes
        rc = run_cmd("-x 0 -g 4 --prompt abab --tokenizer " + d + "/merge_ok.json", &out, &err);
        check(rc == 0 && err.empty() && out.find("vocab 257 (padded 384; from tokenizer " + d + "/merge_ok.json, --tokenizer)") != std::string::npos &&
                  out.find("prefill 2 tokens") != std::string::npos,
              "-x 0 with a tokenizer.json and no --vocab: the model takes its vocab, 257, and \"abab\" is 2 tokens (exit %d)%s", rc, err.c_str());
    }
    for (auto& c : cases) {
        std::string out, err;
        int rc = run_cmd(c.args, &out, &err);
        int lines = (int)std::count(err.begin(), err.end(), '\n');
        bool found = err.find(c.expect) != std::string::npos && err.rfind("error: ", 0) == 0;
        // a bad flag: the hint is the second line, and the help is not dumped on stdout
        bool hint = !c.flag || (err.find("\n./tp --help lists the flags\n") != std::string::npos && out.empty());
        std::string shown = err.substr(0, err.find('\n'));
        check(rc == 1 && lines == (c.flag ? 2 : 1) && found && hint, "%-34s exit %d, %d stderr line%s: %s", c.what, rc, lines,
              lines > 1 ? "s" : "", shown.c_str());
    }
    // a token file changed while tp runs: every batch is checked again as it is read (startup checked the
    // file as it was then). 3 batches of 2 x 16 in order, epoch after epoch; once a run is under way the
    // file's last token, the last batch's last target and in no other batch, becomes 300 (vocab 256)
    {
        std::vector<int> toks = random_tokens(3 * 32 + 1, 256, 9);
        write_tokens(d + "/changing.bin", toks);
        pid_t pid = spawn_tp("-i " + d + "/changing.bin -j " + d + "/ok.bin -e " + m + " -b 2 -t 16 --shuffle 0 -x 1000000 -v 0 -g 0 --threads 1",
                             d + "/changing.txt");
        bool started = wait_for_text(d + "/changing.txt", "step    5/", 60);
        FILE* f = fopen((d + "/changing.bin").c_str(), "r+b");
        uint16_t bad = 300;
        if (f) {
            fseek(f, 1024 + 2 * 96, SEEK_SET);
            fwrite(&bad, 2, 1, f);
            fclose(f);
        }
        int status = wait_exit(pid, 60);
        std::vector<char> eb = slurp_bytes(d + "/changing.txt.err");
        std::string said(eb.begin(), eb.end());
        check(started && WIFEXITED(status) && WEXITSTATUS(status) == 1 && std::count(said.begin(), said.end(), '\n') == 1 &&
                  said.find("changed while tp was running: it now holds token id 300 at token 96, beyond the vocab of 256") != std::string::npos,
              "a token file changed under a run (its last token, a target only): exit %d: %s", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
              said.substr(0, said.find('\n')).c_str());
    }
    // a near miss gets a suggestion in the hint line
    std::string out, err;
    int rc = run_cmd("--temprature 0.5", &out, &err);
    check(rc == 1 && err.find("error: unknown flag --temprature\ndid you mean --temperature? (./tp --help lists the flags)\n") == 0 &&
          out.empty(), "a misspelt flag: %s", err.c_str());
}

static void test_sample_cli() {
    printf("samples: -x 0 samples a checkpoint at any --tp, control bytes escaped, Ctrl-C in an evaluation or a sample\n");
    std::string d = tmpdir() + "/samplecli";
    mkdir(d.c_str(), 0755);
    // streamed text (stream_text, as tokens' bytes arrive): after each piece it has printed exactly the bytes
    // so far up to the last whole UTF-8 character, so no character is split between two writes (escape_text
    // would show the halves as \xNN); 1- to 4-byte characters fed 1, 2 and 3 bytes at a time
    {
        const std::string text = "a \xc3\xa9\xe2\x82\xac\xf0\x9f\x99\x82 z\xf0\x9f\x99\x83\xc3\xbc \xe2\x82\xac\xe2\x82\xac \xf0\x9f\x99\x82";
        const std::string path = d + "/stream.txt";
        int pieces = 0, off = 0;
        for (size_t step : {1, 2, 3}) {
            fflush(stdout);
            int saved = dup(1), fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (saved < 0 || fd < 0 || dup2(fd, 1) < 0) {  // stdout stays where it was
                if (saved >= 0) close(saved);
                if (fd >= 0) close(fd);
                off++;
                break;
            }
            std::string pending;
            for (size_t at = 0; at < text.size(); at += step) {
                stream_text(&pending, text.substr(at, step));
                struct stat st;
                size_t fed = std::min(text.size(), at + step), whole = fed;  // the last character boundary at or before fed
                while (whole > 0 && whole < text.size() && ((unsigned char)text[whole] & 0xc0) == 0x80) whole--;
                pieces++;
                off += fstat(fd, &st) != 0 || (size_t)st.st_size != whole;
            }
            fflush(stdout);
            dup2(saved, 1);
            close(saved);
            close(fd);
            std::vector<char> got = slurp_bytes(path);
            off += std::string(got.begin(), got.end()) != text;
        }
        check(pieces > 0 && off == 0, "streamed text: after each of %d pieces (a byte, 2 or 3 at a time) exactly the whole UTF-8 "
              "characters so far are printed, and at the end the text: %d disagree", pieces, off);
    }
    // escape_text, the last step before the terminal: every code point in UTF-8 is printed as it is, except
    // the control characters (C0 but newline and tab, DEL, C1) and the UTF-16 surrogates, which are not
    // characters; those, and every byte of an encoding that is not valid UTF-8 (overlong forms, past U+10FFFF,
    // a stray continuation byte, a sequence cut short), become \xNN, one a byte
    {
        auto utf8 = [](uint32_t cp, int len) {  // cp in len bytes (overlong when longer than it needs)
            std::string s;
            if (len == 1) return std::string(1, (char)cp);
            static const unsigned char lead[5] = {0, 0, 0xc0, 0xe0, 0xf0};
            s += (char)(lead[len] | (cp >> (6 * (len - 1))));
            for (int k = len - 2; k >= 0; k--) s += (char)(0x80 | ((cp >> (6 * k)) & 0x3f));
            return s;
        };
        auto escaped = [](const std::string& s) {
            std::string e;
            char hex[8];
            for (unsigned char b : s) snprintf(hex, sizeof(hex), "\\x%02x", b), e += hex;
            return e;
        };
        long tried = 0, wrong = 0;
        std::string first;
        auto expect = [&](const std::string& in, const std::string& want) {
            tried++;
            if (escape_text(in) != want && wrong++ == 0) first = escaped(in) + " -> " + escape_text(in);
        };
        for (uint32_t cp = 0; cp <= 0x10ffff; cp++) {
            std::string c = utf8(cp, cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4);
            bool control = (cp < 0x20 && cp != '\n' && cp != '\t') || cp == 0x7f || (cp >= 0x80 && cp < 0xa0);
            bool surrogate = cp >= 0xd800 && cp < 0xe000;
            expect("a" + c + "z", "a" + (control || surrogate ? escaped(c) : c) + "z");
            if (cp < 0x80 && cp > 0) expect(utf8(cp, 2), escaped(utf8(cp, 2)));      // overlong in 2 bytes
            if (cp < 0x800) expect(utf8(cp, 3), escaped(utf8(cp, 3)));               // in 3
            if (cp < 0x10000 && cp % 7 == 0) expect(utf8(cp, 4), escaped(utf8(cp, 4)));  // in 4
        }
        for (uint32_t cp = 0x110000; cp < 0x140000; cp += 13) expect(utf8(cp, 4), escaped(utf8(cp, 4)));  // past U+10FFFF
        for (int b = 0x80; b < 0x100; b++) expect(std::string(1, (char)b) + "a", escaped(std::string(1, (char)b)) + "a");  // alone
        for (uint32_t cp : {0xe9u, 0x20acu, 0x1f642u}) {  // cut short before an ASCII letter
            std::string c = utf8(cp, cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4);
            for (size_t cut = 1; cut < c.size(); cut++) expect(c.substr(0, cut) + "a", escaped(c.substr(0, cut)) + "a");
        }
        check(tried > 1000000 && wrong == 0, "escape_text: every code point (C0, DEL, C1 and surrogates escaped, the rest as they are), "
              "overlong forms, past U+10FFFF, stray and cut-short bytes: %ld strings, %ld wrong%s%s", tried, wrong,
              wrong ? ", first " : "", first.c_str());
    }
    // -s 2 over 5 steps: a sample after steps 2 and 4 and one at the end, none before the first step (llm.c's
    // cadence: step > 0)
    {
        std::string out;
        int rc = run_cmd("-e L1C32H2 -b 2 -t 32 -x 5 -v 0 -g 8 -s 2 --threads 1", &out, nullptr);
        std::string when;
        for (size_t at = out.find("sample after "); at != std::string::npos; at = out.find("sample after ", at + 1))
            when += (when.empty() ? "" : ",") + std::to_string(atoi(out.c_str() + at + 13));
        check(rc == 0 && when == "2,4,5", "-s 2 -x 5: samples after steps %s (2, 4 and the end; none at step 0)", when.c_str());
    }
    GPTConfig cfg = make_config(2, 4, 64, 256, 64);
    std::vector<float> w = init_weights(&cfg, 13);
    for (auto& x : w) x *= 4.0f;
    model_write((d + "/model.bin").c_str(), &cfg, w.data());
    std::string first;
    bool same = true;
    for (int P : {1, 2, 4}) {
        std::string out, err;
        int rc = run_cmd("-e " + d + "/model.bin -x 0 -g 60 -t 64 --temperature 1 --threads 1 --tp " + std::to_string(P), &out, &err);
        std::string sample = out.substr(std::min(out.size(), out.find("---")));
        if (P == 1) first = sample;
        same &= rc == 0 && sample == first && sample.size() > 60 && out.find("step") == std::string::npos;
    }
    check(same, "-x 0 -e model.bin prints the same sample at --tp 1, 2, 4 and trains nothing");
    // a model of GPT-2's vocab and no tokenizer to decode with: the sample is its token ids, each in the vocab
    {
        std::string o;
        int r = run_cmd("-e L1C16H2 --vocab 50257 -x 0 -g 6 --threads 1", &o, nullptr);
        std::vector<std::string> t = sample_texts(o);
        std::istringstream in(t.empty() ? "x" : t[0]);
        int n = 0, bad = t.empty() || t[0].find_first_not_of("0123456789 ") != std::string::npos;
        for (long id; in >> id; n++) bad += id < 0 || id >= 50257;
        check(r == 0 && n == 6 && bad == 0, "--vocab 50257 without a tokenizer: the sample is %d token ids in the vocab (exit %d): %s", n, r,
              t.empty() ? "(none)" : t[0].c_str());
    }
    std::string out, err;
    int rc = run_cmd("-e L1C32H2 -b 2 -t 32 -x 3 -v 0 -g 10 --threads 1 -o " + d + "/done", nullptr, nullptr);
    rc = run_cmd("-y 1 --threads 1 -o " + d + "/done", &out, &err);
    check(rc == 0 && out.find("is finished (step 3 of 3)") != std::string::npos && out.find("sample after 3 steps") != std::string::npos &&
          ckpt_steps((d + "/done").c_str()) == std::vector<int>({3}), "-y 1 on a finished run samples it and exits 0 (exit %d)", rc);
    // an untrained model at a high temperature draws bytes of every kind; the terminal sees none of the control ones
    rc = run_cmd("-e L1C32H2 -x 0 -g 2000 -t 32 --temperature 50 --threads 1 --prompt \"$(printf 'A\\033[31mB')\"", &out, &err);
    int raw = 0;
    for (unsigned char ch : out) raw += (ch < 0x20 && ch != '\n' && ch != '\t') || ch == 0x7f;
    check(rc == 0 && raw == 0 && out.find("---\nA\\x1b[31mB") != std::string::npos && out.find("\\x") != std::string::npos,
          "2000 random bytes and an ESC in the prompt: %d raw control bytes on stdout, escapes as \\xNN (exit %d)", raw, rc);
    // Ctrl-C in a long evaluation (200000 val batches) and in a long sample: said at once, obeyed within a second.
    // The evaluation at --tp 1 and 2: its ranks agree to stop through a sum of their flags, which one rank
    // alone must also obey (the default --tp is one rank per core, so a 2-core machine would test only 2).
    struct { const char* what; std::string args; const char* wait; const char* said; const char* then; } cases[] = {
        {"an evaluation at --tp 1", "-e L1C16H2 -b 1 -t 16 -m 200000 -v 1 -x 5 -g 0 --tp 1 --threads 1 -o " + d + "/sig1",
         "data: the embedded corpus", "tp: stopping after this evaluation batch", "interrupted before the first step"},
        {"an evaluation at --tp 2", "-e L1C16H2 -b 1 -t 16 -m 200000 -v 1 -x 5 -g 0 --tp 2 --threads 1 -o " + d + "/sig2",
         "data: the embedded corpus", "tp: stopping after this evaluation batch", "interrupted before the first step"},
        {"a sample", "-e " + d + "/model.bin -x 0 -g 1000000 -t 64 --threads 1", "tp: no training", "tp: stopping this sample", "(interrupted)"},
    };
    for (auto& c : cases) {
        std::string path = d + "/sig_" + std::to_string(&c - cases) + ".txt";
        pid_t pid = spawn_tp(c.args, path);
        bool started = wait_for_text(path, c.wait, 30);
        usleep(getenv("TP_BIN") ? 3000000 : 1000000);  // into the evaluation or the sample (sanitizer builds start slower)
        double t0 = comm_now();
        kill(pid, SIGINT);
        int status = wait_exit(pid, 30);
        double sec = comm_now() - t0;
        std::vector<char> b = slurp_bytes(path);
        std::string o(b.begin(), b.end());
        bool ok = started && WIFEXITED(status) && WEXITSTATUS(status) == 0 && o.find(c.said) != std::string::npos &&
                  o.find(c.then) != std::string::npos;
        check_le(ok ? sec : INFINITY, 2.0, "Ctrl-C in %s: '%s', exit %d, seconds to stop", c.what, c.said,
                 WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    }
}

// Whether a default as the docs write it ("6e-3", "fused", "0: B x T x replicas") is the flag's default in
// Args (its text, d). A number is compared as a number (6e-3 is the float 0.006), an enum as its word. A
// default the docs describe in words (the vocab's "from the data ...") or a flag whose default is unset (a
// path, -e's descriptor) has nothing to compare: *compared says whether it was.
static bool doc_default_agrees(const FlagSpec* f, const Args* d, const std::string& doc, bool* compared) {
    *compared = false;
    std::string want = flag_text(d, f, false);
    if (f->type == FLAG_STR || f->type == FLAG_PATH) return true;  // unset by default: the docs say what that means
    bool number = f->type == FLAG_INT || f->type == FLAG_LONG || f->type == FLAG_FLOAT || f->type == FLAG_DOUBLE;
    if (number) {
        char* end = nullptr;
        double x = strtod(doc.c_str(), &end);
        if (end == doc.c_str()) return true;  // described in words
        *compared = true;
        double y = strtod(want.c_str(), nullptr);
        return fabs(x - y) <= 1e-6 * fabs(y);
    }
    *compared = true;
    return doc.compare(0, want.size(), want) == 0 && (doc.size() == want.size() || !isalnum((unsigned char)doc[want.size()]));
}

// The flags a line of ./tp --help names at its start ("  --beta1 B1  --beta2 B2     AdamW betas"): each flag
// and the word after it (its value), until a word that is neither
static std::vector<std::string> help_entry_flags(const std::string& line) {
    std::vector<std::string> names;
    std::istringstream words(line);
    std::string w;
    bool value_next = false;
    while (words >> w) {
        if (w[0] == '-' && w.size() > 1) names.push_back(w), value_next = true;
        else if (value_next) value_next = false;
        else break;
    }
    return names;
}

static void test_flags_ux() {
    printf("flags: --flag=value, wording at --tp 1, the CUDA fallback line, saved numbers read back to the bit\n");
    // A state file saves every flag as text (flag_text, exact) and a resume reads it back (flag_set): each
    // number must come back as the same bits, or a resumed run would not be the run it continues. A float
    // needs 9 significant digits for that (8 lose some), a double 17. Values spread over each flag's range
    // on a log scale, and its ends.
    {
        Rng rng = {2026};
        int flags = 0, values = 0, differ = 0;
        std::string first;
        for (const FlagSpec& f : g_flags) {
            if (f.type != FLAG_FLOAT && f.type != FLAG_DOUBLE) continue;
            flags++;
            double lo = std::max(f.lo, 1e-12), hi = f.hi;
            for (int i = 0; i < 3000; i++) {
                double x = i == 0 ? f.lo : i == 1 ? hi : exp(log(lo) + rng_uniform(&rng) * (log(hi) - log(lo)));
                Args a = Args(), b = Args();
                if (f.type == FLAG_FLOAT) {
                    float v = (float)x;
                    if (v > hi) v = std::nextafter(v, 0.0f);  // a float at the range's end, inside it
                    *(float*)((char*)&a + f.offset) = v;
                } else {
                    *(double*)((char*)&a + f.offset) = x;
                }
                std::string text = flag_text(&a, &f, true);
                flag_set(&b, &f, text.c_str());
                size_t n = f.type == FLAG_FLOAT ? sizeof(float) : sizeof(double);
                bool same = memcmp((char*)&a + f.offset, (char*)&b + f.offset, n) == 0;
                values++;
                if (!same && differ++ == 0) first = std::string(f.name) + " " + text;
            }
        }
        check(flags >= 10 && differ == 0, "every float and double flag (%d) saved as text and read back: %d values, %d not the same bits%s%s",
              flags, values, differ, differ ? ", first " : "", first.c_str());
    }
    // ./tp --help and the README's table of flags against the flag table: every flag there, and every
    // default they state the parser's own (the defaults from parse_args with no flags)
    {
        Args d;
        char prog[] = "tp";
        char* argv0[] = {prog, nullptr};
        parse_args(1, argv0, &d);
        std::string help, herr;
        int rc = run_cmd("--help", &help, &herr);
        // the entries: a line "  -x ..." and the lines under it, indented further
        std::map<std::string, std::string> help_default;  // flag -> the default its entry states
        std::set<std::string> help_names;
        std::vector<std::string> lines;
        for (std::istringstream in(help); std::getline(in, lines.emplace_back());) {}
        for (size_t i = 0; i < lines.size(); i++) {
            if (lines[i].compare(0, 3, "  -") != 0) continue;
            std::string entry = lines[i];
            for (size_t j = i + 1; j < lines.size() && lines[j].compare(0, 3, "   ") == 0; j++) entry += " " + lines[j];
            std::vector<std::string> names = help_entry_flags(lines[i]);
            help_names.insert(names.begin(), names.end());
            size_t at = entry.find("(default ");
            if (at == std::string::npos) continue;
            std::string text = entry.substr(at + 9, entry.find(')', at) - at - 9);
            for (size_t k = 0; k < names.size(); k++) {  // "0.9, 0.95": one a flag, in order
                size_t from = 0;
                for (size_t skip = 0; skip < k && from != std::string::npos; skip++) from = text.find(", ", from) + 2;
                if (from != std::string::npos && from <= text.size()) help_default[names[k]] = text.substr(from);
            }
        }
        // the README's table: | `-b`, `-t` | meaning | 8, 128 |
        std::vector<char> rb = slurp_bytes("README.md");
        std::string readme(rb.begin(), rb.end());
        std::map<std::string, std::string> readme_default;
        std::set<std::string> readme_names;
        size_t table = readme.find("| flag | meaning | default |");
        for (size_t at = table; at != std::string::npos && at < readme.size() && readme[at] == '|';) {
            size_t eol = readme.find('\n', at);
            std::string row = readme.substr(at, eol == std::string::npos ? std::string::npos : eol - at);
            at = eol == std::string::npos ? eol : eol + 1;
            size_t c1 = row.find('|', 1), c3 = row.rfind('|', row.size() - 2);
            if (c1 == std::string::npos || c3 == std::string::npos || c3 <= c1) continue;
            std::vector<std::string> names;
            for (size_t b = row.find('`'); b != std::string::npos && b < c1; b = row.find('`', row.find('`', b + 1) + 1)) {
                std::string item = row.substr(b + 1, row.find('`', b + 1) - b - 1);
                if (item.size() > 1 && item[0] == '-') names.push_back(item.substr(0, item.find(' ')));
            }
            for (size_t b = row.find('`'); b != std::string::npos; b = row.find('`', row.find('`', b + 1) + 1)) {
                std::string item = row.substr(b + 1, row.find('`', b + 1) - b - 1);
                if (item.size() > 1 && item[0] == '-') readme_names.insert(item.substr(0, item.find(' ')));
            }
            std::string text = row.substr(c3 + 1);
            text = text.substr(0, text.rfind('|'));
            while (!text.empty() && text[0] == ' ') text.erase(0, 1);
            while (!text.empty() && text.back() == ' ') text.pop_back();
            std::vector<std::string> values;
            for (size_t from = 0; from <= text.size();) {
                size_t comma = text.find(", ", from);
                std::string v = text.substr(from, comma == std::string::npos ? std::string::npos : comma - from);
                if (v.size() > 1 && v[0] == '`' && v.back() == '`') v = v.substr(1, v.size() - 2);  // `words`
                values.push_back(v);
                if (comma == std::string::npos) break;
                from = comma + 2;
            }
            if (values.size() == names.size())
                for (size_t k = 0; k < names.size(); k++) readme_default[names[k]] = values[k];
        }
        int missing_help = 0, missing_readme = 0, compared = 0, differ = 0;
        std::string what;
        for (const FlagSpec& f : g_flags) {
            // a flag named in an entry of --help (the --plan entry's --plan-flops ... count as named in it)
            bool in_help = help_names.count(f.name) || (strncmp(f.name, "--plan-", 7) == 0 && help.find(std::string(f.name) + " ") != std::string::npos);
            if (!in_help && missing_help++ == 0) what += std::string(", not in --help: ") + f.name;
            if (!readme_names.count(f.name)) what += std::string(missing_readme++ ? " " : ", not in the README's table: ") + f.name;
            for (int doc = 0; doc < 2; doc++) {
                const std::map<std::string, std::string>& m = doc ? readme_default : help_default;
                auto it = m.find(f.name);
                if (it == m.end()) continue;
                bool was = false;
                bool ok = doc_default_agrees(&f, &d, it->second, &was);
                compared += was;
                if (!ok && differ++ == 0)
                    what += std::string(", ") + (doc ? "the README" : "--help") + " says " + f.name + " " + it->second + ", the parser " + flag_text(&d, &f, false);
            }
        }
        // and nothing listed that the parser does not take
        int unknown = 0;
        for (const std::set<std::string>* s : {&help_names, &readme_names})
            for (const std::string& n : *s)
                if (!flag_find(n.c_str()) && n != "--help" && n != "-h" && n != "--version" && unknown++ == 0) what += ", no such flag: " + n;
        check(rc == 0 && herr.empty() && table != std::string::npos && help_names.size() >= (size_t)NUM_FLAGS - 5 && missing_help == 0 &&
              missing_readme == 0 && unknown == 0 && compared >= 50 && differ == 0,
              "./tp --help (exit %d) and the README's flag table name all %d flags and no other; %d defaults they state are the "
              "parser's, %d not%s", rc, NUM_FLAGS, compared, differ, what.c_str());
    }
    std::string out1, out2, err;
    std::string base = "-e L1C32H2 -b 2 -t 32 -x 3 -v 2 -m 1 -g 0 --threads 1";
    int rc1 = run_cmd(base + " --tp 2 --seed 5 --clip 0.5", &out1, nullptr);
    int rc2 = run_cmd(base + " --tp=2 --seed=5 --clip=0.5", &out2, nullptr);
    std::vector<float> a = grep_floats(out1, "| loss "), b = grep_floats(out2, "| loss ");
    check(rc1 == 0 && rc2 == 0 && a.size() == 3 && a == b, "--tp=2 --seed=5 --clip=0.5 gives the same losses as --tp 2 --seed 5 --clip 0.5");
    int rc = run_cmd(base + " --tp 1", &out1, &err);
    std::string table = first_line_with(out1, "memory per rank");
    bool one = out1.find("tp: 1 rank on the CPU with 1 thread;") != std::string::npos && table.find("TP=1") != std::string::npos &&
               table.find("TP=", table.find("TP=1") + 1) == std::string::npos && out1.find("communication: none (one rank)") != std::string::npos &&
               out1.find("communication per step") == std::string::npos && out1.find("comm ") == std::string::npos &&
               out1.find("collectives") == std::string::npos;
    check(rc == 0 && one, "--tp 1: one rank, one memory column, no communication claimed (exit %d): %s", rc, first_line_with(out1, "rank").c_str());
    // a CUDA driver that is there but unusable (here: a library named libcuda.so.1 that is not one)
    std::string d = tmpdir() + "/fakecuda";
    mkdir(d.c_str(), 0755);
    if (run_sh("cc -shared -fPIC -o " + d + "/libcuda.so.1 -x c /dev/null", nullptr) != 0) {
        printf("  skip the CUDA fallback line: no C compiler to make a stand-in libcuda.so.1\n");
        g_skipped++;
        return;
    }
    bool quiet = out1.find("CUDA") == std::string::npos;
    rc = run_sh("LD_LIBRARY_PATH=" + d + " " + tp_bin() + " -x 1 -v 0 -g 0 -e L1C16H2 -b 1 -t 8 --threads 1", &out2);
    check(rc == 0 && quiet && out2.find("tp: a CUDA driver is installed but cannot be used (") != std::string::npos &&
          out2.find("running on the CPU") != std::string::npos && out2.find("ranks on the CPU") != std::string::npos,
          "--device auto with an unusable CUDA driver says so in one line and trains on the CPU; with none, says nothing: %s",
          first_line_with(out2, "CUDA").c_str());
}

static void test_build() {
    printf("build: make builds ./tp alone, -Werror only with WERROR=1, GPU code for each GPU model and PTX, NCCL where it is\n");
    std::string out;
    int rc = run_sh("env -u WERROR make -n -B", &out);  // as a learner types it (CI exports WERROR=1)
    check(rc == 0 && out.find("-o tp tp.cu") != std::string::npos && out.find("test_tp") == std::string::npos && out.find("-Werror") == std::string::npos,
          "make: builds tp only, without -Werror (exit %d)", rc);
    rc = run_sh("make -n -B WERROR=1 test_tp", &out);
    check(rc == 0 && out.find("-Werror all-warnings") != std::string::npos && out.find("-o test_tp") != std::string::npos,
          "make WERROR=1 test_tp: -Werror all-warnings (exit %d)", rc);
    // nvidia-smi stand-ins: a machine with two GPU models (one listed twice), and one whose nvidia-smi fails
    std::string d = tmpdir() + "/smi";
    struct { const char* what; const char* script; const char* want; } cases[] = {
        {"GPUs 8.6, 9.0, 8.6", "printf '8.6\\n9.0\\n8.6\\n'",
         "-gencode arch=compute_86,code=sm_86 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 -X"},
        {"nvidia-smi failing with a message", "echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'; exit 9",
         "-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 -X"},
    };
    for (int i = 0; i < 2; i++) {
        std::string bin = d + std::to_string(i);
        mkdir(bin.c_str(), 0755);
        FILE* f = fopen((bin + "/nvidia-smi").c_str(), "w");
        fprintf(f, "#!/bin/sh\n%s\n", cases[i].script);
        fclose(f);
        chmod((bin + "/nvidia-smi").c_str(), 0755);
        rc = run_sh("PATH=" + bin + ":$PATH make -n -B tp", &out);
        check(rc == 0 && out.find(cases[i].want) != std::string::npos && out.find("NVIDIA") == std::string::npos,
              "%s: %s", cases[i].what, first_line_with(out, "-gencode").substr(first_line_with(out, "-gencode").find("-gencode")).substr(0, 140).c_str());
    }
    // NCCL from a folder of its own: NCCL_DIR, or pip's nvidia-nccl package (found through python3 when the
    // toolkit and the system have no nccl.h; NCCL_HEADERS= stands for such a machine). Its header, its library
    // by the name the folder has (pip's holds only libnccl.so.2), and the folder as the binaries' run path.
    std::string pip = tmpdir() + "/pip", nd = pip + "/nvidia/nccl", own = tmpdir() + "/ncclown", none = tmpdir() + "/ncclnone";
    run_sh("mkdir -p " + nd + "/include " + nd + "/lib " + own + "/include " + own + "/lib64 " + none + " && touch " + nd + "/include/nccl.h " +
           nd + "/lib/libnccl.so.2 " + own + "/include/nccl.h " + own + "/lib64/libnccl.so.2 && ln -sf libnccl.so.2 " + own + "/lib64/libnccl.so", nullptr);
    std::string pip_link = "-I" + nd + "/include ", pip_lib = "-L" + nd + "/lib -l:libnccl.so.2 -Xlinker -rpath," + nd + "/lib ";
    rc = run_sh("env -u NCCL_DIR make -n -B tp NCCL_DIR=" + nd, &out);
    check(rc == 0 && out.find(pip_link) != std::string::npos && out.find(pip_lib) != std::string::npos && out.find(" -lnccl") == std::string::npos,
          "make NCCL_DIR=<pip's folder>: its header, libnccl.so.2 by name, its run path (exit %d)", rc);
    rc = run_sh("env -u NCCL_DIR PYTHONPATH=" + pip + " make -n -B tp NCCL_HEADERS=", &out);
    check(rc == 0 && out.find(pip_link) != std::string::npos && out.find(pip_lib) != std::string::npos,
          "no nccl.h in the toolkit or the system: make finds pip's NCCL through python3 (exit %d)", rc);
    rc = run_sh("env -u NCCL_DIR make -n -B tp NCCL_DIR=" + own, &out);
    check(rc == 0 && out.find("-I" + own + "/include ") != std::string::npos &&
          out.find("-L" + own + "/lib64 -lnccl -Xlinker -rpath," + own + "/lib64 ") != std::string::npos,
          "make NCCL_DIR=<a build with lib64/libnccl.so>: -lnccl from lib64 (exit %d)", rc);
    rc = run_sh("env -u NCCL_DIR make --no-print-directory toolkit NCCL_DIR=" + nd, &out);
    check(out.find("libnccl:       " + nd + "/lib/libnccl.so.2 (NCCL_DIR)\n") != std::string::npos &&
          out.find("nccl.h:        " + nd + "/include/nccl.h\n") != std::string::npos, "make toolkit NCCL_DIR=<pip's folder> names its files");
    rc = run_sh("env -u NCCL_DIR make --no-print-directory toolkit NCCL_DIR=" + none, &out);
    check(rc != 0 && out.find("libnccl:       MISSING") != std::string::npos && out.find("nccl.h:        MISSING") != std::string::npos &&
          out.find("toolkit: incomplete") != std::string::npos, "make toolkit NCCL_DIR=<an empty folder>: both MISSING, exit %d", rc);
    // the toolkit's own NCCL (CI's CUDA 13 has it): linked by name with no run path, as before NCCL_DIR existed
    if (access("/usr/local/cuda/include/nccl.h", F_OK) == 0) {
        rc = run_sh("env -u NCCL_DIR make -n -B tp", &out);
        check(rc == 0 && out.find(" -lnccl ") != std::string::npos && out.find("rpath") == std::string::npos,
              "the toolkit's NCCL: -lnccl, no run path (exit %d)", rc);
    }
}

// The README's "What you see" shows the default run's real output: its first val loss (the model before
// any step, on the val text) must be what this ./tp prints, so that the README cannot go stale. The
// README's run is on 2 cores (--tp 2); one step is enough to print it.
static void test_readme() {
    printf("README: the first val-loss line of \"What you see\" against the default run\n");
    if (skip_under_tsan("readme")) return;
    std::vector<char> rb = slurp_bytes("README.md");
    std::string readme(rb.begin(), rb.end()), want;
    size_t at = readme.find("## What you see");
    // the README shows a CPU with AVX512-BF16, where the default (--dtype auto) is bf16, and gives the first
    // val line of an AVX2 CPU's build, which runs fp32; an AVX-512 CPU without AVX512-BF16 runs fp32 in
    // other last bits, which the README does not give
#if defined(__AVX2__) && !defined(__AVX512F__)
    const bool avx2_build = true;
#else
    const bool avx2_build = false;
#endif
    if (bf16_dp_supported()) {
        size_t line = at == std::string::npos ? at : readme.find("\nval loss ", at);
        if (line != std::string::npos) want = readme.substr(line + 1, readme.find('\n', line + 1) - line - 1);
    } else if (avx2_build) {
        size_t avx2 = at == std::string::npos ? at : readme.find("On a 2-core AVX2 CPU", at);
        size_t line = avx2 == std::string::npos ? avx2 : readme.find("`val loss ", avx2);
        if (line != std::string::npos) want = readme.substr(line + 1, readme.find('`', line + 1) - line - 1);
    } else {
        printf("  skip the README's default run: this CPU has AVX-512 without AVX512-BF16, whose fp32 bits the README does not give\n");
        g_skipped++;
        return;
    }
    std::string out, err;
    int rc = run_cmd("-x 1 -g 0 --tp 2 --dtype auto", &out, &err);
    std::string got = first_line_with(out, "val loss ");
    check(rc == 0 && !want.empty() && got == want, "README's first val loss '%s' is what ./tp prints: '%s' (exit %d)", want.c_str(),
          got.c_str(), rc);
}
