// blas.cpp: cuBLAS and cuBLASLt of the emulated GPU: the GEMMs tp makes, as stream operations.
//
// Semantics are cuBLAS's: column-major, D = alpha op(A) op(B) + beta C with op = N or T, leading
// dimensions at least the stored rows (else CUBLAS_STATUS_INVALID_VALUE, as cuBLAS checks), C not read when
// beta is 0, strided batches, fp32 accumulation, A and B in fp32 or both in bf16 (CUDA_R_16BF, each element
// widened exactly; C fp32, or bf16 with them: each result rounded to nearest, ties to even); with TF32 (CUBLAS_COMPUTE_32F_FAST_TF32, or
// CUBLAS_COMPUTE_32F under CUBLAS_TF32_TENSOR_OP_MATH) the inputs are rounded to 10 mantissa bits first,
// as tensor cores do, so TF32 error is really there for the tests to bound. cuBLASLt adds the bias
// epilogue, and models what its heuristic promises: the algorithm it returns assumes the minimum operand
// alignments of the preference (256 bytes by default), so a later call with a less aligned pointer is
// reported as the misaligned access it would be on a GPU. TP_EMU_LT_REFUSE=1 makes the heuristic find
// nothing, so callers' fallback paths run.
//
// Every operand is memchecked like a kernel's loads and stores: each column read or written must lie in a
// live allocation on the stream's device (or one with peer access), inputs must have been written, the
// output may not overlap an input, and a user workspace must still be allocated when the GEMM runs.
#include "emu.h"
#include "fake_cuda/cublasLt.h"
#include <algorithm>
#include <cinttypes>
#include <memory>

using namespace emu;

