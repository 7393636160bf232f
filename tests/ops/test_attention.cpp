// tests/ops/test_attention.cpp: causal self-attention forward/backward of the cpu backend against
// the reference backend, over batch x time x channels x heads with 1, primes and a size that
// runs on several threads, within the bounds of docs/NUMERICS.md ("Layer ops"), u = 2^-24:
//   att (float64, rounded once by both):  2u |ref| + 2^-50
//   out (the cpu sums the rounded probabilities):  u sum_t2 p |v| + 2u |out| + 2^-45 sum_t2 p |v|
//   dq, dk, dv (float32 sums of n rounded terms):  (gamma_n + u) sum |terms| + 2^-45 (same sum)
// A 0.1% error of the score scale and a dropped time step are shown to exceed them. Causality:
// changing the last position changes no earlier output. The cuda backend (the cpu backend's
// arithmetic) is held to the same bounds (CudaMatchesRefWithinTheBound; skipped, saying why,
// without a GPU).
// attention_decode (a few new positions over a key/value cache; bf16, f16, f32; grouped-query
// heads; masks) of the cpu backend's kernels (portable, AVX2) and the cuda backend against the
// reference's float64 result rounded to the dtype, within one unit in the last place of the dtype
// plus the float32 computation's bound (decode_bounds); a 0.1% error of the score scale, a
// key/value head read for the wrong query heads, an ignored mask and a dropped key are shown to
// exceed it.
#include "ops/layer_bound.hpp"

namespace fp8kit {
namespace {

using test::gamma;
using test::u32;

struct Att {
    Tensor out, att, dqkv;
};

// Forward, then backward from `saved_att` (the reference's probabilities) when given; results on
// the host.
Att run_attention(Backend b, const Tensor& qkv, const Tensor& dout, int64_t nh, const Tensor* saved_att = nullptr) {
    return test::on_backend(b, [&] {
        const int64_t bb = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3;
        const Device d = test::device_of(b);
        const Tensor x = test::moved(qkv, b), g = test::moved(dout, b);
        Att a{Tensor::empty({bb, t, c}, DType::f32, d), Tensor::empty({bb, nh, t, t}, DType::f32, d),
              Tensor::empty(qkv.shape(), DType::f32, d)};
        attention_forward(a.out, a.att, x, nh);
        attention_backward(a.dqkv, g, x, saved_att ? test::moved(*saved_att, b) : a.att, nh);
        return Att{test::host(a.out), test::host(a.att), test::host(a.dqkv)};
    });
}

struct AttBounds {
    std::vector<double> out, att, dqkv;
};

AttBounds attention_bounds(const Tensor& qkv, const Tensor& dout, int64_t nh, const Att& ref) {
    const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, hs = C / nh;
    const double scale = 1.0 / std::sqrt(double(hs));
    AttBounds bd;
    for (double a : test::values(ref.att)) bd.att.push_back(2 * u32 * std::abs(a) + 0x1p-50);
    bd.out.assign(size_t(B * T * C), 0.0);
    std::vector<double> mag(size_t(qkv.numel()), 0.0), terms(size_t(qkv.numel()), 0.0);
    auto X = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t i) { return double(qkv.get({b, t, part * C + h * hs + i})); };
    auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t i) { return size_t((b * T + t) * 3 * C + part * C + h * hs + i); };
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < nh; ++h)
            for (int64_t t1 = 0; t1 < T; ++t1) {
                std::vector<double> datt(size_t(t1 + 1));
                double dot_a = 0;
                for (int64_t t2 = 0; t2 <= t1; ++t2) {
                    const double a = ref.att.get({b, h, t1, t2});
                    double s = 0;
                    for (int64_t i = 0; i < hs; ++i) {
                        const double g = dout.get({b, t1, h * hs + i});
                        s += g * X(b, t2, 2, h, i);
                        mag[at(b, t2, 2, h, i)] += std::abs(a * g);  // dv[t2] += a g
                        terms[at(b, t2, 2, h, i)] += 1;
                        bd.out[size_t((b * T + t1) * C + h * hs + i)] += std::abs(a * X(b, t2, 2, h, i));
                    }
                    datt[size_t(t2)] = s;
                    dot_a += a * s;
                }
                for (int64_t t2 = 0; t2 <= t1; ++t2) {
                    const double ds = ref.att.get({b, h, t1, t2}) * (datt[size_t(t2)] - dot_a) * scale;
                    for (int64_t i = 0; i < hs; ++i) {
                        mag[at(b, t1, 0, h, i)] += std::abs(ds * X(b, t2, 1, h, i));  // dq[t1] += ds k[t2]
                        terms[at(b, t1, 0, h, i)] += 1;
                        mag[at(b, t2, 1, h, i)] += std::abs(ds * X(b, t1, 0, h, i));  // dk[t2] += ds q[t1]
                        terms[at(b, t2, 1, h, i)] += 1;
                    }
                }
            }
    const std::vector<double> out = test::values(ref.out);
    for (size_t i = 0; i < out.size(); ++i) bd.out[i] = (u32 + 0x1p-45) * bd.out[i] * (1 + 0x1p-20) + 2 * u32 * std::abs(out[i]);
    for (size_t i = 0; i < mag.size(); ++i) bd.dqkv.push_back((gamma(int64_t(terms[i])) + u32 + 0x1p-45) * mag[i] * (1 + 0x1p-20));
    return bd;
}

