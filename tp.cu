// tp.cu: main, in llm.c's order: what a run holds, its setup, one training step, the loop every rank
// thread runs, and main. The model and its tensor-parallel recipe are in gpt.cu (every collective is
// there), the collectives in comm.cuh, the ops in kernels_cpu.h (CPU) and kernels.cuh (CUDA); token files
// and the loader in data/; flags, setup pieces, printing, checkpoints, sampling, the log and the sweep in
// train/.
//
// The ranks form a grid: D data-parallel replicas of the model, each split over P tensor-parallel ranks.
// A process runs --dp replicas (D x P threads, thread (d, r) is TP rank r of local replica d); under
// mpirun every process runs as many, so the replicas are processes x --dp. A TP group never leaves its
// process; the DP group of TP rank r (rank r of every replica) may span processes.
//
//   make && ./tp                       train the default model on the embedded corpus
//   ./tp -e d12 -i 'train*.bin' -j val.bin --tp 4     GPT-2 124M over 4 ranks
//   mpirun -np 2 ./tp ... --tp 8       two machines of 8 GPUs: TP inside each, DP between them
//
// Contents:
//   the run          Run (what the rank threads share), RankRun (what one thread holds), StepStats
//   setup            run_setup: the phases from the command line to the communicator groups
//   the step         train_step: forward and backward of each micro-batch, then the update
//   the loop         rank_main: evaluations, steps, checkpoints, samples, Ctrl-C; one thread per rank
//   main             tp_main: parse, set up, start the rank threads (or the sweep)
#include <algorithm>
#include <atomic>
#include <csignal>
#include <numeric>
#include <thread>
#include "gpt.cu"
#include "data/grammar.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "train/flags.h"
#include "train/checkpoint.h"
#include "train/logger.h"
#include "train/sampler.h"

// ----------------------------------------------------------------------------
// the run

struct Run {
    Args args;
    GPTConfig cfg;
    int P;                        // tensor-parallel ranks per replica
    int D;                        // data-parallel replicas in this process (--dp)
    int Dg;                       // replicas in all processes: D x processes
    int S = 1;                    // pipeline stages per replica (--pp): S x P ranks make a replica
    int Sp = 1;                   // processes one replica's stages span (under mpirun: gcd(processes, S))
    int S0 = 0, Sl = 1;           // this process's stages: Sl consecutive ones from stage S0 (Sl = S / Sp)
    std::vector<std::vector<CommSpan>> stage_spans;  // Sp > 1: what each process of replica 0's pipeline
                                                     // holds of the full tensors, for checkpoints and samples
    int pp_schedule = 0;          // PP_1F1B (0) or PP_GPIPE (--pp-schedule)
    int accum;                    // micro-batches per optimizer step (-d)
    int device;                   // DEV_CPU or DEV_CUDA
    int threads;                  // OpenMP threads per rank (CPU)
    int ngpu;                     // CUDA devices visible to this process
    double peak_flops;            // dense TF32 peak of one GPU, for MFU (0: unknown)
    bool gpu_bf16;                // the GPU has bf16 tensor cores (sm_80 and newer)
    bool dtype_default;           // --dtype was decided by the hardware (dtype_setup), not given or read
    CommGroup* tp_groups;         // (D Sl) the tensor-parallel group of local stage s of local replica d, [d Sl + s]: its P ranks
    CommGroup* dp_groups;         // (Sl P) the data-parallel group of TP rank r of local stage s, [s P + r]: that rank of
                                  // every replica, in every process (null with one replica)
    CommGroup* pp_groups;         // (D P) the pipeline group of TP rank r of local replica d, [d P + r]: its S stages,
                                  // Sl in each of the Sp processes that hold them
    CommGroup* emb_groups;        // (D P) the same replica's and rank's first and last stage (null with one stage)
    CommGroup* world;             // every rank of the run, in every process: the mean loss, the decision to
                                  // stop, weight checksums, barriers
    std::vector<float> init;      // the full initial parameters: each rank slices its shard out of them,
                                  // and later gathers its shard back into them to write a checkpoint
    std::vector<uint16_t> corpus_train, corpus_val;  // the embedded corpus, when no -i/-j
    double floor_nats;            // its entropy per token (word or byte), the loss floor (0 if unknown)
    std::vector<TokenShard> train_shards, val_shards;  // -i and -j, every token checked against the vocab
    bool data_bytes;              // every token of the data is below 256: byte-level
    int val_batches;              // -m, at most the batches the val data holds
    std::string vocab_from;       // where the vocab size came from, for the startup line
    std::string model_file;       // the checkpoint the weights come from (empty: drawn from --seed)
    Tokenizer tokenizer;
    std::vector<int> prompt;
    std::vector<std::vector<int>> prompts;  // --prompts FILE: one per line, generated together
    std::vector<std::string> prompt_texts;
    Checkpoints ckpt;             // -o DIR
    bool resuming;                // -y 1 found a checkpoint: start from it
    bool sample_only;             // -x 0, or -y 1 on a finished run: load, print a sample, exit
    int start_step;
    int saved_step;               // -y 1: the newest checkpoint in -o (-1: none)
    TrainState state;             // what the resume restores besides the weights
    Logger log;                   // -o DIR: DIR/log.csv
    bool stop_now;                // sampling (replica 0 alone): written by its rank 0 between two barriers
};

