//! `logbus fmt`: one canonical layout for pipeline files, so diffs in
//! review show changes, not styles. Comments are kept (attached to the
//! node they precede, or to the line they end); `${VAR}` references stay
//! as written (formatting never expands them).
//!
//! The layout: block style with two-space indentation; short lists of
//! scalars in flow style (`inputs: [a, b]`); maps in block style, but a
//! map written on one line (`read: { source: stdin }`, `set: { a: 1 }`)
//! stays on one line while it fits (a pipeline of one-line stages reads
//! as a table; scalars that a flow map would misread, `${...}` among
//! them, are quoted); each stage's keys in
//! the order kind, `inputs`, `codec`/`format`, `on_error`, `workers`,
//! `queue`, then its options as written; top-level `settings`, `stages`,
//! `tests` first. Scalars are quoted only when they must be; multi-line
//! strings are literal blocks.
//!
//! Safety: the result is parsed again and must mean exactly what the input
//! meant, or formatting is refused.

use std::collections::HashMap;

use crate::yaml::{Node, NodeKind, Pos, YamlError, parse};

const STAGE_ORDER: [&str; 12] = [
    "source",
    "parser",
    "transform",
    "formatter",
    "sink",
    "inputs",
    "codec",
    "format",
    "on_error",
    "workers",
    "ordered",
    "queue",
];
const TOP_ORDER: [&str; 3] = ["settings", "stages", "tests"];
const FLOW_WIDTH: usize = 80;
/// The widest line a one-line stage keeps.
const STAGE_LINE_WIDTH: usize = 120;

#[derive(Debug, thiserror::Error)]
pub enum FmtError {
    #[error("{pos}: invalid YAML: {message}")]
    Yaml { message: String, pos: Pos },
    #[error("the file uses YAML anchors or aliases, which formatting would expand; left as it is")]
    Anchors,
    #[error("formatting would change the file's meaning (a bug: please report it); left as it is")]
    Changed,
}

impl From<YamlError> for FmtError {
    fn from(e: YamlError) -> Self {
        FmtError::Yaml {
            message: e.message,
            pos: e.pos,
        }
    }
}

/// Comments of the original text, by line (1-based).
#[derive(Default)]
struct Comments {
    /// Whole-line comments, keyed by the line they stand on.
    full: Vec<(usize, String)>,
    /// `key: value  # comment`, keyed by line.
    trailing: HashMap<usize, String>,
    /// Whole-line comments by the line of the node they precede (so they
    /// move with it when keys are reordered).
    attached: HashMap<usize, Vec<String>>,
    /// Comments before the first node (the file's header).
    head: Vec<String>,
    /// Comments after the last node.
    tail: Vec<String>,
}

impl Comments {
    fn scan(text: &str, content_lines: &[bool]) -> Comments {
        let mut c = Comments::default();
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            if content_lines.get(n).copied().unwrap_or(false) {
                continue;
            }
            if let Some(at) = comment_start(line) {
                let comment = line[at..].trim_end().to_string();
                if line[..at].trim().is_empty() {
                    c.full.push((n, comment));
                } else {
                    c.trailing.insert(n, comment);
                }
            }
        }
        c
    }

    /// Attaches each whole-line comment to the first node after it.
    fn attach(&mut self, node_lines: &[usize]) {
        for (line, comment) in std::mem::take(&mut self.full) {
            if node_lines.first().is_none_or(|&first| line < first) {
                self.head.push(comment);
                continue;
            }
            match node_lines.iter().find(|&&l| l > line) {
                Some(&l) => self.attached.entry(l).or_default().push(comment),
                None => self.tail.push(comment),
            }
        }
    }

    /// A comment after a line that continues a node begun on an earlier
    /// line (a plain or quoted scalar folded over lines) goes to the line
    /// that node starts on, where the writer ends it; one already there
    /// comes first. `starts` are the lines nodes start on, sorted.
    fn move_to_node_lines(&mut self, starts: &[usize]) {
        let mut moved: Vec<(usize, usize)> = self
            .trailing
            .keys()
            .filter_map(|&line| {
                let at = starts.partition_point(|&s| s <= line).checked_sub(1)?;
                (starts[at] != line).then_some((line, starts[at]))
            })
            .collect();
        moved.sort_unstable();
        for (line, to) in moved {
            self.move_trailing(line, to);
        }
    }

    /// Moves the comment at the end of line `from` to line `to`; where both
    /// have one, they are joined in the order of their lines.
    fn move_trailing(&mut self, from: usize, to: usize) {
        let Some(moved) = self.trailing.remove(&from) else {
            return;
        };
        let joined = match self.trailing.remove(&to) {
            Some(there) if to < from => format!("{there}  {moved}"),
            Some(there) => format!("{moved}  {there}"),
            None => moved,
        };
        self.trailing.insert(to, joined);
    }

    /// The whole-line comments that precede the node on `line`.
    fn before(&mut self, line: usize) -> Vec<String> {
        self.attached.remove(&line).unwrap_or_default()
    }

    fn rest(&mut self) -> Vec<String> {
        let mut rest: Vec<(usize, Vec<String>)> = self.attached.drain().collect();
        rest.sort();
        let mut out: Vec<String> = rest.into_iter().flat_map(|(_, c)| c).collect();
        out.append(&mut self.tail);
        out
    }
}

