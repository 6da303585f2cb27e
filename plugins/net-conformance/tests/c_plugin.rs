//! NCCL C net plugins pass the conformance suite through the host's C adapter: the C test
//! plugin "CTcp" (`plugins/testing/c-net-tcp`) as its v11 build (which also exports v6: the
//! newest table is used), its v6-only build (int sizes, process-wide init, no context), and
//! its builds whose newest table is v7, v8, v9, v10 or v12; and with `NCCL_NET_FORCE_MERGE`
//! fusing its two devices, over the virtual device.

use std::path::PathBuf;
use std::process::Command;

fn suite() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    let dir = if dir.ends_with("deps") { dir.parent().unwrap() } else { dir };
    dir.join("rustccl-net-conformance")
}

/// Runs the suite on CTcp build `variant` with messages up to `max_size`; returns its output.
fn run_suite_with(variant: &str, abi: &str, max_size: usize, env: &[(&str, &str)]) -> String {
    let lib = rustccl_tests::c_net_plugin(variant);
    let out = Command::new(suite())
        .arg(&lib)
        .args(["--max-size", &max_size.to_string()])
        .env("NCCL_SOCKET_IFNAME", "lo")
        .envs(env.iter().copied())
        .output()
        .expect("run the suite");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("# net plugin CTcp ({abi})")), "{stdout}");
    assert!(out.status.success(), "conformance failures:\n{stdout}");
    assert!(stdout.contains("9 passed, 0 failed"), "{stdout}");
    stdout
}

fn run_suite(variant: &str, abi: &str) {
    // 256 MiB is the largest size: the 1 GiB case of the socket plugin's run adds nothing for
    // an adapter (v6's int limit is checked by the adapter's own tests) but seconds of CI.
    let out = run_suite_with(variant, abi, 256 << 20, &[]);
    assert!(out.contains("# device 0 of 2: lo\n"), "CTcp has two devices, device 0 on lo: {out}");
}

#[test]
fn c_plugin_v11_passes_the_conformance_suite() {
    run_suite("v11", "NCCL C net ABI v11");
}

#[test]
fn c_plugin_v6_only_passes_the_conformance_suite() {
    run_suite("v6", "NCCL C net ABI v6");
}

/// The builds whose newest table is v7, v8, v9, v10 and v12 (each exports only that table),
/// with messages up to 4 MiB (the large sizes are the v11 and v6 runs' business).
#[test]
fn c_plugin_v7_to_v12_builds_pass_the_conformance_suite() {
    for v in [7, 8, 9, 10, 12] {
        let out = run_suite_with(&format!("v{v}"), &format!("NCCL C net ABI v{v}"), 4 << 20, &[]);
        assert!(out.contains("# device 0 of 2: lo\n"), "v{v}: {out}");
    }
}

/// `NCCL_NET_FORCE_MERGE` naming CTcp's two devices: the adapter presents one device, the
/// virtual one the plugin made (v9's table: 4 members at most; v12's: 8), and the suite passes
/// over it.
#[test]
fn the_suite_passes_over_a_virtual_device() {
    for (variant, abi) in [("v12", "NCCL C net ABI v12"), ("v9", "NCCL C net ABI v9")] {
        let out = run_suite_with(variant, abi, 4 << 20, &[("NCCL_NET_FORCE_MERGE", "lo,ctcp-lo")]);
        assert!(out.contains("# device 0 of 1: lo+ctcp-lo\n"), "{variant}: {out}");
    }
}

/// The adapter's own rules, on the v6 build: int-sized calls refuse what does not fit, a
/// missing optional member (regMrDmaBuf) is a clear error, contexts are the adapter's own
/// (init twice, finalize twice, and a finalized context is stale), and stale handles of every
/// kind are errors.
#[test]
fn the_adapter_keeps_the_v6_abis_limits_and_refuses_stale_handles() {
    use rustccl_plugin_api::net::{NetCommConfig, PTR_HOST};
    use rustccl_plugin_api::{LogFn, PluginHandle};
    extern "C" fn quiet(_: i32, _: u64, _: abi_stable::std_types::RStr<'_>) {}
    let loaded = rustccl_net_conformance::load(&rustccl_tests::c_net_plugin("v6").to_string_lossy()).unwrap();
    let net = &*loaded.net;
    let log = LogFn { log: quiet };
    let a = net.init(1, &NetCommConfig::default(), log).unwrap();
    let b = net.init(2, &NetCommConfig::default(), log).unwrap();
    assert_ne!(a, b, "each communicator gets a context of its own");
    assert_eq!(net.devices(b).unwrap(), 2);
    assert_eq!(net.properties(b, 1).unwrap().name.as_str(), "ctcp-lo");
    let e = net.properties(b, 2).unwrap_err();
    assert!(e.message.contains("no device 2: it presents 2 device(s)"), "{}", e.message);
    let props = net.properties(a, 0).unwrap();
    assert_eq!(props.pci_path.as_str(), "", "a NULL pciPath reads as empty");
    assert_eq!(props.max_p2p_bytes, 1 << 30, "v6 predates maxP2pBytes: NCCL's 1 GiB");
    net.finalize(a).unwrap();
    assert!(net.finalize(a).is_err(), "a finalized context is stale");
    assert!(net.devices(a).is_err());

    let env = rustccl_net_conformance::Env { net, ctx: b, dev: 0, max_size: 0 };
    let pair = rustccl_net_conformance::connect_pair(&env).unwrap();
    let e = net.reg_mr(pair.send, 0x1000, 3 << 30, PTR_HOST).unwrap_err();
    assert!(e.message.contains("NCCL C net ABI v6 allows"), "{}", e.message);
    let buf = [0u8; 16];
    let mr = net.reg_mr(pair.send, buf.as_ptr() as usize, buf.len(), PTR_HOST).unwrap();
    // SAFETY: refused before anything is read (the size is checked first).
    let e = unsafe { net.isend(pair.send, buf.as_ptr() as usize, (1 << 30) + 1, 0, mr) }.unwrap_err();
    assert!(e.message.contains("isend of 1073741825 bytes is larger than NCCL C net ABI v6 allows"), "{}", e.message);
    let e = net.reg_mr_dmabuf(pair.send, 0x1000, 4096, PTR_HOST, 0, 3).unwrap_err();
    assert!(e.message.contains("regMrDmaBuf is NULL"), "{}", e.message);
    // Handles of the wrong kind or from nowhere.
    // SAFETY: refused before anything is read (a receive connection cannot send).
    assert!(unsafe { net.isend(pair.recv, buf.as_ptr() as usize, 1, 0, mr) }.is_err());
    assert!(net.dereg_mr(pair.recv, mr).is_err(), "a registration belongs to its connection");
    assert!(net.close_recv(pair.send).is_err(), "a send connection is not closed as a receive one");
    assert!(net.accept(PluginHandle { id: 999_999 }).is_err());
    net.dereg_mr(pair.send, mr).unwrap();
    assert!(net.dereg_mr(pair.send, mr).is_err(), "deregistered twice");
    pair.close(&env).unwrap();
    net.finalize(b).unwrap();
}
