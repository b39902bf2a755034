// train/pipeline.h (needs tp.cu's Run and RankRun): pipeline parallelism, --pp S.
//
// The layers are cut into S stages of consecutive layers (pp_stage_layers in gpt.cu); every stage is a
// tensor-parallel group of P ranks, and TP rank r of stage s talks only to TP rank r of stages s - 1 and
// s + 1. A step's micro-batches (-d) flow through the stages: stage s receives micro-batch k's residual
// stream from stage s - 1, runs its layers, sends its output to stage s + 1; in the backward the
// gradient goes the other way. What each stage does when is the schedule, below.
//
// Where the stages meet nothing is summed, so a micro-batch goes through the same ops in the same order
// as on one stage; only the sums of a step across micro-batches and stages are taken in another order
// (the tied embedding's gradient, the gradient norm), which is why PP=S matches PP=1 to rounding rather
// than to the bit.
#pragma once
#include <algorithm>
#include <unistd.h>
#include <vector>

enum { PP_1F1B, PP_GPIPE };

// one micro-step of a stage: the forward or the backward of micro-batch mb
struct PipeStep {
    bool forward;
    int mb;
};

// The schedule: the order of stage s's micro-steps (of S stages, m micro-batches per step).
//   GPipe (all forward, all backward): every forward, then every backward, in micro-batch order. The
//     simplest to read; every stage keeps all m micro-batches' activations until its backwards.
//   1F1B (one forward, one backward): stage s first runs S - s - 1 forwards (the warm-up: enough to fill
//     the pipeline behind it), then alternates one forward and one backward, and ends with the remaining
//     backwards. The bubble is the same as GPipe's, (S - 1) / (m + S - 1) of the step, but a stage keeps
//     at most S - s micro-batches in flight (the first stage S), not m.
static std::vector<PipeStep> pp_schedule(int kind, int S, int s, int m) {
    std::vector<PipeStep> order;
    int warmup = kind == PP_GPIPE ? m : std::min(S - s - 1, m);
    int f = 0, b = 0;  // the next forward's and the next backward's micro-batch
    for (; f < warmup; f++) order.push_back({true, f});
    while (f < m) {  // the steady state: one forward, one backward
        order.push_back({true, f++});
        order.push_back({false, b++});
    }
    while (b < m) order.push_back({false, b++});  // the cool-down
    return order;
}

// The activation sets stage s keeps at most under the schedule: micro-batch k uses slot k % slots. (Under
// 1F1B the micro-batches in flight at a stage are consecutive, at most S - s of them, so two that share a
// slot are never in flight together.)
static int pp_slots(int kind, int S, int s, int m) { return kind == PP_GPIPE ? m : std::min(S - s, m); }

static const char* pp_schedule_name(int kind) { return kind == PP_GPIPE ? "GPipe (all forward, all backward)" : "1F1B"; }

// The bubble of either schedule: the fraction of a step a stage waits for its neighbours when every
// micro-step of every stage takes the same time.
static double pp_bubble(int S, int m) { return (double)(S - 1) / (m + S - 1); }

// ----------------------------------------------------------------------------
// a step's micro-batches through this rank's stage

// One micro-step's forward on this rank's stage: the stage's input from the previous stage (or the
// embedding of the tokens on the first), its layers, its output to the next stage (or the loss on the last).
static void pp_forward(RankRun* rr, const int* tokens, const int* targets, int B, int T, bool training, int mb) {
    Rank* rk = &rr->rk;
    GPT* m = &rr->m;
    gpt_alloc_acts(m, rk, B, T);
    if (!m->plan.first) comm_recv(&rk->pp, rk->stage - 1, gpt_stage_input(m), gpt_stage_floats(m), "the activations", mb);
    gpt_forward(m, rk, tokens, targets, B, T, training);
    if (!m->plan.last) comm_send(&rk->pp, rk->stage + 1, gpt_stage_output(m), gpt_stage_floats(m), "the activations", mb);
}

// ... and its backward: the gradient of the stage's output from the next stage (on the last, from the
// loss), its layers' backward, the gradient of its input to the previous stage (on the first, into the
// embedding)
static void pp_backward(RankRun* rr, int mb) {
    Rank* rk = &rr->rk;
    GPT* m = &rr->m;
    if (!m->plan.last) comm_recv(&rk->pp, rk->stage + 1, gpt_stage_grad(m), gpt_stage_grad_floats(m), "the gradient", mb);
    gpt_backward(m, rk);
    if (!m->plan.first) comm_send(&rk->pp, rk->stage - 1, gpt_stage_grad(m), gpt_stage_grad_floats(m), "the gradient", mb);
}

// test hook: TP rank 0 of this stage stops for good before its second micro-batch (-1: never), the
// stalled stage the timeout must report
static int g_pp_plant_stall = -1;

// The micro-steps of one training step on this rank, in its stage's schedule order: every stage draws the
// same micro-batches from its own loader (the first stage needs the tokens, the last the targets). Returns
// the sum of the micro-batches' mean losses on the last stage, 0 on the others.
static double pp_micro_steps(Run* run, RankRun* rr) {
    const Args* a = &run->args;
    GPT* m = &rr->m;
    int S = rr->rk.S, s = rr->rk.stage, nmb = run->accum;
    int slots = pp_slots(run->pp_schedule, S, s, nmb);
    double loss = 0.0;
    for (const PipeStep& st : pp_schedule(run->pp_schedule, S, s, nmb)) {
        if (g_pp_plant_stall == s && rr->rk.rank == 0 && st.mb == 1)
            for (;;) sleep(1000);
        gpt_select_slot(m, st.mb % slots);
        if (st.forward) {
            loader_next(&rr->train);
            pp_forward(rr, rr->train.inputs.data(), rr->train.targets.data(), a->B, a->T, true, st.mb);
            if (m->plan.last) loss += gpt_read_loss(m, &rr->rk);
        } else {
            pp_backward(rr, st.mb);
        }
    }
    gpt_select_slot(m, 0);
    return loss;
}

