//! Arbitrary bytes as an upgrade bundle: the appliance reads bundles from USB sticks and HTTP
//! servers it does not control, so no input may make the reader panic, allocate at will, or
//! hand a payload byte to the sink before a trusted signature verified the manifest.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nasos_bundle::{Manifest, TrustedKeys, reader};

/// The committed development key: inputs that carry a real signature of it reach the payloads.
const DEV_KEY: &str = include_str!("../../recipes/keys/nasos-dev.pub");

fuzz_target!(|data: &[u8]| {
    let _ = Manifest::parse(data);
    let Ok(keys) = TrustedKeys::parse([DEV_KEY]) else { return };
    let verified = std::cell::Cell::new(false);
    let _ = reader::read(
        data,
        &keys,
        |_| {
            verified.set(true);
            Ok(())
        },
        |_, r| {
            assert!(verified.get(), "a payload reached the sink before the manifest was verified");
            std::io::copy(r, &mut std::io::sink()).map(|_| ())
        },
    );
    let _ = reader::read_raw(data);
});
