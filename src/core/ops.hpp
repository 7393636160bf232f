// src/core/ops.hpp: the interface every backend implements (ref, cpu, later cuda), and the jobs
// the public operations hand to it after checking their arguments (src/core/quantize.cpp).
//
// A backend sees validated, resolved jobs: raw pointers, matrix views, group shapes and the
// ScaleRule - never options to interpret - so each backend implements only the arithmetic.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "fp8kit/backend.hpp"
#include "fp8kit/dtype.hpp"
#include "fp8kit/gemm.hpp"
#include "fp8kit/half.hpp"
#include "fp8kit/quantize.hpp"

namespace fp8kit::detail {

// A matrix of f32 / bf16 / f16 elements; element (i, j) is at data + (i * ld + j) * size.
struct MatrixRef {
    const void* data;
    DType dtype;
    int64_t rows, cols, ld;
};

// The [numel / last dim, last dim] matrix of a host f32/bf16/f16 tensor. A 2-d view with unit
// column stride (rows of a larger matrix, a column slice) is used in place; anything else is
// copied to contiguous memory first (`keep` holds the copy). `fn` names the caller in errors.
struct Matrix {
    Tensor keep;
    MatrixRef ref;
};
Matrix as_matrix(const Tensor& x, const char* fn);

// fp8kit::Error, prefixed by `where`, for options quantize cannot honour.
void check_quantize_options(const QuantizeOptions& o, const std::string& where);

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

// One FP8 GEMM operand: codes [rows, k] with row stride ld; element (i, kk) has the scale
// scale_inv[(i / group.rows) * scale_cols + kk / group.cols] (float, or e8m0 codes).
struct GemmOperand {
    const uint8_t* data;
    int64_t rows, k, ld;
    Format format;
    GroupShape group;
    const void* scale_inv;
    bool e8m0;
    int64_t scale_cols;

