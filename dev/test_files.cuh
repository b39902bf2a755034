// dev/test_files.cuh: the tests of the files a run leaves behind and of what tp says about them:
// checkpoint checksums and the fallback to the newest checkpoint that verifies, folders that hold a run
// (orphan files, -y 1 on a missing folder), one run per folder (the lock), the temporary files of a save
// cut short, a failed save, the messages after a peer's death under mpirun, --version, -i alone with -v 0,
// and a default -t that adapts to the model. Black-box: ./tp is run as a user runs it.
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
        if (getenv("TP_BIN")) {  // a sanitizer build (make asan, make tsan): instrumented code, not the speed a user gets
            printf("  skip the hashing speed (%.1f GB/s here): a sanitizer build\n", gbs);
            g_skipped++;
        } else {
            check_le(1.5 / gbs, 1.0, "hashing speed %.1f GB/s of CPU time (sum %016llx): GPT-2 124M's 1.5 GB checkpoint hashed in, seconds",
                     gbs, (unsigned long long)s);
        }
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
        {"the state file's header damaged (its magic)", "state", 0, 8, 0xff, false},
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
    // a state file of version 1 (the first tp's: no saved flags either) resumes with its batch given again;
    // with the same count of sequences of another length only the header's T can refuse it
    dir = d + "/v1";
    copy_step(d + "/a", dir, 6);
    {
        std::vector<char> b = slurp_bytes(dir + s6);
        StateHeader h;
        memcpy(&h, b.data(), sizeof(h));
        int64_t version = 1;
        memcpy(b.data() + 8, &version, 8);
        b.erase(b.begin() + STATE_V1_HEADER_BYTES, b.begin() + sizeof(StateHeader) + h.flags_bytes);  // flags_bytes on, and the flags
        FILE* f = fopen((dir + s6).c_str(), "wb");
        fwrite(b.data(), 1, b.size(), f);
        fclose(f);
    }
    rc = run_cmd(base + "-t 16 -y 1 -x 8 -o " + dir, &out, &err);
    check(rc == 1 && f_lines(err) == 1 && err.find("same batch shape") != std::string::npos,
          "a version-1 state file (no saved flags) with -t 16 where it had 32: exit %d, refused: %s", rc, f_first_line(err).c_str());
    rc = run_cmd(base + "-y 1 -x 8 -o " + dir, &out, &err);
    check(rc == 0 && ckpt_steps(dir.c_str()) == std::vector<int>({6, 8}), "... and with -t 32 it resumes to step 8 (exit %d)%s", rc, err.c_str());
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
    // a copy a user kept under another name that the glob state_*.bin matches too is no checkpoint
    std::string renamed = d + "/renamed";
    mkdir(renamed.c_str(), 0755);
    f_sh("cp " + d + "/a/model_00000004.bin " + renamed + "/ && cp " + d + "/a/state_00000004.bin " + renamed + "/state_00000004.old.bin");
    check(f_exists(renamed + "/state_00000004.old.bin") && ckpt_steps(renamed.c_str()).empty(),
          "state_00000004.old.bin beside model_00000004.bin: no checkpoint listed (%zu)", ckpt_steps(renamed.c_str()).size());
    rc = run_cmd(base + "-y 1 -x 2 -o " + o, &out, &err);  // (the flags bound the run a tp without this check starts)
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
    // -y 1 there: a run killed before its first checkpoint leaves that; nothing to continue, and the line says so
    rc = run_cmd(base + "-y 1 -x 2 -o " + lo, &out, &err);
    check(rc == 1 && f_lines(err) == 1 && err.find("holds log.csv but no checkpoint to continue from") != std::string::npos &&
          err.find("--fresh 1 instead of -y 1") != std::string::npos && slurp_bytes(lo + "/log.csv") == log && ckpt_steps(lo.c_str()).empty(),
          "-y 1 where only log.csv is: exit %d, refused, untouched: %s", rc, f_first_line(err).c_str());
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
    rc = run_in("timeout 60", base + "-y 1 -x 2000000 -o " + l, &out, &err);  // a tp without the lock would train on
    check(rc == 1 && err.find(pid) != std::string::npos, "-y 1 while it runs: exit %d, refused naming %s", rc, pid.c_str());
    kill(first, SIGINT);
    int status = wait_exit(first, 60);
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
    // the line counts and names what it removed (log.csv.tmp would be gone anyway: the resumed log is rewritten
    // through it); a file the kill -9 left mid-save comes first, and the list shows three names, then "and 1 more"
    std::string said = f_line_with(out, "temporary");
    int removed = said.find("tp: removed ") == 0 ? atoi(said.c_str() + 12) : 0;
    bool named = said.find("state_00000099.bin.tmp") != std::string::npos &&
                 (said.find("log.csv.tmp") != std::string::npos || (removed == 4 && said.find(" and 1 more") != std::string::npos));
    check(gone && named && removed >= 3 && out.find(" temporary files left in ") != std::string::npos, "the stale .tmp files are "
          "removed at the start (the 3 planted, each counted and named, and any the kill -9 left mid-save): %s", said.c_str());
}

