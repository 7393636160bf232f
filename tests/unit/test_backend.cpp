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
    // Every input on the device of a backend this build (or machine) lacks: a clear error, not a crash.
    if (!backend_available(Backend::cuda)) expect_error([&] { (void)quantize(g); }, "is on device cuda, but");
    // The delayed scale must be where the input is.
    QuantizeOptions o;
    o.scale = Tensor::from_external(nullptr, {host.data(), {1}, {}, DType::f32, Device::cuda, false, "scale"});
    expect_error([&] { (void)quantize(h, o); }, "x is on cpu but scale is on cuda");
}

// Device tensors (a GPU present): to() and back is the same bytes, clone() copies a strided 2-d
// view and a contiguous 3-d tensor on the device, zeros() is zero, host element access is refused, and a layer op refuses a
// mix of device and host tensors, naming both.
TEST(Backend, CudaTensorsCopyAndRefuseHostAccess) {
    FP8KIT_SKIP_WITHOUT_CUDA();
    std::vector<float> v(6 * 7);
    for (size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.5f - 3.0f;
    const Tensor h = Tensor::from(v, {6, 7});
    const Tensor d = h.to(Device::cuda);
    EXPECT_EQ(d.device(), Device::cuda);
    EXPECT_EQ(backend_for(d.device()), Backend::cuda);
    const Tensor back = d.to(Device::cpu);
    EXPECT_EQ(std::memcmp(back.data<const float>(), v.data(), v.size() * 4), 0);
    const Tensor view = d.slice(0, 1, 5).slice(1, 2, 6).clone().to(Device::cpu);
    for (int64_t i = 0; i < 4; ++i) {
        for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(view.get({i, j}), h.get({i + 1, j + 2}));
    }
    const Tensor d3 = Tensor::from(v, {2, 3, 7}).to(Device::cuda).clone().to(Device::cpu);  // contiguous, 3-d
    EXPECT_EQ(std::memcmp(d3.data<const float>(), v.data(), v.size() * 4), 0);
    const Tensor z = Tensor::zeros({3, 5}, DType::bf16, Device::cuda).to(Device::cpu);
    for (int64_t i = 0; i < 15; ++i) EXPECT_EQ(z.get({i / 5, i % 5}), 0.0f);
    expect_error([&] { (void)d.get({0, 0}); }, "not in host memory");
    expect_error([&] { (void)d.transpose().clone(); }, "copy it to the host first");
    const Tensor out = Tensor::empty({6, 7}, DType::f32, Device::cuda);
    expect_error([&] { gelu_forward(out, h); }, "gelu_forward: out is on cuda but inp is on cpu");
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

// Runs every layer op, forward and backward, on fixed inputs that are read-only views of host
// vectors (inputs_read_only) or writable copies of the same values; returns all outputs.
std::vector<float> layer_ops_outputs(bool inputs_read_only) {
    std::vector<float> x(48 * 3), w(8), b(8), g(48), logits(2 * 8), bias6(6, 0.5f);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * float(i)) * 2.0f;
    for (size_t i = 0; i < w.size(); ++i) w[i] = 1.0f + 0.125f * float(i), b[i] = 0.25f * float(i) - 1.0f;
    for (size_t i = 0; i < g.size(); ++i) g[i] = std::cos(0.21f * float(i));
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(1.3f * float(i)) * 3.0f;
    const std::vector<int32_t> ids{1, 7, 0, 3, 3, 5};
    std::vector<std::vector<float>> saved;  // values an op wrote, handed to a backward as input
    const auto in = [&](const std::vector<float>& v, Shape s) {
        return inputs_read_only ? Tensor::view_of(nullptr, v.data(), std::move(s), DType::f32, "in")
                                : Tensor::from(v, std::move(s));
    };
    const auto in_of = [&](const Tensor& t) {
        saved.emplace_back(t.data<const float>(), t.data<const float>() + t.numel());
        return in(saved.back(), t.shape());
    };
    const auto in_ids = [&](size_t n) {
        return inputs_read_only ? Tensor::view_of(nullptr, ids.data(), {int64_t(n)}, DType::i32, "ids")
                                : Tensor::from(std::vector<int32_t>(ids.begin(), ids.begin() + int64_t(n)), {int64_t(n)});
    };
    saved.reserve(8);  // in_of's views point into it
    const std::vector<float> x48(x.begin(), x.begin() + 48), x48b(x.begin() + 48, x.begin() + 96),
        x64(x.begin(), x.begin() + 64);
    const Tensor rows = in(x48, {6, 8}), wt = in(w, {8}), gt = in(g, {6, 8});
    const Tensor out = Tensor::empty({6, 8}, DType::f32), mean = Tensor::empty({6}, DType::f32),
                 rstd = Tensor::empty({6}, DType::f32), dinp = Tensor::empty({6, 8}, DType::f32),
                 dw = Tensor::zeros({8}, DType::f32), db = Tensor::zeros({8}, DType::f32);
    layernorm_forward(out, mean, rstd, rows, wt, in(b, {8}));
    layernorm_backward(dinp, dw, db, gt, rows, wt, in_of(mean), in_of(rstd));
    const Tensor act = Tensor::empty({6, 8}, DType::f32), dact = Tensor::empty({6, 8}, DType::f32);
    gelu_forward(act, rows);
    gelu_backward(dact, rows, gt);
    const Tensor qkv = in(x, {2, 3, 24});  // [B, T, 3C], C = 8, two heads
    const Tensor att_out = Tensor::empty({2, 3, 8}, DType::f32), att = Tensor::empty({2, 2, 3, 3}, DType::f32),
                 dqkv = Tensor::empty({2, 3, 24}, DType::f32);
    attention_forward(att_out, att, qkv, 2);
    attention_backward(dqkv, in(g, {2, 3, 8}), qkv, in_of(att), 2);
    const Tensor lin = Tensor::empty({6, 6}, DType::f32), dlin = Tensor::empty({6, 6}, DType::f32);
    linear_forward(lin, rows, in(x48b, {6, 8}), in(bias6, {6}));
    const Tensor dwl = Tensor::zeros({6, 8}, DType::f32), dbl = Tensor::zeros({6}, DType::f32);
    linear_backward(Tensor(), dwl, dbl, in_of(lin), rows, in(x48b, {6, 8}));
    const Tensor emb = Tensor::empty({6, 8}, DType::f32), demb = Tensor::zeros({8, 8}, DType::f32);
    embedding_forward(emb, in_ids(6), in(x64, {8, 8}));
    embedding_backward(demb, gt, in_ids(6));
    const Tensor losses = Tensor::empty({2}, DType::f32), probs = Tensor::empty({2, 8}, DType::f32),
                 dlogits = Tensor::empty({2, 8}, DType::f32);
    crossentropy_forward(losses, probs, in(logits, {2, 8}), in_ids(2));
    crossentropy_backward(dlogits, in_of(probs), in_ids(2), 0.5f);
    const Tensor param = Tensor::from(w, {8}), m = Tensor::zeros({8}, DType::f32), v = Tensor::zeros({8}, DType::f32);
    adamw_update(param, in(b, {8}), m, v, {});
    std::vector<float> all;
    for (const Tensor* t : {&out, &mean, &rstd, &dinp, &dw, &db, &act, &dact, &att_out, &att, &dqkv, &lin, &dwl, &dbl,
                            &emb, &demb, &losses, &probs, &dlogits, &param, &m, &v}) {
        all.insert(all.end(), t->data<const float>(), t->data<const float>() + t->numel());
    }
    return all;
}

// A layer op only reads its inputs, so it takes them from read-only memory (weights that view a
// mapped checkpoint, a read-only numpy array) with the same results as from writable copies; its
// outputs are written, so a read-only output is refused, naming it.
TEST(Tensor, LayerOpsReadInputsFromReadOnlyMemory) {
    const std::vector<float> from_read_only = layer_ops_outputs(true), from_writable = layer_ops_outputs(false);
    ASSERT_EQ(from_read_only.size(), from_writable.size());
    for (size_t i = 0; i < from_writable.size(); ++i) {
        EXPECT_TRUE(same_float(from_read_only[i], from_writable[i])) << "output value " << i;
    }
    const std::vector<float> ones(8, 1.0f), frozen(8, 0.0f);
    expect_error([&] { gelu_forward(Tensor::view_of(nullptr, frozen.data(), {8}, DType::f32, "frozen"), Tensor::from(ones, {8})); },
                 "'frozen'");
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
    expect_error([&] { (void)Tensor::from_external(nullptr, {&x, {2, 2}, {-1, 1}, DType::f32, Device::cpu, false, "w"}); },
                 "from_external ('w'): stride -1 is negative");
    // Without an owner (the control block is one for all such tensors): defined, and two at
    // different addresses share no storage (gemm's out-overlaps-input check relies on it).
    float y[4] = {};
    const Tensor u = Tensor::from_external(nullptr, {y, {2, 2}, {}, DType::f32, Device::cpu, false, ""});
    const Tensor v = Tensor::from_external(nullptr, {&x, {1}, {}, DType::f32, Device::cpu, false, ""});
    EXPECT_TRUE(u.defined() && v.defined());
    EXPECT_FALSE(u.shares_storage_with(v));
    EXPECT_TRUE(u.shares_storage_with(Tensor::from_external(nullptr, {y, {4}, {}, DType::f32, Device::cpu, true, ""})));
    // No elements and no address (DLPack's torch.zeros(0, 16)): defined, an empty operand like any
    // other, sharing storage with no other such tensor (an empty out beside an empty A).
    const Tensor e = Tensor::from_external(nullptr, {nullptr, {0, 16}, {}, DType::f32, Device::cpu, false, ""});
    const Tensor f = Tensor::from_external(nullptr, {nullptr, {16, 0}, {}, DType::bf16, Device::cpu, true, ""});
    EXPECT_TRUE(e.defined() && f.defined());
    EXPECT_EQ(e.numel(), 0);
    EXPECT_FALSE(e.shares_storage_with(f));
    EXPECT_TRUE(Tensor::from_external(nullptr, {nullptr, {32, 0}, {1, 1}, DType::f32, Device::cpu, false, ""})
                    .is_contiguous());
    EXPECT_EQ(quantize(e, row).data.shape(), (Shape{0, 16}));
    expect_error([&] { (void)Tensor::from_external(nullptr, {nullptr, {2, 2}, {}, DType::f32, Device::cpu, false, "n"}); },
                 "from_external ('n'): data is null");
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
