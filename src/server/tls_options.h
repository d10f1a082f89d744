// HTTPS, WSS and gRPC over TLS for `serve` (vLLM's --ssl-keyfile / --ssl-certfile /
// --ssl-ca-certs / --ssl-cert-reqs): PEM files, read when the servers start.
#pragma once

#include <string>

namespace peregrine::server {

struct TlsOptions {
    std::string cert_file;  // the server's certificate chain
    std::string key_file;   // its private key
    std::string ca_file;    // CAs that sign client certificates (cert_reqs 1 or 2)
    int cert_reqs = 0;      // client certificates: 0 not asked for, 1 checked when sent, 2 required
    bool enabled() const { return !cert_file.empty(); }
};

// The whole of `path`; throws Error naming `flag` when it cannot be read.
std::string read_pem(const std::string& path, const char* flag);

}  // namespace peregrine::server