// ----------------------------------------------------------------------------
// honest messages

#ifdef TP_MPI
// A job of two processes saving every 3 steps into -o; process 1 gets sig after a checkpoint. The survivor
// must say what happened and which checkpoint is the last good one, and promise no save.
static void expect_peer_death(int sig, const char* expect) {
    std::string d = tmpdir() + "/peerdeath" + std::to_string(sig);
    f_sh("rm -rf " + d);
    mkdir(d.c_str(), 0755);
    std::string out = d + "/out.txt";
    pid_t job = spawn_tp("-e L2C64H4 -b 2 -t 32 -x 1000000 -v 0 -g 0 --threads 1 --timeout 3 -n 3 -o " + d + "/run", out, mpirun(2));
    bool started = wait_for_text(out, "saved checkpoint", 60) && wait_for_text(out, "step    5/", 60);
    int victim = grid_pid(f_text(out), 1);
    if (started && victim > 0) kill(victim, sig);
    bool ended = wait_exit(job, 30) != -1;
    if (victim > 0) kill(victim, SIGKILL);
    std::vector<int> steps = ckpt_steps((d + "/run").c_str());
    std::string err = f_text(out + ".err"), so = f_text(out);
    std::string last = steps.empty() ? "none" : "the last good checkpoint is step " + std::to_string(steps.back()) + " in " + d + "/run";
    std::string line = f_line_with(err, expect);
    check(started && ended && line.find(last) != std::string::npos && so.find("then saving") == std::string::npos &&
          err.find("then saving") == std::string::npos, "process 1 %s: the survivor says so, names the last checkpoint, promises no save: %s",
          sig == SIGKILL ? "killed (SIGKILL)" : "stopped (SIGSTOP)", line.empty() ? f_first_line(err).c_str() : line.c_str());
}
#endif

