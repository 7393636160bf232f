// tools/checkpoint.cpp: checkpoints (a file or a directory of shards), FP8 weight layouts, SQNR,
// the policy file and whole-or-nothing outputs for the checkpoint subcommands (checkpoint.hpp).
// Checked by tests/e2e/test_checkpoint.sh and tests/e2e/check_checkpoint.py.
#include "checkpoint.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <random>

#include <nlohmann/json.hpp>

#include "fp8kit/error.hpp"
#include "platform/platform.hpp"

namespace fp8kit::tools {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

Json parse_json_file(const std::string& path) {
    try {
        return Json::parse(read_text(path));
    } catch (const Json::exception& e) {
        throw Error(path + ": not valid JSON (" + std::string(e.what()) + ")");
    }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

std::string_view to_string(Scheme s) noexcept {
    switch (s) {
        case Scheme::tensor: return "tensor";
        case Scheme::channel: return "channel";
        case Scheme::block128: return "block128";
        case Scheme::mx32: return "mx32";
    }
    return "?";
}

Scheme parse_scheme(std::string_view text) {
    for (Scheme s : {Scheme::tensor, Scheme::channel, Scheme::block128, Scheme::mx32}) {
        if (to_string(s) == text) return s;
    }
    throw Error("unknown scheme '" + std::string(text) + "', expected tensor, channel, block128 or mx32");
}

Scaling scaling_of(Scheme s) {
    switch (s) {
        case Scheme::tensor: return Scaling::tensor();
        case Scheme::channel: return Scaling::row();
        case Scheme::block128: return Scaling::block(128, 128);
        case Scheme::mx32: return Scaling::mx32();
    }
    return Scaling::tensor();
}

std::string scale_name(const std::string& weight, Scheme s) {
    return weight + (s == Scheme::block128 ? "_scale_inv" : "_scale");
}

std::string read_text(const std::string& path) {
    const platform::MappedFile f(path);
    return std::string(reinterpret_cast<const char*>(f.data()), f.size());
}

// ---- Checkpoint ----

Checkpoint::Checkpoint(const std::string& path) : path_(path) {
    std::error_code ec;
    directory_ = fs::is_directory(path, ec);
    if (!directory_) {
        shard_files_.push_back(fs::path(path).filename().string());
        shards_.emplace_back(path);
    } else {
        const fs::path index = fs::path(path) / "model.safetensors.index.json";
        if (fs::exists(index, ec)) {
            const Json j = parse_json_file(index.string());
            if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
                throw Error(index.string() + ": no weight_map object");
            }
            for (const auto& [name, file] : j["weight_map"].items()) {
                if (!file.is_string()) throw Error(index.string() + ": weight_map['" + name + "'] is not a file name");
                const std::string f = file.get<std::string>();
                if (std::find(shard_files_.begin(), shard_files_.end(), f) == shard_files_.end()) shard_files_.push_back(f);
            }
            std::sort(shard_files_.begin(), shard_files_.end());
        } else {
            for (const auto& e : fs::directory_iterator(path)) {
                if (e.path().extension() == ".safetensors") shard_files_.push_back(e.path().filename().string());
            }
            std::sort(shard_files_.begin(), shard_files_.end());
        }
        if (shard_files_.empty()) throw Error(path + ": no .safetensors files in the directory");
        for (const std::string& f : shard_files_) shards_.emplace_back((fs::path(path) / f).string());
    }
    for (size_t i = 0; i < shards_.size(); ++i) {
        for (const std::string& n : shards_[i].names()) {
            if (!shard_index_.emplace(n, i).second) {
                throw Error(path + ": tensor '" + n + "' is in both " + shard_files_[shard_index_[n]] + " and " + shard_files_[i]);
            }
            names_.push_back(n);
        }
    }
}

size_t Checkpoint::shard_of(const std::string& tensor) const {
    const auto it = shard_index_.find(tensor);
    if (it == shard_index_.end()) throw Error(path_ + ": no tensor named '" + tensor + "'");
    return it->second;
}

std::optional<std::vector<int64_t>> Checkpoint::weight_block_size() const {
    const auto it = metadata().find("quantization_config");
    if (it == metadata().end()) return std::nullopt;
    const Json q = Json::parse(it->second, nullptr, false);
    if (!q.is_object() || !q.contains("weight_block_size") || !q["weight_block_size"].is_array()) return std::nullopt;
    std::vector<int64_t> b;
    for (const Json& v : q["weight_block_size"]) {
        if (!v.is_number_integer() || v.get<int64_t>() < 1) throw Error(path_ + ": weight_block_size " + q["weight_block_size"].dump() + " is not positive integers");
        b.push_back(v.get<int64_t>());
    }
    if (b.size() != 2) throw Error(path_ + ": weight_block_size " + q["weight_block_size"].dump() + " is not [rows, cols]");
    return b;
}

// ---- FP8 layouts ----

std::optional<StoredWeight> stored_weight(const Checkpoint& c, const std::string& name) {
    const SafetensorsEntry& e = c.shard(c.shard_of(name)).entry(name);
    if (!is_fp8(e.dtype) || e.dtype == DType::e8m0fnu || e.shape.empty()) return std::nullopt;
    const Tensor data = c.tensor(name);
    QTensor q;
    q.data = data;
    q.format = format_of(e.dtype);
    const int64_t rows = q.rows(), cols = q.cols();
    const std::string where = c.path() + ": FP8 tensor '" + name + "' " + to_string(e.shape);
    Scheme scheme;
    std::string scale;
    if (c.contains(name + "_scale_inv")) {
        scale = name + "_scale_inv";
        const Tensor s = c.tensor(scale);
        const auto b = c.weight_block_size().value_or(std::vector<int64_t>{128, 128});
        q.scaling = Scaling::block(b[0], b[1]);
        if (s.dtype() != DType::f32 || s.numel() != ceil_div(rows, b[0]) * ceil_div(cols, b[1])) {
            throw Error(where + ": " + scale + " is " + std::string(to_string(s.dtype())) + " " + to_string(s.shape()) +
                        ", expected f32 [" + std::to_string(ceil_div(rows, b[0])) + ", " + std::to_string(ceil_div(cols, b[1])) + "]");
        }
        q.scale_inv = s.reshape({ceil_div(rows, b[0]), ceil_div(cols, b[1])});
        scheme = Scheme::block128;
    } else if (c.contains(name + "_scale")) {
        scale = name + "_scale";
        const Tensor s = c.tensor(scale);
        if (s.dtype() == DType::e8m0fnu && s.numel() == rows * ceil_div(cols, 32)) {
            scheme = Scheme::mx32;
        } else if (s.dtype() == DType::f32 && s.numel() == 1) {
            scheme = Scheme::tensor;
        } else if (s.dtype() == DType::f32 && s.numel() == rows && s.dim() >= 1 && s.size(0) == rows) {
            scheme = Scheme::channel;
        } else {
            throw Error(where + ": its scale " + scale + " " + std::string(to_string(s.dtype())) + " " + to_string(s.shape()) +
                        " fits no layout (f32 [1], f32 [rows, 1], e8m0 [rows, ceil(cols/32)])");
        }
        q.scaling = scaling_of(scheme);
        const GroupShape gs = q.scaling.scale_shape(rows, cols);
        q.scale_inv = s.reshape({gs.rows, gs.cols});
    } else {
        return std::nullopt;
    }
    return StoredWeight{scheme, scale, q};
}

bool is_scale_name(const Checkpoint& c, const std::string& name) {
    for (const char* suffix : {"_scale_inv", "_scale"}) {
        const std::string s(suffix);
        if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
            const std::string w = name.substr(0, name.size() - s.size());
            if (c.contains(w) && stored_weight(c, w)) return true;
        }
    }
    return false;
}

