//! What a context file is, from its first bytes first and its extension second.
//!
//! 1. Compression by magic number: gzip and zstd streams are read through a decoder
//!    (`.csv.gz`, `.jsonl.zst`, even a compressed file without the suffix); the suffix is
//!    dropped before the extension is read.
//! 2. The first [`HEAD`] bytes of the (decompressed) content: Parquet, Arrow IPC and Excel
//!    workbooks are tables whatever their name; images, PDFs, archives, databases, programs
//!    and other binaries cannot be a context and get advice that fits ([`BinaryKind`]).
//! 3. Otherwise the extension picks the text format: JSON, JSON lines, CSV/TSV, NDJSON, text.
//!
//! A text format whose head holds NUL bytes is binary unless an encoding was named (UTF-16
//! text has NULs). Decompression runs again for each pass over the data (the text loader
//! reads twice to avoid a second copy): CPU for memory.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use super::error::ReplError;
use super::metadata::{BinaryKind, Compression};

/// Bytes looked at to recognise a file and sniff a CSV separator.
const HEAD: usize = 16 * 1024;

/// How a file will be loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileFormat {
    Text,
    Json,
    JsonLines,
    Table(TableFormat),
}

/// Formats read by polars.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TableFormat {
    Csv,
    Tsv,
    Parquet,
    Ipc,
    NdJson,
    Excel,
}

impl TableFormat {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Csv => "CSV",
            Self::Tsv => "TSV",
            Self::Parquet => "Parquet",
            Self::Ipc => "Arrow IPC",
            Self::NdJson => "newline-delimited JSON",
            Self::Excel => "Excel",
        }
    }
}

/// What [`detect`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Detected {
    pub(crate) compression: Option<Compression>,
    pub(crate) format: FileFormat,
    /// Nothing in it once decompressed.
    pub(crate) empty: bool,
    /// The first bytes of the decompressed content (for sniffing a CSV separator).
    pub(crate) head: Vec<u8>,
}

/// A reader over the content of `path`, decompressed.
pub(crate) fn open_decoded(
    path: &Path,
    compression: Option<Compression>,
) -> std::io::Result<Box<dyn Read>> {
    let file = File::open(path)?;
    Ok(match compression {
        None => Box::new(file),
        Some(Compression::Gzip) => {
            Box::new(flate2::read::MultiGzDecoder::new(BufReader::new(file)))
        }
        Some(Compression::Zstd) => Box::new(zstd::stream::read::Decoder::new(file)?),
    })
}

/// An I/O error while reading `path` through `compression`, as the user should see it: a
/// decoder's complaint means a corrupt or truncated file, not a missing one.
pub(crate) fn read_error(
    path: &Path,
    compression: Option<Compression>,
    source: std::io::Error,
) -> ReplError {
    use std::io::ErrorKind::{InvalidData, InvalidInput, Other, UnexpectedEof};
    match compression {
        Some(c)
            if matches!(
                source.kind(),
                InvalidData | InvalidInput | UnexpectedEof | Other
            ) =>
        {
            ReplError::ContextMalformed {
                path: path.to_owned(),
                format: c.label(),
                detail: source.to_string(),
                fix: "the file is corrupt or cut short; compress or download it again".to_owned(),
            }
        }
        _ => ReplError::ContextRead {
            path: path.to_owned(),
            error: source,
        },
    }
}

