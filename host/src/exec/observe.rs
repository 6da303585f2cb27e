//! The executors' side of the observer interface ([`crate::observe`]): the transfers of a
//! run's work, described. A transfer is consecutive steps of one operation on one connection
//! (a proxy op: channel, peer, direction, the bytes of each slot). On a network connection
//! it is queued for the connection's proxy, which reports each slot as it moves it
//! (`observe::ProxyTrack`); the others (shared memory, device connections), which no proxy
//! moves, complete with the run's channels (`observe::RunEvents::add_local`).

use std::sync::Arc;

use super::Links;
use crate::observe::{ProxyOpDescr, RunEvents};
use crate::transport::{Connection, Dir, Kind};
use crate::work::Work;

/// Tells the observer's `events` of the transfers of `work` on `links` (nothing unless it
/// wants them). Operations are the work's contexts (`ProxyOpDescr::op`).
pub fn queue_proxy_ops(events: &RunEvents, work: &Work, links: &Links) {
    if !events.wants_proxy_ops() {
        return;
    }
    for item in &work.items {
        for (conn, op) in transfers(item.steps.iter().map(|(ci, s)| (*ci, s)), links) {
            if conn.kind == Kind::Net {
                events.add_proxied(&op, &conn.proxy_ops);
            } else {
                events.add_local(op);
            }
        }
    }
}

/// The transfers of one work item's steps (`(context, step)` in order), each with its
/// connection: a step's sends and receives extend the last transfer on their connection if
/// it is of the same context, else start one.
fn transfers<'a>(steps: impl Iterator<Item = (usize, &'a crate::program::Step)>, links: &Links) -> Vec<(Arc<Connection>, ProxyOpDescr)> {
    let mut ops: Vec<(Arc<Connection>, ProxyOpDescr)> = Vec::new();
    for (ci, step) in steps {
        let ends = step.send.iter().map(|l| (l, Dir::Send)).chain(step.recv.iter().map(|l| (l, Dir::Recv)));
        for (link, dir) in ends {
            let Some(conn) = links.get(&(*link, dir)) else { continue };
            match ops.iter_mut().rev().find(|(c, _)| Arc::ptr_eq(c, conn)) {
                Some((_, op)) if op.op == ci => op.step_bytes.push(step.bytes),
                _ => ops.push((
                    Arc::clone(conn),
                    ProxyOpDescr { op: ci, channel: link.purpose.channel(), peer: link.peer, is_send: dir == Dir::Send, step_bytes: vec![step.bytes] },
                )),
            }
        }
    }
    ops
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::backend::Stream;
    use crate::observe::{KernelChannels, ProxyOpEvents, ProxyTrack, RunObserver, Span};
    use crate::program::{Link, Purpose, Step};
    use crate::transport::fifo::{fifo_bytes, Fifo, LocalMemory};
    use crate::work::WorkItem;

    fn conn(link: Link, dir: Dir, kind: Kind) -> Arc<Connection> {
        let mem = LocalMemory::new(fifo_bytes(16));
        // SAFETY: `mem` is zeroed and kept by the connection as long as the FIFO.
        let fifo = unsafe { Fifo::new(mem.ptr(), 16) };
        Arc::new(Connection::for_test(link, dir, kind, fifo, mem))
    }

    /// Records each transfer it is told of, and when one begins.
    struct Recorder(Arc<Mutex<Vec<String>>>);

    struct Began(Arc<Mutex<Vec<String>>>, String, bool);

    impl ProxyOpEvents for Began {
        fn begin(&mut self) {
            if !std::mem::replace(&mut self.2, true) {
                self.0.lock().unwrap().push(format!("begin {}", self.1));
            }
        }
        fn posted(&mut self, _: u64, _: usize) {}
        fn completed(&mut self, _: u64, _: usize) {}
    }

    impl RunObserver for Recorder {
        fn wants_proxy_ops(&self) -> bool {
            true
        }
        fn proxy_op(&self, op: &ProxyOpDescr) -> Box<dyn ProxyOpEvents> {
            let name = format!("op{} ch{} peer{} {} {:?}", op.op, op.channel, op.peer, if op.is_send { "send" } else { "recv" }, op.step_bytes);
            self.0.lock().unwrap().push(name.clone());
            Box::new(Began(Arc::clone(&self.0), name, false))
        }
        fn kernel_launch(&self, _: u64) -> Option<Span> {
            None
        }
        fn kernel_channels(&self) -> Option<Box<dyn KernelChannels>> {
            None
        }
    }

    /// Consecutive steps of one context on one connection are one transfer; a network
    /// connection's are queued for its proxy (they begin when it posts their first slot),
    /// the others begin with the run's channels.
    #[test]
    fn the_transfers_of_a_work_go_to_the_proxy_or_the_channels_by_connection() {
        let (net, shm) = (Link { peer: 1, purpose: Purpose::P2p(0) }, Link { peer: 2, purpose: Purpose::Ring(3) });
        let (net_send, shm_recv) = (conn(net, Dir::Send, Kind::Net), conn(shm, Dir::Recv, Kind::Shm));
        let links: Links = [((net, Dir::Send), Arc::clone(&net_send)), ((shm, Dir::Recv), Arc::clone(&shm_recv))].into_iter().collect();
        let send = |bytes| Step { send: vec![net], ..Step::new(bytes) };
        let steps = vec![(0, send(8)), (0, send(4)), (1, send(2)), (1, Step { recv: vec![shm], ..Step::new(16) })];
        let work = Work { ctxs: vec![], items: vec![WorkItem { steps, pc: 0 }], copies: vec![], stream: Stream::DEFAULT };
        let log = Arc::new(Mutex::new(Vec::new()));
        let events = RunEvents::new(Box::new(Recorder(Arc::clone(&log))));
        queue_proxy_ops(&events, &work, &links);
        assert_eq!(*log.lock().unwrap(), ["op0 ch0 peer1 send [8, 4]", "op1 ch0 peer1 send [2]", "op1 ch3 peer2 recv [16]"]);
        log.lock().unwrap().clear();
        let channels = events.start_channels();
        assert_eq!(*log.lock().unwrap(), ["begin op1 ch3 peer2 recv [16]"], "the local transfer begins with the channels");
        let mut track = ProxyTrack::default();
        track.posted(&net_send.proxy_ops, 2, 2);
        assert_eq!(log.lock().unwrap()[1..], ["begin op1 ch0 peer1 send [2]"], "the proxy's third slot is the second transfer's");
        drop(channels);
    }
}
