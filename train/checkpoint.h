// train/checkpoint.h (needs the model, gpt.cu): model files, state files and resume.
//
// A checkpoint of step N in DIR is two files:
//   DIR/model_NNNNNNNN.bin  the weights in llm.c's GPT-2 fp32 format (a header of 256 int32: magic
//                           20240326, version 3, maxT, V, L, NH, C, Vp; then the 16 tensors, full and
//                           unsharded, in llm.c's order), so llm.c and any TP degree can read it;
//   DIR/state_NNNNNNNN.bin  what an exact resume needs besides the weights: the step, AdamW's t, m and
//                           v as full tensors (ZeRO-1's slices gathered), the train loader's position (in
//                           global batches) and random state, the run's flags (data, steps, schedule, ...),
//                           so that `-y 1` alone continues it, and the grid that wrote it.
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
#include <sys/stat.h>
#include <unistd.h>
#include <vector>
#include "../common/error.h"
#include "../gpt.cu"
#include "../data/loader.h"

// ----------------------------------------------------------------------------
// files that are never left half-written: the bytes go to PATH.tmp, which is fsynced and renamed over
// PATH only when every write succeeded. A crash at any point leaves the old PATH or the new one.

struct AtomicFile {
    FILE* f;
    std::string path, tmp;
    int err;  // the first failure's errno; 0 while all is well
};

static bool atomic_open(AtomicFile* a, const char* path) {
    a->path = path;
    a->tmp = a->path + ".tmp";
    a->f = fopen(a->tmp.c_str(), "wb");
    a->err = a->f ? 0 : errno;
    return a->f != nullptr;
}

static void atomic_write(AtomicFile* a, const void* p, size_t bytes) {
    if (a->err == 0 && fwrite(p, 1, bytes, a->f) != bytes) a->err = errno ? errno : EIO;
}

// Flushes, syncs, closes and renames. On any failure removes the temporary file and returns false
// with a->err set; the caller reports it (once).
static bool atomic_close(AtomicFile* a) {
    if (a->err == 0 && fflush(a->f) != 0) a->err = errno;
    if (a->err == 0 && fsync(fileno(a->f)) != 0) a->err = errno;
    if (fclose(a->f) != 0 && a->err == 0) a->err = errno;
    if (a->err == 0 && rename(a->tmp.c_str(), a->path.c_str()) != 0) a->err = errno;
    if (a->err != 0) remove(a->tmp.c_str());
    return a->err == 0;
}

// ----------------------------------------------------------------------------
// model files (llm.c's GPT-2 fp32 format)

// Reads an llm.c version-3 (fp32) checkpoint's header into c and its tensors into full (full null: the
// header only, to size the run before allocating anything).
static void model_read(const char* path, GPTConfig* c, std::vector<float>* full) {
    FILE* f = fopen(path, "rb");
    if (!f) fatal("cannot open checkpoint %s: %s (give an llm.c model file or a descriptor like d12 to -e)", path, strerror(errno));
    int h[256];
    if (fread(h, sizeof(int), 256, f) != 256) fatal("checkpoint %s is shorter than its 1024-byte header: not an llm.c model file", path);
    if (h[0] != 20240326) fatal("checkpoint %s has magic %d, not 20240326: not an llm.c model file", path, h[0]);
    if (h[1] != 3) fatal("checkpoint %s has version %d; tp reads fp32 version 3 (export with llm.c's fp32 writer)", path, h[1]);
    c->maxT = h[2]; c->V = h[3]; c->L = h[4]; c->NH = h[5]; c->C = h[6]; c->Vp = h[7];
    if (c->maxT <= 0 || c->V <= 0 || c->L <= 0 || c->NH <= 0 || c->C <= 0 || c->Vp < c->V || c->C % c->NH != 0)
        fatal("checkpoint %s has an invalid header (maxT %d V %d L %d NH %d C %d Vp %d)", path, c->maxT, c->V, c->L, c->NH, c->C, c->Vp);
    long n = gpt_num_params(c);
    if (!full) {
        fclose(f);
        return;
    }
    full->resize(n);
    size_t got = fread(full->data(), sizeof(float), n, f);
    if ((long)got != n) fatal("checkpoint %s is truncated: %zu of %ld parameters present", path, got, n);
    char extra;
    if (fread(&extra, 1, 1, f) == 1) fatal("checkpoint %s is longer than its header says (%ld parameters)", path, n);
    fclose(f);
}

