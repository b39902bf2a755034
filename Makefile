# make        builds ./tp and ./test_tp
# make test   builds and runs the tests
NVCC     ?= /usr/local/cuda/bin/nvcc
HOSTFLAGS = -O3 -march=native -fopenmp -Wall -Wextra -Wno-unused-function
NVFLAGS   = -std=c++17 -O3 -Werror all-warnings -Xcompiler $(subst $(space),$(comma),$(HOSTFLAGS))
LDLIBS    = -lcublas -lcublasLt -lnccl -lgomp
comma := ,
space := $(subst ,, )
HEADERS   = gpt.cu comm.cuh kernels_cpu.h

all: tp test_tp

tp: tp.cu $(HEADERS)
	$(NVCC) $(NVFLAGS) -o $@ tp.cu $(LDLIBS)

test_tp: test_tp.cu tp.cu $(HEADERS)
	$(NVCC) $(NVFLAGS) -o $@ test_tp.cu $(LDLIBS)

test: test_tp tp
	./test_tp

clean:
	rm -f tp test_tp

.PHONY: all test clean
