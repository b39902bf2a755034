// train/setup.h (needs the model and tp.cu's Run): the pieces of a run's setup, which run_setup in tp.cu
// puts in order: the output directory and what a resume finds there, the token files, the devices, the grid
// of replicas and ranks and its communicator groups, the memory check, the prompt.
//
// Under mpirun process 0 alone reads the output directory and the model file (they may be on its machine
// only) and every other process receives what it read: procs_share below is that one exchange.
#pragma once
#include <algorithm>
#include <climits>
#include <dlfcn.h>
#include <fcntl.h>
#include <string>
#include <sys/file.h>
#include <sys/stat.h>
#include <vector>

// Under mpirun: process 0's copy of x, on every process (one broadcast; a vector's size first).
template <typename T> static void procs_share(T* x, double timeout) { comm_procs_bcast(x, sizeof(T), timeout); }
template <typename T> static void procs_share(std::vector<T>* v, double timeout) {
    int64_t n = (int64_t)v->size();
    comm_procs_bcast(&n, sizeof(n), timeout);
    v->resize(n);
    if (n) comm_procs_bcast(v->data(), n * sizeof(T), timeout);
}
static void procs_share(std::string* s, double timeout) {
    int64_t n = (int64_t)s->size();
    comm_procs_bcast(&n, sizeof(n), timeout);
    s->resize(n);
    if (n) comm_procs_bcast(&(*s)[0], n, timeout);
}

// ----------------------------------------------------------------------------
// the memory a rank holds, and the memory check

// The memory one rank holds with P TP ranks, D replicas and ZeRO stage zero, in bytes: parameters,
// gradients, AdamW's m and v, activations (one micro-batch of B x T; with --sp and -r as given:
// sp_splits decides whether the batch splits at this P)
struct RankMemory {
    double params, grads, moments, acts;
};

// fused: --attention fused (else matmul). Pipeline parallelism: a rank of stage `stage` of S, keeping
// `slots` micro-batches' activations (pp_slots). bf16: --dtype bf16, whose parameters are the fp32 masters
// and the layers' bf16 copy of them (2 bytes a weight, and its vectors widened to fp32: gpt_set_dtype), and
// whose gradients are too (the matrices' bf16, the vectors' fp32, and an fp32 stage where they are summed).
static RankMemory rank_memory(const GPTConfig* c, int P, int D, int zero, int B, int T, bool sp, int recompute, bool fused,
                              int S = 1, int stage = 0, int slots = 1, bool bf16 = false) {
    ShardPlan s;
    shard_plan_init(&s, c, P, 0, S, stage);
    long n = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) n += shard_local_size(&s.t[i]);
    long npad = shard_padded(n, zero, D);  // as gpt_build allocates it
    RankMemory mem;
    mem.params = 4.0 * npad + (bf16 ? 4.0 * ((npad + 1) / 2 + params_vector_floats(&s)) : 0);
    // bf16: the matrices' gradients in bf16 storage, the vectors' in fp32, and the stage the collectives sum
    // them in
    long gstage = grad_stage_floats(c, &s, npad, D, S, sp_splits(sp, P, B, T), T);
    mem.grads = bf16 ? 4.0 * ((npad + 1) / 2 + params_vector_floats(&s) + gstage) : 4.0 * npad;
    mem.moments = 2 * 4.0 * (zero ? npad / D : n);
    mem.acts = 4.0 * slots * acts_floats(c, &s, B, T, sp_splits(sp, P, B, T), recompute, fused, bf16);
    return mem;
}

static double memory_total(const RankMemory* m) { return m->params + m->grads + m->moments + m->acts; }

