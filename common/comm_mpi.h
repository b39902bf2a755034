// common/comm_mpi.h: the processes of an mpirun job, for comm.cuh. How many there are and which one this
// is (g_procs), MPI's start and end, the broadcast of setup data from process 0, the groups that span
// processes (an MPI communicator each), NCCL's bootstrap across processes (its unique id over MPI), and
// the host collectives across processes. Without TP_MPI (no MPI at build time) only the one-process
// parts remain.
// Part of comm.cuh, which includes it after its shared-memory protocol; not a header of its own.
//
// A host collective that spans processes first reduces inside each process in rank order, then one
// thread of each process exchanges the process's partial result over MPI, and every process sums the
// partials in process order: the same bits everywhere, on every run. Every MPI wait is polled against the
// group's timeout, so a process that died is reported instead of hanging the others.
#pragma once

// ----------------------------------------------------------------------------
// the processes

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

// Polls a non-blocking MPI operation until it completes (true) or the deadline (comm_now's clock) passes
// (false), yielding, then sleeping, between tests: a waiting thread leaves the cores to the ones with work.
static bool comm_mpi_poll(MPI_Request* req, double deadline) {
    for (int spins = 0;; spins++) {
        int done = 0;
        MPI_LOCKED(MPI_Test(req, &done, MPI_STATUS_IGNORE));
        if (done) return true;
        if (comm_now() > deadline) return false;
        if (spins < 100) std::this_thread::yield();
        else std::this_thread::sleep_for(std::chrono::microseconds(spins < 10000 ? 20 : 200));
    }
}

// Waits for a non-blocking MPI operation by polling it, so that a process that died or stopped issuing
// collectives is reported after the timeout instead of hanging every other process with it.
static void comm_mpi_wait(MPI_Request* req, double timeout_s, const char* what) {
    if (!comm_mpi_poll(req, comm_now() + timeout_s))
        fatal("waited %g s (--timeout) for the other processes in %s: a process died or stopped issuing collectives",
              timeout_s, what);
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
    if (g->nproc > 1) {
        MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &g->mpi));
        g->mpi_sent.resize(g->P);
    }
#endif
}

// Makes the group span the processes that call it with the same color, P ranks in each, in the order of
// their keys (a replica's pipeline over the processes that hold its stages, a stage's data-parallel group
// over the replicas). Every process calls it for every such group in the same order, as MPI_Comm_split
// is collective over the job; a process that holds no rank of the group passes color -1.
static void comm_group_span_some(CommGroup* g, int color, int key) {
#ifdef TP_MPI
    if (g_procs.n == 1) return;
    MPI_Comm part;
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, color < 0 ? MPI_UNDEFINED : color, key, &part));
    if (part == MPI_COMM_NULL) return;
    int n = 1, me = 0;
    MPI_CHECK(MPI_Comm_size(part, &n));
    MPI_CHECK(MPI_Comm_rank(part, &me));
    if (n == 1) {  // only this process: the group stays inside it
        MPI_CHECK(MPI_Comm_free(&part));
        return;
    }
    g->nproc = n;
    g->proc = me;
    g->mpi = part;
    g->mpi_sent.resize(g->P);
#else
    (void)g;
    (void)color;
    (void)key;
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
// NCCL across processes

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


#ifdef TP_MPI
// ----------------------------------------------------------------------------
// the host backend across processes. Rank 0 of the group in each process (local 0) talks MPI for the
// process while its other ranks wait in shared memory; every exchange is non-blocking and polled against
// the timeout (comm_mpi_wait). Several groups of a process (one per TP rank, plus the world group) may
// exchange at the same time from different threads: each has its own communicator, and MPI is entered
// under one lock.

