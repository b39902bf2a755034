// train/checkpoint.h (needs the model, gpt.cu): model files, state files and resume.
//
// A checkpoint of step N in DIR is two files:
//   DIR/model_NNNNNNNN.bin  the weights in llm.c's GPT-2 format (a header of 256 int32: magic
//                           20240326, version 3 (fp32) or, from a bf16 run, 5 (bf16), maxT, V, L, NH, C,
//                           Vp; then the 16 tensors, full and unsharded, in llm.c's order), so llm.c and
//                           any TP degree can read it;
//   DIR/state_NNNNNNNN.bin  what an exact resume needs besides the weights: the step, AdamW's t, m and
//                           v as full tensors (ZeRO-1's slices gathered), the train loader's position (in
//                           global batches) and random state, the run's flags (data, steps, schedule, ...),
//                           so that `-y 1` alone continues it, the grid that wrote it, and from a bf16 run
//                           the fp32 master weights.
// One rank writes (rank 0 of the world: process 0, replica 0, TP rank 0). The files hold no trace of the
// grid in their tensors, so a run resumes at another TP degree, replica count, process count or ZeRO
// stage, as long as the global batch (sequences per step) and T are the same: then every step reads the
// same tokens. Nothing changed, nothing changes: the resumed run is bit-identical.
// Both are written to a temporary name, fsynced and renamed, the state last: a step counts as saved
// only when its state file exists, and a crash never leaves half a checkpoint in place of a good one.
#pragma once
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <glob.h>
#include <sstream>
#include <string>
#include <sys/mman.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>
#include <vector>
#include "../common/bf16.h"
#include "../common/error.h"
#include "../common/safe_file.h"
#include "../gpt.cu"
#include "../data/loader.h"

// ----------------------------------------------------------------------------
// model files (llm.c's GPT-2 format: fp32, or bf16)

// Hugging Face weights given to -e: the line that refuses them ends with the command that converts them
static std::string hf_convert_hint(const std::string& dir, const char* what) {
    return std::string("; convert ") + what + " once with python3 data/import.py " + dir + " OUT.bin, then give -e OUT.bin";
}

// What the file path is when its first 1024 bytes h are no llm.c model's but Hugging Face / PyTorch weights
// ("" if neither): a user gives -e the weights they have
static std::string model_foreign(const std::string& path, const int* h) {
    size_t slash = path.rfind('/');
    std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
    const unsigned char* b = (const unsigned char*)h;
    uint64_t n;
    memcpy(&n, b, 8);
    if (n >= 2 && n < (1ull << 30) && b[8] == '{') return " is a safetensors file, not an llm.c model file" + hf_convert_hint(dir, "its folder");
    if (memcmp(b, "PK\x03\x04", 4) == 0 || (b[0] == 0x80 && b[1] >= 2 && b[1] <= 5))
        return " looks like a PyTorch file (pytorch_model.bin), not an llm.c model file" + hf_convert_hint(dir, "its folder");
    return "";
}

// why -e cannot take the folder path: a Hugging Face model folder (a config.json in it), or any folder
static std::string model_dir_why(const std::string& path) {
    struct stat st;
    if (stat((path + "/config.json").c_str(), &st) == 0)
        return " is a Hugging Face model folder, not an llm.c model file" + hf_convert_hint(path, "it");
    return " is a directory; give an llm.c model file (.bin) or a descriptor like d12";
}

