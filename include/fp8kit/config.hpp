// fp8kit/config.hpp: portability macros shared by every public header.
//
// FP8KIT_HD marks functions that are usable from host and CUDA device code. Under a non-CUDA
// compiler it expands to nothing, so these headers stay plain C++20.
#pragma once

#if defined(__CUDACC__)
#define FP8KIT_HD __host__ __device__
#else
#define FP8KIT_HD
#endif
