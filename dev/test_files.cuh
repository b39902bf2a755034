// dev/test_files.cuh: the tests of the files a run leaves behind and of what tp says about them:
// checkpoint checksums and the fallback to the newest checkpoint that verifies, folders that hold a run
// (orphan files, -y 1 on a missing folder), one run per folder (the lock), the temporary files of a save
// cut short. Black-box: ./tp is run as a user runs it.
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

// ----------------------------------------------------------------------------
// folders: what holds a run, one run at a time, leftovers

static void test_run_folders() {
    printf("run folders: orphan files are nobody's to overwrite, -y 1 needs a folder, one run per folder, stale .tmp removed\n");
    std::string d = tmpdir() + "/folders";
    mkdir(d.c_str(), 0755);
    std::string base = "-e L2C64H4 -b 2 -t 32 -v 0 -g 0 --threads 1 --tp 1 ";
    std::string out, err;
    // -y 1 on a folder that does not exist
    int rc = run_cmd(base + "-x 2 -y 1 -o " + d + "/nope", &out, &err);
    check(rc == 1 && f_lines(err) == 1 && err.find("no such folder") != std::string::npos && !f_exists(d + "/nope"),
          "-y 1 -o on a missing folder: exit %d, refused, nothing created: %s", rc, f_first_line(err).c_str());
    // a folder with a model file and log.csv but no state file
    rc = run_cmd(base + "-x 4 -o " + d + "/a", nullptr, nullptr);
    std::string o = d + "/orphan";
    mkdir(o.c_str(), 0755);
    f_sh("cp " + d + "/a/model_00000004.bin " + d + "/a/log.csv " + o + "/");
    std::vector<char> model = slurp_bytes(o + "/model_00000004.bin"), log = slurp_bytes(o + "/log.csv");
    auto untouched = [&]() {
        return slurp_bytes(o + "/model_00000004.bin") == model && slurp_bytes(o + "/log.csv") == log && !model.empty() &&
               ckpt_steps(o.c_str()).empty();
    };
    rc = run_cmd("-y 1 -x 2 --threads 1 -o " + o, &out, &err);
    check(rc == 1 && f_lines(err) == 1 && err.find("model_00000004.bin but no state file") != std::string::npos &&
          err.find("-e " + o + "/model_00000004.bin") != std::string::npos && err.find("--fresh 1") != std::string::npos && untouched(),
          "-y 1 on model_N.bin without its state file: exit %d, named, untouched: %s", rc, f_first_line(err).c_str());
    rc = run_cmd(base + "-x 2 -o " + o, &out, &err);
    check(rc == 1 && f_lines(err) == 1 && err.find("holds the files of another run") != std::string::npos && untouched(),
          "a new run in it without --fresh 1: exit %d, refused, untouched: %s", rc, f_first_line(err).c_str());
    std::string lo = d + "/logonly";
    mkdir(lo.c_str(), 0755);
    f_sh("cp " + d + "/a/log.csv " + lo + "/");
    rc = run_cmd(base + "-x 2 -o " + lo, &out, &err);
    check(rc == 1 && err.find("(log.csv)") != std::string::npos && slurp_bytes(lo + "/log.csv") == log,
          "a new run where only log.csv is: exit %d, refused: %s", rc, f_first_line(err).c_str());
    rc = run_cmd(base + "-x 2 --fresh 1 -o " + o, &out, &err);
    check(rc == 0 && !f_exists(o + "/model_00000004.bin") && ckpt_steps(o.c_str()) == std::vector<int>({2}),
          "--fresh 1 clears them and starts over (exit %d): %s", rc, f_line_with(out, "--fresh 1").c_str());
    // two runs in one folder at once: the second is refused naming the first's pid; the first goes on
    std::string l = d + "/locked";
    pid_t first = spawn_tp(base + "-x 1000000 -n 3 -o " + l, d + "/first.txt");
    bool started = wait_for_text(d + "/first.txt", "saved checkpoint", 60);
    std::string tmp = l + "/model_00000777.bin.tmp";  // as if the first run were in the middle of a save
    f_sh("echo partial > " + tmp);
    rc = run_cmd(base + "-x 2 --fresh 1 -o " + l, &out, &err);
    std::string pid = "pid " + std::to_string(first);
    bool refused = rc == 1 && f_lines(err) == 1 && err.find("is in use by another run (" + pid) != std::string::npos;
    check(started && refused && f_exists(tmp) && !ckpt_steps(l.c_str()).empty(),
          "a second run (--fresh 1) while the first runs: exit %d, refused, the first's files kept: %s", rc, f_first_line(err).c_str());
    rc = run_cmd(base + "-y 1 -x 2000000 -o " + l, &out, &err);
    check(rc == 1 && err.find(pid) != std::string::npos, "-y 1 while it runs: exit %d, refused naming %s", rc, pid.c_str());
    kill(first, SIGINT);
    int status = 0;
    waitpid(first, &status, 0);
    std::string fo = f_text(d + "/first.txt");
    check(WIFEXITED(status) && WEXITSTATUS(status) == 0 && fo.find("interrupted after step") != std::string::npos,
          "the first run then stops on Ctrl-C and saves (exit %d): %s", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
          f_line_with(fo, "interrupted").c_str());
    // a run killed with kill -9 leaves its lock file, which does not block; the partial files go
    std::string k = d + "/killed";
    pid_t victim = spawn_tp(base + "-x 1000000 -n 2 -o " + k, d + "/killed.txt");
    started = wait_for_text(d + "/killed.txt", "saved checkpoint", 60);
    kill(victim, SIGKILL);
    waitpid(victim, &status, 0);
    std::string held = f_text(k + "/.lock");
    for (const char* name : {"/model_00000099.bin.tmp", "/state_00000099.bin.tmp", "/log.csv.tmp"}) f_sh("echo partial > " + k + name);
    rc = run_cmd("-y 1 --threads 1 -x " + std::to_string(ckpt_steps(k.c_str()).back() + 1) + " -o " + k, &out, &err);
    std::string now = f_text(k + "/.lock");
    check(started && atoi(held.c_str()) == victim && rc == 0 && out.find("resuming from") != std::string::npos && now != held,
          "kill -9 leaves .lock with pid %d: the next run takes it over (exit %d, .lock now pid %d)%s", atoi(held.c_str()), rc,
          atoi(now.c_str()), err.c_str());
    bool gone = !f_exists(k + "/model_00000099.bin.tmp") && !f_exists(k + "/state_00000099.bin.tmp") && !f_exists(k + "/log.csv.tmp");
    check(gone && out.find("removed 3 temporary files") != std::string::npos, "the stale .tmp files are removed at the start: %s",
          f_line_with(out, "temporary").c_str());
}

