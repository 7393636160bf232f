// tests/ops/test_gemm.cpp: the scaled FP8 GEMM (<fp8kit/gemm.hpp>) of every backend - ref, and cpu
// on every ISA path (AMX tiles on avx512 machines that have them, AVX2 kernels on avx2 and on
// avx512 without AMX, the portable kernel) -
// against float64 arithmetic written here: each operand is dequantized by decoding its codes with
// the scalar decode() (pinned by the golden tables) times the scale_inv of the element's group,
// found from the Scaling definitions of scaling.hpp, and D = act(alpha A.B^T + beta C + bias) is
// computed in float64. Each backend must be within an error bound derived from K, the K group and
// the input magnitudes (NUMERICS.md, "Scaled GEMM"), and cpu within the sum of both bounds of ref
// (not bit for bit: the summation order differs).
// Also: the fused cast against quantize-then-gemm (bit for bit), PackedWeight reuse and repacking,
// thread-count independence (bit for bit), NaN/Inf propagation, SQNR against the product of the
// unquantized inputs, gemm_quantized against the float64 product rounded to FP8.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <numbers>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "fp8kit/fp8kit.hpp"
#include "support.hpp"

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>  // _mm_getcsr, _mm_setcsr: MXCSR's flush flags (DenormalsAreZero...)
#endif

