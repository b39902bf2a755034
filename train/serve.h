// train/serve.h (needs tp.cu's run, loop and signal handling): serving from the KV cache of gpt.cu.
// Batched generation (several prompts at once, each with its own length and stop), the samples of a run
// (--prompts FILE), the interactive mode (--chat 1) and the decode sweep (--sweep 1 with -x 0).
//
// Every rank of replica 0 runs the same code on the same tokens: the prompts are the same on every rank,
// the logits of a step are all-gathered, and every rank draws from the same seeded generators, so all
// ranks agree on every token (and a rank never decides alone to stop: see sample_stop_requested).
//
// When a row's context passes Tmax (the cache's positions: -t, at most the model's maxT), its cache
// slides: the oldest half is dropped and the last Tmax/2 tokens are run through a prefill again at
// positions 0..Tmax/2-1 (README "Serving"). GPT-2's position embedding is added to the input, so every
// cached k and v depends on its absolute position: the cache cannot be shifted, only recomputed.
#pragma once
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

// the end-of-text token generation stops at: the tokenizer's (-1: none; a byte-level model has none)
static int stop_token(const Run* run) {
    int eot = run->tokenizer.eot;
    return eot >= 0 && eot < run->cfg.V ? eot : -1;
}

// --prompts FILE: one prompt per line (empty lines skipped), each encoded as --prompt is (encode_prompt)
static void prompts_setup(Run* run) {
    const char* path = run->args.prompts;
    FILE* f = fopen(path, "rb");
    if (!f) fatal("cannot read --prompts %s: %s", path, strerror(errno));
    std::string line;
    int c, lineno = 0;
    do {
        c = fgetc(f);
        if (c != '\n' && c != EOF) { line += (char)c; continue; }
        lineno++;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (!line.empty()) {
            std::vector<int> toks;
            std::string why;
            if (!encode_prompt(run, line, &toks, &why)) fatal("--prompts %s, line %d: %s", path, lineno, why.c_str());
            run->prompts.push_back(toks);
            run->prompt_texts.push_back(line);
        }
        line.clear();
    } while (c != EOF);
    fclose(f);
    if (run->prompts.empty()) fatal("--prompts %s holds no prompt: give one per line", path);
}

// ----------------------------------------------------------------------------
// the decoder: B rows over one KV cache

struct Decoder {
    GPT* m;
    Rank* rk;
    KVCache kv;
    int B, Tmax, W;                      // rows, cache positions, tokens a full row keeps (Tmax/2)
    std::vector<std::vector<int>> hist;  // every row's tokens: its prompt, then what it generated
    std::vector<int> start, len;         // row b's cache holds hist[b][start .. start + len) at 0..len-1
    std::vector<char> active;            // rows still generating (the others ride along, ignored)
    std::vector<float> logits;           // (B, Vp): every row's logits for the token after hist[b].back()
    double prefill_s, decode_s;          // time in the first prefill; in the steps (slides included)
    long steps, prefill_tokens;
    int slides;
    long collectives;                    // over the TP group in the decode steps
    double moved[COMM_KINDS];
};

// re-prefills row b with the W newest tokens of its cache, at positions 0..W-1
static void decoder_slide(Decoder* d, int b) {
    d->start[b] += d->len[b] - d->W;
    d->len[b] = d->W;
    d->slides++;
    if (d->W == 0) return;
    KVCache row = kv_row(&d->kv, b);
    gpt_prefill(d->m, d->rk, &row, d->hist[b].data() + d->start[b], 1, d->W);
}

