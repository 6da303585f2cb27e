//! The sending side of an encrypted connection: a message's chunks sealed into records by
//! the thread that posts the send (`isend`), so that sealing overlaps the helper threads'
//! writes of earlier messages instead of following them; the helper threads then write the
//! records like any bytes ([`crate::worker::Sealed`]). The receiving side reads each record
//! straight into the receive buffer and opens it there (`worker::Framing`).
//!
//! Records never span two chunks (each chunk is cut into records of at most
//! [`RECORD_PLAIN`] bytes, sealed with its socket's sealer), and both sides cut messages into
//! the same chunks in the same order, so a receiver knows where every record must end.
//!
//! The buffers that hold the records are reused ([`BufferPool`]): a fresh half-megabyte
//! buffer per message costs page faults that showed in the profile as much as a third of
//! the copy that fills it.

use std::sync::{Arc, Mutex};

use rustccl_securewire::{Error, Sealer};

use crate::striping::Chunk;
use crate::worker::Sealed;

/// Plaintext bytes per record on an encrypted data socket: large enough that sealing and the
/// 20 bytes of framing per record cost little, small enough to stay in cache.
pub const RECORD_PLAIN: usize = 256 * 1024;

/// Buffers kept for reuse per connection (more than the requests a host keeps in flight).
const POOLED: usize = 16;

/// A connection's spare record buffers.
#[derive(Debug, Default)]
pub struct BufferPool(Mutex<Vec<Vec<u8>>>);

impl BufferPool {
    /// A buffer of `len` bytes (their values left from its last use: sealing overwrites
    /// them all; only a buffer's growth is zeroed).
    fn take(&self, len: usize) -> Vec<u8> {
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner()).pop().unwrap_or_default();
        v.resize(len, 0);
        v
    }

    fn give(&self, v: Vec<u8>) {
        let mut pool = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if pool.len() < POOLED {
            pool.push(v);
        }
    }
}

/// One message's records; the buffer goes back to its pool when the last task that writes
/// from it is done (or dropped, when the connection closes).
#[derive(Debug)]
pub struct SealedBuf {
    bytes: Vec<u8>,
    pool: Arc<BufferPool>,
}

impl SealedBuf {
    pub fn as_ptr(&self) -> *const u8 {
        self.bytes.as_ptr()
    }
}

impl Drop for SealedBuf {
    fn drop(&mut self) {
        self.pool.give(std::mem::take(&mut self.bytes));
    }
}

/// Seals each of a message's `chunks` (of `message`) into records of at most
/// [`RECORD_PLAIN`] bytes with its socket's sealer, into one buffer from `pool`: each
/// chunk's records, for its task to write.
pub fn seal_chunks(
    sealers: &mut [Sealer],
    chunks: &[Chunk],
    message: &[u8],
    pool: &Arc<BufferPool>,
) -> Result<Vec<Sealed>, Error> {
    let wire: usize = chunks
        .iter()
        .map(|c| c.len + c.len.div_ceil(RECORD_PLAIN) * Sealer::record_bytes(0))
        .sum();
    let mut out = pool.take(wire);
    let mut spans = Vec::with_capacity(chunks.len());
    let mut at = 0;
    for c in chunks {
        let start = at;
        for piece in message[c.offset..c.end()].chunks(RECORD_PLAIN) {
            let end = at + Sealer::record_bytes(piece.len());
            sealers[c.socket].seal_to(piece, &mut out[at..end])?;
            at = end;
        }
        spans.push((start, at - start));
    }
    debug_assert_eq!(at, wire, "the records fill the buffer");
    let bytes = Arc::new(SealedBuf { bytes: out, pool: pool.clone() });
    Ok(spans
        .into_iter()
        .map(|(start, len)| Sealed { bytes: bytes.clone(), start, len })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustccl_securewire::{Keys, Psk};

    #[test]
    fn chunks_become_records_of_at_most_record_plain_and_buffers_come_back() {
        let psk = Psk::new(&[3; 32]).unwrap();
        let keys = Keys::derive(&psk, b"t");
        let mut sealers = vec![keys.sealer("data 0"), keys.sealer("data 1")];
        let message: Vec<u8> = (0..RECORD_PLAIN * 2 + 10).map(|i| i as u8).collect();
        let chunks = [
            Chunk { socket: 1, offset: 0, len: RECORD_PLAIN + 5 },
            Chunk { socket: 0, offset: RECORD_PLAIN + 5, len: RECORD_PLAIN + 5 },
        ];
        let pool = Arc::new(BufferPool::default());
        let sealed = seal_chunks(&mut sealers, &chunks, &message, &pool).unwrap();
        assert_eq!(sealed.len(), 2);
        for s in &sealed {
            assert_eq!(s.len, RECORD_PLAIN + 5 + 2 * Sealer::record_bytes(0), "two records per chunk");
        }
        assert_eq!(sealed[1].start, sealed[0].len);
        // Socket 1's opener opens the first chunk's records, in order.
        let mut opener = keys.opener("data 1", RECORD_PLAIN);
        // SAFETY: the span lies inside the buffer `sealed` keeps alive.
        let wire = unsafe { std::slice::from_raw_parts(sealed[0].bytes.as_ptr(), sealed[0].len) };
        let (h, rest) = wire.split_at(4);
        let mut body = rest[..RECORD_PLAIN + 16].to_vec();
        assert_eq!(opener.open_in_place(h.try_into().unwrap(), &mut body).unwrap(), &message[..RECORD_PLAIN]);
        assert!(pool.0.lock().unwrap().is_empty());
        drop(sealed);
        assert_eq!(pool.0.lock().unwrap().len(), 1, "the buffer is back for the next message");
    }
}
