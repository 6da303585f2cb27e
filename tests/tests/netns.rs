//! Two "nodes" on one machine: two network namespaces joined by a veth pair, two ranks in
//! each, one communicator across them (bootstrap over the veth), and traffic between the
//! namespaces through the socket network plugin. Needs root and iproute2 (CI has both);
//! `RUSTCCL_SKIP_NETNS=1` skips it where they are not available, and says so.

use std::process::Command;
use std::time::Duration;

use rustccl_tests::*;

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Two namespaces and a veth pair; removed on drop.
struct Nodes {
    ns: [String; 2],
    dev: [String; 2],
    addr: [String; 2],
}

impl Nodes {
    fn create() -> Result<Nodes, String> {
        let tag = std::process::id() % 100_000;
        let subnet = 200 + (tag % 50);
        let n = Nodes {
            ns: [format!("rccl{tag}a"), format!("rccl{tag}b")],
            dev: [format!("rv{tag}a"), format!("rv{tag}b")],
            addr: [format!("10.213.{subnet}.1"), format!("10.213.{subnet}.2")],
        };
        for ns in &n.ns {
            ip(&["netns", "add", ns])?;
        }
        ip(&["link", "add", &n.dev[0], "type", "veth", "peer", "name", &n.dev[1]])?;
        for i in 0..2 {
            ip(&["link", "set", &n.dev[i], "netns", &n.ns[i]])?;
            ip(&["-n", &n.ns[i], "addr", "add", &format!("{}/24", n.addr[i]), "dev", &n.dev[i]])?;
            ip(&["-n", &n.ns[i], "link", "set", &n.dev[i], "up"])?;
            ip(&["-n", &n.ns[i], "link", "set", "lo", "up"])?;
        }
        Ok(n)
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for ns in &self.ns {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

#[test]
fn ranks_in_two_namespaces_talk_through_the_socket_plugin() {
    if std::env::var("RUSTCCL_SKIP_NETNS").is_ok_and(|v| v == "1") {
        println!("SKIPPED: RUSTCCL_SKIP_NETNS=1");
        return;
    }
    let nodes = Nodes::create().unwrap_or_else(|e| {
        panic!("cannot make network namespaces ({e}); run as root with iproute2, or set RUSTCCL_SKIP_NETNS=1")
    });
    let comm_id = format!("{}:29517", nodes.addr[0]);
    let worker = worker_path();
    let mut procs = Vec::new();
    for rank in 0..4 {
        let node = (rank / 2) as usize;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &nodes.ns[node]]).arg(&worker).args(["net-traffic", "4", &rank.to_string(), "env"]);
        cmd.env("NCCL_COMM_ID", &comm_id)
            .env("NCCL_SOCKET_IFNAME", &nodes.dev[node])
            .env("NCCL_HOSTID", format!("node-{node}"))
            .env("NCCL_DEBUG", "WARN");
        procs.push(spawn_command(rank, cmd));
    }
    let out = finish_all(procs, Duration::from_secs(120));
    assert_all_ok(&out);
    for o in &out {
        assert!(o.results()[0].starts_with("plugin Socket moved 64 MiB"), "{o:?}");
    }
}