// Prefills every row with its prompt (at most its last Tmax tokens), in one forward of (B, longest);
// d->logits then holds each row's next-token logits.
static void decoder_start(Decoder* d, GPT* m, Rank* rk, const std::vector<std::vector<int>>& prompts, int Tmax) {
    int B = (int)prompts.size(), Vp = m->cfg.Vp;
    d->m = m;
    d->rk = rk;
    d->B = B;
    d->Tmax = Tmax;
    d->W = Tmax / 2;
    d->hist = prompts;
    d->start.assign(B, 0);
    d->len.assign(B, 0);
    d->active.assign(B, 1);
    d->logits.assign((size_t)B * Vp, 0.0f);
    d->decode_s = 0;
    d->steps = d->slides = 0;
    d->collectives = 0;
    for (int k = 0; k < COMM_KINDS; k++) d->moved[k] = 0;
    kv_alloc(&d->kv, m, rk, B, Tmax);
    double t0 = comm_now();
    int Tp = 1;
    for (int b = 0; b < B; b++) {
        if (prompts[b].empty()) fatal("generation from an empty prompt (row %d)", b);
        d->len[b] = std::min((int)prompts[b].size(), Tmax);
        d->start[b] = (int)prompts[b].size() - d->len[b];
        Tp = std::max(Tp, d->len[b]);
    }
    std::vector<int> tokens((size_t)B * Tp, 0);  // right-padded: causal attention, the padding changes nothing before it
    for (int b = 0; b < B; b++) std::copy(d->hist[b].begin() + d->start[b], d->hist[b].end(), tokens.begin() + (size_t)b * Tp);
    gpt_prefill(m, rk, &d->kv, tokens.data(), B, Tp);
    for (int b = 0; b < B; b++) gpt_logits_row(m, rk, b, d->len[b] - 1, d->logits.data() + (size_t)b * Vp);
    d->prefill_s = comm_now() - t0;
    d->prefill_tokens = (long)B * Tp;
}

// Appends next[b] to every active row and runs it through one decode step (a row whose cache is full
// slides first); d->logits then holds the logits of the token after it.
static void decoder_step(Decoder* d, const std::vector<int>& next) {
    double t0 = comm_now();
    std::vector<int> tok(d->B, 0), pos(d->B, 0);  // inactive rows: token 0 at position 0, ignored
    for (int b = 0; b < d->B; b++) {
        if (!d->active[b]) continue;
        d->hist[b].push_back(next[b]);
        if (d->len[b] == d->Tmax) decoder_slide(d, b);
        tok[b] = next[b];
        pos[b] = d->len[b];
    }
    long seq0 = d->rk->tp.seq;
    double moved0[COMM_KINDS];
    for (int k = 0; k < COMM_KINDS; k++) moved0[k] = d->rk->tp.moved[k];
    gpt_decode(d->m, d->rk, &d->kv, tok.data(), pos.data(), d->logits.data());
    d->collectives += d->rk->tp.seq - seq0;
    for (int k = 0; k < COMM_KINDS; k++) d->moved[k] += d->rk->tp.moved[k] - moved0[k];
    for (int b = 0; b < d->B; b++)
        if (d->active[b]) d->len[b]++;
    d->steps++;
    d->decode_s += comm_now() - t0;
}

static void decoder_free(Decoder* d) { kv_free(&d->kv, d->rk); }

// ----------------------------------------------------------------------------
// batched generation

// what a generation measured, for the line after a sample
struct GenStats {
    int P;  // the TP ranks that generated (1 for a pipeline's sample: one rank draws from the gathered weights)
    int B, Tmax;
    long prefill_tokens, steps, tokens;  // tokens: generated by every row together
    double prefill_s, decode_s;
    long collectives;                    // per step: collectives / steps
    double moved[COMM_KINDS];
    int slides;
    bool interrupted;
};

// Up to n tokens after each prompt, from the KV cache: the first from the prefill's logits, each next
// one from a decode step of all rows at once. A row stops after n tokens or at its end-of-text token eot
// (-1: none); the prompts may differ in length. Row b draws from its own generator seeded with seed, so
// it gets the tokens it would alone. stop, if given, is asked before each step (by every rank); on_token
// (b, token), if given, hears every token as it is drawn.
static std::vector<std::vector<int>> generate_batch(GPT* m, Rank* rk, const std::vector<std::vector<int>>& prompts, int n, int Tmax,
                                                    float temperature, int topk, uint64_t seed, int eot,
                                                    const std::function<bool()>& stop = nullptr,
                                                    const std::function<void(int, int)>& on_token = nullptr, GenStats* st = nullptr) {
    int B = (int)prompts.size(), Vp = m->cfg.Vp;
    std::vector<std::vector<int>> out(B);
    std::vector<Rng> rng(B, Rng{seed});
    Decoder d;
    decoder_start(&d, m, rk, prompts, Tmax);
    bool interrupted = false;
    std::vector<int> next(B, 0);
    for (;;) {
        // the tokens of this round, from the last logits
        bool any = false;
        for (int b = 0; b < B; b++) {
            if (!d.active[b]) continue;
            if ((int)out[b].size() >= n) { d.active[b] = 0; continue; }
            next[b] = sample_token(d.logits.data() + (size_t)b * Vp, m->cfg.V, temperature, topk, &rng[b]);
            out[b].push_back(next[b]);
            if (on_token) on_token(b, next[b]);
            if (next[b] == eot || (int)out[b].size() >= n) d.active[b] = 0;  // nothing more to feed
            else any = true;
        }
        if (!any) break;
        if (stop && stop()) {
            interrupted = true;
            break;
        }
        decoder_step(&d, next);
    }
    if (st) {
        st->P = rk->P;
        st->B = B;
        st->Tmax = Tmax;
        st->prefill_tokens = d.prefill_tokens;
        st->prefill_s = d.prefill_s;
        st->decode_s = d.decode_s;
        st->steps = d.steps;
        st->tokens = 0;
        for (auto& o : out) st->tokens += (long)o.size();
        st->collectives = d.collectives;
        for (int k = 0; k < COMM_KINDS; k++) st->moved[k] = d.moved[k];
        st->slides = d.slides;
        st->interrupted = interrupted;
    }
    decoder_free(&d);
    return out;
}

