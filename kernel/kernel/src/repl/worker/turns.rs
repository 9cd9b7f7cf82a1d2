//! What the worker's threads take turns at reading its link with (`child.rs`'s `Inbox`): the
//! link's [`Frames`], which the thread that holds them reads; a [`Wakeup`] by which another
//! thread claims them from the main thread; and [`wait_for`], the wait on the link (the main
//! thread's on the link and that claim at once; a sub-call's, on the link for a while).
//!
//! `rlm`'s side was tried the same way (a block's caller reading its worker's link while it
//! waits for the reply, rather than the reader thread that then wakes it) and measured no
//! faster: the caller's own wake-up took as long as the two it replaced (the bench guide,
//! "Fewer wake-ups on a block's round trip"). Three more were tried and measured no faster: a
//! frame telling the idle worker that a block is coming (its write costs `rlm` what the block's
//! frame then saves, and the worker wakes ~60 µs after it, later than the block's frame, which
//! follows it by ~30 µs), the block's caller polling for its reply awake (it takes the core
//! the block needs), and the worker telling `rlm` that its block's code returned, ahead of
//! the reply: the bench guide, "A block announced ahead".

use std::io::{self, BufReader};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

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
    /// The wakeup was woken (it is cleared), a signal ended the wait, or its time was up:
    /// look again.
    Woken,
}

/// Waits until `link` can be read or `wakeup`, if any, is woken, for at most `limit` (none:
/// as long as it takes). A wakeup that is woken wins: its thread has to know before it reads.
pub(crate) fn wait_for(
    link: RawFd,
    wakeup: Option<&Wakeup>,
    limit: Option<Duration>,
) -> io::Result<Readable> {
    let mut fds = [
        libc::pollfd {
            fd: link,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: wakeup.map_or(-1, |wakeup| wakeup.0.as_raw_fd()),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let timeout = limit.map_or(-1, |limit| {
        libc::c_int::try_from(limit.as_millis()).unwrap_or(libc::c_int::MAX)
    });
    let count = if wakeup.is_some() { 2 } else { 1 };
    // SAFETY: polls `count` open descriptors of the array.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), count, timeout) };
    if ready < 0 {
        let error = io::Error::last_os_error();
        return if error.kind() == io::ErrorKind::Interrupted {
            Ok(Readable::Woken)
        } else {
            Err(error)
        };
    }
    if let Some(wakeup) = wakeup {
        if fds[1].revents & (libc::POLLNVAL | libc::POLLERR) != 0 {
            // Closed under us (the model's code can close any descriptor of its worker).
            return Err(io::Error::other("the link's wakeup descriptor was closed"));
        }
        if fds[1].revents != 0 {
            wakeup.clear();
            return Ok(Readable::Woken);
        }
    }
    Ok(if fds[0].revents != 0 {
        Readable::Link
    } else {
        Readable::Woken
    })
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
        assert_eq!(
            wait_for(frames.fd(), Some(&wakeup), None).unwrap(),
            Readable::Woken
        );
        // Two frames in one write: reading the first reads the second ahead.
        let mut two = Vec::new();
        write_frame(&mut two, &ToWorker::Interrupt { id: 1 }).unwrap();
        write_frame(&mut two, &ToWorker::Interrupt { id: 2 }).unwrap();
        std::io::Write::write_all(&mut &parent, &two).unwrap();
        wakeup.wake();
        assert_eq!(
            wait_for(frames.fd(), Some(&wakeup), None).unwrap(),
            Readable::Woken
        );
        // Both wakes were taken: now the link.
        assert_eq!(
            wait_for(frames.fd(), Some(&wakeup), None).unwrap(),
            Readable::Link
        );
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
        // Without a wakeup, a wait with a limit ends with it: nothing to read...
        assert_eq!(
            wait_for(frames.fd(), None, Some(Duration::from_millis(10))).unwrap(),
            Readable::Woken
        );
        // ... or at once when there is.
        write_frame(&mut &parent, &ToWorker::Interrupt { id: 3 }).unwrap();
        assert_eq!(
            wait_for(frames.fd(), None, Some(Duration::from_secs(10))).unwrap(),
            Readable::Link
        );
    }
}
