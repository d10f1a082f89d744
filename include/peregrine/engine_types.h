// The engine's public request/response types: what callers (CLI, server, tests) submit and
// what they receive back.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace peregrine {

// Structured output: the generated text must be a sentence of a grammar, enforced token by
// token (disallowed tokens are masked before sampling; EOS only once the text is complete).
struct StructuredOutput {
    enum class Kind { None, JsonObject, JsonSchema, Regex, Choice, Grammar };
    Kind kind = Kind::None;
    // JsonSchema: the schema (JSON text); Regex: the pattern; Choice: a JSON array of strings;
    // Grammar: GBNF with a `root` rule; JsonObject: unused.
    std::string spec;
    // The API field that asked for it ("response_format", "guided_json", ...): errors name it.
    std::string field = "response_format";
    // JSON kinds: no whitespace between tokens (machine-read answers such as forced tool calls;
    // otherwise a little is allowed at each structural position).
    bool compact = false;
};

struct SamplingParams {
    int n = 1;                 // completions per prompt; they share the prompt's KV blocks
    float temperature = 1.0f;  // below 1e-5 (0 included) = greedy, as is top_k 1
    float top_p = 1.0f;
    int top_k = 0;                                      // 0 = no limit
    float min_p = 0.0f;                                 // drop tokens below min_p * p(most likely)
    float repetition_penalty = 1.0f;                    // > 1 discourages tokens seen in the prompt or output
    float presence_penalty = 0.0f;                      // subtracted once from tokens present in the output
    float frequency_penalty = 0.0f;                     // subtracted per occurrence in the output
    std::vector<std::pair<int32_t, float>> logit_bias;  // added to the logits before sampling
    std::optional<uint64_t> seed;                       // per-request RNG: the same tokens whatever else runs
    std::vector<std::string> stop;                      // stop strings, never included in the output
    std::vector<int32_t> stop_token_ids;
    bool ignore_eos = false;
    // The output text leaves special tokens out (vLLM's field). Tool-call parsing turns it off
    // where the format's markers are special tokens ([TOOL_CALLS], <|python_tag|>).
    bool skip_special_tokens = true;
    int min_tokens = 0;   // EOS and stop tokens are masked until this many are generated
    int max_tokens = 16;  // clamped to the context left
    int logprobs = -1;    // -1: none; k >= 0: the sampled token's logprob and the top k (k <= kMaxLogprobs)
    // -1: none; k >= 0: each prompt token's logprob given the tokens before it, and the top k
    // there (vLLM's prompt_logprobs). The prompt is then computed whole: no prefix-cache hits.
    int prompt_logprobs = -1;
    StructuredOutput structured;
};

// Limits on the sampling fields, and the bounds that depend on the running engine. A 0 bound
// is not checked (e.g. vocab_size 0: token ids are not checked against a vocabulary).
constexpr int kMaxN = 128;               // completions per prompt
constexpr int kMaxLogprobs = 20;         // top logprobs per token
constexpr float kMaxLogitBias = 100.0f;  // |bias| per token, as OpenAI
constexpr float kMaxPenalty = 2.0f;      // |presence_penalty|, |frequency_penalty|, as OpenAI

struct SamplingLimits {
    int vocab_size = 0;    // logit_bias token ids must be below it
    int max_num_seqs = 0;  // n must not exceed it (the n choices run at once)
    int max_n = kMaxN;
    int max_logprobs = kMaxLogprobs;
    bool has_tokenizer = true;  // stop strings need one (to match text)
};

// One rejected field: `field` as the OpenAI API spells it ("top_p", "logit_bias"; "logprobs"
// for SamplingParams::logprobs, which chat requests call "top_logprobs"), `message` a sentence
// fit for an API client that names the value ("'top_p' must be in (0, 1], got 2").
struct FieldError {
    std::string field;
    std::string message;
};

// Every rule a SamplingParams must satisfy, in one place (HTTP, WebSocket, gRPC, the CLI and
// the engine all call it). Returns one error per bad field, in the order of the struct's
// fields; empty when the parameters are valid.
std::vector<FieldError> validate(const SamplingParams& params, const SamplingLimits& limits);

// Embeddings: how a sequence's hidden states (after the model's final norm, as Hugging Face's
// last_hidden_state) become one vector. Last: the last token's row (Qwen3-Embedding); Mean: the
// average over every token; Cls: the first token's row.
enum class PoolingType { Last, Mean, Cls };
const char* pooling_type_name(PoolingType t);  // "last" | "mean" | "cls"