namespace fp8kit {
namespace {

using test::bits;
using test::expect_error;
using test::for_each_backend;
using test::for_each_isa;
using test::on_backend;
using test::same_float;

constexpr double eps_f32 = 0x1p-23;  // float32 machine epsilon = 2 u

// ---- inputs ----

// N(0,1) values; with `banded`, times 2^e where e = (5 i + 3 (k / 32)) % 9 - 4 varies by row and
// by 32-wide band of K, so that rows, 1x128 and 128x128 blocks and 1x32 blocks all get scales of
// their own: a scale applied to the wrong group shows up as an error far above the bound.
std::vector<float> gaussian(int64_t rows, int64_t cols, uint32_t seed, bool banded = true) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    std::vector<float> v(size_t(rows * cols));
    for (int64_t i = 0; i < rows; ++i) {
        for (int64_t k = 0; k < cols; ++k) {
            const int e = banded ? int((5 * i + 3 * (k / 32)) % 9) - 4 : 0;
            v[size_t(i * cols + k)] = std::ldexp(nd(rng), e);
        }
    }
    return v;
}

// A contiguous [rows, cols] tensor of `dtype` holding v (rounded to bf16/f16 where asked).
Tensor as_tensor(const std::vector<float>& v, int64_t rows, int64_t cols, DType dtype) {
    if (dtype == DType::bf16) {
        std::vector<bf16> h;
        for (float x : v) h.push_back(bf16(x));
        return Tensor::from(h, {rows, cols});
    }
    if (dtype == DType::f16) {
        std::vector<f16> h;
        for (float x : v) h.push_back(f16(x));
        return Tensor::from(h, {rows, cols});
    }
    return Tensor::from(v, {rows, cols});
}

QuantizeOptions qopts(Scaling s, Format f, bool pow2 = false) {
    QuantizeOptions o;
    o.scaling = s;
    o.format = f;
    o.power_of_two = pow2;
    return o;
}

// Every element of a 2-d f32/bf16/f16 tensor (any strides) as double.
std::vector<double> values(const Tensor& t) {
    std::vector<double> v;
    v.reserve(size_t(t.numel()));
    for (int64_t i = 0; i < t.size(0); ++i) {
        for (int64_t j = 0; j < t.size(1); ++j) v.push_back(double(t.get({i, j})));
    }
    return v;
}

// ---- the float64 model ----

// scale_inv of element (i, k) of q, from the definition of its granularity (scaling.hpp).
double scale_of(const QTensor& q, int64_t i, int64_t k) {
    int64_t gi = 0, gk = 0;
    switch (q.scaling.granularity) {
        case Granularity::tensor: break;
        case Granularity::row: gi = i; break;
        case Granularity::column: gk = k; break;
        case Granularity::block:
            gi = i / q.scaling.block_rows;
            gk = k / q.scaling.block_cols;
            break;
        case Granularity::mx32:
            gi = i;
            gk = k / 32;
            break;
    }
    const int64_t at = gi * q.scale_inv.size(1) + gk;
    if (q.scale_inv.dtype() == DType::e8m0fnu) return double(decode(q.scale_inv.data<uint8_t>()[at], Format::e8m0fnu));
    return double(q.scale_inv.data<float>()[at]);
}

// deq(q) in float64: exact (a code has <= 4 significant bits, a scale_inv 24).
std::vector<double> dequantize64(const QTensor& q) {
    const int64_t rows = q.data.size(0), cols = q.data.size(1), ld = q.data.strides()[0];
    const uint8_t* p = q.data.data<uint8_t>();
    std::vector<double> v(size_t(rows * cols));
    for (int64_t i = 0; i < rows; ++i) {
        for (int64_t k = 0; k < cols; ++k) v[size_t(i * cols + k)] = double(decode(p[i * ld + k], q.format())) * scale_of(q, i, k);
    }
    return v;
}

// How far one scale reaches along K (NUMERICS.md "Scales and K groups"): all of K for tensor and
// row, the block's width for block and 32 for mx32, cut at K.
int64_t k_extent(const Scaling& s, int64_t k) {
    switch (s.granularity) {
        case Granularity::block: return std::min(s.block_cols, k);
        case Granularity::mx32: return std::min<int64_t>(32, k);
        default: return k;
    }
}

// A . B^T of the dequantized operands, and the sum of |a_ik b_jk| that the error bound scales with.
struct Product64 {
    int64_t m = 0, n = 0, k = 0;
    int64_t kgroup = 1, groups = 1;  // K group width and count (the bound's accumulation lengths)
    // Every scale of both operands a power of two in [2^-32, 2^32]: the cpu backend may fold the
    // groups' scales into the operands and sum all of K at once (src/cpu/gemm.cpp, "Folding").
    bool folds = false;
    std::vector<double> dot, abs;
    // For Hopper's wgmma sums (check_gemm_cuda): per element, the sum over the k32 steps of each
    // 128-wide K block (counted from k = 0; the sum restarts at each block) of the largest
    // magnitude a step adds: max(|the block's sum before the step|, its products' largest |a b|).
    std::vector<double> tc_steps;
};

// a [m, k] in float64 (its scales reaching a_kextent along K) times deq(qb)^T.
Product64 product64(const std::vector<double>& a, int64_t m, int64_t a_kextent, const QTensor& qb) {
    Product64 p;
    p.m = m;
    p.n = qb.data.size(0);
    p.k = qb.data.size(1);
    p.kgroup = std::max<int64_t>(1, std::min(a_kextent, k_extent(qb.scaling, p.k)));
    p.groups = std::max<int64_t>(1, (p.k + p.kgroup - 1) / p.kgroup);
    const std::vector<double> b = dequantize64(qb);
    p.dot.assign(size_t(p.m * p.n), 0.0);
    p.abs.assign(size_t(p.m * p.n), 0.0);
    p.tc_steps.assign(size_t(p.m * p.n), 0.0);
    for (int64_t i = 0; i < p.m; ++i) {
        for (int64_t j = 0; j < p.n; ++j) {
            double s = 0.0, sa = 0.0, block = 0.0, step_max = 0.0, steps = 0.0;
            for (int64_t k = 0; k < p.k; ++k) {
                const double t = a[size_t(i * p.k + k)] * b[size_t(j * p.k + k)];
                s += t;
                sa += std::fabs(t);
                if (k % 128 == 0) block = 0.0;
                if (k % 32 == 0) step_max = std::fabs(block);
                step_max = std::max(step_max, std::fabs(t));
                block += t;
                if (k % 32 == 31 || k + 1 == p.k) steps += step_max;
            }
            p.dot[size_t(i * p.n + j)] = s;
            p.abs[size_t(i * p.n + j)] = sa;
            p.tc_steps[size_t(i * p.n + j)] = steps;
        }
    }
    return p;
}

// Whether every scale of q is a power of two 2^e with |e| <= 32.
bool scales_fold(const QTensor& q) {
    for (int64_t i = 0; i < q.data.size(0); ++i) {
        for (int64_t k = 0; k < q.data.size(1); ++k) {
            int e = 0;
            const double f = std::frexp(scale_of(q, i, k), &e);  // s = f 2^e, f in [0.5, 1)
            if (f != 0.5 || e - 1 < -32 || e - 1 > 32) return false;
        }
    }
    return true;
}

Product64 product64(const QTensor& qa, const QTensor& qb) {
    Product64 p = product64(dequantize64(qa), qa.data.size(0), k_extent(qa.scaling, qa.data.size(1)), qb);
    p.folds = p.groups > 1 && scales_fold(qa) && scales_fold(qb);
    return p;
}

double gelu64(double x) {
    return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}
constexpr double max_gelu_slope = 1.13;  // max |gelu'(x)| of the tanh form is 1.12899...

// Rounding to the output type: its unit roundoff u = 2^-p (p significant bits: 24, 8, 11),
// and half the smallest subnormal.
double out_u(DType t) { return t == DType::bf16 ? 0x1p-8 : t == DType::f16 ? 0x1p-11 : 0x1p-24; }
double out_tiny(DType t) { return t == DType::bf16 ? 0x1p-134 : t == DType::f16 ? 0x1p-25 : 0x1p-150; }

// The epilogue of one call, as GemmOptions and as the float64 values the GEMM reads.
struct Epilogue {
    const char* name;
    float alpha, beta;
    bool has_c;
    DType c_dtype;
    bool has_bias;
    DType bias_dtype;
    Activation act;
};

const Epilogue epilogues[] = {
    {"plain", 1.0f, 0.0f, false, DType::f32, false, DType::f32, Activation::none},
    {"alpha", -0.75f, 0.0f, false, DType::f32, false, DType::f32, Activation::none},
    {"alpha_bias_f32", 0.5f, 0.0f, false, DType::f32, true, DType::f32, Activation::none},
    {"beta_c_f32", 1.5f, 0.5f, true, DType::f32, false, DType::f32, Activation::none},
    {"beta_c_bf16_bias_f32", 1.0f, -1.25f, true, DType::bf16, true, DType::f32, Activation::none},
    {"bias_f16_gelu", 0.5f, 0.0f, false, DType::f32, true, DType::f16, Activation::gelu},
    {"alpha_c_f16_bias_bf16_gelu", -1.5f, 0.75f, true, DType::f16, true, DType::bf16, Activation::gelu},
};

struct Call {
    GemmOptions opts;
    std::vector<double> c, bias;  // what the GEMM reads (exactly representable)
};

// C is a strided view: columns [2, n + 2) of a [m, n + 5] tensor, so its row stride is not n.
Call make_call(const Epilogue& e, int64_t m, int64_t n, DType out, uint32_t seed) {
    Call call;
    call.opts.alpha = e.alpha;
    call.opts.beta = e.beta;
    call.opts.activation = e.act;
    call.opts.out_dtype = out;
    if (e.has_c) {
        const Tensor wide = as_tensor(gaussian(m, n + 5, seed, false), m, n + 5, e.c_dtype);
        call.opts.c = wide.slice(1, 2, n + 2);
        call.c = values(*call.opts.c);
    }
    if (e.has_bias) {
        const Tensor b = as_tensor(gaussian(1, n, seed + 7, false), 1, n, e.bias_dtype);
        call.opts.bias = b.reshape({n});
        call.bias = values(b);
    }
    return call;
}

// The float64 D and, per element, the error each backend may make.
//  - cpu: the float32 sums within a K group (kgroup - 1 roundings), each group's promotion
//    partial * (sa * sb) (2 roundings), the sum over the groups (groups - 1), alpha (1): to first
//    order (kgroup + groups + 2) u |alpha| sum|a b|. Where the scales fold (p.folds, and
//    cpu_folds: not for the cuda backend, which is held to the groups' bound) the sum may instead be
//    one float32 sum over K (K - 1 roundings), so the length is the larger of kgroup + groups and
//    K. The bound is c * (that length + 4) *
//    eps_f32 * |alpha| sum|a b| with c = 1 and eps_f32 = 2u, i.e. twice that, covering
//    second-order terms and the AMX pair adds. With per-block scales (groups > 1) the group
//    promotions are what the "groups + 2" term pays for. The epilogue (beta * C, + C, + bias)
//    adds 3 roundings of values <= mag = |alpha| sum|ab| + |beta c| + |bias|: 2 eps_f32 mag.
//    GELU: the bound times max |gelu'| plus the float32 evaluation of gelu (tanhf and the
//    cubic: < 6 u |x|, allowed 4 eps_f32 |x|). Then the rounding to the output type.
//  - ref: exact group sums and promotion in float64, so only the final rounding to float32 (then
//    to bf16/f16) and float64 noise (1e-12 of mag).
struct Expect {
    std::vector<double> d, bound_cpu, bound_ref;
};

Expect expect(const Product64& p, const Call& call, DType out, bool cpu_folds = true) {
    Expect e;
    const int64_t length = std::max(p.kgroup + p.groups, cpu_folds && p.folds ? p.k : 0);
    const GemmOptions& o = call.opts;
    const double alpha = o.alpha, beta = o.beta;
    for (int64_t i = 0; i < p.m; ++i) {
        for (int64_t j = 0; j < p.n; ++j) {
            const size_t at = size_t(i * p.n + j);
            const double c = call.c.empty() ? 0.0 : beta * call.c[at];
            const double bias = call.bias.empty() ? 0.0 : call.bias[size_t(j)];
            const double pre = alpha * p.dot[at] + c + bias;
            const double mag = std::fabs(alpha) * p.abs[at] + std::fabs(c) + std::fabs(bias);
            const double pre_err = double(length + 4) * eps_f32 * std::fabs(alpha) * p.abs[at] + 2 * eps_f32 * mag;
            double d = pre, err = pre_err;
            if (o.activation == Activation::gelu) {
                d = gelu64(pre);
                err = max_gelu_slope * pre_err + 4 * eps_f32 * (std::fabs(pre) + pre_err);
            }
            e.d.push_back(d);
            e.bound_cpu.push_back(err + out_u(out) * (std::fabs(d) + err) + out_tiny(out));
            e.bound_ref.push_back(0x1p-24 * std::fabs(d) + out_u(out) * std::fabs(d) * (1 + 0x1p-24) + out_tiny(out) +
                                  0x1p-150 + 1e-12 * mag);
        }
    }
    return e;
}

::testing::AssertionResult within(const std::vector<double>& got, const std::vector<double>& want,
                                  const std::vector<double>& bound, int64_t n) {
    if (got.size() != want.size()) return ::testing::AssertionFailure() << got.size() << " values, expected " << want.size();
    for (size_t at = 0; at < got.size(); ++at) {
        const double diff = std::fabs(got[at] - want[at]);
        if (!(diff <= bound[at])) {  // NaN fails too
            return ::testing::AssertionFailure() << "D[" << int64_t(at) / n << ", " << int64_t(at) % n << "] = " << got[at]
                                                 << ", expected " << want[at] << " +- " << bound[at] << " (off by "
                                                 << diff << ", " << diff / bound[at] << " x the bound)";
        }
    }
    return ::testing::AssertionSuccess();
}

std::vector<double> add(const std::vector<double>& a, const std::vector<double>& b) {
    std::vector<double> s(a.size());
    for (size_t i = 0; i < a.size(); ++i) s[i] = a[i] + b[i];
    return s;
}

::testing::AssertionResult is_output(const Tensor& d, int64_t m, int64_t n, DType out) {
    if (d.shape() != Shape{m, n} || d.dtype() != out || !d.is_contiguous()) {
        return ::testing::AssertionFailure() << "D is " << to_string(d.dtype()) << " " << to_string(d.shape())
                                             << (d.is_contiguous() ? "" : " (strided)") << ", expected contiguous "
                                             << to_string(out) << " [" << m << ", " << n << "]";
    }
    return ::testing::AssertionSuccess();
}

// D identical bit for bit (same dtype and shape; NaN equals NaN).
::testing::AssertionResult identical(const Tensor& got, const Tensor& want) {
    if (got.shape() != want.shape() || got.dtype() != want.dtype()) {
        return ::testing::AssertionFailure() << to_string(got.dtype()) << " " << to_string(got.shape()) << " vs "
                                             << to_string(want.dtype()) << " " << to_string(want.shape());
    }
    const Tensor g = got.contiguous(), w = want.contiguous();
    const auto* pg = static_cast<const unsigned char*>(g.raw_data());
    const auto* pw = static_cast<const unsigned char*>(w.raw_data());
    const size_t es = dtype_size(g.dtype());
    for (int64_t at = 0; at < g.numel(); ++at) {
        if (std::memcmp(pg + size_t(at) * es, pw + size_t(at) * es, es) != 0) {
            const int64_t i = at / g.size(1), j = at % g.size(1);
            const float a = g.get({i, j}), b = w.get({i, j});
            if (a != a && b != b) continue;
            return ::testing::AssertionFailure() << "D[" << i << ", " << j << "]: " << a << " vs " << b << " ("
                                                 << test::hex(bits(a), 8) << " vs " << test::hex(bits(b), 8) << ")";
        }
    }
    return ::testing::AssertionSuccess();
}

// gemm() into an [m, n] output filled with NaN beforehand: D returned in a new tensor may take a
// block of memory that the previous call (another ISA path's) freed with the same D in it, and then
// a kernel that left part of D unwritten would pass.
Tensor gemm_into_nan(const GemmA& qa, const QTensor& qb, const GemmOptions& opts, int64_t m, int64_t n) {
    const Tensor d = Tensor::full({m, n}, std::nanf(""), opts.out_dtype);
    gemm(qa, qb, opts, d);
    return d;
}

// Runs gemm(a, qb, call) on ref and on cpu (every ISA path) and checks each against the float64
// model, and cpu against ref.
void check_gemm(const GemmA& qa, const QTensor& qb, const Product64& p, const Call& call) {
    const DType out = call.opts.out_dtype;
    const Expect e = expect(p, call, out);
    const Tensor ref = on_backend(Backend::ref, [&] { return gemm_into_nan(qa, qb, call.opts, p.m, p.n); });
    ASSERT_TRUE(is_output(ref, p.m, p.n, out));
    const std::vector<double> r = values(ref);
    EXPECT_TRUE(within(r, e.d, e.bound_ref, p.n)) << "ref vs float64";
    const std::vector<double> both = add(e.bound_cpu, e.bound_ref);
    on_backend(Backend::cpu, [&] {
        for_each_isa([&](Isa) {
            const Tensor got = gemm_into_nan(qa, qb, call.opts, p.m, p.n);
            ASSERT_TRUE(is_output(got, p.m, p.n, out));
            const std::vector<double> g = values(got);
            EXPECT_TRUE(within(g, e.d, e.bound_cpu, p.n)) << "cpu vs float64";
            EXPECT_TRUE(within(g, r, both, p.n)) << "cpu vs ref";
        });
        return 0;
    });
}

// The options of a call with C and bias on `device` (C copied contiguous).
GemmOptions options_on(const GemmOptions& o, Device device) {
    GemmOptions r = o;
    if (r.c) r.c = r.c->to(device);
    if (r.bias) r.bias = r.bias->to(device);
    return r;
}

// The cuda backend's largest error beyond the float32 model, in units of |alpha| sum|a b|, for
// GEMMs on its own kernels and on cuBLASLt; and on its wgmma and decode rows' kernels, as a fraction of the
// truncation term below (printed at the end of a grid test, so a log shows how close each runs to
// its bound).
enum class CudaKernel { own, cublaslt, truncating };
double& cuda_worst_excess(CudaKernel k) {
    static double worst[3] = {0.0, 0.0, 0.0};
    return worst[int(k)];
}

// NUMERICS.md's rule for the GEMMs the cuda backend hands to cuBLASLt: e4m3/e5m2 operands, a plain
// epilogue, n and k multiples of 16, and tensor x tensor (one scale each) or row x row at any m, or
// block 1x128 x 128x128 with m a multiple of 16 and K of 128.
bool runs_on_cublaslt(const QTensor& qa, const QTensor& qb, const GemmOptions& o) {
    const auto tc = [](Format f) { return f == Format::e4m3fn || f == Format::e5m2; };
    const int64_t m = qa.data.size(0), n = qb.data.size(0), k = qa.data.size(1);
    if (!tc(qa.format()) || !tc(qb.format()) || o.c || o.bias || o.activation != Activation::none || n % 16 != 0 ||
        k % 16 != 0) {
        return false;
    }
    const GroupShape ga = qa.scaling.group_shape(m, k), gb = qb.scaling.group_shape(n, k);
    if (qa.scale_inv.numel() == 1 && qb.scale_inv.numel() == 1) return true;
    if (ga.rows == 1 && ga.cols >= k && gb.rows == 1 && gb.cols >= k) return true;
    return ga == GroupShape{1, 128} && gb == GroupShape{128, 128} && k % 128 == 0 && m % 16 == 0;
}

// Whether FP8KIT_CUDA_GEMV has the cuda backend's decode rows taken by its mma kernel.
bool gemv_mma() {
    const char* env = std::getenv("FP8KIT_CUDA_GEMV");
    return env != nullptr && std::string_view(env) == "mma";
}

// The cuda backend's rule for its decode rows' kernels (src/cuda/gemm_gemv.cu, gemv_fits), which
// gemm() tries first: e4m3/e5m2 operands, K a multiple of 16 (the test's rows are 16-byte aligned
// when K is), and by FP8KIT_CUDA_GEMV either m <= 2 with one K group or groups of a multiple of 16
// (cuda_cores, the default: float32 sums, the cpu bound) or m <= 16 with one K group or groups of a
// multiple of 32 on sm_89 or newer (mma: tensor-core sums, bounded as the wgmma kernel's).
bool runs_on_gemv(const QTensor& qa, const QTensor& qb) {
    const auto tc = [](Format f) { return f == Format::e4m3fn || f == Format::e5m2; };
    const int64_t m = qa.data.size(0), n = qb.data.size(0), k = qa.data.size(1);
    if (!tc(qa.format()) || !tc(qb.format()) || k == 0 || k % 16 != 0) return false;
    const int64_t kgroup = std::min(qa.scaling.group_shape(m, k).cols, qb.scaling.group_shape(n, k).cols);
    if (!gemv_mma()) return m <= 2 && (kgroup >= k || kgroup % 16 == 0);
    return test::cuda_compute_capability() >= 89 && m <= 16 && (kgroup >= k || kgroup % 32 == 0);
}

// The cuda backend's rule for its wgmma kernel (src/cuda/gemm_wgmma.cu, wgmma_fits), on an sm_90 GPU:
// e4m3/e5m2 operands with K a multiple of 16 that cuBLASLt does not take, and either one K group
// or groups of exactly 128 whose B scales are one per 128 rows of B.
bool runs_on_wgmma(const QTensor& qa, const QTensor& qb, const GemmOptions& o) {
    const auto tc = [](Format f) { return f == Format::e4m3fn || f == Format::e5m2; };
    const int64_t m = qa.data.size(0), n = qb.data.size(0), k = qa.data.size(1);
    if (test::cuda_compute_capability() != 90 || !tc(qa.format()) || !tc(qb.format()) || k % 16 != 0 ||
        runs_on_gemv(qa, qb) || runs_on_cublaslt(qa, qb, o)) {
        return false;
    }
    const GroupShape ga = qa.scaling.group_shape(m, k), gb = qb.scaling.group_shape(n, k);
    const int64_t kgroup = std::min(ga.cols, gb.cols);
    return kgroup >= k || (kgroup == 128 && (gb.rows % 128 == 0 || gb.rows >= n));
}

// Runs gemm(qa, qb, call) on the cuda backend (operands, C and bias copied to the device) and
// checks D against the float64 model. Its mma.sync kernel and its decode rows' CUDA-core kernel:
// the cpu bound - the tensor cores sum
// the exact FP8 products of at most 128 of K before each promotion into float32, which the
// bound's kgroup term pays for. The GEMMs of runs_on_cublaslt (NUMERICS.md, "Scaled GEMM"), whose
// FP8 sums keep fewer bits than float32 (DeepSeek-V3, section 3.3.2: about 14 on Hopper):
// 2^-11 |alpha| sum|a b| more, as measured. Its wgmma kernel and its decode rows' mma kernel
// (runs_on_wgmma; runs_on_gemv with FP8KIT_CUDA_GEMV=mma), derived from the same 14 bits: a k32 step adds 33 terms (the running sum and 32
// products) aligned to the largest of them, M, and keeps 13 bits below M's leading one - each term
// loses less than 2^-13 M - so a step is off by less than 33 * 2^-13 M, and D by |alpha| times the
// sum of that over the steps (Product64::tc_steps; the K block's sum restarts at zero, as the
// kernels promote it - the decode rows' kernel at least as often).
void check_gemm_cuda(const QTensor& qa, const QTensor& qb, const Product64& p, const Call& call) {
    const DType out = call.opts.out_dtype;
    const Expect e = expect(p, call, out, false);
    const Tensor got = gemm(qa.to(Device::cuda), qb.to(Device::cuda),
                            options_on(call.opts, Device::cuda));
    ASSERT_EQ(got.device(), Device::cuda);
    const Tensor host = got.to(Device::cpu);
    ASSERT_TRUE(is_output(host, p.m, p.n, out));
    const std::vector<double> g = values(host);
    const bool gemv = runs_on_gemv(qa, qb);
    const CudaKernel kernel = gemv ? (gemv_mma() ? CudaKernel::truncating : CudaKernel::own)
                              : runs_on_cublaslt(qa, qb, call.opts) ? CudaKernel::cublaslt
                              : runs_on_wgmma(qa, qb, call.opts)    ? CudaKernel::truncating
                                                                    : CudaKernel::own;
    const double slope = call.opts.activation == Activation::gelu ? max_gelu_slope : 1.0;
    std::vector<double> bound = e.bound_cpu;
    for (size_t at = 0; at < g.size(); ++at) {
        const double excess = std::fabs(g[at] - e.d[at]) - e.bound_cpu[at];
        const double scale = std::fabs(call.opts.alpha) * p.abs[at];
        const double truncation = 33 * 0x1p-13 * std::fabs(call.opts.alpha) * p.tc_steps[at] * slope;
        double& worst = cuda_worst_excess(kernel);
        if (kernel == CudaKernel::truncating) {
            if (truncation > 0) worst = std::max(worst, excess / truncation);
            bound[at] += truncation;
        } else {
            if (scale > 0) worst = std::max(worst, excess / scale);
            if (kernel == CudaKernel::cublaslt) bound[at] += 0x1p-11 * scale * slope;
        }
    }
    EXPECT_TRUE(within(g, e.d, bound, p.n)) << "cuda vs float64"
                                            << (kernel == CudaKernel::cublaslt ? " (cuBLASLt)"
                                                : kernel == CudaKernel::truncating  ? " (wgmma or the decode rows' kernel)"
                                                                               : "");
}

std::string fmt_name(Format a, Format b) { return std::string(to_string(a)) + " x " + std::string(to_string(b)); }

struct Mnk {
    int64_t m, n, k;
};

// 1s, primes, K not a multiple of 32 or 128, N across several 128-column panels, M across several
// 32-row blocks, and K past the cpu kernel's 1024-wide window of B. Small M runs the cpu backend's
// small-M kernel where it has one (AMX: M <= 2; AVX512-BF16 without AMX: M <= 32, in even groups of
// up to 16 rows; AVX2: M <= 24, in passes of up to 6 rows), larger M its tiles; M = 1 with
// K = 1100 sums a single row's several K groups, each in the lanes the M = 1 kernels split it into.
// 48 x 272 x 640: the block recipe on cuBLASLt with 5 K blocks (not a multiple of 4) and 3 row
// blocks of B, whose scale rows cuBLASLt reads padded (src/cuda/gemm_cublaslt.cu, launch_lt).
const Mnk grid_shapes[] = {{1, 1, 1},     {1, 17, 5},    {1, 40, 1100},  {2, 45, 260},   {3, 7, 130},
                           {4, 50, 384},  {5, 23, 129},  {16, 33, 257},  {17, 64, 128},  {31, 130, 300},
                           {64, 48, 512}, {130, 257, 129}, {37, 140, 1100}, {48, 272, 640}};

const std::pair<Format, Format> format_pairs[] = {{Format::e4m3fn, Format::e4m3fn},
                                                   {Format::e4m3fn, Format::e5m2},
                                                   {Format::e5m2, Format::e4m3fn},
                                                   {Format::e5m2fnuz, Format::e4m3fnuz}};

constexpr DType out_dtypes[] = {DType::f32, DType::bf16, DType::f16};

// One scaling of A and of B (the recipes of NUMERICS.md, and tensor A with block B).
struct GranCase {
    std::string name;
    Scaling a, b;
    bool power_of_two;
};
void PrintTo(const GranCase& c, std::ostream* os) { *os << c.name; }

std::vector<GranCase> gran_cases() {
    return {{"tensor", Scaling::tensor(), Scaling::tensor(), false},
            {"row", Scaling::row(), Scaling::row(), false},
            {"row_pow2", Scaling::row(), Scaling::row(), true},
            {"block", Scaling::block(1, 128), Scaling::block(128, 128), false},
            {"block_pow2", Scaling::block(1, 128), Scaling::block(128, 128), true},
            {"mx32", Scaling::mx32(), Scaling::mx32(), false},
            {"tensor_x_block", Scaling::tensor(), Scaling::block(128, 128), false}};
}

// The grid for one pair of scalings (one ctest test each): every shape x format pair x epilogue,
// with the output type rotating so that each epilogue meets each output type.
class GemmGrid : public ::testing::TestWithParam<GranCase> {};

// Calls check(qa, qb, product64, call) for every shape x format pair x epilogue of the grid.
template <class Check>
void run_grid(const GranCase& g, const std::vector<Mnk>& shapes, Check&& check) {
    uint32_t seed = 1000;
    for (size_t si = 0; si < shapes.size(); ++si) {
        const Mnk s = shapes[si];
        for (size_t fi = 0; fi < std::size(format_pairs); ++fi) {
            const Format fa = format_pairs[fi].first, fb = format_pairs[fi].second;
            SCOPED_TRACE(std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) + " " + fmt_name(fa, fb));
            const QTensor qa = quantize(as_tensor(gaussian(s.m, s.k, seed), s.m, s.k, DType::f32), qopts(g.a, fa, g.power_of_two));
            const QTensor qb = quantize(as_tensor(gaussian(s.n, s.k, seed + 1), s.n, s.k, DType::f32), qopts(g.b, fb, g.power_of_two));
            seed += 2;
            const Product64 p = product64(qa, qb);
            for (size_t ei = 0; ei < std::size(epilogues); ++ei) {
                const DType out = out_dtypes[(si + fi + ei) % std::size(out_dtypes)];
                SCOPED_TRACE(std::string(epilogues[ei].name) + " -> " + std::string(to_string(out)));
                check(qa, qb, p, make_call(epilogues[ei], s.m, s.n, out, seed++));
            }
        }
    }
}

