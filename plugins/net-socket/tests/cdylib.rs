//! Loads this package's own `cdylib` as the host would (libloading + the plugin-api export
//! lookup) and runs a round trip through the C ABI table ([`NetV1Client`]); its v2 table
//! answers `make_vdevice` with a clean "not supported".
//!
//! Cargo builds the library's crate types (the `cdylib` included) before the integration
//! tests, into `target/<profile>/deps/`, next to this test's executable (`cargo build` also
//! copies it to `target/<profile>/`): a missing library is a failure, not a skip.

mod common;

use std::path::PathBuf;

use common::*;
use rustccl_plugin_api::export::{find, PluginKind};
use rustccl_plugin_api::net::{Net, NetCommConfig, NetV1, NetV1Client, NetV2, NetV2Client, PTR_DEVICE, VDEVICE_NOT_SUPPORTED};
use rustccl_plugin_api::PluginError;

fn cdylib_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps directory");
    let file = format!(
        "{}rustccl_net_socket{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    [Some(deps.join(&file)), deps.parent().map(|p| p.join(&file))]
        .into_iter()
        .flatten()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{file} not found next to {}", exe.display()))
}

#[test]
fn round_trip_through_the_loaded_library() {
    let path = cdylib_path();
    // SAFETY: loading our own plugin library, whose initialisers only set up statics.
    let lib = unsafe { libloading::Library::new(&path) }
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let lib: &'static libloading::Library = Box::leak(Box::new(lib));
    let table = find::<NetV1>(lib, PluginKind::Net, 1)
        .unwrap()
        .expect("rustccl_net_v1 exported");
    let net = NetV1Client { table };
    assert_eq!(net.name(), "Socket");

    let ctx = net.init(11, &NetCommConfig::default(), QUIET).unwrap();
    let props = net.properties(ctx, 0).unwrap();
    assert!(!props.name.is_empty());
    assert_eq!(props.max_recvs, 1);
    net.finalize(ctx).unwrap();

    let p = connect_pair(&net);
    for (i, size) in [0usize, 5, 1 << 20].into_iter().enumerate() {
        let src = pattern(size, i as u64);
        let (dst, got) = round_trip(&net, &p, &src, size + 7);
        assert_eq!(got, size);
        assert!(dst[..size] == src[..]);
    }
    // Errors cross the table with their code and message.
    let err = net.reg_mr(p.send, 4096, 1, PTR_DEVICE).unwrap_err();
    assert_eq!(err.code, PluginError::INVALID_USAGE);
    assert!(err.message.contains("host memory only"), "{err}");
    let err = net
        .test(rustccl_plugin_api::PluginHandle { id: 42 }, &mut [0])
        .unwrap_err();
    assert_eq!(err.code, PluginError::INVALID_ARGUMENT);
    close_pair(&net, p);

    let v2 = NetV2Client { table: find::<NetV2>(lib, PluginKind::Net, 2).unwrap().expect("rustccl_net_v2 exported") };
    assert_eq!(v2.name(), "Socket");
    let ctx = v2.init(12, &NetCommConfig::default(), QUIET).unwrap();
    let err = v2.make_vdevice(ctx, &[0]).unwrap_err();
    assert_eq!((err.code, err.message.as_str()), (PluginError::INVALID_USAGE, VDEVICE_NOT_SUPPORTED));
    v2.finalize(ctx).unwrap();
}
