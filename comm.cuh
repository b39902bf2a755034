// comm.cuh: the collectives one rank calls. Every byte that crosses between ranks goes through here.
//
// Ranks are threads of one process. The shared-memory backend is what ranks on the CPU use (and ranks
// that share one GPU, which NCCL refuses): each rank publishes a pointer to its buffer, and the ranks
// reduce each other's buffers directly, summing in rank order 0, 1, ..., P-1 so that the result is
// deterministic and bit-identical on every rank.
//
// Because all ranks live in one process, the group also sees every rank's sequence of collectives:
// each call carries its op, its count and its place in the model, a mismatch between ranks is reported
// instead of computing garbage, and a rank that waits longer than the timeout reports where every
// rank is instead of hanging forever (the classic TP failure: one rank skips a collective).
//
// One set of calls (comm_allreduce, comm_reducescatter, comm_allgather, comm_broadcast, comm_barrier),
// three backends, set per rank at setup; the recipe in gpt.cu never knows which one runs:
//   COMM_HOST  shared memory, buffers in host memory: ranks on the CPU. comm_init alone.
//   COMM_CUDA  shared memory, buffers in device memory: ranks that share a GPU. comm_init, then
//              comm_bind_cuda. A CUDA kernel reads the P ranks' device pointers directly (one process,
//              one device or devices with peer access) and sums in the same rank order as COMM_HOST:
//              bit-identical across ranks and to the host path.
//   COMM_NCCL  NCCL, one communicator per rank on distinct GPUs, created together: comm_nccl_init_all
//              (or comm_nccl_init_procs across processes) once, then comm_init and comm_bind_cuda per rank. Collectives are enqueued on the rank's
//              stream and the host moves on; comm_sync waits for them, polling, within the timeout.
//
// A group may span processes (data parallelism across machines, started by mpirun): it is then P ranks
// in each of N processes, and rank r of process p is the group's rank p*P + r. Inside a process the
// ranks still meet in shared memory; between processes MPI carries the host backend's collectives and
// NCCL the GPU ones (its communicators bootstrapped by broadcasting NCCL's unique id over MPI). A
// host collective that spans processes first reduces inside each process in rank order, then one
// thread of each process exchanges the process's partial result over MPI, and every process sums the
// partials in process order: the same bits everywhere, on every run. MPI is optional at build time
// (make finds mpicxx and defines TP_MPI); without it every group lives in one process.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
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
enum CommOp { COMM_SUM, COMM_MAX, COMM_SCATTER, COMM_GATHER, COMM_BCAST, COMM_BARRIER };
static const char* comm_op_name(int op) {
    static const char* names[] = {"all-reduce(sum)", "all-reduce(max)", "reduce-scatter(sum)", "all-gather", "broadcast", "barrier"};
    return names[op];
}

// where a rank computes: its buffers are in host memory (the CPU backend) or on its GPU
enum Device { DEV_CPU, DEV_CUDA };

enum CommBackend { COMM_HOST, COMM_CUDA, COMM_NCCL };

// The kinds of collective that move data, for the accounting. The payload of each, in floats: an
// all-reduce of n counts n, a reduce-scatter of P*n inputs P*n, an all-gather of n per rank P*n, a
// broadcast n.
enum CommKind { KIND_ALLREDUCE, KIND_REDUCESCATTER, KIND_ALLGATHER, KIND_BROADCAST, COMM_KINDS };
static const char* comm_kind_name(int kind) {
    static const char* names[] = {"all-reduce", "reduce-scatter", "all-gather", "broadcast"};
    return names[kind];
}

// The bytes one rank sends for `floats` of payload of a kind, as a ring algorithm (what NCCL runs
// between GPUs) sends them over P ranks: an all-reduce of n floats is a reduce-scatter then an
// all-gather, each sending (P-1)/P of the data; a broadcast, pipelined, (P-1)/P. One rank sends nothing.
static double comm_ring_bytes(int kind, double floats, int P) {
    double f = (double)(P - 1) / P;
    return 4.0 * floats * (kind == KIND_ALLREDUCE ? 2.0 * f : f);
}

// what one rank is doing in a collective, published for the other ranks to check
struct CommCall {
    int op;
    long count;
    const char* where;  // a static string naming the place in the model, e.g. "attproj fwd"
    int layer;          // -1 when not inside a layer
    long seq;           // how many collectives this rank has issued before this one
    const float* ptr;   // the rank's buffer (input side)
};

// shared by the P ranks of a group that live in this process
struct CommGroup {
    int P;            // ranks in this process
    int nproc, proc;  // processes the group spans, and this one's index (1 and 0: one process)
    double timeout_s;
    std::mutex mu;
    std::condition_variable cv;
    int arrived;
    long generation;
    CommCall call[COMM_MAXP];
    bool waiting[COMM_MAXP];
    std::vector<float> chunk[COMM_MAXP];  // rank r's reduced slice of the current all-reduce
    // COMM_CUDA
    float* dchunk[COMM_MAXP];  // rank r's reduced slice of the current all-reduce, in device memory
    int gpu[COMM_MAXP];        // rank r's device, once bound (-1 before)
    // COMM_NCCL
    ncclComm_t nccl[COMM_MAXP];  // one communicator per rank, created together by comm_nccl_init_all
    bool sync_each;              // debugging: wait (with the timeout) after every collective
    std::vector<CommCall> log;   // (P, COMM_LOG): rank r's collective #s at [r * COMM_LOG + s % COMM_LOG]
    long posted[COMM_MAXP];      // how many collectives rank r has logged
    // across processes (host backend): this process's partial result and what the others sent
    std::vector<float> xsend, xrecv;
#ifdef TP_MPI
    MPI_Comm mpi;  // the group's own communicator over the processes (a duplicate of MPI_COMM_WORLD)
#endif
};

