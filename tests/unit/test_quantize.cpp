// tests/unit/test_quantize.cpp: the semantics of the public cast operations (amax, quantize,
// dequantize, cast_transpose) on every backend - and on the cpu backend, every ISA path - against
// an independent model written here: group amax by a plain loop, scales in float64 by the rules of
// NUMERICS.md ("Scales", std::ilogb/std::ldexp for MX), codes by the scalar encode() pinned by
// the golden tables. Also: accuracy (SQNR) floors, outliers, the MX spec's saturation, the NaN/Inf
// policy, the transposed copy, 16-bit inputs, argument errors and strided views.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "fp8kit/backend.hpp"
#include "fp8kit/error.hpp"
#include "fp8kit/quantize.hpp"
#include "fp8kit/scaling.hpp"
#include "support.hpp"

namespace fp8kit::test {
namespace {

// Runs body() on every available backend, and on the cpu backend once per ISA path; the cpu
// backend is active again afterwards (also when body() throws).
template <class Body>
void for_each_backend(Body&& body) {
    for (Backend b : available_backends()) {
        SCOPED_TRACE("backend=" + std::string(to_string(b)));
        const BackendOverride use(b);
        if (b == Backend::cpu) {
            for_each_isa([&](Isa) { body(); });
        } else {
            body();
        }
    }
}

const Format data_formats[] = {Format::e4m3fn, Format::e5m2, Format::e4m3fnuz, Format::e5m2fnuz};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

Tensor matrix(int64_t rows, int64_t cols, const std::function<float(int64_t, int64_t)>& f) {
    std::vector<float> v(size_t(rows * cols));
    for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j) v[size_t(i * cols + j)] = f(i, j);
    }
    return Tensor::from(v, {rows, cols});
}

std::vector<float> values(const Tensor& x) {
    const Tensor c = x.contiguous();
    const float* p = c.data<float>();
    return {p, p + c.numel()};
}

Tensor normal_matrix(int64_t rows, int64_t cols, uint32_t seed, float sigma = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, sigma);
    return matrix(rows, cols, [&](int64_t, int64_t) { return nd(rng); });
}

// ---- the independent model ----

// The group of each granularity on a [rows, cols] matrix, from the definitions in scaling.hpp.
GroupShape group_of(const Scaling& s, int64_t rows, int64_t cols) {
    switch (s.granularity) {
        case Granularity::tensor: return {rows, cols};
        case Granularity::row: return {1, cols};
        case Granularity::column: return {rows, 1};
        case Granularity::mx32: return {1, 32};
        case Granularity::block: break;
    }
    return {s.block_rows, s.block_cols};
}

// NUMERICS.md's current-scaling formula in float64: epsilon, fallback 1 for 0/NaN/Inf, FLT_MAX on
// overflow, power of two by flooring the exponent. (float64 then one rounding equals the float32
// division: 53 >= 2 * 24 + 2 bits.)
float scale_f64(float amax, float fp8_max, float eps = 0.0f, bool pow2 = false) {
    if (amax < eps) amax = eps;
    if (amax == 0.0f || std::isnan(amax) || std::isinf(amax)) return 1.0f;
    const double q = double(fp8_max) / double(amax);
    const float s = q > double(FLT_MAX) ? FLT_MAX : float(q);
    if (!pow2) return s;
    int e = 0;
    (void)std::frexp(double(s), &e);
    return float(std::ldexp(1.0, e - 1));
}

// The MX e8m0 code in float64: floor(log2 amax) - emax (up: plus one if amax / 2^e > max),
// clamped to [-127, 127]; NaN/Inf 0xff, 0 -> 0x00.
uint8_t mx_code_f64(float amax, Format f, MxRounding r) {
    if (std::isnan(amax) || std::isinf(amax)) return 0xff;
    if (amax == 0.0f) return 0x00;
    const double fp8_max = format_info(f).max;
    const int emax = std::ilogb(fp8_max);
    int e = std::ilogb(double(amax)) - emax;
    if (r == MxRounding::up && std::ldexp(double(amax), -e) > fp8_max) ++e;
    return uint8_t(std::clamp(e, -127, 127) + 127);
}

struct Expected {
    std::vector<uint8_t> codes;     // [rows, cols]
    std::vector<float> scale_inv;   // [gr, gc], f32 scales
    std::vector<uint8_t> e8m0;      // [gr, gc], mx32
    std::vector<float> group_amax;  // [gr, gc]
    int64_t gr = 0, gc = 0;
    float amax = 0.0f;
};

// max(|a|, |b|) where NaN wins.
float max_abs(float acc, float v) {
    if (std::isnan(acc) || std::isnan(v)) return NAN;
    return std::max(acc, std::fabs(v));
}

Expected model(const std::vector<float>& x, int64_t rows, int64_t cols, const QuantizeOptions& o) {
    const GroupShape g = group_of(o.scaling, rows, cols);
    const bool mx = o.scaling.granularity == Granularity::mx32;
    const float fp8_max = format_info(o.format).max;
    Expected e;
    e.gr = ceil_div(rows, g.rows);
    e.gc = ceil_div(cols, g.cols);
    e.codes.assign(size_t(rows * cols), 0);
    for (int64_t bi = 0; bi < e.gr; ++bi) {
        for (int64_t bj = 0; bj < e.gc; ++bj) {
            const int64_t i0 = bi * g.rows, i1 = std::min(rows, i0 + g.rows);
            const int64_t j0 = bj * g.cols, j1 = std::min(cols, j0 + g.cols);
            float a = 0.0f;
            for (int64_t i = i0; i < i1; ++i) {
                for (int64_t j = j0; j < j1; ++j) a = max_abs(a, x[size_t(i * cols + j)]);
            }
            e.group_amax.push_back(a);
            e.amax = max_abs(e.amax, a);
            float scale;
            if (mx) {
                const uint8_t code = mx_code_f64(a, o.format, o.mx_rounding);
                e.e8m0.push_back(code);
                scale = code == 0xff ? 1.0f : float(std::ldexp(1.0, 127 - code));
            } else {
                scale = o.scale.defined() ? o.scale.get({0}) : scale_f64(a, fp8_max, o.amax_epsilon, o.power_of_two);
                e.scale_inv.push_back(1.0f / scale);
            }
            for (int64_t i = i0; i < i1; ++i) {
                for (int64_t j = j0; j < j1; ++j) {
                    const size_t k = size_t(i * cols + j);
                    const float scaled = x[k] * scale;  // one float32 multiply
                    // The non-finite policy: only finite inputs saturate; an Inf keeps Inf/NaN.
                    e.codes[k] = encode(scaled, o.format, std::isinf(x[k]) ? Overflow::nonsaturating : o.overflow);
                }
            }
        }
    }
    return e;
}

