// src/core/ops.hpp: the interface every backend implements (ref, cpu, cuda) - its op table, and a
// device backend's memory beside it - and the jobs the public operations hand to it after checking
// their arguments (src/core/quantize.cpp).
//
// A backend sees validated, resolved jobs: raw pointers (into memory of the job's device), matrix
// views, group shapes and the ScaleRule - never options to interpret - so each backend implements
// only the arithmetic. Every job carries the ExecContext it runs in; amax and scales are written
// to and read from device memory, never returned by value, so a device backend needs no host
// round trip. The arithmetic the backends share is core/math.hpp's.
// Checked through the backends by tests/ops (each against ref) and tests/unit/test_backend.cpp
// (dispatch, device memory).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>

#include "fp8kit/backend.hpp"
#include "fp8kit/dtype.hpp"
#include "fp8kit/gemm.hpp"
#include "fp8kit/half.hpp"
#include "fp8kit/quantize.hpp"

namespace fp8kit::detail {

// ---- dispatch ----

// The backend an operation runs on, chosen from the device of its inputs (src/core/backend.cpp).
struct Dispatch;
struct Input {
    const char* name;     // the argument, as errors call it ("A", "bias")
    const Tensor* tensor; // null or undefined: not given
};
// fp8kit::Error "fp8kit::<fn>: <a> is on cpu but <b> is on cuda" when inputs disagree. No inputs:
// the host backend.
Dispatch dispatch(const char* fn, std::initializer_list<Input> inputs);

// ---- the options resolved into what turns a group's amax into its scale ----

struct ScaleRule {
    Format format;
    bool mx;
    MxRounding mx_rounding;
    float fp8_max;
    float amax_epsilon;
    bool power_of_two;
    const float* fixed_scale;  // delayed scaling: this scale (one float in device memory) for every group; null: current
};
ScaleRule scale_rule(const QuantizeOptions& opts);

struct MatrixRef;
// NonFinite::error, before anything is written: an amax pass over x (the matrix of `tensor`, on
// d's device: there the amax is read back, and only when it is not finite x too), then
// throw_non_finite if the amax is not finite.
void refuse_non_finite(const Dispatch& d, const MatrixRef& x, const Tensor& tensor, const std::string& where);

// A matrix of f32 / bf16 / f16 elements; element (i, j) is at data + (i * ld + j) * size.
struct MatrixRef {
    const void* data;
    DType dtype;
    int64_t rows, cols, ld;
};

// The [numel / last dim, last dim] matrix of a host f32/bf16/f16 tensor. A 2-d view with unit
// column stride (rows of a larger matrix, a column slice) is used in place - x must then outlive
// the Matrix; anything else is copied to contiguous memory first (`keep` holds the copy). `fn`
// names the caller in errors.
struct Matrix {
    Tensor keep;
    MatrixRef ref;
};
Matrix as_matrix(const Tensor& x, const char* fn);

// fp8kit::Error, prefixed by `where`, for options quantize cannot honour.
void check_quantize_options(const QuantizeOptions& o, std::string_view where);

// NonFinite::error: fp8kit::Error naming `tensor` and the index of x's first NaN or Inf (x is the
// host matrix of `tensor`).
[[noreturn]] void throw_non_finite(const MatrixRef& x, const Tensor& tensor, const std::string& where);

// quantize / cast_transpose. Outputs are contiguous and preallocated:
//   data      [rows, cols] codes          scale_inv   [ceil(rows/group.rows), ceil(cols/group.cols)]
//   data_t    [cols, rows] codes          scale_inv_t [ceil(cols/group_t.rows), ceil(rows/group_t.cols)]
// (data_t/scale_inv_t null unless the transposed copy is asked for; group_t is the group of the
// same Scaling on the [cols, rows] transpose). Scales are float, or e8m0 codes when rule.mx.
// The backend stores the max |x| of the whole input in *amax (NaN if any element is NaN).
struct QuantizeJob {
    ExecContext ctx;
    MatrixRef x;
    ScaleRule rule;
    Overflow overflow;
    GroupShape group, group_t;
    uint8_t* data;
    void* scale_inv;
    uint8_t* data_t;
    void* scale_inv_t;
    float* amax;
};

// dequantize: out[i, j] = decode(data[i, j]) * scale_inv[i / group.rows, j / group.cols].
struct DequantizeJob {
    ExecContext ctx;
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

