// tp.cu: main. Flags, one thread per rank, the data loader, the training loop, evaluation and logging.
// The model and its tensor-parallel recipe are in gpt.cu; the collectives in comm.cuh.
//
//   make && ./tp                       train the default model on the embedded corpus
//   ./tp -e d12 -i 'train*.bin' -j val.bin --tp 4     GPT-2 124M over 4 ranks
#include <algorithm>
#include <atomic>
#include <csignal>
#include <glob.h>
#include <random>
#include <sstream>
#include <sys/stat.h>
#include <thread>
#include "gpt.cu"
#include "data/grammar.h"

// ----------------------------------------------------------------------------
// data: llm.c token files (256 int32 header: magic 20240520, version 1, token count; then uint16 tokens)

struct TokenShard {
    std::string path;
    long ntok;
};

// Yields batches of B x T inputs and targets (the inputs shifted by one), as llm.c's loader does:
// sample s of a shard is the B*T+1 tokens starting at token s*B*T. In order, or shuffled: each epoch
// permutes the shards and each shard its samples (Fisher-Yates with MT19937 seeded 42, as llm.c).
struct DataLoader {
    const char* what;  // "train" or "val", for messages
    int B, T, V;
    bool shuffle;
    std::vector<TokenShard> shards;
    const std::vector<uint16_t>* mem;  // an in-memory shard (the embedded corpus) instead of files
    std::vector<int> shard_order;
    std::vector<long> sample_order;
    int shard_pos;   // index into shard_order
    long sample_pos; // index into the current shard's samples
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
        fatal("%s data %s has %ld tokens, fewer than one batch needs (B*T+1 = %ld): use a smaller -b or -t", what, path, ntok, need);
    return ntok;
}

