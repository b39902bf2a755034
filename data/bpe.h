// data/bpe.h: byte-level BPE as Hugging Face `tokenizers` runs it (GPT-2's scheme), read from its
// tokenizer.json: decode ids to bytes for samples, and encode --prompt with the same merges.
//
// Encoding a text, step by step:
//   1. added tokens (like <|endoftext|>) found verbatim in the text become their ids;
//   2. the rest is cut into words by GPT-2's pre-tokenizer regex
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (written out by hand below, on code points);
//   3. each word's UTF-8 bytes start as one token each (the byte-level alphabet: byte b is the vocab
//      entry of the printable character GPT-2's bytes_to_unicode maps it to), and the merges are applied:
//      again and again the adjacent pair with the lowest merge rank (leftmost on a tie) becomes one token.
// A merge never crosses a word, and a word never crosses a character, so encoding is per word.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>
#include "../common/error.h"
#include "unicode.h"

// ----------------------------------------------------------------------------
// a small JSON reader: enough for tokenizer.json

struct Json {
    enum Type { NUL, BOOL, NUM, STR, ARR, OBJ } type = NUL;
    double num = 0;
    std::string str;                                   // STR
    std::vector<Json> items;                           // ARR
    std::vector<std::pair<std::string, Json>> fields;  // OBJ, in file order
};

struct JsonParser {
    const char* s;
    size_t n, i;
    const char* path;  // for the error
    int depth = 0;     // arrays and objects open around p->i (the reader recurses into each)
};

// stops with one line naming the file and the byte where the JSON went wrong
static void json_fail(JsonParser* p, const char* what) {
    fatal("tokenizer %s is not valid JSON (%s at byte %zu): give the tokenizer.json that prepare.py or Hugging Face wrote", p->path, what, p->i);
}

// skips spaces, tabs and newlines
static void json_ws(JsonParser* p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r')) p->i++;
}

// appends code point cp to out as UTF-8
static void utf8_put(std::string* out, uint32_t cp) {
    if (cp < 0x80) *out += (char)cp;
    else if (cp < 0x800) { *out += (char)(0xc0 | cp >> 6); *out += (char)(0x80 | (cp & 0x3f)); }
    else if (cp < 0x10000) { *out += (char)(0xe0 | cp >> 12); *out += (char)(0x80 | (cp >> 6 & 0x3f)); *out += (char)(0x80 | (cp & 0x3f)); }
    else { *out += (char)(0xf0 | cp >> 18); *out += (char)(0x80 | (cp >> 12 & 0x3f)); *out += (char)(0x80 | (cp >> 6 & 0x3f)); *out += (char)(0x80 | (cp & 0x3f)); }
}

// four hex digits of a \u escape
static uint32_t json_hex4(JsonParser* p) {
    if (p->i + 4 > p->n) json_fail(p, "a short \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p->s[p->i++];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else json_fail(p, "a bad \\u escape");
    }
    return v;
}

// a string, the opening quote at p->i; escapes (\u with surrogate pairs too) become UTF-8
static std::string json_string(JsonParser* p) {
    std::string out;
    p->i++;
    while (true) {
        if (p->i >= p->n) json_fail(p, "an unterminated string");
        char c = p->s[p->i++];
        if (c == '"') return out;
        if (c != '\\') { out += c; continue; }
        if (p->i >= p->n) json_fail(p, "an unterminated string");
        char e = p->s[p->i++];
        switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
            uint32_t cp = json_hex4(p);
            if (cp >= 0xd800 && cp < 0xdc00 && p->i + 1 < p->n && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
                p->i += 2;
                uint32_t lo = json_hex4(p);
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            utf8_put(&out, cp);
            break;
        }
        default: json_fail(p, "a bad escape");
        }
    }
}

