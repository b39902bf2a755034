// dev/test_serve.cuh: serving from the KV cache (gpt.cu's gpt_prefill and gpt_decode, train/serve.h),
// included by test_tp.cu after its harness. The logits of every decode step against the full forward at
// TP = 1, 2, 4 with and without --sp 1, greedy tokens against the whole-forward sampler, batched prompts
// against each prompt alone, the cache sliding past Tmax, the interactive mode through a pipe; and, in the
// gpu group, the cache ops' CUDA kernels against their CPU twins and the logits test on the GPU.
#pragma once
#include <poll.h>

// P rank threads on g_device, each with the model built from init (sp: --sp 1); body(rank, model) runs
// in every one of them
static void serve_ranks(const GPTConfig* cfg, const std::vector<float>& init, int P, bool sp,
                        const std::function<void(Rank*, GPT*)>& body) {
    CommGroup* g = new CommGroup();
    comm_group_init(g, P, 60);
    std::vector<std::thread> th;
    for (int r = 0; r < P; r++)
        th.emplace_back([&, r]() {
            Rank rk;
            rank_init(&rk, g, r, g_device, 0, 1);
            if (g_device == DEV_CUDA) cuda_set_tf32(&rk.cuda, g_tf32);
            GPT m;
            gpt_build(&m, &rk, cfg, init.data(), 0);
            m.sp = sp;
            body(&rk, &m);
            gpt_free(&m, &rk);
            rank_free(&rk);
        });
    for (auto& t : th) t.join();
    delete g;
}

// the largest |a - b| over the first V of a row, relative to the largest |b|
static double row_rel_err(const float* a, const float* b, int V) {
    double err = 0, scale = 0;
    for (int i = 0; i < V; i++) {
        err = std::max(err, (double)fabsf(a[i] - b[i]));
        scale = std::max(scale, (double)fabsf(b[i]));
    }
    return scale > 0 ? err / scale : err;
}

static int argmax(const float* x, int V) {
    int best = 0;
    for (int i = 1; i < V; i++) if (x[i] > x[best]) best = i;
    return best;
}

// Rows of different prompt lengths decode n greedy tokens from the cache (Tmax > prompt + n: no slide);
// every step's logits of every row are kept, then one full forward per row over all its tokens gives the
// logits at every position, which must match (causal: position t of the full forward sees what step t saw).
// Returns the worst relative error; *tokens gets every row's generated tokens (from rank P-1).
static double kv_vs_full(const GPTConfig* cfg, const std::vector<float>& init, int P, bool sp, int n,
                         const std::vector<std::vector<int>>& prompts, std::vector<std::vector<int>>* tokens) {
    double worst = 0;
    int B = (int)prompts.size(), Vp = cfg->Vp, V = cfg->V, Tmax = cfg->maxT;
    serve_ranks(cfg, init, P, sp, [&](Rank* rk, GPT* m) {
        Decoder d;
        decoder_start(&d, m, rk, prompts, Tmax);
        std::vector<std::vector<float>> seen(B);  // row b: the logits after each of its tokens from the prompt's last on
        std::vector<int> next(B);
        for (int s = 0; s <= n; s++) {
            for (int b = 0; b < B; b++) {
                const float* row = d.logits.data() + (size_t)b * Vp;
                seen[b].insert(seen[b].end(), row, row + Vp);
                next[b] = argmax(row, V);
            }
            if (s < n) decoder_step(&d, next);
        }
        double w = 0;
        std::vector<float> full(Vp);
        for (int b = 0; b < B; b++) {
            const std::vector<int>& h = d.hist[b];
            int T = (int)h.size(), first = (int)prompts[b].size() - 1;
            gpt_forward(m, rk, h.data(), nullptr, 1, T, false);
            for (int t = first; t < T; t++) {
                gpt_logits_row(m, rk, 0, t, full.data());
                w = std::max(w, row_rel_err(seen[b].data() + (size_t)(t - first) * Vp, full.data(), V));
            }
        }
        if (rk->rank == P - 1) {
            worst = w;
            if (tokens) {
                tokens->assign(B, {});
                for (int b = 0; b < B; b++) tokens->at(b).assign(d.hist[b].begin() + prompts[b].size(), d.hist[b].end());
            }
        }
        decoder_free(&d);
    });
    return worst;
}

