// tools/checkpoint_commands.cpp: values as float32, non-finite values, SQNR, output options and progress
// for the checkpoint subcommands (checkpoint_commands.hpp).
// Checked by tests/e2e/test_checkpoint.sh, tests/e2e/test_checkpoint_safety.sh and
// tests/e2e/check_checkpoint.py.
#include "checkpoint_commands.hpp"

#include <algorithm>
#include <cmath>
#include <iostream>

#include "fp8kit/error.hpp"
#include "fp8kit/files.hpp"

namespace fp8kit::tools {

std::string module_name(const std::string& weight) {
    const size_t dot = weight.rfind('.');
    return dot == std::string::npos ? weight : weight.substr(0, dot);
}

Tensor to_f32(const Tensor& t) {
    if (t.dtype() == DType::f32) return t;
    const Tensor c = t.contiguous();
    Tensor out = Tensor::empty(c.shape(), DType::f32);
    float* o = out.data<float>();
    const int64_t n = c.numel();
    switch (c.dtype()) {
        case DType::bf16: for (int64_t i = 0; i < n; ++i) o[i] = float(c.data<const bf16>()[i]); break;
        case DType::f16: for (int64_t i = 0; i < n; ++i) o[i] = float(c.data<const f16>()[i]); break;
        case DType::f64: for (int64_t i = 0; i < n; ++i) o[i] = float(c.data<const double>()[i]); break;
        default:
            if (!is_fp8(c.dtype())) throw Error("tensor of dtype " + std::string(to_string(c.dtype())) + " is not floating point");
            for (int64_t i = 0; i < n; ++i) o[i] = decode(c.data<const uint8_t>()[i], format_of(c.dtype()));
    }
    return out;
}

Tensor values_f32(const TensorLookup& c, const std::string& name) {
    if (auto w = stored_weight(c, name)) return dequantize(w->q, DType::f32).reshape(w->shape);  // 3-D experts too
    return to_f32(c.tensor(name));
}

bool is_float_weight(DType d) noexcept { return d == DType::f32 || d == DType::bf16 || d == DType::f16; }

std::optional<NonFinite> find_non_finite(const Tensor& f32) {
    const Tensor c = f32.contiguous();
    const float* p = c.data<const float>();
    std::optional<NonFinite> first;
    for (int64_t i = 0, n = c.numel(); i < n; ++i) {
        if (std::isfinite(p[i])) continue;
        if (first) {
            ++first->count;
            continue;
        }
        // The flat index as a multi-index, last dimension fastest.
        std::vector<int64_t> at(size_t(c.dim()));
        for (int64_t d = c.dim() - 1, r = i; d >= 0; --d) {
            at[size_t(d)] = r % c.size(d);
            r /= c.size(d);
        }
        first = NonFinite{to_string(at), std::isnan(p[i]) ? "NaN" : (p[i] > 0 ? "+Inf" : "-Inf"), 1};
    }
    return first;
}

namespace {
template <class R>
ErrorStats compare_values(const R* ref, const float* x, int64_t n) {
    double signal = 0, noise = 0, max_abs = 0;
    for (int64_t i = 0; i < n; ++i) {
        const double d = double(ref[i]) - double(x[i]);
        signal += double(ref[i]) * double(ref[i]);
        noise += d * d;
        max_abs = std::max(max_abs, std::fabs(d));
        if (std::isnan(d)) max_abs = d;
    }
    const double sqnr = noise == 0 ? INFINITY : 10 * std::log10(signal / noise);
    return {std::isnan(noise) ? NAN : sqnr, max_abs};
}
}  // namespace

ErrorStats compare(const Tensor& ref, const Tensor& x) {
    if (ref.shape() != x.shape()) throw Error("shapes differ: " + to_string(ref.shape()) + " and " + to_string(x.shape()));
    const Tensor a = ref.contiguous(), b = x.contiguous();
    return compare_values(a.data<const float>(), b.data<const float>(), a.numel());
}

ErrorStats compare(const double* ref, const float* x, int64_t n) { return compare_values(ref, x, n); }

void add_output_flags(CLI::App* c, OutputArgs& a, bool json) {
    c->add_flag("--force", a.force, "replace OUT if it exists (a file by a file, a directory by a directory)");
    c->add_flag("--quiet,-q", a.quiet, "no progress bar and no notes on stderr (errors are still printed)");
    if (json) c->add_flag("--json", a.json, "print one JSON object on stdout instead of the table");
}

void prepare_output(const std::string& out, bool directory, const std::vector<std::string>& inputs, const OutputArgs& a) {
    check_output(out, directory, inputs, a.force);
    for (const std::string& t : remove_stale_temporaries(out)) {
        if (!a.quiet) std::cerr << "fp8kit: removed " << t << ", a temporary left by an earlier run that was killed\n";
    }
}

Progress::Progress(bool quiet) : on_(!quiet && stderr_is_terminal()) {}

void Progress::operator()(size_t done, size_t total, const std::string& what) const {
    if (!on_) return;
    const size_t width = 30, filled = total ? done * width / total : width;
    std::string line = "\r[" + std::string(filled, '#') + std::string(width - filled, '.') + "] " + std::to_string(done) +
                       "/" + std::to_string(total) + " " + printable(what).substr(0, 60);
    line.resize(110, ' ');  // blanks out a longer previous line
    std::cerr << line << (done == total ? "\n" : "") << std::flush;
}

}  // namespace fp8kit::tools
