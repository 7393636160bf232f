// src/cpu/convert_simd.hpp: the FP8 encode/decode algorithm for SIMD registers, written once
// over an ISA's operation set V (see convert_avx2.cpp, convert_avx512.cpp).
//
// Checked against: the scalar encode()/decode() of <fp8kit/format.hpp>, over all 2^32 float32
// inputs for e4m3fn and e5m2 in both overflow modes (tests/unit/test_convert_exhaustive.cpp),
// and the golden vectors for every format (tests/golden).
//
// Included only by the ISA translation units, each compiled with its own -m flags. Everything
// here has internal linkage (anonymous namespace), and the kernels call nothing but intrinsics
// and each other: no inline function compiled for AVX-512 can be chosen by the linker for a
// caller on another path. Tails go through a zero-padded stack block, not scalar code.
// Passes: one read of the input, one write of the output (see stream_threshold_bytes).
//
// The algorithm is the scalar one, lane-parallel, on float32 bits:
//  - normal results: round-to-nearest-even by integer add of (half-1 + kept LSB), shift, rebias;
//  - subnormal results: |x| * 2^(bias-1+man) is exact and the code is that value rounded to an
//    integer, done by the float->int conversion with an explicit round-to-nearest-even
//    immediate, so neither depends on MXCSR. (With denormals-are-zero set by the caller, a
//    float32 subnormal input reads as 0, which is its correct FP8 code anyway.)
//  - then the overflow rule, NaN, and the sign, exactly as detail::finish_code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <immintrin.h>

#include "cpu/convert_kernels.hpp"