struct PoolingParams {
    PoolingType type = PoolingType::Last;
    bool normalize = true;  // L2-normalise the result (after the truncation below)
    int dimensions = 0;     // > 0: keep only the first `dimensions` values (Matryoshka); 0: all
};

struct Request {
    std::string id;
    std::vector<int32_t> prompt_ids;
    SamplingParams sampling;
    int priority = 0;        // lower runs first (as vLLM)
    std::string cache_salt;  // isolates prefix-cache entries between tenants
    // Names the conversation the request belongs to (OpenAI's prompt_cache_key): its KV blocks are
    // evicted from the prefix cache only after every anonymous block. Empty: anonymous.
    std::string prompt_cache_key;
    // Requests of one client call (the prompts of one /v1/completions request) share one fair
    // share of the running slots; empty: the request is its own group.
    std::string group;
    // Set: an embedding request. Its prompt is prefilled only (nothing sampled, `sampling` unused)
    // and its one output carries the pooled vector in `embedding`, with finish reason "stop".
    std::optional<PoolingParams> pooling;
};

// A change to the prefix cache (the KV blocks other requests can reuse), as vLLM's KV-cache
// events report it: routers and the inference gateway's prefix scorers subscribe to them to know
// which replica holds which prompt prefix. Only full blocks are announced.
struct KvCacheEvent {
    enum class Kind { BlockStored, BlockRemoved, AllBlocksCleared };
    // Where the blocks are (vLLM's `medium`): Gpu, the engine's KV pool whatever the backend (the
    // primary tier); Cpu, the host-memory tier (--kv-offload-memory); Disk, the disk tier
    // (--kv-offload-disk).
    enum class Medium { Gpu, Cpu, Disk };
    Kind kind = Kind::BlockStored;
    Medium medium = Medium::Gpu;
    std::vector<uint64_t> block_hashes;  // consecutive blocks of one sequence (Stored), or any (Removed)
    // BlockStored: the hash of the block before the first one; none for a sequence's first block.
    std::optional<uint64_t> parent_block_hash;
    std::vector<int32_t> token_ids;  // BlockStored: block_size tokens per hash, in order
};

enum class FinishReason { None, Stop, Length, Abort };
const char* finish_reason_name(FinishReason r);

struct TokenLogprob {
    int32_t token = 0;
    float logprob = 0.0f;
    // 1 + the tokens more likely than `token` (ties count as more likely, as vLLM ranks); 0 where
    // not computed (device samplers).
    int32_t rank = 0;
    std::vector<std::pair<int32_t, float>> top;  // most likely first
};

struct Usage {
    int prompt_tokens = 0;
    int completion_tokens = 0;  // over all n choices
    int max_choice_tokens = 0;  // the longest choice's (vLLM's max_num_generation_tokens)
    int cached_tokens = 0;      // prompt tokens served from the prefix cache
};

// Where a request's time went, in seconds (steady clock), reported with its last output.
struct RequestTiming {
    double queue = 0;    // submit → first scheduled
    double prefill = 0;  // first scheduled → first token (time to first token minus queueing)
    double decode = 0;   // first token → last token
    double time_to_first_token = 0;
    double total = 0;  // submit → finish
};

// One increment of one choice of a request. The last output of a choice carries its finish
// reason; the last output of the request also carries the usage.
struct RequestOutput {
    std::string request_id;
    int index = 0;                       // which of the n choices
    std::vector<int32_t> token_ids;      // new tokens since the previous output
    std::string text;                    // new text since the previous output (complete UTF-8)
    std::vector<TokenLogprob> logprobs;  // one per new token when requested
    // SamplingParams::prompt_logprobs: on choice 0's first output, one entry per prompt token
    // from the second on (entry i is prompt token i + 1 given tokens 0..i); the first prompt
    // token has none.
    std::vector<TokenLogprob> prompt_logprobs;
    FinishReason finish = FinishReason::None;
    std::string stop_reason;              // the stop string or token that ended the choice
    std::optional<Usage> usage;           // set on the request's last output
    std::optional<RequestTiming> timing;  // likewise
    std::vector<float> embedding;         // an embedding request's vector (Request::pooling)
};

}  // namespace peregrine
