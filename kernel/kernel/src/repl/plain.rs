//! Which blocks compile as they are: [`is_plain`] reads a block's source, without Python, for
//! what the support module's `compile_block` would change in its tree or record from it.
//!
//! `compile_block` parses a block into Python's `ast` objects, records its top-level
//! definitions (imports, functions, classes, named lambdas: what a spawn worker re-creates),
//! turns a top-level `name = lambda ...` into a `def`, makes `__name__ == "__main__"` hold,
//! splits off a final bare expression to show its value, and compiles the tree. A block with
//! none of these compiles the same from its source with the built-in `compile`: one parse
//! and no `ast` objects made and read back. In a worker that waited idle for its child's
//! model, whose first block runs on cold caches, that walk through the `ast` objects was
//! most of a two-line block's compile (in the bench guide). Errors and warnings are the
//! parser's and compiler's own either way (the same passes over the same text), given once.
//!
//! Plain, conservatively, is: ASCII (a non-ASCII identifier may normalise to a name that
//! matters); no `import`, `def`, `class` or `lambda` word and no `__name__` anywhere (not
//! even in strings or comments); and the last top-level statement is certainly not a bare
//! expression: a compound statement, a simple statement led by a keyword, or an assignment
//! (a `=`, augmented or annotated, outside brackets). Anything unclear (a `;` in the last
//! statement, a bracket or string left open, a continuation the reader does not follow, an
//! f-string whose fields hold quotes, backslashes, `#` or line breaks, which Python 3.12
//! reads differently from 3.11) is not plain: `compile_block` takes it, as before.

/// Hard keywords that start a statement which is not an expression statement.
const STATEMENT_KEYWORDS: [&str; 19] = [
    "if", "elif", "else", "for", "while", "with", "try", "except", "finally", "async", "del",
    "pass", "break", "continue", "return", "raise", "global", "nonlocal", "assert",
];

/// Of [`STATEMENT_KEYWORDS`], those of simple statements: a `;` after one may start a bare
/// expression statement of its own.
const SIMPLE_KEYWORDS: [&str; 9] = [
    "del", "pass", "break", "continue", "return", "raise", "global", "nonlocal", "assert",
];

/// Words whose presence may make `compile_block` change or record something.
const RESERVED_WORDS: [&str; 4] = ["import", "def", "class", "lambda"];

/// Whether `source` compiles as it is (see the [module docs](self)).
pub(crate) fn is_plain(source: &str) -> bool {
    if !source.is_ascii()
        || source.contains("__name__")
        || source.bytes().any(|b| matches!(b, b'\r' | b'\x0c' | b'\0'))
        || RESERVED_WORDS.iter().any(|w| has_word(source, w))
    {
        return false;
    }
    match last_statement(source.as_bytes()) {
        None => false,
        Some(None) => true,
        Some(Some(last)) => last.is_not_an_expression(source),
    }
}

/// Whether `word` occurs in `source` as a whole identifier.
fn has_word(source: &str, word: &str) -> bool {
    let bytes = source.as_bytes();
    source.match_indices(word).any(|(at, _)| {
        let before = at.checked_sub(1).map(|i| bytes[i]);
        let after = bytes.get(at + word.len()).copied();
        !before.is_some_and(is_identifier_byte) && !after.is_some_and(is_identifier_byte)
    })
}

fn is_identifier_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The last top-level statement as the reader saw it.
#[derive(Debug, Default, Clone, Copy)]
struct Statement {
    /// Where it starts (column 0).
    start: usize,
    /// A `=` of an assignment outside brackets.
    assigns: bool,
    /// A `;` outside brackets.
    semicolon: bool,
}

impl Statement {
    fn is_not_an_expression(&self, source: &str) -> bool {
        let text = &source[self.start..];
        let word_end = text
            .bytes()
            .position(|b| !is_identifier_byte(b))
            .unwrap_or(text.len());
        let word = &text[..word_end];
        if STATEMENT_KEYWORDS.contains(&word) {
            return !(self.semicolon && SIMPLE_KEYWORDS.contains(&word));
        }
        self.assigns && !self.semicolon
    }
}