TEST_P(GemmGrid, BackendsWithinTheFloat64Bound) {
    run_grid(GetParam(), {std::begin(grid_shapes), std::end(grid_shapes)}, check_gemm);
}

// K groups wider than the avx512-bf16 tiles' 256-wide slice of K (their promotion then goes through
// a partial-sum buffer; a 128 group is promoted as the tiles store): 512, over K = 512 (one group),
// 1100 (two and a cut one) and 129 (one, cut), M past the small-M kernels; and M = 100 over K =
// 8300 (17 groups), which the AMX small-M tiles take in slices of K of four whole groups each,
// and with power-of-two scales (folded: K summed as one group), in slices that cut groups.
TEST(GemmOps, WideBlockGroupsWithinTheFloat64Bound) {
    run_grid({"block_512", Scaling::block(1, 512), Scaling::block(512, 512), false},
             {Mnk{64, 48, 512}, Mnk{37, 140, 1100}, Mnk{130, 257, 129}, Mnk{100, 40, 8300}}, check_gemm);
    run_grid({"block_512_pow2", Scaling::block(1, 512), Scaling::block(512, 512), true}, {Mnk{100, 40, 8300}}, check_gemm);
}

// Power-of-two scales folded where M is past the small-M kernels (the avx512-bf16 tiles fold from
// M = 257, gemm_avx512.cpp's avx512_fold_min_m): mx32 and block_pow2 over K = 600 (a cut last
// group), B a QTensor: its rows widened, then folded in the window (a PackedWeight B is held to
// it bit for bit by AQTensorBForOneCallEqualsItsPackedWeight).
TEST(GemmOps, FoldedOnTheTilesWithinTheFloat64Bound) {
    for (const GranCase& g : gran_cases()) {
        if (g.name == "mx32" || g.name == "block_pow2") {
            SCOPED_TRACE(g.name);
            run_grid(g, {Mnk{300, 70, 600}}, check_gemm);
        }
    }
}

// K past one window of B on the cpu tiles (AMX: 3072 is one window, src/cpu/gemm_amx.cpp; the
// avx512-bf16 tiles: 1024; AVX2: 128) with M past the small-M kernels, so that each task keeps all
// its rows' sums between windows and finishes them after the last: tensorwise, block (each group
// promoted into the sums the windows carry) and block_pow2 (folded: K summed as one group across
// windows). A window's sums written over instead of added to fails the bound. And, tensorwise, a
// short K (16 chunks) over N = 1060 (67 strips): the AMX tiles' panels widen to 32 strips where their
// window leaves room (GemmKernels::panel_window_bytes), here two such panels and a last of 3 strips.
TEST(GemmOps, KPastOneWindowAndWidePanelsWithinTheFloat64Bound) {
    for (const GranCase& g : gran_cases()) {
        if (g.name == "tensor" || g.name == "block" || g.name == "block_pow2") {
            SCOPED_TRACE(g.name);
            run_grid(g, {Mnk{136, 20, 3100}}, check_gemm);
        }
    }
    const Mnk s{136, 1060, 500};
    const QuantizeOptions o = qopts(Scaling::tensor(), Format::e4m3fn);
    const QTensor qa = quantize(as_tensor(gaussian(s.m, s.k, 31), s.m, s.k, DType::f32), o);
    const QTensor qb = quantize(as_tensor(gaussian(s.n, s.k, 32), s.n, s.k, DType::f32), o);
    check_gemm(qa, qb, product64(qa, qb), make_call(epilogues[0], s.m, s.n, DType::bf16, 33));
}

// Power-of-two scales past the fold's range (2^+-32): A rows of magnitude 2^-120 and 2^100 get
// scale_inv of about 2^-128 and 2^92, so the cpu backend packs A again unfolded and promotes each
// group (src/cpu/gemm.cpp, "Folding"); folded anyway, row 0's small codes would fall below bf16's
// normals and its products below float32's, which the tiles flush to zero (D off by far more than
// the bound there). The rest of A, and B, fold: M on the tiles, on the small-M kernel, and the fused cast
// (A's scales known only as it is quantized). Every D within the float64 bound.
TEST(GemmOps, PowerOfTwoScalesPastTheFoldRangeArePromoted) {
    const int64_t n = 40, k = 300;
    const QuantizeOptions o = qopts(Scaling::block(1, 128), Format::e4m3fn, true);
    const QTensor qb = quantize(as_tensor(gaussian(n, k, 7), n, k, DType::f32), qopts(Scaling::block(128, 128), Format::e4m3fn, true));
    ASSERT_TRUE(scales_fold(qb));
    for (const int64_t m : {9, 130}) {
        SCOPED_TRACE("M = " + std::to_string(m));
        std::vector<float> x = gaussian(m, k, 8);
        for (int64_t e = 0; e < k; ++e) {
            x[size_t(e)] = std::ldexp(x[size_t(e)], -120);
            x[size_t(k + e)] = std::ldexp(x[size_t(k + e)], 100);
        }
        const Tensor xt = as_tensor(x, m, k, DType::f32);
        const QTensor qa = quantize(xt, o);
        const Product64 p = product64(qa, qb);
        ASSERT_FALSE(p.folds) << "the test needs A scales past the fold's range";
        const Call call = make_call(epilogues[0], m, n, DType::f32, 9);
        check_gemm(qa, qb, p, call);
        check_gemm(GemmA{xt, o}, qb, p, call);
    }
}

const char* env_or_empty(const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr ? v : "";
}

// The cuda backend on the grid, and on shapes that take its tensor-core kernels through several
// 128 x 128 tiles, K blocks and pipeline stages (K a multiple of 16), with edges cut.
void run_cuda_grid(const GranCase& g) {
    std::vector<Mnk> shapes(std::begin(grid_shapes), std::end(grid_shapes));
    for (const Mnk big : {Mnk{129, 257, 1024}, Mnk{256, 384, 2048}, Mnk{200, 136, 4096}, Mnk{64, 64, 48}}) shapes.push_back(big);
    // decode's rows: the CUDA-core gemv kernel's m <= 2 (K past one warp's 512 codes, and one
    // chunk); the mma one's m <= 16 (FP8KIT_CUDA_GEMV=mma): one and two mma tiles of 8 rows (m = 8,
    // 9, 16), n past a block's 16 columns, K cut inside a k32 step and a 128 chunk (1040: 8 chunks
    // and 16 of K, warps with and without a slice), K below one step (16, 48), several chunks a
    // warp (4096); the other engines past them
    for (const Mnk decode : {Mnk{1, 256, 1040}, Mnk{2, 2048, 1024}, Mnk{2, 40, 16}, Mnk{3, 2048, 1024}, Mnk{7, 256, 512},
                             Mnk{8, 136, 4096}, Mnk{9, 257, 1040}, Mnk{16, 384, 2048}, Mnk{16, 40, 48}, Mnk{17, 128, 256},
                             Mnk{20, 128, 256}}) {
        shapes.push_back(decode);
    }
    run_grid(g, shapes, check_gemm_cuda);
    std::printf("[ cuda ] %s: worst error beyond the float32 model so far, in |alpha| sum|ab|: mma.sync and CUDA cores %.3g, "
                "cuBLASLt %.3g; wgmma and decode rows' mma %.3g of their truncation term (sm_%d, FP8KIT_CUDA_WGMMA=%s, "
                "FP8KIT_CUDA_GEMV=%s)\n",
                g.name.c_str(), cuda_worst_excess(CudaKernel::own), cuda_worst_excess(CudaKernel::cublaslt),
                cuda_worst_excess(CudaKernel::truncating), test::cuda_compute_capability(),
                env_or_empty("FP8KIT_CUDA_WGMMA"), env_or_empty("FP8KIT_CUDA_GEMV"));
}

// ctest runs this grid three times (tests/CMakeLists.txt): as discovered, with FP8KIT_CUDA_WGMMA=tma
// (the wgmma kernel's stages loaded by the copy engine; on a GPU other than sm_90 the setting
// changes nothing) and with FP8KIT_CUDA_GEMV=mma (the decode rows on the tensor cores) - and once
// with a bad value of each, which every GEMM must refuse, naming it.
TEST_P(GemmGrid, CudaWithinTheFloat64Bound) {
    FP8KIT_SKIP_WITHOUT_CUDA();
    run_cuda_grid(GetParam());
}

// Two 5-bit-exponent operands are refused (NUMERICS.md), by every backend, for these scalings.
TEST_P(GemmGrid, E5m2TimesE5m2IsRefused) {
    const GranCase& g = GetParam();
    const QTensor qa = quantize(as_tensor(gaussian(5, 40, 1), 5, 40, DType::f32), qopts(g.a, Format::e5m2));
    const QTensor qb = quantize(as_tensor(gaussian(6, 40, 2), 6, 40, DType::f32), qopts(g.b, Format::e5m2));
    for_each_backend([&] { test::expect_error([&] { gemm(qa, qb); }, "e5m2"); });
}

INSTANTIATE_TEST_SUITE_P(Scaling, GemmGrid, ::testing::ValuesIn(gran_cases()),
                         [](const auto& param_info) { return param_info.param.name; });

// The fnuz formats (and one fnuz operand with an OCP one) follow the same rules.
TEST(GemmOps, FnuzFormatsWithinTheFloat64Bound) {
    const std::pair<Format, Format> pairs[] = {{Format::e4m3fnuz, Format::e4m3fnuz},
                                               {Format::e4m3fnuz, Format::e5m2fnuz},
                                               {Format::e5m2fnuz, Format::e4m3fn}};
    uint32_t seed = 77;
    for (const Mnk s : {Mnk{17, 64, 128}, Mnk{31, 130, 300}}) {
        for (const auto& f : pairs) {
            for (const Scaling sc : {Scaling::tensor(), Scaling::row(), Scaling::mx32()}) {
                SCOPED_TRACE(std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) + " " +
                             fmt_name(f.first, f.second) + " " + to_string(sc));
                const QTensor qa = quantize(as_tensor(gaussian(s.m, s.k, seed), s.m, s.k, DType::f32), qopts(sc, f.first));
                const QTensor qb = quantize(as_tensor(gaussian(s.n, s.k, seed + 1), s.n, s.k, DType::f32), qopts(sc, f.second));
                seed += 2;
                check_gemm(qa, qb, product64(qa, qb), make_call(epilogues[3], s.m, s.n, DType::f32, seed++));
            }
        }
    }
    const QTensor a5 = quantize(as_tensor(gaussian(4, 64, 1), 4, 64, DType::f32), qopts(Scaling::row(), Format::e5m2fnuz));
    const QTensor b5 = quantize(as_tensor(gaussian(4, 64, 2), 4, 64, DType::f32), qopts(Scaling::row(), Format::e5m2));
    for_each_backend([&] { test::expect_error([&] { gemm(a5, b5); }, "e5m2"); });
}

// ---- weight-only: A in high precision, only B in FP8 ----

