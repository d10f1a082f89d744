// The gRPC API through the real binary: `peregrine serve --port 0 --grpc-port P` on the
// embedded model, called with the generated C++ client; the HTTP API answers alongside.
#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "peregrine/v1/inference.grpc.pb.h"
#include "server/grpc/proto_convert.h"

namespace {

namespace pb = peregrine::v1;
using nlohmann::json;

int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
}

// `peregrine serve` with a gRPC port, running until destroyed.
struct Server {
    pid_t pid = -1;
    FILE* err = nullptr;
    int http_port = 0;
    int grpc_port = 0;
    std::string output;

    explicit Server(std::vector<std::string> extra = {}) {
        grpc_port = free_port();
        int fds[2];
        EXPECT_EQ(::pipe(fds), 0);
        std::vector<std::string> args{PG_BINARY, "serve", "--port", "0", "--grpc-port", std::to_string(grpc_port)};
        args.insert(args.end(), extra.begin(), extra.end());
        pid = ::fork();
        if (pid == 0) {
            ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // no orphan server when a test dies
            ::dup2(fds[1], STDERR_FILENO);
            ::close(fds[0]);
            ::close(fds[1]);
            std::vector<char*> argv;
            for (std::string& a : args) argv.push_back(a.data());
            argv.push_back(nullptr);
            ::execv(PG_BINARY, argv.data());
            ::_exit(127);
        }
        ::close(fds[1]);
        err = ::fdopen(fds[0], "r");
        char line[4096];
        while (std::fgets(line, sizeof(line), err)) {
            output += line;
            const std::string l = line;
            if (l.rfind("ready: ", 0) == 0) {
                const size_t at = l.find("127.0.0.1:");
                http_port = std::stoi(l.substr(at + 10));
                break;
            }
        }
    }
    ~Server() {
        if (pid > 0) {
            ::kill(pid, SIGTERM);
            int status = 0;
            ::waitpid(pid, &status, 0);
        }
        if (err) std::fclose(err);
    }

    std::unique_ptr<pb::Inference::Stub> stub() const { return pb::Inference::NewStub(channel()); }
    std::shared_ptr<grpc::Channel> channel() const {
        return grpc::CreateChannel("127.0.0.1:" + std::to_string(grpc_port), grpc::InsecureChannelCredentials());
    }

    // One HTTP/1.1 request with Connection: close; the body of the answer.
    std::string http(const std::string& method, const std::string& path, const std::string& body = "") const {
        const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(static_cast<uint16_t>(http_port));
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
            ::close(fd);
            return "";
        }
        const std::string req = method + " " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n" +
                                "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                                "\r\n\r\n" + body;
        size_t sent = 0;
        while (sent < req.size()) {
            const ssize_t n = ::send(fd, req.data() + sent, req.size() - sent, 0);
            if (n <= 0) break;
            sent += static_cast<size_t>(n);
        }
        std::string resp;
        char buf[4096];
        ssize_t n;
        while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) resp.append(buf, static_cast<size_t>(n));
        ::close(fd);
        const size_t at = resp.find("\r\n\r\n");
        return at == std::string::npos ? "" : resp.substr(at + 4);
    }
};

struct Streamed {
    std::string text;
    std::vector<pb::GenerateResponse> messages;
    grpc::Status status;
};

Streamed generate(pb::Inference::Stub& stub, const pb::GenerateRequest& req, const std::string& key = "") {
    grpc::ClientContext ctx;
    if (!key.empty()) ctx.AddMetadata("authorization", "Bearer " + key);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto reader = stub.Generate(&ctx, req);
    Streamed s;
    pb::GenerateResponse r;
    while (reader->Read(&r)) {
        s.text += r.text();
        s.messages.push_back(r);
    }
    s.status = reader->Finish();
    return s;
}

pb::GenerateRequest greedy(const std::string& prompt, uint32_t max_tokens) {
    pb::GenerateRequest req;
    req.set_prompt(prompt);
    req.set_temperature(0);
    req.set_max_tokens(max_tokens);
    return req;
}

