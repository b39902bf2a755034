// nccl.cpp: NCCL of the emulated GPU, for ranks that are threads of one process (each with a communicator
// on its own device), as tp runs them.
//
// A collective is a stream operation on the rank's stream, numbered by its communicator (the n-th call on
// every rank is the same collective). When a rank's stream reaches it, the rank arrives and its arguments
// are checked against the ranks already there: a different op, count, type, reduction or root is reported
// instead of hanging or computing garbage. The last rank to arrive reduces every rank's send buffer in rank
// order into a temporary (so in-place buffers work and results are identical on all ranks); each rank then
// copies its part out when its stream runs the operation to the end. A query on a stream whose collective
// still waits for peers returns cudaErrorNotReady, so tp's polling hang check keeps working; a blocking
// wait also runs the peers' streams (a single thread may drive several communicators in a group) and
// reports a hang after TP_EMU_HANG_S seconds.
#include "emu.h"
#include "fake_cuda/nccl.h"
#include <algorithm>
#include <map>
#include <unistd.h>

using namespace emu;

namespace {
constexpr uint32_t COMM_MAGIC = 0x4e43434cu;
enum Kind { K_ALLREDUCE, K_BROADCAST, K_ALLGATHER, K_REDUCESCATTER };
const char* kind_name(int k) {
    static const char* n[] = {"ncclAllReduce", "ncclBroadcast", "ncclAllGather", "ncclReduceScatter"};
    return n[k];
}
const char* type_name(int t) {
    static const char* n[] = {"ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64", "?", "ncclFloat32", "ncclFloat64"};
    return t >= 0 && t <= 8 ? n[t] : "?";
}
size_t type_size(int t) {
    switch (t) {
        case ncclInt8: case ncclUint8: return 1;
        case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
        case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
        default: return 0;
    }
}
const char* op_name(int op) {
    static const char* n[] = {"ncclSum", "ncclProd", "ncclMax", "ncclMin", "ncclAvg"};
    return op >= 0 && op <= 4 ? n[op] : "?";
}

struct Coll {  // one collective, as the ranks arrive at it
    int kind, type, op, root;
    size_t count;
    int arrived, copied, first;
    std::vector<const void*> send;
    std::vector<void*> recv;
    std::vector<char> has;
    std::vector<char> tmp;  // the result
    bool ready;
};

struct Clique {  // the communicators created together
    int n;
    std::mutex mu;
    std::condition_variable cv;
    std::vector<ncclComm*> comms;
    int joined;
    bool aborted;
    std::map<uint64_t, Coll*> colls;
};

std::mutex g_ids_mu;
std::map<std::string, Clique*> g_ids;
thread_local char t_last[512];
thread_local int t_group;
thread_local std::vector<ncclComm*> t_group_inits;
}  // namespace

struct ncclComm {
    uint32_t magic;
    Clique* cl;
    int rank, n, device;
    uint64_t seq;
    bool destroyed;
    ncclResult_t async;
    Stream* stream;  // of its latest collective: peers waiting on this rank may run it
};

static ncclResult_t err(ncclResult_t r, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static ncclResult_t err(ncclResult_t r, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_last, sizeof(t_last), fmt, ap);
    va_end(ap);
    return r;
}

static ncclComm* comm_of(ncclComm_t c) { return c && c->magic == COMM_MAGIC ? c : nullptr; }

const char* ncclGetErrorString(ncclResult_t r) {
    switch (r) {
        case ncclSuccess: return "no error";
        case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
        case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
        case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
        case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
        case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
        case ncclRemoteError: return "remote process exited or there was a network error";
        case ncclInProgress: return "NCCL operation in progress";
        default: return "unknown result code";
    }
}

const char* ncclGetLastError(ncclComm_t) { return t_last; }

