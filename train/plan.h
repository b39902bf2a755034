// train/plan.h (needs the model, tp.cu's Run and loop, train/setup.h): --plan, when tensor parallelism
// pays. A cost model of one training step built from tp's own counts (the FLOPs of every matmul of the
// recipe, the payload and the number of every collective of step_comm_floats and dp_step_floats, the
// memory of rank_memory), fed either by a short measurement of this machine (--plan 1, and the sweep's
// prediction column) or by the figures of a GPU box tp is not running on (--plan NAME, --plan custom).
//
//   plan_step           the model: one readable function, its derivation in its header comment
//   plan_k              the closed form of its communication-over-compute ratio
//   plan_memory         what a rank holds, fp32 (exactly rank_memory) or bf16 (a prediction)
//   g_boxes             the named boxes and where every number comes from (the README lists them too)
//   plan_measure        this machine: compute at each P's local shapes (on the CPU with the grid's ranks
//                       side by side), collectives at each group size
//   plan_run            --plan: this machine (plan_here) or a box (plan_box): the tables and the recommendation
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

// ----------------------------------------------------------------------------
// the counts

// The FLOPs of one token's forward and backward through the matmuls and attention of the whole model at
// TP=1 (a rank at P does 1/P of them): per layer qkv 3C^2, attproj C^2, fc 4C^2, fcproj 4C^2 multiply-adds
// forward (24 C^2 FLOPs), attention's q k^T and att v 2 T C multiply-adds (4 T C FLOPs, the full T x T
// square as the CPU and cuBLAS compute it), the LM head C Vp multiply-adds (2 C Vp FLOPs); the backward
// twice the forward (the input and the weight gradient).
static double plan_flops_per_token(const GPTConfig* c, int T) {
    double L = c->L, C = c->C, Vp = c->Vp;
    return 3.0 * (L * (24.0 * C * C + 4.0 * T * C) + 2.0 * C * Vp);
}

// the same for one rank's micro-batch of B x T tokens at P ranks: 72 B T C^2 L (1 + T/6C)/P + 6 B T C Vp/P
static double plan_rank_flops(const GPTConfig* c, int B, int T, int P) {
    return (double)B * T * plan_flops_per_token(c, T) / P;
}

// How many collectives of each kind a training step issues over the TP group (gpt.cu), for A
// micro-batches: without SP per micro-batch the embedding, 4 per layer and the LM head, and the loss's
// max and sums are all-reduces, 4L + 4; once per step the gradient norm. With SP per micro-batch 4L + 2
// reduce-scatters (the embedding, attproj and fcproj forward, fc and qkv backward, the LM head),
// 6L + 2 all-gathers (ln1 and ln2 forward and again in the backward, the two row-parallel backwards, lnf,
// the embedding backward) and the loss's 2 all-reduces; once per step the norm and SP's 4 all-reduces of
// the replicated gradients (wpe, ln1, ln2, lnf).
static void step_comm_calls(const GPTConfig* c, bool split, int A, double out[COMM_KINDS]) {
    double L = c->L;
    for (int k = 0; k < COMM_KINDS; k++) out[k] = 0;
    if (!split) {
        out[KIND_ALLREDUCE] = A * (4 * L + 4) + 1;
    } else {
        out[KIND_REDUCESCATTER] = A * (4 * L + 2);
        out[KIND_ALLGATHER] = A * (6 * L + 2);
        out[KIND_ALLREDUCE] = A * 2 + 5;
    }
}

// For a GPU box, whose replicated work is not measured: the floats the replicated elementwise ops of one
// token read and write, forward and backward (memory-bound: time = bytes / HBM bandwidth). Per layer the
// two layernorms (forward: read C, write C; backward: read the input, the output gradient and add into
// the residual gradient, 4C) and the two residual adds (read 2C, write C): 2 (2C + 4C) + 2 (3C) = 18C; plus
// the embedding (3C) and the final layernorm (6C). With SP every rank does 1/P of them.
static double plan_rest_floats_per_token(const GPTConfig* c) { return 18.0 * c->L * c->C + 9.0 * c->C; }

// ----------------------------------------------------------------------------
// memory

// What one rank holds at P TP ranks x D replicas, in bytes, for e = 4 (what tp allocates: exactly
// rank_memory, for fp32 or with bf16 for its --dtype bf16) or e = 2 (a trainer that keeps everything in bf16
// with fp32 masters, a prediction: bf16 parameters and gradients, fp32 master weights and AdamW m and v,
// split over the replicas with ZeRO-1, bf16 activations).
static double plan_memory(const GPTConfig* c, int P, int D, int zero, int B, int T, bool sp, int recompute, bool fused, int e,
                          int S = 1, int stage = 0, int slots = 1, bool bf16 = false) {
    RankMemory m = rank_memory(c, P, D, zero, B, T, sp, recompute, fused, S, stage, slots, e == 4 && bf16);
    if (e == 4) return memory_total(&m);
    double n = m.params / 4, slice = m.moments / 8;  // floats of the shard, and of the replica's slice
    return 2 * n + 2 * n + 4 * slice + 8 * slice + m.acts / 2;
}

// ----------------------------------------------------------------------------
// the model

// What a grid costs before the model combines it: the compute of one rank (measured on this machine, or
// from a box's rates) and its collectives' latency and bus bandwidth.
struct PlanCosts {
    double split_s;   // per micro-batch: the matmuls and attention of one rank at its local shapes
    double rest_s;    // per micro-batch: everything else of forward and backward (the replicated ops,
                      // the elementwise ops on the local slices, the loss)
    double update_s;  // per step: AdamW and the gradient norm
    double slow;      // ranks per GPU when the P x D ranks share GPUs (time-sliced); 1 on the CPU, whose
                      // measurement runs a grid's ranks side by side (plan_ranks_together)
    double tp_lat, tp_busbw;  // the TP group's collectives: seconds per call, bus bandwidth in bytes/s
    double dp_lat, dp_busbw;  // the DP group's
};

// What plan_step predicts for one grid.
struct PlanStep {
    double compute_s, tp_s, dp_s, total_s;
    double tp_bw_s;  // of tp_s, the bandwidth part (no latency): what k measures
    double k;        // tp_bw_s / (split compute x (P - 1)): TP's communication over compute per extra rank
};

// The shape of a step: the batch per replica, micro-batches per step, and the settings that change counts.
struct PlanShape {
    int B, T, A;     // -b, -t, micro-batches per step (-d)
    bool sp;         // --sp 1
    int zero;        // -z
    int e;           // bytes per value moved (4 fp32, 2 bf16)
    bool bf16;       // with e = 4: tp's --dtype bf16 as it trains, whose collectives move bf16 where they carry
                     // bf16 values, two to a 32-bit word (step_comm_floats, dp_step_floats), the rest fp32
};

