//! The scalar typedefs of `nvtypes.h` the param structs use.

/// `NvHandle` (`nvtypes.h`): an RM object handle.
pub type NvHandle = u32;
/// `NvP64` (`nvtypes.h`): a pointer in the *client's* address space, carried as 64 bits.
pub type NvP64 = u64;
/// `NvV32`: a 32-bit value of no particular type.
pub type NvV32 = u32;
