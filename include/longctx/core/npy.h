// NumPy .npy read/write (format 1.0/2.0, little-endian, C order) for f32/f16/i32/i64/u8.
// The numerics debugging tool (`longctx forward`) and the fixture tests speak it.
#pragma once

#include <string>

#include "longctx/core/tensor.h"

namespace longctx {

Tensor read_npy(const std::string& path);                  // CPU tensor; throws Error naming path
void write_npy(const std::string& path, const Tensor& t);  // t must be on the CPU

}  // namespace longctx
