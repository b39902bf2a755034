// gpt.cu: the model. GPT-2 as llm.c builds it, split across P ranks Megatron-style: the config, the
// shard plan, the parameters, and the forward pass, backward pass and AdamW update of one rank.
//
// This file is the tensor-parallel recipe, written once. It calls ops (layernorm_forward, matmul_backward,
// ...) through OP(), which runs the CPU version (kernels_cpu.h) or the CUDA version (kernels.cuh) of the
// op with the same arguments, and collectives from comm.cuh on the rank's tensor-parallel group rk->tp
// and, with data parallelism, on its data-parallel group rk->dp (the same TP rank in every replica).
// Every collective of the model is in this file, each with a comment saying which Megatron operator it
// is, or what the data-parallel exchange is, and why the sum is needed there:
//   gpt_forward:    the embedding all-reduce; per layer the attproj and fcproj all-reduces (g); the
//                   loss's all-reduce(max) of the row maxima and all-reduce(sum) of the exp-sums and
//                   target logits
//   gpt_backward:   the lm-head all-reduce; per layer the fc and qkv input-gradient all-reduces (f),
//                   each started before its matmul's weight gradient and waited for after it, so that on
//                   a GPU the sum runs beside that GEMM (my_tokens_summed_start)
//   gpt_update:     over the DP group, the all-reduce of the gradient (or with ZeRO-1 its reduce-scatter,
//                   the all-reduce of the slices' norms and the all-gather of the updated parameters: with
//                   --dtype bf16 of their bf16 copy, as bf16);
//                   over the TP group, the all-reduce of the sharded tensors' squared gradient norm, and
//                   with SP the all-reduce of the layernorm and wpe gradients
//                   with pipeline stages (--pp), over the two end stages the all-reduce of the tied
//                   wte's gradient, and over the stages the all-reduce of the squared gradient norm
//   gpt_gather_moments, gpt_gather_masters: with ZeRO-1, the all-gathers over the DP group of AdamW's m and v
//                   and (bf16) of the fp32 masters' slices, for a checkpoint only
//   gpt_logits_row: an all-gather of one position's logits (sampling only, never in training)
//   gpt_prefill:    the forward's embedding, attproj and fcproj collectives (g), no loss
//   gpt_decode:     the same for one position of each of B rows, B*C floats each: the embedding all-reduce
//                   and per layer the attproj and fcproj all-reduces (g; with SP reduce-scatters and the
//                   all-gathers (f) before qkv, fc and the head); then an all-gather of the B rows'
//                   logits of the vocab-parallel head (sampling only)
// A training step moves (4L + 2) B T C floats over the TP group per micro-batch, plus 3 B T for the loss
// and 1 for the gradient norm; over the DP group, the rank's shard of the gradient once per step. With
// sequence parallelism (--sp 1) each all-reduce around a layer becomes a reduce-scatter or an all-gather
// (all_tokens and my_tokens_summed below), the backward all-gathers the layernorm outputs again, and
// gpt_update all-reduces the layernorm and wpe gradients (step_comm_floats counts it all). With --dtype
// bf16 the all-gathers of bf16 values move as bf16 (gather_tokens).
// Pipeline parallelism cuts the layers into stages (ShardPlan's l0 and L): a stage runs the layers it holds,
// and what crosses between two stages is not a collective but a point-to-point message of the residual
// stream (gpt_stage_input, gpt_stage_output, gpt_stage_grad), which train/pipeline.h sends and receives
// in its schedule's order.
// Outside this file ranks only line up (comm_barrier: around checkpoints) and agree on scalars (the mean
// loss, the decision to stop, weight checksums: tp.cu's world group).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include "common/error.h"
#include "comm.cuh"
#include "kernels_cpu.h"
#include "common/bf16.h"
#include "kernels.cuh"

// ----------------------------------------------------------------------------
// config

struct GPTConfig {
    int maxT;  // max sequence length (wpe rows)
    int V;     // vocab size
    int Vp;    // padded vocab size (wte rows), a multiple of 128 as llm.c pads it
    int L;     // layers
    int NH;    // heads
    int C;     // channels
};

static int round_up(int x, int m) { return (x + m - 1) / m * m; }

// The valid TP degrees: P must divide the heads (each rank gets whole heads) and the padded vocab
// (each rank gets an equal slice of wte). C = NH*hs and 4C then divide too.
static bool tp_valid(const GPTConfig* c, int P) { return P >= 1 && c->NH % P == 0 && c->Vp % P == 0; }

static std::string tp_valid_list(const GPTConfig* c) {
    std::string s;
    for (int p = 1; p <= c->NH; p++)
        if (tp_valid(c, p)) s += (s.empty() ? "" : ", ") + std::to_string(p);
    return s;
}

// ----------------------------------------------------------------------------
// the shard plan: how each of llm.c's 16 parameter tensors is split across ranks

enum Split { SPLIT_NONE, SPLIT_ROWS, SPLIT_COLS, SPLIT_QKV };
#define NUM_PARAM_TENSORS 16

// one tensor kind; stacked per-layer tensors (L, rows, cols) have fl = L. Vectors have cols = 1.
// With pipeline stages a rank holds layers [l0, l0 + nl) of the fl in the full tensor (nl = fl = L
// without), and nl = 0 for a tensor its stage does not hold at all (wpe past the first stage).
struct TensorShard {
    const char* name;
    int split;
    int fl, l0, nl;     // the full tensor's layers, the first one this rank holds, how many it holds
    long rows, cols;    // full shape of one layer's tensor
    long lrows, lcols;  // this rank's shape
    const char* how;    // the split in words, for the printed plan
};

struct ShardPlan {
    int P, rank;
    int NHl, Cl, C4l, Vl, v0;  // local heads, local head channels, local MLP width, local vocab rows, first vocab row
    // pipeline parallelism (--pp S): this rank's stage of S, and the stage's layers [l0, l0 + L) of the
    // model's cfg.L. The first stage holds the embedding, the last the final layernorm and the LM head;
    // both hold wte, which the two tie (gpt_update sums its gradient between them). S = 1: every layer.
    int S, stage, l0, L;
    bool first, last;
    TensorShard t[NUM_PARAM_TENSORS];
};

// The layers of stage s of S, as even as L allows: the first L % S stages take one more.
static void pp_stage_layers(int L, int S, int s, int* l0, int* n) {
    int base = L / S, extra = L % S;
    *n = base + (s < extra ? 1 : 0);
    *l0 = s * base + std::min(s, extra);
}

static void shard_plan_init(ShardPlan* s, const GPTConfig* c, int P, int rank, int S = 1, int stage = 0) {
    int C = c->C, L = c->L;
    s->P = P;
    s->rank = rank;
    s->S = S;
    s->stage = stage;
    s->first = stage == 0;
    s->last = stage == S - 1;
    pp_stage_layers(L, S, stage, &s->l0, &s->L);
    s->NHl = c->NH / P;
    s->Cl = C / P;
    s->C4l = 4 * C / P;
    s->Vl = c->Vp / P;
    s->v0 = rank * s->Vl;
    // name, split, layers, full rows, full cols
    struct { const char* name; int split, nl; long rows, cols; const char* how; } d[NUM_PARAM_TENSORS] = {
        {"wte", SPLIT_ROWS, 1, c->Vp, C, "vocab rows (vocab-parallel embedding + LM head)"},
        {"wpe", SPLIT_NONE, 1, c->maxT, C, "replicated"},
        {"ln1w", SPLIT_NONE, L, C, 1, "replicated"},
        {"ln1b", SPLIT_NONE, L, C, 1, "replicated"},
        {"qkvw", SPLIT_QKV, L, 3L * C, C, "by head: q, k, v rows of the rank's heads (column-parallel)"},
        {"qkvb", SPLIT_QKV, L, 3L * C, 1, "by head (column-parallel)"},
        {"attprojw", SPLIT_COLS, L, C, C, "input columns of the rank's heads (row-parallel)"},
        {"attprojb", SPLIT_NONE, L, C, 1, "replicated, added once after the all-reduce"},
        {"ln2w", SPLIT_NONE, L, C, 1, "replicated"},
        {"ln2b", SPLIT_NONE, L, C, 1, "replicated"},
        {"fcw", SPLIT_ROWS, L, 4L * C, C, "output rows (column-parallel)"},
        {"fcb", SPLIT_ROWS, L, 4L * C, 1, "output rows (column-parallel)"},
        {"fcprojw", SPLIT_COLS, L, C, 4L * C, "input columns (row-parallel)"},
        {"fcprojb", SPLIT_NONE, L, C, 1, "replicated, added once after the all-reduce"},
        {"lnfw", SPLIT_NONE, 1, C, 1, "replicated"},
        {"lnfb", SPLIT_NONE, 1, C, 1, "replicated"},
    };
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        TensorShard* t = &s->t[i];
        t->name = d[i].name;
        t->split = d[i].split;
        bool layered = i >= 2 && i <= 13;  // ln1w .. fcprojb
        t->fl = d[i].nl;
        t->l0 = layered ? s->l0 : 0;
        t->nl = layered ? s->L : 1;  // the stage's layers, and the tensors outside the layers:
        if (i == 0) t->nl = s->first || s->last ? 1 : 0;  // wte: the lookup and the LM head
        if (i == 1) t->nl = s->first ? 1 : 0;               // wpe: the lookup
        if (i >= 14) t->nl = s->last ? 1 : 0;               // lnfw, lnfb: before the LM head
        t->rows = d[i].rows;
        t->cols = d[i].cols;
        t->how = d[i].how;
        t->lrows = t->split == SPLIT_ROWS || t->split == SPLIT_QKV ? t->rows / P : t->rows;
        t->lcols = t->split == SPLIT_COLS ? t->cols / P : t->cols;
    }
}

static long shard_full_size(const TensorShard* t) { return t->fl * t->rows * t->cols; }
static long shard_local_size(const TensorShard* t) { return t->nl * t->lrows * t->lcols; }

// The length of a rank's flat shard of n floats as it is allocated: with ZeRO-1 (zero) padded to a
// multiple of 32 per replica, so that each of the D replicas updates an equal, aligned slice.
static long shard_padded(long n, int zero, int D) { return zero ? (n + 32L * D - 1) / (32L * D) * (32L * D) : n; }

// Where this rank's shard of t sits in the full tensor, which starts at base in the full parameter vector.
// Local layer l is the full tensor's layer l0 + l (its stage's); local row lr of one layer is full row:
//   rows: rank*lrows + lr;  qkv: the same within each of the q, k, v thirds;  cols and none: lr;
// and its columns start at rank*lcols for a column split, else 0.
static FullIndex shard_full_index(const TensorShard* t, int rank, long base) {
    FullIndex m = {t->lrows, t->lcols, t->rows, t->cols, t->lrows, 0, 0, 0, t->l0, base};
    if (t->split == SPLIT_ROWS) m.row0 = rank * t->lrows;
    if (t->split == SPLIT_QKV) {
        m.row_block = t->lrows / 3;
        m.row_stride = t->rows / 3;
        m.row0 = rank * m.row_block;
    }
    if (t->split == SPLIT_COLS) m.col0 = rank * t->lcols;
    return m;
}

// Copies between a full tensor (all layers) and this rank's shard of it, in either direction, a local row
// at a time (shard_full_index says where each goes).
static void shard_copy(const TensorShard* t, int rank, float* full, float* local, bool to_local) {
    FullIndex m = shard_full_index(t, rank, 0);
    for (long i = 0; i < shard_local_size(t); i += t->lcols) {
        float* f = full + full_index(m, i);
        if (to_local) memcpy(local + i, f, t->lcols * sizeof(float));
        else memcpy(f, local + i, t->lcols * sizeof(float));
    }
}

// ----------------------------------------------------------------------------
// a rank: one thread, its device and its communicators

struct Rank {
    int rank, P;   // this rank's place in its tensor-parallel group of P ranks
    int device;    // DEV_CPU or DEV_CUDA
    int gpu;       // CUDA device ordinal (DEV_CUDA)
    Comm tp;       // the tensor-parallel group: every collective of the layers goes through it
    Comm dp;       // the data-parallel group: TP rank `rank` of every replica (dp.rank: the replica, dp.P: the
                   // replicas). One replica and no group (dp.g null) until rank_join_dp.
    int stage, S;  // pipeline parallelism: this rank's stage of S (0 of 1 until rank_join_pp)
    Comm pp;       // the pipeline group: TP rank `rank` of every stage of the replica (pp.rank: the stage); the
                   // boundary activations and their gradients go between neighbours (comm_send, comm_recv)
    Comm emb;      // the first and the last stage's TP rank `rank` (S > 1): the tied wte's gradient sum
    CudaCtx cuda;  // DEV_CUDA: the rank's stream, cuBLAS handles and scratch
};

// Starts rank r of a tensor-parallel group in the calling thread: its worker threads (CPU), its CUDA
// context (GPU), and its handle on the group. Ranks on distinct GPUs talk through NCCL when the group
// has NCCL communicators (comm_nccl_init_all), ranks sharing a GPU through shared device memory.
static void rank_init(Rank* rk, CommGroup* tp_group, int r, int device, int gpu, int threads) {
    memset(&rk->dp, 0, sizeof(rk->dp));
    rk->dp.P = 1;
    memset(&rk->pp, 0, sizeof(rk->pp));
    memset(&rk->emb, 0, sizeof(rk->emb));
    rk->pp.P = 1;
    rk->stage = 0;
    rk->S = 1;
    rk->rank = r;
    rk->P = tp_group->P;
    rk->device = device;
    rk->gpu = device == DEV_CUDA ? gpu : -1;
    cpu_pool_start(threads);  // its worker threads (CPU), and flush-to-zero in this thread
    if (device == DEV_CUDA) cuda_ctx_init(&rk->cuda, r, gpu);
    comm_init(&rk->tp, tp_group, r);
    if (device == DEV_CUDA) comm_bind_cuda(&rk->tp, gpu, rk->cuda.stream);
}

// Makes the rank the member `local` (its replica's index in this process) of a data-parallel group: the
// group of this TP rank across the replicas, which may span processes. Call after rank_init.
static void rank_join_dp(Rank* rk, CommGroup* dp_group, int local) {
    comm_init(&rk->dp, dp_group, local);
    if (rk->device == DEV_CUDA) comm_bind_cuda(&rk->dp, rk->gpu, rk->cuda.stream);
}

// Makes the rank stage `stage` of its replica's pipeline: a member of the pipeline group (its stages) and,
// with more than one stage, on the first and last stage, of the tied embedding's group (emb: the first
// stage is its member 0). Call after rank_init, before gpt_build.
static void rank_join_pp(Rank* rk, CommGroup* pp_group, CommGroup* emb_group, int stage) {
    comm_init(&rk->pp, pp_group, stage % pp_group->P);  // (the group's stages in this process are consecutive)
    rk->pp.tp_rank = rk->rank;
    rk->stage = stage;
    rk->S = rk->pp.P;
    bool tied = emb_group && (stage == 0 || stage == rk->S - 1);
    if (tied) comm_init(&rk->emb, emb_group, stage == 0 ? 0 : emb_group->P - 1);  // one of two, or one per process
    if (rk->device == DEV_CUDA && rk->S > 1) {  // the norm's and wte's sums are in device memory
        comm_bind_cuda(&rk->pp, rk->gpu, rk->cuda.stream);
        if (tied) comm_bind_cuda(&rk->emb, rk->gpu, rk->cuda.stream);
    }
}

static void rank_free(Rank* rk) {
    if (rk->pp.g) comm_p2p_finish(&rk->pp);  // its messages to stages in other processes have left
    if (rk->device != DEV_CUDA) return;
    comm_free(&rk->tp);
    if (rk->pp.g) comm_free(&rk->pp);
    if (rk->emb.g) comm_free(&rk->emb);
    if (rk->dp.g) comm_free(&rk->dp);
    cuda_ctx_free(&rk->cuda);
}