// One line: prefill time, decode tokens/s and ms per token, the collectives and bytes of a decode step,
// and the KV cache per rank against TP=1.
static void print_gen_stats(const Run* run, const GenStats* st) {
    const GPTConfig* c = &run->cfg;
    int P = st->P;
    double kv = 4.0 * kv_cache_floats(c, P, st->B, st->Tmax), kv1 = 4.0 * kv_cache_floats(c, 1, st->B, st->Tmax);
    printf("prefill %ld tokens (%d row%s) in %.1f ms", st->prefill_tokens, st->B, st->B > 1 ? "s" : "", st->prefill_s * 1e3);
    if (st->steps > 0) {
        double sent[COMM_KINDS], per[COMM_KINDS];
        for (int k = 0; k < COMM_KINDS; k++) per[k] = st->moved[k] / st->steps;
        double bytes = ring_bytes(per, P, sent);
        // (no "step" in this line: a sample line must not read as training)
        printf(" | decode %ld more tokens per row in %.2f s: %.1f tokens/s, %.2f ms per token%s", st->steps, st->decode_s,
               (double)(st->tokens - st->B) / st->decode_s, st->decode_s / st->steps * 1e3, st->B > 1 ? " (every row's at once)" : "");
        if (P > 1)
            printf(" | per token %.0f collectives, %.1f KB sent per rank", (double)st->collectives / st->steps, bytes / 1e3);
    }
    if (st->slides) printf(" | the cache slid %d time%s", st->slides, st->slides > 1 ? "s" : "");
    printf("\nKV cache: %.1f MB per rank (2 x %d layers x %d rows x %d/%d heads x %d positions x %d floats)", kv / 1e6, c->L, st->B,
           c->NH, P, st->Tmax, c->C / c->NH);
    if (P > 1) printf(", %.1f MB at TP=1", kv1 / 1e6);
    printf("\n");
}

// ----------------------------------------------------------------------------
// the interactive mode (--chat 1)

// Text as it streams, a token at a time: bytes wait until they make whole UTF-8 characters, so
// escape_text sees characters, not halves of them.
static void stream_text(std::string* pending, const std::string& piece) {
    *pending += piece;
    size_t n = pending->size(), cut = n;
    for (size_t back = 1; back <= 3 && back <= n; back++) {  // an incomplete sequence at the end waits
        unsigned char ch = (*pending)[n - back];
        if ((ch & 0xc0) == 0x80) continue;
        int len = ch < 0x80 ? 1 : (ch >> 5) == 6 ? 2 : (ch >> 4) == 14 ? 3 : (ch >> 3) == 30 ? 4 : 1;
        if ((int)back < len) cut = n - back;
        break;
    }
    printf("%s", escape_text(pending->substr(0, cut)).c_str());
    fflush(stdout);
    pending->erase(0, cut);
}

// world rank 0 reads a line and posts it; the other ranks of the replica wait for it here, not in a
// collective (a person may take longer to type than --timeout allows a collective to wait). Every line is
// kept: a line that generates nothing (empty, or not encodable) lets rank 0 post the next one before
// another rank has read the first, and each rank must still see every line, in order, once.
struct ChatBoard {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::string> lines;  // line i: the i-th posted
    bool eof = false;                // posted after the last line
};
static ChatBoard g_chat;

