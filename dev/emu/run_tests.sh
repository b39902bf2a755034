#!/usr/bin/env bash
# run_tests.sh BUILD_DIR: what `make emu` runs once the emulated binaries are built.
#   1. test_tp's GPU section on the emulated GPU (2 devices: NCCL at P=2, shared GPU memory at P=4), seed 1;
#   2. the same again with schedule seed 2 and cuBLASLt refusing every algorithm, so the plain-GEMM fallback
#      of matmul_forward_cuda runs where the first pass used the bias epilogue;
#   3. the emulator's own tests (dev/emu/test_emu.cu): planted bugs, launch limits, semantics.
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
run "the emulator's own tests: planted bugs, launch limits, semantics" timeout 600 env TP_EMU_SEED=1 "$dir/test_emu"

rm -f "$log"
echo "(emulated GPU tests: $(($(date +%s) - start)) s)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
