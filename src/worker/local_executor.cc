#include "worker/local_executor.h"

#include "core/error.h"

namespace peregrine {

void ModelExecutor::execute_on_device(const BatchInput&) {
    fail("this executor samples on the CPU only");
}
void ModelExecutor::launch_sampling(const std::vector<SampleRow>&) {
    fail("this executor samples on the CPU only");
}
void ModelExecutor::collect_samples(std::vector<int32_t>&, std::vector<TokenLogprob>&) {
    fail("this executor samples on the CPU only");
}
void ModelExecutor::pool(const BatchInput&, std::vector<float>&) {
    fail("this executor cannot pool hidden states into embeddings");
}
void ModelExecutor::offload_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs) {
    PG_CHECK(pairs.empty(), "this executor has no host KV tier");
}
void ModelExecutor::onload_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs) {
    PG_CHECK(pairs.empty(), "this executor has no host KV tier");
}

LocalExecutor::LocalExecutor(std::unique_ptr<Worker> worker) : worker_(std::move(worker)) {}

std::unique_ptr<LocalExecutor> LocalExecutor::create(const EngineConfig& config) {
    config.validate();  // every engine is built here (Engine::create, the benchmarks)
    auto w = std::make_unique<Worker>(config);
    w->init_device();
    w->load_model();
    w->init_kv_cache(w->determine_kv_blocks());
    w->init_host_kv_cache(config.kv_offload_memory);
    w->warm_up();
    return std::make_unique<LocalExecutor>(std::move(w));
}

std::unique_ptr<LocalExecutor> LocalExecutor::over(Backend& backend, Model& model, int num_blocks, int block_size,
                                                   DeviceSampler* sampler, int64_t host_kv_bytes) {
    auto w = std::make_unique<Worker>(backend, model, num_blocks, block_size, sampler);
    w->init_host_kv_cache(host_kv_bytes);
    return std::make_unique<LocalExecutor>(std::move(w));
}

int LocalExecutor::vocab_size() const {
    return worker_->model_config().vocab_size;
}

int LocalExecutor::max_model_len() const {
    return worker_->max_model_len();
}

int LocalExecutor::num_kv_blocks() const {
    return worker_->num_kv_blocks();
}

int LocalExecutor::block_size() const {
    return worker_->block_size();
}

void LocalExecutor::copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs) {
    worker_->copy_blocks(pairs);
}

int LocalExecutor::num_host_kv_blocks() const {
    return worker_->num_host_kv_blocks();
}

void* LocalExecutor::host_kv_data() {
    return worker_->host_kv_data();
}

void LocalExecutor::wait_host_kv() {
    worker_->wait_host_kv();
}

size_t LocalExecutor::kv_block_bytes() const {
    return worker_->kv_block_bytes();
}

std::string LocalExecutor::kv_cache_dtype() const {
    return std::string(dtype_name(worker_->kv_cache_dtype()));
}

void LocalExecutor::offload_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs) {
    worker_->offload_blocks(pairs);
}

void LocalExecutor::onload_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs) {
    worker_->onload_blocks(pairs);
}

void LocalExecutor::execute(const BatchInput& batch, std::vector<float>& logits) {
    worker_->execute(batch, logits);
}

bool LocalExecutor::samples_on_device() const {
    return worker_->samples_on_device();
}

void LocalExecutor::execute_on_device(const BatchInput& batch) {
    worker_->execute_on_device(batch);
}

void LocalExecutor::launch_sampling(const std::vector<SampleRow>& rows) {
    worker_->launch_sampling(rows);
}

void LocalExecutor::collect_samples(std::vector<int32_t>& tokens, std::vector<TokenLogprob>& logprobs) {
    worker_->collect_samples(tokens, logprobs);
}

void LocalExecutor::pool(const BatchInput& batch, std::vector<float>& out) {
    worker_->pool(batch, out);
}

int LocalExecutor::max_fed_draws() const {
    return worker_->max_fed_draws();
}

}  // namespace peregrine
