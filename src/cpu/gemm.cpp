// src/cpu/gemm.cpp: the cpu backend's scaled FP8 GEMM - packing, the fused cast, the blocking
// over threads and caches, K-group promotion and the epilogue - plus the portable kernels.
// Checked against the reference backend and float64 by tests/ops/test_gemm.cpp on every ISA.
//
// Blocking. B is packed once (pack_weight, FP8 codes in 16-column strips). A is packed per call
// into bf16 rows - the fused cast quantizes A here, a 64-row panel at a time, with the cast
// kernels quantize() uses, so the codes and scales are exactly quantize()'s and no FP8 copy of
// A is ever written; a weight-only A is packed as its bf16 terms, two rows (hi, lo) for each row
// of an f32 / f16 A, added in the epilogue. Tasks are panels of 8 strips (128 columns) times a
// range of A's rows; a task widens a window of its B panel (256 KiB: <= 1024 of K in bf16, 512 in
// float32; on AMX 512 KiB, 2048 of K; L2) once and sweeps all its rows of A over it in 32x32
// blocks, accumulating in a float32 buffer of its own.
// With one K group (tensor, row scaling) the tiles sum all of K; with narrower groups each
// group's partial sums are promoted into the accumulator as partial * (sa * sb).
//
// Folding. Where every scale of A and B is a power of two in [2^-32, 2^32] (fold_log2: MX's e8m0
// scales, the block recipe with power-of-two scales as TransformerEngine's default), each group's
// scales are folded into its operands - A's rows as they are packed, B's strips as they are
// widened - by adding the exponents to the bf16 values (exact), and the tiles sum all of K as one
// group: the same products, summed in one float32 sum over K instead of a sum per group and a
// promotion (an error bound of K roundings, as tensor scaling's, in place of group + groups), at
// the tensorwise speed where promoting each 128-wide group out of the tiles cost 20-35%.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "core/host_memory.hpp"
#include "core/math.hpp"
#include "core/ops.hpp"
#include "cpu/gemm_kernels.hpp"
#include "cpu/parallel.hpp"
#include "fp8kit/runtime.hpp"

