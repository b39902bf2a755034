// tp.cu: main. The flags, the run setup, one thread per rank, the training loop and the sweep.
// The model and its tensor-parallel recipe are in gpt.cu, the collectives in comm.cuh, the ops in
// kernels_cpu.h (CPU) and kernels.cuh (CUDA); token files and the loader are in data/, checkpoints,
// sampling and the log in train/.
//
// The ranks form a grid: D data-parallel replicas of the model, each split over P tensor-parallel ranks.
// A process runs --dp replicas (D x P threads, thread (d, r) is TP rank r of local replica d); under
// mpirun every process runs as many, so the replicas are processes x --dp. A TP group never leaves its
// process; the DP group of TP rank r (rank r of every replica) may span processes.
//
//   make && ./tp                       train the default model on the embedded corpus
//   ./tp -e d12 -i 'train*.bin' -j val.bin --tp 4     GPT-2 124M over 4 ranks
//   mpirun -np 2 ./tp ... --tp 8       two machines of 8 GPUs: TP inside each, DP between them
#include <algorithm>
#include <atomic>
#include <climits>
#include <csignal>
#include <cstdarg>
#include <cstddef>
#include <dlfcn.h>
#include <sys/stat.h>
#include <thread>
#include "gpt.cu"
#include "data/grammar.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "train/checkpoint.h"
#include "train/logger.h"
#include "train/sampler.h"

// ----------------------------------------------------------------------------
// flags

#define MAX_FLAGS 48

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
    int max_steps;       // -x (0: no training, only a sample)
    int val_every;       // -v
    int val_batches;     // -m
    int sample_every;    // -s
    int gen_tokens;      // -g
    int ckpt_every;      // -n
    int resume;          // -y
    int tp;              // --tp (0: as many ranks as the device allows)
    int dp;              // --dp: data-parallel replicas in each process
    long total_batch;    // -d: tokens per optimizer step (0: one micro-batch of every replica)
    int zero;            // -z: ZeRO stage (0 or 1)
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
    int sp;              // --sp: sequence parallelism
    int recompute;       // -r: what the backward recomputes (0..3)
    int sweep;           // --sweep: time every valid (P, D) instead of training
    int sweep_steps;
    int fresh;           // --fresh 1: start over in an -o that holds another run's checkpoints
    bool given[MAX_FLAGS];  // which flags the command line gave, by index in g_flags
};

static void usage(FILE* out) {
    fprintf(out,
        "usage: ./tp [flags]        train GPT-2 with tensor parallelism over --tp ranks (one thread each), and\n"
        "                           data parallelism over --dp replicas in each process (mpirun: several)\n"
        "  every flag takes a value: -b 16, --tp 2 or --tp=2\n"
        "  -i PATTERN  train tokens: an llm.c token file or a glob of shards   (default: the embedded corpus)\n"
        "  -j PATTERN  val tokens                                               (default: the embedded corpus)\n"
        "  -e MODEL    llm.c fp32 checkpoint file, or a descriptor: d1..d12, d24, d36, d48, or\n"
        "              L<layers>C<channels>H<heads> such as L3C128H4             (default L3C128H4)\n"
        "  -o DIR      output directory for checkpoints and log.csv (created)   (default: none)\n"
        "  -b B        batch size (sequences) of each replica                   (default 8)\n"
        "  -t T        sequence length                                          (default 128)\n"
        "  -l LR       peak learning rate                                       (default 6e-3)\n"
        "  -u N        warmup steps                                             (default 100)\n"
        "  -q F        final learning rate as a fraction of -l, cosine decay    (default 0)\n"
        "  -c WD       weight decay of the matrices (AdamW, decoupled)          (default 0)\n"
        "  -x N        training steps (0: no training, print a sample and exit) (default 3500)\n"
        "  -v N        val loss every N steps, and at the last step (0: never)  (default 875)\n"
        "  -m N        val batches (at most the val data's)                     (default 50)\n"
        "  -s N        sample every N steps (0: only at the end)                (default 0)\n"
        "  -g N        tokens to generate per sample                            (default 256)\n"
        "  -n N        checkpoint every N steps with -o (0: only at the end)    (default 0)\n"
        "  -y 1        continue the run in -o DIR from its latest checkpoint, with its flags\n"
        "              (flags given again override them where that is safe; see the README)\n"
        "  --fresh 1   start a new run in an -o DIR that holds another run: deletes its checkpoints\n"
        "  --tp P      tensor-parallel ranks (0: one per core or GPU)          (default 0)\n"
        "  --dp D      data-parallel replicas in each process                   (default 1)\n"
        "  -d TOKENS   tokens per optimizer step, by gradient accumulation      (default 0: B x T x replicas)\n"
        "  -z Z        ZeRO stage: 1 splits AdamW's m and v over the replicas   (default 0)\n"
        "  --device D  auto, cpu or cuda                                        (default auto)\n"
        "  --beta1 B1  --beta2 B2     AdamW betas                               (default 0.9, 0.95)\n"
        "  --clip X    clip the global gradient norm at X (0: off)              (default 1)\n"
        "  --shuffle S 1: shuffled batches, 0: in order as llm.c's -x runs      (default 1)\n"
        "  --vocab V   vocab size for a descriptor model       (default: 256 for byte-level data and the\n"
        "              embedded corpus, else GPT-2's 50257)\n"
        "  --maxT N    maximum sequence length for a descriptor model           (default 1024)\n"
        "  --seed N    initialization seed                                      (default 1337)\n"
        "  --threads N CPU threads per rank (0: cores / ranks)                  (default 0)\n"
        "  --timeout S abort if a collective waits longer than S seconds       (default 600)\n"
        "  --keep K    keep the last K checkpoints in -o                        (default 3)\n"
        "  --sp S      1: sequence parallelism: each rank keeps its B*T/P tokens of the layernorms,\n"
        "              residuals and embedding (activation memory / P)            (default 0)\n"
        "  -r N        recompute in the backward instead of keeping: 0 nothing, 1 GELU, 2 also the\n"
        "              layernorms, 3 also the attention probabilities (same numbers) (default 0)\n"
        "  --sweep 1   time every valid P, and every (P, D) with P x D up to the cores or GPUs, and print a\n"
        "              scaling table (-o: sweep.csv)\n"
        "  --sweep-steps N  steps per P in the sweep, the first 2 not timed     (default 8)\n"
        "  --temperature X  sampling temperature (0: greedy)                   (default 0.8)\n"
        "  --topk K    sample from the K most likely tokens (0: all)            (default 0)\n"
        "  --sample-seed N  seed of the sampler                                 (default 42)\n"
        "  --prompt S  text to continue (byte-level or BPE tokenizer.json models) (default: a newline or EOT)\n"
        "  --tokenizer F  a BPE tokenizer.json (decodes samples, encodes --prompt, sets a new model's vocab)\n"
        "              or llm.c's gpt2_tokenizer.bin (decodes)   (default: a tokenizer.json next to -i,\n"
        "              next to -e, or in -o; else bytes or token ids)\n"
        "  --help      this text\n");
}

// What a resume (-y 1) does with a flag. The flags that make a run what it is are saved in its state
// files; a resume continues with them, and a flag given again either changes the run from here on (said
// in one line) or is refused, because it would make a different run rather than continue this one.
enum OnResume {
    NOT_SAVED,   // where and how the run executes (-o, --tp, --device, ...), or checked against the
                 // checkpoint itself (-e, --vocab, --maxT)
    MAY_CHANGE,  // saved; a value given on resume replaces it from the resumed step on
    MUST_KEEP,   // saved; a different value on resume is refused
};
enum FlagType { FLAG_STR, FLAG_PATH, FLAG_INT, FLAG_LONG, FLAG_FLOAT, FLAG_DOUBLE, FLAG_DEVICE };

struct FlagSpec {
    const char* name;
    FlagType type;
    size_t offset;         // of its field in Args
    double lo, hi;         // the range of a number
    OnResume resume;
    const char* keep_why;  // MUST_KEEP: why a resume cannot change it
};

#define ARG(field) offsetof(Args, field)
static const char* const BATCH_WHY = "the saved position in the train data counts sequences of this length";
static const FlagSpec g_flags[] = {
    {"-i", FLAG_PATH, ARG(train), 0, 0, MAY_CHANGE, nullptr},
    {"-j", FLAG_PATH, ARG(val), 0, 0, MAY_CHANGE, nullptr},
    {"-e", FLAG_STR, ARG(model), 0, 0, NOT_SAVED, nullptr},
    {"-o", FLAG_STR, ARG(outdir), 0, 0, NOT_SAVED, nullptr},
    {"-b", FLAG_INT, ARG(B), 1, 1 << 16, MAY_CHANGE, nullptr},  // with --dp and -d: the global batch must stay (loader_restore)
    {"-t", FLAG_INT, ARG(T), 1, 1 << 16, MUST_KEEP, BATCH_WHY},
    {"-l", FLAG_FLOAT, ARG(lr), 0, 10, MAY_CHANGE, nullptr},
    {"-u", FLAG_INT, ARG(warmup), 0, 1 << 30, MAY_CHANGE, nullptr},
    {"-q", FLAG_FLOAT, ARG(final_frac), 0, 1, MAY_CHANGE, nullptr},
    {"-c", FLAG_FLOAT, ARG(wd), 0, 10, MAY_CHANGE, nullptr},
    {"-x", FLAG_INT, ARG(max_steps), 0, 1 << 30, MAY_CHANGE, nullptr},
    {"-v", FLAG_INT, ARG(val_every), 0, 1 << 30, MAY_CHANGE, nullptr},
    {"-m", FLAG_INT, ARG(val_batches), 1, 1 << 20, MAY_CHANGE, nullptr},
    {"-s", FLAG_INT, ARG(sample_every), 0, 1 << 30, MAY_CHANGE, nullptr},
    {"-g", FLAG_INT, ARG(gen_tokens), 0, 1 << 20, MAY_CHANGE, nullptr},
    {"-n", FLAG_INT, ARG(ckpt_every), 0, 1 << 30, MAY_CHANGE, nullptr},
    {"-y", FLAG_INT, ARG(resume), 0, 1, NOT_SAVED, nullptr},
    {"--tp", FLAG_INT, ARG(tp), 0, COMM_MAXP, NOT_SAVED, nullptr},
    {"--dp", FLAG_INT, ARG(dp), 1, COMM_MAXP, NOT_SAVED, nullptr},
    {"-d", FLAG_LONG, ARG(total_batch), 0, (double)(1L << 50), MAY_CHANGE, nullptr},
    {"-z", FLAG_INT, ARG(zero), 0, 1, NOT_SAVED, nullptr},
    {"--device", FLAG_DEVICE, ARG(device), 0, 0, NOT_SAVED, nullptr},
    {"--beta1", FLAG_FLOAT, ARG(beta1), 0, 0.999999, MAY_CHANGE, nullptr},
    {"--beta2", FLAG_FLOAT, ARG(beta2), 0, 0.999999, MAY_CHANGE, nullptr},
    {"--clip", FLAG_FLOAT, ARG(clip), 0, 1e9, MAY_CHANGE, nullptr},
    {"--shuffle", FLAG_INT, ARG(shuffle), 0, 1, MUST_KEEP, "the saved order of the train data was drawn with it"},
    {"--vocab", FLAG_INT, ARG(vocab), 2, 1 << 20, NOT_SAVED, nullptr},
    {"--maxT", FLAG_INT, ARG(maxT), 1, 1 << 20, NOT_SAVED, nullptr},
    {"--seed", FLAG_LONG, ARG(seed), 0, (double)(1L << 62), MUST_KEEP, "it only sets the initial weights of a new run"},
    {"--threads", FLAG_INT, ARG(threads), 0, 1024, NOT_SAVED, nullptr},
    {"--timeout", FLAG_DOUBLE, ARG(timeout), 0.001, 1e7, NOT_SAVED, nullptr},
    {"--temperature", FLAG_FLOAT, ARG(temperature), 0, 100, MAY_CHANGE, nullptr},
    {"--topk", FLAG_INT, ARG(topk), 0, 1 << 24, MAY_CHANGE, nullptr},
    {"--sample-seed", FLAG_LONG, ARG(sample_seed), 0, (double)(1L << 62), MAY_CHANGE, nullptr},
    {"--prompt", FLAG_STR, ARG(prompt), 0, 0, MAY_CHANGE, nullptr},
    {"--tokenizer", FLAG_PATH, ARG(tokenizer), 0, 0, MAY_CHANGE, nullptr},
    {"--keep", FLAG_INT, ARG(keep), 1, 1 << 20, MAY_CHANGE, nullptr},
    {"--sp", FLAG_INT, ARG(sp), 0, 1, MAY_CHANGE, nullptr},
    {"-r", FLAG_INT, ARG(recompute), 0, 3, MAY_CHANGE, nullptr},
    {"--sweep", FLAG_INT, ARG(sweep), 0, 1, NOT_SAVED, nullptr},
    {"--sweep-steps", FLAG_INT, ARG(sweep_steps), 3, 1 << 20, NOT_SAVED, nullptr},
    {"--fresh", FLAG_INT, ARG(fresh), 0, 1, NOT_SAVED, nullptr},
};
#define NUM_FLAGS ((int)(sizeof(g_flags) / sizeof(g_flags[0])))
static_assert(NUM_FLAGS <= MAX_FLAGS, "Args::given is too small");