/// Lines where keys and list items start.
fn node_lines(node: &Node, out: &mut Vec<usize>) {
    match &node.kind {
        NodeKind::Scalar { .. } => {}
        NodeKind::Seq(items) => items.iter().for_each(|n| {
            out.push(n.pos.line);
            node_lines(n, out);
        }),
        NodeKind::Map(entries) => entries.iter().for_each(|(k, v)| {
            out.push(k.pos.line);
            node_lines(v, out);
        }),
    }
}

/// Lines where any node starts, scalars included.
fn start_lines(node: &Node, out: &mut Vec<usize>) {
    out.push(node.pos.line);
    match &node.kind {
        NodeKind::Scalar { .. } => {}
        NodeKind::Seq(items) => items.iter().for_each(|n| start_lines(n, out)),
        NodeKind::Map(entries) => entries.iter().for_each(|(k, v)| {
            start_lines(k, out);
            start_lines(v, out);
        }),
    }
}

/// Where a comment starts on a line: a `#` at the start or after
/// whitespace, outside quoted scalars. A quote opens one only where a
/// scalar can begin (first on the line, or after `:`, `-`, `?`, `[`, `{`
/// or `,`); inside a word (`it's`, `a "b`) it is text, and a comment after
/// it is still a comment.
fn comment_start(line: &str) -> Option<usize> {
    let bytes = line.as_bytes();
    let mut quote: Option<u8> = None;
    // The last byte before this one that was not a space or a tab.
    let mut last: Option<u8> = None;
    let mut prev_space = true;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match quote {
            // A backslash escapes the next byte in a double-quoted scalar.
            Some(b'"') if b == b'\\' => i += 1,
            // `''` is a quote inside a single-quoted scalar.
            Some(b'\'') if b == b'\'' && bytes.get(i + 1) == Some(&b'\'') => i += 1,
            Some(q) if b == q => quote = None,
            Some(_) => {}
            None => match b {
                b'\'' | b'"'
                    if matches!(last, None | Some(b':' | b'-' | b'?' | b'[' | b'{' | b',')) =>
                {
                    quote = Some(b)
                }
                b'#' if prev_space => return Some(i),
                _ => {}
            },
        }
        prev_space = b == b' ' || b == b'\t';
        if !prev_space {
            last = Some(b);
        }
        i += 1;
    }
    None
}

/// Lines that hold the content of block scalars (where `#` is text): from
/// the first line of text (the scalar's position) while lines are blank or
/// indented at least as far as it. A scalar that starts after other text
/// on its line (a quoted one) is not a block.
fn content_lines(node: &Node, source: &[&str], lines: &mut [bool]) {
    match &node.kind {
        NodeKind::Scalar { text, plain } => {
            let Some(first) = source.get(node.pos.line.wrapping_sub(1)) else {
                return;
            };
            let indent = node.pos.col - 1;
            let starts_line = first
                .get(..indent)
                .is_some_and(|before| before.trim().is_empty());
            if *plain || !text.contains('\n') || !starts_line {
                return;
            }
            for (l, line) in source.iter().enumerate().skip(node.pos.line - 1) {
                let blank = line.trim().is_empty();
                if !blank && line.len() - line.trim_start().len() < indent {
                    break;
                }
                lines[l + 1] = true;
            }
        }
        NodeKind::Seq(items) => items.iter().for_each(|n| content_lines(n, source, lines)),
        NodeKind::Map(entries) => entries.iter().for_each(|(k, v)| {
            content_lines(k, source, lines);
            content_lines(v, source, lines);
        }),
    }
}