// The payload of one step's DP collectives for one rank, by kind (as comm.cuh counts it, in 32-bit words):
// the all-reduce of its shard of the gradient, N floats; with ZeRO-1 the reduce-scatter of the padded shard
// N' and the all-gather of the updated parameters N', plus the all-reduce of the two squared norms; in bf16
// (bf16: --dtype bf16) that all-gather moves the bf16 copy, N' bf16 in N'/2 words. None with one replica.
static void dp_step_floats(const GPTConfig* c, int P, int D, int zero, bool bf16, double out[COMM_KINDS]) {
    for (int k = 0; k < COMM_KINDS; k++) out[k] = 0;
    if (D == 1) return;
    double shard = rank_memory(c, P, D, zero, 1, 1, false, 0, true).params / 4;
    if (!zero) out[KIND_ALLREDUCE] = shard;
    else {
        out[KIND_REDUCESCATTER] = shard;
        out[KIND_ALLGATHER] = bf16 ? shard / 2 : shard;
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

// A bf16 run on a GPU packs the matmul operands it holds in fp32 words into a scratch of the rank
// (kernels.cuh, pack_operands_bf16): the largest matmul's input, 2 bytes an element (and 8 of padding
// each of three). Already bf16 storage, so not packed: the weights' copy, the LM head's dlogits, every
// output gradient of the backward (gpt.cu's grad_input and residual_grad_input), the inputs a layer keeps
// in bf16 (atty always; ln1 and ln2 unless -r 2 recomputes them; the GELU's output unless -r 1 does), and
// under SP with an even C the gathered layernorm outputs (the wire, all_tokens_input). What is packed:
// lnf (B*T*C), ln1 and ln2 where -r 2 recomputes them or SP gathers fp32 words (B*T*C each, so no more),
// and fcproj's input where -r 1 recomputes it (B*T*4C/P).
static double gpu_bf16_pack_bytes(const GPTConfig* c, int P, int B, int T, int recompute) {
    double BT = (double)B * T, C = c->C;
    double most = BT * std::max(C, recompute >= 1 ? 4 * C / P : 0.0);
    return 2.0 * (most + 24);
}

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
    // the largest rank, and all of a replica's (with pipeline stages: each stage's rank with its activations in flight)
    RankMemory rm = {};
    double replica = 0;
    for (int s = run->S0; s < run->S0 + run->Sl; s++) {  // this process's stages
        int slots = run->S > 1 ? pp_slots(run->pp_schedule, run->S, s, run->accum) : 1;
        RankMemory m = rank_memory(c, P, run->Dg / run->D * D, a->zero, B, a->T, a->sp, a->recompute, a->attention != 0, run->S, s, slots,
                                    a->dtype == DTYPE_BF16);
        replica += P * memory_total(&m);
        if (memory_total(&m) > memory_total(&rm)) rm = m;
    }
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
    e.cpu = e.host + ESTIMATE_MARGIN * D * replica;
    return e;
}

// Whether the run fits at P ranks x D local replicas; if not, *why is the one line that says so: what is
// needed, what is free, and which flags lower it.
static bool memory_fits(const Run* run, int P, int D, std::string* why) {
    const Args* a = &run->args;
    int B = run->sample_only ? 1 : a->B;
    MemoryEstimate e = memory_estimate(run, P, D);
    double packed = a->dtype == DTYPE_BF16 ? gpu_bf16_pack_bytes(&run->cfg, P, B, a->T, a->recompute) : 0;  // (on a GPU)
    P *= D * run->Sl;  // the ranks of this process
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
    rank += packed;
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
// the output directory, the data, the prompt

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

// One run per folder: process 0 holds an exclusive flock on DIR/.lock for the whole run (under mpirun it
// holds it for every process), with its pid written in the file for the message a second run gets. The
// descriptor stays open until the process ends, so the lock ends with it, also on kill -9; a .lock file
// left by a dead process is therefore no obstacle (its old pid is overwritten). The file is never removed:
// removing it would let two runs lock two different files of the same name.
static void outdir_lock(const char* dir) {
    std::string path = std::string(dir) + "/.lock";
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) fatal("cannot create the lock file %s: %s", path.c_str(), strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK) fatal("cannot lock %s: %s", path.c_str(), strerror(errno));
        char buf[32] = "";
        ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
        int pid = n > 0 ? atoi(buf) : 0;
        char who[48] = "a process that has not written its pid yet";
        if (pid > 0) snprintf(who, sizeof(who), "pid %d", pid);
        fatal("-o %s is in use by another run (%s holds %s): wait for it to end or stop it, or choose another -o", dir, who, path.c_str());
    }
    char pid[32];
    int n = snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, n, 0) != n) fatal("cannot write %s: %s", path.c_str(), strerror(errno));
}

