//! Feeds arbitrary bytes to the memnode's receive path: frame header, payload read, and the
//! message decoder, as a connection handler would. Any panic, hang or oversized allocation is a bug.
#![no_main]

use gleaner_proto::{read_frame, Message};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut input = data;
    let mut payload = Vec::new();
    // A stream may hold several frames; read until the first error, as the server does.
    for _ in 0..16 {
        let Ok(header) = read_frame(&mut input, &mut payload) else { break };
        assert!(payload.len() <= gleaner_proto::MAX_PAYLOAD);
        if let Ok(msg) = Message::decode(header.kind, &payload) {
            // Walk every variable-length part, and re-encode: decode(encode(m)) must be m.
            match msg {
                Message::Read { pages } => assert_eq!(pages.iter().count(), pages.len()),
                Message::Pages { batch } | Message::Write { batch } => {
                    assert_eq!(batch.iter().count(), batch.len());
                    for (_, _, blob) in batch.iter() {
                        assert!((1..=gleaner_proto::MAX_BLOB_SIZE).contains(&blob.len()));
                    }
                }
                Message::Free { ranges } => assert_eq!(ranges.iter().count(), ranges.len()),
                Message::Forget { copies } => assert_eq!(copies.iter().count(), copies.len()),
                _ => {}
            }
            let mut re = Vec::new();
            msg.encode(&mut re);
            assert_eq!(Message::decode(header.kind, &re).unwrap(), msg);
        }
    }
});