// one rank's handle, with its counters
struct Comm {
    CommGroup* g;
    int rank, P;  // in the whole group, across processes
    int local;    // among the group's ranks in this process (the index into the group's per-rank arrays)
    long seq;
    double values;   // floats moved through collectives (the payload, counted once per collective)
    double moved[COMM_KINDS];  // the same, by kind of collective
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
};

static void comm_group_init(CommGroup* g, int P, double timeout_s) {
    if (P < 1 || P > COMM_MAXP) fatal("a group of %d ranks is out of range: the collectives support 1 to %d ranks", P, COMM_MAXP);
    g->P = P;
    g->nproc = 1;
    g->proc = 0;
    g->timeout_s = timeout_s;
    g->arrived = 0;
    g->generation = 0;
    memset(g->call, 0, sizeof(g->call));
    memset(g->waiting, 0, sizeof(g->waiting));
    for (int r = 0; r < COMM_MAXP; r++) {
        g->dchunk[r] = nullptr;
        g->gpu[r] = -1;
        g->nccl[r] = nullptr;
        g->posted[r] = 0;
    }
    g->sync_each = false;
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
    c->values = 0;
    c->seconds = 0;
    for (int k = 0; k < COMM_KINDS; k++) c->moved[k] = 0;
    c->backend = COMM_HOST;
    c->gpu = -1;
    c->stream = nullptr;
    c->nccl = nullptr;
    c->dchunk = nullptr;
    c->dchunk_n = 0;
    c->ev_issued = c->ev_done = 0;
}

// counts a collective's payload (floats) under its kind
static void comm_count(Comm* c, int op, double floats) {
    int kind = op == COMM_SCATTER ? KIND_REDUCESCATTER
             : op == COMM_GATHER  ? KIND_ALLGATHER
             : op == COMM_BCAST   ? KIND_BROADCAST
                                  : KIND_ALLREDUCE;
    c->values += floats;
    c->moved[kind] += floats;
}

static void comm_describe(const CommCall* k, char* buf, size_t n) {
    if (k->layer >= 0) snprintf(buf, n, "#%ld %s of %ld floats at %s (layer %d)", k->seq, comm_op_name(k->op), k->count, k->where, k->layer);
    else snprintf(buf, n, "#%ld %s of %ld floats at %s", k->seq, comm_op_name(k->op), k->count, k->where);
}

// Prints where every rank of the group in this process is and ends the process: the other ranks may be
// blocked for good, so there is nothing to unwind to.
[[noreturn]] static void comm_abort(CommGroup* g, int rank, const char* why) {
    fatal_begin();
    fatal_prefix();
    fprintf(stderr, "rank %d: %s; the ranks' collectives:\n", rank, why);
    for (int r = 0; r < g->P; r++) {
        char d[256];
        comm_describe(&g->call[r], d, sizeof(d));
        fprintf(stderr, "  rank %d %s %s\n", g->proc * g->P + r, g->waiting[r] ? "waits in" : "last issued", d);
    }
    fatal_prefix();
    fprintf(stderr, "every rank must issue the same collectives in the same order; this is a bug in the recipe\n");
    fatal_end();
}

// two ranks' calls are the same collective: same op, count and place in the model
static bool comm_same(const CommCall* a, const CommCall* b) {
    return a->op == b->op && a->count == b->count && a->layer == b->layer && strcmp(a->where, b->where) == 0;
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
    k->where = where;
    k->layer = layer;
    k->seq = c->seq++;
    k->ptr = ptr;
}

static double comm_now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ----------------------------------------------------------------------------
// processes: mpirun and MPI

// The processes of the job: how many, this one's index, and the ones that share its machine (they split
// its GPUs and cores). Without mpirun: one process, index 0.
struct CommProcs {
    int n, me;
    int node_n, node_me;
    std::vector<std::string> hosts;  // per process: its machine and pid, for the printed grid
    std::vector<int> pids;
};
static CommProcs g_procs = {1, 0, 1, 0, {}, {}};