// the rows of the tests: lengths 1, 7, 13, 30 (B = 4 divides into 2 and 4 ranks: decode splits under --sp 1)
static std::vector<std::vector<int>> serve_prompts(int V, int B = 4) {
    int lens[4] = {1, 7, 13, 30};
    std::vector<std::vector<int>> p;
    for (int b = 0; b < B; b++) p.push_back(random_tokens(lens[b % 4], V, 100 + b));
    return p;
}

// the model of the tests: weights twice GPT-2's initial scale, for distributions peaked enough that greedy
// tokens are not near ties. (On the CPU with --attention matmul the cached logits are the full forward's
// bit for bit; with fused attention (the default) and on the GPU the two attention paths round differently,
// and much larger weights make the network amplify that.)
static std::vector<float> serve_weights(const GPTConfig* cfg) {
    std::vector<float> w = init_weights(cfg, 21);
    for (auto& x : w) x *= 2.0f;
    return w;
}

static void test_kv_logits_all(int n, double bound) {
    GPTConfig cfg = make_config(2, 4, 32, 200, 256);
    std::vector<float> init = serve_weights(&cfg);
    std::vector<std::vector<int>> prompts = serve_prompts(cfg.V), t1;
    for (bool sp : {false, true})
        for (int P : {1, 2, 4}) {
            if (sp && P == 1) continue;
            std::vector<std::vector<int>> toks;
            double e = kv_vs_full(&cfg, init, P, sp, n, prompts, &toks);
            if (P == 1) t1 = toks;
            check_le(e, bound, "%s TP=%d%s: logits from the KV cache against the full forward, 4 rows of 1..30 prompt tokens, every position "
                     "of %d greedy tokens: worst rel err", g_device == DEV_CUDA ? "GPU" : "CPU", P, sp ? " SP" : "", n);
            if (P > 1) check(toks == t1, "%s TP=%d%s: the same %d greedy tokens per row as TP=1", g_device == DEV_CUDA ? "GPU" : "CPU", P,
                             sp ? " SP" : "", n);
        }
}

// greedy generation from the cache gives the tokens of today's sampler (the whole forward per token),
// as long as the context fits in -t
static void test_kv_greedy_vs_sampler() {
    GPTConfig cfg = make_config(2, 4, 32, 200, 256);
    std::vector<float> init = serve_weights(&cfg);
    std::vector<int> prompt = random_tokens(9, cfg.V, 5);
    for (int P : {1, 2, 4}) {
        std::vector<int> old_t, new_t, old_e, new_e;
        int eot = -1;
        serve_ranks(&cfg, init, P, false, [&](Rank* rk, GPT* m) {
            std::vector<int> a = generate(m, rk, prompt, 100, 128, 0.0f, 0, 1, -1);
            std::vector<int> b = generate_batch(m, rk, {prompt}, 100, 128, 0.0f, 0, 1, -1)[0];
            // with the 10th token drawn as end-of-text both stop at its first draw, and at the same place
            int e = a[9];
            std::vector<int> ae = generate(m, rk, prompt, 100, 128, 0.0f, 0, 1, e);
            std::vector<int> be = generate_batch(m, rk, {prompt}, 100, 128, 0.0f, 0, 1, e)[0];
            if (rk->rank == P - 1) { old_t = a; new_t = b; old_e = ae; new_e = be; eot = e; }
        });
        check(old_t == new_t && old_t.size() == 100, "TP=%d: 100 greedy tokens from the KV cache are today's sampler's (-t 128)", P);
        auto first = std::find(old_t.begin(), old_t.end(), eot);
        std::vector<int> cut(old_t.begin(), first == old_t.end() ? first : first + 1);
        check(old_e == new_e && old_e == cut && !cut.empty() && cut.size() <= 10,
              "TP=%d: with an end-of-text token both samplers stop at its first draw (after %zu tokens)", P, old_e.size());
    }
}

