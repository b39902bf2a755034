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
#include <csignal>
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
    int dp;              // --dp: data-parallel replicas in this process
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
};

static void usage(FILE* out) {
    fprintf(out,
        "usage: ./tp [flags]        train GPT-2 with tensor parallelism over --tp ranks (one thread each), and\n"
        "                           data parallelism over --dp replicas in this process and the processes of mpirun\n"
        "  -i PATTERN  train tokens: an llm.c token file or a glob of shards   (default: the embedded corpus)\n"
        "  -j PATTERN  val tokens                                               (default: the embedded corpus)\n"
        "  -e MODEL    llm.c fp32 checkpoint file, or a descriptor: d1..d12, d24, d36, d48, or\n"
        "              L<layers>C<channels>H<heads> such as L3C128H4             (default L3C128H4)\n"
        "  -o DIR      output directory for checkpoints                         (default: none)\n"
        "  -b B        batch size (sequences) of each replica                   (default 8)\n"
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
        "  --dp D      data-parallel replicas in each process                   (default 1)\n"
        "  -d TOKENS   tokens per optimizer step, by gradient accumulation      (default 0: B x T x replicas)\n"
        "  -z Z        ZeRO stage: 1 splits AdamW's m and v over the replicas   (default 0)\n"
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
        "  --prompt S  text to continue (byte-level models)                     (default: a newline)\n"
        "  --tokenizer F  llm.c gpt2_tokenizer.bin to print GPT-2 tokens as text (default: token ids)\n"
        "  --help      this text\n");
}

