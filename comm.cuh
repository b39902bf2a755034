// comm.cuh: the collectives one rank calls. Every byte that crosses between ranks goes through here.
//
// The calls (declared first below): comm_allreduce (sum or max), comm_reducescatter, comm_allgather,
// comm_barrier, and comm_sync, which waits for the rank's queued collectives. Three backends, set per rank
// at setup; the recipe in gpt.cu never knows which one runs:
//   COMM_HOST  shared memory, buffers in host memory: ranks on the CPU. comm_init alone.
//   COMM_CUDA  shared memory, buffers in device memory: ranks that share a GPU (NCCL refuses two ranks on
//              one GPU). comm_init, then comm_bind_cuda. A CUDA kernel reads the P ranks' device pointers
//              directly (one process, one device or devices with peer access).
//   COMM_NCCL  NCCL, one communicator per rank on distinct GPUs, created together: comm_nccl_init_all (or
//              comm_nccl_init_procs across processes) once, then comm_init and comm_bind_cuda per rank.
//              Collectives are enqueued on the rank's stream and the host moves on; comm_sync waits for
//              them, polling, within the timeout.
// The two shared-memory backends run one protocol, written once (shm_allreduce ... below): each rank
// publishes a pointer to its buffer, and the ranks reduce each other's buffers directly, summing in rank
// order 0, 1, ..., P-1, so that the result is deterministic and bit-identical on every rank, on the CPU
// and on the GPU alike.
//
// Because all ranks of a group live in one process, the group also sees every rank's sequence of
// collectives: each call carries its op, its count and its place in the model, a mismatch between ranks
// is reported instead of computing garbage, and a rank that waits longer than the timeout reports where
// every rank is instead of hanging forever (the classic TP failure: one rank skips a collective).
//
// A group may span processes (data parallelism across machines, started by mpirun): it is then P ranks in
// each of N processes, and rank r of process p is the group's rank p*P + r. Inside a process the ranks
// still meet in shared memory; between processes MPI carries the host backend's collectives and NCCL the
// GPU ones. That layer, the processes of the job and their exchanges, is common/comm_mpi.h; MPI is
// optional at build time (make finds mpicxx and defines TP_MPI), and without it every group lives in one
// process.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <list>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <unistd.h>
#include <cuda_runtime.h>
#include <nccl.h>
#ifdef TP_MPI
#include <mpi.h>
#endif
#include "common/error.h"

#define COMM_MAXP 64
#define COMM_LOG 1024    // COMM_NCCL: per rank, the last collectives kept for the cross-rank sequence check
#define COMM_EVENTS 256  // COMM_NCCL: per rank, collectives that may be in flight between two waits

// what a collective does; COMM_SUM and COMM_MAX are the two all-reduces
enum CommOp { COMM_SUM, COMM_MAX, COMM_SCATTER, COMM_GATHER, COMM_BARRIER };
static const char* comm_op_name(int op) {
    static const char* names[] = {"all-reduce(sum)", "all-reduce(max)", "reduce-scatter(sum)", "all-gather", "barrier"};
    return names[op];
}

// where a rank computes: its buffers are in host memory (the CPU backend) or on its GPU
enum Device { DEV_CPU, DEV_CUDA };

enum CommBackend { COMM_HOST, COMM_CUDA, COMM_NCCL };

// The kinds of collective that move data, for the accounting. The payload of each, in 32-bit words (a
// float each; comm_allgather_bf16 moves two bf16 in a word): an all-reduce of n counts n, a reduce-scatter
// of P*n inputs P*n, an all-gather of n per rank P*n.
enum CommKind { KIND_ALLREDUCE, KIND_REDUCESCATTER, KIND_ALLGATHER, COMM_KINDS };

// The bytes one rank sends for `floats` of payload of a kind, as a ring algorithm (what NCCL runs
// between GPUs) sends them over P ranks: an all-reduce of n floats is a reduce-scatter then an
// all-gather, each sending (P-1)/P of the data. One rank sends nothing.
static double comm_ring_bytes(int kind, double floats, int P) {
    double f = (double)(P - 1) / P;
    return 4.0 * floats * (kind == KIND_ALLREDUCE ? 2.0 * f : f);
}

struct CommCall {
    int op;
    long count;         // 32-bit words (floats, or pairs of bf16 where bf16)
    bool bf16;          // the words carry bf16 values (comm_allgather_bf16)
    const char* where;  // a static string naming the place in the model, e.g. "attproj fwd"
    int layer;          // -1 when not inside a layer
    long seq;           // how many collectives this rank has issued before this one
    const float* ptr;   // the rank's buffer (input side)
};

// one point-to-point message in flight: a copy of the sender's buffer, and what it is (on NCCL the data
// goes from GPU to GPU, and the message carries only what it is: n floats)
struct CommMsg {
    std::vector<float> data;
    long n;
    const char* where;
    int tag;
};

// COMM_NCCL point to point: each rank of a group with point to point (comm_nccl_init_p2p) shares four
// 2-rank communicators with its neighbours, one per direction and role, so that each carries messages one
// way only, in the order both sides issue them, and one kind of call per rank: a send and a receive of
// one communicator can never wait for each other in the wrong order.
enum { P2P_TO_NEXT, P2P_FROM_PREV, P2P_TO_PREV, P2P_FROM_NEXT, P2P_COMMS };

// a send's copy of the sender's buffer on its device, kept until NCCL has sent it
struct CommP2pBuf {
    float* buf;
    long cap;          // floats
    cudaEvent_t sent;  // recorded on the send stream after the send
    bool busy;
};

#ifdef TP_MPI
// A point-to-point message to a rank in another process (common/comm_mpi.h): its header, which the
// receiver checks, and the copy of its data, kept until MPI has sent both.
struct CommWireMsg {
    int32_t tag;
    int64_t n;
    char where[48];
};
struct CommMpiSend {
    int dst;  // the receiving rank of the group
    CommWireMsg head;
    std::vector<float> data;
    MPI_Request req[2];
};
#endif

// A part of a full host tensor set (offset and length in floats): what one process's ranks hold when a
// replica's pipeline stages are spread over processes (comm_procs_collect)
struct CommSpan {
    long off, n;
};

// shared by the P ranks of a group that live in this process
struct CommGroup {
    char label[48];   // what the group is, for the messages, e.g. "stage 1" (empty: nothing to add)
    int P;            // ranks in this process
    int nproc, proc;  // processes the group spans, and this one's index (1 and 0: one process)
    double timeout_s;
    std::mutex mu;
    std::condition_variable cv;
    int arrived;
    long generation;
    CommCall call[COMM_MAXP];
    bool waiting[COMM_MAXP];
    const float* slice[COMM_MAXP];        // the shared-memory protocol: rank r's reduced slice, once published
    std::vector<float> chunk[COMM_MAXP];  // COMM_HOST: the storage of rank r's slice
    int gpu[COMM_MAXP];                   // COMM_CUDA: rank r's device, once bound (-1 before)
    // COMM_NCCL
    ncclComm_t nccl[COMM_MAXP];  // one communicator per rank, created together by comm_nccl_init_all
    ncclComm_t p2p[COMM_MAXP][P2P_COMMS];  // point to point with the neighbours, by comm_nccl_init_p2p (or none)
    std::vector<CommCall> log;   // (P, COMM_LOG): rank r's collective #s at [r * COMM_LOG + s % COMM_LOG]
    long posted[COMM_MAXP];      // how many collectives rank r has logged
    // across processes (host backend): this process's partial result and what the others sent
    std::vector<float> xsend, xrecv;
    // point-to-point (comm_send, comm_recv): the messages rank i sent rank j and j has not received yet,
    // in order, in box[i * P + j] (sized on the first send)
    std::vector<std::deque<CommMsg>> box;
#ifdef TP_MPI
    MPI_Comm mpi;  // the group's own communicator over the processes it spans
    std::vector<std::list<CommMpiSend>> mpi_sent;  // (P) rank r's sends to other processes still in flight
#endif
};

