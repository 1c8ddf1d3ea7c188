//! Moderated signaling: which WRs are posted with `IBV_SEND_SIGNALED`.
//!
//! A WR is signaled when the ULP asked for it, when the run of unsignaled WRs reaches the interval, or when it
//! takes the last free slot (so a full SQ always ends in a signaled WQE and its completion frees every slot).
//! An unsignaled tail left when the ULP stops posting is covered by the queue's idle-tail marker (see
//! `Queue`), not here: this policy only counts.

/// The interval a queue of `sq_depth` configured with `signal_interval` signals at: 0 picks
/// `max(1, sq_depth / 4)`.
pub fn interval_in_force(sq_depth: u32, signal_interval: u32) -> u32 {
    if signal_interval == 0 {
        (sq_depth / 4).max(1)
    } else {
        signal_interval
    }
}

#[derive(Debug, Clone)]
pub struct SignalPolicy {
    interval: u32,
    unsignaled_run: u32,
}

impl SignalPolicy {
    /// `interval` >= 1: at most `interval - 1` unsignaled WRs in a row.
    pub fn new(interval: u32) -> SignalPolicy {
        SignalPolicy { interval: interval.max(1), unsignaled_run: 0 }
    }

    pub fn interval(&self) -> u32 {
        self.interval
    }

    /// Decides for the next WR and records the decision.
    #[inline]
    pub fn decide(&mut self, requested: bool, takes_last_slot: bool) -> bool {
        let run = self.unsignaled_run + 1;
        // `|`, not `||`: three flags in registers, no branches.
        let signal = requested | takes_last_slot | (run >= self.interval);
        self.unsignaled_run = if signal { 0 } else { run };
        signal
    }

    /// Records a WR posted signaled outside the policy (a marker).
    #[inline]
    pub fn note_signaled(&mut self) {
        self.unsignaled_run = 0;
    }

    /// Whether the newest posted WR is unsignaled (an unsignaled tail exists).
    #[inline]
    pub fn has_unsignaled_tail(&self) -> bool {
        self.unsignaled_run > 0
    }

    /// The unsignaled WRs now ending the SQ (for a writer that decides with locals: `send::Admission`).
    #[inline]
    pub fn run(&self) -> u32 {
        self.unsignaled_run
    }

    /// Resets the run after a rollback: `run` unsignaled WRs now end the SQ.
    pub fn set_run(&mut self, run: u32) {
        self.unsignaled_run = run;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_bounds_the_unsignaled_run() {
        let mut p = SignalPolicy::new(4);
        let got: Vec<bool> = (0..12).map(|_| p.decide(false, false)).collect();
        assert_eq!(got, [false, false, false, true].repeat(3));
    }

    #[test]
    fn request_and_last_slot_force_a_signal_and_restart_the_run() {
        let mut p = SignalPolicy::new(4);
        assert!(!p.decide(false, false));
        assert!(p.decide(true, false));
        assert!(!p.has_unsignaled_tail());
        assert!(!p.decide(false, false));
        assert!(p.has_unsignaled_tail());
        assert!(p.decide(false, true));
        assert!(!p.decide(false, false));
    }

    #[test]
    fn interval_one_signals_everything() {
        let mut p = SignalPolicy::new(1);
        assert!((0..5).all(|_| p.decide(false, false)));
    }
}
