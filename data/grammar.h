// grammar.h - the embedded default corpus: a seeded probabilistic grammar of English-like sentences.
// Header-only, C++17, standard library only (also compiles under nvcc as host code).
//
//   grammar_generate(seed, nbytes, &out, &logprob)  appends whole sentences until out.size() >= nbytes
//   grammar_entropy_per_byte()                      exact entropy rate of that byte stream (nats/byte)
//   grammar_vocab()                                 the word tokens: every terminal (" dog", ".", "\n"),
//                                                   then the capitalised form of each sentence-initial word
//   grammar_generate_tokens(seed, ntok, &out, &lp)  the same sentences as grammar_generate(seed, ...), as
//                                                   word tokens, until out.size() >= ntok
//   grammar_entropy_per_token()                     exact entropy rate of that token stream (nats/token)
//   grammar_encode(text, &ids, &why)                text -> word tokens (longest match), for prompts
//
// Words or bytes: a byte-level model spends most of its steps learning to spell; a word token carries
// 4.4 bytes of the same text, so the same model sees 4.4x the text per step and the default run gets within
// a few percent of the floor in a minute. The token stream is a function of the derivation and decodes
// back to the byte stream, so both carry the same entropy per sentence: the rates differ only by the
// expected tokens against bytes per sentence, and "% above the floor" means the same in either.
//
// Because the generating distribution is known exactly, a model's validation loss can be compared
// against the true floor instead of guessing how good "good" is.
//
// Why the entropy rate is exact (the argument the analysis relies on):
//  1. The grammar is a finite, acyclic CFG (nonterminals are layered: a clause inside a relative,
//     subordinate or trailing clause uses the "0" variants that cannot nest again), so H and E[len]
//     are a finite memoized recursion over nonterminals.
//  2. The grammar is unambiguous, so derivation -> byte string is injective. Choice points are told
//     apart by word classes that never overlap where they compete: singular vs plural nouns, verb
//     forms, subject vs object pronouns, adverbs vs prepositions vs conjunctions are disjoint sets;
//     "that" is only a relativizer ("that"+verb = subject relative, "that"+noun phrase = object
//     relative); relative-clause VPs take no modifiers, so a trailing adverb/PP belongs to the main
//     VP; noun phrases never take PPs (no PP-attachment ambiguity); opener phrases end with a comma.
//     Capitalizing the first letter is invertible because every word is lowercase.
//  3. Every sentence ends with exactly one of . ? ! followed by one separator (space or newline) and
//     those punctuation characters and newline occur nowhere else, so the stream splits into
//     sentences uniquely (the code is prefix-free). Sentences are i.i.d., so by renewal-reward the
//     entropy rate is H(sentence) / E[bytes per sentence], and H(sentence) = H(derivation) by 2.
//  Point 2 was checked by counting the parse trees of 370k sampled sentences against these
//  tables: every one had exactly one. Change the tables with the same care.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <unordered_map>
#include <vector>

