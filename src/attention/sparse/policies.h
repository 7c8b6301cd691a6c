// The policies' factories (one file each); the registry in sparse_policy.cpp names them.
#pragma once

#include <memory>

#include "attention/sparse/sparse_policy.h"

namespace longctx::sparse {

std::unique_ptr<SparsePolicy> make_full_policy(const SparseOptions& options, const KvShape& shape);
std::unique_ptr<SparsePolicy> make_quest_policy(const SparseOptions& options, const KvShape& shape);
std::unique_ptr<SparsePolicy> make_xattention_policy(const SparseOptions& options,
                                                     const KvShape& shape);

}  // namespace longctx::sparse