// what one rank thread works with: its rank (device, communicators), its shard of the model, its loaders,
// and its handle on the world group
struct RankRun {
    Rank rk;
    GPT m;
    DataLoader train, val;
    Comm world;
    float last_val;  // the val loss measured before the current step (NaN: none), for log.csv
};

// what one training step measured on one rank
struct StepStats {
    float loss, norm, lr;
    bool stop;            // a rank of the run got SIGINT or SIGTERM: every rank stops after this step
    double seconds;       // the whole step
    double comm_seconds;  // of it, inside the TP group's collectives
    double comm_moved[COMM_KINDS];  // the payload of the rank's TP collectives, by kind (floats)
    double dp_seconds;    // inside the DP group's collectives
    double dp_moved[COMM_KINDS];    // the payload of its DP collectives, by kind
    double pp_seconds;    // waiting on the other pipeline stages (the bubble): for a neighbour's activations or
                          // gradient, and in the step's sums over the stages (the norm, the tied wte), where a
                          // stage that finished its micro-batches first waits for the others
    double pp_bytes;      // bytes sent to the neighbouring stages (the stream forward: bf16 in a bf16 run)
};

#include "train/pipeline.h"
#include "train/setup.h"
#include "train/report.h"

// ----------------------------------------------------------------------------
// setup: run_setup takes these phases in order, from the command line to the communicator groups.
// Process 0 alone reads the output directory and the model file (under mpirun they may be on its machine
// only); each phase that reads ends with procs_share, which hands every process what process 0 read.

// The output directory, and what a resume finds there: the newest checkpoint's step, the model's shape
// and the run's saved flags, which fill in every flag the command line did not give.
static void setup_resume(Run* run) {
    Args* a = &run->args;
    bool first = g_procs.me == 0;
    std::vector<int> saved = a->outdir && first ? outdir_setup(a) : std::vector<int>();
    run->saved_step = -1;
    if (first && a->resume && saved.empty()) printf("tp: -y 1 but no checkpoint in %s yet: starting a new run there\n", a->outdir);
    if (first && a->resume && !saved.empty()) run->saved_step = resume_pick(a->outdir, saved);
    if (first && run->saved_step >= 0) {
        run->model_file = ckpt_path(a->outdir, "model", run->saved_step);
        model_read(run->model_file.c_str(), &run->cfg, nullptr);
        state_read(a->outdir, run->saved_step, gpt_num_params(&run->cfg), false, &run->state);
    }
    procs_share(&run->saved_step, a->timeout);
    if (run->saved_step < 0) return;
    procs_share(&run->cfg, a->timeout);
    procs_share(&run->state.h, a->timeout);
    procs_share(&run->state.flags, a->timeout);
    std::string changed;
    if (run->state.flags.empty()) {
        if (first) printf("tp: the state file in %s is from an older tp that did not save the run's flags: using the flags given\n", a->outdir);
    } else {
        changed = args_resume(a, run->state.flags, a->outdir);
    }
    if (first) resume_model_check(a, &run->cfg);
    run->resuming = true;
    run->start_step = (int)run->state.h.step;
    run->vocab_from = "the checkpoint's";
    if (a->max_steps > 0 && run->start_step > a->max_steps)
        fatal("the run in %s is at step %d already: give -x larger than %d to train further, or -x 0 to sample from it",
              a->outdir, run->start_step, run->start_step);
    if (first && a->max_steps > run->start_step) printf("tp: resuming from %s at step %d\n", run->model_file.c_str(), run->start_step);
    if (first && !changed.empty())
        printf("tp: %s with changed flags:%s\n", a->max_steps > run->start_step ? "continuing" : "sampling", changed.c_str());
}

