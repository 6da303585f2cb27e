//! Which network a communicator uses, in NCCL's order (`src/plugin/net.cc`): the candidates
//! are tried one after the other and the first usable one is taken.
//!
//! 1. The external plugins: those `NCCL_NET_PLUGIN` names, in its order (or the ones found
//!    under the default names).
//! 2. The IB transport. NCCL's own IB is built in, so always there; rustccl's is a plugin
//!    library (`plugins/net-ib`, so that rustccl and its users need no RDMA library), looked
//!    for where a user would expect it to be found ([`ib_library_files`]): under each of its
//!    names ([`IB_LIBRARY_NAMES`]: the name `NCCL_NET_PLUGIN=ib` expands to, and the name
//!    cargo gives the cdylib) by the dynamic loader's rules (`LD_LIBRARY_PATH`, the loader's
//!    cache, the system directories), then under each name in the directory of the file that
//!    holds rustccl (`libnccl.so.2` for C programs, the executable for Rust ones: where
//!    `cargo build` puts `librustccl_net_ib.so` beside `target/release/rank-worker`). The
//!    first file that exists is the IB transport; there is one, as in NCCL.
//! 3. The built-in Socket transport.
//!
//! `NCCL_NET_PLUGIN=none` leaves out the external plugins only: IB and Socket stay, as NCCL's
//! internal ones do.
//!
//! A candidate is usable when its `init` succeeds and its `devices` reports at least one
//! device: an IB transport without an active port, without an RDMA stack (libibverbs absent,
//! or the kernel without `ib_uverbs`) or disabled by `NCCL_IB_DISABLE` fails or reports 0 and
//! is passed over, so with `NCCL_NET` unset IB comes before Socket exactly when it has a
//! usable device. That is the common case on machines without RDMA, so while the loader
//! probes an IB transport nobody asked for, its warnings are logged as INFO (NCCL logs "NET/IB
//! : No device found." as INFO too) and the one line saying why it was passed over is INFO.
//! `NCCL_NET` (or `config.netName`) names the transport to use ("IB", "Socket", or a plugin's
//! name; any case): only candidates of that name are tried, and when none is there the error
//! lists the networks that are.
//!
//! Pure functions over names and a probe, so that each rule is tested without a library.

use std::path::Path;

/// The IB transport's file names, in the order they are tried: the name `NCCL_NET_PLUGIN=ib`
/// would expand to, then the name cargo gives the `plugins/net-ib` cdylib.
pub const IB_LIBRARY_NAMES: [&str; 2] = ["librustccl-net-ib.so", "librustccl_net_ib.so"];

/// The files the IB transport is looked for as, in order: each of [`IB_LIBRARY_NAMES`] as a
/// bare name (the dynamic loader searches its path), then each as a path in `beside`, the
/// directory of the library or executable holding rustccl (when known). The first that exists
/// is the IB transport: one on the loader's path overrides the one installed beside rustccl.
pub fn ib_library_files(beside: Option<&Path>) -> Vec<String> {
    let mut files: Vec<String> = IB_LIBRARY_NAMES.iter().map(|n| n.to_string()).collect();
    if let Some(dir) = beside {
        files.extend(IB_LIBRARY_NAMES.iter().map(|n| dir.join(n).to_string_lossy().into_owned()));
    }
    files
}

/// A network that may be tried: its name (what `NCCL_NET` matches) and where it comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    /// "built in" or the library's path.
    pub origin: String,
}

impl Candidate {
    /// "name (origin)", as logs and errors name it.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.name, self.origin)
    }
}

/// The outcome of [`choose`]: the candidate taken (its index and device count), and each one
/// passed over with the reason.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Choice {
    pub chosen: Option<(usize, i32)>,
    pub skipped: Vec<(usize, String)>,
}

/// Tries `candidates` in order: a name other than `want` (when given; ASCII case ignored) is
/// passed over without a probe; otherwise `probe(i)` initialises candidate `i` and returns its
/// device count, or why it failed. The first with at least one device is chosen.
pub fn choose(candidates: &[Candidate], want: Option<&str>, mut probe: impl FnMut(usize) -> Result<i32, String>) -> Choice {
    let mut choice = Choice::default();
    for (i, c) in candidates.iter().enumerate() {
        if let Some(w) = want {
            if !c.name.eq_ignore_ascii_case(w) {
                choice.skipped.push((i, format!("its name is not \"{w}\" (NCCL_NET / netName)")));
                continue;
            }
        }
        match probe(i) {
            Ok(n) if n > 0 => {
                choice.chosen = Some((i, n));
                break;
            }
            Ok(n) => choice.skipped.push((i, format!("it has no usable device (devices() = {n})"))),
            Err(why) => choice.skipped.push((i, why)),
        }
    }
    choice
}

