// tests/ops/test_matmul.cpp: the f32/bf16 matmul, Linear forward/backward and bias gradient of
// the cpu backend against the reference backend, on every ISA path (the cpu matmul runs on the
// GEMM engine's kernel table), every transpose, accumulate or not, f32 and bf16 operands, shapes
// with 1, primes and sizes that are not multiples of the kernels' tiles, within the bound of
// docs/NUMERICS.md ("Layer ops"):
//   |d - ref| <= (gamma_{K+2} + u) (|c0| + sum_k |a_ik b_kj| + |bias_j|),  u = 2^-24
// (K float32 roundings of products and partial sums, one more for the accumulated c0, one for the
// bias; the reference rounds once). A dropped term of the sum is shown to exceed it. Also: f64,
// thread-count independence, and the errors. The cuda backend (Cuda* tests, skipped saying why
// without a GPU) is held to the same bounds: its matmul is cuBLASLt's float32 GEMM, bf16 operands
// widened exactly (src/cuda/matmul.cu).
#include <array>

#include "ops/layer_bound.hpp"

namespace fp8kit {
namespace {

using test::gamma;
using test::u32;

struct MatmulCase {
    int64_t m, n, k;
    bool ta, tb, acc;
    DType a_dtype, b_dtype;
};

// N(0, 1) values of this shape in f32, or rounded to bf16.
Tensor operand(const Shape& shape, DType dtype, uint32_t seed) {
    const Tensor a = test::randn(shape, seed);
    if (dtype == DType::f32) return a;
    Tensor b = Tensor::empty(shape, DType::bf16);
    for (int64_t i = 0; i < a.numel(); ++i) b.data<bf16>()[i] = bf16(a.data<float>()[i]);
    return b;
}
Tensor stored_a(const MatmulCase& c, uint32_t seed) { return operand(c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, c.a_dtype, seed); }
Tensor stored_b(const MatmulCase& c, uint32_t seed) { return operand(c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n}, c.b_dtype, seed); }

// The bound of each element: (gamma_{K+2} + u) (|c0| + sum |a b|).
std::vector<double> matmul_bound(const MatmulCase& c, const Tensor& a, const Tensor& b, const Tensor& c0) {
    auto A = [&](int64_t i, int64_t p) { return std::abs(double(a.get({c.ta ? p : i, c.ta ? i : p}))); };
    auto B = [&](int64_t p, int64_t j) { return std::abs(double(b.get({c.tb ? j : p, c.tb ? p : j}))); };
    std::vector<double> bound(size_t(c.m * c.n));
    for (int64_t i = 0; i < c.m; ++i)
        for (int64_t j = 0; j < c.n; ++j) {
            double mag = c.acc ? std::abs(double(c0.data<float>()[i * c.n + j])) : 0.0;
            for (int64_t p = 0; p < c.k; ++p) mag += A(i, p) * B(p, j);
            bound[size_t(i * c.n + j)] = (gamma(c.k + 2) + u32) * mag;
        }
    return bound;
}

Tensor run_matmul(Backend backend, const MatmulCase& c, const Tensor& a, const Tensor& b, const Tensor& c0) {
    return test::on_backend(backend, [&] {
        Tensor out = c0.clone();
        matmul(out, a, b, {.transpose_a = c.ta, .transpose_b = c.tb, .accumulate = c.acc});
        return out;
    });
}

// The same on the cuda backend: inputs and out copied to the device, the result copied back.
Tensor run_matmul_cuda(const MatmulCase& c, const Tensor& a, const Tensor& b, const Tensor& c0) {
    Tensor out = c0.to(Device::cuda);
    matmul(out, a.to(Device::cuda), b.to(Device::cuda), {.transpose_a = c.ta, .transpose_b = c.tb, .accumulate = c.acc});
    return out.to(Device::cpu);
}

// Every transpose, accumulate or not, each pair of operand dtypes, on `sizes`; check(case, a, b,
// c0, ref, bound) for each.
template <class Check>
int for_each_matmul_case(std::initializer_list<std::array<int64_t, 3>> sizes, Check&& check) {
    int cases = 0;
    for (const auto& s : sizes)
        for (bool ta : {false, true})
            for (bool tb : {false, true})
                for (bool acc : {false, true})
                    for (auto [ad, bd] : {std::pair{DType::f32, DType::f32}, std::pair{DType::bf16, DType::f32},
                                          std::pair{DType::f32, DType::bf16}, std::pair{DType::bf16, DType::bf16}}) {
                        const MatmulCase c{s[0], s[1], s[2], ta, tb, acc, ad, bd};
                        SCOPED_TRACE(::testing::Message() << c.m << "x" << c.n << "x" << c.k << " ta " << ta << " tb "
                                                          << tb << " acc " << acc << " a " << to_string(ad) << " b "
                                                          << to_string(bd));
                        const Tensor a = stored_a(c, 1), b = stored_b(c, 2), c0 = test::randn({c.m, c.n}, 3);
                        check(c, a, b, c0, run_matmul(Backend::ref, c, a, b, c0), matmul_bound(c, a, b, c0));
                        ++cases;
                    }
    return cases;
}

TEST(MatmulOps, CpuMatchesRefWithinTheBoundOnEveryPath) {
    // 50 x 150 x 300: the AVX2 kernel's tasks (48 rows x 128 columns) in both directions, a
    // 2-row remainder, a 6-column edge panel and two K slices of 256.
    const int cases = for_each_matmul_case(
        {{1, 1, 1}, {1, 17, 5}, {5, 1, 33}, {4, 16, 64}, {17, 33, 40}, {31, 7, 131}, {64, 48, 1}, {50, 150, 300}},
        [](const MatmulCase& c, const Tensor& a, const Tensor& b, const Tensor& c0, const Tensor& ref,
           const std::vector<double>& bound) {
            test::for_each_isa([&](Isa) { test::expect_within("out", run_matmul(Backend::cpu, c, a, b, c0), ref, bound); });
        });
    EXPECT_EQ(cases, 8 * 2 * 2 * 2 * 4);
}

// K = 0 (out = c0 or 0), the shapes above and ones where cuBLASLt tiles and splits K (192 x 160 x
// 1000); a dropped term exceeds the bound on the device too.
TEST(MatmulOps, CudaMatchesRefWithinTheBound) {
    FP8KIT_SKIP_WITHOUT_CUDA();
    const int cases = for_each_matmul_case(
        {{1, 1, 1}, {5, 1, 33}, {17, 33, 40}, {31, 7, 131}, {64, 48, 1}, {50, 150, 300}, {192, 160, 1000}, {3, 4, 0}},
        [](const MatmulCase& c, const Tensor& a, const Tensor& b, const Tensor& c0, const Tensor& ref,
           const std::vector<double>& bound) { test::expect_within("out", run_matmul_cuda(c, a, b, c0), ref, bound); });
    EXPECT_EQ(cases, 8 * 2 * 2 * 2 * 4);
    const MatmulCase c{17, 33, 64, false, true, false, DType::f32, DType::f32};
    const Tensor a = stored_a(c, 1), b = stored_b(c, 2), c0 = Tensor::zeros({c.m, c.n}, DType::f32);
    Tensor dropped = a.clone();
    for (int64_t i = 0; i < c.m; ++i) dropped.set({i, c.k - 1}, 0.0f);
    test::expect_caught("dropped term", run_matmul_cuda(c, dropped, b, c0), run_matmul(Backend::ref, c, a, b, c0),
                        matmul_bound(c, a, b, c0));
    // a, b and out as row views into larger device tensors, one row in: addresses 4-byte aligned
    // (K = 41, N = 33 floats a row), where cuBLASLt's default assumes 256.
    const MatmulCase v{17, 33, 41, false, false, true, DType::f32, DType::f32};
    const Tensor abig = test::randn({v.m + 1, v.k}, 4), bbig = test::randn({v.k + 1, v.n}, 5), obig = test::randn({v.m + 1, v.n}, 6);
    const Tensor av = abig.slice(0, 1, v.m + 1).contiguous(), bv = bbig.slice(0, 1, v.k + 1).contiguous();
    const Tensor ov = obig.slice(0, 1, v.m + 1).contiguous();
    const Tensor od = obig.to(Device::cuda);
    const Tensor out = od.slice(0, 1, v.m + 1);
    matmul(out, abig.to(Device::cuda).slice(0, 1, v.m + 1), bbig.to(Device::cuda).slice(0, 1, v.k + 1), {.accumulate = true});
    test::expect_within("row views", out.to(Device::cpu), run_matmul(Backend::ref, v, av, bv, ov), matmul_bound(v, av, bv, ov));
}

TEST(MatmulOps, ADroppedTermExceedsTheBound) {
    const MatmulCase c{17, 33, 64, false, true, false, DType::f32, DType::f32};
    const Tensor a = stored_a(c, 1), b = stored_b(c, 2), c0 = Tensor::zeros({c.m, c.n}, DType::f32);
    Tensor dropped = a.clone();
    for (int64_t i = 0; i < c.m; ++i) dropped.set({i, c.k - 1}, 0.0f);  // the last product of every sum
    const Tensor ref = run_matmul(Backend::ref, c, a, b, c0);
    const std::vector<double> bound = matmul_bound(c, a, b, c0);
    test::for_each_isa([&](Isa) {
        test::expect_within("out", run_matmul(Backend::cpu, c, a, b, c0), ref, bound);
        test::expect_caught("dropped term", run_matmul(Backend::cpu, c, dropped, b, c0), ref, bound);
    });
}

TEST(MatmulOps, LinearForwardAndBackwardMatchRef) {
    const int64_t rows = 37, in = 29, oc = 19;
    const Tensor x = test::randn({rows, in}, 1), w = test::randn({oc, in}, 2), bias = test::randn({oc}, 3);
    const Tensor dout = test::randn({rows, oc}, 4), dw0 = test::randn({oc, in}, 5), db0 = test::randn({oc}, 6);
    struct Out {
        Tensor y, dx, dw, db;
    };
    const auto run = [&](Backend b) {
        return test::on_backend(b, [&] {
            Out o{Tensor::empty({rows, oc}, DType::f32), Tensor::empty({rows, in}, DType::f32), dw0.clone(), db0.clone()};
            linear_forward(o.y, x, w, bias);
            linear_backward(o.dx, o.dw, o.db, dout, x, w);
            return o;
        });
    };
    const Out ref = run(Backend::ref);
    std::vector<double> by(size_t(rows * oc)), bx(size_t(rows * in)), bw(size_t(oc * in)), bb(static_cast<size_t>(oc));
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = 0; o < oc; ++o) {
            double mag = std::abs(bias.get({o}));
            for (int64_t i = 0; i < in; ++i) mag += std::abs(x.get({r, i}) * w.get({o, i}));
            by[size_t(r * oc + o)] = (gamma(in + 2) + u32) * mag;  // K products, then + bias
        }
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < in; ++i) {
            double mag = 0;
            for (int64_t o = 0; o < oc; ++o) mag += std::abs(dout.get({r, o}) * w.get({o, i}));
            bx[size_t(r * in + i)] = (gamma(oc) + u32) * mag;
        }
    for (int64_t o = 0; o < oc; ++o) {
        double magb = std::abs(db0.get({o}));
        for (int64_t r = 0; r < rows; ++r) magb += std::abs(dout.get({r, o}));
        bb[size_t(o)] = (gamma(rows) + u32) * magb;  // rows additions
        for (int64_t i = 0; i < in; ++i) {
            double mag = std::abs(dw0.get({o, i}));
            for (int64_t r = 0; r < rows; ++r) mag += std::abs(dout.get({r, o}) * x.get({r, i}));
            bw[size_t(o * in + i)] = (gamma(rows + 1) + u32) * mag;
        }
    }
    const auto check = [&](const Out& got) {
        test::expect_within("y", got.y, ref.y, by);
        test::expect_within("dx", got.dx, ref.dx, bx);
        test::expect_within("dweight", got.dw, ref.dw, bw);
        test::expect_within("dbias", got.db, ref.db, bb);
    };
    test::for_each_isa([&](Isa) { check(run(Backend::cpu)); });
    // bias_backward alone is linear_backward's bias gradient.
    Tensor db = db0.clone();
    bias_backward(db, dout);
    test::expect_within("bias_backward", db, ref.db, bb);
    if (test::cuda_part_runs("Linear forward / backward and bias_backward on cuda")) {
        const Device g = Device::cuda;
        Out d{Tensor::empty({rows, oc}, DType::f32, g), Tensor::empty({rows, in}, DType::f32, g), dw0.to(g), db0.to(g)};
        const Tensor xd = x.to(g), wd = w.to(g), doutd = dout.to(g);
        linear_forward(d.y, xd, wd, bias.to(g));
        linear_backward(d.dx, d.dw, d.db, doutd, xd, wd);
        check({d.y.to(Device::cpu), d.dx.to(Device::cpu), d.dw.to(Device::cpu), d.db.to(Device::cpu)});
        Tensor dbd = db0.to(g);
        bias_backward(dbd, doutd);
        test::expect_within("bias_backward on cuda", dbd.to(Device::cpu), ref.db, bb);
        // 1000 rows: four chunks of the two-pass sum, the last one short.
        const Tensor tall = test::randn({1000, oc}, 7);
        const Tensor want = test::on_backend(Backend::ref, [&] {
            Tensor sum = db0.clone();
            bias_backward(sum, tall);
            return sum;
        });
        std::vector<double> bt(static_cast<size_t>(oc));
        for (int64_t o = 0; o < oc; ++o) {
            double mag = std::abs(db0.get({o}));
            for (int64_t r = 0; r < 1000; ++r) mag += std::abs(tall.get({r, o}));
            bt[size_t(o)] = (gamma(1000) + u32) * mag;
        }
        Tensor dbt = db0.to(g);
        bias_backward(dbt, tall.to(g));
        test::expect_within("bias_backward on cuda, 1000 rows", dbt.to(Device::cpu), want, bt);
    }
}

