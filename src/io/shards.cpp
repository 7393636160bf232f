// src/io/shards.cpp: checkpoints on disk (fp8kit/checkpoint.hpp) - reading one safetensors file or
// a directory of shards (index, config.json), the rules for an output path (never an input,
// compared as files; an existing one replaced only with force), and writing a checkpoint that
// appears whole or not at all, interrupts included (src/platform's temporaries).
// Checked by tests/e2e/test_checkpoint.sh (shard directories, outputs, failures leaving nothing),
// tests/e2e/test_checkpoint_safety.sh (OUT = IN through links and relative paths, --force, SIGINT,
// SIGTERM and SIGKILL) and tests/nn/test_parameters.cpp (models loaded from shards).
#include <algorithm>
#include <filesystem>

#include "fp8kit/checkpoint.hpp"
#include "fp8kit/error.hpp"
#include "fp8kit/files.hpp"
#include "io/json.hpp"
#include "platform/platform.hpp"

namespace fp8kit {

namespace fs = std::filesystem;
using detail::Json;

namespace {

constexpr const char* index_name = "model.safetensors.index.json";
// A shard's name goes into every message about its tensors, and an application shows those
// (a Python traceback prints them as they are): one a terminal would act on is refused.
constexpr const char* unreadable_name = ", a name holding control characters or bytes that are not UTF-8 (not read)";

}  // namespace

// ---- Checkpoint ----

Checkpoint::Checkpoint(const std::string& path) : path_(path) {
    std::error_code ec;
    directory_ = fs::is_directory(path, ec);
    if (!directory_) {
        shard_files_.push_back(fs::path(path).filename().string());
        shards_.emplace_back(path);
    } else {
        const fs::path index = fs::path(path) / index_name;
        std::vector<std::pair<std::string, std::string>> listed;  // the index's (tensor, shard) pairs
        if (fs::exists(index, ec)) {
            const Json j = detail::parse_json(read_file(index.string()), index.string());
            if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
                throw Error(index.string() + ": no weight_map object");
            }
            for (const auto& [name, file] : j["weight_map"].items()) {
                if (!file.is_string()) throw Error(index.string() + ": weight_map[" + quote_printable(name) + "] is not a file name");
                const std::string f = file.get<std::string>();
                if (f.empty() || fs::path(f).has_parent_path() || f == "." || f == "..") {
                    throw Error(index.string() + ": weight_map[" + quote_printable(name) + "] is " + quote_printable(f) + ", not a file in the directory");
                }
                if (printable(f) != f) {
                    throw Error(index.string() + ": weight_map[" + quote_printable(name) + "] is " + quote_printable(f) + unreadable_name);
                }
                if (std::find(shard_files_.begin(), shard_files_.end(), f) == shard_files_.end()) shard_files_.push_back(f);
                listed.emplace_back(name, f);
            }
        } else {
            for (const auto& e : fs::directory_iterator(path)) {
                if (e.path().extension() != ".safetensors") continue;
                const std::string f = e.path().filename().string();
                if (printable(f) != f) throw Error(path + ": the shard " + quote_printable(f) + unreadable_name);
                shard_files_.push_back(f);
            }
        }
        std::sort(shard_files_.begin(), shard_files_.end());
        if (shard_files_.empty()) throw Error(path + ": no .safetensors files in the directory");
        for (const std::string& f : shard_files_) shards_.emplace_back((fs::path(path) / f).string());
        // Every tensor the index lists is in the shard it names (else a reader would miss it).
        for (const auto& [name, f] : listed) {
            const size_t i = size_t(std::find(shard_files_.begin(), shard_files_.end(), f) - shard_files_.begin());
            if (!shards_[i].contains(name)) {
                throw Error(index.string() + ": weight_map lists tensor " + quote_printable(name) + " in " + quote_printable(f) +
                            ", which does not hold it (each index entry must be in its shard)");
            }
        }
        const fs::path cfg = fs::path(path) / "config.json";
        if (fs::exists(cfg, ec)) {
            config_ = read_file(cfg.string());
            if (!detail::parse_json(*config_, cfg.string()).is_object()) throw Error(cfg.string() + ": not a JSON object");
        }
    }
    for (size_t i = 0; i < shards_.size(); ++i) {
        for (const std::string& n : shards_[i].names()) {
            if (!shard_index_.emplace(n, i).second) {
                throw Error(path + ": tensor " + quote_printable(n) + " is in both " + quote_printable(shard_files_[shard_index_[n]]) + " and " +
                            quote_printable(shard_files_[i]));
            }
            names_.push_back(n);
        }
    }
    try {
        quantization_config_ = find_quantization_config(quantization_config_where_);
    } catch (const Error& e) {
        quantization_config_error_ = e.what();
    }
}

