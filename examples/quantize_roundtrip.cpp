// examples/quantize_roundtrip.cpp: scale a float32 tensor into e4m3fn with a per-tensor scale
// (TransformerEngine's fp8_max / amax), convert it back, and report the error in dB.
// Exits non-zero if the round trip is below NUMERICS.md's 25 dB floor for N(0,1) data.
#include <fp8kit/fp8kit.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

int main() {
    std::vector<float> x(1 << 16);
    std::mt19937 rng(0);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : x) v = normal(rng);

    float amax = 0.0f;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    const fp8kit::FormatInfo info = fp8kit::format_info(fp8kit::Format::e4m3fn);
    const float scale = info.max / amax;

    std::vector<uint8_t> codes(x.size());
    std::vector<float> back(x.size());
    fp8kit::encode(x, codes, fp8kit::Format::e4m3fn, fp8kit::Overflow::saturate, scale);
    fp8kit::decode(codes, back, fp8kit::Format::e4m3fn, 1.0f / scale);

    double signal = 0, noise = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        signal += double(x[i]) * x[i];
        noise += (double(x[i]) - back[i]) * (double(x[i]) - back[i]);
    }
    const double sqnr_db = 10.0 * std::log10(signal / noise);
    std::printf("fp8kit %s, %s path: e4m3fn round trip of N(0,1), scale %.4g: SQNR %.2f dB\n",
                FP8KIT_VERSION_STRING, std::string(fp8kit::to_string(fp8kit::active_isa())).c_str(),
                double(scale), sqnr_db);
    return sqnr_db >= 25.0 ? 0 : 1;
}
