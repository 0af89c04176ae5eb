//! PID 1's own steps before the first service, timed: all of them are on the way to serving,
//! and the timeline (which times services) does not see them.

/// How long each of PID 1's steps before the first service took: all of them are on the way to
/// serving, so the console says them once.
#[derive(Debug, Clone)]
pub struct Laps {
    last: std::time::Instant,
    took: Vec<(&'static str, std::time::Duration)>,
}

impl Default for Laps {
    fn default() -> Self {
        Laps { last: std::time::Instant::now(), took: Vec::new() }
    }
}

impl Laps {
    /// The step `name` ended now; the next one starts.
    pub fn lap(&mut self, name: &'static str) {
        let now = std::time::Instant::now();
        self.took.push((name, now.duration_since(self.last)));
        self.last = now;
    }

    /// Steps timed elsewhere (`other`) took the time since the last lap.
    pub fn take(&mut self, other: Laps) {
        self.took.extend(other.took);
        self.last = std::time::Instant::now();
    }

    /// "name 0.12s, …", the steps in order.
    pub fn describe(&self) -> String {
        let steps: Vec<String> = self.took.iter().map(|(n, d)| format!("{n} {:.2}s", d.as_secs_f64())).collect();
        steps.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::Laps;

    #[test]
    fn steps_are_said_in_order_with_their_own_time() {
        let mut inner = Laps::default();
        inner.lap("find");
        std::thread::sleep(std::time::Duration::from_millis(30));
        inner.lap("e2fsck");
        let mut laps = Laps::default();
        laps.lap("api filesystems");
        laps.take(inner);
        laps.lap("plan");
        let text = laps.describe();
        let names: Vec<&str> = text.split(", ").map(|s| s.rsplit_once(' ').map_or(s, |(n, _)| n)).collect();
        assert_eq!(names, ["api filesystems", "find", "e2fsck", "plan"]);
        // Each step has its own time: the sleep is e2fsck's, not find's or plan's.
        let secs = |name: &str| -> f64 {
            let step = text.split(", ").find(|s| s.starts_with(&format!("{name} "))).expect("the step");
            step.rsplit_once(' ').and_then(|(_, t)| t.trim_end_matches('s').parse().ok()).expect("seconds")
        };
        assert!(secs("e2fsck") >= 0.03, "{text}");
        assert!(secs("find") < 0.03 && secs("plan") < 0.03, "{text}");
    }
}
