#include "cli/tls_flags.h"

#include "core/error.h"
#include "server/http/http_server.h"

namespace peregrine::cli {

void add_tls_flags(CLI::App* cmd, server::TlsOptions& tls) {
    cmd->add_option("--ssl-certfile", tls.cert_file,
                    "TLS: the server's certificate chain (PEM); with --ssl-keyfile the HTTP API (SSE, WebSocket) and "
                    "gRPC serve TLS only (default: plain)")
        ->check(CLI::ExistingFile);
    cmd->add_option("--ssl-keyfile", tls.key_file, "TLS: the private key of --ssl-certfile (PEM)")
        ->check(CLI::ExistingFile);
    cmd->add_option("--ssl-ca-certs", tls.ca_file, "TLS: CA certificates that sign client certificates (PEM)")
        ->check(CLI::ExistingFile);
    cmd->add_option(
           "--ssl-cert-reqs", tls.cert_reqs,
           "TLS: client certificates: 0 not asked for, 1 verified when sent, 2 required (needs --ssl-ca-certs; "
           "default 0)")
        ->check(CLI::Range(0, 2));
}

void check_tls_flags(const server::TlsOptions& tls) {
    if (tls.cert_file.empty() != tls.key_file.empty())
        fail(tls.cert_file.empty() ? "--ssl-keyfile needs --ssl-certfile" : "--ssl-certfile needs --ssl-keyfile");
    if (!tls.enabled() && (!tls.ca_file.empty() || tls.cert_reqs != 0))
        fail("--ssl-ca-certs / --ssl-cert-reqs need --ssl-certfile and --ssl-keyfile");
    if (tls.cert_reqs != 0 && tls.ca_file.empty())
        fail("--ssl-cert-reqs ", tls.cert_reqs, " needs --ssl-ca-certs (the CAs that sign client certificates)");
    if (tls.enabled()) server::check_tls_files(tls);
}

std::string base_url(const server::TlsOptions& tls, const std::string& host, int port) {
    return str_cat(tls.enabled() ? "https://" : "http://",
                   host.find(':') != std::string::npos ? "[" + host + "]" : host, ":", port);
}

}  // namespace peregrine::cli
