//! The worker template's machine code on huge pages, so that a worker idle for a while wakes
//! up quickly.
//!
//! # Why
//! On a virtual machine whose host tracks which guest pages are in use (shadow or nested page
//! tables with access tracking, as a Firecracker microVM with `nested_pvm` does), a process
//! that waited some tens of milliseconds pays a trip to the host for the first touch of each
//! 4 KiB page it touches again: ~3–5 µs a page, whether the process slept or spun meanwhile
//! (the guest sees no page fault). A worker that waited out a model call and then runs a small
//! block touches a few hundred such pages, most of them machine code scattered over
//! `libpython` and this program: 1–2 ms, where the same block back to back takes 0.05 ms. A
//! 2 MiB huge page costs one such trip for the whole of it (`kernel/cli/docs/bench-and-eval.md`,
//! "After session 16" and "After session 17").
//!
//! # What
//! The template (`template.rs`), before its interpreter starts and while it has one thread,
//! copies each 2 MiB-aligned window of the read-only part of the objects that hold the
//! interpreter's code and its own (`libpython`, and this executable or the Python package's
//! extension) into an anonymous huge page and puts that page at the window's address with one
//! `mremap`. The bytes at every address are the same before and after; only their backing
//! changes. The workers it forks share those pages (never written, so never split back), so
//! they cost the machine one copy per template, ~4 MiB for `libpython` and ~20 MiB for `rlm`.
//!
//! - **Only whole windows.** A file's code is mapped at 4 KiB alignment; a huge page can only
//!   stand at a 2 MiB-aligned address, so the window's bytes keep their address and the few
//!   hundred KiB at either end of an object stay as they are.
//! - **One protection per page.** A window that holds code and read-only data (headers,
//!   constants, the relocated read-only data) becomes readable and executable as a whole.
//!   Model code in the worker can already run any native code it can load; what holds it is the
//!   confinement around the process (`kernel/sandbox`), not the protection of its pages.
//! - **Never worse than before.** A window whose huge page the kernel cannot give at once
//!   (transparent huge pages off, memory too fragmented: `MADV_COLLAPSE` says so) keeps its file
//!   pages; so does every window after the first failure. Nothing is moved on a machine
//!   without transparent huge pages.
//! - **A switch for embeddings.** [`use_huge_code`]`(false)` has the next template leave its
//!   code in the files' pages (the repl bench measures a block after 50 ms idle one way
//!   against the other so); so do systems whose transparent huge pages are `never`, and a
//!   process started with them turned off (`PR_SET_THP_DISABLE`, inherited).
//! - **Told, and asked.** The template writes what it did ([`HugeCode`]: how many windows, and
//!   the [reason](HugeCodeRefused) for the rest) on its stderr, which its host logs at debug
//!   level (`rlm -vv`). [`try_huge_code`] asks the same question in any process without
//!   changing it, for `rlm doctor`: the same checks, and each window's copy made and
//!   `MADV_COLLAPSE`d as the template does it, then dropped instead of put in the code's
//!   place; only the kernel's answer to `MADV_COLLAPSE` says whether it has a huge page to give.
//!   How many whole windows an object holds depends on where the loader put it (a 4 KiB-aligned
//!   address, chosen anew in each process), so another process may count one more or fewer an
//!   object.
//! - **What it changes for tools.** `/proc/<pid>/maps` shows the windows as anonymous memory,
//!   so a profiler that symbolises by mapping (`perf`) does not name the functions in them; the
//!   C library's list of objects (`dl_iterate_phdr`: backtraces, `gdb`) is unchanged.

use std::fmt;
use std::io;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Whether this process's worker templates move their code to huge pages (the default) or
/// leave it in the files' pages, as before. A template of the other kind is replaced when the
/// next session asks for a worker; workers forked already keep what they have. For benchmarks
/// that measure one way against the other, and hosts that want their workers' memory maps as
/// the files left them (a profiler that names functions by mapping).
pub fn use_huge_code(enabled: bool) {
    ENABLED.store(enabled, Ordering::Relaxed);
}

