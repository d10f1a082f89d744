// Embedding requests' pooling in the engine (Request::pooling): which rows of each prefill chunk
// feed a sequence's pooled sum, and the vector made of that sum once the prompt is done.
//
// A prompt may be prefilled over several steps (chunked prefill). Each step the model sums the
// final-normed hidden states of a range of the chunk's rows (BatchInput::pool_ranges): every row
// for mean pooling, the prompt's last row in its last chunk (last), its first row in the chunk
// that starts at position 0 (cls). The engine adds the steps' sums; a chunk that starts at 0
// restarts the sum (a sequence preempted and recomputed runs its prompt again).
#pragma once

#include <utility>
#include <vector>

#include "peregrine/engine_types.h"

namespace peregrine {

// The positions [first, last) of the chunk [begin, end) of a `num_tokens`-token prompt whose
// hidden states are pooled; first == last when none of the chunk's are.
std::pair<int, int> pooled_positions(PoolingType type, int begin, int end, int num_tokens);

// The embedding of a prompt of `num_tokens` tokens from the sum of its pooled rows [hidden]:
// divided by num_tokens for mean pooling, cut to p.dimensions (when 0 < dimensions < hidden),
// then L2-normalised when p.normalize (a zero vector stays zero).
std::vector<float> finish_embedding(const std::vector<double>& sum, int num_tokens, const PoolingParams& p);

}  // namespace peregrine