// memory on the rank's device
static float* dev_alloc(Rank* rk, long n) {
    if (rk->device == DEV_CUDA) return cuda_alloc(&rk->cuda, n);
    void* p = nullptr;
    size_t bytes = ((size_t)(n > 0 ? n : 1) * sizeof(float) + 63) / 64 * 64;
    if (posix_memalign(&p, 64, bytes) != 0) fatal("rank %d: out of host memory allocating %zu bytes", rk->rank, bytes);
    memset(p, 0, bytes);
    return (float*)p;
}
static void dev_free(Rank* rk, void* p) {
    if (rk->device == DEV_CUDA) cuda_free(&rk->cuda, p);
    else free(p);
}
static void dev_zero(Rank* rk, float* p, long n) {
    if (rk->device == DEV_CUDA) cuda_zero(&rk->cuda, p, n);
    else memset(p, 0, n * sizeof(float));
}
static void dev_copy(Rank* rk, float* dst, const float* src, long n) {
    if (rk->device == DEV_CUDA) cuda_copy(&rk->cuda, dst, src, n);
    else memcpy(dst, src, n * sizeof(float));
}
static void dev_upload(Rank* rk, void* dst, const void* src, size_t bytes) {
    if (rk->device == DEV_CUDA) cuda_upload(&rk->cuda, dst, src, bytes);
    else memcpy(dst, src, bytes);
}
// waits for the rank's queued work first; comm_sync does that with the collective timeout (NCCL). The
// DP group first: its collectives share the stream with the TP group's, and a TP group on shared GPU
// memory (or of one rank) synchronises the stream outright, which would wait for ever on a DP
// collective whose peer process died instead of reporting it through NCCL within --timeout.
static void dev_download(Rank* rk, void* dst, const void* src, size_t bytes) {
    if (rk->device == DEV_CUDA) {
        if (rk->dp.g) comm_sync(&rk->dp);
        comm_sync(&rk->tp);
        cuda_download(&rk->cuda, dst, src, bytes);
    } else {
        memcpy(dst, src, bytes);
    }
}

// ----------------------------------------------------------------------------
// ops: one name, two backends. OP(rk, layernorm_forward, args...) calls layernorm_forward_cuda(&rk->cuda,
// args...) on a GPU and layernorm_forward_cpu(args...) on the CPU. The two take literally the same
// arguments after the context, so every call below checks the two backends against each other at
// compile time. The recipe calls ops only through OP, never a backend directly.
#define OP(rk, op, ...) ((rk)->device == DEV_CUDA ? op##_cuda(&(rk)->cuda, __VA_ARGS__) : op##_cpu(__VA_ARGS__))

// ----------------------------------------------------------------------------
// the model of one rank

// the 16 tensors of one rank, in llm.c's order; a struct of pointers into one allocation. T: float (the
// weights, their gradients), or bf16 (a --dtype bf16 run's copy of the weights)
template <typename T>
struct ParamsOf {
    T *wte, *wpe, *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;
    T *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb, *lnfw, *lnfb;
};
typedef ParamsOf<float> Params;

// tensor `name`'s place among the 16
#define PARAM_INDEX(name) ((int)(offsetof(Params, name) / sizeof(float*)))

template <typename T>
static void params_point(ParamsOf<T>* p, T* mem, const ShardPlan* s) {
    T** ptrs = (T**)p;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        ptrs[i] = mem;
        mem += shard_local_size(&s->t[i]);
    }
}

// the weights only the matmuls (and the embedding) read, which a --dtype bf16 run's layers read in bf16
// storage: wte and the four matrices of a layer. The rest, the vectors, are read by elementwise ops.
static bool param_is_matrix(int i) {
    return i == PARAM_INDEX(wte) || i == PARAM_INDEX(qkvw) || i == PARAM_INDEX(attprojw) || i == PARAM_INDEX(fcw) ||
           i == PARAM_INDEX(fcprojw);
}

// the floats a --dtype bf16 run's vector i takes widened (gpt_set_dtype), so that each starts at a 16-byte
// boundary; and all of them
static long param_vector_floats(const ShardPlan* s, int i) { return (shard_local_size(&s->t[i]) + 3) / 4 * 4; }
static long params_vector_floats(const ShardPlan* s) {
    long n = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++)
        if (!param_is_matrix(i)) n += param_vector_floats(s, i);
    return n;
}

// ----------------------------------------------------------------------------
// activation memory: sequence parallelism (--sp 1) and recomputation (-r)
//
// Sequence parallelism splits the token-wise regions of a layer -- the layernorms, the residual adds,
// the embedding output -- along the B*T tokens of a batch: rank r keeps the N = B*T/P tokens starting
// at t0 = r*N, and only the matmuls and attention between a column-parallel and a row-parallel layer
// see every token. Without it every rank keeps all N = B*T tokens of those regions. Recomputation drops
// what is cheap to recompute and big, and recomputes it in the backward with the same ops in the same
// order, so no bit of the result changes: -r 1 the GELU output, -r 2 also the two layernorm outputs,
// -r 3 also the attention probabilities (B, NH/P, T, T).
//
// Attention (--attention): fused (the default, FlashAttention-2) keeps no probabilities, only the output
// and one log-sum-exp per row, lse (B, NH/P, T), and needs one more (B, NH/P, T) of scratch in the
// backward (D = rowsum(dout * out)); so there is no T*T term to recompute and -r 3 is refused with it.
// matmul (the materialised teaching version) keeps att (B, NH/P, T, T) per layer, or one copy with -r 3.
//
// The activations of one rank; Cl, C4l, Vl are the rank's local widths, N its tokens. The sizes are in
// one place, acts_layout; LayerActs is layer l's view of the per-layer buffers.
struct Acts {
    float* encoded;                    // (N, C) embedding output, the first layer's residual input
                                       // (the residual stream: encoded, residual2, residual3, in a bf16
                                       // run bf16 storage, stream_of)
    float *ln1, *ln1_mean, *ln1_rstd;  // per layer: (N, C), (N), (N)
    float* qkv;                        // per layer: (B, T, 3 Cl) q, k, v of the local heads (a bf16 run's
                                       // fused attention: in bf16, qkv_kept)
    float* atty;                       // per layer: (B, T, Cl) attention output of the local heads
    float* att;                        // per layer: (B, NHl, T, T) attention probabilities (matmul attention)
    float* lse;                        // per layer: (B, NHl, T) log-sum-exp of each score row (fused attention)
    float* residual2;                  // per layer: (N, C) after the attention block
    float *ln2, *ln2_mean, *ln2_rstd;  // per layer: (N, C), (N), (N)
    float *fch, *fch_gelu;             // per layer: (B, T, 4 Cl) the local slice of the MLP
    float* residual3;                  // per layer: (N, C) after the MLP block: the layer's output
    float *lnf, *lnf_mean, *lnf_rstd;  // (B, T, C) the LM head's input, every token; (N), (N)
    float* logits;                     // (B, T, Vl) the local vocab slice; dlogits after a training forward
                                       // (a bf16 run: bf16 storage, logits_of)
    float *ce_max, *ce_sums, *losses;  // (B, T), (B, T, 2), (B, T)
    float* partial;                    // (B, T, C) a row-parallel layer's partial output, summed in place
    float* gathered;                   // (B, T, C) with --sp 1: the all-gathered tokens (else empty)
    float* wire;                       // (B, T, C) bf16 with --sp 1 and --dtype bf16: what the gathers move
    // backward scratch
    float *dres, *dln, *datty, *dqkv, *dfch;  // (N,C) (B,T,C) (B,T,Cl) (B,T,3Cl) (B,T,4Cl)
    // (--dtype bf16: fc's output gradient, bf16 storage, lies in dqkv's buffer and qkv's in dfch's, each
    // while the other is unused, and attproj's and fcproj's, dres's bf16 copy, in dln's without SP:
    // grad_input, residual_grad_input, gpt_backward)
    float* attd;                       // (B, NHl, T) fused attention's D = rowsum(datty * atty)
    // --dtype bf16: what a layer keeps of ln1, ln2, atty, fch and fch_gelu for its backward, which are bf16
    // values, in bf16 storage (each layer's part from a 16-byte boundary), each rounded to nearest into it
    // where it is made: the layernorms and the GELU write it straight (layernorm_input, gelu_input), fc's and
    // attention's fp32 outputs are packed into it (gelu_forward_bf16, keep_input). The fp32 buffers above are
    // then ones every layer reuses (atty), or none (ln1, ln2 without SP; fch, fch_gelu without -r 1). The
    // matmuls read the kept copies where they lie, the forward's and the weight gradients' (kept_input); so
    // do the GELU's backward (fch) and fused attention's (atty, for D), and SP's gathers of ln1 and ln2
    // (all_tokens_input). Where those move fp32 words (an odd C), ln1 and ln2 are rounded in place in the
    // forward and widened back in the backward (bf16_widen).
    float *ln1_kept, *ln2_kept, *atty_kept, *gelu_kept;  // per layer: (N, C), (N, C), (B, T, Cl), (B, T, 4 Cl) bf16
    float* fch_kept;                                     // per layer: (B, T, 4 Cl) bf16
    // --dtype bf16 with fused attention: q, k and v in bf16 storage (qkv_input), which attention reads where
    // they lie in the forward and the backward; there is then no fp32 qkv (qkv's matmul writes its fp32 sums
    // into dqkv's buffer, unused until the backward, and they are rounded from there)
    float* qkv_kept;                                     // per layer: (B, T, 3 Cl) bf16
};
#define NUM_ACTS ((int)(sizeof(Acts) / sizeof(float*)))

// What a buffer of Acts is: kept by each layer for the backward (L copies), one copy every layer reuses
// (what -r recomputes in the backward), one buffer outside the layers, or not used by this configuration.
enum ActKind { ACT_UNUSED, ACT_ONCE, ACT_PER_LAYER, ACT_REUSED };

// for each buffer of Acts, in its order: floats per copy, and what it is
struct ActsLayout {
    long size[NUM_ACTS];
    int kind[NUM_ACTS];
};

static long act_copies(const ActsLayout* lay, int i, int L) {
    return lay->kind[i] == ACT_PER_LAYER ? L : lay->kind[i] == ACT_UNUSED ? 0 : 1;
}

// Test hook: what a bf16 run keeps or moves as bf16 (the layers' kept activations, SP's gathers, ZeRO-1's
// weights) is kept and moved in fp32 words instead, as it was before bf16 storage; the tests show that the
// same bits result. (Not the logits: their ops are checked against fp32 words one by one, as a GPU's
// GEMM with a bf16 output need not sum in the order of its fp32 one.)
static bool g_bf16_in_fp32 = false;
// whether a run keeps its bf16 values in bf16 storage: a --dtype bf16 run (bf16), but not under the hook
static bool bf16_storage(bool bf16) { return bf16 && !g_bf16_in_fp32; }

// the floats n bf16 take, in whole 16-byte units (so that each layer's part of a buffer starts on 16 bytes)
static long bf16_floats(long n) { return (n + 7) / 8 * 4; }

// split: sequence parallelism on (N = B*T/P tokens per rank); recompute: -r 0..3 (0..2 with fused);
// fused: --attention fused (else matmul); bf16: --dtype bf16 (the kept activations in bf16 and SP's bf16
// gather buffer, sized in floats: two bf16 a float)
static void acts_layout(const GPTConfig* c, const ShardPlan* s, int B, int T, bool split, int recompute, bool fused,
                        bool bf16, ActsLayout* lay) {
    long C = c->C, BT = (long)B * T, N = split ? BT / s->P : BT;
    const int LAYER = ACT_PER_LAYER, ONCE = ACT_ONCE;
    // bf16 keeps ln1, ln2 and fch_gelu in bf16 (the *_kept buffers) unless -r recomputes them, atty and fch
    // always, and with fused attention q, k and v; and its residual stream is bf16 storage.
    const bool logits_bf16 = bf16;  // (the logits are bf16 storage in every bf16 run: the hook leaves them)
    bf16 = bf16_storage(bf16);
    // Where the layernorms and the GELU write their bf16 output straight into the kept copy (layernorm_input,
    // gelu_input) no fp32 copy of it is made: ln1 and ln2 then need one only for SP's all-gathers where they
    // move fp32 words (an odd C; where they move bf16, the wire, the matmuls read that: all_tokens_input),
    // and fch_gelu only for -r 1's recomputation; and fc's fp32 sums go to dfch's buffer
    bool ln_kept = bf16 && recompute < 2, gelu_kept = bf16 && recompute < 1, wire = split && bf16 && C % 2 == 0;
    int ln = recompute >= 2 ? ACT_REUSED : ln_kept ? (split && !wire ? ACT_REUSED : ACT_UNUSED) : LAYER;
    int gelu = recompute >= 1 ? ACT_REUSED : gelu_kept ? ACT_UNUSED : LAYER;
    int att = fused ? ACT_UNUSED : recompute >= 3 ? ACT_REUSED : LAYER;
    long rows = B * s->NHl * (long)T;  // one float per (b, local head, t): the log-sum-exp, and D
    long stream = bf16 ? bf16_floats(N * C) : N * C;  // the residual stream's (N, C): bf16 storage in a bf16 run
    struct { long size; int kind; } t[] = {
        {stream, ONCE},                                                         // encoded
        {N * C, ln}, {N, LAYER}, {N, LAYER},                                    // ln1, ln1_mean, ln1_rstd
        {BT * 3 * s->Cl, bf16 && fused ? ACT_UNUSED : LAYER},                   // qkv (bf16 and fused: qkv_kept)
        {BT * s->Cl, bf16 ? ACT_REUSED : LAYER},                                // atty
        {B * s->NHl * (long)T * T, att},                                        // att
        {rows, fused ? LAYER : ACT_UNUSED},                                     // lse
        {stream, LAYER},                                                        // residual2
        {N * C, ln}, {N, LAYER}, {N, LAYER},                                    // ln2, ln2_mean, ln2_rstd
        {BT * s->C4l, gelu_kept ? ACT_UNUSED : bf16 ? ACT_REUSED : LAYER},      // fch (gelu_kept: in dfch, fc_sums)
        {BT * s->C4l, gelu},                                                    // fch_gelu
        {stream, LAYER},                                                        // residual3
        {BT * C, ONCE}, {N, ONCE}, {N, ONCE},                                   // lnf, lnf_mean, lnf_rstd
        {logits_bf16 ? bf16_floats(BT * s->Vl) : BT * s->Vl, ONCE},             // logits
        {BT, ONCE}, {2 * BT, ONCE}, {BT, ONCE},                                 // ce_max, ce_sums, losses
        {BT * C, ONCE},                                                         // partial
        {BT * C, split ? ONCE : ACT_UNUSED},                                    // gathered
        {(BT * C + 1) / 2, wire ? ONCE : ACT_UNUSED},                           // wire (sp_wire_bf16)
        {N * C, ONCE}, {BT * C, ONCE}, {BT * s->Cl, ONCE}, {BT * 3 * s->Cl, ONCE}, {BT * s->C4l, ONCE},  // dres, dln, datty, dqkv, dfch
        {rows, fused ? ONCE : ACT_UNUSED},                                      // attd
        {bf16_floats(N * C), ln_kept ? LAYER : ACT_UNUSED}, {bf16_floats(N * C), ln_kept ? LAYER : ACT_UNUSED},  // ln1_kept, ln2_kept
        {bf16_floats(BT * s->Cl), bf16 ? LAYER : ACT_UNUSED},                   // atty_kept
        {bf16_floats(BT * s->C4l), gelu_kept ? LAYER : ACT_UNUSED},             // gelu_kept
        {bf16_floats(BT * s->C4l), bf16 ? LAYER : ACT_UNUSED},                  // fch_kept
        {bf16_floats(BT * 3 * s->Cl), bf16 && fused ? LAYER : ACT_UNUSED},      // qkv_kept
    };
    static_assert(sizeof(t) / sizeof(t[0]) == NUM_ACTS, "Acts and acts_layout disagree");
    for (int i = 0; i < NUM_ACTS; i++) {
        lay->size[i] = t[i].size;
        lay->kind[i] = t[i].kind;
    }
}

