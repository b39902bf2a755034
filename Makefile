# make             builds ./tp and ./test_tp
# make test        builds and runs the tests
# make asan tsan   the tests again, under AddressSanitizer + UndefinedBehaviorSanitizer, and ThreadSanitizer
# make gpucheck    on a GPU machine: GPU tests, memcheck, GPT-2 124M benchmark; results in gpucheck_out/
# make emu         the CUDA path (kernels, cuBLAS, NCCL) on the emulated GPU of dev/emu, with memcheck and
#                  racecheck, and the emulator's own planted-bug tests; no GPU needed
MAKEFLAGS += -j$(shell nproc)  # tp and test_tp build side by side
NVCC     ?= /usr/local/cuda/bin/nvcc
comma    := ,
HOSTFLAGS = -O3 -march=native -fopenmp -Wall -Wextra -Wno-unused-function
# kernels for the GPU of this machine, or with none for A100 (sm_80) and H100/H200 (sm_90)
GPU_CC   := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '.')
ifeq ($(GPU_CC),)
ARCH      = -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
else
ARCH      = -gencode arch=compute_$(GPU_CC),code=sm_$(GPU_CC)
endif
NVFLAGS   = -std=c++17 -O3 -Werror all-warnings $(ARCH) -Xcompiler $(subst $() ,$(comma),$(HOSTFLAGS))
LDLIBS    = -lcublas -lcublasLt -lnccl -lgomp
SOURCES   = gpt.cu comm.cuh kernels_cpu.h kernels.cuh data/grammar.h

all: tp test_tp

tp: tp.cu $(SOURCES)
	$(NVCC) $(NVFLAGS) -o $@ tp.cu $(LDLIBS)

test_tp: test_tp.cu tp.cu $(SOURCES)
	$(NVCC) $(NVFLAGS) -o $@ test_tp.cu $(LDLIBS)

test: test_tp tp
	./test_tp

# sanitizer builds: host code only (the CPU backend, the comm layer, the driver), -O1 with frame pointers
SANFLAGS = -std=c++17 -O1 -g -Xcompiler -march=native,-fopenmp,-fno-omit-frame-pointer
ASAN = -Xcompiler -fsanitize=address,-fsanitize=undefined,-fno-sanitize-recover=all -Xlinker -lasan,-lubsan
TSAN = -Xcompiler -fsanitize=thread -Xlinker -ltsan

tp_asan: tp.cu $(SOURCES)
	$(NVCC) $(SANFLAGS) $(ASAN) -o $@ tp.cu $(LDLIBS)
test_tp_asan: test_tp.cu tp.cu $(SOURCES)
	$(NVCC) $(SANFLAGS) $(ASAN) -o $@ test_tp.cu $(LDLIBS)
asan: tp_asan test_tp_asan
	ASAN_OPTIONS=detect_leaks=0 TP_BIN=./tp_asan ./test_tp_asan

tp_tsan: tp.cu $(SOURCES)
	$(NVCC) $(SANFLAGS) $(TSAN) -o $@ tp.cu $(LDLIBS)
test_tp_tsan: test_tp.cu tp.cu $(SOURCES)
	$(NVCC) $(SANFLAGS) $(TSAN) -o $@ test_tp.cu $(LDLIBS)
tsan: tp_tsan test_tp_tsan
	TSAN_OPTIONS=halt_on_error=1 TP_BIN=./tp_tsan ./test_tp_tsan