    float scale(int64_t i, int64_t kk) const noexcept { return scale_at((i / group.rows) * scale_cols + kk / group.cols); }
    // Entry `at` of scale_inv as a float.
    float scale_at(int64_t at) const noexcept {
        return e8m0 ? decode(static_cast<const uint8_t*>(scale_inv)[at], Format::e8m0fnu)
                    : static_cast<const float*>(scale_inv)[at];
    }
};

// gemm: out[m, n] (contiguous, out_dtype f32/bf16/f16) =
//   act(alpha * sum over K groups g of (sum_{k in g} a_ik b_jk) * sa(i, g) * sb(j, g)
//       + beta * c[i, j] + bias[j])
// K groups are kgroup wide (the last one may be cut); kgroup divides both operands' scale groups
// along K, so each operand has one scale per (row, K group). A backend may sum the same exact
// products in another order where that is exact (the cpu's folding of power-of-two scales,
// docs/NUMERICS.md "Accumulation").
// Fused cast: a.data is null and `fuse` quantizes A ([m, k], its codes never stored whole): the
// backend fills fuse->scale_inv (A's scales, the layout of a.scale_inv) and *fuse->amax, exactly
// as quantize(fuse) would. a then describes A's scales only.
// Weight-only: a.data and fuse are null, and a_hp.data is A in high precision, which the backend
// takes as the sum of its two bf16 terms (weight_only_hi / weight_only_lo; lo is zero for a bf16
// A); a describes its scale (1). Host backends only.
// out may be c (accumulation: out = alpha AB + beta out): a backend reads c[i, j] before it
// writes out[i, j], element by element.
struct GemmJob {
    ExecContext ctx;
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
    MatrixRef a_hp{};          // weight-only: A [m, k] (else data is null)
};

// DelayedScaling::step: scale = compute_scale(max (or [0]) of history[0, length), fp8_max, ...,
// previous scale), then the history rolls ([k] -> [k+1], [0] = 0). All pointers: device memory.
struct DelayedUpdate {
    float* history;
    int64_t length;
    float* scale;
    float fp8_max, amax_epsilon;
    bool power_of_two, use_max;
};

// ---- layer ops (<fp8kit/ops.hpp>; src/core/<family>.cpp checks and builds these) ----
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
    ExecContext ctx = {};  // last, so the positional initializers of src/core need not name it
};

// dbias[cols] += sum over rows of dout[rows, cols] (Linear's bias gradient).
struct BiasGradJob {
    DType dtype;
    int64_t rows, cols;
    const void* dout;
    void* dbias;
    ExecContext ctx = {};  // last, so the positional initializers of src/core need not name it
};

// layernorm / rmsnorm forward (mean, bias null for rmsnorm).
struct NormJob {
    DType dtype;
    int64_t rows, c;
    double eps;
    const void *inp, *weight, *bias;
    void *out, *mean, *rstd;
    ExecContext ctx = {};  // last, so the positional initializers of src/core need not name it
};

// layernorm / rmsnorm backward (mean, dbias null for rmsnorm).
struct NormBackwardJob {
    DType dtype;
    int64_t rows, c;
    const void *dout, *inp, *weight, *mean, *rstd;
    void *dinp, *dweight, *dbias;
    ExecContext ctx = {};  // last, so the positional initializers of src/core need not name it
};

// gelu forward (out = gelu(inp); dout null) and backward (out = gelu'(inp) * dout).
struct GeluJob {
    DType dtype;
    int64_t n;
    const void *inp, *dout;
    void* out;
    ExecContext ctx = {};  // last, so the positional initializers of src/core need not name it
};

// attention forward (out, att written; dout, dqkv null) and backward (dqkv written from dout,
// qkv, att). hs = c / nh.
struct AttentionJob {
    DType dtype;
    int64_t b, t, c, nh;
    const void* qkv;
    void *out, *att;         // forward: written
    const void *dout, *saved_att;  // backward: read (saved_att: the forward's att)
    void* dqkv;              // backward: written
    ExecContext ctx = {};  // last, so the positional initializers of src/core need not name it
};