// several prompts of different lengths at once against each prompt alone: the same tokens, sampled (each
// row its own generator) and stopping at an end-of-text token
static void test_kv_batch_vs_alone() {
    GPTConfig cfg = make_config(2, 4, 32, 200, 256);
    std::vector<float> init = serve_weights(&cfg);
    std::vector<std::vector<int>> prompts = serve_prompts(cfg.V);
    for (int P : {1, 2}) {
        std::vector<std::vector<int>> alone(4), batch, alone_eot(4), batch_eot;
        int eot = -1;
        serve_ranks(&cfg, init, P, false, [&](Rank* rk, GPT* m) {
            std::vector<std::vector<int>> a(4), ae(4);
            for (int b = 0; b < 4; b++) a[b] = generate_batch(m, rk, {prompts[b]}, 50, 128, 1.0f, 0, 7, -1)[0];
            std::vector<std::vector<int>> bt = generate_batch(m, rk, prompts, 50, 128, 1.0f, 0, 7, -1);
            int e = a[1][9];  // a token row 1 draws: with it as end-of-text row 1 stops after 10 tokens or fewer
            for (int b = 0; b < 4; b++) ae[b] = generate_batch(m, rk, {prompts[b]}, 50, 128, 1.0f, 0, 7, e)[0];
            std::vector<std::vector<int>> be = generate_batch(m, rk, prompts, 50, 128, 1.0f, 0, 7, e);
            if (rk->rank == P - 1) { alone = a; batch = bt; alone_eot = ae; batch_eot = be; eot = e; }
        });
        size_t lens = 0;
        bool stopped = true;
        for (int b = 0; b < 4; b++) {
            lens += alone_eot[b].size();
            auto it = std::find(alone[b].begin(), alone[b].end(), eot);
            std::vector<int> cut(alone[b].begin(), it == alone[b].end() ? it : it + 1);
            stopped &= alone_eot[b] == cut;
        }
        check(batch == alone, "TP=%d: 4 prompts of 1, 7, 13, 30 tokens in one batch draw the tokens each draws alone (50 each, temperature 1)", P);
        check(batch_eot == alone_eot && stopped && alone_eot[1].size() <= 10,
              "TP=%d: with an end-of-text token each row stops at it, alone and batched alike (%zu tokens in all)", P, lens);
    }
}

// A cache of Tmax = 32 positions through 100 tokens: it slides (drops the oldest half, re-prefills the
// last 16 at positions 0..15); every step's logits against the full forward over the window it keeps,
// and a prompt of 40 tokens starts from its last 32.
static void test_kv_slide() {
    GPTConfig cfg = make_config(2, 4, 32, 200, 256);
    std::vector<float> init = serve_weights(&cfg);
    std::vector<std::vector<int>> prompts = {random_tokens(5, cfg.V, 1), random_tokens(40, cfg.V, 2)};  // the second starts past Tmax
    int Tmax = 32, n = 100;
    for (int P : {1, 2}) {
        double worst = 0;
        int slides = 0;
        serve_ranks(&cfg, init, P, false, [&](Rank* rk, GPT* m) {
            Decoder d;
            decoder_start(&d, m, rk, prompts, Tmax);
            std::vector<float> full(cfg.Vp);
            std::vector<int> next(2);
            // the long prompt as the cache starts it: its last Tmax tokens, all of them, whatever d keeps
            gpt_forward(m, rk, prompts[1].data() + prompts[1].size() - Tmax, nullptr, 1, Tmax, false);
            gpt_logits_row(m, rk, 0, Tmax - 1, full.data());
            double w = row_rel_err(d.logits.data() + cfg.Vp, full.data(), cfg.V);
            // the window's length by the rule, not from d: the prompt's (at most Tmax), one more each step, and
            // from a full cache Tmax/2 kept before the new token
            std::vector<int> want = {std::min((int)prompts[0].size(), Tmax), std::min((int)prompts[1].size(), Tmax)};
            for (int s = 0; s <= n; s++) {
                for (int b = 0; b < 2; b++) {
                    // the window: the last `want` tokens of the row, the newest last
                    const std::vector<int>& h = d.hist[b];
                    int T = want[b];
                    gpt_forward(m, rk, h.data() + h.size() - T, nullptr, 1, T, false);
                    gpt_logits_row(m, rk, 0, T - 1, full.data());
                    w = std::max(w, row_rel_err(d.logits.data() + (size_t)b * cfg.Vp, full.data(), cfg.V));
                    next[b] = argmax(d.logits.data() + (size_t)b * cfg.Vp, cfg.V);
                    if (d.len[b] != T) w = INFINITY;  // the cache holds what the rule says
                }
                if (s < n) {
                    decoder_step(&d, next);
                    for (int& T : want) T = (T == Tmax ? Tmax / 2 : T) + 1;
                }
            }
            if (rk->rank == P - 1) { worst = w; slides = d.slides; }
            decoder_free(&d);
        });
        check_le(worst, 1e-5, "TP=%d: %d tokens through a KV cache of %d positions (%d slides), from a prompt of 40: logits against the "
                 "full forward over the window the rule keeps (at the start, the prompt's last %d tokens), worst rel err", P, n, Tmax, slides, Tmax);
        check(slides >= 6, "TP=%d: the cache slid (%d times)", P, slides);
    }
}