// one value at p->i (recursive for arrays and objects)
static void json_value(JsonParser* p, Json* v) {
    json_ws(p);
    if (p->i >= p->n) json_fail(p, "the end of the file");
    char c = p->s[p->i];
    if (c == '"') {
        v->type = Json::STR;
        v->str = json_string(p);
    } else if (c == '[' || c == '{') {
        bool obj = c == '{';
        v->type = obj ? Json::OBJ : Json::ARR;
        // a tokenizer.json nests a few levels deep; a damaged file's thousands of '[' must not overflow the stack
        if (++p->depth > 256) json_fail(p, "arrays or objects nested more than 256 deep");
        p->i++;
        json_ws(p);
        if (p->i < p->n && p->s[p->i] == (obj ? '}' : ']')) { p->i++; p->depth--; return; }
        while (true) {
            json_ws(p);
            if (obj) {
                if (p->i >= p->n || p->s[p->i] != '"') json_fail(p, "an object key that is not a string");
                v->fields.emplace_back(json_string(p), Json());
                json_ws(p);
                if (p->i >= p->n || p->s[p->i] != ':') json_fail(p, "a missing ':'");
                p->i++;
                json_value(p, &v->fields.back().second);
            } else {
                v->items.emplace_back();
                json_value(p, &v->items.back());
            }
            json_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') { p->i++; continue; }
            if (p->i < p->n && p->s[p->i] == (obj ? '}' : ']')) { p->i++; p->depth--; return; }
            json_fail(p, obj ? "a missing ',' or '}'" : "a missing ',' or ']'");
        }
    } else if (!strncmp(p->s + p->i, "true", 4) || !strncmp(p->s + p->i, "false", 5)) {
        v->type = Json::BOOL;
        v->num = p->s[p->i] == 't';
        p->i += p->s[p->i] == 't' ? 4 : 5;
    } else if (!strncmp(p->s + p->i, "null", 4)) {
        v->type = Json::NUL;
        p->i += 4;
    } else {
        char* end;
        v->type = Json::NUM;
        v->num = strtod(p->s + p->i, &end);
        if (end == p->s + p->i) json_fail(p, "an unexpected character");
        p->i = end - p->s;
    }
}

// the field `key` of an object, or nullptr
static const Json* json_get(const Json* obj, const char* key) {
    if (!obj || obj->type != Json::OBJ) return nullptr;
    for (const auto& f : obj->fields)
        if (f.first == key) return &f.second;
    return nullptr;
}

// the string field `key` of an object, or "" when it is absent or not a string
static std::string json_str(const Json* obj, const char* key) {
    const Json* v = json_get(obj, key);
    return v && v->type == Json::STR ? v->str : "";
}

// whether the field `key` is true
static bool json_true(const Json* obj, const char* key) {
    const Json* v = json_get(obj, key);
    return v && v->type == Json::BOOL && v->num != 0;
}

// ----------------------------------------------------------------------------
// the byte-level alphabet and the character classes

// GPT-2's bytes_to_unicode: the printable bytes stand for themselves, the other 68 (controls, space,
// and a few in Latin-1) are moved to code points 256 and up, in byte order, so every byte has a visible
// character for the vocab file
static uint32_t byte_to_unicode(int b) {
    auto printable = [](int x) { return (x >= '!' && x <= '~') || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff); };
    if (printable(b)) return (uint32_t)b;
    int k = 0;
    for (int x = 0; x < b; x++) k += !printable(x);
    return 256 + k;
}

// whether code point cp lies in one of the sorted [first, last] ranges
static bool uni_in(const uint32_t (*r)[2], int n, uint32_t cp) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < r[mid][0]) hi = mid - 1;
        else if (cp > r[mid][1]) lo = mid + 1;
        else return true;
    }
    return false;
}

static bool uni_letter(uint32_t cp) { return uni_in(UNI_LETTERS, sizeof(UNI_LETTERS) / sizeof(UNI_LETTERS[0]), cp); }
static bool uni_number(uint32_t cp) { return uni_in(UNI_NUMBERS, sizeof(UNI_NUMBERS) / sizeof(UNI_NUMBERS[0]), cp); }

