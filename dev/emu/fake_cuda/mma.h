// mma.h of tp's emulated GPU (dev/emu): the warp matrix functions of CUDA C++ (nvcuda::wmma), for the
// shape and types tp's kernels use: TF32 m16n16k8 (matrix_a 16 x 8, matrix_b 8 x 16, both precision::tf32,
// stored as floats) into a float accumulator 16 x 16. Another shape or type fails to compile.
//
// What a GPU leaves unspecified, the emulator makes visible:
//   - which lane holds which element of a fragment. CUDA says only that the elements are spread over the
//     warp's lanes in some order; here slot s = lane * num_elements + e holds element (a s + c) mod R*C of
//     the matrix (row-major), with a odd and c drawn from the launch's schedule seed. Code that reads a
//     fragment's x[] as if it knew the layout (a row max over an accumulator, say) computes garbage here
//     instead of happening to work on one GPU generation. Elementwise use (the same function of every
//     element, as __float_to_tf32) is fine, as CUDA allows.
//   - the pointers and strides: load_matrix_sync and store_matrix_sync want a 256-bit aligned pointer and
//     ldm a multiple of 16 bytes (4 floats); anything else is reported, as the hardware's result is undefined.
//   - the warp: every operation is warp-wide. mma_sync gathers the 32 lanes' fragments (exec.cpp,
//     emu_warp_gather), so a lane that has returned or a divergent call is reported. Loads and stores are
//     each lane's own reads and writes of its elements (memcheck and racecheck see them) followed or preceded
//     by a __syncwarp that checks the whole warp takes part.
// Numbers: __float_to_tf32 rounds to 10 fraction bits, to nearest with ties away from zero (PTX
// cvt.rna.tf32.f32); mma_sync multiplies the inputs' top 19 bits (a value that was not converted is cut,
// as the tensor cores ignore its low 13 bits), products exact in fp32, summed in fp32 in k order onto c.
#pragma once
#include <cstdio>
#include "cuda_runtime.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
namespace precision {
struct tf32 {};
}

// the fragments: R x C elements over 32 lanes, N a lane (slot s = lane * N + e)
template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
    static_assert(M == 16 && N == 16 && K == 8, "the emulated wmma has the TF32 shape m16n16k8 only");
    static_assert(std::is_same<Use, accumulator>::value ? std::is_same<T, float>::value : std::is_same<T, precision::tf32>::value,
                  "the emulated wmma has tf32 matrix_a and matrix_b and a float accumulator only");
    static constexpr int R = std::is_same<Use, matrix_b>::value ? K : M;
    static constexpr int C = std::is_same<Use, matrix_a>::value ? K : N;
    static constexpr int num_elements = R * C / 32;
    float x[num_elements];
};

// the layout of a launch's fragments: slot s of an n-element fragment holds element (a s + c) mod n
// (row * C + col), and element pos sits in slot a^-1 (pos - c) mod n (n a power of two, a odd)
struct EmuWmmaMap {
    unsigned a, inv, c;
    EmuWmmaMap() {
        uint64_t seed = emu_launch_seed() * 0x9E3779B97F4A7C15ull;
        a = (unsigned)(seed >> 17) | 1u;
        c = (unsigned)(seed >> 40);
        inv = a;  // a^-1 mod 2^32 by Newton's iteration (each step doubles the correct low bits)
        for (int i = 0; i < 5; i++) inv *= 2u - a * inv;
    }
    int elem(int s, int n) const { return (int)((a * (unsigned)s + c) & (unsigned)(n - 1)); }
    int slot(int pos, int n) const { return (int)((inv * ((unsigned)pos - c)) & (unsigned)(n - 1)); }
};
static inline void emu_wmma_check(const void* p, unsigned ldm, const char* what) {
    if ((uintptr_t)p % 32 != 0 || ldm % 4 != 0) {
        char b[200];
        snprintf(b, sizeof(b), "%s at %p with ldm %u: the pointer must be 256-bit aligned and ldm a multiple of 16 bytes "
                 "(4 floats); the result is undefined", what, p, ldm);
        emu_device_error("invalid wmma pointer or stride", b);
    }
}

