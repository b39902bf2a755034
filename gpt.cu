// gpt.cu: the model. GPT-2 as llm.c builds it, split across P ranks Megatron-style: the config, the
// shard plan, the parameters, and the forward pass, backward pass and AdamW update of one rank.
//
// This file is the tensor-parallel recipe, written once. It calls ops (layernorm_forward, matmul_backward,
// ...) that exist for the CPU (kernels_cpu.h) and for CUDA (kernels.cuh) with the same signatures, and
// collectives from comm.cuh. Every collective of a training step is in gpt_forward and gpt_backward
// below, each with a comment saying which Megatron operator it is and why the sum is needed there:
//   forward:  embedding all-reduce, per layer attproj and fcproj all-reduces (g), loss max + sums
//   backward: lm-head all-reduce, per layer fc and qkv input-gradient all-reduces (f)
// That is (4L + 2) B T C floats per step, plus 3 B T for the loss and 1 for the gradient norm.
#pragma once
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <unistd.h>
#include "comm.cuh"
#include "kernels_cpu.h"
#include "kernels.cuh"

// ----------------------------------------------------------------------------
// errors: one clear line on stderr and a non-zero exit. Ranks are threads, so exit the whole process.

static void fatal(const char* fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fatal(const char* fmt, ...) {
    fatal_begin();
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fflush(stderr);
    _Exit(1);
}

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

// one tensor kind; stacked per-layer tensors (L, rows, cols) have nl = L. Vectors have cols = 1.
struct TensorShard {
    const char* name;
    int split;
    int nl;
    long rows, cols;    // full shape of one layer's tensor
    long lrows, lcols;  // this rank's shape
    const char* how;    // the split in words, for the printed plan
};

struct ShardPlan {
    int P, rank;
    int NHl, Cl, C4l, Vl, v0;  // local heads, local head channels, local MLP width, local vocab rows, first vocab row
    TensorShard t[NUM_PARAM_TENSORS];
};

static void shard_plan_init(ShardPlan* s, const GPTConfig* c, int P, int rank) {
    int C = c->C, L = c->L;
    s->P = P;
    s->rank = rank;
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
        t->nl = d[i].nl;
        t->rows = d[i].rows;
        t->cols = d[i].cols;
        t->how = d[i].how;
        t->lrows = t->split == SPLIT_ROWS || t->split == SPLIT_QKV ? t->rows / P : t->rows;
        t->lcols = t->split == SPLIT_COLS ? t->cols / P : t->cols;
    }
}

static long shard_full_size(const TensorShard* t) { return t->nl * t->rows * t->cols; }
static long shard_local_size(const TensorShard* t) { return t->nl * t->lrows * t->lcols; }

// Copies between a full tensor (all layers) and this rank's shard of it, in either direction.
// Local row lr of one layer comes from full row:
//   rows: rank*lrows + lr;  qkv: the same within each of the q, k, v thirds;  cols and none: lr;
// and its columns start at rank*lcols for a column split, else 0.
static void shard_copy(const TensorShard* t, int rank, float* full, float* local, bool to_local) {
    long third = t->lrows / 3;  // used by the qkv split only
    for (int l = 0; l < t->nl; l++)
        for (long lr = 0; lr < t->lrows; lr++) {
            long fr = lr;
            if (t->split == SPLIT_ROWS) fr = rank * t->lrows + lr;
            if (t->split == SPLIT_QKV) fr = (lr / third) * (t->rows / 3) + rank * third + lr % third;
            long c0 = t->split == SPLIT_COLS ? rank * t->lcols : 0;
            float* f = full + (l * t->rows + fr) * t->cols + c0;
            float* p = local + (l * t->lrows + lr) * t->lcols;
            if (to_local) memcpy(p, f, t->lcols * sizeof(float));
            else memcpy(f, p, t->lcols * sizeof(float));
        }
}

// ----------------------------------------------------------------------------
// a rank: one thread, its device and its communicator

enum Device { DEV_CPU, DEV_CUDA };

struct Rank {
    int rank, P;
    int device;   // DEV_CPU or DEV_CUDA
    int gpu;      // CUDA device ordinal
    int threads;  // OpenMP threads of this rank (CPU backend)
    Comm comm;
    CudaCtx cuda;  // DEV_CUDA: the rank's stream, cuBLAS handles and scratch (cuda_ctx_init in the rank's thread)
};

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
static void dev_upload(Rank* rk, void* dst, const void* src, size_t bytes) {
    if (rk->device == DEV_CUDA) cuda_upload(&rk->cuda, dst, src, bytes);
    else memcpy(dst, src, bytes);
}
// waits for the rank's queued work first; comm_sync does that with the collective timeout (NCCL)
static void dev_download(Rank* rk, void* dst, const void* src, size_t bytes) {
    if (rk->device == DEV_CUDA) {
        comm_sync(&rk->comm);
        cuda_download(&rk->cuda, dst, src, bytes);
    } else {
        memcpy(dst, src, bytes);
    }
}

