//! Harness for multi-rank tests: starts ranks as separate processes of the `rank-worker`
//! program (or as threads), feeds them a unique id, and collects what each printed, killing
//! any process that outlives its time limit, so that a hang fails a test instead of hanging it.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub mod verbs_double;

/// How one rank process ended.
#[derive(Debug)]
pub struct Outcome {
    pub rank: i32,
    /// `None` when it was killed for running too long.
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
    /// Lines the worker printed as `RESULT <text>`.
    pub fn results(&self) -> Vec<&str> {
        self.stdout.lines().filter_map(|l| l.strip_prefix("RESULT ")).collect()
    }
    /// The `ERROR <code> <message>` line, if the worker printed one.
    pub fn error(&self) -> Option<(String, String)> {
        let line = self.stdout.lines().find_map(|l| l.strip_prefix("ERROR "))?;
        let (code, msg) = line.split_once(' ').unwrap_or((line, ""));
        Some((code.to_string(), msg.to_string()))
    }
}

/// One running rank process.
pub struct RankProc {
    pub rank: i32,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
    stderr: std::thread::JoinHandle<String>,
}

/// Path of the worker program: `RUSTCCL_RANK_WORKER` if set, else the one cargo builds next
/// to the test executables (`target/<profile>/rank-worker`, tests live in `.../deps/`).
pub fn worker_path() -> PathBuf {
    if let Some(p) = std::env::var_os("RUSTCCL_RANK_WORKER") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current executable");
    let dir = exe.parent().and_then(|d| if d.ends_with("deps") { d.parent() } else { Some(d) }).expect("exe dir");
    let path = dir.join("rank-worker");
    assert!(path.exists(), "{} does not exist; build it with `cargo build -p rustccl-tests`", path.display());
    path
}

/// A library cargo built beside the worker (`target/<profile>/<name>` or `.../deps/<name>`),
/// as a path string for `NCCL_*_PLUGIN`.
pub fn built_lib(name: &str) -> String {
    let dir = worker_path().parent().unwrap().to_path_buf();
    let path = [dir.join(name), dir.join("deps").join(name)].into_iter().find(|p| p.exists());
    path.unwrap_or_else(|| panic!("{name} is not built in {}; run `cargo build` first", dir.display()))
        .to_string_lossy()
        .into_owned()
}

/// Environment every rank gets unless a test overrides it: loopback for the bootstrap (the
/// tests run on one machine) and warnings in the log.
pub fn base_env() -> Vec<(String, String)> {
    vec![("NCCL_SOCKET_IFNAME".into(), "lo".into()), ("NCCL_DEBUG".into(), "WARN".into())]
}

/// Starts `rank-worker <scenario> <nranks> <rank> <ids>` for each rank in `ranks`.
pub fn spawn(scenario: &str, nranks: i32, ranks: &[i32], ids: &str, env: &[(&str, &str)]) -> Vec<RankProc> {
    ranks.iter().map(|&rank| spawn_one(scenario, nranks, rank, ids, env)).collect()
}

pub fn spawn_one(scenario: &str, nranks: i32, rank: i32, ids: &str, env: &[(&str, &str)]) -> RankProc {
    let mut cmd = Command::new(worker_path());
    cmd.args([scenario, &nranks.to_string(), &rank.to_string(), ids]);
    for (k, v) in base_env() {
        cmd.env(k, v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    spawn_command(rank, cmd)
}

/// Starts a prepared command as rank `rank` (e.g. the worker inside `ip netns exec`).
pub fn spawn_command(rank: i32, mut cmd: Command) -> RankProc {
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start rank-worker");
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut err = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let stdin = child.stdin.take();
    RankProc { rank, child, stdin, lines, seen: Vec::new(), stderr }
}

impl RankProc {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits until the process prints `line`; false if it does not within `timeout`.
    pub fn wait_line(&mut self, line: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        if self.seen.iter().any(|l| l == line) {
            return true;
        }
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let hit = l == line;
                    self.seen.push(l);
                    if hit {
                        return true;
                    }
                }
                Err(_) => return false,
            }
        }
        false
    }

    /// Writes a line to the process's standard input.
    pub fn tell(&mut self, line: &str) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = writeln!(stdin, "{line}");
            let _ = stdin.flush();
        }
    }

    pub fn sigkill(&mut self) {
        // SAFETY: kill(2) on the pid of a child this harness started and has not reaped.
        unsafe {
            libc::kill(self.pid(), libc::SIGKILL);
        }
    }

    /// Waits for the process to end, killing it after `timeout`.
    pub fn finish(mut self, timeout: Duration) -> Outcome {
        let deadline = Instant::now() + timeout;
        drop(self.stdin.take());
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break None;
                }
            }
        };
        // The reader thread ends at EOF, after the process exits.
        while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(200)) {
            self.seen.push(l);
        }
        let stderr = self.stderr.join().unwrap_or_default();
        Outcome { rank: self.rank, status, stdout: self.seen.join("\n"), stderr }
    }
}

