//! Striping: how one message is cut over the data sockets of a connection, and
//! how either side keeps track of which pieces are done (sans-IO, no sockets).
//!
//! * [`SocketConfig`] reads `NCCL_SOCKET_NTHREADS` and `NCCL_NSOCKS_PERTHREAD`;
//!   their product is the number of data sockets per connection.
//! * [`stripe`] / [`stripe_from`] cut a message into at most one chunk per
//!   socket, each at least `min_chunk` bytes (except the last), so that small
//!   messages use few sockets and large ones use all of them.
//! * [`Reassembly`] is told which chunks are done, in any order, rejects chunks
//!   that do not belong to the message or arrive twice, and says when the
//!   message is complete. The receiver uses it for arriving chunks, the sender
//!   for chunks handed to the kernel.
//!
//! # Striping rule
//!
//! For a message of `size` bytes over `nsocks` sockets, the chunk size is
//! `max(ceil(size / nsocks), min_chunk)`; chunks are cut from offset 0 in that
//! size (the last one may be shorter) and go to consecutive sockets starting at
//! `first_socket`, wrapping around. Because the chunk size is at least
//! `size / nsocks`, there are never more chunks than sockets. A zero-byte
//! message has no chunks and is complete as soon as its size is known.

use std::fmt;

/// Default smallest chunk put on one socket (64 KiB, as NCCL's socket transport).
pub const DEFAULT_MIN_CHUNK: usize = 64 * 1024;

/// Most data sockets per connection (NCCL's limit).
pub const MAX_SOCKETS: usize = 64;

/// Most helper threads per connection (NCCL's limit for `NCCL_SOCKET_NTHREADS`).
pub const MAX_THREADS: usize = 16;

/// How many helper threads, and sockets per thread, a connection uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketConfig {
    /// `NCCL_SOCKET_NTHREADS`: helper threads per connection (1..=16).
    pub nthreads: usize,
    /// `NCCL_NSOCKS_PERTHREAD`: sockets each helper thread drives.
    pub nsocks_per_thread: usize,
    /// `RUSTCCL_SOCKET_TIMEOUT_MS`: how long a connection's peer may stay silent (its data
    /// unacknowledged, keepalive probes unanswered) before the connection fails; `None` (0 or
    /// unset, the default): TCP's own limits, which take many minutes. See
    /// [`crate::connect::set_liveness`].
    pub liveness: Option<std::time::Duration>,
}

impl Default for SocketConfig {
    fn default() -> Self {
        SocketConfig {
            nthreads: 1,
            nsocks_per_thread: 1,
            liveness: None,
        }
    }
}

impl SocketConfig {
    /// Reads the configuration from the process environment.
    pub fn from_env() -> Result<Self, String> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the configuration through `lookup` (name → value). Unset or empty
    /// variables take the default (1); values must be positive integers. As in
    /// NCCL, threads are capped at [`MAX_THREADS`] and, if threads × sockets
    /// per thread exceeds [`MAX_SOCKETS`], sockets per thread are lowered to
    /// `MAX_SOCKETS / nthreads`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let read = |name: &str| -> Result<usize, String> {
            match lookup(name).as_deref().map(str::trim) {
                None | Some("") => Ok(1),
                Some(text) => match text.parse::<usize>() {
                    Ok(n) if n >= 1 => Ok(n),
                    _ => Err(format!("{name}={text} is not a positive integer")),
                },
            }
        };
        let nthreads = read("NCCL_SOCKET_NTHREADS")?.min(MAX_THREADS);
        let nsocks_per_thread = read("NCCL_NSOCKS_PERTHREAD")?.min(MAX_SOCKETS / nthreads);
        let liveness = match lookup("RUSTCCL_SOCKET_TIMEOUT_MS").as_deref().map(str::trim) {
            None | Some("") | Some("0") => None,
            Some(text) => match text.parse::<u64>() {
                Ok(ms) => Some(std::time::Duration::from_millis(ms)),
                _ => {
                    return Err(format!(
                        "RUSTCCL_SOCKET_TIMEOUT_MS={text} is not a number of milliseconds (0: no limit)"
                    ))
                }
            },
        };
        Ok(SocketConfig {
            nthreads,
            nsocks_per_thread,
            liveness,
        })
    }

    /// Data sockets per connection: threads × sockets per thread (1..=64).
    pub fn nsocks(&self) -> usize {
        self.nthreads * self.nsocks_per_thread
    }
}