size_t Checkpoint::shard_of(const std::string& tensor) const {
    const auto it = shard_index_.find(tensor);
    if (it == shard_index_.end()) throw Error(path_ + ": no tensor named " + quote_printable(tensor));
    return it->second;
}

namespace {
// The config.json beside a single file (its directory's), if there is one.
fs::path sibling_config(const std::string& file) {
    const fs::path dir = fs::path(file).parent_path();
    return (dir.empty() ? fs::path(".") : dir) / "config.json";
}
}  // namespace

std::optional<std::string> Checkpoint::quantization_config() const {
    if (!quantization_config_error_.empty()) throw Error(quantization_config_error_);
    return quantization_config_;
}

std::optional<std::string> Checkpoint::find_quantization_config(std::string& where) const {
    if (config_) {
        const Json c = Json::parse(*config_);  // checked when read
        where = (fs::path(path_) / "config.json").string();
        if (c.contains("quantization_config")) return c["quantization_config"].dump();
    }
    where = shards_.front().path();
    if (auto own = TensorLookup::quantization_config()) return own;  // the metadata's
    // A file inside a checkpoint directory (its model.safetensors, one shard): the directory's
    // config.json describes it - a compressed-tensors block scale, a group size, a block size
    // other than 128 are known only from there. One that is there but cannot be read (a link
    // loop) is an error, not a config taken as absent.
    std::error_code ec;
    const fs::path cfg = sibling_config(path_);
    const bool there = !directory_ && fs::exists(cfg, ec);
    if (ec) throw Error(quote_printable(cfg.string()) + " cannot be read (" + ec.message() + ")");
    if (there) {
        const std::string text = read_file(cfg.string());
        const Json c = detail::parse_json(text, cfg.string());
        where = cfg.string();
        if (c.is_object() && c.contains("quantization_config")) return c["quantization_config"].dump();
    }
    return std::nullopt;
}

std::vector<std::string> Checkpoint::files() const {
    if (!directory_) {  // and the config.json beside it, which quantization_config() may read
        std::error_code ec;
        const fs::path cfg = sibling_config(path_);
        return fs::exists(cfg, ec) ? std::vector<std::string>{path_, cfg.string()} : std::vector<std::string>{path_};
    }
    std::vector<std::string> out{path_};
    for (const std::string& f : shard_files_) out.push_back((fs::path(path_) / f).string());
    for (const char* f : {index_name, "config.json"}) out.push_back((fs::path(path_) / f).string());
    return out;
}

// ---- outputs ----

void check_output(const std::string& out, bool directory, const std::vector<std::string>& inputs, bool force) {
    if (out.empty()) throw Error("the output path is empty");
    std::error_code ec;
    const fs::path abs = fs::absolute(out, ec);
    const fs::path folder = abs.parent_path();
    if (!fs::is_directory(folder, ec)) throw Error(out + ": the folder " + quote_printable(folder.string()) + " does not exist");
    for (const std::string& in : inputs) {
        if (platform::same_file(out, in)) throw Error(out + " is the same file as the input " + in + " (inputs are never modified)");
        // A directory output replaced with force must not hold an input either.
        for (fs::path p = fs::absolute(in, ec).parent_path(); !p.empty() && p != p.parent_path(); p = p.parent_path()) {
            if (platform::same_file(out, p.string())) throw Error(out + " holds the input " + in + " (inputs are never modified)");
        }
        // Nor may the output land inside an input directory (compared as files, through links).
        for (fs::path p = folder; !p.empty(); p = p.parent_path()) {
            if (platform::same_file(p.string(), in)) throw Error(out + " is inside the input " + in + " (inputs are never modified)");
            if (p == p.parent_path()) break;
        }
    }
    // Whatever is at OUT - a file, a directory, a link (dangling or not), a FIFO - is there already.
    const fs::file_status st = fs::symlink_status(abs, ec);
    if (fs::exists(st)) {
        if (!force) throw Error(out + ": the output exists already (--force replaces it)");
        // With force a directory (or a link to one) is replaced by a directory, anything else by a file.
        const bool is_dir = fs::is_directory(abs, ec);
        if (is_dir != directory) {
            throw Error(out + " is a " + (is_dir ? "directory" : "file") + " and the output is a " +
                        (directory ? "directory" : "file") + "; --force replaces only the same kind");
        }
    }
}