// reads one line of stdin (false: end of input). A Ctrl-C while waiting is not an end: the handler has
// said so; it is cleared and the line read again.
static bool chat_read_line(std::string* line) {
    line->clear();
    for (;;) {
        int ch = fgetc(stdin);
        if (ch == EOF) {
            if (ferror(stdin) && errno == EINTR) {
                clearerr(stdin);
                continue;
            }
            return !line->empty();
        }
        if (ch == '\n') return true;
        *line += (char)ch;
    }
}

static void chat_rearm_signal() {
    g_signal.store(0);
    struct sigaction sa = {};
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_RESETHAND | SA_SIGINFO;  // a second Ctrl-C within one answer quits at once
    sigaction(SIGINT, &sa, nullptr);
}

// Every rank of replica 0: reads a prompt, streams the continuation token by token, waits for the next;
// Ctrl-C stops the answer (the ranks agree on it at the next token), end of input ends the program.
static void chat(Run* run, RankRun* rr) {
    const Args* a = &run->args;
    Rank* rk = &rr->rk;
    if (rk->dp.rank != 0) return;
    bool lead = rr->world.rank == 0;
    long seen = 0;
    if (lead) {
        snprintf(g_signal_msg[PHASE_SAMPLE], sizeof(g_signal_msg[0]), "\ntp: Ctrl-C: the answer stops here (end of input quits)\n");
        printf("tp: interactive: a prompt per line, the answer streams as it is generated (up to -g %d tokens); Ctrl-C stops "
               "an answer, end of input (Ctrl-D) quits\n", a->gen_tokens);
        fflush(stdout);
    }
    for (;;) {
        std::string text;
        bool eof;
        if (lead) {
            g_phase.store(PHASE_SAMPLE);
            printf("> ");
            fflush(stdout);
            eof = !chat_read_line(&text);
            chat_rearm_signal();  // a Ctrl-C at the prompt stops nothing
            std::lock_guard<std::mutex> lk(g_chat.mu);
            if (eof) g_chat.eof = true;
            else g_chat.lines.push_back(text);
            g_chat.cv.notify_all();
        } else {
            std::unique_lock<std::mutex> lk(g_chat.mu);
            g_chat.cv.wait(lk, [&] { return (long)g_chat.lines.size() > seen || g_chat.eof; });
            eof = (long)g_chat.lines.size() == seen;  // (then g_chat.eof: every line before it was read)
            if (!eof) text = g_chat.lines[seen];
        }
        seen++;
        if (eof) break;
        if (text.empty()) continue;
        std::vector<int> prompt;
        std::string why;
        if (!encode_prompt(run, text, &prompt, &why)) {  // the same answer on every rank
            if (lead) printf("tp: %s\n", why.c_str());
            continue;
        }
        std::string pending;
        GenStats st;
        auto show = [&](int, int tok) {
            if (lead) stream_text(&pending, tokenizer_decode(&run->tokenizer, tok));
        };
        generate_batch(&rr->m, rk, {prompt}, a->gen_tokens, a->T, a->temperature, a->topk, (uint64_t)a->sample_seed,
                       stop_token(run), [&]() { return sample_stop_requested(run, rk); }, show, &st);
        if (lead) {
            printf("%s\n[%ld tokens%s] ", escape_text(pending).c_str(), st.tokens, st.interrupted ? ", stopped" : "");
            print_gen_stats(run, &st);
            fflush(stdout);
            chat_rearm_signal();
        }
    }
    if (lead) {
        printf("\ntp: end of input\n");
        fflush(stdout);
    }
}

// ----------------------------------------------------------------------------
// the decode sweep (--sweep 1 with -x 0): tokens/s and latency per token for every valid P and batch

struct DecodeTime {
    double seconds, collectives, moved[COMM_KINDS];
    long steps;
};