// ----------------------------------------------------------------------------
// ops: one name, two backends. The recipe below calls these and never a backend directly.

#define ON_GPU(rk) ((rk)->device == DEV_CUDA)

static void encoder_forward(Rank* rk, float* out, const int* tokens, const float* wte, int v0, int Vl, int N, int C) {
    if (ON_GPU(rk)) encoder_forward_cuda(&rk->cuda, out, tokens, wte, v0, Vl, N, C);
    else encoder_forward_cpu(out, tokens, wte, v0, Vl, N, C);
}
static void position_forward(Rank* rk, float* x, const float* wpe, int B, int T, int C) {
    if (ON_GPU(rk)) position_forward_cuda(&rk->cuda, x, wpe, B, T, C);
    else position_forward_cpu(x, wpe, B, T, C);
}
static void encoder_backward(Rank* rk, float* dwte, float* dwpe, const float* dout, const int* tokens, int v0, int Vl, int B, int T, int C) {
    if (ON_GPU(rk)) encoder_backward_cuda(&rk->cuda, dwte, dwpe, dout, tokens, v0, Vl, B, T, C);
    else encoder_backward_cpu(dwte, dwpe, dout, tokens, v0, Vl, B, T, C);
}
static void layernorm_forward(Rank* rk, float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N, int C) {
    if (ON_GPU(rk)) layernorm_forward_cuda(&rk->cuda, out, mean, rstd, inp, w, b, N, C);
    else layernorm_forward_cpu(out, mean, rstd, inp, w, b, N, C);
}
static void layernorm_backward(Rank* rk, float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                               const float* mean, const float* rstd, int N, int C) {
    if (ON_GPU(rk)) layernorm_backward_cuda(&rk->cuda, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    else layernorm_backward_cpu(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}
static void matmul_forward(Rank* rk, float* out, const float* inp, const float* w, const float* bias, int N, int IC, int OC) {
    if (ON_GPU(rk)) matmul_forward_cuda(&rk->cuda, out, inp, w, bias, N, IC, OC);
    else matmul_forward_cpu(out, inp, w, bias, N, IC, OC);
}
static void matmul_backward(Rank* rk, float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                            int N, int IC, int OC) {
    if (ON_GPU(rk)) matmul_backward_cuda(&rk->cuda, dinp, dw, dbias, dout, inp, w, N, IC, OC);
    else matmul_backward_cpu(dinp, dw, dbias, dout, inp, w, N, IC, OC);
}
static void residual_forward(Rank* rk, float* out, const float* res, const float* x, const float* bias, int N, int C) {
    if (ON_GPU(rk)) residual_forward_cuda(&rk->cuda, out, res, x, bias, N, C);
    else residual_forward_cpu(out, res, x, bias, N, C);
}
static void gelu_forward(Rank* rk, float* out, const float* inp, long N) {
    if (ON_GPU(rk)) gelu_forward_cuda(&rk->cuda, out, inp, N);
    else gelu_forward_cpu(out, inp, N);
}
static void gelu_backward(Rank* rk, float* dinp, const float* inp, const float* dout, long N) {
    if (ON_GPU(rk)) gelu_backward_cuda(&rk->cuda, dinp, inp, dout, N);
    else gelu_backward_cpu(dinp, inp, dout, N);
}
static void attention_forward(Rank* rk, float* out, float* att, const float* qkv, int B, int T, int NH, int hs) {
    if (ON_GPU(rk)) attention_forward_cuda(&rk->cuda, out, att, qkv, B, T, NH, hs);
    else attention_forward_cpu(out, att, qkv, B, T, NH, hs);
}
static void attention_backward(Rank* rk, float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int NH, int hs) {
    if (ON_GPU(rk)) attention_backward_cuda(&rk->cuda, dqkv, dout, qkv, att, B, T, NH, hs);
    else attention_backward_cpu(dqkv, dout, qkv, att, B, T, NH, hs);
}
static void crossentropy_max(Rank* rk, float* maxes, const float* logits, int N, int Vl, int v0, int V) {
    if (ON_GPU(rk)) crossentropy_max_cuda(&rk->cuda, maxes, logits, N, Vl, v0, V);
    else crossentropy_max_cpu(maxes, logits, N, Vl, v0, V);
}
static void crossentropy_sums(Rank* rk, float* sums, const float* logits, const float* maxes, const int* targets, int N, int Vl, int v0, int V) {
    if (ON_GPU(rk)) crossentropy_sums_cuda(&rk->cuda, sums, logits, maxes, targets, N, Vl, v0, V);
    else crossentropy_sums_cpu(sums, logits, maxes, targets, N, Vl, v0, V);
}
static void crossentropy_finish(Rank* rk, float* losses, float* logits, const float* maxes, const float* sums, const int* targets,
                                int N, int Vl, int v0, int V, float dscale) {
    if (ON_GPU(rk)) crossentropy_finish_cuda(&rk->cuda, losses, logits, maxes, sums, targets, N, Vl, v0, V, dscale);
    else crossentropy_finish_cpu(losses, logits, maxes, sums, targets, N, Vl, v0, V, dscale);
}
// norm2 (1) += sum of squares of x (n)
static void sumsq(Rank* rk, float* norm2, const float* x, long n) {
    if (ON_GPU(rk)) sumsq_cuda(&rk->cuda, norm2, x, n);
    else norm2[0] += (float)sumsq_cpu(x, n);
}
// AdamW on one tensor; norm2 (2) holds the squared gradient norm as [sharded part, replicated part],
// from which the clipping scale is derived on the backend (no host round trip on a GPU)
static void adamw(Rank* rk, float* p, const float* g, float* m, float* v, long n, float lr, float beta1, float beta2,
                  float eps, float wd, int t, const float* norm2, float clip) {
    if (ON_GPU(rk)) {
        adamw_cuda(&rk->cuda, p, g, m, v, n, lr, beta1, beta2, eps, wd, t, norm2, clip);
        return;
    }
    float norm = sqrtf(norm2[0] + norm2[1]);
    float scale = clip > 0.0f && norm > clip ? clip / norm : 1.0f;
    adamw_cpu(p, g, m, v, n, lr, beta1, beta2, eps, wd, t, scale);
}

// ----------------------------------------------------------------------------
// the model of one rank

// the 16 tensors of one rank, in llm.c's order; a struct of pointers into one allocation
struct Params {
    float *wte, *wpe, *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;
    float *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb, *lnfw, *lnfb;
};

static void params_point(Params* p, float* mem, const ShardPlan* s) {
    float** ptrs = (float**)p;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        ptrs[i] = mem;
        mem += shard_local_size(&s->t[i]);
    }
}

// activations of one rank for one (B, T); Cl, C4l, Vl are the rank's local widths
struct Acts {
    float* encoded;                 // (B, T, C) embedding output, the first layer's residual input
    float *ln1, *ln1_mean, *ln1_rstd;  // (L, B, T, C), (L, B, T) x2
    float* qkv;                     // (L, B, T, 3 Cl) q, k, v of the local heads
    float* atty;                    // (L, B, T, Cl) attention output of the local heads
    float* att;                     // (L, B, NHl, T, T) attention probabilities
    float* residual2;               // (L, B, T, C) after the attention block
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fch_gelu;          // (L, B, T, 4 Cl) the local slice of the MLP
    float* residual3;               // (L, B, T, C) after the MLP block: the layer's output
    float *lnf, *lnf_mean, *lnf_rstd;  // (B, T, C), (B, T) x2
    float* logits;                  // (B, T, Vl) the local vocab slice; dlogits after a training forward
    float *ce_max, *ce_sums, *losses;  // (B, T), (B, T, 2), (B, T)
    float* partial;                 // (B, T, C) a row-parallel layer's partial output, summed in place
    // backward scratch
    float *dres, *dln, *datty, *dqkv, *dfch;  // (B,T,C) (B,T,C) (B,T,Cl) (B,T,3Cl) (B,T,4Cl)
};

struct GPT {
    GPTConfig cfg;
    ShardPlan plan;
    int hs;  // head size
    long nparams;  // this rank's parameter count
    float* params_mem;
    float* grads_mem;
    float *m_mem, *v_mem;  // AdamW moments
    Params params, grads;
    float* norm2;  // (2) squared gradient norm: [sharded tensors summed over ranks, replicated tensors]
    // activations, allocated for one (B, T)
    int B, T;
    float* acts_mem;
    long nacts;
    Acts acts;
    int *tokens, *targets;  // (B, T) on the rank's device
    int t;                  // AdamW steps taken
    float* row;             // (Vp) one position's gathered logits, for sampling
};

// the parameter count of the full model, as llm.c counts it
static long gpt_num_params(const GPTConfig* c) {
    ShardPlan s;
    shard_plan_init(&s, c, 1, 0);
    long n = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) n += shard_full_size(&s.t[i]);
    return n;
}

