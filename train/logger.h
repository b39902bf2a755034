// train/logger.h: DIR/log.csv, one row per training step, for plotting (data/plot.py) and for comparing
// runs. Columns: step, loss, val_loss (empty unless measured before that step), lr, ms, tok_per_s (all
// replicas), comm_ms (time in the tensor-parallel collectives), comm_bytes (bytes rank 0 sent in them,
// as a ring sends them), the same bytes by kind: allreduce_bytes, reducescatter_bytes, allgather_bytes;
// then dp_ms and dp_bytes, the same for its data-parallel collectives (0 with one replica).
#pragma once
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include "../common/error.h"
#include "../comm.cuh"

struct Logger {
    FILE* f;  // null: no -o, nothing logged
};

// A new run writes a fresh log.csv; a resumed run appends to it.
static void logger_open(Logger* lg, const char* dir, bool resuming) {
    std::string path = std::string(dir) + "/log.csv";
    lg->f = fopen(path.c_str(), resuming ? "a" : "w");
    if (!lg->f) fatal("cannot write %s: %s", path.c_str(), strerror(errno));
    if (!resuming)
        fprintf(lg->f, "step,loss,val_loss,lr,ms,tok_per_s,comm_ms,comm_bytes,allreduce_bytes,reducescatter_bytes,allgather_bytes,"
                       "dp_ms,dp_bytes\n");
}

// step counts from 1 (the step just taken); val_loss is NaN when none was measured; sent: TP bytes by kind
static void logger_step(Logger* lg, int step, float loss, float val_loss, float lr, double seconds, double tokens,
                        double comm_seconds, const double sent[COMM_KINDS], double dp_seconds, double dp_sent) {
    if (!lg->f) return;
    char val[32] = "";
    if (!std::isnan(val_loss)) snprintf(val, sizeof(val), "%f", val_loss);
    double total = 0;
    for (int k = 0; k < COMM_KINDS; k++) total += sent[k];
    fprintf(lg->f, "%d,%.6f,%s,%.6e,%.3f,%.1f,%.3f,%.0f,%.0f,%.0f,%.0f,%.3f,%.0f\n", step, loss, val, lr, seconds * 1e3, tokens / seconds,
            comm_seconds * 1e3, total, sent[KIND_ALLREDUCE], sent[KIND_REDUCESCATTER], sent[KIND_ALLGATHER], dp_seconds * 1e3, dp_sent);
}

static void logger_close(Logger* lg) {
    if (lg->f) fclose(lg->f);
    lg->f = nullptr;
}
