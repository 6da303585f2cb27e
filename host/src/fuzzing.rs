//! Entry points for the fuzz targets in `fuzz/` and for the corpus regression test
//! (`host/tests/fuzz_corpus.rs`): each feeds arbitrary bytes through the real decoders and
//! panics only if a decoder breaks a promise (a round trip that does not hold). Decoders
//! themselves must never panic, loop forever or allocate without bound, whatever the bytes.
//!
//! Not a stable API: only the fuzz crate and the tests use it.

use crate::bootstrap::root::{RootMsg, MAX_CONTROL_BYTES};
use crate::bootstrap::wire::{decode_header, decode_json, Kind, FRAME_HEADER_BYTES};
use crate::bootstrap::UniqueId;

/// A byte stream as a bootstrap connection would deliver it: frames read one after another
/// (as [`Conn::recv`](crate::bootstrap::wire::Conn::recv) reads them, with the root's
/// payload limit) until the bytes end or a frame is refused; control frames are decoded as
/// the root's JSON messages.
pub fn bootstrap_frames(data: &[u8]) {
    let mut rest = data;
    while let Some((header, after)) = rest.split_first_chunk::<FRAME_HEADER_BYTES>() {
        let (kind, len) = match decode_header(header, MAX_CONTROL_BYTES) {
            Ok(h) => h,
            Err(why) => {
                assert!(!why.is_empty());
                return;
            }
        };
        assert!(len as u64 <= MAX_CONTROL_BYTES);
        // The header says what it decoded.
        assert_eq!(u32::from_le_bytes(header[4..8].try_into().unwrap()), kind as u32);
        assert_eq!(u64::from_le_bytes(header[8..16].try_into().unwrap()), len as u64);
        let Some((payload, after)) = after.split_at_checked(len) else { return };
        if kind == Kind::Control {
            root_message(payload);
        }
        rest = after;
    }
}

/// A control frame's payload, decoded as the root and the ranks decode it; what decodes
/// encodes back to the same message.
pub fn root_message(payload: &[u8]) {
    let Ok(msg) = decode_json::<RootMsg>(payload) else { return };
    let encoded = serde_json::to_vec(&msg).expect("a decoded message encodes");
    let again: RootMsg = decode_json(&encoded).unwrap_or_else(|e| panic!("a re-encoded message does not decode: {e}"));
    assert_eq!(serde_json::to_vec(&again).unwrap(), encoded, "decode(encode(m)) != m");
}

/// The unique id parsers: the 128 bytes (`UniqueId::from_bytes`) and the hex text
/// (`UniqueId::from_hex`). What parses reads back as it was written.
pub fn unique_id(data: &[u8]) {
    if let Ok(id) = UniqueId::from_bytes(data) {
        assert_eq!(&id.as_bytes()[..], data);
        let _ = (id.root_addr(), id.secret(), id.hash());
        assert_eq!(UniqueId::from_hex(&id.to_hex()).expect("to_hex output parses"), id);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(id) = UniqueId::from_hex(text) {
            assert_eq!(id.to_hex(), text.trim().to_ascii_lowercase(), "from_hex accepted {text:?}");
        }
    }
}
