//! `rustccl-net-conformance <plugin.so> [--max-size BYTES]`: runs every check of the suite
//! against the plugin and prints one line per check and `N passed, M failed`.
//! (`--peer <plugin.so> <handle-hex>` is the helper process of the "peer killed" check.)

use std::cell::RefCell;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use rustccl_net_conformance::*;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 4 && args[1] == "--peer" {
        let loaded = load(&args[2]).unwrap_or_else(|e| die(&e));
        let env = Env::new(&*loaded.net, 0).unwrap_or_else(|e| die(&e));
        let handle = handle_from_hex(&args[3]).unwrap_or_else(|| die("bad handle"));
        if let Err(e) = run_sending_peer(&env, &handle) {
            die(&e);
        }
        return;
    }
    if args.len() < 2 {
        die("usage: rustccl-net-conformance <plugin.so> [--max-size BYTES]");
    }
    let plugin = args[1].clone();
    let mut max_size = 1usize << 30;
    if let Some(i) = args.iter().position(|a| a == "--max-size") {
        max_size = args.get(i + 1).and_then(|v| v.parse().ok()).unwrap_or_else(|| die("--max-size takes a number"));
    }
    let loaded = load(&plugin).unwrap_or_else(|e| die(&e));
    println!("# net plugin {} ({}) from {plugin}", loaded.name, loaded.abi);
    let env = Env::new(&*loaded.net, max_size).unwrap_or_else(|e| die(&e));
    let ndev = env.net.devices(env.ctx).unwrap_or(0);
    match env.net.properties(env.ctx, env.dev) {
        Ok(p) => println!("# device {} of {ndev}: {}", env.dev, p.name),
        Err(e) => die(&format!("properties of device {}: {e}", env.dev)),
    }
    let (mut passed, mut failed) = (0, 0);
    let mut report = |name: &str, r: Result<(), String>| match r {
        Ok(()) => {
            passed += 1;
            println!("PASS {name}");
        }
        Err(e) => {
            failed += 1;
            println!("FAIL {name}: {e}");
        }
    };
    for (name, check) in CHECKS {
        report(name, check(&env));
    }
    let child: RefCell<Option<Child>> = RefCell::new(None);
    let exe = std::env::current_exe().expect("own path");
    let r = check_peer_killed(
        &env,
        &mut |handle| {
            let mut c = Command::new(&exe)
                .args(["--peer", &plugin, handle])
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|e| format!("starting the peer: {e}"))?;
            let mut line = String::new();
            BufReader::new(c.stdout.take().unwrap()).read_line(&mut line).map_err(|e| e.to_string())?;
            *child.borrow_mut() = Some(c);
            Ok(())
        },
        &mut || {
            if let Some(c) = child.borrow_mut().as_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
        },
    );
    report("peer killed mid-transfer", r);
    println!("{passed} passed, {failed} failed");
    std::process::exit(if failed == 0 { 0 } else { 1 });
}

fn die(msg: &str) -> ! {
    eprintln!("rustccl-net-conformance: {msg}");
    std::process::exit(2);
}
