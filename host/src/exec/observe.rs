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
