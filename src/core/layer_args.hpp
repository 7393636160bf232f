// src/core/layer_args.hpp: argument checks shared by the public layer ops (src/core/<family>.cpp
// for matmul, layernorm, gelu, attention, crossentropy, embedding, adamw, residual): each names the
// op, the argument, what it is and what was expected, before any work is done.
// Tensors may be on any device; detail::dispatch then checks that an op's tensors share one and
// picks its backend.
// Checked by the ErrorsNameTheArgument tests of tests/ops/test_matmul.cpp, test_layernorm.cpp,
// test_gelu.cpp, test_attention.cpp, test_crossentropy.cpp, test_embedding.cpp and test_adamw.cpp.
#pragma once

#include <string>

#include "core/ops.hpp"
#include "fp8kit/error.hpp"
#include "fp8kit/tensor.hpp"

namespace fp8kit::detail {

inline std::string describe(const Tensor& t) {
    if (!t.defined()) return "undefined";
    return std::string(to_string(t.dtype())) + " " + to_string(t.shape()) +
           (t.device() == Device::cpu ? "" : " on " + std::string(to_string(t.device())));
}

// The float type of an op: its first input's dtype, f32 or f64.
inline DType float_dtype(const char* op, const char* arg, const Tensor& t) {
    if (!t.defined() || (t.dtype() != DType::f32 && t.dtype() != DType::f64)) {
        throw Error(std::string("fp8kit::") + op + ": " + arg + " is " + describe(t) + ", expected an f32 or f64 tensor");
    }
    return t.dtype();
}

// Product of all dimensions but the last (1 for rank 0 and 1).
inline int64_t leading_rows(const Tensor& t) {
    int64_t rows = 1;
    for (int64_t d = 0; d + 1 < t.dim(); ++d) rows *= t.size(d);
    return rows;
}

// t is a tensor of this dtype and shape.
inline void expect_tensor(const char* op, const char* arg, const Tensor& t, DType dtype, const Shape& shape) {
    if (!t.defined() || t.dtype() != dtype || t.shape() != shape) {
        throw Error(std::string("fp8kit::") + op + ": " + arg + " is " + describe(t) + ", expected " +
                    std::string(to_string(dtype)) + " " + to_string(shape));
    }
}

// An input: checked, and made contiguous (a copy only when it is not).
inline Tensor input(const char* op, const char* arg, const Tensor& t, DType dtype, const Shape& shape) {
    expect_tensor(op, arg, t, dtype, shape);
    return t.contiguous();
}

// An output the op writes in place: checked, and contiguous.
inline void output(const char* op, const char* arg, const Tensor& t, DType dtype, const Shape& shape) {
    expect_tensor(op, arg, t, dtype, shape);
    if (!t.is_contiguous()) throw Error(std::string("fp8kit::") + op + ": " + arg + " " + describe(t) + " is not contiguous");
}

// i32 indices, each in [0, bound): the table row an embedding or a target selects. Device indices
// are read back to be checked (before any work: a bad index never reaches a kernel).
inline Tensor indices(const char* op, const char* arg, const Tensor& t, int64_t bound) {
    if (!t.defined() || t.dtype() != DType::i32) {
        throw Error(std::string("fp8kit::") + op + ": " + arg + " is " + describe(t) + ", expected an i32 tensor");
    }
    Tensor c = t.contiguous();
    const Tensor host = c.to(Device::cpu);
    const int32_t* p = host.data<const int32_t>();
    for (int64_t i = 0; i < c.numel(); ++i) {
        if (p[i] < 0 || p[i] >= bound) {
            throw Error(std::string("fp8kit::") + op + ": " + arg + "[" + std::to_string(i) + "] is " + std::to_string(p[i]) +
                        ", expected a value in [0, " + std::to_string(bound) + ")");
        }
    }
    return c;
}

inline Shape with_last(Shape s, int64_t last) {
    if (s.empty()) s.push_back(last);
    else s.back() = last;
    return s;
}

}  // namespace fp8kit::detail