// Slices this rank's shard out of full tensors in host memory (llm.c's layout and order) into one of
// the rank's per-parameter buffers (params, m or v).
static void gpt_scatter(GPT* m, Rank* rk, const float* full, float* local_mem) {
    std::vector<float> local;
    long off = 0, loff = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        const TensorShard* t = &m->plan.t[i];
        local.resize(shard_local_size(t));
        shard_copy(t, rk->rank, (float*)full + off, local.data(), true);
        dev_upload(rk, local_mem + loff, local.data(), local.size() * sizeof(float));
        off += shard_full_size(t);
        loff += shard_local_size(t);
    }
}

// Builds rank's shard from the full parameters (host memory, llm.c's layout and order).
static void gpt_build(GPT* m, Rank* rk, const GPTConfig* cfg, const float* full) {
    memset(m, 0, sizeof(*m));
    m->cfg = *cfg;
    m->hs = cfg->C / cfg->NH;
    shard_plan_init(&m->plan, cfg, rk->P, rk->rank);
    m->nparams = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) m->nparams += shard_local_size(&m->plan.t[i]);
    m->params_mem = dev_alloc(rk, m->nparams);
    m->grads_mem = dev_alloc(rk, m->nparams);
    m->m_mem = dev_alloc(rk, m->nparams);
    m->v_mem = dev_alloc(rk, m->nparams);
    m->norm2 = dev_alloc(rk, 2);
    params_point(&m->params, m->params_mem, &m->plan);
    params_point(&m->grads, m->grads_mem, &m->plan);
    gpt_scatter(m, rk, full, m->params_mem);
}

