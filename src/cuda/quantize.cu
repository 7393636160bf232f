// src/cuda/quantize.cu: the cast operations on the GPU - amax, per-group amax, quantize (with the
// transposed copy: cast_transpose) and dequantize - bit for bit those of src/ref/quantize.cpp:
// the same group amax (NaN canonical), the same scale formula (group_scale of core/ops.hpp, built
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
// A quantize without the transposed copy, on rows of a multiple of 8 elements 16-byte aligned,
// takes the row-major kernels instead (16-byte loads, 8 elements a thread, no shared memory):
// groups of several rows and 1024 to 16384 elements (block 128x128) one group a block, held in
// registers (quantize_groups_kernel: one read); 1 x gc groups that fit a warp (block
// 1x128, mx32) reduced across its lanes (quantize_rows_kernel: one read); larger groups (tensor
// scaling) after the amax pass, which on such rows reads 16 bytes a lane too (band_amax_kernel):
// two reads. docs/PERF.md has their rates beside a device-to-device copy.
#include <algorithm>
#include <numeric>
#include <type_traits>
#include <vector>

#include <cuda_fp8.h>

#include "cuda/common.cuh"
#include "cuda/device.hpp"
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

// Groups of whole rows (tensor scaling: one band of all rows; row scaling: bands of one row), on
// rows of a multiple of 8 elements, 16-byte aligned. Why not group_amax_kernel: element by element,
// its loads cap the first read of tensor and row scaling far under the memory's rate. Here a warp
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

