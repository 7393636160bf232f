// tests/nn/test_model_conversion.cpp: convert_to_float8_training and enable_layerwise_casting on a model
// with odd shapes: which modules are converted / cast / skipped and why, the default, user and
// auto filters, skip patterns and classes, the capability table, and weight memory counted
// independently from the shapes. Layerwise-cast outputs are checked against the float32 model.
// Policy files (as `fp8kit advise` writes them, read from disk): which layers each conversion
// converts / casts / skips, the policy's reasons, the recipe / stored layout per layer, and the
// results against float64 products. Module::to: every parameter of the tree moves and comes back
// the same, or (no GPU) none moves.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <fstream>
#include <random>

#include "fp8kit/checkpoint.hpp"
#include "fp8kit/nn.hpp"
#include "support.hpp"  // unique_temp_stem

namespace fp8kit::nn {
namespace {

// Odd shapes: proj_in 16 -> 48, blocks.0.fc 48 -> 100 (100 % 16 != 0), blocks.0.norm,
// blocks.0.out 100 -> 48, head 48 -> 2048, proj_out 48 -> 16, pos_embed / tok (Embedding).
class Block : public Module {
public:
    Block() {
        add_child("norm", std::make_shared<LayerNorm>(48));
        add_child("fc", std::make_shared<Linear>(48, 100));
        add_child("out", std::make_shared<Linear>(100, 48));
    }
    std::string_view kind() const override { return "Block"; }
};
class Blocks : public Module {
public:
    Blocks() { add_child("0", std::make_shared<Block>()); }
    std::string_view kind() const override { return "Blocks"; }
};
class OddModel : public Module {
public:
    OddModel() {
        add_child("tok", std::make_shared<Embedding>(10, 48));
        add_child("pos_embed", std::make_shared<Embedding>(8, 48));
        add_child("proj_in", std::make_shared<Linear>(16, 48));
        add_child("blocks", std::make_shared<Blocks>());
        add_child("head", std::make_shared<Linear>(48, 2048, false));
        add_child("proj_out", std::make_shared<Linear>(48, 16));
        std::mt19937_64 g(5);
        std::normal_distribution<float> d(0.0f, 0.02f);
        for (auto& [n, p] : named_parameters()) {
            float* v = p->value.data<float>();
            for (int64_t i = 0; i < p->value.numel(); ++i) v[i] = d(g);
        }
    }
    std::string_view kind() const override { return "OddModel"; }
    Linear& linear(const std::string& name) {
        for (auto& [n, m] : named_modules())
            if (n == name) return dynamic_cast<Linear&>(*m);
        throw Error("no " + name);
    }
};

std::vector<std::string> names(const std::vector<std::pair<std::string, std::string>>& v) {
    std::vector<std::string> r;
    for (const auto& p : v) r.push_back(p.first);
    return r;
}
std::string why(const std::vector<std::pair<std::string, std::string>>& v, const std::string& name) {
    for (const auto& [n, w] : v)
        if (n == name) return w;
    return "(not skipped)";
}
using Names = std::vector<std::string>;

// 10 log10(sum ref^2 / sum (y - ref)^2) over two float32 tensors of one shape.
double sqnr_db(const Tensor& ref, const Tensor& y) {
    double s = 0, e = 0;
    for (int64_t i = 0; i < ref.numel(); ++i) {
        const double a = ref.data<float>()[i], b = y.data<float>()[i];
        s += a * a;
        e += (a - b) * (a - b);
    }
    return 10 * std::log10(s / e);
}

// Module::to on the whole tree: with a GPU every parameter (value and grad) goes to the device
// and comes back bit for bit; without one the move fails naming cuda and leaves every parameter
// where and what it was.
TEST(ModuleTree, ToMovesEveryParameterOrNone) {
    OddModel m;
    std::vector<Tensor> before;
    for (auto& [n, p] : m.named_parameters()) before.push_back(p->value.clone());
    const auto expect_on = [&](Device d) {
        for (auto& [n, p] : m.named_parameters()) {
            EXPECT_EQ(p->value.device(), d) << n;
            EXPECT_EQ(p->grad.device(), d) << n;
        }
    };
    if (test::cuda_part_runs("the model moved to cuda and back")) {
        m.to(Device::cuda);
        expect_on(Device::cuda);
        m.to(Device::cpu);
    } else {
        test::expect_error([&] { m.to(Device::cuda); }, "cuda");
    }
    expect_on(Device::cpu);
    size_t i = 0;
    for (auto& [n, p] : m.named_parameters()) {
        EXPECT_EQ(std::memcmp(p->value.data<const float>(), before[i].data<const float>(), before[i].nbytes()), 0) << n;
        ++i;
    }
}

TEST(Convert, DefaultFilterRefusesDimsNotMultipleOf16) {
    OddModel m;
    const ConversionReport r = convert_to_float8_training(m, default_filter(), Float8LinearOptions{});
    EXPECT_EQ(r.converted, (Names{"proj_in", "head", "proj_out"}));
    EXPECT_EQ(names(r.skipped), (Names{"blocks.0.fc", "blocks.0.out"}));
    EXPECT_NE(why(r.skipped, "blocks.0.fc").find("in 48 x out 100: not multiples of 16"), std::string::npos);
    EXPECT_EQ(m.linear("head").kind(), "Float8Linear");
    EXPECT_EQ(m.linear("blocks.0.fc").kind(), "Linear");
    // Parameters are shared, not copied: the converted module trains the same weights.
    EXPECT_EQ(m.named_parameters().size(), 13u);
    // Converting again finds nothing new to do.
    const ConversionReport again = convert_to_float8_training(m, default_filter(), Float8LinearOptions{});
    EXPECT_TRUE(again.converted.empty());
    EXPECT_EQ(why(again.skipped, "head"), "already Float8Linear");
    EXPECT_NE(r.text().find("converted 3 Linear module(s)"), std::string::npos) << r.text();
}

TEST(Convert, UserFilterSeesModuleAndName) {
    OddModel m;
    const LinearFilter keep_head_hp = [](const Linear& l, const std::string& name, std::string& w) {
        if (name == "head" || l.in_features() == 16) {
            w = "user: " + name;
            return false;
        }
        return true;
    };
    const ConversionReport r = convert_to_float8_training(m, keep_head_hp, Float8LinearOptions{});
    // No default filter here: the user filter alone decides (blocks.0.fc's 100 is accepted).
    EXPECT_EQ(r.converted, (Names{"blocks.0.fc", "blocks.0.out", "proj_out"}));
    EXPECT_EQ(why(r.skipped, "head"), "user: head");
    EXPECT_EQ(why(r.skipped, "proj_in"), "user: proj_in");
}

TEST(Convert, AutoFilterUsesTheMeasuredBreakEven) {
    const AutoFilterThresholds t = auto_filter_thresholds();
    EXPECT_NE(t.reason.find("measured on this machine"), std::string::npos) << t.reason;
    RecordProperty("auto_filter", t.reason);
    OddModel m;
    const ConversionReport r = convert_to_float8_training(m, auto_filter(), Float8LinearOptions{});
    for (const char* name : {"proj_in", "head", "proj_out"}) {
        const Linear& l = m.linear(name);
        const bool pays = l.in_features() >= t.min_in && l.out_features() >= t.min_out;
        EXPECT_EQ(std::count(r.converted.begin(), r.converted.end(), name), pays ? 1 : 0) << name << "\n" << r.text();
        if (!pays) {
            EXPECT_NE(why(r.skipped, name).find("below the FP8 break-even"), std::string::npos) << why(r.skipped, name);
        }
    }
    // Dims not multiples of 16 are refused first, whatever the timings.
    EXPECT_NE(why(r.skipped, "blocks.0.fc").find("not multiples of 16"), std::string::npos);
}

TEST(Convert, ConvertedModelStillTrains) {
    OddModel m;
    convert_to_float8_training(m, default_filter(), Float8LinearOptions{});
    Linear& head = m.linear("head");
    const Tensor x = Tensor::from(std::vector<float>(4 * 48, 0.5f), {4, 48});
    const Tensor y = head.forward(x);
    EXPECT_EQ(y.shape(), (Shape{4, 2048}));
    head.backward(Tensor::from(std::vector<float>(4 * 2048, 1.0f), {4, 2048}));
    double g = 0;
    for (int64_t i = 0; i < head.weight().grad.numel(); ++i) g += std::abs(head.weight().grad.data<float>()[i]);
    EXPECT_GT(g, 0.0);
}

// Bytes of a model's parameters from shapes alone: 4 per float32 element; FP8-stored parameters 1
// per element plus one float32 scale (tensor scaling).
size_t expected_bytes(OddModel& m, const std::vector<std::string>& fp8_modules) {
    size_t total = 0;
    for (auto& [name, mod] : m.named_modules()) {
        const bool fp8 = std::find(fp8_modules.begin(), fp8_modules.end(), name) != fp8_modules.end();
        for (const auto& [pn, p] : mod->parameters()) {
            int64_t n = 1;
            for (int64_t d : p->stored ? p->stored->data.shape() : p->value.shape()) n *= d;
            total += fp8 ? size_t(n) + 4 : size_t(n) * 4;
        }
    }
    return total;
}

TEST(LayerwiseCasting, DefaultSkipPatternsClassesCapabilityAndMemory) {
    OddModel m;
    const Tensor x = Tensor::from(std::vector<float>(3 * 48, 0.25f), {3, 48});
    const Tensor ref = m.linear("head").forward(x);
    const size_t before = expected_bytes(m, {});
    LayerwiseCastingOptions o;
    o.skip_classes = {"LayerNorm"};
    const LayerwiseCastingReport r = enable_layerwise_casting(m, o);
    // pos_embed and proj_in / proj_out by the default patterns; blocks.0.norm by the class (the
    // class rule is checked first); the Linear layers compute with the FP8 weight directly.
    EXPECT_EQ(names(r.skipped), (Names{"pos_embed", "proj_in", "blocks.0.norm", "proj_out"}));
    EXPECT_EQ(why(r.skipped, "blocks.0.norm"), "class LayerNorm");
    EXPECT_EQ(why(r.skipped, "proj_in"), "pattern '^proj_in$'");
    EXPECT_EQ(r.native, (Names{"blocks.0.fc", "blocks.0.out", "head"}));
    EXPECT_EQ(r.cast, (Names{"tok"}));
    EXPECT_TRUE(computes_natively_in_fp8("Linear"));
    EXPECT_FALSE(computes_natively_in_fp8("Embedding"));
    EXPECT_EQ(r.bytes_before, before);
    EXPECT_EQ(r.bytes_after, expected_bytes(m, {"tok", "blocks.0.fc", "blocks.0.out", "head"}));
    EXPECT_LT(r.bytes_after, r.bytes_before / 2);
    // The FP8-weight layer against the float32 one: e4m3fn weights and inputs, tensor scales.
    const Tensor y = m.linear("head").forward(x);
    EXPECT_GE(sqnr_db(ref, y), 25.0);
    // Inference only: no backward through an FP8-stored weight.
    EXPECT_THROW(m.linear("head").backward(y), Error);
}

// quantize_input false: every Linear that computes on its FP8 weight runs weight-only (x as bf16,
// as Diffusers computes), which Linear::forward then does (tests/nn/test_parameters.cpp checks its
// product); its output's SQNR against the float32 layer is then that of the weight's rounding
// alone: x's e4m3 rounding, noise as large as the weight's, costs the x-quantizing layer up to
// 3 dB (measured 28.8 against 31.5 dB here; required: at least 1 dB).
TEST(LayerwiseCasting, WeightOnlyLinearLayersLeaveXUnquantized) {
    const auto layer_sqnr_db = [](bool quantize_input, bool* flags_set) {
        OddModel m;
        std::mt19937_64 g(5);
        std::normal_distribution<float> nd;
        std::vector<float> xv(size_t(7 * 48));
        for (float& v : xv) v = nd(g);
        const Tensor x = Tensor::from(xv, {7, 48});
        const Tensor ref = m.linear("head").forward(x);
        LayerwiseCastingOptions o;
        o.quantize_input = quantize_input;
        const LayerwiseCastingReport r = enable_layerwise_casting(m, o);
        *flags_set = true;
        for (const std::string& name : r.native) *flags_set = *flags_set && m.linear(name).quantize_input == quantize_input;
        return sqnr_db(ref, m.linear("head").forward(x));
    };
    bool set_fp8 = false, set_wo = false;
    const double fp8 = layer_sqnr_db(true, &set_fp8), weight_only = layer_sqnr_db(false, &set_wo);
    EXPECT_TRUE(set_fp8 && set_wo);
    EXPECT_GE(weight_only, fp8 + 1.0) << "weight-only " << weight_only << " dB, x in e4m3 " << fp8 << " dB";
}

TEST(LayerwiseCasting, UnscaledStorageLosesSmallWeights) {
    // N(0, 0.001) weights (a small layer, e.g. a residual projection late in training): without a
    // scale most of them fall below e4m3fn's smallest step (2^-9 = 0.00195) and round to 0 or
    // +-2^-9; with the per-tensor scale they use the whole range.
    auto error_db = [](bool scaled) {
        OddModel m;
        const Tensor w = m.linear("head").weight().value;
        for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] *= 0.05f;
        std::vector<float> keep(w.data<float>(), w.data<float>() + w.numel());
        LayerwiseCastingOptions o;
        o.scaled = scaled;
        o.skip_patterns = {};
        enable_layerwise_casting(m, o);
        const Tensor back = m.linear("head").weight().compute_value();
        double s = 0, e = 0;
        for (size_t i = 0; i < keep.size(); ++i) {
            s += double(keep[i]) * keep[i];
            e += (double(keep[i]) - back.data<float>()[i]) * (double(keep[i]) - back.data<float>()[i]);
        }
        return 10 * std::log10(s / e);
    };
    const double scaled = error_db(true), unscaled = error_db(false);
    EXPECT_GE(scaled, 25.0);
    EXPECT_LT(unscaled, scaled - 10.0);
}

TEST(LayerwiseCasting, BadInputNamesWhatIsWrong) {
    OddModel m;
    LayerwiseCastingOptions o;
    o.skip_patterns = {"("};
    try {
        enable_layerwise_casting(m, o);
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("skip pattern '('"), std::string::npos) << e.what();
    }
    o = {};
    o.storage = Format::e8m0fnu;
    EXPECT_THROW(enable_layerwise_casting(m, o), Error);
}

