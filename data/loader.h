// data/loader.h: llm.c token files and the data loader that serves batches from them.
//
// A token file (llm.c's format, written by data/prepare.py): a header of 256 int32 (magic 20240520,
// version 1, token count), then the tokens as uint16. A split is one file or a glob of shards.
// The loader yields batches as llm.c's does: sample s of a shard is the B*T+1 tokens starting at token
// s*B*T; inputs are the first B*T, targets the same shifted by one. In order, or shuffled: each epoch
// permutes the shards and each shard its samples (Fisher-Yates with MT19937 seeded 42, as llm.c).
//
// Data parallelism and gradient accumulation: a sample is then one optimizer step's global batch, G =
// replicas x micro-steps blocks of B*T tokens, and micro-batch k of replica g reads block k*replicas + g,
// as llm.c's loader does with its process rank and count. So the replicas together read, in order, the
// sequences one rank with -b G*B reads, shuffled or not (every replica draws the same permutation of the
// global batches), and any grid with the same global batch reads the same tokens at every step.
#pragma once
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <glob.h>
#include <random>
#include <string>
#include <sys/stat.h>
#include <vector>
#include "../common/error.h"

struct TokenShard {
    std::string path;
    long ntok;
    int max_id;    // the largest token id in the shard, and where it first occurs (token_shard_scan)
    long max_pos;
};

// Yields batches of B x T inputs and targets (the inputs shifted by one).
struct DataLoader {
    const char* what;  // "train" or "val", for messages
    int B, T, V;
    int replicas, replica;  // data parallelism: this loader serves replica `replica` of `replicas`
    int micro_steps;        // micro-batches per sample (gradient accumulation)
    int micro;              // the next micro-batch of the current sample
    bool shuffle;
    std::vector<TokenShard> shards;
    const std::vector<uint16_t>* mem;  // an in-memory shard (the embedded corpus) instead of files
    std::vector<int> shard_order;
    std::vector<long> sample_order;
    int shard_pos;   // index into shard_order
    long sample_pos; // index into the current shard's samples (global batches)
    long nsamples;   // samples in the current shard
    std::mt19937 rng;
    FILE* f;
    std::vector<uint16_t> buf;
    std::vector<int> inputs, targets;  // (B, T)
};

// Checks a token file's header and size; returns its token count.
static long token_file_check(const char* path, const char* what, long need) {
    struct stat st;
    if (stat(path, &st) != 0) fatal("cannot open %s data %s: %s", what, path, strerror(errno));
    if (S_ISDIR(st.st_mode)) fatal("%s data %s is a directory; give a token file or a glob like 'dir/*_train.bin'", what, path);
    FILE* f = fopen(path, "rb");
    if (!f) fatal("cannot open %s data %s: %s", what, path, strerror(errno));
    int h[256];
    if (fread(h, sizeof(int), 256, f) != 256)
        fatal("%s data %s is shorter than the 1024-byte header of an llm.c token file (make one with data/prepare.py)", what, path);
    fclose(f);
    if (h[0] != 20240520) fatal("%s data %s has magic %d, not 20240520: not an llm.c token file (make one with data/prepare.py)", what, path, h[0]);
    if (h[1] != 1) fatal("%s data %s has version %d; tp reads version 1 token files (uint16 tokens)", what, path, h[1]);
    long ntok = h[2];
    if (ntok < 0 || (long)st.st_size != 1024 + 2 * ntok)
        fatal("%s data %s is %ld bytes but its header promises %ld tokens (%ld bytes): the file is truncated or corrupt",
              what, path, (long)st.st_size, ntok, 1024 + 2 * ntok);
    if (ntok < need)
        fatal("%s data %s has %ld tokens, fewer than one batch needs (B*T x replicas x micro-steps + 1 = %ld): use a smaller "
              "-b, -t, --dp or -d", what, path, ntok, need);
    return ntok;
}

// tokens per sample: the global batch
static long loader_sample_tokens(const DataLoader* d) { return (long)d->B * d->T * d->replicas * d->micro_steps; }

// The shards a pattern names: a token file, or every file a glob matches, in sorted order, each header checked.
static std::vector<TokenShard> token_files(const char* pattern, const char* what, long need) {
    std::vector<TokenShard> shards;
    glob_t g;
    int rc = glob(pattern, 0, nullptr, &g);
    if (rc != 0 || g.gl_pathc == 0) {
        if (rc == 0) globfree(&g);
        fatal("no %s data matches '%s': give an llm.c token file or a glob of shards (make them with data/prepare.py)", what, pattern);
    }
    for (size_t i = 0; i < g.gl_pathc; i++) shards.push_back({g.gl_pathv[i], token_file_check(g.gl_pathv[i], what, need), -1, -1});
    globfree(&g);
    return shards;
}

