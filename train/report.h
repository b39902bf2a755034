// train/report.h (needs the model and tp.cu's Run): everything a run prints about itself: the startup
// tables (the model, the grid and which rank runs where, the shard plan, the memory per rank, the
// communication per step, the data) and the step and average lines of training. Process 0 prints; world
// rank 0 prints the step lines.
#pragma once
#include <climits>
#include <cstdlib>
#include <string>
#include <vector>

// the bytes a rank sends for a step's payload by kind, as a ring of P ranks sends them (comm_ring_bytes)
static double ring_bytes(const double moved[COMM_KINDS], int P, double sent[COMM_KINDS]) {
    double total = 0;
    for (int k = 0; k < COMM_KINDS; k++) total += sent[k] = comm_ring_bytes(k, moved[k], P);
    return total;
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
    const char* abbrev[COMM_KINDS] = {"AR", "RS", "AG"};
    for (int k = 0, first = 1; k < COMM_KINDS && w < (int)n; k++)
        if (sent[k] > 0) {
            w += snprintf(out + w, n - w, "%s%s %.2f", first ? " (" : ", ", abbrev[k], sent[k] / 1e6);
            first = 0;
        }
    if (w < (int)n) snprintf(out + w, n - w, ")");
}

// the GPUs all processes use, for MFU
static int gpus_in_use(const Run* run) { return std::min(run->P * run->D, run->ngpu) * g_procs.n; }


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
    bool fused = a->attention != 0;  // every column: the run's attention
    double mem[3][5];
    printf("memory per rank (MB)    ");
    for (int k = 0; k < ncols; k++) {
        char name[40];
        int n = snprintf(name, sizeof(name), "TP=%d", cols[k].P);
        if (sp_splits(cols[k].sp, cols[k].P, a->B, a->T)) n += snprintf(name + n, sizeof(name) - n, " SP");
        if (cols[k].r) n += snprintf(name + n, sizeof(name) - n, " -r %d", cols[k].r);
        if (cols[k].zd > 1) snprintf(name + n, sizeof(name) - n, " ZeRO-1");
        printf(" %11s", name);
        RankMemory m = rank_memory(c, cols[k].P, cols[k].zd, cols[k].zd > 1, a->B, a->T, cols[k].sp, cols[k].r, fused, 1, 0, 1,
                                    a->dtype == DTYPE_BF16);
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
    // tokens, the rank's heads' buffers (qkv, attention, MLP) B*T tokens over P ranks; fused attention
    // keeps one log-sum-exp per (b, head, t) where matmul keeps the (T, T) probabilities
    int r = a->recompute;
    bool split = sp_splits(a->sp, run->P, a->B, a->T);
    ShardPlan s;
    shard_plan_init(&s, c, run->P, 0);
    bool bf16 = a->dtype == DTYPE_BF16;
    double per_layer = 4.0 * acts_floats_per_layer(c, &s, a->B, a->T, split, r, fused, bf16);
    double total = 4.0 * acts_floats(c, &s, a->B, a->T, split, r, fused, bf16);
    // bf16 keeps the residual stream, ln1, ln2 (unless -r 2), atty, fch and fch_gelu (unless -r 1), and with
    // fused attention q, k and v, in bf16: half a float each
    double token = (r >= 2 ? 2 : 4) / (bf16 ? 2.0 : 1.0), head = (bf16 && fused ? 1.5 : 3) + (bf16 ? 0.5 : 1) * (5 + (r >= 1 ? 0 : 4));
    printf("  activations per layer (%s attention): N*(%gC + 4) + B*T*%gC/P%s floats, N = %s tokens per rank: %.2f MB x %d layers,\n"
           "  plus %.2f MB outside the layers\n", fused ? "fused" : "matmul", token, head,
           fused ? " + B*NH*T/P" : r >= 3 ? "" : " + B*NH*T*T/P", split ? "B*T/P" : "B*T", per_layer / 1e6, c->L,
           (total - c->L * per_layer) / 1e6);
    if (a->dtype == DTYPE_BF16)
        printf("  --dtype bf16: the parameters are the fp32 master weights and the layers' bf16 copy of them (2 bytes a weight);\n"
               "  the matrices' gradients are bf16 too, each op's fp32 sum rounded once (the vectors' fp32; summed over ranks in fp32);\n"
               "  each layer keeps its bf16 activations (the residual stream, ln1, atty, ln2, fch, fch_gelu%s) as bf16%s;\n"
               "  the LM head's logits and their gradient are bf16 too (B*T*Vp/P of them: half the fp32 bytes);\n"
               "  %s\n", fused ? ", and q, k, v for fused attention" : "; q, k, v in fp32 for matmul attention", split && sp_wire_bf16(c, true) ? " (SP's all-gathers move them as bf16, through a B*T*C bf16 buffer)" : "", run->device == DEV_CUDA ? "the GPU's matmuls pack them to bf16 and multiply them by the weights on bf16 tensor cores, with fp32 sums"
                         : bf16_path == BF16_AMX ? "the CPU's matmuls multiply them on AMX tiles (--bf16-gemm amx: fp32 sums, its own rounding)"
                         : bf16_dp_used() ? "the CPU's matmuls multiply them on vdpbf16ps (AVX512-BF16; --bf16-gemm)"
                                          : "the CPU's matmuls multiply them with fp32 fmas (the bits of vdpbf16ps; --bf16-gemm)");
}