// q against the model: codes (any NaN code equals any NaN code), scales bit for bit, amax.
void expect_matches_model(const QTensor& q, const std::vector<float>& x, int64_t rows, int64_t cols,
                          const QuantizeOptions& o) {
    const Expected e = model(x, rows, cols, o);
    ASSERT_EQ(q.data.dtype(), dtype_of(o.format));
    ASSERT_EQ(q.format(), o.format);
    ASSERT_EQ(q.scaling, o.scaling);
    ASSERT_EQ(q.data.numel(), rows * cols);
    ASSERT_EQ(q.scale_inv.shape(), (Shape{e.gr, e.gc}));
    const uint8_t* codes = q.data.data<uint8_t>();
    int bad = 0;
    for (size_t k = 0; k < e.codes.size() && bad < 5; ++k) {
        if (!same_code(codes[k], e.codes[k], o.format)) {
            ++bad;
            ADD_FAILURE() << "element (" << int64_t(k) / cols << ", " << int64_t(k) % cols << ") x = " << x[k]
                          << ": code " << hex(codes[k], 2) << ", expected " << hex(e.codes[k], 2);
        }
    }
    if (o.scaling.granularity == Granularity::mx32) {
        ASSERT_EQ(q.scale_inv.dtype(), DType::e8m0fnu);
        for (size_t k = 0; k < e.e8m0.size(); ++k) {
            EXPECT_EQ(int(q.scale_inv.data<uint8_t>()[k]), int(e.e8m0[k]))
                << "group " << k << " amax " << e.group_amax[k];
        }
    } else {
        ASSERT_EQ(q.scale_inv.dtype(), DType::f32);
        for (size_t k = 0; k < e.scale_inv.size(); ++k) {
            EXPECT_EQ(bits(q.scale_inv.data<float>()[k]), bits(e.scale_inv[k]))
                << "group " << k << " amax " << e.group_amax[k] << ": " << q.scale_inv.data<float>()[k]
                << ", expected " << e.scale_inv[k];
        }
    }
    ASSERT_TRUE(q.amax.defined());
    EXPECT_TRUE(same_float(q.amax.get({0}), e.amax)) << q.amax.get({0}) << " vs " << e.amax;
}

// The stored dequantization multiplier of element (i, j).
float multiplier(const QTensor& q, int64_t i, int64_t j) {
    const GroupShape g = group_of(q.scaling, q.rows(), q.cols());
    const int64_t gc = ceil_div(q.cols(), g.cols);
    const int64_t k = i / g.rows * gc + j / g.cols;
    if (q.scaling.granularity == Granularity::mx32) return decode(q.scale_inv.data<uint8_t>()[k], Format::e8m0fnu);
    return q.scale_inv.data<float>()[k];
}

double sqnr_db(const std::vector<float>& x, const std::vector<float>& y, const std::vector<bool>* mask = nullptr) {
    double s = 0, n = 0;
    for (size_t k = 0; k < x.size(); ++k) {
        if (mask && !(*mask)[k]) continue;
        s += double(x[k]) * double(x[k]);
        n += (double(x[k]) - double(y[k])) * (double(x[k]) - double(y[k]));
    }
    return 20.0 * std::log10(std::sqrt(s) / std::sqrt(n));
}

bool same_bytes(const Tensor& a, const Tensor& b) {
    if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
    const Tensor ca = a.contiguous(), cb = b.contiguous();
    return std::memcmp(ca.const_raw_data(), cb.const_raw_data(), ca.nbytes()) == 0;
}

// Codes and scales identical byte for byte (and amax bit for bit).
void expect_same_quantization(const QTensor& a, const QTensor& b) {
    EXPECT_EQ(a.format(), b.format());
    EXPECT_EQ(a.scaling, b.scaling);
    EXPECT_TRUE(same_bytes(a.data, b.data)) << "data " << to_string(a.data.shape()) << " vs " << to_string(b.data.shape());
    EXPECT_TRUE(same_bytes(a.scale_inv, b.scale_inv))
        << "scale_inv " << to_string(a.scale_inv.shape()) << " vs " << to_string(b.scale_inv.shape());
    ASSERT_TRUE(a.amax.defined() && b.amax.defined());
    EXPECT_TRUE(same_float(a.amax.get({0}), b.amax.get({0}))) << a.amax.get({0}) << " vs " << b.amax.get({0});
}

const Scaling granularities[] = {Scaling::tensor(), Scaling::row(), Scaling::column(), Scaling::block(2, 3),
                                 Scaling::mx32()};

// ---- quantize against the model ----

// 5 x 70: rows of very different magnitudes (0.01 .. 10), a zero last row (a zero group in row,
// block and mx32 scaling), 70 = 2 * 32 + 6 and 23 * 3 + 1 (cut groups at the right edge), 5 rows =
// 2 * 2 + 1 (a cut block at the bottom). Odd columns hold values with 8 significant bits: their
// scaled values often land on or next to FP8 rounding midpoints, where float32(x * scale) and
// other ways of scaling (x / scale_inv, double arithmetic) give different codes.
Tensor small_case() {
    std::mt19937 rng(42);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const float mag[] = {0.01f, 0.1f, 1.0f, 10.0f, 0.0f};
    return matrix(5, 70, [&](int64_t i, int64_t j) {
        if (j == 17 && i == 2) return -3.75f;
        const float v = nd(rng) * mag[i];
        return j % 2 ? float(bf16(v)) : v;
    });
}

