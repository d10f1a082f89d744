#include "server/http/connections.h"

#include <cstdio>
#include <random>

#include <malloc.h>

#include "server/api_error.h"

namespace peregrine::server {

void Connections::release_body(int64_t n) {
    if (body_bytes.fetch_sub(n) - n == 0 && since_trim.load() > (int64_t{64} << 20)) {
        since_trim.store(0);
        malloc_trim(0);
    }
}

std::string new_request_id() {
    static std::atomic<uint64_t> next{0};
    thread_local const uint64_t salt = std::random_device{}();
    char buf[40];
    std::snprintf(buf, sizeof(buf), "req-%08llx%08llx", static_cast<unsigned long long>(salt & 0xffffffff),
                  static_cast<unsigned long long>(next.fetch_add(1)));
    return buf;
}

// The OpenAI error body for what the HTTP layer refuses itself (type from the status, as ApiError).
std::string error_json(int status, const char* message, const char* code) {
    return ApiError(status, message, "", code).body().dump();
}

}  // namespace peregrine::server