// One bf16 term of a weight-only A (NUMERICS.md), computed here apart from the library's bit
// manipulation: the significand rounded to 8 bits in float64 (nearbyint: ties to even), a zero of
// its sign below 2^-102; NaN and Inf as they are.
double bf16_term64(double x) {
    if (!std::isfinite(x) || x == 0) return x;
    if (std::fabs(x) < 0x1p-102) return std::copysign(0.0, x);
    int e = 0;
    const double f = std::frexp(x, &e);  // x = f 2^e, 0.5 <= |f| < 1
    return std::ldexp(std::nearbyint(std::ldexp(f, 8)), e - 8);
}

// A's element as a weight-only GEMM takes it: hi + lo, hi the bf16 term of x and lo that of
// x - hi (exact in float64), lo zero where hi is NaN or Inf.
double weight_only64(double x) {
    const double hi = bf16_term64(x);
    return std::isfinite(hi) ? hi + bf16_term64(x - hi) : hi;
}

// gemm(x, B) on every backend and ISA within the float64 bound of weight_only64(x) . deq(B)^T: f32,
// bf16 and f16 x, B in e4m3fn, e5m2 (which an FP8 A could not meet) and e4m3fnuz with tensor, row,
// 128x128 and mx32 scales, the grid's shapes (small-M kernels, tiles, K windows) and epilogues.
// The bound is the FP8 GEMM's: each product of a bf16 term and an FP8 value is exact in float32
// too; the two terms' float32 sums err by the bound of their products' magnitudes, where |hi| +
// |lo| <= (1 + 2^-8) |x|, and their sum rounds once more: (K + groups) 2^-8 + 1 more units of
// eps |a||b|, inside the bound's slack of 6 (expect()) for K + groups <= 1280 (the grid: <= 1101).
TEST(GemmWeightOnly, WithinTheFloat64Bound) {
    const Scaling b_scalings[] = {Scaling::tensor(), Scaling::row(), Scaling::block(128, 128), Scaling::mx32()};
    const Format b_formats[] = {Format::e4m3fn, Format::e5m2, Format::e4m3fnuz};
    uint32_t seed = 700;
    size_t turn = 0;
    for (const Scaling& bs : b_scalings) {
        for (const Format fb : b_formats) {
            for (const Mnk s : grid_shapes) {
                const DType dtype = out_dtypes[turn % std::size(out_dtypes)];  // x's dtype, in turn
                const Tensor x = as_tensor(gaussian(s.m, s.k, seed), s.m, s.k, dtype);
                const QTensor qb = quantize(as_tensor(gaussian(s.n, s.k, seed + 1), s.n, s.k, DType::f32), qopts(bs, fb));
                seed += 2;
                std::vector<double> a = values(x);
                for (double& v : a) v = weight_only64(v);
                const Product64 p = product64(a, s.m, s.k, qb);
                const Epilogue& e = epilogues[turn % std::size(epilogues)];
                const DType out = out_dtypes[(turn / 3) % std::size(out_dtypes)];
                SCOPED_TRACE(std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) + " x " +
                             std::string(to_string(dtype)) + ", B " + to_string(bs) + " " + std::string(to_string(fb)) +
                             ", " + e.name + " -> " + std::string(to_string(out)));
                check_gemm(x, qb, p, make_call(e, s.m, s.n, out, seed++));
                ++turn;
            }
        }
    }
}

// x holding FP8 values exactly: gemm(x, B) is the FP8 GEMM of x's codes with scale 1, bit for bit
// (bf16 x: the same bf16 operands reach the same kernels), on every backend and ISA, for one K
// group and for 128-wide ones, at M on the small-M kernels and on the tiles. A packing that
// misplaced an element, padding or a group would change D. M = 200 and 192 with K whole chunks
// (256, 64): a bf16 x with one K group is read in place there (the cpu backend's gemm), 200 with
// its last 8 rows packed apart: a misplaced tail or row stride would change D. float32 x too at M = 40, whose lo terms
// are all zero and add +0 to each sum; not at small M, where its doubled packed rows may take
// another kernel, which orders its float32 sums otherwise (AVX2, M = 5: x's rows in passes of 3
// and 2, the last two summed in lanes; its 10 packed rows in passes of 4, 3 and 3, as the tiles).
TEST(GemmWeightOnly, OfFp8ValuesEqualsTheFp8GemmBitForBit) {
    QuantizeOptions unit = qopts(Scaling::tensor(), Format::e4m3fn);
    unit.scale = Tensor::full({1}, 1.0f);
    uint32_t seed = 900;
    for (const Scaling& bs : {Scaling::row(), Scaling::block(128, 128)}) {
        for (const Mnk s : {Mnk{1, 40, 1100}, Mnk{3, 33, 257}, Mnk{40, 130, 300}, Mnk{200, 70, 256}, Mnk{192, 40, 64}}) {
            SCOPED_TRACE(std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) + " B " + to_string(bs));
            std::vector<float> v = gaussian(s.m, s.k, seed++);
            for (float& e : v) e *= 40.0f;  // codes across e4m3's range, some saturated at 448
            const QTensor qa = quantize(Tensor::from(v, {s.m, s.k}), unit);
            const Tensor x = dequantize(qa);  // float32 holding the codes' values
            const Tensor xb = dequantize(qa, DType::bf16);
            const QTensor qb = quantize(as_tensor(gaussian(s.n, s.k, seed++), s.n, s.k, DType::f32), qopts(bs, Format::e4m3fn));
            for_each_backend([&] {
                const Tensor want = gemm(qa, qb);
                EXPECT_TRUE(identical(gemm(xb, qb), want)) << "bf16 x";
                if (s.m == 40) {
                    EXPECT_TRUE(identical(gemm(x, qb), want)) << "f32 x";
                }
            });
        }
    }
}

// gemm(x, B) where B's rows are 1 and -2 at k = 0 and 0 elsewhere (scale 1): on every backend and
// ISA, D[i, j] = weight_only64(x[i, 0]) * (1, -2)[j] exactly (a NaN where that is NaN).
void expect_column_zero_times_one_and_minus_two(const Tensor& x, const QTensor& qb) {
    for_each_backend([&] {
        const Tensor d = gemm(x, qb);
        for (int64_t i = 0; i < x.shape()[0]; ++i) {
            const double ai = double(x.get({i, 0}));
            for (int64_t j = 0; j < 2; ++j) {
                const double want = weight_only64(ai) * (j == 0 ? 1.0 : -2.0);
                const double got = double(d.get({i, j}));
                if (std::isnan(want)) {
                    EXPECT_TRUE(std::isnan(got)) << "D[" << i << ", " << j << "] = " << got;
                } else {
                    EXPECT_EQ(got, want) << "D[" << i << ", " << j << "] for a = " << ai;
                }
            }
        }
    });
}

// The split into bf16 terms and their flush, element by element: D[i, j] = a_i * b_j with one K
// element and B's values 1 and -2 (scale 1), so D is weight_only64(a_i) * b_j exactly (hi b and
// lo b are exact, and so is their sum here) on every backend and ISA: float32 x - ties to even both
// ways (hi 1, lo 2^-8; hi 1 + 2^-6, lo -2^-8), 1 + 2^-12 (hi 1, lo 2^-12: one bf16 would lose it),
// a value past a tie whose lo loses 2^-20 (1 + 2^-8 + 2^-20: hi 1 + 2^-7, lo -2^-8), a carry into
// the exponent (65504 -> 65536 and lo -32), lo's own flush (2^-95 (1 + 2^-10): lo 2^-105 dropped),
// the flush of x just below 2^-102 (unflushed, -1.5 x 2^-103 would stay and 2^-102 (1 - 2^-20)
// would round up to 2^-102), 2^-102 and 3 x 2^-102 kept, NaN and Inf (a NaN's row NaN, no other);
// bf16 x of the values it can hold, and f16 x of 1 + 2^-10 (exact: hi 1, lo 2^-10).
TEST(GemmWeightOnly, SplitsIntoBf16TermsAndFlushesBelowTwoToTheMinus102) {
    const std::vector<float> a = {1.0f + 0x1p-8f,  1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-12f, 1.0f + 0x1p-8f + 0x1p-20f,
                                  65504.0f, 0x1p-95f * (1.0f + 0x1p-10f), -1.5f * 0x1p-103f,
                                  0x1p-102f * (1.0f - 0x1p-20f), 0x1p-102f, -3.0f * 0x1p-102f, NAN, -INFINITY};
    QuantizeOptions unit = qopts(Scaling::tensor(), Format::e4m3fn);
    unit.scale = Tensor::full({1}, 1.0f);
    const QTensor qb = quantize(Tensor::from(std::vector<float>{1.0f, -2.0f}, {2, 1}), unit);
    std::vector<bf16> in_bf16;
    for (const float v : a) {
        if (std::isnan(v) || double(float(bf16(v))) == double(v)) in_bf16.push_back(bf16(v));
    }
    const std::vector<f16> in_f16 = {f16(1.0f + 0x1p-10f), f16(-3.0f), f16(1.0f + 0x1p-8f)};
    for (const Tensor& x : {Tensor::from(a, {int64_t(a.size()), 1}), Tensor::from(in_bf16, {int64_t(in_bf16.size()), 1}),
                            Tensor::from(in_f16, {int64_t(in_f16.size()), 1})}) {
        SCOPED_TRACE(std::string(to_string(x.dtype())) + " x");
        expect_column_zero_times_one_and_minus_two(x, qb);
    }
}

// The same flush where the tiles would read a bf16 x in place (M = 200 rows on the tiles, K = 64:
// whole chunks, one K group): x [200, 64] zero but for column 0, which cycles through the bf16
// values of the test above, B [2, 64] 1 and -2 at k = 0, else 0; D[i, j] = weight_only64(x[i, 0])
// * b_j exactly. Read in place, -1.5 x 2^-103 would stay (its product is no float32 subnormal, so
// the tiles keep it) and a signalling NaN would not be made quiet: x holds both, so it is packed.
// Then with only the values that pack as they are (in place), and with the tiny value alone among
// them, at the last row (the packed tail) and at the first.
TEST(GemmWeightOnly, FlushesBelowTwoToTheMinus102WhereTheTilesReadXInPlace) {
    const int64_t m = 200, k = 64;
    const std::vector<float> special = {-1.5f * 0x1p-103f, 0x1p-102f, -3.0f * 0x1p-102f, 65536.0f, 1.0f + 0x1p-7f, -INFINITY};
    std::vector<float> bv(size_t(2 * k), 0.0f);
    bv[0] = 1.0f;
    bv[size_t(k)] = -2.0f;
    QuantizeOptions unit = qopts(Scaling::tensor(), Format::e4m3fn);
    unit.scale = Tensor::full({1}, 1.0f);
    const QTensor qb = quantize(Tensor::from(bv, {2, k}), unit);
    const auto check = [&](const std::vector<uint16_t>& column, const char* what) {
        SCOPED_TRACE(what);
        std::vector<bf16> xv(size_t(m * k), bf16(0.0f));
        for (int64_t i = 0; i < m; ++i) xv[size_t(i * k)] = bf16::from_bits(column[size_t(i) % column.size()]);
        const Tensor x = Tensor::from(xv, {m, k});
        expect_column_zero_times_one_and_minus_two(x, qb);
    };
    std::vector<uint16_t> plain;
    for (const float v : special) {
        if (std::fabs(v) >= 0x1p-102f) plain.push_back(bf16(v).bits);
    }
    std::vector<uint16_t> all = plain;
    all.push_back(bf16(-1.5f * 0x1p-103f).bits);
    all.push_back(0x7f81);  // a signalling NaN
    check(all, "tiny values and a signalling NaN");
    check(plain, "only values that pack as they are");
    std::vector<uint16_t> last(size_t(m), bf16(1.0f).bits), first = last;
    last.back() = bf16(-1.5f * 0x1p-103f).bits;
    first.front() = last.back();
    check(last, "one tiny value, in the last row");
    check(first, "one tiny value, in the first row");
}

// An Inf in B: x . B is Inf of x's sign where x is not zero, also where x's lo term is zero (lo
// times Inf is NaN) or of the other sign (hi's Inf plus lo's -Inf is NaN): the lo sums are not
// added to a non-finite hi sum. B (e5m2) row 1 holds +Inf at k = 5, A's column 5 is 1 (lo 0),
// 1 + 2^-8 + 2^-20 (lo < 0), -(1 + 2^-12) (lo < 0 with hi), 0 (0 x Inf: NaN); the rest is finite.
// M = 4 on the small-M kernels, 40 on the tiles, with one K group (row) and 128-wide ones.
TEST(GemmWeightOnly, InfInBGivesInfNotNan) {
    const int64_t n = 3, k = 200, ck = 5;
    const float column[] = {1.0f, 1.0f + 0x1p-8f + 0x1p-20f, -(1.0f + 0x1p-12f), 0.0f};
    for (const int64_t m : {int64_t(4), int64_t(40)}) {
        for (const Scaling s : {Scaling::row(), Scaling::block(128, 128)}) {
            SCOPED_TRACE(to_string(s) + " m=" + std::to_string(m));
            std::vector<float> av = gaussian(m, k, 31);
            for (int64_t i = 0; i < m; ++i) av[size_t(i * k + ck)] = column[i % 4];
            QTensor qb = quantize(as_tensor(gaussian(n, k, 32), n, k, DType::f32), qopts(s, Format::e5m2));
            qb.data.data<uint8_t>()[1 * k + ck] = 0x7c;
            const Tensor x = Tensor::from(av, {m, k});
            for_each_backend([&] {
                const Tensor d = gemm(x, qb);
                int bad = 0;
                for (int64_t i = 0; i < m; ++i) {
                    for (int64_t j = 0; j < n; ++j) {
                        const float v = d.get({i, j}), c = column[i % 4];
                        const bool ok = j != 1 ? std::isfinite(v) : c == 0 ? std::isnan(v) : v == std::copysign(INFINITY, c);
                        if (!ok && ++bad <= 3) ADD_FAILURE() << "D[" << i << ", " << j << "] = " << v;
                    }
                }
                EXPECT_EQ(bad, 0);
            });
        }
    }
}

