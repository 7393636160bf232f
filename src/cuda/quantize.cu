// src/cuda/quantize.cu: the cast operations on the GPU - amax, per-group amax, quantize (with the
// transposed copy: cast_transpose) and dequantize - bit for bit those of src/ref/quantize.cpp:
// the same group amax (NaN canonical), the same scale formula (group_scale of core/math.hpp, built
// without FMA contraction: --fmad=false), the same encode of float32(x * scale).
// Checked by tests/ops/test_quantize.cpp (cuda against ref, every granularity, format, dtype,
// overflow mode, with NaN/Inf) when a GPU is present.
//
// Reads of the input: a quantize whose groups fit in a tile of at most 128 x 128 elements (block
// 1x128 and 128x128, mx32, small blocks - with their transposed groups too) reads x once: each
// thread block stages its tile in shared memory, reduces each group's amax there, computes the
// scales and encodes. Groups that do not fit (tensor current scaling of a large matrix, row and
// column scaling of long rows or columns) get their amax from a group_amax pass first: two reads
// (three for cast_transpose with row or column scaling, whose transposed groups are the other
// dimension). Delayed scaling (a given scale) needs no amax before encoding: one read.
// That tile kernel takes what the v2 kernels (issue 49; section "v2" below) do not: most casts
// take v2 - bf16 / f16 / f32 rows of a multiple of 8 elements, 16-byte aligned (the output's rows
// 8-byte aligned); without the transposed copy every grouping whose columns are a multiple of 8 or
// whole rows, with it (bf16 / f16 only) the recipes' groupings - tensor, row, block 1x128 and
// 128x128, mx32. The tile kernel keeps float32 with the transposed copy, the other group shapes
// and rows not a multiple of 8. The amax passes: lines_amax_kernel (v2) for tensor and row
// scaling on such rows, band_amax_kernel for bands of several whole rows, group_amax_kernel for
// the rest. Checked by the same tests; timed by bench_gemm_cuda --casts (scripts/
// cuda_device_check.sh, step casts) beside a device-to-device copy: docs/perf/cuda-h200-2026-11-27.json
// (docs/PERF.md: the earlier kernels').
#include <algorithm>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_fp8.h>

#include "core/math.hpp"
#include "cuda/common.cuh"
#include "fp8kit/error.hpp"

namespace fp8kit::cuda {

namespace {

using detail::MatrixRef;

constexpr int threads = 256;

// An input element as float (exact).
__device__ inline float to_float(float v) { return v; }
__device__ inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float to_float(__half v) { return __half2float(v); }

// Elements [at, at + 8) of x's storage as float (exact), from one 16-byte load (two for float32).
__device__ inline void load8(const MatrixRef& x, int64_t at, float* v, float) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(x.data) + at);
    const float4 a = p[0], b = p[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
template <class H>
__device__ inline void load8(const MatrixRef& x, int64_t at, float* v, H) {
    const uint4 w = *reinterpret_cast<const uint4*>(static_cast<const H*>(x.data) + at);
    const H* h = reinterpret_cast<const H*>(&w);
    for (int e = 0; e < 8; ++e) v[e] = to_float(h[e]);
}

// Whether x's rows can be read 8 elements at a time with 16-byte loads: rows of a multiple of 8
// elements, 8 apart, from a 16-byte-aligned start (the row-major kernels' and the band amax's
// condition on x).
bool vector_rows(const MatrixRef& x) {
    return x.cols % 8 == 0 && x.ld % 8 == 0 && reinterpret_cast<uintptr_t>(x.data) % 16 == 0;
}

// The max of `key` over the block (of `threads` threads), in every thread. Every thread calls it.
__device__ inline uint32_t block_max(uint32_t key) {
    __shared__ uint32_t warp_keys[threads / 32];
    key = warp_max(key);
    if (threadIdx.x % 32 == 0) warp_keys[threadIdx.x / 32] = key;
    __syncthreads();
    for (int k = 0; k < threads / 32; ++k) key = max(key, warp_keys[k]);
    __syncthreads();  // warp_keys free for the next call
    return key;
}

// ---- group amax: out[g] = max |x| over group g (keys: see abs_key), out zeroed first ----

// Small groups (<= 1024 elements): one warp per group. Large ones: `chunks` blocks per group, each
// reducing a run of the group's rows (threads along the row) and combining with atomicMax.
__global__ void group_amax_kernel(MatrixRef x, GroupShape g, int64_t gcols, int64_t ngroups, int64_t chunks,
                                  unsigned* out) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (chunks == 0) {  // warp per group
        const int64_t q = int64_t(blockIdx.x) * (threads / 32) + warp;
        if (q >= ngroups) return;
        const int64_t i0 = q / gcols * g.rows, j0 = q % gcols * g.cols;
        const int h = int(min(g.rows, x.rows - i0)), w = int(min(g.cols, x.cols - j0));
        uint32_t key = 0;
        for (int e = lane; e < h * w; e += 32) key = max(key, abs_key(load_element(x, i0 + e / w, j0 + e % w)));
        key = warp_max(key);
        if (lane == 0) out[q] = key;
        return;
    }
    const int64_t q = int64_t(blockIdx.x) / chunks, chunk = int64_t(blockIdx.x) % chunks;
    const int64_t i0 = q / gcols * g.rows, j0 = q % gcols * g.cols;
    const int64_t h = min(g.rows, x.rows - i0), w = min(g.cols, x.cols - j0);
    const int64_t per = (h + chunks - 1) / chunks, r1 = min(h, (chunk + 1) * per);
    uint32_t key = 0;
    for (int64_t r = chunk * per; r < r1; ++r) {
        for (int64_t c = threadIdx.x; c < w; c += threads) key = max(key, abs_key(load_element(x, i0 + r, j0 + c)));
    }
    key = block_max(key);
    if (threadIdx.x == 0) atomicMax(&out[q], key);
}

// Groups of whole rows, on rows of a multiple of 8 elements, 16-byte aligned: bands of several
// rows (tensor and row scaling take lines_amax_kernel, below). Why not group_amax_kernel: element
// by element, its loads cap such a read far under the memory's rate. Here a warp
// takes a row at a time, 8 elements a lane from one 16-byte load, 4 loads in flight; a warp's
// running max goes out when its band changes, and with one band once per block.
template <class T>
__global__ void band_amax_kernel(MatrixRef x, int64_t band_rows, unsigned* out) {
    const int lane = threadIdx.x % 32;
    const bool one_band = band_rows >= x.rows;
    const int64_t warps = int64_t(gridDim.x) * (threads / 32);
    int64_t band = -1;
    uint32_t run = 0;
    for (int64_t i = int64_t(blockIdx.x) * (threads / 32) + threadIdx.x / 32; i < x.rows; i += warps) {
        if (i / band_rows != band) {  // warp-uniform: i is the warp's
            run = warp_max(run);
            if (band >= 0 && lane == 0) atomicMax(&out[band], run);
            band = i / band_rows;
            run = 0;
        }
        for (int64_t j = int64_t(lane) * 8; j < x.cols; j += 4 * 256) {
            float v[4][8];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                if (j + u * 256 < x.cols) {
                    load8(x, i * x.ld + j + u * 256, v[u], T{});
                } else {
                    for (int e = 0; e < 8; ++e) v[u][e] = 0.0f;
                }
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                for (int e = 0; e < 8; ++e) run = max(run, abs_key(v[u][e]));
            }
        }
    }
    if (!one_band) {
        run = warp_max(run);
        if (band >= 0 && lane == 0) atomicMax(&out[band], run);
        return;
    }
    run = block_max(run);
    if (threadIdx.x == 0) atomicMax(out, run);
}