void expect_attention_within(const Att& cpu, const Att& ref, const AttBounds& bd) {
    test::expect_within("att", cpu.att, ref.att, bd.att);
    test::expect_within("out", cpu.out, ref.out, bd.out);
    test::expect_within("dqkv", cpu.dqkv, ref.dqkv, bd.dqkv);
}

TEST(AttentionOps, CpuMatchesRefWithinTheBound) {
    const int64_t shapes[][4] = {{1, 1, 1, 1}, {1, 5, 6, 2}, {2, 7, 15, 3}, {1, 17, 32, 4}, {5, 128, 64, 4}};  // B, T, C, NH; the last runs on several threads
    for (const auto& s : shapes) {
        SCOPED_TRACE(::testing::Message() << "B " << s[0] << " T " << s[1] << " C " << s[2] << " NH " << s[3]);
        const Tensor qkv = test::randn({s[0], s[1], 3 * s[2]}, 1), dout = test::randn({s[0], s[1], s[2]}, 2);
        const Att ref = run_attention(Backend::ref, qkv, dout, s[3]);
        const AttBounds bd = attention_bounds(qkv, dout, s[3], ref);
        Att first;
        test::for_thread_counts([&](int) {
            const Att cpu = run_attention(Backend::cpu, qkv, dout, s[3], &ref.att);
            expect_attention_within(cpu, ref, bd);
            if (!first.out.defined()) {
                first = cpu;
                return;
            }
            test::expect_same("out, threads", cpu.out, first.out);
            test::expect_same("dqkv, threads", cpu.dqkv, first.dqkv);
        });
    }
}

// The cuda backend on the same shapes and bounds (one warp per (batch, head, step); T = 128
// spans four 32-step chunks of the backward's loops).
TEST(AttentionOps, CudaMatchesRefWithinTheBound) {
    FP8KIT_SKIP_WITHOUT_CUDA();
    const int64_t shapes[][4] = {{1, 1, 1, 1}, {1, 5, 6, 2}, {2, 7, 15, 3}, {1, 17, 32, 4}, {5, 128, 64, 4}, {1, 40, 192, 2}};
    for (const auto& s : shapes) {
        SCOPED_TRACE(::testing::Message() << "B " << s[0] << " T " << s[1] << " C " << s[2] << " NH " << s[3]);
        const Tensor qkv = test::randn({s[0], s[1], 3 * s[2]}, 1), dout = test::randn({s[0], s[1], s[2]}, 2);
        const Att ref = run_attention(Backend::ref, qkv, dout, s[3]);
        expect_attention_within(run_attention(Backend::cuda, qkv, dout, s[3], &ref.att), ref,
                                attention_bounds(qkv, dout, s[3], ref));
    }
}