// A bad command line: one line on stderr saying what is wrong, one with a hint (the help by default), exit 1.
[[noreturn]] static void bad_flag_hint(const char* hint, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void bad_flag_hint(const char* hint, const char* fmt, ...) {
    fatal_begin();
    va_list ap;
    va_start(ap, fmt);
    fatal_prefix();
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n%s\n", hint);
    fatal_end();
}
#define bad_flag(...) bad_flag_hint("./tp --help lists the flags", __VA_ARGS__)

// the number of single-character edits that turn a into b, for "did you mean"
static int edit_distance(const char* a, const char* b) {
    size_t n = strlen(b);
    std::vector<int> row(n + 1);
    for (size_t j = 0; j <= n; j++) row[j] = (int)j;
    for (size_t i = 1; a[i - 1]; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= n; j++) {
            int up = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
            diag = up;
        }
    }
    return row[n];
}

static const FlagSpec* flag_find(const char* name) {
    for (const FlagSpec& f : g_flags)
        if (!strcmp(f.name, name)) return &f;
    return nullptr;
}

[[noreturn]] static void unknown_flag(const char* name) {
    const FlagSpec* best = nullptr;
    int best_d = 3;  // suggest only a near miss
    for (const FlagSpec& f : g_flags) {
        int d = edit_distance(name, f.name);
        if (d < best_d) { best_d = d; best = &f; }
    }
    char hint[96];
    snprintf(hint, sizeof(hint), "did you mean %s? (./tp --help lists the flags)", best ? best->name : "");
    bad_flag_hint(best ? hint : "./tp --help lists the flags", "unknown flag %s", name);
}

static long parse_int(const char* flag, const char* v, double lo, double hi) {
    char* end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0' || errno) bad_flag("flag %s takes an integer, not '%s'", flag, v);
    if (x < lo || x > hi) bad_flag("flag %s is %s, out of range [%.0f, %.0f]", flag, v, lo, hi);
    return x;
}

static double parse_float(const char* flag, const char* v, double lo, double hi) {
    char* end;
    errno = 0;
    double x = strtod(v, &end);
    if (*v == '\0' || *end != '\0' || errno || !std::isfinite(x)) bad_flag("flag %s takes a number, not '%s'", flag, v);
    if (x < lo || x > hi) bad_flag("flag %s is %s, out of range [%g, %g]", flag, v, lo, hi);
    return x;
}

// Sets flag f of a from the text v (checked; v must outlive a).
static void flag_set(Args* a, const FlagSpec* f, const char* v) {
    char* field = (char*)a + f->offset;
    switch (f->type) {
    case FLAG_STR:
    case FLAG_PATH: *(const char**)field = v; break;
    case FLAG_INT: *(int*)field = (int)parse_int(f->name, v, f->lo, f->hi); break;
    case FLAG_LONG: *(long*)field = parse_int(f->name, v, f->lo, f->hi); break;
    case FLAG_FLOAT: *(float*)field = (float)parse_float(f->name, v, f->lo, f->hi); break;
    case FLAG_DOUBLE: *(double*)field = parse_float(f->name, v, f->lo, f->hi); break;
    case FLAG_DEVICE:
        if (!strcmp(v, "auto")) *(int*)field = -1;
        else if (!strcmp(v, "cpu")) *(int*)field = DEV_CPU;
        else if (!strcmp(v, "cuda")) *(int*)field = DEV_CUDA;
        else bad_flag("flag %s takes auto, cpu or cuda, not '%s'", f->name, v);
        break;
    }
}

// Flag f's value as text: exact (paths made absolute, floats to every digit) for saving and comparing,
// else as a person would write it. An absent string is "".
static std::string flag_text(const Args* a, const FlagSpec* f, bool exact) {
    const char* field = (const char*)a + f->offset;
    char buf[64];
    switch (f->type) {
    case FLAG_STR:
    case FLAG_PATH: {
        const char* s = *(const char* const*)field;
        if (!s) return "";
        if (f->type == FLAG_STR || !exact || s[0] == '/') return s;
        char cwd[4096];
        return std::string(getcwd(cwd, sizeof(cwd)) ? cwd : ".") + "/" + s;
    }
    case FLAG_INT: snprintf(buf, sizeof(buf), "%d", *(const int*)field); break;
    case FLAG_LONG: snprintf(buf, sizeof(buf), "%ld", *(const long*)field); break;
    case FLAG_FLOAT: snprintf(buf, sizeof(buf), exact ? "%.9g" : "%g", *(const float*)field); break;
    case FLAG_DOUBLE: snprintf(buf, sizeof(buf), exact ? "%.17g" : "%g", *(const double*)field); break;
    case FLAG_DEVICE: return *(const int*)field == DEV_CPU ? "cpu" : *(const int*)field == DEV_CUDA ? "cuda" : "auto";
    }
    return buf;
}

// The flags a state file saves: "name\0value\0" for every saved flag that has a value.
static std::string args_saved(const Args* a) {
    std::string s;
    for (const FlagSpec& f : g_flags) {
        if (f.resume == NOT_SAVED) continue;
        std::string v = flag_text(a, &f, true);
        if ((f.type == FLAG_STR || f.type == FLAG_PATH) && v.empty()) continue;
        s += std::string(f.name) + '\0' + v + '\0';
    }
    return s;
}

// -y 1: the run's saved flags (from its newest state file) fill in every saved flag the command line did
// not give; one it gave with another value changes the run (MAY_CHANGE; returned as a list for the line
// that says so, empty if none) or is refused (MUST_KEEP).
static std::string args_resume(Args* a, const std::string& saved, const char* dir) {
    std::vector<std::pair<std::string, std::string>> kv;
    for (size_t p = 0; p < saved.size();) {
        size_t e1 = saved.find('\0', p), e2 = e1 == std::string::npos ? e1 : saved.find('\0', e1 + 1);
        if (e2 == std::string::npos) fatal("the saved flags in the newest state file of %s are corrupt", dir);
        kv.push_back({saved.substr(p, e1 - p), saved.substr(e1 + 1, e2 - e1 - 1)});
        p = e2 + 1;
    }
    std::string changed;
    for (int i = 0; i < NUM_FLAGS; i++) {
        const FlagSpec* f = &g_flags[i];
        if (f->resume == NOT_SAVED) continue;
        const std::string* was = nullptr;
        for (auto& p : kv)
            if (p.first == f->name) was = &p.second;
        if (!a->given[i]) {
            if (was) flag_set(a, f, strdup(was->c_str()));  // lives as long as the run
            else if (f->type == FLAG_STR || f->type == FLAG_PATH) *(const char**)((char*)a + f->offset) = nullptr;
            continue;
        }
        std::string now = flag_text(a, f, true);
        if (now == (was ? *was : std::string())) continue;
        if (f->offset == ARG(train) && !was)
            fatal("the run in %s trained on the embedded corpus: resume it without -i and -j, or start a new run in another -o", dir);
        Args old = *a;
        if (was) flag_set(&old, f, was->c_str());
        std::string old_text = was ? flag_text(&old, f, false) : "none";
        if (f->resume == MUST_KEEP)
            fatal("%s %s differs from the run in %s (%s %s): %s; drop %s to continue the run, or start a new one in another -o",
                  f->name, flag_text(a, f, false).c_str(), dir, f->name, old_text.c_str(), f->keep_why, f->name);
        if (f->offset == ARG(max_steps) && a->max_steps == 0) continue;  // -x 0: a sample, the run unchanged
        changed += std::string(changed.empty() ? " " : ", ") + f->name + " " + flag_text(a, f, false) + " (was " + old_text + ")";
    }
    return changed;
}

static void parse_args(int argc, char** argv, Args* a) {
    *a = Args{};
    // the defaults are the `make && ./tp` run: the L3C128H4 model on the embedded corpus, about 2.5 minutes
    // on 2 CPU cores (for GPT-2 sizes give -l, -u, -q and -x as llm.c does, e.g. -l 6e-4 -u 700 -q 0)
    a->B = 8; a->T = 128; a->lr = 6e-3f; a->warmup = 100; a->final_frac = 0.0f; a->wd = 0.0f;
    a->max_steps = 3500; a->val_every = 875; a->val_batches = 50; a->sample_every = 0; a->gen_tokens = 256;
    a->beta1 = 0.9f; a->beta2 = 0.95f; a->clip = 1.0f; a->shuffle = 1; a->maxT = 1024; a->seed = 1337;
    a->device = -1; a->timeout = 600; a->dp = 1;
    a->temperature = 0.8f; a->topk = 0; a->sample_seed = 42; a->keep = 3; a->sweep_steps = 8;
    for (int i = 1; i < argc; i++) {
        std::string name = argv[i];
        if (name == "--help" || name == "-h") {
            if (g_procs.me == 0) usage(stdout);
            comm_procs_finish();
            exit(0);
        }
        if (name.size() < 2 || name[0] != '-')
            bad_flag("unexpected argument '%s': values follow their flag, as in -i FILE", argv[i]);
        const char* v = nullptr;
        size_t eq = name.find('=');
        if (name.rfind("--", 0) == 0 && eq != std::string::npos) {  // --flag=value
            v = argv[i] + eq + 1;
            name.resize(eq);
        }
        const FlagSpec* f = flag_find(name.c_str());
        if (!f) unknown_flag(name.c_str());
        if (!v) {
            if (i + 1 >= argc) bad_flag("flag %s needs a value", f->name);
            v = argv[++i];
        }
        flag_set(a, f, v);
        a->given[f - g_flags] = true;
    }
    if (a->resume && !a->outdir) bad_flag("-y 1 continues the run in -o DIR: give -o");
    if (a->resume && a->fresh) bad_flag("-y 1 continues the run in -o, --fresh 1 deletes it: give one of them");
}

// -i and -j go together (checked after a resume has filled in the run's own)
static void check_data_flags(const Args* a) {
    if ((a->train == nullptr) != (a->val == nullptr))
        bad_flag("give both -i and -j (train and val data), or neither for the embedded corpus");
}

// ----------------------------------------------------------------------------
// the run: what the rank threads share

