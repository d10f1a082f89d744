// What `peregrine serve` configures about the API, for every transport.
#pragma once

#include <string>
#include <vector>

#include "server/admission.h"
#include "server/rate_limit.h"

namespace peregrine::server {

struct OpenAiServerOptions {
    std::vector<std::string> model_names;      // the first is the one reported; requests may name any
    std::vector<std::string> api_keys;         // empty: no authentication
    std::vector<std::string> allowed_origins;  // CORS (HTTP only); "*" for any, empty: no CORS headers
    RateLimitOptions rate_limits;              // per API key, or per client address without keys
    bool access_log = false;                   // one JSON line per request on stderr
    AdmissionLimits limits;                    // per request and in flight, on every transport
    // Behind a proxy that forwards a prefix ("/llm"): paths under it are served as without it
    // (and paths without it still work), as vLLM's --root-path. "" or "/": none.
    std::string root_path;
    bool ui = true;  // the chat page at / (serve --no-ui: 404 there)
};

}  // namespace peregrine::server
