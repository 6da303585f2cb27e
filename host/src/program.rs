//! What one rank does for one piece of a collective: a program of steps over links, built
//! from the algorithm (ring, tree, point-to-point). Pure: no memory is touched and no
//! connection exists here, so each algorithm is tested by simulating the ranks.
//!
//! A step takes its inputs from every link in `recv` (one slot each) and from `src`, combines
//! them when `reduce` is set (applying the op's pre-multiplication to `src` and, when `post` is
//! set, its post-division to the result), and writes the result to `dst` and to one slot of
//! every link in `send`. Every input and output of a step has `bytes` bytes. Inputs combine in
//! rank order: the `recv` links (listed by ascending peer) whose peer is below this rank, then
//! `src`, then the others; so ranks that reduce the same pieces themselves (the one-shot
//! programs of [`direct`]) get the same bits. (A ring or tree step has at most one input
//! besides `src`, or only higher-ranked children: their order is unchanged.)

pub mod direct;

/// What a connection is for; with the peer and the direction it names one FIFO.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Purpose {
    Ring(u32),
    TreeUp(u32),
    TreeDown(u32),
    /// Point-to-point, on channel `n` (a large message is spread over several).
    P2p(u32),
    /// The one-shot exchange of [`direct`] on channel `n`: a link to every peer.
    Direct(u32),
}

impl Purpose {
    /// The channel the link belongs to.
    pub fn channel(self) -> u32 {
        match self {
            Purpose::Ring(c) | Purpose::TreeUp(c) | Purpose::TreeDown(c) | Purpose::P2p(c) | Purpose::Direct(c) => c,
        }
    }
}

/// One end of a connection, seen from this rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Link {
    pub peer: u32,
    pub purpose: Purpose,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub recv: Vec<Link>,
    pub send: Vec<Link>,
    /// Byte offset into the operation's source buffer.
    pub src: Option<usize>,
    /// Byte offset into the operation's destination buffer.
    pub dst: Option<usize>,
    pub bytes: usize,
    pub reduce: bool,
    pub post: bool,
    /// `src` is an offset into the destination buffer (a result sent on again).
    pub src_in_dst: bool,
}

impl Step {
    pub(crate) fn new(bytes: usize) -> Step {
        Step { recv: vec![], send: vec![], src: None, dst: None, bytes, reduce: false, post: false, src_in_dst: false }
    }
}

/// A rank's position for one channel of a ring (rank order).
#[derive(Clone, Copy, Debug)]
pub struct Ring {
    pub rank: u32,
    pub nranks: u32,
    pub channel: u32,
}

impl Ring {
    fn next(&self) -> Link {
        Link { peer: (self.rank + 1) % self.nranks, purpose: Purpose::Ring(self.channel) }
    }
    fn prev(&self) -> Link {
        Link { peer: (self.rank + self.nranks - 1) % self.nranks, purpose: Purpose::Ring(self.channel) }
    }
    /// The rank `k` places after this one.
    fn user_rank(&self, k: u32) -> u32 {
        (self.rank + k) % self.nranks
    }
}

/// Elements per 16 bytes (the kernels' vector width) for `elem`-byte elements: pieces that
/// start at multiples of it keep 16-byte alignment from the buffer's start.
fn align_elems(elem: usize) -> usize {
    if elem > 0 && 16 % elem == 0 { 16 / elem } else { 1 }
}

/// `chunk` (elements) cut down to whole 16-byte units when it holds one, and that unit.
fn aligned_chunk(chunk: usize, elem: usize) -> (usize, usize) {
    let a = align_elems(elem);
    let chunk = chunk.max(1);
    if chunk >= a { (chunk / a * a, a) } else { (chunk, 1) }
}