static void decode_sweep_rank(Run* run, int r, int B, DecodeTime* out) {
    RankRun rr;
    rank_run_start(&rr, run, 0, r);
    comm_barrier(&rr.world, "start");
    const Args* a = &run->args;
    int steps = a->sweep_steps;
    Decoder d;
    decoder_start(&d, &rr.m, &rr.rk, std::vector<std::vector<int>>(B, run->prompt), a->T);
    std::vector<int> next(B, 0);
    for (int s = 0; s < steps; s++) {
        if (s == 2) {  // the first 2 steps warm up caches and allocations
            d.decode_s = 0;
            d.steps = d.collectives = 0;
            for (int k = 0; k < COMM_KINDS; k++) d.moved[k] = 0;
        }
        for (int b = 0; b < B; b++) next[b] = sample_token(d.logits.data() + (size_t)b * run->cfg.Vp, run->cfg.V, 0.0f, 0, nullptr);
        decoder_step(&d, next);
    }
    if (rr.world.rank == 0) {
        out->seconds = d.decode_s;
        out->steps = d.steps;
        out->collectives = (double)d.collectives;
        for (int k = 0; k < COMM_KINDS; k++) out->moved[k] = d.moved[k];
    }
    decoder_free(&d);
    rank_run_end(&rr);
}

static void decode_sweep(Run* run) {
    const Args* a = &run->args;
    const GPTConfig* c = &run->cfg;
    printf("\ndecode sweep: %d steps per (P, B) (the first 2 not timed), context %d + %d tokens of a KV cache of %d positions, on the %s\n",
           a->sweep_steps, (int)run->prompt.size(), a->sweep_steps, a->T, run->device == DEV_CUDA ? "GPU" : "CPU");
    printf("%4s %4s %8s %12s %10s %8s %12s %12s %14s %12s\n", "P", "B", "threads", "ms/token", "tokens/s", "speedup", "all-reduces",
           "collectives", "KB/token/rank", "KV MB/rank");
    ranks_teardown(run);
    std::vector<double> base;
    for (int P = 1; P <= c->NH && P <= COMM_MAXP; P++) {
        if (!tp_valid(c, P)) continue;
        int bi = 0;
        for (int B = 1; B <= std::max(1, a->B); B *= 2, bi++) {
            run->P = P;
            run->D = run->Dg = 1;
            ranks_setup(run);
            DecodeTime t = {};
            std::vector<std::thread> th;
            for (int r = 0; r < P; r++) th.emplace_back(decode_sweep_rank, run, r, B, &t);
            for (auto& x : th) x.join();
            ranks_teardown(run);
            double ms = t.seconds / t.steps * 1e3, tps = B / (ms / 1e3);
            if ((int)base.size() <= bi) base.push_back(ms);
            double per[COMM_KINDS], sent[COMM_KINDS];
            for (int k = 0; k < COMM_KINDS; k++) per[k] = t.moved[k] / t.steps;
            double kb = ring_bytes(per, P, sent) / 1e3;
            // the payload of a step from the formula (decode_comm_floats), checked against what moved
            double f[COMM_KINDS], predicted = 0, moved = 0;
            decode_comm_floats(c, B, sp_splits(a->sp, P, B, 1), f);
            for (int k = 0; k < COMM_KINDS; k++) { predicted += f[k]; moved += per[k]; }
            printf("%4d %4d %8d %12.2f %10.1f %8.2f %12d %12.0f %14.1f %12.1f%s\n", P, B, run->threads, ms, tps, base[bi] / ms,
                   P > 1 ? 2 * c->L + 1 : 0, t.collectives / t.steps, kb, 4.0 * kv_cache_floats(c, P, B, a->T) / 1e6,
                   P > 1 && fabs(predicted - moved) > 0.5 ? "  (moved differs from the formula)" : "");
            fflush(stdout);
        }
    }
    printf("(per token, i.e. per decode step of the B rows: all-reduces of B x C floats, the embedding and the attproj and fcproj\n"
           " of every layer, 2L + 1 = %d, with --sp 1 reduce-scatters; collectives: all that the step issued, measured, with the\n"
           " all-gather of the B x Vp logits; KB sent per rank as a ring sends them; speedup against P = 1 at the same B)\n",
           2 * c->L + 1);
}

static void print_sample_gathered(Run* run, RankRun* rr, int step);