namespace fp8kit::cpu {
namespace {

// float32 bit patterns and powers of two used below. Constants are constexpr variables so that
// even an unoptimised build evaluates them at compile time (no out-of-line helper calls).
constexpr uint32_t abs_mask = 0x7fffffffu, inf_bits = 0x7f800000u, qnan_bits = 0x7fc00000u;
constexpr float pow2(int e) { return detail::f32_from_bits(uint32_t(127 + e) << 23); }

template <class V, Format F, Overflow O>
inline typename V::I encode_vec(typename V::F x) {
    using I = typename V::I;
    const I b = V::as_i(x);
    const I a = V::and_(b, V::set1(abs_mask));
    I code;
    if constexpr (F == Format::e8m0fnu) {
        // Exponent with round-half-up; float32 subnormals: 2^-127 below 1.5*2^-127, else 2^-126.
        const I normal = V::template srli<23>(V::add(a, V::set1(0x400000u)));
        const I subnormal =
            V::select(V::lt(a, V::set1(0x600000u)), V::set1(0u), V::set1(1u));
        code = V::select(V::lt(a, V::set1(0x800000u)), subnormal, normal);
        if constexpr (O == Overflow::saturate) code = V::min_u(code, V::set1(0xfeu));
        // Zero, negatives (b-1 < 0 as signed, incl. -0) and NaN (b-1 >= inf) have no code.
        const I bm1 = V::sub(b, V::set1(1u));
        const auto invalid = V::mask_or(V::lt(bm1, V::set1(0u)), V::gt(bm1, V::set1(inf_bits - 1u)));
        return V::select(invalid, V::set1(0xffu), code);
    } else {
        constexpr FormatInfo fi = format_info(F);
        constexpr int k = 23 - fi.mantissa_bits;
        constexpr uint32_t min_normal = uint32_t(128 - fi.bias) << 23;
        // (half - 1) minus the exponent rebias, folded into one constant (mod 2^32).
        constexpr uint32_t normal_add = ((1u << (k - 1)) - 1u) - (uint32_t(127 - fi.bias) << 23);
        constexpr float to_subnormal_units = pow2(fi.bias - 1 + fi.mantissa_bits);

        const I lsb = V::and_(V::template srli<k>(a), V::set1(1u));
        const I normal = V::template srli<k>(V::add(V::add(a, V::set1(normal_add)), lsb));
        const I subnormal = V::round_i(V::mul(V::as_f(a), V::set1f(to_subnormal_units)));
        code = V::select(V::lt(a, V::set1(min_normal)), subnormal, normal);

        const I nan_mag = V::set1(fi.has_neg_zero ? fi.nan_code : 0x80u);
        if constexpr (O == Overflow::saturate) {
            code = V::min_u(code, V::set1(fi.max_code));  // Inf lands here too: +-max
            code = V::select(V::gt(a, V::set1(inf_bits)), nan_mag, code);
        } else if constexpr (fi.has_inf) {
            code = V::select(V::gt(code, V::set1(fi.max_code)), V::set1(0x7cu), code);
            code = V::select(V::gt(a, V::set1(inf_bits)), nan_mag, code);
        } else {
            // NaN inputs round above max_code as well, so one select covers both.
            code = V::select(V::gt(code, V::set1(fi.max_code)), nan_mag, code);
        }
        const I sign = V::and_(V::template srli<24>(b), V::set1(0x80u));
        if constexpr (fi.has_neg_zero) return V::or_(code, sign);
        // fnuz: no -0, so the sign is dropped when the magnitude rounded to 0.
        return V::select(V::eq(code, V::set1(0u)), code, V::or_(code, sign));
    }
}

template <class V, Format F>
inline typename V::F decode_vec(typename V::I c) {
    using I = typename V::I;
    I bits;
    if constexpr (F == Format::e8m0fnu) {
        bits = V::template slli<23>(c);
        bits = V::select(V::eq(c, V::set1(0u)), V::set1(0x00400000u), bits);  // 2^-127
        bits = V::select(V::eq(c, V::set1(0xffu)), V::set1(qnan_bits), bits);
    } else {
        constexpr FormatInfo fi = format_info(F);
        constexpr int man = fi.mantissa_bits;
        constexpr float quantum = pow2(1 - fi.bias - man);
        const I mag = V::and_(c, V::set1(0x7fu));
        const I sign = V::template slli<24>(V::and_(c, V::set1(0x80u)));
        const I normal =
            V::add(V::template slli<23 - man>(mag), V::set1(uint32_t(127 - fi.bias) << 23));
        // Subnormals: mag * 2^(1-bias-man), exact (small integer times a power of two).
        const I subnormal =
            V::as_i(V::mul(V::cvt_f(mag), V::set1f(quantum)));
        bits = V::or_(V::select(V::lt(mag, V::set1(1u << man)), subnormal, normal), sign);
        const I nan = V::or_(sign, V::set1(qnan_bits));
        if constexpr (F == Format::e4m3fn) {
            bits = V::select(V::eq(mag, V::set1(0x7fu)), nan, bits);
        } else if constexpr (F == Format::e5m2) {
            bits = V::select(V::eq(mag, V::set1(0x7cu)), V::or_(sign, V::set1(inf_bits)), bits);
            bits = V::select(V::gt(mag, V::set1(0x7cu)), nan, bits);
        } else {
            bits = V::select(V::eq(c, V::set1(0x80u)), nan, bits);
        }
    }
    return V::as_f(bits);
}

// float32 -> bf16 bits in 32-bit lanes: round to nearest even on the bits (as bf16(float));
// NaN keeps its top bits and is made quiet, so it cannot round into Inf.
template <class V>
inline typename V::I bf16_bits(typename V::F v) {
    using I = typename V::I;
    const I b = V::as_i(v);
    const I lsb = V::and_(V::template srli<16>(b), V::set1(1u));
    const I rounded = V::template srli<16>(V::add(V::add(b, V::set1(0x7fffu)), lsb));
    const I quiet_nan = V::or_(V::template srli<16>(b), V::set1(0x40u));
    return V::select(V::gt(V::and_(b, V::set1(abs_mask)), V::set1(inf_bits)), quiet_nan, rounded);
}

// Blocks of four registers: enough independent work to hide latency, and one pack per block.
template <class V>
constexpr size_t block = 4 * V::W;

// Large decodes on a path whose stores are full 64-byte lines are written with non-temporal
// stores: ordinary stores first read every output line (read-for-ownership), which for a
// 1-byte -> 4-byte decode is 4 of its 9 bytes of memory traffic. Measured on this project's
// machine (docs/PERF.md): full-line streaming doubles decode speed out of cache; partial-line
// (32-byte) streaming, and streaming the small outputs of encode, were slower, so neither is done.
// Threshold: twice the L2, per call (i.e. per thread), where the output would not stay cached.
constexpr size_t stream_threshold_bytes = size_t(4) << 20;

// Input lines are prefetched this far ahead of the block being converted. Without it a core read
// its input at ~0.65x the rate of a plain read pass (the hardware prefetcher alone does not keep
// enough lines in flight while the core also computes and stores); 4 KiB ahead brings encode out
// of cache from ~0.63x to ~0.85-0.9x memcpy (docs/PERF.md). 8 KiB measured the same.
constexpr size_t prefetch_distance_bytes = 4096;

template <class V, class In>
inline void prefetch_block(const In* block_start) {
    const char* ahead = reinterpret_cast<const char*>(block_start) + prefetch_distance_bytes;
    // Hints never fault, so reaching past the end of the input is harmless.
    for (size_t off = 0; off < block<V> * sizeof(In); off += 64) _mm_prefetch(ahead + off, _MM_HINT_T0);
}

// Converts `count` (< one block) elements through a zero-padded stack block, so that nothing past
// the end of the caller's buffers is read or written.
template <class V, class In, class Out, class BlockFn>
void run_partial(const In* in, Out* out, size_t count, BlockFn& block_fn) {
    alignas(64) unsigned char src[block<V> * sizeof(In)] = {};
    alignas(64) unsigned char dst[block<V> * sizeof(Out)];
    std::memcpy(src, in, count * sizeof(In));
    block_fn(std::false_type{}, reinterpret_cast<const In*>(src), reinterpret_cast<Out*>(dst));
    std::memcpy(out, dst, count * sizeof(Out));
}

// Runs block_fn(nt, src, dst) over [0, n) in whole blocks and run_partial for what is left. With
// Stream, a large output gets nt = std::true_type (non-temporal stores) after a head that aligns
// it to 64 bytes.
template <class V, bool Stream, class In, class Out, class BlockFn>
void run_blocks(const In* in, Out* out, size_t n, BlockFn&& block_fn) {
    constexpr size_t B = block<V>;
    size_t i = 0;
    if constexpr (Stream) {
        const uintptr_t addr = reinterpret_cast<uintptr_t>(out);
        if (n * sizeof(Out) >= stream_threshold_bytes && addr % sizeof(Out) == 0) {
            const size_t head = (64 - addr % 64) % 64 / sizeof(Out);
            for (; i < head; i += B) run_partial<V>(in + i, out + i, head - i < B ? head - i : B, block_fn);
            for (i = head; i + B <= n; i += B) {
                prefetch_block<V>(in + i);
                block_fn(std::true_type{}, in + i, out + i);
            }
            V::fence();  // streamed stores are weakly ordered: complete them before returning
        }
    }
    for (; i + B <= n; i += B) {
        prefetch_block<V>(in + i);
        block_fn(std::false_type{}, in + i, out + i);
    }
    if (i < n) run_partial<V>(in + i, out + i, n - i, block_fn);
}

template <class V>
struct Kernels {
    template <class In, Format F, Overflow O>
    static void encode(const In* in, uint8_t* out, size_t n, float scale) {
        const auto vscale = V::set1f(scale);
        run_blocks<V, false>(in, out, n, [&](auto, const In* src, uint8_t* dst) {
            V::store_u8x4(dst, encode_vec<V, F, O>(V::mul(V::load(src), vscale)),
                          encode_vec<V, F, O>(V::mul(V::load(src + V::W), vscale)),
                          encode_vec<V, F, O>(V::mul(V::load(src + 2 * V::W), vscale)),
                          encode_vec<V, F, O>(V::mul(V::load(src + 3 * V::W), vscale)));
        });
    }