// plan_step: the predicted time of one training step at P TP ranks x D replicas.
//
// Derivation, from tp's own counts. A rank of P runs, per micro-batch of B x T tokens,
//   F_P = B T (72 L C^2 + 12 L T C + 6 C Vp) / P  FLOPs   (plan_rank_flops: every matmul of the recipe
//                                                          and attention, forward + 2x backward)
// in split_s = F_P / F seconds at an achieved rate F, plus rest_s of work TP does not divide (layernorms,
// residuals, the embedding, the loss: replicated on every rank unless --sp) and once per step update_s
// (AdamW on the shard). Ranks that share a GPU run one after another: x slow (on the CPU the ranks that
// share the cores are measured together, so their slicing is already in split_s and rest_s). So
//   compute = slow (A (split_s + rest_s) + update_s).
// Over the TP group a step issues n_k collectives of kind k carrying m_k floats (step_comm_calls,
// step_comm_floats: an all-reduce of (4L + 2) B T C + 3 B T floats per micro-batch without SP). A ring
// sends s_k = 2(P-1)/P e m_k bytes per rank for an all-reduce, (P-1)/P e m_k for a reduce-scatter or an
// all-gather (comm_ring_bytes), and nccl-tests' busbw W is defined so that a collective of s bytes on the
// ring takes s / W: busbw = algbw 2(P-1)/P for an all-reduce. With a latency a per call,
//   tp = sum_k (n_k a + s_k / W),   and the same over the DP group: dp = n a' + s' / W' (dp_step_floats).
// Nothing overlaps (the CPU backend's collectives are synchronous; the CUDA path's overlap of the f
// all-reduce with the weight-gradient matmul is left out, so on a GPU this errs slow), so
//   step = compute + tp + dp.
// Communication over compute, bandwidth only, without the replicated work: per micro-batch
//   s / (F_P / F) = 2 (P-1)/P e ((4L+2) C + 3) B T / W  /  (B T f / (P F)) = (P-1) k,
//   k = 2 e F ((4L + 2) C + 3) / (W f),  f = 72 L C^2 + 12 L T C + 6 C Vp   (plan_k; SP: (10L+4) C + 6
// in place of 2((4L+2) C + 3)), which for large L and no LM head is the README's e F / (9 W (C + T/6)).
// With rest_s = update_s = a = 0 the speed-up over one rank is P / (1 + k (P-1)): TP pays while k < 1
// and never beats 1/k.
static PlanStep plan_step(const GPTConfig* c, const PlanShape* sh, int P, int D, const PlanCosts* k) {
    PlanStep r = {};
    r.compute_s = k->slow * (sh->A * (k->split_s + k->rest_s) + k->update_s);
    bool split = sp_splits(sh->sp, P, sh->B, sh->T);
    double m[COMM_KINDS], n[COMM_KINDS], per_step[COMM_KINDS];
    step_comm_floats(c, sh->B, sh->T, split, sh->A, sh->bf16, m);  // every payload in elements of e bytes
    step_comm_calls(c, split, sh->A, n);
    step_comm_floats(c, sh->B, sh->T, split, 0, sh->bf16, per_step);  // A = 0: the once-per-step part alone
    double bw_mb = 0;  // the bandwidth time of the micro-batches' collectives
    for (int kind = 0; kind < COMM_KINDS && P > 1; kind++) {
        double s = comm_ring_bytes(kind, m[kind], P) * sh->e / 4;
        r.tp_s += n[kind] * k->tp_lat + s / k->tp_busbw;
        bw_mb += (s - comm_ring_bytes(kind, per_step[kind], P) * sh->e / 4) / k->tp_busbw;
    }
    r.tp_bw_s = bw_mb;
    double dm[COMM_KINDS];
    dp_step_floats(c, P, D, sh->zero, sh->bf16, dm);  // every payload in elements of e bytes
    for (int kind = 0; kind < COMM_KINDS && D > 1; kind++)
        if (dm[kind] > 0) r.dp_s += k->dp_lat + comm_ring_bytes(kind, dm[kind], D) * sh->e / 4 / k->dp_busbw;
    r.total_s = r.compute_s + r.tp_s + r.dp_s;
    r.k = P > 1 && k->split_s > 0 ? bw_mb / (sh->A * k->split_s * (P - 1)) : 0;
    return r;
}

// plan_pp_step: the same step with the layers in S pipeline stages of P ranks each (--pp S; train/pipeline.h).
//
// Stage s holds L_s layers, the first the embedding, the last the LM head; its share of a micro-batch's
// matmul FLOPs is f_s = (L_s (24 C^2 + 4 T C) + [last] 2 C Vp) / (L (24 C^2 + 4 T C) + 2 C Vp), and it does
// that share of the compute and of the TP collectives of a micro-batch (one1: plan_step's grid without
// stages, per micro-batch compute / A and tp / A). It also sends the boundary tensor, B T C values (B T C / P
// with SP), to each neighbour: a latency and e B T C / bw per direction (tp's --dtype bf16: the stream forward
// in bf16, 2 B T C, its gradient back in fp32), bw the NVLink bus inside a node or
// the network when its replica's S P GPUs span nodes (pp_lat, pp_busbw). With c_s its time per micro-batch,
// both schedules take
//   pipe = (A - 1) max_s c_s + sum_s c_s
// (the first micro-batch passes every stage once, the other A - 1 follow at the pace of the slowest; for
// equal stages (A + S - 1) c, whose (S - 1) / (A + S - 1) is the bubble: exactly what an event simulation
// of either schedule gives; for uneven stages an upper bound, up to 17% slow when they differ by up to 3x,
// test_plan_pp); then the update of the largest
// stage's shard, the tied wte's all-reduce between the first and the last stage (Vp C / P values, once a
// step), and the DP exchange of a stage's shard, the largest share of one1's.
static PlanStep plan_pp_step(const GPTConfig* c, const PlanShape* sh, int P, int D, int S, const PlanCosts* k, double pp_lat,
                             double pp_busbw) {
    PlanStep one1 = plan_step(c, sh, P, D, k);
    if (S == 1) return one1;
    double layer = 24.0 * c->C * c->C + 4.0 * sh->T * c->C, head = 2.0 * c->C * c->Vp, all = c->L * layer + head;
    double compute_mb = k->slow * (k->split_s + k->rest_s), tp_mb = one1.tp_s / sh->A;
    double N = (double)sh->B * sh->T / (sp_splits(sh->sp, P, sh->B, sh->T) ? P : 1);
    double fwd_e = sh->e == 4 && sh->bf16 ? 2 : sh->e;  // (gpt_stage_floats, gpt_stage_grad_floats)
    double hop_fwd = pp_lat + fwd_e * N * c->C / pp_busbw, hop_bwd = pp_lat + sh->e * N * c->C / pp_busbw;
    double cmax = 0, csum = 0, fmax = 0;
    PlanStep r = {};
    for (int s = 0; s < S; s++) {
        int l0, nl;
        pp_stage_layers(c->L, S, s, &l0, &nl);
        double f = (nl * layer + (s == S - 1 ? head : 0)) / all;
        // its sends: forward to the next stage, backward to the previous
        double cs = f * (compute_mb + tp_mb) + (s < S - 1) * hop_fwd + (s > 0) * hop_bwd;
        cmax = std::max(cmax, cs);
        csum += cs;
        fmax = std::max(fmax, f);
        r.compute_s = std::max(r.compute_s, f * compute_mb);
    }
    double tied = pp_lat + sh->e * (double)c->Vp / P * c->C / pp_busbw;
    r.tp_s = fmax * one1.tp_s;  // the slowest stage's, for the share printed
    r.dp_s = fmax * one1.dp_s;
    r.total_s = (sh->A - 1) * cmax + csum + k->slow * fmax * k->update_s + tied + r.dp_s;
    r.k = one1.k;
    return r;
}

