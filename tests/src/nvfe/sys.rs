//! The frontend client's only `unsafe` code: the raw `ioctl(2)` (with the embedded pointers
//! patched in), a reserved inaccessible address for the bad-pointer scenarios, `pipe(2)`, and a
//! page whose faults wait on a `userfaultfd` nobody serves (the parked-call scenario).

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;

use nvproxy_abi::ioctl::ioc_size;

use super::Call;

/// Issues `ioctl(fd, call.cmd, call.params)` after writing the address of every nested buffer
/// into its parent (`call.params` or an earlier nested buffer) at its offset.
///
/// Returns the syscall's non-negative result, or the errno.
///
/// Panics if `call.params` is shorter than `_IOC_SIZE(call.cmd)` or a nested buffer's pointer
/// slot lies outside its parent: those would let the kernel touch memory we do not own.
pub fn ioctl(fd: RawFd, call: &mut Call) -> Result<i32, i32> {
    let size = ioc_size(call.cmd) as usize;
    assert!(
        call.params.len() >= size,
        "params buffer ({} bytes) shorter than _IOC_SIZE {size}",
        call.params.len()
    );
    // The addresses of the nested buffers: taken once, before any of them is patched, so every
    // pointer handed to the kernel comes from a `&mut` of its own buffer.
    let addrs: Vec<u64> = call
        .nested
        .iter_mut()
        .map(|n| n.data.as_mut_ptr() as u64)
        .collect();
    for (i, addr) in addrs.iter().enumerate() {
        let (parent, offset) = (call.nested[i].parent, call.nested[i].offset);
        let buf = match parent {
            None => &mut call.params,
            Some(p) => {
                assert!(p < i, "nested buffer {i} names a later parent {p}");
                &mut call.nested[p].data
            }
        };
        let slot = buf
            .get_mut(offset..offset + 8)
            .unwrap_or_else(|| panic!("pointer slot {offset} of nested buffer {i} out of range"));
        slot.copy_from_slice(&addr.to_ne_bytes());
    }
    // SAFETY: `params` is a live, exclusively borrowed buffer of at least `_IOC_SIZE(cmd)` bytes,
    // which is all the kernel copies in and out for the top-level argument. Every pointer inside
    // it (or inside a nested buffer) that this function wrote names a live nested buffer owned by
    // `call`, which stays exclusively borrowed until the syscall returns; the lengths the device
    // uses for them come from the same params, which the callers build to match the buffers.
    // Any other pointer field is 0 or `inaccessible_address()` (a PROT_NONE page), which the
    // kernel rejects with EFAULT without touching our memory. No Rust reference to these bytes
    // exists during the call.
    let ret = unsafe {
        libc::ioctl(
            fd,
            call.cmd as libc::Ioctl,
            call.params.as_mut_ptr().cast::<libc::c_void>(),
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(ret)
    }
}

/// The address of a page that is reserved (`PROT_NONE`) for the life of the process: mapped, so
/// nothing else can land there, but unreadable and unwritable, so `copy_from_user`,
/// `process_vm_readv` and the CUSE retry path all fail on it with `EFAULT`.
pub fn inaccessible_address() -> u64 {
    static ADDR: OnceLock<u64> = OnceLock::new();
    *ADDR.get_or_init(|| {
        // SAFETY: an anonymous private PROT_NONE mapping at an address of the kernel's choice
        // aliases nothing; it is never unmapped and never dereferenced by us.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(
            p != libc::MAP_FAILED,
            "mmap PROT_NONE: {}",
            io::Error::last_os_error()
        );
        p as u64
    })
}

/// `pipe2(O_CLOEXEC)`: (read end, write end).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid array of two ints for the kernel to fill.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: on success both descriptors are new and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A fresh anonymous page registered with a `userfaultfd` for missing-page faults, which
/// nobody serves: any read of it, ours or another process's `process_vm_readv`, waits until
/// the returned fd closes (the process exits). The page is never unmapped. Returns the fd and
/// the page's address.
pub fn parked_page() -> io::Result<(OwnedFd, u64)> {
    // SAFETY: an anonymous private mapping at an address of the kernel's choice aliases
    // nothing; it is never unmapped, and we never dereference it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: userfaultfd takes flags by value and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the fd was just returned by userfaultfd and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(i32::try_from(fd).expect("a new fd")) };
    use std::os::fd::AsRawFd;
    // `UFFD_API`; `UFFDIO_API` = _IOWR(0xAA, 0x3F, struct uffdio_api); `UFFDIO_REGISTER` =
    // _IOWR(0xAA, 0x00, struct uffdio_register); `UFFDIO_REGISTER_MODE_MISSING`
    // (include/uapi/linux/userfaultfd.h).
    let mut api = [0xaa_u64, 0, 0];
    // SAFETY: UFFDIO_API reads and writes the 24-byte struct uffdio_api `api` points to.
    if unsafe { libc::ioctl(fd.as_raw_fd(), 0xc018_aa3f, api.as_mut_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut reg = [p as u64, 4096, 1, 0];
    // SAFETY: UFFDIO_REGISTER reads and writes the 32-byte struct uffdio_register `reg` points
    // to; the range is our own mapping.
    if unsafe { libc::ioctl(fd.as_raw_fd(), 0xc020_aa00, reg.as_mut_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((fd, p as u64))
}
