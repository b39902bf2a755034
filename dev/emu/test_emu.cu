// test_emu.cu: the tests of the emulated GPU itself (dev/emu), built and run by `make emu`.
//
// 1. Planted bugs: each a tiny kernel (or host mistake) with one real bug, run in a child process; the
//    emulator must end the child with status 86 and a report that names the kind of error, the kernel and
//    the thread or offset. A planted bug the emulator misses is a failed test.
// 2. Launch limits, returned as the error codes a GPU returns.
// 3. The semantics the rest of the tests rely on: lazy streams and events, warp intrinsics against their
//    documented definitions, atomics, the seeded schedule, cuBLAS/cuBLASLt against naive column-major loops
//    (transposes, leading dimensions, strided batches, beta, the bias epilogue, TF32 rounding), the warp
//    matrix functions (wmma: layouts against the definition, __float_to_tf32, a layout drawn per launch), NCCL.
// Every check prints "  ok   ..." or "  FAIL ..." with the value it measured and its bound; the last line is
// "N passed, N failed".
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>
#include <ctime>
#include <sys/wait.h>
#include <unistd.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <nccl.h>

static int g_passed = 0, g_failed = 0;

static void check(bool ok, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(bool ok, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("  %s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    (ok ? g_passed : g_failed)++;
}

#define CK(call)                                                                                         \
    do {                                                                                                 \
        cudaError_t e_ = (call);                                                                         \
        if (e_ != cudaSuccess) {                                                                         \
            fprintf(stderr, "%s failed: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
            exit(1);                                                                                     \
        }                                                                                                \
    } while (0)

static double now_wall() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static float* dev_floats(const std::vector<float>& h) {
    float* d = nullptr;
    CK(cudaMalloc(&d, h.size() * sizeof(float)));
    CK(cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}
static std::vector<float> host_floats(const float* d, size_t n) {
    std::vector<float> h(n);
    CK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

// ----------------------------------------------------------------------------
// planted bugs (each runs in a child process)

__global__ void oob_write_kernel(float* a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) a[i] = 1.0f;  // BUG: <= writes one element past the end
}
__global__ void oob_read_kernel(const float* a, float* out, int n) {
    int i = threadIdx.x;
    if (i < n) out[i] = a[i] + a[i + 1];  // BUG: the last thread reads a[n]
}
__global__ void misaligned_float4_kernel(const float* a, float* out) {
    float4 v = *reinterpret_cast<const float4*>(a + 1);  // BUG: a + 1 is not 16-byte aligned
    out[threadIdx.x] = v.x + v.w;
}
__global__ void misaligned_store_kernel(float* out) {
    *reinterpret_cast<float4*>(out + 4 * threadIdx.x + 2) = make_float4(1.0f, 2.0f, 3.0f, 4.0f);  // BUG: 8-byte aligned only
}
__global__ void missing_sync_kernel(float* out) {
    __shared__ float sh[64];
    int t = threadIdx.x;
    sh[t] = 0.0f;
    __syncthreads();
    sh[t] = (float)t;
    // BUG: no __syncthreads() between the write above and another warp's read below
    out[t] = sh[(t + 32) % 64];
}
__global__ void bad_mask_kernel(float* out) {
    float v = (float)threadIdx.x;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0x7fffffffu, v, o);  // BUG: the mask leaves out lane 31
    out[threadIdx.x] = v;
}
__global__ void write_kernel(float* p, float v) { p[threadIdx.x] = v; }
__global__ void uninit_kernel(const float* a, float* out) { out[threadIdx.x] = a[threadIdx.x] * 2.0f; }
__global__ void divergent_kernel(float* out) {
    if (threadIdx.x < 16) {
        __syncthreads();  // BUG: half the block waits here ...
    } else {
        __syncthreads();  // ... and half here
    }
    out[threadIdx.x] = 1.0f;
}
__global__ void deadlock_kernel(float* out) {
    float v = 1.0f;
    if (threadIdx.x < 16) __syncthreads();  // BUG: lanes 0-15 wait for the block, lanes 16-31 for lanes 0-15
    else v = __shfl_sync(0xffffffffu, v, 0);
    out[threadIdx.x] = v;
}
__global__ void shared_oob_kernel(float* out) {
    __shared__ float sh[32];
    sh[threadIdx.x] = 1.0f;  // BUG: launched with 33 threads
    __syncthreads();
    out[threadIdx.x] = sh[threadIdx.x];
}
__global__ void shared_uninit_kernel(float* out) {
    __shared__ float sh[64];
    if (threadIdx.x < 32) sh[threadIdx.x] = 1.0f;  // BUG: half is never written ...
    __syncthreads();
    out[threadIdx.x] = sh[63 - threadIdx.x];  // ... and read
}
__global__ void exited_lane_kernel(float* out) {
    float v = (float)threadIdx.x;
    if (threadIdx.x >= 16) return;  // BUG: lanes 16-31 leave ...
    v += __shfl_xor_sync(0xffffffffu, v, 16);  // ... and lanes 0-15 read them
    out[threadIdx.x] = v;
}
__global__ void big_static_shared_kernel(float* out) {
    __shared__ float big[16384];  // BUG: 64 KB of static shared memory (nvcc allows 48 KB)
    big[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = big[threadIdx.x];
}

namespace wmma = nvcuda::wmma;
__global__ void wmma_ldm_kernel(const float* a, float* out) {
    wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, a, 10);  // BUG: ldm 10 floats, not a multiple of 16 bytes
    out[threadIdx.x] = fa.x[0];
}
__global__ void wmma_exited_kernel(const float* a, float* out) {
    if (threadIdx.x >= 16) return;  // BUG: half the warp leaves before the warp-wide mma_sync
    wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc;
    wmma::fill_fragment(fa, 1.0f);
    wmma::fill_fragment(fb, 1.0f);
    wmma::fill_fragment(acc, 0.0f);
    wmma::mma_sync(acc, fa, fb, acc);
    out[threadIdx.x] = acc.x[0];
}
__global__ void wmma_race_kernel(float* out) {
    __shared__ __align__(32) float sh[2][16 * 16];
    for (int i = threadIdx.x; i < 2 * 16 * 16; i += blockDim.x) sh[i / 256][i % 256] = 0.0f;
    __syncthreads();
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc;
    wmma::fill_fragment(acc, (float)(threadIdx.x / 32));
    wmma::store_matrix_sync(sh[threadIdx.x / 32], acc, 16, wmma::mem_row_major);
    // BUG: no __syncthreads() between one warp's store and the other warp's read
    out[threadIdx.x] = sh[1 - threadIdx.x / 32][threadIdx.x % 32];
}

__global__ void spin_kernel(volatile int* flag) {
    while (*flag == 0) {}  // BUG: waits for a flag that no thread ever sets
}

static float* plant_buf(int n, bool init = true) {
    float* d = nullptr;
    CK(cudaMalloc(&d, n * sizeof(float)));
    if (init) CK(cudaMemset(d, 0, n * sizeof(float)));
    return d;
}

static void plant_oob_write() {
    float* a = plant_buf(64);
    oob_write_kernel<<<1, 128>>>(a, 64);
    CK(cudaDeviceSynchronize());
}
static void plant_oob_read() {
    float *a = plant_buf(64), *out = plant_buf(64);
    oob_read_kernel<<<1, 64>>>(a, out, 64);
    CK(cudaDeviceSynchronize());
}
static void plant_misaligned() {
    float *a = plant_buf(64), *out = plant_buf(32);
    misaligned_float4_kernel<<<1, 32>>>(a, out);
    CK(cudaDeviceSynchronize());
}
static void plant_misaligned_store() {
    float* out = plant_buf(256);
    misaligned_store_kernel<<<1, 32>>>(out);
    CK(cudaDeviceSynchronize());
}
static void plant_missing_sync() {
    float* out = plant_buf(64);
    missing_sync_kernel<<<1, 64>>>(out);
    CK(cudaDeviceSynchronize());
}
static void plant_bad_mask() {
    float* out = plant_buf(32);
    bad_mask_kernel<<<1, 32>>>(out);
    CK(cudaDeviceSynchronize());
}
static void plant_no_sync_read() {
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float* d = plant_buf(32);
    float* h = nullptr;
    CK(cudaMallocHost(&h, 32 * sizeof(float)));
    write_kernel<<<1, 32, 0, s>>>(d, 42.0f);
    CK(cudaMemcpyAsync(h, d, 32 * sizeof(float), cudaMemcpyDeviceToHost, s));
    printf("h[0] = %g\n", h[0]);  // BUG: read before cudaStreamSynchronize(s)
}
static void plant_use_after_free() {
    float* d = plant_buf(32);
    CK(cudaFree(d));
    write_kernel<<<1, 32>>>(d, 1.0f);  // BUG: d was freed
    CK(cudaDeviceSynchronize());
}
static void plant_host_deref() {
    float* d = plant_buf(32);
    printf("%g\n", d[3]);  // BUG: a device pointer dereferenced on the host
}
static void plant_host_memcpy() {
    float* d = plant_buf(32);
    float h[4];
    memcpy(h, d, sizeof(h));  // BUG: memcpy instead of cudaMemcpy
    printf("%g\n", h[0]);
}
static void plant_uninit() {
    float *a = plant_buf(32, false), *out = plant_buf(32);
    uninit_kernel<<<1, 32>>>(a, out);  // BUG: a was never written
    CK(cudaDeviceSynchronize());
}
static void plant_divergent() {
    float* out = plant_buf(32);
    divergent_kernel<<<1, 32>>>(out);
    CK(cudaDeviceSynchronize());
}
static void plant_deadlock() {
    float* out = plant_buf(32);
    deadlock_kernel<<<1, 32>>>(out);
    CK(cudaDeviceSynchronize());
}
static void plant_host_ptr_in_kernel() {
    std::vector<float> h(32);
    write_kernel<<<1, 32>>>(h.data(), 1.0f);  // BUG: a host pointer passed to a kernel
    CK(cudaDeviceSynchronize());
}
static void plant_peer() {
    CK(cudaSetDevice(1));
    float* other = plant_buf(32);
    CK(cudaSetDevice(0));
    write_kernel<<<1, 32>>>(other, 1.0f);  // BUG: device 1's memory from device 0 without peer access
    CK(cudaDeviceSynchronize());
}
static void plant_shared_oob() {
    float* out = plant_buf(33);
    shared_oob_kernel<<<1, 33>>>(out);
    CK(cudaDeviceSynchronize());
}
static void plant_shared_uninit() {
    float* out = plant_buf(64);
    shared_uninit_kernel<<<1, 64>>>(out);
    CK(cudaDeviceSynchronize());
}
static void plant_exited_lane() {
    float* out = plant_buf(32);
    exited_lane_kernel<<<1, 32>>>(out);
    CK(cudaDeviceSynchronize());
}
static void plant_big_static() {
    float* out = plant_buf(32);
    big_static_shared_kernel<<<1, 32>>>(out);
    CK(cudaDeviceSynchronize());
}
static void plant_gemm_ld() {
    int m = 8, n = 4, k = 16;
    float *A = plant_buf(m * k), *B = plant_buf(k * n), *C = plant_buf(m * n);
    cublasHandle_t h;
    cublasCreate(&h);
    float one = 1.0f, zero = 0.0f;
    // BUG: lda 9 for an 8-row matrix stored with 8 rows: the last column reads past the end of A
    cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, A, CUDA_R_32F, m + 1, B, CUDA_R_32F, k, &zero, C, CUDA_R_32F, m,
                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    CK(cudaDeviceSynchronize());
}
static void plant_lt_misaligned() {
    int m = 8, n = 8, k = 8;
    float *A = plant_buf(m * k + 1), *B = plant_buf(k * n), *D = plant_buf(m * n);
    cublasLtHandle_t lt;
    cublasLtCreate(&lt);
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, m, k, m);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, k, n, k);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, m);
    cublasLtMatmulPreferenceCreate(&pref);  // default: operands 256-byte aligned
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &r, &found);
    float one = 1.0f, zero = 0.0f;
    // BUG: A + 1 is 4-byte aligned, but the algorithm was chosen for 256-byte aligned operands
    cublasLtMatmul(lt, desc, &one, A + 1, la, B, lb, &zero, D, ld, D, ld, &r.algo, nullptr, 0, 0);
    CK(cudaDeviceSynchronize());
}
// two rank threads on devices 0 and 1 of one NCCL clique, each running op(rank, its communicator, a
// 16-float device buffer, its stream) and waiting for its stream
static void plant_two_ranks(void (*op)(int r, ncclComm_t comm, float* d, cudaStream_t s)) {
    ncclComm_t comms[2];
    int devs[2] = {0, 1};
    ncclCommInitAll(comms, 2, devs);
    std::vector<std::thread> th;
    for (int r = 0; r < 2; r++)
        th.emplace_back([&, r] {
            CK(cudaSetDevice(r));
            float* d = plant_buf(16);
            cudaStream_t s;
            CK(cudaStreamCreate(&s));
            op(r, comms[r], d, s);
            CK(cudaStreamSynchronize(s));
        });
    for (auto& t : th) t.join();
}
static void plant_nccl_mismatch() {
    plant_two_ranks([](int r, ncclComm_t comm, float* d, cudaStream_t s) {
        ncclAllReduce(d, d, r == 0 ? 16 : 15, ncclFloat, ncclSum, comm, s);  // BUG: rank 1 passes another count
    });
}
static void plant_p2p_mismatch() {
    plant_two_ranks([](int r, ncclComm_t comm, float* d, cudaStream_t s) {
        if (r == 0) ncclSend(d, 16, ncclFloat, 1, comm, s);
        else ncclRecv(d, 12, ncclFloat, 0, comm, s);  // BUG: the receiver expects another count
    });
}

