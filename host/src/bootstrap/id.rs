//! The unique id (`ncclUniqueId`, 128 bytes): a random secret that every rank must prove it
//! knows, and the address of the root that runs the rendezvous.
//!
//! Layout: `[0..4]` magic `RCID`, `[4..8]` layout version (LE), `[8..24]` secret,
//! `[24]` address family (4 or 6), `[26..28]` port (BE), `[28..44]` IP address, rest zero.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

pub const UNIQUE_ID_BYTES: usize = 128;
const MAGIC: &[u8; 4] = b"RCID";
const LAYOUT_VERSION: u32 = 1;

/// Size of the shared secret carried in the id.
pub const SECRET_BYTES: usize = 16;
pub type Secret = [u8; SECRET_BYTES];

#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId {
    bytes: [u8; UNIQUE_ID_BYTES],
}

impl std::fmt::Debug for UniqueId {
    // The secret is not printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId(root {}, hash {:016x})", self.root_addr(), self.hash())
    }
}

/// Fresh random bytes from the operating system.
pub fn random_bytes<const N: usize>() -> Result<[u8; N]> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| Error::system(format!("cannot get random bytes: {e}")))?;
    Ok(b)
}

impl UniqueId {
    /// An id for a root listening at `root` with the given secret.
    pub fn from_parts(secret: Secret, root: SocketAddr) -> UniqueId {
        let mut bytes = [0u8; UNIQUE_ID_BYTES];
        bytes[0..4].copy_from_slice(MAGIC);
        bytes[4..8].copy_from_slice(&LAYOUT_VERSION.to_le_bytes());
        bytes[8..24].copy_from_slice(&secret);
        bytes[26..28].copy_from_slice(&root.port().to_be_bytes());
        match root.ip() {
            IpAddr::V4(ip) => {
                bytes[24] = 4;
                bytes[28..32].copy_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                bytes[24] = 6;
                bytes[28..44].copy_from_slice(&ip.octets());
            }
        }
        UniqueId { bytes }
    }

    /// The id that every rank derives by itself from `NCCL_COMM_ID` (no id has to be passed
    /// around): the secret is derived from the variable's value.
    pub fn from_comm_id_env(value: &str, root: SocketAddr) -> UniqueId {
        let digest = Sha256::digest(format!("rustccl NCCL_COMM_ID {value}").as_bytes());
        let mut secret = [0u8; SECRET_BYTES];
        secret.copy_from_slice(&digest[..SECRET_BYTES]);
        UniqueId::from_parts(secret, root)
    }

    /// Parses the 128 bytes a caller passed in; bytes that are not a rustccl id (zeroes, an id
    /// of another library, garbage) are an invalid argument.
    pub fn from_bytes(bytes: &[u8]) -> Result<UniqueId> {
        if bytes.len() != UNIQUE_ID_BYTES {
            return Err(Error::invalid_argument(format!(
                "a unique id has {UNIQUE_ID_BYTES} bytes, got {}",
                bytes.len()
            )));
        }
        if &bytes[0..4] != MAGIC {
            return Err(Error::invalid_argument(
                "the unique id was not made by rustccl's ncclGetUniqueId (bad magic); pass every rank the id rank 0 got",
            ));
        }
        let layout = u32::from_le_bytes(bytes[4..8].try_into().unwrap());
        if layout != LAYOUT_VERSION {
            return Err(Error::invalid_argument(format!(
                "unique id layout version {layout} is not supported (this rustccl uses {LAYOUT_VERSION})"
            )));
        }
        if !matches!(bytes[24], 4 | 6) {
            return Err(Error::invalid_argument("unique id holds no valid root address"));
        }
        let mut id = UniqueId { bytes: [0u8; UNIQUE_ID_BYTES] };
        id.bytes.copy_from_slice(bytes);
        Ok(id)
    }

    pub fn as_bytes(&self) -> &[u8; UNIQUE_ID_BYTES] {
        &self.bytes
    }

    pub fn secret(&self) -> Secret {
        self.bytes[8..24].try_into().unwrap()
    }

