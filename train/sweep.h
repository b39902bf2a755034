// train/sweep.h (needs the model and tp.cu's loop): --sweep 1, the scaling table. Every valid P, every
// (P, D) and every (P, D, S) with S pipeline stages that fits the cores or GPUs, trains a few steps of the
// same model on the same data through the same train_step as a run; one table (and with -o, sweep.csv) of
// time, throughput, speed-up, communication and memory per grid.
#pragma once
#include <string>
#include <thread>
#include <vector>
#include "plan.h"

// world rank 0's time and bytes sent (as a ring sends them) over the timed steps of one grid
struct SweepTime {
    double seconds, comm_seconds, dp_seconds, sent, dp_sent, pp_seconds, pp_sent;
    double sent_kind[COMM_KINDS];  // the TP bytes by kind of collective
    int steps;
};

// one rank of one grid: --sweep-steps training steps, the first 2 not timed (they warm up caches and allocations)
static void sweep_rank(Run* run, int d, int r, int stage, SweepTime* out) {
    RankRun rr;
    rank_run_start(&rr, run, d, r, stage);
    comm_barrier(&rr.world, "start");
    for (int step = 0; step < run->args.sweep_steps; step++) {
        StepStats st = train_step(run, &rr, step);
        if (rr.world.rank == 0 && step >= 2) {
            double sent[COMM_KINDS];
            out->seconds += st.seconds;
            out->comm_seconds += st.comm_seconds;
            out->dp_seconds += st.dp_seconds;
            out->sent += ring_bytes(st.comm_moved, run->P, sent);
            for (int k = 0; k < COMM_KINDS; k++) out->sent_kind[k] += sent[k];
            out->dp_sent += ring_bytes(st.dp_moved, run->Dg, sent);
            out->pp_seconds += st.pp_seconds;
            out->pp_sent += st.pp_bytes;
            out->steps++;
        }
    }
    rank_run_end(&rr);
}

