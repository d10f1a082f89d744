// The --ssl-* flags of `serve` and `router` (vLLM's names) and their checks.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "server/tls_options.h"

namespace peregrine::cli {

void add_tls_flags(CLI::App* cmd, server::TlsOptions& tls);
// Throws Error naming the flag for a combination that cannot work, and (TLS on) for files that
// cannot be used: unreadable, not PEM, a key that is not the certificate's. Before anything slow.
void check_tls_flags(const server::TlsOptions& tls);
// "https://HOST:PORT" with TLS, else "http://HOST:PORT" (an IPv6 host in brackets).
std::string base_url(const server::TlsOptions& tls, const std::string& host, int port);

}  // namespace peregrine::cli