static void test_honest_messages() {
    printf("messages: a failed save says what remains, a peer's death under mpirun, --version, -i alone, a default -t that adapts\n");
    std::string d = tmpdir() + "/honest";
    mkdir(d.c_str(), 0755);
    std::string base = "-e L2C64H4 -b 2 -t 32 -v 0 -g 0 --threads 1 --tp 1 ";
    std::string out, err;
    // a save that fails (the file size limit stands in for a full disk: 1000 KB holds the model file, not the
    // state file): its partial files go, and the line lists what remains
    int rc = run_cmd(base + "-x 2 -o " + d + "/full", nullptr, nullptr);
    std::string limited = "bash -c \"trap '' XFSZ; ulimit -f 1000; exec " + tp_bin() + " ";
    std::string cmd = limited + "-y 1 -x 4 --threads 1 -o " + d + "/full\" >/dev/null 2>" + d + "/full.err";
    int rc2 = f_sh(cmd);
    err = f_text(d + "/full.err");
    bool clean = !f_exists(d + "/full/model_00000004.bin") && f_sh("ls " + d + "/full/*.tmp >/dev/null 2>&1") != 0;
    check(rc == 0 && rc2 == 1 && f_lines(err) == 1 && err.find("saving the checkpoint of step 4 failed") != std::string::npos &&
          err.find("the checkpoint in " + d + "/full is step 2") != std::string::npos && clean && ckpt_steps((d + "/full").c_str()) == std::vector<int>({2}),
          "a failed save: exit %d, its partial files removed, step 2 named as what remains: %s", rc2, f_first_line(err).c_str());
    cmd = limited + base + "-x 2 -o " + d + "/full2\" >/dev/null 2>" + d + "/full2.err";
    rc = f_sh(cmd);
    err = f_text(d + "/full2.err");
    check(rc == 1 && err.find("no checkpoint of this run is saved in " + d + "/full2") != std::string::npos &&
          err.find("intact") == std::string::npos && !f_exists(d + "/full2/model_00000002.bin"),
          "a failed first save: exit %d, says that nothing is saved: %s", rc, f_first_line(err).c_str());
    // a non-finite loss names the last good checkpoint
    GPTConfig cfg = make_config(2, 4, 64, 256, 64);
    std::vector<float> w = init_weights(&cfg, 3);
    model_write((d + "/short_T.bin").c_str(), &cfg, w.data());  // maxT 64
    w[w.size() - 2 * 64] = 3e38f;  // lnfw[0]: finite, so the file loads, but the forward overflows
    model_write((d + "/nan.bin").c_str(), &cfg, w.data());
    rc = run_cmd("-e " + d + "/nan.bin --corpus bytes -b 2 -t 32 -x 3 -v 0 -g 0 --threads 1 -o " + d + "/nan", nullptr, &err);
    check(rc == 1 && f_lines(err) == 1 && err.find("not finite") != std::string::npos &&
          err.find("no checkpoint of this run is saved in " + d + "/nan yet") != std::string::npos,
          "a non-finite loss says what is saved: %s", f_first_line(err).c_str());
    // --version
    rc = run_cmd("--version", &out, &err);
    check(rc == 0 && out.rfind("tp ", 0) == 0 && out.find("CUDA ") != std::string::npos && out.find("NCCL ") != std::string::npos &&
          out.find("MPI") != std::string::npos && err.empty(), "--version: exit %d: %s | %s", rc, f_first_line(out).c_str(),
          f_line_with(out, "built with").c_str());
    // -i alone with -v 0
    write_tokens(d + "/train.bin", random_tokens(5000, 256, 4));
    rc = run_cmd(base + "-x 2 -i " + d + "/train.bin", &out, &err);
    check(rc == 0 && out.find("step    2/2") != std::string::npos, "-i alone with -v 0 trains without val data (exit %d)%s", rc, err.c_str());
    // a default -t beyond the model's maxT adapts; one given is refused
    rc = run_cmd("-e " + d + "/short_T.bin -x 0 -g 4 --threads 1", &out, &err);
    check(rc == 0 && out.find("using -t 64 instead of the default 128") != std::string::npos, "-e CKPT (max T 64) -x 0: exit %d: %s", rc,
          f_line_with(out, "-t 64").c_str());
    rc = run_cmd("-e " + d + "/short_T.bin -x 0 -g 4 -t 128 --threads 1", &out, &err);
    check(rc == 1 && err.find("exceeds the model's maximum 64") != std::string::npos, "-t 128 given: still refused: %s", f_first_line(err).c_str());
#ifdef TP_MPI
    if (f_sh("command -v mpirun >/dev/null 2>&1") != 0) {
        printf("  skip the messages after a peer's death: no mpirun\n");
        g_skipped++;
        return;
    }
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OMPI_MCA_btl", "self,vader", 1);
    expect_peer_death(SIGKILL, "mpirun is ending the job");
    expect_peer_death(SIGSTOP, "for the other processes");
#else
    printf("  skip the messages after a peer's death under mpirun: this build has no MPI\n");
    g_skipped++;
#endif
}