namespace {

constexpr uint32_t BLAS_MAGIC = 0x424c4153u, LT_MAGIC = 0x4c54484eu, DESC_MAGIC = 0x44455343u, LAYOUT_MAGIC = 0x4c41594fu,
                   PREF_MAGIC = 0x50524546u, ALGO_MAGIC = 0x414c474fu;

struct Gemm {
    int m, n, k;
    bool ta, tb, tf32;
    float alpha, beta;
    const void *A, *B;   // fp32, or bf16 when bf16 (cublasGemmEx with CUDA_R_16BF inputs)
    const float *C, *bias;
    float* D;
    bool bf16;           // A and B are bf16: each element widened to fp32 (exact), the products summed in fp32
    bool c16;            // C and D are bf16 too (cublasGemmEx with a CUDA_R_16BF C): read widened, written rounded
    long long lda, ldb, ldc, ldd, sA, sB, sC, sD;
    int batch;
    const char* api;
    uint32_t align[4];   // cuBLASLt: the alignments the algorithm assumes for A, B, C, D (0: none)
    void* ws;            // a workspace the GEMM may use (NULL: none)
    size_t ws_bytes;
};

// the bytes a column-major (rows x cols, ld) matrix spans, from its first element to its last
long long span(long long rows, long long cols, long long ld) { return rows == 0 || cols == 0 ? 0 : (cols - 1) * ld + rows; }

// whether na elements at a and nb at b share a byte (eb: bytes an element, 4, or 2 for a bf16 operand at b)
bool overlap(const void* a, long long na, const void* b, long long nb, int eb = 4) {
    return na > 0 && nb > 0 && (const char*)a < (const char*)b + nb * eb && (const char*)b < (const char*)a + na * 4;
}

void check_matrix(const void* p, long long rows, long long cols, long long ld, bool write, const char* name, int eb = 4) {
    for (long long j = 0; j < cols; j++) check_range((const char*)p + j * ld * eb, (size_t)rows * eb, write, !write, PEER_KERNEL, name);
}

// element i of an operand: an fp32, or a bf16 widened to the fp32 with the same top 16 bits
float operand(const void* p, long long i, bool bf16) {
    if (!bf16) return ((const float*)p)[i];
    uint32_t u = (uint32_t)((const uint16_t*)p)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// v rounded to the nearest bf16, ties to even (a NaN stays a quiet NaN), as a GPU's fp32-to-bf16 conversion
uint16_t bf16_nearest(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float dot(const float* a, const float* b, int k) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int l = 0;
    for (; l + 8 <= k; l += 8)
        for (int q = 0; q < 8; q++) acc[q] += a[l + q] * b[l + q];
    for (; l < k; l++) acc[l % 8] += a[l] * b[l];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// runs on the stream (t_op set): memcheck, then the product
void gemm_run(const Gemm& g) {
    const char* nm[4] = {"operand A", "operand B", "operand C", "output D"};
    const void* ptr[4] = {g.A, g.B, g.C, g.D};
    for (int i = 0; i < 4; i++)
        if (g.align[i] && ptr[i] && (uintptr_t)ptr[i] % g.align[i] != 0)
            fail("misaligned address", "%s: the algorithm the heuristic returned assumes %s aligned to %u bytes (the "
                 "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT preference), but it is at %p; a GPU kernel faults here\n%s",
                 g.api, nm[i], g.align[i], ptr[i], describe_addr((uintptr_t)ptr[i]).c_str());
    long long ra = g.ta ? g.k : g.m, ca = g.ta ? g.m : g.k, rb = g.tb ? g.n : g.k, cb = g.tb ? g.k : g.n;
    if (g.bias) {
        if ((uintptr_t)g.bias % 16)
            fail("misaligned address", "%s: the bias epilogue needs a 16-byte aligned bias, but it is at %p\n%s", g.api, (const void*)g.bias,
                 describe_addr((uintptr_t)g.bias).c_str());
        check_range(g.bias, (size_t)g.m * 4, false, true, PEER_KERNEL, "the bias");
    }
    if (g.ws) {  // the GEMM scribbles on its workspace, so nobody else may rely on it
        size_t n = std::min<size_t>(g.ws_bytes, 1 << 20);
        check_range(g.ws, n, true, false, PEER_KERNEL, "the workspace");
        dset(g.ws, 0xff, n);
    }
    std::vector<float> ap((size_t)g.m * g.k), bp((size_t)g.n * g.k);
    for (int b = 0; b < g.batch; b++) {
        const int eb = g.bf16 ? 2 : 4;  // bytes an element of A and B
        const void *A = (const char*)g.A + b * g.sA * eb, *B = (const char*)g.B + b * g.sB * eb;
        const int ec = g.c16 ? 2 : 4;  // bytes an element of C and D
        const void* C = g.C ? (const char*)g.C + b * g.sC * ec : nullptr;
        void* D = (char*)g.D + b * g.sD * ec;
        check_matrix(A, ra, ca, g.lda, false, "operand A", eb);
        check_matrix(B, rb, cb, g.ldb, false, "operand B", eb);
        if (g.beta != 0.0f && C != D) check_matrix(C, g.m, g.n, g.ldc, false, "operand C", ec);
        if (g.beta != 0.0f && C == D) check_matrix(D, g.m, g.n, g.ldd, false, "operand C (= D)", ec);
        check_matrix(D, g.m, g.n, g.ldd, true, "output D", ec);
        long long nd = (span(g.m, g.n, g.ldd) * ec + 3) / 4;  // (overlap counts D in fp32 words)
        if (overlap(D, nd, A, span(ra, ca, g.lda), eb) || overlap(D, nd, B, span(rb, cb, g.ldb), eb))
            fail("GEMM output overlaps an input", "%s: batch %d writes D at %p (%lld floats), which overlaps operand A (%p) or B (%p): the result "
                 "is undefined", g.api, b, (void*)D, nd, (const void*)A, (const void*)B);
        if (b + 1 < g.batch && overlap(D, nd, (const char*)g.D + (b + 1) * g.sD * ec, nd))
            fail("GEMM output overlaps an input", "%s: the outputs of batches %d and %d overlap (stride %lld, but each D spans %lld floats)",
                 g.api, b, b + 1, g.sD, nd);
        // op(A) as rows of k and op(B) as columns of k, TF32-rounded if asked
        for (int i = 0; i < g.m; i++)
            for (int l = 0; l < g.k; l++) {
                float x = operand(A, g.ta ? l + (long long)i * g.lda : i + (long long)l * g.lda, g.bf16);
                ap[(size_t)i * g.k + l] = g.tf32 ? tf32_round(x) : x;
            }
        for (int j = 0; j < g.n; j++)
            for (int l = 0; l < g.k; l++) {
                float x = operand(B, g.tb ? j + (long long)l * g.ldb : l + (long long)j * g.ldb, g.bf16);
                bp[(size_t)j * g.k + l] = g.tf32 ? tf32_round(x) : x;
            }
        for (int j = 0; j < g.n; j++)
            for (int i = 0; i < g.m; i++) {
                float v = g.alpha * dot(&ap[(size_t)i * g.k], &bp[(size_t)j * g.k], g.k);
                if (g.beta != 0.0f) v += g.beta * operand(C, i + (long long)j * (C == D ? g.ldd : g.ldc), g.c16);
                if (g.bias) v += g.bias[i];
                long long at = i + (long long)j * g.ldd;
                if (g.c16) ((uint16_t*)D)[at] = bf16_nearest(v);
                else ((float*)D)[at] = v;
            }
    }
}

void enqueue_gemm(Stream* s, const Gemm& g) {
    enqueue(s, g.api, [g](bool) {
        gemm_run(g);
        return true;
    });
}

bool valid_op(int op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; }

}  // namespace

// ----------------------------------------------------------------------------
// cuBLAS

struct cublasContext {
    uint32_t magic;
    int device;
    cudaStream_t stream;
    cublasMath_t mode;
    void* ws;
    size_t ws_bytes;
};

static cublasContext* handle_of(cublasHandle_t h) { return h && h->magic == BLAS_MAGIC ? h : nullptr; }

cublasStatus_t cublasCreate(cublasHandle_t* h) {
    init();
    if (!h) return CUBLAS_STATUS_INVALID_VALUE;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    *h = new cublasContext{BLAS_MAGIC, cur_device(), nullptr, CUBLAS_DEFAULT_MATH, nullptr, 0};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h) {
    cublasContext* c = handle_of(h);
    if (!c) return CUBLAS_STATUS_NOT_INITIALIZED;
    c->magic = 0;  // kept, so that a use after destroy is recognised
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
    cublasContext* c = handle_of(h);
    if (!c) return CUBLAS_STATUS_NOT_INITIALIZED;
    cudaError_t e = cudaSuccess;
    if (s && !get_stream(s, &e)) fail("invalid stream", "cublasSetStream was given a stream that does not exist (destroyed?)");
    c->stream = s;
    c->ws = nullptr;  // as cuBLAS: setting a stream resets the workspace to the default pool
    c->ws_bytes = 0;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t h, cudaStream_t* s) {
    cublasContext* c = handle_of(h);
    if (!c) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!s) return CUBLAS_STATUS_INVALID_VALUE;
    *s = c->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode) {
    cublasContext* c = handle_of(h);
    if (!c) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode != CUBLAS_DEFAULT_MATH && mode != CUBLAS_PEDANTIC_MATH && mode != CUBLAS_TF32_TENSOR_OP_MATH)
        fail("outside the emulated subset", "cublasSetMathMode(%d): only CUBLAS_DEFAULT_MATH, CUBLAS_PEDANTIC_MATH and "
             "CUBLAS_TF32_TENSOR_OP_MATH are emulated", (int)mode);
    c->mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t h, cublasMath_t* mode) {
    cublasContext* c = handle_of(h);
    if (!c) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!mode) return CUBLAS_STATUS_INVALID_VALUE;
    *mode = c->mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void* ws, size_t bytes) {
    cublasContext* c = handle_of(h);
    if (!c) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (bytes > 0 && (!ws || (uintptr_t)ws % 256)) return CUBLAS_STATUS_INVALID_VALUE;  // cuBLAS wants 256-byte alignment
    if (bytes > 0 && !is_device_addr((uintptr_t)ws))
        fail("invalid pointer", "cublasSetWorkspace was given %p, which is not device memory", ws);
    c->ws = bytes ? ws : nullptr;
    c->ws_bytes = bytes;
    return CUBLAS_STATUS_SUCCESS;
}