// Reads an llm.c checkpoint's header into c and its tensors into full (full null: the header only, to
// size the run before allocating anything). Version 3 holds fp32 tensors; version 5 the same tensors in
// bf16 (what llm.c's GPU trainer and its Python exporter write), each widened here to the fp32 with the
// same bits on top and zeros below, which is exact. version (if set): the file's version.
static void model_read(const char* path, GPTConfig* c, std::vector<float>* full, int* version = nullptr) {
    FILE* f = fopen(path, "rb");
    if (!f) fatal("cannot open checkpoint %s: %s (give an llm.c model file or a descriptor like d12 to -e)", path, strerror(errno));
    int h[256];
    if (fread(h, sizeof(int), 256, f) != 256) fatal("checkpoint %s is shorter than its 1024-byte header: not an llm.c model file", path);
    if (h[0] != 20240326) {
        std::string foreign = model_foreign(path, h);
        if (foreign.empty()) fatal("checkpoint %s has magic %d, not 20240326: not an llm.c model file", path, h[0]);
        fatal("checkpoint %s%s", path, foreign.c_str());
    }
    if (h[1] != 3 && h[1] != 5)
        fatal("checkpoint %s has version %d; tp reads llm.c's fp32 version 3 and bf16 version 5 (data/import.py converts a Hugging Face GPT-2)", path, h[1]);
    if (version) *version = h[1];
    c->maxT = h[2]; c->V = h[3]; c->L = h[4]; c->NH = h[5]; c->C = h[6]; c->Vp = h[7];
    if (c->maxT <= 0 || c->V <= 0 || c->L <= 0 || c->NH <= 0 || c->C <= 0 || c->Vp < c->V || c->C % c->NH != 0)
        fatal("checkpoint %s has an invalid header (maxT %d V %d L %d NH %d C %d Vp %d)", path, c->maxT, c->V, c->L, c->NH, c->C, c->Vp);
    long n = gpt_num_params(c);
    if (!full) {
        fclose(f);
        return;
    }
    full->resize(n);
    size_t got = 0;
    if (h[1] == 3) {
        got = fread(full->data(), sizeof(float), n, f);
    } else {  // bf16, read in pieces of 1M numbers so that a 124M model needs no second full-size buffer
        std::vector<bf16> piece(std::min<long>(n, 1L << 20));
        while ((long)got < n) {
            size_t want = std::min<size_t>(piece.size(), n - got), part = fread(piece.data(), sizeof(bf16), want, f);
            for (size_t i = 0; i < part; i++) (*full)[got + i] = bf16_to_float(piece[i]);
            got += part;
            if (part < want) break;
        }
    }
    if ((long)got != n) fatal("checkpoint %s is truncated: %zu of %ld parameters present", path, got, n);
    char extra;
    if (fread(&extra, 1, 1, f) == 1) fatal("checkpoint %s is longer than its header says (%ld parameters)", path, n);
    fclose(f);
    // A NaN or infinity among the weights would first show as a non-finite loss at step 1, blamed on the
    // learning rate; name the weight instead (the tensor, its layer, row and column, llm.c's order).
    long bad = 0;
    while (bad < n && std::isfinite((*full)[bad])) bad++;
    if (bad < n) {
        ShardPlan whole;
        shard_plan_init(&whole, c, 1, 0);
        long at = bad;
        int i = 0;
        while (at >= shard_full_size(&whole.t[i])) at -= shard_full_size(&whole.t[i++]);
        const TensorShard* t = &whole.t[i];
        long per_layer = t->rows * t->cols, in_layer = at % per_layer;
        char layer[32] = "";
        if (t->fl > 1) snprintf(layer, sizeof(layer), " layer %ld,", at / per_layer);
        fatal("checkpoint %s holds a non-finite weight (%g) at %s,%s row %ld, column %ld (parameter %ld): "
              "the file is damaged, or its run had diverged when it was saved",
              path, (*full)[bad], t->name, layer, in_layer / t->cols, in_layer % t->cols, bad);
    }
}

