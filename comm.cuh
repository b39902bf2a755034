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
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#define COMM_MAXP 64

enum CommOp { COMM_SUM, COMM_MAX, COMM_GATHER, COMM_BCAST, COMM_BARRIER };
static const char* comm_op_name(int op) {
    static const char* names[] = {"all-reduce(sum)", "all-reduce(max)", "all-gather", "broadcast", "barrier"};
    return names[op];
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

// shared by the P ranks of one run
struct CommGroup {
    int P;
    double timeout_s;
    std::mutex mu;
    std::condition_variable cv;
    int arrived;
    long generation;
    CommCall call[COMM_MAXP];
    bool waiting[COMM_MAXP];
    std::vector<float> chunk[COMM_MAXP];  // rank r's reduced slice of the current all-reduce
};

// one rank's handle, with its counters
struct Comm {
    CommGroup* g;
    int rank, P;
    long seq;
    double values;   // floats moved through collectives (the payload, counted once per collective)
    double seconds;  // wall time spent inside collectives, waiting for other ranks included
};

static void comm_group_init(CommGroup* g, int P, double timeout_s) {
    if (P < 1 || P > COMM_MAXP) {
        fprintf(stderr, "error: --tp %d is out of range: the shared-memory backend supports 1 to %d ranks\n", P, COMM_MAXP);
        exit(1);
    }
    g->P = P;
    g->timeout_s = timeout_s;
    g->arrived = 0;
    g->generation = 0;
    memset(g->call, 0, sizeof(g->call));
    memset(g->waiting, 0, sizeof(g->waiting));
}

static void comm_init(Comm* c, CommGroup* g, int rank) {
    c->g = g;
    c->rank = rank;
    c->P = g->P;
    c->seq = 0;
    c->values = 0;
    c->seconds = 0;
}

static void comm_describe(const CommCall* k, char* buf, size_t n) {
    if (k->layer >= 0) snprintf(buf, n, "#%ld %s of %ld floats at %s (layer %d)", k->seq, comm_op_name(k->op), k->count, k->where, k->layer);
    else snprintf(buf, n, "#%ld %s of %ld floats at %s", k->seq, comm_op_name(k->op), k->count, k->where);
}

// Prints where every rank is and ends the process: the other ranks may be blocked for good, so there is
// nothing to unwind to.
static void comm_abort(CommGroup* g, int rank, const char* why) {
    fprintf(stderr, "error: rank %d: %s; the ranks' collectives:\n", rank, why);
    for (int r = 0; r < g->P; r++) {
        char d[256];
        comm_describe(&g->call[r], d, sizeof(d));
        fprintf(stderr, "  rank %d %s %s\n", r, g->waiting[r] ? "waits in" : "last issued", d);
    }
    fprintf(stderr, "error: every rank must issue the same collectives in the same order; this is a bug in the recipe\n");
    fflush(stderr);
    _Exit(1);
}

// Waits until all P ranks arrive. The last to arrive checks that every rank is in the same collective.
static void comm_wait_all(Comm* c, bool check) {
    CommGroup* g = c->g;
    std::unique_lock<std::mutex> lock(g->mu);
    long gen = g->generation;
    g->waiting[c->rank] = true;
    if (++g->arrived == g->P) {
        if (check) {
            const CommCall* a = &g->call[0];
            for (int r = 1; r < g->P; r++) {
                const CommCall* b = &g->call[r];
                if (a->op != b->op || a->count != b->count || a->seq != b->seq || a->layer != b->layer ||
                    strcmp(a->where, b->where) != 0)
                    comm_abort(g, c->rank, "collective mismatch");
            }
        }
        g->arrived = 0;
        g->generation++;
        for (int r = 0; r < g->P; r++) g->waiting[r] = false;
        g->cv.notify_all();
        return;
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(g->timeout_s);
    while (g->generation == gen) {
        if (g->cv.wait_until(lock, deadline) == std::cv_status::timeout && g->generation == gen) {
            char why[128];
            snprintf(why, sizeof(why), "waited %.0f s for the other ranks (--timeout)", g->timeout_s);
            comm_abort(g, c->rank, why);
        }
    }
}

static void comm_begin(Comm* c, int op, long count, const float* ptr, const char* where, int layer) {
    CommCall* k = &c->g->call[c->rank];
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

// buf (n) on every rank <- the elementwise sum (or max) of buf over ranks 0..P-1, in that order
static void comm_allreduce(Comm* c, float* buf, long n, int op, const char* where, int layer) {
    double t0 = comm_now();
    CommGroup* g = c->g;
    int P = c->P;
    comm_begin(c, op, n, buf, where, layer);
    if (P > 1) {
        comm_wait_all(c, true);  // every buffer is ready
        // reduce-scatter in shared memory: rank r reduces slice r of everyone's buffer
        long lo = n * c->rank / P, hi = n * (c->rank + 1) / P;
        std::vector<float>& out = g->chunk[c->rank];
        if ((long)out.size() < hi - lo) out.resize(hi - lo);
        for (long i = lo; i < hi; i++) {
            float v = g->call[0].ptr[i];
            for (int r = 1; r < P; r++) {
                float x = g->call[r].ptr[i];
                v = op == COMM_SUM ? v + x : (x > v ? x : v);
            }
            out[i - lo] = v;
        }
        comm_wait_all(c, false);  // every slice is reduced
        // all-gather: copy every rank's slice back into our buffer. Nobody writes a slice again before
        // the next collective's first wait, which all ranks reach only after this copy.
        for (int r = 0; r < P; r++) {
            long rlo = n * r / P, rhi = n * (r + 1) / P;
            memcpy(buf + rlo, g->chunk[r].data(), (rhi - rlo) * sizeof(float));
        }
    }
    c->values += n;
    c->seconds += comm_now() - t0;
}

// out (P*n) on every rank <- the concatenation of every rank's in (n), rank 0 first
static void comm_allgather(Comm* c, float* out, const float* in, long n, const char* where) {
    double t0 = comm_now();
    comm_begin(c, COMM_GATHER, n, in, where, -1);
    if (c->P > 1) comm_wait_all(c, true);
    for (int r = 0; r < c->P; r++) memmove(out + (long)r * n, c->g->call[r].ptr, n * sizeof(float));
    if (c->P > 1) comm_wait_all(c, false);  // no rank may change its input before everyone copied it
    c->values += (double)n * c->P;
    c->seconds += comm_now() - t0;
}

// buf (n) on every rank <- buf of rank root
static void comm_broadcast(Comm* c, float* buf, long n, int root, const char* where) {
    double t0 = comm_now();
    comm_begin(c, COMM_BCAST, n, buf, where, -1);
    if (c->P > 1) {
        comm_wait_all(c, true);
        if (c->rank != root) memcpy(buf, c->g->call[root].ptr, n * sizeof(float));
        comm_wait_all(c, false);
    }
    c->values += n;
    c->seconds += comm_now() - t0;
}

static void comm_barrier(Comm* c, const char* where) {
    comm_begin(c, COMM_BARRIER, 0, nullptr, where, -1);
    if (c->P > 1) comm_wait_all(c, true);
}
