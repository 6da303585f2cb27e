//! Env plugins (`NCCL_ENV_PLUGIN`, NCCL's `ncclEnvPlugin_v1`/`_v2` and rustccl's
//! `rustccl_env_v1`): the library resolves every parameter through the plugin, loaded once per
//! process before anything reads a parameter (the log level included).
//!
//! `plugins/testing/c-env/c_env.c` (compiled here per ABI version) answers `NCCL_DEBUG=INFO` and
//! `NCCL_PROTO=Simple` whatever the environment says; `librustccl_test_env.so`
//! (`plugins/testing/env-rust`) answers `NCCL_ALGO=Ring` and hides `NCCL_SHM_DISABLE`.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use rustccl_tests::*;

/// `c_env.c` compiled with `flags` into `target/<profile>/c-env/<file>` (renamed into place).
fn c_env(file: &str, flags: &[&str]) -> String {
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let out = worker_path().parent().unwrap().join("c-env").join(file);
    let mut options = vec!["-std=gnu99", "-Wall", "-Wextra", "-Werror", "-pthread"];
    options.extend_from_slice(flags);
    compile_c_plugin(&["c-env/c_env.c"], &out, &options);
    out.to_string_lossy().into_owned()
}

const SIZES: &str = "4096,65536,1048576";

/// Two ranks run `tuned-sizes` (the planner's choice per size, then the all-reduce, checked)
/// with `env` on top of the harness's (`NCCL_DEBUG=WARN`); returns rank 0's choices and log.
fn two_ranks(env: &[(&str, &str)]) -> (Vec<String>, String) {
    let ids = ids_arg(&[new_id()]);
    let mut all = vec![("RUSTCCL_TEST_SIZES", SIZES), ("NCCL_TUNER_PLUGIN", "none")];
    all.extend_from_slice(env);
    let outs = finish_all(spawn("tuned-sizes", 2, &[0, 1], &ids, &all), Duration::from_secs(90));
    assert_all_ok(&outs);
    let choices = outs[0].results().iter().filter_map(|l| l.strip_prefix("choice ")).map(str::to_string).collect();
    (choices, outs[0].stderr.clone())
}

/// One process runs `env-params` for `names` with `env`; returns `name -> (value, source)`
/// lines as "value source" and the log.
fn params(names: &str, env: &[(&str, &str)]) -> (Vec<(String, String)>, String) {
    let mut all = vec![("RUSTCCL_TEST_PARAMS", names)];
    all.extend_from_slice(env);
    let outs = finish_all(spawn("env-params", 1, &[0], "none", &all), Duration::from_secs(30));
    assert_all_ok(&outs);
    let lines = outs[0]
        .results()
        .iter()
        .filter_map(|l| l.strip_prefix("param "))
        .map(|l| {
            let (name, rest) = l.split_once(' ').unwrap();
            (name.to_string(), rest.to_string())
        })
        .collect();
    (lines, outs[0].stderr.clone())
}

fn param<'a>(lines: &'a [(String, String)], name: &str) -> &'a str {
    &lines.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no line for {name}: {lines:?}")).1
}

fn info_lines(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains(" NCCL INFO ")).collect()
}

#[test]
fn a_c_env_plugin_decides_the_log_level_and_the_protocol() {
    let path = c_env("libnccl-env-c-v1.so", &[]);
    let (base, base_log) = two_ranks(&[("NCCL_ENV_PLUGIN", "none")]);
    assert!(info_lines(&base_log).is_empty(), "NCCL_DEBUG=WARN from the environment: {base_log}");
    assert!(base.iter().any(|c| !c.contains(" SIMPLE ")), "the planner alone picks another protocol somewhere: {base:?}");

    let (choices, log) = two_ranks(&[("NCCL_ENV_PLUGIN", &path)]);
    assert_eq!(choices.len(), 3, "{choices:?}");
    for c in &choices {
        assert!(c.contains(" SIMPLE "), "the plugin's NCCL_PROTO=Simple decides: {choices:?}");
    }
    assert!(!info_lines(&log).is_empty(), "the plugin's NCCL_DEBUG=INFO beats the environment's WARN: {log}");
    let using: Vec<&str> = log.lines().filter(|l| l.contains("ENV/Plugin: using")).collect();
    assert_eq!(using.len(), 1, "{log}");
    assert!(using[0].contains(&format!("using c-env (NCCL C env ABI v1) from {path}: NCCL_ENV_PLUGIN={path}")), "{log}");
    assert!(log.contains("NCCL_PROTO set by env plugin c-env to Simple"), "{log}");
    assert!(log.contains("c-env: finalize after "), "finalize runs at exit: {log}");
    assert!(!log.contains("c-env: asked for NCCL_ENV_PLUGIN"), "{log}");
}

