#include "server/tls_options.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace peregrine::server {

std::string read_pem(const std::string& path, const char* flag) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(flag, " ", path, ": ", std::strerror(errno));
    std::ostringstream s;
    s << in.rdbuf();
    if (s.str().find("-----BEGIN ") == std::string::npos) fail(flag, " ", path, ": not a PEM file");
    return s.str();
}

}  // namespace peregrine::server
