// CPU references of Quest's decode kernels (kernels/quest_params.h): what the CUDA kernels
// (kernels/cuda/quest.h) are tested against. fp32 arithmetic on bf16 / f16 / f32 storage.
#pragma once

#include <vector>

#include "kernels/quest_params.h"

namespace longctx::kernels::cpu {

// Throws Error(kInvalidArgument) naming the field: a page size that does not divide the block,
// non-positive shapes, a budget that is not above sink + window.
void check_quest_budget(const QuestBudget& budget, int block_size);

void quest_meta_update(const QuestMetaParams& params);

// The score of logical page `page` of sequence b for KV head h (per_head) or for every head
// (head-averaged), in fp32 (exposed for the tests' tolerance checks).
float quest_page_score(const QuestSelectParams& params, int b, int h, int page);

// Fills params.selected (scores is not used).
void quest_select(const QuestSelectParams& params);

void quest_gather(const QuestGatherParams& params);

}  // namespace longctx::kernels::cpu