// the activation floats of one rank: what gpt_alloc_acts allocates
static long acts_floats(const GPTConfig* c, const ShardPlan* s, int B, int T, bool split, int recompute, bool fused,
                        bool bf16) {
    ActsLayout lay;
    acts_layout(c, s, B, T, split, recompute, fused, bf16, &lay);
    long n = 0;
    for (int i = 0; i < NUM_ACTS; i++) n += lay.size[i] * act_copies(&lay, i, s->L);
    return n;
}

// of those, what every layer keeps for itself (the rest is the layers' shared buffers and the buffers
// outside the layers)
static long acts_floats_per_layer(const GPTConfig* c, const ShardPlan* s, int B, int T, bool split, int recompute,
                                  bool fused, bool bf16) {
    ActsLayout lay;
    acts_layout(c, s, B, T, split, recompute, fused, bf16, &lay);
    long n = 0;
    for (int i = 0; i < NUM_ACTS; i++) n += lay.kind[i] == ACT_PER_LAYER ? lay.size[i] : 0;
    return n;
}

// whether a batch of (B, T) is split along its tokens: --sp 1 asked for, more than one rank, and the
// tokens divide into the ranks (sampling's batch of one sequence may not; it then runs unsplit)
static bool sp_splits(bool sp, int P, int B, int T) { return sp && P > 1 && ((long)B * T) % P == 0; }

// layer l's view of the per-layer activations
struct LayerActs {
    float* residual;  // (N, C) the layer's input: encoded for layer 0, else the previous layer's residual3
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *lse, *residual2;
    float *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *residual3;
    float *ln1_kept, *ln2_kept, *atty_kept, *gelu_kept, *fch_kept, *qkv_kept;  // (bf16 storage; see Acts)
};

// one micro-batch's activations, kept from its forward to its backward (pipeline parallelism: gpt_select_slot)
struct ActsSlot {
    float* mem;
    Acts acts;
    int *tokens, *targets;
};

struct GPT {
    GPTConfig cfg;
    ShardPlan plan;
    int hs;         // head size
    long nparams;   // this rank's parameter count
    bool sp;        // --sp 1: sequence parallelism (set by the caller after gpt_build)
    int recompute;  // -r: 0 none, 1 GELU, 2 also the layernorms, 3 also the attention probabilities (matmul only)
    bool fused;     // --attention fused (the default since gpt_build) or matmul (set by the caller after gpt_build)
    bool overlap;   // the backward's f sums run beside the weight gradients (GPU; on by gpt_build)
    // The flat shard (all 16 tensors of the rank, back to back) is padded to npad floats, a multiple of
    // 32 per replica, and cut into one slice per replica: [slice0, slice0 + nslice). Without ZeRO the
    // rank updates all of it (slice0 0, nslice nparams); with ZeRO-1 only its replica's slice.
    int zero;       // ZeRO stage: 0, or 1 (AdamW's m and v and the update split over the replicas)
    long npad, slice0, nslice;
    float* params_mem;     // (npad) the fp32 weights (with --dtype bf16: the master weights AdamW updates)
    float* grads_mem;      // (npad) the gradients of an fp32 run (null in a bf16 run: gbf_mem)
    float *m_mem, *v_mem;  // AdamW moments (nslice): for the slice the rank updates
    float dloss;  // training: the gradient each position's loss is seeded with (0: 1/(B T), the batch mean)
    Params params, grads;  // params: the fp32 weights the forward and backward read (bf16: its vectors only)
    // --dtype bf16 (gpt_set_dtype): the layers read a bf16 copy of the fp32 masters, rounded stochastically
    // after every update (gpt_round_weights), in bf16 storage: the matmuls take its matrices as they lie
    // (WEIGHT), and the elementwise ops its vectors (biases, layernorms, wpe) widened exactly to fp32 (in
    // wvec_mem, where params points). The matmuls' activation operands are rounded to bf16 where they are
    // made (keep_bf16). fp32: wbf_mem and wvec_mem are null.
    bool bf16;
    ::bf16* wbf_mem;      // (npad) the bf16 copy of the weights, in params_mem's layout
    ParamsOf<::bf16> wbf; // its 16 tensors
    float* wvec_mem;      // (params_vector_floats) the copy's vectors widened
    // ... and its gradients (grads_mem null): the matrices' in bf16 storage, in params_mem's layout, to which
    // every backward op adds its contribution summed in fp32, with one rounding to nearest (Grad,
    // kernels_cpu.h); the vectors' in fp32 (gvec_mem, where grads points), as the copy's vectors are. A
    // vector's gradient is a sum over every token, and with SP each rank's part of it is a partial sum that
    // the ranks add up: rounding the parts would cost the small sums all their digits where they cancel.
    // The step's collectives sum both in fp32 (grad_allreduce).
    ::bf16* gbf_mem;      // (npad) the matrices' gradients (the vectors' places unused)
    ParamsOf<::bf16> gbf; // its 16 tensors
    float* gvec_mem;      // (params_vector_floats) the vectors' gradients
    float* gstage;        // (gstage_n) where the collectives sum the gradients (grad_allreduce)
    long gstage_n;        // grad_stage_floats of the configuration gpt_alloc_acts last sized it for
    bool wbf_stale;       // params_mem changed since wbf_mem was rounded from it
    // bf16 with ZeRO-1 over D > 1 replicas: each replica rounds its own slice of the masters and the replicas
    // all-gather the bf16 copy, not the masters (gpt_update); the masters outside the replica's slice are
    // then out of date (masters_partial) until gpt_gather_masters.
    bool masters_partial;
    uint32_t bf16_seed;   // the stochastic rounding's seed (the run's --seed)
    float* norm2;  // (2) squared gradient norm: [sharded tensors summed over ranks, replicated tensors]
    // activations, allocated for one (B, T)
    int B, T;
    bool split;     // this allocation splits the tokens (sp_splits)
    bool acts_bf16; // this allocation is a --dtype bf16 run's (its kept activations, SP's wire buffer, the logits)
    bool stream_bf16;  // ... and its residual stream (encoded, residual2, residual3) is bf16 storage (stream_of)
    int ntok, t0;   // the tokens of the token-wise regions on this rank: N and the first one
    float* acts_mem;
    Acts acts;
    ActsLayout layout;
    int *tokens, *targets;  // (B, T) on the rank's device
    int t;                  // AdamW steps taken
    float* row;             // (Vp + Vl) one position's gathered logits, for sampling, then this rank's widened
    // Pipeline parallelism keeps several micro-batches between their forward and their backward: one
    // activation set each, in slots. acts_mem, acts, tokens and targets are the current slot's;
    // gpt_select_slot swaps another one in (allocated on first use). No slots (nslots 0): just the one.
    ActsSlot* slots;
    int nslots, slot;
};

// layer l's buffer `name` of Acts: its own copy when the layer keeps one, else the one every layer reuses
#define LAYER_BUF(m, name, l)                                                                        \
    ((m)->acts.name + ((m)->layout.kind[offsetof(Acts, name) / sizeof(float*)] == ACT_PER_LAYER ? (long)(l) : 0) * \
                          (m)->layout.size[offsetof(Acts, name) / sizeof(float*)])

static LayerActs layer_acts(const GPT* m, int l) {
    LayerActs la;
    la.residual = l == 0 ? m->acts.encoded : LAYER_BUF(m, residual3, l - 1);
    la.ln1 = LAYER_BUF(m, ln1, l);
    la.ln1_mean = LAYER_BUF(m, ln1_mean, l);
    la.ln1_rstd = LAYER_BUF(m, ln1_rstd, l);
    la.qkv = LAYER_BUF(m, qkv, l);
    la.atty = LAYER_BUF(m, atty, l);
    la.att = LAYER_BUF(m, att, l);
    la.lse = LAYER_BUF(m, lse, l);
    la.residual2 = LAYER_BUF(m, residual2, l);
    la.ln2 = LAYER_BUF(m, ln2, l);
    la.ln2_mean = LAYER_BUF(m, ln2_mean, l);
    la.ln2_rstd = LAYER_BUF(m, ln2_rstd, l);
    la.fch = LAYER_BUF(m, fch, l);
    la.fch_gelu = LAYER_BUF(m, fch_gelu, l);
    la.residual3 = LAYER_BUF(m, residual3, l);
    la.ln1_kept = LAYER_BUF(m, ln1_kept, l);
    la.ln2_kept = LAYER_BUF(m, ln2_kept, l);
    la.atty_kept = LAYER_BUF(m, atty_kept, l);
    la.gelu_kept = LAYER_BUF(m, gelu_kept, l);
    la.fch_kept = LAYER_BUF(m, fch_kept, l);
    la.qkv_kept = LAYER_BUF(m, qkv_kept, l);
    return la;
}

// the parameter count of the full model, as llm.c counts it
static long gpt_num_params(const GPTConfig* c) {
    ShardPlan s;
    shard_plan_init(&s, c, 1, 0);
    long n = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) n += shard_full_size(&s.t[i]);
    return n;
}

// This rank's flat shard (nparams floats, host memory) sliced out of full tensors in host memory (llm.c's
// layout and order)
static std::vector<float> gpt_shard_of(const GPT* m, const Rank* rk, const float* full) {
    std::vector<float> local(m->nparams);
    long off = 0, loff = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        const TensorShard* t = &m->plan.t[i];
        shard_copy(t, rk->rank, (float*)full + off, local.data() + loff, true);
        off += shard_full_size(t);
        loff += shard_local_size(t);
    }
    return local;
}

// Slices this rank's shard out of full tensors in host memory into one of the rank's per-parameter
// buffers (params, or m and v without ZeRO).
static void gpt_scatter(GPT* m, Rank* rk, const float* full, float* local_mem) {
    std::vector<float> local = gpt_shard_of(m, rk, full);
    dev_upload(rk, local_mem, local.data(), local.size() * sizeof(float));
}

// The same for AdamW's m or v, which hold the rank's slice of the shard only: its replica's 1/D with
// ZeRO-1, all of it without.
static void gpt_scatter_moments(GPT* m, Rank* rk, const float* full, float* mom) {
    std::vector<float> local = gpt_shard_of(m, rk, full);
    local.resize(m->npad, 0.0f);
    dev_upload(rk, mom, local.data() + m->slice0, m->nslice * sizeof(float));
}

// Builds the rank's shard from the full parameters (host memory, llm.c's layout and order). zero: the
// ZeRO stage (1: AdamW's moments only for the replica's slice of the shard, see GPT).
static void gpt_build(GPT* m, Rank* rk, const GPTConfig* cfg, const float* full, int zero) {
    memset(m, 0, sizeof(*m));
    m->cfg = *cfg;
    m->hs = cfg->C / cfg->NH;
    m->fused = true;
    shard_plan_init(&m->plan, cfg, rk->P, rk->rank, rk->S, rk->stage);
    m->nparams = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) m->nparams += shard_local_size(&m->plan.t[i]);
    m->zero = zero;
#ifndef TP_EMU
    m->overlap = true;
#else
    // The emulated GPU drives its streams from host threads: with DP replicas sharing a GPU (host-driven
    // collectives) and the TP group on NCCL, a sum queued on the communication stream can wait for ever
    // there for a thread to run it, which a GPU never does. Only the tests that compare overlap against
    // in-line sums turn it on under the emulator.
    m->overlap = false;
#endif
    int D = rk->dp.P;
    m->npad = shard_padded(m->nparams, zero, D);
    m->nslice = zero ? m->npad / D : m->nparams;
    m->slice0 = zero ? rk->dp.rank * m->nslice : 0;
    m->params_mem = dev_alloc(rk, m->npad);
    m->grads_mem = dev_alloc(rk, m->npad);
    m->m_mem = dev_alloc(rk, m->nslice);
    m->v_mem = dev_alloc(rk, m->nslice);
    m->norm2 = dev_alloc(rk, 2);
    params_point(&m->params, m->params_mem, &m->plan);
    params_point(&m->grads, m->grads_mem, &m->plan);
    gpt_scatter(m, rk, full, m->params_mem);
}

// --dtype bf16 (bf16 true) or fp32 for a model gpt_build made. bf16 keeps params_mem as the fp32 master
// weights, which AdamW updates and checkpoints save, and has the layers read a copy rounded from them:
// stochastically, keyed on each element's index in the full model, the step and seed (common/bf16.h), so
// TP=P rounds every weight as TP=1 does, replicas alike, and a resume re-derives the same copy from the
// masters and the step. The copy is bf16 storage, 2 bytes a weight; its vectors are also widened to fp32
// for the elementwise ops (a few per cent of the weights: wpe, the biases and layernorms).
static void gpt_set_dtype(GPT* m, Rank* rk, bool bf16, uint32_t seed) {
    m->bf16 = bf16;
    m->bf16_seed = seed;
    if (m->masters_partial) fatal("rank %d: --dtype changed while the masters are partial (gpt_gather_masters first)", rk->rank);
    if (bf16 && !m->wbf_mem) {
        m->wbf_mem = (::bf16*)dev_alloc(rk, (m->npad + 1) / 2);  // two bf16 a float
        m->wvec_mem = dev_alloc(rk, params_vector_floats(&m->plan));
        // the gradients too (zeroed before every step's first backward: nothing to carry over)
        dev_free(rk, m->grads_mem);
        m->grads_mem = nullptr;
        m->gbf_mem = (::bf16*)dev_alloc(rk, (m->npad + 1) / 2);
        m->gvec_mem = dev_alloc(rk, params_vector_floats(&m->plan));
    }
    if (!bf16 && m->wbf_mem) {
        dev_free(rk, m->wbf_mem);
        dev_free(rk, m->wvec_mem);
        dev_free(rk, m->gbf_mem);
        dev_free(rk, m->gvec_mem);
        m->wbf_mem = nullptr;
        m->wvec_mem = nullptr;
        m->gbf_mem = nullptr;
        m->gvec_mem = nullptr;
        m->grads_mem = dev_alloc(rk, m->npad);
        if (m->gstage) dev_free(rk, m->gstage);
        m->gstage = nullptr;
        m->gstage_n = 0;
    }
    params_point(&m->params, m->params_mem, &m->plan);
    memset(&m->wbf, 0, sizeof(m->wbf));
    memset(&m->grads, 0, sizeof(m->grads));
    memset(&m->gbf, 0, sizeof(m->gbf));
    if (!bf16) params_point(&m->grads, m->grads_mem, &m->plan);
    if (bf16) {  // params and grads: the vectors in wvec_mem and gvec_mem, no matrices (those are wbf's and gbf's)
        params_point(&m->wbf, m->wbf_mem, &m->plan);
        params_point(&m->gbf, m->gbf_mem, &m->plan);
        float **ptrs = (float**)&m->params, **gptrs = (float**)&m->grads;
        float *vec = m->wvec_mem, *gvec = m->gvec_mem;
        for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
            ptrs[i] = param_is_matrix(i) ? nullptr : vec;
            gptrs[i] = param_is_matrix(i) ? nullptr : gvec;
            if (!param_is_matrix(i)) vec += param_vector_floats(&m->plan, i);
            if (!param_is_matrix(i)) gvec += param_vector_floats(&m->plan, i);
        }
    }
    m->wbf_stale = bf16;
}

