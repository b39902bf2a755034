// kernels.cuh: the CUDA backend. Every op of kernels_cpu.h again, for one rank's GPU.
//
// Each op `foo_cuda(CudaCtx* cx, ...)` has literally the argument list of `foo_cpu(...)` after the
// context (gpt.cu's OP() calls both with the same arguments, so the compiler holds us to it) and the same
// semantics: the same buffer layouts, the same written-versus-accumulated (+=) outputs, the same
// zeros (upper triangle of att, padded vocab columns). All pointers are device pointers. An op only
// enqueues work on the rank's stream: no host loop over elements and no host round trip.
//
// Matmuls go to cuBLAS / cuBLASLt with TF32 tensor cores (fp32 storage, 10-bit-mantissa products, fp32
// sums), as llm.c's fp32 trainer does; everything else is a hand-written kernel. Reductions that
// produce parameter gradients or the gradient norm are deterministic: fixed partitions summed in a fixed
// order, no float atomics. Replicated parameters then get bit-identical gradients on every rank, and two
// runs give bit-identical results.
//
// Shapes use kernels_cpu.h's letters: B batch, T time, C channels, N = B*T rows, NH heads, hs head size.
// Row indices and element offsets are long wherever N*C can pass 2^31.
#pragma once
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <mma.h>  // the warp matrix functions (wmma): fused attention's products on the tensor cores

#include "common/bf16.h"   // bf16 numbers, the same functions on the host and here
#include "common/error.h"  // CUDA_CHECK, CUDA_LAUNCH_CHECK, CUBLAS_CHECK: one line naming the rank and the call
#include "kernels_cpu.h"    // the reference ops; this file shares their shape helper real_columns and GELU_SCALE

// ----------------------------------------------------------------------------
// the context of one rank: its device, stream, library handles and scratch

#define CUDA_RETIRED 16  // outgrown scratch buffers a context keeps until cuda_ctx_free (cuda_scratch)

struct CudaCtx {
    int rank;  // for error messages
    int gpu;   // CUDA device ordinal
    cudaStream_t stream;        // every op of this rank runs here, in program order
    cublasHandle_t cublas;      // bound to stream, TF32 math
    cublasLtHandle_t cublaslt;  // for the matmul with the bias fused into its epilogue
    void* workspace;            // cuBLAS / cuBLASLt workspace (shared: both run on the one stream)
    size_t workspace_bytes;
    bool tf32;                  // matmuls on TF32 tensor cores (the default); false: full fp32, for tests
                                // that compare backends or TP degrees tightly (cuda_set_tf32)
    size_t tc_smem;             // the shared memory a block may have on this sm_80+ GPU (fused attention on the
                                // tensor cores, att_tc); 0 below sm_80
    // scratch, grown on demand, only ever used on `stream` (so reusing it across ops is safe)
    float* attn;        // attention: q, k, v permuted to (B, NH, T, hs), y or their gradients, datt
    size_t attn_bytes;
    void* red;          // partial sums of the deterministic reductions
    size_t red_bytes;
    void* packed;       // a bf16 run's matmul operands in bf16 (pack_operands_bf16)
    size_t packed_bytes;
    void* retired[CUDA_RETIRED];  // scratch outgrown, freed by cuda_ctx_free (cuda_scratch says why)
    int nretired;
};

// Returns *p grown to at least `bytes`. The old buffer may still be read by queued kernels, and cudaFree
// waits for the whole device: with a pipeline that includes the sends to a neighbouring stage, which end
// only when the neighbour receives, so a stalled neighbour would hang this rank instead of being reported,
// and two neighbours freeing at once would wait for each other. So the old buffer is kept until
// cuda_ctx_free (it happens only while the sizes grow, in the first step, a few times per buffer); past
// CUDA_RETIRED of them the stream is drained and the buffer freed.
static void* cuda_scratch(CudaCtx* cx, void** p, size_t* have, size_t bytes) {
    if (bytes <= *have) return *p;
    if (*p && cx->nretired < CUDA_RETIRED) {
        cx->retired[cx->nretired++] = *p;
    } else if (*p) {
        CUDA_CHECK(cx->rank, cudaStreamSynchronize(cx->stream));
        CUDA_CHECK(cx->rank, cudaFree(*p));
    }
    *p = nullptr;
    *have = 0;
    bytes = (bytes + 255) / 256 * 256;
    cudaError_t e = cudaMalloc(p, bytes);
    if (e != cudaSuccess)
        fatal("rank %d: cudaMalloc of %.1f MiB of scratch failed: %s (use a smaller -b or -t, or more --tp ranks)",
              cx->rank, bytes / 1048576.0, cudaGetErrorString(e));
    *have = bytes;
    return *p;
}

// Selects the GPU for the calling (rank) thread and creates the rank's stream and handles.
static void cuda_ctx_init(CudaCtx* cx, int rank, int gpu) {
    memset(cx, 0, sizeof(*cx));
    cx->rank = rank;
    cx->gpu = gpu;
    CUDA_CHECK(rank, cudaSetDevice(gpu));
    // non-blocking: the rank's stream never waits on the legacy default stream (ranks sharing a GPU
    // must not serialise through it)
    CUDA_CHECK(rank, cudaStreamCreateWithFlags(&cx->stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(rank, cublasCreate(&cx->cublas));
    CUBLAS_CHECK(rank, cublasSetStream(cx->cublas, cx->stream));  // before the workspace: setting a stream resets it
    CUBLAS_CHECK(rank, cublasSetMathMode(cx->cublas, CUBLAS_TF32_TENSOR_OP_MATH));
    cx->tf32 = true;
    cudaDeviceProp prop;
    CUDA_CHECK(rank, cudaGetDeviceProperties(&prop, gpu));
    cx->tc_smem = prop.major >= 8 ? prop.sharedMemPerBlockOptin : 0;
    CUBLAS_CHECK(rank, cublasLtCreate(&cx->cublaslt));
    cx->workspace_bytes = 32u << 20;  // what cuBLAS recommends for Hopper
    CUDA_CHECK(rank, cudaMalloc(&cx->workspace, cx->workspace_bytes));
    CUBLAS_CHECK(rank, cublasSetWorkspace(cx->cublas, cx->workspace, cx->workspace_bytes));
}

// TF32 tensor cores on (fast, 10-bit-mantissa products) or off (full fp32 products, several times slower)
static void cuda_set_tf32(CudaCtx* cx, bool on) {
    cx->tf32 = on;
    CUBLAS_CHECK(cx->rank, cublasSetMathMode(cx->cublas, on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
}
static cublasComputeType_t cuda_compute_type(const CudaCtx* cx) {
    return cx->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

static void cuda_ctx_free(CudaCtx* cx) {
    CUDA_CHECK(cx->rank, cudaSetDevice(cx->gpu));
    CUDA_CHECK(cx->rank, cudaStreamSynchronize(cx->stream));
    if (cx->attn) CUDA_CHECK(cx->rank, cudaFree(cx->attn));
    if (cx->red) CUDA_CHECK(cx->rank, cudaFree(cx->red));
    if (cx->packed) CUDA_CHECK(cx->rank, cudaFree(cx->packed));
    for (int i = 0; i < cx->nretired; i++) CUDA_CHECK(cx->rank, cudaFree(cx->retired[i]));
    CUBLAS_CHECK(cx->rank, cublasLtDestroy(cx->cublaslt));
    CUBLAS_CHECK(cx->rank, cublasDestroy(cx->cublas));
    CUDA_CHECK(cx->rank, cudaFree(cx->workspace));
    CUDA_CHECK(cx->rank, cudaStreamDestroy(cx->stream));
    memset(cx, 0, sizeof(*cx));
}

// ----------------------------------------------------------------------------
// device memory of the rank

// n floats (or ints) on the device, zeroed; the size rounds up to 256 bytes, so float4 access is safe
static float* cuda_alloc(CudaCtx* cx, long n) {
    size_t bytes = ((size_t)(n > 0 ? n : 1) * sizeof(float) + 255) / 256 * 256;
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess)
        fatal("rank %d: cudaMalloc of %.1f MiB failed: %s (use a smaller -b or -t, or more --tp ranks)", cx->rank,
              bytes / 1048576.0, cudaGetErrorString(e));
    CUDA_CHECK(cx->rank, cudaMemsetAsync(p, 0, bytes, cx->stream));
    CUDA_CHECK(cx->rank, cudaStreamSynchronize(cx->stream));
    return (float*)p;
}

static void cuda_free(CudaCtx* cx, void* p) {
    if (!p) return;
    CUDA_CHECK(cx->rank, cudaStreamSynchronize(cx->stream));  // queued work may still use it
    CUDA_CHECK(cx->rank, cudaFree(p));
}

static void cuda_zero(CudaCtx* cx, float* p, long n) {
    if (n > 0) CUDA_CHECK(cx->rank, cudaMemsetAsync(p, 0, (size_t)n * sizeof(float), cx->stream));
}

// n floats device -> device, ordered on the stream
static void cuda_copy(CudaCtx* cx, float* dst, const float* src, long n) {
    if (n > 0) CUDA_CHECK(cx->rank, cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, cx->stream));
}

// host -> device, ordered on the stream. From pageable memory the call returns once the source has been
// staged, so the caller may reuse it at once.
static void cuda_upload(CudaCtx* cx, void* dst, const void* src, size_t bytes) {
    if (bytes) CUDA_CHECK(cx->rank, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cx->stream));
}

// device -> host after everything queued before it; returns with the data in place
static void cuda_download(CudaCtx* cx, void* dst, const void* src, size_t bytes) {
    if (bytes) CUDA_CHECK(cx->rank, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cx->stream));
    CUDA_CHECK(cx->rank, cudaStreamSynchronize(cx->stream));
}

// ----------------------------------------------------------------------------
// device helpers

// VEC consecutive floats, loaded or stored as float4s when VEC is 4 or 8 (the caller guarantees 16-byte
// alignment), else one by one. (VEC is a vector width; V is the vocab size everywhere in tp.)
template <int VEC> struct Fv { float v[VEC]; };
template <int VEC> __device__ __forceinline__ Fv<VEC> ldv(const float* p) {
    Fv<VEC> r;
    if constexpr (VEC == 4 || VEC == 8) {
        #pragma unroll
        for (int k = 0; k < VEC; k += 4) {
            float4 t = *reinterpret_cast<const float4*>(p + k);
            r.v[k] = t.x; r.v[k + 1] = t.y; r.v[k + 2] = t.z; r.v[k + 3] = t.w;
        }
    } else {
        #pragma unroll
        for (int k = 0; k < VEC; k++) r.v[k] = p[k];
    }
    return r;
}
// VEC bf16 widened: 8 from one 16-byte load (element 2i in the low half of word i), else one by one
template <int VEC> __device__ __forceinline__ Fv<VEC> ldv(const bf16* p) {
    Fv<VEC> r;
    if constexpr (VEC == 8) {
        uint4 t = *reinterpret_cast<const uint4*>(p);
        uint32_t w[4] = {t.x, t.y, t.z, t.w};
        #pragma unroll
        for (int k = 0; k < 4; k++) {
            r.v[2 * k] = bf16_to_float((bf16)(w[k] & 0xffff));
            r.v[2 * k + 1] = bf16_to_float((bf16)(w[k] >> 16));
        }
    } else if constexpr (VEC == 4) {
        uint2 t = *reinterpret_cast<const uint2*>(p);
        r.v[0] = bf16_to_float((bf16)(t.x & 0xffff));
        r.v[1] = bf16_to_float((bf16)(t.x >> 16));
        r.v[2] = bf16_to_float((bf16)(t.y & 0xffff));
        r.v[3] = bf16_to_float((bf16)(t.y >> 16));
    } else {
        #pragma unroll
        for (int k = 0; k < VEC; k++) r.v[k] = bf16_to_float(p[k]);
    }
    return r;
}
template <int VEC> __device__ __forceinline__ void stv(float* p, const Fv<VEC>& r) {
    if constexpr (VEC == 4 || VEC == 8) {
        #pragma unroll
        for (int k = 0; k < VEC; k += 4) *reinterpret_cast<float4*>(p + k) = make_float4(r.v[k], r.v[k + 1], r.v[k + 2], r.v[k + 3]);
    } else {
        #pragma unroll
        for (int k = 0; k < VEC; k++) p[k] = r.v[k];
    }
}

// VEC floats stored as bf16, each rounded to nearest (bf16_round): 8 as one 16-byte store, 4 as one 8-byte
// store, else one by one
template <int VEC> __device__ __forceinline__ void stv(bf16* p, const Fv<VEC>& r) {
    if constexpr (VEC == 4) {
        uint2 t;
        t.x = (uint32_t)bf16_round(r.v[0]) | (uint32_t)bf16_round(r.v[1]) << 16;
        t.y = (uint32_t)bf16_round(r.v[2]) | (uint32_t)bf16_round(r.v[3]) << 16;
        *reinterpret_cast<uint2*>(p) = t;
    } else if constexpr (VEC == 8) {
        uint4 t;
        t.x = (uint32_t)bf16_round(r.v[0]) | (uint32_t)bf16_round(r.v[1]) << 16;
        t.y = (uint32_t)bf16_round(r.v[2]) | (uint32_t)bf16_round(r.v[3]) << 16;
        t.z = (uint32_t)bf16_round(r.v[4]) | (uint32_t)bf16_round(r.v[5]) << 16;
        t.w = (uint32_t)bf16_round(r.v[6]) | (uint32_t)bf16_round(r.v[7]) << 16;
        *reinterpret_cast<uint4*>(p) = t;
    } else {
        #pragma unroll
        for (int k = 0; k < VEC; k++) p[k] = bf16_round(r.v[k]);
    }
}

// Butterfly (xor) reductions: every lane ends with the same value, bit for bit (each step adds the same
// two numbers on both lanes of a pair), so lanes never disagree about a row's mean or max.
__device__ __forceinline__ float warp_sum(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum (or max) over the whole block, returned to every thread; blockDim.x a multiple of 32, <= 1024.
// A fixed tree: deterministic. Ends with a barrier so the shared slots can be reused by the next call.
template <bool IS_MAX> __device__ float block_reduce(float v) {
    __shared__ float sh[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    v = IS_MAX ? warp_max(v) : warp_sum(v);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float x = lane < nw ? sh[lane] : (IS_MAX ? -FLT_MAX : 0.0f);
        x = IS_MAX ? warp_max(x) : warp_sum(x);
        if (lane == 0) sh[0] = x;
    }
    __syncthreads();
    v = sh[0];
    __syncthreads();
    return v;
}
__device__ double block_sum_d(double v) {
    __shared__ double sh[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    v = warp_sum_d(v);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        double x = lane < nw ? sh[lane] : 0.0;
        x = warp_sum_d(x);
        if (lane == 0) sh[0] = x;
    }
    __syncthreads();
    v = sh[0];
    __syncthreads();
    return v;
}

static bool aligned16(const void* p) { return ((uintptr_t)p & 15) == 0; }
// whether 4 elements from p are one load: 16 bytes of fp32, 8 of bf16
template <typename T> static bool aligned4(const T* p) { return (uintptr_t)p % (4 * sizeof(T)) == 0; }
static unsigned ceil_div(long a, long b) { return (unsigned)((a + b - 1) / b); }

// Row kernels use one warp per row, 8 rows per block of 256 threads.
#define ROW_THREADS 256
#define ROWS_PER_BLOCK (ROW_THREADS / 32)
// Flat elementwise kernels: 256 threads, each VEC elements.
#define FLAT_THREADS 256

// ----------------------------------------------------------------------------
// GEMM (row-major; TF32 tensor cores unless cx->tf32 is off)

// C (M x N) = alpha * op(A) (M x K) . op(B) (K x N) + beta * C, for `batch` matrices at strides sA, sB, sC.
// Row-major throughout: A is stored (M x K) with leading dimension lda, or (K x M) when ta; B is (K x N)
// with ldb, or (N x K) when tb; C is (M x N) with ldc. cuBLAS is column-major, and a row-major X is the
// column-major X^T, so we ask cuBLAS for C^T = op(B)^T . op(A)^T: operands swapped, flags kept.
static void gemm_cuda(CudaCtx* cx, bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                      long sA, const float* B, int ldb, long sB, float beta, float* C, int ldc, long sC, int batch) {
    if (M <= 0 || N <= 0 || batch <= 0) return;
    cublasOperation_t opA = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opB = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (batch == 1)
        CUBLAS_CHECK(cx->rank, cublasGemmEx(cx->cublas, opB, opA, N, M, K, &alpha, B, CUDA_R_32F, ldb, A, CUDA_R_32F, lda,
                                            &beta, C, CUDA_R_32F, ldc, cuda_compute_type(cx), CUBLAS_GEMM_DEFAULT));
    else
        CUBLAS_CHECK(cx->rank, cublasGemmStridedBatchedEx(cx->cublas, opB, opA, N, M, K, &alpha, B, CUDA_R_32F, ldb, sB, A,
                                                          CUDA_R_32F, lda, sA, &beta, C, CUDA_R_32F, ldc, sC, batch,
                                                          cuda_compute_type(cx), CUBLAS_GEMM_DEFAULT));
}

// C (M x N) = alpha * op(A) . op(B) + beta * C, row-major as gemm_cuda, with A and B in bf16 and C in fp32:
// cuBLAS multiplies the bf16 pairs exactly and accumulates in fp32 (CUBLAS_COMPUTE_32F), the numerics of
// gemm_bf16_cpu (common/bf16.h) in another order of the sums.
static void gemm_bf16_cuda(CudaCtx* cx, bool ta, bool tb, int M, int N, int K, float alpha, const bf16* A, int lda,
                           const bf16* B, int ldb, float beta, void* C, int ldc, cudaDataType_t ctype = CUDA_R_32F) {
    if (M <= 0 || N <= 0) return;
    cublasOperation_t opA = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opB = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cx->rank, cublasGemmEx(cx->cublas, opB, opA, N, M, K, &alpha, B, CUDA_R_16BF, ldb, A, CUDA_R_16BF, lda, &beta,
                                        C, ctype, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// the largest power of two (<= 256) dividing the address: cuBLASLt assumes 256-byte aligned operands
// unless told otherwise, and would pick kernels that fault on a sub-tensor at an odd offset
static uint32_t ptr_alignment(const void* p) {
    uint32_t a = 256;
    while (a > 2 && ((uintptr_t)p % a) != 0) a >>= 1;
    return a;
}

// out (N, OC) = inp (N, IC) . weight (OC, IC)^T + bias (OC) as one cuBLASLt call with the bias added in
// the epilogue (saves a pass over out: writing the bias into it first and the GEMM reading it back with
// beta 1, 8 bytes of traffic per output). Returns false, having done nothing, if cuBLASLt has no algorithm
// for these shapes and alignments; the caller then falls back to a plain GEMM. ab: the type of inp and
// weight, CUDA_R_32F (TF32 or fp32 as cuBLAS's other calls) or CUDA_R_16BF (a bf16 run's packed or kept
// operands, fp32 compute: bf16 products are exact in fp32); out and bias are fp32 either way.
static bool matmul_forward_lt(CudaCtx* cx, float* out, const void* inp, const void* weight, const float* bias,
                              int N, int IC, int OC, cudaDataType_t ab = CUDA_R_32F) {
    int rk = cx->rank;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t lw, li, lo;
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(rk, cublasLtMatmulDescCreate(&desc, ab == CUDA_R_16BF ? CUBLAS_COMPUTE_32F : cuda_compute_type(cx), CUDA_R_32F));
    cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    CUBLAS_CHECK(rk, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof(opT)));
    CUBLAS_CHECK(rk, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof(opN)));
    CUBLAS_CHECK(rk, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    CUBLAS_CHECK(rk, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    // column-major views: weight is (IC x OC), used transposed; inp is (IC x N); out is (OC x N), and the
    // epilogue adds bias[o] down each column's OC rows, i.e. to every row of the row-major out
    CUBLAS_CHECK(rk, cublasLtMatrixLayoutCreate(&lw, ab, IC, OC, IC));
    CUBLAS_CHECK(rk, cublasLtMatrixLayoutCreate(&li, ab, IC, N, IC));
    CUBLAS_CHECK(rk, cublasLtMatrixLayoutCreate(&lo, CUDA_R_32F, OC, N, OC));
    CUBLAS_CHECK(rk, cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = cx->workspace_bytes;
    uint32_t aw = ptr_alignment(weight), ai = ptr_alignment(inp), ao = ptr_alignment(out);
    CUBLAS_CHECK(rk, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    CUBLAS_CHECK(rk, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aw, sizeof(aw)));
    CUBLAS_CHECK(rk, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ai, sizeof(ai)));
    CUBLAS_CHECK(rk, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ao, sizeof(ao)));
    CUBLAS_CHECK(rk, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ao, sizeof(ao)));
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cx->cublaslt, desc, lw, li, lo, lo, pref, 1, &heur, &found);
    bool ok = st == CUBLAS_STATUS_SUCCESS && found > 0;
    if (ok) {
        float alpha = 1.0f, beta = 0.0f;
        CUBLAS_CHECK(rk, cublasLtMatmul(cx->cublaslt, desc, &alpha, weight, lw, inp, li, &beta, out, lo, out, lo, &heur.algo,
                                        cx->workspace, cx->workspace_bytes, cx->stream));
    }
    CUBLAS_CHECK(rk, cublasLtMatmulPreferenceDestroy(pref));
    CUBLAS_CHECK(rk, cublasLtMatrixLayoutDestroy(lo));
    CUBLAS_CHECK(rk, cublasLtMatrixLayoutDestroy(li));
    CUBLAS_CHECK(rk, cublasLtMatrixLayoutDestroy(lw));
    CUBLAS_CHECK(rk, cublasLtMatmulDescDestroy(desc));
    return ok;
}

// out (N, OC) = bias broadcast over the rows: the fallback's first half (the GEMM then adds with beta 1)
__global__ void bias_broadcast_kernel(float* out, const float* bias, long N, int OC) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N * OC) out[i] = bias[i % OC];
}