#[test]
fn a_v2_c_env_plugin_gets_the_logger_and_sources_are_reported() {
    let path = c_env("libnccl-env-c-v2.so", &["-DENV_VERSION=2"]);
    let (lines, log) = params(
        "NCCL_PROTO,NCCL_SOCKET_IFNAME,NCCL_ALGO,NCCL_ENV_PLUGIN,NCCL_MIN_CTAS",
        &[("NCCL_ENV_PLUGIN", &path), ("NCCL_MIN_CTAS", "3")],
    );
    assert_eq!(param(&lines, "NCCL_PROTO"), "Simple EnvPlugin");
    assert_eq!(param(&lines, "NCCL_SOCKET_IFNAME"), "lo EnvVar", "passed through from the environment");
    assert_eq!(param(&lines, "NCCL_MIN_CTAS"), "3 EnvVar");
    assert_eq!(param(&lines, "NCCL_ALGO"), "- Default");
    assert_eq!(param(&lines, "NCCL_ENV_PLUGIN"), format!("{path} EnvVar"));
    assert!(log.contains(&format!("ENV/Plugin: using c-env (NCCL C env ABI v2) from {path}")), "{log}");
    let version = rustccl::version::NCCL_VERSION_CODE;
    let v = format!("{}.{}.{}", version / 10000, version / 100 % 100, version % 100);
    assert!(log.contains(&format!("c-env: v2 init for NCCL {v}")), "the plugin's own line, logged once the level is known: {log}");
    assert!(log.contains("NCCL_PROTO (const char *) [Published]"), "{log}");
    assert!(log.contains("current value=Simple set_by=EnvPlugin"), "{log}");
    assert!(log.contains("current value=lo set_by=EnvVar"), "{log}");
    assert!(log.contains("NCCL_COMM_BLOCKING (int64_t) [Published] ") && log.contains("set_by=Default"), "{log}");
}

#[test]
fn a_rust_env_plugin_answers_through_rustccls_abi() {
    let path = built_lib("librustccl_test_env.so");
    let env = [("NCCL_ENV_PLUGIN", path.as_str()), ("NCCL_DEBUG", "INFO"), ("NCCL_SHM_DISABLE", "1"), ("NCCL_PROTO", "LL")];
    let (lines, log) = params("NCCL_ALGO,NCCL_SHM_DISABLE,NCCL_PROTO", &env);
    assert_eq!(param(&lines, "NCCL_ALGO"), "Ring EnvPlugin");
    assert_eq!(param(&lines, "NCCL_SHM_DISABLE"), "0 Default", "the plugin leaves it unset: the default applies");
    assert_eq!(param(&lines, "NCCL_PROTO"), "LL EnvVar");
    assert!(log.contains(&format!("ENV/Plugin: using rust-env (rustccl env ABI v1) from {path}: NCCL_ENV_PLUGIN={path}")), "{log}");
    assert!(log.contains("rust-env: init for NCCL 2."), "{log}");
}

#[test]
fn a_plugin_under_the_default_name_is_found_without_the_variable() {
    let path = c_env("default/libnccl-env.so", &[]);
    let dir = PathBuf::from(&path).parent().unwrap().to_string_lossy().into_owned();
    let (lines, log) = params("NCCL_PROTO", &[("LD_LIBRARY_PATH", &dir)]);
    assert_eq!(param(&lines, "NCCL_PROTO"), "Simple EnvPlugin");
    assert!(log.contains("ENV/Plugin: using c-env (NCCL C env ABI v1) from ") && log.contains("NCCL_ENV_PLUGIN unset, found under its default name"), "{log}");
}