// ==== v2: the casts at memory speed (issue 49) ====
//
// Bytes per element of a bf16 -> FP8 cast: 2 read + 1 written (+ 1 for the transposed copy), the
// floor at the device-to-device copy's rate. What costs on top: a second read where the scale
// needs the amax of a group that a thread block cannot hold (tensor scaling: the amax pass, then
// the cast walking x from its end, where the pass's last reads may still be in L2), and
// instructions: at 4 TB/s an H200 has about 0.8 warp instructions per element to spend (132 SMs x 4
// schedulers x 1.98 GHz over 1.33 G elements/ms). So the v2 kernels keep elements as they were
// loaded (16-bit pairs in 32-bit words: 8 elements, 4 registers), take magnitudes' maxima on the
// pairs (vmax.u16x2: a bf16 or f16 magnitude orders as its bits do, NaN above Inf), encode two
// elements per conversion (cvt.rn.satfinite.*x2) and test for NaN / Inf once per 8 elements, not
// per element. Codes and scales are those of encode_scaled and group_scale, as in the tile kernel:
// bit for bit ref's (the NaN/Inf and nonsaturating cases take encode_scaled element by element).
// Measured on an H200 (docs/perf/cuda-h200-2026-11-27.json, casts_run1_all_variants) against the
// row-major float kernels they replaced (0.27-0.42x the copy) and against row scaling through the
// amax pass with tensor scaling's second read walking forward: these won or tied on every cast.

// n / d for n < 2^32 and a divisor fixed at launch (Granlund-Montgomery: one multiply-high, an add
// and a shift instead of a 32-bit division's ~20 instructions).
struct FastDiv {
    uint32_t d = 1, mul = 1, shift = 0;
    FastDiv() = default;
    explicit FastDiv(uint32_t divisor) : d(divisor) {
        while ((uint64_t(1) << shift) < d) ++shift;
        mul = uint32_t((uint64_t(1) << 32) * ((uint64_t(1) << shift) - d) / d + 1);
    }
    __device__ uint32_t div(uint32_t n) const { return uint32_t((uint64_t(__umulhi(n, mul)) + n) >> shift); }
};

// 8 consecutive elements of a row as loaded: one 16-byte load (two for float32).
template <class T>
struct Chunk {
    uint32_t w[sizeof(T) == 4 ? 8 : 4];
};

template <class T>
__device__ inline Chunk<T> load_chunk(const T* p) {
    Chunk<T> c;
#pragma unroll
    for (int k = 0; k < int(sizeof(T)) / 2; ++k) {
        const uint4 a = reinterpret_cast<const uint4*>(p)[k];
        c.w[4 * k] = a.x, c.w[4 * k + 1] = a.y, c.w[4 * k + 2] = a.z, c.w[4 * k + 3] = a.w;
    }
    return c;
}

template <class T>
__device__ inline Chunk<T> zero_chunk() {
    Chunk<T> c;
#pragma unroll
    for (auto& w : c.w) w = 0;
    return c;
}

// Element `half` (0: low 16 bits) of a word of two 16-bit elements, as float (exact).
template <class T>
__device__ inline float pair_element(uint32_t word, int half) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        return __uint_as_float(half != 0 ? word & 0xffff0000u : word << 16);
    } else {
        return __half2float(__ushort_as_half(uint16_t(half != 0 ? word >> 16 : word & 0xffffu)));
    }
}

// Element e (a compile-time constant once unrolled) of a chunk, as float (exact).
template <class T>
__device__ inline float chunk_element(const Chunk<T>& c, int e) {
    if constexpr (sizeof(T) == 4) {
        return __uint_as_float(c.w[e]);
    } else {
        return pair_element<T>(c.w[e / 2], e % 2);
    }
}

// Magnitudes folded into acc in the element type's own bit order: for 16-bit types two lanes of
// 16 bits (the max of the even and of the odd elements), for float32 one. Why bits: |v| of a bf16,
// f16 or float32 orders as its sign-cleared bits do, and every NaN's bits lie above Inf's, so one
// integer max per pair replaces a conversion, a compare and a select per element.
template <class T>
__device__ inline uint32_t fold_mags(uint32_t acc, const Chunk<T>& c) {
#pragma unroll
    for (uint32_t w : c.w) acc = sizeof(T) == 4 ? max(acc, w & 0x7fffffffu) : __vmaxu2(acc, w & 0x7fff7fffu);
    return acc;
}

// A fold as an amax key (abs_key's order: float32 bits of the magnitude, NaN canonical): the max
// commutes with the widening (monotone) and with the NaN canonicalisation.
template <class T>
__device__ inline uint32_t mags_key(uint32_t acc) {
    uint32_t b = acc;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        b = max(acc & 0xffffu, acc >> 16) << 16;
    } else if constexpr (std::is_same_v<T, __half>) {
        b = __float_as_uint(__half2float(__ushort_as_half(uint16_t(max(acc & 0xffffu, acc >> 16)))));
    }
    return b > 0x7f800000u ? detail::canonical_nan_bits : b;
}

// ---- v2 amax pass: per-row keys, per-column keys and the whole input's, in one read ----
//
// A block: 256 columns (a warp's 32 chunks) by a band of rows, its 8 warps taking every 8th row,
// 4 rows' loads in flight. Row keys: a warp max and an atomicMax per row and block; column keys:
// each lane's 8 columns over its rows, the 8 warps combined in shared memory, an atomicMax per
// column and block; the total: one atomicMax per block. Keys (abs_key order) into zeroed words.
struct LinesJob {
    MatrixRef x;
    uint32_t band_rows;
    unsigned* row_keys;  // [rows] or null
    unsigned* col_keys;  // [cols] or null
    unsigned* total;     // [1] or null
};