// x near float32's largest values does not overflow before its products: D[i, j] = x_i * b_j with
// one nonzero K element, B's values 1 and -0.5 (scale 1), so D is x_i b_j exactly (x bf16-exact:
// hi = x, lo = 0), on every backend and ISA, for B in every format and x at M on the small-M
// kernels (float32 x: M = 1, 2, packed as 2 and 4 rows; bf16 x: M = 1, 4) and on the tiles (M = 40).
// The AVX2 small-M kernel once took e4m3fn's 2^-8 decode offset back on A's side (x 2^8): Inf for
// |x| >= 2^120, where x b is finite.
TEST(GemmWeightOnly, XNearTheFloat32MaxDoesNotOverflowBeforeItsProducts) {
    const int64_t n = 20, k = 64;
    const float big[] = {0x1p121f, -0x1.fep127f, 0x1.8p125f, -0x1p120f, 1.0f};  // 0x1.fep127: bf16's largest
    const float b_column[] = {1.0f, -0.5f};
    for (const Format fb : {Format::e4m3fn, Format::e5m2, Format::e4m3fnuz, Format::e5m2fnuz}) {
        QuantizeOptions unit = qopts(Scaling::tensor(), fb);
        unit.scale = Tensor::full({1}, 1.0f);
        std::vector<float> w(size_t(n * k), 0.0f);
        for (int64_t j = 0; j < n; ++j) w[size_t(j * k + 3)] = b_column[j % 2];
        const QTensor qb = quantize(Tensor::from(w, {n, k}), unit);
        for (const DType dtype : {DType::f32, DType::bf16}) {
            for (const int64_t m : {int64_t(1), int64_t(2), int64_t(4), int64_t(40)}) {
                SCOPED_TRACE(std::string(to_string(fb)) + " x " + std::string(to_string(dtype)) + " m=" + std::to_string(m));
                std::vector<float> xv(size_t(m * k), 0.0f);
                for (int64_t i = 0; i < m; ++i) xv[size_t(i * k + 3)] = big[i % std::size(big)];
                const Tensor x = as_tensor(xv, m, k, dtype);
                for_each_backend([&] {
                    const Tensor d = gemm(x, qb);
                    int bad = 0;
                    for (int64_t i = 0; i < m; ++i) {
                        for (int64_t j = 0; j < n; ++j) {
                            const float want = big[i % std::size(big)] * b_column[j % 2], v = d.get({i, j});
                            if (v != want && ++bad <= 3) ADD_FAILURE() << "D[" << i << ", " << j << "] = " << v << ", want " << want;
                        }
                    }
                    EXPECT_EQ(bad, 0);
                });
            }
        }
    }
}

// The cuda backend has no weight-only GEMM: a device A without quantize options is refused with
// an error that says so (not run as something else).
TEST(GemmWeightOnly, CudaRefusesIt) {
    FP8KIT_SKIP_WITHOUT_CUDA();
    const QTensor qb =
        quantize(as_tensor(gaussian(16, 32, 1), 16, 32, DType::f32), qopts(Scaling::row(), Format::e4m3fn)).to(Device::cuda);
    const Tensor x = as_tensor(gaussian(16, 32, 2), 16, 32, DType::bf16).to(Device::cuda);
    test::expect_error([&] { (void)gemm(x, qb); }, "weight-only");
}

// ---- the fused cast ----

// gemm({x, options}, B) quantizes A inside the GEMM with exactly quantize()'s codes and scales,
// so D equals gemm(quantize(x, options), B) bit for bit: f32, bf16 and f16 x, contiguous and a
// strided view (a window of a wider tensor), tensor (current and a given scale), row, 1x128 and
// mx32, on every backend and ISA. M = 150 spans several of the cpu backend's 64-row cast panels
// (and threads); K = 300 cuts the last 128 and 32 groups. M = 1 (K = 256, N = 384): a decode
// step's row, one group of the cast (the cuda backend's one-block cast, its decode rows' GEMM).
// Each D is also checked against float64.
TEST(GemmFusedCast, EqualsQuantizeThenGemmBitForBit) {
    struct FuseCase {
        const char* name;
        QuantizeOptions a;
        Scaling b;
    };
    QuantizeOptions given = qopts(Scaling::tensor(), Format::e4m3fn);
    given.scale = Tensor::full({1}, 2.5f);  // delayed scaling: large elements (|x| > 179) saturate
    QuantizeOptions row_e5m2 = qopts(Scaling::row(), Format::e5m2, true);
    const FuseCase cases[] = {{"tensor", qopts(Scaling::tensor(), Format::e4m3fn), Scaling::tensor()},
                              {"tensor_given_scale", given, Scaling::tensor()},
                              {"row_pow2_e5m2", row_e5m2, Scaling::row()},
                              {"block_1x128", qopts(Scaling::block(1, 128), Format::e4m3fn), Scaling::block(128, 128)},
                              {"mx32", qopts(Scaling::mx32(), Format::e4m3fn), Scaling::mx32()}};
    const bool on_cuda = test::cuda_part_runs("the fused cast on the device");
    uint32_t seed = 300;
    for (const Mnk s : {Mnk{150, 70, 300}, Mnk{1, 384, 256}}) {
        const int64_t m = s.m, n = s.n, k = s.k;
        GemmOptions opts;
        opts.alpha = 0.5f;
        opts.bias = Tensor::from(gaussian(1, n, 5, false), {n});
        for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
            const Tensor wide = as_tensor(gaussian(m + 3, k + 9, seed++), m + 3, k + 9, dtype);
            const Tensor view = wide.slice(0, 2, m + 2).slice(1, 5, k + 5);
            for (const Tensor& x : {view.contiguous(), view}) {
                for (const FuseCase& c : cases) {
                    SCOPED_TRACE("M = " + std::to_string(m) + " " + std::string(to_string(dtype)) +
                                 (x.is_contiguous() ? " contiguous " : " strided view ") + c.name);
                    const QTensor qb = quantize(as_tensor(gaussian(n, k, seed++), n, k, DType::f32),
                                                qopts(c.b, Format::e4m3fn, c.a.power_of_two));
                    const QTensor qa_model = quantize(x, c.a);
                    const Product64 p = product64(qa_model, qb);
                    Call call;
                    call.opts = opts;
                    call.bias = values(opts.bias->reshape({1, n}));
                    const Expect e = expect(p, call, DType::f32);
                    for_each_backend([&] {
                        const Tensor fused = gemm({x, c.a}, qb, opts);
                        const Tensor unfused = gemm(quantize(x, c.a), qb, opts);
                        EXPECT_TRUE(identical(fused, unfused));
                        EXPECT_TRUE(within(values(fused), e.d, add(e.bound_cpu, e.bound_ref), n)) << "fused vs float64";
                    });
                    if (on_cuda) {  // cuda: x, B, bias and a given scale on the device
                        QuantizeOptions ad = c.a;
                        if (ad.scale.defined()) ad.scale = ad.scale.to(Device::cuda);
                        const QTensor qbd = qb.to(Device::cuda);
                        const GemmOptions od = options_on(opts, Device::cuda);
                        const Tensor xd = x.is_contiguous() ? x.to(Device::cuda)
                                                            : wide.to(Device::cuda).slice(0, 2, m + 2).slice(1, 5, k + 5);
                        const Tensor fused = gemm({xd, ad}, qbd, od).to(Device::cpu);
                        EXPECT_TRUE(identical(fused, gemm(quantize(xd, ad), qbd, od).to(Device::cpu))) << "cuda";
                        EXPECT_TRUE(within(values(fused), e.d, e.bound_cpu, n)) << "cuda fused vs float64";
                    }
                }
            }
        }
    }
}

// ---- PackedWeight ----

// A PackedWeight used for several GEMMs gives what a fresh pack gives, bit for bit; one packed on
// another backend, or for wider K groups than A allows (row-scaled B with an mx32 A), is repacked
// and still right (checked against float64 too).
TEST(GemmPackedWeight, ReuseEqualsAFreshPack) {
    const int64_t n = 70, k = 300;
    uint32_t seed = 500;
    for (const Scaling sb : {Scaling::row(), Scaling::block(128, 128), Scaling::mx32()}) {
        SCOPED_TRACE("B " + to_string(sb));
        const Scaling sa = sb.granularity == Granularity::block ? Scaling::block(1, 128) : sb;
        const QTensor qb = quantize(as_tensor(gaussian(n, k, seed++), n, k, DType::f32), qopts(sb, Format::e4m3fn));
        const QTensor qa1 = quantize(as_tensor(gaussian(33, k, seed++), 33, k, DType::f32), qopts(sa, Format::e4m3fn));
        const QTensor qa2 = quantize(as_tensor(gaussian(5, k, seed++), 5, k, DType::f32), qopts(sa, Format::e5m2));
        const QTensor qa_mx = quantize(as_tensor(gaussian(20, k, seed++), 20, k, DType::f32), qopts(Scaling::mx32(), Format::e4m3fn));
        const PackedWeight on_ref = on_backend(Backend::ref, [&] { return PackedWeight(qb); });
        EXPECT_EQ(on_ref.backend(), Backend::ref);
        for_each_backend([&] {
            const PackedWeight w(qb);
            EXPECT_EQ(w.n(), n);
            EXPECT_EQ(w.k(), k);
            EXPECT_EQ(w.backend(), backend_for(Device::cpu));
            EXPECT_TRUE(w.source().data.shares_storage_with(qb.data)) << "the source is shared, not copied";
            const Tensor d1 = gemm(qa1, w), d2 = gemm(qa2, w), d3 = gemm(qa1, w);
            EXPECT_TRUE(identical(d1, gemm(qa1, qb)));
            EXPECT_TRUE(identical(d2, gemm(qa2, PackedWeight(qb))));
            EXPECT_TRUE(identical(d3, d1)) << "the same call again";
            EXPECT_TRUE(identical(gemm(qa1, on_ref), d1)) << "a PackedWeight made on ref";
            const Tensor dmx = gemm(qa_mx, w);
            EXPECT_TRUE(identical(dmx, gemm(qa_mx, qb))) << "A with narrower K groups than the pack";
            Call call;
            const Product64 p = product64(qa_mx, qb);
            const Expect e = expect(p, call, DType::f32);
            EXPECT_TRUE(within(values(dmx), e.d, add(e.bound_cpu, e.bound_ref), n)) << "mx32 A on a packed " << to_string(sb) << " B";
        });
    }
}

// A QTensor B is taken for its one call: on the cpu backend its windows are widened straight from
// B's codes (the tiles, folded or not; on AMX every small M too: one row on VDPBF16PS, M = 1; the
// tiles with one A tile held over K, M = 5, and blocks of 32 rows over slices of K, M = 20 and
// 100), else B is packed inside the call (the AVX512-BF16 set's small-M kernel; the small-M
// kernels folding). Either way D is bit for bit what B packed ahead into a PackedWeight gives:
// shapes with a partial last strip, K not a multiple of 32 and K over two windows, row, block and
// mx32 scaling (power-of-two scales fold where M reaches the set's fold_min_m: 2 on AMX, 257 on
// the avx512-bf16 set, M = 300 and 264 here), NaN codes of each format kind in B (e4m3fnuz's is
// 0x80, which the widening fixes up): the last strip's last code, and row 1's first - the code
// right after row 0's last, which K's padding must not read.
TEST(GemmPackedWeight, AQTensorBForOneCallEqualsItsPackedWeight) {
    const Mnk shapes[] = {{150, 70, 300}, {136, 40, 3100}, {200, 48, 512}, {20, 70, 300}, {5, 70, 300},
                          {100, 40, 3100}, {1, 40, 3100},  {300, 70, 300}, {264, 40, 3100}};
    uint32_t seed = 900;
    for (const Mnk s : shapes) {
        for (const GranCase& g : gran_cases()) {
            for (const auto& [format, nan] : {std::pair{Format::e4m3fn, uint8_t(0xff)}, std::pair{Format::e4m3fnuz, uint8_t(0x80)}}) {
                SCOPED_TRACE(g.name + " " + std::to_string(s.m) + " x " + std::to_string(s.n) + " x " + std::to_string(s.k) +
                             " " + std::string(to_string(format)));
                const QTensor qa =
                    quantize(as_tensor(gaussian(s.m, s.k, seed++), s.m, s.k, DType::f32), qopts(g.a, format, g.power_of_two));
                QTensor qb = quantize(as_tensor(gaussian(s.n, s.k, seed++), s.n, s.k, DType::f32), qopts(g.b, format, g.power_of_two));
                qb.data = qb.data.clone();
                qb.data.data<uint8_t>()[(s.n - 1) * s.k + s.k - 1] = nan;
                qb.data.data<uint8_t>()[s.k] = nan;
                for_each_backend([&] {
                    const Tensor packed = gemm(qa, PackedWeight(qb, qa.scaling)), one_call = gemm(qa, qb);
                    EXPECT_TRUE(identical(one_call, packed));
                    EXPECT_TRUE(std::isnan(one_call.get({0, s.n - 1})) && std::isnan(one_call.get({0, 1})));
                    EXPECT_FALSE(std::isnan(one_call.get({0, 0}))) << "row 0 of B holds no NaN";
                });
            }
        }
    }
}

