#include "server/grpc/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "core/error.h"
#include "server/grpc/inference_service.h"
#include "server/grpc/reflection_v1.h"

namespace peregrine::server {

GrpcServer::GrpcServer(GrpcServerOptions options, std::shared_ptr<CompletionService> service)
    : options_(std::move(options)), service_(std::move(service)) {}

GrpcServer::~GrpcServer() {
    stop();
}

namespace {

std::shared_ptr<grpc::ServerCredentials> credentials(const TlsOptions& tls) {
    if (!tls.enabled()) return grpc::InsecureServerCredentials();
    static const grpc_ssl_client_certificate_request_type kRequests[] = {
        GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE, GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY,
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY};
    grpc::SslServerCredentialsOptions o(kRequests[tls.cert_reqs]);
    o.pem_key_cert_pairs.push_back(
        {read_pem(tls.key_file, "--ssl-keyfile"), read_pem(tls.cert_file, "--ssl-certfile")});
    if (!tls.ca_file.empty()) o.pem_root_certs = read_pem(tls.ca_file, "--ssl-ca-certs");
    return grpc::SslServerCredentials(o);
}

}  // namespace

void GrpcServer::start() {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    inference_ = std::make_unique<InferenceService>(*service_);
    grpc::ServerBuilder builder;
    const std::string host = options_.host.find(':') != std::string::npos ? "[" + options_.host + "]" : options_.host;
    builder.AddListeningPort(str_cat(host, ":", options_.port), credentials(options_.tls), &port_);
    builder.RegisterService(inference_.get());
    reflection_v1_ = std::make_unique<ReflectionV1>(
        std::vector<std::string>{"peregrine.v1.Inference", "grpc.health.v1.Health",
                                 "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"});
    builder.RegisterService(reflection_v1_.get());
    server_ = builder.BuildAndStart();
    if (!server_ || port_ == 0) {
        server_.reset();
        throw Error(str_cat("cannot listen for gRPC on ", host, ":", options_.port));
    }
    set_serving(false);
}

void GrpcServer::set_serving(bool serving) {
    // The server's overall status ("") and the service's own name, which health checkers such
    // as Kubernetes' gRPC probe may ask for.
    if (server_ && server_->GetHealthCheckService()) {
        server_->GetHealthCheckService()->SetServingStatus(serving);
        server_->GetHealthCheckService()->SetServingStatus("peregrine.v1.Inference", serving);
    }
}

void GrpcServer::stop() {
    if (!server_) return;
    set_serving(false);
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
    server_.reset();
}

}  // namespace peregrine::server