static void plant_spin() {
    int* flag = nullptr;
    CK(cudaMalloc(&flag, sizeof(int)));
    CK(cudaMemset(flag, 0, sizeof(int)));
    spin_kernel<<<1, 32>>>(flag);
    CK(cudaDeviceSynchronize());
}

static void plant_wmma_ldm() {
    float *a = plant_buf(256), *out = plant_buf(32);
    wmma_ldm_kernel<<<1, 32>>>(a, out);
    CK(cudaDeviceSynchronize());
}
static void plant_wmma_exited() {
    float *a = plant_buf(256), *out = plant_buf(32);
    wmma_exited_kernel<<<1, 32>>>(a, out);
    CK(cudaDeviceSynchronize());
}
static void plant_wmma_race() {
    float* out = plant_buf(64);
    wmma_race_kernel<<<1, 64>>>(out);
    CK(cudaDeviceSynchronize());
}

struct Plant {
    const char* name;
    void (*fn)();
    std::vector<const char*> expect;  // every one must appear in the report
    const char* env = "";             // for the child's command line
};
static const std::vector<Plant> g_plants = {
    {"out-of-bounds write", plant_oob_write, {"out-of-bounds access", "invalid write of 4 bytes", "oob_write_kernel", "thread (64,0,0)", "0 bytes past the end of a 256-byte allocation"}},
    {"read one past the end", plant_oob_read, {"out-of-bounds access", "invalid read of 4 bytes", "oob_read_kernel", "thread (63,0,0)", "0 bytes past the end of a 256-byte allocation"}},
    {"misaligned float4 load", plant_misaligned, {"misaligned address", "16-byte access needs a 16-byte aligned address", "misaligned_float4_kernel", "at offset 4 of"}},
    {"misaligned float4 store", plant_misaligned_store, {"misaligned address", "invalid write of 16 bytes", "misaligned_store_kernel"}},
    {"missing __syncthreads", plant_missing_sync, {"shared memory race", "missing_sync_kernel", "sh + ", "no __syncthreads"}},
    {"shuffle mask leaving out an active lane", plant_bad_mask, {"mask", "0x7fffffff", "__shfl_xor_sync", "bad_mask_kernel"}},
    {"host read without a stream sync", plant_no_sync_read, {"host access to memory of a queued async copy", "cudaMemcpyAsync", "in host code"}},
    {"use after free", plant_use_after_free, {"use after free", "write_kernel", "freed 128-byte allocation"}},
    {"host dereference of a device pointer", plant_host_deref, {"host access to device memory", "at offset 12 of a 128-byte allocation", "in host code"}},
    {"host memcpy from a device pointer", plant_host_memcpy, {"host access to device memory", "in host code"}},
    {"read of never-written device memory", plant_uninit, {"read of uninitialised device memory", "uninit_kernel", "never written"}},
    {"divergent __syncthreads", plant_divergent, {"divergent __syncthreads", "divergent_kernel", "test_emu.cu"}},
    {"barrier deadlock", plant_deadlock, {"deadlock", "deadlock_kernel", "__syncthreads", "__shfl_sync"}},
    {"host pointer passed to a kernel", plant_host_ptr_in_kernel, {"device access to host memory", "write_kernel"}},
    {"peer access not enabled", plant_peer, {"peer access not enabled", "write_kernel", "device 1"}},
    {"shared memory out of bounds", plant_shared_oob, {"out-of-bounds shared memory access", "shared_oob_kernel", "past the end of sh", "thread (32,0,0)"}},
    {"read of never-written shared memory", plant_shared_uninit, {"read of uninitialised shared memory", "shared_uninit_kernel"}},
    {"shuffle reading an exited lane", plant_exited_lane, {"shuffle reads an exited lane", "exited_lane_kernel"}},
    {"64 KB of static shared memory", plant_big_static, {"too much static shared memory", "big_static_shared_kernel", "65536 bytes"}},
    {"GEMM leading dimension past the end", plant_gemm_ld, {"out-of-bounds access", "cublasGemmEx", "operand A"}},
    {"cuBLASLt operand less aligned than promised", plant_lt_misaligned, {"misaligned address", "cublasLtMatmul", "operand A aligned to 256 bytes"}},
    {"NCCL ranks disagree", plant_nccl_mismatch, {"NCCL collectives disagree", "count 15", "count 16"}},
    {"NCCL send and receive disagree", plant_p2p_mismatch, {"NCCL send and receive disagree", "16 of ncclFloat32", "12 of ncclFloat32"}},
    {"wmma load with ldm not a multiple of 16 bytes", plant_wmma_ldm, {"invalid wmma pointer or stride", "wmma::load_matrix_sync", "ldm 10", "wmma_ldm_kernel"}},
    {"wmma mma_sync after half the warp returned", plant_wmma_exited, {"wmma operation without the whole warp", "lane 16", "wmma_exited_kernel"}},
    {"wmma store read by another warp without a barrier", plant_wmma_race, {"shared memory race", "wmma_race_kernel", "sh + "}},
    {"a kernel that never ends (2 s watchdog)", plant_spin, {"hang", "spin_kernel", "has run for more than 2 s"}, "TP_EMU_HANG_S=2 "},
};

static void test_plants(const char* argv0) {
    printf("planted bugs, each in a child process: the emulator must stop it (status 86) with a report naming it\n");
    for (size_t i = 0; i < g_plants.size(); i++) {
        std::string cmd = std::string(g_plants[i].env) + argv0 + " plant " + std::to_string(i) + " 2>&1";
        FILE* f = popen(cmd.c_str(), "r");
        std::string out;
        char buf[1024];
        while (f && fgets(buf, sizeof(buf), f)) out += buf;
        int st = f ? pclose(f) : -1;
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        std::string missing;
        for (const char* e : g_plants[i].expect)
            if (out.find(e) == std::string::npos) missing += std::string(missing.empty() ? "" : ", ") + "'" + e + "'";
        size_t at = out.find("tp-emu ERROR: ");
        std::string head = at == std::string::npos ? out.substr(0, 120) : out.substr(at + 14, out.find('\n', at) - at - 14);
        check(code == 86 && missing.empty(), "planted %-44s exit %d (want 86), report: %s%s%s", g_plants[i].name, code, head.c_str(),
              missing.empty() ? "" : "; missing ", missing.c_str());
        if (code != 86 || !missing.empty()) printf("%s\n", out.c_str());
    }
}

