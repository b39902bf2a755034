#!/usr/bin/env bash
# run_tests.sh BUILD_DIR: what `make emu` runs once the emulated binaries are built.
#   1. test_tp's GPU section on the emulated GPU (2 devices: NCCL at P=2, shared GPU memory at P=4), seed 1;
#   2. its CUDA ops and GPU collectives again (the gpu_ops group) with schedule seed 2 and cuBLASLt refusing
#      every algorithm, so the plain-GEMM fallback of matmul_forward_cuda runs where the first pass used the
#      bias epilogue, against the CPU's op (30 s on 2 cores, where the whole gpu group again took 203 s for
#      the same fallback in its training runs, more than CI's 20 minutes could hold);
#   3. tp itself on 2 emulated GPUs: 4 ranks through shared GPU memory with peer access, writing a checkpoint,
#      then 2 ranks through NCCL resuming from it, then 2 data-parallel replicas over NCCL with ZeRO-1, then 2
#      pipeline stages (a stage per GPU; and with TP=2 in each); the losses against a CPU run of the same steps;
#   4. tp under mpirun -np 2 (tp_emu built with MPI): TP=2 inside each process on NCCL, DP across the two
#      processes on the emulated NCCL's shared-memory communicators; with -z 1; with --sp 1; the checkpoint of
#      2 processes resumed by 1 process with --dp 2; 2 pipeline stages in the two processes (TP=2 on NCCL in
#      each, the boundary over MPI, the stages' sums on NCCL across them); the losses against the CPU run; then a process that dies
#      mid-step (SIGKILL) and the other reporting it through NCCL's error path within --timeout; and no
#      shared-memory segment left behind. Without mpirun, or with a tp_emu built without MPI, these report
#      themselves skipped;
#   5. the emulator's own tests (dev/emu/test_emu.cu): planted bugs, launch limits, semantics.
# Adds up their "N passed, N failed" lines into one closing line "N passed, N failed, N skipped"; a run that
# dies before its counts (an emulator report ends the process with status 86) counts as one failure. Exits
# non-zero on any failure.
set -uo pipefail
dir=${1:-build/emu}
passed=0
failed=0
skipped=0
log=$(mktemp)
start=$(date +%s)

run() {
    local title=$1
    shift
    echo "== emu: $title"
    "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    local line
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    if [ -n "$line" ]; then
        passed=$((passed + $(echo "$line" | cut -d' ' -f1)))
        failed=$((failed + $(echo "$line" | cut -d' ' -f3)))
    fi
    if [ "$rc" -ne 0 ] && { [ -z "$line" ] || [ "$(echo "$line" | cut -d' ' -f3)" = 0 ]; }; then
        echo "  FAIL $title: exited with status $rc before reporting a failure of its own"
        failed=$((failed + 1))
    fi
}

# each run is bounded: a hang the emulator does not see (a deadlock in host code) still ends CI
run "test_tp's GPU section (TP_EMU_SEED=1)" timeout 900 env TP_EMU_SEED=1 "$dir/test_tp_emu" gpu
run "test_tp's GPU ops again (TP_EMU_SEED=2, cuBLASLt refusing: the GEMM fallback)" \
    timeout 900 env TP_EMU_SEED=2 TP_EMU_LT_REFUSE=1 "$dir/test_tp_emu" gpu_ops
run "test_tp's GPU point to point on 4 emulated GPUs (ranks with a neighbour on each side)" \
    timeout 300 env TP_EMU_SEED=3 TP_EMU_DEVICES=4 "$dir/test_tp_emu" gpu_p2p
