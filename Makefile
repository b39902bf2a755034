# make             builds ./tp and ./test_tp
# make test        builds and runs the tests
# make asan tsan   the tests again, under AddressSanitizer + UndefinedBehaviorSanitizer, and ThreadSanitizer
NVCC     ?= /usr/local/cuda/bin/nvcc
comma    := ,
HOSTFLAGS = -O3 -march=native -fopenmp -Wall -Wextra -Wno-unused-function
NVFLAGS   = -std=c++17 -O3 -Werror all-warnings -Xcompiler $(subst $() ,$(comma),$(HOSTFLAGS))
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

clean:
	rm -f tp test_tp tp_asan test_tp_asan tp_tsan test_tp_tsan

.PHONY: all test asan tsan clean
