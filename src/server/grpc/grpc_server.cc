#include "server/grpc/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "core/error.h"
#include "server/grpc/inference_service.h"

namespace peregrine::server {

GrpcServer::GrpcServer(GrpcServerOptions options, std::shared_ptr<CompletionService> service)
    : options_(std::move(options)), service_(std::move(service)) {}

GrpcServer::~GrpcServer() {
    stop();
}

void GrpcServer::start() {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    inference_ = std::make_unique<InferenceService>(*service_);
    grpc::ServerBuilder builder;
    const std::string host = options_.host.find(':') != std::string::npos ? "[" + options_.host + "]" : options_.host;
    builder.AddListeningPort(str_cat(host, ":", options_.port), grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(inference_.get());
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
