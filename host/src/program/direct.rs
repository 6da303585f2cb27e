//! One-shot programs: each rank's input crosses one FIFO hop straight to every rank that
//! needs it, and every rank that needs a reduction computes it itself from all the pieces (in
//! rank order, so that all of them get the same bits). One hop of latency whatever the number
//! of ranks, against the ring's `n - 1` or `2(n - 1)`; each rank moves `n - 1` copies of its
//! input, so it pays at small and middle sizes only. The host backend's planner runs these for
//! Ring/LL (see `Capabilities::one_shot_ll`).
//!
//! Links are [`Purpose::Direct`] on the channel; a step that receives from several peers lists
//! them by ascending rank (the order [`super`] combines inputs in). A message larger than the
//! chunk goes in pieces, each sent then received before the next is sent: a rank waits for a
//! free slot only for pieces its peers have yet to receive, which they do without waiting for
//! it, so no rank waits on another in a cycle.

use super::{chunks, Link, Purpose, Step};

fn link(peer: u32, channel: u32) -> Link {
    Link { peer, purpose: Purpose::Direct(channel) }
}

/// Every rank but `rank`, ascending, as links.
fn peers(rank: u32, nranks: u32, channel: u32) -> Vec<Link> {
    (0..nranks).filter(|&p| p != rank).map(|p| link(p, channel)).collect()
}

/// AllReduce: each piece (pre-multiplied) to every peer, then the n pieces reduced into `dst`.
/// `range` in elements of `elem` bytes, `chunk` elements per piece.
pub fn all_reduce(rank: u32, nranks: u32, channel: u32, range: (usize, usize), chunk: usize, elem: usize) -> Vec<Step> {
    let all = peers(rank, nranks, channel);
    let mut steps = Vec::new();
    for (o, b) in chunks(range, chunk, elem) {
        steps.push(Step { src: Some(o), send: all.clone(), reduce: true, ..Step::new(b) });
        steps.push(Step { src: Some(o), dst: Some(o), recv: all.clone(), reduce: true, post: true, ..Step::new(b) });
    }
    steps
}

/// AllGather: this rank's block (`count` elements at `src`) to its place in `dst` and to every
/// peer; each peer's block from it to its place. `range` is the channel's part of a block.
pub fn all_gather(rank: u32, nranks: u32, channel: u32, range: (usize, usize), count: usize, chunk: usize, elem: usize) -> Vec<Step> {
    let block = |owner: u32, o: usize| owner as usize * count * elem + o;
    let mut steps = Vec::new();
    for (o, b) in chunks(range, chunk, elem) {
        steps.push(Step { src: Some(o), dst: Some(block(rank, o)), send: peers(rank, nranks, channel), ..Step::new(b) });
        for p in (0..nranks).filter(|&p| p != rank) {
            steps.push(Step { dst: Some(block(p, o)), recv: vec![link(p, channel)], ..Step::new(b) });
        }
    }
    steps
}

/// Broadcast from `root`: the root's input to its `dst` and to every peer.
pub fn broadcast(rank: u32, nranks: u32, root: u32, channel: u32, range: (usize, usize), chunk: usize, elem: usize) -> Vec<Step> {
    chunks(range, chunk, elem)
        .map(|(o, b)| match rank == root {
            true => Step { src: Some(o), dst: Some(o), send: peers(rank, nranks, channel), ..Step::new(b) },
            false => Step { dst: Some(o), recv: vec![link(root, channel)], ..Step::new(b) },
        })
        .collect()
}

/// Reduce to `root`: every other rank's (pre-multiplied) input to the root, which reduces them.
pub fn reduce(rank: u32, nranks: u32, root: u32, channel: u32, range: (usize, usize), chunk: usize, elem: usize) -> Vec<Step> {
    chunks(range, chunk, elem)
        .map(|(o, b)| match rank == root {
            true => Step { src: Some(o), dst: Some(o), recv: peers(rank, nranks, channel), reduce: true, post: true, ..Step::new(b) },
            false => Step { src: Some(o), send: vec![link(root, channel)], reduce: true, ..Step::new(b) },
        })
        .collect()
}

