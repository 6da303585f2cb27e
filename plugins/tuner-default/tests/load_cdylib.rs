//! Loads this package's own `cdylib` with libloading, finds its tables with
//! `rustccl_plugin_api::export::find` (magic and layout checked) as rustccl will, and drives
//! it through the stable ABI, in both versions.
//!
//! Cargo builds every crate type of the package's library (including the `cdylib`) before
//! its integration tests, into `target/<profile>/deps/` next to this test's executable
//! (`cargo build` also copies it up to `target/<profile>/`), so the library is always there.
//!
//! This file holds a single test because it sets `NCCL_TUNER_CONFIG_FILE` for the whole
//! process.

use std::path::PathBuf;
use std::sync::Mutex;

use abi_stable::std_types::RStr;
use rustccl_plugin_api::export::{find, PluginKind};
use rustccl_plugin_api::net::NetV1;
use rustccl_plugin_api::tuner::{Tuner, TunerV1, TunerV1Client, TunerV2, TunerV2Client};
use rustccl_plugin_api::{Algorithm, CollType, CostTable, LogFn, Protocol};

/// `librustccl_tuner_default.so` (or the platform's naming) in `target/<profile>/` or
/// `target/<profile>/deps/`, found from this test executable at `target/<profile>/deps/<test>`.
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

static LOGGED: Mutex<Vec<(i32, u64, String)>> = Mutex::new(Vec::new());

extern "C" fn record_log(level: i32, subsys: u64, message: RStr<'_>) {
    LOGGED.lock().unwrap().push((level, subsys, message.to_string()));
}

const LOG: LogFn = LogFn { log: record_log };

fn fresh() -> Vec<f32> {
    vec![7.0f32; 7 * 3]
}

/// Runs one get_coll_info on a fresh table; returns the table and the channel count.
fn ask(tuner: &dyn Tuner, ctx: rustccl_plugin_api::PluginHandle, coll: CollType, nbytes: usize, channels: i32) -> (Vec<f32>, i32) {
    let mut raw = fresh();
    let mut channels = channels;
    let mut table = CostTable::new(&mut raw, 7, 3).unwrap();
    tuner.get_coll_info(ctx, coll, nbytes, 1, &mut table, &mut channels).unwrap();
    (raw, channels)
}

fn best(raw: &mut [f32]) -> Option<(Algorithm, Protocol, f32)> {
    CostTable::new(raw, 7, 3).unwrap().best()
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
    // SAFETY: loading our own plugin; its initialisers have no requirements.
    let lib: &'static libloading::Library =
        Box::leak(Box::new(unsafe { libloading::Library::new(&path) }.unwrap()));
    let v2 = find::<TunerV2>(lib, PluginKind::Tuner, 2).unwrap().expect("rustccl_tuner_v2");
    let v1 = find::<TunerV1>(lib, PluginKind::Tuner, 1).unwrap().expect("rustccl_tuner_v1");
    assert_eq!(v2.name.as_str(), "csv-table");
    assert_eq!(v1.name.as_str(), "csv-table");
    // Not exported: no v3, no net.
    assert!(find::<TunerV2>(lib, PluginKind::Tuner, 3).unwrap().is_none());
    assert!(find::<NetV1>(lib, PluginKind::Net, 1).unwrap().is_none());
    // Reading the v2 symbol as a v1 table is refused by the layout check.
    let err = find::<TunerV1>(lib, PluginKind::Tuner, 2).map(|_| ()).unwrap_err();
    assert!(err.contains("rustccl_tuner_v2 does not match") && !err.contains('\n'), "{err}");

    let v2 = TunerV2Client { table: v2 };
    let v1 = TunerV1Client { table: v1 };
    for (version, tuner) in [(2, &v2 as &dyn Tuner), (1, &v1)] {
        LOGGED.lock().unwrap().clear();
        let ctx = tuner.init(0xabc, 8, 1, LOG).unwrap();
        {
            let logged = LOGGED.lock().unwrap();
            let warn = logged.iter().find(|(level, _, _)| *level == 2).expect("a warning");
            assert_eq!(warn.1, rustccl_plugin_api::subsys::TUNING);
            assert!(warn.2.contains("skipped malformed line 3"), "{logged:?}");
            let info = logged.iter().find(|(level, _, _)| *level == 3).expect("an info line");
            assert!(info.2.contains("2 rules"), "{logged:?}");
            if version == 2 {
                assert!(info.2.contains("0xabc"), "{logged:?}");
            }
        }

        // Matching allreduce: tree/LL becomes the cheapest, channels set.
        let (mut raw, channels) = ask(tuner, ctx, CollType::AllReduce, 4096, -1);
        assert_eq!(channels, 2);
        assert_eq!(raw.iter().filter(|&&c| c == 0.0).count(), 1, "exactly one entry changed: {raw:?}");
        assert_eq!(best(&mut raw), Some((Algorithm::Tree, Protocol::Ll, 0.0)));

        // Too large for the allreduce rule: unchanged.
        assert_eq!(ask(tuner, ctx, CollType::AllReduce, 4097, -1), (fresh(), -1));

        // The line after the malformed one was still read.
        let (mut raw, channels) = ask(tuner, ctx, CollType::AllGather, 1 << 30, 5);
        assert_eq!(best(&mut raw), Some((Algorithm::Ring, Protocol::Simple, 0.0)));
        assert_eq!(channels, 5);

        assert_eq!(
            tuner.get_chunk_size(ctx, CollType::AllGather, 1 << 30, Algorithm::Ring, Protocol::Simple, 4),
            Ok(None)
        );
        tuner.finalize(ctx).unwrap();
        assert!(tuner.finalize(ctx).unwrap_err().message.contains("unknown context"));
    }

    // A missing config file makes init fail with a clear message.
    std::env::set_var("NCCL_TUNER_CONFIG_FILE", dir.join("missing.conf"));
    let err = v2.init(1, 8, 1, LOG).unwrap_err();
    assert!(err.message.contains("missing.conf") && err.message.contains("cannot read"), "{err}");

    // Without the variable the tuner changes nothing.
    std::env::remove_var("NCCL_TUNER_CONFIG_FILE");
    let ctx = v2.init(1, 8, 1, LOG).unwrap();
    assert_eq!(ask(&v2, ctx, CollType::AllReduce, 100, -1), (fresh(), -1));
    v2.finalize(ctx).unwrap();

    std::fs::remove_dir_all(&dir).unwrap();
}