// Writes full parameters as an llm.c checkpoint, atomically: version 3 (fp32), or with in_bf16 version 5, every
// parameter rounded to the nearest bf16 (ties to even), which is what llm.c's bf16 trainer reads. A bf16
// run's state file keeps the fp32 masters themselves (state_write), so its resume is exact all the same.
// Returns 0, or the errno of the failure (the file at path is then untouched). sum (if set): the hash of
// every byte of the file.
static int model_write(const char* path, const GPTConfig* c, const float* full, uint64_t* sum = nullptr, bool in_bf16 = false) {
    AtomicFile a;
    if (!atomic_open(&a, path)) return a.err;
    Hasher hs;
    hash_init(&hs);
    a.hash = &hs;
    int h[256] = {0};
    h[0] = 20240326; h[1] = in_bf16 ? 5 : 3; h[2] = c->maxT; h[3] = c->V; h[4] = c->L; h[5] = c->NH; h[6] = c->C; h[7] = c->Vp;
    atomic_write(&a, h, sizeof(h));
    long n = gpt_num_params(c);
    if (!in_bf16) {
        atomic_write(&a, full, n * sizeof(float));
    } else {  // in pieces of 1M numbers, as model_read reads them
        std::vector<bf16> piece(std::min<long>(n, 1L << 20));
        for (long at = 0; at < n; at += (long)piece.size()) {
            long k = std::min<long>((long)piece.size(), n - at);
            for (long i = 0; i < k; i++) piece[i] = bf16_round(full[at + i]);
            atomic_write(&a, piece.data(), k * sizeof(bf16));
        }
    }
    atomic_close(&a);
    if (sum) *sum = hash_final(&hs);
    return a.err;
}

// ----------------------------------------------------------------------------
// state files, the checkpoints of a directory, resume

// A state file: this header, then flags_bytes of the run's flags (tp.cu's args_saved: "name\0value\0"
// pairs), then AdamW's m and v (nparams floats each), the loader's shard order (nshards int32) and
// sample permutation (nsamples int64), and its MT19937 as text (rng_bytes). Version 1 had no flags
// (its header ends before flags_bytes), version 2 no grid (its header ends before replicas: one replica,
// no accumulation), version 3 no checksums (its header ends before model_sum), version 4 no masters (its
// header ends before masters); tp still reads them all. masters = 1: the run computed in bf16, its model
// file is bf16 (version 5), and the fp32 master weights follow the random state here (nparams floats),
// because the rounded weights of the model file could not continue the run exactly.
// The checksums live here rather than in the model file, whose layout is llm.c's: model_sum is the hash of
// every byte of model_N.bin, state_sum of every byte of this file with state_sum itself read as 0.
#define STATE_MAGIC 20261130
#define STATE_VERSION 5
struct StateHeader {
    int64_t magic, version, step, adam_t, nparams, P;
    int64_t maxT, V, Vp, L, NH, C, B, T;
    int64_t shard_pos, sample_pos, nshards, nsamples, rng_bytes;
    int64_t flags_bytes;
    int64_t replicas, procs, micro_steps, zero;  // the grid: replicas (all processes), processes, -d's micro-steps, -z
    uint64_t model_sum, state_sum;               // checksums (hash_final) of the model file and of this file
    int64_t masters;                             // 1: the fp32 master weights are at the end (a bf16 run)
};
#define STATE_V1_HEADER_BYTES (19 * sizeof(int64_t))
#define STATE_V2_HEADER_BYTES (20 * sizeof(int64_t))
#define STATE_V3_HEADER_BYTES (24 * sizeof(int64_t))
#define STATE_V4_HEADER_BYTES (26 * sizeof(int64_t))

// what a resume restores besides the weights
struct TrainState {
    StateHeader h;
    std::string flags;               // the run's flags when it was saved (empty in a version-1 file)
    std::vector<float> m, v;         // AdamW's moments, full tensors in llm.c's order
    std::vector<int> shard_order;    // the train loader's shard order, position and sample permutation
    std::vector<long> sample_order;
    std::string rng;                 // its MT19937, as the standard library writes one
    std::vector<float> masters;      // a bf16 run's fp32 master weights (empty: the model file's are they)
};

static std::string ckpt_path(const char* dir, const char* kind, int step) {
    char name[64];
    snprintf(name, sizeof(name), "/%s_%08d.bin", kind, step);
    return std::string(dir) + name;
}

// the saved steps in dir, oldest first: every N with both model_N.bin and state_N.bin
static std::vector<int> ckpt_steps(const char* dir) {
    std::vector<int> steps;
    glob_t g;
    std::string pat = std::string(dir) + "/state_*.bin";
    if (glob(pat.c_str(), 0, nullptr, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++) {
            int step, len = 0;
            struct stat st;
            const char* base = strrchr(g.gl_pathv[i], '/') + 1;
            if (sscanf(base, "state_%d.bin%n", &step, &len) == 1 && base[len] == '\0' &&
                stat(ckpt_path(dir, "model", step).c_str(), &st) == 0)
                steps.push_back(step);
        }
        globfree(&g);
    }
    std::sort(steps.begin(), steps.end());
    return steps;
}