/// Waits for every process, each within `timeout` of now.
pub fn finish_all(procs: Vec<RankProc>, timeout: Duration) -> Vec<Outcome> {
    let deadline = Instant::now() + timeout;
    procs
        .into_iter()
        .map(|p| p.finish(deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100))))
        .collect()
}

/// Panics with every rank's output unless all succeeded.
pub fn assert_all_ok(outcomes: &[Outcome]) {
    for o in outcomes {
        assert!(o.ok(), "rank {} failed ({:?})\nstdout:\n{}\nstderr:\n{}", o.rank, o.status, o.stdout, o.stderr);
    }
}

/// For a scenario where rank `victim` is killed: panics unless it died and every other rank
/// succeeded with one `RESULT` line; those lines.
pub fn survivor_results(outcomes: &[Outcome], victim: i32) -> Vec<&str> {
    let mut out = Vec::new();
    for o in outcomes {
        if o.rank == victim {
            assert!(!o.ok(), "the victim should have died: {o:?}");
            continue;
        }
        assert!(o.ok(), "rank {} failed: {o:?}", o.rank);
        let r = o.results();
        assert!(r.len() == 1, "rank {}: {r:?}", o.rank);
        out.push(r[0]);
    }
    out
}

/// Ids as the worker takes them: hex, comma-separated.
pub fn ids_arg(ids: &[rustccl::UniqueId]) -> String {
    ids.iter().map(|i| i.to_hex()).collect::<Vec<_>>().join(",")
}

/// Makes a unique id in this process (its root thread runs here) on loopback.
pub fn new_id() -> rustccl::UniqueId {
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    rustccl::get_unique_id().expect("get_unique_id")
}

// ---- Two "nodes": network namespaces joined by a veth pair ------------------------------------

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Two network namespaces joined by a veth pair, each end addressed; removed on drop.
/// `prefix` keeps the names of tests running at once apart (at most 4 characters), `net` picks
/// the 10.x.0.0/16 block.
pub struct Nodes {
    pub ns: [String; 2],
    pub dev: [String; 2],
    pub addr: [String; 2],
}

