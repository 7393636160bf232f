// src/core/ops.hpp: the interface every backend implements (ref, cpu, later cuda), and the jobs
// the public operations hand to it after checking their arguments (src/core/quantize.cpp).
//
// A backend sees validated, resolved jobs: raw pointers, matrix views, group shapes and the
// ScaleRule - never options to interpret - so each backend implements only the arithmetic.
#pragma once

#include <cstdint>

#include "fp8kit/backend.hpp"
#include "fp8kit/dtype.hpp"
#include "fp8kit/quantize.hpp"

namespace fp8kit::detail {

// A matrix of f32 / bf16 / f16 elements; element (i, j) is at data + (i * ld + j) * size.
struct MatrixRef {
    const void* data;
    DType dtype;
    int64_t rows, cols, ld;
};

// quantize / cast_transpose. Outputs are contiguous and preallocated:
//   data      [rows, cols] codes          scale_inv   [ceil(rows/group.rows), ceil(cols/group.cols)]
//   data_t    [cols, rows] codes          scale_inv_t [ceil(cols/group_t.rows), ceil(rows/group_t.cols)]
// (data_t/scale_inv_t null unless the transposed copy is asked for; group_t is the group of the
// same Scaling on the [cols, rows] transpose). Scales are float, or e8m0 codes when rule.mx.
// The backend returns the max |x| of the whole input in amax (NaN if any element is NaN).
struct QuantizeJob {
    MatrixRef x;
    ScaleRule rule;
    Overflow overflow;
    GroupShape group, group_t;
    uint8_t* data;
    void* scale_inv;
    uint8_t* data_t;
    void* scale_inv_t;
    float amax;
};

// dequantize: out[i, j] = decode(data[i, j]) * scale_inv[i / group.rows, j / group.cols].
struct DequantizeJob {
    const uint8_t* data;
    Format format;
    int64_t rows, cols;
    GroupShape group;
    const void* scale_inv;  // float, or e8m0 codes when e8m0
    bool e8m0;
    void* out;
    DType out_dtype;        // f32, bf16, f16
};

struct BackendOps {
    float (*amax)(const MatrixRef& x);
    // Per-group max |x| into out [ceil(rows/group.rows), ceil(cols/group.cols)], row-major.
    void (*group_amax)(const MatrixRef& x, GroupShape group, float* out);
    void (*quantize)(QuantizeJob& job);
    void (*dequantize)(const DequantizeJob& job);
};

const BackendOps& backend_ops(Backend b);  // fp8kit::Error if not available

// The amax NaN every backend reports, so that amaxes compare bit for bit.
inline constexpr uint32_t canonical_nan_bits = 0x7fc00000u;

}  // namespace fp8kit::detail

// Each backend's implementation of the quantize family (src/<backend>/quantize.cpp).
#define FP8KIT_DECLARE_QUANTIZE_OPS(ns)                                                       \
    namespace fp8kit::ns {                                                                    \
    float amax(const detail::MatrixRef& x);                                                   \
    void group_amax(const detail::MatrixRef& x, GroupShape group, float* out);                \
    void quantize(detail::QuantizeJob& job);                                                  \
    void dequantize(const detail::DequantizeJob& job);                                        \
    }
FP8KIT_DECLARE_QUANTIZE_OPS(ref)
FP8KIT_DECLARE_QUANTIZE_OPS(cpu)
#undef FP8KIT_DECLARE_QUANTIZE_OPS