// ----------------------------------------------------------------------------
// launch limits: the error codes a GPU's launch returns, and nothing runs

__global__ void count_kernel(int* c) { atomicAdd(c, 1); }
__global__ void dyn_shared_kernel(float* out) {
    extern __shared__ float dyn[];
    int n = blockDim.x;
    for (int i = threadIdx.x; i < 16384; i += n) dyn[i] = (float)i;
    __syncthreads();
    out[threadIdx.x] = dyn[16383 - threadIdx.x];
}

static void test_launch_limits() {
    printf("launch limits (an H100's), reported as real CUDA reports them\n");
    int* c = nullptr;
    CK(cudaMalloc(&c, sizeof(int)));
    CK(cudaMemset(c, 0, sizeof(int)));
    struct { dim3 g, b; cudaError_t want; const char* what; } cases[] = {
        {dim3(1), dim3(1025), cudaErrorInvalidConfiguration, "1025 threads per block"},
        {dim3(1), dim3(32, 32, 2), cudaErrorInvalidConfiguration, "32x32x2 = 2048 threads"},
        {dim3(1), dim3(1, 1, 65), cudaErrorInvalidConfiguration, "block z = 65"},
        {dim3(1, 65536), dim3(32), cudaErrorInvalidConfiguration, "grid y = 65536"},
        {dim3(1, 1, 65536), dim3(32), cudaErrorInvalidConfiguration, "grid z = 65536"},
        {dim3(0), dim3(32), cudaErrorInvalidConfiguration, "an empty grid"},
        {dim3(2), dim3(1024), cudaSuccess, "2 blocks of 1024 threads"},
        {dim3(1, 65535), dim3(1), cudaSuccess, "grid y = 65535"},
    };
    int want = 0;
    for (auto& k : cases) {
        count_kernel<<<k.g, k.b>>>(c);
        cudaError_t e = cudaGetLastError();
        cudaError_t again = cudaGetLastError();
        if (e == cudaSuccess) want += k.g.x * k.g.y * k.g.z * k.b.x * k.b.y * k.b.z;
        check(e == k.want && again == cudaSuccess, "launch with %-26s -> %s (want %s), then cudaGetLastError -> %s (not sticky)", k.what,
              cudaGetErrorName(e), cudaGetErrorName(k.want), cudaGetErrorName(again));
    }
    int got = 0;
    CK(cudaMemcpy(&got, c, sizeof(int), cudaMemcpyDeviceToHost));
    check(got == want, "only the valid launches ran: %d of %d threads counted", got, want);
    float* out = nullptr;
    CK(cudaMalloc(&out, 64 * sizeof(float)));
    dyn_shared_kernel<<<1, 64, 65536>>>(out);
    cudaError_t e1 = cudaGetLastError();
    check(e1 == cudaErrorInvalidValue, "64 KB of dynamic shared memory without the attribute -> %s (want cudaErrorInvalidValue)", cudaGetErrorName(e1));
    cudaError_t e2 = cudaFuncSetAttribute(dyn_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536);
    dyn_shared_kernel<<<1, 64, 65536>>>(out);
    cudaError_t e3 = cudaGetLastError();
    std::vector<float> h = host_floats(out, 64);
    bool right = true;
    for (int i = 0; i < 64; i++) right &= h[i] == 16383.0f - i;
    check(e2 == cudaSuccess && e3 == cudaSuccess && right, "with cudaFuncSetAttribute(MaxDynamicSharedMemorySize, 65536): %s, launch %s, the kernel uses all 64 KB: %s",
          cudaGetErrorName(e2), cudaGetErrorName(e3), right ? "yes" : "no");
    cudaError_t e4 = cudaFuncSetAttribute(dyn_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 * 1024);
    cudaGetLastError();
    check(e4 == cudaErrorInvalidValue, "an attribute above the 227 KB opt-in limit -> %s (want cudaErrorInvalidValue)", cudaGetErrorName(e4));
    int cnt = 0;
    cudaDeviceProp prop;
    CK(cudaGetDeviceCount(&cnt));
    CK(cudaGetDeviceProperties(&prop, 0));
    check(cnt == 2 && prop.major == 9 && prop.maxThreadsPerBlock == 1024 && prop.sharedMemPerBlock == 48 * 1024, "%d devices (TP_EMU_DEVICES), compute capability %d.%d, %d threads/block, %zu KB shared/block",
          cnt, prop.major, prop.minor, prop.maxThreadsPerBlock, prop.sharedMemPerBlock / 1024);
    CK(cudaFree(c));
    CK(cudaFree(out));
}

// ----------------------------------------------------------------------------
// lazy streams, events, peer access

__global__ void slow_kernel(float* p, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) p[i] = sqrtf((float)i) + p[i];
}

static void test_streams() {
    printf("streams run lazily, when something waits; events\n");
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float* d = dev_floats(std::vector<float>(32, 0.0f));
    write_kernel<<<1, 32, 0, s>>>(d, 42.0f);
    // cudaMemcpy runs on the legacy default stream, which does not wait for a non-blocking stream
    float stale = -1.0f, fresh = -1.0f;
    CK(cudaMemcpy(&stale, d, sizeof(float), cudaMemcpyDeviceToHost));
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(&fresh, d, sizeof(float), cudaMemcpyDeviceToHost));
    check(stale == 0.0f && fresh == 42.0f, "a read that does not wait for the stream sees the old value (%g), after cudaStreamSynchronize the new (%g)", stale, fresh);
    // a blocking stream and the legacy stream do wait for each other
    cudaStream_t b;
    CK(cudaStreamCreate(&b));
    write_kernel<<<1, 32, 0, b>>>(d, 7.0f);
    CK(cudaMemcpy(&fresh, d, sizeof(float), cudaMemcpyDeviceToHost));
    check(fresh == 7.0f, "cudaMemcpy waits for work queued on a blocking stream (%g)", fresh);
    // events
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float* big = dev_floats(std::vector<float>(1 << 16, 1.0f));
    CK(cudaEventRecord(e0, s));
    slow_kernel<<<4, 256, 0, s>>>(big, 1 << 16);
    CK(cudaEventRecord(e1, s));
    float ms = -1.0f;
    cudaError_t before = cudaEventElapsedTime(&ms, e0, e1);
    cudaGetLastError();
    cudaError_t q = cudaEventQuery(e1);  // a query runs what it can: the kernel, then the marker
    CK(cudaEventElapsedTime(&ms, e0, e1));
    check(before == cudaErrorNotReady && q == cudaSuccess && ms > 0.0f, "cudaEventElapsedTime before the work ran: %s; a query runs it (%s); then %.3f ms > 0",
          cudaGetErrorName(before), cudaGetErrorName(q), ms);
    CK(cudaStreamQuery(s));
    // cudaStreamWaitEvent: stream c2 copies what stream s wrote; synchronising c2 alone runs s's write first
    // only if c2 waits for an event recorded after it (the overlap of gpt.cu's backward relies on that)
    for (bool wait : {true, false}) {
        cudaStream_t c2;
        cudaEvent_t ready;
        CK(cudaStreamCreateWithFlags(&c2, cudaStreamNonBlocking));
        CK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
        float* src = dev_floats(std::vector<float>(32, 0.0f));
        float* dst = dev_floats(std::vector<float>(32, -1.0f));
        write_kernel<<<1, 32, 0, s>>>(src, 5.0f);
        CK(cudaEventRecord(ready, s));
        if (wait) CK(cudaStreamWaitEvent(c2, ready, 0));
        CK(cudaMemcpyAsync(dst, src, 32 * sizeof(float), cudaMemcpyDeviceToDevice, c2));
        CK(cudaStreamSynchronize(c2));
        float seen = -2.0f;
        CK(cudaMemcpy(&seen, dst, sizeof(float), cudaMemcpyDeviceToHost));
        CK(cudaStreamSynchronize(s));
        check(seen == (wait ? 5.0f : 0.0f), "a copy on another stream %s cudaStreamWaitEvent sees %g (want %g)", wait ? "after" : "without", seen,
              wait ? 5.0f : 0.0f);
        for (float* p : {src, dst}) CK(cudaFree(p));
        CK(cudaEventDestroy(ready));
        CK(cudaStreamDestroy(c2));
    }
    // peer access
    int can = 0;
    CK(cudaDeviceCanAccessPeer(&can, 0, 1));
    CK(cudaSetDevice(0));
    cudaError_t p1 = cudaDeviceEnablePeerAccess(1, 0), p2 = cudaDeviceEnablePeerAccess(1, 0);
    cudaError_t last = cudaGetLastError();
    CK(cudaSetDevice(1));
    float* other = dev_floats(std::vector<float>(32, 0.0f));
    CK(cudaSetDevice(0));
    write_kernel<<<1, 32>>>(other, 3.0f);  // device 0 writes device 1's memory, now allowed
    CK(cudaDeviceSynchronize());
    float got = 0.0f;
    CK(cudaMemcpy(&got, other, sizeof(float), cudaMemcpyDefault));
    check(can == 1 && p1 == cudaSuccess && p2 == cudaErrorPeerAccessAlreadyEnabled && last == cudaErrorPeerAccessAlreadyEnabled && got == 3.0f,
          "peer access: can %d, enable %s, again %s (also the last error), then device 0 writes device 1's memory (%g)", can, cudaGetErrorName(p1),
          cudaGetErrorName(p2), got);
    CK(cudaDeviceDisablePeerAccess(1));
    for (float* p : {d, big, other}) CK(cudaFree(p));
    CK(cudaStreamDestroy(s));
    CK(cudaStreamDestroy(b));
    cudaError_t gone = cudaStreamSynchronize(s);
    cudaGetLastError();
    check(gone == cudaErrorInvalidResourceHandle, "a destroyed stream is an invalid handle (%s)", cudaGetErrorName(gone));
}

