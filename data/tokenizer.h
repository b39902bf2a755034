// data/tokenizer.h: token ids to text and back. Byte-level models (vocab 256, the embedded corpus and
// data/prepare.py's default) need no file: token i is byte i. Two kinds of file:
//  - a Hugging Face tokenizer.json of a byte-level BPE (data/prepare.py --vocab N writes one, and GPT-2's
//    own is one): decodes samples and encodes --prompt (data/bpe.h);
//  - llm.c's gpt2_tokenizer.bin, which decodes only: a header of 256 uint32 (magic 20240328, version 1
//    or 2, vocab size, and for version 2 the end-of-text id), then per token a length byte and that many
//    bytes.
// Without --tokenizer, tp looks for a tokenizer.json next to the data, the model or in the run folder
// (tokenizer_find), and a run folder's tokenizer.bin. A run on the embedded corpus's words (data/grammar.h)
// uses their table, and writes it to its run folder as llm.c's tokenizer.bin; read back, a file that holds
// exactly those words encodes prompts too.
#pragma once
#include <sys/stat.h>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include "../common/error.h"
#include "bpe.h"
#include "grammar.h"

struct Tokenizer {
    std::vector<std::string> pieces;  // empty: byte-level
    int eot = -1;                     // the end-of-text id (the file's; a version-1 file: 50256 if it has that many; -1: none)
    bool bpe = false;                 // a tokenizer.json: it can encode, with `merges`
    bool words = false;               // the embedded corpus's words (grammar_vocab): encodes with grammar_encode
    Bpe merges;
    std::string path;                 // the file it came from
    std::string from;                 // how: "--tokenizer", "found next to -i", ...
};

// whether the tokenizer is the byte vocabulary (token i = byte i), as data/prepare.py writes for byte-level data
static bool tokenizer_is_bytes(const Tokenizer* tk) {
    if (tk->pieces.size() != 256) return false;
    for (int i = 0; i < 256; i++)
        if (tk->pieces[i] != std::string(1, (char)i)) return false;
    return true;
}