// The bf16 copy of elements [lo, hi) of the shard from the masters at step m->t, tensor by tensor (each has
// its own map to the full model). Each element's rounding depends on its value, its full index, the step
// and the seed alone, so a replica that rounds its ZeRO-1 slice makes the bits every replica would.
static void gpt_round_weights(GPT* m, Rank* rk, long lo, long hi) {
    long off = 0, loff = 0;  // the tensor's first element in the full model, in the shard
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        const TensorShard* t = &m->plan.t[i];
        long n = shard_local_size(t);
        long a = std::max(lo, loff), b = std::min(hi, loff + n);
        if (b > a)
            OP(rk, bf16_from_master, m->wbf_mem + a, m->params_mem + a, a - loff, b - a, shard_full_index(t, rk->rank, off),
               (uint32_t)m->t, m->bf16_seed);
        off += shard_full_size(t);
        loff += n;
    }
}

// The vectors of the whole bf16 copy (once it is rounded, or gathered) widened to fp32, where params points
static void gpt_widen_vectors(GPT* m, Rank* rk) {
    ::bf16** from = (::bf16**)&m->wbf;
    float** to = (float**)&m->params;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++)
        if (!param_is_matrix(i)) OP(rk, bf16_widen, to[i], from[i], shard_local_size(&m->plan.t[i]));
}

// Weight tensor `name` of the layers from element off, as the matmuls take it (Weight, kernels_cpu.h): the
// bf16 copy in a bf16 run, else the fp32 weights
#define WEIGHT(m, name, off) ((m)->bf16 ? Weight{nullptr, (m)->wbf.name + (off)} : Weight{(m)->params.name + (off), nullptr})
// ... and its gradient from element off, as the backward ops take it (Grad): bf16 storage in a bf16 run
// (a bf16 run's matrices), else fp32
#define GRAD(m, name, off) ((m)->bf16 && param_is_matrix(PARAM_INDEX(name)) ? Grad((m)->gbf.name + (off)) : Grad((m)->grads.name + (off)))

// With ZeRO-1 in a bf16 run the step all-gathers the bf16 copy, and a replica's masters outside its slice
// fall behind. A checkpoint (which saves the masters) and a sample from the gathered weights first call this:
// every replica calls it, and the replicas all-gather their slices of the masters, in fp32.
static void gpt_gather_masters(GPT* m, Rank* rk) {
    if (!m->masters_partial) return;
    comm_allgather(&rk->dp, m->params_mem, m->params_mem + m->slice0, m->nslice, "masters dp", -1);
    m->masters_partial = false;
}

// A bf16 run keeps activation x (n) in bf16: an operand of a matmul, rounded to nearest where it is made,
// so the matmul multiplies bf16 by bf16 (exact in fp32) and accumulates in fp32, and the backward reads the
// same values the forward did. Nothing in an fp32 run.
static void keep_bf16(GPT* m, Rank* rk, float* x, long n) {
    if (m->bf16) OP(rk, round_bf16, x, n);
}

// Whether this configuration allocates Acts buffer `name` (acts_layout). A bf16 run keeps ln1, atty, ln2, fch
// and fch_gelu for the backward in bf16 storage (the *_kept buffers, where -r does not recompute them): the
// forward rounds each into it (to nearest, as keep_bf16), and the backward reads it, in its matmuls, the
// GELU's backward and fused attention's where it lies and elsewhere widened back (bf16_widen), where -r
// would recompute it: the very values the forward used, from half the memory.
#define ACT_USED(m, name) ((m)->layout.kind[offsetof(Acts, name) / sizeof(float*)] != ACT_UNUSED)
static bf16* as_bf16(float* p) { return (bf16*)(void*)p; }

// The residual stream (encoded, and each layer's residual2 and residual3) as the ops read it: fp32 words,
// or a bf16 run's bf16 storage (stream_bf16: half the bytes of what was a layer's largest fp32 activation,
// and of what a pipeline stage sends the next). A bf16 run's stream holds bf16 values either way: each
// residual add rounds its fp32 sum to nearest (residual_add), as the embedding does (stream_keep); the
// fp32-words test hook keeps those values in fp32 words, to show that the storage changes no bit.
static Input stream_of(const GPT* m, float* x) { return m->stream_bf16 ? Input{nullptr, as_bf16(x)} : Input{x, nullptr}; }
// out (N, C) = res + (x + bias), both the stream's, rounded to nearest in a bf16 run
static void residual_add(GPT* m, Rank* rk, float* out, float* res, const float* x, const float* bias) {
    OP(rk, residual_forward, out, stream_of(m, res), x, bias, m->ntok, m->cfg.C);
    if (!m->stream_bf16) keep_bf16(m, rk, out, (long)m->ntok * m->cfg.C);
}
// out (N, C), the stream's, from fp32 sums x (N, C): x (out itself) in an fp32 run, rounded to nearest in a
// bf16 run, in place (the hook) or into out's bf16 storage (x then a scratch)
static void stream_keep(GPT* m, Rank* rk, float* out, float* x) {
    long n = (long)m->ntok * m->cfg.C;
    if (m->stream_bf16) OP(rk, bf16_pack, as_bf16(out), x, n);
    else keep_bf16(m, rk, x, n);
}

// A matmul's input x (n), made in this layer's forward, as the matmul takes it. An fp32 run: x. A bf16 run
// whose backward reads a bf16 copy of it (kept: its buffer, else NULL): x rounded to nearest into that copy
// (bf16_pack), which the matmul reads where it lies, x left as computed (nothing reads it again); else x
// rounded in place (keep_bf16). gathered: SP all-gathers x itself from every rank, so x is rounded in place
// and copied into kept as well. Either way the matmul multiplies the same bf16 values.
static Input keep_input(GPT* m, Rank* rk, float* x, float* kept, long n, bool gathered) {
    if (m->bf16 && kept && !gathered) {
        OP(rk, bf16_pack, as_bf16(kept), x, n);
        return {nullptr, as_bf16(kept)};
    }
    keep_bf16(m, rk, x, n);
    if (m->bf16 && kept) OP(rk, bf16_pack, as_bf16(kept), x, n);
    return {x, nullptr};
}

// A matmul's output gradient x (n) in the backward, as both of its backward calls take it (the input
// gradient, then the weight and bias gradients under the sum). A bf16 run: x rounded to nearest into copy
// (bf16_pack), bf16 storage the GEMMs read where it lies, so that neither call rounds or packs x again;
// x is left as computed (nothing reads it again). fp32: x.
static Input grad_input(GPT* m, Rank* rk, const float* x, float* copy, long n) {
    if (!m->bf16) return {x, nullptr};
    OP(rk, bf16_pack, as_bf16(copy), x, n);
    return {nullptr, as_bf16(copy)};
}

// The input x of a matmul's weight gradient in the backward: the bf16 copy of it the layer kept, where
// this run keeps one (kept; ACT_USED), read by the GEMM where it lies, with no widening back to fp32 (and
// on a GPU no packing); else x as it is, computed in the forward or again by -r.
static Input kept_input(bool kept, const float* x, float* kept_buf) {
    return kept ? Input{nullptr, as_bf16(kept_buf)} : Input{x, nullptr};
}

// A layer's layernorm in the forward, (N, C) from the residual stream inp (stream_of), as the matmul after it takes it
// (with SP the rank's rows, which all_tokens_input gathers). A bf16 run that keeps the output in bf16
// (kept: the layer's copy, else NULL) writes it there straight, each value rounded to nearest as it is
// stored: keep_input's bits, with no fp32 copy (acts_layout makes none); under SP its gather then moves
// that bf16. Where SP's gather moves fp32 words instead (an odd C; the fp32-words test hook), and in an
// fp32 run, the layernorm writes out (fp32) and keep_input rounds and keeps that.
static bool sp_wire_bf16(const GPTConfig* c, bool bf16);
static Input layernorm_input(GPT* m, Rank* rk, float* out, float* kept, bool keep, float* mean, float* rstd,
                             Input inp, const float* w, const float* b) {
    int N = m->ntok, C = m->cfg.C;
    if (m->bf16 && kept && (!m->split || sp_wire_bf16(&m->cfg, m->bf16))) {
        OP(rk, layernorm_forward, as_bf16(kept), mean, rstd, inp, w, b, N, C);
        return {nullptr, as_bf16(kept)};
    }
    OP(rk, layernorm_forward, out, mean, rstd, inp, w, b, N, C);
    return keep_input(m, rk, out, keep ? kept : nullptr, (long)N * C, m->split);
}

// The MLP's GELU in the forward, on fch (B*T*C4l fc sums), as fcproj takes its output. A bf16 run that keeps
// the output in bf16 makes both bf16 copies in one pass (gelu_forward_bf16): fch rounded to nearest, which
// the GELU takes and its backward reads again, and the GELU's output rounded to nearest, fcproj's input,
// with no fp32 copy of it (acts_layout makes none). Nothing reads the fp32 sums after that, so fc writes
// them into the backward's dfch buffer, unused until the backward (fc_sums). Else (fp32; -r 1, which
// recomputes the output; the fp32-words hook) fch is rounded in place, kept, and the GELU writes fch_gelu
// in fp32 words.
static bool gelu_into_kept(const GPT* m) { return m->bf16 && ACT_USED(m, gelu_kept); }  // (fch_kept too, then)
static float* fc_sums(GPT* m, LayerActs* la) { return gelu_into_kept(m) ? m->acts.dfch : la->fch; }
static Input gelu_input(GPT* m, Rank* rk, LayerActs* la, float* fch, bool keep) {
    long n = (long)m->B * m->T * m->plan.C4l;
    if (gelu_into_kept(m)) {
        OP(rk, gelu_forward_bf16, as_bf16(la->gelu_kept), as_bf16(la->fch_kept), fch, n);
        return {nullptr, as_bf16(la->gelu_kept)};
    }
    keep_bf16(m, rk, fch, n);  // the pre-activation in bf16, as the GELU's input and as kept
    if (keep && ACT_USED(m, fch_kept)) OP(rk, bf16_pack, as_bf16(la->fch_kept), fch, n);
    OP(rk, gelu_forward, la->fch_gelu, fch, n);
    return keep_input(m, rk, la->fch_gelu, keep && ACT_USED(m, gelu_kept) ? la->gelu_kept : nullptr, n, false);
}

// q, k and v as attention takes them, from qkv's fp32 sums (B*T*3Cl, written where qkv_sums says). An fp32
// run, and matmul attention: the sums as they are. A bf16 run's fused attention multiplies q, k and v in
// bf16, as the matmuls multiply their operands (a GPU's TF32 tensor cores hold a bf16 value exactly): each
// rounded to nearest into the layer's bf16 copy (qkv_kept), which the forward and the backward read where it
// lies, half the bytes of fp32 q, k and v and no fp32 copy kept; or rounded in place where fp32 words must
// stay (words: the KV cache's writes and decode read fp32; the fp32-words test hook keeps no bf16 copy).
static float* qkv_sums(GPT* m, LayerActs* la) { return ACT_USED(m, qkv_kept) ? m->acts.dqkv : la->qkv; }
static Input qkv_input(GPT* m, Rank* rk, LayerActs* la, float* qkv, bool words) {
    long n = (long)m->B * m->T * 3 * m->plan.Cl;
    if (!m->bf16 || !m->fused) return {qkv, nullptr};
    if (words || !ACT_USED(m, qkv_kept)) {
        keep_bf16(m, rk, qkv, n);
        return {qkv, nullptr};
    }
    OP(rk, bf16_pack, as_bf16(la->qkv_kept), qkv, n);
    return {nullptr, as_bf16(la->qkv_kept)};
}

// Fused attention's backward, from datty and q, k, v as qkv_input gave them (atty for D), into qkv's output
// gradient as qkv's two backward matmuls take it: an fp32 run's in dqkv; a bf16 run's written into bf16
// storage in dfch's buffer (free once fc's backward is done), each sum rounded to nearest as it is stored.
static Input attention_fused_backward_input(GPT* m, Rank* rk, LayerActs* la, Input qkv, Input atty) {
    Acts* a = &m->acts;
    int B = m->B, T = m->T, NHl = m->plan.NHl, hs = m->hs;
    if (!m->bf16) {
        OP(rk, attention_fused_backward, a->dqkv, a->attd, a->datty, qkv, atty, la->lse, B, T, NHl, hs);
        return {a->dqkv, nullptr};
    }
    OP(rk, attention_fused_backward, as_bf16(a->dfch), a->attd, a->datty, qkv, atty, la->lse, B, T, NHl, hs);
    return {nullptr, as_bf16(a->dfch)};
}

// The LM head's logits (and dlogits) in this allocation's storage (Logits, kernels_cpu.h). A bf16 run
// keeps them in bf16, as it keeps the matmuls' other operands: the head's GEMM rounds each fp32 sum to
// nearest as it stores it, the cross-entropy reads them widened and sums in fp32, and it writes dlogits
// rounded to nearest, the operand of the head's backward matmuls. At GPT-2's vocabulary they are the
// largest activation (B*T*Vp/P values: 3.3 GB in fp32 at d12, B 16, T 1024, TP 1), so this halves it.
static Logits logits_of(GPT* m) {
    if (m->acts_bf16) return {nullptr, as_bf16(m->acts.logits)};
    return {m->acts.logits, nullptr};
}

// Writes this rank's shard of a per-rank tensor set (params, grads, or m and v without ZeRO) into the
// full tensors in host memory. Ranks share the process, so gathering is each rank filling its own
// disjoint part of one host buffer; replicated tensors are written by rank 0 only. Call it on one replica
// only (all replicas hold the same values); the caller puts a barrier after it.
static void gpt_gather(GPT* m, Rank* rk, const float* local_mem, float* full) {
    std::vector<float> local;
    long off = 0, loff = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        const TensorShard* t = &m->plan.t[i];
        long n = shard_local_size(t);
        bool writes = (t->split != SPLIT_NONE || rk->rank == 0) && (i != 0 || m->plan.first);  // wte: the first stage's copy
        if (writes && n > 0) {
            local.resize(n);
            dev_download(rk, local.data(), local_mem + loff, n * sizeof(float));
            shard_copy(t, rk->rank, full + off, local.data(), false);
        }
        off += shard_full_size(t);
        loff += n;
    }
}

// The parts of the full tensors (llm.c's layout; AdamW's m and v share it) that stages [s0, s0 + ns) of S
// hold, as gpt_gather writes them: their layers of every layer tensor, wte and wpe with the first stage,
// lnf with the last. A process that holds those stages sends them for a checkpoint (comm_procs_collect).
static std::vector<CommSpan> gpt_stage_spans(const GPTConfig* c, int S, int s0, int ns) {
    std::vector<CommSpan> spans;
    ShardPlan first, last;
    shard_plan_init(&first, c, 1, 0, S, s0);
    shard_plan_init(&last, c, 1, 0, S, s0 + ns - 1);
    long off = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        const TensorShard* a = &first.t[i];
        const TensorShard* b = &last.t[i];
        long layer = a->rows * a->cols;
        if (i >= 2 && i <= 13) spans.push_back({off + a->l0 * layer, (b->l0 + b->nl - a->l0) * layer});
        else if ((i < 2 && first.first) || (i >= 14 && last.last)) spans.push_back({off, shard_full_size(a)});
        off += shard_full_size(a);
    }
    return spans;
}