std::vector<std::string> remove_stale_temporaries(const std::string& out) {
    std::vector<std::string> removed;
    for (const std::string& t : platform::stale_temporaries(out)) {
        std::error_code ec;
        fs::remove_all(t, ec);
        if (ec) throw Error(t + ": cannot remove this temporary left by an interrupted run: " + ec.message());
        removed.push_back(t);
    }
    return removed;
}

// ---- CheckpointWriter ----

CheckpointWriter::CheckpointWriter(const Checkpoint& in, std::string out, std::optional<std::string> quantization_config)
    : in_(in), out_(std::move(out)), qconfig_(std::move(quantization_config)) {
    if (!in_.is_directory()) return;
    std::error_code ec;
    for (unsigned n = 0;; ++n) {
        temp_ = platform::temporary_name(out_, n);
        const int slot = platform::remove_on_interrupt(temp_, true);  // before it exists
        if (fs::create_directory(temp_, ec)) {
            cleanup_slots_.push_back(slot);
            break;
        }
        platform::keep_on_interrupt(slot);
        if (ec || n > 100) throw Error(temp_ + ": cannot create the temporary output directory: " + ec.message());
    }
}

CheckpointWriter::~CheckpointWriter() {
    if (!temp_.empty() && !committed_) {
        std::error_code ec;
        fs::remove_all(temp_, ec);
    }
    for (const int s : cleanup_slots_) platform::keep_on_interrupt(s);
}

std::string CheckpointWriter::file(const std::string& name) {
    if (!in_.is_directory()) return out_;
    const std::string f = (fs::path(temp_) / name).string();
    cleanup_slots_.push_back(platform::remove_on_interrupt(f, false));
    return f;
}

void CheckpointWriter::write_text(const std::string& name, const std::string& text) {
    platform::ReplacingFile f(file(name));
    f.write(text.data(), text.size());
    f.commit();
}

void CheckpointWriter::write_shard(size_t shard, const std::vector<std::pair<std::string, Tensor>>& tensors) {
    std::map<std::string, std::string> meta = in_.shard(shard).metadata();
    meta.erase("quantization_config");
    if (qconfig_) meta["quantization_config"] = *qconfig_;
    const std::string& name = in_.shard_files()[shard];
    save_safetensors(file(name), tensors, meta);
    for (const auto& [tensor, t] : tensors) {
        weight_map_.emplace_back(tensor, name);
        total_size_ += t.nbytes();
    }
}

void CheckpointWriter::commit() {
    if (in_.is_directory()) {
        Json map = Json::object();
        for (const auto& [name, file] : weight_map_) map[name] = file;
        write_text(index_name, Json{{"metadata", {{"total_size", total_size_}}}, {"weight_map", std::move(map)}}.dump(2) + "\n");
        Json config = in_.config_json() ? Json::parse(*in_.config_json()) : Json::object();
        config.erase("quantization_config");
        if (qconfig_) config["quantization_config"] = Json::parse(*qconfig_);
        write_text("config.json", config.dump(2) + "\n");
        for (const auto& e : fs::directory_iterator(in_.path())) {
            const std::string name = e.path().filename().string();
            const bool ours = e.path().extension() == ".safetensors" || name == "config.json" || name == index_name;
            if (!ours && e.is_regular_file()) write_text(name, read_file(e.path().string()));
        }
        std::error_code ec;
        if (fs::exists(out_, ec)) {
            // --force over a directory: the old one moves aside (a temporary a later run removes,
            // should this one be killed now), the new one moves in, the old one goes.
            std::string old;
            for (unsigned n = 1000;; ++n) {
                old = platform::temporary_name(out_, n);
                if (!fs::exists(old, ec)) break;
            }
            fs::rename(out_, old, ec);
            if (ec) throw Error(out_ + ": cannot move the existing output aside to replace it: " + ec.message());
            fs::rename(temp_, out_, ec);
            if (ec) {
                std::error_code back;
                fs::rename(old, out_, back);
                throw Error(out_ + ": cannot move the finished output into place: " + ec.message());
            }
            fs::remove_all(old, ec);
        } else {
            fs::rename(temp_, out_, ec);
            if (ec) throw Error(out_ + ": cannot move the finished output into place: " + ec.message());
        }
    }
    committed_ = true;
}

}  // namespace fp8kit
