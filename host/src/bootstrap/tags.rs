//! Every bootstrap message tag rustccl uses, allocated here and nowhere else. A tag is 64
//! bits; its top 16 bits name the space:
//!
//! | top bits | space | low bits |
//! |---|---|---|
//! | `0x0000` | the user's (`Communicator::send_bytes`) | anything below 2^48 |
//! | `0x4000` | connection setup: the handle a link's receiver sends | the link's purpose |
//! | `0x8000 \| op` | the bootstrap's own operations: all-gather 1, barrier 2, ring exchange 3 | sequence number << 16 (and the step) |
//! | `0x8007` | a split child's unique id | 1 << 40, child number |
//! | `0x8008` | a shrink's agreement on its child (`comm/agree.rs`) | a hash of the member set |
//! | `0x800e` | answers to requests (`Bootstrap::request`) | a nonce |
//! | `0x800f` | answers to status queries (hang reports) | a nonce |

use crate::error::{Error, Result};
use crate::program::Purpose;

/// The bootstrap's own operations (bit 63).
pub const INTERNAL: u64 = 1 << 63;
/// Tags below this are the user's.
pub const USER_LIMIT: u64 = 1 << 48;

pub const OP_ALLGATHER: u64 = 1;
pub const OP_BARRIER: u64 = 2;
pub const OP_RING: u64 = 3;
/// Split child ids (sent with [`INTERNAL`] by the survivor exchange).
pub const OP_CHILD_ID: u64 = 7;
/// A shrink's agreement (sent with [`INTERNAL`] by the survivor exchange).
pub const OP_SHRINK_AGREEMENT: u64 = 8;
pub const OP_STATUS_REPLY: u64 = 15;
pub const OP_REQUEST_REPLY: u64 = 14;

/// The tag of internal operation `op` number `seq`.
pub fn internal(op: u64, seq: u64) -> u64 {
    INTERNAL | (op << 48) | ((seq & 0xffff_ffff) << 16)
}

/// The tag of the answer to a status query.
pub fn status_reply(nonce: u64) -> u64 {
    INTERNAL | (OP_STATUS_REPLY << 48) | (nonce & 0xffff_ffff_ffff)
}

/// The tag of the answer to a request (`Bootstrap::request`).
pub fn request_reply(nonce: u64) -> u64 {
    INTERNAL | (OP_REQUEST_REPLY << 48) | (nonce & 0xffff_ffff_ffff)
}

/// The tag (without [`INTERNAL`], which the survivor exchange adds) of the id of a split's
/// child number `seq`.
pub fn child_id(seq: u64) -> u64 {
    (OP_CHILD_ID << 48) | (1 << 40) | (seq & 0xff_ffff_ffff)
}

/// The tag (without [`INTERNAL`]) of the agreement of a shrink whose members (sorted) are
/// `members`: the same on every member, and another for another member set (48 bits of a
/// hash), so that one shrink never reads another's messages.
pub fn shrink_agreement(members: &[u32]) -> u64 {
    use sha2::{Digest, Sha256};
    let bytes: Vec<u8> = members.iter().flat_map(|m| m.to_le_bytes()).collect();
    let d = Sha256::digest(&bytes);
    (OP_SHRINK_AGREEMENT << 48) | (u64::from_le_bytes(d[..8].try_into().unwrap()) & 0xffff_ffff_ffff)
}

/// The tag under which the receiver of a link with `purpose` sends its handle.
pub fn connection(purpose: Purpose) -> u64 {
    let code = match purpose {
        Purpose::Ring(c) => (1 << 20) | c as u64,
        Purpose::TreeUp(c) => (2 << 20) | c as u64,
        Purpose::TreeDown(c) => (3 << 20) | c as u64,
        Purpose::P2p(c) => (4 << 20) | c as u64,
        Purpose::Direct(c) => (5 << 20) | c as u64,
    };
    (1 << 62) | code
}

/// A user's tag must lie in the user's space.
pub fn check_user(tag: u64) -> Result<()> {
    if tag >= USER_LIMIT {
        return Err(Error::invalid_argument(format!(
            "bootstrap tag {tag:#x} is reserved: user tags must be below 2^48"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spaces_do_not_overlap() {
        let top = |t: u64| t >> 48;
        let user = top(USER_LIMIT - 1);
        let conn = top(connection(Purpose::P2p(63)));
        let ops: Vec<u64> = [internal(OP_ALLGATHER, 9), internal(OP_BARRIER, 9), internal(OP_RING, 9), INTERNAL | child_id(9), INTERNAL | shrink_agreement(&[0, 2]), status_reply(9), request_reply(9)]
            .into_iter()
            .map(top)
            .collect();
        let mut all = vec![user, conn];
        all.extend(&ops);
        let mut sorted = all.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), all.len(), "{all:x?}");
        assert!(check_user(USER_LIMIT - 1).is_ok());
        assert!(check_user(USER_LIMIT).is_err());
        assert!(check_user(connection(Purpose::Ring(0))).is_err());
        // Shrink agreements: one tag per member set.
        assert_eq!(shrink_agreement(&[0, 1, 3]), shrink_agreement(&[0, 1, 3]));
        assert_ne!(shrink_agreement(&[0, 1, 3]), shrink_agreement(&[0, 1, 2]));
        assert_eq!(top(shrink_agreement(&[u32::MAX; 9])), OP_SHRINK_AGREEMENT);
    }
}
