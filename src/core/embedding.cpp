// src/core/embedding.cpp: the public embedding forward/backward (row gather, scatter-add) -
// argument checks (ids in range) and the hand-off to the backend (src/ref/embedding.cpp,
// src/cpu/embedding.cpp). Checked by tests/ops/test_embedding.cpp and tests/ops/test_backward.cpp.
#include "core/layer_args.hpp"
#include "fp8kit/ops.hpp"

namespace fp8kit {

namespace {

void check_table(const char* op, const char* arg, const Tensor& t) {
    (void)detail::float_dtype(op, arg, t);
    if (t.dim() != 2) throw Error(std::string("fp8kit::") + op + ": " + arg + " is " + detail::describe(t) + ", expected [V, C]");
}

}  // namespace

void embedding_forward(const Tensor& out, const Tensor& ids, const Tensor& table) {
    const char* op = "embedding_forward";
    check_table(op, "table", table);
    const Tensor tab = table.contiguous();
    const int64_t v = tab.size(0), c = tab.size(1);
    const Tensor i = detail::indices(op, "ids", ids, v);
    Shape s = ids.shape();
    s.push_back(c);
    detail::output(op, "out", out, tab.dtype(), s);
    const detail::Dispatch d = detail::dispatch(op, {{"out", &out}, {"ids", &ids}, {"table", &table}});
    d.ops.embedding_forward({tab.dtype(), i.numel(), c, static_cast<const int32_t*>(i.const_raw_data()),
                             tab.const_raw_data(), out.raw_data(), nullptr, nullptr, d.ctx});
}

void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) {
    const char* op = "embedding_backward";
    check_table(op, "dtable", dtable);
    if (!dtable.is_contiguous()) throw Error("fp8kit::embedding_backward: dtable is not contiguous");
    const int64_t v = dtable.size(0), c = dtable.size(1);
    const Tensor i = detail::indices(op, "ids", ids, v);
    Shape s = ids.shape();
    s.push_back(c);
    const Tensor g = detail::input(op, "dout", dout, dtable.dtype(), s);
    const detail::Dispatch d = detail::dispatch(op, {{"dtable", &dtable}, {"dout", &dout}, {"ids", &ids}});
    d.ops.embedding_backward({dtable.dtype(), i.numel(), c, static_cast<const int32_t*>(i.const_raw_data()), nullptr,
                              nullptr, g.const_raw_data(), dtable.raw_data(), d.ctx});
}

}  // namespace fp8kit