// What the run does (train, or only sample) and its data-parallel side: the replicas in this process and
// in all, the micro-steps of -d; a resume must keep the global batch.
static void setup_schedule(Run* run) {
    const Args* a = &run->args;
    check_data_flags(a);
    // the one rule of -r 3: it recomputes the probabilities the matmul attention keeps; fused keeps none
    if (a->recompute >= 3 && a->attention)
        fatal("-r 3 recomputes the attention probabilities, which fused attention (the default) never keeps: "
              "use -r 2, or --attention matmul -r 3");
    run->sample_only = a->max_steps == 0 || a->chat || (run->resuming && run->start_step == a->max_steps);
    if (run->sample_only && a->gen_tokens == 0) fatal("-x 0 prints a sample and trains nothing, but -g 0 asks for no tokens: give -g N");
    if (a->sweep && g_procs.n > 1) fatal("--sweep times replicas inside one process (--dp): start it without mpirun");
    grid_setup(run);
    if (run->resuming && !run->sample_only) global_batch_check(&run->state.h, a->B, a->T, run->Dg, run->accum);
}

// The model's shape: a descriptor, or a model file's header (process 0 reads it). A resume has it already.
// Returns whether it is a descriptor (its vocab then follows the data).
static bool setup_model_shape(Run* run) {
    const Args* a = &run->args;
    GPTConfig* c = &run->cfg;
    bool descriptor = false;
    if (!run->resuming) {
        std::string why;
        const char* model = a->model ? a->model : "L2C128H4";
        int words = (int)grammar_vocab().size();
        descriptor = gpt_descriptor(model, c, a->vocab ? a->vocab : embedded_words(run) ? words : 256, a->maxT, &why);
        if (descriptor) {
            if (a->vocab) run->vocab_from = "from --vocab";
            else if (embedded_words(run)) run->vocab_from = "the embedded corpus's words";
            else if (!a->train && !run->sample_only) run->vocab_from = "the embedded corpus as bytes";
        } else if (g_procs.me == 0) {
            struct stat st;
            if (!why.empty() && stat(model, &st) != 0) fatal("-e %s: %s", model, why.c_str());
            if (stat(model, &st) != 0)
                fatal("-e %s is neither a readable checkpoint file nor a descriptor (d1..d12, d24, d36, d48, or L<layers>C<channels>H<heads> like L4C128H4)", model);
            if (S_ISDIR(st.st_mode)) fatal("-e %s%s", model, model_dir_why(model).c_str());
            int version = 3;
            model_read(model, c, nullptr, &version);
            // llm.c's GPU trainer saves bf16: the run takes the file's precision unless --dtype says otherwise
            // (so an llm.c parity command line, with its version 3 file, computes llm.c's fp32 numbers)
            Args* args = &run->args;
            bool given = args->dtype != DTYPE_AUTO;
            if (!given) args->dtype = version == 5 ? DTYPE_BF16 : DTYPE_FP32;
            if (version == 5)
                printf("tp: %s holds bf16 weights (llm.c version 5): widened exactly into fp32 master weights; %s\n", model,
                       args->dtype == DTYPE_BF16 ? (given ? "--dtype bf16" : "computing in bf16 as the file is (--dtype fp32 for fp32)")
                                                 : "--dtype fp32: computing in fp32");
            else  // said too: on a CPU or GPU whose default is bf16, this is why the run computes in fp32
                printf("tp: %s holds fp32 weights (llm.c version 3): the fp32 master weights as they are; %s\n", model,
                       args->dtype == DTYPE_FP32 ? (given ? "--dtype fp32" : "computing in fp32 as the file is (--dtype bf16 for bf16)")
                                                 : "--dtype bf16: computing in bf16 from a rounded copy of them");
            model_verify_beside(model);
            run->model_file = model;
            run->vocab_from = "the checkpoint's";
            if (a->vocab && a->vocab != c->V)
                fatal("--vocab %d disagrees with checkpoint %s (vocab %d): drop --vocab", a->vocab, model, c->V);
        }
    }
    tokenizer_setup(run, g_procs.me == 0, descriptor);
    procs_share(c, a->timeout);
    procs_share(&run->args.dtype, a->timeout);  // process 0 read the file that may have set it
    // a default -t longer than the model allows adapts to it (said); a -t the user gave is refused in setup_data
    Args* args = &run->args;
    if (args->T > c->maxT && !args->given[flag_find("-t") - g_flags]) {
        if (g_procs.me == 0) printf("tp: the model's maximum sequence length is %d: using -t %d instead of the default %d\n", c->maxT, c->maxT, args->T);
        args->T = c->maxT;
        grid_setup(run);  // -d's micro-steps follow the tokens of a micro-batch
    }
    return descriptor;
}

