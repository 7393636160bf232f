// tests/golden/test_safetensors_py.cpp: interop of fp8kit's safetensors files with the safetensors
// Python package and PyTorch (tests/golden/safetensors_oracle.py), both ways, over every dtype:
// files torch saves read back in fp8kit with the right dtype, shape, bytes and metadata, and files
// fp8kit writes load in torch (load_file, safe_open) with the right torch dtype, shape, bytes and
// metadata. Skipped (GTEST_SKIP, with the reason) when the venv's Python, torch or safetensors is
// missing.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "fp8kit/safetensors.hpp"
#include "oracle.hpp"

namespace fp8kit::test {
namespace {

namespace fs = std::filesystem;

class SafetensorsPython : public ::testing::Test {
protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / ("fp8kit_stpy_" + std::to_string(std::random_device{}()));
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }

    // Runs the oracle; returns false (and sets skip_) when it reports torch/safetensors missing.
    bool oracle(const std::string& mode) {
        const OracleRun run = run_oracle(FP8KIT_PYTHON, FP8KIT_SAFETENSORS_ORACLE, {mode, dir_.string()});
        if (run.outcome == OracleRun::Outcome::skipped) {
            skip_ = run.message;
            return false;
        }
        EXPECT_EQ(run.outcome, OracleRun::Outcome::passed) << "oracle " << mode << " failed:\n" << run.message;
        return run.outcome == OracleRun::Outcome::passed;
    }
    nlohmann::json manifest() const { return nlohmann::json::parse(read_file(dir_ / "manifest.json")); }

    fs::path dir_;
    std::string skip_;
};

TEST_F(SafetensorsPython, FilesTorchSavesReadInFp8kit) {
    if (!oracle("write")) {
        if (!skip_.empty()) GTEST_SKIP() << skip_;
        return;
    }
    const nlohmann::json m = manifest();
    const SafetensorsFile f((dir_ / "torch.safetensors").string());
    EXPECT_EQ(f.names().size(), m["tensors"].size());
    for (const auto& e : m["tensors"]) {
        const std::string name = e["name"];
        SCOPED_TRACE(name);
        ASSERT_TRUE(f.contains(name));
        const Tensor t = f.tensor(name);
        EXPECT_EQ(safetensors_dtype_name(t.dtype()), e["dtype"].get<std::string>());
        EXPECT_EQ(t.shape(), e["shape"].get<Shape>());
        const std::string want = read_file(dir_ / e["bin"].get<std::string>());
        ASSERT_EQ(t.nbytes(), want.size());
        EXPECT_EQ(std::memcmp(t.const_raw_data(), want.data(), want.size()), 0);
    }
    EXPECT_EQ(f.metadata(), (m["metadata"].get<std::map<std::string, std::string>>()));
}

TEST_F(SafetensorsPython, FilesFp8kitWritesLoadInTorch) {
    if (!oracle("write")) {
        if (!skip_.empty()) GTEST_SKIP() << skip_;
        return;
    }
    const nlohmann::json m = manifest();
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const auto& e : m["tensors"]) {
        const auto dtype = parse_safetensors_dtype(e["dtype"].get<std::string>());
        ASSERT_TRUE(dtype.has_value()) << e["dtype"];
        Tensor t = Tensor::empty(e["shape"].get<Shape>(), *dtype);
        const std::string bytes = read_file(dir_ / e["bin"].get<std::string>());
        ASSERT_EQ(bytes.size(), t.nbytes());
        if (!bytes.empty()) std::memcpy(t.raw_data(), bytes.data(), bytes.size());
        tensors.emplace_back(e["name"].get<std::string>(), t);
    }
    save_safetensors((dir_ / "fp8kit.safetensors").string(), tensors,
                     m["metadata"].get<std::map<std::string, std::string>>());
    oracle("check");
}

}  // namespace
}  // namespace fp8kit::test
