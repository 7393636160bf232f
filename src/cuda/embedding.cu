// src/cuda/embedding.cu: the cuda backend's embedding - a row gather, and the backward's
// scatter-add with one thread per column adding the rows in order (no atomics: repeated ids sum in
// the cpu backend's order, the same every run). Checked against the reference backend by
// tests/ops/test_embedding.cpp (the cuda part of ForwardIsExactAndBackwardWithinTheBound).
#include "cuda/common.cuh"

namespace fp8kit::cuda {

namespace {

// out[r, :] = table[ids[r], :]
template <class T>
__global__ void embedding_forward_kernel(detail::EmbeddingJob j) {
    for (int64_t e = grid_first(); e < j.rows * j.c; e += grid_step()) {
        const int64_t r = e / j.c, i = e % j.c;
        static_cast<T*>(j.out)[e] = static_cast<const T*>(j.table)[int64_t(j.ids[r]) * j.c + i];
    }
}

// dtable[ids[r], i] += dout[r, i], r ascending, for the thread's column i.
template <class T>
__global__ void embedding_backward_kernel(detail::EmbeddingJob j) {
    const int64_t i = grid_first();
    if (i >= j.c) return;
    T* dtable = static_cast<T*>(j.dtable);
    const T* dout = static_cast<const T*>(j.dout);
    for (int64_t r = 0; r < j.rows; ++r) dtable[int64_t(j.ids[r]) * j.c + i] += dout[r * j.c + i];
}

}  // namespace

void embedding_forward(const detail::EmbeddingJob& j) {
    if (j.rows * j.c == 0) return;
    detail::with_float_type(j.dtype, [&]<class T>(T) {
        embedding_forward_kernel<T><<<blocks_for(j.rows * j.c, 256), 256, 0, stream_of(j.ctx)>>>(j);
    });
    check_launch("embedding_forward_kernel");
}

void embedding_backward(const detail::EmbeddingJob& j) {
    if (j.rows * j.c == 0) return;
    detail::with_float_type(j.dtype, [&]<class T>(T) {
        embedding_backward_kernel<T><<<blocks_for(j.c, 128), 128, 0, stream_of(j.ctx)>>>(j);
    });
    check_launch("embedding_backward_kernel");
}

}  // namespace fp8kit::cuda