// one rank's handle, with its counters
struct Comm {
    CommGroup* g;
    int rank, P;  // in the whole group, across processes
    int local;    // among the group's ranks in this process (the index into the group's per-rank arrays)
    long seq;
    double moved[COMM_KINDS];  // 32-bit words moved through collectives (the payload, counted once per collective), by kind
    bool next_bf16;            // the next collective is comm_allgather_bf16's (comm_begin marks its call)
    int tp_rank;         // a pipeline group's rank: its TP rank in its stage, for the messages (-1: not one)
    double p2p_sent;     // floats this rank sent point to point (comm_send)
    double p2p_seconds;  // time spent in comm_recv waiting for a message: a pipeline stage's idle time
    double seconds;  // time spent inside collectives, waiting for other ranks included. COMM_CUDA: wall
                     // time after the rank's own GPU work is done. COMM_NCCL: GPU time between events
                     // around each collective, counted once a later collective or comm_sync sees it done.
    int backend;           // CommBackend
    int gpu;               // the rank's CUDA device (-1: host)
    cudaStream_t stream;   // the rank's stream: collectives are ordered with its kernels
    ncclComm_t nccl;       // COMM_NCCL
    float* dchunk;         // COMM_CUDA: this rank's reduced slice (device memory, grown on demand)
    long dchunk_n;
    // COMM_NCCL: a ring of events around the collectives in flight, to time them and to name the one
    // that does not complete. Collective number i (counting from 0) uses slot i % COMM_EVENTS.
    cudaEvent_t ev_start[COMM_EVENTS], ev_end[COMM_EVENTS];
    CommCall ev_call[COMM_EVENTS];
    long ev_issued, ev_done;  // collectives enqueued; collectives seen complete (a prefix)
    // a started collective (comm_allreduce_start): GPU backends only
    cudaStream_t side;              // the communication stream
    cudaEvent_t ev_ready, ev_sum;   // on `stream`: the input is written; on `side`: the result is
    bool started;                   // a collective is started and not yet finished
    CommCall start_call;            // what it is (op, count, where, layer)
    float* start_out;               // its output buffer (the all-reduce's buffer)
    const float* start_in;          // its input (the reduce-scatter's)
    // COMM_NCCL point to point: the communicators with the neighbours ([P2P_TO_NEXT] ...), a send stream
    // per direction (to the next rank, to the previous), the copies sent from, and the events that order a
    // copy before its send and time a receive on the GPU
    ncclComm_t p2p[P2P_COMMS];
    cudaStream_t p2p_stream[2];
    std::vector<CommP2pBuf>* p2p_bufs;  // (a pointer: a Comm is plain data, set with memset before comm_init)
    cudaEvent_t p2p_copied, p2p_t0, p2p_t1;
};

// ----------------------------------------------------------------------------
// the calls. Buffers live where the rank's backend works: host memory for COMM_HOST, the rank's device
// memory otherwise. `where` names the place in the model (a static string) and `layer` the layer (-1:
// none), for the sequence check and the messages.

// buf (n) on every rank <- the elementwise sum (or max) of buf over ranks 0..P-1, in that order
// (COMM_NCCL: in NCCL's order, the same result on every rank)
static void comm_allreduce(Comm* c, float* buf, long n, int op, const char* where, int layer);
// in (P*n) on every rank; out (n) on rank r <- slice r (elements [r*n, (r+1)*n)) of the elementwise sum
// of in over ranks 0..P-1, in that order. out may be in + r*n (in place), as NCCL allows.
static void comm_reducescatter(Comm* c, float* out, const float* in, long n, const char* where, int layer);
// out (P*n) on every rank <- the concatenation of every rank's in (n), rank 0 first. in must not overlap
// out, except as out + rank*n (in place: the rank's own slice is already there), as NCCL allows.
static void comm_allgather(Comm* c, float* out, const float* in, long n, const char* where, int layer);
// the same for n bf16 values a rank (n even), at half the bytes: gpt.cu's sequence-parallel gathers in a
// --dtype bf16 run, whose values are bf16 already
static void comm_allgather_bf16(Comm* c, uint16_t* out, const uint16_t* in, long n, const char* where, int layer);
// The all-reduce and the reduce-scatter, started: the result may be read only after comm_finish. On a
// GPU the collective runs on the rank's communication stream after the work queued so far on its stream,
// beside the work queued next (gpt.cu's backward queues a weight gradient there), and comm_finish makes
// the rank's stream wait for it. On the host it runs at once: the rank's own thread computes the sums, so
// there is nothing to run beside. One started collective per rank at a time.
static void comm_allreduce_start(Comm* c, float* buf, long n, int op, const char* where, int layer);
static void comm_reducescatter_start(Comm* c, float* out, const float* in, long n, const char* where, int layer);
static void comm_finish(Comm* c);
// every rank arrives before any leaves; on the GPU backends the rank's queued work is finished first
static void comm_barrier(Comm* c, const char* where);
// Point to point, between two ranks of a group (pipeline parallelism's neighbouring stages): comm_send
// hands rank dst a copy of buf (n) and returns at once; comm_recv waits for the next message from rank
// src and copies it into buf (n). Messages between two ranks arrive in the order they were sent, and
// `where` and tag (the micro-batch) must match on both sides. On every backend: on NCCL, neighbours in one
// process send GPU to GPU (ncclSend, ncclRecv); other GPU ranks' buffers go through host memory (a copy
// out of the sender's device, one into the receiver's); between processes MPI carries the message
// (common/comm_mpi.h).
static void comm_send(Comm* c, int dst, const float* buf, long n, const char* where, int tag);
static void comm_recv(Comm* c, int src, float* buf, long n, const char* where, int tag);
// (comm_recv's line when the message does not come within the timeout)
[[noreturn]] static void comm_p2p_timeout(Comm* c, int src, const char* where, int tag);
// waits until everything queued on the rank's stream, collectives and kernels, is done (nothing on the host)
static void comm_sync(Comm* c);
// Setup, in this order: comm_group_init once per group (comm_group_span under mpirun, common/comm_mpi.h),
// comm_nccl_init_all for a group of ranks on distinct GPUs; then per rank, from its thread, comm_init,
// comm_bind_cuda on a GPU, and comm_free at the end.

// ----------------------------------------------------------------------------
// a group: its state, the rendezvous of its ranks in this process, the sequence check

static void comm_group_init(CommGroup* g, int P, double timeout_s) {
    if (P < 1 || P > COMM_MAXP) fatal("a group of %d ranks is out of range: the collectives support 1 to %d ranks", P, COMM_MAXP);
    g->label[0] = '\0';
    g->P = P;
    g->nproc = 1;
    g->proc = 0;
    g->timeout_s = timeout_s;
    g->arrived = 0;
    g->generation = 0;
    memset(g->call, 0, sizeof(g->call));
    memset(g->waiting, 0, sizeof(g->waiting));
    for (int r = 0; r < COMM_MAXP; r++) {
        g->slice[r] = nullptr;
        g->gpu[r] = -1;
        g->nccl[r] = nullptr;
        for (int k = 0; k < P2P_COMMS; k++) g->p2p[r][k] = nullptr;
        g->posted[r] = 0;
    }
    g->log.clear();
}

// the handle of the group's rank `local` of this process, on the host backend; comm_bind_cuda moves it
// to the GPU
static void comm_init(Comm* c, CommGroup* g, int local) {
    c->g = g;
    c->local = local;
    c->rank = g->proc * g->P + local;
    c->P = g->nproc * g->P;
    c->seq = 0;
    c->seconds = 0;
    c->p2p_sent = c->p2p_seconds = 0;
    c->tp_rank = -1;
    for (int k = 0; k < COMM_KINDS; k++) c->moved[k] = 0;
    c->next_bf16 = false;
    c->backend = COMM_HOST;
    c->gpu = -1;
    c->stream = nullptr;
    c->nccl = nullptr;
    c->dchunk = nullptr;
    c->dchunk_n = 0;
    c->ev_issued = c->ev_done = 0;
    c->side = nullptr;
    c->started = false;
    for (int k = 0; k < P2P_COMMS; k++) c->p2p[k] = nullptr;
    c->p2p_stream[0] = c->p2p_stream[1] = nullptr;
    c->p2p_bufs = nullptr;
}

