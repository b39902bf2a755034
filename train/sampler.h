// train/sampler.h (needs the model, gpt.cu): text from the model. Generation runs through the vocab-
// parallel LM head: each rank has the logits of its vocab slice only, so gpt_logits_row all-gathers one
// position's row, and every rank then draws from the same seeded generator, so all ranks agree on every
// token.
#pragma once
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>
#include "../gpt.cu"
#include "../data/tokenizer.h"

// One token from logits (the first V of them are real): greedy at temperature 0, else from
// softmax(logits / temperature) restricted to the topk largest (0: all), by inverse CDF.
static int sample_token(const float* logits, int V, float temperature, int topk, Rng* rng) {
    int best = 0;
    for (int i = 1; i < V; i++) if (logits[i] > logits[best]) best = i;
    if (temperature <= 0.0f) return best;
    float cut = -FLT_MAX;
    if (topk > 0 && topk < V) {
        std::vector<float> v(logits, logits + V);
        std::nth_element(v.begin(), v.begin() + (topk - 1), v.end(), std::greater<float>());
        cut = v[topk - 1];
    }
    std::vector<double> p(V);
    double z = 0.0;
    for (int i = 0; i < V; i++) {
        p[i] = logits[i] >= cut ? exp((double)(logits[i] - logits[best]) / temperature) : 0.0;
        z += p[i];
    }
    double u = rng_uniform(rng) * z, c = 0.0;
    for (int i = 0; i < V; i++) {
        c += p[i];
        if (u < c) return i;
    }
    return best;
}

// Autoregressive generation: n tokens after prompt, or fewer when the token eot is drawn (it ends the
// sample, as generate_batch's rows end; -1: none). Each step runs the model on the last T tokens (batch 1)
// and samples from the logits of the last position. Every rank of the group calls it.
// stop, if given, is asked before each token (by every rank: it must answer the same on all of them);
// true ends the sample early, with the tokens drawn so far.
static std::vector<int> generate(GPT* m, Rank* rk, const std::vector<int>& prompt, int n, int T, float temperature,
                                 int topk, uint64_t seed, int eot, const std::function<bool()>& stop = nullptr) {
    std::vector<int> out = prompt, window(T, 0);
    std::vector<float> logits(m->cfg.Vp);
    Rng rng = {seed};
    for (int i = 0; i < n && !(stop && stop()); i++) {
        int len = std::min((int)out.size(), T);
        std::copy(out.end() - len, out.end(), window.begin());
        gpt_forward(m, rk, window.data(), nullptr, 1, T, false);  // causal: the padding after len changes nothing
        gpt_logits_row(m, rk, 0, len - 1, logits.data());
        out.push_back(sample_token(logits.data(), m->cfg.V, temperature, topk, &rng));
        if (out.back() == eot) break;
    }
    return std::vector<int>(out.begin() + prompt.size(), out.end());
}

// Text made safe for a terminal: valid UTF-8 characters as they are, but control characters (C0 except
// newline and tab, DEL, C1) and bytes that are not valid UTF-8 become \xNN escapes, so a sample can never
// move the cursor, recolour the terminal or ring its bell.
static std::string escape_text(const std::string& s) {
    std::string out;
    char hex[8];
    for (size_t i = 0; i < s.size();) {
        unsigned char c = s[i];
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool valid = len > 0 && i + len <= s.size();
        uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
        for (int k = 1; valid && k < len; k++) {
            unsigned char cc = s[i + k];
            valid = (cc & 0xc0) == 0x80;
            cp = cp << 6 | (cc & 0x3f);
        }
        // overlong forms, UTF-16 surrogates and code points past U+10FFFF are not valid UTF-8 either
        if (valid) valid = !(len == 2 && cp < 0x80) && !(len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp < 0xe000))) &&
                           !(len == 4 && (cp < 0x10000 || cp > 0x10ffff));
        bool control = valid && ((cp < 0x20 && cp != '\n' && cp != '\t') || cp == 0x7f || (cp >= 0x80 && cp < 0xa0));
        int n = valid ? len : 1;  // an invalid byte alone, a control character whole
        for (int k = 0; k < n; k++) {
            if (valid && !control) out += s[i + k];
            else {
                snprintf(hex, sizeof(hex), "\\x%02x", (unsigned char)s[i + k]);
                out += hex;
            }
        }
        i += n;
    }
    return out;
}

// Prints generated tokens: as text when the tokenizer can decode them (a tokenizer file, or a byte-level
// vocab), else as ids. prompt_text, if any, is printed first.
static void print_tokens(const std::vector<int>& tokens, const Tokenizer* tk, int V, const char* prompt_text) {
    if (tk->pieces.empty() && V > 256) {
        for (int t : tokens) printf("%d ", t);
        return;
    }
    std::string text = prompt_text ? prompt_text : "";
    for (int t : tokens) text += tokenizer_decode(tk, t);
    printf("%s", escape_text(text).c_str());
}