# The prepared GPU run: one GPU, well under 8 minutes. Every step runs even if one before it failed;
# gpucheck_out/summary.txt says which passed. TP=2 on one GPU goes through the shared-memory backend.
GPUOUT ?= gpucheck_out
RAND    = $(GPUOUT)/random_tokens.bin
BENCH   = ./tp -e d12 -t 1024 -i $(RAND) -j $(RAND) -x 10 -v 0 -g 0 --device cuda
gpucheck: tp test_tp
	@mkdir -p $(GPUOUT); rm -f $(GPUOUT)/summary.txt
	-nvidia-smi > $(GPUOUT)/nvidia-smi.txt 2>&1
	-bash -o pipefail -c 'timeout 300 ./test_tp gpu 2>&1 | tee $(GPUOUT)/gpu_tests.txt' && echo "gpu tests: passed" >> $(GPUOUT)/summary.txt || echo "gpu tests: FAILED" >> $(GPUOUT)/summary.txt
	-bash -o pipefail -c 'timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 ./tp -e L2C64H4 -b 2 -t 32 -x 3 -v 2 -m 1 -g 4 --device cuda --tp 2 2>&1 | tee $(GPUOUT)/memcheck.txt' && echo "memcheck: clean" >> $(GPUOUT)/summary.txt || echo "memcheck: FAILED" >> $(GPUOUT)/summary.txt
	-bash -o pipefail -c 'timeout 60 ./test_tp bench 2>&1 | tee $(GPUOUT)/bench_ops.txt'
	python3 -c "import random, struct; n = 1 << 21; r = random.Random(0); open('$(RAND)', 'wb').write(struct.pack('<256i', 20240520, 1, n, *[0] * 253) + struct.pack('<%dH' % n, *[r.randrange(50257) for _ in range(n)]))"
	-for b in 4 16 32 64; do timeout 90 $(BENCH) -b $$b --tp 1 > $(GPUOUT)/bench_tp1_b$$b.txt 2>&1; echo "d12 T=1024 B=$$b TP=1: $$(grep -E '^average|error' $(GPUOUT)/bench_tp1_b$$b.txt | tail -n 1)" >> $(GPUOUT)/summary.txt; done
	-timeout 90 $(BENCH) -b 16 --tp 2 > $(GPUOUT)/bench_tp2_b16.txt 2>&1; echo "d12 T=1024 B=16 TP=2 (shared GPU memory): $$(grep -E '^average|error' $(GPUOUT)/bench_tp2_b16.txt | tail -n 1)" >> $(GPUOUT)/summary.txt
	@cat $(GPUOUT)/summary.txt

# The emulated GPU (dev/emu, README "The emulated GPU"). dev/emu/rewrite.py copies the sources to
# build/emu/src with the launch syntax and __shared__ rewritten; g++ compiles them against the fake CUDA,
# cuBLAS and NCCL headers of dev/emu/include with -fsanitize=thread code generation but without libtsan:
# every load and store calls the emulator's memcheck/racecheck hook instead. -O1 without scalar replacement
# of aggregates keeps a float4 one 16-byte access (alignment-checked). The emulator itself is plain C++.
EMU       = build/emu
EMU_CXX  ?= g++
EMU_FLAGS = -std=c++17 -O1 -g -fdebug-prefix-map=$(CURDIR)=. -fno-tree-sra -fno-pie -fopenmp -pthread -fsanitize=thread \
            --param=tsan-instrument-func-entry-exit=0 -Wall -Wno-unknown-pragmas -Wno-unused-function -DTP_EMU -Idev/emu/include
EMU_RTFLAGS = -std=c++17 -O2 -g -fno-pie -pthread -Wall -Wextra
EMU_LDFLAGS = -no-pie -pthread -fopenmp -Wl,--wrap=memcpy,--wrap=memmove,--wrap=memset
EMU_RT    = $(EMU)/runtime.o $(EMU)/exec.o $(EMU)/blas.o $(EMU)/nccl.o
EMU_SRCS := $(shell find . \( -path ./build -o -path ./.git -o -path ./dev/emu/include \) -prune -o \
              \( -name '*.cu' -o -name '*.cuh' -o -name '*.h' -o -name '*.hpp' -o -name '*.inl' -o -name '*.inc' \) -print)

$(EMU)/%.o: dev/emu/%.cpp dev/emu/emu.h $(wildcard dev/emu/include/*.h)
	@mkdir -p $(EMU)
	$(EMU_CXX) $(EMU_RTFLAGS) -c -o $@ $<
$(EMU)/src/.stamp: $(EMU_SRCS) dev/emu/rewrite.py
	python3 dev/emu/rewrite.py . $(EMU)/src
	@touch $@
$(EMU)/%.emu.o: $(EMU)/src/.stamp $(wildcard dev/emu/include/*.h)
	$(EMU_CXX) $(EMU_FLAGS) -x c++ -c -o $@ $(EMU)/src/$(subst -,/,$*).cu
$(EMU)/test_tp_emu: $(EMU)/test_tp.emu.o $(EMU_RT)
	$(EMU_CXX) $(EMU_LDFLAGS) -o $@ $^
$(EMU)/tp_emu: $(EMU)/tp.emu.o $(EMU_RT)
	$(EMU_CXX) $(EMU_LDFLAGS) -o $@ $^
$(EMU)/test_emu: $(EMU)/dev-emu-test_emu.emu.o $(EMU_RT)
	$(EMU_CXX) $(EMU_LDFLAGS) -o $@ $^
emu: $(EMU)/test_tp_emu $(EMU)/tp_emu $(EMU)/test_emu
	@bash dev/emu/run_tests.sh $(EMU)

clean:
	rm -f tp test_tp tp_asan test_tp_asan tp_tsan test_tp_tsan
	rm -rf $(EMU)

.PHONY: all test asan tsan gpucheck emu clean
