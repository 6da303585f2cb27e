//! The suite's `make_vdevice` check: over the IB stub (`plugins/testing/net-ib-stub`, rustccl
//! net ABI v2, two devices) it makes `stub_0+stub_1` at the summed speed and moves a message
//! over it; over a v1 plugin (`net-named`'s Loopback) it finds make_vdevice not offered, with
//! the reason; bad requests are errors for both.

use std::path::PathBuf;

use rustccl_net_conformance::{load, try_make_vdevice, Env, VDeviceOutcome};

fn built(name: &str) -> String {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    let dir: PathBuf = if dir.ends_with("deps") { dir.parent().unwrap().to_path_buf() } else { dir.to_path_buf() };
    let path = [dir.join(name), dir.join("deps").join(name)].into_iter().find(|p| p.exists());
    path.unwrap_or_else(|| panic!("{name} not built in {} (run `cargo build --release` first)", dir.display()))
        .to_string_lossy()
        .into_owned()
}

#[test]
fn a_v2_plugin_makes_a_virtual_device_named_and_rated_as_nccl_does() {
    let loaded = load(&built("librustccl_test_net_ib_stub.so")).unwrap();
    assert_eq!((loaded.name.as_str(), loaded.abi.as_str()), ("IB", "rustccl net ABI v2"));
    let env = Env::new(&*loaded.net, 1 << 20).unwrap();
    match try_make_vdevice(&env).unwrap() {
        VDeviceOutcome::Merged { index, props } => {
            assert_eq!(index, 2, "numbered after the two physical devices");
            assert_eq!(props.name.as_str(), "stub_0+stub_1");
            assert_eq!(props.speed_mbps, 300_000);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(env.net.devices(env.ctx).unwrap(), 3);
}

#[test]
fn a_v1_plugin_has_no_make_vdevice() {
    let loaded = load(&built("librustccl_test_net_named.so")).unwrap();
    assert_eq!(loaded.abi, "rustccl net ABI v1");
    let env = Env::new(&*loaded.net, 1 << 20).unwrap();
    // Loopback has one device: nothing to fuse, but the bad requests are still refused.
    assert_eq!(try_make_vdevice(&env).unwrap(), VDeviceOutcome::TooFewDevices(1));
    let e = env.net.make_vdevice(env.ctx, &[0]).unwrap_err();
    assert!(e.message.contains("v1 table predates make_vdevice"), "{e}");
}