static void loader_load_shard(DataLoader* d) {
    long ntok = d->mem ? (long)d->mem->size() : d->shards[d->shard_order[d->shard_pos]].ntok;
    d->nsamples = (ntok - 1) / ((long)d->B * d->T);
    d->sample_pos = 0;
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
static void loader_init(DataLoader* d, const char* what, const char* pattern, const std::vector<uint16_t>* mem,
                        int B, int T, int V, bool shuffle) {
    *d = DataLoader();
    d->what = what;
    d->B = B;
    d->T = T;
    d->V = V;
    d->shuffle = shuffle;
    d->f = nullptr;
    d->rng.seed(42);
    long need = (long)B * T + 1;
    if (mem) {
        if ((long)mem->size() < need)
            fatal("the %s split has %zu tokens, fewer than one batch needs (B*T+1 = %ld): use a smaller -b or -t", what, mem->size(), need);
        d->mem = mem;
        d->shard_order = {0};
    } else {
        glob_t g;
        int rc = glob(pattern, 0, nullptr, &g);
        if (rc != 0 || g.gl_pathc == 0) {
            if (rc == 0) globfree(&g);
            fatal("no %s data matches '%s': give an llm.c token file or a glob of shards (make them with data/prepare.py)", what, pattern);
        }
        for (size_t i = 0; i < g.gl_pathc; i++) {
            long n = token_file_check(g.gl_pathv[i], what, need);
            d->shards.push_back({g.gl_pathv[i], n});
            d->shard_order.push_back((int)i);
        }
        globfree(&g);
    }
    d->buf.resize(need);
    d->inputs.resize((long)B * T);
    d->targets.resize((long)B * T);
    loader_reset(d);
}

static void loader_free(DataLoader* d) {
    if (d->f) fclose(d->f);
    d->f = nullptr;
}

// the next batch into d->inputs and d->targets
static void loader_next(DataLoader* d) {
    if (d->sample_pos >= d->nsamples) {
        if (d->shard_pos + 1 >= (int)d->shard_order.size()) loader_reset(d);  // end of the epoch
        else { d->shard_pos++; loader_load_shard(d); }
    }
    long s = d->shuffle ? d->sample_order[d->sample_pos] : d->sample_pos;
    d->sample_pos++;
    long n = (long)d->B * d->T + 1, start = s * (long)d->B * d->T;
    if (d->mem) memcpy(d->buf.data(), d->mem->data() + start, n * sizeof(uint16_t));
    else {
        if (fseek(d->f, 1024 + start * 2, SEEK_SET) != 0 || (long)fread(d->buf.data(), 2, n, d->f) != n)
            fatal("reading %s data %s failed at token %ld", d->what, d->shards[d->shard_order[d->shard_pos]].path.c_str(), start);
    }
    for (long i = 0; i < n; i++)
        if (d->buf[i] >= d->V)
            fatal("%s data %s holds token id %d at token %ld, but the model's vocab has %d tokens: use a model whose vocab covers the data (--vocab)",
                  d->what, d->mem ? "(embedded)" : d->shards[d->shard_order[d->shard_pos]].path.c_str(), d->buf[i], start + i, d->V);
    for (long i = 0; i < n - 1; i++) {
        d->inputs[i] = d->buf[i];
        d->targets[i] = d->buf[i + 1];
    }
}

// ----------------------------------------------------------------------------
// checkpoints: DIR/model_NNNNNNNN.bin (llm.c's fp32 format, full tensors) and DIR/state_NNNNNNNN.bin
// (what an exact resume needs besides the weights: the step, AdamW's t, m and v as full tensors, and
// the train loader's position and random state). Both are written to a temporary name, fsynced and
// renamed, the state last: a step counts as saved only when its state file exists.

#define STATE_MAGIC 20261130
struct StateHeader {
    int64_t magic, version, step, adam_t, nparams, P;
    int64_t maxT, V, Vp, L, NH, C, B, T;
    int64_t shard_pos, sample_pos, nshards, nsamples, rng_bytes;
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

static bool write_all(FILE* f, const void* p, size_t bytes) { return fwrite(p, 1, bytes, f) == bytes; }

static bool state_write(const char* path, const StateHeader* h, const float* m, const float* v, const DataLoader* d,
                        const std::string& rng) {
    std::string tmp;
    FILE* f = atomic_open(path, &tmp);
    if (!f) return false;
    bool ok = write_all(f, h, sizeof(*h)) && write_all(f, m, h->nparams * 4) && write_all(f, v, h->nparams * 4) &&
              write_all(f, d->shard_order.data(), h->nshards * sizeof(int)) &&
              write_all(f, d->sample_order.data(), h->nsamples * sizeof(long)) && write_all(f, rng.data(), rng.size());
    return atomic_close(f, ok, tmp, path);
}

static void read_all(FILE* f, void* p, size_t bytes, const char* path) {
    if (fread(p, 1, bytes, f) != bytes) fatal("state file %s is truncated: delete it to resume from the checkpoint before it", path);
}

// ----------------------------------------------------------------------------
// tokenizer (for printing samples): bytes for a byte-level vocab, or llm.c's gpt2_tokenizer.bin

struct Tokenizer {
    std::vector<std::string> pieces;  // empty: byte-level
    int eot;
};

static void tokenizer_load(Tokenizer* tk, const char* path, int V) {
    FILE* f = fopen(path, "rb");
    if (!f) fatal("cannot open tokenizer %s: %s", path, strerror(errno));
    uint32_t h[256];
    if (fread(h, 4, 256, f) != 256 || h[0] != 20240328)
        fatal("tokenizer %s is not an llm.c tokenizer file (magic 20240328)", path);
    if (h[1] != 1 && h[1] != 2) fatal("tokenizer %s has version %u; tp reads versions 1 and 2", path, h[1]);
    int n = (int)h[2];
    tk->eot = h[1] == 2 ? (int)h[3] : 50256;
    if (n < V) fatal("tokenizer %s has %d tokens but the model's vocab has %d: use the model's tokenizer", path, n, V);
    tk->pieces.resize(n);
    for (int i = 0; i < n; i++) {
        unsigned char len;
        if (fread(&len, 1, 1, f) != 1 || len == 0) fatal("tokenizer %s is truncated or corrupt at token %d", path, i);
        tk->pieces[i].resize(len);
        if (fread(&tk->pieces[i][0], 1, len, f) != len) fatal("tokenizer %s is truncated at token %d", path, i);
    }
    fclose(f);
}

static std::string tokenizer_decode(const Tokenizer* tk, int id) {
    if (tk->pieces.empty()) return std::string(1, (char)id);
    return tk->pieces[id];
}

// ----------------------------------------------------------------------------
// sampling

// One token from logits (the first V of them are real): greedy at temperature 0, else from
// softmax(logits / temperature) restricted to the topk largest (0: all), by inverse CDF.
static int sample_token(const float* logits, int V, float temperature, int topk, Rng* rng) {
    int best = 0;
    for (int i = 1; i < V; i++) if (logits[i] > logits[best]) best = i;
    if (temperature <= 0.0f) return best;
    float cut = -FLT_MAX;
    if (topk > 0 && topk < V) {
        std::vector<float> v(logits, logits + V);
        std::nth_element(v.begin(), v.begin() + (topk - 1), v.end(), std::greater<float>());
        cut = v[topk - 1];
    }
    std::vector<double> p(V);
    double z = 0.0;
    for (int i = 0; i < V; i++) {
        p[i] = logits[i] >= cut ? exp((double)(logits[i] - logits[best]) / temperature) : 0.0;
        z += p[i];
    }
    double u = rng_uniform(rng) * z, c = 0.0;
    for (int i = 0; i < V; i++) {
        c += p[i];
        if (u < c) return i;
    }
    return best;
}

// Autoregressive generation through the vocab-parallel head: n tokens after prompt. Each step runs the
// model on the last T tokens (batch 1) and all-gathers the logits of the last position; every rank
// then draws from the same generator, so all ranks agree on every token.
static std::vector<int> generate(GPT* m, Rank* rk, const std::vector<int>& prompt, int n, int T, float temperature,
                                 int topk, uint64_t seed) {
    std::vector<int> out = prompt, window(T, 0);
    std::vector<float> logits(m->cfg.Vp);
    Rng rng = {seed};
    for (int i = 0; i < n; i++) {
        int len = std::min((int)out.size(), T);
        std::copy(out.end() - len, out.end(), window.begin());
        gpt_forward(m, rk, window.data(), nullptr, 1, T, false);  // causal: the padding after len changes nothing
        gpt_logits_row(m, rk, 0, len - 1, logits.data());
        out.push_back(sample_token(logits.data(), m->cfg.V, temperature, topk, &rng));
    }
    return std::vector<int>(out.begin() + prompt.size(), out.end());
}

// ----------------------------------------------------------------------------
// flags

struct Args {
    const char* train;   // -i
    const char* val;     // -j
    const char* model;   // -e
    const char* outdir;  // -o
    int B, T;            // -b, -t
    float lr;            // -l
    int warmup;          // -u
    float final_frac;    // -q
    float wd;            // -c
    int max_steps;       // -x
    int val_every;       // -v
    int val_batches;     // -m
    int sample_every;    // -s
    int gen_tokens;      // -g
    int ckpt_every;      // -n
    int resume;          // -y
    int tp;              // --tp (0: as many ranks as the device allows)
    int device;          // --device
    float beta1, beta2, clip;
    int shuffle;
    int vocab, maxT;     // for descriptors
    long seed;
    int threads;         // per rank (0: cores / ranks)
    double timeout;
    float temperature;   // sampling
    int topk;
    long sample_seed;
    const char* prompt;
    const char* tokenizer;
    int keep;            // checkpoints kept in -o
    int sweep;           // --sweep: time every valid P instead of training
    int sweep_steps;
};

static void usage(FILE* out) {
    fprintf(out,
        "usage: ./tp [flags]        train GPT-2 with tensor parallelism over --tp ranks (one thread each)\n"
        "  -i PATTERN  train tokens: an llm.c token file or a glob of shards   (default: the embedded corpus)\n"
        "  -j PATTERN  val tokens                                               (default: the embedded corpus)\n"
        "  -e MODEL    llm.c fp32 checkpoint file, or a descriptor: d1..d12, d24, d36, d48, or\n"
        "              L<layers>C<channels>H<heads> such as L3C128H4             (default L3C128H4)\n"
        "  -o DIR      output directory for checkpoints                         (default: none)\n"
        "  -b B        batch size (sequences)                                   (default 8)\n"
        "  -t T        sequence length                                          (default 128)\n"
        "  -l LR       peak learning rate                                       (default 6e-3)\n"
        "  -u N        warmup steps                                             (default 100)\n"
        "  -q F        final learning rate as a fraction of -l, cosine decay    (default 0)\n"
        "  -c WD       weight decay of the matrices (AdamW, decoupled)          (default 0)\n"
        "  -x N        training steps                                           (default 3500)\n"
        "  -v N        val loss every N steps, and at the last step (0: never)  (default 875)\n"
        "  -m N        val batches                                              (default 50)\n"
        "  -s N        sample every N steps (0: only at the end)                (default 0)\n"
        "  -g N        tokens to generate per sample                            (default 256)\n"
        "  -n N        checkpoint every N steps with -o (0: only at the end)    (default 0)\n"
        "  -y 1        resume from the latest checkpoint in -o                  (default 0)\n"
        "  --tp P      tensor-parallel ranks (0: one per core or GPU)          (default 0)\n"
        "  --device D  auto, cpu or cuda                                        (default auto)\n"
        "  --beta1 B1  --beta2 B2     AdamW betas                               (default 0.9, 0.95)\n"
        "  --clip X    clip the global gradient norm at X (0: off)              (default 1)\n"
        "  --shuffle S 1: shuffled batches, 0: in order as llm.c's -x runs      (default 1)\n"
        "  --vocab V   vocab size for a descriptor model                        (default 256 with the\n"
        "              embedded corpus, else 50257)\n"
        "  --maxT N    maximum sequence length for a descriptor model           (default 1024)\n"
        "  --seed N    initialization seed                                      (default 1337)\n"
        "  --threads N CPU threads per rank (0: cores / ranks)                  (default 0)\n"
        "  --timeout S abort if a collective waits longer than S seconds       (default 600)\n"
        "  --keep K    keep the last K checkpoints in -o                        (default 3)\n"
        "  --sweep 1   time P = 1, 2, ... (every valid P) and print a scaling table (-o: sweep.csv)\n"
        "  --sweep-steps N  steps per P in the sweep, the first 2 not timed     (default 8)\n"
        "  --temperature X  sampling temperature (0: greedy)                   (default 0.8)\n"
        "  --topk K    sample from the K most likely tokens (0: all)            (default 0)\n"
        "  --sample-seed N  seed of the sampler                                 (default 42)\n"
        "  --prompt S  text to continue (byte-level models)                     (default: a newline)\n"
        "  --tokenizer F  llm.c gpt2_tokenizer.bin to print GPT-2 tokens as text (default: token ids)\n"
        "  --help      this text\n");
}

// a bad command line: the usage on stdout, one line on stderr saying what is wrong, exit 1
static void bad_flag(const char* fmt, const char* a, const char* b) {
    usage(stdout);
    fflush(stdout);
    fprintf(stderr, "error: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, " (./tp --help lists the flags)\n");
    exit(1);
}

static long parse_int(const char* flag, const char* v, long lo, long hi) {
    char* end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0' || errno) bad_flag("flag %s takes an integer, not '%s'", flag, v);
    if (x < lo || x > hi) {
        char msg[160];
        snprintf(msg, sizeof(msg), "flag %%s is %%s, out of range [%ld, %ld]", lo, hi);
        bad_flag(msg, flag, v);
    }
    return x;
}

static float parse_float(const char* flag, const char* v, double lo, double hi) {
    char* end;
    errno = 0;
    double x = strtod(v, &end);
    if (*v == '\0' || *end != '\0' || errno || !std::isfinite(x)) bad_flag("flag %s takes a number, not '%s'", flag, v);
    if (x < lo || x > hi) {
        char msg[160];
        snprintf(msg, sizeof(msg), "flag %%s is %%s, out of range [%g, %g]", lo, hi);
        bad_flag(msg, flag, v);
    }
    return (float)x;
}

static void parse_args(int argc, char** argv, Args* a) {
    *a = Args{};
    // the defaults are the `make && ./tp` run: the L3C128H4 model on the embedded corpus, about 2.5 minutes
    // on 2 CPU cores (for GPT-2 sizes give -l, -u, -q and -x as llm.c does, e.g. -l 6e-4 -u 700 -q 0)
    a->B = 8; a->T = 128; a->lr = 6e-3f; a->warmup = 100; a->final_frac = 0.0f; a->wd = 0.0f;
    a->max_steps = 3500; a->val_every = 875; a->val_batches = 50; a->sample_every = 0; a->gen_tokens = 256;
    a->beta1 = 0.9f; a->beta2 = 0.95f; a->clip = 1.0f; a->shuffle = 1; a->maxT = 1024; a->seed = 1337;
    a->device = -1; a->timeout = 600;
    a->temperature = 0.8f; a->topk = 0; a->sample_seed = 42; a->keep = 3; a->sweep_steps = 8;
    for (int i = 1; i < argc; i++) {
        const char* f = argv[i];
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) { usage(stdout); exit(0); }
        if (f[0] != '-') bad_flag("unexpected argument '%s'%s", f, "");
        if (i + 1 >= argc) bad_flag("flag %s needs a value%s", f, "");
        const char* v = argv[++i];
        if (!strcmp(f, "-i")) a->train = v;
        else if (!strcmp(f, "-j")) a->val = v;
        else if (!strcmp(f, "-e")) a->model = v;
        else if (!strcmp(f, "-o")) a->outdir = v;
        else if (!strcmp(f, "-b")) a->B = (int)parse_int(f, v, 1, 1 << 16);
        else if (!strcmp(f, "-t")) a->T = (int)parse_int(f, v, 1, 1 << 16);
        else if (!strcmp(f, "-l")) a->lr = parse_float(f, v, 0, 10);
        else if (!strcmp(f, "-u")) a->warmup = (int)parse_int(f, v, 0, 1L << 30);
        else if (!strcmp(f, "-q")) a->final_frac = parse_float(f, v, 0, 1);
        else if (!strcmp(f, "-c")) a->wd = parse_float(f, v, 0, 10);
        else if (!strcmp(f, "-x")) a->max_steps = (int)parse_int(f, v, 1, 1L << 30);
        else if (!strcmp(f, "-v")) a->val_every = (int)parse_int(f, v, 0, 1L << 30);
        else if (!strcmp(f, "-m")) a->val_batches = (int)parse_int(f, v, 1, 1L << 20);
        else if (!strcmp(f, "-s")) a->sample_every = (int)parse_int(f, v, 0, 1L << 30);
        else if (!strcmp(f, "-g")) a->gen_tokens = (int)parse_int(f, v, 0, 1 << 20);
        else if (!strcmp(f, "-n")) a->ckpt_every = (int)parse_int(f, v, 0, 1L << 30);
        else if (!strcmp(f, "-y")) a->resume = (int)parse_int(f, v, 0, 1);
        else if (!strcmp(f, "--tp")) a->tp = (int)parse_int(f, v, 0, COMM_MAXP);
        else if (!strcmp(f, "--device")) {
            if (!strcmp(v, "auto")) a->device = -1;
            else if (!strcmp(v, "cpu")) a->device = DEV_CPU;
            else if (!strcmp(v, "cuda")) a->device = DEV_CUDA;
            else bad_flag("flag %s takes auto, cpu or cuda, not '%s'", f, v);
        }
        else if (!strcmp(f, "--beta1")) a->beta1 = parse_float(f, v, 0, 0.999999);
        else if (!strcmp(f, "--beta2")) a->beta2 = parse_float(f, v, 0, 0.999999);
        else if (!strcmp(f, "--clip")) a->clip = parse_float(f, v, 0, 1e9);
        else if (!strcmp(f, "--shuffle")) a->shuffle = (int)parse_int(f, v, 0, 1);
        else if (!strcmp(f, "--vocab")) a->vocab = (int)parse_int(f, v, 2, 1 << 20);
        else if (!strcmp(f, "--maxT")) a->maxT = (int)parse_int(f, v, 1, 1 << 20);
        else if (!strcmp(f, "--seed")) a->seed = parse_int(f, v, 0, 1L << 62);
        else if (!strcmp(f, "--threads")) a->threads = (int)parse_int(f, v, 0, 1024);
        else if (!strcmp(f, "--timeout")) a->timeout = parse_float(f, v, 0.001, 1e7);
        else if (!strcmp(f, "--temperature")) a->temperature = parse_float(f, v, 0, 100);
        else if (!strcmp(f, "--topk")) a->topk = (int)parse_int(f, v, 0, 1 << 24);
        else if (!strcmp(f, "--sample-seed")) a->sample_seed = parse_int(f, v, 0, 1L << 62);
        else if (!strcmp(f, "--prompt")) a->prompt = v;
        else if (!strcmp(f, "--tokenizer")) a->tokenizer = v;
        else if (!strcmp(f, "--keep")) a->keep = (int)parse_int(f, v, 1, 1 << 20);
        else if (!strcmp(f, "--sweep")) a->sweep = (int)parse_int(f, v, 0, 1);
        else if (!strcmp(f, "--sweep-steps")) a->sweep_steps = (int)parse_int(f, v, 3, 1 << 20);
        else bad_flag("unknown flag %s%s", f, "");
    }
    if (a->resume && !a->outdir) bad_flag("-y 1 resumes from the checkpoints in -o DIR: give -o%s%s", "", "");
    if ((a->train == nullptr) != (a->val == nullptr))
        bad_flag("give both -i and -j (train and val data), or neither for the embedded corpus%s%s", "", "");
}

// ----------------------------------------------------------------------------
// the run: what the rank threads share

struct Run {
    Args args;
    GPTConfig cfg;
    int P;
    int device;
    int threads;                  // per rank (CPU)
    int ngpu;                     // CUDA devices visible; rank r runs on GPU r % ngpu
    double peak_flops;            // dense TF32 peak of one GPU, for MFU (0: unknown)
    std::string gpu_name;
    CommGroup group;
    std::vector<float> init;      // the full initial parameters, each rank slices its shard
    std::vector<float> full;      // gather buffer for checkpoints
    std::vector<uint16_t> corpus_train, corpus_val;  // the embedded corpus, when no -i/-j
    double floor_nats;            // its entropy per byte, the loss floor (0 if unknown)
    Tokenizer tokenizer;
    std::vector<int> prompt;
    // checkpoints: gather buffers, and what a resume restores
    std::vector<float> full_m, full_v;
    int start_step;
    bool resuming;
    StateHeader state;
    std::vector<int> state_shard_order;
    std::vector<long> state_sample_order;
    std::string state_rng;
    bool stop_now;  // written by rank 0 between two barriers, read by all
    // --sweep: rank 0's timings of the current P (steps after the first two)
    bool sweeping;
    double sweep_s, sweep_comm_s;
    int sweep_n;
    FILE* log;      // -o: DIR/log.csv, one row per step
    // what rank 0 reports back (tests read these)
    std::vector<float> train_losses, val_losses;
};

// which steps get a line on stdout: all of a short run; of a long one the first 10, every 100th and the
// last (log.csv in -o has every step)
static bool print_step(const Args* a, int step) {
    return a->max_steps <= 200 || step < 10 || (step + 1) % 100 == 0 || step == a->max_steps - 1;
}

// the learning rate at step (0-based): linear warmup, then cosine decay to lr * final_frac
static float lr_at(const Args* a, int step) {
    if (step < a->warmup) return a->lr * (step + 1) / a->warmup;
    if (a->max_steps <= a->warmup) return a->lr;
    float decay = (float)(step - a->warmup) / (a->max_steps - a->warmup);
    float coeff = 0.5f * (1.0f + cosf(3.14159265358979f * decay));
    float lr_min = a->lr * a->final_frac;
    return lr_min + coeff * (a->lr - lr_min);
}

static double now_s() { return comm_now(); }

// mean loss over the first n val batches, the same on every rank
static float evaluate(GPT* m, Rank* rk, DataLoader* val, int n) {
    loader_reset(val);
    double s = 0.0;
    for (int i = 0; i < n; i++) {
        loader_next(val);
        gpt_forward(m, rk, val->inputs.data(), val->targets.data(), val->B, val->T, false);
        s += gpt_read_loss(m, rk);
    }
    return (float)(s / n);
}

static void print_sample(Run* run, GPT* m, Rank* rk, int step) {
    const Args* a = &run->args;
    std::vector<int> out = generate(m, rk, run->prompt, a->gen_tokens, a->T, a->temperature, a->topk, (uint64_t)a->sample_seed);
    if (rk->rank != 0) return;
    printf("sample after %d steps (temperature %g%s):\n---\n", step, a->temperature, a->topk ? ", top-k" : "");
    bool text = !run->tokenizer.pieces.empty() || run->cfg.V <= 256;
    if (a->prompt) printf("%s", a->prompt);
    for (int t : out) {
        if (text) printf("%s", tokenizer_decode(&run->tokenizer, t).c_str());
        else printf("%d ", t);
    }
    printf("\n---\n");
    fflush(stdout);
}

// Reads the state of `step` in dir into the run; the model file of that step becomes the initial weights.
static void resume_read(Run* run, const char* dir, int step) {
    std::string path = ckpt_path(dir, "state", step);
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) fatal("cannot open %s: %s", path.c_str(), strerror(errno));
    StateHeader* h = &run->state;
    read_all(f, h, sizeof(*h), path.c_str());
    if (h->magic != STATE_MAGIC || h->version != 1) fatal("%s is not a tp state file (magic %lld)", path.c_str(), (long long)h->magic);
    if (h->nparams != (int64_t)run->init.size()) fatal("state file %s does not match its model file", path.c_str());
    if (h->nshards < 0 || h->nsamples < 0 || h->rng_bytes < 0 || h->rng_bytes > 1 << 20)
        fatal("state file %s is corrupt", path.c_str());
    run->full_m.resize(h->nparams);
    run->full_v.resize(h->nparams);
    run->state_shard_order.resize(h->nshards);
    run->state_sample_order.resize(h->nsamples);
    run->state_rng.resize(h->rng_bytes);
    read_all(f, run->full_m.data(), h->nparams * 4, path.c_str());
    read_all(f, run->full_v.data(), h->nparams * 4, path.c_str());
    read_all(f, run->state_shard_order.data(), h->nshards * sizeof(int), path.c_str());
    read_all(f, run->state_sample_order.data(), h->nsamples * sizeof(long), path.c_str());
    read_all(f, &run->state_rng[0], h->rng_bytes, path.c_str());
    fclose(f);
}

// Puts the train loader where the state file says it was.
static void loader_restore(DataLoader* d, const Run* run) {
    const StateHeader* h = &run->state;
    if (h->B != d->B || h->T != d->T)
        fatal("the checkpoint was trained with -b %lld -t %lld: resume with the same batch shape", (long long)h->B, (long long)h->T);
    if (h->nshards != (int64_t)d->shard_order.size() || h->shard_pos >= h->nshards)
        fatal("the training data changed since the checkpoint (%lld shards then, %zu now)", (long long)h->nshards, d->shard_order.size());
    d->shard_order = run->state_shard_order;
    d->shard_pos = (int)h->shard_pos;
    loader_load_shard(d);  // opens the shard (and draws a permutation that the next lines replace)
    if (d->shuffle && h->nsamples != d->nsamples)
        fatal("the training data changed since the checkpoint (%lld samples per shard then, %ld now)", (long long)h->nsamples, d->nsamples);
    if (d->shuffle) d->sample_order = run->state_sample_order;
    d->sample_pos = h->sample_pos;
    std::istringstream rng(run->state_rng);
    rng >> d->rng;
}

// Ctrl-C / SIGTERM: finish the step, save, exit 0. The handler only sets a flag; a second signal kills.
// (a lock-free atomic: safe in a signal handler, and read by the rank threads without a race)
static std::atomic<int> g_signal{0};
static void on_signal(int sig) { g_signal.store(sig); }

// All ranks save the same step together: each writes its shards into the full host buffers (params,
// AdamW m and v), then rank 0 writes the files, then everyone goes on.
static void save_checkpoint(Run* run, GPT* m, Rank* rk, const DataLoader* train, int step) {
    const Args* a = &run->args;
    gpt_gather(m, rk, m->params_mem, run->init.data());
    gpt_gather(m, rk, m->m_mem, run->full_m.data());
    gpt_gather(m, rk, m->v_mem, run->full_v.data());
    comm_barrier(&rk->comm, "checkpoint gathered");
    if (rk->rank == 0) {
        std::string model = ckpt_path(a->outdir, "model", step), state = ckpt_path(a->outdir, "state", step);
        const GPTConfig* c = &run->cfg;
        std::ostringstream rng;
        rng << train->rng;
        StateHeader h = {STATE_MAGIC, 1, step, m->t, (int64_t)run->init.size(), run->P, c->maxT, c->V, c->Vp, c->L, c->NH, c->C,
                         a->B, a->T, train->shard_pos, train->sample_pos, (int64_t)train->shard_order.size(),
                         (int64_t)train->sample_order.size(), (int64_t)rng.str().size()};
        if (!gpt_write_checkpoint(model.c_str(), c, run->init.data()) ||
            !state_write(state.c_str(), &h, run->full_m.data(), run->full_v.data(), train, rng.str()))
            fatal("saving the checkpoint of step %d in %s failed; the earlier checkpoints are intact", step, a->outdir);
        // keep the newest --keep steps; the state file goes first, so a half-removed pair never looks saved
        std::vector<int> steps = ckpt_steps(a->outdir);
        for (int i = 0; i + a->keep < (int)steps.size(); i++) {
            remove(ckpt_path(a->outdir, "state", steps[i]).c_str());
            remove(ckpt_path(a->outdir, "model", steps[i]).c_str());
        }
        printf("saved checkpoint %s (step %d)\n", model.c_str(), step);
        fflush(stdout);
    }
    comm_barrier(&rk->comm, "checkpoint written");
}

// A rank's thread begins here: its device, its stream and handles (GPU), its communicator.
static void rank_start(Rank* rk, Run* run, int r) {
    rk->rank = r;
    rk->P = run->P;
    rk->device = run->device;
    rk->gpu = run->device == DEV_CUDA ? r % run->ngpu : -1;
    rk->threads = run->threads;
    omp_set_num_threads(rk->threads);
    if (rk->device == DEV_CUDA) cuda_ctx_init(&rk->cuda, r, rk->gpu);
    comm_init(&rk->comm, &run->group, r);
    // ranks on distinct GPUs talk through NCCL, ranks sharing a GPU through shared device memory
    if (rk->device == DEV_CUDA) comm_bind_cuda(&rk->comm, rk->gpu, rk->cuda.stream);
}

static void rank_end(Rank* rk) {
    if (rk->device == DEV_CUDA) {
        comm_free(&rk->comm);
        cuda_ctx_free(&rk->cuda);
    }
}

static void rank_main(Run* run, int r) {
    const Args* a = &run->args;
    Rank rk;
    rank_start(&rk, run, r);

    GPT m;
    gpt_build(&m, &rk, &run->cfg, run->init.data());
    DataLoader train, val;
    if (a->train) {
        loader_init(&train, "train", a->train, nullptr, a->B, a->T, run->cfg.V, a->shuffle);
        loader_init(&val, "val", a->val, nullptr, a->B, a->T, run->cfg.V, false);
    } else {
        loader_init(&train, "train", nullptr, &run->corpus_train, a->B, a->T, run->cfg.V, a->shuffle);
        loader_init(&val, "val", nullptr, &run->corpus_val, a->B, a->T, run->cfg.V, false);
    }
    if (run->resuming) {
        gpt_scatter(&m, &rk, run->full_m.data(), m.m_mem);
        gpt_scatter(&m, &rk, run->full_v.data(), m.v_mem);
        m.t = (int)run->state.adam_t;
        loader_restore(&train, run);
    }
    comm_barrier(&rk.comm, "start");
    bool lead = r == 0;
    int BT = a->B * a->T;
    double total_time = 0.0, total_comm = 0.0;
    int last_saved = run->resuming ? run->start_step : -1;
    // model FLOPs of one step: 6 per parameter per token (forward + backward) plus attention's 12 L T C
    const GPTConfig* c = &run->cfg;
    double flops_per_step = (6.0 * gpt_num_params(c) + 12.0 * c->L * a->T * c->C) * BT;
    for (int step = run->start_step; step < a->max_steps; step++) {
        bool last = step == a->max_steps - 1;
        float vl = NAN;
        if (a->val_every > 0 && (step % a->val_every == 0 || last)) {
            vl = evaluate(&m, &rk, &val, a->val_batches);
            if (lead) {
                run->val_losses.push_back(vl);
                if (run->floor_nats > 0) printf("val loss %.6f  (floor %.4f, %.1f%% above)\n", vl, run->floor_nats, 100.0 * (vl / run->floor_nats - 1.0));
                else printf("val loss %.6f\n", vl);
                fflush(stdout);
            }
        }
        if (a->sample_every > 0 && step > 0 && step % a->sample_every == 0) print_sample(run, &m, &rk, step);
        double t0 = now_s();
        double comm0 = rk.comm.seconds, vals0 = rk.comm.values;
        loader_next(&train);
        gpt_forward(&m, &rk, train.inputs.data(), train.targets.data(), a->B, a->T, true);
        gpt_zero_grad(&m, &rk);
        gpt_backward(&m, &rk);
        float lr = lr_at(a, step);
        gpt_update(&m, &rk, lr, a->beta1, a->beta2, 1e-8f, a->wd, a->clip);
        float loss = gpt_read_loss(&m, &rk);
        float norm = gpt_read_norm(&m, &rk);
        double dt = now_s() - t0;
        if (step > run->start_step) {  // the first step warms up caches and allocations
            total_time += dt;
            total_comm += rk.comm.seconds - comm0;
        }
        if (!std::isfinite(loss) || !std::isfinite(norm))
            fatal("step %d: the loss (%f) or gradient norm (%f) is not finite; lower the learning rate (-l) or clip (--clip)", step + 1, loss, norm);
        if (lead && run->sweeping && step >= 2) {
            run->sweep_s += dt;
            run->sweep_comm_s += rk.comm.seconds - comm0;
            run->sweep_n++;
        }
        if (lead && run->log)
            fprintf(run->log, "%d,%.6f,%s,%.6e,%.3f,%.1f,%.3f,%.0f\n", step + 1, loss, std::isnan(vl) ? "" : std::to_string(vl).c_str(), lr,
                    dt * 1e3, BT / dt, (rk.comm.seconds - comm0) * 1e3, (rk.comm.values - vals0) * 4);
        if (lead && !run->sweeping) run->train_losses.push_back(loss);
        if (lead && !run->sweeping && print_step(a, step)) {
            char mfu[32] = "";
            if (run->peak_flops > 0) snprintf(mfu, sizeof(mfu), " | MFU %.1f%%", 100.0 * flops_per_step / dt / (run->peak_flops * std::min(run->P, run->ngpu)));
            printf("step %4d/%d | loss %.6f | lr %.2e | norm %.4f | %.1f ms | %.0f tok/s%s | comm %.1f ms, %.2f MB\n",
                   step + 1, a->max_steps, loss, lr, norm, dt * 1e3, BT / dt, mfu, (rk.comm.seconds - comm0) * 1e3,
                   (rk.comm.values - vals0) * 4 / 1e6);
            fflush(stdout);
        }
        if (a->outdir && !run->sweeping && a->ckpt_every > 0 && (step + 1) % a->ckpt_every == 0) {
            save_checkpoint(run, &m, &rk, &train, step + 1);
            last_saved = step + 1;
        }
        // Stop on a signal, all ranks at the same step: rank 0 reads the flag between two barriers and
        // everyone reads its decision after the second (a rank deciding alone would leave the others
        // waiting in the next step's first collective).
        comm_barrier(&rk.comm, "signal check");
        if (lead) run->stop_now = g_signal.load() != 0;
        comm_barrier(&rk.comm, "signal check");
        if (run->stop_now) {
            if (a->outdir && last_saved != step + 1) save_checkpoint(run, &m, &rk, &train, step + 1);
            if (lead) {
                if (a->outdir) printf("interrupted after step %d: saved in %s; continue with -y 1\n", step + 1, a->outdir);
                else printf("interrupted after step %d (no -o, nothing saved)\n", step + 1);
                fflush(stdout);
            }
            loader_free(&train);
            loader_free(&val);
            gpt_free(&m, &rk);
            rank_end(&rk);
            return;
        }
    }
    if (a->outdir && !run->sweeping && last_saved != a->max_steps) save_checkpoint(run, &m, &rk, &train, a->max_steps);
    if (lead && !run->sweeping && a->max_steps > run->start_step + 1)
    {
        int n = a->max_steps - run->start_step - 1;
        char mfu[32] = "";
        if (run->peak_flops > 0) snprintf(mfu, sizeof(mfu), ", MFU %.1f%%", 100.0 * flops_per_step * n / total_time / (run->peak_flops * std::min(run->P, run->ngpu)));
        printf("average %.1f ms per step, %.0f tok/s%s, %.1f ms per step in collectives (steps %d..%d)\n", total_time / n * 1e3,
               (double)BT * n / total_time, mfu, total_comm / n * 1e3, run->start_step + 2, a->max_steps);
        if (run->device == DEV_CUDA) {
            size_t free_b = 0, total_b = 0;
            if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
                printf("GPU 0 memory in use: %.2f GB of %.2f GB (all ranks on it, CUDA context included)\n", (total_b - free_b) / 1e9, total_b / 1e9);
        }
    }
    if (a->gen_tokens > 0 && !run->sweeping) print_sample(run, &m, &rk, a->max_steps);
    loader_free(&train);
    loader_free(&val);
    gpt_free(&m, &rk);
    rank_end(&rk);
}

// ----------------------------------------------------------------------------
// setup

// threads per rank and the communicators, for run->P ranks
static void ranks_setup(Run* run) {
    int cores = (int)std::max(1u, std::thread::hardware_concurrency());
    run->threads = run->args.threads ? run->args.threads : std::max(1, cores / run->P);
    comm_group_init(&run->group, run->P, run->args.timeout);
    // NCCL needs one GPU per rank; more ranks than GPUs share them through the shared-memory backend
    if (run->device == DEV_CUDA && run->P > 1 && run->P <= run->ngpu) {
        std::vector<int> gpus(run->P);
        for (int r = 0; r < run->P; r++) gpus[r] = r;
        comm_nccl_init_all(&run->group, gpus.data());
    }
}

// the memory one rank holds at TP=P, in bytes: parameters, then gradients + AdamW m and v, then activations
static void rank_memory(const GPTConfig* c, int P, int B, int T, double* params, double* grads_opt, double* acts) {
    ShardPlan s;
    shard_plan_init(&s, c, P, 0);
    long n = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) n += shard_local_size(&s.t[i]);
    *params = 4.0 * n;
    *grads_opt = 3 * 4.0 * n;
    *acts = 4.0 * acts_floats(c, &s, B, T);
}