/// Recognises the file at `path` (see the module docs). `encoding_named`: the user named a
/// text encoding, so NUL bytes do not make a text format binary.
pub(crate) fn detect(path: &Path, encoding_named: bool) -> Result<Detected, ReplError> {
    let raw = read_head(path, None)?;
    let compression = if raw.starts_with(&[0x1f, 0x8b]) {
        Some(Compression::Gzip)
    } else if raw.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Some(Compression::Zstd)
    } else {
        None
    };
    let head = match compression {
        None => raw,
        Some(_) => read_head(path, compression)?,
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    let name = match compression {
        Some(_) => [".gz", ".gzip", ".zst", ".zstd"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(&name),
        None => &name,
    };
    let ext = Path::new(name)
        .extension()
        .map(|e| e.to_string_lossy().into_owned())
        .unwrap_or_default();
    let by_extension = format_of_extension(&ext);
    let format = match magic(&head, &ext) {
        Some(Magic::Table(format)) => FileFormat::Table(format),
        Some(Magic::Binary(kind)) => {
            return Err(ReplError::ContextBinary {
                path: path.to_owned(),
                kind,
            });
        }
        None => {
            let text_format = !matches!(
                by_extension,
                FileFormat::Table(TableFormat::Parquet | TableFormat::Ipc | TableFormat::Excel)
            );
            if text_format && !encoding_named && head.contains(&0) {
                let utf16 = head.starts_with(&[0xff, 0xfe]) || head.starts_with(&[0xfe, 0xff]);
                return Err(ReplError::ContextBinary {
                    path: path.to_owned(),
                    kind: if utf16 {
                        BinaryKind::Utf16
                    } else {
                        BinaryKind::Other
                    },
                });
            }
            by_extension
        }
    };
    Ok(Detected {
        compression,
        format,
        empty: head.is_empty(),
        head,
    })
}

/// What a content of a known `format` held in memory is (never compressed): what [`detect`]
/// finds of a file of that format.
pub(crate) fn in_memory(format: FileFormat, bytes: &[u8]) -> Detected {
    Detected {
        compression: None,
        format,
        empty: bytes.is_empty(),
        head: bytes[..bytes.len().min(HEAD)].to_vec(),
    }
}

fn read_head(path: &Path, compression: Option<Compression>) -> Result<Vec<u8>, ReplError> {
    let mut head = Vec::with_capacity(HEAD);
    open_decoded(path, compression)
        .and_then(|r| r.take(HEAD as u64).read_to_end(&mut head))
        .map_err(|e| read_error(path, compression, e))?;
    Ok(head)
}

fn format_of_extension(ext: &str) -> FileFormat {
    match ext {
        "json" => FileFormat::Json,
        "jsonl" => FileFormat::JsonLines,
        "csv" => FileFormat::Table(TableFormat::Csv),
        "tsv" | "tab" => FileFormat::Table(TableFormat::Tsv),
        "parquet" | "pq" => FileFormat::Table(TableFormat::Parquet),
        "arrow" | "ipc" | "feather" => FileFormat::Table(TableFormat::Ipc),
        "ndjson" => FileFormat::Table(TableFormat::NdJson),
        "xlsx" | "xlsm" | "xlsb" | "xls" | "ods" => FileFormat::Table(TableFormat::Excel),
        _ => FileFormat::Text,
    }
}

enum Magic {
    Table(TableFormat),
    Binary(BinaryKind),
}

/// The kind a head's magic number names, if any. `ext` tells spreadsheets from other zip and
/// OLE2 files when the head alone cannot.
fn magic(head: &[u8], ext: &str) -> Option<Magic> {
    let at = |offset: usize, magic: &[u8]| head.get(offset..).is_some_and(|h| h.starts_with(magic));
    let spreadsheet_ext = matches!(ext, "xlsx" | "xlsm" | "xlsb" | "xls" | "ods");
    let binary = |kind| Some(Magic::Binary(kind));
    if at(0, b"PAR1") {
        return Some(Magic::Table(TableFormat::Parquet));
    }
    if at(0, b"ARROW1") {
        return Some(Magic::Table(TableFormat::Ipc));
    }
    if at(0, b"PK\x03\x04") || at(0, b"PK\x05\x06") || at(0, b"PK\x07\x08") {
        // An xlsx names its parts (`xl/workbook.xml`, …) in the first local headers.
        let is_xlsx = head.windows(3).any(|w| w == b"xl/");
        let is_ods = head.windows(11).any(|w| w == b"opendocumen")
            && head.windows(11).any(|w| w == b"spreadsheet");
        return if spreadsheet_ext || is_xlsx || is_ods {
            Some(Magic::Table(TableFormat::Excel))
        } else {
            binary(BinaryKind::Zip)
        };
    }
    if at(0, &[0xd0, 0xcf, 0x11, 0xe0, 0xa1, 0xb1, 0x1a, 0xe1]) {
        return if spreadsheet_ext {
            Some(Magic::Table(TableFormat::Excel))
        } else {
            binary(BinaryKind::LegacyOffice)
        };
    }
    let kinds: &[(usize, &[u8], BinaryKind)] = &[
        (0, b"\x89PNG\r\n\x1a\n", BinaryKind::Png),
        (0, b"\xff\xd8\xff", BinaryKind::Jpeg),
        (0, b"GIF87a", BinaryKind::Gif),
        (0, b"GIF89a", BinaryKind::Gif),
        (0, b"II*\x00", BinaryKind::Tiff),
        (0, b"MM\x00*", BinaryKind::Tiff),
        (0, b"%PDF-", BinaryKind::Pdf),
        (257, b"ustar", BinaryKind::Tar),
        (0, b"\xfd7zXZ\x00", BinaryKind::OtherCompression),
        (0, b"7z\xbc\xaf\x27\x1c", BinaryKind::SevenZip),
        (0, b"SQLite format 3\x00", BinaryKind::Sqlite),
        (0, b"\x7fELF", BinaryKind::Executable),
        (0, b"\xcf\xfa\xed\xfe", BinaryKind::Executable),
        (0, b"\xfe\xed\xfa\xcf", BinaryKind::Executable),
        (0, b"OggS", BinaryKind::Media),
        (0, b"fLaC", BinaryKind::Media),
        (0, b"ID3", BinaryKind::Media),
        (4, b"ftyp", BinaryKind::Media),
    ];
    if let Some((_, _, kind)) = kinds.iter().find(|(offset, m, _)| at(*offset, m)) {
        return binary(*kind);
    }
    if at(0, b"RIFF") && at(8, b"WEBP") {
        return binary(BinaryKind::Webp);
    }
    if at(0, b"RIFF") && (at(8, b"WAVE") || at(8, b"AVI ")) {
        return binary(BinaryKind::Media);
    }
    // `BZh` + block size + the block magic (pi), so that a text starting "BZh" stays text.
    if at(0, b"BZh") && head.get(3).is_some_and(u8::is_ascii_digit) && at(4, b"1AY&SY") {
        return binary(BinaryKind::OtherCompression);
    }
    None
}

/// The CSV field separator of `head`: of `,` `;` tab `|`, the one found the same number of
/// times (outside quotes) on every complete line, the most often; `,` when none is.
pub(crate) fn sniff_separator(head: &[u8]) -> u8 {
    const CANDIDATES: [u8; 4] = [b',', b'\t', b';', b'|'];
    const LINES: usize = 50;
    let complete = match head.iter().rposition(|&b| b == b'\n') {
        Some(end) if head.len() == HEAD => &head[..end],
        _ => head,
    };
    let lines: Vec<&[u8]> = complete
        .split(|&b| b == b'\n')
        .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
        .take(LINES)
        .collect();
    let count = |line: &[u8], sep: u8| {
        let mut quoted = false;
        line.iter()
            .filter(|&&b| {
                if b == b'"' {
                    quoted = !quoted;
                }
                !quoted && b == sep
            })
            .count()
    };
    let mut best: Option<(u8, usize)> = None;
    for sep in CANDIDATES {
        let Some(first) = lines.first().map(|l| count(l, sep)) else {
            break;
        };
        if first == 0 || lines.iter().any(|l| count(l, sep) != first) {
            continue;
        }
        if best.is_none_or(|(_, n)| first > n) {
            best = Some((sep, first));
        }
    }
    best.map_or(b',', |(sep, _)| sep)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind_of(head: &[u8], ext: &str) -> Option<BinaryKind> {
        match magic(head, ext) {
            Some(Magic::Binary(kind)) => Some(kind),
            _ => None,
        }
    }

    #[test]
    fn magic_numbers_name_binaries_and_tables() {
        assert_eq!(
            kind_of(b"\x89PNG\r\n\x1a\n\0\0", "txt"),
            Some(BinaryKind::Png)
        );
        assert_eq!(kind_of(b"\xff\xd8\xff\xe0", ""), Some(BinaryKind::Jpeg));
        assert_eq!(kind_of(b"%PDF-1.7\n", "csv"), Some(BinaryKind::Pdf));
        assert_eq!(kind_of(b"PK\x03\x04rest", "zip"), Some(BinaryKind::Zip));
        assert_eq!(kind_of(b"RIFF\0\0\0\0WEBPVP8", ""), Some(BinaryKind::Webp));
        assert_eq!(
            kind_of(b"BZh91AY&SY", ""),
            Some(BinaryKind::OtherCompression)
        );
        assert_eq!(kind_of(b"BZh is a word", "txt"), None);
        assert_eq!(kind_of(b"plain text", "txt"), None);
        assert!(matches!(
            magic(b"PK\x03\x04..[Content_Types].xml..xl/workbook.xml", "bin"),
            Some(Magic::Table(TableFormat::Excel))
        ));
        assert!(matches!(
            magic(b"PK\x03\x04docProps", "xlsx"),
            Some(Magic::Table(TableFormat::Excel))
        ));
        assert!(matches!(
            magic(b"PAR1\x15\x04", "dat"),
            Some(Magic::Table(TableFormat::Parquet))
        ));
        assert!(matches!(
            magic(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "doc"),
            Some(Magic::Binary(BinaryKind::LegacyOffice))
        ));
    }

    #[test]
    fn separators_are_sniffed_from_consistent_counts() {
        assert_eq!(sniff_separator(b"a,b,c\n1,2,3\n"), b',');
        assert_eq!(sniff_separator(b"a;b;c\n1,5;2;3\n"), b';');
        assert_eq!(sniff_separator(b"a\tb\n1\t2\n"), b'\t');
        assert_eq!(sniff_separator(b"a|b\n1|2\n"), b'|');
        // Quoted separators do not count.
        assert_eq!(sniff_separator(b"name;note\nx;\"a, b, c\"\n"), b';');
        assert_eq!(sniff_separator(b"one column\nvalue\n"), b',');
        assert_eq!(sniff_separator(b""), b',');
    }

    #[test]
    fn extensions_pick_text_formats() {
        assert_eq!(format_of_extension("json"), FileFormat::Json);
        assert_eq!(
            format_of_extension("csv"),
            FileFormat::Table(TableFormat::Csv)
        );
        assert_eq!(format_of_extension(""), FileFormat::Text);
        assert_eq!(
            format_of_extension("xlsx"),
            FileFormat::Table(TableFormat::Excel)
        );
    }
}