# one check of tp's own driver: the run exits 0 and its step-`step` loss is within TF32 error of the CPU's
check_tp() {
    local title=$1 out=$2 rc=$3 step=$4 want=$5 how=${6:-TF32}
    local got
    got=$(grep -E "^step +$step/" "$out" | tail -n 1 | awk '{print $5}')
    if [ "$rc" -eq 0 ] && [ -n "$got" ] && awk -v a="$got" -v b="$want" 'BEGIN { d = (a - b) / b; exit !(d < 2e-3 && d > -2e-3) }'; then
        echo "  ok   $title: exit 0, step-$step loss $got vs $want on the CPU (rel diff < 2e-3, $how)"
        passed=$((passed + 1))
    else
        echo "  FAIL $title: exit $rc, step-$step loss '$got' vs $want on the CPU (bound 2e-3)"
        cat "$out"
        failed=$((failed + 1))
    fi
}
echo "== emu: tp itself on 2 emulated GPUs, against the CPU"
tmp=$(mktemp -d)
# fp32 (TF32 on the GPU) against the CPU's fp32: --dtype is given, as its default differs between the two (the
# emulated GPU is an sm_90, where it is bf16; this build has no AVX-512, so its CPU's is fp32)
args="-e L2C64H4 -b 2 -t 32 -v 2 -m 1 --threads 1 --dtype fp32"
timeout 300 "$dir/tp_emu" $args -x 5 -g 0 --device cpu > "$tmp/cpu.txt" 2>&1
cpu3=$(grep -E '^step +3/' "$tmp/cpu.txt" | awk '{print $5}')
cpu5=$(grep -E '^step +5/' "$tmp/cpu.txt" | awk '{print $5}')
timeout 300 env TP_EMU_SEED=3 "$dir/tp_emu" $args -x 3 -g 16 --device cuda --tp 4 -o "$tmp/ckpt" > "$tmp/tp4.txt" 2>&1
check_tp "tp --device cuda --tp 4 (2 ranks per emulated GPU, shared memory with peer access, sampling)" "$tmp/tp4.txt" $? 3 "${cpu3:-nan}"
timeout 300 env TP_EMU_SEED=4 "$dir/tp_emu" $args -x 5 -g 0 --device cuda --tp 2 -o "$tmp/ckpt" -y 1 > "$tmp/tp2.txt" 2>&1
check_tp "tp --device cuda --tp 2 (NCCL) resuming the TP=4 checkpoint at step 3" "$tmp/tp2.txt" $? 5 "${cpu5:-nan}"
# data parallelism: 2 replicas of -b 1, one per emulated GPU, their DP group on NCCL, ZeRO-1; the same global batch as the CPU's -b 2
timeout 300 env TP_EMU_SEED=5 "$dir/tp_emu" $args -b 1 -x 3 -g 0 --device cuda --tp 1 --dp 2 -z 1 > "$tmp/dp2.txt" 2>&1
check_tp "tp --device cuda --dp 2 -b 1 -z 1 (a replica per emulated GPU, NCCL between them)" "$tmp/dp2.txt" $? 3 "${cpu3:-nan}"
# pipeline parallelism: 2 stages of -b 1 micro-batches (-d 64: 2 per step, the CPU's -b 2), a stage per emulated GPU; then with TP=2 in each
timeout 300 env TP_EMU_SEED=6 "$dir/tp_emu" $args -b 1 -d 64 -x 3 -g 0 --device cuda --tp 1 --pp 2 > "$tmp/pp2.txt" 2>&1
check_tp "tp --device cuda --pp 2 -b 1 -d 64 (a stage per emulated GPU, 1F1B, the boundary over NCCL send/recv)" "$tmp/pp2.txt" $? 3 "${cpu3:-nan}"
timeout 300 env TP_EMU_SEED=7 "$dir/tp_emu" $args -b 1 -d 64 -x 3 -g 0 --device cuda --tp 2 --pp 2 --pp-schedule gpipe > "$tmp/pp2tp2.txt" 2>&1
check_tp "tp --device cuda --tp 2 --pp 2 -b 1 -d 64 (GPipe; each stage's TP group on NCCL)" "$tmp/pp2tp2.txt" $? 3 "${cpu3:-nan}"
# bf16, the default on the emulated sm_90 (said at start, below), against the CPU's --dtype bf16: the same
# bf16 numerics, the GPU's bf16 GEMM summing the same products in another order
timeout 300 "$dir/tp_emu" ${args%--dtype fp32} -x 3 -g 0 --device cpu --dtype bf16 > "$tmp/cpu_bf16.txt" 2>&1
cpubf3=$(grep -E '^step +3/' "$tmp/cpu_bf16.txt" | awk '{print $5}')
timeout 300 env TP_EMU_SEED=12 "$dir/tp_emu" ${args%--dtype fp32} -x 3 -g 0 --device cuda --tp 2 > "$tmp/gpu_bf16.txt" 2>&1
check_tp "tp --device cuda --tp 2 without --dtype (bf16, the default on sm_90)" "$tmp/gpu_bf16.txt" $? 3 "${cpubf3:-nan}" "bf16 on both"
# which way the boundary tensors went, as the startup lines say: GPU to GPU with a stage per GPU, through
# the host where TP rank r of both stages is on one GPU; and the GPU's default dtype
for want in "pp2.txt|the boundary tensors go GPU to GPU over NCCL send/recv" \
            "pp2tp2.txt|the boundary tensors go through host memory (the stages' TP rank r share a GPU)" \
            "gpu_bf16.txt|--dtype bf16, the default here (this GPU has bf16 tensor cores"; do
    file=${want%%|*} line=${want#*|}
    if grep -qF -- "$line" "$tmp/$file"; then
        echo "  ok   $file says: $line"
        passed=$((passed + 1))
    else
        echo "  FAIL $file does not say: $line"
        failed=$((failed + 1))
    fi
done

# tp under mpirun: the emulated NCCL across processes (nccl.cpp's shared-memory communicators)
echo "== emu: tp under mpirun -np 2 on emulated GPUs (DP across the processes on NCCL), against the CPU"
mpi_start=$(date +%s)
mpi_cases=8
if ! command -v mpirun >/dev/null 2>&1; then
    echo "  skip the $mpi_cases mpirun cases: no mpirun on the PATH (apt-get install openmpi-bin libopenmpi-dev)"
    skipped=$((skipped + mpi_cases))
elif ! grep -q MPI_Init_thread "$dir/tp_emu"; then
    echo "  skip the $mpi_cases mpirun cases: $dir/tp_emu was built without MPI (no mpicxx, or MPI=0)"
    skipped=$((skipped + mpi_cases))
else
    # as root Open MPI wants these; the processes share this machine, so its shared-memory transport is all
    # they need. 4 emulated GPUs per process: the second process's ranks take GPUs 2 and 3, as on a machine
    # with 4 GPUs, so that no two ranks of the data-parallel communicator share one.
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader TP_EMU_DEVICES=4
    mpirun="timeout 300 mpirun -np 2 --oversubscribe"
    ls /dev/shm | grep '^tp-emu-nccl-' > "$tmp/shm_before"
    # -b 1 in each of 2 processes: the global batch of the CPU's -b 2
    $mpirun env TP_EMU_SEED=6 "$dir/tp_emu" $args -b 1 -x 3 -g 0 --device cuda --tp 2 -o "$tmp/mpi" > "$tmp/mpi.txt" 2>&1
    check_tp "mpirun -np 2 tp --device cuda --tp 2 -b 1 (TP on NCCL in each process, DP on NCCL across them), saving" "$tmp/mpi.txt" $? 3 "${cpu3:-nan}"
    $mpirun env TP_EMU_SEED=7 "$dir/tp_emu" $args -b 1 -x 3 -g 0 --device cuda --tp 2 -z 1 > "$tmp/mpi_z.txt" 2>&1
    check_tp "mpirun -np 2 tp --device cuda --tp 2 -b 1 -z 1 (ZeRO-1: reduce-scatter and all-gather across the processes)" "$tmp/mpi_z.txt" $? 3 "${cpu3:-nan}"
    $mpirun env TP_EMU_SEED=8 "$dir/tp_emu" $args -b 1 -x 3 -g 0 --device cuda --tp 2 --sp 1 > "$tmp/mpi_sp.txt" 2>&1
    check_tp "mpirun -np 2 tp --device cuda --tp 2 -b 1 --sp 1 (sequence parallel inside each process)" "$tmp/mpi_sp.txt" $? 3 "${cpu3:-nan}"
    # the checkpoint of the 2 processes, resumed by 1 process holding both replicas (the same global batch)
    timeout 300 env TP_EMU_SEED=9 "$dir/tp_emu" $args -b 1 -x 5 -g 0 --device cuda --tp 2 --dp 2 -o "$tmp/mpi" -y 1 > "$tmp/mpi_resume.txt" 2>&1
    check_tp "1 process tp --device cuda --tp 2 --dp 2 -b 1 resuming the checkpoint of mpirun -np 2 at step 3" "$tmp/mpi_resume.txt" $? 5 "${cpu5:-nan}"
    # pipeline stages in different processes: stage 0 (TP=2) in process 0, stage 1 in process 1; -d 64 makes
    # 2 micro-batches of -b 1, the CPU's -b 2; a checkpoint, which process 0 writes with process 1's layers
    $mpirun env TP_EMU_SEED=11 "$dir/tp_emu" $args -b 1 -d 64 -x 3 -g 0 --device cuda --tp 2 --pp 2 -o "$tmp/mpipp" > "$tmp/mpi_pp.txt" 2>&1
    check_tp "mpirun -np 2 tp --device cuda --tp 2 --pp 2 -b 1 -d 64 (a stage per process: MPI between them, NCCL across them for the sums)" "$tmp/mpi_pp.txt" $? 3 "${cpu3:-nan}"
    # A process that dies mid-step: the emulated NCCL kills process 1 (SIGKILL) as its collective #2 of the
    # data-parallel communicator starts (one all-reduce of the gradients per step: step 3's). Process 0 must
    # see it through ncclCommGetAsyncError, say so as on a GPU, and exit non-zero within --timeout. Each
    # process runs under a shell that prints tp's exit status, and orte_enable_recovery keeps mpirun from
    # ending process 0 itself when process 1 vanishes (that would race with the report under test). With
    # --tp 1 the TP group is one rank that synchronises the stream outright: the DP group's polling wait
    # must come first (gpt.cu's dev_download); with --tp 2 both groups are on NCCL.
    for tpk in 1 2; do
        start_kill=$(date +%s.%N)
        $mpirun --mca orte_enable_recovery 1 env TP_EMU_SEED=10 TP_EMU_NCCL_KILL=1:2 \
            sh -c '"$@"; echo "tp-emu test: process $OMPI_COMM_WORLD_RANK: tp exited with status $?" >&2' sh \
            "$dir/tp_emu" $args -b 1 -x 100 -g 0 --device cuda --tp $tpk --timeout 5 > "$tmp/mpi_kill.txt" 2>&1
        end_kill=$(date +%s.%N)
        died=$(grep -o 'kills itself in .* at [0-9.]*' "$tmp/mpi_kill.txt" | awk '{print $NF}')
        took=$(awk -v a="${died:-$start_kill}" -v b="$end_kill" 'BEGIN { printf "%.2f", b - a }')
        msg=$(grep -m 1 'error: .*NCCL failed in .*remote process exited' "$tmp/mpi_kill.txt")
        title="mpirun -np 2 tp --tp $tpk, process 1 killed mid-step"
        if [ -n "$died" ] && [ -n "$msg" ] && grep -q 'process 0: tp exited with status 1$' "$tmp/mpi_kill.txt" &&
            grep -q 'process 1: tp exited with status 137$' "$tmp/mpi_kill.txt" && awk -v t="$took" 'BEGIN { exit !(t < 5) }'; then
            echo "  ok   $title: process 0 exits 1, $took s after the kill (bound: --timeout 5 s): $msg"
            passed=$((passed + 1))
        else
            echo "  FAIL $title: want process 0 to report NCCL's remote error and exit 1 within 5 s of the kill (took $took s)"
            cat "$tmp/mpi_kill.txt"
            failed=$((failed + 1))
        fi
    done
    # every segment is unlinked once its ranks have joined, killed job included; one that another job on
    # this machine has open for a moment is gone 2 s later
    new_segments() { ls /dev/shm | grep '^tp-emu-nccl-' | grep -vxF -f "$tmp/shm_before" ; }
    left=$(new_segments)
    [ -n "$left" ] && sleep 2 && left=$(new_segments)
    if [ -z "$left" ]; then
        echo "  ok   no shared-memory segment of the emulated NCCL is left in /dev/shm"
        passed=$((passed + 1))
    else
        echo "  FAIL the emulated NCCL left shared-memory segments in /dev/shm: $(echo $left)"
        failed=$((failed + 1))
    fi
    unset TP_EMU_DEVICES
    echo "(tp under mpirun: $(($(date +%s) - mpi_start)) s)"
fi
rm -rf "$tmp"

run "the emulator's own tests: planted bugs, launch limits, semantics" timeout 600 env TP_EMU_SEED=1 "$dir/test_emu"

rm -f "$log"
echo "(emulated GPU tests: $(($(date +%s) - start)) s)"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