// The closed form of k for an achieved rate F (FLOP/s) and a bus bandwidth W (bytes/s), e bytes a value.
static double plan_k(const GPTConfig* c, int T, bool sp, int e, double F, double W) {
    double L = c->L, C = c->C;
    double q = sp ? (10 * L + 4) * C + 6 : 2 * ((4 * L + 2) * C + 3);  // bytes/e a rank sends per token, x P/(P-1)
    return e * F * q / (W * plan_flops_per_token(c, T));
}

// ----------------------------------------------------------------------------
// the named boxes (README "When does TP pay?" gives the source of every number; none is measured here)

struct PlanBox {
    const char* name;
    const char* what;
    int gpus, nodes;        // GPUs per node, nodes
    double tf32, bf16;      // dense tensor-core peak per GPU, TFLOP/s (fp32 training runs its matmuls in TF32)
    double achieved;        // the fraction of peak a training step's matmuls reach (an assumption)
    double mem_gb;          // memory per GPU
    double hbm_gbs;         // memory bandwidth per GPU, GB/s (for the replicated, memory-bound work)
    double busbw, lat_us;   // all-reduce inside a node: nccl-tests busbw (GB/s) and small-message latency
    double net_busbw, net_lat_us;  // between nodes, per DP group (one GPU per node)
};

static const PlanBox g_boxes[] = {
    {"h100", "8x H100 SXM 80GB, NVLink 4", 8, 1, 494.7, 989.4, 0.5, 80, 3350, 450, 10, 0, 0},
    {"h200", "8x H200 SXM 141GB, NVLink 4", 8, 1, 494.7, 989.4, 0.5, 141, 4800, 475, 10, 0, 0},
    {"a100", "8x A100 SXM 80GB, NVLink 3", 8, 1, 156, 312, 0.5, 80, 2039, 200, 10, 0, 0},
    {"a100pcie", "4x A100 PCIe 80GB, PCIe 4 (no NVLink bridge)", 4, 1, 156, 312, 0.5, 80, 1935, 20, 25, 0, 0},
    {"4090x4", "4x RTX 4090 24GB, PCIe 4 without P2P", 4, 1, 82.6, 165.2, 0.5, 24, 1008, 20, 30, 0, 0},
    {"4090x2", "2x RTX 4090 24GB, PCIe 4 without P2P", 2, 1, 82.6, 165.2, 0.5, 24, 1008, 20, 30, 0, 0},
    {"h100x2", "2 nodes of 8x H100 SXM 80GB, NVLink 4 inside, InfiniBand NDR 400 Gb/s per GPU between", 8, 2,
     494.7, 989.4, 0.5, 80, 3350, 450, 10, 45, 25},
};
#define NUM_BOXES ((int)(sizeof(g_boxes) / sizeof(g_boxes[0])))

static const PlanBox* plan_box_find(const char* name) {
    for (const PlanBox& b : g_boxes)
        if (!strcmp(b.name, name)) return &b;
    return nullptr;
}

// --plan custom: a box from --plan-flops (achieved TF32 TFLOP/s per GPU; bf16 twice it, the ratio of
// every box above), --plan-busbw (GB/s), --plan-lat (us), --plan-mem (GB), --plan-gpus. Its replicated
// work is not modelled (no memory bandwidth given): its prediction leaves it out.
static PlanBox plan_box_custom(const Args* a) {
    PlanBox b = {"custom", "given by --plan-flops, --plan-busbw, --plan-lat, --plan-mem, --plan-gpus", a->plan_gpus, 1,
                 a->plan_flops, 2 * a->plan_flops, 1.0, a->plan_mem, 0, a->plan_busbw, a->plan_lat, 0, 0};
    return b;
}

// The costs of grid (P, D) on a box, for e bytes a value (4: fp32 in TF32, 2: bf16).
static PlanCosts plan_box_costs(const PlanBox* b, const GPTConfig* c, const PlanShape* sh, int P, int D) {
    PlanCosts k = {};
    double F = (sh->e == 2 ? b->bf16 : b->tf32) * 1e12 * b->achieved;
    k.split_s = plan_rank_flops(c, sh->B, sh->T, P) / F;
    if (b->hbm_gbs > 0) {
        bool split = sp_splits(sh->sp, P, sh->B, sh->T);
        double tokens = (double)sh->B * sh->T / (split ? P : 1);
        k.rest_s = sh->e * plan_rest_floats_per_token(c) * tokens / (b->hbm_gbs * 1e9);
        // AdamW reads the fp32 master, the gradient, m and v and writes master, m and v: 28 bytes a parameter
        RankMemory m = rank_memory(c, P, D, sh->zero, 1, 1, false, 0, true);
        k.update_s = 28.0 * (m.moments / 8) / (b->hbm_gbs * 1e9);
    }
    k.slow = 1;
    k.tp_lat = b->lat_us * 1e-6;
    k.tp_busbw = b->busbw * 1e9;
    // the DP group of TP rank r: rank r of every replica. It stays in a node while the D replicas of P
    // GPUs fit one node; else it crosses the network (one GPU per node per group, each with its own NIC)
    bool crosses = b->nodes > 1 && P * D > b->gpus;
    k.dp_lat = (crosses ? b->net_lat_us : b->lat_us) * 1e-6;
    k.dp_busbw = (crosses ? b->net_busbw : b->busbw) * 1e9;
    return k;
}

// ----------------------------------------------------------------------------
// this machine: the measurement

// What --plan 1 measured, per grid: the compute of one rank (each distinct P and threads per rank) and
// the collectives of each group size.
struct PlanCompute {
    int P, threads;
    int together;  // the ranks that ran side by side while it was measured (plan_ranks_together)
    double split_s, rest_s, update_s;
    double cpu_s;  // the CPU time of the rank's thread for forward + backward (1 thread: the work itself)
    double flops;  // plan_rank_flops at this P: split_s's FLOPs
};
struct PlanComm {
    int n;               // ranks in the group
    double lat, busbw;   // seconds per call (1 float), bytes/s (fitted: time = lat + ring bytes / busbw)
    double lat_step;     // seconds per call between pieces of a step's work (CPU; see plan_measure_comm)
    double nccl_busbw;   // as nccl-tests prints it at the measured size: algbw 2(n-1)/n
    long floats;         // the measured size
};
struct PlanMeasured {
    std::vector<PlanCompute> compute;
    std::vector<PlanComm> comm;
    double seconds;  // the measurement's own wall time
};

// waits for the rank's queued work (a GPU's stream), so that a host timer brackets it
static void plan_sync(Rank* rk) {
    if (rk->device == DEV_CUDA) CUDA_CHECK(rk->rank, cudaStreamSynchronize(rk->cuda.stream));
}