// ----------------------------------------------------------------------------
// the interactive mode through a pipe

struct ChatChild {
    pid_t pid;
    int in, out;  // its stdin (we write), its stdout and stderr (we read)
    std::string text;
};

static ChatChild chat_spawn(const std::string& args) {
    int a[2], b[2];
    ChatChild c = {-1, -1, -1, ""};
    if (pipe(a) || pipe(b)) return c;
    c.pid = fork();
    if (c.pid == 0) {
        dup2(a[0], 0);
        dup2(b[1], 1);
        dup2(b[1], 2);
        close(a[1]);
        close(b[0]);
        std::string cmd = "exec " + tp_bin() + " " + args;
        execl("/bin/sh", "sh", "-c", cmd.c_str(), (char*)nullptr);
        _exit(127);
    }
    close(a[0]);
    close(b[1]);
    c.in = a[1];
    c.out = b[0];
    return c;
}

// reads until the output after `from` holds `text` (true) or seconds pass or the child closes it
static bool chat_wait(ChatChild* c, size_t from, const char* text, double seconds) {
    double t0 = comm_now();
    while (comm_now() - t0 < seconds) {
        if (c->text.find(text, from) != std::string::npos) return true;
        struct pollfd p = {c->out, POLLIN, 0};
        if (poll(&p, 1, 50) > 0) {
            char buf[4096];
            ssize_t n = read(c->out, buf, sizeof(buf));
            if (n <= 0) return c->text.find(text, from) != std::string::npos;
            c->text.append(buf, n);
        }
    }
    return false;
}

static void chat_send(ChatChild* c, const std::string& s) {
    ssize_t n = write(c->in, s.data(), s.size());
    (void)n;
}

