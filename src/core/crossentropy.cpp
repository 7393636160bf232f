// src/core/crossentropy.cpp: the public softmax cross-entropy forward/backward - argument checks
// (targets in range) and the hand-off to the backend (src/ref/crossentropy.cpp,
// src/cpu/crossentropy.cpp). Checked by tests/ops/test_crossentropy.cpp and tests/ops/test_backward.cpp.
#include <cmath>

#include "core/layer_args.hpp"
#include "fp8kit/ops.hpp"

namespace fp8kit {

void crossentropy_forward(const Tensor& losses, const Tensor& probs, const Tensor& logits, const Tensor& targets) {
    const char* op = "crossentropy_forward";
    const DType dt = detail::float_dtype(op, "logits", logits);
    if (logits.dim() < 1 || logits.size(-1) < 1) {
        throw Error("fp8kit::crossentropy_forward: logits is " + detail::describe(logits) + ", expected [..., V], V >= 1");
    }
    const int64_t v = logits.size(-1), rows = detail::leading_rows(logits);
    const Tensor z = logits.contiguous();
    if (targets.defined() && targets.numel() != rows) {
        throw Error("fp8kit::crossentropy_forward: targets is " + detail::describe(targets) + ", expected " +
                    std::to_string(rows) + " i32 values (one per row of logits)");
    }
    const Tensor t = detail::indices(op, "targets", targets, v);
    detail::output(op, "losses", losses, dt, {rows});
    detail::output(op, "probs", probs, dt, {rows, v});
    const detail::Dispatch d = detail::dispatch(op, {{"losses", &losses}, {"probs", &probs}, {"logits", &logits}, {"targets", &targets}});
    d.ops.crossentropy_forward({dt, rows, v, static_cast<const int32_t*>(t.const_raw_data()), z.const_raw_data(),
                                losses.raw_data(), probs.raw_data(), nullptr, nullptr, 0.0, d.ctx});
}

void crossentropy_backward(const Tensor& dlogits, const Tensor& probs, const Tensor& targets, float dloss) {
    const char* op = "crossentropy_backward";
    const DType dt = detail::float_dtype(op, "probs", probs);
    if (probs.dim() != 2) throw Error("fp8kit::crossentropy_backward: probs is " + detail::describe(probs) + ", expected [N, V]");
    if (!std::isfinite(dloss)) throw Error("fp8kit::crossentropy_backward: dloss is " + std::to_string(dloss) + ", expected a finite value");
    const int64_t rows = probs.size(0), v = probs.size(1);
    const Tensor p = probs.contiguous();
    if (targets.defined() && targets.numel() != rows) {
        throw Error("fp8kit::crossentropy_backward: targets is " + detail::describe(targets) + ", expected " +
                    std::to_string(rows) + " i32 values");
    }
    const Tensor t = detail::indices(op, "targets", targets, v);
    detail::output(op, "dlogits", dlogits, dt, {rows, v});
    const detail::Dispatch d = detail::dispatch(op, {{"dlogits", &dlogits}, {"probs", &probs}, {"targets", &targets}});
    d.ops.crossentropy_backward({dt, rows, v, static_cast<const int32_t*>(t.const_raw_data()), nullptr, nullptr,
                                 nullptr, p.const_raw_data(), dlogits.raw_data(), double(dloss), d.ctx});
}

}  // namespace fp8kit