// counts a collective's payload (floats) under its kind
static void comm_count(Comm* c, int op, double floats) {
    int kind = op == COMM_SCATTER ? KIND_REDUCESCATTER : op == COMM_GATHER ? KIND_ALLGATHER : KIND_ALLREDUCE;
    c->moved[kind] += floats;
}

static void comm_describe(const CommCall* k, char* buf, size_t n) {
    long count = k->bf16 ? 2 * k->count : k->count;
    const char* what = k->bf16 ? "bf16" : "floats";
    if (k->layer >= 0) snprintf(buf, n, "#%ld %s of %ld %s at %s (layer %d)", k->seq, comm_op_name(k->op), count, what, k->where, k->layer);
    else snprintf(buf, n, "#%ld %s of %ld %s at %s", k->seq, comm_op_name(k->op), count, what, k->where);
}

// Prints where every rank of the group in this process is and ends the process: the other ranks may be
// blocked for good, so there is nothing to unwind to. A mismatch or a rank that never arrives is a bug in
// the recipe, and the message says so; an error NCCL reports (a peer process that died) is not (recipe_bug
// false).
[[noreturn]] static void comm_abort(CommGroup* g, int rank, const char* why, bool recipe_bug = true) {
    fatal_begin();
    fatal_prefix();
    if (g->label[0]) fprintf(fatal_out(), "rank %d (%s): %s; the ranks' collectives:\n", rank, g->label, why);
    else fprintf(fatal_out(), "rank %d: %s; the ranks' collectives:\n", rank, why);
    for (int r = 0; r < g->P; r++) {
        char d[256];
        comm_describe(&g->call[r], d, sizeof(d));
        fprintf(fatal_out(), "  rank %d %s %s\n", g->proc * g->P + r, g->waiting[r] ? "waits in" : "last issued", d);
    }
    if (recipe_bug) {
        fatal_prefix();
        fprintf(fatal_out(), "every rank must issue the same collectives in the same order; this is a bug in the recipe\n");
    }
    fatal_end();
}

// two ranks' calls are the same collective: same op, count and place in the model
static bool comm_same(const CommCall* a, const CommCall* b) {
    return a->op == b->op && a->count == b->count && a->bf16 == b->bf16 && a->layer == b->layer && strcmp(a->where, b->where) == 0;
}

// Waits until the group's P ranks of this process arrive. The last to arrive checks that every rank is in
// the same collective. In a group that spans processes a rank may wait here while another rank of its
// process exchanges data with the other processes under the same timeout; it gives that exchange the
// time to report a missing process first.
static void comm_wait_all(Comm* c, bool check) {
    CommGroup* g = c->g;
    std::unique_lock<std::mutex> lock(g->mu);
    long gen = g->generation;
    g->waiting[c->local] = true;
    if (++g->arrived == g->P) {
        if (check) {
            for (int r = 1; r < g->P; r++)
                if (!comm_same(&g->call[0], &g->call[r]) || g->call[0].seq != g->call[r].seq)
                    comm_abort(g, c->rank, "collective mismatch");
        }
        g->arrived = 0;
        g->generation++;
        for (int r = 0; r < g->P; r++) g->waiting[r] = false;
        g->cv.notify_all();
        return;
    }
    double timeout = g->timeout_s * (g->nproc > 1 ? 2 : 1);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
    while (g->generation == gen) {
        if (g->cv.wait_until(lock, deadline) == std::cv_status::timeout && g->generation == gen) {
            char why[128];
            snprintf(why, sizeof(why), "waited %g s for the other ranks (--timeout)", timeout);
            comm_abort(g, c->rank, why);
        }
    }
}

static void comm_begin(Comm* c, int op, long count, const float* ptr, const char* where, int layer) {
    CommCall* k = &c->g->call[c->local];
    k->op = op;
    k->count = count;
    k->bf16 = c->next_bf16;
    c->next_bf16 = false;
    k->where = where;
    k->layer = layer;
    k->seq = c->seq++;
    k->ptr = ptr;
}

static double comm_now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}


// ----------------------------------------------------------------------------
// COMM_HOST and COMM_CUDA: the shared-memory protocol, written once
//
// Ranks that share an address space read each other's buffers directly. The group's rendezvous
// (comm_wait_all) publishes every rank's pointer; then an all-reduce is a reduce-scatter followed by an
// all-gather, as a ring does it: rank r of the P ranks reduces slice r of every rank's buffer, in rank
// order (so the sum is the same bits on every rank, on the host and on the GPU), and every rank ends with
// every slice. In one process rank r writes its sum straight into slice r of every rank's buffer: slice r
// of each buffer is read and written by rank r alone, so nothing races, and no slice is copied a second
// time. A reduce-scatter is the first half, an all-gather the second. The backend only decides how
// memory is touched: host loops and memcpy, or a kernel and copies on the rank's stream (shm_reduce,
// shm_copy, shm_done, shm_slice). Across processes the host backend reduces the slices into storage of
// their own (shm_reduce_slices), exchanges the process's partial result over MPI, and gathers the slices
// back (shm_gather_slices; common/comm_mpi.h).

// the sum (or max) of a and b, as every reduction of the shared-memory protocol adds them: the same
// expression on the host and the GPU, so the same bits
static inline __host__ __device__ float comm_op(int op, float a, float b) { return op == COMM_MAX ? (b > a ? b : a) : a + b; }

// Every rank's buffer (same process: valid on this device, or through peer access), and where a reduction
// writes: elements [lo, lo+len) of the inputs, reduced, go to out.p[j][i - shift] for j < nout.
struct CommPtrs {
    const float* p[COMM_MAXP];
};
struct CommOuts {
    float* p[COMM_MAXP];
    int n;
    long shift;
};
// the elementwise sum (or max) of src.p[r][lo, lo+len) over r = 0, 1, ..., P-1 in that order, into each
// output; a thread per element
__global__ void comm_reduce_kernel(CommPtrs src, int P, long lo, long len, int op, CommOuts out) {
    long i = lo + (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= lo + len) return;
    float v = src.p[0][i];
    for (int r = 1; r < P; r++) v = comm_op(op, v, src.p[r][i]);
    for (int j = 0; j < out.n; j++) out.p[j][i - out.shift] = v;
}

// elements [lo, hi) of every published buffer of the ranks in this process, summed (or maxed) in rank
// order 0, 1, ..., P-1, into each of out's outputs. On the host a block at a time: rank by rank into a
// block in the cache (each pass a vector loop; per element the adds come in the same order), then copied
// to the outputs, which may be inputs too: all of a block is read before any of it is written.
static void shm_reduce_to(Comm* c, long lo, long hi, int op, CommOuts out) {
    const CommGroup* g = c->g;
    if (hi <= lo) return;
    if (c->backend == COMM_CUDA) {
        CommPtrs src;
        for (int r = 0; r < g->P; r++) src.p[r] = g->call[r].ptr;
        comm_reduce_kernel<<<(unsigned)((hi - lo + 255) / 256), 256, 0, c->stream>>>(src, g->P, lo, hi - lo, op, out);
        CUDA_LAUNCH_CHECK(c->rank, "comm_reduce_kernel");
        return;
    }
    const long BLOCK = 2048;  // 8 KB: the block and a block of each input stay in L1
    float acc[BLOCK];
    for (long b0 = lo; b0 < hi; b0 += BLOCK) {
        const long len = hi - b0 < BLOCK ? hi - b0 : BLOCK;
        const float* p0 = g->call[0].ptr + b0;
        if (g->P == 1) {
            for (long i = 0; i < len; i++) acc[i] = p0[i];
        } else {
            const float* p1 = g->call[1].ptr + b0;
            for (long i = 0; i < len; i++) acc[i] = comm_op(op, p0[i], p1[i]);
            for (int r = 2; r < g->P; r++) {
                const float* pr = g->call[r].ptr + b0;
                for (long i = 0; i < len; i++) acc[i] = comm_op(op, acc[i], pr[i]);
            }
        }
        for (int j = 0; j < out.n; j++) memcpy(out.p[j] - out.shift + b0, acc, (size_t)len * sizeof(float));
    }
}

