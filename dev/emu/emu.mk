# emu.mk: the make rules of the emulated GPU (`make emu`), included by the top-level Makefile, so every
# path here is relative to the repository root. dev/emu/README.md says what it is and how it works.
#
# dev/emu/rewrite.py copies the sources to build/emu/src with the launch syntax and __shared__ rewritten;
# g++ compiles them against the fake CUDA, cuBLAS and NCCL headers of dev/emu/fake_cuda with
# -fsanitize=thread code generation but without libtsan: every load and store calls the emulator's
# memcheck/racecheck hook instead. -O1 without scalar replacement of aggregates keeps a float4 one 16-byte
# access (alignment-checked). The emulator itself is plain C++.
#
# With MPI (the top-level Makefile's MPI=1, when mpicxx is found) tp is built as `make` builds it, with
# -DTP_MPI and MPI's flags from `mpicxx --showme`, so that tp_emu runs under mpirun and the NCCL path across
# processes (dev/emu/nccl.cpp: communicators in POSIX shared memory) is tested.
EMU       = build/emu
EMU_CXX  ?= g++
EMU_FAKE  = dev/emu/fake_cuda
ifeq ($(MPI),1)
EMU_MPI_CFLAGS = -DTP_MPI -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX $(shell mpicxx --showme:compile)
EMU_MPI_LIBS   = $(shell mpicxx --showme:link)
endif
EMU_FLAGS = -std=c++17 -O1 -g -fdebug-prefix-map=$(CURDIR)=. -fno-tree-sra -fno-pie -fopenmp -pthread -fsanitize=thread \
            --param=tsan-instrument-func-entry-exit=0 -Wall -Wno-unknown-pragmas -Wno-unused-function -DTP_EMU -I$(EMU_FAKE) \
            $(EMU_MPI_CFLAGS)
EMU_RTFLAGS = -std=c++17 -O2 -g -fno-pie -pthread -Wall -Wextra
EMU_LDFLAGS = -no-pie -pthread -fopenmp -Wl,--wrap=memcpy,--wrap=memmove,--wrap=memset
EMU_LIBS  = $(EMU_MPI_LIBS) -lrt
EMU_RT    = $(EMU)/runtime.o $(EMU)/exec.o $(EMU)/blas.o $(EMU)/nccl.o
EMU_SRCS := $(shell find . \( -path ./build -o -path ./.git -o -path ./$(EMU_FAKE) \) -prune -o \
              \( -name '*.cu' -o -name '*.cuh' -o -name '*.h' -o -name '*.hpp' -o -name '*.inl' -o -name '*.inc' \) -print)

$(EMU)/%.o: dev/emu/%.cpp dev/emu/emu.h $(wildcard $(EMU_FAKE)/*.h)
	@mkdir -p $(EMU)
	$(EMU_CXX) $(EMU_RTFLAGS) -c -o $@ $<
$(EMU)/src/.stamp: $(EMU_SRCS) dev/emu/rewrite.py
	python3 dev/emu/rewrite.py . $(EMU)/src
	@touch $@
$(EMU)/%.emu.o: $(EMU)/src/.stamp $(wildcard $(EMU_FAKE)/*.h)
	$(EMU_CXX) $(EMU_FLAGS) -x c++ -c -o $@ $(EMU)/src/$(subst -,/,$*).cu
$(EMU)/test_tp_emu: $(EMU)/test_tp.emu.o $(EMU_RT)
	$(EMU_CXX) $(EMU_LDFLAGS) -o $@ $^ $(EMU_LIBS)
$(EMU)/tp_emu: $(EMU)/tp.emu.o $(EMU_RT)
	$(EMU_CXX) $(EMU_LDFLAGS) -o $@ $^ $(EMU_LIBS)
$(EMU)/test_emu: $(EMU)/dev-emu-test_emu.emu.o $(EMU_RT)
	$(EMU_CXX) $(EMU_LDFLAGS) -o $@ $^ $(EMU_LIBS)
emu: $(EMU)/test_tp_emu $(EMU)/tp_emu $(EMU)/test_emu
	@bash dev/emu/run_tests.sh $(EMU)

# `make clean` removes the emulated build too
clean: emu-clean
emu-clean:
	rm -rf $(EMU)

.PHONY: emu emu-clean