// The output directory: created, writable, one run at a time (its lock), cleared of the temporary files of
// a save that was cut short, and not holding another run's files unless this run continues it (-y 1) or was
// told to start over (--fresh 1). A folder holds a run when it has any model_*.bin, state_*.bin or log.csv,
// even with no checkpoint a resume could continue: those files are somebody's work. Returns the steps
// saved there.
static std::vector<int> outdir_setup(const Args* a) {
    const char* dir = a->outdir;
    struct stat st;
    if (a->resume && stat(dir, &st) != 0)
        fatal("-y 1 -o %s: there is no such folder, so no run to continue: give the -o the run was started with, or drop -y 1 "
              "to start a new run there", dir);
    make_dirs(dir);
    std::string probe = std::string(dir) + "/.tp_write_test";
    FILE* f = fopen(probe.c_str(), "wb");
    if (!f || fclose(f) != 0) fatal("cannot write to the output directory -o %s: %s", dir, strerror(errno));
    remove(probe.c_str());
    bool trains = !a->sweep && a->max_steps > 0;
    if (trains || a->sweep) {
        outdir_lock(dir);
        std::vector<std::string> gone = remove_stale_tmp(dir);
        if (!gone.empty())
            printf("tp: removed %zu temporary file%s left in %s by a save that was cut short: %s\n", gone.size(), gone.size() > 1 ? "s" : "",
                   dir, name_list(gone).c_str());
    }
    std::vector<int> saved = ckpt_steps(dir);
    std::vector<std::string> files = run_files(dir);
    std::vector<std::string> models;
    for (const std::string& name : files)
        if (name.rfind("model_", 0) == 0) models.push_back(name);
    if (a->resume) {
        if (saved.empty() && !models.empty())
            fatal("-y 1: %s holds %s but no state file to continue from: start a new run from those weights with -e %s/%s "
                  "(and another -o), or start over in %s with --fresh 1 instead of -y 1", dir, name_list(models).c_str(), dir,
                  models.back().c_str(), dir);
        if (saved.empty() && !files.empty())
            fatal("-y 1: %s holds %s but no checkpoint to continue from: start over there with --fresh 1 instead of -y 1, or choose "
                  "another -o", dir, name_list(files).c_str());
        return saved;
    }
    if (files.empty() || !trains) return saved;
    if (!a->fresh && !saved.empty())
        fatal("-o %s holds the checkpoints of another run (steps %d to %d): continue it with -y 1, choose another -o, "
              "or add --fresh 1 to delete them and start over", dir, saved.front(), saved.back());
    if (!a->fresh)
        fatal("-o %s holds the files of another run (%s) but no checkpoint to continue: choose another -o, or add --fresh 1 to "
              "delete them and start over%s", dir, name_list(files).c_str(),
              models.empty() ? "" : (" (-e " + std::string(dir) + "/" + models.back() + " starts a new run from its weights)").c_str());
    int n = ckpt_remove_all(dir);
    std::string what = n ? std::to_string(n) + (n == 1 ? " checkpoint: " : " checkpoints: ") : "";
    printf("tp: --fresh 1: deleted the earlier run's files in %s (%s%s)\n", dir, what.c_str(), name_list(files).c_str());
    return {};
}