// out (hi - lo) <- elements [lo, hi) of every published buffer, reduced in rank order
static void shm_reduce(Comm* c, long lo, long hi, int op, float* out) {
    CommOuts o = {};
    o.p[0] = out;
    o.n = 1;
    o.shift = lo;
    shm_reduce_to(c, lo, hi, op, o);
}

// n floats from src to dst (device: any device, through peer access, queued on the rank's stream)
static void shm_copy(Comm* c, float* dst, const float* src, long n) {
    if (n <= 0) return;
    if (c->backend == COMM_CUDA) CUDA_CHECK(c->rank, cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyDefault, c->stream));
    else memcpy(dst, src, (size_t)n * sizeof(float));
}

// waits for the rank's queued work (its own kernels, and the reductions and copies above): on the GPU a
// buffer is published only once it is written, and a slice only once it is reduced
static void shm_done(Comm* c) {
    if (c->backend == COMM_CUDA) CUDA_CHECK(c->rank, cudaStreamSynchronize(c->stream));
}

// this rank's storage for its reduced slice, at least n floats. Growing it frees the old one: nobody
// reads it any more, every rank copied it before arriving at this collective.
static float* shm_slice(Comm* c, long n) {
    if (c->backend != COMM_CUDA) {
        std::vector<float>& v = c->g->chunk[c->local];
        if ((long)v.size() < n) v.resize(n);
        return v.data();
    }
    if (n > c->dchunk_n) {
        if (c->dchunk) CUDA_CHECK(c->rank, cudaFree(c->dchunk));
        c->dchunk = nullptr;
        CUDA_CHECK(c->rank, cudaMalloc((void**)&c->dchunk, (size_t)n * sizeof(float)));
        c->dchunk_n = n;
    }
    return c->dchunk;
}

// The reduce-scatter half: with every buffer published (after comm_wait_all(c, true)), rank `local`
// reduces slice [total*local/P, total*(local+1)/P) of the P buffers of this process and publishes it.
// The caller's next comm_wait_all(c, false) is the point where every slice is ready.
static void shm_reduce_slices(Comm* c, long total, int op) {
    int P = c->g->P, me = c->local;
    long lo = total * me / P, hi = total * (me + 1) / P;
    float* mine = shm_slice(c, hi - lo);
    shm_reduce(c, lo, hi, op, mine);
    shm_done(c);
    c->g->slice[me] = mine;  // published by the wait's mutex
}

// The all-gather half: dst (total) <- the P published slices, in rank order. Nobody writes a slice again
// before the next collective's first wait, which every rank reaches only after these copies.
static void shm_gather_slices(Comm* c, long total, float* dst) {
    int P = c->g->P;
    for (int r = 0; r < P; r++) {
        long lo = total * r / P, hi = total * (r + 1) / P;
        shm_copy(c, dst + lo, c->g->slice[r], hi - lo);
    }
    shm_done(c);
}

static void shm_allreduce(Comm* c, float* buf, long n, int op, const char* where, int layer) {
    if (c->P == 1) {  // nothing to exchange: stay asynchronous (TP=1 on a GPU must not sync per collective)
        comm_begin(c, op, n, buf, where, layer);
        comm_count(c, op, n);
        return;
    }
    shm_done(c);  // the buffer is written; on a GPU that wait is compute, not communication
    double t0 = comm_now();
    comm_begin(c, op, n, buf, where, layer);
    comm_wait_all(c, true);  // every buffer is ready
    // this rank's slice, reduced, into every rank's buffer. Every published pointer is the buffer of an
    // all-reduce, which its rank hands over to be written: the wait above checked that every rank is in
    // this same collective.
    const CommGroup* g = c->g;
    CommOuts all = {};
    for (int r = 0; r < g->P; r++) all.p[all.n++] = const_cast<float*>(g->call[r].ptr);
    shm_reduce_to(c, n * c->local / g->P, n * (c->local + 1) / g->P, op, all);
    shm_done(c);
    comm_wait_all(c, false);  // every slice is in every buffer, and nobody reads another's buffer any more
    comm_count(c, op, n);
    c->seconds += comm_now() - t0;
}

static void shm_reducescatter(Comm* c, float* out, const float* in, long n, const char* where, int layer) {
    if (c->P == 1) {  // the sum over one rank is a copy (on the stream, asynchronous)
        comm_begin(c, COMM_SCATTER, n, in, where, layer);
        if (in != out) shm_copy(c, out, in, n);
        comm_count(c, COMM_SCATTER, n);
        return;
    }
    shm_done(c);  // the input is written
    double t0 = comm_now();
    comm_begin(c, COMM_SCATTER, (long)c->P * n, in, where, layer);
    comm_wait_all(c, true);  // every input is ready
    // this rank's slice of the reduce-scatter half is its output: reduced straight into it. Element i
    // reads every rank's element i before this rank writes out[i], and other ranks read only their own
    // slices of this rank's input, so in place (out = in + rank*n) is safe.
    shm_reduce(c, (long)c->rank * n, (long)(c->rank + 1) * n, COMM_SUM, out);
    shm_done(c);
    comm_wait_all(c, false);  // no rank may change its input before everyone has read it
    comm_count(c, COMM_SCATTER, (double)c->P * n);
    c->seconds += comm_now() - t0;
}

static void shm_allgather(Comm* c, float* out, const float* in, long n, const char* where, int layer) {
    if (c->P == 1) {  // a copy, asynchronous on the stream
        comm_begin(c, COMM_GATHER, n, in, where, layer);
        if (in != out) shm_copy(c, out, in, n);
        comm_count(c, COMM_GATHER, n);
        return;
    }
    shm_done(c);
    double t0 = comm_now();
    comm_begin(c, COMM_GATHER, n, in, where, layer);
    comm_wait_all(c, true);  // every input is published: the all-gather half, with the inputs as slices
    for (int r = 0; r < c->P; r++) {
        float* dst = out + (long)r * n;
        if (dst != c->g->call[r].ptr) shm_copy(c, dst, c->g->call[r].ptr, n);  // in place: nothing to copy
    }
    shm_done(c);
    comm_wait_all(c, false);  // no rank may change its input before everyone copied it
    comm_count(c, COMM_GATHER, (double)n * c->P);
    c->seconds += comm_now() - t0;
}

// ----------------------------------------------------------------------------
// COMM_CUDA and COMM_NCCL: setup

// Whether the n ranks' devices are all different, as NCCL needs; if not, *i and *j name the first two
// ranks that share one.
static bool gpus_distinct(const int* gpus, int n, int* i = nullptr, int* j = nullptr) {
    for (int a = 0; a < n; a++)
        for (int b = a + 1; b < n; b++)
            if (gpus[a] == gpus[b]) {
                if (i) *i = a;
                if (j) *j = b;
                return false;
            }
    return true;
}

// Creates the group's P NCCL communicators together, rank r on device gpus[r]. The devices must be
// distinct: NCCL refuses two ranks on one GPU (ranks that share a GPU use COMM_CUDA instead). Call once,
// from one thread, before the rank threads call comm_bind_cuda.
static void comm_nccl_init_all(CommGroup* g, const int* gpus) {
    int i, j;
    if (!gpus_distinct(gpus, g->P, &i, &j))
        fatal("ranks %d and %d are both on GPU %d: NCCL needs one GPU per rank (ranks that share a GPU use the "
              "shared-memory backend)", i, j, gpus[i]);
    ncclResult_t r = ncclCommInitAll(g->nccl, g->P, gpus);
    if (r != ncclSuccess) fatal("ncclCommInitAll for %d ranks failed: %s (%s)", g->P, ncclGetErrorString(r), ncclGetLastError(nullptr));
    g->log.assign((size_t)g->P * COMM_LOG, CommCall());
    for (int i = 0; i < g->P; i++) {
        g->posted[i] = 0;
        g->gpu[i] = gpus[i];
    }
}