template <class T>
__global__ void __launch_bounds__(threads) lines_amax_kernel(LinesJob job) {
    constexpr int words = sizeof(T) == 4 ? 8 : 4;
    __shared__ uint32_t col_part[threads / 32][words][32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const uint32_t rows = uint32_t(job.x.rows), cols = uint32_t(job.x.cols);
    const uint32_t j = blockIdx.x * 256u + uint32_t(lane) * 8u;
    const bool in_col = j < cols;
    const uint32_t i0 = blockIdx.y * job.band_rows, i1 = min(rows, i0 + job.band_rows);
    const T* x = static_cast<const T*>(job.x.data);
    uint32_t cacc[words] = {};
    for (uint32_t i = i0 + uint32_t(warp); i < i1; i += 4 * (threads / 32)) {  // warp-uniform
        Chunk<T> c[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const uint32_t r = i + uint32_t(u) * (threads / 32);
            c[u] = r < i1 && in_col ? load_chunk(x + int64_t(r) * job.x.ld + j) : zero_chunk<T>();
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
#pragma unroll
            for (int k = 0; k < words; ++k) {
                cacc[k] = sizeof(T) == 4 ? max(cacc[k], c[u].w[k] & 0x7fffffffu) : __vmaxu2(cacc[k], c[u].w[k] & 0x7fff7fffu);
            }
            if (job.row_keys != nullptr) {
                const uint32_t r = i + uint32_t(u) * (threads / 32);
                const uint32_t key = warp_max(mags_key<T>(fold_mags<T>(0, c[u])));
                if (lane == 0 && r < i1) atomicMax(&job.row_keys[r], key);
            }
        }
    }
    if (job.col_keys != nullptr) {
#pragma unroll
        for (int k = 0; k < words; ++k) col_part[warp][k][lane] = cacc[k];
        __syncthreads();
        // Thread t: column blockIdx.x * 256 + t, lane t / 8's word (t % 8) / (8 / words).
        const int l = threadIdx.x / 8, e = threadIdx.x % 8, k = e / (8 / words);
        uint32_t m = 0;
        // Packed 16-bit magnitudes are maxed half by half (a plain max would pick by the high half).
        for (int w = 0; w < threads / 32; ++w) m = sizeof(T) == 4 ? max(m, col_part[w][k][l]) : __vmaxu2(m, col_part[w][k][l]);
        if constexpr (sizeof(T) != 4) m = e % 2 != 0 ? m >> 16 : m & 0xffffu;
        const uint32_t col = blockIdx.x * 256u + uint32_t(threadIdx.x);
        if (col < cols) atomicMax(&job.col_keys[col], mags_key<T>(m));
    }
    if (job.total != nullptr) {
        uint32_t t = 0;
#pragma unroll
        for (int k = 0; k < words; ++k) t = sizeof(T) == 4 ? max(t, cacc[k]) : __vmaxu2(t, cacc[k]);
        t = block_max(mags_key<T>(t));
        if (threadIdx.x == 0) atomicMax(job.total, t);
    }
}

int multiprocessors() {
    static const int n = [] {
        int device = 0, count = 0;
        FP8KIT_CUDA_CHECK(cudaGetDevice(&device));
        FP8KIT_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
        return count;
    }();
    return n;
}

// Whether the v2 kernels take x: vector rows (see vector_rows), sizes in 32-bit arithmetic.
bool v2_shape(const MatrixRef& x) {
    constexpr int64_t limit = int64_t(1) << 30;  // rows, columns, trips and groups in 32-bit arithmetic
    return vector_rows(x) && x.rows < limit && x.cols < limit && x.rows * ((x.cols + 255) / 256) < (int64_t(1) << 31);
}

// Enqueues the amax pass over x (vector rows): each of rows / cols / total (float keys) zeroed,
// then filled; a null one is skipped.
void launch_lines_amax(cudaStream_t s, const MatrixRef& x, float* rows, float* cols, float* total) {
    if (rows != nullptr) FP8KIT_CUDA_CHECK(cudaMemsetAsync(rows, 0, size_t(x.rows) * sizeof(float), s));
    if (cols != nullptr) FP8KIT_CUDA_CHECK(cudaMemsetAsync(cols, 0, size_t(x.cols) * sizeof(float), s));
    if (total != nullptr) FP8KIT_CUDA_CHECK(cudaMemsetAsync(total, 0, sizeof(float), s));
    // About 8 blocks a multiprocessor; bands of a multiple of 32 rows (4 rows a warp per trip).
    const int64_t slabs = (x.cols + 255) / 256, target = 8 * int64_t(multiprocessors());
    const int64_t bands = std::clamp<int64_t>((target + slabs - 1) / slabs, 1, (x.rows + 31) / 32);
    const int64_t band_rows = ((x.rows + bands - 1) / bands + 31) / 32 * 32;
    const dim3 grid(unsigned(slabs), unsigned((x.rows + band_rows - 1) / band_rows));
    const LinesJob j{x, uint32_t(band_rows), reinterpret_cast<unsigned*>(rows), reinterpret_cast<unsigned*>(cols),
                     reinterpret_cast<unsigned*>(total)};
    switch (x.dtype) {
        case DType::bf16: lines_amax_kernel<__nv_bfloat16><<<grid, threads, 0, s>>>(j); break;
        case DType::f16: lines_amax_kernel<__half><<<grid, threads, 0, s>>>(j); break;
        default: lines_amax_kernel<float><<<grid, threads, 0, s>>>(j); break;
    }
    check_launch("lines_amax_kernel");
}


// Enqueues the group amax of x into out (float bits), zeroing out first.
void launch_group_amax(cudaStream_t s, const MatrixRef& x, GroupShape g, float* out) {
    const int64_t grows = (x.rows + g.rows - 1) / g.rows, gcols = (x.cols + g.cols - 1) / g.cols;
    const int64_t ngroups = grows * gcols, size = min(g.rows, x.rows) * min(g.cols, x.cols);
    if (g.cols >= x.cols && (g.rows == 1 || g.rows >= x.rows) && v2_shape(x)) {
        const bool one = g.rows >= x.rows;
        return launch_lines_amax(s, x, one ? nullptr : out, nullptr, one ? out : nullptr);
    }
    FP8KIT_CUDA_CHECK(cudaMemsetAsync(out, 0, size_t(ngroups) * sizeof(float), s));
    if (g.cols >= x.cols && vector_rows(x)) {
        // At most 2048 blocks of 8 warps: a row or more a warp; with one band, that many atomics.
        const unsigned blocks = blocks_for(x.rows, threads / 32, 2048);
        auto* keys = reinterpret_cast<unsigned*>(out);
        switch (x.dtype) {
            case DType::bf16: band_amax_kernel<__nv_bfloat16><<<blocks, threads, 0, s>>>(x, g.rows, keys); break;
            case DType::f16: band_amax_kernel<__half><<<blocks, threads, 0, s>>>(x, g.rows, keys); break;
            default: band_amax_kernel<float><<<blocks, threads, 0, s>>>(x, g.rows, keys); break;
        }
        check_launch("band_amax_kernel");
    } else if (size <= 1024) {
        group_amax_kernel<<<blocks_for(ngroups, threads / 32, 1u << 30), threads, 0, s>>>(x, g, gcols, ngroups, 0,
                                                                                      reinterpret_cast<unsigned*>(out));
    } else {
        // Runs of rows with about 16 elements per thread (at least one row each), at most 2^30 blocks.
        const int64_t h = std::min(g.rows, x.rows), w = std::min(g.cols, x.cols);
        const int64_t rows_per = std::max<int64_t>(1, threads * 16 / w);
        const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>((h + rows_per - 1) / rows_per, (int64_t(1) << 30) / ngroups));
        group_amax_kernel<<<unsigned(ngroups * chunks), threads, 0, s>>>(x, g, gcols, ngroups, chunks,
                                                                       reinterpret_cast<unsigned*>(out));
    }
    check_launch("group_amax_kernel");
}

// ---- quantize: tiles staged in shared memory ----

// One grouping of the elements of x as the tile kernel sees it: groups of `rows` x `cols` elements
// of x (for the transposed copy: the transposed groups, seen on x), their scales stored row-major
// over the groups, or - transposed - column-major (the scale_inv_t layout).
struct Grouping {
    int64_t rows, cols;   // a group, on x
    int64_t grid_rows, grid_cols;  // groups over x
    bool transposed;      // scale index gj * grid_rows + gi (scale_inv_t) instead of gi * grid_cols + gj
    bool in_tile;         // each group lies in one tile: its amax is reduced in shared memory
    const float* amax;    // otherwise: the group amaxes (group_amax pass on x, row-major over the
                          // groups as seen on x), or null with a fixed scale
    uint8_t* data;        // codes: x's layout, or x^T's (transposed)
    void* scale_inv;
    int64_t local_max;    // groups one tile touches, at most
};

struct TileJob {
    MatrixRef x;
    detail::ScaleRule rule;
    Overflow overflow;
    int64_t tile_rows, tile_cols, tiles_across;
    Grouping g[2];
    int count;            // 1, or 2 with the transposed copy
    unsigned* amax;       // the whole input's (key), combined with atomicMax
};

__device__ inline int64_t scale_index(const Grouping& G, int64_t gi, int64_t gj) {
    return G.transposed ? gj * G.grid_rows + gi : gi * G.grid_cols + gj;
}

__device__ inline void store_scale(const Grouping& G, const detail::ScaleRule& rule, int64_t gi, int64_t gj,
                                   const detail::GroupScale& s) {
    const int64_t at = scale_index(G, gi, gj);
    if (rule.mx) {
        static_cast<uint8_t*>(G.scale_inv)[at] = s.e8m0;
    } else {
        static_cast<float*>(G.scale_inv)[at] = s.scale_inv;
    }
}

// encode(v * s) as ref's quantize does it, for the format F fixed at compile time (so the generic
// encode folds to that format's constants). e4m3fn and e5m2 saturating: the hardware conversion
// (cvt.rn.satfinite, sm_89+) rounds to nearest even and clamps every finite value to the largest
// finite code, which is ref's saturating encode - bit for bit (the test grid checks every format,
// mode and special); an Inf input keeps its nonsaturating code (the non-finite policy), so it and
// NaN take the generic path.
template <Format F>
__device__ inline uint8_t encode_scaled(float v, float s, Overflow o) {
    const float x = v * s;
    if constexpr (F == Format::e4m3fn || F == Format::e5m2) {
        if (o == Overflow::saturate && !isinf(v) && !isnan(x)) {
            return uint8_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, F == Format::e4m3fn ? __NV_E4M3 : __NV_E5M2));
        }
    }
    return encode(x, F, isinf(v) ? Overflow::nonsaturating : o);
}