// The embedded corpus as words (the default): the startup lines, the run folder's tokenizer.bin and a
// sample from the folder alone, prompts inside and outside the vocabulary, --corpus bytes, resuming, and
// the refusals (a byte-level checkpoint on the words, --corpus changed on resume)
static void test_words() {
    printf("words: the embedded corpus as word tokens, its run folder, prompts, --corpus bytes\n");
    std::string d = tmpdir() + "/words";
    std::string base = "-e L2C64H4 -b 4 -t 32 -v 10 -m 4 --threads 1 ";
    std::string out, err;
    int nv = (int)grammar_vocab().size();
    int rc = run_cmd(base + "-x 20 -g 24 --tp 2 -o " + d + "/run", &out, &err);
    std::string want = "vocab " + std::to_string(nv) + " (padded " + std::to_string(round_up(nv, 128)) + "; the embedded corpus's words)";
    check(rc == 0 && out.find(want) != std::string::npos && out.find("nats per token") != std::string::npos &&
          f_exists(d + "/run/tokenizer.bin"),
          "a run on the words: '%s', the floor per token, DIR/tokenizer.bin written (exit %d)", first_line_with(out, "vocab").c_str(), rc);
    // the folder's tokenizer.bin is llm.c's format and holds exactly the words
    Tokenizer tk;
    tokenizer_read(&tk, (d + "/run/tokenizer.bin").c_str());
    check(tk.words && tk.pieces == grammar_vocab() && tk.eot == -1, "DIR/tokenizer.bin reads back as the %zu words, no end-of-text token",
          tk.pieces.size());
    // llm.c's own tokenizer files: version 1 (gpt2_tokenizer.bin before llm.c added the field) has no
    // end-of-text id, which is then GPT-2's 50256; version 2 carries it
    {
        std::string v1 = d + "/gpt2_v1.bin";
        std::string bytes(1024, '\0');
        uint32_t h[3] = {20240328, 1, 50257};
        memcpy(&bytes[0], h, sizeof(h));
        for (int i = 0; i < 50257; i++) {
            std::string p = i < 256 ? std::string(1, (char)(i ? i : ' ')) : "t" + std::to_string(i);
            bytes += (char)p.size() + p;
        }
        bool written = write_bytes(v1, bytes);
        Tokenizer c, b;
        tokenizer_read(&c, v1.c_str());
        Tokenizer a = c;
        a.eot = 77;  // written as version 2, its id read back
        tokenizer_write_bin(&a, (d + "/v2.bin").c_str());
        tokenizer_read(&b, (d + "/v2.bin").c_str());
        check(written && c.eot == 50256 && c.pieces.size() == 50257 && c.pieces[300] == "t300" && b.eot == 77 && b.pieces == c.pieces,
              "llm.c's tokenizer file version 1: %zu pieces, end of text %d (GPT-2's 50256); version 2 carries its own (%d)",
              c.pieces.size(), c.eot, b.eot);
        // a damaged header is refused before anything is allocated from it: a count the file cannot hold, an
        // end-of-text id that is not one of its tokens
        GPTConfig gc = make_config(1, 1, 16, 50257, 64);
        model_write((d + "/g.bin").c_str(), &gc, init_weights(&gc, 5).data());
        for (int field = 2; field <= 3; field++)
            for (uint32_t bad : {0x7fffffffu, 0xffffffffu, 50258u, 50257u, 0u}) {
                if (field == 3 && (bad == 0u || bad == 0xffffffffu)) continue;  // valid: id 0, and -1 (none)
                if (field == 2 && bad == 50257u) continue;                        // the true count (as an id: one past the last)
                std::string broken = bytes;
                uint32_t hv[4] = {20240328, 2, 50257, 50256};
                hv[field] = bad;
                memcpy(&broken[0], hv, sizeof(hv));
                written = write_bytes(d + "/broken.bin", broken);
                rc = run_cmd("-e " + d + "/g.bin --tokenizer " + d + "/broken.bin -x 0 -g 4 --threads 1", &out, &err);
                check(written && rc == 1 && f_lines(err) == 1 && (err.find("damaged") != std::string::npos || err.find("truncated") != std::string::npos),
                      "a tokenizer file with %s %d: exit %d, %s", field == 2 ? "token count" : "end-of-text id", (int)bad, rc, f_first_line(err).c_str());
            }
        // llm.c's tokenizer files only decode: a --prompt with one is refused, pointing at a tokenizer.json
        rc = run_cmd("-e " + d + "/g.bin --tokenizer " + v1 + " -x 0 -g 4 --threads 1 --prompt hi", &out, &err);
        check(rc == 1 && f_lines(err) == 1 && err.find("(llm.c's format) only decodes") != std::string::npos &&
              err.find("tokenizer.json") != std::string::npos, "--prompt with llm.c's tokenizer file: exit %d, %s", rc, f_first_line(err).c_str());
        // and GPT-2's 50257 pieces for a byte-level model: refused, the line says it prints bytes without one
        rc = run_cmd("-e L1C16H2 --vocab 256 --tokenizer " + v1 + " -x 0 -g 4 --threads 1", &out, &err);
        check(rc == 1 && f_lines(err) == 1 && err.find("has 50257 tokens but the model is byte-level (vocab 256)") != std::string::npos &&
              err.find("drop --tokenizer") != std::string::npos, "GPT-2's tokenizer file for a byte-level model: exit %d, %s", rc,
              f_first_line(err).c_str());
        // a file that is not one tp reads, or is cut or damaged among its pieces: refused in one line that says which
        {
            struct { const char* what; uint32_t magic, version; long cut; int empty_piece; const char* says; } files[] = {
                {"magic 20240329", 20240329, 2, -1, -1, "magic 20240328"},
                {"version 0", 20240328, 0, -1, -1, "has version 0; tp reads versions 1 and 2"},
                {"version 3", 20240328, 3, -1, -1, "has version 3; tp reads versions 1 and 2"},
                {"a piece of length 0 (token 700)", 20240328, 2, -1, 700, "truncated or corrupt at token 700"},
                {"the pieces cut short", 20240328, 2, 200000, -1, "is truncated at token"},  // (the count fits the bytes left)
            };
            for (auto& t : files) {
                std::string broken = bytes;
                uint32_t hv[4] = {t.magic, t.version, 50257, 50256};
                memcpy(&broken[0], hv, sizeof(hv));
                if (t.empty_piece >= 0) {  // its length byte set to 0
                    size_t at = 1024;
                    for (int i = 0; i < t.empty_piece; i++) at += 1 + (unsigned char)broken[at];
                    broken[at] = 0;
                }
                if (t.cut >= 0) broken.resize(t.cut);
                written = write_bytes(d + "/broken.bin", broken);
                rc = run_cmd("-e " + d + "/g.bin --tokenizer " + d + "/broken.bin -x 0 -g 4 --threads 1", &out, &err);
                check(written && rc == 1 && f_lines(err) == 1 && err.find(t.says) != std::string::npos, "a tokenizer file with %s: exit %d, %s",
                      t.what, rc, f_first_line(err).c_str());
            }
        }
        // without an end-of-text id (-1) a sample starts from the tokenizer's newline, as if the file named it
        // (not from id -1, which the vocab-parallel embedding would silently turn into a zero vector)
        std::string sample[2];
        for (int k = 0; k < 2; k++) {
            a.eot = k ? 10 : -1;  // piece 10 is "\n"
            tokenizer_write_bin(&a, (d + "/v2.bin").c_str());
            rc = run_cmd("-e " + d + "/g.bin --tokenizer " + d + "/v2.bin -x 0 -g 6 --threads 1", &out, &err);
            size_t at = out.find("---\n"), end = at == std::string::npos ? at : out.find("\n---", at + 4);
            sample[k] = rc == 0 && end != std::string::npos ? out.substr(at + 4, end - at - 4) : "exit " + std::to_string(rc) + ": " + err;
        }
        check(sample[0] == sample[1] && sample[0].rfind("exit", 0) != 0, "no end-of-text id: the sample starts from the newline (%s)",
              sample[0].substr(0, 60).c_str());
    }
    // the checkpoint alone samples words: the prompt is encoded and printed back, the tokens decoded
    std::string model = d + "/run/model_00000020.bin";
    rc = run_cmd("-e " + model + " -x 0 -g 12 --threads 1 --prompt 'The dog'", &out, &err);
    size_t s = out.find("---\nThe dog");
    check(rc == 0 && s != std::string::npos, "-e DIR/model_N.bin -x 0 --prompt 'The dog': the sample starts with the prompt (exit %d): %s",
          rc, rc ? err.c_str() : out.substr(s == std::string::npos ? 0 : s, 80).c_str());
    rc = run_cmd("-e " + model + " -x 0 -g 4 --threads 1 --prompt 'The zebra'", &out, &err);
    check(rc == 1 && f_lines(err) == 1 && err.find("\"zebra\"") != std::string::npos && err.find("not a word of the embedded corpus") != std::string::npos,
          "a prompt outside the words: exit %d, one line naming the word: %s", rc, f_first_line(err).c_str());
    // -y 1 continues on the words; --corpus cannot change under a run
    rc = run_cmd("-y 1 -o " + d + "/run -x 30 -g 0 --threads 1", &out, &err);
    check(rc == 0 && out.find("resuming from") != std::string::npos && f_exists(d + "/run/model_00000030.bin"),
          "-y 1 continues the run on the words to step 30 (exit %d)", rc);
    rc = run_cmd("-y 1 -o " + d + "/run -x 40 -g 0 --threads 1 --corpus bytes", &out, &err);
    check(rc == 1 && err.find("--corpus bytes differs from the run") != std::string::npos, "-y 1 --corpus bytes on a run of words: %s",
          f_first_line(err).c_str());
    // --corpus bytes: the byte-level corpus and its floor per byte
    rc = run_cmd(base + "-x 2 -g 0 --corpus bytes", &out, &err);
    check(rc == 0 && out.find("vocab 256 (padded 256; the embedded corpus as bytes)") != std::string::npos &&
          out.find("nats per byte") != std::string::npos,
          "--corpus bytes: '%s' (exit %d)", first_line_with(out, "vocab").c_str(), rc);
    // a byte-level model cannot read the words: one line with both ways out
    GPTConfig cfg = make_config(2, 4, 64, 256, 64);
    std::vector<float> w = init_weights(&cfg, 3);
    model_write((d + "/bytes.bin").c_str(), &cfg, w.data());
    rc = run_cmd("-e " + d + "/bytes.bin -b 2 -t 32 -x 2 -v 0 -g 0 --threads 1", &out, &err);
    check(rc == 1 && f_lines(err) == 1 && err.find("needs a vocab of at least " + std::to_string(nv)) != std::string::npos &&
          err.find("--corpus bytes") != std::string::npos, "a vocab-256 checkpoint on the words: %s", f_first_line(err).c_str());
    rc = run_cmd("-e " + d + "/bytes.bin -b 2 -t 32 -x 2 -v 0 -g 0 --threads 1 --corpus bytes", &out, &err);
    check(rc == 0, "the same checkpoint with --corpus bytes trains (exit %d)", rc);
    // the saved flags of a tp from before --corpus (no --corpus among them) resume on bytes, its corpus then
    Args old;
    const char* argv[] = {"tp", "-o", "x"};
    parse_args(3, (char**)argv, &old);
    Args words_run = old;
    words_run.corpus = CORPUS_WORDS;
    std::string saved = args_saved(&words_run), before;
    for (size_t p = 0; p < saved.size();) {  // the same flags less --corpus
        size_t e1 = saved.find('\0', p), e2 = saved.find('\0', e1 + 1);
        if (saved.compare(p, e1 - p, "--corpus") != 0) before += saved.substr(p, e2 + 1 - p);
        p = e2 + 1;
    }
    Args resumed = old, again = old;
    args_resume(&resumed, before, "x");
    args_resume(&again, saved, "x");
    check(before.size() < saved.size() && resumed.corpus == CORPUS_BYTES && again.corpus == CORPUS_WORDS,
          "saved flags without --corpus (an older tp's) resume on bytes; with --corpus words, on words");
    rc = run_cmd("--corpus letters -x 1", &out, &err);
    check(rc == 1 && err.find("takes words or bytes") != std::string::npos, "--corpus letters: %s", f_first_line(err).c_str());
}