    float scale(int64_t i, int64_t kk) const noexcept {
        const int64_t at = (i / group.rows) * scale_cols + kk / group.cols;
        return e8m0 ? decode(static_cast<const uint8_t*>(scale_inv)[at], Format::e8m0fnu)
                    : static_cast<const float*>(scale_inv)[at];
    }
};

// gemm: out[m, n] (contiguous, out_dtype f32/bf16/f16) =
//   act(alpha * sum over K groups g of (sum_{k in g} a_ik b_jk) * sa(i, g) * sb(j, g)
//       + beta * c[i, j] + bias[j])
// K groups are kgroup wide (the last one may be cut); kgroup divides both operands' scale groups
// along K, so each operand has one scale per (row, K group).
// Fused cast: a.data is null and `fuse` quantizes A ([m, k], its codes never stored whole): the
// backend fills fuse->scale_inv (A's scales, the layout of a.scale_inv) and fuse->amax, exactly
// as quantize(fuse) would. a then describes A's scales only.
struct GemmJob {
    int64_t m, n, k, kgroup;
    GemmOperand a, b;
    QuantizeJob* fuse;         // null unless A is high precision
    const void* b_packed;      // the backend's pack_weight(b)
    float alpha, beta;
    MatrixRef c;               // c.data null when there is no C
    const void* bias;          // [n] of bias_dtype, or null
    DType bias_dtype;
    Activation activation;
    void* out;
    DType out_dtype;
};

// ---- layer ops (<fp8kit/ops.hpp>; src/core/layer_ops.cpp checks and builds these) ----
// Every pointer is to contiguous memory of `dtype` (f32 or f64) unless said otherwise; shapes
// as in <fp8kit/ops.hpp>. Backends compute, they never check.

// out[m, n] (+)= op(a)[m, k] . op(b)[k, n] (+ bias[n]); a stored [m, k] or [k, m] (ta),
// b stored [k, n] or [n, k] (tb). a, b: f32 or bf16 when dtype is f32.
struct MatmulJob {
    DType dtype;
    int64_t m, n, k;
    const void* a;
    DType a_dtype;
    bool ta;
    const void* b;
    DType b_dtype;
    bool tb;
    bool accumulate;
    const void* bias;  // [n] or null
    void* out;
};

// dbias[cols] += sum over rows of dout[rows, cols] (Linear's bias gradient).
struct BiasGradJob {
    DType dtype;
    int64_t rows, cols;
    const void* dout;
    void* dbias;
};

// layernorm / rmsnorm forward (mean, bias null for rmsnorm).
struct NormJob {
    DType dtype;
    int64_t rows, c;
    double eps;
    const void *inp, *weight, *bias;
    void *out, *mean, *rstd;
};

// layernorm / rmsnorm backward (mean, dbias null for rmsnorm).
struct NormBackwardJob {
    DType dtype;
    int64_t rows, c;
    const void *dout, *inp, *weight, *mean, *rstd;
    void *dinp, *dweight, *dbias;
};

// gelu forward (out = gelu(inp); dout null) and backward (out = gelu'(inp) * dout).
struct GeluJob {
    DType dtype;
    int64_t n;
    const void *inp, *dout;
    void* out;
};

// attention forward (out, att written; dout, dqkv null) and backward (dqkv written from dout,
// qkv, att). hs = c / nh.
struct AttentionJob {
    DType dtype;
    int64_t b, t, c, nh;
    const void* qkv;
    void *out, *att;
    const void* dout;
    void* dqkv;
};

struct CrossEntropyJob {
    DType dtype;
    int64_t rows, v;
    const int32_t* targets;  // [rows], each in [0, v)
    const void* logits;      // forward
    void *losses, *probs;    // forward: written; backward: probs read
    void* dlogits;           // backward
    double dloss;            // backward
};

struct EmbeddingJob {
    DType dtype;
    int64_t rows, c;
    const int32_t* ids;  // [rows], each a row of the table
    const void* table;   // forward
    void* out;           // forward
    const void* dout;    // backward
    void* dtable;        // backward
};

// One AdamW update of n elements; c1 = 1 - beta1^step, c2 = 1 - beta2^step (float32, computed
// once by the caller so every backend uses the same ones).
struct AdamWJob {
    DType dtype;
    int64_t n;
    void *param, *m, *v;
    const void* grad;
    float lr, beta1, beta2, eps, weight_decay, c1, c2;
};

// Calls fn(T{}) with T = double for f64 jobs, float otherwise: each backend writes its layer ops
// once, as templates.
template <class Fn>
void with_float_type(DType dtype, Fn&& fn) {
    if (dtype == DType::f64) {
        fn(double{});
    } else {
        fn(float{});
    }
}

struct BackendOps {
    float (*amax)(const MatrixRef& x);
    // Per-group max |x| into out [ceil(rows/group.rows), ceil(cols/group.cols)], row-major.
    void (*group_amax)(const MatrixRef& x, GroupShape group, float* out);
    void (*quantize)(QuantizeJob& job);
    void (*dequantize)(const DequantizeJob& job);
    // B in the backend's layout for gemm (null when it reads the operand as is); *bytes = size.
    std::shared_ptr<const void> (*pack_weight)(const GemmOperand& b, int64_t kgroup, size_t* bytes);
    void (*gemm)(GemmJob& job);
    // Layer ops (<fp8kit/ops.hpp>).
    void (*matmul)(const MatmulJob& job);
    void (*bias_grad)(const BiasGradJob& job);
    void (*layernorm_forward)(const NormJob& job);
    void (*layernorm_backward)(const NormBackwardJob& job);
    void (*rmsnorm_forward)(const NormJob& job);
    void (*rmsnorm_backward)(const NormBackwardJob& job);
    void (*gelu_forward)(const GeluJob& job);
    void (*gelu_backward)(const GeluJob& job);
    void (*attention_forward)(const AttentionJob& job);
    void (*attention_backward)(const AttentionJob& job);
    void (*crossentropy_forward)(const CrossEntropyJob& job);
    void (*crossentropy_backward)(const CrossEntropyJob& job);
    void (*embedding_forward)(const EmbeddingJob& job);
    void (*embedding_backward)(const EmbeddingJob& job);
    void (*adamw_update)(const AdamWJob& job);
};

const BackendOps& backend_ops(Backend b);  // fp8kit::Error if not available

// The amax NaN every backend reports, so that amaxes compare bit for bit.
inline constexpr uint32_t canonical_nan_bits = 0x7fc00000u;

}  // namespace fp8kit::detail