// ----------------------------------------------------------------------------
// warp intrinsics, barriers, atomics, the schedule

// out[tid * 8 + j]: the results of eight intrinsics for lane tid, with `width`
__global__ void warp_ops_kernel(unsigned* out, int width) {
    int t = threadIdx.x;
    unsigned v = 100u + t;
    unsigned* o = out + t * 8;
    o[0] = __shfl_sync(0xffffffffu, v, 5, width);
    o[1] = __shfl_up_sync(0xffffffffu, v, 3, width);
    o[2] = __shfl_down_sync(0xffffffffu, v, 3, width);
    o[3] = __shfl_xor_sync(0xffffffffu, v, 6, width);
    o[4] = __ballot_sync(0xffffffffu, t % 3 == 0);
    o[5] = (unsigned)__any_sync(0xffffffffu, t == 7) | ((unsigned)__all_sync(0xffffffffu, t < 32) << 1) | ((unsigned)__all_sync(0xffffffffu, t < 31) << 2);
    o[6] = __reduce_add_sync(0xffffffffu, v);
    o[7] = (unsigned)__syncthreads_count(t % 4 == 0);
}
// the documented semantics, computed on the host
static unsigned expect_warp(int t, int j, int width) {
    unsigned v = 100u + t;
    int seg = t & ~(width - 1), off = t - seg;
    switch (j) {
        case 0: return 100u + seg + (5 % width);
        case 1: return off >= 3 ? v - 3 : v;
        case 2: return off + 3 < width ? v + 3 : v;
        case 3: return ((t ^ 6) & ~(width - 1)) == seg ? 100u + (t ^ 6) : v;
        case 4: { unsigned b = 0; for (int l = 0; l < 32; l++) b |= (l % 3 == 0 ? 1u : 0u) << l; return b; }
        case 5: return 1u | 2u;
        case 6: { unsigned s = 0; for (int l = 0; l < 32; l++) s += 100u + l; return s; }
        default: return 8;
    }
}

__global__ void block_sum_kernel(const float* x, float* out, int n) {
    __shared__ float partial[32];
    float v = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) v += x[i];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0) *out = v;
    }
}
// warp-synchronous exchange through shared memory, ordered by __syncwarp (no race)
__global__ void syncwarp_kernel(int* out) {
    __shared__ int sh[64];
    int lane = threadIdx.x % 32, base = threadIdx.x - lane;
    sh[threadIdx.x] = lane * 10;
    __syncwarp();
    out[threadIdx.x] = sh[base + (lane + 1) % 32];
}
// threads writing neighbouring 2-byte and 1-byte elements that share 4-byte words: no race
__global__ void subword_kernel(int* out) {
    __shared__ unsigned short half[64];
    __shared__ unsigned char bytes[64];
    half[threadIdx.x] = (unsigned short)(threadIdx.x * 3);
    bytes[threadIdx.x] = (unsigned char)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = half[63 - threadIdx.x] + bytes[(threadIdx.x + 1) % 64];
}
__global__ void atomics_kernel(int* counter, float* fsum, unsigned* mx) {
    atomicAdd(counter, 1);
    atomicAdd(fsum, 0.5f);
    atomicMax(mx, blockIdx.x * blockDim.x + threadIdx.x);
}
__global__ void order_kernel(int* order, int* next) {
    int slot = atomicAdd(next, 1);
    order[slot] = blockIdx.x * blockDim.x + threadIdx.x;
}

// prints the order in which 512 threads reached an atomic (a child of test_device_semantics)
static int print_order() {
    int *order = nullptr, *next = nullptr;
    CK(cudaMalloc(&order, 512 * sizeof(int)));
    CK(cudaMalloc(&next, sizeof(int)));
    CK(cudaMemset(next, 0, 4));
    order_kernel<<<2, 256>>>(order, next);
    std::vector<int> h(512);
    CK(cudaMemcpy(h.data(), order, 512 * sizeof(int), cudaMemcpyDeviceToHost));
    for (int x : h) printf("%d ", x);
    printf("\n");
    return 0;
}