static const struct { cublasStatus_t s; const char* name; const char* text; } g_status[] = {
    {CUBLAS_STATUS_SUCCESS, "CUBLAS_STATUS_SUCCESS", "the operation completed successfully"},
    {CUBLAS_STATUS_NOT_INITIALIZED, "CUBLAS_STATUS_NOT_INITIALIZED", "the library was not initialized"},
    {CUBLAS_STATUS_ALLOC_FAILED, "CUBLAS_STATUS_ALLOC_FAILED", "the resource allocation failed"},
    {CUBLAS_STATUS_INVALID_VALUE, "CUBLAS_STATUS_INVALID_VALUE", "an invalid numeric value was used as an argument"},
    {CUBLAS_STATUS_ARCH_MISMATCH, "CUBLAS_STATUS_ARCH_MISMATCH", "an absent device architectural feature is required"},
    {CUBLAS_STATUS_MAPPING_ERROR, "CUBLAS_STATUS_MAPPING_ERROR", "an access to GPU memory space failed"},
    {CUBLAS_STATUS_EXECUTION_FAILED, "CUBLAS_STATUS_EXECUTION_FAILED", "the GPU program failed to execute"},
    {CUBLAS_STATUS_INTERNAL_ERROR, "CUBLAS_STATUS_INTERNAL_ERROR", "an internal operation failed"},
    {CUBLAS_STATUS_NOT_SUPPORTED, "CUBLAS_STATUS_NOT_SUPPORTED", "the functionality requested is not supported"},
    {CUBLAS_STATUS_LICENSE_ERROR, "CUBLAS_STATUS_LICENSE_ERROR", "error detected trying to check the license"},
};
const char* cublasGetStatusString(cublasStatus_t s) {
    for (auto& x : g_status)
        if (x.s == s) return x.text;
    return "unknown error";
}
const char* cublasGetStatusName(cublasStatus_t s) {
    for (auto& x : g_status)
        if (x.s == s) return x.name;
    return "CUBLAS_STATUS_UNKNOWN";
}

