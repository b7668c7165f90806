//! The reactor's sleep, shared by the transports: poll(2) on completion queues' file descriptors
//! (libfabric's FI_WAIT_FD, a verbs completion channel) and an eventfd that submitters write to
//! wake it. Also the cycle counter the benchmarks time round trips with ([`Cycles`]).
mod cycles;

pub use cycles::{ticks, Cycles};
use std::io;
use std::time::Duration;

use rdmalane::backend::Notify;

/// An eventfd, closed on drop; it is the transport's [`Notify`].
pub struct EventFd(i32);

impl EventFd {
    /// A new nonblocking eventfd.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: plain syscall; the fd is owned by the returned value.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(EventFd(fd))
    }

    /// Sleep until one of `fds` or the eventfd is readable, or `timeout` passes; drains the
    /// eventfd.
    pub fn wait(&self, fds: &[i32], timeout: Duration) {
        let mut pfds = Vec::with_capacity(1 + fds.len());
        pfds.push(libc::pollfd { fd: self.0, events: libc::POLLIN, revents: 0 });
        pfds.extend(fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }));
        let ts = libc::timespec {
            tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: pfds holds pfds.len() initialised entries; ts is a valid timespec; no mask.
        unsafe { libc::ppoll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, &ts, std::ptr::null()) };
        if pfds[0].revents & libc::POLLIN != 0 {
            let mut v = 0u64;
            // SAFETY: reading 8 bytes from our nonblocking eventfd into a u64.
            unsafe { libc::read(self.0, &mut v as *mut u64 as *mut _, 8) };
        }
    }
}

impl Notify for EventFd {
    fn notify(&self) {
        let v = 1u64;
        // SAFETY: writing 8 bytes to our eventfd; failure (counter full) still leaves it readable.
        unsafe { libc::write(self.0, &v as *const u64 as *const _, 8) };
    }
}

impl Drop for EventFd {
    fn drop(&mut self) {
        // SAFETY: closing the fd we own, once.
        unsafe { libc::close(self.0) };
    }
}

/// Make `fd` nonblocking (a verbs completion channel: events are drained without blocking).
pub fn set_nonblocking(fd: i32) -> io::Result<()> {
    // SAFETY: fcntl on an fd the caller owns, with plain integer flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