// The same for AdamW's m or v: with ZeRO-1 every replica holds one slice, so the replicas first all-gather
// the slices over the data-parallel group into the full shard (every replica calls it), and replica 0
// writes it into `full`.
static void gpt_gather_moments(GPT* m, Rank* rk, const float* mom, float* full) {
    if (!m->zero || rk->dp.P == 1) {  // the rank holds the moments of its whole shard
        if (rk->dp.rank == 0) gpt_gather(m, rk, mom, full);
        return;
    }
    float* shard = dev_alloc(rk, m->npad);
    comm_allgather(&rk->dp, shard, mom, m->nslice, "moments dp", -1);
    if (rk->dp.rank == 0) gpt_gather(m, rk, shard, full);
    dev_free(rk, shard);
}

// Makes slot k (0 <= k) the current activations, keeping the current ones in their slot. A slot not used
// yet starts empty, and the next gpt_alloc_acts allocates it.
static void gpt_select_slot(GPT* m, int k) {
    if (k >= m->nslots) {
        ActsSlot* grown = new ActsSlot[k + 1]();
        for (int i = 0; i < m->nslots; i++) grown[i] = m->slots[i];
        delete[] m->slots;
        m->slots = grown;
        m->nslots = k + 1;
    }
    m->slots[m->slot] = {m->acts_mem, m->acts, m->tokens, m->targets};
    m->slot = k;
    m->acts_mem = m->slots[k].mem;
    m->acts = m->slots[k].acts;
    m->tokens = m->slots[k].tokens;
    m->targets = m->slots[k].targets;
}

static void gpt_free_slot_mem(GPT* m, Rank* rk) {
    if (m->acts_mem) dev_free(rk, m->acts_mem);
    if (m->tokens) dev_free(rk, m->tokens);
    if (m->targets) dev_free(rk, m->targets);
    m->acts_mem = nullptr;
    m->tokens = m->targets = nullptr;
}

static void gpt_free(GPT* m, Rank* rk) {
    dev_free(rk, m->params_mem);
    if (m->wbf_mem) dev_free(rk, m->wbf_mem);
    if (m->wvec_mem) dev_free(rk, m->wvec_mem);
    if (m->grads_mem) dev_free(rk, m->grads_mem);
    if (m->gbf_mem) dev_free(rk, m->gbf_mem);
    if (m->gvec_mem) dev_free(rk, m->gvec_mem);
    if (m->gstage) dev_free(rk, m->gstage);
    dev_free(rk, m->m_mem);
    dev_free(rk, m->v_mem);
    dev_free(rk, m->norm2);
    for (int k = 0; k < m->nslots; k++) {
        gpt_select_slot(m, k);
        gpt_free_slot_mem(m, rk);
    }
    gpt_free_slot_mem(m, rk);
    delete[] m->slots;
    if (m->row) dev_free(rk, m->row);
}

// The floats of the stage a bf16 run sums its gradients in (grad_allreduce): as many as the configuration's
// largest gradient collective, at most g_grad_stage_max (16 MB; a larger one goes through it in pieces). DP
// (D > 1): the padded shard; pipeline stages: the tied wte between the first and the last; SP: wpe's T rows
// or the layernorms' 2 L C. 0 where none runs. (The tests lower the most to cut the sums into many pieces.)
static long g_grad_stage_max = 1L << 22;
static long grad_stage_floats(const GPTConfig* c, const ShardPlan* s, long npad, int D, int S, bool split, int T) {
    long need = D > 1 ? npad : 0;
    if (S > 1 && (s->first || s->last)) need = std::max(need, shard_local_size(&s->t[0]));
    if (split) need = std::max(need, std::max((long)T * c->C, 2L * s->L * c->C));
    return std::min(need, g_grad_stage_max);
}

// (Re)allocates the activations for batches of (B, T).
static void gpt_alloc_acts(GPT* m, Rank* rk, int B, int T) {
    bool split = sp_splits(m->sp, rk->P, B, T);
    bool same = m->B == B && m->T == T && m->split == split && m->acts_bf16 == m->bf16;
    if (m->acts_mem && same) return;
    if (!same && m->nslots) {  // a new shape: every slot's activations are of the old one
        int k = m->slot;
        for (int i = 0; i < m->nslots; i++) {
            gpt_select_slot(m, i);
            gpt_free_slot_mem(m, rk);
        }
        gpt_select_slot(m, k);
    }
    gpt_free_slot_mem(m, rk);
    // (setup refuses these from the command line with the flags to change; this guards the other callers)
    if (m->fused && m->hs > ATT_HS_MAX)
        fatal("fused attention takes head sizes up to %d, this model's is %d: use --attention matmul", ATT_HS_MAX, m->hs);
    if (m->fused && m->recompute >= 3)
        fatal("-r 3 recomputes the attention probabilities, which fused attention never keeps: use -r 2, or --attention matmul");
    acts_layout(&m->cfg, &m->plan, B, T, split, m->recompute, m->fused, m->bf16, &m->layout);
    m->acts_mem = dev_alloc(rk, acts_floats(&m->cfg, &m->plan, B, T, split, m->recompute, m->fused, m->bf16));
    float** ptrs = (float**)&m->acts;
    float* p = m->acts_mem;
    for (int i = 0; i < NUM_ACTS; i++) {
        ptrs[i] = p;
        p += m->layout.size[i] * act_copies(&m->layout, i, m->plan.L);
    }
    // (a bf16 run's tokens are followed by their groups by row, for the embedding's backward: encoder_groups)
    m->tokens = (int*)dev_alloc(rk, (long)B * T + (m->bf16 ? ENC_GROUP_INTS((long)B * T) : 0));
    m->targets = (int*)dev_alloc(rk, (long)B * T);
    m->B = B;
    m->T = T;
    m->split = split;
    m->acts_bf16 = m->bf16;
    m->stream_bf16 = bf16_storage(m->bf16);  // (acts_layout's choice)
    m->ntok = split ? B * T / rk->P : B * T;
    m->t0 = split ? rk->rank * m->ntok : 0;
    long stage = m->bf16 ? grad_stage_floats(&m->cfg, &m->plan, m->npad, rk->dp.P, rk->S, split, T) : 0;
    if (stage > m->gstage_n) {  // (it only grows: a batch of another shape, a sample, leaves it)
        if (m->gstage) dev_free(rk, m->gstage);
        m->gstage = dev_alloc(rk, stage);
        m->gstage_n = stage;
    }
}

// ----------------------------------------------------------------------------
// forward, backward, update: the TP recipe

// Where a layer enters and leaves the tensor-parallel region, the two places the collectives sit.
//                                  without --sp (TP)                       with --sp 1 (SP)
//   into qkv, fc, the LM head    f: identity fwd, all-reduce bwd         all-gather fwd, reduce-scatter bwd
//   out of attproj, fcproj       g: all-reduce fwd, identity bwd         reduce-scatter fwd, all-gather bwd
// A column-parallel matmul needs every token as input; a row-parallel one leaves every rank a partial
// sum over the ranks. The backward of "gather the tokens" is "sum the partials" and vice versa, so the
// two functions below serve both passes. A ring all-reduce is a reduce-scatter followed by an
// all-gather, so SP moves the same bytes here as TP; it moves more in two places, both marked below.

// Whether a --dtype bf16 run's SP all-gathers of bf16 values move as bf16: pairs of bf16 travel as 32-bit
// words, so every rank's rows must be an even count, which an even C makes for any P (every GPT-2 size).
static bool sp_wire_bf16(const GPTConfig* c, bool bf16) { return bf16_storage(bf16) && c->C % 2 == 0; }

// out (B, T, C) <- every rank's rows x (N, C), rank 0's first: SP's all-gather (the f operator's forward,
// the g operator's backward). out may be x's own place in out (x = out + t0*C).
// kept: x holds bf16 values, rounded by keep_bf16 before the gather (lnf in a --dtype bf16 run). Those
// move as bf16: the same values, exactly, in half the bytes. The rank puts its rows into its place in
// acts.wire, the all-gather fills in the other ranks' rows (gather_wire: x fp32 words, rounded to nearest
// as they are packed, or bf16 storage, copied; n = N*C is even), and every row is widened back into out.
// (The matmuls that take a gathered layernorm output or output gradient read the wire itself:
// all_tokens_input, residual_grad_input. The row-parallel partial sums stay fp32 on the wire: the README's
// bf16 section measures what bf16 partial sums would cost. So does the embedding's gradient, which is the
// fp32 residual-stream gradient.)
static bf16* gather_wire(GPT* m, Rank* rk, Input x, const char* where, int l) {
    long n = (long)m->ntok * m->cfg.C;
    bf16* wire = as_bf16(m->acts.wire);
    if (x.h) dev_copy(rk, (float*)(void*)(wire + (long)rk->rank * n), (const float*)(const void*)x.h, n / 2);
    else OP(rk, bf16_pack, wire + (long)rk->rank * n, x.f, n);
    comm_allgather_bf16(&rk->tp, wire, wire + (long)rk->rank * n, n, where, l);
    return wire;
}
static void gather_tokens(GPT* m, Rank* rk, float* out, const float* x, bool kept, const char* where, int l) {
    long n = (long)m->ntok * m->cfg.C;
    if (kept && sp_wire_bf16(&m->cfg, m->bf16)) {
        OP(rk, bf16_widen, out, gather_wire(m, rk, Input{x, nullptr}, where, l), (long)rk->P * n);
        return;
    }
    comm_allgather(&rk->tp, out, x, n, where, l);
}

// Every token's rows, (B, T, C), from this rank's rows x (N, C). With SP an all-gather into
// acts.gathered, in fp32 words; without SP x already holds every token and is returned as it is.
static float* all_tokens(GPT* m, Rank* rk, float* x, const char* where, int l) {
    if (!m->split) return x;
    gather_tokens(m, rk, m->acts.gathered, x, false, where, l);
    return m->acts.gathered;
}

// A layernorm output x, the rank's rows (N, C) as layernorm_input or the backward's kept_input gives them,
// as the column-parallel matmul after it takes it: every token's rows, with SP all-gathered (f's
// forward; in the backward for the weight gradient, SP's first extra cost). A bf16 run whose gathers move
// bf16 hands the matmul the bf16 the gather filled (the wire), read where it lies, with no fp32 copy
// widened from it and none packed again; else fp32 words (x rounded, or a kept bf16 copy widened into
// words first) gathered into acts.gathered.
static Input all_tokens_input(GPT* m, Rank* rk, Input x, float* words, const char* where, int l) {
    if (!m->split) return x;
    if (sp_wire_bf16(&m->cfg, m->bf16)) return {nullptr, gather_wire(m, rk, x, where, l)};
    if (x.h) OP(rk, bf16_widen, words, x.h, (long)m->ntok * m->cfg.C);
    gather_tokens(m, rk, m->acts.gathered, x.h ? words : x.f, false, where, l);
    return {m->acts.gathered, nullptr};
}

// The residual-stream gradient dres (N, C) as the output gradient of the row-parallel matmul that made
// the stream's last addend (fcproj, attproj), every token's rows: with SP all-gathered (g's backward).
// dres itself stays fp32 and flows on through the residual connections, as the stream does in the
// forward; a bf16 run rounds only the matmul's operand, to nearest, into bf16 storage that both of the
// matmul's backward calls read where it lies: under SP the wire the all-gather fills (bf16 on the wire,
// half the bytes), else dln's buffer, free until fc's or qkv's input gradient after this matmul.
static Input residual_grad_input(GPT* m, Rank* rk, float* dres, const char* where, int l) {
    if (m->split && sp_wire_bf16(&m->cfg, m->bf16)) return {nullptr, gather_wire(m, rk, Input{dres, nullptr}, where, l)};
    float* dout = all_tokens(m, rk, dres, where, l);
    return grad_input(m, rk, dout, m->acts.dln, (long)m->B * m->T * m->cfg.C);
}

// partial (B, T, C) holds this rank's partial sums; returns the sums over all ranks of this rank's
// rows (N, C). Without SP an all-reduce of every row (in place); with SP a reduce-scatter that leaves
// this rank's rows, summed, in place at row t0.
//
// start (my_tokens_summed_start): the backward of f, started rather than done (with m->overlap): the
// caller may queue work that does not read the sum (the weight gradient of the same matmul) before
// my_tokens_summed_wait, and on a GPU that work runs while the sum is in flight. Megatron-LM overlaps the input-gradient all-reduce of a
// column-parallel linear with its weight-gradient GEMM this way: the all-reduce is half of TP's traffic,
// and the weight gradient, as large a GEMM as the input gradient, is there to hide it.
static float* my_tokens_summed(GPT* m, Rank* rk, float* partial, const char* where, int l, bool start = false) {
    long C = m->cfg.C;
    bool async = start && m->overlap;
    if (!m->split) {
        long n = (long)m->B * m->T * C;
        if (async) comm_allreduce_start(&rk->tp, partial, n, COMM_SUM, where, l);
        else comm_allreduce(&rk->tp, partial, n, COMM_SUM, where, l);
        return partial;
    }
    float* mine = partial + (long)m->t0 * C;
    if (async) comm_reducescatter_start(&rk->tp, mine, partial, (long)m->ntok * C, where, l);
    else comm_reducescatter(&rk->tp, mine, partial, (long)m->ntok * C, where, l);
    return mine;
}

static float* my_tokens_summed_start(GPT* m, Rank* rk, float* partial, const char* where, int l) {
    return my_tokens_summed(m, rk, partial, where, l, true);
}
// the next op reads the sum my_tokens_summed_start started: wait for it
static void my_tokens_summed_wait(Rank* rk) { comm_finish(&rk->tp); }

// ----------------------------------------------------------------------------
// serving: the KV cache of this rank's heads

// The keys and values of every layer for B sequences of up to Tmax positions, for this rank's NH/P heads
// only: qkv is column-parallel by head, so a rank computes the k and v of its own heads and attention
// never needs another rank's. Memory per rank is 2 L B (NH/P) Tmax hs floats: the cache divides by P.
struct KVCache {
    int B, Tmax;        // rows, positions per row
    int L, NHl, hs;
    long lstride;       // floats between one layer's cache and the next (B NHl Tmax hs for the whole cache)
    float *k, *v;       // (L, B, NHl, Tmax, hs) each, on the rank's device
    int* pos;           // (B) on the device: where the rows' tokens of the next forward start
    float* logits;      // (B, Vp) on the device: one position of every row, all-gathered; then (B, Vl),
                        // this rank's widened from a bf16 run's bf16 logits
    bool view;          // a view of one row of another cache (kv_row): owns nothing
};

static long kv_cache_floats(const GPTConfig* c, int P, int B, int Tmax) { return 2L * c->L * B * (c->NH / P) * (long)Tmax * (c->C / c->NH); }

static void kv_alloc(KVCache* kv, GPT* m, Rank* rk, int B, int Tmax) {
    memset(kv, 0, sizeof(*kv));
    kv->B = B;
    kv->Tmax = Tmax;
    kv->L = m->plan.L;
    kv->NHl = m->plan.NHl;
    kv->hs = m->hs;
    kv->lstride = (long)B * kv->NHl * Tmax * kv->hs;
    kv->k = dev_alloc(rk, kv->L * kv->lstride);
    kv->v = dev_alloc(rk, kv->L * kv->lstride);
    kv->pos = (int*)dev_alloc(rk, B);
    kv->logits = dev_alloc(rk, (long)B * (m->cfg.Vp + m->plan.Vl));
}

static void kv_free(KVCache* kv, Rank* rk) {
    if (kv->view) return;
    dev_free(rk, kv->k);
    dev_free(rk, kv->v);
    dev_free(rk, kv->pos);
    dev_free(rk, kv->logits);
}

// row b of kv as a cache of one row (the layers keep their stride): for re-prefilling one row
static KVCache kv_row(const KVCache* kv, int b) {
    KVCache r = *kv;
    long off = (long)b * kv->NHl * kv->Tmax * kv->hs;
    r.B = 1;
    r.k = kv->k + off;
    r.v = kv->v + off;
    r.pos = kv->pos + b;
    r.logits = kv->logits + 0;  // unused by a prefill
    r.view = true;
    return r;
}