/// The elements one channel handles, cut into loops of `nranks` chunks of at most `chunk`,
/// each starting 16-byte aligned (relative to the buffer) when the chunk allows it.
fn ring_loops(begin: usize, end: usize, nranks: usize, chunk: usize, elem: usize, mut f: impl FnMut(&dyn Fn(usize) -> (usize, usize))) {
    let (chunk, a) = aligned_chunk(chunk, elem);
    let mut off = begin;
    loop {
        let remaining = end - off;
        let real = chunk.min(remaining.div_ceil(nranks).div_ceil(a) * a).max(1);
        let base = off;
        let piece = move |j: usize| {
            let start = (base + j * real).min(end);
            let len = real.min(end - start);
            (start, len)
        };
        f(&piece);
        off += nranks * real;
        if off >= end {
            break;
        }
    }
}

/// Element range `[begin, end)` of `count` (`elem`-byte elements) that channel `c` of `nch`
/// handles: ranges start 16-byte aligned from the buffer's start, the last ones possibly empty.
pub fn channel_range(count: usize, c: u32, nch: u32, elem: usize) -> (usize, usize) {
    let a = align_elems(elem);
    let per = count.div_ceil(nch.max(1) as usize).div_ceil(a) * a;
    let begin = (c as usize * per).min(count);
    (begin, (begin + per).min(count))
}

/// Ring AllReduce (reduce-scatter then all-gather, in chunks). Offsets in elements of `elem`
/// bytes; `src` and `dst` are the same buffer layout.
pub fn ring_all_reduce(r: Ring, range: (usize, usize), chunk: usize, elem: usize) -> Vec<Step> {
    let n = r.nranks as usize;
    let mut steps = Vec::new();
    if range.0 >= range.1 {
        return steps;
    }
    ring_loops(range.0, range.1, n, chunk, elem, |piece| {
        let at = |k: u32| piece(r.user_rank(k) as usize);
        let mk = |k: u32| {
            let (o, len) = at(k);
            (o * elem, len * elem)
        };
        // Send this rank's piece of chunk rank-1.
        let (o, b) = mk(r.nranks - 1);
        steps.push(Step { src: Some(o), send: vec![r.next()], reduce: true, ..Step::new(b) });
        for j in 2..r.nranks {
            let (o, b) = mk(r.nranks - j);
            steps.push(Step { src: Some(o), recv: vec![r.prev()], send: vec![r.next()], reduce: true, ..Step::new(b) });
        }
        let (o, b) = mk(0);
        steps.push(Step {
            src: Some(o),
            dst: Some(o),
            recv: vec![r.prev()],
            send: vec![r.next()],
            reduce: true,
            post: true,
            ..Step::new(b)
        });
        for j in 1..r.nranks - 1 {
            let (o, b) = mk(r.nranks - j);
            steps.push(Step { dst: Some(o), recv: vec![r.prev()], send: vec![r.next()], ..Step::new(b) });
        }
        let (o, b) = mk(1);
        steps.push(Step { dst: Some(o), recv: vec![r.prev()], ..Step::new(b) });
    });
    steps
}

/// Ring AllGather: rank k's `count` elements (at `src` offset 0) land at `dst` offset
/// `k * count`. `range` is the channel's part of one rank's block.
pub fn ring_all_gather(r: Ring, range: (usize, usize), count: usize, chunk: usize, elem: usize) -> Vec<Step> {
    let mut steps = Vec::new();
    for (o, b) in chunks(range, chunk, elem) {
        let block = |owner: u32| (owner as usize * count) * elem + o;
        steps.push(Step { src: Some(o), dst: Some(block(r.rank)), send: vec![r.next()], ..Step::new(b) });
        for j in 1..r.nranks - 1 {
            let owner = (r.rank + r.nranks - j) % r.nranks;
            steps.push(Step { dst: Some(block(owner)), recv: vec![r.prev()], send: vec![r.next()], ..Step::new(b) });
        }
        let last = (r.rank + 1) % r.nranks;
        steps.push(Step { dst: Some(block(last)), recv: vec![r.prev()], ..Step::new(b) });
    }
    steps
}

