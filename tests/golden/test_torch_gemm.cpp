// tests/golden/test_torch_gemm.cpp (label: golden): fp8kit::gemm against PyTorch's
// torch._scaled_mm - an outside implementation - on the same FP8 codes and scales, and both
// against the exact product of the dequantized inputs.
//
// Each test quantizes N(0,1) data with fp8kit (tensorwise, or rowwise as Recipe::rowwise does),
// hands the codes and scale_inv to tests/golden/torch_scaled_mm_oracle.py (torch on the CPU, in
// the project's .venv; scripts/setup.sh installs it), and checks every output element. With
// S = sum_k |a_ik| |b_jk| and ref = sum_k a_ik b_jk over the dequantized inputs (ref computed
// exactly in integers, then rounded once to float64), and eps = 2^-23 (float32):
//   - each implementation within c = 1 of ref, |d - ref| <= K eps S (docs/NUMERICS.md's bound for
//     one float32-accumulating GEMM): fp8kit's ref and cpu backends (every CPU code path, A
//     pre-quantized and A cast inside the GEMM) and torch's two CPU paths (oneDNN, and
//     dequantize-then-float32-GEMM);
//   - fp8kit against torch within c = 2, since each is within c = 1 of ref;
//   - the ref backend within one float32 rounding of ref: it sums in float64 and rounds once;
//   - bf16 outputs within the same bounds plus bf16's rounding, 2^-8 |ref| per rounding.
// Rows of A and B have magnitudes 2^-6 .. 2^6, so rowwise scales differ from row to row (a scale
// applied to the wrong row or column shows) and tensorwise scaling meets subnormal codes.
// Shapes include M = 1 and sizes that are multiples of no tile: torch's CPU _scaled_mm takes any
// shape (its CUDA kernels want multiples of 16). e5m2 x e5m2 is left out: fp8kit refuses it.
// Skipped (GTEST_SKIP, with the reason) when the venv's Python or its torch is missing.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "fp8kit/fp8kit.hpp"
#include "oracle.hpp"
#include "support.hpp"

using namespace fp8kit;

namespace {

static_assert(std::endian::native == std::endian::little, "the oracle's files are little-endian");

constexpr double eps_f32 = 0x1p-23;
constexpr double u_bf16 = 0x1p-8;  // bf16 unit roundoff: |bf16(x) - x| <= 2^-8 |x|

struct Case {
    int64_t m, n, k;
    QuantizeOptions oa, ob;  // A [M, K], B [N, K]
};

QuantizeOptions options(Format f, Scaling s, bool power_of_two) {
    QuantizeOptions o;
    o.format = f;
    o.scaling = s;
    o.power_of_two = power_of_two;
    return o;
}

std::string describe(const Case& c) {
    return std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) + " " +
           std::string(to_string(c.oa.format)) + " x " + std::string(to_string(c.ob.format)) + " " +
           to_string(c.oa.scaling) + (c.oa.power_of_two ? " pow2" : "");
}

// N(0,1) times a magnitude per row, 2^-6 .. 2^6 (period 13, so neighbouring rows differ).
Tensor normal_rows(int64_t rows, int64_t cols, uint64_t seed) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    Tensor t = Tensor::empty({rows, cols}, DType::f32);
    float* p = t.data<float>();
    for (int64_t i = 0; i < rows; ++i) {
        const float mag = std::ldexp(1.0f, int((i * 7) % 13) - 6);
        for (int64_t k = 0; k < cols; ++k) p[i * cols + k] = mag * normal(gen);
    }
    return t;
}

struct Quantized {
    Tensor a, b;  // f32 sources
    QTensor qa, qb;
};

Quantized make_inputs(const Case& c, uint64_t seed) {
    Quantized q;
    q.a = normal_rows(c.m, c.k, seed);
    q.b = normal_rows(c.n, c.k, seed + 1);
    q.qa = quantize(q.a, c.oa);
    q.qb = quantize(q.b, c.ob);
    return q;
}

// ---- torch._scaled_mm through the Python oracle ----

struct TorchResult {
    bool skipped = false;
    std::string message;  // why skipped, or the oracle's stderr
    // Per case: f32 (torch's dispatch), f32 (oneDNN off), bf16 (dispatch), bf16 (oneDNN off).
    std::vector<std::vector<std::vector<float>>> d;
};
constexpr const char* torch_variants[4] = {"torch f32", "torch f32 no-oneDNN", "torch bf16", "torch bf16 no-oneDNN"};

template <class T>
void put(std::string& buf, const T& v) {
    buf.append(reinterpret_cast<const char*>(&v), sizeof v);
}

uint8_t format_code(Format f) {
    if (f == Format::e4m3fn) return 0;
    if (f == Format::e5m2) return 1;
    throw Error("the torch oracle takes e4m3fn and e5m2 only");
}