// The first of the variables that launchers set for their processes (Open MPI's mpirun, MPICH's and
// MVAPICH's, srun with PMI), or def.
static int launcher_env(const char* const* names, int def) {
    for (int i = 0; names[i]; i++)
        if (const char* v = getenv(names[i])) return atoi(v);
    return def;
}
static int comm_launcher_size() {
    static const char* const names[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", nullptr};
    return launcher_env(names, 1);
}
static int comm_launcher_rank() {
    static const char* const names[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK", nullptr};
    return launcher_env(names, 0);
}

static std::string comm_hostname() {
    char h[256] = "";
    if (gethostname(h, sizeof(h) - 1) != 0) snprintf(h, sizeof(h), "unknown");
    return h;
}

#ifdef TP_MPI
static std::mutex g_mpi_mu;  // MPI_THREAD_SERIALIZED: one thread of the process in MPI at a time

// an MPI call under the process's MPI lock (non-blocking calls only: the lock is never held while waiting)
#define MPI_LOCKED(call)                                \
    do {                                                \
        std::lock_guard<std::mutex> mpi_lock_(g_mpi_mu); \
        MPI_CHECK(call);                                \
    } while (0)

// Waits for a non-blocking MPI operation by polling it, so that a process that died or stopped issuing
// collectives is reported after the timeout instead of hanging every other process with it.
static void comm_mpi_wait(MPI_Request* req, double timeout_s, const char* what) {
    double deadline = comm_now() + timeout_s;
    for (int spins = 0;; spins++) {
        int done = 0;
        MPI_LOCKED(MPI_Test(req, &done, MPI_STATUS_IGNORE));
        if (done) return;
        if (comm_now() > deadline)
            fatal("waited %g s (--timeout) for the other processes in %s: a process died or stopped issuing collectives",
                  timeout_s, what);
        if (spins < 100) std::this_thread::yield();
        else std::this_thread::sleep_for(std::chrono::microseconds(spins < 10000 ? 20 : 200));
    }
}

// MPI's counts are ints: one exchange moves at most INT_MAX floats per process
static int comm_mpi_count(long n) {
    if (n > 2147483647L) fatal("an exchange of %ld floats between processes exceeds MPI's counts (2^31 - 1): use more --tp ranks", n);
    return (int)n;
}
#endif

// Starts the processes of an mpirun job (MPI_Init), or does nothing when there is one process. Call first
// thing in main, before any other thread exists. A tp built without MPI refuses a job of several
// processes: they would each train alone, unaware of the others.
static void comm_procs_start(int* argc, char*** argv) {
    int size = comm_launcher_size();
    g_procs.hosts = {comm_hostname()};
    g_procs.pids = {(int)getpid()};
    if (size <= 1) return;
#ifndef TP_MPI
    (void)argc;
    (void)argv;
    if (comm_launcher_rank() != 0) _Exit(1);  // process 0 says why, once
    fatal("started by mpirun with %d processes, but this tp was built without MPI: install OpenMPI (apt-get install "
          "openmpi-bin libopenmpi-dev) and rebuild (make clean && make), or run one process", size);
#else
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided));
    if (provided < MPI_THREAD_SERIALIZED)
        fatal("this MPI library cannot be called from the rank threads (MPI_THREAD_SERIALIZED); use an MPI built with thread support");
    MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));  // MPI errors come back to MPI_CHECK
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &g_procs.n));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &g_procs.me));
    g_fatal_nproc = g_procs.n;
    g_fatal_proc = g_procs.me;
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_procs.me, MPI_INFO_NULL, &node));
    MPI_CHECK(MPI_Comm_size(node, &g_procs.node_n));
    MPI_CHECK(MPI_Comm_rank(node, &g_procs.node_me));
    MPI_CHECK(MPI_Comm_free(&node));
    struct Who { char host[64]; int pid; } me = {}, *all = new Who[g_procs.n];
    snprintf(me.host, sizeof(me.host), "%s", g_procs.hosts[0].c_str());
    me.pid = (int)getpid();
    MPI_CHECK(MPI_Allgather(&me, sizeof(Who), MPI_BYTE, all, sizeof(Who), MPI_BYTE, MPI_COMM_WORLD));
    g_procs.hosts.clear();
    g_procs.pids.clear();
    for (int p = 0; p < g_procs.n; p++) {
        g_procs.hosts.push_back(all[p].host);
        g_procs.pids.push_back(all[p].pid);
    }
    delete[] all;
#endif
}

// the end of a job that went well: every process calls it once its rank threads have finished
static void comm_procs_finish() {
#ifdef TP_MPI
    if (g_procs.n > 1) MPI_CHECK(MPI_Finalize());
#endif
}

// Broadcasts bytes from process 0 to every process (setup: the model, the resumed state), within the timeout.
static void comm_procs_bcast(void* p, size_t bytes, double timeout_s) {
#ifdef TP_MPI
    for (size_t off = 0; g_procs.n > 1 && off < bytes; off += 1 << 30) {
        MPI_Request req;
        int n = (int)std::min(bytes - off, (size_t)1 << 30);
        MPI_LOCKED(MPI_Ibcast((char*)p + off, n, MPI_BYTE, 0, MPI_COMM_WORLD, &req));
        comm_mpi_wait(&req, timeout_s, "the broadcast of the model from process 0");
    }
#else
    (void)p;
    (void)bytes;
    (void)timeout_s;
#endif
}

// Makes the group span every process of the job: P ranks in each. Every process calls it, for its groups
// in the same order (it creates the group's MPI communicator, a collective call).
static void comm_group_span(CommGroup* g) {
    g->nproc = g_procs.n;
    g->proc = g_procs.me;
#ifdef TP_MPI
    if (g->nproc > 1) MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &g->mpi));
#endif
}

// releases what comm_group_span made; every process calls it for its spanning groups in the same order
static void comm_group_free(CommGroup* g) {
#ifdef TP_MPI
    if (g->nproc > 1) MPI_CHECK(MPI_Comm_free(&g->mpi));
#endif
    g->nproc = 1;
    g->proc = 0;
}

// ----------------------------------------------------------------------------
// setup of the GPU backends

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

