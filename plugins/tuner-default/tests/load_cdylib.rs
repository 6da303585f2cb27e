//! Loads this package's own `cdylib` through the plugin-api loader, as rustccl
//! will, and drives it through the stable ABI.
//!
//! Cargo builds every crate type of the package's library (including the
//! `cdylib`) before its integration tests, into `target/<profile>/deps/` next to
//! this test's executable (`cargo build` also copies it up to
//! `target/<profile>/`), so the library is always there to be found.
//!
//! This file holds a single test because it sets `NCCL_TUNER_CONFIG_FILE` for
//! the whole process.

use std::path::PathBuf;

use rustccl_plugin_api::{
    load_tuner_from_path, Algorithm, CollType, CostTable, Protocol, TunerInstance,
    PLUGIN_ABI_VERSION,
};

/// `librustccl_tuner_default.so` (or the platform's naming) in
/// `target/<profile>/` or `target/<profile>/deps/`, found from this test
/// executable at `target/<profile>/deps/<test>`.
fn cdylib_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps directory");
    let file = format!(
        "{}rustccl_tuner_default{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    [deps.parent().map(|p| p.join(&file)), Some(deps.join(&file))]
        .into_iter()
        .flatten()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{file} not found next to {}", exe.display()))
}

#[test]
fn loads_cdylib_and_applies_config() {
    let dir = std::env::temp_dir().join(format!("rustccl-tuner-dlopen-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("tuner.conf");
    std::fs::write(
        &config,
        "# small allreduce on one node: tree/LL with 2 channels\n\
         allreduce,0,4096,tree,ll,2,1,-1\n\
         this line is malformed\n\
         allgather,0,18446744073709551615,ring,simple,-1,-1,-1\n",
    )
    .unwrap();
    std::env::set_var("NCCL_TUNER_CONFIG_FILE", &config);

    let path = cdylib_path();
    let module = load_tuner_from_path(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(module.name().as_str(), "rustccl-tuner-default");
    assert_eq!(module.abi_version(), PLUGIN_ABI_VERSION);
    // Loading the same file again works and gives the same module.
    let again = load_tuner_from_path(&path).unwrap();
    assert_eq!(again.name().as_str(), module.name().as_str());

    let tuner = TunerInstance::new(module, 8, 1).unwrap();
    let fresh = || vec![7.0f32; 7 * 3];

    // Matching allreduce: tree/LL becomes the cheapest, channels set.
    let mut raw = fresh();
    let mut channels = -1;
    let mut table = CostTable::new(&mut raw, 7, 3).unwrap();
    tuner
        .get_coll_info(CollType::AllReduce, 4096, &mut table, &mut channels)
        .unwrap();
    assert_eq!(table.best(), Some((Algorithm::Tree, Protocol::Ll, 0.0)));
    assert_eq!(channels, 2);
    let zeroes = raw.iter().filter(|&&c| c == 0.0).count();
    assert_eq!(zeroes, 1, "exactly one entry changed: {raw:?}");

    // Too large for the allreduce rule: unchanged.
    let mut raw = fresh();
    let mut channels = -1;
    let mut table = CostTable::new(&mut raw, 7, 3).unwrap();
    tuner
        .get_coll_info(CollType::AllReduce, 4097, &mut table, &mut channels)
        .unwrap();
    assert_eq!((raw, channels), (fresh(), -1));

    // The line after the malformed one was still read.
    let mut raw = fresh();
    let mut channels = 5;
    let mut table = CostTable::new(&mut raw, 7, 3).unwrap();
    tuner
        .get_coll_info(CollType::AllGather, 1 << 30, &mut table, &mut channels)
        .unwrap();
    assert_eq!(table.best(), Some((Algorithm::Ring, Protocol::Simple, 0.0)));
    assert_eq!(channels, 5);

    tuner.finalize().unwrap();

    // A missing config file makes init fail with a clear message.
    std::env::set_var("NCCL_TUNER_CONFIG_FILE", dir.join("missing.conf"));
    let err = TunerInstance::new(module, 8, 1).unwrap_err();
    assert!(
        err.contains("init failed") && err.contains("missing.conf"),
        "{err}"
    );

    // Without the variable the tuner changes nothing.
    std::env::remove_var("NCCL_TUNER_CONFIG_FILE");
    let tuner = TunerInstance::new(module, 8, 1).unwrap();
    let mut raw = fresh();
    let mut channels = -1;
    let mut table = CostTable::new(&mut raw, 7, 3).unwrap();
    tuner
        .get_coll_info(CollType::AllReduce, 100, &mut table, &mut channels)
        .unwrap();
    assert_eq!((raw, channels), (fresh(), -1));
    drop(tuner);

    std::fs::remove_dir_all(&dir).unwrap();
}
