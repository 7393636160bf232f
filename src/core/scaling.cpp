// src/core/scaling.cpp: scaling groups and their names; recipes and delayed-scaling state.
// Checked by tests/unit/test_scaling.cpp.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>

#include "core/ops.hpp"
#include "fp8kit/error.hpp"
#include "fp8kit/recipe.hpp"
#include "fp8kit/scaling.hpp"

namespace fp8kit {

// ---- Scaling ----

GroupShape Scaling::group_shape(int64_t rows, int64_t cols) const {
    switch (granularity) {
        case Granularity::tensor: return {std::max<int64_t>(rows, 1), std::max<int64_t>(cols, 1)};
        case Granularity::row: return {1, std::max<int64_t>(cols, 1)};
        case Granularity::column: return {std::max<int64_t>(rows, 1), 1};
        case Granularity::mx32: return {1, 32};
        case Granularity::block: break;
    }
    // Above 2^31 a block is refused: every backend counts groups as (rows + block - 1) / block,
    // which overflows int64 for a block near its largest value (a crash and garbage codes before
    // this check), and no tensor dimension comes near it - row, column or tensor scaling give a
    // group as long as the matrix.
    if (block_rows < 1 || block_cols < 1 || block_rows > max_block_dim || block_cols > max_block_dim) {
        throw Error("fp8kit::Scaling: block " + std::to_string(block_rows) + "x" + std::to_string(block_cols) + " has a dimension " +
                    (block_rows < 1 || block_cols < 1 ? "< 1" : "above 2^31 (row, column or tensor scaling spans the matrix)"));
    }
    return {block_rows, block_cols};
}

GroupShape Scaling::scale_shape(int64_t rows, int64_t cols) const {
    const GroupShape g = group_shape(rows, cols);
    return {(rows + g.rows - 1) / g.rows, (cols + g.cols - 1) / g.cols};
}

std::string to_string(const Scaling& s) {
    switch (s.granularity) {
        case Granularity::tensor: return "tensor";
        case Granularity::row: return "row";
        case Granularity::column: return "column";
        case Granularity::mx32: return "mx32";
        case Granularity::block: break;
    }
    return "block(" + std::to_string(s.block_rows) + "x" + std::to_string(s.block_cols) + ")";
}

Scaling parse_scaling(std::string_view text) {
    if (text == "tensor") return Scaling::tensor();
    if (text == "row") return Scaling::row();
    if (text == "column") return Scaling::column();
    if (text == "mx32") return Scaling::mx32();
    auto bad = [&] {
        return Error("unknown scaling " + quote_printable(text) +
                     ", expected tensor, row, column, mx32 or block:RxC (for example block:1x128)");
    };
    // "block:RxC", and "block(RxC)" as to_string writes it.
    std::string_view dims;
    if (text.starts_with("block:")) {
        dims = text.substr(6);
    } else if (text.starts_with("block(") && text.ends_with(")")) {
        dims = text.substr(6, text.size() - 7);
    } else {
        throw bad();
    }
    const size_t x = dims.find('x');
    if (x == std::string_view::npos) throw bad();
    int64_t r = 0, c = 0;
    const auto rr = std::from_chars(dims.data(), dims.data() + x, r);
    const auto rc = std::from_chars(dims.data() + x + 1, dims.data() + dims.size(), c);
    if (rr.ec != std::errc{} || rr.ptr != dims.data() + x || rc.ec != std::errc{} ||
        rc.ptr != dims.data() + dims.size() || r < 1 || c < 1) {
        throw bad();
    }
    return Scaling::block(r, c);
}

// ---- Recipe ----

Recipe Recipe::tensorwise() { return {}; }

Recipe Recipe::delayed(int history_length, AmaxCompute compute, int margin) {
    Recipe r;
    r.kind = RecipeKind::delayed;
    r.history_length = history_length;
    r.amax_compute = compute;
    r.margin = margin;
    r.validate();
    return r;
}

Recipe Recipe::rowwise() {
    Recipe r;
    r.kind = RecipeKind::rowwise;
    r.backward = Format::e4m3fn;
    r.power_of_two = true;
    return r;
}

Recipe Recipe::block(int64_t block_size) {
    Recipe r;
    r.kind = RecipeKind::block;
    r.backward = Format::e4m3fn;
    r.block_size = block_size;
    r.validate();
    return r;
}

Recipe Recipe::mxfp8(Format grad) {
    Recipe r;
    r.kind = RecipeKind::mxfp8;
    r.backward = grad;
    r.validate();
    return r;
}

void Recipe::validate() const {
    const auto data_format = [](Format f) {
        return f == Format::e4m3fn || f == Format::e5m2 || f == Format::e4m3fnuz || f == Format::e5m2fnuz;
    };
    const std::string name(to_string(kind));
    if (forward == Format::e5m2 || forward == Format::e5m2fnuz) {
        throw Error("fp8kit::Recipe " + name + ": forward format " + std::string(to_string(forward)) +
                    " is refused: pure e5m2 training loses the forward pass (2 mantissa bits); use e4m3fn "
                    "forward with e5m2 gradients (hybrid)");
    }
    if (!data_format(forward) || !data_format(backward)) {
        throw Error("fp8kit::Recipe " + name + ": formats must be e4m3fn, e5m2, e4m3fnuz or e5m2fnuz, got forward " +
                    std::string(to_string(forward)) + ", backward " + std::string(to_string(backward)));
    }
    if (history_length < 1) throw Error("fp8kit::Recipe " + name + ": history_length " + std::to_string(history_length) + ", expected >= 1");
    if (margin < 0) throw Error("fp8kit::Recipe " + name + ": margin " + std::to_string(margin) + ", expected >= 0");
    if (block_size < 1) throw Error("fp8kit::Recipe " + name + ": block_size " + std::to_string(block_size) + ", expected >= 1");
    if (!(amax_epsilon >= 0.0f)) throw Error("fp8kit::Recipe " + name + ": amax_epsilon " + std::to_string(amax_epsilon) + ", expected >= 0");
}

QuantizeOptions Recipe::options(Role role) const {
    validate();
    QuantizeOptions o;
    o.format = role == Role::grad_output ? backward : forward;
    o.overflow = overflow;
    o.power_of_two = power_of_two;
    o.amax_epsilon = amax_epsilon;
    o.mx_rounding = mx_rounding;
    switch (kind) {
        case RecipeKind::tensorwise:
        case RecipeKind::delayed: o.scaling = Scaling::tensor(); break;
        case RecipeKind::rowwise: o.scaling = Scaling::row(); break;
        case RecipeKind::block:
            o.scaling = role == Role::weight ? Scaling::block(block_size, block_size) : Scaling::block(1, block_size);
            break;
        case RecipeKind::mxfp8: o.scaling = Scaling::mx32(); break;
    }
    return o;
}

std::string_view to_string(RecipeKind k) noexcept {
    constexpr std::string_view names[] = {"tensorwise", "delayed", "rowwise", "block", "mxfp8"};
    return names[uint8_t(k)];
}

Recipe parse_recipe(std::string_view name) {
    if (name == "tensorwise") return Recipe::tensorwise();
    if (name == "delayed") return Recipe::delayed();
    if (name == "rowwise") return Recipe::rowwise();
    if (name == "block") return Recipe::block();
    if (name == "mxfp8") return Recipe::mxfp8();
    if (name == "mxfp8_rceil") {  // torchao's RCEIL, TransformerEngine's rule: no block saturates
        Recipe r = Recipe::mxfp8();
        r.mx_rounding = MxRounding::up;
        return r;
    }
    throw Error("unknown recipe " + quote_printable(name) + ", expected tensorwise, delayed, rowwise, block, mxfp8 or mxfp8_rceil");
}

// ---- DelayedScaling ----

DelayedScaling::DelayedScaling(const Recipe& recipe, Role role, Device device)
    : recipe_(recipe), options_(recipe.options(role)) {
    if (recipe.kind != RecipeKind::delayed) {
        throw Error("fp8kit::DelayedScaling: recipe is " + std::string(to_string(recipe.kind)) + ", expected delayed");
    }
    history_ = Tensor::empty({std::max<int64_t>(recipe.history_length, 1)}, DType::f32, device);
    scale_ = Tensor::empty({1}, DType::f32, device);
    const detail::Dispatch d = detail::dispatch("DelayedScaling", {{"history", &history_}});
    d.ops.delayed_init(d.ctx, static_cast<float*>(history_.raw_data()), history_.numel(), static_cast<float*>(scale_.raw_data()));
}

QTensor DelayedScaling::quantize(const Tensor& x, bool transpose) {
    QuantizeOptions o = options_;
    o.scale = scale_;
    o.transpose = transpose;
    QTensor q = fp8kit::quantize(x, o);
    const detail::Dispatch d = detail::dispatch("DelayedScaling::quantize", {{"x", &x}, {"history", &history_}});
    d.ops.delayed_record(d.ctx, static_cast<float*>(history_.raw_data()), static_cast<const float*>(q.amax.const_raw_data()));
    fresh_ = false;
    return q;
}

void DelayedScaling::step() {
    const detail::Dispatch d = detail::dispatch("DelayedScaling::step", {{"history", &history_}});
    const detail::DelayedUpdate u{static_cast<float*>(history_.raw_data()), history_.numel(),
                                  static_cast<float*>(scale_.raw_data()),
                                  std::ldexp(format_info(options_.format).max, -recipe_.margin), options_.amax_epsilon,
                                  options_.power_of_two, recipe_.amax_compute == AmaxCompute::max};
    d.ops.delayed_update(d.ctx, u);
    fresh_ = false;
}

DelayedScaling DelayedScaling::to(Device device) const {
    DelayedScaling r = *this;
    r.history_ = history_.to(device);
    r.scale_ = scale_.to(device);
    return r;
}

void DelayedScaling::restore(const Tensor& amax_history, const Tensor& scale, bool fresh) {
    const std::string where = "fp8kit::DelayedScaling::restore: ";
    if (amax_history.dtype() != DType::f32 || amax_history.shape() != history_.shape()) {
        throw Error(where + "amax_history is " + std::string(to_string(amax_history.dtype())) + " " +
                    to_string(amax_history.shape()) + ", expected f32 " + to_string(history_.shape()));
    }
    if (scale.dtype() != DType::f32 || scale.numel() != 1) {
        throw Error(where + "scale is " + std::string(to_string(scale.dtype())) + " " + to_string(scale.shape()) +
                    ", expected f32 [1]");
    }
    const Tensor h = amax_history.to(Device::cpu).contiguous(), s = scale.to(Device::cpu).contiguous();
    // An amax is a magnitude: never below zero (NaN, recorded from a NaN input, sticks by design).
    for (int64_t i = 0; i < h.numel(); ++i) {
        if (h.data<const float>()[i] < 0.0f) throw Error(where + "amax_history[" + std::to_string(i) + "] is negative");
    }
    const float v = s.data<const float>()[0];
    if (!(std::isfinite(v) && v > 0.0f)) throw Error(where + "scale is not finite and positive");
    // Copies: the state never shares the caller's memory.
    const auto own = [](const Tensor& t, Device device) { return device == Device::cpu ? t.clone() : t.to(device); };
    history_ = own(h, history_.device());
    scale_ = own(s.reshape({1}), scale_.device());
    fresh_ = fresh;
}

void detail::host_delayed_init(const ExecContext&, float* history, int64_t length, float* scale) {
    std::fill(history, history + length, 0.0f);
    *scale = 1.0f;
}

void detail::host_delayed_record(const ExecContext&, float* history, const float* amax) {
    // Several casts in one step (gradient accumulation) keep the largest amax; NaN sticks.
    const float a = *amax;
    if (std::isnan(a) || a > history[0]) history[0] = a;
}

void detail::host_delayed_update(const ExecContext&, const DelayedUpdate& u) {
    float a = u.history[0];
    if (u.use_max) {
        for (int64_t i = 0; i < u.length; ++i) {
            const float h = u.history[i];
            if (std::isnan(h) || h > a) a = h;
            if (std::isnan(a)) break;
        }
    }
    *u.scale = compute_scale(a, u.fp8_max, u.amax_epsilon, u.power_of_two, *u.scale);
    std::rotate(u.history, u.history + u.length - 1, u.history + u.length);  // [k] -> [k+1]
    u.history[0] = 0.0f;
}

}  // namespace fp8kit