// Reads a tokenizer file: a Hugging Face tokenizer.json (it starts with '{') or llm.c's tokenizer.bin.
static void tokenizer_read(Tokenizer* tk, const char* path) {
    FILE* f = fopen(path, "rb");
    if (!f) fatal("cannot open tokenizer %s: %s", path, strerror(errno));
    tk->path = path;
    int c0 = fgetc(f);
    while (c0 == ' ' || c0 == '\n' || c0 == '\r' || c0 == '\t') c0 = fgetc(f);
    if (c0 == '{') {
        std::string text = "{";
        char buf[1 << 16];
        size_t got;
        while ((got = fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, got);
        fclose(f);
        tk->eot = bpe_load_json(path, text, &tk->pieces, &tk->merges);
        tk->bpe = true;
        return;
    }
    rewind(f);
    uint32_t h[256];
    if (fread(h, 4, 256, f) != 256 || h[0] != 20240328)
        fatal("tokenizer %s is neither a Hugging Face tokenizer.json nor an llm.c tokenizer file (magic 20240328)", path);
    if (h[1] != 1 && h[1] != 2) fatal("tokenizer %s has version %u; tp reads versions 1 and 2", path, h[1]);
    // every piece takes at least 2 bytes (its length, one byte), so the count is bounded by the file's size:
    // a damaged count is refused before it is allocated
    struct stat st;
    long room = fstat(fileno(f), &st) == 0 ? ((long)st.st_size - 1024) / 2 : 0;
    if (h[2] == 0) fatal("tokenizer %s says it has no tokens: the file is damaged", path);
    if ((long)h[2] > room)
        fatal("tokenizer %s says it has %u tokens, which its %ld bytes cannot hold: the file is damaged", path, h[2], room * 2 + 1024);
    int n = (int)h[2];
    tk->eot = h[1] == 2 ? (int)h[3] : n > 50256 ? 50256 : -1;  // version 1 has no field: GPT-2's id, if it has that many
    if (h[1] == 2 && tk->eot != -1 && (tk->eot < 0 || tk->eot >= n))
        fatal("tokenizer %s gives end-of-text id %d, not one of its %d tokens (or -1 for none): the file is damaged", path, (int)h[3], n);
    tk->pieces.resize(n);
    for (int i = 0; i < n; i++) {
        unsigned char len;
        if (fread(&len, 1, 1, f) != 1 || len == 0) fatal("tokenizer %s is truncated or corrupt at token %d", path, i);
        tk->pieces[i].resize(len);
        if (fread(&tk->pieces[i][0], 1, len, f) != len) fatal("tokenizer %s is truncated at token %d", path, i);
    }
    fclose(f);
    tk->words = tk->pieces == grammar_vocab();
}

// The embedded corpus's words, as a run on them decodes and encodes its text; no end-of-text token.
static void tokenizer_words(Tokenizer* tk) {
    *tk = Tokenizer();
    tk->pieces = grammar_vocab();
    tk->words = true;
    tk->from = "the embedded corpus's words";
}

// Writes tk's pieces as llm.c's tokenizer file (version 2, end-of-text id -1 when it has none) through a
// temporary name, so that a run folder decodes its samples on its own.
static void tokenizer_write_bin(const Tokenizer* tk, const char* path) {
    std::string tmp = std::string(path) + ".tmp";
    FILE* f = fopen(tmp.c_str(), "wb");
    if (!f) fatal("cannot write %s: %s", tmp.c_str(), strerror(errno));
    uint32_t h[256] = {20240328, 2, (uint32_t)tk->pieces.size(), (uint32_t)tk->eot};
    bool ok = fwrite(h, 4, 256, f) == 256;
    for (const std::string& p : tk->pieces) {
        unsigned char len = (unsigned char)p.size();
        ok = ok && !p.empty() && p.size() < 256 && fwrite(&len, 1, 1, f) == 1 && fwrite(p.data(), 1, len, f) == len;
    }
    if (fclose(f) != 0 || !ok || rename(tmp.c_str(), path) != 0) {
        int e = errno;
        remove(tmp.c_str());
        fatal("cannot write %s: %s", path, strerror(e));
    }
}

// Whether tokenizer tk can decode (and encode) the tokens of a model of vocab V; one line with the fix if not.
static void tokenizer_check(const Tokenizer* tk, int V) {
    const char* path = tk->path.c_str();
    int n = (int)tk->pieces.size();
    if (tk->bpe && n != V)
        fatal("tokenizer %s has vocab %d but the model has vocab %d: give the tokenizer the data was made with (--tokenizer FILE), "
              "or train a new model on this data (-e with a descriptor takes its vocab from the tokenizer)", path, n, V);
    if (tk->bpe || tk->words) return;  // words: a larger model's extra ids decode as <id>
    // the two mix-ups a user meets: byte-level data with a GPT-2-sized model, and the other way round
    if (n < V && tokenizer_is_bytes(tk))
        fatal("tokenizer %s is byte-level (256 tokens) but the model has vocab %d: a byte-level run needs a vocab-256 model "
              "(--vocab 256; with a descriptor -e, tp picks 256 itself when every token of the data is a byte)", path, V);
    if (n < V) fatal("tokenizer %s has %d tokens but the model's vocab has %d: give the tokenizer the data was made with", path, n, V);
    if (V == 256 && !tokenizer_is_bytes(tk))
        fatal("tokenizer %s has %d tokens but the model is byte-level (vocab 256): it prints its text without a tokenizer; drop --tokenizer", path, n);
}

// Reads a tokenizer file for a model of vocab V; a tokenizer that cannot decode that model's tokens is
// refused with the fix.
static void tokenizer_load(Tokenizer* tk, const char* path, int V) {
    tokenizer_read(tk, path);
    tokenizer_check(tk, V);
}

// whether a file exists (and is not a directory)
static bool file_exists(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && !S_ISDIR(st.st_mode);
}

// the folder part of a path ("." for none)
static std::string dir_of(const std::string& path) {
    size_t s = path.rfind('/');
    return s == std::string::npos ? "." : s == 0 ? "/" : path.substr(0, s);
}

// The tokenizer file a user means without --tokenizer, or "": next to the train data (-i D/NAME_train...
// -> D/NAME_tokenizer.json, as data/prepare.py writes it, else D/tokenizer.json), next to the model file
// (-e D/model.bin -> D/tokenizer.json, or D/tokenizer.bin, as run folders hold them), or in the run folder -o. *where says
// which.
static std::string tokenizer_find(const char* train, const char* model, const char* outdir, std::string* where) {
    if (train) {
        std::string t = train, dir = dir_of(t), base = t.substr(t.rfind('/') == std::string::npos ? 0 : t.rfind('/') + 1);
        size_t cut = base.rfind("_train");
        if (cut != std::string::npos && file_exists(dir + "/" + base.substr(0, cut) + "_tokenizer.json")) {
            *where = "found next to -i";
            return dir + "/" + base.substr(0, cut) + "_tokenizer.json";
        }
        if (file_exists(dir + "/tokenizer.json")) {
            *where = "found next to -i";
            return dir + "/tokenizer.json";
        }
    }
    for (const char* name : {"/tokenizer.json", "/tokenizer.bin"}) {  // a run folder's, .bin for the embedded corpus's words
        if (model && file_exists(dir_of(model) + name) && file_exists(model)) {
            *where = "found next to -e";
            return dir_of(model) + name;
        }
        if (outdir && file_exists(std::string(outdir) + name)) {
            *where = "found in -o";
            return std::string(outdir) + name;
        }
    }
    return "";
}

// Copies the tokenizer file src into the run folder as DIR/tokenizer.json (through a temporary name), so
// the folder can be sampled and exported on its own; nothing when it is that file already.
static void tokenizer_copy(const std::string& src, const char* dir) {
    std::string dst = std::string(dir) + "/tokenizer.json", tmp = dst + ".tmp";
    struct stat a, b;
    if (stat(src.c_str(), &a) == 0 && stat(dst.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) return;
    FILE* in = fopen(src.c_str(), "rb");
    FILE* out = fopen(tmp.c_str(), "wb");
    if (!in || !out) fatal("cannot copy tokenizer %s to %s: %s", src.c_str(), dst.c_str(), strerror(errno));
    char buf[1 << 16];
    size_t got;
    bool ok = true;
    while ((got = fread(buf, 1, sizeof(buf), in)) > 0) ok = ok && fwrite(buf, 1, got, out) == got;
    fclose(in);
    if (fclose(out) != 0 || !ok || rename(tmp.c_str(), dst.c_str()) != 0)
        fatal("cannot write %s: %s", dst.c_str(), strerror(errno));
}

static std::string tokenizer_decode(const Tokenizer* tk, int id) {
    if (tk->pieces.empty()) return std::string(1, (char)id);
    if (id < 0 || id >= (int)tk->pieces.size()) return "<" + std::to_string(id) + ">";  // a padded or extra id
    return tk->pieces[id];
}