ncclResult_t ncclGetVersion(int* v) {
    if (!v) return err(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *v = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    static std::atomic<long> counter{0};
    if (!id) return err(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    memset(id, 0, sizeof(*id));
    snprintf(id->internal, sizeof(id->internal), "tp-emu-%d-%ld", (int)getpid(), ++counter);
    return ncclSuccess;
}

// after every rank has joined: NCCL refuses two ranks on one device
static ncclResult_t clique_check(Clique* cl) {
    for (int i = 0; i < cl->n; i++)
        for (int j = i + 1; j < cl->n; j++)
            if (cl->comms[i]->device == cl->comms[j]->device)
                return err(ncclInvalidUsage, "Duplicate GPU detected : rank %d and rank %d both on CUDA device %d", i, j, cl->comms[i]->device);
    return ncclSuccess;
}

static ncclResult_t wait_joined(Clique* cl) {
    std::unique_lock<std::mutex> lock(cl->mu);
    double t0 = now_s();
    while (cl->joined < cl->n) {
        cl->cv.wait_for(lock, std::chrono::milliseconds(10));
        if (now_s() - t0 > g_cfg.hang_s) fail("hang", "ncclCommInitRank: only %d of %d ranks joined within TP_EMU_HANG_S", cl->joined, cl->n);
    }
    return clique_check(cl);
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
    init();
    if (!comm) return err(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
    if (nranks < 1 || rank < 0 || rank >= nranks) return err(ncclInvalidArgument, "ncclCommInitRank: rank %d of %d is invalid", rank, nranks);
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return err(ncclUnhandledCudaError, "ncclCommInitRank: no CUDA device");
    Clique* cl;
    {
        std::lock_guard<std::mutex> lock(g_ids_mu);
        std::string key(id.internal, sizeof(id.internal));
        Clique*& slot = g_ids[key];
        if (!slot) {
            slot = new Clique();
            slot->n = nranks;
            slot->comms.assign(nranks, nullptr);
            slot->joined = 0;
            slot->aborted = false;
        }
        cl = slot;
    }
    {
        std::lock_guard<std::mutex> lock(cl->mu);
        if (cl->n != nranks) return err(ncclInvalidArgument, "ncclCommInitRank: %d ranks, but another rank of this id said %d", nranks, cl->n);
        if (cl->comms[rank]) return err(ncclInvalidArgument, "ncclCommInitRank: rank %d joined twice", rank);
        cl->comms[rank] = new ncclComm{COMM_MAGIC, cl, rank, nranks, dev, 0, false, ncclSuccess, nullptr};
        cl->joined++;
        cl->cv.notify_all();
        *comm = cl->comms[rank];
    }
    if (t_group > 0) {  // in a group the wait happens at ncclGroupEnd
        t_group_inits.push_back(*comm);
        return ncclSuccess;
    }
    return wait_joined(cl);
}

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
    init();
    if (!comms || ndev < 1) return err(ncclInvalidArgument, "ncclCommInitAll: no communicators asked for");
    int count = 0;
    cudaGetDeviceCount(&count);
    Clique* cl = new Clique();
    cl->n = ndev;
    cl->joined = ndev;
    cl->aborted = false;
    for (int r = 0; r < ndev; r++) {
        int d = devlist ? devlist[r] : r;
        if (d < 0 || d >= count) return err(ncclInvalidArgument, "ncclCommInitAll: device %d does not exist", d);
        cl->comms.push_back(new ncclComm{COMM_MAGIC, cl, r, ndev, d, 0, false, ncclSuccess, nullptr});
    }
    ncclResult_t r = clique_check(cl);
    if (r != ncclSuccess) return r;
    for (int i = 0; i < ndev; i++) comms[i] = cl->comms[i];
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
    t_group++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (t_group <= 0) return err(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--t_group > 0) return ncclSuccess;
    std::vector<ncclComm*> inits;
    inits.swap(t_group_inits);
    for (ncclComm* c : inits) {
        ncclResult_t r = wait_joined(c->cl);
        if (r != ncclSuccess) return r;
    }
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t c, int* n) {
    if (!comm_of(c) || !n) return err(ncclInvalidArgument, "ncclCommCount: invalid argument");
    *n = c->n;
    return ncclSuccess;
}
ncclResult_t ncclCommCuDevice(const ncclComm_t c, int* d) {
    if (!comm_of(c) || !d) return err(ncclInvalidArgument, "ncclCommCuDevice: invalid argument");
    *d = c->device;
    return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t c, int* r) {
    if (!comm_of(c) || !r) return err(ncclInvalidArgument, "ncclCommUserRank: invalid argument");
    *r = c->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* e) {
    if (!comm_of(c) || !e) return err(ncclInvalidArgument, "ncclCommGetAsyncError: invalid argument");
    *e = c->async;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
    if (!comm_of(c)) return err(ncclInvalidArgument, "ncclCommDestroy: invalid communicator");
    c->destroyed = true;
    c->magic = 0;  // kept: a queued collective that runs later is reported
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c) {
    if (!comm_of(c)) return err(ncclInvalidArgument, "ncclCommAbort: invalid communicator");
    Clique* cl = c->cl;
    std::lock_guard<std::mutex> lock(cl->mu);
    cl->aborted = true;
    for (ncclComm* o : cl->comms)
        if (o && o != c) o->async = ncclRemoteError;
    c->destroyed = true;
    c->magic = 0;
    cl->cv.notify_all();
    return ncclSuccess;
}

// ----------------------------------------------------------------------------
// collectives

template <class T> static void reduce_into(T* acc, const T* x, size_t n, int op) {
    for (size_t i = 0; i < n; i++) {
        switch (op) {
            case ncclSum: case ncclAvg: acc[i] = acc[i] + x[i]; break;
            case ncclProd: acc[i] = acc[i] * x[i]; break;
            case ncclMax: acc[i] = x[i] > acc[i] ? x[i] : acc[i]; break;
            default: acc[i] = x[i] < acc[i] ? x[i] : acc[i]; break;
        }
    }
}
template <class T> static void divide(T* acc, size_t n, int by) {
    for (size_t i = 0; i < n; i++) acc[i] = (T)(acc[i] / (T)by);
}

static void reduce_typed(int type, void* acc, const void* x, size_t n, int op) {
    switch (type) {
        case ncclInt8: reduce_into((int8_t*)acc, (const int8_t*)x, n, op); break;
        case ncclUint8: reduce_into((uint8_t*)acc, (const uint8_t*)x, n, op); break;
        case ncclInt32: reduce_into((int32_t*)acc, (const int32_t*)x, n, op); break;
        case ncclUint32: reduce_into((uint32_t*)acc, (const uint32_t*)x, n, op); break;
        case ncclInt64: reduce_into((int64_t*)acc, (const int64_t*)x, n, op); break;
        case ncclUint64: reduce_into((uint64_t*)acc, (const uint64_t*)x, n, op); break;
        case ncclFloat32: reduce_into((float*)acc, (const float*)x, n, op); break;
        default: reduce_into((double*)acc, (const double*)x, n, op); break;
    }
}
static void divide_typed(int type, void* acc, size_t n, int by) {
    switch (type) {
        case ncclInt8: divide((int8_t*)acc, n, by); break;
        case ncclUint8: divide((uint8_t*)acc, n, by); break;
        case ncclInt32: divide((int32_t*)acc, n, by); break;
        case ncclUint32: divide((uint32_t*)acc, n, by); break;
        case ncclInt64: divide((int64_t*)acc, n, by); break;
        case ncclUint64: divide((uint64_t*)acc, n, by); break;
        case ncclFloat32: divide((float*)acc, n, by); break;
        default: divide((double*)acc, n, by); break;
    }
}

// the last rank to arrive: every rank's send buffer into the result, in rank order
static void compute(Coll* c, int n) {
    size_t es = type_size(c->type), bytes = c->count * es;
    size_t in_bytes = c->kind == K_REDUCESCATTER ? bytes * n : bytes;
    char what[64];
    for (int r = 0; r < n; r++) {
        if (c->kind == K_BROADCAST && r != c->root) continue;
        snprintf(what, sizeof(what), "sendbuff of rank %d", r);
        check_range(c->send[r], in_bytes, false, true, PEER_COPY, what);
    }
    if (c->kind == K_BROADCAST) {
        c->tmp.resize(bytes);
        dcopy(c->tmp.data(), c->send[c->root], bytes);
    } else if (c->kind == K_ALLGATHER) {
        c->tmp.resize(bytes * n);
        for (int r = 0; r < n; r++) dcopy(c->tmp.data() + r * bytes, c->send[r], bytes);
    } else {
        c->tmp.resize(in_bytes);
        dcopy(c->tmp.data(), c->send[0], in_bytes);
        for (int r = 1; r < n; r++) reduce_typed(c->type, c->tmp.data(), c->send[r], in_bytes / es, c->op);
        if (c->op == ncclAvg) divide_typed(c->type, c->tmp.data(), in_bytes / es, n);
    }
    c->ready = true;
}

struct Args {
    int kind, type, op, root;
    const void* send;
    void* recv;
    size_t count;
};

// the stream operation of rank `comm`'s collective number `seq`
static bool run_coll(ncclComm* comm, uint64_t seq, const Args& a, bool block) {
    if (comm->destroyed && !comm->cl->aborted)
        fail("collective after ncclCommDestroy", "%s #%llu of rank %d ran after its communicator was destroyed", kind_name(a.kind),
             (unsigned long long)seq, comm->rank);
    Clique* cl = comm->cl;
    int n = cl->n;
    std::unique_lock<std::mutex> lock(cl->mu);
    Coll*& c = cl->colls[seq];
    if (!c) {
        c = new Coll();
        c->send.assign(n, nullptr);
        c->recv.assign(n, nullptr);
        c->has.assign(n, 0);
    }
    if (!c->has[comm->rank]) {
        if (c->arrived == 0) {
            c->kind = a.kind, c->type = a.type, c->op = a.op, c->root = a.root, c->count = a.count, c->first = comm->rank;
        } else {
            bool uses_op = a.kind == K_ALLREDUCE || a.kind == K_REDUCESCATTER;
            if (c->kind != a.kind || c->type != a.type || c->count != a.count || (uses_op && c->op != a.op) ||
                (a.kind == K_BROADCAST && c->root != a.root))
                fail("NCCL collectives disagree", "collective #%llu of the communicator: rank %d calls %s(count %zu, %s, %s, root %d) but rank "
                     "%d called %s(count %zu, %s, %s, root %d); on a GPU this hangs or computes garbage", (unsigned long long)seq, comm->rank,
                     kind_name(a.kind), a.count, type_name(a.type), op_name(a.op), a.root, c->first, kind_name(c->kind), c->count,
                     type_name(c->type), op_name(c->op), c->root);
        }
        c->send[comm->rank] = a.send;
        c->recv[comm->rank] = a.recv;
        c->has[comm->rank] = 1;
        if (++c->arrived == n) {
            compute(c, n);
            cl->cv.notify_all();
        }
    }
    double t0 = now_s();
    while (!c->ready && !cl->aborted) {
        if (!block) return false;
        // peers' streams may be waiting for someone to run them (one thread driving several ranks)
        std::vector<Stream*> peers;
        for (ncclComm* o : cl->comms)
            if (o && o != comm && o->stream && !c->has[o->rank]) peers.push_back(o->stream);
        lock.unlock();
        for (Stream* s : peers) run_stream(s, last_seq(s), false);
        lock.lock();
        if (!c->ready) cl->cv.wait_for(lock, std::chrono::milliseconds(2));
        if (now_s() - t0 > g_cfg.hang_s) {
            std::string missing;
            for (int r = 0; r < n; r++)
                if (!c->has[r]) missing += " " + std::to_string(r);
            fail("hang", "rank %d has waited %.0f s in %s #%llu for ranks%s, which never reached it (TP_EMU_HANG_S)", comm->rank, g_cfg.hang_s,
                 kind_name(a.kind), (unsigned long long)seq, missing.c_str());
        }
    }
    if (!c->ready) return true;  // aborted: nothing is delivered
    lock.unlock();
    size_t es = type_size(a.type), bytes = a.count * es;
    const char* src = c->tmp.data();
    size_t out = bytes;
    if (a.kind == K_ALLGATHER) out = bytes * n;
    if (a.kind == K_REDUCESCATTER) src += comm->rank * bytes;
    check_range(a.recv, out, true, false, PEER_COPY, "recvbuff");
    dcopy(a.recv, src, out);
    lock.lock();
    if (++c->copied == n) {
        cl->colls.erase(seq);
        delete c;
    }
    return true;
}

static ncclResult_t coll(int kind, const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op, int root,
                         ncclComm_t ch, cudaStream_t sh) {
    init();
    const char* name = kind_name(kind);
    ncclComm* comm = comm_of(ch);
    if (!comm) return err(ncclInvalidArgument, "%s: invalid communicator", name);
    if (type_size(type) == 0) return err(ncclInvalidArgument, "%s: invalid data type %d", name, (int)type);
    if ((kind == K_ALLREDUCE || kind == K_REDUCESCATTER) && (op < ncclSum || op > ncclAvg))
        return err(ncclInvalidArgument, "%s: invalid reduction %d", name, (int)op);
    if (kind == K_BROADCAST && (root < 0 || root >= comm->n)) return err(ncclInvalidArgument, "%s: invalid root %d", name, root);
    cudaError_t ce = cudaSuccess;
    Stream* s = get_stream(sh, &ce);
    if (!s) return err(ncclUnhandledCudaError, "%s: invalid stream", name);
    if (s->device != comm->device)
        return err(ncclUnhandledCudaError, "%s: the stream is on device %d, the communicator on device %d", name, s->device, comm->device);
    if (count > 0) {
        for (int i = 0; i < 2; i++) {
            uintptr_t p = (uintptr_t)(i == 0 ? send : recv);
            if (i == 0 && kind == K_BROADCAST && comm->rank != root) continue;
            if (!is_device_addr(p) || dev_of(p) != comm->device)
                return err(ncclInvalidArgument, "%s: %s %p is not device memory of the communicator's device %d", name, i ? "recvbuff" : "sendbuff",
                           (void*)p, comm->device);
        }
    }
    Args a = {kind, (int)type, (int)op, root, send, recv, count};
    uint64_t seq = comm->seq++;
    comm->stream = s;
    char what[96];
    snprintf(what, sizeof(what), "%s #%llu of rank %d", name, (unsigned long long)seq, comm->rank);
    enqueue(s, what, [comm, seq, a](bool block) { return run_coll(comm, seq, a, block); });
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm, cudaStream_t s) {
    return coll(K_ALLREDUCE, send, recv, count, type, op, 0, comm, s);
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm, cudaStream_t s) {
    return coll(K_BROADCAST, send, recv, count, type, ncclSum, root, comm, s);
}
ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm, cudaStream_t s) {
    return coll(K_ALLGATHER, send, recv, count, type, ncclSum, 0, comm, s);
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm, cudaStream_t s) {
    return coll(K_REDUCESCATTER, send, recv, count, type, op, 0, comm, s);
}
