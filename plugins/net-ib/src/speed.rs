//! A port's speed as NCCL reports it: the lane rate of the port's `active_speed` times the
//! lane count of its `active_width`, in Mbit/s (the net properties' unit).
//!
//! Both fields are bit masks; the lowest set bit counts, and a value with no known bit
//! reads as the table's last entry (as NCCL does).

/// Lane rate in Mbit/s by bit of `active_speed` (`active_speed_ex` where the library
/// reports it): SDR, DDR, QDR, FDR10, FDR, EDR, HDR, NDR, XDR.
const LANE_MBPS: [u32; 9] = [
    2_500, 5_000, 10_000, 10_000, 14_000, 25_000, 50_000, 100_000, 200_000,
];

/// Lanes by bit of `active_width`: 1x, 4x, 8x, 12x, 2x.
const LANES: [u32; 5] = [1, 4, 8, 12, 2];

/// Index of the lowest set bit of `mask` below `max`, or `max`.
fn first_bit(mask: u32, max: usize) -> usize {
    (0..max).find(|&i| mask & (1 << i) != 0).unwrap_or(max)
}

/// The port's speed in Mbit/s from `active_speed` (or a non-zero `active_speed_ex`) and
/// `active_width`.
pub fn port_speed_mbps(active_speed: u32, active_width: u8) -> u32 {
    let lane = LANE_MBPS[first_bit(active_speed, LANE_MBPS.len() - 1)];
    let lanes = LANES[first_bit(active_width.into(), LANES.len() - 1)];
    lane * lanes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speeds_of_common_ports() {
        assert_eq!(port_speed_mbps(1, 1), 2_500, "SDR 1x");
        assert_eq!(port_speed_mbps(4, 2), 40_000, "QDR 4x");
        assert_eq!(port_speed_mbps(32, 2), 100_000, "EDR 4x");
        assert_eq!(port_speed_mbps(64, 2), 200_000, "HDR 4x");
        assert_eq!(port_speed_mbps(64, 16), 100_000, "HDR 2x");
        assert_eq!(port_speed_mbps(128, 2), 400_000, "NDR 4x");
        assert_eq!(port_speed_mbps(256, 2), 800_000, "XDR 4x (active_speed_ex)");
        assert_eq!(port_speed_mbps(16, 8), 168_000, "FDR 12x");
        assert_eq!(port_speed_mbps(8, 1), 10_000, "FDR10 1x");
    }

    #[test]
    fn the_lowest_bit_counts_and_unknown_reads_as_the_last_entry() {
        assert_eq!(
            port_speed_mbps(32 | 64, 2 | 1),
            25_000,
            "EDR (not HDR), 1x (not 4x)"
        );
        assert_eq!(port_speed_mbps(0, 0), 200_000 * 2, "no bit: XDR lanes, 2x");
    }
}
