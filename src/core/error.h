// Error handling: `Error` for bad input (model files, user arguments), `PG_CHECK` for bugs.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace peregrine {

// Thrown for input that is wrong (a malformed model file, a bad argument). The message names
// the file and the tensor or key; callers at the edge (CLI, server) turn it into an exit code
// or an error response.
class Error : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

template <typename... Args>
std::string str_cat(Args&&... args) {
    if constexpr (sizeof...(Args) == 0) {
        return {};
    } else {
        std::ostringstream os;
        (os << ... << std::forward<Args>(args));
        return os.str();
    }
}

template <typename... Args>
[[noreturn]] void fail(Args&&... args) {
    throw Error(str_cat(std::forward<Args>(args)...));
}

namespace detail {
[[noreturn]] void check_failed(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace detail

}  // namespace peregrine

// A violated invariant is a bug: print file:line and abort.
#define PG_CHECK(cond, ...)                                                                                  \
    do {                                                                                                     \
        if (!(cond)) [[unlikely]]                                                                            \
            ::peregrine::detail::check_failed(__FILE__, __LINE__, #cond, ::peregrine::str_cat(__VA_ARGS__)); \
    } while (0)