/// ReduceScatter: block `p` of this rank's input (pre-multiplied) to rank `p`, then the n
/// pieces of this rank's block reduced into `dst`. `range` is the channel's part of a block.
pub fn reduce_scatter(rank: u32, nranks: u32, channel: u32, range: (usize, usize), count: usize, chunk: usize, elem: usize) -> Vec<Step> {
    let block = |owner: u32, o: usize| owner as usize * count * elem + o;
    let mut steps = Vec::new();
    for (o, b) in chunks(range, chunk, elem) {
        for p in (0..nranks).filter(|&p| p != rank) {
            steps.push(Step { src: Some(block(p, o)), send: vec![link(p, channel)], reduce: true, ..Step::new(b) });
        }
        let recv = peers(rank, nranks, channel);
        steps.push(Step { src: Some(block(rank, o)), dst: Some(o), recv, reduce: true, post: true, ..Step::new(b) });
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::super::tests::{input, simulate};
    use super::*;
    use crate::program::channel_range;

    #[test]
    fn all_reduce_and_reduce_sum_on_every_rank_and_root() {
        for n in 2..=6u32 {
            for count in [1usize, 5, 33] {
                for (chunk, nch) in [(1usize, 1u32), (4, 2), (100, 3)] {
                    let srcs: Vec<_> = (0..n as usize).map(|r| input(r, count)).collect();
                    let want: Vec<i64> = (0..count).map(|i| srcs.iter().map(|s| s[i]).sum()).collect();
                    let progs = |f: &dyn Fn(u32, u32, (usize, usize)) -> Vec<Step>| -> Vec<Vec<Step>> {
                        (0..n).map(|r| (0..nch).flat_map(|c| f(r, c, channel_range(count, c, nch, 8))).collect()).collect()
                    };
                    let out = simulate(progs(&|r, c, range| all_reduce(r, n, c, range, chunk, 8)), srcs.clone(), count);
                    assert!(out.iter().all(|o| *o == want), "all_reduce n {n} count {count} chunk {chunk}");
                    for root in 0..n {
                        let out = simulate(progs(&|r, c, range| reduce(r, n, root, c, range, chunk, 8)), srcs.clone(), count);
                        assert_eq!(out[root as usize], want, "reduce n {n} root {root}");
                    }
                }
            }
        }
    }

    #[test]
    fn all_gather_broadcast_and_reduce_scatter_place_every_block() {
        for n in 2..=5u32 {
            for (count, chunk) in [(7usize, 3usize), (1, 1), (20, 100)] {
                let srcs: Vec<_> = (0..n as usize).map(|r| input(r, count)).collect();
                let progs: Vec<_> = (0..n).map(|r| all_gather(r, n, 0, (0, count), count, chunk, 8)).collect();
                let out = simulate(progs, srcs.clone(), count * n as usize);
                assert!(out.iter().all(|o| *o == srcs.concat()), "all_gather n {n}");
                for root in 0..n {
                    let progs: Vec<_> = (0..n).map(|r| broadcast(r, n, root, 0, (0, count), chunk, 8)).collect();
                    let out = simulate(progs, srcs.clone(), count);
                    assert!(out.iter().all(|o| *o == srcs[root as usize]), "broadcast n {n} root {root}");
                }
                let big: Vec<_> = (0..n as usize).map(|r| input(r, count * n as usize)).collect();
                let progs: Vec<_> = (0..n).map(|r| reduce_scatter(r, n, 0, (0, count), count, chunk, 8)).collect();
                let out = simulate(progs, big.clone(), count);
                for (r, o) in out.iter().enumerate() {
                    let want: Vec<i64> = (0..count).map(|i| big.iter().map(|s| s[r * count + i]).sum()).collect();
                    assert_eq!(*o, want, "reduce_scatter n {n} rank {r}");
                }
            }
        }
    }

    #[test]
    fn every_input_crosses_one_hop_and_receivers_list_peers_by_rank() {
        let steps = all_reduce(2, 4, 1, (0, 4), 4, 4);
        assert_eq!(steps.len(), 2);
        let peers: Vec<u32> = steps[1].recv.iter().map(|l| l.peer).collect();
        assert_eq!(peers, vec![0, 1, 3]);
        assert!(steps.iter().flat_map(|s| s.send.iter().chain(&s.recv)).all(|l| l.purpose == Purpose::Direct(1)));
    }
}
