// cuda_runtime.h of tp's emulated GPU (dev/emu): the CUDA runtime API and the CUDA C++ device language,
// for code compiled as plain C++ by g++ and run on the CPU by dev/emu/runtime.cpp and exec.cpp.
//
// Why: CI has no GPU, so `make emu` builds the unchanged kernels.cuh, comm.cuh, gpt.cu and tp.cu against
// this header instead of the real one. Only what tp uses (plus the obvious neighbours) is declared: a call
// outside the emulated subset fails to compile instead of silently doing something else. Names, types,
// numeric enum values and semantics follow the real CUDA 12/13 headers and documentation.
//
// Kernel launches `k<<<grid, block, smem, stream>>>(args)` and `__shared__` declarations are not C++;
// dev/emu/rewrite.py turns them into emu_launch(...)(args) and emu_shared<T>(...) below before compiling.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#define TP_EMU_CUDA 1
#define CUDART_VERSION 12080

// ----------------------------------------------------------------------------
// runtime API types (values as in driver_types.h)

enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInvalidDeviceFunction = 98,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorPeerAccessAlreadyEnabled = 704,
    cudaErrorPeerAccessNotEnabled = 705,
    cudaErrorMisalignedAddress = 716,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotSupported = 801,
    cudaErrorUnknown = 999,
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;
struct CUevent_st;
typedef struct CUevent_st* cudaEvent_t;

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02

// the subset of the real struct's fields that the emulator fills in (reading another field is a compile error)
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;        // 48 KB: static shared memory, and dynamic without the opt-in attribute
    size_t sharedMemPerBlockOptin;   // 227 KB with cudaFuncAttributeMaxDynamicSharedMemorySize
    size_t sharedMemPerMultiprocessor;
    int regsPerBlock;
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int multiProcessorCount;
    int maxThreadsPerMultiProcessor;
    int major, minor;
    int l2CacheSize;
    int unifiedAddressing;
};

struct uint3 { unsigned int x, y, z; };
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};

// vector types with CUDA's alignment: a float4 access is one 16-byte access, which memcheck requires to be
// 16-byte aligned as the hardware does (this is what catches a float4 path taken for an unaligned pointer)
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) uint2 { unsigned int x, y; };
struct alignas(16) uint4 { unsigned int x, y, z, w; };
struct alignas(16) double2 { double x, y; };
static inline float2 make_float2(float x, float y) { float2 t; t.x = x; t.y = y; return t; }
static inline float4 make_float4(float x, float y, float z, float w) { float4 t; t.x = x; t.y = y; t.z = z; t.w = w; return t; }
static inline int2 make_int2(int x, int y) { int2 t; t.x = x; t.y = y; return t; }
static inline int4 make_int4(int x, int y, int z, int w) { int4 t; t.x = x; t.y = y; t.z = z; t.w = w; return t; }
static inline uint2 make_uint2(unsigned x, unsigned y) { uint2 t; t.x = x; t.y = y; return t; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { uint4 t; t.x = x; t.y = y; t.z = z; t.w = w; return t; }
static inline double2 make_double2(double x, double y) { double2 t; t.x = x; t.y = y; return t; }

// ----------------------------------------------------------------------------
// runtime API (dev/emu/runtime.cpp)

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceCanAccessPeer(int* canAccessPeer, int device, int peerDevice);
cudaError_t cudaDeviceGetPCIBusId(char* pciBusId, int len, int device);
cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags);
cudaError_t cudaDeviceDisablePeerAccess(int peerDevice);
cudaError_t cudaMemGetInfo(size_t* free, size_t* total);

cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char* cudaGetErrorString(cudaError_t error);
const char* cudaGetErrorName(cudaError_t error);

cudaError_t cudaMalloc(void** devPtr, size_t size);
cudaError_t cudaFree(void* devPtr);
cudaError_t cudaMallocHost(void** ptr, size_t size);
cudaError_t cudaFreeHost(void* ptr);
template <class T> static inline cudaError_t cudaMalloc(T** devPtr, size_t size) { return cudaMalloc((void**)devPtr, size); }
template <class T> static inline cudaError_t cudaMallocHost(T** ptr, size_t size) { return cudaMallocHost((void**)ptr, size); }
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream = 0);
cudaError_t cudaMemset(void* devPtr, int value, size_t count);
cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream = 0);

cudaError_t cudaStreamCreate(cudaStream_t* pStream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);

cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = 0);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags = 0);

cudaError_t emu_func_set_attribute(const void* func, cudaFuncAttribute attr, int value);
template <class T> static inline cudaError_t cudaFuncSetAttribute(T* func, cudaFuncAttribute attr, int value) {
    return emu_func_set_attribute((const void*)func, attr, value);
}