// Writes a state file atomically; sets h->state_sum (hashed in memory first: the sum goes in the header,
// which is written first). Returns 0 or the errno of the failure.
// masters (a bf16 run's fp32 master weights; else null) are written last, with h->masters set.
static int state_write(const char* path, StateHeader* h, const std::string& flags, const float* m, const float* v,
                       const DataLoader* d, const std::string& rng, const float* masters = nullptr) {
    h->masters = masters != nullptr;
    struct Part { const void* p; size_t n; } parts[] = {
        {h, sizeof(*h)}, {flags.data(), flags.size()}, {m, h->nparams * sizeof(float)}, {v, h->nparams * sizeof(float)},
        {d->shard_order.data(), h->nshards * sizeof(int)}, {d->sample_order.data(), h->nsamples * sizeof(long)},
        {rng.data(), rng.size()}, {masters, masters ? h->nparams * sizeof(float) : 0}};
    h->state_sum = 0;
    Hasher hs;
    hash_init(&hs);
    for (const Part& part : parts) hash_update(&hs, part.p, part.n);
    h->state_sum = hash_final(&hs);
    AtomicFile a;
    if (!atomic_open(&a, path)) return a.err;
    for (const Part& part : parts) atomic_write(&a, part.p, part.n);
    atomic_close(&a);
    return a.err;
}

// the bytes of the header of h's version
static long state_header_bytes(const StateHeader* h) {
    return h->version == 1 ? STATE_V1_HEADER_BYTES : h->version == 2 ? STATE_V2_HEADER_BYTES : h->version == 3 ? STATE_V3_HEADER_BYTES
         : h->version == 4 ? STATE_V4_HEADER_BYTES : sizeof(StateHeader);
}

// the size a state file with header h has, whole
static long state_file_bytes(const StateHeader* h) {
    return state_header_bytes(h) + h->flags_bytes + (2 + (h->masters ? 1 : 0)) * h->nparams * (long)sizeof(float) +
           h->nshards * (long)sizeof(int) + h->nsamples * (long)sizeof(long) + h->rng_bytes;
}

// Reads a state file's header, of any version, into h (the fields a version lacks filled in). Returns false
// when the file is too short or not a state file of a version this tp reads.
static bool state_header_read(FILE* f, StateHeader* h) {
    *h = StateHeader{};
    if (fread(h, 1, STATE_V1_HEADER_BYTES, f) != STATE_V1_HEADER_BYTES) return false;
    if (h->magic != STATE_MAGIC || h->version < 1 || h->version > STATE_VERSION) return false;
    if (h->version >= 2 && fread(&h->flags_bytes, sizeof(h->flags_bytes), 1, f) != 1) return false;
    size_t more = h->version >= 3 ? state_header_bytes(h) - STATE_V2_HEADER_BYTES : 0;
    if (more && fread((char*)h + STATE_V2_HEADER_BYTES, 1, more, f) != more) return false;
    if (h->version < 3) h->replicas = h->procs = h->micro_steps = 1;
    return h->nparams > 0 && h->nshards >= 0 && h->nsamples >= 0 && h->rng_bytes >= 0 && h->rng_bytes <= 1 << 20 &&
           h->flags_bytes >= 0 && h->flags_bytes <= 1 << 20 && (h->masters == 0 || h->masters == 1);
}

static std::string file_name(const std::string& path) { return path.substr(path.rfind('/') + 1); }

static long file_bytes(FILE* f) {
    struct stat st;
    return fstat(fileno(f), &st) == 0 ? (long)st.st_size : -1;
}

