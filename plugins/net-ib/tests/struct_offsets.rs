//! The Rust structures of `src/verbs/types.rs` against `<infiniband/verbs.h>`: a C program,
//! compiled now with the system `cc`, prints `offsetof` and `sizeof` of every field the
//! binding declares, and each must equal Rust's `offset_of!` / `size_of`. A mismatch would
//! make the plugin read or write the wrong bytes of the library's objects.
//!
//! Skipped, with the reason printed, only when the header is absent (CI installs
//! libibverbs-dev, so it runs there). `verbs_context` grows towards lower addresses, so its
//! fields are compared by their distance to its `context` field, which every library
//! version keeps.

use std::mem::{offset_of, size_of};
use std::path::Path;
use std::process::Command;

use rustccl_net_ib::verbs::types::*;

const HEADER: &str = "/usr/include/infiniband/verbs.h";

/// One line the C program prints: `struct field value`.
struct Check {
    c_struct: &'static str,
    c_field: String,
    rust: usize,
    /// `verbs_context` fields: distance to `context` (which comes after them).
    relative_to_context: bool,
}

/// `fields!(rust_type => "c_struct" { field, field.sub, rust_name as "c_name", ... })`: the
/// offset of each field and the struct's size.
macro_rules! fields {
    (@name $($f:ident).+ as $cname:literal) => { $cname.to_string() };
    (@name $($f:ident).+) => { stringify!($($f).+).replace(' ', "") };
    ($checks:ident, $ty:ty => $c:literal { $($($f:ident).+ $(as $cname:literal)?),* $(,)? }) => {{
        $(
            $checks.push(Check {
                c_struct: $c,
                c_field: fields!(@name $($f).+ $(as $cname)?),
                rust: offset_of!($ty, $($f).+),
                relative_to_context: false,
            });
        )*
        $checks.push(Check { c_struct: $c, c_field: "sizeof".into(), rust: size_of::<$ty>(), relative_to_context: false });
    }};
}

fn checks() -> Vec<Check> {
    let mut c = Vec::new();
    fields!(c, ibv_device => "ibv_device" { _ops, node_type, transport_type, name, dev_name, dev_path, ibdev_path });
    fields!(c, ibv_context_ops => "ibv_context_ops" {
        _compat_query_device, _compat_query_port, _compat_alloc_pd, _compat_dealloc_pd, _compat_reg_mr,
        _compat_rereg_mr, _compat_dereg_mr, alloc_mw, bind_mw, dealloc_mw, _compat_create_cq, poll_cq,
        req_notify_cq, _compat_cq_event, _compat_resize_cq, _compat_destroy_cq, _compat_create_srq,
        _compat_modify_srq, _compat_query_srq, _compat_destroy_srq, post_srq_recv, _compat_create_qp,
        _compat_query_qp, _compat_modify_qp, _compat_destroy_qp, post_send, post_recv, _compat_create_ah,
        _compat_destroy_ah, _compat_attach_mcast, _compat_detach_mcast, _compat_async_event,
    });
    fields!(c, ibv_context => "ibv_context" { device, ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat });
    fields!(c, ibv_device_attr => "ibv_device_attr" {
        fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap, vendor_id, vendor_part_id, hw_ver,
        max_qp, max_qp_wr, device_cap_flags, max_sge, max_sge_rd, max_cq, max_cqe, max_mr, max_pd,
        max_qp_rd_atom, max_ee_rd_atom, max_res_rd_atom, max_qp_init_rd_atom, max_ee_init_rd_atom,
        atomic_cap, max_ee, max_rdd, max_mw, max_raw_ipv6_qp, max_raw_ethy_qp, max_mcast_grp,
        max_mcast_qp_attach, max_total_mcast_qp_attach, max_ah, max_fmr, max_map_per_fmr, max_srq,
        max_srq_wr, max_srq_sge, max_pkeys, local_ca_ack_delay, phys_port_cnt,
    });
    fields!(c, ibv_port_attr => "ibv_port_attr" {
        state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz, bad_pkey_cntr,
        qkey_viol_cntr, pkey_tbl_len, lid, sm_lid, lmc, max_vl_num, sm_sl, subnet_timeout,
        init_type_reply, active_width, active_speed, phys_state, link_layer, flags, port_cap_flags2,
    });
    fields!(c, ibv_gid => "ibv_gid" { raw });
    fields!(c, ibv_gid_entry => "ibv_gid_entry" { gid, gid_index, port_num, gid_type, ndev_ifindex });
    fields!(c, ibv_pd => "ibv_pd" { context, handle });
    fields!(c, ibv_mr => "ibv_mr" { context, pd, addr, length, handle, lkey, rkey });
    fields!(c, ibv_comp_channel => "ibv_comp_channel" { context, fd, refcnt });
    fields!(c, ibv_cq => "ibv_cq" {
        context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed, async_events_completed,
    });
    fields!(c, ibv_qp => "ibv_qp" {
        context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type, mutex, cond,
        events_completed,
    });
    fields!(c, ibv_qp_cap => "ibv_qp_cap" { max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data });
    fields!(c, ibv_qp_init_attr => "ibv_qp_init_attr" { qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all });
    fields!(c, ibv_global_route => "ibv_global_route" { dgid, flow_label, sgid_index, hop_limit, traffic_class });
    fields!(c, ibv_ah_attr => "ibv_ah_attr" { grh, dlid, sl, src_path_bits, static_rate, is_global, port_num });
    fields!(c, ibv_qp_attr => "ibv_qp_attr" {
        qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn, dest_qp_num,
        qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index, alt_pkey_index, en_sqd_async_notify,
        sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt,
        rnr_retry, alt_port_num, alt_timeout, rate_limit,
    });
    fields!(c, ibv_sge => "ibv_sge" { addr, length, lkey });
    fields!(c, ibv_send_wr => "ibv_send_wr" {
        wr_id, next, sg_list, num_sge, opcode, send_flags, imm_data, wr, wr.rdma.remote_addr, wr.rdma.rkey,
        wr.atomic.remote_addr, wr.atomic.compare_add, wr.atomic.swap, wr.atomic.rkey,
        qp_type as "qp_type.xrc.remote_srqn", _bind_mw_tso as "bind_mw",
    });
    fields!(c, ibv_recv_wr => "ibv_recv_wr" { wr_id, next, sg_list, num_sge });
    fields!(c, ibv_wc => "ibv_wc" {
        wr_id, status, opcode, vendor_err, byte_len, imm_data, qp_num, src_qp, wc_flags, pkey_index,
        slid, sl, dlid_path_bits,
    });
    fields!(c, ibv_async_event => "ibv_async_event" { element, element.cq, element.qp, element.port_num, event_type });

    // verbs_context: distance of each field to `context`.
    let ctx = offset_of!(verbs_context, context);
    let mut v = Vec::new();
    fields!(v, verbs_context => "verbs_context" {
        query_port, advise_mr, alloc_null_mr, read_counters, attach_counters_point_flow, create_counters,
        destroy_counters, reg_dm_mr, alloc_dm, free_dm, modify_flow_action_esp, destroy_flow_action,
        create_flow_action_esp, modify_qp_rate_limit, alloc_parent_domain, dealloc_td, alloc_td, modify_cq,
        post_srq_ops, destroy_rwq_ind_table, create_rwq_ind_table, destroy_wq, modify_wq, create_wq,
        query_rt_values, create_cq_ex, priv_ as "priv", query_device_ex, ibv_destroy_flow, ABI_placeholder2,
        ibv_create_flow, ABI_placeholder1, open_qp, create_qp_ex, get_srq_num, create_srq_ex, open_xrcd,
        close_xrcd, _ABI_placeholder3, sz, context,
    });
    for mut check in v {
        if check.c_field == "sizeof" {
            // The struct ends with `context`: its size past `context` is ibv_context's.
            check.rust -= ctx;
        } else {
            check.rust = ctx - check.rust;
        }
        check.relative_to_context = true;
        c.push(check);
    }
    c
}