TEST(Quantize, MatchesTheFloat64ModelForEveryGranularityAndFormat) {
    const Tensor x = small_case();
    const std::vector<float> xv = values(x);
    for_each_backend([&] {
        for (const Scaling& s : granularities) {
            for (Format f : data_formats) {
                for (bool pow2 : {false, true}) {
                    SCOPED_TRACE(to_string(s) + " " + std::string(to_string(f)) + (pow2 ? " pow2" : ""));
                    QuantizeOptions o;
                    o.format = f;
                    o.scaling = s;
                    o.power_of_two = pow2;
                    const QTensor q = quantize(x, o);
                    expect_matches_model(q, xv, 5, 70, o);
                    // Dequantized = decode(code) * scale_inv of its group, in f32, bf16 and f16.
                    const Tensor y = dequantize(q), yb = dequantize(q, DType::bf16), yh = dequantize(q, DType::f16);
                    ASSERT_EQ(y.shape(), x.shape());
                    ASSERT_EQ(yb.dtype(), DType::bf16);
                    for (int64_t i = 0; i < 5; ++i) {
                        for (int64_t j = 0; j < 70; ++j) {
                            const float want = decode(q.data.at<uint8_t>({i, j}), f) * multiplier(q, i, j);
                            ASSERT_EQ(bits(y.get({i, j})), bits(want)) << i << "," << j;
                            ASSERT_EQ(yb.at<bf16>({i, j}).bits, bf16(want).bits) << i << "," << j;
                            ASSERT_EQ(yh.at<f16>({i, j}).bits, f16(want).bits) << i << "," << j;
                        }
                    }
                }
            }
        }
    });
}

TEST(Quantize, HandValuesForOneGroupPerGranularity) {
    // 2 x 4, e4m3fn. Row 0 amax 2 (scale 224), row 1 amax 0.5 (scale 896); tensor amax 2.
    const std::vector<float> v = {1.0f, -2.0f, 0.25f, 0.0f, 0.5f, 0.125f, -0.375f, 0.0625f};
    const Tensor x = Tensor::from(v, {2, 4});
    for_each_backend([&] {
        QuantizeOptions o;
        QTensor q = quantize(x, o);
        EXPECT_EQ(q.scale_inv.get({0, 0}), 1.0f / 224.0f);
        EXPECT_EQ(q.amax.get({0}), 2.0f);
        // 1 * 224 = 224 = 1.75 * 2^7 -> 0.1110.110; -2 * 224 = -448 -> 1.1111.110.
        EXPECT_EQ(q.data.at<uint8_t>({0, 0}), 0x76);
        EXPECT_EQ(q.data.at<uint8_t>({0, 1}), 0xfe);
        EXPECT_EQ(q.data.at<uint8_t>({0, 3}), 0x00);
        o.scaling = Scaling::row();
        q = quantize(x, o);
        EXPECT_EQ(q.scale_inv.shape(), (Shape{2, 1}));
        EXPECT_EQ(q.scale_inv.get({1, 0}), 1.0f / 896.0f);
        // 0.5 * 896 = 448 -> 0x7e; 0.125 * 896 = 112 = 1.75 * 2^6 -> 0.1101.110.
        EXPECT_EQ(q.data.at<uint8_t>({1, 0}), 0x7e);
        EXPECT_EQ(q.data.at<uint8_t>({1, 1}), 0x6e);
        o.scaling = Scaling::column();
        q = quantize(x, o);
        EXPECT_EQ(q.scale_inv.shape(), (Shape{1, 4}));
        // Column 3: amax 0.0625 -> scale 7168; column 2: 0.375 -> 448 / 0.375 = 1194.67 (float64).
        EXPECT_EQ(q.scale_inv.get({0, 3}), 1.0f / 7168.0f);
        EXPECT_EQ(q.scale_inv.get({0, 2}), 1.0f / float(448.0 / 0.375));
        o.scaling = Scaling::mx32();
        q = quantize(x, o);
        // Row 0 amax 2 = 2^1 -> 1 - 8 = -7 -> code 120; row 1 amax 0.5 -> -1 - 8 -> code 118.
        EXPECT_EQ(q.scale_inv.dtype(), DType::e8m0fnu);
        EXPECT_EQ(int(q.scale_inv.at<uint8_t>({0, 0})), 120);
        EXPECT_EQ(int(q.scale_inv.at<uint8_t>({1, 0})), 118);
        // 1 * 2^7 = 128 -> 0.1110.000; 0.5 * 2^9 = 256 -> 0.1111.000.
        EXPECT_EQ(q.data.at<uint8_t>({0, 0}), 0x70);
        EXPECT_EQ(q.data.at<uint8_t>({1, 0}), 0x78);
    });
}

TEST(Quantize, ThreeDInputIsScaledAsItsMatrix) {
    const Tensor x3 = normal_matrix(6, 70, 9).reshape({2, 3, 70});
    const std::vector<float> xv = values(x3);
    for_each_backend([&] {
        for (const Scaling& s : granularities) {
            SCOPED_TRACE(to_string(s));
            QuantizeOptions o;
            o.scaling = s;
            const QTensor q = quantize(x3, o);
            EXPECT_EQ(q.data.shape(), (Shape{2, 3, 70}));
            EXPECT_EQ(q.rows(), 6);
            EXPECT_EQ(q.cols(), 70);
            expect_matches_model(q, xv, 6, 70, o);
            EXPECT_EQ(dequantize(q).shape(), (Shape{2, 3, 70}));
        }
    });
}

// ---- accuracy ----

TEST(QuantizeAccuracy, TensorwiseRoundTripOfGaussianDataIsAbove25dB) {
    const Tensor x = normal_matrix(64, 1024, 1234);
    const std::vector<float> xv = values(x);
    for_each_backend([&] {
        const QTensor q = quantize(x);  // tensorwise e4m3fn
        const double db = sqnr_db(xv, values(dequantize(q)));
        EXPECT_GE(db, 25.0);
        RecordProperty("sqnr_db", std::to_string(db));
    });
}

