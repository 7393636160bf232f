// bench/bench_quantize.cpp: quantize and cast_transpose (scales + cast) speed, side by side with
// memcpy of the same input bytes.
//
// For f32 and bf16 input, each scaling granularity (tensor with current scaling, tensor with a
// given scale = delayed scaling, row, column, block 1x128, block 128x128, mx32) and cast_transpose
// (tensor, row, block 128x128, block 1x128, mx32: the training recipes' casts), 1 thread and all
// threads, in cache and out of cache: GB/s of input read (elements * input bytes / seconds), the
// ratio to memcpy copying the same input bytes in the same run with the same threads (vs_memcpy:
// 1.0 means the cast takes as long as copying its input once; a cast reads as much but writes 1/4
// or 1/2 as much), and the target of the issue for that operation. Codes are e4m3fn, saturating
// (the defaults of QuantizeOptions).
//
// Each case quantizes into the same QTensor call after call (quantize(x, opts, out)), as a training
// loop does, so the cast is timed and not the allocator. alloc_share says what a call that
// allocates fresh outputs (quantize(x, opts)) would add out of cache, where outputs are tens of
// MiB that the allocator maps anew each time: allocating the same outputs and touching one byte
// per 4 KiB page (measured separately, same threads), over the call's time.
//
// Inputs: 256 MiB out of cache (f32 8192 x 8192, bf16 8192 x 16384: one call split over the
// threads, as the library does), 256 KiB per thread in cache (f32 128*T x 512, bf16 128*T x 1024
// for T = all threads; calls repeated back to back). Values are deterministic and roughly N(0, 1).
// --quick: all threads only and a shorter timing budget (~15 s on 2 idle cores).
// Run by `bench_quantize [--json] [--quick]` and `fp8kit bench quantize`. Results: docs/PERF.md.
#include <algorithm>
#include <cstdint>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"
#include "fp8kit/quantize.hpp"
#include "fp8kit/runtime.hpp"
#include "fp8kit/tensor.hpp"

