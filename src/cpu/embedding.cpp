// src/cpu/embedding.cpp: the cpu backend's embedding: a row gather, and the backward's
// scatter-add in row order on one thread (repeated ids add up in the same order every run).
// Checked against the reference backend by tests/ops/test_embedding.cpp.
#include <cstring>

#include "core/ops.hpp"

namespace fp8kit::cpu {

namespace {

template <class T>
void embedding_bwd(const detail::EmbeddingJob& j) {
    T* dtable = static_cast<T*>(j.dtable);
    const T* dout = static_cast<const T*>(j.dout);
    for (int64_t r = 0; r < j.rows; ++r)  // in order: repeated ids sum reproducibly
        for (int64_t i = 0; i < j.c; ++i) dtable[int64_t(j.ids[r]) * j.c + i] += dout[r * j.c + i];
}

}  // namespace

void embedding_forward(const detail::EmbeddingJob& j) {
    const size_t row = size_t(j.c) * dtype_size(j.dtype);
    for (int64_t r = 0; r < j.rows; ++r) {
        std::memcpy(static_cast<char*>(j.out) + size_t(r) * row, static_cast<const char*>(j.table) + size_t(j.ids[r]) * row, row);
    }
}

void embedding_backward(const detail::EmbeddingJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { embedding_bwd<T>(j); });
}

}  // namespace fp8kit::cpu