/// One contiguous piece of a message and the socket that carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Chunk {
    /// Index of the data socket, `0..nsocks`.
    pub socket: usize,
    /// Byte offset in the message.
    pub offset: usize,
    /// Length in bytes (never 0).
    pub len: usize,
}

impl Chunk {
    /// One past the chunk's last byte.
    pub fn end(&self) -> usize {
        self.offset + self.len
    }
}

/// Why a message could not be striped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StripeError {
    /// There must be at least one socket.
    NoSockets,
}

impl fmt::Display for StripeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StripeError::NoSockets => f.write_str("cannot stripe a message over zero sockets"),
        }
    }
}

impl std::error::Error for StripeError {}

/// The chunk size used for a `size`-byte message over `nsocks` sockets:
/// `max(ceil(size / nsocks), min_chunk, 1)`.
pub fn chunk_size(size: usize, nsocks: usize, min_chunk: usize) -> Result<usize, StripeError> {
    if nsocks == 0 {
        return Err(StripeError::NoSockets);
    }
    Ok(size.div_ceil(nsocks).max(min_chunk).max(1))
}

/// Cuts a `size`-byte message into chunks for `nsocks` sockets, starting at socket 0.
pub fn stripe(size: usize, nsocks: usize, min_chunk: usize) -> Result<Vec<Chunk>, StripeError> {
    stripe_from(size, nsocks, min_chunk, 0)
}

/// Like [`stripe`], with the first chunk on socket `first_socket % nsocks`
/// (a sender rotates this between messages so that small messages, which
/// need one socket, do not all load socket 0).
pub fn stripe_from(
    size: usize,
    nsocks: usize,
    min_chunk: usize,
    first_socket: usize,
) -> Result<Vec<Chunk>, StripeError> {
    let chunk = chunk_size(size, nsocks, min_chunk)?;
    let chunks = (0..size)
        .step_by(chunk)
        .enumerate()
        .map(|(i, offset)| Chunk {
            socket: (first_socket % nsocks + i) % nsocks,
            offset,
            len: chunk.min(size - offset),
        })
        .collect();
    Ok(chunks)
}

/// How far a message has come after a chunk was accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// More chunks are due; `remaining_bytes` is what they hold.
    Incomplete {
        /// Bytes not yet received.
        remaining_bytes: usize,
    },
    /// Every byte of the message has arrived.
    Complete,
}

/// A chunk the receiver refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReassemblyError {
    /// The chunk is not one of the message's chunks (wrong socket, offset or length).
    Unexpected(Chunk),
    /// The chunk was already received.
    Duplicate(Chunk),
    /// The message is already complete (including a zero-byte message).
    AlreadyComplete(Chunk),
}

impl fmt::Display for ReassemblyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (what, c) = match self {
            ReassemblyError::Unexpected(c) => ("unexpected", c),
            ReassemblyError::Duplicate(c) => ("duplicate", c),
            ReassemblyError::AlreadyComplete(c) => ("late (message already complete)", c),
        };
        write!(
            f,
            "{what} chunk: socket {} bytes {}..{}",
            c.socket,
            c.offset,
            c.end()
        )
    }
}

impl std::error::Error for ReassemblyError {}

/// Receiver-side state of one message: which of its chunks have arrived.
#[derive(Debug, Clone)]
pub struct Reassembly {
    size: usize,
    /// The message's chunks, sorted by offset.
    chunks: Vec<Chunk>,
    received: Vec<bool>,
    remaining_bytes: usize,
}