// Whether a model file is what the checksum in its state file's header says: "" if so, else what is wrong
// with it (truncated, longer, not an llm.c file, damaged). f: the open model file.
static std::string model_check(FILE* f, const std::string& path, const StateHeader* h) {
    std::string name = file_name(path);
    int mh[256];
    long size = file_bytes(f);
    if (fread(mh, sizeof(int), 256, f) != 256 || mh[0] != 20240326 || (mh[1] != 3 && mh[1] != 5)) return name + " has no llm.c model header";
    // tp writes version 5 (bf16) exactly when it keeps the masters in the state file
    if ((mh[1] == 5) != (h->masters == 1)) return name + (mh[1] == 5 ? " is bf16 but its state file has no fp32 masters" : " is fp32 but its state file is a bf16 run's");
    GPTConfig c = {};
    c.maxT = mh[2]; c.V = mh[3]; c.L = mh[4]; c.NH = mh[5]; c.C = mh[6]; c.Vp = mh[7];
    if (c.maxT <= 0 || c.V <= 0 || c.L <= 0 || c.NH <= 0 || c.C <= 0 || c.Vp < c.V) return name + " has an invalid header";
    long want = 1024 + (mh[1] == 5 ? 2 : 4) * gpt_num_params(&c);
    char buf[160];
    if (size < want) snprintf(buf, sizeof(buf), " is truncated (%ld of %ld bytes)", size, want);
    else if (size > want) snprintf(buf, sizeof(buf), " is longer than its header says (%ld bytes, not %ld)", size, want);
    if (size != want) return name + buf;
    if (gpt_num_params(&c) != h->nparams) return name + " has another shape than its state file";
    if (h->version < 4) return "";  // an older tp wrote no checksums
    Hasher hm;
    hash_init(&hm);
    if (!hash_file(f, 0, size, &hm)) return name + " cannot be read";
    if (hash_final(&hm) != h->model_sum) return name + " does not match its checksum";
    return "";
}

// What verifying a checkpoint found: whether each file is whole and matches its checksum (a state file of
// tp before version 4 has none: its files are checked for their sizes only), and if not, what is wrong.
struct CkptCheck {
    bool model_ok, state_ok;
    bool summed;      // the state file has checksums
    std::string why;  // empty when both are fine
};

// Verifies the checkpoint of `step` in dir, reading each of its two files once from start to end.
// (No tp run writes into dir meanwhile: the caller holds its lock, or only reads.)
static CkptCheck ckpt_verify(const char* dir, int step) {
    CkptCheck r = {false, false, false, ""};
    std::string mp = ckpt_path(dir, "model", step), sp = ckpt_path(dir, "state", step);
    FILE* sf = fopen(sp.c_str(), "rb");
    StateHeader h;
    if (!sf) {
        r.why = file_name(sp) + ": " + strerror(errno);
        return r;
    }
    if (!state_header_read(sf, &h)) {
        fclose(sf);
        r.why = file_name(sp) + " has no valid tp state header";
        return r;
    }
    r.summed = h.version >= 4;
    // the model file is hashed on a second thread while this one hashes the state file: on a machine
    // with cores to spare that halves the wait
    std::string model_why;
    std::thread model_thread([&]() {
        FILE* mf = fopen(mp.c_str(), "rb");
        model_why = mf ? model_check(mf, mp, &h) : file_name(mp) + ": " + strerror(errno);
        if (mf) fclose(mf);
    });
    long size = file_bytes(sf), want = state_file_bytes(&h);
    char buf[160] = "";
    if (size < want) snprintf(buf, sizeof(buf), " is truncated (%ld of %ld bytes)", size, want);
    else if (size > want) snprintf(buf, sizeof(buf), " is longer than its header says (%ld bytes, not %ld)", size, want);
    if (size == want && r.summed) {
        StateHeader z = h;
        z.state_sum = 0;
        Hasher hs;
        hash_init(&hs);
        long head = state_header_bytes(&h);
        hash_update(&hs, &z, head);
        if (!hash_file(sf, head, size, &hs)) snprintf(buf, sizeof(buf), " cannot be read");
        else if (hash_final(&hs) != h.state_sum) snprintf(buf, sizeof(buf), " does not match its checksum");
    }
    fclose(sf);
    r.state_ok = buf[0] == '\0';
    std::string state_why = r.state_ok ? "" : file_name(sp) + buf;
    model_thread.join();
    r.model_ok = model_why.empty();
    r.why = model_why + (!model_why.empty() && !state_why.empty() ? ", " : "") + state_why;
    return r;
}