struct Run {
    Args args;
    GPTConfig cfg;
    int P;                        // tensor-parallel ranks per replica
    int D;                        // data-parallel replicas in this process (--dp)
    int Dg;                       // replicas in all processes: D x processes
    int accum;                    // micro-batches per optimizer step (-d)
    int device;                   // DEV_CPU or DEV_CUDA
    int threads;                  // OpenMP threads per rank (CPU)
    int ngpu;                     // CUDA devices visible to this process
    double peak_flops;            // dense TF32 peak of one GPU, for MFU (0: unknown)
    CommGroup* tp_groups;         // (D) the tensor-parallel group of each local replica: its P ranks
    CommGroup* dp_groups;         // (P) the data-parallel group of each TP rank r: rank r of every replica,
                                  // in every process (null with one replica)
    CommGroup* world;             // every rank of the run, in every process: the mean loss, the decision to
                                  // stop, weight checksums, barriers
    std::vector<float> init;      // the full initial parameters: each rank slices its shard out of them,
                                  // and later gathers its shard back into them to write a checkpoint
    std::vector<uint16_t> corpus_train, corpus_val;  // the embedded corpus, when no -i/-j
    double floor_nats;            // its entropy per byte, the loss floor (0 if unknown)
    std::vector<TokenShard> train_shards, val_shards;  // -i and -j, every token checked against the vocab
    bool data_bytes;              // every token of the data is below 256: byte-level
    int val_batches;              // -m, at most the batches the val data holds
    std::string vocab_from;       // where the vocab size came from, for the startup line
    std::string model_file;       // the checkpoint the weights come from (empty: drawn from --seed)
    Tokenizer tokenizer;
    std::vector<int> prompt;
    Checkpoints ckpt;             // -o DIR
    bool resuming;                // -y 1 found a checkpoint: start from it
    bool sample_only;             // -x 0, or -y 1 on a finished run: load, print a sample, exit
    int start_step;
    TrainState state;             // what the resume restores besides the weights
    Logger log;                   // -o DIR: DIR/log.csv
    bool stop_now;                // sampling (replica 0 alone): written by its rank 0 between two barriers
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

// the GPU of thread (d, r) of this process: the processes on one machine take consecutive blocks of its GPUs
static int rank_gpu(const Run* run, int d, int r) {
    return (g_procs.node_me * run->D * run->P + d * run->P + r) % run->ngpu;
}

// ----------------------------------------------------------------------------
// one rank

// what one rank thread works with: its rank (device, communicators), its shard of the model, its loaders,
// and its handle on the world group
struct RankRun {
    Rank rk;
    GPT m;
    DataLoader train, val;
    Comm world;
};

// A rank's thread begins here: TP rank r of local replica d on its device, its place in the data-parallel
// group, its shard of the initial model, its loaders (its replica's sequences).
static void rank_run_start(RankRun* rr, Run* run, int d, int r) {
    const Args* a = &run->args;
    rank_init(&rr->rk, &run->tp_groups[d], r, run->device, run->device == DEV_CUDA ? rank_gpu(run, d, r) : 0, run->threads);
    if (run->dp_groups) rank_join_dp(&rr->rk, &run->dp_groups[r], d);
    comm_init(&rr->world, run->world, d * run->P + r);
    gpt_build(&rr->m, &rr->rk, &run->cfg, run->init.data(), a->zero);
    rr->m.sp = a->sp;
    rr->m.recompute = a->recompute;
    rr->train = rr->val = DataLoader();
    if (run->sample_only) return;  // no data needed
    bool files = a->train != nullptr;
    int g = rr->rk.dp.rank;  // the replica, counted over all processes
    loader_init(&rr->train, "train", a->train, files ? nullptr : &run->corpus_train, a->B, a->T, run->cfg.V, a->shuffle,
                run->Dg, g, run->accum);
    loader_init(&rr->val, "val", a->val, files ? nullptr : &run->corpus_val, a->B, a->T, run->cfg.V, false, run->Dg, g, 1);
}

static void rank_run_end(RankRun* rr) {
    loader_free(&rr->train);
    loader_free(&rr->val);
    gpt_free(&rr->m, &rr->rk);
    rank_free(&rr->rk);
}

// what one training step measured on one rank
struct StepStats {
    float loss, norm, lr;
    bool stop;            // a rank of the run got SIGINT or SIGTERM: every rank stops after this step
    double seconds;       // the whole step
    double comm_seconds;  // of it, inside the TP group's collectives
    double comm_moved[COMM_KINDS];  // the payload of the rank's TP collectives, by kind (floats)
    double dp_seconds;    // inside the DP group's collectives
    double dp_moved[COMM_KINDS];    // the payload of its DP collectives, by kind
};

// the bytes a rank sends for a step's payload by kind, as a ring of P ranks sends them (comm_ring_bytes)
static double ring_bytes(const double moved[COMM_KINDS], int P, double sent[COMM_KINDS]) {
    double total = 0;
    for (int k = 0; k < COMM_KINDS; k++) total += sent[k] = comm_ring_bytes(k, moved[k], P);
    return total;
}

// A value every replica computed for itself (the same on the TP ranks of a replica), averaged over the
// replicas, and with it the decision to stop: one all-reduce over the world group. TP rank 0 of each
// replica contributes; the others add exact zeros, so the sum is the replicas' sum in replica order.
static float replicas_mean(Run* run, RankRun* rr, float value, bool* stop, const char* where) {
    float x[2] = {rr->rk.rank == 0 ? value : 0.0f, g_signal.load() != 0 ? 1.0f : 0.0f};
    comm_allreduce(&rr->world, x, 2, COMM_SUM, where, -1);
    if (stop) *stop = x[1] > 0;
    return x[0] / run->Dg;
}

// One training step of one rank: micro-steps of forward and backward on its replica's next micro-batches
// (the gradients accumulate), then the update, which averages the gradient over the replicas (gpt.cu).
static StepStats train_step(Run* run, RankRun* rr, int step) {
    const Args* a = &run->args;
    Rank* rk = &rr->rk;
    GPT* m = &rr->m;
    StepStats st;
    double t0 = now_s(), comm0 = rk->tp.seconds, dp0 = rk->dp.seconds, moved0[COMM_KINDS], dp_moved0[COMM_KINDS];
    for (int k = 0; k < COMM_KINDS; k++) {
        moved0[k] = rk->tp.moved[k];
        dp_moved0[k] = rk->dp.moved[k];
    }
    // each position's loss gradient is 1/(tokens in the global batch): the sum over micro-steps and
    // replicas is then the gradient of the mean loss over the global batch, as one rank would compute it
    m->dloss = 1.0f / (float)((long)a->B * a->T * run->accum * run->Dg);
    gpt_zero_grad(m, rk);
    double loss = 0.0;
    for (int k = 0; k < run->accum; k++) {
        loader_next(&rr->train);
        gpt_forward(m, rk, rr->train.inputs.data(), rr->train.targets.data(), a->B, a->T, true);
        gpt_backward(m, rk);
        if (k < run->accum - 1) loss += gpt_read_loss(m, rk);  // the next micro-step overwrites the losses
    }
    st.lr = lr_at(a, step);
    AdamW opt = {st.lr, a->beta1, a->beta2, 1e-8f, a->wd, a->clip};
    gpt_update(m, rk, &rk->tp, &opt);
    loss += gpt_read_loss(m, rk);
    st.norm = gpt_read_norm(m, rk);
    st.loss = replicas_mean(run, rr, (float)(loss / run->accum), &st.stop, "step loss");
    st.seconds = now_s() - t0;
    st.comm_seconds = rk->tp.seconds - comm0;
    st.dp_seconds = rk->dp.seconds - dp0;
    for (int k = 0; k < COMM_KINDS; k++) {
        st.comm_moved[k] = rk->tp.moved[k] - moved0[k];
        st.dp_moved[k] = rk->dp.moved[k] - dp_moved0[k];
    }
    if (!std::isfinite(st.loss) || !std::isfinite(st.norm))
        fatal("step %d: the loss (%f) or gradient norm (%f) is not finite; lower the learning rate (-l) or clip (--clip)",
              step + 1, st.loss, st.norm);
    return st;
}

// Ctrl-C / SIGTERM: the handler says at once what will happen and sets a flag; the ranks stop together
// at the next point where they all look at it (after a training step, between two val batches, between
// two sampled tokens), save when -o is set, and exit 0. A second signal kills at once.
// (the flag, g_signal in common/error.h, and the phase are lock-free atomics: safe in a signal handler and
// read without a race)
enum Phase { PHASE_STEP, PHASE_EVAL, PHASE_SAMPLE };
static std::atomic<int> g_phase{PHASE_STEP};
static char g_signal_msg[3][160];  // what the handler prints in each phase, written before it is installed

static void on_signal(int sig) {
    g_signal.store(sig);
    const char* msg = g_signal_msg[g_phase.load()];
    ssize_t ignored = write(STDOUT_FILENO, msg, strlen(msg));  // write and strlen are async-signal-safe
    (void)ignored;
}

static void signal_setup(const Run* run) {
    const char* then = run->args.outdir && !run->sample_only ? ", then saving" : "";
    if (g_procs.me != 0) then = nullptr;  // under mpirun process 0 says it, once
    for (int p = 0; p < 3 && then; p++) {
        const char* what[3] = {"after this step", "after this evaluation batch", "this sample"};
        snprintf(g_signal_msg[p], sizeof(g_signal_msg[0]), "\ntp: stopping %s%s (Ctrl-C again quits at once)\n", what[p], then);
    }
    struct sigaction sa = {};
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESETHAND;  // a second Ctrl-C stops at once
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
}

// Whether a signal asks the ranks to stop, the same answer on every rank of every process: every rank's
// flag summed over the world group (a rank deciding alone would leave the others waiting in the next
// collective). A training step carries the same question in its own world all-reduce (replicas_mean).
static bool stop_requested(RankRun* rr) {
    float x = g_signal.load() != 0 ? 1.0f : 0.0f;
    comm_allreduce(&rr->world, &x, 1, COMM_SUM, "signal check", -1);
    return x > 0;
}

// The same for the ranks of replica 0 alone, which sample while the other replicas wait: its rank 0 reads
// the flag between two barriers of its TP group and its ranks read the decision after the second.
static bool sample_stop_requested(Run* run, Rank* rk) {
    comm_barrier(&rk->tp, "signal check");
    if (rk->rank == 0) run->stop_now = g_signal.load() != 0;
    comm_barrier(&rk->tp, "signal check");
    return run->stop_now;
}

// mean loss over the first n val batches of every replica, the same on every rank; NaN when a signal cut
// it short
static float evaluate(Run* run, RankRun* rr, int n) {
    GPT* m = &rr->m;
    DataLoader* val = &rr->val;
    if (rr->rk.rank == 0) g_phase.store(PHASE_EVAL);
    loader_reset(val);
    double s = 0.0;
    for (int i = 0; i < n; i++) {
        if (stop_requested(rr)) return NAN;
        loader_next(val);
        gpt_forward(m, &rr->rk, val->inputs.data(), val->targets.data(), val->B, val->T, false);
        s += gpt_read_loss(m, &rr->rk);
    }
    if (rr->rk.rank == 0) g_phase.store(PHASE_STEP);
    return replicas_mean(run, rr, (float)(s / n), nullptr, "val loss");
}

// Replicas must hold bit-identical weights: every rank's checksum against replica 0's of the same TP
// rank, exchanged over the world group (world rank w is TP rank w % P of replica w / P). Returns how many
// ranks differ; every rank gets the same answer.
static int replicas_differ(Run* run, RankRun* rr, uint64_t* sum0) {
    uint64_t h = gpt_checksum(&rr->m, &rr->rk);
    int W = rr->world.P;
    std::vector<float> all(2L * W);
    float mine[2];
    memcpy(mine, &h, sizeof(h));
    comm_allgather(&rr->world, all.data(), mine, 2, "weight checksums", -1);
    int differ = 0;
    for (int w = 0; w < W; w++) differ += memcmp(&all[2L * w], &all[2L * (w % run->P)], sizeof(h)) != 0;
    memcpy(sum0, all.data(), sizeof(h));
    return differ;
}

// with several replicas: stops the run if they no longer hold the same weights (a bug, never expected)
static void check_replicas(Run* run, RankRun* rr, int step, char* note, size_t n) {
    note[0] = '\0';
    if (run->Dg == 1) return;
    uint64_t sum0;
    int differ = replicas_differ(run, rr, &sum0);
    if (differ)
        fatal("after step %d the weights of %d of the %d ranks differ from their replica 0's: the replicas diverged", step,
              differ, rr->world.P);
    snprintf(note, n, "%d replicas bit-identical (checksum %016llx)", run->Dg, (unsigned long long)sum0);
}

// every rank of replica 0 generates (they take part in the all-gathers); world rank 0 prints
static void print_sample(Run* run, RankRun* rr, int step) {
    const Args* a = &run->args;
    if (rr->rk.dp.rank != 0) return;  // the replicas hold the same weights: one generates
    if (rr->rk.rank == 0) g_phase.store(PHASE_SAMPLE);
    std::vector<int> out = generate(&rr->m, &rr->rk, run->prompt, a->gen_tokens, a->T, a->temperature, a->topk,
                                    (uint64_t)a->sample_seed, [&]() { return sample_stop_requested(run, &rr->rk); });
    if (rr->world.rank != 0) return;
    g_phase.store(PHASE_STEP);
    char from[600];
    if (step > 0 || run->model_file.empty()) snprintf(from, sizeof(from), "after %d steps", step);
    else snprintf(from, sizeof(from), "of %s", run->model_file.c_str());
    printf("sample %s (temperature %g%s):\n---\n", from, a->temperature, a->topk ? ", top-k" : "");
    print_tokens(out, &run->tokenizer, run->cfg.V, a->prompt);
    printf("\n---%s\n", (int)out.size() < a->gen_tokens ? " (interrupted)" : "");
    fflush(stdout);
}

// Ends a run stopped by a signal after `steps` steps: saves them when -o is set and they are not saved yet.
static void stop_run(Run* run, RankRun* rr, int steps, int last_saved) {
    const Args* a = &run->args;
    bool save = a->outdir && steps > last_saved && steps > 0;
    if (save) checkpoint_save(&run->ckpt, run->init.data(), &rr->m, &rr->rk, &rr->world, &rr->train, steps);
    if (rr->world.rank == 0) {
        if (a->outdir && steps > 0) printf("interrupted after step %d: saved in %s; continue with -y 1\n", steps, a->outdir);
        else if (a->outdir) printf("interrupted before the first step: nothing to save\n");
        else printf("interrupted after step %d (no -o, nothing saved)\n", steps);
        fflush(stdout);
    }
}

// " | comm 2.5 ms, 7.35 MB" for the step line: time in collectives and the bytes sent, with the kinds
// when there is more than one (sequence parallelism: reduce-scatter, all-gather, all-reduce)
static void comm_summary(char* out, size_t n, double seconds, const double sent[COMM_KINDS]) {
    double total = 0;
    int kinds = 0;
    for (int k = 0; k < COMM_KINDS; k++) {
        total += sent[k];
        kinds += sent[k] > 0;
    }
    int w = snprintf(out, n, " | comm %.1f ms, %.2f MB", seconds * 1e3, total / 1e6);
    if (kinds < 2) return;
    const char* abbrev[COMM_KINDS] = {"AR", "RS", "AG", "BC"};
    for (int k = 0, first = 1; k < COMM_KINDS && w < (int)n; k++)
        if (sent[k] > 0) {
            w += snprintf(out + w, n - w, "%s%s %.2f", first ? " (" : ", ", abbrev[k], sent[k] / 1e6);
            first = 0;
        }
    if (w < (int)n) snprintf(out + w, n - w, ")");
}

// the GPUs all processes use, for MFU
static int gpus_in_use(const Run* run) { return std::min(run->P * run->D, run->ngpu) * g_procs.n; }

static void rank_main(Run* run, int d, int r) {
    const Args* a = &run->args;
    RankRun rr;
    rank_run_start(&rr, run, d, r);
    Rank* rk = &rr.rk;
    GPT* m = &rr.m;
    if (run->sample_only) {  // -x 0, or a finished run: the sample is all there is to do (replica 0's)
        comm_barrier(&rr.world, "start");
        if (a->gen_tokens > 0) print_sample(run, &rr, run->start_step);
        rank_run_end(&rr);
        return;
    }
    if (run->resuming) {
        gpt_scatter_moments(m, rk, run->state.m.data(), m->m_mem);
        gpt_scatter_moments(m, rk, run->state.v.data(), m->v_mem);
        m->t = (int)run->state.h.adam_t;
        loader_restore(&rr.train, &run->state);
    }
    comm_barrier(&rr.world, "start");
    bool lead = rr.world.rank == 0;
    double tokens = (double)a->B * a->T * run->accum * run->Dg;  // per step, all replicas
    double total_time = 0.0, total_comm = 0.0, total_dp = 0.0;
    int last_saved = run->resuming ? run->start_step : -1;
    // model FLOPs of one step: 6 per parameter per token (forward + backward) plus attention's 12 L T C
    const GPTConfig* c = &run->cfg;
    double flops_per_step = (6.0 * gpt_num_params(c) + 12.0 * c->L * a->T * c->C) * tokens;
    for (int step = run->start_step; step < a->max_steps; step++) {
        bool last = step == a->max_steps - 1;
        float vl = NAN;
        if (a->val_every > 0 && (step % a->val_every == 0 || last)) {
            vl = evaluate(run, &rr, run->val_batches);
            if (std::isnan(vl)) {  // a signal cut the evaluation short: stop before this step
                stop_run(run, &rr, step, last_saved);
                rank_run_end(&rr);
                return;
            }
            char note[96];
            check_replicas(run, &rr, step, note, sizeof(note));
            if (lead) {
                const char* bar = note[0] ? "  | " : "";
                if (run->floor_nats > 0) printf("val loss %.6f  (floor %.4f, %.1f%% above)%s%s\n", vl, run->floor_nats, 100.0 * (vl / run->floor_nats - 1.0), bar, note);
                else printf("val loss %.6f%s%s\n", vl, bar, note);
                fflush(stdout);
            }
        }
        if (a->sample_every > 0 && step > 0 && step % a->sample_every == 0) print_sample(run, &rr, step);
        StepStats st = train_step(run, &rr, step);
        if (step > run->start_step) {  // the first step warms up caches and allocations
            total_time += st.seconds;
            total_comm += st.comm_seconds;
            total_dp += st.dp_seconds;
        }
        // the bytes this rank sent, by kind, as a ring sends them: over its TP group, and over its DP group
        double sent[COMM_KINDS], dp_sent[COMM_KINDS];
        ring_bytes(st.comm_moved, run->P, sent);
        double dp_total = ring_bytes(st.dp_moved, run->Dg, dp_sent);
        if (lead) logger_step(&run->log, step + 1, st.loss, vl, st.lr, st.seconds, tokens, st.comm_seconds, sent, st.dp_seconds, dp_total);
        if (lead && (print_step(a, step) || step == run->start_step)) {
            char mfu[32] = "", comm[128] = "", dp[48] = "";
            if (run->peak_flops > 0) snprintf(mfu, sizeof(mfu), " | MFU %.1f%%", 100.0 * flops_per_step / st.seconds / (run->peak_flops * gpus_in_use(run)));
            if (run->P > 1) comm_summary(comm, sizeof(comm), st.comm_seconds, sent);
            if (run->Dg > 1) snprintf(dp, sizeof(dp), " | dp %.1f ms, %.2f MB", st.dp_seconds * 1e3, dp_total / 1e6);
            printf("step %4d/%d | loss %.6f | lr %.2e | norm %.4f | %.1f ms | %.0f tok/s%s%s%s\n", step + 1, a->max_steps, st.loss,
                   st.lr, st.norm, st.seconds * 1e3, tokens / st.seconds, mfu, comm, dp);
            fflush(stdout);
        }
        if (a->outdir && a->ckpt_every > 0 && (step + 1) % a->ckpt_every == 0) {
            checkpoint_save(&run->ckpt, run->init.data(), m, rk, &rr.world, &rr.train, step + 1);
            last_saved = step + 1;
        }
        // a signal: every rank stops after the same step (the step's world all-reduce carried every rank's flag)
        if (st.stop) {
            stop_run(run, &rr, step + 1, last_saved);
            rank_run_end(&rr);
            return;
        }
    }
    if (a->outdir && last_saved != a->max_steps) checkpoint_save(&run->ckpt, run->init.data(), m, rk, &rr.world, &rr.train, a->max_steps);
    char note[96];
    check_replicas(run, &rr, a->max_steps, note, sizeof(note));
    if (lead && a->max_steps > run->start_step + 1) {
        int n = a->max_steps - run->start_step - 1;
        char mfu[32] = "", comm[64] = "", dp[64] = "";
        if (run->peak_flops > 0) snprintf(mfu, sizeof(mfu), ", MFU %.1f%%", 100.0 * flops_per_step * n / total_time / (run->peak_flops * gpus_in_use(run)));
        if (run->P > 1) snprintf(comm, sizeof(comm), ", %.1f ms per step in collectives", total_comm / n * 1e3);
        if (run->Dg > 1) snprintf(dp, sizeof(dp), ", %.1f ms in DP collectives", total_dp / n * 1e3);
        printf("average %.1f ms per step, %.0f tok/s%s%s%s (steps %d..%d)\n", total_time / n * 1e3, tokens * n / total_time, mfu, comm,
               dp, run->start_step + 2, a->max_steps);
        if (run->device == DEV_CUDA) {
            size_t free_b = 0, total_b = 0;
            if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
                printf("GPU 0 memory in use: %.2f GB of %.2f GB (all ranks on it, CUDA context included)\n", (total_b - free_b) / 1e9, total_b / 1e9);
        }
        if (run->Dg > 1) printf("after the last step: %s\n", note);
    }
    if (a->gen_tokens > 0) print_sample(run, &rr, a->max_steps);
    rank_run_end(&rr);
}

// ----------------------------------------------------------------------------
// setup

// The communicator groups of the grid for run->P ranks x run->D local replicas, and the threads per rank.
// Every process creates its groups in the same order (the spanning ones make MPI communicators).
static void ranks_setup(Run* run) {
    int cores = (int)std::max(1u, std::thread::hardware_concurrency());
    int ranks = run->P * run->D;
    run->threads = run->args.threads ? run->args.threads : std::max(1, cores / (ranks * g_procs.node_n));
    double timeout = run->args.timeout;
    run->tp_groups = new CommGroup[run->D];
    for (int d = 0; d < run->D; d++) {
        comm_group_init(&run->tp_groups[d], run->P, timeout);
        // NCCL needs one GPU per rank; more ranks than GPUs share them through the shared-memory backend
        std::vector<int> gpus(run->P);
        bool distinct = run->device == DEV_CUDA && run->P > 1 && run->P <= run->ngpu;
        for (int r = 0; r < run->P && distinct; r++) {
            gpus[r] = rank_gpu(run, d, r);
            for (int q = 0; q < r; q++) distinct &= gpus[q] != gpus[r];
        }
        if (distinct) comm_nccl_init_all(&run->tp_groups[d], gpus.data());
    }
    run->dp_groups = nullptr;
    if (run->Dg > 1) {
        run->dp_groups = new CommGroup[run->P];
        for (int r = 0; r < run->P; r++) {
            CommGroup* g = &run->dp_groups[r];
            comm_group_init(g, run->D, timeout);
            comm_group_span(g);
            if (run->device != DEV_CUDA) continue;
            std::vector<int> gpus(run->D);
            bool distinct = true;
            for (int d = 0; d < run->D; d++) {
                gpus[d] = rank_gpu(run, d, r);
                for (int q = 0; q < d; q++) distinct &= gpus[q] != gpus[d];
            }
#ifdef TP_MPI
            if (g->nproc > 1) {  // across processes only NCCL (it checks that the GPUs are distinct)
                comm_nccl_init_procs(g, gpus.data());
                continue;
            }
#endif
            if (distinct && run->D > 1) comm_nccl_init_all(g, gpus.data());
        }
    }
    run->world = new CommGroup;
    comm_group_init(run->world, ranks, timeout);
    comm_group_span(run->world);
}

// releases what ranks_setup made, in the same order on every process
static void ranks_teardown(Run* run) {
    for (int r = 0; run->dp_groups && r < run->P; r++) comm_group_free(&run->dp_groups[r]);
    comm_group_free(run->world);
    delete[] run->tp_groups;
    delete[] run->dp_groups;
    delete run->world;
    run->tp_groups = run->dp_groups = run->world = nullptr;
}

// The memory one rank holds with P TP ranks, D replicas and ZeRO stage zero, in bytes: parameters,
// gradients, AdamW's m and v, activations (one micro-batch of B x T; with --sp and -r as given:
// sp_splits decides whether the batch splits at this P)
struct RankMemory {
    double params, grads, moments, acts;
};
static RankMemory rank_memory(const GPTConfig* c, int P, int D, int zero, int B, int T, bool sp, int recompute) {
    ShardPlan s;
    shard_plan_init(&s, c, P, 0);
    long n = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) n += shard_local_size(&s.t[i]);
    long npad = zero ? (n + 32L * D - 1) / (32L * D) * (32L * D) : n;  // as gpt_build pads the shard
    RankMemory mem;
    mem.params = 4.0 * npad;
    mem.grads = 4.0 * npad;
    mem.moments = 2 * 4.0 * (zero ? npad / D : n);
    mem.acts = 4.0 * acts_floats(c, &s, B, T, sp_splits(sp, P, B, T), recompute);
    return mem;
}
static double memory_total(const RankMemory* m) { return m->params + m->grads + m->moments + m->acts; }