// ----------------------------------------------------------------------------
// the device language. Kernels are plain C++ functions; each GPU thread runs one as a fiber (exec.cpp).

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// __noinline__ is left alone: it is also GCC's own spelling of the attribute (libstdc++ writes
// __attribute__((__noinline__)) in <memory>), so a macro for it would break those headers
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
// __shared__ is rewritten by dev/emu/rewrite.py; __constant__ and __managed__ are outside the emulated subset
// and are left undefined so that using them fails to compile.

// the fiber-local built-in variables (valid only inside a kernel)
struct EmuThreadInfo {
    uint3 thread_idx, block_idx;
    dim3 block_dim, grid_dim;
};
EmuThreadInfo* emu_thread_info(void);
#define threadIdx (emu_thread_info()->thread_idx)
#define blockIdx (emu_thread_info()->block_idx)
#define blockDim (emu_thread_info()->block_dim)
#define gridDim (emu_thread_info()->grid_dim)
static constexpr int warpSize = 32;

// barriers: every call names its source line, so that threads waiting at different __syncthreads are
// reported as a divergent barrier
enum { EMU_BAR_SYNC, EMU_BAR_COUNT, EMU_BAR_AND, EMU_BAR_OR };
int emu_syncthreads(int kind, int pred, const char* file, int line);
static inline void __syncthreads(const char* f = __builtin_FILE(), int l = __builtin_LINE()) { emu_syncthreads(EMU_BAR_SYNC, 0, f, l); }
static inline int __syncthreads_count(int p, const char* f = __builtin_FILE(), int l = __builtin_LINE()) { return emu_syncthreads(EMU_BAR_COUNT, p, f, l); }
static inline int __syncthreads_and(int p, const char* f = __builtin_FILE(), int l = __builtin_LINE()) { return emu_syncthreads(EMU_BAR_AND, p, f, l); }
static inline int __syncthreads_or(int p, const char* f = __builtin_FILE(), int l = __builtin_LINE()) { return emu_syncthreads(EMU_BAR_OR, p, f, l); }
void __threadfence(void);
void __threadfence_block(void);
[[noreturn]] void emu_trap(const char* file, int line);
[[noreturn]] void emu_device_error(const char* kind, const char* what);  // a report of device code's misuse (mma.h)
#define __trap() emu_trap(__FILE__, __LINE__)

// warp-level intrinsics: the lanes named in the mask meet (exec.cpp checks the masks), then each gets its
// result. Values travel as 64-bit patterns.
enum { EMU_SHFL_IDX, EMU_SHFL_UP, EMU_SHFL_DOWN, EMU_SHFL_XOR, EMU_BALLOT, EMU_ANY, EMU_ALL, EMU_SYNCWARP,
       EMU_REDUCE_ADD, EMU_REDUCE_MIN, EMU_REDUCE_MAX, EMU_REDUCE_AND, EMU_REDUCE_OR, EMU_REDUCE_XOR, EMU_GATHER };