/// Whether templates started now move their code to huge pages.
pub(crate) fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Why code stays in the files' pages: the system's answer, in words
/// ([`Display`](fmt::Display)), and what would change it ([`HugeCodeRefused::remedy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HugeCodeRefused {
    /// The program turned it off ([`use_huge_code`]`(false)`).
    TurnedOff,
    /// Transparent huge pages are off for this process (`PR_SET_THP_DISABLE`, inherited).
    OffForThisProcess,
    /// The kernel has no transparent huge pages (or `/sys` does not show them).
    NoTransparentHugePages,
    /// The system's mode is `never`.
    Never,
    /// The kernel's huge page size (`hpage_pmd_size`) is unreadable.
    SizeUnreadable,
    /// `/proc/self/maps` cannot be read: the errno.
    MapsUnreadable(i32),
    /// No memory for a copy (`mmap`): the errno.
    NoMemory(i32),
    /// The kernel gave no huge page at once (`MADV_COLLAPSE`): the errno.
    NotAtOnce(i32),
    /// `mprotect` of a copy failed: the errno.
    Protect(i32),
    /// `mremap` of a copy over the code failed: the errno.
    Place(i32),
}

impl HugeCodeRefused {
    /// What would change it, where someone can.
    pub fn remedy(self) -> Option<&'static str> {
        match self {
            HugeCodeRefused::TurnedOff => Some("the program that embeds the kernel decides"),
            HugeCodeRefused::OffForThisProcess => Some(
                "start `rlm` from a process that has them (`grep THP_enabled /proc/$$/status` \
                 says 0 in a shell that has them off)",
            ),
            HugeCodeRefused::NoTransparentHugePages => {
                Some("a kernel built with `CONFIG_TRANSPARENT_HUGEPAGE`, and `/sys` mounted")
            }
            HugeCodeRefused::Never => Some(
                "`echo madvise > /sys/kernel/mm/transparent_hugepage/enabled` as root \
                 (`madvise` is enough: the template asks for them)",
            ),
            HugeCodeRefused::NotAtOnce(libc::EINVAL) => {
                Some("Linux 6.1 or later (`MADV_COLLAPSE`)")
            }
            HugeCodeRefused::NotAtOnce(_) => Some(
                "more free memory, or `echo 1 > /proc/sys/vm/compact_memory` as root (it \
                 makes free memory whole again)",
            ),
            HugeCodeRefused::MapsUnreadable(_) => Some("`/proc` mounted"),
            HugeCodeRefused::SizeUnreadable
            | HugeCodeRefused::NoMemory(_)
            | HugeCodeRefused::Protect(_)
            | HugeCodeRefused::Place(_) => None,
        }
    }
}

impl fmt::Display for HugeCodeRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let os = |errno: i32| io::Error::from_raw_os_error(errno);
        match *self {
            HugeCodeRefused::TurnedOff => {
                write!(f, "turned off (`kernel::repl::use_huge_code(false)`)")
            }
            HugeCodeRefused::OffForThisProcess => write!(
                f,
                "transparent huge pages are off for this process (`PR_SET_THP_DISABLE`, \
                 inherited from whatever started it)"
            ),
            HugeCodeRefused::NoTransparentHugePages => write!(
                f,
                "this kernel has no transparent huge pages (no `/sys/kernel/mm/transparent_hugepage`)"
            ),
            HugeCodeRefused::Never => {
                write!(f, "transparent huge pages are `never` on this system")
            }
            HugeCodeRefused::SizeUnreadable => write!(
                f,
                "the kernel's huge page size (`transparent_hugepage/hpage_pmd_size`) is unreadable"
            ),
            HugeCodeRefused::MapsUnreadable(e) => {
                write!(f, "`/proc/self/maps` cannot be read: {}", os(e))
            }
            HugeCodeRefused::NoMemory(e) => write!(f, "no memory to copy the code to: {}", os(e)),
            HugeCodeRefused::NotAtOnce(libc::EINVAL) => write!(
                f,
                "the kernel cannot make a huge page at once (`MADV_COLLAPSE`: {})",
                os(libc::EINVAL)
            ),
            HugeCodeRefused::NotAtOnce(e) => write!(
                f,
                "the kernel gave no huge page at once, memory short or fragmented \
                 (`MADV_COLLAPSE`: {})",
                os(e)
            ),
            HugeCodeRefused::Protect(e) => write!(f, "`mprotect` of a copy failed: {}", os(e)),
            HugeCodeRefused::Place(e) => {
                write!(f, "`mremap` of a copy over the code failed: {}", os(e))
            }
        }
    }
}