// -e DIR/model_N.bin of a tp checkpoint with its state file beside it (the same folder and step): the model
// file must match the checksum there. Process 0, before the weights are read.
static void model_verify_beside(const char* model) {
    std::string path = model;
    size_t slash = path.rfind('/');
    std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
    const char* base = model + (slash == std::string::npos ? 0 : slash + 1);
    int step, len = 0;
    if (sscanf(base, "model_%d.bin%n", &step, &len) != 1 || base[len] != '\0') return;
    std::string state = ckpt_path(dir.c_str(), "state", step);
    FILE* sf = fopen(state.c_str(), "rb");
    if (!sf) return;  // a model file alone: llm.c's format has no checksum of its own
    StateHeader h;
    bool ok = state_header_read(sf, &h);
    fclose(sf);
    if (!ok || h.version < 4) return;
    FILE* mf = fopen(model, "rb");
    if (!mf) return;  // setup_model_shape reports it
    std::string why = model_check(mf, path, &h);
    fclose(mf);
    if (!why.empty())
        fatal("-e %s: %s, against the checksum in %s beside it: give an earlier checkpoint of that run, or restore the file from a copy",
              model, why.c_str(), state.c_str());
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
    if (a->val) run->val_shards = token_files(a->val, "val", replica_tokens + 1);  // -i alone: -v 0, no val data
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

// The embedded corpus (no -i): the vocab its tokens need against the model's, before anything is allocated
static void embedded_setup(Run* run) {
    const Args* a = &run->args;
    const GPTConfig* c = &run->cfg;
    int words = (int)grammar_vocab().size();
    if (a->corpus == CORPUS_WORDS && c->V < words)
        fatal("the embedded corpus has %d word tokens and needs a vocab of at least %d, the model has %d: give --corpus bytes "
              "to train it on the corpus's bytes (vocab 256), or a model of vocab %d or more", words, words, c->V, words);
    if (c->V < 256) fatal("the embedded corpus as bytes needs a vocab of at least 256, the model has %d", c->V);
    run->data_bytes = a->corpus == CORPUS_BYTES;
    run->val_batches = a->val_batches;
}

// Its tokens and floor: 4M word tokens (about 18 MB of text) or 16 MB of bytes of train text, the same for
// any flags, so that a resumed run sees the same data; the val text grows with the val batches of all
// replicas. Words and bytes are the same sentences (data/grammar.h).
static void embedded_generate(Run* run) {
    const Args* a = &run->args;
    size_t val_tokens = (size_t)a->val_batches * a->B * a->T * run->Dg + 1;
    if (a->corpus == CORPUS_WORDS) {
        grammar_generate_tokens(1, 4L << 20, &run->corpus_train, nullptr);
        grammar_generate_tokens(2, val_tokens, &run->corpus_val, nullptr);
        run->floor_nats = grammar_entropy_per_token();
        return;
    }
    std::string text;
    grammar_generate(1, 16L << 20, &text, nullptr);
    run->corpus_train.assign(text.begin(), text.end());
    text.clear();
    grammar_generate(2, val_tokens, &text, nullptr);
    run->corpus_val.assign(text.begin(), text.end());
    run->floor_nats = grammar_entropy_per_byte();
}

// Whether the run reads the embedded corpus as words: no -i, --corpus words, and training (or resuming a
// run, which may only sample). -x 0 of a descriptor reads no data: its model is byte-level, vocab 256.
static bool embedded_words(const Run* run) {
    const Args* a = &run->args;
    return !a->train && a->corpus == CORPUS_WORDS && (!run->sample_only || run->resuming);
}

// The tokenizer: --tokenizer FILE, else a tokenizer file found next to -i, next to -e or in -o
// (tokenizer_find), else the embedded corpus's words for a run on them. Every process reads it, as a BPE
// tokenizer sets a new model's vocab; process 0 keeps a copy in -o (tokenizer.json, or the words as
// tokenizer.bin), so the run folder samples and exports on its own. A new model (a descriptor) with no
// --vocab that reads no data, -x 0, takes a BPE tokenizer's vocab here, so that its prompt encodes.
static void tokenizer_setup(Run* run, bool first, bool descriptor) {
    const Args* a = &run->args;
    Tokenizer* tk = &run->tokenizer;
    std::string where = "--tokenizer";
    std::string path = a->tokenizer ? a->tokenizer : tokenizer_find(a->train, run->model_file.empty() ? a->model : run->model_file.c_str(), a->outdir, &where);
    if (!path.empty()) {
        tokenizer_read(tk, path.c_str());
        tk->from = where;
    } else if (embedded_words(run)) {
        tokenizer_words(tk);
    }
    if (tk->bpe && descriptor) {  // a new model beside a BPE tokenizer: its vocab is the tokenizer's
        int n = (int)tk->pieces.size();
        if (a->vocab && a->vocab != n)
            fatal("--vocab %d disagrees with tokenizer %s (%s, vocab %d): drop --vocab, and the new model takes the tokenizer's",
                  a->vocab, path.c_str(), where.c_str(), n);
        if (!a->vocab && !a->train && !run->sample_only)
            fatal("tokenizer %s (%s) is a BPE tokenizer, but with no -i the run trains on the embedded corpus, tp's own %s and not text "
                  "it tokenized: give -i with the data prepare.py made with it, or drop --tokenizer", path.c_str(), where.c_str(),
                  a->corpus == CORPUS_WORDS ? "words" : "bytes");
        if (!a->vocab && run->sample_only) {  // (with -i, data_setup sets it)
            run->cfg.V = n;
            run->cfg.Vp = round_up(n, 128);
            run->vocab_from = "from tokenizer " + path + ", " + where;
        }
    }
    if (first && a->outdir && !run->sample_only && tk->bpe) tokenizer_copy(path, a->outdir);
    if (first && a->outdir && !run->sample_only && tk->words) tokenizer_write_bin(tk, (std::string(a->outdir) + "/tokenizer.bin").c_str());
}

// ----------------------------------------------------------------------------
// prompts: the one place text becomes tokens

// text -> tokens for this model (--prompt, --prompts, --chat): a BPE tokenizer.json's tokens, the embedded
// corpus's words, or bytes for a byte-level model (vocab 256, or byte-level data). llm.c's tokenizer file
// only decodes, and other vocabs have no encoder: false, with why saying so and what to do.
static bool encode_prompt(const Run* run, const std::string& text, std::vector<int>* out, std::string* why) {
    const Tokenizer* tk = &run->tokenizer;
    const GPTConfig* c = &run->cfg;
    out->clear();
    if (tk->bpe) {
        *out = bpe_encode(&tk->merges, text);
    } else if (tk->words) {
        if (!grammar_encode(text, out, why)) return false;
    } else {
        bool gpt2_tokens = !tk->pieces.empty() && !tokenizer_is_bytes(tk);
        bool bytes = !gpt2_tokens && (c->V <= 256 || run->data_bytes);
        if (gpt2_tokens) {
            *why = "tokenizer " + tk->path + " (llm.c's format) only decodes: give the model's BPE tokenizer.json with --tokenizer "
                   "(Hugging Face's GPT-2 has one; prepare.py --vocab N writes one)";
            return false;
        }
        if (!bytes) {
            *why = "prompts are encoded as bytes, which needs a byte-level model (vocab 256); this model has vocab " + std::to_string(c->V) +
                   " and no BPE tokenizer.json: give its tokenizer with --tokenizer, or train on byte-level data (tp then picks vocab 256)";
            return false;
        }
        for (unsigned char ch : text) out->push_back(ch);
    }
    for (int t : *out)
        if (t < 0 || t >= c->V) {
            *why = "the prompt holds token " + std::to_string(t) + ", beyond this model's vocab of " + std::to_string(c->V);
            return false;
        }
    if (out->empty()) {
        *why = "the prompt is empty";
        return false;
    }
    return true;
}

// The prompt of the samples: --prompt through encode_prompt; without it, the tokenizer's end-of-text token,
// or a newline where the model reads text (bytes, the embedded corpus's words: a sentence starts there)
static void prompt_setup(Run* run) {
    const Args* a = &run->args;
    const GPTConfig* c = &run->cfg;
    const Tokenizer* tk = &run->tokenizer;
    std::string why;
    if (a->prompt) {
        if (!encode_prompt(run, a->prompt, &run->prompt, &why)) fatal("--prompt: %s", why.c_str());
        return;
    }
    bool gpt2_tokens = !tk->pieces.empty() && !tokenizer_is_bytes(tk);
    bool bytes = !gpt2_tokens && (c->V <= 256 || run->data_bytes);
    if (tk->bpe) run->prompt = tk->eot >= 0 ? std::vector<int>{tk->eot} : bpe_encode(&tk->merges, "\n");
    else if (tk->words) grammar_encode("\n", &run->prompt, &why);
    else if (bytes) run->prompt.push_back('\n');
    else if (tk->eot >= 0 && tk->eot < c->V) run->prompt.push_back(tk->eot);
    else {  // no end-of-text token: the tokenizer's newline if it has one, else the last id (llm.c's GPT-2 ends with its eot)
        auto nl = std::find(tk->pieces.begin(), tk->pieces.end(), std::string("\n"));
        run->prompt.push_back(nl != tk->pieces.end() && nl - tk->pieces.begin() < c->V ? (int)(nl - tk->pieces.begin()) : c->V - 1);
    }
}

// ----------------------------------------------------------------------------
// devices, the grid and its communicator groups

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
            run->gpu_bf16 = prop.major >= 8;
            // dense TF32 tensor-core peaks (the fp32 training here runs its matmuls in TF32)
            if (strstr(prop.name, "H100") || strstr(prop.name, "H200") || strstr(prop.name, "H800")) run->peak_flops = 494.7e12;
            else if (strstr(prop.name, "A100") || strstr(prop.name, "A800")) run->peak_flops = 156e12;
        }
    }
    return ngpu;
}