TEST(GrpcApi, GreedyGenerateMatchesHttp) {
    Server srv;
    ASSERT_GT(srv.http_port, 0) << srv.output;
    auto stub = srv.stub();
    const Streamed s = generate(*stub, greedy("Once upon a time", 24));
    ASSERT_TRUE(s.status.ok()) << s.status.error_message();
    ASSERT_FALSE(s.messages.empty());
    EXPECT_FALSE(s.messages.back().finish_reason().empty());
    ASSERT_TRUE(s.messages.back().has_usage());
    EXPECT_GT(s.messages.back().usage().prompt_tokens(), 0u);
    size_t tokens = 0;
    for (const auto& m : s.messages) tokens += static_cast<size_t>(m.token_ids_size());
    EXPECT_EQ(tokens, s.messages.back().usage().completion_tokens());

    const json http = json::parse(
        srv.http("POST", "/v1/completions", R"({"prompt": "Once upon a time", "temperature": 0, "max_tokens": 24})"));
    EXPECT_EQ(s.text, http["choices"][0]["text"].get<std::string>());
    EXPECT_EQ(s.messages.back().finish_reason(), http["choices"][0]["finish_reason"].get<std::string>());
    EXPECT_FALSE(s.text.empty());
}

TEST(GrpcApi, HealthServingAndUnaryCalls) {
    Server srv;
    ASSERT_GT(srv.http_port, 0) << srv.output;
    // grpc.health.v1.Health/Check with an empty HealthCheckRequest; SERVING is field 1 = 1.
    grpc::GenericStub generic(srv.channel());
    grpc::ClientContext ctx;
    grpc::Slice empty("", 0);
    grpc::ByteBuffer request(&empty, 1), response;
    std::promise<grpc::Status> done;
    generic.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                      [&](grpc::Status st) { done.set_value(st); });
    const grpc::Status st = done.get_future().get();
    ASSERT_TRUE(st.ok()) << st.error_message();
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(response.Dump(&slices).ok());
    std::string bytes;
    for (const auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    EXPECT_EQ(bytes, std::string("\x08\x01", 2));

    auto stub = srv.stub();
    {
        grpc::ClientContext c;
        pb::ListModelsResponse r;
        ASSERT_TRUE(stub->ListModels(&c, pb::ListModelsRequest(), &r).ok());
        ASSERT_EQ(r.models_size(), 1);
        EXPECT_EQ(r.models(0).id(), "stories260K");
    }
    pb::TokenizeResponse toks;
    {
        grpc::ClientContext c;
        pb::TokenizeRequest req;
        req.set_prompt("Once upon a time");
        ASSERT_TRUE(stub->Tokenize(&c, req, &toks).ok());
        EXPECT_GT(toks.count(), 0u);
    }
    {
        grpc::ClientContext c;
        pb::DetokenizeRequest req;
        *req.mutable_token_ids() = toks.token_ids();
        pb::DetokenizeResponse r;
        ASSERT_TRUE(stub->Detokenize(&c, req, &r).ok());
        EXPECT_NE(r.text().find("Once upon a time"), std::string::npos) << r.text();
    }
}

TEST(GrpcApi, ErrorCodes) {
    Server srv;
    ASSERT_GT(srv.http_port, 0) << srv.output;
    auto stub = srv.stub();
    pb::GenerateRequest bad = greedy("Once upon a time", 8);
    bad.set_temperature(-1);
    Streamed s = generate(*stub, bad);
    EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.status.error_message().find("temperature"), std::string::npos) << s.status.error_message();

    s = generate(*stub, pb::GenerateRequest());
    EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

    pb::GenerateRequest ids;
    ids.add_prompt_ids(1u << 30);
    s = generate(*stub, ids);
    EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

    pb::GenerateRequest unknown = greedy("Once upon a time", 8);
    unknown.set_model("no-such-model");
    s = generate(*stub, unknown);
    EXPECT_EQ(s.status.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_TRUE(s.messages.empty());
}

