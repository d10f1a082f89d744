// One HTTP request as the server's handlers see it: Beast's message copied into plain strings
// (header names lower case), so that nothing above src/server/http needs Beast.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace peregrine::server {

struct HttpRequest {
    std::string method;                                        // "GET", "POST", ...
    std::string path;                                          // the target without its query
    std::string query;                                         // after '?', raw (not decoded); "" without
    std::vector<std::pair<std::string, std::string>> headers;  // names lower case
    std::string body;
    std::string remote;              // "ip:port"
    std::string request_id;          // the client's X-Request-Id, else a new one; sent back with the response
    bool websocket_upgrade = false;  // a WebSocket handshake (GET with Upgrade: websocket)

    // The first header named `lower_name`, "" when absent.
    std::string_view header(std::string_view lower_name) const {
        for (const auto& [k, v] : headers)
            if (k == lower_name) return v;
        return {};
    }
};

// Response headers a handler adds: (name, value) in the order they are sent.
using HeaderList = std::vector<std::pair<std::string, std::string>>;

}  // namespace peregrine::server
