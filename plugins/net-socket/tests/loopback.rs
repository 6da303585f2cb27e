//! The plugin through the `Net` trait, over loopback: data, ordering, limits, errors.

mod common;

use std::time::{Duration, Instant};

use common::*;
use rustccl_net_socket::{SocketConfig, SocketNet};
use rustccl_plugin_api::net::{
    Net, NetCommConfig, NetHandle, RecvBuffer, MAX_REQUESTS, PTR_DEVICE, PTR_HOST,
};
use rustccl_plugin_api::{PluginError, PluginHandle};

#[test]
fn round_trips_of_every_size() {
    for (nthreads, per_thread) in [(1, 1), (1, 4), (2, 2)] {
        let net = loopback_net(nthreads, per_thread);
        let p = connect_pair(&net);
        for (i, size) in [0, 1, 4095, 64 * 1024 + 1, 8 << 20].into_iter().enumerate() {
            let src = pattern(size, i as u64);
            let (dst, got) = round_trip(&net, &p, &src, size);
            assert_eq!(got, size, "{nthreads}x{per_thread}");
            assert!(
                dst == src,
                "{size} bytes over {nthreads}x{per_thread} sockets differ"
            );
        }
        close_pair(&net, p);
        assert_eq!(net.open_connections(), 0);
    }
}

#[test]
fn properties_describe_a_host_memory_device() {
    let net = loopback_net(1, 1);
    let ctx = net.init(1, &NetCommConfig::default(), QUIET).unwrap();
    assert_eq!(net.devices(ctx).unwrap(), 1);
    let props = net.properties(ctx, 0).unwrap();
    assert_eq!(props.name.as_str(), "lo");
    assert_eq!(props.pci_path.as_str(), "");
    assert_eq!(
        (
            props.guid,
            props.ptr_support,
            props.max_recvs,
            props.max_comms
        ),
        (0, PTR_HOST, 1, 65536)
    );
    assert!(props.speed_mbps > 0 && !props.reg_is_global && props.latency_us == 0.0);
    assert!(props.max_p2p_bytes >= 1 << 40 && props.max_coll_bytes >= 1 << 40);
    let err = net.properties(ctx, 1).unwrap_err();
    assert_eq!(err.code, PluginError::INVALID_ARGUMENT, "{err}");
    net.finalize(ctx).unwrap();
    assert!(net.devices(ctx).is_err(), "a finalized context is gone");
}

#[test]
fn default_interfaces_give_a_working_device() {
    // Interfaces from the environment (or the default rules): whatever dev 0 is, it carries
    // a message to this same host.
    let net = SocketNet::with_config(SocketConfig::default()).unwrap();
    let p = connect_pair(&net);
    let src = pattern(100_000, 9);
    let (dst, got) = round_trip(&net, &p, &src, src.len());
    assert_eq!((got, dst == src), (src.len(), true));
    close_pair(&net, p);
}

