#include "server/openai/route_table.h"

#include "core/error.h"
#include "server/api_error.h"

namespace peregrine::server {

const Route* RouteTable::find(std::string_view path) const {
    for (const Route& r : routes_)
        if (r.prefix ? path.starts_with(r.path) : path == r.path) return &r;
    return nullptr;
}

const Route* RouteTable::find_ws(std::string_view type) const {
    if (type.empty()) return nullptr;
    for (const Route& r : routes_)
        if (r.ws_type == type) return &r;
    return nullptr;
}

void RouteTable::check_method(const Route& route, std::string_view method, std::string_view path) {
    if (method == route.method || (method == "HEAD" && route.method == "GET")) return;
    throw ApiError(405, str_cat("method ", method, " is not allowed on ", path, "; use ", route.method), "",
                   "method_not_allowed");
}

}  // namespace peregrine::server