impl Nodes {
    pub fn create(prefix: &str, net: u8) -> Result<Nodes, String> {
        let tag = std::process::id() % 100_000;
        let subnet = 100 + (tag % 100);
        let n = Nodes {
            ns: [format!("{prefix}{tag}a"), format!("{prefix}{tag}b")],
            dev: [format!("{prefix}{tag}a"), format!("{prefix}{tag}b")],
            addr: [format!("10.{net}.{subnet}.1"), format!("10.{net}.{subnet}.2")],
        };
        for ns in &n.ns {
            ip(&["netns", "add", ns])?;
        }
        let made = (|| {
            ip(&["link", "add", &n.dev[0], "type", "veth", "peer", "name", &n.dev[1]])?;
            for i in 0..2 {
                ip(&["link", "set", &n.dev[i], "netns", &n.ns[i]])?;
                ip(&["-n", &n.ns[i], "addr", "add", &format!("{}/24", n.addr[i]), "dev", &n.dev[i]])?;
                ip(&["-n", &n.ns[i], "link", "set", &n.dev[i], "up"])?;
                ip(&["-n", &n.ns[i], "link", "set", "lo", "up"])?;
            }
            // A veth end is "up" at once but carries traffic only once both ends are: wait
            // for the carrier (on a loaded machine the ranks could start before it).
            let deadline = Instant::now() + Duration::from_secs(10);
            for i in 0..2 {
                loop {
                    let out = Command::new("ip").args(["-n", &n.ns[i], "link", "show", "dev", &n.dev[i]]).output();
                    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
                    if text.contains("state UP") && !text.contains("NO-CARRIER") {
                        break;
                    }
                    if Instant::now() > deadline {
                        return Err(format!("{} in {} did not come up: {}", n.dev[i], n.ns[i], text.trim()));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            Ok(())
        })();
        made.map(|_| n)
    }

    /// The command for rank `rank` of `nranks` running worker `scenario`, two ranks per
    /// namespace (ranks 0–1 in the first), rendezvous at `comm_id`, bootstrap and sockets on
    /// the namespace's veth, each namespace its own host (`NCCL_HOSTID`). Callers add their
    /// own variables before spawning it.
    pub fn rank_command(&self, scenario: &str, nranks: usize, rank: i32, comm_id: &str) -> Command {
        self.rank_command_on((rank / 2) as usize, scenario, nranks, rank, comm_id)
    }

    /// As [`rank_command`](Self::rank_command), in namespace `node` (0 or 1).
    pub fn rank_command_on(&self, node: usize, scenario: &str, nranks: usize, rank: i32, comm_id: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns[node]])
            .arg(worker_path())
            .args([scenario, &nranks.to_string(), &rank.to_string(), "env"]);
        cmd.env("NCCL_COMM_ID", comm_id)
            .env("NCCL_SOCKET_IFNAME", &self.dev[node])
            .env("NCCL_HOSTID", format!("node-{node}"));
        cmd
    }

    /// Cuts the link one way: frames node `from` sends to the other node go to a MAC address
    /// nobody has (a permanent neighbour entry), so the other end drops them, while frames
    /// the other way still arrive. Needs nothing but iproute2 (no netem, no iptables).
    pub fn drop_from(&self, from: usize) -> Result<(), String> {
        let to = self.addr[1 - from].as_str();
        ip(&["-n", &self.ns[from], "neigh", "replace", to, "lladdr", "02:00:00:00:00:01", "dev", &self.dev[from], "nud", "permanent"])
    }

    /// Makes the namespaces, or says how to skip: the tests need root and iproute2 (CI has
    /// both); `RUSTCCL_SKIP_NETNS=1` skips them where they are not available. `None`: skipped.
    pub fn for_test(prefix: &str, net: u8) -> Option<Nodes> {
        if std::env::var("RUSTCCL_SKIP_NETNS").is_ok_and(|v| v == "1") {
            println!("SKIPPED: RUSTCCL_SKIP_NETNS=1");
            return None;
        }
        Some(Nodes::create(prefix, net).unwrap_or_else(|e| {
            panic!("cannot make network namespaces ({e}); run as root with iproute2, or set RUSTCCL_SKIP_NETNS=1")
        }))
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for ns in &self.ns {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// Compiles the C test plugin `sources` (paths under `plugins/testing/`) with `options` into
/// the shared library `out`: written beside it under a name of this process's, then renamed
/// into place, so that test programs compiling the same plugin at once never see half a file.
pub fn compile_c_plugin(sources: &[&str], out: &Path, options: &[&str]) {
    let dir = out.parent().expect("a library path has a directory");
    std::fs::create_dir_all(dir).unwrap();
    let name = out.file_name().unwrap().to_string_lossy();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../plugins/testing");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC"])
        .args(options)
        .arg("-o")
        .arg(&tmp)
        .args(sources.iter().map(|s| root.join(s)))
        .status()
        .expect("run cc");
    assert!(status.success(), "compiling {sources:?} with {options:?} failed");
    std::fs::rename(&tmp, out).unwrap();
}

/// The C test net plugin `plugins/testing/c-net-tcp/ctcp*.c` ("CTcp"), compiled with `cc` into
/// `target/<profile>/c-net-tcp/libctcp-<variant>.so` (once per variant and test process; the
/// file is renamed into place, so test programs compiling it at once never see half a file).
/// Variants: `v11` (exports the v11 and v6 tables), `v6` (only v6), `v7` `v8` `v9` `v10` `v12`
/// (only that table), `no-vdevice` (v11 and v6, makeVDevice NULL), and the broken builds the
/// loader tests need: `init-fails`, `malformed` (NULL `test`), `null-name`, `only-v13`,
/// `offload` (device 0 is not a host network), `collnet` (also exports a CollNet symbol);
/// `async-setup` (v11 and v6, connection setup and completion as nccl-fastsocket's).
pub fn c_net_plugin(variant: &str) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let newest;
    let flag = match variant {
        "v11" => None,
        "v6" => Some("-DCTCP_V6_ONLY"),
        "v7" | "v8" | "v9" | "v10" | "v12" => {
            newest = format!("-DCTCP_NEWEST={}", &variant[1..]);
            Some(newest.as_str())
        }
        "no-vdevice" => Some("-DCTCP_NO_VDEVICE"),
        "init-fails" => Some("-DCTCP_INIT_FAILS"),
        "malformed" => Some("-DCTCP_MALFORMED"),
        "null-name" => Some("-DCTCP_NULL_NAME"),
        "only-v13" => Some("-DCTCP_ONLY_V13"),
        "offload" => Some("-DCTCP_OFFLOAD"),
        "collnet" => Some("-DCTCP_COLLNET"),
        "async-setup" => Some("-DCTCP_ASYNC_SETUP"),
        other => panic!("no C test plugin variant {other}"),
    };
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, p)) = built.iter().find(|(v, _)| v == variant) {
        return p.clone();
    }
    let exe = std::env::current_exe().expect("current executable");
    let target = exe.parent().and_then(|d| if d.ends_with("deps") { d.parent() } else { Some(d) }).expect("exe dir");
    let out = target.join("c-net-tcp").join(format!("libctcp-{variant}.so"));
    let mut options = vec!["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O2", "-pthread"];
    options.extend(flag);
    compile_c_plugin(&["c-net-tcp/ctcp.c", "c-net-tcp/ctcp_tables.c"], &out, &options);
    built.push((variant.to_string(), out.clone()));
    out
}
