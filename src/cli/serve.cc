// `peregrine serve`: the OpenAI-compatible HTTP server. Listens at once (GET /health answers
// 503 while the model loads), then serves until SIGINT or SIGTERM: new API requests then get 503
// (and /health "draining") while running ones finish, for up to --shutdown-timeout seconds; then
// the rest are aborted (their clients get finish_reason "abort") and the process exits 0. A
// second signal skips the wait.
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "cli/config.h"
#include "cli/data_parallel.h"
#include "cli/engine_options.h"
#include "cli/pinned_chat.h"
#include "cli/stop_signals.h"
#include "cli/tls_flags.h"
#include "core/error.h"
#include "formats/gguf.h"
#include "model/hf_cache.h"
#include "model/loader.h"
#include "server/grpc/grpc_server.h"
#include "server/http/http_server.h"
#include "server/kv_events.h"
#include "server/openai/openai_server.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "worker/parallel_executor.h"

namespace peregrine::cli {

namespace {

struct ServeArgs {
    EngineConfig engine;
    std::string host = "127.0.0.1";
    int port = 8000;
    int grpc_port = 0;       // 0 = no gRPC API
    server::TlsOptions tls;  // --ssl-*: HTTPS, WSS and gRPC over TLS
    bool ui = true;          // the chat page at /
    std::vector<std::string> served_model_names;
    std::vector<std::string> api_keys;
    int io_threads = 0;
    int64_t max_body_bytes = int64_t{32} << 20;
    std::vector<std::string> allowed_origins;
    int64_t rate_limit_rpm = 0;
    int64_t rate_limit_tpm = 0;
    bool access_log = false;
    server::AdmissionLimits limits;
    int max_connections = 0;  // 0: from the descriptor limit
    int keep_alive_timeout_s = 60;
    int read_timeout_s = 60;
    double shutdown_timeout_s = 10;
    server::KvEventOptions kv_events;  // endpoint empty: no events
    int data_parallel_size = 1;
    std::string chat_template;                          // --chat-template: a file or the template itself
    std::string chat_template_content_format = "auto";  // auto | string | openai
    std::string tool_call_parser = "auto";              // or a ToolCallFormat's name
    std::string root_path;                              // a proxy's path prefix
};

// Connections are descriptors: take the hard limit (as nginx and Go do) before sizing the cap.
void raise_descriptor_limit() {
    rlimit rl{};
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

// Waits up to `seconds` for `done`, polling; false when a signal in `signals` arrives first.
template <typename Done>
bool wait_until(const sigset_t& signals, double seconds, Done done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (!done() && std::chrono::steady_clock::now() < deadline) {
        timespec ts{0, 20'000'000};
        if (sigtimedwait(&signals, nullptr, &ts) > 0) return false;
    }
    return true;
}

// The name clients use for the model: its folder or file name.
std::string default_model_name(const std::string& path) {
    std::filesystem::path p(path);
    while (!p.empty() && p.filename().empty()) p = p.parent_path();
    std::string name = p.filename().string();
    if (p.extension() == ".gguf" || p.extension() == ".safetensors") name = p.stem().string();
    if (p.extension() == ".safetensors") name = p.parent_path().filename().string();
    return name.empty() ? "peregrine" : name;
}

// The text of token `id`, or "" when the tokenizer has none.
std::string token_text(const Tokenizer& t, int32_t id) {
    return t.valid_id(id) ? t.token(id) : std::string();
}

std::unique_ptr<server::ServedModel> load(const ServeArgs& a) {
    auto m = std::make_unique<server::ServedModel>();
    EngineConfig engine = a.engine;
    // Chat --pin-prefix files render with the template chat requests get.
    engine.render_pinned_chat = [tmpl = a.chat_template](const std::string& messages, const ModelInfo& model,
                                                         const Tokenizer& tok) {
        return render_pinned_chat(messages, tmpl, model, tok);
    };
    m->engine = Engine::create(engine);
    const ModelInfo& info = m->engine->model();
    m->path = info.path;
    m->max_model_len = info.max_model_len;
    m->vocab_size = info.vocab_size;
    m->hidden_size = info.hidden_size;
    m->pooling = info.pooling;
    m->tokenizer = m->engine->tokenizer();
    m->bos_token = token_text(*m->tokenizer, m->tokenizer->bos_id());
    m->eos_token = token_text(*m->tokenizer, m->tokenizer->eos_id());
    apply_generation_defaults(info.generation_defaults, m->request_defaults);
    try {
        m->chat_template = std::make_shared<const ChatTemplate>(
            !a.chat_template.empty() ? ChatTemplate::from_flag(a.chat_template, m->bos_token, m->eos_token)
            : info.gguf              ? ChatTemplate::from_gguf(*info.gguf)
                                     : ChatTemplate::from_model(info.model_dir));
        if (!m->chat_template->bos_token().empty()) m->bos_token = m->chat_template->bos_token();
        if (!m->chat_template->eos_token().empty()) m->eos_token = m->chat_template->eos_token();
    } catch (const Error& e) {
        if (!a.chat_template.empty()) throw;  // the user's template: a clear error, not a server without chat
        m->chat_template_error = e.what();
        std::fprintf(stderr, "  chat template: none (%s); /v1/chat/completions will answer 400\n", e.what());
    }
    m->chat_template_content_format = a.chat_template_content_format;
    if (m->chat_template_content_format == "auto")
        m->chat_template_content_format = m->chat_template ? m->chat_template->content_format() : "string";
    if (m->chat_template)
        std::fprintf(stderr, "  chat template: %s, message content as %s\n",
                     a.chat_template.empty() ? "the model's" : "--chat-template",
                     m->chat_template_content_format == "openai" ? "a list of parts (openai)" : "a string");
    if (a.tool_call_parser != "auto")
        m->tool_call_format = server::tool_call_format_named(a.tool_call_parser).value_or(server::ToolCallFormat::None);
    else if (m->chat_template)
        m->tool_call_format = server::detect_tool_call_format(m->chat_template->tmpl().source());
    std::fprintf(stderr, "  tool calls (tool_choice auto): %s%s\n", server::tool_call_format_name(m->tool_call_format),
                 a.tool_call_parser == "auto" ? " (from the chat template)" : "");
    return m;
}

int run(ServeArgs& a) {
    // A Hugging Face repo id is served under that name, read from the cache's snapshot.
    const std::string given = a.engine.model;
    a.engine.model = resolve_model_path(given);
    if (a.engine.model != given && a.served_model_names.empty()) a.served_model_names.push_back(given);
    // A bad --chat-template fails now, not after the weights load.
    if (!a.chat_template.empty()) (void)ChatTemplate::from_flag(a.chat_template, "", "");
    check_tls_flags(a.tls);
    if (a.data_parallel_size > 1) {
        if (a.engine.parallel_size() > 1 && (a.engine.nnodes > 1 || a.engine.master_port > 0))
            fail(
                "--data-parallel-size with a model-parallel group across hosts (--nnodes, --master-port) is not "
                "supported: each replica's group is local to this host");
        if (!a.root_path.empty()) fail("--root-path with --data-parallel-size is not supported yet");
        DataParallelOptions o;
        o.size = a.data_parallel_size;
        o.engine = a.engine;
        o.front.host = a.host;
        o.front.port = a.port;
        o.front.allowed_origins = a.allowed_origins;
        o.front.access_log = a.access_log;
        o.front.io_threads = a.io_threads;
        o.front.tls = a.tls;
        o.api_keys = a.api_keys;
        o.model_name = a.served_model_names.empty()
                           ? default_model_name(a.engine.model.empty() ? default_model_path() : a.engine.model)
                           : a.served_model_names.front();
        o.kv_events_endpoint = a.kv_events.endpoint;
        o.kv_events_replay_endpoint = a.kv_events.replay_endpoint;
        o.shutdown_timeout_s = a.shutdown_timeout_s;
        return run_data_parallel(o);
    }
    // A model-parallel group forks this host's ranks before any thread starts; on ranks other
    // than 0 this never returns (they run what rank 0 sends, then exit).
    if (a.engine.parallel_size() > 1) join_model_group(a.engine);
    // SIGINT/SIGTERM go to sigwait below, not to whichever thread happens to run.
    const sigset_t signals = block_stop_signals();

    server::OpenAiServerOptions sopts;
    sopts.model_names = a.served_model_names;
    if (sopts.model_names.empty())
        sopts.model_names.push_back(default_model_name(a.engine.model.empty() ? default_model_path() : a.engine.model));
    sopts.api_keys = a.api_keys;
    sopts.allowed_origins = a.allowed_origins;
    sopts.rate_limits.requests_per_minute = a.rate_limit_rpm;
    sopts.rate_limits.tokens_per_minute = a.rate_limit_tpm;
    sopts.access_log = a.access_log;
    sopts.root_path = a.root_path;
    sopts.ui = a.ui;
    sopts.limits = a.limits;
    // Declared before `app`, so destroyed after the engine that calls it.
    std::unique_ptr<server::KvEventPublisher> kv_events;
    auto app = std::make_shared<server::OpenAiServer>(sopts);

    server::HttpServerOptions hopts;
    hopts.host = a.host;
    hopts.port = a.port;
    hopts.io_threads = a.io_threads;
    hopts.max_body_bytes = static_cast<size_t>(a.max_body_bytes);
    hopts.idle_timeout_s = a.keep_alive_timeout_s;
    hopts.read_timeout_s = a.read_timeout_s;
    raise_descriptor_limit();
    hopts.max_connections = a.max_connections;  // 0: the server sizes it from the (raised) limit
    hopts.tls = a.tls;                          // its files were checked by check_tls_flags, before the weights load
    server::HttpServer http(hopts, [app](const server::HttpRequest& req, std::shared_ptr<server::Exchange> ex) {
        app->handle(req, std::move(ex));
    });
    http.start();
    const std::string url = base_url(a.tls, a.host, http.port());
    std::unique_ptr<server::GrpcServer> grpc;
    if (a.grpc_port > 0) {
        grpc =
            std::make_unique<server::GrpcServer>(server::GrpcServerOptions{a.host, a.grpc_port, a.tls}, app->service());
        grpc->start();
        std::fprintf(stderr, "gRPC listening on %s:%d\n", a.host.c_str(), grpc->port());
    }
    std::fprintf(stderr, "listening on %s (loading the model)\n", url.c_str());

    // Before the engine, so that its first steps' events have somewhere to go.
    if (!a.kv_events.endpoint.empty()) {
        a.kv_events.block_size = a.engine.block_size;
        kv_events = std::make_unique<server::KvEventPublisher>(a.kv_events);
        server::KvEventPublisher* pub = kv_events.get();
        a.engine.kv_events = [pub](std::vector<KvCacheEvent> events) { pub->publish(std::move(events)); };
        std::fprintf(stderr, "KV events: %s%s%s\n", a.kv_events.endpoint.c_str(),
                     a.kv_events.replay_endpoint.empty() ? "" : ", replay at ", a.kv_events.replay_endpoint.c_str());
    }
    app->set_model(load(a));
    if (grpc) grpc->set_serving(true);
    std::fprintf(stderr, "ready: serving '%s' at %s/v1 (%zu API key%s)\n", app->model_name().c_str(), url.c_str(),
                 sopts.api_keys.size(), sopts.api_keys.size() == 1 ? "" : "s");
    std::fprintf(stderr,
                 "try: curl -s %s/v1/completions -H 'Content-Type: application/json'%s -d '{\"model\": \"%s\", "
                 "\"prompt\": \"Once upon a time\", \"max_tokens\": 40, \"temperature\": 0}'\n",
                 // Double quotes: a shell expands the key's variable where this line is pasted.
                 url.c_str(), sopts.api_keys.empty() ? "" : " -H \"Authorization: Bearer $PEREGRINE_API_KEY\"",
                 app->model_name().c_str());
    std::fflush(stderr);

    int sig = 0;
    sigwait(&signals, &sig);
    // Drain first, then say so: whoever reads the log line may probe /health at once.
    app->begin_drain();
    if (grpc) grpc->set_serving(false);
    std::fprintf(stderr, "%s: draining %lld request(s) for up to %g s\n", sig == SIGTERM ? "SIGTERM" : "SIGINT",
                 static_cast<long long>(app->in_flight()), a.shutdown_timeout_s);
    std::fflush(stderr);
    wait_until(signals, a.shutdown_timeout_s, [&] { return app->in_flight() == 0; });
    if (app->in_flight() > 0) {
        std::fprintf(stderr, "aborting %lld request(s)\n", static_cast<long long>(app->in_flight()));
        app->abort_all();
        wait_until(signals, 2.0, [&] { return app->in_flight() == 0; });  // their last chunks go out
    }
    // WebSocket clients hear why the connection ends (1001 going away), not just a reset.
    http.close_websockets();
    wait_until(signals, 1.0, [&] { return http.num_connections() == 0; });
    std::fprintf(stderr, "shutting down\n");
    http.stop();
    if (grpc) grpc->stop();
    app->shutdown();
    return 0;
}

}  // namespace

std::function<int()> add_serve(CLI::App& app) {
    auto args = std::make_shared<ServeArgs>();
    CLI::App* cmd = app.add_subcommand("serve", "Serve the OpenAI-compatible HTTP API");
    add_engine_options(cmd, args->engine);
    cmd->add_option("model", args->engine.model, "The model, as --model (positional, as in `vllm serve MODEL`)")
        ->excludes(cmd->get_option("--model"));
    // Embeddings (POST /v1/embeddings): vLLM's --task embed, and its newer --runner pooling.
    cmd->add_option("--task", args->engine.task,
                    "What the server answers: generate (completions, chat) or embed (POST /v1/embeddings, vectors "
                    "pooled from the final hidden states) (default generate)")
        ->check(CLI::IsMember({"generate", "embed"}));
    cmd->add_option_function<std::string>(
           "--runner", [args](const std::string& r) { args->engine.task = r == "pooling" ? "embed" : "generate"; },
           "vLLM's newer spelling of --task: pooling (= --task embed) | generate")
        ->check(CLI::IsMember({"generate", "pooling"}))
        ->excludes(cmd->get_option("--task"));
    cmd->add_option("--pooling-type", args->engine.pooling_type,
                    "--task embed: how hidden states become one vector: last (the last token's, Qwen3-Embedding) | "
                    "mean | cls (default: the model folder's sentence-transformers modules.json and "
                    "1_Pooling/config.json, else last for qwen3 and mean otherwise)")
        ->check(CLI::IsMember({"last", "mean", "cls"}));
    cmd->add_flag_callback(
        "--normalize", [args] { args->engine.normalize = 1; },
        "--task embed: L2-normalise embeddings (default: as the folder's modules.json says, a Normalize module; "
        "normalised when it has no modules.json)");
    cmd->add_flag_callback(
        "--no-normalize", [args] { args->engine.normalize = 0; }, "--task embed: return raw pooled vectors");
    cmd->add_option("--seed", args->engine.seed,
                    "Seed of requests that give none: the k-th such request of a run samples the same tokens in "
                    "every run (default: random)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--chat-template", args->chat_template,
                    "Chat template: a .jinja file, a JSON file with chat_template, or the template itself; a model "
                    "without one can then chat (default: the model's)");
    cmd->add_option("--chat-template-content-format", args->chat_template_content_format,
                    "Message content as the template gets it: string (text parts joined), openai (a list of "
                    "{type, text} parts) or auto (openai when the template loops over content) (default auto)")
        ->check(CLI::IsMember({"auto", "string", "openai"}));
    cmd->add_option("--host", args->host, "Address to listen on (default 127.0.0.1)");
    cmd->add_option("--port", args->port, "Port to listen on; 0 = any free port (default 8000)")
        ->check(CLI::Range(0, 65535));
    cmd->add_option("--grpc-port", args->grpc_port, "Port for the gRPC API (proto/peregrine/v1); 0 = off (default 0)")
        ->check(CLI::Range(0, 65535));
    add_tls_flags(cmd, args->tls);
    cmd->add_flag_callback(
        "--no-ui", [args] { args->ui = false; }, "No chat page at / (default: one, as llama.cpp's server)");
    cmd->add_option("--served-model-name", args->served_model_names,
                    "Model name(s) clients send; the first is reported (default: the model's folder or file name)");
    cmd->add_option("--api-key", args->api_keys,
                    "Accepted API key (repeatable; $PEREGRINE_API_KEY takes a comma-separated list; default: none = no "
                    "authentication)");
    cmd->add_option("--io-threads", args->io_threads, "HTTP I/O threads (default: min(4, cores), at least 2)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--max-body-bytes", args->max_body_bytes, "Largest request body; larger gets 413 (default 32 MiB)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--allowed-origins", args->allowed_origins,
                    "CORS: origins browsers may call from, or * for any (default: none, no CORS headers)");
    cmd->add_option("--rate-limit-rpm", args->rate_limit_rpm,
                    "Requests per minute per API key (per client address without keys); 0 = unlimited (default 0)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--rate-limit-tpm", args->rate_limit_tpm,
                    "Tokens (prompt + max_tokens) per minute per API key or client address; 0 = unlimited (default 0)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--root-path", args->root_path,
                    "Path prefix a proxy forwards (e.g. /llm): /llm/v1/... is served as /v1/..., and paths "
                    "without it still work (default: none)");
    cmd->add_flag("--access-log,!--no-access-log", args->access_log,
                  "One JSON line per request on stderr (default off)");
    cmd->add_option("--max-queued-requests", args->limits.max_queued_requests,
                    "Completion requests in flight at most (every transport); more get 429 with Retry-After "
                    "(default 0 = no limit)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--max-queued-sequences", args->limits.max_queued_sequences,
                    "Sequences (prompts x n) in flight at most; more get 429, a request larger than this 400 "
                    "(default 4096; 0 = no limit)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--max-queued-tokens", args->limits.max_queued_tokens,
                    "Tokens (prompts + n x max_tokens) in flight at most; more get 429, a request larger than this "
                    "400 (default 0 = no limit)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--max-n", args->limits.max_n, "Largest n (choices) a request may ask for (default 128)")
        ->check(CLI::Range(1, 128));
    cmd->add_option("--max-prompts", args->limits.max_prompts,
                    "Most prompts in one /v1/completions request (default 1024)")
        ->check(CLI::Range(1, 1 << 20));
    cmd->add_option("--data-parallel-size", args->data_parallel_size,
                    "Replicas of the model on this host behind a cache-aware router on --port: one GPU each when "
                    "there are enough, else sharing GPU 0 (1/N of --gpu-memory-utilization each), or 1/N of the "
                    "CPU cores each; a replica that dies is restarted (default 1)")
        ->check(CLI::Range(1, 64));
    cmd->add_option("--kv-events-endpoint", args->kv_events.endpoint,
                    "Publish prefix-cache events (vLLM's KV events: ZMQ PUB, msgpack) at this ZMQ endpoint, e.g. "
                    "tcp://*:5557 (default: off)");
    cmd->add_option("--kv-events-topic", args->kv_events.topic,
                    "Topic frame of every KV-event message, e.g. kv@POD@MODEL (default: empty)");
    cmd->add_option("--kv-events-replay-endpoint", args->kv_events.replay_endpoint,
                    "ZMQ ROUTER endpoint answering replay requests for missed KV events, e.g. tcp://*:5558 "
                    "(default: off)");
    cmd->add_option("--kv-events-buffer-steps", args->kv_events.buffer_steps,
                    "KV-event batches kept for replay (default 10000)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--max-connections", args->max_connections,
                    "Open connections at most (WebSockets included); more get 503 and are closed (default: the "
                    "descriptor limit less 256)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--keep-alive-timeout", args->keep_alive_timeout_s,
                    "Seconds a connection may wait for its next request header (default 60)")
        ->check(CLI::Range(1, 86400));
    cmd->add_option("--read-timeout", args->read_timeout_s,
                    "Seconds a request body may take to arrive after its header; slower gets 408 (default 60)")
        ->check(CLI::Range(1, 86400));
    cmd->add_option("--tool-call-parser", args->tool_call_parser,
                    "How tool_choice auto finds tool calls in the answer: auto (from the chat template), hermes, "
                    "llama3_json, mistral or none (default auto)")
        ->check(CLI::IsMember({"auto", "hermes", "llama3_json", "mistral", "none"}));
    cmd->add_option("--shutdown-timeout", args->shutdown_timeout_s,
                    "On SIGTERM, seconds in-flight requests may take to finish before they are aborted (default 10)")
        ->check(CLI::NonNegativeNumber);
    add_config_layers(cmd);  // --config FILE and PEREGRINE_* for every option above
    return [args] { return run(*args); };
}

}  // namespace peregrine::cli