// A whole answer (the cache slides), then end of input; and, in a second session, an answer too long to
// finish (-g 1000000) stopped by Ctrl-C once it streams, a prompt awaited again, end of input. (One session
// for both raced on a fast machine: its 300-token answer could end before the Ctrl-C arrived.)
static void test_chat_pipe() {
    std::string d = tmpdir() + "/chat";
    mkdir(d.c_str(), 0755);
    GPTConfig cfg = make_config(2, 4, 64, 256, 64);
    std::vector<float> w = init_weights(&cfg, 13);
    model_write((d + "/model.bin").c_str(), &cfg, w.data());
    for (int P : {1, 2}) {
        // (--timeout 30: ranks that fell out of step fail within it rather than the default 600 s)
        std::string base = "-e " + d + "/model.bin --chat 1 -t 64 --temperature 1 --threads 1 --timeout 30 --tp " + std::to_string(P);
        ChatChild c = chat_spawn(base + " -g 300");
        bool started = chat_wait(&c, 0, "> ", 60);
        size_t at = c.text.size();
        // an empty line is no prompt: nothing is generated or said, the next prompt is awaited
        chat_send(&c, "\n");
        bool empty_ok = chat_wait(&c, at, "> ", 20) && c.text.substr(at) == "> ";
        at = c.text.size();
        // 300 more empty lines and the prompt in one write: rank 0 reads them faster than another rank takes
        // them, and each rank must still see each line once (a board of one line let rank 1 read "Hello" twice
        // and answer it where rank 0 answered "Hi": a collective mismatch, every time)
        chat_send(&c, std::string(300, '\n') + "Hello\n");
        bool first = chat_wait(&c, at, "[300 tokens]", 60) && chat_wait(&c, at, "\n> ", 10);
        bool slid = c.text.find("the cache slid", at) != std::string::npos;  // 5 + 300 tokens through 64 positions
        at = c.text.size();
        chat_send(&c, "Hi\n");
        first &= chat_wait(&c, at, "[300 tokens]", 60) && chat_wait(&c, at, "\n> ", 10);
        at = c.text.size();
        close(c.in);  // end of input
        bool ended = chat_wait(&c, at, "end of input", 20);
        int status = wait_exit(c.pid, 20);
        close(c.out);
        bool exit0 = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        std::string text = c.text;
        c = chat_spawn(base + " -g 1000000");
        started &= chat_wait(&c, 0, "> ", 60);
        at = c.text.size();
        chat_send(&c, "World\n");
        // the answer streams: its first bytes come long before its million tokens are done
        double t0 = comm_now();
        while (c.text.size() < at + 20 && comm_now() - t0 < 30) chat_wait(&c, at, "\x01", 0.05);  // (no raw \x01 is ever printed)
        bool streamed = c.text.size() >= at + 20 && c.text.find("tokens]", at) == std::string::npos;
        kill(c.pid, SIGINT);
        bool stopped = chat_wait(&c, at, "stopped]", 10) && chat_wait(&c, at, "\n> ", 10);
        at = c.text.size();
        close(c.in);
        ended &= chat_wait(&c, at, "end of input", 20);
        status = wait_exit(c.pid, 20);
        close(c.out);
        exit0 &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
        // its startup says what it does (it once said "the run in (null) is finished" without -o)
        bool said = text.find("no training (--chat 1)") != std::string::npos && text.find("(null)") == std::string::npos;
        bool ok = started && empty_ok && first && slid && streamed && stopped && ended && exit0 && said;
        check(ok, "--chat 1 --tp %d through a pipe: an empty line passed over, then 300 more with the prompt in one write, answers of 300 tokens to it (the cache slid) and to a shorter one, end of input "
              "ends it; an endless answer streamed and stopped by Ctrl-C, a prompt awaited, end of input (started %d empty line %d "
              "first %d slid %d streamed %d stopped %d ended %d exit 0 %d, the startup line %d)", P, started, empty_ok, first, slid,
              streamed, stopped, ended, exit0, said);
        if (!ok) printf("%s\n%s\n", text.substr(0, 3000).c_str(), c.text.substr(0, 3000).c_str());
    }
    // a line that cannot be encoded (a word outside the embedded corpus's) is answered by one line saying why,
    // and the chat goes on to the next
    std::string out, run = d + "/words";
    int rc = run_cmd("-e L1C32H2 -b 2 -t 32 -x 1 -v 0 -g 0 --threads 1 -o " + run, nullptr, nullptr);
    rc = rc ? rc : run_sh("(printf 'The zebra\\nThe dog\\n' | " + tp_bin() + " -y 1 -o " + run + " --chat 1 -g 5 --threads 1)", &out);
    size_t why = out.find("tp: \"zebra\" (at byte 4) is not a word of the embedded corpus"), answer = out.find("[5 tokens]");
    check(rc == 0 && why != std::string::npos && answer != std::string::npos && why < answer && out.find("end of input") != std::string::npos,
          "--chat 1: a word outside the corpus answered by one line, then the next prompt's answer (exit %d): %s", rc,
          first_line_with(out, "zebra").c_str());
}

