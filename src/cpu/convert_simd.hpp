// src/cpu/convert_simd.hpp: the FP8 encode/decode algorithm for SIMD registers, written once
// over an ISA's operation set V (see convert_avx2.cpp, convert_avx512.cpp).
//
// Checked against: the scalar encode()/decode() of <fp8kit/format.hpp>, over all 2^32 float32
// inputs for e4m3fn and e5m2 in both overflow modes (tests/ops/test_convert_exhaustive.cpp),
// and the golden vectors for every format (tests/golden).
//
// Included only by the ISA translation units, each compiled with its own -m flags. Everything
// here has internal linkage (anonymous namespace), and the kernels call nothing but intrinsics
// and each other: no inline function compiled for AVX-512 can be chosen by the linker for a
// caller on another path. Tails go through a zero-padded stack block, not scalar code.
// Passes: one read of the input, one write of the output (see stream_threshold_bytes).
//
// Kernels work on runs split into scaling groups (src/cpu/quantize.cpp drives them): element k of
// a run belongs to group (offset + k) / group and is multiplied by that group's scale; group 1
// means one scale per element. Encodes can also return max |x| of what they read, so that a cast
// with a known scale measures amax in the same pass.
//
// The algorithm is the scalar one, lane-parallel, on float32 bits:
//  - normal results: round-to-nearest-even by integer add of (half-1 + kept LSB), shift, rebias;
//  - subnormal results: |x| * 2^(bias-1+man) is exact and the code is that value rounded to an
//    integer, done by the float->int conversion with an explicit round-to-nearest-even
//    immediate, so neither depends on MXCSR. (With denormals-are-zero set by the caller, a
//    float32 subnormal input reads as 0, which is its correct FP8 code anyway.)
//  - then the overflow rule, NaN, and the sign, exactly as detail::finish_code.
#pragma once

#include <algorithm>
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

// The W x W bytes at src (row stride ls) into dst (row stride ld) transposed, W = 8 or 16: SSE2
// unpacks in rounds of bytes, then 16-, 32- (and 64-) bit pairs, each round pairing the registers
// whose rows are next to each other: after round b, a lane of 2^b bytes holds 2^b rows at one column.
template <size_t W>
inline void transpose_bytes(const uint8_t* src, size_t ls, uint8_t* dst, size_t ld) {
    const auto at = [](const uint8_t* p) { return reinterpret_cast<const __m128i*>(p); };
    const auto to = [](uint8_t* p) { return reinterpret_cast<__m128i*>(p); };
    if constexpr (W == 8) {
        __m128i r[8], t[4], u[4];
        for (size_t i = 0; i < 8; ++i) r[i] = _mm_loadl_epi64(at(src + i * ls));
        for (int k = 0; k < 4; ++k) t[k] = _mm_unpacklo_epi8(r[2 * k], r[2 * k + 1]);  // rows 2k, 2k + 1; columns 0-7
        for (int m = 0; m < 2; ++m) {  // rows 4m to 4m + 3: columns 0-3, 4-7
            u[2 * m] = _mm_unpacklo_epi16(t[2 * m], t[2 * m + 1]);
            u[2 * m + 1] = _mm_unpackhi_epi16(t[2 * m], t[2 * m + 1]);
        }
        for (int c = 0; c < 2; ++c) {  // rows 0-7: columns 4c, 4c + 1 (lo) and 4c + 2, 4c + 3 (hi)
            const __m128i lo = _mm_unpacklo_epi32(u[c], u[2 + c]), hi = _mm_unpackhi_epi32(u[c], u[2 + c]);
            _mm_storel_epi64(to(dst + size_t(4 * c) * ld), lo);
            _mm_storel_epi64(to(dst + size_t(4 * c + 1) * ld), _mm_srli_si128(lo, 8));
            _mm_storel_epi64(to(dst + size_t(4 * c + 2) * ld), hi);
            _mm_storel_epi64(to(dst + size_t(4 * c + 3) * ld), _mm_srli_si128(hi, 8));
        }
    } else {
        static_assert(W == 16);
        __m128i r[16], t[16];
        for (size_t i = 0; i < 16; ++i) r[i] = _mm_loadu_si128(at(src + i * ls));
        for (int k = 0; k < 8; ++k) {  // rows 2k, 2k + 1: columns 0-7 (t[2k]), 8-15 (t[2k + 1])
            t[2 * k] = _mm_unpacklo_epi8(r[2 * k], r[2 * k + 1]);
            t[2 * k + 1] = _mm_unpackhi_epi8(r[2 * k], r[2 * k + 1]);
        }
        for (int m = 0; m < 4; ++m) {  // rows 4m to 4m + 3: r[4m + c] columns 4c to 4c + 3
            for (int h = 0; h < 2; ++h) {
                r[4 * m + 2 * h] = _mm_unpacklo_epi16(t[4 * m + h], t[4 * m + 2 + h]);
                r[4 * m + 2 * h + 1] = _mm_unpackhi_epi16(t[4 * m + h], t[4 * m + 2 + h]);
            }
        }
        for (int h = 0; h < 2; ++h) {  // rows 8h to 8h + 7: t[8h + e] columns 2e, 2e + 1
            for (int c = 0; c < 4; ++c) {
                t[8 * h + 2 * c] = _mm_unpacklo_epi32(r[8 * h + c], r[8 * h + 4 + c]);
                t[8 * h + 2 * c + 1] = _mm_unpackhi_epi32(r[8 * h + c], r[8 * h + 4 + c]);
            }
        }
        for (size_t e = 0; e < 8; ++e) {  // all 16 rows: columns 2e, 2e + 1
            _mm_storeu_si128(to(dst + 2 * e * ld), _mm_unpacklo_epi64(t[e], t[8 + e]));
            _mm_storeu_si128(to(dst + (2 * e + 1) * ld), _mm_unpackhi_epi64(t[e], t[8 + e]));
        }
    }
}

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

