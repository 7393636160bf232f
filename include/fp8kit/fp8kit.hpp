// fp8kit/fp8kit.hpp: the whole public API.
#pragma once

#include "fp8kit/backend.hpp"
#include "fp8kit/config.hpp"
#include "fp8kit/convert.hpp"
#include "fp8kit/dtype.hpp"
#include "fp8kit/error.hpp"
#include "fp8kit/format.hpp"
#include "fp8kit/gemm.hpp"
#include "fp8kit/half.hpp"
#include "fp8kit/nn.hpp"
#include "fp8kit/quantize.hpp"
#include "fp8kit/recipe.hpp"
#include "fp8kit/runtime.hpp"
#include "fp8kit/safetensors.hpp"
#include "fp8kit/scaling.hpp"
#include "fp8kit/tensor.hpp"
#include "fp8kit/version.hpp"