// Writes full parameters as an llm.c version-3 checkpoint, atomically. Returns 0, or the errno of the
// failure (the file at path is then untouched).
static int model_write(const char* path, const GPTConfig* c, const float* full) {
    AtomicFile a;
    if (!atomic_open(&a, path)) return a.err;
    int h[256] = {0};
    h[0] = 20240326; h[1] = 3; h[2] = c->maxT; h[3] = c->V; h[4] = c->L; h[5] = c->NH; h[6] = c->C; h[7] = c->Vp;
    atomic_write(&a, h, sizeof(h));
    atomic_write(&a, full, gpt_num_params(c) * sizeof(float));
    atomic_close(&a);
    return a.err;
}

// ----------------------------------------------------------------------------
// state files, the checkpoints of a directory, resume

// A state file: this header, then flags_bytes of the run's flags (tp.cu's args_saved: "name\0value\0"
// pairs), then AdamW's m and v (nparams floats each), the loader's shard order (nshards int32) and
// sample permutation (nsamples int64), and its MT19937 as text (rng_bytes). Version 1 had no flags
// (its header ends before flags_bytes), version 2 no grid (its header ends before replicas: one replica,
// no accumulation); tp still reads both.
#define STATE_MAGIC 20261130
#define STATE_VERSION 3
struct StateHeader {
    int64_t magic, version, step, adam_t, nparams, P;
    int64_t maxT, V, Vp, L, NH, C, B, T;
    int64_t shard_pos, sample_pos, nshards, nsamples, rng_bytes;
    int64_t flags_bytes;
    int64_t replicas, procs, micro_steps, zero;  // the grid: replicas (all processes), processes, -d's micro-steps, -z
};
#define STATE_V1_HEADER_BYTES (19 * sizeof(int64_t))
#define STATE_V2_HEADER_BYTES (20 * sizeof(int64_t))