    pub fn root_addr(&self) -> SocketAddr {
        let port = u16::from_be_bytes([self.bytes[26], self.bytes[27]]);
        let ip = if self.bytes[24] == 6 {
            let o: [u8; 16] = self.bytes[28..44].try_into().unwrap();
            IpAddr::V6(Ipv6Addr::from(o))
        } else {
            let o: [u8; 4] = self.bytes[28..32].try_into().unwrap();
            IpAddr::V4(Ipv4Addr::from(o))
        };
        SocketAddr::new(ip, port)
    }

    /// A 64-bit hash of the whole id (the communicator hash of NCCL's logs).
    pub fn hash(&self) -> u64 {
        let d = Sha256::digest(self.bytes);
        u64::from_le_bytes(d[..8].try_into().unwrap())
    }

    /// Hex text of the 128 bytes, for passing an id through a command line or a file.
    pub fn to_hex(&self) -> String {
        self.bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn from_hex(s: &str) -> Result<UniqueId> {
        let s = s.trim();
        if s.len() != UNIQUE_ID_BYTES * 2 || !s.is_ascii() {
            return Err(Error::invalid_argument("a unique id in hex has 256 hex digits"));
        }
        let mut bytes = [0u8; UNIQUE_ID_BYTES];
        // Digit by digit: `u8::from_str_radix` would also take a sign ("+f").
        let digit = |c: u8| {
            (c as char).to_digit(16).ok_or_else(|| Error::invalid_argument("a unique id in hex has only hex digits"))
        };
        for (b, pair) in bytes.iter_mut().zip(s.as_bytes().chunks_exact(2)) {
            *b = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
        }
        UniqueId::from_bytes(&bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_v4_and_v6() {
        for addr in ["10.1.2.3:4567", "[fd00::5]:80"] {
            let root: SocketAddr = addr.parse().unwrap();
            let id = UniqueId::from_parts([7u8; 16], root);
            assert_eq!(id.root_addr(), root);
            assert_eq!(id.secret(), [7u8; 16]);
            let back = UniqueId::from_bytes(id.as_bytes()).unwrap();
            assert_eq!(back, id);
            assert_eq!(UniqueId::from_hex(&id.to_hex()).unwrap(), id);
        }
    }

    #[test]
    fn garbage_is_rejected() {
        assert!(UniqueId::from_bytes(&[0u8; 128]).is_err());
        assert!(UniqueId::from_bytes(&[1u8; 12]).is_err());
        assert!(UniqueId::from_hex("zz").is_err());
        let mut bytes = *UniqueId::from_parts([1; 16], "1.2.3.4:5".parse().unwrap()).as_bytes();
        bytes[24] = 9;
        assert!(UniqueId::from_bytes(&bytes).is_err());
    }

    #[test]
    fn hex_is_only_hex_digits() {
        // Found by the unique_id fuzz target: `u8::from_str_radix` takes a sign, so a digit
        // pair "+0" was read as 0x00 and a mangled id accepted.
        let hex = UniqueId::from_parts([3; 16], "127.0.0.1:80".parse().unwrap()).to_hex();
        for (at, bad) in [(200, "+0"), (2, "+5"), (254, "-0")] {
            let mangled = format!("{}{bad}{}", &hex[..at], &hex[at + 2..]);
            let e = UniqueId::from_hex(&mangled).unwrap_err();
            assert!(e.message.contains("only hex digits"), "{mangled}: {}", e.message);
        }
        let upper = hex.to_ascii_uppercase();
        assert_eq!(UniqueId::from_hex(&format!(" {upper}\n")).unwrap().to_hex(), hex);
    }

    #[test]
    fn comm_id_env_gives_the_same_secret_everywhere_and_different_per_value() {
        let root: SocketAddr = "127.0.0.1:9000".parse().unwrap();
        let a = UniqueId::from_comm_id_env("127.0.0.1:9000", root);
        let b = UniqueId::from_comm_id_env("127.0.0.1:9000", root);
        let c = UniqueId::from_comm_id_env("127.0.0.1:9001", root);
        assert_eq!(a, b);
        assert_ne!(a.secret(), c.secret());
        assert_ne!(a.hash(), c.hash());
    }
}
