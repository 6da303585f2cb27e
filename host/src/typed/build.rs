//! Each operation's checks and resolution, shared by single calls ([`Comm`](super::Comm)'s
//! methods) and groups ([`Group`](super::Group)'s): lengths and ranks first (nothing is
//! registered or enqueued when they fail), then the buffers' addresses.

use super::buffer::{RecvBuf, Resolver, SendBuf};
use super::call::{self, Call};
use super::element::Element;
use super::error::Result;
use super::rank::{Op, Rank};
use crate::spec::Collective;

type R<'r, 'a> = &'r mut Resolver<'a>;

/// The length of a buffer a rank does not use (off the root): empty, or as it would be there.
fn optional(what: &str, name: &str, len: usize, expected: usize) -> Result<()> {
    if len != 0 && len != expected {
        return Err(super::error::Error::new(
            super::error::ErrorKind::Length,
            format!("{what}: the {name} buffer, unused on this rank, has {len} elements; pass an empty one or one of {expected}; nothing was enqueued"),
        ));
    }
    Ok(())
}

pub(crate) fn all_reduce<'a, T: Element, S: SendBuf<T> + ?Sized, D: RecvBuf<T> + ?Sized>(r: R<'_, 'a>, send: &'a S, recv: &'a mut D, op: Op<T>) -> Result<Call> {
    let count = call::equal("all_reduce", send.len(), recv.len())?;
    Ok(Call::AllReduce { send: send.resolve_send(r)?, recv: recv.resolve_recv(r)?, count, op: op.raw() })
}

pub(crate) fn all_reduce_in_place<'a, T: Element, D: RecvBuf<T> + ?Sized>(r: R<'_, 'a>, buf: &'a mut D, op: Op<T>) -> Result<Call> {
    let count = buf.len();
    let p = buf.resolve_recv(r)?;
    Ok(Call::AllReduce { send: p, recv: p, count, op: op.raw() })
}

pub(crate) fn broadcast<'a, T: Element, S: SendBuf<T> + ?Sized, D: RecvBuf<T> + ?Sized>(r: R<'_, 'a>, send: &'a S, recv: &'a mut D, root: Rank) -> Result<Call> {
    let root_i = root.check(r.nranks(), "broadcast: root")?;
    let count = recv.len();
    if root.get() == r.comm.rank_unchecked() {
        call::equal("broadcast (at the root)", send.len(), count)?;
    } else {
        optional("broadcast", "send", send.len(), count)?;
    }
    Ok(Call::Broadcast { send: send.resolve_send(r)?, recv: recv.resolve_recv(r)?, count, root: root_i })
}

pub(crate) fn broadcast_in_place<'a, T: Element, D: RecvBuf<T> + ?Sized>(r: R<'_, 'a>, buf: &'a mut D, root: Rank) -> Result<Call> {
    let root = root.check(r.nranks(), "broadcast: root")?;
    let count = buf.len();
    let p = buf.resolve_recv(r)?;
    Ok(Call::Broadcast { send: p, recv: p, count, root })
}

pub(crate) fn reduce<'a, T: Element, S: SendBuf<T> + ?Sized, D: RecvBuf<T> + ?Sized>(r: R<'_, 'a>, send: &'a S, recv: &'a mut D, op: Op<T>, root: Rank) -> Result<Call> {
    let root_i = root.check(r.nranks(), "reduce: root")?;
    let count = send.len();
    if root.get() == r.comm.rank_unchecked() {
        call::equal("reduce (at the root)", count, recv.len())?;
    } else {
        optional("reduce", "receive", recv.len(), count)?;
    }
    Ok(Call::Reduce { send: send.resolve_send(r)?, recv: recv.resolve_recv(r)?, count, op: op.raw(), root: root_i })
}

pub(crate) fn reduce_in_place<'a, T: Element, D: RecvBuf<T> + ?Sized>(r: R<'_, 'a>, buf: &'a mut D, op: Op<T>, root: Rank) -> Result<Call> {
    let root = root.check(r.nranks(), "reduce: root")?;
    let count = buf.len();
    let p = buf.resolve_recv(r)?;
    Ok(Call::Reduce { send: p, recv: p, count, op: op.raw(), root })
}

pub(crate) fn all_gather<'a, T: Element, S: SendBuf<T> + ?Sized, D: RecvBuf<T> + ?Sized>(r: R<'_, 'a>, send: &'a S, recv: &'a mut D) -> Result<Call> {
    let send_count = call::times_ranks("all_gather", "send", send.len(), "receive", recv.len(), r.nranks())?;
    Ok(Call::AllGather { send: send.resolve_send(r)?, recv: recv.resolve_recv(r)?, send_count })
}

