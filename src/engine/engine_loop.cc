#include "engine/engine_loop.h"

#include "core/error.h"
#include "engine/block_manager.h"
#include "engine/output_processor.h"

namespace peregrine {

EngineLoop::EngineLoop(const CoreConfig& config, std::unique_ptr<ModelExecutor> executor,
                       std::shared_ptr<const TextProcessor> text, ModelInfo model,
                       std::shared_ptr<const Tokenizer> tokenizer)
    : model_(std::move(model)),
      tokenizer_(std::move(tokenizer)),
      text_(std::move(text)),
      executor_(std::move(executor)),
      core_(config, *executor_),
      inbox_(std::make_shared<EngineInbox>()) {
    inbox_->stats = core_.stats();
    if (tokenizer_) grammars_ = std::make_unique<GrammarCache>(*tokenizer_, config.eos_token_ids);
    thread_ = std::thread([this] { loop(); });
}

EngineLoop::~EngineLoop() {
    shutdown();
}

std::shared_ptr<RequestStream> EngineLoop::submit(Request request) {
    core_.check_request(request, text_ != nullptr);  // immutable state only
    std::shared_ptr<const grammar::TokenizedGrammar> grammar;
    if (const StructuredOutput& so = request.sampling.structured; so.kind != StructuredOutput::Kind::None) {
        if (!grammars_) fail("'", so.field, "' needs the model's tokenizer, and this engine has none");
        grammar = grammars_->get(so);  // compiled here, on the submitting thread
    }
    auto stream = std::make_shared<RequestStream>(request.id);
    if (text_) {
        stream->text_ = std::make_unique<RequestText>(*text_, request);
        stream->stop_choice_ = [inbox = std::weak_ptr<EngineInbox>(inbox_), id = request.id](int index) {
            const std::shared_ptr<EngineInbox> in = inbox.lock();
            if (!in) return;
            {
                std::lock_guard<std::mutex> lock(in->mu);
                in->stops.emplace_back(id, index);
            }
            in->cv.notify_all();
        };
    }
    {
        std::lock_guard<std::mutex> lock(inbox_->mu);
        if (inbox_->stop) fail("the engine is shutting down");
        if (!inbox_->live.emplace(request.id, stream).second)
            fail("a request with id '", request.id, "' is already running");
        inbox_->incoming.push_back({std::move(request), stream, std::move(grammar), std::chrono::steady_clock::now()});
    }
    inbox_->cv.notify_all();
    return stream;
}

void EngineLoop::abort(const std::string& id) {
    {
        std::lock_guard<std::mutex> lock(inbox_->mu);
        inbox_->aborts.push_back(id);
    }
    inbox_->cv.notify_all();
}

EngineStats EngineLoop::stats() const {
    std::lock_guard<std::mutex> lock(inbox_->mu);
    return inbox_->stats;
}

void EngineLoop::shutdown() {
    {
        std::lock_guard<std::mutex> lock(inbox_->mu);
        inbox_->stop = true;
    }
    inbox_->cv.notify_all();
    if (thread_.joinable()) thread_.join();
}

void EngineLoop::loop() {
    EngineInbox& in = *inbox_;
    std::unordered_map<std::string, std::shared_ptr<RequestStream>> streams;  // engine-thread copy
    for (;;) {
        std::vector<EngineInbox::Incoming> incoming;
        std::vector<std::string> aborts;
        std::vector<std::pair<std::string, int>> stops;
        bool stopping;
        {
            std::unique_lock<std::mutex> lock(in.mu);
            in.cv.wait(lock, [&] {
                return in.stop || !in.incoming.empty() || !in.aborts.empty() || !in.stops.empty() ||
                       core_.has_unfinished();
            });
            incoming.swap(in.incoming);
            aborts.swap(in.aborts);
            stops.swap(in.stops);
            stopping = in.stop;
        }
        for (auto& [req, stream, grammar, submitted] : incoming) {
            const std::string id = req.id;
            try {
                core_.add_request(std::move(req), std::move(grammar), submitted);
                streams[id] = stream;
            } catch (const Error& e) {  // checked at submit; only a race could get here
                RequestOutput out;
                out.request_id = id;
                out.finish = FinishReason::Abort;
                out.stop_reason = e.what();
                stream->push(std::move(out), true);
                std::lock_guard<std::mutex> lock(in.mu);
                in.live.erase(id);
            }
        }
        for (const auto& [id, index] : stops) core_.stop_choice(id, index);
        for (const std::string& id : aborts) core_.abort_request(id);
        if (stopping)
            for (const auto& [id, stream] : streams) core_.abort_request(id);

        std::vector<RequestOutput> outputs = core_.step();
        {
            // Free the ids before the final outputs arrive, so that a client that read its
            // last output can reuse the id at once.
            std::lock_guard<std::mutex> lock(in.mu);
            for (const RequestOutput& out : outputs)
                if (out.usage) in.live.erase(out.request_id);
            in.stats = core_.stats();
        }
        for (RequestOutput& out : outputs) {
            auto it = streams.find(out.request_id);
            if (it == streams.end()) continue;
            const bool last = out.usage.has_value();
            it->second->push(std::move(out), last);
            if (last) streams.erase(it);
        }
        if (stopping && !core_.has_unfinished()) return;
    }
}

CoreConfig core_config(const EngineConfig& config, const std::vector<int>& eos_token_ids) {
    EngineConfig c = config;
    c.apply_device_defaults(0);  // a no-op for a worker's config (its device's defaults are in)
    CoreConfig core;
    core.scheduler.max_num_seqs = c.max_num_seqs;
    core.scheduler.max_num_batched_tokens = c.max_num_batched_tokens;
    core.eviction = eviction_policy_from_name(c.kv_eviction);
    core.prefix_caching = c.prefix_caching;
    core.scheduler.swap_preemption =
        c.preemption_mode == "swap" || (c.preemption_mode.empty() && c.kv_offload_memory > 0);
    core.async_scheduling = c.async_scheduling;
    core.kv_events = c.kv_events;
    core.disk_dir = c.kv_offload_disk;
    core.disk_bytes = c.kv_offload_disk_size;
    core.seed = c.seed;
    core.eos_token_ids.assign(eos_token_ids.begin(), eos_token_ids.end());
    return core;
}

}  // namespace peregrine