static void read_all(FILE* f, void* p, size_t bytes, const char* path) {
    if (fread(p, 1, bytes, f) != bytes) fatal("state file %s is truncated: delete it to resume from the checkpoint before it", path);
}

// Reads the state file of `step` in dir: the header and the run's flags, and with body also the rest
// (AdamW's moments and the loader's state). nparams: the parameter count of its model file.
static void state_read(const char* dir, int step, long nparams, bool body, TrainState* s) {
    std::string path = ckpt_path(dir, "state", step);
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) fatal("cannot open %s: %s", path.c_str(), strerror(errno));
    StateHeader* h = &s->h;
    if (!state_header_read(f, h))
        fatal("%s is not a tp state file this tp reads (magic %lld, version %lld), or is corrupt", path.c_str(), (long long)h->magic,
              (long long)h->version);
    if (h->nparams != nparams) fatal("state file %s does not match its model file", path.c_str());
    s->flags.resize(h->flags_bytes);
    read_all(f, &s->flags[0], h->flags_bytes, path.c_str());
    if (!body) {
        fclose(f);
        return;
    }
    s->m.resize(h->nparams);
    s->v.resize(h->nparams);
    s->shard_order.resize(h->nshards);
    s->sample_order.resize(h->nsamples);
    s->rng.resize(h->rng_bytes);
    read_all(f, s->m.data(), h->nparams * sizeof(float), path.c_str());
    read_all(f, s->v.data(), h->nparams * sizeof(float), path.c_str());
    read_all(f, s->shard_order.data(), h->nshards * sizeof(int), path.c_str());
    read_all(f, s->sample_order.data(), h->nsamples * sizeof(long), path.c_str());
    read_all(f, &s->rng[0], h->rng_bytes, path.c_str());
    s->masters.resize(h->masters ? h->nparams : 0);
    if (h->masters) read_all(f, s->masters.data(), h->nparams * sizeof(float), path.c_str());
    fclose(f);
}

// The saved position counts global batches, so any grid with the same global batch (B x replicas x
// micro-steps sequences of T) continues on the same tokens; another one is refused.
static void global_batch_check(const StateHeader* h, int B, int T, int replicas, int micro_steps) {
    long was = (long)(h->B * h->replicas * h->micro_steps), now = (long)B * replicas * micro_steps;
    if (h->T != T || was != now)
        fatal("the checkpoint was trained with a global batch of %ld sequences of %lld tokens (-b %lld x %lld replicas x %lld "
              "micro-steps), this run has %ld of %d: resume with the same batch shape (-b, -t, --dp, processes, -d)",
              was, (long long)h->T, (long long)h->B, (long long)h->replicas, (long long)h->micro_steps, now, T);
}

// Puts the train loader where the state says it was.
static void loader_restore(DataLoader* d, const TrainState* s) {
    const StateHeader* h = &s->h;
    global_batch_check(h, d->B, d->T, d->replicas, d->micro_steps);
    if (h->nshards != (int64_t)d->shard_order.size() || h->shard_pos >= h->nshards)
        fatal("the train data has %zu shard%s, but the run was saved with %lld: resume it with its own data (-i)", d->shard_order.size(),
              d->shard_order.size() == 1 ? "" : "s", (long long)h->nshards);
    d->shard_order = s->shard_order;
    d->shard_pos = (int)h->shard_pos;
    loader_load_shard(d);  // opens the shard (and draws a permutation that the next lines replace)
    if (d->shuffle && h->nsamples != d->nsamples)
        fatal("the train data has %ld samples in its current shard, but the run was saved with %lld: resume it with its own data (-i)",
              d->nsamples, (long long)h->nsamples);
    if (d->shuffle) d->sample_order = s->sample_order;
    d->sample_pos = h->sample_pos;
    d->micro = 0;
    std::istringstream rng(s->rng);
    rng >> d->rng;
}