#[test]
fn thirty_two_outstanding_each_way() {
    let net = loopback_net(2, 2);
    let p = connect_pair(&net);
    let sizes: Vec<usize> = (0..MAX_REQUESTS)
        .map(|i| [0, 1, 70_000, 300_000][i % 4] + i)
        .collect();
    let srcs: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n, i as u64))
        .collect();
    let mut dsts: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
    let smr: Vec<PluginHandle> = srcs.iter().map(|b| reg(&net, p.send, b)).collect();
    let rmr: Vec<PluginHandle> = dsts.iter().map(|b| reg(&net, p.recv, b)).collect();
    let sends: Vec<PluginHandle> = srcs
        .iter()
        .zip(&smr)
        .map(|(b, &m)| isend(&net, p.send, b, 0, m))
        .collect();
    let recvs: Vec<PluginHandle> = dsts
        .iter_mut()
        .zip(&rmr)
        .map(|(b, &m)| irecv(&net, p.recv, b, 0, m))
        .collect();
    // One more of either kind does not fit now.
    // SAFETY: the buffers outlive the connection; a refused post takes nothing.
    unsafe {
        assert_eq!(
            net.isend(p.send, srcs[1].as_ptr() as usize, 1, 0, smr[1])
                .unwrap(),
            None
        );
        let rb = RecvBuffer {
            data: dsts[1].as_mut_ptr() as usize,
            size: 1,
            tag: 0,
            mr: rmr[1],
        };
        assert_eq!(net.irecv(p.recv, &[rb]).unwrap(), None);
    }
    // Completed out of order (last first): fine, each reports its own size.
    for (i, r) in recvs.iter().enumerate().rev() {
        assert_eq!(wait(&net, *r).unwrap(), sizes[i]);
    }
    for (i, s) in sends.iter().enumerate() {
        assert_eq!(wait(&net, *s).unwrap(), sizes[i]);
    }
    for (i, (s, d)) in srcs.iter().zip(&dsts).enumerate() {
        assert!(s == d, "message {i} differs");
    }
    // Room again.
    let (dst, got) = round_trip(&net, &p, &srcs[2], srcs[2].len());
    assert_eq!((got, dst == srcs[2]), (srcs[2].len(), true));
    close_pair(&net, p);
}

#[test]
fn messages_match_receives_in_posting_order_with_tags() {
    let net = loopback_net(1, 4);
    let p = connect_pair(&net);
    let tags = [5, -1, 77, 5, 0, 1 << 20];
    let sizes = [10, 200_000, 0, 64 * 1024, 3, 1 << 20];
    let srcs: Vec<Vec<u8>> = tags
        .iter()
        .zip(sizes)
        .map(|(&t, n)| pattern(n, t as u64))
        .collect();
    let mut dsts: Vec<Vec<u8>> = (0..tags.len()).map(|_| vec![0u8; 1 << 20]).collect();
    let rmr: Vec<PluginHandle> = dsts.iter().map(|b| reg(&net, p.recv, b)).collect();
    let smr: Vec<PluginHandle> = srcs.iter().map(|b| reg(&net, p.send, b)).collect();
    // Sends first this time, receives posted later, one at a time.
    let sends: Vec<PluginHandle> = (0..tags.len())
        .map(|i| isend(&net, p.send, &srcs[i], tags[i], smr[i]))
        .collect();
    for i in 0..tags.len() {
        let r = irecv(&net, p.recv, &mut dsts[i], tags[i], rmr[i]);
        assert_eq!(
            wait(&net, r).unwrap(),
            sizes[i],
            "message {i} (tag {})",
            tags[i]
        );
        assert!(
            dsts[i][..sizes[i]] == srcs[i][..],
            "message {i} (tag {}) landed wrong",
            tags[i]
        );
    }
    for (i, s) in sends.into_iter().enumerate() {
        assert_eq!(wait(&net, s).unwrap(), sizes[i]);
    }
    close_pair(&net, p);
}

#[test]
fn receive_buffer_may_be_larger_than_the_message() {
    let net = loopback_net(1, 2);
    let p = connect_pair(&net);
    let src = pattern(1000, 1);
    let (dst, got) = round_trip(&net, &p, &src, 1 << 20);
    assert_eq!(got, 1000);
    assert!(dst[..1000] == src[..]);
    assert!(
        dst[1000..].iter().all(|&b| b == 0xee),
        "bytes past the message are untouched"
    );
    close_pair(&net, p);
}