#ifdef TP_MPI
// The NCCL communicators of a group that spans processes: this process's rank r on device gpus[r].
// Process 0 draws NCCL's unique id and broadcasts it over MPI (NCCL's bootstrap: the id says where to
// meet); then each process creates its ranks' communicators inside one ncclGroupStart/End, as NCCL
// requires when one thread initialises several ranks. Every process calls it, for its groups in the same
// order. NCCL needs each rank of a communicator on its own GPU, across processes too, so the ranks'
// devices are compared first (machine and PCI bus id).
static void comm_nccl_init_procs(CommGroup* g, const int* gpus) {
    struct Dev { char host[64]; char bus[32]; };
    int n = g->P * g->nproc;
    std::vector<Dev> mine(g->P), all(n);
    std::string host = comm_hostname();
    for (int r = 0; r < g->P; r++) {
        snprintf(mine[r].host, sizeof(mine[r].host), "%s", host.c_str());
        CUDA_CHECK(g->proc * g->P + r, cudaDeviceGetPCIBusId(mine[r].bus, sizeof(mine[r].bus), gpus[r]));
    }
    MPI_Request req;
    MPI_LOCKED(MPI_Iallgather(mine.data(), g->P * (int)sizeof(Dev), MPI_BYTE, all.data(), g->P * (int)sizeof(Dev), MPI_BYTE,
                              g->mpi, &req));
    comm_mpi_wait(&req, g->timeout_s, "the exchange of GPU ids before creating NCCL communicators");
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (!strcmp(all[i].host, all[j].host) && !strcmp(all[i].bus, all[j].bus))
                fatal("ranks %d and %d of a data-parallel group would both run on GPU %s of %s, and NCCL needs one GPU per "
                      "rank: start fewer processes on that machine, give them fewer ranks (--dp, --tp), or use --device cpu",
                      i, j, all[i].bus, all[i].host);
    ncclUniqueId id;
    if (g->proc == 0) NCCL_CHECK(0, nullptr, ncclGetUniqueId(&id));
    MPI_LOCKED(MPI_Ibcast(&id, (int)sizeof(id), MPI_BYTE, 0, g->mpi, &req));
    comm_mpi_wait(&req, g->timeout_s, "the broadcast of NCCL's unique id");
    NCCL_CHECK(g->proc * g->P, nullptr, ncclGroupStart());
    for (int r = 0; r < g->P; r++) {
        CUDA_CHECK(g->proc * g->P + r, cudaSetDevice(gpus[r]));
        NCCL_CHECK(g->proc * g->P + r, nullptr, ncclCommInitRank(&g->nccl[r], n, id, g->proc * g->P + r));
    }
    NCCL_CHECK(g->proc * g->P, nullptr, ncclGroupEnd());
    g->log.assign((size_t)g->P * COMM_LOG, CommCall());
    for (int i = 0; i < g->P; i++) {
        g->posted[i] = 0;
        g->gpu[i] = gpus[i];
    }
}
#endif

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
    if (g->nccl[c->local]) {
        c->backend = COMM_NCCL;
        c->nccl = g->nccl[c->local];
        for (int i = 0; i < COMM_EVENTS; i++) {
            CUDA_CHECK(c->rank, cudaEventCreate(&c->ev_start[i]));
            CUDA_CHECK(c->rank, cudaEventCreate(&c->ev_end[i]));
        }
        c->ev_issued = c->ev_done = 0;
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
        comm_abort(c->g, c->rank, why);
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
    if (c->g->sync_each) comm_sync(c);
    else comm_nccl_progress(c, c->ev_issued, false);
}

// Releases what comm_bind_cuda made (events, the device slice, the NCCL communicator) and returns the
// handle to the host backend. Every rank of the group calls it, from its own thread, when done: with
// COMM_CUDA it waits for all ranks first, as another rank may still be copying from this rank's slice.
static void comm_free(Comm* c) {
    if (c->backend == COMM_HOST) return;
    CUDA_CHECK(c->rank, cudaSetDevice(c->gpu));
    comm_sync(c);
    if (c->backend == COMM_NCCL) {
        for (int i = 0; i < COMM_EVENTS; i++) {
            CUDA_CHECK(c->rank, cudaEventDestroy(c->ev_start[i]));
            CUDA_CHECK(c->rank, cudaEventDestroy(c->ev_end[i]));
        }
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
// COMM_CUDA: the shared-memory protocol of the host path, on device buffers

struct CommPtrs {
    const float* p[COMM_MAXP];  // every rank's buffer (same process: valid on this device, or through peer access)
};

// out (len) = the elementwise sum (or max) of src.p[r][lo, lo+len) over r = 0, 1, ..., P-1 in that order,
// the same expression as the host path: bit-identical results. A thread per element.
__global__ void comm_reduce_kernel(CommPtrs src, int P, long lo, long len, int op, float* out) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= len) return;
    float v = src.p[0][lo + i];
    for (int r = 1; r < P; r++) {
        float x = src.p[r][lo + i];
        v = op == COMM_SUM ? v + x : (x > v ? x : v);
    }
    out[i] = v;
}

static void comm_cuda_allreduce(Comm* c, float* buf, long n, int op, const char* where, int layer) {
    CommGroup* g = c->g;
    int P = c->P;
    if (P == 1) {  // nothing to exchange: stay asynchronous (TP=1 on a GPU must not sync per collective)
        comm_begin(c, op, n, buf, where, layer);
        comm_count(c, op, n);
        return;
    }
    // the buffer is published only once the rank's queued work has written it; that wait is compute
    CUDA_CHECK(c->rank, cudaStreamSynchronize(c->stream));
    double t0 = comm_now();
    comm_begin(c, op, n, buf, where, layer);
    comm_wait_all(c, true);  // every buffer is ready
    // reduce-scatter: rank r reduces slice r of everyone's buffer into its device slice
    long lo = n * c->rank / P, hi = n * (c->rank + 1) / P;
    if (hi - lo > c->dchunk_n) {
        // nobody reads the old slice any more: every rank copied it before arriving at this collective
        if (c->dchunk) CUDA_CHECK(c->rank, cudaFree(c->dchunk));
        c->dchunk = nullptr;
        CUDA_CHECK(c->rank, cudaMalloc((void**)&c->dchunk, (size_t)(hi - lo) * sizeof(float)));
        c->dchunk_n = hi - lo;
    }
    if (hi > lo) {
        CommPtrs src;
        for (int r = 0; r < P; r++) src.p[r] = g->call[r].ptr;
        comm_reduce_kernel<<<(unsigned)((hi - lo + 255) / 256), 256, 0, c->stream>>>(src, P, lo, hi - lo, op, c->dchunk);
        CUDA_LAUNCH_CHECK(c->rank, "comm_reduce_kernel");
    }
    CUDA_CHECK(c->rank, cudaStreamSynchronize(c->stream));
    g->dchunk[c->rank] = c->dchunk;  // the wait's mutex publishes it
    comm_wait_all(c, false);         // every slice is reduced
    // all-gather: copy every rank's slice into our buffer. Nobody writes a slice again before the
    // next collective's first wait, which all ranks reach only after these copies have finished.
    for (int r = 0; r < P; r++) {
        long rlo = n * r / P, rhi = n * (r + 1) / P;
        if (rhi > rlo)
            CUDA_CHECK(c->rank, cudaMemcpyAsync(buf + rlo, g->dchunk[r], (size_t)(rhi - rlo) * sizeof(float),
                                                cudaMemcpyDefault, c->stream));
    }
    CUDA_CHECK(c->rank, cudaStreamSynchronize(c->stream));
    comm_count(c, op, n);
    c->seconds += comm_now() - t0;
}