// the CPU time this thread has used, seconds
static double plan_cpu_now() {
    timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

// the median of a few timings
static double plan_median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// the threads per rank of grid (P, D), as ranks_setup gives them: cores / (P x D), at least 1
static int plan_threads(const Run* run, int P, int D) {
    return run->args.threads ? run->args.threads : std::max(1, cpu_cores() / (P * D));
}

// How many ranks of grid (P, D) run side by side while one is measured: on the CPU all P x D of them
// (they share the cores, so their time-slicing, the caches they share and the memory bandwidth they
// split are then in the measurement, and so is whatever else loads the machine); on CUDA one (each GPU
// runs its own ranks' kernels; plan_slowdown counts the ranks that share a GPU).
static int plan_ranks_together(const Run* run, int P, int D) { return run->device == DEV_CPU ? P * D : 1; }

// ranks per compute unit of grid (P, D) that the measurement did not include: on CUDA the ranks per
// GPU; on the CPU none (plan_ranks_together ran them all together).
static double plan_slowdown(const Run* run, int P, int D) {
    return run->device == DEV_CUDA ? std::max(1.0, (double)P * D / run->ngpu) : 1.0;
}

// The compute of rank 0 of P at the run's shapes with `threads` threads, while `together` - 1 more ranks
// (threads of their own, each with `threads` threads) do the same work beside it: the whole forward +
// backward and the update through gpt.cu on a group of one rank each (their collectives do nothing, so
// this is compute only, at exactly the local shapes of a rank of P), and the matmuls and attention of
// the recipe called directly at the same shapes. rest = forward + backward - matmuls. Medians of rank
// 0's repetitions within `budget` seconds; the others keep working until rank 0 is done.
static void plan_measure_compute(const Run* run, int P, int threads, int together, double budget, PlanCompute* out) {
    std::atomic<int> ready{0};
    std::atomic<bool> stop{false};
    std::vector<std::thread> th;
    for (int r = 0; r < together; r++)
        th.emplace_back([&, r]() {
            const Args* a = &run->args;
            const GPTConfig* c = &run->cfg;
            int B = a->B, T = a->T;
            CommGroup* g = new CommGroup();
            comm_group_init(g, 1, a->timeout);
            Rank rk;
            rank_init(&rk, g, 0, run->device, 0, threads);
            rk.P = P;  // a rank of P, on a group of one
            GPT m;
            gpt_build(&m, &rk, c, run->init.data(), 0);
            gpt_set_dtype(&m, &rk, a->dtype == DTYPE_BF16, (uint32_t)a->seed);  // the run's
            m.sp = a->sp;
            m.recompute = a->recompute;
            m.fused = a->attention != 0;
            std::vector<int> tok((size_t)B * T), tgt((size_t)B * T);
            for (long i = 0; i < (long)B * T; i++) { tok[i] = (int)((i * 7919) % c->V); tgt[i] = (int)((i * 104729 + 1) % c->V); }
            m.dloss = 1.0f / (B * T);
            AdamW opt = {1e-4f, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0f};
            std::vector<double> fb, up, mm, ops, cpu, whole;
            ready++;
            while (ready.load() < together) std::this_thread::sleep_for(std::chrono::microseconds(200));
            double t_start = comm_now();
            // rank 0: at least 12 repetitions (the first untimed) and 0.5 s, so that the medians see the time-slicing
            // of its neighbours, unless the budget runs out first; at most 400
            for (int rep = 0; r == 0 ? rep < 400 : !stop.load(); rep++) {
                double t0 = comm_now(), c0 = plan_cpu_now();
                gpt_forward(&m, &rk, tok.data(), tgt.data(), B, T, true);
                gpt_backward(&m, &rk);
                plan_sync(&rk);
                double t1 = comm_now(), c1 = plan_cpu_now();
                gpt_update(&m, &rk, &rk.tp, &opt);
                plan_sync(&rk);
                double t2 = comm_now();
                // the matmuls and attention of one layer, called as gpt.cu calls them (every token's
                // inputs), x L, and the LM head
                const ShardPlan* s = &m.plan;
                Acts* x = &m.acts;
                Params* p = &m.params;
                LayerActs la = layer_acts(&m, 0);
                int C = c->C, Cl = s->Cl, C4l = s->C4l, Vl = s->Vl, NHl = s->NHl, hs = m.hs, BT = B * T;
                float* in = x->lnf;  // (B, T, C): an input of every token
                double t3 = comm_now();
                float* qkv = qkv_sums(&m, &la);
                OP(&rk, matmul_forward, qkv, in, WEIGHT(&m, qkvw, 0), p->qkvb, BT, C, 3 * Cl);
                Input qkv_in = qkv_input(&m, &rk, &la, qkv, false);  // (a bf16 run's fused attention: rounded into bf16)
                if (m.fused) OP(&rk, attention_fused_forward, la.atty, la.lse, qkv_in, B, T, NHl, hs);
                else OP(&rk, attention_forward, la.atty, la.att, qkv, B, T, NHl, hs);
                OP(&rk, matmul_forward, x->partial, la.atty, WEIGHT(&m, attprojw, 0), nullptr, BT, Cl, C);
                // (fc's output and fcproj's input, the GELU's output, in one buffer of their shape: dfch, which every
                // run has, where a bf16 run has no fp32 fch or fch_gelu; these are timed, their values unused)
                OP(&rk, matmul_forward, x->dfch, in, WEIGHT(&m, fcw, 0), p->fcb, BT, C, C4l);
                OP(&rk, matmul_forward, x->partial, x->dfch, WEIGHT(&m, fcprojw, 0), nullptr, BT, C4l, C);
                OP(&rk, matmul_backward, x->dfch, GRAD(&m, fcprojw, 0), GRAD(&m, fcprojb, 0), x->partial, x->dfch, WEIGHT(&m, fcprojw, 0), BT, C4l, C);
                OP(&rk, matmul_backward, x->dln, GRAD(&m, fcw, 0), GRAD(&m, fcb, 0), x->dfch, in, WEIGHT(&m, fcw, 0), BT, C, C4l);
                OP(&rk, matmul_backward, x->datty, GRAD(&m, attprojw, 0), GRAD(&m, attprojb, 0), x->partial, la.atty, WEIGHT(&m, attprojw, 0), BT, Cl, C);
                Input dqkv = {x->dqkv, nullptr};
                if (m.fused) dqkv = attention_fused_backward_input(&m, &rk, &la, qkv_in, Input{la.atty, nullptr});
                else OP(&rk, attention_backward, x->dqkv, x->datty, qkv, la.att, B, T, NHl, hs);
                OP(&rk, matmul_backward, x->dln, GRAD(&m, qkvw, 0), GRAD(&m, qkvb, 0), dqkv, Input{in, nullptr}, WEIGHT(&m, qkvw, 0), BT, C, 3 * Cl);
                plan_sync(&rk);
                double t4 = comm_now();
                OP(&rk, matmul_forward, logits_of(&m), x->lnf, WEIGHT(&m, wte, 0), nullptr, BT, C, Vl);
                OP(&rk, matmul_backward, x->dln, GRAD(&m, wte, 0), nullptr, logits_of(&m), x->lnf, WEIGHT(&m, wte, 0), BT, C, Vl);
                plan_sync(&rk);
                double t5 = comm_now();
                if (r != 0 || rep == 0) continue;  // the first warms caches and allocations
                fb.push_back(t1 - t0);
                cpu.push_back(c1 - c0);
                up.push_back(t2 - t1);
                mm.push_back((t4 - t3) * c->L + (t5 - t4));
                ops.push_back(t5 - t3);
                whole.push_back(t5 - t0);
                double spent = comm_now() - t_start;
                if ((rep >= 12 && spent > std::min(0.5, budget)) || spent > budget) break;
            }
            if (r == 0) {
                stop.store(true);
                out->P = P;
                out->threads = threads;
                out->together = together;
                // The parts are medians (robust to a stray interruption), scaled so that together they take the
                // mean time of a repetition: ranks that share cores are time-sliced at a few ms, longer than
                // most parts, so a short part is timed mostly while its rank runs and its median misses the
                // slicing that the mean over many repetitions (as a run's steps average it) contains.
                double mean = 0;
                for (double w : whole) mean += w / whole.size();
                double parts = plan_median(fb) + plan_median(up) + plan_median(ops);
                double scale = parts > 0 ? mean / parts : 1;
                out->split_s = scale * plan_median(mm);
                out->rest_s = std::max(0.0, scale * plan_median(fb) - out->split_s);
                out->update_s = scale * plan_median(up);
                out->cpu_s = plan_median(cpu);
                out->flops = plan_rank_flops(c, B, T, P);
            }
            gpt_free(&m, &rk);
            rank_free(&rk);
            delete g;
        });
    for (auto& t : th) t.join();
}

// The collectives of a group of n ranks on this machine's backend (threads, as a run makes them): the
// median time of an all-reduce of 1 float (the latency a) and of `floats` floats, fitted as
// a + ring bytes / busbw. On the CPU also the latency inside a step (lat_step): in a step every rank
// computes `work_cpu` seconds of CPU time between two collectives and then waits for the last to arrive,
// and on a shared (loaded or oversubscribed) machine a partner the OS has descheduled arrives late. So
// every rank burns work_cpu of its own CPU time before each small all-reduce, rank 0 times the whole
// interval, and lat_step = interval - `work_wall` (the wall time of that work measured with the n ranks
// side by side: what the compute term already counts), at least a. On a quiet machine with a core per
// rank it is about a.
static void plan_measure_comm(const Run* run, int n, long floats, double budget, double work_cpu, double work_wall, PlanComm* out) {
    CommGroup* g = new CommGroup();
    comm_group_init(g, n, run->args.timeout);
    std::vector<int> gpus(n);
    for (int r = 0; r < n; r++) gpus[r] = run->ngpu ? r % run->ngpu : 0;
    if (run->device == DEV_CUDA && n > 1 && gpus_distinct(gpus.data(), n)) comm_nccl_init_all(g, gpus.data());
    std::vector<double> small, big, step;
    std::vector<std::thread> th;
    std::atomic<bool> stop{false};  // rank 0 decides, before a barrier, when every rank stops
    for (int r = 0; r < n; r++)
        th.emplace_back([&, r]() {
            Rank rk;
            rank_init(&rk, g, r, run->device, gpus[r], 1);
            float* buf = dev_alloc(&rk, floats);
            double t_start = comm_now();
            for (int rep = 0; rep < 400; rep++) {
                bool large = rep % 4 == 3;  // one large per three small
                comm_barrier(&rk.tp, "plan");
                if (stop.load()) break;
                double t0 = comm_now();
                comm_allreduce(&rk.tp, buf, large ? floats : 1, COMM_SUM, "plan", -1);
                comm_sync(&rk.tp);
                double dt = comm_now() - t0;
                if (r == 0 && rep >= 8) (large ? big : small).push_back(dt);
                if (rep % 4 == 1 && work_cpu > 0 && run->device == DEV_CPU) {  // a step's interval: work, then a call
                    comm_barrier(&rk.tp, "plan");
                    double w0 = comm_now(), c0 = plan_cpu_now();
                    volatile double sink = 0;
                    while (plan_cpu_now() - c0 < work_cpu) sink = sink + 1;
                    comm_allreduce(&rk.tp, buf, 1, COMM_SUM, "plan", -1);
                    if (r == 0 && rep >= 8) step.push_back(comm_now() - w0);
                }
                if (r == 0 && rep >= 40 && comm_now() - t_start > budget) stop.store(true);
            }
            dev_free(&rk, buf);
            rank_free(&rk);
        });
    for (auto& t : th) t.join();
    delete g;
    double a = plan_median(small), t = plan_median(big);
    double ring = comm_ring_bytes(KIND_ALLREDUCE, (double)floats, n);
    out->n = n;
    out->floats = floats;
    out->lat = a;
    // the mean, not the median: a partner descheduled for a time slice delays a few calls by milliseconds,
    // and a step pays for those calls as its mean does (see plan_measure_compute)
    double step_mean = 0;
    for (double x : step) step_mean += x / step.size();
    out->lat_step = step.empty() ? a : std::max(a, step_mean - work_wall);
    out->busbw = ring / std::max(t - a, 1e-9);
    out->nccl_busbw = ring / std::max(t, 1e-9);
}

// every grid (P, D) the sweep runs, in its order; `units` as the sweep counts them
static std::vector<std::pair<int, int>> plan_grids(const Run* run) {
    const GPTConfig* c = &run->cfg;
    const Args* a = &run->args;
    int units = run->device == DEV_CUDA ? run->ngpu : cpu_cores();
    std::vector<std::pair<int, int>> grids;
    for (int D = 1; D <= units || D == 1; D++)
        for (int P = 1; P <= c->NH && P <= COMM_MAXP; P++) {
            if (!tp_valid(c, P) || (D > 1 && P * D > units) || P * D > COMM_MAXP) continue;
            if (a->sp && P > 1 && !sp_splits(true, P, a->B, a->T)) continue;
            grids.push_back({P, D});
        }
    return grids;
}

static const PlanCompute* plan_compute_of(const PlanMeasured* pm, int P, int threads, int together) {
    for (const PlanCompute& c : pm->compute)
        if (c.P == P && c.threads == threads && c.together == together) return &c;
    return nullptr;
}
// --plan 1 and the sweep: measures what every grid of plan_grids needs, with a progress line. About
// 20 s at most: the compute of each distinct (P, threads, ranks side by side) gets its share of 14 s,
// each group size 1 s.
static void plan_measure(const Run* run, PlanMeasured* pm, bool quiet = false) {
    double t0 = comm_now();
    std::vector<std::pair<int, int>> grids = plan_grids(run);
    struct Config { int P, threads, together; };
    std::vector<Config> configs;
    std::vector<int> sizes;  // group sizes, TP and DP
    for (auto& g : grids) {
        Config k = {g.first, plan_threads(run, g.first, g.second), plan_ranks_together(run, g.first, g.second)};
        bool seen = false;
        for (const Config& o : configs) seen |= o.P == k.P && o.threads == k.threads && o.together == k.together;
        if (!seen) configs.push_back(k);
        for (int n : {g.first, g.second})
            if (n > 1 && std::find(sizes.begin(), sizes.end(), n) == sizes.end()) sizes.push_back(n);
    }
    long floats = (long)run->args.B * run->args.T * run->cfg.C;  // the step's all-reduces carry B T C floats
    int total = (int)(configs.size() + sizes.size()), done = 0;
    pm->compute.clear();
    pm->comm.clear();
    for (const Config& k : configs) {
        if (!quiet) {
            printf("\rplan: measuring compute at P=%d, %d thread%s per rank, %d rank%s at once (%d of %d) ...", k.P, k.threads,
                   k.threads > 1 ? "s" : "", k.together, k.together > 1 ? "s" : "", ++done, total);
            fflush(stdout);
        }
        PlanCompute pc;
        plan_measure_compute(run, k.P, k.threads, k.together, 14.0 / configs.size(), &pc);
        pm->compute.push_back(pc);
    }
    for (int n : sizes) {
        if (!quiet) {
            printf("\rplan: measuring all-reduce over %d ranks (%d of %d) ...%30s", n, ++done, total, "");
            fflush(stdout);
        }
        // the work between two TP collectives of grid (n, 1): a micro-batch's forward + backward over its calls
        double calls[COMM_KINDS], ncalls = 0, work_cpu = 0, work_wall = 0;
        step_comm_calls(&run->cfg, sp_splits(run->args.sp, n, run->args.B, run->args.T), 1, calls);
        for (double x : calls) ncalls += x;
        const PlanCompute* pc = plan_compute_of(pm, n, plan_threads(run, n, 1), plan_ranks_together(run, n, 1));
        if (pc) {
            work_cpu = pc->cpu_s / ncalls;
            work_wall = (pc->split_s + pc->rest_s) / ncalls;
        }
        PlanComm cm;
        plan_measure_comm(run, n, floats, 1.0, work_cpu, work_wall, &cm);
        pm->comm.push_back(cm);
    }
    pm->seconds = comm_now() - t0;
    if (!quiet) printf("\rplan: measured in %.1f s%40s\n", pm->seconds, "");
}

static const PlanComm* plan_comm_of(const PlanMeasured* pm, int n) {
    for (const PlanComm& c : pm->comm)
        if (c.n == n) return &c;
    return nullptr;
}

// the shape of this run's steps
// bf16: tp's --dtype bf16 (with e = 4)
static PlanShape plan_shape(const Run* run, int e, bool bf16) {
    const Args* a = &run->args;
    PlanShape sh = {a->B, a->T, run->accum, a->sp != 0, a->zero, e, bf16};
    return sh;
}

// The costs of grid (P, D) on this machine from its measurement (DP over one process: the DP group is
// D threads of the same backend).
static PlanCosts plan_costs_here(const Run* run, const PlanMeasured* pm, int P, int D) {
    PlanCosts k = {};
    const PlanCompute* pc = plan_compute_of(pm, P, plan_threads(run, P, D), plan_ranks_together(run, P, D));
    if (!pc) fatal("plan: grid P=%d D=%d was not measured", P, D);
    k.split_s = pc->split_s;
    k.rest_s = pc->rest_s;
    // ZeRO-1: each replica updates 1/D of the shard
    k.update_s = pc->update_s / (run->args.zero ? D : 1);
    k.slow = plan_slowdown(run, P, D);
    const PlanComm* tp = plan_comm_of(pm, P);
    const PlanComm* dp = plan_comm_of(pm, D);
    k.tp_lat = tp ? tp->lat_step : 0;
    k.tp_busbw = tp ? tp->busbw : 1e30;
    k.dp_lat = dp ? dp->lat_step : 0;
    k.dp_busbw = dp ? dp->busbw : 1e30;
    return k;
}

// the prediction for grid (P, D) of this run on this machine, ms per step
static double plan_predict_ms(const Run* run, const PlanMeasured* pm, int P, int D) {
    PlanShape sh = plan_shape(run, 4, run->args.dtype == DTYPE_BF16);
    PlanCosts k = plan_costs_here(run, pm, P, D);
    return 1e3 * plan_step(&run->cfg, &sh, P, D, &k).total_s;
}

// The same for grid (P, D, S), pipeline stages in one process (plan_pp_step). Its P D S ranks share the
// cores as P D S ranks of replicas do, so a stage's compute is what the grid (P, D S) measured; the DP
// group is D ranks, and a boundary hop costs what a collective of two ranks costs here (one copy out of
// the sender's memory, one into the receiver's).
static double plan_predict_pp_ms(const Run* run, const PlanMeasured* pm, int P, int D, int S) {
    if (S == 1) return plan_predict_ms(run, pm, P, D);
    PlanShape sh = plan_shape(run, 4, run->args.dtype == DTYPE_BF16);
    PlanCosts k = plan_costs_here(run, pm, P, D * S);
    k.update_s *= run->args.zero ? S : 1;  // (plan_costs_here divided the update over D S replicas)
    const PlanComm* dp = plan_comm_of(pm, D);
    k.dp_lat = dp ? dp->lat_step : 0;
    k.dp_busbw = dp ? dp->busbw : 1e30;
    const PlanComm* hop = plan_comm_of(pm, 2);
    return 1e3 * plan_pp_step(&run->cfg, &sh, P, D, S, &k, hop ? hop->lat_step : 0, hop ? hop->busbw : 1e30).total_s;
}

// ----------------------------------------------------------------------------
// printing

// one row of a plan table; returns tokens/s
struct PlanRow {
    int P, D;
    PlanStep st;
    double tps, speedup, mem, share;
    bool fits;
};

static void plan_print_header() {
    printf("%4s %4s %10s %11s %8s %7s %7s %7s %12s %5s\n", "P", "D", "ms/step", "tok/s", "speedup", "k", "comm %", "dp %",
           "MB per rank", "fits");
}

static void plan_print_row(const PlanRow* r) {
    char k[16];
    if (r->P > 1) snprintf(k, sizeof(k), "%.3f", r->st.k);
    else snprintf(k, sizeof(k), "-");
    printf("%4d %4d %10.2f %11.0f %8.2f %7s %7.1f %7.1f %12.1f %5s\n", r->P, r->D, 1e3 * r->st.total_s, r->tps, r->speedup, k,
           100 * r->st.tp_s / r->st.total_s, 100 * r->st.dp_s / r->st.total_s, r->mem / 1e6, r->fits ? "yes" : "no");
}

// the recommendation: the fastest grid that fits (tokens/s), and why in one sentence
static void plan_recommend(const std::vector<PlanRow>& rows, const char* unit) {
    const PlanRow* best = nullptr;
    for (const PlanRow& r : rows)
        if (r.fits && (!best || r.tps > best->tps * 1.0001)) best = &r;
    if (!best) {
        printf("recommended: none fits; lower -b or -t, add -r or --sp 1, or -z 1 with replicas\n");
        return;
    }
    const PlanRow* one = nullptr;
    for (const PlanRow& r : rows)
        if (r.P == 1 && r.D == best->D) one = &r;
    char why[256];
    if (best->P == 1 && best->D == 1) snprintf(why, sizeof(why), "nothing else is faster: splitting the layers costs more in collectives than it saves in compute");
    else if (best->P == 1) snprintf(why, sizeof(why), "data parallelism adds throughput for one gradient exchange per step, and TP's per-layer all-reduces would cost more than they save");
    else if (!one || !one->fits) snprintf(why, sizeof(why), "the model does not fit one %s without it, and this is the fastest split that does", unit);
    else snprintf(why, sizeof(why), "TP=%d is %.2fx the tokens/s of TP=1 at %d replica%s: its compute shrinks by %d and its collectives cost %.0f%% of the step (k = %.3f < 1)",
                  best->P, best->tps / one->tps, best->D, best->D > 1 ? "s" : "", best->P, 100 * best->st.tp_s / best->st.total_s, best->st.k);
    printf("recommended: --tp %d --dp %d (%.0f tok/s): %s\n", best->P, best->D, best->tps, why);
}

// --plan 1: this machine
static void plan_here(Run* run) {
    const Args* a = &run->args;
    const GPTConfig* c = &run->cfg;
    bool cpu = run->device == DEV_CPU;
    int cores = cpu_cores();
    printf("\nplan: predicted training steps on this machine (%s, --dtype %s), batch %d x %d per replica%s; nothing is trained\n",
           cpu ? "CPU" : "GPU", a->dtype == DTYPE_BF16 ? "bf16" : "fp32", a->B, a->T, run->accum > 1 ? ", with micro-steps" : "");
    if (cpu)
        printf("  on the CPU the P x D ranks share the %d cores: a rank gets cores/(P x D) threads (at least 1), and a\n"
               "  grid's ranks are measured running side by side, so their time-slicing is in the measurement\n", cores);
    PlanMeasured pm;
    plan_measure(run, &pm);
    printf("compute of one rank per micro-batch, measured at each P's local shapes%s:\n", cpu ? " with its grid's ranks beside it" : "");
    printf("%4s %8s %8s %12s %12s %12s %12s\n", "P", "threads", "ranks", "matmuls ms", "GFLOP/s", "rest ms", "update ms");
    for (const PlanCompute& k : pm.compute)
        printf("%4d %8d %8d %12.2f %12.1f %12.2f %12.2f\n", k.P, k.threads, k.together, 1e3 * k.split_s, k.flops / k.split_s / 1e9,
               1e3 * k.rest_s, 1e3 * k.update_s);
    if (!pm.comm.empty()) {
        printf("all-reduce over n ranks (%s), as nccl-tests reports it:\n", cpu ? "shared memory" : run->ngpu > 1 ? "NCCL" : "shared GPU memory");
        printf("%4s %12s %14s %12s %14s %16s\n", "n", "latency us", "in a step us", "size MB", "busbw GB/s", "fitted GB/s");
        for (const PlanComm& m : pm.comm)
            printf("%4d %12.1f %14.1f %12.2f %14.2f %16.2f\n", m.n, 1e6 * m.lat, 1e6 * m.lat_step, 4.0 * m.floats / 1e6,
                   m.nccl_busbw / 1e9, m.busbw / 1e9);
    }
    std::vector<PlanRow> rows;
    double base = 0;
    PlanShape sh = plan_shape(run, 4, a->dtype == DTYPE_BF16);
    for (auto& g : plan_grids(run)) {
        PlanRow r;
        r.P = g.first;
        r.D = g.second;
        PlanCosts k = plan_costs_here(run, &pm, r.P, r.D);
        r.st = plan_step(c, &sh, r.P, r.D, &k);
        r.tps = (double)a->B * a->T * run->accum * r.D / r.st.total_s;
        if (base == 0) base = r.tps;
        r.speedup = r.tps / base;
        r.mem = plan_memory(c, r.P, r.D, a->zero, a->B, a->T, a->sp, a->recompute, a->attention != 0, 4, 1, 0, 1, sh.bf16);
        std::string why;
        r.fits = memory_fits(run, r.P, r.D, &why);
        rows.push_back(r);
    }
    printf("predicted (k: TP's bandwidth time over the matmuls' time, per extra rank; speedup in tokens/s over one rank):\n");
    plan_print_header();
    for (const PlanRow& r : rows) plan_print_row(&r);
    plan_recommend(rows, cpu ? "rank" : "GPU");
}

// one model on one box, fp32 (TF32 matmuls) or bf16 (a prediction: tp trains in fp32): every grid with
// P GPUs of one node per replica and D = 1 or as many replicas as the box holds; returns the rows
static std::vector<PlanRow> plan_box_rows(const PlanBox* b, const GPTConfig* c, const PlanShape* sh, int recompute, bool fused) {
    std::vector<PlanRow> rows;
    double base = 0;  // (a TP group stays in one node: each node holds gpus / P whole replicas)
    for (int P = 1; P <= b->gpus; P++) {
        if (!tp_valid(c, P)) continue;
        for (int D : {1, b->nodes * (b->gpus / P)}) {
            bool dup = false;
            for (const PlanRow& r : rows) dup |= r.P == P && r.D == D;
            if (dup) continue;
            PlanRow r;
            r.P = P;
            r.D = D;
            PlanCosts k = plan_box_costs(b, c, sh, P, D);
            r.st = plan_step(c, sh, P, D, &k);
            r.tps = (double)sh->B * sh->T * sh->A * D / r.st.total_s;
            if (base == 0) base = r.tps;
            r.speedup = r.tps / base;
            r.mem = plan_memory(c, P, D, sh->zero, sh->B, sh->T, sh->sp, recompute, fused, sh->e);
            r.fits = CUDA_CONTEXT_BYTES + ESTIMATE_MARGIN * r.mem <= b->mem_gb * 1e9;
            rows.push_back(r);
        }
    }
    return rows;
}

// The box's grids with pipeline stages (fp32): every (P, S, D) that uses all its GPUs, P inside a node,
// S up to the layers; a replica's S P GPUs are consecutive, so its stages cross the network when S P is
// more than a node's GPUs. With -d's A micro-batches (1F1B: the first stage keeps min(S, A) in flight).
static void plan_box_pipelines(const PlanBox* b, const GPTConfig* c, const Run* run) {
    const Args* a = &run->args;
    PlanShape sh = plan_shape(run, 4, false);
    int total = b->gpus * b->nodes;
    printf("with pipeline stages (fp32, %d micro-batch%s per step: -d; the step (A - 1) max_s c_s + sum_s c_s, see plan_pp_step):\n",
           sh.A, sh.A > 1 ? "es" : "");
    printf("%4s %4s %4s %10s %11s %8s %8s %12s %5s %s\n", "P", "S", "D", "ms/step", "tok/s", "bubble", "comm %", "MB per rank", "fits",
           "stages");
    double best = 0, best_flat = 0;
    int bP = 0, bS = 0, bD = 0;
    for (int P = 1; P <= b->gpus; P++) {
        if (!tp_valid(c, P)) continue;
        for (int S = 1; S <= c->L && P * S <= total; S++) {
            if (total % (P * S) != 0) continue;
            int D = total / (P * S);
            bool span = P * S > b->gpus;  // a replica's stages cross nodes
            PlanCosts k = plan_box_costs(b, c, &sh, P, D);
            // plan_box_costs places the P x D ranks of a grid without stages; with stages a stage's DP group
            // crosses nodes when the replicas fill more than a node, or when each replica spans the nodes
            // (its DP peers are then a node away too): DP over the network
            if (S > 1 && b->nodes > 1 && (span || P * S * D > b->gpus)) {
                k.dp_lat = b->net_lat_us * 1e-6;
                k.dp_busbw = b->net_busbw * 1e9;
            }
            double lat = (span ? b->net_lat_us : b->lat_us) * 1e-6, bw = (span ? b->net_busbw : b->busbw) * 1e9;
            PlanStep st = plan_pp_step(c, &sh, P, D, S, &k, lat, bw);
            double tps = (double)sh.B * sh.T * sh.A * D / st.total_s, mem = 0;
            for (int s = 0; s < S; s++)
                mem = std::max(mem, plan_memory(c, P, D, sh.zero, sh.B, sh.T, sh.sp, a->recompute, a->attention != 0, 4, S, s,
                                                S > 1 ? pp_slots(PP_1F1B, S, s, sh.A) : 1));
            bool fits = CUDA_CONTEXT_BYTES + ESTIMATE_MARGIN * mem <= b->mem_gb * 1e9;
            printf("%4d %4d %4d %10.2f %11.0f %7.1f%% %7.1f%% %12.1f %5s %s\n", P, S, D, 1e3 * st.total_s, tps,
                   S > 1 ? 100 * pp_bubble(S, sh.A) : 0.0, 100 * st.tp_s / st.total_s, mem / 1e6, fits ? "yes" : "no",
                   S == 1 ? "-" : span ? "across nodes" : "inside a node");
            if (fits && tps > best) { best = tps; bP = P; bS = S; bD = D; }
            if (fits && S == 1) best_flat = std::max(best_flat, tps);
        }
    }
    if (best > 0)
        printf("recommended with stages: --tp %d --pp %d and %d replica%s (%.0f tok/s%s)\n", bP, bS, bD, bD > 1 ? "s" : "", best,
               bS == 1 ? ": no pipeline beats TP x DP here" : best_flat > 0 ? (", " + std::to_string((int)(100 * (best / best_flat - 1) + 0.5)) + "% over the best grid without stages").c_str() : "");
}

// --plan NAME / custom: the chosen model on a box, fp32 and bf16; then where each GPT-2 size stops
// fitting one GPU and which grid is fastest
static void plan_box(Run* run, const PlanBox* b) {
    const Args* a = &run->args;
    const GPTConfig* c = &run->cfg;
    printf("\nplan for %s: %s (%d GPU%s%s)\n", b->name, b->what, b->gpus * b->nodes, b->gpus * b->nodes > 1 ? "s" : "",
           b->nodes > 1 ? ", TP inside a node, DP between nodes" : "");
    printf("  per GPU: dense TF32 %.1f / bf16 %.1f TFLOP/s x %.2f achieved, %.0f GB, %.0f GB/s memory; all-reduce busbw %.0f GB/s, %.0f us",
           b->tf32, b->bf16, b->achieved, b->mem_gb, b->hbm_gbs, b->busbw, b->lat_us);
    if (b->nodes > 1) printf("; between nodes %.0f GB/s, %.0f us", b->net_busbw, b->net_lat_us);
    if (strcmp(b->name, "custom"))
        printf("\n  (the box's figures are datasheet peaks and commonly reported nccl-tests results, not measured here: README \"When does TP pay?\")\n");
    else
        printf("\n  (the figures given; a custom box has no memory bandwidth, so its replicated work is left out)\n");
    if (tp_valid_list(c) == "1" || (!tp_valid(c, 2) && !tp_valid(c, 3) && !tp_valid(c, 4)))
        printf("  note: --tp must divide the %d heads and the padded vocab %d: valid --tp values are %s, so TP %s this model\n",
               c->NH, c->Vp, tp_valid_list(c).c_str(), tp_valid_list(c) == "1" ? "cannot split" : "barely splits");
    for (int e : {4, 2}) {
        PlanShape sh = plan_shape(run, e, false);
        printf("%s, batch %d x %d per replica%s:\n",
               e == 4 ? "fp32 (TF32 matmuls), as tp trains with --dtype fp32"
                      : "bf16, a prediction for a trainer that keeps and moves everything in bf16 (tp's --dtype bf16 sums in fp32:\n"
                        "  README \"When does TP pay?\")",
               a->B, a->T, run->accum > 1 ? " with micro-steps" : "");
        plan_print_header();
        std::vector<PlanRow> rows = plan_box_rows(b, c, &sh, a->recompute, a->attention != 0);
        for (const PlanRow& r : rows) plan_print_row(&r);
        plan_recommend(rows, "GPU");
    }
    plan_box_pipelines(b, c, run);
    printf("GPT-2 sizes on %s (batch %d x %d; fp32 | bf16): the fewest TP ranks that fit one replica, and the fastest grid\n", b->name, a->B, a->T);
    for (const char* d : {"d12", "d24", "d36", "d48"}) {
        GPTConfig g;
        gpt_descriptor(d, &g, c->V, c->maxT);
        printf("  %-4s %6.0fM:", d, gpt_num_params(&g) / 1e6);
        for (int e : {4, 2}) {
            PlanShape sh = plan_shape(run, e, false);
            std::vector<PlanRow> rows = plan_box_rows(b, &g, &sh, a->recompute, a->attention != 0);
            int fewest = 0;
            const PlanRow* best = nullptr;
            for (const PlanRow& r : rows) {
                if (r.fits && r.D == 1 && (!fewest || r.P < fewest)) fewest = r.P;
                if (r.fits && (!best || r.tps > best->tps)) best = &r;
            }
            if (!best) printf("  %s: fits no grid", e == 4 ? "fp32" : "| bf16");
            else printf("  %s: fits from TP=%d, fastest --tp %d --dp %d %.0f tok/s", e == 4 ? "fp32" : "| bf16", fewest ? fewest : best->P, best->P, best->D, best->tps);
        }
        printf("\n");
    }
}

// the box --plan names: one of g_boxes, or custom (the --plan-* flags, into *custom); a bad name stops
static const PlanBox* plan_box_of(const Args* a, PlanBox* custom) {
    const PlanBox* b = plan_box_find(a->plan);
    if (!strcmp(a->plan, "custom")) {
        if (a->plan_flops <= 0 || a->plan_busbw <= 0 || a->plan_mem <= 0 || a->plan_gpus < 1)
            fatal("--plan custom needs --plan-flops (TFLOP/s achieved per GPU), --plan-busbw (GB/s), --plan-mem (GB) and --plan-gpus (and --plan-lat in us)");
        *custom = plan_box_custom(a);
        b = custom;
    }
    if (!b) {
        std::string names;
        for (const PlanBox& x : g_boxes) names += std::string(names.empty() ? "" : ", ") + x.name;
        fatal("--plan %s: not a box tp knows; give 1 (this machine), one of %s, or custom with --plan-flops, --plan-busbw, "
              "--plan-lat, --plan-mem and --plan-gpus", a->plan, names.c_str());
    }
    return b;
}

// --plan instead of training (tp_main). 1: the run's setup as for training (the model, the data, the
// device), then the measurement; a box: only the model's shape (-e, default d12 with GPT-2's vocab unless
// --vocab; or a checkpoint's header) and -d's micro-steps. Returns the exit status.
static int plan_run(Run* run) {
    Args* a = &run->args;
    if (g_procs.n > 1) fatal("--plan measures and predicts in one process: start it without mpirun");
    if (!strcmp(a->plan, "1")) {
        run_setup(run);
        print_setup(run);
        ranks_teardown(run);  // run_setup made the groups of the run's own grid; the plan makes its own
        plan_here(run);
        return 0;
    }
    PlanBox custom;
    const PlanBox* b = plan_box_of(a, &custom);
    GPTConfig* c = &run->cfg;
    const char* model = a->model ? a->model : "d12";
    std::string why;
    if (!gpt_descriptor(model, c, a->vocab ? a->vocab : 50257, a->maxT, &why)) {
        struct stat st;
        if (stat(model, &st) != 0 || S_ISDIR(st.st_mode))
            fatal("-e %s: %s", model, why.empty() ? "neither a readable checkpoint file nor a descriptor (d1..d12, d24, d36, d48, or L<layers>C<channels>H<heads>)" : why.c_str());
        model_read(model, c, nullptr);
    }
    if (a->T > c->maxT) fatal("sequence length -t %d exceeds the model's maximum %d: use -t %d or less", a->T, c->maxT, c->maxT);
    grid_setup(run);
    printf("plan: GPT-2 with %d layers, %d heads, %d channels, vocab %d (padded %d), %.2fM parameters (-e %s%s)\n", c->L, c->NH,
           c->C, c->V, c->Vp, gpt_num_params(c) / 1e6, model, a->model ? "" : ", the default for a box");
    plan_box(run, b);
    return 0;
}