#[test]
fn too_small_receive_buffer_is_an_error_and_the_stream_goes_on() {
    let net = loopback_net(2, 2);
    let p = connect_pair(&net);
    let big = pattern(300_000, 1);
    let mut small = vec![0u8; 10_000];
    let (smr, rmr) = (reg(&net, p.send, &big), reg(&net, p.recv, &small));
    let s = isend(&net, p.send, &big, 4, smr);
    let r = irecv(&net, p.recv, &mut small, 4, rmr);
    let err = wait(&net, r).unwrap_err();
    assert_eq!(err.code, PluginError::INVALID_USAGE, "{err}");
    assert!(
        err.message.contains("300000 bytes") && err.message.contains("10000-byte"),
        "{err}"
    );
    assert!(
        small.iter().all(|&b| b == 0),
        "nothing written past or into the small buffer"
    );
    assert_eq!(wait(&net, s).unwrap(), big.len());
    // The failed request is gone; the next message arrives intact.
    assert_eq!(
        net.test(r, &mut [0]).unwrap_err().code,
        PluginError::INVALID_ARGUMENT
    );
    let next = pattern(150_000, 2);
    let (dst, got) = round_trip(&net, &p, &next, next.len());
    assert_eq!((got, dst == next), (next.len(), true));
    close_pair(&net, p);
}

#[test]
fn memory_registration_rules() {
    let net = loopback_net(1, 1);
    let p = connect_pair(&net);
    let buf = pattern(4096, 3);
    let err = net
        .reg_mr(p.send, buf.as_ptr() as usize, buf.len(), PTR_DEVICE)
        .unwrap_err();
    assert_eq!(err.code, PluginError::INVALID_USAGE);
    assert!(
        err.message
            .contains("the socket plugin supports host memory only"),
        "{err}"
    );
    assert!(
        net.reg_mr(PluginHandle { id: 12345 }, 1, 1, PTR_HOST)
            .is_err(),
        "unknown connection"
    );
    // reg_mr_dmabuf is not supported.
    assert!(net
        .reg_mr_dmabuf(p.send, buf.as_ptr() as usize, 1, PTR_HOST, 0, 3)
        .is_err());

    let mr = reg(&net, p.send, &buf);
    net.dereg_mr(p.send, mr).unwrap();
    // SAFETY: the buffer outlives the connection; these posts are refused.
    unsafe {
        let err = net
            .isend(p.send, buf.as_ptr() as usize, buf.len(), 0, mr)
            .unwrap_err();
        assert!(err.message.contains("unknown memory registration"), "{err}");
        let other = reg(&net, p.recv, &buf);
        assert!(
            net.isend(p.send, buf.as_ptr() as usize, 1, 0, other)
                .is_err(),
            "registration of another connection"
        );
        let mr = reg(&net, p.send, &buf[..100]);
        let err = net
            .isend(p.send, buf.as_ptr() as usize, 101, 0, mr)
            .unwrap_err();
        assert!(err.message.contains("outside its registration"), "{err}");
        let rb = RecvBuffer {
            data: buf.as_ptr() as usize,
            size: 10,
            tag: 0,
            mr: other,
        };
        let err = net.irecv(p.recv, &[rb, rb]).unwrap_err();
        assert!(err.message.contains("max_recvs = 1"), "{err}");
    }
    assert!(net.dereg_mr(p.send, mr).is_err(), "deregistered twice");
    // A request handle is good for exactly one completed test.
    let mr = reg(&net, p.send, &buf);
    let mut dst = vec![0u8; 4096];
    let rmr = reg(&net, p.recv, &dst);
    let r = irecv(&net, p.recv, &mut dst, 0, rmr);
    let s = isend(&net, p.send, &buf, 0, mr);
    assert_eq!(wait(&net, s).unwrap(), 4096);
    assert_eq!(wait(&net, r).unwrap(), 4096);
    assert!(net.test(s, &mut [0]).is_err() && net.test(r, &mut [0]).is_err());
    // Wrong-kind handles are unknown, not confused.
    assert!(net.close_recv(p.send).is_err());
    assert!(net.accept(p.send).is_err());
    close_pair(&net, p);
}

