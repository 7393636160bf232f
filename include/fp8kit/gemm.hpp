// fp8kit/gemm.hpp: scaled FP8 matrix multiplication.
//
//   D[M, N] = act(alpha * deq(A)[M, K] . deq(B)[N, K]^T  (+ beta * C[M, N])  (+ bias[N]))
//
// B is [out, in] as a Linear weight: the "TN" layout of cuBLASLt, torch._scaled_mm and DeepGEMM.
// deq(X) = decode(code) * scale_inv of the code's scaling group (quantize.hpp).
//
// Numerics (docs/NUMERICS.md): every product of two FP8 values is exact in float32, products are
// summed in a float32 accumulator, and scales are applied per K group: with scale groups that are
// narrower than K (block 1x128 / 128x128, mx32), the partial sum over each K group is multiplied
// by sa * sb and added into the float32 accumulator (DeepGEMM's promotion). With tensor and row
// scaling the one K group is all of K. alpha, C, bias and the activation follow in float32.
//
// A may be given in high precision (f32, bf16, f16) with its QuantizeOptions: the cast then runs
// inside the GEMM, while A is packed, with exactly the codes and scales quantize() gives - it
// never writes an FP8 copy of A (tensor current scaling reads A twice: amax, then the packing
// cast; every other scaling reads it once). An Inf or NaN in A follows A's non_finite option
// (quantize.hpp): propagated, D's rows that use it are NaN or Inf; or an fp8kit::Error. Without
// options, A is used in bf16 and only B is FP8 (weight-only, GemmA); its Inf and NaN propagate.
//
// The backend is the one of the inputs' device (backend.hpp); D is allocated there, or written
// into a caller's tensor - which it can accumulate into (beta).
// Checked by tests/unit/test_gemm.cpp (errors, K groups, accumulation) and tests/ops/test_gemm.cpp
// (every backend against ref, ref against float64).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "fp8kit/backend.hpp"
#include "fp8kit/quantize.hpp"
#include "fp8kit/tensor.hpp"

namespace fp8kit {

enum class Activation {
    none,
    gelu,  // tanh approximation, as GPT-2 and PyTorch's gelu(approximate="tanh")
};

struct GemmOptions {
    float alpha = 1.0f;
    float beta = 0.0f;                 // multiplies c (gemm into out without c: out itself)
    std::optional<Tensor> c;           // [M, N] f32/bf16/f16, any row stride
    std::optional<Tensor> bias;        // [N] f32/bf16/f16
    Activation activation = Activation::none;
    DType out_dtype = DType::f32;      // f32, bf16 or f16 (for FP8 output see gemm_quantized)
};

// The A operand: FP8 already quantized; high precision plus the options to quantize it with
// (fused cast); or high precision alone - weight-only FP8 ("W8A16", torchao's
// Float8WeightOnlyConfig): A is not quantized but rounded to bf16 (nearest even, NaN and Inf kept;
// below 2^-102 in magnitude to a zero of its sign: docs/NUMERICS.md says why) and multiplied by
// B's FP8 values, each product exact in float32, with A's scale 1. Weight-only runs on the host
// backends (cpu, ref) only. Implicit, so gemm(qa, qb), gemm({x, recipe.options(Role::input)}, w)
// and gemm(x, w) read well.
struct GemmA {
    GemmA(const QTensor& q) : fp8(q) {}                                   // NOLINT: implicit
    // x by value: a caller's temporary moves in (its shape is not copied)
    GemmA(Tensor x, const QuantizeOptions& q) : hp(std::move(x)), quantize(q) {}  // NOLINT
    GemmA(Tensor x) : hp(std::move(x)), weight_only(true) {}                      // NOLINT
    std::optional<QTensor> fp8;
    std::optional<Tensor> hp;  // [M, K] f32 / bf16 / f16, unit column stride or copied
    QuantizeOptions quantize;  // for hp, unless weight_only
    bool weight_only = false;  // hp not quantized: taken as two bf16 terms (NUMERICS.md)
};

namespace detail { struct PackedAccess; }

// B packed once for the backend of its device, for many GEMMs (inference reuses a weight every call).
// Holds the codes in the backend's blocked layout (FP8, one byte per weight) plus the scales, and
// shares - never copies - the source QTensor. A GEMM handed a plain QTensor (the overloads below)
// takes it for that one call: the backend packs what it must inside the call, or reads B as it is.
class PackedWeight {
public:
    PackedWeight(const QTensor& b);  // NOLINT: implicit; [N, K], fp8kit::Error if not a GEMM operand
    // Packed for the GEMMs whose A is scaled as a_scaling: K in the groups both scalings nest in
    // (the narrower of A's and B's), so that such a GEMM reads this packing as it is - the only
    // way to serve A groups narrower than B's once the codes are released.
    PackedWeight(const QTensor& b, const Scaling& a_scaling);
    int64_t k_group() const noexcept { return k_group_; }  // the K group the layout is packed for
    const QTensor& source() const noexcept { return source_; }  // data undefined once codes_released()
    int64_t n() const noexcept { return n_; }
    int64_t k() const noexcept { return k_; }
    Format format() const noexcept { return format_; }
    Backend backend() const noexcept { return backend_; }
    size_t packed_bytes() const noexcept;  // memory the packed layout takes beyond the source