// A policy file on disk (what `fp8kit advise --out` writes), read back with read_policy.
Policy policy_file(const std::string& name, const std::string& layers_json) {
    const std::string path = test::unique_temp_stem("test_policy_" + name) + ".json";
    std::ofstream(path) << R"({"format": "fp8kit-policy", "version": 1, "layers": [)" << layers_json << "]}\n";
    Policy p = read_policy(path);
    std::filesystem::remove(path);
    return p;
}

// SQNR of y = l.forward(x) against the float64 product of x and the layer's float32 weights
// (taken before conversion) plus its bias.
double forward_sqnr_db(Linear& l, const std::vector<float>& w32, const Tensor& x) {
    const Tensor y = l.forward(x);
    const int64_t n = x.size(0), k = l.in_features(), o = l.out_features();
    const Tensor b = l.bias() ? l.bias()->compute_value() : Tensor();
    double s = 0, e = 0;
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < o; ++j) {
            double ref = b.defined() ? double(b.data<float>()[j]) : 0.0;
            for (int64_t t = 0; t < k; ++t) ref += double(x.data<float>()[i * k + t]) * double(w32[size_t(j * k + t)]);
            const double d = ref - double(y.data<float>()[i * o + j]);
            s += ref * ref;
            e += d * d;
        }
    return 10 * std::log10(s / e);
}

