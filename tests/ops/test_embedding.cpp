// tests/ops/test_embedding.cpp: embedding forward/backward of the cpu backend against the
// reference backend. The forward is a copy: bit for bit. The backward adds each id's rows to its
// gradient row in row order in float32; the reference sums them in float64 and rounds once:
// |d - ref| <= (gamma_n + u) (|initial| + sum |rows|), n the id's count (docs/NUMERICS.md, "Layer
// ops"); an id seen once, on a zero gradient, is exact. A dropped repeat exceeds the bound. The
// cuda backend (rows added in the same order, one thread a column) runs the same checks when a
// GPU is present.
#include "ops/layer_bound.hpp"

namespace fp8kit {
namespace {

using test::gamma;
using test::u32;

std::pair<Tensor, Tensor> run_embedding(Backend b, const Tensor& ids, const Tensor& table, const Tensor& dout,
                                        const Tensor& dtable0) {
    return test::on_backend(b, [&] {
        Shape s = ids.shape();
        s.push_back(table.size(1));
        const Tensor i = test::moved(ids, b);
        Tensor out = Tensor::empty(s, DType::f32, test::device_of(b)), dt = test::moved(dtable0, b).clone();
        embedding_forward(out, i, test::moved(table, b));
        embedding_backward(dt, test::moved(dout, b), i);
        return std::pair{test::host(out), test::host(dt)};
    });
}

std::vector<double> embedding_bound(const Tensor& ids, const Tensor& dout, const Tensor& dtable0) {
    const int64_t v = dtable0.size(0), c = dtable0.size(1);
    std::vector<double> mag(size_t(v * c)), n(size_t(v), 0.0);
    for (int64_t i = 0; i < v * c; ++i) mag[size_t(i)] = std::abs(double(dtable0.data<float>()[i]));
    for (int64_t r = 0; r < ids.numel(); ++r) {
        const int32_t id = ids.data<int32_t>()[r];
        n[size_t(id)] += 1;
        for (int64_t i = 0; i < c; ++i) mag[size_t(id * c + i)] += std::abs(double(dout.data<float>()[r * c + i]));
    }
    // n additions when the gradient row started nonzero, n - 1 from zero: gamma_n covers both.
    for (int64_t i = 0; i < v * c; ++i) mag[size_t(i)] *= gamma(int64_t(n[size_t(i / c)])) + u32;
    return mag;
}

TEST(EmbeddingOps, ForwardIsExactAndBackwardWithinTheBound) {
    std::vector<Backend> backends{Backend::cpu};
    if (test::cuda_part_runs("the embedding on cuda")) backends.push_back(Backend::cuda);
    const int64_t shapes[][3] = {{1, 1, 1}, {5, 3, 7}, {256, 17, 64}, {50, 129, 300}};  // V, C, rows
    for (const auto& s : shapes) {
        SCOPED_TRACE(::testing::Message() << "V " << s[0] << " C " << s[1] << " rows " << s[2]);
        Tensor ids = Tensor::empty({s[2]}, DType::i32);
        for (int64_t r = 0; r < s[2]; ++r) ids.data<int32_t>()[r] = int32_t((r * r + 3 * r) % s[0]);  // repeats
        const Tensor table = test::randn({s[0], s[1]}, 1), dout = test::randn({s[2], s[1]}, 2);
        for (const Tensor& dt0 : {Tensor::zeros({s[0], s[1]}, DType::f32), test::randn({s[0], s[1]}, 3)}) {
            const auto [ref_out, ref_dt] = run_embedding(Backend::ref, ids, table, dout, dt0);
            for (Backend be : backends) {
                SCOPED_TRACE(std::string(to_string(be)));
                const auto [out, dt] = run_embedding(be, ids, table, dout, dt0);
                test::expect_same("out", out, ref_out);
                test::expect_within("dtable", dt, ref_dt, embedding_bound(ids, dout, dt0));
            }
        }
    }
}

TEST(EmbeddingOps, ADroppedRepeatExceedsTheBound) {
    const Tensor ids = Tensor::from(std::vector<int32_t>{0, 3, 3, 5, 1, 0, 3}, {7});
    const Tensor table = test::randn({6, 4}, 1), dout = test::randn({7, 4}, 2), dt0 = Tensor::zeros({6, 4}, DType::f32);
    const auto [ref_out, ref_dt] = run_embedding(Backend::ref, ids, table, dout, dt0);
    Tensor dropped = dout.clone();
    for (int64_t i = 0; i < 4; ++i) dropped.set({6, i}, 0.0f);  // the third row of id 3
    test::expect_caught("dropped repeat", run_embedding(Backend::cpu, ids, table, dropped, dt0).second, ref_dt,
                        embedding_bound(ids, dout, dt0));
}

TEST(EmbeddingOps, ErrorsNameTheArgument) {
    const Tensor table = test::randn({4, 3}, 1);
    test::expect_error([&] { embedding_forward(Tensor::empty({2, 3}, DType::f32), Tensor::from(std::vector<int32_t>{1, 4}, {2}), table); },
                       "ids[1] is 4, expected a value in [0, 4)");
    test::expect_error([&] { embedding_forward(Tensor::empty({2, 4}, DType::f32), Tensor::zeros({2}, DType::i32), table); },
                       "out is f32 [2, 4], expected f32 [2, 3]");
    test::expect_error([&] { embedding_forward(Tensor::empty({2, 3}, DType::f32), Tensor::zeros({2}, DType::f32), table); },
                       "ids is f32 [2], expected an i32");
}

}  // namespace
}  // namespace fp8kit
