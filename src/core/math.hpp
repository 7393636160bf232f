// src/core/math.hpp: the arithmetic the backends share, written once for the host and (where
// FP8KIT_HD) the device: a group's scale from its amax, a weight-only GEMM's two bf16 terms of A,
// GELU and its derivative, an AdamW element, the GEMM epilogue and store of the host backends, and
// the non-finite policy's encoding of infinities. The backend interface it works on (the jobs) is
// core/ops.hpp.
// Checked through the backends that use it: tests/ops (every backend against ref), tests/unit
// (test_gemm, test_quantize).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "core/ops.hpp"
#include "fp8kit/format.hpp"
#include "fp8kit/half.hpp"
#include "fp8kit/scaling.hpp"

namespace fp8kit::detail {

struct GroupScale {
    float scale;      // what x is multiplied by before encoding
    float scale_inv;  // what is stored (f32 scales)
    uint8_t e8m0;     // what is stored (mx32)
};
// For a host backend (dereferences fixed_scale).
FP8KIT_HD constexpr GroupScale group_scale(float amax, const ScaleRule& r) noexcept {
    if (r.mx) {
        const uint8_t code = mx_scale_code(amax, r.format, r.mx_rounding);
        return {mx_quantize_multiplier(code), decode(code, Format::e8m0fnu), code};
    }
    const float scale = r.fixed_scale != nullptr ? *r.fixed_scale
                                                 : compute_scale(amax, r.fp8_max, r.amax_epsilon, r.power_of_two);
    return {scale, 1.0f / scale, 0};
}

// A weight-only GEMM's A element as the kernels take it: two bf16 terms, hi + lo, each of which the
// bf16 kernels multiply exactly by an FP8 value. hi is the bf16 nearest to x (ties to even; a NaN
// quiet, Inf kept); lo the bf16 nearest to x - hi (exact in float32: hi is within half a bf16 ulp
// of x), zero where hi is NaN or Inf. Why two: one bf16 keeps 8 of a float32's 24 significant bits
// (a rounding of <= 2^-9 relative, 0.01 dB of a Linear's SQNR against float32 activations, which
// torchao's weight-only keeps); hi + lo keeps 16, and x - hi - lo is <= 2^-17 |x|. A bf16 x is hi
// alone, and an f16 one (11 bits) is hi + lo exactly. Each term is a zero of its sign when below
// 2^-102 in magnitude. Why the flush: a bf16 of at least 2^-102 is a multiple of 2^-109 and an FP8
// value of 2^-17 (e5m2fnuz's quantum, the finest), so every product of the two, and every float32
// sum of such products, is a multiple of 2^-126: none is a float32 subnormal, which VDPBF16PS and
// TDPBF16PS flush to zero (the ref backend takes the same values, so all backends multiply the same
// A). Selects, not branches: the packing loops vectorize.
inline uint16_t weight_only_hi(float x) {
    const uint32_t u = std::bit_cast<uint32_t>(x), mag = u & 0x7fffffffu;
    const auto nan = uint16_t((u >> 16) | 0x40u), zero = uint16_t((u >> 16) & 0x8000u);
    const auto nearest = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return mag > 0x7f800000u ? nan : mag < 0x0c800000u ? zero : nearest;  // 0x0c800000: 2^-102
}
// weight_only_hi of a bf16 x, on its bits b: x itself (its nearest bf16), a NaN quiet, below 2^-102
// a zero of its sign - by the magnitude's bits, above bf16_inf_bits a NaN, below bf16_flush_bits
// flushed. On 16-bit lanes, so that the packing loop of a bf16 A vectorizes 8-32 elements a vector
// (through float32, 4: the loop took 43% of a 4160 x 2560 x 512 GEMM).
inline constexpr uint16_t bf16_inf_bits = 0x7f80, bf16_flush_bits = 0x0c80;  // 0x0c80: 2^-102
inline uint16_t weight_only_hi_bf16(uint16_t b) {
    const auto mag = uint16_t(b & 0x7fffu);
    return mag > bf16_inf_bits ? uint16_t(b | 0x40u) : mag < bf16_flush_bits ? uint16_t(b & 0x8000u) : b;
}
inline uint16_t weight_only_lo(float x, uint16_t hi) {
    const float rest = x - std::bit_cast<float>(uint32_t(hi) << 16);
    return (hi & 0x7f80u) == 0x7f80u ? uint16_t(0) : weight_only_hi(rest);
}

// GELU, GPT-2's tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), and its
// derivative 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), t the tanh: in T, on
// the host and the device alike (the cpu and cuda GELU ops, every backend's GEMM epilogue; the ref
// ops use these formulas in double). tanh is std::tanh on the host, CUDA's on the device.
template <class T>
FP8KIT_HD T gelu(T x) noexcept {
    using std::tanh;
    const T k = T(0.7978845608028654);
    return T(0.5) * x * (T(1) + tanh(k * (x + T(0.044715) * x * x * x)));
}
template <class T>
FP8KIT_HD T gelu_grad(T x) noexcept {
    using std::tanh;
    const T k = T(0.7978845608028654);
    const T th = tanh(k * (x + T(0.044715) * x * x * x));
    return T(0.5) * (T(1) + th) + T(0.5) * x * (T(1) - th * th) * k * (T(1) + T(3 * 0.044715) * x * x);
}

// Element i of an AdamW update, in T, in <fp8kit/ops.hpp>'s order: the cpu and cuda backends'
// arithmetic.
template <class T>
FP8KIT_HD void adamw_at(const AdamWJob& j, int64_t i) noexcept {
    using std::sqrt;
    const T lr = T(j.lr), b1 = T(j.beta1), b2 = T(j.beta2), eps = T(j.eps), wd = T(j.weight_decay);
    const T g = static_cast<const T*>(j.grad)[i];
    T& w = static_cast<T*>(j.param)[i];
    T& m = static_cast<T*>(j.m)[i];
    T& v = static_cast<T*>(j.v)[i];
    m = b1 * m + (T(1) - b1) * g;
    v = b2 * v + (T(1) - b2) * g * g;
    w -= lr * wd * w;
    w -= lr * (m / T(j.c1)) / (sqrt(v / T(j.c2)) + eps);
}

inline float load_float(const void* p, DType t, int64_t at) noexcept {
    switch (t) {
        case DType::bf16: return float(static_cast<const bf16*>(p)[at]);
        case DType::f16: return float(static_cast<const f16*>(p)[at]);
        default: return static_cast<const float*>(p)[at];
    }
}

// v[n] += w * T(x[n]) for n < cols.
template <class T, class E>
void add_scaled_row(T* v, const E* x, T w, int64_t cols) noexcept {
    for (int64_t n = 0; n < cols; ++n) v[n] += w * T(float(x[n]));
}

// The same for a row of a tensor of dtype t from element `at`: the type chosen once per row, not
// per element as load_float would (per element, a bias cost 5% of a 2048 x 4096 x 4096 GEMM).
template <class T>
void add_scaled_row(T* v, const void* x, DType t, int64_t at, T w, int64_t cols) noexcept {
    switch (t) {
        case DType::bf16: return add_scaled_row(v, static_cast<const bf16*>(x) + at, w, cols);
        case DType::f16: return add_scaled_row(v, static_cast<const f16*>(x) + at, w, cols);
        default: return add_scaled_row(v, static_cast<const float*>(x) + at, w, cols);
    }
}

// GELU of a row segment in place, element by element (detail::gelu).
template <class T>
void gelu_row(T* v, int64_t cols) noexcept {
    for (int64_t n = 0; n < cols; ++n) v[n] = gelu(v[n]);
}

// Row i, columns [j0, j0 + cols), in place: v = alpha * (scaled product) on entry. (The bias is
// added as 1 * bias: exact, the same sum.) GELU by gelu_row_of: detail::gelu's, or the cpu
// backend's kernel set's (GemmKernels::gelu_row: src/cpu/gemm_kernels.hpp, gelu_epilogue).
template <class T>
void gemm_epilogue(const GemmJob& j, int64_t i, int64_t j0, T* v, int64_t cols,
                   void (*gelu_row_of)(T*, int64_t) noexcept = &gelu_row<T>) noexcept {
    if (j.c.data != nullptr) add_scaled_row(v, j.c.data, j.c.dtype, i * j.c.ld + j0, T(j.beta), cols);
    if (j.bias != nullptr) add_scaled_row(v, j.bias, j.bias_dtype, j0, T(1), cols);
    if (j.activation == Activation::gelu) gelu_row_of(v, cols);
}

// out[i, j0 + n] = v[n], rounded once (through float32 when T is double).
template <class T>
void gemm_store(const GemmJob& j, int64_t i, int64_t j0, const T* v, int64_t cols) noexcept {
    const int64_t at = i * j.n + j0;
    switch (j.out_dtype) {
        case DType::bf16:
            for (int64_t n = 0; n < cols; ++n) static_cast<bf16*>(j.out)[at + n] = bf16(float(v[n]));
            break;
        case DType::f16:
            for (int64_t n = 0; n < cols; ++n) static_cast<f16*>(j.out)[at + n] = f16(float(v[n]));
            break;
        default:
            for (int64_t n = 0; n < cols; ++n) static_cast<float*>(j.out)[at + n] = float(v[n]);
    }
}

// The non-finite policy for +-Inf inputs (docs/NUMERICS.md): an Inf is never clamped to a finite
// code, whatever the overflow mode - it gets the code a nonsaturating encode gives (Inf for e5m2,
// NaN for the others). For a host backend whose fast kernels clamp while they cast: it runs this
// after the cast when the input's amax is not finite (a rare, cold path). (mx32 too: the block's
// NaN scale makes it decode to NaN anyway, but the codes stay those of ref.)
inline void encode_infinities(const QuantizeJob& job) {
    for (int64_t i = 0; i < job.x.rows; ++i) {
        for (int64_t j = 0; j < job.x.cols; ++j) {
            const float v = load_float(job.x.data, job.x.dtype, i * job.x.ld + j);
            if (!std::isinf(v)) continue;
            const uint8_t code = encode(v, job.rule.format, Overflow::nonsaturating);
            job.data[i * job.x.cols + j] = code;
            if (job.data_t != nullptr) job.data_t[j * job.x.rows + i] = code;
        }
    }
}

}  // namespace fp8kit::detail
