//! How a message is spread over a connection's queue pairs (`NCCL_IB_QPS_PER_CONNECTION`):
//! as NCCL does, each QP gets one contiguous part of `ceil(size / nqps)` rounded up to
//! 128 bytes (so parts start on 128-byte boundaries), the last parts shorter or empty. Every
//! QP carries a write-with-immediate even when its part is empty, because the receiver
//! posted one receive per QP and counts their completions.

use crate::device::LinkLayer;

/// The size above which a connection posts the adaptive-routing way, or `None` when it
/// never does. With adaptive routing (AR) the fabric may deliver a QP's packets out of
/// order, so a write-with-immediate's completion would not prove that the bytes before it
/// landed: NCCL then posts the data as plain RDMA writes followed, on each QP, by a 0-byte
/// write-with-immediate, which the fabric orders after them. `NCCL_IB_ADAPTIVE_ROUTING`
/// (unset: on for InfiniBand, off for RoCE) and `NCCL_IB_AR_THRESHOLD` decide.
pub fn adaptive_routing_threshold(
    setting: Option<bool>,
    link: LinkLayer,
    threshold: usize,
) -> Option<usize> {
    setting
        .unwrap_or(link == LinkLayer::InfiniBand)
        .then_some(threshold)
}

/// Whether a `size`-byte message posts the adaptive-routing way (see
/// [`adaptive_routing_threshold`]).
pub fn uses_adaptive_routing(threshold: Option<usize>, size: usize) -> bool {
    threshold.is_some_and(|t| size > t)
}

/// Alignment of each part's start.
pub const PART_ALIGN: usize = 128;

/// One QP's part: offset into the message and length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    pub offset: usize,
    pub len: usize,
}

/// The parts of a `size`-byte message over `nqps` QPs (one per QP, in QP order).
pub fn split(size: usize, nqps: usize) -> Vec<Part> {
    let nqps = nqps.max(1);
    let chunk = size.div_ceil(nqps).div_ceil(PART_ALIGN) * PART_ALIGN;
    (0..nqps)
        .map(|q| {
            let offset = (q * chunk).min(size);
            Part {
                offset,
                len: chunk.min(size - offset),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(size: usize, nqps: usize) {
        let parts = split(size, nqps);
        assert_eq!(parts.len(), nqps.max(1));
        let mut next = 0;
        for p in &parts {
            assert_eq!(p.offset, next.min(size), "{size}/{nqps}: {parts:?}");
            if p.len > 0 {
                assert_eq!(p.offset % PART_ALIGN, 0, "{size}/{nqps}: {parts:?}");
            }
            next = p.offset + p.len;
        }
        assert_eq!(next, size, "{size}/{nqps}: parts cover the message");
    }

    #[test]
    fn adaptive_routing_defaults_and_threshold() {
        assert_eq!(
            adaptive_routing_threshold(None, LinkLayer::InfiniBand, 8192),
            Some(8192)
        );
        assert_eq!(
            adaptive_routing_threshold(None, LinkLayer::Ethernet, 8192),
            None
        );
        assert_eq!(
            adaptive_routing_threshold(Some(true), LinkLayer::Ethernet, 100),
            Some(100)
        );
        assert_eq!(
            adaptive_routing_threshold(Some(false), LinkLayer::InfiniBand, 8192),
            None
        );
        assert!(!uses_adaptive_routing(Some(8192), 8192));
        assert!(uses_adaptive_routing(Some(8192), 8193));
        assert!(!uses_adaptive_routing(None, 1 << 30));
    }

    #[test]
    fn parts_are_aligned_and_cover_the_message() {
        assert_eq!(
            split(1000, 1),
            vec![Part {
                offset: 0,
                len: 1000
            }]
        );
        assert_eq!(
            split(1000, 4),
            vec![
                Part {
                    offset: 0,
                    len: 256
                },
                Part {
                    offset: 256,
                    len: 256
                },
                Part {
                    offset: 512,
                    len: 256
                },
                Part {
                    offset: 768,
                    len: 232
                },
            ]
        );
        // Small messages leave the last QPs an empty part.
        assert_eq!(
            split(130, 4),
            vec![
                Part {
                    offset: 0,
                    len: 128
                },
                Part {
                    offset: 128,
                    len: 2
                },
                Part {
                    offset: 130,
                    len: 0
                },
                Part {
                    offset: 130,
                    len: 0
                },
            ]
        );
        assert_eq!(split(0, 2), vec![Part { offset: 0, len: 0 }; 2]);
        for size in [0, 1, 127, 128, 129, 4095, 65537, (8 << 20) + 3] {
            for nqps in [1, 2, 3, 4, 7, 8] {
                check(size, nqps);
            }
        }
    }
}