// the regex \s with Unicode: the White_Space code points
static bool uni_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

// the text's code points, with the byte offset where each starts (one entry more: the end); a byte that
// is not valid UTF-8 counts as a character of its own (of the class "other")
static void utf8_split(const std::string& s, std::vector<uint32_t>* cps, std::vector<size_t>* at) {
    cps->clear();
    at->clear();
    for (size_t i = 0; i < s.size();) {
        unsigned char c = s[i];
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
        bool ok = len > 0 && i + len <= s.size();
        for (int k = 1; ok && k < len; k++) {
            ok = ((unsigned char)s[i + k] & 0xc0) == 0x80;
            cp = cp << 6 | ((unsigned char)s[i + k] & 0x3f);
        }
        if (!ok) { len = 1; cp = 0xfffd; }
        at->push_back(i);
        cps->push_back(cp);
        i += len;
    }
    at->push_back(s.size());
}

// GPT-2's pre-tokenizer: the byte ranges [begin, end) of the words of s, by the regex at the top
static std::vector<std::pair<size_t, size_t>> bpe_words(const std::string& s) {
    std::vector<uint32_t> cp;
    std::vector<size_t> at;
    utf8_split(s, &cp, &at);
    int n = (int)cp.size();
    auto other = [](uint32_t c) { return !uni_space(c) && !uni_letter(c) && !uni_number(c); };
    auto run = [&](int i, bool (*cls)(uint32_t)) { while (i < n && cls(cp[i])) i++; return i; };
    auto run_other = [&](int i) { while (i < n && other(cp[i])) i++; return i; };
    std::vector<std::pair<size_t, size_t>> words;
    for (int i = 0; i < n;) {
        int j = 0;
        auto next = [&](int k, uint32_t c) { return k < n && cp[k] == c; };
        if (cp[i] == '\'' && (next(i + 1, 's') || next(i + 1, 't') || next(i + 1, 'm') || next(i + 1, 'd'))) j = i + 2;
        else if (cp[i] == '\'' && ((next(i + 1, 'r') && next(i + 2, 'e')) || (next(i + 1, 'v') && next(i + 2, 'e')) || (next(i + 1, 'l') && next(i + 2, 'l'))))
            j = i + 3;
        else {
            int k = cp[i] == ' ' ? i + 1 : i;  // the optional leading space of a letter, number or other run
            if (k < n && uni_letter(cp[k])) j = run(k, uni_letter);
            else if (k < n && uni_number(cp[k])) j = run(k, uni_number);
            else if (k < n && other(cp[k])) j = run_other(k);
            else {  // whitespace: all of it at the end; before a non-space all but its last character, which goes with what follows
                int e = run(i, uni_space);
                j = e == n || e - i == 1 ? e : e - 1;
            }
        }
        words.emplace_back(at[i], at[j]);
        i = j;
    }
    return words;
}

// ----------------------------------------------------------------------------
// the tokenizer

struct Bpe {
    int byte_id[256];                                      // the id of each single byte
    std::unordered_map<uint64_t, std::pair<int, int>> merges;  // (left id << 32 | right id) -> (rank, merged id)
    std::unordered_map<std::string, int> vocab;            // a token's bytes -> its id (for ignore_merges)
    std::vector<std::pair<std::string, int>> added;        // added tokens: text -> id, matched before the words
    bool add_prefix_space = false, use_regex = true, ignore_merges = false;
};