// The point-to-point communicators of a group on NCCL (after comm_nccl_init_all, the same devices): for
// each pair of neighbours b and b + 1, one 2-rank communicator that b sends on and b + 1 receives on
// (rank 0 sends to rank 1), and one for the other way. A pipeline's stages pass their boundary tensors
// over these, GPU to GPU; the group's own communicators keep its collectives.
static void comm_nccl_init_p2p(CommGroup* g, const int* gpus) {
    for (int b = 0; b + 1 < g->P; b++) {
        ncclComm_t pair[2];
        for (int way = 0; way < 2; way++) {  // 0: b sends to b + 1; 1: b + 1 sends to b
            int from = way == 0 ? b : b + 1, to = way == 0 ? b + 1 : b;
            int devs[2] = {gpus[from], gpus[to]};
            ncclResult_t r = ncclCommInitAll(pair, 2, devs);
            if (r != ncclSuccess)
                fatal("ncclCommInitAll for the point to point of ranks %d and %d failed: %s (%s)", from, to, ncclGetErrorString(r),
                      ncclGetLastError(nullptr));
            g->p2p[from][way == 0 ? P2P_TO_NEXT : P2P_TO_PREV] = pair[0];
            g->p2p[to][way == 0 ? P2P_FROM_PREV : P2P_FROM_NEXT] = pair[1];
        }
    }
}

// Moves rank c onto its GPU: from now on its collectives take device pointers and are ordered with the
// work on `stream`. Every rank of the group calls it, after comm_init, from its own thread. With NCCL
// communicators in the group the rank uses NCCL, else the CUDA shared-memory backend; then, if the ranks
// span several devices, each device gets peer access to the others (a reduction kernel on one device
// reads the other ranks' buffers).
static void comm_bind_cuda(Comm* c, int gpu, cudaStream_t stream) {
    CommGroup* g = c->g;
    c->gpu = gpu;
    c->stream = stream;
    CUDA_CHECK(c->rank, cudaSetDevice(gpu));
    CUDA_CHECK(c->rank, cudaStreamCreateWithFlags(&c->side, cudaStreamNonBlocking));
    CUDA_CHECK(c->rank, cudaEventCreateWithFlags(&c->ev_ready, cudaEventDisableTiming));
    CUDA_CHECK(c->rank, cudaEventCreateWithFlags(&c->ev_sum, cudaEventDisableTiming));
    if (g->nccl[c->local]) {
        c->backend = COMM_NCCL;
        c->nccl = g->nccl[c->local];
        for (int i = 0; i < COMM_EVENTS; i++) {
            CUDA_CHECK(c->rank, cudaEventCreate(&c->ev_start[i]));
            CUDA_CHECK(c->rank, cudaEventCreate(&c->ev_end[i]));
        }
        c->ev_issued = c->ev_done = 0;
        bool p2p = false;
        for (int k = 0; k < P2P_COMMS; k++) p2p |= (c->p2p[k] = g->p2p[c->local][k]) != nullptr;
        if (p2p) {
            for (int d = 0; d < 2; d++) CUDA_CHECK(c->rank, cudaStreamCreateWithFlags(&c->p2p_stream[d], cudaStreamNonBlocking));
            CUDA_CHECK(c->rank, cudaEventCreateWithFlags(&c->p2p_copied, cudaEventDisableTiming));
            CUDA_CHECK(c->rank, cudaEventCreate(&c->p2p_t0));
            CUDA_CHECK(c->rank, cudaEventCreate(&c->p2p_t1));
            c->p2p_bufs = new std::vector<CommP2pBuf>();
        }
        return;
    }
    // shared device memory works inside one process only; across processes a group needs NCCL
    if (g->nproc > 1) fatal("rank %d: a group that spans processes has no NCCL communicators on GPU %d", c->rank, gpu);
    c->backend = COMM_CUDA;
    {
        std::lock_guard<std::mutex> lock(g->mu);
        g->gpu[c->local] = gpu;
    }
    if (g->P == 1) return;
    comm_wait_all(c, false);  // every rank has published its device
    for (int r = 0; r < g->P; r++) {
        int other = g->gpu[r];
        bool seen = other == gpu;
        for (int q = 0; q < r && !seen; q++) seen = g->gpu[q] == other;
        if (seen) continue;
        int can = 0;
        CUDA_CHECK(c->rank, cudaDeviceCanAccessPeer(&can, gpu, other));
        if (!can)
            fatal("rank %d: GPU %d cannot access the memory of GPU %d (no peer access), so ranks on the two cannot share "
                  "buffers: use one rank per GPU (--tp up to the number of GPUs), or make one GPU visible", c->rank, gpu, other);
        cudaError_t e = cudaDeviceEnablePeerAccess(other, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();  // another rank on this device did it
        else if (e != cudaSuccess) fatal_call(c->rank, "cudaDeviceEnablePeerAccess", cudaGetErrorString(e), __FILE__, __LINE__);
    }
    comm_wait_all(c, false);  // peer access is on everywhere before anyone reduces
}

// ----------------------------------------------------------------------------
// COMM_NCCL: the sequence check, and waiting with a timeout

// Logs this rank's next collective and checks it against the other ranks' collective of the same number,
// without a barrier: whichever rank logs collective #s second compares the two, so a rank that skipped
// or reordered a collective is reported at once, before anything waits on the GPU. Returns the call.
static CommCall comm_nccl_post(Comm* c, int op, long count, const float* ptr, const char* where, int layer) {
    CommGroup* g = c->g;
    std::lock_guard<std::mutex> lock(g->mu);
    comm_begin(c, op, count, ptr, where, layer);
    CommCall* k = &g->call[c->local];
    long s = k->seq;
    g->log[(size_t)c->local * COMM_LOG + s % COMM_LOG] = *k;
    g->posted[c->local] = s + 1;
    for (int r = 0; r < g->P; r++) {  // the ranks in this process (NCCL checks nothing across processes)
        if (r == c->local || g->posted[r] <= s || g->posted[r] - s > COMM_LOG) continue;  // not there yet, or too far on
        const CommCall* o = &g->log[(size_t)r * COMM_LOG + s % COMM_LOG];
        if (!comm_same(o, k)) {
            char a[256], b[256], why[640];
            comm_describe(k, a, sizeof(a));
            comm_describe(o, b, sizeof(b));
            snprintf(why, sizeof(why), "collective mismatch: this rank issued %s where rank %d issued %s", a, r, b);
            comm_abort(g, c->rank, why);
        }
    }
    return *k;
}

// One turn of a wait loop that found the GPU not done yet: fails on an NCCL error or past the deadline,
// naming `pending` (the collective waited for; NULL: the work queued after the last one), else backs off.
static void comm_nccl_stalled(Comm* c, double deadline, int* spins, const CommCall* pending) {
    if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();  // a query's "not ready" is no error
    char d[256], why[768];
    if (pending) comm_describe(pending, d, sizeof(d));
    else snprintf(d, sizeof(d), "the GPU work queued after collective #%ld", c->seq - 1);
    ncclResult_t ar = ncclSuccess;
    NCCL_CHECK(c->rank, c->nccl, ncclCommGetAsyncError(c->nccl, &ar));
    if (ar != ncclSuccess) {
        snprintf(why, sizeof(why), "NCCL failed in %s: %s (%s)", d, ncclGetErrorString(ar), ncclGetLastError(c->nccl));
        std::lock_guard<std::mutex> lock(c->g->mu);
        comm_abort(c->g, c->rank, why, false);
    }
    if (comm_now() > deadline) {
        snprintf(why, sizeof(why), "%s has not completed after %.0f s (--timeout)", d, c->g->timeout_s);
        std::lock_guard<std::mutex> lock(c->g->mu);
        comm_abort(c->g, c->rank, why);
    }
    if (++*spins < 1000) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
}

// Counts the collectives that have completed, in order, adding their GPU time to c->seconds. With
// wait, waits (within the timeout) until the first `upto` collectives are complete; else stops at the
// first one still running.
static void comm_nccl_progress(Comm* c, long upto, bool wait) {
    double deadline = comm_now() + c->g->timeout_s;
    int spins = 0;
    while (c->ev_done < upto) {
        int slot = (int)(c->ev_done % COMM_EVENTS);
        cudaError_t e = cudaEventQuery(c->ev_end[slot]);
        if (e == cudaSuccess) {
            float ms = 0.0f;
            CUDA_CHECK(c->rank, cudaEventElapsedTime(&ms, c->ev_start[slot], c->ev_end[slot]));
            c->seconds += ms * 1e-3;
            c->ev_done++;
            continue;
        }
        if (e != cudaErrorNotReady) fatal_call(c->rank, "cudaEventQuery after an NCCL collective", cudaGetErrorString(e), __FILE__, __LINE__);
        if (!wait) {
            if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
            return;
        }
        comm_nccl_stalled(c, deadline, &spins, &c->ev_call[slot]);
    }
}

// Waits until everything queued on the rank's stream, collectives and kernels, is done. COMM_NCCL polls,
// so a collective that can never complete (another rank skipped it) is reported with its op and place
// after the group's timeout instead of hanging; call it before any blocking read of the rank's device
// memory (a download). COMM_CUDA synchronises the stream; COMM_HOST has nothing queued.
static void comm_sync(Comm* c) {
    if (c->backend == COMM_HOST) return;
    comm_finish(c);  // a started collective is part of the rank's queued work
    if (c->backend == COMM_CUDA) {
        CUDA_CHECK(c->rank, cudaStreamSynchronize(c->stream));
        return;
    }
    comm_nccl_progress(c, c->ev_issued, true);
    double deadline = comm_now() + c->g->timeout_s;
    int spins = 0;
    for (;;) {
        cudaError_t e = cudaStreamQuery(c->stream);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) fatal_call(c->rank, "cudaStreamQuery", cudaGetErrorString(e), __FILE__, __LINE__);
        comm_nccl_stalled(c, deadline, &spins, nullptr);
    }
}