// the checks cublasGemmEx and cublasGemmStridedBatchedEx share; returns the stream, or sets *st
static Stream* gemm_setup(const char* api, cublasContext* c, int ta, int tb, int m, int n, int k, const void* alpha, int Atype, int lda,
                          int Btype, int ldb, const void* beta, int Ctype, int ldc, int compute, int algo, int batch, cublasStatus_t* st,
                          bool* tf32, bool* bf16, bool* c16) {
    *st = CUBLAS_STATUS_SUCCESS;
    if (!c) {
        *st = CUBLAS_STATUS_NOT_INITIALIZED;
        return nullptr;
    }
    *bf16 = Atype == CUDA_R_16BF && Btype == CUDA_R_16BF;
    if (!(Atype == CUDA_R_32F && Btype == CUDA_R_32F) && !*bf16)
        fail("outside the emulated subset", "%s with data types %d/%d/%d: A and B both CUDA_R_32F or both CUDA_R_16BF are emulated", api, Atype, Btype, Ctype);
    *c16 = *bf16 && Ctype == CUDA_R_16BF;
    if (Ctype != CUDA_R_32F && !*c16)
        fail("outside the emulated subset", "%s with data types %d/%d/%d: an fp32 C (CUDA_R_32F), or a bf16 C with bf16 A and B, is emulated",
             api, Atype, Btype, Ctype);
    if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC && compute != CUBLAS_COMPUTE_32F_FAST_TF32)
        fail("outside the emulated subset", "%s with compute type %d: only CUBLAS_COMPUTE_32F, _32F_PEDANTIC and _32F_FAST_TF32 are emulated", api, compute);
    if (*bf16 && compute == CUBLAS_COMPUTE_32F_FAST_TF32) {  // cuBLAS: TF32 is for fp32 inputs only
        *st = CUBLAS_STATUS_NOT_SUPPORTED;
        return nullptr;
    }
    if (algo != CUBLAS_GEMM_DEFAULT && algo != CUBLAS_GEMM_DEFAULT_TENSOR_OP)
        fail("outside the emulated subset", "%s with algorithm %d: only CUBLAS_GEMM_DEFAULT(_TENSOR_OP) is emulated", api, algo);
    if (c->device != cur_device())
        fail("cuBLAS handle used on another device", "%s: the handle was created on device %d but device %d is current", api, c->device, cur_device());
    if (!valid_op(ta) || !valid_op(tb) || m < 0 || n < 0 || k < 0 || batch < 0 || !alpha || !beta ||
        lda < std::max(1, ta == CUBLAS_OP_N ? m : k) || ldb < std::max(1, tb == CUBLAS_OP_N ? k : n) || ldc < std::max(1, m)) {
        *st = CUBLAS_STATUS_INVALID_VALUE;
        return nullptr;
    }
    cudaError_t e = cudaSuccess;
    Stream* s = get_stream(c->stream, &e);
    if (!s) fail("invalid stream", "%s: the handle's stream was destroyed", api);
    // (bf16 inputs have 8 significant bits, fewer than TF32's 11: rounding them to TF32 would change nothing)
    *tf32 = !*bf16 && (compute == CUBLAS_COMPUTE_32F_FAST_TF32 || (compute == CUBLAS_COMPUTE_32F && c->mode == CUBLAS_TF32_TENSOR_OP_MATH));
    return s;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B, cudaDataType Btype, int ldb, const void* beta,
                            void* C, cudaDataType Ctype, int ldc, cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    return cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0, beta, C, Ctype, ldc, 0, 1, compute, algo);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                          const void* alpha, const void* A, cudaDataType Atype, int lda, long long sA, const void* B,
                                          cudaDataType Btype, int ldb, long long sB, const void* beta, void* C, cudaDataType Ctype,
                                          int ldc, long long sC, int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    init();
    cublasContext* c = handle_of(h);
    cublasStatus_t st;
    bool tf32 = false, bf16 = false, c16 = false;
    const char* api = batch == 1 && sA == 0 && sB == 0 && sC == 0 ? "cublasGemmEx" : "cublasGemmStridedBatchedEx";
    Stream* s = gemm_setup(api, c, ta, tb, m, n, k, alpha, Atype, lda, Btype, ldb, beta, Ctype, ldc, compute, algo, batch, &st, &tf32, &bf16, &c16);
    if (!s) return st;
    if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
    Gemm g = {};
    g.m = m, g.n = n, g.k = k;
    g.ta = ta != CUBLAS_OP_N, g.tb = tb != CUBLAS_OP_N, g.tf32 = tf32;
    g.alpha = *(const float*)alpha;  // host pointer mode: the scalars are read now, at the call
    g.beta = *(const float*)beta;
    g.A = A, g.B = B, g.C = (const float*)C, g.D = (float*)C;
    g.bf16 = bf16;
    g.c16 = c16;
    g.lda = lda, g.ldb = ldb, g.ldc = ldc, g.ldd = ldc;
    g.sA = sA, g.sB = sB, g.sC = sC, g.sD = sC;
    g.batch = batch;
    g.api = api;
    g.ws = c->ws;
    g.ws_bytes = c->ws_bytes;
    enqueue_gemm(s, g);
    return CUBLAS_STATUS_SUCCESS;
}

