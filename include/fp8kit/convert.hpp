// fp8kit/convert.hpp: bulk conversion between float32 / bf16 / f16 and the FP8 formats.
//
// Each function is the scalar encode()/decode() of <fp8kit/format.hpp> applied element by
// element, bit for bit, on whichever SIMD path the CPU has (see <fp8kit/runtime.hpp>), split
// over the library's threads for large inputs. Checked against the scalar functions on every
// path (all 2^32 float32 inputs for e4m3fn and e5m2) and against the golden vectors.
//
// Scaled encode computes float32(in[i] * scale) with one float32 multiply and encodes that;
// scaled decode returns float32(decode(in[i]) * scale_inv), rounded once more to bf16 / f16 for
// those outputs. The multiply follows the caller's floating-point environment (as any float32
// multiply does); the FP8 rounding itself never depends on it.
//
// Spans must have equal sizes (fp8kit::Error otherwise). Input and output must not overlap.
#pragma once

#include <cstdint>
#include <span>

#include "fp8kit/format.hpp"
#include "fp8kit/half.hpp"

namespace fp8kit {

void encode(std::span<const float> in, std::span<uint8_t> out, Format f,
            Overflow o = Overflow::saturate, float scale = 1.0f);
void encode(std::span<const bf16> in, std::span<uint8_t> out, Format f,
            Overflow o = Overflow::saturate, float scale = 1.0f);
void encode(std::span<const f16> in, std::span<uint8_t> out, Format f,
            Overflow o = Overflow::saturate, float scale = 1.0f);

void decode(std::span<const uint8_t> in, std::span<float> out, Format f, float scale_inv = 1.0f);
void decode(std::span<const uint8_t> in, std::span<bf16> out, Format f, float scale_inv = 1.0f);
void decode(std::span<const uint8_t> in, std::span<f16> out, Format f, float scale_inv = 1.0f);

// Stochastic rounding (for gradients): element i uses random_bits(seed, offset + i), so a
// tensor converted in pieces (pass each piece's starting index as offset) gives the same codes
// as converted whole, for any thread count. Not defined for e8m0fnu (fp8kit::Error).
struct StochasticRounding {
    uint64_t seed = 0;
    uint64_t offset = 0;
};
void encode_stochastic(std::span<const float> in, std::span<uint8_t> out, Format f,
                       StochasticRounding sr, Overflow o = Overflow::saturate, float scale = 1.0f);

}  // namespace fp8kit
