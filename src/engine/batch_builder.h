// The flattened batch of one scheduled step.
#pragma once

#include "backend/batch.h"
#include "engine/prompt_logprobs.h"
#include "engine/scheduler.h"

namespace peregrine {

// Flattens the scheduler's choice: tokens [num_computed, num_computed + num_new) of each
// scheduled sequence, with logits for those that sample and a pool range for each embedding
// sequence (both in the order of out.seqs). With `prompt_rows`: the rows of sequences owing
// prompt logprobs (prompt_logprobs.h) are asked for too, after every sampled row, and listed
// there in the order of out.seqs.
void build_batch(const SchedulerOutput& out, int block_size, BatchInput& batch,
                 std::vector<PromptLogprobRows>* prompt_rows = nullptr);

}  // namespace peregrine