// ----------------------------------------------------------------------------
// cuBLASLt: descriptors are small host structs (in the opaque words), read at the call

struct cublasLtContext {
    uint32_t magic;
    int device;
};

namespace {
struct LtDesc { uint64_t magic, compute, scale, ta, tb, epilogue; const float* bias; };
struct LtLayout { uint64_t magic, type, rows, cols; int64_t ld; };
struct LtPref { uint64_t magic, max_ws; uint32_t align[4]; };
struct LtAlgo { uint64_t magic; uint32_t align[4]; uint64_t ws; };
static_assert(sizeof(LtDesc) <= sizeof(cublasLtMatmulDescOpaque_t) && sizeof(LtLayout) <= sizeof(cublasLtMatrixLayoutOpaque_t) &&
              sizeof(LtPref) <= sizeof(cublasLtMatmulPreferenceOpaque_t) && sizeof(LtAlgo) <= sizeof(cublasLtMatmulAlgo_t),
              "descriptor layouts");
LtDesc* desc_of(cublasLtMatmulDesc_t d) { return d && ((LtDesc*)d)->magic == DESC_MAGIC ? (LtDesc*)d : nullptr; }
LtLayout* layout_of(cublasLtMatrixLayout_t l) { return l && ((LtLayout*)l)->magic == LAYOUT_MAGIC ? (LtLayout*)l : nullptr; }
LtPref* pref_of(cublasLtMatmulPreference_t p) { return p && ((LtPref*)p)->magic == PREF_MAGIC ? (LtPref*)p : nullptr; }

// the problem a descriptor and four layouts describe: m, n, k, or CUBLAS_STATUS_INVALID_VALUE if they disagree
cublasStatus_t lt_problem(LtDesc* d, LtLayout* a, LtLayout* b, LtLayout* c, LtLayout* dd, int* m, int* n, int* k) {
    if (!d || !a || !b || !c || !dd) return CUBLAS_STATUS_INVALID_VALUE;
    *m = (int)dd->rows, *n = (int)dd->cols;
    *k = (int)(d->ta == CUBLAS_OP_N ? a->cols : a->rows);
    uint64_t am = d->ta == CUBLAS_OP_N ? a->rows : a->cols;
    uint64_t bk = d->tb == CUBLAS_OP_N ? b->rows : b->cols, bn = d->tb == CUBLAS_OP_N ? b->cols : b->rows;
    if (am != (uint64_t)*m || bk != (uint64_t)*k || bn != (uint64_t)*n || c->rows != dd->rows || c->cols != dd->cols)
        return CUBLAS_STATUS_INVALID_VALUE;
    for (LtLayout* l : {a, b, c, dd})
        if (l->ld < (int64_t)std::max<uint64_t>(1, l->rows)) return CUBLAS_STATUS_INVALID_VALUE;
    if (d->epilogue == CUBLASLT_EPILOGUE_BIAS && !d->bias) return CUBLAS_STATUS_INVALID_VALUE;
    // the types: A and B both fp32 or both bf16 (bf16 with fp32 compute, not TF32's), C and D fp32 (the
    // bias then fp32, D's type); cuBLASLt has other combinations, which tp does not use
    const bool bf16 = a->type == CUDA_R_16BF;
    if (b->type != a->type || c->type != CUDA_R_32F || dd->type != CUDA_R_32F ||
        (bf16 && d->compute != CUBLAS_COMPUTE_32F && d->compute != CUBLAS_COMPUTE_32F_PEDANTIC))
        fail("outside the emulated subset", "cuBLASLt with A, B, C, D of types %d, %d, %d, %d and compute type %d: A and B both CUDA_R_32F "
             "or both CUDA_R_16BF (then with CUBLAS_COMPUTE_32F), C and D CUDA_R_32F are emulated", (int)a->type, (int)b->type,
             (int)c->type, (int)dd->type, (int)d->compute);
    return CUBLAS_STATUS_SUCCESS;
}
}  // namespace