// release_codes leaves the packed layout as the weight's only copy: the codes read back from it
// are the source's byte for byte (shapes with a partial last strip, K not a multiple of 32, an odd
// last K group), every GEMM the packing serves (FP8, fused-cast and weight-only A) is the same bit
// for bit, and what would need a repack - or a backend whose layout is the source itself - is
// refused by name.
TEST(GemmPackedWeight, ReleasedCodesReadBackAndServeTheSameGemm) {
    uint32_t seed = 900;
    const int64_t shapes[][2] = {{70, 300}, {16, 33}, {5, 1}, {130, 257}};
    for (const auto& shape : shapes) {
        const int64_t n = shape[0], k = shape[1];  // (not a structured binding: the lambdas below capture them)
        for (const Scaling sb : {Scaling::tensor(), Scaling::row(), Scaling::block(128, 128), Scaling::mx32()}) {
            SCOPED_TRACE(std::to_string(n) + " x " + std::to_string(k) + ", B " + to_string(sb));
            const Scaling sa = sb.granularity == Granularity::block ? Scaling::block(1, 128) : sb;
            const QTensor qb = quantize(as_tensor(gaussian(n, k, seed++), n, k, DType::f32), qopts(sb, Format::e4m3fn));
            const QTensor qa = quantize(as_tensor(gaussian(20, k, seed++), 20, k, DType::f32), qopts(sa, Format::e4m3fn));
            for_each_isa([&](Isa) {
                PackedWeight w(qb);
                const Tensor x = as_tensor(gaussian(4, k, seed), 4, k, DType::f32);
                const Tensor before = gemm(qa, w), fused_before = gemm({x, qopts(sa, Format::e4m3fn)}, w);
                const Tensor weight_only_before = gemm(x, w);
                w.release_codes();
                EXPECT_TRUE(w.codes_released());
                EXPECT_FALSE(w.source().data.defined()) << "the source's codes are let go";
                EXPECT_EQ(w.format(), Format::e4m3fn);
                Tensor codes = Tensor::empty({n, k}, DType::e4m3fn);
                w.codes_into(codes);
                EXPECT_EQ(std::memcmp(codes.const_raw_data(), qb.data.const_raw_data(), size_t(n * k)), 0)
                    << "the codes read back from the packed layout";
                EXPECT_TRUE(identical(gemm(qa, w), before)) << "the GEMM after the release";
                EXPECT_TRUE(identical(gemm({x, qopts(sa, Format::e4m3fn)}, w), fused_before)) << "the fused cast's";
                EXPECT_TRUE(identical(gemm(x, w), weight_only_before)) << "the weight-only GEMM's";
                if (k > 32 && (sb.granularity == Granularity::row || sb.granularity == Granularity::tensor)) {
                    const QTensor qa_mx = quantize(as_tensor(gaussian(3, k, seed), 3, k, DType::f32),
                                                   qopts(Scaling::mx32(), Format::e4m3fn));
                    expect_error([&] { gemm(qa_mx, w); }, "release_codes");  // narrower K groups: a repack
                    // Packed for A's narrower groups from the start: released, it serves that GEMM
                    // bit for bit as the repacking one (the codes kept) does.
                    PackedWeight narrow(qb, Scaling::mx32());
                    EXPECT_EQ(narrow.k_group(), 32);
                    const Tensor repacked = gemm(qa_mx, PackedWeight(qb));
                    narrow.release_codes();
                    EXPECT_TRUE(identical(gemm(qa_mx, narrow), repacked)) << "A in 1 x 32 groups, packed for them";
                    Tensor back = Tensor::empty({n, k}, DType::e4m3fn);
                    narrow.codes_into(back);
                    EXPECT_EQ(std::memcmp(back.const_raw_data(), qb.data.const_raw_data(), size_t(n * k)), 0);
                }
                expect_error([&] { w.codes_into(Tensor::empty({n, k + 1}, DType::e4m3fn)); }, "codes_into: out");
            });
        }
    }
    const QTensor qb = quantize(as_tensor(gaussian(8, 64, seed), 8, 64, DType::f32), qopts(Scaling::row(), Format::e4m3fn));
    PackedWeight on_ref = on_backend(Backend::ref, [&] { return PackedWeight(qb); });
    expect_error([&] { on_ref.release_codes(); }, "reads B as it is");
    PackedWeight w(qb);
    w.release_codes();
    expect_error([&] { on_backend(Backend::ref, [&] { return gemm(qb, w); }); }, "release_codes");
}

// ---- determinism ----

// Threads split M and N, never K: D is bit for bit the same on 1, 2 and 3 threads, on every ISA
// path, for every scaling and for the fused cast (whose 64-row panels are cast on the threads).
TEST(GemmOps, ThreadCountDoesNotChangeD) {
    const int64_t m = 200, n = 300, k = 600;
    const int saved = num_threads();
    struct Restore {
        int threads;
        ~Restore() { set_num_threads(threads); }
    } restore{saved};
    uint32_t seed = 700;
    const std::vector<float> xv = gaussian(m, k, seed++);
    for (const GranCase& g : gran_cases()) {
        SCOPED_TRACE(g.name);
        const QuantizeOptions oa = qopts(g.a, Format::e4m3fn, g.power_of_two);
        const QTensor qb = quantize(as_tensor(gaussian(n, k, seed++), n, k, DType::f32), qopts(g.b, Format::e4m3fn, g.power_of_two));
        const QTensor qa = quantize(as_tensor(xv, m, k, DType::f32), oa);
        const Tensor x = as_tensor(xv, m, k, DType::bf16);
        GemmOptions opts;
        opts.bias = Tensor::from(gaussian(1, n, seed++, false), {n});
        opts.activation = Activation::gelu;
        const Product64 p = product64(qa, qb);
        Call call;
        call.opts = opts;
        call.bias = values(opts.bias->reshape({1, n}));
        const Expect e = expect(p, call, DType::f32);
        on_backend(Backend::cpu, [&] {
            for_each_isa([&](Isa) {
                set_num_threads(1);
                const Tensor d1 = gemm(qa, qb, opts), f1 = gemm({x, oa}, qb, opts);
                EXPECT_TRUE(within(values(d1), e.d, e.bound_cpu, n)) << "1 thread vs float64";
                for (int threads : {2, 3}) {
                    set_num_threads(threads);
                    EXPECT_TRUE(identical(gemm(qa, qb, opts), d1)) << threads << " threads";
                    EXPECT_TRUE(identical(gemm({x, oa}, qb, opts), f1)) << threads << " threads, fused cast";
                }
            });
            return 0;
        });
    }
}

// D in bfloat16 is D in float32 rounded once, to nearest even (fp8kit::bf16, NaN kept), on every
// ISA path: where the epilogue only scales and adds a float32 bias, the cpu kernels store D from
// their own vectors (GemmKernels::scale_store). Shapes through the small-M kernels, the tiles with
// K in one window and K past it (the avx512-bf16 and AVX2 tiles; on AMX M = 64 streams), one row
// of B all NaN; a truncating or ties-away store fails. And a float32 bias gives the D that the
// same values as a bf16 bias give through the general epilogue (product, then + bias: a product
// and bias fused into one FMA fails).
TEST(GemmOps, Bf16DIsTheFloat32DRoundedOnce) {
    uint32_t seed = 950;
    for (const Mnk s : {Mnk{1, 40, 1100}, Mnk{16, 48, 256}, Mnk{130, 257, 129}, Mnk{64, 300, 2100}}) {
        for (const Scaling sc : {Scaling::tensor(), Scaling::row()}) {
            SCOPED_TRACE(std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) + " " + to_string(sc));
            const QTensor qa = quantize(as_tensor(gaussian(s.m, s.k, seed), s.m, s.k, DType::f32), qopts(sc, Format::e4m3fn));
            QTensor qb = quantize(as_tensor(gaussian(s.n, s.k, seed + 1), s.n, s.k, DType::f32), qopts(sc, Format::e4m3fn));
            seed += 2;
            std::memset(qb.data.raw_data(), 0x7f, size_t(s.k));  // B's row 0: e4m3fn NaN codes
            on_backend(Backend::cpu, [&] {
                for_each_isa([&](Isa) {
                    GemmOptions o;
                    o.alpha = 0.75f;
                    const Tensor f = gemm(qa, qb, o);
                    o.out_dtype = DType::bf16;
                    const Tensor h = gemm(qa, qb, o);
                    std::vector<bf16> want;
                    for (const double v : values(f)) want.push_back(bf16(float(v)));
                    EXPECT_TRUE(identical(h, Tensor::from(want, {s.m, s.n})));
                    EXPECT_TRUE(std::isnan(h.get({0, 0})));
                    // alpha 2^-140: most of D float32 subnormals, whose bf16 rounding is kept (not
                    // flushed to zero, as AVX512-BF16's conversion alone would).
                    GemmOptions tiny;
                    tiny.alpha = 0x1p-140f;
                    const Tensor ft = gemm(qa, qb, tiny);
                    tiny.out_dtype = DType::bf16;
                    want.clear();
                    for (const double v : values(ft)) want.push_back(bf16(float(v)));
                    EXPECT_TRUE(identical(gemm(qa, qb, tiny), Tensor::from(want, {s.m, s.n}))) << "subnormal D";
                    std::vector<float> bv = gaussian(1, s.n, seed);
                    for (float& x : bv) x = float(bf16(x));  // the same values in both dtypes
                    const Tensor bias16 = as_tensor(bv, 1, s.n, DType::bf16).reshape({s.n});
                    for (const DType out : {DType::f32, DType::bf16}) {
                        o.out_dtype = out;
                        o.bias = Tensor::from(bv, {s.n});
                        const Tensor fast = gemm(qa, qb, o);
                        o.bias = bias16;
                        EXPECT_TRUE(identical(fast, gemm(qa, qb, o))) << to_string(out) << " D";
                    }
                });
                return 0;
            });
        }
    }
}

// The cpu GEMM's GELU (src/cpu/gemm_kernels.hpp, gelu_epilogue: x / (1 + exp(-2z)) in float32)
// within its stated bound of the float64 tanh form, 2.85 u |x| to first order (3 u |x| here, u =
// 2^-24, plus half the smallest subnormal for results that small), for x given as the bias of a
// product that is 0 (A all zero codes): every float32 exponent from the subnormals to 2^127 of
// either sign with 64 spread mantissas, a dense sweep of [-12, 12] (where the exp's range reduction
// moves through n = -18 ... 24 and the sigmoid from 1 to 0), around the clamps (w = -86 and
// w = 88.38 / 88.8: x near -5.9), and +-0, +-Inf, NaN: -Inf gives NaN, as the tanh form does
// (-Inf x 0). On every ISA path (the kernel TUs vectorize it: AVX2, AVX-512), M = 1 (the small-M
// kernels) and M = 33 (tiles), D float32 and bf16 (bf16: the float32 D rounded once), and through
// the general epilogue (with a C of zeros) bit for bit the same. Every 7th float32 measured 2.04 u
// |x| at most; planted errors that fail: the polynomial of degree 5 (14 u |x|), r reduced without
// ln2_lo (1375 u |x|), 2^n one exponent off.
TEST(GemmOps, GeluEpilogueWithinItsBound) {
    std::vector<float> xs = {0.0f, -0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::max(),
                             -std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                             -std::numeric_limits<float>::denorm_min()};
    for (int e = -149; e <= 127; ++e) {
        for (int i = 0; i < 64; ++i) {
            const float x = std::ldexp(1.0f + float(i * 37 % 64) / 64.0f + float(i) * 0x1p-23f, e);
            xs.push_back(x);
            xs.push_back(-x);
        }
    }
    for (int i = -24000; i <= 24000; ++i) xs.push_back(float(i) * 0.0005f + 0x1p-20f * float(i % 7));
    for (int i = -2000; i <= 2000; ++i) xs.push_back(-5.9f + float(i) * 0x1p-12f);
    const int64_t n = int64_t(xs.size()), k = 32;
    const Tensor bias = Tensor::from(xs, {n});
    const QTensor qb = quantize(as_tensor(gaussian(n, k, 961), n, k, DType::f32), qopts(Scaling::tensor(), Format::e4m3fn));
    const double u = 0x1p-24;
    for (const int64_t m : {int64_t(1), int64_t(33)}) {
        SCOPED_TRACE("M = " + std::to_string(m));
        const QTensor qa = quantize(Tensor::zeros({m, k}, DType::f32), qopts(Scaling::tensor(), Format::e4m3fn));
        on_backend(Backend::cpu, [&] {
            for_each_isa([&](Isa) {
                GemmOptions o;
                o.bias = bias;
                o.activation = Activation::gelu;
                const Tensor d = gemm(qa, qb, o);
                int64_t failures = 0;
                for (int64_t i = 0; i < m; ++i) {
                    for (int64_t j = 0; j < n && failures < 5; ++j) {
                        const double x = xs[size_t(j)], want = gelu64(x), got = d.get({i, j});
                        const bool ok = std::isnan(want) ? std::isnan(got)
                                        : std::isinf(want) ? got == want
                                                          : std::fabs(got - want) <= 3 * u * std::fabs(x) + 0x1p-150;
                        if (!ok) {
                            ++failures;
                            ADD_FAILURE() << "gelu(" << x << ") = " << got << ", float64 " << want << ": off by "
                                          << std::fabs(got - want) / (u * std::fabs(x)) << " u |x|";
                        }
                    }
                }
                EXPECT_EQ(failures, 0);
                o.out_dtype = DType::bf16;
                std::vector<bf16> want;
                for (const double v : values(d)) want.push_back(bf16(float(v)));
                EXPECT_TRUE(identical(gemm(qa, qb, o), Tensor::from(want, {m, n}))) << "bf16 D";
                o.out_dtype = DType::f32;
                o.c = Tensor::zeros({m, n}, DType::f32);
                o.beta = 1.0f;
                EXPECT_TRUE(identical(gemm(qa, qb, o), d)) << "the general epilogue";
            });
            return 0;
        });
    }
}