// The payload of one step's DP collectives for one rank, by kind (as comm.cuh counts it): the all-reduce
// of its shard of the gradient, N floats; with ZeRO-1 the reduce-scatter of the padded shard N' and the
// all-gather of the updated parameters N', plus the all-reduce of the two squared norms. None with one
// replica.
static void dp_step_floats(const GPTConfig* c, int P, int D, int zero, double out[COMM_KINDS]) {
    for (int k = 0; k < COMM_KINDS; k++) out[k] = 0;
    if (D == 1) return;
    double shard = rank_memory(c, P, D, zero, 1, 1, false, 0).params / 4;
    if (!zero) out[KIND_ALLREDUCE] = shard;
    else {
        out[KIND_REDUCESCATTER] = out[KIND_ALLGATHER] = shard;
        out[KIND_ALLREDUCE] = 2;
    }
}

// ----------------------------------------------------------------------------
// the memory check: before anything big is allocated, what the run will hold against what the machine
// has free, so that a run that cannot fit is refused in a second with the numbers and the flags that
// help, instead of being killed by the kernel a minute later with no message

// a number in a file (a cgroup limit or usage); -1 when it is missing or says "max"
static double read_number(const char* path) {
    FILE* f = fopen(path, "r");
    if (!f) return -1;
    double x = -1;
    if (fscanf(f, "%lf", &x) != 1) x = -1;
    fclose(f);
    return x;
}