/// How much of a process's code is on huge pages: what a template did (it says so on its
/// stderr, which its host logs at debug level), or would do here ([`try_huge_code`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HugeCode {
    /// The size of a huge page (0: refused before it was known).
    pub page: usize,
    /// The whole windows of huge page size in the code's objects (0: refused before looking).
    pub windows: usize,
    /// How many of them are (or would be) on a huge page: the first ones, in order.
    pub moved: usize,
    /// Why the others are not, if any is not.
    pub refused: Option<HugeCodeRefused>,
}

impl HugeCode {
    /// Nothing moved, for `why`.
    fn refused(why: HugeCodeRefused) -> Self {
        Self {
            page: 0,
            windows: 0,
            moved: 0,
            refused: Some(why),
        }
    }
}

impl fmt::Display for HugeCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = self.page >> 20;
        match self.refused {
            None if self.windows == 0 => {
                write!(f, "none: no {mib} MiB window lies wholly in the code")
            }
            None => write!(f, "{} of {} windows of {mib} MiB", self.moved, self.windows),
            Some(why) if self.moved == 0 => write!(f, "none: {why}"),
            Some(why) => write!(
                f,
                "{} of {} windows of {mib} MiB, then: {why}",
                self.moved, self.windows
            ),
        }
    }
}

/// Moves this process's code, the interpreter's and its own, to huge pages unless the system
/// says no or `enabled` is false (see the [module docs](self)): how much it moved, and why not
/// more (the windows moved before a refusal stay so). The template calls it before its
/// interpreter starts, while it has one thread.
pub(crate) fn move_own_code(enabled: bool) -> HugeCode {
    own_code(enabled, Placing::Move)
}

/// What a worker template started by this process now would do with its code (see the
/// `huge_code` module's docs), found the way it does it: the same checks, and each window of this
/// process's code copied to a huge page, which is then dropped, not put in the code's place
/// (only the kernel's answer to `MADV_COLLAPSE` tells whether it has a huge page to give).
/// This process's memory is left as it was. For `rlm doctor`, in the executable its workers
/// run.
pub fn try_huge_code() -> HugeCode {
    own_code(enabled(), Placing::Trial)
}

/// Whether a copy is put in the code's place, or only tried and dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placing {
    Move,
    Trial,
}

fn own_code(enabled: bool, placing: Placing) -> HugeCode {
    let code = [
        pyo3::ffi::Py_Initialize as *const () as usize,
        own_code as *const () as usize,
    ];
    match huge_page_size(enabled) {
        Ok(huge) => move_code_to_huge_pages(&code, huge, placing),
        Err(why) => HugeCode::refused(why),
    }
}

/// The size of a huge page of this process (2 MiB on x86-64), or why it may have none (see
/// [`system_huge_page_size`]).
fn huge_page_size(enabled: bool) -> Result<usize, HugeCodeRefused> {
    if !enabled {
        return Err(HugeCodeRefused::TurnedOff);
    }
    // SAFETY: reads a flag of this process.
    let off = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) } == 1;
    let sysfs =
        |name| std::fs::read_to_string(format!("/sys/kernel/mm/transparent_hugepage/{name}"));
    system_huge_page_size(off, sysfs("enabled").ok(), sysfs("hpage_pmd_size").ok())
}