// The files in dir that belong to a run: every model_*.bin and state_*.bin (paired or not) and log.csv.
// A folder holding any of them holds a run, whether or not a resume could continue it.
static std::vector<std::string> run_files(const char* dir) {
    std::vector<std::string> names;
    for (const char* pat : {"/model_*.bin", "/state_*.bin", "/log.csv"}) {
        glob_t g;
        if (glob((std::string(dir) + pat).c_str(), 0, nullptr, &g) != 0) continue;
        for (size_t i = 0; i < g.gl_pathc; i++) names.push_back(file_name(g.gl_pathv[i]));
        globfree(&g);
    }
    return names;
}

// "a, b, c and 4 more": names for a message line
static std::string name_list(const std::vector<std::string>& names, size_t show = 3) {
    std::string s;
    for (size_t i = 0; i < names.size() && i < show; i++) s += (i ? ", " : "") + names[i];
    if (names.size() > show) s += " and " + std::to_string(names.size() - show) + " more";
    return s;
}

// Removes what an interrupted save left in dir: its temporary files (AtomicFile's PATH.tmp), never a
// finished file. Only while this run holds the folder's lock, so no live run's save is touched. Returns
// the names removed.
static std::vector<std::string> remove_stale_tmp(const char* dir) {
    std::vector<std::string> gone;
    for (const char* pat : {"/model_*.bin.tmp", "/state_*.bin.tmp", "/log.csv.tmp", "/sweep.csv.tmp"}) {
        glob_t g;
        if (glob((std::string(dir) + pat).c_str(), 0, nullptr, &g) != 0) continue;
        for (size_t i = 0; i < g.gl_pathc; i++)
            if (remove(g.gl_pathv[i]) == 0) gone.push_back(file_name(g.gl_pathv[i]));
        globfree(&g);
    }
    return gone;
}

// Deletes every file of the run in dir (state files first, so a half-deleted pair never looks saved);
// returns how many checkpoints there were.
static int ckpt_remove_all(const char* dir) {
    std::vector<int> steps = ckpt_steps(dir);
    for (int step : steps) remove(ckpt_path(dir, "state", step).c_str());
    for (const std::string& name : run_files(dir)) remove((std::string(dir) + "/" + name).c_str());
    return (int)steps.size();
}

// What a message says about the checkpoints in dir: "the checkpoints in DIR are steps 5 and 10 (continue
// with -y 1 -o DIR)", or that there are none.
static std::string ckpt_remaining(const char* dir) {
    std::vector<int> steps = ckpt_steps(dir);
    if (steps.empty()) return std::string("no checkpoint of this run is saved in ") + dir;
    std::string list;
    for (size_t i = 0; i < steps.size(); i++)
        list += (i == 0 ? "" : i + 1 == steps.size() ? " and " : ", ") + std::to_string(steps[i]);
    return std::string("the checkpoint") + (steps.size() > 1 ? "s" : "") + " in " + dir + (steps.size() > 1 ? " are steps " : " is step ") +
           list + " (continue with -y 1 -o " + dir + ")";
}

// The note every later error line ends with (common/error.h): the last good checkpoint of the run in dir.
static void ckpt_note(const char* dir, int step) {
    char note[600];
    if (step > 0) snprintf(note, sizeof(note), "the last good checkpoint is step %d in %s: continue with -y 1 -o %s", step, dir, dir);
    else snprintf(note, sizeof(note), "no checkpoint of this run is saved in %s yet", dir);
    fatal_note_set(note);
}

// ----------------------------------------------------------------------------
// saving

// Where a run's checkpoints go, and the host buffers its ranks gather AdamW's moments into.
struct Checkpoints {
    const char* dir;
    int keep;                 // how many of the newest checkpoints to keep
    std::string flags;        // the run's flags, saved in every state file
    std::vector<float> m, v;  // full tensors, sized before the rank threads start (the parameters gather
                              // into a buffer the caller gives)
    const std::vector<std::vector<CommSpan>>* spans = nullptr;  // a replica's stages in several processes:
                                                                // what each of replica 0's holds (process 0 collects)
};

