#!/usr/bin/env bash
# run_tests.sh BUILD_DIR: what `make emu` runs once the emulated binaries are built.
#   1. test_tp's GPU section on the emulated GPU (2 devices: NCCL at P=2, shared GPU memory at P=4), seed 1;
#   2. the same again with schedule seed 2 and cuBLASLt refusing every algorithm, so the plain-GEMM fallback
#      of matmul_forward_cuda runs where the first pass used the bias epilogue;
#   3. tp itself on 2 emulated GPUs: 4 ranks through shared GPU memory with peer access, writing a checkpoint,
#      then 2 ranks through NCCL resuming from it, then 2 data-parallel replicas over NCCL with ZeRO-1; the
#      losses against a CPU run of the same steps;
#   4. the emulator's own tests (dev/emu/test_emu.cu): planted bugs, launch limits, semantics.
# Adds up their "N passed, N failed" lines into one closing line; a run that dies before its counts (an
# emulator report ends the process with status 86) counts as one failure. Exits non-zero on any failure.
set -uo pipefail
dir=${1:-build/emu}
passed=0
failed=0
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
run "test_tp's GPU section again (TP_EMU_SEED=2, cuBLASLt refusing: the GEMM fallback)" \
    timeout 900 env TP_EMU_SEED=2 TP_EMU_LT_REFUSE=1 "$dir/test_tp_emu" gpu
# one check of tp's own driver: the run exits 0 and its step-`step` loss is within TF32 error of the CPU's
check_tp() {
    local title=$1 out=$2 rc=$3 step=$4 want=$5
    local got
    got=$(grep -E "^step +$step/" "$out" | tail -n 1 | awk '{print $5}')
    if [ "$rc" -eq 0 ] && [ -n "$got" ] && awk -v a="$got" -v b="$want" 'BEGIN { d = (a - b) / b; exit !(d < 2e-3 && d > -2e-3) }'; then
        echo "  ok   $title: exit 0, step-$step loss $got vs $want on the CPU (rel diff < 2e-3, TF32)"
        passed=$((passed + 1))
    else
        echo "  FAIL $title: exit $rc, step-$step loss '$got' vs $want on the CPU (bound 2e-3)"
        cat "$out"
        failed=$((failed + 1))
    fi
}
echo "== emu: tp itself on 2 emulated GPUs, against the CPU"
tmp=$(mktemp -d)
args="-e L2C64H4 -b 2 -t 32 -v 2 -m 1 --threads 1"
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
rm -rf "$tmp"

run "the emulator's own tests: planted bugs, launch limits, semantics" timeout 600 env TP_EMU_SEED=1 "$dir/test_emu"

rm -f "$log"
echo "(emulated GPU tests: $(($(date +%s) - start)) s)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
