// Carving of caller-owned workspaces, shared by the kernels' plans and their callers: every array
// a plan places in a workspace starts at a multiple of 256 bytes (cudaMalloc's alignment), so any
// element type and vector width is aligned there.
#pragma once

#include <cstddef>

namespace longctx::kernels::cuda {

inline constexpr size_t kWorkspaceAlign = 256;

constexpr size_t workspace_align(size_t bytes) {
  return (bytes + kWorkspaceAlign - 1) & ~(kWorkspaceAlign - 1);
}

}  // namespace longctx::kernels::cuda