// --prompts FILE from the command line: one sample per line, and the decode sweep's table
static void test_serve_cli() {
    std::string d = tmpdir() + "/servecli";
    mkdir(d.c_str(), 0755);
    FILE* f = fopen((d + "/prompts.txt").c_str(), "w");
    fprintf(f, "The cat\n\nA much longer prompt than the first one\nX\n");
    fclose(f);
    std::string out, err;
    int rc = run_cmd("-e L2C32H2 -x 0 -g 20 -t 32 --threads 1 --tp 2 --prompts " + d + "/prompts.txt", &out, &err);
    size_t rows = 0;
    for (size_t p = out.find("\n---\n"); p != std::string::npos; p = out.find("\n---\n", p + 1)) rows++;
    check(rc == 0 && out.find("---\nThe cat") != std::string::npos && out.find("---\nA much longer") != std::string::npos &&
          out.find("---\nX") != std::string::npos && out.find("prefill") != std::string::npos && out.find("tokens/s") != std::string::npos &&
          out.find("KV cache:") != std::string::npos, "--prompts with 3 prompts: 3 samples, the prefill and decode timings, the KV cache line (exit %d, %zu rules)", rc, rows);
    // --prompts ends each row at the tokenizer's end-of-text token, from the KV cache (--kv 1) and from the
    // whole forward (--kv 0) alike. A byte-level model whose final layernorm has weight 0 and bias b makes
    // every position's logits b . wte[v]; wte[10] = 5b makes token 10 (the tokenizer's end-of-text here,
    // the newline) the greedy draw at once: each row is its prompt and one newline, not 20 of them.
    {
        GPTConfig ec = make_config(1, 2, 32, 256, 64);
        std::vector<float> w = init_weights(&ec, 21);
        long C = ec.C, n = (long)w.size();
        Rng r = {77};
        for (long c = 0; c < C; c++) {
            w[n - 2 * C + c] = 0.0f;                    // lnfw
            w[n - C + c] = 2.0f * rng_uniform(&r) - 1;  // lnfb
            w[10 * C + c] = 5.0f * w[n - C + c];        // wte's row 10
        }
        model_write((d + "/eot.bin").c_str(), &ec, w.data());
        Tokenizer bytes_eot;
        for (int i = 0; i < 256; i++) bytes_eot.pieces.push_back(std::string(1, (char)i));
        bytes_eot.eot = 10;
        tokenizer_write_bin(&bytes_eot, (d + "/eot_tokenizer.bin").c_str());
        std::vector<std::string> got[2];
        std::string gen[2];
        for (int kv = 0; kv < 2; kv++) {
            std::string o;
            int r2 = run_cmd("-e " + d + "/eot.bin --tokenizer " + d + "/eot_tokenizer.bin -x 0 -g 20 -t 32 --temperature 0 --threads 1 "
                             "--tp 2 --kv " + std::to_string(kv) + " --prompts " + d + "/prompts.txt", &o, &err);
            got[kv] = sample_texts(o);
            gen[kv] = r2 == 0 ? first_line_with(o, kv ? "prefill " : "the whole forward") : "exit " + std::to_string(r2) + ": " + err;
            if (o.find("(interrupted)") != std::string::npos) got[kv].clear();
        }
        std::vector<std::string> want = {"The cat\n", "A much longer prompt than the first one\n", "X\n"};
        check(got[0] == want && got[1] == want, "--prompts with an end-of-text token drawn at once: each of the 3 rows ends at it, "
              "--kv 0 as --kv 1 (%zu and %zu rows as expected): %s", got[0].size(), got[1].size(), gen[0].c_str());
    }
    // the same prompts in a file with Windows line ends: the same samples (a \r kept would be a token of each prompt)
    {
        f = fopen((d + "/prompts_crlf.txt").c_str(), "w");
        fprintf(f, "The cat\r\n\r\nA much longer prompt than the first one\r\nX\r\n");
        fclose(f);
        std::string crlf;
        int rc2 = run_cmd("-e L2C32H2 -x 0 -g 20 -t 32 --threads 1 --tp 2 --prompts " + d + "/prompts_crlf.txt", &crlf, &err);
        check(rc == 0 && rc2 == 0 && sample_texts(out).size() == 3 && sample_texts(crlf) == sample_texts(out),
              "--prompts with CRLF line ends: the same 3 samples as with LF (exit %d)", rc2);
    }
    // the sample's stats line: its decode rate against its ms per token (one row, byte-level: no end-of-text, so
    // every decode step makes one token: tokens/s x ms per token = 1000), and the KV cache's MB per rank and at
    // TP=1 against 2 x L x rows x NH/P x Tmax x hs floats
    {
        std::string s1;
        int rc3 = run_cmd("-e L2C256H4 -x 0 -g 8 -t 1024 --threads 1 --tp 2 --prompt 'The cat'", &s1, &err);
        std::string dl = first_line_with(s1, "more tokens per row in "), kl = first_line_with(s1, "KV cache: ");
        double rate = 0, ms = 0, mb = 0, mb1 = 0;
        size_t at = dl.find(" s: ");
        if (at != std::string::npos) sscanf(dl.c_str() + at + 4, "%lf tokens/s, %lf ms per token", &rate, &ms);
        at = kl.find("), ");
        if (kl.size() > 10) mb = atof(kl.c_str() + 10);
        if (at != std::string::npos) mb1 = atof(kl.c_str() + at + 3);
        double slack = 0.05 / std::max(rate, 1e-9) + 0.005 / std::max(ms, 1e-9) + 1e-3;  // the printing's rounding
        double want = 2.0 * 2 * 1 * (4 / 2) * 1024 * 64 * 4 / 1e6;
        check(rc3 == 0 && fabs(rate * ms / 1000 - 1) <= slack && fabs(mb - want) <= 0.051 && fabs(mb1 - 2 * want) <= 0.051,
              "a sample's line: %.1f tokens/s x %.2f ms per token = %.4f (1 within %.4f); KV cache %.1f MB per rank, %.1f at TP=1 "
              "(%.2f and %.2f by the formula)", rate, ms, rate * ms / 1000, slack, mb, mb1, want, 2 * want);
    }
    rc = run_cmd("-e L2C32H2 -x 0 --sweep 1 -b 4 -t 32 --sweep-steps 5 --threads 1", &out, &err);
    int lines = 0;
    for (const char* pb : {"\n   1    1 ", "\n   1    4 ", "\n   2    2 ", "\n   2    4 "}) lines += out.find(pb) != std::string::npos;
    check(rc == 0 && out.find("decode sweep") != std::string::npos && lines == 4 && out.find("differs from the formula") == std::string::npos,
          "--sweep 1 -x 0: the decode sweep over P = 1, 2 and B = 1, 2, 4, the bytes moved as the formula says (exit %d)", rc);
    if (rc != 0 || lines != 4) printf("%s\n%s\n", out.c_str(), err.c_str());
}