// ----------------------------------------------------------------------------
// deterministic column sums: dst (n) += sum over rows of a (rows, n), in two passes.
// Pass 1: block (32, 8) sums COLSUM_ROWS rows of 32 columns; a thread strides the rows by 8 in order,
// then the 8 row-strands are added in order: partial (nsplit, n). Pass 2 adds the partials in split
// order. The partition depends only on the shapes, so the result is the same on every rank and run.

#define COLSUM_ROWS 128

// partial (nsplit, OC): split s sums dout rows [s*COLSUM_ROWS, (s+1)*COLSUM_ROWS); grid (nsplit, ceil(OC/32))
// (D: dout fp32, or bf16 storage, the LM head's dlogits in a bf16 run)
template <typename D>
__global__ void bias_grad_partial_kernel(float* partial, const D* dout, int N, int OC) {
    __shared__ float sh[8][33];
    int o = blockIdx.y * 32 + threadIdx.x;
    int n0 = blockIdx.x * COLSUM_ROWS, n1 = min(n0 + COLSUM_ROWS, N);
    float acc = 0.0f;
    if (o < OC)
        for (int n = n0 + threadIdx.y; n < n1; n += 8) acc += ldv<1>(dout + (long)n * OC + o).v[0];
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && o < OC) {
        float s = 0.0f;
        for (int y = 0; y < 8; y++) s += sh[y][threadIdx.x];
        partial[(long)blockIdx.x * OC + o] = s;
    }
}

// partial_w, partial_b (nsplit, C): split sums of dout * xhat and of dout, xhat = (inp - mean) * rstd
// (TI: inp fp32, or bf16 storage widened exactly)
template <typename TI>
__global__ void layernorm_param_grad_partial_kernel(float* partial_w, float* partial_b, const float* dout,
                                                    const TI* inp, const float* mean, const float* rstd, int N, int C) {
    __shared__ float shw[8][33], shb[8][33];
    int c = blockIdx.y * 32 + threadIdx.x;
    int n0 = blockIdx.x * COLSUM_ROWS, n1 = min(n0 + COLSUM_ROWS, N);
    float aw = 0.0f, ab = 0.0f;
    if (c < C)
        for (int n = n0 + threadIdx.y; n < n1; n += 8) {
            long i = (long)n * C + c;
            float d = dout[i];
            aw += d * ((ldv<1>(inp + i).v[0] - mean[n]) * rstd[n]);
            ab += d;
        }
    shw[threadIdx.y][threadIdx.x] = aw;
    shb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float sw = 0.0f, sb = 0.0f;
        for (int y = 0; y < 8; y++) { sw += shw[y][threadIdx.x]; sb += shb[y][threadIdx.x]; }
        partial_w[(long)blockIdx.x * C + c] = sw;
        partial_b[(long)blockIdx.x * C + c] = sb;
    }
}

// g += v on the device, as grad_add (kernels_cpu.h): fp32, or bf16 storage with the sum rounded to nearest
__device__ __forceinline__ void grad_add_dev(float* g, float v) { *g += v; }
__device__ __forceinline__ void grad_add_dev(bf16* g, float v) { *g = bf16_round(bf16_to_float(*g) + v); }

// dst0 (n) += sum_s p0 (nsplit, n) and, if dst1, dst1 (n) += sum_s p1 (nsplit, n); splits in order.
// G: the gradients' storage, fp32 or bf16 (each sum added once, grad_add_dev)
template <typename G>
__global__ void colsum_finish_kernel(G* dst0, const float* p0, G* dst1, const float* p1, int nsplit, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float s0 = 0.0f, s1 = 0.0f;
    for (int s = 0; s < nsplit; s++) {
        s0 += p0[(long)s * n + i];
        if (dst1) s1 += p1[(long)s * n + i];
    }
    grad_add_dev(dst0 + i, s0);
    if (dst1) grad_add_dev(dst1 + i, s1);
}

// grid for the partial kernels: splits on x (up to 2^31), 32-column groups on y (up to 65535: 2M columns)
static dim3 colsum_grid(CudaCtx* cx, int N, int n) {
    unsigned ys = ceil_div(n, 32);
    if (ys > 65535) fatal("rank %d: a column reduction over %d columns exceeds the kernel's grid", cx->rank, n);
    return dim3(ceil_div(N, COLSUM_ROWS), ys);
}

// ----------------------------------------------------------------------------
// Linear layers

// A bf16 run's activation operands hold bf16 values in fp32 words (keep_bf16); its weights are a bf16 copy
// in bf16 storage (gpt.cu's gpt_round_weights). On the GPU the activations are packed into bf16 storage
// too (bf16_pack_cuda, 16-byte loads and stores), and cuBLAS multiplies them on bf16 tensor cores with
// fp32 accumulation (gemm_bf16_cuda): twice TF32's rate on sm_80 and sm_90, for a pass over the
// activations that is memory-bound. Products of bf16 values are exact in fp32, so this computes what TF32
// or fp32 would on the same operands, up to the order of the fp32 sums. The packed operands live in one
// scratch of the rank (cx->packed), each from a 16-byte boundary; it grows to the largest matmul's
// (train/setup.h's gpu_bf16_pack_bytes, which the memory check counts). The LM head's logits and dlogits
// are bf16 storage in such a run (Logits), so its matmuls pack lnf alone, and so is every output
// gradient of the backward (gpt.cu's grad_input, residual_grad_input), which neither backward call packs.
static void bf16_pack_cuda(CudaCtx* cx, bf16* out, const float* x, long n);  // (with the bf16 ops below)

// The operands x[0..n) (each holding bf16 values, sizes[i] of them) packed into consecutive 16-byte-aligned
// parts of cx->packed, returned in out[i]
static void pack_operands_bf16(CudaCtx* cx, int n, const float* const* x, const long* sizes, bf16** out) {
    long total = 0;
    for (int i = 0; i < n; i++) total += (sizes[i] + 7) / 8 * 8;
    bf16* base = (bf16*)cuda_scratch(cx, &cx->packed, &cx->packed_bytes, (size_t)total * sizeof(bf16));
    for (int i = 0; i < n; i++) {
        out[i] = base;
        bf16_pack_cuda(cx, base, x[i], sizes[i]);
        base += (sizes[i] + 7) / 8 * 8;
    }
}

// out (N, OC) = inp (N, IC) . weight (OC, IC)^T + bias (OC); bias may be NULL. bf16: inp and weight hold
// bf16 values, multiplied as bf16 (above): inp is packed, and the weight too where it is fp32 words
// (weight); a --dtype bf16 run's is bf16 storage already (weight_h, which bf16 implies), read where it lies.
// inp_h: inp in bf16 storage instead (the bf16 copy a layer keeps of its input, Input), read where it lies.
static void matmul_forward_cuda(CudaCtx* cx, float* out, const float* inp, const float* weight, const float* bias,
                                int N, int IC, int OC, bool bf16 = false, const ::bf16* weight_h = nullptr,
                                const ::bf16* inp_h = nullptr) {
    if (N <= 0 || OC <= 0) return;
    if (bf16 || weight_h || inp_h) {
        const float* x[2] = {inp_h ? nullptr : inp, weight_h ? nullptr : weight};
        long sizes[2] = {inp_h ? 0 : (long)N * IC, weight_h ? 0 : (long)OC * IC};
        ::bf16* h[2];  // (:: because the flag bf16 hides the type)
        pack_operands_bf16(cx, 2, x, sizes, h);
        const ::bf16* a = inp_h ? inp_h : h[0];
        const ::bf16* wb = weight_h ? weight_h : h[1];
        if (bias && aligned16(bias) && matmul_forward_lt(cx, out, a, wb, bias, N, IC, OC, CUDA_R_16BF)) return;
        float beta = 0.0f;
        if (bias) {  // out = bias, then out = inp . W^T + 1 * out: the CPU op's (acc + bias)
            bias_broadcast_kernel<<<ceil_div((long)N * OC, FLAT_THREADS), FLAT_THREADS, 0, cx->stream>>>(out, bias, N, OC);
            CUDA_LAUNCH_CHECK(cx->rank, "bias_broadcast_kernel");
            beta = 1.0f;
        }
        gemm_bf16_cuda(cx, false, true, N, OC, IC, 1.0f, a, IC, wb, IC, beta, out, OC);
        return;
    }
    // cuBLASLt's bias epilogue wants a 16-byte aligned bias; every GPT-2 shape gives one
    if (bias && aligned16(bias) && matmul_forward_lt(cx, out, inp, weight, bias, N, IC, OC)) return;
    float beta = 0.0f;
    if (bias) {
        // out = bias, then out = inp . W^T + 1 * out: the same sum (acc + bias) as the CPU op
        bias_broadcast_kernel<<<ceil_div((long)N * OC, FLAT_THREADS), FLAT_THREADS, 0, cx->stream>>>(out, bias, N, OC);
        CUDA_LAUNCH_CHECK(cx->rank, "bias_broadcast_kernel");
        beta = 1.0f;
    }
    // op(A) = inp (N x IC), op(B) = weight^T: weight stored (OC x IC)
    gemm_cuda(cx, false, true, N, OC, IC, 1.0f, inp, IC, 0, weight, IC, 0, beta, out, OC, 0, 1);
}

// the recipe's form: the weight in the run's dtype (Weight, kernels_cpu.h)
static void matmul_forward_cuda(CudaCtx* cx, float* out, const float* inp, Weight w, const float* bias, int N, int IC, int OC) {
    matmul_forward_cuda(cx, out, inp, w.f, bias, N, IC, OC, w.h != nullptr, w.h);
}
// ... with the input as the layer keeps it (Input): a bf16 copy goes to cuBLAS as it lies, unpacked
static void matmul_forward_cuda(CudaCtx* cx, float* out, Input inp, Weight w, const float* bias, int N, int IC, int OC) {
    matmul_forward_cuda(cx, out, inp.f, w.f, bias, N, IC, OC, w.h != nullptr || inp.h != nullptr, w.h, inp.h);
}
// the LM head's (Logits): a bf16 run's logits are written by cuBLAS as bf16 (its fp32 sums rounded to
// nearest, as the CPU's store_c), half the bytes of the largest activation. The head has no bias.
static void matmul_forward_cuda(CudaCtx* cx, Logits out, const float* inp, Weight w, const float* bias, int N, int IC, int OC) {
    if (!out.h) return matmul_forward_cuda(cx, out.f, inp, w, bias, N, IC, OC);
    if (bias) fatal("rank %d: matmul_forward with bf16 output takes no bias (the LM head has none)", cx->rank);
    if (N <= 0 || OC <= 0) return;
    const float* x[2] = {inp, w.h ? nullptr : w.f};
    long sizes[2] = {(long)N * IC, w.h ? 0 : (long)OC * IC};
    bf16* h[2];
    pack_operands_bf16(cx, 2, x, sizes, h);
    gemm_bf16_cuda(cx, false, true, N, OC, IC, 1.0f, h[0], IC, w.h ? w.h : h[1], IC, 0.0f, out.h, OC, CUDA_R_16BF);
}

// dinp (N, IC) = dout (N, OC) . weight (OC, IC)        (written, not accumulated; NULL skips)
// dweight (OC, IC) += dout^T . inp;  dbias (OC) += column sums of dout (an unset Grad skips each)
// bf16: as in matmul_forward_cuda, the weight fp32 words (weight) or bf16 storage (weight_h, which bf16 implies)
// dweight and dbias in bf16 storage (a bf16 run's gradients): cuBLAS adds the fp32 product to dweight
// widened and rounds once (beta 1, a CUDA_R_16BF C), and the bias's sums are added as grad_add does
// dout_h: dout in bf16 storage instead (the LM head's dlogits in a bf16 run, Logits), used where it lies;
// inp_h: inp likewise (the bf16 copy a layer kept of its input, Input)
static void matmul_backward_cuda(CudaCtx* cx, float* dinp, Grad dweight, Grad dbias, const float* dout,
                                 const float* inp, const float* weight, int N, int IC, int OC, bool bf16 = false,
                                 const ::bf16* weight_h = nullptr, const ::bf16* dout_h = nullptr,
                                 const ::bf16* inp_h = nullptr) {
    if (N <= 0) return;
    if (dweight.h && !(bf16 || weight_h || dout_h || inp_h))
        fatal("rank %d: matmul_backward: a bf16 weight gradient from fp32 operands (a bf16 run's operands hold bf16 values)", cx->rank);
    if ((bf16 || weight_h || dout_h || inp_h) && (dinp || dweight.set())) {  // dout holds bf16 values too (keep_bf16 of the output gradient)
        const bool pack_inp = dweight.set() && !inp_h;
        const float* x[3] = {dout_h ? nullptr : dout, dinp && !weight_h ? weight : nullptr, pack_inp ? inp : nullptr};
        long sizes[3] = {dout_h ? 0 : (long)N * OC, dinp && !weight_h ? (long)OC * IC : 0, pack_inp ? (long)N * IC : 0};
        ::bf16* h[3];
        pack_operands_bf16(cx, 3, x, sizes, h);
        const ::bf16* d = dout_h ? dout_h : h[0];
        if (dinp) gemm_bf16_cuda(cx, false, false, N, IC, OC, 1.0f, d, OC, weight_h ? weight_h : h[1], IC, 0.0f, dinp, IC);
        if (dweight.f) gemm_bf16_cuda(cx, true, false, OC, IC, N, 1.0f, d, OC, inp_h ? inp_h : h[2], IC, 1.0f, dweight.f, IC);
        if (dweight.h) gemm_bf16_cuda(cx, true, false, OC, IC, N, 1.0f, d, OC, inp_h ? inp_h : h[2], IC, 1.0f, dweight.h, IC, CUDA_R_16BF);
    } else {
        if (dinp) gemm_cuda(cx, false, false, N, IC, OC, 1.0f, dout, OC, 0, weight, IC, 0, 0.0f, dinp, IC, 0, 1);
        // op(A) = dout^T (OC x N): dout stored (N x OC), transposed
        if (dweight.f) gemm_cuda(cx, true, false, OC, IC, N, 1.0f, dout, OC, 0, inp, IC, 0, 1.0f, dweight.f, IC, 0, 1);
    }
    if (dbias.set()) {
        dim3 grid = colsum_grid(cx, N, OC);
        float* partial = (float*)cuda_scratch(cx, &cx->red, &cx->red_bytes, (size_t)grid.x * OC * sizeof(float));
        if (dout_h) bias_grad_partial_kernel<::bf16><<<grid, dim3(32, 8), 0, cx->stream>>>(partial, dout_h, N, OC);
        else bias_grad_partial_kernel<float><<<grid, dim3(32, 8), 0, cx->stream>>>(partial, dout, N, OC);
        CUDA_LAUNCH_CHECK(cx->rank, "bias_grad_partial_kernel");
        if (dbias.h) colsum_finish_kernel<::bf16><<<ceil_div(OC, 256), 256, 0, cx->stream>>>(dbias.h, partial, nullptr, nullptr, (int)grid.x, OC);
        else colsum_finish_kernel<float><<<ceil_div(OC, 256), 256, 0, cx->stream>>>(dbias.f, partial, nullptr, nullptr, (int)grid.x, OC);
        CUDA_LAUNCH_CHECK(cx->rank, "colsum_finish_kernel");
    }
}
// the recipe's form: the weight in the run's dtype; dout and inp as the layer holds them (Input): a bf16
// copy goes to cuBLAS as it lies, unpacked (a kept input; a bf16 run's fc and qkv output gradients, which
// both backward calls of their matmul would otherwise pack each)
static void matmul_backward_cuda(CudaCtx* cx, float* dinp, Grad dweight, Grad dbias, Input dout, Input inp,
                                 Weight w, int N, int IC, int OC) {
    matmul_backward_cuda(cx, dinp, dweight, dbias, dout.f, inp.f, w.f, N, IC, OC, w.h || dout.h || inp.h, w.h, dout.h, inp.h);
}
static void matmul_backward_cuda(CudaCtx* cx, float* dinp, Grad dweight, Grad dbias, const float* dout, Input inp,
                                 Weight w, int N, int IC, int OC) {
    matmul_backward_cuda(cx, dinp, dweight, dbias, Input{dout, nullptr}, inp, w, N, IC, OC);
}
static void matmul_backward_cuda(CudaCtx* cx, float* dinp, Grad dweight, Grad dbias, const float* dout, const float* inp,
                                 Weight w, int N, int IC, int OC) {
    matmul_backward_cuda(cx, dinp, dweight, dbias, Input{dout, nullptr}, Input{inp, nullptr}, w, N, IC, OC);
}
// the LM head's: dout is dlogits (Logits)
static void matmul_backward_cuda(CudaCtx* cx, float* dinp, Grad dweight, Grad dbias, Logits dout, const float* inp,
                                 Weight w, int N, int IC, int OC) {
    matmul_backward_cuda(cx, dinp, dweight, dbias, Input{dout.f, dout.h}, Input{inp, nullptr}, w, N, IC, OC);
}