pub(crate) fn all_gather_in_place<'a, T: Element, D: RecvBuf<T> + ?Sized>(r: R<'_, 'a>, buf: &'a mut D) -> Result<Call> {
    let n = r.nranks();
    let send_count = call::blocks("all_gather_in_place", "", buf.len(), n)?;
    let p = buf.resolve_recv(r)?;
    let (send, recv) = call::in_place(Collective::AllGather, p, r.comm.rank_unchecked(), send_count, T::DATA_TYPE);
    Ok(Call::AllGather { send, recv, send_count })
}

pub(crate) fn reduce_scatter<'a, T: Element, S: SendBuf<T> + ?Sized, D: RecvBuf<T> + ?Sized>(r: R<'_, 'a>, send: &'a S, recv: &'a mut D, op: Op<T>) -> Result<Call> {
    let recv_count = call::times_ranks("reduce_scatter", "receive", recv.len(), "send", send.len(), r.nranks())?;
    Ok(Call::ReduceScatter { send: send.resolve_send(r)?, recv: recv.resolve_recv(r)?, recv_count, op: op.raw() })
}

pub(crate) fn reduce_scatter_in_place<'a, T: Element, D: RecvBuf<T> + ?Sized>(r: R<'_, 'a>, buf: &'a mut D, op: Op<T>) -> Result<Call> {
    let n = r.nranks();
    let recv_count = call::blocks("reduce_scatter_in_place", "", buf.len(), n)?;
    let p = buf.resolve_recv(r)?;
    let (send, recv) = call::in_place(Collective::ReduceScatter, p, r.comm.rank_unchecked(), recv_count, T::DATA_TYPE);
    Ok(Call::ReduceScatter { send, recv, recv_count, op: op.raw() })
}

pub(crate) fn all_to_all<'a, T: Element, S: SendBuf<T> + ?Sized, D: RecvBuf<T> + ?Sized>(r: R<'_, 'a>, send: &'a S, recv: &'a mut D) -> Result<Call> {
    let total = call::equal("all_to_all", send.len(), recv.len())?;
    let count = call::blocks("all_to_all", "send", total, r.nranks())?;
    Ok(Call::AllToAll { send: send.resolve_send(r)?, recv: recv.resolve_recv(r)?, count })
}

pub(crate) fn gather<'a, T: Element, S: SendBuf<T> + ?Sized, D: RecvBuf<T> + ?Sized>(r: R<'_, 'a>, send: &'a S, recv: &'a mut D, root: Rank) -> Result<Call> {
    let root_i = root.check(r.nranks(), "gather: root")?;
    let count = send.len();
    if root.get() == r.comm.rank_unchecked() {
        call::times_ranks("gather (at the root)", "send", count, "receive", recv.len(), r.nranks())?;
    } else {
        optional("gather", "receive", recv.len(), call::at_root(Collective::Gather, count, r.nranks()).1)?;
    }
    Ok(Call::Gather { send: send.resolve_send(r)?, recv: recv.resolve_recv(r)?, count, root: root_i })
}

pub(crate) fn scatter<'a, T: Element, S: SendBuf<T> + ?Sized, D: RecvBuf<T> + ?Sized>(r: R<'_, 'a>, send: &'a S, recv: &'a mut D, root: Rank) -> Result<Call> {
    let root_i = root.check(r.nranks(), "scatter: root")?;
    let count = recv.len();
    if root.get() == r.comm.rank_unchecked() {
        call::times_ranks("scatter (at the root)", "receive", count, "send", send.len(), r.nranks())?;
    } else {
        optional("scatter", "send", send.len(), call::at_root(Collective::Scatter, count, r.nranks()).0)?;
    }
    Ok(Call::Scatter { send: send.resolve_send(r)?, recv: recv.resolve_recv(r)?, count, root: root_i })
}

pub(crate) fn send<'a, T: Element, S: SendBuf<T> + ?Sized>(r: R<'_, 'a>, buf: &'a S, peer: Rank) -> Result<Call> {
    let peer = peer.check(r.nranks(), "send: peer")?;
    Ok(Call::Send { send: buf.resolve_send(r)?, count: buf.len(), peer })
}

pub(crate) fn recv<'a, T: Element, D: RecvBuf<T> + ?Sized>(r: R<'_, 'a>, buf: &'a mut D, peer: Rank) -> Result<Call> {
    let peer = peer.check(r.nranks(), "recv: peer")?;
    let count = buf.len();
    Ok(Call::Recv { recv: buf.resolve_recv(r)?, count, peer })
}
