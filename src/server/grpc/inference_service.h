// The gRPC service peregrine.v1.Inference (proto/peregrine/v1/inference.proto) over the shared
// CompletionService: Generate (streamed), Tokenize, Detokenize, ListModels. Every call passes
// the same admission as the HTTP API (API key from the "authorization" metadata, rate limits).
#pragma once

#include "peregrine/v1/inference.grpc.pb.h"
#include "server/openai/completion_service.h"

namespace peregrine::server {

class InferenceService final : public ::peregrine::v1::Inference::CallbackService {
  public:
    explicit InferenceService(CompletionService& service) : service_(service) {}

    grpc::ServerWriteReactor<::peregrine::v1::GenerateResponse>* Generate(
        grpc::CallbackServerContext* ctx, const ::peregrine::v1::GenerateRequest* req) override;
    grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx, const ::peregrine::v1::TokenizeRequest* req,
                                       ::peregrine::v1::TokenizeResponse* resp) override;
    grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* ctx,
                                         const ::peregrine::v1::DetokenizeRequest* req,
                                         ::peregrine::v1::DetokenizeResponse* resp) override;
    grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* ctx, const ::peregrine::v1::ListModelsRequest*,
                                         ::peregrine::v1::ListModelsResponse* resp) override;

  private:
    CompletionService& service_;
};

}  // namespace peregrine::server