    template <class Out, Format F>
    static void decode(const uint8_t* in, Out* out, size_t n, float scale_inv) {
        const auto vscale = V::set1f(scale_inv);
        // 16-bit outputs are stored two registers at a time, so that every store on AVX-512 is a
        // full 64-byte line and large outputs can be streamed.
        constexpr size_t per_store = sizeof(Out) == 4 ? 1 : 2;
        constexpr bool stream = V::W * sizeof(Out) * per_store == 64;
        run_blocks<V, stream>(in, out, n, [&](auto nt, const uint8_t* src, Out* dst) {
            auto value = [&](size_t j) { return V::mul(decode_vec<V, F>(V::load_u8(src + j * V::W)), vscale); };
            for (size_t j = 0; j < 4; j += per_store) {
                // Outer condition on `stream` (known when the kernel is instantiated): a path that
                // never streams need not have store_streaming at all.
                if constexpr (stream) {
                    if constexpr (decltype(nt)::value) {
                        if constexpr (per_store == 1) {
                            V::store_streaming(dst + j * V::W, value(j));
                        } else {
                            V::store_streaming(dst + j * V::W, value(j), value(j + 1));
                        }
                        continue;
                    }
                }
                if constexpr (per_store == 1) {
                    V::store(dst + j * V::W, value(j));
                } else {
                    V::store(dst + j * V::W, value(j), value(j + 1));
                }
            }
        });
    }
};

}  // namespace
}  // namespace fp8kit::cpu