// in (P*n) on every rank; out (n) <- slice `rank` of the rank-order sum. out may be in + rank*n.
static void comm_cuda_reducescatter(Comm* c, float* out, const float* in, long n, const char* where, int layer) {
    CommGroup* g = c->g;
    int P = c->P;
    if (P == 1) {  // the sum over one rank is a copy, on the stream
        comm_begin(c, COMM_SCATTER, n, in, where, layer);
        if (n > 0 && in != out)
            CUDA_CHECK(c->rank, cudaMemcpyAsync(out, in, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, c->stream));
        comm_count(c, COMM_SCATTER, n);
        return;
    }
    CUDA_CHECK(c->rank, cudaStreamSynchronize(c->stream));  // the input is written
    double t0 = comm_now();
    comm_begin(c, COMM_SCATTER, (long)P * n, in, where, layer);
    comm_wait_all(c, true);  // every input is ready
    if (n > 0) {
        CommPtrs src;
        for (int r = 0; r < P; r++) src.p[r] = g->call[r].ptr;
        comm_reduce_kernel<<<(unsigned)((n + 255) / 256), 256, 0, c->stream>>>(src, P, (long)c->rank * n, n, COMM_SUM, out);
        CUDA_LAUNCH_CHECK(c->rank, "comm_reduce_kernel");
    }
    CUDA_CHECK(c->rank, cudaStreamSynchronize(c->stream));
    comm_wait_all(c, false);  // no rank may change its input before everyone has read it
    comm_count(c, COMM_SCATTER, (double)P * n);
    c->seconds += comm_now() - t0;
}

// in must not overlap out, except as out + rank*n (an in-place gather)
static void comm_cuda_allgather(Comm* c, float* out, const float* in, long n, const char* where, int layer) {
    if (c->P == 1) {  // a copy on the stream, asynchronous
        comm_begin(c, COMM_GATHER, n, in, where, layer);
        if (n > 0 && in != out)
            CUDA_CHECK(c->rank, cudaMemcpyAsync(out, in, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, c->stream));
        comm_count(c, COMM_GATHER, n);
        return;
    }
    CUDA_CHECK(c->rank, cudaStreamSynchronize(c->stream));
    double t0 = comm_now();
    comm_begin(c, COMM_GATHER, n, in, where, layer);
    if (c->P > 1) comm_wait_all(c, true);
    for (int r = 0; r < c->P; r++) {
        const float* src = c->g->call[r].ptr;
        float* dst = out + (long)r * n;
        if (n > 0 && src != dst)
            CUDA_CHECK(c->rank, cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyDefault, c->stream));
    }
    CUDA_CHECK(c->rank, cudaStreamSynchronize(c->stream));
    if (c->P > 1) comm_wait_all(c, false);  // no rank may change its input before everyone copied it
    comm_count(c, COMM_GATHER, (double)n * c->P);
    c->seconds += comm_now() - t0;
}