TEST(QuantizeAccuracy, FineGroupsIsolateOutliers) {
    // N(0,1) data with 1% of the 1x32 blocks multiplied by 1e5. The tensor scale is then set by an
    // outlier (448 / ~3.5e5): an ordinary value of 1 becomes ~1.3e-3, below e4m3fn's smallest
    // subnormal step 2^-9 ~ 1.95e-3, so tensorwise rounds the ordinary data to 0 or one subnormal
    // step. block(1,128) loses only the ordinary values that share a 128-wide group with an
    // outlier block (~3%), mx32 none. The whole-tensor SQNR cannot show this (the outliers carry
    // almost all of ||x||, and every scheme keeps them to 3 mantissa bits), so the ordering is
    // asserted on the ordinary elements - the values the outliers would crush.
    const int64_t rows = 64, cols = 1024, blocks = rows * cols / 32;
    Tensor x = normal_matrix(rows, cols, 77);
    std::vector<int64_t> order(static_cast<size_t>(blocks));
    for (int64_t b = 0; b < blocks; ++b) order[size_t(b)] = b;
    std::mt19937 rng(78);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<bool> ordinary(size_t(rows * cols), true);
    float* p = x.data<float>();
    for (int64_t n = 0; n < blocks / 100; ++n) {
        const int64_t b = order[size_t(n)];
        for (int64_t k = b * 32; k < b * 32 + 32; ++k) {
            p[k] *= 1e5f;
            ordinary[size_t(k)] = false;
        }
    }
    const std::vector<float> xv = values(x);
    for_each_backend([&] {
        QuantizeOptions tw, blk, mx;
        blk.scaling = Scaling::block(1, 128);
        mx.scaling = Scaling::mx32();
        const QTensor qt = quantize(x, tw), qb = quantize(x, blk), qm = quantize(x, mx);
        const std::vector<float> yt = values(dequantize(qt)), yb = values(dequantize(qb)), ym = values(dequantize(qm));
        // The reason: the tensor scale is set by the outliers, and the ordinary values land below
        // e4m3fn's smallest normal (2^-6) after scaling.
        EXPECT_EQ(qt.scale_inv.get({0, 0}), 1.0f / float(448.0 / double(qt.amax.get({0}))));
        EXPECT_GT(qt.amax.get({0}), 1e5f);
        int64_t tiny = 0, n_ordinary = 0;
        for (size_t k = 0; k < xv.size(); ++k) {
            if (!ordinary[k]) continue;
            ++n_ordinary;
            if (std::fabs(decode(qt.data.data<uint8_t>()[k], Format::e4m3fn)) < 0x1p-6f) ++tiny;
        }
        EXPECT_GT(double(tiny), 0.99 * double(n_ordinary));
        const double t_ord = sqnr_db(xv, yt, &ordinary), b_ord = sqnr_db(xv, yb, &ordinary),
                     m_ord = sqnr_db(xv, ym, &ordinary);
        EXPECT_GT(b_ord, t_ord + 10.0) << "block " << b_ord << " dB, tensorwise " << t_ord << " dB";
        EXPECT_GT(m_ord, t_ord + 10.0) << "mx32 " << m_ord << " dB, tensorwise " << t_ord << " dB";
        EXPECT_GE(m_ord, 25.0);  // mx32 keeps ordinary blocks as if there were no outliers
        // Every scheme keeps the outliers themselves: whole-tensor SQNR above the 25 dB floor.
        EXPECT_GE(sqnr_db(xv, yt), 25.0);
        EXPECT_GE(sqnr_db(xv, yb), 25.0);
        EXPECT_GE(sqnr_db(xv, ym), 25.0);
        RecordProperty("ordinary_sqnr_tensor_block_mx",
                       std::to_string(t_ord) + " " + std::to_string(b_ord) + " " + std::to_string(m_ord));
    });
}

// ---- the MX spec: floor saturates, up does not ----

// 2 x 64 (four 1x32 blocks). Block (0, 0): amax 500 at column 5; block (0, 1): amax exactly 448;
// block (1, 0): amax 500 at column 7, negative; block (1, 1): small values, amax 0.75 * 32 / 33.
Tensor mx_case() {
    return matrix(2, 64, [](int64_t i, int64_t j) {
        const float sign = (i + j) % 2 ? -1.0f : 1.0f;
        if (i == 0 && j == 5) return 500.0f;
        if (i == 0 && j == 40) return 448.0f;
        if (i == 1 && j == 7) return -500.0f;
        if (i == 1 && j >= 32) return sign * 0.75f * float(j - 31) / 33.0f;
        return sign * 3.7f * float(j % 32 + 1);  // up to 118.4
    });
}

// Half an e4m3fn ulp of x's binade, times the power-of-two scale: |deq - x| bound for a value that
// does not saturate and whose scaled value is normal.
double half_ulp(float x) { return std::ldexp(1.0, std::ilogb(double(x)) - 4); }

TEST(QuantizeMx, FloorSaturatesTheLargestElementsAsTheSpecSays) {
    const Tensor x = mx_case();
    for_each_backend([&] {
        QuantizeOptions o;
        o.scaling = Scaling::mx32();
        o.mx_rounding = MxRounding::floor;
        const QTensor q = quantize(x, o);
        expect_matches_model(q, values(x), 2, 64, o);
        // 500: floor(log2 500) = 8 = emax -> X = 1 (code 127); 500 > 448 saturates to 0x7e.
        EXPECT_EQ(int(q.scale_inv.at<uint8_t>({0, 0})), 127);
        EXPECT_EQ(q.data.at<uint8_t>({0, 5}), 0x7e);
        EXPECT_EQ(q.data.at<uint8_t>({1, 7}), 0xfe);
        const Tensor y = dequantize(q);
        EXPECT_EQ(y.get({0, 5}), 448.0f);
        EXPECT_LT(y.get({0, 5}), 500.0f);
        EXPECT_EQ(y.get({1, 7}), -448.0f);
        // 448 fits exactly; 0.727 -> floor(log2 0.727) = -1 -> X = 2^-9 (code 118).
        EXPECT_EQ(int(q.scale_inv.at<uint8_t>({0, 1})), 127);
        EXPECT_EQ(y.get({0, 40}), 448.0f);
        EXPECT_EQ(int(q.scale_inv.at<uint8_t>({1, 1})), 118);
        // Everything else is within half an ulp.
        for (int64_t i = 0; i < 2; ++i) {
            for (int64_t j = 0; j < 64; ++j) {
                if ((i == 0 && j == 5) || (i == 1 && j == 7)) continue;
                const float xv = x.get({i, j});
                EXPECT_LE(std::fabs(double(y.get({i, j})) - double(xv)), half_ulp(xv)) << i << "," << j;
            }
        }
    });
}

TEST(QuantizeMx, UpNeverSaturates) {
    const Tensor x = mx_case();
    for_each_backend([&] {
        QuantizeOptions o;
        o.scaling = Scaling::mx32();
        o.mx_rounding = MxRounding::up;
        const QTensor q = quantize(x, o);
        expect_matches_model(q, values(x), 2, 64, o);
        // 500 / 2^8 = 1.95 > 1.75 -> X = 2 (code 128); 500 / 2 = 250 rounds to 256 (0.1111.000).
        EXPECT_EQ(int(q.scale_inv.at<uint8_t>({0, 0})), 128);
        EXPECT_EQ(int(q.scale_inv.at<uint8_t>({1, 0})), 128);
        EXPECT_EQ(q.data.at<uint8_t>({0, 5}), 0x78);
        EXPECT_EQ(q.data.at<uint8_t>({1, 7}), 0xf8);
        EXPECT_EQ(int(q.scale_inv.at<uint8_t>({0, 1})), 127);  // 448 fits without going up
        const Tensor y = dequantize(q);
        EXPECT_EQ(y.get({0, 5}), 512.0f);
        // No element saturates: every code below the max magnitude, every value within half an ulp.
        for (int64_t i = 0; i < 2; ++i) {
            for (int64_t j = 0; j < 64; ++j) {
                const float xv = x.get({i, j});
                if (xv != 448.0f) {
                    EXPECT_NE(q.data.at<uint8_t>({i, j}) & 0x7f, 0x7e) << i << "," << j;
                }
                EXPECT_LE(std::fabs(double(y.get({i, j})) - double(xv)), half_ulp(xv)) << i << "," << j;
            }
        }
    });
}