/// Whether the text uses anchors (which the tree resolves; an alias needs
/// one before it).
fn uses_anchors(text: &str) -> bool {
    use yaml_rust2::parser::{Event, Parser};
    let mut parser = Parser::new_from_str(text);
    while let Ok((event, _)) = parser.next_token() {
        match event {
            Event::StreamEnd => break,
            Event::Scalar(_, _, anchor, _)
            | Event::SequenceStart(anchor, _)
            | Event::MappingStart(anchor, _)
                if anchor > 0 =>
            {
                return true;
            }
            _ => {}
        }
    }
    false
}

/// Formats a pipeline file.
pub fn format(text: &str) -> Result<String, FmtError> {
    let Some(root) = parse(text)? else {
        return Ok(String::new());
    };
    if uses_anchors(text) {
        return Err(FmtError::Anchors);
    }
    let source: Vec<&str> = text.lines().collect();
    let mut lines = vec![false; source.len() + 2];
    content_lines(&root, &source, &mut lines);
    let mut comments = Comments::scan(text, &lines);
    let mut anchors = Vec::new();
    node_lines(&root, &mut anchors);
    anchors.sort_unstable();
    anchors.dedup();
    comments.attach(&anchors);
    let mut starts = Vec::new();
    start_lines(&root, &mut starts);
    starts.sort_unstable();
    comments.move_to_node_lines(&starts);
    let mut out = String::new();
    for c in std::mem::take(&mut comments.head) {
        out.push_str(&c);
        out.push('\n');
    }
    let mut w = Writer {
        out: &mut out,
        comments: &mut comments,
    };
    match &root.kind {
        NodeKind::Map(entries) if !entries.is_empty() => w.map(entries, 0, Context::Top),
        NodeKind::Seq(items) if !items.is_empty() => w.seq(items, 0),
        _ => w.value_line(&root, 0),
    }
    for c in comments.rest() {
        out.push_str(&c);
        out.push('\n');
    }
    // The result must mean what the input meant.
    let again = parse(&out)?.ok_or(FmtError::Changed)?;
    if again.to_json() != root.to_json() {
        return Err(FmtError::Changed);
    }
    Ok(out)
}

#[derive(Clone, Copy, PartialEq)]
enum Context {
    Top,
    Stages,
    Stage,
    Other,
}

struct Writer<'a> {
    out: &'a mut String,
    comments: &'a mut Comments,
}

fn indent(n: usize) -> String {
    " ".repeat(n)
}

