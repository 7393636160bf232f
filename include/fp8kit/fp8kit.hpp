// fp8kit/fp8kit.hpp: the whole public API.
#pragma once

#include "fp8kit/config.hpp"
#include "fp8kit/convert.hpp"
#include "fp8kit/error.hpp"
#include "fp8kit/format.hpp"
#include "fp8kit/half.hpp"
#include "fp8kit/runtime.hpp"
#include "fp8kit/version.hpp"