static void run_setup(Run* run) {
    const Args* a = &run->args;
    bool embedded = a->train == nullptr;
    // the output directory: create it and make sure we can write there before training for hours
    if (a->outdir) {
        struct stat st;
        if (stat(a->outdir, &st) == 0 && !S_ISDIR(st.st_mode)) fatal("-o %s exists and is not a directory: give a directory for checkpoints", a->outdir);
        if (stat(a->outdir, &st) != 0 && mkdir(a->outdir, 0755) != 0)
            fatal("cannot create the output directory -o %s: %s", a->outdir, strerror(errno));
        std::string probe = std::string(a->outdir) + "/.tp_write_test";
        FILE* f = fopen(probe.c_str(), "wb");
        if (!f || fclose(f) != 0) fatal("cannot write to the output directory -o %s: %s", a->outdir, strerror(errno));
        remove(probe.c_str());
    }
    // the model: the latest checkpoint when resuming, else a checkpoint file, or a descriptor with a seeded initialization
    GPTConfig* c = &run->cfg;
    int V = a->vocab ? a->vocab : (embedded ? 256 : 50257);
    std::vector<int> saved = a->resume ? ckpt_steps(a->outdir) : std::vector<int>();
    if (a->resume && saved.empty()) printf("tp: -y 1 but no checkpoint in %s yet: starting from scratch\n", a->outdir);
    if (!saved.empty()) {
        std::string model = ckpt_path(a->outdir, "model", saved.back());
        gpt_load_checkpoint(model.c_str(), c, &run->init);
        GPTConfig want;
        if (a->model && gpt_descriptor(a->model, &want, c->V, c->maxT) &&
            (want.L != c->L || want.NH != c->NH || want.C != c->C || (a->vocab && a->vocab != c->V)))
            fatal("-e %s disagrees with the checkpoint in %s (%d layers, %d heads, %d channels, vocab %d): drop -e to resume it",
                  a->model, a->outdir, c->L, c->NH, c->C, c->V);
        resume_read(run, a->outdir, saved.back());
        run->resuming = true;
        run->start_step = (int)run->state.step;
        if (run->start_step >= a->max_steps)
            fatal("the checkpoint in %s is at step %d already: give -x larger than %d to train further", a->outdir, run->start_step, run->start_step);
        printf("tp: resuming from %s at step %d\n", model.c_str(), run->start_step);
    } else if (gpt_descriptor(a->model ? a->model : "L3C128H4", c, V, a->maxT)) {
        run->init.resize(gpt_num_params(c));
        gpt_init_full(c, (uint64_t)a->seed, run->init.data());
    } else {
        struct stat st;
        if (stat(a->model, &st) != 0)
            fatal("-e %s is neither a readable checkpoint file nor a descriptor (d1..d12, d24, d36, d48, or L<layers>C<channels>H<heads> like L4C128H4)", a->model);
        if (S_ISDIR(st.st_mode)) fatal("-e %s is a directory; give an llm.c model file (.bin) or a descriptor like d12", a->model);
        gpt_load_checkpoint(a->model, c, &run->init);
        if (a->vocab && a->vocab != c->V)
            fatal("--vocab %d disagrees with checkpoint %s (vocab %d): drop --vocab", a->vocab, a->model, c->V);
    }
    if (a->T > c->maxT) fatal("sequence length -t %d exceeds the model's maximum %d: use -t %d or less", a->T, c->maxT, c->maxT);
    if (a->outdir) {
        run->full_m.resize(run->init.size());
        run->full_v.resize(run->init.size());
    }
    // data: token files, or the embedded corpus, generated here (16 MB of train text, the same for any
    // flags, so that a resumed run sees the same data)
    if (embedded) {
        if (c->V < 256) fatal("the embedded corpus is byte-level and needs a vocab of at least 256, the model has %d", c->V);
        std::string text;
        grammar_generate(1, 16L << 20, &text, nullptr);
        run->corpus_train.assign(text.begin(), text.end());
        text.clear();
        grammar_generate(2, (size_t)a->val_batches * a->B * a->T + 1, &text, nullptr);
        run->corpus_val.assign(text.begin(), text.end());
        run->floor_nats = grammar_entropy_per_byte();
    }
    // sampling: the tokenizer and the prompt
    if (a->tokenizer) tokenizer_load(&run->tokenizer, a->tokenizer, c->V);
    if (a->prompt) {
        if (!run->tokenizer.pieces.empty() || c->V < 256)
            fatal("--prompt is byte-level text and needs a byte-level model (vocab 256); this model has vocab %d", c->V);
        for (const char* p = a->prompt; *p; p++) run->prompt.push_back((unsigned char)*p);
        if (run->prompt.empty()) fatal("--prompt is empty: give some text or drop the flag");
    } else {
        run->prompt.push_back(c->V <= 256 ? '\n' : (run->tokenizer.pieces.empty() ? c->V - 1 : run->tokenizer.eot));
    }
    // the device: CUDA when a GPU is visible (auto) or asked for, else the CPU
    int ngpu = 0;
    cudaError_t err = cudaGetDeviceCount(&ngpu);
    if (err != cudaSuccess) {
        ngpu = 0;
        cudaGetLastError();  // clear it: no driver or no device is an answer, not an error
    }
    if (a->device == DEV_CUDA && ngpu == 0)
        fatal("--device cuda but no CUDA GPU is visible (%s): use --device cpu", cudaGetErrorString(err));
    run->device = (a->device == DEV_CUDA || (a->device == -1 && ngpu > 0)) ? DEV_CUDA : DEV_CPU;
    run->ngpu = run->device == DEV_CUDA ? ngpu : 0;
    if (run->device == DEV_CUDA) {
        cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
            run->gpu_name = prop.name;
            // dense TF32 tensor-core peaks (the fp32 training here runs its matmuls in TF32)
            if (strstr(prop.name, "H100") || strstr(prop.name, "H200") || strstr(prop.name, "H800")) run->peak_flops = 494.7e12;
            else if (strstr(prop.name, "A100") || strstr(prop.name, "A800")) run->peak_flops = 156e12;
        }
    }
    // ranks: by default one per GPU, or one per core on the CPU: the largest valid degree that fits
    int cores = (int)std::max(1u, std::thread::hardware_concurrency());
    int units = run->device == DEV_CUDA ? ngpu : cores;
    run->P = a->tp;
    if (run->P == 0) {
        run->P = 1;
        for (int p = 1; p <= units; p++)
            if (tp_valid(c, p)) run->P = p;
    }
    if (!tp_valid(c, run->P))
        fatal("--tp %d does not divide the model (%d heads, padded vocab %d): valid --tp values are %s", run->P, c->NH, c->Vp,
              tp_valid_list(c).c_str());
    ranks_setup(run);
}