// The data: token files read through once (the vocab of a descriptor follows them), or the embedded
// corpus; then process 0's vocab on every process, so that every process builds the same model.
static void setup_data(Run* run, bool descriptor) {
    const Args* a = &run->args;
    GPTConfig* c = &run->cfg;
    bool embedded = a->train == nullptr;
    if (!run->sample_only && !embedded) data_setup(run, descriptor);
    if (!run->sample_only && embedded) embedded_setup(run);
    procs_share(c, a->timeout);
    if (a->T > c->maxT) fatal("sequence length -t %d exceeds the model's maximum %d: use -t %d or less", a->T, c->maxT, c->maxT);
}

// The device and the ranks: by default as many per replica as the GPUs, or cores, of this process's share
// of the machine allow (the largest valid P with P x --dp of them); then whether the run fits.
static void setup_ranks(Run* run) {
    const Args* a = &run->args;
    const GPTConfig* c = &run->cfg;
    int ngpu = device_setup(run);
    dtype_setup(run);
    pp_setup(run);
    int units = std::max(1, (run->device == DEV_CUDA ? ngpu : cpu_cores()) / g_procs.node_n);
    run->P = a->tp;
    if (run->P == 0) {
        run->P = 1;
        for (int p = 1; p * run->D * run->Sl <= units; p++)
            if (tp_valid(c, p)) run->P = p;
    }
    bf16_gemm_setup(a->bf16_gemm);  // --bf16-gemm: the path of a bf16 run's CPU matmuls (common/bf16.h)
    if (a->attention && c->C / c->NH > ATT_HS_MAX)
        fatal("fused attention takes head sizes up to %d, and this model's is %d (C %d / %d heads): use --attention matmul",
              ATT_HS_MAX, c->C / c->NH, c->C, c->NH);
    if (!tp_valid(c, run->P))
        fatal("--tp %d does not divide the model (%d heads, padded vocab %d): valid --tp values are %s", run->P, c->NH, c->Vp,
              tp_valid_list(c).c_str());
    if (a->sp && run->P > 1 && ((long)a->B * a->T) % run->P != 0)
        fatal("--sp 1 splits the %ld tokens of a batch (-b %d x -t %d) over the ranks, and %d ranks do not divide them: "
              "choose -b and -t with B*T a multiple of %d, or use --sp 0", (long)a->B * a->T, a->B, a->T, run->P, run->P);
    if (run->P * run->D * run->Sl > COMM_MAXP)
        fatal("--tp %d x --dp %d x %d stages makes %d ranks in one process, more than the %d it can run: use fewer local replicas "
              "or stages, and more processes (mpirun) for more", run->P, run->D, run->Sl, run->P * run->D * run->Sl, COMM_MAXP);
    std::string why;
    if (!memory_fits(run, run->P, run->D, &why)) fatal("%s", why.c_str());
}