// Every rank of the run (world: all replicas, all processes) saves step `step` together: the ranks of
// replica 0 write their shards into the full host buffers (params, AdamW's m and v; with ZeRO-1 every
// replica first takes part in gathering the moments' slices), then world rank 0 writes the files, then
// everyone goes on.
static void checkpoint_save(Checkpoints* ck, float* full_params, GPT* m, Rank* rk, Comm* world, const DataLoader* train, int step) {
    long n = gpt_num_params(&m->cfg);
    gpt_gather_masters(m, rk);  // ZeRO-1 in bf16: the replicas' slices of the masters (every replica calls it)
    if (rk->dp.rank == 0) gpt_gather(m, rk, m->params_mem, full_params);
    gpt_gather_moments(m, rk, m->m_mem, ck->m.data());
    gpt_gather_moments(m, rk, m->v_mem, ck->v.data());
    comm_barrier(world, "checkpoint gathered");
    if (ck->spans && world->local == 0) {  // the stages of other processes send process 0 their layers
        comm_procs_collect(world->g, full_params, *ck->spans, "the checkpoint's weights from the stages");
        comm_procs_collect(world->g, ck->m.data(), *ck->spans, "the checkpoint's AdamW m from the stages");
        comm_procs_collect(world->g, ck->v.data(), *ck->spans, "the checkpoint's AdamW v from the stages");
    }
    if (world->rank == 0) {
        std::string model = ckpt_path(ck->dir, "model", step), state = ckpt_path(ck->dir, "state", step);
        const GPTConfig* c = &m->cfg;
        std::ostringstream rng;
        rng << train->rng;
        StateHeader h = {STATE_MAGIC, STATE_VERSION, step, m->t, n, rk->P, c->maxT, c->V, c->Vp, c->L, c->NH, c->C,
                         train->B, train->T, train->shard_pos, train->sample_pos, (int64_t)train->shard_order.size(),
                         (int64_t)train->sample_order.size(), (int64_t)rng.str().size(), (int64_t)ck->flags.size(),
                         train->replicas, g_procs.n, train->micro_steps, m->zero, 0, 0, 0};  // the sums: model_write, state_write
        // a bf16 run: the model file in bf16 (llm.c's version 5), the fp32 masters in the state file
        int err = model_write(model.c_str(), c, full_params, &h.model_sum, m->bf16);
        const std::string* failed = &model;
        if (err == 0) {
            err = state_write(state.c_str(), &h, ck->flags, ck->m.data(), ck->v.data(), train, rng.str(), m->bf16 ? full_params : nullptr);
            failed = &state;
        }
        if (err != 0) {
            // the failed file's temporary is gone already (atomic_close); a model file without its state file
            // is no checkpoint: it goes too, and the line says exactly what is left
            if (failed == &state) remove(model.c_str());
            fatal_note_set(nullptr);
            fatal("saving the checkpoint of step %d failed: cannot write %s: %s; removed this save's partial files; %s", step,
                  failed->c_str(), strerror(err), ckpt_remaining(ck->dir).c_str());
        }
        // keep the newest ck->keep steps; the state file goes first, so a half-removed pair never looks saved
        std::vector<int> steps = ckpt_steps(ck->dir);
        for (int i = 0; i + ck->keep < (int)steps.size(); i++) {
            remove(ckpt_path(ck->dir, "state", steps[i]).c_str());
            remove(ckpt_path(ck->dir, "model", steps[i]).c_str());
        }
        printf("saved checkpoint %s (step %d)\n", model.c_str(), step);
        fflush(stdout);
        // this process's error lines name this step from now on: a peer that dies before the barrier below
        // leaves this checkpoint whole on disk, and "the last good checkpoint" must say so (the other
        // processes learn of it at the barrier, and tp.cu sets their note then)
        ckpt_note(ck->dir, step);
    }
    comm_barrier(world, "checkpoint written");
}
