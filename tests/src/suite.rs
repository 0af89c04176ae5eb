//! End-to-end suites: each capability is its own check that passes or fails on its own, run in
//! order on one thread (they share a built image and booted VMs). Suites that share nothing run
//! side by side in lanes (see [`crate::lanes`]).
//! A check that needs what an earlier one made (an image, a running VM) and does not find it
//! fails at once saying which check to look at, instead of hiding behind the first failure.

use std::sync::Mutex;

use libtest_mimic::{Arguments, Trial};

pub struct Suite {
    name: &'static str,
    trials: Vec<Trial>,
    teardown: Vec<Box<dyn FnOnce()>>,
}

impl Suite {
    /// A suite whose checks are named `NAME::check` (so `-- NAME::` runs this suite only).
    pub fn new(name: &'static str) -> Suite {
        Suite { name, trials: Vec::new(), teardown: Vec::new() }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// A check: a panic (a failed assertion) fails it, and the suite goes on.
    pub fn check(&mut self, name: &str, f: impl FnOnce() + Send + 'static) {
        let name = format!("{}::{name}", self.name);
        let label = name.clone();
        self.trials.push(Trial::test(name, move || {
            // Printed whether the check passes or fails: CI's time is the sum of these.
            struct Took(String, std::time::Instant);
            impl Drop for Took {
                fn drop(&mut self) {
                    eprintln!("[{} took {:.0}s]", self.0, self.1.elapsed().as_secs_f64());
                }
            }
            let _took = Took(label, std::time::Instant::now());
            f();
            Ok(())
        }));
    }

    /// Runs after every check, passed or failed (ends VMs).
    pub fn teardown(&mut self, f: impl FnOnce() + 'static) {
        self.teardown.push(Box::new(f));
    }

    /// Kills the VM a check left running, once every check is done.
    pub fn kill_at_end(&mut self, vm: &'static Shared<nasos_qemu::Vm>) {
        self.teardown(move || {
            if let Some(mut vm) = vm.take() {
                vm.kill();
            }
        });
    }

    /// Runs the checks `args` selects in order, one at a time, then the teardowns; whether none
    /// failed.
    pub fn run(self, args: &Arguments) -> bool {
        let mut args = args.clone();
        args.test_threads = Some(1);
        let conclusion = libtest_mimic::run(&args, self.trials);
        for t in self.teardown {
            t();
        }
        !conclusion.has_failed()
    }
}

/// Something one check makes and later checks use.
pub struct Shared<T> {
    value: Mutex<Option<T>>,
    made_by: &'static str,
}

impl<T> Shared<T> {
    pub const fn new(made_by: &'static str) -> Shared<T> {
        Shared { value: Mutex::new(None), made_by }
    }

    pub fn set(&self, v: T) {
        *self.value.lock().unwrap_or_else(|p| p.into_inner()) = Some(v);
    }

    /// Runs `f` on the value; fails the calling check if the check that makes it did not.
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let mut guard = self.value.lock().unwrap_or_else(|p| p.into_inner());
        match guard.as_mut() {
            Some(v) => f(v),
            None => panic!("not run: needs what `{}` makes, and that check did not pass", self.made_by),
        }
    }

    pub fn take(&self) -> Option<T> {
        self.value.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl<T: Clone> Shared<T> {
    pub fn get(&self) -> T {
        self.with(|v| v.clone())
    }
}
