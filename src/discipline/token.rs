//! wr_id tokens: the library owns the wr_id of every WR it posts.
//!
//! A token packs the queue's index in its CQ's table (24 bits), the direction (send or receive, 1 bit) and the
//! WR's sequence number (low 39 bits). Every CQE, error CQEs included (where only wr_id, status, qp_num and
//! vendor_err are valid), therefore maps to exactly one queue and slot in O(1), and a send and a receive of one
//! QP completing on one CQ are never confused. 39 bits of sequence are enough because a queue never has more
//! than 2^24 WRs outstanding, so the full sequence is recovered from the queue's oldest outstanding one.

/// Largest queue index a token can carry.
pub const MAX_INDEX: u32 = (1 << 24) - 1;
const SEQ_BITS: u32 = 39;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
const DIR_BIT: u64 = 1 << SEQ_BITS;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Send,
    Recv,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token(pub u64);

impl Token {
    #[inline]
    pub fn new(index: u32, dir: Direction, seq: u64) -> Token {
        debug_assert!(index <= MAX_INDEX);
        let d = if dir == Direction::Recv { DIR_BIT } else { 0 };
        Token(((index as u64) << (SEQ_BITS + 1)) | d | (seq & SEQ_MASK))
    }
    /// The token of sequence `seq` from `Token::new(index, dir, 0).0` (computed once per queue).
    #[inline]
    pub fn from_base(base: u64, seq: u64) -> Token {
        debug_assert!(base & SEQ_MASK == 0);
        Token(base | (seq & SEQ_MASK))
    }
    #[inline]
    pub fn index(self) -> u32 {
        (self.0 >> (SEQ_BITS + 1)) as u32
    }
    #[inline]
    pub fn direction(self) -> Direction {
        if self.0 & DIR_BIT != 0 {
            Direction::Recv
        } else {
            Direction::Send
        }
    }
    /// How many sequence numbers from `seq` on have tokens that are consecutive integers (the carried field
    /// wraps after them).
    #[inline]
    pub fn seqs_before_wrap(seq: u64) -> u64 {
        SEQ_MASK + 1 - (seq & SEQ_MASK)
    }
    /// The sequence field as carried (for tokens that name a slot, not a sequence).
    #[inline]
    pub fn field(self) -> u64 {
        self.0 & SEQ_MASK
    }

    /// The full sequence number, given the oldest sequence that can still be outstanding (`base`): the one
    /// sequence `>= base` whose low bits match.
    #[inline]
    pub fn seq_from(self, base: u64) -> u64 {
        base + ((self.0.wrapping_sub(base)) & SEQ_MASK)
    }

    /// The newest sequence number below `base` whose low bits match, if there is one: for a CQE that names a
    /// WQE already retired.
    #[inline]
    pub fn seq_before(self, base: u64) -> Option<u64> {
        let back = base.wrapping_sub(self.0) & SEQ_MASK;
        (back != 0 && back <= base).then(|| base - back)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seq_before_finds_a_retired_sequence() {
        let t = |s: u64| Token::new(3, Direction::Send, s);
        assert_eq!(t(5).seq_before(9), Some(5));
        assert_eq!(t(8).seq_before(9), Some(8));
        assert_eq!(t(9).seq_before(9), None, "not below base");
        assert_eq!(t(12).seq_before(9), None, "never before base");
        assert_eq!(t(0).seq_before(0), None);
        let base = SEQ_MASK + 10;
        assert_eq!(t(SEQ_MASK).seq_before(base), Some(SEQ_MASK));
        assert_eq!(t(3).seq_before(base), Some(SEQ_MASK + 4));
    }

    #[test]
    fn round_trip() {
        for &(i, d, s) in &[(0, Direction::Send, 0u64), (MAX_INDEX, Direction::Recv, SEQ_MASK), (77, Direction::Send, 12345)] {
            let t = Token::new(i, d, s);
            assert_eq!(t.index(), i);
            assert_eq!(t.direction(), d);
            assert_eq!(t.seq_from(0), s);
            assert_eq!(Token::from_base(Token::new(i, d, 0).0, s), t);
        }
    }

    #[test]
    fn tokens_are_consecutive_until_the_field_wraps() {
        let base = Token::new(9, Direction::Send, 0).0;
        for seq in [0, 5, SEQ_MASK - 2, SEQ_MASK, SEQ_MASK + 1, 3 * (SEQ_MASK + 1) + 4] {
            let n = Token::seqs_before_wrap(seq);
            let t0 = Token::from_base(base, seq).0;
            assert_eq!(Token::from_base(base, seq + n - 1).0, t0 + n - 1);
            assert_eq!(Token::from_base(base, seq + n).0, base, "seq {seq}: the field wraps after {n}");
        }
    }

    #[test]
    fn sequence_recovered_across_wrap() {
        let base = SEQ_MASK - 3; // oldest outstanding, just below the wrap of the low bits
        for seq in base..base + 10 {
            let t = Token::new(5, Direction::Send, seq);
            assert_eq!(t.seq_from(base), seq);
        }
    }
}