// Shared memory: the tile as float [tile_rows][tile_cols + 1] (the pad keeps column walks off one
// bank), each grouping's local scales, then each grouping's local group row of every tile row and
// group column of every tile column (so the encode loop divides nothing).
template <Format F, class T>
__global__ void quantize_tile_kernel(TileJob job) {
    extern __shared__ float smem[];
    const int tr = int(job.tile_rows), tc = int(job.tile_cols), pitch = tc + 1;
    float* tile = smem;
    float* scales[2] = {tile + tr * pitch, tile + tr * pitch + job.g[0].local_max};
    int* groups_of = reinterpret_cast<int*>(scales[1] + (job.count == 2 ? job.g[1].local_max : 0));
    int* row_group[2] = {groups_of, groups_of + tr + tc};
    int* col_group[2] = {groups_of + tr, groups_of + 2 * tr + tc};
    const int64_t r0 = int64_t(blockIdx.x) / job.tiles_across * tr;
    const int64_t c0 = int64_t(blockIdx.x) % job.tiles_across * tc;
    const int h = int(min(int64_t(tr), job.x.rows - r0)), w = int(min(int64_t(tc), job.x.cols - c0));
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

    // Stage the tile (zeros outside x: they change no amax) and reduce the whole input's amax.
    // (r, c) walk the tile row-major, threads apart, without a division per element.
    uint32_t key = 0;
    const T* x = static_cast<const T*>(job.x.data);
    for (int r = threadIdx.x / tc, c = threadIdx.x % tc; r < tr;) {
        const float v = r < h && c < w ? to_float(x[(r0 + r) * job.x.ld + c0 + c]) : 0.0f;
        tile[r * pitch + c] = v;
        key = max(key, abs_key(v));
        for (c += threads; c >= tc; c -= tc) ++r;
    }
    // One atomic per block (per warp, 8 x 16k blocks on one address serialised in L2 and took
    // most of a quantize's time).
    key = warp_max(key);
    __shared__ uint32_t warp_keys[threads / 32];
    if (lane == 0) warp_keys[warp] = key;

    // Each grouping's local group of every tile row and column.
    for (int k = 0; k < job.count; ++k) {
        const Grouping& G = job.g[k];
        const int64_t gi0 = r0 / G.rows, gj0 = c0 / G.cols;
        for (int r = threadIdx.x; r < tr; r += threads) row_group[k][r] = int((r0 + r) / G.rows - gi0);
        for (int c = threadIdx.x; c < tc; c += threads) col_group[k][c] = int((c0 + c) / G.cols - gj0);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 1; k < threads / 32; ++k) key = max(key, warp_keys[k]);
        atomicMax(job.amax, key);
    }

    // Each grouping's scales for the groups this tile touches.
    for (int k = 0; k < job.count; ++k) {
        const Grouping& G = job.g[k];
        const int64_t gi0 = r0 / G.rows, gj0 = c0 / G.cols;
        const int lrows = row_group[k][h - 1] + 1, lcols = col_group[k][w - 1] + 1;
        if (G.in_tile) {  // a warp per group, reduced from the tile
            const int gr = int(G.rows), gc = int(G.cols);
            for (int q = warp; q < lrows * lcols; q += threads / 32) {
                const int li = q / lcols, lj = q - li * lcols;
                const int gh = min(gr, h - li * gr), gw = min(gc, w - lj * gc);
                uint32_t gk = 0;
                for (int e = lane; e < gh * gw; e += 32) {
                    const int er = e / gw;
                    gk = max(gk, abs_key(tile[(li * gr + er) * pitch + lj * gc + e - er * gw]));
                }
                gk = warp_max(gk);
                if (lane == 0) {
                    const detail::GroupScale sc = detail::group_scale(__uint_as_float(gk), job.rule);
                    scales[k][q] = sc.scale;
                    store_scale(G, job.rule, gi0 + li, gj0 + lj, sc);
                }
            }
        } else {  // amax from the group_amax pass (or a fixed scale); the tile holding a group's first element stores its scale
            for (int q = threadIdx.x; q < lrows * lcols; q += threads) {
                const int64_t gi = gi0 + q / lcols, gj = gj0 + q % lcols;
                const float a = G.amax != nullptr ? G.amax[gi * G.grid_cols + gj] : 0.0f;
                const detail::GroupScale sc = detail::group_scale(a, job.rule);
                scales[k][q] = sc.scale;
                if (gi * G.rows >= r0 && gj * G.cols >= c0) store_scale(G, job.rule, gi, gj, sc);
            }
        }
    }
    __syncthreads();

    // Encode, 4 codes per thread: along a row of x for its layout, along a column of x (a row of
    // x^T) for the transposed copy - one 32-bit store each where the 4 codes are aligned and inside.
    for (int k = 0; k < job.count; ++k) {
        const Grouping& G = job.g[k];
        const int lcols = col_group[k][w - 1] + 1;
        const int along = G.transposed ? tr : tc;         // the stored direction
        const int64_t line_len = G.transposed ? job.x.rows : job.x.cols;  // of the output
        const int64_t start = G.transposed ? r0 : c0;
        const int lim_along = G.transposed ? h : w, lim_across = G.transposed ? w : h;
        const int quads = (along + 3) / 4;
        for (int next = threadIdx.x / quads, q = threadIdx.x % quads; next < lim_across;) {
            const int across = next, at = q * 4;
            for (q += threads; q >= quads; q -= quads) ++next;  // this thread's next (across, quad)
            uint32_t word = 0;
            int n = 0;
            for (; n < 4 && at + n < lim_along; ++n) {
                const int r = G.transposed ? at + n : across, c = G.transposed ? across : at + n;
                const float v = tile[r * pitch + c];
                const float sc = scales[k][row_group[k][r] * lcols + col_group[k][c]];
                const uint8_t code = encode_scaled<F>(v, sc, job.overflow);
                word |= uint32_t(code) << (8 * n);
            }
            if (n == 0) continue;
            const int64_t line = (G.transposed ? c0 : r0) + across;
            uint8_t* dst = G.data + line * line_len + start + at;
            if (n == 4 && reinterpret_cast<uintptr_t>(dst) % 4 == 0) {
                *reinterpret_cast<uint32_t*>(dst) = word;
            } else {
                for (int b = 0; b < n; ++b) dst[b] = uint8_t(word >> (8 * b));
            }
        }
    }
}

constexpr int64_t max_tile_side = 128;
constexpr size_t max_tile_smem = 96 * 1024;

// ---- dequantize ----

__global__ void dequantize_kernel(detail::DequantizeJob job, int64_t gcols) {
    const int64_t n = job.rows * job.cols;
    for (int64_t e = grid_first(); e < n; e += grid_step()) {
        const int64_t i = e / job.cols, j = e % job.cols;
        const int64_t k = i / job.group.rows * gcols + j / job.group.cols;
        const float s = job.e8m0 ? decode(static_cast<const uint8_t*>(job.scale_inv)[k], Format::e8m0fnu)
                                 : static_cast<const float*>(job.scale_inv)[k];
        const float v = decode(job.data[e], job.format) * s;
        switch (job.out_dtype) {
            case DType::bf16: static_cast<bf16*>(job.out)[e] = bf16(v); break;
            case DType::f16: static_cast<f16*>(job.out)[e] = f16(v); break;
            default: static_cast<float*>(job.out)[e] = v; break;
        }
    }
}

// The codes of a * s, b * s, c * s, d * s in one word (a in the low byte), when saturating, every
// element finite and s finite: then every product is finite or +-Inf, and the hardware's satfinite
// conversion, two at a time, is ref's encode (as in encode_scaled).
template <Format F>
__device__ inline uint32_t encode4_fast(float a, float b, float c, float d, float s) {
    constexpr __nv_fp8_interpretation_t kind = F == Format::e4m3fn ? __NV_E4M3 : __NV_E5M2;
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a * s, b * s), __NV_SATFINITE, kind);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c * s, d * s), __NV_SATFINITE, kind);
    return lo | hi << 16;
}

// Whether encode4_fast encodes elements whose magnitudes' key is `key` with scale s.
template <Format F>
__device__ inline bool fast_path(uint32_t key, float s, Overflow o) {
    return (F == Format::e4m3fn || F == Format::e5m2) && o == Overflow::saturate && key < 0x7f800000u && isfinite(s);
}

// The other cases (NaN, Inf, nonsaturating, the fnuz formats): dst[k] = the code of src[k * stride]
// times s for k < n, element by element through encode_scaled. Not inlined and a loop: one copy of
// the generic encode per kernel instead of one per unrolled call site (code size, registers).
template <Format F, class T>
__device__ __noinline__ void encode_slow(const T* src, int stride, uint8_t* dst, int n, float s, Overflow o) {
    for (int k = 0; k < n; ++k) dst[k] = encode_scaled<F>(to_float(src[k * stride]), s, o);
}