// Writes the request (see the oracle's docstring), runs the oracle once for all cases, reads the
// response. Any failure other than "torch missing" is a test failure (ADD_FAILURE) with stderr.
TorchResult run_torch(const std::vector<Case>& cases, const std::vector<Quantized>& inputs, const std::string& tag) {
    TorchResult r;
    std::string req = "FP8KTMM1";
    put(req, uint32_t(cases.size()));
    for (size_t c = 0; c < cases.size(); ++c) {
        const Case& cs = cases[c];
        const Quantized& q = inputs[c];
        const bool rowwise = cs.oa.scaling.granularity == Granularity::row;
        put(req, cs.m);
        put(req, cs.n);
        put(req, cs.k);
        put(req, format_code(cs.oa.format));
        put(req, format_code(cs.ob.format));
        put(req, uint8_t(rowwise));
        put(req, uint8_t(0));
        req.append(reinterpret_cast<const char*>(q.qa.data.data<uint8_t>()), size_t(cs.m * cs.k));
        req.append(reinterpret_cast<const char*>(q.qb.data.data<uint8_t>()), size_t(cs.n * cs.k));
        req.append(reinterpret_cast<const char*>(q.qa.scale_inv.data<float>()), 4 * size_t(q.qa.scale_inv.numel()));
        req.append(reinterpret_cast<const char*>(q.qb.scale_inv.data<float>()), 4 * size_t(q.qb.scale_inv.numel()));
    }
    const std::string stem = test::unique_temp_stem("torch_" + tag);
    const std::filesystem::path req_path = stem + ".req", resp_path = stem + ".resp";
    std::ofstream(req_path, std::ios::binary).write(req.data(), std::streamsize(req.size()));
    const test::OracleRun run = test::run_oracle(FP8KIT_PYTHON, FP8KIT_TORCH_ORACLE, {req_path.string(), resp_path.string()});
    const std::string resp = test::read_file(resp_path);
    std::filesystem::remove(req_path);
    std::filesystem::remove(resp_path);
    r.message = run.message;
    if (run.outcome == test::OracleRun::Outcome::skipped) {
        r.skipped = true;
        return r;
    }
    if (run.outcome == test::OracleRun::Outcome::failed) {
        ADD_FAILURE() << run.message;
        return r;
    }
    size_t want = 8;
    for (const Case& cs : cases) want += 4 * 4 * size_t(cs.m * cs.n);
    if (resp.size() != want || resp.compare(0, 8, "FP8KTMM1") != 0) {
        ADD_FAILURE() << "the oracle's response has " << resp.size() << " bytes, expected " << want;
        return r;
    }
    size_t pos = 8;
    for (const Case& cs : cases) {
        std::vector<std::vector<float>> per(4, std::vector<float>(size_t(cs.m * cs.n)));
        for (auto& v : per) {
            std::memcpy(v.data(), resp.data() + pos, 4 * v.size());
            pos += 4 * v.size();
        }
        r.d.push_back(std::move(per));
    }
    std::printf("%s", r.message.c_str());  // torch's version and CPU paths, for the log
    return r;
}

// ---- the exact reference ----

// ref and S of every output element. Every e4m3fn and e5m2 value is an integer multiple of 2^-16,
// so code values times 2^16 are integers below 2^32 and their dot products are exact in 128 bits;
// the only rounding is the final conversion to double and the product with sa * sb (exact in
// double: 24-bit times 24-bit).
struct Reference {
    std::vector<double> ref, mag;  // [M * N]
};

std::vector<int64_t> scaled_codes(const QTensor& q) {
    const int64_t n = q.data.numel();
    const uint8_t* codes = q.data.data<uint8_t>();
    std::vector<int64_t> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
        const float x = decode(codes[i], q.format());
        if (!std::isfinite(x)) throw Error("non-finite code in a GEMM input");
        v[size_t(i)] = int64_t(double(x) * 65536.0);
    }
    return v;
}

Reference reference(const Case& c, const Quantized& q) {
    const std::vector<int64_t> a = scaled_codes(q.qa), b = scaled_codes(q.qb);
    const float* sa = q.qa.scale_inv.data<float>();
    const float* sb = q.qb.scale_inv.data<float>();
    const bool row_a = c.oa.scaling.granularity == Granularity::row;  // else one scale
    const bool row_b = c.ob.scaling.granularity == Granularity::row;
    Reference r;
    r.ref.resize(size_t(c.m * c.n));
    r.mag.resize(size_t(c.m * c.n));
    for (int64_t i = 0; i < c.m; ++i) {
        for (int64_t j = 0; j < c.n; ++j) {
            __int128 dot = 0, abs_dot = 0;
            for (int64_t k = 0; k < c.k; ++k) {
                const int64_t p = a[size_t(i * c.k + k)] * b[size_t(j * c.k + k)];
                dot += p;
                abs_dot += p < 0 ? -p : p;
            }
            const double s = double(sa[row_a ? i : 0]) * double(sb[row_b ? j : 0]) * 0x1p-32;
            r.ref[size_t(i * c.n + j)] = double(dot) * s;
            r.mag[size_t(i * c.n + j)] = double(abs_dot) * std::fabs(s);
        }
    }
    return r;
}