uint64_t emu_warp_op(int op, unsigned mask, uint64_t value, int arg, int width, const char* file, int line);
// the whole warp meets (every lane, none exited) and each lane gets all 32 lanes' `bytes` bytes at `mine`,
// lane l's at all + l * bytes: how mma.h's fragments see each other (a warp-wide operation of the tensor cores)
void emu_warp_gather(const void* mine, void* all, int bytes, const char* what, const char* file, int line);
uint64_t emu_launch_seed(void);  // the launch's schedule seed (mma.h draws its fragments' layout from it)
template <class T> static inline uint64_t emu_bits(T v) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffles move values of at most 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    return b;
}
template <class T> static inline T emu_from_bits(uint64_t b) {
    T v;
    memcpy(&v, &b, sizeof(T));
    return v;
}
template <class T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32, const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    return emu_from_bits<T>(emu_warp_op(EMU_SHFL_IDX, mask, emu_bits(v), src, width, f, l));
}
template <class T> static inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32, const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    return emu_from_bits<T>(emu_warp_op(EMU_SHFL_UP, mask, emu_bits(v), (int)d, width, f, l));
}
template <class T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32, const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    return emu_from_bits<T>(emu_warp_op(EMU_SHFL_DOWN, mask, emu_bits(v), (int)d, width, f, l));
}
template <class T> static inline T __shfl_xor_sync(unsigned mask, T v, int lm, int width = 32, const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    return emu_from_bits<T>(emu_warp_op(EMU_SHFL_XOR, mask, emu_bits(v), lm, width, f, l));
}
static inline unsigned __ballot_sync(unsigned mask, int p, const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    return (unsigned)emu_warp_op(EMU_BALLOT, mask, p != 0, 0, 32, f, l);
}
static inline int __any_sync(unsigned mask, int p, const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    return (int)emu_warp_op(EMU_ANY, mask, p != 0, 0, 32, f, l);
}
static inline int __all_sync(unsigned mask, int p, const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    return (int)emu_warp_op(EMU_ALL, mask, p != 0, 0, 32, f, l);
}
static inline void __syncwarp(unsigned mask = 0xffffffffu, const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    emu_warp_op(EMU_SYNCWARP, mask, 0, 0, 32, f, l);
}
static inline unsigned __reduce_add_sync(unsigned mask, unsigned v, const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    return (unsigned)emu_warp_op(EMU_REDUCE_ADD, mask, v, 0, 32, f, l);
}
static inline int __reduce_add_sync(unsigned mask, int v, const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    return (int)emu_warp_op(EMU_REDUCE_ADD, mask, (uint32_t)v, 0, 32, f, l);
}
static inline unsigned __reduce_min_sync(unsigned mask, unsigned v, const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    return (unsigned)emu_warp_op(EMU_REDUCE_MIN, mask, v, 0, 32, f, l);
}
static inline int __reduce_min_sync(unsigned mask, int v, const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    return (int)emu_warp_op(EMU_REDUCE_MIN, mask, (uint32_t)v, 1, 32, f, l);  // arg 1: signed
}
static inline unsigned __reduce_max_sync(unsigned mask, unsigned v, const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    return (unsigned)emu_warp_op(EMU_REDUCE_MAX, mask, v, 0, 32, f, l);
}
static inline int __reduce_max_sync(unsigned mask, int v, const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    return (int)emu_warp_op(EMU_REDUCE_MAX, mask, (uint32_t)v, 1, 32, f, l);
}
static inline unsigned __reduce_and_sync(unsigned mask, unsigned v, const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    return (unsigned)emu_warp_op(EMU_REDUCE_AND, mask, v, 0, 32, f, l);
}
static inline unsigned __reduce_or_sync(unsigned mask, unsigned v, const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    return (unsigned)emu_warp_op(EMU_REDUCE_OR, mask, v, 0, 32, f, l);
}
static inline unsigned __reduce_xor_sync(unsigned mask, unsigned v, const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    return (unsigned)emu_warp_op(EMU_REDUCE_XOR, mask, v, 0, 32, f, l);
}

// integer and float intrinsics
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
static inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
static inline int __float_as_int(float x) { int i; memcpy(&i, &x, 4); return i; }
static inline float __uint_as_float(unsigned x) { float f; memcpy(&f, &x, 4); return f; }
static inline unsigned __float_as_uint(float x) { unsigned i; memcpy(&i, &x, 4); return i; }
static inline double __longlong_as_double(long long x) { double d; memcpy(&d, &x, 8); return d; }
static inline long long __double_as_longlong(double x) { long long i; memcpy(&i, &x, 8); return i; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
// (glibc's math.h declares these names itself, so they are macros here)
#define __expf(x) expf(x)
#define __logf(x) logf(x)
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __powf(a, b) powf(a, b)
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __saturatef(float x) { return x != x ? 0.0f : (x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x)); }
template <class T> static inline T __ldg(const T* p) { return *p; }

// CUDA's global min/max overloads for device code (host C++ has only std::min/std::max)
#define EMU_MINMAX(T)                                        \
    static inline T min(T a, T b) { return a < b ? a : b; } \
    static inline T max(T a, T b) { return a > b ? a : b; }
EMU_MINMAX(int)
EMU_MINMAX(unsigned int)
EMU_MINMAX(long)
EMU_MINMAX(unsigned long)
EMU_MINMAX(long long)
EMU_MINMAX(unsigned long long)
#undef EMU_MINMAX
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }
static inline unsigned int min(int a, unsigned int b) { return min((unsigned)a, b); }
static inline unsigned int min(unsigned int a, int b) { return min(a, (unsigned)b); }
static inline unsigned int max(int a, unsigned int b) { return max((unsigned)a, b); }
static inline unsigned int max(unsigned int a, int b) { return max(a, (unsigned)b); }

// atomics: __atomic builtins, which the instrumented build turns into calls to the emulator's
// __tsan_atomic* hooks (runtime.cpp), so that every atomic is bounds- and alignment-checked too
#define EMU_ATOMIC_INT(T)                                                                                  \
    static inline T atomicAdd(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }           \
    static inline T atomicSub(T* p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST); }           \
    static inline T atomicExch(T* p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }         \
    static inline T atomicAnd(T* p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); }           \
    static inline T atomicOr(T* p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }             \
    static inline T atomicXor(T* p, T v) { return __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST); }           \
    static inline T atomicCAS(T* p, T cmp, T v) {                                                          \
        __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                \
        return cmp;                                                                                        \
    }                                                                                                      \
    static inline T atomicMax(T* p, T v) {                                                                 \
        T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);                                                      \
        while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {} \
        return old;                                                                                        \
    }                                                                                                      \
    static inline T atomicMin(T* p, T v) {                                                                 \
        T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);                                                      \
        while (old > v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {} \
        return old;                                                                                        \
    }
