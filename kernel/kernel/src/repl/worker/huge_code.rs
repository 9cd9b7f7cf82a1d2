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
//! - **What it changes for tools.** `/proc/<pid>/maps` shows the windows as anonymous memory,
//!   so a profiler that symbolises by mapping (`perf`) does not name the functions in them; the
//!   C library's list of objects (`dl_iterate_phdr`: backtraces, `gdb`) is unchanged.

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

/// Why nothing (more) was moved.
pub(crate) type Refused = &'static str;

/// Moves this process's code, the interpreter's and its own, to huge pages unless the system
/// says no (see the [module docs](self)): how many windows it moved, or why it stopped (the
/// windows moved before stay so). The template calls it before its interpreter starts, while
/// it has one thread.
pub(crate) fn move_own_code() -> Result<usize, Refused> {
    let huge = huge_page_size()?;
    let code = [
        pyo3::ffi::Py_Initialize as *const () as usize,
        move_own_code as *const () as usize,
    ];
    move_code_to_huge_pages(&code, huge)
}

/// The size of a huge page of this process (2 MiB on x86-64), or why it may have none: the
/// kernel has none, the system's mode is `never`, or whoever started it turned them off for it
/// (`PR_SET_THP_DISABLE`, inherited).
fn huge_page_size() -> Result<usize, Refused> {
    // SAFETY: reads a flag of this process.
    if unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) } == 1 {
        return Err("transparent huge pages are off for this process (PR_SET_THP_DISABLE)");
    }
    let sysfs =
        |name| std::fs::read_to_string(format!("/sys/kernel/mm/transparent_hugepage/{name}"));
    let (Ok(mode), Ok(size)) = (sysfs("enabled"), sysfs("hpage_pmd_size")) else {
        return Err("this kernel has no transparent huge pages");
    };
    if mode.contains("[never]") {
        return Err("transparent huge pages are off (`never`)");
    }
    size.trim()
        .parse()
        .ok()
        .filter(|size: &usize| size.is_power_of_two())
        .ok_or("the kernel's huge page size is unreadable")
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
/// `huge` bytes, window by window (see the [module docs](self)): how many windows it moved, or
/// why it stopped. Call it while the process has one thread.
fn move_code_to_huge_pages(code: &[usize], huge: usize) -> Result<usize, Refused> {
    let maps =
        std::fs::read_to_string("/proc/self/maps").map_err(|_| "/proc/self/maps cannot be read")?;
    let maps = parse_maps(&maps);
    let mut spans: Vec<(usize, usize, Vec<Mapping>)> = Vec::new();
    for &address in code {
        let Some(span) = read_only_span(&maps, address) else {
            continue;
        };
        if !spans.iter().any(|(start, ..)| *start == span.0) {
            spans.push(span);
        }
    }
    let mut moved = 0;
    for (start, end, parts) in spans {
        let mut window = start.next_multiple_of(huge);
        while window + huge <= end {
            let executable = parts
                .iter()
                .any(|m| m.executable && m.start < window + huge && m.end > window);
            // SAFETY: `window..window + huge` lies in mappings of one file that are readable
            // and not writable (nothing changes their bytes while they are copied), and what
            // `move_window` puts there holds the same bytes.
            unsafe { move_window(window, huge, executable) }?;
            moved += 1;
            window += huge;
        }
    }
    Ok(moved)
}

/// Copies the `huge` bytes at `window` to a huge page and puts it in their place.
///
/// # Safety
/// `window..window + huge` must be mapped readable, and hold bytes no one writes.
unsafe fn move_window(window: usize, huge: usize, executable: bool) -> Result<(), Refused> {
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
            return Err("no memory to copy the code to");
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
            return give_up("the kernel gave no huge page at once (memory fragmented?)");
        }
        let protection = libc::PROT_READ | if executable { libc::PROT_EXEC } else { 0 };
        if libc::mprotect(page, huge, protection) != 0 {
            return give_up("mprotect of the copy failed");
        }
        let placed = libc::mremap(
            page,
            huge,
            huge,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            window as *mut libc::c_void,
        );
        if placed == libc::MAP_FAILED {
            return give_up("mremap of the copy over the code failed");
        }
    }
    Ok(())
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
        let huge = match huge_page_size() {
            Ok(huge) => huge,
            Err(why) => {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "CI runs where transparent huge pages can be had: {why}"
                );
                eprintln!("skipped: {why}");
                return;
            }
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

        let moved = move_code_to_huge_pages(&functions, huge);

        assert_eq!(moved, Ok(windows));
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
