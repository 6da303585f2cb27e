//! Two "nodes" on one machine: two network namespaces joined by a veth pair, two ranks in
//! each, one communicator across them (bootstrap over the veth), and traffic between the
//! namespaces through the socket network plugin. Needs root and iproute2 (CI has both);
//! `RUSTCCL_SKIP_NETNS=1` skips it where they are not available, and says so.

use std::time::Duration;

use rustccl_tests::*;

#[test]
fn ranks_in_two_namespaces_talk_through_the_socket_plugin() {
    let Some(nodes) = Nodes::for_test("rccl", 213) else { return };
    let comm_id = format!("{}:29517", nodes.addr[0]);
    let mut procs = Vec::new();
    for rank in 0..4 {
        let mut cmd = nodes.rank_command("net-traffic", 4, rank, &comm_id);
        cmd.env("NCCL_DEBUG", "WARN");
        procs.push(spawn_command(rank, cmd));
    }
    let out = finish_all(procs, Duration::from_secs(120));
    assert_all_ok(&out);
    for o in &out {
        assert!(o.results()[0].starts_with("plugin Socket moved 64 MiB"), "{o:?}");
    }
}
