//! The view of one control call that the control handlers share: what kind of object it
//! targets and its params buffer.

use host_driver::HostCall;

use crate::buf::{Loc, bytes_mut, read_at, write_at};
use crate::driver::SimDriver;

/// What the control's target object is.
#[derive(Clone, Copy)]
pub(crate) enum Target {
    Client,
    Device,
    Subdevice(usize),
    /// An `NV_CONFIDENTIAL_COMPUTE` object.
    ConfCompute,
    Other,
}

/// The params buffer of one control call.
pub(crate) struct Ctx<'a> {
    pub(crate) drv: &'a SimDriver,
    pub(crate) call: &'a mut HostCall,
    pub(crate) pl: Loc,
    pub(crate) size: usize,
}

impl Ctx<'_> {
    pub(crate) fn get<T: zerocopy::FromBytes>(&self, off: usize) -> Option<T> {
        read_at(self.call, self.pl, off)
    }

    pub(crate) fn put<T: zerocopy::IntoBytes + zerocopy::Immutable>(&mut self, off: usize, v: &T) {
        write_at(self.call, self.pl, off, v);
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        let size = self.size;
        &mut bytes_mut(self.call, self.pl)[..size]
    }
}
