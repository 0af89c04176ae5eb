//! The end-to-end suites, in two lanes that run side by side (see `nasos_tests::lanes`).
//!
//! A lane holds suites that may share what they write: the data-path suite builds the same
//! upgrade bundles as the upgrade suite (`build/e2e/upgrade`), so the two run in one lane, one
//! after the other. The other lane's suites each write their own images and VMs under
//! `build/e2e`. The lanes are about equal in time (about 30 minutes each on this machine).

mod appliance;
mod datapath;
mod liveness;
mod prod;
mod upgrade;

use std::process::ExitCode;

fn main() -> ExitCode {
    nasos_tests::lanes::main(&[&[datapath::suite, upgrade::suite], &[appliance::suite, prod::suite, liveness::suite]])
}