/// The huge page size `size` (`hpage_pmd_size`), unless whoever started this process turned
/// them off for it (`off_for_this_process`: `PR_SET_THP_DISABLE`, inherited), the kernel has
/// none (no `mode` or `size`), or the system's `mode` (`enabled`) is `never`.
fn system_huge_page_size(
    off_for_this_process: bool,
    mode: Option<String>,
    size: Option<String>,
) -> Result<usize, HugeCodeRefused> {
    if off_for_this_process {
        return Err(HugeCodeRefused::OffForThisProcess);
    }
    let (Some(mode), Some(size)) = (mode, size) else {
        return Err(HugeCodeRefused::NoTransparentHugePages);
    };
    if mode.contains("[never]") {
        return Err(HugeCodeRefused::Never);
    }
    size.trim()
        .parse()
        .ok()
        .filter(|size: &usize| size.is_power_of_two() && *size >= 4096)
        .ok_or(HugeCodeRefused::SizeUnreadable)
}

/// One mapping of `/proc/self/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mapping {
    start: usize,
    end: usize,
    writable: bool,
    executable: bool,
    /// Device and inode: which file it maps (inode 0: none).
    file: (String, u64),
}

/// Moves the read-only part of the objects that hold the addresses `code` to huge pages of
/// `huge` bytes, window by window (see the [module docs](self)), or only tries each window's
/// copy ([`Placing::Trial`]): how many windows there are, how many moved, why it stopped. Call
/// it to move while the process has one thread.
fn move_code_to_huge_pages(code: &[usize], huge: usize, placing: Placing) -> HugeCode {
    let maps = match std::fs::read_to_string("/proc/self/maps") {
        Ok(maps) => parse_maps(&maps),
        Err(e) => return HugeCode::refused(HugeCodeRefused::MapsUnreadable(errno(&e))),
    };
    let mut spans: Vec<(usize, usize, Vec<Mapping>)> = Vec::new();
    for &address in code {
        let Some(span) = read_only_span(&maps, address) else {
            continue;
        };
        if !spans.iter().any(|(start, ..)| *start == span.0) {
            spans.push(span);
        }
    }
    let windows: Vec<(usize, bool)> = spans
        .iter()
        .flat_map(|(start, end, parts)| {
            let first = start.next_multiple_of(huge);
            let count = end.saturating_sub(first) / huge;
            (0..count).map(move |i| {
                let window = first + i * huge;
                let executable = parts
                    .iter()
                    .any(|m| m.executable && m.start < window + huge && m.end > window);
                (window, executable)
            })
        })
        .collect();
    let mut moved = HugeCode {
        page: huge,
        windows: windows.len(),
        moved: 0,
        refused: None,
    };
    for (window, executable) in windows {
        // SAFETY: `window..window + huge` lies in mappings of one file that are readable
        // and not writable (nothing changes their bytes while they are copied), and what
        // `move_window` puts there holds the same bytes.
        if let Err(why) = unsafe { move_window(window, huge, executable, placing) } {
            moved.refused = Some(why);
            break;
        }
        moved.moved += 1;
    }
    moved
}