// what a resume restores besides the weights
struct TrainState {
    StateHeader h;
    std::string flags;               // the run's flags when it was saved (empty in a version-1 file)
    std::vector<float> m, v;         // AdamW's moments, full tensors in llm.c's order
    std::vector<int> shard_order;    // the train loader's shard order, position and sample permutation
    std::vector<long> sample_order;
    std::string rng;                 // its MT19937, as the standard library writes one
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

static int state_write(const char* path, const StateHeader* h, const std::string& flags, const float* m, const float* v,
                       const DataLoader* d, const std::string& rng) {
    AtomicFile a;
    if (!atomic_open(&a, path)) return a.err;
    atomic_write(&a, h, sizeof(*h));
    atomic_write(&a, flags.data(), flags.size());
    atomic_write(&a, m, h->nparams * sizeof(float));
    atomic_write(&a, v, h->nparams * sizeof(float));
    atomic_write(&a, d->shard_order.data(), h->nshards * sizeof(int));
    atomic_write(&a, d->sample_order.data(), h->nsamples * sizeof(long));
    atomic_write(&a, rng.data(), rng.size());
    atomic_close(&a);
    return a.err;
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
    *h = StateHeader{};
    read_all(f, h, STATE_V1_HEADER_BYTES, path.c_str());
    if (h->magic != STATE_MAGIC || h->version < 1 || h->version > STATE_VERSION)
        fatal("%s is not a tp state file this tp reads (magic %lld, version %lld)", path.c_str(), (long long)h->magic, (long long)h->version);
    if (h->version >= 2) read_all(f, &h->flags_bytes, sizeof(h->flags_bytes), path.c_str());
    if (h->version >= 3) read_all(f, (char*)h + STATE_V2_HEADER_BYTES, sizeof(*h) - STATE_V2_HEADER_BYTES, path.c_str());
    else h->replicas = h->procs = h->micro_steps = 1;
    if (h->nparams != nparams) fatal("state file %s does not match its model file", path.c_str());
    if (h->nshards < 0 || h->nsamples < 0 || h->rng_bytes < 0 || h->rng_bytes > 1 << 20 || h->flags_bytes < 0 || h->flags_bytes > 1 << 20)
        fatal("state file %s is corrupt", path.c_str());
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
        fatal("the train data has %zu shards, but the run was saved with %lld: resume it with its own data (-i)", d->shard_order.size(),
              (long long)h->nshards);
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

// Deletes every checkpoint in dir (the state file first, so a half-deleted pair never looks saved);
// returns how many there were.
static int ckpt_remove_all(const char* dir) {
    std::vector<int> steps = ckpt_steps(dir);
    for (int step : steps) {
        remove(ckpt_path(dir, "state", step).c_str());
        remove(ckpt_path(dir, "model", step).c_str());
    }
    return (int)steps.size();
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
};

// Every rank of the run (world: all replicas, all processes) saves step `step` together: the ranks of
// replica 0 write their shards into the full host buffers (params, AdamW's m and v; with ZeRO-1 every
// replica first takes part in gathering the moments' slices), then world rank 0 writes the files, then
// everyone goes on.
static void checkpoint_save(Checkpoints* ck, float* full_params, GPT* m, Rank* rk, Comm* world, const DataLoader* train, int step) {
    long n = gpt_num_params(&m->cfg);
    if (rk->dp.rank == 0) gpt_gather(m, rk, m->params_mem, full_params);
    gpt_gather_moments(m, rk, m->m_mem, ck->m.data());
    gpt_gather_moments(m, rk, m->v_mem, ck->v.data());
    comm_barrier(world, "checkpoint gathered");
    if (world->rank == 0) {
        std::string model = ckpt_path(ck->dir, "model", step), state = ckpt_path(ck->dir, "state", step);
        const GPTConfig* c = &m->cfg;
        std::ostringstream rng;
        rng << train->rng;
        StateHeader h = {STATE_MAGIC, STATE_VERSION, step, m->t, n, rk->P, c->maxT, c->V, c->Vp, c->L, c->NH, c->C,
                         train->B, train->T, train->shard_pos, train->sample_pos, (int64_t)train->shard_order.size(),
                         (int64_t)train->sample_order.size(), (int64_t)rng.str().size(), (int64_t)ck->flags.size(),
                         train->replicas, g_procs.n, train->micro_steps, m->zero};
        int err = model_write(model.c_str(), c, full_params);
        const std::string* failed = &model;
        if (err == 0) {
            err = state_write(state.c_str(), &h, ck->flags, ck->m.data(), ck->v.data(), train, rng.str());
            failed = &state;
        }
        if (err != 0)
            fatal("saving the checkpoint of step %d failed: cannot write %s: %s; the earlier checkpoints are intact", step,
                  failed->c_str(), strerror(err));
        // keep the newest ck->keep steps; the state file goes first, so a half-removed pair never looks saved
        std::vector<int> steps = ckpt_steps(ck->dir);
        for (int i = 0; i + ck->keep < (int)steps.size(); i++) {
            remove(ckpt_path(ck->dir, "state", steps[i]).c_str());
            remove(ckpt_path(ck->dir, "model", steps[i]).c_str());
        }
        printf("saved checkpoint %s (step %d)\n", model.c_str(), step);
        fflush(stdout);
    }
    comm_barrier(world, "checkpoint written");
}