// Enqueues the group amax of x into out (float bits), zeroing out first.
void launch_group_amax(cudaStream_t s, const MatrixRef& x, GroupShape g, float* out) {
    const int64_t grows = (x.rows + g.rows - 1) / g.rows, gcols = (x.cols + g.cols - 1) / g.cols;
    const int64_t ngroups = grows * gcols, size = min(g.rows, x.rows) * min(g.cols, x.cols);
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

// ---- quantize, the row-major path: 8 elements a thread, 16-byte loads ----
//
// Why: the tile kernel stages every element in shared memory and finds its group through tables;
// on an H100 it cast at 0.08-0.13x the device-to-device copy (docs/PERF.md), bound by
// instructions, not memory. Most casts need none of that: no transposed copy, rows of a multiple
// of 8 elements, and groups that never split 8 neighbours of a row (block 1x128 and 128x128,
// mx32, row and tensor scaling). Here each thread loads 8 elements at once and stores their 8
// codes as one 8-byte word; a warp covers 32 such chunks of a row. Groups of 1 x gc with gc a
// power of two from 8 to 256 that divides the row (block 1x128, mx32) reduce their amax over the
// gc / 8 lanes holding them - x read once; other groupings take their amaxes from the group_amax
// pass before (or the fixed scale). The encode is encode_scaled, the tile kernel's, element for
// element: the codes and scales are those of ref either way (tests/ops/test_quantize.cpp runs
// both paths: its shapes with rows of a multiple of 8 take this one).
struct RowsJob {
    MatrixRef x;
    detail::ScaleRule rule;
    Overflow overflow;
    Grouping g;
    int lanes;            // lanes a group spans when reduced in the warp (gc / 8); 0: amax given
    unsigned* amax;       // the whole input's (key), combined with atomicMax
};

// The codes of v[0..8) * s, stored as one 8-byte word at dst (8-byte aligned).
template <Format F>
__device__ inline void encode8(const float (&v)[8], float s, Overflow o, uint8_t* dst) {
    uint32_t word[2] = {0, 0};
    for (int e = 0; e < 8; ++e) word[e / 4] |= uint32_t(encode_scaled<F>(v[e], s, o)) << (8 * (e % 4));
    *reinterpret_cast<uint2*>(dst) = make_uint2(word[0], word[1]);
}

template <Format F, class T>
__global__ void quantize_rows_kernel(RowsJob job) {
    const Grouping& G = job.g;
    const int lane = threadIdx.x % 32;
    // A trip: 32 chunks (256 elements) of one row. Within a row, 32-bit arithmetic (rows_path
    // bounds rows and cols): a 64-bit division costs a GPU dozens of instructions, and this kernel
    // is to be bound by memory. (Four trips a warp with their loads first ran slower on an H200:
    // 0.36x the copy against 0.42x, its registers leaving fewer warps a multiprocessor.)
    const uint32_t cols = uint32_t(job.x.cols), grows = uint32_t(G.rows), gcols = uint32_t(G.cols);
    const int64_t per_row = (job.x.cols + 255) / 256;
    const int64_t trips = job.x.rows * per_row, warps = int64_t(gridDim.x) * (threads / 32);
    uint32_t total = 0;
    // The whole warp takes each trip (its lanes' shuffles need all 32), lanes past the row idle.
    for (int64_t t = int64_t(blockIdx.x) * (threads / 32) + threadIdx.x / 32; t < trips; t += warps) {
        const uint32_t i = uint32_t(t / per_row);
        const uint32_t j = uint32_t(t - int64_t(i) * per_row) * 256u + uint32_t(lane) * 8u;
        const bool in = j < cols;
        float v[8] = {};
        if (in) load8(job.x, int64_t(i) * job.x.ld + j, v, T{});
        uint32_t key = 0;
        for (int e = 0; e < 8; ++e) key = max(key, abs_key(v[e]));
        total = max(total, key);
        const uint32_t gi = i / grows, gj = j / gcols;
        float amax;
        if (job.lanes > 0) {  // a group's lanes: an aligned run of job.lanes (a power of two) in a row
            for (int o = job.lanes / 2; o > 0; o >>= 1) key = max(key, __shfl_xor_sync(0xffffffffu, key, o));
            amax = __uint_as_float(key);
        } else {
            amax = G.amax != nullptr && in ? G.amax[int64_t(gi) * G.grid_cols + gj] : 0.0f;
        }
        if (!in) continue;
        const detail::GroupScale sc = detail::group_scale(amax, job.rule);
        if (i - gi * grows == 0 && j - gj * gcols == 0) store_scale(G, job.rule, gi, gj, sc);  // the group's first chunk
        encode8<F>(v, sc.scale, job.overflow, G.data + int64_t(i) * cols + j);
    }
    total = block_max(total);  // one atomic per block (see the tile kernel)
    if (threadIdx.x == 0) atomicMax(job.amax, total);
}

// ---- quantize, one group a block: groups of several rows, up to 16384 elements ----
//
// Why: groups of several rows (block 128x128) do not fit a warp, and through the rows kernel they
// would need the group_amax pass first - two reads of x. Here a block holds a whole group in
// registers (up to 8 chunks of 8 elements a thread, all loaded before any is used), reduces its
// amax across the block, then encodes from the registers: x read once. Blocks loop over the
// groups; one atomic per block. Group sizes (elements) it takes: up to 8 chunks of 8 a thread;
// from 4 elements a thread on (smaller groups would leave most of a block idle: they take the amax
// pass and the rows kernel). Groups of one row (row scaling) ran slower here than the amax pass
// and the rows kernel (0.23x the copy against 0.32x, an H200): a block's loads stop while it
// reduces and encodes, and its registers leave 2 blocks a multiprocessor; they stay there.
constexpr int64_t block_group_min = threads * 4, block_group_max = threads * 8 * 8;

template <Format F, class T>
__global__ void quantize_groups_kernel(RowsJob job) {
    const Grouping& G = job.g;
    const uint32_t rows = uint32_t(job.x.rows), cols = uint32_t(job.x.cols);
    const int64_t ngroups = G.grid_rows * G.grid_cols;
    uint32_t total = 0;
    for (int64_t q = blockIdx.x; q < ngroups; q += gridDim.x) {
        const uint32_t gi = uint32_t(q / G.grid_cols), gj = uint32_t(q - int64_t(gi) * G.grid_cols);
        const uint32_t i0 = gi * uint32_t(G.rows), j0 = gj * uint32_t(G.cols);
        const uint32_t w8 = min(uint32_t(G.cols), cols - j0) / 8, n = min(uint32_t(G.rows), rows - i0) * w8;
        float v[8][8];
        uint32_t key = 0;
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const uint32_t c = threadIdx.x + u * threads;
            if (c < n) {
                load8(job.x, int64_t(i0 + c / w8) * job.x.ld + j0 + c % w8 * 8, v[u], T{});
            } else {
                for (int e = 0; e < 8; ++e) v[u][e] = 0.0f;
            }
            for (int e = 0; e < 8; ++e) key = max(key, abs_key(v[u][e]));
        }
        key = block_max(key);
        total = max(total, key);
        const detail::GroupScale sc = detail::group_scale(__uint_as_float(key), job.rule);
        if (threadIdx.x == 0) store_scale(G, job.rule, gi, gj, sc);
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const uint32_t c = threadIdx.x + u * threads;
            if (c < n) encode8<F>(v[u], sc.scale, job.overflow, G.data + int64_t(i0 + c / w8) * cols + j0 + c % w8 * 8);
        }
    }
    if (threadIdx.x == 0) atomicMax(job.amax, total);  // total is the block's (block_max)
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