// The small-M kernels add each output's K pairs in K order into one float32 lane, as the tiles
// do: the first M rows of A give the first M rows of the tiles' D (M = 160) bit for bit, for one K
// group (row) and for many (block, mx32; each group's partial sum promoted in turn). On the
// avx512-bf16 kernels that is the VDPBF16PS kernel at 2 <= M <= 32; on AMX the streaming tile
// kernel at 2 <= M <= 128 (one and two A tiles, blocks of 32 rows, one strip left over at n = 130,
// slices of K cut by the groups' ends; K = 8300 is cut into slices whose A fits the kernel's 512
// KiB: 2 at M <= 32, one block whose C the tiles hold and store at a slice's end, 3 at M = 33 and
// 48, 5 at M = 100 and 128; the tiles' D from M = 160); on the AVX2 kernels, M <= 24 in passes of 3 to 6 rows (7 = 4 + 3,
// 9 = 5 + 4, 16 = 6 + 5 + 5, 17 = 6 + 6 + 5, 24 = 6 x 4). M = 1 is the stated exception (pairs in
// four lanes, NUMERICS.md), and on AVX2 M = 2 (one pass of 2 rows), which sums elements 0 and 1 of
// the pairs in lanes apart. Rowwise and blockwise A scales depend on their own row only, so the rows'
// codes and scales are the same in both products.
TEST(GemmOps, SmallMKernelsSumAsTheTiles) {
    const int64_t big = 160, n = 130, k = 8300;
    bool ran = false;
    uint32_t seed = 900;
    const std::vector<float> xv = gaussian(big, k, seed++);
    on_backend(Backend::cpu, [&] {
        for_each_isa([&](Isa) {
            const std::string kernels(gemm_kernels_name());
            const std::vector<int64_t> ms = kernels == "avx2" ? std::vector<int64_t>{3, 4, 5, 6, 7, 8, 9, 16, 17, 24}
                                            : kernels == "avx512-bf16" || kernels == "amx"
                                                ? std::vector<int64_t>{2, 3, 8, 9, 16, 17, 31, 32, 33, 48, 100, 128}
                                                : std::vector<int64_t>{};
            if (ms.empty()) return;
            ran = true;
            for (const GranCase& g : gran_cases()) {
                if (g.name == "tensor" || g.name == "tensor_x_block") continue;  // A's scale spans all rows
                SCOPED_TRACE(g.name);
                const QuantizeOptions oa = qopts(g.a, Format::e4m3fn, g.power_of_two);
                const QTensor qb = quantize(as_tensor(gaussian(n, k, seed++), n, k, DType::f32),
                                            qopts(g.b, Format::e4m3fn, g.power_of_two));
                const std::vector<double> tiles = values(gemm(quantize(as_tensor(xv, big, k, DType::f32), oa), qb));
                for (const int64_t m : ms) {
                    const std::vector<float> x(xv.begin(), xv.begin() + m * k);
                    const std::vector<double> small = values(gemm(quantize(as_tensor(x, m, k, DType::f32), oa), qb));
                    int64_t differ = 0;
                    for (int64_t i = 0; i < m * n; ++i) differ += bits(float(small[size_t(i)])) != bits(float(tiles[size_t(i)]));  // f32 outputs, exact in double
                    EXPECT_EQ(differ, 0) << "M = " << m << ": elements of D not equal to the tiles' bit for bit";
                }
            }
        });
        return 0;
    });
    if (!ran) {
        const char* env = std::getenv("FP8KIT_ISA");
        if (env != nullptr && *env != '\0' && cpu_supports(Isa::avx2)) {
            GTEST_SKIP() << "FP8KIT_ISA=" << env << " chose a path without the avx2, avx512-bf16 or amx GEMM kernels";
        }
        GTEST_SKIP() << "needs the avx2, avx512-bf16 or amx GEMM kernels: this CPU or build has none of them";
    }
}

// ---- NaN and Inf ----

// Codes injected after quantizing (a NaN input would make a tensor scale non-finite): a NaN
// code (e4m3fn's 0x7f in A and 0xff in B; e4m3fnuz's 0x80) in row i of A makes row i of D NaN and
// nothing else; in row j of B, column j. Every scaling, every backend and ISA, f32 and bf16
// output, M on the tiles and on the small-M kernel (which decodes B's strips with and without a
// NaN code differently).

// The avx512-bf16 small-M kernel also takes 32 < M <= 256 on a B packed ahead with at least 8 MiB
// of codes and two panels of strips a thread (src/cpu/gemm_avx512.cpp, avx512_small_m_max_large_b;
// here 2 threads, B 1024 x 8300: 8.5 MiB, 64 strips): its first M rows of D are the tiles' (M =
// 272) bit for bit, for one K group and for 128-wide ones, at M = 33 (groups of 17 and 16 rows),
// 100 and 256 (16 groups of 16).
TEST(GemmOps, SmallMKernelOnALargePackedBSumsAsTheTiles) {
    const int64_t big = 272, n = 1024, k = 8300;
    bool ran = false;
    const int threads = num_threads();
    set_num_threads(2);
    const std::vector<float> xv = gaussian(big, k, 950);
    on_backend(Backend::cpu, [&] {
        for_each_isa([&](Isa) {
            if (std::string(gemm_kernels_name()) != "avx512-bf16") return;
            ran = true;
            for (const GranCase& g : gran_cases()) {
                if (g.name != "row" && g.name != "block") continue;
                SCOPED_TRACE(g.name);
                const QuantizeOptions oa = qopts(g.a, Format::e4m3fn, g.power_of_two);
                const PackedWeight w(quantize(as_tensor(gaussian(n, k, 951), n, k, DType::f32), qopts(g.b, Format::e4m3fn, false)));
                const std::vector<double> tiles = values(gemm(quantize(as_tensor(xv, big, k, DType::f32), oa), w));
                for (const int64_t m : {int64_t(33), int64_t(100), int64_t(256)}) {
                    const std::vector<float> x(xv.begin(), xv.begin() + m * k);
                    const std::vector<double> small = values(gemm(quantize(as_tensor(x, m, k, DType::f32), oa), w));
                    int64_t differ = 0;
                    for (int64_t i = 0; i < m * n; ++i) differ += bits(float(small[size_t(i)])) != bits(float(tiles[size_t(i)]));
                    EXPECT_EQ(differ, 0) << "M = " << m << ": elements of D not equal to the tiles' bit for bit";
                }
            }
        });
        return 0;
    });
    set_num_threads(threads);
    if (!ran) GTEST_SKIP() << "needs the avx512-bf16 GEMM kernels (AVX512-BF16 and VBMI without AMX): this CPU or build has none";
}
TEST(GemmNaN, NanCodePoisonsOnlyItsRowOrColumn) {
    const int64_t n = 45, k = 300, nj = 9;
    const struct {
        Format format;
        uint8_t nan_a, nan_b;
    } formats[] = {{Format::e4m3fn, 0x7f, 0xff}, {Format::e4m3fnuz, 0x80, 0x80}};
    for (const auto& f : formats) {
        for (const int64_t m : {int64_t(37), int64_t(3), int64_t(150)}) {  // 150: the tiles' window (past small M)
            const int64_t ni = m / 2;
            for (const GranCase& g : gran_cases()) {
                SCOPED_TRACE(g.name + " m=" + std::to_string(m) + " " + std::string(to_string(f.format)));
                const QTensor qa = quantize(as_tensor(gaussian(m, k, 11), m, k, DType::f32), qopts(g.a, f.format));
                const QTensor qb = quantize(as_tensor(gaussian(n, k, 12), n, k, DType::f32), qopts(g.b, f.format));
                QTensor qa_nan = qa, qb_nan = qb;
                qa_nan.data = qa.data.clone();
                qb_nan.data = qb.data.clone();
                qa_nan.data.data<uint8_t>()[ni * k + 77] = f.nan_a;
                qb_nan.data.data<uint8_t>()[nj * k + 200] = f.nan_b;
                for (DType out : {DType::f32, DType::bf16}) {
                    GemmOptions opts;
                    opts.out_dtype = out;
                    for_each_backend([&] {
                        const struct {
                            const char* what;
                            const QTensor& a;
                            const QTensor& b;
                            int64_t row, col;  // the NaN row / column of D, or -1
                        } cases[] = {{"A", qa_nan, qb, ni, -1}, {"B", qa, qb_nan, -1, nj}, {"A and B", qa_nan, qb_nan, ni, nj}};
                        for (const auto& c : cases) {
                            const Tensor d = gemm(c.a, c.b, opts);
                            int bad = 0;
                            for (int64_t i = 0; i < m; ++i) {
                                for (int64_t j = 0; j < n; ++j) {
                                    const float v = d.get({i, j});
                                    const bool want_nan = i == c.row || j == c.col;
                                    if (want_nan != std::isnan(v) || (!want_nan && !std::isfinite(v))) {
                                        if (++bad <= 3) ADD_FAILURE() << "NaN in " << c.what << " (" << to_string(out) << "): D[" << i << ", " << j << "] = " << v;
                                    }
                                }
                            }
                            EXPECT_EQ(bad, 0) << "NaN in " << c.what;
                        }
                    });
                }
            }
        }
    }
}

// A tensorwise operand of scale 1 with the given codes: rows x k of `fill(row, j)`.
template <class Fill>
QTensor codes_operand(Format f, int64_t rows, int64_t k, Fill fill) {
    QTensor q = quantize(as_tensor(std::vector<float>(size_t(rows * k), 0.0f), rows, k, DType::f32), qopts(Scaling::tensor(), f));
    q.data = q.data.clone();
    q.scale_inv = Tensor::from(std::vector<float>{1.0f}, q.scale_inv.shape());
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < k; ++j) q.data.data<uint8_t>()[r * k + j] = fill(r, j);
    }
    return q;
}

// Row c holds code c at K index c % k and +1 and -1 (32 of each) elsewhere.
QTensor every_code_rows(Format f, int64_t k) {
    return codes_operand(f, 256, k, [&](int64_t c, int64_t j) {
        const int64_t before = j < c % k ? j : j - 1;  // fillers before this one
        return j == c % k ? uint8_t(c) : encode(before < 32 ? 1.0f : -1.0f, f);
    });
}

// Whether each D[i, j] is exactly decode(code) of the code in its row of A (codes_in_a: D's row
// i) or of B (D's column j), with the first few misses reported.
bool every_code_exact(const Tensor& d, bool codes_in_a, Format f) {
    int bad = 0;
    for (int64_t i = 0; i < d.shape()[0]; ++i) {
        for (int64_t j = 0; j < d.shape()[1]; ++j) {
            const int64_t c = codes_in_a ? i : j;
            const float want = 0.0f + decode(uint8_t(c), f), got = d.get({i, j});
            if (!same_float(got, want) && ++bad <= 3) {
                ADD_FAILURE() << "code 0x" << std::hex << c << std::dec << ": D[" << i << ", " << j << "] = " << got << ", want " << want;
            }
        }
    }
    return bad == 0;
}

// Every code of B widens exactly: B's row c holds code c at K index c % k and +1 and -1 (32 of
// each) elsewhere, A is all 1.0 and both scales 1, so D[i, c] = decode(c) + 32 - 32 in some order
// - exactly decode(c), as every partial sum is decode(c) or 0 plus an integer of at most 32 in
// magnitude, within float32's 24 bits for every FP8 value (the smallest, 2^-17, beside 32: 23) -
// subnormals, the largest value, Inf and NaN (fnuz's 0x80 included, which is not -0), -0 giving
// +0. For each FP8 format B takes, on the tiles (M = 40) and on the small-M kernels (M = 3, 1),
// every backend and ISA path. The +-1 fillers are normal codes: a line of B (64 codes) holds a
// code that is not only where code c is a zero, subnormal, Inf or NaN, so every normal code goes
// through the arithmetic widening where a kernel has one (AMX, M = 1) and the others through the
// byte tables. (The tables look codes up by their low 7 bits and take the sign from the top bit;
// dropping the fnuz NaN fix-up, or the sign, fails this, as does a wrong shift, mask or bias of
// the arithmetic widening, or A not scaled to match it.)
void expect_every_code_of_b_exact() {
    const int64_t k = 65;
    const std::pair<Format, Format> pairs[] = {{Format::e4m3fn, Format::e4m3fn},
                                               {Format::e4m3fn, Format::e5m2},
                                               {Format::e4m3fnuz, Format::e4m3fnuz},
                                               {Format::e4m3fnuz, Format::e5m2fnuz}};
    for (const auto& pair : pairs) {
        const Format fa = pair.first, fb = pair.second;  // named copies: clang before 16 cannot capture a structured binding
        const QTensor qb = every_code_rows(fb, k);
        for (const int64_t m : {int64_t(40), int64_t(3), int64_t(1)}) {
            SCOPED_TRACE(std::string(to_string(fb)) + " m=" + std::to_string(m));
            const QTensor qa = codes_operand(fa, m, k, [&](int64_t, int64_t) { return encode(1.0f, fa); });
            for_each_backend([&] { EXPECT_TRUE(every_code_exact(gemm(qa, qb), false, fb)); });
        }
    }
}

// The same for A (256 rows, code c in row c; B all 1.0, 40 columns): every code of A, in each
// format A takes (e5m2: the gradients of a backward pass), packs exactly - the AVX2 path packs
// A's codes with the widening's own decode, 32 at a time, and K = 65 leaves one to the table.
void expect_every_code_of_a_exact() {
    const int64_t k = 65, n = 40;
    const std::pair<Format, Format> pairs[] = {{Format::e4m3fn, Format::e4m3fn},
                                               {Format::e5m2, Format::e4m3fn},
                                               {Format::e4m3fnuz, Format::e4m3fnuz},
                                               {Format::e5m2fnuz, Format::e4m3fnuz}};
    for (const auto& pair : pairs) {
        const Format fa = pair.first, fb = pair.second;
        SCOPED_TRACE(std::string(to_string(fa)));
        const QTensor qa = every_code_rows(fa, k);
        const QTensor qb = codes_operand(fb, n, k, [&](int64_t, int64_t) { return encode(1.0f, fb); });
        for_each_backend([&] { EXPECT_TRUE(every_code_exact(gemm(qa, qb), true, fa)); });
    }
}

TEST(GemmOps, EveryCodeOfBDecodesExactly) { expect_every_code_of_b_exact(); }
TEST(GemmOps, EveryCodeOfADecodesExactly) { expect_every_code_of_a_exact(); }