// Writes this rank's shard of a per-rank tensor set (params, grads, m or v) into the full tensors in host
// memory. Ranks share the process, so gathering is each rank filling its own disjoint part of one host
// buffer; replicated tensors are written by rank 0 only. The caller puts a barrier after it.
static void gpt_gather(GPT* m, Rank* rk, const float* local_mem, float* full) {
    std::vector<float> local;
    long off = 0, loff = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        const TensorShard* t = &m->plan.t[i];
        long n = shard_local_size(t);
        if (t->split != SPLIT_NONE || rk->rank == 0) {
            local.resize(n);
            dev_download(rk, local.data(), local_mem + loff, n * sizeof(float));
            shard_copy(t, rk->rank, full + off, local.data(), false);
        }
        off += shard_full_size(t);
        loff += n;
    }
}

static void gpt_free(GPT* m, Rank* rk) {
    dev_free(rk, m->params_mem);
    dev_free(rk, m->grads_mem);
    dev_free(rk, m->m_mem);
    dev_free(rk, m->v_mem);
    dev_free(rk, m->norm2);
    if (m->acts_mem) dev_free(rk, m->acts_mem);
    if (m->row) dev_free(rk, m->row);
    if (m->tokens) dev_free(rk, m->tokens);
    if (m->targets) dev_free(rk, m->targets);
}

// The sizes (in floats) of the buffers of Acts for batches of (B, T), in the struct's order; returns
// how many there are. The activation memory of a rank is their sum.
#define NUM_ACTS 27
static int acts_sizes(const GPTConfig* c, const ShardPlan* s, int B, int T, long* out) {
    long L = c->L, C = c->C, BT = (long)B * T;
    // sizes in the order of the Acts struct
    long sizes[] = {
        BT * C,                                               // encoded
        L * BT * C, L * BT, L * BT,                           // ln1, mean, rstd
        L * BT * 3 * s->Cl,                                   // qkv
        L * BT * s->Cl,                                       // atty
        L * B * s->NHl * (long)T * T,                         // att
        L * BT * C,                                           // residual2
        L * BT * C, L * BT, L * BT,                           // ln2, mean, rstd
        L * BT * s->C4l, L * BT * s->C4l,                     // fch, fch_gelu
        L * BT * C,                                           // residual3
        BT * C, BT, BT,                                       // lnf, mean, rstd
        BT * s->Vl,                                           // logits
        BT, 2 * BT, BT,                                       // ce_max, ce_sums, losses
        BT * C,                                               // partial
        BT * C, BT * C, BT * s->Cl, BT * 3 * s->Cl, BT * s->C4l,  // dres, dln, datty, dqkv, dfch
    };
    const int n = sizeof(sizes) / sizeof(sizes[0]);
    static_assert(sizeof(Acts) == n * sizeof(float*) && n == NUM_ACTS, "Acts and its size table disagree");
    memcpy(out, sizes, sizeof(sizes));
    return n;
}

static long acts_floats(const GPTConfig* c, const ShardPlan* s, int B, int T) {
    long sizes[NUM_ACTS], n = 0;
    for (int i = 0, k = acts_sizes(c, s, B, T, sizes); i < k; i++) n += sizes[i];
    return n;
}