namespace fp8kit::cpu {

namespace {

using detail::GemmJob;
using detail::GroupScale;
using detail::GemmOperand;
using detail::Scratch;

constexpr int64_t fuse_panel_rows = 64;  // rows of A quantized per fused-cast step

// ---- portable kernels ----

void expand_portable(const uint8_t* codes, int64_t n, const ExpandTable& t, uint16_t* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = t.bf16[codes[i]];
}

float bf16_value(uint16_t bits) { return float(bf16::from_bits(bits)); }

// One 16x16 tile over `chunks` K chunks: the same sum as TDPBF16PS (products exact, then
// added in float32, pairs in order).
void tile_portable(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t chunks, float* c, int64_t ldc,
                   bool accumulate) {
    float acc[gemm_tile][gemm_tile];
    for (int64_t r = 0; r < gemm_tile; ++r) {
        for (int64_t n = 0; n < gemm_tile; ++n) acc[r][n] = accumulate ? c[r * ldc + n] : 0.0f;
    }
    for (int64_t q = 0; q < chunks; ++q) {
        const uint16_t* bt = b + q * gemm_chunk_codes;
        for (int64_t r = 0; r < gemm_tile; ++r) {
            const uint16_t* ar = a + r * lda + q * gemm_chunk;
            for (int64_t p = 0; p < gemm_chunk / 2; ++p) {
                const float a0 = bf16_value(ar[2 * p]), a1 = bf16_value(ar[2 * p + 1]);
                const uint16_t* bp = bt + p * 2 * gemm_tile;
                for (int64_t n = 0; n < gemm_tile; ++n) {
                    acc[r][n] += a0 * bf16_value(bp[2 * n]);
                    acc[r][n] += a1 * bf16_value(bp[2 * n + 1]);
                }
            }
        }
    }
    for (int64_t r = 0; r < gemm_tile; ++r) {
        for (int64_t n = 0; n < gemm_tile; ++n) c[r * ldc + n] = acc[r][n];
    }
}

void block_portable(int rows, int nj, const uint16_t* a, int64_t lda, const void* bw, int64_t b_strip,
                    int64_t chunks, float* c, int64_t ldc, bool accumulate) {
    const auto* b = static_cast<const uint16_t*>(bw);
    const int64_t mi = (rows + gemm_tile - 1) / gemm_tile;
    for (int64_t i = 0; i < mi; ++i) {
        for (int j = 0; j < nj; ++j) {
            tile_portable(a + i * gemm_tile * lda, lda, b + j * b_strip, chunks, c + i * gemm_tile * ldc + j * gemm_tile,
                          ldc, accumulate);
        }
    }
}

constexpr GemmKernels portable_kernels{&expand_portable, &widen_bf16<&expand_portable>, 2, 8, 32, 32, 0, 2, 0,
                                       &block_then_promote<&block_portable>, false, &no_tile_state, &no_tile_state, nullptr, nullptr, 0, 0, 0, 0,
                                       &matmul_f32_portable, &scale_store_loop, &gelu_row_loop, &fold_loop,
                                       &widen_then_fold<&expand_portable>, 1, &pack_group_loop, &mark_strip_loop, nullptr, "portable"};

// ---- packing A ----

// One packed bf16 row of A (kl.padded elements): fill(k0, len, dst) writes the len elements of K
// from k0 into dst, a K group at a time with the group padding zeroed here - or, with no padding
// between groups, all of K in one call (mx32's 32-wide groups a call each: 512 x 2048 x 2048
// 2-3% slower).
template <class Fill>
void pack_groups(const KLayout& kl, uint16_t* out, Fill&& fill) {
    if (kl.k > 0 && kl.group == kl.group_padded && kl.k % kl.group == 0) {
        fill(0, kl.k, out);
        return;
    }
    for (int64_t g = 0; g < kl.groups; ++g) {
        const int64_t len = kl.k > 0 ? kl.len(g) : 0;
        uint16_t* dst = out + g * kl.group_padded;
        fill(g * kl.group, len, dst);
        std::memset(dst + len, 0, size_t(kl.group_padded - len) * sizeof(uint16_t));
    }
}

// Row i of A's codes into packed bf16 row `out`.
void pack_row(const uint8_t* codes, const KLayout& kl, const ExpandTable& table, const GemmKernels& kern,
              uint16_t* out) {
    pack_groups(kl, out, [&](int64_t k0, int64_t len, uint16_t* dst) { kern.expand(codes + k0, len, table, dst); });
}

// Packed rows per row of A: a weight-only A of more precision than bf16 (f32, f16) is packed as
// two bf16 rows, its hi and lo terms (detail::weight_only_hi / _lo), whose sums the epilogue adds
// (twice the products: the price of x to 16 significant bits instead of 8); else one row.
int64_t a_terms(const GemmJob& job) { return job.a_hp.data != nullptr && job.a_hp.dtype != DType::bf16 ? 2 : 1; }

// Row i of a weight-only A into packed bf16 row `out`, its hi terms, and with two terms its lo
// terms into the next packed row, lda further (the element type chosen once per row).
void pack_row_weight_only(const detail::MatrixRef& x, int64_t i, const KLayout& kl, int64_t terms, uint16_t* out,
                          int64_t lda) {
    const auto pack = [&](const auto* row) {
        pack_groups(kl, out, [&](int64_t k0, int64_t len, uint16_t* dst) {
            for (int64_t e = 0; e < len; ++e) dst[e] = detail::weight_only_hi(float(row[k0 + e]));
        });
        if (terms == 1) return;
        // The hi term of each element is already packed lda back, at the same place in the row above.
        pack_groups(kl, out + lda, [&](int64_t k0, int64_t len, uint16_t* dst) {
            for (int64_t e = 0; e < len; ++e) dst[e] = detail::weight_only_lo(float(row[k0 + e]), (dst - lda)[e]);
        });
    };
    switch (x.dtype) {
        case DType::bf16: {  // one term, hi = x on its bits
            const auto* row = static_cast<const uint16_t*>(x.data) + i * x.ld;
            return pack_groups(kl, out, [&](int64_t k0, int64_t len, uint16_t* dst) {
                for (int64_t e = 0; e < len; ++e) dst[e] = detail::weight_only_hi_bf16(row[k0 + e]);
            });
        }
        case DType::f16: return pack(static_cast<const f16*>(x.data) + i * x.ld);
        default: return pack(static_cast<const float*>(x.data) + i * x.ld);
    }
}

// Whether every element of a weight-only bf16 A is its own packed value (weight_only_hi_bf16: no
// NaN to quiet, nothing to flush), so that the kernels may read A where it is.
bool bf16_rows_pack_as_they_are(const detail::MatrixRef& x, int64_t m, int64_t k) {
    std::atomic<bool> as_they_are{true};
    parallel_tasks(m, size_t(m * k), [&](int64_t i, int) {
        const auto* row = static_cast<const uint16_t*>(x.data) + i * x.ld;
        // weight_only_hi_bf16 changes b where its magnitude is a NaN's or nonzero below 2^-102;
        // on int16 lanes (a magnitude is <= 0x7fff), an OR over the row: the loop vectorizes.
        int16_t changed = 0;
        for (int64_t e = 0; e < k; ++e) {
            const auto mag = int16_t(row[e] & 0x7fff);
            changed |= int16_t((mag > int16_t(detail::bf16_inf_bits)) | ((mag > 0) & (mag < int16_t(detail::bf16_flush_bits))));
        }
        if (changed != 0) as_they_are.store(false, std::memory_order_relaxed);
    });
    return as_they_are.load();
}

// Scales of A's rows [r0, r1) per (packed row, K group): sa[(i * terms + t) * groups + g], the
// same for each of a row's terms.
void a_scales(const GemmOperand& a, const KLayout& kl, int64_t r0, int64_t r1, int64_t terms, float* sa) {
    for (int64_t i = r0; i < r1; ++i) {
        for (int64_t t = 0; t < terms; ++t) {
            for (int64_t g = 0; g < kl.groups; ++g) sa[(i * terms + t) * kl.groups + g] = a.scale(i, g * kl.group);
        }
    }
}

float nan_max(float a, float b) { return std::isnan(a) || std::isnan(b) ? std::nanf("") : std::max(a, b); }

// Folds packed rows [r0, r1)'s scales in sa into their groups (Folding), leaving 1 in sa; false
// where a scale does not fold (the rows are then part-folded: gemm() packs them again).
bool fold_a_rows(const KLayout& kl, const GemmKernels& kern, int64_t r0, int64_t r1, uint16_t* apk, int64_t lda,
                 float* sa) {
    for (int64_t i = r0; i < r1; ++i) {
        for (int64_t g = 0; g < kl.groups; ++g) {
            float& s = sa[i * kl.groups + g];
            int e = 0;
            if (!fold_log2(s, e)) return false;
            int16_t add[2 * gemm_tile];
            std::fill(std::begin(add), std::end(add), int16_t(e * 128));
            kern.fold(apk + i * lda + g * kl.group_padded, kl.group_padded, add);
            s = 1.0f;
        }
    }
    return true;
}

// Packs A [m, k] into apk [Mp][lda] (m * terms rows, a_terms) and its scales into sa; with the
// fused cast, quantizes it on the way (fills job.fuse's scale_inv and amax as quantize() would);
// weight-only, splits it into bf16 terms. fold (FP8 A, terms 1): folds its scales into the rows
// (fold_a_rows); false where one does not fold.
bool pack_a(GemmJob& job, const KLayout& kl, const GemmKernels& kern, int64_t terms, uint16_t* apk, int64_t lda,
            float* sa, bool fold) {
    const int64_t m = job.m, pm = m * terms, mp = round_up(pm, gemm_tile);
    const ExpandTable& table = expand_table(job.a.format);
    std::memset(apk + pm * lda, 0, size_t((mp - pm) * lda) * sizeof(uint16_t));
    std::atomic<bool> folded{true};
    if (job.fuse == nullptr) {
        parallel_tasks(m, size_t(pm * kl.padded), [&](int64_t i, int) {
            if (job.a_hp.data != nullptr) {
                pack_row_weight_only(job.a_hp, i, kl, terms, apk + i * terms * lda, lda);
            } else {
                pack_row(job.a.data + i * job.a.ld, kl, table, kern, apk + i * lda);
            }
            a_scales(job.a, kl, i, i + 1, terms, sa);
            if (fold && !fold_a_rows(kl, kern, i, i + 1, apk, lda, sa)) folded.store(false, std::memory_order_relaxed);
        });
        return folded.load();
    }
    detail::QuantizeJob whole = *job.fuse;
    const bool tensor = whole.group.rows >= m && whole.group.cols >= job.k && !whole.rule.mx;
    int64_t rows_per_panel = whole.group.rows * std::max<int64_t>(1, fuse_panel_rows / whole.group.rows);
    float tensor_scale_inv = 0.0f, total_amax = 0.0f, current_scale = 0.0f;
    if (tensor) {
        // Current scaling needs the amax of all of A before any code: one read-only pass, then
        // every panel is cast with that one scale - the scale quantize() would compute.
        amax(job.ctx, whole.x, &total_amax);
        if (whole.rule.fixed_scale == nullptr) {
            current_scale = group_scale(total_amax, whole.rule).scale;
            whole.rule.fixed_scale = &current_scale;
        }
        tensor_scale_inv = 1.0f / *whole.rule.fixed_scale;
        static_cast<float*>(job.fuse->scale_inv)[0] = tensor_scale_inv;
        rows_per_panel = fuse_panel_rows;
    }
    const int64_t panels = (m + rows_per_panel - 1) / rows_per_panel;
    // Each thread's panel of codes (slot t at t * panel_codes; a panel holds at most m rows), and
    // each panel's amax.
    const int64_t panel_codes = std::min(rows_per_panel, m) * job.k;
    Scratch<uint8_t> codes(int64_t(num_threads()) * panel_codes);
    Scratch<float> amaxes(panels);
    std::fill(amaxes.get(), amaxes.get() + panels, 0.0f);
    const size_t scale_size = whole.rule.mx ? 1 : sizeof(float);
    parallel_tasks(panels, size_t(m * job.k), [&](int64_t p, int slot) {
        detail::QuantizeJob sub = whole;
        const int64_t r0 = p * rows_per_panel, rows = std::min(rows_per_panel, m - r0);
        sub.x.data = static_cast<const char*>(whole.x.data) + r0 * whole.x.ld * dtype_size(whole.x.dtype);
        sub.x.rows = rows;
        sub.data = codes.get() + slot * panel_codes;
        float dummy = 0.0f;
        if (tensor) {
            sub.group = {rows, job.k};
            sub.scale_inv = &dummy;
        } else {
            sub.scale_inv = static_cast<char*>(whole.scale_inv) + (r0 / whole.group.rows) * job.a.scale_cols * scale_size;
        }
        sub.amax = amaxes.get() + p;
        quantize(sub);  // nested in this task: runs on this thread
        for (int64_t i = 0; i < rows; ++i) pack_row(sub.data + i * job.k, kl, table, kern, apk + (r0 + i) * lda);
        a_scales(job.a, kl, r0, r0 + rows, 1, sa);
        if (fold && !fold_a_rows(kl, kern, r0, r0 + rows, apk, lda, sa)) folded.store(false, std::memory_order_relaxed);
    });
    if (!tensor) {
        for (int64_t p = 0; p < panels; ++p) total_amax = nan_max(total_amax, amaxes.get()[p]);
    }
    *job.fuse->amax = std::isnan(total_amax) ? std::bit_cast<float>(detail::canonical_nan_bits) : total_amax;
    return folded.load();
}

// ---- packing B ----

// Strip s of B (row j at rows + j * ld) into pb: its codes, chunk_specials and strip_nonfinite.
void pack_strip(PackedB& pb, const uint8_t* rows, int64_t ld, const GemmKernels& kern, int64_t s) {
    // B's rows 16 s ... 16 s + 15 (fewer in the last). The packed K position of group g's element
    // e is kp = g * group_padded + e (group_padded even), and its byte for column c is 32 (kp / 2)
    // + 2 c + kp % 2 (GemmKernels::pack_group).
    const KLayout& kl = pb.kl;
    uint8_t* out = reinterpret_cast<uint8_t*>(pb.codes.get()) + s * kl.padded * gemm_tile;
    const int64_t cols = std::min(gemm_tile, pb.n - s * gemm_tile);
    for (int64_t g = 0; g < kl.groups; ++g) {
        const int64_t len = kl.k > 0 ? kl.len(g) : 0, k0 = g * kl.group;
        uint8_t* dst = out + g * kl.group_padded * gemm_tile;  // = 32 * (kp / 2) at e = 0
        // Padding codes are 0x00 (+0): a group with padding (K past its length, or a last strip
        // of fewer than 16 rows) is zeroed first; the others are written in full below.
        if (len < kl.group_padded || cols < gemm_tile) std::memset(dst, 0, size_t(kl.group_padded * gemm_tile));
        kern.pack_group(rows + s * gemm_tile * ld + k0, ld, cols, len, dst);
    }
    const int64_t chunks = kl.padded / gemm_chunk, lines = chunks * (gemm_chunk_codes / 64);
    pb.strip_nonfinite[size_t(s)] = uint8_t(kern.mark_strip(pb.strip(s), lines, pb.format, pb.chunk_specials.data() + s * chunks));
}

// A PackedB of B's rows (u.rows) with its strips packed.
PackedB packed_strips(const PackedB& u, const GemmKernels& kern) {
    PackedB pb{u.n, u.strips, u.kl, u.format, detail::host_allocate(u.code_bytes()), u.scales, {}, {}, u.scales_fold};
    pb.strip_nonfinite.assign(size_t(pb.strips), 0);
    pb.chunk_specials.assign(size_t(pb.strips * (pb.kl.padded / gemm_chunk)), 0);
    parallel_tasks(pb.strips, size_t(pb.n * pb.kl.k), [&](int64_t s, int) { pack_strip(pb, u.rows, u.ld, kern, s); });
    return pb;
}

// ---- one task: packed rows [r0, r1) of A (multiples of 16, r1 may pass them) x strips [s0, s1) of B ----

struct Task {
    const GemmJob& job;
    const PackedB& b;
    const GemmKernels& kern;
    const uint16_t* apk;
    int64_t lda;
    // Packed rows from tail_row on are read from tail (row tail_row first, the same lda): the last,
    // partial block of rows of an A read in place (gemm() says when), padded there to whole tiles.
    const uint16_t* tail;
    int64_t tail_row;
    const float* sa;
    // B's column scales for the epilogue: with one group, PackedB::scales (then strip after strip,
    // column order); 1s with several (the promotion scaled the sums) and when folded.
    const float* sb;
    const ExpandTable& table;
    int64_t terms;     // packed rows per row of A (a_terms)
    int64_t packed_m;  // job.m * terms
    const float* bias;  // job.bias as float32 (a bf16 / f16 one converted once: exact), or null
    // On the small-M kernel: chosen by all of packed A, not a task's rows, so that which kernel
    // runs (and so how D rounds) does not depend on how the work was split between threads.
    bool small;
    bool fold;  // the scales are folded into A and B's widened strips: K summed as one group