// ----------------------------------------------------------------------------
// the forward: one recipe for training, prefill and decode

// One transformer layer l on the rank's N tokens of the batch (B, T) in m's activations.
//   residual (N, C) -> ln1 (N, C) -> qkv (B, T, 3 C/P) -> atty (B, T, C/P) -> attproj partial (B, T, C)
//   -> g -> residual2 (N, C) -> ln2 -> fch (B, T, 4C/P) -> gelu -> fcproj partial (B, T, C) -> g -> residual3 (N, C)
// Only attention differs between the three uses: training and prefill attend over the batch's own T
// tokens (causal); decode (T = 1) attends over the KV cache. With a cache, the layer's k and v are written
// into it first, at each row's position (kv->pos). keep: a backward follows (training), so a bf16 run packs
// the activations it keeps in bf16; an evaluation, a prefill or a decode reads none of them back.
static void gpt_layer_forward(GPT* m, Rank* rk, int l, KVCache* kv, bool decode, bool keep) {
    const GPTConfig* c = &m->cfg;
    const ShardPlan* s = &m->plan;
    Acts* a = &m->acts;
    Params* p = &m->params;
    int B = m->B, T = m->T, C = c->C, NHl = s->NHl, Cl = s->Cl, C4l = s->C4l, hs = m->hs;
    int BT = B * T;
    LayerActs la = layer_acts(m, l);
    int lg = s->l0 + l;  // the layer's index in the model (l is the stage's), for the collectives' labels

    // attention block. ln1 is replicated: every rank normalises the same residual stream (with SP,
    // its own tokens of it).
    Input ln1_in = layernorm_input(m, rk, la.ln1, ACT_USED(m, ln1_kept) ? la.ln1_kept : nullptr, keep, la.ln1_mean,
                                   la.ln1_rstd, stream_of(m, la.residual), p->ln1w + l * C, p->ln1b + l * C);
    // qkv is column-parallel by head: this rank computes q, k, v of its NHl heads only, for every
    // token. f: the input is already every rank's (TP); SP all-gathers the tokens.
    ln1_in = all_tokens_input(m, rk, ln1_in, la.ln1, "ln1 fwd", lg);
    float* qkv = qkv_sums(m, &la);
    OP(rk, matmul_forward, qkv, ln1_in, WEIGHT(m, qkvw, (long)l * 3 * Cl * C), p->qkvb + l * 3 * Cl, BT, C, 3 * Cl);
    Input qkv_in = qkv_input(m, rk, &la, qkv, kv != nullptr);
    // heads are independent, so attention needs nothing from the other ranks; nor does the cache,
    // which holds this rank's heads only
    if (kv) OP(rk, kv_write, kv->k + l * kv->lstride, kv->v + l * kv->lstride, qkv, kv->pos, B, T, NHl, kv->Tmax, hs);
    if (decode) OP(rk, attention_decode, la.atty, qkv, kv->k + l * kv->lstride, kv->v + l * kv->lstride, kv->pos, B, NHl, kv->Tmax, hs);
    else if (m->fused) OP(rk, attention_fused_forward, la.atty, la.lse, qkv_in, B, T, NHl, hs);  // keeps out and lse
    else OP(rk, attention_forward, la.atty, la.att, qkv, B, T, NHl, hs);  // keeps the (T, T) probabilities
    Input atty_in = keep_input(m, rk, la.atty, keep && ACT_USED(m, atty_kept) ? la.atty_kept : nullptr, (long)BT * Cl, false);
    // attproj is row-parallel: this rank holds the input columns of its heads, so its product is a
    // partial sum over heads. Megatron's g operator: all-reduce forward (identity backward) sums
    // the heads of all ranks into the full projection, the same on every rank (SP: reduce-scatter).
    OP(rk, matmul_forward, a->partial, atty_in, WEIGHT(m, attprojw, (long)l * C * Cl), nullptr, BT, Cl, C);
    float* attn_out = my_tokens_summed(m, rk, a->partial, "attproj fwd", lg);
    residual_add(m, rk, la.residual2, la.residual, attn_out, p->attprojb + l * C);  // bias once, after the sum

    // MLP block: fc is column-parallel (this rank's 4C/P hidden units), GELU is elementwise on them,
    // fcproj is row-parallel over the same units: again a partial sum, again g.
    Input ln2_in = layernorm_input(m, rk, la.ln2, ACT_USED(m, ln2_kept) ? la.ln2_kept : nullptr, keep, la.ln2_mean,
                                   la.ln2_rstd, stream_of(m, la.residual2), p->ln2w + l * C, p->ln2b + l * C);
    ln2_in = all_tokens_input(m, rk, ln2_in, la.ln2, "ln2 fwd", lg);
    float* fch = fc_sums(m, &la);
    OP(rk, matmul_forward, fch, ln2_in, WEIGHT(m, fcw, (long)l * C4l * C), p->fcb + l * C4l, BT, C, C4l);
    Input gelu_in = gelu_input(m, rk, &la, fch, keep);
    OP(rk, matmul_forward, a->partial, gelu_in, WEIGHT(m, fcprojw, (long)l * C * C4l), nullptr, BT, C4l, C);
    float* mlp_out = my_tokens_summed(m, rk, a->partial, "fcproj fwd", lg);
    residual_add(m, rk, la.residual3, la.residual2, mlp_out, p->fcprojb + l * C);
}

// The embedding, the layers and the LM head on the tokens already in m->tokens (B, T): logits (B, T, Vl).
// Positions: training and prefill, token t of each row at position t; decode, row b at kv->pos[b].
// A pipeline stage runs its part: the embedding on the first stage only (on the others the previous
// stage's output is in acts.encoded already), its layers, and the LM head on the last stage only (the
// others leave their output in the last layer's residual3, gpt_stage_output).
static void gpt_forward_logits(GPT* m, Rank* rk, KVCache* kv, bool decode, bool keep) {
    const ShardPlan* s = &m->plan;
    Acts* a = &m->acts;
    Params* p = &m->params;
    Comm* tp = &rk->tp;
    int B = m->B, T = m->T, L = s->L, C = m->cfg.C, Vl = s->Vl;
    int BT = B * T, N = m->ntok;
    if (m->bf16 && m->wbf_stale) {  // the first forward since the masters changed
        gpt_round_weights(m, rk, 0, m->nparams);
        gpt_widen_vectors(m, rk);
        m->wbf_stale = false;
    }
    if (s->first) {

        // Vocab-parallel embedding: each rank holds wte rows [v0, v0+Vl) and looks up only the tokens it
        // owns, writing zeros for the rest. Summing over ranks puts every token's row in place (the other
        // ranks add exact zeros, so this is bit-identical to TP=1): g, an all-reduce; with SP a
        // reduce-scatter, which leaves each rank its own tokens. Then the replicated wpe is added. The sums
        // are fp32, in a scratch where the stream is bf16 storage (partial, or with SP gathered: both free
        // until the first layer), and go into the stream rounded like every addition to it (stream_keep).
        float* emb = !m->stream_bf16 ? a->encoded : m->split ? a->gathered : a->partial;
        if (!m->split) {
            OP(rk, encoder_forward, emb, m->tokens, WEIGHT(m, wte, 0), s->v0, Vl, BT, C);
            comm_allreduce(tp, emb, (long)BT * C, COMM_SUM, "embedding fwd", -1);
        } else {
            OP(rk, encoder_forward, a->partial, m->tokens, WEIGHT(m, wte, 0), s->v0, Vl, BT, C);
            comm_reducescatter(tp, emb, a->partial, (long)N * C, "embedding fwd", -1);
        }
        if (decode) OP(rk, position_rows_forward, emb, p->wpe, kv->pos + m->t0, N, C);  // T = 1: token n is row n
        else OP(rk, position_forward, emb, p->wpe, N, m->t0, T, C);
        stream_keep(m, rk, a->encoded, emb);
    }

    for (int l = 0; l < L; l++) gpt_layer_forward(m, rk, l, kv, decode, keep);
    if (!s->last) return;

    // final layernorm (replicated), then the LM head on this rank's vocab slice: logits (B, T, Vl).
    // The full (B, T, Vp) logits never exist on one rank. The head needs every token: with SP the
    // layernorm writes this rank's tokens in place at row t0 and an all-gather fills in the rest.
    float* last = LAYER_BUF(m, residual3, L - 1);
    OP(rk, layernorm_forward, a->lnf + (long)m->t0 * C, a->lnf_mean, a->lnf_rstd, stream_of(m, last), p->lnfw, p->lnfb, N, C);
    keep_bf16(m, rk, a->lnf + (long)m->t0 * C, (long)N * C);
    if (m->split) gather_tokens(m, rk, a->lnf, a->lnf + (long)m->t0 * C, true, "lnf fwd", -1);
    OP(rk, matmul_forward, logits_of(m), a->lnf, WEIGHT(m, wte, 0), nullptr, BT, C, Vl);
}

// Forward pass of one rank on tokens (B, T) (host memory, the same on every rank).
// With targets (B, T): computes the per-position losses, identical on every rank (read them with
// gpt_read_loss). With training set, the logits buffer is overwritten by dlogits for gpt_backward.
static void gpt_forward(GPT* m, Rank* rk, const int* tokens, const int* targets, int B, int T, bool training) {
    const GPTConfig* c = &m->cfg;
    const ShardPlan* s = &m->plan;
    if (T > c->maxT) fatal("sequence length -t %d exceeds the model's maximum %d: use -t %d or less", T, c->maxT, c->maxT);
    gpt_alloc_acts(m, rk, B, T);
    Acts* a = &m->acts;
    Comm* tp = &rk->tp;
    int Vl = s->Vl, BT = B * T;
    dev_upload(rk, m->tokens, tokens, BT * sizeof(int));
    if (training && m->bf16 && s->first) {
        // the tokens this rank's wte rows own, grouped by row for the embedding's bf16 backward, made here on
        // the host that has the tokens (a GPU would otherwise read them back in the middle of the step)
        std::vector<int> groups(ENC_GROUP_INTS(BT));
        encoder_groups(tokens, s->v0, Vl, BT, groups.data());
        dev_upload(rk, m->tokens + BT, groups.data(), groups.size() * sizeof(int));
    }
    if (targets) dev_upload(rk, m->targets, targets, BT * sizeof(int));
    gpt_forward_logits(m, rk, nullptr, false, training);
    if (!targets || !s->last) return;  // the loss is the last stage's

    // Vocab-parallel cross-entropy. softmax needs the max and the sum of exps over the whole vocab:
    // all-reduce(max) of the local row maxima, then all-reduce(sum) of the local exp-sums and of the
    // target's logit (only its owner contributes it). After that every rank computes the same loss and
    // its own slice of dlogits.
    OP(rk, crossentropy_max, a->ce_max, logits_of(m), BT, Vl, s->v0, c->V);
    comm_allreduce(tp, a->ce_max, BT, COMM_MAX, "loss max", -1);
    OP(rk, crossentropy_sums, a->ce_sums, logits_of(m), a->ce_max, m->targets, BT, Vl, s->v0, c->V);
    comm_allreduce(tp, a->ce_sums, 2L * BT, COMM_SUM, "loss sums", -1);
    OP(rk, crossentropy_finish, a->losses, logits_of(m), a->ce_max, a->ce_sums, m->targets, BT, Vl, s->v0, c->V,
       training ? (m->dloss != 0.0f ? m->dloss : 1.0f / BT) : 0.0f);
}

// Pipeline parallelism: what crosses a stage boundary, the residual stream (N, C) of this rank's tokens:
// a stage's input (the previous stage's output, received into acts.encoded before its forward), its
// output (its last layer's residual3, sent after it), and in the backward the gradient of either, dres
// (received before gpt_backward, sent after it). With SP each rank has its own N = B T / P tokens' rows,
// so the TP ranks of a stage send disjoint slices, each to the same TP rank of the neighbouring stage.
static float* gpt_stage_input(GPT* m) { return m->acts.encoded; }
static float* gpt_stage_output(GPT* m) { return LAYER_BUF(m, residual3, m->plan.L - 1); }
static float* gpt_stage_grad(GPT* m) { return m->acts.dres; }
static long gpt_stage_grad_floats(const GPT* m) { return (long)m->ntok * m->cfg.C; }
// (the stream in a bf16 run is bf16 storage, which goes as it lies: half the bytes; its gradient is fp32)
static long gpt_stage_floats(const GPT* m) { return m->stream_bf16 ? bf16_floats((long)m->ntok * m->cfg.C) : gpt_stage_grad_floats(m); }

// Prefill: tokens (B, T) (host memory, rows right-padded to T; causal attention makes the padding change
// nothing before it) through the normal forward, which also writes every layer's k and v into the cache
// at positions 0..T-1 of each row. kv->B must be B. The logits of row b's last real token are then
// gpt_logits_row(m, rk, b, len_b - 1).
static void gpt_prefill(GPT* m, Rank* rk, KVCache* kv, const int* tokens, int B, int T) {
    if (T > kv->Tmax) fatal("prefill of %d tokens into a KV cache of %d positions", T, kv->Tmax);
    gpt_alloc_acts(m, rk, B, T);
    dev_upload(rk, m->tokens, tokens, (size_t)B * T * sizeof(int));
    std::vector<int> zeros(B, 0);
    dev_upload(rk, kv->pos, zeros.data(), B * sizeof(int));
    gpt_forward_logits(m, rk, kv, false, false);
}

// Decode: one new token per row, tokens (B) at positions pos (B) (host memory, each < Tmax; the cache
// holds positions 0..pos[b]-1 of row b). The same recipe with T = 1, so the same collectives each of
// B C floats: the embedding all-reduce and per layer the attproj and fcproj all-reduces (g; with SP
// reduce-scatters and all-gathers). Then gathers the logits: out (B, Vp) host memory.
static void gpt_decode(GPT* m, Rank* rk, KVCache* kv, const int* tokens, const int* pos, float* out) {
    int B = kv->B, Vl = m->plan.Vl, Vp = m->cfg.Vp, P = rk->P;
    gpt_alloc_acts(m, rk, B, 1);
    dev_upload(rk, m->tokens, tokens, B * sizeof(int));
    dev_upload(rk, kv->pos, pos, B * sizeof(int));
    gpt_forward_logits(m, rk, kv, true, false);
    // the vocab-parallel head left each rank (B, Vl): an all-gather (sampling only: every rank draws
    // the same tokens from the full rows) gives (P, B, Vl), rank-major; the host puts each row together.
    float* mine = m->acts.logits;
    if (m->acts_bf16) {  // widened (exactly) past the gathered ones
        mine = kv->logits + (long)B * Vp;
        OP(rk, bf16_widen, mine, as_bf16(m->acts.logits), (long)B * Vl);
    }
    comm_allgather(&rk->tp, kv->logits, mine, (long)B * Vl, "decode logits", -1);
    std::vector<float> g((size_t)B * Vp);
    dev_download(rk, g.data(), kv->logits, g.size() * sizeof(float));
    for (int r = 0; r < P; r++)
        for (int b = 0; b < B; b++) memcpy(out + (size_t)b * Vp + (size_t)r * Vl, g.data() + ((size_t)r * B + b) * Vl, Vl * sizeof(float));
}

