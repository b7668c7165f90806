//! Which of a side's rails each lane of a connection runs on. Each side computes it for the
//! other from the other's hello (its rail count, and whether its rail 0 is an express rail), so
//! that a one-sided op on a lane uses the key of the rail the lane reaches.
use crate::base::transport::RailId;

/// A side's rails, as its lanes sit on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LaneMap {
    /// Rails the side's descriptors carry a key for, an express rail counted.
    pub rails: usize,
    /// Rail 0 is an express rail: a transport of its own on the first NIC, on a reactor of its
    /// own, carrying lane 0 (messages and the latency class); the bulk lanes take rails 1 on.
    pub express: bool,
}

impl LaneMap {
    /// One rail, no express rail: every lane on rail 0.
    #[cfg(test)]
    pub(crate) const SINGLE: LaneMap = LaneMap { rails: 1, express: false };

    /// The rail of lane `i`: the first lane (messages, the latency class) on rail 0, the bulk
    /// lanes round robin over the bulk rails (all of them, or all but an express rail).
    pub(crate) fn rail_of(self, i: usize) -> RailId {
        let first_bulk = usize::from(self.express && self.rails > 1);
        if i == 0 || self.rails <= 1 {
            RailId(0)
        } else {
            RailId(first_bulk + (i - 1) % (self.rails - first_bulk))
        }
    }

    /// Lanes a connection needs at least: the first, and one per bulk rail where there are
    /// several rails.
    pub(crate) fn min_lanes(self) -> usize {
        match (self.rails, self.express) {
            (0 | 1, _) => 1,
            (r, true) => r,
            (r, false) => 1 + r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rails(m: LaneMap, lanes: usize) -> Vec<usize> {
        (0..lanes).map(|i| m.rail_of(i).0).collect()
    }

    #[test]
    fn without_an_express_rail_bulk_lanes_stripe_over_every_rail() {
        assert_eq!(rails(LaneMap::SINGLE, 3), [0, 0, 0]);
        assert_eq!(rails(LaneMap { rails: 2, express: false }, 5), [0, 0, 1, 0, 1]);
        assert_eq!(LaneMap { rails: 2, express: false }.min_lanes(), 3);
    }

    #[test]
    fn an_express_rail_carries_lane_zero_alone() {
        let m = LaneMap { rails: 2, express: true };
        assert_eq!(rails(m, 4), [0, 1, 1, 1]);
        assert_eq!(m.min_lanes(), 2);
        let m = LaneMap { rails: 3, express: true };
        assert_eq!(rails(m, 5), [0, 1, 2, 1, 2]);
        assert_eq!(m.min_lanes(), 3);
        // An express flag on a single rail changes nothing.
        assert_eq!(rails(LaneMap { rails: 1, express: true }, 2), [0, 0]);
    }
}