/// Ring ReduceScatter: block k of every rank's `src` (`k * count` elements in) is reduced into
/// rank k's `dst`. `range` is the channel's part of one block.
pub fn ring_reduce_scatter(r: Ring, range: (usize, usize), count: usize, chunk: usize, elem: usize) -> Vec<Step> {
    let mut steps = Vec::new();
    for (o, b) in chunks(range, chunk, elem) {
        let block = |owner: u32| (owner as usize * count) * elem + o;
        let first = (r.rank + r.nranks - 1) % r.nranks;
        steps.push(Step { src: Some(block(first)), send: vec![r.next()], reduce: true, ..Step::new(b) });
        for j in 2..r.nranks {
            let owner = (r.rank + r.nranks - j) % r.nranks;
            steps.push(Step { src: Some(block(owner)), recv: vec![r.prev()], send: vec![r.next()], reduce: true, ..Step::new(b) });
        }
        steps.push(Step { src: Some(block(r.rank)), dst: Some(o), recv: vec![r.prev()], reduce: true, post: true, ..Step::new(b) });
    }
    steps
}

/// The chunks of `range` (elements), at most `chunk` elements each, as (byte offset, bytes).
pub(crate) fn chunks(range: (usize, usize), chunk: usize, elem: usize) -> impl Iterator<Item = (usize, usize)> {
    let (step, _) = aligned_chunk(chunk, elem);
    (range.0..range.1).step_by(step).map(move |off| (off * elem, step.min(range.1 - off) * elem))
}

/// Ring Broadcast from `root`, pipelined along the ring.
pub fn ring_broadcast(r: Ring, root: u32, range: (usize, usize), chunk: usize, elem: usize) -> Vec<Step> {
    let pos = (r.rank + r.nranks - root) % r.nranks;
    let mut steps = Vec::new();
    let mut off = range.0;
    while off < range.1 {
        let len = chunk.max(1).min(range.1 - off);
        let (o, b) = (off * elem, len * elem);
        let mut s = Step::new(b);
        s.dst = Some(o);
        if pos == 0 {
            s.src = Some(o);
        } else {
            s.recv = vec![r.prev()];
        }
        if pos != r.nranks - 1 {
            s.send = vec![r.next()];
        }
        steps.push(s);
        off += len;
    }
    steps
}

/// Ring Reduce to `root`: a chain starting after the root and ending at it.
pub fn ring_reduce(r: Ring, root: u32, range: (usize, usize), chunk: usize, elem: usize) -> Vec<Step> {
    let pos = (r.rank + r.nranks - root - 1) % r.nranks;
    let mut steps = Vec::new();
    let mut off = range.0;
    while off < range.1 {
        let len = chunk.max(1).min(range.1 - off);
        let (o, b) = (off * elem, len * elem);
        let mut s = Step { src: Some(o), reduce: true, ..Step::new(b) };
        if pos > 0 {
            s.recv = vec![r.prev()];
        }
        if pos == r.nranks - 1 {
            s.dst = Some(o);
            s.post = true;
        } else {
            s.send = vec![r.next()];
        }
        steps.push(s);
        off += len;
    }
    steps
}

/// Binary tree over ranks (rank order): parent and children of `rank`.
pub fn tree_links(rank: u32, nranks: u32) -> (Option<u32>, Vec<u32>) {
    let parent = (rank > 0).then(|| (rank - 1) / 2);
    let children = [2 * rank + 1, 2 * rank + 2].into_iter().filter(|&c| c < nranks).collect();
    (parent, children)
}

