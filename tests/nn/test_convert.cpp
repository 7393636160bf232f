// tests/nn/test_convert.cpp: convert_to_float8_training and enable_layerwise_casting on a model
// with odd shapes: which modules are converted / cast / skipped and why, the default, user and
// auto filters, skip patterns and classes, the capability table, and weight memory counted
// independently from the shapes. Layerwise-cast outputs are checked against the float32 model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "fp8kit/nn.hpp"

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
    double s = 0, e = 0;
    for (int64_t i = 0; i < ref.numel(); ++i) {
        const double a = ref.data<float>()[i], b = y.data<float>()[i];
        s += a * a;
        e += (a - b) * (a - b);
    }
    EXPECT_GE(10 * std::log10(s / e), 25.0);
    // Inference only: no backward through an FP8-stored weight.
    EXPECT_THROW(m.linear("head").backward(y), Error);
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

}  // namespace
}  // namespace fp8kit::nn
