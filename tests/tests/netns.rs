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

/// A network cut one way (frames from the first namespace to the second are lost) while
/// ranks in both run all_reduce calls, with `RUSTCCL_SOCKET_TIMEOUT_MS` bounding how long a
/// peer may stay silent and no operation timeout: every rank's operation ends with an error
/// that names the failed network connection (the ranks at the cut see their own connections
/// fail; the others learn it from them), none hangs. Without the bound, TCP would wait many
/// minutes; before a failed connection failed the whole communicator, ranks whose operation
/// waited on another connection stayed blocked.
#[test]
fn a_one_way_cut_ends_every_ranks_operation_with_an_error_naming_the_connection() {
    let Some(nodes) = Nodes::for_test("rcut", 214) else { return };
    let comm_id = format!("{}:29518", nodes.addr[0]);
    let mut procs = Vec::new();
    for rank in 0..4 {
        let mut cmd = nodes.rank_command("net-cut", 4, rank, &comm_id);
        cmd.env("NCCL_DEBUG", "WARN").env("RUSTCCL_BACKEND", "host").env("RUSTCCL_SOCKET_TIMEOUT_MS", "2000");
        procs.push(spawn_command(rank, cmd));
    }
    for p in &mut procs {
        assert!(p.wait_line("READY", Duration::from_secs(60)), "rank {} did not get ready", p.rank);
    }
    nodes.drop_from(0).expect("cut the link one way");
    let out = finish_all(procs, Duration::from_secs(60));
    assert_all_ok(&out);
    for o in &out {
        let r = o.results().into_iter().find_map(|l| l.strip_prefix("cut ")).unwrap_or_else(|| panic!("{o:?}")).to_string();
        let mut parts = r.splitn(3, ' ');
        let (code, ms, msg) = (parts.next().unwrap(), parts.next().unwrap().parse::<u64>().unwrap(), parts.next().unwrap_or(""));
        assert_eq!(code, "RemoteError", "rank {}: {msg}", o.rank);
        assert!(msg.contains("network connection"), "rank {}'s error does not name the connection: {msg}", o.rank);
        assert!(ms < 12_000, "rank {} learnt of the cut after {ms} ms: {msg}", o.rank);
        println!("rank {}: {code} after {ms} ms: {msg}", o.rank);
    }
}