// ----------------------------------------------------------------------------
// setup: --pp and --pp-schedule against the model and the rest of the command line

// Sets the pipeline's S stages and this process's share of them, Sl consecutive stages from stage S0: a
// replica's stages span run->Sp processes (grid_setup under mpirun; 1 in one process, in the sweep and in
// the tests), each holding S / Sp of them. The one place the layout of the stages is set.
static void run_set_stages(Run* run, int S) {
    run->S = S;
    run->Sl = S / run->Sp;
    run->S0 = g_procs.me % run->Sp * run->Sl;
}

static void pp_setup(Run* run) {
    const Args* a = &run->args;
    const GPTConfig* c = &run->cfg;
    run_set_stages(run, a->pp);
    const char* k = a->pp_schedule ? a->pp_schedule : "1f1b";
    if (!strcmp(k, "1f1b")) run->pp_schedule = PP_1F1B;
    else if (!strcmp(k, "gpipe")) run->pp_schedule = PP_GPIPE;
    else bad_flag("--pp-schedule %s: the schedules are 1f1b and gpipe", k);
    if (run->S == 1) return;
    if (run->sample_only) {  // -x 0, --chat, a finished run: one replica's ranks sample; stages would only wait on each other
        if (g_procs.me == 0) printf("tp: --pp %d: sampling runs without pipeline stages (--pp 1)\n", run->S);
        run_set_stages(run, 1);
        return;
    }
    if (run->S > c->L)
        fatal("--pp %d: a stage needs at least one layer, and the model has %d: use --pp %d or less", run->S, c->L, c->L);
    if (a->sweep)
        fatal("--sweep 1 times every (P, D, S) grid itself, the stages included: drop --pp");
    if (run->Sp > 1 && run->D > 1)
        fatal("--dp %d with the stages of a replica in %d processes: each process holds one replica's stages; start more "
              "processes for more replicas (mpirun -np %d makes %d replicas of --pp %d), or use --dp 1", run->D, run->Sp,
              2 * run->Sp, 2, run->S);
    for (int q = 0; run->Sp > 1 && q < run->Sp; q++)  // what each process of replica 0 sends process 0 to save
        run->stage_spans.push_back(gpt_stage_spans(c, run->S, q * run->Sl, run->Sl));
    run->ckpt.spans = run->Sp > 1 ? &run->stage_spans : nullptr;
}

// ----------------------------------------------------------------------------
// the bubble, measured

// After the timed steps (n of them, `seconds` in all on this rank, `wait` of it waiting on the other stages:
// in comm_recv for a neighbour, and in the step's sums over the stages, where a stage that ran out of
// micro-steps waits for the others): each stage's waiting as a fraction of its steps, printed by world rank
// 0 for replica 0's TP rank 0 of every stage, beside the bubble of the schedule. Every rank calls it.
static void pp_report(Run* run, RankRun* rr, double wait, double seconds, int n) {
    int W = rr->world.P, S = run->S, P = run->P;
    std::vector<float> all(2L * W);
    float mine[2] = {(float)wait, (float)seconds};
    comm_allgather(&rr->world, all.data(), mine, 2, "pipeline waits", -1);
    if (rr->world.rank != 0 || n <= 0) return;
    printf("pipeline: %d stages, %s, %d micro-batch%s per step; the bubble (S - 1) / (m + S - 1) = %.1f%%\n", S,
           pp_schedule_name(run->pp_schedule), run->accum, run->accum > 1 ? "es" : "", 100.0 * pp_bubble(S, run->accum));
    for (int s = 0; s < S; s++) {
        int l0, nl;
        pp_stage_layers(run->cfg.L, S, s, &l0, &nl);
        double w = all[2L * (s * P)], t = all[2L * (s * P) + 1];
        printf("  stage %d (layers %d-%d%s): waited for its neighbours %.1f%% of its steps (%.1f ms per step)\n", s, l0, l0 + nl - 1,
               s == 0 ? ", embedding" : s == S - 1 ? ", LM head" : "", t > 0 ? 100.0 * w / t : 0.0, w / n * 1e3);
    }
}

// ----------------------------------------------------------------------------
// the startup lines: the stages, their memory, what crosses between them

// Floats one rank sends to its neighbouring stages per step: m micro-batches' boundary tensor (N, C) of
// its tokens (N = B T, or B T / P with SP) forward (all but the last stage: the residual stream, in a bf16
// run bf16 storage, gpt_stage_floats) and backward (all but the first: its gradient, fp32).
static double pp_step_floats(const Run* run, int stage) {
    const Args* a = &run->args;
    long N = (long)a->B * a->T / (sp_splits(a->sp, run->P, a->B, a->T) ? run->P : 1), NC = N * run->cfg.C;
    double fwd = stage < run->S - 1 ? (bf16_storage(a->dtype == DTYPE_BF16) ? bf16_floats(NC) : NC) : 0, bwd = stage > 0 ? NC : 0;
    return run->accum * (fwd + bwd);
}

