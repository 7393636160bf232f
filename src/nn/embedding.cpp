// src/nn/embedding.cpp: embedding_forward/backward (row gather / scatter-add) and the Embedding
// module. Checked against central finite differences in float64 and PyTorch (tests/nn/).
#include "fp8kit/nn.hpp"
#include "nn/ops.hpp"

namespace fp8kit::nn {
namespace ops {

template <class T>
void embedding_forward(T* out, const int32_t* ids, const T* table, int64_t rows, int64_t c) {
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < c; ++i) out[r * c + i] = table[int64_t(ids[r]) * c + i];
}

template <class T>
void embedding_backward(T* dtable, const T* dout, const int32_t* ids, int64_t rows, int64_t c) {
    for (int64_t r = 0; r < rows; ++r)  // in order: repeated ids sum reproducibly
        for (int64_t i = 0; i < c; ++i) dtable[int64_t(ids[r]) * c + i] += dout[r * c + i];
}

template void embedding_forward(float*, const int32_t*, const float*, int64_t, int64_t);
template void embedding_forward(double*, const int32_t*, const double*, int64_t, int64_t);
template void embedding_backward(float*, const float*, const int32_t*, int64_t, int64_t);
template void embedding_backward(double*, const double*, const int32_t*, int64_t, int64_t);

}  // namespace ops

Embedding::Embedding(int64_t num, int64_t dim) : num_(num), dim_(dim) {
    if (num < 1 || dim < 1) throw Error("fp8kit::nn::Embedding: sizes must be >= 1");
    weight_ = add_parameter("weight", {num, dim});
}

Tensor Embedding::forward(const Tensor& ids) {
    if (ids.dtype() != DType::i32) throw Error("fp8kit::nn::Embedding::forward: ids must be i32, got " + std::string(to_string(ids.dtype())));
    ids_ = ids.contiguous();
    const int32_t* p = ids_.data<int32_t>();
    for (int64_t i = 0; i < ids_.numel(); ++i)
        if (p[i] < 0 || p[i] >= num_)
            throw Error("fp8kit::nn::Embedding::forward: id " + std::to_string(p[i]) + " at " + std::to_string(i) +
                        " is outside [0, " + std::to_string(num_) + ")");
    Shape s = ids_.shape();
    s.push_back(dim_);
    Tensor y = Tensor::empty(s, DType::f32);
    const Tensor w = weight_->compute_value();
    ops::embedding_forward(y.data<float>(), p, w.data<float>(), ids_.numel(), dim_);
    return y;
}

void Embedding::backward(const Tensor& dy) {
    if (!ids_.defined() || dy.numel() != ids_.numel() * dim_ || !weight_->grad.defined())
        throw Error("fp8kit::nn::Embedding::backward: dy " + to_string(dy.shape()) + " does not match the forward ids (or the weight is stored in FP8)");
    const Tensor g = dy.contiguous();
    ops::embedding_backward(weight_->grad.data<float>(), g.data<float>(), ids_.data<int32_t>(), ids_.numel(), dim_);
    ids_ = Tensor();
}

}  // namespace fp8kit::nn