// The 8 codes of chunk c (loaded from src) times s, stored at dst (8-byte aligned). `key`: the
// chunk's own amax key.
template <Format F, class T>
__device__ inline void encode_chunk(const Chunk<T>& c, const T* src, float s, Overflow o, uint32_t key, uint8_t* dst) {
    if constexpr (F == Format::e4m3fn || F == Format::e5m2) {
        if (fast_path<F>(key, s, o)) {
            *reinterpret_cast<uint2*>(dst) =
                make_uint2(encode4_fast<F>(chunk_element(c, 0), chunk_element(c, 1), chunk_element(c, 2), chunk_element(c, 3), s),
                           encode4_fast<F>(chunk_element(c, 4), chunk_element(c, 5), chunk_element(c, 6), chunk_element(c, 7), s));
            return;
        }
    }
    encode_slow<F, T>(src, 1, dst, 8, s, o);
}

// ---- v2 streaming cast: no transposed copy, groups of 1 x gc in a warp, or amaxes given ----
//
// A trip: 32 chunks (256 elements) of one row, a chunk a lane; a warp takes K consecutive trips
// with their K loads issued first. Groups of 1 x gc (gc = 8 ... 256, a power of two: block 1x128,
// mx32) are reduced over their gc / 8 lanes (trips start at multiples of 256 in a row, so no group
// spans two); other groups take their amax from the pass before (row scaling: one per row),
// tensor scaling and a fixed scale one scale for all, computed once. A grid of one wave, each warp
// looping, one atomicMax a block for the total.
struct StreamJob {
    MatrixRef x;
    detail::ScaleRule rule;
    Overflow overflow;
    Grouping g;
    int lanes;          // gc / 8, reduced in the warp; 0: amax from g.amax (or the fixed scale)
    uint32_t gshift;    // log2(gc) when lanes > 0
    bool one_scale;     // one group, or a fixed scale
    bool reverse;       // trips from the last one on (after the amax pass: its last reads may be in L2)
    FastDiv per_row;    // trips a row
    uint32_t trips;
    unsigned* amax;
};

template <Format F, class T, int K>
__global__ void __launch_bounds__(threads) cast_stream_kernel(StreamJob job) {
    const Grouping& G = job.g;
    const int lane = threadIdx.x % 32;
    const uint32_t cols = uint32_t(job.x.cols), per_row = job.per_row.d;
    const T* x = static_cast<const T*>(job.x.data);
    float one = 0.0f;
    if (job.one_scale) {
        const detail::GroupScale sc = detail::group_scale(G.amax != nullptr ? *G.amax : 0.0f, job.rule);
        one = sc.scale;
        if (blockIdx.x == 0 && threadIdx.x == 0) store_scale(G, job.rule, 0, 0, sc);
    }
    uint32_t total = 0;
    const uint32_t step = gridDim.x * (threads / 32) * K;
    for (uint32_t base = (blockIdx.x * (threads / 32) + threadIdx.x / 32) * K; base < job.trips; base += step) {
        Chunk<T> c[K];
        uint32_t i[K], j[K];
        bool in[K];
#pragma unroll
        for (int u = 0; u < K; ++u) {
            const bool valid = base + u < job.trips;
            const uint32_t t = job.reverse ? job.trips - 1 - min(base + u, job.trips - 1) : base + u;
            i[u] = job.per_row.div(t);
            j[u] = (t - i[u] * per_row) * 256u + uint32_t(lane) * 8u;
            in[u] = valid && j[u] < cols;
            c[u] = in[u] ? load_chunk(x + int64_t(i[u]) * job.x.ld + j[u]) : zero_chunk<T>();
        }
#pragma unroll
        for (int u = 0; u < K; ++u) {
            const uint32_t key = mags_key<T>(fold_mags<T>(0, c[u]));
            total = max(total, key);
            float s = one;
            if (!job.one_scale) {
                float amax = 0.0f;
                uint32_t gi = i[u], gj = 0;
                if (job.lanes > 0) {  // the group's lanes: an aligned run of job.lanes in the warp
                    uint32_t gk = key;
                    for (int o = job.lanes / 2; o > 0; o >>= 1) gk = max(gk, __shfl_xor_sync(0xffffffffu, gk, o));
                    amax = __uint_as_float(gk);
                    gj = j[u] >> job.gshift;
                } else {
                    gi = G.rows == 1 ? i[u] : i[u] / uint32_t(G.rows);
                    gj = G.cols >= cols ? 0 : j[u] / uint32_t(G.cols);
                    if (in[u] && G.amax != nullptr) amax = G.amax[int64_t(gi) * G.grid_cols + gj];
                }
                const detail::GroupScale sc = detail::group_scale(amax, job.rule);
                s = sc.scale;
                if (in[u] && i[u] == gi * uint32_t(G.rows) && j[u] == gj * uint32_t(min(G.cols, job.x.cols))) {
                    store_scale(G, job.rule, gi, gj, sc);  // the group's first chunk
                }
            }
            if (in[u]) {
                const int64_t at = int64_t(i[u]) * job.x.ld + j[u];
                encode_chunk<F, T>(c[u], x + at, s, job.overflow, key, G.data + int64_t(i[u]) * cols + j[u]);
            }
        }
    }
    total = block_max(total);
    if (threadIdx.x == 0) atomicMax(job.amax, total);
}

// ---- v2 one group a block: groups of up to 8 chunks a thread held as loaded ----
//
// Block 128x128 (8 chunks a thread) and row scaling (rows up to 16384 elements: one read instead
// of the amax pass and a second read). An earlier version of this kernel held the elements as
// float (96 registers, 2 blocks a multiprocessor: 0.27x the copy on an H200); here they stay as loaded (4
// registers a chunk), so more blocks share a multiprocessor and one block's loads overlap another's
// reduction. Chunk c of a group: row c / gw8, chunk column c % gw8 (gw8: the group's width in
// chunks), masked at x's edges. A grid of one wave, blocks looping over the groups.
struct BlockJob {
    MatrixRef x;
    detail::ScaleRule rule;
    Overflow overflow;
    Grouping g;
    FastDiv gw8;   // the group's width in chunks (min(g.cols, cols) / 8)
    unsigned* amax;
};

template <Format F, class T, int CH>
__global__ void __launch_bounds__(threads) cast_groups_kernel(BlockJob job) {
    const Grouping& G = job.g;
    const uint32_t rows = uint32_t(job.x.rows), cols = uint32_t(job.x.cols), gw8 = job.gw8.d;
    const T* x = static_cast<const T*>(job.x.data);
    const int64_t ngroups = G.grid_rows * G.grid_cols;
    uint32_t total = 0;
    for (int64_t q = blockIdx.x; q < ngroups; q += gridDim.x) {
        const uint32_t gi = uint32_t(q / G.grid_cols), gj = uint32_t(q - int64_t(gi) * G.grid_cols);
        const uint32_t i0 = gi * uint32_t(G.rows), j0 = gj * gw8 * 8u;
        const uint32_t h = min(uint32_t(G.rows), rows - i0), w8 = min(gw8 * 8u, cols - j0) / 8u;
        Chunk<T> c[CH];
        uint32_t acc = 0;
#pragma unroll
        for (int u = 0; u < CH; ++u) {
            const uint32_t n = threadIdx.x + uint32_t(u) * threads, r = job.gw8.div(n), k = n - r * gw8;
            c[u] = r < h && k < w8 ? load_chunk(x + int64_t(i0 + r) * job.x.ld + j0 + k * 8u) : zero_chunk<T>();
            acc = fold_mags<T>(acc, c[u]);
        }
        const uint32_t mine = mags_key<T>(acc), key = block_max(mine);
        total = max(total, key);
        const detail::GroupScale sc = detail::group_scale(__uint_as_float(key), job.rule);
        if (threadIdx.x == 0) store_scale(G, job.rule, gi, gj, sc);
#pragma unroll
        for (int u = 0; u < CH; ++u) {
            const uint32_t n = threadIdx.x + uint32_t(u) * threads, r = job.gw8.div(n), k = n - r * gw8;
            if (r < h && k < w8) {
                encode_chunk<F, T>(c[u], x + int64_t(i0 + r) * job.x.ld + j0 + k * 8u, sc.scale, job.overflow, mine,
                                   G.data + int64_t(i0 + r) * cols + j0 + k * 8u);
            }
        }
    }
    if (threadIdx.x == 0) atomicMax(job.amax, total);  // total is the block's (block_max)
}

