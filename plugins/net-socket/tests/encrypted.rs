//! The plugin with an encryption key given at init (`init_with_key`, rustccl net ABI v3),
//! over loopback: messages of every size arrive intact whatever the order their requests are
//! tested in (the sender seals on the posting thread, the receiver opens on the thread that
//! completes the receive), an oversized message is dropped without breaking the stream, and a
//! context with another key, or none, is refused.

mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;
use rustccl_plugin_api::net::{Net, NetCommConfig};
use rustccl_plugin_api::{LogFn, PluginError, PluginHandle};

const KEY: &[u8] = b"net-socket-test-key-0123456789abcdef";
const OTHER: &[u8] = b"another-socket-key-0123456789abcdef!";

/// What the plugin logged through [`LOG`].
static LOGGED: Mutex<Vec<String>> = Mutex::new(Vec::new());

extern "C" fn keep(_: i32, _: u64, message: abi_stable::std_types::RStr<'_>) {
    LOGGED.lock().unwrap().push(message.as_str().to_string());
}

const LOG: LogFn = LogFn { log: keep };

/// A connection from a context with `dial_key` to a listener of a context with
/// `listen_key`; `Err`: what the acceptor logged when it refused the connection (it goes on
/// waiting for a good one, so the refusal shows in its log within a few seconds).
fn connect_keyed(net: &dyn Net, listen_key: Option<&[u8]>, dial_key: Option<&[u8]>) -> Result<Pair, String> {
    let lctx = net.init_with_key(7, &NetCommConfig::default(), listen_key, LOG).unwrap();
    let dctx = net.init_with_key(8, &NetCommConfig::default(), dial_key, QUIET).unwrap();
    let (handle, listen) = net.listen(lctx, 0).unwrap();
    let deadline = Instant::now() + DEADLINE;
    let send = loop {
        if let Some(s) = net.connect(dctx, 0, &handle).unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "connect did not finish");
        std::thread::yield_now();
    };
    let refusal_limit = Instant::now() + Duration::from_secs(5);
    let recv = loop {
        if let Some(r) = net.accept(listen).unwrap() {
            break r;
        }
        let refused = LOGGED.lock().unwrap().iter().find(|l| l.contains("refused a connection")).cloned();
        if let Some(why) = refused {
            LOGGED.lock().unwrap().clear();
            return Err(why);
        }
        assert!(Instant::now() < refusal_limit, "accept neither finished nor refused");
        std::thread::yield_now();
    };
    Ok(Pair { ctx: lctx, listen, send, recv })
}

#[test]
fn the_socket_plugin_takes_a_key() {
    assert!(loopback_net(1, 1).takes_encryption_key());
}

#[test]
fn sealed_messages_of_every_size_round_trip() {
    for (nthreads, per_thread) in [(1, 1), (1, 4), (2, 2)] {
        let net = loopback_net(nthreads, per_thread);
        let p = connect_keyed(&net, Some(KEY), Some(KEY)).unwrap();
        let sizes = [0, 1, 4095, 64 * 1024 + 1, 256 * 1024, 256 * 1024 + 1, (3 << 20) + 5, 8 << 20];
        for (i, size) in sizes.into_iter().enumerate() {
            let src = pattern(size, i as u64);
            let (dst, got) = round_trip(&net, &p, &src, size);
            assert_eq!(got, size, "{nthreads}x{per_thread}");
            assert!(dst == src, "{size} bytes over {nthreads}x{per_thread} sockets differ");
        }
        close_pair(&net, p);
    }
}

/// Receives complete (and are opened) in whatever order they are tested: each record is
/// opened with the number it had on its socket's stream.
#[test]
fn sealed_receives_may_be_tested_out_of_order() {
    let net = loopback_net(2, 2);
    let p = connect_keyed(&net, Some(KEY), Some(KEY)).unwrap();
    let sizes = [700_000usize, 5, 1 << 20, 300_001];
    let srcs: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| pattern(n, 40 + i as u64)).collect();
    let mut dsts: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
    let smrs: Vec<PluginHandle> = srcs.iter().map(|s| reg(&net, p.send, s)).collect();
    let rmrs: Vec<PluginHandle> = dsts.iter().map(|d| reg(&net, p.recv, d)).collect();
    let recvs: Vec<PluginHandle> =
        dsts.iter_mut().zip(&rmrs).map(|(d, &mr)| irecv(&net, p.recv, d, 1, mr)).collect();
    let sends: Vec<PluginHandle> = srcs.iter().zip(&smrs).map(|(s, &mr)| isend(&net, p.send, s, 1, mr)).collect();
    for (i, &r) in recvs.iter().enumerate().rev() {
        assert_eq!(wait(&net, r).unwrap(), sizes[i]);
    }
    for &s in &sends {
        wait(&net, s).unwrap();
    }
    for (i, (d, s)) in dsts.iter().zip(&srcs).enumerate() {
        assert!(d == s, "message {i} differs");
    }
    close_pair(&net, p);
}

#[test]
fn an_oversized_sealed_message_is_dropped_and_the_stream_goes_on() {
    let net = loopback_net(1, 2);
    let p = connect_keyed(&net, Some(KEY), Some(KEY)).unwrap();
    let big = pattern(600_000, 1);
    let mut small = vec![0u8; 10_000];
    let (smr, rmr) = (reg(&net, p.send, &big), reg(&net, p.recv, &small));
    let s = isend(&net, p.send, &big, 4, smr);
    let r = irecv(&net, p.recv, &mut small, 4, rmr);
    let err = wait(&net, r).unwrap_err();
    assert_eq!(err.code, PluginError::INVALID_USAGE, "{err}");
    assert!(small.iter().all(|&b| b == 0), "nothing written into the small buffer");
    assert_eq!(wait(&net, s).unwrap(), big.len());
    let next = pattern(900_000, 2);
    let (dst, got) = round_trip(&net, &p, &next, next.len());
    assert_eq!((got, dst == next), (next.len(), true));
    close_pair(&net, p);
}

/// The acceptor judges: a dialer with another key, or none, is refused; so is a keyed dialer
/// at a listener without a key.
#[test]
fn another_key_or_none_is_refused_at_accept() {
    for (listen, dial, why) in [
        (Some(KEY), Some(OTHER), "key confirmation does not match"),
        (Some(KEY), None, "not encrypted"),
        (None, Some(KEY), "it is encrypted"),
    ] {
        let net = loopback_net(1, 1);
        let err = connect_keyed(&net, listen, dial).err().unwrap_or_else(|| panic!("{why}: accepted"));
        assert!(err.contains(why), "{why}: {err}");
    }
}

#[test]
fn a_key_shorter_than_32_bytes_is_refused_at_init() {
    let net = loopback_net(1, 1);
    let err = net.init_with_key(1, &NetCommConfig::default(), Some(b"short"), QUIET).unwrap_err();
    assert_eq!(err.code, PluginError::INVALID_ARGUMENT, "{err}");
    assert!(err.message.contains("at least 32"), "{err}");
}