// The host memory this process can still take: MemAvailable (what the kernel can hand out without
// swapping), or less where a cgroup (a container's limit) allows less. -1: unknown.
static double host_free_bytes() {
    double avail = -1;
    FILE* f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        long kb;
        while (fgets(line, sizeof(line), f))
            if (sscanf(line, "MemAvailable: %ld kB", &kb) == 1) avail = kb * 1024.0;
        fclose(f);
    }
    const char* cgroups[2][2] = {{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
                                 {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"}};
    for (auto& cg : cgroups) {
        double limit = read_number(cg[0]), used = read_number(cg[1]);
        if (limit > 0 && used >= 0 && (avail < 0 || limit - used < avail)) avail = limit - used;
    }
    return avail;
}

// The estimate against measurement (peak resident memory, 2 ranks on the CPU unless said): a tiny model
// on token files 232 MB (the CUDA, cuBLAS and NCCL libraries, OpenMP, the loaders), and beyond that the
// memory table's totals plus the host copies agree within 1%: L3C128H4 B64 T256 1151 MB measured against
// 892 MB estimated + the process; d6 B16 T256 1495 against 1254; d12 B8 T512 6508 against 6194; d12 B4
// T256 at 4 ranks 3321 against 3059. So: the process, plus the estimate with 2% to spare.
#define PROCESS_BYTES 256e6
#define ESTIMATE_MARGIN 1.02
// What a GPU needs besides the ranks' buffers: the CUDA context, cuBLAS workspaces, NCCL's buffers.
// Not measured here (no GPU yet): a round allowance.
#define CUDA_CONTEXT_BYTES 1e9

// The estimate of a run at P ranks x D local replicas, in bytes.
struct MemoryEstimate {
    double rank;     // what one rank holds: the memory table's total
    double acts;     // of it, the activations
    double host;     // the process and the host's own full copies of the model
    double cpu;      // all of it together, for ranks on the CPU
};

static MemoryEstimate memory_estimate(const Run* run, int P, int D) {
    const Args* a = &run->args;
    const GPTConfig* c = &run->cfg;
    int B = run->sample_only ? 1 : a->B;  // sampling runs one sequence at a time
    RankMemory rm = rank_memory(c, P, run->Dg / run->D * D, a->zero, B, a->T, a->sp, a->recompute);
    double full = 4.0 * gpt_num_params(c);
    // the host's own copies: the full weights (initial or loaded, and gathered into for checkpoints),
    // AdamW's full m and v to save checkpoints and from a resumed state file, the embedded corpus
    double host = full;
    if (a->outdir && !run->sample_only) host += 2 * full;
    if (run->resuming && !run->sample_only) host += 2 * full;
    if (!a->train && !run->sample_only) host += 3.0 * (16L << 20);  // 16 MB of text, then as uint16
    MemoryEstimate e;
    e.rank = memory_total(&rm);
    e.acts = rm.acts;
    e.host = PROCESS_BYTES + ESTIMATE_MARGIN * host;
    e.cpu = e.host + ESTIMATE_MARGIN * P * D * e.rank;
    return e;
}

// Whether the run fits at P ranks x D local replicas; if not, *why is the one line that says so: what is
// needed, what is free, and which flags lower it.
static bool memory_fits(const Run* run, int P, int D, std::string* why) {
    const Args* a = &run->args;
    int B = run->sample_only ? 1 : a->B;
    MemoryEstimate e = memory_estimate(run, P, D);
    P *= D;  // the ranks of this process
    double rank = e.rank, ma = e.acts, host = e.host;
    const char* lower = "lower -b or -t (the activations grow with B x T)";
    char line[1024];
    if (run->device == DEV_CPU) {
        double need = e.cpu, avail = host_free_bytes();
        if (avail < 0 || need <= avail) return true;
        snprintf(line, sizeof(line),
                 "this run needs about %.1f GB of memory but %.1f GB is free: %d rank%s x %.2f GB (activations %.2f GB for -b %d -t %d; "
                 "weights, gradients and AdamW state %.2f GB) and %.2f GB for the process and its full copies of the model; %s, or "
                 "choose a smaller model with -e (on one CPU --tp does not help: its ranks share the same memory)",
                 need / 1e9, avail / 1e9, P, P > 1 ? "s" : "", rank / 1e9, ma / 1e9, B, a->T, (rank - ma) / 1e9, host / 1e9, lower);
        *why = line;
        return false;
    }
    // on CUDA, rank r runs on GPU r % ngpu: GPU 0 holds the most ranks
    int per_gpu = (P + run->ngpu - 1) / run->ngpu;
    double need = CUDA_CONTEXT_BYTES + ESTIMATE_MARGIN * per_gpu * rank;
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(0) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess && need > (double)free_b) {
        char more[160] = "";
        if (P < run->ngpu) snprintf(more, sizeof(more), ", spread the model over more GPUs with --tp (this machine has %d)", run->ngpu);
        else if (per_gpu > 1) snprintf(more, sizeof(more), ", use one rank per GPU (--tp %d)", run->ngpu);
        snprintf(line, sizeof(line),
                 "this run needs about %.1f GB on GPU 0 but %.1f GB of its %.1f GB is free: %d rank%s x %.2f GB (activations %.2f GB for "
                 "-b %d -t %d; weights, gradients and AdamW state %.2f GB) and %.1f GB for the CUDA context; %s%s, or choose a smaller model with -e",
                 need / 1e9, free_b / 1e9, total_b / 1e9, per_gpu, per_gpu > 1 ? "s" : "", rank / 1e9, ma / 1e9, B, a->T, (rank - ma) / 1e9,
                 CUDA_CONTEXT_BYTES / 1e9, lower, more);
        *why = line;
        return false;
    }
    cudaGetLastError();
    double avail = host_free_bytes();
    if (avail >= 0 && host > avail) {
        snprintf(line, sizeof(line), "this run needs about %.1f GB of host memory for its full copies of the model but %.1f GB is free: "
                 "choose a smaller model with -e", host / 1e9, avail / 1e9);
        *why = line;
        return false;
    }
    return true;
}

// ----------------------------------------------------------------------------
// the run's pieces, in the order run_setup takes them

// `mkdir -p`: -o a/b/c creates a and a/b as well
static void make_dirs(const char* path) {
    std::string p = path;
    for (size_t i = 1; i <= p.size(); i++) {
        if (i < p.size() && p[i] != '/') continue;
        std::string part = p.substr(0, i);
        struct stat st;
        if (stat(part.c_str(), &st) == 0) {
            if (!S_ISDIR(st.st_mode)) fatal("-o %s: %s exists and is not a directory: give a directory for checkpoints", path, part.c_str());
        } else if (mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
            fatal("cannot create the output directory -o %s (%s): %s", path, part.c_str(), strerror(errno));
        }
    }
}

// The output directory: created, writable, and not holding another run's checkpoints unless this run
// continues it (-y 1) or was told to start over (--fresh 1). Returns the steps saved there.
static std::vector<int> outdir_setup(const Args* a) {
    make_dirs(a->outdir);
    std::string probe = std::string(a->outdir) + "/.tp_write_test";
    FILE* f = fopen(probe.c_str(), "wb");
    if (!f || fclose(f) != 0) fatal("cannot write to the output directory -o %s: %s", a->outdir, strerror(errno));
    remove(probe.c_str());
    std::vector<int> saved = ckpt_steps(a->outdir);
    bool trains = !a->sweep && a->max_steps > 0;
    if (saved.empty() || a->resume || !trains) return saved;
    if (!a->fresh)
        fatal("-o %s holds the checkpoints of another run (steps %d to %d): continue it with -y 1, choose another -o, "
              "or add --fresh 1 to delete them and start over", a->outdir, saved.front(), saved.back());
    int n = ckpt_remove_all(a->outdir);
    remove((std::string(a->outdir) + "/log.csv").c_str());
    printf("tp: --fresh 1: deleted the %d checkpoint%s and log.csv of the earlier run in %s\n", n, n > 1 ? "s" : "", a->outdir);
    return {};
}

// -e against the run's checkpoint on a resume: a model given must have its shape
static void resume_model_check(const Args* a, const GPTConfig* c) {
    GPTConfig want = *c;
    bool shaped = a->model && (gpt_descriptor(a->model, &want, c->V, c->maxT) ||
                               (access(a->model, R_OK) == 0 && (model_read(a->model, &want, nullptr), true)));
    if ((shaped && (want.L != c->L || want.NH != c->NH || want.C != c->C || want.V != c->V)) || (a->vocab && a->vocab != c->V) ||
        (a->given[flag_find("--maxT") - g_flags] && a->maxT != c->maxT))
        fatal("%s disagrees with the checkpoint in %s (%d layers, %d heads, %d channels, vocab %d, max T %d): drop it to resume",
              a->model ? "-e" : a->vocab ? "--vocab" : "--maxT", a->outdir, c->L, c->NH, c->C, c->V, c->maxT);
}

// Reads every token of -i and -j once: the largest id sets the vocab of a descriptor model given no
// --vocab (byte-level data: 256, else GPT-2's 50257), and must be below the model's vocab, so a bad id
// anywhere stops the run before its first step. Also caps the val batches at what the val data holds.
static void data_setup(Run* run, bool descriptor) {
    const Args* a = &run->args;
    long replica_tokens = (long)a->B * a->T * run->Dg;  // a val batch of every replica; a train step is accum of them
    run->train_shards = token_files(a->train, "train", replica_tokens * run->accum + 1);
    run->val_shards = token_files(a->val, "val", replica_tokens + 1);
    int max_id = -1;
    long val_samples = 0;
    for (auto* shards : {&run->train_shards, &run->val_shards})
        for (TokenShard& s : *shards) {
            token_shard_scan(&s, shards == &run->train_shards ? "train" : "val");
            max_id = std::max(max_id, s.max_id);
            if (shards == &run->val_shards) val_samples += (s.ntok - 1) / replica_tokens;
        }
    run->data_bytes = max_id < 256;
    run->val_batches = (int)std::min((long)a->val_batches, val_samples);
    GPTConfig* c = &run->cfg;
    Tokenizer* tk = &run->tokenizer;
    if (tk->bpe && run->data_bytes && tk->from != "--tokenizer") *tk = Tokenizer();  // found next to byte-level data: not its tokenizer
    if (descriptor && !a->vocab) {
        bool from_tk = tk->bpe || (!tk->pieces.empty() && !run->data_bytes);  // a tokenizer file's vocab, unless bytes
        c->V = from_tk ? (int)tk->pieces.size() : run->data_bytes ? 256 : 50257;
        c->Vp = round_up(c->V, 128);
        char from[512];
        if (from_tk) snprintf(from, sizeof(from), "from tokenizer %s, %s", tk->path.c_str(), tk->from.c_str());
        else if (run->data_bytes) snprintf(from, sizeof(from), "byte-level data: every token id is below 256");
        else snprintf(from, sizeof(from), "GPT-2's: the data's largest token id is %d", max_id);
        run->vocab_from = from;
    }
    for (auto* shards : {&run->train_shards, &run->val_shards})
        for (const TokenShard& s : *shards) {
            if (s.max_id < c->V) continue;
            char fix[600];
            if (!tk->pieces.empty() && (int)tk->pieces.size() == c->V)
                snprintf(fix, sizeof(fix), "the data was not made with tokenizer %s (%s, vocab %d): give the tokenizer "
                         "prepare.py wrote with it (--tokenizer FILE)", tk->path.c_str(), tk->from.c_str(), c->V);
            else if (!descriptor) snprintf(fix, sizeof(fix), "this model cannot read it; train a new one on this data (-e with a descriptor such as L3C128H4)");
            else snprintf(fix, sizeof(fix), "give --vocab %d or more%s", s.max_id + 1, a->vocab ? " (or drop --vocab: tp then sizes it from the data)" : "");
            fatal("%s data %s holds token id %d at token %ld, but the model's vocab has %d tokens: %s",
                  shards == &run->train_shards ? "train" : "val", s.path.c_str(), s.max_id, s.max_pos, c->V, fix);
        }
}

// The CUDA devices to use (0: the CPU). No GPU, or no NVIDIA driver at all, is an answer, not an error;
// a driver that is there but cannot be used (older than this build needs, a device that is busy or
// broken) gets one line before --device auto falls back to the CPU.
static int device_setup(Run* run) {
    const Args* a = &run->args;
    int ngpu = 0;
    cudaError_t err = cudaGetDeviceCount(&ngpu);
    if (err != cudaSuccess) {
        ngpu = 0;
        cudaGetLastError();
    }
    void* driver = dlopen("libcuda.so.1", RTLD_LAZY);
    if (driver) dlclose(driver);
    bool unusable = err != cudaSuccess && err != cudaErrorNoDevice && driver;
    if (a->device == DEV_CUDA && ngpu == 0)
        fatal("--device cuda but no CUDA GPU can be used (%s): use --device cpu",
              driver ? cudaGetErrorString(err) : "no NVIDIA driver is installed: libcuda.so.1 is not found");
    if (a->device == -1 && unusable)
        printf("tp: a CUDA driver is installed but cannot be used (%s): running on the CPU\n", cudaGetErrorString(err));
    run->device = (a->device == DEV_CUDA || (a->device == -1 && ngpu > 0)) ? DEV_CUDA : DEV_CPU;
    run->ngpu = run->device == DEV_CUDA ? ngpu : 0;
    if (run->device == DEV_CUDA) {
        cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
            // dense TF32 tensor-core peaks (the fp32 training here runs its matmuls in TF32)
            if (strstr(prop.name, "H100") || strstr(prop.name, "H200") || strstr(prop.name, "H800")) run->peak_flops = 494.7e12;
            else if (strstr(prop.name, "A100") || strstr(prop.name, "A800")) run->peak_flops = 156e12;
        }
    }
    return ngpu;
}