static void sweep(Run* run) {
    const Args* a = &run->args;
    const GPTConfig* c = &run->cfg;
    int cores = cpu_cores();
    int units = run->device == DEV_CUDA ? run->ngpu : cores;
    printf("\nsweep: %d steps per grid (the first 2 not timed), batch %d x %d per replica, %d micro-batch%s per step, on the %s; "
           "every valid P, every (P, D) with P x D <= %d, and every (P, D, S) with S pipeline stages and P x D x S <= %d\n",
           a->sweep_steps, a->B, a->T, run->accum, run->accum > 1 ? "es" : "", run->device == DEV_CUDA ? "GPU" : "CPU", units, units);
    // the prediction of every grid (train/plan.h), measured first
    PlanMeasured pm;
    plan_measure(run, &pm);
    printf("%4s %4s %4s %8s %10s %10s %8s %10s %8s %8s %8s %9s %9s %9s %12s %10s\n", "P", "D", "S", "threads", "ms/step", "tok/s",
           "speedup", "efficiency", "comm %", "dp %", "pp wait%", "comm MB", "dp MB", "pp MB", "MB per rank", "predicted");
    FILE* csv = nullptr;
    if (a->outdir) {
        std::string path = std::string(a->outdir) + "/sweep.csv";
        csv = fopen(path.c_str(), "w");
        if (!csv) fatal("cannot write %s: %s", path.c_str(), strerror(errno));
        fprintf(csv, "P,D,threads_per_rank,ms_per_step,tok_per_s,speedup,efficiency,comm_share,dp_share,comm_mb_per_step,"
                     "dp_mb_per_step,mb_per_rank,allreduce_mb_per_step,reducescatter_mb_per_step,allgather_mb_per_step,"
                     "predicted_ms_per_step,S,pp_wait_share,pp_mb_per_step\n");
    }
    ranks_teardown(run);  // run_setup made the groups of the run's own grid
    double base = 0;
    int units1 = 0;
    // the grids without stages first (S = 1: every (P, D) as before), then those with
    for (int S = 1; S <= c->L; S++)
    for (int D = 1; D <= units || D == 1; D++)
        for (int P = 1; P <= c->NH && P <= COMM_MAXP; P++) {
            if (!tp_valid(c, P) || ((D > 1 || S > 1) && P * D * S > units) || P * D * S > COMM_MAXP) continue;
            if (a->sp && P > 1 && !sp_splits(true, P, a->B, a->T)) {
                printf("%4d %4d %4d  skipped: --sp 1 needs P to divide B*T = %d\n", P, D, S, a->B * a->T);
                continue;
            }
            std::string why;
            run_set_stages(run, S);  // (memory_fits counts the stages' ranks; the sweep runs in one process)
            if (!memory_fits(run, P, D, &why)) {
                printf("%4d %4d %4d  skipped: %s\n", P, D, S, why.c_str());
                continue;
            }
            run->P = P;
            run->D = run->Dg = D;
            ranks_setup(run);
            SweepTime time = {};
            std::vector<std::thread> threads;
            for (int d = 0; d < D; d++)
                for (int stage = 0; stage < S; stage++)
                    for (int r = 0; r < P; r++) threads.emplace_back(sweep_rank, run, d, r, stage, &time);
            for (auto& t : threads) t.join();
            ranks_teardown(run);
            double ms = time.seconds / time.steps * 1e3, tps = (double)a->B * a->T * run->accum * D / (ms / 1e3);
            // efficiency: speedup over P=1 divided by the growth in compute units used (cores on the CPU,
            // GPUs on CUDA); on a CPU every grid uses the same cores, so the ideal speedup there is 1
            int used = run->device == DEV_CUDA ? std::min(P * D * S, run->ngpu) : std::min(P * D * S * run->threads, cores);
            if (base == 0) { base = ms; units1 = used; }  // P = 1, D = 1, unless it did not fit
            double speedup = base / ms * D, eff = speedup / ((double)used / units1);
            double share = time.comm_seconds / time.seconds, dp_share = time.dp_seconds / time.seconds;
            double mb = 0;  // the largest rank (with stages: the one with the most activations in flight, the first)
            for (int st = 0; st < S; st++) {
                int slots = S > 1 ? pp_slots(run->pp_schedule, S, st, run->accum) : 1;
                RankMemory m = rank_memory(c, P, D, a->zero, a->B, a->T, a->sp, a->recompute, a->attention != 0, S, st, slots,
                                           a->dtype == DTYPE_BF16);
                mb = std::max(mb, memory_total(&m) / 1e6);
            }
            double comm_mb = time.sent / time.steps / 1e6, dp_mb = time.dp_sent / time.steps / 1e6, pp_mb = time.pp_sent / time.steps / 1e6;
            double pp_share = time.pp_seconds / time.seconds;
            double pred = plan_predict_pp_ms(run, &pm, P, D, S);  // the cost model (train/plan.h)
            char pred_text[16], pred_csv[16];
            snprintf(pred_text, sizeof(pred_text), "%.1f", pred);
            snprintf(pred_csv, sizeof(pred_csv), "%.3f", pred);
            printf("%4d %4d %4d %8d %10.1f %10.0f %8.2f %10.2f %8.1f %8.1f %8.1f %9.2f %9.2f %9.2f %12.1f %10s\n", P, D, S, run->threads, ms,
                   tps, speedup, eff, 100 * share, 100 * dp_share, 100 * pp_share, comm_mb, dp_mb, pp_mb, mb, pred_text);
            fflush(stdout);
            double per_step = 1e6 * time.steps;
            if (csv)
                fprintf(csv, "%d,%d,%d,%.3f,%.1f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.2f,%.4f,%.4f,%.4f,%s,%d,%.4f,%.4f\n", P, D, run->threads, ms,
                        tps, speedup, eff, share, dp_share, comm_mb, dp_mb, mb, time.sent_kind[KIND_ALLREDUCE] / per_step,
                        time.sent_kind[KIND_REDUCESCATTER] / per_step, time.sent_kind[KIND_ALLGATHER] / per_step, pred_csv, S, pp_share, pp_mb);
        }
    run_set_stages(run, 1);
    if (csv) fclose(csv);
}

