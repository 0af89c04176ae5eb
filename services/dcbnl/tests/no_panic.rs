//! Whatever a driver answers, parsing it returns a value or an error, never a panic: the fabric
//! service and `nasctl fabric` read these answers. (`fuzz/fuzz_targets/dcbnl_reply.rs` is the
//! same property under libFuzzer.)

use proptest::prelude::*;

fn attr(ty: u16, payload: &[u8]) -> Vec<u8> {
    let mut a = Vec::new();
    a.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
    a.extend_from_slice(&ty.to_ne_bytes());
    a.extend_from_slice(payload);
    while a.len() % 4 != 0 {
        a.push(0);
    }
    a
}

/// Well-formed attribute runs with arbitrary types and contents (ETS is 59 bytes, PFC 136, an
/// APP entry 4), sometimes inside a DCB_ATTR_IEEE nest, sometimes with an APP table nest inside:
/// what gets the search past the length checks and into the decoders.
fn attributes() -> impl Strategy<Value = Vec<u8>> {
    let one = (
        0u16..20,
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..8),
            proptest::collection::vec(any::<u8>(), 55..64),
            proptest::collection::vec(any::<u8>(), 130..140),
        ],
    );
    (proptest::collection::vec(one, 0..6), any::<bool>(), any::<bool>()).prop_map(|(attrs, nest, table)| {
        let mut inner: Vec<u8> = attrs.iter().flat_map(|(t, p)| attr(*t, p)).collect();
        if table {
            // DCB_ATTR_IEEE_APP_TABLE holding DCB_ATTR_IEEE_APP entries.
            let apps: Vec<u8> = attrs.iter().flat_map(|(_, p)| attr(0, &p[..p.len().min(4)])).collect();
            inner.extend(attr(4, &apps));
        }
        let mut body = attr(1, b"eth0\0");
        body.extend(if nest { attr(13, &inner) } else { inner });
        body
    })
}

/// A netlink header (right or wrong length) and a dcbmsg in front of such attributes.
fn framed() -> impl Strategy<Value = Vec<u8>> {
    (any::<u16>(), attributes(), 0usize..8).prop_map(|(flags, body, slack)| {
        let len = (16 + 4 + body.len()) as u32;
        let mut m = Vec::new();
        m.extend_from_slice(&len.saturating_sub(slack as u32).to_ne_bytes());
        m.extend_from_slice(&78u16.to_ne_bytes());
        m.extend_from_slice(&flags.to_ne_bytes());
        m.extend_from_slice(&1u32.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(&[0, 21, 0, 0]);
        m.extend_from_slice(&body);
        m
    })
}

fn parse_everything(data: &[u8]) {
    if let Ok(messages) = nasos_dcbnl::split_messages(data) {
        for m in &messages {
            let _ = nasos_dcbnl::decode_reply(m);
        }
    }
    let _ = nasos_dcbnl::decode_get_response(data, 1);
    let _ = nasos_dcbnl::decode_set_response(data, 1);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..1024)) {
        parse_everything(&data);
    }

    #[test]
    fn framed_garbage_never_panics(m in framed(), ty in prop_oneof![Just(78u16), Just(79u16), Just(2u16)]) {
        let mut m = m;
        m[4..6].copy_from_slice(&ty.to_ne_bytes());
        parse_everything(&m);
    }
}