impl Writer<'_> {
    fn comments_before(&mut self, line: usize, at: usize) {
        for c in self.comments.before(line) {
            self.out.push_str(&indent(at));
            self.out.push_str(&c);
            self.out.push('\n');
        }
    }

    fn end_line(&mut self, line: usize) {
        if let Some(c) = self.comments.trailing.remove(&line) {
            self.out.push_str("  ");
            self.out.push_str(&c);
        }
        self.out.push('\n');
    }

    fn map(&mut self, entries: &[(Node, Node)], at: usize, cx: Context) {
        let order: &[&str] = match cx {
            Context::Top => &TOP_ORDER,
            Context::Stage => &STAGE_ORDER,
            _ => &[],
        };
        let mut sorted: Vec<&(Node, Node)> = entries.iter().collect();
        sorted.sort_by_key(|(k, _)| {
            let key = k.as_str().unwrap_or("");
            order.iter().position(|o| *o == key).unwrap_or(order.len())
        });
        for (key, value) in sorted {
            self.comments_before(key.pos.line, at);
            self.out.push_str(&indent(at));
            self.out.push_str(&scalar_text(key, true));
            self.out.push(':');
            let child = match (cx, key.as_str()) {
                (Context::Top, Some("stages")) => Context::Stages,
                (Context::Stages, _) => Context::Stage,
                _ => Context::Other,
            };
            self.value_after_key(value, key.pos.line, at, child);
        }
    }

    fn value_after_key(&mut self, value: &Node, key_line: usize, at: usize, cx: Context) {
        match &value.kind {
            NodeKind::Map(entries) if entries.is_empty() => {
                self.out.push_str(" {}");
                self.end_line(key_line);
            }
            NodeKind::Map(entries) => {
                if cx != Context::Stages && on_one_line(value, key_line) {
                    let column = self.out.len() - self.out.rfind('\n').map_or(0, |i| i + 1);
                    let order: &[&str] = if cx == Context::Stage {
                        &STAGE_ORDER
                    } else {
                        &[]
                    };
                    if let Some(flow) = flow_map(entries, order)
                        .filter(|f| column + 1 + f.len() <= STAGE_LINE_WIDTH)
                    {
                        self.out.push(' ');
                        self.out.push_str(&flow);
                        self.end_line(key_line);
                        return;
                    }
                }
                self.end_line(key_line);
                self.map(entries, at + 2, cx);
            }
            NodeKind::Seq(items) => match flow_seq(items, at) {
                Some(flow) => {
                    self.out.push(' ');
                    self.out.push_str(&flow);
                    self.end_line(key_line);
                    self.end_line_extra(value, key_line);
                }
                None => {
                    self.end_line(key_line);
                    self.seq(items, at + 2);
                }
            },
            NodeKind::Scalar { .. } => {
                self.out.push(' ');
                self.scalar_value(value, at, Some(key_line));
                // `key:  # note` with the text below: one line now.
                if value.pos.line > key_line {
                    self.comments.move_trailing(key_line, value.pos.line);
                }
                self.end_line(value.pos.line.max(key_line));
            }
        }
    }

    /// Trailing comments on the lines of a flow list that spanned lines.
    fn end_line_extra(&mut self, value: &Node, key_line: usize) {
        if let NodeKind::Seq(items) = &value.kind {
            for item in items {
                if item.pos.line != key_line
                    && let Some(c) = self.comments.trailing.remove(&item.pos.line)
                {
                    self.out.pop();
                    self.out.push_str("  ");
                    self.out.push_str(&c);
                    self.out.push('\n');
                }
            }
        }
    }

    fn seq(&mut self, items: &[Node], at: usize) {
        for item in items {
            self.comments_before(item.pos.line, at);
            self.out.push_str(&indent(at));
            self.out.push('-');
            match &item.kind {
                NodeKind::Map(entries) if !entries.is_empty() => {
                    // The first entry shares the dash's line.
                    let (first, rest) = entries.split_first().expect("not empty");
                    self.out.push(' ');
                    let mut tmp = String::new();
                    {
                        let mut inner = Writer {
                            out: &mut tmp,
                            comments: self.comments,
                        };
                        inner.map(std::slice::from_ref(first), at + 2, Context::Other);
                        inner.map(rest, at + 2, Context::Other);
                    }
                    self.out.push_str(tmp.trim_start_matches(' '));
                }
                NodeKind::Seq(inner) if !inner.is_empty() => {
                    self.out.push('\n');
                    self.seq(inner, at + 2);
                }
                _ => {
                    self.out.push(' ');
                    self.value_line_inline(item, at + 2);
                }
            }
        }
    }

    fn value_line_inline(&mut self, node: &Node, at: usize) {
        match &node.kind {
            NodeKind::Map(_) => self.out.push_str("{}"),
            NodeKind::Seq(_) => self.out.push_str("[]"),
            NodeKind::Scalar { .. } => self.scalar_value(node, at, None),
        }
        self.end_line(node.pos.line);
    }

    fn value_line(&mut self, node: &Node, at: usize) {
        self.out.push_str(&indent(at));
        self.value_line_inline(node, at);
    }

    /// A scalar after its key (`header`: the key's line, whose comment a
    /// literal block takes after its indicator) or as a list item.
    fn scalar_value(&mut self, node: &Node, at: usize, header: Option<usize>) {
        let NodeKind::Scalar { text, plain } = &node.kind else {
            unreachable!("a scalar")
        };
        if !*plain && text.contains('\n') && text.chars().all(|c| c == '\n' || !c.is_control()) {
            self.literal_block(text, at, header);
        } else {
            self.out.push_str(&scalar_text(node, false));
        }
    }

    /// `|`, `|-` or `|+` with the content indented under the key.
    fn literal_block(&mut self, text: &str, at: usize, header: Option<usize>) {
        let trailing = text.len() - text.trim_end_matches('\n').len();
        let chomp = match trailing {
            0 => "-",
            1 => "",
            _ => "+",
        };
        let body = text.trim_end_matches('\n');
        let first_indented = body.starts_with(' ');
        self.out.push('|');
        if first_indented {
            self.out.push('2');
        }
        self.out.push_str(chomp);
        if let Some(c) = header.and_then(|line| self.comments.trailing.remove(&line)) {
            self.out.push_str("  ");
            self.out.push_str(&c);
        }
        let pad = indent(at + 2);
        for line in body.split('\n') {
            self.out.push('\n');
            if !line.is_empty() {
                self.out.push_str(&pad);
                self.out.push_str(line);
            }
        }
        for _ in 1..trailing {
            self.out.push('\n');
        }
    }
}