static void comm_cuda_broadcast(Comm* c, float* buf, long n, int root, const char* where) {
    if (c->P == 1) {
        comm_begin(c, COMM_BCAST, n, buf, where, -1);
        comm_count(c, COMM_BCAST, n);
        return;
    }
    CUDA_CHECK(c->rank, cudaStreamSynchronize(c->stream));
    double t0 = comm_now();
    comm_begin(c, COMM_BCAST, n, buf, where, -1);
    if (c->P > 1) {
        comm_wait_all(c, true);
        if (c->rank != root && n > 0)
            CUDA_CHECK(c->rank, cudaMemcpyAsync(buf, c->g->call[root].ptr, (size_t)n * sizeof(float), cudaMemcpyDefault, c->stream));
        CUDA_CHECK(c->rank, cudaStreamSynchronize(c->stream));
        comm_wait_all(c, false);
    }
    comm_count(c, COMM_BCAST, n);
    c->seconds += comm_now() - t0;
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

static void comm_nccl_broadcast(Comm* c, float* buf, long n, int root, const char* where) {
    CommCall k = comm_nccl_post(c, COMM_BCAST, n, buf, where, -1);
    int slot = comm_nccl_begin(c, &k);
    NCCL_CHECK(c->rank, c->nccl, ncclBroadcast(buf, buf, (size_t)n, ncclFloat, root, c->nccl, c->stream));
    comm_nccl_end(c, slot);
    comm_count(c, COMM_BCAST, n);
}

// ----------------------------------------------------------------------------
// the collectives the recipe calls. Buffers live where the rank's backend works: host memory for
// COMM_HOST, the rank's device memory otherwise.

// out (hi - lo) <- elements [lo, hi) of every rank's published buffer, summed (or maxed) in rank order
// 0, 1, ..., P-1: the one reduction of the host backend, so every result is bit-identical on every rank
static void comm_host_reduce(const CommGroup* g, long lo, long hi, int op, float* out) {
    for (long i = lo; i < hi; i++) {
        float v = g->call[0].ptr[i];
        for (int r = 1; r < g->P; r++) {
            float x = g->call[r].ptr[i];
            v = op == COMM_MAX ? (x > v ? x : v) : v + x;
        }
        out[i - lo] = v;
    }
}

#ifdef TP_MPI
// ----------------------------------------------------------------------------
// the host backend across processes. Rank 0 of the group in each process (local 0) talks MPI for the
// process while its other ranks wait in shared memory; every exchange is non-blocking and polled against
// the timeout (comm_mpi_wait). Several groups of a process (one per TP rank, plus the world group) may
// exchange at the same time from different threads: each has its own communicator, and MPI is entered
// under one lock.

// what a process says about its next collective on a group
struct CommWire {
    int32_t op, layer;
    int64_t count, seq;
    char where[48];
};

// Before any data moves, the processes check that they are in the same collective (op, count, place,
// number): an exchange of a few bytes that also makes every collective a barrier across processes. A
// process that issued another collective is named instead of exchanging garbage.
// `what` receives the collective's description, for the messages of the exchange that follows.
static void comm_procs_agree(Comm* c, char* what, size_t n) {
    CommGroup* g = c->g;
    const CommCall* k = &g->call[c->local];
    CommWire mine = {k->op, k->layer, k->count, k->seq, {0}};
    snprintf(mine.where, sizeof(mine.where), "%s", k->where);
    std::vector<CommWire> all(g->nproc);
    comm_describe(k, what, n);
    MPI_Request req;
    MPI_LOCKED(MPI_Iallgather(&mine, (int)sizeof(mine), MPI_BYTE, all.data(), (int)sizeof(mine), MPI_BYTE, g->mpi, &req));
    comm_mpi_wait(&req, g->timeout_s, what);
    for (int p = 0; p < g->nproc; p++) {
        const CommWire* o = &all[p];
        if (o->op != mine.op || o->layer != mine.layer || o->count != mine.count || o->seq != mine.seq || strcmp(o->where, mine.where)) {
            CommCall other = {o->op, (long)o->count, o->where, o->layer, (long)o->seq, nullptr};
            char theirs[320];
            comm_describe(&other, theirs, sizeof(theirs));
            fatal("collective mismatch between processes: this process issued %s where process %d issued %s; every process "
                  "must issue the same collectives in the same order", what, p, theirs);
        }
    }
}

// x (n): this process's partial result on entry, the result on every process on return: the elementwise
// sum (or max) of the processes' partials in process order. A reduce-scatter (process s receives slice
// s of every partial and reduces it) and an all-gather of the reduced slices, as a ring all-reduce
// moves: 2 (N-1)/N n floats in and out of each process, and every process ends with the same bits.
static void comm_procs_allreduce(CommGroup* g, float* x, long n, int op, const char* what) {
    int N = g->nproc, me = g->proc;
    std::vector<int> cnt(N), dsp(N), rcnt(N), rdsp(N);
    for (int s = 0; s < N; s++) {
        dsp[s] = comm_mpi_count(n * s / N);
        cnt[s] = comm_mpi_count(n * (s + 1) / N) - dsp[s];
    }
    long mine = cnt[me];
    g->xrecv.resize(std::max(1L, N * mine));
    for (int q = 0; q < N; q++) {
        rcnt[q] = (int)mine;
        rdsp[q] = comm_mpi_count(q * mine);
    }
    MPI_Request req;
    MPI_LOCKED(MPI_Ialltoallv(x, cnt.data(), dsp.data(), MPI_FLOAT, g->xrecv.data(), rcnt.data(), rdsp.data(), MPI_FLOAT, g->mpi, &req));
    comm_mpi_wait(&req, g->timeout_s, what);
    const float* in = g->xrecv.data();
    for (long i = 0; i < mine; i++) {
        float v = in[i];
        for (int q = 1; q < N; q++) {
            float y = in[q * mine + i];
            v = op == COMM_MAX ? (y > v ? y : v) : v + y;
        }
        x[dsp[me] + i] = v;
    }
    MPI_LOCKED(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x, cnt.data(), dsp.data(), MPI_FLOAT, g->mpi, &req));
    comm_mpi_wait(&req, g->timeout_s, what);
}

// in (N*blk): this process's partial of the whole input. On return g->xrecv[0, blk) holds block `proc`
// of the process-order sum: process s receives block s of every partial (an all-to-all) and adds them.
static void comm_procs_reducescatter(CommGroup* g, const float* in, long blk, const char* what) {
    int N = g->nproc;
    int cnt = comm_mpi_count(blk);
    comm_mpi_count(N * blk);
    g->xrecv.resize(std::max(1L, N * blk));
    MPI_Request req;
    MPI_LOCKED(MPI_Ialltoall(in, cnt, MPI_FLOAT, g->xrecv.data(), cnt, MPI_FLOAT, g->mpi, &req));
    comm_mpi_wait(&req, g->timeout_s, what);
    float* r = g->xrecv.data();
    for (long i = 0; i < blk; i++) {
        float v = r[i];
        for (int q = 1; q < N; q++) v += r[q * blk + i];
        r[i] = v;
    }
}