TEST(MatmulOps, Float64MatchesRefWithinTheFloat64Bound) {
    const int64_t m = 9, n = 21, k = 35;
    const Tensor a = test::randn({k, m}, 1, 1.0, DType::f64), b = test::randn({n, k}, 2, 1.0, DType::f64);
    const auto run = [&](Backend be) {
        return test::on_backend(be, [&] {
            Tensor out = Tensor::zeros({m, n}, DType::f64);
            matmul(out, a, b, {.transpose_a = true, .transpose_b = true});
            return out;
        });
    };
    const Tensor ref = run(Backend::ref), cpu = run(Backend::cpu);
    Tensor gpu;
    if (test::cuda_part_runs("the f64 matmul on cuda")) {
        gpu = Tensor::zeros({m, n}, DType::f64, Device::cuda);
        matmul(gpu, a.to(Device::cuda), b.to(Device::cuda), {.transpose_a = true, .transpose_b = true});
    }
    std::vector<double> bound(size_t(m * n));
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
            double mag = 0;
            for (int64_t p = 0; p < k; ++p) mag += std::abs(a.data<double>()[p * m + i] * b.data<double>()[j * k + p]);
            bound[size_t(i * n + j)] = (gamma(k + 1, test::u64) + test::u64) * mag;
        }
    test::expect_within("f64", cpu, ref, bound);
    if (gpu.defined()) test::expect_within("f64 on cuda", gpu.to(Device::cpu), ref, bound);
}