// Helpers with internal linkage: an ISA translation unit calls nothing it did not compile itself.
constexpr size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

// Calls fn(begin, len, g) for the chunks of [0, n) that lie in one scaling group each: element k
// is in group (offset + k) / group, and g counts groups from the one element 0 is in.
template <class Fn>
inline void for_each_group(size_t n, size_t group, size_t offset, Fn&& fn) {
    size_t len = min_size(n, group - offset % group);
    for (size_t begin = 0, g = 0; begin < n; begin += len, ++g, len = min_size(n - begin, group)) fn(begin, len, g);
}

// One register from `count` (< W) elements through a zero-padded buffer, so that nothing past the
// end of the caller's buffer is read; zeros are neutral for amax and encode to a discarded code.
template <class V, class T>
inline auto load_partial(const T* p, size_t count) {
    alignas(64) T buf[V::W] = {};
    std::memcpy(buf, p, count * sizeof(T));
    return V::load(buf);
}

template <class V>
inline typename V::I abs_bits(typename V::F x) {
    return V::and_(V::as_i(x), V::set1(abs_mask));
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

// Encodes `len` elements that share one scale; with Amax, also folds max |x| (as float32 bits:
// the integer order of |x| bits is the order of the values, and every NaN is above Inf) into acc.
template <class V, class In, Format F, Overflow O, bool Amax>
inline void encode_run(const In* in, uint8_t* out, size_t len, typename V::F vscale, typename V::I& acc) {
    constexpr size_t W = V::W;
    const auto code = [&](typename V::F x) {
        if constexpr (Amax) acc = V::max_u(acc, abs_bits<V>(x));
        return encode_vec<V, F, O>(V::mul(x, vscale));
    };
    size_t i = 0;
    for (; i + 4 * W <= len; i += 4 * W) {
        prefetch_block<V>(in + i);
        const auto x0 = V::load(in + i), x1 = V::load(in + i + W), x2 = V::load(in + i + 2 * W),
                   x3 = V::load(in + i + 3 * W);
        V::store_u8x4(out + i, code(x0), code(x1), code(x2), code(x3));
    }
    for (; i + W <= len; i += W) V::store_u8(out + i, code(V::load(in + i)));
    if (i < len) {
        alignas(64) uint8_t codes[W];
        V::store_u8(codes, code(load_partial<V>(in + i, len - i)));
        std::memcpy(out + i, codes, len - i);
    }
}

// Encodes n elements, element k multiplied by scales[k] (scaling groups of one element: columns).
template <class V, class In, Format F, Overflow O, bool Amax>
inline void encode_each(const In* in, uint8_t* out, size_t n, const float* scales, typename V::I& acc) {
    constexpr size_t W = V::W;
    const auto code = [&](typename V::F x, typename V::F s) {
        if constexpr (Amax) acc = V::max_u(acc, abs_bits<V>(x));
        return encode_vec<V, F, O>(V::mul(x, s));
    };
    size_t i = 0;
    for (; i + W <= n; i += W) V::store_u8(out + i, code(V::load(in + i), V::load(scales + i)));
    if (i < n) {
        alignas(64) uint8_t codes[W];
        V::store_u8(codes, code(load_partial<V>(in + i, n - i), load_partial<V>(scales + i, n - i)));
        std::memcpy(out + i, codes, n - i);
    }
}

// max |x| bits of `len` elements folded into acc (four independent maxima per block).
template <class V, class In>
inline void amax_run(const In* in, size_t len, typename V::I& acc) {
    constexpr size_t W = V::W;
    size_t i = 0;
    for (; i + 4 * W <= len; i += 4 * W) {
        prefetch_block<V>(in + i);
        const auto m01 = V::max_u(abs_bits<V>(V::load(in + i)), abs_bits<V>(V::load(in + i + W)));
        const auto m23 = V::max_u(abs_bits<V>(V::load(in + i + 2 * W)), abs_bits<V>(V::load(in + i + 3 * W)));
        acc = V::max_u(acc, V::max_u(m01, m23));
    }
    for (; i + W <= len; i += W) acc = V::max_u(acc, abs_bits<V>(V::load(in + i)));
    if (i < len) acc = V::max_u(acc, abs_bits<V>(load_partial<V>(in + i, len - i)));
}

template <class V>
struct Kernels {
    template <class In, Format F, Overflow O, bool Amax>
    static void encode_groups(const In* in, uint8_t* out, size_t n, size_t group, size_t offset,
                              const float* scales, uint32_t* amax) {
        auto acc = V::set1(0u);
        if (group == 1) {
            encode_each<V, In, F, O, Amax>(in, out, n, scales, acc);
        } else {
            for_each_group(n, group, offset, [&](size_t begin, size_t len, size_t g) {
                encode_run<V, In, F, O, Amax>(in + begin, out + begin, len, V::set1f(scales[g]), acc);
            });
        }
        if constexpr (Amax) {
            const uint32_t m = V::hmax(acc);
            if (m > *amax) *amax = m;
        }
    }

    template <class In, Format F, Overflow O>
    static void encode(const In* in, uint8_t* out, size_t n, size_t group, size_t offset, const float* scales,
                       uint32_t* amax) {
        if (amax != nullptr) {
            encode_groups<In, F, O, true>(in, out, n, group, offset, scales, amax);
        } else {
            encode_groups<In, F, O, false>(in, out, n, group, offset, scales, amax);
        }
    }

    template <class In>
    static void amax(const In* in, size_t n, size_t group, size_t offset, uint32_t* acc) {
        constexpr size_t W = V::W;
        if (group == 1) {  // one group per element: elementwise maxima (column scaling)
            size_t i = 0;
            for (; i + W <= n; i += W) V::store_i(acc + i, V::max_u(V::load_i(acc + i), abs_bits<V>(V::load(in + i))));
            if (i < n) {
                alignas(64) uint32_t a[W] = {};
                std::memcpy(a, acc + i, (n - i) * sizeof(uint32_t));
                V::store_i(a, V::max_u(V::load_i(a), abs_bits<V>(load_partial<V>(in + i, n - i))));
                std::memcpy(acc + i, a, (n - i) * sizeof(uint32_t));
            }
            return;
        }
        size_t i = 0, g0 = 0;
        if (group % W == 0 && group <= 4 * W && offset % group == 0) {
            // Short groups (mx32, 1x16 and 1x32 blocks): up to W whole groups at a time, their
            // maxima reduced together (V::hmax_lanes), where one horizontal max a group cost as
            // much as reading its 1-4 registers.
            for (size_t count; (count = min_size(W, (n - i) / group)) > 0; i += count * group, g0 += count) {
                typename V::I r[W];
                for (size_t q = 0; q < W; ++q) {
                    r[q] = V::set1(0u);
                    if (q >= count) continue;
                    const In* p = in + i + q * group;
                    if (q * group % block<V> == 0) prefetch_block<V>(p);
                    for (size_t v = 0; v < group; v += W) r[q] = V::max_u(r[q], abs_bits<V>(V::load(p + v)));
                }
                alignas(64) uint32_t m[W];
                V::store_i(m, V::hmax_lanes(r));
                for (size_t q = 0; q < count; ++q) acc[g0 + q] = m[q] > acc[g0 + q] ? m[q] : acc[g0 + q];
            }
        }
        for_each_group(n - i, group, offset, [&](size_t begin, size_t len, size_t g) {
            auto r = V::set1(0u);
            amax_run<V>(in + i + begin, len, r);
            const uint32_t m = V::hmax(r);
            if (m > acc[g0 + g]) acc[g0 + g] = m;
        });
    }

    // mx_scale_code on the amax bits a (|x|, NaN above Inf): 0xff for Inf and NaN; else the biased
    // exponent of a less emax (plus one, rounding up, where a's significand is above max / 2^emax),
    // clamped to [0, 254] - a zero or subnormal a, whose exponent field is 0, clamps to 0 as the
    // scalar rule's exponent below -127 does (emax >= 7). Its multiplier 2^(127 - code) by the bits.
    static void mx_scales(const uint32_t* amax, size_t n, Format f, MxRounding r, uint8_t* codes, float* mult) {
        constexpr size_t W = V::W;
        const int emax = mx_emax(f);
        const uint32_t above = r == MxRounding::up
                                   ? detail::f32_bits(format_info(f).max / detail::f32_from_bits(uint32_t(127 + emax) << 23)) & 0x7fffffu
                                   : 0x7fffffu;  // no significand is above it
        const auto run = [&](const uint32_t* in, uint8_t* c, float* m) {
            using I = typename V::I;
            const I a = V::and_(V::load_i(in), V::set1(abs_mask));
            const I up = V::select(V::gt(V::and_(a, V::set1(0x7fffffu)), V::set1(above)), V::set1(1u), V::set1(0u));
            I e = V::add(V::sub(V::template srli<23>(a), V::set1(uint32_t(emax))), up);
            e = V::min_u(V::select(V::lt(e, V::set1(0u)), V::set1(0u), e), V::set1(254u));
            const I code = V::select(V::gt(a, V::set1(inf_bits - 1u)), V::set1(0xffu), e);
            I bits = V::template slli<23>(V::sub(V::set1(254u), code));
            bits = V::select(V::eq(code, V::set1(0xfeu)), V::set1(0x00400000u), bits);  // 2^-127
            bits = V::select(V::eq(code, V::set1(0xffu)), V::set1(detail::f32_bits(1.0f)), bits);
            V::store_u8(c, code);
            V::store(m, V::as_f(bits));
        };
        size_t k = 0;
        for (; k + W <= n; k += W) run(amax + k, codes + k, mult + k);
        if (k < n) {
            alignas(64) uint32_t in[W] = {};
            alignas(64) uint8_t c[W];
            alignas(64) float m[W];
            std::memcpy(in, amax + k, (n - k) * sizeof(uint32_t));
            run(in, c, m);
            std::memcpy(codes + k, c, n - k);
            std::memcpy(mult + k, m, (n - k) * sizeof(float));
        }
    }

    template <class Out, Format F>
    static void decode(const uint8_t* in, Out* out, size_t n, size_t group, size_t offset, const float* scale_inv) {
        if (group == 1) {
            decode_each<Out, F>(in, out, n, scale_inv);
            return;
        }
        for_each_group(n, group, offset, [&](size_t begin, size_t len, size_t g) {
            decode_run<Out, F>(in + begin, out + begin, len, V::set1f(scale_inv[g]));
        });
    }

    // Copies a staged rows x cols code tile (row stride `stride`) to dst. With `stream`, whole
    // aligned 64-byte lines are written with non-temporal stores: each is written once,
    // completely, so reading it first (what an ordinary store does) would only add traffic - but
    // it leaves the cache, where a GEMM reading a copy that fits would find it (cast_stream_bytes).
    static void flush_tile(const uint8_t* stage, size_t stride, uint8_t* dst, size_t ld, size_t rows, size_t cols,
                           bool stream) {
        const bool lines = stream && cols % 64 == 0 && ld % 64 == 0 && reinterpret_cast<uintptr_t>(dst) % 64 == 0;
        for (size_t k = 0; k < rows; ++k) {
            if (lines) {
                for (size_t c = 0; c < cols; c += 64) V::stream_line(dst + k * ld + c, stage + k * stride + c);
            } else {  // 64 bytes a copy inlined (a call to memcpy per row of 64 took a quarter of the time)
                size_t c = 0;
                for (; c + 64 <= cols; c += 64) std::memcpy(dst + k * ld + c, stage + k * stride + c, 64);
                if (c < cols) std::memcpy(dst + k * ld + c, stage + k * stride + c, cols - c);
            }
        }
        if (lines) V::fence();
    }

    // A tile of codes just cast, rows (at most cast_tile_rows) x cols at `stage` (row stride
    // `stride`), copied to out (row stride ld_out) and transposed into out_t (row stride ld_t),
    // either null: cast_transpose's two copies. W x W blocks are transposed in registers
    // (transpose_bytes) into a stage of 64 columns - 64 rows of the transposed copy, each `rows`
    // long - written out a row at a time (flush_tile: straight, the rows ld_t apart map to few L1
    // sets and evict each other's partial lines); edges byte by byte.
    static void store_codes(const uint8_t* stage, size_t stride, size_t rows, size_t cols, uint8_t* out, size_t ld_out,
                            uint8_t* out_t, size_t ld_t, bool stream) {
        if (out != nullptr) flush_tile(stage, stride, out, ld_out, rows, cols, stream);
        if (out_t == nullptr) return;
        constexpr size_t W = V::W, B = 64;
        static_assert(cast_tile_rows <= B);
        alignas(64) uint8_t stage_t[B * B];
        const size_t ra = rows - rows % W;
        for (size_t j0 = 0; j0 < cols; j0 += B) {
            const size_t w = std::min(B, cols - j0), wa = w - w % W;
            for (size_t bj = 0; bj < wa; bj += W) {
                for (size_t bi = 0; bi < ra; bi += W) transpose_bytes<W>(stage + bi * stride + j0 + bj, stride, stage_t + bj * B + bi, B);
                for (size_t j = bj; j < bj + W; ++j) {
                    for (size_t i = ra; i < rows; ++i) stage_t[j * B + i] = stage[i * stride + j0 + j];
                }
            }
            for (size_t j = wa; j < w; ++j) {
                for (size_t i = 0; i < rows; ++i) stage_t[j * B + i] = stage[i * stride + j0 + j];
            }
            flush_tile(stage_t, B, out_t + j0 * ld_t, ld_t, w, rows, stream);
        }
    }

    // 16-bit outputs are stored two registers at a time, so that every store on AVX-512 is a
    // full 64-byte line and large outputs can be streamed.
    template <class Out>
    static void store_pair(Out* p, typename V::F a, typename V::F b) {
        if constexpr (sizeof(Out) == 4) {
            V::store(p, a);
            V::store(p + V::W, b);
        } else {
            V::store(p, a, b);
        }
    }

    template <class Out, Format F>
    static void decode_run(const uint8_t* in, Out* out, size_t n, typename V::F vscale) {
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

    // Element k multiplied by scale_inv[k], two registers at a time; the tail through padded buffers.
    template <class Out, Format F>
    static void decode_each(const uint8_t* in, Out* out, size_t n, const float* scale_inv) {
        constexpr size_t W = V::W;
        const auto pair = [](const uint8_t* c, const float* s, Out* o) {
            store_pair(o, V::mul(decode_vec<V, F>(V::load_u8(c)), V::load(s)),
                       V::mul(decode_vec<V, F>(V::load_u8(c + W)), V::load(s + W)));
        };
        size_t i = 0;
        for (; i + 2 * W <= n; i += 2 * W) pair(in + i, scale_inv + i, out + i);
        if (i < n) {
            alignas(64) uint8_t c[2 * W] = {};
            alignas(64) float s[2 * W] = {};
            alignas(64) Out o[2 * W];
            std::memcpy(c, in + i, n - i);
            std::memcpy(s, scale_inv + i, (n - i) * sizeof(float));
            pair(c, s, o);
            std::memcpy(out + i, o, (n - i) * sizeof(Out));
        }
    }
};

}  // namespace
}  // namespace fp8kit::cpu
