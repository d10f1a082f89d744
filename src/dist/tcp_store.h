// The rendezvous of a multi-process group: rank 0 listens on master_port (every interface) and
// keeps a key/value map; every rank, rank 0 included, connects to it (retrying until the timeout,
// since ranks start in any order) and sets and waits for keys. Used to hand out the NCCL unique
// id and to check that every rank loaded the same model with the same options.
//
// Protocol (plain POSIX sockets, one connection per rank, blocking request/reply): frames of
// [u8 op][u32 len][bytes][u32 len][bytes], lengths little-endian, so keys and values may hold any
// bytes. HELLO(rank, world size) first, then SET(key, value) and GET(key, timeout ms), BYE before
// a clean close; replies are OK(value) or ERR(message). The server holds a GET until the key is
// set, its timeout passes (the reply names the ranks that never connected), or a rank drops its
// connection without BYE (the reply names that rank: every later wait fails the same way).
#pragma once

#include <chrono>
#include <memory>
#include <string>

namespace peregrine {

class TcpStoreServer;

class TcpStore {
  public:
    struct Options {
        std::string master_addr = "127.0.0.1";  // rank 0's host, name or IP (rank 0 connects to 127.0.0.1)
        int master_port = 29500;                // 0 on rank 0: an ephemeral port (tests; see port())
        int rank = 0;
        int world_size = 1;
        // How long to keep trying to reach rank 0, and how long each get waits for its key.
        std::chrono::milliseconds timeout = std::chrono::minutes(5);
    };

    // Rank 0 starts the server (throws Error if the port is taken), then every rank connects.
    // Throws Error naming the address when rank 0 cannot be reached within the timeout, or when
    // the server refuses this rank (rank out of range, taken twice, another world size).
    explicit TcpStore(const Options& options);
    // Says BYE and closes; on rank 0 also stops the server, so ranks still waiting fail with a
    // message naming rank 0. Rank 0 keeps its store as long as the group lives.
    ~TcpStore();
    TcpStore(const TcpStore&) = delete;
    TcpStore& operator=(const TcpStore&) = delete;

    int rank() const { return options_.rank; }
    int world_size() const { return options_.world_size; }
    // The port rank 0's server listens on (the ephemeral one when master_port was 0).
    int port() const { return port_; }

    void set(const std::string& key, const std::string& value);
    // Waits until some rank has set `key`; throws Error on timeout (naming ranks that never
    // connected) or when a rank disconnected first (naming it).
    std::string get(const std::string& key);

    // Every rank calls it with its fingerprint (model path and options): returns when all are
    // equal, otherwise throws on every rank an Error naming the first rank that differs from
    // rank 0 and both values.
    void check_fingerprint(const std::string& fingerprint);

    // Rank 0 only: the first failure the server saw ("rank 2 disconnected ..."), or "" while every
    // rank that connected is still there or left cleanly. Lets rank 0 stop the group when a
    // worker dies.
    std::string failure() const;

  private:
    std::string request(char op, const std::string& a, const std::string& b, std::chrono::milliseconds wait);

    Options options_;
    int port_ = 0;
    int fd_ = -1;                             // this rank's connection to the server
    int fingerprint_generation_ = 0;          // check_fingerprint calls so far (keys of each call differ)
    std::unique_ptr<TcpStoreServer> server_;  // rank 0 only
};

}  // namespace peregrine