TEST(MatmulOps, ResultDoesNotDependOnThreads) {
    // 160 x 257 x 211: above the size where the kernel goes parallel (32 x 2^18 multiply-adds).
    const Tensor a = test::randn({160, 211}, 1), b = test::randn({257, 211}, 2);
    test::for_each_isa([&](Isa) {
        Tensor first;
        test::for_thread_counts([&](int) {
            Tensor out = Tensor::empty({160, 257}, DType::f32);
            matmul(out, a, b, {.transpose_b = true});
            if (!first.defined()) first = out;
            else test::expect_same("threads", out, first);
        });
    });
}

TEST(MatmulOps, ErrorsNameTheArgument) {
    const Tensor a = test::randn({4, 5}, 1), b = test::randn({6, 7}, 2);
    Tensor out = Tensor::empty({4, 7}, DType::f32);
    test::expect_error([&] { matmul(out, a, b); }, "do not agree on K");
    test::expect_error([&] { matmul(Tensor::empty({4, 6}, DType::f32), a, test::randn({5, 7}, 3)); }, "out is f32 [4, 6], expected f32 [4, 7]");
    test::expect_error([&] { matmul(out, Tensor::zeros({4, 5}, DType::i32), b); }, "a is i32 [4, 5]");
    test::expect_error([&] { matmul(out, a, test::randn({5, 7}, 2, 1.0, DType::f64)); }, "b is f64 [5, 7], expected a 2-d f32 or bf16");
    test::expect_error([&] { linear_forward(Tensor::empty({4, 3}, DType::f32), a, test::randn({3, 6}, 1)); }, "inp is f32 [4, 5], expected [..., 6]");
    test::expect_error([&] { bias_backward(Tensor::empty({3}, DType::f32), a); }, "expected dbias [OC] and dout [..., OC]");
}

}  // namespace
}  // namespace fp8kit