static void print_setup(const Run* run) {
    const GPTConfig* c = &run->cfg;
    const Args* a = &run->args;
    printf("tp: GPT-2 with %d layers, %d heads, %d channels, vocab %d (padded %d), max T %d: %.2fM parameters\n",
           c->L, c->NH, c->C, c->V, c->Vp, c->maxT, gpt_num_params(c) / 1e6);
    if (run->device == DEV_CUDA)
        printf("tp: %d rank%s on %d GPU%s (%s between ranks); batch %d x %d = %d tokens\n", run->P, run->P > 1 ? "s" : "",
               run->ngpu, run->ngpu > 1 ? "s" : "", run->P == 1 ? "no communication" : run->P <= run->ngpu ? "NCCL" : "shared GPU memory",
               a->B, a->T, a->B * a->T);
    else
        printf("tp: %d rank%s on the CPU, %d thread%s each; batch %d x %d = %d tokens\n", run->P, run->P > 1 ? "s" : "",
               run->threads, run->threads > 1 ? "s" : "", a->B, a->T, a->B * a->T);
    ShardPlan s;
    shard_plan_init(&s, c, run->P, 0);
    printf("shard plan (rank r of %d):\n", run->P);
    printf("  %-9s %-22s %-22s %s\n", "tensor", "full shape", "per-rank shape", "split");
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        const TensorShard* t = &s.t[i];
        char full[48], local[48];
        // (layers, rows, cols), without the layers for the non-layer tensors and the cols for vectors
        char nl[16] = "";
        if (t->nl > 1) snprintf(nl, sizeof(nl), "%d, ", t->nl);
        if (t->cols > 1) {
            snprintf(full, sizeof(full), "(%s%ld, %ld)", nl, t->rows, t->cols);
            snprintf(local, sizeof(local), "(%s%ld, %ld)", nl, t->lrows, t->lcols);
        } else {
            snprintf(full, sizeof(full), "(%s%ld)", nl, t->rows);
            snprintf(local, sizeof(local), "(%s%ld)", nl, t->lrows);
        }
        printf("  %-9s %-22s %-22s %s\n", t->name, full, local, t->how);
    }
    double mp, mg, ma, p1, g1, a1;
    rank_memory(c, run->P, a->B, a->T, &mp, &mg, &ma);
    rank_memory(c, 1, a->B, a->T, &p1, &g1, &a1);
    printf("memory per rank (MB)          TP=%-4d  TP=1\n", run->P);
    printf("  parameters              %9.1f %9.1f\n", mp / 1e6, p1 / 1e6);
    printf("  gradients + AdamW m, v  %9.1f %9.1f\n", mg / 1e6, g1 / 1e6);
    printf("  activations (B x T)     %9.1f %9.1f\n", ma / 1e6, a1 / 1e6);
    printf("  total                   %9.1f %9.1f\n", (mp + mg + ma) / 1e6, (p1 + g1 + a1) / 1e6);
    double per_step = (4.0 * c->L + 2) * a->B * a->T * c->C + 3.0 * a->B * a->T + 1;
    printf("communication per step: (4L+2)*B*T*C + 3*B*T + 1 = %.0f floats (%.2f MB) all-reduced by each rank\n",
           per_step, per_step * 4 / 1e6);
    if (run->floor_nats > 0)
        printf("data: the embedded corpus, %zu train and %zu val bytes of sentences from a probabilistic grammar;\n"
               "      its entropy is %.4f nats per byte: the loss floor no model can beat\n",
               run->corpus_train.size(), run->corpus_val.size(), run->floor_nats);
    fflush(stdout);
}