Tensor normal_input(int64_t n, int64_t k, uint64_t seed) {
    std::mt19937_64 g(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(size_t(n * k));
    for (float& x : v) x = d(g);
    return Tensor::from(v, {n, k});
}

std::vector<float> weights_of(Linear& l) {
    const Tensor w = l.weight().value;
    return std::vector<float>(w.data<float>(), w.data<float>() + w.numel());
}

TEST(Convert, PolicyDecidesPerLayerWithItsRecipeAndReason) {
    OddModel m;
    const std::vector<float> fc_w = weights_of(m.linear("blocks.0.fc"));
    // By name (a module, or its weight), by shape [out, in]; a name entry is a prefix only at a
    // dot ("proj" is not "proj_in"); names win over shapes.
    const Policy p = policy_file("convert", R"J(
        {"name": "proj", "fp8": false, "recipe": null, "reason": "must not match proj_in or proj_out"},
        {"name": "blocks.0.fc", "fp8": true, "recipe": "rowwise", "reason": "faster: 1.3x"},
        {"name": "blocks.0.out.weight", "fp8": false, "recipe": null, "reason": "not faster: fp8 0.71x f32 speed"},
        {"weight_shape": [2048, 48], "fp8": true, "recipe": "block", "reason": "faster: 2.1x"},
        {"weight_shape": [16, 48], "fp8": false, "recipe": null, "reason": "sqnr 19 dB (floor 25)"},
        {"weight_shape": [100, 48], "fp8": false, "recipe": null, "reason": "shadowed by the name entry"})J");
    Float8LinearOptions defaults;
    defaults.recipe = Recipe::tensorwise();
    const ConversionReport r = convert_to_float8_training(m, policy_plan(p, defaults));
    // proj_in has no entry: the default filter passes it (16 -> 48) with the defaults; blocks.0.fc
    // (100 outputs, which the default filter refuses) is converted because the policy says so.
    EXPECT_EQ(r.converted, (Names{"proj_in", "blocks.0.fc", "head"}));
    EXPECT_EQ(names(r.skipped), (Names{"blocks.0.out", "proj_out"}));
    EXPECT_EQ(why(r.skipped, "blocks.0.out"), "policy: not faster: fp8 0.71x f32 speed");
    EXPECT_EQ(why(r.skipped, "proj_out"), "policy: sqnr 19 dB (floor 25)");
    auto recipe = [&](const std::string& name) { return dynamic_cast<Float8Linear&>(m.linear(name)).options().recipe.kind; };
    EXPECT_EQ(recipe("proj_in"), RecipeKind::tensorwise);
    EXPECT_EQ(recipe("blocks.0.fc"), RecipeKind::rowwise);
    EXPECT_EQ(recipe("head"), RecipeKind::block);
    EXPECT_EQ(m.linear("blocks.0.out").kind(), "Linear");
    // The odd-shaped layer the policy forced into FP8 computes correctly: rowwise FP8 forward
    // against the float64 product (NUMERICS.md's FP8 Linear forward floor, 18 dB).
    EXPECT_GE(forward_sqnr_db(m.linear("blocks.0.fc"), fc_w, normal_input(7, 48, 1)), 18.0);
    // Unmatched layers follow the `unmatched` filter: refusing everything leaves only the policy's.
    OddModel m2;
    const ConversionReport r2 = convert_to_float8_training(
        m2, policy_plan(p, defaults, [](const Linear&, const std::string&, std::string& w) {
            w = "no entry";
            return false;
        }));
    EXPECT_EQ(r2.converted, (Names{"blocks.0.fc", "head"}));
    EXPECT_EQ(why(r2.skipped, "proj_in"), "no entry");
}

// A weight_only entry (what fp8kit.torch.advise writes when that recipe wins): layerwise casting
// stores the weight per row and leaves that Linear's input unquantized (the weight-only GEMM),
// the other entries' layers still casting theirs; policy_json writes the name back; a training
// conversion refuses it, naming the layer, rather than train it as rowwise.
TEST(LayerwiseCasting, PolicyWeightOnlyEntryLeavesThatInputUnquantized) {
    OddModel m;
    const std::vector<float> w_in = weights_of(m.linear("proj_in"));
    LayerwiseCastingOptions o;
    o.skip_patterns = {};
    o.policy = policy_file("weight_only", R"J(
        {"name": "proj_in", "fp8": true, "recipe": "weight_only", "reason": "r1"},
        {"name": "head", "fp8": true, "recipe": "rowwise", "reason": "r2"})J");
    EXPECT_NE(policy_json(*o.policy).find(R"("recipe": "weight_only")"), std::string::npos);
    enable_layerwise_casting(m, o);
    EXPECT_FALSE(m.linear("proj_in").quantize_input);
    EXPECT_TRUE(m.linear("head").quantize_input);
    EXPECT_TRUE(m.linear("proj_out").quantize_input);  // no entry: the options' default
    EXPECT_EQ(m.linear("proj_in").weight().stored->scaling.granularity, Granularity::row);
    EXPECT_EQ(m.linear("head").weight().stored->scaling.granularity, Granularity::row);
    // x unquantized, only the weight's e4m3 rounding: 32.9 dB here (fixed seeds); x cast to e4m3
    // as well, the nearest wrong answer, 30.4. The floor sits between the two.
    const Tensor x = normal_input(9, 16, 5);
    EXPECT_GE(forward_sqnr_db(m.linear("proj_in"), w_in, x), 31.5);
    m.linear("proj_in").quantize_input = true;
    EXPECT_LT(forward_sqnr_db(m.linear("proj_in"), w_in, x), 31.5);
    OddModel t;
    Float8LinearOptions defaults;
    test::expect_error([&] { convert_to_float8_training(t, policy_plan(*o.policy, defaults)); },
                       "'proj_in' is weight_only");
}

TEST(LayerwiseCasting, PolicySkipsWithItsReasonAndPicksTheStoredLayout) {
    OddModel m;
    std::map<std::string, std::vector<float>> w32;
    for (const char* n : {"proj_in", "blocks.0.fc", "blocks.0.out", "head", "proj_out"}) w32[n] = weights_of(m.linear(n));
    LayerwiseCastingOptions o;
    o.skip_patterns = {"pos_embed"};  // the default patterns would skip proj_in / proj_out
    o.policy = policy_file("layerwise", R"J(
        {"name": "head", "fp8": true, "recipe": "mxfp8", "reason": "r1"},
        {"name": "blocks.0.fc.weight", "fp8": true, "recipe": "block", "reason": "r2"},
        {"weight_shape": [48, 100], "fp8": false, "recipe": null, "reason": "keep: 19 dB"},
        {"name": "proj_in", "fp8": true, "recipe": "rowwise", "reason": "r3"},
        {"name": "pos_embed", "fp8": true, "recipe": "rowwise", "reason": "the skip pattern wins"})J");
    const LayerwiseCastingReport r = enable_layerwise_casting(m, o);
    EXPECT_EQ(names(r.skipped), (Names{"pos_embed", "blocks.0.out"}));
    EXPECT_EQ(why(r.skipped, "blocks.0.out"), "policy: keep: 19 dB");
    EXPECT_EQ(why(r.skipped, "pos_embed"), "pattern 'pos_embed'");
    EXPECT_EQ(r.native, (Names{"proj_in", "blocks.0.fc", "head", "proj_out"}));
    auto granularity = [&](const std::string& n) { return m.linear(n).weight().stored->scaling; };
    EXPECT_EQ(granularity("head").granularity, Granularity::mx32);
    EXPECT_EQ(granularity("blocks.0.fc").granularity, Granularity::block);
    EXPECT_EQ(granularity("blocks.0.fc").block_rows, 128);
    EXPECT_EQ(granularity("proj_in").granularity, Granularity::row);
    EXPECT_EQ(granularity("proj_out").granularity, Granularity::tensor);  // no entry: as without a policy
    EXPECT_EQ(m.linear("head").weight().stored->format(), Format::e4m3fn);
    EXPECT_EQ(m.linear("blocks.0.fc").bias()->stored->scaling.granularity, Granularity::tensor);
    EXPECT_FALSE(m.linear("blocks.0.out").weight().stored.has_value());
    // Each FP8 layer (weight and input in e4m3, the layout's scales) against the float64 product
    // of the float32 weights: the FP8 GEMM floor, 25 dB; the skipped one exactly.
    const Tensor x48 = normal_input(9, 48, 2), x16 = normal_input(9, 16, 3), x100 = normal_input(9, 100, 4);
    for (const char* n : {"blocks.0.fc", "head", "proj_out"}) EXPECT_GE(forward_sqnr_db(m.linear(n), w32[n], x48), 25.0) << n;
    EXPECT_GE(forward_sqnr_db(m.linear("proj_in"), w32["proj_in"], x16), 25.0);
    EXPECT_GE(forward_sqnr_db(m.linear("blocks.0.out"), w32["blocks.0.out"], x100), 100.0);
    o.scaled = false;
    EXPECT_THROW(enable_layerwise_casting(m, o), Error);
}

}  // namespace
}  // namespace fp8kit::nn