/// The C program printing `struct field value` for every check.
fn c_program(checks: &[Check]) -> String {
    let mut src = String::from("#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\nint main(void) {\n");
    for c in checks {
        let f = &c.c_field;
        // `union ibv_gid` is the one union among them.
        let s = if c.c_struct == "ibv_gid" {
            "union ibv_gid".to_string()
        } else {
            format!("struct {}", c.c_struct)
        };
        let value = match (c.relative_to_context, f.as_str()) {
            (false, "sizeof") => format!("sizeof({s})"),
            (false, _) => format!("offsetof({s}, {f})"),
            (true, "sizeof") => format!("sizeof({s}) - offsetof({s}, context)"),
            (true, _) => format!("offsetof({s}, context) - offsetof({s}, {f})"),
        };
        src.push_str(&format!(
            "  printf(\"{} {f} %zu\\n\", (size_t)({value}));\n",
            c.c_struct
        ));
    }
    src.push_str("  return 0;\n}\n");
    src
}

#[test]
fn rust_layouts_match_verbs_h() {
    if !Path::new(HEADER).is_file() {
        println!("skipped: {HEADER} is absent (install libibverbs-dev to run this check)");
        return;
    }
    let checks = checks();
    let dir = std::env::temp_dir().join(format!("rustccl-verbs-offsets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, exe) = (dir.join("offsets.c"), dir.join("offsets"));
    std::fs::write(&src, c_program(&checks)).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&cc)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(
        built.status.success(),
        "{cc} failed on {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&built.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    let out = String::from_utf8(run.stdout).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();

    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), checks.len());
    let mut wrong = Vec::new();
    for (line, check) in lines.iter().zip(&checks) {
        let c: usize = line.rsplit(' ').next().unwrap().parse().unwrap();
        if c != check.rust {
            wrong.push(format!(
                "{}.{}: C {c}, Rust {}",
                check.c_struct, check.c_field, check.rust
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} layouts differ from {HEADER}:\n{}",
        wrong.len(),
        checks.len(),
        wrong.join("\n")
    );
    println!("{} offsets and sizes match {HEADER}", checks.len());
}