// The tokenizer: --tokenizer FILE, else a tokenizer.json found next to -i, next to -e or in -o
// (tokenizer_find). Every process reads it, as a BPE tokenizer sets a new model's vocab; process 0 keeps
// a copy in -o as tokenizer.json, so the run folder samples and exports on its own.
static void tokenizer_setup(Run* run, bool first) {
    const Args* a = &run->args;
    Tokenizer* tk = &run->tokenizer;
    std::string where = "--tokenizer";
    std::string path = a->tokenizer ? a->tokenizer : tokenizer_find(a->train, run->model_file.empty() ? a->model : run->model_file.c_str(), a->outdir, &where);
    if (path.empty()) return;
    tokenizer_read(tk, path.c_str());
    tk->from = where;
    if (first && a->outdir && tk->bpe && !run->sample_only) tokenizer_copy(path, a->outdir);
}

// The prompt of the samples: --prompt encoded by a BPE tokenizer.json, or as bytes, which a byte-level
// model reads; else the tokenizer's end-of-text token, a newline for a byte-level model.
static void prompt_setup(Run* run) {
    const Args* a = &run->args;
    const GPTConfig* c = &run->cfg;
    const Tokenizer* tk = &run->tokenizer;
    bool gpt2_tokens = !tk->pieces.empty() && !tokenizer_is_bytes(tk);
    bool bytes = !gpt2_tokens && (c->V <= 256 || run->data_bytes);
    if (tk->bpe) {  // a tokenizer.json: the prompt in its BPE tokens, by default its end-of-text token
        if (!a->prompt) run->prompt = tk->eot >= 0 ? std::vector<int>{tk->eot} : bpe_encode(&tk->merges, "\n");
        else run->prompt = bpe_encode(&tk->merges, a->prompt);
        if (run->prompt.empty()) fatal("--prompt is empty: give some text or drop the flag");
        return;
    }
    if (!a->prompt) {
        run->prompt.push_back(bytes ? '\n' : tk->pieces.empty() ? c->V - 1 : tk->eot);
        return;
    }
    if (gpt2_tokens)
        fatal("--prompt is text, and tokenizer %s (llm.c's format) only decodes: give the model's BPE tokenizer.json with "
              "--tokenizer (Hugging Face's GPT-2 has one; prepare.py --vocab N writes one), or drop --prompt", tk->path.c_str());
    if (!bytes)
        fatal("--prompt is text that tp encodes as bytes, which needs a byte-level model (vocab 256); this model has vocab %d: "
              "drop --prompt, or train on byte-level data (tp then picks vocab 256)", c->V);
    for (const char* p = a->prompt; *p; p++) {
        if ((unsigned char)*p >= c->V) fatal("--prompt holds byte %d, beyond this model's vocab of %d", (unsigned char)*p, c->V);
        run->prompt.push_back((unsigned char)*p);
    }
    if (run->prompt.empty()) fatal("--prompt is empty: give some text or drop the flag");
}

// The data-parallel side of the grid: replicas in this process and in all, and the micro-steps of -d.
static void grid_setup(Run* run) {
    const Args* a = &run->args;
    run->D = a->dp;
    run->Dg = a->dp * g_procs.n;
    long micro_tokens = (long)a->B * a->T * run->Dg;  // one micro-batch of every replica
    run->accum = 1;
    if (a->total_batch && a->total_batch % micro_tokens != 0)
        fatal("-d %ld is not a multiple of the tokens one micro-step of all replicas takes (-b %d x -t %d x %d replica%s = %ld): "
              "give -d %ld, %ld, ...", a->total_batch, a->B, a->T, run->Dg, run->Dg > 1 ? "s" : "", micro_tokens, micro_tokens,
              2 * micro_tokens);
    if (a->total_batch) run->accum = (int)std::min(a->total_batch / micro_tokens, 1L << 30);
}

// Under mpirun process 0 reads the checkpoints (its -o may be on its machine alone) and every process
// receives what they say: whether the run resumes and from which step, the model's shape, and the saved
// flags, which every process then applies as process 0 does.
static void resume_bcast(Run* run, int64_t* resume_step) {
    if (g_procs.n == 1) return;
    double timeout = run->args.timeout;
    comm_procs_bcast(resume_step, sizeof(*resume_step), timeout);
    if (*resume_step < 0) return;
    comm_procs_bcast(&run->cfg, sizeof(run->cfg), timeout);
    int64_t n = (int64_t)run->state.flags.size();
    comm_procs_bcast(&run->state.h, sizeof(run->state.h), timeout);
    comm_procs_bcast(&n, sizeof(n), timeout);
    run->state.flags.resize(n);
    comm_procs_bcast(&run->state.flags[0], n, timeout);
}

static void run_setup(Run* run) {
    Args* a = &run->args;
    GPTConfig* c = &run->cfg;
    bool first = g_procs.me == 0;  // process 0: the output directory, the checkpoints, the model file, the messages
    // the output directory; a resume reads the run's shape and flags from its newest checkpoint
    std::vector<int> saved = a->outdir && first ? outdir_setup(a) : std::vector<int>();
    std::string& model_file = run->model_file;
    if (first && a->resume && saved.empty()) printf("tp: -y 1 but no checkpoint in %s yet: starting a new run there\n", a->outdir);
    int64_t resume_step = -1;
    if (first && a->resume && !saved.empty()) {
        model_file = ckpt_path(a->outdir, "model", saved.back());
        model_read(model_file.c_str(), c, nullptr);
        state_read(a->outdir, saved.back(), gpt_num_params(c), false, &run->state);
        resume_step = saved.back();
    }
    resume_bcast(run, &resume_step);
    if (resume_step >= 0) {
        std::string changed;
        if (run->state.flags.empty()) {
            if (first) printf("tp: the state file in %s is from an older tp that did not save the run's flags: using the flags given\n", a->outdir);
        } else {
            changed = args_resume(a, run->state.flags, a->outdir);
        }
        if (first) resume_model_check(a, c);
        run->resuming = true;
        run->start_step = (int)run->state.h.step;
        run->vocab_from = "the checkpoint's";
        if (a->max_steps > 0 && run->start_step > a->max_steps)
            fatal("the run in %s is at step %d already: give -x larger than %d to train further, or -x 0 to sample from it",
                  a->outdir, run->start_step, run->start_step);
        if (first && a->max_steps > run->start_step) printf("tp: resuming from %s at step %d\n", model_file.c_str(), run->start_step);
        if (first && !changed.empty())
            printf("tp: %s with changed flags:%s\n", a->max_steps > run->start_step ? "continuing" : "sampling", changed.c_str());
    }
    check_data_flags(a);
    run->sample_only = a->max_steps == 0 || (run->resuming && run->start_step == a->max_steps);
    if (run->sample_only && a->gen_tokens == 0) fatal("-x 0 prints a sample and trains nothing, but -g 0 asks for no tokens: give -g N");
    if (a->sweep && g_procs.n > 1) fatal("--sweep times replicas inside one process (--dp): start it without mpirun");
    grid_setup(run);
    if (run->resuming && !run->sample_only) global_batch_check(&run->state.h, a->B, a->T, run->Dg, run->accum);
    // the model's shape (process 0 reads a model file's header; the others receive it below); its tensors
    // are read or drawn after the memory check
    bool descriptor = false;
    if (!run->resuming) {
        std::string why;
        const char* model = a->model ? a->model : "L3C128H4";
        descriptor = gpt_descriptor(model, c, a->vocab ? a->vocab : 256, a->maxT, &why);
        if (descriptor) {
            if (a->vocab) run->vocab_from = "from --vocab";
            else if (!a->train) run->vocab_from = "the embedded corpus is byte-level";
        } else if (first) {
            struct stat st;
            if (!why.empty() && stat(model, &st) != 0) fatal("-e %s: %s", model, why.c_str());
            if (stat(model, &st) != 0)
                fatal("-e %s is neither a readable checkpoint file nor a descriptor (d1..d12, d24, d36, d48, or L<layers>C<channels>H<heads> like L4C128H4)", model);
            if (S_ISDIR(st.st_mode)) fatal("-e %s is a directory; give an llm.c model file (.bin) or a descriptor like d12", model);
            model_read(model, c, nullptr);
            model_file = model;
            run->vocab_from = "the checkpoint's";
            if (a->vocab && a->vocab != c->V)
                fatal("--vocab %d disagrees with checkpoint %s (vocab %d): drop --vocab", a->vocab, model, c->V);
        }
    }
    tokenizer_setup(run, first);
    comm_procs_bcast(c, sizeof(*c), a->timeout);  // a model file's shape, from process 0
    // the data: token files read through once (the vocab of a descriptor follows them), or the embedded corpus
    bool embedded = a->train == nullptr;
    if (!run->sample_only && !embedded) data_setup(run, descriptor);
    if (!run->sample_only && embedded) {
        if (c->V < 256) fatal("the embedded corpus is byte-level and needs a vocab of at least 256, the model has %d", c->V);
        run->data_bytes = true;
        run->val_batches = a->val_batches;
    }
    comm_procs_bcast(c, sizeof(*c), a->timeout);  // and process 0's vocab: every process builds the same model
    if (a->T > c->maxT) fatal("sequence length -t %d exceeds the model's maximum %d: use -t %d or less", a->T, c->maxT, c->maxT);
    // the device and the ranks: by default as many per replica as the GPUs, or cores, of this process's
    // share of the machine allow (the largest valid P with P x --dp of them)
    int ngpu = device_setup(run);
    int cores = (int)std::max(1u, std::thread::hardware_concurrency());
    int units = std::max(1, (run->device == DEV_CUDA ? ngpu : cores) / g_procs.node_n);
    run->P = a->tp;
    if (run->P == 0) {
        run->P = 1;
        for (int p = 1; p * run->D <= units; p++)
            if (tp_valid(c, p)) run->P = p;
    }
    if (!tp_valid(c, run->P))
        fatal("--tp %d does not divide the model (%d heads, padded vocab %d): valid --tp values are %s", run->P, c->NH, c->Vp,
              tp_valid_list(c).c_str());
    if (a->sp && run->P > 1 && ((long)a->B * a->T) % run->P != 0)
        fatal("--sp 1 splits the %ld tokens of a batch (-b %d x -t %d) over the ranks, and %d ranks do not divide them: "
              "choose -b and -t with B*T a multiple of %d, or use --sp 0", (long)a->B * a->T, a->B, a->T, run->P, run->P);
    if (run->P * run->D > COMM_MAXP)
        fatal("--tp %d x --dp %d makes %d ranks in one process, more than the %d it can run: use fewer local replicas, and "
              "more processes (mpirun) for more", run->P, run->D, run->P * run->D, COMM_MAXP);
    std::string why;
    if (!memory_fits(run, run->P, run->D, &why)) fatal("%s", why.c_str());
    // now the big allocations: the weights, the resumed optimizer state (process 0 reads them, the others
    // receive them), the corpus
    if (first && !model_file.empty()) {
        model_read(model_file.c_str(), c, &run->init);
    } else {
        run->init.resize(gpt_num_params(c));
        if (first) gpt_init_full(c, (uint64_t)a->seed, run->init.data());
    }
    comm_procs_bcast(run->init.data(), run->init.size() * sizeof(float), a->timeout);
    if (run->resuming && !run->sample_only) {
        if (first) state_read(a->outdir, saved.back(), (long)run->init.size(), true, &run->state);
        if (g_procs.n > 1) state_bcast(&run->state, a->timeout);
    }
    if (a->outdir && !run->sample_only) {
        run->ckpt.dir = a->outdir;
        run->ckpt.keep = a->keep;
        run->ckpt.flags = args_saved(a);
        if (first) {  // world rank 0, which writes the checkpoints, runs in process 0
            run->ckpt.m.resize(run->init.size());
            run->ckpt.v.resize(run->init.size());
        }
    }
    // the embedded corpus, generated here (16 MB of train text, the same for any flags, so that a resumed
    // run sees the same data; the val text grows with the val batches of all replicas)
    if (!run->sample_only && embedded) {
        std::string text;
        grammar_generate(1, 16L << 20, &text, nullptr);
        run->corpus_train.assign(text.begin(), text.end());
        text.clear();
        grammar_generate(2, (size_t)a->val_batches * a->B * a->T * run->Dg + 1, &text, nullptr);
        run->corpus_val.assign(text.begin(), text.end());
        run->floor_nats = grammar_entropy_per_byte();
    }
    // sampling: the tokenizer and the prompt (replica 0 samples, and it runs in process 0)
    if (first && !run->tokenizer.path.empty()) tokenizer_check(&run->tokenizer, c->V);
    if (first) prompt_setup(run);
    ranks_setup(run);
}