static void test_device_semantics(const char* argv0) {
    printf("warp intrinsics against their definitions, barriers, atomics, the seeded schedule\n");
    unsigned* out = nullptr;
    CK(cudaMalloc(&out, 32 * 8 * sizeof(unsigned)));
    for (int width : {32, 16, 8}) {
        warp_ops_kernel<<<1, 32>>>(out, width);
        std::vector<unsigned> h(32 * 8);
        CK(cudaMemcpy(h.data(), out, h.size() * sizeof(unsigned), cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int t = 0; t < 32; t++)
            for (int j = 0; j < 8; j++) bad += h[t * 8 + j] != expect_warp(t, j, j < 4 ? width : 32);
        check(bad == 0, "shfl idx/up/down/xor (width %d), ballot, any/all, reduce_add, __syncthreads_count: %d of 256 results differ from the definitions", width, bad);
    }
    std::vector<float> x(1000);
    float want = 0.0f;
    for (int i = 0; i < 1000; i++) want += (x[i] = (float)(i % 7));
    float* dx = dev_floats(x);
    float* ds = dev_floats({0.0f});
    block_sum_kernel<<<1, 256>>>(dx, ds, 1000);
    float got = host_floats(ds, 1)[0];
    check(got == want, "block reduction through shuffles and shared memory: %g (want %g), no race reported", got, want);
    int* dw = nullptr;
    CK(cudaMalloc(&dw, 64 * sizeof(int)));
    syncwarp_kernel<<<1, 64>>>(dw);
    std::vector<int> hw(64);
    CK(cudaMemcpy(hw.data(), dw, sizeof(int) * 64, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int t = 0; t < 64; t++) bad += hw[t] != ((t % 32 + 1) % 32) * 10;
    check(bad == 0, "a warp exchanging values through shared memory after __syncwarp: %d wrong, no race reported", bad);
    subword_kernel<<<1, 64>>>(dw);
    CK(cudaMemcpy(hw.data(), dw, sizeof(int) * 64, cudaMemcpyDeviceToHost));
    bad = 0;
    for (int t = 0; t < 64; t++) bad += hw[t] != (63 - t) * 3 + (t + 1) % 64;
    check(bad == 0, "threads writing neighbouring 2-byte and 1-byte shared elements (one 4-byte word each 2 or 4 threads): %d wrong, no race reported", bad);
    int* counter = nullptr;
    float* fsum = nullptr;
    unsigned* mx = nullptr;
    CK(cudaMalloc(&counter, sizeof(int)));
    CK(cudaMalloc(&fsum, sizeof(float)));
    CK(cudaMalloc(&mx, sizeof(unsigned)));
    CK(cudaMemset(counter, 0, 4));
    CK(cudaMemset(fsum, 0, 4));
    CK(cudaMemset(mx, 0, 4));
    atomics_kernel<<<4, 1024>>>(counter, fsum, mx);
    int hc = 0;
    float hf = 0;
    unsigned hm = 0;
    CK(cudaMemcpy(&hc, counter, 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&hf, fsum, 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&hm, mx, 4, cudaMemcpyDeviceToHost));
    check(hc == 4096 && hf == 2048.0f && hm == 4095, "atomicAdd (int, float), atomicMax from 4096 threads: %d, %g, %u", hc, hf, hm);
    // the schedule: TP_EMU_SEED decides the interleaving (a child process per run)
    std::vector<std::string> runs;
    for (const char* seed : {"1", "1", "2"}) {
        std::string cmd = std::string("TP_EMU_SEED=") + seed + " " + argv0 + " order 2>&1";
        FILE* f = popen(cmd.c_str(), "r");
        char buf[8192] = "";
        std::string o;
        while (f && fgets(buf, sizeof(buf), f)) o += buf;
        if (f) pclose(f);
        runs.push_back(o);
    }
    int moved = 0, n0 = 0;
    for (size_t i = 0; i < runs[0].size() && i < runs[2].size(); i++) moved += runs[0][i] != runs[2][i];
    for (char ch : runs[0]) n0 += ch == ' ';
    check(n0 == 512 && runs[0] == runs[1] && moved > 100, "threads reach an atomic in a seeded order: TP_EMU_SEED=1 twice gives the same %d-thread order, "
          "TP_EMU_SEED=2 another (%d characters of its printout differ)", n0, moved);
    for (void* p : {(void*)out, (void*)dx, (void*)ds, (void*)dw, (void*)counter, (void*)fsum, (void*)mx}) CK(cudaFree(p));
}

// ----------------------------------------------------------------------------
// the warp matrix functions (mma.h): TF32 m16n16k8 against its definition

static std::vector<float> randv(size_t n, unsigned seed);  // (with the cuBLAS tests below)

// C (16 x 16, ldc, row- or column-major) = A (16 x 8) . B (8 x 16) + C, each operand in the layout asked for
template <class LA, class LB>
__global__ void wmma_gemm_kernel(const float* A, int lda, const float* B, int ldb, float* C, int ldc, int c_col) {
    wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, LA> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, LB> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc;
    const wmma::layout_t lc = c_col ? wmma::mem_col_major : wmma::mem_row_major;
    wmma::load_matrix_sync(fa, A, lda);
    wmma::load_matrix_sync(fb, B, ldb);
    wmma::load_matrix_sync(acc, C, ldc, lc);
    wmma::mma_sync(acc, fa, fb, acc);
    wmma::store_matrix_sync(C, acc, ldc, lc);
}
__global__ void tf32_kernel(const float* x, float* y) { y[threadIdx.x] = wmma::__float_to_tf32(x[threadIdx.x]); }
__global__ void wmma_layout_kernel(float* out) {  // slot s = lane * 8 + e, stored: where each slot's element lies
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc;
    for (int e = 0; e < acc.num_elements; e++) acc.x[e] = (float)(threadIdx.x * acc.num_elements + e);
    wmma::store_matrix_sync(out, acc, 16, wmma::mem_row_major);
}

template <class LA, class LB>
static int wmma_case(bool a_col, bool b_col, bool c_col, unsigned seed) {
    const int lda = a_col ? 20 : 12, ldb = b_col ? 12 : 20, ldc = 24;  // (padded strides: ld is honoured)
    std::vector<float> A = randv(16 * 20, seed), B = randv(16 * 20, seed + 1), C = randv(16 * ldc, seed + 2);
    auto a = [&](int r, int k) { return A[a_col ? k * lda + r : r * lda + k]; };
    auto b = [&](int k, int n) { return B[b_col ? n * ldb + k : k * ldb + n]; };
    auto cref = [&](std::vector<float>& M, int r, int n) -> float& { return M[c_col ? n * ldc + r : r * ldc + n]; };
    auto cut = [](float v) {  // the tensor cores' TF32 input: the top 19 bits
        uint32_t u;
        memcpy(&u, &v, 4);
        u &= 0xffffe000u;
        memcpy(&v, &u, 4);
        return v;
    };
    std::vector<float> want = C;
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 16; n++) {
            float acc = cref(want, r, n);
            for (int k = 0; k < 8; k++) acc += cut(a(r, k)) * cut(b(k, n));
            cref(want, r, n) = acc;
        }
    float *dA = dev_floats(A), *dB = dev_floats(B), *dC = dev_floats(C);
    wmma_gemm_kernel<LA, LB><<<1, 32>>>(dA, lda, dB, ldb, dC, ldc, c_col);
    std::vector<float> got = host_floats(dC, C.size());
    int bad = 0;
    for (size_t i = 0; i < got.size(); i++) bad += memcmp(&got[i], &want[i], 4) != 0;
    for (float* p : {dA, dB, dC}) CK(cudaFree(p));
    return bad;
}

static void test_wmma() {
    printf("warp matrix functions (wmma, TF32 m16n16k8) against their definition\n");
    int bad = 0, cases = 0;
    for (int c_col = 0; c_col < 2; c_col++, cases += 4) {
        bad += wmma_case<wmma::row_major, wmma::row_major>(false, false, c_col, 10 + c_col);
        bad += wmma_case<wmma::row_major, wmma::col_major>(false, true, c_col, 20 + c_col);
        bad += wmma_case<wmma::col_major, wmma::row_major>(true, false, c_col, 30 + c_col);
        bad += wmma_case<wmma::col_major, wmma::col_major>(true, true, c_col, 40 + c_col);
    }
    check(bad == 0, "load, mma_sync, store in every layout of A, B and C (%d cases, padded strides): %d of %d elements differ from "
          "C + sum_k tf32(a) tf32(b) in fp32", cases, bad, cases * 16 * 24);
    // __float_to_tf32: to nearest, ties away from zero, at 10 fraction bits; infinities and NaN kept
    const float tie = 1.0f + ldexpf(1.0f, -11), below = 1.0f + ldexpf(1.0f, -11) - ldexpf(1.0f, -23);
    std::vector<float> x = {tie, -tie, below, 1.0f + ldexpf(3.0f, -12), INFINITY, -INFINITY, NAN, 3.0f, 0.0f, -0.0f};
    std::vector<float> want = {1.0f + ldexpf(1.0f, -10), -(1.0f + ldexpf(1.0f, -10)), 1.0f, 1.0f + ldexpf(1.0f, -10), INFINITY, -INFINITY,
                               NAN, 3.0f, 0.0f, -0.0f};
    float *dx = dev_floats(x), *dy = dev_floats(std::vector<float>(x.size(), 7.0f));
    tf32_kernel<<<1, (unsigned)x.size()>>>(dx, dy);
    std::vector<float> y = host_floats(dy, x.size());
    int wrong = 0;
    for (size_t i = 0; i < x.size(); i++) wrong += std::isnan(want[i]) ? !std::isnan(y[i]) : memcmp(&y[i], &want[i], 4) != 0;
    check(wrong == 0, "__float_to_tf32 on ties (both signs), just below a tie, infinities, NaN and zeros: %d of %zu wrong", wrong, x.size());
    // a fragment's layout: a permutation of the 256 elements, drawn per launch (two launches differ)
    float* dl = dev_floats(std::vector<float>(256, -1.0f));
    std::vector<std::vector<float>> maps;
    for (int i = 0; i < 2; i++) {
        wmma_layout_kernel<<<1, 32>>>(dl);
        maps.push_back(host_floats(dl, 256));
    }
    int perm = 0, differ = 0;
    for (auto& m : maps) {
        std::vector<float> sorted = m;
        std::sort(sorted.begin(), sorted.end());
        bool ok = true;
        for (int i = 0; i < 256; i++) ok = ok && sorted[i] == (float)i;
        perm += ok;
    }
    for (int i = 0; i < 256; i++) differ += maps[0][i] != maps[1][i];
    check(perm == 2 && differ > 128, "an accumulator's slots over the 16 x 16 elements: %d of 2 launches a permutation, the two launches' "
          "layouts differ at %d of 256 elements (code that assumes a layout fails here)", perm, differ);
    for (float* p : {dx, dy, dl}) CK(cudaFree(p));
}

// ----------------------------------------------------------------------------
// cuBLAS and cuBLASLt against naive column-major loops

// C (m x n, ldc) = alpha op(A) op(B) + beta C in double, column-major, on the host
static void naive_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* A, int lda, const float* B, int ldb, float beta,
                       float* C, int ldc, bool tf32) {
    auto rnd = [&](float x) {
        if (!tf32) return (double)x;
        uint32_t u;
        memcpy(&u, &x, 4);
        u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;  // round to nearest even, 10 mantissa bits
        float r;
        memcpy(&r, &u, 4);
        return (double)r;
    };
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0.0;
            for (int l = 0; l < k; l++) s += rnd(ta ? A[l + i * lda] : A[i + l * lda]) * rnd(tb ? B[j + l * ldb] : B[l + j * ldb]);
            C[i + j * ldc] = (float)(alpha * s + (beta != 0.0f ? beta * (double)C[i + j * ldc] : 0.0));
        }
}

static std::vector<float> randv(size_t n, unsigned seed) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        v[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
    return v;
}

static double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
    double e = 0.0, s = 0.0;
    for (size_t i = 0; i < a.size(); i++) {
        e = std::max(e, (double)fabsf(a[i] - b[i]));
        s = std::max(s, (double)fabsf(b[i]));
        if (a[i] != a[i]) return INFINITY;
    }
    return s > 0 ? e / s : e;
}