// --sweep: every valid P for a few steps on the same model and data; one table of the scaling
static void sweep(Run* run) {
    Args* a = &run->args;
    const GPTConfig* c = &run->cfg;
    a->max_steps = a->sweep_steps;
    a->val_every = 0;
    a->gen_tokens = 0;
    run->sweeping = true;
    int cores = (int)std::max(1u, std::thread::hardware_concurrency());
    printf("\nsweep: %d steps per P (the first 2 not timed), batch %d x %d, on the %s\n", a->sweep_steps, a->B, a->T,
           run->device == DEV_CUDA ? "GPU" : "CPU");
    printf("%4s %8s %10s %10s %8s %10s %8s %12s\n", "P", "threads", "ms/step", "tok/s", "speedup", "efficiency", "comm %", "MB per rank");
    FILE* csv = nullptr;
    if (a->outdir) {
        std::string path = std::string(a->outdir) + "/sweep.csv";
        csv = fopen(path.c_str(), "w");
        if (!csv) fatal("cannot write %s: %s", path.c_str(), strerror(errno));
        fprintf(csv, "P,threads_per_rank,ms_per_step,tok_per_s,speedup,efficiency,comm_share,mb_per_rank\n");
    }
    double base = 0;
    int units1 = 0;
    for (int P = 1; P <= c->NH && P <= COMM_MAXP; P++) {
        if (!tp_valid(c, P)) continue;
        run->P = P;
        ranks_setup(run);
        run->sweep_s = run->sweep_comm_s = 0;
        run->sweep_n = 0;
        std::vector<std::thread> threads;
        for (int r = 0; r < P; r++) threads.emplace_back(rank_main, run, r);
        for (auto& t : threads) t.join();
        double ms = run->sweep_s / run->sweep_n * 1e3, tps = a->B * a->T / (ms / 1e3);
        // efficiency: speedup over P=1 divided by the growth in compute units used (cores on the CPU,
        // GPUs on CUDA); on a CPU every P uses the same cores, so the ideal speedup there is 1
        int units = run->device == DEV_CUDA ? std::min(P, run->ngpu) : std::min(P * run->threads, cores);
        if (P == 1) { base = ms; units1 = units; }
        double speedup = base / ms, eff = speedup / ((double)units / units1), share = run->sweep_comm_s / run->sweep_s;
        double mp, mg, ma;
        rank_memory(c, P, a->B, a->T, &mp, &mg, &ma);
        double mb = (mp + mg + ma) / 1e6;
        printf("%4d %8d %10.1f %10.0f %8.2f %10.2f %8.1f %12.1f\n", P, run->threads, ms, tps, speedup, eff, 100 * share, mb);
        fflush(stdout);
        if (csv) fprintf(csv, "%d,%d,%.3f,%.1f,%.4f,%.4f,%.4f,%.2f\n", P, run->threads, ms, tps, speedup, eff, share, mb);
    }
    if (csv) fclose(csv);
}

static int tp_main(int argc, char** argv) {
    Run* run = new Run();
    parse_args(argc, argv, &run->args);
    run_setup(run);
    print_setup(run);
    struct sigaction sa = {};
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESETHAND;  // a second Ctrl-C stops at once
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    if (run->args.sweep) {
        sweep(run);
        delete run;
        return 0;
    }
    if (run->args.outdir) {
        // the per-step log; a resumed run appends to it
        std::string path = std::string(run->args.outdir) + "/log.csv";
        bool fresh = !run->resuming;
        run->log = fopen(path.c_str(), fresh ? "w" : "a");
        if (!run->log) fatal("cannot write %s: %s", path.c_str(), strerror(errno));
        if (fresh) fprintf(run->log, "step,loss,val_loss,lr,ms,tok_per_s,comm_ms,comm_bytes\n");
    }
    std::vector<std::thread> threads;
    for (int r = 0; r < run->P; r++) threads.emplace_back(rank_main, run, r);
    for (auto& t : threads) t.join();
    if (run->log) fclose(run->log);
    delete run;
    return 0;
}

#ifndef TESTING
int main(int argc, char** argv) { return tp_main(argc, argv); }
#endif
