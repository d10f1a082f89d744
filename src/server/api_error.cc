#include "server/api_error.h"

#include <cstdio>

#include "template/jinja.h"

namespace peregrine::server {

ApiError current_api_error() {
    try {
        throw;
    } catch (const ApiError& e) {
        return e;
    } catch (const jinja::RaisedError& e) {
        return ApiError(400, e.what(), "messages", "chat_template_error");
    } catch (const Error& e) {
        return ApiError(400, e.what());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "server: request failed: %s\n", e.what());
        return ApiError(500, "internal error while handling the request", "", "internal_error");
    }
}

}  // namespace peregrine::server