static void test_cublas() {
    printf("cuBLAS: column-major GEMMs against naive loops\n");
    cublasHandle_t h;
    cublasCreate(&h);
    cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
    int m = 13, n = 7, k = 19;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int lda = (ta ? k : m) + 3, ldb = (tb ? n : k) + 2, ldc = m + 5;
            auto A = randv((size_t)lda * (ta ? m : k), 1), B = randv((size_t)ldb * (tb ? k : n), 2), C = randv((size_t)ldc * n, 3);
            float alpha = 0.75f, beta = -1.5f;
            float *dA = dev_floats(A), *dB = dev_floats(B), *dC = dev_floats(C);
            cublasStatus_t st = cublasGemmEx(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, dA, CUDA_R_32F, lda,
                                             dB, CUDA_R_32F, ldb, &beta, dC, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            auto got = host_floats(dC, C.size());
            auto want = C;
            naive_gemm(ta, tb, m, n, k, alpha, A.data(), lda, B.data(), ldb, beta, want.data(), ldc, false);
            check(st == CUBLAS_STATUS_SUCCESS && max_rel(got, want) < 1e-6 && got[m] == C[m],
                  "cublasGemmEx op(A)=%s op(B)=%s, ld > rows, alpha %.2f, beta %.1f: max rel err %.1e (bound 1e-6); padding rows untouched",
                  ta ? "T" : "N", tb ? "T" : "N", alpha, beta, max_rel(got, want));
            for (float* p : {dA, dB, dC}) CK(cudaFree(p));
        }
    // strided batches, beta 0 with NaN in C (C must not be read)
    {
        int batch = 3;
        long long sA = m * k + 11, sB = k * n + 5, sC = m * n + 7;
        auto A = randv(sA * batch, 4), B = randv(sB * batch, 5);
        std::vector<float> C(sC * batch, NAN);
        float *dA = dev_floats(A), *dB = dev_floats(B), *dC = dev_floats(C);
        float alpha = 1.0f, beta = 0.0f;
        cublasStatus_t st = cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_T, m, n, k, &alpha, dA, CUDA_R_32F, m, sA, dB, CUDA_R_32F, n, sB,
                                                       &beta, dC, CUDA_R_32F, m, sC, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        auto got = host_floats(dC, C.size());
        double err = 0;
        int gaps_nan = 0;
        for (int b = 0; b < batch; b++) {
            std::vector<float> want(m * n, 0.0f);
            naive_gemm(false, true, m, n, k, 1.0f, A.data() + b * sA, m, B.data() + b * sB, n, 0.0f, want.data(), m, false);
            std::vector<float> g(got.begin() + b * sC, got.begin() + b * sC + m * n);
            err = std::max(err, max_rel(g, want));
            gaps_nan += got[b * sC + m * n] != got[b * sC + m * n];
        }
        check(st == CUBLAS_STATUS_SUCCESS && err < 1e-6 && gaps_nan == batch, "cublasGemmStridedBatchedEx, 3 batches at strides past the matrices, beta 0 over NaN: max rel err %.1e, gaps untouched %d/3", err, gaps_nan);
        for (float* p : {dA, dB, dC}) CK(cudaFree(p));
    }
    // bf16 A and B (CUDA_R_16BF), fp32 C: each element is the top half of an fp32, widened exactly; a 1 read as
    // 0x3f80 must give what the fp32 loops give on the widened values; TF32 compute with bf16 inputs is refused
    {
        int lda = m + 1, ldb = k + 2, ldc = m;
        auto A = randv((size_t)lda * k, 6), B = randv((size_t)ldb * n, 7);
        std::vector<uint16_t> Ah(A.size()), Bh(B.size());
        auto top = [](float& x) {  // keep the top 16 bits of x, return them
            uint32_t u;
            memcpy(&u, &x, 4);
            u &= 0xffff0000u;
            memcpy(&x, &u, 4);
            return (uint16_t)(u >> 16);
        };
        for (size_t i = 0; i < A.size(); i++) Ah[i] = top(A[i]);
        for (size_t i = 0; i < B.size(); i++) Bh[i] = top(B[i]);
        void *dA, *dB;
        CK(cudaMalloc(&dA, Ah.size() * 2));
        CK(cudaMalloc(&dB, Bh.size() * 2));
        CK(cudaMemcpy(dA, Ah.data(), Ah.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dB, Bh.data(), Bh.size() * 2, cudaMemcpyHostToDevice));
        float* dC = dev_floats(std::vector<float>((size_t)ldc * n, 0.0f));
        float one = 1.0f, zero = 0.0f;
        cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_16BF, lda, dB, CUDA_R_16BF, ldb, &zero,
                                         dC, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        auto got = host_floats(dC, (size_t)ldc * n);
        std::vector<float> want((size_t)ldc * n, 0.0f);
        naive_gemm(false, false, m, n, k, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, want.data(), ldc, false);
        cublasStatus_t tf = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_16BF, lda, dB, CUDA_R_16BF, ldb, &zero,
                                         dC, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT);
        check(st == CUBLAS_STATUS_SUCCESS && max_rel(got, want) < 1e-6 && tf == CUBLAS_STATUS_NOT_SUPPORTED,
              "cublasGemmEx with bf16 A and B, fp32 C: max rel err %.1e against the loops on the widened values (bound 1e-6); "
              "COMPUTE_32F_FAST_TF32 with bf16 inputs: %s", max_rel(got, want), cublasGetStatusName(tf));
        // a bf16 C (ldc past the rows): each element the fp32 result rounded to nearest, ties to even; the rows
        // past m untouched; an fp32 C with bf16 A and B refused nowhere, a bf16 C with fp32 A and B is outside
        // the subset (not tested: it fails the run)
        std::vector<uint16_t> Ch((size_t)(ldc + 3) * n, 0xabcd);
        void* dCh;
        CK(cudaMalloc(&dCh, Ch.size() * 2));
        CK(cudaMemcpy(dCh, Ch.data(), Ch.size() * 2, cudaMemcpyHostToDevice));
        cublasStatus_t s16 = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_16BF, lda, dB, CUDA_R_16BF, ldb, &zero,
                                          dCh, CUDA_R_16BF, ldc + 3, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        CK(cudaMemcpy(Ch.data(), dCh, Ch.size() * 2, cudaMemcpyDeviceToHost));
        long wrong = 0, pad = 0;
        for (int j = 0; j < n; j++)
            for (int i = 0; i < ldc + 3; i++) {
                uint16_t g = Ch[(size_t)j * (ldc + 3) + i];
                if (i >= m) { pad += g != 0xabcd; continue; }
                float w = got[(size_t)j * ldc + i];  // the fp32 C of the same product
                uint32_t u;
                memcpy(&u, &w, 4);
                wrong += g != (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
            }
        check(s16 == CUBLAS_STATUS_SUCCESS && wrong == 0 && pad == 0,
              "cublasGemmEx with bf16 A, B and C: %ld of %d elements not the fp32 result rounded to nearest even, %ld padding "
              "elements written", wrong, m * n, pad);
        CK(cudaFree(dCh));
        CK(cudaFree(dA));
        CK(cudaFree(dB));
        CK(cudaFree(dC));
    }
    // TF32: products of 1 + 2^-12 vanish into the rounding, as on tensor cores
    {
        int kk = 64;
        std::vector<float> A(kk, 1.0f + 1.0f / 4096.0f), B(kk, 1.0f);
        float *dA = dev_floats(A), *dB = dev_floats(B), *dC = dev_floats({0.0f});
        float one = 1.0f, zero = 0.0f;
        cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, kk, &one, dA, CUDA_R_32F, 1, dB, CUDA_R_32F, kk, &zero, dC, CUDA_R_32F, 1,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        float fp32 = host_floats(dC, 1)[0];
        cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, kk, &one, dA, CUDA_R_32F, 1, dB, CUDA_R_32F, kk, &zero, dC, CUDA_R_32F, 1,
                     CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT);
        float tf32 = host_floats(dC, 1)[0];
        cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH);
        cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, kk, &one, dA, CUDA_R_32F, 1, dB, CUDA_R_32F, kk, &zero, dC, CUDA_R_32F, 1,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        float mode = host_floats(dC, 1)[0];
        cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
        check(fp32 == 64.0f + 64.0f / 4096.0f && tf32 == 64.0f && mode == 64.0f,
              "TF32 rounds the inputs to 10 mantissa bits: fp32 %.6f, COMPUTE_32F_FAST_TF32 %.6f, COMPUTE_32F under TF32_TENSOR_OP_MATH %.6f", fp32, tf32, mode);
        for (float* p : {dA, dB, dC}) CK(cudaFree(p));
    }
    // argument checks as cuBLAS makes them
    {
        float* d = dev_floats(std::vector<float>(64, 1.0f));
        float one = 1.0f;
        cublasStatus_t s1 = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 4, 4, &one, d, CUDA_R_32F, 7, d, CUDA_R_32F, 4, &one, d + 32, CUDA_R_32F, 8,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        cublasStatus_t s2 = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 8, 4, 4, &one, d, CUDA_R_32F, 3, d, CUDA_R_32F, 4, &one, d + 32, CUDA_R_32F, 8,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        cublasStatus_t s3 = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, -1, 4, 4, &one, d, CUDA_R_32F, 8, d, CUDA_R_32F, 4, &one, d + 32, CUDA_R_32F, 8,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        cublasStatus_t s4 = cublasSetWorkspace(h, (char*)d + 4, 128);
        check(s1 == CUBLAS_STATUS_INVALID_VALUE && s2 == CUBLAS_STATUS_INVALID_VALUE && s3 == CUBLAS_STATUS_INVALID_VALUE && s4 == CUBLAS_STATUS_INVALID_VALUE,
              "lda < m, lda < k (transposed), m < 0, an unaligned workspace: %s, %s, %s, %s", cublasGetStatusName(s1), cublasGetStatusName(s2),
              cublasGetStatusName(s3), cublasGetStatusName(s4));
        CK(cudaFree(d));
    }
    cublasDestroy(h);

    printf("cuBLASLt: the bias epilogue (fp32 and bf16 operands), the heuristic's preferences, refusal\n");
    cublasLtHandle_t lt;
    cublasLtCreate(&lt);
    int N = 9, IC = 12, OC = 10;  // out (N, OC) = inp (N, IC) . W^T + bias, row-major, as tp calls it
    auto inp = randv(N * IC, 6), W = randv(OC * IC, 7), bias = randv(OC, 8);
    float *dI = dev_floats(inp), *dW = dev_floats(W), *dB = dev_floats(bias), *dO = dev_floats(std::vector<float>(N * OC, NAN));
    float* ws = nullptr;
    CK(cudaMalloc(&ws, 4 << 20));
    // ab: the type of W and inp (the device copies lt_w and lt_i)
    cudaDataType_t ab = CUDA_R_32F;
    const void *lt_w = dW, *lt_i = dI;
    auto lt_run = [&](uint64_t max_ws, int* found) {
        cublasLtMatmulDesc_t desc;
        cublasLtMatrixLayout_t lw, li, lo;
        cublasLtMatmulPreference_t pref;
        cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
        cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof(opT));
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof(opN));
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi));
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dB, sizeof(dB));
        cublasLtMatrixLayoutCreate(&lw, ab, IC, OC, IC);
        cublasLtMatrixLayoutCreate(&li, ab, IC, N, IC);
        cublasLtMatrixLayoutCreate(&lo, CUDA_R_32F, OC, N, OC);
        cublasLtMatmulPreferenceCreate(&pref);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof(max_ws));
        cublasLtMatmulHeuristicResult_t r;
        cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, desc, lw, li, lo, lo, pref, 1, &r, found);
        cublasStatus_t mst = CUBLAS_STATUS_NOT_SUPPORTED;
        if (st == CUBLAS_STATUS_SUCCESS && *found) {
            float one = 1.0f, zero = 0.0f;
            mst = cublasLtMatmul(lt, desc, &one, lt_w, lw, lt_i, li, &zero, dO, lo, dO, lo, &r.algo, ws, r.workspaceSize / 2, 0);  // too little workspace
            if (r.workspaceSize == 0 || mst == CUBLAS_STATUS_INVALID_VALUE)
                mst = cublasLtMatmul(lt, desc, &one, lt_w, lw, lt_i, li, &zero, dO, lo, dO, lo, &r.algo, ws, 4 << 20, 0);
        }
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(lo);
        cublasLtMatrixLayoutDestroy(li);
        cublasLtMatrixLayoutDestroy(lw);
        cublasLtMatmulDescDestroy(desc);
        return mst;
    };
    int found = 0;
    cublasStatus_t st = lt_run(4 << 20, &found);
    auto got = host_floats(dO, N * OC);
    std::vector<float> want(N * OC);
    for (int i = 0; i < N; i++)
        for (int o = 0; o < OC; o++) {
            double s = bias[o];
            for (int c = 0; c < IC; c++) s += (double)inp[i * IC + c] * W[o * IC + c];
            want[i * OC + o] = (float)s;
        }
    check(st == CUBLAS_STATUS_SUCCESS && found == 1 && max_rel(got, want) < 1e-6, "cublasLtMatmul W^T . inp + bias (epilogue): %d algorithm, max rel err %.1e (bound 1e-6)",
          found, max_rel(got, want));
    // W and inp in bf16 storage (CUDA_R_16BF, fp32 compute), out and bias fp32: the loops on the values widened
    {
        std::vector<uint16_t> inp16(inp.size()), W16(W.size());
        std::vector<float> inpw(inp.size()), Ww(W.size());
        auto widened = [](float x, uint16_t* h) {  // x's top 16 bits, and them widened
            uint32_t u;
            memcpy(&u, &x, 4);
            *h = (uint16_t)(u >> 16);
            u &= 0xffff0000u;
            memcpy(&x, &u, 4);
            return x;
        };
        for (size_t i = 0; i < inp.size(); i++) inpw[i] = widened(inp[i], &inp16[i]);
        for (size_t i = 0; i < W.size(); i++) Ww[i] = widened(W[i], &W16[i]);
        void *dI16, *dW16;
        CK(cudaMalloc(&dI16, inp16.size() * 2));
        CK(cudaMalloc(&dW16, W16.size() * 2));
        CK(cudaMemcpy(dI16, inp16.data(), inp16.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dW16, W16.data(), W16.size() * 2, cudaMemcpyHostToDevice));
        ab = CUDA_R_16BF, lt_w = dW16, lt_i = dI16;
        st = lt_run(4 << 20, &found);
        ab = CUDA_R_32F, lt_w = dW, lt_i = dI;
        got = host_floats(dO, N * OC);
        for (int i = 0; i < N; i++)
            for (int o = 0; o < OC; o++) {
                double s = bias[o];
                for (int c = 0; c < IC; c++) s += (double)inpw[i * IC + c] * Ww[o * IC + c];
                want[i * OC + o] = (float)s;
            }
        check(st == CUBLAS_STATUS_SUCCESS && found == 1 && max_rel(got, want) < 1e-6,
              "cublasLtMatmul with W and inp in bf16 (CUDA_R_16BF), fp32 out and bias: max rel err %.1e (bound 1e-6)", max_rel(got, want));
        CK(cudaFree(dI16));
        CK(cudaFree(dW16));
    }
    emu_set_lt_refuse(1);
    st = lt_run(4 << 20, &found);
    emu_set_lt_refuse(0);
    check(found == 0 && st == CUBLAS_STATUS_NOT_SUPPORTED, "with the refusal switch (TP_EMU_LT_REFUSE) the heuristic finds %d algorithms", found);
    for (float* p : {dI, dW, dB, dO, ws}) CK(cudaFree(p));
    cublasLtDestroy(lt);
}