// The payload of one decode step's collectives over the TP group, by kind (floats, counted as comm.cuh
// counts them), for B rows; X = B C. TP: all-reduce (2L + 1) X (embedding, attproj and fcproj of every
// layer), all-gather B Vp (the logits). SP (B divisible by P): those become reduce-scatters, with an
// all-gather of X before each column-parallel matmul and the LM head: reduce-scatter (2L + 1) X,
// all-gather (2L + 1) X + B Vp.
static void decode_comm_floats(const GPTConfig* c, int B, bool split, double out[COMM_KINDS]) {
    double X = (double)B * c->C, L = c->L;
    for (int k = 0; k < COMM_KINDS; k++) out[k] = 0;
    if (!split) out[KIND_ALLREDUCE] = (2 * L + 1) * X;
    else out[KIND_REDUCESCATTER] = (2 * L + 1) * X;
    out[KIND_ALLGATHER] = (split ? (2 * L + 1) * X : 0) + (double)B * c->Vp;
}

// the mean loss of the last forward with targets (the one read of the step from the device)
static float gpt_read_loss(GPT* m, Rank* rk) {
    int BT = m->B * m->T;
    std::vector<float> losses(BT);
    dev_download(rk, losses.data(), m->acts.losses, BT * sizeof(float));
    double s = 0.0;
    for (int i = 0; i < BT; i++) s += losses[i];
    return (float)(s / BT);
}

static void gpt_zero_grad(GPT* m, Rank* rk) {
    if (m->grads_mem) return dev_zero(rk, m->grads_mem, m->npad);
    dev_zero(rk, (float*)m->gbf_mem, (m->npad + 1) / 2);
    dev_zero(rk, m->gvec_mem, params_vector_floats(&m->plan));
}

// Gradient elements [off, off + n) of the flat shard as fp32, into out (n), tensor by tensor: a bf16 run's
// matrices widened exactly, its vectors copied, an fp32 run's copied
static void grad_to_fp32(GPT* m, Rank* rk, float* out, long off, long n) {
    if (m->grads_mem) return dev_copy(rk, out, m->grads_mem + off, n);
    float** vec = (float**)&m->grads;
    for (long t0 = 0, i = 0; i < NUM_PARAM_TENSORS; t0 += shard_local_size(&m->plan.t[i]), i++) {
        long a = std::max(off, t0), b = std::min(off + n, t0 + shard_local_size(&m->plan.t[i]));
        if (b <= a) continue;
        if (param_is_matrix(i)) OP(rk, bf16_widen, out + (a - off), m->gbf_mem + a, b - a);
        else dev_copy(rk, out + (a - off), vec[i] + (a - t0), b - a);
    }
}
// ... and back: from in (n) into gradient elements [off, off + n), a bf16 run's matrices rounded to nearest
static void grad_from_fp32(GPT* m, Rank* rk, const float* in, long off, long n) {
    if (m->grads_mem) return dev_copy(rk, m->grads_mem + off, in, n);
    float** vec = (float**)&m->grads;
    for (long t0 = 0, i = 0; i < NUM_PARAM_TENSORS; t0 += shard_local_size(&m->plan.t[i]), i++) {
        long a = std::max(off, t0), b = std::min(off + n, t0 + shard_local_size(&m->plan.t[i]));
        if (b <= a) continue;
        if (param_is_matrix(i)) OP(rk, bf16_pack, m->gbf_mem + a, in + (a - off), b - a);
        else dev_copy(rk, vec[i] + (a - t0), in + (a - off), b - a);
    }
}

// The rank's gradients as fp32 (nparams), in a new buffer on its device that the caller dev_frees: a bf16
// run's widened exactly, an fp32 run's copied (for the tests and tools that read them)
static float* gpt_grads_fp32(GPT* m, Rank* rk) {
    float* out = dev_alloc(rk, m->nparams);
    grad_to_fp32(m, rk, out, 0, m->nparams);
    return out;
}

// Backward pass of one rank, after gpt_forward(training = true). Accumulates into the gradients (with SP
// the replicated tensors' gradients stay partial sums over the ranks' tokens until gpt_update sums them).
static void gpt_backward(GPT* m, Rank* rk) {
    const ShardPlan* s = &m->plan;
    Acts* a = &m->acts;
    Params* p = &m->params;
    int B = m->B, T = m->T, L = s->L, C = m->cfg.C, NHl = s->NHl, Cl = s->Cl, C4l = s->C4l, Vl = s->Vl, hs = m->hs;
    int BT = B * T, N = m->ntok;

    // A pipeline stage before the last has the gradient of its output in dres already (received from the
    // next stage), and one after the first leaves the gradient of its input there (to send back).
    if (s->last) {
        // LM head: dlnf is a partial sum over this rank's vocab slice. lnf is replicated and feeds a
        // vocab(column)-parallel matmul, so this is Megatron's f operator: identity forward, all-reduce
        // backward (SP: reduce-scatter). Every rank then holds the same dlnf, and from here on the
        // residual-stream gradient dres is identical on every rank (SP: each rank has its own tokens' rows).
        // The input gradient comes first so that its sum can start; the weight gradient, which needs only
        // dlogits and lnf, is computed while the sum is in flight (the same for fc and qkv below).
        OP(rk, matmul_backward, a->dln, nullptr, nullptr, logits_of(m), a->lnf, WEIGHT(m, wte, 0), BT, C, Vl);
        float* dlnf = my_tokens_summed_start(m, rk, a->dln, "lm head bwd", -1);
        OP(rk, matmul_backward, nullptr, GRAD(m, wte, 0), nullptr, logits_of(m), a->lnf, WEIGHT(m, wte, 0), BT, C, Vl);  // under the sum
        dev_zero(rk, a->dres, (long)N * C);
        my_tokens_summed_wait(rk);
        float* last = LAYER_BUF(m, residual3, L - 1);
        OP(rk, layernorm_backward, a->dres, GRAD(m, lnfw, 0), GRAD(m, lnfb, 0), dlnf, stream_of(m, last), p->lnfw, a->lnf_mean,
           a->lnf_rstd, N, C);
    }

    for (int l = L - 1; l >= 0; l--) {
        LayerActs la = layer_acts(m, l);
        int lg = s->l0 + l;  // in the model, for the labels

        // dres is d(layer output). The residual passes it straight through to the block inputs.
        // fcproj is row-parallel: its input gradient dfch is local (this rank's hidden units), so no
        // communication (g's backward is the identity; with SP, the reduce-scatter's backward is an
        // all-gather of the output gradient). Its bias was added once after the sum, and its gradient,
        // the column sum of every token's dres, comes out the same on every rank.
        Input dout = residual_grad_input(m, rk, a->dres, "fcproj bwd", lg);  // bf16: a rounded copy
        if (m->recompute >= 1) {  // -r 1: not kept
            if (ACT_USED(m, fch_kept)) OP(rk, bf16_widen, la.fch, as_bf16(la.fch_kept), (long)BT * C4l);
            OP(rk, gelu_forward, la.fch_gelu, la.fch, (long)BT * C4l);
            keep_bf16(m, rk, la.fch_gelu, (long)BT * C4l);
        }
        Input gelu_in = kept_input(ACT_USED(m, gelu_kept), la.fch_gelu, la.gelu_kept);  // bf16: kept in bf16
        OP(rk, matmul_backward, a->dfch, GRAD(m, fcprojw, (long)l * C * C4l), GRAD(m, fcprojb, l * C), dout, gelu_in,
           WEIGHT(m, fcprojw, (long)l * C * C4l), BT, C4l, C);
        // fc's output gradient, in a bf16 run as bf16 storage in dqkv's buffer (free until attention's backward)
        Input dfch;
        if (ACT_USED(m, fch_kept)) {  // from the kept bf16 fch, rounded to bf16 as it is written
            OP(rk, gelu_backward_bf16, as_bf16(a->dqkv), as_bf16(la.fch_kept), a->dfch, (long)BT * C4l);
            dfch = {nullptr, as_bf16(a->dqkv)};
        } else {
            OP(rk, gelu_backward, a->dfch, la.fch, a->dfch, (long)BT * C4l);
            dfch = grad_input(m, rk, a->dfch, a->dqkv, (long)BT * C4l);
        }
        // fc is column-parallel: its input ln2 is replicated, and each rank's dln2 covers only its
        // hidden units. f operator: all-reduce backward sums them into the full dln2 (SP: reduce-scatter).
        // Its weight gradient needs the input of every token: with SP the all-gather of ln2 is done again
        // (the first of SP's two extra costs: it keeps only its own tokens' rows, as Megatron does).
        if (m->recompute >= 2) {  // -r 2: not kept
            OP(rk, layernorm_forward, la.ln2, la.ln2_mean, la.ln2_rstd, stream_of(m, la.residual2), p->ln2w + l * C,
               p->ln2b + l * C, N, C);
            keep_bf16(m, rk, la.ln2, (long)N * C);
        }
        Input ln2_in = all_tokens_input(m, rk, kept_input(ACT_USED(m, ln2_kept), la.ln2, la.ln2_kept), la.ln2, "ln2 bwd", lg);
        OP(rk, matmul_backward, a->dln, nullptr, nullptr, dfch, ln2_in, WEIGHT(m, fcw, (long)l * C4l * C), BT, C, C4l);
        float* dln2 = my_tokens_summed_start(m, rk, a->dln, "fc bwd", lg);
        OP(rk, matmul_backward, nullptr, GRAD(m, fcw, (long)l * C4l * C), GRAD(m, fcb, l * C4l), dfch, ln2_in,
           WEIGHT(m, fcw, (long)l * C4l * C), BT, C, C4l);  // under the sum
        my_tokens_summed_wait(rk);
        OP(rk, layernorm_backward, a->dres, GRAD(m, ln2w, l * C), GRAD(m, ln2b, l * C), dln2, stream_of(m, la.residual2), p->ln2w + l * C,
           la.ln2_mean, la.ln2_rstd, N, C);

        // attention block, the same pattern: attproj row-parallel (no communication, SP: all-gather),
        // attention on local heads, qkv column-parallel with the f all-reduce of dln1 (SP: reduce-scatter).
        dout = residual_grad_input(m, rk, a->dres, "attproj bwd", lg);
        Input atty = kept_input(ACT_USED(m, atty_kept), la.atty, la.atty_kept);  // bf16: kept in bf16
        OP(rk, matmul_backward, a->datty, GRAD(m, attprojw, (long)l * C * Cl), GRAD(m, attprojb, l * C), dout, atty,
           WEIGHT(m, attprojw, (long)l * C * Cl), BT, Cl, C);
        // qkv's output gradient, in a bf16 run as bf16 storage in dfch's buffer (fc's backward is done):
        // fused attention's backward rounds each sum into it as it stores it, matmul attention's is packed
        Input dqkv;
        if (m->fused) {  // the probabilities again, tile by tile, from q, k and the forward's lse (and atty for D)
            dqkv = attention_fused_backward_input(m, rk, &la, kept_input(ACT_USED(m, qkv_kept), la.qkv, la.qkv_kept), atty);
        } else {
            if (m->recompute >= 3) OP(rk, attention_probs, la.att, la.qkv, B, T, NHl, hs);  // -r 3: from q and k again
            OP(rk, attention_backward, a->dqkv, a->datty, la.qkv, la.att, B, T, NHl, hs);
            dqkv = grad_input(m, rk, a->dqkv, a->dfch, (long)BT * 3 * Cl);
        }
        if (m->recompute >= 2) {
            OP(rk, layernorm_forward, la.ln1, la.ln1_mean, la.ln1_rstd, stream_of(m, la.residual), p->ln1w + l * C,
               p->ln1b + l * C, N, C);
            keep_bf16(m, rk, la.ln1, (long)N * C);
        }
        Input ln1_in = all_tokens_input(m, rk, kept_input(ACT_USED(m, ln1_kept), la.ln1, la.ln1_kept), la.ln1, "ln1 bwd", lg);
        OP(rk, matmul_backward, a->dln, nullptr, nullptr, dqkv, ln1_in, WEIGHT(m, qkvw, (long)l * 3 * Cl * C), BT, C, 3 * Cl);
        float* dln1 = my_tokens_summed_start(m, rk, a->dln, "qkv bwd", lg);
        OP(rk, matmul_backward, nullptr, GRAD(m, qkvw, (long)l * 3 * Cl * C), GRAD(m, qkvb, l * 3 * Cl), dqkv, ln1_in,
           WEIGHT(m, qkvw, (long)l * 3 * Cl * C), BT, C, 3 * Cl);  // under the sum
        my_tokens_summed_wait(rk);
        OP(rk, layernorm_backward, a->dres, GRAD(m, ln1w, l * C), GRAD(m, ln1b, l * C), dln1, stream_of(m, la.residual), p->ln1w + l * C,
           la.ln1_mean, la.ln1_rstd, N, C);
    }

    if (!s->first) return;
    // embedding: its forward sum was a g operator, so each rank's lookup receives every token's dres
    // (SP: all-gathered) and scatters it into the wte rows it owns; wpe gets the rows of this rank's
    // tokens (all of them without SP: the same sum on every rank).
    OP(rk, position_backward, GRAD(m, wpe, 0), a->dres, N, m->t0, T, C);
    float* demb = all_tokens(m, rk, a->dres, "embedding bwd", -1);
    OP(rk, encoder_backward, GRAD(m, wte, 0), demb, m->tokens, m->bf16 ? m->tokens + BT : nullptr, s->v0, Vl, BT, C);
    // (with SP the layernorms' and wpe's gradients are still partial sums over the ranks' tokens here:
    // gpt_update all-reduces them once per step, after every micro-step's backward has added its part)
}

// The payload of a training step's collectives over the TP group, by kind (as comm.cuh counts it: an
// all-reduce of n floats counts n, a reduce-scatter or all-gather of a whole tensor of n counts n), for
// A micro-batches of (B, T) per step (-d; 1 without accumulation). X = B*T*C.
//   TP: all-reduce A ((4L+2) X + 3 B T) + 1: per micro-batch, per layer 2 forward (attproj, fcproj) and 2
//       backward (fc, qkv), the embedding and the LM head, the loss's max and two sums; once per step
//       the gradient norm.
//   SP: the 4L+2 all-reduces of X become a reduce-scatter and an all-gather each (the same bytes on a
//       ring), plus 2L all-gathers of X that re-gather the layernorm outputs in the backward, plus, once
//       per step, the all-reduce of the replicated parameters' gradients, T C + 4 L C + 2 C:
//       reduce-scatter A (4L+2) X, all-gather A (6L+2) X, all-reduce A 3 B T + 1 + T C + 4 L C + 2 C.
//   SP in bf16 (bf16: --dtype bf16, and sp_wire_bf16): the all-gathers of bf16 values, all but the
//       embedding's gradient, move as bf16, two to a 32-bit word: all-gather A ((6L+1) X / 2 + X) words.
static void step_comm_floats(const GPTConfig* c, int B, int T, bool split, int A, bool bf16, double out[COMM_KINDS]) {
    double L = c->L, C = c->C, BT = (double)B * T, X = BT * C;
    for (int k = 0; k < COMM_KINDS; k++) out[k] = 0;
    if (!split) {
        out[KIND_ALLREDUCE] = A * ((4 * L + 2) * X + 3 * BT) + 1;
    } else {
        out[KIND_REDUCESCATTER] = A * (4 * L + 2) * X;
        out[KIND_ALLGATHER] = sp_wire_bf16(c, bf16) ? A * ((6 * L + 1) * X / 2 + X) : A * (6 * L + 2) * X;
        out[KIND_ALLREDUCE] = A * 3 * BT + 1 + T * C + 4 * L * C + 2 * C;
    }
}

// AdamW's settings for one step
struct AdamW {
    float lr, beta1, beta2, eps;
    float wd;    // decoupled weight decay of the matrices
    float clip;  // global gradient-norm clipping (0: off)
};

// which tensors get weight decay: the matrices (wte, wpe, qkvw, attprojw, fcw, fcprojw), not the
// layernorm weights or the biases
static bool param_decays(int i) { return i == 0 || i == 1 || i == 4 || i == 6 || i == 10 || i == 12; }

