# make             builds ./tp (all that `make && ./tp` needs; with MPI, for mpirun, when mpicxx is found,
#                  without it with make MPI=0)
# make test        builds ./test_tp and runs the tests (all of them; TEST_GROUPS="ops tp" runs those groups)
# make asan tsan   some of the tests again, under AddressSanitizer + UndefinedBehaviorSanitizer (the groups
#                  of ASAN_GROUPS) and ThreadSanitizer (TSAN_GROUPS); ASAN_GROUPS= or TSAN_GROUPS= (empty)
#                  runs every group under it (on 2 cores: about 6 and 17-21 minutes; the lists: about 2 each)
# make debug       ./tp_debug and ./test_tp_debug for work on kernels: -O0 -g, device debug info with line
#                  numbers (-G, for cuda-gdb and compute-sanitizer), every kernel launch waited for
# make gpucheck    on a GPU machine: GPU tests, memcheck, GPT-2 124M benchmark (and gpucheck-dtype: bf16
#                  against fp32 at TP=1 and 2, the default dtype's line), --plan 1 against the sweep;
#                  results in gpucheck_out/
# make emu         the CUDA path (kernels, cuBLAS, NCCL) on the emulated GPU of dev/emu, with memcheck and
#                  racecheck, and the emulator's own planted-bug tests; no GPU needed
# make toolkit     says whether the CUDA toolkit tp builds with is all there (the README's Build section)
# WERROR=1         warnings stop the build (CI sets it; a newer compiler's new warnings do not stop yours)
MAKEFLAGS += -j$(shell nproc)  # builds side by side (make test: test_tp beside tp)
# nvcc: the toolkit's usual place, else the one on PATH (a toolkit installed elsewhere, or pip's)
NVCC     ?= $(firstword $(wildcard /usr/local/cuda/bin/nvcc) $(shell command -v nvcc 2>/dev/null) /usr/local/cuda/bin/nvcc)
CUDA_DIR  = $(abspath $(dir $(shell command -v $(NVCC) 2>/dev/null))..)
# NCCL: from NCCL_DIR when given (a folder holding include/nccl.h and lib/ or lib64/ with libnccl.so*);
# else where the toolkit or the system keeps it, found by nvcc itself; else, when none of those has
# nccl.h, the copy pip installs with PyTorch (the nvidia-nccl-cu* package, found through python3). Such a
# folder's library may be only libnccl.so.2 (pip's is), so it is linked by that name, and the folder
# becomes the binaries' run path: ./tp starts without LD_LIBRARY_PATH.
NCCL_HEADERS = $(wildcard $(CUDA_DIR)/include/nccl.h /usr/include/nccl.h /usr/local/include/nccl.h)
ifeq ($(origin NCCL_DIR),undefined)
NCCL_DIR := $(if $(NCCL_HEADERS),,$(shell python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null))
endif
ifneq ($(strip $(NCCL_DIR)),)
NCCL_LIBDIR = $(firstword $(patsubst %/,%,$(dir $(wildcard $(NCCL_DIR)/lib64/libnccl.so* $(NCCL_DIR)/lib/libnccl.so*))) $(NCCL_DIR)/lib)
NCCL_CFLAGS = -I$(NCCL_DIR)/include
NCCL_LIBS   = -L$(NCCL_LIBDIR) $(if $(wildcard $(NCCL_LIBDIR)/libnccl.so),-lnccl,-l:libnccl.so.2) -Xlinker -rpath,$(NCCL_LIBDIR)
else
NCCL_LIBS   = -lnccl
endif
comma    := ,
# The CPU code is built for the level of x86-64 the machine has, not for its model: every CPU with AVX-512
# gets the same instructions (x86-64-v4, 512-bit vectors), every AVX2 one the same (x86-64-v3), with
# generic tuning; so an Intel and an AMD host run the same vector code and print the same losses. The
# speed is that of -march=native here (the GEMM tile's registers are chosen in kernels_cpu.h). Others:
# -march=native. make HOSTARCH=-march=native builds for this CPU model alone.
CPUINFO  ?= /proc/cpuinfo
CPUFLAGS := $(shell grep -m1 '^flags' $(CPUINFO) 2>/dev/null)
has_all   = $(if $(strip $(foreach f,$(1),$(if $(filter $(f),$(CPUFLAGS)),,missing))),,yes)
ifeq ($(call has_all,avx512f avx512bw avx512cd avx512dq avx512vl avx2 fma bmi2 movbe),yes)
HOSTARCH ?= -march=x86-64-v4 -mtune=generic -mprefer-vector-width=512
else ifeq ($(call has_all,avx2 fma bmi1 bmi2 f16c abm movbe xsave),yes)
HOSTARCH ?= -march=x86-64-v3 -mtune=generic
else
HOSTARCH ?= -march=native
endif
# -fno-math-errno: sqrtf need not set errno, so a loop that takes a square root (AdamW) vectorises; no
# result moves (sqrt is correctly rounded in a vector as in a call; without -ffast-math no libm call is
# replaced by a vector variant)
HOSTFLAGS = -O3 $(HOSTARCH) -fopenmp-simd -fno-trapping-math -fno-math-errno -Wall -Wextra -Wno-unused-function
TP_VERSION := $(shell git describe --always --dirty 2>/dev/null)
# Kernels for each GPU model of this machine (the compute capabilities nvidia-smi lists; only digits are
# taken, so an nvidia-smi that prints an error adds nothing), or with none for A100 (sm_80) and H100/H200
# (sm_90); plus PTX of the highest, which the driver compiles at load time for GPUs newer than these.
GPU_CCS  := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d '. ' | grep -xE '[0-9]{2,3}' | sort -un)
ifeq ($(strip $(GPU_CCS)),)
GPU_CCS   = 80 90
endif
ARCH      = $(foreach cc,$(GPU_CCS),-gencode arch=compute_$(cc),code=sm_$(cc)) \
            -gencode arch=compute_$(lastword $(GPU_CCS)),code=compute_$(lastword $(GPU_CCS))