// --bf16-gemm: the path of a bf16 run's CPU matmuls (common/bf16.h), refused where this CPU lacks it
static void bf16_gemm_setup(int gemm) {
    if (gemm == BF16_GEMM_DP && !bf16_dp_supported())
        fatal("--bf16-gemm vdpbf16ps: this CPU (or a build without AVX-512) has no AVX512-BF16: use --bf16-gemm fma or auto");
    if (gemm == BF16_GEMM_AMX && !bf16_amx_supported())
        fatal("--bf16-gemm amx: this CPU (or a build without AVX-512) has no AMX-BF16, or Linux does not let tp use it (a "
              "kernel older than 5.16): use --bf16-gemm auto");
    bf16_path = gemm == BF16_GEMM_DP ? BF16_DP : gemm == BF16_GEMM_FMA ? BF16_FMA : gemm == BF16_GEMM_AMX ? BF16_AMX : BF16_AUTO;
}

// --dtype auto (the default), where no llm.c model file (-e) decided it: bf16 where the hardware has bf16
// arithmetic, a GPU of sm_80 and newer or a CPU with AVX512-BF16, fp32 elsewhere. (The bits of a bf16 run do
// not depend on it: a CPU without AVX512-BF16 computes the same ones with fp32 fmas, only slower; README, bf16.)
// A run resumed from a state file that saved no --dtype was trained by a tp that had only fp32.
static void dtype_setup(Run* run) {
    Args* a = &run->args;
    if (a->dtype == DTYPE_AUTO) {
        bool hardware = run->device == DEV_CUDA ? run->gpu_bf16 : bf16_dp_supported();
        a->dtype = hardware && !run->resuming ? DTYPE_BF16 : DTYPE_FP32;
        run->dtype_default = !run->resuming;
    }
    procs_share(&a->dtype, a->timeout);  // process 0's hardware decides for all
}

