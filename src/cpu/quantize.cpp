// src/cpu/quantize.cpp: the fast CPU cast operations - amax, quantize, dequantize, cast_transpose -
// driving the SIMD kernels of convert_simd.hpp (or the portable ones) over OpenMP threads.
//
// Checked against: src/ref/quantize.cpp, bit for bit (codes, scales, amax), on every ISA path,
// every granularity, format, input dtype and overflow mode (tests/ops/test_quantize.cpp).
//
// Reads of the input per path (what decides speed once the input is larger than the caches):
//  - tensor scaling, current: 2 - an amax pass, then the cast; the scale needs the whole tensor.
//  - tensor scaling with a given scale (delayed): 1 - amax is measured in the cast pass.
//  - row, block{r, c}, mx32: 1 - each strip of r rows is cut into tiles of whole groups (about
//    32 KiB for 1-row groups, 512 KiB for taller ones); a tile's amax is found, then the tile is
//    cast while it is still in L1/L2. (A row longer than the L2 is read twice from memory.)
//  - column, and blocks taller than the matrix: 2 - like tensor, a group spans every row.
//  - cast_transpose: 1 for the cast itself, which writes both copies from one read of each 64x256
//    tile (read again from L1 where the transposed copy has multipliers of its own), after the
//    amax pass the scales need: 1, also where each direction has its own groups (row, column, 1xN
//    blocks otherwise), whose maxima that pass finds together. None with a given scale, nor where every
//    group of both copies lies in one tile (mx32; 1xN blocks, N a power of two <= 128): each tile
//    finds its own amaxes and scales from the cache before it casts. Where the
//    transposed copy's groups are those of the row-major copy (tensor; square blocks), its codes
//    are the row-major codes transposed, not encoded again.
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <numeric>
#include <vector>

#include "core/host_memory.hpp"
#include "core/math.hpp"
#include "core/ops.hpp"
#include "cpu/convert_kernels.hpp"
#include "cpu/parallel.hpp"

