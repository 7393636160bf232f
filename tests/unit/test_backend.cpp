// tests/unit/test_backend.cpp: dispatch by device (src/core/backend.cpp) - the backend follows the
// inputs' device, inputs on two devices are refused naming both, BackendOverride is scoped and
// per thread, the ExecContext reaches the calling thread only - and the tensor model the
// bindings rely on: read-only storage, external strided memory with an owner, amax and delayed
// scales held in tensors.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <thread>
#include <vector>

#include "fp8kit/fp8kit.hpp"
#include "support.hpp"

namespace fp8kit::test {
namespace {

// A tensor that claims to live on the GPU, over host memory that is never touched: enough to test
// the dispatch, which refuses before any backend could read it.
Tensor fake_cuda(std::vector<float>& host, Shape shape) {
    return Tensor::from_external(nullptr, {host.data(), std::move(shape), {}, DType::f32, Device::cuda, false, "g"});
}

TEST(Backend, HostTensorsRunOnCpuUnlessOverridden) {
    if (std::getenv("FP8KIT_BACKEND") != nullptr) GTEST_SKIP() << "FP8KIT_BACKEND is set in this environment";
    EXPECT_EQ(backend_for(Device::cpu), Backend::cpu);
    {
        const BackendOverride use(Backend::ref);
        EXPECT_EQ(backend_for(Device::cpu), Backend::ref);
        {
            const BackendOverride nested(Backend::cpu);
            EXPECT_EQ(backend_for(Device::cpu), Backend::cpu);
        }
        EXPECT_EQ(backend_for(Device::cpu), Backend::ref);
    }
    EXPECT_EQ(backend_for(Device::cpu), Backend::cpu);
    expect_error([] { BackendOverride bad(Backend::cuda); }, "cuda");
}

TEST(Backend, OverrideIsPerThread) {
    if (std::getenv("FP8KIT_BACKEND") != nullptr) GTEST_SKIP() << "FP8KIT_BACKEND is set in this environment";
    const BackendOverride use(Backend::ref);
    std::atomic<int> seen{-1};
    std::thread other([&] { seen = int(backend_for(Device::cpu)); });
    other.join();
    EXPECT_EQ(seen.load(), int(Backend::cpu)) << "another thread saw this thread's override";
    EXPECT_EQ(backend_for(Device::cpu), Backend::ref);
}

TEST(Backend, ContextIsPerThreadAndScoped) {
    int stream_a = 0, stream_b = 0;
    EXPECT_EQ(current_context().stream, nullptr);
    {
        const ContextGuard g(ExecContext{&stream_a});
        EXPECT_EQ(current_context().stream, &stream_a);
        {
            const ContextGuard h(ExecContext{&stream_b});
            EXPECT_EQ(current_context().stream, &stream_b);
        }
        EXPECT_EQ(current_context().stream, &stream_a);
        void* seen = &stream_b;
        std::thread other([&] { seen = current_context().stream; });
        other.join();
        EXPECT_EQ(seen, nullptr);
    }
    EXPECT_EQ(current_context().stream, nullptr);
}

TEST(Backend, InputsOnTwoDevicesAreRefusedNamingBoth) {
    std::vector<float> host(64, 1.0f);
    const Tensor g = fake_cuda(host, {8, 8});
    const Tensor h = Tensor::full({8, 8}, 1.0f);
    const QTensor qh = quantize(h);
    QTensor mixed = qh;
    mixed.scale_inv = Tensor::from_external(nullptr, {host.data(), {1, 1}, {}, DType::f32, Device::cuda, false, "s"});
    expect_error([&] { (void)dequantize(mixed); }, "data is on cpu but scale_inv is on cuda");
    // The fused GEMM: a device A against a host weight.
    expect_error([&] { (void)gemm({g, QuantizeOptions{}}, PackedWeight(qh)); }, "A is on cuda but B is on cpu");
    // A host A into an output on the device.
    expect_error([&] { gemm({h, QuantizeOptions{}}, PackedWeight(qh), {}, g); }, "but out is on cuda");
    // Every input on the device of a backend this build lacks: a clear error, not a crash.
    expect_error([&] { (void)quantize(g); }, "no CUDA backend");
    // The delayed scale must be where the input is.
    QuantizeOptions o;
    o.scale = Tensor::from_external(nullptr, {host.data(), {1}, {}, DType::f32, Device::cuda, false, "scale"});
    expect_error([&] { (void)quantize(h, o); }, "x is on cpu but scale is on cuda");
}

TEST(Tensor, ReadOnlyMemoryIsReadableAndRefusesWritesNamingTheTensor) {
    const std::vector<float> values{1.0f, -2.0f, 3.0f, 500.0f};
    const Tensor t = Tensor::view_of(nullptr, values.data(), {2, 2}, DType::f32, "blocks.0.fc.weight");
    EXPECT_TRUE(t.read_only());
    EXPECT_EQ(t.data<const float>()[3], 500.0f);
    EXPECT_EQ(t.get({1, 0}), 3.0f);
    expect_error([&] { (void)t.data<float>(); }, "'blocks.0.fc.weight'");
    expect_error([&] { t.set({0, 0}, 1.0f); }, "read-only");
    expect_error([&] { (void)t.raw_data(); }, "read-only");
    // Reading operations work on it, and their outputs are ordinary tensors.
    const QTensor q = quantize(t);
    EXPECT_FALSE(q.data.read_only());
    EXPECT_EQ(q.amax.get({0}), 500.0f);
    const Tensor c = t.clone();
    EXPECT_FALSE(c.read_only());
    c.set({0, 0}, 7.0f);  // the copy is writable
    EXPECT_EQ(values[0], 1.0f);
    // A GEMM refuses to write into it.
    expect_error([&] { gemm({Tensor::full({2, 2}, 1.0f), QuantizeOptions{}}, PackedWeight(q), {}, t); }, "read-only");
}

TEST(Tensor, ExternalStridedMemoryWithOwner) {
    // A column-major [3, 4] array (numpy's order='F'): strides {1, 3}.
    auto storage = std::make_shared<std::vector<float>>(12);
    for (int i = 0; i < 12; ++i) (*storage)[size_t(i)] = float(i) - 5.5f;
    std::weak_ptr<std::vector<float>> alive = storage;
    Tensor t = Tensor::from_external(storage, {storage->data(), {3, 4}, {1, 3}, DType::f32, Device::cpu, false, "x"});
    storage.reset();
    ASSERT_FALSE(alive.expired()) << "the tensor must keep its owner alive";
    EXPECT_FALSE(t.is_contiguous());
    EXPECT_EQ(t.get({1, 2}), float(1 + 2 * 3) - 5.5f);
    // Ops read it as the logical [3, 4] matrix: the same codes as its contiguous copy.
    const Tensor c = t.contiguous();
    QuantizeOptions row;
    row.scaling = Scaling::row();
    const QTensor a = quantize(t, row), b = quantize(c, row);
    for (int64_t i = 0; i < 3; ++i) {
        for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(a.data.at<uint8_t>({i, j}), b.data.at<uint8_t>({i, j}));
    }
    t = Tensor();
    EXPECT_TRUE(alive.expired()) << "the owner outlived the last tensor using its memory";
    float x = 0.0f;
    expect_error([&] { (void)Tensor::from_external(nullptr, {&x, {2, 2}, {-1, 1}, DType::f32, Device::cpu, false, ""}); },
                 "negative");
    expect_error([&] { (void)Tensor::from_external(nullptr, {&x, {2, 2}, {1}, DType::f32, Device::cpu, false, ""}); },
                 "do not match");
}

TEST(Scales, AmaxAndDelayedStateAreTensors) {
    const Tensor x = Tensor::from(std::vector<float>{1.0f, -8.0f, 2.0f, 0.5f}, {2, 2});
    const QTensor q = quantize(x);
    ASSERT_TRUE(q.amax.defined());
    EXPECT_EQ(q.amax.shape(), Shape{1});
    EXPECT_EQ(q.amax.dtype(), DType::f32);
    EXPECT_EQ(q.amax.get({0}), 8.0f);
    DelayedScaling d(Recipe::delayed(4), Role::input);
    EXPECT_TRUE(d.fresh());
    EXPECT_EQ(d.scale().get({0}), 1.0f);
    (void)d.quantize(x);
    EXPECT_FALSE(d.fresh());
    EXPECT_EQ(d.amax_history().get({0}), 8.0f);
    d.step();
    EXPECT_EQ(d.scale().get({0}), 448.0f / 8.0f);  // TransformerEngine's formula: fp8_max / amax
    EXPECT_EQ(d.amax_history().get({0}), 0.0f);
    EXPECT_EQ(d.amax_history().get({1}), 8.0f);
    // The given scale is read from its tensor: the codes are x * 56 encoded.
    const QTensor qd = d.quantize(x);
    EXPECT_EQ(qd.data.get({0, 1}), -448.0f);
    EXPECT_EQ(qd.scale_inv.get({0, 0}), 1.0f / 56.0f);
}

}  // namespace
}  // namespace fp8kit::test