// ----------------------------------------------------------------------------
// Embedding (vocab-parallel: this rank holds wte rows [v0, v0+Vl))

// out (N, C) = wte[tok - v0] for tokens this rank owns, zeros for the others; a warp per row. W: wte in
// fp32, or a --dtype bf16 run's bf16 copy (widened exactly)
template <typename W, int VEC>
__global__ void encoder_forward_kernel(float* out, const int* tokens, const W* wte, int v0, int Vl, int N, int C) {
    long n = (long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    int lane = threadIdx.x % 32;
    int row = tokens[n] - v0;
    bool own = row >= 0 && row < Vl;
    const W* src = wte + (long)(own ? row : 0) * C;
    float* o = out + n * C;
    for (int i = lane * VEC; i < C; i += 32 * VEC) {
        Fv<VEC> x;
        if (own) x = ldv<VEC>(src + i);
        else
            for (int k = 0; k < VEC; k++) x.v[k] = 0.0f;
        stv<VEC>(o + i, x);
    }
}

template <typename W>
static void encoder_forward_cuda(CudaCtx* cx, float* out, const int* tokens, const W* wte, int v0, int Vl, int N, int C) {
    if (N <= 0) return;
    unsigned grid = ceil_div(N, ROWS_PER_BLOCK);
    constexpr int VEC = 16 / sizeof(W);  // a 16-byte load of wte: 4 floats or 8 bf16
    if (C % VEC == 0 && aligned16(out) && aligned16(wte))
        encoder_forward_kernel<W, VEC><<<grid, ROW_THREADS, 0, cx->stream>>>(out, tokens, wte, v0, Vl, N, C);
    else
        encoder_forward_kernel<W, 1><<<grid, ROW_THREADS, 0, cx->stream>>>(out, tokens, wte, v0, Vl, N, C);
    CUDA_LAUNCH_CHECK(cx->rank, "encoder_forward_kernel");
}
// the recipe's form: wte in the run's dtype
static void encoder_forward_cuda(CudaCtx* cx, float* out, const int* tokens, Weight wte, int v0, int Vl, int N, int C) {
    if (wte.h) encoder_forward_cuda(cx, out, tokens, wte.h, v0, Vl, N, C);
    else encoder_forward_cuda(cx, out, tokens, wte.f, v0, Vl, N, C);
}

// x (N, C) += wpe row (t0 + n) % T for row n (the flattened batch's token t0 + n); a warp per row
template <int VEC>
__global__ void position_forward_kernel(float* x, const float* wpe, int N, int t0, int T, int C) {
    long n = (long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    int lane = threadIdx.x % 32;
    const float* p = wpe + ((t0 + n) % T) * C;
    float* o = x + n * C;
    for (int i = lane * VEC; i < C; i += 32 * VEC) {
        Fv<VEC> a = ldv<VEC>(o + i), b = ldv<VEC>(p + i);
        for (int k = 0; k < VEC; k++) a.v[k] += b.v[k];
        stv<VEC>(o + i, a);
    }
}

static void position_forward_cuda(CudaCtx* cx, float* x, const float* wpe, int N, int t0, int T, int C) {
    if (N <= 0) return;
    unsigned grid = ceil_div(N, ROWS_PER_BLOCK);
    if (C % 4 == 0 && aligned16(x) && aligned16(wpe))
        position_forward_kernel<4><<<grid, ROW_THREADS, 0, cx->stream>>>(x, wpe, N, t0, T, C);
    else
        position_forward_kernel<1><<<grid, ROW_THREADS, 0, cx->stream>>>(x, wpe, N, t0, T, C);
    CUDA_LAUNCH_CHECK(cx->rank, "position_forward_kernel");
}

// dwte (Vl, C) += dout (N, C) rows of the tokens this rank owns, deterministically and in exactly the
// CPU op's order: every (vocab row, channel) sum runs over positions n in increasing order.
// Grid (ceil(C / ENC_THREADS), ENC_BUCKETS); block = ENC_THREADS channels. Block (cx, bucket) owns the
// vocab rows with row % ENC_BUCKETS == bucket: it walks all N tokens in order, a tile of ENC_THREADS at a
// time, compacts the tile's tokens of its bucket (ballot + prefix, so the order is kept), and each
// thread adds those dout rows into its channel. Repeated tokens land in the same thread, in n order: no
// races, no atomics, and the result is bit-identical to the CPU loop. A thread keeps the running sum of
// its current row in a register while consecutive matches hit the same row (a repeated token), and
// writes it back when the row changes: the same adds in the same order, fewer round trips to memory.
#define ENC_THREADS 128
#define ENC_BUCKETS 64
__global__ void encoder_backward_wte_kernel(float* dwte, const float* dout, const int* tokens, int v0, int Vl, int N, int C) {
    __shared__ int s_n[ENC_THREADS], s_row[ENC_THREADS], s_count[ENC_THREADS / 32];
    int c = blockIdx.x * ENC_THREADS + threadIdx.x;
    int bucket = blockIdx.y;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int cur = -1;      // the row whose sum is in acc (-1: none)
    float acc = 0.0f;
    for (int n0 = 0; n0 < N; n0 += ENC_THREADS) {
        int n = n0 + threadIdx.x;
        int row = -1;
        if (n < N) {
            int r = tokens[n] - v0;
            if (r >= 0 && r < Vl && r % ENC_BUCKETS == bucket) row = r;
        }
        unsigned mask = __ballot_sync(0xffffffffu, row >= 0);
        if (lane == 0) s_count[warp] = __popc(mask);
        __syncthreads();
        int base = 0, total = 0;
        for (int w = 0; w < ENC_THREADS / 32; w++) {
            if (w < warp) base += s_count[w];
            total += s_count[w];
        }
        if (row >= 0) {
            int pos = base + __popc(mask & ((1u << lane) - 1u));
            s_n[pos] = n;
            s_row[pos] = row;
        }
        __syncthreads();
        if (c < C)
            for (int j = 0; j < total; j++) {
                int row = s_row[j];
                if (row != cur) {
                    if (cur >= 0) dwte[(long)cur * C + c] = acc;
                    cur = row;
                    acc = dwte[(long)row * C + c];
                }
                acc += dout[(long)s_n[j] * C + c];
            }
        __syncthreads();  // the next tile overwrites s_n, s_row, s_count
    }
    if (c < C && cur >= 0) dwte[(long)cur * C + c] = acc;
}

// A bf16 run's: block (g, y) adds group g's rows of dout (groups, encoder_groups: wte row row[g], tokens
// n[start[g]] .. in increasing order) in fp32 to ENC_THREADS channels of the row, and the sum to the row
// once. The grid has a block per token (the most groups there can be); those past ng return.
__global__ void encoder_backward_rows_kernel(bf16* dwte, const float* dout, const int* groups, int N, int C) {
    int g = blockIdx.x, c = blockIdx.y * ENC_THREADS + threadIdx.x;
    if (g >= groups[0] || c >= C) return;
    const int *row = groups + 1, *start = row + N, *ns = start + N + 1;
    bf16* w = dwte + (long)row[g] * C + c;
    float acc = bf16_to_float(*w);
    for (int i = start[g]; i < start[g + 1]; i++) acc += dout[(long)ns[i] * C + c];
    *w = bf16_round(acc);
}

// dwte (Vl, C) += dout (N, C) rows of the tokens this rank owns. groups (device): the tokens grouped by row
// (encoder_groups), which a bf16 gradient needs: the bucket kernel writes a row back whenever another
// row's token comes between two of its own, which in bf16 storage would round it each time; grouped, each
// row's sum is added once, the CPU op's bits. gpt_forward packs them on the host, with the tokens.
static void encoder_backward_cuda(CudaCtx* cx, Grad dwte, const float* dout, const int* tokens, const int* groups, int v0,
                                  int Vl, int N, int C) {
    if (N <= 0 || C <= 0) return;
    if (dwte.f) {
        encoder_backward_wte_kernel<<<dim3(ceil_div(C, ENC_THREADS), ENC_BUCKETS), ENC_THREADS, 0, cx->stream>>>(
            dwte.f, dout, tokens, v0, Vl, N, C);
        CUDA_LAUNCH_CHECK(cx->rank, "encoder_backward_wte_kernel");
        return;
    }
    if (!groups) fatal("rank %d: encoder_backward into bf16 needs the tokens grouped by row (encoder_groups)", cx->rank);
    encoder_backward_rows_kernel<<<dim3(N, ceil_div(C, ENC_THREADS)), ENC_THREADS, 0, cx->stream>>>(dwte.h, dout, groups, N, C);
    CUDA_LAUNCH_CHECK(cx->rank, "encoder_backward_rows_kernel");
}

// dwpe (T, C) += dout (N, C), row n at position (t0 + n) % T; a thread per (t, c) adds its rows
// n = (t - t0) mod T, then + T, + 2T, ... in increasing order (the CPU order)
// (G: fp32, or a bf16 run's bf16 storage: the sum added once, rounded to nearest)
template <typename G>
__global__ void position_backward_kernel(G* dwpe, const float* dout, int N, int t0, int T, int C) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)T * C) return;
    int t = (int)(i / C), c = (int)(i % C);
    long n = ((t - t0) % T + T) % T;
    if (n >= N) return;  // no row at this position: the gradient is left as it is
    float acc = ldv<1>(dwpe + i).v[0];
    for (; n < N; n += T) acc += dout[n * C + c];
    stv<1>(dwpe + i, Fv<1>{{acc}});
}

static void position_backward_cuda(CudaCtx* cx, Grad dwpe, const float* dout, int N, int t0, int T, int C) {
    if (N <= 0 || C <= 0) return;
    unsigned grid = ceil_div((long)T * C, FLAT_THREADS);
    if (dwpe.h) position_backward_kernel<::bf16><<<grid, FLAT_THREADS, 0, cx->stream>>>(dwpe.h, dout, N, t0, T, C);
    else position_backward_kernel<float><<<grid, FLAT_THREADS, 0, cx->stream>>>(dwpe.f, dout, N, t0, T, C);
    CUDA_LAUNCH_CHECK(cx->rank, "position_backward_kernel");
}

// ----------------------------------------------------------------------------
// LayerNorm (eps 1e-5, biased variance, as llm.c)

