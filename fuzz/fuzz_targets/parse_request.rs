//! Fuzzes the CUSE request parser and the reply encoder with arbitrary `/dev/cuse` reads.
#![no_main]

use cuse_dev::wire::{Op, ReplyBody, encode_reply, parse_request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(msg) = parse_request(data) else { return };
    // What the parser promises: `len` matches the read, payloads match their size fields.
    assert_eq!(msg.header.len as usize, data.len());
    match &msg.op {
        Op::Write(a, d) => assert_eq!(a.size as usize, d.len()),
        Op::Ioctl(a, d) => assert_eq!(a.in_size as usize, d.len()),
        _ => {}
    }
    let unique = msg.header.unique;
    let body = match msg.op.into_owned() {
        Op::Write(_, d) | Op::Ioctl(_, d) => ReplyBody::Data(d.into_owned()),
        _ => ReplyBody::Empty,
    };
    let out = encode_reply(unique, Ok(&body)).expect("small replies always encode");
    assert_eq!(out.len(), 16 + body.len());
});
