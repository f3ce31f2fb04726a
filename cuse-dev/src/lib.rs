//! The CUSE wire protocol on `/dev/cuse`, implemented natively.
