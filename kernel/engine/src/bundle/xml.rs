//! A small element tree over `quick-xml`, with the line each element starts on, for the
//! `<agent>` block of an agent file.

use quick_xml::Reader;
use quick_xml::XmlVersion;
use quick_xml::escape::resolve_predefined_entity;
use quick_xml::events::{BytesStart, Event};

use crate::document::MAX_NESTING;

/// An XML element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Element {
    pub(crate) name: String,
    pub(crate) attributes: Vec<(String, String)>,
    pub(crate) children: Vec<Node>,
    /// The line (from 1, in the whole file) of its start tag.
    pub(crate) line: usize,
}

/// A child of an element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Node {
    Element(Element),
    Text(String),
}

/// Malformed XML, at a line of the whole file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct XmlError {
    pub(crate) line: usize,
    pub(crate) message: String,
}

impl Element {
    /// The value of attribute `name`.
    pub(crate) fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    /// The child elements, in order.
    pub(crate) fn elements(&self) -> impl Iterator<Item = &Element> {
        self.children.iter().filter_map(|child| match child {
            Node::Element(e) => Some(e),
            Node::Text(_) => None,
        })
    }

    /// The first child element called `name`.
    pub(crate) fn child(&self, name: &str) -> Option<&Element> {
        self.elements().find(|e| e.name == name)
    }

    /// The child elements called `name`.
    pub(crate) fn children_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Element> {
        self.elements().filter(move |e| e.name == name)
    }

    /// All text inside, nested elements included, each line trimmed and blank runs dropped.
    pub(crate) fn text(&self) -> String {
        let mut raw = String::new();
        self.collect_text(&mut raw);
        tidy(&raw)
    }

    fn collect_text(&self, out: &mut String) {
        for child in &self.children {
            match child {
                Node::Text(t) => out.push_str(t),
                Node::Element(e) => e.collect_text(out),
            }
        }
    }
}

/// Lines trimmed, empty lines dropped, joined with `\n`.
pub(crate) fn tidy(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Parses `xml`, which starts on line `first_line` of its file, into its root element.
pub(crate) fn parse(xml: &str, first_line: usize) -> Result<Element, XmlError> {
    let mut lines = Lines {
        text: xml.as_bytes(),
        first_line,
        counted_to: 0,
        newlines: 0,
    };
    let mut reader = Reader::from_str(xml);
    // The document element; the real root is its first child.
    let mut stack = vec![Element {
        name: String::new(),
        attributes: Vec::new(),
        children: Vec::new(),
        line: first_line,
    }];
    loop {
        let start = reader.buffer_position();
        let event = match reader.read_event() {
            Ok(event) => event,
            Err(e) => {
                return Err(XmlError {
                    line: lines.at(reader.error_position()),
                    message: format!("The XML is malformed: {e}"),
                });
            }
        };
        let line = lines.at(start);
        match event {
            Event::Start(tag) => {
                // The document element is the stack's first entry.
                if stack.len() > MAX_NESTING {
                    return Err(XmlError {
                        line,
                        message: format!(
                            "Elements nest more than {MAX_NESTING} levels deep here; an agent \
                             file may nest at most {MAX_NESTING} levels"
                        ),
                    });
                }
                stack.push(element(&tag, line)?)
            }
            Event::Empty(tag) => {
                let empty = element(&tag, line)?;
                push_child(&mut stack, Node::Element(empty));
            }
            Event::End(_) => {
                // quick-xml has already checked that the end tag matches.
                if stack.len() > 1
                    && let Some(done) = stack.pop()
                {
                    push_child(&mut stack, Node::Element(done));
                }
            }
            Event::Text(text) => {
                push_child(&mut stack, Node::Text(text.xml10_content().into_owned()))
            }
            Event::CData(data) => {
                push_child(&mut stack, Node::Text(data.xml10_content().into_owned()))
            }
            Event::GeneralRef(reference) => {
                let text = match reference.resolve_char_ref() {
                    Ok(Some(c)) => c.to_string(),
                    Ok(None) => resolve_predefined_entity(&reference.xml10_content())
                        .map(str::to_owned)
                        .ok_or_else(|| XmlError {
                            line,
                            message: format!(
                                "Unknown entity `&{};`; write `&amp;` for a literal `&`",
                                reference.xml10_content()
                            ),
                        })?,
                    Err(e) => {
                        return Err(XmlError {
                            line,
                            message: format!("Bad character reference: {e}"),
                        });
                    }
                };
                push_child(&mut stack, Node::Text(text));
            }
            Event::Comment(_) | Event::Decl(_) | Event::PI(_) | Event::DocType(_) => {}
            Event::Eof => break,
        }
    }
    if stack.len() > 1 {
        let open = &stack[stack.len() - 1];
        return Err(XmlError {
            line: open.line,
            message: format!("`<{}>` is never closed", open.name),
        });
    }
    let document = stack.pop().map(|d| d.children).unwrap_or_default();
    document
        .into_iter()
        .find_map(|node| match node {
            Node::Element(e) => Some(e),
            Node::Text(_) => None,
        })
        .ok_or(XmlError {
            line: first_line,
            message: "The XML block holds no element".to_owned(),
        })
}

/// Line numbers of byte offsets, counted on from the last offset asked for (the reader's
/// offsets only grow), so a file of many elements is not counted from its start each time.
struct Lines<'t> {
    text: &'t [u8],
    first_line: usize,
    counted_to: usize,
    newlines: usize,
}