ifeq ($(WERROR),1)
NVWERROR  = -Werror all-warnings
endif
NVFLAGS   = -std=c++17 -O3 $(NVWERROR) $(ARCH) -Xcompiler $(subst $() ,$(comma),$(HOSTFLAGS)) $(NCCL_CFLAGS) $(MPI_CFLAGS)
NVFLAGS  += $(if $(TP_VERSION),-DTP_VERSION='"$(TP_VERSION)"')  # ./tp --version
# --threads 0: nvcc compiles the GPU code of each -gencode target side by side, on every core (make && ./tp:
# 26-30 s instead of 37-40 s for ./tp on 2 cores)
NVFLAGS  += --threads 0
LDLIBS    = -lcublas -lcublasLt $(NCCL_LIBS) -ldl $(MPI_LIBS)
# MPI (to run data parallelism across processes with mpirun): compiled in when an MPI compiler wrapper
# (Debian's OpenMPI: apt-get install openmpi-bin libopenmpi-dev) is found, or never with make MPI=0.
# Its flags come from `mpicxx --showme`; nvcc takes -I, -L and -l as they are, the rest through -Xcompiler.
MPI      ?= $(if $(shell command -v mpicxx 2>/dev/null),1,0)
ifeq ($(MPI),1)
MPI_CFLAGS = -DTP_MPI -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX \
             $(foreach f,$(shell mpicxx --showme:compile),$(if $(filter -I%,$(f)),$(f),-Xcompiler $(f)))
