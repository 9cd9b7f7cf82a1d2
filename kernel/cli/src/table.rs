//! Text laid out in columns on a terminal: the tables of `rlm flow runs` and `history`,
//! `rlm eval` and `rlm bench`, and the live agent tree of `rlm flow run`.
//!
//! A column is as wide as the widest of its cells *on the terminal*: [`width`] counts
//! columns, not characters — two for a wide character (CJK, most emoji), none for a
//! combining mark — so a cell holding an agent's, task's or workflow's name in any script
//! still lines up. [`pad`] pads one cell to a width; [`render`] lays out a whole table.
//!
//! ```text
//! RUN  STATUS   WORKFLOW
//! a1   done     研究
//! b2   running  café
//! ```

use unicode_width::UnicodeWidthStr;

/// Which side of its column a cell keeps to: text to the left, numbers to the right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Align {
    Left,
    Right,
}

/// The columns `text` takes on a terminal.
pub(crate) fn width(text: &str) -> usize {
    text.width()
}

/// `text` with spaces on the side `align` leaves free, to `columns` columns (never cut).
pub(crate) fn pad(text: &str, columns: usize, align: Align) -> String {
    let fill = " ".repeat(columns.saturating_sub(width(text)));
    match align {
        Align::Left => format!("{text}{fill}"),
        Align::Right => format!("{fill}{text}"),
    }
}

/// `header` over `rows`, columns two spaces apart, each as wide as its widest cell and
/// aligned as `align` says for its index; no line ends in a space.
pub(crate) fn render<R: AsRef<[String]>>(
    header: &[&str],
    rows: &[R],
    align: impl Fn(usize) -> Align,
) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| width(h)).collect();
    for row in rows {
        for (columns, cell) in widths.iter_mut().zip(row.as_ref()) {
            *columns = (*columns).max(width(cell));
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let text: Vec<String> = cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (cell, columns))| pad(cell, *columns, align(i)))
            .collect();
        out.push_str(text.join("  ").trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.as_ref().iter().map(String::as_str).collect());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_characters_take_two_columns_and_combining_marks_none() {
        assert_eq!(width("abc"), 3);
        assert_eq!(width("研究"), 4);
        assert_eq!(width("🚀"), 2);
        // `e` and U+0301 COMBINING ACUTE ACCENT: two characters, one column.
        assert_eq!(width("cafe\u{301}"), 4);
        assert_eq!(pad("研究", 6, Align::Left), "研究  ");
        assert_eq!(pad("研究", 6, Align::Right), "  研究");
        assert_eq!(pad("研究者たち", 6, Align::Left), "研究者たち");
    }

    #[test]
    fn columns_line_up_whatever_the_script() {
        let rows: Vec<Vec<String>> = [
            ["a1", "研究", "3"],
            ["b2", "cafe\u{301} au lait", "12"],
            ["c3", "🚀 launch", "7"],
            ["d4", "plain", "100"],
        ]
        .iter()
        .map(|row| row.iter().map(|cell| (*cell).to_owned()).collect())
        .collect();
        let text = render(&["ID", "NAME", "N"], &rows, |i| {
            if i == 2 { Align::Right } else { Align::Left }
        });
        // The last column is right-aligned, so every line ends at the same terminal column
        // (counted in characters, the lines with `研究`, `é` and `🚀` would not); measured
        // here without `width`, which is what is tested.
        let widths: Vec<usize> = text.lines().map(UnicodeWidthStr::width).collect();
        assert!(widths.iter().all(|w| *w == widths[0]), "{widths:?}\n{text}");
        insta::assert_snapshot!(text);
    }
}
