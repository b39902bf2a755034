// train/flags.h: the command line. The flags (llm.c's short ones where they overlap, and tp's own), their
// defaults (the `make && ./tp` run), parsing with one error line for a bad flag and "did you mean" for a
// near miss, and what a resume (-y 1) does with each flag: the flags that make a run what it is are
// saved in its state file, and a resume continues with them.
// Needs nothing of the model: comm.cuh for the processes (--help prints once) and the rank limit.
#pragma once
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>
#include "../common/error.h"
#include "../comm.cuh"


#define MAX_FLAGS 64

// tp's version: `git describe` of the tree it was built from (the Makefile passes it), else this release
#ifndef TP_VERSION
#define TP_VERSION "0.9"
#endif
#define TP_STR2(...) #__VA_ARGS__
#define TP_STR(...) TP_STR2(__VA_ARGS__)

// --version: tp's version and what it was built with, the lines a bug report needs
static void print_version() {
    printf("tp %s\n", TP_VERSION);
    printf("built with CUDA %d.%d, NCCL %d.%d.%d", CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
#if defined(TP_MPI) && defined(OMPI_MAJOR_VERSION)
    printf(", MPI (Open MPI %d.%d.%d)", OMPI_MAJOR_VERSION, OMPI_MINOR_VERSION, OMPI_RELEASE_VERSION);
#elif defined(TP_MPI)
    printf(", MPI %d.%d", MPI_VERSION, MPI_SUBVERSION);
#else
    printf(", no MPI (one process; mpirun needs a build with mpicxx)");
#endif
#ifdef __CUDA_ARCH_LIST__
    // nvcc's list of the architectures compiled for, as "800,900": printed as sm_80 sm_90
    printf(", GPU code for");
    for (const char* p = TP_STR(__CUDA_ARCH_LIST__); *p;) {
        int cc = atoi(p);
        printf(" sm_%d", cc / 10);
        while (*p && *p != ',') p++;
        if (*p) p++;
    }
#endif
    printf(", host compiler %s\n", __VERSION__);
}

// --dtype (auto: as the -e file is, else bf16 where the hardware has bf16 arithmetic; tp.cu's dtype_setup)
enum { DTYPE_FP32 = 0, DTYPE_BF16 = 1, DTYPE_AUTO = 2 };
// --corpus: how the embedded corpus is tokenised (data/grammar.h): its grammar's words, or bytes
enum { CORPUS_WORDS = 0, CORPUS_BYTES = 1 };
// --bf16-gemm: the CPU path of a bf16 run's matmuls, as common/bf16.h's Bf16Path (the same bits on the first
// three; AMX, asked for by name only, rounds its sums its own way)
enum { BF16_GEMM_AUTO = 0, BF16_GEMM_DP = 1, BF16_GEMM_FMA = 2, BF16_GEMM_AMX = 3 };

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
    int pp;              // --pp: pipeline stages per replica
    const char* pp_schedule;  // --pp-schedule: 1f1b or gpipe
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
    int recompute;       // -r: what the backward recomputes (0..3; 3 with --attention matmul only)
    int attention;       // --attention: 1 fused (FlashAttention-2, the default), 0 matmul (the (T, T) probabilities kept)
    int corpus;          // --corpus: CORPUS_WORDS (the default) or CORPUS_BYTES, the embedded corpus's tokens
    int dtype;           // --dtype: DTYPE_FP32, DTYPE_BF16, or DTYPE_AUTO (the default) until dtype_setup decides
    int bf16_gemm;       // --bf16-gemm: BF16_GEMM_AUTO (the default), BF16_GEMM_DP (vdpbf16ps), BF16_GEMM_FMA, BF16_GEMM_AMX
    int sweep;           // --sweep: time every valid (P, D) instead of training
    int sweep_steps;
    int fresh;           // --fresh 1: start over in an -o that holds another run's checkpoints
    const char* plan;    // --plan: 1 this machine, a box name, or custom (train/plan.h); nothing is trained
    double plan_flops, plan_busbw, plan_lat, plan_mem;  // --plan custom: TFLOP/s, GB/s, us, GB per GPU
    int plan_gpus;
    const char* prompts; // --prompts FILE: one prompt per line, generated together
    int chat;            // --chat 1: the interactive mode
    int kv;              // --kv: 1 generation from the KV cache, 0 the whole forward per token
    bool given[MAX_FLAGS];  // which flags the command line gave, by index in g_flags
};

