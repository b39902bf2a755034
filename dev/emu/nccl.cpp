// nccl.cpp: NCCL of the emulated GPU. Two kinds of communicator, as tp makes them:
//   - ncclCommInitAll: ranks that are threads of one process (each with a communicator on its own device);
//   - ncclCommInitRank with an id from ncclGetUniqueId: ranks anywhere on this machine, threads of one
//     process or of several (an mpirun job), meeting in a POSIX shared-memory segment named after the id.
//
// A collective is a stream operation on the rank's stream, numbered by its communicator (the n-th call on
// every rank is the same collective). When a rank's stream reaches it, the rank arrives and its arguments
// are checked against the other ranks': a different op, count, type, reduction or root is reported
// instead of hanging or computing garbage. Every rank's send buffer is reduced in rank order (so in-place
// buffers work and results are identical on all ranks); each rank copies its part out when its stream runs
// the operation to the end. A query on a stream whose collective still waits for peers returns
// cudaErrorNotReady, so tp's polling hang check keeps working; a blocking wait also runs the streams of the
// peers in this process (a single thread may drive several communicators in a group) and reports a hang
// after TP_EMU_HANG_S seconds.
//
// Across processes (the shared-memory communicators) the unique id is the only thing shared out of band,
// as with NCCL: its 16 random bytes name the segment, so communicators of different jobs never meet. The
// segment holds, per rank, its pid, its state and a slot of SHM_CHUNK bytes; a collective moves through it
// in steps of at most SHM_CHUNK bytes per rank. In step t every rank waits until all ranks have finished
// reading step t-1, copies its part of the send buffer into its slot and publishes t, waits until every
// rank has published t, checks their arguments against its own, computes its output from all slots in
// rank order and says it has read step t. A rank whose process is gone (or whose communicator was
// destroyed or aborted) before the steps this rank waits for turns the communicator's async error into
// ncclRemoteError, as NCCL's proxy does when a peer's connection closes; the collective then never
// completes, as on a GPU, and tp's polling wait reports it. The segment's name is unlinked as soon as
// every rank has joined (the mappings stay), so no segment outlives its job, killed or not.
#include "emu.h"
#include "fake_cuda/nccl.h"
#include <algorithm>
#include <cerrno>
#include <fcntl.h>
#include <map>
#include <memory>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <tuple>
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

struct P2p {  // one point-to-point message (ncclSend, ncclRecv), as its two sides arrive
    const void* send;
    void* recv;
    size_t count[2];  // the sender's and the receiver's
    int type[2];
    bool has[2];      // the sender's side has arrived, the receiver's
    bool done;
    int left;         // sides still to see it done
};

// The shared-memory segment of a communicator made by ncclCommInitRank. Zero bytes are its initial state
// (a new segment is zero-filled), so whichever rank creates it needs no setup. Atomics of 4 and 8 bytes
// are lock-free on x86-64 and work between processes that map the same memory.
constexpr int SHM_MAX_RANKS = 64;
constexpr size_t SHM_CHUNK = (size_t)1 << 20;  // bytes per rank per step (a multiple of every type's size)
constexpr const char* ID_PREFIX = "tp-emu-nccl-";
enum RankState { R_NONE, R_JOINED, R_DESTROYED, R_ABORTED };

struct ShmRank {
    std::atomic<int> pid;  // 0 until the rank joins
    std::atomic<int> device;
    std::atomic<int> state;               // RankState
    std::atomic<uint64_t> posted;         // the latest step whose data is in the rank's slot
    std::atomic<uint64_t> consumed;       // the latest step the rank has finished reading
    int kind, type, op, root;             // the collective of the latest posted step, for the argument check
    uint64_t count, seq;
    char pad[16];
};
struct ShmHdr {
    std::atomic<int> nranks;  // set by the first rank to join; the others must say the same
    std::atomic<int> joined;
    ShmRank ranks[SHM_MAX_RANKS];
};
static size_t shm_bytes(int n) { return sizeof(ShmHdr) + (size_t)n * SHM_CHUNK; }

