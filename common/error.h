// common/error.h: the one way out on an error. Bad input, a failed CUDA, cuBLAS or NCCL call, a
// collective that hangs: everything that ends tp with an error leaves through fatal (or, for the
// multi-line hang report in comm.cuh, through fatal_begin ... fatal_end), with one line on stderr
// that says what is wrong and how to fix it, and exit status 1.
//
// Ranks are threads of one process running the same code on the same data, so several of them can
// fail at the same moment with the same error. fatal_begin lets the first one through and parks the
// others until the first ends the process: the user reads one error, not P copies of it.
//
// Under mpirun the same holds for processes: they run the same code on the same flags and data, so a
// bad flag fails in all of them at once. Process 0 reports at once; its exit ends the job (mpirun stops
// the others, first with SIGTERM). Every other process waits a moment first and reports only if the job
// is still running then: its error is its own (a data file missing on its machine, a collective that
// timed out). The line names the process when there are several.
#pragma once
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <unistd.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

// this process's index and the number of processes of the job (comm_procs_start sets them under mpirun)
static int g_fatal_proc = 0, g_fatal_nproc = 1;
// the last SIGINT or SIGTERM received (tp.cu's handler sets it): a process that is failing and gets one
// is being stopped by mpirun because another process failed first and said why
static std::atomic<int> g_signal{0};

// What every error line of a run ends with once it trains into -o: which checkpoint is the last good one,
// so that an error (a non-finite loss, a process that died, a collective that timed out) never leaves the
// user guessing what survived. Two buffers and an atomic index: a signal handler may read it (fatal_note)
// while a rank thread writes the other buffer.
static char g_fatal_notes[2][640];
static std::atomic<int> g_fatal_note_at{-1};  // -1: none
static bool g_fatal_note_printed = false;

static void fatal_note_set(const char* text) {
    if (!text) {
        g_fatal_note_at.store(-1);
        return;
    }
    int next = g_fatal_note_at.load() == 0 ? 1 : 0;
    snprintf(g_fatal_notes[next], sizeof(g_fatal_notes[0]), "%s", text);
    g_fatal_note_at.store(next);
}

static const char* fatal_note() {
    int at = g_fatal_note_at.load();
    return at < 0 ? nullptr : g_fatal_notes[at];
}

// Where the error report is written between fatal_begin and fatal_end: a memory stream that fatal_end
// writes to stderr in one write(), so that under mpirun another process's output (the shell's "Killed"
// of a peer) cannot land inside the line; stderr itself if that stream could not be opened.
static FILE* g_fatal_out = nullptr;
static char* g_fatal_text = nullptr;
static size_t g_fatal_size = 0;
static FILE* fatal_out() { return g_fatal_out ? g_fatal_out : stderr; }

// The first caller returns (with stdout flushed, so the error follows what was already printed);
// every later caller waits here until the first one ends the process.
static void fatal_begin() {
    static std::atomic<int> failing{0};
    if (failing.exchange(1) != 0)
        for (;;) pause();
    if (g_fatal_nproc > 1 && g_fatal_proc != 0) {
        // 4 s: mpirun's SIGTERM, then SIGKILL, reach a process within about 2 s of another one's exit
        for (int i = 0; i < 400; i++) {
            if (g_signal.load() != 0) _Exit(1);  // the job is being ended: process 0 has reported
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, nullptr);
        }
    }
    fflush(stdout);
    g_fatal_out = open_memstream(&g_fatal_text, &g_fatal_size);
}

// "error: " and, with several processes, "process p of N: ", the start of every error line
static void fatal_prefix() {
    fprintf(fatal_out(), "error: ");
    if (g_fatal_nproc > 1) fprintf(fatal_out(), "process %d of %d: ", g_fatal_proc, g_fatal_nproc);
}

[[noreturn]] static void fatal_end() {
    if (fatal_note() && !g_fatal_note_printed) fprintf(fatal_out(), "%s\n", fatal_note());  // after a report of several lines
    if (g_fatal_out && fclose(g_fatal_out) == 0) {
        for (size_t at = 0; at < g_fatal_size;) {
            ssize_t n = write(2, g_fatal_text + at, g_fatal_size - at);
            if (n <= 0) break;
            at += (size_t)n;
        }
    }
    fflush(stderr);
    _Exit(1);  // ranks are threads that may be blocked in a collective: there is nothing to unwind to
}

