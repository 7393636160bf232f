// bench/bench_layers.cpp: the layer ops of <fp8kit/ops.hpp> on the cpu backend - one section per
// family (matmul f32 and bf16, layernorm, rmsnorm, gelu, attention, crossentropy, embedding,
// adamw), forward and backward, at the shapes of fp8kit's own GPT training (rows = batch x
// context = 1024, width 128 .. 768) and larger, on all threads. Each case is run once on the
// reference backend too (untimed) and reports max_rel_err = max |cpu - ref| / max |ref| over its
// outputs, so a benchmark that computes the wrong thing shows it (the bounds themselves are
// tests/ops/test_<family>.cpp's).
//
// Columns: seconds (best of repeated runs), rate and its unit: GFLOP/s for matmul (2 M N K) and
// attention (4 B NH T^2 hs / 2: the causal half of the two products, forward; twice that
// backward), GB/s for the rest (bytes of the tensors read and written once).
// --quick: the training shapes only and short budgets (~10 s on 2 cores).
// Run by `bench_layers [--json] [--quick]` and `fp8kit bench layers`. Results: docs/PERF.md.
#include <algorithm>
#include <cmath>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "common.hpp"
#include "fp8kit/backend.hpp"
#include "fp8kit/ops.hpp"
#include "fp8kit/runtime.hpp"

namespace fp8kit::bench {

namespace {

constexpr uint32_t seed = 4242;

Tensor normal(const Shape& shape, uint32_t s, DType dtype = DType::f32) {
    int64_t rows = 1;
    for (size_t d = 0; d + 1 < shape.size(); ++d) rows *= shape[d];
    return normal_tensor(rows, shape.back(), dtype, s).reshape(shape);
}

// max |a - b| / max |b| over the outputs of a case (f32 tensors).
double rel_err(const std::vector<Tensor>& got, const std::vector<Tensor>& ref) {
    double err = 0, mag = 0;
    for (size_t t = 0; t < got.size(); ++t) {
        const float* g = got[t].data<float>();
        const float* r = ref[t].data<float>();
        for (int64_t i = 0; i < got[t].numel(); ++i) {
            err = std::max(err, std::abs(double(g[i]) - double(r[i])));
            mag = std::max(mag, std::abs(double(r[i])));
        }
    }
    return mag > 0 ? err / mag : err;
}

struct Runner {
    const Options& opt;
    std::vector<Row> rows;