namespace grammar_detail {

// A symbol is a nonterminal id (>= 0) or ~terminal id (< 0).
struct Alt { uint32_t w; double logp; std::vector<int> syms; };
struct Nonterm { std::string name; std::vector<Alt> alts; uint64_t total; };
struct Grammar {
    std::vector<Nonterm> nts;
    std::vector<std::string> terms;
    std::unordered_map<std::string, int> nt_ids, term_ids;
    int start;
};

inline int nt_id(Grammar& g, const std::string& name) {
    auto it = g.nt_ids.find(name);
    if (it != g.nt_ids.end()) return it->second;
    g.nts.push_back(Nonterm{name, {}, 0});
    return g.nt_ids[name] = (int)g.nts.size() - 1;
}
inline int term_sym(Grammar& g, const std::string& s) {
    auto it = g.term_ids.find(s);
    if (it != g.term_ids.end()) return ~it->second;
    g.terms.push_back(s);
    return ~(g.term_ids[s] = (int)g.terms.size() - 1);
}
inline std::vector<std::string> split_ws(const std::string& s) {
    std::vector<std::string> v; std::string cur;
    for (char c : s) {
        if (c == ' ' || c == '\n') { if (!cur.empty()) v.push_back(cur); cur.clear(); }
        else cur += c;
    }
    if (!cur.empty()) v.push_back(cur);
    return v;
}
// Symbol token: UPPER_CASE = nonterminal, a lowercase word = terminal " word" (the leading space
// separates it from the previous token), anything else (punctuation) = terminal as written.
inline int parse_sym(Grammar& g, const std::string& t) {
    if (t[0] >= 'A' && t[0] <= 'Z') return nt_id(g, t);
    if (t[0] >= 'a' && t[0] <= 'z') return term_sym(g, " " + t);
    return term_sym(g, t);
}
inline void add_alt(Grammar& g, int nt, uint32_t w, std::vector<int> syms) {
    g.nts[nt].alts.push_back(Alt{w, 0.0, std::move(syms)});
}
// def(g, "X", "4 | 2 ADV | 1 ADV PP"): alternatives separated by '|', each "weight symbols...";
// a bare weight is the empty alternative.
inline void def(Grammar& g, const char* name, const std::string& rhs) {
    int nt = nt_id(g, name);
    size_t p = 0;
    while (p <= rhs.size()) {
        size_t q = rhs.find('|', p);
        if (q == std::string::npos) q = rhs.size();
        std::vector<std::string> toks = split_ws(rhs.substr(p, q - p));
        std::vector<int> syms;
        for (size_t i = 1; i < toks.size(); i++) syms.push_back(parse_sym(g, toks[i]));
        add_alt(g, nt, (uint32_t)std::strtoul(toks[0].c_str(), nullptr, 10), syms);
        p = q + 1;
    }
}
// Inflected lexicon: names = "N_SG N_PL", words = k forms per lemma. Lemma r gets the Zipf-like
// integer weight 120/(r+2), shared by all its forms (the form is fixed by the nonterminal used).
inline void lex(Grammar& g, const char* names, const char* words) {
    std::vector<std::string> ns = split_ws(names), ws = split_ws(words);
    size_t k = ns.size();
    for (size_t r = 0; r * k < ws.size(); r++)
        for (size_t f = 0; f < k; f++)
            add_alt(g, nt_id(g, ns[f]), (uint32_t)(120 / (r + 2)), {term_sym(g, " " + ws[r * k + f])});
}

inline Grammar build() {
    Grammar g;
    g.start = nt_id(g, "SENT");
    // --- sentence level ---
    def(g, "SENT", "12 DECL DEND SEP | 2 QUES ? SEP");
    def(g, "DEND", "10 . | 1 !");
    int sep = nt_id(g, "SEP");
    add_alt(g, sep, 7, {term_sym(g, " ")});
    add_alt(g, sep, 1, {term_sym(g, "\n")});
    def(g, "DECL", "8 CLAUSE TAIL | 1 ADV , CLAUSE TAIL | 1 PP , CLAUSE TAIL | 2 SUB , CLAUSE");
    def(g, "SUB", "1 SUBCONJ CLAUSE0");
    def(g, "TAIL", "8 | 1 , CONJ CLAUSE0 | 1 SUBCONJ CLAUSE0");
    def(g, "CLAUSE", "3 NP_SG VP_SG | 2 NP_PL VP_PL");
    def(g, "CLAUSE0", "3 NP0_SG VP0_SG | 2 NP0_PL VP0_PL");
    def(g, "QUES", "3 does NP_SG VPB | 2 do NP_PL VPB | 2 did NP_ANY VPB | 2 is NP_SG ADJP"
                   " | 1 are NP_PL ADJP | 2 WH does NP0_SG VPB0 | 1 WH do NP0_PL VPB0");
    // --- noun phrases: "X" may carry a relative clause, "X0" may not ---
    def(g, "NP_SG", "2 SUBJ_SG | 8 DET_SG ADJS N_SG REL_SG");
    def(g, "NP_PL", "2 SUBJ_PL | 8 DET_PL ADJS N_PL REL_PL");
    def(g, "NP0_SG", "2 SUBJ_SG | 8 DET_SG ADJS N_SG");
    def(g, "NP0_PL", "2 SUBJ_PL | 8 DET_PL ADJS N_PL");
    def(g, "NP_ANY", "3 NP_SG | 2 NP_PL");
    def(g, "OBJ", "2 OBJPRON | 5 DET_SG ADJS N_SG REL_SG | 3 DET_PL ADJS N_PL REL_PL");
    def(g, "OBJ0", "2 OBJPRON | 5 DET_SG ADJS N_SG | 3 DET_PL ADJS N_PL");
    def(g, "ADJS", "6 | 3 ADJ1 | 1 ADJ1 ADJ");
    def(g, "ADJ1", "5 ADJ | 1 very ADJ");
    def(g, "ADJP", "4 ADJ | 1 very ADJ | 1 not ADJ");
    // Relative clauses: subject relative "that sleeps", object relative "that the dog saw".
    def(g, "REL_SG", "10 | 2 that VR_SG | 1 that NP0_SG VT_3SG | 1 that NP0_PL VT_BASE | 1 that NP0_ANY VT_PAST");
    def(g, "REL_PL", "10 | 2 that VR_PL | 1 that NP0_SG VT_3SG | 1 that NP0_PL VT_BASE | 1 that NP0_ANY VT_PAST");
    def(g, "NP0_ANY", "3 NP0_SG | 2 NP0_PL");
    def(g, "VR_SG", "2 VI_3SG | 3 VT_3SG OBJ0 | 1 VI_PAST | 1 VT_PAST OBJ0");
    def(g, "VR_PL", "2 VI_BASE | 3 VT_BASE OBJ0 | 1 VI_PAST | 1 VT_PAST OBJ0");
    // --- verb phrases: tense/aspect, agreement, then optional modifiers ---
    def(g, "VP_SG", "4 VI_3SG MODS | 6 VT_3SG OBJ MODS | 2 VI_PAST MODS | 3 VT_PAST OBJ MODS"
                    " | 1 will VPB | 2 COP_SG ADJP MODS");
    def(g, "VP_PL", "4 VI_BASE MODS | 6 VT_BASE OBJ MODS | 2 VI_PAST MODS | 3 VT_PAST OBJ MODS"
                    " | 1 will VPB | 2 COP_PL ADJP MODS");
    def(g, "VP0_SG", "4 VI_3SG MODS | 5 VT_3SG OBJ0 MODS | 2 VI_PAST MODS | 3 VT_PAST OBJ0 MODS"
                     " | 2 COP_SG ADJP");
    def(g, "VP0_PL", "4 VI_BASE MODS | 5 VT_BASE OBJ0 MODS | 2 VI_PAST MODS | 3 VT_PAST OBJ0 MODS"
                     " | 2 COP_PL ADJP");
    def(g, "VPB", "2 VI_BASE MODS | 3 VT_BASE OBJ MODS");
    def(g, "VPB0", "2 VI_BASE | 3 VT_BASE OBJ0");
    def(g, "COP_SG", "3 is | 2 was");
    def(g, "COP_PL", "3 are | 2 were");
    def(g, "MODS", "5 | 3 ADV | 3 PP | 1 ADV PP");
    def(g, "PP", "3 PLOC DET_SG ADJS N_PLACE | 1 PWITH OBJ0");
    // --- lexicon (all words lowercase and consonant-initial where "a" may precede them) ---
    lex(g, "DET_SG", "the a this every my one no your");
    lex(g, "DET_PL", "the some these many two my those few all three");
    lex(g, "SUBJ_SG", "he she");
    lex(g, "SUBJ_PL", "they we");
    lex(g, "OBJPRON", "him them her us me");
    lex(g, "N_SG N_PL",
        "cat cats dog dogs man men woman women child children bird birds teacher teachers "
        "farmer farmers king kings girl girls boy boys horse horses mouse mice baby babies "
        "doctor doctors friend friends neighbor neighbors student students wolf wolves fox foxes "
        "rabbit rabbits sailor sailors queen queens baker bakers painter painters monkey monkeys "
        "lion lions goat goats duck ducks poet poets");
    lex(g, "N_PLACE", "garden house river forest park kitchen city market road hill bridge "
                      "field town school village barn lake");
    lex(g, "VT_BASE VT_3SG VT_PAST",
        "see sees saw like likes liked find finds found follow follows followed chase chases chased "
        "watch watches watched help helps helped call calls called feed feeds fed hear hears heard "
        "know knows knew need needs needed want wants wanted love loves loved carry carries carried "
        "bring brings brought catch catches caught push pushes pushed visit visits visited "
        "remember remembers remembered");
    lex(g, "VI_BASE VI_3SG VI_PAST",
        "sleep sleeps slept run runs ran walk walks walked sing sings sang wait waits waited "
        "laugh laughs laughed smile smiles smiled swim swims swam dance dances danced "
        "jump jumps jumped fall falls fell sit sits sat cry cries cried rest rests rested "
        "work works worked");
    lex(g, "ADJ", "big small happy little old sad tall brave quiet lazy clever hungry tired young "
                  "gentle proud busy funny kind wild strong pretty curious noisy sleepy friendly "
                  "calm nervous polite silly cheerful");
    lex(g, "ADV", "quietly slowly again often today quickly happily yesterday suddenly carefully "
                  "loudly gently later sometimes together");
    lex(g, "PLOC", "in near behind under across through beside");
    lex(g, "PWITH", "with without");
    lex(g, "SUBCONJ", "when because if while although before after until");
    lex(g, "CONJ", "and but so");
    lex(g, "WH", "why where how");
    for (Nonterm& n : g.nts) {
        if (n.alts.empty()) std::abort();  // referenced but never defined: a typo in the tables
        n.total = 0;
        for (const Alt& a : n.alts) n.total += a.w;
        for (Alt& a : n.alts) a.logp = std::log((double)a.w) - std::log((double)n.total);
    }
    return g;
}

inline const Grammar& get() { static const Grammar g = build(); return g; }

struct Rng { uint64_t s; };
inline uint64_t rng_next(Rng* r) {  // splitmix64
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
// Exactly uniform in [0, n): reject draws from the incomplete top block.
inline uint64_t rng_below(Rng* r, uint64_t n) {
    for (;;) {
        uint64_t x = rng_next(r), m = x % n;
        if (x - m <= UINT64_MAX - (n - 1)) return m;
    }
}

// One derivation of nt: its terminals' ids appended to out.
inline void expand(const Grammar& g, int nt, Rng* r, std::vector<int>* out, double* logprob) {
    const Nonterm& n = g.nts[nt];
    uint64_t u = rng_below(r, n.total);
    size_t i = 0;
    while (u >= n.alts[i].w) u -= n.alts[i++].w;
    const Alt& a = n.alts[i];
    if (logprob) *logprob += a.logp;
    for (int s : a.syms) {
        if (s >= 0) expand(g, s, r, out, logprob);
        else out->push_back(~s);
    }
}

// The terminals that can start a derivation of nt (first) and whether it can derive nothing (nullable),
// memoized like analyze; the sentence-initial words are FIRST(SENT), which get a capitalised token.
inline void first_terms(const Grammar& g, int nt, std::vector<std::vector<bool>>& first, std::vector<int>& nullable,
                        std::vector<int>& state) {
    if (state[nt] == 2) return;
    if (state[nt] == 1) std::abort();  // a cycle
    state[nt] = 1;
    first[nt].assign(g.terms.size(), false);
    nullable[nt] = 0;
    for (const Alt& a : g.nts[nt].alts) {
        bool all_null = true;
        for (int s : a.syms) {
            if (s < 0) { first[nt][~s] = true; all_null = false; break; }
            first_terms(g, s, first, nullable, state);
            for (size_t t = 0; t < g.terms.size(); t++) if (first[s][t]) first[nt][t] = true;
            if (!nullable[s]) { all_null = false; break; }
        }
        if (all_null) nullable[nt] = 1;
    }
    state[nt] = 2;
}

// The word vocabulary: token i < terms is terminal i as written (" dog" with its leading space, ".", " ",
// "\n"); then, for each terminal that can start a sentence, its capitalised form without the space ("Dog").
struct Vocab {
    std::vector<std::string> pieces;
    std::vector<int> capital;  // terminal id -> the id of its capitalised form (-1: never sentence-initial)
};
inline Vocab build_vocab(const Grammar& g) {
    Vocab v;
    v.pieces = g.terms;
    size_t n = g.nts.size();
    std::vector<std::vector<bool>> first(n);
    std::vector<int> nullable(n, 0), state(n, 0);
    first_terms(g, g.start, first, nullable, state);
    v.capital.assign(g.terms.size(), -1);
    for (size_t t = 0; t < g.terms.size(); t++) {
        if (!first[g.start][t]) continue;
        const std::string& w = g.terms[t];
        if (w.size() < 2 || w[0] != ' ' || w[1] < 'a' || w[1] > 'z') std::abort();  // a sentence starts with a word
        v.capital[t] = (int)v.pieces.size();
        v.pieces.push_back(std::string(1, (char)(w[1] - 'a' + 'A')) + w.substr(2));
    }
    return v;
}
inline const Vocab& vocab() { static const Vocab v = build_vocab(get()); return v; }

// One sentence as word tokens: its terminals, the first in its capitalised form.
inline void sentence(Rng* r, std::vector<int>* out, double* logprob) {
    const Grammar& g = get();
    size_t start = out->size();
    expand(g, g.start, r, out, logprob);
    int cap = vocab().capital[(*out)[start]];
    if (cap < 0) std::abort();
    (*out)[start] = cap;
}

// Entropy (nats) and expected length (bytes, or terminals with tokens) of the string derived from nt,
// memoized. The grammar is acyclic, so the recursion terminates; state 1 = in progress guards that.
inline void analyze(const Grammar& g, int nt, std::vector<double>& H, std::vector<double>& L,
                    std::vector<int>& state, bool tokens) {
    if (state[nt] == 2) return;
    if (state[nt] == 1) std::abort();  // a cycle: the finite recursion would not be exact
    state[nt] = 1;
    double h = 0, l = 0;
    for (const Alt& a : g.nts[nt].alts) {
        double p = std::exp(a.logp), ha = -a.logp, la = 0;
        for (int s : a.syms) {
            if (s >= 0) { analyze(g, s, H, L, state, tokens); ha += H[s]; la += L[s]; }
            else la += tokens ? 1.0 : (double)g.terms[~s].size();
        }
        h += p * ha; l += p * la;
    }
    H[nt] = h; L[nt] = l; state[nt] = 2;
}

}  // namespace grammar_detail

// Whole sentences of text until out holds nbytes or more: each sentence's word tokens written out, so the
// first word is capitalised and has no leading space.
inline void grammar_generate(uint64_t seed, size_t nbytes, std::string* out, double* logprob) {
    const std::vector<std::string>& pieces = grammar_detail::vocab().pieces;
    grammar_detail::Rng r{seed};
    std::vector<int> ids;
    while (out->size() < nbytes) {
        ids.clear();
        grammar_detail::sentence(&r, &ids, logprob);
        for (int id : ids) *out += pieces[id];
    }
}

// The same sentences as word tokens (grammar_vocab's ids) until out holds ntokens or more.
template <typename Id>
inline void grammar_generate_tokens(uint64_t seed, size_t ntokens, std::vector<Id>* out, double* logprob) {
    grammar_detail::Rng r{seed};
    std::vector<int> ids;
    while (out->size() < ntokens) {
        ids.clear();
        grammar_detail::sentence(&r, &ids, logprob);
        out->insert(out->end(), ids.begin(), ids.end());
    }
}

inline const std::vector<std::string>& grammar_vocab() { return grammar_detail::vocab().pieces; }

// Text -> word tokens, taking at each position the longest token that matches and ends where a word
// ends (" them" in " theme" does not); this is the tokenisation the generator made. Text outside the
// vocabulary returns false with why naming the word. " " and "\n" are tokens, so that word is never a space.
inline bool grammar_encode(const std::string& text, std::vector<int>* out, std::string* why) {
    const std::vector<std::string>& pieces = grammar_vocab();
    auto letter = [](char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'); };
    out->clear();
    for (size_t p = 0; p < text.size();) {
        int best = -1;
        for (size_t i = 0; i < pieces.size(); i++) {
            size_t n = pieces[i].size(), end = p + n;
            if (text.compare(p, n, pieces[i]) != 0 || (end < text.size() && letter(pieces[i].back()) && letter(text[end]))) continue;
            if (best < 0 || n > pieces[best].size()) best = (int)i;
        }
        if (best < 0) {
            size_t e = text.find_first_of(" \n.,?!", p + 1);
            *why = "\"" + text.substr(p, e == std::string::npos ? std::string::npos : e - p) + "\" (at byte " + std::to_string(p) +
                   ") is not a word of the embedded corpus, whose " + std::to_string(pieces.size()) +
                   " tokens are its grammar's words (a word inside a sentence has a space before it; the first is capitalised)";
            return false;
        }
        out->push_back(best);
        p += pieces[best].size();
    }
    return true;
}

namespace grammar_detail {
// A sentence's entropy (nats) over its expected length in terminals (tokens) or bytes, before the first
// word loses its space.
inline double sentence_rate(bool tokens, double* len) {
    const Grammar& g = get();
    size_t n = g.nts.size();
    std::vector<double> H(n, 0), L(n, 0);
    std::vector<int> state(n, 0);
    analyze(g, g.start, H, L, state, tokens);
    *len = L[g.start];
    return H[g.start];
}
}  // namespace grammar_detail

inline double grammar_entropy_per_byte() {
    double bytes, h = grammar_detail::sentence_rate(false, &bytes);
    return h / (bytes - 1.0);  // -1: the dropped leading space of each sentence
}

// The same entropy per sentence over the expected tokens per sentence (capitalising the first word
// replaces a token, it adds none).
inline double grammar_entropy_per_token() {
    double tokens, h = grammar_detail::sentence_rate(true, &tokens);
    return h / tokens;
}