// ---- v2 cast with the transposed copy: 128 x 128 tiles through shared memory ----
//
// The general tile kernel (0.06-0.08x the copy on an H200) stages every element as float, finds its
// group through tables and stores 4 codes at a time. Here, for bf16 and f16 rows of a multiple of
// 8 elements: a tile of 128 x 128 elements, 8 chunks a thread (16-byte loads; a half-warp holds a
// tile row), kept in registers and copied as loaded into shared memory (32 KB, rows of 64 words).
// x's codes come from the registers: 8 codes a chunk, one 8-byte store. The transposed copy's from
// shared memory: thread t takes columns 2p, 2p+1 (p = t % 64) over rows 32q ... 32q + 31 (q = t /
// 64), 32 words read down a column pair (a warp reads 32 consecutive words of a row: no bank
// conflict), and stores each column's 32 codes as two 16-byte stores. Groups (each a mode):
//   x's (rows): kRun 1 x n (n = 8 ... 128: mx32, block 1x128) reduced over n / 8 lanes; kTile
//     (block 128x128: the tile) over the block; kOne (tensor: the amax pass, or the fixed scale);
//     kLine (row scaling: the pass's row amaxes).
//   the transposed copy's (columns of x): kRun n x 1 (n = 32, 64, 128) over the n / 32 threads of a
//     column run (through shared memory); kTile; kOne; kLine (the pass's column amaxes).
enum TileMode : int { kOne, kLine, kRun, kTile };

struct TransposeJob {
    MatrixRef x;
    detail::ScaleRule rule;
    Overflow overflow;
    Grouping g[2];       // x's groups (codes: data), the transposed copy's seen on x (codes: data_t)
    int mode[2];
    int run[2];          // kRun: the group's length along x's rows (g[0]) or columns (g[1])
    uint32_t tiles_across;
    bool vec_t;          // data_t's rows (x.rows codes) a multiple of 16 bytes, 16-byte aligned
    unsigned* amax;
};

constexpr int tile_side = 128;

template <Format F, class T>
__global__ void __launch_bounds__(threads) cast_transpose_kernel(TransposeJob job) {
    static_assert(sizeof(T) == 2, "16-bit inputs");
    __shared__ alignas(16) uint32_t tile[tile_side * tile_side / 2];  // row r: words [64 r, 64 r + 64)
    __shared__ uint32_t col_keys[threads / 64][tile_side];
    __shared__ uint32_t warp_keys[threads / 32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const uint32_t rows = uint32_t(job.x.rows), cols = uint32_t(job.x.cols);
    const uint32_t r0 = blockIdx.x / job.tiles_across * tile_side, c0 = blockIdx.x % job.tiles_across * tile_side;
    const uint32_t h = min(uint32_t(tile_side), rows - r0), w = min(uint32_t(tile_side), cols - c0);
    const T* x = static_cast<const T*>(job.x.data);

    // Load: chunk u of thread t is tile row t / 16 + 16 u, columns 8 (t % 16) ... + 7.
    const uint32_t col = uint32_t(threadIdx.x % 16) * 8u;
    Chunk<T> c[8];
    uint32_t acc = 0;
#pragma unroll
    for (int u = 0; u < 8; ++u) {
        const uint32_t r = uint32_t(threadIdx.x / 16 + 16 * u);
        c[u] = r < h && col < w ? load_chunk(x + int64_t(r0 + r) * job.x.ld + c0 + col) : zero_chunk<T>();
        acc = fold_mags<T>(acc, c[u]);
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
        const uint32_t r = uint32_t(threadIdx.x / 16 + 16 * u);
        *reinterpret_cast<uint4*>(&tile[r * 64 + col / 2]) = make_uint4(c[u].w[0], c[u].w[1], c[u].w[2], c[u].w[3]);
    }
    uint32_t tile_key = warp_max(mags_key<T>(acc));
    if (lane == 0) warp_keys[warp] = tile_key;
    __syncthreads();
    for (int k = 0; k < threads / 32; ++k) tile_key = max(tile_key, warp_keys[k]);
    const bool corner = r0 == 0 && c0 == 0 && threadIdx.x == 0;

    // x's codes.
    {
        const Grouping& G = job.g[0];
        const int mode = job.mode[0];
        float s = 0.0f;
        if (mode == kOne || mode == kTile) {
            const detail::GroupScale sc =
                detail::group_scale(mode == kTile ? __uint_as_float(tile_key) : G.amax != nullptr ? *G.amax : 0.0f, job.rule);
            s = sc.scale;
            if (mode == kTile ? threadIdx.x == 0 : corner) store_scale(G, job.rule, r0 / tile_side, c0 / tile_side, sc);
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const uint32_t r = uint32_t(threadIdx.x / 16 + 16 * u);
            const bool in = r < h && col < w;
            const uint32_t key = mags_key<T>(fold_mags<T>(0, c[u]));
            if (mode == kRun || mode == kLine) {
                float amax;
                if (mode == kRun) {
                    uint32_t gk = key;
                    for (int o = job.run[0] / 16; o > 0; o >>= 1) gk = max(gk, __shfl_xor_sync(0xffffffffu, gk, o));
                    amax = __uint_as_float(gk);
                } else {
                    amax = in ? G.amax[r0 + r] : 0.0f;
                }
                const detail::GroupScale sc = detail::group_scale(amax, job.rule);
                s = sc.scale;
                const uint32_t gj = mode == kRun ? (c0 + col) / uint32_t(job.run[0]) : 0;
                if (in && c0 + col == gj * uint32_t(mode == kRun ? job.run[0] : 0)) store_scale(G, job.rule, r0 + r, gj, sc);
            }
            if (in) {
                encode_chunk<F, T>(c[u], reinterpret_cast<const T*>(&tile[r * 64 + col / 2]), s, job.overflow, key,
                                   G.data + int64_t(r0 + r) * cols + c0 + col);
            }
        }
    }

    // The transposed copy's codes: columns 2p, 2p + 1 of the tile, rows 32q ... 32q + 31.
    {
        const Grouping& G = job.g[1];
        const int mode = job.mode[1];
        const int p = threadIdx.x % 64, q = threadIdx.x / 64;
        uint32_t v[32];
        uint32_t pair = 0;
#pragma unroll
        for (int k = 0; k < 32; ++k) {
            v[k] = tile[(32 * q + k) * 64 + p];
            pair = __vmaxu2(pair, v[k] & 0x7fff7fffu);
        }
        const uint32_t own[2] = {mags_key<T>(pair & 0xffffu), mags_key<T>(pair >> 16)};
        uint32_t gk[2] = {own[0], own[1]};
        const int span = mode == kRun ? job.run[1] / 32 : 1;  // threads of a column run
        if (mode == kRun && span > 1) {
            col_keys[q][2 * p] = own[0];
            col_keys[q][2 * p + 1] = own[1];
            __syncthreads();
            const int q0 = q / span * span;
            for (int k = q0; k < q0 + span; ++k) gk[0] = max(gk[0], col_keys[k][2 * p]), gk[1] = max(gk[1], col_keys[k][2 * p + 1]);
        }
        const uint32_t rr = r0 + 32u * uint32_t(q);  // the first row (of x) this thread encodes
        const int n = int(min(32u, h > 32u * uint32_t(q) ? h - 32u * uint32_t(q) : 0u));
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const uint32_t cc = c0 + 2u * uint32_t(p) + uint32_t(half);  // the column of x: a row of data_t
            float amax = 0.0f;
            switch (mode) {
                case kOne: amax = G.amax != nullptr ? *G.amax : 0.0f; break;
                case kTile: amax = __uint_as_float(tile_key); break;
                case kLine: amax = cc < cols ? G.amax[cc] : 0.0f; break;
                default: amax = __uint_as_float(gk[half]); break;
            }
            const detail::GroupScale sc = detail::group_scale(amax, job.rule);
            const bool leader = mode == kOne   ? corner && half == 0
                                : mode == kTile ? threadIdx.x == 0 && half == 0
                                : mode == kLine ? r0 == 0 && q == 0 && cc < cols
                                                : q % span == 0 && cc < cols && n > 0;
            if (leader) store_scale(G, job.rule, mode == kRun ? rr / uint32_t(job.run[1]) : mode == kTile ? r0 / tile_side : 0,
                                    mode == kTile ? c0 / tile_side : mode == kOne ? 0 : cc, sc);
            if (cc >= cols || n == 0) continue;
            uint8_t* dst = G.data + int64_t(cc) * rows + rr;
            if constexpr (F == Format::e4m3fn || F == Format::e5m2) {
                if (fast_path<F>(own[half], sc.scale, job.overflow)) {
                    uint32_t out[8];
#pragma unroll
                    for (int k = 0; k < 8; ++k) {
                        out[k] = encode4_fast<F>(pair_element<T>(v[4 * k], half), pair_element<T>(v[4 * k + 1], half),
                                                 pair_element<T>(v[4 * k + 2], half), pair_element<T>(v[4 * k + 3], half), sc.scale);
                    }
                    if (n == 32 && job.vec_t) {
                        reinterpret_cast<uint4*>(dst)[0] = make_uint4(out[0], out[1], out[2], out[3]);
                        reinterpret_cast<uint4*>(dst)[1] = make_uint4(out[4], out[5], out[6], out[7]);
                    } else {
#pragma unroll
                        for (int k = 0; k < 32; ++k) {
                            if (k < n) dst[k] = uint8_t(out[k / 4] >> (8 * (k % 4)));
                        }
                    }
                    continue;
                }
            }
            // Down column 2p + half of the tile from row 32q: elements tile_side apart.
            encode_slow<F, T>(reinterpret_cast<const T*>(tile) + (32 * q) * tile_side + 2 * p + half, tile_side, dst, n, sc.scale,
                              job.overflow);
        }
    }
    if (threadIdx.x == 0) atomicMax(job.amax, tile_key);
}

