//! [`Communicator::from_env`]: a communicator built from the variables that cluster launchers
//! set for each process, so that a program started by torchrun, Slurm's `srun` or Open MPI's
//! `mpirun` needs no code to pass a unique id around.
//!
//! Which launcher (the first whose rank and size variables are set wins):
//!
//! | launcher | rank | size | local rank |
//! |---|---|---|---|
//! | torchrun (and `torch.distributed` launchers) | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` |
//! | Slurm (`srun`) | `SLURM_PROCID` | `SLURM_NTASKS` | `SLURM_LOCALID` |
//! | Open MPI (`mpirun`) | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` |
//!
//! The rendezvous: rank 0 listens at a `host:port` that every rank knows, `NCCL_COMM_ID` if set,
//! else `MASTER_ADDR`:`MASTER_PORT` (torchrun sets both; under Slurm or Open MPI set them, or
//! `NCCL_COMM_ID`, yourself: neither launcher says where rank 0 runs). Every rank derives the
//! same unique id from that address, as with `NCCL_COMM_ID`. Under torchrun with its agent's
//! store on `MASTER_PORT` (`TORCHELASTIC_USE_AGENT_STORE=True`), that port is taken, and the
//! rendezvous uses `MASTER_PORT + 1`.
//!
//! The device: the local rank modulo the number of devices on a GPU backend (one GPU per local
//! rank, as torchrun users expect); device 0 on the host backend, whose devices are virtual.

use crate::backend;
use crate::bootstrap::{self, UniqueId};
use crate::config::CommConfig;
use crate::error::{Error, Result};

use super::Communicator;

/// The launcher whose variables gave the rank and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    Torchrun,
    Slurm,
    OpenMpi,
}