/// Whether every key and value below `node` stands on `line`.
fn on_one_line(node: &Node, line: usize) -> bool {
    if node.pos.line != line {
        return false;
    }
    match &node.kind {
        NodeKind::Map(entries) => entries
            .iter()
            .all(|(k, v)| k.pos.line == line && on_one_line(v, line)),
        NodeKind::Seq(items) => items.iter().all(|i| on_one_line(i, line)),
        NodeKind::Scalar { text, .. } => !text.contains('\n'),
    }
}

/// `{ a: 1, b: [x, y], c: { d: e } }`, keys in `order` first (a stage's),
/// then as written; `None` when a value has no one-line form.
fn flow_map(entries: &[(Node, Node)], order: &[&str]) -> Option<String> {
    if entries.is_empty() {
        return Some("{}".into());
    }
    let mut sorted: Vec<&(Node, Node)> = entries.iter().collect();
    sorted.sort_by_key(|(k, _)| {
        let key = k.as_str().unwrap_or("");
        order.iter().position(|o| *o == key).unwrap_or(order.len())
    });
    let mut parts = Vec::new();
    for (k, v) in sorted {
        let value = match &v.kind {
            NodeKind::Scalar { text, .. } if !text.contains('\n') => scalar_text(v, true),
            NodeKind::Scalar { .. } => return None,
            NodeKind::Seq(items) if items.is_empty() => "[]".into(),
            NodeKind::Seq(items) => {
                let mut inner = Vec::new();
                for item in items {
                    match &item.kind {
                        NodeKind::Scalar { text, .. } if !text.contains('\n') => {
                            inner.push(scalar_text(item, true))
                        }
                        NodeKind::Map(m) => inner.push(flow_map(m, &[])?),
                        _ => return None,
                    }
                }
                format!("[{}]", inner.join(", "))
            }
            NodeKind::Map(m) => flow_map(m, &[])?,
        };
        parts.push(format!("{}: {value}", scalar_text(k, true)));
    }
    Some(format!("{{ {} }}", parts.join(", ")))
}

/// `[a, b, c]` when every item is a scalar that needs no block and the
/// line stays short.
fn flow_seq(items: &[Node], at: usize) -> Option<String> {
    let mut parts = Vec::new();
    for item in items {
        match &item.kind {
            NodeKind::Scalar { text, .. } if !text.contains('\n') => {
                parts.push(scalar_text(item, true))
            }
            _ => return None,
        }
    }
    let flow = format!("[{}]", parts.join(", "));
    (at + flow.len() < FLOW_WIDTH).then_some(flow)
}

/// A scalar as YAML text: plain where that reads back the same, else
/// single-quoted, else double-quoted. `in_flow`: also quote `,[]{}`.
fn scalar_text(node: &Node, in_flow: bool) -> String {
    let NodeKind::Scalar { text, plain } = &node.kind else {
        return "{}".into();
    };
    if *plain && !(in_flow && text.contains([',', '[', ']', '{', '}'])) {
        return text.clone();
    }
    if plain_safe(text, in_flow) {
        return text.clone();
    }
    if !text.contains('\n') && text.chars().all(|c| !c.is_control()) {
        return format!("'{}'", text.replace('\'', "''"));
    }
    serde_json::to_string(text).expect("a string serializes")
}