TEST(AttentionOps, PlantedErrorsExceedTheBound) {
    const int64_t nh = 2;
    const Tensor qkv = test::randn({1, 9, 3 * 8}, 1), dout = test::randn({1, 9, 8}, 2);
    const Att ref = run_attention(Backend::ref, qkv, dout, nh);
    const AttBounds bd = attention_bounds(qkv, dout, nh, ref);
    // Scores scaled by 1.001 (as a wrong 1 / sqrt(head size) would): q scaled.
    Tensor q_scaled = qkv.clone();
    for (int64_t t = 0; t < 9; ++t)
        for (int64_t i = 0; i < 8; ++i) q_scaled.set({0, t, i}, q_scaled.get({0, t, i}) * 1.001f);
    const Att scaled = run_attention(Backend::cpu, q_scaled, dout, nh);
    test::expect_caught("scale: att", scaled.att, ref.att, bd.att);
    test::expect_caught("scale: out", scaled.out, ref.out, bd.out);
    // The last time step's gradient dropped.
    Tensor dropped = dout.clone();
    for (int64_t i = 0; i < 8; ++i) dropped.set({0, 8, i}, 0.0f);
    test::expect_caught("dropped step: dqkv", run_attention(Backend::cpu, qkv, dropped, nh, &ref.att).dqkv, ref.dqkv, bd.dqkv);
}

TEST(AttentionOps, IsCausal) {
    // Changing the last position's q, k, v changes no earlier output, on either backend.
    const int64_t t = 4, c = 4;
    Tensor qkv = test::randn({1, t, 3 * c}, 1, 1.0, DType::f64);
    for (Backend b : available_backends()) {
        SCOPED_TRACE(std::string(to_string(b)));
        test::on_backend(b, [&] {
            Tensor att = Tensor::empty({1, 1, t, t}, DType::f64), out1 = Tensor::empty({1, t, c}, DType::f64);
            Tensor out2 = Tensor::empty({1, t, c}, DType::f64), changed = qkv.clone();
            attention_forward(out1, att, qkv, 1);
            for (int64_t i = 0; i < 3 * c; ++i) changed.data<double>()[(t - 1) * 3 * c + i] += 1.0;
            attention_forward(out2, att, changed, 1);
            for (int64_t i = 0; i < (t - 1) * c; ++i) EXPECT_EQ(out1.data<double>()[i], out2.data<double>()[i]);
            return 0;
        });
    }
}

// ---- attention_decode ----

struct Decode {
    int64_t b, hq, hkv, s, l, d;
};

struct DecodeIn {
    Tensor q, k, v, mask;
    double scale;
};

// q, k, v N(0, 1) in dt; mask: none (kind 0), a StaticCache's (key t attended by row s when t <
// l - 3 + s: a cache's unwritten tail, mask_b 1; kind 1) or random with row 0 of batch 0 attending
// nothing (kind 2, mask_b B).
DecodeIn decode_inputs(const Decode& c, DType dt, int kind, uint32_t seed) {
    DecodeIn in{test::randn({c.b, c.hq, c.s, c.d}, seed, 1.0, dt), test::randn({c.b, c.hkv, c.l, c.d}, seed + 1, 1.0, dt),
                test::randn({c.b, c.hkv, c.l, c.d}, seed + 2, 1.0, dt), Tensor(), 1.0 / std::sqrt(double(c.d))};
    if (kind == 0) return in;
    const int64_t mb = kind == 1 ? 1 : c.b;
    in.mask = Tensor::empty({mb, c.s, c.l}, DType::boolean);
    std::mt19937 rng(seed + 3);
    for (int64_t b = 0; b < mb; ++b)
        for (int64_t s = 0; s < c.s; ++s)
            for (int64_t t = 0; t < c.l; ++t) {
                bool on = kind == 1 ? t < c.l - 3 + s : (rng() % 3 != 0 && !(b == 0 && s == 0));
                in.mask.data<uint8_t>()[(b * c.s + s) * c.l + t] = on;
            }
    return in;
}