// NUMERICS.md: MX elements "are then encoded with saturation" (and the spec's floor rule relies on
// it: values between max and the next power of two are meant to clamp). A caller's
// Overflow::nonsaturating must not turn the largest element of a block into NaN.
TEST(QuantizeMx, FloorElementsSaturateWhateverTheOverflowOption) {
    const Tensor x = mx_case();
    for_each_backend([&] {
        QuantizeOptions o;
        o.scaling = Scaling::mx32();
        o.overflow = Overflow::nonsaturating;
        const QTensor q = quantize(x, o);
        EXPECT_EQ(q.data.at<uint8_t>({0, 5}), 0x7e) << "500 in a block with X = 1";
        EXPECT_EQ(q.data.at<uint8_t>({1, 7}), 0xfe) << "-500 in a block with X = 1";
    });
}

// ---- NaN / Inf ----

TEST(QuantizeNonFinite, NanPropagatesOnlyWhereItIs) {
    // Row 0 amax 2, row 1 has a NaN, row 2 amax 0.5.
    const std::vector<float> v = {1.0f, -2.0f, 0.5f, 0.25f, 0.1f, 1.5f, -0.75f, 0.3f,
                                  0.5f, 3.0f,  NAN,  -1.0f, 0.2f, 0.0f, 7.0f,   0.6f,
                                  0.5f, 0.25f, -0.125f, 0.0f, 0.1f, 0.2f, 0.3f, -0.4f};
    const Tensor x = Tensor::from(v, {3, 8});
    for_each_backend([&] {
        for (Format f : data_formats) {
            SCOPED_TRACE(std::string(to_string(f)));
            QuantizeOptions o;
            o.format = f;
            o.scaling = Scaling::row();
            const QTensor q = quantize(x, o);
            expect_matches_model(q, v, 3, 8, o);
            EXPECT_TRUE(std::isnan(q.amax.get({0})));
            EXPECT_TRUE(is_nan(q.data.at<uint8_t>({1, 2}), f));
            const float fp8_max = format_info(f).max;
            EXPECT_EQ(q.scale_inv.get({0, 0}), 1.0f / float(double(fp8_max) / 2.0));
            EXPECT_EQ(q.scale_inv.get({1, 0}), 1.0f);  // NaN amax -> scale 1
            EXPECT_EQ(q.scale_inv.get({2, 0}), 1.0f / float(double(fp8_max) / 0.5));
            // The finite elements of the NaN row are encoded unscaled, not NaN.
            EXPECT_EQ(q.data.at<uint8_t>({1, 1}), encode(3.0f, f));
            EXPECT_FALSE(is_nan(q.data.at<uint8_t>({1, 6}), f));
            const Tensor y = dequantize(q);
            EXPECT_TRUE(std::isnan(y.get({1, 2})));
            EXPECT_EQ(y.get({1, 1}), 3.0f);
            EXPECT_NEAR(y.get({0, 1}), -2.0f, 2.0f * format_info(f).epsilon);
            // Tensor scaling: amax NaN -> scale 1 (scale_inv 1) for everything.
            o.scaling = Scaling::tensor();
            const QTensor qt = quantize(x, o);
            expect_matches_model(qt, v, 3, 8, o);
            EXPECT_EQ(qt.scale_inv.get({0, 0}), 1.0f);
            EXPECT_TRUE(std::isnan(qt.amax.get({0})));
            EXPECT_TRUE(is_nan(qt.data.at<uint8_t>({1, 2}), f));
            EXPECT_EQ(qt.data.at<uint8_t>({0, 0}), encode(1.0f, f));
        }
    });
}

TEST(QuantizeNonFinite, ErrorPolicyThrowsNamingTensorAndIndex) {
    Tensor x = normal_matrix(4, 40, 5);
    for_each_backend([&] {
        QuantizeOptions o;
        o.non_finite = NonFinite::error;
        EXPECT_NO_THROW((void)quantize(x, o));
        x.set({2, 33}, NAN);
        expect_error([&] { (void)quantize(x, o); }, "NaN at index [2, 33]");
        o.scaling = Scaling::mx32();
        expect_error([&] { (void)quantize(x, o); }, "NaN at index [2, 33]");
        expect_error([&] { (void)cast_transpose(x, o); }, "NaN at index [2, 33]");
        x.set({2, 33}, -INFINITY);
        expect_error([&] { (void)quantize(x, o); }, "-Inf at index [2, 33]");
        x.set({2, 33}, 0.5f);
        // A 3-d tensor's index names every dimension; a named tensor (a checkpoint's) its name.
        std::vector<float> v(2 * 3 * 4, 1.0f);
        v[size_t(1 * 12 + 2 * 4 + 3)] = INFINITY;
        const Tensor named = Tensor::view_of(nullptr, v.data(), {2, 3, 4}, DType::f32, "layers.1.mlp.experts");
        expect_error([&] { (void)quantize(named, o); }, "tensor 'layers.1.mlp.experts' holds +Inf at index [1, 2, 3]");
        // The error leaves `out` as it was.
        QTensor out = quantize(x);
        const uint8_t before = out.data.at<uint8_t>({0, 0});
        Tensor bad = x.clone();
        bad.set({0, 0}, 1e30f);
        bad.set({3, 39}, NAN);
        expect_error([&] { (void)quantize(bad, o, out); }, "NaN at index [3, 39]");
        EXPECT_EQ(out.data.at<uint8_t>({0, 0}), before);
    });
}