impl Launcher {
    /// The variables of each launcher: (launcher, rank, size, local rank).
    const VARS: [(Launcher, &'static str, &'static str, &'static str); 3] = [
        (Launcher::Torchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK"),
        (Launcher::Slurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
        (Launcher::OpenMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ];

    pub fn name(self) -> &'static str {
        match self {
            Launcher::Torchrun => "torchrun",
            Launcher::Slurm => "Slurm",
            Launcher::OpenMpi => "Open MPI",
        }
    }
}

/// What the environment says about this process's place in the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchEnv {
    pub launcher: Launcher,
    pub rank: i32,
    pub nranks: i32,
    /// The rank among the processes of this node (picks the GPU).
    pub local_rank: i32,
    /// The rendezvous address as given (`host:port`), before name resolution.
    pub rendezvous: String,
    /// The variable(s) the address came from, for messages.
    pub rendezvous_from: &'static str,
}

/// How to set the variables, appended to every "missing" message.
const HOW: &str = "start the program with torchrun (it sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR \
and MASTER_PORT), srun or mpirun, or set RANK and WORLD_SIZE (plus LOCAL_RANK) and MASTER_ADDR \
and MASTER_PORT yourself";

fn usage(msg: String) -> Error {
    Error::invalid_usage(msg)
}

impl LaunchEnv {
    /// Reads the process environment (see the module documentation); NCCL's own variables
    /// (`NCCL_COMM_ID`) through the parameter lookup, so that an env plugin resolves them.
    pub fn detect() -> Result<LaunchEnv> {
        LaunchEnv::from_lookup(|name| {
            if name.starts_with("NCCL_") {
                crate::params::env_str(name)
            } else {
                std::env::var(name).ok().filter(|v| !v.trim().is_empty())
            }
        })
    }

    /// As [`LaunchEnv::detect`], with the variables read through `get` (tests use a map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<LaunchEnv> {
        let int = |name: &str| -> Result<Option<i64>> {
            match get(name) {
                None => Ok(None),
                Some(v) => v.trim().parse::<i64>().map(Some).map_err(|_| {
                    usage(format!("{name}={v:?} is not an integer; the launcher sets it to a number"))
                }),
            }
        };
        let mut found = None;
        for (launcher, rank_var, size_var, local_var) in Launcher::VARS {
            let (rank, size) = (int(rank_var)?, int(size_var)?);
            match (rank, size) {
                (None, None) => continue,
                (Some(_), None) => {
                    return Err(usage(format!(
                        "{rank_var} is set but {size_var} is not: set {size_var} to the number of processes ({})",
                        launcher.name()
                    )))
                }
                (None, Some(_)) => {
                    return Err(usage(format!(
                        "{size_var} is set but {rank_var} is not: set {rank_var} to this process's rank, 0 to {size_var}-1 ({})",
                        launcher.name()
                    )))
                }
                (Some(rank), Some(size)) => {
                    found = Some((launcher, rank_var, size_var, local_var, rank, size));
                    break;
                }
            }
        }
        let Some((launcher, rank_var, size_var, local_var, rank, size)) = found else {
            return Err(usage(format!(
                "from_env: no launcher variables (RANK/WORLD_SIZE, SLURM_PROCID/SLURM_NTASKS or \
                 OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE) are set: {HOW}"
            )));
        };
        if size < 1 || size > i32::MAX as i64 {
            return Err(usage(format!("{size_var}={size}: the number of processes must be at least 1")));
        }
        if rank < 0 || rank >= size {
            return Err(usage(format!(
                "{rank_var}={rank} contradicts {size_var}={size}: a rank goes from 0 to {}",
                size - 1
            )));
        }
        let local_rank = match int(local_var)? {
            Some(l) if l < 0 || l >= size => {
                return Err(usage(format!(
                    "{local_var}={l} contradicts {size_var}={size}: a local rank goes from 0 to {}",
                    size - 1
                )))
            }
            Some(l) => l,
            // One node: the rank is the local rank.
            None => rank,
        };
        let (rendezvous, rendezvous_from) = rendezvous_address(&get, launcher)?;
        Ok(LaunchEnv { launcher, rank: rank as i32, nranks: size as i32, local_rank: local_rank as i32, rendezvous, rendezvous_from })
    }
}

/// `NCCL_COMM_ID`, else `MASTER_ADDR:MASTER_PORT` (`+1` under torchrun's agent store).
fn rendezvous_address(get: &impl Fn(&str) -> Option<String>, launcher: Launcher) -> Result<(String, &'static str)> {
    if let Some(id) = get("NCCL_COMM_ID") {
        return Ok((id.trim().to_string(), "NCCL_COMM_ID"));
    }
    let slurm_hint = if launcher == Launcher::Slurm {
        " (Slurm does not say where rank 0 runs: e.g. MASTER_ADDR=$(scontrol show hostnames \
         \"$SLURM_JOB_NODELIST\" | head -n 1) in the batch script)"
    } else {
        ""
    };
    let addr = get("MASTER_ADDR");
    let port = get("MASTER_PORT");
    let (addr, port) = match (addr, port) {
        (Some(a), Some(p)) => (a.trim().to_string(), p),
        (None, None) => {
            return Err(usage(format!(
                "{}: no rendezvous address: set MASTER_ADDR and MASTER_PORT (where rank 0 listens, \
                 e.g. MASTER_ADDR=node01 MASTER_PORT=29500) or NCCL_COMM_ID=host:port{slurm_hint}",
                launcher.name()
            )))
        }
        (Some(_), None) => {
            return Err(usage(format!("MASTER_ADDR is set but MASTER_PORT is not: set MASTER_PORT to a free TCP port on rank 0's node{slurm_hint}")))
        }
        (None, Some(_)) => {
            return Err(usage(format!("MASTER_PORT is set but MASTER_ADDR is not: set MASTER_ADDR to rank 0's host name or address{slurm_hint}")))
        }
    };
    let port: u16 = port
        .trim()
        .parse()
        .map_err(|_| usage(format!("MASTER_PORT={port:?} is not a TCP port (1 to 65535)")))?;
    let agent_store = get("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    let port = if agent_store {
        port.checked_add(1).ok_or_else(|| {
            usage("MASTER_PORT=65535 is torchrun's agent store and rustccl needs the next port: pick a lower MASTER_PORT".to_string())
        })?
    } else {
        port
    };
    let host = if addr.contains(':') && !addr.starts_with('[') { format!("[{addr}]") } else { addr };
    let from = if agent_store { "MASTER_ADDR and MASTER_PORT+1 (torchrun's agent store holds MASTER_PORT)" } else { "MASTER_ADDR and MASTER_PORT" };
    Ok((format!("{host}:{port}"), from))
}

impl Communicator {
    /// A communicator of every process of the job, from the launcher's environment (torchrun,
    /// Slurm, Open MPI; see [`LaunchEnv`]), with the default config. Every process calls it;
    /// it blocks until all have joined (or the bootstrap timeout passes).
    pub fn from_env() -> Result<Communicator> {
        Communicator::from_env_config(&CommConfig::default())
    }