// The DP group's part of the communication: once per step, whatever the micro-steps.
static void print_dp_communication(const Run* run) {
    if (run->Dg == 1) return;
    const Args* a = &run->args;
    double f[COMM_KINDS], sent[COMM_KINDS];
    bool bf16 = a->dtype == DTYPE_BF16;
    dp_step_floats(&run->cfg, run->P, run->Dg, a->zero, bf16, f);
    double mb = ring_bytes(f, run->Dg, sent) / 1e6;
    if (!a->zero)
        printf("communication over each DP group (%d replicas), once per step: all-reduce of the rank's shard of the gradient,\n"
               "  N = %.0f floats; each rank sends %.2f MB, as a ring does (2(D-1)/D of the data)\n", run->Dg, f[KIND_ALLREDUCE], mb);
    else if (bf16)
        printf("communication over each DP group (%d replicas), once per step (ZeRO-1): reduce-scatter of the rank's padded\n"
               "  shard of the gradient, N' = %.0f floats, all-gather of its bf16 weights, N' bf16 (the replica rounds its\n"
               "  slice of the fp32 masters), and all-reduce of 2 (the norm); each rank sends %.2f MB, as a ring does ((D-1)/D\n"
               "  of each), 3/4 of the fp32 all-reduce's\n",
               run->Dg, f[KIND_REDUCESCATTER], mb);
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
    bool bf16 = a->dtype == DTYPE_BF16, wire_bf16 = split && sp_wire_bf16(c, bf16);
    step_comm_floats(c, a->B, a->T, split, A, bf16, f);
    step_comm_floats(c, a->B, a->T, false, A, bf16, tp_only);
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
        printf("communication: none%s (one rank%s)\n", run->Dg > 1 || run->S > 1 ? " inside a stage" : "",
               run->S > 1 ? " per stage; between the stages: the pipeline table above" : "");
    else if (!split) {
        printf("communication per step%s: all-reduce of %s%s(4L+2)*B*T*C + 3*B*T%s + 1 = %.0f floats;\n", micro, times, A > 1 ? "(" : "",
               A > 1 ? ")" : "", f[KIND_ALLREDUCE]);
        printf("  each rank sends %.2f MB, as a ring does (2(P-1)/P of an all-reduce's data)\n", sent / 1e6);
    } else if (wire_bf16) {  // the gathers of bf16 values move as bf16 (gpt.cu's gather_tokens)
        printf("communication per step%s: reduce-scatter %s(4L+2)*B*T*C = %.0f floats, all-gather %s((6L+1)*B*T*C bf16 +\n"
               "  B*T*C floats) = %.0f words of 4 bytes and all-reduce %s3*B*T + 1 + T*C + 4*L*C + 2*C = %.0f floats; each rank\n"
               "  sends %.2f MB, as a ring does ((P-1)/P of a reduce-scatter's or all-gather's data, 2(P-1)/P of an all-reduce's);\n"
               "  TP alone sends %.2f MB; the partial sums and the embedding's gradient move in fp32, the layernorm outputs and\n"
               "  the output gradients the gathers collect are bf16 values and move as bf16\n",
               micro, times, f[KIND_REDUCESCATTER], times, f[KIND_ALLGATHER], times, f[KIND_ALLREDUCE], sent / 1e6, sent_tp / 1e6);
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

// Each process of the job: its machine, what it holds (replicas, or a replica's stages when they are spread
// over processes) and its world ranks
static void print_procs(const Run* run) {
    int W = run->D * run->Sl * run->P;  // ranks per process
    for (int p = 0; p < g_procs.n; p++) {
        std::string what = span_text("replica", p * run->D, p * run->D + run->D - 1);
        if (run->Sp > 1) {
            int s0 = p % run->Sp * run->Sl;
            what = span_text("stage", s0, s0 + run->Sl - 1) + " of replica " + std::to_string(p / run->Sp);
        } else if (run->S > 1) {
            what += ", all " + std::to_string(run->S) + " stages";
        }
        printf("tp:   process %d (%s, pid %d): %s, world ranks %d-%d\n", p, g_procs.hosts[p].c_str(), g_procs.pids[p],
               what.c_str(), p * W, (p + 1) * W - 1);
    }
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
    print_procs(run);
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

// Pipeline parallelism: the stages, their layers and memory per rank, and what a rank sends its
// neighbouring stages per step (pp_step_floats)
static void pp_print_stages(const Run* run) {
    const Args* a = &run->args;
    const GPTConfig* c = &run->cfg;
    int S = run->S, m = run->accum;
    int zd = a->zero && run->Dg > 1 ? run->Dg : 1;
    printf("pipeline: %d stages x %d TP rank%s, %s schedule, %d micro-batch%s per step: bubble (S - 1) / (m + S - 1) = %.1f%%%s\n", S,
           run->P, run->P > 1 ? "s" : "", pp_schedule_name(run->pp_schedule), m, m > 1 ? "es" : "", 100.0 * pp_bubble(S, m),
           m < S ? " (fewer micro-batches than stages: give -d for more)" : "");
    printf("  %-6s %-16s %10s %10s %10s %20s %10s %14s\n", "stage", "layers", "params MB", "grads MB", "AdamW MB", "activations MB",
           "total MB", "sent MB/step");
    for (int s = 0; s < S; s++) {
        int l0, nl, slots = pp_slots(run->pp_schedule, S, s, m);
        pp_stage_layers(c->L, S, s, &l0, &nl);
        RankMemory mem = rank_memory(c, run->P, zd, zd > 1, a->B, a->T, a->sp, a->recompute, a->attention != 0, S, s, slots, a->dtype == DTYPE_BF16);
        char layers[48], acts[40];
        snprintf(layers, sizeof(layers), "%d-%d%s", l0, l0 + nl - 1, s == 0 && S > 1 ? " + embed" : s == S - 1 ? " + head" : "");
        snprintf(acts, sizeof(acts), "%d x %.1f", slots, mem.acts / slots / 1e6);
        printf("  %-6d %-16s %10.1f %10.1f %10.1f %20s %10.1f %14.2f\n", s, layers, mem.params / 1e6, mem.grads / 1e6,
               mem.moments / 1e6, acts, memory_total(&mem) / 1e6, 4.0 * pp_step_floats(run, s) / 1e6);
    }
    printf("  (per rank; activations: the micro-batches a stage keeps in flight x one micro-batch's; the stages send each\n"
           "  other the residual stream of their tokens, point to point; the first and last stage also sum wte's gradient)\n");
    double N = (double)a->B * a->T / (sp_splits(a->sp, run->P, a->B, a->T) ? run->P : 1);
    printf("  point to point per step: m x N x C = %d x %.0f x %d values each way across each boundary (N: a rank's tokens of a\n"
           "  micro-batch; %s); and once a step wte's all-reduce between the first and last stage, Vp x C / P = %.0f floats\n",
           m, N, c->C, a->dtype == DTYPE_BF16 ? "the stream forward in bf16, its gradient back in fp32" : "fp32",
           (double)c->Vp * c->C / run->P);
    printf("  the boundary tensors go %s\n", pp_boundary_path(run));
    if (a->gen_tokens > 0)
        printf("  samples (-g, -s) come from the stages' weights gathered into one rank on the CPU, not through the pipeline\n");
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
    else if (run->device == DEV_CUDA && run->S > 1)
        printf("tp: %d pipeline stages x %d TP rank%s = %d ranks on %d GPU%s (TP groups: %s; between stages: host memory); %s\n",
               run->S, run->P, run->P > 1 ? "s" : "", run->S * run->P, run->ngpu, run->ngpu > 1 ? "s" : "",
               run->P == 1 ? "none" : run->tp_groups[0].nccl[0] ? "NCCL" : "shared GPU memory", batch);
    else if (run->device == DEV_CUDA)
        printf("tp: %d ranks on %d GPU%s (%s between ranks); %s\n", run->P, run->ngpu, run->ngpu > 1 ? "s" : "",
               run->tp_groups[0].nccl[0] ? "NCCL" : "shared GPU memory", batch);
    else if (run->S > 1)
        printf("tp: %d pipeline stages x %d TP rank%s = %d ranks on the CPU, %d thread%s each; %s\n", run->S, run->P,
               run->P > 1 ? "s" : "", run->S * run->P, run->threads, run->threads > 1 ? "s" : "", batch);
    if (run->Dg == 1 && run->Sp > 1) {
        printf("tp: the stages span %d processes, %d stage%s in each (MPI between them):\n", run->Sp, run->Sl, run->Sl > 1 ? "s" : "");
        print_procs(run);
    }
    else if (run->P == 1)
        printf("tp: 1 rank on the CPU with %d thread%s; %s\n", run->threads, run->threads > 1 ? "s" : "", batch);
    else
        printf("tp: %d ranks on the CPU, %d thread%s each; %s\n", run->P, run->threads, run->threads > 1 ? "s" : "", batch);
    bool bf16 = a->dtype == DTYPE_BF16;
    const char* hw = run->device == DEV_CUDA ? (bf16 ? "this GPU has bf16 tensor cores" : "this GPU is older than sm_80")
                                             : (bf16 ? "this CPU has AVX512-BF16" : "this CPU has no AVX512-BF16");
    if (run->dtype_default)
        printf("tp: --dtype %s, the default here (%s; --dtype %s for %s)\n", bf16 ? "bf16" : "fp32", hw, bf16 ? "fp32" : "bf16",
               bf16 ? "fp32 throughout" : "bf16");
    if (run->sample_only) {
        if (a->chat) printf("tp: no training (--chat 1): answers of up to %d tokens\n", a->gen_tokens);
        else if (a->max_steps == 0 || !run->resuming) printf("tp: no training (-x 0): a sample of %d tokens\n", a->gen_tokens);
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
    if (run->S > 1) pp_print_stages(run);
    print_communication(run);
    if (run->floor_nats > 0 && !run->data_bytes)
        printf("data: the embedded corpus, %zu train and %zu val tokens of sentences from a probabilistic grammar, each\n"
               "      token one of its %zu words, punctuation marks or separators (--corpus bytes: a byte each);\n"
               "      its entropy is %.4f nats per token (%.4f per byte): the loss floor no model can beat\n",
               run->corpus_train.size(), run->corpus_val.size(), grammar_vocab().size(), run->floor_nats, grammar_entropy_per_byte());
    else if (run->floor_nats > 0)
        printf("data: the embedded corpus, %zu train and %zu val bytes of sentences from a probabilistic grammar;\n"
               "      its entropy is %.4f nats per byte: the loss floor no model can beat\n",
               run->corpus_train.size(), run->corpus_val.size(), run->floor_nats);
    if (!run->train_shards.empty()) {
        print_split(run, "train", a->train, run->train_shards);
        if (a->val) print_split(run, "val", a->val, run->val_shards);
        else printf("data: val   none (-i alone with -v 0: no val losses)\n");
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
// training: the val, step and average lines (world rank 0 prints them)

// model FLOPs of one step: 6 per parameter per token (forward + backward) plus attention's 12 L T C
static double step_flops(const Run* run) {
    const GPTConfig* c = &run->cfg;
    return (6.0 * gpt_num_params(c) + 12.0 * c->L * run->args.T * c->C) * step_tokens(run);
}

// the model FLOPs utilisation of `seconds` per step over every GPU in use (0: not on a GPU we know)
static double mfu(const Run* run, double seconds) {
    if (run->peak_flops <= 0) return 0;
    return step_flops(run) / seconds / (run->peak_flops * gpus_in_use(run));
}

// "val loss X (floor F, N% above) | note"
static void print_val_line(const Run* run, float vl, const char* note) {
    const char* bar = note[0] ? "  | " : "";
    if (run->floor_nats > 0) printf("val loss %.6f  (floor %.4f, %.1f%% above)%s%s\n", vl, run->floor_nats, 100.0 * (vl / run->floor_nats - 1.0), bar, note);
    else printf("val loss %.6f%s%s\n", vl, bar, note);
    fflush(stdout);
}

// "step N/M | loss | lr | norm | ms | tok/s | MFU | comm ms, MB | dp ms, MB": sent and dp_total are the
// bytes this rank sent over its TP group (by kind) and its DP group in the step, as a ring sends them
static void print_step_line(const Run* run, int step, const StepStats* st, const double sent[COMM_KINDS], double dp_total) {
    const Args* a = &run->args;
    char util[32] = "", comm[128] = "", dp[48] = "", pp[64] = "";
    if (run->peak_flops > 0) snprintf(util, sizeof(util), " | MFU %.1f%%", 100.0 * mfu(run, st->seconds));
    if (run->P > 1) comm_summary(comm, sizeof(comm), st->comm_seconds, sent);
    if (run->Dg > 1) snprintf(dp, sizeof(dp), " | dp %.1f ms, %.2f MB", st->dp_seconds * 1e3, dp_total / 1e6);
    // pipeline: stage 0's wait for stage 1 (its bubble) and the bytes it sent it
    if (run->S > 1) snprintf(pp, sizeof(pp), " | pp wait %.1f ms, %.2f MB", st->pp_seconds * 1e3, st->pp_bytes / 1e6);
    printf("step %4d/%d | loss %.6f | lr %.2e | norm %.4f | %.1f ms | %.0f tok/s%s%s%s%s\n", step + 1, a->max_steps, st->loss,
           st->lr, st->norm, st->seconds * 1e3, step_tokens(run) / st->seconds, util, comm, dp, pp);
    fflush(stdout);
}

// The line after the last step: the average over the timed steps (all but the first of this run), its
// time in the collectives, and on a GPU the memory in use.
static void print_average_line(const Run* run, const StepStats* total, int n, const char* replicas_note) {
    const Args* a = &run->args;
    char util[32] = "", comm[64] = "", dp[64] = "";
    if (run->peak_flops > 0) snprintf(util, sizeof(util), ", MFU %.1f%%", 100.0 * mfu(run, total->seconds / n));
    if (run->P > 1) snprintf(comm, sizeof(comm), ", %.1f ms per step in collectives", total->comm_seconds / n * 1e3);
    if (run->Dg > 1) snprintf(dp, sizeof(dp), ", %.1f ms in DP collectives", total->dp_seconds / n * 1e3);
    printf("average %.1f ms per step, %.0f tok/s%s%s%s (steps %d..%d)\n", total->seconds / n * 1e3, step_tokens(run) * n / total->seconds,
           util, comm, dp, run->start_step + 2, a->max_steps);
    if (run->device == DEV_CUDA) {
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
            printf("GPU 0 memory in use: %.2f GB of %.2f GB (all ranks on it, CUDA context included)\n", (total_b - free_b) / 1e9, total_b / 1e9);
    }
    if (run->Dg > 1) printf("after the last step: %s\n", replicas_note);
}
