#include "dist/launch_env.h"

#include <charconv>
#include <utility>

#include "core/error.h"

extern char** environ;

namespace peregrine {

namespace {

// An integer and how the user spelled where it came from, for error messages:
// "--nnodes 2" or "PEREGRINE_NNODES=2".
struct Setting {
    int value = 0;
    std::string origin;
};

int parse_int(const std::string& text, const std::string& origin) {
    int v = 0;
    const char* end = text.data() + text.size();
    const auto [p, ec] = std::from_chars(text.data(), end, v);
    if (text.empty() || ec != std::errc() || p != end) fail(origin, " is not an integer");
    return v;
}

// The variable's value, or nullptr when it is unset or empty (an empty variable counts as unset,
// as shells and YAML often leave them).
const std::string* find_var(const EnvMap& env, const std::string& name) {
    const auto it = env.find(name);
    return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

std::optional<Setting> env_int(const EnvMap& env, const std::string& name) {
    const std::string* v = find_var(env, name);
    if (!v) return std::nullopt;
    const std::string origin = name + "=" + *v;
    return Setting{parse_int(*v, origin), origin};
}

std::optional<Setting> flag_or_env(const std::optional<int>& flag, const std::string& flag_name, const EnvMap& env,
                                   const std::string& var) {
    if (flag) return Setting{*flag, str_cat(flag_name, " ", *flag)};
    return env_int(env, var);
}

// A variable a launcher always sets together with the one that revealed it.
Setting required_int(const EnvMap& env, const std::string& name, const std::string& because) {
    std::optional<Setting> s = env_int(env, name);
    if (!s) fail(because, " is set but ", name, " is not: cannot tell this process's rank");
    return *s;
}

// Rank and size from one source, before validation; `same_host` when the source says every rank
// runs on this host (then 127.0.0.1 reaches rank 0 without an address).
struct World {
    Setting rank, size;
    int local_rank = 0;
    std::string source;
    std::optional<std::pair<std::string, std::string>> master;  // (address, variable that gave it)
    bool same_host = false;
    bool default_localhost = false;  // flags mode: 127.0.0.1 unless told, as torchrun does
};

World from_flags(const std::optional<Setting>& nnodes, const std::optional<Setting>& node_rank,
                 const LaunchFlags& flags) {
    World w;
    if (!nnodes) fail(node_rank->origin, " needs --nnodes (or PEREGRINE_NNODES) too");
    w.size = *nnodes;
    if (node_rank) {
        w.rank = *node_rank;
    } else if (nnodes->value == 1) {
        w.rank = Setting{0, "the only node"};
    } else {
        fail(nnodes->origin, " needs --node-rank (or PEREGRINE_NODE_RANK): this host's index in [0, ", nnodes->value,
             ")");
    }
    const bool any_flag = flags.nnodes || flags.node_rank;
    const bool any_env = !flags.nnodes || (!flags.node_rank && node_rank);
    w.source = any_flag && any_env ? "flags and PEREGRINE_* variables" : any_flag ? "flags" : "PEREGRINE_* variables";
    w.default_localhost = true;
    return w;
}

std::optional<World> from_launcher(const EnvMap& env) {
    World w;
    if (std::optional<Setting> size = env_int(env, "OMPI_COMM_WORLD_SIZE")) {
        w.size = *size;
        w.rank = required_int(env, "OMPI_COMM_WORLD_RANK", size->origin);
        if (auto local = env_int(env, "OMPI_COMM_WORLD_LOCAL_RANK")) w.local_rank = local->value;
        if (auto local_size = env_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE"))
            w.same_host = local_size->value == size->value;
        w.source = "Open MPI (OMPI_COMM_WORLD_*)";
        return w;
    }
    if (std::optional<Setting> size = env_int(env, "PMI_SIZE")) {
        w.size = *size;
        w.rank = required_int(env, "PMI_RANK", size->origin);
        if (auto local = env_int(env, "MPI_LOCALRANKID")) w.local_rank = local->value;
        if (auto local_size = env_int(env, "MPI_LOCALNRANKS")) w.same_host = local_size->value == size->value;
        w.source = "PMI (PMI_RANK / PMI_SIZE)";
        return w;
    }
    if (std::optional<Setting> rank = env_int(env, "SLURM_PROCID")) {
        w.rank = *rank;
        w.size = required_int(env, "SLURM_NTASKS", rank->origin);
        if (auto local = env_int(env, "SLURM_LOCALID")) w.local_rank = local->value;
        if (auto nodes = env_int(env, "SLURM_NNODES")) w.same_host = nodes->value == 1;
        if (const std::string* addr = find_var(env, "SLURM_LAUNCH_NODE_IPADDR"))
            w.master.emplace(*addr, "SLURM_LAUNCH_NODE_IPADDR");
        w.source = "Slurm (SLURM_PROCID / SLURM_NTASKS)";
        return w;
    }
    if (std::optional<Setting> size = env_int(env, "LWS_GROUP_SIZE")) {
        w.size = *size;
        w.rank = required_int(env, "LWS_WORKER_INDEX", size->origin);
        if (const std::string* addr = find_var(env, "LWS_LEADER_ADDRESS"))
            w.master.emplace(*addr, "LWS_LEADER_ADDRESS");
        w.source = "LeaderWorkerSet (LWS_*)";
        return w;
    }
    return std::nullopt;
}

}  // namespace

EnvMap current_environment() {
    EnvMap env;
    for (char** e = environ; e && *e; ++e) {
        const std::string entry(*e);
        const size_t eq = entry.find('=');
        if (eq != std::string::npos) env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
    }
    return env;
}

LaunchEnv resolve_launch_env(const LaunchFlags& flags, const EnvMap& env) {
    const std::optional<Setting> nnodes = flag_or_env(flags.nnodes, "--nnodes", env, "PEREGRINE_NNODES");
    const std::optional<Setting> node_rank = flag_or_env(flags.node_rank, "--node-rank", env, "PEREGRINE_NODE_RANK");

    World w;
    if (nnodes || node_rank) {
        w = from_flags(nnodes, node_rank, flags);
    } else if (std::optional<World> launched = from_launcher(env)) {
        w = std::move(*launched);
    } else {
        w.rank = Setting{0, "single process"};
        w.size = Setting{1, "single process"};
        w.source = "single process";
    }

    if (w.size.value < 1) fail(w.size.origin, ": the number of ranks must be at least 1");
    if (w.rank.value < 0 || w.rank.value >= w.size.value)
        fail(w.rank.origin, " must be in [0, ", w.size.value, ") (", w.size.origin, ")");
    if (w.local_rank < 0) fail("the local rank ", w.local_rank, " from ", w.source, " is negative");

    LaunchEnv out;
    out.rank = w.rank.value;
    out.world_size = w.size.value;
    out.local_rank = w.local_rank;
    out.source = w.source;

    // Master address: flag > PEREGRINE_MASTER_ADDR > the launcher's > 127.0.0.1 where that reaches
    // rank 0.
    if (flags.master_addr) {
        if (flags.master_addr->empty()) fail("--master-addr is empty");
        out.master_addr = *flags.master_addr;
    } else if (const std::string* addr = find_var(env, "PEREGRINE_MASTER_ADDR")) {
        out.master_addr = *addr;
    } else if (w.master) {
        out.master_addr = w.master->first;
    } else if (out.world_size == 1 || w.same_host || w.default_localhost) {
        out.master_addr = "127.0.0.1";
    } else {
        fail("rank ", out.rank, " of ", out.world_size, " (from ", w.source,
             ") runs on several hosts but no address of rank 0's host was given: pass --master-addr or set "
             "PEREGRINE_MASTER_ADDR");
    }

    if (std::optional<Setting> port = flag_or_env(flags.master_port, "--master-port", env, "PEREGRINE_MASTER_PORT")) {
        if (port->value < 1 || port->value > 65535) fail(port->origin, " is not a TCP port (1 to 65535)");
        out.master_port = port->value;
    }
    return out;
}

}  // namespace peregrine
