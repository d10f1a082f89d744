// resolve_launch_env (src/dist/launch_env.h): each launcher's variables, the precedence between
// sources, and errors that name the flag or variable at fault. Environments are maps, never the
// process's own.
#include <gtest/gtest.h>

#include "core/error.h"
#include "dist/launch_env.h"

namespace peregrine {
namespace {

std::string error_of(const LaunchFlags& flags, const EnvMap& env) {
    try {
        resolve_launch_env(flags, env);
    } catch (const Error& e) {
        return e.what();
    }
    return "no error";
}

TEST(LaunchEnv, NothingSetIsOneProcess) {
    const LaunchEnv e = resolve_launch_env({}, {{"HOME", "/root"}});
    EXPECT_EQ(e.rank, 0);
    EXPECT_EQ(e.world_size, 1);
    EXPECT_EQ(e.local_rank, 0);
    EXPECT_EQ(e.master_addr, "127.0.0.1");
    EXPECT_EQ(e.master_port, LaunchEnv::kDefaultMasterPort);
    EXPECT_EQ(e.source, "single process");
}

TEST(LaunchEnv, Flags) {
    LaunchFlags f;
    f.nnodes = 2;
    f.node_rank = 1;
    f.master_addr = "10.0.0.5";
    f.master_port = 1234;
    const LaunchEnv e = resolve_launch_env(f, {});
    EXPECT_EQ(e.rank, 1);
    EXPECT_EQ(e.world_size, 2);
    EXPECT_EQ(e.local_rank, 0);
    EXPECT_EQ(e.master_addr, "10.0.0.5");
    EXPECT_EQ(e.master_port, 1234);
    EXPECT_EQ(e.source, "flags");
}

TEST(LaunchEnv, FlagsWithoutAddressUseLoopback) {
    LaunchFlags f;
    f.nnodes = 2;
    f.node_rank = 0;
    EXPECT_EQ(resolve_launch_env(f, {}).master_addr, "127.0.0.1");
}

TEST(LaunchEnv, PeregrineVariables) {
    const LaunchEnv e = resolve_launch_env({}, {{"PEREGRINE_NNODES", "4"},
                                                {"PEREGRINE_NODE_RANK", "3"},
                                                {"PEREGRINE_MASTER_ADDR", "leader.svc"},
                                                {"PEREGRINE_MASTER_PORT", "30000"}});
    EXPECT_EQ(e.rank, 3);
    EXPECT_EQ(e.world_size, 4);
    EXPECT_EQ(e.master_addr, "leader.svc");
    EXPECT_EQ(e.master_port, 30000);
    EXPECT_EQ(e.source, "PEREGRINE_* variables");
}

TEST(LaunchEnv, FlagsWinOverVariablesFieldByField) {
    LaunchFlags f;
    f.node_rank = 1;
    f.master_port = 4000;
    const LaunchEnv e = resolve_launch_env(f, {{"PEREGRINE_NNODES", "2"},
                                               {"PEREGRINE_NODE_RANK", "0"},
                                               {"PEREGRINE_MASTER_ADDR", "h0"},
                                               {"PEREGRINE_MASTER_PORT", "5000"}});
    EXPECT_EQ(e.rank, 1);
    EXPECT_EQ(e.world_size, 2);
    EXPECT_EQ(e.master_addr, "h0");
    EXPECT_EQ(e.master_port, 4000);
    EXPECT_EQ(e.source, "flags and PEREGRINE_* variables");
}

TEST(LaunchEnv, FlagsWinOverLaunchers) {
    LaunchFlags f;
    f.nnodes = 3;
    f.node_rank = 2;
    const LaunchEnv e = resolve_launch_env(f, {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
    EXPECT_EQ(e.rank, 2);
    EXPECT_EQ(e.world_size, 3);
    EXPECT_EQ(e.source, "flags");
}

TEST(LaunchEnv, OpenMpiOnOneHost) {
    const LaunchEnv e = resolve_launch_env({}, {{"OMPI_COMM_WORLD_RANK", "1"},
                                                {"OMPI_COMM_WORLD_SIZE", "2"},
                                                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
    EXPECT_EQ(e.rank, 1);
    EXPECT_EQ(e.world_size, 2);
    EXPECT_EQ(e.local_rank, 1);
    EXPECT_EQ(e.master_addr, "127.0.0.1");
    EXPECT_EQ(e.source, "Open MPI (OMPI_COMM_WORLD_*)");
}

TEST(LaunchEnv, OpenMpiAcrossHostsNeedsAnAddress) {
    const EnvMap env = {{"OMPI_COMM_WORLD_RANK", "0"},
                        {"OMPI_COMM_WORLD_SIZE", "2"},
                        {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                        {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}};
    const std::string err = error_of({}, env);
    EXPECT_NE(err.find("--master-addr"), std::string::npos) << err;
    EXPECT_NE(err.find("PEREGRINE_MASTER_ADDR"), std::string::npos) << err;
    EnvMap with_addr = env;
    with_addr["PEREGRINE_MASTER_ADDR"] = "node0";
    EXPECT_EQ(resolve_launch_env({}, with_addr).master_addr, "node0");
    LaunchFlags f;
    f.master_addr = "node1";
    EXPECT_EQ(resolve_launch_env(f, with_addr).master_addr, "node1");
}

TEST(LaunchEnv, Pmi) {
    const LaunchEnv e = resolve_launch_env({}, {{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}, {"PEREGRINE_MASTER_ADDR", "a"}});
    EXPECT_EQ(e.rank, 2);
    EXPECT_EQ(e.world_size, 3);
    EXPECT_EQ(e.local_rank, 0);
    EXPECT_EQ(e.source, "PMI (PMI_RANK / PMI_SIZE)");
}

TEST(LaunchEnv, Slurm) {
    const LaunchEnv e = resolve_launch_env({}, {{"SLURM_PROCID", "5"},
                                                {"SLURM_NTASKS", "8"},
                                                {"SLURM_LOCALID", "1"},
                                                {"SLURM_NNODES", "4"},
                                                {"SLURM_LAUNCH_NODE_IPADDR", "192.168.1.10"}});
    EXPECT_EQ(e.rank, 5);
    EXPECT_EQ(e.world_size, 8);
    EXPECT_EQ(e.local_rank, 1);
    EXPECT_EQ(e.master_addr, "192.168.1.10");
    EXPECT_EQ(e.source, "Slurm (SLURM_PROCID / SLURM_NTASKS)");
}

TEST(LaunchEnv, SlurmAddressGivenWins) {
    LaunchFlags f;
    f.master_addr = "explicit";
    const LaunchEnv e = resolve_launch_env(
        f, {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LAUNCH_NODE_IPADDR", "192.168.1.10"}});
    EXPECT_EQ(e.master_addr, "explicit");
}

TEST(LaunchEnv, LeaderWorkerSet) {
    const LaunchEnv e = resolve_launch_env(
        {}, {{"LWS_LEADER_ADDRESS", "grp-0.grp.ns"}, {"LWS_GROUP_SIZE", "2"}, {"LWS_WORKER_INDEX", "1"}});
    EXPECT_EQ(e.rank, 1);
    EXPECT_EQ(e.world_size, 2);
    EXPECT_EQ(e.master_addr, "grp-0.grp.ns");
    EXPECT_EQ(e.source, "LeaderWorkerSet (LWS_*)");
}

TEST(LaunchEnv, LauncherOrder) {
    // Open MPI before PMI before Slurm before LWS.
    EnvMap env = {{"OMPI_COMM_WORLD_RANK", "1"},
                  {"OMPI_COMM_WORLD_SIZE", "2"},
                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                  {"PMI_RANK", "0"},
                  {"PMI_SIZE", "3"},
                  {"SLURM_PROCID", "2"},
                  {"SLURM_NTASKS", "4"},
                  {"LWS_GROUP_SIZE", "5"},
                  {"LWS_WORKER_INDEX", "4"},
                  {"LWS_LEADER_ADDRESS", "l"}};
    EXPECT_EQ(resolve_launch_env({}, env).world_size, 2);
    env.erase("OMPI_COMM_WORLD_SIZE");
    env["PEREGRINE_MASTER_ADDR"] = "m";
    EXPECT_EQ(resolve_launch_env({}, env).world_size, 3);
    env.erase("PMI_SIZE");
    EXPECT_EQ(resolve_launch_env({}, env).world_size, 4);
    env.erase("SLURM_PROCID");
    EXPECT_EQ(resolve_launch_env({}, env).world_size, 5);
}

TEST(LaunchEnv, EmptyVariablesCountAsUnset) {
    const LaunchEnv e = resolve_launch_env({}, {{"PEREGRINE_NNODES", ""}, {"OMPI_COMM_WORLD_SIZE", ""}});
    EXPECT_EQ(e.world_size, 1);
}

TEST(LaunchEnv, ErrorsNameTheVariable) {
    EXPECT_EQ(error_of({}, {{"PEREGRINE_NNODES", "two"}, {"PEREGRINE_NODE_RANK", "0"}}),
              "PEREGRINE_NNODES=two is not an integer");
    EXPECT_EQ(error_of({}, {{"PEREGRINE_NNODES", "2"}, {"PEREGRINE_NODE_RANK", "2"}}),
              "PEREGRINE_NODE_RANK=2 must be in [0, 2) (PEREGRINE_NNODES=2)");
    EXPECT_EQ(error_of({}, {{"PEREGRINE_NNODES", "0"}, {"PEREGRINE_NODE_RANK", "0"}}),
              "PEREGRINE_NNODES=0: the number of ranks must be at least 1");
    EXPECT_EQ(error_of({}, {{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "-1"}}),
              "OMPI_COMM_WORLD_RANK=-1 must be in [0, 2) (OMPI_COMM_WORLD_SIZE=2)");
    EXPECT_EQ(error_of({}, {{"SLURM_PROCID", "0"}}),
              "SLURM_PROCID=0 is set but SLURM_NTASKS is not: cannot tell this process's rank");
    EXPECT_EQ(error_of({}, {{"PEREGRINE_MASTER_PORT", "70000"}}),
              "PEREGRINE_MASTER_PORT=70000 is not a TCP port (1 to 65535)");
    EXPECT_EQ(error_of({}, {{"PEREGRINE_MASTER_PORT", "12ab"}}), "PEREGRINE_MASTER_PORT=12ab is not an integer");
    LaunchFlags f;
    f.nnodes = 2;
    f.node_rank = 5;
    EXPECT_EQ(error_of(f, {}), "--node-rank 5 must be in [0, 2) (--nnodes 2)");
    LaunchFlags no_rank;
    no_rank.nnodes = 2;
    EXPECT_EQ(error_of(no_rank, {}),
              "--nnodes 2 needs --node-rank (or PEREGRINE_NODE_RANK): this host's index in [0, 2)");
    LaunchFlags no_size;
    no_size.node_rank = 1;
    EXPECT_EQ(error_of(no_size, {}), "--node-rank 1 needs --nnodes (or PEREGRINE_NNODES) too");
    LaunchFlags port;
    port.master_port = 0;
    EXPECT_EQ(error_of(port, {}), "--master-port 0 is not a TCP port (1 to 65535)");
}

TEST(LaunchEnv, CurrentEnvironmentReadsEnviron) {
    ::setenv("PG_LAUNCH_ENV_TEST", "a=b", 1);
    const EnvMap env = current_environment();
    ::unsetenv("PG_LAUNCH_ENV_TEST");
    ASSERT_EQ(env.count("PG_LAUNCH_ENV_TEST"), 1u);
    EXPECT_EQ(env.at("PG_LAUNCH_ENV_TEST"), "a=b");
}

}  // namespace
}  // namespace peregrine