// the merges applied to one word (its bytes); appends the ids to out
static void bpe_word(const Bpe* b, const std::string& word, std::vector<int>* out) {
    if (b->ignore_merges) {
        auto it = b->vocab.find(word);
        if (it != b->vocab.end()) { out->push_back(it->second); return; }
    }
    std::vector<int> ids;
    for (unsigned char c : word) ids.push_back(b->byte_id[c]);
    while (ids.size() > 1) {
        int best = -1, best_rank = INT32_MAX, merged = -1;
        for (size_t p = 0; p + 1 < ids.size(); p++) {
            auto it = b->merges.find((uint64_t)(uint32_t)ids[p] << 32 | (uint32_t)ids[p + 1]);
            if (it != b->merges.end() && it->second.first < best_rank) {
                best_rank = it->second.first;
                best = (int)p;
                merged = it->second.second;
            }
        }
        if (best < 0) break;
        ids[best] = merged;
        ids.erase(ids.begin() + best + 1);
    }
    out->insert(out->end(), ids.begin(), ids.end());
}

// a text without added tokens in it: words, then merges
static void bpe_encode_plain(const Bpe* b, std::string s, std::vector<int>* out) {
    if (s.empty()) return;
    if (b->add_prefix_space && s[0] != ' ') s = " " + s;
    if (!b->use_regex) { bpe_word(b, s, out); return; }
    for (auto w : bpe_words(s)) bpe_word(b, s.substr(w.first, w.second - w.first), out);
}

// text -> token ids, as Hugging Face's tokenizer.encode(text).ids gives them
static std::vector<int> bpe_encode(const Bpe* b, const std::string& s) {
    std::vector<int> out;
    size_t start = 0;
    for (size_t i = 0; i < s.size();) {
        int id = -1;
        size_t len = 0;
        for (const auto& a : b->added)  // the longest added token that starts here
            if (a.first.size() > len && s.compare(i, a.first.size(), a.first) == 0) { id = a.second; len = a.first.size(); }
        if (id < 0) { i++; continue; }
        bpe_encode_plain(b, s.substr(start, i - start), &out);
        out.push_back(id);
        i += len;
        start = i;
    }
    bpe_encode_plain(b, s.substr(start), &out);
    return out;
}

// The merges of a tokenizer.json into b->merges: "left right" strings (older files) or [left, right] pairs,
// each naming tokens of the vocab (ids: the vocab as the file writes it); a merge's rank is its position in
// the list, and the first of two merges of the same pair wins.
static void bpe_read_merges(const char* path, const Json* merges, const std::unordered_map<std::string, int>& ids, Bpe* b) {
    int rank = 0;
    for (const Json& m : merges->items) {
        std::string l, r;
        if (m.type == Json::STR && m.str.find(' ') != std::string::npos) {
            l = m.str.substr(0, m.str.find(' '));
            r = m.str.substr(m.str.find(' ') + 1);
        } else if (m.type == Json::ARR && m.items.size() == 2) {
            l = m.items[0].str;
            r = m.items[1].str;
        } else {
            fatal("tokenizer %s: merge %d is neither \"left right\" nor [left, right]", path, rank);
        }
        auto il = ids.find(l), ir = ids.find(r), ilr = ids.find(l + r);
        if (il == ids.end() || ir == ids.end() || ilr == ids.end())
            fatal("tokenizer %s: merge %d (\"%s\" \"%s\") names a token that is not in the vocab", path, rank, l.c_str(), r.c_str());
        uint64_t key = (uint64_t)(uint32_t)il->second << 32 | (uint32_t)ir->second;
        if (!b->merges.count(key)) b->merges[key] = {rank, ilr->second};
        rank++;
    }
}

