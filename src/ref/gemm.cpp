// src/ref/gemm.cpp: the reference GEMM - plain loops in float64, the ground truth the cpu and
// cuda backends are compared with (tests/ops/test_gemm.cpp), itself checked against float64
// products of dequantized inputs and against torch._scaled_mm (tests/golden/test_torch_gemm.cpp).
//
// Each K group's partial sum is exact here (float64 holds every sum of FP8 products of one group
// for K < 2^20; weight-only, (bf16 + bf16) x FP8 products, to float64's precision), is multiplied by
// sa * sb, and the groups are summed in float64: the value an ideal float32-accumulating kernel
// approximates. Only the final store rounds (to float32, then to bf16/f16).
#include <vector>

#include "core/math.hpp"
#include "core/ops.hpp"

namespace fp8kit::ref {

std::shared_ptr<const void> pack_weight(const ExecContext&, const detail::GemmOperand&, int64_t, bool, size_t* bytes) {
    *bytes = 0;  // reads B as it is
    return nullptr;
}

bool unpack_weight(const void*, uint8_t*, int64_t) { return false; }  // nothing packed: B is read as it is

namespace {

// A's values [m, k]: its codes decoded; with the fused cast quantized whole first (the reference
// has no packing); weight-only, each element as the kernels take it: hi + lo (weight_only_hi / _lo,
// summed exactly in float64).
std::vector<double> a_values(detail::GemmJob& job) {
    std::vector<double> v(size_t(job.m * job.k));
    const detail::MatrixRef& hp = job.a_hp;
    if (hp.data != nullptr) {
        for (int64_t i = 0; i < job.m; ++i) {
            for (int64_t kk = 0; kk < job.k; ++kk) {
                const float x = detail::load_float(hp.data, hp.dtype, i * hp.ld + kk);
                const uint16_t hi = detail::weight_only_hi(x), lo = detail::weight_only_lo(x, hi);
                v[size_t(i * job.k + kk)] = double(float(bf16::from_bits(hi))) + double(float(bf16::from_bits(lo)));
            }
        }
        return v;
    }
    std::vector<uint8_t> codes;
    detail::GemmOperand a = job.a;
    if (job.fuse != nullptr) {
        codes.resize(size_t(job.m * job.k));
        job.fuse->data = codes.data();
        quantize(*job.fuse);
        a.data = codes.data();
        a.ld = job.k;
    }
    for (int64_t i = 0; i < job.m; ++i) {
        for (int64_t kk = 0; kk < job.k; ++kk) v[size_t(i * job.k + kk)] = double(decode(a.data[i * a.ld + kk], a.format));
    }
    return v;
}

}  // namespace

void gemm(detail::GemmJob& job) {
    const std::vector<double> av = a_values(job);
    const detail::GemmOperand &a = job.a, &b = job.b;
    const int64_t kg = job.kgroup;
    std::vector<double> row(size_t(job.n));
    for (int64_t i = 0; i < job.m; ++i) {
        for (int64_t j = 0; j < job.n; ++j) {
            double sum = 0.0;
            for (int64_t k0 = 0; k0 < job.k; k0 += kg) {
                double partial = 0.0;
                for (int64_t kk = k0; kk < std::min(job.k, k0 + kg); ++kk) {
                    partial += av[size_t(i * job.k + kk)] * double(decode(b.data[j * b.ld + kk], b.format));
                }
                sum += partial * (double(a.scale(i, k0)) * double(b.scale(j, k0)));
            }
            row[size_t(j)] = double(job.alpha) * sum;
        }
        detail::gemm_epilogue(job, i, 0, row.data(), job.n);
        detail::gemm_store(job, i, 0, row.data(), job.n);
    }
}

}  // namespace fp8kit::ref