#[test]
fn none_a_missing_plugin_and_a_failing_init_leave_the_environment_in_charge() {
    let env_values = [("NCCL_DEBUG", "INFO"), ("NCCL_PROTO", "LL")];
    let run = |plugin: &str| {
        let mut env = env_values.to_vec();
        env.push(("NCCL_ENV_PLUGIN", plugin));
        params("NCCL_PROTO", &env)
    };

    let (lines, log) = run("none");
    assert_eq!(param(&lines, "NCCL_PROTO"), "LL EnvVar");
    assert!(log.contains("ENV/Plugin: none in use (NCCL_ENV_PLUGIN=none)"), "{log}");

    let missing = "/nonexistent/libnccl-env-missing.so";
    let (lines, log) = run(missing);
    assert_eq!(param(&lines, "NCCL_PROTO"), "LL EnvVar");
    let warned: Vec<&str> = log.lines().filter(|l| l.contains(" NCCL WARN ") && l.contains("ENV/Plugin: skipped")).collect();
    assert_eq!(warned.len(), 1, "{log}");
    assert!(warned[0].contains(&format!("skipped {missing}: no such library")), "{log}");
    assert!(log.contains("ENV/Plugin: none in use; parameters come from the process environment"), "{log}");

    let failing = c_env("libnccl-env-c-init-fails.so", &["-DENV_INIT_FAILS"]);
    let (lines, log) = run(&failing);
    assert_eq!(param(&lines, "NCCL_PROTO"), "LL EnvVar");
    assert!(
        log.lines().any(|l| l.contains(" NCCL WARN ")
            && l.contains(&format!("ENV/Plugin: skipped c-env ({failing}): init failed: c-env (NCCL C env v1) init returned ncclInternalError"))),
        "{log}"
    );
    assert!(!log.contains("c-env: finalize"), "no finalize for a plugin whose init failed: {log}");
}

#[test]
fn a_configuration_file_fills_what_the_environment_leaves_unset() {
    let dir = worker_path().parent().unwrap().join("c-env");
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join(format!("nccl.{}.conf", std::process::id()));
    std::fs::write(&conf, "# a site's settings\nNCCL_PROTO=LL\nNCCL_MIN_CTAS=5\n#NCCL_ALGO=Tree\nNCCL_DEBUG=INFO\n").unwrap();
    let conf_path = conf.to_string_lossy().into_owned();
    let names = "NCCL_PROTO,NCCL_MIN_CTAS,NCCL_ALGO,NCCL_CONF_FILE";
    let (lines, log) = params(names, &[("NCCL_CONF_FILE", &conf_path), ("NCCL_MIN_CTAS", "3"), ("NCCL_DEBUG", "")]);
    assert_eq!(param(&lines, "NCCL_PROTO"), "LL ConfigFile");
    assert_eq!(param(&lines, "NCCL_MIN_CTAS"), "3 EnvVar", "the environment wins over the file");
    assert_eq!(param(&lines, "NCCL_ALGO"), "- Default", "a comment sets nothing");
    assert_eq!(param(&lines, "NCCL_CONF_FILE"), format!("{conf_path} EnvVar"));
    assert!(!info_lines(&log).is_empty(), "the file's NCCL_DEBUG=INFO sets the log level: {log}");
    assert!(log.contains("current value=LL set_by=ConfigFile"), "{log}");

    // With an env plugin in use, its answer is final: the files are not consulted.
    let plugin = c_env("libnccl-env-c-v1.so", &[]);
    let (lines, _) = params(names, &[("NCCL_CONF_FILE", &conf_path), ("NCCL_ENV_PLUGIN", &plugin)]);
    assert_eq!(param(&lines, "NCCL_PROTO"), "Simple EnvPlugin");
    assert_eq!(param(&lines, "NCCL_MIN_CTAS"), "1 Default");
    std::fs::remove_file(&conf).unwrap();
}
