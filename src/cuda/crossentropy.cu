// src/cuda/crossentropy.cu: the cuda backend's softmax cross-entropy, in the cpu backend's
// arithmetic: the softmax max and sum in double (one block a row, a fixed reduction tree),
// probabilities and losses rounded once, the loss from the logits (log-sum-exp), never from a
// rounded probability; the backward (probs - onehot) * dloss in the tensor's precision. So the cpu
// bounds of docs/NUMERICS.md hold. Checked against the reference backend by
// tests/ops/test_crossentropy.cpp (CudaMatchesRefWithinTheBound).
#include <cmath>

#include "cuda/common.cuh"

namespace fp8kit::cuda {

namespace {

constexpr int row_threads = 256;

template <class T>
__global__ void crossentropy_forward_kernel(detail::CrossEntropyJob j) {
    __shared__ double scratch[32];
    const int64_t r = blockIdx.x, v = j.v;
    const T* z = static_cast<const T*>(j.logits) + r * v;  // [V]
    double maxv = -INFINITY;
    for (int64_t i = threadIdx.x; i < v; i += blockDim.x) maxv = Max{}(maxv, double(z[i]));
    maxv = block_reduce<double>(maxv, Max{}, -INFINITY, scratch);
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < v; i += blockDim.x) sum += exp(double(z[i]) - maxv);
    sum = block_reduce(sum, Sum{}, 0.0, scratch);
    T* probs = static_cast<T*>(j.probs) + r * v;
    for (int64_t i = threadIdx.x; i < v; i += blockDim.x) probs[i] = T(exp(double(z[i]) - maxv) / sum);
    if (threadIdx.x == 0) static_cast<T*>(j.losses)[r] = T(log(sum) - (double(z[j.targets[r]]) - maxv));
}

template <class T>
__global__ void crossentropy_backward_kernel(detail::CrossEntropyJob j) {
    const T* probs = static_cast<const T*>(j.saved_probs);
    T* dlogits = static_cast<T*>(j.dlogits);
    const T dloss = T(j.dloss);
    for (int64_t e = grid_first(); e < j.rows * j.v; e += grid_step()) {
        const int64_t r = e / j.v, i = e % j.v;
        dlogits[e] = (probs[e] - (i == j.targets[r] ? T(1) : T(0))) * dloss;
    }
}

}  // namespace

void crossentropy_forward(const detail::CrossEntropyJob& j) {
    if (j.rows == 0) return;
    detail::with_float_type(j.dtype, [&]<class T>(T) {
        crossentropy_forward_kernel<T><<<unsigned(j.rows), row_threads, 0, stream_of(j.ctx)>>>(j);
    });
    check_launch("crossentropy_forward_kernel");
}

void crossentropy_backward(const detail::CrossEntropyJob& j) {
    if (j.rows * j.v == 0) return;
    detail::with_float_type(j.dtype, [&]<class T>(T) {
        crossentropy_backward_kernel<T><<<blocks_for(j.rows * j.v, 256), 256, 0, stream_of(j.ctx)>>>(j);
    });
    check_launch("crossentropy_backward_kernel");
}

}  // namespace fp8kit::cuda