Tensor to_f32(const Tensor& t) {
    if (t.dtype() == DType::f32) return t;
    const Tensor c = t.contiguous();
    Tensor out = Tensor::empty(c.shape(), DType::f32);
    float* o = out.data<float>();
    const int64_t n = c.numel();
    switch (c.dtype()) {
        case DType::bf16: for (int64_t i = 0; i < n; ++i) o[i] = float(c.data<bf16>()[i]); break;
        case DType::f16: for (int64_t i = 0; i < n; ++i) o[i] = float(c.data<f16>()[i]); break;
        case DType::f64: for (int64_t i = 0; i < n; ++i) o[i] = float(c.data<double>()[i]); break;
        default:
            if (!is_fp8(c.dtype())) throw Error("tensor of dtype " + std::string(to_string(c.dtype())) + " is not floating point");
            for (int64_t i = 0; i < n; ++i) o[i] = decode(c.data<uint8_t>()[i], format_of(c.dtype()));
    }
    return out;
}

Tensor values_f32(const Checkpoint& c, const std::string& name) {
    if (auto w = stored_weight(c, name)) return dequantize(w->q, DType::f32);
    return to_f32(c.tensor(name));
}

bool is_float_weight(DType d) noexcept { return d == DType::f32 || d == DType::bf16 || d == DType::f16; }

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
    return compare_values(a.data<float>(), b.data<float>(), a.numel());
}