// The AVX2 small-M kernel decodes B without its last multiply where A, times 2^(127 - bias - c),
// can take it, and multiplies the sums by 2^c (src/cpu/gemm_avx2_small.cpp, offset_shift); c comes from
// all of A. Weight-only bf16 x [2, 64] times B (every format, unit scale) whose rows j hold, at
// K = 0, 1, 2: (1, s, -s) and (-0.5, -s, s), s B's smallest subnormal; D is exact in float32, so
// it must equal the float64 sum (scaled by 2^-c while the check holds, every sum stays a normal):
// - x rows (2^100, 0, 0) and (0, 1, 1 - 2^-7): c = 101 - bias, the rows' D 2^100 b_j0 and +-2^-7 s
//   (without the multiply by 2^c, 2^-c of that);
// - x rows (2^20, 0, 0) and (0, 2^-100 (1 + 2^-7), 2^-100): c would be 21 - bias, and the second
//   row's D, +-2^-107 s (2^-116 for e4m3fn), times 2^-c is below the normals - the kernel must not
//   offset here (with flush-to-zero set, DenormalsAreZeroAndFlushToZeroChangeNothing, it would
//   give 0).
// At M = 2 (small-M kernel) and M = 40 (tiles; the two rows repeated), every backend and ISA.
// And where a float32 sum overflows on its way, D keeps the Inf, as the tiles' K-order sums do
// (the offset, 2^-c, would keep that sum finite): x rows (2^127, 0, 2^127, 0, -2^127) against B
// rows of 1s, on the cpu backend (ref sums in float64: 2^127), M = 2 bit for bit the tiles' M = 40.
void expect_small_m_offset_exact() {
    const int64_t k = 64;
    const std::vector<std::vector<float>> cases = {{0x1p100f, 0.0f, 0.0f, 0.0f, 1.0f, 1.0f - 0x1p-7f},
                                                   {0x1p20f, 0.0f, 0.0f, 0.0f, 0x1p-100f * (1.0f + 0x1p-7f), 0x1p-100f}};
    for (const Format fb : {Format::e4m3fn, Format::e5m2, Format::e4m3fnuz, Format::e5m2fnuz}) {
        const float sub = format_info(fb).min_subnormal;
        const float b_rows[2][3] = {{1.0f, sub, -sub}, {-0.5f, -sub, sub}};
        std::vector<float> w(size_t(2 * k), 0.0f);
        for (int j = 0; j < 2; ++j) std::copy(b_rows[j], b_rows[j] + 3, w.begin() + j * k);
        QuantizeOptions unit = qopts(Scaling::tensor(), fb);
        unit.scale = Tensor::full({1}, 1.0f);
        const QTensor qb = quantize(Tensor::from(w, {2, k}), unit);
        for (size_t c = 0; c < cases.size(); ++c) {
            for (const int64_t m : {int64_t(2), int64_t(40)}) {
                SCOPED_TRACE(std::string(to_string(fb)) + " case " + std::to_string(c) + " m=" + std::to_string(m));
                std::vector<float> xv(size_t(m * k), 0.0f);
                for (int64_t i = 0; i < m; ++i) std::copy_n(cases[c].begin() + 3 * (i % 2), 3, xv.begin() + i * k);
                const Tensor x = as_tensor(xv, m, k, DType::bf16);
                for_each_backend([&] {
                    const Tensor d = gemm(x, qb);
                    int bad = 0;
                    for (int64_t i = 0; i < m; ++i) {
                        for (int64_t j = 0; j < 2; ++j) {
                            double want = 0.0;
                            for (int e = 0; e < 3; ++e) want += double(xv[size_t(i * k + e)]) * double(b_rows[j][e]);
                            if (d.get({i, j}) != float(want) && ++bad <= 3) {
                                ADD_FAILURE() << "D[" << i << ", " << j << "] = " << d.get({i, j}) << ", want " << want;
                            }
                        }
                    }
                    EXPECT_EQ(bad, 0);
                });
            }
        }
        const float overflowing[] = {0x1p127f, 0.0f, 0x1p127f, 0.0f, -0x1p127f};
        std::vector<float> xv(size_t(40 * k), 0.0f);
        for (int64_t i = 0; i < 40; ++i) std::copy(std::begin(overflowing), std::end(overflowing), xv.begin() + i * k);
        const QTensor ones = quantize(Tensor::full({2, k}, 1.0f), unit);
        on_backend(Backend::cpu, [&] {
            for_each_isa([&](Isa) {
                const Tensor tiles = gemm(as_tensor(xv, 40, k, DType::bf16), ones);
                const Tensor small = gemm(as_tensor(std::vector<float>(xv.begin(), xv.begin() + 2 * k), 2, k, DType::bf16), ones);
                for (int64_t j = 0; j < 2; ++j) {
                    EXPECT_EQ(tiles.get({0, j}), INFINITY) << to_string(fb) << ": the tiles' K-order float32 sum";
                    EXPECT_EQ(small.get({0, j}), tiles.get({0, j})) << to_string(fb) << ": M = 2 against the tiles";
                }
            });
            return 0;
        });
    }
}

TEST(GemmWeightOnly, SmallMOffsetKeepsD) { expect_small_m_offset_exact(); }

#if defined(__x86_64__) || defined(_M_X64)
// torch.set_flush_denormal(True) sets MXCSR's denormals-are-zero and flush-to-zero on its thread;
// D must not change: the AVX2 kernels' decode yields float32 subnormals (B's subnormal codes
// before their multiply) that denormals-are-zero would read as 0 - the kernels clear it while they
// run. The three tests above again, on one thread (so all the work runs under the flags), and
// the caller's flags are there after.
TEST(GemmOps, DenormalsAreZeroAndFlushToZeroChangeNothing) {
    constexpr unsigned flags = 0x8040;  // MXCSR.FTZ | MXCSR.DAZ
    const int saved_threads = num_threads();
    const unsigned saved_csr = _mm_getcsr();
    struct Restore {
        int threads;
        unsigned csr;
        ~Restore() {
            _mm_setcsr(csr);
            set_num_threads(threads);
        }
    } restore{saved_threads, saved_csr};
    set_num_threads(1);
    _mm_setcsr(saved_csr | flags);
    expect_every_code_of_b_exact();
    expect_every_code_of_a_exact();
    expect_small_m_offset_exact();
    EXPECT_EQ(_mm_getcsr() & flags, flags) << "the caller's MXCSR flags are not restored";
}
#endif

// IEEE: Inf (e5m2 code 0x7c) times 0 is NaN. B row j has +Inf at k; A has 0 at (i, k) and +1.0
// (code 0x38) at every other (i', k): D[i, j] is NaN, D[i', j] is +Inf, everything else finite.
TEST(GemmNaN, InfTimesZeroIsNan) {
    const int64_t n = 20, k = 200, ci = 3, cj = 7, ck = 150;
    for (const int64_t m : {int64_t(40), int64_t(4)}) {  // tiles, small-M kernel
        for (const Scaling s : {Scaling::row(), Scaling::mx32(), Scaling::tensor()}) {
            SCOPED_TRACE(to_string(s) + " m=" + std::to_string(m));
            QTensor qa = quantize(as_tensor(gaussian(m, k, 21), m, k, DType::f32), qopts(s, Format::e4m3fn));
            QTensor qb = quantize(as_tensor(gaussian(n, k, 22), n, k, DType::f32), qopts(s, Format::e5m2));
            for (int64_t i = 0; i < m; ++i) qa.data.data<uint8_t>()[i * k + ck] = i == ci ? 0x00 : 0x38;
            qb.data.data<uint8_t>()[cj * k + ck] = 0x7c;
            for_each_backend([&] {
                const Tensor d = gemm(qa, qb);
                int bad = 0;
                for (int64_t i = 0; i < m; ++i) {
                    for (int64_t j = 0; j < n; ++j) {
                        const float v = d.get({i, j});
                        const bool ok = j != cj ? std::isfinite(v) : i == ci ? std::isnan(v) : v == INFINITY;
                        if (!ok && ++bad <= 3) ADD_FAILURE() << "D[" << i << ", " << j << "] = " << v;
                    }
                }
                EXPECT_EQ(bad, 0);
            });
        }
    }
}

// ---- accuracy against the unquantized product ----

// SQNR of D against the float64 product of the unquantized N(0,1) inputs >= 25 dB
// (NUMERICS.md "Accuracy targets"), e4m3fn with every recipe's scaling, every backend and ISA.
TEST(GemmAccuracy, SqnrAbove25dBAgainstTheUnquantizedProduct) {
    const int64_t m = 64, n = 96, k = 512;
    const std::vector<float> av = gaussian(m, k, 31, false), bv = gaussian(n, k, 32, false);
    std::vector<double> exact(size_t(m * n));
    for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
            double s = 0.0;
            for (int64_t kk = 0; kk < k; ++kk) s += double(av[size_t(i * k + kk)]) * double(bv[size_t(j * k + kk)]);
            exact[size_t(i * n + j)] = s;
        }
    }
    const Tensor a = as_tensor(av, m, k, DType::f32), b = as_tensor(bv, n, k, DType::f32);
    for (const GranCase& g : gran_cases()) {
        const QTensor qa = quantize(a, qopts(g.a, Format::e4m3fn, g.power_of_two));
        const QTensor qb = quantize(b, qopts(g.b, Format::e4m3fn, g.power_of_two));
        for_each_backend([&] {
            const std::vector<double> d = values(gemm(qa, qb));
            double signal = 0.0, noise = 0.0;
            for (size_t at = 0; at < d.size(); ++at) {
                signal += exact[at] * exact[at];
                noise += (d[at] - exact[at]) * (d[at] - exact[at]);
            }
            const double sqnr = 10.0 * std::log10(signal / noise);
            EXPECT_GE(sqnr, 25.0) << g.name;
            EXPECT_LT(sqnr, 60.0) << g.name << ": far above what 3 mantissa bits allow - are the inputs quantized?";
        });
    }
}

// ---- FP8 output ----

// gemm_quantized against float64 alone: D64 = alpha deq(A) deq(B)^T + bias from the codes and
// scales (product64), with the cpu bound of a float32 D (expect). For each output group (the
// tensor, or a row), amax is max |D64| within the bound, and the scale is NUMERICS.md's formula
// (fp8_max / amax in float32) of the reported amax, or the given one (delayed); each element's
// value decode(code) * scale_inv is the FP8 value nearest D64 * scale, or - where D64 * scale
// lies within the bound of a point halfway between two codes - either of the two: so at most half
// a step of the FP8 grid at that magnitude plus the bound from D64. Tensor current scaling, a given
// scale, and row scaling to e5m2.
TEST(GemmQuantized, MatchesTheFloat64ProductRoundedToFp8) {
    const int64_t m = 45, n = 70, k = 300;
    const QTensor qa = quantize(as_tensor(gaussian(m, k, 41), m, k, DType::f32), qopts(Scaling::block(1, 128), Format::e4m3fn));
    const QTensor qb = quantize(as_tensor(gaussian(n, k, 42), n, k, DType::f32), qopts(Scaling::block(128, 128), Format::e4m3fn));
    Call call;
    call.opts.alpha = 0.25f;
    const Tensor bias = as_tensor(gaussian(1, n, 43, false), 1, n, DType::f32);
    call.opts.bias = bias.reshape({n});
    call.bias = values(bias);
    const Expect want = expect(product64(qa, qb), call, DType::f32);
    QuantizeOptions given = qopts(Scaling::tensor(), Format::e4m3fn);
    given.scale = Tensor::full({1}, 0.125f);
    for (const QuantizeOptions& out : {qopts(Scaling::tensor(), Format::e4m3fn), given, qopts(Scaling::row(), Format::e5m2)}) {
        SCOPED_TRACE(std::string(to_string(out.format)) + " " + to_string(out.scaling) + (out.scale.defined() ? " given scale" : ""));
        const FormatInfo fi = format_info(out.format);
        // Half the FP8 step at |v| (scaled units): 2^(floor(log2 |v|) - mantissa - 1), never below
        // half the subnormal step.
        const auto half_step = [&](double v) {
            const double min_normal = double(fi.min_normal);
            const int e = v >= min_normal ? std::ilogb(v) : std::ilogb(min_normal);
            return std::ldexp(1.0, e - fi.mantissa_bits - 1);
        };
        for_each_backend([&] {
            const QTensor q = gemm_quantized(qa, qb, call.opts, out);
            ASSERT_EQ(q.data.shape(), (Shape{m, n}));
            EXPECT_EQ(q.format(), out.format);
            EXPECT_EQ(q.scaling, out.scaling);
            const bool per_row = out.scaling.granularity == Granularity::row;
            ASSERT_EQ(q.scale_inv.shape(), (Shape{per_row ? m : 1, 1}));
            double amax64 = 0.0, amax_err = 0.0;  // over the whole D: QTensor::amax
            int64_t off = 0;
            for (int64_t g = 0; g < (per_row ? m : 1); ++g) {
                const int64_t rows_from = per_row ? g : 0, rows_to = per_row ? g + 1 : m;
                double gmax = 0.0, gerr = 0.0;  // the group's max |D64| and the bound there
                for (int64_t at = rows_from * n; at < rows_to * n; ++at) {
                    if (std::fabs(want.d[size_t(at)]) > gmax) gmax = std::fabs(want.d[size_t(at)]);
                    gerr = std::max(gerr, want.bound_cpu[size_t(at)]);
                }
                if (gmax > amax64) amax64 = gmax;
                amax_err = std::max(amax_err, gerr);
                // The scale: the given one, or fp8_max / amax of a float32 amax within the bound of gmax.
                const double scale_inv = double(q.scale_inv.data<float>()[g]);
                if (out.scale.defined()) {
                    EXPECT_EQ(scale_inv, 8.0);
                } else {
                    const double implied_amax = double(fi.max) * scale_inv;  // fp8_max / scale
                    EXPECT_NEAR(implied_amax, gmax, gerr + gmax * 0x1p-22) << "scale_inv " << scale_inv << " of group " << g;
                }
                for (int64_t at = rows_from * n; at < rows_to * n; ++at) {
                    const double v = double(decode(q.data.data<uint8_t>()[at], q.format())) * scale_inv;
                    const double d = want.d[size_t(at)];
                    const double tol = half_step(std::fabs(d) / scale_inv) * scale_inv + 2 * want.bound_cpu[size_t(at)];
                    if (!(std::fabs(v - d) <= tol) && ++off <= 5)
                        ADD_FAILURE() << "D[" << at / n << ", " << at % n << "] = " << v << ", float64 " << d << " +- " << tol;
                }
            }
            EXPECT_EQ(off, 0) << "elements off the FP8 value nearest the float64 D";
            ASSERT_TRUE(q.amax.defined());
            EXPECT_NEAR(double(q.amax.get({0})), amax64, amax_err + amax64 * 0x1p-24);
            EXPECT_GT(amax64, 0.0);
        });
    }
}

}  // namespace
}  // namespace fp8kit