EMU_ATOMIC_INT(int)
EMU_ATOMIC_INT(unsigned int)
EMU_ATOMIC_INT(unsigned long long)
#undef EMU_ATOMIC_INT
static inline long long atomicMax(long long* p, long long v) {
    long long old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    return old;
}
static inline long long atomicMin(long long* p, long long v) {
    long long old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (old > v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    return old;
}
static inline unsigned atomicInc(unsigned* p, unsigned lim) {
    unsigned old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (!__atomic_compare_exchange_n(p, &old, old >= lim ? 0u : old + 1, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    return old;
}
static inline unsigned atomicDec(unsigned* p, unsigned lim) {
    unsigned old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (!__atomic_compare_exchange_n(p, &old, (old == 0 || old > lim) ? lim : old - 1, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    return old;
}
// float and double through a compare-and-swap on the bits, as CUDA code does for types without hardware atomics
template <class F, class I> static inline F emu_atomic_float(F* p, F v, int op) {
    I* q = (I*)p;
    I old = __atomic_load_n(q, __ATOMIC_SEQ_CST), nw;
    F o;
    do {
        memcpy(&o, &old, sizeof(F));
        F n = op == 0 ? o + v : (op == 1 ? v : (o > v || o != o ? o : v));
        memcpy(&nw, &n, sizeof(F));
    } while (!__atomic_compare_exchange_n(q, &old, nw, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    return o;
}
static inline float atomicAdd(float* p, float v) { return emu_atomic_float<float, uint32_t>(p, v, 0); }
static inline double atomicAdd(double* p, double v) { return emu_atomic_float<double, uint64_t>(p, v, 0); }
static inline float atomicExch(float* p, float v) { return emu_atomic_float<float, uint32_t>(p, v, 1); }

// shared memory. `__shared__ T name[dims];` becomes
//   auto& name = *emu_shared<T[dims]>(<a key unique to the declaration>, "name");
// so every thread of a block gets the same storage in the block's shared arena (static total <= 48 KB);
// `extern __shared__ T name[];` becomes `T* name = (T*)emu_shared_dynamic();`.
void* emu_shared_static(const void* key, size_t bytes, size_t align, const char* name);
void* emu_shared_dynamic(void);
template <class T> static inline T* emu_shared(const void* key, const char* name, size_t align = 16) {
    return (T*)emu_shared_static(key, sizeof(T), alignof(T) > align ? alignof(T) : align, name);
}

// kernel launches. `kern<<<g, b, smem, stream>>>(args)` becomes emu_launch("kern", kern, g, b, smem, stream)(args):
// the configuration is checked at once (errors as cudaGetLastError reports them), the arguments are
// converted to the kernel's parameter types and copied, and the launch is queued on the stream.
struct EmuLaunchConfig {
    const char* name;
    const void* fn;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    const char* file;
    int line;
};
void emu_launch_enqueue(const EmuLaunchConfig* cfg, void (*invoke)(const void* fn, void* args), const void* args,
                        size_t bytes, size_t align);
template <class... P> struct EmuLaunch {
    EmuLaunchConfig cfg;
    typedef std::tuple<typename std::decay<P>::type...> Args;
    static void invoke(const void* fn, void* args) { std::apply((void (*)(P...))fn, *(Args*)args); }
    template <class... A> void operator()(A&&... a) const {
        static_assert(sizeof...(A) == sizeof...(P), "kernel launched with the wrong number of arguments");
        Args args(std::forward<A>(a)...);
        emu_launch_enqueue(&cfg, &EmuLaunch::invoke, &args, sizeof(Args), alignof(Args));
    }
};
template <class... P>
static inline EmuLaunch<P...> emu_launch(const char* name, void (*fn)(P...), dim3 grid, dim3 block, size_t smem = 0,
                                         cudaStream_t stream = 0, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    EmuLaunch<P...> l;
    l.cfg.name = name;
    l.cfg.fn = (const void*)fn;
    l.cfg.grid = grid;
    l.cfg.block = block;
    l.cfg.smem = smem;
    l.cfg.stream = stream;
    l.cfg.file = file;
    l.cfg.line = line;
    return l;
}

// switches for tests of the emulator itself (dev/emu/test_emu.cu)
void emu_set_lt_refuse(int on);         // cuBLASLt's heuristic finds no algorithm, so callers take their fallback
void emu_set_seed(unsigned long long s);  // the schedule seed (TP_EMU_SEED) for launches from now on