// brackets one NCCL collective with events in the next ring slot (first waiting for the oldest in
// flight if the ring is full)
static int comm_nccl_begin(Comm* c, const CommCall* k) {
    if (c->ev_issued - c->ev_done >= COMM_EVENTS) comm_nccl_progress(c, c->ev_issued - COMM_EVENTS + 1, true);
    int slot = (int)(c->ev_issued % COMM_EVENTS);
    c->ev_call[slot] = *k;
    CUDA_CHECK(c->rank, cudaEventRecord(c->ev_start[slot], c->stream));
    return slot;
}
static void comm_nccl_end(Comm* c, int slot) {
    CUDA_CHECK(c->rank, cudaEventRecord(c->ev_end[slot], c->stream));
    c->ev_issued++;
    comm_nccl_progress(c, c->ev_issued, false);
}

// ----------------------------------------------------------------------------
// COMM_NCCL point to point: GPU to GPU over the neighbours' communicators
//
// A send copies the buffer on the rank's stream into a copy of its own (a buffer no later kernel writes),
// and the send stream of its direction sends the copy once the copy is done: the rank's stream goes on at
// once, as a host send does, and the copy is reused only after NCCL has sent it. Each direction has its
// own stream and communicator, so a send to the next stage never waits behind one to the previous stage.
// A receive is enqueued on the rank's stream, where the kernels that read it follow, between two events
// that time it on the GPU: the time the stream stood waiting for the sender plus the transfer, which is
// the stage's bubble. The host waits for it there, polling within the timeout, so that a stage that stalls
// is reported with the same line as on the host backends.

// Polls ev (recorded on the rank's device) until it is done: false after the group's timeout; an NCCL
// error on nc (the communicator the event waits on) is reported as such.
static bool comm_nccl_p2p_wait(Comm* c, cudaEvent_t ev, ncclComm_t nc, const char* what) {
    double deadline = comm_now() + c->g->timeout_s;
    for (int spins = 0;; spins++) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess) return true;
        if (e != cudaErrorNotReady) fatal_call(c->rank, what, cudaGetErrorString(e), __FILE__, __LINE__);
        (void)cudaGetLastError();  // a query's "not ready" is no error
        ncclResult_t ar = ncclSuccess;
        NCCL_CHECK(c->rank, nc, ncclCommGetAsyncError(nc, &ar));
        if (ar != ncclSuccess) fatal("rank %d: NCCL failed in %s: %s (%s)", c->rank, what, ncclGetErrorString(ar), ncclGetLastError(nc));
        if (comm_now() > deadline) return false;
        if (spins < 1000) std::this_thread::yield();
        else std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}

// a copy buffer of at least n floats whose last send is done, made when there is none (a pipeline needs
// as many as it has messages in flight one way: at most a step's micro-batches)
static CommP2pBuf* comm_nccl_p2p_buf(Comm* c, long n) {
    for (CommP2pBuf& b : *c->p2p_bufs) {
        if (b.busy) {
            cudaError_t e = cudaEventQuery(b.sent);
            if (e == cudaErrorNotReady) {
                (void)cudaGetLastError();
                continue;
            }
            if (e != cudaSuccess) fatal_call(c->rank, "cudaEventQuery after ncclSend", cudaGetErrorString(e), __FILE__, __LINE__);
            b.busy = false;
        }
        if (b.cap >= n) return &b;
    }
    CommP2pBuf b;
    CUDA_CHECK(c->rank, cudaMalloc(&b.buf, (size_t)std::max(n, 1L) * sizeof(float)));
    CUDA_CHECK(c->rank, cudaEventCreateWithFlags(&b.sent, cudaEventDisableTiming));
    b.cap = n;
    b.busy = false;
    c->p2p_bufs->push_back(b);
    return &c->p2p_bufs->back();
}

static void comm_nccl_send(Comm* c, int dst, const float* buf, long n) {
    int way = dst == c->rank + 1 ? 0 : 1;
    ncclComm_t nc = c->p2p[way == 0 ? P2P_TO_NEXT : P2P_TO_PREV];
    CommP2pBuf* b = comm_nccl_p2p_buf(c, n);
    CUDA_CHECK(c->rank, cudaMemcpyAsync(b->buf, buf, n * sizeof(float), cudaMemcpyDeviceToDevice, c->stream));
    CUDA_CHECK(c->rank, cudaEventRecord(c->p2p_copied, c->stream));
    CUDA_CHECK(c->rank, cudaStreamWaitEvent(c->p2p_stream[way], c->p2p_copied, 0));
    NCCL_CHECK(c->rank, nc, ncclSend(b->buf, (size_t)n, ncclFloat, 1, nc, c->p2p_stream[way]));  // to rank 1 of the pair
    CUDA_CHECK(c->rank, cudaEventRecord(b->sent, c->p2p_stream[way]));
    b->busy = true;
}

// the receive on the rank's stream, waited for within the timeout; returns the GPU time it took
static double comm_nccl_recv(Comm* c, int src, float* buf, long n, const char* where, int tag) {
    ncclComm_t nc = c->p2p[src == c->rank - 1 ? P2P_FROM_PREV : P2P_FROM_NEXT];
    CUDA_CHECK(c->rank, cudaEventRecord(c->p2p_t0, c->stream));
    NCCL_CHECK(c->rank, nc, ncclRecv(buf, (size_t)n, ncclFloat, 0, nc, c->stream));  // from rank 0 of the pair
    CUDA_CHECK(c->rank, cudaEventRecord(c->p2p_t1, c->stream));
    if (!comm_nccl_p2p_wait(c, c->p2p_t1, nc, "ncclRecv")) comm_p2p_timeout(c, src, where, tag);
    float ms = 0.0f;
    CUDA_CHECK(c->rank, cudaEventElapsedTime(&ms, c->p2p_t0, c->p2p_t1));
    return ms * 1e-3;
}