TEST(GrpcApi, ApiKeys) {
    Server srv({"--api-key", "sesame"});
    ASSERT_GT(srv.http_port, 0) << srv.output;
    auto stub = srv.stub();
    EXPECT_EQ(generate(*stub, greedy("Once", 4)).status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(generate(*stub, greedy("Once", 4), "wrong").status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_TRUE(generate(*stub, greedy("Once", 4), "sesame").status.ok());
}

TEST(GrpcApi, CancelledStreamLeavesNothingRunning) {
    Server srv;
    ASSERT_GT(srv.http_port, 0) << srv.output;
    auto stub = srv.stub();
    for (int i = 0; i < 4; ++i) {
        grpc::ClientContext ctx;
        pb::GenerateRequest req = greedy("Once upon a time", 200);
        req.set_ignore_eos(true);
        auto reader = stub->Generate(&ctx, req);
        pb::GenerateResponse r;
        EXPECT_TRUE(reader->Read(&r));
        ctx.TryCancel();
        while (reader->Read(&r)) {
        }
        const grpc::Status st = reader->Finish();
        EXPECT_TRUE(st.ok() || st.error_code() == grpc::StatusCode::CANCELLED) << st.error_message();
    }
    // An expired deadline also ends the request.
    {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(1));
        pb::GenerateRequest req = greedy("Once upon a time", 200);
        req.set_ignore_eos(true);
        auto reader = stub->Generate(&ctx, req);
        pb::GenerateResponse r;
        while (reader->Read(&r)) {
        }
        reader->Finish();
    }
    json h;
    for (int i = 0; i < 200; ++i) {
        h = json::parse(srv.http("GET", "/health"));
        if (h["running"] == 0 && h["requests_in_flight"] == 0 && h["waiting"] == 0) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(h["running"], 0) << h.dump();
    EXPECT_EQ(h["waiting"], 0) << h.dump();
    EXPECT_EQ(h["requests_in_flight"], 0) << h.dump();
}

TEST(GrpcApi, ManyConcurrentStreams) {
    Server srv;
    ASSERT_GT(srv.http_port, 0) << srv.output;
    auto channel = srv.channel();
    constexpr int kStreams = 256;
    std::vector<grpc::Status> statuses(kStreams);
    std::vector<std::string> texts(kStreams);
    std::vector<std::thread> threads;
    for (int i = 0; i < kStreams; ++i)
        threads.emplace_back([&, i] {
            auto stub = pb::Inference::NewStub(channel);
            const Streamed s = generate(*stub, greedy("Once upon a time", 16));
            statuses[i] = s.status;
            texts[i] = s.text;
        });
    for (auto& t : threads) t.join();
    for (int i = 0; i < kStreams; ++i) {
        EXPECT_TRUE(statuses[i].ok()) << i << ": " << statuses[i].error_message();
        EXPECT_EQ(texts[i], texts[0]) << i;
    }
}

}  // namespace

// The proto's fields reach the same request the HTTP API builds: prompt_cache_key (issue #21's
// conversation caches) and the priority.
TEST(GrpcConvert, PromptCacheKeyAndPriorityReachTheRequest) {
    pb::GenerateRequest req;
    req.set_prompt("Once upon a time");
    req.set_prompt_cache_key("conversation-7");
    req.set_priority(-3);
    const peregrine::server::CompletionParams c =
        peregrine::server::completion_params_from_proto(req, peregrine::SamplingLimits{});
    EXPECT_EQ(c.prompt_cache_key, "conversation-7");
    EXPECT_EQ(c.priority, -3);
    req.clear_prompt_cache_key();
    EXPECT_EQ(peregrine::server::completion_params_from_proto(req, peregrine::SamplingLimits{}).prompt_cache_key, "");
}
