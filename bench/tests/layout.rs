//! The launcher's layout decision ([`rustccl_bench::layout::plan`]): ranks by default and
//! what happens when ranks share GPUs; and the flags and the MPS probe it reads. No GPU needed.

use rustccl_bench::layout::{
    plan, start_allowed_by_env, start_line, time_slice_line, MpsAction, RankLayout,
};
use rustccl_bench::opts::{parse, DEFAULT_HOST_RANKS};

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

fn layout(nranks: usize, mps: MpsAction) -> RankLayout {
    RankLayout { nranks, mps }
}

#[test]
fn host_backend_keeps_four_ranks_and_never_touches_mps() {
    assert_eq!(DEFAULT_HOST_RANKS, 4);
    for (running, allowed) in [(false, false), (false, true), (true, true)] {
        assert_eq!(plan(None, None, running, allowed), layout(4, MpsAction::Nothing));
        assert_eq!(plan(None, Some(9), running, allowed), layout(9, MpsAction::Nothing));
    }
    // GPUs that could not be counted (or none) count as not on GPUs.
    assert_eq!(plan(Some(0), None, false, false), layout(4, MpsAction::Nothing));
}

#[test]
fn ranks_default_to_the_gpu_count() {
    for g in [1, 2, 8] {
        assert_eq!(plan(Some(g), None, false, false), layout(g, MpsAction::Nothing));
        assert_eq!(plan(Some(g), None, false, true), layout(g, MpsAction::Nothing));
    }
    // Fewer or as many ranks as GPUs: nothing shared.
    assert_eq!(plan(Some(8), Some(2), false, false), layout(2, MpsAction::Nothing));
    assert_eq!(plan(Some(4), Some(4), false, true), layout(4, MpsAction::Nothing));
}

#[test]
fn more_ranks_than_gpus_without_mps_says_it_in_one_line() {
    let l = plan(Some(1), Some(4), false, false);
    assert_eq!(l.nranks, 4);
    let MpsAction::Warn(line) = &l.mps else {
        panic!("{l:?}")
    };
    assert_eq!(line, &time_slice_line(4, 1));
    assert!(!line.contains('\n'), "{line}");
    for part in [
        "4 ranks on 1 GPU without MPS",
        "time-slice",
        "milliseconds per call",
        "nvidia-cuda-mps-control -d",
        "--start-mps",
        "-N 1",
    ] {
        assert!(line.contains(part), "{part:?} not in {line}");
    }
    assert!(time_slice_line(3, 2).contains("3 ranks on 2 GPUs"));
}

#[test]
fn more_ranks_than_gpus_starts_mps_only_when_allowed_and_not_running() {
    assert_eq!(
        plan(Some(1), Some(2), false, true),
        layout(2, MpsAction::Start(start_line(2, 1)))
    );
    assert!(start_line(2, 1).contains("stopped when the benchmark ends"));
    // Already running: nothing to start, nothing to say, whatever the permission.
    assert_eq!(plan(Some(1), Some(2), true, false), layout(2, MpsAction::Nothing));
    assert_eq!(plan(Some(2), Some(5), true, true), layout(5, MpsAction::Nothing));
}

#[test]
fn start_permission_from_the_flag_and_the_variable() {
    assert!(!parse(&args(""), None).unwrap().start_mps);
    assert!(parse(&args("--start-mps -N 2"), None).unwrap().start_mps);
    for v in ["1", "true", " YES ", "on"] {
        assert!(start_allowed_by_env(Some(v)), "{v:?}");
    }
    for v in [None, Some(""), Some("0"), Some("no"), Some("2")] {
        assert!(!start_allowed_by_env(v), "{v:?}");
    }
}

#[test]
fn nranks_given_and_the_root_check_waits_for_the_layout() {
    let o = parse(&args(""), None).unwrap();
    assert!(!o.nranks_given);
    let o = parse(&args("-N 3"), None).unwrap();
    assert!(o.nranks_given && o.nranks == 3);
    // Without -N a root is checked once the launcher picked the ranks.
    let mut o = parse(&args("broadcast -r 5"), None).unwrap();
    o.nranks = 4;
    assert!(o.check_root().unwrap_err().contains("out of range for 4 ranks"));
    o.nranks = 8;
    assert!(o.check_root().is_ok());
}

#[test]
fn mps_running_follows_the_control_socket_in_the_pipe_directory() {
    let dir = std::env::temp_dir().join(format!("rustccl-bench-mps-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The only test in this binary that touches the variable.
    std::env::set_var("CUDA_MPS_PIPE_DIRECTORY", &dir);
    assert_eq!(rustccl_bench::mps::pipe_dir(), dir);
    assert!(!rustccl_bench::mps::running());
    // A plain file is not the daemon's socket.
    std::fs::write(dir.join("control"), b"").unwrap();
    assert!(!rustccl_bench::mps::running());
    std::fs::remove_file(dir.join("control")).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(dir.join("control")).unwrap();
    assert!(rustccl_bench::mps::running());
    drop(_listener);
    let _ = std::fs::remove_dir_all(&dir);
}
