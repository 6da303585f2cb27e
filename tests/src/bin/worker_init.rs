//! Ranks that die during init, and the ranks that must notice (tests/tests/init_death.rs).
//!
//! The victim does not call `init_rank`: it joins the rendezvous step by step with the
//! bootstrap's public pieces (the root's wire messages, the peer network), which lets it stop
//! at an exact point of init without a test hook in the library. It sends what a real rank
//! sends up to that point, so the survivors see exactly what a rank killed there looks like.

use std::time::{Duration, Instant};

use rustccl::bootstrap::peers::{bind_listener, PeerNet};
use rustccl::bootstrap::root::{self, PeerInfo, RootMsg};
use rustccl::bootstrap::wire::{Cancel, Conn};
use rustccl::bootstrap::{host_hash, hostname, netif};
use rustccl::{CommConfig, Communicator, Error, UniqueId};

/// A survivor: init, timed. Prints `RESULT init-failed <code> <ms> <message>` or
/// `RESULT init-ok <ms>`; either way the process succeeds (the test judges).
pub fn timed(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let t0 = Instant::now();
    let result = Communicator::init_rank_scalable(nranks, rank, ids, 0, &CommConfig::default());
    let ms = t0.elapsed().as_millis();
    match result {
        Ok(comm) => {
            println!("RESULT init-ok {ms}");
            let _ = comm.destroy();
        }
        Err(e) => println!("RESULT init-failed {:?} {ms} {}", e.code, e.message.replace('\n', " ")),
    }
    Ok(())
}

/// The victim, which dies (SIGKILL) at `DIE_AT`:
/// - `registered`: after its `Register` reached the root; it prints `REGISTERED` and waits
///   for the test to kill it (the root has not sent the table yet);
/// - `table`: as soon as the root's table arrives, before any peer connection;
/// - `connected`: with its peer network up and a connection to rank 0 open, before it sends
///   its part of init's first all-gather.
pub fn die(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let at = std::env::var("DIE_AT").unwrap_or_default();
    if !["registered", "table", "connected"].contains(&at.as_str()) {
        return Err(Error::invalid_argument(format!("DIE_AT={at:?}: expected registered, table or connected")));
    }
    let id = ids.first().ok_or_else(|| Error::invalid_argument("init-die needs an id"))?;
    let cancel = Cancel::after(Duration::from_secs(60), "init-die");
    let iface = netif::bootstrap_interface()?;
    let (listener, listen) = bind_listener(iface.addr)?;
    let info = PeerInfo {
        rank: rank as u32,
        listen,
        version: rustccl::version::announced_version(),
        host_hash: host_hash(),
        hostname: hostname(),
        pid: std::process::id(),
        device: 0,
    };
    let mut conn = Conn::connect(id.root_addr(), root::MAX_CONTROL_BYTES, &cancel)?;
    conn.prove(&id.secret(), &cancel)?;
    conn.send_json(&RootMsg::Register { nranks: nranks as u32, n_ids: 1, root_index: 0, info }, &cancel)?;
    if at == "registered" {
        println!("REGISTERED");
        std::thread::sleep(Duration::from_secs(60));
        return Err(Error::internal("the victim was not killed"));
    }
    let peers = match conn.recv_json::<RootMsg>(&cancel)? {
        RootMsg::Table { peers } => peers,
        other => return Err(Error::internal(format!("the root sent {other:?}"))),
    };
    if at == "table" {
        kill_self();
    }
    let net = PeerNet::start(listener, rank as u32, peers, id.secret())?;
    // A message nobody waits for: it opens the connection to rank 0, as the all-gather's
    // first send would (here to rank 0 whatever the ring says), without giving the
    // survivors what init needs from this rank.
    net.send(0, 1, b"hello", &cancel)?;
    kill_self()
}

fn kill_self() -> ! {
    // SAFETY: raise(3) with SIGKILL ends this process; no memory is involved.
    unsafe {
        libc::raise(libc::SIGKILL);
    }
    unreachable!("SIGKILL does not return")
}