/// Tree AllReduce: reduce up the tree to rank 0, then broadcast down, in chunks.
pub fn tree_all_reduce(rank: u32, nranks: u32, channel: u32, range: (usize, usize), chunk: usize, elem: usize) -> Vec<Step> {
    let (parent, children) = tree_links(rank, nranks);
    let up = |p: u32| Link { peer: p, purpose: Purpose::TreeUp(channel) };
    let down = |p: u32| Link { peer: p, purpose: Purpose::TreeDown(channel) };
    let mut pieces = Vec::new();
    let mut off = range.0;
    while off < range.1 {
        let len = chunk.max(1).min(range.1 - off);
        pieces.push((off * elem, len * elem));
        off += len;
    }
    let mut steps = Vec::new();
    for &(o, b) in &pieces {
        let mut s = Step { src: Some(o), reduce: true, recv: children.iter().map(|&c| up(c)).collect(), ..Step::new(b) };
        match parent {
            Some(p) => s.send = vec![up(p)],
            None => {
                s.dst = Some(o);
                s.post = true;
            }
        }
        steps.push(s);
    }
    for &(o, b) in &pieces {
        let send = children.iter().map(|&c| down(c)).collect();
        match parent {
            Some(p) => steps.push(Step { recv: vec![down(p)], dst: Some(o), send, ..Step::new(b) }),
            // The root sends on the result its reduction wrote to dst.
            None if !children.is_empty() => steps.push(Step { src: Some(o), src_in_dst: true, send, ..Step::new(b) }),
            None => {}
        }
    }
    steps
}

/// Point-to-point send, on `channel`, of the bytes `range` of the message (at the same offsets
/// in the source buffer).
pub fn p2p_send(peer: u32, channel: u32, range: (usize, usize), chunk_bytes: usize) -> Vec<Step> {
    let link = Link { peer, purpose: Purpose::P2p(channel) };
    pieces(range, chunk_bytes).map(|(o, b)| Step { src: Some(o), send: vec![link], ..Step::new(b) }).collect()
}

/// Point-to-point receive, on `channel`, of the bytes `range` of the message.
pub fn p2p_recv(peer: u32, channel: u32, range: (usize, usize), chunk_bytes: usize) -> Vec<Step> {
    let link = Link { peer, purpose: Purpose::P2p(channel) };
    pieces(range, chunk_bytes).map(|(o, b)| Step { dst: Some(o), recv: vec![link], ..Step::new(b) }).collect()
}

/// The byte range of a `bytes`-byte message that channel `c` of `nch` carries: 16-byte aligned
/// pieces (the kernels' vector width), the last channels possibly empty.
pub fn p2p_range(bytes: usize, c: u32, nch: u32) -> (usize, usize) {
    let per = bytes.div_ceil(nch.max(1) as usize).div_ceil(16) * 16;
    let begin = (c as usize * per).min(bytes);
    (begin, (begin + per).min(bytes))
}

