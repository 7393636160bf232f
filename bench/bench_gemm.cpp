// bench/bench_gemm.cpp: fp8kit's scaled FP8 GEMM side by side with OpenBLAS and oneDNN, in one
// process, on the same inputs and the same threads, against the machine's float32 FMA peak and
// read bandwidth measured in the same run. Every result is checked against float64 dot products
// of the f32 inputs (rel_err), and a result outside the bound its operand type allows
// (max_rel_err) fails the run: a fast wrong answer is not a result.
//
// D[M, N] = A[M, K] . W[N, K]^T (W a Linear weight, [out, in]), f32 output, on
//   square shapes  M = N = K in {512, 1024, 2048, 4096},
//   LLM shapes     M in {1, 8, 16, 128, 2048} x (N, K) in {(4096, 4096), (11008, 4096), (4096, 11008)}.
// Weights are prepared once per (N, K) outside the timing, as inference reuses them:
//   openblas.sgemm     cblas_sgemm(RowMajor, NoTrans, Trans) on the f32 weights as they are
//   openblas.sgemv     cblas_sgemv for M = 1
//   onednn.f32         oneDNN matmul, weights reordered into the layout it picks (format any)
//   onednn.bf16        the same with A and W converted to bf16 beforehand, f32 output
//   fp8kit.e4m3        A quantized beforehand (tensorwise e4m3fn), W a PackedWeight (tensorwise)
//   fp8kit.e4m3.rowwise, fp8kit.e4m3.block    the rowwise and block recipes (A 1x128, W 128x128
//                      scale blocks), all but --quick's (4096, 4096)
//   fp8kit.e4m3.block_pow2  the block recipe with power-of-two scales (TransformerEngine's default)
//   fp8kit.fused.f32, fp8kit.fused.bf16       A given in f32 or bf16 and quantized inside gemm()
//                      (tensorwise): what a Linear layer's forward pays
//   fp8kit.e4m3.pack   fp8kit.e4m3 with the weight packed inside every call, as OpenBLAS packs
//   read               (M <= 16) a plain read of copies of the FP8 weight's bytes: of_bound's divisor
// Columns: gflops = 2*M*N*K / seconds; vs_openblas = gflops / OpenBLAS's on the same shape;
// weight_bytes = N*K * 4 (f32), 2 (bf16) or 1 (fp8). bound / of_bound: for M <= 16 a GEMM reads
// each weight once and does little else, so it is bound by memory, and is measured out of cache,
// as in a model too large for it, by one rule for every implementation: each prepares `copies`
// copies of its weight (in its own layout) that together are 8x the last-level cache (at most
// 1 GiB), and the timed calls take them in turn, with a read of 1 GiB (the caches' flush) before
// each. Why both: the flush alone left weights that every call re-reads in the L3 of a Zen 5 (its
// replacement keeps reused lines against a one-time stream): OpenBLAS's sgemv read 64 MiB of f32
// weights at 1.3x the read peak. of_bound = weight_bytes / seconds / read_gbps, the read bandwidth
// of the same minutes and bytes: a plain read of as many copies of the FP8 weight's bytes takes
// its turns with the implementations, after the same flush (row "read"; a shared VM's memory
// bandwidth moved 1.5x between minutes, and the read peak measured at the run's start - its own
// row - made the ratios move with it); of_roofline = gflops / the lower of that bandwidth's rate
// (2M flops a weight byte) and the arithmetic's peak below (at M = 2-16 on AVX2 the FMAs bind
// first). For larger M, of_bound = gflops / the peak of what the kernel multiplies: the AMX bf16
// tile peak (TDPBF16PS, operands in tile registers) for fp8kit's amx kernels and oneDNN's AMX
// bf16, the bf16 dot-product peak (VDPBF16PS) for oneDNN's bf16 elsewhere and fp8kit's
// avx512-bf16 kernels, else the float32 FMA peak.
// The implementations of a shape take turns (best_seconds_in_turns: five rounds of a fifth of the
// budget each), so that a minute of higher memory bandwidth on a shared VM reaches all of them;
// the time is each one's fastest call. Each one's D is checked after each of its turns.
// Every implementation writes D into an output allocated once, outside the timing. Every large
// buffer - each side's weights and their copies, the flush / read-peak buffer - is a Tensor
// (fp8kit's host memory: 2 MiB-aligned, on huge pages where the OS grants them), so no side
// streams from 4 KiB pages while another has huge ones (M = 1 from 4 KiB pages: 5-15% slower).
//
// Threads: fp8kit::num_threads() for all three (OpenBLAS's OpenMP build and oneDNN's OpenMP
// runtime follow the same OpenMP setting). Inputs: deterministic, roughly N(0, 1), A and W from
// different seeds. A peer the build did not find (bench/CMakeLists.txt) is reported as skipped.
// --quick: 512 square and M = 1, 8, 12, 16 with (4096, 4096) (12: a partial row tile), short budgets (~14 s on 2 idle cores).
// Run by `bench_gemm [--json] [--quick]` and `fp8kit bench gemm`. Results: docs/PERF.md.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "fp8kit/gemm.hpp"
#include "fp8kit/recipe.hpp"
#include "fp8kit/runtime.hpp"

