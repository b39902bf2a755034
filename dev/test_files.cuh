// dev/test_files.cuh: the tests of the files a run leaves behind and of what tp says about them:
// checkpoint checksums and the fallback to the newest checkpoint that verifies. Black-box: ./tp is run as
// a user runs it.
// Included by test_tp.cu (it uses its check, run_cmd, tmpdir, spawn_tp, ...).
#pragma once
#include <sys/file.h>

// ----------------------------------------------------------------------------
// helpers of this file

static std::string f_text(const std::string& path) {
    std::vector<char> b = slurp_bytes(path);
    return std::string(b.begin(), b.end());
}

static std::string f_first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// the line of text holding `key` (empty if none)
static std::string f_line_with(const std::string& text, const char* key) {
    size_t at = text.find(key);
    if (at == std::string::npos) return "";
    size_t from = text.rfind('\n', at);
    from = from == std::string::npos ? 0 : from + 1;
    return text.substr(from, text.find('\n', at) - from);
}

static int f_lines(const std::string& s) { return (int)std::count(s.begin(), s.end(), '\n'); }

static bool f_exists(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0;
}

static int f_sh(const std::string& cmd) {
    int rc = system(cmd.c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// bytes at offset of a file XORed with x (x 0: set to zero), n of them
static void f_damage(const std::string& path, long offset, long n, int x) {
    std::vector<char> b = slurp_bytes(path);
    for (long i = offset; i < offset + n && i < (long)b.size(); i++) b[i] = x ? (char)(b[i] ^ x) : 0;
    FILE* f = fopen(path.c_str(), "r+b");
    if (!f) return;
    fwrite(b.data(), 1, b.size(), f);
    fclose(f);
}

static long f_size(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 ? (long)st.st_size : -1;
}

// ----------------------------------------------------------------------------
// checksums

static void test_checksums() {
    printf("checksums: a damaged checkpoint is found before training, the newest one that verifies is taken, none: refused\n");
    // the hash itself: a change anywhere changes it, including two sign flips in one lane, which plain
    // FNV-1a over words would let cancel; and how fast it runs
    {
        std::vector<uint64_t> w(1 << 20);
        for (size_t i = 0; i < w.size(); i++) w[i] = i * 0x9e3779b97f4a7c15ULL;
        auto sum = [](const std::vector<uint64_t>& v, size_t bytes) {
            Hasher h;
            hash_init(&h);
            hash_update(&h, v.data(), bytes);
            return hash_final(&h);
        };
        size_t n = w.size() * 8;
        uint64_t ref = sum(w, n);
        int same = 0;
        std::vector<uint64_t> v = w;
        memset(&v[4096], 0, 4096);  // a zeroed 4 KB page
        same += sum(v, n) == ref;
        v = w;
        v[1000] ^= 1ULL << 63;  // two top-bit flips four words apart: the same lane
        v[1004] ^= 1ULL << 63;
        same += sum(v, n) == ref;
        v = w;
        ((char*)v.data())[12345] ^= 0x10;  // one flipped bit
        same += sum(v, n) == ref;
        same += sum(w, n - 8) == ref;  // truncated
        Hasher h;  // in pieces of odd sizes, as a file is read: the same sum
        hash_init(&h);
        for (size_t at = 0; at < n;) {
            size_t k = std::min(n - at, (size_t)(at % 7919) + 1);
            hash_update(&h, (char*)w.data() + at, k);
            at += k;
        }
        check(same == 0 && hash_final(&h) == ref, "the hash changes with a zeroed page, two top-bit flips in one lane, one flipped bit, "
              "a truncation (%d of 4 unchanged), and is the same fed in odd pieces", same);
        std::vector<uint64_t> big(32 << 20);  // 256 MB
        for (size_t i = 0; i < big.size(); i++) big[i] = i;
        // the CPU time of this thread, not the wall clock: the test machine may be busy with other work
        auto cpu = []() {
            struct timespec ts;
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
            return ts.tv_sec + 1e-9 * ts.tv_nsec;
        };
        double t0 = cpu();
        uint64_t s = sum(big, big.size() * 8);
        double gbs = big.size() * 8 / (cpu() - t0) / 1e9;
        check_le(1.5 / gbs, 1.0, "hashing speed %.1f GB/s of CPU time (sum %016llx): GPT-2 124M's 1.5 GB checkpoint hashed in, seconds",
                 gbs, (unsigned long long)s);
    }
    std::string d = tmpdir() + "/checksums";
    mkdir(d.c_str(), 0755);
    std::string base = "-e L2C64H4 -b 2 -t 32 -v 0 -g 0 --threads 1 --tp 1 ";
    std::string out, err;
    int rc = run_cmd(base + "-x 6 -n 2 -o " + d + "/a", &out, &err);
    check(rc == 0 && ckpt_steps((d + "/a").c_str()) == std::vector<int>({2, 4, 6}), "a run saves steps 2, 4 and 6 (exit %d)%s", rc, err.c_str());
    std::string m6 = "/model_00000006.bin", s6 = "/state_00000006.bin";
    long msize = f_size(d + "/a" + m6);
    // each kind of damage, on a copy of the run: the damaged step 6 is named, step 4 is taken
    struct { const char* what; const char* file; long offset, n; int x; bool truncate; } kinds[] = {
        {"a zeroed 4 KB page in the model", "model", 8192, 4096, 0, false},
        {"flipped bytes in the model (one weight becomes huge)", "model", 1024 + 4 * 100 + 3, 1, 0x7f, false},
        {"the model truncated by 4 KB", "model", 0, 0, 0, true},
        {"AdamW's m and v damaged in the state", "state", 100000, 8, 0xff, false},
    };
    int k = 0;
    for (auto& c : kinds) {
        std::string dir = d + "/kind" + std::to_string(k++);
        f_sh("rm -rf " + dir + " && cp -r " + d + "/a " + dir);
        std::string file = dir + (c.file[0] == 'm' ? m6 : s6);
        if (c.truncate) {
            if (truncate(file.c_str(), msize - 4096) != 0) perror("truncate");
        } else {
            f_damage(file, c.offset, c.n, c.x);
            if (c.file[0] == 's') f_damage(file, 1000000, 8, 0xff);  // and v
        }
        rc = run_cmd("-y 1 -x 8 --threads 1 -o " + dir, &out, &err);
        std::string warn = f_line_with(err, "warning: ");
        bool named = warn.find(std::string("step 6: ") + (c.file[0] == 'm' ? "model" : "state") + "_00000006.bin") != std::string::npos;
        bool fell_back = out.find("resuming from " + dir + "/model_00000004.bin at step 4") != std::string::npos;
        check(rc == 0 && named && fell_back && err.find("not finite") == std::string::npos && f_lines(err) == 1 &&
              ckpt_steps(dir.c_str()).back() == 8, "%s: exit %d, resumed from step 4: %s", c.what, rc, warn.c_str());
    }
    // none verifies: refused in one line that names the damage and what to do
    std::string dir = d + "/none";
    copy_step(d + "/a", dir, 6);
    f_damage(dir + m6, 20000, 4, 0xff);
    std::vector<char> before = slurp_bytes(dir + m6);
    rc = run_cmd("-y 1 -x 8 --threads 1 -o " + dir, &out, &err);
    check(rc == 1 && f_lines(err) == 1 && err.find("no checkpoint in " + dir + " verifies") != std::string::npos &&
          err.find("model_00000006.bin does not match its checksum") != std::string::npos && err.find("--fresh 1") != std::string::npos &&
          slurp_bytes(dir + m6) == before, "the only checkpoint damaged: exit %d, refused, files untouched: %s", rc, f_first_line(err).c_str());
    // its model verifies but its state does not: the line offers the weights
    dir = d + "/stateonly";
    copy_step(d + "/a", dir, 6);
    f_damage(dir + s6, 3000, 4, 0xff);
    rc = run_cmd("-y 1 -x 8 --threads 1 -o " + dir, &out, &err);
    check(rc == 1 && f_lines(err) == 1 && err.find("state_00000006.bin does not match") != std::string::npos &&
          err.find("-e " + dir + m6) != std::string::npos, "only the state damaged: exit %d, the verified weights offered: %s", rc,
          f_first_line(err).c_str());
    // -e of a tp checkpoint with its state file beside it is verified too
    rc = run_cmd("-e " + d + "/none" + m6 + " -x 0 -g 4 --threads 1", &out, &err);
    check(rc == 1 && f_lines(err) == 1 && err.find("against the checksum in") != std::string::npos,
          "-e DIR/model_N.bin damaged, its state file beside it: exit %d: %s", rc, f_first_line(err).c_str());
    rc = run_cmd("-e " + d + "/a" + m6 + " -x 0 -g 4 --threads 1", &out, &err);
    check(rc == 0, "-e DIR/model_N.bin intact: samples (exit %d)%s", rc, err.c_str());
    // a state file of version 3 (tp before checksums) still resumes
    dir = d + "/v3";
    copy_step(d + "/a", dir, 6);
    {
        std::vector<char> b = slurp_bytes(dir + s6);
        int64_t version = 3;
        memcpy(b.data() + 8, &version, 8);
        b.erase(b.begin() + STATE_V3_HEADER_BYTES, b.begin() + sizeof(StateHeader));  // no model_sum, state_sum
        FILE* f = fopen((dir + s6).c_str(), "wb");
        fwrite(b.data(), 1, b.size(), f);
        fclose(f);
    }
    rc = run_cmd("-y 1 -x 8 --threads 1 -o " + dir, &out, &err);
    check(rc == 0 && out.find("has no checksums (an older tp wrote it)") != std::string::npos && ckpt_steps(dir.c_str()).back() == 8,
          "a version-3 state file (no checksums) resumes (exit %d): %s", rc, f_line_with(out, "checksums").c_str());
}