ErrorStats compare(const double* ref, const float* x, int64_t n) { return compare_values(ref, x, n); }

// ---- policy ----

Scheme scheme_of_recipe(std::string_view recipe) {
    if (recipe == "tensorwise") return Scheme::tensor;
    if (recipe == "rowwise") return Scheme::channel;
    if (recipe == "block") return Scheme::block128;
    if (recipe == "mxfp8") return Scheme::mx32;
    throw Error("policy: unknown recipe '" + std::string(recipe) + "', expected tensorwise, rowwise, block or mxfp8");
}

namespace {
std::string_view recipe_of(Scheme s) {
    switch (s) {
        case Scheme::tensor: return "tensorwise";
        case Scheme::channel: return "rowwise";
        case Scheme::block128: return "block";
        case Scheme::mx32: return "mxfp8";
    }
    return "?";
}
}  // namespace

const PolicyLayer* Policy::find(const std::string& weight, const Shape& shape) const {
    for (const PolicyLayer& l : layers) {
        if (!l.name.empty() && (weight == l.name || weight.rfind(l.name + ".", 0) == 0)) return &l;
    }
    for (const PolicyLayer& l : layers) {
        if (l.name.empty() && l.weight_shape == shape) return &l;
    }
    return nullptr;
}

Policy read_policy(const std::string& path) {
    const Json j = parse_json_file(path);
    const auto bad = [&](const std::string& what) { return Error(path + ": " + what + " (see docs/CHECKPOINTS.md)"); };
    if (!j.is_object() || j.value("format", "") != "fp8kit-policy" || !j.contains("layers") || !j["layers"].is_array()) {
        throw bad("not an fp8kit policy: expected {\"format\": \"fp8kit-policy\", \"version\": 1, \"layers\": [...]}");
    }
    if (j.value("version", 0) != 1) throw bad("unsupported version " + j["version"].dump());
    Policy p;
    for (const Json& l : j["layers"]) {
        PolicyLayer pl;
        if (!l.is_object() || !l.contains("fp8") || !l["fp8"].is_boolean()) throw bad("layer " + l.dump() + " has no boolean 'fp8'");
        pl.fp8 = l["fp8"].get<bool>();
        if (l.contains("name")) {
            if (!l["name"].is_string()) throw bad("layer " + l.dump() + ": 'name' is not a string");
            pl.name = l["name"].get<std::string>();
        }
        if (l.contains("weight_shape")) {
            const Json& s = l["weight_shape"];
            if (!s.is_array() || s.size() != 2 || !s[0].is_number_integer() || !s[1].is_number_integer()) {
                throw bad("layer " + l.dump() + ": 'weight_shape' is not [out, in]");
            }
            pl.weight_shape = {s[0].get<int64_t>(), s[1].get<int64_t>()};
        }
        if (pl.name.empty() == pl.weight_shape.empty()) throw bad("layer " + l.dump() + " needs exactly one of 'name' and 'weight_shape'");
        if (l.contains("recipe") && !l["recipe"].is_null()) {
            if (!l["recipe"].is_string()) throw bad("layer " + l.dump() + ": 'recipe' is not a string");
            try {
                pl.scheme = scheme_of_recipe(l["recipe"].get<std::string>());
            } catch (const Error& e) {
                throw bad(e.what());
            }
        }
        if (pl.fp8 && !pl.scheme) throw bad("layer " + l.dump() + " is fp8 but names no recipe");
        pl.reason = l.value("reason", "");
        p.layers.push_back(std::move(pl));
    }
    return p;
}

