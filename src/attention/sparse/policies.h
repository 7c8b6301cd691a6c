// The policies' registry lines (PolicyDef), each defined in the policy's own file; registry.cpp
// lists them. Also what the policy files share.
#pragma once

#include "attention/sparse/sparse_policy.h"
#include "kernels/quest_params.h"

namespace longctx::sparse {

extern const PolicyDef kFullPolicy, kQuestPolicy, kXAttentionPolicy, kStreamingPolicy;

// A page-list decode policy's budget in the kernels' terms (kernels/quest_params.h): counts
// clamped to int. Quest: its budget; streaming: sink + window, so nothing past the forced pages.
kernels::QuestBudget quest_budget(const SparseOptions& options);
// How many of a step's up to max_seqs sequences keep their pages across decode steps
// (SparseOptions::quest_reuse; 0: off).
int64_t quest_reuse_seqs(const SparseOptions& options, int64_t max_seqs);

}  // namespace longctx::sparse