static void usage(FILE* out) {
    fprintf(out,
        "usage: ./tp [flags]        train GPT-2 with tensor parallelism over --tp ranks (one thread each), and\n"
        "                           data parallelism over --dp replicas in each process (mpirun: several)\n"
        "  every flag takes a value: -b 16, --tp 2 or --tp=2\n"
        "  -i PATTERN  train tokens: an llm.c token file or a glob of shards   (default: the embedded corpus)\n"
        "  -j PATTERN  val tokens (none needed with -i and -v 0)                (default: the embedded corpus)\n"
        "  -e MODEL    llm.c model file (fp32 or bf16) or a descriptor: d1..d12, d24, d36, d48, or\n"
        "              L<layers>C<channels>H<heads> such as L2C128H4             (default L2C128H4)\n"
        "  -o DIR      output directory for checkpoints and log.csv (created)   (default: none)\n"
        "  -b B        batch size (sequences) of each replica                   (default 8)\n"
        "  -t T        sequence length                                          (default 128)\n"
        "  -l LR       peak learning rate                                       (default 6e-3)\n"
        "  -u N        warmup steps                                             (default 100)\n"
        "  -q F        final learning rate as a fraction of -l, cosine decay    (default 0)\n"
        "  -c WD       weight decay of the matrices (AdamW, decoupled)          (default 0)\n"
        "  -x N        training steps (0: no training, print a sample and exit) (default 1000)\n"
        "  -v N        val loss every N steps, and at the last step (0: never)  (default 250)\n"
        "  -m N        val batches (at most the val data's)                     (default 50)\n"
        "  -s N        sample every N steps (0: only at the end)                (default 0)\n"
        "  -g N        tokens to generate per sample                            (default 256)\n"
        "  -n N        checkpoint every N steps with -o (0: only at the end)    (default 0)\n"
        "  -y 1        continue the run in -o DIR from its latest checkpoint, with its flags\n"
        "              (flags given again override them where that is safe; see the README)\n"
        "  --fresh 1   start a new run in an -o DIR that holds another run: deletes its checkpoints\n"
        "  --tp P      tensor-parallel ranks (0: one per core or GPU)          (default 0)\n"
        "  --dp D      data-parallel replicas in each process                   (default 1)\n"
        "  --pp S      pipeline stages: the layers in S groups of consecutive layers, each on --tp\n"
        "              ranks; a step's -d micro-batches flow through them            (default 1)\n"
        "  --pp-schedule K  1f1b (at most S micro-batches in flight) or gpipe (all forward,\n"
        "              then all backward)                                        (default 1f1b)\n"
        "  -d TOKENS   tokens per optimizer step, by gradient accumulation      (default 0: B x T x replicas)\n"
        "  -z Z        ZeRO stage: 1 splits AdamW's m and v over the replicas   (default 0)\n"
        "  --device D  auto, cpu or cuda                                        (default auto)\n"
        "  --beta1 B1  --beta2 B2     AdamW betas                               (default 0.9, 0.95)\n"
        "  --clip X    clip the global gradient norm at X (0: off)              (default 1)\n"
        "  --shuffle S 1: shuffled batches, 0: in order as llm.c's -x runs      (default 1)\n"
        "  --vocab V   vocab size for a descriptor model  (default: a tokenizer.json's, else the embedded\n"
        "              corpus's words, 353; 256 for byte-level data, -x 0 and --corpus bytes; else 50257)\n"
        "  --corpus K  the embedded corpus as words (each of its grammar's 353 tokens a word, punctuation\n"
        "              or separator: 4.4 bytes of text a token) or bytes (vocab 256)   (default words)\n"
        "  --maxT N    maximum sequence length for a descriptor model           (default 1024)\n"
        "  --seed N    initialization seed                                      (default 1337)\n"
        "  --threads N CPU threads per rank (0: cores / ranks)                  (default 0)\n"
        "  --timeout S abort if a collective waits longer than S seconds       (default 600)\n"
        "  --keep K    keep the last K checkpoints in -o                        (default 3)\n"
        "  --sp S      1: sequence parallelism: each rank keeps its B*T/P tokens of the layernorms,\n"
        "              residuals and embedding (activation memory / P)            (default 0)\n"
        "  -r N        recompute in the backward instead of keeping: 0 nothing, 1 GELU, 2 also the\n"
        "              layernorms, 3 also the attention probabilities (same numbers; --attention matmul\n"
        "              only: fused attention keeps none)                       (default 0)\n"
        "  --attention A  fused: FlashAttention-2 tiles, no (T, T) matrix kept, one log-sum-exp per row;\n"
        "              matmul: the probabilities materialised per layer (the readable version)  (default fused)\n"
        "  --dtype D   bf16: the layers compute from a bf16 copy of the fp32 master weights (stochastic\n"
        "              rounding), matmul operands in bf16, fp32 sums, AdamW on fp32 masters; fp32: all fp32;\n"
        "              auto: an llm.c model file's own (-e), else bf16 on a CPU with AVX512-BF16 or a GPU\n"
        "              of sm_80 and newer, fp32 elsewhere                               (default auto)\n"
        "  --bf16-gemm G  the CPU's bf16 matmuls: vdpbf16ps (AVX512-BF16), fma (fp32 fmas) or auto (the\n"
        "              faster here, measured at start): the same bits on each; or amx (Intel AMX: several\n"
        "              times faster, its own rounding, so other bits)                    (default auto)\n"
        "  --sweep 1   time every valid P, and every (P, D) with P x D up to the cores or GPUs, and print a\n"
        "              scaling table (-o: sweep.csv)\n"
        "  --sweep-steps N  steps per P in the sweep, the first 2 not timed     (default 8)\n"
        "  --plan WHAT 1: measure this machine (~20 s) and predict every grid; h100, h200, a100, a100pcie,\n"
        "              4090x4, 4090x2, h100x2: predict for that GPU box; custom: for --plan-flops TFLOP/s,\n"
        "              --plan-busbw GB/s, --plan-lat us, --plan-mem GB, --plan-gpus N. Trains nothing\n"
        "  --temperature X  sampling temperature (0: greedy)                   (default 0.8)\n"
        "  --topk K    sample from the K most likely tokens (0: all)            (default 0)\n"
        "  --sample-seed N  seed of the sampler                                 (default 42)\n"
        "  --prompt S  text to continue (byte-level, embedded-corpus or BPE tokenizer.json models)\n"
        "              (default: a newline or EOT)\n"
        "  --tokenizer F  a BPE tokenizer.json (decodes samples, encodes --prompt, sets a new model's vocab)\n"
        "              or llm.c's gpt2_tokenizer.bin (decodes)   (default: a tokenizer.json next to -i,\n"
        "              next to -e, or in -o; else bytes or token ids)\n"
        "  --version   tp's version and what it was built with (CUDA, NCCL, MPI, GPU code)\n"
        "  --prompts F one prompt per line, encoded as --prompt is, generated together in one batch\n"
        "  --chat 1    interactive: read a prompt from stdin, stream the answer, repeat until end of input\n"
        "              (no training; Ctrl-C stops an answer)\n"
        "  --kv K      1: generate from a KV cache of each rank's heads; 0: the whole forward per token (default 1)\n"
        "              (--sweep 1 with -x 0: the decode sweep, tokens/s and ms per token for every P and batch)\n"
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
enum FlagType { FLAG_STR, FLAG_PATH, FLAG_INT, FLAG_LONG, FLAG_FLOAT, FLAG_DOUBLE, FLAG_DEVICE, FLAG_ATTENTION, FLAG_DTYPE, FLAG_BF16GEMM, FLAG_CORPUS };

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
    {"--pp", FLAG_INT, ARG(pp), 1, COMM_MAXP, NOT_SAVED, nullptr},
    {"--pp-schedule", FLAG_STR, ARG(pp_schedule), 0, 0, NOT_SAVED, nullptr},
    {"-d", FLAG_LONG, ARG(total_batch), 0, (double)(1L << 50), MAY_CHANGE, nullptr},
    {"-z", FLAG_INT, ARG(zero), 0, 1, NOT_SAVED, nullptr},
    {"--device", FLAG_DEVICE, ARG(device), 0, 0, NOT_SAVED, nullptr},
    {"--beta1", FLAG_FLOAT, ARG(beta1), 0, 0.999999, MAY_CHANGE, nullptr},
    {"--beta2", FLAG_FLOAT, ARG(beta2), 0, 0.999999, MAY_CHANGE, nullptr},
    {"--clip", FLAG_FLOAT, ARG(clip), 0, 1e9, MAY_CHANGE, nullptr},
    {"--shuffle", FLAG_INT, ARG(shuffle), 0, 1, MUST_KEEP, "the saved order of the train data was drawn with it"},
    {"--vocab", FLAG_INT, ARG(vocab), 2, 1 << 20, NOT_SAVED, nullptr},
    {"--corpus", FLAG_CORPUS, ARG(corpus), 0, 0, MUST_KEEP, "the model's vocab and the saved place in the data are in its tokens"},
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
    // the same function either way (changes no parameter): a resume may switch it
    {"--attention", FLAG_ATTENTION, ARG(attention), 0, 0, MAY_CHANGE, nullptr},
    // the masters are fp32 either way and the bf16 copy follows from them: a resume may switch it
    {"--dtype", FLAG_DTYPE, ARG(dtype), 0, 0, MAY_CHANGE, nullptr},
    {"--bf16-gemm", FLAG_BF16GEMM, ARG(bf16_gemm), 0, 0, NOT_SAVED, nullptr},
    {"--sweep", FLAG_INT, ARG(sweep), 0, 1, NOT_SAVED, nullptr},
    {"--sweep-steps", FLAG_INT, ARG(sweep_steps), 3, 1 << 20, NOT_SAVED, nullptr},
    {"--fresh", FLAG_INT, ARG(fresh), 0, 1, NOT_SAVED, nullptr},
    {"--plan", FLAG_STR, ARG(plan), 0, 0, NOT_SAVED, nullptr},
    {"--plan-flops", FLAG_DOUBLE, ARG(plan_flops), 0, 1e6, NOT_SAVED, nullptr},
    {"--plan-busbw", FLAG_DOUBLE, ARG(plan_busbw), 0, 1e6, NOT_SAVED, nullptr},
    {"--plan-lat", FLAG_DOUBLE, ARG(plan_lat), 0, 1e6, NOT_SAVED, nullptr},
    {"--plan-mem", FLAG_DOUBLE, ARG(plan_mem), 0, 1e6, NOT_SAVED, nullptr},
    {"--plan-gpus", FLAG_INT, ARG(plan_gpus), 1, 4096, NOT_SAVED, nullptr},
    {"--prompts", FLAG_PATH, ARG(prompts), 0, 0, NOT_SAVED, nullptr},
    {"--chat", FLAG_INT, ARG(chat), 0, 1, NOT_SAVED, nullptr},
    {"--kv", FLAG_INT, ARG(kv), 0, 1, NOT_SAVED, nullptr},
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
    vfprintf(fatal_out(), fmt, ap);
    va_end(ap);
    fprintf(fatal_out(), "\n%s\n", hint);
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
    case FLAG_ATTENTION:
        if (!strcmp(v, "fused")) *(int*)field = 1;
        else if (!strcmp(v, "matmul")) *(int*)field = 0;
        else bad_flag("flag %s takes fused or matmul, not '%s'", f->name, v);
        break;
    case FLAG_DTYPE:
        if (!strcmp(v, "fp32")) *(int*)field = DTYPE_FP32;
        else if (!strcmp(v, "bf16")) *(int*)field = DTYPE_BF16;
        else if (!strcmp(v, "auto")) *(int*)field = DTYPE_AUTO;
        else bad_flag("flag %s takes bf16, fp32 or auto, not '%s'", f->name, v);
        break;
    case FLAG_CORPUS:
        if (!strcmp(v, "words")) *(int*)field = CORPUS_WORDS;
        else if (!strcmp(v, "bytes")) *(int*)field = CORPUS_BYTES;
        else bad_flag("flag %s takes words or bytes, not '%s'", f->name, v);
        break;
    case FLAG_BF16GEMM:
        if (!strcmp(v, "auto")) *(int*)field = BF16_GEMM_AUTO;
        else if (!strcmp(v, "vdpbf16ps")) *(int*)field = BF16_GEMM_DP;
        else if (!strcmp(v, "fma")) *(int*)field = BF16_GEMM_FMA;
        else if (!strcmp(v, "amx")) *(int*)field = BF16_GEMM_AMX;
        else bad_flag("flag %s takes auto, vdpbf16ps, fma or amx, not '%s'", f->name, v);
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
    case FLAG_ATTENTION: return *(const int*)field ? "fused" : "matmul";
    case FLAG_DTYPE: return *(const int*)field == DTYPE_BF16 ? "bf16" : *(const int*)field == DTYPE_AUTO ? "auto" : "fp32";
    case FLAG_CORPUS: return *(const int*)field == CORPUS_BYTES ? "bytes" : "words";
    case FLAG_BF16GEMM: {
        const int g = *(const int*)field;
        return g == BF16_GEMM_DP ? "vdpbf16ps" : g == BF16_GEMM_FMA ? "fma" : g == BF16_GEMM_AMX ? "amx" : "auto";
    }
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
    // saved by a tp from before --corpus, whose embedded corpus was bytes
    bool has_corpus = false;
    for (auto& p : kv) has_corpus |= p.first == "--corpus";
    if (!has_corpus) kv.push_back({"--corpus", "bytes"});
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
    // the defaults are the `make && ./tp` run: the L2C128H4 model on the embedded corpus's words for 1000
    // steps, about 30 s on 2 AVX-512 CPU cores, ending about 1% above the floor (as bytes, 5000 steps
    // ended 12% above it: a byte model spends its steps learning to spell) (for GPT-2 sizes give -l, -u, -q
    // and -x as llm.c does, e.g. -l 6e-4 -u 700 -q 0)
    a->B = 8; a->T = 128; a->lr = 6e-3f; a->warmup = 100; a->final_frac = 0.0f; a->wd = 0.0f;
    a->max_steps = 1000; a->val_every = 250; a->val_batches = 50; a->sample_every = 0; a->gen_tokens = 256;
    a->beta1 = 0.9f; a->beta2 = 0.95f; a->clip = 1.0f; a->shuffle = 1; a->maxT = 1024; a->seed = 1337;
    a->device = -1; a->timeout = 600; a->dp = 1; a->pp = 1; a->dtype = DTYPE_AUTO;
    a->temperature = 0.8f; a->topk = 0; a->sample_seed = 42; a->keep = 3; a->sweep_steps = 8; a->kv = 1; a->attention = 1;
    for (int i = 1; i < argc; i++) {
        std::string name = argv[i];
        if (name == "--version") {
            if (g_procs.me == 0) print_version();
            comm_procs_finish();
            exit(0);
        }
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

// -i and -j go together, except that -i alone trains without val losses when -v 0 asks for none (checked
// after a resume has filled in the run's own)
static void check_data_flags(const Args* a) {
    if (a->train && !a->val && a->val_every == 0) return;
    if ((a->train == nullptr) != (a->val == nullptr))
        bad_flag("give both -i and -j (train and val data), or -i alone with -v 0 (no val losses), or neither for the embedded corpus");
}