static void test_serve() {
    printf("serving: the KV cache against the full forward, greedy against the whole-forward sampler, batches, sliding, --chat\n");
    test_kv_logits_all(200, 1e-5);
    test_kv_greedy_vs_sampler();
    test_kv_batch_vs_alone();
    test_kv_slide();
}

static void test_serve_runs() {
    printf("serving from the command line: --prompts, the decode sweep, --chat 1 through a pipe\n");
    test_serve_cli();
    test_chat_pipe();
}

// ----------------------------------------------------------------------------
// GPU: the cache ops' kernels against the CPU ops, then the logits test on the GPU (part of the gpu group)

static void test_kv_ops(CudaCtx* cx) {
    printf("kv_write / attention_decode / position_rows_forward\n");
    Rnd r = {31};
    struct { int B, T, NH, hs, Tmax; } cases[] = {{1, 1, 1, 1, 1}, {2, 3, 2, 13, 7}, {3, 1, 4, 64, 300}, {4, 5, 3, 24, 5}, {2, 1, 2, 80, 1030}};
    for (auto& k : cases) {
        char s[80];
        snprintf(s, sizeof(s), "B=%d T=%d NH=%d hs=%d Tmax=%d", k.B, k.T, k.NH, k.hs, k.Tmax);
        int C = k.NH * k.hs;
        long ncache = (long)k.B * k.NH * k.Tmax * k.hs;
        auto qkv = rnd_vec(&r, (long)k.B * k.T * 3 * C, -2, 2);
        auto kc0 = rnd_vec(&r, ncache), vc0 = rnd_vec(&r, ncache);
        std::vector<int> pos(k.B);
        for (int b = 0; b < k.B; b++) pos[b] = (int)(rnd_u64(&r) % k.Tmax);  // some past Tmax - T: those rows write part
        std::vector<float> kc = kc0, vc = vc0;
        kv_write_cpu(kc.data(), vc.data(), qkv.data(), pos.data(), k.B, k.T, k.NH, k.Tmax, k.hs);
        DevBuf dq = dev_up(cx, qkv), dk = dev_up(cx, kc0), dv = dev_up(cx, vc0);
        int* dpos = dev_up_int(cx, pos);
        kv_write_cuda(cx, dk.p, dv.p, dq.p, dpos, k.B, k.T, k.NH, k.Tmax, k.hs);
        expect_exact("kv_write k", s, dev_down(cx, dk.p, ncache), kc);
        expect_exact("kv_write v", s, dev_down(cx, dv.p, ncache), vc);
        // one query per row (the first of qkv's rows) against positions 0..pos[b]
        std::vector<float> q1((long)k.B * 3 * C);
        for (int b = 0; b < k.B; b++) std::copy(qkv.begin() + (long)b * k.T * 3 * C, qkv.begin() + ((long)b * k.T + 1) * 3 * C, q1.begin() + (long)b * 3 * C);
        std::vector<float> out_c((long)k.B * C);
        attention_decode_cpu(out_c.data(), q1.data(), kc.data(), vc.data(), pos.data(), k.B, k.NH, k.Tmax, k.hs);
        DevBuf dq1 = dev_up(cx, q1), dout = dev_up(cx, std::vector<float>((long)k.B * C, 7.0f));
        attention_decode_cuda(cx, dout.p, dq1.p, dk.p, dv.p, dpos, k.B, k.NH, k.Tmax, k.hs);
        expect_close("attention_decode", s, dev_down(cx, dout.p, (long)k.B * C), out_c, FP32_BOUND);
        // position_rows_forward: wpe rows at each row's position
        auto x = rnd_vec(&r, (long)k.B * C), wpe = rnd_vec(&r, (long)k.Tmax * C);
        std::vector<float> xc = x;
        position_rows_forward_cpu(xc.data(), wpe.data(), pos.data(), k.B, C);
        DevBuf dx = dev_up(cx, x), dw = dev_up(cx, wpe);
        position_rows_forward_cuda(cx, dx.p, dw.p, dpos, k.B, C);
        expect_exact("position_rows_forward", s, dev_down(cx, dx.p, (long)k.B * C), xc);
        for (DevBuf* b : {&dq, &dk, &dv, &dq1, &dout, &dx, &dw}) cuda_free(cx, b->base);
        cuda_free(cx, dpos);
    }
}

// in the gpu group, after gpu_op_tests (which runs test_kv_ops with the other ops, so the gpu_ops group
// has every CUDA op): the logits from the cache against the full forward on the GPU (fp32; fewer tokens
// than on the CPU: the emulated GPU is slow)
static void serve_gpu_tests(int ndev) {
    int dev = g_device;
    bool tf32 = g_tf32;
    g_device = DEV_CUDA;
    g_ngpu = ndev;
    g_tf32 = false;
#ifdef TP_EMU
    test_kv_logits_all(24, 1e-5);
#else
    test_kv_logits_all(200, 1e-5);
#endif
    g_device = dev;
    g_tf32 = tf32;
}