// waits until the rank's sends are done (its receivers took them), then releases its copies, streams,
// events and point-to-point communicators
static void comm_nccl_p2p_free(Comm* c) {
    if (!c->p2p_stream[0]) return;
    for (CommP2pBuf& b : *c->p2p_bufs) {
        if (b.busy && !comm_nccl_p2p_wait(c, b.sent, c->p2p[P2P_TO_NEXT] ? c->p2p[P2P_TO_NEXT] : c->p2p[P2P_TO_PREV], "ncclSend"))
            fatal("stage %d, TP rank %d: a message it sent was not received within %g s (--timeout): a neighbouring stage stopped early",
                  c->rank, c->tp_rank, c->g->timeout_s);
        CUDA_CHECK(c->rank, cudaFree(b.buf));
        CUDA_CHECK(c->rank, cudaEventDestroy(b.sent));
    }
    delete c->p2p_bufs;
    c->p2p_bufs = nullptr;
    for (int d = 0; d < 2; d++) CUDA_CHECK(c->rank, cudaStreamDestroy(c->p2p_stream[d]));
    CUDA_CHECK(c->rank, cudaEventDestroy(c->p2p_copied));
    CUDA_CHECK(c->rank, cudaEventDestroy(c->p2p_t0));
    CUDA_CHECK(c->rank, cudaEventDestroy(c->p2p_t1));
    c->p2p_stream[0] = c->p2p_stream[1] = nullptr;
    for (int k = 0; k < P2P_COMMS; k++) {
        if (c->p2p[k]) NCCL_CHECK(c->rank, c->p2p[k], ncclCommDestroy(c->p2p[k]));
        c->p2p[k] = nullptr;
        std::lock_guard<std::mutex> lock(c->g->mu);
        c->g->p2p[c->local][k] = nullptr;
    }
}

// Releases what comm_bind_cuda made (events, the device slice, the NCCL communicator) and returns the
// handle to the host backend. Every rank of the group calls it, from its own thread, when done: with
// COMM_CUDA it waits for all ranks first, as another rank may still be copying from this rank's slice.
static void comm_free(Comm* c) {
    if (c->backend == COMM_HOST) return;
    CUDA_CHECK(c->rank, cudaSetDevice(c->gpu));
    comm_sync(c);
    CUDA_CHECK(c->rank, cudaStreamDestroy(c->side));  // finished: comm_sync finished the started collective
    CUDA_CHECK(c->rank, cudaEventDestroy(c->ev_ready));
    CUDA_CHECK(c->rank, cudaEventDestroy(c->ev_sum));
    c->side = nullptr;
    if (c->backend == COMM_NCCL) {
        for (int i = 0; i < COMM_EVENTS; i++) {
            CUDA_CHECK(c->rank, cudaEventDestroy(c->ev_start[i]));
            CUDA_CHECK(c->rank, cudaEventDestroy(c->ev_end[i]));
        }
        comm_nccl_p2p_free(c);
        NCCL_CHECK(c->rank, c->nccl, ncclCommDestroy(c->nccl));
        std::lock_guard<std::mutex> lock(c->g->mu);
        c->g->nccl[c->local] = nullptr;
        c->nccl = nullptr;
    } else if (c->P > 1) {
        comm_wait_all(c, false);
    }
    if (c->dchunk) CUDA_CHECK(c->rank, cudaFree(c->dchunk));
    c->dchunk = nullptr;
    c->dchunk_n = 0;
    c->backend = COMM_HOST;
}

// ----------------------------------------------------------------------------
// COMM_NCCL collectives: checked on the host, enqueued on the rank's stream, not waited for

static void comm_nccl_allreduce(Comm* c, float* buf, long n, int op, const char* where, int layer) {
    CommCall k = comm_nccl_post(c, op, n, buf, where, layer);
    int slot = comm_nccl_begin(c, &k);
    NCCL_CHECK(c->rank, c->nccl, ncclAllReduce(buf, buf, (size_t)n, ncclFloat, op == COMM_SUM ? ncclSum : ncclMax, c->nccl, c->stream));
    comm_nccl_end(c, slot);
    comm_count(c, op, n);
}

static void comm_nccl_reducescatter(Comm* c, float* out, const float* in, long n, const char* where, int layer) {
    CommCall k = comm_nccl_post(c, COMM_SCATTER, (long)c->P * n, in, where, layer);
    int slot = comm_nccl_begin(c, &k);
    NCCL_CHECK(c->rank, c->nccl, ncclReduceScatter(in, out, (size_t)n, ncclFloat, ncclSum, c->nccl, c->stream));
    comm_nccl_end(c, slot);
    comm_count(c, COMM_SCATTER, (double)c->P * n);
}

static void comm_nccl_allgather(Comm* c, float* out, const float* in, long n, const char* where, int layer) {
    CommCall k = comm_nccl_post(c, COMM_GATHER, n, in, where, layer);
    int slot = comm_nccl_begin(c, &k);
    NCCL_CHECK(c->rank, c->nccl, ncclAllGather(in, out, (size_t)n, ncclFloat, c->nccl, c->stream));
    comm_nccl_end(c, slot);
    comm_count(c, COMM_GATHER, (double)n * c->P);
}

#include "common/comm_mpi.h"

// ----------------------------------------------------------------------------
// the calls, declared at the top: each backend's version

static void comm_allreduce(Comm* c, float* buf, long n, int op, const char* where, int layer) {
    if (c->backend == COMM_NCCL) { comm_nccl_allreduce(c, buf, n, op, where, layer); return; }
#ifdef TP_MPI
    if (c->g->nproc > 1) { comm_procs_collective_allreduce(c, buf, n, op, where, layer); return; }
#endif
    shm_allreduce(c, buf, n, op, where, layer);
}

static void comm_reducescatter(Comm* c, float* out, const float* in, long n, const char* where, int layer) {
    if (c->backend == COMM_NCCL) { comm_nccl_reducescatter(c, out, in, n, where, layer); return; }
#ifdef TP_MPI
    if (c->g->nproc > 1) { comm_procs_collective_reducescatter(c, out, in, n, where, layer); return; }
#endif
    shm_reducescatter(c, out, in, n, where, layer);
}

static void comm_allgather(Comm* c, float* out, const float* in, long n, const char* where, int layer) {
    if (c->backend == COMM_NCCL) { comm_nccl_allgather(c, out, in, n, where, layer); return; }
#ifdef TP_MPI
    if (c->g->nproc > 1) { comm_procs_collective_allgather(c, out, in, n, where, layer); return; }
#endif
    shm_allgather(c, out, in, n, where, layer);
}

// An all-gather only copies, and moves no bits it does not hand over unchanged (memcpy, cudaMemcpy,
// ncclAllGather, MPI between processes of one kind of host), so n bf16 values go as n/2 32-bit words through
// the same call: half the bytes of the same values in fp32 words. The call is marked bf16 for the sequence
// check and the messages.
static void comm_allgather_bf16(Comm* c, uint16_t* out, const uint16_t* in, long n, const char* where, int layer) {
    if (n % 2) fatal("rank %d: a bf16 all-gather of an odd count (%ld) at %s: it moves pairs of bf16", c->rank, n, where);
    c->next_bf16 = true;
    comm_allgather(c, (float*)(void*)out, (const float*)(const void*)in, n / 2, where, layer);
}

// (A group on NCCL lines up only its ranks in this process: barriers across processes go through a host
// group, as tp.cu's world group.)
static void comm_barrier(Comm* c, const char* where) {
    if (c->backend == COMM_NCCL) {
        if (c->g->nproc > 1) fatal("rank %d: a barrier at %s on an NCCL group that spans processes: use a host group", c->rank, where);
        comm_nccl_post(c, COMM_BARRIER, 0, nullptr, where, -1);  // checked against the others' at once
        comm_sync(c);
        if (c->P > 1) comm_wait_all(c, true);
        return;
    }
#ifdef TP_MPI
    if (c->g->nproc > 1) { comm_procs_collective_barrier(c, where); return; }
#endif
    shm_done(c);
    comm_begin(c, COMM_BARRIER, 0, nullptr, where, -1);
    if (c->P > 1) comm_wait_all(c, true);
}

// ----------------------------------------------------------------------------
// point to point
//
// A send never waits: it leaves a copy in the receiver's box and goes on, so any order of sends and
// receives in which every message is eventually received completes; a schedule cannot deadlock on the
// order of two neighbours' sends. (A pipeline keeps a few micro-batches' boundary tensors in flight, so
// the copies are small.) The receiver waits within the timeout, and a message that does not come is
// reported with the place the receiver waits at: the stage before it stalled, or stopped. A message to a
// rank of another process keeps the same promises over MPI: the copy waits in the sender's list of sends
// in flight, not in a box (comm_mpi_send). On NCCL the copy stays on the sender's GPU until the receiver
// takes it (comm_nccl_send), and the box carries only what the message is, for the receiver's check.