Tensor run_decode(Backend be, const DecodeIn& in, int64_t s_len) {
    return test::on_backend(be, [&] {
        const Device d = test::device_of(be);
        const int64_t b = in.q.size(0), hq = in.q.size(1), hd = in.q.size(3);
        Tensor out = Tensor::empty({b, s_len, hq, hd}, in.q.dtype(), d);
        attention_decode(out, test::moved(in.q, be), test::moved(in.k, be), test::moved(in.v, be), test::moved(in.mask, be), in.scale);
        return test::host(out);
    });
}

// |got - ref| <= ulp_dt(|ref| + e) + e, e = E W: W = sum_j p_j |v_j| / sum_j p_j (the row's weighted
// magnitude), E = 2 ds + (2 L + L / 32 + D + 16) u: the float32 scores' error ds = (D + 2) u max_j
// scale sum_i |q_i k_ji| moves each e^(s_j - max) by at most 2 ds relative, which moves out by
// at most twice that times W; the exp's own error (within 2 ulp, 4u relative: 8u of W), the sums
// over L keys (acc and sum, each gamma_L), their rescaling once a block and the division add the
// rest. The ref rounds the exact result to the dtype once (through float32), the backend its
// own: one ulp of the dtype between them.
std::vector<double> decode_bounds(const DecodeIn& in, const Tensor& ref) {
    const int64_t b_n = in.q.size(0), hq = in.q.size(1), n_s = in.q.size(2), d = in.q.size(3);
    const int64_t hkv = in.k.size(1), l = in.k.size(2), g = hq / hkv;
    const std::vector<double> q = test::values(in.q), k = test::values(in.k), v = test::values(in.v), r = test::values(ref);
    const int bits = in.q.dtype() == DType::bf16 ? 8 : in.q.dtype() == DType::f16 ? 11 : 24;
    const double min_ulp = in.q.dtype() == DType::bf16 ? 0x1p-133 : in.q.dtype() == DType::f16 ? 0x1p-24 : 0x1p-149;
    const auto ulp = [&](double x) { return x == 0 ? min_ulp : std::max(min_ulp, std::exp2(std::floor(std::log2(x)) - (bits - 1))); };
    std::vector<double> bound(r.size());
    for (int64_t b = 0; b < b_n; ++b)
        for (int64_t h = 0; h < hq; ++h)
            for (int64_t s = 0; s < n_s; ++s) {
                const int64_t kv = (b * hkv + h / g) * l;
                const auto on = [&](int64_t t) {
                    return !in.mask.defined() || in.mask.data<const uint8_t>()[((in.mask.size(0) == 1 ? 0 : b) * n_s + s) * l + t] != 0;
                };
                std::vector<double> sc(static_cast<size_t>(l));
                double mx = -INFINITY, mag = 0;
                for (int64_t t = 0; t < l; ++t) {
                    if (!on(t)) continue;
                    double dot = 0, abs_dot = 0;
                    for (int64_t i = 0; i < d; ++i) {
                        dot += q[size_t(((b * hq + h) * n_s + s) * d + i)] * k[size_t((kv + t) * d + i)];
                        abs_dot += std::abs(q[size_t(((b * hq + h) * n_s + s) * d + i)] * k[size_t((kv + t) * d + i)]);
                    }
                    sc[size_t(t)] = dot * in.scale;
                    mx = std::max(mx, sc[size_t(t)]);
                    mag = std::max(mag, abs_dot * in.scale);
                }
                const double e_rel = 2 * double(d + 2) * test::u32 * mag + double(2 * l + l / 32 + d + 16) * test::u32;
                for (int64_t i = 0; i < d; ++i) {
                    double num = 0, den = 0;
                    for (int64_t t = 0; t < l; ++t) {
                        if (!on(t)) continue;
                        const double p = std::exp(sc[size_t(t)] - mx);
                        num += p * std::abs(v[size_t((kv + t) * d + i)]);
                        den += p;
                    }
                    const size_t at = size_t(((b * n_s + s) * hq + h) * d + i);
                    const double e = den == 0 ? 0 : e_rel * num / den;
                    bound[at] = ulp(std::abs(r[at]) + e) + e;
                }
            }
    return bound;
}