    const uint16_t* a_row(int64_t r) const { return r >= tail_row ? tail + (r - tail_row) * lda : apk + r * lda; }
};

// The chunks of K in one window of run_tiles: all of K where it is at most the kernel's
// one_window_chunks, else whole K groups, up to the kernel's window_chunks (one group may be
// longer: then the window is that group, in pieces accumulated in the tiles); folded, K is one group.
int64_t window_chunks(const KLayout& kl, const GemmKernels& kern, bool fold) {
    const int64_t cpg = kl.chunks_per_group(), chunks = kl.padded / gemm_chunk;
    if (chunks <= kern.one_window_chunks) return chunks;
    return kl.groups == 1 || fold ? std::min(kern.window_chunks, chunks)
                                  : std::max<int64_t>(1, kern.window_chunks / cpg) * cpg;
}

// Whether all of K is one window (run_tiles then keeps one block's sums, not the task's).
bool one_window(const KLayout& kl, const GemmKernels& kern, bool fold) {
    return kl.padded / gemm_chunk <= window_chunks(kl, kern, fold);
}

// The epilogue of packed rows [p0, p0 + rows) over strips [s0, s1), their sums in acc (row p0's
// first): scales (one group), alpha, C, bias, activation, the output type - written to D.
void finish_rows(const Task& t, int64_t p0, int64_t rows, int64_t s0, int64_t s1, float* acc, int64_t ldacc) {
    const GemmJob& job = t.job;
    const int64_t j0 = s0 * gemm_tile, cols = std::min(job.n, s1 * gemm_tile) - j0;
    const float* sb = t.sb + j0;
    const bool summed = t.b.kl.groups == 1 || t.fold;  // the sums still to be scaled by sa * sb
    const bool gelu = job.activation == Activation::gelu;
    if (t.terms == 1 && job.c.data == nullptr && (job.out_dtype == DType::f32 || job.out_dtype == DType::bf16)) {
        // Promoted sums are scaled already: sa = 1 and sb's 1s leave alpha * v, as below.
        const bool bf16_out = job.out_dtype == DType::bf16;
        const float* bias = t.bias == nullptr ? nullptr : t.bias + j0;
        auto* out = static_cast<std::byte*>(job.out) + (p0 * job.n + j0) * (bf16_out ? 2 : 4);
        for (int64_t i = 0; i < rows; ++i, out += job.n * (bf16_out ? 2 : 4)) {
            t.kern.scale_store(acc + i * ldacc, job.alpha, summed ? t.sa[p0 + i] : 1.0f, sb, bias, gelu, out, bf16_out, cols);
        }
        return;
    }
    for (int64_t i = 0; i < rows; i += t.terms) {  // p0 is a multiple of terms (of 16)
        float* v = acc + i * ldacc;
        const int64_t gi = (p0 + i) / t.terms;
        if (t.terms == 2) {
            // hi's sums plus lo's. A non-finite hi sum stays as it is: where B holds an Inf, lo's
            // term may be 0 x Inf = NaN while hi's sum is the Inf that x . B is (a NaN or Inf x is
            // in hi alone, its lo zero; and hi's sums overflow before lo's).
            const float* lo = v + ldacc;
            for (int64_t j = 0; j < cols; ++j) v[j] = std::isfinite(v[j]) ? v[j] + lo[j] : v[j];
        }
        if (summed) {
            const float sa = t.sa[p0 + i];
            for (int64_t j = 0; j < cols; ++j) v[j] = job.alpha * (v[j] * (sa * sb[j]));
        } else {
            for (int64_t j = 0; j < cols; ++j) v[j] = job.alpha * v[j];
        }
        detail::gemm_epilogue(job, gi, j0, v, cols, t.kern.gelu_row);
        detail::gemm_store(job, gi, j0, v, cols);
    }
}

// Packed rows [r0, r0 + rows) x strips [s0, s1) on 16x16 tiles into acc: windows of B widened
// (bf16 or float32, the kernel's choice) once per task and reused by every pair of row tiles. A
// last tile partly past the packed rows is computed whole or in part (GemmKernels::block).
// Each block of rows is finished (finish_rows) as soon as the last window's tiles stored its sums,
// while they are in L1. With one window (K up to window_chunks x 32) the blocks then take turns
// in one block's sums (acc_out holds block_rows rows, not the task's): the task's whole sums
// (1 MiB at 512^3) and D did not stay in L2 together.
void run_tiles(const Task& t, int64_t r0, int64_t rows, int64_t s0, int64_t s1, float* acc_out, int64_t ldacc) {
    const KLayout& kl = t.b.kl;
    const int64_t ns = s1 - s0;
    const bool one_group = kl.groups == 1 || t.fold;
    const int64_t cpg = kl.chunks_per_group();
    const int64_t wchunks = window_chunks(kl, t.kern, t.fold);
    const int64_t b_strip = wchunks * gemm_chunk_codes;  // elements of the window per strip
    const int64_t eb = t.kern.widened_bytes;
    Scratch<std::byte> bexp(ns * b_strip * eb);
    Scratch<int16_t> fold_adds(t.fold && t.b.rows != nullptr ? wchunks * 2 * gemm_tile : 0);  // widen_rows' addends
    const int64_t total_chunks = kl.padded / gemm_chunk;
    const bool one_window = cpu::one_window(kl, t.kern, t.fold);

    // The next window's codes are prefetched into L2 while this one computes, a share before each
    // block: otherwise each window's read from memory and its computation take turns, which at
    // small M (few blocks per window) costs most (M = 16 on the avx512-bf16 tiles out of cache:
    // +3-9% with it).
    const bool whole_window = one_group || t.kern.block_groups;  // a block() call takes the window's K
    const int64_t steps_per_window = whole_window ? 1 : std::max<int64_t>(1, wchunks / cpg);
    const int64_t block_rows = t.kern.block_tiles * gemm_tile;
    const int64_t blocks_per_window = (rows + block_rows - 1) / block_rows * steps_per_window * ((ns + 1) / 2);
    t.kern.begin();
    for (int64_t w0 = 0; w0 < total_chunks; w0 += wchunks) {
        const int64_t wc = std::min(wchunks, total_chunks - w0);
        for (int64_t s = 0; s < ns; ++s) {
            auto* w = bexp.get() + s * b_strip * eb;
            if (t.b.rows != nullptr) {  // B left as its rows (gemm() says when); folded, each chunk by its group's addends
                const int64_t j0 = (s0 + s) * gemm_tile;
                for (int64_t q = 0; t.fold && q < wc; ++q) {
                    int16_t* add = fold_adds.get() + q * 2 * gemm_tile;
                    if (q == 0 || (w0 + q) % cpg == 0) {
                        b_fold_add(t.b, s0 + s, (w0 + q) / cpg, add);
                    } else {
                        std::copy_n(add - 2 * gemm_tile, 2 * gemm_tile, add);
                    }
                }
                t.kern.widen_rows(t.b.rows + j0 * t.b.ld, t.b.ld, std::min(gemm_tile, t.b.n - j0), w0 * gemm_chunk, wc, kl.k,
                                  t.table, t.fold ? fold_adds.get() : nullptr, w);
                continue;
            }
            const uint8_t* codes = t.b.strip(s0 + s) + w0 * gemm_chunk_codes;
            const bool nan = t.b.strip_nonfinite[size_t(s0 + s)] != 0;
            if (!t.fold) {
                t.kern.widen_b(codes, wc * gemm_chunk_codes, t.table, nan, w);
                continue;
            }
            // Folded: each K group's chunks of the window times the strip's scales in that group.
            for (int64_t q = 0; q < wc;) {
                const int64_t g = (w0 + q) / cpg, q1 = std::min(wc, (g + 1) * cpg - w0);
                int16_t add[2 * gemm_tile];
                b_fold_add(t.b, s0 + s, g, add);
                t.kern.widen_fold(codes + q * gemm_chunk_codes, (q1 - q) * gemm_chunk_codes, t.table, nan, add,
                                  &t.b.specials(s0 + s, w0 + q), reinterpret_cast<uint16_t*>(w) + q * gemm_chunk_codes);
                q = q1;
            }
        }
        // The next window's lines (strip by strip: strip ps, byte pb) still to prefetch, and how
        // many before each block.
        const int64_t next_w0 = w0 + wc;
        const int64_t next_bytes = t.b.rows != nullptr ? 0 : std::max<int64_t>(0, std::min(wchunks, total_chunks - next_w0)) * gemm_chunk_codes;
        const int64_t per_block = (ns * next_bytes / 64 + blocks_per_window - 1) / blocks_per_window;
        int64_t ps = 0, pb = 0;
        const auto prefetch_share = [&] {
            for (int64_t n = 0; n < per_block && ps < ns; ++n) {
                FP8KIT_PREFETCH_L2(t.b.strip(s0 + ps) + next_w0 * gemm_chunk_codes + pb);
                if ((pb += 64) >= next_bytes) pb = 0, ++ps;
            }
        };
        for (int64_t i = 0; i < rows; i += block_rows) {
            const int block_m = int(std::min(block_rows, rows - i));
            const uint16_t* a = t.a_row(r0 + i) + w0 * gemm_chunk;
            // Where block() takes one K group a call, one group at a time across the strips, so that
            // consecutive blocks read the same rows of A (the AVX2 kernel widens them once for all
            // strips).
            const int64_t step = whole_window ? wc : cpg;
            for (int64_t q = 0; q < wc; q += step) {
                const int64_t g = (w0 + q) / cpg;
                for (int64_t s = 0; s < ns; s += 2) {
                    const int nj = ns - s > 1 ? 2 : 1;
                    float* c = acc_out + (one_window ? 0 : i) * ldacc + s * gemm_tile;
                    const std::byte* b = bexp.get() + (s * b_strip + q * gemm_chunk_codes) * eb;
                    prefetch_share();
                    if (one_group) {
                        t.kern.block(block_m, nj, a, t.lda, b, b_strip, wc, c, ldacc, w0 > 0, nullptr);
                        continue;
                    }
                    const Promotion promotion{t.sa + (r0 + i) * kl.groups + g, kl.groups, t.b.sb(s0 + s, g), t.b.sb_strip(),
                                              g == 0, step / cpg};
                    t.kern.block(block_m, nj, a + q * gemm_chunk, t.lda, b, b_strip, step, c, ldacc, false, &promotion);
                }
            }
            if (next_w0 >= total_chunks) finish_rows(t, r0 + i, block_m, s0, s1, acc_out + (one_window ? 0 : i) * ldacc, ldacc);
        }
    }
    t.kern.end();
}

void run_task(const Task& t, int64_t r0, int64_t r1, int64_t s0, int64_t s1) {
    const int64_t ns = s1 - s0, rows = r1 - r0, ldacc = ns * gemm_tile;
    const int64_t m_rows = std::min(rows, t.packed_m - r0);  // packed rows of A here (the rest is padding)
    if (t.small) {
        Scratch<float> acc(rows * ldacc);
        t.kern.small(m_rows, t.apk + r0 * t.lda, t.lda, t.b, s0, s1, t.sa + r0 * t.b.kl.groups, t.table, t.fold, acc.get(),
                     ldacc);
        finish_rows(t, r0, m_rows, s0, s1, acc.get(), ldacc);
        return;
    }
    // run_tiles' sums: one block of rows where K is one window (run_tiles says why), else all rows.
    const int64_t block_rows = t.kern.block_tiles * gemm_tile;
    Scratch<float> acc((one_window(t.b.kl, t.kern, t.fold) ? std::min(rows, block_rows) : rows) * ldacc);
    run_tiles(t, r0, m_rows, s0, s1, acc.get(), ldacc);
}

}  // namespace

// Exact, NaN and Inf kept: every FP8 value is a bf16, and so is every one times 2^-arith_unit_log2.
const ExpandTable& expand_table(Format f, bool arith) {
    struct Tables {
        ExpandTable t[2][4];
        Tables() {
            for (int a = 0; a < 2; ++a) {
                for (int f = 0; f < 4; ++f) {
                    ExpandTable& e = t[a][f];
                    e.format = Format(f);
                    e.unit_log2 = a == 1 ? arith_unit_log2(Format(f)) : 0;
                    for (int c = 0; c < 256; ++c) {
                        const uint16_t bits = bf16(std::ldexp(decode(uint8_t(c), Format(f)), -e.unit_log2)).bits;
                        e.bf16[c] = bits;
                        e.lo[c] = uint8_t(bits);
                        e.hi[c] = uint8_t(bits >> 8);
                    }
                }
            }
        }
    };
    static const Tables tables;
    return tables.t[arith ? 1 : 0][int(f)];
}

#if !defined(FP8KIT_AMX_KERNELS)
const GemmKernels* amx_gemm_kernels() { return nullptr; }
#endif
#if !defined(FP8KIT_AVX512_KERNELS)
const GemmKernels* avx512_gemm_kernels() { return nullptr; }
#endif
#if !defined(FP8KIT_X86_KERNELS)
const GemmKernels* avx2_gemm_kernels() { return nullptr; }
#endif

const GemmKernels& gemm_kernels() {
    const Isa isa = active_isa();
    const GemmKernels* amx = isa == Isa::avx512 ? amx_gemm_kernels() : nullptr;
    const GemmKernels* bf16 = isa == Isa::avx512 ? avx512_gemm_kernels() : nullptr;
    const GemmKernels* avx2 = isa != Isa::portable ? avx2_gemm_kernels() : nullptr;
    return amx != nullptr ? *amx : bf16 != nullptr ? *bf16 : avx2 != nullptr ? *avx2 : portable_kernels;
}

}  // namespace fp8kit::cpu