// attention_decode: q [b, hq, s, d], k and v [b, hkv, l, d], mask null or [mask_b, s, l] bytes (1:
// attended), out [b, s, hq, d]; all contiguous, of dtype (bf16, f16 or f32); hq a multiple of hkv.
struct AttentionDecodeJob {
    DType dtype;
    int64_t b, hq, hkv, s, l, d, mask_b;
    double scale;
    const void *q, *k, *v;
    const uint8_t* mask;
    void* out;
    ExecContext ctx = {};  // last, so the positional initializers of src/core need not name it
};

struct CrossEntropyJob {
    DType dtype;
    int64_t rows, v;
    const int32_t* targets;  // [rows], each in [0, v)
    const void* logits;      // forward: read
    void *losses, *probs;    // forward: written
    const void* saved_probs; // backward: read (the forward's probs)
    void* dlogits;           // backward: written
    double dloss;            // backward
    ExecContext ctx = {};  // last, so the positional initializers of src/core need not name it
};

struct EmbeddingJob {
    DType dtype;
    int64_t rows, c;
    const int32_t* ids;  // [rows], each a row of the table
    const void* table;   // forward
    void* out;           // forward
    const void* dout;    // backward
    void* dtable;        // backward
    ExecContext ctx = {};  // last, so the positional initializers of src/core need not name it
};

// out[i] = inp[i] + residual[i % period], i < n (period divides n, or n is 0).
struct ResidualJob {
    DType dtype;
    int64_t n, period;
    const void *inp, *residual;
    void* out;
    ExecContext ctx = {};  // last, so the positional initializers of src/core need not name it
};

// One AdamW update of n elements; c1 = 1 - beta1^step, c2 = 1 - beta2^step (float32, computed
// once by the caller so every backend uses the same ones).
struct AdamWJob {
    DType dtype;
    int64_t n;
    void *param, *m, *v;
    const void* grad;
    float lr, beta1, beta2, eps, weight_decay, c1, c2;
    ExecContext ctx = {};  // last, so the positional initializers of src/core need not name it
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

// fn(T{}) with T the storage type of a bf16, f16 or f32 dtype (the host backends' casts, attention_decode).
template <class Fn>
void with_storage_type(DType dtype, Fn&& fn) {
    if (dtype == DType::bf16) {
        fn(bf16{});
    } else if (dtype == DType::f16) {
        fn(f16{});
    } else {
        fn(float{});
    }
}

struct BackendOps {
    // max |x| into *out (one float of device memory).
    void (*amax)(const ExecContext& ctx, const MatrixRef& x, float* out);
    // Per-group max |x| into out [ceil(rows/group.rows), ceil(cols/group.cols)], row-major.
    void (*group_amax)(const ExecContext& ctx, const MatrixRef& x, GroupShape group, float* out);
    void (*quantize)(QuantizeJob& job);
    void (*dequantize)(const DequantizeJob& job);
    // B in the backend's layout for gemm (null when it reads the operand as is); *bytes = size.
    // lasting: for a PackedWeight, held for its life (sized to the byte); else for one GEMM call,
    // in memory that may come from, and go back to, the host block cache (a per-step repack of a
    // training weight then finds its pages instead of faulting fresh ones).
    std::shared_ptr<const void> (*pack_weight)(const ExecContext& ctx, const GemmOperand& b, int64_t kgroup, bool lasting,
                                               size_t* bytes);
    // B's codes [rows, k] written back from pack_weight's layout into out (rows ld apart); false
    // where that layout does not hold them (a backend that reads B as it is).
    bool (*unpack_weight)(const void* packed, uint8_t* out, int64_t ld);
    void (*gemm)(GemmJob& job);
    // Delayed scaling state: history zeroed and scale 1; history[0] = max(history[0], *amax)
    // (NaN sticks); DelayedUpdate.
    void (*delayed_init)(const ExecContext& ctx, float* history, int64_t length, float* scale);
    void (*delayed_record)(const ExecContext& ctx, float* history, const float* amax);
    void (*delayed_update)(const ExecContext& ctx, const DelayedUpdate& u);
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
    void (*attention_decode)(const AttentionDecodeJob& job);
    void (*crossentropy_forward)(const CrossEntropyJob& job);
    void (*crossentropy_backward)(const CrossEntropyJob& job);
    void (*embedding_forward)(const EmbeddingJob& job);
    void (*embedding_backward)(const EmbeddingJob& job);
    void (*adamw_update)(const AdamWJob& job);
    void (*residual_forward)(const ResidualJob& job);
};

// The host backends' delayed-scaling state updates (one implementation: a few scalars).
void host_delayed_init(const ExecContext& ctx, float* history, int64_t length, float* scale);
void host_delayed_record(const ExecContext& ctx, float* history, const float* amax);
void host_delayed_update(const ExecContext& ctx, const DelayedUpdate& u);

const BackendOps& backend_ops(Backend b);  // fp8kit::Error if not available

// A device backend's memory, the sibling of its BackendOps (as ggml's buffer types are): what
// Tensor storage, Tensor::fill_zero and copies between host and device use for a tensor off the
// host. (Host tensors live in host memory, core/host_memory.hpp.)
struct DeviceMemory {
    // `bytes` of device memory on this thread's stream (stream-ordered: usable by work enqueued
    // after it, freed after the work enqueued before the last owner lets go). fp8kit::Error when
    // the device cannot give it (naming the size and the device's error).
    std::shared_ptr<std::byte> (*allocate)(size_t bytes);
    // dst[0, bytes) = 0 on this thread's stream (device memory).
    void (*zero)(void* dst, size_t bytes);
    // Copies `height` rows of `width` bytes (pitches in bytes) between any two of host and device
    // memory, ordered on this thread's stream; with `wait` (a copy that involves the host) it
    // waits for it, so that on return dst holds the data. A device-to-device copy needs no wait:
    // the work that reads dst is ordered after it on the stream.
    void (*copy_2d)(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t height,
                    bool wait);
};
// The memory of `device` (not Device::cpu); fp8kit::Error "fp8kit::Tensor::<fn>: device cuda needs
// the CUDA backend, which this build does not have" in a build without it.
const DeviceMemory& device_memory(Device device, const char* fn);

struct Dispatch {
    const BackendOps& ops;
    Backend backend;
    Device device;   // where outputs are allocated
    ExecContext ctx;
};

// The amax NaN every backend reports, so that amaxes compare bit for bit.
inline constexpr uint32_t canonical_nan_bits = 0x7fc00000u;

}  // namespace fp8kit::detail