const Decode decode_shapes[] = {
    {1, 1, 1, 1, 1, 1},     {1, 4, 2, 1, 70, 8},    {2, 6, 3, 3, 130, 20},  // two and three key blocks, D not a multiple of 8
    {1, 16, 8, 1, 545, 64}, {1, 32, 1, 2, 100, 128}, {1, 2, 1, 1, 9, 512},  // a Llama's decode step (threads), MQA (4 row chunks), D 512
};

void expect_decode_matches_ref(Backend be) {
    for (DType dt : {DType::bf16, DType::f16, DType::f32})
        for (const Decode& c : decode_shapes)
            for (int kind : {0, 1, 2}) {
                SCOPED_TRACE(::testing::Message() << to_string(dt) << " B " << c.b << " Hq " << c.hq << " Hkv " << c.hkv << " S " << c.s
                                                  << " L " << c.l << " D " << c.d << " mask " << kind);
                const DecodeIn in = decode_inputs(c, dt, kind, 11);
                const Tensor ref = run_decode(Backend::ref, in, c.s);
                const std::vector<double> bd = decode_bounds(in, ref);
                if (be != Backend::cpu) {
                    test::expect_within("out", run_decode(be, in, c.s), ref, bd);
                    continue;
                }
                test::for_each_isa([&](Isa) {  // the portable kernel and the AVX2 one (src/cpu/attention_avx2.cpp)
                    Tensor first;
                    test::for_thread_counts([&](int) {
                        const Tensor got = run_decode(be, in, c.s);
                        test::expect_within("out", got, ref, bd);
                        if (!first.defined()) first = got;
                        else test::expect_same("out, threads", got, first);
                    });
                });
            }
}

TEST(AttentionOps, DecodeCpuMatchesRefWithinTheBound) { expect_decode_matches_ref(Backend::cpu); }

TEST(AttentionOps, CudaDecodeMatchesRefWithinTheBound) {
    FP8KIT_SKIP_WITHOUT_CUDA();
    expect_decode_matches_ref(Backend::cuda);
}

TEST(AttentionOps, DecodeRowWithNoAttendedKeyIsZeroAndNaNReachesOut) {
    DecodeIn in = decode_inputs({2, 4, 2, 2, 20, 8}, DType::f32, 2, 5);  // batch 0's row 0 attends nothing
    in.k.data<float>()[(1 * 2 + 1) * 20 * 8 + 3 * 8] = NAN;               // batch 1, kv head 1, key 3
    in.mask.data<uint8_t>()[(1 * 2 + 0) * 20 + 3] = 1;                    // attended by batch 1's row 0
    for (Backend be : available_backends()) {
        SCOPED_TRACE(std::string(to_string(be)));
        const Tensor out = run_decode(be, in, 2);
        for (int64_t h = 0; h < 4; ++h)
            for (int64_t i = 0; i < 8; ++i) {
                EXPECT_EQ(out.get({0, 0, h, i}), 0.0f);
                EXPECT_EQ(std::isnan(out.get({1, 0, h, i})), h >= 2) << "head " << h;  // heads 2, 3 read kv head 1
            }
    }
}