// every rank of replica 0 generates (they take part in the all-gathers); world rank 0 prints. From the KV
// cache (--kv 1), all --prompts at once; or (--kv 0) the whole forward over the last -t tokens per token.
// With pipeline stages every rank of the run calls it, and the sample comes from the gathered weights.
static void print_sample(Run* run, RankRun* rr, int step) {
    const Args* a = &run->args;
    if (rr->rk.S > 1) {
        print_sample_gathered(run, rr, step);
        return;
    }
    if (rr->rk.dp.rank != 0) return;  // the replicas hold the same weights: one generates
    if (rr->rk.rank == 0) g_phase.store(PHASE_SAMPLE);
    bool batch = !run->prompts.empty();
    std::vector<std::vector<int>> prompts = batch ? run->prompts : std::vector<std::vector<int>>{run->prompt}, out;
    auto stop = [&]() { return sample_stop_requested(run, &rr->rk); };
    GenStats st = {};
    double t0 = comm_now();
    int eot = batch ? stop_token(run) : -1;  // the rows of --prompts end at the end-of-text token; a sample runs -g tokens
    if (a->kv)
        out = generate_batch(&rr->m, &rr->rk, prompts, a->gen_tokens, a->T, a->temperature, a->topk, (uint64_t)a->sample_seed,
                             eot, stop, nullptr, &st);
    else
        for (const auto& p : prompts)
            out.push_back(generate(&rr->m, &rr->rk, p, a->gen_tokens, a->T, a->temperature, a->topk, (uint64_t)a->sample_seed, eot, stop));
    double seconds = comm_now() - t0;
    if (rr->world.rank != 0) return;
    g_phase.store(PHASE_STEP);
    char from[600];
    if (step > 0 || run->model_file.empty()) snprintf(from, sizeof(from), "after %d steps", step);
    else snprintf(from, sizeof(from), "of %s", run->model_file.c_str());
    printf("sample %s (temperature %g%s):\n", from, a->temperature, a->topk ? ", top-k" : "");
    long tokens = 0;
    for (const auto& o : out) tokens += (long)o.size();
    if (a->kv) print_gen_stats(run, &st);  // the timings first: what follows the first --- is the text alone
    else printf("the whole forward per token (--kv 0): %ld tokens in %.2f s: %.1f tokens/s, %.2f ms per token\n", tokens, seconds,
                tokens / seconds, seconds / std::max(1L, tokens) * 1e3);
    printf("---\n");
    for (size_t b = 0; b < out.size(); b++) {
        print_tokens(out[b], &run->tokenizer, run->cfg.V, batch ? run->prompt_texts[b].c_str() : a->prompt);
        bool ended = !out[b].empty() && out[b].back() == eot;
        bool cut = a->kv ? st.interrupted : (int)out[b].size() < a->gen_tokens && !ended;
        printf("\n---%s\n", cut ? " (interrupted)" : "");
    }
    fflush(stdout);
}

// A sample from a run with pipeline stages. Generation does not run through the stages (each holds other
// layers); instead replica 0's ranks gather their shards into the host's full copy of the weights
// (run->init, which checkpoints gather into as well), and one rank of its own, on the CPU in a thread of
// its own, generates from them at TP=1 (which draws the tokens any P draws: the sampling test) while the
// stages wait at a barrier; with the stages in several processes, process 0 collects theirs first. Every
// rank of the run calls it.
static void print_sample_gathered(Run* run, RankRun* rr, int step) {
    gpt_gather_masters(&rr->m, &rr->rk);  // ZeRO-1 in bf16: the replicas' slices of the masters
    if (rr->rk.dp.rank == 0) gpt_gather(&rr->m, &rr->rk, rr->m.params_mem, run->init.data());
    comm_barrier(&rr->world, "sample gathered");
    if (run->Sp > 1 && rr->world.local == 0)  // the stages of other processes send process 0 their layers
        comm_procs_collect(run->world, run->init.data(), run->stage_spans, "the sample's weights from the stages");
    if (rr->world.rank == 0) {
        std::thread sampler([run, step]() {
            CommGroup one;
            comm_group_init(&one, 1, run->args.timeout);
            RankRun sr;
            rank_init(&sr.rk, &one, 0, DEV_CPU, 0, cpu_cores());
            comm_init(&sr.world, &one, 0);
            gpt_build(&sr.m, &sr.rk, &run->cfg, run->init.data(), 0);
            sr.m.fused = run->args.attention != 0;
            print_sample(run, &sr, step);
            gpt_free(&sr.m, &sr.rk);
            rank_free(&sr.rk);
        });
        sampler.join();
    }
    comm_barrier(&rr->world, "sample printed");
}