// a bad command line: the usage on stdout, one line on stderr saying what is wrong, exit 1
[[noreturn]] static void bad_flag(const char* fmt, const char* a, const char* b) {
    if (g_procs.me == 0) usage(stdout);
    char what[512];
    snprintf(what, sizeof(what), fmt, a, b);
    fatal("%s (./tp --help lists the flags)", what);
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
    a->device = -1; a->timeout = 600; a->dp = 1;
    a->temperature = 0.8f; a->topk = 0; a->sample_seed = 42; a->keep = 3; a->sweep_steps = 8;
    for (int i = 1; i < argc; i++) {
        const char* f = argv[i];
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            if (g_procs.me == 0) usage(stdout);
            comm_procs_finish();
            exit(0);
        }
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
        else if (!strcmp(f, "--dp")) a->dp = (int)parse_int(f, v, 1, COMM_MAXP);
        else if (!strcmp(f, "-d")) a->total_batch = parse_int(f, v, 0, 1L << 50);
        else if (!strcmp(f, "-z")) a->zero = (int)parse_int(f, v, 0, 1);
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
        else if (!strcmp(f, "--sp")) a->sp = (int)parse_int(f, v, 0, 1);
        else if (!strcmp(f, "-r")) a->recompute = (int)parse_int(f, v, 0, 3);
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
    Tokenizer tokenizer;
    std::vector<int> prompt;
    Checkpoints ckpt;             // -o DIR
    bool resuming;                // -y 1 found a checkpoint: start from it
    int start_step;
    TrainState state;             // what the resume restores besides the weights
    Logger log;                   // -o DIR: DIR/log.csv
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

// mean loss over the first n val batches of every replica, the same on every rank
static float evaluate(Run* run, RankRun* rr, int n) {
    DataLoader* val = &rr->val;
    loader_reset(val);
    double s = 0.0;
    for (int i = 0; i < n; i++) {
        loader_next(val);
        gpt_forward(&rr->m, &rr->rk, val->inputs.data(), val->targets.data(), val->B, val->T, false);
        s += gpt_read_loss(&rr->m, &rr->rk);
    }
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
    std::vector<int> out = generate(&rr->m, &rr->rk, run->prompt, a->gen_tokens, a->T, a->temperature, a->topk,
                                    (uint64_t)a->sample_seed);
    if (rr->world.rank != 0) return;
    printf("sample after %d steps (temperature %g%s):\n---\n", step, a->temperature, a->topk ? ", top-k" : "");
    print_tokens(out, &run->tokenizer, run->cfg.V, a->prompt);
    printf("\n---\n");
    fflush(stdout);
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

// Ctrl-C / SIGTERM: finish the step, save, exit 0. The handler only sets a flag (g_signal, a lock-free
// atomic: safe in a signal handler, and read by the rank threads without a race); a second signal kills.
static void on_signal(int sig) { g_signal.store(sig); }

// the GPUs all processes use, for MFU
static int gpus_in_use(const Run* run) { return std::min(run->P * run->D, run->ngpu) * g_procs.n; }

static void rank_main(Run* run, int d, int r) {
    const Args* a = &run->args;
    RankRun rr;
    rank_run_start(&rr, run, d, r);
    Rank* rk = &rr.rk;
    GPT* m = &rr.m;
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
            vl = evaluate(run, &rr, a->val_batches);
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
        if (lead && print_step(a, step)) {
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
        // Stop on a signal, every rank after the same step: the step's world all-reduce carried every rank's
        // flag, so all ranks of all processes saw the same sum (a rank deciding alone would leave the others
        // waiting in the next step's first collective).
        if (st.stop) {
            if (a->outdir && last_saved != step + 1) checkpoint_save(&run->ckpt, run->init.data(), m, rk, &rr.world, &rr.train, step + 1);
            if (lead) {
                if (a->outdir) printf("interrupted after step %d: saved in %s; continue with -y 1\n", step + 1, a->outdir);
                else printf("interrupted after step %d (no -o, nothing saved)\n", step + 1);
                fflush(stdout);
            }
            rank_run_end(&rr);
            return;
        }
    }
    if (a->outdir && last_saved != a->max_steps) checkpoint_save(&run->ckpt, run->init.data(), m, rk, &rr.world, &rr.train, a->max_steps);
    char note[96];
    check_replicas(run, &rr, a->max_steps, note, sizeof(note));
    if (lead && a->max_steps > run->start_step + 1) {
        int n = a->max_steps - run->start_step - 1;
        char mfu[32] = "", dp[64] = "";
        if (run->peak_flops > 0) snprintf(mfu, sizeof(mfu), ", MFU %.1f%%", 100.0 * flops_per_step * n / total_time / (run->peak_flops * gpus_in_use(run)));
        if (run->Dg > 1) snprintf(dp, sizeof(dp), " and %.1f ms in DP collectives", total_dp / n * 1e3);
        printf("average %.1f ms per step, %.0f tok/s%s, %.1f ms per step in collectives%s (steps %d..%d)\n", total_time / n * 1e3,
               tokens * n / total_time, mfu, total_comm / n * 1e3, dp, run->start_step + 2, a->max_steps);
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

// Process 0 found the model (and the state to resume from); every other process receives them. Their
// -o and -e may be on another machine: only the token files must be on every machine.
static void model_bcast(Run* run) {
    if (g_procs.n == 1) return;
    double timeout = run->args.timeout;
    int64_t head[3] = {(int64_t)run->init.size(), run->resuming, run->start_step};
    comm_procs_bcast(&run->cfg, sizeof(run->cfg), timeout);
    comm_procs_bcast(head, sizeof(head), timeout);
    run->init.resize(head[0]);
    comm_procs_bcast(run->init.data(), run->init.size() * sizeof(float), timeout);
    run->resuming = head[1] != 0;
    run->start_step = (int)head[2];
    if (run->resuming) state_bcast(&run->state, timeout);
}

static void run_setup(Run* run) {
    const Args* a = &run->args;
    bool embedded = a->train == nullptr;
    bool first = g_procs.me == 0;  // process 0: the output directory, the model, the log and the messages
    // the output directory: create it and make sure we can write there before training for hours
    if (a->outdir && first) {
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
    std::vector<int> saved = a->resume && first ? ckpt_steps(a->outdir) : std::vector<int>();
    if (first && a->resume && saved.empty()) printf("tp: -y 1 but no checkpoint in %s yet: starting from scratch\n", a->outdir);
    if (!first) {
        // process 0 finds the model; it arrives in model_bcast
    } else if (!saved.empty()) {
        std::string model = ckpt_path(a->outdir, "model", saved.back());
        model_read(model.c_str(), c, &run->init);
        GPTConfig want;
        if (a->model && gpt_descriptor(a->model, &want, c->V, c->maxT) &&
            (want.L != c->L || want.NH != c->NH || want.C != c->C || (a->vocab && a->vocab != c->V)))
            fatal("-e %s disagrees with the checkpoint in %s (%d layers, %d heads, %d channels, vocab %d): drop -e to resume it",
                  a->model, a->outdir, c->L, c->NH, c->C, c->V);
        state_read(a->outdir, saved.back(), (long)run->init.size(), &run->state);
        run->resuming = true;
        run->start_step = (int)run->state.h.step;
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
        model_read(a->model, c, &run->init);
        if (a->vocab && a->vocab != c->V)
            fatal("--vocab %d disagrees with checkpoint %s (vocab %d): drop --vocab", a->vocab, a->model, c->V);
    }
    model_bcast(run);
    if (a->T > c->maxT) fatal("sequence length -t %d exceeds the model's maximum %d: use -t %d or less", a->T, c->maxT, c->maxT);
    // the grid's data-parallel side: replicas in this process and in all, and the micro-steps of -d
    run->D = a->dp;
    run->Dg = a->dp * g_procs.n;
    long micro_tokens = (long)a->B * a->T * run->Dg;  // one micro-batch of every replica
    run->accum = 1;
    if (a->total_batch) {
        if (a->total_batch % micro_tokens != 0)
            fatal("-d %ld is not a multiple of the tokens one micro-step of all replicas takes (-b %d x -t %d x %d replica%s = %ld): "
                  "give -d %ld, %ld, ...", a->total_batch, a->B, a->T, run->Dg, run->Dg > 1 ? "s" : "", micro_tokens, micro_tokens,
                  2 * micro_tokens);
        run->accum = (int)std::min(a->total_batch / micro_tokens, 1L << 30);
    }
    if (a->outdir && first) {
        run->ckpt.dir = a->outdir;
        run->ckpt.keep = a->keep;
        run->ckpt.m.resize(run->init.size());
        run->ckpt.v.resize(run->init.size());
    }
    // data: token files, or the embedded corpus, generated here (16 MB of train text, the same for any
    // flags, so that a resumed run sees the same data; the val text grows with the val batches of all replicas)
    if (embedded) {
        if (c->V < 256) fatal("the embedded corpus is byte-level and needs a vocab of at least 256, the model has %d", c->V);
        std::string text;
        grammar_generate(1, 16L << 20, &text, nullptr);
        run->corpus_train.assign(text.begin(), text.end());
        text.clear();
        grammar_generate(2, (size_t)a->val_batches * a->B * a->T * run->Dg + 1, &text, nullptr);
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
            // dense TF32 tensor-core peaks (the fp32 training here runs its matmuls in TF32)
            if (strstr(prop.name, "H100") || strstr(prop.name, "H200") || strstr(prop.name, "H800")) run->peak_flops = 494.7e12;
            else if (strstr(prop.name, "A100") || strstr(prop.name, "A800")) run->peak_flops = 156e12;
        }
    }
    // ranks: by default as many per replica as the GPUs, or cores, of this process's share of the machine
    // allow (the largest valid P with P x --dp of them)
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
    if (a->sweep && g_procs.n > 1) fatal("--sweep times replicas inside one process (--dp): start it without mpirun");
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

// "replica 2-3" or "replica 0"
static std::string span_text(const char* what, int lo, int hi) {
    char b[64];
    if (hi > lo) snprintf(b, sizeof(b), "%ss %d-%d", what, lo, hi);
    else snprintf(b, sizeof(b), "%s %d", what, lo);
    return b;
}

// The startup lines (process 0 prints them): the model, the grid and which rank runs where, the shard
// plan, the memory per rank and the communication per step.
static void print_setup(const Run* run) {
    if (g_procs.me != 0) return;
    const GPTConfig* c = &run->cfg;
    const Args* a = &run->args;
    int P = run->P, D = run->D, N = g_procs.n;
    printf("tp: GPT-2 with %d layers, %d heads, %d channels, vocab %d (padded %d), max T %d: %.2fM parameters\n",
           c->L, c->NH, c->C, c->V, c->Vp, c->maxT, gpt_num_params(c) / 1e6);
    const char* tp_link = P == 1 ? "no communication" : run->device != DEV_CUDA ? "shared memory"
                        : run->tp_groups[0].nccl[0] ? "NCCL" : "shared GPU memory";
    if (run->Dg > 1) {
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
    } else if (run->device == DEV_CUDA) {
        printf("tp: %d rank%s on %d GPU%s (%s between ranks); batch %d x %d = %d tokens", P, P > 1 ? "s" : "", run->ngpu,
               run->ngpu > 1 ? "s" : "", tp_link, a->B, a->T, a->B * a->T);
    } else {
        printf("tp: %d rank%s on the CPU, %d thread%s each; batch %d x %d = %d tokens", P, P > 1 ? "s" : "", run->threads,
               run->threads > 1 ? "s" : "", a->B, a->T, a->B * a->T);
    }
    if (run->Dg == 1 && run->accum > 1) printf(", x %d micro-steps = %ld tokens per step", run->accum, (long)a->B * a->T * run->accum);
    if (run->Dg == 1) printf("\n");
    ShardPlan s;
    shard_plan_init(&s, c, P, 0);
    printf("shard plan (rank r of %d):\n", P);
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
    fflush(stdout);
}

// ----------------------------------------------------------------------------
// --sweep: every valid P, and every (P, D) that fits the cores or GPUs, for a few steps on the same model
// and data; one table of the scaling

// world rank 0's time and bytes sent (as a ring sends them) over the timed steps of one grid
struct SweepTime {
    double seconds, comm_seconds, dp_seconds, sent, dp_sent;
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
                     "dp_mb_per_step,mb_per_rank\n");
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
            run->P = P;
            run->D = run->Dg = D;
            ranks_setup(run);
            SweepTime time = {0, 0, 0, 0, 0, 0};
            std::vector<std::thread> threads;
            for (int d = 0; d < D; d++)
                for (int r = 0; r < P; r++) threads.emplace_back(sweep_rank, run, d, r, &time);
            for (auto& t : threads) t.join();
            ranks_teardown(run);
            double ms = time.seconds / time.steps * 1e3, tps = (double)a->B * a->T * run->accum * D / (ms / 1e3);
            // efficiency: speedup over P=1 divided by the growth in compute units used (cores on the CPU,
            // GPUs on CUDA); on a CPU every grid uses the same cores, so the ideal speedup there is 1
            int used = run->device == DEV_CUDA ? std::min(P * D, run->ngpu) : std::min(P * D * run->threads, cores);
            if (P == 1 && D == 1) { base = ms; units1 = used; }
            double speedup = base / ms * D, eff = speedup / ((double)used / units1);
            double share = time.comm_seconds / time.seconds, dp_share = time.dp_seconds / time.seconds;
            RankMemory m = rank_memory(c, P, D, a->zero, a->B, a->T, a->sp, a->recompute);
            double mb = memory_total(&m) / 1e6, comm_mb = time.sent / time.steps / 1e6, dp_mb = time.dp_sent / time.steps / 1e6;
            printf("%4d %4d %8d %10.1f %10.0f %8.2f %10.2f %8.1f %8.1f %9.2f %9.2f %12.1f\n", P, D, run->threads, ms, tps, speedup,
                   eff, 100 * share, 100 * dp_share, comm_mb, dp_mb, mb);
            fflush(stdout);
            if (csv)
                fprintf(csv, "%d,%d,%d,%.3f,%.1f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.2f\n", P, D, run->threads, ms, tps, speedup, eff,
                        share, dp_share, comm_mb, dp_mb, mb);
        }
    if (csv) fclose(csv);
}

static int tp_main(int argc, char** argv) {
    Run* run = new Run();
    parse_args(argc, argv, &run->args);
    run_setup(run);
    print_setup(run);
    if (run->args.sweep) {
        sweep(run);
        delete run;
        return 0;
    }
    struct sigaction sa = {};
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESETHAND;  // a second Ctrl-C stops at once
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    if (run->args.outdir && g_procs.me == 0) logger_open(&run->log, run->args.outdir, run->resuming);
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