// The collectives of comm_allreduce ... comm_barrier for a host group that spans processes: first among
// the process's ranks in shared memory, then local rank 0 over MPI, then back to every local rank.
static void comm_procs_collective_allreduce(Comm* c, float* buf, long n, int op, const char* where, int layer) {
    double t0 = comm_now();
    CommGroup* g = c->g;
    int P = g->P, me = c->local;
    comm_begin(c, op, n, buf, where, layer);
    float* part = buf;  // this process's partial: with one rank here, the rank's own buffer
    if (P > 1) {
        comm_wait_all(c, true);  // every buffer is ready
        long lo = n * me / P, hi = n * (me + 1) / P;  // rank r reduces slice r of the process's buffers
        std::vector<float>& out = g->chunk[me];
        if ((long)out.size() < hi - lo) out.resize(hi - lo);
        comm_host_reduce(g, lo, hi, op, out.data());
        comm_wait_all(c, false);  // every slice is reduced
    }
    if (me == 0) {
        if (P > 1) {
            g->xsend.resize(std::max(1L, n));
            part = g->xsend.data();
            for (int r = 0; r < P; r++) {
                long rlo = n * r / P, rhi = n * (r + 1) / P;
                if (rhi > rlo) memcpy(part + rlo, g->chunk[r].data(), (rhi - rlo) * sizeof(float));
            }
        }
        char what[320];
        comm_procs_agree(c, what, sizeof(what));
        comm_procs_allreduce(g, part, n, op, what);
    }
    if (P > 1) {
        comm_wait_all(c, false);  // the result is in
        memcpy(buf, g->xsend.data(), n * sizeof(float));
    }
    comm_count(c, op, n);
    c->seconds += comm_now() - t0;
}

static void comm_procs_collective_reducescatter(Comm* c, float* out, const float* in, long n, const char* where, int layer) {
    double t0 = comm_now();
    CommGroup* g = c->g;
    int P = g->P, me = c->local;
    long total = (long)c->P * n;
    comm_begin(c, COMM_SCATTER, total, in, where, layer);
    if (P > 1) {
        comm_wait_all(c, true);  // every input is ready
        long lo = total * me / P, hi = total * (me + 1) / P;  // this process's partial of the whole input, in slices
        std::vector<float>& part = g->chunk[me];
        if ((long)part.size() < hi - lo) part.resize(hi - lo);
        comm_host_reduce(g, lo, hi, COMM_SUM, part.data());
        comm_wait_all(c, false);  // every slice is reduced
    }
    if (me == 0) {
        const float* part = in;
        if (P > 1) {
            g->xsend.resize(std::max(1L, total));
            for (int r = 0; r < P; r++) {
                long rlo = total * r / P, rhi = total * (r + 1) / P;
                if (rhi > rlo) memcpy(g->xsend.data() + rlo, g->chunk[r].data(), (rhi - rlo) * sizeof(float));
            }
            part = g->xsend.data();
        }
        char what[320];
        comm_procs_agree(c, what, sizeof(what));
        comm_procs_reducescatter(g, part, (long)P * n, what);  // this process's ranks' blocks
    }
    if (P > 1) comm_wait_all(c, false);  // the blocks are in; every input has been read
    memcpy(out, g->xrecv.data() + (long)me * n, n * sizeof(float));
    comm_count(c, COMM_SCATTER, (double)total);
    c->seconds += comm_now() - t0;
}

static void comm_procs_collective_allgather(Comm* c, float* out, const float* in, long n, const char* where, int layer) {
    double t0 = comm_now();
    CommGroup* g = c->g;
    int P = g->P, me = c->local;
    comm_begin(c, COMM_GATHER, n, in, where, layer);
    if (P > 1) comm_wait_all(c, true);  // every input is ready
    if (me == 0) {
        const float* part = in;
        if (P > 1) {
            g->xsend.resize(std::max(1L, (long)P * n));
            for (int r = 0; r < P; r++) memcpy(g->xsend.data() + (long)r * n, g->call[r].ptr, n * sizeof(float));
            part = g->xsend.data();
        }
        char what[320];
        comm_procs_agree(c, what, sizeof(what));
        int cnt = comm_mpi_count((long)P * n);
        comm_mpi_count((long)c->P * n);
        g->xrecv.resize(std::max(1L, (long)c->P * n));
        MPI_Request req;
        MPI_LOCKED(MPI_Iallgather(part, cnt, MPI_FLOAT, g->xrecv.data(), cnt, MPI_FLOAT, g->mpi, &req));
        comm_mpi_wait(&req, g->timeout_s, what);
    }
    if (P > 1) comm_wait_all(c, false);  // every input has been read, the result is in
    memcpy(out, g->xrecv.data(), (long)c->P * n * sizeof(float));
    comm_count(c, COMM_GATHER, (double)n * c->P);
    c->seconds += comm_now() - t0;
}

static void comm_procs_collective_broadcast(Comm* c, float* buf, long n, int root, const char* where) {
    double t0 = comm_now();
    CommGroup* g = c->g;
    int P = g->P, me = c->local, root_proc = root / P;
    comm_begin(c, COMM_BCAST, n, buf, where, -1);
    if (P > 1) comm_wait_all(c, true);
    if (me == 0) {
        g->xsend.resize(std::max(1L, n));
        if (g->proc == root_proc) memcpy(g->xsend.data(), g->call[root % P].ptr, n * sizeof(float));
        char what[320];
        comm_procs_agree(c, what, sizeof(what));
        MPI_Request req;
        MPI_LOCKED(MPI_Ibcast(g->xsend.data(), comm_mpi_count(n), MPI_FLOAT, root_proc, g->mpi, &req));
        comm_mpi_wait(&req, g->timeout_s, what);
    }
    if (P > 1) comm_wait_all(c, false);
    if (c->rank != root) memcpy(buf, g->xsend.data(), n * sizeof(float));
    comm_count(c, COMM_BCAST, n);
    c->seconds += comm_now() - t0;
}

static void comm_procs_collective_barrier(Comm* c, const char* where) {
    comm_begin(c, COMM_BARRIER, 0, nullptr, where, -1);
    if (c->g->P > 1) comm_wait_all(c, true);
    char what[320];
    if (c->local == 0) comm_procs_agree(c, what, sizeof(what));  // every process takes part: a barrier
    if (c->g->P > 1) comm_wait_all(c, false);
}
#endif