impl Reassembly {
    /// State for a `size`-byte message striped as [`stripe`] does.
    pub fn new(size: usize, nsocks: usize, min_chunk: usize) -> Result<Self, StripeError> {
        Self::new_from(size, nsocks, min_chunk, 0)
    }

    /// State for a `size`-byte message striped as [`stripe_from`] does.
    pub fn new_from(
        size: usize,
        nsocks: usize,
        min_chunk: usize,
        first_socket: usize,
    ) -> Result<Self, StripeError> {
        let chunks = stripe_from(size, nsocks, min_chunk, first_socket)?;
        Ok(Reassembly {
            size,
            received: vec![false; chunks.len()],
            chunks,
            remaining_bytes: size,
        })
    }

    /// The message size.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Bytes still to arrive.
    pub fn remaining_bytes(&self) -> usize {
        self.remaining_bytes
    }

    /// Whether every chunk has arrived (immediately true for a zero-byte message).
    pub fn is_complete(&self) -> bool {
        self.remaining_bytes == 0
    }

    /// The chunks still to arrive, by offset.
    pub fn missing(&self) -> impl Iterator<Item = Chunk> + '_ {
        self.chunks
            .iter()
            .zip(&self.received)
            .filter(|(_, done)| !**done)
            .map(|(c, _)| *c)
    }

    /// The chunks a given socket carries for this message (at most one with
    /// the current striping rule), so a receiver knows where to put its bytes.
    pub fn chunks_on(&self, socket: usize) -> impl Iterator<Item = Chunk> + '_ {
        self.chunks
            .iter()
            .copied()
            .filter(move |c| c.socket == socket)
    }

    /// Records that `chunk` arrived completely.
    pub fn accept(&mut self, chunk: Chunk) -> Result<Progress, ReassemblyError> {
        if self.is_complete() {
            return Err(ReassemblyError::AlreadyComplete(chunk));
        }
        let index = self
            .chunks
            .binary_search_by_key(&chunk.offset, |c| c.offset)
            .ok()
            .filter(|&i| self.chunks[i] == chunk)
            .ok_or(ReassemblyError::Unexpected(chunk))?;
        if self.received[index] {
            return Err(ReassemblyError::Duplicate(chunk));
        }
        self.received[index] = true;
        self.remaining_bytes -= chunk.len;
        Ok(match self.remaining_bytes {
            0 => Progress::Complete,
            remaining_bytes => Progress::Incomplete { remaining_bytes },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny deterministic generator (xorshift64*), so the property loops need
    /// no extra crate and every failure reproduces.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        fn shuffle<T>(&mut self, items: &mut [T]) {
            for i in (1..items.len()).rev() {
                items.swap(i, self.below(i + 1));
            }
        }
    }

    /// Every property of a striping, checked without a byte map (works for
    /// huge sizes): chunks are in offset order, contiguous from 0 to `size`,
    /// non-empty, on distinct valid sockets, with the expected sizes.
    fn check_plan(chunks: &[Chunk], size: usize, nsocks: usize, min_chunk: usize, first: usize) {
        let ctx = format!("size={size} nsocks={nsocks} min_chunk={min_chunk} first={first}");
        let chunk = chunk_size(size, nsocks, min_chunk).unwrap();
        assert_eq!(chunks.len(), size.div_ceil(chunk), "{ctx}");
        assert!(chunks.len() <= nsocks, "{ctx}");
        let mut next = 0;
        let mut sockets = vec![false; nsocks];
        for (i, c) in chunks.iter().enumerate() {
            assert_eq!(c.offset, next, "gap or overlap: {ctx}");
            assert!(c.len > 0, "{ctx}");
            if i + 1 < chunks.len() {
                assert_eq!(c.len, chunk, "{ctx}");
                assert!(c.len >= min_chunk, "{ctx}");
            }
            assert_eq!(c.socket, (first % nsocks + i) % nsocks, "{ctx}");
            assert!(
                !std::mem::replace(&mut sockets[c.socket], true),
                "socket reused: {ctx}"
            );
            next = c.end();
        }
        assert_eq!(next, size, "{ctx}");
    }

    #[test]
    fn every_byte_exactly_once_small_sizes() {
        for size in 0..=600 {
            for nsocks in 1..=9 {
                for min_chunk in [0, 1, 7, 64, 1000] {
                    let chunks = stripe(size, nsocks, min_chunk).unwrap();
                    check_plan(&chunks, size, nsocks, min_chunk, 0);
                    let mut covered = vec![0u8; size];
                    for c in &chunks {
                        for b in &mut covered[c.offset..c.end()] {
                            *b += 1;
                        }
                    }
                    assert!(
                        covered.iter().all(|&n| n == 1),
                        "size={size} nsocks={nsocks} min={min_chunk}"
                    );
                }
            }
        }
    }

    #[test]
    fn large_and_random_sizes() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut sizes = vec![
            1,
            65535,
            65536,
            65537,
            64 << 20,
            (64 << 20) + 1,
            usize::MAX / 2,
        ];
        sizes.extend((0..2000).map(|_| rng.below(1 << 30)));
        for size in sizes {
            let nsocks = 1 + rng.below(MAX_SOCKETS);
            let first = rng.below(200);
            let chunks = stripe_from(size, nsocks, DEFAULT_MIN_CHUNK, first).unwrap();
            check_plan(&chunks, size, nsocks, DEFAULT_MIN_CHUNK, first);
        }
    }

    #[test]
    fn small_messages_use_few_sockets() {
        assert_eq!(stripe(0, 8, DEFAULT_MIN_CHUNK).unwrap(), vec![]);
        assert_eq!(
            stripe(1000, 8, DEFAULT_MIN_CHUNK).unwrap(),
            vec![Chunk {
                socket: 0,
                offset: 0,
                len: 1000
            }]
        );
        let two = stripe(100_000, 8, DEFAULT_MIN_CHUNK).unwrap();
        assert_eq!(
            two,
            vec![
                Chunk {
                    socket: 0,
                    offset: 0,
                    len: 65536
                },
                Chunk {
                    socket: 1,
                    offset: 65536,
                    len: 34464
                }
            ]
        );
        let all = stripe(8 << 20, 8, DEFAULT_MIN_CHUNK).unwrap();
        assert_eq!(all.len(), 8);
        assert!(all.iter().all(|c| c.len == 1 << 20));
        assert_eq!(stripe_from(10, 4, 64, 6).unwrap()[0].socket, 2);
        assert_eq!(stripe(10, 0, 64), Err(StripeError::NoSockets));
        assert!(Reassembly::new(10, 0, 64).is_err());
    }

    #[test]
    fn reassembly_in_any_order() {
        let mut rng = Rng(42);
        for round in 0..3000 {
            let size = match round % 3 {
                0 => rng.below(1000),
                1 => rng.below(1 << 20),
                _ => rng.below(1 << 28),
            };
            let nsocks = 1 + rng.below(16);
            let min_chunk = [1, 100, 4096, DEFAULT_MIN_CHUNK][rng.below(4)];
            let first = rng.below(nsocks);
            let mut chunks = stripe_from(size, nsocks, min_chunk, first).unwrap();
            let mut r = Reassembly::new_from(size, nsocks, min_chunk, first).unwrap();
            assert_eq!(r.missing().count(), chunks.len());
            for c in &chunks {
                assert_eq!(r.chunks_on(c.socket).collect::<Vec<_>>(), vec![*c]);
            }
            rng.shuffle(&mut chunks);
            let mut left = size;
            for (i, c) in chunks.iter().enumerate() {
                assert!(!r.is_complete());
                // A chunk shifted by one byte, or on another socket, is refused
                // and changes nothing.
                let shifted = Chunk {
                    offset: c.offset + 1,
                    ..*c
                };
                assert_eq!(r.accept(shifted), Err(ReassemblyError::Unexpected(shifted)));
                if nsocks > 1 {
                    let moved = Chunk {
                        socket: (c.socket + 1) % nsocks,
                        ..*c
                    };
                    assert_eq!(r.accept(moved), Err(ReassemblyError::Unexpected(moved)));
                }
                left -= c.len;
                let expected = if i + 1 == chunks.len() {
                    Progress::Complete
                } else {
                    Progress::Incomplete {
                        remaining_bytes: left,
                    }
                };
                assert_eq!(r.accept(*c), Ok(expected), "size={size} nsocks={nsocks}");
                if i + 1 < chunks.len() {
                    assert_eq!(r.accept(*c), Err(ReassemblyError::Duplicate(*c)));
                }
                assert_eq!(r.remaining_bytes(), left);
            }
            assert!(r.is_complete());
            assert_eq!(r.missing().count(), 0);
            if let Some(c) = chunks.first() {
                assert_eq!(r.accept(*c), Err(ReassemblyError::AlreadyComplete(*c)));
            }
        }
    }

    #[test]
    fn zero_byte_message_is_complete_at_once() {
        let mut r = Reassembly::new(0, 4, DEFAULT_MIN_CHUNK).unwrap();
        assert!(r.is_complete());
        assert_eq!(r.size(), 0);
        assert_eq!(r.missing().count(), 0);
        let c = Chunk {
            socket: 0,
            offset: 0,
            len: 1,
        };
        assert_eq!(r.accept(c), Err(ReassemblyError::AlreadyComplete(c)));
        assert_eq!(
            ReassemblyError::Unexpected(Chunk {
                socket: 3,
                offset: 10,
                len: 5
            })
            .to_string(),
            "unexpected chunk: socket 3 bytes 10..15"
        );
    }

    #[test]
    fn config_from_variables() {
        let lookup = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            SocketConfig::from_lookup(lookup(&[])),
            Ok(SocketConfig::default())
        );
        let c = SocketConfig::from_lookup(lookup(&[
            ("NCCL_SOCKET_NTHREADS", "4"),
            ("NCCL_NSOCKS_PERTHREAD", " 2 "),
        ]))
        .unwrap();
        assert_eq!((c.nthreads, c.nsocks_per_thread, c.nsocks()), (4, 2, 8));
        let c = SocketConfig::from_lookup(lookup(&[
            ("NCCL_SOCKET_NTHREADS", "32"),
            ("NCCL_NSOCKS_PERTHREAD", "8"),
        ]))
        .unwrap();
        assert_eq!((c.nthreads, c.nsocks_per_thread, c.nsocks()), (16, 4, 64));
        let c = SocketConfig::from_lookup(lookup(&[
            ("NCCL_NSOCKS_PERTHREAD", "100"),
            ("NCCL_SOCKET_NTHREADS", ""),
        ]))
        .unwrap();
        assert_eq!(c.nsocks(), 64);
        let err = SocketConfig::from_lookup(lookup(&[("NCCL_SOCKET_NTHREADS", "0")])).unwrap_err();
        assert_eq!(err, "NCCL_SOCKET_NTHREADS=0 is not a positive integer");
        assert!(SocketConfig::from_lookup(lookup(&[("NCCL_NSOCKS_PERTHREAD", "-2")])).is_err());
        let liveness = |v: &'static str| {
            let value = v.to_string();
            SocketConfig::from_lookup(move |name| (name == "RUSTCCL_SOCKET_TIMEOUT_MS").then(|| value.clone())).map(|c| c.liveness)
        };
        assert_eq!(liveness("2500"), Ok(Some(std::time::Duration::from_millis(2500))));
        assert_eq!(liveness("0"), Ok(None));
        assert_eq!(liveness(""), Ok(None));
        assert_eq!(liveness("soon").unwrap_err(), "RUSTCCL_SOCKET_TIMEOUT_MS=soon is not a number of milliseconds (0: no limit)");
    }
}
