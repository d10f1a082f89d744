// The gRPC API (proto/peregrine/v1/inference.proto) on the same CompletionService as the HTTP
// API: a GenerateRequest becomes the same typed request (proto_convert.h), passes the same
// admission, and is streamed through the shared StreamPump by callback reactors (no thread per
// stream). Also the standard grpc.health.v1.Health service and server reflection (v1alpha from
// grpc++, v1 of our own: reflection_v1.h).
#pragma once

#include <memory>
#include <string>

#include "server/openai/completion_service.h"
#include "server/tls_options.h"

namespace grpc {
class Server;
}

namespace peregrine::server {

class InferenceService;
class ReflectionV1;

struct GrpcServerOptions {
    std::string host = "127.0.0.1";
    int port = 0;    // 0 = off
    TlsOptions tls;  // TLS when enabled (the same files as HTTPS)
};

class GrpcServer {
  public:
    GrpcServer(GrpcServerOptions options, std::shared_ptr<CompletionService> service);
    ~GrpcServer();  // stop()

    // Binds and starts serving (health NOT_SERVING until set_serving(true)); throws Error when
    // the port cannot be bound.
    void start();
    void set_serving(bool serving);
    // Cancels what is running and stops the server.
    void stop();
    int port() const { return port_; }

  private:
    GrpcServerOptions options_;
    std::shared_ptr<CompletionService> service_;
    std::unique_ptr<InferenceService> inference_;
    std::unique_ptr<ReflectionV1> reflection_v1_;
    std::unique_ptr<grpc::Server> server_;
    int port_ = 0;
};

}  // namespace peregrine::server