// The memory table: per rank, for this run's settings, for TP alone (no --sp, no -r, no ZeRO) and for
// TP=1, each column shown once; then the per-layer activation formula of this run, which is what
// acts_layout allocates (the tests hold the two to each other).
static void print_memory(const Run* run) {
    const GPTConfig* c = &run->cfg;
    const Args* a = &run->args;
    int zd = a->zero && run->Dg > 1 ? run->Dg : 1;  // the replicas ZeRO-1 splits AdamW's state over (1: none)
    struct { int P, sp, r, zd; } want[3] = {{run->P, a->sp, a->recompute, zd}, {run->P, 0, 0, 1}, {1, 0, 0, 1}}, cols[3];
    int ncols = 0;
    for (auto& w : want) {
        bool same = false;  // a column that allocates exactly what an earlier one does is left out
        for (int k = 0; k < ncols; k++)
            same |= cols[k].P == w.P && sp_splits(cols[k].sp, cols[k].P, a->B, a->T) == sp_splits(w.sp, w.P, a->B, a->T) &&
                    cols[k].r == w.r && cols[k].zd == w.zd;
        if (!same) cols[ncols++] = {w.P, w.sp, w.r, w.zd};
    }
    double mem[3][5];
    printf("memory per rank (MB)    ");
    for (int k = 0; k < ncols; k++) {
        char name[40];
        int n = snprintf(name, sizeof(name), "TP=%d", cols[k].P);
        if (sp_splits(cols[k].sp, cols[k].P, a->B, a->T)) n += snprintf(name + n, sizeof(name) - n, " SP");
        if (cols[k].r) n += snprintf(name + n, sizeof(name) - n, " -r %d", cols[k].r);
        if (cols[k].zd > 1) snprintf(name + n, sizeof(name) - n, " ZeRO-1");
        printf(" %11s", name);
        RankMemory m = rank_memory(c, cols[k].P, cols[k].zd, cols[k].zd > 1, a->B, a->T, cols[k].sp, cols[k].r);
        double row[5] = {m.params, m.grads, m.moments, m.acts, memory_total(&m)};
        for (int i = 0; i < 5; i++) mem[k][i] = row[i];
    }
    const char* rows[] = {"parameters", "gradients", "AdamW m, v", "activations (B x T)", "total"};
    for (int i = 0; i < 5; i++) {
        printf("\n  %-22s", rows[i]);
        for (int k = 0; k < ncols; k++) printf(" %11.1f", mem[k][i] / 1e6);
        if (i == 2 && zd > 1) printf("   (ZeRO-1: each of the %d replicas keeps 1/%d)", zd, zd);
    }
    printf("\n");
    // the formula: per layer, the token-wise buffers (residuals, layernorm outputs and statistics) hold N
    // tokens, the rank's heads' buffers (qkv, attention, MLP) B*T tokens over P ranks
    int r = a->recompute;
    bool split = sp_splits(a->sp, run->P, a->B, a->T);
    ShardPlan s;
    shard_plan_init(&s, c, run->P, 0);
    double per_layer = 4.0 * acts_floats_per_layer(c, &s, a->B, a->T, split, r);
    double total = 4.0 * acts_floats(c, &s, a->B, a->T, split, r);
    printf("  activations per layer: N*(%dC + 4) + B*T*%dC/P%s floats, N = %s tokens per rank: %.2f MB x %d layers,\n"
           "  plus %.2f MB outside the layers\n", r >= 2 ? 2 : 4, r >= 1 ? 8 : 12, r >= 3 ? "" : " + B*NH*T*T/P",
           split ? "B*T/P" : "B*T", per_layer / 1e6, c->L, (total - c->L * per_layer) / 1e6);
}

// The DP group's part of the communication: once per step, whatever the micro-steps.
static void print_dp_communication(const Run* run) {
    if (run->Dg == 1) return;
    const Args* a = &run->args;
    double f[COMM_KINDS], sent[COMM_KINDS];
    dp_step_floats(&run->cfg, run->P, run->Dg, a->zero, f);
    double mb = ring_bytes(f, run->Dg, sent) / 1e6;
    if (!a->zero)
        printf("communication over each DP group (%d replicas), once per step: all-reduce of the rank's shard of the gradient,\n"
               "  N = %.0f floats; each rank sends %.2f MB, as a ring does (2(D-1)/D of the data)\n", run->Dg, f[KIND_ALLREDUCE], mb);
    else
        printf("communication over each DP group (%d replicas), once per step (ZeRO-1): reduce-scatter of the rank's padded\n"
               "  shard of the gradient and all-gather of its parameters, N' = %.0f floats each, and all-reduce of 2 (the\n"
               "  norm); each rank sends %.2f MB, as a ring does ((D-1)/D of each), as much as the all-reduce\n",
               run->Dg, f[KIND_REDUCESCATTER], mb);
}

// What a training step's collectives carry (step_comm_floats, dp_step_floats) and what each rank sends for
// it on a ring, over its TP group and over its DP group.
static void print_communication(const Run* run) {
    const GPTConfig* c = &run->cfg;
    const Args* a = &run->args;
    bool split = sp_splits(a->sp, run->P, a->B, a->T);
    int A = run->accum;
    double f[COMM_KINDS], tp_only[COMM_KINDS], sent = 0, sent_tp = 0;
    step_comm_floats(c, a->B, a->T, split, A, f);
    step_comm_floats(c, a->B, a->T, false, A, tp_only);
    for (int k = 0; k < COMM_KINDS; k++) {
        sent += comm_ring_bytes(k, f[k], run->P);
        sent_tp += comm_ring_bytes(k, tp_only[k], run->P);
    }
    char micro[64] = "", times[8] = "";  // with -d: A micro-batches per step
    if (A > 1) {
        snprintf(micro, sizeof(micro), " (A = %d micro-steps)", A);
        snprintf(times, sizeof(times), "A*");
    }
    if (run->P == 1)
        printf("communication: none%s (one rank)\n", run->Dg > 1 ? " inside a replica" : "");
    else if (!split) {
        printf("communication per step%s: all-reduce of %s%s(4L+2)*B*T*C + 3*B*T%s + 1 = %.0f floats;\n", micro, times, A > 1 ? "(" : "",
               A > 1 ? ")" : "", f[KIND_ALLREDUCE]);
        printf("  each rank sends %.2f MB, as a ring does (2(P-1)/P of an all-reduce's data)\n", sent / 1e6);
    } else {
        printf("communication per step%s: reduce-scatter %s(4L+2)*B*T*C = %.0f, all-gather %s(6L+2)*B*T*C = %.0f and\n"
               "  all-reduce %s3*B*T + 1 + T*C + 4*L*C + 2*C = %.0f floats; each rank sends %.2f MB, as a ring does\n"
               "  ((P-1)/P of a reduce-scatter's or all-gather's data, 2(P-1)/P of an all-reduce's); TP alone sends %.2f MB\n",
               micro, times, f[KIND_REDUCESCATTER], times, f[KIND_ALLGATHER], times, f[KIND_ALLREDUCE], sent / 1e6, sent_tp / 1e6);
    }
    print_dp_communication(run);
}

// the data line: what each split's pattern matched, its tokens and samples
static void print_split(const Run* run, const char* what, const char* pattern, const std::vector<TokenShard>& shards) {
    const Args* a = &run->args;
    bool train = !strcmp(what, "train");
    int G = run->Dg * (train ? run->accum : 1);  // a sample: B x T sequences of every replica (and micro-step)
    long tokens = 0, samples = 0;
    for (const TokenShard& s : shards) {
        tokens += s.ntok;
        samples += (s.ntok - 1) / ((long)a->B * a->T * G);
    }
    char shape[64], tail[192];
    if (G > 1) snprintf(shape, sizeof(shape), "%d x %d x %d", G, a->B, a->T);
    else snprintf(shape, sizeof(shape), "%d x %d", a->B, a->T);
    if (train) snprintf(tail, sizeof(tail), "%ld samples of %s per epoch", samples, shape);
    else snprintf(tail, sizeof(tail), "%ld samples of %s; an evaluation averages %d of them (-m %d)", samples, shape,
                  run->val_batches, a->val_batches);
    if (shards.size() == 1 && shards[0].path == pattern) {
        printf("data: %-5s %s: %ld tokens, %s\n", what, pattern, tokens, tail);
        return;
    }
    printf("data: %-5s '%s' matched %zu files: %ld tokens, %s\n", what, pattern, shards.size(), tokens, tail);
    for (size_t i = 0; i < shards.size(); i++) {
        if (i == 6 && shards.size() > 8) {
            printf("             ... and %zu more\n", shards.size() - 6);
            break;
        }
        printf("             %s: %ld tokens\n", shards[i].path.c_str(), shards[i].ntok);
    }
}

// "replica 2-3" or "replica 0"
static std::string span_text(const char* what, int lo, int hi) {
    char b[64];
    if (hi > lo) snprintf(b, sizeof(b), "%ss %d-%d", what, lo, hi);
    else snprintf(b, sizeof(b), "%s %d", what, lo);
    return b;
}