MPI_LIBS   = $(foreach f,$(shell mpicxx --showme:link),$(if $(filter -l% -L%,$(f)),$(f),-Xcompiler $(f)))
endif
SOURCES   = gpt.cu comm.cuh kernels_cpu.h kernels.cuh $(wildcard common/*.h data/*.h train/*.h)
TESTS     = test_tp.cu tp.cu $(wildcard dev/test_*.cuh)

all: tp

# The build switches, recorded in build/config, which every binary depends on: the file is rewritten only
# when the switches differ from the ones it holds, so `make MPI=0`, WERROR=1, another GPU model, or
# installing OpenMPI after a build rebuilds ./tp and ./test_tp alike (never one with MPI, one without).
BUILD_CONFIG := MPI=$(MPI) WERROR=$(WERROR) GPU_CCS=$(strip $(GPU_CCS)) NCCL_DIR=$(strip $(NCCL_DIR))
ifneq ($(BUILD_CONFIG),$(shell cat build/config 2>/dev/null))
build/config: FORCE
endif
build/config:
	@mkdir -p build && echo '$(BUILD_CONFIG)' > $@
FORCE:

tp: tp.cu $(SOURCES) build/config | nvcc
	$(NVCC) $(NVFLAGS) -o $@ tp.cu $(LDLIBS)

test_tp: $(TESTS) $(SOURCES) build/config | nvcc
	$(NVCC) $(NVFLAGS) -o $@ test_tp.cu $(LDLIBS)

# TEST_GROUPS: the groups `make test` runs, all when empty (as the README's `make test` runs them)
TEST_GROUPS ?=
test: test_tp tp
	./test_tp $(TEST_GROUPS)
# What .ci/run's build without MPI runs (make MPI=0 test TEST_GROUPS='$(NOMPI_GROUPS)'): the groups whose
# code or checks differ without TP_MPI (mpi: a job of several processes refused in one line; messages: no
# peer's death to report; build, buildconfig: MPI=0 recorded, and make's lines), the collectives of the comm
# layer built without MPI, and cli for whole runs of that ./tp at --tp 1, 2 and 4. The rest of the suite is
# the same code as in make test's build. (mpi_pp is left out: without MPI it has nothing to run but a skip.)
NOMPI_GROUPS = mpi messages build buildconfig collectives cli

# one line instead of make's "No such file or directory" when the CUDA toolkit is missing
nvcc:
	@command -v $(NVCC) >/dev/null 2>&1 || { echo "error: $(NVCC) not found: tp builds with the CUDA toolkit (nvcc, cuBLAS, NCCL), also to run on the CPU; install it, put its bin/ on PATH, or give NVCC=/path/to/nvcc (make toolkit checks what is there)" >&2; exit 1; }

# what the build needs, found or not: nvcc, the cuBLAS and NCCL libraries, NCCL's header
toolkit:
	@ok=1; \
	if command -v $(NVCC) >/dev/null 2>&1; then echo "nvcc:          $$($(NVCC) --version | grep -o 'release [0-9.]*') ($(NVCC))"; \
	else echo "nvcc:          MISSING: $(NVCC) (install the CUDA toolkit, or give NVCC=/path/to/nvcc)"; ok=0; fi; \
	for lib in cublas cublasLt $(if $(NCCL_DIR),,nccl); do \
	  f=$$(ls $(CUDA_DIR)/lib64/lib$$lib.so* $(CUDA_DIR)/lib/lib$$lib.so* 2>/dev/null | head -n 1); \
	  [ -n "$$f" ] || f=$$(ldconfig -p 2>/dev/null | grep -o "/[^ ]*/lib$$lib\.so[.0-9]*$$" | head -n 1); \
	  if [ -n "$$f" ]; then printf '%-14s %s\n' "lib$$lib:" "$$f"; \
	  else printf '%-14s %s\n' "lib$$lib:" "MISSING (cuBLAS comes with the CUDA toolkit; NCCL is a package of its own, e.g. libnccl2 + libnccl-dev, or pip's nvidia-nccl-cu13)"; ok=0; fi; \
	done; \
	$(if $(NCCL_DIR),f=$$(ls $(NCCL_LIBDIR)/libnccl.so* 2>/dev/null | head -n 1); \
	  if [ -n "$$f" ]; then echo "libnccl:       $$f (NCCL_DIR)"; else echo "libnccl:       MISSING: no libnccl.so* in $(NCCL_DIR)/lib or lib64 (NCCL_DIR)"; ok=0; fi;) \
	h=$$(ls $(if $(NCCL_DIR),$(NCCL_DIR)/include/nccl.h,$(CUDA_DIR)/include/nccl.h /usr/include/nccl.h /usr/local/include/nccl.h) 2>/dev/null | head -n 1); \
	if [ -n "$$h" ]; then echo "nccl.h:        $$h"; else echo "nccl.h:        MISSING (NCCL's headers, e.g. libnccl-dev, or pip's nvidia-nccl-cu13; or make NCCL_DIR=/path)"; ok=0; fi; \
	echo "GPU code for:  $(GPU_CCS) (+ PTX of $(lastword $(GPU_CCS)) for newer GPUs)"; \
	if [ $$ok = 1 ]; then echo "toolkit: complete; make builds ./tp"; else echo "toolkit: incomplete (see above)"; exit 1; fi

# sanitizer builds: host code only (the CPU backend, the comm layer, the driver), -O1 with frame pointers.
# nvcc still compiles the GPU code (for its default GPU), which these builds never run: -G compiles it
# without optimisation, 4 s instead of 11 s of each build's 35-60
SANFLAGS = -std=c++17 -O1 -g -G -Xcompiler $(subst $() ,$(comma),$(HOSTARCH)),-fopenmp-simd,-fno-omit-frame-pointer $(NCCL_CFLAGS) $(MPI_CFLAGS)
ASAN = -Xcompiler -fsanitize=address,-fsanitize=undefined,-fno-sanitize-recover=all -Xlinker -lasan,-lubsan
TSAN = -Xcompiler -fsanitize=thread -Xlinker -ltsan

tp_asan: tp.cu $(SOURCES) build/config
	$(NVCC) $(SANFLAGS) $(ASAN) -o $@ tp.cu $(LDLIBS)
test_tp_asan: $(TESTS) $(SOURCES) build/config
	$(NVCC) $(SANFLAGS) $(ASAN) -o $@ test_tp.cu $(LDLIBS)
# ASan's groups: the code that reads what a user or a file hands it, where an index from outside can run
# past a buffer: the token and model files (loader, checkpoint, checksums, bf16_ckpt, resume, resume_epoch,
# folders, rundir), the command line and its bad input (cli, bad_input, flags), text, tokenizers and prompts
# (owndata, prepare, bpe, export, servecli, corpus and words: the embedded corpus's tokens, tokenizer.bin),
# the KV cache's indexing (serve); ops, every CPU kernel's loads and stores at the tile edges, and bf16 and
# bf16_amx, the bf16 GEMM's packs at theirs (vdpbf16ps, the fp32 path, AMX): a pack that reads a row past M
# puts nothing wrong in C (those rows are not stored), so only a sanitizer sees it. 95-115 s on 2 cores
# (the whole suite: 350 s); the groups left out run the same code through other paths or at other sizes
# (make test runs them all), or check numbers (bperun 46 s, readme 19 s) or timings (plan_sweep 19 s).
ASAN_GROUPS ?= ops loader checkpoint checksums bf16_ckpt resume resume_epoch folders rundir cli bad_input flags \
               owndata prepare bpe export servecli serve corpus words bf16 bf16_amx
asan: tp_asan test_tp_asan
	ASAN_OPTIONS=detect_leaks=0 TP_BIN=./tp_asan ./test_tp_asan $(ASAN_GROUPS)

tp_tsan: tp.cu $(SOURCES) build/config
	$(NVCC) $(SANFLAGS) $(TSAN) -o $@ tp.cu $(LDLIBS)
test_tp_tsan: $(TESTS) $(SOURCES) build/config
	$(NVCC) $(SANFLAGS) $(TSAN) -o $@ test_tp.cu $(LDLIBS)
# TSan's groups: those whose threads share memory: the collectives and the ranks of one process (tp, sp,
# dp), the pipeline's stages and messages (pp, pp_p2p, pp_stall), a rank that waits on the others' timeouts
# (hangs), the worker pool, bf16's master copies written by every rank, the AMX GEMM's packs and tile
# blocks on the pool's threads (bf16_amx, where the CPU has AMX), the KV cache at TP = 2 and 4
# (serve), and a signal arriving while the ranks run (interrupts). About 120 s on 2 cores (the whole suite:
# 17-21 minutes); the groups left out start the same threads from the command line or from files (resume,
# rundir, dp_resume, mpi, mpi_pp, logs: 65-156 s each), or are ops (163 s), whose threads are the worker
# pool's that pool puts under TSan; make test runs them all, make asan some.
TSAN_GROUPS ?= collectives tp sp dp hangs pool pp_p2p pp pp_stall bf16 bf16_amx serve interrupts
tsan: tp_tsan test_tp_tsan
	TSAN_OPTIONS=halt_on_error=1 TP_BIN=./tp_tsan ./test_tp_tsan $(TSAN_GROUPS)

# for people working on kernels: no optimisation, host and device debug info (-G implies line info), and
# TP_CUDA_DEBUG, which makes every CUDA_LAUNCH_CHECK wait for its kernel so a fault names the kernel
DEBUGFLAGS = -std=c++17 -O0 -g -G -DTP_CUDA_DEBUG $(ARCH) -Xcompiler -fopenmp-simd,-Wall,-Wextra,-Wno-unused-function $(NCCL_CFLAGS) $(MPI_CFLAGS)
tp_debug: tp.cu $(SOURCES) build/config
	$(NVCC) $(DEBUGFLAGS) -o $@ tp.cu $(LDLIBS)
test_tp_debug: $(TESTS) $(SOURCES) build/config
	$(NVCC) $(DEBUGFLAGS) -o $@ test_tp.cu $(LDLIBS)
debug: tp_debug test_tp_debug

# The prepared GPU run: one GPU, well under 8 minutes. Every step runs even if one before it failed;
# gpucheck_out/summary.txt says which passed, a line added as each step ends, most needed first (the
# toolkit found, the GPU tests, bf16 against fp32, the ops' times, memcheck, the batch sizes, the plan),
# so a run cut short keeps what it reached. TP=2 on one GPU goes through the shared-memory backend.
# memcheck needs compute-sanitizer, which some CUDA images leave out: the summary then says it is not
# available. The benchmark batches that do not fit in the GPU's free memory are refused by tp's memory
# check within a second, and the summary gives that line (needed, free) in place of a time.
GPUOUT ?= gpucheck_out
RAND    = $(GPUOUT)/random_tokens.bin
BENCH   = ./tp -e d12 -t 1024 -i $(RAND) -j $(RAND) -x 10 -v 0 -g 0 --device cuda
SANITIZER = $(firstword $(shell command -v compute-sanitizer 2>/dev/null) $(wildcard $(CUDA_DIR)/bin/compute-sanitizer))
# make gpucheck-dtype: only --dtype bf16 against fp32 (d12 T=1024 B=16 at TP=1 and 2, GPU memory in use) and the
# line naming the default dtype, into the same summary: what issue 19 needs of a GPU, in a minute or two
$(RAND):
	@mkdir -p $(GPUOUT)
	python3 -c "import random, struct; n = 1 << 21; r = random.Random(0); open('$(RAND)', 'wb').write(struct.pack('<256i', 20240520, 1, n, *[0] * 253) + struct.pack('<%dH' % n, *[r.randrange(50257) for _ in range(n)]))"
gpucheck-dtype: tp $(RAND)
	-for P in 1 2; do for d in bf16 fp32; do timeout 90 $(BENCH) -b 16 --tp $$P --dtype $$d > $(GPUOUT)/bench_$${d}_tp$${P}_b16.txt 2>&1; echo "d12 T=1024 B=16 TP=$$P --dtype $$d: $$(grep -E '^average|error' $(GPUOUT)/bench_$${d}_tp$${P}_b16.txt | tail -n 1) | $$(grep -E '^GPU 0 memory' $(GPUOUT)/bench_$${d}_tp$${P}_b16.txt)" >> $(GPUOUT)/summary.txt; done; done
	-timeout 90 $(BENCH) -x 1 -b 4 --tp 1 > $(GPUOUT)/default_dtype.txt 2>&1; echo "the default dtype: $$(grep -m1 -E -- '--dtype (bf16|fp32), the default|error' $(GPUOUT)/default_dtype.txt)" >> $(GPUOUT)/summary.txt
	@cat $(GPUOUT)/summary.txt
gpucheck: tp test_tp $(RAND)
	@mkdir -p $(GPUOUT); rm -f $(GPUOUT)/summary.txt
	-nvidia-smi > $(GPUOUT)/nvidia-smi.txt 2>&1
	-$(MAKE) --no-print-directory toolkit > $(GPUOUT)/toolkit.txt 2>&1; grep -E '^(nvcc|libnccl|toolkit):' $(GPUOUT)/toolkit.txt | tr -s ' ' >> $(GPUOUT)/summary.txt
	-bash -o pipefail -c 'timeout 300 ./test_tp gpu 2>&1 | tee $(GPUOUT)/gpu_tests.txt' && echo "gpu tests: passed" >> $(GPUOUT)/summary.txt || echo "gpu tests: FAILED" >> $(GPUOUT)/summary.txt
	-$(MAKE) --no-print-directory gpucheck-dtype > /dev/null
	-bash -o pipefail -c 'timeout 120 ./test_tp bench 2>&1 | tee $(GPUOUT)/bench_ops.txt'
	-grep -E '^ +attention' $(GPUOUT)/bench_ops.txt | sed -E 's/^ +/one layer, B=8 T=1024: /' >> $(GPUOUT)/summary.txt
	-if [ -z "$(SANITIZER)" ]; then echo "memcheck: not available (no compute-sanitizer in PATH or $(CUDA_DIR)/bin)" >> $(GPUOUT)/summary.txt; \
	else bash -o pipefail -c 'timeout 150 $(SANITIZER) --tool memcheck --error-exitcode 9 ./tp -e L2C64H4 -b 2 -t 32 -x 3 -v 2 -m 1 -g 4 --device cuda --tp 2 2>&1 | tee $(GPUOUT)/memcheck.txt' && echo "memcheck: clean" >> $(GPUOUT)/summary.txt || echo "memcheck: FAILED" >> $(GPUOUT)/summary.txt; fi
	-for b in 4 16 32 64; do timeout 90 $(BENCH) -b $$b --tp 1 > $(GPUOUT)/bench_tp1_b$$b.txt 2>&1; echo "d12 T=1024 B=$$b TP=1: $$(grep -E '^average|error' $(GPUOUT)/bench_tp1_b$$b.txt | tail -n 1)" >> $(GPUOUT)/summary.txt; done
	-timeout 90 $(BENCH) -b 16 --tp 2 > $(GPUOUT)/bench_tp2_b16.txt 2>&1; echo "d12 T=1024 B=16 TP=2 (shared GPU memory): $$(grep -E '^average|error' $(GPUOUT)/bench_tp2_b16.txt | tail -n 1)" >> $(GPUOUT)/summary.txt
	-timeout 90 ./tp --plan 1 -e d12 -b 4 -t 1024 -i $(RAND) -j $(RAND) --device cuda > $(GPUOUT)/plan.txt 2>&1; echo "plan d12 T=1024 B=4: $$(grep -E '^recommended|error' $(GPUOUT)/plan.txt | tail -n 1)" >> $(GPUOUT)/summary.txt
	-timeout 150 ./tp --sweep 1 --sweep-steps 6 -e d12 -b 4 -t 1024 -i $(RAND) -j $(RAND) --device cuda -o $(GPUOUT)/sweep > $(GPUOUT)/sweep.txt 2>&1; echo "sweep, measured and predicted ms/step (ms_per_step, predicted_ms_per_step): $$(cut -d, -f1,2,4,16 $(GPUOUT)/sweep/sweep.csv 2>/dev/null | tr '\n' ' ')" >> $(GPUOUT)/summary.txt
	@cat $(GPUOUT)/summary.txt

# the emulated GPU of `make emu` (dev/emu/README.md): its rules live with it
include dev/emu/emu.mk

clean:
	rm -f tp test_tp tp_asan test_tp_asan tp_tsan test_tp_tsan tp_debug test_tp_debug

.PHONY: all test asan tsan debug gpucheck gpucheck-dtype clean nvcc toolkit FORCE