// Each backend's implementation of the op families: quantize, gemm, and the layer ops
// (src/<backend>/<family>.cpp: matmul, layernorm, gelu, attention, crossentropy, embedding, adamw,
// residual).
#define FP8KIT_DECLARE_QUANTIZE_OPS(ns)                                                       \
    namespace fp8kit::ns {                                                                    \
    void amax(const ExecContext& ctx, const detail::MatrixRef& x, float* out);                \
    void group_amax(const ExecContext& ctx, const detail::MatrixRef& x, GroupShape group,     \
                    float* out);                                                              \
    void quantize(detail::QuantizeJob& job);                                                  \
    void dequantize(const detail::DequantizeJob& job);                                        \
    std::shared_ptr<const void> pack_weight(const ExecContext& ctx, const detail::GemmOperand& b, \
                                            int64_t kgroup, bool lasting, size_t* bytes);     \
    bool unpack_weight(const void* packed, uint8_t* out, int64_t ld);                         \
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
    void attention_decode(const detail::AttentionDecodeJob& job);                             \
    void crossentropy_forward(const detail::CrossEntropyJob& job);                            \
    void crossentropy_backward(const detail::CrossEntropyJob& job);                           \
    void embedding_forward(const detail::EmbeddingJob& job);                                  \
    void embedding_backward(const detail::EmbeddingJob& job);                                 \
    void adamw_update(const detail::AdamWJob& job);                                           \
    void residual_forward(const detail::ResidualJob& job);                                    \
    }
FP8KIT_DECLARE_QUANTIZE_OPS(ref)
FP8KIT_DECLARE_QUANTIZE_OPS(cpu)
#undef FP8KIT_DECLARE_QUANTIZE_OPS

// The CUDA backend (src/cuda/device.cu, linked in builds with FP8KIT_HAS_CUDA): whether a CUDA
// device can be used (a driver and at least one GPU; asked once per process), why not ("no CUDA
// device", "no NVIDIA driver", the runtime's error; "" when available), its op table and its
// device memory (src/core/backend.cpp puts them behind Backend::cuda and Device::cuda).
namespace fp8kit::cuda {
bool available() noexcept;
const std::string& unavailable_reason() noexcept;
const detail::BackendOps& ops() noexcept;
const detail::DeviceMemory& memory() noexcept;
}  // namespace fp8kit::cuda
