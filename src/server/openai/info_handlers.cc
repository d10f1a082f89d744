#include <unistd.h>

#include <cstdint>
#include <fstream>

#include "peregrine/version.h"
#include "server/openai/handlers.h"
#include "server/ui/ui_page.h"

namespace peregrine::server {

namespace {

uint64_t rss_bytes() {
    std::ifstream f("/proc/self/statm");
    uint64_t size = 0, resident = 0;
    if (!(f >> size >> resident)) return 0;
    return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace

void handle_health(CompletionService& service, ApiCall& call) {
    Json j;
    const double uptime = service.uptime_s();
    if (service.draining()) {
        j["status"] = "draining";
        j["model"] = service.model_name();
        j["uptime_s"] = uptime;
        j["requests_in_flight"] = service.in_flight();
        return call.ex->respond(503, dump(j));
    }
    if (!service.ready()) {
        j["status"] = "loading";
        j["model"] = service.model_name();
        j["uptime_s"] = uptime;
        return call.ex->respond(503, dump(j));
    }
    const EngineStats s = service.model()->engine->stats();
    j["status"] = "ok";
    j["model"] = service.model_name();
    j["uptime_s"] = uptime;
    j["requests_served"] = service.counters().requests_served.load();
    j["requests_aborted"] = service.counters().requests_aborted.load();
    j["requests_in_flight"] = service.in_flight();
    j["running"] = s.num_running;
    j["waiting"] = s.num_waiting;
    j["kv_cache_usage"] = s.num_kv_blocks > 0 ? static_cast<double>(s.num_kv_blocks_used) / s.num_kv_blocks : 0.0;
    j["kv_blocks_used"] = s.num_kv_blocks_used;
    j["kv_blocks_total"] = s.num_kv_blocks;
    if (!s.kv_cache_dtype.empty()) j["kv_cache_dtype"] = s.kv_cache_dtype;  // f32 | bf16 | f8_e4m3
    j["prefix_cache_hit_rate"] =
        s.prefix_queries > 0 ? static_cast<double>(s.prefix_hits) / static_cast<double>(s.prefix_queries) : 0.0;
    j["kv_evictions"] = s.evictions;
    if (s.num_host_kv_blocks > 0) {  // the host tier (--kv-offload-memory)
        j["host_kv_blocks_used"] = s.num_host_kv_blocks_used;
        j["host_kv_blocks_total"] = s.num_host_kv_blocks;
        j["host_kv_bytes_total"] = static_cast<uint64_t>(s.num_host_kv_blocks) * s.kv_block_bytes;
        j["host_kv_usage"] = static_cast<double>(s.num_host_kv_blocks_used) / s.num_host_kv_blocks;
    }
    if (s.num_disk_kv_blocks > 0) {  // the disk tier (--kv-offload-disk)
        j["disk_kv_blocks_used"] = s.num_disk_kv_blocks_used;
        j["disk_kv_blocks_total"] = s.num_disk_kv_blocks;
        j["disk_kv_bytes_used"] = static_cast<uint64_t>(s.num_disk_kv_blocks_used) * s.disk_slot_bytes;
        j["disk_kv_bytes_total"] = static_cast<uint64_t>(s.num_disk_kv_blocks) * s.disk_slot_bytes;
        j["disk_kv_usage"] = static_cast<double>(s.num_disk_kv_blocks_used) / s.num_disk_kv_blocks;
        j["disk_kv_read_failures"] = s.disk_read_failures;
        j["disk_kv_write_failures"] = s.disk_write_failures;
    }
    j["preemptions"] = s.preemptions;
    j["swap_preemptions"] = s.swap_preemptions;
    j["pinned_prefix_tokens"] = s.pinned_prefix_tokens;  // --pin-prefix, held in the KV cache for good
    j["conversation_requests"] = s.conversation_requests;
    j["prompt_tokens"] = s.prompt_tokens;
    j["generation_tokens"] = s.generation_tokens;
    j["memory_rss_bytes"] = rss_bytes();
    call.ex->respond(200, dump(j));
}

void handle_ui(CompletionService&, ApiCall& call) {
    // The page loads nothing from elsewhere; the policy says so to the browser as well.
    call.ex->respond(200, std::string(chat_page()), "text/html; charset=utf-8",
                     {{"Cache-Control", "no-cache"},
                      {"X-Content-Type-Options", "nosniff"},
                      {"Content-Security-Policy",
                       "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                       "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"}});
}

void handle_ping(CompletionService& service, ApiCall& call) {
    call.ex->respond(service.ready() && !service.draining() ? 200 : 503, "", "text/plain");
}

void handle_version(CompletionService&, ApiCall& call) {
    call.ex->respond(200, dump(Json{{"version", version()}}));
}

void handle_metrics(CompletionService& service, ApiCall& call) {
    const EngineStats s = service.ready() ? service.model()->engine->stats() : EngineStats{};
    call.ex->respond(200, service.metrics().render(service.model_name(), s),
                     "text/plain; version=0.0.4; charset=utf-8");
}

void handle_models(CompletionService& service, ApiCall& call) {
    const ServedModel& m = *service.model();
    const std::string id(call.arg);
    auto entry = [&](const std::string& name) {
        Json e;
        e["id"] = name;
        e["object"] = "model";
        e["created"] = service.created_unix();
        e["owned_by"] = "peregrine";
        e["root"] = m.path;
        e["parent"] = nullptr;
        e["max_model_len"] = m.max_model_len;
        return e;
    };
    if (!id.empty()) {
        service.check_model(id);
        return call.ex->respond(200, dump(entry(id)));
    }
    Json data = Json::array();
    for (const std::string& n : service.options().model_names) data.push_back(entry(n));
    call.ex->respond(200, dump(Json{{"object", "list"}, {"data", data}}));
}

}  // namespace peregrine::server