// Now the big allocations: the weights (process 0 reads or draws them) and a resume's optimizer state.
static void setup_weights(Run* run) {
    const Args* a = &run->args;
    GPTConfig* c = &run->cfg;
    bool first = g_procs.me == 0;
    if (first && !run->model_file.empty()) {
        model_read(run->model_file.c_str(), c, &run->init);
    } else {
        run->init.resize(gpt_num_params(c));
        if (first) gpt_init_full(c, (uint64_t)a->seed, run->init.data());
    }
    TrainState* s = &run->state;
    bool resume = run->resuming && !run->sample_only;
    if (first && resume) {
        state_read(a->outdir, run->saved_step, (long)run->init.size(), true, s);
        // a bf16 run's model file holds its weights rounded to bf16; the state file, its fp32 masters
        if (s->h.masters) run->init.swap(s->masters);
        s->masters = std::vector<float>();
    }
    procs_share(&run->init, a->timeout);
    if (!resume) return;
    procs_share(&s->h, a->timeout);
    procs_share(&s->flags, a->timeout);
    procs_share(&s->m, a->timeout);
    procs_share(&s->v, a->timeout);
    procs_share(&s->shard_order, a->timeout);
    procs_share(&s->sample_order, a->timeout);
    procs_share(&s->rng, a->timeout);
}

// What the run writes and prints: the checkpoints of -o (world rank 0 writes them; it runs in process 0),
// the embedded corpus, the tokenizer and the prompt.
static void setup_outputs(Run* run) {
    const Args* a = &run->args;
    bool first = g_procs.me == 0;
    if (a->outdir && !run->sample_only) {
        run->ckpt.dir = a->outdir;
        run->ckpt.keep = a->keep;
        run->ckpt.flags = args_saved(a);
        if (first || g_procs.me < run->Sp) {  // process 0 writes; with stages in other processes they gather too
            run->ckpt.m.resize(run->init.size());
            run->ckpt.v.resize(run->init.size());
        }
    }
    if (!run->sample_only && !a->train) embedded_generate(run);
    // sampling: replica 0 samples, and it runs in process 0
    if (first && !run->tokenizer.path.empty()) tokenizer_check(&run->tokenizer, run->cfg.V);
    if (first) prompt_setup(run);
}

static void run_setup(Run* run) {
    setup_resume(run);
    setup_schedule(run);
    bool descriptor = setup_model_shape(run);
    setup_data(run, descriptor);
    setup_ranks(run);
    setup_weights(run);
    setup_outputs(run);
    ranks_setup(run);
}

// ----------------------------------------------------------------------------
// the step

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

// A rank's thread begins here: TP rank r of pipeline stage `stage` of local replica d on its device, its
// place in the pipeline and the data-parallel group, its shard of the initial model, its loaders (its
// replica's sequences). World rank: (d S + stage) P + r.
static void rank_run_start(RankRun* rr, Run* run, int d, int r, int stage = 0) {
    const Args* a = &run->args;
    int Sl = run->Sl, sl = stage - run->S0, P = run->P;  // sl: the stage among this process's
    rank_init(&rr->rk, &run->tp_groups[d * Sl + sl], r, run->device, run->device == DEV_CUDA ? rank_gpu(run, d, r, stage) : 0,
              run->threads);
    rank_join_pp(&rr->rk, &run->pp_groups[d * P + r], run->emb_groups ? &run->emb_groups[d * P + r] : nullptr, stage);
    if (run->dp_groups) rank_join_dp(&rr->rk, &run->dp_groups[sl * P + r], d);
    comm_init(&rr->world, run->world, (d * Sl + sl) * P + r);
    gpt_build(&rr->m, &rr->rk, &run->cfg, run->init.data(), a->zero);
    rr->m.sp = a->sp;
    rr->m.recompute = a->recompute;
    rr->m.fused = a->attention != 0;
    gpt_set_dtype(&rr->m, &rr->rk, a->dtype == DTYPE_BF16, (uint32_t)a->seed);
    rr->train = rr->val = DataLoader();
    if (run->sample_only) return;  // no data needed
    bool files = a->train != nullptr;
    int g = rr->rk.dp.rank;  // the replica, counted over all processes
    loader_init(&rr->train, "train", a->train, files ? nullptr : &run->corpus_train, a->B, a->T, run->cfg.V, a->shuffle,
                run->Dg, g, run->accum);
    if (!files || a->val)  // -i alone (with -v 0) has no val data
        loader_init(&rr->val, "val", a->val, files ? nullptr : &run->corpus_val, a->B, a->T, run->cfg.V, false, run->Dg, g, 1);
}