static inline float __float_to_tf32(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;  // to nearest, ties away (magnitude)
    memcpy(&v, &u, 4);
    return v;
}

template <class F>
static inline void fill_fragment(F& f, float v) {
    for (int e = 0; e < F::num_elements; e++) f.x[e] = v;
}

// row-major (row_major, mem_row_major): element (r, c) at p[r * ldm + c]; column-major at p[c * ldm + r]
template <class F>
static inline void emu_wmma_load(F& f, const float* p, unsigned ldm, bool col, const char* file, int line) {
    emu_wmma_check(p, ldm, "wmma::load_matrix_sync");
    const EmuWmmaMap map;
    const int lane = (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32;
    for (int e = 0; e < F::num_elements; e++) {
        int pos = map.elem(lane * F::num_elements + e, F::R * F::C), r = pos / F::C, c = pos % F::C;
        f.x[e] = col ? p[(long)c * ldm + r] : p[(long)r * ldm + c];
    }
    __syncwarp(0xffffffffu, file, line);
}
template <class Use, class L>
static inline void load_matrix_sync(fragment<Use, 16, 16, 8, precision::tf32, L>& f, const float* p, unsigned ldm,
                                    const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    emu_wmma_load(f, p, ldm, std::is_same<L, col_major>::value, file, line);
}
static inline void load_matrix_sync(fragment<accumulator, 16, 16, 8, float>& f, const float* p, unsigned ldm, layout_t layout,
                                    const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    emu_wmma_load(f, p, ldm, layout == mem_col_major, file, line);
}
static inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 8, float>& f, unsigned ldm, layout_t layout,
                                     const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    typedef fragment<accumulator, 16, 16, 8, float> F;
    emu_wmma_check(p, ldm, "wmma::store_matrix_sync");
    __syncwarp(0xffffffffu, file, line);
    const EmuWmmaMap map;
    const int lane = (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32;
    for (int e = 0; e < F::num_elements; e++) {
        int pos = map.elem(lane * F::num_elements + e, F::R * F::C), r = pos / F::C, c = pos % F::C;
        if (layout == mem_col_major) p[(long)c * ldm + r] = f.x[e];
        else p[(long)r * ldm + c] = f.x[e];
    }
}

// d = a b + c over the warp: each lane gets every lane's a, b and c, then computes its own elements of d
template <class LA, class LB>
static inline void mma_sync(fragment<accumulator, 16, 16, 8, float>& d, const fragment<matrix_a, 16, 16, 8, precision::tf32, LA>& a,
                            const fragment<matrix_b, 16, 16, 8, precision::tf32, LB>& b,
                            const fragment<accumulator, 16, 16, 8, float>& c, const char* file = __builtin_FILE(),
                            int line = __builtin_LINE()) {
    struct Part { float a[4], b[4], c[8]; };
    Part mine, all[32];
    memcpy(mine.a, a.x, sizeof(mine.a));
    memcpy(mine.b, b.x, sizeof(mine.b));
    memcpy(mine.c, c.x, sizeof(mine.c));
    emu_warp_gather(&mine, all, (int)sizeof(Part), "wmma::mma_sync", file, line);
    const EmuWmmaMap map;
    auto elem = [&](int which, int pos) {  // element pos of a (0), b (1) or c (2), from the lane that holds it
        const int n = which == 2 ? 256 : 128, per = n / 32, s = map.slot(pos, n);
        const Part& p = all[s / per];
        return which == 0 ? p.a[s % per] : which == 1 ? p.b[s % per] : p.c[s % per];
    };
    auto tf32 = [](float v) {
        uint32_t u;
        memcpy(&u, &v, 4);
        u &= 0xffffe000u;
        memcpy(&v, &u, 4);
        return v;
    };
    const int lane = (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32;
    for (int e = 0; e < 8; e++) {
        int pos = map.elem(lane * 8 + e, 256), r = pos / 16, col = pos % 16;
        float acc = elem(2, pos);
        for (int k = 0; k < 8; k++) acc += tf32(elem(0, r * 8 + k)) * tf32(elem(1, k * 16 + col));
        d.x[e] = acc;
    }
}

}  // namespace wmma
}  // namespace nvcuda