// Whether the row-major path takes this quantize (see quantize_rows_kernel).
bool rows_path(const detail::QuantizeJob& job) {
    const GroupShape g = job.group;
    constexpr int64_t limit = int64_t(1) << 30;  // rows, columns and groups in 32-bit arithmetic
    return job.data_t == nullptr && vector_rows(job.x) && reinterpret_cast<uintptr_t>(job.data) % 8 == 0 &&
           (g.cols % 8 == 0 || g.cols >= job.x.cols) && job.x.rows < limit && job.x.cols < limit && g.rows < limit &&
           g.cols < limit;
}

void launch_rows(const detail::QuantizeJob& job) {
    const cudaStream_t s = stream_of(job.ctx);
    const int64_t rows = job.x.rows, cols = job.x.cols;
    const GroupShape g = job.group;
    const bool fixed = job.rule.fixed_scale != nullptr;
    RowsJob r{job.x, job.rule, job.overflow,
              {g.rows, g.cols, (rows + g.rows - 1) / g.rows, (cols + g.cols - 1) / g.cols, false, false, nullptr,
               job.data, job.scale_inv, 0},
              0, reinterpret_cast<unsigned*>(job.amax)};
    // A group of 1 x gc (gc = 8 ... 256, a power of two dividing the row) is whole within a warp;
    // groups of several rows and 1024 to 16384 elements within a block (quantize_groups_kernel).
    const bool in_warp = g.rows == 1 && g.cols <= 256 && (g.cols & (g.cols - 1)) == 0 && cols % g.cols == 0;
    const int64_t group_size = std::min(g.rows, rows) * std::min(g.cols, cols);
    const bool in_block = std::min(g.rows, rows) > 1 && group_size >= block_group_min && group_size <= block_group_max;
    FP8KIT_CUDA_CHECK(cudaMemsetAsync(job.amax, 0, sizeof(float), s));
    if (!fixed && !in_warp && in_block) {
        // At most 1024 blocks (about one wave), each looping over groups: as many same-address atomics.
        const unsigned blocks = blocks_for(r.g.grid_rows * r.g.grid_cols, 1, 1024);
        return for_format_and_dtype(job, [&](auto format, auto type) {
            quantize_groups_kernel<decltype(format)::value, decltype(type)><<<blocks, threads, 0, s>>>(r);
            check_launch("quantize_groups_kernel");
        });
    }
    std::shared_ptr<std::byte> amaxes;
    if (!fixed && in_warp) {
        r.lanes = int(g.cols / 8);
    } else if (!fixed) {
        amaxes = allocate(size_t(r.g.grid_rows * r.g.grid_cols) * sizeof(float));
        float* a = reinterpret_cast<float*>(amaxes.get());
        launch_group_amax(s, job.x, g, a);
        r.g.amax = a;
    }
    // At most 4096 blocks (a few waves on any GPU; as many same-address atomics), each warp looping.
    const unsigned blocks = blocks_for(rows * ((cols + 255) / 256), threads / 32, 4096);
    for_format_and_dtype(job, [&](auto format, auto type) {
        quantize_rows_kernel<decltype(format)::value, decltype(type)><<<blocks, threads, 0, s>>>(r);
        check_launch("quantize_rows_kernel");
    });
}

}  // namespace

void quantize(detail::QuantizeJob& job) {
    if (rows_path(job)) return launch_rows(job);
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