// The grid, when there are several replicas: processes x local replicas x TP ranks, where each process
// runs, which device each rank of a process uses, how the groups talk, the batch of a step.
static void print_grid(const Run* run) {
    const Args* a = &run->args;
    int P = run->P, D = run->D, N = g_procs.n;
    const char* tp_link = P == 1 ? "no communication" : run->device != DEV_CUDA ? "shared memory"
                        : run->tp_groups[0].nccl[0] ? "NCCL" : "shared GPU memory";
    const char* dp_link = run->device == DEV_CUDA ? (run->dp_groups[0].nccl[0] ? "NCCL" : "shared GPU memory")
                        : N > 1 ? (D > 1 ? "shared memory in a process, MPI between processes" : "MPI") : "shared memory";
    printf("tp: grid of %d process%s x %d replica%s x %d TP rank%s: %d data-parallel replicas of the model, each split over "
           "%d tensor-parallel rank%s; TP groups: %s, DP groups: %s\n", N, N > 1 ? "es" : "", D, D > 1 ? "s" : "", P,
           P > 1 ? "s" : "", run->Dg, P, P > 1 ? "s" : "", tp_link, dp_link);
    for (int p = 0; p < N; p++)
        printf("tp:   process %d (%s, pid %d): %s, world ranks %d-%d\n", p, g_procs.hosts[p].c_str(), g_procs.pids[p],
               span_text("replica", p * D, p * D + D - 1).c_str(), p * D * P, (p + 1) * D * P - 1);
    for (int d = 0; d < D; d++) {
        std::string where = run->device == DEV_CUDA ? "GPUs" : "the CPU";
        for (int r = 0; r < P && run->device == DEV_CUDA; r++) where += (r ? ", " : " ") + std::to_string(rank_gpu(run, d, r));
        printf("tp:   local replica %d of %s: %s on %s\n", d, N > 1 ? "each process" : "the process",
               span_text("TP rank", 0, P - 1).c_str(), where.c_str());
    }
    printf("tp: %d thread%s per rank; batch %d x %d per replica and micro-step, x %d replicas x %d micro-step%s = %ld tokens per step\n",
           run->threads, run->threads > 1 ? "s" : "", a->B, a->T, run->Dg, run->accum, run->accum > 1 ? "s" : "",
           (long)a->B * a->T * run->Dg * run->accum);
}

// The startup lines (process 0 prints them): the model, the grid and which rank runs where, the shard
// plan, the memory per rank and the communication per step, the data.
static void print_setup(const Run* run) {
    if (g_procs.me != 0) return;
    const GPTConfig* c = &run->cfg;
    const Args* a = &run->args;
    char from[128] = "";
    if (!run->vocab_from.empty()) snprintf(from, sizeof(from), "; %s", run->vocab_from.c_str());
    printf("tp: GPT-2 with %d layers, %d heads, %d channels, vocab %d (padded %d%s), max T %d: %.2fM parameters\n",
           c->L, c->NH, c->C, c->V, c->Vp, from, c->maxT, gpt_num_params(c) / 1e6);
    char batch[96];
    if (run->accum > 1)
        snprintf(batch, sizeof(batch), "batch %d x %d, x %d micro-steps = %ld tokens per step", a->B, a->T, run->accum,
                 (long)a->B * a->T * run->accum);
    else snprintf(batch, sizeof(batch), "batch %d x %d = %d tokens", a->B, a->T, a->B * a->T);
    if (run->Dg > 1)
        print_grid(run);
    else if (run->device == DEV_CUDA && run->P == 1)
        printf("tp: 1 rank on 1 GPU; %s\n", batch);
    else if (run->device == DEV_CUDA)
        printf("tp: %d ranks on %d GPU%s (%s between ranks); %s\n", run->P, run->ngpu, run->ngpu > 1 ? "s" : "",
               run->tp_groups[0].nccl[0] ? "NCCL" : "shared GPU memory", batch);
    else if (run->P == 1)
        printf("tp: 1 rank on the CPU with %d thread%s; %s\n", run->threads, run->threads > 1 ? "s" : "", batch);
    else
        printf("tp: %d ranks on the CPU, %d thread%s each; %s\n", run->P, run->threads, run->threads > 1 ? "s" : "", batch);
    if (run->sample_only) {
        if (a->max_steps == 0) printf("tp: no training (-x 0): a sample of %d tokens\n", a->gen_tokens);
        else printf("tp: the run in %s is finished (step %d of %d): a sample of %d tokens (give -x larger than %d to train further)\n",
                    a->outdir, run->start_step, a->max_steps, a->gen_tokens, a->max_steps);
        fflush(stdout);
        return;
    }
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
    print_memory(run);
    print_communication(run);
    if (run->floor_nats > 0)
        printf("data: the embedded corpus, %zu train and %zu val bytes of sentences from a probabilistic grammar;\n"
               "      its entropy is %.4f nats per byte: the loss floor no model can beat\n",
               run->corpus_train.size(), run->corpus_val.size(), run->floor_nats);
    if (!run->train_shards.empty()) {
        print_split(run, "train", a->train, run->train_shards);
        print_split(run, "val", a->val, run->val_shards);
        // the same file in both splits: the val loss would measure text the model trains on
        for (const TokenShard& t : run->train_shards)
            for (const TokenShard& v : run->val_shards) {
                char rt[PATH_MAX], rv[PATH_MAX];
                if (realpath(t.path.c_str(), rt) && realpath(v.path.c_str(), rv) && !strcmp(rt, rv))
                    printf("data: warning: train and val share %s: the val loss measures text the model trains on\n", t.path.c_str());
            }
    }
    fflush(stdout);
}

// ----------------------------------------------------------------------------
// --sweep: every valid P, and every (P, D) that fits the cores or GPUs, for a few steps on the same model
// and data; one table of the scaling

// world rank 0's time and bytes sent (as a ring sends them) over the timed steps of one grid
struct SweepTime {
    double seconds, comm_seconds, dp_seconds, sent, dp_sent;
    double sent_kind[COMM_KINDS];  // the TP bytes by kind of collective
    int steps;
};

// one rank of one grid: --sweep-steps training steps, the first 2 not timed (they warm up caches and allocations)
static void sweep_rank(Run* run, int d, int r, SweepTime* out) {
    RankRun rr;
    rank_run_start(&rr, run, d, r);
    comm_barrier(&rr.world, "start");
    for (int step = 0; step < run->args.sweep_steps; step++) {
        StepStats st = train_step(run, &rr, step);
        if (rr.world.rank == 0 && step >= 2) {
            double sent[COMM_KINDS];
            out->seconds += st.seconds;
            out->comm_seconds += st.comm_seconds;
            out->dp_seconds += st.dp_seconds;
            out->sent += ring_bytes(st.comm_moved, run->P, sent);
            for (int k = 0; k < COMM_KINDS; k++) out->sent_kind[k] += sent[k];
            out->dp_sent += ring_bytes(st.dp_moved, run->Dg, sent);
            out->steps++;
        }
    }
    rank_run_end(&rr);
}

static void sweep(Run* run) {
    const Args* a = &run->args;
    const GPTConfig* c = &run->cfg;
    int cores = (int)std::max(1u, std::thread::hardware_concurrency());
    int units = run->device == DEV_CUDA ? run->ngpu : cores;
    printf("\nsweep: %d steps per grid (the first 2 not timed), batch %d x %d per replica, on the %s; every valid P, and "
           "every (P, D) with P x D <= %d\n", a->sweep_steps, a->B, a->T, run->device == DEV_CUDA ? "GPU" : "CPU", units);
    printf("%4s %4s %8s %10s %10s %8s %10s %8s %8s %9s %9s %12s\n", "P", "D", "threads", "ms/step", "tok/s", "speedup",
           "efficiency", "comm %", "dp %", "comm MB", "dp MB", "MB per rank");
    FILE* csv = nullptr;
    if (a->outdir) {
        std::string path = std::string(a->outdir) + "/sweep.csv";
        csv = fopen(path.c_str(), "w");
        if (!csv) fatal("cannot write %s: %s", path.c_str(), strerror(errno));
        fprintf(csv, "P,D,threads_per_rank,ms_per_step,tok_per_s,speedup,efficiency,comm_share,dp_share,comm_mb_per_step,"
                     "dp_mb_per_step,mb_per_rank,allreduce_mb_per_step,reducescatter_mb_per_step,allgather_mb_per_step\n");
    }
    ranks_teardown(run);  // run_setup made the groups of the run's own grid
    double base = 0;
    int units1 = 0;
    for (int D = 1; D <= units || D == 1; D++)
        for (int P = 1; P <= c->NH && P <= COMM_MAXP; P++) {
            if (!tp_valid(c, P) || (D > 1 && P * D > units) || P * D > COMM_MAXP) continue;
            if (a->sp && P > 1 && !sp_splits(true, P, a->B, a->T)) {
                printf("%4d %4d  skipped: --sp 1 needs P to divide B*T = %d\n", P, D, a->B * a->T);
                continue;
            }
            std::string why;
            if (!memory_fits(run, P, D, &why)) {
                printf("%4d %4d  skipped: %s\n", P, D, why.c_str());
                continue;
            }
            run->P = P;
            run->D = run->Dg = D;
            ranks_setup(run);
            SweepTime time = {};
            std::vector<std::thread> threads;
            for (int d = 0; d < D; d++)
                for (int r = 0; r < P; r++) threads.emplace_back(sweep_rank, run, d, r, &time);
            for (auto& t : threads) t.join();
            ranks_teardown(run);
            double ms = time.seconds / time.steps * 1e3, tps = (double)a->B * a->T * run->accum * D / (ms / 1e3);
            // efficiency: speedup over P=1 divided by the growth in compute units used (cores on the CPU,
            // GPUs on CUDA); on a CPU every grid uses the same cores, so the ideal speedup there is 1
            int used = run->device == DEV_CUDA ? std::min(P * D, run->ngpu) : std::min(P * D * run->threads, cores);
            if (base == 0) { base = ms; units1 = used; }  // P = 1, D = 1, unless it did not fit
            double speedup = base / ms * D, eff = speedup / ((double)used / units1);
            double share = time.comm_seconds / time.seconds, dp_share = time.dp_seconds / time.seconds;
            RankMemory m = rank_memory(c, P, D, a->zero, a->B, a->T, a->sp, a->recompute);
            double mb = memory_total(&m) / 1e6, comm_mb = time.sent / time.steps / 1e6, dp_mb = time.dp_sent / time.steps / 1e6;
            printf("%4d %4d %8d %10.1f %10.0f %8.2f %10.2f %8.1f %8.1f %9.2f %9.2f %12.1f\n", P, D, run->threads, ms, tps, speedup,
                   eff, 100 * share, 100 * dp_share, comm_mb, dp_mb, mb);
            fflush(stdout);
            double per_step = 1e6 * time.steps;
            if (csv)
                fprintf(csv, "%d,%d,%d,%.3f,%.1f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.2f,%.4f,%.4f,%.4f\n", P, D, run->threads, ms, tps,
                        speedup, eff, share, dp_share, comm_mb, dp_mb, mb, time.sent_kind[KIND_ALLREDUCE] / per_step,
                        time.sent_kind[KIND_REDUCESCATTER] / per_step, time.sent_kind[KIND_ALLGATHER] / per_step);
        }
    if (csv) fclose(csv);
}

static int tp_main(int argc, char** argv) {
    Run* run = new Run();
    parse_args(argc, argv, &run->args);
    run_setup(run);
    if (!run->args.sweep) signal_setup(run);  // before the setup is printed: from then on Ctrl-C is handled
    print_setup(run);
    if (run->args.sweep) {
        sweep(run);
        delete run;
        return 0;
    }
    bool logs = run->args.outdir && !run->sample_only && g_procs.me == 0;  // world rank 0 logs, in process 0
    if (logs) logger_open(&run->log, run->args.outdir, run->resuming ? run->start_step : -1);
    std::vector<std::thread> threads;
    for (int d = 0; d < run->D; d++)
        for (int r = 0; r < run->P; r++) threads.emplace_back(rank_main, run, d, r);
    for (auto& t : threads) t.join();
    logger_close(&run->log);
    ranks_teardown(run);
    delete run;
    return 0;
}

#ifndef TESTING
int main(int argc, char** argv) {
    comm_procs_start(&argc, &argv);  // mpirun: MPI first, before any other thread exists
    int rc = tp_main(argc, argv);
    comm_procs_finish();
    return rc;
}
#endif
