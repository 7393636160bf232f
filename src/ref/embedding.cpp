// src/ref/embedding.cpp: the reference embedding - a row gather, and a scatter-add whose sums
// (the gradient already there plus every row of dout with that id) are float64, rounded once.
// The ground truth of tests/ops/test_embedding.cpp.
#include <vector>

#include "core/ops.hpp"

namespace fp8kit::ref {

namespace {

template <class T>
void embedding_fwd(const detail::EmbeddingJob& j) {
    const T* table = static_cast<const T*>(j.table);
    for (int64_t r = 0; r < j.rows; ++r)
        for (int64_t i = 0; i < j.c; ++i) static_cast<T*>(j.out)[r * j.c + i] = table[int64_t(j.ids[r]) * j.c + i];
}

template <class T>
void embedding_bwd(const detail::EmbeddingJob& j) {
    T* dtable = static_cast<T*>(j.dtable);
    const T* dout = static_cast<const T*>(j.dout);
    for (int64_t r = 0; r < j.rows; ++r) {
        bool first = true;  // row r is the first with its id: sum that id's rows here
        for (int64_t p = 0; p < r && first; ++p) first = j.ids[p] != j.ids[r];
        if (!first) continue;
        T* row = dtable + int64_t(j.ids[r]) * j.c;
        for (int64_t i = 0; i < j.c; ++i) {
            double sum = double(row[i]);
            for (int64_t p = r; p < j.rows; ++p)
                if (j.ids[p] == j.ids[r]) sum += double(dout[p * j.c + i]);
            row[i] = T(sum);
        }
    }
}

}  // namespace

void embedding_forward(const detail::EmbeddingJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { embedding_fwd<T>(j); });
}
void embedding_backward(const detail::EmbeddingJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { embedding_bwd<T>(j); });
}

}  // namespace fp8kit::ref