// Checks |got - want| <= c K eps S + rel |ref| for every element (NaN fails); reports the first
// few violations and returns the largest fraction of the bound used (1 = at the bound).
double check(const std::string& what, const std::vector<float>& got, const std::vector<double>& want,
             const Reference& r, const Case& cs, double c, double rel) {
    double worst = 0.0;
    int failures = 0;
    for (size_t e = 0; e < got.size(); ++e) {
        const double err = std::fabs(double(got[e]) - want[e]);
        const double bound = c * double(cs.k) * eps_f32 * r.mag[e] + rel * std::fabs(r.ref[e]);
        if (!(err <= bound)) {
            if (++failures <= 5) {
                ADD_FAILURE() << what << " at (" << e / size_t(cs.n) << ", " << e % size_t(cs.n) << "): got "
                              << got[e] << ", expected " << want[e] << " (ref " << r.ref[e] << ", S " << r.mag[e]
                              << "): |error| " << err << " > bound " << bound;
            }
        }
        if (bound > 0) worst = std::max(worst, err / bound);
    }
    EXPECT_EQ(failures, 0) << what << ": elements outside the bound";
    return std::isnan(worst) ? 1e300 : worst;
}

std::vector<float> as_floats(const Tensor& t) {
    std::vector<float> v(size_t(t.numel()));
    if (t.dtype() == DType::f32) {
        std::copy_n(t.data<float>(), v.size(), v.begin());
    } else {
        const bf16* p = t.data<bf16>();
        for (size_t i = 0; i < v.size(); ++i) v[i] = float(p[i]);
    }
    return v;
}

