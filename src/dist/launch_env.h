// Where this process sits in a multi-process launch: its rank among the launched processes, how
// many there are, its index on its host, and where rank 0's rendezvous store listens.
//
// One process per host across hosts (each spawns its own per-GPU ranks), started by whatever the
// user already has. The first source that names a world wins, in this order:
//   1. explicit flags (--nnodes, --node-rank, --master-addr, --master-port), field by field over
//   2. PEREGRINE_NNODES, PEREGRINE_NODE_RANK, PEREGRINE_MASTER_ADDR, PEREGRINE_MASTER_PORT
//      (vLLM / SGLang spelling; a Kubernetes LeaderWorkerSet maps LWS_* onto these in its YAML);
//   3. Open MPI's mpirun: OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK (/ _LOCAL_SIZE);
//   4. PMI (MPICH / Hydra, Intel MPI): PMI_RANK / PMI_SIZE (+ MPI_LOCALRANKID, MPI_LOCALNRANKS);
//   5. Slurm's srun: SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID, master SLURM_LAUNCH_NODE_IPADDR;
//   6. a LeaderWorkerSet pod as is: LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, LWS_WORKER_INDEX;
//   7. none of them: a single process, rank 0 of 1.
// The master address and port, when flags or PEREGRINE_* give them, override what a launcher
// gives, whichever source named the world. Without any, a world whose ranks all share one host
// (or a world of 1) uses 127.0.0.1; a multi-host world with no address is an error.
#pragma once

#include <map>
#include <optional>
#include <string>

namespace peregrine {

// Values from the command line; unset ones fall through to the environment.
struct LaunchFlags {
    std::optional<int> nnodes;
    std::optional<int> node_rank;
    std::optional<std::string> master_addr;
    std::optional<int> master_port;
};

struct LaunchEnv {
    int rank = 0;                           // in [0, world_size)
    int world_size = 1;                     // launched processes (hosts, in the one-process-per-host launch)
    int local_rank = 0;                     // index among this host's launched processes (0 with one per host)
    std::string master_addr = "127.0.0.1";  // host (name or IP) of rank 0's TCP store
    int master_port = kDefaultMasterPort;   // in [1, 65535]
    std::string source = "single process";  // what decided rank and size, for logs and errors

    static constexpr int kDefaultMasterPort = 29500;  // torch.distributed's default, so firewalls know it
};

using EnvMap = std::map<std::string, std::string>;

// The process's environment as a map (what resolve_launch_env reads in production; tests pass
// their own).
EnvMap current_environment();

// Resolves and validates; throws Error naming the flag or variable that is malformed, out of
// range or missing (e.g. "PEREGRINE_NODE_RANK=3 must be below PEREGRINE_NNODES=2").
LaunchEnv resolve_launch_env(const LaunchFlags& flags, const EnvMap& env);

}  // namespace peregrine