    // Makes the packed layout the weight's only copy: the source's codes are let go (their memory
    // is freed once nothing else holds it) and source().data is undefined from then on; the
    // scales, shape and format stay, and every GEMM this packing serves is unchanged. Only where
    // the layout holds every code (the cpu backend); fp8kit::Error on a backend that reads B as
    // it is (ref, cuda). A GEMM that would need B repacked (another backend, narrower K groups
    // of A than it was packed for) then fails, naming the release.
    void release_codes();
    bool codes_released() const noexcept { return released_; }
    // B's codes into out ([N, K], contiguous, B's FP8 dtype, on the host): the source's, or once
    // released read back from the packed layout - bit for bit the same.
    void codes_into(const Tensor& out) const;

private:
    friend struct detail::PackedAccess;  // the backend's layout, for src/core/gemm.cpp
    struct ForOneCall {};
    PackedWeight(const QTensor& b, ForOneCall);  // b checked, nothing packed: the GEMM packs in its call
    QTensor source_;
    int64_t n_ = 0, k_ = 0, k_group_ = 0;
    Format format_;
    bool released_ = false;
    Backend backend_;
    std::shared_ptr<const void> packed_;
    size_t packed_bytes_ = 0;
};

// D as out_dtype (f32, bf16, f16), [M, N] contiguous, on the inputs' device.
Tensor gemm(const GemmA& a, const PackedWeight& b, const GemmOptions& opts = {});
// D written into `out`: a contiguous, writable [M, N] tensor of dtype opts.out_dtype on the inputs'
// device. Without opts.c, beta scales out itself - accumulation, as a weight gradient summed over
// micro-batches: out = alpha AB + beta out (+ bias, activation). out must not overlap A or B.
void gemm(const GemmA& a, const PackedWeight& b, const GemmOptions& opts, const Tensor& out);

// D quantized to FP8 with its own scale: computed in float32 as above, then quantize(D, out),
// so out.scaling / out.scale (delayed) apply and the result carries D's amax.
QTensor gemm_quantized(const GemmA& a, const PackedWeight& b, const GemmOptions& opts,
                       const QuantizeOptions& out);

// The same with B a QTensor for this call alone (a training step's GEMMs: each B serves one):
// not packed ahead into memory of its own; the cpu backend widens B's windows straight from its
// codes where its kernels can, else packs it inside the call.
Tensor gemm(const GemmA& a, const QTensor& b, const GemmOptions& opts = {});
void gemm(const GemmA& a, const QTensor& b, const GemmOptions& opts, const Tensor& out);
QTensor gemm_quantized(const GemmA& a, const QTensor& b, const GemmOptions& opts, const QuantizeOptions& out);

// The K group over which partial sums are scaled, for two operand scalings along K: the
// narrower of their K extents (K itself for tensor/row). fp8kit::Error if they do not nest
// (one extent must divide the other) or one scales along K per element (column).
int64_t gemm_k_group(const Scaling& a, const Scaling& b, int64_t k);

}  // namespace fp8kit