// The data-parallel side of the grid: replicas in this process and in all, and the micro-steps of -d.
static void grid_setup(Run* run) {
    const Args* a = &run->args;
    run->D = a->dp;
    // Under mpirun the processes take a replica's pipeline stages first (PP between servers): a replica
    // spans gcd(processes, S) of them, and the processes beyond make more replicas (DP between replicas).
    int S = run->sample_only ? 1 : std::max(1, a->pp);
    run->Sp = std::gcd(g_procs.n, S);
    run->Dg = a->dp * g_procs.n / run->Sp;
    long micro_tokens = (long)a->B * a->T * run->Dg;  // one micro-batch of every replica
    run->accum = 1;
    if (a->total_batch && a->total_batch % micro_tokens != 0)
        fatal("-d %ld is not a multiple of the tokens one micro-step of all replicas takes (-b %d x -t %d x %d replica%s = %ld): "
              "give -d %ld, %ld, ...", a->total_batch, a->B, a->T, run->Dg, run->Dg > 1 ? "s" : "", micro_tokens, micro_tokens,
              2 * micro_tokens);
    if (a->total_batch) run->accum = (int)std::min(a->total_batch / micro_tokens, 1L << 30);
}

// the tokens of one optimizer step: B x T in each of the accum micro-batches of every replica
static double step_tokens(const Run* run) { return (double)run->args.B * run->args.T * run->accum * run->Dg; }

// the GPU of thread (d, r) (of pipeline stage `stage`) of this process: the processes on one machine take
// consecutive blocks of its GPUs, and a replica's stages consecutive blocks of P
static int rank_gpu(const Run* run, int d, int r, int stage = 0) {
    int ranks = run->D * run->Sl * run->P;
    return (g_procs.node_me * ranks + (d * run->Sl + stage - run->S0) * run->P + r) % run->ngpu;
}

