// bench/compare_libs.cpp: two builds of libfp8kit in one process, timed call by call in pairs.
//
// compare_builds.py times two `fp8kit` commands one after the other; on a shared machine the
// noise between two runs (+-20 %) hides a 3 % difference. Here both builds are loaded at once
// (each as a shared library made of its libfp8kit.a and this file's shim half, symbols local), and
// every round calls base then new, or new then base, on the same inputs, so both see the same
// moment of the machine. Per case it prints each build's best call and the median over rounds of
// base time / new time (> 1: new is faster). Before timing it checks that both builds return the
// same result hash (every byte of the GEMM output or the quantized codes and scales, or the
// training losses): item 9 of issue 16 asks for the same results bit for bit and no slower.
//
// This file is both halves: built with FP8KIT_PAIR_SHIM it is the shim (setup / run of one case
// against the fp8kit it is compiled with); without, the driver. bench/compare_libs.py builds both
// from two source trees with release builds and runs the driver. Not run by ctest (speed is never
// asserted in tests); results: docs/PERF.md.
#include <cstdint>
#include <cstring>

#if defined(FP8KIT_PAIR_SHIM)

#include <memory>
#include <string>
#include <vector>

#include "fp8kit/gemm.hpp"
#include "fp8kit/recipe.hpp"
#include "fp8kit/runtime.hpp"
#if __has_include("gpt/gpt.hpp")  // the GPT application lives in tools/gpt since issue 16 item 4
#include "gpt/gpt.hpp"
namespace gpt = fp8kit::gpt;
#else
#include "fp8kit/nn.hpp"
namespace gpt = fp8kit::nn;
#endif

namespace {

using namespace fp8kit;

uint64_t fnv1a(const void* p, size_t n, uint64_t h = 1469598103934665603ull) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

// A tensor's bytes, read-only where the build has that accessor (older builds: raw_data()).
template <class T>
const void* bytes_of(const T& t) {
    if constexpr (requires { t.const_raw_data(); }) {
        return t.const_raw_data();
    } else {
        return t.raw_data();
    }
}

// Deterministic, roughly N(0, 1) (a sum of 4 uniforms, centred and scaled): the same in every build.
Tensor normal(int64_t rows, int64_t cols, uint32_t seed) {
    std::vector<float> v(size_t(rows * cols));
    uint32_t r = seed;
    for (float& x : v) {
        float s = 0.0f;
        for (int i = 0; i < 4; ++i) {
            r = r * 1664525u + 1013904223u;
            s += float(r >> 8) * (1.0f / 16777216.0f);
        }
        x = (s - 2.0f) * 1.7320508f;
    }
    return Tensor::from(std::span<const float>(v), {rows, cols});
}

struct Case {
    std::string kind;  // gemm, gemm_fused, quantize, train
    Tensor a, w;
    std::unique_ptr<PackedWeight> packed;
    QTensor qa;
    QuantizeOptions input;
    int steps = 0;
    std::string recipe;
};
Case* current = nullptr;

}  // namespace

// kind: gemm (A quantized beforehand), gemm_fused (A f32, cast inside the GEMM), quantize (A),
// train (m steps of the built-in GPT with recipe `recipe`). Tensorwise e4m3 recipes.
extern "C" FP8KIT_PAIR_EXPORT void pair_setup(const char* kind, int64_t m, int64_t n, int64_t k, const char* recipe,
                                              int threads) {
    set_num_threads(threads);
    delete current;
    current = new Case;
    Case& c = *current;
    c.kind = kind;
    if (c.kind == "train") {
        c.steps = int(m);
        c.recipe = recipe;
        return;
    }
    c.input = Recipe::tensorwise().options(Role::input);
    c.a = normal(m, k, 1);
    if (c.kind == "quantize") return;
    c.w = normal(n, k, 2);
    c.packed = std::make_unique<PackedWeight>(quantize(c.w, Recipe::tensorwise().options(Role::weight)));
    c.qa = quantize(c.a, c.input);
}

// One timed call; returns the hash of everything it produced.
extern "C" FP8KIT_PAIR_EXPORT uint64_t pair_run() {
    Case& c = *current;
    if (c.kind == "train") {
        gpt::TrainConfig config;
        config.steps = c.steps;
        config.eval_batches = 1;
        const gpt::TrainResult r = gpt::train_gpt(gpt::builtin_corpus(), config, c.recipe);
        return fnv1a(r.losses.data(), r.losses.size() * sizeof(float));
    }
    if (c.kind == "quantize") {
        const QTensor q = quantize(c.a, c.input);
        return fnv1a(bytes_of(q.scale_inv), q.scale_inv.nbytes(), fnv1a(bytes_of(q.data), q.data.nbytes()));
    }
    const Tensor d = c.kind == "gemm" ? gemm(c.qa, *c.packed) : gemm({c.a, c.input}, *c.packed);
    return fnv1a(bytes_of(d), d.nbytes());
}