// Reads every token of a shard once, streamed a few MB at a time, for its largest id and where that id
// first occurs: tp checks the whole of its data against the vocab before the first step, so a bad id
// deep in a file stops the run at once instead of hours in (or never, if no batch happens to hold it).
static void token_shard_scan(TokenShard* s, const char* what) {
    FILE* f = fopen(s->path.c_str(), "rb");
    if (!f || fseek(f, 1024, SEEK_SET) != 0) fatal("cannot open %s data %s: %s", what, s->path.c_str(), strerror(errno));
    std::vector<uint16_t> buf(1 << 21);
    s->max_id = -1;
    s->max_pos = -1;
    for (long pos = 0; pos < s->ntok;) {
        long n = std::min((long)buf.size(), s->ntok - pos);
        if ((long)fread(buf.data(), 2, n, f) != n) fatal("reading %s data %s failed at token %ld", what, s->path.c_str(), pos);
        uint16_t hi = 0;
        for (long i = 0; i < n; i++) hi = std::max(hi, buf[i]);  // vectorises; the position only when the max grows
        if ((int)hi > s->max_id) {
            s->max_id = hi;
            s->max_pos = pos + (std::find(buf.begin(), buf.begin() + n, hi) - buf.begin());
        }
        pos += n;
    }
    fclose(f);
}

static void loader_load_shard(DataLoader* d) {
    long ntok = d->mem ? (long)d->mem->size() : d->shards[d->shard_order[d->shard_pos]].ntok;
    d->nsamples = (ntok - 1) / loader_sample_tokens(d);
    d->sample_pos = 0;
    d->micro = 0;
    if (d->f) { fclose(d->f); d->f = nullptr; }
    if (!d->mem) {
        const char* path = d->shards[d->shard_order[d->shard_pos]].path.c_str();
        d->f = fopen(path, "rb");
        if (!d->f) fatal("cannot open %s data %s: %s", d->what, path, strerror(errno));
    }
    if (d->shuffle) {
        d->sample_order.resize(d->nsamples);
        for (long i = 0; i < d->nsamples; i++) d->sample_order[i] = i;
        for (long i = d->nsamples - 1; i > 0; i--) std::swap(d->sample_order[i], d->sample_order[d->rng() % (i + 1)]);
    }
}

// back to the first batch; when shuffling, a new epoch: a new shard order
static void loader_reset(DataLoader* d) {
    d->shard_pos = 0;
    int ns = (int)d->shard_order.size();
    if (d->shuffle)
        for (int i = ns - 1; i > 0; i--) std::swap(d->shard_order[i], d->shard_order[d->rng() % (i + 1)]);
    loader_load_shard(d);
}

// pattern: a token file or a glob of shards. mem: tokens to serve from memory instead (pattern unused).
// replicas, replica, micro_steps: the data-parallel replica served and the micro-batches per step (1, 0, 1:
// one rank reading every batch).
static void loader_init(DataLoader* d, const char* what, const char* pattern, const std::vector<uint16_t>* mem,
                        int B, int T, int V, bool shuffle, int replicas, int replica, int micro_steps) {
    *d = DataLoader();
    d->what = what;
    d->B = B;
    d->T = T;
    d->V = V;
    d->replicas = replicas;
    d->replica = replica;
    d->micro_steps = micro_steps;
    d->shuffle = shuffle;
    d->f = nullptr;
    d->rng.seed(42);
    long need = loader_sample_tokens(d) + 1;
    if (mem) {
        if ((long)mem->size() < need)
            fatal("the %s split has %zu tokens, fewer than one batch needs (B*T x replicas x micro-steps + 1 = %ld): use a "
                  "smaller -b, -t, --dp or -d", what, mem->size(), need);
        d->mem = mem;
        d->shard_order = {0};
    } else {
        d->shards = token_files(pattern, what, need);
        for (size_t i = 0; i < d->shards.size(); i++) d->shard_order.push_back((int)i);
    }
    d->buf.resize((long)B * T + 1);
    d->inputs.resize((long)B * T);
    d->targets.resize((long)B * T);
    loader_reset(d);
}

static void loader_free(DataLoader* d) {
    if (d->f) fclose(d->f);
    d->f = nullptr;
}

// the next batch (this replica's next micro-batch) into d->inputs and d->targets
static void loader_next(DataLoader* d) {
    if (d->micro == 0 && d->sample_pos >= d->nsamples) {
        if (d->shard_pos + 1 >= (int)d->shard_order.size()) loader_reset(d);  // end of the epoch
        else { d->shard_pos++; loader_load_shard(d); }
    }
    long s = d->shuffle ? d->sample_order[d->sample_pos] : d->sample_pos;
    long block = (long)d->micro * d->replicas + d->replica;
    if (++d->micro == d->micro_steps) {
        d->micro = 0;
        d->sample_pos++;
    }
    long n = (long)d->B * d->T + 1, start = s * loader_sample_tokens(d) + block * d->B * d->T;
    if (d->mem) memcpy(d->buf.data(), d->mem->data() + start, n * sizeof(uint16_t));
    else {
        if (fseek(d->f, 1024 + start * 2, SEEK_SET) != 0 || (long)fread(d->buf.data(), 2, n, d->f) != n)
            fatal("reading %s data %s failed at token %ld", d->what, d->shards[d->shard_order[d->shard_pos]].path.c_str(), start);
    }
    // tp checked every token against the vocab at startup (token_shard_scan); a file rewritten since then
    // must still never index past the embedding
    for (long i = 0; i < n; i++)
        if (d->buf[i] >= d->V)
            fatal("%s data %s changed while tp was running: it now holds token id %d at token %ld, beyond the vocab of %d",
                  d->what, d->mem ? "(embedded)" : d->shards[d->shard_order[d->shard_pos]].path.c_str(), d->buf[i], start + i, d->V);
    for (long i = 0; i < n - 1; i++) {
        d->inputs[i] = d->buf[i];
        d->targets[i] = d->buf[i + 1];
    }
}