    // make() builds fresh outputs (and inputs they update), run(outputs) computes them.
    // `work` is flops or bytes per call, `unit` "GFLOP/s" or "GB/s".
    void add(const std::string& op, const std::string& shape, double work, const char* unit,
             const std::function<std::vector<Tensor>()>& make, const std::function<void(const std::vector<Tensor>&)>& run) {
        std::vector<Tensor> ref = make();
        {
            const BackendOverride use(Backend::ref);
            run(ref);
        }
        const BackendOverride use(Backend::cpu);
        std::vector<Tensor> out = make();
        run(out);
        const double err = rel_err(out, ref);
        const double s = best_seconds([&] { run(out); }, opt.quick ? 0.3 : 1.0);
        Row r;
        r.add("bench", "layers").add("op", op).add("shape", shape).add("threads", (long long)num_threads());
        r.add("seconds", s, 6).add("rate", work / s * 1e-9, 2).add("unit", unit).add("max_rel_err", err, 3);
        rows.push_back(std::move(r));
    }
};

std::string dims(std::initializer_list<int64_t> d) {
    std::string s;
    for (int64_t x : d) {
        if (!s.empty()) s += 'x';
        s += std::to_string(x);
    }
    return s;
}

}  // namespace

int run_layers(const Options& opt, std::ostream& os) {
    Runner b{opt, {}};
    const std::vector<int64_t> widths = opt.quick ? std::vector<int64_t>{128} : std::vector<int64_t>{128, 768};
    const int64_t rows = 1024;  // batch 16 x context 64: fp8kit train's default
    for (int64_t c : widths) {
        const double f4 = 4.0;
        // ---- matmul: the Linear forward out = x . W^T and the two backward products ----
        for (DType dt : {DType::f32, DType::bf16}) {
            const Tensor x = normal({rows, c}, seed, dt), w = normal({4 * c, c}, seed + 1, dt), g = normal({rows, 4 * c}, seed + 2, dt);
            const std::string name = dt == DType::f32 ? "matmul.f32" : "matmul.bf16";
            const double flops = 2.0 * double(rows) * double(4 * c) * double(c);
            b.add(name + ".forward", dims({rows, 4 * c, c}), flops, "GFLOP/s",
                  [&] { return std::vector<Tensor>{Tensor::empty({rows, 4 * c}, DType::f32)}; },
                  [&](const std::vector<Tensor>& o) { matmul(o[0], x, w, {.transpose_b = true}); });
            b.add(name + ".dinp", dims({rows, c, 4 * c}), flops, "GFLOP/s",
                  [&] { return std::vector<Tensor>{Tensor::empty({rows, c}, DType::f32)}; },
                  [&](const std::vector<Tensor>& o) { matmul(o[0], g, w); });
            b.add(name + ".dweight", dims({4 * c, c, rows}), flops, "GFLOP/s",
                  [&] { return std::vector<Tensor>{Tensor::zeros({4 * c, c}, DType::f32)}; },
                  [&](const std::vector<Tensor>& o) { matmul(o[0], g, x, {.transpose_a = true}); });
        }
        const Tensor x = normal({rows, c}, seed), w = normal({c}, seed + 1), bias = normal({c}, seed + 2), g = normal({rows, c}, seed + 3);
        const double row_bytes = f4 * double(rows * c);
        // ---- layernorm / rmsnorm ----
        b.add("layernorm.forward", dims({rows, c}), 2 * row_bytes, "GB/s",
              [&] { return std::vector<Tensor>{Tensor::empty({rows, c}, DType::f32), Tensor::empty({rows}, DType::f32), Tensor::empty({rows}, DType::f32)}; },
              [&](const std::vector<Tensor>& o) { layernorm_forward(o[0], o[1], o[2], x, w, bias); });
        Tensor mean = Tensor::empty({rows}, DType::f32), rstd = Tensor::empty({rows}, DType::f32), tmp = Tensor::empty({rows, c}, DType::f32);
        layernorm_forward(tmp, mean, rstd, x, w, bias);
        b.add("layernorm.backward", dims({rows, c}), 3 * row_bytes, "GB/s",
              [&] { return std::vector<Tensor>{Tensor::empty({rows, c}, DType::f32), Tensor::zeros({c}, DType::f32), Tensor::zeros({c}, DType::f32)}; },
              [&](const std::vector<Tensor>& o) { layernorm_backward(o[0], o[1], o[2], g, x, w, mean, rstd); });
        b.add("rmsnorm.forward", dims({rows, c}), 2 * row_bytes, "GB/s",
              [&] { return std::vector<Tensor>{Tensor::empty({rows, c}, DType::f32), Tensor::empty({rows}, DType::f32)}; },
              [&](const std::vector<Tensor>& o) { rmsnorm_forward(o[0], o[1], x, w); });
        // ---- gelu (the MLP's 4C activations) ----
        const Tensor h = normal({rows, 4 * c}, seed + 4), gh = normal({rows, 4 * c}, seed + 5);
        b.add("gelu.forward", dims({rows, 4 * c}), 8 * row_bytes, "GB/s",
              [&] { return std::vector<Tensor>{Tensor::empty({rows, 4 * c}, DType::f32)}; },
              [&](const std::vector<Tensor>& o) { gelu_forward(o[0], h); });
        b.add("gelu.backward", dims({rows, 4 * c}), 12 * row_bytes, "GB/s",
              [&] { return std::vector<Tensor>{Tensor::empty({rows, 4 * c}, DType::f32)}; },
              [&](const std::vector<Tensor>& o) { gelu_backward(o[0], h, gh); });
        // ---- attention: batch 16, context 64, heads 4 ----
        const int64_t bt = 16, t = rows / 16, nh = 4;
        const Tensor qkv = normal({bt, t, 3 * c}, seed + 6), ga = normal({bt, t, c}, seed + 7);
        const double att_flops = 2.0 * double(bt) * double(t) * double(t) * double(c);  // causal half of 2 products
        b.add("attention.forward", dims({bt, t, c, nh}), att_flops, "GFLOP/s",
              [&] { return std::vector<Tensor>{Tensor::empty({bt, t, c}, DType::f32), Tensor::empty({bt, nh, t, t}, DType::f32)}; },
              [&](const std::vector<Tensor>& o) { attention_forward(o[0], o[1], qkv, nh); });
        Tensor att = Tensor::empty({bt, nh, t, t}, DType::f32), aout = Tensor::empty({bt, t, c}, DType::f32);
        attention_forward(aout, att, qkv, nh);
        b.add("attention.backward", dims({bt, t, c, nh}), 2 * att_flops, "GFLOP/s",
              [&] { return std::vector<Tensor>{Tensor::empty({bt, t, 3 * c}, DType::f32)}; },
              [&](const std::vector<Tensor>& o) { attention_backward(o[0], ga, qkv, att, nh); });
        // ---- cross-entropy over a vocabulary of 32 c ----
        const int64_t v = 32 * c;
        const Tensor logits = normal({rows, v}, seed + 8);
        Tensor targets = Tensor::empty({rows}, DType::i32);
        for (int64_t r = 0; r < rows; ++r) targets.data<int32_t>()[r] = int32_t((r * 7919) % v);
        b.add("crossentropy.forward", dims({rows, v}), 2 * f4 * double(rows * v), "GB/s",
              [&] { return std::vector<Tensor>{Tensor::empty({rows}, DType::f32), Tensor::empty({rows, v}, DType::f32)}; },
              [&](const std::vector<Tensor>& o) { crossentropy_forward(o[0], o[1], logits, targets); });
        Tensor probs = Tensor::empty({rows, v}, DType::f32), losses = Tensor::empty({rows}, DType::f32);
        crossentropy_forward(losses, probs, logits, targets);
        b.add("crossentropy.backward", dims({rows, v}), 2 * f4 * double(rows * v), "GB/s",
              [&] { return std::vector<Tensor>{Tensor::empty({rows, v}, DType::f32)}; },
              [&](const std::vector<Tensor>& o) { crossentropy_backward(o[0], probs, targets, 1.0f / float(rows)); });
        // ---- embedding: a table of v rows ----
        const Tensor table = normal({v, c}, seed + 9);
        b.add("embedding.forward", dims({rows, c}), 2 * row_bytes, "GB/s",
              [&] { return std::vector<Tensor>{Tensor::empty({rows, c}, DType::f32)}; },
              [&](const std::vector<Tensor>& o) { embedding_forward(o[0], targets, table); });
        b.add("embedding.backward", dims({rows, c}), 3 * row_bytes, "GB/s",
              [&] { return std::vector<Tensor>{Tensor::zeros({v, c}, DType::f32)}; },
              [&](const std::vector<Tensor>& o) { embedding_backward(o[0], g, targets); });
        // ---- adamw over 12 c^2 parameters (a transformer block's) ----
        const int64_t n = 12 * c * c;
        const Tensor grad = normal({n / c, c}, seed + 10), p0 = normal({n / c, c}, seed + 11);
        b.add("adamw", dims({n}), 7 * f4 * double(n), "GB/s",
              [&] { return std::vector<Tensor>{p0.clone(), Tensor::zeros({n / c, c}, DType::f32), Tensor::zeros({n / c, c}, DType::f32)}; },
              [&](const std::vector<Tensor>& o) { adamw_update(o[0], grad, o[1], o[2], {.lr = 1e-3f, .weight_decay = 0.1f}); });
    }
    print_rows(os, b.rows, opt.json);
    return 0;
}

}  // namespace fp8kit::bench
