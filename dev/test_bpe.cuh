// dev/test_bpe.cuh: the tests of own text through a BPE and of Hugging Face export and import, included
// by test_tp.cu. Groups (see g_groups):
//   bpe       prepare.py --vocab N against Hugging Face tokenizers: the C++ encoder's ids, decoding, the
//             train/val split, bad inputs; tokenizers that disagree with the data or the model
//   bperun    a tiny BPE run trains and samples words; its folder samples and exports on its own
//   export    export.py from checkpoints saved at TP 1 and 2 (identical files), a numpy GPT-2 on the
//             exported files against tp's logits, import then export bit for bit, bf16 files, non-GPT-2
// They need Python with tokenizers and numpy (CI installs them) and report themselves skipped without.

// runs a shell command; stdout and stderr together in *out (may be null); returns the exit status
static int bpe_sh(const std::string& cmd, std::string* out) {
    std::string path = tmpdir() + "/bpe_sh.txt";
    int rc = system(("(" + cmd + ") >" + path + " 2>&1 </dev/null").c_str());
    std::vector<char> b = slurp_bytes(path);
    if (out) out->assign(b.begin(), b.end());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// the first line of text, for messages
static std::string bpe_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// whether the Python side can run: tokenizers and numpy importable; else says so and counts a skip
static bool bpe_python(const char* group) {
    if (bpe_sh("python3 -c 'import tokenizers, numpy'", nullptr) == 0) return true;
    printf("  skip %s: Hugging Face tokenizers or numpy is not installed (pip install tokenizers numpy); CI installs them\n", group);
    g_skipped++;
    return false;
}

// the test text: the corpus's English sentences, and every 8th line one in other scripts (2-, 3- and
// 4-byte UTF-8 characters), so that merges join the bytes of characters and split some
static std::string bpe_text(size_t n) {
    const char* other[] = {"Ελληνικά κείμενα και кириллица в гавани.", "日本語のテキストと한국어 문장이 항구에 있다.",
                           "emoji 🙂🙃 — “quotes” … naïve café, déjà vu.", "ไทย עברית العربية हिन्दी, ½ Ⅻ ٣٤٥ 12345."};
    std::string corpus, text;
    grammar_generate(31, n, &corpus, nullptr);
    size_t at = 0;
    for (int line = 0; at < corpus.size(); line++) {
        size_t e = corpus.find(". ", at + 60);
        e = e == std::string::npos ? corpus.size() : e + 1;
        text += corpus.substr(at, e - at) + "\n";
        if (line % 8 == 7) text += std::string(other[(line / 8) % 4]) + "\n";
        at = e + 1;
    }
    return text;
}

// dir/story.txt and prepare.py --vocab 512 on it into dir/data (once); returns prepare.py's exit status
static int bpe_prepare(const std::string& dir, std::string* out) {
    static std::string done, done_out;  // prepared once per folder; a later group gets the first run's output
    if (done == dir) {
        *out = done_out;
        return 0;
    }
    mkdir(dir.c_str(), 0755);
    std::string text = bpe_text(120000);
    FILE* f = fopen((dir + "/story.txt").c_str(), "wb");
    fwrite(text.data(), 1, text.size(), f);
    fclose(f);
    int rc = bpe_sh("python3 data/prepare.py " + dir + "/story.txt " + dir + "/data --vocab 512", out);
    if (rc == 0) {
        done = dir;
        done_out = *out;
    }
    return rc;
}

// whether s ends inside a UTF-8 character (its last character is incomplete)
static bool utf8_cut(const std::string& s) {
    for (int k = 1; k <= 4 && k <= (int)s.size(); k++) {
        unsigned char c = s[s.size() - k];
        if ((c & 0xc0) == 0x80) continue;
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
        return len > k;
    }
    return true;
}

// the first line of tp's output that holds "vocab"
static std::string first_line_with_vocab(const std::string& text) {
    size_t p = text.find("vocab");
    if (p == std::string::npos) return "(none)";
    size_t b = text.rfind('\n', p);
    b = b == std::string::npos ? 0 : b + 1;
    return text.substr(b, text.find('\n', p) - b);
}

static void test_bpe() {
    printf("bpe: prepare.py --vocab N, the C++ encoder against Hugging Face tokenizers, the split, bad inputs\n");
    // the JSON reader's strings: every escape JSON has, \u in lower and upper case hex, surrogate pairs (a
    // tokenizer.json written by Python's json escapes every non-ASCII character so)
    {
        struct { const char* json; const char* bytes; } cases[] = {
            {"\"a\\u00C9b\"", "a\xc3\x89" "b"}, {"\"\\u00e9\\u00E9\"", "\xc3\xa9\xc3\xa9"},
            {"\"\\u0041\\u00DF\\u20AC\\u20ac\"", "A\xc3\x9f\xe2\x82\xac\xe2\x82\xac"},
            {"\"\\uD83D\\uDE00 \\ud83d\\ude00\"", "\xf0\x9f\x98\x80 \xf0\x9f\x98\x80"},
            {"\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t\"", "\" \\ / \b \f \n \r \t"},
            {"\"\\u0120the \\u010a\"", "\xc4\xa0the \xc4\x8a"},  // GPT-2's byte-level space and newline
        };
        // in a child process: a reader that refuses a valid escape ends its process (json_fail), not the suite's
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            int wrong = 0;
            for (auto& c : cases) {
                JsonParser p = {c.json, strlen(c.json), 0, "test"};
                std::string got = json_string(&p);
                if (got != c.bytes || p.i != p.n) printf("  (wrong: %s)\n", c.json), wrong++;
            }
            fflush(stdout);
            _exit(wrong ? 2 : 0);
        }
        int status = pid > 0 ? wait_exit(pid, 60) : -1;
        check(pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0, "the JSON reader's strings: 6 with every escape, \\u in both cases "
              "of hex, surrogate pairs (exit %d: 0 all read right, 1 one refused, 2 one read wrong)", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    }
    if (!bpe_python("bpe")) return;
    std::string d = tmpdir() + "/bpe", out;
    int rc = bpe_prepare(d, &out);
    std::string tok = d + "/data/story_bpe512_tokenizer.json";
    check(rc == 0 && out.find("-i " + d + "/data/story_bpe512_train.bin -j " + d + "/data/story_bpe512_val.bin") != std::string::npos,
          "prepare.py --vocab 512: exit %d, the tp command printed: %s", rc, bpe_line(out.find("train on") == std::string::npos ? out : out.substr(out.find("train on"))).c_str());
    // the same ids as the library, for the text's lines, the whole text, and random strings
    rc = bpe_sh("python3 dev/test_bpe.py ids " + tok + " " + d + "/story.txt " + d + "/cases.json 400", &out);
    std::vector<char> js = slurp_bytes(d + "/cases.json");
    Tokenizer tk;
    if (rc == 0) tokenizer_read(&tk, tok.c_str());
    Json cases;
    if (rc == 0) {
        JsonParser p = {js.data(), js.size(), 0, "cases.json"};
        json_value(&p, &cases);
    }
    long ntok = 0, cut = 0, multi = 0;
    int bad_ids = 0, bad_text = 0;
    std::string first_bad;
    for (const Json& c : cases.items) {
        const std::string& text = c.items[0].str;
        std::vector<int> want;
        for (const Json& x : c.items[1].items) want.push_back((int)x.num);
        std::vector<int> got = bpe_encode(&tk.merges, text);
        std::string back;
        for (int id : got) {
            back += tk.pieces[id];
            cut += utf8_cut(tk.pieces[id]);  // a token that ends inside a character
            multi += tk.pieces[id].size() > 1 && (unsigned char)tk.pieces[id][0] >= 0xc0 && !utf8_cut(tk.pieces[id]);
        }
        ntok += got.size();
        if (got != want && bad_ids++ == 0) first_bad = text.substr(0, 60);
        bad_text += back != text;
    }
    check(rc == 0 && cases.items.size() > 600 && bad_ids == 0, "the C++ encoder gives the ids of Hugging Face tokenizers for %zu texts "
          "(%ld tokens; lines, the whole text, random strings, runs of a letter or pair): %d differ%s%s", cases.items.size(), ntok, bad_ids,
          first_bad.empty() ? "" : ", first: ", first_bad.c_str());
    check(rc == 0 && bad_text == 0 && cut > 0 && multi > 0, "decoding gives the texts back (%d differ), with %ld tokens that end "
          "inside a UTF-8 character and %ld that join whole multi-byte characters", bad_text, cut, multi);
    // the pre-tokenizer alone (bpe_words) against the library's, word by word: every contraction, cased and
    // not, in every position (a vocab of 512 seldom merges across a contraction, so the ids above can agree
    // where the words do not), and random strings
    {
        rc = bpe_sh("python3 dev/test_bpe.py words " + d + "/words.json 400", &out);
        std::vector<char> wj = slurp_bytes(d + "/words.json");
        Json words;
        if (rc == 0) {
            JsonParser p = {wj.data(), wj.size(), 0, "words.json"};
            json_value(&p, &words);
        }
        long nwords = 0;
        int bad = 0;
        std::string first;
        for (const Json& c : words.items) {
            std::vector<std::pair<size_t, size_t>> want, got = bpe_words(c.items[0].str);
            for (const Json& w : c.items[1].items) want.emplace_back((size_t)w.items[0].num, (size_t)w.items[1].num);
            nwords += (long)want.size();
            if (got != want && bad++ == 0) first = c.items[0].str.substr(0, 40);
        }
        check(rc == 0 && words.items.size() > 500 && bad == 0, "GPT-2's pre-tokenizer splits %zu texts (%ld words; the contractions "
              "'s 't 're 've 'm 'll 'd in every position, upper case and near misses, random strings) into the library's words: %d "
              "differ%s%s", words.items.size(), nwords, bad, first.empty() ? "" : ", first: ", escape_text(first).c_str());
    }
    // the pre-tokenizer's \p{L} and \p{N} (data/unicode.h's ranges, searched by uni_letter and uni_number) at
    // every code point, against Python's unicodedata where it has the Unicode the tables were made from
    rc = bpe_sh("python3 dev/test_bpe.py unicode " + d + "/unicode.bin", &out);
    std::vector<char> cls = slurp_bytes(d + "/unicode.bin");
    if (rc == 0 && out.find("ok Unicode 14.0.0") == std::string::npos) {
        printf("  skip: Python's unicodedata is not Unicode 14.0.0, data/unicode.h's (%s)\n", bpe_line(out).c_str());
        g_skipped++;
    } else {
        long wrong = 0, letters = 0, numbers = 0;
        uint32_t first_wrong = 0;
        for (uint32_t cp = 0; cp < 0x110000 && cls.size() == 0x110000; cp++) {
            const int want = cls[cp], got = uni_letter(cp) ? 1 : uni_number(cp) ? 2 : 0;
            letters += want == 1;
            numbers += want == 2;
            if (got != want && wrong++ == 0) first_wrong = cp;
        }
        check(rc == 0 && cls.size() == 0x110000 && wrong == 0, "\\p{L} and \\p{N} at all 1114112 code points (%ld letters, %ld numbers) "
              "as Python's unicodedata has them: %ld differ (first U+%04X)", letters, numbers, wrong, first_wrong);
    }
    // the same from the older layout of tokenizer.json that GPT-2's own file has
    rc = bpe_sh("python3 dev/test_bpe.py legacy " + tok + " " + d + "/legacy.json", &out);
    Tokenizer old;
    if (rc == 0) tokenizer_read(&old, (d + "/legacy.json").c_str());
    int bad_old = rc == 0 ? 0 : -1;
    for (const Json& c : cases.items) {
        std::vector<int> want;
        for (const Json& x : c.items[1].items) want.push_back((int)x.num);
        if (rc == 0) bad_old += bpe_encode(&old.merges, c.items[0].str) != want;
    }
    check(bad_old == 0 && !cases.items.empty(), "the same ids from a tokenizer.json with merges as \"left right\" strings (GPT-2's layout): %d differ", bad_old);
    rc = bpe_sh("python3 dev/test_bpe.py split " + tok + " " + d + "/story.txt " + d + "/data/story_bpe512_train.bin " + d +
                "/data/story_bpe512_val.bin", &out);
    check(rc == 0 && out.rfind("ok", 0) == 0, "the train/val split changes no token: %s", bpe_line(out).c_str());
    rc = bpe_sh("python3 dev/test_bpe.py chunks " + tok + " " + d + "/story.txt", &out);
    check(rc == 0 && out.rfind("ok", 0) == 0, "a big text encoded in pieces (cut where GPT-2's pre-tokenizer cuts) has the whole "
          "text's words and tokens: %s", bpe_line(out).c_str());
    // bad inputs: one line, the fix, exit 1
    FILE* f = fopen((d + "/empty.txt").c_str(), "wb");
    fclose(f);
    f = fopen((d + "/small.txt").c_str(), "wb");
    fprintf(f, "a small text.\nit is small.\n");
    fclose(f);
    struct { const char* args; const char* says; } bad[] = {
        {"/empty.txt x --vocab 512", "is empty"},
        {"/small.txt x --vocab 4096", "too small for --vocab 4096"},
        {"/story.txt x --vocab 70000", "65536"},
        {"/story.txt x --vocab 512 --bpe", "give one of them"},
    };
    for (auto& b : bad) {
        rc = bpe_sh("python3 data/prepare.py " + d + b.args, &out);
        check(rc == 1 && out.find(b.says) != std::string::npos && std::count(out.begin(), out.end(), '\n') == 1,
              "prepare.py %s: exit %d, one line: %s", b.args, rc, bpe_line(out).c_str());
    }
    rc = bpe_sh("python3 data/prepare.py " + d + "/small.txt x --vocab 4096", &out);
    size_t at = out.find("give --vocab ");
    int suggest = at == std::string::npos ? 0 : atoi(out.c_str() + at + 13);
    rc = suggest > 257 ? bpe_sh("python3 data/prepare.py " + d + "/small.txt " + d + "/small --vocab " + std::to_string(suggest), &out) : -1;
    check(rc == 0, "the --vocab %d it suggests works (exit %d)", suggest, rc);
    // tp and the tokenizer: the vocab from it; data it did not make; a model of another vocab
    std::string tiny = " -e L1C16H2 -b 2 -t 16 -x 1 -v 0 -g 8 --threads 1";
    std::string err;
    rc = run_cmd("-i " + d + "/data/story_bpe512_train.bin -j " + d + "/data/story_bpe512_val.bin" + tiny + " --prompt 'The café'", &out, &err);
    check(rc == 0 && out.find("vocab 512 (padded 512; from tokenizer " + tok + ", found next to -i)") != std::string::npos &&
          out.find("---\nThe café") != std::string::npos, "tp takes the vocab from the tokenizer next to -i and samples text after a "
          "BPE prompt (exit %d): %s", rc, first_line_with_vocab(out).c_str());
    // a name with "_train" in it twice (prepare.py's NAME_train.bin for NAME = my_train_notes): the tokenizer is
    // NAME_tokenizer.json, cut at the last "_train"
    {
        std::string n = d + "/named/my_train_notes";
        mkdir((d + "/named").c_str(), 0755);
        bpe_sh("cp " + d + "/data/story_bpe512_train.bin " + n + "_train.bin && cp " + d + "/data/story_bpe512_val.bin " + n +
               "_val.bin && cp " + tok + " " + n + "_tokenizer.json", nullptr);
        rc = run_cmd("-i " + n + "_train.bin -j " + n + "_val.bin" + tiny, &out, &err);
        check(rc == 0 && out.find("from tokenizer " + n + "_tokenizer.json, found next to -i)") != std::string::npos,
              "-i my_train_notes_train.bin: the tokenizer my_train_notes_tokenizer.json found beside it (exit %d): %s", rc,
              first_line_with_vocab(out).c_str());
    }
    std::vector<int> ids = random_tokens(3000, 700, 3);
    write_tokens(d + "/big_ids.bin", ids);
    rc = run_cmd("-i " + d + "/big_ids.bin -j " + d + "/big_ids.bin --tokenizer " + tok + tiny, &out, &err);
    check(rc == 1 && err.find("was not made with tokenizer") != std::string::npos && std::count(err.begin(), err.end(), '\n') == 1,
          "token ids beyond the tokenizer's vocab: %s", bpe_line(err).c_str());
    GPTConfig c256 = make_config(1, 2, 16, 256, 64);
    model_write((d + "/v256.bin").c_str(), &c256, init_weights(&c256, 5).data());
    rc = run_cmd("-e " + d + "/v256.bin -x 0 -g 4 -t 16 --tokenizer " + tok, &out, &err);
    check(rc == 1 && err.find("has vocab 512 but the model has vocab 256") != std::string::npos &&
          std::count(err.begin(), err.end(), '\n') == 1, "a tokenizer of another vocab than the model's: %s", bpe_line(err).c_str());
    // a damaged tokenizer.json nested 100,000 deep: one line, not a stack overflow in the recursive reader
    {
        std::vector<char> tj = slurp_bytes(tok);
        std::string deep = "{\"deep\": " + std::string(100000, '[') + std::string(100000, ']') + ", " + std::string(tj.begin() + 1, tj.end());
        bool written = write_bytes(d + "/deep.json", deep);
        rc = run_cmd("-e " + d + "/v256.bin -x 0 -g 4 -t 16 --tokenizer " + d + "/deep.json", &out, &err);
        check(written && rc == 1 && err.find("nested more than 256 deep") != std::string::npos && std::count(err.begin(), err.end(), '\n') == 1,
              "a tokenizer.json nested 100,000 deep (exit %d): %s", rc, bpe_line(err).c_str());
    }
    // llm.c's file keeps decoding (prepare.py writes one beside the json)
    rc = run_cmd("-i " + d + "/data/story_bpe512_train.bin -j " + d + "/data/story_bpe512_val.bin" + tiny + " --tokenizer " + d +
                 "/data/story_bpe512_tokenizer.bin", &out, &err);
    check(rc == 0 && out.find("vocab 512") != std::string::npos && out.find("sample") != std::string::npos,
          "llm.c's tokenizer.bin of the same BPE decodes the samples (exit %d)%s", rc, bpe_line(err).c_str());
}

// the text of the run's first sample
static std::string bpe_sample(const std::string& out) {
    std::vector<std::string> s = sample_texts(out);
    return s.empty() ? "" : s[0];
}

static void test_bpe_run() {
    printf("bperun: a tiny BPE run trains and samples words; its folder samples on its own\n");
    if (!bpe_python("bperun") || skip_under_tsan("bperun")) return;
    std::string d = tmpdir() + "/bpe", out, err;
    int rc = bpe_prepare(d, &out);
    std::string data = " -i " + d + "/data/story_bpe512_train.bin -j " + d + "/data/story_bpe512_val.bin";
    rc = rc ? rc : run_cmd("-e L2C64H4 -b 8 -t 64 -x 200 -l 4e-3 -u 20 -v 200 -m 8 -g 48 --prompt The --tp 2 --threads 1 --fresh 1 -o " +
                           d + "/run" + data, &out, &err);
    std::string sample = bpe_sample(out);
    // the sample's words against the words of the text
    std::vector<char> story = slurp_bytes(d + "/story.txt");
    std::set<std::string> known;
    std::string w;
    for (char ch : story) {
        if (isalpha((unsigned char)ch)) w += ch;
        else { if (!w.empty()) known.insert(w); w.clear(); }
    }
    int words = 0, real = 0;
    w.clear();
    for (char ch : sample + " ") {
        if (isalpha((unsigned char)ch)) w += ch;
        else if (!w.empty()) { words++; real += known.count(w) > 0; w.clear(); }
    }
    std::vector<float> val = grep_floats(out, "val loss ");
    check(rc == 0 && sample.rfind("The", 0) == 0 && words >= 10 && real >= 0.8 * words,
          "200 steps at vocab 512 (val loss %.2f): %d of the sample's %d words are words of the text: %.70s...", val.empty() ? 0.0 : val.back(),
          real, words, bpe_line(sample).c_str());
    struct stat st;
    check(stat((d + "/run/tokenizer.json").c_str(), &st) == 0, "the run folder keeps its tokenizer.json");
    rc = run_cmd("-e " + d + "/run/model_00000200.bin -x 0 -g 16 --prompt 'The harbour' --threads 1", &out, &err);
    check(rc == 0 && bpe_sample(out).rfind("The harbour", 0) == 0 && bpe_sample(out).size() > 20,
          "-e RUN/model.bin -x 0 finds the tokenizer beside it and samples text (exit %d): %s", rc, bpe_line(bpe_sample(out)).c_str());
}

// tp's logits for B sequences of T tokens of a checkpoint, at P ranks, into a file dev/gpt2_numpy.py reads
static void bpe_write_logits(const std::string& model, const std::vector<int>& tokens, int B, int T, int P, const std::string& path) {
    GPTConfig cfg;
    std::vector<float> full;
    model_read(model.c_str(), &cfg, &full);
    std::vector<float> logits((size_t)B * T * cfg.V);
    on_ranks(P, false, [&](CommGroup* group, int r) {
        Rank rk;
        rank_init(&rk, group, r, DEV_CPU, 0, 1);
        GPT m;
        gpt_build(&m, &rk, &cfg, full.data(), 0);
        gpt_forward(&m, &rk, tokens.data(), nullptr, B, T, false);
        std::vector<float> row(cfg.Vp);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                gpt_logits_row(&m, &rk, b, t, row.data());
                if (r == 0) std::copy(row.begin(), row.begin() + cfg.V, logits.begin() + ((size_t)b * T + t) * cfg.V);
            }
        gpt_free(&m, &rk);
        rank_free(&rk);
    });
    FILE* f = fopen(path.c_str(), "wb");
    int h[3] = {B, T, cfg.V};
    fwrite(h, sizeof(int), 3, f);
    fwrite(tokens.data(), sizeof(int), (size_t)B * T, f);
    fwrite(logits.data(), sizeof(float), logits.size(), f);
    fclose(f);
}