// ----------------------------------------------------------------------------
// NCCL

static void test_nccl() {
    printf("NCCL: rank threads on devices 0 and 1\n");
    const int P = 2;
    ncclComm_t comms[P];
    int devs[P] = {0, 1};
    ncclResult_t r = ncclCommInitAll(comms, P, devs);
    int same[2] = {0, 0};
    ncclComm_t dup[2];
    ncclResult_t rd = ncclCommInitAll(dup, 2, same);
    check(r == ncclSuccess && rd == ncclInvalidUsage, "ncclCommInitAll on devices 0, 1: %s; twice on device 0: %s (%s)", ncclGetErrorString(r),
          ncclGetErrorString(rd), ncclGetLastError(nullptr));
    const int n = 1000;
    std::vector<std::vector<float>> res(P * 8);
    std::vector<std::thread> th;
    for (int q = 0; q < P; q++)
        th.emplace_back([&, q] {
            CK(cudaSetDevice(q));
            cudaStream_t s;
            CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
            std::vector<float> in(n * P);
            for (int i = 0; i < n * P; i++) in[i] = (float)((i * 7 + q * 13) % 11) - 5.0f;
            float *a = dev_floats(in), *b = dev_floats(in), *c = dev_floats(in), *d = dev_floats(in), *e = dev_floats(in);
            float *g = dev_floats(std::vector<float>(n * P, 0.0f)), *rs = dev_floats(std::vector<float>(n, 0.0f));
            ncclGroupStart();
            ncclAllReduce(a, a, n, ncclFloat, ncclSum, comms[q], s);  // in place
            ncclAllReduce(b, b, n, ncclFloat, ncclMax, comms[q], s);
            ncclAllReduce(c, c, n, ncclFloat, ncclAvg, comms[q], s);
            ncclGroupEnd();
            ncclAllGather(d, g, n, ncclFloat, comms[q], s);
            ncclBroadcast(e, e, n, ncclFloat, 1, comms[q], s);
            ncclReduceScatter(d, rs, n, ncclFloat, ncclSum, comms[q], s);
            ncclResult_t async = ncclInProgress;
            ncclCommGetAsyncError(comms[q], &async);
            CK(cudaStreamSynchronize(s));
            res[q * 8 + 0] = host_floats(a, n);
            res[q * 8 + 1] = host_floats(b, n);
            res[q * 8 + 2] = host_floats(c, n);
            res[q * 8 + 3] = host_floats(g, n * P);
            res[q * 8 + 4] = host_floats(e, n);
            res[q * 8 + 5] = host_floats(rs, n);
            res[q * 8 + 6] = in;
            res[q * 8 + 7] = {(float)async};
            for (float* p : {a, b, c, d, e, g, rs}) CK(cudaFree(p));
            CK(cudaStreamDestroy(s));
        });
    for (auto& t : th) t.join();
    int bad[6] = {0};
    for (int q = 0; q < P; q++)
        for (int i = 0; i < n; i++) {
            const std::vector<float>&in0 = res[6], &in1 = res[8 + 6];
            bad[0] += res[q * 8 + 0][i] != in0[i] + in1[i];
            bad[1] += res[q * 8 + 1][i] != std::max(in0[i], in1[i]);
            bad[2] += res[q * 8 + 2][i] != (in0[i] + in1[i]) / 2;
            bad[3] += res[q * 8 + 3][i] != in0[i] || res[q * 8 + 3][n + i] != in1[i];
            bad[4] += res[q * 8 + 4][i] != in1[i];
            bad[5] += res[q * 8 + 5][i] != in0[q * n + i] + in1[q * n + i];
        }
    check(bad[0] + bad[1] + bad[2] + bad[3] + bad[4] + bad[5] == 0 && res[7][0] == 0 && res[15][0] == 0,
          "all-reduce sum (in place)/max/avg, all-gather, broadcast (root 1), reduce-scatter: %d/%d/%d/%d/%d/%d wrong; async error %s",
          bad[0], bad[1], bad[2], bad[3], bad[4], bad[5], ncclGetErrorString((ncclResult_t)res[7][0]));
    for (int q = 0; q < P; q++) ncclCommDestroy(comms[q]);
    // point to point, one thread driving both ranks: the k-th send from rank 0 to rank 1 meets the k-th
    // receive of rank 1 from rank 0, with a send the other way between them; a query before the peer has
    // arrived is "not ready", and a blocking wait runs the peer's stream
    {
        ncclComm_t pc[2];
        ncclResult_t pr = ncclCommInitAll(pc, 2, devs);
        cudaStream_t ps[2];
        CK(cudaSetDevice(0));  // rank 0: two messages to rank 1, and a buffer for rank 1's message
        CK(cudaStreamCreateWithFlags(&ps[0], cudaStreamNonBlocking));
        float *m0 = dev_floats(std::vector<float>(n, 1.5f)), *m1 = dev_floats(std::vector<float>(n, 2.5f));
        float* got0 = dev_floats(std::vector<float>(n, 0.0f));
        CK(cudaSetDevice(1));  // rank 1: buffers for the two, and its message to rank 0
        CK(cudaStreamCreateWithFlags(&ps[1], cudaStreamNonBlocking));
        float *got1a = dev_floats(std::vector<float>(n, 0.0f)), *got1b = dev_floats(std::vector<float>(n, 0.0f));
        float* m2 = dev_floats(std::vector<float>(n, -7.25f));
        CK(cudaSetDevice(0));
        ncclSend(m0, n, ncclFloat, 1, pc[0], ps[0]);
        ncclRecv(got0, n, ncclFloat, 1, pc[0], ps[0]);
        ncclSend(m1, n, ncclFloat, 1, pc[0], ps[0]);
        cudaError_t pq = cudaStreamQuery(ps[0]);  // rank 1 has queued nothing: not ready
        cudaGetLastError();
        CK(cudaSetDevice(1));
        ncclRecv(got1a, n, ncclFloat, 0, pc[1], ps[1]);
        ncclSend(m2, n, ncclFloat, 0, pc[1], ps[1]);
        ncclRecv(got1b, n, ncclFloat, 0, pc[1], ps[1]);
        CK(cudaStreamSynchronize(ps[1]));  // runs rank 0's stream itself
        std::vector<float> a1 = host_floats(got1a, n), b1 = host_floats(got1b, n);
        CK(cudaSetDevice(0));
        CK(cudaStreamSynchronize(ps[0]));
        std::vector<float> a0 = host_floats(got0, n);
        int wrong = 0;
        for (int i = 0; i < n; i++) wrong += (a1[i] != 1.5f) + (b1[i] != 2.5f) + (a0[i] != -7.25f);
        check(pr == ncclSuccess && pq == cudaErrorNotReady && wrong == 0,
              "ncclSend/ncclRecv, one thread, two ranks, messages both ways: a query before the peer arrives is %s; %d of %d floats wrong",
              cudaGetErrorName(pq), wrong, 3 * n);
        for (float* p : {m0, m1, got0}) CK(cudaFree(p));
        CK(cudaSetDevice(1));
        for (float* p : {got1a, got1b, m2}) CK(cudaFree(p));
        for (int q = 0; q < 2; q++) {
            CK(cudaStreamDestroy(ps[q]));
            ncclCommDestroy(pc[q]);
        }
        CK(cudaSetDevice(0));
    }
    // one thread driving two communicators made by ncclCommInitRank inside a group
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    ncclComm_t c2[2];
    ncclGroupStart();
    for (int q = 0; q < 2; q++) {
        CK(cudaSetDevice(q));
        ncclCommInitRank(&c2[q], 2, id, q);
    }
    ncclResult_t gr = ncclGroupEnd();
    float* buf[2];
    cudaStream_t st[2];
    for (int q = 0; q < 2; q++) {
        CK(cudaSetDevice(q));
        CK(cudaStreamCreate(&st[q]));
        buf[q] = dev_floats(std::vector<float>(8, (float)(q + 1)));
    }
    ncclGroupStart();
    for (int q = 0; q < 2; q++) ncclAllReduce(buf[q], buf[q], 8, ncclFloat, ncclSum, c2[q], st[q]);
    ncclGroupEnd();
    cudaError_t qe = cudaStreamQuery(st[0]);  // rank 1 has not run yet: not ready, no hang
    cudaGetLastError();
    CK(cudaSetDevice(0));
    CK(cudaStreamSynchronize(st[0]));  // waits, running rank 1's stream itself
    float v0 = host_floats(buf[0], 1)[0];
    CK(cudaSetDevice(1));
    CK(cudaStreamSynchronize(st[1]));
    float v1 = host_floats(buf[1], 1)[0];
    check(gr == ncclSuccess && qe == cudaErrorNotReady && v0 == 3.0f && v1 == 3.0f,
          "ncclCommInitRank in a group, one thread, two ranks: a query before the peer arrives is %s; results %g %g (want 3)", cudaGetErrorName(qe), v0, v1);
    for (int q = 0; q < 2; q++) {
        CK(cudaSetDevice(q));
        CK(cudaFree(buf[q]));
        ncclCommDestroy(c2[q]);
    }
    CK(cudaSetDevice(0));
}