/// Copies the `huge` bytes at `window` to a huge page and puts it in their place, or, in a
/// [`Placing::Trial`], drops it.
///
/// # Safety
/// `window..window + huge` must be mapped readable, and hold bytes no one writes.
unsafe fn move_window(
    window: usize,
    huge: usize,
    executable: bool,
    placing: Placing,
) -> Result<(), HugeCodeRefused> {
    let last = || errno(&io::Error::last_os_error());
    // SAFETY: every call is on anonymous memory of our own (its aligned part), or reads the
    // window the caller vouches for; a failure unmaps what was mapped here and leaves the
    // window as it was.
    unsafe {
        let raw = libc::mmap(
            ptr::null_mut(),
            2 * huge,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if raw == libc::MAP_FAILED {
            return Err(HugeCodeRefused::NoMemory(last()));
        }
        let raw = raw as usize;
        let copy = raw.next_multiple_of(huge);
        // Keep only the aligned huge page's worth.
        if copy > raw {
            libc::munmap(raw as *mut libc::c_void, copy - raw);
        }
        libc::munmap((copy + huge) as *mut libc::c_void, raw + huge - copy);
        let page = copy as *mut libc::c_void;
        let give_up = |why| {
            libc::munmap(page, huge);
            Err(why)
        };
        // The first touch then takes a huge page where the system's mode is `madvise`.
        libc::madvise(page, huge, libc::MADV_HUGEPAGE);
        ptr::copy_nonoverlapping(window as *const u8, copy as *mut u8, huge);
        // One huge page now, whatever the first touch got, or give up: small pages of a copy
        // would only cost memory.
        if libc::madvise(page, huge, MADV_COLLAPSE) != 0 {
            return give_up(HugeCodeRefused::NotAtOnce(last()));
        }
        let protection = libc::PROT_READ | if executable { libc::PROT_EXEC } else { 0 };
        if libc::mprotect(page, huge, protection) != 0 {
            return give_up(HugeCodeRefused::Protect(last()));
        }
        if placing == Placing::Trial {
            libc::munmap(page, huge);
            return Ok(());
        }
        let placed = libc::mremap(
            page,
            huge,
            huge,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            window as *mut libc::c_void,
        );
        if placed == libc::MAP_FAILED {
            return give_up(HugeCodeRefused::Place(last()));
        }
    }
    Ok(())
}

/// The errno of `error` (`EIO` if it has none).
fn errno(error: &io::Error) -> i32 {
    error.raw_os_error().unwrap_or(libc::EIO)
}

/// `MADV_COLLAPSE` (Linux 6.1): make the range one huge page now (the `libc` crate has it for
/// glibc only).
const MADV_COLLAPSE: libc::c_int = 25;

/// The mappings of `/proc/self/maps`, in address order.
fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_ascii_whitespace();
            let (start, end) = fields.next()?.split_once('-')?;
            let perms = fields.next()?.as_bytes();
            let _offset = fields.next()?;
            let device = fields.next()?;
            let inode = fields.next()?.parse().ok()?;
            Some(Mapping {
                start: usize::from_str_radix(start, 16).ok()?,
                end: usize::from_str_radix(end, 16).ok()?,
                writable: perms.get(1) == Some(&b'w'),
                executable: perms.get(2) == Some(&b'x'),
                file: (device.to_owned(), inode),
            })
        })
        .collect()
}

