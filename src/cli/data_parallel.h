// `peregrine serve --data-parallel-size N`: N replicas of this command (one process each, on
// 127.0.0.1 at free ports: each on its own GPU when there are N, else sharing GPU 0 with 1/N of
// --gpu-memory-utilization each, or on the CPU with 1/N of the cores each) and the cache-aware
// router in this process on --host/--port. A replica that dies is started again; SIGTERM drains
// the router, then stops the replicas.
#pragma once

#include <string>
#include <vector>

#include "cli/router_front.h"
#include "peregrine/engine_config.h"

namespace peregrine::cli {

struct DataParallelOptions {
    int size = 1;
    EngineConfig engine;  // the replicas' (device, threads, memory share, KV-event endpoints)
    RouterFront front;
    std::vector<std::string> api_keys;
    std::string model_name;  // for the ready line
    std::string kv_events_endpoint, kv_events_replay_endpoint;
    double shutdown_timeout_s = 10;
};

int run_data_parallel(const DataParallelOptions& o);

// `endpoint` (tcp://HOST:PORT) with its port moved up by `by` (vLLM: each data-parallel rank
// publishes its KV events on the port plus its rank); unchanged when it has no port.
std::string shift_endpoint_port(const std::string& endpoint, int by);

}  // namespace peregrine::cli