// Run as `test_emu nccl-proc ID RANK MODE` by test_nccl_procs: rank RANK (on device RANK) of a communicator
// of 2 ranks in 2 processes, made by ncclCommInitRank from the unique id ID, as tp's processes under
// mpirun make theirs. MODE "collectives": every collective at a size that takes several steps through the
// shared memory, each result checked here; "mismatch": rank 1 gives another count (the emulator must
// report it); "die": rank 1 ends its process after the first collective (status 3, no ncclCommDestroy),
// and rank 0 must see ncclRemoteError from ncclCommGetAsyncError while its second one is pending.
static int nccl_proc(const char* idtext, int rank, const char* mode) {
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    snprintf(id.internal, sizeof(id.internal), "%s", idtext);
    CK(cudaSetDevice(rank));
    ncclComm_t comm;
    ncclResult_t r = ncclCommInitRank(&comm, 2, id, rank);
    if (r != ncclSuccess) {
        printf("rank %d: ncclCommInitRank: %s (%s)\n", rank, ncclGetErrorString(r), ncclGetLastError(nullptr));
        return 1;
    }
    const size_t n = 300000;  // 1.2 MB per rank: 2 steps of the 1 MB slots; the reduce-scatter's 2.4 MB, 3
    auto val = [](size_t i, int q) { return (float)((i * 7 + (size_t)q * 13) % 1000) * 0.25f; };  // sums are exact
    std::vector<float> in(2 * n);
    for (size_t i = 0; i < 2 * n; i++) in[i] = val(i, rank);
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    float* a = dev_floats(std::vector<float>(in.begin(), in.begin() + n));
    float* mx = dev_floats(std::vector<float>(in.begin(), in.begin() + n));
    float* e = dev_floats(std::vector<float>(in.begin(), in.begin() + n));
    float* big = dev_floats(in);
    float *g = nullptr, *rs = nullptr;
    CK(cudaMalloc(&g, 2 * n * sizeof(float)));
    CK(cudaMalloc(&rs, n * sizeof(float)));
    if (!strcmp(mode, "die")) {
        ncclAllReduce(a, a, n, ncclFloat, ncclSum, comm, s);
        CK(cudaStreamSynchronize(s));
        if (rank == 1) _exit(3);  // a crash: no destroy, no goodbye
        ncclAllReduce(a, a, n, ncclFloat, ncclSum, comm, s);
        double t0 = now_wall();
        ncclResult_t async = ncclSuccess;
        while (now_wall() - t0 < 20) {
            cudaError_t q = cudaStreamQuery(s);
            cudaGetLastError();
            ncclCommGetAsyncError(comm, &async);
            if (q == cudaSuccess || async != ncclSuccess) break;
            usleep(1000);
        }
        printf("rank 0: %s after %.2f s: %s\n", ncclGetErrorString(async), now_wall() - t0, ncclGetLastError(comm));
        return async == ncclRemoteError ? 0 : 1;  // without destroying: the collective never completes
    }
    size_t cnt = !strcmp(mode, "mismatch") && rank == 1 ? n - 1 : n;
    ncclAllReduce(a, a, cnt, ncclFloat, ncclSum, comm, s);  // in place
    ncclAllReduce(mx, mx, n, ncclFloat, ncclMax, comm, s);
    ncclAllGather(big + rank * n, g, n, ncclFloat, comm, s);
    ncclBroadcast(e, e, n, ncclFloat, 1, comm, s);
    ncclReduceScatter(big, rs, n, ncclFloat, ncclSum, comm, s);
    CK(cudaStreamSynchronize(s));
    std::vector<float> ha = host_floats(a, n), hm = host_floats(mx, n), hg = host_floats(g, 2 * n), he = host_floats(e, n), hr = host_floats(rs, n);
    int bad[5] = {0};
    for (size_t i = 0; i < n; i++) {
        bad[0] += ha[i] != val(i, 0) + val(i, 1);
        bad[1] += hm[i] != std::max(val(i, 0), val(i, 1));
        bad[2] += hg[i] != val(i, 0) || hg[n + i] != val(n + i, 1);
        bad[3] += he[i] != val(i, 1);
        bad[4] += hr[i] != val(rank * n + i, 0) + val(rank * n + i, 1);
    }
    printf("rank %d: all-reduce sum (in place)/max, all-gather, broadcast (root 1), reduce-scatter: %d/%d/%d/%d/%d wrong\n", rank, bad[0], bad[1],
           bad[2], bad[3], bad[4]);
    for (float* p : {a, mx, e, big, g, rs}) CK(cudaFree(p));
    CK(cudaStreamDestroy(s));
    ncclCommDestroy(comm);
    return bad[0] + bad[1] + bad[2] + bad[3] + bad[4] == 0 ? 0 : 1;
}

// the emulated NCCL across processes: two child processes meet through the segment named by the id, and
// nothing is left in /dev/shm afterwards
static void test_nccl_procs(const char* argv0) {
    for (const char* mode : {"collectives", "mismatch", "die"}) {
        ncclUniqueId id;
        ncclResult_t r = ncclGetUniqueId(&id);
        std::string out[2];
        int status[2] = {-1, -1};
        FILE* f[2];
        double t0 = now_wall();
        for (int q = 0; q < 2; q++) {
            std::string cmd = std::string("TP_EMU_HANG_S=60 ") + argv0 + " nccl-proc " + id.internal + " " + std::to_string(q) + " " + mode + " 2>&1";
            f[q] = popen(cmd.c_str(), "r");
        }
        for (int q = 0; q < 2; q++) {
            char buf[512];
            while (f[q] && fgets(buf, sizeof(buf), f[q])) out[q] += buf;
            int st = f[q] ? pclose(f[q]) : -1;
            status[q] = st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        }
        double took = now_wall() - t0;
        std::string seg = std::string("/dev/shm/") + id.internal;
        bool left = access(seg.c_str(), F_OK) == 0;
        if (left) unlink(seg.c_str());
        std::string o0 = out[0].substr(0, out[0].find('\n')), o1 = out[1].substr(0, out[1].find('\n'));
        if (!strcmp(mode, "collectives")) {
            check(r == ncclSuccess && status[0] == 0 && status[1] == 0 && !left,
                  "NCCL across 2 processes (ncclCommInitRank, shared memory, several steps per collective): exit %d %d, segment %s; %s; %s",
                  status[0], status[1], left ? "LEFT in /dev/shm" : "gone", o0.c_str(), o1.c_str());
        } else if (!strcmp(mode, "mismatch")) {
            bool named = out[0].find("NCCL collectives disagree") != std::string::npos || out[1].find("NCCL collectives disagree") != std::string::npos;
            check(named && (status[0] == 86 || status[1] == 86) && !left,
                  "NCCL across 2 processes, counts that differ: reported (exit %d %d, %s), segment %s", status[0], status[1],
                  named ? "NCCL collectives disagree" : "not named", left ? "LEFT in /dev/shm" : "gone");
        } else {
            check(status[0] == 0 && status[1] == 3 && out[0].find("exited or was killed") != std::string::npos && took < 20 && !left,
                  "NCCL across 2 processes, rank 1's process ends mid-run: exit %d %d in %.1f s; %s; segment %s", status[0], status[1], took,
                  o0.c_str(), left ? "LEFT in /dev/shm" : "gone");
        }
    }
}

int main(int argc, char** argv) {
    if (argc == 3 && !strcmp(argv[1], "plant")) {
        size_t i = (size_t)atoi(argv[2]);
        if (i >= g_plants.size()) return 2;
        g_plants[i].fn();
        printf("NOT REPORTED: the planted bug '%s' ran to the end\n", g_plants[i].name);
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "order")) return print_order();
    if (argc == 5 && !strcmp(argv[1], "nccl-proc")) return nccl_proc(argv[2], atoi(argv[3]), argv[4]);
    printf("tests of the emulated GPU (dev/emu)\n");
    test_plants(argv[0]);
    test_launch_limits();
    test_streams();
    test_device_semantics(argv[0]);
    test_wmma();
    test_cublas();
    test_nccl();
    test_nccl_procs(argv[0]);
    printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
}