// "error: <message>" on stderr and exit status 1. The message's control bytes become \xNN: what it quotes
// from the user (a file name, a prompt, a damaged file's text) cannot break it over lines or drive the terminal.
[[noreturn]] static void fatal(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static void fatal(const char* fmt, ...) {
    fatal_begin();
    va_list ap;
    va_start(ap, fmt);
    fatal_prefix();
    char* text = nullptr;
    if (vasprintf(&text, fmt, ap) < 0) text = nullptr;
    for (const char* c = text ? text : fmt; *c; c++) {
        unsigned char b = (unsigned char)*c;
        if (b < 0x20 || b == 0x7f) fprintf(fatal_out(), "\\x%02x", b);
        else fputc(b, fatal_out());
    }
    free(text);
    if (fatal_note()) fprintf(fatal_out(), "; %s", fatal_note());
    g_fatal_note_printed = true;
    fprintf(fatal_out(), "\n");
    va_end(ap);
    fatal_end();
}

// A library call of rank `rank` failed: name the rank, the call, the library's message and the place.
[[noreturn]] static void fatal_call(int rank, const char* call, const char* msg, const char* file, int line) {
    fatal("rank %d: %s failed: %s (%s:%d)", rank, call, msg, file, line);
}

#define CUDA_CHECK(rank, call)                                                                       \
    do {                                                                                             \
        cudaError_t err_ = (call);                                                                   \
        if (err_ != cudaSuccess) fatal_call((rank), #call, cudaGetErrorString(err_), __FILE__, __LINE__); \
    } while (0)

// After a kernel launch: a bad launch configuration shows here, not at the next sync. Built with
// -DTP_CUDA_DEBUG (make debug) it also waits for the kernel, so a fault (an illegal address) names
// the kernel that caused it.
#ifdef TP_CUDA_DEBUG
#define TP_CUDA_DEBUG_SYNC() cudaDeviceSynchronize()
#else
#define TP_CUDA_DEBUG_SYNC() cudaSuccess
#endif
#define CUDA_LAUNCH_CHECK(rank, kernel)                                                              \
    do {                                                                                             \
        cudaError_t err_ = cudaGetLastError();                                                       \
        if (err_ == cudaSuccess) err_ = TP_CUDA_DEBUG_SYNC();                                        \
        if (err_ != cudaSuccess) fatal_call((rank), "launch of " kernel, cudaGetErrorString(err_), __FILE__, __LINE__); \
    } while (0)

#define CUBLAS_CHECK(rank, call)                                                                     \
    do {                                                                                             \
        cublasStatus_t st_ = (call);                                                                 \
        if (st_ != CUBLAS_STATUS_SUCCESS) fatal_call((rank), #call, cublasGetStatusString(st_), __FILE__, __LINE__); \
    } while (0)

// an NCCL call of rank `rank` on communicator `comm`, with NCCL's own text for the last error
#define NCCL_CHECK(rank, comm, call)                                                                 \
    do {                                                                                             \
        ncclResult_t nr_ = (call);                                                                   \
        if (nr_ != ncclSuccess) {                                                                    \
            char m_[512];                                                                            \
            snprintf(m_, sizeof(m_), "%s (%s)", ncclGetErrorString(nr_), ncclGetLastError(comm));    \
            fatal_call((rank), #call, m_, __FILE__, __LINE__);                                       \
        }                                                                                            \
    } while (0)

#ifdef TP_MPI
// an MPI call (MPI_ERRORS_RETURN is set, so failures come back here), with MPI's own text for the error
#define MPI_CHECK(call)                                                                              \
    do {                                                                                             \
        int mr_ = (call);                                                                            \
        if (mr_ != MPI_SUCCESS) {                                                                    \
            char m_[MPI_MAX_ERROR_STRING];                                                           \
            int len_ = 0;                                                                            \
            MPI_Error_string(mr_, m_, &len_);                                                        \
            fatal("%s failed: %s (%s:%d)", #call, m_, __FILE__, __LINE__);                           \
        }                                                                                            \
    } while (0)
#endif