namespace fp8kit::bench {

namespace {

constexpr int64_t out_of_cache_rows = 8192;                    // x 8192 f32, x 16384 bf16: 256 MiB
constexpr size_t out_of_cache_bytes = size_t(256) << 20;
constexpr size_t in_cache_bytes_per_thread = size_t(256) << 10;  // of input; L2 is 2 MiB per core
constexpr float delayed_scale = 64.0f;  // a given scale: 448 / 64 = 7 > the largest |x| here
constexpr uint32_t input_seed = 12345;

struct Case {
    const char* op;      // "quantize" or "cast_transpose"
    Scaling scaling;
    bool delayed;        // tensor scaling with a given scale
    double target;       // vs_memcpy the issue asks for (0: none)
};

const Case cases[] = {
    {"quantize", Scaling::tensor(), false, 0.45},
    {"quantize", Scaling::tensor(), true, 0.0},
    {"quantize", Scaling::row(), false, 0.8},
    {"quantize", Scaling::column(), false, 0.0},
    {"quantize", Scaling::block(1, 128), false, 0.8},
    {"quantize", Scaling::block(128, 128), false, 0.8},
    {"quantize", Scaling::mx32(), false, 0.8},
    {"cast_transpose", Scaling::tensor(), false, 0.6},
    {"cast_transpose", Scaling::row(), false, 0.6},
    {"cast_transpose", Scaling::block(128, 128), false, 0.6},
    {"cast_transpose", Scaling::block(1, 128), false, 0.6},
    {"cast_transpose", Scaling::mx32(), false, 0.6},
};

std::string scaling_name(const Case& c) { return to_string(c.scaling) + (c.delayed ? "+scale" : ""); }

QuantizeOptions options(const Case& c) {
    QuantizeOptions o;
    o.scaling = c.scaling;
    if (c.delayed) o.scale = Tensor::full({1}, delayed_scale);
    o.transpose = std::string(c.op) == "cast_transpose";
    return o;
}

// Bytes of every output quantize allocates for this case and input.
std::vector<size_t> output_sizes(const Case& c, const Tensor& x) {
    const int64_t rows = x.size(0), cols = x.size(1);
    const bool mx = c.scaling.granularity == Granularity::mx32;
    auto scales = [&](int64_t r, int64_t k) {
        const GroupShape s = c.scaling.scale_shape(r, k);
        return size_t(s.rows * s.cols) * (mx ? 1 : 4);
    };
    std::vector<size_t> sizes = {size_t(rows * cols), scales(rows, cols)};
    if (options(c).transpose) {
        sizes.push_back(size_t(rows * cols));
        sizes.push_back(scales(cols, rows));
    }
    return sizes;
}

}  // namespace

int run_quantize(const Options& opt, std::ostream& os) {
    const int all_threads = int(std::max(1u, std::thread::hardware_concurrency()));
    std::vector<int> thread_counts = {all_threads};
    if (all_threads > 1 && !opt.quick) thread_counts.insert(thread_counts.begin(), 1);
    const int restore_threads = num_threads();
    const double budget = opt.quick ? 0.05 : 0.3;
    const std::string isa(to_string(active_isa()));

    // Per dtype: the out-of-cache and in-cache inputs, and a memcpy destination as large as the
    // largest input (touched once, so the copy pays no page faults).
    const int64_t small_rows = 128 * int64_t(all_threads);
    struct Inputs {
        DType dtype;
        Tensor big, small;
    };
    std::vector<Inputs> inputs;
    for (DType d : {DType::f32, DType::bf16}) {
        const int64_t per_row = d == DType::f32 ? 4 : 2;
        const int64_t big_cols = int64_t(out_of_cache_bytes) / out_of_cache_rows / per_row;
        const int64_t small_cols = int64_t(in_cache_bytes_per_thread) / 128 / per_row;
        inputs.push_back({d, normal_tensor(out_of_cache_rows, big_cols, d, input_seed),
                          normal_tensor(small_rows, small_cols, d, input_seed)});
    }
    // A Tensor, as fp8kit's outputs are: the same kind of pages (huge where the OS grants them).
    const Tensor copy_dst = Tensor::full({int64_t(out_of_cache_bytes)}, 1.0f, DType::u8);

    std::vector<Row> rows;
    for (bool in_cache : {false, true}) {
        for (const Inputs& in : inputs) {
            const Tensor& x = in_cache ? in.small : in.big;
            const size_t bytes = x.nbytes();
            const double elems = double(x.numel());
            // In cache a call takes tens of microseconds: time 16 back to back.
            const int inner = in_cache ? 16 : 1;
            for (const Case& c : cases) {
                const QuantizeOptions o = options(c);
                for (int threads : thread_counts) {
                    set_num_threads(threads);
                    // Seconds per call, timing `inner` calls back to back.
                    auto per_call = [&](auto&& call) {
                        return best_seconds([&] { for (int r = 0; r < inner; ++r) call(); }, budget) / inner;
                    };
                    const double copy_s =
                        per_call([&] { parallel_memcpy(copy_dst.raw_data(), x.raw_data(), bytes, threads); });
                    QTensor out;
                    const double s = per_call([&] { quantize(x, o, out); });
                    const double gbps = double(bytes) / s * 1e-9, copy_gbps = double(bytes) / copy_s * 1e-9;
                    Row row;
                    row.add("bench", "quantize")
                        .add("dtype", std::string(to_string(in.dtype)))
                        .add("op", c.op)
                        .add("scaling", scaling_name(c))
                        .add("cache", in_cache ? "in" : "out")
                        .add("threads", (long long)threads)
                        .add("isa", isa)
                        .add("shape", std::to_string(x.size(0)) + "x" + std::to_string(x.size(1)))
                        .add("bytes", (long long)bytes)
                        .add("seconds", s, 5)
                        .add("gbps", gbps, 4)
                        .add("gelem_s", elems / s * 1e-9, 4)
                        .add("memcpy_gbps", copy_gbps, 4)
                        .add("vs_memcpy", gbps / copy_gbps, 3);
                    if (c.target > 0) {  // no target: neither key
                        row.add("target", c.target, 3).add("met", gbps / copy_gbps >= c.target ? "yes" : "no");
                    }
                    if (!in_cache) {
                        const std::vector<size_t> sizes = output_sizes(c, x);
                        const double alloc_s = best_seconds([&] { alloc_and_touch(sizes, threads); }, budget);
                        row.add("alloc_share", alloc_s / s, 3);
                    }
                    rows.push_back(row);
                }
            }
        }
    }
    set_num_threads(restore_threads);
    if (!opt.json) {
        os << "fp8kit bench quantize: gbps = input bytes read per second; memcpy copies the same input bytes\n"
           << "with the same threads; vs_memcpy = gbps / memcpy_gbps; target = the vs_memcpy asked for.\n"
           << "Calls reuse their outputs; alloc_share = what fresh outputs would add (allocating them and\n"
           << "touching each 4 KiB page, over the call's time; out of cache). e4m3fn, saturating;\n"
           << "'+scale' = a given (delayed) scale.\n\n";
    }
    print_rows(os, rows, opt.json);
    return 0;
}

}  // namespace fp8kit::bench
