// data/tokenizer.h: turning token ids back into text, for printing samples. Byte-level models (vocab
// 256, the embedded corpus and data/prepare.py's default) need no file: token i is byte i. GPT-2 token
// ids are decoded with llm.c's gpt2_tokenizer.bin (--tokenizer): a header of 256 uint32 (magic
// 20240328, version 1 or 2, vocab size, and for version 2 the end-of-text id), then per token a length
// byte and that many bytes.
#pragma once
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include "../common/error.h"

struct Tokenizer {
    std::vector<std::string> pieces;  // empty: byte-level
    int eot;                          // the end-of-text id (the file's, or 50256 for a version-1 file)
};

// whether the tokenizer is the byte vocabulary (token i = byte i), as data/prepare.py writes for byte-level data
static bool tokenizer_is_bytes(const Tokenizer* tk) {
    if (tk->pieces.size() != 256) return false;
    for (int i = 0; i < 256; i++)
        if (tk->pieces[i] != std::string(1, (char)i)) return false;
    return true;
}

// Reads a tokenizer file for a model of vocab V; a tokenizer that cannot decode that model's tokens is
// refused with the fix.
static void tokenizer_load(Tokenizer* tk, const char* path, int V) {
    FILE* f = fopen(path, "rb");
    if (!f) fatal("cannot open tokenizer %s: %s", path, strerror(errno));
    uint32_t h[256];
    if (fread(h, 4, 256, f) != 256 || h[0] != 20240328)
        fatal("tokenizer %s is not an llm.c tokenizer file (magic 20240328)", path);
    if (h[1] != 1 && h[1] != 2) fatal("tokenizer %s has version %u; tp reads versions 1 and 2", path, h[1]);
    int n = (int)h[2];
    tk->eot = h[1] == 2 ? (int)h[3] : 50256;
    tk->pieces.resize(n);
    for (int i = 0; i < n; i++) {
        unsigned char len;
        if (fread(&len, 1, 1, f) != 1 || len == 0) fatal("tokenizer %s is truncated or corrupt at token %d", path, i);
        tk->pieces[i].resize(len);
        if (fread(&tk->pieces[i][0], 1, len, f) != len) fatal("tokenizer %s is truncated at token %d", path, i);
    }
    fclose(f);
    // the two mix-ups a user meets: byte-level data with a GPT-2-sized model, and the other way round
    if (n < V && tokenizer_is_bytes(tk))
        fatal("tokenizer %s is byte-level (256 tokens) but the model has vocab %d: a byte-level run needs a vocab-256 model "
              "(--vocab 256; with a descriptor -e, tp picks 256 itself when every token of the data is a byte)", path, V);
    if (n < V) fatal("tokenizer %s has %d tokens but the model's vocab has %d: give the tokenizer the data was made with", path, n, V);
    if (V == 256 && !tokenizer_is_bytes(tk))
        fatal("tokenizer %s has %d tokens but the model is byte-level (vocab 256): it prints its text without a tokenizer; drop --tokenizer", path, n);
}

static std::string tokenizer_decode(const Tokenizer* tk, int id) {
    if (tk->pieces.empty()) return std::string(1, (char)id);
    return tk->pieces[id];
}