static void rank_run_end(RankRun* rr) {
    loader_free(&rr->train);
    loader_free(&rr->val);
    gpt_free(&rr->m, &rr->rk);
    rank_free(&rr->rk);
}

// A value every replica computed for itself (the same on the TP ranks of a replica's last stage, which
// computes the loss), averaged over the replicas, and with it the decision to stop: one all-reduce over the
// world group. TP rank 0 of each replica's last stage contributes; the others add exact zeros, so the sum
// is the replicas' sum in replica order.
static float replicas_mean(Run* run, RankRun* rr, float value, bool* stop, const char* where) {
    bool speaks = rr->rk.rank == 0 && rr->rk.stage == rr->rk.S - 1;
    float x[2] = {speaks ? value : 0.0f, g_signal.load() != 0 ? 1.0f : 0.0f};
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
    double t0 = comm_now(), comm0 = rk->tp.seconds, dp0 = rk->dp.seconds, moved0[COMM_KINDS], dp_moved0[COMM_KINDS];
    for (int k = 0; k < COMM_KINDS; k++) {
        moved0[k] = rk->tp.moved[k];
        dp_moved0[k] = rk->dp.moved[k];
    }
    // each position's loss gradient is 1/(tokens in the global batch): the sum over micro-steps and
    // replicas is then the gradient of the mean loss over the global batch, as one rank would compute it
    m->dloss = 1.0f / (float)step_tokens(run);
    gpt_zero_grad(m, rk);
    double loss = 0.0;
    double pp0 = rk->pp.p2p_seconds + rk->pp.seconds + rk->emb.seconds, pp_sent0 = rk->pp.p2p_sent;
    if (rk->S > 1) {
        loss = pp_micro_steps(run, rr);  // the stages' schedule (train/pipeline.h)
    } else {
        for (int k = 0; k < run->accum; k++) {
            loader_next(&rr->train);
            gpt_forward(m, rk, rr->train.inputs.data(), rr->train.targets.data(), a->B, a->T, true);
            gpt_backward(m, rk);
            if (k < run->accum - 1) loss += gpt_read_loss(m, rk);  // the next micro-step overwrites the losses
        }
    }
    st.lr = lr_at(a, step);
    AdamW opt = {st.lr, a->beta1, a->beta2, 1e-8f, a->wd, a->clip};
    gpt_update(m, rk, &rk->tp, &opt);
    if (rk->S == 1) loss += gpt_read_loss(m, rk);
    st.pp_seconds = rk->pp.p2p_seconds + rk->pp.seconds + rk->emb.seconds - pp0;
    st.pp_bytes = sizeof(float) * (rk->pp.p2p_sent - pp_sent0);
    st.norm = gpt_read_norm(m, rk);
    st.loss = replicas_mean(run, rr, (float)(loss / run->accum), &st.stop, "step loss");
    st.seconds = comm_now() - t0;
    st.comm_seconds = rk->tp.seconds - comm0;
    st.dp_seconds = rk->dp.seconds - dp0;
    for (int k = 0; k < COMM_KINDS; k++) {
        st.comm_moved[k] = rk->tp.moved[k] - moved0[k];
        st.dp_moved[k] = rk->dp.moved[k] - dp_moved0[k];
    }
    if (!std::isfinite(st.loss) || !std::isfinite(st.norm)) {
        if (step == run->start_step)  // no update yet: the weights give it, not the learning rate
            fatal("step %d: the loss (%f) or gradient norm (%f) is not finite before any update: the weights %s%s give it (damaged, or from a diverged run)",
                  step + 1, st.loss, st.norm, run->model_file.empty() ? "drawn from --seed" : "of ", run->model_file.c_str());
        fatal("step %d: the loss (%f) or gradient norm (%f) is not finite; lower the learning rate (-l) or clip (--clip)", step + 1, st.loss, st.norm);
    }
    return st;
}

