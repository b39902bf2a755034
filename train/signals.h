// train/signals.h (needs tp.cu's Run and RankRun): Ctrl-C and SIGTERM. The handler says at once what
// will happen and sets a flag; the ranks stop together at the next point where they all look at it, save
// when -o is set, and exit 0. tp.cu includes it before its loop.
#pragma once
#include <atomic>
#include <csignal>
#include <unistd.h>

// Ctrl-C / SIGTERM: the handler says at once what will happen and sets a flag; the ranks stop together
// at the next point where they all look at it (after a training step, between two val batches, between
// two sampled tokens), save when -o is set, and exit 0. A second signal kills at once.
// (the flag, g_signal in common/error.h, and the phase are lock-free atomics: safe in a signal handler and
// read without a race)
enum Phase { PHASE_STEP, PHASE_EVAL, PHASE_SAMPLE };
static std::atomic<int> g_phase{PHASE_STEP};
static char g_signal_msg[3][160];  // what the handler prints in each phase, written before it is installed

// Under mpirun a SIGTERM from the parent (mpirun, or its daemon on another machine) means the job is being
// ended: a process of it died or failed (mpirun then ends the others, and kills them a second later), or
// mpirun itself was stopped. This process cannot finish a step with a peer gone, let alone save: it says so,
// with the last good checkpoint, and exits at once instead of promising a save.
static char g_mpi_end_msg[160];

static void write_str(const char* s) {
    ssize_t ignored = write(STDERR_FILENO, s, strlen(s));  // write and strlen are async-signal-safe
    (void)ignored;
}

static void on_signal(int sig, siginfo_t* info, void*) {
    if (g_procs.n > 1 && sig == SIGTERM && info && info->si_pid == getppid()) {
        write_str(g_mpi_end_msg);
        const char* note = fatal_note();
        write_str(note ? note : "nothing was saved (no -o)");
        write_str("\n");
        _exit(1);
    }
    g_signal.store(sig);
    const char* msg = g_signal_msg[g_phase.load()];
    ssize_t ignored = write(STDOUT_FILENO, msg, strlen(msg));
    (void)ignored;
}

static void signal_setup(const Run* run) {
    const char* then = run->args.outdir && !run->sample_only ? ", then saving" : "";
    if (g_procs.me != 0) then = nullptr;  // under mpirun process 0 says it, once
    for (int p = 0; p < 3 && then; p++) {
        const char* what[3] = {"after this step", "after this evaluation batch", "this sample"};
        snprintf(g_signal_msg[p], sizeof(g_signal_msg[0]), "\ntp: stopping %s%s (Ctrl-C again quits at once)\n", what[p], then);
    }
    snprintf(g_mpi_end_msg, sizeof(g_mpi_end_msg), "tp: process %d of %d: mpirun is ending the job (a process of it died or failed, or "
             "mpirun was stopped): stopping without saving; ", g_procs.me, g_procs.n);
    struct sigaction sa = {};
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_RESETHAND | SA_SIGINFO;  // a second Ctrl-C stops at once
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
}

// Whether a signal asks the ranks to stop, the same answer on every rank of every process: every rank's
// flag summed over the world group (a rank deciding alone would leave the others waiting in the next
// collective). A training step carries the same question in its own world all-reduce (replicas_mean).
static bool stop_requested(RankRun* rr) {
    float x = g_signal.load() != 0 ? 1.0f : 0.0f;
    comm_allreduce(&rr->world, &x, 1, COMM_SUM, "signal check", -1);
    return x > 0;
}

// The same for the ranks of replica 0 alone, which sample while the other replicas wait: its rank 0 reads
// the flag between two barriers of its TP group and its ranks read the decision after the second.
static bool sample_stop_requested(Run* run, Rank* rk) {
    comm_barrier(&rk->tp, "signal check");
    if (rk->rank == 0) run->stop_now = g_signal.load() != 0;
    comm_barrier(&rk->tp, "signal check");
    return run->stop_now;
}