static void comm_p2p_check(Comm* c, int peer, const char* what) {
    if (peer < 0 || peer >= c->P || peer == c->rank) fatal("rank %d: %s with rank %d of a group of %d", c->rank, what, peer, c->P);
}

// the receiver's line when a message does not come within the timeout
[[noreturn]] static void comm_p2p_timeout(Comm* c, int src, const char* where, int tag) {
    fatal("stage %d, TP rank %d: waited %g s for %s of micro-batch %d from stage %d (--timeout): stage %d stalled or stopped",
          c->rank, c->tp_rank, c->g->timeout_s, where, tag, src, src);
}

// whether messages to and from rank peer go GPU to GPU over NCCL: a neighbour in this process, in a group
// with point-to-point communicators (comm_nccl_init_p2p); else they go through host memory
static bool comm_nccl_p2p_to(const Comm* c, int peer) {
    if (c->backend != COMM_NCCL || peer / c->g->P != c->g->proc) return false;
    if (peer == c->rank + 1) return c->p2p[P2P_TO_NEXT] != nullptr;
    return peer == c->rank - 1 && c->p2p[P2P_TO_PREV] != nullptr;
}

static void comm_send(Comm* c, int dst, const float* buf, long n, const char* where, int tag) {
    comm_p2p_check(c, dst, "a send");
    CommGroup* g = c->g;
    CommMsg msg;
    msg.n = n;
    if (comm_nccl_p2p_to(c, dst)) {
        comm_nccl_send(c, dst, buf, n);  // the box gets what the message is, for the receiver's check
    } else if (c->backend == COMM_HOST) {
        msg.data.assign(buf, buf + n);
    } else {  // a GPU rank: the buffer is in its device memory, written by its stream
        msg.data.resize(n);
        CUDA_CHECK(c->rank, cudaMemcpyAsync(msg.data.data(), buf, n * sizeof(float), cudaMemcpyDeviceToHost, c->stream));
        CUDA_CHECK(c->rank, cudaStreamSynchronize(c->stream));
    }
    msg.where = where;
    msg.tag = tag;
    c->p2p_sent += n;
    if (dst / g->P != g->proc) {  // a rank of another process: over MPI (common/comm_mpi.h)
#ifdef TP_MPI
        comm_mpi_send(c, dst, &msg);
#endif
        return;
    }
    {
        std::lock_guard<std::mutex> lock(g->mu);
        if (g->box.empty()) g->box.resize((size_t)g->P * g->P);
        g->box[(size_t)c->local * g->P + dst % g->P].push_back(std::move(msg));
    }
    g->cv.notify_all();
}

static void comm_recv(Comm* c, int src, float* buf, long n, const char* where, int tag) {
    comm_p2p_check(c, src, "a receive");
    CommGroup* g = c->g;
    double t0 = comm_now();
    CommMsg msg = {{}, -1, "", -1};
    char got_where[48] = "";
    if (src / g->P != g->proc) {  // from a rank of another process
#ifdef TP_MPI
        comm_mpi_recv(c, src, &msg, got_where, sizeof(got_where), where, tag);
#endif
    } else {
        std::unique_lock<std::mutex> lock(g->mu);
        if (g->box.empty()) g->box.resize((size_t)g->P * g->P);
        std::deque<CommMsg>* box = &g->box[(size_t)(src % g->P) * g->P + c->local];
        auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(g->timeout_s);
        while (box->empty())
            if (g->cv.wait_until(lock, deadline) == std::cv_status::timeout && box->empty()) comm_p2p_timeout(c, src, where, tag);
        msg = std::move(box->front());
        box->pop_front();
        lock.unlock();
        snprintf(got_where, sizeof(got_where), "%s", msg.where);
    }
    if (msg.n != n || strncmp(got_where, where, sizeof(got_where) - 1) != 0 || msg.tag != tag)
        fatal("stage %d, TP rank %d: expected %s of micro-batch %d (%ld floats) from stage %d and got %s of micro-batch %d (%ld "
              "floats): the stages' schedules disagree; this is a bug in the schedule", c->rank, c->tp_rank, where, tag, n, src,
              got_where, msg.tag, msg.n);
    if (comm_nccl_p2p_to(c, src)) {  // the header came through the box, the data comes now
        c->p2p_seconds += comm_nccl_recv(c, src, buf, n, where, tag);
        return;
    }
    if (c->backend == COMM_HOST) {
        memcpy(buf, msg.data.data(), n * sizeof(float));
    } else {
        CUDA_CHECK(c->rank, cudaMemcpyAsync(buf, msg.data.data(), n * sizeof(float), cudaMemcpyHostToDevice, c->stream));
        CUDA_CHECK(c->rank, cudaStreamSynchronize(c->stream));  // before msg's memory goes
    }
    c->p2p_seconds += comm_now() - t0;
}

// Waits until this rank's sends to other processes have left (MPI needs every request completed); the
// messages of a step are all received within it, so this returns at once in a run that went well. Call it
// before the rank's handle goes.
static void comm_p2p_finish(Comm* c) {
#ifdef TP_MPI
    if (c->g && c->g->nproc > 1) comm_mpi_sent_finish(c);
#else
    (void)c;
#endif
}

// ----------------------------------------------------------------------------
// started collectives: the backward's communication under its weight gradients
//
// The rank's stream records ev_ready once the input is written; the communication stream waits for it,
// runs the collective and records ev_sum; comm_finish makes the rank's stream wait for ev_sum. Between the
// two, whatever the rank queues on its stream runs beside the collective. NCCL enqueues the collective at
// once. The shared-memory backend is driven by the host (it meets the other ranks, then queues their
// reductions and copies): it runs in comm_finish, while the GPU computes what was queued since the start.
// Either way the collective is the same call as comm_allreduce's, on the other stream: the same bits.

// test hook: comm_finish leaves out the wait for the collective, the bug a missing event wait is (a test
// shows the emulator's lazy streams catch it)
static bool g_comm_plant_missing_wait = false;

// runs the started collective on the communication stream
static void comm_run_started(Comm* c) {
    cudaStream_t mine = c->stream;
    c->stream = c->side;  // every enqueue of the call below goes to the communication stream
    CUDA_CHECK(c->rank, cudaStreamWaitEvent(c->side, c->ev_ready, 0));
    const CommCall* k = &c->start_call;
    if (k->op == COMM_SCATTER) comm_reducescatter(c, c->start_out, c->start_in, k->count, k->where, k->layer);
    else comm_allreduce(c, c->start_out, k->count, k->op, k->where, k->layer);
    CUDA_CHECK(c->rank, cudaEventRecord(c->ev_sum, c->side));
    c->stream = mine;
}

static void comm_start(Comm* c, int op, float* out, const float* in, long n, const char* where, int layer) {
    if (c->started) fatal("rank %d: a collective at %s started while the one at %s is not finished", c->rank, where, c->start_call.where);
    c->start_call = CommCall();
    c->start_call.op = op;
    c->start_call.count = n;
    c->start_call.where = where;
    c->start_call.layer = layer;
    c->start_out = out;
    c->start_in = in;
    c->started = true;
    CUDA_CHECK(c->rank, cudaEventRecord(c->ev_ready, c->stream));
    if (c->backend == COMM_NCCL) comm_run_started(c);
}

static void comm_allreduce_start(Comm* c, float* buf, long n, int op, const char* where, int layer) {
    if (c->backend == COMM_HOST || c->P == 1) { comm_allreduce(c, buf, n, op, where, layer); return; }
    comm_start(c, op, buf, buf, n, where, layer);
}

static void comm_reducescatter_start(Comm* c, float* out, const float* in, long n, const char* where, int layer) {
    if (c->backend == COMM_HOST || c->P == 1) { comm_reducescatter(c, out, in, n, where, layer); return; }
    comm_start(c, COMM_SCATTER, out, in, n, where, layer);
}

static void comm_finish(Comm* c) {
    if (!c->started) return;
    c->started = false;
    if (c->backend == COMM_CUDA) comm_run_started(c);
    if (!g_comm_plant_missing_wait) CUDA_CHECK(c->rank, cudaStreamWaitEvent(c->stream, c->ev_sum, 0));
}