std::string policy_json(const Policy& p) {
    Json layers = Json::array();
    for (const PolicyLayer& l : p.layers) {
        Json o = Json::object();
        if (!l.name.empty()) o["name"] = l.name;
        if (!l.weight_shape.empty()) o["weight_shape"] = l.weight_shape;
        o["fp8"] = l.fp8;
        o["recipe"] = l.scheme ? Json(recipe_of(*l.scheme)) : Json(nullptr);
        o["reason"] = l.reason;
        layers.push_back(std::move(o));
    }
    return Json{{"format", "fp8kit-policy"}, {"version", 1}, {"layers", std::move(layers)}}.dump(2) + "\n";
}

// ---- Output ----

Output::Output(const std::string& path, bool directory) : path_(path), directory_(directory) {
    if (!directory_) return;
    std::error_code ec;
    if (fs::exists(path, ec)) throw Error(path + ": the output directory exists already (choose a new path)");
    const fs::path p = fs::absolute(path);
    std::string hidden = p.filename().string();  // built by appends: GCC 12 misreads "." + s (-Wrestrict)
    hidden.insert(0, 1, '.');
    hidden.append(".tmp").append(std::to_string(std::random_device{}()));
    temp_ = (p.parent_path() / hidden).string();
    if (!fs::create_directory(temp_, ec)) throw Error(temp_ + ": cannot create the temporary output directory: " + ec.message());
}

Output::~Output() {
    if (directory_ && !committed_) {
        std::error_code ec;
        fs::remove_all(temp_, ec);
    }
}

std::string Output::file(const std::string& name) const {
    return directory_ ? (fs::path(temp_) / name).string() : path_;
}

void Output::write_text(const std::string& name, const std::string& text) const {
    platform::ReplacingFile f(file(name));
    f.write(text.data(), text.size());
    f.commit();
}

void Output::commit() {
    if (directory_) {
        std::error_code ec;
        fs::rename(temp_, path_, ec);
        if (ec) throw Error(path_ + ": cannot move the finished output into place: " + ec.message());
    }
    committed_ = true;
}

// ---- CheckpointWriter ----

CheckpointWriter::CheckpointWriter(const Checkpoint& in, const std::string& out, std::optional<std::string> quantization_config)
    : in_(in), out_(out, in.is_directory()), qconfig_(std::move(quantization_config)) {}

void CheckpointWriter::write_shard(size_t shard, const std::vector<std::pair<std::string, Tensor>>& tensors) {
    std::map<std::string, std::string> meta = in_.shard(shard).metadata();
    meta.erase("quantization_config");
    if (qconfig_) meta["quantization_config"] = *qconfig_;
    const std::string& file = in_.shard_files()[shard];
    save_safetensors(out_.file(file), tensors, meta);
    for (const auto& [name, t] : tensors) {
        weight_map_.emplace_back(name, file);
        total_size_ += t.nbytes();
    }
}

void CheckpointWriter::commit() {
    if (in_.is_directory()) {
        Json map = Json::object();
        for (const auto& [name, file] : weight_map_) map[name] = file;
        out_.write_text("model.safetensors.index.json",
                        Json{{"metadata", {{"total_size", total_size_}}}, {"weight_map", std::move(map)}}.dump(2) + "\n");
        const fs::path cfg = fs::path(in_.path()) / "config.json";
        std::error_code ec;
        Json config = fs::exists(cfg, ec) ? parse_json_file(cfg.string()) : Json::object();
        if (!config.is_object()) throw Error(cfg.string() + ": not a JSON object");
        config.erase("quantization_config");
        if (qconfig_) config["quantization_config"] = Json::parse(*qconfig_);
        out_.write_text("config.json", config.dump(2) + "\n");
        for (const auto& e : fs::directory_iterator(in_.path())) {
            const std::string name = e.path().filename().string();
            const bool ours = e.path().extension() == ".safetensors" || name == "config.json" ||
                              name == "model.safetensors.index.json";
            if (!ours && e.is_regular_file()) out_.write_text(name, read_text(e.path().string()));
        }
    }
    out_.commit();
}

void progress(size_t done, size_t total, const std::string& what) {
    const size_t width = 30, filled = total ? done * width / total : width;
    std::string line = "\r[" + std::string(filled, '#') + std::string(width - filled, '.') + "] " + std::to_string(done) +
                       "/" + std::to_string(total) + " " + what.substr(0, 60);
    line.resize(110, ' ');  // blanks out a longer previous line
    std::cerr << line << (done == total ? "\n" : "") << std::flush;
}

}  // namespace fp8kit::tools