std::string_view fp8kit::gemm_kernels_name() { return cpu::gemm_kernels().name; }

namespace fp8kit::cpu {

std::shared_ptr<const void> pack_weight(const ExecContext&, const GemmOperand& b, int64_t kgroup, bool lasting,
                                        size_t* bytes) {
    auto p = std::make_shared<PackedB>(PackedB{b.rows, (b.rows + gemm_tile - 1) / gemm_tile, KLayout(b.k, kgroup),
                                               b.format, {}, {}, {}, {}, false});
    PackedB& pb = *p;
    const KLayout& kl = pb.kl;
    pb.scales.assign(size_t(pb.strips * kl.groups * gemm_tile), 0.0f);
    // Strip by strip, on every thread: an mx32 B of 2048 x 2048 has 131072 scales, and a call's
    // pack of a QTensor B gathers them each time; each K group's entry in B's scale rows found once.
    std::vector<int64_t> group_col(size_t(kl.groups));
    for (int64_t g = 0; g < kl.groups; ++g) group_col[size_t(g)] = g * kl.group / b.group.cols;
    std::atomic<bool> fold{true};  // over B's columns (padding columns' scales are 0)
    parallel_tasks(pb.strips, size_t(b.rows * kl.groups), [&](int64_t s, int) {
        bool folds = true;
        for (int64_t j = s * gemm_tile; j < std::min(b.rows, (s + 1) * gemm_tile); ++j) {
            const int64_t row_at = j / b.group.rows * b.scale_cols;
            for (int64_t g = 0; g < kl.groups; ++g) {
                float& sb = pb.sb(s, g)[j % gemm_tile];
                sb = b.scale_at(row_at + group_col[size_t(g)]);
                int e = 0;
                folds = folds && fold_log2(sb, e);
            }
        }
        if (!folds) fold.store(false, std::memory_order_relaxed);
    });
    pb.scales_fold = fold.load();
    const int64_t chunks = kl.padded / gemm_chunk;
    const size_t flags = size_t(pb.strips) + size_t(pb.strips * chunks);
    if (!lasting) {  // left where it is, for the call's gemm() (PackedB::rows)
        pb.rows = b.data, pb.ld = b.ld;
        pb.strip_nonfinite.assign(size_t(pb.strips), 1);
        pb.chunk_specials.assign(size_t(pb.strips * chunks), 0xff);
        *bytes = pb.scales.size() * sizeof(float) + flags;
        return p;
    }
    *bytes = pb.code_bytes() + pb.scales.size() * sizeof(float) + flags;
    pb.codes = detail::host_allocate_lasting(pb.code_bytes());  // uninitialised: pack_strip writes every byte
    pb.strip_nonfinite.assign(size_t(pb.strips), 0);
    pb.chunk_specials.assign(size_t(pb.strips * chunks), 0);
    const GemmKernels& kern = gemm_kernels();
    parallel_tasks(pb.strips, size_t(b.rows * b.k), [&](int64_t s, int) { pack_strip(pb, b.data, b.ld, kern, s); });
    return p;
}

// pack_weight's copy loop run backwards: row j = 16 s + c of B from strip s, each K pair of group g
// from byte 32 (kp / 2) + 2 c of the strip's group (padding is skipped).
bool unpack_weight(const void* packed, uint8_t* out, int64_t ld) {
    const PackedB& pb = *static_cast<const PackedB*>(packed);
    const KLayout& kl = pb.kl;
    parallel_tasks(pb.strips, size_t(pb.n * kl.k), [&](int64_t s, int) {
        const uint8_t* strip = pb.strip(s);
        const int64_t cols = std::min(gemm_tile, pb.n - s * gemm_tile);
        for (int64_t c = 0; c < cols; ++c) {
            uint8_t* row = out + (s * gemm_tile + c) * ld;
            for (int64_t g = 0; g < kl.groups; ++g) {
                const uint8_t* src = strip + g * kl.group_padded * gemm_tile + 2 * c;
                const int64_t len = kl.len(g), k0 = g * kl.group;
                for (int64_t e = 0; e < len; ++e) row[k0 + e] = src[(e / 2) * 2 * gemm_tile + e % 2];
            }
        }
    });
    return true;
}

void gemm(GemmJob& job) {
    const PackedB& b = *static_cast<const PackedB*>(job.b_packed);
    const KLayout& kl = b.kl;
    const GemmKernels& kern = gemm_kernels();
    const int64_t terms = a_terms(job), mp = round_up(job.m * terms, gemm_tile);
    // A weight-only bf16 A is read where it is, not packed, where it is already in the packed
    // layout (one K group of whole chunks, rows every x.ld) with no element to change
    // (bf16_rows_pack_as_they_are), and the tiles take it (not the small-M kernels): packing it
    // wrote and read it once more (a 4160 x 2560 A: a quarter of the GEMM). The kernels read whole
    // tiles, so the last block of rows, where it is partial, is packed into tail.
    const int64_t block_rows = kern.block_tiles * gemm_tile;
    const size_t work = size_t(job.m * terms) * size_t(job.n) * size_t(std::max<int64_t>(job.k, 1));
    const int threads = threads_for(work);
    const bool large_b = b.rows == nullptr && int64_t(b.code_bytes()) >= kern.large_b_bytes &&
                         b.strips >= 2 * threads * kern.panel_strips;
    const bool small = kern.small != nullptr && job.m * terms <= (large_b ? kern.small_m_max_large_b : kern.small_m_max);
    const bool in_place = !small && job.a_hp.data != nullptr && job.a_hp.dtype == DType::bf16 && kl.groups == 1 &&
                          kl.padded == job.k && bf16_rows_pack_as_they_are(job.a_hp, job.m, job.k);
    // Row stride of packed A: a multiple of 64 bytes, but not of 512, so that the 16 rows of a
    // tile do not all fall into the same L1 set.
    const int64_t lda = in_place ? job.a_hp.ld : kl.padded % 256 == 0 ? kl.padded + gemm_chunk : kl.padded;
    const int64_t tail_row = in_place ? job.m / block_rows * block_rows : mp;
    const int64_t tail_elems = mp > tail_row ? block_rows * lda : 0;  // in place: the tail's
    Scratch<uint16_t> apk(in_place ? tail_elems : mp * lda);
    // Scales for every packed row: the AMX and AVX-512 tiles promote whole 16-row tiles, padding
    // rows included (their codes are zero, so are their scales).
    Scratch<float> sa(mp * kl.groups);
    std::fill(sa.get(), sa.get() + mp * kl.groups, 0.0f);
    // Folding (see the top of this file) where the kernel set folds at this M, K has groups, and B's
    // scales fold; A's are checked as it is packed, and where one does not fold A is packed again.
    bool fold = kern.fold != nullptr && job.m >= kern.fold_min_m && kl.groups > 1 && b.scales_fold && terms == 1 &&
                job.a_hp.data == nullptr;
    if (in_place) {
        const auto* x = static_cast<const uint16_t*>(job.a_hp.data);
        std::memset(apk.get(), 0, size_t(tail_elems) * sizeof(uint16_t));
        for (int64_t i = tail_row; i < job.m; ++i) std::memcpy(apk.get() + (i - tail_row) * lda, x + i * lda, size_t(job.k) * 2);
        a_scales(job.a, kl, 0, job.m, 1, sa.get());
    } else if (!pack_a(job, kl, kern, terms, apk.get(), lda, sa.get(), fold)) {
        fold = false;
        pack_a(job, kl, kern, terms, apk.get(), lda, sa.get(), false);
    }
    const int64_t unit_sb = kl.groups > 1 ? b.strips * gemm_tile : 0;  // Task::sb's 1s (folding needs groups)
    Scratch<float> ones(unit_sb);
    std::fill(ones.get(), ones.get() + unit_sb, 1.0f);
    const uint16_t* a_rows = in_place ? static_cast<const uint16_t*>(job.a_hp.data) : apk.get();
    // The small kernel's own layout of packed A, made once for all tasks (GemmKernels::small_pack).
    const bool small_packs = small && kern.small_pack != nullptr && job.m * terms >= 2;
    Scratch<uint16_t> a_small(small_packs ? mp * kl.padded : 0);
    if (small_packs) kern.small_pack(job.m * terms, apk.get(), lda, kl.padded, a_small.get());

    // Tasks: row ranges x panels of strips, row-major, so that a thread's tasks (scheduled
    // statically, in order) keep to the fewest rows. Rows are split into one band per thread where
    // B is small (GemmKernels::row_band_max_b says why; a band takes all strips as one panel where
    // their window fits as well), else only when panels alone leave threads idle; never on the
    // small-M kernel, which may pick its way of summing by the rows it is given (AMX: one row
    // apart), so that D does not depend on the split.
    const int64_t row_blocks = (mp + block_rows - 1) / block_rows;
    const bool bands = int64_t(b.code_bytes()) <= kern.row_band_max_b;
    const int64_t strip_window = window_chunks(kl, kern, fold) * gemm_chunk_codes * kern.widened_bytes;  // bytes
    const int64_t window_strips = kern.panel_window_bytes / strip_window;
    const int64_t panel_strips = bands && !small && b.strips * strip_window <= kern.row_band_max_b
                                     ? b.strips
                                     : std::max(kern.panel_strips, std::min(window_strips, b.strips));
    const int64_t panels = (b.strips + panel_strips - 1) / panel_strips;
    const int64_t row_splits = small   ? 1
                               : bands ? std::min<int64_t>(row_blocks, threads)
                                       : std::min<int64_t>(row_blocks, panels >= 2 * threads ? 1 : (2 * threads + panels - 1) / panels);
    const int64_t rows_per_split = (row_blocks + row_splits - 1) / row_splits * block_rows;
    // The bias as float32 for finish_rows' scale_store (the generic epilogue converts each element
    // as it adds it: the same sum, element by element, and 20-30% of a bf16 Linear at M = 4096).
    const bool convert_bias = job.bias != nullptr && job.bias_dtype != DType::f32;
    Scratch<float> bias32(convert_bias ? job.n : 0);
    if (convert_bias) {
        std::fill(bias32.get(), bias32.get() + job.n, 0.0f);
        detail::add_scaled_row(bias32.get(), job.bias, job.bias_dtype, 0, 1.0f, job.n);
    }
    const float* bias = convert_bias ? bias32.get() : static_cast<const float*>(job.bias);
    // B left as its rows (PackedB::rows): run_tiles widens its windows straight from them where the
    // set can (K groups of whole chunks; folded, it then folds them), and so does the small kernel
    // up to small_rows_max_m rows, unfolded, with no pass of their own over B and no copy; the other
    // small-M kernels, and theirs folded, read packed strips, packed here first. A QTensor B, 2
    // threads, the two ways switched in one process (2026-12-02, Sapphire Rapids), ms: 512 x 2048
    // x 2048 1.93-2.01 packed first, 1.83-1.84 from the rows; 2048 x 4096 x 4096 28.8-29.3 and
    // 27.8-28.4; 2048 x 2048 x 512 (two row bands, each widening all of B) 1.79-1.91 and 1.83.
    const bool from_rows = b.rows != nullptr && kern.widen_rows != nullptr &&
                           (!small || (!fold && job.m * terms <= kern.small_rows_max_m)) &&
                           (kl.groups == 1 || kl.group % gemm_chunk == 0);
    std::optional<PackedB> packed;
    if (b.rows != nullptr && !from_rows) packed.emplace(packed_strips(b, kern));
    const PackedB& bt = packed ? *packed : b;
    const Task task{job,   bt,   kern,  small_packs ? a_small.get() : a_rows, small_packs ? kl.padded : lda, apk.get(), tail_row, sa.get(), unit_sb > 0 ? ones.get() : bt.scales.data(),
                    expand_table(b.format), terms, job.m * terms, bias, small, fold};
    parallel_tasks(panels * row_splits, work, [&](int64_t t, int) {
        const int64_t r = t / panels, p = t % panels;
        const int64_t r0 = r * rows_per_split, r1 = std::min(mp, r0 + rows_per_split);
        if (r0 >= r1) return;
        run_task(task, r0, r1, p * panel_strips, std::min(b.strips, (p + 1) * panel_strips));
    });
}

}  // namespace fp8kit::cpu