TEST(AttentionOps, DecodePlantedErrorsExceedTheBound) {
    const Decode c{1, 4, 2, 2, 70, 16};
    for (DType dt : {DType::bf16, DType::f32}) {
        SCOPED_TRACE(std::string(to_string(dt)));
        const DecodeIn in = decode_inputs(c, dt, 2, 7);
        const Tensor ref = run_decode(Backend::ref, in, c.s);
        const std::vector<double> bd = decode_bounds(in, ref);
        test::for_each_isa([&](Isa) { test::expect_within("correct", run_decode(Backend::cpu, in, c.s), ref, bd); });
        if (dt == DType::f32) {  // the scores 0.1% off (bf16's own rounding is 0.4%)
            DecodeIn scaled = in;
            scaled.scale *= 1.001;
            test::expect_caught("scale", run_decode(Backend::cpu, scaled, c.s), ref, bd);
        }
        DecodeIn swapped = in;  // query heads 0, 1 reading kv head 1 and 2, 3 kv head 0 (h % Hkv-like)
        swapped.k = in.k.clone();
        swapped.v = in.v.clone();
        const int64_t head = c.l * c.d * int64_t(dtype_size(dt));
        for (Tensor* t : {&swapped.k, &swapped.v}) {
            auto* p = static_cast<std::byte*>(t->raw_data());
            std::swap_ranges(p, p + head, p + head);
        }
        test::expect_caught("kv heads", run_decode(Backend::cpu, swapped, c.s), ref, bd);
        DecodeIn unmasked = in;
        unmasked.mask = Tensor();
        test::expect_caught("mask ignored", run_decode(Backend::cpu, unmasked, c.s), ref, bd);
        DecodeIn dropped = in;  // each row's last attended key left out
        dropped.mask = in.mask.clone();
        for (int64_t r = 0; r < c.s; ++r)
            for (int64_t t = c.l - 1; t >= 0; --t)
                if (dropped.mask.data<uint8_t>()[r * c.l + t]) {
                    dropped.mask.data<uint8_t>()[r * c.l + t] = 0;
                    break;
                }
        test::expect_caught("dropped key", run_decode(Backend::cpu, dropped, c.s), ref, bd);
    }
}

TEST(AttentionOps, DecodeErrorsNameTheArgument) {
    const Tensor q = test::randn({1, 4, 1, 8}, 1), k = test::randn({1, 2, 5, 8}, 2);
    const Tensor out = Tensor::empty({1, 1, 4, 8}, DType::f32);
    test::expect_error([&] { attention_decode(out, test::randn({1, 4, 1, 8}, 1, 1.0, DType::f64), k, k, Tensor(), 1.0); },
                       "q is f64 [1, 4, 1, 8], expected a bf16, f16 or f32 tensor [B, Hq, S, D]");
    test::expect_error([&] { attention_decode(out, q, test::randn({1, 3, 5, 8}, 2), test::randn({1, 3, 5, 8}, 2), Tensor(), 1.0); },
                       "k has 3 heads, expected a divisor of q's 4");
    test::expect_error([&] { attention_decode(out, q, k, test::randn({1, 2, 4, 8}, 2), Tensor(), 1.0); },
                       "v is f32 [1, 2, 4, 8], expected f32 [1, 2, 5, 8]");
    test::expect_error([&] { attention_decode(out, q, k, k, Tensor::empty({1, 1, 4}, DType::boolean), 1.0); },
                       "mask is bool [1, 1, 4], expected bool [1, 1, 5]");
    test::expect_error([&] { attention_decode(Tensor::empty({1, 4, 1, 8}, DType::f32), q, k, k, Tensor(), 1.0); },
                       "out is f32 [1, 4, 1, 8], expected f32 [1, 1, 4, 8]");
    test::expect_error([&] { attention_decode(out, q, k, k, Tensor(), NAN); }, "scale is nan, expected a finite number");
}

TEST(AttentionOps, ErrorsNameTheArgument) {
    const Tensor qkv = test::randn({1, 3, 12}, 1);
    Tensor out = Tensor::empty({1, 3, 4}, DType::f32), att = Tensor::empty({1, 2, 3, 3}, DType::f32);
    test::expect_error([&] { attention_forward(out, att, qkv, 3); }, "heads is 3, expected a divisor of C = 4");
    test::expect_error([&] { attention_forward(out, att, test::randn({3, 12}, 1), 2); }, "qkv is f32 [3, 12], expected [B, T, 3C]");
    test::expect_error([&] { attention_forward(out, Tensor::empty({1, 2, 3, 2}, DType::f32), qkv, 2); }, "att is f32 [1, 2, 3, 2], expected f32 [1, 2, 3, 3]");
}

}  // namespace
}  // namespace fp8kit
