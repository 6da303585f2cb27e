//! `Communicator::from_env` with ranks as processes: the variables torchrun, Slurm and Open MPI
//! set form a communicator whose all-reduce is right; missing or contradictory variables fail
//! with a message that names the variable and what to set.

use std::net::TcpListener;
use std::time::Duration;

use rustccl_tests::*;

/// A port nothing listens on now (the OS picks it; the listener is closed at once).
fn free_port() -> String {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string()
}

/// Starts `nranks` `from-env` workers, rank `r` with `env(r)` (no unique id is passed).
fn start(nranks: i32, env: impl Fn(i32) -> Vec<(String, String)>) -> Vec<Outcome> {
    let procs = (0..nranks)
        .map(|r| {
            let vars = env(r);
            let mut all: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            all.push(("RUSTCCL_BACKEND", "host"));
            spawn_one("from-env", nranks, r, "none", &all)
        })
        .collect();
    finish_all(procs, Duration::from_secs(60))
}

fn assert_summed(outs: &[Outcome], nranks: i32) {
    assert_all_ok(outs);
    let want = nranks * (nranks + 1) / 2;
    for (r, o) in outs.iter().enumerate() {
        assert_eq!(o.results(), [format!("from-env rank {r} of {nranks} device 0 sum {want}")], "{o:?}");
    }
}

fn vars(pairs: &[(&str, String)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

#[test]
fn torchrun_variables_form_a_communicator_of_three() {
    let port = free_port();
    let outs = start(3, |r| {
        vars(&[
            ("RANK", r.to_string()),
            ("WORLD_SIZE", "3".into()),
            ("LOCAL_RANK", r.to_string()),
            ("LOCAL_WORLD_SIZE", "3".into()),
            ("MASTER_ADDR", "localhost".into()),
            ("MASTER_PORT", port.clone()),
        ])
    });
    assert_summed(&outs, 3);
}

#[test]
fn torchrun_with_its_agent_store_on_master_port_uses_the_next_port() {
    // torchrun's agent holds MASTER_PORT: a listener stands in for it.
    let agent = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = agent.local_addr().unwrap().port();
    if TcpListener::bind(("127.0.0.1", port + 1)).is_err() {
        println!("SKIPPED: port {} is taken", port + 1);
        return;
    }
    let outs = start(2, |r| {
        vars(&[
            ("RANK", r.to_string()),
            ("WORLD_SIZE", "2".into()),
            ("LOCAL_RANK", r.to_string()),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", port.to_string()),
            ("TORCHELASTIC_USE_AGENT_STORE", "True".into()),
        ])
    });
    assert_summed(&outs, 2);
    drop(agent);
}

#[test]
fn slurm_variables_with_nccl_comm_id_form_a_communicator() {
    let comm_id = format!("127.0.0.1:{}", free_port());
    let outs = start(2, |r| {
        vars(&[
            ("SLURM_PROCID", r.to_string()),
            ("SLURM_NTASKS", "2".into()),
            ("SLURM_LOCALID", r.to_string()),
            ("SLURM_JOB_NODELIST", "node[01-02]".into()),
            ("NCCL_COMM_ID", comm_id.clone()),
        ])
    });
    assert_summed(&outs, 2);
}

#[test]
fn open_mpi_variables_with_master_addr_form_a_communicator() {
    let port = free_port();
    let outs = start(2, |r| {
        vars(&[
            ("OMPI_COMM_WORLD_RANK", r.to_string()),
            ("OMPI_COMM_WORLD_SIZE", "2".into()),
            ("OMPI_COMM_WORLD_LOCAL_RANK", r.to_string()),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", port.clone()),
        ])
    });
    assert_summed(&outs, 2);
}

/// One process with `env`: it must fail with InvalidUsage and a message containing `want`.
fn refused(env: &[(&str, &str)], want: &str) {
    let mut all = env.to_vec();
    all.push(("RUSTCCL_BACKEND", "host"));
    let out = spawn_one("from-env", 2, 0, "none", &all).finish(Duration::from_secs(30));
    let (code, msg) = out.error().unwrap_or_else(|| panic!("must fail: {out:?}"));
    assert_eq!(code, "InvalidUsage", "{msg}");
    assert!(msg.contains(want), "{want:?} not in {msg:?}");
    assert!(msg.starts_with("from_env: "), "{msg}");
}

#[test]
fn bad_environments_are_refused_with_what_to_set() {
    refused(&[], "no launcher variables (RANK/WORLD_SIZE, SLURM_PROCID/SLURM_NTASKS");
    refused(&[("RANK", "0")], "RANK is set but WORLD_SIZE is not: set WORLD_SIZE");
    refused(&[("RANK", "2"), ("WORLD_SIZE", "2")], "RANK=2 contradicts WORLD_SIZE=2");
    refused(
        &[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_LOCALID", "0")],
        "Slurm: no rendezvous address: set MASTER_ADDR and MASTER_PORT",
    );
    refused(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1")], "set MASTER_PORT");
}