#if defined(FP8KIT_BENCH_OPENBLAS)
#include <cblas.h>
#endif
#if defined(FP8KIT_BENCH_DNNL)
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace fp8kit::bench {

namespace {

// Read before each memory-bound call, and the read-bandwidth measure: larger than the last-level
// cache (32 MiB per core complex on the Zen 3 and Zen 5 machines of docs/PERF.md), so both read
// from memory.
constexpr size_t flush_bytes = size_t(1) << 30;
constexpr int64_t memory_bound_m = 16;              // M <= this: bound by reading the weights
constexpr double working_set_llc = 8.0;             // weight copies of a memory-bound call: x LLC,
constexpr double working_set_max = double(flush_bytes);  // and at most this many bytes: a Xeon's L3
                                                         // of 480 MiB (a whole socket's, shared) asked
                                                         // 3.8 GB of each implementation, 24 GB in all
constexpr int turn_rounds = 5;                      // a shape's implementations take turns: rounds
constexpr int error_samples = 64;
constexpr uint32_t a_seed = 1, w_seed = 2;

// One weight [N, K] and the M it is multiplied with.
struct WeightCase {
    int64_t n, k;
    std::vector<int64_t> ms;
    bool recipes;  // also the rowwise and block recipes (what a decode step of each recipe reads)
};

std::vector<WeightCase> weight_cases(bool quick) {
    if (quick) return {{512, 512, {512}, true}, {4096, 4096, {1, 8, 12, 16}, false}};
    std::vector<WeightCase> c;
    for (int64_t s : {512, 1024, 2048, 4096}) c.push_back({s, s, {s}, true});
    const std::pair<int64_t, int64_t> llm[] = {{4096, 4096}, {11008, 4096}, {4096, 11008}};
    for (const auto& nk : llm) c.push_back({nk.first, nk.second, {1, 8, 16, 128, 2048}, true});
    return c;
}

// One entry of D and its float64 value from the f32 inputs.
struct Sample {
    int64_t i, j;
    double ref;
};

std::vector<Sample> reference_samples(const Tensor& a, const Tensor& w) {
    const int64_t m = a.size(0), n = w.size(0), k = a.size(1);
    const float* ap = a.data<float>();
    const float* wp = w.data<float>();
    std::vector<Sample> s;
    uint32_t r = 777;
    auto next = [&r](int64_t bound) {
        r = r * 1664525u + 1013904223u;
        return int64_t((r >> 8) % uint32_t(bound));
    };
    for (int t = 0; t < error_samples; ++t) {
        const int64_t i = next(m), j = next(n);
        double acc = 0.0;
        for (int64_t q = 0; q < k; ++q) acc += double(ap[i * k + q]) * double(wp[j * k + q]);
        s.push_back({i, j, acc});
    }
    return s;
}

// Relative RMS error of D [., n] on the samples.
double rel_err(const float* d, int64_t n, const std::vector<Sample>& samples) {
    double err = 0.0, ref = 0.0;
    for (const Sample& s : samples) {
        const double diff = double(d[s.i * n + s.j]) - s.ref;
        err += diff * diff;
        ref += s.ref * s.ref;
    }
    return std::sqrt(err / ref);
}

// How many copies of a weight of `weight_bytes` a call on M rows cycles through: 1 for compute-bound
// shapes, else enough for working_set_llc times the last-level cache, up to working_set_max bytes
// (with the flush's 1 GiB read before every call, a copy is read again only gigabytes later).
int weight_copies(int64_t m, double weight_bytes) {
    if (m > memory_bound_m) return 1;
    const double working_set = std::min(working_set_llc * double(last_level_cache_bytes()), working_set_max);
    return std::max(1, int(std::ceil(working_set / weight_bytes)));
}

// The largest relative RMS error against float64 a correct result has, by its operands' type
// (bytes per weight), on the 64 sampled entries (their RMS itself varies by ~9%). float32: the
// sums' rounding, at most ~sqrt(K) 2^-24 = 6e-6 at K = 11008 (measured 3e-7 - 6e-7): bound 1e-5.
// bf16 operands: each rounded to 8 significant bits, a relative error of at most 2^-8 and RMS
// about 2^-8 / sqrt 3 * 3/4 per operand, sqrt 2 of that per product: 0.0031 (measured 0.0023):
// bound 0.01. FP8 e4m3 operands: the same with 4 bits, 0.038 (measured 0.030-0.042): bound 0.06,
// which a wrong scale (~1) or an e5m2 cast in e4m3's place (3 bits: 0.077) fails.
double max_rel_err(int bytes_per_weight) { return bytes_per_weight == 4 ? 1e-5 : bytes_per_weight == 2 ? 1e-2 : 0.06; }

// The inputs of one GEMM shape: A in f32 (and bf16, the same values rounded), W in f32.
struct Problem {
    int64_t m, n, k;
    Tensor a, a_bf16;
    const Tensor& w;
    std::vector<Sample> samples;
};

class GemmBench {
public:
    explicit GemmBench(const Options& opt)
        : budget_(opt.quick ? 0.05 : 0.25), threads_(num_threads()), flush_(Tensor::empty({int64_t(flush_bytes)}, DType::u8)) {
        std::memset(flush_.raw_data(), 1, flush_bytes);
#if defined(FP8KIT_BENCH_OPENBLAS)
        openblas_set_num_threads(threads_);
#endif
        fma_ = fma_peak(threads_, budget_);
        dot_gflops_ = dot_bf16_peak(threads_, budget_);
        amx_gflops_ = amx_bf16_peak(threads_, budget_);
        read_ = read_peak(flush_.raw_data(), flush_bytes, threads_, budget_);
        const auto peak_row = [this](const char* impl) {
            return Row().add("bench", "gemm").add("impl", impl).add("threads", (long long)threads_);
        };
        machine_.push_back(peak_row("fma_peak").add("isa", fma_.isa).add("gflops", fma_.gflops, 4));
        if (dot_gflops_ > 0.0) machine_.push_back(peak_row("dot_bf16_peak").add("gflops", dot_gflops_, 4));
        if (amx_gflops_ > 0.0) machine_.push_back(peak_row("amx_bf16_peak").add("gflops", amx_gflops_, 4));
        machine_.push_back(peak_row("read_bw")
                               .add("bytes", (long long)flush_bytes)
                               .add("isa", read_.isa)
                               .add("streams", (long long)read_.streams)
                               .add("gbps", read_.gbps, 4)
                               .add("plain_gbps", read_.plain_gbps, 4));
#if !defined(FP8KIT_BENCH_OPENBLAS)
        skip("openblas", "not found when the benchmark was configured (pkg-config openblas)");
#endif
#if !defined(FP8KIT_BENCH_DNNL)
        skip("onednn", "not found when the benchmark was configured (oneapi/dnnl/dnnl.hpp, libdnnl)");
#endif
    }

    void run(const WeightCase& wc) {
        const Tensor w = normal_tensor(wc.n, wc.k, DType::f32, w_seed);
        // fp8kit's weights, quantized and packed once for every M.
        std::vector<Packed> packed;
        packed.push_back({"fp8kit.e4m3", Recipe::tensorwise(), quantize(w, Recipe::tensorwise().options(Role::weight))});
        if (wc.recipes) {
            packed.push_back({"fp8kit.e4m3.rowwise", Recipe::rowwise(), quantize(w, Recipe::rowwise().options(Role::weight))});
            packed.push_back({"fp8kit.e4m3.block", Recipe::block(), quantize(w, Recipe::block().options(Role::weight))});
            Recipe pow2 = Recipe::block();
            pow2.power_of_two = true;  // TransformerEngine's block scaling default: the cpu GEMM folds its scales
            packed.push_back({"fp8kit.e4m3.block_pow2", pow2, quantize(w, pow2.options(Role::weight))});
        }
        for (int64_t m : wc.ms) {
            Problem p{m, wc.n, wc.k, normal_tensor(m, wc.k, DType::f32, a_seed),
                      normal_tensor(m, wc.k, DType::bf16, a_seed), w, {}};
            p.samples = reference_samples(p.a, w);
            run_openblas(p);
            run_onednn(p);
            run_fp8kit(p, packed);
            time_shape(p);
        }
    }

    const std::vector<std::string>& failures() const { return failures_; }

    void print(std::ostream& os, bool json) const {
        if (json) {
            print_rows(os, machine_, true);
            print_rows(os, rows_, true);
            print_rows(os, skipped_, true);
            return;
        }
        os << "fp8kit bench gemm: D[M,N] = A[M,K] . W[N,K]^T, f32 output, " << threads_
           << " threads for every implementation.\n"
           << "float32 FMA peak: " << fma_.gflops << " GFLOP/s (" << fma_.isa << ")";
        if (dot_gflops_ > 0.0) os << "; bf16 dot-product peak (VDPBF16PS): " << dot_gflops_ << " GFLOP/s";
        if (amx_gflops_ > 0.0) os << "; AMX bf16 tile peak (TDPBF16PS): " << amx_gflops_ << " GFLOP/s";
        os << "; read bandwidth: " << read_.gbps
           << " GB/s (" << (flush_bytes >> 20) << " MiB, " << read_.isa << " loads, " << read_.streams
           << " streams per thread; one plain 64-bit sum: " << read_.plain_gbps << " GB/s); last-level cache "
           << (last_level_cache_bytes() >> 20) << " MiB.\n"
           << "gflops = 2*M*N*K / seconds; vs_openblas = gflops / OpenBLAS's; weight_bytes: 4 (f32), 2 (bf16), 1 (fp8)\n"
           << "per weight. M <= 16: out of cache (copies of each weight, 8x the last-level cache up to 1 GiB, taken in turn,\n"
           << "and the caches flushed before each call), of_bound = weight_bytes / seconds / read_gbps (a plain read of\n"
           << "copies of the FP8 weight's bytes, in turns with the implementations: row \"read\"),\n"
           << "of_roofline = gflops / the lower of the read bandwidth's rate and the peak below;\n"
           << "larger M: of_bound = gflops / the peak of the kernel's arithmetic - the AMX tiles' for AMX kernels, the\n"
           << "bf16 dot products' for onednn.bf16 and the avx512-bf16 kernels, else the f32 FMAs'. rel_err: relative RMS\n"
           << "error against float64 on 64 entries. Outputs allocated once for every implementation; fp8kit\n"
           << "packs its weight once outside the timing, except fp8kit.e4m3.pack (inside every call).\n\n";
        print_rows(os, rows_, false);
        for (const Row& r : skipped_) {
            os << "skipped: ";
            for (const auto& [k, v] : r.cells()) {
                if (k != "bench") os << k << " " << v << "  ";
            }
            os << "\n";
        }
    }

private:
    // A weight quantized with a recipe's weight options and packed once.
    struct Packed {
        const char* impl;
        Recipe recipe;
        PackedWeight w;
    };

    double budget_;
    int threads_;
    Tensor flush_;  // read before memory-bound calls; also the read-bandwidth buffer
    unsigned long long sink_ = 0;
    FmaPeak fma_{};
    double dot_gflops_ = 0.0;  // 0: no AVX512-BF16
    double amx_gflops_ = 0.0;  // 0: fp8kit's GEMM kernels are not "amx"
    ReadPeak read_{};
    std::vector<Row> machine_, rows_, skipped_;
    std::vector<std::string> failures_;  // results outside their error bound
#if defined(FP8KIT_BENCH_DNNL)
    dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
    dnnl::stream stream_{engine_};
#endif

    void skip(const std::string& impl, const std::string& why, const Problem* p = nullptr) {
        Row r;
        r.add("bench", "gemm").add("impl", impl);
        if (p != nullptr) r.add("m", (long long)p->m).add("n", (long long)p->n).add("k", (long long)p->k);
        skipped_.push_back(r.add("skipped", why));
    }

    // One implementation of the current shape: `call` (which holds what it needs: weights, copies,
    // output), and `result()`, its D ([m, n] f32) after a call.
    struct Candidate {
        std::string impl, kernel;
        int bytes_per_weight;
        std::function<void()> call;
        std::function<const float*()> result;
    };
    std::vector<Candidate> shape_;  // the current shape's, timed together by time_shape

    void add(const std::string& impl, const std::string& kernel, int bytes_per_weight, std::function<void()> call,
             std::function<const float*()> result) {
        shape_.push_back({impl, kernel, bytes_per_weight, std::move(call), std::move(result)});
    }

    // Times the shape's implementations in turns (five rounds; memory-bound shapes with the flush
    // before every call), checks each one's D after each of its turns, and records a row each.
    void time_shape(const Problem& p) {
        const bool memory_bound = p.m <= memory_bound_m;
        std::vector<std::function<void()>> calls;
        for (const Candidate& c : shape_) calls.push_back(c.call);
        // Memory-bound shapes: a plain read of copies of the FP8 weight's bytes (as many copies as
        // fp8kit's, parallel_read with the read peak's streams) takes its turns with the
        // implementations, after the same flush: the read bandwidth of the same minutes and bytes.
        const size_t fp8_bytes = size_t(p.n * p.k);
        std::vector<Tensor> read_copies;
        size_t next_read = 0;
        if (memory_bound) {
            for (int c = 0; c < weight_copies(p.m, double(fp8_bytes)); ++c) {
                read_copies.push_back(Tensor::empty({int64_t(fp8_bytes)}, DType::u8));
                std::memset(read_copies.back().raw_data(), 1, fp8_bytes);
            }
            calls.push_back([&] {
                sink_ += parallel_read(read_copies[next_read++ % read_copies.size()].raw_data(), fp8_bytes, threads_, read_.streams);
            });
        }
        std::vector<double> err(shape_.size(), 0.0);
        const std::vector<double> best = best_seconds_in_turns(
            calls, budget_, turn_rounds,
            memory_bound ? std::function<void()>([&] { sink_ += parallel_read(flush_.raw_data(), flush_bytes, threads_); })
                         : std::function<void()>(),
            [&](size_t i) {
                if (i < shape_.size()) err[i] = std::max(err[i], rel_err(shape_[i].result(), p.n, p.samples));
            });
        const double read_gbps = memory_bound ? double(fp8_bytes) / best.back() * 1e-9 : 0.0;
        if (memory_bound) {
            rows_.push_back(Row()
                                .add("bench", "gemm")
                                .add("impl", "read")
                                .add("m", (long long)p.m)
                                .add("n", (long long)p.n)
                                .add("k", (long long)p.k)
                                .add("threads", (long long)threads_)
                                .add("kernel", std::string(read_.isa) + " loads, " + std::to_string(read_.streams) + " streams")
                                .add("seconds", best.back(), 4)
                                .add("weight_bytes", (long long)fp8_bytes)
                                .add("copies", (long long)read_copies.size())
                                .add("read_gbps", read_gbps, 4));
        }
        double openblas_gflops = 0.0;  // the ratio base of this shape
        for (size_t i = 0; i < shape_.size(); ++i) {
            const Candidate& c = shape_[i];
            const double s = best[i];
            const double gflops = 2.0 * double(p.m) * double(p.n) * double(p.k) / s * 1e-9;
            const double weight_bytes = double(p.n) * double(p.k) * c.bytes_per_weight;
            if (c.impl.starts_with("openblas.")) openblas_gflops = gflops;
            Row row;
            row.add("bench", "gemm")
                .add("impl", c.impl)
                .add("m", (long long)p.m)
                .add("n", (long long)p.n)
                .add("k", (long long)p.k)
                .add("threads", (long long)threads_)
                .add("kernel", c.kernel)
                .add("seconds", s, 4)
                .add("gflops", gflops, 4);
            if (openblas_gflops > 0.0) row.add("vs_openblas", gflops / openblas_gflops, 3);
            row.add("weight_bytes", (long long)weight_bytes);
            if (memory_bound) row.add("copies", (long long)weight_copies(p.m, weight_bytes));
            // The peak of what the kernel multiplies: AMX tiles', bf16 pairs' dot products, or
            // the float32 FMAs'.
            const bool tiles = amx_gflops_ > 0.0 && c.kernel.find("amx") != std::string::npos;
            const bool dots = !tiles && dot_gflops_ > 0.0 && (c.impl == "onednn.bf16" || c.kernel.ends_with(":avx512-bf16"));
            const double peak = tiles ? amx_gflops_ : dots ? dot_gflops_ : fma_.gflops;
            if (memory_bound) {
                row.add("bound", "read_bw").add("read_gbps", read_gbps, 4).add("of_bound", weight_bytes / s * 1e-9 / read_gbps, 3);
                // The roofline: the lower of streaming the weight at the read peak and the
                // arithmetic's peak (at M = 2-16 on AVX2 the FMAs bind, not the bytes).
                const double streamed = read_gbps * 2.0 * double(p.m) * double(p.n) * double(p.k) / weight_bytes;
                const double roof = std::min(streamed, peak);
                row.add("roofline_gflops", roof, 4).add("of_roofline", gflops / roof, 3);
            } else {
                row.add("bound", tiles ? "amx_bf16" : dots ? "dot_bf16" : "fma_f32").add("of_bound", gflops / peak, 3);
            }
            row.add("rel_err", err[i], 2);
            rows_.push_back(row);
            // A result outside its error bound fails the benchmark (after it is printed): a fast
            // wrong answer is not a result.
            const double bound = max_rel_err(c.bytes_per_weight);
            if (!(err[i] <= bound)) {
                failures_.push_back(c.impl + " at " + std::to_string(p.m) + " x " + std::to_string(p.n) + " x " +
                                    std::to_string(p.k) + ": rel_err " + std::to_string(err[i]) + " > " +
                                    std::to_string(bound));
            }
        }
        shape_.clear();
    }

    // OpenBLAS: sgemm, or sgemv for M = 1 (what a BLAS user calls for one row), writing into a
    // buffer given once. The ratio base of its shape.
    void run_openblas(const Problem& p) {
#if defined(FP8KIT_BENCH_OPENBLAS)
        // The weight and its copies (memory-bound shapes), taken in turn, and D.
        struct State {
            std::vector<Tensor> copies;
            std::vector<const float*> ws;
            size_t next = 0;
            std::vector<float> d;
        };
        auto st = std::make_shared<State>();
        st->ws.push_back(p.w.data<float>());
        for (int c = 1; c < weight_copies(p.m, double(p.n) * double(p.k) * 4); ++c) {
            st->copies.push_back(p.w.clone());
            st->ws.push_back(st->copies.back().data<float>());
        }
        st->d.resize(size_t(p.m * p.n));
        const auto m = blasint(p.m), n = blasint(p.n), k = blasint(p.k);
        const float* a = p.a.data<float>();
        const int threads = threads_;
        const auto out = [st] { return st->d.data(); };
        const std::string core = openblas_get_corename();
        if (p.m == 1) {
            add("openblas.sgemv", core, 4, [st, a, n, k] {
                cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, st->ws[st->next++ % st->ws.size()], k, a, 1, 0.0f,
                            st->d.data(), 1);
            }, out);
        } else {
            add("openblas.sgemm", core, 4, [st, a, m, n, k, threads] {
                openblas_sgemm(a, st->ws[st->next++ % st->ws.size()], st->d.data(), m, n, k, threads);
            }, out);
        }
#else
        (void)p;
#endif
    }

#if defined(FP8KIT_BENCH_DNNL)
    // The linked oneDNN's version, in each row's kernel: the system's (Debian 12: 2.6.3) may be
    // older than the one torch bundles (2.15: 3.13), whose bf16 matmul is the stronger peer
    // (bench/bench_torch.py's torch.bf16 rows).
    static std::string onednn_version() {
        const dnnl_version_t* v = dnnl_version();
        return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
    }
#endif

    // oneDNN matmul: src [M, K] x weights [K, N] (W^T: W [N, K] row-major is [K, N] in format
    // "ba"), weights reordered once into the layout the primitive picks; f32, and bf16 inputs
    // (converted once, outside the timing) with f32 output.
    void run_onednn(const Problem& p) {
#if defined(FP8KIT_BENCH_DNNL)
        using dnnl::memory;
        using tag = memory::format_tag;
        using dt = memory::data_type;
        const memory::dims src_dims{p.m, p.k}, wei_dims{p.k, p.n}, dst_dims{p.m, p.n};
        for (const bool bf16_inputs : {false, true}) {
            const dt in = bf16_inputs ? dt::bf16 : dt::f32;
            try {
                const dnnl::matmul::desc desc(memory::desc(src_dims, in, tag::ab), memory::desc(wei_dims, in, tag::any),
                                              memory::desc(dst_dims, dt::f32, tag::ab));
                const dnnl::matmul::primitive_desc pd(desc, engine_);
                const dnnl::matmul prim(pd);
                // The inputs in the primitive's types: f32 as given, or bf16 (A: the same values
                // fp8kit's fused bf16 row reads; W: rounded here).
                memory src(pd.src_desc(), engine_, bf16_inputs ? p.a_bf16.raw_data() : p.a.raw_data());
                memory user_w(memory::desc(wei_dims, dt::f32, tag::ba), engine_, p.w.raw_data());
                // The weight in the primitive's layout, and its copies (memory-bound shapes).
                const int bytes = bf16_inputs ? 2 : 4;
                std::vector<memory> weis;
                std::vector<Tensor> wei_buffers;  // the weights' memory, allocated as fp8kit's
                for (int c = 0; c < weight_copies(p.m, double(p.n) * double(p.k) * bytes); ++c) {
                    wei_buffers.push_back(Tensor::empty({int64_t(pd.weights_desc().get_size())}, DType::u8));
                    memory wei(pd.weights_desc(), engine_, wei_buffers.back().raw_data());
                    if (bf16_inputs) {
                        memory w16(memory::desc(wei_dims, dt::bf16, tag::ba), engine_);
                        dnnl::reorder(user_w, w16).execute(stream_, user_w, w16);
                        dnnl::reorder(w16, wei).execute(stream_, w16, wei);
                    } else {
                        dnnl::reorder(user_w, wei).execute(stream_, user_w, wei);
                    }
                    weis.push_back(wei);
                }
                memory dst(pd.dst_desc(), engine_);
                stream_.wait();
                // The call holds the primitive, its memories (handles) and the weights' buffers.
                auto next = std::make_shared<size_t>(0);
                dnnl::stream stream = stream_;
                add(bf16_inputs ? "onednn.bf16" : "onednn.f32", onednn_version() + " " + pd.impl_info_str(), bytes,
                    [prim, src, weis, wei_buffers, dst, next, stream]() mutable {
                        const memory& wei = weis[(*next)++ % weis.size()];
                        prim.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
                        stream.wait();
                    },
                    [dst] { return static_cast<const float*>(dst.get_data_handle()); });
            } catch (const dnnl::error& e) {
                skip(bf16_inputs ? "onednn.bf16" : "onednn.f32", std::string("oneDNN: ") + e.what(), &p);
            }
        }
#else
        (void)p;
#endif
    }

    // fp8kit: A quantized beforehand with each packed recipe's input options, and the fused cast
    // from f32 and bf16 with the first (tensorwise) recipe, D written into an output given once as
    // the peers' is. These rows pack the weight once, outside the timing, as inference does;
    // fp8kit.e4m3.pack packs it inside every call (gemm on the weight's QTensor), as OpenBLAS packs
    // its operands inside every sgemm.
    void run_fp8kit(const Problem& p, const std::vector<Packed>& packed) {
        const std::string kernel = std::string(to_string(active_isa())) + ":" + std::string(gemm_kernels_name());
        const Tensor d = Tensor::empty({p.m, p.n}, DType::f32);
        const auto out = [d] { return d.data<float>(); };
        const int copies = weight_copies(p.m, double(p.n) * double(p.k));
        // The packed weight and its copies (memory-bound shapes: each packs the codes anew), taken
        // in turn by call(w) as each call's weight.
        auto record = [&](const std::string& impl, const Packed& w, std::function<void(const PackedWeight&)> call) {
            auto ws = std::make_shared<std::vector<PackedWeight>>(1, w.w);
            while (int(ws->size()) < copies) ws->emplace_back(w.w.source());
            auto next = std::make_shared<size_t>(0);
            add(impl, kernel, 1, [ws, next, call] { call((*ws)[(*next)++ % ws->size()]); }, out);
        };
        for (const Packed& w : packed) {
            const QTensor qa = quantize(p.a, w.recipe.options(Role::input));
            record(w.impl, w, [qa, d](const PackedWeight& pw) { gemm(qa, pw, {}, d); });
        }
        const Packed& first = packed.front();
        const QuantizeOptions fused = first.recipe.options(Role::input);
        const Tensor a = p.a, a_bf16 = p.a_bf16;
        record("fp8kit.fused.f32", first, [a, fused, d](const PackedWeight& pw) { gemm({a, fused}, pw, {}, d); });
        record("fp8kit.fused.bf16", first, [a_bf16, fused, d](const PackedWeight& pw) { gemm({a_bf16, fused}, pw, {}, d); });
        // Packing inside the call: the weight's QTensor and copies of its codes, taken in turn.
        const QTensor qa = quantize(p.a, fused);
        auto sources = std::make_shared<std::vector<QTensor>>(1, first.w.source());
        while (int(sources->size()) < copies) {
            QTensor q = first.w.source();
            q.data = q.data.clone();
            sources->push_back(q);
        }
        auto next = std::make_shared<size_t>(0);
        add("fp8kit.e4m3.pack", kernel, 1, [qa, sources, next, d] { gemm(qa, (*sources)[(*next)++ % sources->size()], {}, d); },
            out);
    }
};

}  // namespace

int run_gemm(const Options& opt, std::ostream& os) {
    GemmBench bench(opt);
    for (const WeightCase& wc : weight_cases(opt.quick)) bench.run(wc);
    bench.print(os, opt.json);
    for (const std::string& f : bench.failures()) std::cerr << "bench gemm: wrong result: " << f << "\n";
    return bench.failures().empty() ? 0 : 1;
}

}  // namespace fp8kit::bench