#[test]
fn foreign_handles_are_refused() {
    let net = loopback_net(1, 1);
    let ctx = net.init(1, &NetCommConfig::default(), QUIET).unwrap();
    let err = net.connect(ctx, 0, &NetHandle::default()).unwrap_err();
    assert_eq!(err.code, PluginError::INVALID_ARGUMENT, "{err}");
    // A handle whose magic is wrong connects (TCP-wise) but is never accepted.
    let (handle, listen) = net.listen(ctx, 0).unwrap();
    let mut stale = handle;
    stale.bytes[30] ^= 0xff;
    let deadline = Instant::now() + Duration::from_secs(10);
    while net.connect(ctx, 0, &stale).unwrap().is_none() {
        assert!(Instant::now() < deadline);
    }
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        assert_eq!(
            net.accept(listen).unwrap(),
            None,
            "a stale connection was accepted"
        );
    }
    net.finalize(ctx).unwrap();
    assert_eq!(
        net.open_connections(),
        0,
        "finalize closes what the context left open"
    );
}

/// Waits for `req` to fail; returns the error and how long it took.
fn wait_failure(net: &dyn Net, req: PluginHandle) -> PluginError {
    match wait(net, req) {
        Ok(n) => panic!("request completed ({n} bytes) although its peer is gone"),
        Err(e) => e,
    }
}

#[test]
fn receiver_closing_mid_transfer_fails_the_send() {
    let net = loopback_net(2, 2);
    let p = connect_pair(&net);
    let src = pattern(256 << 20, 5);
    let mut dst = vec![0u8; 1 << 20];
    let (smr, rmr) = (reg(&net, p.send, &src), reg(&net, p.recv, &dst));
    let s = isend(&net, p.send, &src, 0, smr);
    let _r = irecv(&net, p.recv, &mut dst, 0, rmr);
    net.close_recv(p.recv).unwrap();
    let err = wait_failure(&net, s);
    assert_eq!(err.code, PluginError::REMOTE, "{err}");
    assert!(
        err.message.contains("peer 127.0.0.1:"),
        "the message names the peer: {err}"
    );
    net.close_send(p.send).unwrap();
    net.finalize(p.ctx).unwrap();
}

#[test]
fn sender_closing_mid_transfer_fails_the_receive() {
    let net = loopback_net(1, 4);
    let p = connect_pair(&net);
    let src = pattern(256 << 20, 6);
    let mut dst = vec![0u8; 256 << 20];
    let (smr, rmr) = (reg(&net, p.send, &src), reg(&net, p.recv, &dst));
    let r = irecv(&net, p.recv, &mut dst, 0, rmr);
    let _s = isend(&net, p.send, &src, 0, smr);
    // Let the header and some data through, then drop the sender.
    let mut sizes = [0];
    for _ in 0..3 {
        assert!(!net.test(r, &mut sizes).unwrap());
    }
    net.close_send(p.send).unwrap();
    let err = wait_failure(&net, r);
    assert_eq!(err.code, PluginError::REMOTE, "{err}");
    assert!(
        err.message.contains("peer 127.0.0.1:") && err.message.contains("closed"),
        "{err}"
    );
    // Later receives fail at once.
    let mut more = vec![0u8; 8];
    let rmr2 = reg(&net, p.recv, &more);
    // SAFETY: `more` outlives the connection.
    let posted = unsafe {
        net.irecv(
            p.recv,
            &[RecvBuffer {
                data: more.as_mut_ptr() as usize,
                size: 8,
                tag: 0,
                mr: rmr2,
            }],
        )
    };
    assert_eq!(posted.unwrap_err().code, PluginError::REMOTE);
    net.close_recv(p.recv).unwrap();
    net.finalize(p.ctx).unwrap();
}