// Reads a Hugging Face tokenizer.json (the whole file in `text`) of a byte-level BPE: its vocab becomes
// pieces (id -> bytes), and *b gets what encoding needs. Anything else (WordPiece, a normalizer, a
// pre-tokenizer that is not ByteLevel) is refused with one line. Returns the end-of-text id, or -1.
static int bpe_load_json(const char* path, const std::string& text, std::vector<std::string>* pieces, Bpe* b) {
    JsonParser p = {text.data(), text.size(), 0, path};
    Json root;
    json_value(&p, &root);
    const Json* model = json_get(&root, "model");
    const Json* vocab = json_get(model, "vocab");
    const Json* merges = json_get(model, "merges");
    const Json* pre = json_get(&root, "pre_tokenizer");
    const Json* norm = json_get(&root, "normalizer");
    if (json_str(model, "type") != "BPE" || !vocab || vocab->type != Json::OBJ || !merges || merges->type != Json::ARR)
        fatal("tokenizer %s is not a BPE tokenizer.json (model.type \"%s\"): tp reads byte-level BPE, as data/prepare.py --vocab N writes it",
              path, json_str(model, "type").c_str());
    if (json_str(pre, "type") != "ByteLevel" || (norm && norm->type != Json::NUL) || !json_str(model, "continuing_subword_prefix").empty() ||
        !json_str(model, "end_of_word_suffix").empty())
        fatal("tokenizer %s is BPE but not GPT-2's byte-level kind (pre-tokenizer \"%s\"%s): tp encodes only ByteLevel BPE without a "
              "normalizer, as data/prepare.py --vocab N writes it", path, json_str(pre, "type").c_str(), norm && norm->type != Json::NUL ? ", a normalizer" : "");
    b->add_prefix_space = json_true(pre, "add_prefix_space");
    const Json* re = json_get(pre, "use_regex");
    b->use_regex = !re || re->type != Json::BOOL || re->num != 0;
    b->ignore_merges = json_true(model, "ignore_merges");
    // the byte-level characters back to bytes
    std::unordered_map<uint32_t, int> to_byte;
    for (int c = 0; c < 256; c++) to_byte[byte_to_unicode(c)] = c;
    std::unordered_map<std::string, int> ids;  // the vocab as the file writes it (byte-level characters)
    int n = 0;
    for (const auto& f : vocab->fields) {
        if (f.second.type != Json::NUM || f.second.num < 0 || f.second.num > 1 << 24) fatal("tokenizer %s: token \"%s\" has a bad id", path, f.first.c_str());
        n = std::max(n, (int)f.second.num + 1);
    }
    const Json* added = json_get(&root, "added_tokens");
    if (added && added->type == Json::ARR)
        for (const Json& t : added->items) n = std::max(n, (int)json_get(&t, "id")->num + 1);
    pieces->assign(n, std::string());
    std::vector<uint32_t> cps;
    std::vector<size_t> at;
    for (const auto& f : vocab->fields) {
        int id = (int)f.second.num;
        ids[f.first] = id;
        utf8_split(f.first, &cps, &at);
        std::string bytes;
        for (uint32_t c : cps) {
            auto it = to_byte.find(c);
            if (it == to_byte.end()) fatal("tokenizer %s: token %d (\"%s\") is not made of byte-level characters: tp reads byte-level BPE only", path, id, f.first.c_str());
            bytes += (char)it->second;
        }
        (*pieces)[id] = bytes;
        b->vocab[bytes] = id;
    }
    for (int c = 0; c < 256; c++) {
        std::string ch;
        utf8_put(&ch, byte_to_unicode(c));
        auto it = ids.find(ch);
        if (it == ids.end()) fatal("tokenizer %s lacks the byte-level token of byte %d: it cannot encode every text; train it with the full byte alphabet (prepare.py does)", path, c);
        b->byte_id[c] = it->second;
    }
    int eot = -1;
    if (added && added->type == Json::ARR)
        for (const Json& t : added->items) {
            int id = (int)json_get(&t, "id")->num;
            std::string s = json_str(&t, "content");
            (*pieces)[id] = s;
            b->added.emplace_back(s, id);
            if (s == "<|endoftext|>") eot = id;
        }
    for (int id = 0; id < n; id++)
        if ((*pieces)[id].empty()) fatal("tokenizer %s has no token with id %d (its ids must run from 0 to %d)", path, id, n - 1);
    bpe_read_merges(path, merges, ids, b);
    return eot;
}