/// The error when [`choose`] chose nothing: with a name asked for that no candidate has, the
/// networks there are; otherwise why each candidate could not be used.
pub fn failure_message(candidates: &[Candidate], want: Option<&str>, choice: &Choice) -> String {
    let reasons = || {
        choice
            .skipped
            .iter()
            .filter(|(i, _)| want.is_none_or(|w| candidates[*i].name.eq_ignore_ascii_case(w)))
            .map(|(i, why)| format!("{}: {why}", candidates[*i].describe()))
            .collect::<Vec<_>>()
            .join("; ")
    };
    match want {
        Some(w) if !candidates.iter().any(|c| c.name.eq_ignore_ascii_case(w)) => {
            let there: Vec<String> = candidates.iter().map(Candidate::describe).collect();
            format!(
                "no network plugin named \"{w}\" is available (NCCL_NET / netName); the networks here are: {}. \
                 Set NCCL_NET to one of these names, or leave it unset to use the first usable one",
                there.join(", ")
            )
        }
        Some(w) => format!("no network plugin named \"{w}\" could be used ({})", reasons()),
        None => format!("no network plugin could be used ({})", reasons()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(names: &[&str]) -> Vec<Candidate> {
        names
            .iter()
            .map(|n| Candidate { name: n.to_string(), origin: if *n == "Socket" { "built in".into() } else { format!("/lib/{n}.so") } })
            .collect()
    }

    /// Devices per candidate name; the probe records what it was asked.
    fn run(c: &[Candidate], want: Option<&str>, devices: &[(&str, Result<i32, &str>)]) -> (Choice, Vec<String>) {
        let mut probed = Vec::new();
        let choice = choose(c, want, |i| {
            probed.push(c[i].name.clone());
            let (_, d) = devices.iter().find(|(n, _)| *n == c[i].name).expect("a device count for each probe");
            d.map_err(str::to_string)
        });
        (choice, probed)
    }

    #[test]
    fn the_ib_transport_is_looked_for_by_both_names_on_the_loader_path_then_beside_rustccl() {
        assert_eq!(ib_library_files(None), ["librustccl-net-ib.so", "librustccl_net_ib.so"]);
        assert_eq!(
            ib_library_files(Some(Path::new("/opt/rustccl/lib"))),
            [
                "librustccl-net-ib.so",
                "librustccl_net_ib.so",
                "/opt/rustccl/lib/librustccl-net-ib.so",
                "/opt/rustccl/lib/librustccl_net_ib.so"
            ]
        );
    }

    #[test]
    fn ib_with_devices_comes_before_socket() {
        let c = cands(&["IB", "Socket"]);
        let (choice, probed) = run(&c, None, &[("IB", Ok(2)), ("Socket", Ok(1))]);
        assert_eq!(choice.chosen, Some((0, 2)));
        assert_eq!(probed, ["IB"], "Socket is not even initialised");
    }

    #[test]
    fn ib_without_devices_or_failing_falls_to_socket() {
        let c = cands(&["IB", "Socket"]);
        let (choice, _) = run(&c, None, &[("IB", Ok(0)), ("Socket", Ok(1))]);
        assert_eq!(choice.chosen, Some((1, 1)));
        assert_eq!(choice.skipped, vec![(0, "it has no usable device (devices() = 0)".to_string())]);
        let (choice, _) = run(&c, None, &[("IB", Err("init failed: no libibverbs")), ("Socket", Ok(1))]);
        assert_eq!(choice.chosen, Some((1, 1)));
        assert_eq!(choice.skipped[0].1, "init failed: no libibverbs");
    }

    #[test]
    fn external_plugins_come_first() {
        let c = cands(&["Libfabric", "IB", "Socket"]);
        let (choice, _) = run(&c, None, &[("Libfabric", Ok(4)), ("IB", Ok(2)), ("Socket", Ok(1))]);
        assert_eq!(choice.chosen, Some((0, 4)));
    }

    #[test]
    fn nccl_net_names_the_transport_in_any_case() {
        let c = cands(&["IB", "Socket"]);
        let (choice, probed) = run(&c, Some("Socket"), &[("IB", Ok(2)), ("Socket", Ok(1))]);
        assert_eq!(choice.chosen, Some((1, 1)), "Socket even though IB has devices");
        assert_eq!(probed, ["Socket"], "IB is not initialised");
        let (choice, _) = run(&c, Some("ib"), &[("IB", Ok(2)), ("Socket", Ok(1))]);
        assert_eq!(choice.chosen, Some((0, 2)));
        let (choice, _) = run(&c, Some("SOCKET"), &[("IB", Ok(2)), ("Socket", Ok(1))]);
        assert_eq!(choice.chosen, Some((1, 1)));
    }

    #[test]
    fn an_absent_name_lists_what_is_there() {
        let c = cands(&["IB", "Socket"]);
        let (choice, probed) = run(&c, Some("Libfabric"), &[]);
        assert_eq!((choice.chosen, probed.len()), (None, 0));
        let msg = failure_message(&c, Some("Libfabric"), &choice);
        assert!(msg.starts_with("no network plugin named \"Libfabric\" is available"), "{msg}");
        assert!(msg.contains("the networks here are: IB (/lib/IB.so), Socket (built in)"), "{msg}");
    }

    #[test]
    fn a_named_network_that_cannot_be_used_says_why() {
        let c = cands(&["IB", "Socket"]);
        let (choice, _) = run(&c, Some("IB"), &[("IB", Ok(0))]);
        let msg = failure_message(&c, Some("IB"), &choice);
        assert_eq!(msg, "no network plugin named \"IB\" could be used (IB (/lib/IB.so): it has no usable device (devices() = 0))");
        let (choice, _) = run(&c, None, &[("IB", Ok(0)), ("Socket", Err("init failed: no interface"))]);
        let msg = failure_message(&c, None, &choice);
        assert!(msg.contains("IB (/lib/IB.so): it has no usable device") && msg.contains("Socket (built in): init failed"), "{msg}");
    }
}