namespace fp8kit::detail {

// The GEMM epilogue, shared by the backends (ref in double, cpu in float).
template <class T>
T gelu(T x) noexcept {
    // GPT-2's tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
    const T k = T(0.7978845608028654);
    return T(0.5) * x * (T(1) + std::tanh(k * (x + T(0.044715) * x * x * x)));
}

inline float load_float(const void* p, DType t, int64_t at) noexcept {
    switch (t) {
        case DType::bf16: return float(static_cast<const bf16*>(p)[at]);
        case DType::f16: return float(static_cast<const f16*>(p)[at]);
        default: return static_cast<const float*>(p)[at];
    }
}

// Row i, columns [j0, j0 + cols), in place: v = alpha * (scaled product) on entry.
template <class T>
void gemm_epilogue(const GemmJob& j, int64_t i, int64_t j0, T* v, int64_t cols) noexcept {
    if (j.c.data != nullptr) {
        for (int64_t n = 0; n < cols; ++n) v[n] += T(j.beta) * T(load_float(j.c.data, j.c.dtype, i * j.c.ld + j0 + n));
    }
    if (j.bias != nullptr) {
        for (int64_t n = 0; n < cols; ++n) v[n] += T(load_float(j.bias, j.bias_dtype, j0 + n));
    }
    if (j.activation == Activation::gelu) {
        for (int64_t n = 0; n < cols; ++n) v[n] = gelu(v[n]);
    }
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

}  // namespace fp8kit::detail

// Each backend's implementation of the op families: quantize, gemm, and the layer ops
// (src/<backend>/<family>.cpp: matmul, layernorm, gelu, attention, crossentropy, embedding, adamw).
#define FP8KIT_DECLARE_QUANTIZE_OPS(ns)                                                       \
    namespace fp8kit::ns {                                                                    \
    float amax(const detail::MatrixRef& x);                                                   \
    void group_amax(const detail::MatrixRef& x, GroupShape group, float* out);                \
    void quantize(detail::QuantizeJob& job);                                                  \
    void dequantize(const detail::DequantizeJob& job);                                        \
    std::shared_ptr<const void> pack_weight(const detail::GemmOperand& b, int64_t kgroup,     \
                                            size_t* bytes);                                   \
    void gemm(detail::GemmJob& job);                                                          \
    void matmul(const detail::MatmulJob& job);                                                \
    void bias_grad(const detail::BiasGradJob& job);                                           \
    void layernorm_forward(const detail::NormJob& job);                                       \
    void layernorm_backward(const detail::NormBackwardJob& job);                              \
    void rmsnorm_forward(const detail::NormJob& job);                                         \
    void rmsnorm_backward(const detail::NormBackwardJob& job);                                \
    void gelu_forward(const detail::GeluJob& job);                                            \
    void gelu_backward(const detail::GeluJob& job);                                           \
    void attention_forward(const detail::AttentionJob& job);                                  \
    void attention_backward(const detail::AttentionJob& job);                                 \
    void crossentropy_forward(const detail::CrossEntropyJob& job);                            \
    void crossentropy_backward(const detail::CrossEntropyJob& job);                           \
    void embedding_forward(const detail::EmbeddingJob& job);                                  \
    void embedding_backward(const detail::EmbeddingJob& job);                                 \
    void adamw_update(const detail::AdamWJob& job);                                           \
    }
FP8KIT_DECLARE_QUANTIZE_OPS(ref)
FP8KIT_DECLARE_QUANTIZE_OPS(cpu)
#undef FP8KIT_DECLARE_QUANTIZE_OPS