impl Lines<'_> {
    fn at(&mut self, offset: u64) -> usize {
        let offset = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(self.text.len());
        if offset < self.counted_to {
            self.counted_to = 0;
            self.newlines = 0;
        }
        self.newlines += self.text[self.counted_to..offset]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        self.counted_to = offset;
        self.first_line + self.newlines
    }
}

fn push_child(stack: &mut [Element], node: Node) {
    if let Some(parent) = stack.last_mut() {
        parent.children.push(node);
    }
}

fn element(tag: &BytesStart<'_>, line: usize) -> Result<Element, XmlError> {
    let name = tag.name().as_ref().to_owned();
    let mut attributes = Vec::new();
    for attribute in tag.attributes() {
        let attribute = attribute.map_err(|e| XmlError {
            line,
            message: format!("A bad attribute on `<{name}>`: {e}"),
        })?;
        let value = attribute
            .normalized_value(XmlVersion::Implicit1_0)
            .map_err(|e| XmlError {
                line,
                message: format!("A bad attribute value on `<{name}>`: {e}"),
            })?;
        attributes.push((attribute.key.as_ref().to_owned(), value.into_owned()));
    }
    Ok(Element {
        name,
        attributes,
        children: Vec::new(),
        line,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_text_attributes_and_lines() {
        let xml = "<agent name=\"A &amp; B\">\n  <step n=\"1\">Load &lt;x&gt; <b>now</b></step>\n  <e/>\n</agent>";
        let agent = parse(xml, 5).expect("succeeds");
        assert_eq!(agent.attribute("name"), Some("A & B"));
        let step = agent.child("step").expect("succeeds");
        assert_eq!(step.line, 6);
        assert_eq!(step.text(), "Load <x> now");
        assert_eq!(agent.child("e").map(|e| e.line), Some(7));
    }

    #[test]
    fn deep_nesting_is_refused_where_it_goes_too_deep() {
        let xml = format!("<agent>\n{}", "<a>".repeat(100_000));
        let err = parse(&xml, 1).expect_err("refused");
        assert_eq!(err.line, 2);
        assert_eq!(
            err.message,
            "Elements nest more than 64 levels deep here; an agent file may nest at most 64 levels"
        );
        let ok = format!("<agent>{}{}</agent>", "<a>".repeat(62), "</a>".repeat(62));
        assert!(parse(&ok, 1).is_ok());
    }

    #[test]
    fn malformed_xml_says_where() {
        let err = parse("<agent>\n<a>\n</b>\n</agent>", 10).expect_err("fails");
        assert_eq!(err.line, 12, "{err:?}");
        assert!(err.message.starts_with("The XML is malformed"), "{err:?}");
        let err = parse("<agent>\n  <persona>\n", 3).expect_err("fails");
        assert_eq!(
            err,
            XmlError {
                line: 4,
                message: "`<persona>` is never closed".to_owned()
            }
        );
    }
}
