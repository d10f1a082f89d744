#include "server/grpc/reflection_v1.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>

#include <set>

namespace peregrine::server {

namespace rv1 = grpc::reflection::v1;
using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;

namespace {

constexpr int kNotFound = 5;  // grpc::StatusCode::NOT_FOUND

// `file`, then its dependencies (depth first), each once in the response (`sent`), as v1alpha.
void add_file(const FileDescriptor* file, std::set<std::string>& sent, rv1::FileDescriptorResponse& out) {
    if (!sent.insert(file->name()).second) return;
    google::protobuf::FileDescriptorProto proto;
    file->CopyTo(&proto);
    proto.SerializeToString(out.add_file_descriptor_proto());
    for (int i = 0; i < file->dependency_count(); ++i) add_file(file->dependency(i), sent, out);
}

void not_found(rv1::ServerReflectionResponse& res, const std::string& what) {
    res.mutable_error_response()->set_error_code(kNotFound);
    res.mutable_error_response()->set_error_message(what + " not found");
}

}  // namespace

grpc::Status ReflectionV1::ServerReflectionInfo(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<rv1::ServerReflectionResponse, rv1::ServerReflectionRequest>* stream) {
    const DescriptorPool* pool = DescriptorPool::generated_pool();
    rv1::ServerReflectionRequest req;
    while (!context->IsCancelled() && stream->Read(&req)) {
        std::set<std::string> sent;  // files in this response
        rv1::ServerReflectionResponse res;
        res.set_valid_host(req.host());
        *res.mutable_original_request() = req;
        switch (req.message_request_case()) {
            case rv1::ServerReflectionRequest::kListServices:
                for (const std::string& s : services_) res.mutable_list_services_response()->add_service()->set_name(s);
                break;
            case rv1::ServerReflectionRequest::kFileByFilename:
                if (const FileDescriptor* f = pool->FindFileByName(req.file_by_filename()))
                    add_file(f, sent, *res.mutable_file_descriptor_response());
                else
                    not_found(res, "file " + req.file_by_filename());
                break;
            case rv1::ServerReflectionRequest::kFileContainingSymbol:
                if (const FileDescriptor* f = pool->FindFileContainingSymbol(req.file_containing_symbol()))
                    add_file(f, sent, *res.mutable_file_descriptor_response());
                else
                    not_found(res, "symbol " + req.file_containing_symbol());
                break;
            case rv1::ServerReflectionRequest::kFileContainingExtension: {
                const auto& e = req.file_containing_extension();
                const auto* type = pool->FindMessageTypeByName(e.containing_type());
                const auto* ext = type ? pool->FindExtensionByNumber(type, e.extension_number()) : nullptr;
                if (ext)
                    add_file(ext->file(), sent, *res.mutable_file_descriptor_response());
                else
                    not_found(res, "extension " + std::to_string(e.extension_number()) + " of " + e.containing_type());
                break;
            }
            case rv1::ServerReflectionRequest::kAllExtensionNumbersOfType: {
                const auto* type = pool->FindMessageTypeByName(req.all_extension_numbers_of_type());
                if (!type) {
                    not_found(res, "type " + req.all_extension_numbers_of_type());
                    break;
                }
                std::vector<const google::protobuf::FieldDescriptor*> exts;
                pool->FindAllExtensions(type, &exts);
                auto* out = res.mutable_all_extension_numbers_response();
                out->set_base_type_name(type->full_name());
                for (const auto* x : exts) out->add_extension_number(x->number());
                break;
            }
            default:
                res.mutable_error_response()->set_error_code(static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
                res.mutable_error_response()->set_error_message("no request in the message");
        }
        if (!stream->Write(res)) break;
    }
    return grpc::Status::OK;
}

}  // namespace peregrine::server