// ----------------------------------------------------------------------------
// the loop

#include "train/signals.h"

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
        if (rr->rk.S > 1) {  // through the stages; the last has the loss
            pp_forward(rr, val->inputs.data(), val->targets.data(), val->B, val->T, false, i);
            if (m->plan.last) s += gpt_read_loss(m, &rr->rk);
        } else {
            gpt_forward(m, &rr->rk, val->inputs.data(), val->targets.data(), val->B, val->T, false);
            s += gpt_read_loss(m, &rr->rk);
        }
    }
    if (rr->rk.rank == 0) g_phase.store(PHASE_STEP);
    return replicas_mean(run, rr, (float)(s / n), nullptr, "val loss");
}

// Replicas must hold bit-identical weights: every rank's checksum against replica 0's of the same stage
// and TP rank, exchanged over the world group (world rank w is stage and TP rank w % (S P) of replica
// w / (S P)). Returns how many ranks differ; every rank gets the same answer.
static int replicas_differ(Run* run, RankRun* rr, uint64_t* sum0) {
    uint64_t h = gpt_checksum(&rr->m, &rr->rk);
    int W = rr->world.P;
    std::vector<float> all(2L * W);
    float mine[2];
    memcpy(mine, &h, sizeof(h));
    comm_allgather(&rr->world, all.data(), mine, 2, "weight checksums", -1);
    int differ = 0;
    for (int w = 0; w < W; w++) differ += memcmp(&all[2L * w], &all[2L * (w % (run->S * run->P))], sizeof(h)) != 0;
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

#include "train/serve.h"  // generation: print_sample, --prompts, --chat, the decode sweep

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

// The evaluation before a step (every -v steps and at the last): the val line, with the replicas' checksum
// note when there are several. Returns false when a signal cut it short.
static bool eval_step(Run* run, RankRun* rr, int step) {
    const Args* a = &run->args;
    bool last = step == a->max_steps - 1;
    if (a->val_every == 0 || (step % a->val_every != 0 && !last)) return true;
    float vl = evaluate(run, rr, run->val_batches);
    if (std::isnan(vl)) return false;
    char note[96];
    check_replicas(run, rr, step, note, sizeof(note));
    if (rr->world.rank == 0) print_val_line(run, vl, note);
    rr->last_val = vl;
    return true;
}

// One rank thread of the run: TP rank r of pipeline stage `stage` of local replica d, from its first step
// to its last (or a signal).
static void rank_main(Run* run, int d, int r, int stage) {
    const Args* a = &run->args;
    RankRun rr;
    rank_run_start(&rr, run, d, r, stage);
    if (run->sample_only) {  // -x 0, or a finished run: the sample is all there is to do (replica 0's)
        comm_barrier(&rr.world, "start");
        if (a->chat) chat(run, &rr);
        else if (a->gen_tokens > 0) print_sample(run, &rr, run->start_step);
        rank_run_end(&rr);
        return;
    }
    if (run->resuming) {
        gpt_scatter_moments(&rr.m, &rr.rk, run->state.m.data(), rr.m.m_mem);
        gpt_scatter_moments(&rr.m, &rr.rk, run->state.v.data(), rr.m.v_mem);
        rr.m.t = (int)run->state.h.adam_t;
        loader_restore(&rr.train, &run->state);
    }
    comm_barrier(&rr.world, "start");
    bool lead = rr.world.rank == 0;
    StepStats total = {};  // the sums over the timed steps
    int last_saved = run->resuming ? run->start_step : -1;
    for (int step = run->start_step; step < a->max_steps; step++) {
        rr.last_val = NAN;
        if (!eval_step(run, &rr, step)) {  // a signal cut the evaluation short: stop before this step
            stop_run(run, &rr, step, last_saved);
            rank_run_end(&rr);
            return;
        }
        if (a->sample_every > 0 && step > 0 && step % a->sample_every == 0) print_sample(run, &rr, step);
        StepStats st = train_step(run, &rr, step);
        if (step > run->start_step) {  // the first step warms up caches and allocations
            total.seconds += st.seconds;
            total.comm_seconds += st.comm_seconds;
            total.dp_seconds += st.dp_seconds;
            total.pp_seconds += st.pp_seconds;
        }
        // the bytes this rank sent, by kind, as a ring sends them: over its TP group, and over its DP group
        double sent[COMM_KINDS], dp_sent[COMM_KINDS];
        ring_bytes(st.comm_moved, run->P, sent);
        double dp_total = ring_bytes(st.dp_moved, run->Dg, dp_sent);
        if (lead)
            logger_step(&run->log, step + 1, st.loss, rr.last_val, st.lr, st.seconds, step_tokens(run), st.comm_seconds, sent,
                        st.dp_seconds, dp_total, st.pp_seconds, st.pp_bytes);
        if (lead && (print_step(a, step) || step == run->start_step)) print_step_line(run, step, &st, sent, dp_total);
        if (a->outdir && a->ckpt_every > 0 && (step + 1) % a->ckpt_every == 0) {
            checkpoint_save(&run->ckpt, run->init.data(), &rr.m, &rr.rk, &rr.world, &rr.train, step + 1);
            last_saved = step + 1;
            if (d == 0 && r == 0) ckpt_note(a->outdir, last_saved);  // each process's first thread
        }
        // a signal: every rank stops after the same step (the step's world all-reduce carried every rank's flag)
        if (st.stop) {
            stop_run(run, &rr, step + 1, last_saved);
            rank_run_end(&rr);
            return;
        }
    }
    if (a->outdir && last_saved != a->max_steps) {
        checkpoint_save(&run->ckpt, run->init.data(), &rr.m, &rr.rk, &rr.world, &rr.train, a->max_steps);
        if (d == 0 && r == 0) ckpt_note(a->outdir, a->max_steps);
    }
    char note[96];
    check_replicas(run, &rr, a->max_steps, note, sizeof(note));
    int timed = a->max_steps - run->start_step - 1;
    if (lead && timed > 0) print_average_line(run, &total, timed, note);
    if (run->S > 1) pp_report(run, &rr, total.pp_seconds, total.seconds, timed);
    if (a->gen_tokens > 0) print_sample(run, &rr, a->max_steps);
    rank_run_end(&rr);
}

#include "train/sweep.h"

// ----------------------------------------------------------------------------
// main

static int tp_main(int argc, char** argv) {
    Run* run = new Run();
    parse_args(argc, argv, &run->args);
    if (run->args.plan && strcmp(run->args.plan, "0")) {  // --plan: predict, train nothing (train/plan.h)
        int rc = plan_run(run);
        delete run;
        return rc;
    }
    run_setup(run);
    // from here on every error line (and mpirun's ending of the job) names the last good checkpoint
    if (run->args.outdir && !run->sample_only && !run->args.sweep) ckpt_note(run->args.outdir, run->resuming ? run->start_step : 0);
    if (run->args.prompts) prompts_setup(run);
    if (!run->args.sweep) signal_setup(run);  // before the setup is printed: from then on Ctrl-C is handled
    print_setup(run);
    if (run->args.sweep) {
        if (run->sample_only) decode_sweep(run);  // -x 0: the decode sweep
        else sweep(run);
        delete run;
        return 0;
    }
    bool logs = run->args.outdir && !run->sample_only && g_procs.me == 0;  // world rank 0 logs, in process 0
    if (logs) logger_open(&run->log, run->args.outdir, run->resuming ? run->start_step : -1);
    std::vector<std::thread> threads;
    for (int d = 0; d < run->D; d++)
        for (int stage = run->S0; stage < run->S0 + run->Sl; stage++)
            for (int r = 0; r < run->P; r++) threads.emplace_back(rank_main, run, d, r, stage);
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