/// Whether `text` as a plain scalar reads back as this same string.
fn plain_safe(text: &str, in_flow: bool) -> bool {
    if text.is_empty() || text != text.trim() || text.chars().any(char::is_control) {
        return false;
    }
    let first = text.chars().next().expect("not empty");
    if "-?:,[]{}#&*!|>'\"%@`".contains(first) {
        return false;
    }
    if text.contains(": ") || text.contains(" #") || text.ends_with(':') {
        return false;
    }
    if in_flow && text.contains([',', '[', ']', '{', '}']) {
        return false;
    }
    // Would the core schema read it as something other than a string?
    let as_plain = Node {
        kind: NodeKind::Scalar {
            text: text.to_string(),
            plain: true,
        },
        pos: Pos::default(),
    };
    as_plain.to_json().is_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_messy_file_gets_the_canonical_layout_with_its_comments() {
        let messy = "# A pipeline\nstages:\n    out:   # the sink\n        path:   \"out.ndjson\"\n        inputs:\n          - fmt\n        sink: file\n    # the reader\n    read: { source: stdin }\n    fmt: {inputs: [read], formatter: json, on_error: 'drop'}\nsettings: {channel_capacity: 64}\n";
        let want = "# A pipeline\nsettings: { channel_capacity: 64 }\nstages:\n  out:  # the sink\n    sink: file\n    inputs: [fmt]\n    path: out.ndjson\n  # the reader\n  read: { source: stdin }\n  fmt: { formatter: json, inputs: [read], on_error: drop }\n";
        let got = format(messy).unwrap();
        assert_eq!(got, want, "\n{got}");
        assert_eq!(format(&got).unwrap(), got, "idempotent");
    }

    #[test]
    fn strings_keep_their_meaning() {
        let text = "a: '3'\nb: 'yes sir'\nc: 'true'\nd: '${X:-1}'\ne: ' padded'\nf: \"it's\"\ng: \"#no\"\nh: |\n  line one\n  # not a comment\n  line three\ni: \"tab\\there\"\nj: x # trailing\n";
        let got = format(text).unwrap();
        let want = "a: '3'\nb: yes sir\nc: 'true'\nd: ${X:-1}\ne: ' padded'\nf: it's\ng: '#no'\nh: |\n  line one\n  # not a comment\n  line three\ni: \"tab\\there\"\nj: x  # trailing\n";
        assert_eq!(got, want, "\n{got}");
    }

    /// A comment after the last line of a scalar folded over lines stays
    /// with it (it was dropped): on the key's line, or on the line the
    /// value starts on, after a comment already there.
    #[test]
    fn a_comment_after_a_scalar_folded_over_lines_is_kept() {
        let text = "a: a long\n  plain text  # one\nb:\n  starts below\n  and goes on  # two\nc: \"quoted\n  too\"  # three\ne: 1  # six\nf:  # seven\n  below  # eight\ng:  # nine\n  - x\n";
        let got = format(text).unwrap();
        let want = "a: a long plain text  # one\nb: starts below and goes on  # two\nc: quoted too  # three\ne: 1  # six\nf: below  # seven  # eight\ng: [x]  # nine\n";
        assert_eq!(got, want, "\n{got}");
        assert_eq!(format(&got).unwrap(), got, "idempotent");
    }

    #[test]
    fn anchors_and_bad_yaml_are_refused() {
        assert!(matches!(format("a: &x 1\nb: *x\n"), Err(FmtError::Anchors)));
        assert!(matches!(format("a: [1,\n"), Err(FmtError::Yaml { .. })));
        assert_eq!(format("").unwrap(), "");
    }

    /// Formats `text`, checks the result is a fixed point, returns it.
    fn formatted(text: &str) -> String {
        let got = format(text).unwrap();
        assert_eq!(format(&got).unwrap(), got, "idempotent");
        got
    }

    #[test]
    fn a_stages_keys_come_in_the_fixed_order_then_as_written() {
        let text = "stages:\n  s:\n    queue: { size: 3 }\n    workers: 2\n    on_error: drop\n    format: json\n    codec: lines\n    inputs: [a]\n    sink: x\n    transform: t\n    formatter: f\n    parser: p\n    source: q\n    zeta: 1\n    alpha: 2\n    nested: { b: 1, a: 2 }\ntests: []\nsettings: {}\nextra: 1\n";
        assert_eq!(
            formatted(text),
            "settings: {}\nstages:\n  s:\n    source: q\n    parser: p\n    transform: t\n    formatter: f\n    sink: x\n    inputs: [a]\n    codec: lines\n    format: json\n    on_error: drop\n    workers: 2\n    queue: { size: 3 }\n    zeta: 1\n    alpha: 2\n    nested: { b: 1, a: 2 }\ntests: []\nextra: 1\n"
        );
        // Below `stages`, only a stage's own keys are ordered.
        let text = "stages:\n  s:\n    queue:\n      workers: 1\n      size: 2\n";
        assert_eq!(formatted(text), text);
    }

    #[test]
    fn a_stage_on_one_line_stays_on_one_line_while_it_fits() {
        let text = "stages:\n  read:   {source: stdin}\n  keep: {inputs: [read], condition: 'a == \"b\"', transform: filter, set: {a: '${X}', b: [1, {c: d}]}, e: {}, f: []}  # note\n  out: {sink: file, inputs: [keep],\n        path: o.log}\n";
        assert_eq!(
            formatted(text),
            "stages:\n  read: { source: stdin }\n  keep: { transform: filter, inputs: [read], condition: a == \"b\", set: { a: '${X}', b: [1, { c: d }] }, e: {}, f: [] }  # note\n  out:\n    sink: file\n    inputs: [keep]\n    path: o.log\n"
        );
        // Past the width, or holding a multi-line string: block style.
        let long = format!("stages:\n  s: {{ source: x, y: {} }}\n", "z".repeat(120));
        assert!(formatted(&long).starts_with("stages:\n  s:\n    source: x\n"));
        // 120 columns exactly, and one more.
        let text = format!("stages:\n  s: {{ source: x, y: {} }}\n", "z".repeat(97));
        assert_eq!(text.lines().nth(1).unwrap().len(), 120);
        assert_eq!(formatted(&text), text);
        let text = format!("stages:\n  s: {{ source: x, y: {} }}\n", "z".repeat(98));
        assert_ne!(formatted(&text), text);
        // Any map written on one line; the stages map itself is a block.
        assert_eq!(
            formatted("settings: {fuse: false}\n"),
            "settings: { fuse: false }\n"
        );
        assert_eq!(
            formatted("stages: { a: { source: x } }\n"),
            "stages:\n  a: { source: x }\n"
        );
        assert_eq!(
            formatted("stages:\n  a:\n    source: x\n    set: {b: 1}\n"),
            "stages:\n  a:\n    source: x\n    set: { b: 1 }\n"
        );
    }

    #[test]
    fn lists_go_in_flow_style_only_when_short_and_flat() {
        let text = "list:\n  - a: 1\n    b: [x, y]\n  - - 1\n    - 2\n  - []\n  - {}\n  - plain\n  - - nested: {}\nempty_map: {}\nempty_seq: []\n";
        assert_eq!(
            formatted(text),
            "list:\n  - a: 1\n    b: [x, y]\n  -\n    - 1\n    - 2\n  - []\n  - {}\n  - plain\n  -\n    - nested: {}\nempty_map: {}\nempty_seq: []\n"
        );
        // The flow form must stay under 80 columns, counting the indent
        // of its key.
        let x = |n: usize| "x".repeat(n);
        let text = format!("k:\n  l: [{}]\n", x(75));
        assert_eq!(formatted(&text), text);
        let text = format!("k:\n  l: [{}]\n", x(76));
        assert_eq!(formatted(&text), format!("k:\n  l:\n    - {}\n", x(76)));
        let text = format!("l: [{}]\n", x(77));
        assert_eq!(formatted(&text), text);
        let text = format!("l: [{}]\n", x(78));
        assert_eq!(formatted(&text), format!("l:\n  - {}\n", x(78)));
        // A multi-line string keeps a list in block style.
        assert_eq!(
            formatted("l: [\"a\\nb\", c]\n"),
            "l:\n  - |-\n      a\n      b\n  - c\n"
        );
    }

    #[test]
    fn scalars_are_quoted_only_when_they_must_be() {
        let text = "a: \"no newline at end\"\nb: \"two\\n\\n\"\nc: \"ends\\nwithout\"\nd: \"  starts indented\\nnext\\n\"\ne: \"ctl\\u0001char\"\nf: \"multi\\nwith\\ttab\\n\"\ng: \"\"\nh: \"- dash\"\ni: \"a: b\"\nj: \"x #y\"\nk: \"ends:\"\nl: \"1.5\"\nm: [\",\", \"a b\", \"{x}\", \"[\", \"'q'\", \"ok\", \"a,b\", \"}\", \"]\"]\nn: \"x \"\no: \"?\"\n";
        assert_eq!(
            formatted(text),
            "a: no newline at end\nb: |+\n  two\n\nc: |-\n  ends\n  without\nd: |2\n    starts indented\n  next\ne: \"ctl\\u0001char\"\nf: \"multi\\nwith\\ttab\\n\"\ng: ''\nh: '- dash'\ni: 'a: b'\nj: 'x #y'\nk: 'ends:'\nl: '1.5'\nm: [',', a b, '{x}', '[', '''q''', ok, 'a,b', '}', ']']\nn: 'x '\no: '?'\n"
        );
        // A plain scalar with flow characters is quoted inside a flow list
        // only; keys are written as they read.
        assert_eq!(
            formatted("a: x,y\nb: [\"x,y\"]\n\"k k\": 1\n"),
            "a: x,y\nb: ['x,y']\nk k: 1\n"
        );
    }

    #[test]
    fn comments_stay_with_what_they_annotate() {
        let text = "# head one\n\n# head two\na: 1 # one\n# before b\nb:\n  - x # on x\n  - y\nlist_flow: [1,\n  2, # two\n  3]\n# tail one\n# tail two\n";
        assert_eq!(
            formatted(text),
            "# head one\n# head two\na: 1  # one\n# before b\nb: [x, y]  # on x\nlist_flow: [1, 2, 3]  # two\n# tail one\n# tail two\n"
        );
        // `#` inside quotes, or not after a space, is text.
        let text = "k: 'it''s # not'\nl: \"say \\\"hi\\\" # x\"  # real\nm: a#b\nn: \"a\\\\\" # after a backslash\no: \"it's\" # real\np: 'a \"b' # real\nq: \"say \\\"hi # x\\\"\"  # real\nr: a\\ # real\n";
        assert_eq!(
            formatted(text),
            "k: 'it''s # not'\nl: 'say \"hi\" # x'  # real\nm: a#b\nn: a\\  # after a backslash\no: it's  # real\np: a \"b  # real\nq: 'say \"hi # x\"'  # real\nr: a\\  # real\n"
        );
        // Quotes open a scalar in flow collections too.
        assert_eq!(
            formatted("s: ['a # b', \"c # d\"] # real\nu: {k: 'v # w'} # real\n"),
            "s: ['a # b', 'c # d']  # real\nu: { k: 'v # w' }  # real\n"
        );
        // A block scalar's text ends where a line is indented less than
        // its first line; a comment on its key's line stays after `|`.
        assert_eq!(
            formatted("a: 1  # keep\nh: |  # header\n  one\n  two # text\nz: 2\n"),
            "a: 1  # keep\nh: |  # header\n  one\n  two # text\nz: 2\n"
        );
        assert_eq!(
            formatted("h: |\n\n    one # text\n  # two\n# after\nz: 2\n"),
            "h: |\n\n  one # text\n# two\n# after\nz: 2\n"
        );
        assert_eq!(
            formatted("l:\n  - |\n    x # text\n  # c\n  - y\n"),
            "l:\n  - |\n      x # text\n  # c\n  - y\n"
        );
        // A one-line string on a line of its own is no block.
        assert_eq!(formatted("k:\n  'a b'  # c\n"), "k: a b  # c\n");
        // A quoted string written as a block takes its line's comment along.
        assert_eq!(
            formatted("f: \"a\\nb\"  # c\n# d\n"),
            "f: |-  # c\n  a\n  b\n# d\n"
        );
        // A comment after the last node of a nested map trails the file.
        assert_eq!(
            formatted("a:\n  b: 1\n  # end of a\n"),
            "a:\n  b: 1\n# end of a\n"
        );
        // Comments before a key that moves go with it.
        assert_eq!(
            formatted("stages:\n  s:\n    inputs: [a]\n    # the plugin\n    sink: x\n"),
            "stages:\n  s:\n    # the plugin\n    sink: x\n    inputs: [a]\n"
        );
    }

    #[test]
    fn a_document_that_is_not_a_map_is_formatted_too() {
        assert_eq!(formatted("- 1\n-   two\n"), "- 1\n- two\n");
        assert_eq!(
            formatted("- a: 1\n  b: [x]\n- - c: 1\n    d: |\n      e\n"),
            "- a: 1\n  b: [x]\n-\n  - c: 1\n    d: |\n      e\n"
        );
        assert_eq!(
            formatted("- a:\n    b: 1\n  c: 2\n- |\n  x\n"),
            "- a:\n    b: 1\n  c: 2\n- |\n    x\n"
        );
        assert_eq!(formatted("just a scalar\n"), "just a scalar\n");
        assert_eq!(formatted("[]\n"), "[]\n");
        assert_eq!(formatted("{}\n"), "{}\n");
    }

    #[test]
    fn refusals_say_why() {
        assert_eq!(
            format("a: &x 1\n").unwrap_err().to_string(),
            "the file uses YAML anchors or aliases, which formatting would expand; left as it is"
        );
        assert!(matches!(format("a: [&x 1]\n"), Err(FmtError::Anchors)));
        assert!(matches!(format("a: &x [1]\n"), Err(FmtError::Anchors)));
        assert!(matches!(format("a: &x {b: 1}\n"), Err(FmtError::Anchors)));
        assert_eq!(
            format("a: [1,\n").unwrap_err().to_string(),
            "2:1: invalid YAML: while parsing a node, did not find expected node content"
        );
        assert_eq!(
            FmtError::Changed.to_string(),
            "formatting would change the file's meaning (a bug: please report it); left as it is"
        );
    }
}