void emu_set_lt_refuse(int on) {
    init();
    g_cfg.lt_refuse = on != 0;
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
    init();
    if (!h) return CUBLAS_STATUS_INVALID_VALUE;
    *h = new cublasLtContext{LT_MAGIC, cur_device()};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    if (!h || h->magic != LT_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->magic = 0;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale) {
    if (!d) return CUBLAS_STATUS_INVALID_VALUE;
    if ((compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC && compute != CUBLAS_COMPUTE_32F_FAST_TF32) || scale != CUDA_R_32F)
        fail("outside the emulated subset", "cublasLtMatmulDescCreate(compute %d, scale %d): only fp32 compute types are emulated", (int)compute, (int)scale);
    LtDesc* x = (LtDesc*)new cublasLtMatmulDescOpaque_t();
    *x = LtDesc{DESC_MAGIC, (uint64_t)compute, (uint64_t)scale, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, nullptr};
    *d = (cublasLtMatmulDesc_t)x;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    if (!desc_of(d)) return CUBLAS_STATUS_INVALID_VALUE;
    ((LtDesc*)d)->magic = 0;
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t dh, cublasLtMatmulDescAttributes_t attr, const void* buf, size_t size) {
    LtDesc* d = desc_of(dh);
    if (!d || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
        case CUBLASLT_MATMUL_DESC_TRANSA:
        case CUBLASLT_MATMUL_DESC_TRANSB: {
            if (size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
            int32_t op;
            memcpy(&op, buf, 4);
            if (!valid_op(op)) return CUBLAS_STATUS_INVALID_VALUE;
            (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d->ta : d->tb) = (uint64_t)op;
            return CUBLAS_STATUS_SUCCESS;
        }
        case CUBLASLT_MATMUL_DESC_EPILOGUE: {
            if (size != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
            uint32_t e;
            memcpy(&e, buf, 4);
            if (e != CUBLASLT_EPILOGUE_DEFAULT && e != CUBLASLT_EPILOGUE_BIAS)
                fail("outside the emulated subset", "cublasLtMatmulDescSetAttribute: epilogue %u (only DEFAULT and BIAS are emulated)", e);
            d->epilogue = e;
            return CUBLAS_STATUS_SUCCESS;
        }
        case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
            if (size != sizeof(void*)) return CUBLAS_STATUS_INVALID_VALUE;
            memcpy(&d->bias, buf, sizeof(void*));
            return CUBLAS_STATUS_SUCCESS;
    }
    fail("outside the emulated subset", "cublasLtMatmulDescSetAttribute: attribute %d is not emulated", (int)attr);
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld) {
    if (!l) return CUBLAS_STATUS_INVALID_VALUE;
    if (type != CUDA_R_32F && type != CUDA_R_16BF)
        fail("outside the emulated subset", "cublasLtMatrixLayoutCreate with data type %d: only CUDA_R_32F and CUDA_R_16BF are emulated", (int)type);
    LtLayout* x = (LtLayout*)new cublasLtMatrixLayoutOpaque_t();
    *x = LtLayout{LAYOUT_MAGIC, (uint64_t)type, rows, cols, ld};
    *l = (cublasLtMatrixLayout_t)x;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    if (!layout_of(l)) return CUBLAS_STATUS_INVALID_VALUE;
    ((LtLayout*)l)->magic = 0;
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
    if (!p) return CUBLAS_STATUS_INVALID_VALUE;
    LtPref* x = (LtPref*)new cublasLtMatmulPreferenceOpaque_t();
    *x = LtPref{PREF_MAGIC, 0, {256, 256, 256, 256}};  // the documented defaults: no workspace, 256-byte alignment
    *p = (cublasLtMatmulPreference_t)x;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    if (!pref_of(p)) return CUBLAS_STATUS_INVALID_VALUE;
    ((LtPref*)p)->magic = 0;
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t ph, cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
    LtPref* p = pref_of(ph);
    if (!p || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
        if (size != sizeof(uint64_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&p->max_ws, buf, 8);
        return CUBLAS_STATUS_SUCCESS;
    }
    if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES) {
        if (size != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        uint32_t a;
        memcpy(&a, buf, 4);
        if (a == 0 || (a & (a - 1))) return CUBLAS_STATUS_INVALID_VALUE;
        p->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = a;
        return CUBLAS_STATUS_SUCCESS;
    }
    fail("outside the emulated subset", "cublasLtMatmulPreferenceSetAttribute: attribute %d is not emulated", (int)attr);
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t dh, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t ph, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* count) {
    init();
    if (!h || h->magic != LT_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
    LtPref* p = pref_of(ph);
    if (!p || requested < 1 || !results || !count) return CUBLAS_STATUS_INVALID_VALUE;
    int m, n, k;
    cublasStatus_t st = lt_problem(desc_of(dh), layout_of(a), layout_of(b), layout_of(c), layout_of(d), &m, &n, &k);
    // cuBLASLt returns CUBLAS_STATUS_INVALID_VALUE here; a caller that takes any failure for "no algorithm"
    // would then fall back silently and never run the fused path, so the emulator says so out loud
    if (st != CUBLAS_STATUS_SUCCESS)
        fail("invalid cuBLASLt problem", "cublasLtMatmulAlgoGetHeuristic: the descriptor and layouts do not describe a valid matmul (op(A) "
             "must be m x k, op(B) k x n, C and D m x n, every ld >= its rows, a bias pointer with the BIAS epilogue); cuBLASLt answers "
             "CUBLAS_STATUS_INVALID_VALUE");
    *count = 0;
    if (g_cfg.lt_refuse) return CUBLAS_STATUS_NOT_SUPPORTED;  // as cuBLASLt does when nothing fits
    memset(&results[0], 0, sizeof(results[0]));
    LtAlgo* algo = (LtAlgo*)&results[0].algo;
    algo->magic = ALGO_MAGIC;
    memcpy(algo->align, p->align, sizeof(algo->align));
    algo->ws = p->max_ws >= (1 << 20) ? (1 << 20) : 0;  // an algorithm that uses a workspace when it may
    results[0].workspaceSize = algo->ws;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *count = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t dh, const void* alpha, const void* A, cublasLtMatrixLayout_t a,
                              const void* B, cublasLtMatrixLayout_t b, const void* beta, const void* C, cublasLtMatrixLayout_t c, void* D,
                              cublasLtMatrixLayout_t d, const cublasLtMatmulAlgo_t* algo_in, void* ws, size_t ws_bytes, cudaStream_t sh) {
    init();
    if (!h || h->magic != LT_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (h->device != cur_device())
        fail("cuBLASLt handle used on another device", "cublasLtMatmul: the handle was created on device %d but device %d is current", h->device, cur_device());
    LtDesc* desc = desc_of(dh);
    int m, n, k;
    cublasStatus_t st = lt_problem(desc, layout_of(a), layout_of(b), layout_of(c), layout_of(d), &m, &n, &k);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    if (!alpha || !beta || !A || !B || !D || (!C && *(const float*)beta != 0.0f)) return CUBLAS_STATUS_INVALID_VALUE;
    const LtAlgo* algo = (const LtAlgo*)algo_in;
    if (algo && algo->magic != ALGO_MAGIC) return CUBLAS_STATUS_INVALID_VALUE;
    if (algo && ws_bytes < algo->ws) return CUBLAS_STATUS_INVALID_VALUE;  // less workspace than the algorithm needs
    if (ws_bytes > 0 && !ws) return CUBLAS_STATUS_INVALID_VALUE;
    if (C && C != D && layout_of(c)->ld == layout_of(d)->ld && overlap(C, span(m, n, layout_of(c)->ld), D, span(m, n, layout_of(d)->ld)))
        fail("GEMM output overlaps an input", "cublasLtMatmul: C (%p) and D (%p) overlap without being the same matrix", C, D);
    cudaError_t e = cudaSuccess;
    Stream* s = get_stream(sh, &e);
    if (!s) fail("invalid stream", "cublasLtMatmul was given a stream that does not exist (destroyed?)");
    Gemm g = {};
    g.m = m, g.n = n, g.k = k;
    g.ta = desc->ta != CUBLAS_OP_N, g.tb = desc->tb != CUBLAS_OP_N;
    g.bf16 = layout_of(a)->type == CUDA_R_16BF;  // (lt_problem: then B too, and fp32 compute)
    g.tf32 = desc->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    g.alpha = *(const float*)alpha;
    g.beta = *(const float*)beta;
    g.A = A, g.B = B, g.C = (const float*)C, g.D = (float*)D;
    g.lda = layout_of(a)->ld, g.ldb = layout_of(b)->ld, g.ldc = layout_of(c)->ld, g.ldd = layout_of(d)->ld;
    g.batch = 1;
    g.bias = desc->epilogue == CUBLASLT_EPILOGUE_BIAS ? desc->bias : nullptr;
    g.api = "cublasLtMatmul";
    if (algo) memcpy(g.align, algo->align, sizeof(g.align));
    g.ws = algo && algo->ws ? ws : nullptr;
    g.ws_bytes = algo ? algo->ws : 0;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    enqueue_gemm(s, g);
    return CUBLAS_STATUS_SUCCESS;
}