// out (N, C) = (inp - mean) * rstd * w + b; mean (N), rstd (N). A warp per row, two passes over the row
// (mean, then the variance about it) as the CPU op, then the output. TO: out fp32, or bf16 storage (a bf16
// run's kept ln1 and ln2, each value rounded to nearest as it is stored, as the CPU op). TI: inp fp32, or
// bf16 storage (a bf16 run's residual stream), widened exactly as it is loaded: the same sums in the same order.
template <int VEC, typename TO, typename TI>
__global__ void layernorm_forward_kernel(TO* out, float* mean, float* rstd, const TI* inp, const float* w,
                                         const float* b, int N, int C) {
    long n = (long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    int lane = threadIdx.x % 32;
    const TI* x = inp + n * C;
    float s = 0.0f;
    for (int i = lane * VEC; i < C; i += 32 * VEC) {
        Fv<VEC> a = ldv<VEC>(x + i);
        for (int k = 0; k < VEC; k++) s += a.v[k];
    }
    float m = warp_sum(s) / C;
    float var = 0.0f;
    for (int i = lane * VEC; i < C; i += 32 * VEC) {
        Fv<VEC> a = ldv<VEC>(x + i);
        for (int k = 0; k < VEC; k++) { float d = a.v[k] - m; var += d * d; }
    }
    var = warp_sum(var) / C;
    float r = 1.0f / sqrtf(var + 1e-5f);
    TO* o = out + n * C;
    for (int i = lane * VEC; i < C; i += 32 * VEC) {
        Fv<VEC> a = ldv<VEC>(x + i), wv = ldv<VEC>(w + i), bv = ldv<VEC>(b + i);
        for (int k = 0; k < VEC; k++) a.v[k] = (r * (a.v[k] - m)) * wv.v[k] + bv.v[k];
        stv<VEC>(o + i, a);
    }
    if (lane == 0) {
        mean[n] = m;
        rstd[n] = r;
    }
}

// (4 elements of out and of inp a load or store: 16 bytes of fp32, 8 of bf16, where each is aligned to that)
template <typename TO, typename TI = float>
static void layernorm_forward_cuda(CudaCtx* cx, TO* out, float* mean, float* rstd, const TI* inp, const float* w,
                                   const float* b, int N, int C) {
    if (N <= 0) return;
    unsigned grid = ceil_div(N, ROWS_PER_BLOCK);
    if (C % 4 == 0 && aligned4(out) && aligned4(inp) && aligned16(w) && aligned16(b))
        layernorm_forward_kernel<4, TO, TI><<<grid, ROW_THREADS, 0, cx->stream>>>(out, mean, rstd, inp, w, b, N, C);
    else
        layernorm_forward_kernel<1, TO, TI><<<grid, ROW_THREADS, 0, cx->stream>>>(out, mean, rstd, inp, w, b, N, C);
    CUDA_LAUNCH_CHECK(cx->rank, "layernorm_forward_kernel");
}
// the recipe's form: inp the residual stream as it lies (Input: fp32, or a bf16 run's bf16 storage)
template <typename TO>
static void layernorm_forward_cuda(CudaCtx* cx, TO* out, float* mean, float* rstd, Input inp, const float* w,
                                   const float* b, int N, int C) {
    if (inp.h) layernorm_forward_cuda(cx, out, mean, rstd, inp.h, w, b, N, C);
    else layernorm_forward_cuda(cx, out, mean, rstd, inp.f, w, b, N, C);
}

// dinp (N, C) += ((dnorm - mean(dnorm)) - xhat * mean(dnorm * xhat)) * rstd, dnorm = w * dout; a warp per row
template <int VEC, typename TI>
__global__ void layernorm_backward_kernel(float* dinp, const float* dout, const TI* inp, const float* w,
                                          const float* mean, const float* rstd, int N, int C) {
    long n = (long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    int lane = threadIdx.x % 32;
    const TI* x = inp + n * C;
    const float* d = dout + n * C;
    float m = mean[n], s = rstd[n];
    float dm = 0.0f, dnm = 0.0f;
    for (int i = lane * VEC; i < C; i += 32 * VEC) {
        Fv<VEC> xv = ldv<VEC>(x + i), dv = ldv<VEC>(d + i), wv = ldv<VEC>(w + i);
        for (int k = 0; k < VEC; k++) {
            float xhat = (xv.v[k] - m) * s;
            float dnorm = wv.v[k] * dv.v[k];
            dm += dnorm;
            dnm += dnorm * xhat;
        }
    }
    dm = warp_sum(dm) / C;
    dnm = warp_sum(dnm) / C;
    float* di = dinp + n * C;
    for (int i = lane * VEC; i < C; i += 32 * VEC) {
        Fv<VEC> xv = ldv<VEC>(x + i), dv = ldv<VEC>(d + i), wv = ldv<VEC>(w + i), g = ldv<VEC>(di + i);
        for (int k = 0; k < VEC; k++) {
            float xhat = (xv.v[k] - m) * s;
            float dnorm = wv.v[k] * dv.v[k];
            g.v[k] += ((dnorm - dm) - xhat * dnm) * s;
        }
        stv<VEC>(di + i, g);
    }
}

// dinp (N, C) += d(layernorm)/d(inp) . dout;  dw (C) += sum_n dout * xhat;  db (C) += sum_n dout
// (dw and db through the deterministic two-pass column sums; TI: inp fp32, or bf16 storage as the forward's)
template <typename TI>
static void layernorm_backward_cuda(CudaCtx* cx, float* dinp, Grad dw, Grad db, const float* dout, const TI* inp,
                                    const float* w, const float* mean, const float* rstd, int N, int C) {
    if (N <= 0) return;
    unsigned grid = ceil_div(N, ROWS_PER_BLOCK);
    if (C % 4 == 0 && aligned16(dinp) && aligned16(dout) && aligned4(inp) && aligned16(w))
        layernorm_backward_kernel<4, TI><<<grid, ROW_THREADS, 0, cx->stream>>>(dinp, dout, inp, w, mean, rstd, N, C);
    else
        layernorm_backward_kernel<1, TI><<<grid, ROW_THREADS, 0, cx->stream>>>(dinp, dout, inp, w, mean, rstd, N, C);
    CUDA_LAUNCH_CHECK(cx->rank, "layernorm_backward_kernel");
    dim3 g2 = colsum_grid(cx, N, C);
    float* pw = (float*)cuda_scratch(cx, &cx->red, &cx->red_bytes, 2 * (size_t)g2.x * C * sizeof(float));
    float* pb = pw + (size_t)g2.x * C;
    layernorm_param_grad_partial_kernel<TI><<<g2, dim3(32, 8), 0, cx->stream>>>(pw, pb, dout, inp, mean, rstd, N, C);
    CUDA_LAUNCH_CHECK(cx->rank, "layernorm_param_grad_partial_kernel");
    if (dw.h) colsum_finish_kernel<::bf16><<<ceil_div(C, 256), 256, 0, cx->stream>>>(dw.h, pw, db.h, pb, (int)g2.x, C);
    else colsum_finish_kernel<float><<<ceil_div(C, 256), 256, 0, cx->stream>>>(dw.f, pw, db.f, pb, (int)g2.x, C);
    CUDA_LAUNCH_CHECK(cx->rank, "colsum_finish_kernel");
}
static void layernorm_backward_cuda(CudaCtx* cx, float* dinp, Grad dw, Grad db, const float* dout, Input inp,
                                    const float* w, const float* mean, const float* rstd, int N, int C) {
    if (inp.h) layernorm_backward_cuda(cx, dinp, dw, db, dout, inp.h, w, mean, rstd, N, C);
    else layernorm_backward_cuda(cx, dinp, dw, db, dout, inp.f, w, mean, rstd, N, C);
}

// ----------------------------------------------------------------------------
// Residual + bias, GELU

// out (N, C) = res + (x + bias): the row-parallel layer's bias, added once after its all-reduce. TO, TR: out
// and res fp32, or bf16 storage (a bf16 run's residual stream: res widened, the sum rounded to nearest)
template <int VEC, typename TO, typename TR>
__global__ void residual_forward_kernel(TO* out, const TR* res, const float* x, const float* bias, int N, int C) {
    long n = (long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    int lane = threadIdx.x % 32;
    long off = n * C;
    for (int i = lane * VEC; i < C; i += 32 * VEC) {
        Fv<VEC> r = ldv<VEC>(res + off + i), a = ldv<VEC>(x + off + i), b = ldv<VEC>(bias + i);
        for (int k = 0; k < VEC; k++) r.v[k] = r.v[k] + (a.v[k] + b.v[k]);
        stv<VEC>(out + off + i, r);
    }
}

template <typename TO, typename TR>
static void residual_forward_cuda(CudaCtx* cx, TO* out, const TR* res, const float* x, const float* bias, int N, int C) {
    if (N <= 0) return;
    unsigned grid = ceil_div(N, ROWS_PER_BLOCK);
    if (C % 4 == 0 && aligned4(out) && aligned4(res) && aligned16(x) && aligned16(bias))
        residual_forward_kernel<4, TO, TR><<<grid, ROW_THREADS, 0, cx->stream>>>(out, res, x, bias, N, C);
    else
        residual_forward_kernel<1, TO, TR><<<grid, ROW_THREADS, 0, cx->stream>>>(out, res, x, bias, N, C);
    CUDA_LAUNCH_CHECK(cx->rank, "residual_forward_kernel");
}
// the recipe's form: res and out are both the residual stream, in its storage (res.h: bf16, out too)
static void residual_forward_cuda(CudaCtx* cx, float* out, Input res, const float* x, const float* bias, int N, int C) {
    if (res.h) residual_forward_cuda(cx, (bf16*)(void*)out, res.h, x, bias, N, C);
    else residual_forward_cuda(cx, out, res.f, x, bias, N, C);
}

// e^(2u) for u = sqrt(2/pi) (x + 0.044715 x^3), with the exponent clamped as the CPU's exp_fast does:
// e stays finite, so e / (e + 1) below never becomes inf / inf
__device__ __forceinline__ float gelu_exp2u(float x) {
    float a = 2.0f * GELU_SCALE * (x + 0.044715f * x * x * x);
    return expf(fminf(fmaxf(a, -87.0f), 88.0f));
}

// gelu(x) = 0.5 x (1 + tanh(u)) = x e / (e + 1) with e = e^2u, the CPU op's formula: no cancellation for
// x << 0, where 1 + tanh(u) written as 1 + (1 - 2 / (e + 1)) loses every digit (one expression for both
// forward kernels)
__device__ __forceinline__ float gelu_of(float x) {
    float e = gelu_exp2u(x);
    return x * (e / (e + 1.0f));
}

// out (N) = gelu(inp)
template <int VEC>
__global__ void gelu_forward_kernel(float* out, const float* inp, long N) {
    long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (i >= N) return;
    Fv<VEC> a = ldv<VEC>(inp + i);
    for (int k = 0; k < VEC; k++) a.v[k] = gelu_of(a.v[k]);
    stv<VEC>(out + i, a);
}

// A bf16 run's forward GELU, as gelu_forward_bf16_cpu: inp_kept (N) = inp rounded to nearest, out (N) =
// gelu(inp_kept) rounded to nearest. VEC 8: two 16-byte loads of inp, one 16-byte store to each output.
template <int VEC>
__global__ void gelu_forward_bf16_kernel(bf16* out, bf16* inp_kept, const float* inp, long N) {
    long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (i >= N) return;
    Fv<VEC> a = ldv<VEC>(inp + i);
    for (int k = 0; k < VEC; k++) a.v[k] = bf16_to_float(bf16_round(a.v[k]));  // exact: stv stores it unchanged
    stv<VEC>(inp_kept + i, a);
    for (int k = 0; k < VEC; k++) a.v[k] = gelu_of(a.v[k]);
    stv<VEC>(out + i, a);
}

// dinp (N) = gelu'(inp) * dout (written; fp32: dinp may be dout, each element is read before it is
// written, by the same thread). sech^2(u) = 4e / (e + 1)^2. T: inp and dinp fp32 (gelu_backward_cuda), or
// both bf16 storage (gelu_backward_bf16_cuda: a bf16 run's kept pre-activation, widened as it is loaded,
// and fc's output gradient, each rounded to nearest as it is stored, as gelu_backward_bf16_cpu does).
template <int VEC, typename T>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const float* dout, long N) {
    long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (i >= N) return;
    Fv<VEC> a = ldv<VEC>(inp + i), d = ldv<VEC>(dout + i);
    for (int k = 0; k < VEC; k++) {
        float x = a.v[k];
        float e = gelu_exp2u(x);
        float half_1p_tanh = e / (e + 1.0f);  // 0.5 (1 + tanh(u)), as the CPU op: no cancellation for x << 0
        float sech2 = 4.0f * half_1p_tanh / (e + 1.0f);
        float grad = half_1p_tanh + x * 0.5f * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        d.v[k] = grad * d.v[k];
        if (std::is_same<T, bf16>::value) d.v[k] = bf16_to_float(bf16_round(d.v[k]));  // exact: stv stores it unchanged
    }
    stv<VEC>(dinp + i, d);
}

static void gelu_forward_cuda(CudaCtx* cx, float* out, const float* inp, long N) {
    if (N <= 0) return;
    if (N % 4 == 0 && aligned16(out) && aligned16(inp))
        gelu_forward_kernel<4><<<ceil_div(N / 4, FLAT_THREADS), FLAT_THREADS, 0, cx->stream>>>(out, inp, N);
    else
        gelu_forward_kernel<1><<<ceil_div(N, FLAT_THREADS), FLAT_THREADS, 0, cx->stream>>>(out, inp, N);
    CUDA_LAUNCH_CHECK(cx->rank, "gelu_forward_kernel");
}

static void gelu_forward_bf16_cuda(CudaCtx* cx, bf16* out, bf16* inp_kept, const float* inp, long N) {
    if (N <= 0) return;
    if (N % 8 == 0 && aligned16(out) && aligned16(inp_kept) && aligned16(inp))
        gelu_forward_bf16_kernel<8><<<ceil_div(N / 8, FLAT_THREADS), FLAT_THREADS, 0, cx->stream>>>(out, inp_kept, inp, N);
    else
        gelu_forward_bf16_kernel<1><<<ceil_div(N, FLAT_THREADS), FLAT_THREADS, 0, cx->stream>>>(out, inp_kept, inp, N);
    CUDA_LAUNCH_CHECK(cx->rank, "gelu_forward_bf16_kernel");
}

// (fp32: 4 elements a thread, bf16: 8, where every pointer is 16-byte aligned)
template <typename T>
static void gelu_backward_launch(CudaCtx* cx, T* dinp, const T* inp, const float* dout, long N) {
    if (N <= 0) return;
    constexpr int VEC = 16 / sizeof(T);
    if (N % VEC == 0 && aligned16(dinp) && aligned16(inp) && aligned16(dout))
        gelu_backward_kernel<VEC, T><<<ceil_div(N / VEC, FLAT_THREADS), FLAT_THREADS, 0, cx->stream>>>(dinp, inp, dout, N);
    else
        gelu_backward_kernel<1, T><<<ceil_div(N, FLAT_THREADS), FLAT_THREADS, 0, cx->stream>>>(dinp, inp, dout, N);
    CUDA_LAUNCH_CHECK(cx->rank, "gelu_backward_kernel");
}
static void gelu_backward_cuda(CudaCtx* cx, float* dinp, const float* inp, const float* dout, long N) {
    gelu_backward_launch(cx, dinp, inp, dout, N);
}
static void gelu_backward_bf16_cuda(CudaCtx* cx, bf16* dinp, const bf16* inp_kept, const float* dout, long N) {
    gelu_backward_launch(cx, dinp, inp_kept, dout, N);
}

// ----------------------------------------------------------------------------
// Causal self-attention on this rank's NH heads, llm.c style: permute q, k, v to (B, NH, T, hs), two
// strided-batched GEMMs around a causal softmax kernel, permute back. The full (T, T) products are
// computed (the upper triangle is wasted work); the softmax writes exact zeros there, as the CPU op.

// dst: `parts` tensors (B, NH, T, hs), `part_stride` floats apart <- src (B, T, parts, NH, hs).
// One block per (b, t) row: reads of the row are contiguous, writes contiguous per head.
__global__ void heads_split_kernel(float* dst, const float* src, int T, int NH, int hs, int parts, long part_stride) {
    long row = blockIdx.x;
    long b = row / T;
    int t = (int)(row - b * T);
    int C = NH * hs;
    const float* s = src + row * parts * C;
    for (int c = threadIdx.x; c < parts * C; c += blockDim.x) {
        int p = c / C, r = c - p * C, h = r / hs, d = r - h * hs;
        dst[p * part_stride + ((b * NH + h) * T + t) * hs + d] = s[c];
    }
}

// dst (B, T, parts, NH, hs) <- src: `parts` tensors (B, NH, T, hs), `part_stride` floats apart. Every
// element of dst is written.
__global__ void heads_merge_kernel(float* dst, const float* src, int T, int NH, int hs, int parts, long part_stride) {
    long row = blockIdx.x;
    long b = row / T;
    int t = (int)(row - b * T);
    int C = NH * hs;
    float* o = dst + row * parts * C;
    for (int c = threadIdx.x; c < parts * C; c += blockDim.x) {
        int p = c / C, r = c - p * C, h = r / hs, d = r - h * hs;
        o[c] = src[p * part_stride + ((b * NH + h) * T + t) * hs + d];
    }
}

// att (R, T) in place, R = B*NH*T rows; row r is query t = r % T and holds the scaled scores q.k.
// att[r][i] = exp(att[r][i] - max) / sum for i <= t (max and sum over i <= t), 0 for i > t.
// A warp per row: max, then the sum of exps, then the probabilities, as the CPU op computes them.
template <int VEC>
__global__ void softmax_causal_forward_kernel(float* att, long R, int T) {
    long r = (long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (r >= R) return;
    int lane = threadIdx.x % 32;
    int t = (int)(r % T);
    float* x = att + r * T;
    float m = -FLT_MAX;
    for (int i = lane * VEC; i <= t; i += 32 * VEC) {
        Fv<VEC> a = ldv<VEC>(x + i);  // with VEC = 4, T % 4 == 0, so i + 3 < T even where i + 3 > t
        for (int k = 0; k < VEC; k++)
            if (i + k <= t) m = fmaxf(m, a.v[k]);
    }
    m = warp_max(m);
    float s = 0.0f;
    for (int i = lane * VEC; i <= t; i += 32 * VEC) {
        Fv<VEC> a = ldv<VEC>(x + i);
        for (int k = 0; k < VEC; k++)
            if (i + k <= t) s += expf(a.v[k] - m);
    }
    float inv = 1.0f / warp_sum(s);
    for (int i = lane * VEC; i < T; i += 32 * VEC) {
        Fv<VEC> a;
        if (i <= t) a = ldv<VEC>(x + i);
        for (int k = 0; k < VEC; k++) a.v[k] = i + k <= t ? expf(a.v[k] - m) * inv : 0.0f;
        stv<VEC>(x + i, a);
    }
}

// datt (R, T) in place -> d(scaled scores): for i <= t, att[i] * (datt[i] - sum_{j<=t} att[j] datt[j]) * scale;
// 0 for i > t. A warp per row.
template <int VEC>
__global__ void softmax_causal_backward_kernel(float* datt, const float* att, long R, int T, float scale) {
    long r = (long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (r >= R) return;
    int lane = threadIdx.x % 32;
    int t = (int)(r % T);
    float* d = datt + r * T;
    const float* a = att + r * T;
    float dot = 0.0f;
    for (int i = lane * VEC; i <= t; i += 32 * VEC) {
        Fv<VEC> av = ldv<VEC>(a + i), dv = ldv<VEC>(d + i);
        for (int k = 0; k < VEC; k++)
            if (i + k <= t) dot += av.v[k] * dv.v[k];
    }
    dot = warp_sum(dot);
    for (int i = lane * VEC; i < T; i += 32 * VEC) {
        Fv<VEC> av, dv;
        if (i <= t) { av = ldv<VEC>(a + i); dv = ldv<VEC>(d + i); }
        for (int k = 0; k < VEC; k++) dv.v[k] = i + k <= t ? av.v[k] * (dv.v[k] - dot) * scale : 0.0f;
        stv<VEC>(d + i, dv);
    }
}

// att (B, NH, T, T) = the probabilities of attention_forward alone, bit for bit (-r 3 recomputes them
// in the backward). Leaves q, k, v permuted in the scratch, where attention_forward picks up v.
static void attention_probs_cuda(CudaCtx* cx, float* att, const float* qkv, int B, int T, int NH, int hs) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    long BTC = (long)B * T * NH * hs, TT = (long)T * T, Ths = (long)T * hs;
    int BH = B * NH;
    float* s = (float*)cuda_scratch(cx, (void**)&cx->attn, &cx->attn_bytes, 4 * BTC * sizeof(float));
    float *q = s, *k = s + BTC;
    heads_split_kernel<<<B * T, 256, 0, cx->stream>>>(q, qkv, T, NH, hs, 3, BTC);
    CUDA_LAUNCH_CHECK(cx->rank, "heads_split_kernel");
    // att[bh] (T, T) = (q[bh] (T, hs) . k[bh]^T) / sqrt(hs), the scale folded into alpha
    float scale = 1.0f / sqrtf((float)hs);
    gemm_cuda(cx, false, true, T, T, hs, scale, q, hs, Ths, k, hs, Ths, 0.0f, att, T, TT, BH);
    long R = (long)BH * T;
    if (T % 4 == 0 && aligned16(att))
        softmax_causal_forward_kernel<4><<<ceil_div(R, ROWS_PER_BLOCK), ROW_THREADS, 0, cx->stream>>>(att, R, T);
    else
        softmax_causal_forward_kernel<1><<<ceil_div(R, ROWS_PER_BLOCK), ROW_THREADS, 0, cx->stream>>>(att, R, T);
    CUDA_LAUNCH_CHECK(cx->rank, "softmax_causal_forward_kernel");
}

// qkv (B, T, 3*NH*hs): q, k, v blocks of NH*hs channels each, head h at [h*hs, (h+1)*hs) in each.
// out (B, T, NH*hs) = softmax(q k^T / sqrt(hs), causal) v;  att (B, NH, T, T) saves the probabilities.
static void attention_forward_cuda(CudaCtx* cx, float* out, float* att, const float* qkv, int B, int T, int NH, int hs) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    attention_probs_cuda(cx, att, qkv, B, T, NH, hs);
    long BTC = (long)B * T * NH * hs, TT = (long)T * T, Ths = (long)T * hs;
    float* s = (float*)cuda_scratch(cx, (void**)&cx->attn, &cx->attn_bytes, 4 * BTC * sizeof(float));  // as left above
    float *v = s + 2 * BTC, *y = s + 3 * BTC;
    // y[bh] (T, hs) = att[bh] (T, T) . v[bh] (T, hs)
    gemm_cuda(cx, false, false, T, hs, T, 1.0f, att, T, TT, v, hs, Ths, 0.0f, y, hs, Ths, B * NH);
    heads_merge_kernel<<<B * T, 256, 0, cx->stream>>>(out, y, T, NH, hs, 1, BTC);
    CUDA_LAUNCH_CHECK(cx->rank, "heads_merge_kernel");
}

// dqkv (B, T, 3*NH*hs) = gradient of attention_forward given dout (B, T, NH*hs)   (written)
static void attention_backward_cuda(CudaCtx* cx, float* dqkv, const float* dout, const float* qkv, const float* att,
                                    int B, int T, int NH, int hs) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    long BTC = (long)B * T * NH * hs, TT = (long)T * T, Ths = (long)T * hs;
    int BH = B * NH;
    // q, k, v | dy | dq, dk, dv (adjacent, merged back in one pass) | datt (B, NH, T, T)
    float* s = (float*)cuda_scratch(cx, (void**)&cx->attn, &cx->attn_bytes, (7 * BTC + (long)BH * TT) * sizeof(float));
    float *q = s, *k = s + BTC, *v = s + 2 * BTC, *dy = s + 3 * BTC;
    float *dq = s + 4 * BTC, *dk = s + 5 * BTC, *dv = s + 6 * BTC, *datt = s + 7 * BTC;
    heads_split_kernel<<<B * T, 256, 0, cx->stream>>>(q, qkv, T, NH, hs, 3, BTC);
    CUDA_LAUNCH_CHECK(cx->rank, "heads_split_kernel");
    heads_split_kernel<<<B * T, 256, 0, cx->stream>>>(dy, dout, T, NH, hs, 1, BTC);
    CUDA_LAUNCH_CHECK(cx->rank, "heads_split_kernel");
    // through y = att . v:  datt (T, T) = dy (T, hs) . v^T;  dv (T, hs) = att^T (T, T) . dy (T, hs)
    gemm_cuda(cx, false, true, T, T, hs, 1.0f, dy, hs, Ths, v, hs, Ths, 0.0f, datt, T, TT, BH);
    gemm_cuda(cx, true, false, T, hs, T, 1.0f, att, T, TT, dy, hs, Ths, 0.0f, dv, hs, Ths, BH);
    // through the softmax and the 1/sqrt(hs) scale, in place: datt becomes d(q.k)
    float scale = 1.0f / sqrtf((float)hs);
    long R = (long)BH * T;
    if (T % 4 == 0 && aligned16(att) && aligned16(datt))
        softmax_causal_backward_kernel<4><<<ceil_div(R, ROWS_PER_BLOCK), ROW_THREADS, 0, cx->stream>>>(datt, att, R, T, scale);
    else
        softmax_causal_backward_kernel<1><<<ceil_div(R, ROWS_PER_BLOCK), ROW_THREADS, 0, cx->stream>>>(datt, att, R, T, scale);
    CUDA_LAUNCH_CHECK(cx->rank, "softmax_causal_backward_kernel");
    // through q.k^T:  dq (T, hs) = dpre (T, T) . k (T, hs);  dk (T, hs) = dpre^T (T, T) . q (T, hs)
    gemm_cuda(cx, false, false, T, hs, T, 1.0f, datt, T, TT, k, hs, Ths, 0.0f, dq, hs, Ths, BH);
    gemm_cuda(cx, true, false, T, hs, T, 1.0f, datt, T, TT, q, hs, Ths, 0.0f, dk, hs, Ths, BH);
    heads_merge_kernel<<<B * T, 256, 0, cx->stream>>>(dqkv, dq, T, NH, hs, 3, BTC);
    CUDA_LAUNCH_CHECK(cx->rank, "heads_merge_kernel");
}

// ----------------------------------------------------------------------------
// Fused causal attention (FlashAttention-2), the CUDA twin of attention_fused_forward_cpu and
// attention_fused_backward_cpu: the same tiles, the same split of the work, no (T, T) buffer.
//
// Tiles: 64 queries x 64 keys (ATT_TILE, shared with the CPU op), 256 threads as a 16 x 16 grid
// (tx = thread % 16, ty = thread / 16). A thread owns the 4 x 4 scores of rows ty + 16i and columns
// tx + 16j (i, j < 4), so each value it reads from shared memory feeds 4 FMAs, and its output
// accumulators are rows ty + 16i by dims tx + 16k, k < ATT_DK = ceil(hs / 16) rounded to 1, 2, 4, 8
// (a template parameter: 4 x 8 accumulators at hs = 128). A row's 16 owners are the lanes of one
// half-warp, so row max and sum are 4 xor-shuffles. Rows of q, k, v, dout tiles sit in shared memory
// with a stride of 16 ATT_DK + 1 floats: odd, so the 16 rows the lanes of a half-warp read at one d fall
// in 16 banks; the columns past hs are zeros, so inner loops need no bounds. The probability tile has
// stride 65 for the same reason.
//
// Shared memory per block, fp32 (the kernels set cudaFuncAttributeMaxDynamicSharedMemorySize):
//   forward: q, k, v tiles + P          = (3 * 64 * (16 DK + 1) + 64 * 65) * 4 B: 65.0 KB at hs 64, 113.0 KB at hs 128
//   dk/dv and dq: q, k, v, dout + P + lse, D = (4 * 64 * (16 DK + 1) + 64 * 65 + 128) * 4 B: 81.8 KB at hs 64, 145.8 KB at hs 128
// sm_80 (A100) gives a block up to 163 KB (164 KB per SM, 1 KB of it reserved per block), sm_90
// (H100/H200) up to 227 KB (228 KB per SM). At hs 64 (GPT-2): forward 2 blocks (16 warps) per SM on
// sm_80, 3 on sm_90; backward 1 on sm_80, 2 on sm_90. At hs 128 everything still fits one block on
// sm_80 (145.8 KB < 163 KB). Why 64 x 64: a thread's 4 x 4 scores cost 8 shared loads per 16 FMAs; 32-wide
// tiles on 256 threads would be 2 x 2 (4 loads per 4 FMAs, shared-memory bound), and 128-wide ones do
// not fit the backward's four row tiles at hs 128 on sm_80.
// Registers: the 256-thread blocks allow 255 per thread; see `nvcc -Xptxas -v` below for what they use.
//   ptxas -v (CUDA 13), fp32, registers per thread of attention_fused_*_kernel<DK>, no spills in any:
//              forward <1,2,4,8>   dkdv <1,2,4,8>     dq <1,2,4,8>      dsum
//     sm_80:   80 104  64  98      80  80 123 128     64  64  80 102    29
//     sm_90:   80  64  64  98      64  80 127 128     64  79  79 127    30
//   at most 128 x 256 threads = 32K of the SM's 64K registers: shared memory, not registers, sets the
//   blocks per SM.
//
// Deterministic: no atomics. Each block owns its outputs: the forward and dq per (b, h, query tile), dk
// and dv per (b, h, key tile), looping over the query tiles at or below the diagonal in order; D per
// row by one warp. Causal: a query tile visits key tiles 0..its own; a key tile visits query tiles from
// its own on; only the diagonal tile is masked. The tile of the most work is launched first.
//
// Storage: q, k, v, out and dout are read through att_ld, templated on the element type (Tq: q, k and v),
// so bf16 storage is an instantiation away (the scores, softmax, lse and sums stay fp32, as DESIGN.md
// section 13 asks); built: fp32 everywhere, and a --dtype bf16 run's q, k and v (the layer keeps qkv in bf16
// storage) and out (its kept atty, for D) in bf16, widened exactly as a tile is loaded into shared memory:
// the bits of the same values in fp32 words.
#define ATT_THREADS 256

__device__ __forceinline__ float att_ld(const float* p) { return *p; }
__device__ __forceinline__ float att_ld(const bf16* p) { return bf16_to_float(*p); }
__device__ __forceinline__ void att_st(float* p, float v) { *p = v; }
__device__ __forceinline__ void att_st(bf16* p, float v) { *p = bf16_round(v); }  // (a bf16 run's dqkv)

// sm (64, 16 DK + 1) <- rows r0..r0+63 of src (row stride ld), columns 0..hs-1; zeros past T and past hs.
// HP: the tile's row stride in shared memory (the tensor-core kernels' is 16 DK + 4)
template <int DK, class Tm>
__device__ void att_load_tile(float* sm, const Tm* src, long ld, int r0, int T, int hs, int HP = 16 * DK + 1) {
    const int W = 16 * DK;
    for (int i = threadIdx.x; i < ATT_TILE * W; i += ATT_THREADS) {
        int r = i / W, d = i - r * W;
        sm[r * HP + d] = (r0 + r < T && d < hs) ? att_ld(src + (long)(r0 + r) * ld + d) : 0.0f;
    }
}

// The backward's query tile i0 of head h of batch row b: q (from qkv) and dout into sq and sdo (row stride
// HP, as att_load_tile), and the rows' lse and D into sl and sd (bh = b * NH + h; 0 past T)
template <int DK, class Tq>
__device__ void att_load_query_tile(float* sq, float* sdo, float* sl, float* sd, const Tq* qkv, const float* dout, const float* lse,
                                    const float* dsum, int b, int h, int NH, int i0, int T, int hs, int HP = 16 * DK + 1) {
    const int C = NH * hs;
    att_load_tile<DK>(sq, qkv + (long)b * T * 3 * C + h * hs, 3L * C, i0, T, hs, HP);
    att_load_tile<DK>(sdo, dout + (long)b * T * C + h * hs, C, i0, T, hs, HP);
    if (threadIdx.x < ATT_TILE) {
        const int r = i0 + threadIdx.x;
        const long bh = (long)b * NH + h;
        sl[threadIdx.x] = r < T ? lse[bh * T + r] : 0.0f;
        sd[threadIdx.x] = r < T ? dsum[bh * T + r] : 0.0f;
    }
}

// s[i][j] = sum_d a[ra(i)][d] * b[rb(j)][d] over the tile's 16 DK columns, rows ra(i) = ia + 16 i, rb(j) = jb + 16 j
template <int DK>
__device__ __forceinline__ void att_dots(float s[4][4], const float* a, int ia, const float* b, int jb) {
    const int HP = 16 * DK + 1;
    #pragma unroll
    for (int i = 0; i < 4; i++)
        #pragma unroll
        for (int j = 0; j < 4; j++) s[i][j] = 0.0f;
    for (int d = 0; d < 16 * DK; d++) {
        float av[4], bv[4];
        #pragma unroll
        for (int i = 0; i < 4; i++) { av[i] = a[(ia + 16 * i) * HP + d]; bv[i] = b[(jb + 16 * i) * HP + d]; }
        #pragma unroll
        for (int i = 0; i < 4; i++)
            #pragma unroll
            for (int j = 0; j < 4; j++) s[i][j] = fmaf(av[i], bv[j], s[i][j]);
    }
}

// the max and the sum over a row's 16 owners (a half-warp), the same on each of them
__device__ __forceinline__ float att_row_max(float v) {
    #pragma unroll
    for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float att_row_sum(float v) {
    #pragma unroll
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// out (B, T, NH*hs), lse (B, NH, T) <- qkv (B, T, 3*NH*hs). Grid (B*NH, query tiles), the last tile first.
template <int DK, class Tq>
__global__ void __launch_bounds__(ATT_THREADS) attention_fused_forward_kernel(float* out, float* lse, const Tq* qkv, int T,
                                                                             int NH, int hs, float scale) {
    extern __shared__ float att_sm[];
    const int HP = 16 * DK + 1, tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH, qt = gridDim.y - 1 - blockIdx.y;
    const int C = NH * hs, i0 = qt * ATT_TILE;
    const long C3 = 3L * C;
    float *sq = att_sm, *sk = sq + ATT_TILE * HP, *sv = sk + ATT_TILE * HP, *sp = sv + ATT_TILE * HP;  // sp (64, 65)
    const Tq* base = qkv + (long)b * T * C3 + h * hs;
    att_load_tile<DK>(sq, base, C3, i0, T, hs);
    float o[4][DK], m[4], l[4];
    #pragma unroll
    for (int i = 0; i < 4; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
        #pragma unroll
        for (int k = 0; k < DK; k++) o[i][k] = 0.0f;
    }
    for (int kt = 0; kt <= qt; kt++) {
        const int j0 = kt * ATT_TILE;
        __syncthreads();  // the last tile's readers of sk, sv and sp are done
        att_load_tile<DK>(sk, base + C, C3, j0, T, hs);
        att_load_tile<DK>(sv, base + 2 * C, C3, j0, T, hs);
        __syncthreads();
        float s[4][4];
        att_dots<DK>(s, sq, ty, sk, tx);
        #pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = i0 + ty + 16 * i;
            float mx = -INFINITY;
            #pragma unroll
            for (int j = 0; j < 4; j++) {
                const int c = j0 + tx + 16 * j;
                s[i][j] = (c <= r && c < T) ? s[i][j] * scale : -INFINITY;
                mx = fmaxf(mx, s[i][j]);
            }
            // every row sees key j0 (at most its own position), so the new max is finite
            const float mnew = fmaxf(m[i], att_row_max(mx)), corr = expf(m[i] - mnew);
            float sum = 0.0f;
            #pragma unroll
            for (int j = 0; j < 4; j++) {
                s[i][j] = expf(s[i][j] - mnew);  // 0 where masked
                sum += s[i][j];
                sp[(ty + 16 * i) * 65 + tx + 16 * j] = s[i][j];
            }
            l[i] = l[i] * corr + att_row_sum(sum);
            m[i] = mnew;
            #pragma unroll
            for (int k = 0; k < DK; k++) o[i][k] *= corr;
        }
        __syncthreads();
        for (int c = 0; c < ATT_TILE; c++) {
            float vv[DK];
            #pragma unroll
            for (int k = 0; k < DK; k++) vv[k] = sv[c * HP + tx + 16 * k];
            #pragma unroll
            for (int i = 0; i < 4; i++) {
                const float p = sp[(ty + 16 * i) * 65 + c];
                #pragma unroll
                for (int k = 0; k < DK; k++) o[i][k] = fmaf(p, vv[k], o[i][k]);
            }
        }
    }
    #pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = i0 + ty + 16 * i;
        if (r >= T) continue;
        const float inv = 1.0f / l[i];
        #pragma unroll
        for (int k = 0; k < DK; k++) {
            const int d = tx + 16 * k;
            if (d < hs) att_st(out + ((long)b * T + r) * C + h * hs + d, o[i][k] * inv);
        }
        if (tx == 0) lse[(long)bh * T + r] = m[i] + logf(l[i]);
    }
}

// dsum (B, NH, T) = rowsum(dout * out) per head: a warp per (b, t, h), lanes over the head's dims. To: out's
// storage, fp32 or (a bf16 run's kept atty) bf16
template <class Tm, class To>
__global__ void attention_fused_dsum_kernel(float* dsum, const Tm* dout, const To* out, int B, int T, int NH, int hs) {
    const long w = ((long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (w >= (long)B * T * NH) return;
    const long row = w / NH;  // b * T + t
    const int h = (int)(w % NH);
    const long off = row * NH * hs + h * hs;
    float s = 0.0f;
    for (int d = lane; d < hs; d += 32) s += att_ld(dout + off + d) * att_ld(out + off + d);
    s = warp_sum(s);
    if (lane == 0) dsum[((row / T) * NH + h) * T + row % T] = s;
}

// dk, dv (in dqkv) <- key tile kt of (b, h), over the query tiles at or after it. Grid (B*NH, key tiles),
// the first (the most query tiles) first. The tile is held transposed: entry (c, r) = key ty + 16i, query tx + 16j.
template <int DK, class Tq, class To>
__global__ void __launch_bounds__(ATT_THREADS) attention_fused_dkdv_kernel(To* dqkv, const float* dout, const Tq* qkv, const float* lse,
                                                                          const float* dsum, int T, int NH, int hs, float scale) {
    extern __shared__ float att_sm[];
    const int HP = 16 * DK + 1, tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH, kt = blockIdx.y, NT = gridDim.y;
    const int C = NH * hs, j0 = kt * ATT_TILE;
    const long C3 = 3L * C;
    float *sk = att_sm, *sv = sk + ATT_TILE * HP, *sq = sv + ATT_TILE * HP, *sdo = sq + ATT_TILE * HP;
    float *sp = sdo + ATT_TILE * HP, *sl = sp + ATT_TILE * 65, *sd = sl + ATT_TILE;
    const Tq* base = qkv + (long)b * T * C3 + h * hs;
    att_load_tile<DK>(sk, base + C, C3, j0, T, hs);
    att_load_tile<DK>(sv, base + 2 * C, C3, j0, T, hs);
    float dk[4][DK], dv[4][DK];
    #pragma unroll
    for (int i = 0; i < 4; i++)
        #pragma unroll
        for (int k = 0; k < DK; k++) dk[i][k] = dv[i][k] = 0.0f;
    for (int qt = kt; qt < NT; qt++) {
        const int i0 = qt * ATT_TILE;
        __syncthreads();  // the last tile's readers of sq, sdo, sp, sl, sd are done
        att_load_query_tile<DK>(sq, sdo, sl, sd, qkv, dout, lse, dsum, b, h, NH, i0, T, hs);
        __syncthreads();
        float p[4][4], g[4][4];
        att_dots<DK>(p, sk, ty, sq, tx);   // s^T: key ty + 16i against query tx + 16j
        att_dots<DK>(g, sv, ty, sdo, tx);  // dP^T = v . dout
        #pragma unroll
        for (int i = 0; i < 4; i++)
            #pragma unroll
            for (int j = 0; j < 4; j++) {
                const int c = j0 + ty + 16 * i, rl = tx + 16 * j, r = i0 + rl;
                p[i][j] = (c <= r && r < T) ? expf(p[i][j] * scale - sl[rl]) : 0.0f;
                g[i][j] = p[i][j] * (g[i][j] - sd[rl]) * scale;
                sp[(ty + 16 * i) * 65 + rl] = p[i][j];
            }
        __syncthreads();
        for (int r = 0; r < ATT_TILE; r++) {  // dv += P^T dout
            float x[DK];
            #pragma unroll
            for (int k = 0; k < DK; k++) x[k] = sdo[r * HP + tx + 16 * k];
            #pragma unroll
            for (int i = 0; i < 4; i++) {
                const float pv = sp[(ty + 16 * i) * 65 + r];
                #pragma unroll
                for (int k = 0; k < DK; k++) dv[i][k] = fmaf(pv, x[k], dv[i][k]);
            }
        }
        __syncthreads();
        #pragma unroll
        for (int i = 0; i < 4; i++)
            #pragma unroll
            for (int j = 0; j < 4; j++) sp[(ty + 16 * i) * 65 + tx + 16 * j] = g[i][j];
        __syncthreads();
        for (int r = 0; r < ATT_TILE; r++) {  // dk += dS^T q
            float x[DK];
            #pragma unroll
            for (int k = 0; k < DK; k++) x[k] = sq[r * HP + tx + 16 * k];
            #pragma unroll
            for (int i = 0; i < 4; i++) {
                const float gv = sp[(ty + 16 * i) * 65 + r];
                #pragma unroll
                for (int k = 0; k < DK; k++) dk[i][k] = fmaf(gv, x[k], dk[i][k]);
            }
        }
    }
    #pragma unroll
    for (int i = 0; i < 4; i++) {
        const int c = j0 + ty + 16 * i;
        if (c >= T) continue;
        To* row = dqkv + ((long)b * T + c) * C3 + h * hs;
        #pragma unroll
        for (int k = 0; k < DK; k++) {
            const int d = tx + 16 * k;
            if (d < hs) { att_st(row + C + d, dk[i][k]); att_st(row + 2 * C + d, dv[i][k]); }
        }
    }
}

// dq (in dqkv) <- query tile qt of (b, h), over the key tiles up to the diagonal. Grid (B*NH, query tiles),
// the last first. Entry (r, c) = query ty + 16i, key tx + 16j.
template <int DK, class Tq, class To>
__global__ void __launch_bounds__(ATT_THREADS) attention_fused_dq_kernel(To* dqkv, const float* dout, const Tq* qkv, const float* lse,
                                                                        const float* dsum, int T, int NH, int hs, float scale) {
    extern __shared__ float att_sm[];
    const int HP = 16 * DK + 1, tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH, qt = gridDim.y - 1 - blockIdx.y;
    const int C = NH * hs, i0 = qt * ATT_TILE;
    const long C3 = 3L * C;
    float *sq = att_sm, *sdo = sq + ATT_TILE * HP, *sk = sdo + ATT_TILE * HP, *sv = sk + ATT_TILE * HP;
    float *sp = sv + ATT_TILE * HP, *sl = sp + ATT_TILE * 65, *sd = sl + ATT_TILE;
    const Tq* base = qkv + (long)b * T * C3 + h * hs;
    att_load_query_tile<DK>(sq, sdo, sl, sd, qkv, dout, lse, dsum, b, h, NH, i0, T, hs);
    float dq[4][DK];
    #pragma unroll
    for (int i = 0; i < 4; i++)
        #pragma unroll
        for (int k = 0; k < DK; k++) dq[i][k] = 0.0f;
    for (int kt = 0; kt <= qt; kt++) {
        const int j0 = kt * ATT_TILE;
        __syncthreads();
        att_load_tile<DK>(sk, base + C, C3, j0, T, hs);
        att_load_tile<DK>(sv, base + 2 * C, C3, j0, T, hs);
        __syncthreads();
        float p[4][4], g[4][4];
        att_dots<DK>(p, sq, ty, sk, tx);
        att_dots<DK>(g, sdo, ty, sv, tx);
        #pragma unroll
        for (int i = 0; i < 4; i++)
            #pragma unroll
            for (int j = 0; j < 4; j++) {
                const int rl = ty + 16 * i, r = i0 + rl, c = j0 + tx + 16 * j;
                const float pv = (c <= r && r < T) ? expf(p[i][j] * scale - sl[rl]) : 0.0f;
                sp[rl * 65 + tx + 16 * j] = pv * (g[i][j] - sd[rl]) * scale;
            }
        __syncthreads();
        for (int c = 0; c < ATT_TILE; c++) {  // dq += dS k
            float x[DK];
            #pragma unroll
            for (int k = 0; k < DK; k++) x[k] = sk[c * HP + tx + 16 * k];
            #pragma unroll
            for (int i = 0; i < 4; i++) {
                const float gv = sp[(ty + 16 * i) * 65 + c];
                #pragma unroll
                for (int k = 0; k < DK; k++) dq[i][k] = fmaf(gv, x[k], dq[i][k]);
            }
        }
    }
    #pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = i0 + ty + 16 * i;
        if (r >= T) continue;
        To* row = dqkv + ((long)b * T + r) * C3 + h * hs;
        #pragma unroll
        for (int k = 0; k < DK; k++) {
            const int d = tx + 16 * k;
            if (d < hs) att_st(row + d, dq[i][k]);
        }
    }
}

// ----------------------------------------------------------------------------
// Fused attention on the tensor cores: the same tiles, split of the work and contract as the kernels above,
// with each tile's matrix products (S = q k^T, dP = dout v^T, O += P v, dv += P^T dout, dk += dS^T q,
// dq += dS k) done by warps on TF32 tensor cores (wmma, m16n16k8: sm_80 and newer) instead of by threads on
// the CUDA cores. The fp32 kernels above reach at most half the CUDA cores' rate (8 shared-memory loads per
// 16 FMAs: ~33 TFLOP/s on an H100, whose tensor cores do 495 in TF32 and 989 in bf16), and at GPT-2's
// T = 1024 the causal half of attention's products is about a tenth of a layer's FLOPs, so on the CUDA
// cores it would take longer than all of the layer's matmuls in bf16. What stays on
// the threads: the online softmax, P = exp(S - lse) and dS = P (dP - D), elementwise over a tile in shared
// memory (a fragment's layout is the hardware's secret, so nothing reads a fragment's elements by position).
//
// Numbers: the products' inputs rounded to TF32 (10 fraction bits), products summed in fp32, as cuBLAS does
// the matmuls of a run with TF32 on (cx->tf32, the default); the softmax, its statistics and the sums over
// tiles in fp32. With TF32 off (the tests that compare tightly) the fp32 kernels above run instead, and so
// they do below sm_80 or where a block cannot have the shared memory these need.
//
// A block: 8 warps, 256 threads, as above. Shared memory (floats): q, k, v, dout and O tiles of 64 rows with
// stride HS = 16 DK + 4 (wmma wants 16-byte multiples, and 4 more than the width spreads the rows over the
// banks), the score tiles S/P and dP/dS 64 x 68. Forward: q, k, v, O + S = 85.0 KB at hs 64, 149.0 KB at
// hs 128; backward: q, k, v, dout + two score tiles + lse, D = 102.5 / 166.5 KB (hs 128 on sm_80, 163 KB a
// block, goes to the fp32 kernels): at hs 64 two blocks an SM on sm_90 (228 KB), one on sm_80 (164 KB).
// Each 16 x 16 output tile of a product is one warp's, its k loop in order: no atomics, the same bits on
// every run.
#define ATT_TC_PS (ATT_TILE + 4)  // the row stride of a score tile in shared memory
namespace wmma = nvcuda::wmma;
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800  // (TF32 wmma is sm_80's: below it the kernels trap, never launched)
typedef wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> AttTcA;   // A (m, k) at a[m ld + k]
typedef wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::col_major> AttTcAt;  // at a[k ld + m]
typedef wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> AttTcB;   // B (k, n) at b[k ld + n]
typedef wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> AttTcBt;  // at b[n ld + k]
typedef wmma::fragment<wmma::accumulator, 16, 16, 8, float> AttTcC;

// acc (16 x 16) += A (16 x kn) . B (kn x 16) from shared memory, kn a multiple of 8: a and b point at the
// first k, a8 and b8 are how far 8 more k move them (8 for a row-major A or column-major B, 8 ld otherwise)
template <class FA, class FB>
__device__ __forceinline__ void att_tc_mma(AttTcC& acc, const float* a, int lda, int a8, const float* b, int ldb, int b8, int kn) {
    FA fa;
    FB fb;
    for (int k = 0; k < kn; k += 8, a += a8, b += b8) {
        wmma::load_matrix_sync(fa, a, lda);
        wmma::load_matrix_sync(fb, b, ldb);
        for (int e = 0; e < fa.num_elements; e++) fa.x[e] = wmma::__float_to_tf32(fa.x[e]);
        for (int e = 0; e < fb.num_elements; e++) fb.x[e] = wmma::__float_to_tf32(fb.x[e]);
        wmma::mma_sync(acc, fa, fb, acc);
    }
}

// sc (64 x 64, stride ATT_TC_PS) = x (64 rows) . y (64 rows)^T over 16 DK columns: two 16 x 16 tiles a warp.
// diag: the tile on the diagonal, where tiles wholly above it (key block > query block) are skipped: every
// reader masks those entries without reading them.
template <int DK>
__device__ __forceinline__ void att_tc_scores(float* sc, const float* x, const float* y, bool diag) {
    constexpr int HS = 16 * DK + 4;
    for (int t = threadIdx.x / 32; t < 16; t += ATT_THREADS / 32) {
        const int ti = t / 4, tj = t % 4;
        if (diag && tj > ti) continue;
        AttTcC acc;
        wmma::fill_fragment(acc, 0.0f);
        att_tc_mma<AttTcA, AttTcBt>(acc, x + ti * 16 * HS, HS, 8, y + tj * 16 * HS, HS, 8, 16 * DK);
        wmma::store_matrix_sync(sc + ti * 16 * ATT_TC_PS + tj * 16, acc, ATT_TC_PS, wmma::mem_row_major);
    }
}

#endif

// out, lse <- qkv, as attention_fused_forward_kernel. O is kept in shared memory (so): its rows are rescaled
// by the threads that own them when a row's max grows, and each warp adds P v into its output tiles there.
template <int DK, class Tq>
__global__ void __launch_bounds__(ATT_THREADS) attention_tc_forward_kernel(float* out, float* lse, const Tq* qkv, int T, int NH,
                                                                          int hs, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap();  // (att_tc never launches these below sm_80)
#else
    extern __shared__ __align__(128) float att_tc_sm[];
    constexpr int HS = 16 * DK + 4, PS = ATT_TC_PS;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16, warp = threadIdx.x / 32;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH, qt = gridDim.y - 1 - blockIdx.y;
    const int C = NH * hs, i0 = qt * ATT_TILE;
    const long C3 = 3L * C;
    float *sq = att_tc_sm, *sk = sq + ATT_TILE * HS, *sv = sk + ATT_TILE * HS, *so = sv + ATT_TILE * HS, *ss = so + ATT_TILE * HS;
    const Tq* base = qkv + (long)b * T * C3 + h * hs;
    att_load_tile<DK>(sq, base, C3, i0, T, hs, HS);
    for (int i = threadIdx.x; i < ATT_TILE * HS; i += ATT_THREADS) so[i] = 0.0f;
    float m[4], l[4];
    #pragma unroll
    for (int i = 0; i < 4; i++) { m[i] = -INFINITY; l[i] = 0.0f; }
    for (int kt = 0; kt <= qt; kt++) {
        const int j0 = kt * ATT_TILE;
        __syncthreads();  // the last tile's readers of sk, sv, ss and so are done
        att_load_tile<DK>(sk, base + C, C3, j0, T, hs, HS);
        att_load_tile<DK>(sv, base + 2 * C, C3, j0, T, hs, HS);
        __syncthreads();
        att_tc_scores<DK>(ss, sq, sk, kt == qt);
        __syncthreads();
        // the online softmax of attention_fused_forward_kernel: thread (tx, ty) has rows ty + 16i, keys tx + 16j
        #pragma unroll
        for (int i = 0; i < 4; i++) {
            const int rl = ty + 16 * i, r = i0 + rl;
            float s[4], mx = -INFINITY;
            #pragma unroll
            for (int j = 0; j < 4; j++) {
                const int c = j0 + tx + 16 * j;
                s[j] = (c <= r && c < T) ? ss[rl * PS + tx + 16 * j] * scale : -INFINITY;
                mx = fmaxf(mx, s[j]);
            }
            const float mnew = fmaxf(m[i], att_row_max(mx)), corr = expf(m[i] - mnew);  // (key j0 <= r: finite)
            float sum = 0.0f;
            #pragma unroll
            for (int j = 0; j < 4; j++) {
                s[j] = expf(s[j] - mnew);  // 0 where masked
                sum += s[j];
                ss[rl * PS + tx + 16 * j] = s[j];
            }
            l[i] = l[i] * corr + att_row_sum(sum);
            m[i] = mnew;
            #pragma unroll
            for (int k = 0; k < DK; k++) so[rl * HS + tx + 16 * k] *= corr;
        }
        __syncthreads();
        // O += P v: output tile t is rows 16 (t / DK), dims 16 (t % DK); on the diagonal P is 0 past a row
        // block's last key, so its k loop stops there
        for (int t = warp; t < 4 * DK; t += ATT_THREADS / 32) {
            const int ti = t / DK, td = t % DK;
            AttTcC acc;
            wmma::load_matrix_sync(acc, so + ti * 16 * HS + td * 16, HS, wmma::mem_row_major);
            att_tc_mma<AttTcA, AttTcB>(acc, ss + ti * 16 * PS, PS, 8, sv + td * 16, HS, 8 * HS, kt == qt ? 16 * (ti + 1) : ATT_TILE);
            wmma::store_matrix_sync(so + ti * 16 * HS + td * 16, acc, HS, wmma::mem_row_major);
        }
    }
    __syncthreads();
    #pragma unroll
    for (int i = 0; i < 4; i++) {
        const int rl = ty + 16 * i, r = i0 + rl;
        if (r >= T) continue;
        const float inv = 1.0f / l[i];
        #pragma unroll
        for (int k = 0; k < DK; k++) {
            const int d = tx + 16 * k;
            if (d < hs) out[((long)b * T + r) * C + h * hs + d] = so[rl * HS + d] * inv;
        }
        if (tx == 0) lse[(long)bh * T + r] = m[i] + logf(l[i]);
    }
#endif
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
// The backward's shared part for one (query tile, key tile) pair: sp <- S = q k^T, sg <- dP = dout v^T,
// then by the threads sp <- P = exp(S scale - lse) and sg <- dS = P (dP - D) scale (rows are queries,
// columns keys; thread (tx, ty) has rows ty + 16i, keys tx + 16j; 0 where masked or past T)
template <int DK>
__device__ __forceinline__ void att_tc_probs(float* sp, float* sg, const float* sq, const float* sk, const float* sdo, const float* sv,
                                             const float* sl, const float* sd, int i0, int j0, int T, float scale) {
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    att_tc_scores<DK>(sp, sq, sk, i0 == j0);
    att_tc_scores<DK>(sg, sdo, sv, i0 == j0);
    __syncthreads();
    #pragma unroll
    for (int i = 0; i < 4; i++)
        #pragma unroll
        for (int j = 0; j < 4; j++) {
            const int rl = ty + 16 * i, cl = tx + 16 * j, r = i0 + rl, c = j0 + cl;
            const bool in = c <= r && r < T;
            const float p = in ? expf(sp[rl * ATT_TC_PS + cl] * scale - sl[rl]) : 0.0f;
            const float g = in ? p * (sg[rl * ATT_TC_PS + cl] - sd[rl]) * scale : 0.0f;
            sp[rl * ATT_TC_PS + cl] = p;
            sg[rl * ATT_TC_PS + cl] = g;
        }
    __syncthreads();
}

// a 64-row tile of 16 x 16 accumulators (n of them, this warp's: tile t = warp + 8 n, rows 16 (t / DK), dims
// 16 (t % DK)) written to rows r0.. of dst (row stride ld, up to T rows, hs columns) through st (64 x HS)
template <int DK, int NW, class To>
__device__ __forceinline__ void att_tc_write(To* dst, long ld, int r0, int T, int hs, float* st, AttTcC* acc) {
    constexpr int HS = 16 * DK + 4;
    #pragma unroll
    for (int n = 0; n < NW; n++) {
        const int t = threadIdx.x / 32 + (ATT_THREADS / 32) * n;
        if (t < 4 * DK) wmma::store_matrix_sync(st + (t / DK) * 16 * HS + (t % DK) * 16, acc[n], HS, wmma::mem_row_major);
    }
    __syncthreads();
    const int W = 16 * DK;
    for (int i = threadIdx.x; i < ATT_TILE * W; i += ATT_THREADS) {
        const int r = i / W, d = i - r * W;
        if (r0 + r < T && d < hs) att_st(dst + (long)(r0 + r) * ld + d, st[r * HS + d]);
    }
}
#endif

// dk, dv (in dqkv) <- key tile kt of (b, h), as attention_fused_dkdv_kernel; each warp keeps its tiles of dk
// and dv in fragments over the whole loop (no rescaling here)
template <int DK, class Tq, class To>
__global__ void __launch_bounds__(ATT_THREADS) attention_tc_dkdv_kernel(To* dqkv, const float* dout, const Tq* qkv, const float* lse,
                                                                       const float* dsum, int T, int NH, int hs, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap();
#else
    extern __shared__ __align__(128) float att_tc_sm[];
    constexpr int HS = 16 * DK + 4, PS = ATT_TC_PS, NW = (4 * DK + 7) / 8;
    const int warp = threadIdx.x / 32;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH, kt = blockIdx.y, NT = gridDim.y;
    const int C = NH * hs, j0 = kt * ATT_TILE;
    const long C3 = 3L * C;
    float *sk = att_tc_sm, *sv = sk + ATT_TILE * HS, *sq = sv + ATT_TILE * HS, *sdo = sq + ATT_TILE * HS;
    float *sp = sdo + ATT_TILE * HS, *sg = sp + ATT_TILE * PS, *sl = sg + ATT_TILE * PS, *sd = sl + ATT_TILE;
    const Tq* base = qkv + (long)b * T * C3 + h * hs;
    att_load_tile<DK>(sk, base + C, C3, j0, T, hs, HS);
    att_load_tile<DK>(sv, base + 2 * C, C3, j0, T, hs, HS);
    AttTcC dk[NW], dv[NW];
    #pragma unroll
    for (int n = 0; n < NW; n++) { wmma::fill_fragment(dk[n], 0.0f); wmma::fill_fragment(dv[n], 0.0f); }
    for (int qt = kt; qt < NT; qt++) {
        const int i0 = qt * ATT_TILE;
        __syncthreads();  // the last tile's readers of sq, sdo, sp, sg, sl, sd are done
        att_load_query_tile<DK>(sq, sdo, sl, sd, qkv, dout, lse, dsum, b, h, NH, i0, T, hs, HS);
        __syncthreads();
        att_tc_probs<DK>(sp, sg, sq, sk, sdo, sv, sl, sd, i0, j0, T, scale);
        // dv += P^T dout, dk += dS^T q over the tile's queries: A is P (or dS) read transposed; on the
        // diagonal the queries before a key block have P = 0, so its k loop starts at the block
        #pragma unroll
        for (int n = 0; n < NW; n++) {
            const int t = warp + (ATT_THREADS / 32) * n;
            if (t >= 4 * DK) continue;
            const int tk = t / DK, td = t % DK, q0 = qt == kt ? 16 * tk : 0;
            att_tc_mma<AttTcAt, AttTcB>(dv[n], sp + q0 * PS + tk * 16, PS, 8 * PS, sdo + q0 * HS + td * 16, HS, 8 * HS, ATT_TILE - q0);
            att_tc_mma<AttTcAt, AttTcB>(dk[n], sg + q0 * PS + tk * 16, PS, 8 * PS, sq + q0 * HS + td * 16, HS, 8 * HS, ATT_TILE - q0);
        }
    }
    __syncthreads();
    To* row = dqkv + (long)b * T * C3 + h * hs;
    att_tc_write<DK, NW>(row + C, C3, j0, T, hs, sq, dk);
    att_tc_write<DK, NW>(row + 2 * C, C3, j0, T, hs, sdo, dv);
#endif
}

// dq (in dqkv) <- query tile qt of (b, h), as attention_fused_dq_kernel
template <int DK, class Tq, class To>
__global__ void __launch_bounds__(ATT_THREADS) attention_tc_dq_kernel(To* dqkv, const float* dout, const Tq* qkv, const float* lse,
                                                                     const float* dsum, int T, int NH, int hs, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap();
#else
    extern __shared__ __align__(128) float att_tc_sm[];
    constexpr int HS = 16 * DK + 4, PS = ATT_TC_PS, NW = (4 * DK + 7) / 8;
    const int warp = threadIdx.x / 32;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH, qt = gridDim.y - 1 - blockIdx.y;
    const int C = NH * hs, i0 = qt * ATT_TILE;
    const long C3 = 3L * C;
    float *sq = att_tc_sm, *sdo = sq + ATT_TILE * HS, *sk = sdo + ATT_TILE * HS, *sv = sk + ATT_TILE * HS;
    float *sp = sv + ATT_TILE * HS, *sg = sp + ATT_TILE * PS, *sl = sg + ATT_TILE * PS, *sd = sl + ATT_TILE;
    const Tq* base = qkv + (long)b * T * C3 + h * hs;
    att_load_query_tile<DK>(sq, sdo, sl, sd, qkv, dout, lse, dsum, b, h, NH, i0, T, hs, HS);
    AttTcC dq[NW];
    #pragma unroll
    for (int n = 0; n < NW; n++) wmma::fill_fragment(dq[n], 0.0f);
    for (int kt = 0; kt <= qt; kt++) {
        const int j0 = kt * ATT_TILE;
        __syncthreads();
        att_load_tile<DK>(sk, base + C, C3, j0, T, hs, HS);
        att_load_tile<DK>(sv, base + 2 * C, C3, j0, T, hs, HS);
        __syncthreads();
        att_tc_probs<DK>(sp, sg, sq, sk, sdo, sv, sl, sd, i0, j0, T, scale);
        // dq += dS k: on the diagonal dS is 0 past a row block's last key
        #pragma unroll
        for (int n = 0; n < NW; n++) {
            const int t = warp + (ATT_THREADS / 32) * n;
            if (t >= 4 * DK) continue;
            const int ti = t / DK, td = t % DK;
            att_tc_mma<AttTcA, AttTcB>(dq[n], sg + ti * 16 * PS, PS, 8, sk + td * 16, HS, 8 * HS, kt == qt ? 16 * (ti + 1) : ATT_TILE);
        }
    }
    __syncthreads();
    att_tc_write<DK, NW>(dqkv + (long)b * T * C3 + h * hs, C3, i0, T, hs, sk, dq);
#endif
}

// the shared memory of the tensor-core kernels (forward: q, k, v, O and a score tile; backward: four row
// tiles, two score tiles, lse and D), and whether this rank's GPU runs them: TF32 on, sm_80 or newer
// (cx->tc_smem, 0 below), and a block may have that much
static size_t att_tc_smem(int dk, bool backward) {
    return ((size_t)4 * ATT_TILE * (16 * dk + 4) + (backward ? 2 : 1) * ATT_TILE * ATT_TC_PS + (backward ? 2 * ATT_TILE : 0)) * sizeof(float);
}
static bool att_tc(const CudaCtx* cx, int dk, bool backward) { return cx->tf32 && att_tc_smem(dk, backward) <= cx->tc_smem; }

// the accumulator columns per thread for head size hs (<= ATT_HS_MAX): 16 DK >= hs, DK in 1, 2, 4, 8
static int att_dk(int hs) { return hs <= 16 ? 1 : hs <= 32 ? 2 : hs <= 64 ? 4 : 8; }
// dynamic shared memory of a kernel with `tiles` row tiles (3 forward, 4 backward), the P tile, and in the
// backward the tile's lse and D
static size_t att_smem(int tiles, int dk, bool rows) {
    return ((size_t)tiles * ATT_TILE * (16 * dk + 1) + ATT_TILE * 65 + (rows ? 2 * ATT_TILE : 0)) * sizeof(float);
}

template <int DK, class Tq>
static void attention_fused_forward_launch(CudaCtx* cx, float* out, float* lse, const Tq* qkv, int B, int T, int NH, int hs) {
    dim3 grid(B * NH, ceil_div(T, ATT_TILE));
    if (att_tc(cx, DK, false)) {
        size_t sm = att_tc_smem(DK, false);
        CUDA_CHECK(cx->rank, cudaFuncSetAttribute(attention_tc_forward_kernel<DK, Tq>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        attention_tc_forward_kernel<DK, Tq><<<grid, ATT_THREADS, sm, cx->stream>>>(out, lse, qkv, T, NH, hs, 1.0f / sqrtf((float)hs));
        CUDA_LAUNCH_CHECK(cx->rank, "attention_tc_forward_kernel");
        return;
    }
    size_t sm = att_smem(3, DK, false);
    CUDA_CHECK(cx->rank, cudaFuncSetAttribute(attention_fused_forward_kernel<DK, Tq>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    attention_fused_forward_kernel<DK, Tq><<<grid, ATT_THREADS, sm, cx->stream>>>(out, lse, qkv, T, NH, hs, 1.0f / sqrtf((float)hs));
    CUDA_LAUNCH_CHECK(cx->rank, "attention_fused_forward_kernel");
}

template <int DK, class Tq, class To>
static void attention_fused_backward_launch(CudaCtx* cx, To* dqkv, const float* dout, const Tq* qkv, const float* lse,
                                            const float* dsum, int B, int T, int NH, int hs) {
    float scale = 1.0f / sqrtf((float)hs);
    dim3 grid(B * NH, ceil_div(T, ATT_TILE));
    if (att_tc(cx, DK, true)) {
        size_t sm = att_tc_smem(DK, true);
        CUDA_CHECK(cx->rank, cudaFuncSetAttribute(attention_tc_dkdv_kernel<DK, Tq, To>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        attention_tc_dkdv_kernel<DK, Tq, To><<<grid, ATT_THREADS, sm, cx->stream>>>(dqkv, dout, qkv, lse, dsum, T, NH, hs, scale);
        CUDA_LAUNCH_CHECK(cx->rank, "attention_tc_dkdv_kernel");
        CUDA_CHECK(cx->rank, cudaFuncSetAttribute(attention_tc_dq_kernel<DK, Tq, To>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        attention_tc_dq_kernel<DK, Tq, To><<<grid, ATT_THREADS, sm, cx->stream>>>(dqkv, dout, qkv, lse, dsum, T, NH, hs, scale);
        CUDA_LAUNCH_CHECK(cx->rank, "attention_tc_dq_kernel");
        return;
    }
    size_t sm = att_smem(4, DK, true);
    CUDA_CHECK(cx->rank, cudaFuncSetAttribute(attention_fused_dkdv_kernel<DK, Tq, To>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    attention_fused_dkdv_kernel<DK, Tq, To><<<grid, ATT_THREADS, sm, cx->stream>>>(dqkv, dout, qkv, lse, dsum, T, NH, hs, scale);
    CUDA_LAUNCH_CHECK(cx->rank, "attention_fused_dkdv_kernel");
    CUDA_CHECK(cx->rank, cudaFuncSetAttribute(attention_fused_dq_kernel<DK, Tq, To>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    attention_fused_dq_kernel<DK, Tq, To><<<grid, ATT_THREADS, sm, cx->stream>>>(dqkv, dout, qkv, lse, dsum, T, NH, hs, scale);
    CUDA_LAUNCH_CHECK(cx->rank, "attention_fused_dq_kernel");
}

// out (B, T, NH*hs) = softmax(q k^T / sqrt(hs), causal) v;  lse (B, NH, T) = the log-sum-exp of each
// row's scaled scores. qkv (B, T, 3*NH*hs) as attention_forward reads it, in fp32 words or (a --dtype bf16
// run's, as the layer keeps it) bf16 storage; hs <= ATT_HS_MAX.
template <class Tq>
static void attention_fused_forward_cuda(CudaCtx* cx, float* out, float* lse, const Tq* qkv, int B, int T, int NH, int hs) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    switch (att_dk(hs)) {
    case 1: attention_fused_forward_launch<1>(cx, out, lse, qkv, B, T, NH, hs); break;
    case 2: attention_fused_forward_launch<2>(cx, out, lse, qkv, B, T, NH, hs); break;
    case 4: attention_fused_forward_launch<4>(cx, out, lse, qkv, B, T, NH, hs); break;
    default: attention_fused_forward_launch<8>(cx, out, lse, qkv, B, T, NH, hs); break;
    }
}
static void attention_fused_forward_cuda(CudaCtx* cx, float* out, float* lse, Input qkv, int B, int T, int NH, int hs) {
    if (qkv.h) attention_fused_forward_cuda(cx, out, lse, qkv.h, B, T, NH, hs);
    else attention_fused_forward_cuda(cx, out, lse, qkv.f, B, T, NH, hs);
}

// dqkv (B, T, 3*NH*hs) = gradient of attention_fused_forward given dout (B, T, NH*hs)   (written), from
// qkv, the forward's out and lse; dsum (B, NH, T) scratch: D = rowsum(dout * out). Three kernels: D, then
// dk and dv per key tile, then dq per query tile (the two read q, k, v and recompute P each). out: fp32,
// or a bf16 run's kept bf16 copy of it, read where it lies (D is all the backward takes from it); qkv as
// attention_fused_forward_cuda reads it. dqkv: fp32, or (a bf16 run's, which qkv's matmuls take in bf16)
// bf16 storage, each fp32 sum rounded to nearest as it is stored.
template <class Tq, class To>
static void attention_fused_backward_cuda(CudaCtx* cx, To* dqkv, float* dsum, const float* dout, const Tq* qkv,
                                          Input out, const float* lse, int B, int T, int NH, int hs) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    long warps = (long)B * T * NH;
    unsigned blocks = ceil_div(warps * 32, ATT_THREADS);
    if (out.h) attention_fused_dsum_kernel<float, bf16><<<blocks, ATT_THREADS, 0, cx->stream>>>(dsum, dout, out.h, B, T, NH, hs);
    else attention_fused_dsum_kernel<float, float><<<blocks, ATT_THREADS, 0, cx->stream>>>(dsum, dout, out.f, B, T, NH, hs);
    CUDA_LAUNCH_CHECK(cx->rank, "attention_fused_dsum_kernel");
    switch (att_dk(hs)) {
    case 1: attention_fused_backward_launch<1>(cx, dqkv, dout, qkv, lse, dsum, B, T, NH, hs); break;
    case 2: attention_fused_backward_launch<2>(cx, dqkv, dout, qkv, lse, dsum, B, T, NH, hs); break;
    case 4: attention_fused_backward_launch<4>(cx, dqkv, dout, qkv, lse, dsum, B, T, NH, hs); break;
    default: attention_fused_backward_launch<8>(cx, dqkv, dout, qkv, lse, dsum, B, T, NH, hs); break;
    }
}
template <class To>
static void attention_fused_backward_cuda(CudaCtx* cx, To* dqkv, float* dsum, const float* dout, Input qkv, Input out,
                                          const float* lse, int B, int T, int NH, int hs) {
    if (qkv.h) attention_fused_backward_cuda(cx, dqkv, dsum, dout, qkv.h, out, lse, B, T, NH, hs);
    else attention_fused_backward_cuda(cx, dqkv, dsum, dout, qkv.f, out, lse, B, T, NH, hs);
}

// ----------------------------------------------------------------------------
// Vocab-parallel softmax cross-entropy, in three local steps around two all-reduces.
// logits (N, Vl) are this rank's columns [v0, v0+Vl) of the padded vocab; only columns < V are real.
// One block per row; any Vl works (threads past the row's end contribute the reduction's identity),
// including a shard with no real columns (nv = 0).

#define CE_THREADS 512

// maxes (N) = the largest real logit of each row in this rank's columns (-FLT_MAX if it has none).
// L: the logits fp32 (VEC 4: float4 loads), or a bf16 run's bf16 storage (VEC 8: 16-byte loads), widened.
template <int VEC, typename L>
__global__ void crossentropy_max_kernel(float* maxes, const L* logits, int Vl, int nv) {
    long n = blockIdx.x;
    const L* l = logits + n * Vl;
    float m = -FLT_MAX;
    for (int i = threadIdx.x * VEC; i < nv; i += blockDim.x * VEC) {
        Fv<VEC> a = ldv<VEC>(l + i);  // with VEC > 1, Vl % VEC == 0, so i + VEC - 1 < Vl
        for (int k = 0; k < VEC; k++)
            if (i + k < nv) m = fmaxf(m, a.v[k]);
    }
    m = block_reduce<true>(m);
    if (threadIdx.x == 0) maxes[n] = m;
}

// sums (N, 2): [0] = sum of exp(logit - max) over the real columns, [1] = the target's logit if this
// rank owns the target's column, else 0
template <int VEC, typename L>
__global__ void crossentropy_sums_kernel(float* sums, const L* logits, const float* maxes, const int* targets,
                                         int Vl, int v0, int nv) {
    long n = blockIdx.x;
    const L* l = logits + n * Vl;
    float m = maxes[n], s = 0.0f;
    for (int i = threadIdx.x * VEC; i < nv; i += blockDim.x * VEC) {
        Fv<VEC> a = ldv<VEC>(l + i);
        for (int k = 0; k < VEC; k++)
            if (i + k < nv) s += expf(a.v[k] - m);
    }
    s = block_reduce<false>(s);
    if (threadIdx.x == 0) {
        int col = targets[n] - v0;
        sums[2 * n] = s;
        sums[2 * n + 1] = (col >= 0 && col < Vl) ? ldv<1>(l + col).v[0] : 0.0f;
    }
}

// losses (N) = log(sum) - (target logit - max). If dscale != 0, logits become, in place,
// dlogits = (softmax - onehot(target)) * dscale, zero in the padded columns (bf16: rounded to nearest).
template <int VEC, typename L>
__global__ void crossentropy_finish_kernel(float* losses, L* logits, const float* maxes, const float* sums,
                                           const int* targets, int Vl, int v0, int nv, float dscale) {
    long n = blockIdx.x;
    float m = maxes[n], s = sums[2 * n];
    if (threadIdx.x == 0) losses[n] = logf(s) - (sums[2 * n + 1] - m);
    if (dscale == 0.0f) return;
    L* l = logits + n * Vl;
    float inv = 1.0f / s;
    int col = targets[n] - v0;
    for (int i = threadIdx.x * VEC; i < Vl; i += blockDim.x * VEC) {
        Fv<VEC> a = ldv<VEC>(l + i);
        for (int k = 0; k < VEC; k++) {
            float p = i + k < nv ? expf(a.v[k] - m) * inv : 0.0f;
            a.v[k] = (p - (i + k == col ? 1.0f : 0.0f)) * dscale;
        }
        stv<VEC>(l + i, a);
    }
}

// the widest loads the rows allow: 16 bytes where every row starts on a 16-byte boundary
template <typename L> static bool ce_vector(const L* logits, int Vl) { return Vl % (16 / sizeof(L)) == 0 && aligned16(logits); }
#define CE_LAUNCH(kernel, L, lg, ...)                                                                          \
    do {                                                                                                       \
        const L* l_ = (lg);                                                                                    \
        if (ce_vector(l_, Vl)) kernel<16 / sizeof(L), L><<<N, CE_THREADS, 0, cx->stream>>>(__VA_ARGS__);      \
        else kernel<1, L><<<N, CE_THREADS, 0, cx->stream>>>(__VA_ARGS__);                                      \
        CUDA_LAUNCH_CHECK(cx->rank, #kernel);                                                                  \
    } while (0)

template <typename L>
static void crossentropy_max_cuda(CudaCtx* cx, float* maxes, const L* logits, int N, int Vl, int v0, int V) {
    if (N <= 0) return;
    int nv = real_columns(Vl, v0, V);
    CE_LAUNCH(crossentropy_max_kernel, L, logits, maxes, logits, Vl, nv);
}

template <typename L>
static void crossentropy_sums_cuda(CudaCtx* cx, float* sums, const L* logits, const float* maxes, const int* targets,
                                   int N, int Vl, int v0, int V) {
    if (N <= 0) return;
    int nv = real_columns(Vl, v0, V);
    CE_LAUNCH(crossentropy_sums_kernel, L, logits, sums, logits, maxes, targets, Vl, v0, nv);
}

template <typename L>
static void crossentropy_finish_cuda(CudaCtx* cx, float* losses, L* logits, const float* maxes, const float* sums,
                                     const int* targets, int N, int Vl, int v0, int V, float dscale) {
    if (N <= 0) return;
    int nv = real_columns(Vl, v0, V);
    CE_LAUNCH(crossentropy_finish_kernel, L, logits, losses, logits, maxes, sums, targets, Vl, v0, nv, dscale);
}

// the recipe's forms: the logits in the run's storage (Logits)
static void crossentropy_max_cuda(CudaCtx* cx, float* maxes, Logits lg, int N, int Vl, int v0, int V) {
    if (lg.h) crossentropy_max_cuda(cx, maxes, (const bf16*)lg.h, N, Vl, v0, V);
    else crossentropy_max_cuda(cx, maxes, (const float*)lg.f, N, Vl, v0, V);
}
static void crossentropy_sums_cuda(CudaCtx* cx, float* sums, Logits lg, const float* maxes, const int* targets, int N, int Vl,
                                   int v0, int V) {
    if (lg.h) crossentropy_sums_cuda(cx, sums, (const bf16*)lg.h, maxes, targets, N, Vl, v0, V);
    else crossentropy_sums_cuda(cx, sums, (const float*)lg.f, maxes, targets, N, Vl, v0, V);
}
static void crossentropy_finish_cuda(CudaCtx* cx, float* losses, Logits lg, const float* maxes, const float* sums,
                                     const int* targets, int N, int Vl, int v0, int V, float dscale) {
    if (lg.h) crossentropy_finish_cuda(cx, losses, lg.h, maxes, sums, targets, N, Vl, v0, V, dscale);
    else crossentropy_finish_cuda(cx, losses, lg.f, maxes, sums, targets, N, Vl, v0, V, dscale);
}

// ----------------------------------------------------------------------------
// Optimizer

// AdamW as adamw_cpu, with the global-norm clipping scale derived on the device from norm2 (2) =
// [sharded part, replicated part] of the squared gradient norm, with adamw_cpu's expression.
template <int VEC, typename G>
__global__ void adamw_kernel(float* params, const G* grads, float* m, float* v, long n, float lr, float beta1,
                             float beta2, float eps, float wd, float bc1, float bc2, const float* norm2, float clip) {
    long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (i >= n) return;
    float norm = sqrtf(norm2[0] + norm2[1]);
    float grad_scale = clip > 0.0f && norm > clip ? clip / norm : 1.0f;
    Fv<VEC> p = ldv<VEC>(params + i), g = ldv<VEC>(grads + i), mv = ldv<VEC>(m + i), vv = ldv<VEC>(v + i);
    for (int k = 0; k < VEC; k++) {
        float gk = g.v[k] * grad_scale;
        float mi = beta1 * mv.v[k] + (1.0f - beta1) * gk;
        float vi = beta2 * vv.v[k] + (1.0f - beta2) * gk * gk;
        mv.v[k] = mi;
        vv.v[k] = vi;
        float mhat = mi / bc1, vhat = vi / bc2;
        p.v[k] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p.v[k]);
    }
    stv<VEC>(params + i, p);
    stv<VEC>(m + i, mv);
    stv<VEC>(v + i, vv);
}

// params, m, v (n) updated in place from grads (n); t counts from 1; clip 0 turns clipping off. G: the
// gradients in fp32, or a bf16 run's bf16 storage (widened exactly; VEC 4 loads them one by one)
template <typename G>
static void adamw_cuda(CudaCtx* cx, float* params, const G* grads, float* m, float* v, long n, float lr, float beta1,
                       float beta2, float eps, float wd, int t, const float* norm2, float clip) {
    if (n <= 0) return;
    // the bias corrections on the host, with the CPU op's expression (bit-identical)
    float bc1 = 1.0f - powf(beta1, (float)t), bc2 = 1.0f - powf(beta2, (float)t);
    if (n % 4 == 0 && aligned16(params) && aligned16(grads) && aligned16(m) && aligned16(v))
        adamw_kernel<4, G><<<ceil_div(n / 4, FLAT_THREADS), FLAT_THREADS, 0, cx->stream>>>(params, grads, m, v, n, lr, beta1, beta2,
                                                                                      eps, wd, bc1, bc2, norm2, clip);
    else
        adamw_kernel<1, G><<<ceil_div(n, FLAT_THREADS), FLAT_THREADS, 0, cx->stream>>>(params, grads, m, v, n, lr, beta1, beta2,
                                                                                  eps, wd, bc1, bc2, norm2, clip);
    CUDA_LAUNCH_CHECK(cx->rank, "adamw_kernel");
}

// 8 bf16 stored at once (p 16-byte aligned): one 16-byte store of the 8 (rounded weights), or widened, two
// of 4 floats (bf16_widen)
__device__ __forceinline__ void bf16_store8(bf16* p, const bf16* h) {
    *reinterpret_cast<uint4*>(p) = make_uint4(h[0] | (unsigned)h[1] << 16, h[2] | (unsigned)h[3] << 16,
                                              h[4] | (unsigned)h[5] << 16, h[6] | (unsigned)h[7] << 16);
}
__device__ __forceinline__ void bf16_store8(float* p, const bf16* h) {
    *reinterpret_cast<float4*>(p) = make_float4(bf16_to_float(h[0]), bf16_to_float(h[1]), bf16_to_float(h[2]), bf16_to_float(h[3]));
    *reinterpret_cast<float4*>(p + 4) = make_float4(bf16_to_float(h[4]), bf16_to_float(h[5]), bf16_to_float(h[6]), bf16_to_float(h[7]));
}

// out (n) = master (n) rounded stochastically to bf16: local elements i0 .. i0 + n - 1 of a shard placed by
// map, as bf16_from_master_cpu (the same scalar function: the same bits). A thread takes 8 consecutive
// elements: their full indices run on by one along a row of the shard, so full_index's divisions are made
// once (and again only where the 8 cross a row's end), and they are stored with 16-byte stores where out
// is aligned. A grid-stride loop over the groups of 8, so any grid and block computes the same thing;
// threads and blocks (0: as many as n needs) choose the launch.
__global__ void bf16_from_master_kernel(bf16* out, const float* master, long i0, long n, FullIndex map, uint32_t step,
                                        uint32_t seed) {
    const long groups = (n + 7) / 8;
    for (long g = (long)blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += (long)gridDim.x * blockDim.x) {
        const long j0 = g * 8, cnt = n - j0 < 8 ? n - j0 : 8, c = (i0 + j0) % map.lcols, f = full_index(map, i0 + j0);
        bf16 h[8] = {};
        for (int q = 0; q < cnt; q++) {
            const long idx = c + q < map.lcols ? f + q : full_index(map, i0 + j0 + q);
            h[q] = bf16_round_stochastic(master[j0 + q], (uint64_t)idx, step, seed);
        }
        if (cnt == 8 && ((uintptr_t)(out + j0) & 15) == 0) bf16_store8(out + j0, h);
        else
            for (int q = 0; q < cnt; q++) out[j0 + q] = h[q];
    }
}

static void bf16_from_master_cuda(CudaCtx* cx, bf16* out, const float* master, long i0, long n, FullIndex map, uint32_t step,
                                  uint32_t seed, int threads = FLAT_THREADS, unsigned blocks = 0) {
    if (n <= 0) return;
    if (blocks == 0) blocks = ceil_div(ceil_div(n, 8), threads);
    bf16_from_master_kernel<<<blocks, threads, 0, cx->stream>>>(out, master, i0, n, map, step, seed);
    CUDA_LAUNCH_CHECK(cx->rank, "bf16_from_master_kernel");
}

// x (n) rounded to the nearest bf16 in place, as round_bf16_cpu (the same scalar function); VEC floats a
// thread (128-bit loads and stores where x is 16-byte aligned and n a multiple of 4)
template <int VEC>
__global__ void round_bf16_kernel(float* x, long n) {
    long j = ((long)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (j >= n) return;
    if (VEC > 1 && j + VEC <= n) {
        Fv<VEC> v = ldv<VEC>(x + j);
        for (int k = 0; k < VEC; k++) v.v[k] = bf16_to_float(bf16_round(v.v[k]));
        stv<VEC>(x + j, v);
    } else {
        for (long i = j; i < n && i < j + VEC; i++) x[i] = bf16_to_float(bf16_round(x[i]));
    }
}

static void round_bf16_cuda(CudaCtx* cx, float* x, long n) {
    if (n <= 0) return;
    if (aligned16(x) && n % 4 == 0) round_bf16_kernel<4><<<ceil_div(n / 4, FLAT_THREADS), FLAT_THREADS, 0, cx->stream>>>(x, n);
    else round_bf16_kernel<1><<<ceil_div(n, FLAT_THREADS), FLAT_THREADS, 0, cx->stream>>>(x, n);
    CUDA_LAUNCH_CHECK(cx->rank, "round_bf16_kernel");
}

// out (n) = x (n) as bf16 storage, nearest even, as bf16_pack_cpu. A thread takes 8 elements: two 16-byte
// loads and one 16-byte store where both are 16-byte aligned and n is a multiple of 8 (VEC 8), else one
// element (VEC 1).
template <int VEC>
__global__ void bf16_pack_kernel(bf16* out, const float* x, long n) {
    long j = ((long)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (j >= n) return;
    if (VEC == 8) {
        float4 a = *reinterpret_cast<const float4*>(x + j), b = *reinterpret_cast<const float4*>(x + j + 4);
        uint4 w;  // little-endian: element 2i in the low half of word i
        w.x = (uint32_t)bf16_round(a.x) | (uint32_t)bf16_round(a.y) << 16;
        w.y = (uint32_t)bf16_round(a.z) | (uint32_t)bf16_round(a.w) << 16;
        w.z = (uint32_t)bf16_round(b.x) | (uint32_t)bf16_round(b.y) << 16;
        w.w = (uint32_t)bf16_round(b.z) | (uint32_t)bf16_round(b.w) << 16;
        *reinterpret_cast<uint4*>(out + j) = w;
    } else {
        out[j] = bf16_round(x[j]);
    }
}

static void bf16_pack_cuda(CudaCtx* cx, bf16* out, const float* x, long n) {
    if (n <= 0) return;
    if (aligned16(out) && aligned16(x) && n % 8 == 0) bf16_pack_kernel<8><<<ceil_div(n / 8, FLAT_THREADS), FLAT_THREADS, 0, cx->stream>>>(out, x, n);
    else bf16_pack_kernel<1><<<ceil_div(n, FLAT_THREADS), FLAT_THREADS, 0, cx->stream>>>(out, x, n);
    CUDA_LAUNCH_CHECK(cx->rank, "bf16_pack_kernel");
}

// out (n) = x (n) widened to fp32, as bf16_widen_cpu: 8 elements a thread (one 16-byte load, two 16-byte
// stores) where aligned and n is a multiple of 8, else one
template <int VEC>
__global__ void bf16_widen_kernel(float* out, const bf16* x, long n) {
    long j = ((long)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (j >= n) return;
    if (VEC == 8) {
        uint4 w = *reinterpret_cast<const uint4*>(x + j);
        bf16 h[8] = {(bf16)(w.x & 0xffff), (bf16)(w.x >> 16), (bf16)(w.y & 0xffff), (bf16)(w.y >> 16),
                     (bf16)(w.z & 0xffff), (bf16)(w.z >> 16), (bf16)(w.w & 0xffff), (bf16)(w.w >> 16)};
        bf16_store8(out + j, h);
    } else {
        out[j] = bf16_to_float(x[j]);
    }
}

static void bf16_widen_cuda(CudaCtx* cx, float* out, const bf16* x, long n) {
    if (n <= 0) return;
    if (aligned16(out) && aligned16(x) && n % 8 == 0) bf16_widen_kernel<8><<<ceil_div(n / 8, FLAT_THREADS), FLAT_THREADS, 0, cx->stream>>>(out, x, n);
    else bf16_widen_kernel<1><<<ceil_div(n, FLAT_THREADS), FLAT_THREADS, 0, cx->stream>>>(out, x, n);
    CUDA_LAUNCH_CHECK(cx->rank, "bf16_widen_kernel");
}

// Sum of squares in double, deterministically: pass 1 has a grid fixed by n alone (so the same on every
// GPU); thread j of the grid adds elements j, j + stride, ... in order, the block adds its threads in a
// fixed tree: partial (grid). Pass 2, one block, adds the partials in a fixed order and does
// norm2[0] += (float)total, as sumsq_cpu does.
#define SUMSQ_THREADS 256
#define SUMSQ_MAX_BLOCKS 1024

template <int VEC, typename T>
__global__ void sumsq_partial_kernel(double* partial, const T* x, long n) {
    long tid = (long)blockIdx.x * blockDim.x + threadIdx.x, stride = (long)gridDim.x * blockDim.x;
    long nvec = n / VEC;
    double acc = 0.0;
    for (long j = tid; j < nvec; j += stride) {
        Fv<VEC> a = ldv<VEC>(x + j * VEC);
        for (int k = 0; k < VEC; k++) acc += (double)a.v[k] * (double)a.v[k];
    }
    for (long i = nvec * VEC + tid; i < n; i += stride) {  // the < VEC tail
        double v = ldv<1>(x + i).v[0];
        acc += v * v;
    }
    acc = block_sum_d(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void sumsq_finish_kernel(float* norm2, const double* partial, int nblocks) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < nblocks; i += blockDim.x) acc += partial[i];
    acc = block_sum_d(acc);
    if (threadIdx.x == 0) norm2[0] += (float)acc;
}

// norm2 (1) += sum of squares of x (n), deterministic. T: fp32, or bf16 storage (a bf16 run's gradients)
template <typename T>
static void sumsq_cuda(CudaCtx* cx, float* norm2, const T* x, long n) {
    if (n <= 0) return;
    long per_block = (long)SUMSQ_THREADS * 16;
    int nblocks = (int)((n + per_block - 1) / per_block);
    if (nblocks > SUMSQ_MAX_BLOCKS) nblocks = SUMSQ_MAX_BLOCKS;
    double* partial = (double*)cuda_scratch(cx, &cx->red, &cx->red_bytes, (size_t)nblocks * sizeof(double));
    if (aligned16(x))
        sumsq_partial_kernel<4, T><<<nblocks, SUMSQ_THREADS, 0, cx->stream>>>(partial, x, n);
    else
        sumsq_partial_kernel<1, T><<<nblocks, SUMSQ_THREADS, 0, cx->stream>>>(partial, x, n);
    CUDA_LAUNCH_CHECK(cx->rank, "sumsq_partial_kernel");
    sumsq_finish_kernel<<<1, 1024, 0, cx->stream>>>(norm2, partial, nblocks);
    CUDA_LAUNCH_CHECK(cx->rank, "sumsq_finish_kernel");
}

// ----------------------------------------------------------------------------
// Serving: the KV cache ops of kernels_cpu.h (kc, vc (B, NH, Tmax, hs); pos (B) on the device)

__global__ void position_rows_forward_kernel(float* x, const float* wpe, const int* pos, int N, int C) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)N * C) return;
    long n = i / C;
    int c = (int)(i - n * C);
    x[i] += wpe[(long)pos[n] * C + c];
}

static void position_rows_forward_cuda(CudaCtx* cx, float* x, const float* wpe, const int* pos, int N, int C) {
    if (N <= 0 || C <= 0) return;
    position_rows_forward_kernel<<<ceil_div((long)N * C, FLAT_THREADS), FLAT_THREADS, 0, cx->stream>>>(x, wpe, pos, N, C);
    CUDA_LAUNCH_CHECK(cx->rank, "position_rows_forward_kernel");
}

// one thread per (b, t, h, d) element of k and of v
__global__ void kv_write_kernel(float* kc, float* vc, const float* qkv, const int* pos, int B, int T, int NH, int Tmax, int hs) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    int C = NH * hs;
    if (i >= (long)B * T * C) return;
    long row = i / C;  // (b, t)
    int c = (int)(i - row * C), h = c / hs, d = c - h * hs;
    int b = (int)(row / T), t = (int)(row - (long)b * T);
    int p = pos[b] + t;
    if (p < 0 || p >= Tmax) return;
    long dst = (((long)b * NH + h) * Tmax + p) * hs + d;
    kc[dst] = qkv[row * 3 * C + C + c];
    vc[dst] = qkv[row * 3 * C + 2 * C + c];
}

static void kv_write_cuda(CudaCtx* cx, float* kc, float* vc, const float* qkv, const int* pos, int B, int T, int NH, int Tmax, int hs) {
    long n = (long)B * T * NH * hs;
    if (n <= 0) return;
    kv_write_kernel<<<ceil_div(n, FLAT_THREADS), FLAT_THREADS, 0, cx->stream>>>(kc, vc, qkv, pos, B, T, NH, Tmax, hs);
    CUDA_LAUNCH_CHECK(cx->rank, "kv_write_kernel");
}

// One block per (b, h): the scores of the query against positions 0..pos[b] into scores (Tmax), the
// block's max and sum of exps, then each thread one channel d of out, summed over the positions in order.
#define DECODE_THREADS 128
__global__ void attention_decode_kernel(float* out, const float* qkv, const float* kc, const float* vc, const int* pos,
                                        float* scores, int NH, int Tmax, int hs, float scale) {
    int bh = blockIdx.x, b = bh / NH, h = bh - b * NH, C = NH * hs;
    int n = pos[b] + 1 < Tmax ? pos[b] + 1 : Tmax;
    const float* q = qkv + (long)b * 3 * C + h * hs;
    const float* k = kc + (long)bh * Tmax * hs;
    const float* v = vc + (long)bh * Tmax * hs;
    float* s = scores + (long)bh * Tmax;
    float m = -FLT_MAX;
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
        float d = 0.0f;
        for (int i = 0; i < hs; i++) d += q[i] * k[(long)t * hs + i];
        s[t] = d * scale;
        m = fmaxf(m, s[t]);
    }
    m = block_reduce<true>(m);
    float sum = 0.0f;
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
        float e = expf(s[t] - m);
        s[t] = e;
        sum += e;
    }
    sum = block_reduce<false>(sum);  // its barriers also make every s[t] visible to the whole block
    float inv = 1.0f / sum;
    for (int d = threadIdx.x; d < hs; d += blockDim.x) {
        float acc = 0.0f;
        for (int t = 0; t < n; t++) acc += s[t] * inv * v[(long)t * hs + d];
        out[(long)b * C + h * hs + d] = acc;
    }
}

static void attention_decode_cuda(CudaCtx* cx, float* out, const float* qkv, const float* kc, const float* vc, const int* pos,
                                  int B, int NH, int Tmax, int hs) {
    if (B <= 0 || NH <= 0) return;
    float* scores = (float*)cuda_scratch(cx, (void**)&cx->attn, &cx->attn_bytes, (size_t)B * NH * Tmax * sizeof(float));
    attention_decode_kernel<<<B * NH, DECODE_THREADS, 0, cx->stream>>>(out, qkv, kc, vc, pos, scores, NH, Tmax, hs,
                                                                       1.0f / sqrtf((float)hs));
    CUDA_LAUNCH_CHECK(cx->rank, "attention_decode_kernel");
}