// The gradient collectives of a step sum fp32 words. In a bf16 run the gradients go to gstage as fp32 first,
// gstage_n floats at a time (grad_to_fp32: the matrices' bf16 widened exactly), are summed there, and come
// back (the matrices' sums rounded to nearest once). So the sum of the ranks' gradients is rounded once, to
// the same bits on every rank and for any backend (NCCL's bf16 ring would round at every hop, in an order
// of its own), for the bytes of fp32, and the stage is at most 16 MB (grad_stage_floats), not an fp32 copy
// of the gradients.

// the first element of tensor i in the rank's flat shard
static long param_offset(const ShardPlan* s, int i) {
    long off = 0;
    for (int j = 0; j < i; j++) off += shard_local_size(&s->t[j]);
    return off;
}

// elements [off, off + n) of the rank's gradients summed over group c (an all-reduce)
static void grad_allreduce(GPT* m, Rank* rk, Comm* c, long off, long n, const char* where) {
    if (m->grads_mem) return comm_allreduce(c, m->grads_mem + off, n, COMM_SUM, where, -1);
    float* stage = m->gstage;
    long step = m->gstage_n;
    if (step <= 0) fatal("rank %d: %s: no stage for a bf16 gradient sum (gpt_alloc_acts sizes it)", rk->rank, where);
    for (long j = 0; j < n; j += step) {
        long len = std::min(step, n - j);
        grad_to_fp32(m, rk, stage, off + j, len);
        comm_allreduce(c, stage, len, COMM_SUM, where, -1);
        grad_from_fp32(m, rk, stage, off + j, len);
    }
}

// ZeRO-1's reduce-scatter over the DP group: the replica's slice [slice0, slice0 + nslice) of the gradients
// summed over the replicas, in place
static void grad_reducescatter(GPT* m, Rank* rk, Comm* dp) {
    if (m->grads_mem) return comm_reducescatter(dp, m->grads_mem + m->slice0, m->grads_mem, m->nslice, "grad dp", -1);
    // a piece of every replica's slice at a time: the pieces at j of the D slices, side by side in the stage
    float* stage = m->gstage;
    int D = dp->P;
    long piece = m->gstage_n / D;
    if (piece <= 0) fatal("rank %d: grad dp: no stage for a bf16 gradient sum (gpt_alloc_acts sizes it)", rk->rank);
    for (long j = 0; j < m->nslice; j += piece) {
        long len = std::min(piece, m->nslice - j);
        for (int r = 0; r < D; r++) grad_to_fp32(m, rk, stage + r * len, r * m->nslice + j, len);
        comm_reducescatter(dp, stage + dp->rank * len, stage, len, "grad dp", -1);
        grad_from_fp32(m, rk, stage + dp->rank * len, m->slice0 + j, len);
    }
}

// One AdamW step (t counts from 1) with global-norm clipping, over the group `cm` that shards the
// parameters (the tensor-parallel group) and the rank's data-parallel group rk->dp.
//
// Data parallelism: every replica's gradient covers its own sequences, each position's loss seeded with
// 1/(tokens of the global batch) (dloss), so the sum over the replicas is the gradient of the global
// batch. Without ZeRO one all-reduce of the rank's whole flat shard gradient gives every replica that
// sum; it is a single buffer, so one collective is the fewest messages (buckets would only pay off by
// overlapping with a backward still running, and the backward here finishes first). With ZeRO-1 a
// reduce-scatter gives replica d only its slice of the sum, the rank updates that slice with its slice of
// m and v, and an all-gather hands every replica the updated parameters: the same bytes as the
// all-reduce (a ring all-reduce is a reduce-scatter then an all-gather) and 1/D of the optimizer state.
//
// The norm counts every parameter once, after the average: the squares of sharded tensors are summed over
// the TP group's ranks (an all-reduce of one float); replicated tensors are identical on every TP rank
// and counted locally; with ZeRO-1 the slices' squares are first summed over the DP group.
static void gpt_update(GPT* m, Rank* rk, Comm* cm, const AdamW* opt) {
    m->t++;
    Comm* dp = &rk->dp;
    // The one collective SP adds (its second extra cost). The layernorms and wpe worked on this rank's
    // tokens only, so their gradients are partial sums over the ranks' tokens: all-reduce them (wpe only
    // over the T rows a batch uses; each layernorm's weight and bias are adjacent in memory), once per
    // step, after the micro-steps' backwards have accumulated their parts (a sum of sums). The
    // row-parallel biases need nothing: their gradients came from the all-gathered gradient of every token.
    const ShardPlan* s = &m->plan;
    if (m->split) {  // (a pipeline stage sums the ones it holds: wpe on the first stage, lnf on the last)
        long L = s->L, C = m->cfg.C;
        if (s->first) grad_allreduce(m, rk, cm, param_offset(s, PARAM_INDEX(wpe)), (long)m->T * C, "wpe grad");
        grad_allreduce(m, rk, cm, param_offset(s, PARAM_INDEX(ln1w)), 2L * L * C, "ln1 grads");
        grad_allreduce(m, rk, cm, param_offset(s, PARAM_INDEX(ln2w)), 2L * L * C, "ln2 grads");
        if (s->last) grad_allreduce(m, rk, cm, param_offset(s, PARAM_INDEX(lnfw)), 2L * C, "lnf grads");
    }
    // The one collective pipeline parallelism adds. wte is tied: the first stage looks tokens up in it,
    // the last stage's LM head multiplies by it, and each stage's gradient covers only its own use. The
    // gradient of the tied weight is the sum of the two: an all-reduce between the two stages (the same TP
    // rank, so the same vocab rows), once per step after every micro-batch, as Megatron does. Both then
    // apply the same update to the same values and keep identical copies.
    if (rk->S > 1 && (s->first || s->last))
        grad_allreduce(m, rk, &rk->emb, 0, shard_local_size(&s->t[0]), "wte grad (tied, first + last stage)");
    if (dp->P > 1 && !m->zero) grad_allreduce(m, rk, dp, 0, m->nparams, "grad dp");
    if (dp->P > 1 && m->zero) grad_reducescatter(m, rk, dp);
    // the part [lo, hi) of the flat shard this rank updates, cut by the tensors (each has its own decay)
    long lo = m->slice0, hi = m->slice0 + m->nslice, off = 0;
    long a[NUM_PARAM_TENSORS], b[NUM_PARAM_TENSORS], t0[NUM_PARAM_TENSORS];
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        long n = shard_local_size(&m->plan.t[i]);
        a[i] = std::max(lo, off);
        b[i] = std::min(hi, off + n);
        t0[i] = off;
        off += n;
    }
    // element k (of the flat shard) of tensor i's fp32 gradient: grads_mem's, or a bf16 run's vector's
    float** vec = (float**)&m->grads;
    auto grad_at = [&](int i, long k) { return m->grads_mem ? m->grads_mem + k : vec[i] + (k - t0[i]); };
    dev_zero(rk, m->norm2, 2);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        bool grad_bf16 = m->gbf_mem && param_is_matrix(i);  // (a bf16 run's matrices)
        bool counted = i != 0 || s->first;  // the tied wte once, on the first stage
        if (b[i] > a[i] && counted) {
            float* norm2 = m->norm2 + (s->t[i].split == SPLIT_NONE ? 1 : 0);
            if (grad_bf16) OP(rk, sumsq, norm2, (const ::bf16*)m->gbf_mem + a[i], b[i] - a[i]);
            else OP(rk, sumsq, norm2, (const float*)grad_at(i, a[i]), b[i] - a[i]);
        }
    }
    if (dp->P > 1 && m->zero) comm_allreduce(dp, m->norm2, 2, COMM_SUM, "grad norm dp", -1);
    comm_allreduce(cm, m->norm2, 1, COMM_SUM, "grad norm", -1);
    // every stage holds other parameters: the norm is the sum of the stages' squares
    if (rk->S > 1) comm_allreduce(&rk->pp, m->norm2, 2, COMM_SUM, "grad norm pp", -1);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        if (b[i] <= a[i]) continue;
        bool grad_bf16 = m->gbf_mem && param_is_matrix(i);
        float wd = param_decays(i) ? opt->wd : 0.0f, *mm = m->m_mem + (a[i] - lo), *vv = m->v_mem + (a[i] - lo);
        if (grad_bf16)
            OP(rk, adamw, m->params_mem + a[i], (const ::bf16*)m->gbf_mem + a[i], mm, vv, b[i] - a[i], opt->lr, opt->beta1,
               opt->beta2, opt->eps, wd, m->t, m->norm2, opt->clip);
        else
            OP(rk, adamw, m->params_mem + a[i], (const float*)grad_at(i, a[i]), mm, vv, b[i] - a[i], opt->lr, opt->beta1,
               opt->beta2, opt->eps, wd, m->t, m->norm2, opt->clip);
    }
    if (dp->P > 1 && m->zero && bf16_storage(m->bf16)) {
        // ZeRO-1 in bf16: the layers read the bf16 copy, so that is what the replicas exchange. This replica
        // rounds its slice (the bits any replica would round, being keyed on the full index), and the
        // all-gather moves the slices as bf16: half the bytes of gathering the fp32 masters. The masters
        // stay split like m and v, until a checkpoint gathers them (gpt_gather_masters).
        gpt_round_weights(m, rk, lo, hi);
        comm_allgather_bf16(dp, m->wbf_mem, m->wbf_mem + lo, m->nslice, "params dp", -1);
        gpt_widen_vectors(m, rk);
        m->masters_partial = true;
        return;
    }
    if (dp->P > 1 && m->zero) comm_allgather(dp, m->params_mem, m->params_mem + m->slice0, m->nslice, "params dp", -1);
    m->wbf_stale = m->bf16;  // the next forward rounds the bf16 weights from the new masters
}

// A checksum of this rank's parameters (FNV-1a over their bits). Replicas must hold bit-identical weights,
// so TP rank r's checksum is the same in every replica; tp.cu compares them. With the masters split over
// the replicas (ZeRO-1 in bf16) the weights all of them hold are the bf16 copy.
static uint64_t gpt_checksum(GPT* m, Rank* rk) {
    std::vector<uint32_t> w(m->nparams);  // (the bf16 copy fills the first half, the rest zero)
    if (m->masters_partial) dev_download(rk, w.data(), m->wbf_mem, m->nparams * sizeof(::bf16));
    else dev_download(rk, w.data(), m->params_mem, m->nparams * sizeof(float));
    uint64_t h = 1469598103934665603ull;
    for (uint32_t x : w) h = (h ^ x) * 1099511628211ull;
    return h;
}

// The logits of position (b, t) of the last forward, over the whole padded vocab, on every rank:
// an all-gather of the ranks' vocab slices. Only sampling does this, one row at a time; training
// never assembles full logits. out: host memory, Vp floats.
static void gpt_logits_row(GPT* m, Rank* rk, int b, int t, float* out) {
    int Vl = m->plan.Vl;
    if (!m->row) m->row = dev_alloc(rk, (long)m->cfg.Vp + Vl);
    long at = ((long)b * m->T + t) * Vl;
    float* mine = m->acts.logits + at;
    if (m->acts_bf16) {  // the row widened (exactly) past the gathered ones
        mine = m->row + m->cfg.Vp;
        OP(rk, bf16_widen, mine, as_bf16(m->acts.logits) + at, Vl);
    }
    comm_allgather(&rk->tp, m->row, mine, Vl, "sample logits", -1);
    dev_download(rk, out, m->row, (size_t)m->cfg.Vp * sizeof(float));
}

static float gpt_read_norm(GPT* m, Rank* rk) {
    float n2[2];
    dev_download(rk, n2, m->norm2, sizeof(n2));
    return sqrtf(n2[0] + n2[1]);
}

// ----------------------------------------------------------------------------
// full models in host memory: random init from a descriptor, llm.c checkpoints

// a small deterministic generator, the same on every platform: splitmix64 and Box-Muller
struct Rng {
    uint64_t s;
};
static uint64_t rng_u64(Rng* r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double rng_uniform(Rng* r) { return ((rng_u64(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }  // (0, 1)
static double rng_normal(Rng* r) {
    double u1 = rng_uniform(r), u2 = rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

// Fills full (gpt_num_params floats) with GPT-2's initialization, drawn tensor by tensor in llm.c's order
// from one seeded generator: N(0, 0.02) for the matrices, N(0, 0.02/sqrt(2L)) for the two projections
// into the residual stream, ones for layernorm weights, zeros for biases and for the padded wte rows.
// The same for every TP degree: each rank then slices its shard out of the same full tensors.
static void gpt_init_full(const GPTConfig* c, uint64_t seed, float* full) {
    ShardPlan s;
    shard_plan_init(&s, c, 1, 0);
    Rng rng = {seed};
    float* p = full;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        const TensorShard* t = &s.t[i];
        long n = shard_full_size(t);
        bool is_matrix = t->cols > 1 || i == 1;
        bool is_lnw = i == 2 || i == 8 || i == 14;
        float std = (i == 6 || i == 12) ? 0.02f / sqrtf(2.0f * c->L) : 0.02f;
        for (long j = 0; j < n; j++) {
            if (is_matrix) p[j] = (float)(std * rng_normal(&rng));
            else p[j] = is_lnw ? 1.0f : 0.0f;
        }
        if (i == 0) memset(p + (long)c->V * c->C, 0, (size_t)(c->Vp - c->V) * c->C * sizeof(float));
        p += n;
    }
}

// a descriptor: "dN" as llm.c (d12 = GPT-2 124M: 12 layers, 768 channels, 12 heads; d24/d36/d48 are
// GPT-2 medium/large/xl), with dN for N < 12 meaning N layers, 64N channels, N heads; or any shape
// spelled out as "L<layers>C<channels>H<heads>", e.g. L3C128H4. A string that is spelled like one but
// cannot be one gets false with *why saying what is wrong (anything else: false, why left empty).
static bool gpt_descriptor(const char* s, GPTConfig* c, int V, int maxT, std::string* why = nullptr) {
    char msg[160] = "";
    int L, C, NH, len = 0;
    if (sscanf(s, "L%dC%dH%d%n", &L, &C, &NH, &len) == 3 && s[len] == '\0') {
        if (L < 1 || C < 1 || NH < 1 || L > 1000 || C > 65536)
            snprintf(msg, sizeof(msg), "layers must be 1..1000, channels 1..65536 and heads at least 1");
        else if (C % NH != 0)
            snprintf(msg, sizeof(msg), "%d channels do not split into %d heads of equal size: channels must be a multiple of the "
                     "heads (e.g. L%dC%dH%d)", C, NH, L, (C + NH - 1) / NH * NH, NH);
        if (msg[0]) {
            if (why) *why = msg;
            return false;
        }
        c->L = L; c->C = C; c->NH = NH; c->V = V; c->Vp = round_up(V, 128); c->maxT = maxT;
        return true;
    }
    if (s[0] != 'd') return false;
    char* end;
    long n = strtol(s + 1, &end, 10);
    if (*end != '\0' || end == s + 1) return false;
    c->L = (int)n;
    if (n == 24) { c->C = 1024; c->NH = 16; }
    else if (n == 36) { c->C = 1280; c->NH = 20; }
    else if (n == 48) { c->C = 1600; c->NH = 25; }
    else if (n >= 1 && n <= 12) { c->C = 64 * (int)n; c->NH = (int)n; }
    else {
        if (why) *why = "not a GPT-2 size: the dN descriptors are d1..d12, d24, d36 and d48 (or spell a shape out as L<layers>C<channels>H<heads>)";
        return false;
    }
    c->V = V;
    c->Vp = round_up(V, 128);
    c->maxT = maxT;
    return true;
}
