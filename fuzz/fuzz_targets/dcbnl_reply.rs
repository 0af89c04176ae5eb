//! Arbitrary bytes as a kernel's dcbnl answer: the fabric service and `nasctl fabric` parse
//! what the NIC's driver sends back, so no answer may make them panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(messages) = nasos_dcbnl::split_messages(data) {
        for m in &messages {
            let _ = nasos_dcbnl::decode_reply(m);
        }
    }
    let _ = nasos_dcbnl::decode_get_response(data, 1);
    let _ = nasos_dcbnl::decode_set_response(data, 1);
});
