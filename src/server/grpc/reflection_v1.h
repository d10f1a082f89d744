// gRPC server reflection v1 (grpc.reflection.v1.ServerReflection), beside the v1alpha service
// that grpc++'s plugin registers: Debian's grpc++ 1.51 has no v1, which current clients
// (grpcurl, Postman, grpc-js tools) ask for first. Answers from the process's generated
// descriptor pool: list_services, file_by_filename, file_containing_symbol,
// file_containing_extension and all_extension_numbers_of_type; anything not in the pool gets an
// error_response NOT_FOUND (as v1alpha's does), never a failed stream.
#pragma once

#include <string>
#include <vector>

#include <grpc/reflection/v1/reflection.grpc.pb.h>  // generated from proto/grpc/reflection/v1

namespace peregrine::server {

class ReflectionV1 final : public grpc::reflection::v1::ServerReflection::Service {
  public:
    // `services`: the fully qualified names list_services reports.
    explicit ReflectionV1(std::vector<std::string> services) : services_(std::move(services)) {}

    grpc::Status ServerReflectionInfo(
        grpc::ServerContext* context,
        grpc::ServerReaderWriter<grpc::reflection::v1::ServerReflectionResponse,
                                 grpc::reflection::v1::ServerReflectionRequest>* stream) override;

  private:
    std::vector<std::string> services_;
};

}  // namespace peregrine::server