// buf (n) on every rank <- the elementwise sum (or max) of buf over ranks 0..P-1, in that order
// (COMM_NCCL: in NCCL's order, the same result on every rank)
static void comm_allreduce(Comm* c, float* buf, long n, int op, const char* where, int layer) {
    if (c->backend == COMM_CUDA) { comm_cuda_allreduce(c, buf, n, op, where, layer); return; }
    if (c->backend == COMM_NCCL) { comm_nccl_allreduce(c, buf, n, op, where, layer); return; }
#ifdef TP_MPI
    if (c->g->nproc > 1) { comm_procs_collective_allreduce(c, buf, n, op, where, layer); return; }
#endif
    double t0 = comm_now();
    CommGroup* g = c->g;
    int P = c->P;
    comm_begin(c, op, n, buf, where, layer);
    if (P > 1) {
        comm_wait_all(c, true);  // every buffer is ready
        // a reduce-scatter in shared memory: rank r reduces slice r of everyone's buffer
        long lo = n * c->rank / P, hi = n * (c->rank + 1) / P;
        std::vector<float>& out = g->chunk[c->rank];
        if ((long)out.size() < hi - lo) out.resize(hi - lo);
        comm_host_reduce(g, lo, hi, op, out.data());
        comm_wait_all(c, false);  // every slice is reduced
        // then an all-gather: copy every rank's slice back into our buffer. Nobody writes a slice again
        // before the next collective's first wait, which all ranks reach only after this copy.
        for (int r = 0; r < P; r++) {
            long rlo = n * r / P, rhi = n * (r + 1) / P;
            if (rhi > rlo) memcpy(buf + rlo, g->chunk[r].data(), (rhi - rlo) * sizeof(float));
        }
    }
    comm_count(c, op, n);
    c->seconds += comm_now() - t0;
}

// in (P*n) on every rank; out (n) on rank r <- slice r (elements [r*n, (r+1)*n)) of the elementwise sum
// of in over ranks 0..P-1, in that order. out may be in + r*n (in place), as NCCL allows.
static void comm_reducescatter(Comm* c, float* out, const float* in, long n, const char* where, int layer) {
    if (c->backend == COMM_CUDA) { comm_cuda_reducescatter(c, out, in, n, where, layer); return; }
    if (c->backend == COMM_NCCL) { comm_nccl_reducescatter(c, out, in, n, where, layer); return; }
#ifdef TP_MPI
    if (c->g->nproc > 1) { comm_procs_collective_reducescatter(c, out, in, n, where, layer); return; }
#endif
    double t0 = comm_now();
    int P = c->P;
    comm_begin(c, COMM_SCATTER, (long)P * n, in, where, layer);
    if (P > 1) comm_wait_all(c, true);  // every input is ready
    // element i of the slice reads every rank's element i before this rank writes out[i]; other ranks
    // read only their own slices of this rank's input, so writing in place is safe
    comm_host_reduce(c->g, (long)c->rank * n, (long)(c->rank + 1) * n, COMM_SUM, out);
    if (P > 1) comm_wait_all(c, false);  // no rank may change its input before everyone has read it
    comm_count(c, COMM_SCATTER, (double)P * n);
    c->seconds += comm_now() - t0;
}

// out (P*n) on every rank <- the concatenation of every rank's in (n), rank 0 first. in must not overlap
// out, except as out + rank*n (in place: the rank's own slice is already there), as NCCL allows.
static void comm_allgather(Comm* c, float* out, const float* in, long n, const char* where, int layer) {
    if (c->backend == COMM_CUDA) { comm_cuda_allgather(c, out, in, n, where, layer); return; }
    if (c->backend == COMM_NCCL) { comm_nccl_allgather(c, out, in, n, where, layer); return; }
#ifdef TP_MPI
    if (c->g->nproc > 1) { comm_procs_collective_allgather(c, out, in, n, where, layer); return; }
#endif
    double t0 = comm_now();
    comm_begin(c, COMM_GATHER, n, in, where, layer);
    if (c->P > 1) comm_wait_all(c, true);
    for (int r = 0; r < c->P; r++) {
        float* dst = out + (long)r * n;
        if (dst != c->g->call[r].ptr) memcpy(dst, c->g->call[r].ptr, n * sizeof(float));  // in place: nothing to copy
    }
    if (c->P > 1) comm_wait_all(c, false);  // no rank may change its input before everyone copied it
    comm_count(c, COMM_GATHER, (double)n * c->P);
    c->seconds += comm_now() - t0;
}

// buf (n) on every rank <- buf of rank root
static void comm_broadcast(Comm* c, float* buf, long n, int root, const char* where) {
    if (c->backend == COMM_CUDA) { comm_cuda_broadcast(c, buf, n, root, where); return; }
    if (c->backend == COMM_NCCL) { comm_nccl_broadcast(c, buf, n, root, where); return; }
#ifdef TP_MPI
    if (c->g->nproc > 1) { comm_procs_collective_broadcast(c, buf, n, root, where); return; }
#endif
    double t0 = comm_now();
    comm_begin(c, COMM_BCAST, n, buf, where, -1);
    if (c->P > 1) {
        comm_wait_all(c, true);
        if (c->rank != root) memcpy(buf, c->g->call[root].ptr, n * sizeof(float));
        comm_wait_all(c, false);
    }
    comm_count(c, COMM_BCAST, n);
    c->seconds += comm_now() - t0;
}

// every rank arrives before any leaves; on the GPU backends the rank's queued work is finished first.
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
    if (c->backend == COMM_CUDA) CUDA_CHECK(c->rank, cudaStreamSynchronize(c->stream));
    comm_begin(c, COMM_BARRIER, 0, nullptr, where, -1);
    if (c->P > 1) comm_wait_all(c, true);
}