#else  // the driver

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using Setup = void (*)(const char*, int64_t, int64_t, int64_t, const char*, int);
using Run = uint64_t (*)();

struct Lib {
    Setup setup;
    Run run;
};

Lib load(const char* path) {
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
        std::fprintf(stderr, "compare_libs: cannot load %s: %s\n", path, dlerror());
        std::exit(2);
    }
    Lib lib{reinterpret_cast<Setup>(dlsym(h, "pair_setup")), reinterpret_cast<Run>(dlsym(h, "pair_run"))};
    if (lib.setup == nullptr || lib.run == nullptr) {
        std::fprintf(stderr, "compare_libs: %s has no pair_setup / pair_run (not built from bench/compare_libs.cpp)\n", path);
        std::exit(2);
    }
    return lib;
}

struct PairCase {
    const char* kind;
    int64_t m, n, k;
    const char* recipe;
    int rounds_divisor;  // long cases (training) get fewer rounds
};

double seconds_of(Run run) {
    const auto t0 = std::chrono::steady_clock::now();
    (void)run();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: compare_libs BASE.so NEW.so [rounds] [threads]\n");
        return 2;
    }
    const int rounds = argc > 3 ? std::atoi(argv[3]) : 400;
    const int threads = argc > 4 ? std::atoi(argv[4]) : 2;
    if (rounds < 10 || threads < 1) {
        std::fprintf(stderr, "compare_libs: rounds must be >= 10 and threads >= 1\n");
        return 2;
    }
    const Lib libs[2] = {load(argv[1]), load(argv[2])};
    const PairCase cases[] = {
        {"gemm", 512, 512, 512, "", 1},          {"gemm_fused", 512, 512, 512, "", 1},
        {"gemm", 16, 4096, 4096, "", 1},         {"gemm", 1, 4096, 4096, "", 1},
        {"quantize", 4096, 0, 4096, "", 8},      {"quantize", 512, 0, 512, "", 1},
        {"train", 4, 0, 0, "f32", 40},           {"train", 4, 0, 0, "tensorwise", 40},
    };
    std::printf("| case | threads | rounds | base best (ms) | new best (ms) | best base/new | median of pairs base/new (p25-p75) |\n");
    std::printf("|---|---|---|---|---|---|---|\n");
    int failed = 0;
    for (const PairCase& c : cases) {
        for (const Lib& l : libs) l.setup(c.kind, c.m, c.n, c.k, c.recipe, threads);
        const uint64_t h0 = libs[0].run(), h1 = libs[1].run();  // also the warm-up call
        const std::string name = std::string(c.kind) + " " + std::to_string(c.m) + "x" + std::to_string(c.n) + "x" +
                                 std::to_string(c.k) + (*c.recipe ? std::string(" ") + c.recipe : std::string());
        if (h0 != h1) {
            std::printf("| %s | results differ between the builds (hash %016llx vs %016llx) |\n", name.c_str(),
                        (unsigned long long)h0, (unsigned long long)h1);
            ++failed;
            continue;
        }
        const int n = std::max(10, rounds / c.rounds_divisor);
        std::vector<double> t[2], ratio;
        for (int r = 0; r < n; ++r) {
            double s[2];
            const int first = r % 2;  // alternate which build goes first
            s[first] = seconds_of(libs[first].run);
            s[1 - first] = seconds_of(libs[1 - first].run);
            t[0].push_back(s[0]);
            t[1].push_back(s[1]);
            ratio.push_back(s[0] / s[1]);
        }
        for (auto* v : {&t[0], &t[1], &ratio}) std::sort(v->begin(), v->end());
        const auto q = [](const std::vector<double>& v, double p) { return v[size_t(p * double(v.size() - 1))]; };
        std::printf("| %s | %d | %d | %.3f | %.3f | %.3f | %.3f (%.3f-%.3f) |\n", name.c_str(), threads, n,
                    t[0][0] * 1e3, t[1][0] * 1e3, t[0][0] / t[1][0], q(ratio, 0.5), q(ratio, 0.25), q(ratio, 0.75));
        std::fflush(stdout);
    }
    return failed == 0 ? 0 : 1;
}

#endif
