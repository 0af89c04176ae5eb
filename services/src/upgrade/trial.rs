//! When a version on trial is blessed: once the box has been ready and healthy — a health
//! verdict renewed in time with nothing fatal in it — for the recipe's `bless_after_seconds` in
//! a row. A version that never gets there is never blessed: its tries run out at the next
//! resets (a fatal condition past its grace ends in one) and the previous slot boots again.
//! Pure: the agent feeds it what it reads and the time.

use nasos_api::HealthVerdict;

pub struct Trial {
    bless_after: u64,
    fresh: u64,
    healthy_since: Option<u64>,
    said: Option<String>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Healthy for long enough: bless now.
    Bless {
        healthy_for: u64,
    },
    Wait,
    /// Not healthy, for a reason not said before (said once per reason).
    Unhealthy(String),
}

impl Trial {
    /// `check_interval`: how often the health agent renews its verdict; three rounds missed
    /// make a verdict stale.
    pub fn new(bless_after: u64, check_interval: u64) -> Trial {
        Trial { bless_after, fresh: 3 * check_interval.max(1) + 5, healthy_since: None, said: None }
    }

    pub fn observe(&mut self, now: u64, v: &HealthVerdict) -> Step {
        match v.healthy(now, self.fresh) {
            Ok(()) => {
                self.said = None;
                let since = *self.healthy_since.get_or_insert(now);
                let healthy_for = now.saturating_sub(since);
                if healthy_for >= self.bless_after { Step::Bless { healthy_for } } else { Step::Wait }
            }
            Err(why) => {
                // The clock starts again from the next healthy look.
                self.healthy_since = None;
                if self.said.as_deref() == Some(why.as_str()) {
                    return Step::Wait;
                }
                self.said = Some(why.clone());
                Step::Unhealthy(why)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nasos_api::Fatal;

    fn ok(at: u64) -> HealthVerdict {
        HealthVerdict { at, fatal: vec![] }
    }

    #[test]
    fn blessed_only_after_the_whole_time_healthy_in_a_row() {
        let mut t = Trial::new(60, 10);
        assert_eq!(t.observe(1000, &ok(995)), Step::Wait);
        assert_eq!(t.observe(1030, &ok(1025)), Step::Wait);
        // A fatal condition starts the clock again, and is said once.
        let bad = HealthVerdict {
            at: 1040,
            fatal: vec![Fatal { id: "nfs.listeners".into(), message: "NFS is not listening".into(), since: 1040 }],
        };
        assert_eq!(t.observe(1041, &bad), Step::Unhealthy("NFS is not listening".into()));
        assert_eq!(t.observe(1043, &bad), Step::Wait);
        assert_eq!(t.observe(1050, &ok(1050)), Step::Wait);
        assert_eq!(t.observe(1109, &ok(1105)), Step::Wait, "59 s since it was healthy again");
        assert_eq!(t.observe(1110, &ok(1105)), Step::Bless { healthy_for: 60 });
    }

    #[test]
    fn a_silent_health_agent_is_not_health() {
        let mut t = Trial::new(0, 10);
        assert!(matches!(t.observe(1000, &HealthVerdict::default()), Step::Unhealthy(w) if w.contains("not reported")));
        assert!(matches!(t.observe(1000, &ok(900)), Step::Unhealthy(w) if w.contains("100s old")));
        assert_eq!(t.observe(1000, &ok(999)), Step::Bless { healthy_for: 0 }, "0: bless at the first healthy look");
    }
}