#[test]
fn sender_closing_fails_a_receive_waiting_for_its_header() {
    let net = loopback_net(1, 1);
    let p = connect_pair(&net);
    let mut dst = vec![0u8; 100];
    let rmr = reg(&net, p.recv, &dst);
    let r = irecv(&net, p.recv, &mut dst, 0, rmr);
    assert!(!net.test(r, &mut [0]).unwrap());
    net.close_send(p.send).unwrap();
    let err = wait_failure(&net, r);
    assert_eq!(err.code, PluginError::REMOTE, "{err}");
    assert!(err.message.contains("closed the connection"), "{err}");
    net.close_recv(p.recv).unwrap();
    net.finalize(p.ctx).unwrap();
}

#[test]
fn messages_sent_before_the_sender_closes_still_arrive() {
    let net = loopback_net(1, 2);
    let p = connect_pair(&net);
    let src = pattern(100_000, 8);
    let smr = reg(&net, p.send, &src);
    let s = isend(&net, p.send, &src, 0, smr);
    assert_eq!(wait(&net, s).unwrap(), src.len());
    net.close_send(p.send).unwrap();
    let mut dst = vec![0u8; 100_000];
    let rmr = reg(&net, p.recv, &dst);
    let r = irecv(&net, p.recv, &mut dst, 0, rmr);
    assert_eq!(wait(&net, r).unwrap(), src.len());
    assert!(dst == src);
    net.close_recv(p.recv).unwrap();
    net.finalize(p.ctx).unwrap();
}

/// 1 GiB in one message, over 2 × 2 sockets. The payload is a random 1 MiB block repeated,
/// each copy stamped with its index, so that a misplaced or missing piece shows (and the
/// test stays fast in debug builds: filling and comparing are memcpy / memcmp).
#[test]
fn one_gib_message() {
    let net = loopback_net(2, 2);
    let p = connect_pair(&net);
    let size = 1usize << 30;
    let block = pattern(1 << 20, 42);
    let mut src = vec![0u8; size];
    for (i, piece) in src.chunks_mut(block.len()).enumerate() {
        piece.copy_from_slice(&block);
        piece[..8].copy_from_slice(&(i as u64).to_le_bytes());
    }
    let started = Instant::now();
    let (dst, got) = round_trip(&net, &p, &src, size);
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(got, size);
    assert!(dst == src, "1 GiB message differs");
    eprintln!(
        "1 GiB over loopback in {secs:.2} s ({:.2} GB/s)",
        size as f64 / secs / 1e9
    );
    close_pair(&net, p);
}

/// A peer that speaks the protocol badly (here: a header out of sequence) fails the
/// connection with a message, it does not confuse it.
#[test]
fn a_bad_header_fails_the_connection() {
    use rustccl_net_socket::connect::Dialer;
    use rustccl_net_socket::wire::{Header, ListenInfo, MAKER, PROTO_MAGIC};
    use std::io::Write;

    let net = loopback_net(1, 1);
    let ctx = net.init(1, &NetCommConfig::default(), QUIET).unwrap();
    let (handle, listen) = net.listen(ctx, 0).unwrap();
    let info = ListenInfo::decode(&handle, PROTO_MAGIC, MAKER).unwrap();
    let mut dialer = Dialer::start(info.addr, info.magic, SocketConfig::default(), -1, None).unwrap();
    let deadline = Instant::now() + DEADLINE;
    let recv = loop {
        dialer.progress().unwrap();
        if let Some(r) = net.accept(listen).unwrap() {
            break r;
        }
        assert!(Instant::now() < deadline);
    };
    let raw = dialer.finish();
    let mut dst = vec![0u8; 64];
    let mr = reg(&net, recv, &dst);
    let r = irecv(&net, recv, &mut dst, 0, mr);
    let bogus = Header {
        seq: 5,
        size: 10,
        tag: 0,
        first_socket: 0,
    };
    (&raw.ctrl).write_all(&bogus.encode()).unwrap();
    let err = wait(&net, r).unwrap_err();
    assert_eq!(err.code, PluginError::REMOTE, "{err}");
    assert!(
        err.message.contains("bad message header") && err.message.contains("sequence number 5"),
        "{err}"
    );
    net.finalize(ctx).unwrap();
}