// whether two files have the same bytes (and exist)
static bool same_file(const std::string& a, const std::string& b) {
    std::vector<char> x = slurp_bytes(a), y = slurp_bytes(b);
    return !x.empty() && x == y;
}

static void test_export() {
    printf("export: Hugging Face GPT-2 directories from checkpoints at TP 1 and 2, numpy logits against tp's, import back\n");
    if (!bpe_python("export")) return;
    std::string d = tmpdir() + "/bpe", out, err;
    int rc = bpe_prepare(d, &out);
    std::string data = " -i " + d + "/data/story_bpe512_train.bin -j " + d + "/data/story_bpe512_val.bin --threads 1 -v 0 -g 0 --fresh 1";
    // a trained model, then the same weights saved by a run at TP 1 and one at TP 2 (one step at lr 0)
    rc = rc ? rc : run_cmd("-e L2C64H4 -b 4 -t 32 -x 6 -l 3e-3 -u 0 --tp 2 -o " + d + "/e0" + data, &out, &err);
    std::string trained = d + "/e0/model_00000006.bin";
    for (int P : {1, 2})
        if (rc == 0) rc = run_cmd("-e " + trained + " -b 4 -t 32 -x 1 -l 0 --tp " + std::to_string(P) + " -o " + d + "/e" + std::to_string(P) + data, &out, &err);
    std::string m1 = d + "/e1/model_00000001.bin", m2 = d + "/e2/model_00000001.bin";
    std::vector<char> a = slurp_bytes(m1), t0 = slurp_bytes(trained);
    check(rc == 0 && same_file(m1, m2) && a.size() == t0.size() && !memcmp(a.data() + 1024, t0.data() + 1024, a.size() - 1024),
          "the checkpoints saved at TP 1 and TP 2 are the same file, with the trained weights (exit %d)%s", rc, bpe_line(err).c_str());
    rc = bpe_sh("python3 data/export.py " + d + "/e1 " + d + "/x1 && python3 data/export.py " + d + "/e2 " + d + "/x2", &out);
    bool same = rc == 0;
    int nfiles = 0;
    for (const char* name : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"}) {
        same = same && same_file(d + "/x1/" + name, d + "/x2/" + name);
        nfiles += same;
    }
    check(same, "export.py of the TP 1 and TP 2 run folders: %d of 6 files identical (exit %d) %s", nfiles, rc, bpe_line(out).c_str());
    rc = bpe_sh("python3 dev/test_bpe.py same " + d + "/x1 " + m1, &out);
    check(rc == 0 && out.rfind("ok", 0) == 0, "model.safetensors holds the checkpoint's weights, Conv1D-transposed: %s", bpe_line(out).c_str());
    // tp's logits (at TP 2) against a numpy GPT-2 on the exported files, and GPT2LMHeadModel when installed
    std::vector<char> vb = slurp_bytes(d + "/data/story_bpe512_val.bin");
    std::vector<int> toks;
    for (int i = 0; i < 3 * 40; i++) toks.push_back(((const uint16_t*)(vb.data() + 1024))[i * 3]);
    bpe_write_logits(m1, toks, 3, 40, 2, d + "/logits.bin");
    rc = bpe_sh("python3 dev/gpt2_numpy.py " + d + "/x1 " + d + "/logits.bin", &out);
    size_t at = out.find("numpy max abs diff ");
    check_le(rc == 0 && at != std::string::npos ? atof(out.c_str() + at + 19) : INFINITY, 1e-4,
             "a numpy GPT-2 on the exported directory against tp's logits (3 sequences of 40 tokens, TP 2), max abs difference");
    at = out.find("transformers max abs diff ");
    if (at == std::string::npos) printf("  skip transformers: torch and transformers are not installed (the same check through GPT2LMHeadModel)\n");
    else check_le(atof(out.c_str() + at + 26), 1e-4, "GPT2LMHeadModel.from_pretrained on the exported directory against tp's logits, max abs difference");
    // import, then export again: the same checkpoint and the same safetensors, bit for bit
    rc = bpe_sh("python3 data/import.py " + d + "/x1 " + d + "/imp/model.bin && python3 data/export.py " + d + "/imp/model.bin " + d + "/x3", &out);
    check(rc == 0 && same_file(d + "/imp/model.bin", m1) && same_file(d + "/x3/model.safetensors", d + "/x1/model.safetensors") &&
          same_file(d + "/x3/config.json", d + "/x1/config.json"), "import.py then export.py: the checkpoint and model.safetensors again, bit for bit (exit %d)", rc);
    rc = bpe_sh("python3 dev/test_bpe.py hub " + d + "/x1 " + d + "/hub && python3 data/import.py " + d + "/hub " + d + "/hub.bin", &out);
    check(rc == 0 && same_file(d + "/hub.bin", m1), "import.py of the Hub's layout (no \"transformer.\" prefix, attention mask buffers, "
          "lm_head.weight): the same checkpoint (exit %d)", rc);
    // the other layouts a Hugging Face folder comes in: safetensors shards with their index, PyTorch's
    // pytorch_model.bin (zip, and the format before torch 1.6, with views sharing a storage and a strided
    // one) and its shards: the same checkpoint from each; a pickle that would call a function is refused
    for (const char* layout : {"shards", "torchzip", "torchlegacy", "torchshards"}) {
        std::string dir = d + "/" + layout;
        rc = bpe_sh("python3 dev/test_bpe.py " + std::string(layout) + " " + d + "/x1 " + dir + " && python3 data/import.py " + dir + " " +
                    dir + ".bin", &out);
        check(rc == 0 && same_file(dir + ".bin", m1), "import.py of the %s layout: the same checkpoint (exit %d)%s", layout, rc,
              rc ? bpe_line(out).c_str() : "");
        if (std::string(layout).rfind("torch", 0) != 0 || std::string(layout) == "torchshards") continue;
        rc = bpe_sh("python3 dev/test_bpe.py torchload " + dir + " " + d + "/x1", &out);
        if (out.rfind("skip", 0) == 0) {
            printf("  skip torch.load of the %s file: torch is not installed (the same check through torch itself)\n", layout);
            g_skipped++;
        } else
            check(rc == 0 && out.rfind("ok", 0) == 0, "the %s file as torch.load reads it: %s", layout, bpe_line(out).c_str());
    }
    // -e given the Hugging Face weights themselves: one line naming what they are and the import command
    for (std::string e : {d + "/x1", d + "/x1/model.safetensors", d + "/torchzip/pytorch_model.bin", d + "/torchlegacy/pytorch_model.bin"}) {
        std::string dir = e.find(".bin") != std::string::npos || e.find(".safetensors") != std::string::npos ? e.substr(0, e.rfind('/')) : e;
        rc = run_cmd("-e " + e + " -x 0 --threads 1", &out, &err);
        check(rc == 1 && std::count(err.begin(), err.end(), '\n') == 1 && err.find("python3 data/import.py " + dir + " OUT.bin") != std::string::npos,
              "-e %s: %s", e.substr(d.size() + 1).c_str(), bpe_line(err).c_str());
    }
    rc = bpe_sh("python3 dev/test_bpe.py untied " + d + "/x1 " + d + "/untied && python3 data/import.py " + d + "/untied " + d + "/untied.bin", &out);
    std::string line = out.substr(out.find('\n') + 1);
    check(rc == 1 && std::count(line.begin(), line.end(), '\n') == 1 && line.find("ties the LM head") != std::string::npos &&
          !f_exists(d + "/untied.bin"), "import.py of a model whose lm_head is not its wte: refused: %s", bpe_line(line).c_str());
    rc = bpe_sh("python3 dev/test_bpe.py evil " + d + "/x1 " + d + "/evil && python3 data/import.py " + d + "/evil " + d + "/evil.bin", &out);
    line = out.substr(out.find('\n') + 1);
    check(rc == 1 && std::count(line.begin(), line.end(), '\n') == 1 && line.find("system") != std::string::npos &&
          !f_exists(d + "/evil/ran") && !f_exists(d + "/evil.bin"),
          "import.py of a pickle that calls os.system: refused, nothing run, nothing written: %s", bpe_line(line).c_str());
    rc = run_cmd("-e " + d + "/imp/model.bin -x 0 -g 12 --prompt The --threads 1", &out, &err);
    check(rc == 0 && bpe_sample(out).rfind("The", 0) == 0, "-e on the imported file samples, with the tokenizer import put beside it (exit %d)%s",
          rc, bpe_line(err).c_str());
    // a vocab that is not a multiple of 128 (GPT-2's 50257 is not): the padding rows are dropped on export and
    // come back as zeros on import
    GPTConfig c300 = make_config(1, 2, 16, 300, 64);
    model_write((d + "/v300.bin").c_str(), &c300, init_weights(&c300, 9).data());
    rc = bpe_sh("python3 data/export.py " + d + "/v300.bin " + d + "/x300 && python3 data/import.py " + d + "/x300 " + d + "/v300b/model.bin", &out);
    std::vector<char> cj = slurp_bytes(d + "/x300/config.json");
    std::string conf(cj.begin(), cj.end());
    check(rc == 0 && conf.find("\"vocab_size\": 300") != std::string::npos && same_file(d + "/v300.bin", d + "/v300b/model.bin"),
          "vocab 300 (padded 384): exported with 300 rows, imported back bit for bit (exit %d)", rc);
    // a bf16 file (llm.c's version 5) exports its weights; a directory of another model is refused in one line
    rc = bpe_sh("python3 dev/test_bpe.py bf16 " + m1 + " " + d + "/v5.bin && python3 data/export.py " + d + "/v5.bin " + d +
                "/x5 && python3 dev/test_bpe.py same " + d + "/x5 " + m1 + " bf16", &out);
    check(rc == 0 && out.find("ok 28 tensors equal") != std::string::npos, "a version-5 bf16 checkpoint exports its weights: %s",
          bpe_line(out.substr(out.rfind('\n', out.size() - 2) + 1)).c_str());
    mkdir((d + "/bert").c_str(), 0755);
    FILE* f = fopen((d + "/bert/config.json").c_str(), "w");
    fprintf(f, "{\"model_type\": \"bert\", \"architectures\": [\"BertForMaskedLM\"]}\n");
    fclose(f);
    rc = bpe_sh("python3 data/import.py " + d + "/bert " + d + "/bert.bin", &out);
    check(rc == 1 && out.find("not GPT-2") != std::string::npos && std::count(out.begin(), out.end(), '\n') == 1,
          "import.py of a BERT directory: %s", bpe_line(out).c_str());
    // damaged folders: a config.json that is not an object, nested 100,000 deep, or with a size that is
    // not an integer; a truncated model.safetensors: one line each, never a traceback. And GPT-2s that
    // tp's layers would compute wrongly (another GELU, layernorm epsilon, MLP width or attention scaling):
    // refused by name, not imported into a model that samples nonsense. (add: a key put last in x1's own
    // config.json, where it overrides the one there; cut: the weights cut to 1/cut, or -1: their last
    // float a NaN, which import.py names rather than writing a checkpoint that tp refuses.)
    struct { const char* what; std::string config, add; long cut; const char* says; } broken[] = {
        {"a config.json that is a list", "[1, 2]", "", 0, "not an object"},
        {"a config.json nested 100,000 deep", std::string(100000, '[') + std::string(100000, ']'), "", 0, "recursion"},
        {"n_embd given as a string", "", "\"n_embd\": \"64\"", 0, "n_embd is '64', not a positive integer"},
        {"the exact GELU (activation_function gelu)", "", "\"activation_function\": \"gelu\"", 0, "activation_function is gelu"},
        {"a ReLU MLP", "", "\"activation_function\": \"relu\"", 0, "activation_function is relu"},
        {"layer_norm_epsilon 1e-6", "", "\"layer_norm_epsilon\": 1e-6", 0, "layer_norm_epsilon is 1e-06"},
        {"an MLP of 3 x n_embd", "", "\"n_inner\": 192", 0, "n_inner is 192"},
        {"attention scaled by the inverse layer index", "", "\"scale_attn_by_inverse_layer_idx\": true", 0, "attention scaling"},
        {"attention not scaled", "", "\"scale_attn_weights\": false", 0, "attention scaling"},
        {"a model.safetensors cut in half", "", "", 2, "truncated or damaged"},
        {"a NaN among the weights", "", "", -1, "holds a non-finite weight (nan) at"},
    };
    for (auto& b : broken) {
        std::string dir = d + "/broken";
        // (and the .bin: one that a case wrote wrongly would fail every case after it)
        bpe_sh("rm -rf " + dir + " " + dir + ".bin && cp -r " + d + "/x1 " + dir, nullptr);
        if (b.cut == 0) {
            std::string conf = b.config;
            if (conf.empty()) {
                std::vector<char> c0 = slurp_bytes(d + "/x1/config.json");
                conf.assign(c0.begin(), c0.end());
                size_t last = conf.rfind('}');
                if (last != std::string::npos) conf.insert(last, ", " + b.add);
            }
            write_bytes(dir + "/config.json", conf);
        } else if (b.cut > 0) {
            struct stat st;
            if (stat((dir + "/model.safetensors").c_str(), &st) == 0 && truncate((dir + "/model.safetensors").c_str(), st.st_size / b.cut) != 0)
                perror("truncate");
        } else {
            FILE* f = fopen((dir + "/model.safetensors").c_str(), "r+b");
            uint32_t nan_bits = 0x7fc00000u;
            if (f && fseek(f, -4, SEEK_END) == 0) fwrite(&nan_bits, 4, 1, f);
            if (f) fclose(f);
        }
        rc = bpe_sh("python3 data/import.py " + dir + " " + dir + ".bin", &out);
        check(rc == 1 && std::count(out.begin(), out.end(), '\n') == 1 && out.find(b.says) != std::string::npos && !f_exists(dir + ".bin"),
              "import.py of %s: %s", b.what, bpe_line(out).c_str());
    }
    rc = bpe_sh("python3 data/export.py " + d + "/story.txt " + d + "/x9", &out);
    check(rc == 1 && std::count(out.begin(), out.end(), '\n') == 1, "export.py of a text file: %s", bpe_line(out).c_str());
}