// what a process says about its next collective on a group
struct CommWire {
    int32_t op, layer, bf16, pad;
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
    CommWire mine = {k->op, k->layer, k->bf16, 0, k->count, k->seq, {0}};
    snprintf(mine.where, sizeof(mine.where), "%s", k->where);
    std::vector<CommWire> all(g->nproc);
    comm_describe(k, what, n);
    size_t len = strlen(what);
    if (g->label[0] && len < n) snprintf(what + len, n - len, " between %s", g->label);  // e.g. the pipeline's two ends
    MPI_Request req;
    MPI_LOCKED(MPI_Iallgather(&mine, (int)sizeof(mine), MPI_BYTE, all.data(), (int)sizeof(mine), MPI_BYTE, g->mpi, &req));
    comm_mpi_wait(&req, g->timeout_s, what);
    for (int p = 0; p < g->nproc; p++) {
        const CommWire* o = &all[p];
        if (o->op != mine.op || o->layer != mine.layer || o->bf16 != mine.bf16 || o->count != mine.count || o->seq != mine.seq ||
            strcmp(o->where, mine.where)) {
            CommCall other = {o->op, (long)o->count, o->bf16 != 0, o->where, o->layer, (long)o->seq, nullptr};
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

// The collectives of comm_allreduce ... comm_barrier for a host group that spans processes: first the
// reduce-scatter half of the shared-memory protocol among the process's ranks (comm.cuh), then local rank
// 0 joins the process's slices into its partial result and exchanges it over MPI while the others wait,
// then every local rank takes its part of the result.
static void comm_procs_collective_allreduce(Comm* c, float* buf, long n, int op, const char* where, int layer) {
    double t0 = comm_now();
    CommGroup* g = c->g;
    int P = g->P, me = c->local;
    comm_begin(c, op, n, buf, where, layer);
    if (P > 1) {
        comm_wait_all(c, true);  // every buffer is ready
        shm_reduce_slices(c, n, op);
        comm_wait_all(c, false);  // every slice is reduced
    }
    if (me == 0) {
        float* part = buf;  // this process's partial: with one rank here, the rank's own buffer
        if (P > 1) {
            g->xsend.resize(std::max(1L, n));
            part = g->xsend.data();
            shm_gather_slices(c, n, part);
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
        shm_reduce_slices(c, total, COMM_SUM);  // this process's partial of the whole input, in slices
        comm_wait_all(c, false);  // every slice is reduced
    }
    if (me == 0) {
        const float* part = in;
        if (P > 1) {
            g->xsend.resize(std::max(1L, total));
            shm_gather_slices(c, total, g->xsend.data());
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

static void comm_procs_collective_barrier(Comm* c, const char* where) {
    comm_begin(c, COMM_BARRIER, 0, nullptr, where, -1);
    if (c->g->P > 1) comm_wait_all(c, true);
    char what[320];
    if (c->local == 0) comm_procs_agree(c, what, sizeof(what));  // every process takes part: a barrier
    if (c->g->P > 1) comm_wait_all(c, false);
}
#endif


#ifdef TP_MPI
// ----------------------------------------------------------------------------
// point to point across processes: comm_send and comm_recv between ranks of a group in different
// processes (neighbouring pipeline stages). The header (what, micro-batch, count) and the data go as two
// MPI messages on the pair's own tag (sender's rank x group size + receiver's), which MPI delivers in
// order; the receiver checks the header before it takes the data, as inside a process.

// forgets the sends MPI has finished
static void comm_mpi_sent_reap(std::list<CommMpiSend>* sent) {
    for (auto it = sent->begin(); it != sent->end();) {
        int done = 0;
        MPI_LOCKED(MPI_Testall(2, it->req, &done, MPI_STATUSES_IGNORE));
        it = done ? sent->erase(it) : std::next(it);
    }
}

// Starts the send of msg (its data moves into the rank's list of sends in flight) to group rank dst of
// another process, and returns at once.
static void comm_mpi_send(Comm* c, int dst, CommMsg* msg) {
    CommGroup* g = c->g;
    std::list<CommMpiSend>* sent = &g->mpi_sent[c->local];
    comm_mpi_sent_reap(sent);
    sent->emplace_back();
    CommMpiSend* s = &sent->back();
    s->dst = dst;
    s->head.tag = msg->tag;
    s->head.n = (int64_t)msg->data.size();
    snprintf(s->head.where, sizeof(s->head.where), "%s", msg->where);
    s->data = std::move(msg->data);
    int peer = dst / g->P, tag = c->rank * c->P + dst;
    MPI_LOCKED(MPI_Isend(&s->head, (int)sizeof(s->head), MPI_BYTE, peer, tag, g->mpi, &s->req[0]));
    MPI_LOCKED(MPI_Isend(s->data.data(), comm_mpi_count((long)s->data.size()), MPI_FLOAT, peer, tag, g->mpi, &s->req[1]));
}

// Receives the next message from group rank src of another process into msg (its data and tag) and where
// (its place), within the timeout.
static void comm_mpi_recv(Comm* c, int src, CommMsg* msg, char* where, size_t nwhere, const char* want, int want_tag) {
    CommGroup* g = c->g;
    int peer = src / g->P, tag = src * c->P + c->rank;
    double deadline = comm_now() + g->timeout_s;
    CommWireMsg head;
    MPI_Request req;
    MPI_LOCKED(MPI_Irecv(&head, (int)sizeof(head), MPI_BYTE, peer, tag, g->mpi, &req));
    if (!comm_mpi_poll(&req, deadline)) comm_p2p_timeout(c, src, want, want_tag);
    head.where[sizeof(head.where) - 1] = '\0';
    snprintf(where, nwhere, "%s", head.where);
    msg->tag = head.tag;
    msg->n = (long)head.n;
    msg->data.resize((size_t)std::max<int64_t>(0, head.n));
    MPI_LOCKED(MPI_Irecv(msg->data.data(), comm_mpi_count((long)msg->data.size()), MPI_FLOAT, peer, tag, g->mpi, &req));
    if (!comm_mpi_poll(&req, deadline + g->timeout_s)) comm_p2p_timeout(c, src, want, want_tag);
}

// waits within the timeout until every send of this rank to another process has left
static void comm_mpi_sent_finish(Comm* c) {
    std::list<CommMpiSend>* sent = &c->g->mpi_sent[c->local];
    double deadline = comm_now() + c->g->timeout_s;
    for (CommMpiSend& s : *sent)
        for (int i = 0; i < 2; i++)
            if (!comm_mpi_poll(&s.req[i], deadline))
                fatal("stage %d, TP rank %d: %s of micro-batch %d was not received by stage %d within %g s (--timeout)", c->rank,
                      c->tp_rank, s.head.where, s.head.tag, s.dst, c->g->timeout_s);
    sent->clear();
}
#endif

// Process 0 of group g (a group over every process, e.g. the world) receives from each process q in
// 1 .. spans.size() - 1 the spans spans[q] of its copy of `full` and writes them into its own; those
// processes send theirs, the others do nothing. After a gather that filled in each process only what its
// ranks hold (a replica's pipeline stages spread over processes), process 0 then holds the whole. One
// thread per process calls it; `what` names the tensors for the messages.
static void comm_procs_collect(CommGroup* g, float* full, const std::vector<std::vector<CommSpan>>& spans, const char* what) {
#ifdef TP_MPI
    int nq = (int)spans.size();
    if (g->nproc == 1 || g->proc >= nq) return;
    std::vector<float> packed;
    MPI_Request req;
    for (int q = 1; q < nq; q++) {  // process q's spans, packed one after another
        if (g->proc != 0 && g->proc != q) continue;
        long total = 0;
        for (const CommSpan& sp : spans[q]) total += sp.n;
        packed.resize((size_t)std::max(1L, total));
        if (g->proc == q) {  // this process: send its spans to process 0
            long at = 0;
            for (const CommSpan& sp : spans[q]) {
                memcpy(packed.data() + at, full + sp.off, sp.n * sizeof(float));
                at += sp.n;
            }
            MPI_LOCKED(MPI_Isend(packed.data(), comm_mpi_count(total), MPI_FLOAT, 0, 0, g->mpi, &req));
            comm_mpi_wait(&req, g->timeout_s, what);
            continue;
        }
        MPI_LOCKED(MPI_Irecv(packed.data(), comm_mpi_count(total), MPI_FLOAT, q, 0, g->mpi, &req));  // process 0
        comm_mpi_wait(&req, g->timeout_s, what);
        long at = 0;
        for (const CommSpan& sp : spans[q]) {
            memcpy(full + sp.off, packed.data() + at, sp.n * sizeof(float));
            at += sp.n;
        }
    }
#else
    (void)g;
    (void)full;
    (void)spans;
    (void)what;
#endif
}