// Blocks of `kernel` (of `threads` threads, no dynamic shared memory) that fit the GPU at once.
template <class Kernel>
unsigned one_wave(Kernel kernel) {
    int per_sm = 0;
    FP8KIT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
    return unsigned(std::max(1, per_sm) * multiprocessors());
}

}  // namespace

void amax(const ExecContext& ctx, const MatrixRef& x, float* out) {
    launch_group_amax(stream_of(ctx), x, {x.rows, x.cols}, out);
}

void group_amax(const ExecContext& ctx, const MatrixRef& x, GroupShape group, float* out) {
    launch_group_amax(stream_of(ctx), x, group, out);
}

namespace {

// launch(format, type) with the job's format as a std::integral_constant<Format, F> and a value of
// its input's element type (float, __nv_bfloat16, __half): the kernels are templates on both.
template <class Launch>
void for_format_and_dtype(const detail::QuantizeJob& job, Launch&& launch) {
    const auto for_dtype = [&](auto type) {
        switch (job.rule.format) {
            case Format::e4m3fn: return launch(std::integral_constant<Format, Format::e4m3fn>{}, type);
            case Format::e5m2: return launch(std::integral_constant<Format, Format::e5m2>{}, type);
            case Format::e4m3fnuz: return launch(std::integral_constant<Format, Format::e4m3fnuz>{}, type);
            default: return launch(std::integral_constant<Format, Format::e5m2fnuz>{}, type);
        }
    };
    switch (job.x.dtype) {
        case DType::bf16: return for_dtype(__nv_bfloat16{});
        case DType::f16: return for_dtype(__half{});
        default: return for_dtype(float{});
    }
}

// ---- v2 launches ----

// Chunks a thread of the one-group-a-block kernel holds for groups of n chunks: 1, 2, 4 or 8.
int chunks_per_thread(int64_t n) {
    int ch = 1;
    while (ch < 8 && int64_t(ch) * threads < n) ch *= 2;
    return ch;
}

// The cast without the transposed copy; false: not one v2 takes.
bool launch_v2_rows(const detail::QuantizeJob& job) {
    const cudaStream_t s = stream_of(job.ctx);
    const MatrixRef& x = job.x;
    const GroupShape g = job.group;
    if (!v2_shape(x) || reinterpret_cast<uintptr_t>(job.data) % 8 != 0 || !(g.cols % 8 == 0 || g.cols >= x.cols)) return false;
    const bool fixed = job.rule.fixed_scale != nullptr;
    const bool one = g.rows >= x.rows && g.cols >= x.cols;
    // (not one group: the stream kernel takes one group's scale from the amax pass - a row of at most
    // 256 columns cast alone, a decode step's, went out with scale 1)
    const bool in_warp = !one && g.rows == 1 && g.cols <= 256 && (g.cols & (g.cols - 1)) == 0;
    const bool row = g.rows == 1 && g.cols >= x.cols;
    const int64_t gw8 = std::min(g.cols, x.cols) / 8, need = std::min(g.rows, x.rows) * gw8;
    // One group a block where a group fills at least half a block and fits in one; one group of
    // any size that fits (a decode step's row or tensor: one launch, where the amax pass would
    // add a memset, a scratch buffer and a second launch to a call that is all launch cost).
    const bool in_block = !in_warp && need <= 8 * threads && (one || need >= threads / 2);
    // The group's sides cut to x's (the same groups): the kernels take them as 32-bit numbers, and a
    // block scaling may be far taller or wider than x.
    const Grouping G{std::min(g.rows, std::max<int64_t>(x.rows, 1)), std::min(g.cols, std::max<int64_t>(x.cols, 1)),
                     (x.rows + g.rows - 1) / g.rows, (x.cols + g.cols - 1) / g.cols, false, false, nullptr, job.data,
                     job.scale_inv, 0};
    auto* total = reinterpret_cast<unsigned*>(job.amax);
    FP8KIT_CUDA_CHECK(cudaMemsetAsync(job.amax, 0, sizeof(float), s));
    if (!fixed && in_block) {
        const BlockJob b{x, job.rule, job.overflow, G, FastDiv(uint32_t(gw8)), total};
        const int64_t ngroups = G.grid_rows * G.grid_cols;
        const auto go = [&](auto kernel) {
            kernel<<<unsigned(std::min<int64_t>(ngroups, one_wave(kernel))), threads, 0, s>>>(b);
            check_launch("cast_groups_kernel");
        };
        for_format_and_dtype(job, [&](auto format, auto type) {
            constexpr Format F = decltype(format)::value;
            using T = decltype(type);
            switch (chunks_per_thread(need)) {
                case 1: return go(cast_groups_kernel<F, T, 1>);
                case 2: return go(cast_groups_kernel<F, T, 2>);
                case 4: return go(cast_groups_kernel<F, T, 4>);
                default: return go(cast_groups_kernel<F, T, 8>);
            }
        });
        return true;
    }
    StreamJob r{x, job.rule, job.overflow, G, 0, 0, one, false, FastDiv(uint32_t((x.cols + 255) / 256)),
                uint32_t(x.rows * ((x.cols + 255) / 256)), total};
    std::shared_ptr<std::byte> amaxes;
    if (!fixed && in_warp) {
        r.lanes = int(g.cols / 8);
        while ((int64_t(1) << r.gshift) < g.cols) ++r.gshift;
    } else if (!fixed) {
        amaxes = allocate(size_t(G.grid_rows * G.grid_cols) * sizeof(float));
        float* a = reinterpret_cast<float*>(amaxes.get());
        if (one || row) {
            launch_lines_amax(s, x, row && !one ? a : nullptr, nullptr, one ? a : nullptr);
            r.reverse = true;
        } else {
            launch_group_amax(s, x, g, a);  // other groupings (small blocks of several rows ...)
        }
        r.g.amax = a;
    }
    const auto go = [&](auto kernel) {
        kernel<<<unsigned(std::min<int64_t>((r.trips + 4 * threads / 32 - 1) / (4 * threads / 32), one_wave(kernel))), threads, 0, s>>>(r);
        check_launch("cast_stream_kernel");
    };
    for_format_and_dtype(job, [&](auto format, auto type) { go(cast_stream_kernel<decltype(format)::value, decltype(type), 4>); });
    return true;
}

// The cast with the transposed copy; false: not one v2 takes.
bool launch_v2_transpose(const detail::QuantizeJob& job) {
    const cudaStream_t s = stream_of(job.ctx);
    const MatrixRef& x = job.x;
    if (!v2_shape(x) || (x.dtype != DType::bf16 && x.dtype != DType::f16) || reinterpret_cast<uintptr_t>(job.data) % 8 != 0) {
        return false;
    }
    TransposeJob t{x, job.rule, job.overflow, {}, {}, {}, 0, false, reinterpret_cast<unsigned*>(job.amax)};
    // The groupings on x: the groups, and the transposed copy's groups seen on x (rows and columns swapped).
    const GroupShape gs[2] = {job.group, {job.group_t.cols, job.group_t.rows}};
    for (int k = 0; k < 2; ++k) {
        const GroupShape g = gs[k];
        t.g[k] = {g.rows, g.cols, (x.rows + g.rows - 1) / g.rows, (x.cols + g.cols - 1) / g.cols, k == 1, false, nullptr,
                  k == 0 ? job.data : job.data_t, k == 0 ? job.scale_inv : job.scale_inv_t, 0};
        const int64_t along = k == 0 ? g.cols : g.rows, across = k == 0 ? g.rows : g.cols;  // along the codes' rows
        const int64_t x_along = k == 0 ? x.cols : x.rows;
        const bool pow2 = (along & (along - 1)) == 0;
        if (g.rows == tile_side && g.cols == tile_side) {
            t.mode[k] = kTile;
        } else if (across == 1 && pow2 && along >= (k == 0 ? 8 : 32) && along <= tile_side) {
            t.mode[k] = kRun;
            t.run[k] = int(along);
        } else if (g.rows >= x.rows && g.cols >= x.cols) {
            t.mode[k] = kOne;
        } else if (across == 1 && along >= x_along) {
            t.mode[k] = kLine;
        } else {
            return false;
        }
    }
    const bool fixed = job.rule.fixed_scale != nullptr;
    if (fixed && (t.mode[0] != kOne || t.mode[1] != kOne)) return false;
    FP8KIT_CUDA_CHECK(cudaMemsetAsync(job.amax, 0, sizeof(float), s));
    // One amax pass for what the tile cannot reduce: the whole input's, each row's, each column's.
    std::shared_ptr<std::byte> pass;
    if (!fixed && (t.mode[0] == kOne || t.mode[0] == kLine || t.mode[1] == kOne || t.mode[1] == kLine)) {
        const size_t nrows = t.mode[0] == kLine ? size_t(x.rows) : 0, ncols = t.mode[1] == kLine ? size_t(x.cols) : 0;
        pass = allocate((1 + nrows + ncols) * sizeof(float));
        float* total = reinterpret_cast<float*>(pass.get());
        float* rows = nrows > 0 ? total + 1 : nullptr;
        float* cols = ncols > 0 ? total + 1 + nrows : nullptr;
        const bool one = t.mode[0] == kOne || t.mode[1] == kOne;
        launch_lines_amax(s, x, rows, cols, one ? total : nullptr);
        for (int k = 0; k < 2; ++k) t.g[k].amax = t.mode[k] == kOne ? total : t.mode[k] == kLine ? (k == 0 ? rows : cols) : nullptr;
    }
    t.tiles_across = uint32_t((x.cols + tile_side - 1) / tile_side);
    t.vec_t = x.rows % 16 == 0 && reinterpret_cast<uintptr_t>(job.data_t) % 16 == 0;
    const int64_t tiles = (x.rows + tile_side - 1) / tile_side * int64_t(t.tiles_across);
    const auto go = [&](auto kernel) {
        kernel<<<unsigned(tiles), threads, 0, s>>>(t);
        check_launch("cast_transpose_kernel");
    };
    const auto for_format = [&](auto type) {
        using T = decltype(type);
        switch (job.rule.format) {
            case Format::e4m3fn: return go(cast_transpose_kernel<Format::e4m3fn, T>);
            case Format::e5m2: return go(cast_transpose_kernel<Format::e5m2, T>);
            case Format::e4m3fnuz: return go(cast_transpose_kernel<Format::e4m3fnuz, T>);
            default: return go(cast_transpose_kernel<Format::e5m2fnuz, T>);
        }
    };
    if (x.dtype == DType::bf16) {
        for_format(__nv_bfloat16{});
    } else {
        for_format(__half{});
    }
    return true;
}

}  // namespace

