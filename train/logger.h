// train/logger.h: DIR/log.csv, one row per training step, for plotting (data/plot.py) and for comparing
// runs. Columns: step, loss, val_loss (empty unless measured before that step), lr, ms, tok_per_s (all
// replicas), comm_ms (time in the tensor-parallel collectives), comm_bytes (bytes rank 0 sent in them,
// as a ring sends them), the same bytes by kind: allreduce_bytes, reducescatter_bytes, allgather_bytes;
// then dp_ms and dp_bytes, the same for its data-parallel collectives (0 with one replica); then pp_ms
// and pp_bytes, rank 0's (the first stage's) wait for the next pipeline stage and the bytes it sent it (0
// with one stage).
//
// The log survives a crash: each row reaches the file whole, in one write() to a descriptor opened for
// appending (nothing waits in a buffer for a kill -9 to lose, no row is ever half written), and a resume
// from step N first keeps only the rows of steps 1..N, rewritten atomically, so that the steps of
// log.csv count up by one with no gap and no repeat however often the run was killed and resumed.
#pragma once
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <string>
#include <unistd.h>
#include "../common/error.h"
#include "../comm.cuh"
#include "../common/safe_file.h"

struct Logger {
    int fd = -1;                // -1: no -o, nothing logged
    bool write_failed = false;  // warned once; training goes on
};

#define LOG_HEADER "step,loss,val_loss,lr,ms,tok_per_s,comm_ms,comm_bytes,allreduce_bytes,reducescatter_bytes,allgather_bytes,dp_ms,dp_bytes,pp_ms,pp_bytes\n"

// A new run starts DIR/log.csv afresh. A run resumed from step resume_step (-1: a new run) keeps the
// header and the complete rows of steps 1..resume_step of the log that is there, and appends after them.
static void logger_open(Logger* lg, const char* dir, int resume_step) {
    std::string path = std::string(dir) + "/log.csv";
    std::string kept = LOG_HEADER;
    FILE* old = resume_step > 0 ? fopen(path.c_str(), "r") : nullptr;
    if (old) {
        char line[4096];
        bool header = true;
        int expect = 1;
        while (fgets(line, sizeof(line), old)) {
            size_t n = strlen(line);
            if (n == 0 || line[n - 1] != '\n') break;  // a row cut short: nothing after it is kept either
            if (header) { header = false; continue; }
            if (atoi(line) != expect || expect > resume_step) break;  // steps after the checkpoint, or a gap
            kept += line;
            expect++;
        }
        fclose(old);
    }
    AtomicFile a;
    bool ok = atomic_open(&a, path.c_str());
    if (ok) {
        atomic_write(&a, kept.data(), kept.size());
        ok = atomic_close(&a);
    }
    if (ok) lg->fd = open(path.c_str(), O_WRONLY | O_APPEND);
    if (!ok || lg->fd < 0) fatal("cannot write %s: %s", path.c_str(), strerror(ok ? errno : a.err));
    lg->write_failed = false;
}

// One row, formatted whole and written with one call.
static void logger_row(Logger* lg, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void logger_row(Logger* lg, const char* fmt, ...) {
    char row[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(row, sizeof(row), fmt, ap);
    va_end(ap);
    if (n < 0 || n >= (int)sizeof(row) || write(lg->fd, row, n) != n) {
        if (!lg->write_failed) fprintf(stderr, "warning: a row of log.csv could not be written (%s); training goes on\n", strerror(errno));
        lg->write_failed = true;
    }
}

// step counts from 1 (the step just taken); val_loss is NaN when none was measured; sent: TP bytes by kind
static void logger_step(Logger* lg, int step, float loss, float val_loss, float lr, double seconds, double tokens,
                        double comm_seconds, const double sent[COMM_KINDS], double dp_seconds, double dp_sent, double pp_seconds,
                        double pp_sent) {
    if (lg->fd < 0) return;
    char val[32] = "";
    if (!std::isnan(val_loss)) snprintf(val, sizeof(val), "%f", val_loss);
    double total = 0;
    for (int k = 0; k < COMM_KINDS; k++) total += sent[k];
    logger_row(lg, "%d,%.6f,%s,%.6e,%.3f,%.1f,%.3f,%.0f,%.0f,%.0f,%.0f,%.3f,%.0f,%.3f,%.0f\n", step, loss, val, lr, seconds * 1e3,
               tokens / seconds, comm_seconds * 1e3, total, sent[KIND_ALLREDUCE], sent[KIND_REDUCESCATTER], sent[KIND_ALLGATHER],
               dp_seconds * 1e3, dp_sent, pp_seconds * 1e3, pp_sent);
}

static void logger_close(Logger* lg) {
    if (lg->fd >= 0) close(lg->fd);
    lg->fd = -1;
}