/// The run of adjacent, non-writable mappings of one file around `address`: its start, its
/// end and its parts.
fn read_only_span(maps: &[Mapping], address: usize) -> Option<(usize, usize, Vec<Mapping>)> {
    let at = maps
        .iter()
        .position(|m| m.start <= address && address < m.end)?;
    let this = &maps[at];
    if this.file.1 == 0 || this.writable {
        return None;
    }
    // Both sides: walking back, the mapping joined is `a`.
    let ours = |m: &Mapping| m.file == this.file && !m.writable;
    let joins = |a: &Mapping, b: &Mapping| a.end == b.start && ours(a) && ours(b);
    let mut first = at;
    while first > 0 && joins(&maps[first - 1], &maps[first]) {
        first -= 1;
    }
    let mut last = at;
    while last + 1 < maps.len() && joins(&maps[last], &maps[last + 1]) {
        last += 1;
    }
    let parts = maps[first..=last].to_vec();
    Some((maps[first].start, maps[last].end, parts))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d000400000-55d000551000 rw-p 00000000 fe:00 326603     /lib/libm.so.6
55d000551000-55d000b94000 r--p 00000000 fe:00 5308752    /work/rlm
55d000b94000-55d001c73000 r-xp 00642000 fe:00 5308752    /work/rlm
55d001c73000-55d001d2a000 r--p 01720000 fe:00 5308752    /work/rlm
55d001d2a000-55d001d32000 rw-p 017d6000 fe:00 5308752    /work/rlm
55d001d32000-55d001d40000 rw-p 00000000 00:00 0 
7f0000800000-7f00008f5000 r--p 00000000 fe:00 18714    /lib/libpython3.11.so.1.0
7f00008f5000-7f0000b31000 r-xp 000f5000 fe:00 18714    /lib/libpython3.11.so.1.0
7f0000b31000-7f0000c15000 r--p 00331000 fe:00 18714    /lib/libpython3.11.so.1.0
7f0000c44000-7f0000d78000 rw-p 00443000 fe:00 18714    /lib/libpython3.11.so.1.0
";

    /// Every one of `windows` windows of `huge` bytes moved.
    fn all_moved(huge: usize, windows: usize) -> HugeCode {
        HugeCode {
            page: huge,
            windows,
            moved: windows,
            refused: None,
        }
    }

    /// The huge page size here, or `None` (the test is skipped, saying why, except in CI).
    fn huge_pages_here() -> Option<usize> {
        match huge_page_size(true) {
            Ok(huge) => Some(huge),
            Err(why) => {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "CI runs where transparent huge pages can be had: {why}"
                );
                eprintln!("skipped: {why}");
                None
            }
        }
    }

    #[test]
    fn each_answer_of_the_system_that_keeps_huge_pages_away_is_a_reason_with_a_remedy() {
        let text = |s: &str| Some(s.to_owned());
        let mib2 = text("2097152\n");
        let check = |off, mode: &str, size: &Option<String>| {
            system_huge_page_size(off, text(mode), size.clone())
        };
        assert_eq!(check(false, "always [madvise] never\n", &mib2), Ok(2 << 20));
        assert_eq!(check(false, "[always] madvise never\n", &mib2), Ok(2 << 20));
        let never = check(false, "always madvise [never]\n", &mib2);
        assert_eq!(never, Err(HugeCodeRefused::Never));
        assert_eq!(
            check(true, "[always] madvise never\n", &mib2),
            Err(HugeCodeRefused::OffForThisProcess)
        );
        assert_eq!(
            system_huge_page_size(false, None, mib2.clone()),
            Err(HugeCodeRefused::NoTransparentHugePages)
        );
        assert_eq!(
            check(false, "[madvise]", &None),
            Err(HugeCodeRefused::NoTransparentHugePages)
        );
        for size in ["3\n", "two", "0", "512"] {
            assert_eq!(
                check(false, "[madvise]", &text(size)),
                Err(HugeCodeRefused::SizeUnreadable),
                "{size}"
            );
        }
        assert_eq!(huge_page_size(false), Err(HugeCodeRefused::TurnedOff));
        assert_eq!(
            HugeCode::refused(HugeCodeRefused::Never).to_string(),
            "none: transparent huge pages are `never` on this system"
        );
        assert!(
            HugeCodeRefused::Never.remedy().is_some_and(
                |r| r.contains("echo madvise > /sys/kernel/mm/transparent_hugepage/enabled")
            ),
            "{:?}",
            HugeCodeRefused::Never.remedy()
        );
        // What an old kernel answers, and what a busy one does.
        assert!(
            HugeCodeRefused::NotAtOnce(libc::EINVAL)
                .remedy()
                .is_some_and(|r| r.contains("6.1"))
        );
        assert!(
            HugeCodeRefused::NotAtOnce(libc::EAGAIN)
                .to_string()
                .contains("memory short or fragmented")
        );
        let partly = HugeCode {
            page: 2 << 20,
            windows: 13,
            moved: 5,
            refused: Some(HugeCodeRefused::NotAtOnce(libc::ENOMEM)),
        };
        assert!(
            partly
                .to_string()
                .starts_with("5 of 13 windows of 2 MiB, then: the kernel gave no huge page"),
            "{partly}"
        );
    }

    /// The spans of this process's code that [`own_code`] moves, as `/proc/self/maps` shows
    /// them now.
    fn own_code_spans() -> Vec<(usize, usize, Vec<Mapping>)> {
        let maps = parse_maps(&std::fs::read_to_string("/proc/self/maps").expect("maps"));
        let mut spans: Vec<_> = [
            pyo3::ffi::Py_Initialize as *const () as usize,
            own_code as *const () as usize,
        ]
        .iter()
        .filter_map(|&address| read_only_span(&maps, address))
        .collect();
        spans.dedup_by_key(|span| span.0);
        spans
    }

    /// `rlm doctor`'s question, asked in this test's process: every whole window of its code
    /// (the test binary's and `libpython`'s) gets a huge page, and none is put in the code's
    /// place: the code's mappings are the files' still.
    #[test]
    fn a_trial_finds_what_a_template_would_move_and_leaves_the_code_where_it_was() {
        let Some(huge) = huge_pages_here() else {
            return;
        };
        let before = own_code_spans();
        let windows: usize = before
            .iter()
            .map(|(start, end, _)| end.saturating_sub(start.next_multiple_of(huge)) / huge)
            .sum();
        assert!(windows >= 1, "{before:?}");

        let tried = try_huge_code();

        assert_eq!(tried, all_moved(huge, windows));
        assert_eq!(
            tried.to_string(),
            format!("{windows} of {windows} windows of 2 MiB")
        );
        assert_eq!(own_code_spans(), before, "the trial moved code");
    }

    /// Runs `probe` in a forked child of this test's process and returns what it wrote.
    fn in_a_child(probe: impl FnOnce() -> String) -> String {
        let mut fds = [0; 2];
        // SAFETY: writes two descriptors into `fds`.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child runs `probe` (no lock of another thread is needed by what the
        // probes call: `prctl`, reads of `/proc` and `/sys`, `mmap`, `madvise`), writes and
        // `_exit`s; nothing of the test harness runs in it.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            let said = probe();
            // SAFETY: our end of the pipe and a buffer alive for the call; then this child
            // ends.
            unsafe {
                libc::write(fds[1], said.as_ptr().cast(), said.len());
                libc::_exit(0);
            }
        }
        // SAFETY: the child's end; then our child's pid.
        unsafe { libc::close(fds[1]) };
        let mut said = String::new();
        // SAFETY: our end of the pipe, read to its end once the child ends.
        let mut reader = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fds[0]) };
        std::io::Read::read_to_string(&mut reader, &mut said).expect("the child's answer");
        let mut status = 0;
        // SAFETY: our child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(status, 0, "the child: {said}");
        said
    }

    /// Whoever starts `rlm` with transparent huge pages off for it (`PR_SET_THP_DISABLE`,
    /// which children inherit) has its template keep its code in the files' pages, and the
    /// doctor's trial says why; the kernel itself refuses a copy's `MADV_COLLAPSE` then, so
    /// the check before it is the system's answer, not a guess.
    #[test]
    fn with_huge_pages_off_for_the_process_the_check_and_the_kernel_refuse() {
        let Some(huge) = huge_pages_here() else {
            return;
        };
        let window = own_code_spans()
            .iter()
            .map(|(start, end, _)| (start.next_multiple_of(huge), *end))
            .find(|(first, end)| first + huge <= *end)
            .map(|(first, _)| first)
            .expect("a whole window of code");
        let said = in_a_child(|| {
            // SAFETY: a flag of this (child) process.
            let off = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
            let tried = try_huge_code();
            let moved = move_own_code(true);
            // SAFETY: the code's window is mapped readable and never written.
            let copied = unsafe { move_window(window, huge, true, Placing::Trial) };
            format!("{off} | {tried} | {moved:?} | {copied:?}")
        });
        let off = HugeCode::refused(HugeCodeRefused::OffForThisProcess);
        assert_eq!(
            said,
            format!(
                "0 | {off} | {off:?} | {:?}",
                Err::<(), _>(HugeCodeRefused::NotAtOnce(libc::EINVAL))
            )
        );
        assert!(off.to_string().contains("PR_SET_THP_DISABLE"), "{off}");
    }

    #[test]
    fn a_span_is_the_read_only_mappings_of_one_file_around_the_address() {
        let maps = parse_maps(MAPS);
        let (start, end, parts) = read_only_span(&maps, 0x55d000c00000).expect("span");
        assert_eq!((start, end), (0x55d000551000, 0x55d001d2a000));
        assert_eq!(parts.len(), 3);
        // A gap ends a span; so does a writable mapping.
        let (start, end, _) = read_only_span(&maps, 0x7f0000900000).expect("span");
        assert_eq!((start, end), (0x7f0000800000, 0x7f0000c15000));
        // Anonymous or writable memory is no code to move.
        assert_eq!(read_only_span(&maps, 0x55d001d33000), None);
        assert_eq!(read_only_span(&maps, 0x7f0000c50000), None);
        assert_eq!(read_only_span(&maps, 0x10), None);
        // Another library's writable data that ends where the code starts is no part of it
        // (a test's maps had `libm`'s end where `libpython`'s start). A window there would have
        // made that data read-only.
        assert_eq!(read_only_span(&maps, 0x55d000400000), None);
    }

    /// The entry of `/proc/self/smaps` for the mapping that starts at `start`: its line and
    /// the lines of its fields.
    fn smaps_entry(smaps: &str, start: usize) -> Option<String> {
        let head = format!("{start:x}-");
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&head));
        let first = lines.next()?;
        let is_head = |l: &str| {
            l.split_once(' ').is_some_and(|(range, _)| {
                range.contains('-') && range.chars().all(|c| c == '-' || c.is_ascii_hexdigit())
            })
        };
        let fields: Vec<&str> = lines.take_while(|l| !is_head(l)).collect();
        Some(format!("{first}\n{}", fields.join("\n")))
    }

    /// The real thing, in this test's process (its own, under nextest): each whole window of
    /// the test binary's code becomes one anonymous huge page holding the same bytes, and the
    /// code in it goes on running.
    #[test]
    fn code_moved_to_huge_pages_keeps_its_bytes_and_runs() {
        let Some(huge) = huge_pages_here() else {
            return;
        };
        let functions = [
            parse_maps as *const () as usize,
            read_only_span as *const () as usize,
            smaps_entry as *const () as usize,
            move_window as *const () as usize,
        ];
        let maps = parse_maps(&std::fs::read_to_string("/proc/self/maps").expect("maps"));
        let (start, end, parts) = read_only_span(&maps, functions[0]).expect("this test's code");
        let first = start.next_multiple_of(huge);
        let windows = end.saturating_sub(first) / huge;
        assert!(
            windows >= 1,
            "the test binary's code spans a whole window: {parts:?}"
        );
        // SAFETY: mapped, read-only code and data of this binary.
        let code = || unsafe { std::slice::from_raw_parts(first as *const u8, windows * huge) };
        let before = code().to_vec();

        let moved = move_code_to_huge_pages(&functions, huge, Placing::Move);

        assert_eq!(moved, all_moved(huge, windows));
        assert!(
            code() == before.as_slice(),
            "the moved code's bytes changed"
        );
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
        for window in (0..windows).map(|i| first + i * huge) {
            let entry = smaps_entry(&smaps, window)
                .unwrap_or_else(|| panic!("no mapping starts at {window:x}:\n{smaps}"));
            let head = entry.lines().next().unwrap_or_default();
            assert!(head.contains(" 00:00 0"), "anonymous now: {entry}");
            let huge_kib = entry
                .lines()
                .find_map(|l| l.strip_prefix("AnonHugePages:"))
                .and_then(|v| v.trim().strip_suffix(" kB")?.parse::<usize>().ok());
            assert_eq!(huge_kib, Some(huge >> 10), "one huge page: {entry}");
            let code_here = parts
                .iter()
                .any(|m| m.executable && m.start < window + huge && m.end > window);
            assert_eq!(
                head.contains(" r-xp "),
                code_here,
                "executable where code was: {entry}"
            );
            assert!(!head.contains(" rw"), "never writable: {entry}");
        }
        // Code that now runs from a huge page (one of these, at least, lies in a window).
        assert!(
            functions
                .iter()
                .any(|&f| f >= first && f < first + windows * huge)
        );
        assert_eq!(parse_maps(MAPS).len(), 10);
        assert!(smaps_entry(&smaps, first).is_some());
    }
}