    /// [`Communicator::from_env`] with a config.
    pub fn from_env_config(config: &CommConfig) -> Result<Communicator> {
        crate::log::init();
        Communicator::from_env_inner(config).map_err(|e| e.context("from_env").record())
    }

    fn from_env_inner(config: &CommConfig) -> Result<Communicator> {
        let env = LaunchEnv::detect()?;
        let backend = backend::backend_for(config.backend)?;
        let device = if backend.capabilities().virtual_devices {
            0
        } else {
            let count = backend.device_count()?;
            if count == 0 {
                return Err(Error::invalid_usage(format!("from_env: the {} backend sees no device", backend.kind())));
            }
            env.local_rank % count as i32
        };
        let addr = rustccl_netif::parse_socket_addr(&env.rendezvous)
            .map_err(|e| Error::from(e).context(format!("the rendezvous address from {}", env.rendezvous_from)))?;
        let id = UniqueId::from_comm_id_env(&env.rendezvous, addr);
        tracing::info!(
            target: "INIT",
            "from_env: {} rank {} of {} (local rank {}), device {device}, rendezvous {} ({addr}) from {}",
            env.launcher.name(), env.rank, env.nranks, env.local_rank, env.rendezvous, env.rendezvous_from
        );
        // With NCCL_COMM_ID set, init starts the root itself (as for get_unique_id's ids).
        let init_starts_root = env.rendezvous_from == "NCCL_COMM_ID";
        if env.rank == 0 && !init_starts_root {
            bootstrap::start_comm_id_root(&id).map_err(|e| {
                e.context(format!("rank 0 listens at {} ({}); is the port free on this node?", env.rendezvous, env.rendezvous_from))
            })?;
        }
        Communicator::init_rank_config(env.nranks, &id, env.rank, device, config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn detect(vars: &[(&str, &str)]) -> Result<LaunchEnv> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        LaunchEnv::from_lookup(|n| map.get(n).cloned())
    }

    fn message(vars: &[(&str, &str)]) -> String {
        detect(vars).expect_err("must be refused").message
    }

    #[test]
    fn torchrun_variables() {
        let e = detect(&[("RANK", "3"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1"), ("MASTER_ADDR", "10.0.0.1"), ("MASTER_PORT", "29500")])
            .unwrap();
        assert_eq!(
            e,
            LaunchEnv {
                launcher: Launcher::Torchrun,
                rank: 3,
                nranks: 4,
                local_rank: 1,
                rendezvous: "10.0.0.1:29500".into(),
                rendezvous_from: "MASTER_ADDR and MASTER_PORT"
            }
        );
    }

    #[test]
    fn torchrun_agent_store_moves_the_port_and_nccl_comm_id_wins() {
        let base = [("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "::1"), ("MASTER_PORT", "29500")];
        let mut vars = base.to_vec();
        vars.push(("TORCHELASTIC_USE_AGENT_STORE", "True"));
        assert_eq!(detect(&vars).unwrap().rendezvous, "[::1]:29501");
        vars.push(("NCCL_COMM_ID", " 127.0.0.1:7000 "));
        let e = detect(&vars).unwrap();
        assert_eq!((e.rendezvous.as_str(), e.rendezvous_from), ("127.0.0.1:7000", "NCCL_COMM_ID"));
        // No LOCAL_RANK: one node, the rank is the local rank.
        assert_eq!(e.local_rank, 0);
    }

    #[test]
    fn slurm_and_open_mpi_variables() {
        let e = detect(&[("SLURM_PROCID", "5"), ("SLURM_NTASKS", "8"), ("SLURM_LOCALID", "1"), ("NCCL_COMM_ID", "n1:1234")]).unwrap();
        assert_eq!((e.launcher, e.rank, e.nranks, e.local_rank), (Launcher::Slurm, 5, 8, 1));
        let e = detect(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ])
        .unwrap();
        assert_eq!((e.launcher, e.rank, e.nranks, e.local_rank), (Launcher::OpenMpi, 1, 2, 0));
        // torchrun under srun: torchrun's variables win.
        let e = detect(&[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2"), ("RANK", "6"), ("WORLD_SIZE", "8"), ("NCCL_COMM_ID", "h:1")]).unwrap();
        assert_eq!((e.launcher, e.rank, e.nranks), (Launcher::Torchrun, 6, 8));
    }

    #[test]
    fn bad_environments_name_the_variable_and_what_to_set() {
        let m = message(&[]);
        assert!(m.contains("no launcher variables") && m.contains("torchrun") && m.contains("MASTER_ADDR"), "{m}");
        let m = message(&[("RANK", "0")]);
        assert!(m.contains("RANK is set but WORLD_SIZE is not: set WORLD_SIZE"), "{m}");
        let m = message(&[("SLURM_NTASKS", "2")]);
        assert!(m.contains("SLURM_NTASKS is set but SLURM_PROCID is not"), "{m}");
        let m = message(&[("RANK", "2"), ("WORLD_SIZE", "2")]);
        assert!(m.contains("RANK=2 contradicts WORLD_SIZE=2: a rank goes from 0 to 1"), "{m}");
        let m = message(&[("RANK", "0"), ("WORLD_SIZE", "0")]);
        assert!(m.contains("WORLD_SIZE=0: the number of processes must be at least 1"), "{m}");
        let m = message(&[("RANK", "one"), ("WORLD_SIZE", "2")]);
        assert!(m.contains("RANK=\"one\" is not an integer"), "{m}");
        let m = message(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "2")]);
        assert!(m.contains("LOCAL_RANK=2 contradicts WORLD_SIZE=2"), "{m}");
        let m = message(&[("RANK", "0"), ("WORLD_SIZE", "2")]);
        assert!(m.contains("torchrun: no rendezvous address: set MASTER_ADDR and MASTER_PORT"), "{m}");
        assert!(m.contains("or NCCL_COMM_ID=host:port"), "{m}");
        let m = message(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")]);
        assert!(m.contains("Slurm: no rendezvous address") && m.contains("scontrol show hostnames"), "{m}");
        let m = message(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")]);
        assert!(m.contains("MASTER_ADDR is set but MASTER_PORT is not: set MASTER_PORT"), "{m}");
        let m = message(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "1")]);
        assert!(m.contains("MASTER_PORT is set but MASTER_ADDR is not: set MASTER_ADDR"), "{m}");
        let m = message(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "70000")]);
        assert!(m.contains("MASTER_PORT=\"70000\" is not a TCP port"), "{m}");
        assert_eq!(detect(&[]).unwrap_err().code, crate::error::ResultCode::InvalidUsage);
    }
}
