//! Merged NICs on the verbs stand-in (`IBV_DOUBLE_PORTS=2`: a dual-port device;
//! `IBV_DOUBLE_DEVICES=2`: two devices with GUIDs of their own):
//! * the two ports of one device are one plugin device `dbl_0+dbl_0` with the speeds summed
//!   and NCCL's INFO form `[0]dbl_0:1+dbl_0:2/RoCE`; `NCCL_IB_MERGE_NICS=0` keeps two;
//! * data over a merged device, 2 QPs per member: bytes exact, and the stand-in's log shows
//!   writes with immediate from two QPs on each port;
//! * a 2-member sender to a 1-member receiver (and back);
//! * `make_vdevice` of two separate devices, then a transfer over it; lists it must refuse.
//!
//! Each case runs in a child process (its own environment, a time limit); all are skipped,
//! with the reason printed, when the stand-in cannot be built (see `common`).

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use rustccl_plugin_api::net::Net;
use rustccl_plugin_api::PluginError;

/// One port's speed on the stand-in (4X EDR).
const PORT_MBPS: u32 = 100_000;

/// From the stand-in's `IBV_DOUBLE_VERBOSE` lines, the QPs that posted a write with
/// immediate (the data of a send), by `device:port`.
fn data_qps_by_port(log: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut by_port: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in log.lines() {
        // "ibverbs-double[pid]: QP 0x10002 (dbl_0:2) posts RDMA_WRITE_WITH_IMM of ..."
        let Some(rest) = line.split("]: QP ").nth(1) else {
            continue;
        };
        if !rest.contains(" posts RDMA_WRITE_WITH_IMM ") {
            continue;
        }
        let mut words = rest.split_whitespace();
        let (Some(qp), Some(port)) = (words.next(), words.next()) else {
            continue;
        };
        by_port
            .entry(port.trim_matches(|c| c == '(' || c == ')').to_string())
            .or_default()
            .insert(qp.to_string());
    }
    by_port
}

/// Checks that, in the stand-in's log `out`, data went over `want[i].1` QPs of port
/// `want[i].0` (`device:port`).
fn assert_data_qps(out: &str, want: &[(&str, usize)]) {
    let qps = data_qps_by_port(out);
    let got: Vec<(&str, usize)> = want
        .iter()
        .map(|&(port, _)| (port, qps.get(port).map_or(0, BTreeSet::len)))
        .collect();
    assert_eq!(got, want, "data QPs by port: {qps:?}");
}

#[test]
fn the_ports_of_a_dual_port_device_are_one_device() {
    let child = || {
        let (net, ctx) = init();
        assert_eq!(
            net.devices(ctx).unwrap(),
            1,
            "two ports, one NIC: one device"
        );
        let p = net.properties(ctx, 0).unwrap();
        assert_eq!(p.name.as_str(), "dbl_0+dbl_0");
        assert_eq!(p.speed_mbps, 2 * PORT_MBPS, "the ports' speeds summed");
        assert_eq!(p.port, 1, "the first member's");
        assert!(net.properties(ctx, 1).is_err());
    };
    let Some(out) = in_child(
        "the_ports_of_a_dual_port_device_are_one_device",
        &[("IBV_DOUBLE_PORTS", "2")],
        child,
    ) else {
        return;
    };
    assert!(
        out.contains("NET/IB : Using [0]dbl_0:1+dbl_0:2/RoCE ;"),
        "the INFO line lists the merged device:\n{out}"
    );
}

#[test]
fn merge_nics_0_keeps_the_ports_apart() {
    let env = [("IBV_DOUBLE_PORTS", "2"), ("NCCL_IB_MERGE_NICS", "0")];
    in_child("merge_nics_0_keeps_the_ports_apart", &env, || {
        let (net, ctx) = init();
        assert_eq!(net.devices(ctx).unwrap(), 2);
        for (dev, port) in [(0, 1), (1, 2)] {
            let p = net.properties(ctx, dev).unwrap();
            assert_eq!(
                (p.name.as_str(), p.port, p.speed_mbps),
                ("dbl_0", port, PORT_MBPS)
            );
        }
        // NCCL refuses to fuse devices with NCCL_IB_MERGE_NICS=0; one member is still fine.
        let e = net.make_vdevice(ctx, &[0, 1]).unwrap_err();
        assert_eq!(e.code, PluginError::INVALID_USAGE, "{e}");
        assert!(e.message.contains("NCCL_IB_MERGE_NICS=0"), "{e}");
        assert_eq!(net.make_vdevice(ctx, &[1]).unwrap(), 2);
        // Each port alone carries data.
        Pair::connect_devices(net, ctx, 1, 0).stream(20, 4, |m| m * 1000 + 1);
    });
}

