//! Fuzzes the socket transport's messages as a worker receives them from a tenant
//! (`preload-proto`'s `socket` module): any bytes decode or are refused without a panic, and
//! what decodes encodes back to the same bytes (no field the worker acts on is lost or
//! invented in between). The same bytes also drive one frame with fds through the worker's
//! receive path (`nvproxy_fuzz::fd_frames`: surplus fds arrive owned and are closed).
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvproxy_preload_proto::socket::{
    AttachRequest, CallReply, CallRequest, OpenReply, OpenRequest,
};

fuzz_target!(|data: &[u8]| {
    nvproxy_fuzz::fd_frames::run(data);
    if let Some(m) = OpenRequest::decode(data) {
        let e = m.encode();
        assert_eq!(OpenRequest::decode(&e), Some(m));
    }
    if let Some(m) = AttachRequest::decode(data) {
        let e = m.encode();
        assert_eq!(AttachRequest::decode(&e), Some(m));
        assert_eq!(
            e.as_slice(),
            data,
            "an attach decodes from its own bytes only"
        );
    }
    if let Some(m) = CallRequest::decode(data) {
        let e = m.encode();
        assert_eq!(CallRequest::decode(&e), Some(m));
    }
    if let Some(m) = OpenReply::decode(data) {
        assert_eq!(OpenReply::decode(&m.encode()), Some(m));
    }
    if let Some(m) = CallReply::decode(data) {
        assert_eq!(CallReply::decode(&m.encode()), Some(m));
    }
});