TEST(QuantizeNonFinite, InfIsNeverMadeFiniteWhileFiniteValuesSaturate) {
    const std::vector<float> v = {1.0f, INFINITY, -INFINITY, 2.0f, -3.0f, 0.5f};
    const Tensor x = Tensor::from(v, {2, 3});
    for_each_backend([&] {
        QuantizeOptions o;
        // Tensor amax Inf -> scale 1; under saturate the Infs still do not become +-448 (the
        // nearest wrong answer, what a clamp before the encode gives): e4m3fn has no Inf, so NaN.
        const QTensor sat4 = quantize(x, o);
        EXPECT_EQ(sat4.amax.get({0}), INFINITY);
        EXPECT_EQ(sat4.scale_inv.get({0, 0}), 1.0f);
        EXPECT_EQ(sat4.data.at<uint8_t>({0, 0}), 0x38);  // 1.0 unscaled
        EXPECT_TRUE(is_nan(sat4.data.at<uint8_t>({0, 1}), Format::e4m3fn));
        EXPECT_TRUE(is_nan(sat4.data.at<uint8_t>({0, 2}), Format::e4m3fn));
        EXPECT_TRUE(std::isnan(dequantize(sat4).get({0, 1})));
        // The transposed copy follows the same policy.
        o.transpose = true;
        const QTensor t4 = quantize(x, o);
        EXPECT_TRUE(is_nan(t4.data_t.at<uint8_t>({1, 0}), Format::e4m3fn));
        EXPECT_EQ(t4.data_t.at<uint8_t>({0, 1}), encode(2.0f, Format::e4m3fn));
        o.transpose = false;
        // Finite values above the range still saturate: 1e6 with a given scale of 1.
        QuantizeOptions given;
        given.scale = Tensor::full({1}, 1.0f);
        EXPECT_EQ(quantize(Tensor::full({1, 2}, 1e6f), given).data.at<uint8_t>({0, 1}), 0x7e);  // +448
        o.format = Format::e5m2;
        const QTensor sat5 = quantize(x, o);
        EXPECT_EQ(sat5.data.at<uint8_t>({0, 1}), 0x7c);  // +Inf, not +57344 (0x7b)
        EXPECT_EQ(sat5.data.at<uint8_t>({0, 2}), 0xfc);  // -Inf
        o.overflow = Overflow::nonsaturating;
        const QTensor nos5 = quantize(x, o);
        EXPECT_EQ(nos5.data.at<uint8_t>({0, 1}), 0x7c);  // +Inf
        EXPECT_EQ(nos5.data.at<uint8_t>({0, 2}), 0xfc);  // -Inf
        EXPECT_EQ(dequantize(nos5).get({0, 2}), -INFINITY);
        o.format = Format::e4m3fn;
        const QTensor nos4 = quantize(x, o);
        EXPECT_TRUE(is_nan(nos4.data.at<uint8_t>({0, 1}), Format::e4m3fn));
        EXPECT_TRUE(is_nan(nos4.data.at<uint8_t>({0, 2}), Format::e4m3fn));
        EXPECT_EQ(nos4.data.at<uint8_t>({1, 0}), encode(2.0f, Format::e4m3fn));
        o.format = Format::e4m3fnuz;
        EXPECT_EQ(quantize(x, o).data.at<uint8_t>({0, 1}), 0x80);
        // Row scaling: the Inf row gets scale 1, the other row its own finite scale.
        o.format = Format::e4m3fn;
        o.overflow = Overflow::saturate;
        o.scaling = Scaling::row();
        const QTensor qr = quantize(x, o);
        EXPECT_EQ(qr.scale_inv.get({0, 0}), 1.0f);
        EXPECT_EQ(qr.scale_inv.get({1, 0}), 1.0f / float(448.0 / 3.0));
        expect_matches_model(qr, v, 2, 3, o);
    });
}

TEST(QuantizeNonFinite, MxNanBlockIsNanAfterDequantizationOnlyThere) {
    Tensor x = normal_matrix(2, 96, 6);
    x.set({0, 40}, NAN);
    const std::vector<float> xv = values(x);
    for_each_backend([&] {
        QuantizeOptions o;
        o.scaling = Scaling::mx32();
        const QTensor q = quantize(x, o);
        expect_matches_model(q, xv, 2, 96, o);
        EXPECT_EQ(int(q.scale_inv.at<uint8_t>({0, 1})), 0xff);
        EXPECT_TRUE(std::isnan(q.amax.get({0})));
        const Tensor y = dequantize(q);
        for (int64_t i = 0; i < 2; ++i) {
            for (int64_t j = 0; j < 96; ++j) {
                if (i == 0 && j >= 32 && j < 64) {
                    EXPECT_TRUE(std::isnan(y.get({i, j}))) << j;
                } else {
                    // Finite blocks: finite values, decode(code) * 2^(scale code - 127).
                    const int code = q.scale_inv.at<uint8_t>({i, j / 32});
                    ASSERT_NE(code, 0xff);
                    EXPECT_TRUE(std::isfinite(y.get({i, j}))) << i << "," << j;
                    EXPECT_EQ(y.get({i, j}), decode(q.data.at<uint8_t>({i, j}), Format::e4m3fn) *
                                                 float(std::ldexp(1.0, code - 127)))
                        << i << "," << j;
                }
            }
        }
    });
}

// ---- the transposed copy ----

