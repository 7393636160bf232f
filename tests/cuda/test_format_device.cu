// tests/cuda/test_format_device.cu (label: cuda): the scalar encode/decode of <fp8kit/format.hpp>
// in CUDA device code, against the same functions on the host. Built by nvcc with warnings as
// errors for sm_89 and sm_90a (so the header stays device-clean); on a machine without a GPU (no
// device, or no NVIDIA driver installed at all) it builds, then exits 77 (skipped) saying so. A
// driver that is there but fails (too old, cannot initialise) is a failure, not a skip.
//
// Device: decode of all 256 codes of every format, encode (both modes) and stochastic encode of
// float32 inputs covering every code, its neighbours and the midpoints between codes.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "fp8kit/format.hpp"

using namespace fp8kit;

constexpr int num_formats = 5;

__global__ void run_on_device(const float* x, int n, uint8_t* codes, float* decoded) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    for (int f = 0; f < num_formats; ++f) {
        const Format fmt = Format(f);
        if (i < 256) decoded[f * 256 + i] = decode(uint8_t(i), fmt);
        if (i < n) {
            codes[(f * 3 + 0) * n + i] = encode(x[i], fmt, Overflow::saturate);
            codes[(f * 3 + 1) * n + i] = encode(x[i], fmt, Overflow::nonsaturating);
            codes[(f * 3 + 2) * n + i] = encode_stochastic(x[i], fmt, random_bits(7, uint64_t(i)));
        }
    }
}

static bool check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    return e == cudaSuccess;
}

int main() {
    int devices = 0, driver = 0;
    const cudaError_t count = cudaGetDeviceCount(&devices);
    // No driver installed: the runtime reports an insufficient driver, and the driver version 0.
    const bool no_driver = count == cudaErrorInsufficientDriver && cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0;
    if (count == cudaErrorNoDevice || no_driver || (count == cudaSuccess && devices == 0)) {
        std::printf("skipped: no CUDA %s on this machine (built and linked for sm_89 and sm_90a)\n", no_driver ? "driver" : "device");
        return 77;
    }
    if (!check(count, "cudaGetDeviceCount")) return 1;
    std::vector<float> x;
    for (int f = 0; f < num_formats; ++f) {
        for (int c = 0; c < 256; ++c) {
            const float v = decode(uint8_t(c), Format(f)), w = decode(uint8_t(c + 1), Format(f));
            x.insert(x.end(), {v, -v, v * 1.0625f, 0.5f * (v + w), v * 3.0f});
        }
    }
    const int n = int(x.size());
    float *dx = nullptr, *ddec = nullptr;
    uint8_t* dcodes = nullptr;
    std::vector<uint8_t> codes(size_t(num_formats) * 3 * n);
    std::vector<float> decoded(num_formats * 256);
    if (!check(cudaMalloc(&dx, n * sizeof(float)), "cudaMalloc") ||
        !check(cudaMalloc(&dcodes, codes.size()), "cudaMalloc") ||
        !check(cudaMalloc(&ddec, decoded.size() * sizeof(float)), "cudaMalloc") ||
        !check(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy")) {
        return 1;
    }
    run_on_device<<<(n + 255) / 256, 256>>>(dx, n, dcodes, ddec);
    if (!check(cudaGetLastError(), "launch") || !check(cudaDeviceSynchronize(), "kernel") ||
        !check(cudaMemcpy(codes.data(), dcodes, codes.size(), cudaMemcpyDeviceToHost), "cudaMemcpy") ||
        !check(cudaMemcpy(decoded.data(), ddec, decoded.size() * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy")) {
        return 1;
    }
    long long passed = 0, failed = 0;
    for (int f = 0; f < num_formats; ++f) {
        const Format fmt = Format(f);
        for (int c = 0; c < 256; ++c) {
            const float host = decode(uint8_t(c), fmt), dev = decoded[f * 256 + c];
            const bool same = std::memcmp(&host, &dev, 4) == 0 || (host != host && dev != dev);
            same ? ++passed : ++failed;
        }
        for (int i = 0; i < n; ++i) {
            const uint8_t want[3] = {encode(x[i], fmt, Overflow::saturate), encode(x[i], fmt, Overflow::nonsaturating),
                                     encode_stochastic(x[i], fmt, random_bits(7, uint64_t(i)))};
            for (int m = 0; m < 3; ++m) {
                if (codes[size_t(f * 3 + m) * n + i] == want[m]) {
                    ++passed;
                } else if (++failed <= 10) {
                    std::fprintf(stderr, "MISMATCH %s mode %d x=%a device 0x%02x host 0x%02x\n", format_info(fmt).name, m,
                                 double(x[i]), codes[size_t(f * 3 + m) * n + i], want[m]);
                }
            }
        }
    }
    cudaFree(dx);
    cudaFree(dcodes);
    cudaFree(ddec);
    std::printf("%lld passed, %lld failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
