// tools/checkpoint.cpp: checkpoints (a file or a directory of shards), SQNR and whole-or-nothing
// outputs for the checkpoint subcommands (checkpoint.hpp).
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

}  // namespace

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
    return compare_values(a.data<const float>(), b.data<const float>(), a.numel());
}

ErrorStats compare(const double* ref, const float* x, int64_t n) { return compare_values(ref, x, n); }

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
