// The GPU side of bench_model's per-op decode profile (common/op_profile.h), both paths'.
#pragma once

#include <string>

#include "common/op_profile.h"

namespace longctx::bench {

// The HBM's peak GB/s from the device's memory clock and bus width (double data rate); 0 where
// the attributes cannot be read.
double hbm_peak_gbs(int device);

// The heading line ("op profile of <what> (...)") and the table, bounds at the HBM's peak.
void print_op_profile(const OpProfile& profile, const std::string& what, int device);

}  // namespace longctx::bench