void quantize(detail::QuantizeJob& job) {
    if (job.data_t == nullptr ? launch_v2_rows(job) : launch_v2_transpose(job)) return;
    const cudaStream_t s = stream_of(job.ctx);
    const int64_t rows = job.x.rows, cols = job.x.cols;
    TileJob t{job.x, job.rule, job.overflow, 0, 0, 0, {}, job.data_t != nullptr ? 2 : 1,
              reinterpret_cast<unsigned*>(job.amax)};
    // The groupings on x: the groups, and the transposed copy's groups seen on x (rows and columns swapped).
    t.g[0] = {job.group.rows, job.group.cols, (rows + job.group.rows - 1) / job.group.rows,
              (cols + job.group.cols - 1) / job.group.cols, false, false, nullptr, job.data, job.scale_inv, 0};
    if (t.count == 2) {
        t.g[1] = {job.group_t.cols, job.group_t.rows, (rows + job.group_t.cols - 1) / job.group_t.cols,
                  (cols + job.group_t.rows - 1) / job.group_t.rows, true, false, nullptr, job.data_t, job.scale_inv_t, 0};
    }
    // Tile sides: multiples of every in-tile group's sides, at least 32 x 128 (coalesced rows);
    // a grouping whose groups would make the tile too large gets its amax from a pass of its own.
    const bool fixed = job.rule.fixed_scale != nullptr;
    for (int k = 0; k < t.count; ++k) t.g[k].in_tile = !fixed && t.g[k].rows <= max_tile_side && t.g[k].cols <= max_tile_side;
    size_t smem = 0;
    for (;;) {
        int64_t lr = 1, lc = 1;
        for (int k = 0; k < t.count; ++k) {
            if (!t.g[k].in_tile) continue;
            lr = std::lcm(lr, t.g[k].rows);
            lc = std::lcm(lc, t.g[k].cols);
        }
        t.tile_rows = lr * ((32 + lr - 1) / lr);
        t.tile_cols = lc * ((128 + lc - 1) / lc);
        for (int k = 0; k < t.count; ++k) {
            Grouping& G = t.g[k];
            G.local_max = (t.tile_rows + G.rows - 1) / G.rows * ((t.tile_cols + G.cols - 1) / G.cols);
            if (!G.in_tile) G.local_max = ((t.tile_rows + G.rows - 1) / G.rows + 1) * ((t.tile_cols + G.cols - 1) / G.cols + 1);
        }
        smem = size_t(t.tile_rows * (t.tile_cols + 1) + t.g[0].local_max + (t.count == 2 ? t.g[1].local_max : 0) +
                      2 * (t.tile_rows + t.tile_cols)) * sizeof(float);
        if (smem <= max_tile_smem) break;
        const int k = t.count == 2 && t.g[1].in_tile ? 1 : 0;  // the transposed groups go first
        if (!t.g[k].in_tile) throw Error("fp8kit::quantize (cuda): no tile fits these groups");  // cannot happen: 32 x 128
        t.g[k].in_tile = false;
    }
    t.tiles_across = (cols + t.tile_cols - 1) / t.tile_cols;
    // Group amax passes for the groupings that are not reduced in the tile.
    std::shared_ptr<std::byte> amaxes[2];
    for (int k = 0; k < t.count; ++k) {
        Grouping& G = t.g[k];
        if (G.in_tile || fixed) continue;
        amaxes[k] = allocate(size_t(G.grid_rows * G.grid_cols) * sizeof(float));
        float* a = reinterpret_cast<float*>(amaxes[k].get());
        launch_group_amax(s, job.x, {G.rows, G.cols}, a);
        G.amax = a;
    }
    FP8KIT_CUDA_CHECK(cudaMemsetAsync(job.amax, 0, sizeof(float), s));
    const int64_t tiles = (rows + t.tile_rows - 1) / t.tile_rows * t.tiles_across;
    for_format_and_dtype(job, [&](auto format, auto type) {
        const auto kernel = quantize_tile_kernel<decltype(format)::value, decltype(type)>;
        FP8KIT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        kernel<<<unsigned(tiles), threads, smem, s>>>(t);
        check_launch("quantize_tile_kernel");
    });
}

void dequantize(const detail::DequantizeJob& job) {
    const int64_t gcols = (job.cols + job.group.cols - 1) / job.group.cols;
    dequantize_kernel<<<blocks_for(job.rows * job.cols, threads), threads, 0, stream_of(job.ctx)>>>(job, gcols);
    check_launch("dequantize_kernel");
}

}  // namespace fp8kit::cuda