TEST(CastTranspose, TransposedCopyIsQuantizeOfTheTranspose) {
    const Scaling scalings[] = {Scaling::tensor(),     Scaling::row(),        Scaling::column(),
                                Scaling::block(1, 128), Scaling::block(128, 128), Scaling::block(3, 5),
                                Scaling::block(2, 3),  Scaling::mx32()};
    // 70 x 300: two tiles of cast_tile_rows x cast_tile_cols (64 x 256) each way, the second starting
    // inside a 3x5 or 2x3 block of either copy.
    for (const auto& shape : {std::pair<int64_t, int64_t>{17, 33}, {130, 70}, {70, 300}}) {
        const int64_t rows = shape.first, cols = shape.second;
        std::mt19937 rng(static_cast<uint32_t>(rows));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        // Magnitudes vary along both dimensions, so row and column groups differ.
        const Tensor x = matrix(rows, cols, [&](int64_t i, int64_t j) {
            return nd(rng) * float(1 + i % 5) * std::exp2(float(j % 7) - 3.0f);
        });
        const Tensor xt = x.transpose().contiguous();
        const std::vector<float> xv = values(x), xtv = values(xt);
        for_each_backend([&] {
            for (const Scaling& s : scalings) {
                for (Format f : {Format::e4m3fn, Format::e5m2}) {
                    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols) + " " + to_string(s) + " " +
                                 std::string(to_string(f)));
                    QuantizeOptions o;
                    o.format = f;
                    o.scaling = s;
                    const QTensor ct = cast_transpose(x, o);
                    ASSERT_TRUE(ct.has_transpose());
                    const QTensor t = ct.transposed();
                    EXPECT_EQ(t.data.shape(), (Shape{cols, rows}));
                    const GroupShape ss = s.scale_shape(cols, rows);
                    EXPECT_EQ(t.scale_inv.shape(), (Shape{ss.rows, ss.cols}));
                    expect_same_quantization(t, quantize(xt, o));
                    expect_same_quantization(ct, quantize(x, o));  // the row-major copy as usual
                    expect_matches_model(t, xtv, cols, rows, o);
                    // quantize with transpose = true is the same operation.
                    o.transpose = true;
                    expect_same_quantization(quantize(x, o).transposed(), t);
                }
            }
            // With a given scale (delayed scaling): both copies use it.
            QuantizeOptions o;
            o.scale = Tensor::full({1}, 0.37f);
            const QTensor ct = cast_transpose(x, o);
            expect_same_quantization(ct.transposed(), quantize(xt, o));
            expect_same_quantization(ct, quantize(x, o));
            expect_matches_model(ct.transposed(), xtv, cols, rows, o);
            EXPECT_EQ(bits(ct.scale_inv_t.get({0, 0})), bits(1.0f / 0.37f));
        });
    }
    // No transposed copy asked for: transposed() refuses.
    expect_error([] { (void)quantize(Tensor::zeros({2, 2}, DType::f32)).transposed(); }, "no transposed copy");
}

// Copies of 8 Mi codes or more each are written with non-temporal stores (cpu::cast_stream_bytes),
// smaller ones through the cache, and both are staged in tiles of 64 x 256: at 2048 x 4096 (f32,
// tensor scaling) every line is whole and aligned and streams; at 2049 x 4100 (bf16, 128x128
// blocks) rows are not 64-byte multiples, a tile is cut at the bottom and right edges, and the
// copies take the cached path. Each row-major copy must be quantize(x)'s (the bulk cast, another
// path: one flat run, or tiles of blocks), and the transposed copy its codes transposed, element
// by element; a tile written to the wrong place, a dropped edge or an unflushed stream fails it.
TEST(CastTranspose, LargeCopiesAreTheRowMajorCodesTransposed) {
    struct Case {
        int64_t rows, cols;
        DType dtype;
        Scaling scaling;
    };
    for (const Case& c : {Case{2048, 4096, DType::f32, Scaling::tensor()}, Case{2049, 4100, DType::bf16, Scaling::block(128, 128)}}) {
        SCOPED_TRACE(std::to_string(c.rows) + "x" + std::to_string(c.cols) + " " + to_string(c.scaling));
        std::mt19937 rng(uint32_t(c.rows));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float> v(size_t(c.rows * c.cols));
        for (size_t k = 0; k < v.size(); ++k) v[k] = nd(rng) * std::exp2(float(k / size_t(c.cols) / 128 % 5));
        Tensor x = Tensor::from(v, {c.rows, c.cols});
        if (c.dtype == DType::bf16) {
            std::vector<bf16> b(v.begin(), v.end());
            x = Tensor::from(b, {c.rows, c.cols});
        }
        for_each_isa([&](Isa) {
            QuantizeOptions o;
            o.scaling = c.scaling;
            const QTensor ct = cast_transpose(x, o);
            expect_same_quantization(ct, quantize(x, o));
            const uint8_t* d = ct.data.data<uint8_t>();
            const uint8_t* t = ct.data_t.data<uint8_t>();
            for (int64_t i = 0; i < c.rows; ++i) {
                for (int64_t j = 0; j < c.cols; ++j) {
                    ASSERT_EQ(t[j * c.rows + i], d[i * c.cols + j]) << "row " << i << ", column " << j;
                }
            }
        });
    }
}

// ---- amax and 16-bit inputs ----

TEST(Amax, MatchesALoopPerGroup) {
    const Tensor x = matrix(37, 70, [](int64_t i, int64_t j) {
        return float((i * 31 + j * 17) % 23 - 11) * std::exp2(float((i + j) % 9) - 4.0f);
    });
    const std::vector<float> xv = values(x);
    for_each_backend([&] {
        float want = 0.0f;
        for (float e : xv) want = std::max(want, std::fabs(e));
        EXPECT_EQ(amax(x), want);
        const Scaling scalings[] = {Scaling::tensor(), Scaling::row(), Scaling::column(), Scaling::block(2, 3),
                                    Scaling::block(16, 16), Scaling::block(1, 128), Scaling::mx32()};
        for (const Scaling& s : scalings) {
            SCOPED_TRACE(to_string(s));
            QuantizeOptions o;
            o.scaling = s;
            const Expected e = model(xv, 37, 70, o);
            const Tensor a = amax(x, s);
            ASSERT_EQ(a.dtype(), DType::f32);
            ASSERT_EQ(a.shape(), (Shape{e.gr, e.gc}));
            for (size_t k = 0; k < e.group_amax.size(); ++k) EXPECT_EQ(a.data<float>()[k], e.group_amax[k]) << k;
        }
        // NaN wins; Inf otherwise; empty -> 0.
        Tensor y = x.clone();
        y.set({3, 4}, -INFINITY);
        EXPECT_EQ(amax(y), INFINITY);
        y.set({30, 60}, NAN);
        EXPECT_TRUE(std::isnan(amax(y)));
        const Tensor ar = amax(y, Scaling::row());
        EXPECT_TRUE(std::isnan(ar.get({30, 0})));
        EXPECT_EQ(ar.get({3, 0}), INFINITY);
        EXPECT_FALSE(std::isnan(ar.get({29, 0})));
        EXPECT_EQ(amax(Tensor::zeros({0, 5}, DType::f32)), 0.0f);
        EXPECT_EQ(amax(Tensor::zeros({3, 5}, DType::f32)), 0.0f);
    });
}