// How a boundary tensor goes from stage to stage, for the startup lines: what ranks_setup's pipeline
// groups make comm_send do (GPU to GPU where a process's stages of one TP rank are on distinct GPUs).
static const char* pp_boundary_path(const Run* run) {
    bool procs = run->Sp > 1, nccl = false;
    if (run->device == DEV_CUDA && run->Sl > 1) {
        std::vector<int> gpus(run->Sl);
        for (int sl = 0; sl < run->Sl; sl++) gpus[sl] = rank_gpu(run, 0, 0, run->S0 + sl);
        nccl = gpus_distinct(gpus.data(), run->Sl);
    }
    if (run->device != DEV_CUDA) return procs ? "through host memory, over MPI between processes" : "through host memory";
    if (nccl) return procs ? "GPU to GPU over NCCL send/recv inside a process, through host memory and MPI between processes"
                           : "GPU to GPU over NCCL send/recv (each stage's TP rank r on a GPU of its own)";
    return procs ? "through host memory, over MPI between processes" : "through host memory (the stages' TP rank r share a GPU)";
}

// The communicator groups of the grid for run->P ranks x run->D local replicas, and the threads per rank.
// Every process creates its groups in the same order (the spanning ones make MPI communicators).
static void ranks_setup(Run* run) {
    int S = run->S, Sl = run->Sl, S0 = run->S0, Sp = run->Sp, P = run->P, D = run->D;
    int ranks = P * D * Sl;  // in this process
    run->threads = run->args.threads ? run->args.threads : std::max(1, cpu_cores() / (ranks * g_procs.node_n));
    double timeout = run->args.timeout;
    run->tp_groups = new CommGroup[D * Sl];
    for (int d = 0; d < D; d++)
        for (int sl = 0; sl < Sl; sl++) {
            comm_group_init(&run->tp_groups[d * Sl + sl], P, timeout);
            if (S > 1) snprintf(run->tp_groups[d * Sl + sl].label, sizeof(run->tp_groups[0].label), "stage %d", S0 + sl);
            // NCCL needs one GPU per rank; more ranks than GPUs share them through the shared-memory backend
            if (run->device != DEV_CUDA || P == 1) continue;
            std::vector<int> gpus(P);
            for (int r = 0; r < P; r++) gpus[r] = rank_gpu(run, d, r, S0 + sl);
            if (gpus_distinct(gpus.data(), P)) comm_nccl_init_all(&run->tp_groups[d * Sl + sl], gpus.data());
        }
    // The pipeline of each TP rank of each replica, and with several stages its first and last stage; on
    // distinct GPUs NCCL carries their sums (the gradient norm, wte's gradient). When the stages are spread
    // over processes (Sp > 1), process p holds stages (p % Sp) Sl .. + Sl - 1 of replica p / Sp: the
    // pipeline spans the Sp processes of its replica, and the first and last stage's group the two ends.
    run->pp_groups = new CommGroup[D * P];
    run->emb_groups = S > 1 ? new CommGroup[D * P] : nullptr;
    int sp = g_procs.me % Sp, replica = g_procs.me / Sp;
    bool ends = sp == 0 || sp == Sp - 1;
    for (int d = 0; d < D; d++)
        for (int r = 0; r < P; r++) {
            int i = d * P + r;
            CommGroup *pp = &run->pp_groups[i], *emb = run->emb_groups ? &run->emb_groups[i] : nullptr;
            comm_group_init(pp, Sl, timeout);
            snprintf(pp->label, sizeof(pp->label), "the stages' TP rank %d", r);
            if (emb) {
                comm_group_init(emb, Sp > 1 ? 1 : 2, timeout);
                snprintf(emb->label, sizeof(emb->label), "stages 0 and %d, TP rank %d", S - 1, r);
            }
            if (Sp > 1) {
                comm_group_span_some(pp, replica, sp);
                comm_group_span_some(emb, ends ? replica : -1, sp);
            }
            if (run->device != DEV_CUDA || S == 1) continue;
            std::vector<int> gpus(Sl);
            for (int sl = 0; sl < Sl; sl++) gpus[sl] = rank_gpu(run, d, r, S0 + sl);
            int tied[2] = {gpus[0], gpus[Sl - 1]};  // the first and the last stage's GPUs, or this end's
#ifdef TP_MPI
            if (Sp > 1) {  // across processes only NCCL (it checks that the GPUs are distinct)
                comm_nccl_init_procs(pp, gpus.data());
                comm_nccl_init_p2p(pp, gpus.data());  // the neighbours in this process, GPU to GPU
                if (ends) comm_nccl_init_procs(emb, sp == 0 ? &tied[0] : &tied[1]);
                continue;
            }
#endif
            if (gpus_distinct(gpus.data(), S)) {  // the boundary tensors GPU to GPU, the stages' sums on NCCL
                comm_nccl_init_all(pp, gpus.data());
                comm_nccl_init_p2p(pp, gpus.data());
            }
            if (gpus_distinct(tied, 2)) comm_nccl_init_all(emb, tied);
        }
    run->dp_groups = nullptr;
    if (run->Dg > 1) {
        run->dp_groups = new CommGroup[Sl * P];
        for (int i = 0; i < Sl * P; i++) {
            CommGroup* g = &run->dp_groups[i];
            comm_group_init(g, run->D, timeout);
            if (Sp > 1) comm_group_span_some(g, sp, replica);  // the processes that hold the same stages
            else comm_group_span(g);
            if (run->device != DEV_CUDA) continue;
            std::vector<int> gpus(run->D);
            for (int d = 0; d < run->D; d++) gpus[d] = rank_gpu(run, d, i % P, S0 + i / P);  // TP rank i % P of local stage i / P
#ifdef TP_MPI
            if (g->nproc > 1) {  // across processes only NCCL (it checks that the GPUs are distinct)
                comm_nccl_init_procs(g, gpus.data());
                continue;
            }
#endif
            if (run->D > 1 && gpus_distinct(gpus.data(), run->D)) comm_nccl_init_all(g, gpus.data());
        }
    }
    run->world = new CommGroup;
    comm_group_init(run->world, ranks, timeout);
    comm_group_span(run->world);
}