struct Shm {
    std::string name;  // "/tp-emu-nccl-<32 hex digits>"
    ShmHdr* h;
    size_t bytes;
    char* slot(int r) { return (char*)h + sizeof(ShmHdr) + (size_t)r * SHM_CHUNK; }
};

struct Clique {  // the communicators created together (for a shared-memory one: those of this process)
    int n;
    std::mutex mu;
    std::condition_variable cv;
    std::vector<ncclComm*> comms;
    int joined;
    bool aborted;
    std::map<uint64_t, Coll*> colls;
    std::map<std::tuple<int, int, uint64_t>, P2p*> p2ps;  // (sender, receiver, k): their k-th message
    Shm* shm;  // ncclCommInitRank: the segment, else nullptr
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
    std::atomic<int> async;  // ncclResult_t; set by another thread's ncclCommAbort, or a peer's failure
    Stream* stream;          // of its latest collective: peers waiting on this rank may run it
    std::vector<uint64_t> sent_to, recv_from;  // point to point: messages enqueued to / from each peer
    // shared-memory communicators
    std::atomic<uint64_t> steps;  // steps of the collectives enqueued so far (steps are numbered from 1)
    std::atomic<double> checked_s;  // when the peers' liveness was last checked
    char why[256];                // what the async error is about, for ncclGetLastError (set once, before async)
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

static ncclComm* new_comm(Clique* cl, int rank, int n, int dev) {
    ncclComm* c = new ncclComm();
    c->magic = COMM_MAGIC;
    c->cl = cl;
    c->rank = rank, c->n = n, c->device = dev;
    c->seq = 0;
    c->destroyed = false;
    c->async = ncclSuccess;
    c->stream = nullptr;
    c->sent_to.assign(n, 0);
    c->recv_from.assign(n, 0);
    c->steps = 0;
    c->checked_s = 0;
    c->why[0] = 0;
    return c;
}

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

// the communicator's own error when it has one (a peer that failed), else this thread's last one
const char* ncclGetLastError(ncclComm_t c) {
    ncclComm* comm = comm_of(c);
    return comm && comm->why[0] ? comm->why : t_last;
}

ncclResult_t ncclGetVersion(int* v) {
    if (!v) return err(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *v = NCCL_VERSION_CODE;
    return ncclSuccess;
}

// 16 random bytes, as text: the name of the communicator's shared-memory segment. Random rather than
// pid and counter, so that two jobs (or two runs of one test) never meet in one segment.
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    if (!id) return err(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    unsigned char r[16];
    for (size_t got = 0; got < sizeof(r);) {
        ssize_t k = getrandom(r + got, sizeof(r) - got, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return err(ncclSystemError, "ncclGetUniqueId: getrandom: %s", strerror(errno));
        got += (size_t)k;
    }
    memset(id, 0, sizeof(*id));
    int at = snprintf(id->internal, sizeof(id->internal), "%s", ID_PREFIX);
    for (int i = 0; i < 16; i++) at += snprintf(id->internal + at, sizeof(id->internal) - at, "%02x", r[i]);
    return ncclSuccess;
}

// after every rank has joined: NCCL refuses two ranks on one device (the emulated devices of every process
// are the same machine's GPUs, so ranks of different processes on the same device index collide too)
static ncclResult_t clique_check(Clique* cl) {
    if (cl->shm) {
        ShmHdr* h = cl->shm->h;
        for (int i = 0; i < cl->n; i++)
            for (int j = i + 1; j < cl->n; j++)
                if (h->ranks[i].device.load() == h->ranks[j].device.load())
                    return err(ncclInvalidUsage, "Duplicate GPU detected : rank %d (pid %d) and rank %d (pid %d) both on CUDA device %d", i,
                               h->ranks[i].pid.load(), j, h->ranks[j].pid.load(), h->ranks[i].device.load());
        return ncclSuccess;
    }
    for (int i = 0; i < cl->n; i++)
        for (int j = i + 1; j < cl->n; j++)
            if (cl->comms[i]->device == cl->comms[j]->device)
                return err(ncclInvalidUsage, "Duplicate GPU detected : rank %d and rank %d both on CUDA device %d", i, j, cl->comms[i]->device);
    return ncclSuccess;
}

// Waits until all ranks of the communicator have joined. A shared-memory communicator's name is then
// unlinked: every rank has it mapped, and nothing is left in /dev/shm whatever happens to the job later.
static ncclResult_t wait_joined(Clique* cl) {
    double t0 = now_s();
    if (cl->shm) {
        for (int spins = 0; cl->shm->h->joined.load() < cl->n; spins++) {
            if (now_s() - t0 > g_cfg.hang_s) {
                shm_unlink(cl->shm->name.c_str());
                fail("hang", "ncclCommInitRank: only %d of %d ranks joined within TP_EMU_HANG_S (segment %s)", cl->shm->h->joined.load(), cl->n,
                     cl->shm->name.c_str());
            }
            if (spins < 100) std::this_thread::yield();
            else usleep(1000);
        }
        if (shm_unlink(cl->shm->name.c_str()) != 0 && errno != ENOENT)
            return err(ncclSystemError, "ncclCommInitRank: shm_unlink(%s): %s", cl->shm->name.c_str(), strerror(errno));
        return clique_check(cl);
    }
    std::unique_lock<std::mutex> lock(cl->mu);
    while (cl->joined < cl->n) {
        cl->cv.wait_for(lock, std::chrono::milliseconds(10));
        if (now_s() - t0 > g_cfg.hang_s) fail("hang", "ncclCommInitRank: only %d of %d ranks joined within TP_EMU_HANG_S", cl->joined, cl->n);
    }
    return clique_check(cl);
}

// maps the segment of `id` for a communicator of n ranks, creating it if this rank is the first
static ncclResult_t shm_map(const ncclUniqueId& id, int n, Shm** out) {
    size_t plen = strlen(ID_PREFIX);
    if (strncmp(id.internal, ID_PREFIX, plen) != 0 || strnlen(id.internal, sizeof(id.internal)) != plen + 32)
        return err(ncclInvalidArgument, "ncclCommInitRank: the unique id is not one that ncclGetUniqueId made");
    Shm* s = new Shm();
    s->name = std::string("/") + id.internal;
    s->bytes = shm_bytes(n);
    int fd = shm_open(s->name.c_str(), O_RDWR | O_CREAT, 0600);
    if (fd < 0) return err(ncclSystemError, "ncclCommInitRank: shm_open(%s): %s", s->name.c_str(), strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return err(ncclSystemError, "ncclCommInitRank: fstat(%s): %s", s->name.c_str(), strerror(errno));
    }
    // a segment of another size was made by a rank that said another nranks; extending a new one to its
    // size by every rank at once is harmless (same size, zero-filled)
    if (st.st_size != 0 && (size_t)st.st_size != s->bytes) {
        close(fd);
        return err(ncclInvalidArgument, "ncclCommInitRank: %d ranks, but another rank of this id said otherwise (segment of %lld bytes)", n,
                   (long long)st.st_size);
    }
    if (st.st_size == 0 && ftruncate(fd, (off_t)s->bytes) != 0) {
        close(fd);
        return err(ncclSystemError, "ncclCommInitRank: ftruncate(%s, %zu): %s", s->name.c_str(), s->bytes, strerror(errno));
    }
    void* p = mmap(nullptr, s->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) return err(ncclSystemError, "ncclCommInitRank: mmap(%s): %s", s->name.c_str(), strerror(e));
    s->h = (ShmHdr*)p;
    *out = s;
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
    init();
    if (!comm) return err(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
    if (nranks < 1 || nranks > SHM_MAX_RANKS || rank < 0 || rank >= nranks)
        return err(ncclInvalidArgument, "ncclCommInitRank: rank %d of %d is invalid (the emulation has up to %d ranks)", rank, nranks, SHM_MAX_RANKS);
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return err(ncclUnhandledCudaError, "ncclCommInitRank: no CUDA device");
    Clique* cl;
    {
        // the ranks of this process on this id share one mapping and know each other's streams
        std::lock_guard<std::mutex> lock(g_ids_mu);
        std::string key(id.internal, sizeof(id.internal));
        Clique*& slot = g_ids[key];
        if (!slot) {
            Shm* shm = nullptr;
            ncclResult_t r = shm_map(id, nranks, &shm);
            if (r != ncclSuccess) {
                g_ids.erase(key);
                return r;
            }
            slot = new Clique();
            slot->n = nranks;
            slot->comms.assign(nranks, nullptr);
            slot->joined = 0;
            slot->aborted = false;
            slot->shm = shm;
        }
        cl = slot;
    }
    ShmHdr* h = cl->shm->h;
    int want = 0;
    if (!h->nranks.compare_exchange_strong(want, nranks) && want != nranks)
        return err(ncclInvalidArgument, "ncclCommInitRank: %d ranks, but another rank of this id said %d", nranks, want);
    {
        std::lock_guard<std::mutex> lock(cl->mu);
        int none = 0;
        if (cl->comms[rank] || !h->ranks[rank].pid.compare_exchange_strong(none, (int)getpid()))
            return err(ncclInvalidArgument, "ncclCommInitRank: rank %d joined twice", rank);
        h->ranks[rank].device.store(dev);
        h->ranks[rank].state.store(R_JOINED);
        cl->comms[rank] = new_comm(cl, rank, nranks, dev);
        cl->joined++;
        *comm = cl->comms[rank];
    }
    h->joined.fetch_add(1);
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
    cl->shm = nullptr;
    for (int r = 0; r < ndev; r++) {
        int d = devlist ? devlist[r] : r;
        if (d < 0 || d >= count) return err(ncclInvalidArgument, "ncclCommInitAll: device %d does not exist", d);
        cl->comms.push_back(new_comm(cl, r, ndev, d));
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

// a process that has exited (or been killed): gone, or a zombie its parent has not reaped yet
static bool pid_gone(int pid) {
    if (kill(pid, 0) != 0) return errno == ESRCH;
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE* f = fopen(path, "r");
    if (!f) return false;  // no /proc: kill's answer stands
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    const char* p = strrchr(buf, ')');  // "pid (comm) S ...": the state follows the command's ')'
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

// Shared-memory communicators: whether a peer that this rank still needs (one that has not finished reading
// the steps this rank has enqueued) can no longer take part: its process is gone, or it destroyed or
// aborted its communicator. Turns the async error into ncclRemoteError, with the reason for
// ncclGetLastError. Looks at most every 20 ms unless forced: tp asks on every turn of its polling loop.
static bool peer_failed(ncclComm* c, bool force) {
    Shm* shm = c->cl->shm;
    if (!shm) return false;
    if (c->async.load() != ncclSuccess) return true;
    double t = now_s();
    if (!force && t - c->checked_s < 0.02) return false;
    c->checked_s = t;
    for (int p = 0; p < c->n; p++) {
        ShmRank* o = &shm->h->ranks[p];
        if (p == c->rank || o->consumed.load() >= c->steps) continue;
        int state = o->state.load(), pid = o->pid.load();
        const char* what = state == R_DESTROYED ? "destroyed its communicator" : state == R_ABORTED ? "aborted its communicator" : nullptr;
        if (!what && pid != (int)getpid() && pid_gone(pid)) what = "exited or was killed";
        if (!what) continue;
        static std::mutex why_mu;  // the first failure seen names the communicator's error
        std::lock_guard<std::mutex> lock(why_mu);
        if (c->async.load() == ncclSuccess) {
            snprintf(c->why, sizeof(c->why), "rank %d (process %d) %s while this rank still needed it for its collectives up to #%llu: "
                     "connection closed by remote peer", p, pid, what, (unsigned long long)(c->seq ? c->seq - 1 : 0));
            c->async.store(ncclRemoteError);
        }
        return true;
    }
    return false;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* e) {
    if (!comm_of(c) || !e) return err(ncclInvalidArgument, "ncclCommGetAsyncError: invalid argument");
    peer_failed(c, false);
    *e = (ncclResult_t)c->async.load();
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
    if (!comm_of(c)) return err(ncclInvalidArgument, "ncclCommDestroy: invalid communicator");
    c->destroyed = true;
    c->magic = 0;  // kept: a queued collective that runs later is reported
    // the mapping stays: a peer in this process may still read this rank's slot (the name is long gone)
    if (c->cl->shm) c->cl->shm->h->ranks[c->rank].state.store(R_DESTROYED);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c) {
    if (!comm_of(c)) return err(ncclInvalidArgument, "ncclCommAbort: invalid communicator");
    Clique* cl = c->cl;
    std::lock_guard<std::mutex> lock(cl->mu);
    cl->aborted = true;
    for (ncclComm* o : cl->comms)
        if (o && o != c) o->async = ncclRemoteError;
    if (cl->shm) cl->shm->h->ranks[c->rank].state.store(R_ABORTED);  // the other processes' ranks see it
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

// ----------------------------------------------------------------------------
// collectives of a shared-memory communicator (ncclCommInitRank): in steps through the segment's slots

struct ShmProgress {  // how far this rank is in one collective
    int k;            // its step being run (0 .. nsteps-1)
    bool posted;      // this rank's part of step k is in its slot
};

// the bytes of each rank's input that pass through the slots (a reduce-scatter reduces all n blocks and
// keeps its own), and the steps that takes (one at least: a collective of 0 elements still meets)
static size_t shm_in_bytes(const Args& a, int n) {
    size_t b = a.count * type_size(a.type);
    return a.kind == K_REDUCESCATTER ? b * n : b;
}
static uint64_t shm_steps(const Args& a, int n) {
    size_t b = shm_in_bytes(a, n);
    return b == 0 ? 1 : (b + SHM_CHUNK - 1) / SHM_CHUNK;
}

// the first rank whose `posted` (or `consumed`) is below t, else -1
static int shm_behind(ShmHdr* h, int n, bool posted, uint64_t t) {
    for (int p = 0; p < n; p++)
        if ((posted ? h->ranks[p].posted.load(std::memory_order_acquire) : h->ranks[p].consumed.load(std::memory_order_acquire)) < t) return p;
    return -1;
}

// TP_EMU_NCCL_KILL=R:S: the process of rank R of a shared-memory communicator kills itself (SIGKILL, as
// kill -9 would) when its collective #S starts to run: a process that dies mid-step at a known point, for
// the test that the other processes report it through NCCL's error path
struct KillAt {
    int rank;
    long long seq;
};
static KillAt kill_at() {
    KillAt k = {-1, -1};
    const char* v = getenv("TP_EMU_NCCL_KILL");
    if (v && sscanf(v, "%d:%lld", &k.rank, &k.seq) != 2) {
        fprintf(stderr, "tp-emu: TP_EMU_NCCL_KILL=%s is not RANK:COLLECTIVE\n", v);
        exit(2);
    }
    return k;
}
static void maybe_die(ncclComm* comm, uint64_t seq, const char* name) {
    static const KillAt at = kill_at();  // read once (a thread-safe static initialisation)
    if (comm->rank != at.rank || (long long)seq != at.seq) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    fprintf(stderr, "tp-emu: TP_EMU_NCCL_KILL: process %d (rank %d) kills itself in %s #%llu at %.3f\n", (int)getpid(), comm->rank, name,
            (unsigned long long)seq, ts.tv_sec + ts.tv_nsec * 1e-9);
    fflush(stderr);
    if (kill(getpid(), SIGKILL) != 0) fprintf(stderr, "tp-emu: TP_EMU_NCCL_KILL: kill: %s\n", strerror(errno));
    _exit(137);  // not reached when the signal is delivered
}

// One turn of waiting for rank p. False: return to the caller (a query, or a blocking wait that is done
// for: the peer failed); true: look again.
static bool shm_wait(ncclComm* comm, int p, const char* for_what, const Args& a, uint64_t seq, double t0, bool block) {
    if (peer_failed(comm, false)) {
        if (!block) return false;  // pending for ever, as the collective on a GPU whose peer died
        fail("NCCL peer failed", "rank %d blocks in %s #%llu, waiting for %s of rank %d: %s. On a GPU this wait never returns: poll the "
             "stream or an event and ncclCommGetAsyncError instead", comm->rank, kind_name(a.kind), (unsigned long long)seq, for_what, p, comm->why);
    }
    if (!block) return false;
    // the peers of this process may be waiting for someone to run their streams (one thread, several ranks)
    std::vector<Stream*> peers;
    {
        std::lock_guard<std::mutex> lock(comm->cl->mu);
        for (ncclComm* o : comm->cl->comms)
            if (o && o != comm && o->stream) peers.push_back(o->stream);
    }
    for (Stream* s : peers) run_stream(s, last_seq(s), false);
    if (now_s() - t0 > g_cfg.hang_s)
        fail("hang", "rank %d has waited %.0f s in %s #%llu for %s of rank %d (pid %d), which never came (TP_EMU_HANG_S)", comm->rank, g_cfg.hang_s,
             kind_name(a.kind), (unsigned long long)seq, for_what, p, comm->cl->shm->h->ranks[p].pid.load());
    usleep(200);
    return true;
}

// the stream operation of rank `comm`'s collective number `seq`, whose steps start at t0
static bool run_shm(ncclComm* comm, uint64_t seq, const Args& a, uint64_t t0, ShmProgress* st, bool block) {
    if (comm->destroyed && !comm->cl->aborted)
        fail("collective after ncclCommDestroy", "%s #%llu of rank %d ran after its communicator was destroyed", kind_name(a.kind),
             (unsigned long long)seq, comm->rank);
    Clique* cl = comm->cl;
    Shm* shm = cl->shm;
    ShmHdr* h = shm->h;
    int n = cl->n, me = comm->rank;
    ShmRank* mine = &h->ranks[me];
    size_t es = type_size(a.type), bytes = a.count * es, in = shm_in_bytes(a, n);
    uint64_t nsteps = shm_steps(a, n);
    double w0 = now_s();
    if (st->k == 0 && !st->posted) maybe_die(comm, seq, kind_name(a.kind));
    while ((uint64_t)st->k < nsteps) {
        if (cl->aborted) return true;  // ncclCommAbort: nothing more is delivered
        uint64_t t = t0 + st->k;
        size_t off = (size_t)st->k * SHM_CHUNK, len = in > off ? std::min(SHM_CHUNK, in - off) : 0;
        if (!st->posted) {
            int p = shm_behind(h, n, false, t - 1);  // a rank still reading step t-1 (its slot may be overwritten next)
            if (p >= 0) {
                if (!shm_wait(comm, p, "the end of the previous step", a, seq, w0, block)) return false;
                continue;
            }
            bool sends = a.kind != K_BROADCAST || me == a.root;
            if (st->k == 0 && sends) check_range(a.send, in, false, true, PEER_COPY, "sendbuff");
            if (sends && len) dcopy(shm->slot(me), (const char*)a.send + off, len);
            mine->kind = a.kind, mine->type = a.type, mine->op = a.op, mine->root = a.root, mine->count = a.count, mine->seq = seq;
            mine->posted.store(t, std::memory_order_release);
            st->posted = true;
        }
        int p = shm_behind(h, n, true, t);
        if (p >= 0) {
            if (!shm_wait(comm, p, "its part", a, seq, w0, block)) return false;
            continue;
        }
        for (int q = 0; q < n; q++) {  // every rank's step t is the same collective
            const ShmRank* o = &h->ranks[q];
            bool uses_op = a.kind == K_ALLREDUCE || a.kind == K_REDUCESCATTER;
            if (o->seq != seq || o->kind != a.kind || o->type != a.type || o->count != a.count || (uses_op && o->op != a.op) ||
                (a.kind == K_BROADCAST && o->root != a.root))
                fail("NCCL collectives disagree", "collective #%llu of the communicator: rank %d calls %s(count %zu, %s, %s, root %d) but rank "
                     "%d (pid %d) called %s(count %llu, %s, %s, root %d) as its collective #%llu; on a GPU this hangs or computes garbage",
                     (unsigned long long)seq, me, kind_name(a.kind), a.count, type_name(a.type), op_name(a.op), a.root, q, o->pid.load(),
                     kind_name(o->kind), (unsigned long long)o->count, type_name(o->type), op_name(o->op), o->root, (unsigned long long)o->seq);
        }
        size_t out = a.kind == K_ALLGATHER ? bytes * n : bytes;
        if (st->k == 0) check_range(a.recv, out, true, false, PEER_COPY, "recvbuff");
        char* recv = (char*)a.recv;
        if (a.kind == K_BROADCAST) {
            if (len) dcopy(recv + off, shm->slot(a.root), len);
        } else if (a.kind == K_ALLGATHER) {
            for (int q = 0; q < n && len; q++) dcopy(recv + q * bytes + off, shm->slot(q), len);
        } else {
            // this rank's output within the step: all of it for an all-reduce, the part of its own block for a
            // reduce-scatter; reduced over the ranks in rank order, as every rank does
            size_t lo = off, hi = off + len;
            if (a.kind == K_REDUCESCATTER) lo = std::max(lo, me * bytes), hi = std::min(hi, (me + 1) * bytes);
            if (lo < hi) {
                static thread_local std::vector<char> acc;
                acc.resize(hi - lo);
                dcopy(acc.data(), shm->slot(0) + (lo - off), hi - lo);
                for (int q = 1; q < n; q++) reduce_typed(a.type, acc.data(), shm->slot(q) + (lo - off), (hi - lo) / es, a.op);
                if (a.op == ncclAvg) divide_typed(a.type, acc.data(), (hi - lo) / es, n);
                dcopy(recv + (a.kind == K_REDUCESCATTER ? lo - me * bytes : lo), acc.data(), hi - lo);
            }
        }
        mine->consumed.store(t, std::memory_order_release);
        st->k++;
        st->posted = false;
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
    if (comm->cl->shm) {
        uint64_t t0 = comm->steps.load() + 1;
        comm->steps.fetch_add(shm_steps(a, comm->n));
        std::shared_ptr<ShmProgress> st(new ShmProgress{0, false});
        enqueue(s, what, [comm, seq, a, t0, st](bool block) { return run_shm(comm, seq, a, t0, st.get(), block); });
    } else {
        enqueue(s, what, [comm, seq, a](bool block) { return run_coll(comm, seq, a, block); });
    }
    return ncclSuccess;
}

// ----------------------------------------------------------------------------
// point to point (communicators of one process): ncclSend and ncclRecv
//
// As in NCCL, the k-th send from rank a to rank b meets the k-th receive of b from a, whatever else either
// does in between; each is an operation on its stream that completes once the data is in the receiver's
// buffer (NCCL's send may finish earlier for small messages, but nothing may count on that). Whichever of
// the two runs second copies the data; the first waits for it (a query returns cudaErrorNotReady meanwhile).
// A count or type that differs between the two is reported. A waiting side runs the peer's stream when it
// can, as the collectives do: streams are lazy, and a sender's stream may have no thread that waits for it.

static bool run_p2p(ncclComm* comm, int side, int peer, uint64_t k, const void* send, void* recv, size_t count, int type, bool block) {
    const char* name = side == 0 ? "ncclSend" : "ncclRecv";
    if (comm->destroyed && !comm->cl->aborted)
        fail("collective after ncclCommDestroy", "%s to/from rank %d of rank %d ran after its communicator was destroyed", name, peer, comm->rank);
    Clique* cl = comm->cl;
    int src = side == 0 ? comm->rank : peer, dst = side == 0 ? peer : comm->rank;
    std::unique_lock<std::mutex> lock(cl->mu);
    P2p*& p = cl->p2ps[std::make_tuple(src, dst, k)];
    if (!p) p = new P2p{nullptr, nullptr, {0, 0}, {0, 0}, {false, false}, false, 2};
    P2p* m = p;
    if (!m->has[side]) {
        m->has[side] = true;
        m->count[side] = count, m->type[side] = type;
        if (side == 0) m->send = send;
        else m->recv = recv;
        if (m->has[0] && m->has[1]) {
            if (m->count[0] != m->count[1] || m->type[0] != m->type[1])
                fail("NCCL send and receive disagree", "message #%llu from rank %d to rank %d: the send has %zu of %s, the receive %zu of %s; on a GPU "
                     "this hangs or delivers garbage", (unsigned long long)k, src, dst, m->count[0], type_name(m->type[0]), m->count[1],
                     type_name(m->type[1]));
            size_t bytes = count * type_size(type);
            check_range(m->send, bytes, false, true, PEER_COPY, "sendbuff of ncclSend");
            check_range(m->recv, bytes, true, false, PEER_COPY, "recvbuff of ncclRecv");
            dcopy(m->recv, m->send, bytes);
            m->done = true;
            cl->cv.notify_all();
        }
    }
    double t0 = now_s();
    while (!m->done && !cl->aborted) {
        Stream* other = cl->comms[peer] ? cl->comms[peer]->stream : nullptr;
        lock.unlock();
        if (other) run_stream(other, last_seq(other), false);
        lock.lock();
        if (m->done || cl->aborted) break;
        if (!block) return false;
        cl->cv.wait_for(lock, std::chrono::milliseconds(2));
        if (now_s() - t0 > g_cfg.hang_s)
            fail("hang", "rank %d has waited %.0f s in %s #%llu %s rank %d, which never reached it (TP_EMU_HANG_S)", comm->rank, g_cfg.hang_s, name,
                 (unsigned long long)k, side == 0 ? "to" : "from", peer);
    }
    if (--m->left == 0) {
        cl->p2ps.erase(std::make_tuple(src, dst, k));
        delete m;
    }
    return true;
}

static ncclResult_t p2p(int side, const void* send, void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t ch, cudaStream_t sh) {
    init();
    const char* name = side == 0 ? "ncclSend" : "ncclRecv";
    ncclComm* comm = comm_of(ch);
    if (!comm) return err(ncclInvalidArgument, "%s: invalid communicator", name);
    if (type_size(type) == 0) return err(ncclInvalidArgument, "%s: invalid data type %d", name, (int)type);
    if (peer < 0 || peer >= comm->n || peer == comm->rank)
        return err(ncclInvalidArgument, "%s: peer %d is not another rank of this communicator of %d", name, peer, comm->n);
    if (comm->cl->shm) return err(ncclInvalidUsage, "%s: point to point across processes is not emulated", name);
    cudaError_t ce = cudaSuccess;
    Stream* s = get_stream(sh, &ce);
    if (!s) return err(ncclUnhandledCudaError, "%s: invalid stream", name);
    if (s->device != comm->device)
        return err(ncclUnhandledCudaError, "%s: the stream is on device %d, the communicator on device %d", name, s->device, comm->device);
    uintptr_t buf = (uintptr_t)(side == 0 ? send : recv);
    if (count > 0 && (!is_device_addr(buf) || dev_of(buf) != comm->device))
        return err(ncclInvalidArgument, "%s: %s %p is not device memory of the communicator's device %d", name, side == 0 ? "sendbuff" : "recvbuff",
                   (void*)buf, comm->device);
    uint64_t k = side == 0 ? comm->sent_to[peer]++ : comm->recv_from[peer]++;
    comm->stream = s;
    char what[96];
    snprintf(what, sizeof(what), "%s #%llu of rank %d %s rank %d", name, (unsigned long long)k, comm->rank, side == 0 ? "to" : "from", peer);
    enqueue(s, what, [comm, side, peer, k, send, recv, count, type](bool block) {
        return run_p2p(comm, side, peer, k, send, recv, count, (int)type, block);
    });
    return ncclSuccess;
}

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t s) {
    return p2p(0, send, nullptr, count, type, peer, comm, s);
}
ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t s) {
    return p2p(1, nullptr, recv, count, type, peer, comm, s);
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
