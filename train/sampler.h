// train/sampler.h: text from the model. Generation runs through the vocab-parallel LM head: each rank
// has the logits of its vocab slice only, so gpt_logits_row all-gathers one position's row, and every
// rank then draws from the same seeded generator, so all ranks agree on every token.
#pragma once
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <functional>
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

// Autoregressive generation: n tokens after prompt. Each step runs the model on the last T tokens
// (batch 1) and samples from the logits of the last position. Every rank of the group calls it.
static std::vector<int> generate(GPT* m, Rank* rk, const std::vector<int>& prompt, int n, int T, float temperature,
                                 int topk, uint64_t seed) {
    std::vector<int> out = prompt, window(T, 0);
    std::vector<float> logits(m->cfg.Vp);
    Rng rng = {seed};
    for (int i = 0; i < n; i++) {
        int len = std::min((int)out.size(), T);
        std::copy(out.end() - len, out.end(), window.begin());
        gpt_forward(m, rk, window.data(), nullptr, 1, T, false);  // causal: the padding after len changes nothing
        gpt_logits_row(m, rk, 0, len - 1, logits.data());
        out.push_back(sample_token(logits.data(), m->cfg.V, temperature, topk, &rng));
    }
    return std::vector<int>(out.begin() + prompt.size(), out.end());
}

// Prints generated tokens: as text when the tokenizer can decode them (a tokenizer file, or a byte-level
// vocab), else as ids. prompt_text, if any, is printed first.
static void print_tokens(const std::vector<int>& tokens, const Tokenizer* tk, int V, const char* prompt_text) {
    bool text = !tk->pieces.empty() || V <= 256;
    if (prompt_text) printf("%s", prompt_text);
    for (int t : tokens) {
        if (text) printf("%s", tokenizer_decode(tk, t).c_str());
        else printf("%d ", t);
    }
}