// (Re)allocates the activations for batches of (B, T).
static void gpt_alloc_acts(GPT* m, Rank* rk, int B, int T) {
    if (m->acts_mem && m->B == B && m->T == T) return;
    if (m->acts_mem) dev_free(rk, m->acts_mem);
    if (m->tokens) { dev_free(rk, m->tokens); dev_free(rk, m->targets); }
    long sizes[NUM_ACTS];
    int n = acts_sizes(&m->cfg, &m->plan, B, T, sizes);
    m->nacts = 0;
    for (int i = 0; i < n; i++) m->nacts += sizes[i];
    m->acts_mem = dev_alloc(rk, m->nacts);
    float** ptrs = (float**)&m->acts;
    float* p = m->acts_mem;
    for (int i = 0; i < n; i++) { ptrs[i] = p; p += sizes[i]; }
    m->tokens = (int*)dev_alloc(rk, (long)B * T);
    m->targets = (int*)dev_alloc(rk, (long)B * T);
    m->B = B;
    m->T = T;
}

// ----------------------------------------------------------------------------
// forward, backward, update: the TP recipe

// Forward pass of one rank on tokens (B, T) (host memory, the same on every rank).
// With targets (B, T): computes the per-position losses, identical on every rank (read them with
// gpt_read_loss). With training set, the logits buffer is overwritten by dlogits for gpt_backward.
static void gpt_forward(GPT* m, Rank* rk, const int* tokens, const int* targets, int B, int T, bool training) {
    const GPTConfig* c = &m->cfg;
    const ShardPlan* s = &m->plan;
    if (T > c->maxT) fatal("sequence length -t %d exceeds the model's maximum %d: use -t %d or less", T, c->maxT, c->maxT);
    gpt_alloc_acts(m, rk, B, T);
    Acts* a = &m->acts;
    Params* p = &m->params;
    Comm* cm = &rk->comm;
    int L = c->L, C = c->C, NHl = s->NHl, Cl = s->Cl, C4l = s->C4l, Vl = s->Vl, hs = m->hs;
    int BT = B * T;
    dev_upload(rk, m->tokens, tokens, BT * sizeof(int));
    if (targets) dev_upload(rk, m->targets, targets, BT * sizeof(int));

    // Vocab-parallel embedding: each rank holds wte rows [v0, v0+Vl) and looks up only the tokens it
    // owns, writing zeros for the rest. Summing over ranks puts every token's row in place (the other
    // ranks add exact zeros, so this is bit-identical to TP=1). Then the replicated wpe is added.
    encoder_forward(rk, a->encoded, m->tokens, p->wte, s->v0, Vl, BT, C);
    comm_allreduce(cm, a->encoded, (long)BT * C, COMM_SUM, "embedding fwd", -1);
    position_forward(rk, a->encoded, p->wpe, B, T, C);

    for (int l = 0; l < L; l++) {
        float* residual = l == 0 ? a->encoded : a->residual3 + (long)(l - 1) * BT * C;
        float* ln1 = a->ln1 + (long)l * BT * C;
        float* ln1_mean = a->ln1_mean + (long)l * BT;
        float* ln1_rstd = a->ln1_rstd + (long)l * BT;
        float* qkv = a->qkv + (long)l * BT * 3 * Cl;
        float* atty = a->atty + (long)l * BT * Cl;
        float* att = a->att + (long)l * B * NHl * T * T;
        float* residual2 = a->residual2 + (long)l * BT * C;
        float* ln2 = a->ln2 + (long)l * BT * C;
        float* ln2_mean = a->ln2_mean + (long)l * BT;
        float* ln2_rstd = a->ln2_rstd + (long)l * BT;
        float* fch = a->fch + (long)l * BT * C4l;
        float* fch_gelu = a->fch_gelu + (long)l * BT * C4l;
        float* residual3 = a->residual3 + (long)l * BT * C;

        // attention block. ln1 is replicated: every rank normalises the same residual stream.
        layernorm_forward(rk, ln1, ln1_mean, ln1_rstd, residual, p->ln1w + l * C, p->ln1b + l * C, BT, C);
        // qkv is column-parallel by head: this rank computes q, k, v of its NHl heads only
        matmul_forward(rk, qkv, ln1, p->qkvw + (long)l * 3 * Cl * C, p->qkvb + l * 3 * Cl, BT, C, 3 * Cl);
        // heads are independent, so attention needs nothing from the other ranks
        attention_forward(rk, atty, att, qkv, B, T, NHl, hs);
        // attproj is row-parallel: this rank holds the input columns of its heads, so its product is a
        // partial sum over heads. Megatron's g operator: all-reduce forward (identity backward) sums
        // the heads of all ranks into the full projection, the same on every rank.
        matmul_forward(rk, a->partial, atty, p->attprojw + (long)l * C * Cl, nullptr, BT, Cl, C);
        comm_allreduce(cm, a->partial, (long)BT * C, COMM_SUM, "attproj fwd", l);
        residual_forward(rk, residual2, residual, a->partial, p->attprojb + l * C, BT, C);  // bias once, after the sum

        // MLP block: fc is column-parallel (this rank's 4C/P hidden units), GELU is elementwise on them,
        // fcproj is row-parallel over the same units: again a partial sum, again g: all-reduce.
        layernorm_forward(rk, ln2, ln2_mean, ln2_rstd, residual2, p->ln2w + l * C, p->ln2b + l * C, BT, C);
        matmul_forward(rk, fch, ln2, p->fcw + (long)l * C4l * C, p->fcb + l * C4l, BT, C, C4l);
        gelu_forward(rk, fch_gelu, fch, (long)BT * C4l);
        matmul_forward(rk, a->partial, fch_gelu, p->fcprojw + (long)l * C * C4l, nullptr, BT, C4l, C);
        comm_allreduce(cm, a->partial, (long)BT * C, COMM_SUM, "fcproj fwd", l);
        residual_forward(rk, residual3, residual2, a->partial, p->fcprojb + l * C, BT, C);
    }

    // final layernorm (replicated), then the LM head on this rank's vocab slice: logits (B, T, Vl).
    // The full (B, T, Vp) logits never exist on one rank.
    float* last = a->residual3 + (long)(L - 1) * BT * C;
    layernorm_forward(rk, a->lnf, a->lnf_mean, a->lnf_rstd, last, p->lnfw, p->lnfb, BT, C);
    matmul_forward(rk, a->logits, a->lnf, p->wte, nullptr, BT, C, Vl);
    if (!targets) return;

    // Vocab-parallel cross-entropy. softmax needs the max and the sum of exps over the whole vocab:
    // all-reduce(max) of the local row maxima, then all-reduce(sum) of the local exp-sums and of the
    // target's logit (only its owner contributes it). After that every rank computes the same loss and
    // its own slice of dlogits.
    crossentropy_max(rk, a->ce_max, a->logits, BT, Vl, s->v0, c->V);
    comm_allreduce(cm, a->ce_max, BT, COMM_MAX, "loss max", -1);
    crossentropy_sums(rk, a->ce_sums, a->logits, a->ce_max, m->targets, BT, Vl, s->v0, c->V);
    comm_allreduce(cm, a->ce_sums, 2L * BT, COMM_SUM, "loss sums", -1);
    crossentropy_finish(rk, a->losses, a->logits, a->ce_max, a->ce_sums, m->targets, BT, Vl, s->v0, c->V,
                        training ? 1.0f / BT : 0.0f);
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

static void gpt_zero_grad(GPT* m, Rank* rk) { dev_zero(rk, m->grads_mem, m->nparams); }

// Backward pass of one rank, after gpt_forward(training = true). Accumulates into the gradients.
static void gpt_backward(GPT* m, Rank* rk) {
    const GPTConfig* c = &m->cfg;
    const ShardPlan* s = &m->plan;
    Acts* a = &m->acts;
    Params* p = &m->params;
    Params* g = &m->grads;
    Comm* cm = &rk->comm;
    int B = m->B, T = m->T, L = c->L, C = c->C, NHl = s->NHl, Cl = s->Cl, C4l = s->C4l, Vl = s->Vl, hs = m->hs;
    int BT = B * T;

    // LM head: dlnf is a partial sum over this rank's vocab slice. lnf is replicated and feeds a
    // vocab(column)-parallel matmul, so this is Megatron's f operator: identity forward, all-reduce
    // backward. Every rank then holds the same dlnf, and from here on the residual-stream gradient
    // dres is identical on every rank, which is why replicated parameters need no communication.
    matmul_backward(rk, a->dln, g->wte, nullptr, a->logits, a->lnf, p->wte, BT, C, Vl);
    comm_allreduce(cm, a->dln, (long)BT * C, COMM_SUM, "lm head bwd", -1);
    dev_zero(rk, a->dres, (long)BT * C);
    float* last = a->residual3 + (long)(L - 1) * BT * C;
    layernorm_backward(rk, a->dres, g->lnfw, g->lnfb, a->dln, last, p->lnfw, a->lnf_mean, a->lnf_rstd, BT, C);

    for (int l = L - 1; l >= 0; l--) {
        float* residual = l == 0 ? a->encoded : a->residual3 + (long)(l - 1) * BT * C;
        float* ln1 = a->ln1 + (long)l * BT * C;
        float* qkv = a->qkv + (long)l * BT * 3 * Cl;
        float* atty = a->atty + (long)l * BT * Cl;
        float* att = a->att + (long)l * B * NHl * T * T;
        float* residual2 = a->residual2 + (long)l * BT * C;
        float* ln2 = a->ln2 + (long)l * BT * C;
        float* fch = a->fch + (long)l * BT * C4l;
        float* fch_gelu = a->fch_gelu + (long)l * BT * C4l;

        // dres is d(layer output). The residual passes it straight through to the block inputs.
        // fcproj is row-parallel: its input gradient dfch is local (this rank's hidden units), so no
        // communication (g's backward is the identity). Its bias was added once after the all-reduce,
        // and its gradient, the column sum of dres, comes out the same on every rank.
        matmul_backward(rk, a->dfch, g->fcprojw + (long)l * C * C4l, g->fcprojb + l * C, a->dres, fch_gelu,
                        p->fcprojw + (long)l * C * C4l, BT, C4l, C);
        gelu_backward(rk, a->dfch, fch, a->dfch, (long)BT * C4l);
        // fc is column-parallel: its input ln2 is replicated, and each rank's dln2 covers only its
        // hidden units. f operator: all-reduce backward sums them into the full dln2.
        matmul_backward(rk, a->dln, g->fcw + (long)l * C4l * C, g->fcb + l * C4l, a->dfch, ln2,
                        p->fcw + (long)l * C4l * C, BT, C, C4l);
        comm_allreduce(cm, a->dln, (long)BT * C, COMM_SUM, "fc bwd", l);
        layernorm_backward(rk, a->dres, g->ln2w + l * C, g->ln2b + l * C, a->dln, residual2, p->ln2w + l * C,
                           a->ln2_mean + (long)l * BT, a->ln2_rstd + (long)l * BT, BT, C);

        // attention block, the same pattern: attproj row-parallel (no communication), attention on
        // local heads, qkv column-parallel with the f all-reduce of dln1.
        matmul_backward(rk, a->datty, g->attprojw + (long)l * C * Cl, g->attprojb + l * C, a->dres, atty,
                        p->attprojw + (long)l * C * Cl, BT, Cl, C);
        attention_backward(rk, a->dqkv, a->datty, qkv, att, B, T, NHl, hs);
        matmul_backward(rk, a->dln, g->qkvw + (long)l * 3 * Cl * C, g->qkvb + l * 3 * Cl, a->dqkv, ln1,
                        p->qkvw + (long)l * 3 * Cl * C, BT, C, 3 * Cl);
        comm_allreduce(cm, a->dln, (long)BT * C, COMM_SUM, "qkv bwd", l);
        layernorm_backward(rk, a->dres, g->ln1w + l * C, g->ln1b + l * C, a->dln, residual, p->ln1w + l * C,
                           a->ln1_mean + (long)l * BT, a->ln1_rstd + (long)l * BT, BT, C);
    }

    // embedding: its forward all-reduce was a g operator, so each rank's lookup receives the full dres
    // and scatters it into the wte rows it owns; wpe (replicated) gets the same sum on every rank.
    encoder_backward(rk, g->wte, g->wpe, a->dres, m->tokens, s->v0, Vl, B, T, C);
}

// which tensors get weight decay: the matrices (wte, wpe, qkvw, attprojw, fcw, fcprojw), not the
// layernorm weights or the biases
static bool param_decays(int i) { return i == 0 || i == 1 || i == 4 || i == 6 || i == 10 || i == 12; }

// One AdamW step (t counts from 1) with global-norm clipping at clip (0: off).
// The norm counts every parameter once: the squares of sharded tensors are summed over ranks (an
// all-reduce of one float); replicated tensors are identical on every rank and counted locally.
static void gpt_update(GPT* m, Rank* rk, float lr, float beta1, float beta2, float eps, float wd, float clip) {
    m->t++;
    dev_zero(rk, m->norm2, 2);
    float** grads = (float**)&m->grads;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        const TensorShard* t = &m->plan.t[i];
        sumsq(rk, m->norm2 + (t->split == SPLIT_NONE ? 1 : 0), grads[i], shard_local_size(t));
    }
    comm_allreduce(&rk->comm, m->norm2, 1, COMM_SUM, "grad norm", -1);
    float** params = (float**)&m->params;
    long off = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        long n = shard_local_size(&m->plan.t[i]);
        adamw(rk, params[i], grads[i], m->m_mem + off, m->v_mem + off, n, lr, beta1, beta2, eps,
              param_decays(i) ? wd : 0.0f, m->t, m->norm2, clip);
        off += n;
    }
}

