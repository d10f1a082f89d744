// Errors a client sees: an HTTP status and OpenAI's body
// {"error": {"message", "type", "param", "code"}}.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "core/error.h"

namespace peregrine::server {

class ApiError : public std::runtime_error {
  public:
    ApiError(int status, std::string message, std::string param = {}, std::string code = {}, std::string type = {})
        : std::runtime_error(message),
          status_(status),
          param_(std::move(param)),
          code_(std::move(code)),
          type_(type.empty() ? default_type(status) : std::move(type)) {}

    int status() const { return status_; }
    const std::string& param() const { return param_; }
    const std::string& code() const { return code_; }
    const std::string& type() const { return type_; }
    // 429 and 503: seconds the client should wait (sent as Retry-After), 0 for none.
    int retry_after_s() const { return retry_after_s_; }
    ApiError& with_retry_after(int seconds) {
        retry_after_s_ = seconds;
        return *this;
    }

    // {"error": {...}}; empty param and code become null.
    nlohmann::ordered_json body() const {
        nlohmann::ordered_json e = {
            {"message", what()},
            {"type", type_},
            {"param", param_.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(param_)},
            {"code", code_.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(code_)}};
        return {{"error", e}};
    }

    static std::string default_type(int status) {
        if (status == 401) return "authentication_error";
        if (status == 404) return "not_found_error";
        if (status == 429) return "rate_limit_error";
        if (status >= 500) return status == 503 ? "service_unavailable" : "server_error";
        return "invalid_request_error";
    }

  private:
    int status_;
    std::string param_;
    std::string code_;
    std::string type_;
    int retry_after_s_ = 0;
};

// Inside a catch block: what a client is told about the exception being handled (every
// transport): ApiError as it is, a template's raise_exception and other Error as 400, anything
// else (a bug) as 500, logged.
ApiError current_api_error();

// 400 naming the request field at fault.
template <typename... Args>
[[noreturn]] void bad_param(const std::string& param, Args&&... args) {
    throw ApiError(400, str_cat(std::forward<Args>(args)...), param);
}

}  // namespace peregrine::server