/// Reads `source` as Python's tokenizer splits it into statements: `None` when it cannot
/// tell (see the [module docs](self)), else the last top-level statement (`None`: there is
/// none, only blank lines and comments).
fn last_statement(source: &[u8]) -> Option<Option<Statement>> {
    let mut last: Option<Statement> = None;
    let mut depth = 0usize;
    let mut line_start = true;
    let mut i = 0;
    while i < source.len() {
        let b = source[i];
        if line_start {
            line_start = false;
            if depth == 0 && !matches!(b, b' ' | b'\t' | b'\n' | b'#') {
                last = Some(Statement {
                    start: i,
                    ..Statement::default()
                });
            }
        }
        match b {
            b'#' => {
                while i < source.len() && source[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'\n' => line_start = depth == 0,
            b'\\' => {
                // A line continuation; a backslash anywhere else outside a string is an error.
                if source.get(i + 1) != Some(&b'\n') {
                    return None;
                }
                i += 2;
                continue;
            }
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth = depth.checked_sub(1)?,
            b'\'' | b'"' => {
                i = string_end(source, i)?;
                continue;
            }
            b';' if depth == 0 => last.as_mut()?.semicolon = true,
            b'=' if depth == 0 && is_assignment(source, i) => last.as_mut()?.assigns = true,
            _ => {}
        }
        i += 1;
    }
    (depth == 0).then_some(last)
}

/// Whether the `=` at `at` (outside brackets) assigns: not `==`, `!=`, `<=`, `>=` or `:=`,
/// but `<<=` and `>>=` do.
fn is_assignment(source: &[u8], at: usize) -> bool {
    let before = |n: usize| at.checked_sub(n).map(|i| source[i]);
    if source.get(at + 1) == Some(&b'=') || before(1) == Some(b'=') {
        return false;
    }
    match before(1) {
        Some(b'!' | b':') => false,
        Some(c @ (b'<' | b'>')) => before(2) == Some(c),
        _ => true,
    }
}

/// The index just past the string literal whose opening quote is at `quote`, or `None` when
/// it is not closed or not read with certainty (see the [module docs](self)).
fn string_end(source: &[u8], quote: usize) -> Option<usize> {
    let mut prefix_start = quote;
    while prefix_start > 0 && is_identifier_byte(source[prefix_start - 1]) {
        prefix_start -= 1;
    }
    let prefix = source[prefix_start..quote].to_ascii_lowercase();
    if !matches!(
        &prefix[..],
        b"" | b"r" | b"u" | b"b" | b"f" | b"br" | b"rb" | b"fr" | b"rf"
    ) {
        // An identifier touching a quote: a syntax error, reported by the parser.
        return None;
    }
    let formatted = prefix.contains(&b'f');
    let q = source[quote];
    let triple = source.get(quote + 1) == Some(&q) && source.get(quote + 2) == Some(&q);
    let mut i = quote + if triple { 3 } else { 1 };
    let mut field = 0usize;
    while i < source.len() {
        let b = source[i];
        if field > 0 && matches!(b, b'\'' | b'"' | b'\\' | b'#' | b'\n') {
            return None;
        }
        match b {
            b'\\' => {
                // Escapes the next character, in a raw string too (for the tokenizer).
                i += 2;
                continue;
            }
            b'\n' if !triple => return None,
            _ if b == q => {
                if !triple {
                    return Some(i + 1);
                }
                if source.get(i + 1) == Some(&q) && source.get(i + 2) == Some(&q) {
                    return Some(i + 3);
                }
            }
            b'{' if formatted => {
                if field == 0 && source.get(i + 1) == Some(&b'{') {
                    i += 2;
                    continue;
                }
                field += 1;
            }
            b'}' if formatted && field > 0 => field -= 1,
            _ => {}
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignments_and_statements_last_are_plain() {
        for source in [
            "answer['content'] = 'ok'\nanswer['ready'] = True",
            "x = 1\n",
            "x += 1",
            "x >>= 2",
            "x: int = 3",
            "a, b = b, a",
            "x = (1,\n     2)\n# a comment\n\n",
            "for i in range(3):\n    print(i)\n",
            "if x:\n    y\nelse:\n    z\n",
            "try:\n    f()\nexcept E:\n    pass\n",
            "with open(p) as f:\n    data = f.read()",
            "print(1)\ndel x",
            "x = 1 if y else 2",
            "s = f'{x} and {y!r:>10}'",
            "s = f'{{literal}}'",
            "s = '''a\nb''' + \"c\\\"d\"",
            "s = r'\\d+'",
            "total = \\\n    1 + 2",
            "",
            "# only a comment\n",
            "d = {'a': 1}\nd['b'] = d.get('a') == 1",
        ] {
            assert!(is_plain(source), "{source:?} should be plain");
        }
    }

    #[test]
    fn a_bare_expression_last_or_anything_unclear_is_not() {
        for source in [
            // A bare expression last (its value is shown).
            "x = 1\nx",
            "x = 1\nprint(x)",
            "x == 1",
            "x = 1\n42",
            "x = 1\n'text'",
            "x = 1\n(y := 2)",
            "x != 1",
            "x <= 1",
            "f(a=1)",
            "x[1] >= 2",
            "match(x)",
            "await f()",
            "yield x",
            // A `;` may end with one.
            "x = 1; x",
            "pass; x",
            // What compile_block changes or records.
            "import os\nx = 1",
            "from os import path\nx = 1",
            "def f():\n    return 1\nx = f()",
            "async def f():\n    pass\nx = 1",
            "class A:\n    pass\nx = A()",
            "f = lambda: 1",
            "if __name__ == '__main__':\n    x = 1",
            "x = 'import'",
            // Non-ASCII (identifiers normalise), carriage returns, form feeds, NULs.
            "x = 'é'",
            "x = 1\r\ny = 2",
            "\x0cx = 1",
            "x = 1\0",
            // Open brackets or strings, stray backslashes, prefixes glued to names.
            "x = (1,",
            "x = 'open",
            "x = '''open",
            "x = 1 \\ 2",
            "x = ab'c'",
            "x = 1)",
            // f-string fields Python 3.12 reads differently.
            "s = f'{d[\"k\"]}'",
            "s = f'{x!r}\\n{\"a\"}'",
            "s = f'{x # c\n}'",
        ] {
            assert!(!is_plain(source), "{source:?} should not be plain");
        }
    }

    #[test]
    fn words_are_whole_identifiers() {
        assert!(is_plain("default = 1\nclassify = define = imported = 2"));
        assert!(!is_plain(
            "x = 1 if y else lambda_(2)\nlambda_ = 1\nlambda x: x"
        ));
        assert!(has_word("a.def b", "def"));
        assert!(!has_word("undef_x", "def"));
    }
}