// releases what ranks_setup made, in the same order on every process
static void ranks_teardown(Run* run) {
    for (int i = 0; run->Sp > 1 && i < run->D * run->P; i++) {
        comm_group_free(&run->pp_groups[i]);
        if (run->emb_groups) comm_group_free(&run->emb_groups[i]);
    }
    for (int i = 0; run->dp_groups && i < run->Sl * run->P; i++) comm_group_free(&run->dp_groups[i]);
    comm_group_free(run->world);
    delete[] run->tp_groups;
    delete[] run->dp_groups;
    delete[] run->pp_groups;
    delete[] run->emb_groups;
    delete run->world;
    run->tp_groups = run->dp_groups = run->pp_groups = run->emb_groups = run->world = nullptr;
}

// -y 1: the newest checkpoint in dir whose files verify (whole, and matching the checksums in the state
// file). A damaged one is named in a warning and the one before it is taken; with none left the run is
// refused, saying what is damaged and what to do. Process 0; says how long verifying took.
static int resume_pick(const char* dir, const std::vector<int>& saved) {
    double t0 = comm_now();
    std::string damaged;      // "step 6: model_00000006.bin does not match its checksum; step 4: ..."
    int ndamaged = 0;
    int verified_model = -1;  // the newest step whose model file verified, though its state file did not
    for (int i = (int)saved.size() - 1; i >= 0; i--) {
        CkptCheck ck = ckpt_verify(dir, saved[i]);
        if (ck.model_ok && ck.state_ok) {
            if (ndamaged)
                fprintf(stderr, "warning: damaged checkpoint%s in %s not used (%s): resuming from step %d, the newest checkpoint that verifies\n",
                        ndamaged > 1 ? "s" : "", dir, damaged.c_str(), saved[i]);
            printf("tp: checkpoint of step %d %s in %.2f s\n", saved[i],
                   ck.summed ? "verified against its checksums" : "has no checksums (an older tp wrote it): sizes checked", comm_now() - t0);
            return saved[i];
        }
        if (ck.model_ok && ck.summed && verified_model < 0) verified_model = saved[i];
        damaged += (damaged.empty() ? "step " : "; step ") + std::to_string(saved[i]) + ": " + ck.why;
        ndamaged++;
    }
    std::string hint = "restore the files from a copy, or start over in " + std::string(dir) + " with --fresh 1 instead of -y 1";
    if (verified_model >= 0)
        hint = "start a new run from the weights of step " + std::to_string(verified_model) + " (they verify) with -e " +
               ckpt_path(dir, "model", verified_model) + " and another -o, or " + hint;
    fatal("-y 1: no checkpoint in %s verifies, every one is damaged (%s): %s", dir, damaged.c_str(), hint.c_str());
}