TEST(Quantize, SixteenBitInputsGiveTheSameCodesAsF32) {
    std::mt19937 rng(21);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    const int64_t rows = 19, cols = 75;
    std::vector<float> fb(size_t(rows * cols)), fh(fb.size());
    std::vector<bf16> b(fb.size());
    std::vector<f16> h(fb.size());
    for (size_t k = 0; k < fb.size(); ++k) {
        const float v = nd(rng) * std::exp2(float(k % 11) - 5.0f);
        b[k] = bf16(v);
        h[k] = f16(v);
        fb[k] = float(b[k]);  // exact widening: the same values in f32
        fh[k] = float(h[k]);
    }
    const Tensor xb = Tensor::from(b, {rows, cols}), xh = Tensor::from(h, {rows, cols});
    const Tensor xfb = Tensor::from(fb, {rows, cols}), xfh = Tensor::from(fh, {rows, cols});
    for_each_backend([&] {
        EXPECT_EQ(amax(xb), amax(xfb));
        EXPECT_EQ(amax(xh), amax(xfh));
        for (const Scaling& s : granularities) {
            for (Format f : {Format::e4m3fn, Format::e5m2}) {
                SCOPED_TRACE(to_string(s) + " " + std::string(to_string(f)));
                QuantizeOptions o;
                o.scaling = s;
                o.format = f;
                expect_same_quantization(quantize(xb, o), quantize(xfb, o));
                expect_same_quantization(quantize(xh, o), quantize(xfh, o));
                expect_matches_model(quantize(xb, o), fb, rows, cols, o);
                expect_same_quantization(cast_transpose(xh, o).transposed(), cast_transpose(xfh, o).transposed());
                EXPECT_TRUE(same_bytes(amax(xb, s), amax(xfb, s)));
            }
        }
    });
}

// ---- argument errors ----

TEST(QuantizeErrors, BadArgumentsNameTheProblem) {
    const Tensor x = normal_matrix(4, 8, 1);
    expect_error([] { (void)quantize(Tensor::zeros({2, 3}, DType::i32)); }, "i32");
    expect_error([] { (void)quantize(Tensor::zeros({2, 3}, DType::e4m3fn)); }, "e4m3fn");
    expect_error([] { (void)amax(Tensor::zeros({2, 3}, DType::u8)); }, "u8");
    expect_error([] { (void)quantize(Tensor()); }, "undefined");
    QuantizeOptions o;
    o.format = Format::e8m0fnu;
    expect_error([&] { (void)quantize(x, o); }, "e8m0fnu");
    o = {};
    o.scale = Tensor::full({1}, 2.0f);
    o.scaling = Scaling::row();
    expect_error([&] { (void)quantize(x, o); }, "row");
    o.scaling = Scaling::mx32();
    expect_error([&] { (void)quantize(x, o); }, "mx32");
    o.scaling = Scaling::tensor();
    for (float bad : {0.0f, -1.0f, -0.0f, NAN, INFINITY}) {
        o.scale = Tensor::full({1}, bad);
        expect_error([&] { (void)quantize(x, o); }, "scale is");
    }
    o = {};
    o.scaling = Scaling::block(0, 4);
    expect_error([&] { (void)quantize(x, o); }, "0x4");
    o = {};
    o.amax_epsilon = -1.0f;
    expect_error([&] { (void)quantize(x, o); }, "amax_epsilon");

    // dequantize: output dtype, scale_inv shape and dtype, data dtype.
    o = {};
    o.scaling = Scaling::row();
    const QTensor q = quantize(x, o);  // scale_inv [4, 1]
    expect_error([&] { (void)dequantize(q, DType::i32); }, "i32");
    expect_error([&] { (void)dequantize(q, DType::e4m3fn); }, "e4m3fn");
    QTensor bad = q;
    bad.scale_inv = Tensor::zeros({3, 1}, DType::f32);
    expect_error([&] { (void)dequantize(bad); }, "[4, 1]");
    bad.scale_inv = Tensor::zeros({4, 1}, DType::bf16);
    expect_error([&] { (void)dequantize(bad); }, "bf16");
    bad.scale_inv = Tensor();
    expect_error([&] { (void)dequantize(bad); }, "scale_inv");
    bad = q;
    bad.data = Tensor::zeros({4, 5}, DType::e8m0fnu);  // scales are not data
    expect_error([&] { (void)dequantize(bad); }, "e8m0fnu");
    o.scaling = Scaling::mx32();
    QTensor qm = quantize(x, o);
    qm.scale_inv = Tensor::zeros({4, 1}, DType::f32);
    expect_error([&] { (void)dequantize(qm); }, "e8m0fnu");
}

// A scale_inv with the right number of elements but the wrong shape is a shape mismatch too: a
// [1, 4] tensor (a column-scaling layout) handed to a row-scaled [4, 8] QTensor would be read as
// the [4, 1] row scales without complaint.
TEST(QuantizeErrors, DequantizeRefusesAScaleInvOfTheWrongShape) {
    QuantizeOptions o;
    o.scaling = Scaling::row();
    QTensor q = quantize(normal_matrix(4, 8, 1), o);
    q.scale_inv = Tensor::zeros({1, 4}, DType::f32);
    expect_error([&] { (void)dequantize(q); }, "[4, 1]");
}

// ---- views ----

TEST(QuantizeViews, StridedInputsEqualTheirContiguousCopies) {
    const Tensor x = normal_matrix(13, 70, 8, 2.0f);
    const Tensor views[] = {x.slice(1, 3, 40), x.slice(0, 2, 9), x.slice(0, 1, 12).slice(1, 5, 69), x.transpose(),
                            x.transpose().slice(1, 2, 11)};
    for_each_backend([&] {
        for (const Tensor& v : views) {
            for (const Scaling& s : granularities) {
                SCOPED_TRACE(to_string(v.shape()) + " strides " + to_string(v.strides()) + " " + to_string(s));
                QuantizeOptions o;
                o.scaling = s;
                const Tensor c = v.contiguous();
                ASSERT_TRUE(c.is_contiguous());
                expect_same_quantization(quantize(v, o), quantize(c, o));
                expect_same_quantization(cast_transpose(v, o).transposed(), cast_transpose(c, o).transposed());
                expect_matches_model(quantize(v, o), values(c), c.size(0), c.size(1), o);
                EXPECT_TRUE(same_bytes(amax(v, s), amax(c, s)));
                EXPECT_EQ(amax(v), amax(c));
            }
        }
        // A 16-bit column slice too.
        std::vector<bf16> b(13 * 70);
        for (size_t k = 0; k < b.size(); ++k) b[k] = bf16(float(int(k % 37) - 18) * 0.37f);
        const Tensor xb = Tensor::from(b, {13, 70});
        QuantizeOptions o;
        o.scaling = Scaling::block(2, 3);
        expect_same_quantization(quantize(xb.slice(1, 3, 40), o), quantize(xb.slice(1, 3, 40).contiguous(), o));
    });
}

}  // namespace
}  // namespace fp8kit::test
