// What every kernel file includes: only the headers the kernels use (torch/extension.h, the
// whole C++ frontend, would be most of the build's time, spent parsing), and the intrinsics.
#pragma once

#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/Exceptions.h>
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Half.h>
#include <immintrin.h>
#include <cmath>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>
