//! What the worker's threads take turns at reading its link with (`child.rs`'s `Inbox`): the
//! link's [`Frames`], which the thread that holds them reads; a [`Wakeup`] by which the idle
//! session thread claims them from the main thread; and [`wait_for`], the main thread's wait
//! on the link and that claim at once.
//!
//! `rlm`'s side was tried the same way (a block's caller reading its worker's link while it
//! waits for the reply, rather than the reader thread that then wakes it) and measured no
//! faster: the caller's own wake-up took as long as the two it replaced (the bench guide,
//! "Fewer wake-ups on a block's round trip").

use std::io::{self, BufReader};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use serde::de::DeserializeOwned;

use super::protocol::{FrameError, read_frame};

/// A link's incoming side: its reader, and the buffer a frame is read into.
pub(crate) struct Frames {
    reader: BufReader<UnixStream>,
    buffer: Vec<u8>,
}

impl Frames {
    pub(crate) fn new(reader: BufReader<UnixStream>, buffer: Vec<u8>) -> Self {
        Self { reader, buffer }
    }

    /// The next frame, waited for.
    pub(crate) fn read<T: DeserializeOwned>(&mut self) -> Result<T, FrameError> {
        read_frame(&mut self.reader, &mut self.buffer)
    }

    /// Whether bytes of a next frame were read ahead: the link does not show them as readable.
    pub(crate) fn read_ahead(&self) -> bool {
        !self.reader.buffer().is_empty()
    }

    /// The link's descriptor, to wait on ([`wait_for`]).
    pub(crate) fn fd(&self) -> RawFd {
        self.reader.get_ref().as_raw_fd()
    }
}

/// An eventfd by which one thread wakes another that waits on a link too ([`wait_for`]).
#[derive(Debug)]
pub(crate) struct Wakeup(OwnedFd);

impl Wakeup {
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: creates a new descriptor, owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Wakes the thread waiting on it (or makes its next wait end at once).
    pub(crate) fn wake(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a u64 to an open eventfd (it fails only at a count
        // near 2^64, when the waiter is woken anyway).
        unsafe {
            libc::write(
                self.0.as_raw_fd(),
                std::ptr::addr_of!(one).cast(),
                std::mem::size_of::<u64>(),
            );
        }
    }

    /// Takes the wakes given so far.
    pub(crate) fn clear(&self) {
        let mut count = 0u64;
        // SAFETY: reads 8 bytes into a u64 from an open, non-blocking eventfd.
        unsafe {
            libc::read(
                self.0.as_raw_fd(),
                std::ptr::addr_of_mut!(count).cast(),
                std::mem::size_of::<u64>(),
            );
        }
    }
}

/// What [`wait_for`] found first.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Readable {
    /// The link has bytes to read (or was closed).
    Link,
    /// The wakeup was woken (it is cleared), or a signal ended the wait: look again.
    Woken,
}

/// Waits until `link` can be read or `wakeup` is woken. A wakeup that is woken wins: its
/// thread has to know before it reads.
pub(crate) fn wait_for(link: RawFd, wakeup: &Wakeup) -> io::Result<Readable> {
    let mut fds = [
        libc::pollfd {
            fd: wakeup.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: link,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: polls two open descriptors, the array's length given; no time limit.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
    if ready < 0 {
        let error = io::Error::last_os_error();
        return if error.kind() == io::ErrorKind::Interrupted {
            Ok(Readable::Woken)
        } else {
            Err(error)
        };
    }
    if fds[0].revents & (libc::POLLNVAL | libc::POLLERR) != 0 {
        // Closed under us (the model's code can close any descriptor of its worker).
        return Err(io::Error::other("the link's wakeup descriptor was closed"));
    }
    if fds[0].revents != 0 {
        wakeup.clear();
        return Ok(Readable::Woken);
    }
    Ok(Readable::Link)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // In tests an unwrap is an assertion.
mod tests {
    use super::*;
    use crate::repl::worker::protocol::{ToWorker, write_frame};

    #[test]
    fn a_wakeup_wins_over_the_link_and_a_frame_read_ahead_is_seen() {
        let (parent, worker) = UnixStream::pair().unwrap();
        let mut frames = Frames::new(BufReader::new(worker), Vec::new());
        let wakeup = Wakeup::new().unwrap();
        // Woken before it waits: the wait ends at once.
        wakeup.wake();
        wakeup.wake();
        assert_eq!(wait_for(frames.fd(), &wakeup).unwrap(), Readable::Woken);
        // Two frames in one write: reading the first reads the second ahead.
        let mut two = Vec::new();
        write_frame(&mut two, &ToWorker::Interrupt { id: 1 }).unwrap();
        write_frame(&mut two, &ToWorker::Interrupt { id: 2 }).unwrap();
        std::io::Write::write_all(&mut &parent, &two).unwrap();
        wakeup.wake();
        assert_eq!(wait_for(frames.fd(), &wakeup).unwrap(), Readable::Woken);
        // Both wakes were taken: now the link.
        assert_eq!(wait_for(frames.fd(), &wakeup).unwrap(), Readable::Link);
        assert!(matches!(
            frames.read::<ToWorker>().unwrap(),
            ToWorker::Interrupt { id: 1 }
        ));
        assert!(frames.read_ahead());
        assert!(matches!(
            frames.read::<ToWorker>().unwrap(),
            ToWorker::Interrupt { id: 2 }
        ));
        assert!(!frames.read_ahead());
    }
}