// The logits of position (b, t) of the last forward, over the whole padded vocab, on every rank:
// an all-gather of the ranks' vocab slices. Only sampling does this, one row at a time; training
// never assembles full logits. out: host memory, Vp floats.
static void gpt_logits_row(GPT* m, Rank* rk, int b, int t, float* out) {
    int Vl = m->plan.Vl;
    if (!m->row) m->row = dev_alloc(rk, (long)m->cfg.Vp);
    float* mine = m->acts.logits + ((long)b * m->T + t) * Vl;
    comm_allgather(&rk->comm, m->row, mine, Vl, "sample logits");
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
// spelled out as "L<layers>C<channels>H<heads>", e.g. L3C128H4
static bool gpt_descriptor(const char* s, GPTConfig* c, int V, int maxT) {
    int L, C, NH, len = 0;
    if (sscanf(s, "L%dC%dH%d%n", &L, &C, &NH, &len) == 3 && s[len] == '\0') {
        if (L < 1 || C < 1 || NH < 1 || C % NH != 0 || L > 1000 || C > 65536) return false;
        c->L = L; c->C = C; c->NH = NH; c->V = V; c->Vp = round_up(V, 128); c->maxT = maxT;
        return true;
    }
    if (s[0] != 'd') return false;
    char* end;
    long n = strtol(s + 1, &end, 10);
    if (*end != '\0' || end == s + 1 || n < 1 || n > 48) return false;
    c->L = (int)n;
    if (n == 24) { c->C = 1024; c->NH = 16; }
    else if (n == 36) { c->C = 1280; c->NH = 20; }
    else if (n == 48) { c->C = 1600; c->NH = 25; }
    else if (n <= 12) { c->C = 64 * (int)n; c->NH = (int)n; }
    else return false;
    c->V = V;
    c->Vp = round_up(V, 128);
    c->maxT = maxT;
    return true;
}

// Reads an llm.c version-3 (fp32) checkpoint's header into c and its tensors into full (allocated here).
static void gpt_load_checkpoint(const char* path, GPTConfig* c, std::vector<float>* full) {
    FILE* f = fopen(path, "rb");
    if (!f) fatal("cannot open checkpoint %s: %s (give an llm.c model file or a descriptor like d12 to -e)", path, strerror(errno));
    int h[256];
    if (fread(h, sizeof(int), 256, f) != 256) fatal("checkpoint %s is shorter than its 1024-byte header: not an llm.c model file", path);
    if (h[0] != 20240326) fatal("checkpoint %s has magic %d, not 20240326: not an llm.c model file", path, h[0]);
    if (h[1] != 3) fatal("checkpoint %s has version %d; tp reads fp32 version 3 (export with llm.c's fp32 writer)", path, h[1]);
    c->maxT = h[2]; c->V = h[3]; c->L = h[4]; c->NH = h[5]; c->C = h[6]; c->Vp = h[7];
    if (c->maxT <= 0 || c->V <= 0 || c->L <= 0 || c->NH <= 0 || c->C <= 0 || c->Vp < c->V || c->C % c->NH != 0)
        fatal("checkpoint %s has an invalid header (maxT %d V %d L %d NH %d C %d Vp %d)", path, c->maxT, c->V, c->L, c->NH, c->C, c->Vp);
    long n = gpt_num_params(c);
    full->resize(n);
    size_t got = fread(full->data(), sizeof(float), n, f);
    if ((long)got != n) fatal("checkpoint %s is truncated: %zu of %ld parameters present", path, got, n);
    char extra;
    if (fread(&extra, 1, 1, f) == 1) fatal("checkpoint %s is longer than its header says (%ld parameters)", path, n);
    fclose(f);
}

// Files that must never be left half-written are written atomically: to PATH.tmp, then fsync, then
// rename over PATH. A crash at any point leaves either the old file or the new one, never half of one.
static FILE* atomic_open(const char* path, std::string* tmp) {
    *tmp = std::string(path) + ".tmp";
    FILE* f = fopen(tmp->c_str(), "wb");
    if (!f) fprintf(stderr, "error: cannot write %s: %s\n", tmp->c_str(), strerror(errno));
    return f;
}

// ok: whether every write succeeded. Flushes, syncs, closes and renames; on any failure removes the
// temporary file and says so.
static bool atomic_close(FILE* f, bool ok, const std::string& tmp, const char* path) {
    ok = fflush(f) == 0 && ok;
    ok = fsync(fileno(f)) == 0 && ok;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp.c_str(), path) != 0) {
        fprintf(stderr, "error: writing %s failed: %s\n", path, strerror(errno));
        remove(tmp.c_str());
        return false;
    }
    return true;
}

// Writes full parameters as an llm.c version-3 checkpoint, atomically.
static bool gpt_write_checkpoint(const char* path, const GPTConfig* c, const float* full) {
    std::string tmp;
    FILE* f = atomic_open(path, &tmp);
    if (!f) return false;
    int h[256] = {0};
    h[0] = 20240326; h[1] = 3; h[2] = c->maxT; h[3] = c->V; h[4] = c->L; h[5] = c->NH; h[6] = c->C; h[7] = c->Vp;
    long n = gpt_num_params(c);
    bool ok = fwrite(h, sizeof(int), 256, f) == 256 && (long)fwrite(full, sizeof(float), n, f) == n;
    return atomic_close(f, ok, tmp, path);
}
