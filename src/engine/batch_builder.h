// The flattened batch of one scheduled step.
#pragma once

#include "backend/batch.h"
#include "engine/scheduler.h"

namespace peregrine {

// Flattens the scheduler's choice: tokens [num_computed, num_computed + num_new) of each
// scheduled sequence, with logits for those that sample and a pool range for each embedding
// sequence (both in the order of out.seqs).
void build_batch(const SchedulerOutput& out, int block_size, BatchInput& batch);

}  // namespace peregrine