/// `(offset, len)` pieces of at most `chunk` bytes covering `range`; one empty piece for an
/// empty range.
fn pieces(range: (usize, usize), chunk: usize) -> impl Iterator<Item = (usize, usize)> {
    let chunk = chunk.max(1);
    let (begin, end) = range;
    let n = (end - begin).div_ceil(chunk).max(1);
    (0..n).map(move |i| {
        let at = (begin + i * chunk).min(end);
        (at, chunk.min(end - at))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, VecDeque};

    /// Runs every rank's program on i64 sums, moving messages through unbounded queues; the
    /// ranks take turns one step at a time, so a program that waits for a message that never
    /// comes is caught as a deadlock.
    pub(super) fn simulate(progs: Vec<Vec<Step>>, srcs: Vec<Vec<i64>>, dst_len: usize) -> Vec<Vec<i64>> {
        let n = progs.len();
        let mut dsts = vec![vec![0i64; dst_len]; n];
        let mut queues: HashMap<(u32, u32, Purpose), VecDeque<Vec<i64>>> = HashMap::new();
        let mut pc = vec![0usize; n];
        loop {
            let mut progressed = false;
            for r in 0..n {
                let Some(step) = progs[r].get(pc[r]) else { continue };
                let ready = step.recv.iter().all(|l| queues.get(&(l.peer, r as u32, l.purpose)).is_some_and(|q| !q.is_empty()));
                if !ready {
                    continue;
                }
                let e = step.bytes / 8;
                let from = if step.src_in_dst { &dsts[r] } else { &srcs[r] };
                let mut acc: Option<Vec<i64>> = step.src.map(|o| from[o / 8..o / 8 + e].to_vec());
                for l in &step.recv {
                    let m = queues.get_mut(&(l.peer, r as u32, l.purpose)).unwrap().pop_front().unwrap();
                    assert_eq!(m.len(), e, "message size");
                    acc = Some(match acc {
                        Some(a) if step.reduce => a.iter().zip(&m).map(|(x, y)| x + y).collect(),
                        Some(_) => panic!("two inputs without reduce"),
                        None => m,
                    });
                }
                let out = acc.unwrap_or_default();
                if let Some(o) = step.dst {
                    dsts[r][o / 8..o / 8 + e].copy_from_slice(&out);
                }
                for l in &step.send {
                    queues.entry((r as u32, l.peer, l.purpose)).or_default().push_back(out.clone());
                }
                pc[r] += 1;
                progressed = true;
            }
            if !progressed {
                break;
            }
        }
        for r in 0..n {
            assert_eq!(pc[r], progs[r].len(), "rank {r} stuck at step {}", pc[r]);
        }
        assert!(queues.values().all(|q| q.is_empty()), "messages left over");
        dsts
    }

    pub(super) fn input(r: usize, len: usize) -> Vec<i64> {
        (0..len).map(|i| (r * 1000 + i) as i64).collect()
    }

    #[test]
    fn ring_all_reduce_sums_for_many_shapes() {
        for n in 1..=6u32 {
            for count in [0usize, 1, 5, 17, 64] {
                for chunk in [1usize, 3, 100] {
                    for nch in [1u32, 2] {
                        let mut progs = vec![vec![]; n as usize];
                        for c in 0..nch {
                            let range = channel_range(count, c, nch, 8);
                            for r in 0..n {
                                progs[r as usize].extend(ring_all_reduce(Ring { rank: r, nranks: n, channel: c }, range, chunk, 8));
                            }
                        }
                        let srcs: Vec<_> = (0..n as usize).map(|r| input(r, count)).collect();
                        let out = simulate(progs, srcs.clone(), count);
                        let want: Vec<i64> = (0..count).map(|i| srcs.iter().map(|s| s[i]).sum()).collect();
                        if n > 1 {
                            for o in &out {
                                assert_eq!(o, &want, "n {n} count {count} chunk {chunk} nch {nch}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn tree_all_reduce_sums() {
        for n in 2..=9u32 {
            let count = 23;
            let progs: Vec<_> = (0..n).map(|r| tree_all_reduce(r, n, 0, (0, count), 4, 8)).collect();
            let srcs: Vec<_> = (0..n as usize).map(|r| input(r, count)).collect();
            let out = simulate(progs, srcs.clone(), count);
            let want: Vec<i64> = (0..count).map(|i| srcs.iter().map(|s| s[i]).sum()).collect();
            assert!(out.iter().all(|o| *o == want), "n {n}");
        }
    }

    #[test]
    fn all_gather_and_reduce_scatter() {
        for n in 2..=5u32 {
            let count = 7;
            let progs: Vec<_> = (0..n).map(|r| ring_all_gather(Ring { rank: r, nranks: n, channel: 0 }, (0, count), count, 3, 8)).collect();
            let srcs: Vec<_> = (0..n as usize).map(|r| input(r, count)).collect();
            let out = simulate(progs, srcs.clone(), count * n as usize);
            let want: Vec<i64> = srcs.concat();
            assert!(out.iter().all(|o| *o == want));

            let progs: Vec<_> = (0..n).map(|r| ring_reduce_scatter(Ring { rank: r, nranks: n, channel: 0 }, (0, count), count, 2, 8)).collect();
            let srcs: Vec<_> = (0..n as usize).map(|r| input(r, count * n as usize)).collect();
            let out = simulate(progs, srcs.clone(), count);
            for (r, o) in out.iter().enumerate() {
                let want: Vec<i64> = (0..count).map(|i| srcs.iter().map(|s| s[r * count + i]).sum()).collect();
                assert_eq!(*o, want);
            }
        }
    }

    #[test]
    fn broadcast_and_reduce_from_every_root() {
        for n in 2..=5u32 {
            for root in 0..n {
                let count = 9;
                let progs: Vec<_> = (0..n).map(|r| ring_broadcast(Ring { rank: r, nranks: n, channel: 0 }, root, (0, count), 4, 8)).collect();
                let srcs: Vec<_> = (0..n as usize).map(|r| input(r, count)).collect();
                let out = simulate(progs, srcs.clone(), count);
                assert!(out.iter().all(|o| *o == srcs[root as usize]));

                let progs: Vec<_> = (0..n).map(|r| ring_reduce(Ring { rank: r, nranks: n, channel: 0 }, root, (0, count), 4, 8)).collect();
                let out = simulate(progs, srcs.clone(), count);
                let want: Vec<i64> = (0..count).map(|i| srcs.iter().map(|s| s[i]).sum()).collect();
                assert_eq!(out[root as usize], want);
            }
        }
    }

    #[test]
    fn p2p_pieces_cover_the_message() {
        let s = p2p_send(1, 0, (0, 10), 4);
        assert_eq!(s.iter().map(|s| (s.src.unwrap(), s.bytes)).collect::<Vec<_>>(), vec![(0, 4), (4, 4), (8, 2)]);
        assert_eq!(s[0].send[0].purpose, Purpose::P2p(0));
        let r = p2p_recv(0, 3, (0, 0), 4);
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].bytes, r[0].recv[0].purpose), (0, Purpose::P2p(3)));
        let r = p2p_recv(0, 1, (32, 42), 4);
        assert_eq!(r.iter().map(|s| (s.dst.unwrap(), s.bytes)).collect::<Vec<_>>(), vec![(32, 4), (36, 4), (40, 2)]);
    }

    #[test]
    fn ring_pieces_start_16_byte_aligned_for_any_count() {
        // Odd counts of 4-byte elements: every channel range and every ring piece starts at a
        // multiple of 16 bytes (the kernels' vector loads), and together they cover the count.
        for (count, nch, n) in [(1001usize, 3u32, 3u32), (4097, 2, 4), (77, 1, 2), (1, 4, 2)] {
            let mut covered = vec![0u32; count];
            for c in 0..nch {
                let range = channel_range(count, c, nch, 4);
                assert!(range.0 == range.1 || range.0 % 4 == 0, "channel {c} of {count}: {range:?}");
                for (o, b) in chunks(range, 64, 4) {
                    assert_eq!(o % 16, 0, "chunk at {o}");
                    (o / 4..(o + b) / 4).for_each(|i| covered[i] += 1);
                }
                let steps = ring_all_reduce(Ring { rank: 0, nranks: n, channel: c }, range, 64, 4);
                for s in &steps {
                    for off in s.src.iter().chain(s.dst.iter()).filter(|_| s.bytes > 0) {
                        assert_eq!(off % 16, 0, "count {count}: a piece at byte {off}");
                    }
                    assert!(s.bytes <= 64 * 4);
                }
            }
            assert!(covered.iter().all(|&k| k == 1), "count {count}: every element once");
        }
    }

    #[test]
    fn p2p_channels_split_a_message_in_aligned_ranges() {
        for bytes in [0usize, 1, 15, 16, 17, 1000, 4 << 20, (4 << 20) + 3] {
            for nch in 1..=8u32 {
                let ranges: Vec<_> = (0..nch).map(|c| p2p_range(bytes, c, nch)).collect();
                let mut at = 0;
                for &(b, e) in &ranges {
                    assert_eq!(b, at, "{bytes} bytes over {nch}: contiguous");
                    assert!(b <= e && (b % 16 == 0 || b == bytes));
                    at = e;
                }
                assert_eq!(at, bytes, "{bytes} bytes over {nch}: covered");
            }
        }
    }
}
