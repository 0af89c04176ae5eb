//! `cargo +nightly fuzz run validate`: recipe validation must never panic, and a recipe it accepts
//! must resolve to a plan.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nasos_board::{SourceFile, load_recipe};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match load_recipe(&SourceFile::new("fuzz.toml", text)) {
        Ok(loaded) => {
            let _ = loaded.plan().to_string();
        }
        Err(report) => {
            let _ = report.render();
        }
    }
});