std::vector<double> as_doubles(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// fp8kit's outputs for one case: name -> D, f32 and bf16.
struct Output {
    std::string name;
    Backend backend;
    bool bf16;
    std::vector<float> d;
};

std::vector<Output> fp8kit_outputs(const Case& cs, const Quantized& q) {
    std::vector<Output> out;
    GemmOptions f32_out, bf16_out;
    bf16_out.out_dtype = DType::bf16;
    for (Backend be : {Backend::ref, Backend::cpu}) {
        const BackendOverride use(be);
        auto run = [&](const std::string& name) {
            out.push_back({name, be, false, as_floats(gemm(q.qa, q.qb, f32_out))});
            out.push_back({name + " fused cast", be, false, as_floats(gemm(GemmA(q.a, cs.oa), q.qb, f32_out))});
            out.push_back({name, be, true, as_floats(gemm(q.qa, q.qb, bf16_out))});
        };
        if (be == Backend::ref) {
            run("fp8kit ref");
        } else {
            test::for_each_isa([&](Isa isa) { run("fp8kit cpu " + std::string(to_string(isa))); });
        }
    }
    return out;
}

// Runs every case through torch and fp8kit and checks all the bounds above. Prints one line per
// case with the largest error of each implementation as a fraction of K eps S.
void compare_with_torch(const std::vector<Case>& cases, const std::string& tag) {
    std::vector<Quantized> inputs;
    for (size_t c = 0; c < cases.size(); ++c) inputs.push_back(make_inputs(cases[c], 1000 + 17 * c));
    const TorchResult torch = run_torch(cases, inputs, tag);
    if (torch.skipped) GTEST_SKIP() << "torch._scaled_mm oracle unavailable: " << torch.message;
    ASSERT_EQ(torch.d.size(), cases.size());

    for (size_t c = 0; c < cases.size(); ++c) {
        const Case& cs = cases[c];
        SCOPED_TRACE(describe(cs));
        const Reference r = reference(cs, inputs[c]);
        // The data are not degenerate: every output has products to sum.
        ASSERT_GT(*std::min_element(r.mag.begin(), r.mag.end()), 0.0);

        // The largest fraction of its bound each group of checks used, for the log.
        std::vector<std::pair<std::string, double>> used;
        auto note = [&used](const std::string& group, double fraction) {
            for (auto& g : used) {
                if (g.first == group) {
                    g.second = std::max(g.second, fraction);
                    return;
                }
            }
            used.emplace_back(group, fraction);
        };
        // torch: each path within c = 1 of ref (bf16: plus its one rounding).
        for (int v = 0; v < 4; ++v) {
            const bool is_bf16 = v >= 2;
            note(is_bf16 ? "torch bf16" : "torch f32",
                 check(torch_variants[v], torch.d[c][size_t(v)], r.ref, r, cs, is_bf16 ? 1 + u_bf16 : 1.0,
                       is_bf16 ? u_bf16 : 0.0));
        }
        for (const Output& o : fp8kit_outputs(cs, inputs[c])) {
            const std::string name = o.name + (o.bf16 ? " bf16" : " f32");
            const bool is_ref = o.backend == Backend::ref;
            const std::string group = std::string(is_ref ? "fp8kit ref" : "fp8kit cpu") + (o.bf16 ? " bf16" : " f32");
            if (!o.bf16) {
                // ref sums in float64: one float32 rounding of ref, plus float64's own (K 2^-52 S).
                // The others: one float32-accumulating GEMM, c = 1.
                note(group, check(name, o.d, r.ref, r, cs, is_ref ? 0x1p-29 : 1.0, is_ref ? eps_f32 : 0.0));
                // Against both torch paths, c = 2.
                for (int v = 0; v < 2; ++v) {
                    note("fp8kit-torch f32", check(name + " vs " + torch_variants[v], o.d,
                                                   as_doubles(torch.d[c][size_t(v)]), r, cs, 2.0, 0.0));
                }
            } else {
                // ref: float64 -> float32 -> bf16 (bf16 rounding of a float32 rounding).
                note(group, check(name, o.d, r.ref, r, cs, is_ref ? 0x1p-29 : 1 + u_bf16,
                                  is_ref ? eps_f32 + u_bf16 : u_bf16));
                for (int v = 2; v < 4; ++v) {
                    note("fp8kit-torch bf16", check(name + " vs " + torch_variants[v], o.d,
                                                    as_doubles(torch.d[c][size_t(v)]), r, cs, 2 * (1 + u_bf16),
                                                    2 * u_bf16));
                }
            }
        }
        std::string line = describe(cs) + ": bound used:";
        for (const auto& g : used) {
            char buf[64];
            std::snprintf(buf, sizeof buf, " %s %.2g,", g.first.c_str(), g.second);
            line += buf;
        }
        line.pop_back();
        std::printf("%s\n", line.c_str());
    }
}

// The shapes: a single row (M = 1, a decode step), and sizes that are multiples of no kernel tile
// next to tile-friendly ones; K up to 1024 so that float32 accumulation error is visible.
struct Shape3 {
    int64_t m, n, k;
};
constexpr Shape3 shapes[] = {{1, 40, 300}, {17, 33, 65}, {64, 128, 256}, {128, 96, 1024}};

std::vector<Case> cases_for(const QuantizeOptions& oa, const QuantizeOptions& ob) {
    std::vector<Case> cases;
    for (const Shape3& s : shapes) cases.push_back({s.m, s.n, s.k, oa, ob});
    return cases;
}

}  // namespace

// One scale per tensor, e4m3fn both sides (the tensorwise recipe's forward GEMM).
TEST(TorchScaledMm, TensorwiseE4m3) {
    const QuantizeOptions o = Recipe::tensorwise().options(Role::input);
    compare_with_torch(cases_for(o, Recipe::tensorwise().options(Role::weight)), "tensorwise");
}

// e4m3fn x e5m2 and e5m2 x e4m3fn, one scale per tensor (the hybrid recipe's backward GEMMs).
TEST(TorchScaledMm, TensorwiseMixedFormats) {
    const QuantizeOptions e4 = options(Format::e4m3fn, Scaling::tensor(), false);
    const QuantizeOptions e5 = options(Format::e5m2, Scaling::tensor(), false);
    std::vector<Case> cases = cases_for(e4, e5);
    for (const Case& c : cases_for(e5, e4)) cases.push_back(c);
    compare_with_torch(cases, "mixed");
}

// Recipe::rowwise: one power-of-two scale per row of A and per row of B (per output column),
// torch's scale_a [M, 1] and scale_b [1, N].
TEST(TorchScaledMm, RowwiseRecipe) {
    const Recipe rw = Recipe::rowwise();
    ASSERT_TRUE(rw.options(Role::input).power_of_two);
    compare_with_torch(cases_for(rw.options(Role::input), rw.options(Role::weight)), "rowwise");
}

// Rowwise with scales that are not powers of two (dequantization rounds in torch's float32
// path), e4m3fn x e4m3fn and e4m3fn x e5m2.
TEST(TorchScaledMm, RowwiseExactScales) {
    const QuantizeOptions e4 = options(Format::e4m3fn, Scaling::row(), false);
    const QuantizeOptions e5 = options(Format::e5m2, Scaling::row(), false);
    std::vector<Case> cases = cases_for(e4, e4);
    for (const Case& c : cases_for(e4, e5)) cases.push_back(c);
    compare_with_torch(cases, "rowwise_exact");
}