namespace fp8kit::cpu {

namespace {

using detail::GroupScale;
using detail::MatrixRef;
using detail::ScaleRule;

float amax_value(uint32_t bits) {
    return detail::f32_from_bits(bits > 0x7f800000u ? detail::canonical_nan_bits : bits);
}

template <class T>
const T* row(const MatrixRef& x, int64_t i) {
    return static_cast<const T*>(x.data) + i * x.ld;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
size_t elements(const MatrixRef& x) { return size_t(x.rows * x.cols); }
bool flat(const MatrixRef& x) { return x.ld == x.cols || x.rows == 1; }

// One max |x| bits accumulator per thread slot, zeroed, from the thread's scratch list: the cast
// of a decode step's activation row runs on every GEMM call, and allocates nothing here.
class SlotMax {
public:
    SlotMax() : n_(num_threads()), acc_(n_) { std::fill(acc_.get(), acc_.get() + n_, 0u); }
    uint32_t& operator[](size_t slot) { return acc_.get()[slot]; }
    uint32_t max() const { return *std::max_element(acc_.get(), acc_.get() + n_); }

private:
    int n_;
    detail::Scratch<uint32_t> acc_;
};

// Max |x| bits over the whole matrix.
template <class T>
uint32_t total_amax_bits(const MatrixRef& x) {
    const auto kernel = active_kernels().amax<T>();
    SlotMax acc;
    if (flat(x)) {
        const T* p = row<T>(x, 0);
        const size_t n = elements(x), per = std::max<size_t>(n / size_t(num_threads()) + 1, parallel_threshold);
        parallel_tasks(int64_t(ceil_div(int64_t(n), int64_t(per))), n, [&](int64_t t, int slot) {
            const size_t begin = size_t(t) * per, count = std::min(per, n - begin);
            kernel(p + begin, count, count, 0, &acc[size_t(slot)]);
        });
    } else {
        parallel_tasks(x.rows, elements(x), [&](int64_t i, int slot) {
            kernel(row<T>(x, i), size_t(x.cols), size_t(x.cols), 0, &acc[size_t(slot)]);
        });
    }
    return acc.max();
}

// Max |x| bits of every group of each shape in `shapes` (one or two) into its `acc` [ceil(rows /
// g.rows), ceil(cols / g.cols)] (zeroed here), from one read of x: a cast_transpose's two copies
// have groups of their own (row scaling: x's rows and x's columns), and a second pass over an
// x larger than the caches cost as much as the cast (2048 x 2048 float32 rowwise: three reads).
// Each thread takes a range of rows, whole group rows of every shape whose groups are shorter
// than x (their entries are the thread's own) and reads each row once from memory, again from L1
// for the second shape; a shape whose groups span every row (column scaling, tall blocks) gathers
// into the thread's own array, merged after.
template <class T>
void group_amax_bits(const MatrixRef& x, std::initializer_list<GroupShape> shapes,
                     std::initializer_list<std::vector<uint32_t>*> accs) {
    const auto kernel = active_kernels().amax<T>();
    const GroupShape* g = shapes.begin();
    std::vector<uint32_t>* const* acc = accs.begin();
    const size_t n = shapes.size();
    int64_t gc[2], align = 1;
    bool spans[2];
    for (size_t s = 0; s < n; ++s) {
        gc[s] = ceil_div(x.cols, g[s].cols);
        spans[s] = g[s].rows >= x.rows;
        acc[s]->assign(size_t(ceil_div(x.rows, g[s].rows) * gc[s]), 0);
        if (!spans[s]) align = std::lcm(align, g[s].rows);
    }
    if (n == 1 && spans[0] && g[0].cols >= x.cols) {  // one group: the whole matrix
        (*acc[0])[0] = total_amax_bits<T>(x);
        return;
    }
    const int threads = threads_for(elements(x));
    const int64_t per = ceil_div(ceil_div(x.rows, threads), align) * align, tasks = ceil_div(x.rows, per);
    std::vector<uint32_t> part[2];  // [tasks, gc]: a spanning shape's maxima of each task's rows
    for (size_t s = 0; s < n; ++s) {
        if (spans[s]) part[s].assign(size_t(tasks * gc[s]), 0);
    }
    parallel_tasks(tasks, elements(x), [&](int64_t t, int) {
        for (int64_t i = t * per; i < std::min(x.rows, (t + 1) * per); ++i) {
            for (size_t s = 0; s < n; ++s) {
                uint32_t* into = spans[s] ? &part[s][size_t(t * gc[s])] : acc[s]->data() + i / g[s].rows * gc[s];
                kernel(row<T>(x, i), size_t(x.cols), size_t(g[s].cols), 0, into);
            }
        }
    });
    for (size_t s = 0; s < n; ++s) {
        for (int64_t t = 0; spans[s] && t < tasks; ++t) {
            for (int64_t k = 0; k < gc[s]; ++k) (*acc[s])[size_t(k)] = std::max((*acc[s])[size_t(k)], part[s][size_t(t * gc[s] + k)]);
        }
    }
}

// The scales of groups [rows, cols] from their amax bits acc [rows, cols]: stored scale_inv
// (float, or e8m0 codes by the SIMD kernel), entry (r, c) at r * ld_r + c * ld_c - the copy's own
// layout, or a transposed copy's (ld_r 1) - and the float multipliers the encode kernels use, mult
// [rows, cols] in acc's order, the order in which the cast walks x. Returns the max over all groups.
uint32_t make_scales(const uint32_t* acc, int64_t rows, int64_t cols, const ScaleRule& rule, void* scale_inv,
                     int64_t ld_r, int64_t ld_c, float* mult) {
    const int64_t n = rows * cols;
    uint32_t total = 0;
    for (int64_t k = 0; k < n; ++k) total = std::max(total, acc[k]);
    if (rule.mx) {
        auto* out = static_cast<uint8_t*>(scale_inv);
        if (ld_c == 1 && (rows == 1 || ld_r == cols)) {  // acc's own order: the codes straight into place
            active_kernels().mx_scales(acc, size_t(n), rule.format, rule.mx_rounding, out, mult);
            return total;
        }
        detail::Scratch<uint8_t> codes(n);
        active_kernels().mx_scales(acc, size_t(n), rule.format, rule.mx_rounding, codes.get(), mult);
        for (int64_t r = 0; r < rows; ++r) {
            if (ld_c == 1) {
                std::memcpy(out + r * ld_r, codes.get() + r * cols, size_t(cols));
            } else {
                for (int64_t c = 0; c < cols; ++c) out[r * ld_r + c * ld_c] = codes.get()[r * cols + c];
            }
        }
        return total;
    }
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
            const GroupScale s = group_scale(amax_value(acc[r * cols + c]), rule);
            mult[r * cols + c] = s.scale;
            static_cast<float*>(scale_inv)[r * ld_r + c * ld_c] = s.scale_inv;
        }
    }
    return total;
}
uint32_t make_scales(const std::vector<uint32_t>& acc, const ScaleRule& rule, void* scale_inv, std::vector<float>& mult) {
    mult.resize(acc.size());
    return make_scales(acc.data(), 1, int64_t(acc.size()), rule, scale_inv, 0, 1, mult.data());
}

// Entry k of a scale array (e8m0 codes or floats).
void* scale_entry(void* scale_inv, const ScaleRule& rule, int64_t k) {
    return rule.mx ? static_cast<void*>(static_cast<uint8_t*>(scale_inv) + k) : static_cast<void*>(static_cast<float*>(scale_inv) + k);
}

// Encodes every row with the multipliers of its groups (mult [ceil(rows/g.rows), ceil(cols/g.cols)]),
// into out [rows, cols]; with `amax`, measures max |x| bits in the same pass.
template <class T>
void encode_rows(const MatrixRef& x, GroupShape g, const float* mult, const detail::QuantizeJob& job,
                 uint8_t* out, uint32_t* amax) {
    const auto kernel = active_kernels().encode<T>(job.rule.format, job.overflow);
    SlotMax acc;
    uint32_t* const none = nullptr;
    if (flat(x) && g.cols >= x.cols && g.rows >= x.rows) {  // one scale: split the flat run
        const T* p = row<T>(x, 0);
        const size_t n = elements(x), per = std::max<size_t>(n / size_t(num_threads()) + 1, parallel_threshold);
        parallel_tasks(int64_t(ceil_div(int64_t(n), int64_t(per))), n, [&](int64_t t, int slot) {
            const size_t begin = size_t(t) * per, count = std::min(per, n - begin);
            kernel(p + begin, out + begin, count, count, 0, mult, amax ? &acc[size_t(slot)] : none);
        });
    } else {
        const int64_t gc = ceil_div(x.cols, g.cols);
        parallel_tasks(x.rows, elements(x), [&](int64_t i, int slot) {
            kernel(row<T>(x, i), out + i * x.cols, size_t(x.cols), size_t(g.cols), 0, mult + i / g.rows * gc,
                   amax ? &acc[size_t(slot)] : none);
        });
    }
    if (amax != nullptr) *amax = acc.max();
}

// Row, block and mx32 scaling in one read: tiles of g.rows rows by a whole number of groups;
// each tile's group amaxes, then its scales, then its cast while the tile is still cached.
template <class T>
uint32_t quantize_tiles(const detail::QuantizeJob& job) {
    const MatrixRef& x = job.x;
    const GroupShape g = job.group;
    const auto& k = active_kernels();
    const auto amax_kernel = k.amax<T>();
    const auto encode_kernel = k.encode<T>(job.rule.format, job.overflow);
    const int64_t gc = ceil_div(x.cols, g.cols);
    // Row-local groups: ~32 KiB tiles, re-read from L1. Taller blocks: ~512 KiB tiles (re-read
    // from L2), so that each of their rows is read in long runs rather than a 512-byte piece.
    const int64_t tile_bytes = g.rows == 1 ? 32 << 10 : 512 << 10;
    const int64_t groups_per_tile = std::max<int64_t>(1, tile_bytes / (g.rows * g.cols * int64_t(sizeof(T))));
    const int64_t col_tiles = ceil_div(gc, groups_per_tile), row_tiles = ceil_div(x.rows, g.rows);
    // Per thread slot: a tile's group amaxes and multipliers (groups_per_tile each).
    SlotMax total;
    detail::Scratch<uint32_t> acc(int64_t(num_threads()) * groups_per_tile);
    detail::Scratch<float> mult(int64_t(num_threads()) * groups_per_tile);
    parallel_tasks(row_tiles * col_tiles, elements(x), [&](int64_t t, int slot) {
        const int64_t b = t / col_tiles, c0 = t % col_tiles * groups_per_tile;  // group row, first group column
        const int64_t nc = std::min(groups_per_tile, gc - c0);
        const int64_t j0 = c0 * g.cols, width = std::min(x.cols, (c0 + nc) * g.cols) - j0;
        const int64_t i0 = b * g.rows, i1 = std::min(x.rows, i0 + g.rows);
        uint32_t* a = acc.get() + slot * groups_per_tile;
        float* m = mult.get() + slot * groups_per_tile;
        std::fill(a, a + nc, 0u);
        for (int64_t i = i0; i < i1; ++i) amax_kernel(row<T>(x, i) + j0, size_t(width), size_t(g.cols), 0, a);
        void* scale_inv = scale_entry(job.scale_inv, job.rule, b * gc + c0);
        total[size_t(slot)] = std::max(total[size_t(slot)], make_scales(a, 1, nc, job.rule, scale_inv, 0, 1, m));
        for (int64_t i = i0; i < i1; ++i) {
            encode_kernel(row<T>(x, i) + j0, job.data + i * x.cols + j0, size_t(width), size_t(g.cols), 0, m, nullptr);
        }
    });
    return total.max();
}

// The multipliers of one copy's groups as they lie on x (shape g): the group of x's element (i, j)
// at at[(i / g.rows - row0) * ld + j / g.cols - col0] - the whole array, or a tile's own part.
struct MultView {
    const float* at;
    int64_t ld, row0, col0;
    // Row i's multipliers from column j0's group on.
    const float* row(int64_t i, int64_t j0, GroupShape g) const { return at + (i / g.rows - row0) * ld + j0 / g.cols - col0; }
};

// Rows of a cast_transpose tile: cast_tile_rows, more where a group is taller (1x128 blocks:
// x^T's 1x128 groups are 128x1 on x).
int64_t tile_rows(GroupShape g, GroupShape gx) { return std::max({int64_t(cast_tile_rows), g.rows, gx.rows}); }

// Whether every group of both copies of a cast_transpose lies within one tile of tile_rows (at most
// twice cast_tile_rows) x cast_tile_cols, and the two differ (mx32, 1x16 / 1x32 / 1x128 blocks:
// 1xN groups along x's rows and Nx1 groups for x^T's), so that each tile can find its own scales
// from what it has in cache.
bool tile_local(GroupShape g, GroupShape gx) {
    const int64_t rows = tile_rows(g, gx);
    const auto fits = [&](GroupShape s) { return rows % s.rows == 0 && int64_t(cast_tile_cols) % s.cols == 0; };
    return !(g == gx) && rows <= 2 * int64_t(cast_tile_rows) && fits(g) && fits(gx);
}

// Both copies in one pass over tiles of cast_tile_rows (tile_rows where tile-local) x
// cast_tile_cols, each element cast as encode(float32(x * multiplier)) in each, with the
// multipliers of each copy's groups as they lie on x (mult: x's groups g, mult_x: the transposed
// copy's, gx). A tile's rows are cast by the bulk encode kernel into a stage in L1 and copied out
// (store_codes). The transposed copy: where each
// element's multiplier is the same in both copies (tensor scaling, square blocks: the transposed
// copy's groups are the copy's, transposed), that stage transposed; else the tile's rows cast
// again into a second stage, each by its multipliers in the transposed copy, and that stage
// transposed. (Written straight into the outputs, a tile's rows, often a multiple of 4 KiB apart,
// share a few L1 sets.) With each 16x16 block of floats transposed in registers and both copies
// encoded there with 16-byte stores, f32 [2048, 2048] took (2 threads, Zen 5) 0.59-0.60 ms with
// tensor scaling (0.41-0.43 by the stages) and 0.95-0.99 with row scaling (0.80-0.85).
// mult null (tile_local groups): each tile first finds its groups' amaxes and writes their scales,
// so x is read once from memory and no thread waits on a serial pass over every group's scale.
// Returns the max |x| bits where this pass measured it (a fixed scale's cast, tile-local scales).
template <class T>
uint32_t cast_tiles(const detail::QuantizeJob& job, const float* mult, const float* mult_x) {
    const MatrixRef& x = job.x;
    const GroupShape g = job.group, gx{job.group_t.cols, job.group_t.rows};
    const bool same = g == gx, local = mult == nullptr, measure = job.rule.fixed_scale != nullptr;
    // TR rows a tile (the stage holds two cast_tile_rows, stored a cast_tile_rows at a time)
    constexpr int64_t TS = int64_t(cast_tile_rows), TC = int64_t(cast_tile_cols);
    const int64_t TR = local ? tile_rows(g, gx) : TS;
    const auto& k = active_kernels();
    const auto encode_kernel = k.encode<T>(job.rule.format, job.overflow);
    const auto amax_kernel = k.amax<T>();
    const int64_t gc = ceil_div(x.cols, g.cols), gxr = ceil_div(x.rows, gx.rows), gxc = ceil_div(x.cols, gx.cols);
    const int64_t col_tiles = ceil_div(x.cols, TC);
    const bool stream = size_t(elements(x)) >= cast_stream_bytes;
    // Tile-local scales: per thread slot, a tile's group amaxes and multipliers of each shape.
    const int64_t n = local ? TR / g.rows * (TC / g.cols) : 0, nx = local ? TR / gx.rows * (TC / gx.cols) : 0;
    detail::Scratch<uint32_t> tile_acc(int64_t(num_threads()) * (n + nx));
    detail::Scratch<float> tile_mult(int64_t(num_threads()) * (n + nx));
    SlotMax total;
    parallel_tasks(ceil_div(x.rows, TR) * col_tiles, elements(x), [&](int64_t t, int slot) {
        const int64_t i0 = t / col_tiles * TR, j0 = t % col_tiles * TC;
        const int64_t h = std::min(TR, x.rows - i0), w = std::min(TC, x.cols - j0);
        MultView m{mult, gc, 0, 0}, mx{mult_x, gxc, 0, 0};
        if (local) {  // the tile's groups of each shape: [nr, nc] from group (r0, c0); [nrx, ncx] from (rx0, cx0)
            const int64_t r0 = i0 / g.rows, c0 = j0 / g.cols, nr = ceil_div(h, g.rows), nc = ceil_div(w, g.cols);
            const int64_t rx0 = i0 / gx.rows, cx0 = j0 / gx.cols, nrx = ceil_div(h, gx.rows), ncx = ceil_div(w, gx.cols);
            uint32_t* a = tile_acc.get() + slot * (n + nx);
            uint32_t* ax = a + n;
            float* ma = tile_mult.get() + slot * (n + nx);
            float* mxa = ma + n;
            std::fill(a, a + nr * nc, 0u);
            std::fill(ax, ax + nrx * ncx, 0u);
            // The first read of the tile, from memory: the same row of the thread's next tile
            // (static schedule: task t + 1) asked for meanwhile, as the hardware prefetchers do not
            // follow 64 runs of 1 KiB, each in a page of its own.
            const int64_t ni0 = (t + 1) / col_tiles * TR, nj0 = (t + 1) % col_tiles * TC;
            const int64_t next_bytes = std::min(TC, x.cols - nj0) * int64_t(sizeof(T));
            for (int64_t i = i0; i < i0 + h; ++i) {
                for (int64_t b = 0; ni0 + i - i0 < x.rows && b < next_bytes; b += 64) {
                    FP8KIT_PREFETCH_L2(reinterpret_cast<const char*>(row<T>(x, ni0 + i - i0) + nj0) + b);
                }
                amax_kernel(row<T>(x, i) + j0, size_t(w), size_t(g.cols), 0, a + (i - i0) / g.rows * nc);
                amax_kernel(row<T>(x, i) + j0, size_t(w), size_t(gx.cols), 0, ax + (i - i0) / gx.rows * ncx);
            }
            // x's group (r, c) is the transposed copy's (c, r): its entry c * gxr + r.
            const uint32_t seen = make_scales(a, nr, nc, job.rule, scale_entry(job.scale_inv, job.rule, r0 * gc + c0), gc, 1, ma);
            total[size_t(slot)] = std::max(total[size_t(slot)], seen);
            make_scales(ax, nrx, ncx, job.rule, scale_entry(job.scale_inv_t, job.rule, cx0 * gxr + rx0), 1, gxr, mxa);
            m = {ma, nc, r0, c0};
            mx = {mxa, ncx, rx0, cx0};
        }
        alignas(64) uint8_t stage[2 * TS * TC];
        for (int64_t i = i0; i < i0 + h; ++i) {
            encode_kernel(row<T>(x, i) + j0, stage + (i - i0) * TC, size_t(w), size_t(g.cols), size_t(j0 % g.cols),
                          m.row(i, j0, g), measure ? &total[size_t(slot)] : nullptr);
        }
        // The stage into the row-major copy, the transposed one, or both.
        const auto store = [&](bool rows_out, bool transposed_out) {
            for (int64_t h0 = 0; h0 < h; h0 += TS) {
                k.store_codes(stage + h0 * TC, size_t(TC), size_t(std::min(TS, h - h0)), size_t(w),
                              rows_out ? job.data + (i0 + h0) * x.cols + j0 : nullptr, size_t(x.cols),
                              transposed_out ? job.data_t + j0 * x.rows + i0 + h0 : nullptr, size_t(x.rows), stream);
            }
        };
        if (same) {
            store(true, true);
            return;
        }
        store(true, false);
        for (int64_t i = i0; i < i0 + h; ++i) {
            encode_kernel(row<T>(x, i) + j0, stage + (i - i0) * TC, size_t(w), size_t(gx.cols), size_t(j0 % gx.cols),
                          mx.row(i, j0, gx), nullptr);
        }
        store(false, true);
    });
    return total.max();
}

template <class T>
void quantize_typed(detail::QuantizeJob& job) {
    const MatrixRef& x = job.x;
    const GroupShape g = job.group;
    uint32_t total = 0;
    std::vector<uint32_t> acc;
    std::vector<float> mult, mult_t;
    if (job.data_t == nullptr) {
        if (job.rule.fixed_scale != nullptr) {
            static_cast<float*>(job.scale_inv)[0] = group_scale(0.0f, job.rule).scale_inv;
            encode_rows<T>(x, g, job.rule.fixed_scale, job, job.data, &total);
        } else if (g.rows < x.rows || g.cols < x.cols) {
            if (g.rows < x.rows || g.cols > 1) {  // (a decode step's row with 1x128 or 1x32 groups too)
                total = quantize_tiles<T>(job);
            } else {  // column scaling: groups one column wide, as tall as the matrix
                group_amax_bits<T>(x, {g}, {&acc});
                total = make_scales(acc, job.rule, job.scale_inv, mult);
                encode_rows<T>(x, g, mult.data(), job, job.data, nullptr);
            }
        } else {  // tensor
            acc.assign(1, total_amax_bits<T>(x));
            total = make_scales(acc, job.rule, job.scale_inv, mult);
            encode_rows<T>(x, g, mult.data(), job, job.data, nullptr);
        }
        *job.amax = amax_value(total);
        return;
    }
    // cast_transpose: the scales of both copies (each tile's own where tile_local), then one tiled
    // pass writes both.
    const GroupShape gx{job.group_t.cols, job.group_t.rows};  // the transposed copy's groups as they lie on x
    if (job.rule.fixed_scale != nullptr) {
        static_cast<float*>(job.scale_inv)[0] = static_cast<float*>(job.scale_inv_t)[0] =
            group_scale(0.0f, job.rule).scale_inv;
        total = cast_tiles<T>(job, job.rule.fixed_scale, job.rule.fixed_scale);
    } else if (tile_local(g, gx)) {
        total = cast_tiles<T>(job, nullptr, nullptr);
    } else {
        std::vector<uint32_t> acc_x;
        if (gx == g) {
            group_amax_bits<T>(x, {g}, {&acc});
        } else {
            group_amax_bits<T>(x, {g, gx}, {&acc, &acc_x});
        }
        const std::vector<uint32_t>& ax = gx == g ? acc : acc_x;  // [gxr, gxc]
        total = make_scales(acc, job.rule, job.scale_inv, mult);
        mult_t.resize(ax.size());
        const int64_t gxr = ceil_div(x.rows, gx.rows);  // x's group (r, c) is the transposed copy's (c, r)
        make_scales(ax.data(), gxr, ceil_div(x.cols, gx.cols), job.rule, job.scale_inv_t, 1, gxr, mult_t.data());
        cast_tiles<T>(job, mult.data(), mult_t.data());
    }
    *job.amax = amax_value(total);
}

template <class Out>
void dequantize_typed(const detail::DequantizeJob& job) {
    const auto kernel = active_kernels().decode<Out>(job.format);
    const GroupShape g = job.group;
    const int64_t gr = ceil_div(job.rows, g.rows), gc = ceil_div(job.cols, g.cols);
    std::vector<float> scale_inv(size_t(gr * gc));
    for (size_t k = 0; k < scale_inv.size(); ++k) {
        scale_inv[k] = job.e8m0 ? decode(static_cast<const uint8_t*>(job.scale_inv)[k], Format::e8m0fnu)
                                : static_cast<const float*>(job.scale_inv)[k];
    }
    Out* out = static_cast<Out*>(job.out);
    const size_t n = size_t(job.rows * job.cols);
    if (gr == 1 && gc == 1) {  // one scale: split the flat run (large outputs stream)
        parallel_ranges(n, [&](size_t begin, size_t count) {
            kernel(job.data + begin, out + begin, count, count, 0, scale_inv.data());
        });
        return;
    }
    parallel_tasks(job.rows, n, [&](int64_t i, int) {
        kernel(job.data + i * job.cols, out + i * job.cols, size_t(job.cols), size_t(g.cols), 0,
               scale_inv.data() + i / g.rows * gc);
    });
}

}  // namespace

void amax(const ExecContext&, const MatrixRef& x, float* out) {
    uint32_t bits = 0;
    detail::with_storage_type(x.dtype, [&]<class T>(T) { bits = total_amax_bits<T>(x); });
    *out = amax_value(bits);
}

void group_amax(const ExecContext&, const MatrixRef& x, GroupShape g, float* out) {
    std::vector<uint32_t> acc;
    detail::with_storage_type(x.dtype, [&]<class T>(T) { group_amax_bits<T>(x, {g}, {&acc}); });
    for (size_t k = 0; k < acc.size(); ++k) out[k] = amax_value(acc[k]);
}

void quantize(detail::QuantizeJob& job) {
    detail::with_storage_type(job.x.dtype, [&]<class T>(T) { quantize_typed<T>(job); });
    if (!std::isfinite(*job.amax)) detail::encode_infinities(job);  // the kernels clamp Inf under saturate
}

void dequantize(const detail::DequantizeJob& job) {
    detail::with_storage_type(job.out_dtype, [&]<class Out>(Out) { dequantize_typed<Out>(job); });
}

}  // namespace fp8kit::cpu
