//! The contracts between a nasos image and the running appliance. Each format is defined here
//! once: the builder writes it through these functions and the appliance reads it through them.
//! See README.md for who writes and who reads what.

pub mod agents;
pub mod cmdline;
pub mod entry;
pub mod paths;
pub mod slot;
pub mod state;