#[test]
fn data_over_a_merged_device_uses_both_ports() {
    let env = [
        ("IBV_DOUBLE_PORTS", "2"),
        ("NCCL_IB_QPS_PER_CONNECTION", "2"),
        ("IBV_DOUBLE_VERBOSE", "1"),
    ];
    let child = || {
        let p = Pair::connect();
        assert_eq!(
            p.net.properties(p.ctx, 0).unwrap().name.as_str(),
            "dbl_0+dbl_0"
        );
        // Sizes 0..~300 KB, most not multiples of 128: each of the 4 QPs gets its part.
        p.stream(64, 8, |m| (m * 4_999) % 300_001);
        p.close();
    };
    let Some(out) = in_child("data_over_a_merged_device_uses_both_ports", &env, child) else {
        return;
    };
    // 2 members x 2 QPs per connection = 4 QPs, QP i on port i % 2: each port's two QPs
    // carried data (with the rkey of the receiver's QP's port: the stand-in refuses any
    // other key with a remote access error, which would have failed the child).
    assert_data_qps(&out, &[("dbl_0:1", 2), ("dbl_0:2", 2)]);
}

#[test]
fn a_two_member_sender_talks_to_a_one_member_receiver() {
    let env = [
        ("IBV_DOUBLE_DEVICES", "2"),
        ("IBV_DOUBLE_PORTS", "2"),
        ("IBV_DOUBLE_VERBOSE", "1"),
    ];
    let child = || {
        let (net, ctx) = init();
        // Physical devices dbl_0:1, dbl_0:2, dbl_1:1, dbl_1:2; merged per NIC.
        assert_eq!(net.devices(ctx).unwrap(), 2);
        assert_eq!(net.properties(ctx, 1).unwrap().name.as_str(), "dbl_1+dbl_1");
        let single = net.make_vdevice(ctx, &[2]).unwrap();
        assert_eq!(single, 2);
        let p = net.properties(ctx, single).unwrap();
        assert_eq!(
            (p.name.as_str(), p.port, p.speed_mbps),
            ("dbl_1", 1, PORT_MBPS)
        );
        // 2-member sender (device 0), 1-member receiver (dbl_1:1).
        let pair = Pair::connect_devices(net, ctx, 0, single);
        pair.stream(40, 8, |m| (m * 7_001) % 100_003);
        pair.close();
        // And back: 1-member sender, 2-member receiver.
        let back = Pair::connect_devices(pair.net, ctx, single, 0);
        back.stream(40, 8, |m| (m * 7_001) % 100_003);
    };
    let Some(out) = in_child(
        "a_two_member_sender_talks_to_a_one_member_receiver",
        &env,
        child,
    ) else {
        return;
    };
    // max(2, 1) x 1 = 2 QPs: the sender's on both of dbl_0's ports (the first connection),
    // then the 1-member sender's two QPs on dbl_1:1 (the second).
    assert_data_qps(&out, &[("dbl_0:1", 1), ("dbl_0:2", 1), ("dbl_1:1", 2)]);
}

#[test]
fn make_vdevice_fuses_two_devices_and_carries_data() {
    let env = [
        ("IBV_DOUBLE_DEVICES", "2"),
        ("NCCL_IB_QPS_PER_CONNECTION", "2"),
        ("IBV_DOUBLE_VERBOSE", "1"),
    ];
    let child = || {
        let (net, ctx) = init();
        assert_eq!(
            net.devices(ctx).unwrap(),
            2,
            "two NICs (two GUIDs): not merged"
        );
        // Lists no plugin may grant, refused before anything is made.
        for (bad, says) in [
            (&[][..], "not 0"),
            (&[2][..], "no physical device 2"),
            (&[-1][..], "no physical device -1"),
            (&[1, 1][..], "listed twice"),
        ] {
            let e = net.make_vdevice(ctx, bad).unwrap_err();
            assert_eq!(e.code, PluginError::INVALID_ARGUMENT, "{bad:?}: {e}");
            assert!(e.message.contains(says), "{bad:?}: {e}");
        }
        assert_eq!(net.devices(ctx).unwrap(), 2);
        let v = net.make_vdevice(ctx, &[0, 1]).unwrap();
        assert_eq!(v, 2);
        assert_eq!(net.devices(ctx).unwrap(), 3);
        let p = net.properties(ctx, v).unwrap();
        assert_eq!(
            (p.name.as_str(), p.speed_mbps),
            ("dbl_0+dbl_1", 2 * PORT_MBPS)
        );
        assert_eq!(net.properties(ctx, 0).unwrap().name.as_str(), "dbl_0");
        let pair = Pair::connect_devices(net, ctx, v, v);
        pair.stream(64, 8, |m| (m * 4_999) % 300_001);
        pair.close();
    };
    let Some(out) = in_child(
        "make_vdevice_fuses_two_devices_and_carries_data",
        &env,
        child,
    ) else {
        return;
    };
    assert!(
        out.contains("NET/IB : made virtual device [2]dbl_0:1+dbl_1:1/RoCE speed=200000 ndevs=2"),
        "{out}"
    );
    assert_data_qps(&out, &[("dbl_0:1", 2), ("dbl_1:1", 2)]);
}
